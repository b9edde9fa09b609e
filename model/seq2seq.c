#include "model/seq2seq.h"

#include "model/seq2seq_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The table's tensors of one layer ("encoder.layers.3." ...): a contiguous run (the table is
 * built layer by layer, model/param_table.c). */
static luna_status layer_range(const luna_params *p, const char *side, int layer, int *first,
                               int *count) {
    char prefix[64];
    int len = snprintf(prefix, sizeof prefix, "%s.layers.%d.", side, layer);
    *first = -1;
    *count = 0;
    for (int i = 0; i < p->num_tensors; i++) {
        if (strncmp(p->tensors[i].name, prefix, (size_t)len) != 0) continue;
        if (*first < 0) *first = i;
        if (i != *first + *count)
            return luna_error(LUNA_ERR_INTERNAL, "model: the tensors of %s are not contiguous",
                              prefix);
        ++*count;
    }
    return LUNA_OK;
}

static luna_status layer_tensor_ranges(luna_seq2seq *m) {
    for (int i = 0; i < m->config.encoder_layers; i++)
        LUNA_TRY(layer_range(m->params, "encoder", i, &m->enc_first[i], &m->enc_count[i]));
    for (int i = 0; i < m->config.decoder_layers; i++)
        LUNA_TRY(layer_range(m->params, "decoder", i, &m->dec_first[i], &m->dec_count[i]));
    return LUNA_OK;
}

static luna_status create(luna_seq2seq **out, luna_backend *be, const luna_config *config,
                          bool init, const luna_params *shared) {
    *out = NULL;
    LUNA_TRY(luna_config_validate(config));
    luna_seq2seq *m = calloc(1, sizeof *m);
    if (!m) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->config = *config;
    m->be = be;
    m->seed = 1;
    luna_status st = init     ? luna_params_create(&m->params, be, config)
                     : shared ? luna_params_create_shared(&m->params, be, shared)
                              : luna_params_create_for_inference(&m->params, be, config);
    if (st == LUNA_OK) st = luna_arena_create(&m->arena, be, (size_t)64 << 20);
    if (st == LUNA_OK) {
        m->enc_act = calloc((size_t)config->encoder_layers, sizeof *m->enc_act);
        m->dec_act = calloc((size_t)config->decoder_layers, sizeof *m->dec_act);
        m->enc_mark = calloc((size_t)config->encoder_layers, sizeof *m->enc_mark);
        m->dec_mark = calloc((size_t)config->decoder_layers, sizeof *m->dec_mark);
        m->enc_first = calloc((size_t)config->encoder_layers, sizeof *m->enc_first);
        m->enc_count = calloc((size_t)config->encoder_layers, sizeof *m->enc_count);
        m->dec_first = calloc((size_t)config->decoder_layers, sizeof *m->dec_first);
        m->dec_count = calloc((size_t)config->decoder_layers, sizeof *m->dec_count);
        if (!m->enc_act || !m->dec_act || !m->enc_mark || !m->dec_mark || !m->enc_first ||
            !m->enc_count || !m->dec_first || !m->dec_count)
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "model: out of memory");
    }
    if (st == LUNA_OK) st = layer_tensor_ranges(m);
    if (st == LUNA_OK) st = luna_seq2seq_set_graphs(m, true);
    if (st != LUNA_OK) {
        luna_seq2seq_free(m);
        return st;
    }
    *out = m;
    return LUNA_OK;
}

luna_status luna_seq2seq_create(luna_seq2seq **out, luna_backend *be, const luna_config *config) {
    return create(out, be, config, true, NULL);
}

luna_status luna_seq2seq_create_for_inference(luna_seq2seq **out, luna_backend *be,
                                              const luna_config *config) {
    return create(out, be, config, false, NULL);
}

luna_status luna_seq2seq_create_shared(luna_seq2seq **out, luna_backend *be,
                                       const luna_seq2seq *shared) {
    return create(out, be, &shared->config, false, shared->params);
}

