/* The CUDA embedding and position kernels (model/kernels/cuda/embedding.cu) under the harness
 * against the CPU backend's ops: embedding_forward (padding rows zero, scale), a token outside the
 * vocabulary (NaN row and the device flag, no out-of-bounds read: ASan build), embedding_backward
 * with repeated tokens accumulated onto non-zero gradients in token order (bit-equal), and
 * sinusoidal_table / positions_add for even and odd d, left and right padding. fp32 bit-equal
 * (sin/cos/exp in double are exact under the harness; a GPU's may differ in the last fp32 bit);
 * bf16 equal to the CPU result rounded to bf16 on bf16-rounded inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static void same(const float *want, const float *got, int64_t n, int bf16, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        const float w = bf16 ? from_bf16(to_bf16(want[i])) : want[i];
        ck_assert_msg(memcmp(&w, &got[i], 4) == 0, "%s: element %lld: CUDA %.9g, CPU %.9g", what,
                      (long long)i, (double)got[i], (double)w);
    }
}

/* _i = 0: 203 positions; 1: 2500 (three tiles of the token index) */
START_TEST(embedding_matches_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    const int V = 37, d = 19, pad = 1;
    const int64_t n = _i ? 2500 : 203;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 5);
    float *table = luna_test_random_vector(&rng, (size_t)V * d, -1.0f, 1.0f);
    int32_t *tok = malloc(4 * n);
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 13 + 5) % V); /* repeats, and the padding token */
    float *dtab = dev(table, 4 * (size_t)V * d);
    int32_t *dtok = dev(tok, 4 * n);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        float *want = malloc(4 * n * d), *got = malloc(4 * n * d);
        void *dout = dev(NULL, (bf16 ? 2 : 4) * (size_t)n * d);
        LUNA_CHECK_OK(cpu->ops->embedding_forward(cpu, want, table, tok, n, V, d, 4.5f, pad));
        ck_assert_int_eq(
            luna_cuda_embedding_forward(0, bf16, dout, dtab, dtok, n, V, d, 4.5f, pad, NULL),
            cudaSuccess);
        down_act(got, dout, n * d, bf16);
        same(want, got, n * d, bf16, bf16 ? "embedding_forward bf16" : "embedding_forward");
        /* backward onto a non-zero gradient table */
        float *g = luna_test_random_vector(&rng, (size_t)n * d, -1.0f, 1.0f);
        float *dt = luna_test_random_vector(&rng, (size_t)V * d, -1.0f, 1.0f);
        void *dg = up_act(g, n * d, bf16);
        float *ddt = dev(dt, 4 * (size_t)V * d), *gt = malloc(4 * (size_t)V * d);
        float *dt0 = malloc(4 * (size_t)V * d); /* the gradient table before the backward */
        memcpy(dt0, dt, 4 * (size_t)V * d);
        LUNA_CHECK_OK(cpu->ops->embedding_backward(cpu, dt, g, tok, n, V, d, 4.5f, pad));
        /* with the token index (scratch) and without: the CPU's sums bit for bit either way */
        void *ws = dev(NULL, (size_t)luna_cuda_embedding_backward_scratch(n, V));
        for (int indexed = 0; indexed < 2; indexed++) {
            ck_assert_int_eq(cudaMemcpy(ddt, dt0, 4 * (size_t)V * d, cudaMemcpyHostToDevice),
                             cudaSuccess);
            ck_assert_int_eq(luna_cuda_embedding_backward(0, bf16, ddt, dg, dtok, n, V, d, 4.5f,
                                                          pad, indexed ? ws : NULL),
                             cudaSuccess);
            down(gt, ddt, 4 * (size_t)V * d);
            ck_assert_msg(memcmp(gt, dt, 4 * (size_t)V * d) == 0,
                          "embedding_backward %s %s differs", bf16 ? "bf16" : "fp32",
                          indexed ? "(token index)" : "(walk)");
        }
        cudaFree(ws), cudaFree(dout), cudaFree(dg), cudaFree(ddt);
        free(dt0);
        free(want), free(got), free(g), free(dt), free(gt);
    }
    /* a token outside the vocabulary: NaN row, flag set, nothing read out of bounds */
    tok[7] = V + 1000;
    ck_assert_int_eq(cudaMemcpy(dtok, tok, 4 * n, cudaMemcpyHostToDevice), cudaSuccess);
    int zero = 0, flag = 0;
    int *dbad = dev(&zero, sizeof zero);
    float *dout = dev(NULL, 4 * (size_t)n * d), *got = malloc(4 * (size_t)n * d);
    ck_assert_int_eq(luna_cuda_embedding_forward(0, 0, dout, dtab, dtok, n, V, d, 1.0f, pad, dbad),
                     cudaSuccess);
    down(&flag, dbad, sizeof flag);
    down(got, dout, 4 * (size_t)n * d);
    ck_assert_int_eq(flag, 1);
    ck_assert(isnan(got[7 * d]) && isnan(got[7 * d + d - 1]) && !isnan(got[8 * d]));
    cudaFree(dbad), cudaFree(dout), cudaFree(dtab), cudaFree(dtok);
    free(got), free(table), free(tok);
    luna_backend_free(cpu);
}
END_TEST

START_TEST(positions_match_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    const int dims[] = {1, 2, 3, 16, 33};
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int d = dims[k], B = 3, n = 9, pad = 1, npos = 11;
            float *want = malloc(4 * (size_t)npos * d), *got = malloc(4 * (size_t)npos * d);
            void *dt = dev(NULL, (bf16 ? 2 : 4) * (size_t)npos * d);
            LUNA_CHECK_OK(cpu->ops->sinusoidal_table(cpu, want, 5, npos, d));
            ck_assert_int_eq(luna_cuda_sinusoidal_table(0, bf16, dt, 5, npos, d), cudaSuccess);
            down_act(got, dt, (int64_t)npos * d, bf16);
            same(want, got, (int64_t)npos * d, bf16, "sinusoidal_table");
            /* positions_add: sentence 0 right-padded, 1 left-padded, 2 full */
            int32_t tok[27];
            for (int b = 0; b < B; b++)
                for (int t = 0; t < n; t++)
                    tok[b * n + t] = (b == 0 && t >= 6) || (b == 1 && t < 3) ? pad : 4 + t;
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 9 + k);
            float *x = luna_test_random_vector(&rng, (size_t)B * n * d, -1.0f, 1.0f);
            void *dx = up_act(x, (int64_t)B * n * d, bf16);
            int32_t *dtok = dev(tok, sizeof tok), *counts = dev(NULL, sizeof tok);
            float *table = dev(NULL, 4 * (size_t)n * d);
            float *xg = malloc(4 * (size_t)B * n * d);
            LUNA_CHECK_OK(cpu->ops->positions_add(cpu, x, tok, B, n, d, pad));
            ck_assert_int_eq(
                luna_cuda_positions_add(0, bf16, dx, dtok, B, n, d, pad, counts, table),
                cudaSuccess);
            down_act(xg, dx, (int64_t)B * n * d, bf16);
            same(x, xg, (int64_t)B * n * d, bf16, "positions_add");
            cudaFree(dt), cudaFree(dx), cudaFree(dtok), cudaFree(counts), cudaFree(table);
            free(want), free(got), free(x), free(xg);
        }
    luna_backend_free(cpu);
}
END_TEST

static Suite *embedding_suite(void) {
    Suite *s = suite_create("cuda_embedding");
    TCase *tc = tcase_create("embedding");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, embedding_matches_cpu, 0, 2);
    tcase_add_test(tc, positions_match_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(embedding_suite()); }
