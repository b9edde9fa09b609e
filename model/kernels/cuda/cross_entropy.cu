/* Log-softmax + label-smoothed cross entropy (core/backend.h; CPU reference
 * model/kernels/cpu/cross_entropy.c, same formulas): a 256-thread block per row.
 * Forward: m = max z (order-free), Σ exp(z − m) and Σ z in double by a fixed tree from one read
 *   of the row (an online softmax: each thread's sum against its own running max, rescaled to
 *   the row's), lse, nll and loss formed in double and rounded once; pad rows all zero.
 * Forward and backward (cross_entropy_forward_backward): the forward's sums, then
 *   dz = exp(z − m)·(grad_scale / Σ exp(z − m)) − grad_scale·ε/V, then at the target
 *   − grad_scale·(1−ε) (the CPU's formula: from m and the sum, not from lse rounded to float);
 *   pad rows zero; dz may alias z (each element is read, then written, by one thread).
 * exp is CUDA's expf here and the CPU's vectorised vexpf there (both ≤ 2 ulp): results agree
 * within the tiers of the contract (loss ACCUM, gradient NORM), not bit for bit.
 * A target outside [0, V) (not the padding index) is not read: its row gets NaN and *bad = 1. */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ inline double block_sum(double v, double *partial) {
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < kWarps; w++)
        total += partial[w];
    __syncthreads();
    return total;
}

__device__ inline float block_max(float v, float *partial) {
    for (int m = 16; m > 0; m /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, v, m);
        v = o > v ? o : v;
    }
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    float total = partial[0];
    for (int w = 1; w < kWarps; w++)
        total = partial[w] > total ? partial[w] : total;
    __syncthreads();
    return total;
}

/* Rows of a multiple of 8 (V = 32000) are read 8 elements a thread as 16-byte vectors: an
 * eighth of the load instructions of a row (rows start on 16 bytes: V·sizeof(T) is a multiple of
 * 16). */
template <typename T> __device__ inline bool vector_rows(int V) { return V % 8 == 0; }

/* A thread's running max m and Σ exp(z − m) over its elements so far (an online softmax), after
 * the elements zv[0 .. n): the sum is rescaled (in double) only when the max grows, once for the
 * group, and each element's exp is taken against the max that includes its group. */
__device__ inline void online_add(const float *zv, int n, float *m, double *esum, double *zsum) {
    float mg = zv[0];
    for (int e = 1; e < n; e++)
        mg = zv[e] > mg ? zv[e] : mg;
    if (mg > *m) {
        *esum = *esum == 0.0 ? 0.0 : *esum * exp((double)*m - (double)mg); /* NaN stays NaN */
        *m = mg;
    }
    for (int e = 0; e < n; e++) {
        /* a −inf logit adds 0, whatever the max so far (also −inf: no NaN from −inf − −inf) */
        *esum += zv[e] == -INFINITY ? 0.0 : (double)expf(__fsub_rn(zv[e], *m));
        *zsum += (double)zv[e];
    }
}

/* A row's max m, Σ z and Σ exp(z − m) (in double, fixed trees), the same in every thread, from
 * one read of the row: each thread keeps its own max and sum (online_add), then the block's max
 * rescales every thread's sum before the sum over the block. (The logits of a 32k-token update
 * are ~2 GB: the read this saves is a third of the op's traffic.) */
template <typename T>
__device__ inline void row_sums(const T *z, int V, float *fpart, double *dpart, float *m_out,
                                double *zsum_out, double *esum_out) {
    float m = -INFINITY;
    double zsum = 0.0, esum = 0.0;
    if (vector_rows<T>(V)) {
        for (int v8 = threadIdx.x; v8 < V / 8; v8 += kThreads) {
            float zv[8];
            Vec8Of<T>::load(zv, z + 8 * (int64_t)v8);
            online_add(zv, 8, &m, &esum, &zsum);
        }
    } else {
        for (int v = threadIdx.x; v < V; v += kThreads) {
            const float zv = load(z, v);
            online_add(&zv, 1, &m, &esum, &zsum);
        }
    }
    const float row_max = block_max(m, fpart);
    /* a thread without elements adds nothing; a NaN (a NaN or ±inf logit, as on the CPU) stays */
    esum = esum == 0.0 ? 0.0 : esum * exp((double)m - (double)row_max);
    *m_out = row_max;
    *zsum_out = block_sum(zsum, dpart);
    *esum_out = block_sum(esum, dpart);
}