void luna_seq2seq_free(luna_seq2seq *m) {
    if (!m) return;
    luna_graph_cache_free(m->graphs); /* before the memory its graphs use */
    luna_mem_release(m->be, m->graph_step, sizeof *m->graph_step);
    luna_params_free(m->params);
    luna_arena_free(m->arena);
    free(m->enc_act);
    free(m->dec_act);
    free(m->enc_mark);
    free(m->dec_mark);
    free(m->enc_first);
    free(m->enc_count);
    free(m->dec_first);
    free(m->dec_count);
    free(m);
}

void luna_seq2seq_set_grads_ready(luna_seq2seq *m, luna_grads_ready_fn fn, void *ctx) {
    m->grads_ready = fn;
    m->grads_ready_ctx = ctx;
}

static luna_status report_ready(const luna_seq2seq *m, int first, int count) {
    if (!m->grads_ready || count <= 0) return LUNA_OK;
    return m->grads_ready(m->grads_ready_ctx, first, count);
}

luna_status luna_seq2seq_init(luna_seq2seq *m, uint64_t seed) {
    m->seed = seed;
    return luna_params_init(m->params, seed);
}

luna_status luna_seq2seq_zero_grad(luna_seq2seq *m) { return luna_params_zero_grad(m->params); }
size_t luna_seq2seq_activation_peak(const luna_seq2seq *m) {
    return luna_arena_peak_bytes(m->arena);
}
void luna_seq2seq_reset_activation_peak(luna_seq2seq *m) { luna_arena_reset_peak(m->arena); }

int64_t luna_batch_target_tokens(const luna_batch *b, int padding_idx) {
    int64_t n = 0;
    for (int64_t i = 0; i < (int64_t)b->B * b->tgt_len; i++)
        n += b->target[i] != padding_idx;
    return n;
}

/* ---- one pass -------------------------------------------------------------------------------- */

/* Host-side checks and the per-sentence counts. Returns the lengths via the out arrays. */
static luna_status check_batch(const luna_config *c, const luna_batch *b, int32_t *src_valid,
                               int32_t *tgt_valid, int32_t *p_valid, int *L) {
    if (b->B <= 0 || b->src_len <= 0 || b->tgt_len <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "batch: empty (B=%d, m=%d, n=%d)", b->B,
                          b->src_len, b->tgt_len);
    const int pad = c->padding_idx;
    int longest = 0;
    for (int i = 0; i < b->B; i++) {
        int len = b->src_lengths[i];
        if (len < 1 || len > b->src_len)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "batch: sentence %d: source length %d out of [1, %d]", i, len,
                              b->src_len);
        for (int t = 0; t < b->src_len; t++) {
            int32_t tok = b->src_tokens[(int64_t)i * b->src_len + t];
            if (tok < 0 || tok >= c->vocab_size)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "batch: sentence %d: source token %d out of [0, %d)", i, tok,
                                  c->vocab_size);
            if ((tok == pad) != (t >= len))
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "batch: sentence %d: source is not right-padded to length %d "
                                  "(position %d)",
                                  i, len, t);
        }
        int tlen = 0;
        while (tlen < b->tgt_len && b->prev_output_tokens[(int64_t)i * b->tgt_len + tlen] != pad)
            tlen++;
        for (int t = 0; t < b->tgt_len; t++) {
            int32_t p = b->prev_output_tokens[(int64_t)i * b->tgt_len + t];
            int32_t y = b->target[(int64_t)i * b->tgt_len + t];
            if (p < 0 || p >= c->vocab_size || y < 0 || y >= c->vocab_size)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "batch: sentence %d: target token out of [0, %d)", i,
                                  c->vocab_size);
            if (t >= tlen && p != pad)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "batch: sentence %d: prev_output_tokens is not right-padded", i);
        }
        src_valid[i] = len;
        tgt_valid[i] = tlen;
        if (len > longest) longest = len;
    }
    if (c->linformer_k > 0 && longest > c->max_source_positions)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "batch: a source of %d tokens exceeds the Linformer maximum of %d "
                          "(max_source_positions: E and F have a fixed length)",
                          longest, c->max_source_positions);
    *L = 0;
    if (c->arch == LUNA_ARCH_LUNA) {
        *L = c->fix_projection_length || longest > c->projection_length ? c->projection_length
                                                                        : longest;
        for (int i = 0; i < b->B; i++)
            p_valid[i] = src_valid[i] < *L ? src_valid[i] : *L;
    }
    return LUNA_OK;
}

