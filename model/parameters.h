/* Model parameters, llm.c style: every tensor size is computed from the configuration, all
 * parameters live in ONE device allocation and all gradients in another with the same layout, so a
 * checkpoint is one write, an all-reduce one buffer and optimizer sharding a matter of offsets.
 * The buffers are carved into named tensors whose names and order are those of the official
 * PyTorch state_dict (spec §7; fairseq transformer names for the baseline).
 *
 * Also defined here: the per-pass context (`luna_pass`) that every layer's forward/backward
 * receives, and the dropout-site numbering that makes dropout reproducible. */
#ifndef LUNA_PARAMETERS_H
#define LUNA_PARAMETERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/allocator.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/rng.h"
#include "model/safetensors.h"

/* ---- typed views of the parameter (or gradient) buffer --------------------------------------- */

typedef struct {
    float *weight; /* [out, in] */
    float *bias;   /* [out] */
} luna_linear_w;

typedef struct {
    float *weight; /* [d] gain γ */
    float *bias;   /* [d] */
} luna_norm_w;

/* One attention module. Luna tied: pq, q, pc, c, out. Luna untied (bidirectional): pq, q, pk, pv,
 * k, v, out. Causal untied: pq, q, pc, k, v, out. Softmax MHA: k, v, q, out. Absent ones NULL. */
typedef struct {
    luna_linear_w pq_proj, q_proj, pc_proj, c_proj, pk_proj, pv_proj, k_proj, v_proj, out_proj;
} luna_attn_w;

typedef struct {
    luna_attn_w self_attn;
    luna_norm_w self_attn_layer_norm;
    luna_norm_w self_atten_proj_layer_norm; /* Luna only: P's LayerNorm */
    luna_linear_w fc1, fc2;
    luna_norm_w final_layer_norm;
} luna_encoder_layer_w;

typedef struct {
    luna_attn_w self_attn;
    luna_norm_w self_attn_layer_norm;
    luna_attn_w encoder_attn;
    luna_norm_w encoder_attn_layer_norm;
    luna_norm_w encoder_atten_proj_layer_norm; /* Luna only */
    luna_linear_w fc1, fc2;
    luna_norm_w final_layer_norm;
} luna_decoder_layer_w;

typedef struct {
    float *embed_tokens;           /* [V, d] encoder.embed_tokens.weight, shared 3 ways */
    float *projected_embeddings;   /* [l, d] encoder.projected_embeddings (Luna only) */
    luna_encoder_layer_w *encoder; /* [encoder_layers] */
    luna_decoder_layer_w *decoder; /* [decoder_layers] */
} luna_weights;

/* ---- the named-tensor table ------------------------------------------------------------------ */

typedef enum {
    LUNA_INIT_ZERO = 0,
    LUNA_INIT_ONE,
    LUNA_INIT_NORMAL,         /* N(0, a²); for the embedding the padding row is zeroed */
    LUNA_INIT_XAVIER,         /* U(±a·sqrt(6/(fan_in+fan_out))), a = gain */
    LUNA_INIT_UNIFORM_FAN_IN, /* U(±1/sqrt(fan_in)) (PyTorch's default Linear init) */
} luna_init_kind;

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[2];
    size_t offset; /* in floats from the start of the buffer */
    size_t numel;
    luna_init_kind init;
    double init_a;
    int fan_in, fan_out;
    bool has_grad; /* false for the last decoder layer's encoder_atten_proj_layer_norm (§7) */
} luna_param_info;

typedef struct {
    luna_config config;
    luna_backend *be;
    int num_tensors;
    luna_param_info *tensors;
    size_t num_params; /* floats in each buffer */
    float *data;       /* device [num_params] */
    float *grad;       /* device [num_params] */
    luna_weights w;    /* views into data */
    luna_weights g;    /* views into grad, same layout */
} luna_params;

/* Allocates both buffers (parameters initialised with seed 1, gradients zero). */
luna_status luna_params_create(luna_params **out, luna_backend *be, const luna_config *config);
void luna_params_free(luna_params *p);

