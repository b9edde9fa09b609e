#include "decoding/incremental.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "model/luna_attention.h"

typedef struct {
    luna_causal_state causal;    /* Luna: per row (pt, ksum, vsum [R, L·d]) */
    luna_act *kp, *vp;           /* Luna: [S, H, L, dh] cross unpack keys/values (vp == kp: tied) */
    luna_act *self_k, *self_v;   /* transformer: [R, T_max, d] key/value cache */
    luna_act *cross_k, *cross_v; /* transformer: [S, H, m, dh] */
} layer_state;

struct luna_incremental {
    luna_seq2seq *model;
    luna_backend *be;
    luna_arena *state, *scratch;
    int layers, d, H, V;
    bool luna;
    int beam, S, R, L, m, max_steps, step;
    int cap_rows;        /* rows allocated at begin */
    bool masked;         /* per-row valid counts apply (P mask, or source padding) */
    int32_t *valid_host; /* [cap_rows] P mask (Luna) or source length (transformer) per row */
    int32_t *valid_dev;  /* device copy (state arena) */
    layer_state *ls;     /* [layers] */
};

luna_status luna_incremental_create(luna_incremental **out, luna_seq2seq *model) {
    *out = NULL;
    const luna_config *c = &model->config;
    if (c->encoder_embed_dim != c->decoder_embed_dim)
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "incremental decoding: encoder and decoder dims differ (%d, %d)",
                          c->encoder_embed_dim, c->decoder_embed_dim);
    luna_incremental *inc = calloc(1, sizeof *inc);
    if (!inc) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    inc->model = model;
    inc->be = model->be;
    inc->layers = c->decoder_layers;
    inc->d = c->decoder_embed_dim;
    inc->H = c->decoder_attention_heads;
    inc->V = c->vocab_size;
    inc->luna = c->arch == LUNA_ARCH_LUNA;
    inc->ls = calloc((size_t)inc->layers, sizeof *inc->ls);
    luna_status st =
        inc->ls ? LUNA_OK
                : luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    if (st == LUNA_OK) st = luna_arena_create(&inc->state, inc->be, (size_t)16 << 20);
    if (st == LUNA_OK) st = luna_arena_create(&inc->scratch, inc->be, (size_t)32 << 20);
    if (st != LUNA_OK) {
        luna_incremental_free(inc);
        return st;
    }
    *out = inc;
    return LUNA_OK;
}

void luna_incremental_free(luna_incremental *inc) {
    if (!inc) return;
    luna_arena_free(inc->state);
    luna_arena_free(inc->scratch);
    free(inc->valid_host);
    free(inc->ls);
    free(inc);
}

const luna_config *luna_incremental_config(const luna_incremental *inc) {
    return &inc->model->config;
}
int luna_incremental_rows(const luna_incremental *inc) { return inc->R; }
int luna_incremental_sentences(const luna_incremental *inc) { return inc->S; }
int luna_incremental_beam(const luna_incremental *inc) { return inc->beam; }
int luna_incremental_steps(const luna_incremental *inc) { return inc->step; }
int luna_incremental_projection_slots(const luna_incremental *inc) { return inc->L; }
size_t luna_incremental_state_bytes(const luna_incremental *inc) {
    return luna_arena_used_bytes(inc->state);
}
size_t luna_incremental_scratch_bytes(const luna_incremental *inc) {
    return luna_arena_used_bytes(inc->scratch);
}
size_t luna_incremental_scratch_peak(const luna_incremental *inc) {
    return luna_arena_peak_bytes(inc->scratch);
}

/* ---- helpers --------------------------------------------------------------------------------- */

/* Gather rows in place: new row i = old row idx[i] (first `copy` bytes of rows `stride` bytes
 * apart), through a scratch buffer. */
