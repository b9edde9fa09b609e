/* The parameter table, llm.c style: every tensor size is computed from the configuration, all
 * parameters live in ONE device allocation and all gradients in another with the same layout, so a
 * checkpoint is one write, an all-reduce one buffer and optimizer sharding a matter of offsets.
 * The buffers are carved into named tensors whose names and order are those of the official
 * PyTorch state_dict (spec §7; fairseq transformer names for the baseline). Communication sees
 * the flat buffers, the optimizer the trainable tensors as a tensor table
 * (luna_params_trainable_table); layers use the typed views (model/weights.h). */
#ifndef LUNA_MODEL_PARAM_TABLE_H
#define LUNA_MODEL_PARAM_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/safetensors.h"
#include "core/tensor_table.h"
#include "model/config.h"
#include "model/weights.h"

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
    bool int8;     /* a Linear weight or an embedding table: int8 in an int8 model (quantize.h) */
} luna_param_info;

typedef struct {
    luna_config config;
    luna_backend *be;
    int num_tensors;
    luna_param_info *tensors;
    size_t num_params; /* floats in each buffer */
    float *data;       /* device [num_params] */
    float *grad;       /* device [num_params] */
    /* LUNA_F32, or LUNA_I8 for an int8 model (model/quantize.h): its Linear weights and
     * embeddings are int8 values times per-row scales, held dequantized in `data`, and decoding
     * holds them as int8 (hold_weights) */
    luna_dtype weight_dtype;
    bool data_shared; /* data belongs to another table (luna_params_create_shared) */
    luna_weights w;   /* views into data */
    luna_weights g;   /* views into grad, same layout */
} luna_params;

/* Allocates both buffers (parameters initialised with seed 1, gradients zero). */
luna_status luna_params_create(luna_params **out, luna_backend *be, const luna_config *config);
/* For inference (a caller that loads the parameters next, from a checkpoint): the parameters
 * zero instead of initialised (the seeded initialisation's time saved) and no gradient buffer
 * (grad NULL, g's views NULL: half the memory); backward passes need luna_params_create. */
luna_status luna_params_create_for_inference(luna_params **out, luna_backend *be,
                                             const luna_config *config);
/* For more decoders of one model (translators on several threads): the parameters of `shared`,
 * not copied (data is shared->data, read only; it is not freed with this table, and `shared` must
 * outlive it), its int8 marks and weight dtype, no gradients. be: a backend of the same device. */
luna_status luna_params_create_shared(luna_params **out, luna_backend *be,
                                      const luna_params *shared);
void luna_params_free(luna_params *p);

/* Seeded initialisation per spec §5, computed on the host with luna_rng (stream id per tensor,
 * so every tensor's values depend only on (seed, tensor index)) and copied to the device. */
luna_status luna_params_init(luna_params *p, uint64_t seed);
luna_status luna_params_zero_grad(luna_params *p);
const luna_param_info *luna_params_find(const luna_params *p, const char *name);
/* The tensors with has_grad, in parameter order, as a named tensor table over `data` and `grad`
 * (core/tensor_table.h): how the trainer hands the optimizer what to update. */
luna_status luna_params_trainable_table(const luna_params *p, luna_tensor_table **out);

/* The layout without allocating: number of tensors and parameters for a configuration. */
size_t luna_params_count(const luna_config *config, int *num_tensors);

/* The __metadata__ key recording how LayerNorm weights are stored: "gamma" (the gain itself, as
 * the Luna-era official code and luna write it) or "gamma_minus_1" (fairseq-apollo's 2023
 * revision stores γ − 1 under the same names; luna adds 1 when loading such a file). */
#define LUNA_LAYERNORM_KEY "layernorm_weight"

/* Checkpoint I/O (safetensors, F32, tensor names of §7). `save` writes the config JSON under
 * metadata key "config", LUNA_LAYERNORM_KEY "gamma" and `extra` key/values, atomically. `load`
 * requires every parameter with the exact shape and dtype (one-line error naming the file and
 * tensor otherwise); other tensors in the file are ignored except unknown "encoder."/"decoder."
 * parameters, which are an architecture mismatch. Allowed extras: fairseq's buffers `version`,
 * `_float_tensor`, `projected_positions`, and the aliases decoder.embed_tokens.weight /
 * decoder.output_projection.weight when the configuration shares that table — then the alias
 * must equal the table it aliases exactly (an untied model read as tied is an error naming both
 * tensors, not a silent drop). LayerNorm weights: converted per LUNA_LAYERNORM_KEY (an unknown
 * value is an error); without the key, a mean LayerNorm weight near 0 is an error (γ − 1 stored
 * without saying so). */
luna_status luna_params_save(const luna_params *p, const char *path, const luna_st_metadata *extra,
                             int num_extra);
luna_status luna_params_load(luna_params *p, const luna_safetensors *st);
/* Read the "config" metadata of a checkpoint. */
luna_status luna_config_from_safetensors(luna_config *out, const luna_safetensors *st);

#endif
