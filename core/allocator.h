/* Arena allocator with byte accounting.
 *
 * Activations, gradients of activations and op scratch space come from an arena: allocation is a
 * pointer bump, and a whole forward/backward pass is released at once by returning to a mark
 * (stack discipline). The arena counts the bytes handed out (`used`) and the high-water mark
 * (`peak`), which is the activation-memory figure reported by benchmarks and tested for linear
 * growth in sequence length. Chunks come from the backend's device allocator, so the same arena
 * serves CPU and GPU memory; when a chunk is full a new one is taken (chunks are kept for reuse).
 */
#ifndef LUNA_ALLOCATOR_H
#define LUNA_ALLOCATOR_H

#include <stddef.h>

#include "core/status.h"
#include "core/tensor.h"

#define LUNA_ARENA_ALIGNMENT 256 /* bytes: cache lines on CPU, coalesced/TMA-friendly on GPU */

typedef struct {
    size_t offset; /* logical bytes in use when the mark was taken */
    int chunk;     /* chunk index at that time */
    size_t chunk_offset;
} luna_arena_mark;

/* `chunk_bytes`: size of each chunk taken from the backend (larger requests get their own). */
luna_status luna_arena_create(luna_arena **out, luna_backend *backend, size_t chunk_bytes);
void luna_arena_free(luna_arena *arena);

/* Aligned allocation; NULL (with an error message recorded) if the device is out of memory. */
void *luna_arena_alloc(luna_arena *arena, size_t bytes);
/* Same, zero-filled. */
void *luna_arena_alloc_zero(luna_arena *arena, size_t bytes);

luna_arena_mark luna_arena_get_mark(const luna_arena *arena);
/* Release everything allocated after `mark` (memory is kept for reuse). */
void luna_arena_release(luna_arena *arena, luna_arena_mark mark);
/* Release everything. */
void luna_arena_reset(luna_arena *arena);

size_t luna_arena_used_bytes(const luna_arena *arena);
/* Chunks given back to the device so far: memory once handed out is still the arena's while this
 * count is unchanged (what a captured graph that uses arena memory relies on). */
uint64_t luna_arena_generation(const luna_arena *arena);
size_t luna_arena_peak_bytes(const luna_arena *arena);
/* Start a new peak measurement from the current usage. */
void luna_arena_reset_peak(luna_arena *arena);
/* Bytes held from the device (sum of chunk sizes). */
size_t luna_arena_reserved_bytes(const luna_arena *arena);
luna_device luna_arena_device(const luna_arena *arena);

#endif
