/* GEMM and the ops built on it: batched GEMM, Linear (y = x Wᵀ + b) and its bias gradient, and
 * decoding's cache_products.
 *
 * GEMM is OpenBLAS's cblas_sgemm (row-major), single-threaded, on tiles of C spread over OpenMP
 * threads (a batch of small matrices: one tile per matrix). The tiling depends on the shape only,
 * so GEMM results are bit-identical for any thread count.
 *
 * Column sums (db) are deterministic: each thread owns a range of columns and adds the rows in
 * the order of model/kernels/column_sum_order.h (chunks of rows, in double), so the result does
 * not depend on the thread count or the tiling.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/allocator.h"
#include "model/kernels/column_sum_order.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/gemm_grid.h"

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

/* C [M, N] (row stride ldc) = beta · C; beta = 0 writes zeros (C is not read: NaN-safe). */
static void scale_c(float *C, int M, int N, int ldc, float beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(int64_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(int64_t)i * ldc + j];
}

/* One GEMM C = alpha·op(A)·op(B) + beta·C with BLAS semantics (beta = 0: C not read). */
static void sgemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        scale_c(C, M, N, ldc, beta);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* C is cut into tiles fixed by (M, N) alone and every tile is one single-threaded sgemm, run by
 * whichever OpenMP thread. OpenBLAS's own threading splits C by the thread count and its edge
 * kernels then round differently, so its results change with the thread count; these do not.
 *
 * Tile shape: few and large. Each sgemm call packs its operands into its own buffers (plain
 * copies at memory speed) and has its own edge loops, so small tiles repeat that work (over
 * luna_base's Linear shapes, tiles of ≥ 512×512 run measurably faster than 256×256:
 * docs/benchmarks.md). So C is cut into row panels of ≥ 512 rows (at most 4) and column tiles of
 * ≥ 512 columns, aiming at 8 tiles (4096 × 2048: 8 of 1024 × 1024; 4096 × 512: 4 of
 * 1024 × 512) — enough for up to 8 threads with dynamic scheduling, while more would only add
 * packing. A C too small for 4
 * such tiles is cut into tiles of ≥ 256 (512 × 512: 4 of 256 × 256). Small C (a batch of
 * attention matrices, ≤ 256×256 each) stays one tile per matrix. The tiling caps a GEMM's
 * parallelism at 8 threads; the results never depend on the thread count. */
typedef struct {
    int tm, tn; /* tile rows, tile columns */
} gemm_tiling;

static int round_up(int x, int to) { return (x + to - 1) / to * to; }

enum { GEMM_TILES = 8 };

static gemm_tiling gemm_tile(int M, int N) {
    if (M <= 256 && N <= 256) return (gemm_tiling){imax(M, 1), imax(N, 1)};
    int min_side = 512;
    int panels = imax(1, imin(GEMM_TILES, M / min_side));
    int cols = imax(1, imin((GEMM_TILES + panels - 1) / panels, N / min_side));
    if (panels * cols < GEMM_TILES) { /* small C: tiles of ≥ 256 */
        min_side = 256;
        panels = imax(1, imin(GEMM_TILES, M / min_side));
        cols = imax(1, imin((GEMM_TILES + panels - 1) / panels, N / min_side));
    }
    int tm = round_up((M + panels - 1) / panels, 16);
    int tn = round_up((N + cols - 1) / cols, 16);
    return (gemm_tiling){tm, tn};
}

/* One-row products C [1, N] = A [1, K] · op(B) (alpha 1, beta 0), the shape of a decoding step's
 * attention (one query per row and head, K = head size or steps so far): OpenBLAS packs both
 * operands for each of these tiny products, which costs far more than the multiply-adds. Each
 * C[j] is one chain of fused multiply-adds over k in ascending order from 0 — what OpenBLAS's
 * kernel computes for a single row when K fits one of its K blocks (K ≤ 256 here; checked
 * bit for bit against OpenBLAS 0.3.21's Zen/Haswell kernel on random shapes), so results do not
 * change. The kernels take the rows of B as pointers, so that cache_products (decoding's
 * attention over a beam-indirect cache) runs the same code on rows scattered over the cache. */
