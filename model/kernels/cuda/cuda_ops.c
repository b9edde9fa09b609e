/* The CUDA backend's op table (core/backend.h): each op checks its arguments as the CPU backend
 * does (same conditions, same error codes), takes what scratch it needs from be->scratch, and
 * enqueues the kernel launchers of cuda_kernels.h (or cuBLASLt through gemm_lt.h) on the stream.
 * Nothing here computes: the math is in the .cu files, whose CPU references are
 * model/kernels/cpu/. Every op that writes fp32 device memory reports the range to the bf16
 * weight copies (weight_copies.c), so a copy is never used after its weight changed. */
#include <limits.h>

#include "core/allocator.h"
#include "core/tensor_table.h"
#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/gemm_grid.h"

#include "model/kernels/cuda/cuda_ops_util.h"

/* ---- GEMM and linear ------------------------------------------------------------------------ */
static luna_status gemm(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                        float alpha, const luna_act *A, int lda, int64_t stride_a,
                        const luna_act *B, int ldb, int64_t stride_b, float beta, luna_act *C,
                        int ldc, int64_t stride_c, int batch) {
    if (M < 0 || N < 0 || K < 0 || batch < 0)
        BAD("gemm: negative size (M %d, N %d, K %d, batch %d)", M, N, K, batch);
    const int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (lda < imax(1, a_cols) || ldb < imax(1, b_cols) || ldc < imax(1, N))
        BAD("gemm: leading dimension too small (lda %d < %d, ldb %d < %d or ldc %d < %d; trans_a "
            "%d, trans_b %d, M %d, N %d, K %d)",
            lda, imax(1, a_cols), ldb, imax(1, b_cols), ldc, imax(1, N), trans_a, trans_b, M, N, K);
    if (batch == 0 || M == 0 || N == 0) return LUNA_OK;
    if (!C || (K > 0 && (!A || !B))) BAD("gemm: NULL matrix pointer");
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (stride_c == 0 && batch > 1) {
        /* every product into one C, in batch order (the CPU's semantics); cuBLASLt's batches
         * would race on it, so one call per product */
        const size_t es = luna_dtype_size(be->act_dtype);
        for (int b = 0; b < batch; b++)
            LUNA_TRY(luna_cuda_gemm(&c->blas, c->stream, c->bf16, trans_a, trans_b, M, N, K, alpha,
                                    (const char *)A + (size_t)(b * stride_a) * es, lda, 0,
                                    (const char *)B + (size_t)(b * stride_b) * es, ldb, 0, beta, C,
                                    ldc, 0, 1, NULL));
        return LUNA_OK;
    }
    return luna_cuda_gemm(&c->blas, c->stream, c->bf16, trans_a, trans_b, M, N, K, alpha, A, lda,
                          stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch, NULL);
}

static luna_status gemm_grid(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                             float alpha, const luna_act *A, int lda, luna_grid_stride sa,
                             const luna_act *B, int ldb, luna_grid_stride sb, float beta,
                             luna_act *C, int ldc, luna_grid_stride sc, int outer, int inner) {
    if (M < 0 || N < 0 || K < 0 || outer < 0 || inner < 0)
        BAD("gemm: negative size (M %d, N %d, K %d, batch %d x %d)", M, N, K, outer, inner);
    const int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (lda < imax(1, a_cols) || ldb < imax(1, b_cols) || ldc < imax(1, N))
        BAD("gemm: leading dimension too small (lda %d < %d, ldb %d < %d or ldc %d < %d; trans_a "
            "%d, trans_b %d, M %d, N %d, K %d)",
            lda, imax(1, a_cols), ldb, imax(1, b_cols), ldc, imax(1, N), trans_a, trans_b, M, N, K);
    if ((int64_t)outer * inner == 0 || M == 0 || N == 0) return LUNA_OK;
    if (!C || (K > 0 && (!A || !B))) BAD("gemm: NULL matrix pointer");
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (!luna_grid_disjoint(M, N, ldc, sc, outer, inner)) {
        /* outputs that share elements: the products one by one, in grid order (the CPU's
         * semantics), as gemm does for stride_c = 0 */
        const size_t es = luna_dtype_size(be->act_dtype);
        for (int64_t g = 0; g < (int64_t)outer * inner; g++) {
            const int64_t o = g / inner, i = g % inner;
            LUNA_TRY(luna_cuda_gemm(
                &c->blas, c->stream, c->bf16, trans_a, trans_b, M, N, K, alpha,
                (const char *)A + (size_t)(o * sa.outer + i * sa.inner) * es, lda, 0,
                (const char *)B + (size_t)(o * sb.outer + i * sb.inner) * es, ldb, 0, beta,
                (char *)C + (size_t)(o * sc.outer + i * sc.inner) * es, ldc, 0, 1, NULL));
        }
        return LUNA_OK;
    }
    return luna_cuda_gemm_grid(&c->blas, c->stream, c->bf16, trans_a, trans_b, M, N, K, alpha, A,
                               lda, sa, B, ldb, sb, beta, C, ldc, sc, outer, inner);
}

