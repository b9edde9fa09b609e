/* Tests of the CPU reductions (model/kernels/cpu/reduce.c): values against naive double sums,
 * bit-identical results for 1, 2 and 3 threads, NaN handling, scratch discipline, and finite-
 * difference checks of sum_squares_backward, sum_pow4_backward and dot_backward, and every
 * reduction on the backend under test (LUNA_TEST_BACKEND) against the CPU reference. Ops get device
 * buffers from the harness (tests/backend_harness.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/allocator.h"
#include "core/backend.h"
#include "tests/backend_harness.h"

static float *random_vector(uint64_t seed, int64_t n, float lo, float hi) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    ck_assert_ptr_nonnull(x);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    luna_test_fill_uniform(&rng, x, (size_t)n, lo, hi);
    return x;
}

enum { OP_SUM_SQUARES, OP_SUM_POW4, OP_DOT, OP_SUM, OP_MAX_ABS, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"sum_squares", "sum_pow4", "dot", "sum", "max_abs"};

/* Runs a reduction on device copies of the host vectors x and y (y only for dot). */
static float run_op(luna_backend *be, int op, const float *x, const float *y, int64_t n) {
    size_t count = n > 0 ? (size_t)n : 0;
    float *dx = lh_f32(be, x, count), *dy = y ? lh_f32(be, y, count) : NULL;
    float *dr = lh_alloc(be, sizeof(float));
    luna_status st = LUNA_ERR_INTERNAL;
    switch (op) {
    case OP_SUM_SQUARES: st = be->ops->sum_squares(be, dr, dx, n); break;
    case OP_SUM_POW4: st = be->ops->sum_pow4(be, dr, dx, n); break;
    case OP_DOT: st = be->ops->dot(be, dr, dx, dy, n); break;
    case OP_SUM: st = be->ops->sum(be, dr, dx, n); break;
    case OP_MAX_ABS: st = be->ops->max_abs(be, dr, dx, n); break;
    }
    ck_assert_msg(st == LUNA_OK, "%s: %s", op_names[op], luna_error_message());
    float r = lh_scalar(be, dr);
    lh_free(be, dx);
    lh_free(be, dy);
    lh_free(be, dr);
    return r;
}

/* Naive double reference and the magnitude Σ|term| that bounds its rounding error. */
static double naive(int op, const float *x, const float *y, int64_t n, double *magnitude) {
    double s = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i], t = 0.0;
        switch (op) {
        case OP_SUM_SQUARES: t = v * v; break;
        case OP_SUM_POW4: t = v * v * v * v; break;
        case OP_DOT: t = v * (double)y[i]; break;
        case OP_SUM: t = v; break;
        case OP_MAX_ABS: s = fmax(s, fabs(v)); continue;
        }
        s += t;
        mag += fabs(t);
    }
    *magnitude = op == OP_MAX_ABS ? s : mag;
    return s;
}

static const int64_t sizes[] = {0, 1, 7, 4095, 4096, 4097, 1000003, 3000001};
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

START_TEST(reductions_match_naive_double) {
    luna_backend *be = lh_backend(2);
    double worst[OP_COUNT] = {0};
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = sizes[si];
        float *x = random_vector(100 + (uint64_t)si, n, -2.0f, 2.0f);
        float *y = random_vector(200 + (uint64_t)si, n, -1.0f, 3.0f);
        for (int op = 0; op < OP_COUNT; op++) {
            double mag;
            double ref = naive(op, x, y, n, &mag);
            float got = run_op(be, op, x, y, n);
            /* One float rounding of a double sum: error ≤ 2^-24 · |ref| (+ double noise). */
            double err = fabs((double)got - ref), tol = 1.2e-7 * fabs(ref) + 1e-12 * mag;
            ck_assert_msg(err <= tol, "%s n=%lld: got %.9g, naive %.12g", op_names[op],
                          (long long)n, (double)got, ref);
            if (ref != 0.0 && err / fabs(ref) > worst[op]) worst[op] = err / fabs(ref);
        }
        free(x);
        free(y);
    }
    for (int op = 0; op < OP_COUNT; op++)
        printf("reduce %-12s worst relative error vs naive double: %.3g\n", op_names[op],
               worst[op]);
    luna_backend_free(be);
}
END_TEST

