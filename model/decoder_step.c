#include "model/decoder_step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/luna_attention.h"
#include "model/softmax_attention.h"

int luna_decoder_projection_slots(const luna_config *c, int longest) {
    if (c->arch != LUNA_ARCH_LUNA) return 0;
    return c->fix_projection_length || longest > c->projection_length ? c->projection_length
                                                                      : longest;
}

/* ---- begin ----------------------------------------------------------------------------------- */

/* Luna layer: the causal state of P (per sentence, expanded to rows: P̃ is the same for the beams
 * of a sentence) and the cross-attention pack. *p becomes the next layer's P. */
static luna_status luna_layer_begin(luna_seq2seq *model, const luna_pass *pst, const luna_pass *ps,
                                    const luna_decoder_dims *dims, const luna_decoder_layer_w *lw,
                                    const int32_t *expand, const int32_t *src_valid,
                                    const luna_act *e, const luna_act **p, bool last,
                                    luna_decoder_layer_state *ls) {
    const luna_config *c = &model->config;
    luna_backend *be = ps->be;
    const int S = dims->S, R = dims->R, m = dims->m, L = dims->L;
    const int R_cap = dims->R_cap > R ? dims->R_cap : R;
    const int d = c->decoder_embed_dim, H = c->decoder_attention_heads;
    const bool tied = !c->untie_luna_kv;
    const int64_t Ld = (int64_t)L * d;
    luna_causal_state *rs = &ls->causal;
    *rs = (luna_causal_state){.B = R,
                              .L = L,
                              .d = d,
                              .H = H,
                              .tied = tied,
                              .activation = c->causal_activation,
                              .p_valid = dims->row_valid};
    LUNA_TRY(luna_pass_alloc(pst, &rs->pt, R_cap * Ld, "causal state"));
    LUNA_TRY(luna_pass_alloc(pst, &rs->ksum, R_cap * Ld, "causal state"));
    LUNA_TRY(luna_pass_alloc(pst, &rs->vsum, R_cap * Ld, "causal state"));
    LUNA_TRY(luna_mem_zero(be, rs->ksum, luna_act_bytes(be, R * Ld)));
    LUNA_TRY(luna_mem_zero(be, rs->vsum, luna_act_bytes(be, R * Ld)));
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_causal_state cs; /* per sentence */
    luna_status st = luna_causal_state_init(be, ps->arena, &lw->self_attn, &cs, *p, NULL, S, L, d,
                                            H, tied, c->causal_activation);
    if (st == LUNA_OK) st = be->ops->gather_rows(be, rs->pt, Ld, cs.pt, Ld, expand, R, Ld);
    luna_arena_release(ps->arena, mark);
    LUNA_TRY(st);

    /* cross-attention: the pack of the training code, once per sentence; keep c_proj(Y_P) */
    luna_attn_act a;
    LUNA_TRY(
        luna_attention_pack(ps, &lw->encoder_attn, &a, *p, e, src_valid, S, m, L, d, H, tied, 0));
    LUNA_TRY(luna_pass_alloc(pst, &ls->kp, S * Ld, "cross keys"));
    LUNA_TRY(luna_mem_copy(be, ls->kp, a.kp, luna_act_bytes(be, S * Ld)));
    ls->vp = ls->kp;
    if (!tied) {
        LUNA_TRY(luna_pass_alloc(pst, &ls->vp, S * Ld, "cross values"));
        LUNA_TRY(luna_mem_copy(be, ls->vp, a.vp, luna_act_bytes(be, S * Ld)));
    }
    /* P of the next layer = LN_p(p + Y_P) (the last layer's is unused) */
    if (!last) {
        luna_resnorm_act pa;
        LUNA_TRY(luna_resnorm_forward(ps, &lw->encoder_atten_proj_layer_norm, &pa, *p, a.yp, NULL,
                                      (int64_t)S * L, d, 0.0f, 0));
        *p = pa.y;
    }
    return LUNA_OK;
}

