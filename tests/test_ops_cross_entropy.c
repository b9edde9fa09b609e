/* Tests of the label-smoothed cross entropy (model/kernels/cpu/cross_entropy.c, spec §8):
 * forward against a naive double implementation (ε = 0 and 0.1, pad rows ignored, huge logits),
 * finite-difference gradients of grad_scale · Σ loss (the gradient of
 * cross_entropy_forward_backward: lh_cross_entropy_backward), exact zeros on pad rows, in-place
 * gradient (dlogits == logits), thread-count independence and argument errors; that the fused
 * op's losses are the forward's; loss_sums (an update's losses added up on the device); and
 * the ops on the backend under test (LUNA_TEST_BACKEND) against the CPU reference. Ops get device
 * buffers from the harness (tests/backend_harness.h): a case's host arrays are uploaded for each
 * call and the outputs read back. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

#define PAD 1

typedef struct {
    luna_backend *be;
    int64_t N;
    int V;
    float eps, grad_scale;
    float *logits, *loss, *nll, *lse;
    int32_t *targets;
} ce_case;

/* N rows, every third row (from row 1) a pad row unless V <= PAD; row 2 shifted by `offset`
 * (huge logits exercise the max subtraction). Targets include 0 and V−1. */
static ce_case make_case(luna_backend *be, int64_t N, int V, float eps, float offset,
                         uint64_t seed) {
    ce_case c = {be, N, V, eps, 0.37f, NULL, NULL, NULL, NULL, NULL};
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    c.logits = malloc((size_t)(N * V) * sizeof(float));
    c.loss = calloc((size_t)N, sizeof(float));
    c.nll = calloc((size_t)N, sizeof(float));
    c.lse = calloc((size_t)N, sizeof(float));
    c.targets = malloc((size_t)N * sizeof(int32_t));
    luna_test_fill_uniform(&rng, c.logits, (size_t)(N * V), -4.0f, 4.0f);
    for (int64_t r = 0; r < N; r++) {
        int32_t y = (int32_t)(luna_test_uniform(&rng, 0.0f, (float)V - 0.001f));
        if (r == 0) y = V - 1;
        if (r == 3) y = 0;
        if (V > PAD && r % 3 == 1) y = PAD;
        if (V > PAD && y == PAD && r % 3 != 1) y = 0;
        c.targets[r] = y;
        if (r == 2)
            for (int v = 0; v < V; v++)
                c.logits[r * V + v] += offset;
    }
    return c;
}

static void free_case(ce_case *c) {
    free(c->logits);
    free(c->loss);
    free(c->nll);
    free(c->lse);
    free(c->targets);
}

/* The forward on device copies of the case's logits and targets, with vocabulary size V and
 * padding_idx `pad`; loss, nll and lse read back when it succeeds. */
static luna_status ce_forward(ce_case *c, int V, int pad) {
    luna_backend *be = c->be;
    size_t N = (size_t)c->N;
    float *vz = lh_f32(be, c->logits, (size_t)(c->N * c->V));
    int32_t *vt = lh_i32(be, c->targets, N);
    float *vloss = lh_alloc(be, N * 4), *vnll = lh_alloc(be, N * 4), *vlse = lh_alloc(be, N * 4);
    luna_status st =
        be->ops->cross_entropy_forward(be, vloss, vnll, vlse, vz, vt, c->N, V, c->eps, pad);
    if (st == LUNA_OK) {
        lh_download(be, c->loss, vloss, N * 4);
        lh_download(be, c->nll, vnll, N * 4);
        lh_download(be, c->lse, vlse, N * 4);
    }
    void *all[] = {vz, vt, vloss, vnll, vlse};
    for (int i = 0; i < 5; i++)
        lh_free(be, all[i]);
    return st;
}

/* The gradient from `logits` and the case's targets into dlogits (read back when it succeeds);
 * dlogits == logits runs it in place on the device too. */
