/* Every op of struct luna_ops (parsed from core/backend.h at test time) has a row in the op-test
 * harness's table of compared ops, each row names a real op and a suite whose source compares it,
 * the harness's comparison and buffers do what tests/backend_harness.h says, and every backend's
 * kernels sit behind the argument checks of core/op_checks.c (a bad argument never reaches a
 * kernel; a kernel table missing an op is refused). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/backend_harness.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define COVERAGE_ASAN 1
#endif

#define MAX_OPS 256

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    ck_assert_int_ge(size, 0);
    rewind(f);
    char *text = malloc((size_t)size + 1);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_eq(fread(text, 1, (size_t)size, f), (size_t)size);
    text[size] = '\0';
    fclose(f);
    return text;
}

/* The names of the `luna_status (*name)(` members of struct luna_ops, in order. */
static int parse_ops(char names[][64]) {
    char *text = read_text(LUNA_SOURCE_DIR "/core/backend.h");
    char *begin = strstr(text, "struct luna_ops {");
    ck_assert_msg(begin != NULL, "core/backend.h: no `struct luna_ops {`");
    char *end = strstr(begin, "\n};");
    ck_assert_msg(end != NULL, "core/backend.h: struct luna_ops is not closed");
    *end = '\0';
    int n = 0;
    static const char key[] = "luna_status (*";
    for (char *p = strstr(begin, key); p; p = strstr(p, key)) {
        p += sizeof key - 1;
        char *close = strstr(p, ")(");
        ck_assert_msg(close != NULL && close - p < 64, "core/backend.h: cannot parse an op");
        ck_assert_int_lt(n, MAX_OPS);
        memcpy(names[n], p, (size_t)(close - p));
        names[n][close - p] = '\0';
        n++;
    }
    free(text);
    return n;
}

START_TEST(every_op_has_a_comparison_row) {
    static char ops[MAX_OPS][64];
    int n = parse_ops(ops);
    ck_assert_msg(n >= 40, "core/backend.h: only %d ops parsed from struct luna_ops", n);
    int missing = 0;
    for (int i = 0; i < n; i++)
        if (!lh_find_op(ops[i])) {
            printf("op %s (core/backend.h) has no row in tests/backend_harness.c's table of "
                   "compared ops\n",
                   ops[i]);
            missing++;
        }
    ck_assert_msg(missing == 0, "%d op(s) of struct luna_ops are not compared across backends",
                  missing);
    printf("%d ops of struct luna_ops, each with a comparison row\n", n);
}
END_TEST

START_TEST(every_row_is_an_op_compared_by_its_suite) {
    static char ops[MAX_OPS][64];
    int n = parse_ops(ops);
    for (const lh_op_row *r = lh_op_rows(); r->op; r++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            found += strcmp(ops[i], r->op) == 0;
        ck_assert_msg(found == 1, "row %s: not an op of struct luna_ops", r->op);
        for (const lh_op_row *s = r + 1; s->op; s++)
            ck_assert_msg(strcmp(r->op, s->op) != 0, "row %s appears twice", r->op);
        char path[512], quoted[80];
        snprintf(path, sizeof path, "%s/tests/%s.c", LUNA_SOURCE_DIR, r->suite);
        snprintf(quoted, sizeof quoted, "\"%s\"", r->op);
        char *src = read_text(path);
        char *hit = strstr(src, quoted);
        ck_assert_msg(hit != NULL, "row %s: tests/%s.c never names it (lh_compare(\"%s\", ...))",
                      r->op, r->suite, r->op);
        free(src);
    }
}
END_TEST

/* The tiers accept what the contract allows and reject what it does not. */
START_TEST(tiers_accept_and_reject) {
    float ref[4] = {1.0f, -2.0f, 1e-3f, 0.0f}, got[4];
    memcpy(got, ref, sizeof got);
    for (lh_tier t = LH_EXACT; t <= LH_ACCUM; t++)
        ck_assert_uint_eq(lh_mismatch(t, false, got, ref, 4), 0);
    got[1] = nextafterf(ref[1], 0.0f); /* one ulp, 6e-8 relative */
    ck_assert_uint_eq(lh_mismatch(LH_EXACT, false, got, ref, 4), 2);
    ck_assert_uint_eq(lh_mismatch(LH_NORM, true, got, ref, 4), 2); /* same backend: bit-equal */
    ck_assert_uint_eq(lh_mismatch(LH_NORM, false, got, ref, 4), 0);
    ck_assert_uint_eq(lh_mismatch(LH_ACCUM, false, got, ref, 4), 0);
    got[1] = ref[1] * (1.0f + 3e-6f); /* beyond NORM's 1e-6, within ACCUM's 1e-5 */
    ck_assert_uint_eq(lh_mismatch(LH_NORM, false, got, ref, 4), 2);
    ck_assert_uint_eq(lh_mismatch(LH_ACCUM, false, got, ref, 4), 0);
    got[1] = ref[1];
    got[3] = 1.5e-5f; /* ACCUM: relative to the result's magnitude (2): 1.5e-5 < 2e-5 */
    ck_assert_uint_eq(lh_mismatch(LH_ACCUM, false, got, ref, 4), 0);
    got[3] = 3e-5f;
    ck_assert_uint_eq(lh_mismatch(LH_ACCUM, false, got, ref, 4), 4);
    got[3] = 0.0f;
    got[0] = NAN;
    ck_assert_uint_eq(lh_mismatch(LH_ACCUM, false, got, ref, 4), 1);
}
END_TEST

