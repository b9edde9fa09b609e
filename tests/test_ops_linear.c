/* Tests of the GEMM group: batched GEMM against a naive triple loop (all transposes, strides,
 * alpha/beta), Linear (forward vs naive, finite-difference gradients, accumulation semantics; its
 * bias alone as the Linear with in = 0: the bias gradient's column sums) and bit-identical
 * backward results for 1 and 2 threads; and every op on the backend under test
 * (LUNA_TEST_BACKEND) against the CPU reference. Ops get device buffers from the harness
 * (tests/backend_harness.h); the checks read them back. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/kernels/column_sum_order.h"
#include "tests/backend_harness.h"

/* fp32 tolerances for the gradient checks (see the perturbation notes in the report). */
#ifndef GC_RTOL
#define GC_RTOL 2e-3
#endif
#ifndef GC_FLOOR
#define GC_FLOOR 1e-3
#endif

/* Check records every ck_assert (a write per call): inner loops only call it on failure. */
#define EXPECT_CLOSE(got, want, tol)                                                               \
    LUNA_EXPECT(fabs((double)(got) - (double)(want)) <= (tol), "%s = %.8g, want %.8g (line %d)",   \
                #got, (double)(got), (double)(want), __LINE__)

/* ---- The ops on device copies of host arrays ---------------------------------------------------
 * Inputs uploaded; outputs (and what they accumulate into) uploaded, computed and read back. A NULL
 * host array is a NULL device pointer (the op skips it). */
static float *up(luna_backend *be, const float *host, size_t n) {
    return host ? lh_f32(be, host, n) : NULL;
}
/* Read back (when the op succeeded) and free a device copy. */
static void down(luna_backend *be, luna_status st, float *host, float *dev, size_t n) {
    if (!dev) return;
    if (st == LUNA_OK && host) lh_download(be, host, dev, n * sizeof(float));
    lh_free(be, dev);
}

/* gemm with A [na], B [nb], C [nc] the whole strided arrays. */
static luna_status gemm_dev(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                            const float *A, size_t na, int lda, int64_t sa, const float *B,
                            size_t nb, int ldb, int64_t sb, float beta, float *C, size_t nc,
                            int ldc, int64_t sc, int batch) {
    float *vA = up(be, A, na), *vB = up(be, B, nb), *vC = up(be, C, nc);
    luna_status st = be->ops->gemm(be, ta, tb, M, N, K, alpha, vA, lda, sa, vB, ldb, sb, beta, vC,
                                   ldc, sc, batch);
    down(be, st, NULL, vA, na);
    down(be, st, NULL, vB, nb);
    down(be, st, C, vC, nc);
    return st;
}

static luna_status linear_fwd(luna_backend *be, float *y, const float *x, const float *W,
                              const float *b, int rows, int in, int out) {
    size_t nx = (size_t)rows * in, nw = (size_t)out * in, ny = (size_t)rows * out;
    float *vx = up(be, x, nx), *vW = up(be, W, nw), *vb = up(be, b, (size_t)out);
    float *vy = lh_alloc(be, ny * sizeof(float));
    luna_status st = be->ops->linear_forward(be, vy, vx, vW, vb, rows, in, out);
    down(be, st, NULL, vx, nx);
    down(be, st, NULL, vW, nw);
    down(be, st, NULL, vb, (size_t)out);
    down(be, st, y, vy, ny);
    return st;
}

/* dx, db may be NULL (skipped); dx's contents are uploaded too (accumulate_dx reads them). */
static luna_status linear_bwd(luna_backend *be, float *dx, float *dW, float *db, const float *dy,
                              const float *x, const float *W, int rows, int in, int out,
                              bool accumulate_dx) {
    size_t nx = (size_t)rows * in, nw = (size_t)out * in, ny = (size_t)rows * out;
    float *vdx = up(be, dx, nx), *vdW = up(be, dW, nw), *vdb = up(be, db, (size_t)out);
    float *vdy = up(be, dy, ny), *vx = up(be, x, nx), *vW = up(be, W, nw);
    luna_status st =
        be->ops->linear_backward(be, vdx, vdW, vdb, vdy, vx, vW, rows, in, out, accumulate_dx);
    down(be, st, dx, vdx, nx);
    down(be, st, dW, vdW, nw);
    down(be, st, db, vdb, (size_t)out);
    down(be, st, NULL, vdy, ny);
    down(be, st, NULL, vx, nx);
    down(be, st, NULL, vW, nw);
    return st;
}

/* The bias half of the Linear (in = 0): y = b in every row; db += Σ_rows dy. */
static luna_status bias_fwd(luna_backend *be, float *y, const float *b, int rows, int cols) {
    return linear_fwd(be, y, NULL, NULL, b, rows, 0, cols);
}
static luna_status bias_bwd(luna_backend *be, float *db, const float *dy, int rows, int cols) {
    return linear_bwd(be, NULL, NULL, db, dy, NULL, NULL, rows, 0, cols, false);
}

/* ---- GEMM vs naive --------------------------------------------------------------------------- */

/* Element (i, k) of op(X) for X stored with row stride ld. */
static double at(const float *X, int ld, bool trans, int i, int k) {
    return trans ? (double)X[(size_t)k * ld + i] : (double)X[(size_t)i * ld + k];
}

static int imax1(int v) { return v > 1 ? v : 1; }

static void check_gemm_case(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                            float beta, int batch, int pad) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(M * 131 + N * 17 + K * 7 + batch + ta * 2 + tb));
    int lda = imax1(ta ? M : K) + pad, ldb = imax1(tb ? K : N) + pad, ldc = imax1(N) + pad;
    int64_t sa = (int64_t)(ta ? K : M) * lda + 3, sb = (int64_t)(tb ? N : K) * ldb + 5;
    int64_t sc = (int64_t)M * ldc + 7;
    size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch);
    float *A = luna_test_random_vector(&rng, na, -1, 1),
          *B = luna_test_random_vector(&rng, nb, -1, 1);
    float *C = luna_test_random_vector(&rng, nc, -1, 1);
    float *C0 = malloc(nc * sizeof *C0);
    memcpy(C0, C, nc * sizeof *C);
    /* beta = 0 must not read C: poison the matrix entries with NaN. */
    if (beta == 0.0f)
        for (int b = 0; b < batch; b++)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++)
                    C[b * sc + (int64_t)i * ldc + j] = NAN;
    ck_assert_int_eq(gemm_dev(be, ta, tb, M, N, K, alpha, A, na, lda, sa, B, nb, ldb, sb, beta, C,
                              nc, ldc, sc, batch),
                     LUNA_OK);
    for (int b = 0; b < batch; b++) {
        const float *Ab = A + b * sa, *Bb = B + b * sb;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    double t = at(Ab, lda, ta, i, k) * at(Bb, ldb, tb, k, j);
                    s += t;
                    mag += fabs(t);
                }
                double c0 = C0[b * sc + (int64_t)i * ldc + j];
                double want = alpha * s + (beta == 0.0f ? 0.0 : beta * c0);
                double tol = 1e-5 * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-6;
                double got = C[b * sc + (int64_t)i * ldc + j];
                LUNA_EXPECT(fabs(got - want) <= tol,
                            "gemm ta %d tb %d M %d N %d K %d batch %d: C[%d][%d,%d] = %.8g, want "
                            "%.8g",
                            ta, tb, M, N, K, batch, b, i, j, got, want);
            }
    }
    /* Everything outside the C matrices (row padding, gaps between batch entries) untouched. */
    for (int b = 0; b < batch; b++)
        for (int64_t e = 0; e < sc; e++) {
            int64_t i = e / ldc, j = e % ldc;
            if (i < M && j < N) continue;
            LUNA_EXPECT(C[b * sc + e] == C0[b * sc + e], "gemm wrote outside C at %lld",
                        (long long)e);
        }
    free(A);
    free(B);
    free(C);
    free(C0);
}

