/* Apollo and Adam over a tensor table (see optim/optimizer.h). The math lives in the backend ops
 * multi_apollo_update / multi_adam_update (model/kernels/cpu/optimizer_kernels.c is the
 * specification): one launch updates every tensor of the table. This file owns the state blocks,
 * the per-tensor step counters (on the host, mirrored on the device for the ops), the clipper
 * the step runs first, and the checkpoint description. An update allocates nothing and reads
 * back only the clip summary, which decides whether the update happens. */
#include "optim/optimizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

#define MAX_STATE_KINDS 3

_Static_assert(LUNA_REBOUND_CONSTANT == 0 && LUNA_REBOUND_BELIEF == 1,
               "rebound codes of core/backend.h apollo_update");
_Static_assert(LUNA_WEIGHT_DECAY_L2 == 0 && LUNA_WEIGHT_DECAY_DECOUPLED == 1 &&
                   LUNA_WEIGHT_DECAY_STABLE == 2,
               "weight decay codes of core/backend.h apollo_update");

struct luna_optimizer {
    luna_backend *be;
    luna_optimizer_config cfg;
    const luna_tensor_table *tt;   /* the tensors to update, with names and shapes */
    float *params, *grads;         /* device flat buffers in tt's layout */
    size_t state_floats;           /* length of each state block: the table's extent */
    int num_kinds;                 /* state blocks: Apollo 3, Adam 2 */
    float *state[MAX_STATE_KINDS]; /* device [state_floats] each, in tt's layout */
    const char *kind_names[MAX_STATE_KINDS];
    int num_tensors;    /* tt->num_tensors */
    int64_t *steps;     /* [num_tensors] */
    char **names;       /* [num_kinds * num_tensors] state tensor names */
    int64_t *dev_steps; /* device [num_tensors]: steps, advanced by the ops */
    luna_clipper *clip; /* scaling and clipping before the update */
};

void luna_optimizer_config_defaults(luna_optimizer_config *c, luna_optimizer_kind kind) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->apollo_beta = 0.9;
    c->apollo_eps = 1e-4;
    c->rebound = LUNA_REBOUND_CONSTANT;
    c->weight_decay = 0.0;
    c->weight_decay_type = LUNA_WEIGHT_DECAY_L2;
    c->adam_beta1 = 0.9;
    c->adam_beta2 = 0.98;
    c->adam_eps = 1e-8;
}

const char *luna_optimizer_kind_name(luna_optimizer_kind kind) {
    return kind == LUNA_OPTIMIZER_APOLLO ? "apollo" : kind == LUNA_OPTIMIZER_ADAM ? "adam" : "?";
}
const char *luna_rebound_name(luna_rebound rebound) {
    return rebound == LUNA_REBOUND_CONSTANT ? "constant"
           : rebound == LUNA_REBOUND_BELIEF ? "belief"
                                            : "?";
}
const char *luna_weight_decay_type_name(luna_weight_decay_type type) {
    switch (type) {
    case LUNA_WEIGHT_DECAY_L2: return "L2";
    case LUNA_WEIGHT_DECAY_DECOUPLED: return "decoupled";
    case LUNA_WEIGHT_DECAY_STABLE: return "stable";
    }
    return "?";
}

luna_status luna_optimizer_config_parse_names(luna_optimizer_config *c, const char *optimizer,
                                              const char *rebound, const char *weight_decay_type) {
    if (!c) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer config: NULL");
    luna_optimizer_config out = *c;
    if (optimizer) {
        if (strcmp(optimizer, "apollo") == 0)
            out.kind = LUNA_OPTIMIZER_APOLLO;
        else if (strcmp(optimizer, "adam") == 0)
            out.kind = LUNA_OPTIMIZER_ADAM;
        else
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--optimizer: unknown optimizer '%s' (use apollo or adam)",
                              optimizer);
    }
    if (rebound) {
        if (strcmp(rebound, "constant") == 0)
            out.rebound = LUNA_REBOUND_CONSTANT;
        else if (strcmp(rebound, "belief") == 0)
            out.rebound = LUNA_REBOUND_BELIEF;
        else
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--apollo-rebound: unknown rebound '%s' (use constant or belief)",
                              rebound);
    }
    if (weight_decay_type) {
        if (strcmp(weight_decay_type, "L2") == 0 || strcmp(weight_decay_type, "l2") == 0)
            out.weight_decay_type = LUNA_WEIGHT_DECAY_L2;
        else if (strcmp(weight_decay_type, "decoupled") == 0)
            out.weight_decay_type = LUNA_WEIGHT_DECAY_DECOUPLED;
        else if (strcmp(weight_decay_type, "stable") == 0)
            out.weight_decay_type = LUNA_WEIGHT_DECAY_STABLE;
        else
            return luna_error(
                LUNA_ERR_INVALID_ARGUMENT,
                "--weight-decay-type: unknown type '%s' (use L2, decoupled or stable)",
                weight_decay_type);
    }
    *c = out;
    return LUNA_OK;
}

