/* Tests of the elementwise helpers and layout ops (model/kernels/cpu/elementwise.c): add, axpy,
 * scale_act against exact host arithmetic; split/merge heads as inverse permutations with
 * finite-difference gradients; broadcast_rows/sum_broadcast as adjoints, sum_broadcast
 * accumulating; and every one of them on the backend under test (LUNA_TEST_BACKEND) against the
 * CPU reference on odd shapes. Dropout and the activations: tests/test_ops_activations.c. Ops get
 * device buffers from the harness (tests/backend_harness.h); the checks read them back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

#define FD_EPS 1e-2
#define FD_RTOL 2e-3
#define FD_FLOOR 1e-3

static float *random_vector(uint64_t seed, int64_t n, float lo, float hi) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    ck_assert_ptr_nonnull(x);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    luna_test_fill_uniform(&rng, x, (size_t)n, lo, hi);
    return x;
}

#define OK(expr) ck_assert_msg((expr) == LUNA_OK, "%s: %s", #expr, luna_error_message())

/* ---- A layout op y = f(x) with backward dx = b(dy), checked by finite differences ---------- */
enum { U_SPLIT, U_BROADCAST };
typedef struct {
    luna_backend *be;
    int op;
    int64_t n, n_out;    /* input and output sizes */
    int dims[4];         /* split: B, n, H, dh; broadcast: B, rows, d */
    float *x, *y, *w;    /* host: x [n], y [n_out], w [n_out] */
    float *dx, *dy, *dw; /* their device copies */
} unary_case;

/* Device copies of a case's host vectors (x and w uploaded). */
static void unary_attach(unary_case *c) {
    c->dx = lh_f32(c->be, c->x, (size_t)c->n);
    c->dy = lh_alloc(c->be, (size_t)c->n_out * sizeof(float));
    c->dw = lh_f32(c->be, c->w, (size_t)c->n_out);
}
static void unary_detach(unary_case *c) {
    lh_free(c->be, c->dx);
    lh_free(c->be, c->dy);
    lh_free(c->be, c->dw);
}

/* y = f(x): x uploaded, the op run on the device, y read back. */
static void unary_forward(unary_case *c) {
    luna_backend *be = c->be;
    const int *d = c->dims;
    float *x = c->dx, *y = c->dy;
    lh_upload(be, x, c->x, (size_t)c->n * sizeof(float));
    switch (c->op) {
    case U_SPLIT: OK(be->ops->split_heads(be, y, x, d[0], d[1], d[2], d[3])); break;
    case U_BROADCAST: OK(be->ops->broadcast_rows(be, y, x, d[0], d[1], d[2])); break;
    }
    lh_download(be, c->y, y, (size_t)c->n_out * sizeof(float));
}

/* dx [n] (host) from dy = w, on the device. */
static void unary_backward(unary_case *c, float *dx_host) {
    luna_backend *be = c->be;
    const int *d = c->dims;
    float *dx = lh_alloc(be, (size_t)c->n * sizeof(float)), *w = c->dw;
    switch (c->op) {
    case U_SPLIT: OK(be->ops->merge_heads(be, dx, w, d[0], d[1], d[2], d[3])); break;
    case U_BROADCAST:
        OK(luna_mem_zero(be, dx, (size_t)c->n * sizeof(float)));
        OK(be->ops->sum_broadcast(be, dx, w, d[0], d[1], d[2]));
        break;
    }
    lh_download(be, dx_host, dx, (size_t)c->n * sizeof(float));
    lh_free(be, dx);
}

static double unary_loss(void *ctx) {
    unary_case *c = ctx;
    unary_forward(c);
    return luna_test_weighted_sum(c->y, c->w, (size_t)c->n_out);
}

/* memcmp of two device buffers of n floats. */
static int dev_cmp(luna_backend *be, const float *a, const float *b, int64_t n) {
    float *ha = lh_fetch_f32(be, a, (size_t)n), *hb = lh_fetch_f32(be, b, (size_t)n);
    int r = memcmp(ha, hb, (size_t)n * sizeof *ha);
    free(ha);
    free(hb);
    return r;
}

