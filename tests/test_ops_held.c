/* Tests of weights held constant (core/backend.h, "Weights held constant"; on the CPU
 * model/kernels/cpu/held_weights.c): linear_forward with a held W equals the unheld op (OpenBLAS)
 * and a naive double-precision product within the GEMM tolerance, on odd shapes (1 row, rows not
 * a multiple of the 6-row kernel, outputs not a multiple of the 16-column panel, in = 1), with
 * and without bias; is bit-identical for any thread count and for either CPU kernel (AVX2,
 * AVX-512); holds are counted (two holds need two
 * releases: on the CPU the panels stay in use until the last release, after which a changed
 * weight is used as changed, through OpenBLAS again, bit for bit); bad arguments are errors.
 * Against the CPU reference through the harness (hold, linear_forward, release on each backend).
 * CPU backends sharing one table of held weights (luna_backend_share_held_weights). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/registry.h"
#include "tests/backend_harness.h"

typedef struct {
    int rows, in, out;
    bool bias;
} held_args;

/* d[0] x [rows, in], d[1] W [out, in], d[2] b [out], d[3] y [rows, out]: hold, forward, release. */
static luna_status run_held(luna_backend *be, void *const *d, const void *args) {
    const held_args *a = args;
    LUNA_TRY(be->ops->hold_weights(be, d[1], a->out, a->in, LUNA_F32));
    luna_status st = be->ops->linear_forward(be, d[3], d[0], d[1], a->bias ? d[2] : NULL, a->rows,
                                             a->in, a->out);
    luna_status st2 = be->ops->release_weights(be, d[1]);
    return st != LUNA_OK ? st : st2;
}

static const int shapes[][3] = {{1, 1, 1},        {1, 64, 7792},    {5, 3, 17},
                                {6, 16, 16},      {7, 33, 15},      {13, 256, 33},
                                {128, 256, 1024}, {129, 1024, 256}, {640, 40, 65}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* y = x Wᵀ (+ b) in double. */
static void naive(const float *x, const float *W, const float *b, int rows, int in, int out,
                  double *y) {
    for (int i = 0; i < rows; i++)
        for (int n = 0; n < out; n++) {
            double s = b ? b[n] : 0.0;
            for (int k = 0; k < in; k++)
                s += (double)x[(size_t)i * in + k] * W[(size_t)n * in + k];
            y[(size_t)i * out + n] = s;
        }
}

/* Forward on `be` with W held or not; returns the host result (malloc'd). */
static float *forward(luna_backend *be, const float *x, const float *W, const float *b, int rows,
                      int in, int out, bool hold) {
    float *vx = lh_f32(be, x, (size_t)rows * in), *vW = lh_f32(be, W, (size_t)out * in);
    float *vb = b ? lh_f32(be, b, (size_t)out) : NULL;
    float *vy = lh_f32(be, NULL, (size_t)rows * out);
    if (hold) LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_F32));
    LUNA_CHECK_OK(be->ops->linear_forward(be, vy, vx, vW, vb, rows, in, out));
    if (hold) LUNA_CHECK_OK(be->ops->release_weights(be, vW));
    float *y = malloc(sizeof(float) * (size_t)rows * out);
    lh_download(be, y, vy, sizeof(float) * (size_t)rows * out);
    lh_free(be, vx);
    lh_free(be, vW);
    lh_free(be, vb);
    lh_free(be, vy);
    return y;
}