START_TEST(gemm_matches_naive_all_transposes) {
    luna_backend *be = lh_backend(2);
    static const int shapes[][3] = {{1, 1, 1},   {3, 5, 7},    {7, 33, 5},
                                    {33, 1, 17}, {16, 16, 64}, {5, 7, 0}};
    static const float betas[] = {0.0f, 1.0f, -0.5f};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int bi = 0; bi < 3; bi++) {
                    const int *sh = shapes[s];
                    check_gemm_case(be, ta, tb, sh[0], sh[1], sh[2], 0.75f, betas[bi], 1, 0);
                    check_gemm_case(be, ta, tb, sh[0], sh[1], sh[2], 0.75f, betas[bi], 3, 2);
                }
    /* Larger than one 128×128 tile of C: edge tiles in both directions. */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            check_gemm_case(be, ta, tb, 300, 270, 7, 1.25f, 0.5f, 2, 1);
    /* Many small matrices: the OpenMP-over-batch path, against the same naive loop. */
    check_gemm_case(be, false, true, 30, 32, 64, 1.0f, 0.0f, 40, 1);
    check_gemm_case(be, true, false, 9, 13, 11, -1.5f, 1.0f, 33, 3);
    luna_backend_free(be);
}
END_TEST

/* The batch-parallel path and the serial path give bit-identical results. */
START_TEST(gemm_batch_threads_bit_identical) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 99);
    const int M = 30, N = 32, K = 64, batch = 24;
    float *A = luna_test_random_vector(&rng, (size_t)M * K * batch, -1, 1);
    float *B = luna_test_random_vector(&rng, (size_t)K * N * batch, -1, 1);
    float *C1 = luna_test_zeros((size_t)M * N * batch),
          *C2 = luna_test_zeros((size_t)M * N * batch);
    const size_t na = (size_t)M * K * batch, nb = (size_t)K * N * batch, nc = (size_t)M * N * batch;
    ck_assert_int_eq(gemm_dev(be, false, false, M, N, K, 1.0f, A, na, K, (int64_t)M * K, B, nb, N,
                              (int64_t)K * N, 0.0f, C2, nc, N, (int64_t)M * N, batch),
                     LUNA_OK);
    lh_set_threads(be, 1);
    ck_assert_int_eq(gemm_dev(be, false, false, M, N, K, 1.0f, A, na, K, (int64_t)M * K, B, nb, N,
                              (int64_t)K * N, 0.0f, C1, nc, N, (int64_t)M * N, batch),
                     LUNA_OK);
    ck_assert_int_eq(memcmp(C1, C2, sizeof(float) * M * N * batch), 0);
    free(A);
    free(B);
    free(C1);
    free(C2);
    luna_backend_free(be);
}
END_TEST

