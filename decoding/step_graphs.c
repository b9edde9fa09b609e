/* Decoder steps replayed as graphs (step_graphs.h). A handful of keys live at once (a pool has
 * one shape between readbacks, a few as sentences leave and join); past the capacity the least
 * recently used graph goes. */
#include "decoding/step_graphs.h"

#include <stdlib.h>
#include <string.h>

#define CAPACITY 8

typedef struct {
    luna_step_graph_key key;
    void *graph;   /* captured, or NULL */
    bool used;     /* the entry holds a key */
    bool failed;   /* its capture failed: always eager */
    uint64_t last; /* the run that last used it (least recently used goes) */
} entry;

struct luna_step_graphs {
    luna_backend *be;
    entry e[CAPACITY];
    uint64_t clock;
    int64_t replays, captures, failed;
};

luna_status luna_step_graphs_create(luna_step_graphs **out, luna_backend *be) {
    *out = calloc(1, sizeof **out);
    if (!*out) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "step graphs: out of host memory");
    (*out)->be = be;
    return LUNA_OK;
}

void luna_step_graphs_clear(luna_step_graphs *g) {
    if (!g) return;
    for (int i = 0; i < CAPACITY; i++) {
        luna_graph_free(g->be, g->e[i].graph);
        g->e[i] = (entry){0};
    }
}

void luna_step_graphs_free(luna_step_graphs *g) {
    luna_step_graphs_clear(g);
    free(g);
}

void luna_step_graphs_counts(const luna_step_graphs *g, int64_t *replays, int64_t *captures,
                             int64_t *failed) {
    *replays = g ? g->replays : 0;
    *captures = g ? g->captures : 0;
    *failed = g ? g->failed : 0;
}

/* Keys are compared field by field (a struct's padding is not part of it). */
static bool same_key(const luna_step_graph_key *a, const luna_step_graph_key *b) {
    return a->R == b->R && a->S == b->S && a->one_row == b->one_row && a->k == b->k &&
           a->T == b->T && a->cache_moves == b->cache_moves && a->cache_slots == b->cache_slots &&
           a->tokens == b->tokens && a->top_lp == b->top_lp && a->top_idx == b->top_idx &&
           a->pick == b->pick && a->picked == b->picked && a->bias == b->bias &&
           a->inv_temperature == b->inv_temperature && a->scratch.offset == b->scratch.offset &&
           a->scratch.chunk == b->scratch.chunk &&
           a->scratch.chunk_offset == b->scratch.chunk_offset &&
           a->scratch_generation == b->scratch_generation &&
           a->backend_generation == b->backend_generation;
}

/* The key's entry, or a fresh one for it (the least recently used entry, its graph freed). */
static entry *lookup(luna_step_graphs *g, const luna_step_graph_key *key, bool *found) {
    entry *victim = &g->e[0];
    for (int i = 0; i < CAPACITY; i++) {
        entry *e = &g->e[i];
        if (e->used && same_key(&e->key, key)) {
            *found = true;
            return e;
        }
        if (!e->used || (victim->used && e->last < victim->last)) victim = e;
    }
    luna_graph_free(g->be, victim->graph);
    *victim = (entry){.key = *key, .used = true};
    *found = false;
    return victim;
}

luna_status luna_step_graphs_run(luna_step_graphs *g, const luna_step_graph_key *key,
                                 luna_arena *scratch, luna_status (*run)(void *ctx), void *ctx) {
    bool found;
    entry *e = lookup(g, key, &found);
    e->last = ++g->clock;
    if (e->graph) {
        g->replays++;
        return luna_graph_launch(g->be, e->graph);
    }
    if (!found || e->failed) return run(ctx); /* first sight: eager (and what it makes stays) */
    if (luna_graph_begin(g->be) != LUNA_OK) { /* no capture here: eager, and not again */
        luna_error_clear();
        e->failed = true;
        g->failed++;
        return run(ctx);
    }
    luna_status st = run(ctx);
    void *graph = NULL;
    const luna_status end = luna_graph_end(g->be, &graph);
    if (st == LUNA_OK && end == LUNA_OK) {
        e->graph = graph;
        g->captures++;
        return luna_graph_launch(g->be, graph);
    }
    /* nothing ran: do it eagerly, and do not try this key again */
    luna_graph_free(g->be, graph);
    luna_error_clear();
    e->failed = true;
    g->failed++;
    luna_arena_release(scratch, key->scratch);
    return run(ctx);
}
