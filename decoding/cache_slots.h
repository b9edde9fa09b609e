/* The beams' indirection into the transformer's self-attention key/value caches (incremental
 * decoding, decoding/incremental.c): row r writes its step-t key and value into one cache slot,
 * and reads position p from the slot its ancestor beam wrote p in. slots[r·T_cap + p] names that
 * slot; a beam reorder (new row i continues old row rows[i]) gathers these T indices per row
 * instead of the T·d cached values per row and layer. cache_products reads the caches through
 * them (core/backend.h); the slots themselves are the caller's (a row's own slot r over its
 * whole history, or pages of positions under in-flight batching, decoding/kv_pages.h). */
#ifndef LUNA_DECODING_CACHE_SLOTS_H
#define LUNA_DECODING_CACHE_SLOTS_H

#include <stdint.h>

#include "core/allocator.h"
#include "core/backend.h"

typedef struct {
    int32_t *host, *tmp; /* [rows, T_cap] */
    int32_t *dev;        /* [rows, T_cap] device, from the caller's arena */
    int rows, T_cap;
} luna_cache_slots;

/* Room for `rows` rows of T_cap positions, every index 0 (a slot that exists); the device copy
 * from `arena` on `be` (kept until the caller resets the arena). */
luna_status luna_cache_slots_reset(luna_cache_slots *cs, luna_backend *be, luna_arena *arena,
                                   int rows, int T_cap);
void luna_cache_slots_free(luna_cache_slots *cs);

/* Row r's position t is in `slot`. */
static inline void luna_cache_slots_set(luna_cache_slots *cs, int r, int t, int32_t slot) {
    cs->host[(int64_t)r * cs->T_cap + t] = slot;
}

/* New row i takes old row rows[i]'s first `len` positions (i < n; the positions every row has
 * written, or more: later ones are written before they are read). */
void luna_cache_slots_reorder(luna_cache_slots *cs, const int32_t *rows, int n, int len);

/* Rows [0, n) to the device copy, cache_products' indices. */
luna_status luna_cache_slots_upload(const luna_cache_slots *cs, luna_backend *be, int n);

#endif
