/* The one-kernel bf16 attention of the CUDA backend (model/kernels/cuda/attention.cu) under the CPU
 * execution harness against the CPU backend's attention_forward/backward (the composition of
 * gemm_grid and softmax_dropout) on the bf16-rounded inputs: odd lengths 1 .. 128 (n, m not
 * multiples of 16), dh 8 .. 64 and one not a multiple of 8 (the unvectorised staging), padded
 * rows, masks by sentence (0 keys, −1, past m), causal, p 0 and 0.2, keys and values in one buffer,
 * dQ written over dO. Every output within 2^-6 of the largest |value| of its buffer (bf16
 * products); the dropout masks equal the CPU's element for element; the backward reads the
 * device's own a and a_d, as the model does. Shapes the kernel does not take (fp32, rows over
 * 128) are refused with cudaErrorInvalidValue. Run in three thread orders by CTest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

typedef struct {
    int B, H, n, m, dh, pad;
    int masked, causal, tied, dq_over_do;
    float p;
} att_case;

static luna_rng_key key(int salt) {
    luna_rng_key k = {.seed = 17, .step = 2, .stream_id = 0x700000u + (uint32_t)salt};
    return k;
}

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
                                  .causal = c->causal != 0,
                                  .ldq = ld,
                                  .ldk = ld,
                                  .ldv = ld,
                                  .ldo = ld,
                                  .sq = sn,
                                  .sk = sm,
                                  .sv = sm,
                                  .so = sn};
}

/* A device bf16 buffer back as fp32 (malloc'd). */
static float *fetch(const void *d, size_t n) {
    float *h = malloc(4 * n);
    down_act(h, d, n, 1);
    return h;
}

/* Every element of `mask` (NULL: all) within 2^-6 of the buffer's largest |want|. */
static void within(const float *want, const void *d, size_t n, const char *mask, const char *what,
                   const char *buf) {
    float *got = fetch(d, n);
    double mx = 1e-20;
    for (size_t i = 0; i < n; i++)
        if (!mask || mask[i]) mx = fmax(mx, fabs(want[i]));
    for (size_t i = 0; i < n; i++)
        if (!mask || mask[i])
            ck_assert_msg(fabs(got[i] - want[i]) <= mx / 64,
                          "%s: %s[%zu]: CUDA %.6g, CPU %.6g (max %.3g)", what, buf, i,
                          (double)got[i], (double)want[i], mx);
    free(got);
}

