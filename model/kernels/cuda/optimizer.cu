/* Clipping and Adam over the flat buffers (core/backend.h multi-tensor ops; CPU reference
 * model/kernels/cpu/multi_tensor.c and optimizer_kernels.c, followed operation by operation in
 * double without contraction).
 *   clip_coefficients: one thread (a few hundred tensors; the double sum's order is fixed).
 *   multi_scale: a block per table block (core/reduce_order.h's blocks); factor 1 skipped.
 *   multi_adam_update: per-tensor scalars (step size from pow and sqrt in double, keep) by one
 *   thread per tensor, which also advances steps[i]; then a block per table block.
 *   multi_apollo_update: the reductions, per-tensor scalars, the update (and for the stable
 *   decay ΣD, its coefficient and a last pass): five kernels, no host round trip.
 * Adam's arithmetic is element by element (equal to the CPU under the harness, whose math is
 * libm's; on a GPU CUDA's double pow may differ from glibc's by an ulp of the step size); Apollo's
 * block sums follow a tree of the GPU's own (below), within the ACCUM tier. */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/reduce_order.h"
#include "core/tensor_table.h"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kBlock = LUNA_REDUCE_BLOCK, kThreads = 256;
static_assert(LUNA_TENSOR_TABLE_BLOCK == LUNA_REDUCE_BLOCK, "a table's blocks are the reduction's");

__device__ inline double clip_coefficient(double clip_norm, double norm) {
    const double c = clip_norm / __dadd_rn(norm, 1e-6);
    return c < 1.0 ? c : 1.0;
}

__global__ void clip_kernel(float *coef, double *summary, const float *sumsq, int n,
                            double clip_norm, int mode, const double *also_finite, int num_also) {
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
    for (int j = 0; j < num_also; j++)
        if (!isfinite(also_finite[j])) finite = false;
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

/* The tensor table's device arrays, and the update's gate (NULL for other ops). */
struct Table {
    const int64_t *offsets, *numels, *block_start;
    const int32_t *block_tensor;
    int64_t num_blocks;
    const double *gate;
};

/* The update's gate (core/backend.h): a device double, 0 when clip_coefficients found the update
 * non-finite. Every kernel of an update reads it, so the host queues the update without knowing. */
__device__ inline bool gated_off(const double *gate) { return gate && *gate == 0.0; }

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

__global__ void adam_scalars_kernel(double *sc, int64_t *steps, const double *gate, int nt,
                                    double lr, double beta1, double beta2, double weight_decay) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt || gated_off(gate)) return;
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
    if (gated_off(t.gate)) return;
    int i;
    int64_t base, start, len;
    block_of(t, blockIdx.x, &i, &base, &start, &len);
    const double step_size = sc[(size_t)i * NSCALARS + STEP_SIZE],
                 keep = sc[(size_t)i * NSCALARS + KEEP];
    for (int64_t j = start + threadIdx.x; j < start + len; j += blockDim.x)
        adam_element(theta + base + j, exp_avg + base + j, exp_avg_sq + base + j, g[base + j],
                     beta1, beta2, eps, step_size, keep);
}

/* ---- Apollo (spec apollo.md; optimizer_kernels.c): the CPU's arithmetic in double, with sums
 * in an order of the GPU's own. A block of kThreads threads per table block (thread l takes
 * elements j ≡ l mod kThreads in increasing j), its lanes joined by a fixed tree in shared
 * memory: deterministic run to run, within the ACCUM tier of the CPU's 8-lane order
 * (core/reduce_order.h). Eight threads a block, the CPU's lanes, left the GPU's memory system
 * idle (the optimizer: 6 ms of a 32k update against 0.7 ms PREDICTED from its bytes,
 * docs/benchmarks.md). */

enum { REBOUND_CONSTANT = 0, REBOUND_BELIEF = 1 };
enum { WD_L2 = 0, WD_DECOUPLED = 1, WD_STABLE = 2 };
enum { AP_ALPHA, AP_DEN, AP_DELTA, AP_R, AP_EOA, AP_COEF, AP_PER_TENSOR = 8 };
static_assert(AP_PER_TENSOR == LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR, "the table's scalars");
static_assert(LUNA_TENSOR_TABLE_WORKSPACE_PER_BLOCK == 5, "4 partials and ΣD per block");

__device__ inline double nan_max(double a, double r) {
    const double qnan = __longlong_as_double(0x7ff8000000000000LL);
    return (a != a || r != r) ? qnan : (a > r ? a : r);
}

