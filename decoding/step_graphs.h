/* Decoder steps replayed as graphs (core/backend.h, luna_backend_memory graph_begin ...): a step's
 * device work is captured once per shape and replayed with one launch.
 *
 * A step of in-flight decoding launches the same kernels with the same arguments every time
 * while the pool's shape stands (rows, sentences, candidates per row, the buffers it reads and
 * writes: the scratch arena hands out the same addresses at the same mark); what changes from
 * step to step (the tokens, each row's position and slot) is in device memory, uploaded before.
 * The key below holds everything else the launches depend on. A key seen once runs eagerly (its
 * first run also makes what the backend keeps per weight or shape: bf16 copies, GEMM plans), the
 * second time it is captured and launched, after that replayed. A capture that fails (an
 * operation a graph cannot hold) runs the step eagerly and marks the key, which then always runs
 * eagerly. */
#ifndef LUNA_DECODING_STEP_GRAPHS_H
#define LUNA_DECODING_STEP_GRAPHS_H

#include <stdint.h>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/status.h"

typedef struct {
    int R, S, one_row, k;
    int T;                   /* the transformer's longest position (its score rows), 0 for Luna */
    uint64_t cache_moves;    /* the transformer's key/value buffers moved (luna_kv_pages_moves) */
    const void *cache_slots; /* the transformer's cache-slot table (two buffers in turn) */
    const void *tokens, *top_lp, *top_idx, *pick, *picked, *bias;
    float inv_temperature;
    luna_arena_mark scratch;     /* the step's arena at the device work's start */
    uint64_t scratch_generation; /* and its chunks (luna_arena_generation) */
    uint64_t backend_generation; /* the backend's own scratch arena's chunks */
} luna_step_graph_key;

typedef struct luna_step_graphs luna_step_graphs;

luna_status luna_step_graphs_create(luna_step_graphs **out, luna_backend *be);
void luna_step_graphs_free(luna_step_graphs *g);
/* Drop every graph (the state they read moved: a new batch or pool). */
void luna_step_graphs_clear(luna_step_graphs *g);

/* The device work run(ctx) (device calls only) for `key`: replayed, captured or run eagerly as
 * above. `scratch` is the arena run allocates from: rewound to key->scratch before the eager run
 * that follows a failed capture. */
luna_status luna_step_graphs_run(luna_step_graphs *g, const luna_step_graph_key *key,
                                 luna_arena *scratch, luna_status (*run)(void *ctx), void *ctx);

/* Replays, captures and failed captures so far (tests, benchmarks). */
void luna_step_graphs_counts(const luna_step_graphs *g, int64_t *replays, int64_t *captures,
                             int64_t *failed);

#endif
