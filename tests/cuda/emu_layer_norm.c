/* The CUDA LayerNorm kernels (model/kernels/cuda/layer_norm.cu) under the CPU execution harness
 * against the CPU backend's layer_norm_forward / layer_norm_backward: d from 1 to 1031 (partial
 * and multiple passes per thread), 1 to 300 rows, in-place backward (dx = dy), dγ/dβ accumulated
 * onto non-zero values and each one alone (the other NULL). fp32: y, mean, rstd, dx within NORM
 * (1e-6 relative to max(1, |value|)); dγ, dβ bit-equal (same order as the CPU); bf16: within one
 * bf16 ulp of the CPU on the rounded inputs (dγ/dβ within 1e-6: fp32 sums of bf16 inputs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

/* Upload activations as fp32 or bf16 (rounding the host copy in place for bf16). */
static void *upload_act(float *h, int64_t n, int bf16) {
    if (!bf16) return dev(h, 4 * (size_t)n);
    uint16_t *b = malloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        b[i] = to_bf16(h[i]), h[i] = from_bf16(b[i]);
    void *d = dev(b, 2 * (size_t)n);
    free(b);
    return d;
}
static void download_act(float *h, const void *d, int64_t n, int bf16) {
    if (!bf16) {
        down(h, d, 4 * (size_t)n);
        return;
    }
    uint16_t *b = malloc(2 * (size_t)n);
    down(b, d, 2 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        h[i] = from_bf16(b[i]);
    free(b);
}
static void round_bf16(float *h, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        h[i] = from_bf16(to_bf16(h[i]));
}

static void check(luna_backend *cpu, int rows, int d, int bf16, int which /* 3 both, 1 γ, 2 β */) {
    const int64_t n = (int64_t)rows * d;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 1009 + d));
    float *x = luna_test_random_vector(&rng, (size_t)n, -3.0f, 5.0f);
    float *dy = luna_test_random_vector(&rng, (size_t)n, -1.0f, 1.0f);
    float *gamma = luna_test_random_vector(&rng, (size_t)d, 0.5f, 1.5f);
    float *beta = luna_test_random_vector(&rng, (size_t)d, -0.5f, 0.5f);
    float *dg = luna_test_random_vector(&rng, (size_t)d, -1.0f, 1.0f);
    float *db = luna_test_random_vector(&rng, (size_t)d, -1.0f, 1.0f);
    void *dxv = upload_act(x, n, bf16), *ddy = upload_act(dy, n, bf16);
    const size_t es = bf16 ? 2 : 4;
    float *y = malloc(4 * n), *mean = malloc(4 * rows), *rstd = malloc(4 * rows);
    float *got = malloc(4 * n), *gm = malloc(4 * rows), *gr = malloc(4 * rows);
    float *dgamma = dev(gamma, 4 * d), *dbeta = dev(beta, 4 * d);
    void *dyout = dev(NULL, es * n);
    float *dmean = dev(NULL, 4 * rows), *drstd = dev(NULL, 4 * rows);
    LUNA_CHECK_OK(cpu->ops->layer_norm_forward(cpu, y, mean, rstd, x, gamma, beta, rows, d, 1e-5f));
    ck_assert_int_eq(luna_cuda_layer_norm_forward(0, bf16, dyout, dmean, drstd, dxv, dgamma, dbeta,
                                                  rows, d, 1e-5f),
                     cudaSuccess);
    char what[96];
    snprintf(what, sizeof what, "layer_norm %s rows %d d %d", bf16 ? "bf16" : "fp32", rows, d);
    download_act(got, dyout, n, bf16);
    down(gm, dmean, 4 * rows), down(gr, drstd, 4 * rows);
    if (bf16) round_bf16(y, n);
    close_enough(mean, gm, rows, 1e-6, what);
    close_enough(rstd, gr, rows, 1e-6, what);
    close_enough(y, got, n, bf16 ? 1.0 / 128 : 1e-6, what);
    /* backward, in place on dy, from the CPU's mean and rstd */
    float *cdg = malloc(4 * d), *cdb = malloc(4 * d), *dx = malloc(4 * n);
    memcpy(cdg, dg, 4 * d), memcpy(cdb, db, 4 * d);
    ck_assert_int_eq(cudaMemcpy(dmean, mean, 4 * rows, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(drstd, rstd, 4 * rows, cudaMemcpyHostToDevice), cudaSuccess);
    float *ddg = dev(dg, 4 * d), *ddb = dev(db, 4 * d);
    LUNA_CHECK_OK(cpu->ops->layer_norm_backward(cpu, dx, which & 1 ? cdg : NULL,
                                                which & 2 ? cdb : NULL, dy, x, mean, rstd, gamma,
                                                rows, d));
    luna_cuda_colsum_ws ws = colsum_ws(rows, d, 2, bf16); /* bf16: one chunk a round */
    ck_assert_int_eq(luna_cuda_layer_norm_backward(0, bf16, ddy, which & 1 ? ddg : NULL,
                                                   which & 2 ? ddb : NULL, ddy, dxv, dmean, drstd,
                                                   dgamma, rows, d, ws),
                     cudaSuccess);
    cudaFree(ws.p);
    download_act(got, ddy, n, bf16);
    if (bf16) round_bf16(dx, n);
    close_enough(dx, got, n, bf16 ? 1.0 / 64 : 1e-6, what);
    float *gg = malloc(4 * d);
    down(gg, ddg, 4 * d);
    ck_assert_msg(memcmp(gg, which & 1 ? cdg : dg, 4 * d) == 0, "%s: dgamma differs", what);
    down(gg, ddb, 4 * d);
    ck_assert_msg(memcmp(gg, which & 2 ? cdb : db, 4 * d) == 0, "%s: dbeta differs", what);
    cudaFree(dxv), cudaFree(ddy), cudaFree(dgamma), cudaFree(dbeta), cudaFree(dyout);
    cudaFree(dmean), cudaFree(drstd), cudaFree(ddg), cudaFree(ddb);
    free(x), free(dy), free(gamma), free(beta), free(dg), free(db), free(y), free(mean);
    free(rstd), free(got), free(gm), free(gr), free(cdg), free(cdb), free(dx), free(gg);
}

START_TEST(layer_norm_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    const int shapes[][2] = {{1, 1}, {3, 7}, {17, 128}, {5, 257}, {300, 64}, {2, 1031}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            check(cpu, shapes[i][0], shapes[i][1], bf16, 1 + (int)(i % 3));
    luna_backend_free(cpu);
}
END_TEST

static Suite *layer_norm_suite(void) {
    Suite *s = suite_create("cuda_layer_norm");
    TCase *tc = tcase_create("layer_norm");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, layer_norm_matches_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(layer_norm_suite()); }
