/* Tests of the optimizers (optim/optimizer.c, model/kernels/cpu/optimizer_kernels.c):
 *  - 20 steps of Apollo (constant/belief rebound × L2/decoupled/stable decay) and Adam against the
 *    PyTorch transcription tests/reference/apollo_reference.py (fixtures tests/fixtures/optim,
 *    written by make_optim_fixtures.py): params and every state tensor within 1e-6 relative;
 *  - the first Apollo step is θ −= lr·g/σ;
 *  - bit-identical results with 1 and 2 threads (multi-block tensors);
 *  - tensors outside the optimizer's table are neither updated nor decayed;
 *  - state_to_json / state_from_json roundtrip (resume is bit-exact) and mismatch errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/safetensors.h"
#include "core/tensor_table.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"

#define FIXTURE_DIR LUNA_SOURCE_DIR "/tests/fixtures/optim"
#define STEPS 20

/* ---- hand-made flat buffers and the table of their trainable tensors ------------------------- */

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    bool has_grad;
} tensor_spec;

typedef struct {
    const char *name;
    size_t offset, numel;
} tensor_slot;

typedef struct {
    luna_backend *be;
    int num_tensors;
    tensor_slot *tensors;  /* every tensor, trainable or not */
    size_t num_params;     /* floats in each buffer */
    float *data, *grad;    /* device */
    luna_tensor_table *tt; /* the tensors with has_grad: what the optimizer sees */
} flat_params;

static flat_params *make_params(luna_backend *be, const tensor_spec *specs, int n) {
    flat_params *p = calloc(1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    p->be = be;
    p->num_tensors = n;
    p->tensors = calloc((size_t)n, sizeof *p->tensors);
    luna_tensor_desc *d = calloc((size_t)n, sizeof *d);
    ck_assert(p->tensors && d);
    size_t off = 0;
    int nt = 0;
    for (int i = 0; i < n; i++) {
        tensor_slot *t = &p->tensors[i];
        t->name = specs[i].name;
        t->numel = (size_t)(specs[i].shape[0] * (specs[i].ndim > 1 ? specs[i].shape[1] : 1));
        t->offset = off;
        if (specs[i].has_grad)
            d[nt++] = (luna_tensor_desc){.name = t->name,
                                         .offset = (int64_t)off,
                                         .numel = (int64_t)t->numel,
                                         .ndim = specs[i].ndim,
                                         .shape = {specs[i].shape[0], specs[i].shape[1]}};
        off += (t->numel + 63) & ~(size_t)63; /* gaps, as a real layout may have */
    }
    LUNA_CHECK_OK(luna_tensor_table_create_named(&p->tt, be, nt, d));
    free(d);
    p->num_params = off;
    p->data = luna_mem_alloc(be, off * sizeof(float));
    p->grad = luna_mem_alloc(be, off * sizeof(float));
    ck_assert(p->data && p->grad);
    LUNA_CHECK_OK(luna_mem_zero(be, p->data, off * sizeof(float)));
    LUNA_CHECK_OK(luna_mem_zero(be, p->grad, off * sizeof(float)));
    return p;
}

static void free_params(flat_params *p) {
    luna_mem_release(p->be, p->data, p->num_params * sizeof(float));
    luna_mem_release(p->be, p->grad, p->num_params * sizeof(float));
    luna_tensor_table_free(p->tt);
    free(p->tensors);
    free(p);
}

static luna_backend *make_backend(int threads) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, threads), LUNA_OK);
    return be;
}

static luna_optimizer *make_optimizer(luna_backend *be, const luna_optimizer_config *cfg,
                                      flat_params *p) {
    luna_optimizer *opt = NULL;
    luna_status st = luna_optimizer_create(&opt, be, cfg, p->tt, p->data, p->grad);
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    return opt;
}

/* A plain update: no gradient scaling, no clipping. */
static void step_ok(luna_optimizer *opt, double lr) {
    luna_optimizer_step_args a = {.lr = lr, .grad_scale = 1.0, .clip_norm = 0.0};
    luna_optimizer_step_result r;
    luna_status st = luna_optimizer_step(opt, &a, &r);
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    ck_assert(r.finite && !r.clipped);
}

