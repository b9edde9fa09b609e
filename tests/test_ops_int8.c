/* Tests of int8 held weights (hold_weights with LUNA_I8; the math and its bound:
 * model/kernels/cpu/held_int8.h):
 * - linear_forward through int8 weights is within the stated quantization bound of a float64
 *   product of the unquantized x and W, on odd shapes (1 row, rows not a multiple of the 4-row
 *   block, outputs not a multiple of the 16-column panel, in not a multiple of 4, in = 1);
 * - every kernel this CPU runs (scalar, AVX2, AVX-512 VNNI), at 1 and 2 threads, gives the bits of
 *   the integer formula computed here from luna_quantize_rows_range (x: ±63) and
 *   luna_quantize_rows_int8 (W: ±127);
 * - saturation edges: rows whose every |x| is the row maximum times weights at ±127 (qx = ±63,
 *   so the AVX2 kernel's u8 qx + 64 is 127 or 1: vpmaddubsw pairs up to ±2·127², the most that
 *   fits s16), an all-zero row, a zero output channel, a row with a NaN or an infinity (NaN
 *   outputs for that row alone);
 * - bad holds: one W held as fp32 and int8 is an error; the CUDA backend refuses int8 in one line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/quantize.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/cpu/held_int8.h"
#include "tests/backend_harness.h"

static bool on_cpu(void) { return strcmp(lh_backend_name(), "cpu") == 0; }

/* y [rows, out] from linear_forward with W held as int8 on `be` (kernel k). */
static float *int8_forward(luna_backend *be, int k, const float *x, const float *W, const float *b,
                           int rows, int in, int out) {
    LUNA_CHECK_OK(luna_cpu_set_int8_kernel(be, k));
    float *vx = lh_f32(be, x, (size_t)rows * in), *vW = lh_f32(be, W, (size_t)out * in);
    float *vb = b ? lh_f32(be, b, (size_t)out) : NULL;
    float *vy = lh_f32(be, NULL, (size_t)rows * out);
    LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_I8));
    LUNA_CHECK_OK(be->ops->linear_forward(be, vy, vx, vW, vb, rows, in, out));
    LUNA_CHECK_OK(be->ops->release_weights(be, vW));
    float *y = lh_fetch_f32(be, vy, (size_t)rows * out);
    lh_free(be, vx), lh_free(be, vW), lh_free(be, vb), lh_free(be, vy);
    return y;
}

/* The header's formula, from the quantization function itself: y = fmaf(acc, sx·sW, b), with a
 * non-finite row's outputs NaN. */
static float *formula(const float *x, const float *W, const float *b, int rows, int in, int out) {
    int8_t *qx = malloc((size_t)rows * in), *qw = malloc((size_t)out * in);
    float *sx = malloc(sizeof(float) * rows), *sw = malloc(sizeof(float) * out);
    float *y = malloc(sizeof(float) * (size_t)rows * out);
    luna_quantize_rows_range(x, rows, in, LUNA_INT8_ACT_MAX, qx, sx);
    luna_quantize_rows_int8(W, out, in, qw, sw);
    for (int i = 0; i < rows; i++) {
        bool finite = true;
        for (int k = 0; k < in; k++)
            finite &= isfinite(x[(size_t)i * in + k]);
        for (int n = 0; n < out; n++) {
            int64_t acc = 0;
            for (int k = 0; k < in; k++)
                acc += (int64_t)qx[(size_t)i * in + k] * qw[(size_t)n * in + k];
            y[(size_t)i * out + n] =
                finite ? fmaf((float)acc, sx[i] * sw[n], b ? b[n] : 0.0f) : NAN;
        }
    }
    free(qx), free(qw), free(sx), free(sw);
    return y;
}

static void expect_same_bits(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            ck_abort_msg("%s: element %zu is %.9g, the formula gives %.9g", what, i, got[i],
                         want[i]);
}