static luna_status gather_rows(luna_incremental *inc, void *buf, size_t stride, size_t copy,
                               const int32_t *idx, int n) {
    bool identity = true;
    for (int i = 0; i < n && identity; i++)
        identity = idx[i] == i;
    if (identity || copy == 0) return LUNA_OK;
    luna_backend *be = inc->be;
    luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
    char *tmp = luna_arena_alloc(inc->scratch, (size_t)n * copy);
    if (!tmp) return LUNA_ERR_OUT_OF_MEMORY;
    char *base = buf;
    for (int i = 0; i < n; i++)
        LUNA_TRY(luna_mem_copy(be, tmp + (size_t)i * copy, base + idx[i] * stride, copy));
    for (int i = 0; i < n; i++)
        LUNA_TRY(luna_mem_copy(be, base + (size_t)i * stride, tmp + (size_t)i * copy, copy));
    luna_arena_release(inc->scratch, mark);
    return LUNA_OK;
}

/* Attention of every row's query to its sentence's keys/values:
 *   q [R, H, dh] (scaled), k, v [S, H, n, dh], valid [R] (device) or NULL -> o [R, H·dh].
 * Rows s·beam .. s·beam+beam-1 use sentence s. */
static luna_status sentence_attention(luna_incremental *inc, const luna_pass *ps, const luna_act *q,
                                      const luna_act *k, const luna_act *v, int n,
                                      const int32_t *valid, luna_act *o) {
    luna_backend *be = inc->be;
    const int R = inc->R, S = inc->S, beam = inc->beam, H = inc->H, d = inc->d, dh = d / H;
    luna_act *s; /* [R, H, n] */
    LUNA_TRY(luna_pass_alloc(ps, &s, (int64_t)R * H * n, "decoder cross-attention scores"));
    if (beam == 1) { /* (sentence, head) groups have constant strides: one batched GEMM */
        LUNA_TRY(be->ops->gemm(be, false, true, 1, n, dh, 1.0f, q, dh, dh, k, dh, (int64_t)n * dh,
                               0.0f, s, n, n, S * H));
    } else {
        for (int b = 0; b < S; b++)
            LUNA_TRY(be->ops->gemm(
                be, false, true, beam, n, dh, 1.0f, luna_act_at(be, q, (int64_t)b * beam * d), d,
                dh, luna_act_at(be, k, (int64_t)b * H * n * dh), dh, (int64_t)n * dh, 0.0f,
                luna_act_at(be, s, (int64_t)b * beam * H * n), H * n, n, H));
    }
    LUNA_TRY(be->ops->softmax_forward(be, s, s, (int64_t)R * H, n, valid, H, 0));
    if (beam == 1)
        return be->ops->gemm(be, false, false, 1, dh, n, 1.0f, s, n, n, v, dh, (int64_t)n * dh,
                             0.0f, o, dh, dh, S * H);
    for (int b = 0; b < S; b++)
        LUNA_TRY(be->ops->gemm(be, false, false, beam, dh, n, 1.0f,
                               luna_act_at(be, s, (int64_t)b * beam * H * n), H * n, n,
                               luna_act_at(be, v, (int64_t)b * H * n * dh), dh, (int64_t)n * dh,
                               0.0f, luna_act_at(be, o, (int64_t)b * beam * d), d, dh, H));
    return LUNA_OK;
}

static luna_status check_source(const luna_config *c, const int32_t *src, const int32_t *lens,
                                int S, int m) {
    for (int b = 0; b < S; b++) {
        if (lens[b] < 1 || lens[b] > m)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: sentence %d: source length %d out of [1, %d]",
                              b, lens[b], m);
        for (int t = 0; t < m; t++) {
            int32_t tok = src[(int64_t)b * m + t];
            if (tok < 0 || tok >= c->vocab_size || (tok == c->padding_idx) != (t >= lens[b]))
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "incremental decoding: sentence %d: source token %d at %d is out "
                                  "of range or not right-padded to length %d",
                                  b, tok, t, lens[b]);
        }
    }
    return LUNA_OK;
}

/* ---- begin: encoder and the per-sentence decoder state --------------------------------------- */