/* max|a−b| / max|b| (absolute when b is all zero). */
static double rel_error(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - (double)b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

static const luna_st_tensor *fixture_tensor(luna_safetensors *st, const char *name) {
    const luna_st_tensor *t = luna_safetensors_find(st, name);
    ck_assert_msg(t != NULL, "%s: no tensor %s", luna_safetensors_path(st), name);
    return t;
}

/* ---- golden tests against the PyTorch transcription ------------------------------------------ */

static const tensor_spec FIXTURE_SPECS[] = {
    {"a.bias", 1, {7, 0}, true},
    {"b.weight", 2, {5, 3}, true},
    {"c.weight", 2, {33, 17}, true},
    {"d.scale", 1, {1, 0}, true},
};
#define NUM_FIXTURE_TENSORS 4

typedef struct {
    const char *file;
    luna_optimizer_kind kind;
    luna_rebound rebound;
    luna_weight_decay_type wd_type;
} golden_case;

static const golden_case CASES[] = {
    {"apollo_constant_L2", LUNA_OPTIMIZER_APOLLO, LUNA_REBOUND_CONSTANT, LUNA_WEIGHT_DECAY_L2},
    {"apollo_constant_decoupled", LUNA_OPTIMIZER_APOLLO, LUNA_REBOUND_CONSTANT,
     LUNA_WEIGHT_DECAY_DECOUPLED},
    {"apollo_constant_stable", LUNA_OPTIMIZER_APOLLO, LUNA_REBOUND_CONSTANT,
     LUNA_WEIGHT_DECAY_STABLE},
    {"apollo_belief_L2", LUNA_OPTIMIZER_APOLLO, LUNA_REBOUND_BELIEF, LUNA_WEIGHT_DECAY_L2},
    {"apollo_belief_decoupled", LUNA_OPTIMIZER_APOLLO, LUNA_REBOUND_BELIEF,
     LUNA_WEIGHT_DECAY_DECOUPLED},
    {"apollo_belief_stable", LUNA_OPTIMIZER_APOLLO, LUNA_REBOUND_BELIEF, LUNA_WEIGHT_DECAY_STABLE},
    {"adam", LUNA_OPTIMIZER_ADAM, LUNA_REBOUND_CONSTANT, LUNA_WEIGHT_DECAY_DECOUPLED},
};
#define NUM_CASES ((int)(sizeof CASES / sizeof CASES[0]))

START_TEST(test_golden) {
    const golden_case *gc = &CASES[_i];
    luna_backend *be = make_backend(2);
    flat_params *p = make_params(be, FIXTURE_SPECS, NUM_FIXTURE_TENSORS);
    luna_safetensors *in = NULL, *out = NULL;
    ck_assert_msg(luna_safetensors_open(&in, FIXTURE_DIR "/inputs.safetensors") == LUNA_OK, "%s",
                  luna_error_message());
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", FIXTURE_DIR, gc->file);
    ck_assert_msg(luna_safetensors_open(&out, path) == LUNA_OK, "%s", luna_error_message());

    /* Config from the fixture's metadata must be what this case assumes. */
    const char *meta = luna_safetensors_metadata(out, "config");
    ck_assert_ptr_nonnull(meta);
    luna_optimizer_config cfg;
    luna_optimizer_config_defaults(&cfg, gc->kind);
    cfg.rebound = gc->rebound;
    cfg.weight_decay_type = gc->wd_type;
    cfg.weight_decay = 0.05;
    ck_assert_ptr_nonnull(strstr(meta, "\"weight_decay\": 0.05"));

    const luna_st_tensor *lr_t = fixture_tensor(in, "lr");
    ck_assert_str_eq(lr_t->dtype_name, "F64");
    ck_assert_uint_eq(lr_t->nbytes, STEPS * sizeof(double));
    double lr[STEPS];
    memcpy(lr, lr_t->data, sizeof lr);

    for (int i = 0; i < NUM_FIXTURE_TENSORS; i++) {
        const tensor_slot *info = &p->tensors[i];
        char name[160];
        snprintf(name, sizeof name, "init.%s", info->name);
        const luna_st_tensor *t = fixture_tensor(in, name);
        ck_assert_uint_eq(t->nbytes, info->numel * sizeof(float));
        LUNA_CHECK_OK(luna_mem_from_host(be, p->data + info->offset, t->data, t->nbytes));
    }
    luna_optimizer *opt = make_optimizer(be, &cfg, p);
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < NUM_FIXTURE_TENSORS; i++) {
            const tensor_slot *info = &p->tensors[i];
            char name[160];
            snprintf(name, sizeof name, "grads.%s", info->name);
            const luna_st_tensor *t = fixture_tensor(in, name);
            ck_assert_uint_eq(t->nbytes, STEPS * info->numel * sizeof(float));
            LUNA_CHECK_OK(
                luna_mem_from_host(be, p->grad + info->offset,
                                   (const char *)t->data + (size_t)k * info->numel * sizeof(float),
                                   info->numel * sizeof(float)));
        }
        step_ok(opt, lr[k]);
    }

    /* Parameters, then every state tensor. */
    double worst = 0.0;
    float *host = malloc(p->num_params * sizeof(float) + 64);
    ck_assert_ptr_nonnull(host);
    for (int i = 0; i < NUM_FIXTURE_TENSORS; i++) {
        const tensor_slot *info = &p->tensors[i];
        char name[160];
        snprintf(name, sizeof name, "param.%s", info->name);
        const luna_st_tensor *t = fixture_tensor(out, name);
        ck_assert_uint_eq(t->nbytes, info->numel * sizeof(float));
        LUNA_CHECK_OK(luna_mem_to_host(be, host, p->data + info->offset, t->nbytes));
        float *want = malloc(t->nbytes);
        memcpy(want, t->data, t->nbytes);
        double e = rel_error(host, want, info->numel);
        ck_assert_msg(e <= 1e-6, "%s: %s rel error %.3e", gc->file, name, e);
        worst = fmax(worst, e);
        free(want);
    }
    int ns = luna_optimizer_num_state_tensors(opt);
    ck_assert_int_eq(ns, (gc->kind == LUNA_OPTIMIZER_APOLLO ? 3 : 2) * NUM_FIXTURE_TENSORS);
    for (int s = 0; s < ns; s++) {
        const char *name = NULL;
        luna_tensor view;
        ck_assert_int_eq(luna_optimizer_state_tensor(opt, s, &name, &view), LUNA_OK);
        const luna_st_tensor *t = fixture_tensor(out, name);
        ck_assert_uint_eq(t->nbytes, luna_tensor_bytes(&view));
        LUNA_CHECK_OK(luna_mem_to_host(be, host, view.data, t->nbytes));
        float *want = malloc(t->nbytes);
        memcpy(want, t->data, t->nbytes);
        double e = rel_error(host, want, t->nbytes / sizeof(float));
        ck_assert_msg(e <= 1e-6, "%s: %s rel error %.3e", gc->file, name, e);
        worst = fmax(worst, e);
        free(want);
    }
    printf("optim golden %-26s max rel error %.3e (params + %d state tensors)\n", gc->file, worst,
           ns);
    for (int i = 0; i < NUM_FIXTURE_TENSORS; i++)
        ck_assert_int_eq(luna_optimizer_tensor_step(opt, i), STEPS);
    free(host);
    luna_optimizer_free(opt);
    luna_safetensors_close(in);
    luna_safetensors_close(out);
    free_params(p);
    luna_backend_free(be);
}
END_TEST

