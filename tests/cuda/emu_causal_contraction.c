/* The CUDA causal contraction (model/kernels/cuda/causal_contraction.cu) under the harness against
 * the CPU backend's op and a float64 evaluation of the definition, on Luna's shapes and odd ones
 * (G groups, n positions around the chunk lengths and up to 1000, p, q incl. 1 and sizes not
 * multiples of 4 or 32): fp32 within the ACCUM tier of both (core/backend.h; the chunked kernels
 * sum in their own order), bf16 within bf16 rounding of the CPU on rounded inputs; the head layout
 * equal to packed rows, and padding after a position not reaching it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

/* |got − want| ≤ tol·(1 + |want|); bf16: want rounded to bf16, tol 1/64 */
static void compare(const float *want, const float *got, size_t n, double tol, int bf16,
                    const char *what, const char *which) {
    for (size_t i = 0; i < n; i++) {
        const float w = bf16 ? from_bf16(to_bf16(want[i])) : want[i];
        const double t = bf16 ? 1.0 / 64 : tol;
        ck_assert_msg(fabs((double)got[i] - w) <= t * (1.0 + fabs((double)w)),
                      "%s %s: element %zu: CUDA %.9g, reference %.9g", what, which, i,
                      (double)got[i], (double)w);
    }
}

/* The definition in float64, O(n²) per group (layout: rows of group g at g·n·ld, ld = p or q):
 *   out_t = alpha/t Σ_{s≤t} (x_t·a_s) b_s;  with g_t = alpha·dout_t/t:
 *   dx_t = Σ_{s≤t} (g_t·b_s) a_s,  da_s = Σ_{t≥s} (g_t·b_s) x_t,  db_s = Σ_{t≥s} (x_t·a_s) g_t. */
static void reference(float *out, float *dx, float *da, float *db, const float *x, const float *a,
                      const float *b, const float *d, int G, int n, int p, int q, float alpha) {
    double *acc = malloc(sizeof(double) * (size_t)(p > q ? p : q));
    for (int g = 0; g < G; g++) {
        const float *X = x + (size_t)g * n * p, *A = a + (size_t)g * n * p;
        const float *B = b + (size_t)g * n * q, *D = d + (size_t)g * n * q;
        for (int t = 0; t < n; t++) { /* out_t and dx_t */
            const double f = (double)alpha / (t + 1);
            for (int j = 0; j < q; j++)
                acc[j] = 0.0;
            double *ax = malloc(sizeof(double) * (size_t)(p + 1));
            for (int k = 0; k < p; k++)
                ax[k] = 0.0;
            for (int s = 0; s <= t; s++) {
                double xa = 0.0, gb = 0.0;
                for (int k = 0; k < p; k++)
                    xa += (double)X[(size_t)t * p + k] * A[(size_t)s * p + k];
                for (int j = 0; j < q; j++)
                    gb += f * D[(size_t)t * q + j] * B[(size_t)s * q + j];
                for (int j = 0; j < q; j++)
                    acc[j] += xa * B[(size_t)s * q + j];
                for (int k = 0; k < p; k++)
                    ax[k] += gb * A[(size_t)s * p + k];
            }
            for (int j = 0; j < q; j++)
                out[((size_t)g * n + t) * q + j] = (float)(f * acc[j]);
            for (int k = 0; k < p; k++)
                dx[((size_t)g * n + t) * p + k] = (float)ax[k];
            free(ax);
        }
        for (int s = 0; s < n; s++) { /* da_s and db_s */
            for (int k = 0; k < p; k++)
                da[((size_t)g * n + s) * p + k] = 0.0f;
            double *sa = calloc((size_t)p + 1, sizeof(double)), *sb = calloc((size_t)q + 1, 8);
            for (int t = s; t < n; t++) {
                const double f = (double)alpha / (t + 1);
                double xa = 0.0, gb = 0.0;
                for (int k = 0; k < p; k++)
                    xa += (double)X[(size_t)t * p + k] * A[(size_t)s * p + k];
                for (int j = 0; j < q; j++)
                    gb += f * D[(size_t)t * q + j] * B[(size_t)s * q + j];
                for (int k = 0; k < p; k++)
                    sa[k] += gb * X[(size_t)t * p + k];
                for (int j = 0; j < q; j++)
                    sb[j] += xa * f * D[(size_t)t * q + j];
            }
            for (int k = 0; k < p; k++)
                da[((size_t)g * n + s) * p + k] = (float)sa[k];
            for (int j = 0; j < q; j++)
                db[((size_t)g * n + s) * q + j] = (float)sb[j];
            free(sa), free(sb);
        }
    }
    free(acc);
}

/* Shapes {G, n, p, q}: single elements, sizes off multiples of 4 and 32, Luna's (d_h, l) both
 * ways with n around the chunk lengths (16, 32) and over 64, p = q = 64 (the 16-position
 * chunks), q over 64 (the scan kernels) and a long sequence (32 chunks). Each shape in fp32 and
 * bf16 (bf16 with p, q ≤ 64: the tensor-core kernels). */
