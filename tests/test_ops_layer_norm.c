/* Tests of LayerNorm, the model's only normalisation, which runs inside residual_norm (the fused
 * post-norm sublayer end): here alone, as residual_norm with no bias, no dropout and a zero
 * residual (lh_layer_norm_forward / _backward, tests/backend_harness.h). Forward against a naive
 * double implementation, finite-difference gradients for dx, dgamma and dbeta, dx aliasing dy,
 * accumulation, thread-count determinism, and the backend under test (LUNA_TEST_BACKEND) against
 * the CPU reference. Ops get device buffers from the harness. (The bias, dropout and residual
 * parts of residual_norm: tests/test_ops_fused.c.) */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

#ifndef GC_EPS
#define GC_EPS 3e-3
#endif
#ifndef GC_RTOL
#define GC_RTOL 2e-3
#endif
#ifndef GC_FLOOR
#define GC_FLOOR 1e-3
#endif
#define LN_EPS 1e-5f

/* The ops on device copies of host arrays (the checks below read host arrays): inputs uploaded,
 * outputs (and the accumulated dgamma, dbeta) uploaded, computed and read back. */
static luna_status ln_forward(luna_backend *be, float *y, float *mean, float *rstd, const float *x,
                              const float *g, const float *b, int rows, int d) {
    size_t n = (size_t)rows * d;
    float *vx = lh_f32(be, x, n), *vg = lh_f32(be, g, (size_t)d), *vb = lh_f32(be, b, (size_t)d);
    float *vy = lh_alloc(be, n * 4), *vm = lh_alloc(be, (size_t)rows * 4);
    float *vr = lh_alloc(be, (size_t)rows * 4);
    luna_status st = lh_layer_norm_forward(be, vy, vm, vr, vx, vg, vb, rows, d, LN_EPS);
    if (st == LUNA_OK) {
        lh_download(be, y, vy, n * 4);
        lh_download(be, mean, vm, (size_t)rows * 4);
        lh_download(be, rstd, vr, (size_t)rows * 4);
    }
    float *all[] = {vx, vg, vb, vy, vm, vr};
    for (int i = 0; i < 6; i++)
        lh_free(be, all[i]);
    return st;
}

/* dx may be dy (the op then runs with dx aliasing dy on the device too). */
static luna_status ln_backward(luna_backend *be, float *dx, float *dg, float *db, const float *dy,
                               const float *x, const float *mean, const float *rstd, const float *g,
                               int rows, int d) {
    size_t n = (size_t)rows * d;
    float *vdy = lh_f32(be, dy, n), *vx = lh_f32(be, x, n), *vm = lh_f32(be, mean, (size_t)rows);
    float *vr = lh_f32(be, rstd, (size_t)rows), *vg = lh_f32(be, g, (size_t)d);
    float *vdx = dx == dy ? vdy : lh_alloc(be, n * 4);
    float *vdg = lh_f32(be, dg, (size_t)d), *vdb = lh_f32(be, db, (size_t)d);
    luna_status st = lh_layer_norm_backward(be, vdx, vdg, vdb, vdy, vx, vm, vr, vg, rows, d);
    if (st == LUNA_OK) {
        lh_download(be, dx, vdx, n * 4);
        lh_download(be, dg, vdg, (size_t)d * 4);
        lh_download(be, db, vdb, (size_t)d * 4);
    }
    if (vdx != vdy) lh_free(be, vdx);
    float *all[] = {vdy, vx, vm, vr, vg, vdg, vdb};
    for (int i = 0; i < 7; i++)
        lh_free(be, all[i]);
    return st;
}

