/* Tests of attention_forward/backward (core/backend.h): the gradients against central finite
 * differences of Σ w·O; the backend under test against a float64
 * host computation of softmax attention written from the op's definition (scores, the mask by
 * sentence and the causal one, the dropout mask of core/philox.h, the products, and the backward
 * by hand: dA_d = dO Vᵀ, dS = a ⊙ (g − Σ a·g), dQ = s·dS K, dK = s·dSᵀ Q, dV = a_dᵀ dO), on odd
 * shapes, operands at leading dimensions wider than their heads, p 0 and 0.2, keys and values in
 * one buffer (dK + dV) and dQ written over dO; then against the CPU reference within the op's
 * tier (tests/backend_harness.h), and bad arguments. The bf16 one-kernel form of the CUDA backend
 * is checked by tests/cuda/emu_attention.c. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/philox.h"
#include "tests/backend_harness.h"

typedef struct {
    int B, H, n, m, dh, pad; /* pad: extra columns of every operand's rows */
    bool masked, causal, tied, dq_over_do;
    float p;
} att_case;

static luna_rng_key key_of(int salt) {
    luna_rng_key k = {.seed = 4321, .step = 5, .stream_id = 0x600000u + (uint32_t)salt};
    return k;
}

/* Heads in rows of H·dh + pad columns. */
static luna_attention_shape shape_of(const att_case *c, const int32_t *valid) {
    const int ld = c->H * c->dh + c->pad;
    const luna_grid_stride sn = {(int64_t)c->n * ld, c->dh}, sm = {(int64_t)c->m * ld, c->dh};
    return (luna_attention_shape){.B = c->B,
                                  .H = c->H,
                                  .n = c->n,
                                  .m = c->m,
                                  .dh = c->dh,
                                  .scale = 1.0f / sqrtf((float)c->dh),
                                  .valid_cols = valid,
                                  .causal = c->causal,
                                  .ldq = ld,
                                  .ldk = ld,
                                  .ldv = ld,
                                  .ldo = ld,
                                  .sq = sn,
                                  .sk = sm,
                                  .sv = sm,
                                  .so = sn};
}

static size_t at(luna_grid_stride st, int ld, int b, int h, int r, int c) {
    return (size_t)(b * st.outer + h * st.inner + (int64_t)r * ld + c);
}

/* The float64 reference: o, a, a_d (forward) and dq, dk, dv (backward, dk + dv when tied). */
static void reference(const att_case *c, const luna_attention_shape *s, const float *q,
                      const float *k, const float *v, const float *d_o, double *o, double *a,
                      double *ad, double *dq, double *dk, double *dv, luna_rng_key key) {
    const int n = c->n, m = c->m, dh = c->dh;
    double *S = malloc(sizeof(double) * (size_t)n * m), *G = malloc(sizeof(double) * (size_t)n * m);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++) {
            const size_t a0 = ((size_t)b * c->H + h) * n * m;
            for (int i = 0; i < n; i++) {
                int lim = s->valid_cols ? s->valid_cols[b] : m;
                if (c->causal && i + 1 < lim) lim = i + 1;
                lim = lim < 0 ? 0 : (lim > m ? m : lim);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < lim; j++) {
                    double acc = 0;
                    for (int e = 0; e < dh; e++)
                        acc += (double)q[at(s->sq, s->ldq, b, h, i, e)] *
                               k[at(s->sk, s->ldk, b, h, j, e)];
                    S[i * m + j] = acc * s->scale;
                    mx = fmax(mx, S[i * m + j]);
                }
                for (int j = 0; j < lim; j++)
                    sum += exp(S[i * m + j] - mx);
                for (int j = 0; j < m; j++) {
                    const size_t idx = a0 + (size_t)i * m + j;
                    a[idx] = j < lim ? exp(S[i * m + j] - mx) / sum : 0.0;
                    const bool keep = luna_rng_dropout_keep(key, idx, c->p);
                    ad[idx] = c->p > 0 ? (keep ? a[idx] / (1.0 - c->p) : 0.0) : a[idx];
                }
            }
            for (int i = 0; i < n; i++)
                for (int e = 0; e < dh; e++) {
                    double acc = 0;
                    for (int j = 0; j < m; j++)
                        acc += ad[a0 + (size_t)i * m + j] * v[at(s->sv, s->ldv, b, h, j, e)];
                    o[at(s->so, s->ldo, b, h, i, e)] = acc;
                }
            /* backward */
            for (int i = 0; i < n; i++) {
                double dot = 0;
                for (int j = 0; j < m; j++) {
                    const size_t idx = a0 + (size_t)i * m + j;
                    double g = 0;
                    for (int e = 0; e < dh; e++)
                        g += (double)d_o[at(s->so, s->ldo, b, h, i, e)] *
                             v[at(s->sv, s->ldv, b, h, j, e)];
                    if (c->p > 0)
                        g *= luna_rng_dropout_keep(key, idx, c->p) ? 1.0 / (1.0 - c->p) : 0.0;
                    G[i * m + j] = g;
                    dot += a[idx] * g;
                }
                for (int j = 0; j < m; j++)
                    G[i * m + j] = a[a0 + (size_t)i * m + j] * (G[i * m + j] - dot);
            }
            for (int i = 0; i < n; i++)
                for (int e = 0; e < dh; e++) {
                    double acc = 0;
                    for (int j = 0; j < m; j++)
                        acc += G[i * m + j] * k[at(s->sk, s->ldk, b, h, j, e)];
                    dq[at(s->sq, s->ldq, b, h, i, e)] = acc * s->scale;
                }
            for (int j = 0; j < m; j++)
                for (int e = 0; e < dh; e++) {
                    double gk = 0, gv = 0;
                    for (int i = 0; i < n; i++) {
                        gk += G[i * m + j] * q[at(s->sq, s->ldq, b, h, i, e)];
                        gv += ad[a0 + (size_t)i * m + j] * d_o[at(s->so, s->ldo, b, h, i, e)];
                    }
                    const size_t x = at(s->sk, s->ldk, b, h, j, e);
                    dk[x] = gk * s->scale + (c->tied ? gv : 0.0);
                    dv[x] = c->tied ? dk[x] : gv;
                }
        }
    free(S);
    free(G);
}

