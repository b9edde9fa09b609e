/* The counting layer of op_profile.h: one wrapper per op of struct luna_ops. Each wrapper states
 * the op's cost from its arguments (see op_profile.h for what the four quantities mean) and
 * forwards the call unchanged to the table it wraps. Elementwise FLOP counts are approximations
 * (a few per element); those ops are memory-bound, so their bytes decide a roofline's time. */
#include "model/profile/op_profile.h"

#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#include "core/beam_select.h"
#include "core/tensor_table.h"

struct luna_op_profile {
    luna_ops table;        /* the counting table be->ops points at */
    const luna_ops *inner; /* the wrapped table */
    luna_backend *be;
    bool timing;
    int depth; /* > 0 inside an op: an op calling another through be->ops is counted once */
    luna_op_counter counters[LUNA_OP_COUNT];
};

/* The op signatures carry only the backend, whose struct has no slot for us: one attached
 * profile per process (benchmarks profile one backend). */
static luna_op_profile *g_active;

#define OP(name) ((int)(offsetof(luna_ops, name) / sizeof(luna_status(*)(void))))
#define D(x) ((double)(x))
#define F32 4.0 /* bytes of an fp32 or int32 element */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static luna_status begin(luna_backend *be, double *t0) {
    luna_op_profile *p = g_active;
    *t0 = 0;
    if (p->depth++ == 0 && p->timing) {
        /* Queued work before this op must not be charged to it. */
        luna_status st = luna_backend_synchronize(be);
        if (st != LUNA_OK) {
            p->depth--;
            return st;
        }
        *t0 = now();
    }
    return LUNA_OK;
}

static luna_status end(luna_backend *be, int op, const luna_op_counter *c, double t0,
                       luna_status st) {
    luna_op_profile *p = g_active;
    if (--p->depth > 0) return st;
    luna_op_counter *k = &p->counters[op];
    if (p->timing && st == LUNA_OK) {
        st = luna_backend_synchronize(be);
        k->seconds += now() - t0;
    }
    k->calls += 1;
    k->mm_flops += c->mm_flops;
    k->flops += c->flops;
    k->act_elems += c->act_elems;
    k->bytes += c->bytes;
    return st;
}

/* Declares the cost `c` of op `name`, then forwards the call (used as a function's body tail). */
#define COST(...) const luna_op_counter c = {__VA_ARGS__}
#define FORWARD(name, ...)                                                                         \
    do {                                                                                           \
        double t0_;                                                                                \
        luna_status s_ = begin(be, &t0_);                                                          \
        if (s_ != LUNA_OK) return s_;                                                              \
        s_ = g_active->inner->name(be, __VA_ARGS__);                                               \
        return end(be, OP(name), &c, t0_, s_);                                                     \
    } while (0)

/* ---- GEMM and linear: the tensor-core FLOPs ----------------------------------------------------
 */