static const int shapes[][4] = {{1, 1, 1, 1},    {3, 5, 7, 2},    {4, 17, 16, 33},  {2, 40, 64, 16},
                                {5, 9, 3, 65},   {2, 31, 64, 32}, {2, 33, 32, 64},  {1, 63, 64, 32},
                                {1, 64, 64, 16}, {1, 65, 64, 64}, {1, 1000, 64, 32}};

START_TEST(causal_contraction_matches_cpu_and_reference) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int k = _i / 2, bf16 = _i % 2;
    const int G = shapes[k][0], n = shapes[k][1], p = shapes[k][2], q = shapes[k][3];
    const float alpha = 0.125f;
    const size_t np = (size_t)G * n * p, nq = (size_t)G * n * q;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 50 + k);
    float *x = luna_test_random_vector(&rng, np, -1.0f, 1.0f);
    float *a = luna_test_random_vector(&rng, np, -1.0f, 1.0f);
    float *b = luna_test_random_vector(&rng, nq, 0.0f, 1.0f);
    float *d = luna_test_random_vector(&rng, nq, -1.0f, 1.0f);
    void *dx_ = up_act(x, np, bf16), *da_ = up_act(a, np, bf16), *db_ = up_act(b, nq, bf16),
         *dd_ = up_act(d, nq, bf16);
    const size_t es = bf16 ? 2 : 4;
    void *dout = dev(NULL, es * nq), *gx = dev(NULL, es * np), *ga = dev(NULL, es * np),
         *gb = dev(NULL, es * nq);
    float *out = malloc(4 * nq), *got = malloc(4 * (np > nq ? np : nq));
    float *cx = malloc(4 * np), *ca = malloc(4 * np), *cb = malloc(4 * nq);
    float *ro = malloc(4 * nq), *rx = malloc(4 * np), *ra = malloc(4 * np), *rb = malloc(4 * nq);
    char what[96];
    snprintf(what, sizeof what, "causal G %d n %d p %d q %d %s", G, n, p, q,
             bf16 ? "bf16" : "fp32");
    reference(ro, rx, ra, rb, x, a, b, d, G, n, p, q, alpha);
    LUNA_CHECK_OK(cpu->ops->causal_contraction_forward(cpu, out, x, a, b, G, n, p, q, alpha, NULL));
    compare(ro, out, nq, 1e-5, 0, what, "CPU out vs float64");
    ck_assert_int_eq(
        luna_cuda_causal_contraction_forward(0, bf16, dout, dx_, da_, db_, G, n, p, q, alpha, NULL),
        cudaSuccess);
    down_act(got, dout, nq, bf16);
    compare(out, got, nq, 1e-5, bf16, what, "out vs CPU");
    compare(ro, got, nq, 1e-5, bf16, what, "out vs float64");
    LUNA_CHECK_OK(cpu->ops->causal_contraction_backward(cpu, cx, ca, cb, d, x, a, b, G, n, p, q,
                                                        alpha, NULL));
    ck_assert_int_eq(luna_cuda_causal_contraction_backward(0, bf16, gx, ga, gb, dd_, dx_, da_, db_,
                                                           G, n, p, q, alpha, NULL),
                     cudaSuccess);
    const float *cpu_grads[3] = {cx, ca, cb}, *ref_grads[3] = {rx, ra, rb};
    void *dev_grads[3] = {gx, ga, gb};
    const size_t counts[3] = {np, np, nq};
    const char *names[3] = {"dx", "da", "db"};
    for (int i = 0; i < 3; i++) {
        char which[32];
        down_act(got, dev_grads[i], counts[i], bf16);
        snprintf(which, sizeof which, "%s vs CPU", names[i]);
        compare(cpu_grads[i], got, counts[i], 1e-5, bf16, what, which);
        snprintf(which, sizeof which, "%s vs float64", names[i]);
        compare(ref_grads[i], got, counts[i], 1e-5, bf16, what, which);
    }
    cudaFree(dx_), cudaFree(da_), cudaFree(db_), cudaFree(dd_), cudaFree(dout);
    cudaFree(gx), cudaFree(ga), cudaFree(gb);
    free(x), free(a), free(b), free(d), free(out), free(got), free(cx), free(ca), free(cb);
    free(ro), free(rx), free(ra), free(rb);
    luna_backend_free(cpu);
}
END_TEST

/* Heads read where a Linear wrote them (luna_causal_layout over [B, n, H·p]) give the packed
 * result, and positions past a sentence's end (padding, here huge values) do not reach the ones
 * before: the first m positions of a length-n run equal a length-m run. fp32 (_i = 0) and bf16
 * (_i = 1: the tensor-core kernels, whose tiles multiply the huge values too before masking). */
