/* luna-serve's engine on the public C API (engine.h). */
#include "tools/serve/engine.h"

#include <stdlib.h>
#include <string.h>

#include "luna.h"

struct serve_engine {
    luna_translator *translator;
    serve_engine_options options;
    bool has_spm;
};

void serve_translation_release(serve_translation *t) {
    for (int i = 0; t->hyps && i < t->count; i++)
        free(t->hyps[i].text);
    free(t->hyps);
    memset(t, 0, sizeof *t);
}

/* The API's status as the library's own (same order of kinds; the message is the API's). */
static luna_status failed(luna_api_status s, const char *what) {
    static const luna_status kinds[] = {
        LUNA_OK,          LUNA_ERR_INVALID_ARGUMENT, LUNA_ERR_OUT_OF_MEMORY,
        LUNA_ERR_IO,      LUNA_ERR_FORMAT,           LUNA_ERR_MISMATCH,
        LUNA_ERR_NUMERIC, LUNA_ERR_UNSUPPORTED,      LUNA_ERR_INTERNAL};
    const luna_status k =
        (unsigned)s < sizeof kinds / sizeof kinds[0] ? kinds[s] : LUNA_ERR_INTERNAL;
    return luna_error(k == LUNA_OK ? LUNA_ERR_INTERNAL : k, "%s%s", what, luna_last_error());
}

luna_status serve_engine_create(serve_engine **out, const serve_engine_options *o) {
    serve_engine *e = calloc(1, sizeof *e);
    if (!e) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory for the engine");
    luna_translator_options to;
    luna_translator_options_init(&to);
    to.device = o->device;
    to.threads = o->threads;
    luna_api_status s = luna_translator_create(&e->translator, o->checkpoint, &to);
    if (s != LUNA_API_OK) {
        free(e);
        return failed(s, "");
    }
    e->options = *o;
    e->has_spm = luna_translator_has_spm(e->translator) != 0;
    *out = e;
    return LUNA_OK;
}

luna_status serve_engine_clone(serve_engine **out, serve_engine *e) {
    serve_engine *c = calloc(1, sizeof *c);
    if (!c) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory for the engine");
    luna_api_status s = luna_translator_clone(&c->translator, e->translator);
    if (s != LUNA_API_OK) {
        free(c);
        return failed(s, "");
    }
    c->options = e->options;
    c->has_spm = e->has_spm;
    *out = c;
    return LUNA_OK;
}

void serve_engine_free(serve_engine *e) {
    if (!e) return;
    luna_translator_free(e->translator);
    free(e);
}

/* The API does not expose its tokenizer, so the cost is estimated from the text: pieces (and
 * text for a checkpoint without SentencePiece) are space-separated tokens; SentencePiece BPE
 * text averages about four bytes per token on European languages. Either way plus </s>. */
size_t serve_engine_cost(serve_engine *e, const char *sentence, size_t len, bool pieces) {
    if (pieces || !e->has_spm) {
        size_t words = 0;
        for (size_t i = 0; i < len; i++)
            words += sentence[i] != ' ' && (i == 0 || sentence[i - 1] == ' ');
        return words + 1;
    }
    return len / 4 + 2;
}

luna_status serve_engine_translate(serve_engine *e, const serve_search *s,
                                   const char *const *sentences, const size_t *lengths, size_t n,
                                   serve_translation *out, size_t *target_tokens) {
    *target_tokens = 0;
    luna_search_options o;
    luna_search_options_init(&o);
    o.beam = s->beam_size;
    o.lenpen = s->length_penalty;
    o.max_len_b = s->max_length;
    o.nbest = s->num_hypotheses;
    o.pieces = s->pieces;
    o.max_input_tokens = e->options.max_input_tokens;
    o.batch_size = e->options.batch_sentences;
    luna_translation *res = NULL;
    luna_api_status st =
        luna_translator_translate_batch(e->translator, sentences, lengths, n, &o, &res);
    if (st != LUNA_API_OK) return failed(st, "");
    luna_status ret = LUNA_OK;
    for (size_t i = 0; i < n; i++) {
        const luna_translation *r = &res[i];
        out[i].hyps = calloc((size_t)r->num_hypotheses + 1, sizeof *out[i].hyps);
        if (!out[i].hyps) {
            ret = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory for the translations");
            break;
        }
        for (int h = 0; h < r->num_hypotheses; h++, out[i].count++) {
            const luna_hypothesis_result *hr = &r->hypotheses[h];
            out[i].hyps[h].score = hr->score;
            out[i].hyps[h].text = strdup(hr->text ? hr->text : "");
            if (!out[i].hyps[h].text) {
                ret = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory for the translations");
                break;
            }
        }
        if (ret != LUNA_OK) break;
        if (r->num_hypotheses > 0) *target_tokens += (size_t)r->hypotheses[0].num_tokens;
    }
    luna_translations_free(res, n);
    if (ret != LUNA_OK)
        for (size_t i = 0; i < n; i++)
            serve_translation_release(&out[i]);
    return ret;
}
