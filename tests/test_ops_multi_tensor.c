/* The multi-tensor ops (multi_sum_squares, clip_coefficients, multi_scale, multi_apollo_update,
 * multi_adam_update) on the backend under test (LUNA_TEST_BACKEND) against the CPU reference:
 * tensors of odd sizes, one of 0 elements and one of several blocks, with gaps between them in
 * the flat buffers, per-tensor step counts, every rebound and weight-decay type. Each op's tensor
 * table (core/tensor_table.h) and step counters are built on the backend the op runs on. (That
 * each tensor's result is the op's on that tensor alone, bit for bit, and the update's allocation
 * and readback counts, are tests/test_optim_multi.c.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"
#include "tests/backend_harness.h"

static const int64_t SIZES[] = {7, 0, 1, 13, 4097, 33, 10007, 2};
#define NT ((int)(sizeof SIZES / sizeof SIZES[0]))
#define GAP 3

typedef struct {
    int64_t offsets[NT], numels[NT], steps[NT];
    size_t total;
    int rebound, wd_type;
    double wd, clip_norm;
    int mode;
    float alpha;
    bool per_tensor;
} cmp_args;

static void make_layout(cmp_args *a) {
    memset(a, 0, sizeof *a);
    size_t off = 2;
    for (int i = 0; i < NT; i++) {
        a->offsets[i] = (int64_t)off;
        a->numels[i] = SIZES[i];
        a->steps[i] = i % 3;
        off += (size_t)SIZES[i] + GAP;
    }
    a->total = off;
}

static float *vec(uint64_t seed, size_t n, float lo, float hi) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    return luna_test_random_vector(&rng, n, lo, hi);
}

/* The table and the step counters on `be`. */
static luna_tensor_table *table_on(luna_backend *be, const cmp_args *a) {
    luna_tensor_table *tt = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, be, NT, a->offsets, a->numels));
    return tt;
}
static int64_t *steps_on(luna_backend *be, const cmp_args *a) {
    int64_t *d = lh_alloc(be, sizeof a->steps);
    lh_upload(be, d, a->steps, sizeof a->steps);
    return d;
}

/* d[0] x [total], d[1] sums [NT]. */
static luna_status run_sum_squares(luna_backend *be, void *const *d, const void *args) {
    luna_tensor_table *tt = table_on(be, args);
    luna_status st = be->ops->multi_sum_squares(be, d[1], d[0], tt);
    luna_tensor_table_free(tt);
    return st;
}

/* d[0] x [total], d[1] coef [NT]. */
static luna_status run_scale(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    luna_tensor_table *tt = table_on(be, a);
    luna_status st = be->ops->multi_scale(be, d[0], tt, a->per_tensor ? d[1] : NULL, a->alpha);
    luna_tensor_table_free(tt);
    return st;
}

/* d[0] sumsq [NT], d[1] coef [NT], d[2] summary as fp32 [3] (norm, finite, clipped). */
static luna_status run_clip_coefficients(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    double *summary = lh_alloc(be, 3 * sizeof(double)), host[3];
    luna_status st =
        be->ops->clip_coefficients(be, d[1], summary, d[0], NT, a->clip_norm, a->mode, NULL, 0);
    if (st == LUNA_OK) {
        lh_download(be, host, summary, sizeof host);
        float f[3] = {(float)host[0], (float)host[1], (float)host[2]};
        lh_upload(be, d[2], f, sizeof f);
    }
    lh_free(be, summary);
    return st;
}

/* d[0] theta, d[1] g, d[2] exp_avg, d[3] approx_hessian / exp_avg_sq, d[4] update. */
static luna_status run_apollo(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    luna_tensor_table *tt = table_on(be, a);
    int64_t *steps = steps_on(be, a);
    luna_status st =
        be->ops->multi_apollo_update(be, d[0], d[1], d[2], d[3], d[4], tt, steps, NULL, 0.01, 0.9,
                                     1e-4, 0.01, a->rebound, a->wd, a->wd_type);
    int64_t after[NT];
    lh_download(be, after, steps, sizeof after);
    for (int i = 0; i < NT && st == LUNA_OK; i++)
        ck_assert(after[i] == a->steps[i] + 1);
    lh_free(be, steps);
    luna_tensor_table_free(tt);
    return st;
}
static luna_status run_adam(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    luna_tensor_table *tt = table_on(be, a);
    int64_t *steps = steps_on(be, a);
    luna_status st = be->ops->multi_adam_update(be, d[0], d[1], d[2], d[3], tt, steps, NULL, 1e-3,
                                                0.9, 0.98, 1e-8, a->wd);
    lh_free(be, steps);
    luna_tensor_table_free(tt);
    return st;
}