static luna_status transformer_layer_begin(luna_seq2seq *model, const luna_pass *pst,
                                           const luna_decoder_dims *dims,
                                           const luna_decoder_layer_w *lw, const int32_t *src_valid,
                                           const luna_act *e, luna_decoder_layer_state *ls) {
    const luna_config *c = &model->config;
    const int d = c->decoder_embed_dim, H = c->decoder_attention_heads;
    luna_mha_act ka;
    LUNA_TRY(luna_mha_keys(pst, &lw->encoder_attn, &ka, e, src_valid, dims->S, dims->m, d, H, 0));
    ls->cross_k = ka.k;
    ls->cross_v = ka.v;
    const int64_t cache =
        (int64_t)(dims->R_cap > dims->R ? dims->R_cap : dims->R) * dims->max_steps * d;
    if (cache == 0) return LUNA_OK; /* luna_decoder_admit: the pool's caches */
    LUNA_TRY(luna_pass_alloc(pst, &ls->self_k, cache, "key cache"));
    return luna_pass_alloc(pst, &ls->self_v, cache, "value cache");
}

static luna_status begin(luna_seq2seq *model, const luna_pass *pst, const luna_pass *ps,
                         const int32_t *src, const int32_t *src_valid, const int32_t *p_valid,
                         const luna_decoder_dims *dims, luna_decoder_layer_state *layers) {
    const luna_config *c = &model->config;
    luna_backend *be = ps->be;
    const luna_weights *w = &model->params->w;
    const int S = dims->S, R = dims->R;
    luna_layer_dims ld = {
        .B = S, .n = 1, .m = dims->m, .L = dims->L, .src_valid = src_valid, .p_valid = p_valid};
    luna_encoder_layer_act *acts = calloc((size_t)c->encoder_layers, sizeof *acts);
    if (!acts) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of host memory");
    luna_act *x_src, *p0, *e, *p;
    luna_status st = luna_seq2seq_encode(ps, c, w, src, &ld, acts, NULL, &x_src, &p0, &e, &p);
    free(acts);
    LUNA_TRY(st);
    int32_t *expand = NULL; /* [R] row -> sentence (device) */
    if (dims->L > 0) {
        int32_t *host = malloc(sizeof(int32_t) * (size_t)R);
        if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int r = 0; r < R; r++)
            host[r] = r / dims->beam;
        st = luna_pass_alloc_i32(ps, &expand, R, "row sentences");
        if (st == LUNA_OK) st = luna_mem_from_host(be, expand, host, sizeof(int32_t) * (size_t)R);
        free(host);
        LUNA_TRY(st);
    }
    const luna_act *pl = p;
    for (int i = 0; i < c->decoder_layers; i++) {
        memset(&layers[i], 0, sizeof layers[i]);
        if (dims->L > 0 && c->non_contextual_projection) {
            /* Non-contextual P (paper Table 5): the layer's own learned P, not the last one's */
            luna_act *pi;
            LUNA_TRY(luna_seq2seq_project(ps, w->decoder[i].projected_embeddings, S, dims->L,
                                          c->decoder_embed_dim, 0, &pi));
            pl = pi;
        }
        if (dims->L > 0)
            LUNA_TRY(luna_layer_begin(model, pst, ps, dims, &w->decoder[i], expand, src_valid, e,
                                      &pl, i + 1 == c->decoder_layers, &layers[i]));
        else
            LUNA_TRY(transformer_layer_begin(model, pst, dims, &w->decoder[i], src_valid, e,
                                             &layers[i]));
    }
    return LUNA_OK;
}