START_TEST(layer_norm_forward_matches_naive_double) {
    luna_backend *be = lh_backend(2);
    static const int shapes[][2] = {{1, 1}, {3, 5}, {7, 33}, {64, 512}, {1, 2}, {200, 257}};
    static const float offsets[] = {0.0f, 10.0f}; /* a large mean tests the accumulation */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int o = 0; o < 2; o++) {
            int rows = shapes[s][0], d = shapes[s][1];
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 1 + s);
            float *x =
                luna_test_random_vector(&rng, (size_t)rows * d, offsets[o] - 1, offsets[o] + 1);
            float *g = luna_test_random_vector(&rng, d, 0.5f, 1.5f),
                  *b = luna_test_random_vector(&rng, d, -1, 1);
            float *y = luna_test_zeros((size_t)rows * d), *mean = luna_test_zeros(rows),
                  *rstd = luna_test_zeros(rows);
            ck_assert_int_eq(ln_forward(be, y, mean, rstd, x, g, b, rows, d), LUNA_OK);
            for (int r = 0; r < rows; r++) {
                const float *xr = x + (size_t)r * d;
                double m = 0, v = 0;
                for (int c = 0; c < d; c++)
                    m += xr[c];
                m /= d;
                for (int c = 0; c < d; c++)
                    v += (xr[c] - m) * (xr[c] - m);
                v /= d;
                double rs = 1.0 / sqrt(v + LN_EPS);
                LUNA_EXPECT(fabs(mean[r] - m) <= 1e-6 * fmax(1, fabs(m)), "mean[%d] %.9g vs %.9g",
                            r, mean[r], m);
                LUNA_EXPECT(fabs(rstd[r] - rs) <= 1e-6 * rs, "rstd[%d] %.9g vs %.9g", r, rstd[r],
                            rs);
                for (int c = 0; c < d; c++) {
                    double want = (xr[c] - m) * rs * g[c] + b[c];
                    LUNA_EXPECT(fabs(y[(size_t)r * d + c] - want) <= 1e-5 * fmax(1, fabs(want)),
                                "rows %d d %d offset %g: y[%d][%d] = %.9g, want %.9g", rows, d,
                                offsets[o], r, c, y[(size_t)r * d + c], want);
                }
            }
            free(x);
            free(g);
            free(b);
            free(y);
            free(mean);
            free(rstd);
        }
    luna_backend_free(be);
}
END_TEST

typedef struct {
    luna_backend *be;
    float *x, *gamma, *beta, *y, *mean, *rstd, *w;
    int rows, d;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    luna_status st =
        ln_forward(c->be, c->y, c->mean, c->rstd, c->x, c->gamma, c->beta, c->rows, c->d);
    LUNA_EXPECT(st == LUNA_OK, "%s", luna_error_message());
    return luna_test_weighted_sum(c->y, c->w, (size_t)c->rows * c->d);
}

START_TEST(layer_norm_gradients_match_finite_differences) {
    luna_backend *be = lh_backend(2);
    static const int shapes[][2] = {{1, 1}, {3, 5}, {7, 33}, {1, 3}, {5, 64}, {3, 1}};
    double worst[3] = {0, 0, 0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], d = shapes[s][1];
        size_t n = (size_t)rows * d;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 20 + s);
        ln_ctx c = {be,
                    luna_test_random_vector(&rng, n, -1, 1),
                    luna_test_random_vector(&rng, d, 0.5f, 1.5f),
                    luna_test_random_vector(&rng, d, -1, 1),
                    luna_test_zeros(n),
                    luna_test_zeros(rows),
                    luna_test_zeros(rows),
                    luna_test_random_vector(&rng, n, -1, 1),
                    rows,
                    d};
        ln_loss(&c); /* mean, rstd for the backward */
        float *dx = luna_test_zeros(n), *dg = luna_test_zeros(d), *db = luna_test_zeros(d);
        ck_assert_int_eq(ln_backward(be, dx, dg, db, c.w, c.x, c.mean, c.rstd, c.gamma, rows, d),
                         LUNA_OK);
        worst[0] = fmax(worst[0], luna_test_gradcheck("layer_norm dx", ln_loss, &c, c.x, n, dx,
                                                      GC_EPS, GC_RTOL, GC_FLOOR));
        worst[1] = fmax(worst[1], luna_test_gradcheck("layer_norm dgamma", ln_loss, &c, c.gamma, d,
                                                      dg, GC_EPS, GC_RTOL, GC_FLOOR));
        worst[2] = fmax(worst[2], luna_test_gradcheck("layer_norm dbeta", ln_loss, &c, c.beta, d,
                                                      db, GC_EPS, GC_RTOL, GC_FLOOR));
        free(c.x);
        free(c.gamma);
        free(c.beta);
        free(c.y);
        free(c.mean);
        free(c.rstd);
        free(c.w);
        free(dx);
        free(dg);
        free(db);
    }
    printf("layer_norm: worst gradcheck error dx %.3g, dgamma %.3g, dbeta %.3g\n", worst[0],
           worst[1], worst[2]);
    luna_backend_free(be);
}
END_TEST