static void run_case(luna_backend *cpu, const att_case *c, int salt) {
    const int ld = c->H * c->dh + c->pad;
    const size_t nq = (size_t)c->B * c->n * ld, nk = (size_t)c->B * c->m * ld;
    const size_t na = (size_t)c->B * c->H * c->n * c->m;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(salt * 7919 + c->n));
    float *q = luna_test_random_vector(&rng, nq, -2, 2),
          *k = luna_test_random_vector(&rng, nk, -2, 2);
    float *v = luna_test_random_vector(&rng, nk, -1, 1),
          *d_o = luna_test_random_vector(&rng, nq, -1, 1);
    int32_t valid[4];
    for (int b = 0; b < c->B; b++)
        valid[b] = b == 1 ? 0 : (b == 2 ? -1 : (b * 13 + c->m * 2 / 3 + 1) % (c->m + 3));
    void *dq_ = up_act(q, nq, 1), *dk_ = up_act(k, nk, 1), *dv_ = c->tied ? dk_ : up_act(v, nk, 1),
         *ddo = up_act(d_o, nq, 1);
    if (c->tied) memcpy(v, k, 4 * nk);
    int32_t *dvalid = dev(valid, sizeof valid);
    const luna_attention_shape sc = shape_of(c, c->masked ? valid : NULL),
                               sg = shape_of(c, c->masked ? dvalid : NULL);
    char what[160];
    snprintf(what, sizeof what, "attention B %d H %d n %d m %d dh %d pad %d p %g%s%s%s%s", c->B,
             c->H, c->n, c->m, c->dh, c->pad, (double)c->p, c->masked ? " masked" : "",
             c->causal ? " causal" : "", c->tied ? " tied" : "", c->dq_over_do ? " dq=dO" : "");
    ck_assert_msg(luna_cuda_attention_fits(1, c->n, c->m, c->dh, 0) &&
                      luna_cuda_attention_fits(1, c->n, c->m, c->dh, 1),
                  "%s: not taken", what);
    /* forward */
    float *o = calloc(nq, 4), *a = malloc(4 * na), *ad = malloc(4 * na);
    LUNA_CHECK_OK(cpu->ops->attention_forward(cpu, o, a, c->p > 0 ? ad : NULL, q, k, v, &sc, c->p,
                                              key(salt)));
    void *go = dev(NULL, 2 * nq), *ga = dev(NULL, 2 * na), *gad = dev(NULL, 2 * na);
    ck_assert_int_eq(luna_cuda_attention_forward(0, go, ga, c->p > 0 ? gad : NULL, dq_, dk_, dv_,
                                                 &sg, c->p, key(salt)),
                     cudaSuccess);
    char *heads_q = malloc(nq), *heads_k = malloc(nk); /* the heads' columns, not the padding */
    for (size_t i = 0; i < nq; i++)
        heads_q[i] = (int)(i % (size_t)ld) < c->H * c->dh;
    for (size_t i = 0; i < nk; i++)
        heads_k[i] = (int)(i % (size_t)ld) < c->H * c->dh;
    within(o, go, nq, heads_q, what, "o");
    within(a, ga, na, NULL, what, "a");
    if (c->p > 0) {
        within(ad, gad, na, NULL, what, "a_d");
        float *g = fetch(gad, na), *ga_h = fetch(ga, na);
        for (size_t i = 0; i < na; i++) /* dropped where the CPU dropped, and only there */
            ck_assert_msg((g[i] == 0.0f) == (ad[i] == 0.0f) || ga_h[i] == 0.0f,
                          "%s: a_d[%zu]: CUDA %g, CPU %g (a %g)", what, i, (double)g[i],
                          (double)ad[i], (double)ga_h[i]);
        free(g), free(ga_h);
    }
    /* backward from the device's a and a_d (the CPU's from the same values) */
    float *a_k = fetch(ga, na), *ad_k = c->p > 0 ? fetch(gad, na) : NULL;
    float *dq = malloc(4 * nq), *dk = calloc(nk, 4), *dv = c->tied ? dk : calloc(nk, 4),
          *ds = malloc(4 * na), *do_copy = malloc(4 * nq);
    memcpy(do_copy, d_o, 4 * nq);
    LUNA_CHECK_OK(cpu->ops->attention_backward(cpu, c->dq_over_do ? do_copy : dq, dk, dv, ds,
                                               do_copy, q, k, v, a_k, ad_k, &sc, c->p, key(salt)));
    if (c->dq_over_do) memcpy(dq, do_copy, 4 * nq);
    void *gdq = c->dq_over_do ? ddo : dev(NULL, 2 * nq), *gdk = dev(NULL, 2 * nk),
         *gdv = c->tied ? gdk : dev(NULL, 2 * nk);
    ck_assert_int_eq(luna_cuda_attention_backward(0, gdq, gdk, gdv, ddo, dq_, dk_, dv_, ga,
                                                  c->p > 0 ? gad : NULL, &sg, c->p, key(salt)),
                     cudaSuccess);
    within(dq, gdq, nq, heads_q, what, "dq");
    within(dk, gdk, nk, heads_k, what, c->tied ? "dk + dv" : "dk");
    if (!c->tied) within(dv, gdv, nk, heads_k, what, "dv");
    void *devs[] = {dq_,
                    dk_,
                    c->tied ? NULL : dv_,
                    ddo,
                    dvalid,
                    go,
                    ga,
                    gad,
                    c->dq_over_do ? NULL : gdq,
                    gdk,
                    c->tied ? NULL : gdv};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++)
        if (devs[i]) cudaFree(devs[i]);
    void *hosts[] = {q,       k,       v,   d_o,  o,  a,  ad,
                     heads_q, heads_k, a_k, ad_k, dq, dk, c->tied ? NULL : dv,
                     ds,      do_copy};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++)
        free(hosts[i]);
}

static const att_case cases[] = {
    {1, 1, 1, 1, 8, 0, 0, 0, 0, 0, 0.0f},     {3, 2, 5, 7, 16, 8, 1, 0, 0, 0, 0.2f},
    {2, 2, 32, 32, 64, 0, 1, 1, 0, 1, 0.2f},  {2, 2, 33, 17, 24, 0, 1, 0, 1, 0, 0.0f},
    {1, 3, 20, 45, 12, 3, 0, 0, 1, 1, 0.2f},  {1, 1, 128, 128, 64, 0, 0, 1, 0, 0, 0.2f},
    {2, 1, 100, 32, 32, 0, 1, 0, 1, 1, 0.2f},
};

START_TEST(attention_kernels_match_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    run_case(cpu, &cases[_i], _i);
    luna_backend_free(cpu);
}
END_TEST

START_TEST(shapes_outside_the_kernel_are_refused) {
    ck_assert(!luna_cuda_attention_fits(0, 32, 32, 64, 0)); /* fp32 keeps the composition */
    ck_assert(!luna_cuda_attention_fits(1, 129, 32, 64, 0));
    ck_assert(!luna_cuda_attention_fits(1, 32, 129, 64, 1));
    ck_assert(!luna_cuda_attention_fits(1, 32, 32, 130, 0));
    ck_assert(luna_cuda_attention_fits(1, 128, 128, 128, 0));
    const att_case c = {1, 1, 129, 4, 8, 0, 0, 0, 0, 0, 0.0f};
    const luna_attention_shape s = shape_of(&c, NULL);
    void *buf = dev(NULL, 1 << 16);
    ck_assert_int_eq(
        luna_cuda_attention_forward(0, buf, buf, NULL, buf, buf, buf, &s, 0.0f, key(0)),
        cudaErrorInvalidValue);
    cudaFree(buf);
}
END_TEST

static Suite *attention_suite(void) {
    Suite *s = suite_create("cuda_attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, attention_kernels_match_cpu, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, shapes_outside_the_kernel_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(attention_suite()); }