#define ROW_GEMM_MAX_K 256
/* The chains one scalar fused multiply-add at a time (columns j0 ≤ j < N; rows j0 ≤ j < N): the
 * vector kernels' edges, and the kernels without AVX2/FMA. */
static void row_axpy_scalar(int j0, int N, int K, const float *A, const float *const *rows,
                            float *C) {
    for (int j = j0; j < N; j++) {
        float c = 0.0f;
        for (int k = 0; k < K; k++)
            c = fmaf(A[k], rows[k][j], c);
        C[j] = c;
    }
}
static void row_dots_scalar(int j0, int N, int K, const float *A, const float *const *rows,
                            float *C) {
    for (int j = j0; j < N; j++) {
        float c = 0.0f;
        for (int k = 0; k < K; k++)
            c = fmaf(A[k], rows[j][k], c);
        C[j] = c;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "model/kernels/cpu/transpose8.h"
/* C[j] = Σ_k A[k] · rows[k][j] (j < N, k < K): 8 columns per register. */
__attribute__((target("avx2,fma"))) static void row_axpy(int N, int K, const float *A,
                                                         const float *const *rows, float *C) {
    int j = 0;
    for (; j + 32 <= N; j += 32) {
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        for (int k = 0; k < K; k++) {
            const __m256 a = _mm256_broadcast_ss(A + k);
            const float *b = rows[k] + j;
            c0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(b), c0);
            c1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(b + 8), c1);
            c2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(b + 16), c2);
            c3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(b + 24), c3);
        }
        _mm256_storeu_ps(C + j, c0);
        _mm256_storeu_ps(C + j + 8, c1);
        _mm256_storeu_ps(C + j + 16, c2);
        _mm256_storeu_ps(C + j + 24, c3);
    }
    for (; j + 8 <= N; j += 8) {
        __m256 c0 = _mm256_setzero_ps();
        for (int k = 0; k < K; k++)
            c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k), _mm256_loadu_ps(rows[k] + j), c0);
        _mm256_storeu_ps(C + j, c0);
    }
    row_axpy_scalar(j, N, K, A, rows, C);
}

/* C[l] = Σ_k A[k] · b[l][k] for l < 8: the 8 rows transposed 8 k at a time in registers. */
__attribute__((target("avx2,fma"))) static void row_dots8(int K, const float *A,
                                                          const float *const b[8], float *C) {
    __m256 c = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 t[8];
        luna_transpose8(b, k, t);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k), t[0], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 1), t[1], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 2), t[2], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 3), t[3], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 4), t[4], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 5), t[5], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 6), t[6], c);
        c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k + 7), t[7], c);
    }
    float out[8];
    _mm256_storeu_ps(out, c);
    for (int l = 0; l < 8; l++) {
        float cl = out[l];
        for (int kk = k; kk < K; kk++)
            cl = fmaf(A[kk], b[l][kk], cl);
        C[l] = cl;
    }
}

/* C[j] = Σ_k A[k] · rows[j][k] (j < N). The last N mod 8 rows go through row_dots8 too, beside
 * rows of zeros whose lanes are dropped (the same chains; one scalar chain at a time would wait
 * on the fused multiply-add's latency). */
__attribute__((target("avx2,fma"))) static void row_dots(int N, int K, const float *A,
                                                         const float *const *rows, float *C) {
    static const float zeros[ROW_GEMM_MAX_K];
    int j = 0;
    for (; j + 8 <= N; j += 8)
        row_dots8(K, A, rows + j, C + j);
    if (j == N) return;
    if (K > ROW_GEMM_MAX_K) {
        row_dots_scalar(j, N, K, A, rows, C);
        return;
    }
    const float *b[8];
    float c[8];
    for (int l = 0; l < 8; l++)
        b[l] = j + l < N ? rows[j + l] : zeros;
    row_dots8(K, A, b, c);
    memcpy(C + j, c, sizeof(float) * (size_t)(N - j));
}

