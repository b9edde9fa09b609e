/* The beams' indirection into the transformer's self-attention key/value caches (incremental
 * decoding, decoding/incremental.c): row r writes its step-t key and value into one cache slot,
 * and reads position p from the slot its ancestor beam wrote p in. slots[r·T_cap + p] names that
 * slot; a beam reorder (new row i continues old row rows[i]) gathers these T indices per row
 * instead of the T·d cached values per row and layer. cache_products reads the caches through
 * them (core/backend.h); the slots themselves are the caller's (a row's own slot r over its
 * whole history, or pages of positions under in-flight batching, decoding/kv_pages.h).
 *
 * The table lives on the backend only (op index_rows_update): a step sends the rows' new
 * (position, slot) pairs, a reorder gathers rows by a device index — the beam search's own
 * parent rows when it selects on the backend — so the host need not read the search's choices
 * back each step to keep the table. */
#ifndef LUNA_DECODING_CACHE_SLOTS_H
#define LUNA_DECODING_CACHE_SLOTS_H

#include <stdint.h>

#include "core/allocator.h"
#include "core/backend.h"

typedef struct {
    int32_t *dev, *spare; /* [rows, T_cap] device: the table, and the target of a reorder */
    int32_t *step_dev;    /* [2·rows] device: a step's positions, then its slots */
    int32_t *host;        /* [2·rows] host: the same, as the caller sets them */
    int rows, T_cap;
} luna_cache_slots;

/* Room for `rows` rows of T_cap positions, every index 0 (a slot that exists); the device arrays
 * from `arena` on `be` (kept until the caller resets the arena). */
luna_status luna_cache_slots_reset(luna_cache_slots *cs, luna_backend *be, luna_arena *arena,
                                   int rows, int T_cap);
void luna_cache_slots_free(luna_cache_slots *cs);

/* This step, row r writes its position t in `slot` (sent with luna_cache_slots_write). */
static inline void luna_cache_slots_set(luna_cache_slots *cs, int r, int t, int32_t slot) {
    cs->host[r] = t;
    cs->host[cs->rows + r] = slot;
}

/* Rows [0, n)'s positions and slots set above into the table: one async upload and one op (the
 * host copy is rearranged by it: set every row of the next step again). */
luna_status luna_cache_slots_write(luna_cache_slots *cs, luna_backend *be, int n);

/* New row i takes old row rows[i]'s first `len` positions (i < n; rows: device int32 [n]; the
 * positions every row has written, or more: later ones are written before they are read). */
luna_status luna_cache_slots_reorder(luna_cache_slots *cs, luna_backend *be, const int32_t *rows,
                                     int n, int len);

#endif