luna_status luna_decoder_begin(luna_seq2seq *model, luna_arena *state, luna_arena *scratch,
                               const int32_t *src, const int32_t *src_valid, const int32_t *p_valid,
                               const luna_decoder_dims *dims, luna_decoder_layer_state *layers) {
    luna_pass ps = {.be = model->be, .arena = scratch}, pst = {.be = model->be, .arena = state};
    if ((model->config.arch == LUNA_ARCH_LUNA) != (dims->L > 0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "decoder: %d P slots for this architecture",
                          dims->L);
    luna_arena_mark mark = luna_arena_get_mark(scratch);
    luna_status st = begin(model, &pst, &ps, src, src_valid, p_valid, dims, layers);
    luna_arena_release(scratch, mark);
    return st;
}

luna_status luna_decoder_alloc(luna_seq2seq *model, luna_arena *state,
                               const luna_decoder_dims *dims, luna_decoder_layer_state *layers) {
    const luna_config *c = &model->config;
    luna_pass pst = {.be = model->be, .arena = state};
    const int d = c->decoder_embed_dim, H = c->decoder_attention_heads;
    const int64_t S = dims->S, R = dims->R_cap, L = dims->L;
    for (int i = 0; i < c->decoder_layers; i++) {
        luna_decoder_layer_state *ls = &layers[i];
        memset(ls, 0, sizeof *ls);
        if (L > 0) {
            const bool tied = !c->untie_luna_kv;
            ls->causal = (luna_causal_state){.B = 0,
                                             .L = (int)L,
                                             .d = d,
                                             .H = H,
                                             .tied = tied,
                                             .activation = c->causal_activation,
                                             .p_valid = dims->row_valid};
            LUNA_TRY(luna_pass_alloc(&pst, &ls->causal.pt, R * L * d, "causal state"));
            LUNA_TRY(luna_pass_alloc(&pst, &ls->causal.ksum, R * L * d, "causal state"));
            LUNA_TRY(luna_pass_alloc(&pst, &ls->causal.vsum, R * L * d, "causal state"));
            LUNA_TRY(luna_pass_alloc(&pst, &ls->kp, S * L * d, "cross keys"));
            ls->vp = ls->kp;
            if (!tied) LUNA_TRY(luna_pass_alloc(&pst, &ls->vp, S * L * d, "cross values"));
        } else {
            const int64_t cross = S * dims->m * d, cache = R * dims->max_steps * d;
            LUNA_TRY(luna_pass_alloc(&pst, &ls->cross_k, cross, "cross keys"));
            LUNA_TRY(luna_pass_alloc(&pst, &ls->cross_v, cross, "cross values"));
            if (dims->cache_page > 0) continue; /* the caller's pages */
            LUNA_TRY(luna_pass_alloc(&pst, &ls->self_k, cache, "key cache"));
            LUNA_TRY(luna_pass_alloc(&pst, &ls->self_v, cache, "value cache"));
        }
    }
    return LUNA_OK;
}

/* dst holds groups of `cap` rows of w elements, src groups of `n` rows: group i of src (n·w
 * elements) into group i of dst, whose rows n..cap are zeroed. */
static luna_status copy_padded(luna_backend *be, luna_act *dst, int cap, const luna_act *src, int n,
                               int64_t groups, int64_t w) {
    LUNA_TRY(luna_mem_zero(be, dst, luna_act_bytes(be, groups * cap * w)));
    return be->ops->gather_rows(be, dst, cap * w, src, n * w, NULL, groups, n * w);
}

static luna_status admit(luna_seq2seq *model, luna_arena *scratch, const int32_t *src,
                         const int32_t *src_valid, const int32_t *p_valid,
                         const luna_decoder_dims *dims, int s0, const int32_t *slots, int r0,
                         int m_cap, int L_cap, luna_decoder_layer_state *pool) {
    const luna_config *c = &model->config;
    luna_backend *be = model->be;
    luna_pass ps = {.be = be, .arena = scratch};
    const int n = dims->S, R = dims->R, H = c->decoder_attention_heads;
    const int d = c->decoder_embed_dim, dh = d / H, L = dims->L, m = dims->m;
    luna_decoder_layer_state *fresh = calloc((size_t)c->decoder_layers, sizeof *fresh);
    if (!fresh) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of host memory");
    luna_decoder_dims d2 = *dims;
    d2.R_cap = R;
    d2.max_steps = 0; /* no caches */
    luna_status st = begin(model, &ps, &ps, src, src_valid, p_valid, &d2, fresh);
    for (int i = 0; i < c->decoder_layers && st == LUNA_OK; i++) {
        const luna_decoder_layer_state *f = &fresh[i];
        luna_decoder_layer_state *p = &pool[i];
        if (L > 0) {
            /* per sentence [n, L, d]; per row P̃ [R, H, L, dh], Σ K Φᵀ [R, H, dh, L] (zero)
             * and Σ Φᵀ V [R, H, L, dh] (zero) */
            const int64_t s_at = (int64_t)s0 * H * L_cap * dh, r_at = (int64_t)r0 * H * L_cap * dh;
            st = copy_padded(be, luna_act_at(be, p->kp, s_at), L_cap, f->kp, L, n, d);
            if (st == LUNA_OK && p->vp != p->kp)
                st = copy_padded(be, luna_act_at(be, p->vp, s_at), L_cap, f->vp, L, n, d);
            if (st == LUNA_OK)
                st = copy_padded(be, luna_act_at(be, p->causal.pt, r_at), L_cap, f->causal.pt, L,
                                 (int64_t)R * H, dh);
            if (st == LUNA_OK)
                st = luna_mem_zero(be, luna_act_at(be, p->causal.ksum, r_at),
                                   luna_act_bytes(be, (int64_t)R * H * L_cap * dh));
            if (st == LUNA_OK)
                st = luna_mem_zero(be, luna_act_at(be, p->causal.vsum, r_at),
                                   luna_act_bytes(be, (int64_t)R * H * L_cap * dh));
        } else if (slots) { /* sentence j into its slot */
            for (int j = 0; j < n && st == LUNA_OK; j++) {
                const int64_t s_at = (int64_t)slots[j] * m_cap * d, f_at = (int64_t)j * m * d;
                st = copy_padded(be, luna_act_at(be, p->cross_k, s_at), m_cap,
                                 luna_act_at(be, f->cross_k, f_at), m, 1, d);
                if (st == LUNA_OK)
                    st = copy_padded(be, luna_act_at(be, p->cross_v, s_at), m_cap,
                                     luna_act_at(be, f->cross_v, f_at), m, 1, d);
            }
        } else {
            const int64_t s_at = (int64_t)s0 * H * m_cap * dh;
            st = copy_padded(be, luna_act_at(be, p->cross_k, s_at), m_cap, f->cross_k, m, n, d);
            if (st == LUNA_OK)
                st = copy_padded(be, luna_act_at(be, p->cross_v, s_at), m_cap, f->cross_v, m, n, d);
        }
    }
    free(fresh);
    return st;
}

luna_status luna_decoder_admit(luna_seq2seq *model, luna_arena *scratch, const int32_t *src,
                               const int32_t *src_valid, const int32_t *p_valid,
                               const luna_decoder_dims *dims, int s0, const int32_t *slots, int r0,
                               int m_cap, int L_cap, luna_decoder_layer_state *layers) {
    if ((model->config.arch == LUNA_ARCH_LUNA) != (dims->L > 0) || dims->m > m_cap ||
        dims->L > L_cap || s0 < 0 || r0 < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "decoder: admit %d sentences (source length %d of %d, %d P slots of %d)",
                          dims->S, dims->m, m_cap, dims->L, L_cap);
    luna_arena_mark mark = luna_arena_get_mark(scratch);
    luna_status st =
        admit(model, scratch, src, src_valid, p_valid, dims, s0, slots, r0, m_cap, L_cap, layers);
    luna_arena_release(scratch, mark);
    return st;
}

/* ---- one step -------------------------------------------------------------------------------- */

/* x_out = LN(x + FFN(x)) */
static luna_status ffn_block(const luna_pass *ps, const luna_config *c,
                             const luna_decoder_layer_w *w, const luna_act *x, int64_t R,
                             luna_act **out) {
    const int d = c->decoder_embed_dim;
    luna_ffn_act f;
    luna_resnorm_act r;
    LUNA_TRY(luna_ffn_forward(ps, &w->fc1, &w->fc2, &f, x, R, d, c->decoder_ffn_embed_dim, 0));
    LUNA_TRY(
        luna_resnorm_forward(ps, &w->final_layer_norm, &r, x, f.out, w->fc2.bias, R, d, 0.0f, 0));
    *out = r.y;
    return LUNA_OK;
}

static luna_status luna_layer_step(const luna_pass *ps, const luna_config *c,
                                   const luna_decoder_dims *dims, const luna_decoder_layer_w *w,
                                   luna_decoder_layer_state *ls, const luna_act *x,
                                   const int32_t *row_slot, luna_act **out) {
    luna_backend *be = ps->be;
    const int R = dims->R, d = c->decoder_embed_dim, H = c->decoder_attention_heads;
    luna_act *y;
    luna_resnorm_act r1, r2;
    /* x1 = LN(x + CausalLuna(x)) */
    LUNA_TRY(luna_pass_alloc(ps, &y, (int64_t)R * d, "causal attention result"));
    LUNA_TRY(luna_causal_attention_step(be, ps->arena, &w->self_attn, &ls->causal, x, y));
    LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &r1, x, y,
                                  w->self_attn.out_proj.bias, R, d, 0.0f, 0));
    /* x2 = LN(x1 + unpack(x1)): each row's query against its sentence's packed keys/values
     * (luna_attention_unpack's math; row_slot: its sentence), every row in one call */
    luna_act *qc, *oc, *yc;
    const int dh = d / H;
    LUNA_TRY(luna_project(ps, &qc, r1.y, &w->encoder_attn.q_proj, R, d, d));
    LUNA_TRY(luna_pass_alloc(ps, &oc, (int64_t)R * d, "unpack attention output"));
    LUNA_TRY(be->ops->cross_attention(be, oc, qc, ls->kp, ls->vp, row_slot, dims->sent_valid, R, H,
                                      dh, dims->L, 1.0f / sqrtf((float)dh)));
    LUNA_TRY(luna_pass_alloc(ps, &yc, (int64_t)R * d, "unpack attention result"));
    LUNA_TRY(be->ops->linear_forward(be, yc, oc, w->encoder_attn.out_proj.weight, NULL, R, d, d));
    LUNA_TRY(luna_resnorm_forward(ps, &w->encoder_attn_layer_norm, &r2, r1.y, yc,
                                  w->encoder_attn.out_proj.bias, R, d, 0.0f, 0));
    return ffn_block(ps, c, w, r2.y, R, out);
}

