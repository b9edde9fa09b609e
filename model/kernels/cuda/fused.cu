/* The fused training ops of the CUDA backend (core/backend.h, "Fused training ops"; the CPU
 * reference is model/kernels/cpu/fused.c): one kernel pass over the rows instead of three or four
 * separate kernels, so each activation is read and written once.
 *
 * The arithmetic follows the CPU operation by operation (__fadd_rn / __fmul_rn where the CPU
 * rounds twice, sums in double by fixed trees, as softmax.cu's), and the dropout factors are
 * those of elementwise.cu's dropout_kernel: keep(i) from core/philox.h for the element's index i
 * in its buffer, scale = 1/(1 − p) computed on the host. So in fp32 each fused op equals the
 * CPU's within the contract's tiers: the elementwise parts exactly, the LayerNorm and softmax
 * rows within the NORM tier (their sums' order differs from the CPU's simd lanes), dγ, dβ and
 * dbias within the ACCUM tier (column sums as fp32 trees of the GPU's own, column_sum.cuh).
 * With bf16 activations a fused op rounds only what it stores; values kept for backward (r, h, y)
 * are re-read as stored, so the backward sees what the forward kept.
 *
 * Column sums (dγ, dβ, dbias) need every row and run as their own kernels: dγ, dβ before
 * the row pass (dres may alias dy), dbias after it (it reads dsub / dh). */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/philox.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

#include "model/kernels/cuda/dropout_factors.cuh"

constexpr int kThreads = 128, kWarps = kThreads / 32; /* row kernels: a warp or a block per row */
constexpr int kEltThreads = 256;                      /* elementwise kernels */

/* Σ over the block of one double per thread in a fixed order (softmax.cu's). */
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
    for (int m = 16; m > 0; m /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    float total = -INFINITY;
    for (int w = 0; w < kWarps; w++)
        total = fmaxf(total, partial[w]);
    __syncthreads();
    return total;
}

/* Row kernels run with G threads per row: G = 32, a warp per row (kThreads / 32 rows a block;
 * rows of ≤ kWarpRowMax elements) — rows of the model's widths (d = 512, attention rows of
 * l = 32 or n keys) would leave most of a block idle and spend it in __syncthreads (the
 * measured effect: docs/benchmarks.md); G = kThreads, the block, for longer rows. Sums are in a
 * fixed order either way: lane totals by a fixed xor tree, then (warp: lane 0's value broadcast;
 * block: the warps in order). */
constexpr int kWarpRowMax = 1024;

