/* The CUDA log_softmax_topk (model/kernels/cuda/decode_select.cu) under the harness against the
 * CPU backend's: top log-probs, their token ids and the picked (unbiased) log-probs bit for bit,
 * for k = 0, 1, 8 and V, V = 1, 7, 5000 (not a multiple of the four lanes), with ties (repeated
 * logits), a −inf-banned and a penalised token in the bias, a NaN row, a row of −inf and a row
 * with +inf. fp32 and bf16 logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static void check(luna_backend *cpu, int rows, int V, int k, int bf16, int with_bias) {
    const int64_t n = (int64_t)rows * V;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 31 + V + k));
    float *x = luna_test_random_vector(&rng, (size_t)n, -9.0f, 9.0f);
    for (int64_t i = 0; i < n; i += 3)
        x[i] = x[i - i % 6]; /* ties */
    if (rows > 3) {
        x[(int64_t)1 * V] = NAN; /* row 1: NaN */
        for (int j = 0; j < V; j++)
            x[(int64_t)2 * V + j] = -INFINITY; /* row 2: all −inf */
        x[(int64_t)3 * V + V / 2] = INFINITY;  /* row 3: +inf */
    }
    void *dx;
    if (bf16) {
        uint16_t *h = malloc(2 * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            h[i] = to_bf16(x[i]), x[i] = from_bf16(h[i]);
        dx = dev(h, 2 * (size_t)n);
        free(h);
    } else {
        dx = dev(x, 4 * (size_t)n);
    }
    float *bias = calloc((size_t)V, 4);
    if (V > 2) bias[1] = -INFINITY, bias[2] = -1.5f;
    int32_t *pick = malloc(4 * (size_t)rows);
    for (int r = 0; r < rows; r++)
        pick[r] = (r * 5 + 1) % V;
    const size_t nk = (size_t)rows * (k > 0 ? k : 1);
    float *lp = malloc(4 * nk), *glp = malloc(4 * nk), *pk = malloc(4 * rows),
          *gpk = malloc(4 * rows);
    int32_t *idx = malloc(4 * nk), *gidx = malloc(4 * nk);
    LUNA_CHECK_OK(
        cpu->ops->log_softmax_topk(cpu, x, with_bias ? bias : NULL, rows, V, k, lp, idx, pick, pk));
    float *dbias = dev(bias, 4 * (size_t)V), *dlp = dev(NULL, 4 * nk), *dpk = dev(NULL, 4 * rows);
    int32_t *didx = dev(NULL, 4 * nk), *dpick = dev(pick, 4 * (size_t)rows);
    ck_assert_int_eq(luna_cuda_log_softmax_topk(0, bf16, dx, with_bias ? dbias : NULL, rows, V, k,
                                                dlp, didx, dpick, dpk),
                     cudaSuccess);
    down(gpk, dpk, 4 * rows);
    for (int r = 0; r < rows; r++)
        ck_assert_msg(memcmp(&pk[r], &gpk[r], 4) == 0 || (isnan(pk[r]) && isnan(gpk[r])),
                      "picked row %d (V %d k %d): CUDA %.9g, CPU %.9g", r, V, k, (double)gpk[r],
                      (double)pk[r]);
    if (k > 0) {
        down(glp, dlp, 4 * nk), down(gidx, didx, 4 * nk);
        for (size_t i = 0; i < nk; i++) {
            ck_assert_msg(gidx[i] == idx[i], "V %d k %d %s: rank %zu of row %zu: token %d, CPU %d",
                          V, k, bf16 ? "bf16" : "fp32", i % k, i / k, gidx[i], idx[i]);
            ck_assert_msg(memcmp(&glp[i], &lp[i], 4) == 0, "V %d k %d: lp %zu: %.9g vs %.9g", V, k,
                          i, (double)glp[i], (double)lp[i]);
        }
    }
    cudaFree(dx), cudaFree(dbias), cudaFree(dlp), cudaFree(dpk), cudaFree(didx), cudaFree(dpick);
    free(x), free(bias), free(pick), free(lp), free(glp), free(pk), free(gpk), free(idx),
        free(gidx);
}

START_TEST(topk_bit_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int Vs[] = {1, 7, 5000};
    for (int a = 0; a < 3; a++) {
        const int V = Vs[a];
        const int ks[] = {0, 1, V < 8 ? V : 8, V};
        for (int b = 0; b < 4; b++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                for (int wb = 0; wb < 2; wb++)
                    check(cpu, 6, V, ks[b], bf16, wb);
    }
    luna_backend_free(cpu);
}
END_TEST

static Suite *topk_suite(void) {
    Suite *s = suite_create("cuda_decode_select");
    TCase *tc = tcase_create("topk");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, topk_bit_equal_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(topk_suite()); }
