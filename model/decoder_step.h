/* The model's math for incremental decoding (spec §3, §4): encode once, prepare each decoder
 * layer's state, then one target position at a time for every row. The state's lifetime,
 * reordering and the search live in decoding/ (decoding/incremental.h); this file is the network.
 *
 * Rows and sentences: S source sentences, each with `beam` adjacent rows (R = S·beam). What
 * depends on the source only is kept per sentence; what depends on the target prefix, per row.
 *
 * Luna decoder layer i (spec §4: the decoder's P depends on the source only):
 *   begin: P_i walks through the layers' cross-attention packs, P_{i+1} = LN_p(P_i + Y_P,i);
 *          per sentence the unpack keys/values c_proj(Y_P,i) [S, L, H·dh] (pack done by
 *          luna_attention_pack, the training code); per row the causal state of P_i
 *          (model/causal_luna_attention.h: P̃, Σ K Φᵀ, Σ Φᵀ V), whose size does not grow with t.
 *   step:  x1 = LN(x + CausalLuna_step(x)); x2 = LN(x1 + unpack(x1)) with the beams of a
 *          sentence as the unpack's queries (the cross_attention op over the sentence's packed
 *          keys/values: luna_attention_unpack's math); x3 = LN(x2 + FFN(x2)).
 * Transformer decoder layer:
 *   begin: per sentence the cross-attention keys/values [S, m, H·dh] (luna_mha_keys); per row
 *          slot a key/value cache [R_cap, H, T_max, dh] (head-major). In-flight batching instead
 *          gives the caches slots of cache_page positions as rows reach them
 *          (decoding/kv_pages.h): [slots, H, cache_page, dh].
 *   step:  row r writes the step's key/value at position t of cache slot r (gather_rows,
 *          strided; pages: row t mod cache_page of its sentence's current slot) and reads position
 *          p < t from slot cache_slots[r, p], the slot its ancestor beam wrote it in (a beam
 *          indirection kept by decoding/incremental.c: reordering beams moves T indices per row
 *          instead of T·d cached values); scores and outputs by
 *          cache_products over R·H groups; cross-attention by the cross_attention op, each row
 *          against its sentence's keys/values (by slot under in-flight batching, so that a
 *          sentence leaving moves nothing).
 */
#ifndef LUNA_DECODER_STEP_H
#define LUNA_DECODER_STEP_H

#include "model/causal_luna_attention.h"
#include "model/layers.h"
#include "model/seq2seq.h"

/* One decoder layer's incremental state (device memory owned by the caller's state arena). */
typedef struct {
    luna_causal_state causal;    /* Luna: per row; causal.p_valid is the row P mask */
    luna_act *kp, *vp;           /* Luna: [S, L, H·dh] unpack keys/values (vp == kp: tied) */
    luna_act *self_k, *self_v;   /* transformer: [R, H, T_max, dh] key/value cache (pages:
                                    [slots, H, cache_page, dh]) */
    luna_act *cross_k, *cross_v; /* transformer: [S (pool: slots), m, H·dh] */
} luna_decoder_layer_state;

/* Sizes of a decoding batch. The masks are device int32 arrays owned by the caller. */
typedef struct {
    int S, beam, R;       /* sentences, rows per sentence, rows (S·beam) */
    int R_cap;            /* begin: rows the state is allocated for (reorders may grow R to it);
                             0: R */
    int m;                /* source length (padded) */
    int L;                /* Luna: P slots (0: transformer) */
    int max_steps;        /* transformer: the most positions per row T_max */
    int cache_page;       /* transformer: positions per cache slot; 0: max_steps (a slot holds
                             a row's whole history) */
    int step;             /* positions decoded so far (t of the next step, 0-based) */
    int32_t *row_valid;   /* [R] Luna P mask per row (causal step), NULL: none */
    int32_t *sent_valid;  /* [S] Luna P mask / transformer source length per sentence, NULL: none */
    int32_t *cache_slots; /* transformer: [R_cap, max_steps] slot of row r's position p in the
                             caches (row r writes its step into the slot named for it there),
                             device; NULL for Luna */
    /* In-flight batching (sentences at different positions; decoding/incremental.h): */
    const int32_t *sent_step; /* host [S]: each sentence's positions decoded so far; NULL: all
                                 `step` */
    int one_row_sentences;    /* the last this many sentences have one row each (sentences that
                                 joined at step 0, whose beams are alike), the others `beam` */
    /* Transformer under in-flight batching: each sentence's source keys/values stay in the slot
     * they were admitted to while other sentences leave (no copies). */
    const int32_t *sent_slot;  /* host [S]: each sentence's slot of cross_k/cross_v; NULL: s */
    const int32_t *slot_valid; /* device [slots]: source length per slot (with sent_slot) */
    /* With sent_step: [max_steps, d] the target positions' sinusoids (position t: fairseq's
     * padding_idx + 1 + t), each row's gathered on the device by its step; NULL: made each step
     * from the sentences' positions (luna_decoder_positions fills one) */
    const luna_act *positions;
    /* Transformer, rows at their own positions: > 0 rounds the step's longest position T up to
     * a multiple of it (at most max_steps) for the self-attention's score rows, so that the
     * step's launches stay the same for that many steps (step graphs); each row still reads its
     * own positions only, so the results are the same. 0: T itself. */
    int T_round;
} luna_decoder_dims;