static luna_status w_gemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                          const luna_act *A, int lda, int64_t sa, const luna_act *B, int ldb,
                          int64_t sb, float beta, luna_act *C, int ldc, int64_t sc, int batch) {
    /* C is read too when beta != 0. */
    COST(.mm_flops = 2 * D(M) * N * K * batch,
         .act_elems = D(batch) * (D(M) * K + D(K) * N + D(M) * N * (beta != 0 ? 2 : 1)));
    FORWARD(gemm, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}
static luna_status w_gemm_grid(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                               const luna_act *A, int lda, luna_grid_stride sa, const luna_act *B,
                               int ldb, luna_grid_stride sb, float beta, luna_act *C, int ldc,
                               luna_grid_stride sc, int outer, int inner) {
    /* As gemm: each operand once, wherever its matrices lie. A device reading the matrices'
     * addresses from arrays (cuBLASLt's pointer-array batches) reads 3 pointers a product too. */
    const double batch = D(outer) * inner;
    COST(.mm_flops = 2 * D(M) * N * K * batch,
         .act_elems = batch * (D(M) * K + D(K) * N + D(M) * N * (beta != 0 ? 2 : 1)),
         .bytes = inner > 1 ? 3 * 8 * batch : 0);
    FORWARD(gemm_grid, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, outer,
            inner);
}
static luna_status w_linear_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                    const float *W, const float *b, int64_t rows, int in, int out) {
    COST(.mm_flops = 2 * D(rows) * in * out, .flops = b ? D(rows) * out : 0,
         .act_elems = D(rows) * in + D(rows) * out, .bytes = F32 * (D(in) * out + (b ? out : 0)));
    FORWARD(linear_forward, y, x, W, b, rows, in, out);
}
static luna_status w_linear_relu_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                         const float *W, const float *b, int64_t rows, int in,
                                         int out) {
    COST(.mm_flops = 2 * D(rows) * in * out, .flops = 2 * D(rows) * out,
         .act_elems = D(rows) * in + D(rows) * out, .bytes = F32 * (D(in) * out + (b ? out : 0)));
    FORWARD(linear_relu_forward, y, x, W, b, rows, in, out);
}
static luna_status w_linear_backward(luna_backend *be, luna_act *dx, float *dW, float *db,
                                     const luna_act *dy, const luna_act *x, const float *W,
                                     int64_t rows, int in, int out, bool acc) {
    /* dW += dyᵀx always (reads dy, x; dW read and written); dx = dy W when asked (reads W). */
    COST(.mm_flops = 2 * D(rows) * in * out * (dx ? 2 : 1), .flops = db ? D(rows) * out : 0,
         .act_elems = D(rows) * out + D(rows) * in + (dx ? D(rows) * in * (acc ? 2 : 1) : 0),
         .bytes = F32 * (2 * D(in) * out + (dx ? D(in) * out : 0) + (db ? 2 * D(out) : 0)));
    FORWARD(linear_backward, dx, dW, db, dy, x, W, rows, in, out, acc);
}
static luna_status w_linear_forward_multi(luna_backend *be, luna_act *y, const luna_act *x,
                                          const float *W, const float *b, int64_t stride, int count,
                                          int64_t rows, int in, int out) {
    COST(.mm_flops = 2 * D(rows) * in * out * count, .flops = b ? D(rows) * out * count : 0,
         .act_elems = D(rows) * in + D(rows) * out * count,
         .bytes = F32 * (D(in) * out + (b ? out : 0)) * count);
    FORWARD(linear_forward_multi, y, x, W, b, stride, count, rows, in, out);
}
static luna_status w_linear_backward_multi(luna_backend *be, luna_act *dx, float *dW, float *db,
                                           const luna_act *dy, const luna_act *x, const float *W,
                                           int64_t stride, int count, int64_t rows, int in, int out,
                                           bool acc) {
    /* count linear_backward calls; dx read and written by each after the first */
    COST(.mm_flops = 2 * D(rows) * in * out * (dx ? 2 : 1) * count,
         .flops = db ? D(rows) * out * count : 0,
         .act_elems = D(rows) * out * count + D(rows) * in * count +
                      (dx ? D(rows) * in * (2 * D(count) - (acc ? 0 : 1)) : 0),
         .bytes = F32 * (2 * D(in) * out + (dx ? D(in) * out : 0) + (db ? 2 * D(out) : 0)) * count);
    FORWARD(linear_backward_multi, dx, dW, db, dy, x, W, stride, count, rows, in, out, acc);
}
/* ---- embeddings and positions ------------------------------------------------------------------
 */
static luna_status w_embedding_forward(luna_backend *be, luna_act *out, const float *table,
                                       const int32_t *tokens, int64_t n, int V, int d, float scale,
                                       int pad) {
    /* Reads the n gathered rows of the table, not all of it. */
    COST(.flops = D(n) * d, .act_elems = D(n) * d, .bytes = F32 * (D(n) + D(n) * d));
    FORWARD(embedding_forward, out, table, tokens, n, V, d, scale, pad);
}
static luna_status w_embedding_backward(luna_backend *be, float *dtable, const luna_act *dout,
                                        const int32_t *tokens, int64_t n, int V, int d, float scale,
                                        int pad) {
    COST(.flops = 2 * D(n) * d, .act_elems = D(n) * d, .bytes = F32 * (D(n) + 2 * D(n) * d));
    FORWARD(embedding_backward, dtable, dout, tokens, n, V, d, scale, pad);
}
static luna_status w_sinusoidal_table(luna_backend *be, luna_act *out, int first, int npos, int d) {
    COST(.flops = 4 * D(npos) * d, .act_elems = D(npos) * d);
    FORWARD(sinusoidal_table, out, first, npos, d);
}
static luna_status w_positions_add(luna_backend *be, luna_act *x, const int32_t *tokens, int B,
                                   int n, int d, int pad) {
    COST(.flops = 5 * D(B) * n * d, .act_elems = 2 * D(B) * n * d, .bytes = F32 * D(B) * n);
    FORWARD(positions_add, x, tokens, B, n, d, pad);
}

