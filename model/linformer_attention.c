#include "model/linformer_attention.h"

#include <math.h>
#include <stdlib.h>

#include "model/luna_attention.h"

/* Host copy of the source lengths [B], checked against the fixed maximum N. */
static luna_status host_lengths(luna_backend *be, const int32_t *x_valid, int B, int m, int N,
                                int32_t **out) {
    int32_t *len = malloc(sizeof(int32_t) * (size_t)B);
    if (!len) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "linformer: out of host memory");
    luna_status st = luna_mem_to_host(be, len, x_valid, sizeof(int32_t) * (size_t)B);
    for (int b = 0; st == LUNA_OK && b < B; b++)
        if (len[b] < 1 || len[b] > m || len[b] > N)
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                            "linformer: sentence %d: a source of %d tokens exceeds the Linformer "
                            "maximum of %d (max_source_positions: E and F have a fixed length)",
                            b, len[b], N);
    if (st != LUNA_OK) {
        free(len);
        return st;
    }
    *out = len;
    return LUNA_OK;
}

/* A [k, N] parameter as an activation (the GEMMs take activations on every backend). */
static luna_status as_act(const luna_pass *ps, luna_act **out, const float *P, int64_t n) {
    LUNA_TRY(luna_pass_alloc(ps, out, n, "linformer projection"));
    LUNA_TRY(luna_mem_zero(ps->be, *out, luna_act_bytes(ps->be, n)));
    return ps->be->ops->axpy(ps->be, *out, 1.0f, P, n);
}

/* out_b [H, k, dh] = P[:, :len_b] · in_b[:len_b] for every sentence (P shared by the heads). */
static luna_status project_length(luna_backend *be, const luna_act *P, const luna_act *in,
                                  luna_act *out, const int32_t *len, int B, int H, int m, int k,
                                  int N, int dh) {
    for (int b = 0; b < B; b++)
        LUNA_TRY(be->ops->gemm(be, false, false, k, dh, len[b], 1.0f, P, N, 0,
                               luna_act_at(be, in, (int64_t)b * H * m * dh), dh, (int64_t)m * dh,
                               0.0f, luna_act_at(be, out, (int64_t)b * H * k * dh), dh,
                               (int64_t)k * dh, H));
    return LUNA_OK;
}

luna_status luna_linformer_forward(const luna_pass *ps, const luna_attn_w *w,
                                   luna_linformer_act *act, const luna_act *x,
                                   const int32_t *x_valid, int B, int m, int d, int H, int k, int N,
                                   uint32_t site) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int dh = d / H, G = B * H;
    *act = (luna_linformer_act){.B = B,
                                .m = m,
                                .d = d,
                                .H = H,
                                .k = k,
                                .N = N,
                                .site = site,
                                .x_valid = x_valid,
                                .x = x,
                                .E = w->compress_k,
                                .F = w->compress_v ? w->compress_v : w->compress_k};
    int32_t *len;
    LUNA_TRY(host_lengths(be, x_valid, B, m, N, &len));
    luna_status st =
        luna_project_heads(ps, &act->q, x, &w->q_proj, B, m, d, H, 1.0f / sqrtf((float)dh));
    if (st == LUNA_OK) st = luna_project_heads(ps, &act->kh, x, &w->k_proj, B, m, d, H, 1.0f);
    if (st == LUNA_OK) st = luna_project_heads(ps, &act->vh, x, &w->v_proj, B, m, d, H, 1.0f);
    if (st == LUNA_OK) st = as_act(ps, &act->ea, act->E, (int64_t)k * N);
    act->fa = act->ea;
    if (st == LUNA_OK && act->F != act->E) st = as_act(ps, &act->fa, act->F, (int64_t)k * N);
    const int64_t kd = (int64_t)G * k * dh;
    if (st == LUNA_OK) st = luna_pass_alloc(ps, &act->kp, kd, "linformer keys");
    if (st == LUNA_OK) st = luna_pass_alloc(ps, &act->vp, kd, "linformer values");
    if (st == LUNA_OK) st = project_length(be, act->ea, act->kh, act->kp, len, B, H, m, k, N, dh);
    if (st == LUNA_OK) st = project_length(be, act->fa, act->vh, act->vp, len, B, H, m, k, N, dh);
    free(len);
    LUNA_TRY(st);
    /* A = softmax over the k projected positions (all real: no mask) [B, H, m, k] */
    const int64_t mk = (int64_t)G * m * k;
    LUNA_TRY(luna_pass_alloc(ps, &act->a, mk, "linformer probabilities"));
    LUNA_TRY(luna_bgemm(be, false, true, m, k, dh, 1.0f, act->q, act->kp, 0.0f, act->a, G));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a, &act->a_d, act->a, (int64_t)G * m, k, NULL, 1, 0,
                                       ps->attention_dropout, site, "linformer dropout"));
    const int64_t md = (int64_t)B * m * d;
    LUNA_TRY(luna_pass_alloc(ps, &act->o, md, "attention output"));
    {
        luna_arena_mark mark = luna_arena_get_mark(ps->arena);
        luna_act *oh; /* [B, H, m, dh] */
        LUNA_TRY(luna_pass_alloc(ps, &oh, md, "attention output heads"));
        st = luna_bgemm(be, false, false, m, dh, k, 1.0f, act->a_d, act->vp, 0.0f, oh, G);
        if (st == LUNA_OK) st = op->merge_heads(be, act->o, oh, B, m, H, dh);
        luna_arena_release(ps->arena, mark);
        LUNA_TRY(st);
    }
    LUNA_TRY(luna_pass_alloc(ps, &act->y, md, "attention result"));
    return op->linear_forward(be, act->y, act->o, w->out_proj.weight, NULL, (int64_t)B * m, d, d);
}

