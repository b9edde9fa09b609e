/* The CUDA backend's kernel table (core/backend.h; behind the argument checks of
 * core/op_checks.c): each op takes what scratch it needs from be->scratch and enqueues the kernel
 * launchers of cuda_kernels.h (or cuBLASLt through gemm_lt.h) on the stream.
 * Nothing here computes: the math is in the .cu files, whose CPU references are
 * model/kernels/cpu/. Every op that writes fp32 device memory reports the range to the bf16
 * weight copies (weight_copies.c), so a copy is never used after its weight changed. */
#include <limits.h>

#include "core/allocator.h"
#include "core/beam_select.h"
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
    if (batch == 0 || M == 0 || N == 0) return LUNA_OK;
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
    if ((int64_t)outer * inner == 0 || M == 0 || N == 0) return LUNA_OK;
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

/* relu in the GEMM's epilogue (in = 0: the bias rows, then relu as bias_relu_dropout does). */
static luna_status linear_relu_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                       const float *W, const float *b, int64_t rows, int in,
                                       int out) {
    if (rows == 0 || out == 0) return LUNA_OK;
    if (in == 0) { /* h = the bias rows in scratch, then y = relu(h) */
        const luna_arena_mark mark = luna_arena_get_mark(be->scratch);
        luna_act *h = luna_arena_alloc(be->scratch, luna_act_bytes(be, rows * out));
        luna_status st = h ? linear_forward(be, h, x, W, b, rows, in, out)
                           : luna_error(LUNA_ERR_OUT_OF_MEMORY, "linear_relu_forward: scratch");
        if (st == LUNA_OK)
            st = be->ops->bias_relu_dropout_forward(be, y, h, NULL, rows, out, 0.0f,
                                                    (luna_rng_key){0});
        luna_arena_release(be->scratch, mark);
        return st;
    }
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    const void *w = NULL, *bias = NULL;
    LUNA_TRY(gemm_weight(be, W, (size_t)out * (size_t)in, &w));
    LUNA_TRY(gemm_weight(be, b, (size_t)out, &bias));
    return luna_cuda_gemm_relu(&c->blas, c->stream, c->bf16, false, true, (int)rows, out, in, x, in,
                               w, in, y, out, bias);
}

/* dx = dy · W (bf16 mode: by W's bf16 copy), dW += dyᵀ · x (bf16 inputs, fp32 accumulation into
 * the fp32 gradient), db += Σ_rows dy. */
