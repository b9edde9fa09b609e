/* What both backends need to know about a grid of GEMM outputs (core/backend.h, gemm_grid). */
#ifndef LUNA_KERNELS_GEMM_GRID_H
#define LUNA_KERNELS_GEMM_GRID_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"

/* Whether the outputs C_oi (M × N, row stride ldc, at o·s.outer + i·s.inner) of a grid never
 * share an element, so the products may run in any order: within one o the inner matrices are
 * stacked (|inner stride| ≥ one matrix's extent) or side by side within the rows (heads
 * interleaved: N ≤ |inner stride| and all of them fit in ldc); across o the blocks of inner
 * matrices are stacked. A plain batch (inner = 1) may be stacked or side by side. Otherwise
 * (e.g. stride 0, summing into one C) the products are made one by one, in grid order. */
static inline bool luna_grid_disjoint(int M, int N, int ldc, luna_grid_stride s, int outer,
                                      int inner) {
    if (inner == 1) { /* a plain batch: its matrices may be side by side too */
        s = (luna_grid_stride){0, s.outer};
        inner = outer;
        outer = 1;
    }
    const int64_t extent = (int64_t)(M - 1) * ldc + N; /* a matrix's first to last element */
    const int64_t si = s.inner < 0 ? -s.inner : s.inner, so = s.outer < 0 ? -s.outer : s.outer;
    int64_t block = extent; /* the same for the inner matrices of one o */
    if (inner > 1) {
        if (si >= extent)
            block = (int64_t)(inner - 1) * si + extent;
        else if (si >= N && (int64_t)(inner - 1) * si + N <= ldc)
            block = extent + (int64_t)(inner - 1) * si;
        else
            return false;
    }
    return outer == 1 || so >= block;
}

#endif
