/* A parallel corpus in a data-bin: fairseq's LanguagePairDataset over two MMIDIDX datasets, plus
 * the collation of a list of sentence ids into a padded batch.
 *
 * Opening checks what fairseq leaves to crash later: both sides have the same number of
 * sentences, and every token id is inside its dictionary (the error names the .bin file, the
 * sentence index and the byte offset).
 *
 * Batches are RIGHT-padded on both sides (fairseq left-pads sources by default; luna does not):
 *   src_tokens          (B, src_len)  sentence + </s>, then <pad>
 *   src_lengths         (B)
 *   target              (B, tgt_len)  sentence + </s>, then <pad>
 *   prev_output_tokens  (B, tgt_len)  </s> + sentence (fairseq's move_eos_to_beginning), then <pad>
 *   tgt_lengths         (B)
 *   ids                 (B)           sentence indices in the dataset
 * ntokens counts the non-pad target tokens (fairseq's sample["ntokens"]).
 */
#ifndef LUNA_DATA_PAIR_DATASET_H
#define LUNA_DATA_PAIR_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dictionary.h"
#include "data/indexed_dataset.h"
#include "core/status.h"

typedef struct luna_pair_dataset luna_pair_dataset;

/* Open <dir>/<split>.<src>-<tgt>.<lang>.{bin,idx} (or the <tgt>-<src> naming, which fairseq
 * also accepts) with <dir>/dict.<src>.txt and <dir>/dict.<tgt>.txt. */
luna_status luna_pair_dataset_open(luna_pair_dataset **out, const char *dir, const char *split,
                                   const char *src_lang, const char *tgt_lang);

/* Open from explicit prefixes and dictionary files. */
luna_status luna_pair_dataset_open_files(luna_pair_dataset **out, const char *src_prefix,
                                         const char *tgt_prefix, const char *src_dict_path,
                                         const char *tgt_dict_path);
void luna_pair_dataset_free(luna_pair_dataset *ds);

size_t luna_pair_dataset_count(const luna_pair_dataset *ds);
const int32_t *
luna_pair_dataset_src_sizes(const luna_pair_dataset *ds); /* (count), including </s> */
const int32_t *luna_pair_dataset_tgt_sizes(const luna_pair_dataset *ds);
const luna_dictionary *luna_pair_dataset_src_dict(const luna_pair_dataset *ds);
const luna_dictionary *luna_pair_dataset_tgt_dict(const luna_pair_dataset *ds);

/* Find the language pair of a data-bin from its "<split>.<src>-<tgt>.<src>.idx" file names
 * (fairseq's infer_language_pair). *src and *tgt are malloc'ed. */
luna_status luna_data_infer_language_pair(const char *dir, const char *split, char **src,
                                          char **tgt);

typedef struct {
    int32_t batch_size, src_len, tgt_len;
    int32_t *src_tokens, *src_lengths;
    int32_t *target, *prev_output_tokens, *tgt_lengths;
    int64_t *ids;
    int64_t ntokens;
    bool
        repeated; /* a padding batch repeated so that every data-parallel rank has the same count */
    size_t capacity_b_, capacity_src_, capacity_tgt_; /* internal */
} luna_data_batch;

luna_status luna_data_batch_create(luna_data_batch **out);
void luna_data_batch_free(luna_data_batch *b);

/* Collate sentences ids[0..n) into b (reusing its buffers). */
luna_status luna_data_batch_fill(luna_data_batch *b, const luna_pair_dataset *ds,
                                 const uint32_t *ids, size_t n);

#endif