template <int G> __device__ inline int64_t group_row() {
    return G == 32 ? (int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32 : (int64_t)blockIdx.x;
}
template <int G> __device__ inline int group_tid() {
    return G == 32 ? (int)(threadIdx.x % 32) : (int)threadIdx.x;
}
template <int G> __device__ inline double group_sum(double v, double *partial) {
    if (G == 32) {
        for (int m = 16; m > 0; m /= 2)
            v += __shfl_xor_sync(0xffffffffu, v, m);
        v = __shfl_sync(0xffffffffu, v, 0);
    } else {
        v = block_sum(v, partial);
    }
    return v;
}
template <int G> __device__ inline float group_max(float v, float *partial) {
    if (G == 32) {
        for (int m = 16; m > 0; m /= 2) /* order-free: every lane gets the same value */
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    } else {
        v = block_max(v, partial);
    }
    return v;
}
inline unsigned row_blocks(int64_t rows, bool warp) {
    return (unsigned)(warp ? (rows + kThreads / 32 - 1) / (kThreads / 32) : rows);
}

/* ---- residual_norm ----------------------------------------------------------------------------
 */

/* The row loops of the residual_norm and softmax_dropout kernels give each thread runs of RUN
 * consecutive elements (c4 = RUN·tid, RUN·tid + RUN·G, ...; c = c4 + e, e < RUN), the same runs
 * in every loop of a kernel, so a thread re-reads only the elements it wrote itself. RUN = 4 for
 * rows of at least 4·G elements: one Philox block draws a run's four dropout factors (drop4)
 * where a factor per element costs a block each. RUN = 1 (an element a thread, a block per
 * factor) for shorter rows: with runs of 4, Luna's 32-wide attention rows would leave 24 of a
 * warp's lanes idle (both measured on a GPU: docs/benchmarks.md). */
#define ROW_RUNS(c4, n) for (int c4 = RUN * tid; c4 < (n); c4 += RUN * G)
#define RUN_ELEMENTS(c, c4, n)                                                                     \
    LUNA_UNROLL for (int e_ = 0, c = c4; e_ < RUN; e_++, c++) if (c < (n))

template <int RUN>
__device__ inline void drop_run(luna_rng_key key, int64_t i, float p, float scale, float f[4]) {
    if (RUN == 4)
        drop4(key, i, p, scale, f);
    else
        f[0] = drop_factor(key, i, p, scale);
}

/* Launch kernel<T, G, RUN> for rows of `cols`: a block per row past kWarpRowMax, else a warp per
 * row; RUN = 4 when a thread gets at least 4 elements. */
#define ROW_LAUNCH(kernel, T, cols, rows, s, ...)                                                  \
    do {                                                                                           \
        if ((cols) > kWarpRowMax)                                                                  \
            LUNA_LAUNCH((kernel<T, kThreads, 4>), row_blocks(rows, false), kThreads, 0, s,         \
                        __VA_ARGS__);                                                              \
        else if ((cols) >= 4 * 32)                                                                 \
            LUNA_LAUNCH((kernel<T, 32, 4>), row_blocks(rows, true), kThreads, 0, s, __VA_ARGS__);  \
        else                                                                                       \
            LUNA_LAUNCH((kernel<T, 32, 1>), row_blocks(rows, true), kThreads, 0, s, __VA_ARGS__);  \
    } while (0)

/* r = res + dropout(sub + bias), stored; then LayerNorm of the stored row (ln_fwd_kernel). Each
 * thread re-reads only the r elements it wrote itself. */
template <typename T, int G, int RUN>
__global__ void resnorm_fwd_kernel(T *y, T *r, float *mean, float *rstd, const T *sub,
                                   const float *bias, const T *res, const float *gamma,
                                   const float *beta, int64_t rows, int d, float eps, float p,
                                   float scale, luna_rng_key key) {
    LUNA_SHARED(double, partial, kWarps);
    const int64_t row = group_row<G>(), off = row * d;
    const int tid = group_tid<G>();
    if (G == 32 && row >= rows) return; /* the whole warp */
    T *rr = r + off, *yr = y + off;
    const T *sr = sub + off, *rs_ = res + off;
    double s = 0.0;
    ROW_RUNS(c4, d) {
        float f[4];
        drop_run<RUN>(key, off + c4, p, scale, f);
        RUN_ELEMENTS(c, c4, d) {
            float t = load(sr, c);
            if (bias) t = __fadd_rn(t, bias[c]);
            if (p > 0.0f) t = __fmul_rn(t, f[c - c4]);
            store(rr, c, __fadd_rn(t, load(rs_, c)));
            s += (double)load(rr, c);
        }
    }
    const double m = group_sum<G>(s, partial) / d;
    double v = 0.0;
    ROW_RUNS(c4, d) RUN_ELEMENTS(c, c4, d) {
        const double t = (double)load(rr, c) - m;
        v = __dadd_rn(v, __dmul_rn(t, t));
    }
    v = group_sum<G>(v, partial) / d;
    const float mf = (float)m, rf = (float)(1.0 / sqrt(v + (double)eps));
    if (tid == 0) mean[row] = mf, rstd[row] = rf;
    ROW_RUNS(c4, d) RUN_ELEMENTS(c, c4, d) {
        const float xh = __fmul_rn(__fsub_rn(load(rr, c), mf), rf);
        store(yr, c, __fadd_rn(__fmul_rn(xh, gamma[c]), beta[c]));
    }
}

/* dγ, dβ and dbias: ln_params_sum and column_sum (column_sum.cuh). */
#include "model/kernels/cuda/column_sum.cuh"

/* dres row (ln_bwd_dx_kernel), then dsub = dropout_backward(dres as stored). */
template <typename T, int G, int RUN>
__global__ void resnorm_bwd_kernel(T *dres, T *dsub, const T *dy, const T *x, const float *mean,
                                   const float *rstd, const float *gamma, int64_t rows, int d,
                                   float p, float scale, luna_rng_key key) {
    LUNA_SHARED(double, partial, kWarps);
    const int64_t row = group_row<G>(), off = row * d;
    const int tid = group_tid<G>();
    if (G == 32 && row >= rows) return; /* the whole warp */
    const T *dyr = dy + off, *xr = x + off;
    T *dxr = dres + off, *dsr = dsub + off;
    const float m = mean[row], rs = rstd[row];
    double s1 = 0.0, s2 = 0.0;
    ROW_RUNS(c4, d) RUN_ELEMENTS(c, c4, d) {
        const float gc = __fmul_rn(load(dyr, c), gamma[c]);
        const float xhat = __fmul_rn(__fsub_rn(load(xr, c), m), rs);
        s1 += (double)gc;
        s2 += (double)__fmul_rn(gc, xhat);
    }
    const float m1 = (float)(group_sum<G>(s1, partial) / d),
                m2 = (float)(group_sum<G>(s2, partial) / d);
    ROW_RUNS(c4, d) {
        float f[4];
        drop_run<RUN>(key, off + c4, p, scale, f);
        RUN_ELEMENTS(c, c4, d) {
            const float gc = __fmul_rn(load(dyr, c), gamma[c]);
            const float xhat = __fmul_rn(__fsub_rn(load(xr, c), m), rs);
            store(dxr, c, __fmul_rn(rs, __fsub_rn(__fsub_rn(gc, m1), __fmul_rn(xhat, m2))));
            const float g = load(dxr, c);
            store(dsr, c, p > 0.0f ? __fmul_rn(g, f[c - c4]) : g);
        }
    }
}

/* ---- bias_relu_dropout ------------------------------------------------------------------------
 */

/* Four consecutive elements per thread: one Philox block for their four dropout factors. */
template <typename T>
__global__ void brd_fwd_kernel(T *a, T *h, const float *bias, int64_t rows, int cols, float p,
                               float scale, luna_rng_key key) {
    const int64_t n = rows * cols;
    GRID_STRIDE(k, (n + 3) / 4) {
        float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (p > 0.0f) drop_factors4(key, (uint64_t)k, p, scale, f);
        LUNA_UNROLL for (int j = 0; j < 4; j++) {
            const int64_t i = 4 * k + j;
            if (i >= n) break;
            if (bias) store(h, i, __fadd_rn(load(h, i), bias[i % cols]));
            const float v = load(h, i); /* as kept */
            const float act = v < 0.0f ? 0.0f : __fadd_rn(v, 0.0f);
            store(a, i, p > 0.0f ? __fmul_rn(act, f[j]) : act);
        }
    }
}

template <typename T>
__global__ void brd_bwd_kernel(T *dh, const T *da, const T *h, int64_t n, float p, float scale,
                               luna_rng_key key) {
    GRID_STRIDE(k, (n + 3) / 4) {
        float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (p > 0.0f) drop_factors4(key, (uint64_t)k, p, scale, f);
        LUNA_UNROLL for (int j = 0; j < 4; j++) {
            const int64_t i = 4 * k + j;
            if (i >= n) break;
            float g = load(da, i);
            if (p > 0.0f) g = __fmul_rn(g, f[j]);
            store(dh, i, load(h, i) > 0.0f ? g : 0.0f);
        }
    }
}

/* ---- softmax_dropout ---------------------------------------------------------------------------
 */

/* softmax_fwd_kernel, and yd = dropout(y as stored) in the same loop (yd NULL: none). */
template <typename T, int G, int RUN>
__global__ void smd_fwd_kernel(T *y, T *yd, const T *x, int64_t rows, int cols,
                               const int32_t *valid_cols, int64_t rows_per_group, int causal_period,
                               float p, float scale, luna_rng_key key) {
    LUNA_SHARED(double, dpart, kWarps);
    LUNA_SHARED(float, fpart, kWarps);
    const int64_t r = group_row<G>(), off = r * cols;
    const int tid = group_tid<G>();
    if (G == 32 && r >= rows) return; /* the whole warp */
    const T *xr = x + off;
    T *yr = y + off;
    int64_t v = valid_cols ? valid_cols[r / rows_per_group] : cols;
    if (causal_period > 0 && r % causal_period + 1 < v) v = r % causal_period + 1;
    int valid = v < 0 ? 0 : (v > cols ? cols : (int)v);
    float mx = -INFINITY;
    ROW_RUNS(c4, valid) RUN_ELEMENTS(c, c4, valid) mx = fmaxf(mx, load(xr, c));
    mx = group_max<G>(mx, fpart);
    if (mx == -INFINITY) valid = 0;
    double sum = 0.0;
    ROW_RUNS(c4, valid) RUN_ELEMENTS(c, c4, valid) sum += (double)expf(__fsub_rn(load(xr, c), mx));
    sum = group_sum<G>(sum, dpart);
    const float inv = (float)(1.0 / sum);
    ROW_RUNS(c4, cols) {
        float f[4];
        drop_run<RUN>(key, off + c4, yd ? p : 0.0f, scale, f);
        RUN_ELEMENTS(c, c4, cols) {
            store(yr, c, c < valid ? __fmul_rn(expf(__fsub_rn(load(xr, c), mx)), inv) : 0.0f);
            if (yd) store(yd + off, c, __fmul_rn(load(yr, c), f[c - c4]));
        }
    }
}

/* g = dropout_backward(dyd), dx = y·(g − Σ y·g) (softmax_bwd_kernel on g); dx may alias dyd. */
template <typename T, int G, int RUN>
__global__ void smd_bwd_kernel(T *dx, const T *dyd, const T *y, int64_t rows, int cols, float p,
                               float scale, luna_rng_key key) {
    LUNA_SHARED(double, dpart, kWarps);
    const int64_t r = group_row<G>(), off = r * cols;
    const int tid = group_tid<G>();
    if (G == 32 && r >= rows) return; /* the whole warp */
    const T *dyr = dyd + off, *yr = y + off;
    T *dxr = dx + off;
    double dot = 0.0;
    ROW_RUNS(c4, cols) {
        float f[4];
        drop_run<RUN>(key, off + c4, p, scale, f);
        RUN_ELEMENTS(c, c4, cols) {
            const float g = __fmul_rn(load(dyr, c), f[c - c4]);
            dot += (double)__fmul_rn(load(yr, c), g);
        }
    }
    const float s = (float)group_sum<G>(dot, dpart);
    ROW_RUNS(c4, cols) {
        float f[4];
        drop_run<RUN>(key, off + c4, p, scale, f);
        RUN_ELEMENTS(c, c4, cols) {
            const float g = __fmul_rn(load(dyr, c), f[c - c4]);
            store(dxr, c, __fmul_rn(load(yr, c), __fsub_rn(g, s)));
        }
    }
}

#include "model/kernels/cuda/softmax_dropout_short.cuh"
#include "model/kernels/cuda/residual_norm_rows.cuh"
#include "model/kernels/cuda/bias_relu_dropout_vec.cuh"

typedef __nv_bfloat16 bf16_t;

template <typename T>
cudaError_t resnorm_fwd(cudaStream_t s, void *y, void *r, float *mean, float *rstd, const void *sub,
                        const float *bias, const void *res, const float *gamma, const float *beta,
                        int64_t rows, int d, float eps, float p, luna_rng_key key) {
    if (vec_row_fits(d))
        VEC_ROW_LAUNCH(resnorm_fwd_vec_kernel, T, d, rows, s, static_cast<T *>(y),
                       static_cast<T *>(r), mean, rstd, static_cast<const T *>(sub), bias,
                       static_cast<const T *>(res), gamma, beta, rows, d, eps, p, drop_scale(p),
                       key);
    else
        ROW_LAUNCH(resnorm_fwd_kernel, T, d, rows, s, static_cast<T *>(y), static_cast<T *>(r),
                   mean, rstd, static_cast<const T *>(sub), bias, static_cast<const T *>(res),
                   gamma, beta, rows, d, eps, p, drop_scale(p), key);
    return cudaGetLastError();
}

template <typename T>
cudaError_t resnorm_bwd(cudaStream_t s, void *dres, void *dsub, float *dbias, float *dgamma,
                        float *dbeta, const void *dy, const void *r, const float *mean,
                        const float *rstd, const float *gamma, int64_t rows, int d, float p,
                        luna_rng_key key, luna_cuda_colsum_ws ws) {
    const T *dyt = static_cast<const T *>(dy), *rt = static_cast<const T *>(r);
    if (vec_row_fits(d) && (dgamma || dbeta || dbias) && colsum_one_round(rows, d, 3, ws)) {
        /* the rows and their column sums in one pass, then the chunks' total (the workspace's
         * doubles as floats, column_sum.cuh's layout: running totals, then the chunk sums) */
        float *run = reinterpret_cast<float *>(ws.p), *sums = run + (int64_t)3 * d;
        VEC_SUMS_LAUNCH(T, d, rows, s, static_cast<T *>(dres), static_cast<T *>(dsub), sums, dyt,
                        rt, mean, rstd, gamma, rows, d, p, drop_scale(p), key);
        LUNA_LAUNCH(chunk_total_kernel<3>, dim3((unsigned)((d + kColsumCols - 1) / kColsumCols), 3),
                    kColsumCols * kTotalWarps, 0, s, dgamma, dbeta, dbias, run,
                    static_cast<const float *>(sums), d, colsum_chunks(rows), 1, 1);
        return cudaGetLastError();
    }
    if (dgamma || dbeta) { /* before the rows: dres may alias dy */
        const cudaError_t e = ln_params_sum<T>(s, dgamma, dbeta, dyt, rt, mean, rstd, rows, d, ws);
        if (e != cudaSuccess) return e;
    }
    if (vec_row_fits(d))
        VEC_ROW_LAUNCH(resnorm_bwd_vec_kernel, T, d, rows, s, static_cast<T *>(dres),
                       static_cast<T *>(dsub), dyt, rt, mean, rstd, gamma, rows, d, p,
                       drop_scale(p), key);
    else
        ROW_LAUNCH(resnorm_bwd_kernel, T, d, rows, s, static_cast<T *>(dres),
                   static_cast<T *>(dsub), dyt, rt, mean, rstd, gamma, rows, d, p, drop_scale(p),
                   key);
    if (dbias) return column_sum<T>(s, dbias, static_cast<const T *>(dsub), rows, d, ws);
    return cudaGetLastError();
}

template <typename T>
cudaError_t brd_fwd(cudaStream_t s, void *a, void *h, const float *bias, int64_t rows, int cols,
                    float p, luna_rng_key key) {
    if (brd_vec_fits(cols))
        LUNA_LAUNCH(brd_fwd_vec_kernel<T>, grid_blocks(rows * cols / 8, kEltThreads), kEltThreads,
                    0, s, static_cast<T *>(a), static_cast<T *>(h), bias, rows, cols, p,
                    drop_scale(p), key);
    else
        LUNA_LAUNCH(brd_fwd_kernel<T>, grid_blocks((rows * cols + 3) / 4, kEltThreads), kEltThreads,
                    0, s, static_cast<T *>(a), static_cast<T *>(h), bias, rows, cols, p,
                    drop_scale(p), key);
    return cudaGetLastError();
}

template <typename T>
cudaError_t brd_bwd(cudaStream_t s, void *dh, float *dbias, const void *da, const void *h,
                    int64_t rows, int cols, float p, luna_rng_key key, luna_cuda_colsum_ws ws) {
    if (dbias && brd_vec_fits(cols) && colsum_one_round(rows, cols, 1, ws)) {
        /* the rows and their chunks' bias-gradient sums in one pass, then the chunks' total */
        const int64_t nchunks = colsum_chunks(rows);
        float *run = reinterpret_cast<float *>(ws.p), *sums = run + cols;
        const unsigned runs = (unsigned)(cols / 8);
        LUNA_LAUNCH(brd_bwd_sums_kernel<T>,
                    dim3((runs + kBrdSumThreads - 1) / kBrdSumThreads, (unsigned)nchunks),
                    kBrdSumThreads, 0, s, static_cast<T *>(dh), sums, static_cast<const T *>(da),
                    static_cast<const T *>(h), rows, cols, p, drop_scale(p), key);
        LUNA_LAUNCH(chunk_total_kernel<1>,
                    dim3((unsigned)((cols + kColsumCols - 1) / kColsumCols), 1),
                    kColsumCols * kTotalWarps, 0, s, dbias, nullptr, nullptr, run,
                    static_cast<const float *>(sums), cols, nchunks, 1, 1);
        return cudaGetLastError();
    }
    if (brd_vec_fits(cols))
        LUNA_LAUNCH(brd_bwd_vec_kernel<T>, grid_blocks(rows * cols / 8, kEltThreads), kEltThreads,
                    0, s, static_cast<T *>(dh), static_cast<const T *>(da),
                    static_cast<const T *>(h), rows * cols, p, drop_scale(p), key);
    else
        LUNA_LAUNCH(brd_bwd_kernel<T>, grid_blocks((rows * cols + 3) / 4, kEltThreads), kEltThreads,
                    0, s, static_cast<T *>(dh), static_cast<const T *>(da),
                    static_cast<const T *>(h), rows * cols, p, drop_scale(p), key);
    if (dbias) return column_sum<T>(s, dbias, static_cast<const T *>(dh), rows, cols, ws);
    return cudaGetLastError();
}

template <typename T>
cudaError_t smd_fwd(cudaStream_t s, void *y, void *yd, const void *x, int64_t rows, int cols,
                    const int32_t *valid_cols, int64_t rows_per_group, int causal_period, float p,
                    luna_rng_key key) {
    if (cols <= kShortRowMax)
        SHORT_ROW_LAUNCH(smd_fwd_short_kernel, T, cols, rows, s, static_cast<T *>(y),
                         static_cast<T *>(yd), static_cast<const T *>(x), rows, cols, valid_cols,
                         rows_per_group, causal_period, p, drop_scale(p), key);
    else
        ROW_LAUNCH(smd_fwd_kernel, T, cols, rows, s, static_cast<T *>(y), static_cast<T *>(yd),
                   static_cast<const T *>(x), rows, cols, valid_cols, rows_per_group, causal_period,
                   p, drop_scale(p), key);
    return cudaGetLastError();
}

template <typename T>
cudaError_t smd_bwd(cudaStream_t s, void *dx, const void *dyd, const void *y, int64_t rows,
                    int cols, float p, luna_rng_key key) {
    if (cols <= kShortRowMax)
        SHORT_ROW_LAUNCH(smd_bwd_short_kernel, T, cols, rows, s, static_cast<T *>(dx),
                         static_cast<const T *>(dyd), static_cast<const T *>(y), rows, cols, p,
                         drop_scale(p), key);
    else
        ROW_LAUNCH(smd_bwd_kernel, T, cols, rows, s, static_cast<T *>(dx),
                   static_cast<const T *>(dyd), static_cast<const T *>(y), rows, cols, p,
                   drop_scale(p), key);
    return cudaGetLastError();
}

} // namespace