/* Backward of project_length for one of K', V': din_b[:len_b] = P[:, :len_b]ᵀ dout_b (rows past
 * len_b zero) and dP[:, :len_b] += dout_b in_b[:len_b]ᵀ, one head at a time (the heads share dP:
 * one GEMM per head, so no batched GEMM writes the same output twice). */
static luna_status project_length_backward(luna_backend *be, const luna_act *P, luna_act *dP,
                                           const luna_act *in, const luna_act *dout, luna_act *din,
                                           const int32_t *len, int B, int H, int m, int k, int N,
                                           int dh) {
    LUNA_TRY(luna_mem_zero(be, din, luna_act_bytes(be, (int64_t)B * H * m * dh)));
    for (int b = 0; b < B; b++) {
        const int64_t in_off = (int64_t)b * H * m * dh, out_off = (int64_t)b * H * k * dh;
        LUNA_TRY(be->ops->gemm(be, true, false, len[b], dh, k, 1.0f, P, N, 0,
                               luna_act_at(be, dout, out_off), dh, (int64_t)k * dh, 0.0f,
                               luna_act_at(be, din, in_off), dh, (int64_t)m * dh, H));
        for (int h = 0; h < H; h++)
            LUNA_TRY(be->ops->gemm(be, false, true, k, len[b], dh, 1.0f,
                                   luna_act_at(be, dout, out_off + (int64_t)h * k * dh), dh, 0,
                                   luna_act_at(be, in, in_off + (int64_t)h * m * dh), dh, 0, 1.0f,
                                   dP, N, 0, 1));
    }
    return LUNA_OK;
}

static luna_status backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                            const luna_linformer_act *act, const luna_act *dy, luna_act *dx) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, m = act->m, d = act->d, H = act->H, k = act->k, N = act->N;
    const int dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    const int64_t md = (int64_t)B * m * d, mk = (int64_t)G * m * k, kd = (int64_t)G * k * dh;
    const bool shared = act->fa == act->ea;
    luna_act *d_o, *doh, *da, *dkp, *dvp, *dkh, *dvh, *dea, *dfa;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, md, "attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &doh, md, "attention gradient heads"));
    LUNA_TRY(luna_pass_alloc(ps, &da, mk, "linformer probability gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dkp, kd, "linformer key gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dvp, kd, "linformer value gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dkh, md, "key gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dvh, md, "value gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dea, (int64_t)k * N, "linformer E gradient"));
    LUNA_TRY(luna_mem_zero(be, dea, luna_act_bytes(be, (int64_t)k * N)));
    dfa = dea;
    if (!shared) {
        LUNA_TRY(luna_pass_alloc(ps, &dfa, (int64_t)k * N, "linformer F gradient"));
        LUNA_TRY(luna_mem_zero(be, dfa, luna_act_bytes(be, (int64_t)k * N)));
    }
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * m, d, d, false));
    LUNA_TRY(op->split_heads(be, doh, d_o, B, m, H, dh));
    /* O = A_d V': dA_d = dO V'ᵀ, dV' = A_dᵀ dO */
    LUNA_TRY(luna_bgemm(be, false, true, m, k, dh, 1.0f, doh, act->vp, 0.0f, da, G));
    LUNA_TRY(luna_bgemm(be, true, false, k, dh, m, 1.0f, act->a_d, doh, 0.0f, dvp, G));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, da, da, act->a, (int64_t)G * m, k,
                                                ps->attention_dropout, act->site));
    /* S = Q K'ᵀ: dQ = dS K' (into doh), dK' = dSᵀ Q */
    LUNA_TRY(luna_bgemm(be, false, false, m, dh, k, 1.0f, da, act->kp, 0.0f, doh, G));
    LUNA_TRY(luna_bgemm(be, true, false, k, dh, m, 1.0f, da, act->q, 0.0f, dkp, G));
    int32_t *len;
    LUNA_TRY(host_lengths(be, act->x_valid, B, m, N, &len));
    luna_status st =
        project_length_backward(be, act->ea, dea, act->kh, dkp, dkh, len, B, H, m, k, N, dh);
    if (st == LUNA_OK)
        st = project_length_backward(be, act->fa, dfa, act->vh, dvp, dvh, len, B, H, m, k, N, dh);
    free(len);
    LUNA_TRY(st);
    LUNA_TRY(op->sum_broadcast(be, g->compress_k, dea, 1, k, N));
    if (!shared) LUNA_TRY(op->sum_broadcast(be, g->compress_v, dfa, 1, k, N));
    LUNA_TRY(luna_project_heads_backward(ps, doh, act->x, &w->q_proj, &g->q_proj, dx, B, m, d, H,
                                         scale));
    LUNA_TRY(
        luna_project_heads_backward(ps, dkh, act->x, &w->k_proj, &g->k_proj, dx, B, m, d, H, 1.0f));
    return luna_project_heads_backward(ps, dvh, act->x, &w->v_proj, &g->v_proj, dx, B, m, d, H,
                                       1.0f);
}

luna_status luna_linformer_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                                    const luna_linformer_act *act, const luna_act *dy,
                                    luna_act *dx) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = backward(ps, w, g, act, dy, dx);
    luna_arena_release(ps->arena, mark);
    return st;
}