/* v[0..kThreads) (shared) → v[0]: pairs (l, l + h) for h = kThreads/2, ..., 1. op: 0 sum, 1 NaN-
 * propagating max. Every thread of the block calls it. */
__device__ inline void block_tree(double *v, int op) {
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) {
            const double a = v[threadIdx.x], b = v[threadIdx.x + h];
            v[threadIdx.x] = op == 0 ? __dadd_rn(a, b) : nan_max(b, a);
        }
        __syncthreads();
    }
}

__device__ inline double apollo_denominator(double b, double r, double sigma, double eps_over_alpha,
                                            int rebound) {
    const double a = fabs(b);
    if (rebound == REBOUND_BELIEF) return __dadd_rn(a > r ? a : r, eps_over_alpha);
    return a > sigma ? a : sigma;
}

/* Pass 1: per block, Σd⁴, ΣΔg·d, ΣB·d² (lanes in order) and max|Δg| on the OLD state. */
__global__ void apollo_reduce_kernel(const float *theta, const float *g, const float *m,
                                     const float *B, const float *d, Table t, double l2,
                                     double *partials) {
    LUNA_SHARED_2D(double, lanes, 4, kThreads);
    if (gated_off(t.gate)) return; /* the whole block */
    int ti;
    int64_t base, start, len;
    block_of(t, blockIdx.x, &ti, &base, &start, &len);
    double s4 = 0.0, sgd = 0.0, sbd = 0.0, rmax = 0.0;
    for (int64_t j = threadIdx.x; j < len; j += kThreads) {
        const int64_t i = base + start + j;
        const double gp = __dadd_rn((double)g[i], __dmul_rn(l2, (double)theta[i]));
        const double dg = gp - (double)m[i];
        const double dd = (double)d[i];
        const double d2 = __dmul_rn(dd, dd);
        s4 = __dadd_rn(s4, __dmul_rn(d2, d2));
        sgd = __dadd_rn(sgd, __dmul_rn(dg, dd));
        sbd = __dadd_rn(sbd, __dmul_rn((double)B[i], d2));
        rmax = nan_max(fabs(dg), rmax);
    }
    lanes[0][threadIdx.x] = s4, lanes[1][threadIdx.x] = sgd, lanes[2][threadIdx.x] = sbd;
    lanes[3][threadIdx.x] = rmax;
    for (int q = 0; q < 4; q++)
        block_tree(lanes[q], q == 3 ? 1 : 0);
    if (threadIdx.x < 4) partials[4 * (int64_t)blockIdx.x + threadIdx.x] = lanes[threadIdx.x][0];
}

/* Per-tensor scalars from the partials in block order; advances steps. */
__global__ void apollo_scalars_kernel(double *sc, const double *partials, int64_t *steps,
                                      const double *gate, const int64_t *block_start, int nt,
                                      double beta, double eps, double sigma, int rebound) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt || gated_off(gate)) return;
    const int64_t t = steps[i] + 1;
    double s4 = 0.0, sgd = 0.0, sbd = 0.0, r = 0.0;
    for (int64_t k = block_start[i]; k < block_start[i + 1]; k++) {
        s4 = __dadd_rn(s4, partials[4 * k]);
        sgd = __dadd_rn(sgd, partials[4 * k + 1]);
        sbd = __dadd_rn(sbd, partials[4 * k + 2]);
        r = nan_max(partials[4 * k + 3], r);
    }
    double *x = sc + (size_t)i * AP_PER_TENSOR;
    const double alpha = (1.0 - beta) / (1.0 - pow(beta, (double)t));
    const double eps_prime = rebound == REBOUND_CONSTANT ? eps / sigma : eps;
    const double den = __dadd_rn(pow(s4, 0.25), eps_prime);
    const double den2 = __dmul_rn(den, den);
    x[AP_ALPHA] = alpha;
    x[AP_DEN] = den;
    x[AP_DELTA] = __dmul_rn(-alpha, sgd) / den2 - sbd / den2;
    x[AP_R] = r;
    x[AP_EOA] = eps / alpha;
    steps[i] = t;
}

