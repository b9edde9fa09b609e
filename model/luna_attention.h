/* Bidirectional Luna attention (spec §2): LunaAttn(X, P, C) -> (Y_X, Y_P), used for encoder
 * self-attention (C = X) and decoder cross-attention (C = final encoder output).
 *
 *   pack:   Qp = pq_proj(P)·dh^-1/2, Kc = Vc = pc_proj(C) (untied: pk_proj, pv_proj)
 *           A_pack = softmax_m(Qp Kcᵀ) with context pads masked, attention dropout
 *           Y_P = concat_h(A_pack Vc)                          (no output projection)
 *   unpack: Q = q_proj(X)·dh^-1/2, K = V = c_proj(Y_P) (untied: k_proj, v_proj)
 *           A = softmax_L(Q Kᵀ) with the P mask, attention dropout
 *           Y_X = out_proj(concat_h(A V))
 *
 * Layout: activations are batch-major [B, len, d]; heads are split to [B, H, len, dh] for the
 * batched GEMMs. Masks are given as per-sentence valid counts (device int32 [B]): context
 * positions c < c_valid[b] are real (right padding); slots j < p_valid[b] are visible (NULL: all).
 */
#ifndef LUNA_LUNA_ATTENTION_H
#define LUNA_LUNA_ATTENTION_H

#include "model/config.h"
#include "model/pass.h"
#include "model/weights.h"

typedef struct {
    int B, n, m, L, d, H; /* batch, query length, context length, slots, model dim, heads */
    bool tied;
    uint32_t site; /* dropout sites site+0 (pack probabilities), site+1 (unpack probabilities) */
    /* inputs (owned by the caller, must live until backward) */
    const float *x;         /* [B, n, d] */
    const float *p;         /* [B, L, d] */
    const float *c;         /* [B, m, d] */
    const int32_t *c_valid; /* [B] */
    const int32_t *p_valid; /* [B] or NULL */
    /* saved activations (arena) */
    float *qp;       /* [B, H, L, dh] scaled pack queries */
    float *kc, *vc;  /* [B, H, m, dh] pack keys/values (vc == kc when tied) */
    float *a_pack;   /* [B, H, L, m] pack probabilities */
    float *a_pack_d; /* [B, H, L, m] after dropout (== a_pack without dropout) */
    float *yp;       /* [B, L, d] Y_P (output) */
    float *q;        /* [B, H, n, dh] scaled queries */
    float *kp, *vp;  /* [B, H, L, dh] unpack keys/values (vp == kp when tied) */
    float *a, *a_d;  /* [B, H, n, L] unpack probabilities, after dropout */
    float *o;        /* [B, n, d] heads merged, input of out_proj */
    float *y;        /* [B, n, d] Y_X (output) */
} luna_attn_act;

luna_status luna_attention_forward(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                   const float *x, const float *p, const float *c,
                                   const int32_t *c_valid, const int32_t *p_valid, int B, int n,
                                   int m, int L, int d, int H, bool tied, uint32_t site);

/* dy [B, n, d] (gradient of Y_X), dyp [B, L, d] (gradient of Y_P, NULL = 0). Parameter
 * gradients go into g (+=); input gradients are ADDED into dx [B, n, d], dp [B, L, d],
 * dc [B, m, d] (dc may equal dx for self-attention). Temporaries are released before return. */
luna_status luna_attention_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                                    const luna_attn_act *act, const float *dy, const float *dyp,
                                    float *dx, float *dp, float *dc);

/* Helpers shared by the attention modules. */
/* y [rows, out] = x Wᵀ + b, then y *= scale (scale 1: none). */
luna_status luna_linear_scaled(const luna_pass *ps, float *y, const float *x,
                               const luna_linear_w *w, int64_t rows, int in, int out, float scale);
/* Allocate [rows, out], apply the (scaled) linear and split heads into a new [B, H, len, dh]. */
luna_status luna_project_heads(const luna_pass *ps, float **heads, const float *x,
                               const luna_linear_w *w, int B, int len, int d, int H, float scale);
/* Backward of luna_project_heads: dheads [B, H, len, dh] -> merged, scaled, linear backward with
 * dx ADDED into dx [B, len, d]. */
luna_status luna_project_heads_backward(const luna_pass *ps, const float *dheads, const float *x,
                                        const luna_linear_w *w, luna_linear_w *g, float *dx, int B,
                                        int len, int d, int H, float scale);

/* Batched GEMM over G contiguous groups: C_g = alpha·op(A_g) op(B_g) + beta·C_g with
 * op(A_g) [M, K], op(B_g) [K, N], C_g [M, N], all row-major and packed. */
luna_status luna_bgemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, const float *B, float beta, float *C, int G);

#endif