/* Encoder on S sentences: x [S, m, d] and (Luna) p [S, L, d] in the scratch arena. */
static luna_status encode(luna_incremental *inc, const luna_pass *ps, const int32_t *src,
                          const luna_layer_dims *dims, luna_act **x_out, luna_act **p_out) {
    luna_seq2seq *model = inc->model;
    const luna_config *c = &model->config;
    luna_backend *be = inc->be;
    const luna_weights *w = &model->params->w;
    const int S = dims->B, m = dims->m, L = dims->L, d = c->encoder_embed_dim;
    const float emb_scale = sqrtf((float)d);
    int32_t *tok;
    LUNA_TRY(luna_pass_alloc_i32(ps, &tok, (int64_t)S * m, "source tokens"));
    LUNA_TRY(luna_mem_from_host(be, tok, src, (size_t)S * m * sizeof(int32_t)));
    luna_act *x, *p = NULL;
    LUNA_TRY(luna_pass_alloc(ps, &x, (int64_t)S * m * d, "source embeddings"));
    LUNA_TRY(be->ops->embedding_forward(be, x, w->embed_tokens, tok, (int64_t)S * m, c->vocab_size,
                                        d, emb_scale, c->padding_idx));
    LUNA_TRY(be->ops->positions_add(be, x, tok, S, m, d, c->padding_idx));
    if (L > 0) {
        luna_act *p1; /* [L, d] = √d·P[:L] + sinusoid(0..L-1) */
        LUNA_TRY(luna_pass_alloc(ps, &p1, (int64_t)L * d, "projected embeddings"));
        LUNA_TRY(luna_pass_alloc(ps, &p, (int64_t)S * L * d, "projected embeddings"));
        LUNA_TRY(be->ops->sinusoidal_table(be, p1, 0, L, d));
        LUNA_TRY(be->ops->axpy(be, p1, emb_scale, w->projected_embeddings, (int64_t)L * d));
        LUNA_TRY(be->ops->broadcast_rows(be, p, p1, S, L, d));
    }
    luna_encoder_layer_act act;
    for (int i = 0; i < c->encoder_layers; i++) {
        LUNA_TRY(luna_encoder_layer_forward(ps, c, &w->encoder[i], &act, x, p, dims, i));
        x = act.x_out;
        p = act.p_out;
    }
    *x_out = x;
    *p_out = p;
    return LUNA_OK;
}