/* C layouts other than stacked matrices: heads interleaved in a row ([M, batch, N], stride_c = N,
 * ldc = batch·N; parallel), and stride_c = 0 with beta = 1 (every product summed into one C, in
 * batch order). */
START_TEST(gemm_interleaved_and_shared_outputs) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 12);
    const int M = 37, N = 19, K = 23, batch = 6;
    float *A = luna_test_random_vector(&rng, (size_t)batch * M * K, -1, 1);
    float *B = luna_test_random_vector(&rng, (size_t)batch * K * N, -1, 1);
    float *C = luna_test_random_vector(&rng, (size_t)M * batch * N, -1, 1);
    float *C0 = malloc(sizeof(float) * M * batch * N);
    memcpy(C0, C, sizeof(float) * M * batch * N);
    for (int shared = 0; shared < 2; shared++) {
        memcpy(C, C0, sizeof(float) * M * batch * N);
        int ldc = shared ? N : batch * N;
        ck_assert_int_eq(gemm_dev(be, false, false, M, N, K, 1.0f, A, (size_t)batch * M * K, K,
                                  (int64_t)M * K, B, (size_t)batch * K * N, N, (int64_t)K * N,
                                  shared ? 1.0f : 0.0f, C, (size_t)M * batch * N, ldc,
                                  shared ? 0 : N, batch),
                         LUNA_OK);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double total = C0[i * ldc + j];
                for (int b = 0; b < batch; b++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s +=
                            (double)A[((size_t)b * M + i) * K + k] * B[((size_t)b * K + k) * N + j];
                    if (!shared) EXPECT_CLOSE(C[i * ldc + b * N + j], s, 1e-5);
                    total += s;
                }
                if (shared) EXPECT_CLOSE(C[i * ldc + j], total, 1e-4);
            }
    }
    free(A);
    free(B);
    free(C);
    free(C0);
    luna_backend_free(be);
}
END_TEST

/* gemm_grid over attention heads (core/backend.h): B sentences × H heads of a [B, len, H·dh]
 * activation with padded rows, every transpose pair, into the heads' columns with beta; equal to
 * the same products made one at a time by gemm on the heads' addresses (bit for bit on the CPU,
 * whose GEMMs do not depend on where operands lie; within the ACCUM tier elsewhere), padding
 * untouched — on 1 and 2 threads. Also a grid summing every product into one C (strides 0). */
