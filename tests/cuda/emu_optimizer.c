/* The CUDA clipping and Adam kernels (model/kernels/cuda/optimizer.cu) under the harness against
 * the CPU backend's clip_coefficients, multi_scale and multi_adam_update: bit-equal coefficients
 * and summary (each/total, a non-finite norm, clip_norm 0, nothing clipped, non-finite loss sums
 * in also_finite), scaling by
 * coefficients and by one alpha, and three Adam steps with weight decay over a table with an
 * empty tensor, gaps and multi-block tensors (parameters, both moments and the step counters);
 * three Apollo steps for both rebounds and the three weight-decay types (θ, m, B, d, steps). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

START_TEST(clip_coefficients_bit_equal) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    float sets[][5] = {{1.0f, 4.0f, 0.25f, 100.0f, 0.0f},
                       {1e-3f, 2e-3f, 0.0f, 1e-4f, 5e-3f},
                       {1.0f, INFINITY, 2.0f, 3.0f, 4.0f},
                       {1.0f, NAN, 2.0f, 3.0f, 4.0f}};
    const double norms[] = {1.0, 0.0, 25.0};
    /* the loss sums the finite flag also covers: none, finite, an infinite loss, a NaN nll */
    const double also[][2] = {{0, 0}, {12.5, 3.25}, {INFINITY, 3.0}, {1.0, NAN}};
    for (int k = 0; k < 4; k++)
        for (int mode = 0; mode < 2; mode++)
            for (int c = 0; c < 3; c++)
                for (int a = 0; a < 4; a++) {
                    const int num_also = a == 0 ? 0 : 2;
                    float coef[5], gc[5];
                    double sum[3], gs[3];
                    LUNA_CHECK_OK(cpu->ops->clip_coefficients(cpu, coef, sum, sets[k], 5, norms[c],
                                                              mode, also[a], num_also));
                    float *dsq = dev(sets[k], sizeof sets[k]), *dco = dev(NULL, sizeof coef);
                    double *dsum = dev(NULL, sizeof sum), *dalso = dev(also[a], sizeof also[a]);
                    ck_assert_int_eq(luna_cuda_clip_coefficients(0, dco, dsum, dsq, 5, norms[c],
                                                                 mode, dalso, num_also),
                                     cudaSuccess);
                    down(gc, dco, sizeof gc), down(gs, dsum, sizeof gs);
                    ck_assert_msg(memcmp(gc, coef, sizeof coef) == 0, "clip coef set %d mode %d", k,
                                  mode);
                    for (int i = 0; i < 3; i++)
                        ck_assert_msg(memcmp(&gs[i], &sum[i], 8) == 0 ||
                                          (isnan(gs[i]) && isnan(sum[i])),
                                      "clip summary[%d] set %d mode %d also %d: %g vs %g", i, k,
                                      mode, a, gs[i], sum[i]);
                    /* a non-finite loss sum makes the update non-finite: nothing is scaled */
                    const bool grads_finite = k < 2;
                    ck_assert_int_eq(sum[1] != 0.0, grads_finite && a < 2);
                    if (a >= 2)
                        for (int i = 0; i < 5; i++)
                            ck_assert_float_eq(coef[i], 1.0f);
                    cudaFree(dsq), cudaFree(dco), cudaFree(dsum), cudaFree(dalso);
                }
    luna_backend_free(cpu);
}
END_TEST

START_TEST(scale_and_adam_bit_equal) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    enum { T = 5 };
    const int64_t numels[T] = {3, 0, 5000, 4096, 9001};
    int64_t offsets[T], total = 0;
    for (int i = 0; i < T; i++)
        offsets[i] = total + 2, total += numels[i] + 2;
    luna_tensor_table *tt;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, cpu, T, offsets, numels));
    int64_t *d_off = dev(tt->host_offsets, 8 * T), *d_num = dev(tt->host_numels, 8 * T);
    int64_t *d_bs = dev(tt->host_block_start, 8 * (T + 1));
    int32_t *d_bt = dev(tt->block_tensor, 4 * (size_t)tt->num_blocks);
    double *ws = dev(NULL, 8 * 2 * T);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 21);
    float *th = luna_test_random_vector(&rng, (size_t)total, -1.0f, 1.0f);
    float *m = luna_test_random_vector(&rng, (size_t)total, -0.1f, 0.1f);
    float *v = luna_test_random_vector(&rng, (size_t)total, 0.0f, 0.01f);
    float *d_th = dev(th, 4 * total), *d_m = dev(m, 4 * total), *d_v = dev(v, 4 * total);
    int64_t steps[T] = {0, 0, 3, 7, 1}, gsteps[T];
    int64_t *d_steps = dev(steps, sizeof steps);
    float *got = malloc(4 * (size_t)total);
    const float coef[T] = {0.5f, 1.0f, 1.0f, 0.25f, 0.9f};
    float *d_coef = dev(coef, sizeof coef);
    for (int step = 0; step < 3; step++) {
        float *g = luna_test_random_vector(&rng, (size_t)total, -1.0f, 1.0f);
        float *d_g = dev(g, 4 * total);
        /* clip-like scaling of the gradient, then an Adam step */
        LUNA_CHECK_OK(cpu->ops->multi_scale(cpu, g, tt, step == 1 ? NULL : coef, 0.75f));
        ck_assert_int_eq(luna_cuda_multi_scale(0, d_g, tt->num_blocks, d_off, d_num, d_bs, d_bt,
                                               step == 1 ? NULL : d_coef, 0.75f),
                         cudaSuccess);
        down(got, d_g, 4 * total);
        ck_assert_msg(memcmp(got, g, 4 * total) == 0, "multi_scale step %d differs", step);
        LUNA_CHECK_OK(cpu->ops->multi_adam_update(cpu, th, g, m, v, tt, steps, NULL, 1e-3, 0.9,
                                                  0.98, 1e-8, step == 2 ? 0.0 : 0.01));
        ck_assert_int_eq(luna_cuda_multi_adam_update(0, d_th, d_g, d_m, d_v, T, tt->num_blocks,
                                                     d_off, d_num, d_bs, d_bt, ws, d_steps, NULL,
                                                     1e-3, 0.9, 0.98, 1e-8, step == 2 ? 0.0 : 0.01),
                         cudaSuccess);
        down(got, d_th, 4 * total);
        ck_assert_msg(memcmp(got, th, 4 * total) == 0, "adam theta step %d differs", step);
        down(got, d_m, 4 * total);
        ck_assert_msg(memcmp(got, m, 4 * total) == 0, "adam exp_avg step %d differs", step);
        down(got, d_v, 4 * total);
        ck_assert_msg(memcmp(got, v, 4 * total) == 0, "adam exp_avg_sq step %d differs", step);
        down(gsteps, d_steps, sizeof gsteps);
        ck_assert(memcmp(gsteps, steps, sizeof steps) == 0);
        cudaFree(d_g);
        free(g);
    }
    cudaFree(d_off), cudaFree(d_num), cudaFree(d_bs), cudaFree(d_bt), cudaFree(ws);
    cudaFree(d_th), cudaFree(d_m), cudaFree(d_v), cudaFree(d_steps), cudaFree(d_coef);
    free(th), free(m), free(v), free(got);
    luna_tensor_table_free(tt);
    luna_backend_free(cpu);
}
END_TEST