static luna_status begin(luna_incremental *inc, const int32_t *src, const int32_t *lens) {
    luna_seq2seq *model = inc->model;
    const luna_config *c = &model->config;
    luna_backend *be = inc->be;
    const luna_weights *w = &model->params->w;
    const int S = inc->S, R = inc->R, m = inc->m, d = inc->d, H = inc->H, beam = inc->beam;
    const bool tied = !c->untie_luna_kv;
    luna_pass ps = {.be = be, .arena = inc->scratch}, pst = {.be = be, .arena = inc->state};

    /* masks: per sentence (scratch, for the encoder) and per row (state) */
    int32_t *host = malloc(sizeof(int32_t) * (size_t)S * 2);
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    int longest = 0;
    for (int b = 0; b < S; b++)
        longest = lens[b] > longest ? lens[b] : longest;
    inc->L = 0;
    if (inc->luna)
        inc->L = c->fix_projection_length || longest > c->projection_length ? c->projection_length
                                                                            : longest;
    const int L = inc->L;
    for (int b = 0; b < S; b++) {
        host[b] = lens[b];
        host[S + b] = lens[b] < L ? lens[b] : L;
    }
    inc->masked = !inc->luna || !c->fix_projection_length;
    for (int r = 0; r < R; r++)
        inc->valid_host[r] = host[(inc->luna ? S : 0) + r / beam];
    int32_t *src_valid = NULL, *p_valid = NULL;
    luna_status st = luna_pass_alloc_i32(&pst, &inc->valid_dev, R, "decoder masks");
    if (st == LUNA_OK) st = luna_pass_alloc_i32(&ps, &src_valid, S, "source lengths");
    if (st == LUNA_OK && inc->luna && inc->masked)
        st = luna_pass_alloc_i32(&ps, &p_valid, S, "P mask");
    if (st == LUNA_OK) {
        st = luna_mem_from_host(be, inc->valid_dev, inc->valid_host, (size_t)R * sizeof(int32_t));
        if (st == LUNA_OK)
            st = luna_mem_from_host(be, src_valid, host, (size_t)S * sizeof(int32_t));
        if (st == LUNA_OK && p_valid)
            st = luna_mem_from_host(be, p_valid, host + S, (size_t)S * sizeof(int32_t));
    }
    free(host);
    LUNA_TRY(st);

    luna_layer_dims dims = {
        .B = S, .n = 1, .m = m, .L = L, .src_valid = src_valid, .p_valid = p_valid};
    luna_act *e, *p;
    LUNA_TRY(encode(inc, &ps, src, &dims, &e, &p));

    int32_t *expand = malloc(sizeof(int32_t) * (size_t)R); /* row -> sentence */
    if (!expand) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    for (int r = 0; r < R; r++)
        expand[r] = r / beam;
    const size_t Ld = luna_act_bytes(be, (int64_t)L * d);
    for (int i = 0; i < inc->layers && st == LUNA_OK; i++) {
        const luna_decoder_layer_w *lw = &w->decoder[i];
        layer_state *ls = &inc->ls[i];
        memset(ls, 0, sizeof *ls);
        if (!inc->luna) {
            /* cross keys/values per sentence; self cache per row */
            st = luna_project_heads(&pst, &ls->cross_k, e, &lw->encoder_attn.k_proj, S, m, d, H,
                                    1.0f);
            if (st == LUNA_OK)
                st = luna_project_heads(&pst, &ls->cross_v, e, &lw->encoder_attn.v_proj, S, m, d, H,
                                        1.0f);
            const int64_t cache = (int64_t)R * inc->max_steps * d;
            if (st == LUNA_OK) st = luna_pass_alloc(&pst, &ls->self_k, cache, "key cache");
            if (st == LUNA_OK) st = luna_pass_alloc(&pst, &ls->self_v, cache, "value cache");
            continue;
        }
        /* causal state: P̃ from this layer's P (per sentence, expanded to rows), zero sums */
        luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
        luna_causal_state cs;
        st = luna_causal_state_init(be, inc->scratch, &lw->self_attn, &cs, p, NULL, S, L, d, H,
                                    tied, c->causal_activation);
        luna_causal_state *rs = &ls->causal;
        *rs = (luna_causal_state){.B = R,
                                  .L = L,
                                  .d = d,
                                  .H = H,
                                  .tied = tied,
                                  .activation = c->causal_activation,
                                  .p_valid = inc->masked ? inc->valid_dev : NULL};
        if (st == LUNA_OK) st = luna_pass_alloc(&pst, &rs->pt, (int64_t)R * L * d, "causal state");
        if (st == LUNA_OK)
            st = luna_pass_alloc(&pst, &rs->ksum, (int64_t)R * L * d, "causal state");
        if (st == LUNA_OK)
            st = luna_pass_alloc(&pst, &rs->vsum, (int64_t)R * L * d, "causal state");
        for (int r = 0; r < R && st == LUNA_OK; r++)
            st = luna_mem_copy(be, (char *)rs->pt + r * Ld, (char *)cs.pt + expand[r] * Ld, Ld);
        if (st == LUNA_OK) st = luna_mem_zero(be, rs->ksum, (size_t)R * Ld);
        if (st == LUNA_OK) st = luna_mem_zero(be, rs->vsum, (size_t)R * Ld);
        luna_arena_release(inc->scratch, mark);
        /* cross-attention: pack once (Y_P, c_proj(Y_P)); the query x is a dummy here */
        luna_act *x0 = NULL;
        luna_attn_act a;
        if (st == LUNA_OK) st = luna_pass_alloc(&ps, &x0, (int64_t)S * d, "dummy query");
        if (st == LUNA_OK) st = luna_mem_zero(be, x0, luna_act_bytes(be, (int64_t)S * d));
        if (st == LUNA_OK) {
            st = luna_attention_forward(&ps, &lw->encoder_attn, &a, x0, p, e, src_valid, p_valid, S,
                                        1, m, L, d, H, tied, 0);
        }
        if (st == LUNA_OK) st = luna_pass_alloc(&pst, &ls->kp, (int64_t)S * L * d, "cross keys");
        if (st == LUNA_OK) st = luna_mem_copy(be, ls->kp, a.kp, (size_t)S * Ld);
        ls->vp = ls->kp;
        if (st == LUNA_OK && !tied) {
            st = luna_pass_alloc(&pst, &ls->vp, (int64_t)S * L * d, "cross values");
            if (st == LUNA_OK) st = luna_mem_copy(be, ls->vp, a.vp, (size_t)S * Ld);
        }
        /* P of the next layer = LN_p(p + Y_P) (the last layer's is unused) */
        if (st == LUNA_OK && i + 1 < inc->layers) {
            luna_resnorm_act pa;
            st = luna_resnorm_forward(&ps, &lw->encoder_atten_proj_layer_norm, &pa, p, a.yp,
                                      (int64_t)S * L, d, 0.0f, 0);
            p = pa.y;
        }
    }
    free(expand);
    return st;
}