static void grid_vs_one_by_one(luna_backend *be, bool ta, bool tb, luna_grid_stride sc) {
    const int Bn = 3, H = 4, len = 6, dh = 6, ld = H * dh + 3; /* square heads: any transposes */
    const size_t n = (size_t)Bn * len * ld;
    const luna_grid_stride heads = {(int64_t)len * ld, dh};
    const float beta = sc.outer == 0 ? 1.0f : 0.25f;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 14);
    float *X = luna_test_random_vector(&rng, n, -1, 1),
          *Y = luna_test_random_vector(&rng, n, -1, 1);
    float *C0 = luna_test_random_vector(&rng, n, -1, 1);
    float *C = malloc(n * sizeof(float)), *R = malloc(n * sizeof(float));
    float *vX = up(be, X, n), *vY = up(be, Y, n), *vC = up(be, C0, n), *vR = up(be, C0, n);
    LUNA_CHECK_OK(be->ops->gemm_grid(be, ta, tb, len, dh, dh, 0.5f, vX, ld, heads, vY, ld, heads,
                                     beta, vC, ld, sc, Bn, H));
    for (int b = 0; b < Bn; b++)
        for (int h = 0; h < H; h++) {
            const int64_t at = b * heads.outer + h * heads.inner,
                          c_at = b * sc.outer + h * sc.inner;
            LUNA_CHECK_OK(be->ops->gemm(be, ta, tb, len, dh, dh, 0.5f, vX + at, ld, 0, vY + at, ld,
                                        0, beta, vR + c_at, ld, 0, 1));
        }
    down(be, LUNA_OK, C, vC, n);
    down(be, LUNA_OK, R, vR, n);
    ck_assert_uint_eq(lh_mismatch(LH_ACCUM, be->device == LUNA_DEVICE_CPU, C, R, n), 0);
    for (size_t i = 0; i < n; i++)
        if ((int)(i % ld) >= H * dh) ck_assert(memcmp(&C[i], &C0[i], 4) == 0);
    lh_free(be, vX), lh_free(be, vY);
    free(X), free(Y), free(C0), free(C), free(R);
}

START_TEST(gemm_grid_is_the_products_one_by_one) {
    for (int threads = 1; threads <= 2; threads++) {
        luna_backend *be = lh_backend(threads);
        const luna_grid_stride heads = {6 * (4 * 6 + 3), 6};
        for (int t = 0; t < 4; t++)
            grid_vs_one_by_one(be, t & 1, t >> 1, heads);
        grid_vs_one_by_one(be, false, false, (luna_grid_stride){0, 0});
        luna_backend_free(be);
    }
}
END_TEST

START_TEST(gemm_rejects_bad_arguments) {
    luna_backend *be = lh_backend(1);
    float *A = lh_f32(be, NULL, 16), *B = lh_f32(be, NULL, 16), *C = lh_f32(be, NULL, 16);
    ck_assert_int_eq(be->ops->gemm(be, false, false, 2, 2, 3, 1, A, 2, 0, B, 2, 0, 0, C, 2, 0, 1),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "lda 2 < 3"));
    ck_assert_int_eq(be->ops->gemm(be, false, true, 2, 2, 3, 1, A, 3, 0, B, 2, 0, 0, C, 2, 0, 1),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(be->ops->gemm(be, false, false, -1, 2, 3, 1, A, 3, 0, B, 2, 0, 0, C, 2, 0, 1),
                     LUNA_ERR_INVALID_ARGUMENT);
    lh_free(be, A);
    lh_free(be, B);
    lh_free(be, C);
    luna_backend_free(be);
}
END_TEST

/* ---- Linear ---------------------------------------------------------------------------------- */

typedef struct {
    luna_backend *be;
    float *x, *W, *b, *y, *w; /* x [rows, in], W [out, in], b [out], y and weights w [rows, out] */
    int rows, in, out;
} linear_ctx;

static double linear_loss(void *p) {
    linear_ctx *c = p;
    luna_status st = linear_fwd(c->be, c->y, c->x, c->W, c->b, c->rows, c->in, c->out);
    LUNA_EXPECT(st == LUNA_OK, "%s", luna_error_message());
    return luna_test_weighted_sum(c->y, c->w, (size_t)c->rows * c->out);
}

START_TEST(linear_forward_matches_naive) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 5);
    const int rows = 7, in = 33, out = 5;
    float *x = luna_test_random_vector(&rng, rows * in, -1, 1),
          *W = luna_test_random_vector(&rng, out * in, -1, 1);
    float *b = luna_test_random_vector(&rng, out, -1, 1), *y = luna_test_zeros(rows * out);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        ck_assert_int_eq(linear_fwd(be, y, x, W, with_bias ? b : NULL, rows, in, out), LUNA_OK);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < out; o++) {
                double s = with_bias ? b[o] : 0.0;
                for (int k = 0; k < in; k++)
                    s += (double)x[r * in + k] * W[o * in + k];
                EXPECT_CLOSE(y[r * out + o], s, 1e-5);
            }
    }
    free(x);
    free(W);
    free(b);
    free(y);
    luna_backend_free(be);
}
END_TEST