/* got within 1e-5 of the largest |want| (fp32 products and sums of a few hundred terms) on the
 * elements `mask` marks (the operand's heads; the padding columns are not the op's). */
static void expect_near(const float *got, const double *want, const bool *mask, size_t count,
                        const char *what, const char *buf) {
    double mx = 1e-30;
    for (size_t i = 0; i < count; i++)
        if (!mask || mask[i]) mx = fmax(mx, fabs(want[i]));
    for (size_t i = 0; i < count; i++)
        if ((!mask || mask[i]) && !(fabs(got[i] - want[i]) <= 1e-5 * mx))
            ck_abort_msg("%s: %s[%zu] = %.9g, float64 reference %.9g (max %.3g)", what, buf, i,
                         (double)got[i], want[i], mx);
}

static void run_case(const att_case *c, int salt) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(salt * 131 + c->n * 7 + c->m));
    const int ld = c->H * c->dh + c->pad;
    const size_t nq = (size_t)c->B * c->n * ld, nk = (size_t)c->B * c->m * ld;
    const size_t na = (size_t)c->B * c->H * c->n * c->m;
    int32_t valid_h[8];
    for (int b = 0; b < c->B; b++)
        valid_h[b] = b == 1 ? 0 : (b * 5 + 3) % (c->m + 2) - (b == 2); /* 0, −1 and past m too */
    float *qh, *kh, *vh, *doh;
    float *q = lh_random_f32(be, &rng, nq, -1.5f, 1.5f, &qh);
    float *k = lh_random_f32(be, &rng, nk, -1.5f, 1.5f, &kh);
    float *v = c->tied ? k : lh_random_f32(be, &rng, nk, -1, 1, &vh);
    if (c->tied) vh = kh;
    float *d_o = lh_random_f32(be, &rng, nq, -1, 1, &doh);
    int32_t *valid = c->masked ? lh_i32(be, valid_h, (size_t)c->B) : NULL;
    const luna_attention_shape s = shape_of(c, valid);
    const luna_attention_shape sh = shape_of(c, c->masked ? valid_h : NULL);
    float *o = lh_f32(be, NULL, nq), *a = lh_f32(be, NULL, na);
    float *ad = c->p > 0 ? lh_f32(be, NULL, na) : NULL;
    float *dq = c->dq_over_do ? d_o : lh_f32(be, NULL, nq);
    float *dk = lh_f32(be, NULL, nk), *dv = c->tied ? dk : lh_f32(be, NULL, nk);
    float *ds = lh_f32(be, NULL, na);
    const luna_rng_key key = key_of(salt);
    char what[160];
    snprintf(what, sizeof what, "B %d H %d n %d m %d dh %d pad %d p %g%s%s%s%s (%s)", c->B, c->H,
             c->n, c->m, c->dh, c->pad, (double)c->p, c->masked ? " masked" : "",
             c->causal ? " causal" : "", c->tied ? " tied" : "", c->dq_over_do ? " dq=dO" : "",
             lh_backend_name());
    LUNA_CHECK_OK(be->ops->attention_forward(be, o, a, ad, q, k, v, &s, c->p, key));
    LUNA_CHECK_OK(
        be->ops->attention_backward(be, dq, dk, dv, ds, d_o, q, k, v, a, ad, &s, c->p, key));
    double *ro = calloc(nq, sizeof(double)), *ra = calloc(na, sizeof(double)),
           *rad = calloc(na, sizeof(double)), *rdq = calloc(nq, sizeof(double)),
           *rdk = calloc(nk, sizeof(double)), *rdv = calloc(nk, sizeof(double));
    reference(c, &sh, qh, kh, vh, doh, ro, ra, rad, rdq, rdk, rdv, key);
    bool *hq = calloc(nq, 1), *hk = calloc(nk, 1); /* the heads' elements, not the padding */
    for (size_t i = 0; i < nq; i++)
        hq[i] = (int)(i % (size_t)ld) < c->H * c->dh;
    for (size_t i = 0; i < nk; i++)
        hk[i] = (int)(i % (size_t)ld) < c->H * c->dh;
    float *got = lh_fetch_f32(be, o, nq);
    expect_near(got, ro, hq, nq, what, "o");
    free(got);
    got = lh_fetch_f32(be, a, na);
    expect_near(got, ra, NULL, na, what, "a");
    free(got);
    if (ad) {
        got = lh_fetch_f32(be, ad, na);
        expect_near(got, rad, NULL, na, what, "a_d");
        free(got);
    }
    got = lh_fetch_f32(be, dq, nq);
    expect_near(got, rdq, hq, nq, what, "dq");
    free(got);
    got = lh_fetch_f32(be, dk, nk);
    expect_near(got, rdk, hk, nk, what, c->tied ? "dk + dv" : "dk");
    free(got);
    if (!c->tied) {
        got = lh_fetch_f32(be, dv, nk);
        expect_near(got, rdv, hk, nk, what, "dv");
        free(got);
    }
    void *dev[] = {q,
                   c->tied ? NULL : v,
                   c->dq_over_do ? NULL : dq,
                   d_o,
                   valid,
                   o,
                   a,
                   ad,
                   dk,
                   c->tied ? NULL : dv,
                   ds,
                   k};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        lh_free(be, dev[i]);
    void *host[] = {qh, kh, c->tied ? NULL : vh, doh, ro, ra, rad, rdq, rdk, rdv, hq, hk};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    luna_backend_free(be);
}