/* Apollo: three steps for each rebound × weight-decay type, bit-equal to the CPU (the GPU adds
 * its block sums in a tree of its own, in double: the fp32 results equal the CPU's here). */
START_TEST(apollo_bit_equal) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    enum { T = 4 };
    const int64_t numels[T] = {7, 0, 8193, 4096};
    int64_t offsets[T], total = 0;
    for (int i = 0; i < T; i++)
        offsets[i] = total + 1, total += numels[i] + 1;
    luna_tensor_table *tt;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, cpu, T, offsets, numels));
    int64_t *d_off = dev(tt->host_offsets, 8 * T), *d_num = dev(tt->host_numels, 8 * T);
    int64_t *d_bs = dev(tt->host_block_start, 8 * (T + 1));
    int32_t *d_bt = dev(tt->block_tensor, 4 * (size_t)tt->num_blocks);
    double *ws = dev(NULL, 8 * (size_t)(5 * tt->num_blocks + 8 * T));
    float *got = malloc(4 * (size_t)total);
    for (int rebound = 0; rebound < 2; rebound++)
        for (int wd = 0; wd < 3; wd++) {
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 100 + rebound * 3 + wd);
            float *st[4];
            float *dst[4];
            for (int q = 0; q < 4; q++) { /* theta, m, B, d */
                st[q] = luna_test_random_vector(&rng, (size_t)total, -0.5f, 0.5f);
                dst[q] = dev(st[q], 4 * total);
            }
            int64_t steps[T] = {0, 0, 4, 1}, gsteps[T];
            int64_t *d_steps = dev(steps, sizeof steps);
            for (int step = 0; step < 3; step++) {
                float *g = luna_test_random_vector(&rng, (size_t)total, -1.0f, 1.0f);
                float *d_g = dev(g, 4 * total);
                LUNA_CHECK_OK(cpu->ops->multi_apollo_update(cpu, st[0], g, st[1], st[2], st[3], tt,
                                                            steps, NULL, 0.01, 0.9, 1e-4, 0.01,
                                                            rebound, 1e-4, wd));
                ck_assert_int_eq(luna_cuda_multi_apollo_update(
                                     0, dst[0], d_g, dst[1], dst[2], dst[3], T, tt->num_blocks,
                                     d_off, d_num, d_bs, d_bt, ws, d_steps, NULL, 0.01, 0.9, 1e-4,
                                     0.01, rebound, 1e-4, wd),
                                 cudaSuccess);
                for (int q = 0; q < 4; q++) {
                    down(got, dst[q], 4 * total);
                    ck_assert_msg(memcmp(got, st[q], 4 * total) == 0,
                                  "apollo rebound %d wd %d step %d: state %d differs", rebound, wd,
                                  step, q);
                }
                down(gsteps, d_steps, sizeof gsteps);
                ck_assert(memcmp(gsteps, steps, sizeof steps) == 0);
                cudaFree(d_g);
                free(g);
            }
            for (int q = 0; q < 4; q++)
                cudaFree(dst[q]), free(st[q]);
            cudaFree(d_steps);
        }
    cudaFree(d_off), cudaFree(d_num), cudaFree(d_bs), cudaFree(d_bt), cudaFree(ws);
    free(got);
    luna_tensor_table_free(tt);
    luna_backend_free(cpu);
}
END_TEST

static Suite *optimizer_suite(void) {
    Suite *s = suite_create("cuda_optimizer");
    TCase *tc = tcase_create("optimizer");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, clip_coefficients_bit_equal);
    tcase_add_test(tc, scale_and_adam_bit_equal);
    tcase_add_test(tc, apollo_bit_equal);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(optimizer_suite()); }
