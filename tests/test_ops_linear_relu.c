/* linear_relu_forward (core/backend.h): y = max(0, x Wᵀ + b), the FFN's first layer when no
 * dropout and no backward follow (a device applies the relu in cuBLASLt's epilogue). On the
 * backend under test (LUNA_TEST_BACKEND) it gives the bits of linear_forward followed by
 * bias_relu_dropout_forward with p = 0 — what the FFN computed before, so decoding's output does
 * not change — with and without a bias, in = 0 included; and it agrees with the CPU reference
 * within the ACCUM tier (its GEMM). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

typedef struct {
    int rows, in, out;
    bool bias;
} lr_args;

/* d[0] x [rows, in], d[1] W [out, in], d[2] b [out], d[3] y [rows, out]. */
static luna_status run_linear_relu(luna_backend *be, void *const *d, const void *args) {
    const lr_args *a = args;
    return be->ops->linear_relu_forward(be, d[3], d[0], d[1], a->bias ? d[2] : NULL, a->rows, a->in,
                                        a->out);
}

static float *vec(uint64_t seed, size_t n) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    return luna_test_random_vector(&rng, n, -1.0f, 1.0f);
}

static const int SHAPES[][3] = {{1, 1, 1}, {7, 13, 5}, {37, 13, 29}, {130, 65, 17}, {70, 0, 33}};

START_TEST(linear_relu_is_linear_then_relu) {
    luna_backend *be = lh_backend(2);
    for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
        for (int bias = 0; bias < 2; bias++) {
            const int rows = SHAPES[k][0], in = SHAPES[k][1], out = SHAPES[k][2];
            const size_t nx = in ? (size_t)rows * in : 1, nw = in ? (size_t)out * in : 1;
            const size_t ny = (size_t)rows * out;
            float *x = vec(10 + k, nx), *W = vec(20 + k, nw), *b = vec(30 + k, (size_t)out);
            float *dx = lh_f32(be, x, nx), *dW = lh_f32(be, W, nw), *db = lh_f32(be, b, out);
            float *y = lh_alloc(be, ny * sizeof(float)), *h = lh_alloc(be, ny * sizeof(float));
            float *a = lh_alloc(be, ny * sizeof(float));
            const float *bb = bias ? db : NULL;
            LUNA_CHECK_OK(be->ops->linear_relu_forward(be, y, dx, dW, bb, rows, in, out));
            LUNA_CHECK_OK(be->ops->linear_forward(be, h, dx, dW, bb, rows, in, out));
            LUNA_CHECK_OK(be->ops->bias_relu_dropout_forward(be, a, h, NULL, rows, out, 0.0f,
                                                             (luna_rng_key){0}));
            float *got = lh_fetch_f32(be, y, ny), *want = lh_fetch_f32(be, a, ny);
            size_t zeros = 0;
            for (size_t e = 0; e < ny; e++) {
                ck_assert_msg(memcmp(&got[e], &want[e], sizeof(float)) == 0,
                              "rows %d in %d out %d bias %d: y[%zu] = %.9g, linear + relu %.9g",
                              rows, in, out, bias, e, (double)got[e], (double)want[e]);
                zeros += got[e] == 0.0f;
            }
            /* the relu had something to do: some outputs were negative before it */
            if (ny >= 8 && (in > 0 || bias)) ck_assert_uint_gt(zeros, 0);
            free(got), free(want), free(x), free(W), free(b);
            lh_free(be, dx), lh_free(be, dW), lh_free(be, db), lh_free(be, y), lh_free(be, h);
            lh_free(be, a);
        }
    luna_backend_free(be);
}
END_TEST

START_TEST(linear_relu_matches_reference_backend) {
    for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
        for (int bias = 0; bias < 2; bias++) {
            const int rows = SHAPES[k][0], in = SHAPES[k][1], out = SHAPES[k][2];
            const size_t nx = in ? (size_t)rows * in : 1, nw = in ? (size_t)out * in : 1;
            const size_t ny = (size_t)rows * out;
            float *x = vec(40 + k, nx), *W = vec(50 + k, nw), *b = vec(60 + k, (size_t)out);
            float *y = vec(70 + k, ny);
            lr_args a = {rows, in, out, bias};
            lh_buf bufs[] = {{x, nx, LH_F32, LH_IN},
                             {W, nw, LH_F32, LH_IN},
                             {b, (size_t)out, LH_F32, LH_IN},
                             {y, ny, LH_F32, LH_OUT}};
            char what[64];
            snprintf(what, sizeof what, "rows %d in %d out %d%s", rows, in, out,
                     bias ? " bias" : "");
            ck_assert_int_eq(
                lh_compare("linear_relu_forward", what, 2, run_linear_relu, &a, bufs, 4), LUNA_OK);
            free(x), free(W), free(b), free(y);
        }
}
END_TEST

static Suite *linear_relu_suite(void) {
    Suite *s = suite_create("ops_linear_relu");
    TCase *tc = tcase_create("linear_relu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, linear_relu_is_linear_then_relu);
    tcase_add_test(tc, linear_relu_matches_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(linear_relu_suite()); }
