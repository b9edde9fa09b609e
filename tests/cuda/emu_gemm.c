/* The CUDA backend's GEMM through cuBLASLt (model/kernels/cuda/gemm_lt.c) under the harness's
 * fake cuBLASLt (which checks leading dimensions, alignment, workspace and computes in double)
 * against the CPU backend's gemm and linear_forward: all four transpose combinations, sizes 1 and
 * odd, leading dimensions larger than the rows, strided batches, alpha/beta (beta = 0 with NaN
 * in C), K = 0, the bias epilogue as linear_forward's bias, plans made once and reused, grids of
 * attention heads (gemm_grid: pointer-array batches, the strided fallback). fp32 within
 * the ACCUM tier (1e-5 relative to the magnitude of the result); bf16 storage within bf16 rounding
 * of the result. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "luna_cuda_emu_api.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/device_runtime.h"
#include "model/kernels/cuda/gemm_lt.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

/* with_plans: the backend's way, GEMM plans made once and reused (gemm_lt.h); else a plan a call */
static luna_cuda_blas blas_create(bool with_plans) {
    luna_cuda_blas b = {.workspace_bytes = (size_t)4 << 20, .grid_pointers = true};
    ck_assert_int_eq(cublasLtCreate(&b.lt), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cudaMalloc(&b.workspace, b.workspace_bytes), cudaSuccess);
    if (with_plans) LUNA_CHECK_OK(luna_gemm_plans_create(&b.plans));
    return b;
}
static void blas_free(luna_cuda_blas *b) {
    luna_gemm_plans_free(b->plans);
    cublasLtDestroy(b->lt);
    cudaFree(b->workspace);
}

/* Σ_k |a|·|b| bound per element: |K|·max|A|·max|B| with inputs in [-1, 1] → K (+|beta C|). */
static void check_case(luna_backend *cpu, luna_cuda_blas *blas, int M, int N, int K, int ta, int tb,
                       int batch, int pad, float alpha, float beta) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const int64_t sa = (int64_t)(ta ? K : M) * lda + 3, sb = (int64_t)(tb ? N : K) * ldb + 1,
                  sc = (int64_t)M * ldc + 5;
    const size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(M * 7919 + N * 31 + K + ta * 2 + tb + batch * 101));
    float *A = luna_test_random_vector(&rng, na, -1.0f, 1.0f);
    float *B = luna_test_random_vector(&rng, nb, -1.0f, 1.0f);
    float *C = luna_test_random_vector(&rng, nc, -1.0f, 1.0f);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++)
            C[i] = NAN; /* beta = 0: C must not be read */
    float *dA = dev(A, 4 * na), *dB = dev(B, 4 * nb), *dC = dev(C, 4 * nc), *got = malloc(4 * nc);
    LUNA_CHECK_OK(cpu->ops->gemm(cpu, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc,
                                 sc, batch));
    LUNA_CHECK_OK(luna_cuda_gemm(blas, 0, 0, ta, tb, M, N, K, alpha, dA, lda, sa, dB, ldb, sb, beta,
                                 dC, ldc, sc, batch, NULL));
    down(got, dC, 4 * nc);
    const double tol = 1e-5 * ((double)K * fabs(alpha) + fabs(beta) + 1.0);
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                const size_t at = (size_t)(b * sc + (int64_t)i * ldc + j);
                ck_assert_msg(fabs(got[at] - C[at]) <= tol,
                              "gemm M %d N %d K %d ta %d tb %d batch %d: C[%d][%d][%d] = %.9g, "
                              "CPU %.9g",
                              M, N, K, ta, tb, batch, b, i, j, (double)got[at], (double)C[at]);
            }
    /* padding between rows and batches is untouched (C's NaN / random values stay) */
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < M; i++)
            for (int j = N; j < ldc; j++) {
                const size_t at = (size_t)(b * sc + (int64_t)i * ldc + j);
                ck_assert_msg(memcmp(&got[at], &C[at], 4) == 0, "gemm wrote padding at %zu", at);
            }
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    free(A), free(B), free(C), free(got);
}

/* Every case with a plan a call (pass 0), then twice with plans (passes 1, 2): the second pass
 * makes no plan and reuses one per call, and the results stay right (alpha/beta and the data are
 * not part of a plan; the two calls of a (shape, transposes) pair share one). */