static luna_status check_config(const luna_optimizer_config *c) {
    if (c->kind != LUNA_OPTIMIZER_APOLLO && c->kind != LUNA_OPTIMIZER_ADAM)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->weight_decay >= 0.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--weight-decay %g: must be >= 0",
                          c->weight_decay);
    if (c->kind == LUNA_OPTIMIZER_APOLLO) {
        if (!(c->apollo_beta >= 0.0 && c->apollo_beta < 1.0))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--apollo-beta %g: must be in [0, 1)",
                              c->apollo_beta);
        if (!(c->apollo_eps > 0.0))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--apollo-eps %g: must be > 0",
                              c->apollo_eps);
        if (c->rebound != LUNA_REBOUND_CONSTANT && c->rebound != LUNA_REBOUND_BELIEF)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer: unknown rebound %d",
                              (int)c->rebound);
        if (c->weight_decay_type < LUNA_WEIGHT_DECAY_L2 ||
            c->weight_decay_type > LUNA_WEIGHT_DECAY_STABLE)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer: unknown weight decay type %d",
                              (int)c->weight_decay_type);
    } else {
        if (!(c->adam_beta1 >= 0.0 && c->adam_beta1 < 1.0) ||
            !(c->adam_beta2 >= 0.0 && c->adam_beta2 < 1.0))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--adam-betas (%g, %g): must be in [0, 1)",
                              c->adam_beta1, c->adam_beta2);
        if (!(c->adam_eps > 0.0))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--adam-eps %g: must be > 0", c->adam_eps);
    }
    return LUNA_OK;
}

void luna_optimizer_free(luna_optimizer *opt) {
    if (!opt) return;
    size_t bytes = opt->state_floats * sizeof(float);
    for (int k = 0; k < MAX_STATE_KINDS; k++)
        if (opt->state[k]) luna_mem_release(opt->be, opt->state[k], bytes ? bytes : sizeof(float));
    if (opt->names)
        for (int i = 0; i < opt->num_kinds * opt->num_tensors; i++)
            free(opt->names[i]);
    free(opt->names);
    if (opt->dev_steps)
        luna_mem_release(opt->be, opt->dev_steps,
                         (size_t)(opt->num_tensors + 1) * sizeof *opt->dev_steps);
    luna_clipper_free(opt->clip);
    free(opt->steps);
    free(opt);
}

/* Copies the host step counts to the device mirror and waits: the host copy may change next. */
static luna_status upload_steps(luna_optimizer *opt) {
    luna_status st = luna_mem_from_host(opt->be, opt->dev_steps, opt->steps,
                                        (size_t)opt->num_tensors * sizeof *opt->steps);
    if (st == LUNA_OK) st = luna_backend_synchronize(opt->be);
    return st;
}

/* "optimizer.<kind>.<tensor>" for every state tensor. */
static luna_status make_names(luna_optimizer *opt) {
    int n = opt->num_tensors;
    opt->names = calloc((size_t)(opt->num_kinds * n + 1), sizeof *opt->names);
    if (!opt->names) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "optimizer: out of host memory");
    for (int k = 0; k < opt->num_kinds; k++)
        for (int j = 0; j < n; j++) {
            const char *tname = luna_tensor_table_name(opt->tt, j);
            size_t len = strlen("optimizer.") + strlen(opt->kind_names[k]) + 1 + strlen(tname) + 1;
            char *s = malloc(len);
            if (!s) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "optimizer: out of host memory");
            snprintf(s, len, "optimizer.%s.%s", opt->kind_names[k], tname);
            opt->names[k * n + j] = s;
        }
    return LUNA_OK;
}

/* The zeroed state blocks, the device step counters and the clipper. */
static luna_status make_device_state(luna_optimizer *opt) {
    luna_backend *be = opt->be;
    size_t bytes = opt->state_floats * sizeof(float);
    for (int k = 0; k < opt->num_kinds; k++) {
        opt->state[k] = luna_mem_alloc(be, bytes ? bytes : sizeof(float));
        if (!opt->state[k])
            return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                              "optimizer: cannot allocate %zu bytes of %s state on %s", bytes,
                              luna_optimizer_kind_name(opt->cfg.kind), be->name);
        LUNA_TRY(luna_mem_zero(be, opt->state[k], bytes));
    }
    opt->dev_steps = luna_mem_alloc(be, (size_t)(opt->num_tensors + 1) * sizeof *opt->dev_steps);
    if (!opt->dev_steps)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "optimizer: cannot allocate step counters on %s",
                          be->name);
    LUNA_TRY(upload_steps(opt));
    return luna_clipper_create(&opt->clip, be, opt->tt);
}

