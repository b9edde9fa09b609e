/* Device work replayed as graphs (graph_cache.h). */
#include "core/graph_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MODE_EAGER, MODE_CAPTURE, MODE_REPLAY };

typedef struct {
    luna_graph_key key;
    void *graph[LUNA_GRAPH_SEGMENTS]; /* captured segments */
    bool used;                        /* the entry holds a key */
    bool seen;                        /* its first run was eager: the next one captures */
    bool complete;                    /* every segment captured in one call: replays */
    bool failed;                      /* a capture failed: always eager */
    uint64_t last;                    /* the call that last used it (least recently used goes) */
    unsigned char *data;
} entry;

struct luna_graph_cache {
    luna_backend *be;
    int capacity, segments;
    size_t data_bytes;
    entry *e;
    uint64_t clock;
    int64_t replays, captures, failed;
    char why[256]; /* the last failed capture's error */
};

void luna_graph_key_add(luna_graph_key *k, uint64_t v) {
    if (k->n >= LUNA_GRAPH_KEY_WORDS) {
        k->overflow = true;
        return;
    }
    k->w[k->n++] = v;
}

void luna_graph_key_add_words(luna_graph_key *k, const uint64_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        luna_graph_key_add(k, v[i]);
}

void luna_graph_key_add_ptrs(luna_graph_key *k, const void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        luna_graph_key_add(k, (uint64_t)(uintptr_t)p[i]);
}

void luna_graph_key_add_f32s(luna_graph_key *k, const float *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof bits);
        luna_graph_key_add(k, bits);
    }
}

void luna_graph_key_add_arena(luna_graph_key *k, const luna_arena *a) {
    const luna_arena_mark m = luna_arena_get_mark(a);
    luna_graph_key_add(k, (uint64_t)m.offset);
    luna_graph_key_add(k, (uint64_t)(int64_t)m.chunk);
    luna_graph_key_add(k, (uint64_t)m.chunk_offset);
    luna_graph_key_add(k, luna_arena_generation(a));
}

void luna_graph_key_add_backend(luna_graph_key *k, luna_backend *be) {
    luna_graph_key_add(k, luna_arena_generation(be->scratch));
    luna_graph_key_add(k, luna_graph_state(be));
}

static bool same_key(const luna_graph_key *a, const luna_graph_key *b) {
    return !a->overflow && !b->overflow && a->n == b->n &&
           memcmp(a->w, b->w, (size_t)a->n * sizeof a->w[0]) == 0;
}

static void drop_graphs(luna_graph_cache *c, entry *e) {
    /* a graph still running is freed when it completes (cudaGraphExecDestroy) */
    for (int s = 0; s < LUNA_GRAPH_SEGMENTS; s++) {
        luna_graph_free(c->be, e->graph[s]);
        e->graph[s] = NULL;
    }
    e->complete = false;
}

luna_status luna_graph_cache_create(luna_graph_cache **out, luna_backend *be, int capacity,
                                    int segments, size_t data_bytes) {
    *out = NULL;
    if (capacity < 1 || segments < 1 || segments > LUNA_GRAPH_SEGMENTS)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "graph cache: %d entries of %d segments",
                          capacity, segments);
    luna_graph_cache *c = calloc(1, sizeof *c);
    if (c) c->e = calloc((size_t)capacity, sizeof *c->e);
    bool ok = c && c->e;
    for (int i = 0; ok && data_bytes > 0 && i < capacity; i++)
        ok = (c->e[i].data = calloc(1, data_bytes)) != NULL;
    if (!ok) {
        luna_graph_cache_free(c);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "graph cache: out of host memory");
    }
    c->be = be;
    c->capacity = capacity;
    c->segments = segments;
    c->data_bytes = data_bytes;
    *out = c;
    return LUNA_OK;
}

void luna_graph_cache_clear(luna_graph_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->capacity; i++) {
        entry *e = &c->e[i];
        drop_graphs(c, e);
        unsigned char *data = e->data;
        *e = (entry){.data = data};
    }
}