luna_status luna_seq2seq_upload_ids(luna_seq2seq_pass *s, int32_t **dev, const int32_t *host,
                                    int64_t count, int64_t cap) {
    LUNA_TRY(luna_pass_alloc_i32(&s->ps, dev, cap, "batch"));
    return count > 0 ? luna_mem_ids_from_host(s->ps.be, *dev, host, count) : LUNA_OK;
}

static luna_status upload_i32(luna_seq2seq_pass *s, int32_t **dev, const int32_t *host, int64_t n) {
    return luna_seq2seq_upload_ids(s, dev, host, n, n);
}

luna_status luna_seq2seq_project(const luna_pass *ps, const float *P, int B, int L, int d,
                                 uint32_t site, luna_act **out) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    LUNA_TRY(luna_pass_alloc(ps, out, (int64_t)B * L * d, "projected embeddings"));
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_act *p1; /* [L, d] */
    LUNA_TRY(luna_pass_alloc(ps, &p1, (int64_t)L * d, "projected embeddings"));
    luna_status st = op->sinusoidal_table(be, p1, 0, L, d);
    if (st == LUNA_OK) st = op->axpy(be, p1, sqrtf((float)d), P, (int64_t)L * d);
    if (st == LUNA_OK) st = op->broadcast_rows(be, *out, p1, B, L, d);
    luna_arena_release(ps->arena, mark);
    LUNA_TRY(st);
    return luna_pass_dropout(ps, *out, *out, (int64_t)B * L * d, ps->dropout, site);
}

/* Backward of luna_seq2seq_project: gP[:L] += √d Σ_b drop'(dp_b); dp [B, L, d] is clobbered. */
static luna_status project_backward(const luna_pass *ps, float *gP, luna_act *dp, int B, int L,
                                    int d, uint32_t site) {
    luna_backend *be = ps->be;
    const int64_t n = (int64_t)B * L * d;
    LUNA_TRY(luna_pass_dropout_backward(ps, dp, dp, n, ps->dropout, site));
    LUNA_TRY(be->ops->scale_act(be, dp, sqrtf((float)d), n));
    return be->ops->sum_broadcast(be, gP, dp, B, L, d);
}