luna_status luna_optimizer_create(luna_optimizer **out, luna_backend *be,
                                  const luna_optimizer_config *cfg, const luna_tensor_table *tt,
                                  float *params, float *grads) {
    if (!out || !be || !cfg || !tt)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_create: NULL argument");
    *out = NULL;
    if (tt->num_tensors > 0 && (!params || !grads || !tt->host_tensors))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_create: %s",
                          !tt->host_tensors ? "the tensor table has no names"
                                            : "NULL parameter or gradient buffer");
    LUNA_TRY(check_config(cfg));
    luna_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "optimizer: out of host memory");
    opt->be = be;
    opt->cfg = *cfg;
    opt->tt = tt;
    opt->params = params;
    opt->grads = grads;
    opt->num_tensors = tt->num_tensors;
    opt->state_floats = (size_t)luna_tensor_table_extent(tt);
    if (cfg->kind == LUNA_OPTIMIZER_APOLLO) {
        opt->num_kinds = 3;
        opt->kind_names[0] = "exp_avg";
        opt->kind_names[1] = "approx_hessian";
        opt->kind_names[2] = "update";
    } else {
        opt->num_kinds = 2;
        opt->kind_names[0] = "exp_avg";
        opt->kind_names[1] = "exp_avg_sq";
    }
    opt->steps = calloc((size_t)opt->num_tensors + 1, sizeof *opt->steps);
    luna_status st = opt->steps
                         ? make_names(opt)
                         : luna_error(LUNA_ERR_OUT_OF_MEMORY, "optimizer: out of host memory");
    if (st == LUNA_OK) st = make_device_state(opt);
    if (st != LUNA_OK) {
        luna_optimizer_free(opt);
        return st;
    }
    *out = opt;
    return LUNA_OK;
}

/* The optimizer op over the table, with the gradients as they are now, gated on the clip
 * summary's finite flag (on the device: the host has not read it yet). */
static luna_status apply_update(luna_optimizer *opt, double lr) {
    luna_backend *be = opt->be;
    const luna_optimizer_config *c = &opt->cfg;
    const double *gate = luna_clipper_gate(opt->clip);
    if (c->kind == LUNA_OPTIMIZER_APOLLO)
        return be->ops->multi_apollo_update(
            be, opt->params, opt->grads, opt->state[0], opt->state[1], opt->state[2], opt->tt,
            opt->dev_steps, gate, lr, c->apollo_beta, c->apollo_eps, LUNA_APOLLO_SIGMA,
            (int)c->rebound, c->weight_decay, (int)c->weight_decay_type);
    return be->ops->multi_adam_update(be, opt->params, opt->grads, opt->state[0], opt->state[1],
                                      opt->tt, opt->dev_steps, gate, lr, c->adam_beta1,
                                      c->adam_beta2, c->adam_eps, c->weight_decay);
}

double *luna_optimizer_loss_sums(luna_optimizer *opt) {
    return opt ? luna_clipper_loss_sums(opt->clip) : NULL;
}

luna_status luna_optimizer_step(luna_optimizer *opt, const luna_optimizer_step_args *args,
                                luna_optimizer_step_result *result) {
    luna_optimizer_step_result r = {
        .grad_norm = 0.0, .clipped = false, .finite = true, .loss_sum = 0.0, .nll_sum = 0.0};
    if (result) *result = r;
    if (!opt || !args)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_step: NULL argument");
    if (!(args->lr >= 0.0) || args->lr > 1e300)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_step: bad learning rate %g",
                          args->lr);
    /* The factor is applied in fp32, so it must be a finite, nonzero fp32 value. */
    float scale = (float)args->grad_scale;
    if (!(args->grad_scale > 0.0) || !(scale > 0.0f) || !isfinite(scale))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_step: bad gradient scale %g",
                          args->grad_scale);
    luna_backend *be = opt->be;
    luna_status st = LUNA_OK;
    /* Everything is queued before the one readback: the update itself skips on the device when
     * the clip summary (gradients and loss sums) is not finite. */
    if (scale != 1.0f) st = be->ops->multi_scale(be, opt->grads, opt->tt, NULL, scale);
    if (st == LUNA_OK)
        st = luna_clipper_queue(opt->clip, opt->grads, args->clip_norm, args->clip_mode);
    if (st == LUNA_OK) st = apply_update(opt, args->lr);
    luna_clip_summary cs = {.all_finite = true};
    if (st == LUNA_OK) st = luna_clipper_finish(opt->clip, &cs);
    r.grad_norm = cs.grad_norm;
    r.clipped = cs.clipped;
    r.finite = cs.all_finite;
    r.loss_sum = cs.loss_sum;
    r.nll_sum = cs.nll_sum;
    if (st != LUNA_OK) {
        luna_error_prefix("optimizer step");
        return st;
    }
    if (r.finite)
        for (int j = 0; j < opt->num_tensors; j++)
            opt->steps[j]++;
    if (result) *result = r;
    return LUNA_OK;
}

