/* The public C API (decoding/api/luna.h) over the translation pipeline
 * (decoding/text_translator.h): argument checks, a mutex per handle, and results in the API's
 * own types (base-2 scores, as luna-translate prints them). */
#include "decoding/api/luna.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "decoding/text_translator.h"
#include "decoding/translate_workers.h"
#include "model/kernels/cpu/backend_cpu.h"

/* The API's codes are luna_status's, so a status converts by value. */
_Static_assert((int)LUNA_API_ERR_INTERNAL == (int)LUNA_ERR_INTERNAL &&
                   (int)LUNA_API_ERR_INVALID_ARGUMENT == (int)LUNA_ERR_INVALID_ARGUMENT &&
                   (int)LUNA_API_ERR_UNSUPPORTED == (int)LUNA_ERR_UNSUPPORTED,
               "luna_api_status mirrors luna_status");

#define MAX_WORKERS 1024

struct luna_translator {
    pthread_mutex_t lock; /* one translate/score call at a time (the decoder state is shared) */
    luna_text_translator *tr;
    /* luna_translator_set_workers: workers[0] = tr and its clones; NULL (one worker): tr */
    luna_text_translator **workers;
    int num_workers;
};

static luna_api_status api(luna_status st) { return (luna_api_status)st; }

const char *luna_version(void) { return LUNA_VERSION; }

const char *luna_last_error(void) { return luna_error_message(); }

const char *luna_blas_core(void) { return luna_cpu_blas_loaded_core(); }

/* ---- the translator -------------------------------------------------------------------------- */

void luna_translator_options_init(luna_translator_options *o) {
    *o = (luna_translator_options){
        .device = "cpu", .device_id = -1, .threads = 2, .precision = "auto", .tf32 = 0};
}

luna_api_status luna_translator_create(luna_translator **out, const char *checkpoint,
                                       const luna_translator_options *opts) {
    if (!out)
        return api(luna_error(LUNA_ERR_INVALID_ARGUMENT, "luna_translator_create: out is NULL"));
    *out = NULL;
    if (!checkpoint)
        return api(luna_error(LUNA_ERR_INVALID_ARGUMENT, "luna_translator_create: no checkpoint"));
    luna_translator_options o;
    luna_translator_options_init(&o);
    if (opts) o = *opts;
    if (!o.device) o.device = "cpu";
    if (!o.precision) o.precision = "auto";
    if (o.threads < 1 || o.threads > 1024)
        return api(luna_error(LUNA_ERR_INVALID_ARGUMENT, "threads must be in 1..1024 (got %d)",
                              o.threads));
    const char *missing = luna_backend_missing(o.device);
    if (missing)
        return api(
            luna_error(LUNA_ERR_UNSUPPORTED, "device %s: %s; use device cpu", o.device, missing));
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = o.threads;
    luna_status st =
        luna_backend_options_set_precision(&bo, o.device, o.precision, o.tf32 != 0, false);
    if (st == LUNA_OK) st = luna_backend_options_set_device_id(&bo, o.device, o.device_id);
    if (st != LUNA_OK) return api(st);
    luna_translator *t = calloc(1, sizeof *t);
    if (!t) return api(luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory"));
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t);
        return api(luna_error(LUNA_ERR_INTERNAL, "cannot create the translator's mutex"));
    }
    st = luna_text_translator_create(&t->tr, checkpoint, o.device, &bo, false);
    if (st != LUNA_OK) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return api(st);
    }
    *out = t;
    return LUNA_API_OK;
}

luna_api_status luna_translator_clone(luna_translator **out, luna_translator *t) {
    if (!out)
        return api(luna_error(LUNA_ERR_INVALID_ARGUMENT, "luna_translator_clone: out is NULL"));
    *out = NULL;
    if (!t) return api(luna_error(LUNA_ERR_INVALID_ARGUMENT, "luna_translator_clone: t is NULL"));
    luna_translator *c = calloc(1, sizeof *c);
    if (!c) return api(luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory"));
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return api(luna_error(LUNA_ERR_INTERNAL, "cannot create the translator's mutex"));
    }
    pthread_mutex_lock(&t->lock); /* t's backend is not touched by two threads at once */
    const luna_status st = luna_text_translator_clone(&c->tr, t->tr);
    pthread_mutex_unlock(&t->lock);
    if (st != LUNA_OK) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return api(st);
    }
    *out = c;
    return LUNA_API_OK;
}

