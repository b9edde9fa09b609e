/* Tests of the multi-tensor ops (core/backend.h: multi_sum_squares, clip_coefficients,
 * multi_scale, multi_apollo_update, multi_adam_update over a core/tensor_table.h), of the named
 * tensor table, and of the clipping and optimizer update built on them (optim/clip.c,
 * optim/optimizer.c):
 *  - every multi op equals the loop over the tensors of the same op on each tensor alone BIT FOR
 *    BIT (Σx²: the fixed order of core/reduce_order.h computed on the host; the updates: a table
 *    of that one tensor), for many tensors, odd sizes, one- and many-block tensors, a 0-element
 *    tensor, gaps in the layout, per-tensor step counts, with 1 and 2 threads;
 *  - a named table's names, views, extent and its errors;
 *  - an update (scale + clip + optimizer step) allocates nothing and reads back from the device
 *    once, and equals the same three stages run one by one, bit for bit; a non-finite gradient
 *    leaves parameters, state and step counts unchanged;
 *  - --clip-mode each vs total: per-tensor vs global norm and coefficients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/tensor_table.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "tests/backend_harness.h"
#include "tests/test_util.h"

/* Sizes: 0, 1, odd, one block (4096) ± 1, several blocks, > OPT_PARALLEL_MIN blocks, and more
 * than multi_apollo_update's chunk of 256 blocks (alone, and spread over several tensors). */
static const int64_t SIZES[] = {7,  0, 1,       4095, 4096, 4097,   12293, 33, 70001, 1000,   16385,
                                64, 3, 1048577, 8191, 511,  300000, 20000, 5,  2,     600000, 9};
#define NT ((int)(sizeof SIZES / sizeof SIZES[0]))
#define GAP 13 /* floats between tensors: the flat layout need not be dense */

typedef struct {
    luna_backend *be;
    int64_t offsets[NT], numels[NT];
    size_t total; /* floats in a flat buffer */
    luna_tensor_table *tt;
} layout;

static size_t flat_total(void) {
    size_t off = 5;
    for (int i = 0; i < NT; i++)
        off += (size_t)SIZES[i] + GAP;
    return off;
}

static void layout_make(layout *l, int threads) {
    ck_assert_int_eq(luna_backend_cpu_create(&l->be, threads), LUNA_OK);
    size_t off = 5;
    for (int i = 0; i < NT; i++) {
        l->offsets[i] = (int64_t)off;
        l->numels[i] = SIZES[i];
        off += (size_t)SIZES[i] + GAP;
    }
    l->total = off;
    LUNA_CHECK_OK(luna_tensor_table_create(&l->tt, l->be, NT, l->offsets, l->numels));
}

static void layout_free(layout *l) {
    luna_tensor_table_free(l->tt);
    luna_backend_free(l->be);
}

/* A flat buffer with per-tensor magnitudes 10^(i mod 5 - 2). */
static float *random_flat(const layout *l, uint64_t seed) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *x = luna_test_random_vector(&rng, l->total, -1.0f, 1.0f);
    for (int i = 0; i < NT; i++)
        for (int64_t j = 0; j < l->numels[i]; j++)
            x[l->offsets[i] + j] *= powf(10.0f, (float)(i % 5 - 2));
    return x;
}

