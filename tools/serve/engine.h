/* What luna-serve translates with: one translator of the public C API (decoding/api/luna.h)
 * loaded from a checkpoint, seen through the few calls the server needs. Only the batcher's
 * worker thread calls serve_engine_translate, so the translator never has two callers. */
#ifndef LUNA_SERVE_ENGINE_H
#define LUNA_SERVE_ENGINE_H

#include <stddef.h>

#include "core/status.h"
#include "tools/serve/request.h"

typedef struct {
    char *text;   /* detokenized (or pieces, for a request with "pieces") */
    double score; /* the hypothesis score of luna-translate's fairseq output (base 2) */
} serve_hypothesis;

typedef struct {
    serve_hypothesis *hyps; /* best first; none for a blank sentence */
    int count;
} serve_translation;

void serve_translation_release(serve_translation *t);

typedef struct serve_engine serve_engine;

typedef struct {
    const char *checkpoint, *device;
    int threads;
    int max_input_tokens; /* longer sentences are cut, as luna-translate's --max-input-tokens */
    int batch_sentences;  /* at most this many sentences in one search (luna-translate's
                             --batch-size; 0: no limit) */
} serve_engine_options;

luna_status serve_engine_create(serve_engine **out, const serve_engine_options *o);
/* Another engine like e for another worker (luna_translator_clone: on the CPU, the same copy of
 * the model). */
luna_status serve_engine_clone(serve_engine **out, serve_engine *e);
void serve_engine_free(serve_engine *e);

/* Source tokens of a sentence (for batching; an estimate is enough). */
size_t serve_engine_cost(serve_engine *e, const char *sentence, size_t len, bool pieces);

/* Translate sentences[0..n) with the search options; out [n] (released by the caller).
 * *target_tokens: tokens of the best hypotheses, </s> included (for the throughput metric). */
luna_status serve_engine_translate(serve_engine *e, const serve_search *s,
                                   const char *const *sentences, const size_t *lengths, size_t n,
                                   serve_translation *out, size_t *target_tokens);

#endif
