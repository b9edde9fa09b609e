/* Incremental decoding of the whole decoder (Luna or the transformer baseline), one target
 * position at a time, with a per-row state whose size does not depend on the step count (Luna).
 *
 * Rows and sentences: luna_incremental_begin encodes S source sentences and prepares S·beam rows;
 * row r belongs to sentence r / beam (the beams of a sentence are adjacent). Reordering keeps
 * that grouping: new row i copies old row rows[i], and all beams of a new sentence must come from
 * one old sentence (beam reordering within a sentence, removal of finished sentences, or the
 * expansion of one sentence's rows).
 *
 * The network's part (encoder, the per-layer state and one decoder step) is model/decoder_step.h;
 * this object owns the state (one arena whose size is fixed by begin: constant in the number of
 * steps for Luna, the transformer's caches sized for max_steps), reorders it between steps
 * (gather_rows on the device: beams within a sentence, finished sentences removed; the
 * transformer's self-attention caches stay where they are written and only their per-row slot
 * indices are reordered, on the host) and hands the search k candidates per row.
 * All state lives in one arena (luna_incremental_state_bytes: constant after begin); each step's
 * temporaries come from a scratch arena released before the step returns. No dropout.
 */
#ifndef LUNA_DECODING_INCREMENTAL_H
#define LUNA_DECODING_INCREMENTAL_H

#include <stdbool.h>
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

/* As begin, but with one row per sentence (S rows) until the first reorder, which must give each
 * sentence `beam` rows taken from its row (rows[i] = old row of sentence i / beam). For a beam
 * search's first step, where the beams of a sentence are identical: the step costs a beam-th
 * (CTranslate2 does the same), and each row's results are those of begin's row s·beam. */
luna_status luna_incremental_begin_one_row(luna_incremental *inc, const int32_t *src_tokens,
                                           const int32_t *src_lengths, int S, int m, int beam,
                                           int max_steps);

/* In-flight batching: an empty pool of up to S_cap sentences of `beam` rows (sources of up to
 * m_cap tokens, at most max_steps steps each). luna_incremental_admit adds sentences after the
 * active ones, each at step 0 with `beam` rows (all alike at step 0) while the others go on at
 * their own positions; a step advances every sentence by one position; reorder removes finished
 * sentences and reorders beams as with begin. A sentence's rows decode as they would in a batch
 * of their own (up to the last bits of sums over its padded source). The state is sized once for
 * the pool, constant in the steps, for Luna; the transformer's key/value caches come in pages of
 * positions that a sentence takes as it reaches them and gives back when it leaves
 * (decoding/kv_pages.h), so they hold what the active rows have written, not S_cap·beam rows of
 * max_steps positions. */
luna_status luna_incremental_begin_pool(luna_incremental *inc, int S_cap, int m_cap, int beam,
                                        int max_steps);

/* Encode n sentences (host src_tokens [n, m], right-padded, ending with </s>; src_lengths [n],
 * m ≤ m_cap) and add them as sentences S..S+n−1 (rows from S·beam on) of the pool (S + n ≤
 * S_cap; not before the reorder that follows an admission with one_row). one_row: each new
 * sentence has one row until the next reorder, which must give it `beam` rows taken from that
 * row (as begin_one_row: for a beam search's step 0, where its beams are alike; its results are
 * those of begin_one_row's), else `beam` rows. */
luna_status luna_incremental_admit(luna_incremental *inc, const int32_t *src_tokens,
                                   const int32_t *src_lengths, int n, int m, bool one_row);

/* What a step hands back (host arrays, rows = luna_incremental_rows; with on_device, top_log_probs,
 * top_tokens and picked are the backend's memory instead and stay there, for a search that runs
 * on the device: no readback):
 *   top_log_probs / top_tokens [rows, k]: the k most probable next tokens of each row, best
 *     first (ties: lower token id first; NaN counted as −inf), log-probs in nats after the
 *     token bias; k = 0: none. The beam search needs 2·beam per row, never the V log-probs.
 *   picked [rows]: the log-prob of token pick[r] without the bias (scoring given targets, or
 *     </s> of a row that must end); pick NULL: none.
 * Log-probs are log_softmax(logits) computed in double, rounded to fp32, plus the bias. */