static float *dup(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

#define SAME(a, b, n, what) ck_assert_msg(memcmp(a, b, (n) * sizeof(float)) == 0, "%s differ", what)

START_TEST(test_multi_sum_squares) {
    float ref[NT], got[NT], got1[NT];
    for (int threads = 1; threads <= 2; threads++) {
        layout l;
        layout_make(&l, threads);
        float *x = random_flat(&l, 11);
        for (int i = 0; i < NT; i++)
            ref[i] = lh_sum_squares_reference(x + l.offsets[i], l.numels[i]);
        LUNA_CHECK_OK(l.be->ops->multi_sum_squares(l.be, threads == 1 ? got1 : got, x, l.tt));
        SAME(ref, threads == 1 ? got1 : got, NT, "multi_sum_squares vs the fixed order");
        ck_assert(ref[1] == 0.0f); /* the empty tensor */
        free(x);
        layout_free(&l);
    }
    SAME(got1, got, NT, "multi_sum_squares with 1 and 2 threads");
}
END_TEST

START_TEST(test_multi_scale) {
    layout l;
    layout_make(&l, 2);
    float *x = random_flat(&l, 12), *ref = dup(x, l.total), *ref2 = dup(x, l.total);
    float coef[NT];
    for (int i = 0; i < NT; i++)
        coef[i] = i % 3 == 0 ? 1.0f : 0.37f + 0.01f * (float)i;
    for (int i = 0; i < NT; i++) {
        for (int64_t j = 0; j < l.numels[i]; j++) { /* one fp32 product each */
            ref[l.offsets[i] + j] *= coef[i];
            ref2[l.offsets[i] + j] *= 0.25f;
        }
    }
    float *y = dup(x, l.total);
    LUNA_CHECK_OK(l.be->ops->multi_scale(l.be, y, l.tt, coef, 1.0f));
    SAME(ref, y, l.total, "multi_scale (per-tensor coefficients) vs the products");
    memcpy(y, x, l.total * sizeof *y);
    LUNA_CHECK_OK(l.be->ops->multi_scale(l.be, y, l.tt, NULL, 0.25f));
    SAME(ref2, y, l.total, "multi_scale (one coefficient) vs the products");
    free(x);
    free(y);
    free(ref);
    free(ref2);
    layout_free(&l);
}
END_TEST

/* One update of a tensor alone (theta, g and the state at its offset, n elements): the multi op
 * over a table of that one tensor, its step counter *step advanced by the op. */
static void update_one(luna_backend *be, bool apollo, float *theta, const float *g, float *s0,
                       float *s1, float *s2, int64_t n, int64_t *step, double lr, int rebound,
                       double wd, int wd_type) {
    const int64_t offset = 0;
    luna_tensor_table *one = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create(&one, be, 1, &offset, &n));
    if (apollo)
        LUNA_CHECK_OK(be->ops->multi_apollo_update(be, theta, g, s0, s1, s2, one, step, NULL, lr,
                                                   0.9, 1e-4, 0.01, rebound, wd, wd_type));
    else
        LUNA_CHECK_OK(be->ops->multi_adam_update(be, theta, g, s0, s1, one, step, NULL, lr, 0.9,
                                                 0.98, 1e-8, wd));
    luna_tensor_table_free(one);
}

/* Runs `steps` updates of every tensor, each alone (reference) and all with the multi op, fresh
 * gradients each step, per-tensor step counts that differ; compares everything bitwise. */
static void check_optimizer(bool apollo, int rebound, int wd_type, double wd, int threads,
                            float **final_theta) {
    layout l;
    layout_make(&l, threads);
    const int kinds = apollo ? 3 : 2;
    float *theta = random_flat(&l, 21), *rtheta = dup(theta, l.total);
    float *state[3], *rstate[3];
    for (int k = 0; k < kinds; k++) {
        state[k] = luna_test_zeros(l.total);
        rstate[k] = luna_test_zeros(l.total);
    }
    int64_t steps[NT], rsteps[NT];
    for (int i = 0; i < NT; i++)
        steps[i] = rsteps[i] = i % 3; /* e.g. a tensor added later */
    luna_backend *be = l.be;
    for (int s = 0; s < 4; s++) {
        float *g = random_flat(&l, 100 + (uint64_t)s);
        double lr = 0.01 * (s + 1);
        for (int i = 0; i < NT; i++) {
            const int64_t o = l.offsets[i];
            update_one(be, apollo, rtheta + o, g + o, rstate[0] + o, rstate[1] + o,
                       apollo ? rstate[2] + o : NULL, l.numels[i], &rsteps[i], lr, rebound, wd,
                       wd_type);
        }
        if (apollo)
            LUNA_CHECK_OK(be->ops->multi_apollo_update(be, theta, g, state[0], state[1], state[2],
                                                       l.tt, steps, NULL, lr, 0.9, 1e-4, 0.01,
                                                       rebound, wd, wd_type));
        else
            LUNA_CHECK_OK(be->ops->multi_adam_update(be, theta, g, state[0], state[1], l.tt, steps,
                                                     NULL, lr, 0.9, 0.98, 1e-8, wd));
        free(g);
        SAME(rtheta, theta, l.total, "parameters");
        for (int k = 0; k < kinds; k++)
            SAME(rstate[k], state[k], l.total, "optimizer state");
        ck_assert(memcmp(steps, rsteps, sizeof steps) == 0);
    }
    *final_theta = theta;
    free(rtheta);
    for (int k = 0; k < kinds; k++) {
        free(state[k]);
        free(rstate[k]);
    }
    layout_free(&l);
}