static luna_status check_linear(const char *op, int64_t rows, int in, int out) {
    if (rows < 0 || in < 0 || out < 0)
        BAD("%s: negative size (rows %lld, in %d, out %d)", op, (long long)rows, in, out);
    if (rows > INT_MAX)
        BAD("%s: %lld rows exceed the BLAS int range; split the batch", op, (long long)rows);
    return LUNA_OK;
}

/* The weight as the GEMM reads it: W itself (fp32 mode) or its bf16 copy (bf16 mode). */
static luna_status gemm_weight(luna_backend *be, const float *W, size_t numel, const void **w) {
    if (!bf16(be) || !W) {
        *w = W;
        return LUNA_OK;
    }
    return luna_cuda_weight_bf16(be, W, numel, w);
}

/* y [rows, out] = x [rows, in] · Wᵀ + b: one cuBLASLt call with the BIAS epilogue. */
static luna_status linear_forward(luna_backend *be, luna_act *y, const luna_act *x, const float *W,
                                  const float *b, int64_t rows, int in, int out) {
    LUNA_TRY(check_linear("linear_forward", rows, in, out));
    if (rows == 0 || out == 0) return LUNA_OK;
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    const void *w = NULL, *bias = NULL;
    LUNA_TRY(gemm_weight(be, W, (size_t)out * (size_t)in, &w));
    LUNA_TRY(gemm_weight(be, b, (size_t)out, &bias));
    if (in == 0) { /* y = b broadcast (cuBLASLt needs K ≥ 1) */
        LUNA_TRY(luna_cuda_check(
            luna_cuda_scale_matrix(c->stream, c->bf16, y, (int)rows, out, out, 0, 1, 0.0f),
            "linear_forward (in = 0)"));
        if (!b) return LUNA_OK;
        LAUNCH("linear_forward (bias)",
               luna_cuda_bias_add_forward(c->stream, c->bf16, y, b, rows, out));
    }
    return luna_cuda_gemm(&c->blas, c->stream, c->bf16, false, true, (int)rows, out, in, 1.0f, x,
                          in, 0, w, in, 0, 0.0f, y, out, 0, 1, bias);
}

/* dx = dy · W (bf16 mode: by W's bf16 copy), dW += dyᵀ · x (bf16 inputs, fp32 accumulation into
 * the fp32 gradient), db += Σ_rows dy. */
