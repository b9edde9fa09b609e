/* The vocabulary of a luna checkpoint (model/checkpoint.h writes it as metadata text): the source
 * and target dictionaries (__metadata__.src_dict / tgt_dict, the text of dict.<lang>.txt) and the
 * SentencePiece model (__metadata__.spm_model, base64). The data layer parses them; the model
 * layer only carries them. */
#ifndef LUNA_DATA_CHECKPOINT_VOCAB_H
#define LUNA_DATA_CHECKPOINT_VOCAB_H

#include "core/safetensors.h"
#include "core/status.h"
#include "data/dictionary.h"
#include "data/sentencepiece.h"

/* The dictionaries stored in the checkpoint (either output pointer may be NULL). Their sizes are
 * checked against the model's vocabulary size (vocab_size <= 0: not checked). */
luna_status luna_checkpoint_read_dicts(const luna_safetensors *st, int vocab_size,
                                       luna_dictionary **src_dict, luna_dictionary **tgt_dict);

/* The SentencePiece model stored in the checkpoint; *spm = NULL when there is none. */
luna_status luna_checkpoint_read_spm(const luna_safetensors *st, luna_spm **spm);

/* Open `path` and read both (any output may be NULL). On failure nothing is allocated. */
luna_status luna_checkpoint_load_vocab(const char *path, int vocab_size, luna_dictionary **src_dict,
                                       luna_dictionary **tgt_dict, luna_spm **spm);

#endif
