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
    const float *x;         /* [B, n, d] */
    const float *c;         /* [B, m, d] */
    const int32_t *c_valid; /* [B] keys c < c_valid[b] are real */
    float *q;               /* [B, H, n, dh] scaled */
    float *k, *v;           /* [B, H, m, dh] */
    float *a, *a_d;         /* [B, H, n, m] probabilities, after dropout */
    float *o;               /* [B, n, d] */
    float *y;               /* [B, n, d] */
} luna_mha_act;

/* causal requires n == m (self-attention). */
luna_status luna_mha_forward(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                             const float *x, const float *c, const int32_t *c_valid, int B, int n,
                             int m, int d, int H, bool causal, uint32_t site);
/* Gradients ADDED into dx [B, n, d] and dc [B, m, d] (may be the same buffer). */
luna_status luna_mha_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                              const luna_mha_act *act, const float *dy, float *dx, float *dc);

#endif
