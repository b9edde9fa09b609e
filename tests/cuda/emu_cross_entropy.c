/* The CUDA cross-entropy kernels (model/kernels/cuda/cross_entropy.cu) under the harness against
 * the CPU backend: loss, nll and lse (ACCUM: 1e-5 relative) of the forward and of the
 * forward-backward kernel, and its dlogits (NORM: 1e-6, here 2e-6 since the two sides' exp differ
 * by up to 2 ulp each) for V = 1, 7, 1000 and 7792 with label smoothing 0 and 0.1, pad rows,
 * gradient scale, in place (dlogits = logits); bf16 logits within bf16 rounding; −inf and NaN
 * logits; a target outside the vocabulary gives NaN and the device flag. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static void check(luna_backend *cpu, int N, int V, float eps, int bf16) {
    const int pad = 1;
    const int64_t n = (int64_t)N * V;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(N * 7 + V));
    float *z = luna_test_random_vector(&rng, (size_t)n, -6.0f, 6.0f);
    int32_t *y = malloc(4 * (size_t)N);
    for (int r = 0; r < N; r++)
        y[r] = r % 4 == 3 ? pad : (r * 7 + 2) % V;
    void *dz;
    if (bf16) {
        uint16_t *h = malloc(2 * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            h[i] = to_bf16(z[i]), z[i] = from_bf16(h[i]);
        dz = dev(h, 2 * (size_t)n);
        free(h);
    } else {
        dz = dev(z, 4 * (size_t)n);
    }
    int32_t *dy = dev(y, 4 * (size_t)N);
    float loss[64], nll[64], lse[64], gl[64], gn[64], ge[64];
    LUNA_CHECK_OK(cpu->ops->cross_entropy_forward(cpu, loss, nll, lse, z, y, N, V, eps, pad));
    float *dloss = dev(NULL, 4 * N), *dnll = dev(NULL, 4 * N), *dlse = dev(NULL, 4 * N);
    ck_assert_int_eq(
        luna_cuda_cross_entropy_forward(0, bf16, dloss, dnll, dlse, dz, dy, N, V, eps, pad, NULL),
        cudaSuccess);
    down(gl, dloss, 4 * N), down(gn, dnll, 4 * N), down(ge, dlse, 4 * N);
    char what[80];
    snprintf(what, sizeof what, "cross_entropy N %d V %d eps %g %s", N, V, (double)eps,
             bf16 ? "bf16" : "fp32");
    close_enough(loss, gl, N, 1e-5, what);
    close_enough(nll, gn, N, 1e-5, what);
    close_enough(lse, ge, N, 1e-5, what);
    /* forward and gradient in one kernel, the gradient in place over the logits */
    float *grad = malloc(4 * (size_t)n), *got = malloc(4 * (size_t)n);
    LUNA_CHECK_OK(cpu->ops->cross_entropy_forward_backward(cpu, loss, nll, lse, grad, z, y, N, V,
                                                           eps, pad, 0.5f));
    ck_assert_int_eq(luna_cuda_cross_entropy_forward_backward(0, bf16, dloss, dnll, dlse, dz, dz,
                                                              dy, N, V, eps, pad, 0.5f),
                     cudaSuccess);
    down(gl, dloss, 4 * N), down(gn, dnll, 4 * N), down(ge, dlse, 4 * N);
    close_enough(loss, gl, N, 1e-5, what);
    close_enough(nll, gn, N, 1e-5, what);
    close_enough(lse, ge, N, 1e-5, what);
    if (bf16) {
        uint16_t *h = malloc(2 * (size_t)n);
        down(h, dz, 2 * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            got[i] = from_bf16(h[i]), grad[i] = from_bf16(to_bf16(grad[i]));
        free(h);
        close_enough(grad, got, n, 1.0 / 128, what);
    } else {
        down(got, dz, 4 * (size_t)n);
        close_enough(grad, got, n, 2e-6, what);
    }
    cudaFree(dz), cudaFree(dy), cudaFree(dloss), cudaFree(dnll), cudaFree(dlse);
    free(z), free(y), free(grad), free(got);
}

