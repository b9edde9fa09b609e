/* The op-cost layer (model/profile/op_profile.h, op_report.h): every op of struct luna_ops (parsed
 * from core/backend.h) has a counting wrapper, a name and a family; the cost formulas on known
 * shapes; ops through the wrapper give bit-identical results to the backend's own; attach/detach
 * restore the table; the affine extrapolation is exact on affine counters. CPU backend (device
 * memory is host memory there). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/profile/op_profile.h"
#include "model/profile/gpu_roofline.h"
#include "model/profile/op_report.h"
#include "model/kernels/registry.h"
#include "tests/test_util.h"

#define MAX_OPS 256

/* The names of the `luna_status (*name)(` members of struct luna_ops, in order. */
static int parse_ops(char names[][64]) {
    FILE *f = fopen(LUNA_SOURCE_DIR "/core/backend.h", "rb");
    ck_assert_ptr_nonnull(f);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *begin = strstr(text, "struct luna_ops {");
    ck_assert_ptr_nonnull(begin);
    char *end = strstr(begin, "\n};");
    ck_assert_ptr_nonnull(end);
    *end = '\0';
    int n = 0;
    static const char key[] = "luna_status (*";
    for (char *p = strstr(begin, key); p; p = strstr(p, key)) {
        p += sizeof key - 1;
        char *close = strstr(p, ")(");
        ck_assert(close != NULL && close - p < 64 && n < MAX_OPS);
        memcpy(names[n], p, (size_t)(close - p));
        names[n][close - p] = '\0';
        n++;
    }
    return n;
}

typedef luna_status (*op_fn)(void);

START_TEST(every_op_has_a_cost_entry) {
    static char names[MAX_OPS][64];
    int n = parse_ops(names);
    ck_assert_int_eq(n, LUNA_OP_COUNT);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(luna_op_name(i) && strcmp(luna_op_name(i), names[i]) == 0,
                      "op %d: %s has no cost entry (profile names it %s)", i, names[i],
                      luna_op_name(i) ? luna_op_name(i) : "nothing");
        ck_assert_ptr_nonnull(luna_op_family(i));
    }
    luna_backend *be;
    ck_assert_int_eq(luna_backend_create(&be, "cpu", NULL), LUNA_OK);
    const luna_ops *inner = be->ops;
    luna_op_profile *p;
    ck_assert_int_eq(luna_op_profile_attach(&p, be, false), LUNA_OK);
    ck_assert_ptr_ne(be->ops, inner);
    /* Every slot of the counting table is a wrapper: set, and not the backend's own op. */
    op_fn wrapped[LUNA_OP_COUNT], own[LUNA_OP_COUNT];
    memcpy(wrapped, be->ops, sizeof wrapped);
    memcpy(own, inner, sizeof own);
    for (int i = 0; i < LUNA_OP_COUNT; i++) {
        ck_assert_msg(wrapped[i] != NULL, "%s: no wrapper", names[i]);
        ck_assert_msg(wrapped[i] != own[i], "%s: not wrapped", names[i]);
    }
    luna_op_profile *second;
    ck_assert_int_ne(luna_op_profile_attach(&second, be, false), LUNA_OK);
    luna_op_profile_detach(p);
    ck_assert_ptr_eq(be->ops, inner);
    luna_backend_free(be);
}
END_TEST

static int op_index(const char *name) {
    for (int i = 0; i < LUNA_OP_COUNT; i++)
        if (strcmp(luna_op_name(i), name) == 0) return i;
    ck_abort_msg("no op %s", name);
    return -1;
}