/* Fill positions [max_steps, d] (activations) for luna_decoder_dims.positions. */
luna_status luna_decoder_positions(luna_backend *be, const luna_config *c, luna_act *positions,
                                   int max_steps);

/* Decoding reads the model's weights many times and never changes them: hold (true) asks the
 * backend to keep every Linear weight (encoder, decoder) and the output projection in its fastest
 * layout for as long as decoding runs (core/backend.h, hold_weights); hold false releases them. The
 * weights must not change, and must be released before the model is freed. */
luna_status luna_decoder_hold_weights(luna_seq2seq *model, bool hold);

/* P slots for a batch whose longest source has `longest` tokens (0 for the transformer). */
int luna_decoder_projection_slots(const luna_config *c, int longest);

/* Encode src (device [S, m]) with masks src_valid [S] and p_valid [S] (NULL when fixed) and
 * set up layers[decoder_layers]: per-sentence and per-row state from `state` (kept), temporaries
 * from `scratch` (released). Requires dims->row_valid / sent_valid uploaded by the caller. */
luna_status luna_decoder_begin(luna_seq2seq *model, luna_arena *state, luna_arena *scratch,
                               const int32_t *src, const int32_t *src_valid, const int32_t *p_valid,
                               const luna_decoder_dims *dims, luna_decoder_layer_state *layers);

/* Allocate from `state` the layers' state for dims->S sentences and dims->R_cap rows (sources
 * of up to dims->m tokens, dims->L P slots, dims->max_steps positions), holding no sentence yet:
 * luna_decoder_admit fills it. With dims->cache_page > 0 the transformer's self-attention caches
 * are left to the caller (NULL here; pages of positions, decoding/kv_pages.h). */
luna_status luna_decoder_alloc(luna_seq2seq *model, luna_arena *state,
                               const luna_decoder_dims *dims, luna_decoder_layer_state *layers);

/* Encode n new sentences (dims: S = n, beam = their rows each, R = n·beam, their own m and L;
 * sent_valid / row_valid unused) and write their state into `layers`, the state of a batch laid
 * out for pool sizes (m_cap source positions, L_cap P slots): per-sentence state at sentences
 * [s0, s0 + n) (the transformer's source keys/values at slots[i] instead when slots, host [n],
 * is given), per-row state at rows [r0, r0 + R), both zero-padded to m_cap / L_cap, so that
 * the new rows decode as they would in a batch of their own (the padding is masked). The
 * transformer's caches are untouched (positions are written as the rows step). Temporaries from
 * `scratch`. */
luna_status luna_decoder_admit(luna_seq2seq *model, luna_arena *scratch, const int32_t *src,
                               const int32_t *src_valid, const int32_t *p_valid,
                               const luna_decoder_dims *dims, int s0, const int32_t *slots, int r0,
                               int m_cap, int L_cap, luna_decoder_layer_state *layers);

/* The first row of sentence s and its rows (dims->one_row_sentences). */
static inline int luna_decoder_first_row(const luna_decoder_dims *d, int s) {
    const int f = d->S - d->one_row_sentences;
    return s <= f ? s * d->beam : f * d->beam + (s - f);
}
static inline int luna_decoder_sentence_rows(const luna_decoder_dims *d, int s) {
    return s >= d->S - d->one_row_sentences ? 1 : d->beam;
}

/* One step for all rows: tokens (device [R]) at position dims->step -> logits [R, V] (from
 * ps->arena; activations). Updates the per-row state (Luna sums, transformer caches). */
luna_status luna_decoder_step(const luna_pass *ps, luna_seq2seq *model,
                              const luna_decoder_dims *dims, luna_decoder_layer_state *layers,
                              const int32_t *tokens, luna_act **logits);

/* The step in two parts: the upload of each row's position and source slot (host work and one
 * transfer, into ps->arena), then the step itself, device work only, whose launches do not depend
 * on the rows' positions (so a device can capture them once and replay them: CUDA graphs). */
typedef struct {
    const int32_t *rows_t;   /* device [R]: steps taken by each row (rows at their own positions),
                                or NULL (all at dims->step) */
    const int32_t *row_slot; /* device [R]: the slot of the row's sentence's source keys/values */
    const int32_t *lens;     /* transformer, rows at their own positions: device [R] positions
                                after this step; else NULL */
    int T;                   /* the most positions a row has after this step */
} luna_decoder_step_rows;
luna_status luna_decoder_step_upload(const luna_pass *ps, const luna_decoder_dims *dims,
                                     luna_decoder_step_rows *out);
luna_status luna_decoder_step_run(const luna_pass *ps, luna_seq2seq *model,
                                  const luna_decoder_dims *dims, luna_decoder_layer_state *layers,
                                  const int32_t *tokens, const luna_decoder_step_rows *rows,
                                  luna_act **logits);

#endif
