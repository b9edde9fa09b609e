/* multi_sum_squares (core/backend.h, "Optimizer"; CPU reference model/kernels/cpu/multi_tensor.c):
 * per tensor Σ x², in double, rounded once to fp32, in an order of the GPU's own: a block of
 * kThreads threads per table block (core/reduce_order.h's blocks; thread l adds the elements
 * i ≡ l (mod kThreads) in increasing i), joined by a fixed tree in shared memory; then a block per
 * tensor adding its block partials the same way. Deterministic run to run; within the ACCUM tier
 * of the CPU's 8-lane order. (Eight threads a block, the CPU's lanes, and one thread adding a
 * tensor's ~4,000 partials in sequence, as before, left the GPU idle.) */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/reduce_order.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kBlock = LUNA_REDUCE_BLOCK, kThreads = 256;

/* v[0..kThreads) (shared) → v[0] by pairs (l, l + h), h = kThreads/2, ..., 1. */
__device__ inline double block_sum(double *v, double mine) {
    v[threadIdx.x] = mine;
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) v[threadIdx.x] = __dadd_rn(v[threadIdx.x], v[threadIdx.x + h]);
        __syncthreads();
    }
    return v[0];
}

/* partials[k] = Σ x² over global block k, of tensor block_tensor[k] (x offset and length from
 * it). */
__global__ void partials_kernel(const float *x, const int64_t *offsets, const int64_t *numels,
                                const int64_t *block_start, const int32_t *block_tensor,
                                double *partials) {
    LUNA_SHARED(double, lane_sum, kThreads);
    const int64_t k = blockIdx.x;
    const int t = block_tensor[k];
    const int64_t start = offsets[t] + (k - block_start[t]) * kBlock;
    const int64_t end = offsets[t] + numels[t];
    const int64_t len = end - start < kBlock ? end - start : kBlock;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < len; i += kThreads) {
        const double v = (double)x[start + i];
        acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    const double s = block_sum(lane_sum, acc);
    if (threadIdx.x == 0) partials[k] = s;
}

/* result[t] = Σ of tensor t's partials (blockIdx.x = t). */
__global__ void combine_kernel(float *result, const double *partials, const int64_t *block_start) {
    LUNA_SHARED(double, lane_sum, kThreads);
    const int t = blockIdx.x;
    double acc = 0.0;
    for (int64_t k = block_start[t] + threadIdx.x; k < block_start[t + 1]; k += kThreads)
        acc = __dadd_rn(acc, partials[k]);
    const double s = block_sum(lane_sum, acc);
    if (threadIdx.x == 0) result[t] = (float)s;
}

} // namespace

extern "C" {

cudaError_t luna_cuda_multi_sum_squares(cudaStream_t s, float *result, const float *x,
                                        int num_tensors, int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *partials) {
    if (num_tensors <= 0) return cudaSuccess;
    if (num_blocks > 0)
        LUNA_LAUNCH(partials_kernel, (unsigned)num_blocks, kThreads, 0, s, x, offsets, numels,
                    block_start, block_tensor, partials);
    LUNA_LAUNCH(combine_kernel, (unsigned)num_tensors, kThreads, 0, s, result,
                static_cast<const double *>(partials), block_start);
    return cudaGetLastError();
}

} // extern "C"