/* ---- softmax, dropout, activations --------------------------------------------------------------
 */
static luna_status w_softmax_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t rows,
                                     int cols, const int32_t *valid, int64_t rpg, int causal) {
    COST(.flops = 5 * D(rows) * cols, .act_elems = 2 * D(rows) * cols,
         .bytes = valid && rpg > 0 ? F32 * D(rows) / D(rpg) : 0);
    FORWARD(softmax_forward, y, x, rows, cols, valid, rpg, causal);
}
static luna_status w_dropout_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t n,
                                     float p, luna_rng_key key) {
    /* The mask is regenerated (Philox), not read: ~10 integer ops per element counted as 2. */
    COST(.flops = p > 0 ? 2 * D(n) : 0, .act_elems = 2 * D(n));
    FORWARD(dropout_forward, y, x, n, p, key);
}
static luna_status w_dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dy, int64_t n,
                                      float p, luna_rng_key key) {
    COST(.flops = p > 0 ? 2 * D(n) : 0, .act_elems = 2 * D(n));
    FORWARD(dropout_backward, dx, dy, n, p, key);
}
#define ELEMENTWISE(name, fwd_flops, bwd_flops)                                                    \
    static luna_status w_##name##_forward(luna_backend *be, luna_act *y, const luna_act *x,        \
                                          int64_t n) {                                             \
        COST(.flops = (fwd_flops)*D(n), .act_elems = 2 * D(n));                                    \
        FORWARD(name##_forward, y, x, n);                                                          \
    }                                                                                              \
    static luna_status w_##name##_backward(luna_backend *be, luna_act *dx, const luna_act *dy,     \
                                           const luna_act *x, int64_t n) {                         \
        COST(.flops = (bwd_flops)*D(n), .act_elems = 3 * D(n));                                    \
        FORWARD(name##_backward, dx, dy, x, n);                                                    \
    }
ELEMENTWISE(softplus_ln2, 4, 4) /* exp2 and log2 */
ELEMENTWISE(elu_plus_one, 2, 2)

/* ---- fused ops: the minimum traffic of one pass (each activation read or written once), which
 * is what they save over separate passes (e.g. residual_norm: 4 activation passes instead of 9
 * for a bias add, dropout, residual add and LayerNorm one after the other) -------------------- */
static luna_status w_residual_norm_forward(luna_backend *be, luna_act *y, luna_act *r, float *mean,
                                           float *rstd, const luna_act *sub, const float *bias,
                                           const luna_act *res, const float *gamma,
                                           const float *beta, int64_t rows, int d, float eps,
                                           float p, luna_rng_key key) {
    /* reads sub, res; writes r, y. bias + dropout (Philox: 2) + add + LayerNorm (8) */
    COST(.flops = D(rows) * d * (8 + 1 + (bias ? 1 : 0) + (p > 0 ? 2 : 0)),
         .act_elems = 4 * D(rows) * d, .bytes = F32 * ((bias ? D(d) : 0) + 2 * D(d) + 2 * D(rows)));
    FORWARD(residual_norm_forward, y, r, mean, rstd, sub, bias, res, gamma, beta, rows, d, eps, p,
            key);
}
static luna_status w_residual_norm_backward(luna_backend *be, luna_act *dres, luna_act *dsub,
                                            float *dbias, float *dgamma, float *dbeta,
                                            const luna_act *dy, const luna_act *r,
                                            const float *mean, const float *rstd,
                                            const float *gamma, int64_t rows, int d, float p,
                                            luna_rng_key key) {
    /* reads dy, r; writes dres, dsub; dγ, dβ, dbias read and written, γ, mean, rstd read */
    COST(.flops = D(rows) * d * (12 + (p > 0 ? 2 : 0) + (dbias ? 1 : 0)),
         .act_elems = 4 * D(rows) * d,
         .bytes = F32 * (2 * D(rows) + D(d) + (dgamma ? 2 * D(d) : 0) + (dbeta ? 2 * D(d) : 0) +
                         (dbias ? 2 * D(d) : 0)));
    FORWARD(residual_norm_backward, dres, dsub, dbias, dgamma, dbeta, dy, r, mean, rstd, gamma,
            rows, d, p, key);
}
static luna_status w_bias_relu_dropout_forward(luna_backend *be, luna_act *a, luna_act *h,
                                               const float *bias, int64_t rows, int cols, float p,
                                               luna_rng_key key) {
    /* reads h (and writes it back with the bias), writes a */
    COST(.flops = D(rows) * cols * ((bias ? 1 : 0) + 1 + (p > 0 ? 2 : 0)),
         .act_elems = D(rows) * cols * (bias ? 3 : 2), .bytes = bias ? F32 * D(cols) : 0);
    FORWARD(bias_relu_dropout_forward, a, h, bias, rows, cols, p, key);
}
static luna_status w_bias_relu_dropout_backward(luna_backend *be, luna_act *dh, float *dbias,
                                                const luna_act *da, const luna_act *h, int64_t rows,
                                                int cols, float p, luna_rng_key key) {
    /* reads da, h; writes dh; dbias read and written */
    COST(.flops = D(rows) * cols * (1 + (p > 0 ? 2 : 0) + (dbias ? 1 : 0)),
         .act_elems = 3 * D(rows) * cols, .bytes = dbias ? 2 * F32 * D(cols) : 0);
    FORWARD(bias_relu_dropout_backward, dh, dbias, da, h, rows, cols, p, key);
}
static luna_status w_softmax_dropout_forward(luna_backend *be, luna_act *y, luna_act *yd,
                                             const luna_act *x, int64_t rows, int cols,
                                             const int32_t *valid, int64_t rpg, int causal, float p,
                                             luna_rng_key key) {
    /* reads x; writes y and (dropout on) yd */
    const bool drop = yd && p > 0;
    COST(.flops = D(rows) * cols * (5 + (drop ? 2 : 0)),
         .act_elems = D(rows) * cols * (drop ? 3 : 2),
         .bytes = valid && rpg > 0 ? F32 * D(rows) / D(rpg) : 0);
    FORWARD(softmax_dropout_forward, y, yd, x, rows, cols, valid, rpg, causal, p, key);
}
static luna_status w_softmax_dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dyd,
                                              const luna_act *y, int64_t rows, int cols, float p,
                                              luna_rng_key key) {
    /* reads dyd, y; writes dx */
    COST(.flops = D(rows) * cols * (4 + (p > 0 ? 2 : 0)), .act_elems = 3 * D(rows) * cols);
    FORWARD(softmax_dropout_backward, dx, dyd, y, rows, cols, p, key);
}

