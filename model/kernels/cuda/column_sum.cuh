/* Column sums over rows in the order of model/kernels/column_sum_order.h (included after
 * cuda_compat.h and act_io.cuh, inside a .cu file's anonymous namespace):
 *   column_sum_kernel<T>      db[c] += Σ_r dy[r, c]                        (bias gradients)
 *   ln_params_sum_kernel<T>   dγ[c] += Σ_r dy_rc·x̂_rc, dβ[c] += Σ_r dy_rc  (LayerNorm, x̂ from
 *                             the row's stored mean and rstd, one rounding per operation)
 * A block owns kColsumCols columns; its kColsumGroups row groups each sum one chunk of
 * LUNA_COLSUM_CHUNK rows (in double, rows in order), a round of chunks at a time; row group 0
 * then adds the round's chunk sums in chunk order. Launch colsum_blocks(cols) blocks of
 * kColsumThreads threads. */
#ifndef LUNA_KERNELS_CUDA_COLUMN_SUM_CUH
#define LUNA_KERNELS_CUDA_COLUMN_SUM_CUH

#include "model/kernels/column_sum_order.h"

constexpr int kColsumCols = 32, kColsumGroups = 16;
constexpr int kColsumThreads = kColsumCols * kColsumGroups;

inline unsigned colsum_blocks(int cols) {
    return (unsigned)((cols + kColsumCols - 1) / kColsumCols);
}

/* The block's columns: NOUT sums per column of value(r, c, v[NOUT]). */
template <int NOUT, typename Value>
__device__ inline void column_sums(float *out0, float *out1, int64_t rows, int cols,
                                   const Value &value) {
    LUNA_SHARED_2D(double, part, NOUT *kColsumGroups, kColsumCols);
    const int lane = threadIdx.x % kColsumCols, g = threadIdx.x / kColsumCols;
    const int c = blockIdx.x * kColsumCols + lane;
    const int64_t nchunks = (rows + LUNA_COLSUM_CHUNK - 1) / LUNA_COLSUM_CHUNK;
    double total[NOUT];
    for (int j = 0; j < NOUT; j++)
        total[j] = 0.0;
    for (int64_t base = 0; base < nchunks; base += kColsumGroups) {
        const int64_t k = base + g;
        double acc[NOUT];
        for (int j = 0; j < NOUT; j++)
            acc[j] = 0.0;
        if (c < cols && k < nchunks) {
            const int64_t r1 =
                (k + 1) * LUNA_COLSUM_CHUNK < rows ? (k + 1) * LUNA_COLSUM_CHUNK : rows;
            for (int64_t r = k * LUNA_COLSUM_CHUNK; r < r1; r++) {
                double v[NOUT];
                value(r, c, v);
                for (int j = 0; j < NOUT; j++)
                    acc[j] = __dadd_rn(acc[j], v[j]);
            }
        }
        for (int j = 0; j < NOUT; j++)
            part[j * kColsumGroups + g][lane] = acc[j];
        __syncthreads();
        if (g == 0 && c < cols) {
            const int n = nchunks - base < kColsumGroups ? (int)(nchunks - base) : kColsumGroups;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < NOUT; j++)
                    total[j] = __dadd_rn(total[j], part[j * kColsumGroups + i][lane]);
        }
        __syncthreads(); /* part is reused by the next round */
    }
    if (g == 0 && c < cols) {
        if (out0) out0[c] = (float)__dadd_rn((double)out0[c], total[0]);
        if (NOUT > 1 && out1) out1[c] = (float)__dadd_rn((double)out1[c], total[NOUT - 1]);
    }
}

template <typename T> struct ColumnValue {
    const T *dy;
    int cols;
    __device__ void operator()(int64_t r, int c, double *v) const {
        v[0] = (double)load(dy, r * cols + c);
    }
};

template <typename T> struct LnParamsValue {
    const T *dy, *x;
    const float *mean, *rstd;
    int d;
    __device__ void operator()(int64_t r, int c, double *v) const {
        const float g = load(dy, r * d + c);
        const float xhat = __fmul_rn(__fsub_rn(load(x, r * d + c), mean[r]), rstd[r]);
        v[0] = (double)__fmul_rn(g, xhat);
        v[1] = (double)g;
    }
};

/* db[c] += Σ_r dy[r, c] */
template <typename T>
__global__ void column_sum_kernel(float *db, const T *dy, int64_t rows, int cols) {
    column_sums<1>(db, nullptr, rows, cols, ColumnValue<T>{dy, cols});
}

/* dγ_c += Σ_r dy_rc x̂_rc, dβ_c += Σ_r dy_rc (either may be NULL) */
template <typename T>
__global__ void ln_params_sum_kernel(float *dgamma, float *dbeta, const T *dy, const T *x,
                                     const float *mean, const float *rstd, int64_t rows, int d) {
    column_sums<2>(dgamma, dbeta, rows, d, LnParamsValue<T>{dy, x, mean, rstd, d});
}

#endif