/* Seeded initialisation per spec §5, computed on the host with luna_rng (stream id per tensor,
 * so every tensor's values depend only on (seed, tensor index)) and copied to the device. */
luna_status luna_params_init(luna_params *p, uint64_t seed);
void luna_params_zero_grad(luna_params *p);
const luna_param_info *luna_params_find(const luna_params *p, const char *name);

/* The layout without allocating: number of tensors and parameters for a configuration. */
size_t luna_params_count(const luna_config *config, int *num_tensors);

/* Checkpoint I/O (safetensors, F32, tensor names of §7). `save` writes the config JSON under
 * metadata key "config" plus `extra` key/values, atomically. `load` requires every parameter
 * with the exact shape and dtype (one-line error naming the file and tensor otherwise); other
 * tensors in the file are ignored except unknown "encoder."/"decoder." parameters, which are an
 * architecture mismatch (fairseq's buffers `version`, `_float_tensor`, `projected_positions` and
 * the tied aliases decoder.embed_tokens.weight / decoder.output_projection.weight are allowed). */
luna_status luna_params_save(const luna_params *p, const char *path, const luna_st_metadata *extra,
                             int num_extra);
luna_status luna_params_load(luna_params *p, const luna_safetensors *st);
/* Read the "config" metadata of a checkpoint. */
luna_status luna_config_from_safetensors(luna_config *out, const luna_safetensors *st);

/* ---- the pass context and dropout sites ------------------------------------------------------ */

typedef struct {
    luna_backend *be;
    luna_arena *arena; /* activations saved by forward; backward temporaries */
    bool training;     /* dropout on */
    uint64_t seed;     /* dropout keys are (seed, step, site) */
    uint64_t step;
    float dropout, attention_dropout, activation_dropout;
} luna_pass;

/* Site ids: component (8 bits) | layer (12 bits) | site within the layer (8 bits). Parameter
 * initialisation uses LUNA_INIT_STREAM | tensor index, which no site reaches. */
#define LUNA_SITE(component, layer, k)                                                             \
    (((uint32_t)(component) << 20) | ((uint32_t)(layer) << 8) | (uint32_t)(k))
#define LUNA_INIT_STREAM 0x80000000u
enum {
    LUNA_SITE_ENCODER_EMBED = 1,
    LUNA_SITE_PROJECTED_EMBED,
    LUNA_SITE_DECODER_EMBED,
    LUNA_SITE_ENCODER_LAYER,
    LUNA_SITE_DECODER_LAYER,
};
/* Within a layer: attention modules use k in [0, 8) (self) and [8, 16) (cross); the layer's own
 * sites (residual dropouts, FFN) start at 16. */
#define LUNA_SITE_SELF_ATTN 0
#define LUNA_SITE_CROSS_ATTN 8
#define LUNA_SITE_LAYER 16

static inline luna_rng_key luna_pass_key(const luna_pass *ps, uint32_t site) {
    luna_rng_key k = {.seed = ps->seed, .step = ps->step, .stream_id = site};
    return k;
}

/* Dropout with probability p at `site`, in place allowed; a no-op copy (or nothing when y == x)
 * when !training or p == 0. The backward regenerates the same mask. */
luna_status luna_pass_dropout(const luna_pass *ps, float *y, const float *x, int64_t n, float p,
                              uint32_t site);
luna_status luna_pass_dropout_backward(const luna_pass *ps, float *dx, const float *dy, int64_t n,
                                       float p, uint32_t site);
static inline bool luna_pass_drops(const luna_pass *ps, float p) { return ps->training && p > 0; }

/* Arena allocation of `count` floats / int32s, with an out-of-memory error naming `what`. */
luna_status luna_pass_alloc(const luna_pass *ps, float **out, int64_t count, const char *what);
luna_status luna_pass_alloc_i32(const luna_pass *ps, int32_t **out, int64_t count,
                                const char *what);

#endif