/* dx may alias dy; dgamma/dbeta accumulate; 1 and 2 threads give bit-identical results. */
START_TEST(layer_norm_backward_alias_accumulate_deterministic) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 9);
    const int rows = 1001, d = 257;
    size_t n = (size_t)rows * d;
    float *x = luna_test_random_vector(&rng, n, -2, 2),
          *g = luna_test_random_vector(&rng, d, 0.5f, 1.5f);
    float *b = luna_test_random_vector(&rng, d, -1, 1),
          *dy = luna_test_random_vector(&rng, n, -1, 1);
    float *y = luna_test_zeros(n), *mean = luna_test_zeros(rows), *rstd = luna_test_zeros(rows);
    float *dg0 = luna_test_random_vector(&rng, d, -1, 1),
          *db0 = luna_test_random_vector(&rng, d, -1, 1);
    ck_assert_int_eq(ln_forward(be, y, mean, rstd, x, g, b, rows, d), LUNA_OK);
    float *dx[3], *dg[3], *db[3];
    for (int t = 0; t < 3; t++) {
        dx[t] = malloc(sizeof(float) * n);
        dg[t] = luna_test_zeros(d);
        db[t] = luna_test_zeros(d);
    }
    /* 0: 2 threads, separate dx; 1: 1 thread, separate; 2: 2 threads, dx aliasing dy. */
    lh_set_threads(be, 2);
    ck_assert_int_eq(ln_backward(be, dx[0], dg[0], db[0], dy, x, mean, rstd, g, rows, d), LUNA_OK);
    lh_set_threads(be, 1);
    ck_assert_int_eq(ln_backward(be, dx[1], dg[1], db[1], dy, x, mean, rstd, g, rows, d), LUNA_OK);
    lh_set_threads(be, 2);
    memcpy(dx[2], dy, sizeof(float) * n);
    memcpy(dg[2], dg0, sizeof(float) * d);
    memcpy(db[2], db0, sizeof(float) * d);
    ck_assert_int_eq(ln_backward(be, dx[2], dg[2], db[2], dx[2], x, mean, rstd, g, rows, d),
                     LUNA_OK);
    ck_assert_int_eq(memcmp(dx[0], dx[1], sizeof(float) * n), 0);
    ck_assert_int_eq(memcmp(dg[0], dg[1], sizeof(float) * d), 0);
    ck_assert_int_eq(memcmp(db[0], db[1], sizeof(float) * d), 0);
    ck_assert_int_eq(memcmp(dx[0], dx[2], sizeof(float) * n), 0);
    for (int c = 0; c < d; c++) {
        LUNA_EXPECT(fabs(dg[2][c] - (dg0[c] + dg[0][c])) <= 1e-5 * (1 + fabs(dg[0][c])),
                    "dgamma[%d] did not accumulate", c);
        LUNA_EXPECT(fabs(db[2][c] - (db0[c] + db[0][c])) <= 1e-5 * (1 + fabs(db[0][c])),
                    "dbeta[%d] did not accumulate", c);
    }
    for (int t = 0; t < 3; t++) {
        free(dx[t]);
        free(dg[t]);
        free(db[t]);
    }
    free(x);
    free(g);
    free(b);
    free(dy);
    free(y);
    free(mean);
    free(rstd);
    free(dg0);
    free(db0);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    int64_t rows;
    int d;
} cmp_args;

/* d[0] x, d[1] gamma, d[2] beta, d[3] y / dy, d[4] mean, d[5] rstd, d[6] dx, d[7] dgamma,
 * d[8] dbeta. */