START_TEST(held_linear_matches_naive_and_unheld) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    for (size_t s = 0; s < NSHAPES; s++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
            float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
            float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
            float *b = with_bias ? luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f) : NULL;
            double *ref = malloc(sizeof(double) * (size_t)rows * out);
            naive(x, W, b, rows, in, out, ref);
            float *held = forward(be, x, W, b, rows, in, out, true);
            float *plain = forward(be, x, W, b, rows, in, out, false);
            /* ACCUM tier: 1e-5 relative to the magnitude of the result (|x|,|W| ≤ 1: ≤ √in) */
            double scale = sqrt((double)in) + 1.0;
            for (size_t i = 0; i < (size_t)rows * out; i++) {
                ck_assert_msg(fabs(held[i] - ref[i]) <= 1e-5 * scale,
                              "rows %d in %d out %d bias %d: y[%zu] = %.9g, naive %.9g", rows, in,
                              out, with_bias, i, held[i], ref[i]);
                ck_assert_msg(fabs(held[i] - plain[i]) <= 1e-5 * scale,
                              "rows %d in %d out %d: held %.9g, unheld %.9g at %zu", rows, in, out,
                              held[i], plain[i], i);
            }
            free(x);
            free(W);
            free(b);
            free(ref);
            free(held);
            free(plain);
        }
    luna_backend_free(be);
}
END_TEST

START_TEST(held_linear_bit_identical_across_thread_counts) {
    luna_backend *be = lh_backend(1);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 11);
    const int rows = 131, in = 96, out = 257;
    float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
    float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
    float *b = luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f);
    float *y1 = forward(be, x, W, b, rows, in, out, true);
    for (int t = 2; t <= 3; t++) {
        lh_set_threads(be, t);
        float *yt = forward(be, x, W, b, rows, in, out, true);
        ck_assert_msg(memcmp(y1, yt, sizeof(float) * (size_t)rows * out) == 0,
                      "held linear_forward differs between 1 and %d threads", t);
        free(yt);
    }
    /* a row's result does not depend on the rows around it (one row alone = the same bits): the
     * CPU's held kernel promises it (core/backend.h, hold_weights); cuBLASLt picks its algorithm
     * by shape, so on CUDA a row's last bits may depend on the row count (seen on an H200) */
    if (be->device == LUNA_DEVICE_CPU) {
        float *row = forward(be, x + (size_t)7 * in, W, b, 1, in, out, true);
        ck_assert_msg(memcmp(row, y1 + (size_t)7 * out, sizeof(float) * out) == 0,
                      "row 7 alone differs from row 7 in a batch of %d", rows);
        free(row);
    } else {
        printf("held: row independence not checked on %s (cuBLASLt chooses algorithms by shape)\n",
               be->name);
    }
    free(x);
    free(W);
    free(b);
    free(y1);
    luna_backend_free(be);
}
END_TEST

/* The CPU's AVX-512 kernel runs the AVX2 kernel's chains: the same bits on every shape, with and
 * without bias, at 1 and 2 threads (another tiling, rows and panel pairs, for the same sums). */
START_TEST(held_kernels_bit_identical) {
    luna_backend_options bo = luna_backend_options_default();
    luna_backend *be = NULL;
    LUNA_CHECK_OK(luna_backend_create(&be, "cpu", &bo));
    /* the default: the best kernel this CPU runs */
    const int by_default = luna_cpu_f32_kernel(be);
    const bool has512 = luna_cpu_set_f32_kernel(be, LUNA_F32_AVX512) == LUNA_OK;
    const bool has2 = luna_cpu_set_f32_kernel(be, LUNA_F32_AVX2) == LUNA_OK;
    luna_error_clear();
    ck_assert_int_eq(by_default, has512 ? LUNA_F32_AVX512
                                 : has2 ? LUNA_F32_AVX2
                                        : LUNA_F32_OPENBLAS);
    if (luna_cpu_set_f32_kernel(be, LUNA_F32_AVX512) != LUNA_OK ||
        luna_cpu_set_f32_kernel(be, LUNA_F32_AVX2) != LUNA_OK) {
        printf("held_kernels_bit_identical: skipped, this CPU lacks AVX-512 or AVX2 (%s)\n",
               luna_error_message());
        luna_error_clear();
        luna_backend_free(be);
        return;
    }
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 17);
    for (size_t s = 0; s < NSHAPES; s++)
        for (int variant = 0; variant < 4; variant++) {
            const bool with_bias = variant & 1;
            const int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
            lh_set_threads(be, 1 + (variant >> 1));
            float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
            float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
            float *b = with_bias ? luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f) : NULL;
            LUNA_CHECK_OK(luna_cpu_set_f32_kernel(be, LUNA_F32_AVX2));
            float *y2 = forward(be, x, W, b, rows, in, out, true);
            LUNA_CHECK_OK(luna_cpu_set_f32_kernel(be, LUNA_F32_AVX512));
            ck_assert_int_eq(luna_cpu_f32_kernel(be), LUNA_F32_AVX512);
            float *y5 = forward(be, x, W, b, rows, in, out, true);
            for (size_t i = 0; i < (size_t)rows * out; i++)
                ck_assert_msg(memcmp(&y2[i], &y5[i], sizeof(float)) == 0,
                              "rows %d in %d out %d bias %d threads %d: y[%zu] avx2 %.9g, avx512 "
                              "%.9g",
                              rows, in, out, with_bias, 1 + (variant >> 1), i, y2[i], y5[i]);
            free(x);
            free(W);
            free(b);
            free(y2);
            free(y5);
        }
    luna_backend_free(be);
}
END_TEST

