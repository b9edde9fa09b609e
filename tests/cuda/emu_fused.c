/* The CUDA fused kernels (model/kernels/cuda/fused.cu) under the CPU execution harness against the
 * CPU backend's fused ops (equal bit for bit to the composition of their steps:
 * tests/test_ops_fused.c),
 * fp32 and bf16: odd shapes, p 0 and 0.1, bias or not, softmax masks and the causal period,
 * dx == dyd. fp32 within the NORM tier (1e-6; the elementwise outputs exactly agree); bf16 within
 * a few bf16 ulps of the CPU computed from the bf16-rounded inputs (the activation outputs; the
 * fp32 parameter gradients are compared in fp32 by test_ops_fused). Run in three thread orders by
 * CTest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static luna_rng_key key(int salt) {
    luna_rng_key k = {.seed = 99, .step = 3, .stream_id = (uint32_t)salt};
    return k;
}

/* Host activations as the device stores them: x rounded in place (bf16) and the device copy. */
static void *up(float *x, int64_t n, int bf16) {
    if (!bf16) return dev(x, 4 * (size_t)n);
    uint16_t *h = malloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        h[i] = to_bf16(x[i]), x[i] = from_bf16(h[i]);
    void *d = dev(h, 2 * (size_t)n);
    free(h);
    return d;
}
/* A device activation buffer back as fp32. */
static float *fetch(const void *d, int64_t n, int bf16) {
    float *out = malloc(4 * (size_t)n);
    if (!bf16) {
        down(out, d, 4 * (size_t)n);
        return out;
    }
    uint16_t *h = malloc(2 * (size_t)n);
    down(h, d, 2 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        out[i] = from_bf16(h[i]);
    free(h);
    return out;
}
static void near(const float *want, const void *d, int64_t n, int bf16, double tol_bf16,
                 const char *what) {
    float *got = fetch(d, n, bf16);
    close_enough(want, got, n, bf16 ? tol_bf16 : 1e-6, what);
    free(got);
}

static void residual_norm(luna_backend *cpu, int rows, int d, float p, bool with_bias, int bf16) {
    const int64_t n = (int64_t)rows * d;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 31 + d));
    float *sub = luna_test_random_vector(&rng, (size_t)n, -2, 2);
    float *res = luna_test_random_vector(&rng, (size_t)n, -1, 3);
    float *dy = luna_test_random_vector(&rng, (size_t)n, -1, 1);
    float *bias = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    float *g = luna_test_random_vector(&rng, (size_t)d, 0.5f, 1.5f);
    float *b = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    void *dsub = up(sub, n, bf16), *dres_in = up(res, n, bf16), *ddy = up(dy, n, bf16);
    float *dbias = dev(bias, 4 * (size_t)d), *dg = dev(g, 4 * (size_t)d),
          *db = dev(b, 4 * (size_t)d);
    const size_t es = bf16 ? 2 : 4;
    void *dy_out = dev(NULL, es * n), *dr = dev(NULL, es * n);
    float *dmean = dev(NULL, 4 * (size_t)rows), *drstd = dev(NULL, 4 * (size_t)rows);
    float *y = malloc(4 * n), *r = malloc(4 * n), *mean = malloc(4 * rows),
          *rstd = malloc(4 * rows);
    const float *bp = with_bias ? bias : NULL;
    LUNA_CHECK_OK(cpu->ops->residual_norm_forward(cpu, y, r, mean, rstd, sub, bp, res, g, b, rows,
                                                  d, 1e-5f, p, key(d)));
    ck_assert_int_eq(luna_cuda_residual_norm_forward(0, bf16, dy_out, dr, dmean, drstd, dsub,
                                                     with_bias ? dbias : NULL, dres_in, dg, db,
                                                     rows, d, 1e-5f, p, key(d)),
                     cudaSuccess);
    char what[96];
    snprintf(what, sizeof what, "residual_norm_forward %s rows %d d %d p %g%s",
             bf16 ? "bf16" : "fp32", rows, d, (double)p, with_bias ? " bias" : "");
    near(r, dr, n, bf16, 1.0 / 128, what);
    near(y, dy_out, n, bf16, 1.0 / 16, what);
    /* backward from the device's kept r and statistics (the CPU gets the same values) */
    float *rk = fetch(dr, n, bf16);
    down(mean, dmean, 4 * (size_t)rows);
    down(rstd, drstd, 4 * (size_t)rows);
    float *acc = calloc(3 * (size_t)d, 4), *dacc = dev(acc, 12 * (size_t)d);
    float *dres = malloc(4 * n), *dsb = malloc(4 * n);
    LUNA_CHECK_OK(cpu->ops->residual_norm_backward(cpu, dres, dsb, bp ? acc + 2 * d : NULL, acc,
                                                   acc + d, dy, rk, mean, rstd, g, rows, d, p,
                                                   key(d)));
    void *ddres = dev(NULL, es * n), *ddsub = dev(NULL, es * n);
    /* the launchers' workspace, or one chunk a round (bf16 xor bias) */
    luna_cuda_colsum_ws ws = colsum_ws(rows, d, 2, bf16 ^ (int)with_bias);
    ck_assert_int_eq(luna_cuda_residual_norm_backward(
                         0, bf16, ddres, ddsub, with_bias ? dacc + 2 * d : NULL, dacc, dacc + d,
                         ddy, dr, dmean, drstd, dg, rows, d, p, key(d), ws),
                     cudaSuccess);
    cudaFree(ws.p);
    snprintf(what, sizeof what, "residual_norm_backward %s rows %d d %d p %g%s",
             bf16 ? "bf16" : "fp32", rows, d, (double)p, with_bias ? " bias" : "");
    near(dres, ddres, n, bf16, 1.0 / 64, what);
    near(dsb, ddsub, n, bf16, 1.0 / 32, what);
    if (!bf16) {
        float *got = malloc(12 * (size_t)d);
        down(got, dacc, 12 * (size_t)d);
        close_enough(acc, got, 3 * (int64_t)d, 1e-5, what);
        free(got);
    }
    void *dv[] = {dsub, dres_in, ddy, dbias, dg, db, dy_out, dr, dmean, drstd, dacc, ddres, ddsub};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
        cudaFree(dv[i]);
    void *hv[] = {sub, res, dy, bias, g, b, y, r, mean, rstd, rk, acc, dres, dsb};
    for (size_t i = 0; i < sizeof hv / sizeof hv[0]; i++)
        free(hv[i]);
}