extern "C" {

cudaError_t luna_cuda_residual_norm_forward(cudaStream_t s, int bf16, void *y, void *r, float *mean,
                                            float *rstd, const void *sub, const float *bias,
                                            const void *res, const float *gamma, const float *beta,
                                            int64_t rows, int d, float eps, float p,
                                            luna_rng_key key) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    return bf16 ? resnorm_fwd<bf16_t>(s, y, r, mean, rstd, sub, bias, res, gamma, beta, rows, d,
                                      eps, p, key)
                : resnorm_fwd<float>(s, y, r, mean, rstd, sub, bias, res, gamma, beta, rows, d, eps,
                                     p, key);
}

cudaError_t luna_cuda_residual_norm_backward(cudaStream_t s, int bf16, void *dres, void *dsub,
                                             float *dbias, float *dgamma, float *dbeta,
                                             const void *dy, const void *r, const float *mean,
                                             const float *rstd, const float *gamma, int64_t rows,
                                             int d, float p, luna_rng_key key,
                                             luna_cuda_colsum_ws ws) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    return bf16 ? resnorm_bwd<bf16_t>(s, dres, dsub, dbias, dgamma, dbeta, dy, r, mean, rstd, gamma,
                                      rows, d, p, key, ws)
                : resnorm_bwd<float>(s, dres, dsub, dbias, dgamma, dbeta, dy, r, mean, rstd, gamma,
                                     rows, d, p, key, ws);
}