static const att_case cases[] = {
    {1, 1, 1, 1, 1, 0, false, false, false, false, 0.0f},
    {3, 2, 5, 7, 4, 3, true, false, false, false, 0.2f},
    {2, 3, 9, 9, 8, 0, true, true, false, true, 0.2f},
    {3, 2, 7, 33, 16, 1, true, false, true, true, 0.0f},
    {2, 4, 32, 32, 16, 0, false, false, true, false, 0.2f},
    {1, 2, 65, 65, 5, 2, false, true, false, false, 0.0f},
};

START_TEST(attention_matches_float64_reference) {
    const att_case *c = &cases[_i];
    run_case(c, _i);
}
END_TEST

/* ---- finite differences: L = Σ w·O through the forward, dL/dQ, dK, dV from the backward ---- */
typedef struct {
    luna_backend *be;
    att_case c;
    luna_attention_shape s;
    float *q, *k, *v, *w;         /* host: the inputs the loss reads, the fixed weights */
    float *dq_, *dk_, *dv_, *do_; /* device buffers of the op */
    float *o_, *a_, *ad_;
    size_t nq, nk, na;
} fd_ctx;

static double fd_loss(void *ctx) {
    fd_ctx *f = ctx;
    lh_upload(f->be, f->dq_, f->q, f->nq * 4);
    lh_upload(f->be, f->dk_, f->k, f->nk * 4);
    lh_upload(f->be, f->dv_, f->v, f->nk * 4);
    LUNA_CHECK_OK(f->be->ops->attention_forward(f->be, f->o_, f->a_, f->ad_, f->dq_, f->dk_, f->dv_,
                                                &f->s, f->c.p, key_of(5)));
    float *o = lh_fetch_f32(f->be, f->o_, f->nq);
    const double l = luna_test_weighted_sum(o, f->w, f->nq);
    free(o);
    return l;
}

