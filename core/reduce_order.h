/* The fixed order of every deterministic reduction over a tensor (the optimizer's norms and
 * Apollo's sums, the clipping norms), on every backend; C, C++ and CUDA include it.
 *
 *   - x [n] is cut into blocks of LUNA_REDUCE_BLOCK elements (the last may be shorter);
 *   - block k's partial P_k = Σ_{lane < LUNA_REDUCE_LANES} L_lane, where L_lane is the sequential
 *     double sum of the block's elements i ≡ lane (mod LUNA_REDUCE_LANES) in increasing i;
 *   - the result is ((P_0 + P_1) + P_2) + ... in block order, rounded once to float.
 * Threads (CPU) or thread blocks (GPU) only decide who computes which P_k, never how it is
 * computed or combined, so results are bit-identical for any thread count and across backends.
 * A tensor table (core/tensor_table.h) numbers these blocks over all its tensors. */
#ifndef LUNA_CORE_REDUCE_ORDER_H
#define LUNA_CORE_REDUCE_ORDER_H

#define LUNA_REDUCE_BLOCK 4096
#define LUNA_REDUCE_LANES 8

#endif
