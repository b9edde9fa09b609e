/* The CUDA causal contraction (model/kernels/cuda/causal_contraction.cu) under the harness against
 * the CPU backend's op, on Luna's shapes and odd ones (G groups, n positions, p, q incl. 1 and
 * sizes not multiples of 4 or 32): forward and dx bit-equal (the same fused multiply-add chains;
 * this machine's CPU build has FMA), da and db within the ACCUM tier (the CPU reassociates those
 * dot products); bf16 within bf16 rounding of the CPU on rounded inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static void *up_act(float *h, size_t n, int bf16) { /* bf16: rounds h in place */
    if (!bf16) return dev(h, 4 * n);
    uint16_t *b = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        b[i] = to_bf16(h[i]), h[i] = from_bf16(b[i]);
    void *d = dev(b, 2 * n);
    free(b);
    return d;
}
static void down_act(float *h, const void *d, size_t n, int bf16) {
    if (!bf16) {
        ck_assert_int_eq(cudaMemcpy(h, d, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
        return;
    }
    uint16_t *b = malloc(2 * n);
    ck_assert_int_eq(cudaMemcpy(b, d, 2 * n, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        h[i] = from_bf16(b[i]);
    free(b);
}
/* |got − want| ≤ tol·(1 + |want|); tol 0: bit-equal */
static void compare(const float *want, const float *got, size_t n, double tol, int bf16,
                    const char *what) {
    for (size_t i = 0; i < n; i++) {
        const float w = bf16 ? from_bf16(to_bf16(want[i])) : want[i];
        const double t = bf16 ? 1.0 / 64 : tol;
        ck_assert_msg(t == 0.0 ? memcmp(&w, &got[i], 4) == 0
                               : fabs((double)got[i] - w) <= t * (1.0 + fabs((double)w)),
                      "%s: element %zu: CUDA %.9g, CPU %.9g", what, i, (double)got[i], (double)w);
    }
}

START_TEST(causal_contraction_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int shapes[][4] = {
        {1, 1, 1, 1}, {3, 5, 7, 2}, {4, 17, 16, 33}, {2, 40, 64, 16}, {5, 9, 3, 65}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int G = shapes[k][0], n = shapes[k][1], p = shapes[k][2], q = shapes[k][3];
            const size_t np = (size_t)G * n * p, nq = (size_t)G * n * q;
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 50 + k);
            float *x = luna_test_random_vector(&rng, np, -1.0f, 1.0f);
            float *a = luna_test_random_vector(&rng, np, -1.0f, 1.0f);
            float *b = luna_test_random_vector(&rng, nq, 0.0f, 1.0f);
            float *d = luna_test_random_vector(&rng, nq, -1.0f, 1.0f);
            void *dx_ = up_act(x, np, bf16), *da_ = up_act(a, np, bf16), *db_ = up_act(b, nq, bf16),
                 *dd_ = up_act(d, nq, bf16);
            const size_t es = bf16 ? 2 : 4;
            void *dout = dev(NULL, es * nq), *gx = dev(NULL, es * np), *ga = dev(NULL, es * np),
                 *gb = dev(NULL, es * nq);
            float *out = malloc(4 * nq), *got = malloc(4 * (np > nq ? np : nq));
            float *cx = malloc(4 * np), *ca = malloc(4 * np), *cb = malloc(4 * nq);
            char what[96];
            snprintf(what, sizeof what, "causal G %d n %d p %d q %d %s", G, n, p, q,
                     bf16 ? "bf16" : "fp32");
            LUNA_CHECK_OK(
                cpu->ops->causal_contraction_forward(cpu, out, x, a, b, G, n, p, q, 1.0f, NULL));
            ck_assert_int_eq(luna_cuda_causal_contraction_forward(0, bf16, dout, dx_, da_, db_, G,
                                                                  n, p, q, 1.0f, NULL),
                             cudaSuccess);
            down_act(got, dout, nq, bf16);
            compare(out, got, nq, 0.0, bf16, what);
            LUNA_CHECK_OK(cpu->ops->causal_contraction_backward(cpu, cx, ca, cb, d, x, a, b, G, n,
                                                                p, q, 1.0f, NULL));
            ck_assert_int_eq(luna_cuda_causal_contraction_backward(
                                 0, bf16, gx, ga, gb, dd_, dx_, da_, db_, G, n, p, q, 1.0f, NULL),
                             cudaSuccess);
            down_act(got, gx, np, bf16);
            compare(cx, got, np, 0.0, bf16, what);
            down_act(got, ga, np, bf16);
            compare(ca, got, np, 1e-5, bf16, what);
            down_act(got, gb, nq, bf16);
            compare(cb, got, nq, 1e-5, bf16, what);
            cudaFree(dx_), cudaFree(da_), cudaFree(db_), cudaFree(dd_), cudaFree(dout);
            cudaFree(gx), cudaFree(ga), cudaFree(gb);
            free(x), free(a), free(b), free(d), free(out), free(got), free(cx), free(ca), free(cb);
        }
    luna_backend_free(cpu);
}
END_TEST

static Suite *causal_suite(void) {
    Suite *s = suite_create("cuda_causal_contraction");
    TCase *tc = tcase_create("causal");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, causal_contraction_matches_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(causal_suite()); }
