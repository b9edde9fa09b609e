/* index_rows_update (core/backend.h), the transformer's cache-slot table kept on the backend
 * (decoding/cache_slots.h): a row gather with repeats and permutations over the first `cols` of
 * `stride` int32 (the rest of each row untouched), a set per row after it, the sets alone in
 * place, both together; every case against a host loop on the backend under test
 * (LUNA_TEST_BACKEND), bit for bit, and against the CPU reference (EXACT); argument errors. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

typedef struct {
    int64_t n, cols, stride;
    bool gather, in_place, set;
} index_args;

/* d[0] dst [n, stride], d[1] src [src_rows, stride], d[2] idx [n], d[3] set_col, d[4] set_val. */
static luna_status run_index_rows(luna_backend *be, void *const *d, const void *args) {
    const index_args *a = args;
    return be->ops->index_rows_update(be, d[0], a->in_place ? d[0] : d[1], a->gather ? d[2] : NULL,
                                      a->n, a->cols, a->stride, a->set ? d[3] : NULL, d[4]);
}

static int32_t *ints(luna_test_rng *rng, size_t n, int32_t lo, int32_t hi) {
    int32_t *v = malloc((n ? n : 1) * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = lo + (int32_t)luna_test_uniform(rng, 0.0f, (float)(hi - lo + 1) - 0.5f);
    return v;
}

static void check_case(const index_args *a, int src_rows, uint64_t seed) {
    const int64_t n = a->n, stride = a->stride;
    const int rows_in = a->in_place || !a->gather ? (int)n : src_rows; /* no index: row i */
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    int32_t *src = ints(&rng, (size_t)(rows_in * stride), 0, 1000);
    int32_t *dst0 = a->in_place ? src : ints(&rng, (size_t)(n * stride), 2000, 3000);
    int32_t *idx = ints(&rng, (size_t)n, 0, src_rows - 1);
    int32_t *col = ints(&rng, (size_t)n, 0, (int32_t)stride - 1);
    int32_t *val = ints(&rng, (size_t)n, 5000, 6000);
    /* the reference: gather, then sets */
    int32_t *want = malloc((size_t)(n * stride + 1) * sizeof *want);
    ck_assert_ptr_nonnull(want);
    memcpy(want, dst0, (size_t)(n * stride) * sizeof *want);
    for (int64_t i = 0; i < n && !a->in_place; i++)
        memcpy(want + i * stride, src + (a->gather ? idx[i] : i) * stride,
               (size_t)a->cols * sizeof *want);
    for (int64_t i = 0; i < n && a->set; i++)
        want[i * stride + col[i]] = val[i];
    char what[96];
    snprintf(what, sizeof what, "n %lld cols %lld stride %lld%s%s%s", (long long)n,
             (long long)a->cols, (long long)stride, a->gather ? " idx" : "",
             a->in_place ? " in place" : "", a->set ? " sets" : "");

    luna_backend *be = lh_backend(2);
    int32_t *vdst = lh_i32(be, dst0, (size_t)(n * stride));
    int32_t *vsrc = a->in_place ? vdst : lh_i32(be, src, (size_t)(rows_in * stride));
    int32_t *vidx = lh_i32(be, idx, (size_t)n), *vcol = lh_i32(be, col, (size_t)n);
    int32_t *vval = lh_i32(be, val, (size_t)n);
    LUNA_CHECK_OK(be->ops->index_rows_update(be, vdst, vsrc, a->gather ? vidx : NULL, n, a->cols,
                                             stride, a->set ? vcol : NULL, vval));
    int32_t *got = malloc((size_t)(n * stride + 1) * sizeof *got);
    ck_assert_ptr_nonnull(got);
    lh_download(be, got, vdst, (size_t)(n * stride) * sizeof *got);
    for (int64_t e = 0; e < n * stride; e++)
        ck_assert_msg(got[e] == want[e], "index_rows_update [%s]: dst[%lld][%lld] = %d, want %d",
                      what, (long long)(e / stride), (long long)(e % stride), got[e], want[e]);
    if (!a->in_place) lh_free(be, vsrc);
    lh_free(be, vdst), lh_free(be, vidx), lh_free(be, vcol), lh_free(be, vval);
    luna_backend_free(be);

    lh_buf bufs[] = {{dst0, (size_t)(n * stride), LH_I32, LH_OUT},
                     {src, (size_t)(rows_in * stride), LH_I32, LH_IN},
                     {idx, (size_t)n, LH_I32, LH_IN},
                     {col, (size_t)n, LH_I32, LH_IN},
                     {val, (size_t)n, LH_I32, LH_IN}};
    ck_assert_int_eq(lh_compare("index_rows_update", what, 2, run_index_rows, a, bufs, 5), LUNA_OK);
    if (!a->in_place) free(dst0);
    free(src), free(idx), free(col), free(val), free(want), free(got);
}

START_TEST(index_rows_update_matches_host_loop) {
    /* n, cols, stride, gather, in place, set; source rows */
    const index_args cases[] = {
        {12, 5, 9, true, false, false},   {12, 9, 9, true, false, true},
        {7, 0, 4, false, false, true},    {7, 3, 4, false, true, true},
        {1, 257, 300, true, false, true}, {40, 130, 131, false, false, true},
        {33, 17, 64, true, false, true},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_case(&cases[k], 9, 500 + k);
}
END_TEST

START_TEST(index_rows_update_rejects_bad_arguments) {
    luna_backend *be = lh_backend(1);
    int32_t *t = lh_alloc(be, 64 * sizeof(int32_t)), *idx = lh_alloc(be, 4 * sizeof(int32_t));
    /* cols > stride, a gather in place, sets without values */
    ck_assert_int_eq(be->ops->index_rows_update(be, t, t + 32, NULL, 2, 9, 8, NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(be->ops->index_rows_update(be, t, t, idx, 2, 4, 8, NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(be->ops->index_rows_update(be, t, t, NULL, 2, 0, 8, idx, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "index_rows_update"));
    luna_error_clear();
    lh_free(be, t), lh_free(be, idx);
    luna_backend_free(be);
}
END_TEST

static Suite *index_rows_suite(void) {
    Suite *s = suite_create("ops_index_rows");
    TCase *tc = tcase_create("index_rows");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, index_rows_update_matches_host_loop);
    tcase_add_test(tc, index_rows_update_rejects_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(index_rows_suite()); }