START_TEST(linear_gradients_match_finite_differences) {
    luna_backend *be = lh_backend(2);
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {7, 33, 5}, {1, 5, 33}, {7, 1, 3}};
    double worst = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 100 + s);
        linear_ctx c = {be,
                        luna_test_random_vector(&rng, rows * in, -1, 1),
                        luna_test_random_vector(&rng, out * in, -1, 1),
                        luna_test_random_vector(&rng, out, -1, 1),
                        luna_test_zeros(rows * out),
                        luna_test_random_vector(&rng, rows * out, -1, 1),
                        rows,
                        in,
                        out};
        float *dx = luna_test_zeros(rows * in), *dW = luna_test_zeros(out * in),
              *db = luna_test_zeros(out);
        ck_assert_int_eq(linear_bwd(be, dx, dW, db, c.w, c.x, c.W, rows, in, out, false), LUNA_OK);
        worst = fmax(worst, luna_test_gradcheck("linear dx", linear_loss, &c, c.x, rows * in, dx,
                                                1e-2, GC_RTOL, GC_FLOOR));
        worst = fmax(worst, luna_test_gradcheck("linear dW", linear_loss, &c, c.W, out * in, dW,
                                                1e-2, GC_RTOL, GC_FLOOR));
        worst = fmax(worst, luna_test_gradcheck("linear db", linear_loss, &c, c.b, out, db, 1e-2,
                                                GC_RTOL, GC_FLOOR));
        free(c.x);
        free(c.W);
        free(c.b);
        free(c.y);
        free(c.w);
        free(dx);
        free(dW);
        free(db);
    }
    printf("linear: worst gradcheck error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* dW and db accumulate; dx is overwritten (NaN-safe) unless accumulate_dx; NULL skips. */
START_TEST(linear_backward_accumulation_semantics) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 8);
    const int rows = 6, in = 9, out = 4;
    float *x = luna_test_random_vector(&rng, rows * in, -1, 1),
          *W = luna_test_random_vector(&rng, out * in, -1, 1);
    float *dy = luna_test_random_vector(&rng, rows * out, -1, 1);
    float *dx0 = luna_test_random_vector(&rng, rows * in, -1, 1),
          *dW0 = luna_test_random_vector(&rng, out * in, -1, 1);
    float *db0 = luna_test_random_vector(&rng, out, -1, 1);
    float *dx = malloc(sizeof(float) * rows * in), *dW = malloc(sizeof(float) * out * in);
    float *db = malloc(sizeof(float) * out);
    for (int acc = 0; acc < 2; acc++) {
        for (int i = 0; i < rows * in; i++)
            dx[i] = acc ? dx0[i] : NAN;
        memcpy(dW, dW0, sizeof(float) * out * in);
        memcpy(db, db0, sizeof(float) * out);
        ck_assert_int_eq(linear_bwd(be, dx, dW, db, dy, x, W, rows, in, out, acc), LUNA_OK);
        for (int r = 0; r < rows; r++)
            for (int k = 0; k < in; k++) {
                double s = acc ? dx0[r * in + k] : 0.0;
                for (int o = 0; o < out; o++)
                    s += (double)dy[r * out + o] * W[o * in + k];
                EXPECT_CLOSE(dx[r * in + k], s, 1e-5);
            }
        for (int o = 0; o < out; o++) {
            double sb = db0[o];
            for (int r = 0; r < rows; r++)
                sb += dy[r * out + o];
            EXPECT_CLOSE(db[o], sb, 1e-5);
            for (int k = 0; k < in; k++) {
                double s = dW0[o * in + k];
                for (int r = 0; r < rows; r++)
                    s += (double)dy[r * out + o] * x[r * in + k];
                EXPECT_CLOSE(dW[o * in + k], s, 1e-5);
            }
        }
    }
    /* NULL dx and db: only dW moves. */
    memcpy(dW, dW0, sizeof(float) * out * in);
    ck_assert_int_eq(linear_bwd(be, NULL, dW, NULL, dy, x, W, rows, in, out, false), LUNA_OK);
    ck_assert_int_ne(memcmp(dW, dW0, sizeof(float) * out * in), 0);
    free(x);
    free(W);
    free(dy);
    free(dx0);
    free(dW0);
    free(db0);
    free(dx);
    free(dW);
    free(db);
    luna_backend_free(be);
}
END_TEST

/* ---- The bias: the Linear with in = 0 -------------------------------------------------------- */

typedef struct {
    luna_backend *be;
    float *y, *b, *w;
    int rows, cols;
} bias_ctx;

