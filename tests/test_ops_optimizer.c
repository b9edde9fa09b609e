/* The optimizer updates at the op level, over tables of one tensor (the update of each tensor of a
 * table is this, whatever the other tensors: tests/test_optim_multi.c): Adam's update against a
 * double formula, and both updates on the backend under test (LUNA_TEST_BACKEND) against the CPU
 * reference for every rebound and weight-decay type, odd sizes and a later step. (The optimizers
 * themselves, Apollo's golden values and resume, are tests/test_optim_*.c; tables of many tensors
 * against the reference, tests/test_ops_multi_tensor.c.) Ops get device buffers from the harness
 * (tests/backend_harness.h); each table and step counter is built on the backend the op runs
 * on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"
#include "tests/backend_harness.h"

static float *vec(uint64_t seed, size_t n, float lo, float hi) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    return luna_test_random_vector(&rng, n, lo, hi);
}

/* One tensor of n elements at offset 0, on `be`, and its step counter (= step − 1) there. */
static luna_tensor_table *one_tensor(luna_backend *be, int64_t n, int64_t step, int64_t **steps) {
    const int64_t offset = 0;
    luna_tensor_table *tt = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, be, 1, &offset, &n));
    const int64_t before = step - 1;
    *steps = lh_alloc(be, sizeof before);
    lh_upload(be, *steps, &before, sizeof before);
    return tt;
}

/* θ, m, v after one Adam update at step t, against fairseq's formula in double; the step counter
 * advances. */
START_TEST(adam_update_matches_formula) {
    luna_backend *be = lh_backend(2);
    const int64_t n = 1001, t = 3;
    const double lr = 1e-3, b1 = 0.9, b2 = 0.98, eps = 1e-8, wd = 0.01;
    float *th = vec(1, (size_t)n, -1, 1), *g = vec(2, (size_t)n, -1, 1);
    float *m = vec(3, (size_t)n, -0.1f, 0.1f), *v = vec(4, (size_t)n, 0, 0.01f);
    float *dth = lh_f32(be, th, (size_t)n), *dg = lh_f32(be, g, (size_t)n);
    float *dm = lh_f32(be, m, (size_t)n), *dv = lh_f32(be, v, (size_t)n);
    int64_t *steps;
    luna_tensor_table *tt = one_tensor(be, n, t, &steps);
    LUNA_CHECK_OK(
        be->ops->multi_adam_update(be, dth, dg, dm, dv, tt, steps, NULL, lr, b1, b2, eps, wd));
    float *th2 = lh_fetch_f32(be, dth, (size_t)n), *m2 = lh_fetch_f32(be, dm, (size_t)n);
    float *v2 = lh_fetch_f32(be, dv, (size_t)n);
    int64_t after;
    lh_download(be, &after, steps, sizeof after);
    ck_assert_int_eq(after, t);
    double step_size = lr * sqrt(1 - pow(b2, (double)t)) / (1 - pow(b1, (double)t));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double em = b1 * m[i] + (1 - b1) * g[i], ev = b2 * v[i] + (1 - b2) * (double)g[i] * g[i];
        double p = th[i] - lr * wd * th[i];
        double et = p - step_size * (float)em / (sqrt((float)ev) + eps);
        bad += fabs(m2[i] - em) > 1e-6 * fabs(em) + 1e-12;
        bad += fabs(v2[i] - ev) > 1e-6 * fabs(ev) + 1e-12;
        bad += fabs(th2[i] - et) > 1e-6 * fabs(et) + 1e-9;
    }
    ck_assert_msg(bad == 0, "multi_adam_update: %lld values differ from the formula",
                  (long long)bad);
    free(th);
    free(g);
    free(m);
    free(v);
    free(th2);
    free(m2);
    free(v2);
    lh_free(be, dth);
    lh_free(be, dg);
    lh_free(be, dm);
    lh_free(be, dv);
    lh_free(be, steps);
    luna_tensor_table_free(tt);
    luna_backend_free(be);
}
END_TEST

typedef struct {
    int64_t n, step;
    int rebound, wd_type;
    double wd;
} cmp_args;

/* d[0] theta, d[1] g, d[2] exp_avg, d[3] approx_hessian / exp_avg_sq, d[4] update. */
static luna_status cmp_apollo(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    int64_t *steps;
    luna_tensor_table *tt = one_tensor(be, a->n, a->step, &steps);
    luna_status st =
        be->ops->multi_apollo_update(be, d[0], d[1], d[2], d[3], d[4], tt, steps, NULL, 0.01, 0.9,
                                     1e-4, 0.01, a->rebound, a->wd, a->wd_type);
    lh_free(be, steps);
    luna_tensor_table_free(tt);
    return st;
}
static luna_status cmp_adam(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    int64_t *steps;
    luna_tensor_table *tt = one_tensor(be, a->n, a->step, &steps);
    luna_status st = be->ops->multi_adam_update(be, d[0], d[1], d[2], d[3], tt, steps, NULL, 1e-3,
                                                0.9, 0.98, 1e-8, a->wd);
    lh_free(be, steps);
    luna_tensor_table_free(tt);
    return st;
}

START_TEST(optimizer_ops_match_reference_backend) {
    const int64_t ns[] = {1, 7, 13, 4097, 10007};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = (size_t)ns[k];
        float *th = vec(10 + k, n, -1, 1), *g = vec(20 + k, n, -1, 1);
        float *m = vec(30 + k, n, -0.1f, 0.1f), *h = vec(40 + k, n, 0, 0.5f);
        float *u = vec(50 + k, n, -0.1f, 0.1f);
        lh_buf bufs[] = {{th, n, LH_F32, LH_OUT},
                         {g, n, LH_F32, LH_IN},
                         {m, n, LH_F32, LH_OUT},
                         {h, n, LH_F32, LH_OUT},
                         {u, n, LH_F32, LH_OUT}};
        char what[64];
        for (int step = 1; step <= 5; step += 4) {
            for (int rebound = 0; rebound < 2; rebound++)
                for (int wd_type = 0; wd_type < 3; wd_type++) {
                    cmp_args a = {ns[k], step, rebound, wd_type, 1e-4};
                    snprintf(what, sizeof what, "n %zu step %d rebound %d wd_type %d", n, step,
                             rebound, wd_type);
                    ck_assert_int_eq(
                        lh_compare("multi_apollo_update", what, 2, cmp_apollo, &a, bufs, 5),
                        LUNA_OK);
                }
            cmp_args a = {ns[k], step, 0, 0, 0.01};
            snprintf(what, sizeof what, "n %zu step %d", n, step);
            ck_assert_int_eq(lh_compare("multi_adam_update", what, 2, cmp_adam, &a, bufs, 4),
                             LUNA_OK);
        }
        free(th);
        free(g);
        free(m);
        free(h);
        free(u);
    }
}
END_TEST

static Suite *optimizer_suite(void) {
    Suite *s = suite_create("ops_optimizer");
    TCase *tc = tcase_create("optimizer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, adam_update_matches_formula);
    tcase_add_test(tc, optimizer_ops_match_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(optimizer_suite()); }
