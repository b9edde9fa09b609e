#include "decoding/translate_workers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoding/search_internal.h"

typedef struct {
    luna_text_translator *t;
    luna_beam_options o; /* the caller's, with this part's sentence numbers */
    const luna_token_seq *src;
    int n, max_tokens, batch_size;
    luna_nbest *res;
    luna_status st;
    char message[1024]; /* the error, copied from the worker's thread (messages are per thread) */
} worker;

static void *work(void *arg) {
    worker *w = arg;
    w->st = luna_generate(w->t->inc, &w->o, w->src, w->n, w->max_tokens, w->batch_size, w->res,
                          NULL, NULL);
    if (w->st != LUNA_OK) snprintf(w->message, sizeof w->message, "%s", luna_error_message());
    return NULL;
}

luna_status luna_translate_workers_generate(luna_text_translator *const *t, int workers,
                                            const luna_beam_options *o,
                                            const luna_encoded_text *src, int max_tokens,
                                            int batch_size, luna_nbest *out, size_t *searched) {
    if (workers < 1)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "workers: %d (1 or more)", workers);
    if (workers == 1)
        return luna_text_translator_generate(t[0], o, src, max_tokens, batch_size, out, searched);
    const size_t n = src->count;
    *searched = 0;
    memset(out, 0, sizeof *out * n);
    /* seq[k]: the k-th non-blank sentence (input line idx[k]); by[j]: the sorted position j's
     * sentence, given to worker j mod W as its (j / W)-th, with sentence number by[j] */
    luna_token_seq *seq = calloc(n + 1, sizeof *seq), *part = calloc(n + 1, sizeof *part);
    size_t *idx = malloc(sizeof *idx * (n + 1));
    int *ids = malloc(sizeof *ids * (n + 1)), *by = NULL;
    luna_nbest *res = calloc(n + 1, sizeof *res);
    worker *w = calloc((size_t)workers, sizeof *w);
    pthread_t *th = calloc((size_t)workers, sizeof *th);
    bool *started = calloc((size_t)workers, sizeof *started);
    luna_status st = LUNA_OK;
    if (!seq || !part || !idx || !ids || !res || !w || !th || !started)
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n && st == LUNA_OK; i++) {
        if (!src->ids[i]) continue;
        seq[k] = (luna_token_seq){src->ids[i], src->len[i]};
        idx[k++] = i;
    }
    if (st == LUNA_OK) st = luna_search_sorted_order(seq, (int)k, &by);
    /* worker v's part: part / ids / res from offset first(v), sorted positions v, v + W, ... */
    size_t first = 0;
    for (int v = 0; v < workers && st == LUNA_OK; v++) {
        const size_t count = k > (size_t)v ? (k - (size_t)v + workers - 1) / workers : 0;
        for (size_t m = 0; m < count; m++) {
            const int s = by[(size_t)v + m * workers];
            part[first + m] = seq[s];
            ids[first + m] = s;
        }
        w[v] = (worker){.t = t[v],
                        .o = *o,
                        .src = part + first,
                        .n = (int)count,
                        .max_tokens = max_tokens,
                        .batch_size = batch_size,
                        .res = res + first};
        w[v].o.sentence_ids = ids + first;
        first += count;
    }
    for (int v = 1; v < workers && st == LUNA_OK; v++)
        started[v] = w[v].n > 0 && pthread_create(&th[v], NULL, work, &w[v]) == 0;
    if (st == LUNA_OK) work(&w[0]);
    for (int v = 1; v < workers && st == LUNA_OK; v++) {
        if (started[v])
            pthread_join(th[v], NULL);
        else if (w[v].n > 0)
            work(&w[v]); /* no thread for it: on this thread, in turn */
    }
    for (int v = 0; v < workers && st == LUNA_OK; v++)
        if (w[v].st != LUNA_OK) st = luna_error(w[v].st, "%s", w[v].message);
    /* the results back in input order (a failed worker's were released by luna_generate) */
    first = 0;
    for (int v = 0; v < workers && w && by; v++) {
        for (int m = 0; m < w[v].n; m++) {
            luna_nbest *r = &res[first + (size_t)m];
            if (st == LUNA_OK)
                out[idx[ids[first + (size_t)m]]] = *r;
            else
                luna_nbest_release(r);
        }
        first += (size_t)w[v].n;
    }
    if (st == LUNA_OK) *searched = k;
    free(seq), free(part), free(idx), free(ids), free(by), free(res), free(w), free(th);
    free(started);
    return st;
}