/* ---- Arithmetic ------------------------------------------------------------------------------ */
START_TEST(add_axpy_scale_act) {
    luna_backend *be = lh_backend(2);
    const int64_t ns[] = {0, 1, 5, 100003};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int64_t n = ns[k];
        size_t un = (size_t)n, bytes = un * sizeof(float);
        float *a = random_vector(1 + k, n, -1, 1), *b = random_vector(2 + k, n, -1, 1);
        float *y0 = random_vector(3 + k, n, -1, 1), *y = malloc(bytes + 4);
        float *va = lh_f32(be, a, un), *vb = lh_f32(be, b, un), *vy = lh_f32(be, y0, un);
        float *vy1 = lh_f32(be, y0, un);
        int64_t bad = 0; /* (one ck_assert per element would make Check write per element) */
        OK(be->ops->add(be, vy, va, vb, n));
        lh_download(be, y, vy, bytes);
        for (int64_t i = 0; i < n; i++)
            bad += y[i] != a[i] + b[i];
        ck_assert_int_eq(bad, 0);
        OK(be->ops->add(be, va, va, vb, n)); /* in place */
        ck_assert_int_eq(dev_cmp(be, va, vy, n), 0);
        lh_upload(be, vy, y0, bytes);
        OK(be->ops->axpy(be, vy, -0.75f, vb, n));
        lh_download(be, y, vy, bytes);
        for (int64_t i = 0; i < n; i++)
            bad += y[i] != y0[i] + -0.75f * b[i];
        ck_assert_int_eq(bad, 0);
        OK(be->ops->scale_act(be, vy1, 3.0f, n));
        lh_download(be, y, vy1, bytes);
        for (int64_t i = 0; i < n; i++)
            bad += y[i] != 3.0f * y0[i];
        ck_assert_int_eq(bad, 0);
        free(a);
        free(b);
        free(y);
        free(y0);
        lh_free(be, va);
        lh_free(be, vb);
        lh_free(be, vy);
        lh_free(be, vy1);
    }
    float *z = lh_alloc(be, sizeof(float));
    ck_assert_int_eq(be->ops->scale_act(be, z, 1.0f, -1), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(be->ops->scale_act(be, NULL, 1.0f, 1), LUNA_ERR_INVALID_ARGUMENT);
    lh_free(be, z);
    luna_backend_free(be);
}
END_TEST

