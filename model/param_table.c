#include "model/param_table.h"
#include "model/pass.h"
#include "model/quantize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layout walker ------------------------------------------------------------------------
 * walk() visits every tensor in state_dict order. The same walk counts tensors, fills the table
 * and binds the typed views (weights) to a buffer, so the three can never disagree. */

typedef struct {
    luna_param_info *tensors; /* NULL: only count */
    int count;
    size_t offset;
    float *base; /* NULL: do not bind */
} walker;

static void visit(walker *wk, float **slot, const char *name, int ndim, int64_t rows, int64_t cols,
                  luna_init_kind init, double a, int fan_in, int fan_out) {
    size_t numel = (size_t)rows * (size_t)(ndim == 2 ? cols : 1);
    if (wk->tensors) {
        luna_param_info *t = &wk->tensors[wk->count];
        memset(t, 0, sizeof *t);
        size_t len = strlen(name);
        if (len >= sizeof t->name) len = sizeof t->name - 1;
        memcpy(t->name, name, len);
        t->name[len] = '\0';
        t->ndim = ndim;
        t->shape[0] = rows;
        t->shape[1] = ndim == 2 ? cols : 0;
        t->offset = wk->offset;
        t->numel = numel;
        t->init = init;
        t->init_a = a;
        t->fan_in = fan_in;
        t->fan_out = fan_out;
        t->has_grad = true;
    }
    if (wk->base && slot) *slot = wk->base + wk->offset;
    wk->count++;
    wk->offset += numel;
}

/* Marks the tensor just visited as one an int8 model stores in int8 (model/quantize.h). */
static void int8_storable(walker *wk) {
    if (wk->tensors) wk->tensors[wk->count - 1].int8 = true;
}

typedef enum { LIN_QKV, LIN_OUT, LIN_FFN } linear_kind;

static void linear(walker *wk, luna_linear_w *w, const char *prefix, const char *name, int in,
                   int out, linear_kind kind) {
    char full[256]; /* prefix (< 112) + name + suffix always fits */
    snprintf(full, sizeof full, "%s.%s.weight", prefix, name);
    if (kind == LIN_FFN)
        visit(wk, &w->weight, full, 2, out, in, LUNA_INIT_UNIFORM_FAN_IN, 0, in, out);
    else
        visit(wk, &w->weight, full, 2, out, in, LUNA_INIT_XAVIER,
              kind == LIN_QKV ? 1.0 / sqrt(2.0) : 1.0, in, out);
    int8_storable(wk);
    snprintf(full, sizeof full, "%s.%s.bias", prefix, name);
    visit(wk, &w->bias, full, 1, out, 0,
          kind == LIN_OUT ? LUNA_INIT_ZERO : LUNA_INIT_UNIFORM_FAN_IN, 0, in, out);
}

static void norm(walker *wk, luna_norm_w *w, const char *prefix, const char *name, int d) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s.weight", prefix, name);
    visit(wk, &w->weight, full, 1, d, 0, LUNA_INIT_ONE, 0, d, d);
    snprintf(full, sizeof full, "%s.%s.bias", prefix, name);
    visit(wk, &w->bias, full, 1, d, 0, LUNA_INIT_ZERO, 0, d, d);
}

/* Attention module `prefix` ("encoder.layers.0.self_attn"). causal: the decoder's causal Luna
 * attention (untied keeps pc_proj). */
