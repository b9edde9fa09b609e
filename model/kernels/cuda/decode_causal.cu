/* causal_step_products (core/backend.h; the CPU reference is luna_cpu_causal_step_products in
 * model/kernels/cpu/causal_contraction.c): the causal Luna decoder step's two running-sum
 * products, each row at its own position read from device memory. One block per group
 * g = r·H + h: the group's x row in shared memory, then each thread sums its columns n of
 * x · S_g in ascending k (fp32 fused multiply-adds; S_g's rows read coalesced across threads)
 * and scales by 1/t_r. Position-free launch arguments: one launch whatever positions the rows
 * are at, so a step's launches can be captured once and replayed. */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 64;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    causal_step_products_kernel(T *__restrict__ y, const T *__restrict__ x, const T *__restrict__ S,
                                const int32_t *__restrict__ t, int t_all, int H, int K, int N) {
    LUNA_DYNAMIC_SHARED(float, xs); /* [K] */
    const int64_t g = blockIdx.x;
    const int r = (int)(g / H);
    for (int k = threadIdx.x; k < K; k += kThreads)
        xs[k] = load(x, g * K + k);
    __syncthreads();
    const int tr = t ? t[r] + 1 : t_all;
    const float inv = 1.0f / (float)tr;
    const T *Sg = S + g * K * N;
    for (int n = threadIdx.x; n < N; n += kThreads) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++)
            acc = fmaf(xs[k], load(Sg, (int64_t)k * N + n), acc);
        store(y, g * N + n, __fmul_rn(inv, acc));
    }
}

typedef __nv_bfloat16 bf16_t;

} // namespace

extern "C" {

cudaError_t luna_cuda_causal_step_products(cudaStream_t s, int bf16, void *y, const void *x,
                                           const void *S, const int32_t *t, int t_all, int R, int H,
                                           int K, int N) {
    const int64_t G = (int64_t)R * H;
    if (G <= 0) return cudaSuccess;
    if (G > 0x7fffffff || (size_t)K * sizeof(float) > 48 * 1024) return cudaErrorInvalidValue;
    const size_t shmem = (size_t)K * sizeof(float);
    if (bf16)
        LUNA_LAUNCH(causal_step_products_kernel<bf16_t>, (unsigned)G, kThreads, shmem, s,
                    static_cast<bf16_t *>(y), static_cast<const bf16_t *>(x),
                    static_cast<const bf16_t *>(S), t, t_all, H, K, N);
    else
        LUNA_LAUNCH(causal_step_products_kernel<float>, (unsigned)G, kThreads, shmem, s,
                    static_cast<float *>(y), static_cast<const float *>(x),
                    static_cast<const float *>(S), t, t_all, H, K, N);
    return cudaGetLastError();
}

} // extern "C"