__attribute__((target("avx2,fma"))) static void row_gemm(bool tb, int N, int K, const float *A,
                                                         const float *B, int ldb, float *C) {
    const float *rows[8];
    if (!tb) { /* C[j] = Σ_k A[k] B[k, j] */
        const float *brows[ROW_GEMM_MAX_K];
        for (int k = 0; k < K; k++)
            brows[k] = B + (int64_t)k * ldb;
        row_axpy(N, K, A, brows, C);
        return;
    }
    /* C[j] = Σ_k A[k] B[j, k], 8 rows of B at a time */
    int j = 0;
    for (; j + 8 <= N; j += 8) {
        for (int l = 0; l < 8; l++)
            rows[l] = B + (int64_t)(j + l) * ldb;
        row_dots8(K, A, rows, C + j);
    }
    for (int l = 0; j + l < N; l++)
        rows[l] = B + (int64_t)(j + l) * ldb;
    row_dots_scalar(0, N - j, K, A, rows, C + j);
}
static bool row_gemm_available(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
static void row_gemm(bool tb, int N, int K, const float *A, const float *B, int ldb, float *C) {
    (void)tb, (void)N, (void)K, (void)A, (void)B, (void)ldb, (void)C;
}
static bool row_gemm_available(void) { return false; }
#endif

/* Grid-batched GEMM (core/backend.h, gemm_grid), for o in [0, outer), i in [0, inner):
 *   C_oi [M, N] = alpha · op(A_oi) · op(B_oi) + beta · C_oi,  op(A_oi) [M, K], op(B_oi) [K, N],
 *   A_oi = A + o·sa.outer + i·sa.inner (stored [M, K], or [K, M] when trans_a; row stride lda),
 *   the same for B and C. The plain batched GEMM is the grid with inner = 1.
 * Tile (i0, j0) of C_oi needs rows i0.. of op(A_oi) (A + i0·lda, or column offset A + i0 when
 * transposed) and columns j0.. of op(B_oi) (B + j0, or B + j0·ldb when transposed). A product's
 * result depends on (M, N, K) and its operands' values only, never on where they are stored. */
luna_status luna_cpu_gemm_grid(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                               float alpha, const luna_act *A_, int lda, luna_grid_stride sa,
                               const luna_act *B_, int ldb, luna_grid_stride sb, float beta,
                               luna_act *C_, int ldc, luna_grid_stride sc, int outer, int inner) {
    const float *A = (const float *)A_;
    const float *B = (const float *)B_;
    float *C = (float *)C_;
    const int64_t batch = (int64_t)outer * inner;
    if (batch == 0 || M == 0 || N == 0) return LUNA_OK;

    gemm_tiling tl = gemm_tile(M, N);
    int tm = (M + tl.tm - 1) / tl.tm, tn = (N + tl.tn - 1) / tl.tn;
    int64_t tasks = batch * tm * tn;
    bool disjoint = luna_grid_disjoint(M, N, ldc, sc, outer, inner);
    int64_t work = (int64_t)M * N * (K > 0 ? K : 1) * batch;
    int threads = !disjoint || work < LUNA_CPU_PAR_ROWS_WORK ? 1 : be->num_threads;
#define GRID_OFFSET(s, b) (((b) / inner) * (s).outer + ((b) % inner) * (s).inner)
    if (M == 1 && !trans_a && beta == 0.0f && K > 0 && K <= ROW_GEMM_MAX_K &&
        row_gemm_available()) {
        /* alpha after the sum: for a power of two the same as scaling A first */
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int64_t b = 0; b < batch; b++) {
            float *Cb = C + GRID_OFFSET(sc, b);
            row_gemm(trans_b, N, K, A + GRID_OFFSET(sa, b), B + GRID_OFFSET(sb, b), ldb, Cb);
            if (alpha != 1.0f)
                for (int j = 0; j < N; j++)
                    Cb[j] *= alpha;
        }
        return LUNA_OK;
    }
    if (K == 1 && alpha == 1.0f && beta == 1.0f) {
        /* Rank-1 updates C += a bᵀ (Luna's causal step adds k ⊗ φ and φ ⊗ v to its sums every
         * decoding step, thousands of tiny calls): OpenBLAS's result for K = 1 is
         * round(round(a_i·b_j) + c_ij) (its kernel's product, then alpha·acc + C in one fused
         * multiply-add with alpha 1); the loop below rounds the same two operations (this file is
         * built without floating-point contraction), without packing the operands. */
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int64_t b = 0; b < batch; b++) {
            const float *a = A + GRID_OFFSET(sa, b), *bb = B + GRID_OFFSET(sb, b);
            float *Cb = C + GRID_OFFSET(sc, b);
            for (int i = 0; i < M; i++) {
                const float ai = trans_a ? a[i] : a[(int64_t)i * lda];
                float *restrict ci = Cb + (int64_t)i * ldc;
                if (!trans_b)
                    for (int j = 0; j < N; j++)
                        ci[j] = ci[j] + ai * bb[j];
                else
                    for (int j = 0; j < N; j++)
                        ci[j] = ci[j] + ai * bb[(int64_t)j * ldb];
            }
        }
        return LUNA_OK;
    }
    /* OpenBLAS (pthreads build) must not start its own pool from inside the region: the backend
     * keeps it at one thread (backend_cpu.c); guard against a caller that changed it. */
    int blas_threads = openblas_get_num_threads();
    if (blas_threads != 1) openblas_set_num_threads(1);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t b = t / ((int64_t)tm * tn);
        int rest = (int)(t % ((int64_t)tm * tn));
        int i0 = rest / tn * tl.tm, j0 = rest % tn * tl.tn;
        int m = imin(tl.tm, M - i0), n = imin(tl.tn, N - j0);
        const float *Ab = A ? A + GRID_OFFSET(sa, b) + (trans_a ? i0 : (int64_t)i0 * lda) : NULL;
        const float *Bb = B ? B + GRID_OFFSET(sb, b) + (trans_b ? (int64_t)j0 * ldb : j0) : NULL;
        float *Cb = C + GRID_OFFSET(sc, b) + (int64_t)i0 * ldc + j0;
        sgemm1(trans_a, trans_b, m, n, K, alpha, Ab, lda, Bb, ldb, beta, Cb, ldc);
    }
