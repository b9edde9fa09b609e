/* linear_forward_multi / linear_backward_multi (core/backend.h): the projections of one input
 * whose weights sit `stride` floats apart, as the parameter table stores them (weight, bias, next
 * weight, ...; a gap after them too). On the backend under test (LUNA_TEST_BACKEND) they equal the
 * count linear_forward / linear_backward calls made in order — bit for bit on the CPU, within the
 * ACCUM tier elsewhere (a device batches them into one GEMM) — with and without a bias, dx
 * overwritten or accumulated, in = 0 and count 1 included; they agree with the CPU reference
 * within ACCUM; and on a device in bf16 mode with the separate calls and the host within bf16
 * rounding, also after the weights change. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/kernels/registry.h"
#include "tests/backend_harness.h"

typedef struct {
    int rows, in, out, count, gap; /* gap: floats after each bias before the next weight */
    bool bias, accumulate;
} multi_args;

static int64_t stride_of(const multi_args *a) { return (int64_t)a->out * a->in + a->out + a->gap; }
static size_t params_of(const multi_args *a) { return (size_t)stride_of(a) * (size_t)a->count; }

static float *vec(uint64_t seed, size_t n) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    return luna_test_random_vector(&rng, n ? n : 1, -1.0f, 1.0f);
}

/* d[0] x [rows, in], d[1] params, d[2] y [count, rows, out]. */
static luna_status run_forward(luna_backend *be, void *const *d, const void *args) {
    const multi_args *a = args;
    const float *W = d[1], *b = a->bias ? (const float *)d[1] + (int64_t)a->out * a->in : NULL;
    return be->ops->linear_forward_multi(be, d[2], d[0], W, b, stride_of(a), a->count, a->rows,
                                         a->in, a->out);
}

/* d[0] x, d[1] params, d[2] dy [count, rows, out], d[3] dx [rows, in], d[4] gradients (the
 * params' layout). */
static luna_status run_backward(luna_backend *be, void *const *d, const void *args) {
    const multi_args *a = args;
    float *g = d[4];
    return be->ops->linear_backward_multi(be, d[3], g, a->bias ? g + (int64_t)a->out * a->in : NULL,
                                          d[2], d[0], d[1], stride_of(a), a->count, a->rows, a->in,
                                          a->out, a->accumulate);
}