/* lens (device [R], NULL: every row at dims->step): each row's positions after this step;
 * T: the most of them. */
static luna_status transformer_layer_step(const luna_pass *ps, const luna_config *c,
                                          const luna_decoder_dims *dims,
                                          const luna_decoder_layer_w *w,
                                          luna_decoder_layer_state *ls, const luna_act *x,
                                          const int32_t *lens, const int32_t *row_slot, int T,
                                          luna_act **out) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int R = dims->R, d = c->decoder_embed_dim, H = c->decoder_attention_heads, dh = d / H;
    const int T_cap = dims->max_steps, page = dims->cache_page > 0 ? dims->cache_page : T_cap;
    luna_act *q, *k, *v, *s, *o, *y;
    luna_resnorm_act r1, r2;
    /* k, v, q [R, H, 1, dh] (one position: [R, 1, H, dh]) in one call, in the parameter table's
     * order; q scaled by dh^-1/2 */
    const luna_linear_w *kvq[3] = {&w->self_attn.k_proj, &w->self_attn.v_proj,
                                   &w->self_attn.q_proj};
    LUNA_TRY(luna_project_multi(ps, &k, x, kvq, 3, R, d, d));
    v = luna_act_at(be, k, (int64_t)R * d);
    q = luna_act_at(be, k, 2 * (int64_t)R * d);
    LUNA_TRY(op->scale_act(be, q, 1.0f / sqrtf((float)dh), (int64_t)R * d));
    LUNA_TRY(luna_pass_alloc(ps, &s, (int64_t)R * H * T_cap, "self-attention scores"));
    LUNA_TRY(luna_pass_alloc(ps, &o, (int64_t)R * d, "self-attention output"));
    /* cache[slot, h, t mod page] = k, v for each row's position t (the slot of row r's position
     * t is dims->cache_slots[r, t]: row r's own slot, or its sentence's block under in-flight
     * batching), then per (row, head) s = q·K[:t+1]ᵀ, softmax, o = s·V[:t+1], position p of row
     * r read from slot cache_slots[r, p] (beam reorders move slot indices, not cached rows).
     * Rows at different positions (in-flight) carry their lengths t + 1 (lens): one launch per
     * op for all rows, each row's sums those of a batch of its own. */
    const int32_t *ind = dims->cache_slots;
    LUNA_TRY(op->cache_write(be, ls->self_k, k, ind, lens, R, H, dh, T, T_cap, page));
    LUNA_TRY(op->cache_write(be, ls->self_v, v, ind, lens, R, H, dh, T, T_cap, page));
    LUNA_TRY(op->cache_products(be, false, s, q, ls->self_k, ind, lens, R, H, dh, T, T_cap, page));
    LUNA_TRY(op->softmax_forward(be, s, s, (int64_t)R * H, T, lens, H, 0));
    /* [R, H, 1, dh] is [R, d]: heads merged already */
    LUNA_TRY(op->cache_products(be, true, o, s, ls->self_v, ind, lens, R, H, dh, T, T_cap, page));
    LUNA_TRY(luna_pass_alloc(ps, &y, (int64_t)R * d, "self-attention result"));
    LUNA_TRY(op->linear_forward(be, y, o, w->self_attn.out_proj.weight, NULL, R, d, d));
    LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &r1, x, y,
                                  w->self_attn.out_proj.bias, R, d, 0.0f, 0));
    /* cross-attention: each row's query against its sentence's source keys/values (row_slot: the
     * slot that holds them), every row in one call */
    luna_act *qc, *oc, *yc;
    LUNA_TRY(luna_project(ps, &qc, r1.y, &w->encoder_attn.q_proj, R, d, d));
    LUNA_TRY(luna_pass_alloc(ps, &oc, (int64_t)R * d, "cross-attention output"));
    LUNA_TRY(op->cross_attention(be, oc, qc, ls->cross_k, ls->cross_v, row_slot,
                                 dims->sent_slot ? dims->slot_valid : dims->sent_valid, R, H, dh,
                                 dims->m, 1.0f / sqrtf((float)dh)));
    LUNA_TRY(luna_pass_alloc(ps, &yc, (int64_t)R * d, "cross-attention result"));
    LUNA_TRY(op->linear_forward(be, yc, oc, w->encoder_attn.out_proj.weight, NULL, R, d, d));
    LUNA_TRY(luna_resnorm_forward(ps, &w->encoder_attn_layer_norm, &r2, r1.y, yc,
                                  w->encoder_attn.out_proj.bias, R, d, 0.0f, 0));
    return ffn_block(ps, c, w, r2.y, R, out);
}