START_TEST(test_multi_apollo_update) {
    for (int rebound = 0; rebound <= 1; rebound++)
        for (int wd_type = 0; wd_type <= 2; wd_type++) {
            float *t1, *t2;
            check_optimizer(true, rebound, wd_type, 1e-3, 1, &t1);
            check_optimizer(true, rebound, wd_type, 1e-3, 2, &t2);
            SAME(t1, t2, flat_total(), "multi update with 1 and 2 threads");
            free(t1);
            free(t2);
        }
}
END_TEST

START_TEST(test_multi_adam_update) {
    float *t1, *t2;
    check_optimizer(false, 0, 0, 0.01, 1, &t1);
    check_optimizer(false, 0, 0, 0.01, 2, &t2);
    SAME(t1, t2, flat_total(), "multi update with 1 and 2 threads");
    free(t1);
    free(t2);
}
END_TEST

START_TEST(test_empty_table) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_tensor_table *tt = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, be, 0, NULL, NULL));
    ck_assert_int_eq(tt->num_blocks, 0);
    float dummy = 3.0f;
    double summary[3];
    LUNA_CHECK_OK(be->ops->multi_sum_squares(be, &dummy, &dummy, tt));
    LUNA_CHECK_OK(be->ops->clip_coefficients(be, NULL, summary, NULL, 0, 1.0, 1, NULL, 0));
    ck_assert(summary[0] == 0.0 && summary[1] == 1.0 && summary[2] == 0.0);
    LUNA_CHECK_OK(be->ops->multi_scale(be, &dummy, tt, NULL, 0.5f));
    ck_assert(dummy == 3.0f);
    luna_tensor_table_free(tt);
    luna_backend_free(be);
}
END_TEST

/* ---- the named table ------------------------------------------------------------------------ */

START_TEST(test_named_table) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_tensor_desc d[3] = {
        {.name = "w", .offset = 4, .numel = 6, .ndim = 2, .shape = {2, 3}},
        {.name = "b", .offset = 10, .numel = 3, .ndim = 0},
        {.name = "e", .offset = 40, .numel = 0, .ndim = 1, .shape = {0}},
    };
    luna_tensor_table *tt = NULL;
    LUNA_CHECK_OK(luna_tensor_table_create_named(&tt, be, 3, d));
    ck_assert_str_eq(luna_tensor_table_name(tt, 0), "w");
    ck_assert_str_eq(luna_tensor_table_name(tt, 3), "");
    ck_assert_int_eq(luna_tensor_table_find(tt, "b"), 1);
    ck_assert_int_eq(luna_tensor_table_find(tt, "x"), -1);
    ck_assert_int_eq(luna_tensor_table_extent(tt), 40);
    ck_assert_int_eq(tt->num_elements, 9);
    float base[64];
    luna_tensor v = luna_tensor_table_view(tt, 0, base);
    ck_assert(v.data == base + 4 && v.ndim == 2 && v.shape[0] == 2 && v.shape[1] == 3);
    v = luna_tensor_table_view(tt, 1, base);
    ck_assert(v.data == base + 10 && v.ndim == 1 && v.shape[0] == 3 && v.dtype == LUNA_F32);
    luna_tensor_table_free(tt);
    /* An unnamed table has no names to find. */
    int64_t offsets[1] = {0}, numels[1] = {5};
    LUNA_CHECK_OK(luna_tensor_table_create(&tt, be, 1, offsets, numels));
    ck_assert_str_eq(luna_tensor_table_name(tt, 0), "");
    ck_assert_int_eq(luna_tensor_table_find(tt, "w"), -1);
    luna_tensor_table_free(tt);
    /* Errors name the tensor; nothing is made. */
    luna_tensor_desc bad[2] = {d[0], d[1]};
    bad[1].name = "w";
    ck_assert_int_eq(luna_tensor_table_create_named(&tt, be, 2, bad), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "two tensors named w"));
    ck_assert_ptr_null(tt);
    bad[1] = d[1];
    bad[0].shape[1] = 4;
    ck_assert_int_eq(luna_tensor_table_create_named(&tt, be, 2, bad), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "w: its shape has 8 elements, not 6"));
    bad[0] = d[0];
    bad[1].name = "";
    ck_assert_int_eq(luna_tensor_table_create_named(&tt, be, 2, bad), LUNA_ERR_INVALID_ARGUMENT);
    luna_backend_free(be);
}
END_TEST