const luna_optimizer_config *luna_optimizer_get_config(const luna_optimizer *opt) {
    return &opt->cfg;
}

int64_t luna_optimizer_tensor_step(const luna_optimizer *opt, int index) {
    if (!opt || index < 0 || index >= opt->num_tensors) return -1;
    return opt->steps[index];
}

int luna_optimizer_num_state_tensors(const luna_optimizer *opt) {
    return opt ? opt->num_kinds * opt->num_tensors : 0;
}

luna_status luna_optimizer_state_tensor(const luna_optimizer *opt, int i, const char **name,
                                        luna_tensor *view) {
    if (!opt || i < 0 || i >= luna_optimizer_num_state_tensors(opt))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer state tensor %d: out of range", i);
    int k = i / opt->num_tensors, j = i % opt->num_tensors;
    if (name) *name = opt->names[i];
    if (view) *view = luna_tensor_table_view(opt->tt, j, opt->state[k]);
    return LUNA_OK;
}

/* ---- JSON ------------------------------------------------------------------------------------ */

luna_status luna_optimizer_state_to_json(const luna_optimizer *opt, char **json_out) {
    if (!opt || !json_out)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_state_to_json: NULL argument");
    const luna_optimizer_config *c = &opt->cfg;
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "kind");
    luna_json_string(&w, luna_optimizer_kind_name(c->kind));
    luna_json_key(&w, "config");
    luna_json_begin_object(&w);
    luna_json_key(&w, "apollo_beta");
    luna_json_double(&w, c->apollo_beta);
    luna_json_key(&w, "apollo_eps");
    luna_json_double(&w, c->apollo_eps);
    luna_json_key(&w, "apollo_sigma");
    luna_json_double(&w, LUNA_APOLLO_SIGMA);
    luna_json_key(&w, "rebound");
    luna_json_string(&w, luna_rebound_name(c->rebound));
    luna_json_key(&w, "weight_decay");
    luna_json_double(&w, c->weight_decay);
    luna_json_key(&w, "weight_decay_type");
    luna_json_string(&w, luna_weight_decay_type_name(c->weight_decay_type));
    luna_json_key(&w, "adam_beta1");
    luna_json_double(&w, c->adam_beta1);
    luna_json_key(&w, "adam_beta2");
    luna_json_double(&w, c->adam_beta2);
    luna_json_key(&w, "adam_eps");
    luna_json_double(&w, c->adam_eps);
    luna_json_end_object(&w);
    luna_json_key(&w, "steps");
    luna_json_begin_object(&w);
    for (int j = 0; j < opt->num_tensors; j++) {
        luna_json_key(&w, luna_tensor_table_name(opt->tt, j));
        luna_json_int(&w, opt->steps[j]);
    }
    luna_json_end_object(&w);
    luna_json_end_object(&w);
    return luna_json_writer_finish(&w, json_out, NULL);
}

static const char *HINT = "use --reset-optimizer to start a fresh optimizer";

static luna_status expect_string(const luna_json *cfg, const char *key, const char *want) {
    const luna_json *v = luna_json_get(cfg, key);
    if (!v || v->type != LUNA_JSON_STRING)
        return luna_error(LUNA_ERR_FORMAT, "optimizer state: config.%s missing or not a string",
                          key);
    if (strcmp(v->string, want) != 0)
        return luna_error(LUNA_ERR_MISMATCH,
                          "optimizer state: %s is '%s' in the checkpoint but '%s' here (%s)", key,
                          v->string, want, HINT);
    return LUNA_OK;
}

static luna_status expect_number(const luna_json *cfg, const char *key, double want) {
    const luna_json *v = luna_json_get(cfg, key);
    if (!v || v->type != LUNA_JSON_NUMBER)
        return luna_error(LUNA_ERR_FORMAT, "optimizer state: config.%s missing or not a number",
                          key);
    if (v->number != want)
        return luna_error(LUNA_ERR_MISMATCH,
                          "optimizer state: %s is %.17g in the checkpoint but %.17g here (%s)", key,
                          v->number, want, HINT);
    return LUNA_OK;
}

