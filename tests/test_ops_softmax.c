/* Tests of the masked softmax: forward against a naive double implementation under every kind of
 * mask (valid lengths 0, partial, full, beyond cols; causal; both), in-place use, large logits,
 * finite-difference gradients through the backward, dx aliasing dy and thread determinism. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/test_util.h"

#ifndef GC_EPS
#define GC_EPS 3e-3
#endif
#ifndef GC_RTOL
#define GC_RTOL 2e-3
#endif
#ifndef GC_FLOOR
#define GC_FLOOR 1e-3
#endif

/* One masking configuration. */
typedef struct {
    int rows, cols;
    const int32_t *valid_cols; /* [ceil(rows / rows_per_group)] or NULL */
    int rows_per_group;
    int causal_period;
} mask_case;

static const int32_t valid_a[] = {0, 2, 5, 9}; /* none, partial, full, beyond cols (5) */
static const int32_t valid_b[] = {33, 17, 0};
static const int32_t valid_c[] = {1};
static const mask_case cases[] = {
    {1, 1, NULL, 0, 0},        /* size 1 */
    {3, 5, NULL, 0, 0},        /* no mask */
    {12, 5, valid_a, 3, 0},    /* key-padding lengths */
    {12, 6, NULL, 0, 6},       /* causal, two 6×6 blocks */
    {99, 33, valid_b, 33, 33}, /* causal and lengths, including a length-0 group */
    {7, 8, NULL, 0, 5},        /* period shorter than cols */
    {7, 1, valid_c, 7, 0},     /* one column, valid */
};

static int ref_valid(const mask_case *m, int r) {
    int v = m->valid_cols ? m->valid_cols[r / m->rows_per_group] : m->cols;
    if (m->causal_period > 0 && r % m->causal_period + 1 < v) v = r % m->causal_period + 1;
    return v < 0 ? 0 : (v > m->cols ? m->cols : v);
}

static luna_status run_forward(luna_backend *be, const mask_case *m, float *y, const float *x) {
    return be->ops->softmax_forward(be, y, x, m->rows, m->cols, m->valid_cols, m->rows_per_group,
                                    m->causal_period);
}

START_TEST(softmax_forward_matches_naive_with_masks) {
    luna_backend *be = luna_test_backend(2);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int big = 0; big < 2; big++) {
            const mask_case *m = &cases[k];
            size_t n = (size_t)m->rows * m->cols;
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 30 + k);
            /* big: logits around 1000 (exp would overflow without the max subtraction). */
            float *x = luna_test_random_vector(&rng, n, big ? 990 : -4, big ? 1010 : 4);
            float *y = luna_test_random_vector(&rng, n, 5, 6), *yi = malloc(n * sizeof *yi);
            ck_assert_int_eq(run_forward(be, m, y, x), LUNA_OK);
            memcpy(yi, x, n * sizeof *yi);
            ck_assert_int_eq(run_forward(be, m, yi, yi), LUNA_OK); /* in place */
            ck_assert_int_eq(memcmp(y, yi, n * sizeof *y), 0);
            for (int r = 0; r < m->rows; r++) {
                int v = ref_valid(m, r);
                const float *xr = x + (size_t)r * m->cols, *yr = y + (size_t)r * m->cols;
                double mx = -INFINITY, s = 0;
                for (int c = 0; c < v; c++)
                    mx = fmax(mx, xr[c]);
                for (int c = 0; c < v; c++)
                    s += exp((double)xr[c] - mx);
                for (int c = 0; c < m->cols; c++) {
                    if (c >= v) {
                        LUNA_EXPECT(yr[c] == 0.0f, "case %zu: masked y[%d][%d] = %g", k, r, c,
                                    yr[c]);
                        continue;
                    }
                    double want = exp((double)xr[c] - mx) / s;
                    LUNA_EXPECT(fabs(yr[c] - want) <= 1e-6 * want + 1e-9,
                                "case %zu big %d: y[%d][%d] = %.9g, want %.9g", k, big, r, c, yr[c],
                                want);
                }
            }
            free(x);
            free(y);
            free(yi);
        }
    luna_backend_free(be);
}
END_TEST