static luna_status step(const luna_pass *ps, luna_seq2seq *model, const luna_decoder_dims *dims,
                        luna_decoder_layer_state *layers, const int32_t *tokens,
                        const int32_t *rows_t, const int32_t *lens, const int32_t *row_slot, int T,
                        luna_act **logits);
static luna_status layers_and_logits(const luna_pass *ps, luna_seq2seq *model,
                                     const luna_decoder_dims *dims,
                                     luna_decoder_layer_state *layers, luna_act *x,
                                     const int32_t *lens, const int32_t *row_slot, int T,
                                     luna_act **logits);

luna_status luna_decoder_positions(luna_backend *be, const luna_config *c, luna_act *positions,
                                   int max_steps) {
    return be->ops->sinusoidal_table(be, positions, c->padding_idx + 1, max_steps,
                                     c->decoder_embed_dim);
}

luna_status luna_decoder_step_upload(const luna_pass *ps, const luna_decoder_dims *dims,
                                     luna_decoder_step_rows *out) {
    const int R = dims->R;
    for (int b = 0; b < (dims->sent_step ? dims->S : 1); b++) {
        const int t = dims->sent_step ? dims->sent_step[b] : dims->step;
        if (t >= dims->max_steps)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "decoder: step %d exceeds max_steps %d",
                              t + 1, dims->max_steps);
    }
    /* Rows at different positions (in-flight batching): one upload of each row's steps taken
     * (Luna's 1/t, and every row's position embedding), the slot of its sentence's source
     * keys/values (the cross-attention) and, for the transformer, its positions after this step
     * (its self-attention's lengths); all read on the device, so the launches that follow do not
     * depend on the positions. Else all rows at dims->step: only the slots. */
    int T = dims->step + 1;
    const bool transformer = dims->L == 0, at_own = dims->sent_step != NULL;
    const int parts = at_own ? (transformer ? 3 : 2) : 1;
    int32_t *host = malloc(sizeof(int32_t) * 3 * (size_t)(R > 0 ? R : 1));
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoder: out of host memory");
    int32_t *h_t = host, *h_slot = host + (at_own ? R : 0), *h_lens = host + 2 * (size_t)R;
    for (int b = 0; b < dims->S; b++)
        for (int j = 0; j < luna_decoder_sentence_rows(dims, b); j++) {
            const int r = luna_decoder_first_row(dims, b) + j;
            if (at_own) h_t[r] = dims->sent_step[b];
            if (at_own && transformer) h_lens[r] = dims->sent_step[b] + 1;
            h_slot[r] = dims->sent_slot ? dims->sent_slot[b] : b;
        }
    if (at_own) {
        T = 1;
        for (int b = 0; b < dims->S; b++)
            T = dims->sent_step[b] + 1 > T ? dims->sent_step[b] + 1 : T;
        if (transformer && dims->T_round > 0) {
            T = (T + dims->T_round - 1) / dims->T_round * dims->T_round;
            T = T < dims->max_steps ? T : dims->max_steps;
        }
    }
    int32_t *dev = NULL;
    luna_status st = luna_pass_alloc_i32(ps, &dev, parts * (int64_t)R, "row positions and slots");
    if (st == LUNA_OK)
        st = luna_mem_from_host(ps->be, dev, host, sizeof(int32_t) * (size_t)parts * (size_t)R);
    free(host);
    LUNA_TRY(st);
    *out = (luna_decoder_step_rows){.rows_t = at_own ? dev : NULL,
                                    .row_slot = at_own ? dev + R : dev,
                                    .lens = at_own && transformer ? dev + 2 * (size_t)R : NULL,
                                    .T = T};
    return LUNA_OK;
}

