#include "data/binarizer.h"

#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/indexed_dataset.h"

/* Lines per chunk: large enough to keep every thread busy, small enough that the ids of one
 * chunk stay in cache-friendly per-thread arenas. */
#define CHUNK_LINES 16384

/* ---- whitespace splitting (Python str.split semantics) ----------------------------------------
 */

/* Python's str.isspace() code points (_PyUnicode_IsWhitespace). */
static bool is_unicode_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decode one code point at s[i] (input is validated UTF-8; a malformed byte decodes as itself
 * and is never whitespace). Returns its length in bytes. */
static size_t decode(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c < 0x80 || i + len > n || c < 0xC0) {
        *cp = c < 0x80 ? c : 0xFFFD;
        return 1;
    }
    uint32_t v = c & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; k++)
        v = (v << 6) | (s[i + k] & 0x3F);
    *cp = v;
    return len;
}

void luna_split_whitespace(const char *str, size_t n,
                           void (*emit)(void *ctx, const char *w, size_t len), void *ctx) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, start = 0;
    bool in_word = false;
    while (i < n) {
        uint32_t cp;
        size_t len = decode(s, n, i, &cp);
        if (is_unicode_space(cp)) {
            if (in_word) emit(ctx, str + start, i - start);
            in_word = false;
        } else if (!in_word) {
            in_word = true;
            start = i;
        }
        i += len;
    }
    if (in_word) emit(ctx, str + start, n - start);
}

/* ---- per-thread workers -----------------------------------------------------------------------
 */

typedef struct {
    const luna_dictionary *dict; /* binarize mode */
    luna_dictionary *counter;    /* count mode */
    int32_t *ids;                /* arena of this chunk's ids */
    size_t nids, cap;
    int64_t unknown;
    luna_status status;
    luna_spm_pieces pieces;
} worker;

typedef struct {
    int thread;
    size_t offset, n; /* ids of this line in workers[thread].ids */
} line_slot;

static void push_id(worker *w, int32_t id) {
    if (w->status != LUNA_OK) return;
    if (w->nids == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 65536;
        int32_t *ids = realloc(w->ids, cap * sizeof *ids);
        if (!ids) {
            w->status = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory binarizing");
            return;
        }
        w->ids = ids;
        w->cap = cap;
    }
    w->ids[w->nids++] = id;
}

static void take_piece(worker *w, const char *p, size_t len, bool unknown) {
    if (w->counter) {
        if (!unknown && w->status == LUNA_OK)
            w->status = luna_dictionary_add(w->counter, p, len, 1, false, NULL);
        return;
    }
    int32_t id = unknown ? LUNA_DICT_UNK : luna_dictionary_index(w->dict, p, len);
    /* fairseq's `replaced` counter: words mapped to <unk> that were not literally "<unk>". */
    if (id == LUNA_DICT_UNK && !(len == 5 && memcmp(p, "<unk>", 5) == 0)) w->unknown++;
    push_id(w, id);
}

static void emit_word(void *ctx, const char *p, size_t len) { take_piece(ctx, p, len, false); }