START_TEST(cost_formulas_on_known_shapes) {
    enum { N = 6, IN = 5, OUT = 3 };
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 3);
    float *x = luna_test_random_vector(&rng, N * IN, -1, 1);
    float *W = luna_test_random_vector(&rng, OUT * IN, -1, 1);
    float *b = luna_test_random_vector(&rng, OUT, -1, 1);
    float *y = luna_test_zeros(N * OUT), *dy = luna_test_random_vector(&rng, N * OUT, -1, 1);
    float *dx = luna_test_zeros(N * IN), *dW = luna_test_zeros(OUT * IN),
          *db = luna_test_zeros(OUT);
    luna_backend *be;
    ck_assert_int_eq(luna_backend_create(&be, "cpu", NULL), LUNA_OK);
    luna_op_profile *p;
    ck_assert_int_eq(luna_op_profile_attach(&p, be, true), LUNA_OK);
    ck_assert_int_eq(be->ops->linear_forward(be, y, x, W, b, N, IN, OUT), LUNA_OK);
    ck_assert_int_eq(be->ops->linear_forward(be, y, x, W, b, N, IN, OUT), LUNA_OK);
    ck_assert_int_eq(be->ops->linear_backward(be, dx, dW, db, dy, x, W, N, IN, OUT, false),
                     LUNA_OK);
    /* gemm: 4 batches of [2,3]·[3,7] with beta = 0 */
    float *A = luna_test_random_vector(&rng, 4 * 2 * 3, -1, 1);
    float *B = luna_test_random_vector(&rng, 4 * 3 * 7, -1, 1), *C = luna_test_zeros(4 * 2 * 7);
    ck_assert_int_eq(be->ops->gemm(be, false, false, 2, 7, 3, 1, A, 3, 6, B, 7, 21, 0, C, 7, 14, 4),
                     LUNA_OK);
    const luna_op_counter *c = luna_op_profile_counters(p);
    const luna_op_counter *lf = &c[op_index("linear_forward")];
    ck_assert_double_eq(lf->calls, 2);
    ck_assert_double_eq(lf->mm_flops, 2 * 2.0 * N * IN * OUT);
    ck_assert_double_eq(lf->act_elems, 2 * (double)(N * IN + N * OUT));
    ck_assert_double_eq(lf->bytes, 2 * 4.0 * (OUT * IN + OUT));
    ck_assert(lf->seconds > 0); /* timing on */
    const luna_op_counter *lb = &c[op_index("linear_backward")];
    ck_assert_double_eq(lb->calls, 1);
    ck_assert_double_eq(lb->mm_flops, 4.0 * N * IN * OUT); /* dx = dy W and dW = dyᵀ x */
    const luna_op_counter *g = &c[op_index("gemm")];
    ck_assert_double_eq(g->mm_flops, 2.0 * 2 * 7 * 3 * 4);
    ck_assert_double_eq(g->act_elems, 4.0 * (2 * 3 + 3 * 7 + 2 * 7));
    ck_assert_double_eq(c[op_index("softmax_forward")].calls, 0);
    luna_op_profile_reset(p);
    ck_assert_double_eq(luna_op_profile_counters(p)[op_index("gemm")].calls, 0);
    luna_op_profile_detach(p);
    luna_backend_free(be);
    free(x), free(W), free(b), free(y), free(dy), free(dx), free(dW), free(db), free(A), free(B),
        free(C);
}
END_TEST