void luna_graph_cache_free(luna_graph_cache *c) {
    if (!c) return;
    if (c->e) {
        luna_graph_cache_clear(c);
        for (int i = 0; i < c->capacity; i++)
            free(c->e[i].data);
        free(c->e);
    }
    free(c);
}

void luna_graph_cache_counts(const luna_graph_cache *c, int64_t *replays, int64_t *captures,
                             int64_t *failed) {
    *replays = c ? c->replays : 0;
    *captures = c ? c->captures : 0;
    *failed = c ? c->failed : 0;
}

const char *luna_graph_cache_failure(const luna_graph_cache *c) {
    return c && c->failed ? c->why : NULL;
}

void luna_graph_call_begin(luna_graph_call *call, luna_graph_cache *c, const luna_graph_key *key) {
    int found = -1, victim = 0;
    for (int i = 0; i < c->capacity && found < 0; i++) {
        const entry *e = &c->e[i], *v = &c->e[victim];
        if (e->used && same_key(&e->key, key))
            found = i;
        else if (!e->used || (v->used && e->last < v->last))
            victim = i;
    }
    *call = (luna_graph_call){.cache = c, .entry = found >= 0 ? found : victim, .mode = MODE_EAGER};
    entry *e = &c->e[call->entry];
    e->last = ++c->clock;
    if (found < 0) { /* first sight (or a key that cannot match): eager */
        drop_graphs(c, e);
        unsigned char *data = e->data;
        *e = (entry){.key = *key, .used = !key->overflow, .last = c->clock, .data = data};
        return;
    }
    if (e->failed) return;
    if (e->complete) {
        call->mode = MODE_REPLAY;
        return;
    }
    drop_graphs(c, e); /* a capture that did not finish (an error between segments) */
    call->mode = MODE_CAPTURE;
}

bool luna_graph_call_replays(const luna_graph_call *call) { return call->mode == MODE_REPLAY; }

void *luna_graph_call_data(const luna_graph_call *call) { return call->cache->e[call->entry].data; }

/* The capture of the call's segment failed (or could not begin): the entry runs eagerly from
 * now on, this call's remaining segments too. */
static void capture_failed(luna_graph_call *call, entry *e) {
    snprintf(call->cache->why, sizeof call->cache->why, "%s", luna_error_message());
    luna_error_clear();
    drop_graphs(call->cache, e);
    e->failed = true;
    call->cache->failed++;
    call->mode = MODE_EAGER;
}

luna_status luna_graph_call_segment(luna_graph_call *call, int segment, luna_arena *arena,
                                    luna_status (*run)(void *ctx), void *ctx) {
    luna_graph_cache *c = call->cache;
    entry *e = &c->e[call->entry];
    if (segment < 0 || segment >= c->segments)
        return luna_error(LUNA_ERR_INTERNAL, "graph cache: segment %d of %d", segment, c->segments);
    if (call->mode == MODE_REPLAY) {
        c->replays++;
        return luna_graph_launch(c->be, e->graph[segment]);
    }
    if (call->mode == MODE_EAGER) return run(ctx);
    const luna_arena_mark mark = luna_arena_get_mark(arena);
    if (luna_graph_begin(c->be) != LUNA_OK) {
        capture_failed(call, e);
        return run(ctx);
    }
    const luna_status st = run(ctx);
    void *graph = NULL;
    const luna_status end = luna_graph_end(c->be, &graph);
    if (st != LUNA_OK || end != LUNA_OK) { /* nothing ran: do it eagerly */
        luna_graph_free(c->be, graph);
        capture_failed(call, e);
        luna_arena_release(arena, mark);
        return run(ctx);
    }
    e->graph[segment] = graph;
    c->captures++;
    if (segment == c->segments - 1) e->complete = true;
    return luna_graph_launch(c->be, graph);
}