static const multi_args CASES[] = {
    {1, 1, 1, 2, 0, true, false},    {7, 13, 5, 3, 0, true, true}, {37, 13, 29, 2, 3, false, false},
    {130, 65, 17, 4, 0, true, true}, {9, 0, 6, 2, 1, true, false}, {20, 24, 16, 1, 0, true, true},
    {33, 32, 48, 3, 0, true, false},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static void describe(char *buf, size_t n, const multi_args *a) {
    snprintf(buf, n, "rows %d in %d out %d count %d gap %d%s%s", a->rows, a->in, a->out, a->count,
             a->gap, a->bias ? " bias" : "", a->accumulate ? " accumulate" : "");
}

/* got against want: bit-equal on the CPU, within ACCUM elsewhere. */
static void expect_same(const char *what, const char *name, const float *got, const float *want,
                        size_t n) {
    const bool exact = strcmp(lh_backend_name(), "cpu") == 0;
    const size_t bad = lh_mismatch(LH_ACCUM, exact, got, want, n);
    ck_assert_msg(bad == 0, "%s: %s[%zu] = %.9g, the separate calls %.9g", what, name,
                  bad ? bad - 1 : 0, bad ? (double)got[bad - 1] : 0.0,
                  bad ? (double)want[bad - 1] : 0.0);
}

START_TEST(forward_is_the_separate_calls) {
    luna_backend *be = lh_backend(2);
    for (size_t k = 0; k < NCASES; k++) {
        const multi_args *a = &CASES[k];
        char what[128];
        describe(what, sizeof what, a);
        const size_t nx = (size_t)a->rows * a->in, np = params_of(a);
        const size_t ny1 = (size_t)a->rows * a->out, ny = ny1 * a->count;
        float *x = vec(10 + k, nx), *P = vec(20 + k, np);
        float *dx = lh_f32(be, x, nx ? nx : 1), *dP = lh_f32(be, P, np);
        float *y = lh_alloc(be, ny * sizeof(float)), *y2 = lh_alloc(be, ny * sizeof(float));
        void *dev[3] = {dx, dP, y};
        LUNA_CHECK_OK(run_forward(be, dev, a));
        for (int i = 0; i < a->count; i++) {
            const float *W = dP + (int64_t)i * stride_of(a);
            LUNA_CHECK_OK(be->ops->linear_forward(be, y2 + (size_t)i * ny1, dx, W,
                                                  a->bias ? W + (int64_t)a->out * a->in : NULL,
                                                  a->rows, a->in, a->out));
        }
        float *got = lh_fetch_f32(be, y, ny), *want = lh_fetch_f32(be, y2, ny);
        expect_same(what, "y", got, want, ny);
        free(got), free(want), free(x), free(P);
        lh_free(be, dx), lh_free(be, dP), lh_free(be, y), lh_free(be, y2);
    }
    luna_backend_free(be);
}
END_TEST

START_TEST(backward_is_the_separate_calls_in_order) {
    luna_backend *be = lh_backend(2);
    for (size_t k = 0; k < NCASES; k++) {
        const multi_args *a = &CASES[k];
        char what[128];
        describe(what, sizeof what, a);
        const size_t nx = (size_t)a->rows * a->in, np = params_of(a);
        const size_t ny1 = (size_t)a->rows * a->out, ny = ny1 * a->count;
        float *x = vec(30 + k, nx), *P = vec(40 + k, np), *dy = vec(50 + k, ny);
        float *dx0 = vec(60 + k, nx), *g0 = vec(70 + k, np);
        float *d_x = lh_f32(be, x, nx ? nx : 1), *d_P = lh_f32(be, P, np);
        float *d_dy = lh_f32(be, dy, ny);
        float *dx1 = lh_f32(be, dx0, nx ? nx : 1), *dx2 = lh_f32(be, dx0, nx ? nx : 1);
        float *g1 = lh_f32(be, g0, np), *g2 = lh_f32(be, g0, np);
        void *dev[5] = {d_x, d_P, d_dy, dx1, g1};
        LUNA_CHECK_OK(run_backward(be, dev, a));
        const int64_t wo = (int64_t)a->out * a->in;
        for (int i = 0; i < a->count; i++) {
            const int64_t o = (int64_t)i * stride_of(a);
            LUNA_CHECK_OK(be->ops->linear_backward(be, dx2, g2 + o, a->bias ? g2 + o + wo : NULL,
                                                   d_dy + (size_t)i * ny1, d_x, d_P + o, a->rows,
                                                   a->in, a->out, a->accumulate || i > 0));
        }
        if (nx) {
            float *got = lh_fetch_f32(be, dx1, nx), *want = lh_fetch_f32(be, dx2, nx);
            expect_same(what, "dx", got, want, nx);
            free(got), free(want);
        }
        float *got = lh_fetch_f32(be, g1, np), *want = lh_fetch_f32(be, g2, np);
        expect_same(what, "gradients", got, want, np);
        /* the gap and (without a bias) the bias slots are not written */
        for (int i = 0; i < a->count; i++)
            for (int64_t e = a->bias ? wo + a->out : wo; e < stride_of(a); e++) {
                const size_t at = (size_t)(i * stride_of(a) + e);
                ck_assert_msg(memcmp(&got[at], &g0[at], sizeof(float)) == 0,
                              "%s: gradient element %zu outside dW_i, db_i written", what, at);
            }
        free(got), free(want), free(x), free(P), free(dy), free(dx0), free(g0);
        lh_free(be, d_x), lh_free(be, d_P), lh_free(be, d_dy), lh_free(be, dx1), lh_free(be, dx2);
        lh_free(be, g1), lh_free(be, g2);
    }
    luna_backend_free(be);
}
END_TEST

START_TEST(multi_matches_reference_backend) {
    for (size_t k = 0; k < NCASES; k++) {
        const multi_args *a = &CASES[k];
        char what[128];
        describe(what, sizeof what, a);
        const size_t nx = (size_t)a->rows * a->in, np = params_of(a);
        const size_t ny = (size_t)a->rows * a->out * a->count;
        float *x = vec(80 + k, nx), *P = vec(90 + k, np), *y = vec(100 + k, ny);
        float *dx = vec(110 + k, nx), *g = vec(120 + k, np);
        lh_buf fwd[] = {
            {x, nx ? nx : 1, LH_F32, LH_IN}, {P, np, LH_F32, LH_IN}, {y, ny, LH_F32, LH_OUT}};
        ck_assert_int_eq(lh_compare("linear_forward_multi", what, 2, run_forward, a, fwd, 3),
                         LUNA_OK);
        lh_buf bwd[] = {{x, nx ? nx : 1, LH_F32, LH_IN},
                        {P, np, LH_F32, LH_IN},
                        {y, ny, LH_F32, LH_IN},
                        {dx, nx ? nx : 1, LH_F32, LH_OUT},
                        {g, np, LH_F32, LH_OUT}};
        ck_assert_int_eq(lh_compare("linear_backward_multi", what, 2, run_backward, a, bwd, 5),
                         LUNA_OK);
        free(x), free(P), free(y), free(dx), free(g);
    }
}
END_TEST

/* bf16 bits of f, round to nearest even (finite inputs), and back. */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A device's bf16 mode reads the weights through bf16 copies (one of the whole span here): the
 * projections equal the separate calls within bf16 rounding, and after the fp32 weights change
 * the next call uses the new ones (the span's copy is refreshed). */
START_TEST(bf16_multi_is_the_separate_calls) {
    if (strcmp(lh_backend_name(), "cpu") == 0) {
        printf("bf16: the CPU backend has fp32 activations only (nothing to compare)\n");
        return;
    }
    luna_backend_options o = luna_backend_options_default();
    o.bf16 = true;
    luna_backend *be;
    LUNA_CHECK_OK(luna_backend_create(&be, lh_backend_name(), &o));
    ck_assert_int_eq(be->act_dtype, LUNA_BF16);
    const multi_args a = {33, 32, 48, 3, 0, true, false};
    const int64_t stride = stride_of(&a), wo = (int64_t)a.out * a.in;
    const size_t nx = (size_t)a.rows * a.in, np = params_of(&a);
    const size_t ny1 = (size_t)a.rows * a.out, ny = ny1 * a.count;
    float *x = vec(130, nx), *P = vec(140, np);
    uint16_t *xb = malloc(2 * nx), *yb = malloc(2 * ny), *yb2 = malloc(2 * ny);
    for (size_t e = 0; e < nx; e++)
        xb[e] = to_bf16(x[e]);
    void *dx = luna_mem_alloc(be, 2 * nx), *y = luna_mem_alloc(be, 2 * ny);
    void *y2 = luna_mem_alloc(be, 2 * ny);
    float *dP = luna_mem_alloc(be, 4 * np);
    LUNA_CHECK_OK(luna_mem_from_host(be, dx, xb, 2 * nx));
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* new weights for projection 1 */
            for (int64_t e = 0; e < wo; e++)
                P[stride + e] = -2.0f * P[stride + e];
        }
        LUNA_CHECK_OK(luna_mem_from_host(be, dP, P, 4 * np));
        LUNA_CHECK_OK(be->ops->linear_forward_multi(be, y, dx, dP, dP + wo, stride, a.count, a.rows,
                                                    a.in, a.out));
        for (int i = 0; i < a.count; i++)
            LUNA_CHECK_OK(be->ops->linear_forward(be, (uint16_t *)y2 + (size_t)i * ny1, dx,
                                                  dP + i * stride, dP + i * stride + wo, a.rows,
                                                  a.in, a.out));
        LUNA_CHECK_OK(luna_mem_to_host(be, yb, y, 2 * ny));
        LUNA_CHECK_OK(luna_mem_to_host(be, yb2, y2, 2 * ny));
        for (size_t e = 0; e < ny; e++) {
            /* against the host's sum of the bf16 inputs (fp32 weights rounded to bf16 too) */
            const size_t i = e / ny1, r = (e % ny1) / a.out, n = e % a.out;
            const float *W = P + i * stride + (int64_t)n * a.in;
            double want = from_bf16(to_bf16(W[wo - (int64_t)n * a.in + n]));
            for (int k = 0; k < a.in; k++)
                want += (double)from_bf16(xb[r * a.in + k]) * from_bf16(to_bf16(W[k]));
            const double got = from_bf16(yb[e]), sep = from_bf16(yb2[e]);
            ck_assert_msg(fabs(got - sep) <= fabs(sep) / 128 + 1e-6,
                          "round %d: y[%zu] = %.6g, the separate calls %.6g", round, e, got, sep);
            ck_assert_msg(fabs(got - want) <= fabs(want) / 128 + 1e-3,
                          "round %d: y[%zu] = %.6g, the host's %.6g", round, e, got, want);
        }
    }
    luna_mem_release(be, dx, 2 * nx), luna_mem_release(be, y, 2 * ny);
    luna_mem_release(be, y2, 2 * ny), luna_mem_release(be, dP, 4 * np);
    free(x), free(P), free(xb), free(yb), free(yb2);
    luna_backend_free(be);
}
END_TEST

/* A stride that would overlap two weights, or no projection at all, is refused. */
START_TEST(bad_arguments_are_refused) {
    luna_backend *be = lh_backend(1);
    float *buf = lh_alloc(be, 64 * sizeof(float));
    ck_assert_int_eq(be->ops->linear_forward_multi(be, buf, buf, buf, NULL, 5, 2, 2, 2, 3),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "stride"));
    ck_assert_int_eq(
        be->ops->linear_backward_multi(be, buf, buf, NULL, buf, buf, buf, 6, 0, 2, 2, 3, false),
        LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "count"));
    lh_free(be, buf);
    luna_backend_free(be);
}
END_TEST

static Suite *linear_multi_suite(void) {
    Suite *s = suite_create("ops_linear_multi");
    TCase *tc = tcase_create("linear_multi");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, forward_is_the_separate_calls);
    tcase_add_test(tc, backward_is_the_separate_calls_in_order);
    tcase_add_test(tc, multi_matches_reference_backend);
    tcase_add_test(tc, bf16_multi_is_the_separate_calls);
    tcase_add_test(tc, bad_arguments_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(linear_multi_suite()); }
