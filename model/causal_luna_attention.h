/* Causal Luna attention (spec §3), the decoder's self-attention: CausalLuna(X, P) -> Y.
 * Per head, t = 1-based target position:
 *   P̃ = pq_proj(P)·dh^-1/2                              [L, dh]
 *   Φ = φ(pc_proj(X) P̃ᵀ), then attention dropout          [n, L]   (no softmax, no mask)
 *   Q = q_proj(X)·dh^-1/2, K = V = c_proj(X) (untied: k_proj, v_proj)
 *   S_t = (1/t) Σ_{s≤t} (Q_t·K_s) Φ_s                      [n, L]   causal_contraction(Q, K, Φ)
 *   A = softmax_L(S) with the P mask, attention dropout
 *   O_t = (1/t) Σ_{s≤t} (A_t·Φ_s) V_s                      [n, dh]  causal_contraction(A, Φ, V)
 *   Y = out_proj(concat_h O)
 * Training computes all t at once with the causal_contraction op (a scan: memory linear in n).
 * Decoding uses luna_causal_attention_step with a state whose size does not grow with t.
 */
#ifndef LUNA_CAUSAL_LUNA_ATTENTION_H
#define LUNA_CAUSAL_LUNA_ATTENTION_H

#include "model/config.h"
#include "model/config.h"
#include "model/pass.h"
#include "model/weights.h"

typedef struct {
    int B, n, L, d, H;
    bool tied;
    luna_causal_activation activation;
    uint32_t site;          /* dropout sites site+2 (Φ), site+3 (A) */
    const luna_act *x;      /* [B, n, d] */
    const luna_act *p;      /* [B, L, d] */
    const int32_t *p_valid; /* [B] or NULL */
    luna_act *pt;           /* [B, L, d] pq_proj(P) (P̃ = dh^-1/2 · its heads) */
    luna_act *pc;           /* [B, n, d] pc_proj(X) */
    luna_act *z;            /* [B, H, n, L] pre-activation pc·P̃ᵀ */
    luna_act *phi_d;        /* [B, H, n, L] Φ after dropout */
    luna_act *q;            /* [B, n, d] (unscaled: dh^-1/2 is the contraction's alpha) */
    luna_act *k, *v;        /* [B, n, d] (v == k when tied); heads read in place */
    luna_act *a, *a_d;      /* [B, H, n, L] probabilities, after dropout */
    luna_act *o;            /* [B, n, d] the heads' outputs */
    luna_act *y;            /* [B, n, d] output, out_proj(O) without its bias (layers.h) */
} luna_causal_act;

luna_status luna_causal_attention_forward(const luna_pass *ps, const luna_attn_w *w,
                                          luna_causal_act *act, const luna_act *x,
                                          const luna_act *p, const int32_t *p_valid, int B, int n,
                                          int L, int d, int H, bool tied,
                                          luna_causal_activation activation, uint32_t site);

/* dy [B, n, d]; gradients ADDED into dx [B, n, d] and dp [B, L, d]; parameters into g (+=). */
luna_status luna_causal_attention_backward(const luna_pass *ps, const luna_attn_w *w,
                                           luna_attn_w *g, const luna_causal_act *act,
                                           const luna_act *dy, luna_act *dx, luna_act *dp);

/* ---- incremental decoding -------------------------------------------------------------------- */

typedef struct {
    int B, L, d, H;
    int t; /* steps taken */
    /* rows at different positions (in-flight batching): device [B] steps taken by each row
     * before this step, or NULL (all `t`) */
    const int32_t *row_t;
    bool tied;
    luna_causal_activation activation;
    const int32_t *p_valid; /* [B] or NULL (device, owned by the caller) */
    luna_act *pt;           /* [B, H, L, dh]  P̃ */
    luna_act *ksum;         /* [B, H, dh, L]  Σ_s K_s Φ_sᵀ */
    luna_act *vsum;         /* [B, H, L, dh]  Σ_s Φ_sᵀ V_s */
} luna_causal_state;

/* Bytes of state per sentence: (2·L·d + L·d) floats — independent of t. */
size_t luna_causal_state_bytes(const luna_backend *be, int L, int d);

/* Allocate the state from `arena` (the caller releases it) and compute P̃ from P [B, L, d]. */
luna_status luna_causal_state_init(luna_backend *be, luna_arena *arena, const luna_attn_w *w,
                                   luna_causal_state *st, const luna_act *p, const int32_t *p_valid,
                                   int B, int L, int d, int H, bool tied,
                                   luna_causal_activation activation);

/* One decoding step for every sentence: x [B, d] (this position's layer input) -> y [B, d]
 * (the attention output, after out_proj without its bias, like the training form's y: the layer's
 * luna_resnorm_forward adds it). Temporaries come from `scratch` and are released.
 * No dropout (inference). */
luna_status luna_causal_attention_step(luna_backend *be, luna_arena *scratch, const luna_attn_w *w,
                                       luna_causal_state *st, const luna_act *x, luna_act *y);

#endif
