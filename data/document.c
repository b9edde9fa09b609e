#include "data/document.h"

#include <stdlib.h>

#include "data/dictionary.h"
#include "data/indexed_dataset.h"

typedef struct {
    luna_indexed_builder *out[2];
    int32_t *buf[2];
    int len[2], cap[2];
    size_t sentences; /* in the current window */
} window;

static luna_status flush(window *w, luna_window_stats *stats) {
    if (!w->sentences) return LUNA_OK;
    for (int s = 0; s < 2; s++) {
        LUNA_TRY(luna_indexed_builder_add(w->out[s], w->buf[s], (size_t)w->len[s]));
        stats->tokens[s] += w->len[s];
        if (w->len[s] > stats->longest[s]) stats->longest[s] = w->len[s];
        w->len[s] = 0;
    }
    stats->windows++;
    w->sentences = 0;
    return LUNA_OK;
}

static luna_status build(luna_indexed_dataset *const in[2], window *w, int32_t sep, int max_tokens,
                         luna_window_stats *stats) {
    const size_t n = luna_indexed_dataset_count(in[0]);
    if (luna_indexed_dataset_count(in[1]) != n)
        return luna_error(LUNA_ERR_MISMATCH, "%s: %zu sentences but %s has %zu",
                          luna_indexed_dataset_bin_path(in[0]), n,
                          luna_indexed_dataset_bin_path(in[1]), luna_indexed_dataset_count(in[1]));
    const int32_t *sizes[2] = {luna_indexed_dataset_sizes(in[0]),
                               luna_indexed_dataset_sizes(in[1])};
    for (size_t i = 0; i < n; i++) {
        if (w->sentences &&
            (w->len[0] + sizes[0][i] > max_tokens || w->len[1] + sizes[1][i] > max_tokens))
            LUNA_TRY(flush(w, stats));
        for (int s = 0; s < 2; s++) {
            const int need = w->len[s] + sizes[s][i];
            if (need > w->cap[s]) {
                int cap = need > 2 * w->cap[s] ? need : 2 * w->cap[s];
                int32_t *b = realloc(w->buf[s], sizeof(int32_t) * (size_t)cap);
                if (!b)
                    return luna_error(LUNA_ERR_OUT_OF_MEMORY, "document windows: out of memory");
                w->buf[s] = b;
                w->cap[s] = cap;
            }
            /* the previous sentence's </s> becomes the separator */
            if (w->sentences && w->len[s] > 0 && w->buf[s][w->len[s] - 1] == LUNA_DICT_EOS)
                w->buf[s][w->len[s] - 1] = sep;
            luna_indexed_dataset_get(in[s], i, w->buf[s] + w->len[s]);
            w->len[s] = need;
        }
        w->sentences++;
        stats->sentences++;
    }
    return flush(w, stats);
}

luna_status luna_document_windows(const char *const in_prefix[2], const char *const out_prefix[2],
                                  int32_t sep, int max_tokens, size_t vocab_size,
                                  luna_window_stats *stats) {
    *stats = (luna_window_stats){0};
    luna_indexed_dataset *in[2] = {NULL, NULL};
    window w = {0};
    luna_status st = LUNA_OK;
    for (int s = 0; s < 2 && st == LUNA_OK; s++) {
        st = luna_indexed_dataset_open(&in[s], in_prefix[s]);
        if (st == LUNA_OK)
            st = luna_indexed_builder_create(&w.out[s], out_prefix[s],
                                             luna_index_best_dtype(vocab_size));
    }
    if (st == LUNA_OK) st = build(in, &w, sep, max_tokens, stats);
    for (int s = 0; s < 2; s++) {
        if (st == LUNA_OK) {
            st = luna_indexed_builder_finish(w.out[s]); /* frees it in every case */
            w.out[s] = NULL;
        }
        luna_indexed_builder_free(w.out[s]);
        luna_indexed_dataset_free(in[s]);
        free(w.buf[s]);
    }
    return st;
}

int luna_document_segments(const int32_t *t, int n, int32_t sep, int *start, int *len) {
    int k = 0;
    start[0] = 0;
    for (int i = 0; i < n; i++)
        if (t[i] == sep) {
            len[k] = i - start[k];
            start[++k] = i + 1;
        }
    len[k] = n - start[k];
    return k + 1;
}
