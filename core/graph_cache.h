/* Device work replayed as graphs (core/backend.h: luna_graph_begin ... luna_graph_free), keyed by
 * what its launches depend on.
 *
 * Work that launches the same kernels with the same arguments every time its shape stands (a
 * decoder step of a pool of rows, a training micro-batch of one shape) is captured once and then
 * replayed with one launch per segment; what changes between runs (tokens, positions, the
 * dropout step) is in device memory, uploaded before. The key holds everything else the launches
 * depend on: sizes, the buffers read and written (an arena hands out the same addresses from the
 * same mark while its chunks stand: luna_graph_key_add_arena), scalars passed by value.
 *
 * A key seen once runs eagerly (its first run also makes what the backend keeps per weight or
 * shape: bf16 copies, GEMM plans, scratch), the second time each segment is captured and
 * launched, after that replayed. A call's segments run in order with host work between them
 * (work that cannot be a graph: e.g. GEMMs sized by the data); an entry's data block carries what
 * that host work needs from the segments' host code, which a replay skips. A capture that fails
 * (an operation a graph cannot hold) runs its segment eagerly, and the key runs eagerly from then
 * on. Past the capacity the least recently used entry goes. */
#ifndef LUNA_CORE_GRAPH_CACHE_H
#define LUNA_CORE_GRAPH_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/status.h"

#define LUNA_GRAPH_KEY_WORDS 40
#define LUNA_GRAPH_SEGMENTS 4

/* Compared word by word; a key that overflowed its words never matches (it always runs
 * eagerly: a truncated key could match work with other launches). */
typedef struct {
    int n;
    bool overflow;
    uint64_t w[LUNA_GRAPH_KEY_WORDS];
} luna_graph_key;

static inline void luna_graph_key_init(luna_graph_key *k) {
    k->n = 0;
    k->overflow = false;
}
void luna_graph_key_add(luna_graph_key *k, uint64_t v);
/* n words, n addresses, n floats (their bits) */
void luna_graph_key_add_words(luna_graph_key *k, const uint64_t *v, size_t n);
void luna_graph_key_add_ptrs(luna_graph_key *k, const void *const *p, size_t n);
void luna_graph_key_add_f32s(luna_graph_key *k, const float *v, size_t n);
/* The arena's current mark and its chunks' generation (luna_arena_generation). */
void luna_graph_key_add_arena(luna_graph_key *k, const luna_arena *a);
/* What the backend's launches depend on besides their arguments: its scratch arena's chunks and
 * its graph_state (core/backend.h). */
void luna_graph_key_add_backend(luna_graph_key *k, luna_backend *be);

typedef struct luna_graph_cache luna_graph_cache;

/* capacity entries of `segments` graphs each (≤ LUNA_GRAPH_SEGMENTS) and data_bytes of data. */
luna_status luna_graph_cache_create(luna_graph_cache **out, luna_backend *be, int capacity,
                                    int segments, size_t data_bytes);
void luna_graph_cache_free(luna_graph_cache *c);
/* Drop every graph (the state they read moved). */
void luna_graph_cache_clear(luna_graph_cache *c);
/* Replays (graph launches), captures and failed captures so far (tests, benchmarks). */
void luna_graph_cache_counts(const luna_graph_cache *c, int64_t *replays, int64_t *captures,
                             int64_t *failed);

/* The last failed capture's error message (NULL: none failed). */
const char *luna_graph_cache_failure(const luna_graph_cache *c);

/* One call's use of an entry: luna_graph_call_begin, then each segment once, in order. */
typedef struct {
    luna_graph_cache *cache;
    int entry;
    int mode; /* eager, capture or replay (graph_cache.c) */
} luna_graph_call;

void luna_graph_call_begin(luna_graph_call *call, luna_graph_cache *c, const luna_graph_key *key);
/* True when the segments replay: their host code does not run, and what the host work between
 * them needs comes from luna_graph_call_data (written by the call that captured them). */
bool luna_graph_call_replays(const luna_graph_call *call);
void *luna_graph_call_data(const luna_graph_call *call);
/* Segment `segment`'s device work run(ctx) (device calls only): replayed, captured or run
 * eagerly as above. `arena` is the one run allocates from: rewound to its mark at the call
 * before the eager run that follows a failed capture. */
luna_status luna_graph_call_segment(luna_graph_call *call, int segment, luna_arena *arena,
                                    luna_status (*run)(void *ctx), void *ctx);

#endif