/* ---- Layout ---------------------------------------------------------------------------------- */
START_TEST(split_merge_heads) {
    luna_backend *be = lh_backend(2);
    const int shapes[][4] = {{1, 1, 1, 1}, {2, 3, 5, 7}, {1, 4, 8, 64}, {3, 65, 8, 64}};
    double worst = 0.0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int B = shapes[k][0], n = shapes[k][1], H = shapes[k][2], dh = shapes[k][3];
        int64_t total = (int64_t)B * n * H * dh;
        size_t bytes = (size_t)total * sizeof(float);
        float *x = random_vector(k, total, -1, 1), *vx = lh_f32(be, x, (size_t)total);
        float *vs = lh_alloc(be, bytes), *vm = lh_alloc(be, bytes);
        OK(be->ops->split_heads(be, vs, vx, B, n, H, dh));
        float *s = lh_fetch_f32(be, vs, (size_t)total), *m = malloc(bytes);
        int64_t bad = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++)
                for (int h = 0; h < H; h++)
                    for (int e = 0; e < dh; e++)
                        bad += s[(((int64_t)b * H + h) * n + t) * dh + e] !=
                               x[(((int64_t)b * n + t) * H + h) * dh + e];
        ck_assert_int_eq(bad, 0);
        OK(be->ops->merge_heads(be, vm, vs, B, n, H, dh));
        ck_assert_int_eq(dev_cmp(be, vm, vx, total), 0);
        if (total <= 1000) { /* FD of split_heads with merge_heads as its backward */
            unary_case c = {be,
                            U_SPLIT,
                            total,
                            total,
                            {B, n, H, dh},
                            x,
                            s,
                            random_vector(k + 9, total, -1, 1),
                            NULL,
                            NULL,
                            NULL};
            unary_attach(&c);
            unary_backward(&c, m);
            worst = fmax(worst, luna_test_gradcheck("split_heads", unary_loss, &c, x, (size_t)total,
                                                    m, FD_EPS, FD_RTOL, FD_FLOOR));
            unary_detach(&c);
            free(c.w);
        }
        free(x);
        free(s);
        free(m);
        lh_free(be, vx);
        lh_free(be, vs);
        lh_free(be, vm);
    }
    printf("split_heads gradcheck: worst error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* ⟨broadcast(x), y⟩ = ⟨x, sum_broadcast(y)⟩; sum_broadcast accumulates; FD of broadcast_rows. */
START_TEST(broadcast_adjoint) {
    luna_backend *be = lh_backend(2);
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {2, 1, 9}, {40, 32, 512}};
    double worst = 0.0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int B = shapes[k][0], rows = shapes[k][1], d = shapes[k][2];
        int64_t m = (int64_t)rows * d, total = B * m;
        float *x = random_vector(k, m, -1, 1), *y = random_vector(k + 50, total, -1, 1);
        float *sy0 = random_vector(k + 90, m, -1, 1);
        float *vx = lh_f32(be, x, (size_t)m), *vy = lh_f32(be, y, (size_t)total);
        float *vbx = lh_alloc(be, (size_t)total * sizeof(float)), *vsy = lh_f32(be, sy0, (size_t)m);
        OK(be->ops->broadcast_rows(be, vbx, vx, B, rows, d));
        OK(be->ops->sum_broadcast(be, vsy, vy, B, rows, d)); /* sy = sy0 + Σ_b y[b] */
        float *bx = lh_fetch_f32(be, vbx, (size_t)total), *sy = lh_fetch_f32(be, vsy, (size_t)m);
        for (int b = 0; b < B; b++)
            ck_assert_int_eq(memcmp(bx + b * m, x, (size_t)m * 4), 0);
        double lhs = 0.0, rhs = 0.0, mag = 0.0;
        for (int64_t i = 0; i < total; i++) {
            lhs += (double)bx[i] * y[i];
            mag += fabs((double)bx[i] * y[i]);
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < m; i++) {
            double expect = sy0[i];
            for (int b = 0; b < B; b++)
                expect += y[b * m + i];
            bad += !(fabs(sy[i] - expect) <= 1e-6 * (1.0 + B));
            rhs += (double)x[i] * ((double)sy[i] - sy0[i]);
        }
        ck_assert_msg(bad == 0, "sum_broadcast: %lld elements differ from Σ_b", (long long)bad);
        ck_assert_msg(fabs(lhs - rhs) <= 1e-6 * mag, "adjointness: %.12g vs %.12g", lhs, rhs);
        if (total <= 1000) {
            unary_case c = {be, U_BROADCAST, m, total, {B, rows, d, 0}, x, bx, y, NULL, NULL, NULL};
            float *dx = malloc((size_t)m * sizeof *dx);
            unary_attach(&c);
            unary_backward(&c, dx);
            worst = fmax(worst, luna_test_gradcheck("broadcast_rows", unary_loss, &c, x, (size_t)m,
                                                    dx, FD_EPS, FD_RTOL, FD_FLOOR));
            unary_detach(&c);
            free(dx);
        }
        free(x);
        free(y);
        free(bx);
        free(sy);
        free(sy0);
        lh_free(be, vx);
        lh_free(be, vy);
        lh_free(be, vbx);
        lh_free(be, vsy);
    }
    printf("broadcast_rows gradcheck: worst error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    const char *op;
    int64_t n;
    int dims[4]; /* split/merge: B, n, H, dh; broadcast: B, rows, d */
    float alpha;
} cmp_args;