/* ---- the first step ------------------------------------------------------------------------- */

START_TEST(test_first_step) {
    luna_backend *be = make_backend(1);
    const tensor_spec specs[] = {{"w", 2, {9, 5}, true}};
    flat_params *p = make_params(be, specs, 1);
    size_t n = p->tensors[0].numel;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    float *theta0 = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    luna_test_fill_uniform(&rng, theta0, n, -1, 1);
    luna_test_fill_uniform(&rng, g, n, -2, 2);
    LUNA_CHECK_OK(luna_mem_from_host(be, p->data, theta0, n * sizeof(float)));
    LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, g, n * sizeof(float)));
    luna_optimizer_config cfg;
    luna_optimizer_config_defaults(&cfg, LUNA_OPTIMIZER_APOLLO);
    ck_assert(cfg.rebound == LUNA_REBOUND_CONSTANT && cfg.weight_decay == 0.0);
    luna_optimizer *opt = make_optimizer(be, &cfg, p);
    const double lr = 3e-3;
    step_ok(opt, lr);
    LUNA_CHECK_OK(luna_mem_to_host(be, out, p->data, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) {
        double want = (double)theta0[i] - lr * (double)g[i] / LUNA_APOLLO_SIGMA;
        ck_assert_msg(fabs(out[i] - want) <= 1e-6 * fabs(want) + 1e-7, "θ[%zu] %.9g want %.9g", i,
                      out[i], want);
    }
    /* m = g, B = 0, d = g/σ after it. */
    luna_tensor view;
    ck_assert_int_eq(luna_optimizer_state_tensor(opt, 0, NULL, &view), LUNA_OK);
    LUNA_CHECK_OK(luna_mem_to_host(be, out, view.data, n * sizeof(float)));
    ck_assert_mem_eq(out, g, n * sizeof(float));
    ck_assert_int_eq(luna_optimizer_state_tensor(opt, 1, NULL, &view), LUNA_OK);
    LUNA_CHECK_OK(luna_mem_to_host(be, out, view.data, n * sizeof(float)));
    for (size_t i = 0; i < n; i++)
        ck_assert(out[i] == 0.0f);
    ck_assert_int_eq(luna_optimizer_state_tensor(opt, 2, NULL, &view), LUNA_OK);
    LUNA_CHECK_OK(luna_mem_to_host(be, out, view.data, n * sizeof(float)));
    for (size_t i = 0; i < n; i++)
        ck_assert(fabs(out[i] - g[i] / LUNA_APOLLO_SIGMA) <= 1e-6 * fabs(g[i] / LUNA_APOLLO_SIGMA));
    free(theta0);
    free(g);
    free(out);
    luna_optimizer_free(opt);
    free_params(p);
    luna_backend_free(be);
}
END_TEST