static luna_status ce_backward(ce_case *c, float *dlogits, const float *logits) {
    luna_backend *be = c->be;
    size_t n = (size_t)(c->N * c->V);
    float *vz = lh_f32(be, logits, n), *vd = dlogits == logits ? vz : lh_alloc(be, n * 4);
    int32_t *vt = lh_i32(be, c->targets, (size_t)c->N);
    luna_status st =
        lh_cross_entropy_backward(be, vd, vz, vt, c->N, c->V, c->eps, PAD, c->grad_scale);
    if (st == LUNA_OK) lh_download(be, dlogits, vd, n * 4);
    if (vd != vz) lh_free(be, vd);
    lh_free(be, vz);
    lh_free(be, vt);
    return st;
}

static void forward(ce_case *c) {
    luna_status st = ce_forward(c, c->V, PAD);
    ck_assert_msg(st == LUNA_OK, "forward: %s", luna_error_message());
}

static void backward(ce_case *c, float *dlogits, const float *logits) {
    luna_status st = ce_backward(c, dlogits, logits);
    ck_assert_msg(st == LUNA_OK, "backward: %s", luna_error_message());
}

/* Naive double: −log p_v = lse − z_v computed literally. */
static void naive(const ce_case *c, double *loss, double *nll, double *lse) {
    for (int64_t r = 0; r < c->N; r++) {
        loss[r] = nll[r] = lse[r] = 0.0;
        if (c->targets[r] == PAD && c->V > PAD) continue;
        const float *z = c->logits + r * c->V;
        double m = -INFINITY, s = 0.0, smooth = 0.0;
        for (int v = 0; v < c->V; v++)
            m = fmax(m, z[v]);
        for (int v = 0; v < c->V; v++)
            s += exp((double)z[v] - m);
        lse[r] = m + log(s);
        for (int v = 0; v < c->V; v++)
            smooth += lse[r] - z[v];
        nll[r] = lse[r] - z[c->targets[r]];
        loss[r] = (1.0 - c->eps) * nll[r] + (c->eps / c->V) * smooth;
    }
}

