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
 * Layout: activations are batch-major [B, len, d]; the products read and write the heads where
 * they are (head h of sentence b: the dh columns from h·dh, row stride d; gemm_grid), so no head
 * is copied. The scale dh^-1/2 goes into the score GEMM's alpha (and its gradients'), not into
 * a pass over Q: for dh = 64 (1/8, a power of two) the same bits as scaling Q first. Masks are
 * given as per-sentence valid counts (device int32 [B]): context positions c < c_valid[b] are real
 * (right padding); slots j < p_valid[b] are visible (NULL: all).
 */
#ifndef LUNA_LUNA_ATTENTION_H
#define LUNA_LUNA_ATTENTION_H

#include "model/config.h"
#include "model/pass.h"
#include "model/weights.h"

typedef struct {
    int B, n, m, L, d, H; /* batch, query length, context length, slots, model dim, heads */
    bool tied;
    bool self;     /* self-attention (C = X): q and kc (vc) made by one call, side by side */
    uint32_t site; /* dropout sites site+0 (pack probabilities), site+1 (unpack probabilities) */
    /* inputs (owned by the caller, must live until backward) */
    const luna_act *x;      /* [B, n, d] */
    const luna_act *p;      /* [B, L, d] */
    const luna_act *c;      /* [B, m, d] */
    const int32_t *c_valid; /* [B] */
    const int32_t *p_valid; /* [B] or NULL */
    /* saved activations (arena) */
    luna_act *qp;       /* [B, L, d] pack queries (unscaled) */
    luna_act *kc, *vc;  /* [B, m, d] pack keys/values (vc == kc when tied) */
    luna_act *a_pack;   /* [B, H, L, m] pack probabilities */
    luna_act *a_pack_d; /* [B, H, L, m] after dropout (== a_pack without dropout) */
    luna_act *yp;       /* [B, L, d] Y_P (output) */
    luna_act *q;        /* [B, n, d] queries (unscaled) */
    luna_act *kp, *vp;  /* [B, L, d] unpack keys/values (vp == kp when tied) */
    luna_act *a, *a_d;  /* [B, H, n, L] unpack probabilities, after dropout */
    luna_act *o;        /* [B, n, d] the heads' outputs, input of out_proj */
    luna_act *y;        /* [B, n, d] Y_X (output), out_proj(O) without its bias (layers.h) */
} luna_attn_act;

luna_status luna_attention_forward(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                   const luna_act *x, const luna_act *p, const luna_act *c,
                                   const int32_t *c_valid, const int32_t *p_valid, int B, int n,
                                   int m, int L, int d, int H, bool tied, uint32_t site);

/* The two halves of luna_attention_forward (which is pack, then unpack):
 * pack fills everything that depends on P and the context only (qp, kc, vc, a_pack, a_pack_d,
 * yp and the unpack keys/values kp, vp); decoding runs it once per sentence (spec §4: the
 * decoder's P does not depend on the target). unpack attends queries x [B, n, d] to act->kp/vp
 * (q, a, a_d, o, y); a decoder step uses it with the beams of a sentence as its n queries. */
luna_status luna_attention_pack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                const luna_act *p, const luna_act *c, const int32_t *c_valid, int B,
                                int m, int L, int d, int H, bool tied, uint32_t site);
luna_status luna_attention_unpack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                  const luna_act *x, const int32_t *p_valid, int n);

/* dy [B, n, d] (gradient of Y_X), dyp [B, L, d] (gradient of Y_P, NULL = 0). Parameter
 * gradients go into g (+=); input gradients are ADDED into dx [B, n, d], dp [B, L, d],
 * dc [B, m, d] (dc may equal dx for self-attention). Temporaries are released before return. */
luna_status luna_attention_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                                    const luna_attn_act *act, const luna_act *dy,
                                    const luna_act *dyp, luna_act *dx, luna_act *dp, luna_act *dc);

/* Helpers shared by the attention modules. */
/* y [rows, out] = x Wᵀ + b, then y *= scale (scale 1: none). */
luna_status luna_linear_scaled(const luna_pass *ps, luna_act *y, const luna_act *x,
                               const luna_linear_w *w, int64_t rows, int in, int out, float scale);
/* Allocate [rows, out], apply the (scaled) linear and split heads into a new [B, H, len, dh]. */
luna_status luna_project_heads(const luna_pass *ps, luna_act **heads, const luna_act *x,
                               const luna_linear_w *w, int B, int len, int d, int H, float scale);
