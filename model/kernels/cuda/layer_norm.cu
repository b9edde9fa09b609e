/* LayerNorm over the last axis (core/backend.h; CPU reference model/kernels/cpu/layer_norm.c,
 * whose formulas these follow operation by operation).
 *
 * Forward: a 128-thread block per row; Σ x and Σ (x − mean)² in double by a fixed tree (per-thread
 * partial sums, warp shuffles, the warps in order); mean and rstd stored as fp32, then
 * y = ((x − mean)·rstd)·γ + β with one rounding per operation, as the CPU (no FMA contraction).
 * Backward: dγ, dβ by column sums in the order of model/kernels/column_sum_order.h (chunks of rows
 * in parallel, added in order in double: the CPU's order, so bit-identical and deterministic
 * without atomics; column_sum.cuh) — launched before dx, which may alias dy;
 * dx per row from the two row means (double tree), dx = rstd·((g − m1) − x̂·m2), g = dy·γ.
 * The row sums' order differs from the CPU's simd lanes: equal within the NORM tier (1e-6). */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

#include "model/kernels/cuda/column_sum.cuh"

constexpr int kThreads = 128, kWarps = kThreads / 32;

/* Σ over the block of one double per thread in a fixed order; every thread gets the total. */
__device__ inline double block_sum(double v, double *partial) {
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < kWarps; w++)
        total += partial[w];
    __syncthreads(); /* partial is reused */
    return total;
}

template <typename T>
__global__ void ln_fwd_kernel(T *y, float *mean, float *rstd, const T *x, const float *gamma,
                              const float *beta, int d, float eps) {
    LUNA_SHARED(double, partial, kWarps);
    const int64_t r = blockIdx.x;
    const T *xr = x + r * d;
    T *yr = y + r * d;
    double s = 0.0;
    for (int c = threadIdx.x; c < d; c += kThreads)
        s += (double)load(xr, c);
    const double m = block_sum(s, partial) / d;
    double v = 0.0;
    for (int c = threadIdx.x; c < d; c += kThreads) {
        const double t = (double)load(xr, c) - m;
        v = __dadd_rn(v, __dmul_rn(t, t)); /* t·t rounded, then added, as the CPU */
    }
    v = block_sum(v, partial) / d;
    const float mf = (float)m, rf = (float)(1.0 / sqrt(v + (double)eps));
    if (threadIdx.x == 0) mean[r] = mf, rstd[r] = rf;
    for (int c = threadIdx.x; c < d; c += kThreads) {
        const float xh = __fmul_rn(__fsub_rn(load(xr, c), mf), rf);
        store(yr, c, __fadd_rn(__fmul_rn(xh, gamma[c]), beta[c]));
    }
}

template <typename T>
__global__ void ln_bwd_dx_kernel(T *dx, const T *dy, const T *x, const float *mean,
                                 const float *rstd, const float *gamma, int d) {
    LUNA_SHARED(double, partial, kWarps);
    const int64_t r = blockIdx.x;
    const T *dyr = dy + r * d, *xr = x + r * d;
    T *dxr = dx + r * d;
    const float m = mean[r], rs = rstd[r];
    double s1 = 0.0, s2 = 0.0;
    for (int c = threadIdx.x; c < d; c += kThreads) {
        const float gc = __fmul_rn(load(dyr, c), gamma[c]);
        const float xhat = __fmul_rn(__fsub_rn(load(xr, c), m), rs);
        s1 += (double)gc;
        s2 += (double)__fmul_rn(gc, xhat);
    }
    const float m1 = (float)(block_sum(s1, partial) / d), m2 = (float)(block_sum(s2, partial) / d);
    for (int c = threadIdx.x; c < d; c += kThreads) {
        const float gc = __fmul_rn(load(dyr, c), gamma[c]);
        const float xhat = __fmul_rn(__fsub_rn(load(xr, c), m), rs);
        store(dxr, c, __fmul_rn(rs, __fsub_rn(__fsub_rn(gc, m1), __fmul_rn(xhat, m2))));
    }
}

typedef __nv_bfloat16 bf16_t;

} // namespace

extern "C" {

cudaError_t luna_cuda_layer_norm_forward(cudaStream_t s, int bf16, void *y, float *mean,
                                         float *rstd, const void *x, const float *gamma,
                                         const float *beta, int64_t rows, int d, float eps) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(ln_fwd_kernel<bf16_t>, (unsigned)rows, kThreads, 0, s, static_cast<bf16_t *>(y),
                    mean, rstd, static_cast<const bf16_t *>(x), gamma, beta, d, eps);
    else
        LUNA_LAUNCH(ln_fwd_kernel<float>, (unsigned)rows, kThreads, 0, s, static_cast<float *>(y),
                    mean, rstd, static_cast<const float *>(x), gamma, beta, d, eps);
    return cudaGetLastError();
}

cudaError_t luna_cuda_layer_norm_backward(cudaStream_t s, int bf16, void *dx, float *dgamma,
                                          float *dbeta, const void *dy, const void *x,
                                          const float *mean, const float *rstd, const float *gamma,
                                          int64_t rows, int d, luna_cuda_colsum_ws ws) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    cudaError_t e = cudaSuccess;
    if (bf16) {
        const bf16_t *dyb = static_cast<const bf16_t *>(dy), *xb = static_cast<const bf16_t *>(x);
        if (dgamma || dbeta) /* before dx: dx may alias dy */
            e = ln_params_sum<bf16_t>(s, dgamma, dbeta, dyb, xb, mean, rstd, rows, d, ws);
        if (e != cudaSuccess) return e;
        LUNA_LAUNCH(ln_bwd_dx_kernel<bf16_t>, (unsigned)rows, kThreads, 0, s,
                    static_cast<bf16_t *>(dx), dyb, xb, mean, rstd, gamma, d);
    } else {
        const float *dyf = static_cast<const float *>(dy), *xf = static_cast<const float *>(x);
        if (dgamma || dbeta)
            e = ln_params_sum<float>(s, dgamma, dbeta, dyf, xf, mean, rstd, rows, d, ws);
        if (e != cudaSuccess) return e;
        LUNA_LAUNCH(ln_bwd_dx_kernel<float>, (unsigned)rows, kThreads, 0, s,
                    static_cast<float *>(dx), dyf, xf, mean, rstd, gamma, d);
    }
    return cudaGetLastError();
}

} // extern "C"
