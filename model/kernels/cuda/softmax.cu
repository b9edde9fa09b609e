/* Masked softmax over the last axis, softmax_forward (core/backend.h; the CPU reference is
 * model/kernels/cpu/softmax.c; training's softmax_dropout is fused.cu): one 128-thread block per
 * row.
 *
 * Forward: max over the valid columns (order-free), Σ exp(x − max) in double by a fixed tree
 * (per-thread partial sums in column order, then the warps' shuffles, then the four warps in
 * order), inv = (float)(1/Σ), y = expf(x − max)·inv recomputed in the second pass (one rounding
 * per stored value, also for bf16; in place allowed: each thread rewrites only what it read).
 * The CPU sums sequentially; both sums are in double and rounded to fp32 once, so results agree
 * bit for bit except when the two orders round across an fp32 boundary (NORM tier: 1e-6). */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;

/* Σ over the block of one double per thread, in a fixed order; every thread gets the total. */
__device__ inline double block_sum(double v, double *partial) {
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < kWarps; w++)
        total += partial[w];
    __syncthreads(); /* partial is reused by the next reduction */
    return total;
}

/* max over the block (fmaxf: a NaN never wins, as the CPU's fmaxf) */
__device__ inline float block_max(float v, float *partial) {
    for (int m = 16; m > 0; m /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float total = -INFINITY;
    for (int w = 0; w < kWarps; w++)
        total = fmaxf(total, partial[w]);
    __syncthreads();
    return total;
}

template <typename T>
__global__ void softmax_fwd_kernel(T *y, const T *x, int cols, const int32_t *valid_cols,
                                   int64_t rows_per_group, int causal_period) {
    LUNA_SHARED(double, dpart, kWarps);
    LUNA_SHARED(float, fpart, kWarps);
    const int64_t r = blockIdx.x;
    const T *xr = x + r * cols;
    T *yr = y + r * cols;
    int64_t v = valid_cols ? valid_cols[r / rows_per_group] : cols;
    if (causal_period > 0 && r % causal_period + 1 < v) v = r % causal_period + 1;
    int valid = v < 0 ? 0 : (v > cols ? cols : (int)v);
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < valid; c += kThreads)
        mx = fmaxf(mx, load(xr, c));
    mx = block_max(mx, fpart);
    if (mx == -INFINITY) valid = 0; /* nothing to attend to: the row is zeros */
    double sum = 0.0;
    for (int c = threadIdx.x; c < valid; c += kThreads)
        sum += (double)expf(__fsub_rn(load(xr, c), mx));
    sum = block_sum(sum, dpart);
    const float inv = (float)(1.0 / sum);
    for (int c = threadIdx.x; c < cols; c += kThreads)
        store(yr, c, c < valid ? __fmul_rn(expf(__fsub_rn(load(xr, c), mx)), inv) : 0.0f);
}

typedef __nv_bfloat16 bf16_t;

} // namespace

extern "C" {

cudaError_t luna_cuda_softmax_forward(cudaStream_t s, int bf16, void *y, const void *x,
                                      int64_t rows, int cols, const int32_t *valid_cols,
                                      int64_t rows_per_group, int causal_period) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(softmax_fwd_kernel<bf16_t>, (unsigned)rows, kThreads, 0, s,
                    static_cast<bf16_t *>(y), static_cast<const bf16_t *>(x), cols, valid_cols,
                    rows_per_group, causal_period);
    else
        LUNA_LAUNCH(softmax_fwd_kernel<float>, (unsigned)rows, kThreads, 0, s,
                    static_cast<float *>(y), static_cast<const float *>(x), cols, valid_cols,
                    rows_per_group, causal_period);
    return cudaGetLastError();
}

} // extern "C"