START_TEST(softmax_rejects_bad_group_size) {
    luna_backend *be = luna_test_backend(1);
    float x[4] = {0};
    const int32_t valid[1] = {2};
    ck_assert_int_eq(be->ops->softmax_forward(be, x, x, 2, 2, valid, 0, 0),
                     LUNA_ERR_INVALID_ARGUMENT);
    luna_backend_free(be);
}
END_TEST

typedef struct {
    luna_backend *be;
    const mask_case *m;
    float *x, *y, *w;
} sm_ctx;

static double sm_loss(void *p) {
    sm_ctx *c = p;
    luna_status st = run_forward(c->be, c->m, c->y, c->x);
    LUNA_EXPECT(st == LUNA_OK, "%s", luna_error_message());
    return luna_test_weighted_sum(c->y, c->w, (size_t)c->m->rows * c->m->cols);
}

START_TEST(softmax_gradient_matches_finite_differences) {
    luna_backend *be = luna_test_backend(2);
    double worst = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const mask_case *m = &cases[k];
        size_t n = (size_t)m->rows * m->cols;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 40 + k);
        sm_ctx c = {be, m, luna_test_random_vector(&rng, n, -2, 2),
                    luna_test_random_vector(&rng, n, 0, 0),
                    luna_test_random_vector(&rng, n, -1, 1)};
        sm_loss(&c);
        float *dx = luna_test_random_vector(&rng, n, 7, 8); /* overwritten */
        ck_assert_int_eq(be->ops->softmax_backward(be, dx, c.w, c.y, m->rows, m->cols), LUNA_OK);
        for (int r = 0; r < m->rows; r++)
            for (int c2 = ref_valid(m, r); c2 < m->cols; c2++)
                LUNA_EXPECT(dx[(size_t)r * m->cols + c2] == 0.0f,
                            "case %zu: masked dx[%d][%d] = %g", k, r, c2,
                            dx[(size_t)r * m->cols + c2]);
        worst = fmax(worst, luna_test_gradcheck("softmax dx", sm_loss, &c, c.x, n, dx, GC_EPS,
                                                GC_RTOL, GC_FLOOR));
        free(c.x);
        free(c.y);
        free(c.w);
        free(dx);
    }
    printf("softmax: worst gradcheck error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* dx may alias dy; 1 and 2 threads give bit-identical forward and backward results. */
START_TEST(softmax_alias_and_thread_determinism) {
    luna_backend *be = luna_test_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 50);
    const int rows = 600, cols = 97;
    size_t n = (size_t)rows * cols;
    int32_t valid[6] = {97, 50, 0, 1, 96, 200};
    float *x = luna_test_random_vector(&rng, n, -5, 5),
          *dy = luna_test_random_vector(&rng, n, -1, 1);
    float *y[2], *dx[3];
    for (int t = 0; t < 2; t++) {
        luna_backend_cpu_set_threads(be, 2 - t);
        y[t] = malloc(n * sizeof(float));
        dx[t] = malloc(n * sizeof(float));
        ck_assert_int_eq(be->ops->softmax_forward(be, y[t], x, rows, cols, valid, 100, 97),
                         LUNA_OK);
        ck_assert_int_eq(be->ops->softmax_backward(be, dx[t], dy, y[t], rows, cols), LUNA_OK);
    }
    ck_assert_int_eq(memcmp(y[0], y[1], n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(dx[0], dx[1], n * sizeof(float)), 0);
    dx[2] = malloc(n * sizeof(float));
    memcpy(dx[2], dy, n * sizeof(float));
    ck_assert_int_eq(be->ops->softmax_backward(be, dx[2], dx[2], y[0], rows, cols), LUNA_OK);
    ck_assert_int_eq(memcmp(dx[0], dx[2], n * sizeof(float)), 0);
    for (int t = 0; t < 2; t++)
        free(y[t]);
    for (int t = 0; t < 3; t++)
        free(dx[t]);
    free(x);
    free(dy);
    luna_backend_free(be);
}
END_TEST

static Suite *softmax_suite(void) {
    Suite *s = suite_create("ops_softmax");
    TCase *tc = tcase_create("softmax");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, softmax_forward_matches_naive_with_masks);
    tcase_add_test(tc, softmax_rejects_bad_group_size);
    tcase_add_test(tc, softmax_gradient_matches_finite_differences);
    tcase_add_test(tc, softmax_alias_and_thread_determinism);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(softmax_suite()); }