/* The fixed blocking makes every result bit-identical whatever the thread count. */
START_TEST(reductions_bit_identical_across_threads) {
    luna_backend *be = lh_backend(1);
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = sizes[si];
        float *x = random_vector(300 + (uint64_t)si, n, -1.0f, 1.0f);
        float *y = random_vector(400 + (uint64_t)si, n, -1.0f, 1.0f);
        for (int op = 0; op < OP_COUNT; op++) {
            float r[3];
            for (int t = 1; t <= 3; t++) {
                lh_set_threads(be, t);
                r[t - 1] = run_op(be, op, x, y, n);
            }
            ck_assert_msg(memcmp(&r[0], &r[1], sizeof(float)) == 0 &&
                              memcmp(&r[0], &r[2], sizeof(float)) == 0,
                          "%s n=%lld: %.9g (1 thread) %.9g (2) %.9g (3)", op_names[op],
                          (long long)n, (double)r[0], (double)r[1], (double)r[2]);
        }
        free(x);
        free(y);
    }
    luna_backend_free(be);
}
END_TEST

START_TEST(reductions_special_values_and_scratch) {
    luna_backend *be = lh_backend(2);
    float x[5] = {1.0f, -3.0f, 2.0f, -0.5f, 0.25f};
    ck_assert_float_eq(run_op(be, OP_MAX_ABS, x, NULL, 5), 3.0f);
    ck_assert_float_eq(run_op(be, OP_MAX_ABS, x, NULL, 0), 0.0f);
    ck_assert_float_eq(run_op(be, OP_SUM, x, NULL, 0), 0.0f);
    x[3] = NAN;
    ck_assert(isnan(run_op(be, OP_MAX_ABS, x, NULL, 5))); /* NaN is never hidden by a max */
    ck_assert(isnan(run_op(be, OP_SUM_SQUARES, x, NULL, 5)));
    x[3] = INFINITY;
    ck_assert(isinf(run_op(be, OP_MAX_ABS, x, NULL, 5)));
    float *dx = lh_f32(be, x, 5), *dr = lh_alloc(be, sizeof(float));
    ck_assert_int_eq(be->ops->sum(be, dr, dx, -1), LUNA_ERR_INVALID_ARGUMENT);
    lh_free(be, dx);
    lh_free(be, dr);
    /* Large n uses scratch for the block partials and gives it back. */
    int64_t n = 3000001;
    float *big = random_vector(7, n, -1.0f, 1.0f);
    size_t before = be->scratch ? luna_arena_used_bytes(be->scratch) : 0;
    run_op(be, OP_SUM_SQUARES, big, NULL, n);
    if (be->scratch) ck_assert_uint_eq(luna_arena_used_bytes(be->scratch), before);
    free(big);
    luna_backend_free(be);
}
END_TEST

/* ---- Backward ops: finite differences of g · reduction(x) ---------------------------------- */
typedef struct {
    luna_backend *be;
    int op;
    float *x, *y;
    int64_t n;
    float g;
} reduce_ctx;

static double reduce_loss(void *p) {
    reduce_ctx *c = p;
    return (double)c->g * (double)run_op(c->be, c->op, c->x, c->y, c->n);
}

/* Analytic gradient: backward op into a zeroed device buffer (wrt x, or wrt y for which = 1),
 * copied to the host vector grad. */
static void reduce_grad(reduce_ctx *c, int which, float *grad) {
    luna_backend *be = c->be;
    size_t n = (size_t)c->n;
    float *dx = lh_f32(be, c->x, n), *dy = lh_f32(be, c->y, n), *dg = lh_f32(be, NULL, n);
    luna_status st = LUNA_ERR_INTERNAL;
    if (c->op == OP_SUM_SQUARES) st = be->ops->sum_squares_backward(be, dg, dx, c->g, c->n);
    if (c->op == OP_SUM_POW4) st = be->ops->sum_pow4_backward(be, dg, dx, c->g, c->n);
    if (c->op == OP_DOT)
        st = which == 0 ? be->ops->dot_backward(be, dg, NULL, dx, dy, c->g, c->n)
                        : be->ops->dot_backward(be, NULL, dg, dx, dy, c->g, c->n);
    ck_assert_int_eq(st, LUNA_OK);
    lh_download(be, grad, dg, n * sizeof *grad);
    lh_free(be, dx);
    lh_free(be, dy);
    lh_free(be, dg);
}