/* Pass 2: m, B, then d and θ (unless stable: ΣD per block, lanes in order, into dsum). */
__global__ void apollo_update_kernel(float *theta, const float *g, float *m, float *Bh, float *d,
                                     Table t, const double *sc, double l2, double sigma,
                                     int rebound, double decoupled, double lr, int stable,
                                     double *dsum) {
    LUNA_SHARED(double, lane_d, kThreads);
    if (gated_off(t.gate)) return; /* the whole block */
    int ti;
    int64_t base, start, len;
    block_of(t, blockIdx.x, &ti, &base, &start, &len);
    const double *x = sc + (size_t)ti * AP_PER_TENSOR;
    const double alpha = x[AP_ALPHA], den = x[AP_DEN], delta = x[AP_DELTA], r = x[AP_R],
                 eoa = x[AP_EOA];
    double dsum_lane = 0.0;
    for (int64_t j = threadIdx.x; j < len; j += kThreads) {
        const int64_t i = base + start + j;
        const double gp = __dadd_rn((double)g[i], __dmul_rn(l2, (double)theta[i]));
        const double dg = gp - (double)m[i];
        const float m_new = (float)__dadd_rn((double)m[i], __dmul_rn(alpha, dg));
        const double v = (double)d[i] / den;
        const float b_new = (float)__dadd_rn((double)Bh[i], __dmul_rn(__dmul_rn(delta, v), v));
        m[i] = m_new;
        Bh[i] = b_new;
        const double D = apollo_denominator((double)b_new, r, sigma, eoa, rebound);
        if (stable) {
            dsum_lane = __dadd_rn(dsum_lane, D);
            continue;
        }
        const float d_new =
            (float)__dadd_rn((double)m_new / D, __dmul_rn(decoupled, (double)theta[i]));
        d[i] = d_new;
        theta[i] = (float)((double)theta[i] - __dmul_rn(lr, (double)d_new));
    }
    if (!stable) return; /* uniform across the block: no thread waits at a barrier alone */
    lane_d[threadIdx.x] = dsum_lane;
    block_tree(lane_d, 0);
    if (threadIdx.x == 0) dsum[blockIdx.x] = lane_d[0];
}

/* Stable weight decay: coef_i = wd / (ΣD_i / n_i), blocks in order. */
__global__ void apollo_stable_coef_kernel(double *sc, const double *dsum, Table tb, int nt,
                                          double weight_decay) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt || gated_off(tb.gate)) return;
    double total = 0.0;
    for (int64_t k = tb.block_start[i]; k < tb.block_start[i + 1]; k++)
        total = __dadd_rn(total, dsum[k]);
    sc[(size_t)i * AP_PER_TENSOR + AP_COEF] = weight_decay / (total / (double)tb.numels[i]);
}

__global__ void apollo_stable_kernel(float *theta, const float *m, const float *Bh, float *d,
                                     Table t, const double *sc, double sigma, int rebound,
                                     double lr) {
    if (gated_off(t.gate)) return;
    int ti;
    int64_t base, start, len;
    block_of(t, blockIdx.x, &ti, &base, &start, &len);
    const double *x = sc + (size_t)ti * AP_PER_TENSOR;
    const double r = x[AP_R], eoa = x[AP_EOA], coef = x[AP_COEF];
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        const int64_t i = base + start + j;
        const double D = apollo_denominator((double)Bh[i], r, sigma, eoa, rebound);
        const float d_new = (float)__dadd_rn((double)m[i] / D, __dmul_rn(coef, (double)theta[i]));
        d[i] = d_new;
        theta[i] = (float)((double)theta[i] - __dmul_rn(lr, (double)d_new));
    }
}

} // namespace

