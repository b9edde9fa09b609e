/* Text → token ids, in parallel: the work of fairseq-preprocess's Binarizer, plus the
 * SentencePiece step that fairseq leaves to a separate spm_encode run.
 *
 * A tokenizer turns a line into pieces: SentencePiece pieces when a model is given, otherwise
 * the line split on whitespace exactly like fairseq's tokenize_line (Python's str.split(), i.e.
 * Unicode whitespace), for text that is already BPE'd.
 *
 * Lines are processed in chunks; inside a chunk the lines are spread over OpenMP threads and the
 * results are written in line order, so the output does not depend on the thread count.
 */
#ifndef LUNA_DATA_BINARIZER_H
#define LUNA_DATA_BINARIZER_H

#include <stdint.h>

#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "data/text_lines.h"
#include "core/status.h"

typedef struct {
    const luna_spm *spm; /* NULL: split on whitespace (already tokenized text) */
    int num_threads;     /* >= 1 */
} luna_tokenizer;

/* Add the pieces of every line not marked in skip (skip may be NULL) to `counts` (a dictionary
 * used as a counter, as fairseq's add_file_to_dictionary does). Pieces SentencePiece cannot
 * represent (unknown id) are not counted: they become <unk>. One </s> per line is counted on the
 * special symbol, as fairseq does (it does not appear in the saved file). */
luna_status luna_count_tokens(const luna_tokenizer *tok, const luna_text_lines *text,
                              const uint8_t *skip, luna_dictionary *counts);

typedef struct {
    int64_t sentences;
    int64_t tokens;  /* including the </s> appended to every sentence, as fairseq counts */
    int64_t unknown; /* tokens replaced by <unk> */
    double seconds;
} luna_binarize_stats;

/* Encode every line not marked in skip, map pieces through dict (unknown → <unk>), append </s>,
 * and write <prefix>.bin/.idx with the dtype fitting the dictionary size. */
luna_status luna_binarize(const luna_tokenizer *tok, const luna_text_lines *text,
                          const uint8_t *skip, const luna_dictionary *dict, const char *prefix,
                          luna_binarize_stats *stats);

/* Split on whitespace like Python's str.split(): calls emit(ctx, piece, len) for each word. */
void luna_split_whitespace(const char *s, size_t n,
                           void (*emit)(void *ctx, const char *w, size_t len), void *ctx);

#endif