static const int shapes[][3] = {{1, 1, 1},     {3, 5, 17},     {4, 256, 1024}, {7, 33, 15},
                                {13, 256, 33}, {129, 255, 96}, {640, 40, 65}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

START_TEST(int8_linear_within_quantization_bound) {
    if (!on_cpu()) return;
    luna_backend *be = lh_backend(2);
    for (size_t s = 0; s < NSHAPES; s++) {
        const int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 300 + s);
        float *x = luna_test_random_vector(&rng, (size_t)rows * in, -3.0f, 3.0f);
        float *W = luna_test_random_vector(&rng, (size_t)out * in, -0.2f, 0.2f);
        float *b = luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f);
        float *y = int8_forward(be, luna_int8_kernel_best(), x, W, b, rows, in, out);
        int8_t *qw = malloc((size_t)out * in);
        float *sw = malloc(sizeof(float) * out), sx;
        luna_quantize_rows_int8(W, out, in, qw, sw);
        for (int i = 0; i < rows; i++) {
            const float *xr = x + (size_t)i * in;
            float amax = 0.0f;
            double sum_x = 0.0;
            for (int k = 0; k < in; k++)
                amax = fmaxf(amax, fabsf(xr[k])), sum_x += fabs(xr[k]);
            sx = amax / (float)LUNA_INT8_ACT_MAX;
            for (int n = 0; n < out; n++) {
                double ref = b[n], sum_w = 0.0, sum_xw = 0.0;
                for (int k = 0; k < in; k++) {
                    ref += (double)xr[k] * W[(size_t)n * in + k];
                    sum_w += fabs((double)qw[(size_t)n * in + k] * sw[n]);
                    sum_xw += fabs((double)xr[k] * W[(size_t)n * in + k]);
                }
                /* the quantization bound of held_int8.h, plus fp32 rounding of the epilogue */
                const double bound = sw[n] / 2.0 * sum_x + sx / 2.0 * sum_w +
                                     1e-6 * (sum_xw + fabs(b[n]) + sum_x * sw[n] * 127.0);
                const double err = fabs(y[(size_t)i * out + n] - ref);
                if (!(err <= bound))
                    ck_abort_msg("rows %d in %d out %d: y[%d, %d] = %.7g, float64 %.7g: error "
                                 "%.3g over the bound %.3g",
                                 rows, in, out, i, n, y[(size_t)i * out + n], ref, err, bound);
            }
        }
        free(qw), free(sw), free(x), free(W), free(b), free(y);
    }
    luna_backend_free(be);
}
END_TEST

START_TEST(every_kernel_gives_the_formula_bits) {
    if (!on_cpu()) return;
    int tried = 0;
    for (int k = LUNA_INT8_SCALAR; k <= LUNA_INT8_AVX512_VNNI; k++) {
        if (!luna_int8_kernel_available((luna_int8_kernel)k)) {
            printf("int8 kernel %s: not available on this CPU, not tested\n",
                   luna_int8_kernel_name((luna_int8_kernel)k));
            continue;
        }
        tried++;
        for (int threads = 1; threads <= 2; threads++) {
            luna_backend *be = lh_backend(threads);
            for (size_t s = 0; s < NSHAPES; s++)
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    const int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
                    luna_test_rng rng;
                    luna_test_rng_seed(&rng, 400 + s);
                    float *x = luna_test_random_vector(&rng, (size_t)rows * in, -2.0f, 2.0f);
                    float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
                    float *b = luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f);
                    const float *bb = with_bias ? b : NULL;
                    float *y = int8_forward(be, k, x, W, bb, rows, in, out);
                    float *want = formula(x, W, bb, rows, in, out);
                    char what[96];
                    snprintf(what, sizeof what, "%s, %d threads, rows %d in %d out %d bias %d",
                             luna_int8_kernel_name((luna_int8_kernel)k), threads, rows, in, out,
                             with_bias);
                    expect_same_bits(y, want, (size_t)rows * out, what);
                    free(x), free(W), free(b), free(y), free(want);
                }
            luna_backend_free(be);
        }
    }
    ck_assert_int_ge(tried, 1);
}
END_TEST