/* ---- the whole update over flat buffers ------------------------------------------------------ */

/* The SIZES tensors in flat buffers with gaps; the table holds all but one (a frozen tensor). */
typedef struct {
    luna_backend *be;
    int64_t offsets[NT], numels[NT];
    size_t num_params;
    float *data, *grad; /* device */
    luna_tensor_table *tt;
} flat_params;

#define FROZEN 4

static flat_params *make_params(luna_backend *be) {
    flat_params *p = calloc(1, sizeof *p);
    p->be = be;
    static char names[NT][8];
    luna_tensor_desc d[NT];
    int n = 0;
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        p->offsets[i] = (int64_t)off;
        p->numels[i] = SIZES[i];
        snprintf(names[i], sizeof names[i], "t%d", i);
        if (i != FROZEN)
            d[n++] = (luna_tensor_desc){
                .name = names[i], .offset = (int64_t)off, .numel = SIZES[i], .ndim = 0};
        off += (size_t)SIZES[i] + GAP;
    }
    LUNA_CHECK_OK(luna_tensor_table_create_named(&p->tt, be, n, d));
    p->num_params = off;
    p->data = luna_mem_alloc(be, off * sizeof(float));
    p->grad = luna_mem_alloc(be, off * sizeof(float));
    LUNA_CHECK_OK(luna_mem_zero(be, p->data, off * sizeof(float)));
    return p;
}

static void free_params(flat_params *p) {
    luna_mem_release(p->be, p->data, p->num_params * sizeof(float));
    luna_mem_release(p->be, p->grad, p->num_params * sizeof(float));
    luna_tensor_table_free(p->tt);
    free(p);
}

static void fill_grads(flat_params *p, uint64_t seed) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *g = luna_test_random_vector(&rng, p->num_params, -1.0f, 1.0f);
    LUNA_CHECK_OK(luna_mem_from_host(p->be, p->grad, g, p->num_params * sizeof(float)));
    free(g);
}

static luna_optimizer *make_optimizer(flat_params *p, bool adam) {
    luna_optimizer_config cfg;
    luna_optimizer_config_defaults(&cfg, adam ? LUNA_OPTIMIZER_ADAM : LUNA_OPTIMIZER_APOLLO);
    cfg.weight_decay = 1e-4;
    cfg.weight_decay_type = LUNA_WEIGHT_DECAY_STABLE;
    luna_optimizer *opt = NULL;
    LUNA_CHECK_OK(luna_optimizer_create(&opt, p->be, &cfg, p->tt, p->data, p->grad));
    return opt;
}

