/* causal_step_products (core/backend.h): the causal Luna decoder step's products at each row's
 * own position, t read from device memory. On the backend under test (LUNA_TEST_BACKEND): a
 * double-precision host sum within the ACCUM tier, rows at different positions (runs and
 * singletons) and all at t_all, the scores' and the outputs' shapes; on the CPU the bits of the
 * one-row gemm with alpha 1/t per row (so CPU decoding keeps its translations); against the CPU
 * reference within ACCUM; bad sizes refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

typedef struct {
    int R, H, K, N, t_all;
    bool own; /* rows at their own positions (T below), else t_all */
} csp_args;

static const int32_t T[] = {0, 0, 3, 3, 3, 7, 1, 0, 12, 12, 5};
#define MAX_ROWS ((int)(sizeof T / sizeof T[0]))

static const csp_args CASES[] = {
    {MAX_ROWS, 2, 8, 5, 1, true}, /* scores: K = dh, N = L */
    {MAX_ROWS, 2, 5, 8, 1, true}, /* outputs: K = L, N = dh */
    {7, 3, 16, 33, 4, false},     {1, 1, 1, 1, 9, true},
    {5, 4, 64, 70, 2, true}, /* N past one block's threads */
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static float *vec(uint64_t seed, size_t n) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    return luna_test_random_vector(&rng, n, -1.0f, 1.0f);
}

/* d[0] x [G, K], d[1] S [G, K, N], d[2] t [R] (int32), d[3] y [G, N]. */
static luna_status run(luna_backend *be, void *const *d, const void *args) {
    const csp_args *a = args;
    return be->ops->causal_step_products(be, d[3], d[0], d[1], a->own ? d[2] : NULL, a->t_all, a->R,
                                         a->H, a->K, a->N);
}

static void describe(char *buf, size_t n, const csp_args *a) {
    snprintf(buf, n, "R %d H %d K %d N %d %s", a->R, a->H, a->K, a->N,
             a->own ? "own positions" : "t_all");
}

START_TEST(matches_a_double_sum) {
    luna_backend *be = lh_backend(2);
    for (size_t c = 0; c < NCASES; c++) {
        const csp_args *a = &CASES[c];
        const size_t G = (size_t)a->R * a->H, nx = G * a->K, nS = nx * a->N, ny = G * a->N;
        float *x = vec(10 + c, nx), *S = vec(20 + c, nS), *want = malloc(ny * sizeof(float));
        for (size_t g = 0; g < G; g++) {
            const int tr = a->own ? T[g / a->H] + 1 : a->t_all;
            for (int n = 0; n < a->N; n++) {
                double acc = 0.0;
                for (int k = 0; k < a->K; k++)
                    acc += (double)x[g * a->K + k] * S[(g * a->K + k) * a->N + n];
                want[g * a->N + n] = (float)(acc / tr);
            }
        }
        float *dx = lh_f32(be, x, nx), *dS = lh_f32(be, S, nS);
        int32_t *dt = lh_i32(be, T, MAX_ROWS);
        float *dy = lh_alloc(be, ny * sizeof(float));
        void *dev[4] = {dx, dS, dt, dy};
        LUNA_CHECK_OK(run(be, dev, a));
        float *got = lh_fetch_f32(be, dy, ny);
        char what[96];
        describe(what, sizeof what, a);
        const size_t bad = lh_mismatch(LH_ACCUM, false, got, want, ny);
        ck_assert_msg(bad == 0, "%s: y[%zu] = %.9g, the double sum %.9g", what, bad - 1,
                      bad ? (double)got[bad - 1] : 0.0, bad ? (double)want[bad - 1] : 0.0);
        free(x), free(S), free(want), free(got);
        lh_free(be, dx), lh_free(be, dS), lh_free(be, dt), lh_free(be, dy);
    }
    luna_backend_free(be);
}
END_TEST