START_TEST(forward_matches_naive) {
    luna_backend *be = lh_backend(2);
    const int Vs[] = {1, 2, 37, 1000, 40624};
    const float offsets[] = {0.0f, 1000.0f, -3000.0f};
    double worst = 0.0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++)
        for (int e = 0; e < 2; e++)
            for (int o = 0; o < 3; o++) {
                int64_t N = Vs[vi] > 1000 ? 5 : 9;
                ce_case c = make_case(be, N, Vs[vi], e ? 0.1f : 0.0f, offsets[o],
                                      vi * 10 + (uint64_t)e * 3 + (uint64_t)o);
                double loss[9], nll[9], lse[9];
                naive(&c, loss, nll, lse);
                forward(&c);
                for (int64_t r = 0; r < N; r++) {
                    if (c.targets[r] == PAD && c.V > PAD) { /* pad rows: exactly 0 */
                        ck_assert_float_eq(c.loss[r], 0.0f);
                        ck_assert_float_eq(c.nll[r], 0.0f);
                        continue;
                    }
                    /* loss and nll are differences of lse and logits: their error scales with
                     * |lse| (huge logits), not with the (small) result. */
                    double scale = fmax(1.0, fabs(lse[r]));
                    double errs[3] = {fabs(c.loss[r] - loss[r]) / fmax(fabs(loss[r]), scale * 1e-3),
                                      fabs(c.nll[r] - nll[r]) / fmax(fabs(nll[r]), scale * 1e-3),
                                      fabs(c.lse[r] - lse[r]) / fmax(fabs(lse[r]), 1.0)};
                    for (int k = 0; k < 3; k++) {
                        ck_assert_msg(errs[k] <= 2e-6,
                                      "V=%d eps=%g offset=%g row %lld: %s %.9g vs naive %.12g", c.V,
                                      (double)c.eps, (double)offsets[o], (long long)r,
                                      k == 0   ? "loss"
                                      : k == 1 ? "nll"
                                               : "lse",
                                      (double)(k == 0   ? c.loss[r]
                                               : k == 1 ? c.nll[r]
                                                        : c.lse[r]),
                                      k == 0   ? loss[r]
                                      : k == 1 ? nll[r]
                                               : lse[r]);
                        worst = fmax(worst, errs[k]);
                    }
                }
                free_case(&c);
            }
    printf("cross_entropy forward: worst relative error vs naive double %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

static double ce_loss(void *ctx) {
    ce_case *c = ctx;
    forward(c);
    double s = 0.0;
    for (int64_t r = 0; r < c->N; r++)
        s += c->loss[r];
    return (double)c->grad_scale * s;
}

START_TEST(gradcheck_logits) {
    luna_backend *be = lh_backend(2);
    const int shapes[][2] = {{1, 1}, {1, 2}, {4, 5}, {7, 37}, {3, 64}};
    double worst = 0.0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int e = 0; e < 2; e++) {
            ce_case c = make_case(be, shapes[k][0], shapes[k][1], e ? 0.1f : 0.0f, 0.0f, 40 + k);
            size_t count = (size_t)(c.N * c.V);
            float *grad = malloc(count * sizeof *grad);
            forward(&c);
            backward(&c, grad, c.logits);
            char what[64];
            snprintf(what, sizeof what, "cross_entropy N=%lld V=%d eps=%g", (long long)c.N, c.V,
                     (double)c.eps);
            worst = fmax(worst, luna_test_gradcheck(what, ce_loss, &c, c.logits, count, grad, 1e-2,
                                                    2e-3, 1e-3));
            free(grad);
            free_case(&c);
        }
    printf("cross_entropy gradcheck: worst error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* Pad rows: gradient exactly 0 even when their logits are garbage (NaN); in-place backward
 * (dlogits == logits) equals the out-of-place one bit for bit; 1, 2, 3 threads agree. */
START_TEST(pad_rows_in_place_and_threads) {
    luna_backend *be = lh_backend(1);
    ce_case c = make_case(be, 67, 3001, 0.1f, 0.0f, 9); /* N·V above the threading threshold */
    for (int64_t r = 0; r < c.N; r++)
        if (c.targets[r] == PAD) c.logits[r * c.V + 5] = NAN;
    size_t count = (size_t)(c.N * c.V);
    float *ref = malloc(count * sizeof *ref), *inplace = malloc(count * sizeof *inplace);
    float ref_loss[67];
    for (int threads = 1; threads <= 3; threads++) {
        lh_set_threads(be, threads);
        forward(&c);
        if (threads == 1) {
            memcpy(ref_loss, c.loss, sizeof ref_loss);
            backward(&c, ref, c.logits);
        } else {
            ck_assert_int_eq(memcmp(ref_loss, c.loss, sizeof ref_loss), 0);
        }
        memcpy(inplace, c.logits, count * sizeof *inplace);
        backward(&c, inplace, inplace);
        ck_assert_int_eq(memcmp(ref, inplace, count * sizeof *ref), 0);
    }
    int pads = 0, nonzero = 0;
    for (int64_t r = 0; r < c.N; r++) {
        ck_assert(isfinite(c.loss[r]));
        if (c.targets[r] != PAD) continue;
        pads++;
        for (int v = 0; v < c.V; v++)
            nonzero += ref[r * c.V + v] != 0.0f || signbit(ref[r * c.V + v]);
    }
    ck_assert_int_gt(pads, 0);
    ck_assert_int_eq(nonzero, 0);
    /* Each non-pad row's gradient sums to grad_scale·(1 − (1−ε) − ε) = 0. */
    for (int64_t r = 0; r < c.N; r++) {
        double s = 0.0;
        for (int v = 0; v < c.V; v++)
            s += ref[r * c.V + v];
        ck_assert_msg(fabs(s) < 1e-5, "row %lld gradient sums to %g", (long long)r, s);
    }
    free(ref);
    free(inplace);
    free_case(&c);
    luna_backend_free(be);
}
END_TEST

START_TEST(argument_errors) {
    luna_backend *be = lh_backend(1);
    ce_case c = make_case(be, 3, 10, 0.1f, 0.0f, 1);
    c.targets[0] = 10; /* outside [0, V) */
    ck_assert_int_eq(ce_forward(&c, c.V, PAD), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "outside the vocabulary"));
    c.targets[0] = -2;
    c.grad_scale = 1.0f;
    ck_assert_int_eq(ce_backward(&c, c.logits, c.logits), LUNA_ERR_INVALID_ARGUMENT);
    c.targets[0] = 3;
    ck_assert_int_eq(ce_forward(&c, 0, PAD), LUNA_ERR_INVALID_ARGUMENT);
    /* padding_idx outside the vocabulary (PyTorch's ignore_index = −100 style) is fine. */
    c.targets[1] = -100;
    ck_assert_int_eq(ce_forward(&c, c.V, -100), LUNA_OK);
    ck_assert_float_eq(c.loss[1], 0.0f);
    free_case(&c);
    luna_backend_free(be);
}
END_TEST

/* Targets in [0, V), every third row (from row 1) padding. */
static int32_t *random_targets(luna_test_rng *rng, int N, int V) {
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    for (int r = 0; r < N; r++)
        targets[r] = r % 3 == 1 ? PAD : (int32_t)luna_test_uniform(rng, 0, (float)V - 0.5f);
    return targets;
}

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    int64_t N;
    int V;
    float eps, scale;
} cmp_args;

