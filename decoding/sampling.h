/* Host-side pieces of the search that the beam search (decoding/beam_search.c) applies to each
 * row's candidates: fairseq's --no-repeat-ngram-size bans and --sampling draws.
 *
 * N-gram blocking (fairseq NGramRepeatBlock): a hypothesis whose last N−1 tokens also occur
 * earlier, followed by token w, may not produce w now. The banned tokens are removed from the
 * row's top-k list on the host instead of being sent to the device as a per-row bias: the search
 * asks log_softmax_topk for k + (number of bans) candidates and drops the banned ones, which is
 * exactly the top k of the log-probs with the bans set to −inf (the order of the others does not
 * change), costs a few more candidates instead of a [rows, V] upload per step, and leaves the
 * backend contract (one [V] token bias) as it is. One deliberate difference from fairseq: the
 * leading </s> (the BOS of every hypothesis) is not part of the n-grams; fairseq's includes it,
 * which only matters for N = 1, where it bans </s> for the whole sentence.
 *
 * Sampling (fairseq search.Sampling): each row draws its next token from its candidates with
 * probability ∝ exp(log-prob) (the candidates are the k best, or all V tokens); the uniform number
 * comes from Philox (core/philox.h) keyed by (seed, sentence index, step, row), so a sentence's
 * samples depend only on the seed, its index in the input and its probabilities, not on batching
 * or threads. */
#ifndef LUNA_DECODING_SAMPLING_H
#define LUNA_DECODING_SAMPLING_H

#include <stdint.h>

/* The tokens that would complete an n-gram already in tok[1..len) (tok[0] is the BOS, skipped):
 * for every i ≥ 1 with tok[i .. i+n−2] = tok[len−n+1 .. len) and i + n − 1 < len, tok[i+n−1].
 * Writes them (with repeats) into ban[0..) (room for len entries) and returns how many. n ≥ 1. */
int luna_ngram_bans(const int32_t *tok, int len, int n, int32_t *ban);

/* Removes the banned tokens from a row's candidates lp/tok [k_in] (best first) and keeps the first
 * k_out of the rest at lp/tok [0, k_out) (in place); missing places (fewer than k_out left)
 * become −inf with the token fill. */
void luna_drop_banned(float *lp, int32_t *tok, int k_in, int k_out, const int32_t *ban, int nban,
                      int32_t fill);

/* A uniform double in [0, 1) (53 random bits) for draw `index` of sentence `sentence`. */
double luna_sampling_uniform(uint64_t seed, uint64_t sentence, uint64_t index);

/* The index j in [0, k) drawn with probability ∝ exp(lp[j]) by inversion of u ∈ [0, 1) (lp best
 * first; −inf: probability 0). When every lp is −inf (a dead row), 0. */
int luna_sample_index(const float *lp, int k, double u);

#endif