#undef GRID_OFFSET
    if (blas_threads != 1) openblas_set_num_threads(blas_threads);
    return LUNA_OK;
}

/* Batched strided GEMM (core/backend.h, gemm): the grid with one inner product per batch entry. */
luna_status luna_cpu_gemm(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                          float alpha, const luna_act *A, int lda, int64_t stride_a,
                          const luna_act *B, int ldb, int64_t stride_b, float beta, luna_act *C,
                          int ldc, int64_t stride_c, int batch) {
    return luna_cpu_gemm_grid(
        be, trans_a, trans_b, M, N, K, alpha, A, lda, (luna_grid_stride){stride_a, 0}, B, ldb,
        (luna_grid_stride){stride_b, 0}, beta, C, ldc, (luna_grid_stride){stride_c, 0}, batch, 1);
}

/* y [rows, cols] = b [cols] in every row. */
static luna_status broadcast_bias(luna_backend *be, float *y, const float *b, int64_t rows,
                                  int cols) {
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t r = 0; r < rows; r++)
        memcpy(y + r * cols, b, (size_t)cols * sizeof(float));
    return LUNA_OK;
}

/* y [rows, out] = x [rows, in] · W [out, in]ᵀ (+ b [out]). */
luna_status luna_cpu_linear_forward(luna_backend *be, luna_act *y_, const luna_act *x_,
                                    const float *W, const float *b, int64_t rows, int in, int out) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
    if (be->impl) {
        const luna_status held = luna_cpu_held_linear(be, y, x, W, b, rows, in, out);
        if (held != LUNA_ERR_UNSUPPORTED) return held; /* done, or an int8 hold out of memory */
    }
    /* With a bias, y starts as the bias rows and the GEMM adds to it (beta = 1): one pass over
     * y instead of two (sgemm's zeroing of C for beta = 0, then the bias add). */
    if (b) LUNA_TRY(broadcast_bias(be, y, b, rows, out));
    return luna_cpu_gemm(be, false, true, (int)rows, out, in, 1.0f, x, imax(in, 1), 0, W,
                         imax(in, 1), 0, b ? 1.0f : 0.0f, y, imax(out, 1), 0, 1);
}

