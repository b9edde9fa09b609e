/* The beam search's candidate selection (decoding/beam_search.c, decoding/inflight.c and the
 * beam_select op, core/beam_select.h): the best K of a sentence's (beam, token) candidates in
 * O(n log K) with a binary heap, instead of an O(n·K) sorted insertion list. Candidates are
 * offered in a fixed order (beam by beam, each row's list best first); seq is that arrival index.
 * The order is score descending, ties by arrival (the insertion list's rule: an equal score goes
 * after the ones already kept and never displaces the worst kept one), so the result is the
 * insertion list's, candidate for candidate. Host/device code (core/host_device.h): only double
 * compares and integer moves, the same on every backend. */
#ifndef LUNA_CORE_BEAM_CANDIDATES_H
#define LUNA_CORE_BEAM_CANDIDATES_H

#include <stdbool.h>

#include "core/host_device.h"

typedef struct {
    double score;
    int beam, token, seq;
} luna_cand;

LUNA_HD static inline luna_cand luna_cand_make(double score, int beam, int token, int seq) {
    luna_cand c;
    c.score = score, c.beam = beam, c.token = token, c.seq = seq;
    return c;
}

/* a ranks below b */
LUNA_HD static inline bool luna_cand_worse(luna_cand a, luna_cand b) {
    return a.score < b.score || (a.score == b.score && a.seq > b.seq);
}

LUNA_HD static inline void luna_cand_sift_down(luna_cand *heap, int n, int i) {
    const luna_cand c = heap[i];
    for (;;) {
        int w = 2 * i + 1;
        if (w >= n) break;
        if (w + 1 < n && luna_cand_worse(heap[w + 1], heap[w])) w++;
        if (!luna_cand_worse(heap[w], c)) break;
        heap[i] = heap[w];
        i = w;
    }
    heap[i] = c;
}

/* Offer c (seq larger than every earlier offer's) to the heap heap[0..*n) of the best k so far,
 * the worst at the root. */
LUNA_HD static inline void luna_cand_offer(luna_cand *heap, int *n, int k, luna_cand c) {
    if (*n < k) {
        int i = (*n)++;
        while (i > 0 && luna_cand_worse(c, heap[(i - 1) / 2])) {
            heap[i] = heap[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        heap[i] = c;
        return;
    }
    if (!(c.score > heap[0].score)) return;
    heap[0] = c;
    luna_cand_sift_down(heap, k, 0);
}

/* The heap's n candidates best first, in place. */
LUNA_HD static inline void luna_cand_sort(luna_cand *heap, int n) {
    for (int m = n; m > 1; m--) {
        const luna_cand w = heap[0];
        heap[0] = heap[m - 1];
        luna_cand_sift_down(heap, m - 1, 0);
        heap[m - 1] = w;
    }
}

#endif