static luna_status linear_backward(luna_backend *be, luna_act *dx, float *dW, float *db,
                                   const luna_act *dy, const luna_act *x, const float *W,
                                   int64_t rows, int in, int out, bool accumulate_dx) {
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

/* Projections of one input (core/backend.h): one strided-batched GEMM, x at batch stride 0, each
 * projection's bias by cuBLASLt's bias batch stride. bf16 mode reads one bf16 copy of the whole
 * span W_0 .. W_{count-1} (biases between included), so the copies keep the fp32 weights' stride.
 */
static luna_status linear_forward_multi(luna_backend *be, luna_act *y, const luna_act *x,
                                        const float *W, const float *b, int64_t stride, int count,
                                        int64_t rows, int in, int out) {
    if (rows == 0 || out == 0) return LUNA_OK;
    const int64_t ny = rows * (int64_t)out;
    if (count > 1 && in > 0) { /* cuBLASLt needs K ≥ 1 */
        luna_cuda_impl *c = luna_cuda_impl_of(be);
        const void *w = NULL, *bias = NULL;
        LUNA_TRY(gemm_weight(be, W, (size_t)((count - 1) * stride + (int64_t)out * in), &w));
        LUNA_TRY(gemm_weight(be, b, b ? (size_t)((count - 1) * stride + out) : 0, &bias));
        const luna_status st = luna_cuda_gemm_bias_batched(
            &c->blas, c->stream, c->bf16, false, true, (int)rows, out, in, x, in, 0, w, in, stride,
            y, out, ny, count, bias, stride);
        if (st != LUNA_ERR_UNSUPPORTED) return st;
        luna_error_clear(); /* no batched algorithm for this shape: one GEMM each */
    }
    for (int i = 0; i < count; i++)
        LUNA_TRY(linear_forward(be, luna_act_at(be, y, i * ny), x, W + i * stride,
                                b ? b + i * stride : NULL, rows, in, out));
    return LUNA_OK;
}

/* dx = Σ_i dy_i W_i (a GEMM each, accumulating; W_i from the span's bf16 copy in bf16 mode), the
 * weight gradients in one batched GEMM (x at batch stride 0), the bias sums one per projection. */
static luna_status linear_backward_multi(luna_backend *be, luna_act *dx, float *dW, float *db,
                                         const luna_act *dy, const luna_act *x, const float *W,
                                         int64_t stride, int count, int64_t rows, int in, int out,
                                         bool accumulate_dx) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    const int64_t ny = rows * (int64_t)out;
    if (count == 1) return linear_backward(be, dx, dW, db, dy, x, W, rows, in, out, accumulate_dx);
    if (dx && rows > 0 && in > 0) {
        const void *w = NULL;
        const size_t es = bf16(be) ? 2 : 4;
        LUNA_TRY(gemm_weight(be, W, (size_t)((count - 1) * stride + (int64_t)out * in), &w));
        for (int i = 0; i < count; i++)
            LUNA_TRY(luna_cuda_gemm(&c->blas, c->stream, c->bf16, false, false, (int)rows, in, out,
                                    1.0f, luna_act_at(be, dy, i * ny), imax(out, 1), 0,
                                    (const char *)w + (size_t)(i * stride) * es, imax(in, 1), 0,
                                    accumulate_dx || i > 0 ? 1.0f : 0.0f, dx, in, 0, 1, NULL));
    }
    if (dW && out > 0 && in > 0) {
        WRITES(dW, (count - 1) * stride + (int64_t)out * in);
        luna_status st = luna_cuda_gemm_ex(&c->blas, c->stream, c->bf16, 0, true, false, out, in,
                                           (int)rows, 1.0f, dy, imax(out, 1), ny, x, imax(in, 1), 0,
                                           1.0f, dW, in, stride, count, NULL);
        if (st == LUNA_ERR_UNSUPPORTED) { /* no batched algorithm for this shape: one each */
            luna_error_clear();
            st = LUNA_OK;
            for (int i = 0; i < count && st == LUNA_OK; i++)
                st = luna_cuda_gemm_ex(&c->blas, c->stream, c->bf16, 0, true, false, out, in,
                                       (int)rows, 1.0f, luna_act_at(be, dy, i * ny), imax(out, 1),
                                       0, x, imax(in, 1), 0, 1.0f, dW + i * stride, in, 0, 1, NULL);
        }
        LUNA_TRY(st);
    }
    if (db && out > 0)
        for (int i = 0; i < count; i++) {
            WRITES(db + i * stride, out);
            const luna_arena_mark mark = luna_arena_get_mark(be->scratch);
            luna_cuda_colsum_ws ws = {NULL, luna_cuda_colsum_ws_doubles(rows, out, 1)};
            luna_status st = scratch_doubles(be, "linear_backward_multi (bias)", ws.n, &ws.p);
            if (st == LUNA_OK)
                st = luna_cuda_check(
                    luna_cuda_bias_add_backward(c->stream, c->bf16, db + i * stride,
                                                luna_act_at(be, dy, i * ny), rows, out, ws),
                    "linear_backward_multi (bias)");
            luna_arena_release(be->scratch, mark);
            LUNA_TRY(st);
        }
    return LUNA_OK;
}

/* ---- embedding and positions ------------------------------------------------------------------
 */
