/* multi_sum_squares (core/backend.h, "Optimizer"; CPU reference model/kernels/cpu/multi_tensor.c)
 * in the order of core/reduce_order.h, so results are bit-identical to the CPU's: block k's
 * partial is Σ over the lanes of the lane sums (lane l adds the block's elements i ≡ l (mod
 * LUNA_REDUCE_LANES) in increasing i, in double); a tensor's result is its block partials added
 * in block order, rounded once to fp32.
 * One CUDA block of LUNA_REDUCE_LANES threads per table block (thread l is lane l; thread 0 adds
 * the lanes in order), then one thread per tensor adds its partials in order. That is few threads
 * per element; the order, not the speed, is the point here, and the clipping norms are a small
 * part of an update. */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/reduce_order.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kBlock = LUNA_REDUCE_BLOCK, kLanes = LUNA_REDUCE_LANES;

/* partials[k] = P_k of global block k, of tensor block_tensor[k] (x offset and length from it);
 * blockIdx.x = k, threadIdx.x = lane. */
__global__ void partials_kernel(const float *x, const int64_t *offsets, const int64_t *numels,
                                const int64_t *block_start, const int32_t *block_tensor,
                                double *partials) {
    LUNA_SHARED(double, lane_sum, kLanes);
    const int64_t k = blockIdx.x;
    const int t = block_tensor[k];
    const int64_t start = offsets[t] + (k - block_start[t]) * kBlock;
    const int64_t end = offsets[t] + numels[t];
    const int64_t len = end - start < kBlock ? end - start : kBlock;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < len; i += kLanes) {
        const double v = (double)x[start + i];
        acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    lane_sum[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int l = 0; l < kLanes; l++)
            s = __dadd_rn(s, lane_sum[l]);
        partials[k] = s;
    }
}

/* result[t] = the partials of tensor t added in order. */
__global__ void combine_kernel(float *result, const double *partials, const int64_t *block_start,
                               int num_tensors) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= num_tensors) return;
    double total = 0.0;
    for (int64_t k = block_start[t]; k < block_start[t + 1]; k++)
        total = __dadd_rn(total, partials[k]);
    result[t] = (float)total;
}

} // namespace

extern "C" {

cudaError_t luna_cuda_multi_sum_squares(cudaStream_t s, float *result, const float *x,
                                        int num_tensors, int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *partials) {
    if (num_tensors <= 0) return cudaSuccess;
    if (num_blocks > 0)
        LUNA_LAUNCH(partials_kernel, (unsigned)num_blocks, kLanes, 0, s, x, offsets, numels,
                    block_start, block_tensor, partials);
    LUNA_LAUNCH(combine_kernel, (unsigned)((num_tensors + 127) / 128), 128, 0, s, result, partials,
                block_start, num_tensors);
    return cudaGetLastError();
}

} // extern "C"