/* ---- attention of short rows: its products on tensor cores, the scores on chip (the bytes are
 * the operands read and the results written once; the composition, where a backend runs it,
 * also writes and reads the scores between its kernels) -------------------------------------- */
static luna_status w_attention_forward(luna_backend *be, luna_act *o, luna_act *a, luna_act *a_d,
                                       const luna_act *q, const luna_act *k, const luna_act *v,
                                       const luna_attention_shape *s, float p, luna_rng_key key) {
    /* reads Q, K, V; writes a, (dropout on) a_d, O */
    const double G = D(s->B) * s->H, nm = D(s->n) * s->m, drop = p > 0 ? 1 : 0;
    COST(.mm_flops = G * 4 * nm * s->dh, .flops = G * nm * (5 + 2 * drop),
         .act_elems = G * (2 * D(s->n) * s->dh + 2 * D(s->m) * s->dh + nm * (1 + drop)),
         .bytes = s->valid_cols ? F32 * D(s->B) : 0);
    FORWARD(attention_forward, o, a, a_d, q, k, v, s, p, key);
}
static luna_status w_attention_backward(luna_backend *be, luna_act *dq, luna_act *dk, luna_act *dv,
                                        luna_act *ds, const luna_act *d_o, const luna_act *q,
                                        const luna_act *k, const luna_act *v, const luna_act *a,
                                        const luna_act *a_d, const luna_attention_shape *s, float p,
                                        luna_rng_key key) {
    /* reads dO, Q, K, V, a, (dropout on) a_d; writes dQ, dK, dV (one buffer when tied) */
    const double G = D(s->B) * s->H, nm = D(s->n) * s->m, drop = p > 0 ? 1 : 0;
    const double md = D(s->m) * s->dh, nd = D(s->n) * s->dh;
    COST(.mm_flops = G * 8 * nm * s->dh, .flops = G * nm * (4 + 2 * drop),
         .act_elems = G * (4 * nd + 2 * md + nm * (1 + drop) + md * (dk == dv ? 1 : 2)));
    FORWARD(attention_backward, dq, dk, dv, ds, d_o, q, k, v, a, a_d, s, p, key);
}