luna_status luna_incremental_begin(luna_incremental *inc, const int32_t *src_tokens,
                                   const int32_t *src_lengths, int S, int m, int beam,
                                   int max_steps) {
    if (S <= 0 || m <= 0 || beam <= 0 || max_steps <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: bad sizes (sentences %d, source length %d, beam "
                          "%d, max steps %d)",
                          S, m, beam, max_steps);
    LUNA_TRY(check_source(&inc->model->config, src_tokens, src_lengths, S, m));
    luna_arena_reset(inc->state);
    luna_arena_reset(inc->scratch);
    const int R = S * beam;
    int32_t *vh = realloc(inc->valid_host, sizeof(int32_t) * (size_t)R);
    if (!vh) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    inc->valid_host = vh;
    inc->S = S;
    inc->R = inc->cap_rows = R;
    inc->beam = beam;
    inc->m = m;
    inc->max_steps = max_steps;
    inc->step = 0;
    luna_status st = begin(inc, src_tokens, src_lengths);
    luna_arena_reset(inc->scratch);
    if (st != LUNA_OK) {
        luna_arena_reset(inc->state);
        inc->S = inc->R = inc->cap_rows = 0;
        luna_error_prefix("incremental decoding: begin");
    }
    return st;
}

/* ---- one step -------------------------------------------------------------------------------- */

static luna_status ffn_block(luna_incremental *inc, const luna_pass *ps,
                             const luna_decoder_layer_w *w, const luna_act *x, luna_act **out) {
    const luna_config *c = &inc->model->config;
    luna_ffn_act f;
    luna_resnorm_act r;
    LUNA_TRY(
        luna_ffn_forward(ps, &w->fc1, &w->fc2, &f, x, inc->R, inc->d, c->decoder_ffn_embed_dim, 0));
    LUNA_TRY(luna_resnorm_forward(ps, &w->final_layer_norm, &r, x, f.out, inc->R, inc->d, 0.0f, 0));
    *out = r.y;
    return LUNA_OK;
}

/* y = out_proj(attention), then x_out = LN(x + y). */
static luna_status attn_out(luna_incremental *inc, const luna_pass *ps, const luna_attn_w *w,
                            const luna_norm_w *norm, const luna_act *x, const luna_act *o,
                            luna_act **out) {
    luna_backend *be = inc->be;
    luna_act *y;
    luna_resnorm_act r;
    LUNA_TRY(luna_pass_alloc(ps, &y, (int64_t)inc->R * inc->d, "attention result"));
    LUNA_TRY(be->ops->linear_forward(be, y, o, w->out_proj.weight, w->out_proj.bias, inc->R, inc->d,
                                     inc->d));
    LUNA_TRY(luna_resnorm_forward(ps, norm, &r, x, y, inc->R, inc->d, 0.0f, 0));
    *out = r.y;
    return LUNA_OK;
}

static luna_status luna_layer_step(luna_incremental *inc, const luna_pass *ps, int i,
                                   const luna_act *x, luna_act **out) {
    luna_backend *be = inc->be;
    const luna_decoder_layer_w *w = &inc->model->params->w.decoder[i];
    layer_state *ls = &inc->ls[i];
    const int R = inc->R, d = inc->d;
    const float scale = 1.0f / sqrtf((float)(d / inc->H));
    luna_act *y, *x1, *x2, *q, *o;
    luna_resnorm_act r;
    /* x1 = LN(x + CausalLuna(x)) */
    LUNA_TRY(luna_pass_alloc(ps, &y, (int64_t)R * d, "causal attention result"));
    LUNA_TRY(luna_causal_attention_step(be, inc->scratch, &w->self_attn, &ls->causal, x, y));
    LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &r, x, y, R, d, 0.0f, 0));
    x1 = r.y;
    /* x2 = LN(x1 + unpack(x1; cached c_proj(Y_P))); for one position heads need no split */
    LUNA_TRY(luna_pass_alloc(ps, &q, (int64_t)R * d, "cross-attention queries"));
    LUNA_TRY(luna_pass_alloc(ps, &o, (int64_t)R * d, "cross-attention output"));
    LUNA_TRY(luna_linear_scaled(ps, q, x1, &w->encoder_attn.q_proj, R, d, d, scale));
    LUNA_TRY(sentence_attention(inc, ps, q, ls->kp, ls->vp, inc->L,
                                inc->masked ? inc->valid_dev : NULL, o));
    LUNA_TRY(attn_out(inc, ps, &w->encoder_attn, &w->encoder_attn_layer_norm, x1, o, &x2));
    return ffn_block(inc, ps, w, x2, out);
}