static luna_status cmp_forward(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    return lh_layer_norm_forward(be, d[3], d[4], d[5], d[0], d[1], d[2], a->rows, a->d, LN_EPS);
}
static luna_status cmp_backward(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    return lh_layer_norm_backward(be, d[6], d[7], d[8], d[3], d[0], d[4], d[5], d[1], a->rows,
                                  a->d);
}

START_TEST(layer_norm_matches_reference_backend) {
    const int shapes[][2] = {{1, 1}, {7, 13}, {33, 5}, {130, 257}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int rows = shapes[k][0], d = shapes[k][1];
        size_t n = (size_t)rows * d;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 70 + k);
        float *x = luna_test_random_vector(&rng, n, -3, 5),
              *g = luna_test_random_vector(&rng, d, 0.5f, 1.5f);
        float *b = luna_test_random_vector(&rng, d, -1, 1),
              *dy = luna_test_random_vector(&rng, n, -1, 1);
        float *mean = luna_test_zeros((size_t)rows), *rstd = luna_test_zeros((size_t)rows);
        float *dg = luna_test_random_vector(&rng, d, -1, 1),
              *db = luna_test_random_vector(&rng, d, -1, 1);
        cmp_args a = {rows, d};
        char what[32];
        snprintf(what, sizeof what, "rows %d d %d", rows, d);
        lh_buf fw[] = {{x, n, LH_F32, LH_IN},
                       {g, (size_t)d, LH_F32, LH_IN},
                       {b, (size_t)d, LH_F32, LH_IN},
                       {NULL, n, LH_F32, LH_OUT},
                       {NULL, (size_t)rows, LH_F32, LH_OUT},
                       {NULL, (size_t)rows, LH_F32, LH_OUT}};
        ck_assert_int_eq(lh_compare("residual_norm_forward", what, 2, cmp_forward, &a, fw, 6),
                         LUNA_OK);
        /* the statistics the backward reads: the reference's */
        luna_backend *ref = lh_reference();
        float *vx = lh_f32(ref, x, n), *vg = lh_f32(ref, g, (size_t)d),
              *vb = lh_f32(ref, b, (size_t)d);
        float *vy = lh_alloc(ref, n * sizeof(float)), *vm = lh_alloc(ref, (size_t)rows * 4);
        float *vr = lh_alloc(ref, (size_t)rows * 4);
        LUNA_CHECK_OK(lh_layer_norm_forward(ref, vy, vm, vr, vx, vg, vb, rows, d, LN_EPS));
        lh_download(ref, mean, vm, (size_t)rows * 4);
        lh_download(ref, rstd, vr, (size_t)rows * 4);
        float *bufs[] = {vx, vg, vb, vy, vm, vr};
        for (int i = 0; i < 6; i++)
            lh_free(ref, bufs[i]);
        luna_backend_free(ref);
        lh_buf bw[] = {{x, n, LH_F32, LH_IN},
                       {g, (size_t)d, LH_F32, LH_IN},
                       {b, (size_t)d, LH_F32, LH_IN},
                       {dy, n, LH_F32, LH_IN},
                       {mean, (size_t)rows, LH_F32, LH_IN},
                       {rstd, (size_t)rows, LH_F32, LH_IN},
                       {NULL, n, LH_F32, LH_OUT},
                       {dg, (size_t)d, LH_F32, LH_OUT},
                       {db, (size_t)d, LH_F32, LH_OUT}};
        ck_assert_int_eq(lh_compare("residual_norm_backward", what, 2, cmp_backward, &a, bw, 9),
                         LUNA_OK);
        free(x);
        free(g);
        free(b);
        free(dy);
        free(mean);
        free(rstd);
        free(dg);
        free(db);
    }
}
END_TEST

static Suite *layer_norm_suite(void) {
    Suite *s = suite_create("ops_layer_norm");
    TCase *tc = tcase_create("layer_norm");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, layer_norm_forward_matches_naive_double);
    tcase_add_test(tc, layer_norm_gradients_match_finite_differences);
    tcase_add_test(tc, layer_norm_backward_alias_accumulate_deterministic);
    tcase_add_test(tc, layer_norm_matches_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(layer_norm_suite()); }