static double bias_loss(void *p) {
    bias_ctx *c = p;
    LUNA_EXPECT(bias_fwd(c->be, c->y, c->b, c->rows, c->cols) == LUNA_OK, "%s",
                luna_error_message());
    return luna_test_weighted_sum(c->y, c->w, (size_t)c->rows * c->cols);
}

/* y = b in every row; db accumulates Σ_rows dy (its gradient, checked by finite differences). */
START_TEST(bias_gradient_and_accumulation) {
    luna_backend *be = lh_backend(2);
    static const int shapes[][2] = {{1, 1}, {3, 5}, {7, 33}, {1, 5}, {7, 1}, {700, 70}};
    double worst = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 200 + s);
        bias_ctx c = {be,
                      luna_test_zeros(rows * cols),
                      luna_test_random_vector(&rng, cols, -1, 1),
                      luna_test_random_vector(&rng, rows * cols, -1, 1),
                      rows,
                      cols};
        float *db0 = luna_test_random_vector(&rng, cols, -1, 1), *db = malloc(sizeof(float) * cols);
        memcpy(db, db0, sizeof(float) * cols);
        ck_assert_int_eq(bias_bwd(be, db, c.w, rows, cols), LUNA_OK);
        for (int j = 0; j < cols; j++)
            db[j] -= db0[j]; /* the increment */
        bias_loss(&c);
        for (int r = 0; r < rows; r++)
            ck_assert_int_eq(memcmp(c.y + (size_t)r * cols, c.b, sizeof(float) * cols), 0);
        worst = fmax(worst, luna_test_gradcheck("linear (in = 0) db", bias_loss, &c, c.b, cols, db,
                                                1e-2, GC_RTOL, GC_FLOOR));
        free(c.y);
        free(c.b);
        free(c.w);
        free(db0);
        free(db);
    }
    printf("bias: worst gradcheck error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* Column sums over many chunks of rows (model/kernels/column_sum_order.h: chunks of
 * LUNA_COLSUM_CHUNK rows; a GPU sums each chunk in a thread and adds the chunk sums in order):
 * 33 chunks, the last one partial, and a partial block of columns. Every row must be counted once:
 * the result equals the plain sum bit for bit (the values are multiples of 2^-12 in [-1, 1], so
 * every partial sum is exact in any order, and only a lost or repeated row changes the result). */
START_TEST(bias_gradient_counts_every_row_of_many_chunks) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 4242);
    const int rows = 32 * LUNA_COLSUM_CHUNK + LUNA_COLSUM_CHUNK / 2 + 5, cols = 37;
    float *dy = luna_test_random_vector(&rng, (size_t)rows * cols, -1, 1);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        dy[i] = roundf(dy[i] * 4096.0f) / 4096.0f;
    float *db = luna_test_random_vector(&rng, cols, -1, 1), *want = malloc(sizeof(float) * cols);
    for (int c = 0; c < cols; c++) {
        double sum = 0;
        for (int r = 0; r < rows; r++)
            sum += (double)dy[(size_t)r * cols + c];
        want[c] = (float)((double)db[c] + sum);
    }
    ck_assert_int_eq(bias_bwd(be, db, dy, rows, cols), LUNA_OK);
    for (int c = 0; c < cols; c++)
        ck_assert_msg(db[c] == want[c], "column %d: %.9g, plain sum %.9g", c, db[c], want[c]);
    free(dy);
    free(db);
    free(want);
    luna_backend_free(be);
}
END_TEST

/* Backward results with 1 and 2 threads are bit-identical (shapes large enough that both the
 * OpenMP regions and OpenBLAS actually use 2 threads). */
START_TEST(backward_bit_identical_across_thread_counts) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 77);
    const int rows = 515, in = 257, out = 259;
    float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1, 1),
          *W = luna_test_random_vector(&rng, (size_t)out * in, -1, 1);
    float *dy = luna_test_random_vector(&rng, (size_t)rows * out, -1, 1);
    float *dx[2], *dW[2], *db[2], *db2[2];
    for (int t = 0; t < 2; t++) {
        lh_set_threads(be, 2 - t);
        dx[t] = luna_test_zeros((size_t)rows * in);
        dW[t] = luna_test_zeros((size_t)out * in);
        db[t] = luna_test_zeros(out);
        db2[t] = luna_test_zeros(out);
        ck_assert_int_eq(linear_bwd(be, dx[t], dW[t], db[t], dy, x, W, rows, in, out, false),
                         LUNA_OK);
        ck_assert_int_eq(bias_bwd(be, db2[t], dy, rows, out), LUNA_OK);
    }
    ck_assert_int_eq(memcmp(dx[0], dx[1], sizeof(float) * rows * in), 0);
    ck_assert_int_eq(memcmp(dW[0], dW[1], sizeof(float) * out * in), 0);
    ck_assert_int_eq(memcmp(db[0], db[1], sizeof(float) * out), 0);
    ck_assert_int_eq(memcmp(db2[0], db2[1], sizeof(float) * out), 0);
    ck_assert_int_eq(memcmp(db[0], db2[0], sizeof(float) * out), 0); /* the same column sums */
    for (int t = 0; t < 2; t++) {
        free(dx[t]);
        free(dW[t]);
        free(db[t]);
        free(db2[t]);
    }
    free(x);
    free(W);
    free(dy);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    const char *op;
    bool ta, tb, acc;
    int M, N, K, batch, rows, in, out;
    float alpha, beta;
} cmp_args;