luna_api_status luna_translator_set_workers(luna_translator *t, int workers) {
    if (!t)
        return api(luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "luna_translator_set_workers: the translator is NULL"));
    if (workers < 1 || workers > MAX_WORKERS)
        return api(luna_error(LUNA_ERR_INVALID_ARGUMENT, "workers must be in 1..%d (got %d)",
                              MAX_WORKERS, workers));
    if (workers > 1 && strcmp(t->tr->device, "cpu") != 0)
        return api(luna_error(LUNA_ERR_UNSUPPORTED,
                              "workers: %d on device %s (more than one worker is for the CPU; "
                              "create a translator per GPU stream instead)",
                              workers, t->tr->device));
    pthread_mutex_lock(&t->lock);
    luna_status st = LUNA_OK;
    const int had = t->workers ? t->num_workers : 1;
    luna_text_translator **w =
        realloc(t->workers, sizeof *w * (size_t)(workers > had ? workers : had));
    if (!w) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == LUNA_OK) {
        t->workers = w;
        w[0] = t->tr;
        t->num_workers = had;
        for (int i = workers; i < had; i++)
            luna_text_translator_free(w[i]);
        if (workers < had) t->num_workers = workers;
        for (; t->num_workers < workers && st == LUNA_OK; t->num_workers++)
            if ((st = luna_text_translator_clone(&w[t->num_workers], t->tr)) != LUNA_OK) break;
    }
    pthread_mutex_unlock(&t->lock);
    return api(st); /* on failure the workers made so far stay */
}