static luna_status transformer_layer_step(luna_incremental *inc, const luna_pass *ps, int i,
                                          const luna_act *x, luna_act **out) {
    luna_backend *be = inc->be;
    const luna_decoder_layer_w *w = &inc->model->params->w.decoder[i];
    layer_state *ls = &inc->ls[i];
    const int R = inc->R, d = inc->d, H = inc->H, dh = d / H, t = inc->step, T = t + 1;
    const int64_t row = (int64_t)inc->max_steps * d;
    const float scale = 1.0f / sqrtf((float)dh);
    luna_act *q, *k, *v, *s, *o, *x1, *x2;
    LUNA_TRY(luna_pass_alloc(ps, &q, (int64_t)R * d, "self-attention queries"));
    LUNA_TRY(luna_pass_alloc(ps, &k, (int64_t)R * d, "self-attention keys"));
    LUNA_TRY(luna_pass_alloc(ps, &v, (int64_t)R * d, "self-attention values"));
    LUNA_TRY(luna_pass_alloc(ps, &s, (int64_t)H * R * T, "self-attention scores"));
    LUNA_TRY(luna_pass_alloc(ps, &o, (int64_t)R * d, "self-attention output"));
    LUNA_TRY(luna_linear_scaled(ps, q, x, &w->self_attn.q_proj, R, d, d, scale));
    LUNA_TRY(luna_linear_scaled(ps, k, x, &w->self_attn.k_proj, R, d, d, 1.0f));
    LUNA_TRY(luna_linear_scaled(ps, v, x, &w->self_attn.v_proj, R, d, d, 1.0f));
    for (int r = 0; r < R; r++) { /* cache[r, t] = k_t, v_t */
        LUNA_TRY(luna_mem_copy(be, luna_act_at(be, ls->self_k, r * row + (int64_t)t * d),
                               luna_act_at(be, k, (int64_t)r * d), luna_act_bytes(be, d)));
        LUNA_TRY(luna_mem_copy(be, luna_act_at(be, ls->self_v, r * row + (int64_t)t * d),
                               luna_act_at(be, v, (int64_t)r * d), luna_act_bytes(be, d)));
    }
    /* per head h: s[h, r, :T] = q[r, h]·K[r, :T, h]ᵀ; o[r, h] = softmax(s) V[r, :T, h] */
    for (int h = 0; h < H; h++)
        LUNA_TRY(be->ops->gemm(be, false, true, 1, T, dh, 1.0f, luna_act_at(be, q, h * dh), dh, d,
                               luna_act_at(be, ls->self_k, h * dh), d, row, 0.0f,
                               luna_act_at(be, s, (int64_t)h * R * T), T, T, R));
    LUNA_TRY(be->ops->softmax_forward(be, s, s, (int64_t)H * R, T, NULL, 1, 0));
    for (int h = 0; h < H; h++)
        LUNA_TRY(be->ops->gemm(be, false, false, 1, dh, T, 1.0f,
                               luna_act_at(be, s, (int64_t)h * R * T), T, T,
                               luna_act_at(be, ls->self_v, h * dh), d, row, 0.0f,
                               luna_act_at(be, o, h * dh), d, d, R));
    LUNA_TRY(attn_out(inc, ps, &w->self_attn, &w->self_attn_layer_norm, x, o, &x1));
    /* cross-attention to the cached encoder keys/values */
    LUNA_TRY(luna_linear_scaled(ps, q, x1, &w->encoder_attn.q_proj, R, d, d, scale));
    LUNA_TRY(sentence_attention(inc, ps, q, ls->cross_k, ls->cross_v, inc->m, inc->valid_dev, o));
    LUNA_TRY(attn_out(inc, ps, &w->encoder_attn, &w->encoder_attn_layer_norm, x1, o, &x2));
    return ffn_block(inc, ps, w, x2, out);
}

