/* Checkpoint files: ONE safetensors file that is enough to translate (and, for training
 * checkpoints, to resume bit-exactly).
 *
 * Tensors:
 *   - every model parameter under its spec §7 name (F32, shapes as the PyTorch state_dict);
 *   - training checkpoints only: the optimizer state, "optimizer.<kind>.<param>" (F32).
 * __metadata__ (all values are strings, as safetensors requires):
 *   "format"          "luna-checkpoint-1"
 *   "config"          luna_config_to_json (model/config.h)
 *   "src_dict"        the source dictionary TEXT, exactly as dict.<src>.txt
 *   "tgt_dict"        the target dictionary text
 *   "spm_model"       base64 of the SentencePiece .model bytes ("" when the data-bin had none)
 *   "source_lang", "target_lang"
 *   "training_state"  JSON object (training checkpoints; "" or absent otherwise): num_updates,
 *                     epoch, iterator_offset, best_loss, patience_counter, seed, lr_scheduler,
 *                     optimizer, args, luna_version, ... (written and read by
 *                     trainer/train_state.c)
 *   "quantization"    "int8" for an int8 model (its Linear weights and embeddings as I8 tensors
 * with F32 "<name>_scale" per-row scales: model/quantize.h); absent for fp32
 *
 * The vocabulary travels as opaque text/bytes here (the model layer does not parse it); the data
 * layer turns it into dictionaries and a SentencePiece model (data/checkpoint_vocab.h).
 *
 * Writing is atomic (temporary sibling, fsync, rename): a failed write (e.g. disk full) leaves
 * the previous file intact. Reading validates the whole file (truncation, offsets, shapes) and
 * reports one line naming the file.
 */
#ifndef LUNA_MODEL_CHECKPOINT_H
#define LUNA_MODEL_CHECKPOINT_H

#include <stddef.h>

#include "core/backend.h"
#include "model/config.h"
#include "model/param_table.h"
#include "core/safetensors.h"
#include "core/status.h"

#define LUNA_CHECKPOINT_FORMAT "luna-checkpoint-1"

/* Everything saved besides the model parameters. */
typedef struct {
    const char *source_lang, *target_lang;
    const char *src_dict_text, *tgt_dict_text; /* dictionaries as dict.<lang>.txt text */
    const void *spm_model; /* the bytes of spm.model; NULL (or size 0) when there is none */
    size_t spm_model_size;
    const char *training_state; /* JSON object text, or NULL for an inference-only checkpoint */
    /* Extra tensors in HOST memory (e.g. the optimizer state), written after the parameters. */
    const luna_st_tensor *extra_tensors;
    int num_extra_tensors;
} luna_checkpoint_contents;

/* Write `path` atomically: params (copied from the device) + contents. */
luna_status luna_checkpoint_save(const char *path, const luna_params *params,
                                 const luna_checkpoint_contents *contents);

/* The metadata of a checkpoint, decoded. Strings are malloc'ed (release frees them). */
typedef struct {
    luna_config config;
    char *source_lang, *target_lang;
    char *training_state; /* JSON text; NULL when the checkpoint has none */
} luna_checkpoint_meta;

void luna_checkpoint_meta_release(luna_checkpoint_meta *meta);

/* Open and validate a checkpoint: the safetensors structure (truncation etc.), the "format" key
 * and the presence of the required metadata keys. */
luna_status luna_checkpoint_open(luna_safetensors **out, const char *path);

/* Decode config, languages and training state of an opened checkpoint. */
luna_status luna_checkpoint_read_meta(const luna_safetensors *st, luna_checkpoint_meta *meta);

/* Inference loader: builds the model described by the checkpoint on `be` and loads its
 * parameters (optimizer tensors are ignored). meta may be NULL when not wanted. On failure
 * nothing is allocated. Free with luna_seq2seq_free / luna_checkpoint_meta_release. The
 * vocabulary: data/checkpoint_vocab.h. */
typedef struct luna_seq2seq luna_seq2seq;
luna_status luna_checkpoint_load_model(const char *path, luna_backend *be, luna_seq2seq **model,
                                       luna_checkpoint_meta *meta);

#endif