void luna_translator_free(luna_translator *t) {
    if (!t) return;
    for (int i = 1; t->workers && i < t->num_workers; i++)
        luna_text_translator_free(t->workers[i]);
    free(t->workers);
    luna_text_translator_free(t->tr);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int luna_translator_has_spm(const luna_translator *t) { return t && t->tr->spm != NULL; }

/* ---- options --------------------------------------------------------------------------------- */

void luna_search_options_init(luna_search_options *o) {
    luna_beam_options b;
    luna_beam_options_init(&b);
    *o = (luna_search_options){.beam = 4,
                               .lenpen = 0.6,
                               .max_len_a = b.max_len_a,
                               .max_len_b = b.max_len_b,
                               .max_target_positions = 1024,
                               .min_len = b.min_len,
                               .nbest = 1,
                               .unkpen = b.unkpen,
                               .no_repeat_ngram_size = b.no_repeat_ngram_size,
                               .temperature = b.temperature,
                               .sampling = 0,
                               .sampling_topk = -1,
                               .seed = 1,
                               .max_input_tokens = 1024,
                               .max_tokens = 6000,
                               .batch_size = 128,
                               .pieces = 0};
}

#define BAD(...) luna_error(LUNA_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* luna-translate's option checks, naming the fields. */
static luna_status check_options(const luna_search_options *o) {
    if (o->beam < 1 || o->beam > 1024) return BAD("beam must be in 1..1024 (got %d)", o->beam);
    if (o->nbest < 1 || o->nbest > o->beam)
        return BAD("nbest must be between 1 and beam (%d; got %d)", o->beam, o->nbest);
    if (o->min_len < 0 || o->max_len_b < 0 || !(o->max_len_a >= 0))
        return BAD("min_len, max_len_a and max_len_b must not be negative");
    if (o->max_tokens < 0 || o->batch_size < 0)
        return BAD("max_tokens and batch_size must not be negative (0: no limit)");
    if (o->max_input_tokens < 2)
        return BAD("max_input_tokens must be at least 2 (got %d)", o->max_input_tokens);
    if (o->max_target_positions < 2)
        return BAD("max_target_positions must be at least 2 (got %d)", o->max_target_positions);
    if (!(o->temperature > 0) || isinf(o->temperature))
        return BAD("temperature must be positive and finite (got %g)", o->temperature);
    if (!isfinite(o->lenpen) || !isfinite(o->unkpen) || isinf(o->max_len_a))
        return BAD("lenpen, unkpen and max_len_a must be finite");
    if (o->no_repeat_ngram_size < 0)
        return BAD("no_repeat_ngram_size must not be negative (0: off)");
    if (o->sampling_topk < -1)
        return BAD("sampling_topk must be -1 or 0 (whole vocabulary) or positive");
    if (o->sampling_topk > 0 && !o->sampling) return BAD("sampling_topk needs sampling");
    return LUNA_OK;
}

static luna_beam_options beam_options(const luna_search_options *s) {
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.beam = s->beam;
    o.lenpen = s->lenpen;
    o.max_len_a = s->max_len_a;
    o.max_len_b = s->max_len_b;
    o.max_len_cap = s->max_target_positions - 1;
    o.min_len = s->min_len;
    o.nbest = s->nbest;
    o.unkpen = s->unkpen;
    o.no_repeat_ngram_size = s->no_repeat_ngram_size;
    o.temperature = s->temperature;
    o.sampling = s->sampling != 0;
    o.sampling_topk = s->sampling_topk;
    o.seed = (uint64_t)s->seed;
    return o;
}

/* Check the text arguments, fill len[count] and encode them. */
static luna_status encode_input(const luna_text_translator *tr, const luna_dictionary *d,
                                const char *name, const char *const *text, const size_t *lengths,
                                size_t count, const luna_search_options *o, bool truncate,
                                luna_encoded_text *out) {
    memset(out, 0, sizeof *out);
    if (!text && count > 0) return BAD("%s: NULL array of %zu strings", name, count);
    if (count > (size_t)INT_MAX / 2)
        return BAD("%zu sentences in one call: at most %d", count, INT_MAX / 2);
    size_t *len = malloc(sizeof *len * (count + 1));
    if (!len) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_status st = LUNA_OK;
    for (size_t i = 0; i < count && st == LUNA_OK; i++) {
        if (!text[i]) {
            st = BAD("%s %zu is NULL", name, i + 1);
            break;
        }
        len[i] = lengths ? lengths[i] : strlen(text[i]);
        st = luna_text_check_line(name, i + 1, text[i], len[i]);
    }
    if (st == LUNA_OK)
        st = luna_text_translator_encode(tr, d, text, len, count, o->pieces != 0,
                                         truncate ? o->max_input_tokens : 0, name, NULL, NULL, out);
    free(len);
    return st;
}

/* ---- translating ----------------------------------------------------------------------------- */

void luna_translations_free(luna_translation *r, size_t count) {
    for (size_t i = 0; r && i < count; i++) {
        for (int k = 0; r[i].hypotheses && k < r[i].num_hypotheses; k++) {
            free(r[i].hypotheses[k].text);
            free(r[i].hypotheses[k].token_scores);
        }
        free(r[i].hypotheses);
    }
    free(r);
}

static luna_status fill_translation(const luna_text_translator *tr, const luna_encoded_text *src,
                                    size_t i, const luna_nbest *nb, bool pieces,
                                    luna_translation *r) {
    r->truncated = src->truncated[i];
    const int n = nb->count > 0 ? nb->count : 1;
    r->hypotheses = calloc((size_t)n, sizeof *r->hypotheses);
    if (!r->hypotheses) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    r->num_hypotheses = n;
    if (nb->count == 0) { /* blank input, or no hypothesis completed: luna-translate's -inf */
        r->hypotheses[0].score = -INFINITY;
        r->hypotheses[0].text = calloc(1, 1);
        return r->hypotheses[0].text ? LUNA_OK
                                     : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        const luna_hypothesis *h = &nb->hyps[k];
        luna_hypothesis_result *o = &r->hypotheses[k];
        /* rounded through float as luna-translate prints it */
        o->score = (float)(h->score / M_LN2);
        o->num_tokens = h->len;
        o->token_scores = malloc(sizeof(float) * (size_t)(h->len + 1));
        if (!o->token_scores) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        for (int t = 0; t < h->len; t++)
            o->token_scores[t] = (float)(h->positional_scores[t] / M_LN2);
        LUNA_TRY(luna_text_translator_hypothesis_text(tr, src->ids[i], src->len[i], h, pieces,
                                                      &o->text));
    }
    return LUNA_OK;
}

luna_api_status luna_translator_translate_batch(luna_translator *t, const char *const *sentences,
                                                const size_t *lengths, size_t count,
                                                const luna_search_options *opts,
                                                luna_translation **results) {
    if (!results) return api(BAD("luna_translator_translate_batch: results is NULL"));
    *results = NULL;
    if (!t) return api(BAD("luna_translator_translate_batch: the translator is NULL"));
    luna_search_options o;
    luna_search_options_init(&o);
    if (opts) o = *opts;
    if (check_options(&o) != LUNA_OK) return api(LUNA_ERR_INVALID_ARGUMENT);
    luna_translation *r = calloc(count + 1, sizeof *r);
    luna_nbest *nb = calloc(count + 1, sizeof *nb);
    luna_encoded_text src = {0};
    luna_status st = LUNA_OK;
    if (!r || !nb) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_lock(&t->lock);
    if (st == LUNA_OK)
        st = encode_input(t->tr, t->tr->src_dict, "sentence", sentences, lengths, count, &o, true,
                          &src);
    size_t searched = 0;
    luna_beam_options b = beam_options(&o);
    if (st == LUNA_OK && t->num_workers > 1)
        st = luna_translate_workers_generate(t->workers, t->num_workers, &b, &src, o.max_tokens,
                                             o.batch_size, nb, &searched);
    else if (st == LUNA_OK)
        st = luna_text_translator_generate(t->tr, &b, &src, o.max_tokens, o.batch_size, nb,
                                           &searched);
    pthread_mutex_unlock(&t->lock);
    for (size_t i = 0; i < count && st == LUNA_OK; i++)
        st = fill_translation(t->tr, &src, i, &nb[i], o.pieces != 0, &r[i]);
    for (size_t i = 0; nb && i < count; i++)
        luna_nbest_release(&nb[i]);
    free(nb);
    luna_encoded_text_release(&src);
    if (st != LUNA_OK) {
        luna_translations_free(r, count);
        return api(st);
    }
    *results = r;
    return LUNA_API_OK;
}

/* ---- scoring --------------------------------------------------------------------------------- */

void luna_score_results_free(luna_score_result *r, size_t count) {
    for (size_t i = 0; r && i < count; i++)
        free(r[i].token_scores);
    free(r);
}

luna_api_status luna_translator_score_batch(luna_translator *t, const char *const *sources,
                                            const size_t *source_lengths,
                                            const char *const *targets,
                                            const size_t *target_lengths, size_t count,
                                            const luna_search_options *opts,
                                            luna_score_result **results) {
    if (!results) return api(BAD("luna_translator_score_batch: results is NULL"));
    *results = NULL;
    if (!t) return api(BAD("luna_translator_score_batch: the translator is NULL"));
    luna_search_options o;
    luna_search_options_init(&o);
    if (opts) o = *opts;
    if (o.max_tokens < 0 || o.batch_size < 0)
        return api(BAD("max_tokens and batch_size must not be negative (0: no limit)"));
    if (o.max_input_tokens < 2)
        return api(BAD("max_input_tokens must be at least 2 (got %d)", o.max_input_tokens));
    luna_score_result *r = calloc(count + 1, sizeof *r);
    float **pos = calloc(count + 1, sizeof *pos);
    luna_encoded_text src = {0}, tgt = {0};
    luna_status st = LUNA_OK;
    if (!r || !pos) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_lock(&t->lock);
    if (st == LUNA_OK)
        st = encode_input(t->tr, t->tr->src_dict, "source", sources, source_lengths, count, &o,
                          true, &src);
    if (st == LUNA_OK)
        st = encode_input(t->tr, t->tr->tgt_dict, "target", targets, target_lengths, count, &o,
                          false, &tgt);
    size_t scored = 0;
    if (st == LUNA_OK)
        st =
            luna_text_translator_score(t->tr, &src, &tgt, o.max_tokens, o.batch_size, pos, &scored);
    pthread_mutex_unlock(&t->lock);
    for (size_t i = 0; i < count && st == LUNA_OK; i++) {
        if (!pos[i]) continue; /* a blank source or target: score 0, as luna-translate */
        const int len = tgt.len[i];
        double sum = 0;
        r[i].token_scores = malloc(sizeof(float) * (size_t)len);
        if (!r[i].token_scores) {
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        for (int k = 0; k < len; k++) {
            sum += pos[i][k];
            r[i].token_scores[k] = (float)(pos[i][k] / M_LN2);
        }
        r[i].num_tokens = len;
        r[i].score = (float)(sum / len / M_LN2);
    }
    for (size_t i = 0; pos && i < count; i++)
        free(pos[i]);
    free(pos);
    luna_encoded_text_release(&src);
    luna_encoded_text_release(&tgt);
    if (st != LUNA_OK) {
        luna_score_results_free(r, count);
        return api(st);
    }
    *results = r;
    return LUNA_API_OK;
}