/* ---- determinism across thread counts -------------------------------------------------------- */

static const tensor_spec BIG_SPECS[] = {
    {"big", 2, {251, 200}, true}, /* 50200 elements: 13 blocks of 4096 */
    {"edge", 1, {4097, 0}, true}, /* a full block plus one */
    {"small", 2, {3, 5}, true},
};

/* Runs 6 steps with random gradients; returns data + all state, host copy. */
static float *run_threads(int threads, const luna_optimizer_config *cfg, size_t *count) {
    luna_backend *be = make_backend(threads);
    flat_params *p = make_params(be, BIG_SPECS, 3);
    size_t np = p->num_params;
    float *h = malloc(np * sizeof(float));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 99);
    luna_test_fill_uniform(&rng, h, np, -1, 1);
    LUNA_CHECK_OK(luna_mem_from_host(be, p->data, h, np * sizeof(float)));
    luna_optimizer *opt = make_optimizer(be, cfg, p);
    for (int k = 0; k < 6; k++) {
        luna_test_fill_uniform(&rng, h, np, -1, 1);
        LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, h, np * sizeof(float)));
        step_ok(opt, 0.01 * (k + 1));
    }
    int ns = luna_optimizer_num_state_tensors(opt);
    size_t total = np;
    for (int s = 0; s < ns; s++) {
        luna_tensor v;
        luna_optimizer_state_tensor(opt, s, NULL, &v);
        total += (size_t)luna_tensor_numel(&v);
    }
    float *all = malloc(total * sizeof(float));
    LUNA_CHECK_OK(luna_mem_to_host(be, all, p->data, np * sizeof(float)));
    size_t at = np;
    for (int s = 0; s < ns; s++) {
        luna_tensor v;
        luna_optimizer_state_tensor(opt, s, NULL, &v);
        LUNA_CHECK_OK(luna_mem_to_host(be, all + at, v.data, luna_tensor_bytes(&v)));
        at += (size_t)luna_tensor_numel(&v);
    }
    *count = total;
    free(h);
    luna_optimizer_free(opt);
    free_params(p);
    luna_backend_free(be);
    return all;
}

START_TEST(test_threads_bit_identical) {
    for (int c = 0; c < NUM_CASES; c++) {
        luna_optimizer_config cfg;
        luna_optimizer_config_defaults(&cfg, CASES[c].kind);
        cfg.rebound = CASES[c].rebound;
        cfg.weight_decay_type = CASES[c].wd_type;
        cfg.weight_decay = 0.01;
        size_t n1, n2;
        float *a = run_threads(1, &cfg, &n1);
        float *b = run_threads(2, &cfg, &n2);
        ck_assert_uint_eq(n1, n2);
        ck_assert_msg(memcmp(a, b, n1 * sizeof(float)) == 0, "%s: 1 vs 2 threads differ",
                      CASES[c].file);
        for (size_t i = 0; i < n1; i++)
            ck_assert_msg(isfinite(a[i]), "%s: non-finite value", CASES[c].file);
        free(a);
        free(b);
    }
}
END_TEST

/* ---- tensors outside the table --------------------------------------------------------------- */