/* d[0] logits, d[1] targets, d[2] loss, d[3] nll, d[4] lse, d[5] dlogits. */
static luna_status cmp_forward(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    return be->ops->cross_entropy_forward(be, d[2], d[3], d[4], d[0], d[1], a->N, a->V, a->eps,
                                          PAD);
}
static luna_status cmp_fused(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    return be->ops->cross_entropy_forward_backward(be, d[2], d[3], d[4], d[5], d[0], d[1], a->N,
                                                   a->V, a->eps, PAD, a->scale);
}

/* The fused op's loss, nll and lse are the forward's, bit for bit, on the backend under test: pad
 * rows, label smoothing on and off, the gradient in place over the logits and apart. */
START_TEST(forward_backward_losses_are_the_forward) {
    luna_backend *be = lh_backend(2);
    const int shapes[][2] = {{1, 2}, {7, 13}, {37, 129}, {5, 3001}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int variant = 0; variant < 4; variant++) {
            const int N = shapes[k][0], V = shapes[k][1];
            const bool smooth = variant & 1, in_place = variant & 2;
            const float eps = smooth ? 0.1f : 0.0f;
            const size_t n = (size_t)N * V;
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 150 + k);
            float *logits = luna_test_random_vector(&rng, n, -8, 8);
            int32_t *targets = random_targets(&rng, N, V);
            int32_t *vt = lh_i32(be, targets, (size_t)N);
            float *out[2][4], *host[2][3];
            for (int way = 0; way < 2; way++) { /* 0: the forward, 1: fused */
                float *vz = lh_f32(be, logits, n);
                for (int i = 0; i < 3; i++)
                    out[way][i] = lh_alloc(be, (size_t)N * sizeof(float));
                out[way][3] = in_place || way == 0 ? vz : lh_alloc(be, n * sizeof(float));
                if (way == 0)
                    LUNA_CHECK_OK(be->ops->cross_entropy_forward(
                        be, out[0][0], out[0][1], out[0][2], vz, vt, N, V, eps, PAD));
                else
                    LUNA_CHECK_OK(be->ops->cross_entropy_forward_backward(
                        be, out[1][0], out[1][1], out[1][2], out[1][3], vz, vt, N, V, eps, PAD,
                        0.5f));
                for (int i = 0; i < 3; i++) {
                    host[way][i] = lh_fetch_f32(be, out[way][i], (size_t)N);
                    lh_free(be, out[way][i]);
                }
                if (out[way][3] != vz) lh_free(be, out[way][3]);
                lh_free(be, vz);
            }
            for (int i = 0; i < 3; i++) {
                ck_assert_msg(memcmp(host[0][i], host[1][i], (size_t)N * sizeof(float)) == 0,
                              "N %d V %d eps %g in place %d: output %d differs", N, V, (double)eps,
                              in_place, i);
                free(host[0][i]);
                free(host[1][i]);
            }
            lh_free(be, vt);
            free(logits);
            free(targets);
        }
    luna_backend_free(be);
}
END_TEST