static luna_status step(luna_incremental *inc, const int32_t *tokens, float *log_probs) {
    luna_seq2seq *model = inc->model;
    const luna_config *c = &model->config;
    luna_backend *be = inc->be;
    const luna_weights *w = &model->params->w;
    const int R = inc->R, d = inc->d, V = inc->V;
    luna_pass ps = {.be = be, .arena = inc->scratch};
    int32_t *tok;
    luna_act *x, *pos, *logits;
    LUNA_TRY(luna_pass_alloc_i32(&ps, &tok, R, "decoder tokens"));
    LUNA_TRY(luna_mem_from_host(be, tok, tokens, (size_t)R * sizeof(int32_t)));
    /* x = √d·E[token] + sinusoid(padding_idx + 1 + t) */
    LUNA_TRY(luna_pass_alloc(&ps, &x, (int64_t)R * d, "target embeddings"));
    LUNA_TRY(luna_pass_alloc(&ps, &pos, (int64_t)(R + 1) * d, "target position"));
    LUNA_TRY(be->ops->embedding_forward(be, x, w->embed_tokens, tok, R, V, d, sqrtf((float)d),
                                        c->padding_idx));
    luna_act *pos_rows = luna_act_at(be, pos, d); /* [R, d]: the step's sinusoid on every row */
    LUNA_TRY(be->ops->sinusoidal_table(be, pos, c->padding_idx + 1 + inc->step, 1, d));
    LUNA_TRY(be->ops->broadcast_rows(be, pos_rows, pos, R, 1, d));
    LUNA_TRY(be->ops->add(be, x, x, pos_rows, (int64_t)R * d));
    for (int i = 0; i < inc->layers; i++)
        LUNA_TRY(inc->luna ? luna_layer_step(inc, &ps, i, x, &x)
                           : transformer_layer_step(inc, &ps, i, x, &x));
    LUNA_TRY(luna_pass_alloc(&ps, &logits, (int64_t)R * V, "logits"));
    LUNA_TRY(be->ops->linear_forward(be, logits, x, w->embed_tokens, NULL, R, d, V));
    LUNA_TRY(luna_backend_synchronize(be));
    LUNA_TRY(luna_mem_to_host(be, log_probs, logits, (size_t)R * V * sizeof(float)));
    return LUNA_OK;
}

luna_status luna_incremental_step(luna_incremental *inc, const int32_t *tokens, float *log_probs) {
    const int R = inc->R, V = inc->V;
    if (R <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "incremental decoding: no active rows");
    if (inc->step >= inc->max_steps)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: step %d exceeds max_steps %d given to begin",
                          inc->step + 1, inc->max_steps);
    for (int r = 0; r < R; r++)
        if (tokens[r] < 0 || tokens[r] >= V)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: row %d: token %d out of [0, %d)", r, tokens[r],
                              V);
    luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
    luna_status st = step(inc, tokens, log_probs);
    luna_arena_release(inc->scratch, mark);
    if (st != LUNA_OK) {
        luna_error_prefix("incremental decoding: step %d", inc->step);
        return st;
    }
    inc->step++;
    /* log_softmax in double, per row */
