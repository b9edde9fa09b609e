/* Reductions to device scalars (core/backend.h "Reductions", multi_sum_squares; CPU reference
 * model/kernels/cpu/reduce.c) in the CPU's exact order, so results are bit-identical to it:
 *   x [n] is cut into blocks of 4096 elements; block k's partial is Σ_{l=0..7} L_l, where lane l
 *   adds the block's elements i ≡ l (mod 8) in increasing i, in double; the result is the block
 *   partials added in block order, rounded once to fp32.
 * One 8-thread CUDA block per 4096-element block (thread l is lane l; thread 0 adds the eight
 * lanes in order), then one thread adds the partials in order (per tensor for the multi op).
 * That is few threads per element; the order, not the speed, is the point here, and the
 * optimizer's reductions are a small part of an update (the per-kernel cost model says so).
 * max_abs is order-free: one block of 1024 threads, NaN if any element is NaN.
 * Backward ops are elementwise, with the CPU's roundings (c·x then +, no FMA). */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kBlock = 4096, kLanes = 8;

enum Kind { SUM = 0, SQUARES = 1, POW4 = 2, DOT = 3 };

__device__ inline double term(int kind, const float *x, const float *y, int64_t i) {
    const double v = (double)x[i];
    switch (kind) {
    case SQUARES: return __dmul_rn(v, v);
    case POW4: {
        const double s = __dmul_rn(v, v);
        return __dmul_rn(s, s);
    }
    case DOT: return __dmul_rn(v, (double)y[i]);
    default: return v;
    }
}

/* partials[first + k] = P_k of x's blocks; blockIdx.x = k, threadIdx.x = lane. For the tensor
 * table: block k is global block k, of tensor block_tensor[k] (x offset and length from it). */
__global__ void partials_kernel(int kind, const float *x, const float *y, int64_t n,
                                const int64_t *offsets, const int64_t *numels,
                                const int64_t *block_start, const int32_t *block_tensor,
                                double *partials) {
    LUNA_SHARED(double, lane_sum, kLanes);
    const int64_t k = blockIdx.x;
    int64_t start = k * kBlock, end = n;
    if (block_tensor) { /* multi: the block's place inside its tensor */
        const int t = block_tensor[k];
        start = offsets[t] + (k - block_start[t]) * kBlock;
        end = offsets[t] + numels[t];
    }
    const int64_t len = end - start < kBlock ? end - start : kBlock;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < len; i += kLanes)
        acc = __dadd_rn(acc, term(kind, x + start, y ? y + start : nullptr, i));
    lane_sum[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int l = 0; l < kLanes; l++)
            s = __dadd_rn(s, lane_sum[l]);
        partials[k] = s;
    }
}

/* result[t] = partials of tensor t added in order (no table: one tensor of all blocks). */
__global__ void combine_kernel(float *result, const double *partials, int64_t nblocks,
                               const int64_t *block_start, int num_tensors) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (block_start ? num_tensors : 1)) return;
    const int64_t b0 = block_start ? block_start[t] : 0,
                  b1 = block_start ? block_start[t + 1] : nblocks;
    double total = 0.0;
    for (int64_t k = b0; k < b1; k++)
        total = __dadd_rn(total, partials[k]);
    result[t] = (float)total;
}

__global__ void max_abs_kernel(float *result, const float *x, int64_t n) {
    LUNA_SHARED(float, wmax, 32);
    LUNA_SHARED(int, wnan, 32);
    float best = 0.0f;
    int nan = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float a = fabsf(x[i]);
        best = a > best ? a : best;
        nan |= a != a;
    }
    for (int m = 16; m > 0; m /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, best, m);
        best = o > best ? o : best;
        nan |= __shfl_xor_sync(0xffffffffu, nan, m);
    }
    if (threadIdx.x % 32 == 0) wmax[threadIdx.x / 32] = best, wnan[threadIdx.x / 32] = nan;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; w++) {
            best = wmax[w] > best ? wmax[w] : best;
            nan |= wnan[w];
        }
        *result = nan ? __int_as_float(0x7fc00000) : best;
    }
}

/* dx += c·x (pow: c·(x·x·x)) with the CPU's roundings. */
__global__ void pow_backward_kernel(float *dx, const float *x, float c, int64_t n, int cube) {
    GRID_STRIDE(i, n) {
        const float v = x[i];
        const float t = cube ? __fmul_rn(__fmul_rn(v, v), v) : v;
        dx[i] = __fadd_rn(dx[i], __fmul_rn(c, t));
    }
}

inline unsigned blocks_for(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

cudaError_t blocked(cudaStream_t s, int kind, float *result, const float *x, const float *y,
                    int64_t n, double *partials) {
    const int64_t nblocks = (n + kBlock - 1) / kBlock;
    if (nblocks > 0)
        LUNA_LAUNCH(partials_kernel, (unsigned)nblocks, kLanes, 0, s, kind, x, y, n, nullptr,
                    nullptr, nullptr, nullptr, partials);
    LUNA_LAUNCH(combine_kernel, 1, 32, 0, s, result, partials, nblocks, nullptr, 1);
    return cudaGetLastError();
}

} // namespace

extern "C" {

cudaError_t luna_cuda_sum_squares(cudaStream_t s, float *result, const float *x, int64_t n,
                                  double *partials) {
    return blocked(s, SQUARES, result, x, nullptr, n, partials);
}
cudaError_t luna_cuda_sum_pow4(cudaStream_t s, float *result, const float *x, int64_t n,
                               double *partials) {
    return blocked(s, POW4, result, x, nullptr, n, partials);
}
cudaError_t luna_cuda_dot(cudaStream_t s, float *result, const float *x, const float *y, int64_t n,
                          double *partials) {
    return blocked(s, DOT, result, x, y, n, partials);
}
cudaError_t luna_cuda_sum(cudaStream_t s, float *result, const float *x, int64_t n,
                          double *partials) {
    return blocked(s, SUM, result, x, nullptr, n, partials);
}

cudaError_t luna_cuda_multi_sum_squares(cudaStream_t s, float *result, const float *x,
                                        int num_tensors, int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *partials) {
    if (num_tensors <= 0) return cudaSuccess;
    if (num_blocks > 0)
        LUNA_LAUNCH(partials_kernel, (unsigned)num_blocks, kLanes, 0, s, (int)SQUARES, x, nullptr,
                    (int64_t)0, offsets, numels, block_start, block_tensor, partials);
    LUNA_LAUNCH(combine_kernel, (unsigned)((num_tensors + 127) / 128), 128, 0, s, result, partials,
                num_blocks, block_start, num_tensors);
    return cudaGetLastError();
}

cudaError_t luna_cuda_max_abs(cudaStream_t s, float *result, const float *x, int64_t n) {
    LUNA_LAUNCH(max_abs_kernel, 1, 1024, 0, s, result, x, n);
    return cudaGetLastError();
}

cudaError_t luna_cuda_sum_squares_backward(cudaStream_t s, float *dx, const float *x, float g,
                                           int64_t n) {
    if (n <= 0) return cudaSuccess;
    LUNA_LAUNCH(pow_backward_kernel, blocks_for(n), 256, 0, s, dx, x, 2.0f * g, n, 0);
    return cudaGetLastError();
}
cudaError_t luna_cuda_sum_pow4_backward(cudaStream_t s, float *dx, const float *x, float g,
                                        int64_t n) {
    if (n <= 0) return cudaSuccess;
    LUNA_LAUNCH(pow_backward_kernel, blocks_for(n), 256, 0, s, dx, x, 4.0f * g, n, 1);
    return cudaGetLastError();
}

} // extern "C"
