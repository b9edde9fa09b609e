/* int8 models: a checkpoint whose Linear weights (attention projections, Luna's pack/unpack
 * projections, FFN) and embedding tables (the shared embedding / output projection) are stored as
 * int8 with fp32 per-output-channel (per-row) scales; biases, LayerNorms, P and everything else
 * stay fp32. The quantization is core/quantize.h's (symmetric, scale = max|row| / 127).
 *
 * In the file (model/checkpoint.h):
 *   __metadata__ "quantization" = "int8"   (absent: an fp32 checkpoint; another value: an error)
 *   NAME            I8  [out, in]          for each such tensor (luna_param_info.int8)
 *   NAME "_scale"   F32 [out]              its scales, finite and ≥ 0
 * Loading dequantizes into the fp32 parameter buffer (w = q·scale) and marks the parameters
 * LUNA_I8 (luna_params.weight_dtype), so decoding holds the weights as int8 and the CPU backend
 * multiplies in int8 (core/backend.h, hold_weights); quantizing those values again is lossless
 * (core/quantize.h), so saving an int8 model writes the same q and scales back. Training refuses
 * an int8 checkpoint (trainer/train_state.c). */
#ifndef LUNA_MODEL_QUANTIZE_H
#define LUNA_MODEL_QUANTIZE_H

#include <stdbool.h>

#include "core/safetensors.h"
#include "model/param_table.h"

#define LUNA_QUANTIZATION_KEY "quantization"
#define LUNA_INT8_SCALE_SUFFIX "_scale"

/* The weights' dtype a checkpoint declares: LUNA_F32 (no key) or LUNA_I8 ("int8"); an unknown
 * value is an error naming the file. */
luna_status luna_checkpoint_weight_dtype(const luna_safetensors *st, luna_dtype *out);

/* Whether `name` is the scale tensor of one of p's int8 tensors in an int8 file. */
bool luna_int8_scale_of(const luna_params *p, const luna_safetensors *st, const char *name);

/* Reads tensor t (I8, its shape) and its scales (F32 [rows], finite, ≥ 0) from st and writes
 * q·scale into dst [numel] (host). One-line errors name the file and the tensor. */
luna_status luna_int8_tensor_load(const luna_safetensors *st, const luna_param_info *t, float *dst);

/* Quantizes p's int8 tensors in place (w ← q·scale) and marks p LUNA_I8: the model an int8
 * checkpoint of p would load as (luna-translate --quantize int8). A no-op when p is int8. */
luna_status luna_params_quantize_int8(luna_params *p);

/* The tensors to save for p from host [num_params] (its parameters copied to the host): fp32
 * tensors as they are, and for an int8 model the int8 tensors and their scales. *list [*count]
 * points into host and into *storage (free both with free()). */
luna_status luna_params_save_list(const luna_params *p, const float *host, luna_st_tensor **list,
                                  int *count, void **storage);

#endif