luna_status luna_seq2seq_encode(const luna_pass *ps, const luna_config *c, const luna_weights *w,
                                const int32_t *src, const luna_layer_dims *dims,
                                luna_encoder_layer_act *acts, luna_arena_mark *marks,
                                luna_act **x_src, luna_act **p0, luna_act **enc_out,
                                luna_act **enc_p) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = dims->B, mlen = dims->m, L = dims->L, d = c->encoder_embed_dim;
    const int pad = c->padding_idx, V = c->vocab_size;
    const float emb_scale = sqrtf((float)d);
    /* encoder input and P0 */
    LUNA_TRY(luna_pass_alloc(ps, x_src, (int64_t)B * mlen * d, "source embeddings"));
    LUNA_TRY(op->embedding_forward(be, *x_src, w->embed_tokens, src, (int64_t)B * mlen, V, d,
                                   emb_scale, pad));
    LUNA_TRY(op->positions_add(be, *x_src, src, B, mlen, d, pad));
    LUNA_TRY(luna_pass_dropout(ps, *x_src, *x_src, (int64_t)B * mlen * d, ps->dropout,
                               LUNA_SITE(LUNA_SITE_ENCODER_EMBED, 0, 0)));
    *p0 = NULL;
    if (L > 0)
        LUNA_TRY(luna_seq2seq_project(ps, w->projected_embeddings, B, L, d,
                                      LUNA_SITE(LUNA_SITE_PROJECTED_EMBED, 0, 0), p0));
    /* encoder layers */
    const luna_act *x = *x_src, *p = *p0;
    for (int i = 0; i < c->encoder_layers; i++) {
        if (marks) marks[i] = luna_arena_get_mark(ps->arena);
        if (L > 0 && c->non_contextual_projection && i > 0) {
            luna_act *pi; /* after the mark: backward releases it with the layer */
            LUNA_TRY(luna_seq2seq_project(ps, w->encoder[i].projected_embeddings, B, L, d,
                                          LUNA_SITE(LUNA_SITE_PROJECTED_EMBED, i, 0), &pi));
            p = pi;
        }
        LUNA_TRY(luna_encoder_layer_forward(ps, c, &w->encoder[i], &acts[i], x, p, dims, i));
        x = acts[i].x_out;
        p = acts[i].p_out;
    }
    *enc_out = (luna_act *)x;
    *enc_p = (luna_act *)p;
    return LUNA_OK;
}

/* Host checks, every upload of the pass and the buffers its parts share; the layers follow
 * (luna_seq2seq_pass_layers). */
static luna_status prepare(luna_seq2seq *m, luna_seq2seq_pass *s, const luna_batch *b,
                           bool training, bool grads, uint64_t step) {
    const luna_config *c = &m->config;
    s->m = m;
    s->grads = grads;
    s->ps = (luna_pass){.be = m->be,
                        .arena = m->arena,
                        .training = training,
                        .backward = grads,
                        .seed = m->seed,
                        .step = step,
                        .dropout = (float)c->dropout,
                        .attention_dropout = (float)c->attention_dropout,
                        .activation_dropout = (float)c->activation_dropout};
    s->d = c->encoder_embed_dim;
    s->V = c->vocab_size;
    const int B = b->B, mlen = b->src_len, n = b->tgt_len, d = s->d;

    int32_t *host = malloc((size_t)3 * B * sizeof(int32_t));
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "model: out of host memory");
    int L = 0;
    luna_status st = check_batch(c, b, host, host + B, host + 2 * B, &L);
    int32_t *src_valid = NULL, *tgt_valid = NULL, *p_valid = NULL;
    if (st == LUNA_OK) st = upload_i32(s, &src_valid, host, B);
    if (st == LUNA_OK) st = upload_i32(s, &tgt_valid, host + B, B);
    if (st == LUNA_OK && c->arch == LUNA_ARCH_LUNA && !c->fix_projection_length)
        st = upload_i32(s, &p_valid, host + 2 * B, B);
    free(host);
    LUNA_TRY(st);
    s->dims = (luna_layer_dims){.B = B,
                                .n = n,
                                .m = mlen,
                                .L = L,
                                .src_valid = src_valid,
                                .tgt_valid = tgt_valid,
                                .p_valid = p_valid};
    LUNA_TRY(upload_i32(s, &s->src, b->src_tokens, (int64_t)B * mlen));
    LUNA_TRY(upload_i32(s, &s->prev, b->prev_output_tokens, (int64_t)B * n));
    LUNA_TRY(upload_i32(s, &s->tgt, b->target, (int64_t)B * n));
    LUNA_TRY(luna_seq2seq_loss_upload(s, b));
    /* loss and nll side by side (one readback for both, luna_seq2seq_loss_read), allocated
     * before the layers: the backward pass gives the layers' memory back and reuses it before
     * the losses are read */
    LUNA_TRY(luna_pass_alloc_f32(&s->ps, &s->loss, 2 * (int64_t)B * n, "loss"));
    s->nll = s->loss + (int64_t)B * n;
    s->loss_cap = (int64_t)B * n;

    if (grads) {
        for (int k = 0; k < 2; k++) {
            LUNA_TRY(luna_pass_alloc(&s->ps, &s->gx_dec[k], (int64_t)B * n * d, "gradients"));
            LUNA_TRY(luna_pass_alloc(&s->ps, &s->gx_enc[k], (int64_t)B * mlen * d, "gradients"));
            if (L > 0)
                LUNA_TRY(luna_pass_alloc(&s->ps, &s->gp[k], (int64_t)B * L * d, "gradients"));
        }
        LUNA_TRY(luna_pass_alloc(&s->ps, &s->ge, (int64_t)B * mlen * d, "gradients"));
    }
    return LUNA_OK;
}