static luna_status run_scale(luna_backend *be, void *const *dev, const void *args) {
    return be->ops->scale_act(be, dev[0], *(const float *)args, (int64_t)lh_size(dev[0]) / 4);
}

/* lh_compare runs the op on both backends and returns its status (an error on both: equal). */
START_TEST(compare_runs_both_backends) {
    float x[13];
    for (int i = 0; i < 13; i++)
        x[i] = (float)i - 6.5f;
    lh_buf bufs[] = {{x, 13, LH_F32, LH_OUT}};
    float alpha = 0.75f;
    ck_assert_int_eq(lh_compare("scale_act", "13 elements", 2, run_scale, &alpha, bufs, 1),
                     LUNA_OK);
}
END_TEST

/* Buffers are exactly the bytes asked for: under ASan the CPU backend's slack is poisoned;
 * fresh buffers hold NaN until written. */
START_TEST(buffers_are_exact_and_poisoned) {
    luna_backend *be = lh_backend(1);
    float *d = lh_alloc(be, 13 * sizeof(float));
    ck_assert_uint_eq(lh_size(d), 13 * sizeof(float));
    float h[13];
    lh_download(be, h, d, sizeof h);
    for (int i = 0; i < 13; i++)
        ck_assert(isnan(h[i]));
#ifdef COVERAGE_ASAN
    if (be->device == LUNA_DEVICE_CPU) {
        ck_assert(!__asan_address_is_poisoned((char *)d + 12 * sizeof(float)));
        ck_assert(__asan_address_is_poisoned((char *)d + 13 * sizeof(float)));
        printf("ASan: the byte after a 52-byte buffer is poisoned\n");
    }
#endif
    lh_free(be, d);
    ck_assert_uint_eq(be->bytes_in_use, 0);
    luna_backend_free(be);
}
END_TEST

/* A kernel that counts its calls, in place of the backend's add. */
static int add_calls;
static luna_status counting_add(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                                int64_t n) {
    (void)be, (void)y, (void)a, (void)b, (void)n;
    add_calls++;
    return LUNA_OK;
}

START_TEST(kernels_sit_behind_the_checks) {
    luna_backend *be = lh_backend(1);
    ck_assert_ptr_nonnull(be->kernels);
    ck_assert_ptr_ne(be->ops, be->kernels);
    /* a copy of the backend whose add kernel counts: the checks call it only with good arguments */
    luna_ops counting = *be->kernels;
    counting.add = counting_add;
    luna_backend copy = *be;
    LUNA_CHECK_OK(luna_backend_set_kernels(&copy, &counting));
    ck_assert_ptr_eq(copy.ops, be->ops); /* the same checks for every backend */
    float *x = lh_alloc(be, 4 * sizeof(float));
    ck_assert_int_eq(copy.ops->add(&copy, x, x, NULL, 4), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_str_eq(luna_error_message(), "add: null pointer or negative size (n=4)");
    ck_assert_int_eq(copy.ops->add(&copy, x, x, x, -1), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(add_calls, 0);
    LUNA_CHECK_OK(copy.ops->add(&copy, x, x, x, 4));
    LUNA_CHECK_OK(
        copy.ops->add(&copy, NULL, NULL, NULL, 0)); /* nothing to do: no pointers needed */
    ck_assert_int_eq(add_calls, 2);
    /* a kernel table without an op is refused, naming the backend */
    counting.cache_products = NULL;
    ck_assert_int_eq(luna_backend_set_kernels(&copy, &counting), LUNA_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "has no kernel"));
    lh_free(be, x);
    luna_backend_free(be);
}
END_TEST

static Suite *coverage_suite(void) {
    Suite *s = suite_create("ops_coverage");
    TCase *tc = tcase_create("coverage");
    tcase_add_test(tc, every_op_has_a_comparison_row);
    tcase_add_test(tc, every_row_is_an_op_compared_by_its_suite);
    tcase_add_test(tc, tiers_accept_and_reject);
    tcase_add_test(tc, compare_runs_both_backends);
    tcase_add_test(tc, buffers_are_exact_and_poisoned);
    tcase_add_test(tc, kernels_sit_behind_the_checks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(coverage_suite()); }