/* linear_forward, then relu in place, as bias_relu_dropout_forward computes it. */
luna_status luna_cpu_linear_relu_forward(luna_backend *be, luna_act *y_, const luna_act *x,
                                         const float *W, const float *b, int64_t rows, int in,
                                         int out) {
    LUNA_TRY(luna_cpu_linear_forward(be, y_, x, W, b, rows, in, out));
    float *y = (float *)y_;
    const int64_t n = rows * out;
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (n >= 65536)
    for (int64_t e = 0; e < n; e++)
        y[e] = y[e] < 0.0f ? 0.0f : y[e] + 0.0f; /* NaN stays NaN, −0 becomes +0 */
    return LUNA_OK;
}

/* dy [rows, out]:
 *   dx [rows, in]  = dy · W          (W [out, in]; overwritten, or += when accumulate_dx)
 *   dW [out, in]  += dyᵀ · x         (x [rows, in]; GEMM with beta = 1)
 *   db [out]      += Σ_rows dy       (deterministic column sums)
 * Any of dx, dW, db may be NULL (not wanted). */
luna_status luna_cpu_linear_backward(luna_backend *be, luna_act *dx_, float *dW, float *db,
                                     const luna_act *dy_, const luna_act *x_, const float *W,
                                     int64_t rows, int in, int out, bool accumulate_dx) {
    float *dx = (float *)dx_;
    const float *dy = (const float *)dy_;
    const float *x = (const float *)x_;
    if (dx)
        LUNA_TRY(luna_cpu_gemm(be, false, false, (int)rows, in, out, 1.0f, dy, imax(out, 1), 0, W,
                               imax(in, 1), 0, accumulate_dx ? 1.0f : 0.0f, dx, imax(in, 1), 0, 1));
    if (dW)
        LUNA_TRY(luna_cpu_gemm(be, true, false, out, in, (int)rows, 1.0f, dy, imax(out, 1), 0, x,
                               imax(in, 1), 0, 1.0f, dW, imax(in, 1), 0, 1));
    if (db) luna_cpu_bias_grad(be, db, dy, rows, out);
    return LUNA_OK;
}

/* The projections of one input (core/backend.h, linear_forward_multi): one linear_forward each,
 * so the bits are the separate calls' (held weights included). */
luna_status luna_cpu_linear_forward_multi(luna_backend *be, luna_act *y, const luna_act *x,
                                          const float *W, const float *b, int64_t stride, int count,
                                          int64_t rows, int in, int out) {
    for (int i = 0; i < count; i++)
        LUNA_TRY(luna_cpu_linear_forward(be, (float *)y + (int64_t)i * rows * out, x,
                                         W + (int64_t)i * stride,
                                         b ? b + (int64_t)i * stride : NULL, rows, in, out));
    return LUNA_OK;
}

/* Their backward: one linear_backward each, in order, dx accumulated from the second on. */
luna_status luna_cpu_linear_backward_multi(luna_backend *be, luna_act *dx, float *dW, float *db,
                                           const luna_act *dy, const luna_act *x, const float *W,
                                           int64_t stride, int count, int64_t rows, int in, int out,
                                           bool accumulate_dx) {
    for (int i = 0; i < count; i++) {
        const int64_t o = (int64_t)i * stride;
        LUNA_TRY(luna_cpu_linear_backward(be, dx, dW ? dW + o : NULL, db ? db + o : NULL,
                                          (const float *)dy + (int64_t)i * rows * out, x, W + o,
                                          rows, in, out, accumulate_dx || i > 0));
    }
    return LUNA_OK;
}