START_TEST(wrapping_does_not_change_results) {
    enum { N = 37, IN = 19, OUT = 23 };
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 11);
    float *x = luna_test_random_vector(&rng, N * IN, -2, 2);
    float *W = luna_test_random_vector(&rng, OUT * IN, -1, 1);
    float *b = luna_test_random_vector(&rng, OUT, -1, 1);
    float *y0 = luna_test_zeros(N * OUT), *y1 = luna_test_zeros(N * OUT);
    float *s0 = luna_test_zeros(N * OUT), *s1 = luna_test_zeros(N * OUT);
    float *e = luna_test_zeros(IN);
    luna_backend *be;
    ck_assert_int_eq(luna_backend_create(&be, "cpu", NULL), LUNA_OK);
    ck_assert_int_eq(be->ops->linear_forward(be, y0, x, W, b, N, IN, OUT), LUNA_OK);
    ck_assert_int_eq(be->ops->softmax_forward(be, s0, y0, N, OUT, NULL, 1, 0), LUNA_OK);
    luna_op_profile *p;
    ck_assert_int_eq(luna_op_profile_attach(&p, be, true), LUNA_OK);
    ck_assert_int_eq(be->ops->linear_forward(be, y1, x, W, b, N, IN, OUT), LUNA_OK);
    ck_assert_int_eq(be->ops->softmax_forward(be, s1, y1, N, OUT, NULL, 1, 0), LUNA_OK);
    /* An error from the backend comes back through the wrapper (token id out of range). */
    int32_t bad = 1000;
    ck_assert_int_ne(be->ops->embedding_forward(be, e, W, &bad, 1, OUT, IN, 1, 1), LUNA_OK);
    luna_op_profile_detach(p);
    ck_assert_int_eq(memcmp(y0, y1, sizeof(float) * N * OUT), 0);
    ck_assert_int_eq(memcmp(s0, s1, sizeof(float) * N * OUT), 0);
    luna_backend_free(be);
    free(x), free(W), free(b), free(y0), free(y1), free(s0), free(s1), free(e);
}
END_TEST

START_TEST(affine_extrapolation) {
    static luna_op_counter c1[LUNA_OP_COUNT], c2[LUNA_OP_COUNT], c3[LUNA_OP_COUNT],
        fit[LUNA_OP_COUNT];
    /* cost(x) = a + b·x per field, as the model's counts in the batch size. */
    for (int i = 0; i < LUNA_OP_COUNT; i++) {
        double a = i + 1, s = 3 * i + 0.5;
        c1[i] = (luna_op_counter){a, a + 2 * s, 2 * s, a + 2 * s, 2 * a, 0};
        c2[i] = (luna_op_counter){a, a + 4 * s, 4 * s, a + 4 * s, 2 * a, 0};
        c3[i] = (luna_op_counter){a, a + 64 * s, 64 * s, a + 64 * s, 2 * a, 0};
    }
    luna_op_counters_extrapolate(fit, c1, 2, c2, 4, 64);
    ck_assert_double_le(luna_op_counters_max_rel_diff(fit, c3), 1e-12);
    c3[5].bytes *= 1.5; /* a non-affine count is caught */
    ck_assert_double_ge(luna_op_counters_max_rel_diff(fit, c3), 0.3);
}
END_TEST

/* The calibrated prediction: a family's roofline time times its row's ratio (gpu_roofline.h);
 * every row names a family of the op table (a misspelt one would silently calibrate nothing), and
 * a family without a row keeps its roofline time. */
START_TEST(calibration_rows_name_families) {
    for (const luna_gpu_calibration *c = luna_gpu_calibration_h200; c->family; c++) {
        bool found = false;
        for (int op = 0; op < LUNA_OP_COUNT && !found; op++)
            found = strcmp(luna_op_family(op), c->family) == 0;
        ck_assert_msg(found, "calibration row '%s' names no op family", c->family);
        ck_assert(c->ratio > 0);
        ck_assert_double_eq_tol(luna_op_report_calibrated_h200(c->family, 2.0), 2.0 * c->ratio,
                                1e-12);
    }
    ck_assert_double_eq(luna_op_report_calibrated_h200("layout", 2.0), 2.0); /* no row */
}
END_TEST

int main(void) {
    Suite *s = suite_create("op_profile");
    TCase *tc = tcase_create("op_profile");
    tcase_add_test(tc, every_op_has_a_cost_entry);
    tcase_add_test(tc, cost_formulas_on_known_shapes);
    tcase_add_test(tc, wrapping_does_not_change_results);
    tcase_add_test(tc, affine_extrapolation);
    tcase_add_test(tc, calibration_rows_name_families);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
