/* Tests of the causal normalised contraction (model/kernels/cpu/causal_contraction.c):
 *   out_t = (1/t) Σ_{s≤t} (x_t · a_s) b_s,   x, a [G, n, p], b, out [G, n, q]
 * against a naive O(n²) double implementation that literally forms the sum, finite-difference
 * gradients for x, a and b, the backward against the naive double gradient formulas on the Luna
 * shapes, causality (out_t ignores every position s > t), thread-count independence and scratch
 * discipline, and the backend under test (LUNA_TEST_BACKEND) against the CPU reference. Ops get
 * device buffers from the harness (tests/backend_harness.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/allocator.h"
#include "core/backend.h"
#include "tests/backend_harness.h"

typedef struct {
    luna_backend *be;
    int G, n, p, q;
    float *x, *a, *b, *out, *w; /* w [G, n, q]: the fixed weights of L = Σ w ⊙ out */
    float *dx, *da, *db;
} causal_case;

static float *alloc_random(luna_test_rng *rng, size_t count, float lo, float hi) {
    float *v = malloc((count ? count : 1) * sizeof *v);
    ck_assert_ptr_nonnull(v);
    luna_test_fill_uniform(rng, v, count, lo, hi);
    return v;
}

static causal_case make_case(luna_backend *be, int G, int n, int p, int q, uint64_t seed) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    size_t np = (size_t)G * n * p, nq = (size_t)G * n * q;
    causal_case c = {be, G, n, p, q, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    c.x = alloc_random(&rng, np, -1.0f, 1.0f);
    c.a = alloc_random(&rng, np, -1.0f, 1.0f);
    c.b = alloc_random(&rng, nq, -1.0f, 1.0f);
    c.w = alloc_random(&rng, nq, -1.0f, 1.0f);
    c.out = alloc_random(&rng, nq, 0.0f, 0.0f);
    c.dx = alloc_random(&rng, np, 9.0f, 9.0f); /* garbage: backward must overwrite */
    c.da = alloc_random(&rng, np, 9.0f, 9.0f);
    c.db = alloc_random(&rng, nq, 9.0f, 9.0f);
    return c;
}

static void free_case(causal_case *c) {
    free(c->x);
    free(c->a);
    free(c->b);
    free(c->w);
    free(c->out);
    free(c->dx);
    free(c->da);
    free(c->db);
}

/* The ops run on device copies of the case's host arrays; outputs are read back. */
static void forward(causal_case *c) {
    luna_backend *be = c->be;
    size_t np = (size_t)c->G * c->n * c->p, nq = (size_t)c->G * c->n * c->q;
    float *x = lh_f32(be, c->x, np), *a = lh_f32(be, c->a, np), *b = lh_f32(be, c->b, nq);
    float *out = lh_f32(be, c->out, nq);
    luna_status st =
        be->ops->causal_contraction_forward(be, out, x, a, b, c->G, c->n, c->p, c->q, 1.0f, NULL);
    ck_assert_msg(st == LUNA_OK, "forward: %s", luna_error_message());
    lh_download(be, c->out, out, nq * sizeof(float));
    float *all[] = {x, a, b, out};
    for (int i = 0; i < 4; i++)
        lh_free(be, all[i]);
}

static void backward(causal_case *c) {
    luna_backend *be = c->be;
    size_t np = (size_t)c->G * c->n * c->p, nq = (size_t)c->G * c->n * c->q;
    float *x = lh_f32(be, c->x, np), *a = lh_f32(be, c->a, np), *b = lh_f32(be, c->b, nq);
    float *w = lh_f32(be, c->w, nq), *dx = lh_f32(be, c->dx, np), *da = lh_f32(be, c->da, np);
    float *db = lh_f32(be, c->db, nq);
    luna_status st = be->ops->causal_contraction_backward(be, dx, da, db, w, x, a, b, c->G, c->n,
                                                          c->p, c->q, 1.0f, NULL);
    ck_assert_msg(st == LUNA_OK, "backward: %s", luna_error_message());
    lh_download(be, c->dx, dx, np * sizeof(float));
    lh_download(be, c->da, da, np * sizeof(float));
    lh_download(be, c->db, db, nq * sizeof(float));
    float *all[] = {x, a, b, w, dx, da, db};
    for (int i = 0; i < 7; i++)
        lh_free(be, all[i]);
}

