/* Column sums over rows (included after cuda_compat.h and act_io.cuh, inside a .cu file's
 * anonymous namespace):
 *   column_sums<1>(ColumnValue)    db[c] += Σ_r dy[r, c]                        (bias gradients)
 *   column_sums<2>(LnParamsValue)  dγ[c] += Σ_r dy_rc·x̂_rc, dβ[c] += Σ_r dy_rc  (residual_norm's
 *                                  LayerNorm, x̂ from the row's stored mean and rstd)
 * In fp32, in an order of the GPU's own (fixed, so run-to-run deterministic; within the ACCUM
 * tier of the CPU's chunked double sums, model/kernels/column_sum_order.h). Two kernels, so that
 * the whole GPU works on one sum:
 *   chunk_sums_kernel   one thread per (chunk, column): the chunk's LUNA_COLSUM_CHUNK rows in
 *                       row order into the workspace [chunk][NOUT][cols];
 *   chunk_total_kernel  a block per (32 columns, output): each warp adds every kTotalWarps-th
 *                       chunk sum, then a tree over the warps' partial sums in shared memory;
 *                       out_c += total.
 * No chain is longer than a chunk (64 adds) or nchunks / kTotalWarps: a thread adding all of a
 * column's chunk sums in sequence waited on 512 dependent loads per 32k-row sum (3.4 ms of an
 * update, docs/gpu.md). The workspace (luna_cuda_colsum_ws, from the backend's scratch, counted
 * in doubles, used as floats) holds a round of chunk sums; more chunks than it holds are summed in
 * rounds, the running totals kept between rounds. */
#ifndef LUNA_KERNELS_CUDA_COLUMN_SUM_CUH
#define LUNA_KERNELS_CUDA_COLUMN_SUM_CUH

#include "model/kernels/column_sum_order.h"

constexpr int kColsumCols = 32; /* columns per block: a warp's lanes, consecutive columns */
constexpr int kColsumWarps = 8; /* chunks per block: one per warp */
constexpr int kTotalWarps = 16; /* chunk-sum chains per column in chunk_total_kernel */

template <int NOUT, typename Value>
__global__ void chunk_sums_kernel(float *ws, int64_t rows, int cols, int64_t k0, int64_t kn,
                                  Value value) {
    const int lane = threadIdx.x % kColsumCols, w = threadIdx.x / kColsumCols;
    const int c = blockIdx.x * kColsumCols + lane;
    const int64_t k = (int64_t)blockIdx.y * kColsumWarps + w; /* chunk within the round */
    if (c >= cols || k >= kn) return;
    const int64_t r0 = (k0 + k) * LUNA_COLSUM_CHUNK;
    const int64_t r1 = r0 + LUNA_COLSUM_CHUNK < rows ? r0 + LUNA_COLSUM_CHUNK : rows;
    float acc[NOUT];
    for (int j = 0; j < NOUT; j++)
        acc[j] = 0.0f;
    if (r1 - r0 == LUNA_COLSUM_CHUNK) {
        /* full chunk: a constant trip count, unrolled so that the loads run ahead of the adds */
        LUNA_UNROLL_BY(16)
        for (int i = 0; i < LUNA_COLSUM_CHUNK; i++) {
            float v[NOUT];
            value(r0 + i, c, v);
            for (int j = 0; j < NOUT; j++)
                acc[j] += v[j];
        }
    } else {
        for (int64_t r = r0; r < r1; r++) {
            float v[NOUT];
            value(r, c, v);
            for (int j = 0; j < NOUT; j++)
                acc[j] += v[j];
        }
    }
    for (int j = 0; j < NOUT; j++)
        ws[(k * NOUT + j) * cols + c] = acc[j];
}

/* For output j = blockIdx.y and 32 columns: total = Σ_{k < kn} ws[k][j][c] (warp w adds chunks
 * w, w + kTotalWarps, ... in order, then a tree over the warps); run[j·cols + c] = (first ? 0 :
 * run) + total, or on the last round out_j[c] += that instead (out_j NULL: not wanted). NOUT ≤ 3
 * (the third: residual_norm's fused backward, residual_norm_rows.cuh). */