static void attention(walker *wk, const luna_config *c, luna_attn_w *a, const char *prefix, int d,
                      bool causal) {
    if (c->arch == LUNA_ARCH_TRANSFORMER) {
        linear(wk, &a->k_proj, prefix, "k_proj", d, d, LIN_QKV);
        linear(wk, &a->v_proj, prefix, "v_proj", d, d, LIN_QKV);
        linear(wk, &a->q_proj, prefix, "q_proj", d, d, LIN_QKV);
    } else {
        linear(wk, &a->pq_proj, prefix, "pq_proj", d, d, LIN_QKV);
        linear(wk, &a->q_proj, prefix, "q_proj", d, d, LIN_QKV);
        if (!c->untie_luna_kv) {
            linear(wk, &a->pc_proj, prefix, "pc_proj", d, d, LIN_QKV);
            linear(wk, &a->c_proj, prefix, "c_proj", d, d, LIN_QKV);
        } else if (causal) {
            linear(wk, &a->pc_proj, prefix, "pc_proj", d, d, LIN_QKV);
            linear(wk, &a->k_proj, prefix, "k_proj", d, d, LIN_QKV);
            linear(wk, &a->v_proj, prefix, "v_proj", d, d, LIN_QKV);
        } else {
            linear(wk, &a->pk_proj, prefix, "pk_proj", d, d, LIN_QKV);
            linear(wk, &a->pv_proj, prefix, "pv_proj", d, d, LIN_QKV);
            linear(wk, &a->k_proj, prefix, "k_proj", d, d, LIN_QKV);
            linear(wk, &a->v_proj, prefix, "v_proj", d, d, LIN_QKV);
        }
    }
    linear(wk, &a->out_proj, prefix, "out_proj", d, d, LIN_OUT);
}

/* Clears has_grad of the LayerNorm (weight, bias) visited as tensors `at` and `at` + 1. */
static void no_grad(walker *wk, int at) {
    if (!wk->tensors) return;
    wk->tensors[at].has_grad = false;
    wk->tensors[at + 1].has_grad = false;
}

/* A learned P [l, d] `prefix`.projected_embeddings, initialised like the encoder's (spec §5). */
static void projection(walker *wk, float **slot, const char *prefix, const luna_config *c, int d) {
    char full[128];
    snprintf(full, sizeof full, "%s.projected_embeddings", prefix);
    visit(wk, slot, full, 2, c->projection_length, d, LUNA_INIT_NORMAL, 1.0 / sqrt((double)d), d,
          c->projection_length);
}

/* A Linformer length projection `prefix`.`name`.weight [k, N] (no bias). */
static void compress(walker *wk, float **slot, const char *prefix, const char *name,
                     const luna_config *c) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s.weight", prefix, name);
    visit(wk, slot, full, 2, c->linformer_k, c->max_source_positions, LUNA_INIT_XAVIER,
          1.0 / sqrt(2.0), c->max_source_positions, c->linformer_k);
}