START_TEST(cross_entropy_matches_reference_backend) {
    const int shapes[][2] = {{1, 2}, {7, 13}, {37, 129}, {13, 1001}, {9, 1000}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int ls = 0; ls < 2; ls++) {
            int N = shapes[k][0], V = shapes[k][1];
            size_t n = (size_t)N * V;
            luna_test_rng rng;
            luna_test_rng_seed(&rng, 110 + k);
            float *logits = luna_test_random_vector(&rng, n, -8, 8);
            int32_t *targets = random_targets(&rng, N, V);
            cmp_args a = {N, V, ls ? 0.1f : 0.0f, 0.5f};
            char what[48];
            snprintf(what, sizeof what, "N %d V %d eps %g", N, V, (double)a.eps);
            lh_buf fw[] = {{logits, n, LH_F32, LH_IN},
                           {targets, (size_t)N, LH_I32, LH_IN},
                           {NULL, (size_t)N, LH_F32, LH_OUT},
                           {NULL, (size_t)N, LH_F32, LH_OUT},
                           {NULL, (size_t)N, LH_F32, LH_OUT}};
            ck_assert_int_eq(lh_compare("cross_entropy_forward", what, 2, cmp_forward, &a, fw, 5),
                             LUNA_OK);
            lh_buf fb[] = {{logits, n, LH_F32, LH_IN},        {targets, (size_t)N, LH_I32, LH_IN},
                           {NULL, (size_t)N, LH_F32, LH_OUT}, {NULL, (size_t)N, LH_F32, LH_OUT},
                           {NULL, (size_t)N, LH_F32, LH_OUT}, {NULL, n, LH_F32, LH_OUT}};
            ck_assert_int_eq(
                lh_compare("cross_entropy_forward_backward", what, 2, cmp_fused, &a, fb, 6),
                LUNA_OK);
            /* the gradient alone, within its own tier (NORM, as the contract says) without label
             * smoothing. With it, an element is p − ε/V: where p ≈ ε/V the difference cancels
             * and keeps p's error (the GPU's expf and the CPU's differ by up to 2 ulp), which
             * NORM's floor (1e-3·max|dz|) cannot absorb (an H200 gave 1.1e-6 at V = 13);
             * those cases keep the op's ACCUM comparison above. */
            lh_buf gb[] = {{logits, n, LH_F32, LH_IN},       {targets, (size_t)N, LH_I32, LH_IN},
                           {NULL, (size_t)N, LH_F32, LH_IN}, {NULL, (size_t)N, LH_F32, LH_IN},
                           {NULL, (size_t)N, LH_F32, LH_IN}, {NULL, n, LH_F32, LH_OUT}};
            if (a.eps == 0.0f)
                ck_assert_int_eq(lh_compare_tier("cross_entropy_forward_backward", LH_NORM, what, 2,
                                                 cmp_fused, &a, gb, 6),
                                 LUNA_OK);
            free(logits);
            free(targets);
        }
}
END_TEST

/* loss_sums: d[0] loss [n], d[1] nll [n], d[2] the sums after the op, as fp32 [2] (they start
 * at 0.5 and -2: the op adds). */
static luna_status run_loss_sums(luna_backend *be, void *const *d, const void *args) {
    const int64_t n = *(const int64_t *)args;
    double start[2] = {0.5, -2.0}, host[2];
    double *sums = lh_alloc(be, sizeof start);
    lh_upload(be, sums, start, sizeof start);
    luna_status st = be->ops->loss_sums(be, sums, d[0], d[1], n);
    if (st == LUNA_OK) {
        lh_download(be, host, sums, sizeof host);
        float f[2] = {(float)host[0], (float)host[1]};
        lh_upload(be, d[2], f, sizeof f);
    }
    lh_free(be, sums);
    return st;
}