/* gemm: d[0] A, d[1] B, d[2] C. linear: d[0] x, d[1] W, d[2] b, d[3] y / dy, d[4] dx, d[5] dW,
 * d[6] db. */
static luna_status cmp_run(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    const luna_ops *o = be->ops;
    if (!strcmp(a->op, "gemm")) {
        int lda = a->ta ? a->M : a->K, ldb = a->tb ? a->K : a->N;
        return o->gemm(be, a->ta, a->tb, a->M, a->N, a->K, a->alpha, d[0], lda,
                       (int64_t)a->M * a->K, d[1], ldb, (int64_t)a->K * a->N, a->beta, d[2], a->N,
                       (int64_t)a->M * a->N, a->batch);
    }
    if (!strcmp(a->op, "gemm_grid")) { /* heads: outer = batch sentences, inner = K heads of
                                        * M·N... see linear_ops_match_reference_backend */
        const int H = a->in, ld = a->out;
        const luna_grid_stride rows_a = {(int64_t)(a->ta ? a->K : a->M) * ld, a->ta ? a->M : a->K};
        const luna_grid_stride rows_b = {(int64_t)(a->tb ? a->N : a->K) * ld, a->tb ? a->K : a->N};
        const luna_grid_stride rows_c = {(int64_t)a->M * ld, a->N};
        return o->gemm_grid(be, a->ta, a->tb, a->M, a->N, a->K, a->alpha, d[0], ld, rows_a, d[1],
                            ld, rows_b, a->beta, d[2], ld, rows_c, a->batch, H);
    }
    if (!strcmp(a->op, "linear_forward"))
        return o->linear_forward(be, d[3], d[0], d[1], a->acc ? d[2] : NULL, a->rows, a->in,
                                 a->out);
    return o->linear_backward(be, d[4], d[5], d[6], d[3], d[0], d[1], a->rows, a->in, a->out,
                              a->acc); /* "linear_backward" */
}

static float *cmp_vec(uint64_t seed, size_t n) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    return luna_test_random_vector(&rng, n, -1.0f, 1.0f);
}