/* Backward of luna_project_heads: dheads [B, H, len, dh] -> merged, scaled, linear backward with
 * dx ADDED into dx [B, len, d]. */
luna_status luna_project_heads_backward(const luna_pass *ps, const luna_act *dheads,
                                        const luna_act *x, const luna_linear_w *w, luna_linear_w *g,
                                        luna_act *dx, int B, int len, int d, int H, float scale);

/* Allocate y [rows, out] = x Wᵀ + b. */
luna_status luna_project(const luna_pass *ps, luna_act **y, const luna_act *x,
                         const luna_linear_w *w, int64_t rows, int in, int out);

/* Projections of one input: y_i [rows, out] = x W_iᵀ + b_i for the `count` maps ws[i], into one
 * allocation [count, rows, out] (*y; y_i = luna_act_at(y, i·rows·out)). One linear_forward_multi
 * when the weights (and biases) sit at one stride, as the parameter table lays out a module's
 * projections (model/param_table.c); else one linear_forward each. */
luna_status luna_project_multi(const luna_pass *ps, luna_act **y, const luna_act *x,
                               const luna_linear_w *const *ws, int count, int64_t rows, int in,
                               int out);
/* Its backward for dy [count, rows, out]: dW_i, db_i += theirs (gs[i]), dx += Σ_i dy_i W_i in
 * order i = 0, 1, ... (dx overwritten first unless accumulate_dx). */
luna_status luna_project_multi_backward(const luna_pass *ps, const luna_act *dy, const luna_act *x,
                                        const luna_linear_w *const *ws, luna_linear_w *const *gs,
                                        luna_act *dx, int count, int64_t rows, int in, int out,
                                        bool accumulate_dx);

/* Where the B·H per-head matrices of an operand lie (gemm_grid): row stride and the strides
 * between sentences (outer) and heads (inner). */
typedef struct {
    int ld;
    luna_grid_stride s;
} luna_heads_layout;
/* The heads of a [B, len, H·dh] activation: head (b, h) at b·len·d + h·dh, row stride d. */
static inline luna_heads_layout luna_heads_in_rows(int len, int d, int dh) {
    return (luna_heads_layout){d, {(int64_t)len * d, dh}};
}
/* Packed [B, H, rows, cols] (attention probabilities). */
static inline luna_heads_layout luna_heads_packed(int rows, int cols, int H) {
    return (luna_heads_layout){cols, {(int64_t)H * rows * cols, (int64_t)rows * cols}};
}
/* For each sentence b < B and head h < H: C_bh = alpha·op(A_bh)·op(B_bh) + beta·C_bh. */
luna_status luna_heads_gemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                            const luna_act *A, luna_heads_layout la, const luna_act *Bm,
                            luna_heads_layout lb, float beta, luna_act *C, luna_heads_layout lc,
                            int B, int H);

/* The attention op's shape for heads of [B, len, H·dh] activations: queries and outputs n rows,
 * keys and values m rows (luna_heads_in_rows), scale dh^-1/2. */
luna_attention_shape luna_attention_shape_in_rows(int B, int H, int n, int m, int d,
                                                  const int32_t *valid_cols, bool causal);
/* attention_forward with the pass's attention dropout at `site`: allocates *a [B, H, n, m] and,
 * when the pass drops, *a_d (else *a_d = *a); o written. */
luna_status luna_attention_core(const luna_pass *ps, const luna_attention_shape *s, luna_act *o,
                                luna_act **a, luna_act **a_d, const luna_act *q, const luna_act *k,
                                const luna_act *v, uint32_t site, const char *what);
/* Its backward (attention_backward; the scratch for dS from the pass's arena, not released). */
luna_status luna_attention_core_backward(const luna_pass *ps, const luna_attention_shape *s,
                                         luna_act *dq, luna_act *dk, luna_act *dv,
                                         const luna_act *d_o, const luna_act *q, const luna_act *k,
                                         const luna_act *v, const luna_act *a, const luna_act *a_d,
                                         uint32_t site);

/* Batched GEMM over G contiguous groups: C_g = alpha·op(A_g) op(B_g) + beta·C_g with
 * op(A_g) [M, K], op(B_g) [K, N], C_g [M, N], all row-major and packed. */
luna_status luna_bgemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                       const luna_act *A, const luna_act *B, float beta, luna_act *C, int G);

#endif