luna_status luna_decoder_step_run(const luna_pass *ps, luna_seq2seq *model,
                                  const luna_decoder_dims *dims, luna_decoder_layer_state *layers,
                                  const int32_t *tokens, const luna_decoder_step_rows *rows,
                                  luna_act **logits) {
    const luna_config *c = &model->config;
    for (int i = 0; i < c->decoder_layers && dims->L > 0; i++)
        layers[i].causal.row_t = rows->rows_t;
    const luna_status st = step(ps, model, dims, layers, tokens, rows->rows_t, rows->lens,
                                rows->row_slot, rows->T, logits);
    for (int i = 0; i < c->decoder_layers && dims->L > 0; i++)
        layers[i].causal.row_t = NULL;
    return st;
}

luna_status luna_decoder_step(const luna_pass *ps, luna_seq2seq *model,
                              const luna_decoder_dims *dims, luna_decoder_layer_state *layers,
                              const int32_t *tokens, luna_act **logits) {
    luna_decoder_step_rows rows;
    LUNA_TRY(luna_decoder_step_upload(ps, dims, &rows));
    return luna_decoder_step_run(ps, model, dims, layers, tokens, &rows, logits);
}

static luna_status step(const luna_pass *ps, luna_seq2seq *model, const luna_decoder_dims *dims,
                        luna_decoder_layer_state *layers, const int32_t *tokens,
                        const int32_t *rows_t, const int32_t *lens, const int32_t *row_slot, int T,
                        luna_act **logits) {
    const luna_config *c = &model->config;
    luna_backend *be = ps->be;
    const luna_weights *w = &model->params->w;
    const int R = dims->R, d = c->decoder_embed_dim, V = c->vocab_size;
    /* x = √d·E[token] + sinusoid(padding_idx + 1 + t) (fairseq's position of target step t) */
    luna_act *x, *pos;
    LUNA_TRY(luna_pass_alloc(ps, &x, (int64_t)R * d, "target embeddings"));
    LUNA_TRY(luna_pass_alloc(ps, &pos, (int64_t)(R + 1) * d, "target position"));
    LUNA_TRY(be->ops->embedding_forward(be, x, w->decoder_embed_tokens, tokens, R, V, d,
                                        sqrtf((float)d), c->padding_idx));
    luna_act *pos_rows = luna_act_at(be, pos, d); /* [R, d]: each row's sinusoid */
    /* rows at their own positions: each row's sinusoid gathered by its step on the device */
    if (rows_t && dims->positions) {
        LUNA_TRY(be->ops->gather_rows(be, pos_rows, d, dims->positions, d, rows_t, R, d));
        LUNA_TRY(be->ops->add(be, x, x, pos_rows, (int64_t)R * d));
        return layers_and_logits(ps, model, dims, layers, x, lens, row_slot, T, logits);
    }
    int t0 = dims->step, t1 = dims->step;
    for (int b = 0; dims->sent_step && b < dims->S; b++) {
        t0 = b == 0 || dims->sent_step[b] < t0 ? dims->sent_step[b] : t0;
        t1 = b == 0 || dims->sent_step[b] > t1 ? dims->sent_step[b] : t1;
    }
    if (t0 == t1) {
        LUNA_TRY(be->ops->sinusoidal_table(be, pos, c->padding_idx + 1 + t0, 1, d));
        LUNA_TRY(be->ops->broadcast_rows(be, pos_rows, pos, R, 1, d));
    } else { /* rows at different positions: a table of t0..t1, each row gathers its own */
        luna_act *table;
        int32_t *idx, *idx_host = malloc(sizeof(int32_t) * (size_t)R);
        if (!idx_host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoder: out of host memory");
        for (int b = 0; b < dims->S; b++)
            for (int j = 0; j < luna_decoder_sentence_rows(dims, b); j++)
                idx_host[luna_decoder_first_row(dims, b) + j] = dims->sent_step[b] - t0;
        luna_status st = luna_pass_alloc(ps, &table, (int64_t)(t1 - t0 + 1) * d, "positions");
        if (st == LUNA_OK) st = luna_pass_alloc_i32(ps, &idx, R, "positions");
        if (st == LUNA_OK) st = luna_mem_from_host(be, idx, idx_host, sizeof(int32_t) * (size_t)R);
        free(idx_host);
        LUNA_TRY(st);
        LUNA_TRY(be->ops->sinusoidal_table(be, table, c->padding_idx + 1 + t0, t1 - t0 + 1, d));
        LUNA_TRY(be->ops->gather_rows(be, pos_rows, d, table, d, idx, R, d));
    }
    LUNA_TRY(be->ops->add(be, x, x, pos_rows, (int64_t)R * d));
    return layers_and_logits(ps, model, dims, layers, x, lens, row_slot, T, logits);
}

static luna_status layers_and_logits(const luna_pass *ps, luna_seq2seq *model,
                                     const luna_decoder_dims *dims,
                                     luna_decoder_layer_state *layers, luna_act *x,
                                     const int32_t *lens, const int32_t *row_slot, int T,
                                     luna_act **logits) {
    const luna_config *c = &model->config;
    luna_backend *be = ps->be;
    const luna_weights *w = &model->params->w;
    const int R = dims->R, d = c->decoder_embed_dim, V = c->vocab_size;
    for (int i = 0; i < c->decoder_layers; i++)
        LUNA_TRY(dims->L > 0
                     ? luna_layer_step(ps, c, dims, &w->decoder[i], &layers[i], x, row_slot, &x)
                     : transformer_layer_step(ps, c, dims, &w->decoder[i], &layers[i], x, lens,
                                              row_slot, T, &x));
    LUNA_TRY(luna_pass_alloc(ps, logits, (int64_t)R * V, "logits"));
    return be->ops->linear_forward(be, *logits, x, w->output_projection, NULL, R, d, V);
}

/* ---- held weights ---------------------------------------------------------------------------- */

/* hold: the dtype to hold as (LUNA_F32, or LUNA_I8 for an int8 model), or RELEASE. */
#define RELEASE (-1)
static luna_status hold_one(luna_backend *be, const luna_linear_w *l, int in, int out, int hold) {
    if (!l->weight) return LUNA_OK;
    return hold != RELEASE ? be->ops->hold_weights(be, l->weight, out, in, (luna_dtype)hold)
                           : be->ops->release_weights(be, l->weight);
}

static luna_status hold_attention(luna_backend *be, const luna_attn_w *a, int d, int hold) {
    const luna_linear_w *all[] = {&a->pq_proj, &a->q_proj, &a->pc_proj, &a->c_proj,  &a->pk_proj,
                                  &a->pv_proj, &a->k_proj, &a->v_proj,  &a->out_proj};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        LUNA_TRY(hold_one(be, all[i], d, d, hold));
    return LUNA_OK;
}

luna_status luna_decoder_hold_weights(luna_seq2seq *model, bool holding) {
    luna_backend *be = model->be;
    /* an int8 model's weights are held as int8: its Linears multiply in int8 */
    const int hold = holding ? (int)model->params->weight_dtype : RELEASE;
    const luna_config *c = &model->config;
    const luna_weights *w = &model->params->w;
    const int d = c->decoder_embed_dim, ffn = c->decoder_ffn_embed_dim;
    luna_status first = LUNA_OK; /* releasing goes on past an error, so nothing stays held */
    const int de = c->encoder_embed_dim, ffn_e = c->encoder_ffn_embed_dim;
    for (int i = 0; i < c->encoder_layers; i++) { /* luna_decoder_begin encodes each batch */
        const luna_encoder_layer_w *l = &w->encoder[i];
        luna_status st = hold_attention(be, &l->self_attn, de, hold);
        if (st == LUNA_OK || !holding) st = hold_one(be, &l->fc1, de, ffn_e, hold);
        if (st == LUNA_OK || !holding) st = hold_one(be, &l->fc2, ffn_e, de, hold);
        if (st != LUNA_OK && first == LUNA_OK) first = st;
        if (st != LUNA_OK && holding) return st;
    }
    for (int i = 0; i < c->decoder_layers; i++) {
        const luna_decoder_layer_w *l = &w->decoder[i];
        luna_status st = hold_attention(be, &l->self_attn, d, hold);
        if (st == LUNA_OK || !holding) st = hold_attention(be, &l->encoder_attn, d, hold);
        if (st == LUNA_OK || !holding) st = hold_one(be, &l->fc1, d, ffn, hold);
        if (st == LUNA_OK || !holding) st = hold_one(be, &l->fc2, ffn, d, hold);
        if (st != LUNA_OK && first == LUNA_OK) first = st;
        if (st != LUNA_OK && holding) return st;
    }
    luna_linear_w out = {.weight = w->output_projection};
    luna_status st = hold_one(be, &out, d, c->vocab_size, hold);
    return first != LUNA_OK ? first : st;
}