START_TEST(linear_ops_match_reference_backend) {
    const int shapes[][4] = {{1, 1, 1, 1}, {7, 13, 5, 3}, {33, 17, 65, 1}, {13, 9, 200, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int M = shapes[k][0], N = shapes[k][1], K = shapes[k][2], batch = shapes[k][3];
        size_t na = (size_t)M * K * batch, nb = (size_t)K * N * batch, nc = (size_t)M * N * batch;
        float *A = cmp_vec(10 + k, na), *B = cmp_vec(20 + k, nb), *C = cmp_vec(30 + k, nc);
        for (int t = 0; t < 4; t++) {
            cmp_args a = {"gemm", t & 1, t >> 1, false,        M, N, K, batch, 0,
                          0,      0,     0.5f,   t ? 0.25f : 0};
            lh_buf bufs[] = {
                {A, na, LH_F32, LH_IN}, {B, nb, LH_F32, LH_IN}, {C, nc, LH_F32, LH_OUT}};
            char what[64];
            snprintf(what, sizeof what, "M %d N %d K %d batch %d trans %d", M, N, K, batch, t);
            ck_assert_int_eq(lh_compare("gemm", what, 2, cmp_run, &a, bufs, 3), LUNA_OK);
        }
        free(A);
        free(B);
        free(C);
    }
    /* gemm_grid: `batch` sentences × H heads side by side in rows of ld (padding after them) */
    const int gshapes[][5] = {{1, 1, 1, 1, 1}, {7, 6, 5, 3, 4}, {5, 8, 33, 2, 3}, {4, 5, 6, 1, 3}};
    for (size_t k = 0; k < sizeof gshapes / sizeof gshapes[0]; k++) {
        const int M = gshapes[k][0], N = gshapes[k][1], K = gshapes[k][2], batch = gshapes[k][3];
        const int H = gshapes[k][4];
        for (int t = 0; t < 4; t++) {
            const bool ta = t & 1, tb = t >> 1;
            const int wa = ta ? M : K, wb = tb ? K : N, ra = ta ? K : M, rb = tb ? N : K;
            int ld = H * (wa > wb ? (wa > N ? wa : N) : (wb > N ? wb : N)) + 2;
            size_t na = (size_t)batch * ra * ld, nb = (size_t)batch * rb * ld;
            size_t nc = (size_t)batch * M * ld;
            float *A = cmp_vec(110 + k, na), *B = cmp_vec(120 + k, nb), *C = cmp_vec(130 + k, nc);
            cmp_args a = {"gemm_grid", ta, tb,   false,        M, N, K, batch, 0,
                          H,           ld, 0.5f, t ? 0.25f : 0};
            lh_buf bufs[] = {
                {A, na, LH_F32, LH_IN}, {B, nb, LH_F32, LH_IN}, {C, nc, LH_F32, LH_OUT}};
            char what[80];
            snprintf(what, sizeof what, "M %d N %d K %d batch %d x %d heads trans %d", M, N, K,
                     batch, H, t);
            ck_assert_int_eq(lh_compare("gemm_grid", what, 2, cmp_run, &a, bufs, 3), LUNA_OK);
            free(A);
            free(B);
            free(C);
        }
    }
    /* in = 0: the bias alone (y = b; db += Σ_rows dy) */
    const int lshapes[][3] = {{1, 1, 1}, {7, 13, 5}, {37, 13, 29}, {130, 65, 17}, {70, 0, 33}};
    for (size_t k = 0; k < sizeof lshapes / sizeof lshapes[0]; k++) {
        int rows = lshapes[k][0], in = lshapes[k][1], out = lshapes[k][2];
        size_t nx = in ? (size_t)rows * in : 1, nw = in ? (size_t)out * in : 1; /* in = 0: unread */
        size_t ny = (size_t)rows * out;
        float *x = cmp_vec(40 + k, nx), *W = cmp_vec(50 + k, nw), *b = cmp_vec(60 + k, (size_t)out);
        float *y = cmp_vec(70 + k, ny), *dx = cmp_vec(80 + k, nx), *dW = cmp_vec(90 + k, nw);
        float *db = cmp_vec(100 + k, (size_t)out);
        static const char *const ops[] = {"linear_forward", "linear_backward"};
        for (size_t i = 0; i < 2; i++)
            for (int acc = 0; acc < 2; acc++) {
                cmp_args a = {ops[i], false, false, acc, 0, 0, 0, 0, rows, in, out, 0, 0};
                lh_buf lin[] = {
                    {x, nx, LH_F32, LH_IN},           {W, nw, LH_F32, LH_IN},
                    {b, (size_t)out, LH_F32, LH_IN},  {y, ny, LH_F32, i ? LH_IN : LH_OUT},
                    {dx, nx, LH_F32, LH_OUT},         {dW, nw, LH_F32, LH_OUT},
                    {db, (size_t)out, LH_F32, LH_OUT}};
                char what[64];
                snprintf(what, sizeof what, "rows %d in %d out %d %s", rows, in, out,
                         acc ? "bias/accumulate" : "");
                ck_assert_int_eq(lh_compare(ops[i], what, 2, cmp_run, &a, lin, 7), LUNA_OK);
            }
        free(x);
        free(W);
        free(b);
        free(y);
        free(dx);
        free(dW);
        free(db);
    }
}
END_TEST

static Suite *linear_suite(void) {
    Suite *s = suite_create("ops_linear");
    TCase *tc = tcase_create("gemm_linear_bias");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gemm_matches_naive_all_transposes);
    tcase_add_test(tc, gemm_batch_threads_bit_identical);
    tcase_add_test(tc, gemm_interleaved_and_shared_outputs);
    tcase_add_test(tc, gemm_rejects_bad_arguments);
    tcase_add_test(tc, gemm_grid_is_the_products_one_by_one);
    tcase_add_test(tc, linear_forward_matches_naive);
    tcase_add_test(tc, linear_gradients_match_finite_differences);
    tcase_add_test(tc, linear_backward_accumulation_semantics);
    tcase_add_test(tc, bias_gradient_and_accumulation);
    tcase_add_test(tc, bias_gradient_counts_every_row_of_many_chunks);
    tcase_add_test(tc, backward_bit_identical_across_thread_counts);
    tcase_add_test(tc, linear_ops_match_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(linear_suite()); }