/* ---- the causal Luna scan: per step a p×q state update and a p×q product (non-tensor FP32: the
 * CUDA kernel is a register scan, model/kernels/cuda/causal_contraction.cu) ------------------- */
static luna_status w_causal_contraction_forward(luna_backend *be, luna_act *out, const luna_act *x,
                                                const luna_act *a, const luna_act *b, int G, int n,
                                                int p, int q, float alpha,
                                                const luna_causal_layout *layout) {
    COST(.flops = D(G) * n * (4 * D(p) * q + q), .act_elems = D(G) * n * (2 * D(p) + 2 * D(q)));
    FORWARD(causal_contraction_forward, out, x, a, b, G, n, p, q, alpha, layout);
}
static luna_status w_causal_contraction_backward(luna_backend *be, luna_act *dx, luna_act *da,
                                                 luna_act *db, const luna_act *dout,
                                                 const luna_act *x, const luna_act *a,
                                                 const luna_act *b, int G, int n, int p, int q,
                                                 float alpha, const luna_causal_layout *layout) {
    /* Forward state rebuilt (2pq) and used for dx (2pq); R_s built (2pq), da and db (4pq). */
    COST(.flops = D(G) * n * (10 * D(p) * q + q), .act_elems = D(G) * n * (4 * D(p) + 3 * D(q)));
    FORWARD(causal_contraction_backward, dx, da, db, dout, x, a, b, G, n, p, q, alpha, layout);
}

/* ---- cross entropy over [N, V] ------------------------------------------------------------------
 */
static luna_status w_cross_entropy_forward(luna_backend *be, float *loss, float *nll, float *lse,
                                           const luna_act *logits, const int32_t *targets,
                                           int64_t N, int V, float eps, int pad) {
    COST(.flops = 4 * D(N) * V, .act_elems = D(N) * V, .bytes = F32 * 4 * D(N));
    FORWARD(cross_entropy_forward, loss, nll, lse, logits, targets, N, V, eps, pad);
}
static luna_status w_cross_entropy_forward_backward(luna_backend *be, float *loss, float *nll,
                                                    float *lse, luna_act *dlogits,
                                                    const luna_act *logits, const int32_t *targets,
                                                    int64_t N, int V, float eps, int pad,
                                                    float scale) {
    /* the logits read once (a row's second read is from cache), the gradient written */
    COST(.flops = 8 * D(N) * V, .act_elems = 2 * D(N) * V, .bytes = F32 * 4 * D(N));
    FORWARD(cross_entropy_forward_backward, loss, nll, lse, dlogits, logits, targets, N, V, eps,
            pad, scale);
}
static luna_status w_loss_sums(luna_backend *be, double *sums, const float *loss, const float *nll,
                               int64_t n) {
    COST(.flops = 2 * D(n), .bytes = F32 * 2 * D(n) + 32);
    FORWARD(loss_sums, sums, loss, nll, n);
}

/* ---- elementwise helpers and layout
 * --------------------------------------------------------------- */
static luna_status w_add(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                         int64_t n) {
    COST(.flops = D(n), .act_elems = 3 * D(n));
    FORWARD(add, y, a, b, n);
}
static luna_status w_axpy(luna_backend *be, luna_act *y, float alpha, const float *x, int64_t n) {
    COST(.flops = 2 * D(n), .act_elems = 2 * D(n), .bytes = F32 * D(n));
    FORWARD(axpy, y, alpha, x, n);
}
static luna_status w_scale_act(luna_backend *be, luna_act *x, float alpha, int64_t n) {
    COST(.flops = D(n), .act_elems = 2 * D(n));
    FORWARD(scale_act, x, alpha, n);
}
static luna_status w_split_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                                 int H, int dh) {
    COST(.act_elems = 2 * D(B) * n * H * dh);
    FORWARD(split_heads, out, x, B, n, H, dh);
}
static luna_status w_merge_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                                 int H, int dh) {
    COST(.act_elems = 2 * D(B) * n * H * dh);
    FORWARD(merge_heads, out, x, B, n, H, dh);
}
static luna_status w_broadcast_rows(luna_backend *be, luna_act *out, const luna_act *x, int B,
                                    int64_t rows, int d) {
    COST(.act_elems = (D(B) + 1) * D(rows) * d);
    FORWARD(broadcast_rows, out, x, B, rows, d);
}
static luna_status w_sum_broadcast(luna_backend *be, float *dx, const luna_act *dout, int B,
                                   int64_t rows, int d) {
    COST(.flops = D(B) * D(rows) * d, .act_elems = D(B) * D(rows) * d,
         .bytes = F32 * 2 * D(rows) * d);
    FORWARD(sum_broadcast, dx, dout, B, rows, d);
}