static luna_status embedding_forward(luna_backend *be, luna_act *out, const float *table,
                                     const int32_t *tokens, int64_t n, int V, int d, float scale,
                                     int padding_idx) {
    if (n == 0) return LUNA_OK;
    LUNA_TRY(luna_cuda_check_ids(be, "embedding_forward", "token id", tokens, n, V, NULL));
    LAUNCH("embedding_forward",
           luna_cuda_embedding_forward(stream(be), bf16(be), out, table, tokens, n, V, d, scale,
                                       padding_idx, NULL));
}

static luna_status embedding_backward(luna_backend *be, float *dtable, const luna_act *dout,
                                      const int32_t *tokens, int64_t n, int V, int d, float scale,
                                      int padding_idx) {
    LUNA_TRY(luna_cuda_check_ids(be, "embedding_backward", "token id", tokens, n, V, NULL));
    WRITES(dtable, (int64_t)V * d);
    /* the positions sorted by token, in scratch */
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    void *index = luna_arena_alloc(be->scratch, (size_t)luna_cuda_embedding_backward_scratch(n, V));
    if (!index) {
        luna_error_prefix("embedding_backward: scratch for the token index");
        return LUNA_ERR_OUT_OF_MEMORY;
    }
    luna_status st =
        luna_cuda_check(luna_cuda_embedding_backward(stream(be), bf16(be), dtable, dout, tokens, n,
                                                     V, d, scale, padding_idx, index),
                        "embedding_backward");
    luna_arena_release(be->scratch, mark);
    return st;
}

static luna_status sinusoidal_table(luna_backend *be, luna_act *out, int first_pos, int npos,
                                    int d) {
    LAUNCH("sinusoidal_table",
           luna_cuda_sinusoidal_table(stream(be), bf16(be), out, first_pos, npos, d));
}

static luna_status positions_add(luna_backend *be, luna_act *x, const int32_t *tokens, int B, int n,
                                 int d, int padding_idx) {
    if (B == 0 || n == 0 || d == 0) return LUNA_OK;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    int32_t *counts = luna_arena_alloc(be->scratch, (size_t)B * (size_t)n * sizeof *counts);
    float *table = luna_arena_alloc(be->scratch, (size_t)n * (size_t)d * sizeof *table);
    if (!counts || !table) {
        luna_arena_release(be->scratch, mark);
        luna_error_prefix("positions_add: scratch for the position counts and table");
        return LUNA_ERR_OUT_OF_MEMORY;
    }
    luna_status st = luna_cuda_check(luna_cuda_positions_add(stream(be), bf16(be), x, tokens, B, n,
                                                             d, padding_idx, counts, table),
                                     "positions_add");
    luna_arena_release(be->scratch, mark);
    return st;
}

/* ---- softmax, dropout, activations --------------------------------------------------------------
 */
