/* The order in which the CPU backend adds a column sum over rows (bias gradients, residual_norm's
 * LayerNorm dγ and dβ): the rows in chunks of LUNA_COLSUM_CHUNK, each chunk summed in row order in
 * double from 0, the chunk sums added in chunk order in double from 0, and that total added to the
 * fp32 output once:  out_c = (float)((double)out_c + Σ_k Σ_{r ∈ chunk k} v_rc).
 * Thread-owned column ranges adding in this order (model/kernels/cpu/gemm.c, layer_norm.c) give
 * bit-identical results for any thread count, without atomics. The CUDA backend sums in chunks of
 * the same length but in fp32 and adds the chunk sums by a tree of its own
 * (model/kernels/cuda/column_sum.cuh): within the ACCUM tier of these sums, not their bits. */
#ifndef LUNA_KERNELS_COLUMN_SUM_ORDER_H
#define LUNA_KERNELS_COLUMN_SUM_ORDER_H

#define LUNA_COLSUM_CHUNK 64

#endif