START_TEST(test_update_allocates_nothing_reads_back_once) {
    for (int kind = 0; kind <= 1; kind++) {
        luna_backend *be;
        ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
        flat_params *p = make_params(be);
        luna_optimizer *opt = make_optimizer(p, kind == 1);
        for (int u = 0; u < 3; u++) {
            fill_grads(p, 40 + (uint64_t)u);
            size_t allocs = be->alloc_calls, bytes = be->bytes_in_use, peak = be->peak_bytes;
            size_t reads = be->to_host_calls;
            luna_optimizer_step_args a = {.lr = 0.01,
                                          .grad_scale = u == 1 ? 1.0 : 1.0 / 3.0,
                                          .clip_norm = 1.0,
                                          .clip_mode = u % 2 ? LUNA_CLIP_TOTAL : LUNA_CLIP_EACH};
            luna_optimizer_step_result r;
            LUNA_CHECK_OK(luna_optimizer_step(opt, &a, &r));
            ck_assert_msg(be->alloc_calls == allocs, "update %d: %zu allocations", u,
                          be->alloc_calls - allocs);
            ck_assert(be->bytes_in_use == bytes && be->peak_bytes == peak);
            ck_assert_msg(be->to_host_calls - reads == 1, "update %d: %zu readbacks", u,
                          be->to_host_calls - reads);
            ck_assert(r.finite && r.clipped && r.grad_norm > 1.0);
            ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), u + 1);
        }
        luna_optimizer_free(opt);
        free_params(p);
        luna_backend_free(be);
    }
}
END_TEST

/* One step with the scaling and clipping inside equals the stages run one by one (scale,
 * clip, then an unscaled and unclipped step) bit for bit: parameters, gradients, state, norm. */
START_TEST(test_step_equals_stages) {
    for (int kind = 0; kind <= 1; kind++)
        for (int mode = 0; mode <= 1; mode++) {
            luna_backend *be;
            ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
            flat_params *p = make_params(be), *q = make_params(be);
            luna_optimizer *a = make_optimizer(p, kind == 1), *b = make_optimizer(q, kind == 1);
            const size_t bytes = p->num_params * sizeof(float);
            float *hp = malloc(bytes), *hq = malloc(bytes);
            for (int u = 0; u < 3; u++) {
                fill_grads(p, 60 + (uint64_t)u);
                fill_grads(q, 60 + (uint64_t)u);
                const float scale = 1.0f / 1234.0f;
                const double clip = 2e-3;
                luna_optimizer_step_args args = {.lr = 0.02,
                                                 .grad_scale = 1.0 / 1234.0,
                                                 .clip_norm = clip,
                                                 .clip_mode = (luna_clip_mode)mode};
                luna_optimizer_step_result r;
                LUNA_CHECK_OK(luna_optimizer_step(a, &args, &r));
                LUNA_CHECK_OK(be->ops->multi_scale(be, q->grad, q->tt, NULL, scale));
                double norm;
                bool clipped, finite;
                LUNA_CHECK_OK(luna_clip_gradients(be, q->tt, q->grad, clip, (luna_clip_mode)mode,
                                                  &norm, &clipped, &finite));
                luna_optimizer_step_args plain = {.lr = 0.02, .grad_scale = 1.0};
                luna_optimizer_step_result r2;
                LUNA_CHECK_OK(luna_optimizer_step(b, &plain, &r2));
                ck_assert(r.finite && finite && r.clipped == clipped && clipped);
                ck_assert_msg(r.grad_norm == norm, "norm %.17g vs %.17g", r.grad_norm, norm);
                LUNA_CHECK_OK(luna_mem_to_host(be, hp, p->data, bytes));
                LUNA_CHECK_OK(luna_mem_to_host(be, hq, q->data, bytes));
                SAME(hp, hq, p->num_params, "parameters");
                LUNA_CHECK_OK(luna_mem_to_host(be, hp, p->grad, bytes));
                LUNA_CHECK_OK(luna_mem_to_host(be, hq, q->grad, bytes));
                SAME(hp, hq, p->num_params, "scaled and clipped gradients");
            }
            for (int s = 0; s < luna_optimizer_num_state_tensors(a); s++) {
                luna_tensor va, vb;
                LUNA_CHECK_OK(luna_optimizer_state_tensor(a, s, NULL, &va));
                LUNA_CHECK_OK(luna_optimizer_state_tensor(b, s, NULL, &vb));
                LUNA_CHECK_OK(luna_mem_to_host(be, hp, va.data, luna_tensor_bytes(&va)));
                LUNA_CHECK_OK(luna_mem_to_host(be, hq, vb.data, luna_tensor_bytes(&vb)));
                SAME(hp, hq, (size_t)luna_tensor_numel(&va), "optimizer state");
            }
            free(hp);
            free(hq);
            luna_optimizer_free(a);
            luna_optimizer_free(b);
            free_params(p);
            free_params(q);
            luna_backend_free(be);
        }
}
END_TEST

