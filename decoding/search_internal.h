/* Pieces of the search shared by the batch search (decoding/beam_search.c) and the in-flight
 * one behind luna_generate (decoding/inflight.c). Not a public interface. */
#ifndef LUNA_DECODING_SEARCH_INTERNAL_H
#define LUNA_DECODING_SEARCH_INTERNAL_H

#include "decoding/beam_search.h"

luna_status luna_search_check_options(const luna_beam_options *o);

/* Adds to out (room for o->beam) the hypothesis of a row whose tokens t[0..step] (t[0] the BOS)
 * and cumulative scores s[0..step) end with </s> at `step` with cumulative score eos_score;
 * nothing when out is full. */
luna_status luna_search_finalize(const luna_beam_options *o, const int32_t *t, const double *s,
                                 luna_nbest *out, int step, double eos_score);

/* The same from the hypothesis's log-probs lp[0..step] (the last one </s>'s), as the beam_select
 * op files them (core/beam_select.h). */
luna_status luna_search_finalize_log_probs(const luna_beam_options *o, const int32_t *t,
                                           const float *lp, luna_nbest *out, int step,
                                           double eos_score);

/* Stable sort by score, best first; keep nbest. */
void luna_search_sort_nbest(luna_nbest *n, int nbest);

/* *order [n] (malloc'ed): 0..n−1 sorted by source length, ties by index. */
luna_status luna_search_sorted_order(const luna_token_seq *src, int n, int **order);

#endif