static void bias_relu_dropout(luna_backend *cpu, int rows, int d, float p, bool with_bias,
                              int bf16) {
    const int64_t n = (int64_t)rows * d;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 37 + d));
    float *h = luna_test_random_vector(&rng, (size_t)n, -1, 1);
    float *da = luna_test_random_vector(&rng, (size_t)n, -1, 1);
    float *bias = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    void *dh = up(h, n, bf16), *dda = up(da, n, bf16);
    float *dbias = dev(bias, 4 * (size_t)d);
    const size_t es = bf16 ? 2 : 4;
    void *dact = dev(NULL, es * n);
    float *a = malloc(4 * n);
    const float *bp = with_bias ? bias : NULL;
    LUNA_CHECK_OK(cpu->ops->bias_relu_dropout_forward(cpu, a, h, bp, rows, d, p, key(d + 1)));
    ck_assert_int_eq(luna_cuda_bias_relu_dropout_forward(
                         0, bf16, dact, dh, with_bias ? dbias : NULL, rows, d, p, key(d + 1)),
                     cudaSuccess);
    char what[96];
    snprintf(what, sizeof what, "bias_relu_dropout %s rows %d d %d p %g%s", bf16 ? "bf16" : "fp32",
             rows, d, (double)p, with_bias ? " bias" : "");
    near(h, dh, n, bf16, 1.0 / 128, what);
    near(a, dact, n, bf16, 1.0 / 64, what);
    /* backward at the device's kept h, dh written over da */
    float *hk = fetch(dh, n, bf16), *db0 = calloc((size_t)d, 4), *ddb = dev(db0, 4 * (size_t)d);
    LUNA_CHECK_OK(cpu->ops->bias_relu_dropout_backward(cpu, da, bp ? db0 : NULL, da, hk, rows, d, p,
                                                       key(d + 1)));
    luna_cuda_colsum_ws ws = colsum_ws(rows, d, 1, bf16 ^ (int)with_bias);
    ck_assert_int_eq(luna_cuda_bias_relu_dropout_backward(0, bf16, dda, with_bias ? ddb : NULL, dda,
                                                          dh, rows, d, p, key(d + 1), ws),
                     cudaSuccess);
    cudaFree(ws.p);
    near(da, dda, n, bf16, 1.0 / 64, what);
    if (!bf16) {
        float *got = malloc(4 * (size_t)d);
        down(got, ddb, 4 * (size_t)d);
        close_enough(db0, got, d, 1e-6, what);
        free(got);
    }
    cudaFree(dh), cudaFree(dda), cudaFree(dbias), cudaFree(dact), cudaFree(ddb);
    free(h), free(da), free(bias), free(a), free(hk), free(db0);
}

