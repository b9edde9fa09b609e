/* Tests of the masked softmax: forward against a naive double implementation under every kind of
 * mask (valid lengths 0, partial, full, beyond cols; causal; both), in-place use, large logits,
 * finite-difference gradients through the backward (training's softmax_dropout_backward with no
 * dropout: lh_softmax_backward), dx aliasing dy, thread determinism, and the backend under test
 * (LUNA_TEST_BACKEND) against the CPU reference on odd shapes. Every op buffer is device memory
 * from the harness (tests/backend_harness.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

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

static size_t ngroups(const mask_case *m) {
    return m->valid_cols ? (size_t)(m->rows + m->rows_per_group - 1) / m->rows_per_group : 0;
}

/* valid: the device copy of m->valid_cols (NULL without one). */
static luna_status run_forward(luna_backend *be, const mask_case *m, float *y, const float *x,
                               const int32_t *valid) {
    return be->ops->softmax_forward(be, y, x, m->rows, m->cols, valid, m->rows_per_group,
                                    m->causal_period);
}

START_TEST(softmax_forward_matches_naive_with_masks) {
    luna_backend *be = lh_backend(2);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int big = 0; big < 2; big++) {
            const mask_case *m = &cases[k];
            size_t n = (size_t)m->rows * m->cols;
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 30 + k);
            /* big: logits around 1000 (exp would overflow without the max subtraction). */
            float *x;
            float *dx_ = lh_random_f32(be, &rng, n, big ? 990 : -4, big ? 1010 : 4, &x);
            float *dy = lh_random_f32(be, &rng, n, 5, 6, NULL), *dyi = lh_f32(be, x, n);
            int32_t *valid = m->valid_cols ? lh_i32(be, m->valid_cols, ngroups(m)) : NULL;
            ck_assert_int_eq(run_forward(be, m, dy, dx_, valid), LUNA_OK);
            ck_assert_int_eq(run_forward(be, m, dyi, dyi, valid), LUNA_OK); /* in place */
            float *y = lh_fetch_f32(be, dy, n), *yi = lh_fetch_f32(be, dyi, n);
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
            lh_free(be, dx_);
            lh_free(be, dy);
            lh_free(be, dyi);
            lh_free(be, valid);
        }
    luna_backend_free(be);
}
END_TEST

START_TEST(softmax_rejects_bad_group_size) {
    luna_backend *be = lh_backend(1);
    float *x = lh_f32(be, NULL, 4);
    const int32_t valid_host[1] = {2};
    int32_t *valid = lh_i32(be, valid_host, 1);
    ck_assert_int_eq(be->ops->softmax_forward(be, x, x, 2, 2, valid, 0, 0),
                     LUNA_ERR_INVALID_ARGUMENT);
    lh_free(be, x);
    lh_free(be, valid);
    luna_backend_free(be);
}
END_TEST

typedef struct {
    luna_backend *be;
    const mask_case *m;
    float *x, *y, *w; /* host */
    float *dx, *dy;   /* device copies of x and y */
    int32_t *valid;   /* device copy of m->valid_cols */
} sm_ctx;

static double sm_loss(void *p) {
    sm_ctx *c = p;
    size_t n = (size_t)c->m->rows * c->m->cols;
    lh_upload(c->be, c->dx, c->x, n * sizeof(float));
    luna_status st = run_forward(c->be, c->m, c->dy, c->dx, c->valid);
    LUNA_EXPECT(st == LUNA_OK, "%s", luna_error_message());
    lh_download(c->be, c->y, c->dy, n * sizeof(float));
    return luna_test_weighted_sum(c->y, c->w, n);
}