/* db [cols] += Σ_r dy [r, cols]. Thread t owns columns [c0, c1) and adds the rows in the order of
 * model/kernels/column_sum_order.h (chunks of rows in order, in double): bit-identical for any
 * thread count, and to the CUDA backend's column sums. */
void luna_cpu_bias_grad(luna_backend *be, float *db, const float *dy, int64_t rows, int cols) {
    int threads = be->num_threads;
    int tile = luna_cpu_col_tile(cols, threads);
    int ntiles = (cols + tile - 1) / tile;
    const float *restrict g = dy;
    float *restrict out = db;
#pragma omp parallel for num_threads(threads)                                                      \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int t = 0; t < ntiles; t++) {
        int c0 = t * tile, w = cols - c0 < tile ? cols - c0 : tile;
        double acc[LUNA_CPU_COL_TILE_MAX] = {0};
        for (int64_t r0 = 0; r0 < rows; r0 += LUNA_COLSUM_CHUNK) {
            const int64_t r1 = r0 + LUNA_COLSUM_CHUNK < rows ? r0 + LUNA_COLSUM_CHUNK : rows;
            double part[LUNA_CPU_COL_TILE_MAX] = {0};
            for (int64_t r = r0; r < r1; r++) {
                const float *restrict gr = g + r * cols + c0;
                for (int j = 0; j < w; j++)
                    part[j] += (double)gr[j];
            }
            for (int j = 0; j < w; j++)
                acc[j] += part[j];
        }
        for (int j = 0; j < w; j++)
            out[c0 + j] = (float)((double)out[c0 + j] + acc[j]);
    }
}

/* cache_products (core/backend.h): a decoding step's attention products over a beam-indirect
 * cache. Per group g = r·H + h the T cached rows are located through ind (row p of the group in
 * slot ind[r, p]) and handed to the one-row kernels above as pointers: the bits of the one-row
 * gemm over a gathered copy, without the copy. */
luna_status luna_cpu_cache_products(luna_backend *be, bool values, luna_act *y_, const luna_act *x_,
                                    const luna_act *C_, const int32_t *ind, const int32_t *lens,
                                    int R, int H, int dh, int T, int T_cap, int page) {
    if (R == 0) return LUNA_OK;
    float *y = (float *)y_;
    const float *x = (const float *)x_, *C = (const float *)C_;
    const int64_t G = (int64_t)R * H, group = (int64_t)page * dh;
    const int threads =
        G * T * dh >= LUNA_CPU_PAR_ROWS_WORK && be->num_threads > 1 ? be->num_threads : 1;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    const float **rows = luna_arena_alloc(be->scratch, sizeof(float *) * (size_t)threads * T);
    if (!rows) {
        luna_arena_release(be->scratch, mark);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "cache_products: scratch exhausted");
    }
#if defined(__x86_64__) && defined(__GNUC__)
    const bool simd = row_gemm_available();
#endif
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t g = 0; g < G; g++) {
        const int64_t r = g / H, h = g % H;
        const float **rp = rows + (size_t)omp_get_thread_num() * T;
        const int Tr = lens ? lens[r] : T; /* this row's positions */
        for (int p = 0, pp = 0; p < Tr; p++, pp = pp + 1 == page ? 0 : pp + 1) /* pp = p mod page */
            rp[p] = C + ((int64_t)ind[r * T_cap + p] * H + h) * group + (int64_t)pp * dh;
#if defined(__x86_64__) && defined(__GNUC__)
        if (simd) {
            if (values)
                row_axpy(dh, Tr, x + g * T, rp, y + g * dh);
            else
                row_dots(Tr, dh, x + g * dh, rp, y + g * T);
            continue;
        }
#endif
        if (values)
            row_axpy_scalar(0, dh, Tr, x + g * T, rp, y + g * dh);
        else
            row_dots_scalar(0, Tr, dh, x + g * dh, rp, y + g * T);
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}
