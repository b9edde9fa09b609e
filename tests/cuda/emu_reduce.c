/* The CUDA reduction multi_sum_squares (model/kernels/cuda/reduce.cu) under the harness against
 * the CPU backend's (model/kernels/cpu/multi_tensor.c): bit-equal here (both sum in double, in
 * different orders, and round once to fp32; the contract asks the ACCUM tier) over a tensor table with an empty tensor, gaps between tensors,
 * tensors of 1, 7, one block ± 1 and many blocks; a NaN reaches its tensor's sum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static void same(float want, float got, const char *what, int64_t i) {
    ck_assert_msg(memcmp(&want, &got, 4) == 0 || (isnan(want) && isnan(got)),
                  "%s %lld: CUDA %.9g, CPU %.9g", what, (long long)i, (double)got, (double)want);
}

START_TEST(multi_sum_squares_bit_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int T = 10;
    const int64_t numels[] = {5, 0, 4096, 9000, 1, 12289, 7, 4095, 4097, 100003};
    int64_t offsets[10], total = 0;
    for (int i = 0; i < T; i++)
        offsets[i] = total + 3, total += numels[i] + 3; /* gaps between tensors */
    luna_tensor_table *tt;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, cpu, T, offsets, numels));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 77);
    float *x = luna_test_random_vector(&rng, (size_t)total, -2.0f, 2.0f);
    x[offsets[8] + 4096] = NAN; /* the last element of the tensor of 4097 */
    float want[10], got[10];
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
    ck_assert(isnan(got[8]));
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
    tcase_add_test(tc, multi_sum_squares_bit_equal_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(reduce_suite()); }
