#include <math.h>
#include <stdlib.h>

#include "model/seq2seq_internal.h"

/* The output projection and the loss, in row chunks (spec §8; model/seq2seq_internal.h).
 *
 * logits = x·Eᵀ is [N, V]: 4096 tokens × 32k words is 512 MiB of fp32 (and the largest
 * activation of the model), but each row's loss needs only its own row. So the rows go in
 * chunks of at most LOSS_CHUNK_ELEMS logits: per chunk, logits_c = x_c·Eᵀ, the loss, and — when
 * gradients are wanted — at once the backward of the loss and of the projection, while the
 * chunk is still there: dlogits_c (in place; the loss is summed, so its scale is 1 and known
 * now), dx_c = dlogits_c·E (straight into the decoder's output gradient), dE += dlogits_cᵀ·x_c.
 * The [N, V] logits and their gradient never exist whole, and the backward pass starts at the
 * decoder. (A non-finite loss makes the trainer skip the whole update, so the projection's
 * gradient already added is discarded with the rest.) The chunk is big enough (≥ 2048 rows at
 * V = 32k) that the GEMMs keep their speed.
 * Rows whose target is padding have no loss and no gradient, so only the others are projected:
 * they are gathered first (x_pk = x[idx]) and the gradient goes back by a second gather from
 * dx_pk with one zero row appended (dx[i] = dx_pk[inv[i]], inv[i] = Npk for a pad row). With
 * real batches (sorted by length, ~7% padding) this removes that share of the largest GEMMs. */
#define LOSS_CHUNK_ELEMS ((int64_t)1 << 26) /* 256 MiB of fp32 logits, 128 MiB in bf16 */

static int64_t loss_chunk_rows(const luna_seq2seq *m, int64_t N, int V) {
    int64_t elems = m->loss_chunk_elems > 0 ? m->loss_chunk_elems : LOSS_CHUNK_ELEMS;
    int64_t rows = elems / (V > 0 ? V : 1);
    if (rows >= 64) rows = rows / 64 * 64;
    if (rows < 1) rows = 1;
    return rows < N ? rows : N;
}

luna_status luna_seq2seq_loss_upload(luna_seq2seq_pass *s, const luna_batch *b) {
    const int pad = s->m->config.padding_idx;
    const int64_t N = (int64_t)b->B * b->tgt_len;
    /* the non-pad rows: idx [Npk] (their positions), inv [N] (position among them, or Npk),
     * tgt [Npk] (their targets) */
    int32_t *host = malloc((size_t)(3 * N + 1) * sizeof(int32_t));
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "model: out of host memory");
    int32_t *idx = host, *inv = host + N, *tgt = host + 2 * N;
    int64_t npk = 0;
    for (int64_t i = 0; i < N; i++)
        if (b->target[i] != pad) idx[npk++] = (int32_t)i;
    for (int64_t i = 0, k = 0; i < N; i++)
        inv[i] = k < npk && idx[k] == i ? (int32_t)k++ : (int32_t)npk;
    for (int64_t k = 0; k < npk; k++)
        tgt[k] = b->target[idx[k]];
    s->loss_rows = npk;
    s->packed = npk < N;
    const int64_t up = s->packed ? npk : 0; /* unpacked: the rows are the decoder's own */
    luna_status st = luna_seq2seq_upload_ids(s, &s->row_idx, idx, up, N);
    if (st == LUNA_OK) st = luna_seq2seq_upload_ids(s, &s->row_tgt, tgt, up, N);
    if (st == LUNA_OK && s->grads)
        st = luna_seq2seq_upload_ids(s, &s->row_inv, inv, s->packed ? N : 0, N);
    free(host);
    return st;
}