START_TEST(reduction_backward_gradcheck) {
    luna_backend *be = lh_backend(2);
    const int64_t ns[] = {1, 2, 7, 33, 130};
    const int ops[] = {OP_SUM_SQUARES, OP_SUM_POW4, OP_DOT};
    double worst[3] = {0};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        for (int oi = 0; oi < 3; oi++) {
            int64_t n = ns[k];
            reduce_ctx c = {be,
                            ops[oi],
                            random_vector(10 + k, n, -1.5f, 1.5f),
                            random_vector(20 + k, n, -1.5f, 1.5f),
                            n,
                            0.75f};
            /* |x| ≥ 0.5: the central difference of x⁴ has relative truncation error h²/x². */
            for (int64_t i = 0; i < n; i++) {
                if (fabsf(c.x[i]) < 0.5f) c.x[i] = copysignf(0.5f + fabsf(c.x[i]), c.x[i]);
                if (fabsf(c.y[i]) < 0.5f) c.y[i] = copysignf(0.5f + fabsf(c.y[i]), c.y[i]);
            }
            float *grad = malloc((size_t)n * sizeof *grad);
            char what[64];
            for (int which = 0; which < (ops[oi] == OP_DOT ? 2 : 1); which++) {
                reduce_grad(&c, which, grad);
                snprintf(what, sizeof what, "%s_backward n=%lld wrt %s", op_names[ops[oi]],
                         (long long)n, which ? "y" : "x");
                double e = luna_test_gradcheck(what, reduce_loss, &c, which ? c.y : c.x, (size_t)n,
                                               grad, 1e-2, 2e-3, 1e-3);
                worst[oi] = fmax(worst[oi], e);
            }
            free(grad);
            free(c.x);
            free(c.y);
        }
    }
    for (int oi = 0; oi < 3; oi++)
        printf("reduce %-12s backward worst gradcheck error: %.3g\n", op_names[ops[oi]], worst[oi]);
    luna_backend_free(be);
}
END_TEST

/* Backward ops accumulate (+=); dot_backward with dx == dy (the gradient of Σ x·x) adds both. */
START_TEST(reduction_backward_accumulates) {
    luna_backend *be = lh_backend(2);
    const int64_t n = 100003; /* above the threading threshold */
    const size_t bytes = (size_t)n * sizeof(float);
    float *x = random_vector(1, n, -1.0f, 1.0f), *y = random_vector(2, n, -1.0f, 1.0f);
    float *d0 = random_vector(3, n, -1.0f, 1.0f), *d = malloc(bytes), *d2 = malloc(bytes);
    float *dx = lh_f32(be, x, (size_t)n), *dy = lh_f32(be, y, (size_t)n);
    float *dd = lh_f32(be, d0, (size_t)n), *dd2 = lh_f32(be, d0, (size_t)n);
    const float g = 0.3f;
    int64_t bad = 0; /* counted, not asserted per element: Check writes a record per assertion */
    ck_assert_int_eq(be->ops->sum_squares_backward(be, dd, dx, g, n), LUNA_OK);
    lh_download(be, d, dd, bytes);
    for (int64_t i = 0; i < n; i++)
        bad += d[i] != d0[i] + (2.0f * g) * x[i];
    ck_assert_msg(bad == 0, "sum_squares_backward: %lld elements", (long long)bad);
    lh_upload(be, dd, d0, bytes);
    ck_assert_int_eq(be->ops->sum_pow4_backward(be, dd, dx, g, n), LUNA_OK);
    lh_download(be, d, dd, bytes);
    for (int64_t i = 0; i < n; i++)
        bad += d[i] != d0[i] + (4.0f * g) * (x[i] * x[i] * x[i]);
    ck_assert_msg(bad == 0, "sum_pow4_backward: %lld elements", (long long)bad);
    lh_upload(be, dd, d0, bytes);
    ck_assert_int_eq(be->ops->dot_backward(be, dd, dd2, dx, dy, g, n), LUNA_OK);
    lh_download(be, d, dd, bytes);
    lh_download(be, d2, dd2, bytes);
    for (int64_t i = 0; i < n; i++) {
        bad += d[i] != d0[i] + g * y[i];
        bad += d2[i] != d0[i] + g * x[i];
    }
    ck_assert_msg(bad == 0, "dot_backward: %lld elements", (long long)bad);
    lh_upload(be, dd, d0, bytes);
    ck_assert_int_eq(be->ops->dot_backward(be, dd, dd, dx, dx, g, n), LUNA_OK);
    lh_download(be, d, dd, bytes);
    for (int64_t i = 0; i < n; i++)
        bad += d[i] != (d0[i] + g * x[i]) + g * x[i];
    ck_assert_msg(bad == 0, "dot_backward with dx == dy: %lld elements", (long long)bad);
    free(x);
    free(y);
    free(d);
    free(d0);
    free(d2);
    lh_free(be, dx);
    lh_free(be, dy);
    lh_free(be, dd);
    lh_free(be, dd2);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    const char *op;
    int64_t n;
    float g;
} cmp_args;