/* lse, nll and loss of row r from its sums and target logit, formed in double, rounded once. */
__device__ inline void row_losses(float *loss, float *nll, float *lse, int64_t r, double row_lse,
                                  float zy, double zsum, int V, float epsilon) {
    const double eps = epsilon;
    const double row_nll = row_lse - (double)zy;
    const double smooth = row_lse - zsum / (double)V;
    lse[r] = (float)row_lse;
    nll[r] = (float)row_nll;
    loss[r] = (float)__dadd_rn(__dmul_rn(1.0 - eps, row_nll), __dmul_rn(eps, smooth));
}

/* A row's gradient from its max m and scale = grad_scale / Σ exp(z − m); d may be z. */
template <typename T>
__device__ inline void row_gradient(T *d, const T *z, int V, int y, float m, float scale,
                                    float smooth, float target_term) {
    if (vector_rows<T>(V)) { /* each thread reads its 8 elements before it writes them */
        for (int v8 = threadIdx.x; v8 < V / 8; v8 += kThreads) {
            float g[8];
            Vec8Of<T>::load(g, z + 8 * (int64_t)v8);
            for (int e = 0; e < 8; e++) {
                g[e] = __fsub_rn(__fmul_rn(expf(__fsub_rn(g[e], m)), scale), smooth);
                if (8 * v8 + e == y) g[e] = __fsub_rn(g[e], target_term);
            }
            Vec8Of<T>::store(d + 8 * (int64_t)v8, g);
        }
        return;
    }
    for (int v = threadIdx.x; v < V; v += kThreads) {
        float g = __fsub_rn(__fmul_rn(expf(__fsub_rn(load(z, v), m)), scale), smooth);
        if (v == y) g = __fsub_rn(g, target_term);
        store(d, v, g);
    }
}

template <typename T>
__global__ void ce_fwd_kernel(float *loss, float *nll, float *lse, const T *logits,
                              const int32_t *targets, int V, float epsilon, int padding_idx,
                              int *bad) {
    LUNA_SHARED(double, dpart, kWarps);
    LUNA_SHARED(float, fpart, kWarps);
    const int64_t r = blockIdx.x;
    const int y = targets[r];
    if (y == padding_idx) {
        if (threadIdx.x == 0) loss[r] = nll[r] = lse[r] = 0.0f;
        return; /* the whole block leaves: no barrier is left waiting */
    }
    const float qnan = __int_as_float(0x7fc00000);
    if (y < 0 || y >= V) {
        if (threadIdx.x == 0) {
            loss[r] = nll[r] = lse[r] = qnan;
            if (bad) *bad = 1;
        }
        return;
    }
    const T *z = logits + r * (int64_t)V;
    float m;
    double zsum, esum;
    row_sums(z, V, fpart, dpart, &m, &zsum, &esum);
    if (threadIdx.x == 0)
        row_losses(loss, nll, lse, r, (double)m + log(esum), load(z, y), zsum, V, epsilon);
}

/* Forward and backward of a row in one block (cross_entropy_forward_backward): the forward's
 * sums, then every thread forms the same lse and scale and writes its elements' gradient — the
 * row's second read hits the cache. The forward's roundings are ce_fwd_kernel's. */