/* ---- decoding -----------------------------------------------------------------------------------
 */
static luna_status w_gather_rows(luna_backend *be, luna_act *dst, int64_t ds, const luna_act *src,
                                 int64_t ss, const int32_t *idx, int64_t n, int64_t cols) {
    COST(.act_elems = 2 * D(n) * D(cols), .bytes = idx ? F32 * D(n) : 0);
    FORWARD(gather_rows, dst, ds, src, ss, idx, n, cols);
}
static luna_status w_gather_rows_in_groups(luna_backend *be, luna_act *buf, int64_t stride,
                                           const int32_t *idx, int64_t n_groups, int group,
                                           int64_t cols) {
    COST(.act_elems = 2 * D(n_groups) * group * D(cols), .bytes = F32 * D(n_groups) * group);
    FORWARD(gather_rows_in_groups, buf, stride, idx, n_groups, group, cols);
}
static luna_status w_index_rows_update(luna_backend *be, int32_t *dst, const int32_t *src,
                                       const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                       const int32_t *set_col, const int32_t *set_val) {
    COST(.bytes = 4 * (2 * D(n) * D(cols) + (idx ? D(n) : 0) + (set_col ? 3 * D(n) : 0)));
    FORWARD(index_rows_update, dst, src, idx, n, cols, stride, set_col, set_val);
}
static luna_status w_log_softmax_topk(luna_backend *be, const luna_act *logits, const float *bias,
                                      int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                      const int32_t *pick, float *picked) {
    COST(.flops = 4 * D(rows) * V, .act_elems = D(rows) * V,
         .bytes = F32 * ((bias ? D(V) : 0) + 2 * D(rows) * k + (pick ? 2 * D(rows) : 0)));
    FORWARD(log_softmax_topk, logits, bias, rows, V, k, top_lp, top_idx, pick, picked);
}
static luna_status w_causal_step_products(luna_backend *be, luna_act *y, const luna_act *x,
                                          const luna_act *S, const int32_t *t, int t_all, int R,
                                          int H, int K, int N) {
    const double G = D(R) * H;
    COST(.mm_flops = 2 * G * K * N, .act_elems = G * (K + D(K) * N + N), .bytes = 4 * D(R));
    FORWARD(causal_step_products, y, x, S, t, t_all, R, H, K, N);
}
static luna_status w_cache_products(luna_backend *be, bool values, luna_act *y, const luna_act *x,
                                    const luna_act *C, const int32_t *ind, const int32_t *lens,
                                    int R, int H, int dh, int T, int T_cap, int page) {
    /* Matrix-vector products per (row, head), on vector units (no tensor-core tile to fill): x,
     * y and the T cached rows read once; T indices per row (shared by its heads). With per-row
     * lengths, T bounds them. */
    const double G = D(R) * H;
    COST(.flops = 2 * G * T * dh, .act_elems = G * (D(T) * dh + T + dh), .bytes = 4 * D(R) * T);
    FORWARD(cache_products, values, y, x, C, ind, lens, R, H, dh, T, T_cap, page);
}
static luna_status w_cache_write(luna_backend *be, luna_act *C, const luna_act *x,
                                 const int32_t *ind, const int32_t *lens, int R, int H, int dh,
                                 int T, int T_cap, int page) {
    COST(.act_elems = 2 * D(R) * H * dh, .bytes = 8 * D(R));
    FORWARD(cache_write, C, x, ind, lens, R, H, dh, T, T_cap, page);
}
static luna_status w_cross_attention(luna_backend *be, luna_act *y, const luna_act *q,
                                     const luna_act *K, const luna_act *V, const int32_t *row_slot,
                                     const int32_t *slot_len, int R, int H, int dh, int m,
                                     float alpha) {
    /* upper bound: every row over all m positions, its keys and values read once */
    COST(.flops = 4 * D(R) * H * m * dh + 5 * D(R) * H * m,
         .act_elems = 2 * D(R) * H * dh + 2 * D(R) * m * H * dh, .bytes = 4 * D(R));
    FORWARD(cross_attention, y, q, K, V, row_slot, slot_len, R, H, dh, m, alpha);
}
static luna_status w_beam_select(luna_backend *be, const luna_beam_select_args *a) {
    /* upper bound: the rows' lists read once (a sentence at step 0 reads one row, counted as
     * beam), each hypothesis's history read and written whole, the summary written */
    const double rows = D(a->S) * a->beam;
    COST(.bytes = 8 * rows * a->k_list + 2 * rows * a->cap * (F32 + 8) +
                  F32 * D(a->S) * (1 + 2 * a->beam));
    FORWARD(beam_select, a);
}
static luna_status w_hold_weights(luna_backend *be, const float *W, int out, int in,
                                  luna_dtype dtype) {
    /* Upper bound: a backend that repacks reads and writes W once (one-off per decoder). */
    COST(.bytes = F32 * 2 * D(out) * in);
    FORWARD(hold_weights, W, out, in, dtype);
}
static luna_status w_release_weights(luna_backend *be, const float *W) {
    COST(.calls = 0);
    FORWARD(release_weights, W);
}