/* The CPU computes each row as a one-row gemm with alpha 1/t (the bits its decoding relies on). */
START_TEST(cpu_is_the_one_row_gemm) {
    if (strcmp(lh_backend_name(), "cpu") != 0) {
        printf("bit equality with the one-row gemm: the CPU's property (a device is within "
               "ACCUM)\n");
        return;
    }
    luna_backend *be = lh_backend(2);
    for (size_t c = 0; c < NCASES; c++) {
        const csp_args *a = &CASES[c];
        const int64_t G = (int64_t)a->R * a->H, nx = G * a->K, ny = G * a->N;
        float *x = vec(30 + c, (size_t)nx), *S = vec(40 + c, (size_t)(nx * a->N));
        float *y = malloc((size_t)ny * sizeof(float)), *y2 = malloc((size_t)ny * sizeof(float));
        LUNA_CHECK_OK(be->ops->causal_step_products(be, y, x, S, a->own ? T : NULL, a->t_all, a->R,
                                                    a->H, a->K, a->N));
        for (int r = 0; r < a->R; r++) {
            const int64_t g0 = (int64_t)r * a->H;
            const int tr = a->own ? T[r] + 1 : a->t_all;
            LUNA_CHECK_OK(be->ops->gemm(be, false, false, 1, a->N, a->K, 1.0f / (float)tr,
                                        x + g0 * a->K, a->K, a->K, S + g0 * a->K * a->N, a->N,
                                        (int64_t)a->K * a->N, 0.0f, y2 + g0 * a->N, a->N, a->N,
                                        a->H));
        }
        char what[96];
        describe(what, sizeof what, a);
        const size_t bad = lh_mismatch(LH_ACCUM, true, y, y2, (size_t)ny);
        ck_assert_msg(bad == 0, "%s: y[%zu] = %.9g, the one-row gemm %.9g", what, bad - 1,
                      bad ? (double)y[bad - 1] : 0.0, bad ? (double)y2[bad - 1] : 0.0);
        free(x), free(S), free(y), free(y2);
    }
    luna_backend_free(be);
}
END_TEST

START_TEST(matches_reference_backend) {
    for (size_t c = 0; c < NCASES; c++) {
        const csp_args *a = &CASES[c];
        const size_t G = (size_t)a->R * a->H, nx = G * a->K, nS = nx * a->N, ny = G * a->N;
        float *x = vec(50 + c, nx), *S = vec(60 + c, nS), *y = vec(70 + c, ny);
        lh_buf bufs[] = {{x, nx, LH_F32, LH_IN},
                         {S, nS, LH_F32, LH_IN},
                         {T, MAX_ROWS, LH_I32, LH_IN},
                         {y, ny, LH_F32, LH_OUT}};
        char what[96];
        describe(what, sizeof what, a);
        ck_assert_int_eq(lh_compare("causal_step_products", what, 2, run, a, bufs, 4), LUNA_OK);
        free(x), free(S), free(y);
    }
}
END_TEST

START_TEST(bad_sizes_are_refused) {
    luna_backend *be = lh_backend(1);
    float *buf = lh_alloc(be, 64 * sizeof(float));
    ck_assert_int_eq(be->ops->causal_step_products(be, buf, buf, buf, NULL, 0, 2, 1, 2, 2),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "causal_step_products"));
    ck_assert_int_eq(be->ops->causal_step_products(be, buf, buf, buf, NULL, 1, 2, 0, 2, 2),
                     LUNA_ERR_INVALID_ARGUMENT);
    lh_free(be, buf);
    luna_backend_free(be);
}
END_TEST

static Suite *causal_step_suite(void) {
    Suite *s = suite_create("ops_causal_step");
    TCase *tc = tcase_create("causal_step");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, matches_a_double_sum);
    tcase_add_test(tc, cpu_is_the_one_row_gemm);
    tcase_add_test(tc, matches_reference_backend);
    tcase_add_test(tc, bad_sizes_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(causal_step_suite()); }