START_TEST(causal_contraction_layout_and_padding) {
    const int B = 2, H = 3, n = 70, m = 45, p = 64, q = 32, G = B * H, bf16 = _i;
    const size_t np = (size_t)G * n * p, nq = (size_t)G * n * q;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    float *x = luna_test_random_vector(&rng, np, -1.0f, 1.0f);
    float *a = luna_test_random_vector(&rng, np, -1.0f, 1.0f);
    float *b = luna_test_random_vector(&rng, nq, 0.0f, 1.0f);
    void *X = up_act(x, np, bf16), *A = up_act(a, np, bf16), *Bd = up_act(b, nq, bf16);
    /* heads interleaved: row (bb, t) holds H heads of p (or q) values */
    float *xh = malloc(4 * np), *ah = malloc(4 * np), *bh = malloc(4 * nq);
    for (int g = 0; g < G; g++)
        for (int t = 0; t < n; t++) {
            const int bb = g / H, h = g % H;
            memcpy(xh + ((size_t)(bb * n + t) * H + h) * p, x + ((size_t)g * n + t) * p, 4 * p);
            memcpy(ah + ((size_t)(bb * n + t) * H + h) * p, a + ((size_t)g * n + t) * p, 4 * p);
            memcpy(bh + ((size_t)(bb * n + t) * H + h) * q, b + ((size_t)g * n + t) * q, 4 * q);
        }
    const luna_causal_layout ly = {.H = H,
                                   .p_ld = H * p,
                                   .q_ld = H * q,
                                   .p_outer = (int64_t)n * H * p,
                                   .p_inner = p,
                                   .q_outer = (int64_t)n * H * q,
                                   .q_inner = q};
    void *XH = up_act(xh, np, bf16), *AH = up_act(ah, np, bf16), *BH = up_act(bh, nq, bf16);
    const size_t es = bf16 ? 2 : 4;
    void *o = dev(NULL, es * nq), *oh = dev(NULL, es * nq);
    ck_assert_int_eq(
        luna_cuda_causal_contraction_forward(0, bf16, o, X, A, Bd, G, n, p, q, 1.0f, NULL),
        cudaSuccess);
    ck_assert_int_eq(
        luna_cuda_causal_contraction_forward(0, bf16, oh, XH, AH, BH, G, n, p, q, 1.0f, &ly),
        cudaSuccess);
    float *packed = malloc(4 * nq), *heads = malloc(4 * nq);
    down_act(packed, o, nq, bf16);
    down_act(heads, oh, nq, bf16);
    for (int g = 0; g < G; g++)
        for (int t = 0; t < n; t++) {
            const int bb = g / H, h = g % H;
            ck_assert_msg(memcmp(packed + ((size_t)g * n + t) * q,
                                 heads + ((size_t)(bb * n + t) * H + h) * q, 4 * q) == 0,
                          "group %d position %d: the head layout differs from packed", g, t);
        }
    /* padding: positions m..n of every group set to 1e30 (x, a) and -1e30 (b) */
    for (int g = 0; g < G; g++)
        for (int t = m; t < n; t++) {
            for (int k = 0; k < p; k++)
                x[((size_t)g * n + t) * p + k] = a[((size_t)g * n + t) * p + k] = 1e30f;
            for (int j = 0; j < q; j++)
                b[((size_t)g * n + t) * q + j] = -1e30f;
        }
    cudaFree(X), cudaFree(A), cudaFree(Bd);
    X = up_act(x, np, bf16), A = up_act(a, np, bf16), Bd = up_act(b, nq, bf16);
    ck_assert_int_eq(cudaMemset(o, 0, es * nq), cudaSuccess);
    ck_assert_int_eq(
        luna_cuda_causal_contraction_forward(0, bf16, o, X, A, Bd, G, n, p, q, 1.0f, NULL),
        cudaSuccess);
    down_act(heads, o, nq, bf16);
    for (int g = 0; g < G; g++)
        ck_assert_msg(
            memcmp(packed + (size_t)g * n * q, heads + (size_t)g * n * q, 4 * (size_t)m * q) == 0,
            "group %d: padding after position %d changed the positions before it", g, m);
    cudaFree(X), cudaFree(A), cudaFree(Bd), cudaFree(XH), cudaFree(AH), cudaFree(BH);
    cudaFree(o), cudaFree(oh);
    free(x), free(a), free(b), free(xh), free(ah), free(bh), free(packed), free(heads);
}
END_TEST

static Suite *causal_suite(void) {
    Suite *s = suite_create("cuda_causal_contraction");
    TCase *tc = tcase_create("causal");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, causal_contraction_matches_cpu_and_reference, 0,
                        2 * (int)(sizeof shapes / sizeof shapes[0]));
    tcase_add_loop_test(tc, causal_contraction_layout_and_padding, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(causal_suite()); }