static void softmax_dropout(luna_backend *cpu, int rows, int cols, float p, int group, int causal,
                            int bf16) {
    const int64_t n = (int64_t)rows * cols;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 41 + cols));
    float *x = luna_test_random_vector(&rng, (size_t)n, -6, 6);
    float *dyd = luna_test_random_vector(&rng, (size_t)n, -1, 1);
    const int groups = (rows + group - 1) / group;
    int32_t *valid = malloc(sizeof(int32_t) * (size_t)groups);
    for (int g = 0; g < groups; g++)
        valid[g] = g == 1 ? 0 : (g * 7 + 3) % (cols + 1);
    int32_t *dvalid = dev(valid, sizeof(int32_t) * (size_t)groups);
    void *dx = up(x, n, bf16), *ddyd = up(dyd, n, bf16);
    const size_t es = bf16 ? 2 : 4;
    void *dy = dev(NULL, es * n), *dyd_out = dev(NULL, es * n);
    float *y = malloc(4 * n), *yd = malloc(4 * n);
    LUNA_CHECK_OK(cpu->ops->softmax_dropout_forward(cpu, y, yd, x, rows, cols, valid, group, causal,
                                                    p, key(cols + 2)));
    ck_assert_int_eq(luna_cuda_softmax_dropout_forward(0, bf16, dy, dyd_out, dx, rows, cols, dvalid,
                                                       group, causal, p, key(cols + 2)),
                     cudaSuccess);
    char what[96];
    snprintf(what, sizeof what, "softmax_dropout %s rows %d cols %d p %g group %d causal %d",
             bf16 ? "bf16" : "fp32", rows, cols, (double)p, group, causal);
    near(y, dy, n, bf16, 1.0 / 128, what);
    if (p > 0) near(yd, dyd_out, n, bf16, 1.0 / 64, what);
    /* backward at the device's kept y, dx written over dyd */
    float *yk = fetch(dy, n, bf16);
    LUNA_CHECK_OK(
        cpu->ops->softmax_dropout_backward(cpu, dyd, dyd, yk, rows, cols, p, key(cols + 2)));
    ck_assert_int_eq(
        luna_cuda_softmax_dropout_backward(0, bf16, ddyd, ddyd, dy, rows, cols, p, key(cols + 2)),
        cudaSuccess);
    near(dyd, ddyd, n, bf16, 1.0 / 64, what);
    cudaFree(dvalid), cudaFree(dx), cudaFree(ddyd), cudaFree(dy), cudaFree(dyd_out);
    free(x), free(dyd), free(valid), free(y), free(yd), free(yk);
}

START_TEST(fused_kernels_match_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    static const int shapes[][2] = {{1, 1},   {7, 5},    {33, 130},
                                    {3, 600}, {2, 1100}, /* 1100: a block per row */
                                    {150, 70},           /* 150: three chunks of column sums */
                                    {37, 32},   {9, 64},  {5, 128}, {11, 12}, /* 16-byte rows */
                                    {6, 512},   {3, 1024}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int v = 0; v < 2; v++) {
                const int rows = shapes[s][0], d = shapes[s][1];
                const float p = v ? 0.1f : 0.0f;
                residual_norm(cpu, rows, d, p, v == 1, bf16);
                bias_relu_dropout(cpu, rows, d, p, v == 1, bf16);
                softmax_dropout(cpu, rows, d, p, v ? 3 : 1, v ? 0 : 4, bf16);
            }
    luna_backend_free(cpu);
}
END_TEST

static Suite *fused_suite(void) {
    Suite *s = suite_create("cuda_fused");
    TCase *tc = tcase_create("fused");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, fused_kernels_match_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(fused_suite()); }