static void walk(walker *wk, const luna_config *c, luna_weights *w) {
    const bool luna = c->arch == LUNA_ARCH_LUNA;
    const int d = c->encoder_embed_dim;
    float *dummy;
    visit(wk, w ? &w->embed_tokens : &dummy, "encoder.embed_tokens.weight", 2, c->vocab_size, d,
          LUNA_INIT_NORMAL, 1.0 / sqrt((double)d), d, c->vocab_size);
    int8_storable(wk);
    if (luna)
        visit(wk, w ? &w->projected_embeddings : &dummy, "encoder.projected_embeddings", 2,
              c->projection_length, d, LUNA_INIT_NORMAL, 1.0 / sqrt((double)d), d,
              c->projection_length);
    luna_encoder_layer_w scratch_e;
    luna_decoder_layer_w scratch_d;
    float *shared_e = NULL; /* Linformer layerwise sharing: one E = F for every layer */
    if (c->linformer_k > 0 && c->linformer_sharing == LUNA_LINFORMER_LAYERWISE)
        compress(wk, &shared_e, "encoder", "compress_layer", c);
    for (int i = 0; i < c->encoder_layers; i++) {
        luna_encoder_layer_w *l = w ? &w->encoder[i] : &scratch_e;
        char prefix[96], attn[112];
        snprintf(prefix, sizeof prefix, "encoder.layers.%d", i);
        snprintf(attn, sizeof attn, "%s.self_attn", prefix);
        attention(wk, c, &l->self_attn, attn, d, false);
        if (c->linformer_k > 0) {
            /* Linformer E, F [k, N] (fairseq examples/linformer names; xavier gain 1/√2) */
            if (c->linformer_sharing == LUNA_LINFORMER_LAYERWISE) {
                l->self_attn.compress_k = shared_e;
            } else {
                compress(wk, &l->self_attn.compress_k, attn, "compress_k", c);
                if (c->linformer_sharing == LUNA_LINFORMER_HEADWISE)
                    compress(wk, &l->self_attn.compress_v, attn, "compress_v", c);
            }
        }
        norm(wk, &l->self_attn_layer_norm, prefix, "self_attn_layer_norm", d);
        const int p_norm = wk->count;
        if (luna) norm(wk, &l->self_atten_proj_layer_norm, prefix, "self_atten_proj_layer_norm", d);
        linear(wk, &l->fc1, prefix, "fc1", d, c->encoder_ffn_embed_dim, LIN_FFN);
        linear(wk, &l->fc2, prefix, "fc2", c->encoder_ffn_embed_dim, d, LIN_FFN);
        norm(wk, &l->final_layer_norm, prefix, "final_layer_norm", d);
        if (luna && c->non_contextual_projection) {
            /* Table 5's non-contextual P: the layer's P output feeds nothing, its LayerNorm
             * gets no gradient; layers > 0 pack their own learned P (layer 0 the encoder's). */
            no_grad(wk, p_norm);
            if (i > 0) projection(wk, w ? &l->projected_embeddings : &dummy, prefix, c, d);
        }
    }
    const int dd = c->decoder_embed_dim;
    if (!c->share_all_embeddings) {
        visit(wk, w ? &w->decoder_embed_tokens : &dummy, "decoder.embed_tokens.weight", 2,
              c->vocab_size, dd, LUNA_INIT_NORMAL, 1.0 / sqrt((double)dd), dd, c->vocab_size);
        int8_storable(wk);
    } else if (w)
        w->decoder_embed_tokens = w->embed_tokens;
    for (int i = 0; i < c->decoder_layers; i++) {
        luna_decoder_layer_w *l = w ? &w->decoder[i] : &scratch_d;
        char prefix[96], attn[112];
        snprintf(prefix, sizeof prefix, "decoder.layers.%d", i);
        snprintf(attn, sizeof attn, "%s.self_attn", prefix);
        attention(wk, c, &l->self_attn, attn, dd, true);
        norm(wk, &l->self_attn_layer_norm, prefix, "self_attn_layer_norm", dd);
        snprintf(attn, sizeof attn, "%s.encoder_attn", prefix);
        attention(wk, c, &l->encoder_attn, attn, dd, false);
        norm(wk, &l->encoder_attn_layer_norm, prefix, "encoder_attn_layer_norm", dd);
        if (luna) {
            norm(wk, &l->encoder_atten_proj_layer_norm, prefix, "encoder_atten_proj_layer_norm",
                 dd);
            /* The last layer's P output is unused: its LayerNorm never gets a gradient (§7);
             * with non-contextual P no layer's is used. */
            if (wk->tensors && (i == c->decoder_layers - 1 || c->non_contextual_projection)) {
                wk->tensors[wk->count - 1].has_grad = false;
                wk->tensors[wk->count - 2].has_grad = false;
            }
        }
        linear(wk, &l->fc1, prefix, "fc1", dd, c->decoder_ffn_embed_dim, LIN_FFN);
        linear(wk, &l->fc2, prefix, "fc2", c->decoder_ffn_embed_dim, dd, LIN_FFN);
        norm(wk, &l->final_layer_norm, prefix, "final_layer_norm", dd);
        if (luna && c->non_contextual_projection) {
            projection(wk, w ? &l->projected_embeddings : &dummy, prefix, c, dd);
        }
    }
    if (!c->share_all_embeddings && !c->share_decoder_input_output_embed) {
        visit(wk, w ? &w->output_projection : &dummy, "decoder.output_projection.weight", 2,
              c->vocab_size, dd, LUNA_INIT_NORMAL, 1.0 / sqrt((double)dd), dd, c->vocab_size);
        int8_storable(wk);
    } else if (w)
        w->output_projection = w->decoder_embed_tokens;
}