static luna_status linear_backward(luna_backend *be, luna_act *dx, float *dW, float *db,
                                   const luna_act *dy, const luna_act *x, const float *W,
                                   int64_t rows, int in, int out, bool accumulate_dx) {
    LUNA_TRY(check_linear("linear_backward", rows, in, out));
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (dx && rows > 0 && in > 0) {
        const void *w = NULL;
        LUNA_TRY(gemm_weight(be, W, (size_t)out * (size_t)in, &w));
        LUNA_TRY(luna_cuda_gemm(&c->blas, c->stream, c->bf16, false, false, (int)rows, in, out,
                                1.0f, dy, imax(out, 1), 0, w, imax(in, 1), 0,
                                accumulate_dx ? 1.0f : 0.0f, dx, in, 0, 1, NULL));
    }
    if (dW && out > 0 && in > 0) {
        WRITES(dW, (int64_t)out * in);
        LUNA_TRY(luna_cuda_gemm_ex(&c->blas, c->stream, c->bf16, 0, true, false, out, in, (int)rows,
                                   1.0f, dy, imax(out, 1), 0, x, imax(in, 1), 0, 1.0f, dW, in, 0, 1,
                                   NULL));
    }
    if (db && out > 0) {
        WRITES(db, out);
        LAUNCH_WITH_COLSUM_WS(
            "linear_backward (bias)", rows, out, 1,
            luna_cuda_bias_add_backward(c->stream, c->bf16, db, dy, rows, out, ws));
    }
    return LUNA_OK;
}

static luna_status bias_add_forward(luna_backend *be, luna_act *y, const float *b, int64_t rows,
                                    int cols) {
    if (rows < 0 || cols < 0) BAD("bias_add_forward: negative size");
    LAUNCH("bias_add_forward", luna_cuda_bias_add_forward(stream(be), bf16(be), y, b, rows, cols));
}
static luna_status bias_add_backward(luna_backend *be, float *db, const luna_act *dy, int64_t rows,
                                     int cols) {
    if (rows < 0 || cols < 0) BAD("bias_add_backward: negative size");
    WRITES(db, cols);
    LAUNCH_WITH_COLSUM_WS(
        "bias_add_backward", rows, cols, 1,
        luna_cuda_bias_add_backward(stream(be), bf16(be), db, dy, rows, cols, ws));
}

/* ---- embedding and positions ------------------------------------------------------------------
 */
/* Every token id must index the table (the CPU's message: the first offender). */
static luna_status check_tokens(luna_backend *be, const char *op, const int32_t *tokens, int64_t n,
                                int V) {
    int64_t pos;
    int32_t id;
    LUNA_TRY(luna_cuda_find_bad_id(be, tokens, n, V, NULL, &pos, &id));
    if (pos >= 0)
        BAD("%s: token id %d at position %lld is outside the vocabulary [0, %d)", op, (int)id,
            (long long)pos, V);
    return LUNA_OK;
}

static luna_status embedding_forward(luna_backend *be, luna_act *out, const float *table,
                                     const int32_t *tokens, int64_t n, int V, int d, float scale,
                                     int padding_idx) {
    if (n < 0 || V < 0 || d < 0)
        BAD("embedding_forward: negative size (n %lld, V %d, d %d)", (long long)n, V, d);
    if (n == 0) return LUNA_OK;
    LUNA_TRY(check_tokens(be, "embedding_forward", tokens, n, V));
    LAUNCH("embedding_forward",
           luna_cuda_embedding_forward(stream(be), bf16(be), out, table, tokens, n, V, d, scale,
                                       padding_idx, NULL));
}

static luna_status embedding_backward(luna_backend *be, float *dtable, const luna_act *dout,
                                      const int32_t *tokens, int64_t n, int V, int d, float scale,
                                      int padding_idx) {
    if (n < 0 || V < 0 || d < 0)
        BAD("embedding_backward: negative size (n %lld, V %d, d %d)", (long long)n, V, d);
    LUNA_TRY(check_tokens(be, "embedding_backward", tokens, n, V));
    WRITES(dtable, (int64_t)V * d);
    LAUNCH("embedding_backward", luna_cuda_embedding_backward(stream(be), bf16(be), dtable, dout,
                                                              tokens, n, V, d, scale, padding_idx));
}

static luna_status sinusoidal_table(luna_backend *be, luna_act *out, int first_pos, int npos,
                                    int d) {
    if (npos < 0 || d < 0) BAD("sinusoidal_table: negative size (npos %d, d %d)", npos, d);
    LAUNCH("sinusoidal_table",
           luna_cuda_sinusoidal_table(stream(be), bf16(be), out, first_pos, npos, d));
}