/* d[0] x, d[1] y, d[2] the result (forward) or dx, d[3] dy (backward). */
static luna_status cmp_run(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    const luna_ops *o = be->ops;
    if (strcmp(a->op, "sum_squares") == 0) return o->sum_squares(be, d[2], d[0], a->n);
    if (strcmp(a->op, "sum_pow4") == 0) return o->sum_pow4(be, d[2], d[0], a->n);
    if (strcmp(a->op, "dot") == 0) return o->dot(be, d[2], d[0], d[1], a->n);
    if (strcmp(a->op, "sum") == 0) return o->sum(be, d[2], d[0], a->n);
    if (strcmp(a->op, "max_abs") == 0) return o->max_abs(be, d[2], d[0], a->n);
    if (strcmp(a->op, "sum_squares_backward") == 0)
        return o->sum_squares_backward(be, d[2], d[0], a->g, a->n);
    if (strcmp(a->op, "sum_pow4_backward") == 0)
        return o->sum_pow4_backward(be, d[2], d[0], a->g, a->n);
    return o->dot_backward(be, d[2], d[3], d[0], d[1], a->g, a->n); /* "dot_backward" */
}

START_TEST(reductions_match_reference_backend) {
    static const char *const ops[] = {
        "sum_squares",          "sum_pow4",         "dot", "sum", "max_abs", "dot_backward",
        "sum_squares_backward", "sum_pow4_backward"};
    const int64_t ns[] = {1, 7, 13, 4097, 100003};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = (size_t)ns[k];
        float *x = random_vector(500 + k, ns[k], -2.0f, 2.0f);
        float *y = random_vector(600 + k, ns[k], -1.0f, 3.0f);
        float *g0 = random_vector(700 + k, ns[k], -1.0f, 1.0f); /* backward: accumulated into */
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            bool backward = strstr(ops[i], "_backward") != NULL;
            cmp_args a = {ops[i], ns[k], 0.625f};
            lh_buf bufs[] = {{x, n, LH_F32, LH_IN},
                             {y, n, LH_F32, LH_IN},
                             {backward ? g0 : NULL, backward ? n : 1, LH_F32, LH_OUT},
                             {g0, n, LH_F32, LH_OUT}};
            char what[32];
            snprintf(what, sizeof what, "n=%zu", n);
            ck_assert_int_eq(lh_compare(ops[i], what, 2, cmp_run, &a, bufs, 4), LUNA_OK);
        }
        free(x);
        free(y);
        free(g0);
    }
}
END_TEST

static Suite *reduce_suite(void) {
    Suite *s = suite_create("ops_reduce");
    TCase *tc = tcase_create("reduce");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, reductions_match_naive_double);
    tcase_add_test(tc, reductions_bit_identical_across_threads);
    tcase_add_test(tc, reductions_special_values_and_scratch);
    tcase_add_test(tc, reduction_backward_gradcheck);
    tcase_add_test(tc, reduction_backward_accumulates);
    tcase_add_test(tc, reductions_match_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(reduce_suite()); }