size_t luna_params_count(const luna_config *config, int *num_tensors) {
    walker wk = {0};
    walk(&wk, config, NULL);
    if (num_tensors) *num_tensors = wk.count;
    return wk.offset;
}

size_t luna_config_num_parameters(const luna_config *c) { return luna_params_count(c, NULL); }

/* ---- create / free / init -------------------------------------------------------------------- */

static luna_status alloc_views(luna_weights *w, const luna_config *c) {
    w->encoder = calloc((size_t)c->encoder_layers, sizeof *w->encoder);
    w->decoder = calloc((size_t)c->decoder_layers, sizeof *w->decoder);
    if (!w->encoder || !w->decoder)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "parameters: out of memory for the views");
    return LUNA_OK;
}

/* init: seeded parameters and gradients; else zero parameters (a checkpoint is loaded next) or,
 * with shared, shared's parameters (not copied) and no gradients. */
static luna_status create(luna_params **out, luna_backend *be, const luna_config *config, bool init,
                          const luna_params *shared) {
    *out = NULL;
    LUNA_TRY(luna_config_validate(config));
    luna_params *p = calloc(1, sizeof *p);
    if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "parameters: out of memory");
    p->config = *config;
    p->be = be;
    luna_status st = LUNA_OK;
    size_t n = luna_params_count(config, &p->num_tensors);
    p->num_params = n;
    p->tensors = calloc((size_t)p->num_tensors, sizeof *p->tensors);
    if (!p->tensors) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "parameters: out of memory");
    if (st == LUNA_OK) st = alloc_views(&p->w, config);
    if (st == LUNA_OK) st = alloc_views(&p->g, config);
    if (st == LUNA_OK && shared) {
        p->data = shared->data;
        p->data_shared = true;
        p->weight_dtype = shared->weight_dtype;
    } else if (st == LUNA_OK) {
        p->data = luna_mem_alloc(be, n * sizeof(float));
        p->grad = init ? luna_mem_alloc(be, n * sizeof(float)) : NULL;
        if (!p->data || (init && !p->grad))
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY,
                            "parameters: cannot allocate %d x %zu bytes on the %s device",
                            init ? 2 : 1, n * sizeof(float), be->name);
    }
    if (st == LUNA_OK) {
        walker wk = {.tensors = p->tensors, .base = p->data};
        walk(&wk, config, &p->w);
        if (p->grad) {
            walker wg = {.base = p->grad};
            walk(&wg, config, &p->g);
            st = luna_params_zero_grad(p);
        }
        if (st == LUNA_OK && init) st = luna_params_init(p, 1);
        if (st == LUNA_OK && !init && !shared) st = luna_mem_zero(be, p->data, n * sizeof(float));
        for (int i = 0; shared && i < p->num_tensors; i++) /* what quantize.h marked */
            p->tensors[i].int8 = shared->tensors[i].int8;
    }
    if (st != LUNA_OK) {
        luna_params_free(p);
        return st;
    }
    *out = p;
    return LUNA_OK;
}

luna_status luna_params_create(luna_params **out, luna_backend *be, const luna_config *config) {
    return create(out, be, config, true, NULL);
}

luna_status luna_params_create_for_inference(luna_params **out, luna_backend *be,
                                             const luna_config *config) {
    return create(out, be, config, false, NULL);
}

luna_status luna_params_create_shared(luna_params **out, luna_backend *be,
                                      const luna_params *shared) {
    return create(out, be, &shared->config, false, shared);
}

void luna_params_free(luna_params *p) {
    if (!p) return;
    if (!p->data_shared) luna_mem_release(p->be, p->data, p->num_params * sizeof(float));
    luna_mem_release(p->be, p->grad, p->num_params * sizeof(float));
    free(p->w.encoder);
    free(p->w.decoder);
    free(p->g.encoder);
    free(p->g.decoder);
    free(p->tensors);
    free(p);
}

