/* The CUDA softmax kernel (model/kernels/cuda/softmax.cu) under the CPU execution harness against
 * the CPU backend's softmax_forward (the backward is the fused softmax_dropout's,
 * tests/cuda/emu_fused.c): masks by group (valid_cols,
 * rows_per_group), the causal period, rows with no valid column and rows of −inf, 1 to 1000
 * columns (one partial block, several passes per thread), in place. fp32 within the NORM tier
 * (1e-6 relative to the row's largest value); bf16 within one bf16 ulp of the CPU computed from
 * the bf16-rounded inputs. Run in three thread orders by CTest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

/* |got − want| ≤ tol · max(1, |want|) elementwise (rows of probabilities are ≤ 1). */

typedef struct {
    int rows, cols, group, causal;
    bool masked, inplace;
} sm_case;

static void check(luna_backend *cpu, const sm_case *k, int bf16) {
    const int64_t n = (int64_t)k->rows * k->cols;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(k->rows * 131 + k->cols));
    float *x = luna_test_random_vector(&rng, (size_t)n, -8.0f, 8.0f);
    if (k->rows > 2)
        for (int c = 0; c < k->cols; c++)
            x[(int64_t)2 * k->cols + c] = -INFINITY; /* row 2: all −inf */
    const int groups = k->masked ? (k->rows + k->group - 1) / k->group : 0;
    int32_t *valid = malloc(sizeof(int32_t) * (size_t)(groups + 1));
    for (int g = 0; g < groups; g++)
        valid[g] = g == 1 ? 0 : (g * 7 + 3) % (k->cols + 1); /* group 1 attends to nothing */
    uint16_t *hx = malloc(2 * (size_t)n), *hout = malloc(2 * (size_t)n);
    if (bf16)
        for (int64_t i = 0; i < n; i++) {
            hx[i] = to_bf16(x[i]);
            x[i] = from_bf16(hx[i]);
        }
    const size_t es = bf16 ? 2 : 4;
    float *y = malloc(4 * (size_t)n), *got = malloc(4 * (size_t)n);
    LUNA_CHECK_OK(cpu->ops->softmax_forward(cpu, y, x, k->rows, k->cols, k->masked ? valid : NULL,
                                            k->group, k->causal));
    void *dxin = dev(bf16 ? (void *)hx : (void *)x, es * n);
    int32_t *dvalid = k->masked ? dev(valid, sizeof(int32_t) * (size_t)groups) : NULL;
    void *dyout = k->inplace ? dxin : dev(NULL, es * n);
    ck_assert_int_eq(luna_cuda_softmax_forward(0, bf16, dyout, dxin, k->rows, k->cols, dvalid,
                                               k->group, k->causal),
                     cudaSuccess);
    char what[96];
    snprintf(what, sizeof what, "softmax_forward %s rows %d cols %d%s%s", bf16 ? "bf16" : "fp32",
             k->rows, k->cols, k->masked ? " masked" : "", k->causal ? " causal" : "");
    if (bf16) {
        down(hout, dyout, 2 * n);
        for (int64_t i = 0; i < n; i++)
            got[i] = from_bf16(hout[i]), y[i] = from_bf16(to_bf16(y[i]));
        close_enough(y, got, n, 1.0 / 256, what);
    } else {
        down(got, dyout, 4 * n);
        close_enough(y, got, n, 1e-6, what);
    }
    cudaFree(dxin);
    if (!k->inplace) cudaFree(dyout);
    if (dvalid) cudaFree(dvalid);
    free(x), free(valid), free(hx), free(hout), free(y), free(got);
}

START_TEST(softmax_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    const sm_case cases[] = {{1, 1, 1, 0, false, false},   {7, 13, 1, 0, false, false},
                             {12, 33, 4, 0, true, false},  {9, 300, 3, 0, true, true},
                             {16, 16, 1, 4, false, false}, {10, 17, 5, 5, true, false},
                             {4, 1000, 1, 0, false, true}, {130, 129, 13, 0, true, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            check(cpu, &cases[i], bf16);
    luna_backend_free(cpu);
}
END_TEST

static Suite *softmax_suite(void) {
    Suite *s = suite_create("cuda_softmax");
    TCase *tc = tcase_create("softmax");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, softmax_matches_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(softmax_suite()); }