START_TEST(holds_are_counted_and_released) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 13);
    const int rows = 9, in = 40, out = 50;
    float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
    float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
    float *vx = lh_f32(be, x, (size_t)rows * in), *vW = lh_f32(be, W, (size_t)out * in);
    float *vy = lh_f32(be, NULL, (size_t)rows * out);
    float *unheld = forward(be, x, W, NULL, rows, in, out, false);
    float *y = malloc(sizeof(float) * (size_t)rows * out);
    LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_F32));
    LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_F32)); /* a second holder */
    LUNA_CHECK_OK(be->ops->release_weights(be, vW));
    /* still held by the second holder. On the CPU (which keeps packed panels) a change of W in
     * place — outside the contract — is not seen while held: proof the panels are what is used */
    const bool cpu = strcmp(be->name, "cpu") == 0;
    if (cpu) {
        float *Wz = calloc((size_t)out * in, sizeof(float));
        lh_upload(be, vW, Wz, sizeof(float) * (size_t)out * in);
        free(Wz);
    }
    LUNA_CHECK_OK(be->ops->linear_forward(be, vy, vx, vW, NULL, rows, in, out));
    float *held = malloc(sizeof(float) * (size_t)rows * out);
    lh_download(be, held, vy, sizeof(float) * (size_t)rows * out);
    LUNA_CHECK_OK(be->ops->release_weights(be, vW)); /* the last hold: panels dropped */
    /* released: a changed W is used as changed, through the unheld op, bit for bit */
    for (size_t i = 0; i < (size_t)out * in; i++)
        W[i] *= 0.5f;
    lh_upload(be, vW, W, sizeof(float) * (size_t)out * in);
    LUNA_CHECK_OK(be->ops->linear_forward(be, vy, vx, vW, NULL, rows, in, out));
    lh_download(be, y, vy, sizeof(float) * (size_t)rows * out);
    float *halved = forward(be, x, W, NULL, rows, in, out, false);
    ck_assert_msg(memcmp(y, halved, sizeof(float) * (size_t)rows * out) == 0,
                  "after the last release linear_forward must use W as it is now");
    for (size_t i = 0; i < (size_t)rows * out; i++)
        ck_assert_msg(fabs(held[i] - unheld[i]) <= 1e-5 * 8.0, "held result %zu: %.9g vs %.9g", i,
                      held[i], unheld[i]);
    /* errors: releasing what is not held, holding with another shape, bad sizes */
    ck_assert_int_eq(be->ops->release_weights(be, vW), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "release_weights"));
    luna_error_clear();
    LUNA_CHECK_OK(be->ops->release_weights(be, NULL));
    LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_F32));
    ck_assert_int_eq(be->ops->hold_weights(be, vW, in, out, LUNA_F32), LUNA_ERR_INVALID_ARGUMENT);
    luna_error_clear();
    LUNA_CHECK_OK(be->ops->release_weights(be, vW));
    ck_assert_int_eq(be->ops->hold_weights(be, vW, 0, in, LUNA_F32), LUNA_ERR_INVALID_ARGUMENT);
    luna_error_clear();
    ck_assert_int_eq(be->ops->hold_weights(be, NULL, out, in, LUNA_F32), LUNA_ERR_INVALID_ARGUMENT);
    luna_error_clear();
    /* a weight still held when the backend is freed is released with it (ASan: no leak) */
    LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_F32));
    free(x);
    free(W);
    free(y);
    free(held);
    free(unheld);
    free(halved);
    lh_free(be, vx);
    lh_free(be, vy);
    lh_free(be, vW);
    luna_backend_free(be);
}
END_TEST