/* ---- optimizer: per element, Apollo reads θ, g, m, B, d and writes θ, m, B, d (plus its fused
 * reduction pass over g, m, B, d), Adam reads θ, g, m, v and writes θ, m, v ---------------------
 */
#define APOLLO_BYTES(n) (F32 * 13 * D(n))
#define APOLLO_FLOPS(n) (30 * D(n))
#define ADAM_BYTES(n) (F32 * 7 * D(n))
#define ADAM_FLOPS(n) (15 * D(n))
static luna_status w_multi_sum_squares(luna_backend *be, float *r, const float *x,
                                       const luna_tensor_table *tt) {
    COST(.flops = 2 * D(tt->num_elements), .bytes = F32 * (D(tt->num_elements) + tt->num_tensors));
    FORWARD(multi_sum_squares, r, x, tt);
}
static luna_status w_clip_coefficients(luna_backend *be, float *coef, double *summary,
                                       const float *sumsq, int n, double clip, int mode,
                                       const double *also, int num_also) {
    COST(.flops = 4 * D(n), .bytes = F32 * 2 * D(n) + 24);
    FORWARD(clip_coefficients, coef, summary, sumsq, n, clip, mode, also, num_also);
}
static luna_status w_multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                                 const float *coef, float alpha) {
    /* Upper bound: tensors whose factor is 1 are skipped by the op. */
    COST(.flops = D(tt->num_elements), .bytes = F32 * 2 * D(tt->num_elements));
    FORWARD(multi_scale, x, tt, coef, alpha);
}
static luna_status w_multi_apollo_update(luna_backend *be, float *th, const float *g, float *m,
                                         float *B, float *d, const luna_tensor_table *tt,
                                         int64_t *steps, const double *gate, double lr, double beta,
                                         double eps, double sigma, int rebound, double wd,
                                         int wdt) {
    COST(.flops = APOLLO_FLOPS(tt->num_elements), .bytes = APOLLO_BYTES(tt->num_elements));
    FORWARD(multi_apollo_update, th, g, m, B, d, tt, steps, gate, lr, beta, eps, sigma, rebound, wd,
            wdt);
}
static luna_status w_multi_adam_update(luna_backend *be, float *th, const float *g, float *m,
                                       float *v, const luna_tensor_table *tt, int64_t *steps,
                                       const double *gate, double lr, double b1, double b2,
                                       double eps, double wd) {
    COST(.flops = ADAM_FLOPS(tt->num_elements), .bytes = ADAM_BYTES(tt->num_elements));
    FORWARD(multi_adam_update, th, g, m, v, tt, steps, gate, lr, b1, b2, eps, wd);
}

/* ---- the table, names and families -------------------------------------------------------------
 */
/* X(op, family): every member of struct luna_ops. test_op_profile.c checks this list against
 * core/backend.h, so an op added there without a wrapper here fails the suite. */