static luna_status softmax_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t rows,
                                   int cols, const int32_t *valid_cols, int64_t rows_per_group,
                                   int causal_period) {
    LAUNCH("softmax_forward", luna_cuda_softmax_forward(stream(be), bf16(be), y, x, rows, cols,
                                                        valid_cols, rows_per_group, causal_period));
}
static luna_status dropout(luna_backend *be, const char *what, luna_act *y, const luna_act *x,
                           int64_t n, float p, luna_rng_key key) {
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
        LAUNCH(#name "_forward", luna_cuda_##name##_forward(stream(be), bf16(be), y, x, n));       \
    }                                                                                              \
    static luna_status name##_backward(luna_backend *be, luna_act *dx, const luna_act *dy,         \
                                       const luna_act *x, int64_t n) {                             \
        LAUNCH(#name "_backward",                                                                  \
               luna_cuda_##name##_backward(stream(be), bf16(be), dx, dy, x, n));                   \
    }
ACTIVATION(softplus_ln2)
ACTIVATION(elu_plus_one)

/* ---- causal contraction and cross entropy ------------------------------------------------------
 */
static luna_status causal_contraction_forward(luna_backend *be, luna_act *out, const luna_act *x,
                                              const luna_act *a, const luna_act *b, int G, int n,
                                              int p, int q, float alpha,
                                              const luna_causal_layout *layout) {
    LAUNCH("causal_contraction_forward",
           luna_cuda_causal_contraction_forward(stream(be), bf16(be), out, x, a, b, G, n, p, q,
                                                alpha, layout));
}
static luna_status causal_contraction_backward(luna_backend *be, luna_act *dx, luna_act *da,
                                               luna_act *db, const luna_act *dout,
                                               const luna_act *x, const luna_act *a,
                                               const luna_act *b, int G, int n, int p, int q,
                                               float alpha, const luna_causal_layout *layout) {
    LAUNCH("causal_contraction_backward",
           luna_cuda_causal_contraction_backward(stream(be), bf16(be), dx, da, db, dout, x, a, b, G,
                                                 n, p, q, alpha, layout));
}

/* The backend's own limit (one launch row per row) and the targets, on the device. */
static luna_status check_targets(luna_backend *be, const char *op, const int32_t *targets,
                                 int64_t N, int V, int padding_idx) {
    if (N > INT_MAX) BAD("%s: %lld rows exceed 2^31 (split the batch)", op, (long long)N);
    return luna_cuda_check_ids(be, op, "target", targets, N, V, &padding_idx);
}
static luna_status cross_entropy_forward(luna_backend *be, float *loss, float *nll, float *lse,
                                         const luna_act *logits, const int32_t *targets, int64_t N,
                                         int V, float epsilon, int padding_idx) {
    LUNA_TRY(check_targets(be, "cross_entropy_forward", targets, N, V, padding_idx));
    if (N == 0) return LUNA_OK;
    LAUNCH("cross_entropy_forward",
           luna_cuda_cross_entropy_forward(stream(be), bf16(be), loss, nll, lse, logits, targets, N,
                                           V, epsilon, padding_idx, NULL));
}
static luna_status cross_entropy_forward_backward(luna_backend *be, float *loss, float *nll,
                                                  float *lse, luna_act *dlogits,
                                                  const luna_act *logits, const int32_t *targets,
                                                  int64_t N, int V, float epsilon, int padding_idx,
                                                  float grad_scale) {
    LUNA_TRY(check_targets(be, "cross_entropy_forward_backward", targets, N, V, padding_idx));
    if (N == 0) return LUNA_OK;
    LAUNCH("cross_entropy_forward_backward",
           luna_cuda_cross_entropy_forward_backward(stream(be), bf16(be), loss, nll, lse, dlogits,
                                                    logits, targets, N, V, epsilon, padding_idx,
                                                    grad_scale));
}
static luna_status loss_sums(luna_backend *be, double *sums, const float *loss, const float *nll,
                             int64_t n) {
    LAUNCH("loss_sums", luna_cuda_loss_sums(stream(be), sums, loss, nll, n));
}

/* ---- elementwise helpers and layout ------------------------------------------------------------
 */
static luna_status add(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                       int64_t n) {
    LAUNCH("add", luna_cuda_add(stream(be), bf16(be), y, a, b, n));
}
static luna_status axpy(luna_backend *be, luna_act *y, float alpha, const float *x, int64_t n) {
    LAUNCH("axpy", luna_cuda_axpy(stream(be), bf16(be), y, alpha, x, n));
}
static luna_status scale_act(luna_backend *be, luna_act *x, float alpha, int64_t n) {
    LAUNCH("scale_act", luna_cuda_scale_act(stream(be), bf16(be), x, alpha, n));
}
static luna_status heads(luna_backend *be, const char *what, luna_act *out, const luna_act *x,
                         int B, int n, int H, int dh, int split) {
    if ((int64_t)B * n * H * dh == 0) return LUNA_OK;
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
    if ((int64_t)B * rows * d == 0) return LUNA_OK;
    LAUNCH("broadcast_rows", luna_cuda_broadcast_rows(stream(be), bf16(be), out, x, B, rows, d));
}
static luna_status sum_broadcast(luna_backend *be, float *dx, const luna_act *dout, int B,
                                 int64_t rows, int d) {
    if ((int64_t)B * rows * d == 0) return LUNA_OK;
    WRITES(dx, rows * d);
    LAUNCH("sum_broadcast", luna_cuda_sum_broadcast(stream(be), bf16(be), dx, dout, B, rows, d));
}

/* ---- decoding ----------------------------------------------------------------------------------
 */
static luna_status gather_rows(luna_backend *be, luna_act *dst, int64_t dst_stride,
                               const luna_act *src, int64_t src_stride, const int32_t *idx,
                               int64_t n, int64_t cols) {
    if (n == 0 || cols == 0) return LUNA_OK;
    LAUNCH("gather_rows", luna_cuda_gather_rows(stream(be), bf16(be), dst, dst_stride, src,
                                                src_stride, idx, n, cols));
}
static luna_status gather_rows_in_groups(luna_backend *be, luna_act *buf, int64_t stride,
                                         const int32_t *idx, int64_t n_groups, int group,
                                         int64_t cols) {
    if (n_groups > INT_MAX || (cols + 255) / 256 > 65535)
        BAD("gather_rows_in_groups: %lld groups of %lld columns exceed the grid",
            (long long)n_groups, (long long)cols);
    LAUNCH("gather_rows_in_groups",
           luna_cuda_gather_rows_in_groups(stream(be), bf16(be), buf, stride, idx, n_groups, group,
                                           cols));
}
static luna_status index_rows_update(luna_backend *be, int32_t *dst, const int32_t *src,
                                     const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                     const int32_t *set_col, const int32_t *set_val) {
    if (n > INT_MAX) BAD("index_rows_update: %lld rows exceed 2^31", (long long)n);
    LAUNCH("index_rows_update", luna_cuda_index_rows_update(stream(be), dst, src, idx, n, cols,
                                                            stride, set_col, set_val));
}
static luna_status log_softmax_topk(luna_backend *be, const luna_act *logits, const float *bias,
                                    int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                    const int32_t *pick, float *picked) {
    if (rows == 0) return LUNA_OK;
    if (pick)
        LUNA_TRY(luna_cuda_check_ids(be, "log_softmax_topk", "picked token", pick, rows, V, NULL));
    if (top_lp) WRITES(top_lp, rows * k);
    if (picked) WRITES(picked, rows);
    LAUNCH("log_softmax_topk", luna_cuda_log_softmax_topk(stream(be), bf16(be), logits, bias, rows,
                                                          V, k, top_lp, top_idx, pick, picked));
}
static luna_status causal_step_products(luna_backend *be, luna_act *y, const luna_act *x,
                                        const luna_act *S, const int32_t *t, int t_all, int R,
                                        int H, int K, int N) {
    if (R == 0) return LUNA_OK;
    if ((int64_t)R * H > INT_MAX || (size_t)K * sizeof(float) > 48 * 1024)
        BAD("causal_step_products: %d rows of %d heads with K %d exceed the kernel's grid or "
            "shared memory",
            R, H, K);
    LAUNCH("causal_step_products",
           luna_cuda_causal_step_products(stream(be), bf16(be), y, x, S, t, t_all, R, H, K, N));
}
static luna_status cache_products(luna_backend *be, bool values, luna_act *y, const luna_act *x,
                                  const luna_act *C, const int32_t *ind, const int32_t *lens, int R,
                                  int H, int dh, int T, int T_cap, int page) {
    if (R == 0) return LUNA_OK;
    LAUNCH("cache_products", luna_cuda_cache_products(stream(be), bf16(be), values, y, x, C, ind,
                                                      lens, R, H, dh, T, T_cap, page));
}
static luna_status cache_write(luna_backend *be, luna_act *C, const luna_act *x, const int32_t *ind,
                               const int32_t *lens, int R, int H, int dh, int T, int T_cap,
                               int page) {
    if (R == 0) return LUNA_OK;
    LAUNCH("cache_write",
           luna_cuda_cache_write(stream(be), bf16(be), C, x, ind, lens, R, H, dh, T, T_cap, page));
}

static luna_status cross_attention(luna_backend *be, luna_act *y, const luna_act *q,
                                   const luna_act *K, const luna_act *V, const int32_t *row_slot,
                                   const int32_t *slot_len, int R, int H, int dh, int m,
                                   float alpha) {
    if (R == 0) return LUNA_OK;
    LAUNCH("cross_attention", luna_cuda_cross_attention(stream(be), bf16(be), y, q, K, V, row_slot,
                                                        slot_len, R, H, dh, m, alpha));
}

static luna_status beam_select(luna_backend *be, const struct luna_beam_select_args *a) {
    if (a->S == 0) return LUNA_OK;
    LAUNCH("beam_select", luna_cuda_beam_select(stream(be), a));
}

const luna_ops luna_cuda_kernels = {
    .gemm = gemm,
    .gemm_grid = gemm_grid,
    .linear_forward = linear_forward,
    .linear_relu_forward = linear_relu_forward,
    .linear_backward = linear_backward,
    .linear_forward_multi = linear_forward_multi,
    .linear_backward_multi = linear_backward_multi,
    .residual_norm_forward = luna_cuda_op_residual_norm_forward,
    .residual_norm_backward = luna_cuda_op_residual_norm_backward,
    .bias_relu_dropout_forward = luna_cuda_op_bias_relu_dropout_forward,
    .bias_relu_dropout_backward = luna_cuda_op_bias_relu_dropout_backward,
    .softmax_dropout_forward = luna_cuda_op_softmax_dropout_forward,
    .softmax_dropout_backward = luna_cuda_op_softmax_dropout_backward,
    .cross_entropy_forward = cross_entropy_forward,
    .cross_entropy_forward_backward = cross_entropy_forward_backward,
    .loss_sums = loss_sums,
    .softmax_forward = softmax_forward,
    .attention_forward = luna_cuda_op_attention_forward,
    .attention_backward = luna_cuda_op_attention_backward,
    .causal_contraction_forward = causal_contraction_forward,
    .causal_contraction_backward = causal_contraction_backward,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .sinusoidal_table = sinusoidal_table,
    .positions_add = positions_add,
    .dropout_forward = dropout_forward,
    .dropout_backward = dropout_backward,
    .softplus_ln2_forward = softplus_ln2_forward,
    .softplus_ln2_backward = softplus_ln2_backward,
    .elu_plus_one_forward = elu_plus_one_forward,
    .elu_plus_one_backward = elu_plus_one_backward,
    .add = add,
    .axpy = axpy,
    .scale_act = scale_act,
    .split_heads = split_heads,
    .merge_heads = merge_heads,
    .broadcast_rows = broadcast_rows,
    .sum_broadcast = sum_broadcast,
    .multi_sum_squares = luna_cuda_op_multi_sum_squares,
    .clip_coefficients = luna_cuda_op_clip_coefficients,
    .multi_scale = luna_cuda_op_multi_scale,
    .multi_apollo_update = luna_cuda_op_multi_apollo_update,
    .multi_adam_update = luna_cuda_op_multi_adam_update,
    .gather_rows = gather_rows,
    .gather_rows_in_groups = gather_rows_in_groups,
    .index_rows_update = index_rows_update,
    .log_softmax_topk = log_softmax_topk,
    .causal_step_products = causal_step_products,
    .cache_products = cache_products,
    .cache_write = cache_write,
    .cross_attention = cross_attention,
    .beam_select = beam_select,
    .hold_weights = luna_cuda_hold_weights,
    .release_weights = luna_cuda_release_weights,
};
