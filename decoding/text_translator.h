/* The text-to-text translation pipeline shared by luna-translate and the public C API
 * (decoding/api/luna.h): load a checkpoint with its SentencePiece model and dictionaries, check
 * and encode sentences, translate (luna_generate) or score given translations
 * (luna_score_targets), and turn hypotheses back into text. Output formats and option parsing stay
 * with the callers.
 *
 * Sentences: a blank line (only spaces, tabs, CR, VT, FF) encodes to nothing and gets an empty
 * translation without being searched. Raw text goes through the checkpoint's SentencePiece model;
 * `pieces` input (and any input for a checkpoint without one, trained with --no-spm) is split on
 * spaces and tabs and looked up in the dictionary, and hypotheses come back as space-separated
 * pieces. Documents: for a dictionary with <sep> (luna-preprocess --document-window), a line
 * "s1 <sep> s2 ..." is encoded as s1 <sep> s2 ... </s>, and its hypothesis text is one line per
 * source sentence, joined by '\n' (missing ones empty, extra ones joined to the last line).
 */
#ifndef LUNA_DECODING_TEXT_TRANSLATOR_H
#define LUNA_DECODING_TEXT_TRANSLATOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "data/checkpoint_vocab.h"
#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "decoding/beam_search.h"
#include "decoding/incremental.h"
#include "model/checkpoint.h"
#include "model/kernels/registry.h"

/* ---- text input ------------------------------------------------------------------------------ */

/* A whole text file (or stdin) as checked lines: line[i] is NUL-terminated, len[i] bytes, without
 * its '\n' (and a '\r' before it). */
typedef struct {
    char *data;
    size_t count;
    char **line;
    size_t *len;
} luna_text_input;

/* Read `path` (NULL: stdin) and check every line (luna_text_check_line); errors name the file and
 * line. */
luna_status luna_text_input_read(const char *path, luna_text_input *t);
void luna_text_input_release(luna_text_input *t);

/* A sentence luna can translate: well-formed UTF-8 without NUL bytes. Errors read
 * "<name>:<lineno>: <problem> (<what to do>)". */
luna_status luna_text_check_line(const char *name, size_t lineno, const char *s, size_t n);

bool luna_text_blank(const char *s, size_t n);

/* ---- the translator -------------------------------------------------------------------------- */

typedef struct luna_text_translator luna_text_translator;
struct luna_text_translator {
    luna_backend *be;
    luna_seq2seq *model;
    luna_dictionary *src_dict, *tgt_dict;
    luna_spm *spm; /* NULL: the checkpoint has none (input is tokenized) */
    luna_checkpoint_meta meta;
    luna_incremental *inc;
    /* how it was made (luna_text_translator_clone makes another the same way) */
    char *checkpoint, *device;
    luna_backend_options bo;
    bool quantize_int8;
    /* a clone: the translator whose model, vocabulary and meta it reads (NULL: its own) */
    luna_text_translator *origin;
    atomic_int refs; /* an origin: its owner's reference and one per clone alive */
};

/* Load `checkpoint` (written by luna-train or luna-average: it must carry its dictionaries) on a
 * new backend `device` with options `bo`; quantize_int8: its weights quantized to int8 at load
 * (model/quantize.h, CPU only), before the decoder holds them. */
luna_status luna_text_translator_create(luna_text_translator **out, const char *checkpoint,
                                        const char *device, const luna_backend_options *bo,
                                        bool quantize_int8);
/* Another translator of src's model, for another thread: its own backend (src's device and
 * options) and decoder state. On the CPU it shares src's weights, their held copies (the packed
 * panels or int8 values: model/kernels/registry.h), vocabulary and SentencePiece model instead
 * of loading them again: an extra translator costs its decoder state, not another model. A device
 * backend loads the checkpoint again. Either may be freed first, and both may translate at once
 * on different threads (each translator is one thread's at a time). */
luna_status luna_text_translator_clone(luna_text_translator **out, luna_text_translator *src);
void luna_text_translator_free(luna_text_translator *t);

/* Encoded sentences: ids[i] (len[i] tokens, ending with </s>), NULL for a blank sentence. */
typedef struct {
    size_t count;
    int32_t **ids;
    int *len;
    bool *truncated; /* cut to max_input_tokens */
} luna_encoded_text;

/* Called for each sentence longer than max_input_tokens (before it is cut). */
typedef void (*luna_truncate_warning)(void *ctx, const char *name, size_t lineno, int tokens,
                                      int max_input_tokens);

/* Encode lines[0..n) (len[i] bytes each) with dictionary `d` (the source or the target one):
 * pieces or raw text (module comment). max_input_tokens > 0: longer sentences (</s> included)
 * are cut to that many tokens (warn, if not NULL, says so first), and a Linformer model's
 * source limit is checked; 0: neither (targets). Errors are prefixed "<name>:<lineno>". */
luna_status luna_text_translator_encode(const luna_text_translator *t, const luna_dictionary *d,
                                        const char *const *lines, const size_t *len, size_t n,
                                        bool pieces, int max_input_tokens, const char *name,
                                        luna_truncate_warning warn, void *warn_ctx,
                                        luna_encoded_text *out);
void luna_encoded_text_release(luna_encoded_text *e);

/* Translate the non-blank sentences of src (luna_generate, batched by max_tokens / batch_size);
 * out [src->count]: the n-best lists in input order, count 0 for blank sentences (released by
 * the caller with luna_nbest_release). *searched: the number of non-blank sentences. */
luna_status luna_text_translator_generate(luna_text_translator *t, const luna_beam_options *o,
                                          const luna_encoded_text *src, int max_tokens,
                                          int batch_size, luna_nbest *out, size_t *searched);

/* Teacher-forced per-token log-probs (nats) of tgt given src (same count): positional [count],
 * malloc'ed arrays of tgt->len[i] values, NULL where either side is blank. *scored: the number
 * of scored pairs. */
luna_status luna_text_translator_score(luna_text_translator *t, const luna_encoded_text *src,
                                       const luna_encoded_text *tgt, int max_tokens, int batch_size,
                                       float **positional, size_t *scored);

/* Tokens (without </s>) of dictionary `d` as text: detokenized, or space-separated pieces when
 * `pieces` or the checkpoint has no SentencePiece model. *out is malloc'ed. */
luna_status luna_text_translator_detokenize(const luna_text_translator *t, const luna_dictionary *d,
                                            const int32_t *tokens, int n, bool pieces, char **out);

/* A hypothesis of source src_ids[0..src_len) (NULL: none) as text: detokenized without its
 * </s>, a document's sentences joined by '\n' (module comment). *out is malloc'ed. */
luna_status luna_text_translator_hypothesis_text(const luna_text_translator *t,
                                                 const int32_t *src_ids, int src_len,
                                                 const luna_hypothesis *h, bool pieces, char **out);

/* Hypothesis tokens without the final </s>. */
static inline int luna_hypothesis_body_len(const int32_t *tokens, int n) {
    return n > 0 && tokens[n - 1] == LUNA_DICT_EOS ? n - 1 : n;
}

#endif
