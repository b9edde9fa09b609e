/* The transformer's self-attention key/value caches under in-flight batching, in pages of
 * positions handed out as sentences reach them.
 *
 * A pool (decoding/incremental.h, luna_incremental_begin_pool) keeps sentences at their own
 * positions and gives a finished sentence's rows to the next input sentence. Caches sized for
 * every row of the pool times the longest target allowed would all be written sooner or later (a
 * long output passes through every row in turn), so decoding would hold rows × max_steps
 * positions where a batch that empties holds only what its rows reach. Here a sentence holds one
 * block per LUNA_KV_PAGE positions it has reached: `beam` cache slots (one per row) of
 * LUNA_KV_PAGE positions, in every layer's key and value buffer ([slots, H, LUNA_KV_PAGE, dh],
 * the layout cache_products reads with page = LUNA_KV_PAGE; block b is slots b·beam..b·beam +
 * beam − 1). A finished sentence's blocks return to the free list; a new block is the lowest free
 * one, so the memory written stays packed at the start of the buffers. When no block is free the
 * buffers grow by half (a new buffer, the old contents copied, the old buffer released, one
 * buffer at a time), up to S_cap sentences at max_steps positions.
 *
 * The beams' indirection (which slot holds row r's position p) stays with the caller
 * (decoding/incremental.c): a row reads its ancestors' slots, which are its sentence's blocks. */
#ifndef LUNA_DECODING_KV_PAGES_H
#define LUNA_DECODING_KV_PAGES_H

#include <stddef.h>
#include <stdint.h>

#include "model/decoder_step.h"

#define LUNA_KV_PAGE 16 /* positions per block */

typedef struct luna_kv_pages luna_kv_pages;

/* Pages for the `layers` decoder layers of width d (H heads) on `be` (borrowed). No buffers yet. */
luna_status luna_kv_pages_create(luna_kv_pages **out, luna_backend *be, int layers, int d, int H);
/* Releases the buffers (ls, if bound, must not be used for a step after this). */
void luna_kv_pages_free(luna_kv_pages *kv);

/* Start a pool of up to S_cap sentences of `beam` rows and max_steps positions, holding no block:
 * sentence s (0 ≤ s < S_cap) has none until luna_kv_pages_block. ls[layers] (borrowed until the
 * next begin or free) receives the buffers in self_k / self_v, now and whenever they move. The
 * buffers of an earlier pool are kept (their bytes are reused); a first pool gets room for one
 * block per sentence. */
luna_status luna_kv_pages_begin(luna_kv_pages *kv, luna_decoder_layer_state *ls, int S_cap,
                                int beam, int max_steps);

/* *block: the block sentence s writes position t in. Positions come in order: t is within the
 * pages s holds, or the first position of the next page, which takes the lowest free block (the
 * buffers grow when none is free). */
luna_status luna_kv_pages_block(luna_kv_pages *kv, int s, int t, int32_t *block);

/* The sentences move: new sentence i is old sentence from[i] (i < n_new; from distinct, within
 * [0, n_old)); the blocks of the old sentences not taken are freed. */
luna_status luna_kv_pages_reorder(luna_kv_pages *kv, const int32_t *from, int n_new, int n_old);

/* Bytes of the key/value buffers held now (all layers), and the most held at once since create. */
size_t luna_kv_pages_bytes(const luna_kv_pages *kv);
size_t luna_kv_pages_peak_bytes(const luna_kv_pages *kv);
/* How often the buffers have moved (grown) so far: work captured before a move (a step graph)
 * would address the old buffers. 0 for NULL. */
uint64_t luna_kv_pages_moves(const luna_kv_pages *kv);
/* Blocks in use now, and the most in use at once since begin. */
int luna_kv_pages_blocks_used(const luna_kv_pages *kv);
int luna_kv_pages_blocks_peak(const luna_kv_pages *kv);

#endif