luna_status luna_seq2seq_loss(luna_seq2seq_pass *s) {
    luna_seq2seq *m = s->m;
    const luna_config *c = &m->config;
    luna_backend *be = m->be;
    const luna_ops *op = be->ops;
    const float *E = m->params->w.output_projection;
    const int d = s->d, V = s->V, pad = c->padding_idx;
    const float eps = (float)c->label_smoothing;
    const bool grads = s->grads;
    const int64_t N = (int64_t)s->dims.B * s->dims.n, npk = s->loss_rows;
    const luna_act *x = s->dec_out;
    const int32_t *tgt = s->tgt;
    luna_act *dx = grads ? s->gx_dec[0] : NULL;
    if (s->packed && npk > 0) {
        luna_act *x_pk;
        LUNA_TRY(luna_pass_alloc(&s->ps, &x_pk, npk * d, "non-pad decoder rows"));
        LUNA_TRY(op->gather_rows(be, x_pk, d, s->dec_out, d, s->row_idx, npk, d));
        if (grads) { /* dx_pk [npk + 1, d], the last row zero */
            LUNA_TRY(luna_pass_alloc(&s->ps, &dx, (npk + 1) * d, "non-pad rows' gradient"));
            LUNA_TRY(luna_mem_zero(be, luna_act_at(be, dx, npk * d), luna_act_bytes(be, d)));
        }
        x = x_pk;
        tgt = s->row_tgt;
    }

    const int64_t rows = loss_chunk_rows(m, npk, V);
    luna_act *logits;
    LUNA_TRY(luna_pass_alloc(&s->ps, &logits, (rows > 0 ? rows : 1) * V, "logits (one chunk)"));
    for (int64_t r0 = 0; r0 < npk; r0 += rows) {
        const int64_t nr = npk - r0 < rows ? npk - r0 : rows;
        const luna_act *xc = luna_act_at(be, x, r0 * d);
        LUNA_TRY(op->linear_forward(be, logits, xc, E, NULL, nr, d, V));
        if (!grads) {
            LUNA_TRY(op->cross_entropy_forward(be, s->loss + r0, s->nll + r0, s->lse + r0, logits,
                                               tgt + r0, nr, V, eps, pad));
            continue;
        }
        /* the loss and its gradient in one pass over the chunk's logits (in place) */
        LUNA_TRY(op->cross_entropy_forward_backward(be, s->loss + r0, s->nll + r0, s->lse + r0,
                                                    logits, logits, tgt + r0, nr, V, eps, pad,
                                                    1.0f));
        LUNA_TRY(op->linear_backward(be, luna_act_at(be, dx, r0 * d),
                                     m->params->g.output_projection, NULL, logits, xc, E, nr, d, V,
                                     false));
    }
    if (grads && s->packed) { /* back to the decoder's rows; pad rows get the zero row */
        if (npk == 0)
            LUNA_TRY(luna_mem_zero(be, s->gx_dec[0], luna_act_bytes(be, N * d)));
        else
            LUNA_TRY(op->gather_rows(be, s->gx_dec[0], d, dx, d, s->row_inv, N, d));
    }
    luna_arena_release(m->arena, s->logits_mark);
    return LUNA_OK;
}

luna_status luna_seq2seq_loss_read(luna_seq2seq_pass *s, double *loss_sum, double *nll_sum) {
    luna_seq2seq *m = s->m;
    const int64_t N = s->loss_rows;
    /* loss [0, N) and nll [cap, cap + N) of the one buffer, in one copy */
    const int64_t cap = s->loss_cap, span = cap + N;
    float *host = malloc((size_t)span * sizeof(float));
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "model: out of host memory");
    luna_status st = luna_mem_to_host(m->be, host, s->loss, (size_t)span * sizeof(float));
    if (st != LUNA_OK) {
        free(host);
        return st;
    }
    double a = 0, b = 0;
    for (int64_t i = 0; i < N; i++) {
        a += host[i];
        b += host[cap + i];
    }
    free(host);
    if (!isfinite(a) || !isfinite(b))
        return luna_error(LUNA_ERR_NUMERIC, "model: non-finite loss (%g, nll %g)", a, b);
    if (loss_sum) *loss_sum = a;
    if (nll_sum) *nll_sum = b;
    return LUNA_OK;
}