static luna_status positions_add(luna_backend *be, luna_act *x, const int32_t *tokens, int B, int n,
                                 int d, int padding_idx) {
    if (B < 0 || n < 0 || d < 0) BAD("positions_add: negative size (B %d, n %d, d %d)", B, n, d);
    if (B == 0 || n == 0 || d == 0) return LUNA_OK;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    int32_t *counts = luna_arena_alloc(be->scratch, (size_t)B * (size_t)n * sizeof *counts);
    if (!counts) {
        luna_error_prefix("positions_add: scratch for the position counts");
        return LUNA_ERR_OUT_OF_MEMORY;
    }
    luna_status st = luna_cuda_check(
        luna_cuda_positions_add(stream(be), bf16(be), x, tokens, B, n, d, padding_idx, counts),
        "positions_add");
    luna_arena_release(be->scratch, mark);
    return st;
}

/* ---- LayerNorm, softmax, dropout, activations ---------------------------------------------------
 */
static luna_status layer_norm_forward(luna_backend *be, luna_act *y, float *mean, float *rstd,
                                      const luna_act *x, const float *gamma, const float *beta,
                                      int64_t rows, int d, float eps) {
    if (rows < 0 || d <= 0)
        BAD("layer_norm_forward: bad size (rows %lld, d %d; d must be positive)", (long long)rows,
            d);
    LAUNCH("layer_norm_forward", luna_cuda_layer_norm_forward(stream(be), bf16(be), y, mean, rstd,
                                                              x, gamma, beta, rows, d, eps));
}

static luna_status layer_norm_backward(luna_backend *be, luna_act *dx, float *dgamma, float *dbeta,
                                       const luna_act *dy, const luna_act *x, const float *mean,
                                       const float *rstd, const float *gamma, int64_t rows, int d) {
    if (rows < 0 || d <= 0)
        BAD("layer_norm_backward: bad size (rows %lld, d %d; d must be positive)", (long long)rows,
            d);
    WRITES(dgamma, d);
    WRITES(dbeta, d);
    LAUNCH_WITH_COLSUM_WS("layer_norm_backward", rows, d, 2,
                          luna_cuda_layer_norm_backward(stream(be), bf16(be), dx, dgamma, dbeta, dy,
                                                        x, mean, rstd, gamma, rows, d, ws));
}

static luna_status softmax_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t rows,
                                   int cols, const int32_t *valid_cols, int64_t rows_per_group,
                                   int causal_period) {
    if (rows < 0 || cols < 0) BAD("softmax_forward: negative size");
    if (valid_cols && rows_per_group <= 0)
        BAD("softmax_forward: rows_per_group %lld must be positive", (long long)rows_per_group);
    LAUNCH("softmax_forward", luna_cuda_softmax_forward(stream(be), bf16(be), y, x, rows, cols,
                                                        valid_cols, rows_per_group, causal_period));
}
static luna_status softmax_backward(luna_backend *be, luna_act *dx, const luna_act *dy,
                                    const luna_act *y, int64_t rows, int cols) {
    if (rows < 0 || cols < 0) BAD("softmax_backward: negative size");
    LAUNCH("softmax_backward",
           luna_cuda_softmax_backward(stream(be), bf16(be), dx, dy, y, rows, cols));
}

static luna_status dropout(luna_backend *be, const char *what, luna_act *y, const luna_act *x,
                           int64_t n, float p, luna_rng_key key) {
    if (!(p >= 0.0f && p < 1.0f)) BAD("%s: p = %g must be in [0, 1)", what, (double)p);
    if (n < 0 || (n > 0 && (!y || !x))) BAD("%s: null pointer or negative size", what);
    if (n == 0) return LUNA_OK;
    if (p == 0.0f) {
        if (y == x) return LUNA_OK;
        return luna_cuda_check(
            cudaMemcpyAsync(y, x, luna_act_bytes(be, n), cudaMemcpyDeviceToDevice, stream(be)),
            what);
    }
    LAUNCH(what, luna_cuda_dropout(stream(be), bf16(be), y, x, n, p, key));
}
static luna_status dropout_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t n,
                                   float p, luna_rng_key key) {
    return dropout(be, "dropout_forward", y, x, n, p, key);
}
static luna_status dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dy, int64_t n,
                                    float p, luna_rng_key key) {
    return dropout(be, "dropout_backward", dx, dy, n, p, key);
}