luna_status luna_params_init(luna_params *p, uint64_t seed) {
    float *host = malloc(p->num_params * sizeof(float));
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "parameters: out of host memory");
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        float *x = host + t->offset;
        luna_rng_key key = {.seed = seed, .step = 0, .stream_id = LUNA_INIT_STREAM | (uint32_t)i};
        double bound = 0;
        if (t->init == LUNA_INIT_XAVIER)
            bound = t->init_a * sqrt(6.0 / (double)(t->fan_in + t->fan_out));
        if (t->init == LUNA_INIT_UNIFORM_FAN_IN) bound = 1.0 / sqrt((double)t->fan_in);
        for (size_t j = 0; j < t->numel; j++) {
            switch (t->init) {
            case LUNA_INIT_ZERO: x[j] = 0.0f; break;
            case LUNA_INIT_ONE: x[j] = 1.0f; break;
            case LUNA_INIT_NORMAL: x[j] = (float)(t->init_a * luna_rng_normal(key, j)); break;
            case LUNA_INIT_XAVIER:
            case LUNA_INIT_UNIFORM_FAN_IN:
                x[j] = (float)((2.0 * luna_rng_uniform(key, j) - 1.0) * bound);
                break;
            }
        }
    }
    /* fairseq's Embedding(): the padding row of each input table is zero. */
    int d = p->config.encoder_embed_dim;
    memset(host + (size_t)p->config.padding_idx * (size_t)d, 0, (size_t)d * sizeof(float));
    const luna_param_info *dec = luna_params_find(p, "decoder.embed_tokens.weight");
    if (dec)
        memset(host + dec->offset + (size_t)p->config.padding_idx * (size_t)dec->shape[1], 0,
               (size_t)dec->shape[1] * sizeof(float));
    luna_status st = luna_mem_from_host(p->be, p->data, host, p->num_params * sizeof(float));
    free(host);
    return st;
}

luna_status luna_params_zero_grad(luna_params *p) {
    if (!p->grad)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "parameters created for inference have no gradients to zero");
    return luna_mem_zero(p->be, p->grad, p->num_params * sizeof(float));
}

const luna_param_info *luna_params_find(const luna_params *p, const char *name) {
    for (int i = 0; i < p->num_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return &p->tensors[i];
    return NULL;
}

luna_status luna_params_trainable_table(const luna_params *p, luna_tensor_table **out) {
    if (!p || !out)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "params_trainable_table: NULL argument");
    luna_tensor_desc *d = calloc((size_t)p->num_tensors + 1, sizeof *d);
    if (!d) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "parameters: out of host memory");
    int n = 0;
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        if (!t->has_grad) continue;
        d[n] = (luna_tensor_desc){.name = t->name,
                                  .offset = (int64_t)t->offset,
                                  .numel = (int64_t)t->numel,
                                  .ndim = t->ndim,
                                  .shape = {t->shape[0], t->shape[1]}};
        n++;
    }
    luna_status st = luna_tensor_table_create_named(out, p->be, n, d);
    free(d);
    return st;
}

/* ---- checkpoint I/O -------------------------------------------------------------------------- */

luna_status luna_params_save(const luna_params *p, const char *path, const luna_st_metadata *extra,
                             int num_extra) {
    float *host = malloc(p->num_params * sizeof(float));
    luna_st_tensor *list = calloc((size_t)p->num_tensors, sizeof *list);
    luna_st_metadata *meta = calloc((size_t)num_extra + 2, sizeof *meta);
    char *config_json = NULL;
    luna_status st = LUNA_OK;
    if (!host || !list || !meta)
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of host memory for saving", path);
    if (st == LUNA_OK) st = luna_config_to_json(&p->config, &config_json);
    if (st == LUNA_OK) st = luna_mem_to_host(p->be, host, p->data, p->num_params * sizeof(float));
    if (st == LUNA_OK) {
        for (int i = 0; i < p->num_tensors; i++) {
            const luna_param_info *t = &p->tensors[i];
            list[i].name = t->name;
            list[i].dtype = LUNA_F32;
            list[i].ndim = t->ndim;
            list[i].shape[0] = t->shape[0];
            list[i].shape[1] = t->shape[1];
            list[i].data = host + t->offset;
        }
        meta[0].key = "config";
        meta[0].value = config_json;
        meta[1].key = LUNA_LAYERNORM_KEY;
        meta[1].value = "gamma";
        for (int i = 0; i < num_extra; i++)
            meta[i + 2] = extra[i];
        st = luna_safetensors_write(path, list, p->num_tensors, meta, num_extra + 2);
    }
    free(config_json);
    free(meta);
    free(list);
    free(host);
    return st;
}