/* S_t = (1/t) Σ_{s≤t} (x_t · a_s) b_s formed literally, in double: ref [G, n, q]. */
static void naive_forward(const causal_case *c, double *ref) {
    int n = c->n, p = c->p, q = c->q;
    for (int g = 0; g < c->G; g++)
        for (int t = 0; t < n; t++) {
            const float *xt = c->x + ((size_t)g * n + t) * p;
            double *o = ref + ((size_t)g * n + t) * q;
            for (int j = 0; j < q; j++)
                o[j] = 0.0;
            for (int s = 0; s <= t; s++) {
                const float *as = c->a + ((size_t)g * n + s) * p;
                const float *bs = c->b + ((size_t)g * n + s) * q;
                double xa = 0.0;
                for (int i = 0; i < p; i++)
                    xa += (double)xt[i] * as[i];
                for (int j = 0; j < q; j++)
                    o[j] += xa * bs[j];
            }
            for (int j = 0; j < q; j++)
                o[j] /= (double)(t + 1);
        }
}

/* Naive double gradients of L = Σ w ⊙ out, straight from the sum over pairs s ≤ t:
 * ∂/∂x_t += (1/t)(b_s·w_t) a_s, ∂/∂a_s += (1/t)(b_s·w_t) x_t, ∂/∂b_s += (1/t)(x_t·a_s) w_t. */
static void naive_backward(const causal_case *c, double *gx, double *ga, double *gb) {
    int n = c->n, p = c->p, q = c->q;
    memset(gx, 0, (size_t)c->G * n * p * sizeof *gx);
    memset(ga, 0, (size_t)c->G * n * p * sizeof *ga);
    memset(gb, 0, (size_t)c->G * n * q * sizeof *gb);
    for (int g = 0; g < c->G; g++)
        for (int t = 0; t < n; t++)
            for (int s = 0; s <= t; s++) {
                size_t rt = (size_t)g * n + t, rs = (size_t)g * n + s;
                double xa = 0.0, bw = 0.0, inv = 1.0 / (t + 1);
                for (int i = 0; i < p; i++)
                    xa += (double)c->x[rt * p + i] * c->a[rs * p + i];
                for (int j = 0; j < q; j++)
                    bw += (double)c->b[rs * q + j] * c->w[rt * q + j];
                for (int i = 0; i < p; i++) {
                    gx[rt * p + i] += inv * bw * c->a[rs * p + i];
                    ga[rs * p + i] += inv * bw * c->x[rt * p + i];
                }
                for (int j = 0; j < q; j++)
                    gb[rs * q + j] += inv * xa * c->w[rt * q + j];
            }
}