#define ACTIVATION(name)                                                                           \
    static luna_status name##_forward(luna_backend *be, luna_act *y, const luna_act *x,            \
                                      int64_t n) {                                                 \
        CHECK_N(#name "_forward", y &&x);                                                          \
        LAUNCH(#name "_forward", luna_cuda_##name##_forward(stream(be), bf16(be), y, x, n));       \
    }                                                                                              \
    static luna_status name##_backward(luna_backend *be, luna_act *dx, const luna_act *dy,         \
                                       const luna_act *x, int64_t n) {                             \
        CHECK_N(#name "_backward", dx &&dy &&x);                                                   \
        LAUNCH(#name "_backward",                                                                  \
               luna_cuda_##name##_backward(stream(be), bf16(be), dx, dy, x, n));                   \
    }
ACTIVATION(relu)
ACTIVATION(softplus_ln2)
ACTIVATION(elu_plus_one)

/* ---- causal contraction and cross entropy ------------------------------------------------------
 */
static luna_status check_causal(const char *what, int G, int n, int p, int q,
                                const luna_causal_layout *layout) {
    if (G < 0 || n < 0 || p < 0 || q < 0)
        BAD("%s: negative size (G=%d n=%d p=%d q=%d)", what, G, n, p, q);
    if (layout && (layout->H < 1 || layout->p_ld < p || layout->q_ld < q))
        BAD("%s: bad layout (H %d, row strides %d, %d for rows of %d, %d)", what, layout->H,
            layout->p_ld, layout->q_ld, p, q);
    return LUNA_OK;
}
static luna_status causal_contraction_forward(luna_backend *be, luna_act *out, const luna_act *x,
                                              const luna_act *a, const luna_act *b, int G, int n,
                                              int p, int q, float alpha,
                                              const luna_causal_layout *layout) {
    LUNA_TRY(check_causal("causal_contraction_forward", G, n, p, q, layout));
    if ((int64_t)G * n * q > 0 && (!out || !x || !a || !b))
        BAD("causal_contraction_forward: null pointer");
    LAUNCH("causal_contraction_forward",
           luna_cuda_causal_contraction_forward(stream(be), bf16(be), out, x, a, b, G, n, p, q,
                                                alpha, layout));
}
static luna_status causal_contraction_backward(luna_backend *be, luna_act *dx, luna_act *da,
                                               luna_act *db, const luna_act *dout,
                                               const luna_act *x, const luna_act *a,
                                               const luna_act *b, int G, int n, int p, int q,
                                               float alpha, const luna_causal_layout *layout) {
    LUNA_TRY(check_causal("causal_contraction_backward", G, n, p, q, layout));
    if ((int64_t)G * n > 0 && (!dx || !da || !db || !dout || !x || !a || !b))
        BAD("causal_contraction_backward: null pointer");
    LAUNCH("causal_contraction_backward",
           luna_cuda_causal_contraction_backward(stream(be), bf16(be), dx, da, db, dout, x, a, b, G,
                                                 n, p, q, alpha, layout));
}

static luna_status check_ce(luna_backend *be, const char *what, const void *out, const void *logits,
                            const int32_t *targets, int64_t N, int V, float epsilon,
                            int padding_idx) {
    if (N < 0 || V <= 0) BAD("%s: bad shape (N=%lld, V=%d)", what, (long long)N, V);
    if (!(epsilon >= 0.0f && epsilon <= 1.0f))
        BAD("%s: label smoothing %g not in [0, 1]", what, (double)epsilon);
    if (N > INT_MAX) BAD("%s: %lld rows exceed 2^31 (split the batch)", what, (long long)N);
    if (N == 0) return LUNA_OK;
    if (!out || !logits || !targets) BAD("%s: null pointer", what);
    int64_t row;
    int32_t y;
    LUNA_TRY(luna_cuda_find_bad_id(be, targets, N, V, &padding_idx, &row, &y));
    if (row >= 0)
        BAD("%s: target %d of row %lld is outside the vocabulary [0, %d)", what, (int)y,
            (long long)row, V);
    return LUNA_OK;
}
static luna_status cross_entropy_forward(luna_backend *be, float *loss, float *nll, float *lse,
                                         const luna_act *logits, const int32_t *targets, int64_t N,
                                         int V, float epsilon, int padding_idx) {
    LUNA_TRY(
        check_ce(be, "cross_entropy_forward", loss, logits, targets, N, V, epsilon, padding_idx));
    if (N > 0 && (!nll || !lse)) BAD("cross_entropy_forward: null pointer");
    if (N == 0) return LUNA_OK;
    LAUNCH("cross_entropy_forward",
           luna_cuda_cross_entropy_forward(stream(be), bf16(be), loss, nll, lse, logits, targets, N,
                                           V, epsilon, padding_idx, NULL));
}
static luna_status cross_entropy_backward(luna_backend *be, luna_act *dlogits,
                                          const luna_act *logits, const float *lse,
                                          const int32_t *targets, int64_t N, int V, float epsilon,
                                          int padding_idx, float grad_scale) {
    LUNA_TRY(check_ce(be, "cross_entropy_backward", dlogits, logits, targets, N, V, epsilon,
                      padding_idx));
    if (N > 0 && !lse) BAD("cross_entropy_backward: null pointer");
    LAUNCH("cross_entropy_backward",
           luna_cuda_cross_entropy_backward(stream(be), bf16(be), dlogits, logits, lse, targets, N,
                                            V, epsilon, padding_idx, grad_scale));
}

static luna_status cross_entropy_forward_backward(luna_backend *be, float *loss, float *nll,
                                                  float *lse, luna_act *dlogits,
                                                  const luna_act *logits, const int32_t *targets,
                                                  int64_t N, int V, float epsilon, int padding_idx,
                                                  float grad_scale) {
    LUNA_TRY(check_ce(be, "cross_entropy_forward_backward", loss, logits, targets, N, V, epsilon,
                      padding_idx));
    if (N > 0 && (!nll || !lse || !dlogits)) BAD("cross_entropy_forward_backward: null pointer");
    if (N == 0) return LUNA_OK;
    LAUNCH("cross_entropy_forward_backward",
           luna_cuda_cross_entropy_forward_backward(stream(be), bf16(be), loss, nll, lse, dlogits,
                                                    logits, targets, N, V, epsilon, padding_idx,
                                                    grad_scale));
}

/* ---- elementwise helpers and layout ------------------------------------------------------------
 */
static luna_status add(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                       int64_t n) {
    CHECK_N("add", y && a && b);
    LAUNCH("add", luna_cuda_add(stream(be), bf16(be), y, a, b, n));
}
static luna_status axpy(luna_backend *be, luna_act *y, float alpha, const float *x, int64_t n) {
    CHECK_N("axpy", y && x);
    LAUNCH("axpy", luna_cuda_axpy(stream(be), bf16(be), y, alpha, x, n));
}
static luna_status scale(luna_backend *be, float *x, float alpha, int64_t n) {
    CHECK_N("scale", x);
    WRITES(x, n);
    LAUNCH("scale", luna_cuda_scale(stream(be), x, alpha, n));
}
static luna_status scale_act(luna_backend *be, luna_act *x, float alpha, int64_t n) {
    CHECK_N("scale_act", x);
    LAUNCH("scale_act", luna_cuda_scale_act(stream(be), bf16(be), x, alpha, n));
}
static luna_status fill(luna_backend *be, float *x, float value, int64_t n) {
    CHECK_N("fill", x);
    WRITES(x, n);
    LAUNCH("fill", luna_cuda_fill(stream(be), x, value, n));
}
static luna_status heads(luna_backend *be, const char *what, luna_act *out, const luna_act *x,
                         int B, int n, int H, int dh, int split) {
    if (B < 0 || n < 0 || H < 0 || dh < 0)
        BAD("%s: negative size (B=%d n=%d H=%d dh=%d)", what, B, n, H, dh);
    if ((int64_t)B * n * H * dh == 0) return LUNA_OK;
    if (!out || !x) BAD("%s: null pointer", what);
    LAUNCH(what, luna_cuda_heads_permute(stream(be), bf16(be), out, x, B, n, H, dh, split));
}
static luna_status split_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh) {
    return heads(be, "split_heads", out, x, B, n, H, dh, 1);
}
static luna_status merge_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh) {
    return heads(be, "merge_heads", out, x, B, n, H, dh, 0);
}
static luna_status broadcast_rows(luna_backend *be, luna_act *out, const luna_act *x, int B,
                                  int64_t rows, int d) {
    if (B < 0 || rows < 0 || d < 0) BAD("broadcast_rows: negative size");
    if ((int64_t)B * rows * d == 0) return LUNA_OK;
    if (!out || !x) BAD("broadcast_rows: null pointer");
    LAUNCH("broadcast_rows", luna_cuda_broadcast_rows(stream(be), bf16(be), out, x, B, rows, d));
}
static luna_status sum_broadcast(luna_backend *be, float *dx, const luna_act *dout, int B,
                                 int64_t rows, int d) {
    if (B < 0 || rows < 0 || d < 0) BAD("sum_broadcast: negative size");
    if ((int64_t)B * rows * d == 0) return LUNA_OK;
    if (!dx || !dout) BAD("sum_broadcast: null pointer");
    WRITES(dx, rows * d);
    LAUNCH("sum_broadcast", luna_cuda_sum_broadcast(stream(be), bf16(be), dx, dout, B, rows, d));
}

/* ---- decoding ----------------------------------------------------------------------------------
 */
static luna_status gather_rows(luna_backend *be, luna_act *dst, int64_t dst_stride,
                               const luna_act *src, int64_t src_stride, const int32_t *idx,
                               int64_t n, int64_t cols) {
    if (n < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
        BAD("gather_rows: bad sizes (n %lld, cols %lld, strides %lld, %lld)", (long long)n,
            (long long)cols, (long long)dst_stride, (long long)src_stride);
    if (n == 0 || cols == 0) return LUNA_OK;
    if (!dst || !src) BAD("gather_rows: null pointer");
    LAUNCH("gather_rows", luna_cuda_gather_rows(stream(be), bf16(be), dst, dst_stride, src,
                                                src_stride, idx, n, cols));
}
static luna_status log_softmax_topk(luna_backend *be, const luna_act *logits, const float *bias,
                                    int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                    const int32_t *pick, float *picked) {
    if (rows < 0 || V < 1 || k < 0 || k > V)
        BAD("log_softmax_topk: bad sizes (rows %lld, V %d, k %d)", (long long)rows, V, k);
    if (rows == 0) return LUNA_OK;
    if (!logits || (k > 0 && (!top_lp || !top_idx)) || (pick && !picked))
        BAD("log_softmax_topk: null pointer");
    if (pick) {
        int64_t row;
        int32_t tok;
        LUNA_TRY(luna_cuda_find_bad_id(be, pick, rows, V, NULL, &row, &tok));
        if (row >= 0)
            BAD("log_softmax_topk: row %lld: token %d out of [0, %d)", (long long)row, tok, V);
    }
    if (top_lp) WRITES(top_lp, rows * k);
    if (picked) WRITES(picked, rows);
    LAUNCH("log_softmax_topk", luna_cuda_log_softmax_topk(stream(be), bf16(be), logits, bias, rows,
                                                          V, k, top_lp, top_idx, pick, picked));
}
static luna_status cache_products(luna_backend *be, bool values, luna_act *y, const luna_act *x,
                                  const luna_act *C, const int32_t *ind, int R, int H, int dh,
                                  int T, int T_cap) {
    if (R < 0 || H < 1 || dh < 1 || T < 1 || T > T_cap)
        BAD("cache_products: bad sizes (R %d, H %d, dh %d, T %d, T_cap %d)", R, H, dh, T, T_cap);
    if (R == 0) return LUNA_OK;
    if (!y || !x || !C || !ind) BAD("cache_products: null pointer");
    LAUNCH("cache_products", luna_cuda_cache_products(stream(be), bf16(be), values, y, x, C, ind, R,
                                                      H, dh, T, T_cap));
}

const luna_ops luna_cuda_ops = {
    .gemm = gemm,
    .gemm_grid = gemm_grid,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .bias_add_forward = bias_add_forward,
    .bias_add_backward = bias_add_backward,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .sinusoidal_table = sinusoidal_table,
    .positions_add = positions_add,
    .layer_norm_forward = layer_norm_forward,
    .layer_norm_backward = layer_norm_backward,
    .softmax_forward = softmax_forward,
    .softmax_backward = softmax_backward,
    .dropout_forward = dropout_forward,
    .dropout_backward = dropout_backward,
    .relu_forward = relu_forward,
    .relu_backward = relu_backward,
    .softplus_ln2_forward = softplus_ln2_forward,
    .softplus_ln2_backward = softplus_ln2_backward,
    .elu_plus_one_forward = elu_plus_one_forward,
    .elu_plus_one_backward = elu_plus_one_backward,
    .residual_norm_forward = luna_cuda_op_residual_norm_forward,
    .residual_norm_backward = luna_cuda_op_residual_norm_backward,
    .bias_relu_dropout_forward = luna_cuda_op_bias_relu_dropout_forward,
    .bias_relu_dropout_backward = luna_cuda_op_bias_relu_dropout_backward,
    .softmax_dropout_forward = luna_cuda_op_softmax_dropout_forward,
    .softmax_dropout_backward = luna_cuda_op_softmax_dropout_backward,
    .causal_contraction_forward = causal_contraction_forward,
    .causal_contraction_backward = causal_contraction_backward,
    .cross_entropy_forward = cross_entropy_forward,
    .cross_entropy_backward = cross_entropy_backward,
    .cross_entropy_forward_backward = cross_entropy_forward_backward,
    .sum_squares = luna_cuda_op_sum_squares,
    .sum_pow4 = luna_cuda_op_sum_pow4,
    .dot = luna_cuda_op_dot,
    .sum = luna_cuda_op_sum,
    .max_abs = luna_cuda_op_max_abs,
    .sum_squares_backward = luna_cuda_op_sum_squares_backward,
    .sum_pow4_backward = luna_cuda_op_sum_pow4_backward,
    .dot_backward = luna_cuda_op_dot_backward,
    .add = add,
    .axpy = axpy,
    .scale = scale,
    .scale_act = scale_act,
    .fill = fill,
    .split_heads = split_heads,
    .merge_heads = merge_heads,
    .broadcast_rows = broadcast_rows,
    .sum_broadcast = sum_broadcast,
    .gather_rows = gather_rows,
    .log_softmax_topk = log_softmax_topk,
    .cache_products = cache_products,
    .hold_weights = luna_cuda_hold_weights,
    .release_weights = luna_cuda_release_weights,
    .apollo_update = luna_cuda_op_apollo_update,
    .adam_update = luna_cuda_op_adam_update,
    .multi_sum_squares = luna_cuda_op_multi_sum_squares,
    .clip_coefficients = luna_cuda_op_clip_coefficients,
    .multi_scale = luna_cuda_op_multi_scale,
    .multi_apollo_update = luna_cuda_op_multi_apollo_update,
    .multi_adam_update = luna_cuda_op_multi_adam_update,
};
