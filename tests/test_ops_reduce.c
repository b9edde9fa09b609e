/* Tests of the reduction behind gradient clipping, multi_sum_squares (model/kernels/cpu/
 * multi_tensor.c): per-tensor Σ x² against naive double sums, and bit for bit against the fixed
 * order of core/reduce_order.h computed on the host (lh_sum_squares_reference), for tensors of
 * 0, 1, 7, one block ± 1 and millions of elements in one table; bit-identical results for 1, 2
 * and 3 threads; NaN and Inf propagate to their tensor only; bad arguments rejected. Every buffer
 * is device memory of the backend under test (LUNA_TEST_BACKEND, tests/backend_harness.h); the
 * table is built on it. (The op against the CPU reference: tests/test_ops_multi_tensor.c.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/reduce_order.h"
#include "core/tensor_table.h"
#include "tests/backend_harness.h"

static const int64_t SIZES[] = {
    0, 1, 7, LUNA_REDUCE_BLOCK - 1, LUNA_REDUCE_BLOCK, LUNA_REDUCE_BLOCK + 1, 1000003, 3000001};
#define NT ((int)(sizeof SIZES / sizeof SIZES[0]))
#define GAP 5 /* elements between tensors in the flat buffer */

typedef struct {
    int64_t offsets[NT], numels[NT];
    size_t total;
    float *host; /* the flat buffer, per-tensor magnitudes 10^(i mod 3 − 1) */
} flat;

static void flat_make(flat *f, uint64_t seed) {
    size_t off = 3;
    for (int i = 0; i < NT; i++) {
        f->offsets[i] = (int64_t)off;
        f->numels[i] = SIZES[i];
        off += (size_t)SIZES[i] + GAP;
    }
    f->total = off;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    f->host = luna_test_random_vector(&rng, f->total, -2.0f, 2.0f);
    for (int i = 0; i < NT; i++) {
        const float m = (float)pow(10.0, (double)(i % 3) - 1.0);
        for (int64_t j = 0; j < SIZES[i]; j++)
            f->host[f->offsets[i] + j] *= m;
    }
}

/* result[NT] = multi_sum_squares of the flat buffer on `be`; returns the op's status. */
static luna_status run(luna_backend *be, const flat *f, float *result) {
    luna_tensor_table *tt = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, be, NT, f->offsets, f->numels));
    float *x = lh_f32(be, f->host, f->total), *r = lh_alloc(be, NT * sizeof(float));
    luna_status st = be->ops->multi_sum_squares(be, r, x, tt);
    if (st == LUNA_OK) lh_download(be, result, r, NT * sizeof(float));
    lh_free(be, x);
    lh_free(be, r);
    luna_tensor_table_free(tt);
    return st;
}

/* Against a naive double sum (one rounding: within 2^-24 relative plus double noise) and bit for
 * bit against the documented order. */
START_TEST(sums_match_naive_double_and_the_fixed_order) {
    luna_backend *be = lh_backend(2);
    flat f;
    flat_make(&f, 11);
    float got[NT];
    LUNA_CHECK_OK(run(be, &f, got));
    double worst = 0.0;
    for (int i = 0; i < NT; i++) {
        const float *x = f.host + f.offsets[i];
        double naive = 0.0;
        for (int64_t j = 0; j < SIZES[i]; j++)
            naive += (double)x[j] * (double)x[j];
        const double err = fabs((double)got[i] - naive);
        ck_assert_msg(err <= 1.2e-7 * naive + 1e-300, "tensor %d (n=%lld): %.9g, naive %.12g", i,
                      (long long)SIZES[i], (double)got[i], naive);
        if (naive > 0) worst = fmax(worst, err / naive);
        const float want = lh_sum_squares_reference(x, SIZES[i]);
        ck_assert_msg(memcmp(&got[i], &want, sizeof want) == 0,
                      "tensor %d (n=%lld): %.9g, the fixed order gives %.9g", i,
                      (long long)SIZES[i], (double)got[i], (double)want);
    }
    printf("multi_sum_squares: worst relative error vs naive double %.3g\n", worst);
    free(f.host);
    luna_backend_free(be);
}
END_TEST

/* The fixed blocking makes every result bit-identical whatever the thread count. */
START_TEST(sums_bit_identical_across_threads) {
    luna_backend *be = lh_backend(1);
    flat f;
    flat_make(&f, 12);
    float r[3][NT];
    for (int t = 1; t <= 3; t++) {
        lh_set_threads(be, t);
        LUNA_CHECK_OK(run(be, &f, r[t - 1]));
    }
    ck_assert_int_eq(memcmp(r[0], r[1], sizeof r[0]), 0);
    ck_assert_int_eq(memcmp(r[0], r[2], sizeof r[0]), 0);
    free(f.host);
    luna_backend_free(be);
}
END_TEST

/* A NaN or Inf reaches its tensor's sum (clipping must see a non-finite gradient) and no other;
 * a table or result that is missing is an error, one line naming the op. */
START_TEST(special_values_and_bad_arguments) {
    luna_backend *be = lh_backend(2);
    flat f;
    flat_make(&f, 13);
    f.host[f.offsets[3] + 100] = NAN;
    f.host[f.offsets[6] + 999999] = INFINITY;
    float got[NT];
    LUNA_CHECK_OK(run(be, &f, got));
    for (int i = 0; i < NT; i++)
        if (i == 3)
            ck_assert(isnan(got[i]));
        else if (i == 6)
            ck_assert(isinf(got[i]));
        else
            ck_assert(isfinite(got[i]));
    ck_assert(got[0] == 0.0f); /* an empty tensor */
    luna_tensor_table *tt = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, be, NT, f.offsets, f.numels));
    float *x = lh_f32(be, f.host, f.total);
    ck_assert_int_eq(be->ops->multi_sum_squares(be, NULL, x, tt), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "multi_sum_squares: null pointer"));
    ck_assert_int_eq(be->ops->multi_sum_squares(be, (float *)x, x, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    lh_free(be, x);
    luna_tensor_table_free(tt);
    free(f.host);
    luna_backend_free(be);
}
END_TEST

static Suite *reduce_suite(void) {
    Suite *s = suite_create("ops_reduce");
    TCase *tc = tcase_create("reduce");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, sums_match_naive_double_and_the_fixed_order);
    tcase_add_test(tc, sums_bit_identical_across_threads);
    tcase_add_test(tc, special_values_and_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(reduce_suite()); }