START_TEST(test_outside_table_untouched) {
    for (int c = 0; c < NUM_CASES; c++) {
        luna_backend *be = make_backend(1);
        const tensor_spec specs[] = {
            {"x", 1, {10, 0}, true}, {"frozen", 2, {4, 6}, false}, {"y", 1, {3, 0}, true}};
        flat_params *p = make_params(be, specs, 3);
        size_t np = p->num_params;
        float *h = malloc(np * sizeof(float)), *before = malloc(np * sizeof(float));
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 5);
        luna_test_fill_uniform(&rng, before, np, -1, 1);
        LUNA_CHECK_OK(luna_mem_from_host(be, p->data, before, np * sizeof(float)));
        luna_optimizer_config cfg;
        luna_optimizer_config_defaults(&cfg, CASES[c].kind);
        cfg.rebound = CASES[c].rebound;
        cfg.weight_decay_type = CASES[c].wd_type;
        cfg.weight_decay = 0.1; /* decay must not reach the frozen tensor either */
        luna_optimizer *opt = make_optimizer(be, &cfg, p);
        for (int k = 0; k < 3; k++) {
            luna_test_fill_uniform(&rng, h, np, -1, 1); /* nonzero grads everywhere */
            LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, h, np * sizeof(float)));
            step_ok(opt, 0.05);
        }
        LUNA_CHECK_OK(luna_mem_to_host(be, h, p->data, np * sizeof(float)));
        const tensor_slot *fz = &p->tensors[1], *x = &p->tensors[0];
        ck_assert_mem_eq(h + fz->offset, before + fz->offset, fz->numel * sizeof(float));
        ck_assert_msg(memcmp(h + x->offset, before + x->offset, x->numel * sizeof(float)) != 0,
                      "trainable tensor unchanged");
        /* The table holds x and y only: their step counts, and nothing for a third tensor. */
        ck_assert_int_eq(luna_optimizer_tensor_step(opt, 0), 3);
        ck_assert_int_eq(luna_optimizer_tensor_step(opt, 1), 3);
        ck_assert_int_eq(luna_optimizer_tensor_step(opt, 2), -1);
        int ns = luna_optimizer_num_state_tensors(opt);
        ck_assert_int_eq(ns, (CASES[c].kind == LUNA_OPTIMIZER_APOLLO ? 3 : 2) * 2);
        for (int s = 0; s < ns; s++) {
            const char *name;
            luna_optimizer_state_tensor(opt, s, &name, NULL);
            ck_assert_ptr_null(strstr(name, "frozen"));
        }
        free(h);
        free(before);
        luna_optimizer_free(opt);
        free_params(p);
        luna_backend_free(be);
    }
}
END_TEST

/* ---- checkpoint state -------------------------------------------------------------------------
 */

static void copy_state(luna_backend *be, luna_optimizer *dst, const luna_optimizer *src) {
    int ns = luna_optimizer_num_state_tensors(src);
    ck_assert_int_eq(luna_optimizer_num_state_tensors(dst), ns);
    for (int s = 0; s < ns; s++) {
        const char *na, *nb;
        luna_tensor a, b;
        luna_optimizer_state_tensor(src, s, &na, &a);
        luna_optimizer_state_tensor(dst, s, &nb, &b);
        ck_assert_str_eq(na, nb);
        LUNA_CHECK_OK(luna_mem_copy(be, b.data, a.data, luna_tensor_bytes(&a)));
    }
}