START_TEST(gemm_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    luna_cuda_blas plain = blas_create(false), planned = blas_create(true);
    const int shapes[][5] = {{1, 1, 1, 1, 0},    {7, 13, 5, 1, 2},   {33, 17, 65, 3, 0},
                             {13, 9, 200, 2, 1}, {64, 48, 32, 1, 0}, {5, 3, 0, 2, 1}};
    int64_t made1 = 0, reused1 = 0, calls = 0;
    for (int pass = 0; pass < 3; pass++) {
        luna_cuda_blas *blas = pass == 0 ? &plain : &planned;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            for (int t = 0; t < 4; t++) {
                const int *s = shapes[k];
                check_case(cpu, blas, s[0], s[1], s[2], t & 1, t >> 1, s[3], s[4], 1.0f, 0.0f);
                check_case(cpu, blas, s[0], s[1], s[2], t & 1, t >> 1, s[3], s[4], 0.5f, 0.25f);
                calls += pass == 1 && s[2] > 0 ? 2 : 0; /* K = 0 makes no GEMM */
            }
        if (pass == 1) luna_gemm_plans_counts(planned.plans, &made1, &reused1);
    }
    int64_t made2, reused2;
    luna_gemm_plans_counts(planned.plans, &made2, &reused2);
    ck_assert_int_eq(made1 + reused1, calls);
    ck_assert_int_eq(made1, calls / 2); /* one plan per (shape, transposes) */
    ck_assert_int_eq(made2, made1);
    ck_assert_int_eq(reused2, reused1 + calls);
    blas_free(&plain);
    blas_free(&planned);
    luna_backend_free(cpu);
}
END_TEST

/* linear_forward y = x Wᵀ + b as the backend will call it: gemm(ta 0, tb 1) with the bias epilogue.
 */
START_TEST(bias_epilogue_is_linear_forward) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    luna_cuda_blas blas = blas_create(true);
    const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {37, 13, 29}, {130, 65, 17}};
    /* each shape twice, with other data and another bias: the second call reuses the plan and
     * must add its own bias, not the one the plan was made with */
    for (size_t k = 0; k < 8; k++) {
        const int rows = shapes[k % 4][0], in = shapes[k % 4][1], out = shapes[k % 4][2];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 40 + k);
        float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
        float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
        float *b = luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f);
        float *y = malloc(4 * (size_t)rows * out), *got = malloc(4 * (size_t)rows * out);
        LUNA_CHECK_OK(cpu->ops->linear_forward(cpu, y, x, W, b, rows, in, out));
        float *dx = dev(x, 4 * (size_t)rows * in), *dW = dev(W, 4 * (size_t)out * in);
        float *db = dev(b, 4 * (size_t)out), *dy = dev(NULL, 4 * (size_t)rows * out);
        LUNA_CHECK_OK(luna_cuda_gemm(&blas, 0, 0, false, true, rows, out, in, 1.0f, dx, in, 0, dW,
                                     in, 0, 0.0f, dy, out, 0, 1, db));
        down(got, dy, 4 * (size_t)rows * out);
        for (int64_t i = 0; i < (int64_t)rows * out; i++)
            ck_assert_msg(fabs(got[i] - y[i]) <= 1e-5 * (in + 2),
                          "linear rows %d in %d out %d: y[%lld] = %.9g, CPU %.9g", rows, in, out,
                          (long long)i, (double)got[i], (double)y[i]);
        cudaFree(dx), cudaFree(dW), cudaFree(db), cudaFree(dy);
        free(x), free(W), free(b), free(y), free(got);
    }
    int64_t made, reused;
    luna_gemm_plans_counts(blas.plans, &made, &reused);
    ck_assert_int_eq(made, 4);
    ck_assert_int_eq(reused, 4);
    /* a bad leading dimension is refused by cuBLASLt's checks, as a luna status — each time: a
     * plan that failed is not kept */
    float *d = dev(NULL, 4 * 64);
    for (int again = 0; again < 2; again++) {
        ck_assert_int_ne(luna_cuda_gemm(&blas, 0, 0, false, false, 4, 4, 4, 1.0f, d, 2, 0, d, 4, 0,
                                        0.0f, d, 4, 0, 1, NULL),
                         LUNA_OK);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "cuBLASLt"));
        luna_error_clear();
    }
    luna_gemm_plans_counts(blas.plans, &made, &reused);
    ck_assert_int_eq(made, 4);
    cudaFree(d);
    blas_free(&blas);
    luna_backend_free(cpu);
}
END_TEST