START_TEST(loss_sums_match_reference_backend) {
    const int64_t lengths[] = {1, 7, 255, 256, 257, 4099, 40000};
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        int64_t n = lengths[k];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 300 + k);
        float *loss = luna_test_random_vector(&rng, (size_t)n, 0, 12);
        float *nll = luna_test_random_vector(&rng, (size_t)n, 0, 10);
        char what[32];
        snprintf(what, sizeof what, "n %lld", (long long)n);
        lh_buf b[] = {{loss, (size_t)n, LH_F32, LH_IN},
                      {nll, (size_t)n, LH_F32, LH_IN},
                      {NULL, 2, LH_F32, LH_OUT}};
        ck_assert_int_eq(lh_compare("loss_sums", what, 2, run_loss_sums, &n, b, 3), LUNA_OK);
        free(loss);
        free(nll);
    }
}
END_TEST

/* The op adds each call's sums to what is there; on the CPU the sums are a host loop's to the
 * bit (so luna-train's logged losses did not change when they moved to the device), elsewhere
 * within 1e-12; a NaN or an infinity reaches the sum. */
static double host_sum(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

START_TEST(loss_sums_add_up_in_double) {
    luna_backend *be = lh_backend(2);
    const bool cpu = strcmp(lh_backend_name(), "cpu") == 0;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 77);
    const int64_t n1 = 5003, n2 = 300;
    float *a = luna_test_random_vector(&rng, (size_t)n1, 0, 20);
    float *b = luna_test_random_vector(&rng, (size_t)n2, 0, 20);
    double got[2] = {0.25, 0.0}, want[2] = {0.25, 0.0};
    double *sums = lh_alloc(be, sizeof got);
    lh_upload(be, sums, got, sizeof got);
    float *da = lh_f32(be, a, (size_t)n1), *db = lh_f32(be, b, (size_t)n2);
    /* loss a[0, n2) and nll b; then a and a; then nothing */
    LUNA_CHECK_OK(be->ops->loss_sums(be, sums, da, db, n2));
    LUNA_CHECK_OK(be->ops->loss_sums(be, sums, da, da, n1));
    LUNA_CHECK_OK(be->ops->loss_sums(be, sums, da, da, 0));
    want[0] += host_sum(a, n2);
    want[0] += host_sum(a, n1);
    want[1] += host_sum(b, n2);
    want[1] += host_sum(a, n1);
    lh_download(be, got, sums, sizeof got);
    for (int j = 0; j < 2; j++)
        ck_assert_msg(cpu ? memcmp(&got[j], &want[j], sizeof(double)) == 0
                          : fabs(got[j] - want[j]) <= 1e-12 * fabs(want[j]),
                      "loss_sums[%d] %.17g, host loop %.17g", j, got[j], want[j]);
    float bad[3] = {1.0f, NAN, 2.0f}, inf[3] = {1.0f, INFINITY, 2.0f};
    float *dbad = lh_f32(be, bad, 3), *dinf = lh_f32(be, inf, 3);
    LUNA_CHECK_OK(be->ops->loss_sums(be, sums, dinf, dbad, 3));
    lh_download(be, got, sums, sizeof got);
    ck_assert(isinf(got[0]) && got[0] > 0 && isnan(got[1]));
    ck_assert_int_eq(be->ops->loss_sums(be, sums, NULL, db, 3), LUNA_ERR_INVALID_ARGUMENT);
    luna_error_clear();
    lh_free(be, sums), lh_free(be, da), lh_free(be, db), lh_free(be, dbad), lh_free(be, dinf);
    luna_backend_free(be);
    free(a);
    free(b);
}
END_TEST

static Suite *ce_suite(void) {
    Suite *s = suite_create("ops_cross_entropy");
    TCase *tc = tcase_create("cross_entropy");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, forward_matches_naive);
    tcase_add_test(tc, gradcheck_logits);
    tcase_add_test(tc, pad_rows_in_place_and_threads);
    tcase_add_test(tc, argument_errors);
    tcase_add_test(tc, cross_entropy_matches_reference_backend);
    tcase_add_test(tc, forward_backward_losses_are_the_forward);
    tcase_add_test(tc, loss_sums_match_reference_backend);
    tcase_add_test(tc, loss_sums_add_up_in_double);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(ce_suite()); }