START_TEST(held_ops_match_reference_backend) {
    for (size_t s = 0; s < NSHAPES; s++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 100 + s);
            size_t nx = (size_t)rows * in, nw = (size_t)out * in, ny = (size_t)rows * out;
            float *x = luna_test_random_vector(&rng, nx, -1.0f, 1.0f);
            float *W = luna_test_random_vector(&rng, nw, -1.0f, 1.0f);
            float *b = luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f);
            float *y = luna_test_random_vector(&rng, ny, -1.0f, 1.0f);
            held_args a = {rows, in, out, with_bias};
            lh_buf bufs[] = {{x, nx, LH_F32, LH_IN},
                             {W, nw, LH_F32, LH_IN},
                             {b, (size_t)out, LH_F32, LH_IN},
                             {y, ny, LH_F32, LH_OUT}};
            char what[64];
            snprintf(what, sizeof what, "rows %d in %d out %d bias %d", rows, in, out, with_bias);
            /* the pair is one comparison: hold, the held forward, release */
            ck_assert_int_eq(lh_compare("hold_weights", what, 2, run_held, &a, bufs, 4), LUNA_OK);
            ck_assert_int_eq(lh_compare("release_weights", what, 2, run_held, &a, bufs, 4),
                             LUNA_OK);
            free(x);
            free(W);
            free(b);
            free(y);
        }
}
END_TEST

/* Two CPU backends on one table of held weights (luna_backend_share_held_weights): what one holds,
 * the other's Linear uses, with one packed copy for both (the usage counts it once) and bit for
 * bit the same results (fp32 and int8); holds are counted over both; the backend that shared its
 * table may be freed first (the table lives on with the other: ASan checks the frees). A backend
 * that holds weights of its own cannot take another's table. */
static float *cpu_linear(luna_backend *be, const float *x, const float *W, int rows, int in,
                         int out) {
    float *y = malloc(sizeof(float) * (size_t)rows * out);
    LUNA_CHECK_OK(be->ops->linear_forward(be, y, x, W, NULL, rows, in, out));
    return y;
}