/* Grids of heads (core/backend.h gemm_grid) as attention makes them, B sentences × H heads of a
 * [B, len, H·dh] activation with padded rows: scores A_bh = Q_bh K_bhᵀ into packed [B, H, n, m]
 * and outputs O_bh = A_bh V_bh (+ beta·O) back into the heads' columns. With plans: cuBLASLt's
 * pointer-array batches, the pointer arrays filled by one launch the first time a grid is seen
 * and found after; without (plans NULL): one strided batch per head. Both against the CPU. */
static void check_grid(luna_backend *cpu, luna_cuda_blas *blas, int ta, float beta) {
    const int B = 3, H = 4, n = 5, m = 7, dh = 6, ld = H * dh + 3; /* 3 padding columns */
    const int64_t nq = (int64_t)B * n * ld, nk = (int64_t)B * m * ld, ns = (int64_t)B * H * n * m;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(17 + ta));
    float *q = luna_test_random_vector(&rng, (size_t)nq, -1.0f, 1.0f);
    float *k = luna_test_random_vector(&rng, (size_t)nk, -1.0f, 1.0f);
    float *sc = luna_test_random_vector(&rng, (size_t)ns, -1.0f, 1.0f);
    float *o = luna_test_random_vector(&rng, (size_t)nq, -1.0f, 1.0f);
    float *got = malloc(4 * (size_t)(nq > ns ? nq : ns));
    float *dq = dev(q, 4 * (size_t)nq), *dk = dev(k, 4 * (size_t)nk), *ds = dev(sc, 4 * (size_t)ns);
    float *dout = dev(o, 4 * (size_t)nq);
    const luna_grid_stride heads_n = {(int64_t)n * ld, dh}, heads_m = {(int64_t)m * ld, dh};
    const luna_grid_stride packed = {(int64_t)H * n * m, (int64_t)n * m};
    /* scores: S_bh [n, m] = 1/8 · Q_bh K_bhᵀ */
    LUNA_CHECK_OK(cpu->ops->gemm_grid(cpu, false, true, n, m, dh, 0.125f, q, ld, heads_n, k, ld,
                                      heads_m, 0.0f, sc, m, packed, B, H));
    LUNA_CHECK_OK(luna_cuda_gemm_grid(blas, 0, 0, false, true, n, m, dh, 0.125f, dq, ld, heads_n,
                                      dk, ld, heads_m, 0.0f, ds, m, packed, B, H));
    down(got, ds, 4 * (size_t)ns);
    for (int64_t i = 0; i < ns; i++)
        ck_assert_msg(fabs(got[i] - sc[i]) <= 1e-5 * (dh + 1), "scores[%lld] = %.9g, CPU %.9g",
                      (long long)i, (double)got[i], (double)sc[i]);
    /* outputs: O_bh [n, dh] = 1/2 · op(S_bh) K_bh + beta · O_bh, op(S_bh) [n, m] (S_bh read as
     * stored [m, n] when ta), into the heads' columns of O */
    const int lda = ta ? n : m, ldb = ld;
    LUNA_CHECK_OK(cpu->ops->gemm_grid(cpu, ta, false, n, dh, m, 0.5f, sc, lda, packed, k, ldb,
                                      heads_m, beta, o, ld, heads_n, B, H));
    LUNA_CHECK_OK(luna_cuda_gemm_grid(blas, 0, 0, ta, false, n, dh, m, 0.5f, ds, lda, packed, dk,
                                      ldb, heads_m, beta, dout, ld, heads_n, B, H));
    down(got, dout, 4 * (size_t)nq);
    for (int64_t i = 0; i < nq; i++) {
        const bool head_col = i % ld < H * dh;
        if (head_col)
            ck_assert_msg(fabs(got[i] - o[i]) <= 1e-5 * (m + 2), "out[%lld] = %.9g, CPU %.9g",
                          (long long)i, (double)got[i], (double)o[i]);
        else /* padding columns untouched */
            ck_assert_msg(memcmp(&got[i], &o[i], 4) == 0, "grid wrote padding at %lld",
                          (long long)i);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(ds), cudaFree(dout);
    free(q), free(k), free(sc), free(o), free(got);
}