static luna_status check_json(const luna_optimizer *opt, const luna_json *root, int64_t *steps) {
    const luna_optimizer_config *c = &opt->cfg;
    if (!root || root->type != LUNA_JSON_OBJECT)
        return luna_error(LUNA_ERR_FORMAT, "optimizer state: not a JSON object");
    const luna_json *kind = luna_json_get(root, "kind");
    if (!kind || kind->type != LUNA_JSON_STRING)
        return luna_error(LUNA_ERR_FORMAT, "optimizer state: \"kind\" missing or not a string");
    if (strcmp(kind->string, luna_optimizer_kind_name(c->kind)) != 0)
        return luna_error(LUNA_ERR_MISMATCH,
                          "optimizer state: the checkpoint has %s state but the optimizer is %s "
                          "(%s)",
                          kind->string, luna_optimizer_kind_name(c->kind), HINT);
    const luna_json *cfg = luna_json_get(root, "config");
    if (!cfg || cfg->type != LUNA_JSON_OBJECT)
        return luna_error(LUNA_ERR_FORMAT, "optimizer state: \"config\" missing");
    if (c->kind == LUNA_OPTIMIZER_APOLLO) {
        LUNA_TRY(expect_number(cfg, "apollo_beta", c->apollo_beta));
        LUNA_TRY(expect_number(cfg, "apollo_eps", c->apollo_eps));
        LUNA_TRY(expect_number(cfg, "apollo_sigma", LUNA_APOLLO_SIGMA));
        LUNA_TRY(expect_string(cfg, "rebound", luna_rebound_name(c->rebound)));
        LUNA_TRY(expect_number(cfg, "weight_decay", c->weight_decay));
        LUNA_TRY(expect_string(cfg, "weight_decay_type",
                               luna_weight_decay_type_name(c->weight_decay_type)));
    } else {
        LUNA_TRY(expect_number(cfg, "adam_beta1", c->adam_beta1));
        LUNA_TRY(expect_number(cfg, "adam_beta2", c->adam_beta2));
        LUNA_TRY(expect_number(cfg, "adam_eps", c->adam_eps));
        LUNA_TRY(expect_number(cfg, "weight_decay", c->weight_decay));
    }
    const luna_json *st = luna_json_get(root, "steps");
    if (!st || st->type != LUNA_JSON_OBJECT)
        return luna_error(LUNA_ERR_FORMAT, "optimizer state: \"steps\" missing");
    for (size_t k = 0; k < st->length; k++) {
        int j = luna_tensor_table_find(opt->tt, st->keys[k]);
        if (j < 0)
            return luna_error(LUNA_ERR_MISMATCH,
                              "optimizer state: step count for '%s', which is not a trainable "
                              "parameter of this model (%s)",
                              st->keys[k], HINT);
        const luna_json *v = &st->items[k];
        if (v->type != LUNA_JSON_NUMBER || !v->is_int || v->is_negative)
            return luna_error(LUNA_ERR_FORMAT,
                              "optimizer state: step count of '%s' is not a non-negative integer",
                              st->keys[k]);
        steps[j] = (int64_t)v->uint_value;
    }
    for (int j = 0; j < opt->num_tensors; j++)
        if (steps[j] < 0)
            return luna_error(LUNA_ERR_MISMATCH, "optimizer state: no step count for '%s' (%s)",
                              luna_tensor_table_name(opt->tt, j), HINT);
    return LUNA_OK;
}

luna_status luna_optimizer_state_from_json(luna_optimizer *opt, const char *json) {
    if (!opt || !json)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "optimizer_state_from_json: NULL argument");
    luna_json *root = NULL;
    luna_status s = luna_json_parse(&root, json, strlen(json), NULL);
    if (s != LUNA_OK) {
        luna_error_prefix("optimizer state");
        return s;
    }
    int nt = opt->num_tensors;
    int64_t *steps = malloc((size_t)(nt + 1) * sizeof *steps);
    if (!steps) {
        luna_json_free(root);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "optimizer state: out of host memory");
    }
    for (int j = 0; j < nt; j++)
        steps[j] = -1;
    s = check_json(opt, root, steps);
    if (s == LUNA_OK) {
        memcpy(opt->steps, steps, (size_t)nt * sizeof *steps);
        s = upload_steps(opt);
    }
    free(steps);
    luna_json_free(root);
    return s;
}