START_TEST(attention_gradients_match_finite_differences) {
    const att_case c = {2, 2, 5, 6, 4, 1, true, false, false, false, 0.2f};
    luna_backend *be = lh_backend(1);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 55);
    const int ld = c.H * c.dh + c.pad;
    fd_ctx f = {.be = be, .c = c};
    f.nq = (size_t)c.B * c.n * ld, f.nk = (size_t)c.B * c.m * ld;
    f.na = (size_t)c.B * c.H * c.n * c.m;
    const int32_t valid_h[2] = {4, 6};
    int32_t *valid = lh_i32(be, valid_h, 2);
    f.s = shape_of(&c, valid);
    f.q = luna_test_random_vector(&rng, f.nq, -1, 1);
    f.k = luna_test_random_vector(&rng, f.nk, -1, 1);
    f.v = luna_test_random_vector(&rng, f.nk, -1, 1);
    f.w = luna_test_random_vector(&rng, f.nq, -1, 1);
    f.dq_ = lh_f32(be, NULL, f.nq), f.dk_ = lh_f32(be, NULL, f.nk), f.dv_ = lh_f32(be, NULL, f.nk);
    f.do_ = lh_f32(be, f.w, f.nq);
    f.o_ = lh_f32(be, NULL, f.nq), f.a_ = lh_f32(be, NULL, f.na), f.ad_ = lh_f32(be, NULL, f.na);
    fd_loss(&f);
    float *gq = lh_f32(be, NULL, f.nq), *gk = lh_f32(be, NULL, f.nk), *gv = lh_f32(be, NULL, f.nk);
    float *ds = lh_f32(be, NULL, f.na);
    LUNA_CHECK_OK(be->ops->attention_backward(be, gq, gk, gv, ds, f.do_, f.dq_, f.dk_, f.dv_, f.a_,
                                              f.ad_, &f.s, c.p, key_of(5)));
    float *an[3] = {lh_fetch_f32(be, gq, f.nq), lh_fetch_f32(be, gk, f.nk),
                    lh_fetch_f32(be, gv, f.nk)};
    double worst =
        luna_test_gradcheck("attention dQ", fd_loss, &f, f.q, f.nq, an[0], 3e-3, 2e-3, 1e-3);
    worst = fmax(worst, luna_test_gradcheck("attention dK", fd_loss, &f, f.k, f.nk, an[1], 3e-3,
                                            2e-3, 1e-3));
    worst = fmax(worst, luna_test_gradcheck("attention dV", fd_loss, &f, f.v, f.nk, an[2], 3e-3,
                                            2e-3, 1e-3));
    printf("attention gradients against finite differences: worst %.3g\n", worst);
    void *dev[] = {valid, f.dq_, f.dk_, f.dv_, f.do_, f.o_, f.a_, f.ad_, gq, gk, gv, ds};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        lh_free(be, dev[i]);
    void *host[] = {f.q, f.k, f.v, f.w, an[0], an[1], an[2]};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    luna_backend_free(be);
}
END_TEST

/* ---- against the reference backend ---------------------------------------------------------- */
typedef struct {
    att_case c;
    int32_t valid[4];
} cmp_args;

static luna_status cmp_fwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *x = args; /* q k v valid | o a a_d */
    const luna_attention_shape s = shape_of(&x->c, x->c.masked ? v[3] : NULL);
    return be->ops->attention_forward(be, v[4], v[5], x->c.p > 0 ? v[6] : NULL, v[0], v[1],
                                      x->c.tied ? v[1] : v[2], &s, x->c.p, key_of(77));
}
static luna_status cmp_bwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *x = args; /* q k v valid a a_d | dO dq dk dv ds */
    const luna_attention_shape s = shape_of(&x->c, x->c.masked ? v[3] : NULL);
    return be->ops->attention_backward(
        be, x->c.dq_over_do ? v[6] : v[7], v[8], x->c.tied ? v[8] : v[9], v[10], v[6], v[0], v[1],
        x->c.tied ? v[1] : v[2], v[4], x->c.p > 0 ? v[5] : NULL, &s, x->c.p, key_of(77));
}