luna_status luna_seq2seq_pass_layers(luna_seq2seq_pass *s) {
    luna_seq2seq *m = s->m;
    const luna_config *c = &m->config;
    luna_backend *be = m->be;
    const luna_ops *op = be->ops;
    const luna_weights *w = &m->params->w;
    const int B = s->dims.B, n = s->dims.n, L = s->dims.L, d = s->d, pad = c->padding_idx;
    const float emb_scale = sqrtf((float)d);
    LUNA_TRY(luna_seq2seq_encode(&s->ps, c, w, s->src, &s->dims, m->enc_act, m->enc_mark, &s->x_src,
                                 &s->p0, &s->enc_out, &s->enc_p));
    const luna_act *x, *p = s->enc_p;

    /* decoder */
    LUNA_TRY(luna_pass_alloc(&s->ps, &s->x_tgt, (int64_t)B * n * d, "target embeddings"));
    LUNA_TRY(op->embedding_forward(be, s->x_tgt, w->decoder_embed_tokens, s->prev, (int64_t)B * n,
                                   s->V, d, emb_scale, pad));
    LUNA_TRY(op->positions_add(be, s->x_tgt, s->prev, B, n, d, pad));
    LUNA_TRY(luna_pass_dropout(&s->ps, s->x_tgt, s->x_tgt, (int64_t)B * n * d, s->ps.dropout,
                               LUNA_SITE(LUNA_SITE_DECODER_EMBED, 0, 0)));
    x = s->x_tgt;
    for (int i = 0; i < c->decoder_layers; i++) {
        m->dec_mark[i] = luna_arena_get_mark(m->arena);
        if (L > 0 && c->non_contextual_projection) {
            luna_act *pi;
            LUNA_TRY(luna_seq2seq_project(&s->ps, w->decoder[i].projected_embeddings, B, L, d,
                                          LUNA_SITE(LUNA_SITE_PROJECTED_EMBED, i, 1), &pi));
            p = pi;
        }
        LUNA_TRY(luna_decoder_layer_forward(&s->ps, c, &w->decoder[i], &m->dec_act[i], x, p,
                                            s->enc_out, &s->dims, i));
        x = m->dec_act[i].x_out;
        p = m->dec_act[i].p_out;
    }
    s->dec_out = (luna_act *)x;
    /* the loss's log-sum-exp; the loss's own buffers come after the mark */
    LUNA_TRY(luna_pass_alloc_f32(&s->ps, &s->lse, (int64_t)B * n, "loss"));
    s->logits_mark = luna_arena_get_mark(m->arena);
    return LUNA_OK;
}

/* The caller wants all [N, V] logits (a host copy, tests and tools): computed whole, after the
 * loss (which comes from the chunks, so that it is the training pass's loss to the last bit). */
static luna_status whole_logits(luna_seq2seq_pass *s) {
    luna_backend *be = s->m->be;
    const int64_t N = (int64_t)s->dims.B * s->dims.n;
    LUNA_TRY(luna_pass_alloc(&s->ps, &s->logits, N * s->V, "logits"));
    return be->ops->linear_forward(be, s->logits, s->dec_out, s->m->params->w.output_projection,
                                   NULL, N, s->d, s->V);
}