START_TEST(backends_share_held_weights) {
    luna_backend_options o = luna_backend_options_default();
    o.num_threads = 1;
    luna_backend *a, *b, *c;
    LUNA_CHECK_OK(luna_backend_create(&a, "cpu", &o));
    LUNA_CHECK_OK(luna_backend_create(&b, "cpu", &o));
    LUNA_CHECK_OK(luna_backend_create(&c, "cpu", &o));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 29);
    const int rows = 9, in = 40, out = 50;
    const size_t ny = (size_t)rows * out;
    float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
    float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
    float *W8 = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
    LUNA_CHECK_OK(a->ops->hold_weights(a, W, out, in, LUNA_F32));
    LUNA_CHECK_OK(a->ops->hold_weights(a, W8, out, in, LUNA_I8));
    float *ya = cpu_linear(a, x, W, rows, in, out), *ya8 = cpu_linear(a, x, W8, rows, in, out);
    int na = 0, nb = 0;
    size_t ba = 0, bb = 0;
    luna_cpu_held_usage(a, &na, &ba);
    const int held_a = na; /* 2, or 1 where fp32 holds keep nothing (no AVX2 + FMA) */
    ck_assert_int_ge(held_a, 1);
    LUNA_CHECK_OK(luna_backend_share_held_weights(b, a));
    LUNA_CHECK_OK(b->ops->hold_weights(b, W, out, in, LUNA_F32)); /* counted, not packed again */
    luna_cpu_held_usage(a, &na, &ba);
    luna_cpu_held_usage(b, &nb, &bb);
    ck_assert_int_eq(na, held_a);
    ck_assert_int_eq(nb, na);
    ck_assert_uint_eq(bb, ba);
    float *yb = cpu_linear(b, x, W, rows, in, out), *yb8 = cpu_linear(b, x, W8, rows, in, out);
    ck_assert_msg(memcmp(ya, yb, sizeof(float) * ny) == 0, "fp32: another result on b");
    ck_assert_msg(memcmp(ya8, yb8, sizeof(float) * ny) == 0, "int8: another result on b");
    /* W8 is held as int8 by a: b's fp32 hold of it is the error one backend would give (where
     * fp32 holds keep panels) */
    if (luna_cpu_f32_kernel(b) != LUNA_F32_OPENBLAS) {
        ck_assert_int_eq(b->ops->hold_weights(b, W8, out, in, LUNA_F32), LUNA_ERR_INVALID_ARGUMENT);
        luna_error_clear();
    }
    /* a's own hold of W released: b's still keeps it; a freed with W8 held: b goes on */
    LUNA_CHECK_OK(a->ops->release_weights(a, W));
    luna_backend_free(a);
    luna_cpu_held_usage(b, &nb, &bb);
    ck_assert_int_eq(nb, held_a);
    free(yb8);
    yb8 = cpu_linear(b, x, W8, rows, in, out);
    ck_assert_msg(memcmp(ya8, yb8, sizeof(float) * ny) == 0, "int8: another result once a is gone");
    LUNA_CHECK_OK(b->ops->release_weights(b, W8));
    luna_cpu_held_usage(b, &nb, &bb);
    ck_assert_int_eq(nb, held_a - 1);
    /* c holds W itself: it cannot take b's table */
    LUNA_CHECK_OK(c->ops->hold_weights(c, W8, out, in, LUNA_I8));
    ck_assert_int_eq(luna_backend_share_held_weights(c, b), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "of its own"));
    luna_error_clear();
    LUNA_CHECK_OK(c->ops->release_weights(c, W8));
    LUNA_CHECK_OK(luna_backend_share_held_weights(c, b));
    luna_cpu_held_usage(c, &na, &ba);
    ck_assert_int_eq(na, nb);
    luna_backend_free(c);
#ifdef LUNA_TEST_CUDA_HARNESS
    luna_backend *g; /* a device backend keeps its own */
    LUNA_CHECK_OK(luna_backend_create(&g, "cuda", NULL));
    ck_assert_int_eq(luna_backend_share_held_weights(g, b), LUNA_ERR_UNSUPPORTED);
    luna_error_clear();
    luna_backend_free(g);
#endif
    luna_backend_free(b); /* W's hold by b goes with the table's last user */
    free(x), free(W), free(W8), free(ya), free(ya8), free(yb), free(yb8);
}
END_TEST

static Suite *held_suite(void) {
    Suite *s = suite_create("ops_held");
    TCase *tc = tcase_create("held");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, held_linear_matches_naive_and_unheld);
    tcase_add_test(tc, held_linear_bit_identical_across_thread_counts);
    tcase_add_test(tc, held_kernels_bit_identical);
    tcase_add_test(tc, holds_are_counted_and_released);
    tcase_add_test(tc, held_ops_match_reference_backend);
    tcase_add_test(tc, backends_share_held_weights);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(held_suite()); }