START_TEST(saturation_zero_rows_and_channels) {
    if (!on_cpu()) return;
    /* rows 0-1: every |x| equal to the row maximum (q = ±63, the AVX2 kernel's u8 127 or 1);
     * row 2: zeros; row 3: a NaN; row 4: an infinity; row 5: mixed. Channels 0-1: every |w| the
     * channel maximum (q = ±127) with signs that make vpmaddubsw pairs +2·127² (row 0) and
     * −2·127² (row 1); channel 2: zeros; the rest random. in = 67: a partial last group. */
    const int rows = 6, in = 67, out = 37;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 77);
    float *x = luna_test_random_vector(&rng, (size_t)rows * in, -1.0f, 1.0f);
    float *W = luna_test_random_vector(&rng, (size_t)out * in, -1.0f, 1.0f);
    float *b = luna_test_random_vector(&rng, (size_t)out, -1.0f, 1.0f);
    for (int k = 0; k < in; k++) {
        const float sgn = (k / 2) % 2 ? -1.0f : 1.0f;
        x[k] = 3.5f * sgn;       /* with channel 0's signs: u8 127 against +127, pairs +2·127² */
        x[in + k] = -3.5f * sgn; /* against them: u8 127 against −127, pairs −2·127² */
        x[2 * in + k] = 0.0f;
        W[k] = 0.25f * sgn;
        W[in + k] = (k % 2 ? -0.25f : 0.25f); /* pairs of opposite signs */
        W[2 * in + k] = 0.0f;
    }
    x[3 * in + 5] = NAN;
    x[4 * in + 60] = INFINITY;
    for (int k = LUNA_INT8_SCALAR; k <= LUNA_INT8_AVX512_VNNI; k++) {
        if (!luna_int8_kernel_available((luna_int8_kernel)k)) continue;
        luna_backend *be = lh_backend(2);
        float *y = int8_forward(be, k, x, W, b, rows, in, out);
        float *want = formula(x, W, b, rows, in, out);
        char what[64];
        snprintf(what, sizeof what, "edges, %s", luna_int8_kernel_name((luna_int8_kernel)k));
        expect_same_bits(y, want, (size_t)rows * out, what);
        /* x and W exact in int8 here: the products are exact, only the epilogue rounds */
        ck_assert_float_eq_tol(y[0], 3.5f * 0.25f * in + b[0], 1e-4f);
        ck_assert_float_eq_tol(y[out], -3.5f * 0.25f * in + b[0], 1e-4f);
        for (int n = 0; n < out; n++) {
            ck_assert_float_eq(y[2 * out + n], b[n]); /* a zero row: the bias */
            ck_assert(isnan(y[3 * out + n]));         /* NaN row */
            ck_assert(isnan(y[4 * out + n]));         /* infinite row */
            ck_assert(isfinite(y[5 * out + n]));      /* its neighbours are unharmed */
        }
        for (int i = 0; i < rows; i++)
            if (i != 3 && i != 4) ck_assert_float_eq(y[i * out + 2], b[2]); /* a zero channel */
        free(y), free(want);
        luna_backend_free(be);
    }
    free(x), free(W), free(b);
}
END_TEST

START_TEST(bad_int8_holds) {
    luna_backend *be = lh_backend(1);
    const int out = 5, in = 8;
    float *vW = lh_f32(be, NULL, (size_t)out * in);
    if (!on_cpu()) { /* the CUDA backend: one clear line */
        ck_assert_int_eq(be->ops->hold_weights(be, vW, out, in, LUNA_I8), LUNA_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "int8 weights are CPU-only"));
    } else {
        LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_I8));
        ck_assert_int_eq(be->ops->hold_weights(be, vW, out, in, LUNA_F32),
                         LUNA_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "I8, not [5, 8] F32"));
        LUNA_CHECK_OK(be->ops->release_weights(be, vW));
        ck_assert_int_eq(be->ops->release_weights(be, vW), LUNA_ERR_INVALID_ARGUMENT);
    }
    ck_assert_int_eq(be->ops->hold_weights(be, vW, out, in, LUNA_I32), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "hold_weights: dtype I32"));
    lh_free(be, vW);
    luna_backend_free(be);
}
END_TEST

/* Rows whose quantized copy finds no memory: an error naming it, never the fp32 path (the held
 * weights' fp32 values may be gone after an int8 hold). Not under AddressSanitizer, which stops
 * the process on an allocation this large instead of returning NULL. */
START_TEST(int8_activations_out_of_memory) {
#if defined(__SANITIZE_ADDRESS__)
    printf("int8_activations_out_of_memory: skipped under AddressSanitizer\n");
#else
    if (!on_cpu()) return;
    luna_backend *be = lh_backend(1);
    const int out = 5, in = 8;
    float *vW = lh_f32(be, NULL, (size_t)out * in), x[8] = {0}, y[5];
    LUNA_CHECK_OK(be->ops->hold_weights(be, vW, out, in, LUNA_I8));
    /* 2^50 rows: the quantized activations alone would take petabytes; x and y are not reached */
    ck_assert_int_eq(luna_cpu_held_linear(be, y, x, vW, NULL, (int64_t)1 << 50, in, out),
                     LUNA_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "no memory for the int8 activations"));
    LUNA_CHECK_OK(be->ops->release_weights(be, vW));
    lh_free(be, vW);
    luna_backend_free(be);
#endif
}
END_TEST

static Suite *int8_suite(void) {
    Suite *s = suite_create("ops_int8");
    TCase *tc = tcase_create("int8");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, int8_linear_within_quantization_bound);
    tcase_add_test(tc, every_kernel_gives_the_formula_bits);
    tcase_add_test(tc, saturation_zero_rows_and_channels);
    tcase_add_test(tc, bad_int8_holds);
    tcase_add_test(tc, int8_activations_out_of_memory);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(int8_suite()); }
