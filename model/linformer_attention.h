/* Linformer self-attention (Wang et al. 2020), the efficient-attention baseline of the Luna
 * paper's Table 2, as an encoder self-attention option of the transformer architecture
 * (config linformer_k > 0). Keys and values are projected along the length with learned
 * E, F [k, N] (N = max_source_positions, a fixed maximum):
 *   Q = q_proj(X)·dh^-1/2, K = k_proj(X), V = v_proj(X)            [B, H, m, dh]
 *   K' = E[:, :len_b] K_b[:len_b],  V' = F[:, :len_b] V_b[:len_b]   [B, H, k, dh]
 *   A = softmax_k(Q K'ᵀ), attention dropout;  Y = out_proj(concat_h(A V'))
 * Source pads (positions ≥ len_b) are left out of the length projection, so a sentence's result
 * does not depend on how far its batch is padded. Sharing (Linformer §4): headwise (E, F per
 * layer, shared by the heads), key-value (E = F per layer), layerwise (one E = F for all layers).
 * Memory and time are O(m·k) per head instead of O(m²). Composed of existing backend ops (GEMM,
 * softmax, dropout, linear, axpy, sum_broadcast): no new op. */
#ifndef LUNA_LINFORMER_ATTENTION_H
#define LUNA_LINFORMER_ATTENTION_H

#include "model/config.h"
#include "model/pass.h"
#include "model/weights.h"

typedef struct {
    int B, m, d, H, k, N;
    uint32_t site;          /* dropout site site+0 (probabilities) */
    const int32_t *x_valid; /* device [B] source lengths (copied to the host when needed) */
    const luna_act *x;      /* [B, m, d] */
    const float *E, *F;     /* [k, N] parameters (F == E when shared) */
    luna_act *ea, *fa;      /* [k, N] E, F as activations (fa == ea when shared) */
    luna_act *q;            /* [B, H, m, dh] scaled */
    luna_act *kh, *vh;      /* [B, H, m, dh] */
    luna_act *kp, *vp;      /* [B, H, k, dh] projected along the length */
    luna_act *a, *a_d;      /* [B, H, m, k] probabilities, after dropout */
    luna_act *o;            /* [B, m, d] */
    luna_act *y;            /* [B, m, d], out_proj(O) without its bias (layers.h) */
} luna_linformer_act;

/* x_valid: device [B] source lengths; fails naming the limit when one exceeds N. */
luna_status luna_linformer_forward(const luna_pass *ps, const luna_attn_w *w,
                                   luna_linformer_act *act, const luna_act *x,
                                   const int32_t *x_valid, int B, int m, int d, int H, int k, int N,
                                   uint32_t site);
/* Gradients ADDED into dx [B, m, d] and into g->compress_k / g->compress_v. */
luna_status luna_linformer_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                                    const luna_linformer_act *act, const luna_act *dy,
                                    luna_act *dx);
#endif