/* d[0] the output (or the buffer updated in place), d[1], d[2] inputs. */
static luna_status cmp_run(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    const luna_ops *o = be->ops;
    const int *s = a->dims;
    const char *op = a->op;
    if (!strcmp(op, "add")) return o->add(be, d[0], d[1], d[2], a->n);
    if (!strcmp(op, "axpy")) return o->axpy(be, d[0], a->alpha, d[1], a->n);
    if (!strcmp(op, "scale_act")) return o->scale_act(be, d[0], a->alpha, a->n);
    if (!strcmp(op, "split_heads")) return o->split_heads(be, d[0], d[1], s[0], s[1], s[2], s[3]);
    if (!strcmp(op, "merge_heads")) return o->merge_heads(be, d[0], d[1], s[0], s[1], s[2], s[3]);
    if (!strcmp(op, "broadcast_rows")) return o->broadcast_rows(be, d[0], d[1], s[0], s[1], s[2]);
    return o->sum_broadcast(be, d[0], d[1], s[0], s[1], s[2]); /* "sum_broadcast" */
}

START_TEST(elementwise_match_reference_backend) {
    static const char *const unary[] = {"add", "axpy", "scale_act"};
    const int64_t ns[] = {1, 7, 13, 1001, 70001};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = (size_t)ns[k];
        float *x = random_vector(800 + k, ns[k], -30.0f, 30.0f);
        float *y = random_vector(900 + k, ns[k], -2.0f, 2.0f);
        float *o = random_vector(1000 + k, ns[k], -1.0f, 1.0f); /* initial output contents */
        for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++) {
            cmp_args a = {unary[i], ns[k], {0}, -0.75f};
            lh_buf bufs[] = {{o, n, LH_F32, LH_OUT}, {x, n, LH_F32, LH_IN}, {y, n, LH_F32, LH_IN}};
            char what[32];
            snprintf(what, sizeof what, "n=%zu", n);
            ck_assert_int_eq(lh_compare(unary[i], what, 2, cmp_run, &a, bufs, 3), LUNA_OK);
        }
        free(x);
        free(y);
        free(o);
    }
    static const char *const layout[] = {"split_heads", "merge_heads", "broadcast_rows",
                                         "sum_broadcast"};
    const int shapes[][4] = {{1, 1, 1, 1}, {3, 7, 5, 13}, {2, 13, 3, 7}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int *s = shapes[k];
        size_t total = (size_t)s[0] * s[1] * s[2] * s[3];
        float *x = random_vector(1100 + k, (int64_t)total, -1.0f, 1.0f);
        float *o = random_vector(1200 + k, (int64_t)total, -1.0f, 1.0f);
        for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
            bool bc = strstr(layout[i], "broadcast") != NULL;
            /* broadcast: B = s[0], rows = s[1], d = s[2]·s[3] */
            cmp_args a = {layout[i], 0, {s[0], s[1], bc ? s[2] * s[3] : s[2], s[3]}, 0};
            size_t small = total / (size_t)s[0]; /* broadcast's x, sum_broadcast's dx */
            bool sum = strcmp(layout[i], "sum_broadcast") == 0;
            lh_buf bufs[] = {{o, sum ? small : total, LH_F32, LH_OUT},
                             {x, bc && !sum ? small : total, LH_F32, LH_IN}};
            char what[48];
            snprintf(what, sizeof what, "%d %d %d %d", s[0], s[1], s[2], s[3]);
            ck_assert_int_eq(lh_compare(layout[i], what, 2, cmp_run, &a, bufs, 2), LUNA_OK);
        }
        free(x);
        free(o);
    }
}
END_TEST

static Suite *elementwise_suite(void) {
    Suite *s = suite_create("ops_elementwise");
    TCase *tc = tcase_create("elementwise");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, add_axpy_scale_act);
    tcase_add_test(tc, split_merge_heads);
    tcase_add_test(tc, broadcast_adjoint);
    tcase_add_test(tc, elementwise_match_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(elementwise_suite()); }
