/* The k best of a row's log-probs, best first, ties by the lower token: a binary heap of the k
 * best so far with the worst at the root, over two arrays (log-probs hl, tokens hi: a row of
 * log_softmax_topk's output itself), O(V log k), then heapsort. Host/device code
 * (core/host_device.h), so the CPU's log_softmax_topk (model/kernels/cpu/decode_select.c) and
 * the CUDA kernel's wide-k path (model/kernels/cuda/decode_select.cu) run the same selection. */
#ifndef LUNA_CORE_TOPK_HEAP_H
#define LUNA_CORE_TOPK_HEAP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/host_device.h"

/* (la, ja) ranks below (lb, jb): a lower log-prob, or the same and a higher token (a total
 * order, tokens being distinct) */
LUNA_HD static inline bool luna_topk_worse(float la, int32_t ja, float lb, int32_t jb) {
    return la < lb || (la == lb && ja > jb);
}

/* hl/hi[0..n): a heap with the worst at the root; entry i sinks to its place. */
LUNA_HD static inline void luna_topk_sift_down(float *hl, int32_t *hi, int n, int i) {
    const float l = hl[i];
    const int32_t j = hi[i];
    for (;;) {
        int w = 2 * i + 1;
        if (w >= n) break;
        if (w + 1 < n && luna_topk_worse(hl[w + 1], hi[w + 1], hl[w], hi[w])) w++;
        if (!luna_topk_worse(hl[w], hi[w], l, j)) break;
        hl[i] = hl[w], hi[i] = hi[w];
        i = w;
    }
    hl[i] = l, hi[i] = j;
}

/* Token j (tokens arrive in increasing order) into the heap of the k best so far (*n of them). A
 * token that only ties the worst kept one ranks below it (higher index): refused. */
LUNA_HD static inline void luna_topk_offer(float *hl, int32_t *hi, int *n, int k, float lp,
                                           int32_t j) {
    if (*n < k) {
        int i = (*n)++;
        while (i > 0 && luna_topk_worse(lp, j, hl[(i - 1) / 2], hi[(i - 1) / 2])) { /* sift up */
            hl[i] = hl[(i - 1) / 2], hi[i] = hi[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        hl[i] = lp, hi[i] = j;
        return;
    }
    if (!(lp > hl[0])) return;
    hl[0] = lp, hi[0] = j;
    luna_topk_sift_down(hl, hi, k, 0);
}

/* The heap's n entries best first, in place (heapsort: the worst goes last). */
LUNA_HD static inline void luna_topk_sort(float *hl, int32_t *hi, int n) {
    for (int m = n; m > 1; m--) {
        const float l = hl[0];
        const int32_t j = hi[0];
        hl[0] = hl[m - 1], hi[0] = hi[m - 1];
        luna_topk_sift_down(hl, hi, m - 1, 0);
        hl[m - 1] = l, hi[m - 1] = j;
    }
}

#endif