/* fairseq buffers that a converted official checkpoint may carry. */
static bool buffer_name(const char *name) {
    static const char *const suffixes[] = {".version", "._float_tensor", ".projected_positions"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n >= k && strcmp(name + n - k, suffixes[i]) == 0) return true;
    }
    return false;
}

/* The table an alias name stands for in this configuration, or NULL when `name` is not an alias
 * here (then it must be a parameter of the model or it is an architecture mismatch). */
static const char *alias_target(const luna_config *c, const char *name) {
    if (strcmp(name, "decoder.embed_tokens.weight") == 0)
        return c->share_all_embeddings ? "encoder.embed_tokens.weight" : NULL;
    if (strcmp(name, "decoder.output_projection.weight") == 0) {
        if (c->share_all_embeddings) return "encoder.embed_tokens.weight";
        return c->share_decoder_input_output_embed ? "decoder.embed_tokens.weight" : NULL;
    }
    return NULL;
}

/* An alias must hold exactly the values of the table it aliases: a file whose
 * decoder.embed_tokens.weight differs from encoder.embed_tokens.weight comes from a model with
 * untied embeddings, and loading it as tied would drop the decoder's tables. */
static luna_status check_alias(const luna_safetensors *st, const luna_param_info *target,
                               const char *name) {
    const char *path = luna_safetensors_path(st);
    const luna_st_tensor *a = luna_safetensors_find(st, name);
    const luna_st_tensor *t = luna_safetensors_find(st, target->name);
    if (!t) return LUNA_OK; /* the missing parameter is reported by the load itself */
    if (a->dtype != t->dtype || a->ndim != t->ndim || a->shape[0] != t->shape[0] ||
        (a->ndim > 1 && a->shape[1] != t->shape[1]) || a->nbytes != t->nbytes)
        return luna_error(LUNA_ERR_MISMATCH,
                          "%s: tensor '%s' does not have the dtype and shape of '%s', which it "
                          "aliases in this configuration (untied embeddings? convert the file "
                          "with tools/scripts/convert-checkpoint.py)",
                          path, name, target->name);
    if (memcmp(a->data, t->data, t->nbytes) == 0) return LUNA_OK;
    size_t n = t->nbytes / sizeof(float), row = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        float x, y;
        memcpy(&x, (const char *)a->data + i * sizeof x, sizeof x);
        memcpy(&y, (const char *)t->data + i * sizeof y, sizeof y);
        double d = fabs((double)x - (double)y);
        if (d > worst || isnan(d)) {
            worst = isnan(d) ? INFINITY : d;
            row = i / (size_t)(t->ndim > 1 ? t->shape[1] : 1);
        }
    }
    return luna_error(LUNA_ERR_MISMATCH,
                      "%s: tensor '%s' differs from '%s' (max |difference| %.3g, row %zu) but "
                      "the configuration shares them: the model has untied embeddings; set "
                      "share_all_embeddings (and share_decoder_input_output_embed) false in "
                      "__metadata__.config, as tools/scripts/convert-checkpoint.py does",
                      path, name, target->name, worst, row);
}

/* LayerNorm weights: "gamma" as stored, "gamma_minus_1" + 1. Undeclared (an older luna file) they
 * must look like gains: weights with a mean near 0 are γ − 1 stored without saying so, and a model
 * loaded from them would translate wrongly with no other sign. */