/* A non-finite gradient or loss sum: the step reports it and changes no parameter, state or step
 * count. */
START_TEST(test_step_non_finite_skips) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    flat_params *p = make_params(be);
    luna_optimizer *opt = make_optimizer(p, false);
    luna_optimizer_step_args args = {.lr = 0.01, .grad_scale = 0.5, .clip_norm = 1.0};
    luna_optimizer_step_result r;
    fill_grads(p, 80);
    LUNA_CHECK_OK(luna_optimizer_step(opt, &args, &r));
    const size_t bytes = p->num_params * sizeof(float);
    float *before = malloc(bytes), *after = malloc(bytes), *state = malloc(bytes);
    LUNA_CHECK_OK(luna_mem_to_host(be, before, p->data, bytes));
    luna_tensor v;
    LUNA_CHECK_OK(luna_optimizer_state_tensor(opt, 2, NULL, &v));
    LUNA_CHECK_OK(luna_mem_to_host(be, state, v.data, luna_tensor_bytes(&v)));
    fill_grads(p, 81);
    const float inf = INFINITY;
    LUNA_CHECK_OK(luna_mem_from_host(be, p->grad + p->offsets[5] + 3, &inf, sizeof inf));
    LUNA_CHECK_OK(luna_optimizer_step(opt, &args, &r));
    ck_assert(!r.finite && !r.clipped && !isfinite(r.grad_norm));
    LUNA_CHECK_OK(luna_mem_to_host(be, after, p->data, bytes));
    SAME(before, after, p->num_params, "parameters after a skipped update");
    LUNA_CHECK_OK(luna_mem_to_host(be, after, v.data, luna_tensor_bytes(&v)));
    SAME(state, after, (size_t)luna_tensor_numel(&v), "state after a skipped update");
    ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), 1);
    /* Finite gradients but a non-finite loss sum (what the trainer's micro-batches added up on
     * the device): skipped the same way, the sums come back with the summary and are zeroed. */
    fill_grads(p, 82);
    double *sums = luna_optimizer_loss_sums(opt);
    const double nan_loss[2] = {NAN, 1.5};
    LUNA_CHECK_OK(luna_mem_from_host(be, sums, nan_loss, sizeof nan_loss));
    LUNA_CHECK_OK(luna_optimizer_step(opt, &args, &r));
    ck_assert(!r.finite && isnan(r.loss_sum) && r.nll_sum == 1.5 && isfinite(r.grad_norm));
    LUNA_CHECK_OK(luna_mem_to_host(be, after, p->data, bytes));
    SAME(before, after, p->num_params, "parameters after a non-finite loss");
    LUNA_CHECK_OK(luna_mem_to_host(be, after, v.data, luna_tensor_bytes(&v)));
    SAME(state, after, (size_t)luna_tensor_numel(&v), "state after a non-finite loss");
    ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), 1);
    const double loss[2] = {3.5, 2.25};
    LUNA_CHECK_OK(luna_mem_from_host(be, sums, loss, sizeof loss));
    fill_grads(p, 83);
    LUNA_CHECK_OK(luna_optimizer_step(opt, &args, &r));
    ck_assert(r.finite && r.loss_sum == 3.5 && r.nll_sum == 2.25);
    ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), 2);
    fill_grads(p, 84);
    LUNA_CHECK_OK(luna_optimizer_step(opt, &args, &r)); /* the sums were zeroed */
    ck_assert(r.finite && r.loss_sum == 0.0 && r.nll_sum == 0.0);
    ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), 3);
    /* Bad arguments: no step. */
    args.grad_scale = 0.0;
    ck_assert_int_eq(luna_optimizer_step(opt, &args, &r), LUNA_ERR_INVALID_ARGUMENT);
    args.grad_scale = 1e300; /* not an fp32 factor */
    ck_assert_int_eq(luna_optimizer_step(opt, &args, &r), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), 3);
    free(before);
    free(after);
    free(state);
    luna_optimizer_free(opt);
    free_params(p);
    luna_backend_free(be);
}
END_TEST

