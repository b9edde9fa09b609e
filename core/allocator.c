#include "core/allocator.h"

#include <stdlib.h>

#include "core/backend.h"

typedef struct {
    char *base;
    size_t size;
} arena_chunk;

struct luna_arena {
    luna_backend *backend;
    size_t chunk_bytes;
    arena_chunk *chunks;
    int num_chunks, chunk_capacity;
    int current;         /* chunk being bumped */
    size_t chunk_offset; /* bytes used in the current chunk */
    size_t used, peak;   /* logical bytes handed out (aligned sizes), high-water mark */
    uint64_t generation; /* chunks given back so far (luna_arena_generation) */
};

static size_t align_up(size_t x) {
    return (x + LUNA_ARENA_ALIGNMENT - 1) & ~(size_t)(LUNA_ARENA_ALIGNMENT - 1);
}

luna_status luna_arena_create(luna_arena **out, luna_backend *backend, size_t chunk_bytes) {
    luna_arena *a = calloc(1, sizeof *a);
    if (!a) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "arena: cannot allocate its header");
    a->backend = backend;
    a->chunk_bytes = align_up(chunk_bytes ? chunk_bytes : ((size_t)64 << 20));
    a->current = -1;
    *out = a;
    return LUNA_OK;
}

void luna_arena_free(luna_arena *arena) {
    if (!arena) return;
    for (int i = 0; i < arena->num_chunks; i++)
        luna_mem_release(arena->backend, arena->chunks[i].base, arena->chunks[i].size);
    free(arena->chunks);
    free(arena);
}

/* Move to the next chunk that can hold `bytes`, taking a new one from the device if needed.
 * Chunks after `current` that are too small for this request are skipped (their space is simply
 * not used until the arena is released below them). When none of them fits, they are all empty
 * (stack discipline: nothing lives above `current`), so they are given back and replaced by ONE
 * chunk at least as large as all of them together: otherwise a workload whose requests keep
 * growing a little (translation batches sorted by length) would add a chunk per new size and the
 * arena would grow without bound; this way it converges to a few chunks within ~2x its peak. */
static int advance_chunk(luna_arena *a, size_t bytes) {
    for (int i = a->current + 1; i < a->num_chunks; i++) {
        if (a->chunks[i].size >= bytes) {
            a->current = i;
            a->chunk_offset = 0;
            return 1;
        }
    }
    size_t spare = 0;
    for (int i = a->current + 1; i < a->num_chunks; i++) {
        spare += a->chunks[i].size;
        luna_mem_release(a->backend, a->chunks[i].base, a->chunks[i].size);
        a->generation++;
    }
    a->num_chunks = a->current + 1;
    size_t size = bytes > a->chunk_bytes ? bytes : a->chunk_bytes;
    if (spare > size) size = spare;
    char *base = luna_mem_alloc(a->backend, size);
    if (!base) return 0;
    if (a->num_chunks == a->chunk_capacity) {
        int cap = a->chunk_capacity ? 2 * a->chunk_capacity : 8;
        arena_chunk *grown = realloc(a->chunks, (size_t)cap * sizeof *grown);
        if (!grown) {
            luna_mem_release(a->backend, base, size);
            return 0;
        }
        a->chunks = grown;
        a->chunk_capacity = cap;
    }
    /* Chunk order = allocation order of the stack: the new chunk follows `current`. */
    int at = a->current + 1;
    a->chunks[at] = (arena_chunk){base, size};
    a->num_chunks++;
    a->current = at;
    a->chunk_offset = 0;
    return 1;
}

void *luna_arena_alloc(luna_arena *a, size_t bytes) {
    size_t size = align_up(bytes ? bytes : 1);
    if (a->current < 0 || a->chunk_offset + size > a->chunks[a->current].size) {
        if (!advance_chunk(a, size)) {
            luna_error(LUNA_ERR_OUT_OF_MEMORY,
                       "arena: cannot allocate %zu bytes on %s (%zu in use)", size,
                       a->backend->name, a->used);
            return NULL;
        }
    }
    char *p = a->chunks[a->current].base + a->chunk_offset;
    a->chunk_offset += size;
    a->used += size;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void *luna_arena_alloc_zero(luna_arena *a, size_t bytes) {
    void *p = luna_arena_alloc(a, bytes);
    /* A failed zeroing (a device error) is reported like exhaustion: NULL. */
    if (p && luna_mem_zero(a->backend, p, bytes) != LUNA_OK) return NULL;
    return p;
}

luna_arena_mark luna_arena_get_mark(const luna_arena *a) {
    return (luna_arena_mark){a->used, a->current, a->chunk_offset};
}

void luna_arena_release(luna_arena *a, luna_arena_mark mark) {
    a->used = mark.offset;
    a->current = mark.chunk;
    a->chunk_offset = mark.chunk_offset;
}

void luna_arena_reset(luna_arena *a) { luna_arena_release(a, (luna_arena_mark){0, -1, 0}); }

size_t luna_arena_used_bytes(const luna_arena *a) { return a->used; }
uint64_t luna_arena_generation(const luna_arena *a) { return a->generation; }
size_t luna_arena_peak_bytes(const luna_arena *a) { return a->peak; }
void luna_arena_reset_peak(luna_arena *a) { a->peak = a->used; }

size_t luna_arena_reserved_bytes(const luna_arena *a) {
    size_t total = 0;
    for (int i = 0; i < a->num_chunks; i++)
        total += a->chunks[i].size;
    return total;
}

luna_device luna_arena_device(const luna_arena *a) { return a->backend->device; }