/* max |got − ref| / max |ref| (normwise relative error). */
static double norm_rel_error(const float *got, const double *ref, size_t count) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < count; i++) {
        err = fmax(err, fabs((double)got[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    if (isnan(err)) return INFINITY;
    return scale > 0.0 ? err / scale : err;
}

/* (G, n, p, q): tiny, odd, n = 1, p or q = 1, and the two Luna shapes (d_h = 64, l = 32). */
static const int shapes[][4] = {{1, 1, 1, 1},    {2, 1, 3, 5},    {3, 7, 5, 3},   {2, 17, 13, 11},
                                {1, 9, 1, 6},    {2, 6, 7, 1},    {5, 33, 9, 4},  {4, 64, 64, 32},
                                {4, 64, 32, 64}, {3, 47, 64, 32}, {3, 47, 32, 64}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

START_TEST(forward_matches_naive) {
    luna_backend *be = lh_backend(2);
    double worst = 0.0;
    for (int k = 0; k < NSHAPES; k++) {
        causal_case c =
            make_case(be, shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], (uint64_t)k + 1);
        size_t nq = (size_t)c.G * c.n * c.q;
        double *ref = malloc(nq * sizeof *ref);
        naive_forward(&c, ref);
        forward(&c);
        double e = norm_rel_error(c.out, ref, nq);
        ck_assert_msg(e <= 1e-5, "forward G=%d n=%d p=%d q=%d: relative error %.3g", c.G, c.n, c.p,
                      c.q, e);
        worst = fmax(worst, e);
        free(ref);
        free_case(&c);
    }
    printf("causal forward: worst relative error vs naive double %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

START_TEST(backward_matches_naive) {
    luna_backend *be = lh_backend(2);
    double worst = 0.0;
    for (int k = 0; k < NSHAPES; k++) {
        causal_case c = make_case(be, shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3],
                                  (uint64_t)k + 100);
        size_t np = (size_t)c.G * c.n * c.p, nq = (size_t)c.G * c.n * c.q;
        double *gx = malloc(np * sizeof *gx), *ga = malloc(np * sizeof *ga);
        double *gb = malloc(nq * sizeof *gb);
        naive_backward(&c, gx, ga, gb);
        backward(&c);
        double e[3] = {norm_rel_error(c.dx, gx, np), norm_rel_error(c.da, ga, np),
                       norm_rel_error(c.db, gb, nq)};
        for (int v = 0; v < 3; v++) {
            ck_assert_msg(e[v] <= 1e-5, "backward d%s G=%d n=%d p=%d q=%d: relative error %.3g",
                          v == 0   ? "x"
                          : v == 1 ? "a"
                                   : "b",
                          c.G, c.n, c.p, c.q, e[v]);
            worst = fmax(worst, e[v]);
        }
        free(gx);
        free(ga);
        free(gb);
        free_case(&c);
    }
    printf("causal backward: worst relative error vs naive double %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

static double causal_loss(void *ctx) {
    causal_case *c = ctx;
    forward(c);
    return luna_test_weighted_sum(c->out, c->w, (size_t)c->G * c->n * c->q);
}

START_TEST(gradcheck_x_a_b) {
    luna_backend *be = lh_backend(2);
    static const int small[][4] = {{1, 1, 1, 1}, {2, 5, 3, 4}, {1, 9, 7, 5},
                                   {2, 4, 1, 6}, {1, 6, 5, 1}, {1, 8, 16, 8}};
    double worst = 0.0;
    for (size_t k = 0; k < sizeof small / sizeof small[0]; k++) {
        causal_case c = make_case(be, small[k][0], small[k][1], small[k][2], small[k][3], 50 + k);
        backward(&c);
        size_t np = (size_t)c.G * c.n * c.p, nq = (size_t)c.G * c.n * c.q;
        char what[96];
        snprintf(what, sizeof what, "causal dx G=%d n=%d p=%d q=%d", c.G, c.n, c.p, c.q);
        worst = fmax(worst,
                     luna_test_gradcheck(what, causal_loss, &c, c.x, np, c.dx, 1e-2, 1e-3, 1e-3));
        what[8] = 'a';
        worst = fmax(worst,
                     luna_test_gradcheck(what, causal_loss, &c, c.a, np, c.da, 1e-2, 1e-3, 1e-3));
        what[8] = 'b';
        worst = fmax(worst,
                     luna_test_gradcheck(what, causal_loss, &c, c.b, nq, c.db, 1e-2, 1e-3, 1e-3));
        free_case(&c);
    }
    printf("causal gradcheck: worst error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* out_t depends on nothing at positions s > t: changing every future x_s, a_s, b_s leaves the
 * outputs up to t bit-identical (and does change later ones). */
START_TEST(causality) {
    luna_backend *be = lh_backend(2);
    const int G = 3, n = 20, p = 8, q = 6, t0 = 9;
    causal_case c = make_case(be, G, n, p, q, 77);
    forward(&c);
    size_t nq = (size_t)G * n * q;
    float *before = malloc(nq * sizeof *before);
    memcpy(before, c.out, nq * sizeof *before);
    for (int g = 0; g < G; g++)
        for (int s = t0 + 1; s < n; s++) {
            for (int i = 0; i < p; i++) {
                c.a[((size_t)g * n + s) * p + i] += 0.5f;
                c.x[((size_t)g * n + s) * p + i] *= -2.0f;
            }
            for (int j = 0; j < q; j++)
                c.b[((size_t)g * n + s) * q + j] -= 0.25f;
        }
    forward(&c);
    for (int g = 0; g < G; g++) {
        size_t head = ((size_t)g * n) * q, upto = (size_t)(t0 + 1) * q;
        ck_assert_int_eq(memcmp(before + head, c.out + head, upto * sizeof(float)), 0);
        ck_assert_int_ne(memcmp(before + head + upto, c.out + head + upto,
                                (size_t)(n - t0 - 1) * q * sizeof(float)),
                         0);
    }
    free(before);
    free_case(&c);
    luna_backend_free(be);
}
END_TEST

/* Threads take whole groups: outputs and gradients are bit-identical for 1, 2 and 3 threads; the
 * scratch state is given back. */
START_TEST(threads_and_scratch) {
    luna_backend *be = lh_backend(1);
    causal_case c = make_case(be, 16, 64, 64, 32, 5);
    size_t np = (size_t)c.G * c.n * c.p, nq = (size_t)c.G * c.n * c.q;
    float *ref = malloc((2 * np + 2 * nq) * sizeof *ref);
    for (int threads = 1; threads <= 3; threads++) {
        lh_set_threads(be, threads);
        size_t used = be->scratch ? luna_arena_used_bytes(be->scratch) : 0;
        forward(&c);
        backward(&c);
        if (be->scratch) ck_assert_uint_eq(luna_arena_used_bytes(be->scratch), used);
        float *got[4] = {c.out, c.dx, c.da, c.db};
        size_t len[4] = {nq, np, np, nq}, off = 0;
        for (int v = 0; v < 4; v++) {
            if (threads == 1)
                memcpy(ref + off, got[v], len[v] * sizeof(float));
            else
                ck_assert_int_eq(memcmp(ref + off, got[v], len[v] * sizeof(float)), 0);
            off += len[v];
        }
    }
    free(ref);
    free_case(&c);
    luna_backend_free(be);
}
END_TEST

/* Rows where a Linear wrote them (luna_causal_layout) and alpha, on the backend under test:
 * heads of a [B, n, H·dim + 3] activation on one side (p: the (Q, K, Φ) product; q: the
 * (A, Φ, V) one), packed rows on the other; alpha = 1/8. Equal bit for bit to the packed op with
 * x scaled by 1/8 first (dx: 1/8 of its dx), the padding columns untouched. n = 19 crosses the
 * CUDA kernels' 16-position tiles. */
static float *spread(const float *packed, int B, int H, int n, int dim, int ld, size_t *count) {
    *count = (size_t)B * n * ld;
    float *s = malloc(*count * sizeof(float));
    for (size_t i = 0; i < *count; i++)
        s[i] = -7.0f; /* padding */
    for (int g = 0; g < B * H; g++)
        for (int t = 0; t < n; t++)
            memcpy(s + (size_t)(g / H) * n * ld + (size_t)(g % H) * dim + (size_t)t * ld,
                   packed + ((size_t)g * n + t) * dim, (size_t)dim * sizeof(float));
    return s;
}

static void check_layout(luna_backend *be, bool heads_on_p) {
    const int B = 2, H = 3, G = B * H, n = 19, dim = 8, other = 5;
    const int p = heads_on_p ? dim : other, q = heads_on_p ? other : dim, ld = H * dim + 3;
    const float alpha = 0.125f;
    causal_case ref = make_case(be, G, n, p, q, 99);
    causal_case c = make_case(be, G, n, p, q, 99);
    for (size_t i = 0; i < (size_t)G * n * p; i++)
        ref.x[i] = alpha * c.x[i]; /* exact: a power of two */
    forward(&ref);
    backward(&ref);
    /* the heads side: (sentence, head) at n·ld, dim; the packed side: group g at g·n·len */
    const luna_causal_layout ly = {.H = H,
                                   .p_ld = heads_on_p ? ld : p,
                                   .q_ld = heads_on_p ? q : ld,
                                   .p_outer = heads_on_p ? (int64_t)n * ld : (int64_t)H * n * p,
                                   .p_inner = heads_on_p ? dim : (int64_t)n * p,
                                   .q_outer = heads_on_p ? (int64_t)H * n * q : (int64_t)n * ld,
                                   .q_inner = heads_on_p ? (int64_t)n * q : dim};
    /* the heads side spread into rows of ld, the other side packed (as given) */
    size_t nh;
    float *hx = heads_on_p ? spread(c.x, B, H, n, dim, ld, &nh) : NULL;
    float *ha = heads_on_p ? spread(c.a, B, H, n, dim, ld, &nh) : NULL;
    float *hb = heads_on_p ? NULL : spread(c.b, B, H, n, dim, ld, &nh);
    float *hw = heads_on_p ? NULL : spread(c.w, B, H, n, dim, ld, &nh);
    const size_t np = heads_on_p ? nh : (size_t)G * n * p, nq = heads_on_p ? (size_t)G * n * q : nh;
    float *x = lh_f32(be, heads_on_p ? hx : c.x, np), *a = lh_f32(be, heads_on_p ? ha : c.a, np);
    float *b = lh_f32(be, heads_on_p ? c.b : hb, nq), *w = lh_f32(be, heads_on_p ? c.w : hw, nq);
    float *pad_p = malloc(np * sizeof(float)), *pad_q = malloc(nq * sizeof(float));
    for (size_t i = 0; i < np; i++)
        pad_p[i] = -7.0f;
    for (size_t i = 0; i < nq; i++)
        pad_q[i] = -7.0f;
    float *out = lh_f32(be, pad_q, nq), *dx = lh_f32(be, pad_p, np), *da = lh_f32(be, pad_p, np);
    float *db = lh_f32(be, pad_q, nq);
    LUNA_CHECK_OK(be->ops->causal_contraction_forward(be, out, x, a, b, G, n, p, q, alpha, &ly));
    LUNA_CHECK_OK(
        be->ops->causal_contraction_backward(be, dx, da, db, w, x, a, b, G, n, p, q, alpha, &ly));
    float *got[4] = {lh_fetch_f32(be, out, nq), lh_fetch_f32(be, dx, np), lh_fetch_f32(be, da, np),
                     lh_fetch_f32(be, db, nq)};
    const float *want[4] = {ref.out, ref.dx, ref.da, ref.db};
    const bool on_p[4] = {false, true, true, false};
    for (int k = 0; k < 4; k++) {
        const bool heads = on_p[k] == heads_on_p;
        const int len = on_p[k] ? p : q;
        const size_t total = on_p[k] ? np : nq;
        size_t checked = 0;
        for (int g = 0; g < G; g++)
            for (int t = 0; t < n; t++)
                for (int j = 0; j < len; j++) {
                    const size_t at = heads ? (size_t)(g / H) * n * ld + (size_t)(g % H) * dim +
                                                  (size_t)t * ld + (size_t)j
                                            : ((size_t)g * n + t) * len + (size_t)j;
                    const float expect = k == 1 ? alpha * want[k][((size_t)g * n + t) * len + j]
                                                : want[k][((size_t)g * n + t) * len + j];
                    ck_assert_msg(memcmp(&got[k][at], &expect, 4) == 0,
                                  "heads on %s: output %d (g %d, t %d, %d) = %.9g, want %.9g",
                                  heads_on_p ? "p" : "q", k, g, t, j, (double)got[k][at],
                                  (double)expect);
                    checked++;
                }
        size_t pads = 0;
        for (size_t i = 0; i < total; i++)
            pads += got[k][i] == -7.0f;
        ck_assert_uint_eq(pads, total - checked); /* every other element still padding */
        free(got[k]);
    }
    float *all[] = {x, a, b, w, out, dx, da, db};
    for (int i = 0; i < 8; i++)
        lh_free(be, all[i]);
    free(hx), free(ha), free(hb), free(hw), free(pad_p), free(pad_q);
    free_case(&ref);
    free_case(&c);
}

START_TEST(layouts_and_alpha) {
    luna_backend *be = lh_backend(2);
    check_layout(be, true);
    check_layout(be, false);
    luna_backend_free(be);
}
END_TEST

START_TEST(degenerate_shapes) {
    luna_backend *be = lh_backend(2);
    const float four[4] = {1, 2, 3, 4}, sevens[6] = {7, 7, 7, 7, 7, 7};
    float *dummy = lh_f32(be, four, 4), *vout = lh_f32(be, sevens, 6);
    const luna_ops *ops = be->ops;
    ck_assert_int_eq(
        ops->causal_contraction_forward(be, dummy, dummy, dummy, dummy, 0, 3, 2, 2, 1.0f, NULL),
        LUNA_OK);
    ck_assert_int_eq(
        ops->causal_contraction_forward(be, dummy, dummy, dummy, dummy, 2, 0, 2, 2, 1.0f, NULL),
        LUNA_OK);
    ck_assert_int_eq(
        ops->causal_contraction_forward(be, dummy, dummy, dummy, dummy, 1, -1, 2, 2, 1.0f, NULL),
        LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(ops->causal_contraction_backward(be, dummy, dummy, dummy, dummy, dummy, dummy,
                                                      dummy, 1, 2, 2, -3, 1.0f, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    /* p = 0: out = 0 (an empty dot product), overwritten. */
    ck_assert_int_eq(
        ops->causal_contraction_forward(be, vout, dummy, dummy, dummy, 1, 2, 0, 3, 1.0f, NULL),
        LUNA_OK);
    float out[6];
    lh_download(be, out, vout, sizeof out);
    lh_free(be, dummy);
    lh_free(be, vout);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(out[i], 0.0f);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    int G, n, p, q;
} cmp_args;

/* d[0] x, d[1] a, d[2] b, d[3] out / dout, d[4] dx, d[5] da, d[6] db. */
static luna_status cmp_forward(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *s = args;
    return be->ops->causal_contraction_forward(be, d[3], d[0], d[1], d[2], s->G, s->n, s->p, s->q,
                                               1.0f, NULL);
}
static luna_status cmp_backward(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *s = args;
    return be->ops->causal_contraction_backward(be, d[4], d[5], d[6], d[3], d[0], d[1], d[2], s->G,
                                                s->n, s->p, s->q, 1.0f, NULL);
}

START_TEST(causal_matches_reference_backend) {
    const cmp_args shapes[] = {{1, 1, 1, 1}, {3, 7, 5, 13}, {2, 13, 16, 7}, {5, 65, 9, 33}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const cmp_args *s = &shapes[k];
        size_t nxa = (size_t)s->G * s->n * s->p, nb = (size_t)s->G * s->n * s->q;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 130 + k);
        float *x = luna_test_random_vector(&rng, nxa, -1, 1),
              *a = luna_test_random_vector(&rng, nxa, 0, 1);
        float *b = luna_test_random_vector(&rng, nb, -1, 1),
              *dout = luna_test_random_vector(&rng, nb, -1, 1);
        char what[48];
        snprintf(what, sizeof what, "G %d n %d p %d q %d", s->G, s->n, s->p, s->q);
        lh_buf bufs[] = {{x, nxa, LH_F32, LH_IN},     {a, nxa, LH_F32, LH_IN},
                         {b, nb, LH_F32, LH_IN},      {dout, nb, LH_F32, LH_IN},
                         {NULL, nxa, LH_F32, LH_OUT}, {NULL, nxa, LH_F32, LH_OUT},
                         {NULL, nb, LH_F32, LH_OUT}};
        lh_buf fw[] = {bufs[0], bufs[1], bufs[2], {NULL, nb, LH_F32, LH_OUT}};
        ck_assert_int_eq(lh_compare("causal_contraction_forward", what, 2, cmp_forward, s, fw, 4),
                         LUNA_OK);
        ck_assert_int_eq(
            lh_compare("causal_contraction_backward", what, 2, cmp_backward, s, bufs, 7), LUNA_OK);
        free(x);
        free(a);
        free(b);
        free(dout);
    }
}
END_TEST

static Suite *causal_suite(void) {
    Suite *s = suite_create("ops_causal");
    TCase *tc = tcase_create("causal");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, forward_matches_naive);
    tcase_add_test(tc, backward_matches_naive);
    tcase_add_test(tc, gradcheck_x_a_b);
    tcase_add_test(tc, causality);
    tcase_add_test(tc, threads_and_scratch);
    tcase_add_test(tc, degenerate_shapes);
    tcase_add_test(tc, layouts_and_alpha);
    tcase_add_test(tc, causal_matches_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(causal_suite()); }