luna_status luna_seq2seq_pass_backward(luna_seq2seq_pass *s) {
    luna_seq2seq *m = s->m;
    if (!m->params->grad)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "backward: the model was created for inference (no gradient buffer)");
    const luna_config *c = &m->config;
    luna_backend *be = m->be;
    const luna_ops *op = be->ops;
    const luna_weights *w = &m->params->w;
    luna_weights *g = &m->params->g;
    const int B = s->dims.B, n = s->dims.n, mlen = s->dims.m, L = s->dims.L, d = s->d;
    const int pad = c->padding_idx;
    const int64_t N = (int64_t)B * n;
    const float emb_scale = sqrtf((float)d);
    const luna_pass *ps = &s->ps;
    /* Non-contextual P (paper Table 5): no layer's P output is used; every layer's P input
     * gradient goes to that layer's own learned P. */
    const bool nc = L > 0 && c->non_contextual_projection;

    /* the loss and the output projection's backward ran before (luna_seq2seq_loss): dx
     * holds the decoder output's gradient */
    luna_act *dx = s->gx_dec[0], *dx_other = s->gx_dec[1];

    /* decoder */
    LUNA_TRY(luna_mem_zero(be, s->ge, luna_act_bytes(be, (int64_t)B * mlen * d)));
    luna_act *dp = NULL, *dp_other = L > 0 ? s->gp[0] : NULL;
    for (int i = c->decoder_layers - 1; i >= 0; i--) {
        LUNA_TRY(luna_decoder_layer_backward(ps, c, &w->decoder[i], &g->decoder[i], &m->dec_act[i],
                                             dx, nc ? NULL : dp, dx_other, dp_other, s->ge));
        if (nc)
            LUNA_TRY(project_backward(ps, g->decoder[i].projected_embeddings, dp_other, B, L, d,
                                      LUNA_SITE(LUNA_SITE_PROJECTED_EMBED, i, 1)));
        luna_act *t = dx;
        dx = dx_other;
        dx_other = t;
        if (L > 0) {
            dp = dp_other;
            dp_other = dp == s->gp[0] ? s->gp[1] : s->gp[0];
        }
        luna_arena_release(m->arena, m->dec_mark[i]);
        LUNA_TRY(report_ready(m, m->dec_first[i], m->dec_count[i]));
    }
    LUNA_TRY(luna_pass_dropout_backward(ps, dx, dx, N * d, ps->dropout,
                                        LUNA_SITE(LUNA_SITE_DECODER_EMBED, 0, 0)));
    LUNA_TRY(op->embedding_backward(be, g->decoder_embed_tokens, dx, s->prev, N, s->V, d, emb_scale,
                                    pad));

    /* encoder: dx starts as the gradient of the encoder output, dp as that of the final p */
    luna_act *ex = s->ge, *ex_other = s->gx_enc[0];
    for (int i = c->encoder_layers - 1; i >= 0; i--) {
        LUNA_TRY(luna_encoder_layer_backward(ps, c, &w->encoder[i], &g->encoder[i], &m->enc_act[i],
                                             ex, nc ? NULL : dp, ex_other, dp_other));
        if (nc && i > 0)
            LUNA_TRY(project_backward(ps, g->encoder[i].projected_embeddings, dp_other, B, L, d,
                                      LUNA_SITE(LUNA_SITE_PROJECTED_EMBED, i, 0)));
        luna_act *t = ex;
        ex = ex_other;
        ex_other = t == s->ge ? s->gx_enc[1] : t;
        if (L > 0) {
            luna_act *tp = dp;
            dp = dp_other;
            dp_other = tp;
        }
        luna_arena_release(m->arena, m->enc_mark[i]);
        LUNA_TRY(report_ready(m, m->enc_first[i], m->enc_count[i]));
    }
    const int64_t Nm = (int64_t)B * mlen;
    LUNA_TRY(luna_pass_dropout_backward(ps, ex, ex, Nm * d, ps->dropout,
                                        LUNA_SITE(LUNA_SITE_ENCODER_EMBED, 0, 0)));
    LUNA_TRY(op->embedding_backward(be, g->embed_tokens, ex, s->src, Nm, s->V, d, emb_scale, pad));
    if (L > 0) /* P0 = drop(broadcast(√d·P[:L] + sinusoid)) */
        LUNA_TRY(project_backward(ps, g->projected_embeddings, dp, B, L, d,
                                  LUNA_SITE(LUNA_SITE_PROJECTED_EMBED, 0, 0)));
    /* the rest: embeddings (shared by both ends), P, the final layer norms */
    return report_ready(m, 0, m->params->num_tensors);
}