static luna_status layernorm_convention(luna_params *p, const luna_safetensors *st, float *host) {
    const char *path = luna_safetensors_path(st);
    const char *conv = luna_safetensors_metadata(st, LUNA_LAYERNORM_KEY);
    if (conv && strcmp(conv, "gamma") != 0 && strcmp(conv, "gamma_minus_1") != 0)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: __metadata__." LUNA_LAYERNORM_KEY " is \"%s\"; expected \"gamma\" "
                          "or \"gamma_minus_1\"",
                          path, conv);
    double sum = 0;
    size_t count = 0;
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        if (t->init != LUNA_INIT_ONE) continue;
        for (size_t j = 0; j < t->numel; j++) {
            if (conv && strcmp(conv, "gamma_minus_1") == 0) host[t->offset + j] += 1.0f;
            sum += host[t->offset + j];
        }
        count += t->numel;
    }
    double mean = count ? sum / (double)count : 1.0;
    if (!conv && fabs(mean) < 0.5)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: the LayerNorm weights have mean %.3f, as if stored as gamma - 1 "
                          "(fairseq-apollo's 2023 revision), and the file does not say which: "
                          "state it with __metadata__." LUNA_LAYERNORM_KEY " = \"gamma_minus_1\" "
                          "(or \"gamma\"), or convert the .pt with "
                          "tools/scripts/convert-checkpoint.py --source-revision 2023",
                          path, mean);
    return LUNA_OK;
}

luna_status luna_params_load(luna_params *p, const luna_safetensors *st) {
    const char *path = luna_safetensors_path(st);
    for (int i = 0; i < luna_safetensors_count(st); i++) {
        const char *name = luna_safetensors_at(st, i)->name;
        bool param_like = strncmp(name, "encoder.", 8) == 0 || strncmp(name, "decoder.", 8) == 0;
        if (!param_like || luna_params_find(p, name) || buffer_name(name)) continue;
        if (luna_int8_scale_of(p, st, name)) continue; /* an int8 weight's scales */
        const char *target = alias_target(&p->config, name);
        if (!target)
            return luna_error(LUNA_ERR_MISMATCH,
                              "%s: tensor '%s' is not a parameter of this model (architecture "
                              "mismatch: check arch, untie_luna_kv, share_all_embeddings and "
                              "layer counts)",
                              path, name);
        LUNA_TRY(check_alias(st, luna_params_find(p, target), name));
    }
    float *host = malloc(p->num_params * sizeof(float));
    if (!host)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                          "%s: out of host memory for %zu parameters (%.1f GiB)", path,
                          p->num_params, (double)p->num_params * sizeof(float) / (1 << 30));
    luna_dtype weights;
    LUNA_TRY(luna_checkpoint_weight_dtype(st, &weights));
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        const luna_st_tensor *found;
        if (weights == LUNA_I8 && t->int8) { /* int8 values and their scales, dequantized */
            luna_status s = luna_int8_tensor_load(st, t, host + t->offset);
            if (s != LUNA_OK) {
                free(host);
                return s;
            }
            continue;
        }
        luna_status s = luna_safetensors_expect(st, t->name, LUNA_F32, t->ndim, t->shape, &found);
        if (s != LUNA_OK) {
            free(host);
            return s;
        }
        s = luna_safetensors_check_finite(st, found);
        if (s != LUNA_OK) {
            free(host);
            return s;
        }
        memcpy(host + t->offset, found->data, t->numel * sizeof(float));
    }
    luna_status s = layernorm_convention(p, st, host);
    if (s == LUNA_OK) s = luna_mem_from_host(p->be, p->data, host, p->num_params * sizeof(float));
    if (s == LUNA_OK) p->weight_dtype = weights;
    free(host);
    return s;
}

luna_status luna_config_from_safetensors(luna_config *out, const luna_safetensors *st) {
    const char *json = luna_safetensors_metadata(st, "config");
    if (!json)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: no \"config\" in __metadata__ (not a luna checkpoint?)",
                          luna_safetensors_path(st));
    luna_status s = luna_config_from_json(out, json, strlen(json));
    if (s != LUNA_OK) luna_error_prefix("%s: __metadata__.config", luna_safetensors_path(st));
    return s;
}
