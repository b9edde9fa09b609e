/* The incremental decoder's state (decoding/incremental.h), shared by its files: incremental.c
 * (creation, batches and pools, the step) and incremental_reorder.c (moving rows between steps).
 * Not for other callers. */
#ifndef LUNA_DECODING_INCREMENTAL_INTERNAL_H
#define LUNA_DECODING_INCREMENTAL_INTERNAL_H

#include "core/allocator.h"
#include "decoding/cache_slots.h"
#include "decoding/incremental.h"
#include "decoding/kv_pages.h"
#include "core/graph_cache.h"
#include "model/decoder_step.h"

struct luna_incremental {
    luna_seq2seq *model;
    luna_backend *be;
    luna_arena *state, *scratch;
    int layers, d, H, V;
    bool luna;
    int beam, S, R, L, m, max_steps, step;
    int rpb;               /* rows per sentence now: beam, or 1 before the first reorder of a
                              begin_one_row */
    int cap_rows;          /* rows allocated at begin */
    bool masked;           /* per-sentence valid counts apply (P mask, or source padding) */
    int32_t *sent_host;    /* [S at begin] P mask (Luna) or source length (transformer) */
    int32_t *row_valid;    /* [cap_rows] device: the P mask per row (Luna, masked), else NULL */
    int32_t *sent_valid;   /* [S at begin] device: sent_host, or NULL when not masked */
    float *bias;           /* [V] device token bias (luna_mem_alloc), NULL: none */
    float inv_temperature; /* logits ×= 1/T before the log-softmax; 1: off */
    luna_decoder_layer_state *ls; /* [layers] */
    /* Transformer: the beam indirection of the key/value caches (decoding/cache_slots.h), row r
     * writing slot r (pool: its sentence's block); on the device (the state arena), a step's
     * slots sent each step. */
    luna_cache_slots cs;
    bool held; /* the decoder's weights are held (luna_decoder_hold_weights) */
    /* In-flight batching (luna_incremental_begin_pool): sentences join as others leave, each at
     * its own position. sent_step [S_cap]: positions decoded by each active sentence;
     * sent_block [S_cap] (transformer): the block of `beam` cache slots each sentence writes its
     * current position in, one of the blocks `kv` gives it as it reaches new pages of positions
     * (its rows' histories stay in them however the sentences move). */
    bool pool;
    luna_kv_pages *kv;
    int S_cap;
    int one_row; /* the last this many sentences have one row each (joined, before their first
                    reorder), the others rpb */
    int32_t *sent_step, *sent_block;
    /* transformer: sent_slot [S_cap] the slot of cross_k / cross_v each active sentence was
     * admitted to (it stays there while others leave: a reorder moves no keys or values);
     * slot_host [S_cap] each slot's source length, slot_valid its device copy (masked) */
    int32_t *sent_slot, *slot_host, *slot_valid;
    luna_act *positions;      /* pool: [max_steps, d] the target positions' sinusoids (state) */
    luna_graph_cache *graphs; /* a device's steps as graphs (pools), NULL: none */
};

/* The sentence of row r (the last one_row sentences have one row each). */
static inline int luna_incremental_row_sentence(const luna_incremental *inc, int r) {
    const int f = inc->S - inc->one_row;
    return r < f * inc->rpb ? r / inc->rpb : f + (r - f * inc->rpb);
}

/* Upload the per-sentence masks and their per-row expansion (Luna). */
luna_status luna_incremental_upload_masks(luna_incremental *inc);

#endif