START_TEST(test_json_roundtrip) {
    luna_backend *be = make_backend(1);
    flat_params *p = make_params(be, FIXTURE_SPECS, NUM_FIXTURE_TENSORS);
    flat_params *q = make_params(be, FIXTURE_SPECS, NUM_FIXTURE_TENSORS);
    size_t np = p->num_params;
    float *h = malloc(np * sizeof(float)), *h2 = malloc(np * sizeof(float));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 11);
    luna_test_fill_uniform(&rng, h, np, -1, 1);
    LUNA_CHECK_OK(luna_mem_from_host(be, p->data, h, np * sizeof(float)));
    luna_optimizer_config cfg;
    luna_optimizer_config_defaults(&cfg, LUNA_OPTIMIZER_APOLLO);
    ck_assert_int_eq(luna_optimizer_config_parse_names(&cfg, "apollo", "belief", "stable"),
                     LUNA_OK);
    cfg.weight_decay = 1e-8;
    luna_optimizer *a = make_optimizer(be, &cfg, p);
    for (int k = 0; k < 4; k++) {
        luna_test_fill_uniform(&rng, h, np, -1, 1);
        LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, h, np * sizeof(float)));
        step_ok(a, 0.02);
    }
    char *json = NULL;
    ck_assert_int_eq(luna_optimizer_state_to_json(a, &json), LUNA_OK);
    ck_assert_ptr_nonnull(strstr(json, "\"kind\":\"apollo\""));

    /* Restore into a fresh optimizer over a copy of the parameters; both continue identically. */
    luna_optimizer *b = make_optimizer(be, &cfg, q);
    luna_status st = luna_optimizer_state_from_json(b, json);
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    for (int i = 0; i < NUM_FIXTURE_TENSORS; i++)
        ck_assert_int_eq(luna_optimizer_tensor_step(b, i), 4);
    copy_state(be, b, a);
    LUNA_CHECK_OK(luna_mem_copy(be, q->data, p->data, np * sizeof(float)));
    for (int k = 0; k < 3; k++) {
        luna_test_fill_uniform(&rng, h, np, -1, 1);
        LUNA_CHECK_OK(luna_mem_from_host(be, p->grad, h, np * sizeof(float)));
        LUNA_CHECK_OK(luna_mem_from_host(be, q->grad, h, np * sizeof(float)));
        step_ok(a, 0.02);
        step_ok(b, 0.02);
    }
    LUNA_CHECK_OK(luna_mem_to_host(be, h, p->data, np * sizeof(float)));
    LUNA_CHECK_OK(luna_mem_to_host(be, h2, q->data, np * sizeof(float)));
    ck_assert_mem_eq(h, h2, np * sizeof(float));

    /* Mismatches: a different rebound, weight decay, kind. Nothing changes on error. */
    luna_optimizer_config other = cfg;
    other.rebound = LUNA_REBOUND_CONSTANT;
    luna_optimizer *c = make_optimizer(be, &other, q);
    st = luna_optimizer_state_from_json(c, json);
    ck_assert_int_eq(st, LUNA_ERR_MISMATCH);
    ck_assert_msg(strstr(luna_error_message(), "rebound") != NULL, "%s", luna_error_message());
    ck_assert_int_eq(luna_optimizer_tensor_step(c, 0), 0);
    luna_optimizer_free(c);
    other = cfg;
    other.weight_decay = 2e-8;
    c = make_optimizer(be, &other, q);
    ck_assert_int_eq(luna_optimizer_state_from_json(c, json), LUNA_ERR_MISMATCH);
    ck_assert_msg(strstr(luna_error_message(), "weight_decay") != NULL, "%s", luna_error_message());
    luna_optimizer_free(c);
    luna_optimizer_config_defaults(&other, LUNA_OPTIMIZER_ADAM);
    c = make_optimizer(be, &other, q);
    ck_assert_int_eq(luna_optimizer_state_from_json(c, json), LUNA_ERR_MISMATCH);
    ck_assert_msg(strstr(luna_error_message(), "apollo") != NULL, "%s", luna_error_message());
    luna_optimizer_free(c);
    /* A step count for a tensor the model does not have; malformed JSON. */
    const char *bad = strstr(json, "\"a.bias\"");
    ck_assert_ptr_nonnull(bad);
    char *renamed = strdup(json);
    renamed[bad - json + 1] = 'z';
    ck_assert_int_eq(luna_optimizer_state_from_json(b, renamed), LUNA_ERR_MISMATCH);
    ck_assert_int_eq(luna_optimizer_state_from_json(b, "{\"kind\":"), LUNA_ERR_FORMAT);
    ck_assert_int_eq(luna_optimizer_tensor_step(b, 0), 7);
    free(renamed);

    /* Name parsing. */
    luna_optimizer_config x;
    luna_optimizer_config_defaults(&x, LUNA_OPTIMIZER_APOLLO);
    ck_assert_int_eq(luna_optimizer_config_parse_names(&x, "adam", NULL, "decoupled"), LUNA_OK);
    ck_assert(x.kind == LUNA_OPTIMIZER_ADAM && x.weight_decay_type == LUNA_WEIGHT_DECAY_DECOUPLED);
    ck_assert_int_eq(luna_optimizer_config_parse_names(&x, "sgd", NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_optimizer_config_parse_names(&x, NULL, "bounce", NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_str_eq(luna_weight_decay_type_name(LUNA_WEIGHT_DECAY_L2), "L2");

    free(json);
    free(h);
    free(h2);
    luna_optimizer_free(a);
    luna_optimizer_free(b);
    free_params(p);
    free_params(q);
    luna_backend_free(be);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("optim_apollo");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_golden, 0, NUM_CASES);
    tcase_add_test(tc, test_first_step);
    tcase_add_test(tc, test_threads_bit_identical);
    tcase_add_test(tc, test_outside_table_untouched);
    tcase_add_test(tc, test_json_roundtrip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