START_TEST(grid_gemm_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    luna_cuda_blas plain = blas_create(false), planned = blas_create(true);
    for (int t = 0; t < 2; t++) {
        check_grid(cpu, &plain, t, 0.0f);
        check_grid(cpu, &plain, t, 0.25f);
    }
    int64_t fills, hits, no_plan, made, reused;
    luna_gemm_plans_pointer_counts(plain.plans, &fills, &hits, &no_plan);
    ck_assert_int_eq(fills + hits, 0); /* no plans: the strided fallback */
    for (int again = 0; again < 2; again++)
        for (int t = 0; t < 2; t++)
            check_grid(cpu, &planned, t, 0.25f);
    luna_gemm_plans_pointer_counts(planned.plans, &fills, &hits, &no_plan);
    ck_assert_int_eq(no_plan, 0);
    /* LUNA_CUDA_GRID=strided: plans, but the grids as strided batches per inner index */
    luna_cuda_blas strided = blas_create(true);
    strided.grid_pointers = false;
    for (int t = 0; t < 2; t++)
        check_grid(cpu, &strided, t, 0.25f);
    int64_t s_fills, s_hits, s_no_plan;
    luna_gemm_plans_pointer_counts(strided.plans, &s_fills, &s_hits, &s_no_plan);
    ck_assert_int_eq(s_fills + s_hits + s_no_plan, 0);
    blas_free(&strided);
    luna_gemm_plans_counts(planned.plans, &made, &reused);
    /* 2 grids a case (scores, outputs) × 2 cases × 2 rounds; every buffer is new each call (new
     * addresses: a fill) unless the allocator hands the same back (a hit) — together 8 calls */
    ck_assert_int_eq(fills + hits, 8);
    ck_assert_int_ge(fills, 1);
    ck_assert_int_eq(made + reused, 8);
    ck_assert_int_eq(made, 3); /* scores (one shape), outputs with ta 0 and ta 1 */
    blas_free(&plain);
    blas_free(&planned);
    luna_backend_free(cpu);
}
END_TEST

/* The same grid twice at the same addresses: the second call finds its pointer array. */
START_TEST(grid_pointer_arrays_are_kept) {
    luna_cuda_blas blas = blas_create(true);
    const int B = 2, H = 3, n = 4, dh = 8, ld = H * dh;
    float *zeros = calloc((size_t)B * n * ld, 4);
    float *x = dev(zeros, 4 * (size_t)B * n * ld), *s = dev(NULL, 4 * (size_t)B * H * n * n);
    free(zeros);
    const luna_grid_stride hx = {(int64_t)n * ld, dh}, hs = {(int64_t)H * n * n, (int64_t)n * n};
    int64_t fills, hits, no_plan;
    for (int call = 0; call < 3; call++)
        LUNA_CHECK_OK(luna_cuda_gemm_grid(&blas, 0, 0, false, true, n, n, dh, 1.0f, x, ld, hx, x,
                                          ld, hx, 0.0f, s, n, hs, B, H));
    luna_gemm_plans_pointer_counts(blas.plans, &fills, &hits, &no_plan);
    ck_assert_int_eq(fills, 1);
    ck_assert_int_eq(hits, 2);
    cudaFree(x), cudaFree(s);
    blas_free(&blas);
}
END_TEST

/* A cuBLASLt whose heuristic has no pointer-array algorithm (the harness's knob): grids still
 * match the CPU through the per-head strided batches, the missing plan is asked for once per
 * shape and remembered, and no pointer array is filled. */
START_TEST(grid_falls_back_without_pointer_arrays) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    luna_cuda_blas blas = blas_create(true);
    luna_emu_cublaslt_refuse_pointer_arrays(true);
    for (int again = 0; again < 2; again++)
        for (int t = 0; t < 2; t++)
            check_grid(cpu, &blas, t, 0.25f);
    luna_emu_cublaslt_refuse_pointer_arrays(false);
    int64_t fills, hits, no_plan;
    luna_gemm_plans_pointer_counts(blas.plans, &fills, &hits, &no_plan);
    ck_assert_int_eq(no_plan, 3); /* the three grid shapes, each once */
    ck_assert_int_eq(fills, 0);   /* the plan comes first: no pointer array is filled */
    ck_assert_int_eq(hits, 0);
    blas_free(&blas);
    luna_backend_free(cpu);
}
END_TEST

static Suite *gemm_suite(void) {
    Suite *s = suite_create("cuda_gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gemm_matches_cpu);
    tcase_add_test(tc, bias_epilogue_is_linear_forward);
    tcase_add_test(tc, grid_gemm_matches_cpu);
    tcase_add_test(tc, grid_pointer_arrays_are_kept);
    tcase_add_test(tc, grid_falls_back_without_pointer_arrays);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(gemm_suite()); }