typedef struct {
    int k;
    float *top_log_probs;
    int32_t *top_tokens;
    const int32_t *pick; /* host */
    float *picked;
    bool on_device;
} luna_step_output;

/* A per-token bias added to every row's log-probs (host [V], copied; NULL: none), e.g. −inf for
 * <pad>, −unkpen for <unk>, −inf for </s> before min_len. Kept until changed (begin keeps it). */
luna_status luna_incremental_set_token_bias(luna_incremental *inc, const float *bias);

/* Divide the logits by T > 0 before the log-softmax (fairseq's --temperature; 1: unchanged, the
 * default). Applies to the candidates and to `picked`. Kept until changed (begin keeps it). */
luna_status luna_incremental_set_temperature(luna_incremental *inc, double T);

/* On a backend with graphs (a GPU), the steps of a pool (luna_incremental_begin_pool) are
 * captured as graphs and replayed, one launch a step instead of one per kernel
 * (core/graph_cache.h); on by default, off with LUNA_STEP_GRAPHS=0 or set_graphs(false). The
 * results are the same either way. Counts: replays, captures, captures that failed (the step then
 * ran eagerly). */
luna_status luna_incremental_set_graphs(luna_incremental *inc, bool on);
/* Whether this state's steps are replayed as graphs (a pool on a backend with graphs). */
bool luna_incremental_uses_graphs(const luna_incremental *inc);
void luna_incremental_graph_counts(const luna_incremental *inc, int64_t *replays, int64_t *captures,
                                   int64_t *failed);

/* One step for every active row: tokens [rows] (host; at step 0 usually </s>) are the previous
 * output tokens at position t = steps taken. The logits, log-softmax and top-k stay on the
 * device; `out` receives the candidates. */
luna_status luna_incremental_step(luna_incremental *inc, const int32_t *tokens,
                                  const luna_step_output *out);

/* luna_incremental_step with the tokens in the backend's memory (e.g. beam_select's next
 * tokens, within the vocabulary by construction: not checked on the host). */
luna_status luna_incremental_step_device_tokens(luna_incremental *inc, const int32_t *tokens,
                                                const luna_step_output *out);

/* New row i = old row rows[i] (host, new_rows entries, new_rows a multiple of beam, the beams
 * of each new sentence taken from one old sentence). Also removes rows (finished sentences), and
 * after luna_incremental_begin_one_row expands each sentence's row to `beam` rows. */
luna_status luna_incremental_reorder(luna_incremental *inc, const int32_t *rows, int new_rows);

/* A pool's reorder within each sentence, from rows in the backend's memory (beam_select's parent
 * rows): new row s·beam + p = old row rows[s·beam + p] of sentence s, for every active sentence
 * (none leaves; one-row sentences get `beam` rows). The host never sees the rows, so a search
 * can go on without reading anything back: Luna's decoder state and the transformer's
 * cache-slot table (decoding/cache_slots.h) are gathered on the backend. A pool only. */
luna_status luna_incremental_reorder_beams_device(luna_incremental *inc, const int32_t *rows);

const luna_config *luna_incremental_config(const luna_incremental *inc); /* the model's */
luna_backend *luna_incremental_backend(const luna_incremental *inc);     /* the model's */
int luna_incremental_rows(const luna_incremental *inc);                  /* active rows (S·beam) */
int luna_incremental_sentences(const luna_incremental *inc);             /* active sentences */
int luna_incremental_beam(const luna_incremental *inc);
int luna_incremental_steps(const luna_incremental *inc);            /* steps taken since begin */
int luna_incremental_projection_slots(const luna_incremental *inc); /* L (0: transformer) */

/* Bytes of decoder state held (allocator accounting of the state arena, and the transformer's
 * key/value pages under in-flight batching): fixed by begin() and, for Luna, by begin_pool; the
 * transformer's pages grow as the pool's sentences reach new positions. */
size_t luna_incremental_state_bytes(const luna_incremental *inc);
/* Bytes of the transformer's self-attention key/value caches within the state (0 for Luna): the
 * arena's rows × max_steps after begin; the pages held under in-flight batching. */
size_t luna_incremental_cache_bytes(const luna_incremental *inc);
/* Scratch bytes in use (0 between calls) and the scratch high-water mark. */
size_t luna_incremental_scratch_bytes(const luna_incremental *inc);
size_t luna_incremental_scratch_peak(const luna_incremental *inc);

#endif