START_TEST(cross_entropy_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    const int shapes[][2] = {{4, 1}, {9, 7}, {13, 1000}, {6, 7792}};
    for (int k = 0; k < 4; k++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            check(cpu, shapes[k][0], shapes[k][1], 0.0f, bf16);
            check(cpu, shapes[k][0], shapes[k][1], 0.1f, bf16);
        }
    /* a target outside the vocabulary */
    float z[6] = {1, 2, 3, 4, 5, 6}, out[2];
    int32_t y[2] = {2, 9};
    int zero = 0, flag = 0;
    float *dz = dev(z, sizeof z), *dl = dev(NULL, 8), *dn = dev(NULL, 8), *de = dev(NULL, 8);
    int32_t *dy = dev(y, sizeof y);
    int *dbad = dev(&zero, sizeof zero);
    ck_assert_int_eq(luna_cuda_cross_entropy_forward(0, 0, dl, dn, de, dz, dy, 2, 3, 0.1f, 1, dbad),
                     cudaSuccess);
    down(out, dl, 8), down(&flag, dbad, sizeof flag);
    ck_assert(!isnan(out[0]) && isnan(out[1]) && flag == 1);
    cudaFree(dz), cudaFree(dl), cudaFree(dn), cudaFree(de), cudaFree(dy), cudaFree(dbad);
    luna_backend_free(cpu);
}
END_TEST

/* The one-pass row sums keep each thread's own max: −inf logits (whole threads' shares of a row
 * among them) add nothing to Σ exp, a NaN logit makes the row NaN, an increasing row rescales
 * every group; loss, nll and lse as the CPU's. */
START_TEST(special_logits_match_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    enum { N = 4, V = 1000 };
    float *z = malloc(sizeof(float) * N * V);
    for (int r = 0; r < N; r++)
        for (int v = 0; v < V; v++)
            z[r * V + v] = r == 3 ? 0.01f * (float)v : (float)((v * 37 + r) % 23) * 0.25f;
    for (int v = 0; v < 512; v++) /* threads 0 .. 63 hold only −inf */
        z[v] = -INFINITY;
    z[V + 700] = NAN;
    int32_t y[N] = {600, 3, 10, 999};
    float loss[N], nll[N], lse[N], gl[N], gn[N], ge[N];
    LUNA_CHECK_OK(cpu->ops->cross_entropy_forward(cpu, loss, nll, lse, z, y, N, V, 0.0f, -1));
    float *dz = dev(z, sizeof(float) * N * V), *dl = dev(NULL, sizeof gl),
          *dn = dev(NULL, sizeof gn), *de = dev(NULL, sizeof ge);
    int32_t *dy = dev(y, sizeof y);
    ck_assert_int_eq(
        luna_cuda_cross_entropy_forward(0, 0, dl, dn, de, dz, dy, N, V, 0.0f, -1, NULL),
        cudaSuccess);
    down(gl, dl, sizeof gl), down(gn, dn, sizeof gn), down(ge, de, sizeof ge);
    /* row 0's lse and nll are finite (its loss is not: Σ z = −inf, and 0·inf in the smoothing) */
    ck_assert(isfinite(lse[0]) && isfinite(nll[0]) && isnan(lse[1]) && isfinite(loss[2]));
    close_enough(loss, gl, N, 1e-5, "special logits: loss");
    close_enough(nll, gn, N, 1e-5, "special logits: nll");
    close_enough(lse, ge, N, 1e-5, "special logits: lse");
    cudaFree(dz), cudaFree(dl), cudaFree(dn), cudaFree(de), cudaFree(dy);
    free(z);
    luna_backend_free(cpu);
}
END_TEST

static Suite *ce_suite(void) {
    Suite *s = suite_create("cuda_cross_entropy");
    TCase *tc = tcase_create("cross_entropy");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, cross_entropy_matches_cpu);
    tcase_add_test(tc, special_logits_match_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(ce_suite()); }
