/* Clipping and Adam over the flat buffers (core/backend.h multi-tensor ops; CPU reference
 * model/kernels/cpu/multi_tensor.c and optimizer_kernels.c, followed operation by operation in
 * double without contraction).
 *   clip_coefficients: one thread (a few hundred tensors; the double sum's order is fixed).
 *   multi_scale: a block per 4096-element table block; factor 1 skipped.
 *   multi_adam_update: per-tensor scalars (step size from pow and sqrt in double, keep) by one
 *   thread per tensor, which also advances steps[i]; then a block per table block.
 * Under the CPU execution harness math is libm's, so results equal the CPU bit for bit; on a GPU
 * CUDA's double pow may differ from glibc's by an ulp of the step size (parameters within
 * 1e-15 relative per update). */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kBlock = 4096, kThreads = 256;

__device__ inline double clip_coefficient(double clip_norm, double norm) {
    const double c = clip_norm / __dadd_rn(norm, 1e-6);
    return c < 1.0 ? c : 1.0;
}

__global__ void clip_kernel(float *coef, double *summary, const float *sumsq, int n,
                            double clip_norm, int mode) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double total_sq = 0.0, max_norm = 0.0;
    bool finite = true;
    for (int i = 0; i < n; i++) {
        const double sq = (double)sumsq[i];
        if (!isfinite(sq)) finite = false;
        total_sq = __dadd_rn(total_sq, sq);
        const double nrm = sqrt(sq);
        if (!(nrm <= max_norm)) max_norm = nrm; /* NaN propagates */
    }
    double norm = mode == 1 ? sqrt(total_sq) : max_norm;
    if (!finite && isfinite(norm)) norm = __longlong_as_double(0x7ff0000000000000LL); /* +inf */
    bool any = false;
    const bool active = finite && clip_norm != 0.0;
    const double total_coef = clip_coefficient(clip_norm, norm);
    for (int i = 0; i < n; i++) {
        double c = 1.0;
        if (active)
            c = mode == 1 ? total_coef : clip_coefficient(clip_norm, sqrt((double)sumsq[i]));
        if (c < 1.0)
            any = true;
        else
            c = 1.0;
        coef[i] = (float)c;
    }
    summary[0] = norm;
    summary[1] = finite ? 1.0 : 0.0;
    summary[2] = any ? 1.0 : 0.0;
}

struct Table {
    const int64_t *offsets, *numels, *block_start;
    const int32_t *block_tensor;
};

/* Block k of the table: tensor, first flat element of the tensor, start within it, length. */
__device__ inline void block_of(const Table &t, int64_t k, int *tensor, int64_t *base,
                                int64_t *start, int64_t *len) {
    *tensor = t.block_tensor[k];
    *base = t.offsets[*tensor];
    *start = (k - t.block_start[*tensor]) * kBlock;
    const int64_t rest = t.numels[*tensor] - *start;
    *len = rest < kBlock ? rest : kBlock;
}

__global__ void multi_scale_kernel(float *x, Table t, const float *coef, float alpha) {
    int i;
    int64_t base, start, len;
    block_of(t, blockIdx.x, &i, &base, &start, &len);
    const float a = coef ? coef[i] : alpha;
    if (a == 1.0f) return;
    float *p = x + base + start;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
        p[j] = __fmul_rn(p[j], a);
}

enum { STEP_SIZE = 0, KEEP = 1, NSCALARS = 2 };

__global__ void adam_scalars_kernel(double *sc, int64_t *steps, int nt, double lr, double beta1,
                                    double beta2, double weight_decay) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt) return;
    const int64_t t = steps[i] + 1;
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    sc[(size_t)i * NSCALARS + STEP_SIZE] = __dmul_rn(lr, sqrt(bc2)) / bc1;
    sc[(size_t)i * NSCALARS + KEEP] = 1.0 - __dmul_rn(lr, weight_decay);
    steps[i] = t;
}

/* One element of Adam, as optimizer_kernels.c. */
__device__ inline void adam_element(float *th, float *m, float *v, float gf, double beta1,
                                    double beta2, double eps, double step_size, double keep) {
    const double gi = (double)gf;
    const float m_new = (float)__dadd_rn(__dmul_rn(beta1, (double)*m), __dmul_rn(1.0 - beta1, gi));
    const float v_new =
        (float)__dadd_rn(__dmul_rn(beta2, (double)*v), __dmul_rn(__dmul_rn(1.0 - beta2, gi), gi));
    *m = m_new;
    *v = v_new;
    const double denom = __dadd_rn(sqrt((double)v_new), eps);
    *th = (float)(__dmul_rn((double)*th, keep) - __dmul_rn(step_size, (double)m_new) / denom);
}

__global__ void multi_adam_kernel(float *theta, const float *g, float *exp_avg, float *exp_avg_sq,
                                  Table t, const double *sc, double beta1, double beta2,
                                  double eps) {
    int i;
    int64_t base, start, len;
    block_of(t, blockIdx.x, &i, &base, &start, &len);
    const double step_size = sc[(size_t)i * NSCALARS + STEP_SIZE],
                 keep = sc[(size_t)i * NSCALARS + KEEP];
    for (int64_t j = start + threadIdx.x; j < start + len; j += blockDim.x)
        adam_element(theta + base + j, exp_avg + base + j, exp_avg_sq + base + j, g[base + j],
                     beta1, beta2, eps, step_size, keep);
}

} // namespace

extern "C" {

cudaError_t luna_cuda_clip_coefficients(cudaStream_t s, float *coef, double *summary,
                                        const float *sumsq, int n, double clip_norm, int mode) {
    LUNA_LAUNCH(clip_kernel, 1, 1, 0, s, coef, summary, sumsq, n, clip_norm, mode);
    return cudaGetLastError();
}

cudaError_t luna_cuda_multi_scale(cudaStream_t s, float *x, int64_t num_blocks,
                                  const int64_t *offsets, const int64_t *numels,
                                  const int64_t *block_start, const int32_t *block_tensor,
                                  const float *coef, float alpha) {
    if (num_blocks <= 0 || (!coef && alpha == 1.0f)) return cudaSuccess;
    const Table t = {offsets, numels, block_start, block_tensor};
    LUNA_LAUNCH(multi_scale_kernel, (unsigned)num_blocks, kThreads, 0, s, x, t, coef, alpha);
    return cudaGetLastError();
}

cudaError_t luna_cuda_multi_adam_update(cudaStream_t s, float *theta, const float *g,
                                        float *exp_avg, float *exp_avg_sq, int num_tensors,
                                        int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *workspace,
                                        int64_t *steps, double lr, double beta1, double beta2,
                                        double eps, double weight_decay) {
    if (num_tensors <= 0) return cudaSuccess;
    LUNA_LAUNCH(adam_scalars_kernel, (unsigned)((num_tensors + 127) / 128), 128, 0, s, workspace,
                steps, num_tensors, lr, beta1, beta2, weight_decay);
    if (num_blocks > 0) {
        const Table t = {offsets, numels, block_start, block_tensor};
        LUNA_LAUNCH(multi_adam_kernel, (unsigned)num_blocks, kThreads, 0, s, theta, g, exp_avg,
                    exp_avg_sq, t, static_cast<const double *>(workspace), beta1, beta2, eps);
    }
    return cudaGetLastError();
}

} // extern "C"