START_TEST(softmax_gradient_matches_finite_differences) {
    luna_backend *be = lh_backend(2);
    double worst = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const mask_case *m = &cases[k];
        size_t n = (size_t)m->rows * m->cols;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 40 + k);
        sm_ctx c = {be,
                    m,
                    luna_test_random_vector(&rng, n, -2, 2),
                    luna_test_random_vector(&rng, n, 0, 0),
                    luna_test_random_vector(&rng, n, -1, 1),
                    lh_alloc(be, n * sizeof(float)),
                    lh_alloc(be, n * sizeof(float)),
                    m->valid_cols ? lh_i32(be, m->valid_cols, ngroups(m)) : NULL};
        sm_loss(&c);
        float *ddx = lh_random_f32(be, &rng, n, 7, 8, NULL); /* overwritten */
        float *dw = lh_f32(be, c.w, n);
        ck_assert_int_eq(lh_softmax_backward(be, ddx, dw, c.dy, m->rows, m->cols), LUNA_OK);
        float *dx = lh_fetch_f32(be, ddx, n);
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
        lh_free(be, c.dx);
        lh_free(be, c.dy);
        lh_free(be, c.valid);
        lh_free(be, ddx);
        lh_free(be, dw);
    }
    printf("softmax: worst gradcheck error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* dx may alias dy; 1 and 2 threads give bit-identical forward and backward results. */
START_TEST(softmax_alias_and_thread_determinism) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 50);
    const int rows = 600, cols = 97;
    size_t n = (size_t)rows * cols, bytes = n * sizeof(float);
    const int32_t valid_host[6] = {97, 50, 0, 1, 96, 200};
    int32_t *valid = lh_i32(be, valid_host, 6);
    float *x = lh_random_f32(be, &rng, n, -5, 5, NULL),
          *dy = lh_random_f32(be, &rng, n, -1, 1, NULL);
    float *y[2], *dx[3], *h[5];
    for (int t = 0; t < 2; t++) {
        lh_set_threads(be, 2 - t);
        y[t] = lh_alloc(be, bytes);
        dx[t] = lh_alloc(be, bytes);
        ck_assert_int_eq(be->ops->softmax_forward(be, y[t], x, rows, cols, valid, 100, 97),
                         LUNA_OK);
        ck_assert_int_eq(lh_softmax_backward(be, dx[t], dy, y[t], rows, cols), LUNA_OK);
    }
    dx[2] = lh_alloc(be, bytes);
    LUNA_CHECK_OK(luna_mem_copy(be, dx[2], dy, bytes));
    ck_assert_int_eq(lh_softmax_backward(be, dx[2], dx[2], y[0], rows, cols), LUNA_OK);
    for (int t = 0; t < 2; t++)
        h[t] = lh_fetch_f32(be, y[t], n);
    for (int t = 0; t < 3; t++)
        h[2 + t] = lh_fetch_f32(be, dx[t], n);
    ck_assert_int_eq(memcmp(h[0], h[1], bytes), 0);
    ck_assert_int_eq(memcmp(h[2], h[3], bytes), 0);
    ck_assert_int_eq(memcmp(h[2], h[4], bytes), 0);
    for (int t = 0; t < 5; t++)
        free(h[t]);
    for (int t = 0; t < 2; t++)
        lh_free(be, y[t]);
    for (int t = 0; t < 3; t++)
        lh_free(be, dx[t]);
    lh_free(be, x);
    lh_free(be, dy);
    lh_free(be, valid);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
static luna_status cmp_forward(luna_backend *be, void *const *d, const void *args) {
    const mask_case *m = args;
    return be->ops->softmax_forward(be, d[1], d[0], m->rows, m->cols, m->valid_cols ? d[2] : NULL,
                                    m->rows_per_group, m->causal_period);
}
static luna_status cmp_backward(luna_backend *be, void *const *d, const void *args) {
    const mask_case *m = args;
    return lh_softmax_backward(be, d[0], d[1], d[2], m->rows, m->cols);
}

START_TEST(softmax_matches_reference_backend) {
    static const int32_t valid_odd[] = {13, 4, 0, 9, 20, 1, 7};
    const mask_case odd[] = {
        {7, 13, NULL, 0, 0},
        {49, 13, valid_odd, 7, 0},
        {21, 13, NULL, 0, 7},
        {49, 13, valid_odd, 7, 7},
        cases[4],
    };
    for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++) {
        const mask_case *m = &odd[k];
        size_t n = (size_t)m->rows * m->cols;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 60 + k);
        float *x = luna_test_random_vector(&rng, n, -6, 6), *y = luna_test_zeros(n);
        float *dy = luna_test_random_vector(&rng, n, -1, 1);
        char what[64];
        snprintf(what, sizeof what, "rows %d cols %d case %zu", m->rows, m->cols, k);
        lh_buf fb[] = {{x, n, LH_F32, LH_IN},
                       {NULL, n, LH_F32, LH_OUT},
                       {m->valid_cols, ngroups(m), LH_I32, LH_IN}};
        ck_assert_int_eq(lh_compare("softmax_forward", what, 2, cmp_forward, m, fb, 3), LUNA_OK);
        /* the backward from the reference's y (computed here on the CPU) */
        luna_backend *ref = lh_reference();
        float *dyv = lh_f32(ref, y, n), *dxv = lh_f32(ref, x, n);
        int32_t *dv = m->valid_cols ? lh_i32(ref, m->valid_cols, ngroups(m)) : NULL;
        LUNA_CHECK_OK(run_forward(ref, m, dyv, dxv, dv));
        lh_download(ref, y, dyv, n * sizeof(float));
        lh_free(ref, dyv);
        lh_free(ref, dxv);
        lh_free(ref, dv);
        luna_backend_free(ref);
        lh_buf bb[] = {{NULL, n, LH_F32, LH_OUT}, {dy, n, LH_F32, LH_IN}, {y, n, LH_F32, LH_IN}};
        ck_assert_int_eq(lh_compare("softmax_dropout_backward", what, 2, cmp_backward, m, bb, 3),
                         LUNA_OK);
        free(x);
        free(y);
        free(dy);
    }
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
    tcase_add_test(tc, softmax_matches_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(softmax_suite()); }
