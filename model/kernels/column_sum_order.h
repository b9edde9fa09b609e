/* The order in which every backend adds a column sum over rows (bias gradients, residual_norm's
 * LayerNorm dγ and dβ): the rows in chunks of LUNA_COLSUM_CHUNK, each chunk summed in row order in
 * double from 0, the chunk sums added in chunk order in double from 0, and that total added to the
 * fp32 output once:  out_c = (float)((double)out_c + Σ_k Σ_{r ∈ chunk k} v_rc).
 *
 * Why chunks: a GPU sums the chunks in parallel (model/kernels/cuda/column_sum.cuh) — one thread
 * per column walking every row leaves a GPU waiting on one long chain of loads per column — while
 * the CPU, adding the same chunks in the same order (model/kernels/cpu/gemm.c, layer_norm.c),
 * keeps both backends bit-identical and deterministic without atomics. With rows ≤
 * LUNA_COLSUM_CHUNK this is the plain row-order sum. 64 rows: a GPU thread sums one chunk, its
 * loads in flight together, and an 8k-row, 512-column sum has 64k of them (longer chunks mean
 * fewer threads, each waiting on a longer chain; what the sums cost: docs/benchmarks.md). */
#ifndef LUNA_KERNELS_COLUMN_SUM_ORDER_H
#define LUNA_KERNELS_COLUMN_SUM_ORDER_H

#define LUNA_COLSUM_CHUNK 64

#endif