template <int NOUT>
__global__ void chunk_total_kernel(float *out0, float *out1, float *out2, float *run,
                                   const float *ws, int cols, int64_t kn, int first, int last) {
    LUNA_SHARED_2D(float, part, kTotalWarps, kColsumCols);
    const int lane = threadIdx.x % kColsumCols, w = threadIdx.x / kColsumCols;
    const int c = blockIdx.x * kColsumCols + lane, j = blockIdx.y;
    float t = 0.0f;
    if (c < cols)
        for (int64_t k = w; k < kn; k += kTotalWarps)
            t += ws[(k * NOUT + j) * cols + c];
    part[w][lane] = t;
    __syncthreads();
    for (int h = kTotalWarps / 2; h > 0; h /= 2) {
        if (w < h) part[w][lane] += part[w + h][lane];
        __syncthreads();
    }
    if (w != 0 || c >= cols) return;
    const int64_t i = (int64_t)j * cols + c;
    const float total = first ? part[0][lane] : run[i] + part[0][lane];
    if (!last) {
        run[i] = total;
        return;
    }
    float *out = j == 0 ? out0 : (j == 1 ? out1 : out2);
    if (out) out[c] += total;
}

/* Chunks of LUNA_COLSUM_CHUNK rows in `rows`. */
inline int64_t colsum_chunks(int64_t rows) {
    return (rows + LUNA_COLSUM_CHUNK - 1) / LUNA_COLSUM_CHUNK;
}

/* Enqueue the sums of value over rows into out0 (and out1 when NOUT = 2) with the workspace ws
 * (at least luna_cuda_colsum_ws_doubles(rows, cols, NOUT) doubles; checked by the caller). */
template <int NOUT, typename Value>
cudaError_t column_sums(cudaStream_t s, float *out0, float *out1, int64_t rows, int cols,
                        luna_cuda_colsum_ws ws, const Value &value) {
    if (rows <= 0 || cols <= 0 || (!out0 && !out1)) return cudaSuccess;
    const int64_t nchunks = colsum_chunks(rows);
    const int64_t per_round = luna_cuda_colsum_round(rows, cols, NOUT, ws.n);
    if (per_round < 1) return cudaErrorInvalidValue;
    /* the workspace's doubles as floats: the same layout, half of it used */
    float *run = reinterpret_cast<float *>(ws.p), *sums = run + (int64_t)NOUT * cols;
    const unsigned col_blocks = (unsigned)((cols + kColsumCols - 1) / kColsumCols);
    for (int64_t k0 = 0; k0 < nchunks; k0 += per_round) {
        const int64_t kn = nchunks - k0 < per_round ? nchunks - k0 : per_round;
        const dim3 grid(col_blocks, (unsigned)((kn + kColsumWarps - 1) / kColsumWarps));
        LUNA_LAUNCH((chunk_sums_kernel<NOUT, Value>), grid, kColsumCols * kColsumWarps, 0, s, sums,
                    rows, cols, k0, kn, value);
        LUNA_LAUNCH(chunk_total_kernel<NOUT>, dim3(col_blocks, NOUT), kColsumCols * kTotalWarps, 0,
                    s, out0, out1, nullptr, run, static_cast<const float *>(sums), cols, kn,
                    k0 == 0 ? 1 : 0, k0 + kn == nchunks ? 1 : 0);
    }
    return cudaGetLastError();
}

/* Whether ws holds, as floats, the running totals and the sums of every chunk of rows at once:
 * the row kernels that produce their chunks' sums in the same pass (residual_norm_rows.cuh,
 * bias_relu_dropout_vec.cuh) need one round. */
inline bool colsum_one_round(int64_t rows, int cols, int nout, luna_cuda_colsum_ws ws) {
    return (colsum_chunks(rows) + 1) * nout * (int64_t)cols <= 2 * ws.n;
}

template <typename T> struct ColumnValue {
    const T *dy;
    int cols;
    __device__ void operator()(int64_t r, int c, float *v) const { v[0] = load(dy, r * cols + c); }
};

template <typename T> struct LnParamsValue {
    const T *dy, *x;
    const float *mean, *rstd;
    int d;
    __device__ void operator()(int64_t r, int c, float *v) const {
        const float g = load(dy, r * d + c);
        const float xhat = (load(x, r * d + c) - mean[r]) * rstd[r];
        v[0] = g * xhat;
        v[1] = g;
    }
};

/* db[c] += Σ_r dy[r, c] */
template <typename T>
cudaError_t column_sum(cudaStream_t s, float *db, const T *dy, int64_t rows, int cols,
                       luna_cuda_colsum_ws ws) {
    return column_sums<1>(s, db, nullptr, rows, cols, ws, ColumnValue<T>{dy, cols});
}

/* dγ_c += Σ_r dy_rc x̂_rc, dβ_c += Σ_r dy_rc (either may be NULL) */
template <typename T>
cudaError_t ln_params_sum(cudaStream_t s, float *dgamma, float *dbeta, const T *dy, const T *x,
                          const float *mean, const float *rstd, int64_t rows, int d,
                          luna_cuda_colsum_ws ws) {
    return column_sums<2>(s, dgamma, dbeta, rows, d, ws, LnParamsValue<T>{dy, x, mean, rstd, d});
}

#endif