cudaError_t luna_cuda_bias_relu_dropout_forward(cudaStream_t s, int bf16, void *a, void *h,
                                                const float *bias, int64_t rows, int cols, float p,
                                                luna_rng_key key) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    return bf16 ? brd_fwd<bf16_t>(s, a, h, bias, rows, cols, p, key)
                : brd_fwd<float>(s, a, h, bias, rows, cols, p, key);
}

cudaError_t luna_cuda_bias_relu_dropout_backward(cudaStream_t s, int bf16, void *dh, float *dbias,
                                                 const void *da, const void *h, int64_t rows,
                                                 int cols, float p, luna_rng_key key,
                                                 luna_cuda_colsum_ws ws) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    return bf16 ? brd_bwd<bf16_t>(s, dh, dbias, da, h, rows, cols, p, key, ws)
                : brd_bwd<float>(s, dh, dbias, da, h, rows, cols, p, key, ws);
}

cudaError_t luna_cuda_softmax_dropout_forward(cudaStream_t s, int bf16, void *y, void *yd,
                                              const void *x, int64_t rows, int cols,
                                              const int32_t *valid_cols, int64_t rows_per_group,
                                              int causal_period, float p, luna_rng_key key) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if (!(p > 0.0f)) yd = NULL;
    return bf16 ? smd_fwd<bf16_t>(s, y, yd, x, rows, cols, valid_cols, rows_per_group,
                                  causal_period, p, key)
                : smd_fwd<float>(s, y, yd, x, rows, cols, valid_cols, rows_per_group, causal_period,
                                 p, key);
}

cudaError_t luna_cuda_softmax_dropout_backward(cudaStream_t s, int bf16, void *dx, const void *dyd,
                                               const void *y, int64_t rows, int cols, float p,
                                               luna_rng_key key) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    return bf16 ? smd_bwd<bf16_t>(s, dx, dyd, y, rows, cols, p, key)
                : smd_bwd<float>(s, dx, dyd, y, rows, cols, p, key);
}

} // extern "C"
