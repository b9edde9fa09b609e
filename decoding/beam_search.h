/* Beam search with fairseq's SequenceGenerator semantics (fairseq/sequence_generator.py and
 * search.BeamSearch), on top of the incremental decoder.
 *
 * Per step, for every active row: log-probs (NaN -> -inf), <pad> -> -inf, <unk> -= unkpen; at
 * step >= max_len only </s> is allowed, at step < min_len </s> is forbidden. Candidates: the top
 * 2·beam of (cumulative score + log-prob) over (beam, token) per sentence (step 0: beam 0 only).
 * A </s> candidate among the first `beam` (not marked to ignore) is finalized with score
 * Σ log-probs / (step + 1)^lenpen (length includes </s>); a sentence is finished when it has `beam`
 * finalized hypotheses or reaches max_len. The next beam takes the first `beam` non-</s>
 * candidates (fairseq's active_mask / cands_to_ignore rule); finished sentences leave the active
 * batch (the decoder state is reordered and shrunk). Final hypotheses are sorted by score
 * (stable: ties keep finalization order), and the first nbest are returned.
 *
 * Deterministic tie-breaking: candidates with equal scores are ordered by (beam, token) index.
 * Scores are natural-log (nats); fairseq prints them divided by ln 2.
 * One deliberate difference: max_len = min(max_len_a·src_len + max_len_b, max_len_cap) is per
 * sentence (src_len = its length including </s>), not per batch, so that a sentence's output does
 * not depend on which sentences share its batch (fairseq uses the batch's padded length; the two
 * agree when max_len_a = 0, the default).
 * Greedy decoding is beam 1.
 *
 * fairseq's conveniences (decoding/sampling.h): no_repeat_ngram_size N > 0 bans, per hypothesis,
 * every token that would repeat an n-gram of N tokens it already holds. temperature T divides the
 * logits before the log-softmax (for the search and the scores, as fairseq's --temperature).
 * sampling replaces the top-2·beam selection by one draw per row from its next-token distribution
 * (sampling_topk > 0: from the sampling_topk most probable tokens only, a larger value meaning the
 * whole vocabulary): the `beam` rows of a sentence are independent samples, a row that draws </s>
 * is finalized (its place is then ignored, fairseq's cands_to_ignore), and the finalized samples
 * are sorted by score like beam hypotheses. Draws depend on (seed, the sentence's index in the
 * input (of luna_generate; of src for luna_beam_search), step, row) and the model's log-probs
 * only.
 */
#ifndef LUNA_DECODING_BEAM_SEARCH_H
#define LUNA_DECODING_BEAM_SEARCH_H

#include <stdbool.h>
#include <stdint.h>

#include "decoding/incremental.h"

typedef struct {
    int beam;      /* beam size (default 5, fairseq's) */
    double lenpen; /* length penalty exponent (default 1) */
    double max_len_a;
    int max_len_b;   /* max_len = max_len_a·src_len + max_len_b (defaults 0, 200) */
    int max_len_cap; /* model positions cap (default 1023: fairseq's max_target_positions − 1) */
    int min_len;     /* default 1 */
    int nbest;       /* hypotheses returned per sentence (default 1, ≤ beam) */
    double unkpen;   /* subtracted from <unk>'s log-prob (default 0) */
    int no_repeat_ngram_size; /* 0: off (default) */
    double temperature;       /* > 0, default 1 */
    bool sampling;            /* default false: beam search */
    int sampling_topk;        /* ≤ 0: the whole vocabulary (default) */
    uint64_t seed;            /* of the sampling draws (default 1) */
    /* luna_generate's sampling draws for src[i] use sentence number sentence_ids[i] (NULL, the
     * default: i), so that a part of an input samples as it would within the whole input */
    const int *sentence_ids;
    /* luna_generate's beam search reads the selection's summary back every sync_interval steps
     * (0, the default: every step on the CPU, whose memory is the host's, every 8 on a device):
     * sentences finished in between stay in the pool, idle, until then. Results do not depend
     * on it. */
    int sync_interval;
} luna_beam_options;

void luna_beam_options_init(luna_beam_options *o);

typedef struct {
    int32_t *tokens;          /* [len], ends with </s> */
    float *positional_scores; /* [len] per-token log-probs (nats) */
    int len;                  /* including </s> */
    double score;             /* Σ positional_scores / len^lenpen (nats) */
} luna_hypothesis;

typedef struct {
    int count;             /* ≤ nbest; 0 only if no hypothesis could be completed */
    luna_hypothesis *hyps; /* best first */
} luna_nbest;

void luna_nbest_release(luna_nbest *n);

/* A source sentence: token ids including the final </s>. */
typedef struct {
    const int32_t *tokens;
    int len;
} luna_token_seq;

/* Decode sentences src[0..S) together as one batch. out [S] (released by the caller). */
luna_status luna_beam_search(luna_incremental *inc, const luna_beam_options *opt,
                             const luna_token_seq *src, int S, luna_nbest *out);

/* Decode n sentences with in-flight batching (decoding/inflight.c): sorted by source length (ties
 * by index), they enter a pool of at most batch_size sentences (0: no limit) and max_tokens padded
 * source tokens (sentences in flight × their longest source; 0: no limit; a sentence always
 * enters an empty pool); when a sentence finishes, the next one takes its rows. Each sentence's
 * hypotheses are those of luna_beam_search on it alone (on the CPU up to the last bits of sums
 * over its source padded to another length, as with any batch composition).
 * out [n] in input order. progress (optional) is called after steps that finished sentences, with
 * the sentences done so far. */
luna_status luna_generate(luna_incremental *inc, const luna_beam_options *opt,
                          const luna_token_seq *src, int n, int max_tokens, int batch_size,
                          luna_nbest *out, void (*progress)(void *ctx, int done, int total),
                          void *ctx);

/* Teacher-forced scores of given targets (fairseq --score-reference): tgt[i] ends with </s>;
 * positional [i] receives tgt[i].len per-token log-probs (nats, malloc'ed). Batched like
 * luna_generate. */
luna_status luna_score_targets(luna_incremental *inc, const luna_token_seq *src,
                               const luna_token_seq *tgt, int n, int max_tokens, int batch_size,
                               float **positional);

#endif