#pragma omp parallel for num_threads(inc->be->num_threads > 0 ? inc->be->num_threads : 1)          \
    schedule(static) if ((int64_t)R * V >= 65536)
    for (int r = 0; r < R; r++) {
        float *row = log_probs + (int64_t)r * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = fmaxf(mx, row[j]);
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += exp((double)row[j] - (double)mx);
        const double lse = (double)mx + log(sum);
        for (int j = 0; j < V; j++)
            row[j] = (float)((double)row[j] - lse);
    }
    return LUNA_OK;
}

/* ---- reordering ------------------------------------------------------------------------------ */

luna_status luna_incremental_reorder(luna_incremental *inc, const int32_t *rows, int new_rows) {
    const int beam = inc->beam, R = inc->R;
    if (new_rows < 0 || new_rows % beam || new_rows > inc->cap_rows)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: reorder to %d rows (beam %d, capacity %d)",
                          new_rows, beam, inc->cap_rows);
    const int S = new_rows / beam;
    int32_t *sent = malloc(sizeof(int32_t) * (size_t)(S + 1) + sizeof(int32_t) * (size_t)new_rows);
    if (!sent) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    int32_t *valid = sent + S + 1;
    for (int i = 0; i < new_rows; i++) {
        if (rows[i] < 0 || rows[i] >= R || rows[i] / beam != rows[i - i % beam] / beam) {
            free(sent);
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: reorder: row %d <- %d is out of [0, %d) or "
                              "mixes sentences within a beam group",
                              i, rows[i], R);
        }
        if (i % beam == 0) sent[i / beam] = rows[i] / beam;
        valid[i] = inc->valid_host[rows[i]];
    }
    luna_status st = LUNA_OK;
    const size_t f = luna_act_bytes(inc->be, 1), d = (size_t)inc->d;
    for (int i = 0; i < inc->layers && st == LUNA_OK; i++) {
        layer_state *ls = &inc->ls[i];
        if (inc->luna) {
            const size_t Ld = (size_t)inc->L * d * f;
            st = gather_rows(inc, ls->causal.pt, Ld, Ld, rows, new_rows);
            if (st == LUNA_OK) st = gather_rows(inc, ls->causal.ksum, Ld, Ld, rows, new_rows);
            if (st == LUNA_OK) st = gather_rows(inc, ls->causal.vsum, Ld, Ld, rows, new_rows);
            if (st == LUNA_OK) st = gather_rows(inc, ls->kp, Ld, Ld, sent, S);
            if (st == LUNA_OK && ls->vp != ls->kp) st = gather_rows(inc, ls->vp, Ld, Ld, sent, S);
            ls->causal.B = new_rows;
        } else {
            const size_t row = (size_t)inc->max_steps * d * f, used = (size_t)inc->step * d * f;
            const size_t md = (size_t)inc->m * d * f;
            st = gather_rows(inc, ls->self_k, row, used, rows, new_rows);
            if (st == LUNA_OK) st = gather_rows(inc, ls->self_v, row, used, rows, new_rows);
            if (st == LUNA_OK) st = gather_rows(inc, ls->cross_k, md, md, sent, S);
            if (st == LUNA_OK) st = gather_rows(inc, ls->cross_v, md, md, sent, S);
        }
    }
    if (st == LUNA_OK) {
        memcpy(inc->valid_host, valid, sizeof(int32_t) * (size_t)new_rows);
        if (new_rows > 0)
            LUNA_TRY(luna_mem_from_host(inc->be, inc->valid_dev, valid,
                                        sizeof(int32_t) * (size_t)new_rows));
        inc->R = new_rows;
        inc->S = S;
    } else {
        luna_error_prefix("incremental decoding: reorder");
    }
    free(sent);
    return st;
}