START_TEST(attention_matches_reference_backend) {
    const att_case *c = &cases[_i];
    cmp_args x = {.c = *c, .valid = {3, 0, 40, 2}};
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(900 + _i));
    const int ld = c->H * c->dh + c->pad;
    const size_t nq = (size_t)c->B * c->n * ld, nk = (size_t)c->B * c->m * ld;
    const size_t na = (size_t)c->B * c->H * c->n * c->m;
    float *q = luna_test_random_vector(&rng, nq, -1, 1),
          *k = luna_test_random_vector(&rng, nk, -1, 1);
    float *v = luna_test_random_vector(&rng, nk, -1, 1),
          *d_o = luna_test_random_vector(&rng, nq, -1, 1);
    float *a = luna_test_random_vector(&rng, na, 0, 1),
          *ad = luna_test_random_vector(&rng, na, 0, 1);
    char what[64];
    snprintf(what, sizeof what, "case %d", _i);
    lh_buf fw[] = {{q, nq, LH_F32, LH_IN},     {k, nk, LH_F32, LH_IN},
                   {v, nk, LH_F32, LH_IN},     {x.valid, 4, LH_I32, LH_IN},
                   {NULL, nq, LH_F32, LH_OUT}, {NULL, na, LH_F32, LH_OUT},
                   {NULL, na, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("attention_forward", what, 2, cmp_fwd, &x, fw, 7), LUNA_OK);
    lh_buf bw[] = {
        {q, nq, LH_F32, LH_IN},      {k, nk, LH_F32, LH_IN},     {v, nk, LH_F32, LH_IN},
        {x.valid, 4, LH_I32, LH_IN}, {a, na, LH_F32, LH_IN},     {ad, na, LH_F32, LH_IN},
        {d_o, nq, LH_F32, LH_OUT},   {NULL, nq, LH_F32, LH_OUT}, {NULL, nk, LH_F32, LH_OUT},
        {NULL, nk, LH_F32, LH_OUT},  {NULL, na, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("attention_backward", what, 2, cmp_bwd, &x, bw, 11), LUNA_OK);
    void *all[] = {q, k, v, d_o, a, ad};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}
END_TEST

START_TEST(bad_arguments_are_refused) {
    luna_backend *be = lh_backend(1);
    float *buf = lh_f32(be, NULL, 64);
    const att_case c = {1, 1, 2, 3, 2, 0, false, false, false, false, 0.0f};
    luna_attention_shape s = shape_of(&c, NULL);
    const luna_rng_key k = key_of(1);
    ck_assert_int_eq(be->ops->attention_forward(be, buf + 32, buf + 48, NULL, buf, buf + 8, buf + 8,
                                                &s, 0.0f, k),
                     LUNA_OK);
    s.causal = true; /* n != m */
    ck_assert_int_ne(be->ops->attention_forward(be, buf + 32, buf + 48, NULL, buf, buf + 8, buf + 8,
                                                &s, 0.0f, k),
                     LUNA_OK);
    s = shape_of(&c, NULL);
    s.ldk = 1; /* below dh */
    ck_assert_int_ne(be->ops->attention_forward(be, buf + 32, buf + 48, NULL, buf, buf + 8, buf + 8,
                                                &s, 0.0f, k),
                     LUNA_OK);
    s = shape_of(&c, NULL);
    ck_assert_int_ne(be->ops->attention_forward(be, buf + 32, buf + 48, NULL, buf, buf + 8, buf + 8,
                                                &s, 0.2f, k),
                     LUNA_OK); /* p > 0 without a_d */
    ck_assert_int_ne(be->ops->attention_backward(be, buf, buf, buf, NULL, buf, buf, buf, buf, buf,
                                                 NULL, &s, 0.0f, k),
                     LUNA_OK); /* no scratch */
    ck_assert_int_ne(be->ops->attention_forward(be, buf + 32, buf + 48, buf + 16, buf, buf + 8,
                                                buf + 8, &s, 1.0f, k),
                     LUNA_OK);
    lh_free(be, buf);
    luna_backend_free(be);
}
END_TEST

static Suite *attention_suite(void) {
    Suite *s = suite_create("ops_attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 120);
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    tcase_add_loop_test(tc, attention_matches_float64_reference, 0, ncases);
    tcase_add_loop_test(tc, attention_matches_reference_backend, 0, ncases);
    tcase_add_test(tc, attention_gradients_match_finite_differences);
    tcase_add_test(tc, bad_arguments_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(attention_suite()); }