template <typename T>
__global__ void ce_fwd_bwd_kernel(float *loss, float *nll, float *lse, T *dz, const T *logits,
                                  const int32_t *targets, int V, float epsilon, int padding_idx,
                                  float grad_scale, float smooth, float target_term) {
    LUNA_SHARED(double, dpart, kWarps);
    LUNA_SHARED(float, fpart, kWarps);
    const int64_t r = blockIdx.x;
    const int y = targets[r];
    const T *z = logits + r * (int64_t)V;
    T *d = dz + r * (int64_t)V;
    if (y == padding_idx || y < 0 || y >= V) {
        const float out = y == padding_idx ? 0.0f : __int_as_float(0x7fc00000);
        if (threadIdx.x == 0) loss[r] = nll[r] = lse[r] = out;
        for (int v = threadIdx.x; v < V; v += kThreads)
            store(d, v, out);
        return; /* the whole block leaves: no barrier is left waiting */
    }
    float m;
    double zsum, esum;
    row_sums(z, V, fpart, dpart, &m, &zsum, &esum);
    const double row_lse = (double)m + log(esum); /* the same in every thread */
    const float zy = load(z, y); /* read before any thread overwrites the row (dz may be z) */
    __syncthreads();
    if (threadIdx.x == 0) row_losses(loss, nll, lse, r, row_lse, zy, zsum, V, epsilon);
    row_gradient(d, z, V, y, m, (float)((double)grad_scale / esum), smooth, target_term);
}

typedef __nv_bfloat16 bf16_t;

/* loss_sums: block 0 sums loss, block 1 nll; each thread its strided share in double, the
 * block's fixed tree (block_sum), then one add to the running sum. */
__global__ void loss_sums_kernel(double *sums, const float *loss, const float *nll, int64_t n) {
    LUNA_SHARED(double, partial, kWarps);
    const float *x = blockIdx.x == 0 ? loss : nll;
    double v = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
        v += (double)x[i];
    const double total = block_sum(v, partial);
    if (threadIdx.x == 0) sums[blockIdx.x] += total;
}

} // namespace

extern "C" {

cudaError_t luna_cuda_cross_entropy_forward(cudaStream_t s, int bf16, float *loss, float *nll,
                                            float *lse, const void *logits, const int32_t *targets,
                                            int64_t N, int V, float epsilon, int padding_idx,
                                            int *bad) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(ce_fwd_kernel<bf16_t>, (unsigned)N, kThreads, 0, s, loss, nll, lse,
                    static_cast<const bf16_t *>(logits), targets, V, epsilon, padding_idx, bad);
    else
        LUNA_LAUNCH(ce_fwd_kernel<float>, (unsigned)N, kThreads, 0, s, loss, nll, lse,
                    static_cast<const float *>(logits), targets, V, epsilon, padding_idx, bad);
    return cudaGetLastError();
}

cudaError_t luna_cuda_cross_entropy_forward_backward(cudaStream_t s, int bf16, float *loss,
                                                     float *nll, float *lse, void *dlogits,
                                                     const void *logits, const int32_t *targets,
                                                     int64_t N, int V, float epsilon,
                                                     int padding_idx, float grad_scale) {
    if (N <= 0 || V <= 0) return cudaSuccess;
    const float smooth = grad_scale * (epsilon / (float)V); /* host: as the CPU computes them */
    const float target_term = grad_scale * (1.0f - epsilon);
    if (bf16)
        LUNA_LAUNCH(ce_fwd_bwd_kernel<bf16_t>, (unsigned)N, kThreads, 0, s, loss, nll, lse,
                    static_cast<bf16_t *>(dlogits), static_cast<const bf16_t *>(logits), targets, V,
                    epsilon, padding_idx, grad_scale, smooth, target_term);
    else
        LUNA_LAUNCH(ce_fwd_bwd_kernel<float>, (unsigned)N, kThreads, 0, s, loss, nll, lse,
                    static_cast<float *>(dlogits), static_cast<const float *>(logits), targets, V,
                    epsilon, padding_idx, grad_scale, smooth, target_term);
    return cudaGetLastError();
}

cudaError_t luna_cuda_loss_sums(cudaStream_t s, double *sums, const float *loss, const float *nll,
                                int64_t n) {
    LUNA_LAUNCH(loss_sums_kernel, 2, kThreads, 0, s, sums, loss, nll, n);
    return cudaGetLastError();
}

} // extern "C"
