/* Multi-head softmax attention (the transformer_base baseline, fairseq's MultiheadAttention):
 *   Q = q_proj(X)·dh^-1/2, K = k_proj(C), V = v_proj(C)
 *   A = softmax_m(Q Kᵀ) with key padding (c_valid) and, for decoder self-attention, the causal
 *   mask; attention dropout;  Y = out_proj(concat_h(A V)).
 * Memory is quadratic in length (A is [B, H, n, m]) — the point of comparison for Luna. */
#ifndef LUNA_SOFTMAX_ATTENTION_H
#define LUNA_SOFTMAX_ATTENTION_H

#include "model/config.h"
#include "model/pass.h"
#include "model/weights.h"

typedef struct {
    int B, n, m, d, H;
    bool causal;
    uint32_t site;          /* dropout site site+0 (probabilities) */
    const luna_act *x;      /* [B, n, d] */
    const luna_act *c;      /* [B, m, d] */
    const int32_t *c_valid; /* [B] keys c < c_valid[b] are real */
    luna_act *q;            /* [B, n, d] (unscaled: dh^-1/2 is the score GEMM's alpha) */
    luna_act *k, *v;        /* [B, m, d]; head h: columns h·dh.. (luna_heads_in_rows) */
    luna_act *a, *a_d;      /* [B, H, n, m] probabilities, after dropout */
    luna_act *o;            /* [B, n, d] */
    luna_act *y;            /* [B, n, d], out_proj(O) without its bias (layers.h) */
} luna_mha_act;

/* causal requires n == m (self-attention). */
luna_status luna_mha_forward(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                             const luna_act *x, const luna_act *c, const int32_t *c_valid, int B,
                             int n, int m, int d, int H, bool causal, uint32_t site);
/* The two halves of luna_mha_forward: keys/values K, V [B, m, d] from the context c (and
 * the key mask), then the attention of queries x [B, n, d] to act->k, act->v. A decoder step
 * attends the beams of a sentence (n = beam) to the source keys computed once. */
luna_status luna_mha_keys(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                          const luna_act *c, const int32_t *c_valid, int B, int m, int d, int H,
                          uint32_t site);
luna_status luna_mha_attend(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                            const luna_act *x, int n, bool causal);
/* Gradients ADDED into dx [B, n, d] and dc [B, m, d] (may be the same buffer). */
luna_status luna_mha_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                              const luna_mha_act *act, const luna_act *dy, luna_act *dx,
                              luna_act *dc);

#endif