static void process_line(const luna_tokenizer *tok, worker *w, const char *s, size_t n) {
    if (tok->spm) {
        luna_status st = luna_spm_encode_pieces(tok->spm, s, n, &w->pieces);
        if (st != LUNA_OK) {
            w->status = st;
            return;
        }
        int32_t unk = luna_spm_unk_id(tok->spm);
        for (size_t k = 0; k < w->pieces.count; k++)
            take_piece(w, w->pieces.pieces[k], strlen(w->pieces.pieces[k]),
                       w->pieces.ids[k] == unk);
    } else {
        luna_split_whitespace(s, n, emit_word, w);
    }
    if (w->counter) {
        if (w->status == LUNA_OK)
            w->status = luna_dictionary_add(w->counter, "</s>", 4, 1, false, NULL);
    } else {
        push_id(w, LUNA_DICT_EOS); /* append_eos=True */
    }
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run process_line over all lines chunk by chunk; after each chunk, `consume` (if any) gets the
 * lines in order. Worker errors are raised on worker threads, whose luna_error message is
 * thread-local, so the first one is copied out under a critical section. */
typedef luna_status (*consume_fn)(void *ctx, worker *workers, const line_slot *slots, size_t first,
                                  size_t n, const uint8_t *skip);

static luna_status run(const luna_tokenizer *tok, const luna_text_lines *text, const uint8_t *skip,
                       worker *workers, consume_fn consume, void *ctx) {
    int nthreads = tok->num_threads > 0 ? tok->num_threads : 1;
    line_slot *slots = malloc(CHUNK_LINES * sizeof *slots);
    if (!slots) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", text->path);
    luna_status status = LUNA_OK;
    char message[1024] = "";
    for (size_t first = 0; first < text->count && status == LUNA_OK; first += CHUNK_LINES) {
        size_t n = text->count - first < CHUNK_LINES ? text->count - first : CHUNK_LINES;
        for (int t = 0; t < nthreads; t++)
            workers[t].nids = 0;
#pragma omp parallel num_threads(nthreads)
        {
            worker *w = &workers[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 64)
            for (size_t k = 0; k < n; k++) {
                size_t i = first + k;
                slots[k] = (line_slot){omp_get_thread_num(), w->nids, 0};
                if ((skip && skip[i]) || w->status != LUNA_OK) continue;
                size_t len;
                const char *s = luna_text_line(text, i, &len);
                process_line(tok, w, s, len);
                slots[k].n = w->nids - slots[k].offset;
                if (w->status != LUNA_OK) {
#pragma omp critical(luna_binarizer_error)
                    if (message[0] == '\0')
                        snprintf(message, sizeof message, "%s:%zu: %s", text->path, i + 1,
                                 luna_error_message());
                }
            }
        }
        for (int t = 0; t < nthreads; t++)
            if (workers[t].status != LUNA_OK && status == LUNA_OK) status = workers[t].status;
        if (status != LUNA_OK) luna_error(status, "%s", message);
        if (status == LUNA_OK && consume) status = consume(ctx, workers, slots, first, n, skip);
    }
    free(slots);
    return status;
}

static worker *workers_create(int nthreads) {
    worker *w = calloc((size_t)nthreads, sizeof *w);
    for (int t = 0; w && t < nthreads; t++)
        luna_spm_pieces_init(&w[t].pieces);
    return w;
}

static void workers_free(worker *w, int nthreads) {
    if (!w) return;
    for (int t = 0; t < nthreads; t++) {
        luna_spm_pieces_release(&w[t].pieces);
        free(w[t].ids);
        luna_dictionary_free(w[t].counter);
    }
    free(w);
}

luna_status luna_count_tokens(const luna_tokenizer *tok, const luna_text_lines *text,
                              const uint8_t *skip, luna_dictionary *counts) {
    int nthreads = tok->num_threads > 0 ? tok->num_threads : 1;
    worker *w = workers_create(nthreads);
    luna_status st = w ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    for (int t = 0; st == LUNA_OK && t < nthreads; t++)
        st = luna_dictionary_create(&w[t].counter);
    if (st == LUNA_OK) st = run(tok, text, skip, w, NULL, NULL);
    /* Counts are sums, and finalize() orders by (count, symbol), so the merge order (and thus the
     * thread count) cannot change the resulting dictionary. */
    for (int t = 0; st == LUNA_OK && t < nthreads; t++)
        st = luna_dictionary_merge_counts(counts, w[t].counter);
    workers_free(w, nthreads);
    return st;
}

typedef struct {
    luna_indexed_builder *builder;
    luna_binarize_stats *stats;
} binarize_ctx;

static luna_status write_chunk(void *pctx, worker *workers, const line_slot *slots, size_t first,
                               size_t n, const uint8_t *skip) {
    binarize_ctx *ctx = pctx;
    for (size_t k = 0; k < n; k++) {
        if (skip && skip[first + k]) continue;
        const line_slot *sl = &slots[k];
        LUNA_TRY(
            luna_indexed_builder_add(ctx->builder, workers[sl->thread].ids + sl->offset, sl->n));
        ctx->stats->sentences++;
        ctx->stats->tokens += (int64_t)sl->n;
    }
    return LUNA_OK;
}

luna_status luna_binarize(const luna_tokenizer *tok, const luna_text_lines *text,
                          const uint8_t *skip, const luna_dictionary *dict, const char *prefix,
                          luna_binarize_stats *stats) {
    double t0 = now_seconds();
    memset(stats, 0, sizeof *stats);
    int nthreads = tok->num_threads > 0 ? tok->num_threads : 1;
    worker *w = workers_create(nthreads);
    luna_status st = w ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    for (int t = 0; w && t < nthreads; t++)
        w[t].dict = dict;
    luna_indexed_builder *builder = NULL;
    if (st == LUNA_OK)
        st = luna_indexed_builder_create(&builder, prefix,
                                         luna_index_best_dtype((size_t)luna_dictionary_size(dict)));
    binarize_ctx ctx = {builder, stats};
    if (st == LUNA_OK) st = run(tok, text, skip, w, write_chunk, &ctx);
    if (st == LUNA_OK) {
        st = luna_indexed_builder_finish(builder);
        builder = NULL;
    }
    luna_indexed_builder_free(builder);
    for (int t = 0; w && t < nthreads; t++)
        stats->unknown += w[t].unknown;
    workers_free(w, nthreads);
    stats->seconds = now_seconds() - t0;
    return st;
}