/* dev_sums: the losses are added to these device doubles (loss_sums) instead of being read. */
static luna_status run(luna_seq2seq *m, const luna_batch *b, bool training, bool grads,
                       uint64_t step, double *loss_sum, double *nll_sum, float *logits,
                       double *dev_sums) {
    luna_arena_reset(m->arena);
    luna_seq2seq_pass s;
    memset(&s, 0, sizeof s);
    luna_status st = LUNA_OK;
    if (logits && m->be->act_dtype != LUNA_F32)
        st = luna_error(LUNA_ERR_UNSUPPORTED,
                        "model: logits to the host need fp32 activations "
                        "(this backend keeps them in %s)",
                        luna_dtype_name(m->be->act_dtype));
    if (st == LUNA_OK) st = prepare(m, &s, b, training, grads, step);
    if (st == LUNA_OK && luna_seq2seq_pass_graphed(m, training, grads, dev_sums != NULL)) {
        st = luna_seq2seq_pass_run_graphed(&s);
    } else {
        if (st == LUNA_OK) st = luna_seq2seq_pass_layers(&s);
        if (st == LUNA_OK) st = luna_seq2seq_loss(&s);
        if (st == LUNA_OK && logits && !grads) st = whole_logits(&s);
        if (st == LUNA_OK && logits)
            st = luna_mem_to_host(m->be, logits, s.logits,
                                  (size_t)b->B * b->tgt_len * m->config.vocab_size * sizeof(float));
        /* the losses are read after the backward pass is queued: a readback before it would
         * leave the device idle while the host queued the backward */
        if (st == LUNA_OK && grads) st = luna_seq2seq_pass_backward(&s);
    }
    if (st == LUNA_OK && dev_sums)
        st = m->be->ops->loss_sums(m->be, dev_sums, s.loss, s.nll, s.loss_rows);
    else if (st == LUNA_OK)
        st = luna_seq2seq_loss_read(&s, loss_sum, nll_sum);
    luna_arena_reset(m->arena);
    return st;
}

luna_status luna_seq2seq_forward_backward(luna_seq2seq *m, const luna_batch *b, uint64_t step,
                                          double *loss_sum, double *nll_sum) {
    return run(m, b, true, true, step, loss_sum, nll_sum, NULL, NULL);
}

luna_status luna_seq2seq_forward_backward_sums(luna_seq2seq *m, const luna_batch *b, uint64_t step,
                                               double *sums) {
    if (!sums) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "forward_backward_sums: NULL sums");
    return run(m, b, true, true, step, NULL, NULL, NULL, sums);
}

luna_status luna_seq2seq_forward_sums(luna_seq2seq *m, const luna_batch *b, double *sums) {
    if (!sums) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "forward_sums: NULL sums");
    return run(m, b, false, false, 0, NULL, NULL, NULL, sums);
}

luna_status luna_seq2seq_forward_backward_eval(luna_seq2seq *m, const luna_batch *b,
                                               double *loss_sum, double *nll_sum) {
    return run(m, b, false, true, 0, loss_sum, nll_sum, NULL, NULL);
}

luna_status luna_seq2seq_forward(luna_seq2seq *m, const luna_batch *b, double *loss_sum,
                                 double *nll_sum, float *logits) {
    return run(m, b, false, false, 0, loss_sum, nll_sum, logits, NULL);
}