// clang-format off
#define LUNA_OPS_LIST(X) \
    X(gemm, "gemm") \
    X(gemm_grid, "gemm") \
    X(linear_forward, "linear") \
    X(linear_relu_forward, "linear") \
    X(linear_backward, "linear") \
    X(linear_forward_multi, "linear") \
    X(linear_backward_multi, "linear") \
    X(embedding_forward, "embedding") \
    X(embedding_backward, "embedding") \
    X(sinusoidal_table, "positions") \
    X(positions_add, "positions") \
    X(softmax_forward, "softmax") \
    X(dropout_forward, "dropout") \
    X(dropout_backward, "dropout") \
    X(softplus_ln2_forward, "activation") \
    X(softplus_ln2_backward, "activation") \
    X(elu_plus_one_forward, "activation") \
    X(elu_plus_one_backward, "activation") \
    X(residual_norm_forward, "residual_norm") \
    X(residual_norm_backward, "residual_norm") \
    X(bias_relu_dropout_forward, "bias_relu_dropout") \
    X(bias_relu_dropout_backward, "bias_relu_dropout") \
    X(softmax_dropout_forward, "softmax_dropout") \
    X(softmax_dropout_backward, "softmax_dropout") \
    X(attention_forward, "attention") \
    X(attention_backward, "attention") \
    X(causal_contraction_forward, "causal_contraction") \
    X(causal_contraction_backward, "causal_contraction") \
    X(cross_entropy_forward, "cross_entropy") \
    X(cross_entropy_forward_backward, "cross_entropy") \
    X(loss_sums, "cross_entropy") \
    X(add, "elementwise") \
    X(axpy, "elementwise") \
    X(scale_act, "elementwise") \
    X(split_heads, "layout") \
    X(merge_heads, "layout") \
    X(broadcast_rows, "layout") \
    X(sum_broadcast, "layout") \
    X(gather_rows, "decode_gather") \
    X(gather_rows_in_groups, "decode_gather") \
    X(index_rows_update, "decode_gather") \
    X(log_softmax_topk, "decode_topk") \
    X(causal_step_products, "decode_attention") \
    X(cache_products, "decode_attention") \
    X(cache_write, "decode_gather") \
    X(cross_attention, "decode_attention") \
    X(beam_select, "decode_search") \
    X(hold_weights, "hold_weights") \
    X(release_weights, "hold_weights") \
    X(multi_sum_squares, "clip") \
    X(clip_coefficients, "clip") \
    X(multi_scale, "clip") \
    X(multi_apollo_update, "optimizer") \
    X(multi_adam_update, "optimizer")
// clang-format on

#define TABLE_ENTRY(op, fam) .op = w_##op,
static const luna_ops counting_ops = {LUNA_OPS_LIST(TABLE_ENTRY)};
#define NAME_ENTRY(op, fam) [OP(op)] = #op,
static const char *const op_names[LUNA_OP_COUNT] = {LUNA_OPS_LIST(NAME_ENTRY)};
#define FAMILY_ENTRY(op, fam) [OP(op)] = fam,
static const char *const op_families[LUNA_OP_COUNT] = {LUNA_OPS_LIST(FAMILY_ENTRY)};

const char *luna_op_name(int op) { return op >= 0 && op < LUNA_OP_COUNT ? op_names[op] : NULL; }
const char *luna_op_family(int op) {
    return op >= 0 && op < LUNA_OP_COUNT ? op_families[op] : NULL;
}

luna_status luna_op_profile_attach(luna_op_profile **out, luna_backend *be, bool timing) {
    *out = NULL;
    if (g_active)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "op profile: one is already attached (one per process)");
    luna_op_profile *p = calloc(1, sizeof *p);
    if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "op profile: out of memory");
    p->table = counting_ops;
    p->inner = be->ops;
    p->be = be;
    p->timing = timing;
    be->ops = &p->table;
    g_active = p;
    *out = p;
    return LUNA_OK;
}

void luna_op_profile_detach(luna_op_profile *p) {
    if (!p) return;
    p->be->ops = p->inner;
    if (g_active == p) g_active = NULL;
    free(p);
}

void luna_op_profile_reset(luna_op_profile *p) {
    for (int i = 0; i < LUNA_OP_COUNT; i++)
        p->counters[i] = (luna_op_counter){0};
}

const luna_op_counter *luna_op_profile_counters(const luna_op_profile *p) { return p->counters; }