static double host_norm(const float *g, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

START_TEST(test_clip_each_vs_total) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    flat_params *p = make_params(be);
    luna_clipper *clip = NULL;
    LUNA_CHECK_OK(luna_clipper_create(&clip, be, p->tt));
    float *g = malloc(p->num_params * sizeof *g), *out = malloc(p->num_params * sizeof *out);
    const double c = 5.0;
    for (int mode = 0; mode <= 1; mode++) {
        /* Tensor norms spread around c: some tensors are clipped in "each", not all. */
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 77);
        luna_test_fill_uniform(&rng, g, p->num_params, -1.0f, 1.0f);
        double norms[NT], total = 0, maxn = 0;
        for (int i = 0; i < NT; i++) {
            size_t o = (size_t)p->offsets[i], n = (size_t)p->numels[i];
            double n0 = host_norm(g + o, n);
            double want = (i % 4) * 3.0; /* 0, 3, 6, 9 */
            for (size_t j = 0; j < n && n0 > 0; j++)
                g[o + j] = (float)(g[o + j] * want / n0);
            norms[i] = host_norm(g + o, n);
            if (i == FROZEN) continue;
            total += norms[i] * norms[i];
            maxn = fmax(maxn, norms[i]);
        }
        total = sqrt(total);
        LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, g, p->num_params * sizeof(float)));
        double norm;
        bool clipped, finite;
        LUNA_CHECK_OK(
            luna_clipper_apply(clip, p->grad, c, (luna_clip_mode)mode, &norm, &clipped, &finite));
        LUNA_CHECK_OK(luna_mem_to_host(be, out, p->grad, p->num_params * sizeof(float)));
        ck_assert(finite && clipped);
        double want_norm = mode == LUNA_CLIP_EACH ? maxn : total;
        ck_assert_msg(fabs(norm - want_norm) <= 1e-6 * want_norm, "norm %g want %g", norm,
                      want_norm);
        for (int i = 0; i < NT; i++) {
            size_t o = (size_t)p->offsets[i], n = (size_t)p->numels[i];
            double after = host_norm(out + o, n);
            if (i == FROZEN || norms[i] == 0) {
                ck_assert(memcmp(out + o, g + o, n * sizeof(float)) == 0);
                continue;
            }
            double ratio = after / norms[i];
            if (mode == LUNA_CLIP_EACH) {
                /* each: only tensors above c are scaled, each to norm c. */
                if (norms[i] <= c)
                    ck_assert(memcmp(out + o, g + o, n * sizeof(float)) == 0);
                else
                    ck_assert_msg(fabs(after - c) <= 1e-5 * c, "t%d: norm %g after", i, after);
            } else {
                /* total: every tensor scaled by the same c / N. */
                ck_assert_msg(fabs(ratio - c / (total + 1e-6)) <= 1e-5, "t%d: ratio %g", i, ratio);
            }
        }
    }
    free(g);
    free(out);
    luna_clipper_free(clip);
    free_params(p);
    luna_backend_free(be);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("optim_multi");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_multi_sum_squares);
    tcase_add_test(tc, test_multi_scale);
    tcase_add_test(tc, test_multi_apollo_update);
    tcase_add_test(tc, test_multi_adam_update);
    tcase_add_test(tc, test_empty_table);
    tcase_add_test(tc, test_named_table);
    tcase_add_test(tc, test_update_allocates_nothing_reads_back_once);
    tcase_add_test(tc, test_step_equals_stages);
    tcase_add_test(tc, test_step_non_finite_skips);
    tcase_add_test(tc, test_clip_each_vs_total);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
