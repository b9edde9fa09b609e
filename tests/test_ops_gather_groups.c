/* gather_rows_in_groups (core/backend.h): a beam reorder within each sentence's group of rows,
 * in place: permutations, repeats (a parent chosen by several beams), the identity, groups of 1
 * and 32, columns that are not a multiple of the device's chunk, fewer columns than the stride
 * (the rest of each row untouched), none; every case against a host loop on the backend under
 * test (LUNA_TEST_BACKEND), bit for bit, and against the CPU reference (EXACT); bad sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

typedef struct {
    int64_t n_groups;
    int group;
    int64_t cols, stride;
} groups_args;

/* d[0] buf [n_groups·group, stride], d[1] idx [n_groups·group]. */
static luna_status run_groups(luna_backend *be, void *const *d, const void *args) {
    const groups_args *a = args;
    return be->ops->gather_rows_in_groups(be, d[0], a->stride, d[1], a->n_groups, a->group,
                                          a->cols);
}

static void check_case(const groups_args *a, int kind, uint64_t seed) {
    const int64_t rows = a->n_groups * a->group, n = rows * a->stride;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *buf = luna_test_random_vector(&rng, (size_t)(n ? n : 1), -4, 4);
    int32_t *idx = malloc((size_t)(rows ? rows : 1) * sizeof *idx);
    ck_assert_ptr_nonnull(idx);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g0 = r - r % a->group;
        const int u = (int)luna_test_uniform(&rng, 0.0f, (float)a->group - 0.01f);
        /* kind 0: random parents (repeats), 1: reversed, 2: identity */
        idx[r] = (int32_t)(g0 + (kind == 0   ? u
                                 : kind == 1 ? a->group - 1 - r % a->group
                                             : r % a->group));
    }
    float *want = malloc((size_t)(n ? n : 1) * sizeof *want);
    ck_assert_ptr_nonnull(want);
    memcpy(want, buf, (size_t)n * sizeof *want);
    for (int64_t r = 0; r < rows; r++)
        memcpy(want + r * a->stride, buf + idx[r] * a->stride, (size_t)a->cols * sizeof *want);
    char what[96];
    snprintf(what, sizeof what, "%lld groups of %d, cols %lld stride %lld, %s",
             (long long)a->n_groups, a->group, (long long)a->cols, (long long)a->stride,
             kind == 0   ? "random parents"
             : kind == 1 ? "reversed"
                         : "identity");

    luna_backend *be = lh_backend(2);
    float *vbuf = lh_f32(be, buf, (size_t)n);
    int32_t *vidx = lh_i32(be, idx, (size_t)rows);
    LUNA_CHECK_OK(
        be->ops->gather_rows_in_groups(be, vbuf, a->stride, vidx, a->n_groups, a->group, a->cols));
    float *got = lh_fetch_f32(be, vbuf, (size_t)n);
    for (int64_t e = 0; e < n; e++)
        ck_assert_msg(memcmp(&got[e], &want[e], sizeof(float)) == 0,
                      "gather_rows_in_groups [%s]: row %lld col %lld = %.9g, want %.9g", what,
                      (long long)(e / a->stride), (long long)(e % a->stride), (double)got[e],
                      (double)want[e]);
    lh_free(be, vbuf), lh_free(be, vidx);
    luna_backend_free(be);

    lh_buf bufs[] = {{buf, (size_t)n, LH_F32, LH_OUT}, {idx, (size_t)rows, LH_I32, LH_IN}};
    if (n > 0)
        ck_assert_int_eq(lh_compare("gather_rows_in_groups", what, 2, run_groups, a, bufs, 2),
                         LUNA_OK);
    free(buf), free(idx), free(want), free(got);
}

START_TEST(gather_rows_in_groups_matches_host_loop) {
    /* groups, group, cols, stride */
    const groups_args cases[] = {{5, 4, 37, 37},   {3, 4, 600, 613}, {1, 32, 300, 300},
                                 {9, 1, 64, 64},   {2, 8, 0, 5},     {40, 5, 257, 260},
                                 {7, 16, 512, 512}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int kind = 0; kind < 3; kind++)
            check_case(&cases[k], kind, 700 + 3 * k + (uint64_t)kind);
}
END_TEST

START_TEST(gather_rows_in_groups_rejects_bad_sizes) {
    luna_backend *be = lh_backend(1);
    float *b = lh_alloc(be, 64 * sizeof(float));
    int32_t *idx = lh_alloc(be, 8 * sizeof(int32_t));
    const int64_t bad[][4] = {{1, 0, 4, 4}, {1, 33, 1, 1}, {1, 2, 5, 4}, {-1, 2, 1, 1}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ck_assert_int_eq(be->ops->gather_rows_in_groups(be, b, bad[k][3], idx, bad[k][0],
                                                        (int)bad[k][1], bad[k][2]),
                         LUNA_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "gather_rows_in_groups"));
        luna_error_clear();
    }
    lh_free(be, b), lh_free(be, idx);
    luna_backend_free(be);
}
END_TEST

static Suite *groups_suite(void) {
    Suite *s = suite_create("ops_gather_groups");
    TCase *tc = tcase_create("gather_groups");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gather_rows_in_groups_matches_host_loop);
    tcase_add_test(tc, gather_rows_in_groups_rejects_bad_sizes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(groups_suite()); }