START_TEST(clip_ops_match_reference_backend) {
    cmp_args a;
    make_layout(&a);
    float *x = vec(1, a.total, -2, 2), *coef = vec(2, NT, 0.1f, 0.9f);
    coef[3] = 1.0f;
    float sums[NT];
    lh_buf sq[] = {{x, a.total, LH_F32, LH_IN}, {NULL, NT, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("multi_sum_squares", "8 tensors", 2, run_sum_squares, &a, sq, 2),
                     LUNA_OK);
    for (int per = 0; per <= 1; per++) {
        a.per_tensor = per;
        a.alpha = 0.3f;
        lh_buf sc[] = {{x, a.total, LH_F32, LH_OUT}, {coef, NT, LH_F32, LH_IN}};
        ck_assert_int_eq(lh_compare("multi_scale", per ? "per tensor" : "one coefficient", 2,
                                    run_scale, &a, sc, 2),
                         LUNA_OK);
    }
    /* Σx² of the tensors (0 for the empty one), then every mode, clip_norm 0, a non-finite one. */
    for (int i = 0; i < NT; i++) {
        double s = 0;
        for (int64_t j = 0; j < a.numels[i]; j++)
            s += (double)x[a.offsets[i] + j] * x[a.offsets[i] + j];
        sums[i] = (float)s;
    }
    const double clip_norms[] = {0.0, 1.0, 30.0, 1e9};
    for (int nonfinite = 0; nonfinite <= 1; nonfinite++) {
        if (nonfinite) sums[5] = INFINITY;
        for (int mode = 0; mode <= 1; mode++)
            for (size_t c = 0; c < sizeof clip_norms / sizeof clip_norms[0]; c++) {
                a.mode = mode;
                a.clip_norm = clip_norms[c];
                char what[64];
                snprintf(what, sizeof what, "mode %d clip_norm %g%s", mode, a.clip_norm,
                         nonfinite ? " non-finite" : "");
                lh_buf cc[] = {{sums, NT, LH_F32, LH_IN},
                               {NULL, NT, LH_F32, LH_OUT},
                               {NULL, 3, LH_F32, LH_OUT}};
                ck_assert_int_eq(
                    lh_compare("clip_coefficients", what, 2, run_clip_coefficients, &a, cc, 3),
                    LUNA_OK);
            }
    }
    free(x);
    free(coef);
}
END_TEST

START_TEST(optimizer_ops_match_reference_backend) {
    cmp_args a;
    make_layout(&a);
    size_t n = a.total;
    float *th = vec(10, n, -1, 1), *g = vec(20, n, -1, 1), *m = vec(30, n, -0.1f, 0.1f);
    float *h = vec(40, n, 0, 0.5f), *u = vec(50, n, -0.1f, 0.1f);
    lh_buf bufs[] = {{th, n, LH_F32, LH_OUT},
                     {g, n, LH_F32, LH_IN},
                     {m, n, LH_F32, LH_OUT},
                     {h, n, LH_F32, LH_OUT},
                     {u, n, LH_F32, LH_OUT}};
    char what[64];
    for (int rebound = 0; rebound < 2; rebound++)
        for (int wd_type = 0; wd_type < 3; wd_type++) {
            a.rebound = rebound;
            a.wd_type = wd_type;
            a.wd = 1e-4;
            snprintf(what, sizeof what, "rebound %d wd_type %d", rebound, wd_type);
            ck_assert_int_eq(lh_compare("multi_apollo_update", what, 2, run_apollo, &a, bufs, 5),
                             LUNA_OK);
        }
    a.wd = 0.01;
    ck_assert_int_eq(lh_compare("multi_adam_update", "8 tensors", 2, run_adam, &a, bufs, 4),
                     LUNA_OK);
    free(th);
    free(g);
    free(m);
    free(h);
    free(u);
}
END_TEST

/* One update on `be` with the given gate (NULL, or a device double holding *gate_value); the
 * five buffers and the step counters come back in out[0..4] and steps_out. */
static void gated_update(luna_backend *be, bool apollo, int wd_type, const double *gate_value,
                         float *const *in, float **out, int64_t *steps_out, const cmp_args *a) {
    luna_tensor_table *tt = table_on(be, a);
    int64_t *steps = steps_on(be, a);
    float *d[5];
    for (int k = 0; k < 5; k++)
        d[k] = lh_f32(be, in[k], a->total);
    double *gate = NULL;
    if (gate_value) {
        gate = lh_alloc(be, sizeof(double));
        lh_upload(be, gate, gate_value, sizeof(double));
    }
    if (apollo)
        LUNA_CHECK_OK(be->ops->multi_apollo_update(be, d[0], d[1], d[2], d[3], d[4], tt, steps,
                                                   gate, 0.01, 0.9, 1e-4, 0.01, 0, 1e-4, wd_type));
    else
        LUNA_CHECK_OK(be->ops->multi_adam_update(be, d[0], d[1], d[2], d[3], tt, steps, gate, 1e-3,
                                                 0.9, 0.98, 1e-8, 0.01));
    for (int k = 0; k < 5; k++) {
        out[k] = lh_fetch_f32(be, d[k], a->total);
        lh_free(be, d[k]);
    }
    lh_download(be, steps_out, steps, NT * sizeof(int64_t));
    lh_free(be, gate);
    lh_free(be, steps);
    luna_tensor_table_free(tt);
}

/* The update's gate (core/backend.h): 0 leaves parameters, state and step counters as they were
 * (bit for bit); 1 is the ungated update, bit for bit on the same backend. */
START_TEST(updates_follow_their_gate) {
    luna_backend *be = lh_backend(2);
    cmp_args a;
    make_layout(&a);
    size_t n = a.total;
    float *in[5] = {vec(11, n, -1, 1), vec(21, n, -1, 1), vec(31, n, -0.1f, 0.1f),
                    vec(41, n, 0, 0.5f), vec(51, n, -0.1f, 0.1f)};
    const double closed = 0.0, open = 1.0;
    for (int kind = 0; kind < 4; kind++) {
        const bool apollo = kind < 3;
        const int wd_type = apollo ? kind : 0;
        float *shut[5], *plain[5], *gated[5];
        int64_t s_shut[NT], s_plain[NT], s_gated[NT];
        gated_update(be, apollo, wd_type, &closed, in, shut, s_shut, &a);
        gated_update(be, apollo, wd_type, NULL, in, plain, s_plain, &a);
        gated_update(be, apollo, wd_type, &open, in, gated, s_gated, &a);
        for (int k = 0; k < 5; k++) {
            ck_assert_msg(memcmp(shut[k], in[k], n * sizeof(float)) == 0,
                          "kind %d: buffer %d changed with the gate closed", kind, k);
            ck_assert_msg(memcmp(gated[k], plain[k], n * sizeof(float)) == 0,
                          "kind %d: buffer %d differs with the gate open", kind, k);
            /* the update changes θ and the state: the closed gate's equality is not vacuous */
            if (k != 1 && (apollo || k < 4))
                ck_assert_msg(memcmp(plain[k], in[k], n * sizeof(float)) != 0,
                              "kind %d: buffer %d unchanged by the update", kind, k);
            free(shut[k]), free(plain[k]), free(gated[k]);
        }
        for (int i = 0; i < NT; i++) {
            ck_assert_int_eq(s_shut[i], a.steps[i]);
            ck_assert_int_eq(s_plain[i], a.steps[i] + 1);
            ck_assert_int_eq(s_gated[i], a.steps[i] + 1);
        }
    }
    for (int k = 0; k < 5; k++)
        free(in[k]);
    luna_backend_free(be);
}
END_TEST

static Suite *multi_tensor_suite(void) {
    Suite *s = suite_create("ops_multi_tensor");
    TCase *tc = tcase_create("multi_tensor");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, clip_ops_match_reference_backend);
    tcase_add_test(tc, optimizer_ops_match_reference_backend);
    tcase_add_test(tc, updates_follow_their_gate);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(multi_tensor_suite()); }
