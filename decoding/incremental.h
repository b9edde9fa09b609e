/* Incremental decoding of the whole decoder (Luna or the transformer baseline), one target
 * position at a time, with a per-row state whose size does not depend on the step count (Luna).
 *
 * Rows and sentences: luna_incremental_begin encodes S source sentences and prepares S·beam rows;
 * row r belongs to sentence r / beam (the beams of a sentence are adjacent). Reordering keeps
 * that grouping: new row i copies old row rows[i], and all beams of a new sentence must come from
 * one old sentence (beam reordering within a sentence, removal of finished sentences, or the
 * expansion of one sentence's rows).
 *
 * State, Luna (spec §2–§4), per decoder layer:
 *   per row:      the causal state P̃ [H, L, dh], Σ K_s Φ_sᵀ [H, dh, L], Σ Φ_sᵀ V_s [H, L, dh]
 *                 (model/causal_luna_attention.h) and the step count t;
 *   per sentence: the cross-attention unpack keys/values c_proj(Y_P) [H, L, dh] (untied: k_proj
 *                 and v_proj), with Y_P = pack(P_layer, encoder output) computed once at begin.
 *   The decoder P of every layer depends on the source only (§4), so begin() runs the encoder,
 *   then walks P through the decoder layers' cross-attention packs; the encoder output is not
 *   kept. L = min(l, longest source) with the P mask (dynamic projection), or l (fixed).
 * State, transformer: per row a key/value cache [T_max, d] per layer (grows with the step up to
 *   max_steps, allocated at begin), per sentence the cross-attention keys/values [H, m, dh].
 *
 * All state lives in one arena (luna_incremental_state_bytes: constant after begin); each step's
 * temporaries come from a scratch arena released before the step returns. No dropout.
 */
#ifndef LUNA_DECODING_INCREMENTAL_H
#define LUNA_DECODING_INCREMENTAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/seq2seq.h"

typedef struct luna_incremental luna_incremental;

/* The decoder of `model` (borrowed: it must outlive the decoder; its parameters are read at every
 * step, so the caller must not change them during a sentence batch). */
luna_status luna_incremental_create(luna_incremental **out, luna_seq2seq *model);
void luna_incremental_free(luna_incremental *inc);

/* Encode S sentences (host src_tokens [S, m], right-padded with padding_idx, each ending with
 * </s>; src_lengths [S] including </s>) and set up the state for S·beam rows at step 0.
 * max_steps: the most steps that will be taken (the transformer's cache capacity; for Luna only
 * checked). Any previous state is discarded. */
luna_status luna_incremental_begin(luna_incremental *inc, const int32_t *src_tokens,
                                   const int32_t *src_lengths, int S, int m, int beam,
                                   int max_steps);

/* One step for every active row: tokens [rows] (host; at step 0 usually </s>) are the previous
 * output tokens at position t = steps taken; log_probs [rows, V] (host) receives
 * log_softmax(logits) of the next token (computed in double, stored as float). */
luna_status luna_incremental_step(luna_incremental *inc, const int32_t *tokens, float *log_probs);

/* New row i = old row rows[i] (host, new_rows entries, new_rows a multiple of beam, the beams
 * of each new sentence taken from one old sentence). Also removes rows (finished sentences). */
luna_status luna_incremental_reorder(luna_incremental *inc, const int32_t *rows, int new_rows);

const luna_config *luna_incremental_config(const luna_incremental *inc); /* the model's */
int luna_incremental_rows(const luna_incremental *inc);                  /* active rows (S·beam) */
int luna_incremental_sentences(const luna_incremental *inc);             /* active sentences */
int luna_incremental_beam(const luna_incremental *inc);
int luna_incremental_steps(const luna_incremental *inc);            /* steps taken since begin */
int luna_incremental_projection_slots(const luna_incremental *inc); /* L (0: transformer) */

/* Bytes of decoder state held (allocator accounting of the state arena): fixed by begin(). */
size_t luna_incremental_state_bytes(const luna_incremental *inc);
/* Scratch bytes in use (0 between calls) and the scratch high-water mark. */
size_t luna_incremental_scratch_bytes(const luna_incremental *inc);
size_t luna_incremental_scratch_peak(const luna_incremental *inc);

#endif
