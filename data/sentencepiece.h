/* A plain C interface to SentencePiece (the C++ library behind it is never visible here).
 *
 * Every entry point catches all C++ exceptions and turns SentencePiece's util::Status into a
 * luna_status with a one-line message. SentencePiece's own logging is silenced (minloglevel).
 *
 * Thread safety: a loaded luna_spm is read-only; encode/decode/queries may be called from many
 * threads at once (luna-preprocess encodes with OpenMP).
 */
#ifndef LUNA_DATA_SENTENCEPIECE_H
#define LUNA_DATA_SENTENCEPIECE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct luna_spm luna_spm;

/* Where training sentences come from: files (one sentence per line) or a callback. */
typedef struct {
    const char *const *input_files; /* n_input_files paths, read line by line */
    size_t n_input_files;
    /* Alternatively (when input_files is NULL): next() returns 1 and sets *line and *len for each
     * sentence, 0 at the end, -1 on error (the callback records the message with luna_error). */
    int (*next)(void *ctx, const char **line, size_t *len);
    void *next_ctx;

    const char *model_prefix;   /* writes <prefix>.model and <prefix>.vocab (atomically) */
    int vocab_size;             /* e.g. 32000 */
    double character_coverage;  /* 1.0 for languages with small alphabets */
    int num_threads;            /* trainer threads (>= 1) */
    const char *model_type;     /* "bpe" (NULL), "unigram", "char", "word" */
    size_t input_sentence_size; /* 0: use every sentence; else a random sample of this many */
    size_t max_sentence_length; /* bytes; longer sentences are skipped by the trainer (0: 4192) */
} luna_spm_train_options;

/* Fills the defaults used by luna-preprocess (BPE, 32000, coverage 1.0, 1 thread). */
void luna_spm_train_options_init(luna_spm_train_options *opts);

luna_status luna_spm_train(const luna_spm_train_options *opts);

/* Load a model file, or a serialized model (the bytes of a .model file, e.g. from a
 * checkpoint). `name` is used in error messages only. */
luna_status luna_spm_load(luna_spm **out, const char *model_path);
luna_status luna_spm_load_from_memory(luna_spm **out, const void *data, size_t size,
                                      const char *name);
void luna_spm_free(luna_spm *spm);

/* The serialized model (the bytes of the .model file); pointer valid while spm lives. */
luna_status luna_spm_serialized(const luna_spm *spm, const void **data, size_t *size);

int32_t luna_spm_vocab_size(const luna_spm *spm);
int32_t luna_spm_unk_id(const luna_spm *spm);
/* Id of a piece; the unknown id when the piece is not in the vocabulary. */
int32_t luna_spm_piece_to_id(const luna_spm *spm, const char *piece, size_t len);
/* Piece of an id (NULL when out of range); valid while spm lives. */
const char *luna_spm_id_to_piece(const luna_spm *spm, int32_t id);

/* The result of encoding one sentence: `count` pieces (NUL-terminated, pointing into one
 * buffer) and their ids. For text the model cannot represent, the piece is the surface text
 * and the id is the unknown id. Reuse one value across calls to avoid reallocation. */
typedef struct {
    size_t count;
    char **pieces;
    int32_t *ids;
    char *storage_; /* internal */
    size_t storage_capacity_, capacity_;
} luna_spm_pieces;

void luna_spm_pieces_init(luna_spm_pieces *p);
void luna_spm_pieces_release(luna_spm_pieces *p);

luna_status luna_spm_encode_pieces(const luna_spm *spm, const char *text, size_t len,
                                   luna_spm_pieces *out);

/* Ids only, into a malloc'ed array. */
luna_status luna_spm_encode_ids(const luna_spm *spm, const char *text, size_t len, int32_t **ids,
                                size_t *n);

/* Detokenize: pieces (or ids) back to text, returned as a malloc'ed NUL-terminated string. */
luna_status luna_spm_decode_pieces(const luna_spm *spm, const char *const *pieces, size_t n,
                                   char **text);
luna_status luna_spm_decode_ids(const luna_spm *spm, const int32_t *ids, size_t n, char **text);

/* Write the vocabulary in SentencePiece's .vocab format ("piece<TAB>score" lines), atomically. */
luna_status luna_spm_save_vocab(const luna_spm *spm, const char *path);

#ifdef __cplusplus
}
#endif

#endif