extern "C" {

cudaError_t luna_cuda_clip_coefficients(cudaStream_t s, float *coef, double *summary,
                                        const float *sumsq, int n, double clip_norm, int mode,
                                        const double *also_finite, int num_also) {
    LUNA_LAUNCH(clip_kernel, 1, 1, 0, s, coef, summary, sumsq, n, clip_norm, mode, also_finite,
                num_also);
    return cudaGetLastError();
}

cudaError_t luna_cuda_multi_scale(cudaStream_t s, float *x, int64_t num_blocks,
                                  const int64_t *offsets, const int64_t *numels,
                                  const int64_t *block_start, const int32_t *block_tensor,
                                  const float *coef, float alpha) {
    if (num_blocks <= 0 || (!coef && alpha == 1.0f)) return cudaSuccess;
    const Table t = {offsets, numels, block_start, block_tensor, num_blocks, nullptr};
    LUNA_LAUNCH(multi_scale_kernel, (unsigned)num_blocks, kThreads, 0, s, x, t, coef, alpha);
    return cudaGetLastError();
}

/* The launches of one Adam or Apollo update over the table `t`. */
static cudaError_t adam(cudaStream_t s, float *theta, const float *g, float *exp_avg,
                        float *exp_avg_sq, int num_tensors, const Table &t, double *workspace,
                        int64_t *steps, double lr, double beta1, double beta2, double eps,
                        double weight_decay) {
    LUNA_LAUNCH(adam_scalars_kernel, (unsigned)((num_tensors + 127) / 128), 128, 0, s, workspace,
                steps, t.gate, num_tensors, lr, beta1, beta2, weight_decay);
    if (t.num_blocks > 0)
        LUNA_LAUNCH(multi_adam_kernel, (unsigned)t.num_blocks, kThreads, 0, s, theta, g, exp_avg,
                    exp_avg_sq, t, static_cast<const double *>(workspace), beta1, beta2, eps);
    return cudaGetLastError();
}

static cudaError_t apollo(cudaStream_t s, float *theta, const float *g, float *exp_avg,
                          float *approx_hessian, float *update, int num_tensors, const Table &t,
                          double *workspace, int64_t *steps, double lr, double beta, double eps,
                          double sigma, int rebound, double weight_decay, int wd_type) {
    const int64_t num_blocks = t.num_blocks;
    /* the table's workspace: [4·blocks] partials, [blocks] ΣD, then the per-tensor scalars */
    double *partials = workspace, *dsum = workspace + 4 * num_blocks,
           *sc = workspace + LUNA_TENSOR_TABLE_WORKSPACE_PER_BLOCK * num_blocks;
    const double l2 = wd_type == WD_L2 ? weight_decay : 0.0;
    const double decoupled = wd_type == WD_DECOUPLED ? weight_decay : 0.0;
    const int stable = wd_type == WD_STABLE;
    const unsigned tblocks = (unsigned)((num_tensors + 127) / 128);
    if (num_blocks > 0)
        LUNA_LAUNCH(apollo_reduce_kernel, (unsigned)num_blocks, kThreads, 0, s, theta, g, exp_avg,
                    approx_hessian, update, t, l2, partials);
    LUNA_LAUNCH(apollo_scalars_kernel, tblocks, 128, 0, s, sc, partials, steps, t.gate,
                t.block_start, num_tensors, beta, eps, sigma, rebound);
    if (num_blocks > 0)
        LUNA_LAUNCH(apollo_update_kernel, (unsigned)num_blocks, kThreads, 0, s, theta, g, exp_avg,
                    approx_hessian, update, t, static_cast<const double *>(sc), l2, sigma, rebound,
                    decoupled, lr, stable, dsum);
    if (stable && num_blocks > 0) {
        LUNA_LAUNCH(apollo_stable_coef_kernel, tblocks, 128, 0, s, sc, dsum, t, num_tensors,
                    weight_decay);
        LUNA_LAUNCH(apollo_stable_kernel, (unsigned)num_blocks, kThreads, 0, s, theta, exp_avg,
                    approx_hessian, update, t, static_cast<const double *>(sc), sigma, rebound, lr);
    }
    return cudaGetLastError();
}

cudaError_t luna_cuda_multi_adam_update(cudaStream_t s, float *theta, const float *g,
                                        float *exp_avg, float *exp_avg_sq, int num_tensors,
                                        int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *workspace,
                                        int64_t *steps, const double *gate, double lr, double beta1,
                                        double beta2, double eps, double weight_decay) {
    if (num_tensors <= 0) return cudaSuccess;
    const Table t = {offsets, numels, block_start, block_tensor, num_blocks, gate};
    return adam(s, theta, g, exp_avg, exp_avg_sq, num_tensors, t, workspace, steps, lr, beta1,
                beta2, eps, weight_decay);
}

cudaError_t luna_cuda_multi_apollo_update(cudaStream_t s, float *theta, const float *g,
                                          float *exp_avg, float *approx_hessian, float *update,
                                          int num_tensors, int64_t num_blocks,
                                          const int64_t *offsets, const int64_t *numels,
                                          const int64_t *block_start, const int32_t *block_tensor,
                                          double *workspace, int64_t *steps, const double *gate,
                                          double lr, double beta, double eps, double sigma,
                                          int rebound, double weight_decay, int wd_type) {
    if (num_tensors <= 0) return cudaSuccess;
    const Table t = {offsets, numels, block_start, block_tensor, num_blocks, gate};
    return apollo(s, theta, g, exp_avg, approx_hessian, update, num_tensors, t, workspace, steps,
                  lr, beta, eps, sigma, rebound, weight_decay, wd_type);
}

} // extern "C"
