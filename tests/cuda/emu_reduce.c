/* The CUDA reductions (model/kernels/cuda/reduce.cu) under the harness against the CPU backend's
 * reduce.c: sum_squares, sum_pow4, dot, sum, multi_sum_squares bit-equal (same blocked order in
 * double) for n = 0, 1, 7, 4095, 4096, 4097 and 100003, and tensor tables with empty tensors and
 * tensors spanning several blocks; max_abs (NaN anywhere gives NaN); the backward ops bit-equal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static float down1(const float *d) {
    float v;
    ck_assert_int_eq(cudaMemcpy(&v, d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}
static void same(float want, float got, const char *what, int64_t n) {
    ck_assert_msg(memcmp(&want, &got, 4) == 0 || (isnan(want) && isnan(got)),
                  "%s n=%lld: CUDA %.9g, CPU %.9g", what, (long long)n, (double)got, (double)want);
}

START_TEST(reductions_bit_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int64_t sizes[] = {0, 1, 7, 4095, 4096, 4097, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t n = sizes[k];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 3 + k);
        float *x = luna_test_random_vector(&rng, (size_t)n + 1, -3.0f, 3.0f);
        float *y = luna_test_random_vector(&rng, (size_t)n + 1, -3.0f, 3.0f);
        float *dx = dev(x, 4 * (size_t)n), *dy = dev(y, 4 * (size_t)n), *dr = dev(NULL, 4);
        double *part = dev(NULL, 8 * (size_t)(n / 4096 + 1));
        float want;
        LUNA_CHECK_OK(cpu->ops->sum_squares(cpu, &want, x, n));
        ck_assert_int_eq(luna_cuda_sum_squares(0, dr, dx, n, part), cudaSuccess);
        same(want, down1(dr), "sum_squares", n);
        LUNA_CHECK_OK(cpu->ops->sum_pow4(cpu, &want, x, n));
        ck_assert_int_eq(luna_cuda_sum_pow4(0, dr, dx, n, part), cudaSuccess);
        same(want, down1(dr), "sum_pow4", n);
        LUNA_CHECK_OK(cpu->ops->dot(cpu, &want, x, y, n));
        ck_assert_int_eq(luna_cuda_dot(0, dr, dx, dy, n, part), cudaSuccess);
        same(want, down1(dr), "dot", n);
        LUNA_CHECK_OK(cpu->ops->sum(cpu, &want, x, n));
        ck_assert_int_eq(luna_cuda_sum(0, dr, dx, n, part), cudaSuccess);
        same(want, down1(dr), "sum", n);
        LUNA_CHECK_OK(cpu->ops->max_abs(cpu, &want, x, n));
        ck_assert_int_eq(luna_cuda_max_abs(0, dr, dx, n), cudaSuccess);
        same(want, down1(dr), "max_abs", n);
        if (n > 5) { /* a NaN anywhere */
            x[n / 2] = NAN;
            ck_assert_int_eq(cudaMemcpy(dx, x, 4 * (size_t)n, cudaMemcpyHostToDevice), cudaSuccess);
            ck_assert_int_eq(luna_cuda_max_abs(0, dr, dx, n), cudaSuccess);
            ck_assert(isnan(down1(dr)));
            x[n / 2] = 0.5f;
            ck_assert_int_eq(cudaMemcpy(dx, x, 4 * (size_t)n, cudaMemcpyHostToDevice), cudaSuccess);
        }
        /* backward ops onto y */
        float *gy = malloc(4 * (size_t)n + 4);
        float *dyy = dev(y, 4 * (size_t)n);
        LUNA_CHECK_OK(cpu->ops->sum_squares_backward(cpu, y, x, 0.3f, n));
        ck_assert_int_eq(luna_cuda_sum_squares_backward(0, dyy, dx, 0.3f, n), cudaSuccess);
        LUNA_CHECK_OK(cpu->ops->sum_pow4_backward(cpu, y, x, -0.7f, n));
        ck_assert_int_eq(luna_cuda_sum_pow4_backward(0, dyy, dx, -0.7f, n), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(gy, dyy, 4 * (size_t)n, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_msg(n == 0 || memcmp(gy, y, 4 * (size_t)n) == 0, "pow backward n=%lld differ",
                      (long long)n);
        cudaFree(dx), cudaFree(dy), cudaFree(dr), cudaFree(part), cudaFree(dyy);
        free(x), free(y), free(gy);
    }
    luna_backend_free(cpu);
}
END_TEST

START_TEST(multi_sum_squares_bit_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int T = 6;
    const int64_t numels[] = {5, 0, 4096, 9000, 1, 12289};
    int64_t offsets[6], total = 0;
    for (int i = 0; i < T; i++)
        offsets[i] = total + 3, total += numels[i] + 3; /* gaps between tensors */
    luna_tensor_table *tt;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, cpu, T, offsets, numels));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 77);
    float *x = luna_test_random_vector(&rng, (size_t)total, -2.0f, 2.0f);
    float want[6], got[6];
    LUNA_CHECK_OK(cpu->ops->multi_sum_squares(cpu, want, x, tt));
    /* the table's arrays on the "device" of the harness */
    int64_t *d_off = dev(tt->host_offsets, 8 * T), *d_num = dev(tt->host_numels, 8 * T);
    int64_t *d_bs = dev(tt->host_block_start, 8 * (T + 1));
    int32_t *d_bt = dev(tt->block_tensor, 4 * (size_t)tt->num_blocks);
    double *part = dev(NULL, 8 * (size_t)tt->num_blocks);
    float *dx = dev(x, 4 * (size_t)total), *dr = dev(NULL, 4 * T);
    ck_assert_int_eq(
        luna_cuda_multi_sum_squares(0, dr, dx, T, tt->num_blocks, d_off, d_num, d_bs, d_bt, part),
        cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(got, dr, 4 * T, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < T; i++)
        same(want[i], got[i], "multi_sum_squares tensor", i);
    cudaFree(d_off), cudaFree(d_num), cudaFree(d_bs), cudaFree(d_bt), cudaFree(part);
    cudaFree(dx), cudaFree(dr);
    free(x);
    luna_tensor_table_free(tt);
    luna_backend_free(cpu);
}
END_TEST

static Suite *reduce_suite(void) {
    Suite *s = suite_create("cuda_reduce");
    TCase *tc = tcase_create("reduce");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, reductions_bit_equal_cpu);
    tcase_add_test(tc, multi_sum_squares_bit_equal_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(reduce_suite()); }
