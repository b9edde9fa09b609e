/* Tests of gradient clipping (optim/clip.c): each/total modes against a naive double computation,
 * clip_norm = 0, tensors outside the table, and the non-finite check (nothing modified). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/tensor_table.h"
#include "optim/clip.h"
#include "tests/test_util.h"

static const struct {
    const char *name;
    int64_t numel;
    bool has_grad;
    float scale;
} SPECS[] = {
    {"t0", 7, true, 1.0f},   {"t1", 5000, true, 0.01f}, {"frozen", 40, false, 100.0f},
    {"t3", 300, true, 0.5f}, {"t4", 1, true, 3.0f},
};
#define NT 5

typedef struct {
    size_t offset, numel;
    bool has_grad;
    const char *name;
} tensor_slot;

/* A flat gradient buffer of the SPECS tensors and the table of those with has_grad. */
typedef struct {
    luna_backend *be;
    tensor_slot tensors[NT];
    size_t num_params;
    float *grad; /* device */
    luna_tensor_table *tt;
} flat_grads;

static flat_grads *make_params(luna_backend *be) {
    flat_grads *p = calloc(1, sizeof *p);
    p->be = be;
    luna_tensor_desc d[NT];
    int n = 0;
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        tensor_slot *t = &p->tensors[i];
        t->name = SPECS[i].name;
        t->numel = (size_t)SPECS[i].numel;
        t->offset = off;
        t->has_grad = SPECS[i].has_grad;
        if (t->has_grad)
            d[n++] = (luna_tensor_desc){
                .name = t->name, .offset = (int64_t)off, .numel = SPECS[i].numel, .ndim = 0};
        off += t->numel;
    }
    LUNA_CHECK_OK(luna_tensor_table_create_named(&p->tt, be, n, d));
    p->num_params = off;
    p->grad = luna_mem_alloc(be, off * sizeof(float));
    ck_assert_ptr_nonnull(p->grad);
    return p;
}

static void free_params(flat_grads *p) {
    luna_mem_release(p->be, p->grad, p->num_params * sizeof(float));
    luna_tensor_table_free(p->tt);
    free(p);
}

static float *random_grads(const flat_grads *p, uint64_t seed) {
    float *g = malloc(p->num_params * sizeof(float));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    for (int i = 0; i < NT; i++)
        luna_test_fill_uniform(&rng, g + p->tensors[i].offset, p->tensors[i].numel, -SPECS[i].scale,
                               SPECS[i].scale);
    return g;
}

static double naive_norm(const float *g, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

static void check_mode(luna_clip_mode mode, double clip_norm) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    flat_grads *p = make_params(be);
    float *g = random_grads(p, 3), *out = malloc(p->num_params * sizeof(float));
    LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, g, p->num_params * sizeof(float)));
    double norm = -1;
    bool clipped = false, finite = false;
    luna_status st =
        luna_clip_gradients(be, p->tt, p->grad, clip_norm, mode, &norm, &clipped, &finite);
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    ck_assert(finite);
    /* Naive: norms per tensor and the expected coefficients. */
    double norms[NT], total = 0, maxn = 0;
    for (int i = 0; i < NT; i++) {
        norms[i] = naive_norm(g + p->tensors[i].offset, p->tensors[i].numel);
        if (!SPECS[i].has_grad) continue;
        total += norms[i] * norms[i];
        maxn = fmax(maxn, norms[i]);
    }
    total = sqrt(total);
    double want_norm = mode == LUNA_CLIP_TOTAL ? total : maxn;
    ck_assert_msg(fabs(norm - want_norm) <= 1e-6 * want_norm, "norm %.9g want %.9g", norm,
                  want_norm);
    LUNA_CHECK_OK(luna_mem_to_host(be, out, p->grad, p->num_params * sizeof(float)));
    bool any = false;
    for (int i = 0; i < NT; i++) {
        const tensor_slot *t = &p->tensors[i];
        double nrm = mode == LUNA_CLIP_TOTAL ? total : norms[i];
        double coef = clip_norm > 0 ? fmin(1.0, clip_norm / (nrm + 1e-6)) : 1.0;
        if (!t->has_grad) coef = 1.0;
        if (coef < 1.0) any = true;
        for (size_t j = 0; j < t->numel; j++) {
            double want = coef * g[t->offset + j];
            ck_assert_msg(fabs(out[t->offset + j] - want) <= 1e-6 * fabs(want) + 1e-30,
                          "%s[%zu] %.9g want %.9g", t->name, j, out[t->offset + j], want);
        }
        if (coef < 1.0 && mode == LUNA_CLIP_EACH) {
            double after = naive_norm(out + t->offset, t->numel);
            ck_assert(after <= clip_norm * (1 + 1e-6));
        }
    }
    ck_assert(clipped == any);
    free(g);
    free(out);
    free_params(p);
    luna_backend_free(be);
}

START_TEST(test_each) {
    check_mode(LUNA_CLIP_EACH, 1.0); /* some tensors above, some below */
    check_mode(LUNA_CLIP_EACH, 1e3); /* nothing clipped */
    check_mode(LUNA_CLIP_EACH, 0.0); /* no clipping, norms still computed */
}
END_TEST

START_TEST(test_total) {
    check_mode(LUNA_CLIP_TOTAL, 1.0);
    check_mode(LUNA_CLIP_TOTAL, 1e3);
    check_mode(LUNA_CLIP_TOTAL, 0.0);
}
END_TEST

START_TEST(test_non_finite) {
    const float bad_values[3] = {NAN, INFINITY, -INFINITY};
    for (int mode = 0; mode < 2; mode++)
        for (int b = 0; b < 3; b++) {
            luna_backend *be;
            ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
            flat_grads *p = make_params(be);
            float *g = random_grads(p, 9), *out = malloc(p->num_params * sizeof(float));
            g[p->tensors[3].offset + 17] = bad_values[b];
            LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, g, p->num_params * sizeof(float)));
            double norm = 0;
            bool clipped = true, finite = true;
            ck_assert_int_eq(luna_clip_gradients(be, p->tt, p->grad, 0.1, (luna_clip_mode)mode,
                                                 &norm, &clipped, &finite),
                             LUNA_OK);
            ck_assert(!finite);
            ck_assert(!clipped);
            ck_assert(!isfinite(norm));
            LUNA_CHECK_OK(luna_mem_to_host(be, out, p->grad, p->num_params * sizeof(float)));
            ck_assert_msg(memcmp(out, g, p->num_params * sizeof(float)) == 0,
                          "gradients modified despite a non-finite value");
            free(g);
            free(out);
            free_params(p);
            luna_backend_free(be);
        }
    /* A non-finite value in a tensor without gradient is ignored. */
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    flat_grads *p = make_params(be);
    float *g = random_grads(p, 10);
    g[p->tensors[2].offset] = NAN;
    LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, g, p->num_params * sizeof(float)));
    bool finite = false;
    ck_assert_int_eq(
        luna_clip_gradients(be, p->tt, p->grad, 1.0, LUNA_CLIP_EACH, NULL, NULL, &finite), LUNA_OK);
    ck_assert(finite);
    luna_clip_mode m;
    ck_assert_int_eq(luna_clip_mode_parse("total", &m), LUNA_OK);
    ck_assert(m == LUNA_CLIP_TOTAL);
    ck_assert_int_eq(luna_clip_mode_parse("both", &m), LUNA_ERR_INVALID_ARGUMENT);
    free(g);
    free_params(p);
    luna_backend_free(be);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("optim_clip");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_each);
    tcase_add_test(tc, test_total);
    tcase_add_test(tc, test_non_finite);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
