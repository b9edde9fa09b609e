/* bias_relu_dropout for rows of a multiple of 8 elements (the FFN's 2048): 8 consecutive elements
 * a thread, read and written as 16-byte vectors, their dropout factors from two Philox blocks.
 * Included by fused.cu, in its anonymous namespace (uses its drop_factors4 and kEltThreads, and
 * act_io.cuh's Vec8Of, as_stored, GRID_STRIDE). The arithmetic is brd_fwd_kernel's and
 * brd_bwd_kernel's element by element (h += bias as stored, a = dropout(relu(h)); backward
 * dh = h > 0 ? dropout(da) : 0); the general kernels keep rows of other widths. */

inline bool brd_vec_fits(int cols) { return cols % 8 == 0; }

template <typename T>
__global__ void brd_fwd_vec_kernel(T *a, T *h, const float *bias, int64_t rows, int cols, float p,
                                   float scale, luna_rng_key key) {
    const int64_t runs = rows * cols / 8;
    GRID_STRIDE(k, runs) {
        const int64_t i = 8 * k;
        float v[8], f[8] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
        Vec8Of<T>::load(v, h + i);
        if (bias) {
            float b[8];
            Vec8Of<float>::load(b, bias + i % cols);
            for (int e = 0; e < 8; e++)
                v[e] = as_stored(__fadd_rn(v[e], b[e]), h);
            Vec8Of<T>::store(h + i, v);
        }
        if (p > 0.0f) {
            drop_factors4(key, (uint64_t)(2 * k), p, scale, f);
            drop_factors4(key, (uint64_t)(2 * k + 1), p, scale, f + 4);
        }
        for (int e = 0; e < 8; e++) {
            const float act = v[e] < 0.0f ? 0.0f : __fadd_rn(v[e], 0.0f);
            v[e] = p > 0.0f ? __fmul_rn(act, f[e]) : act;
        }
        Vec8Of<T>::store(a + i, v);
    }
}

/* dh of elements i .. i + 7 (i a multiple of 8) into g and stored: brd_bwd_kernel's arithmetic,
 * the dropout factors of Philox blocks i/4 and i/4 + 1. dh may alias da: the thread reads its 8
 * elements of both before it writes them. */
template <typename T>
__device__ inline void brd_bwd_run(T *dh, const T *da, const T *h, int64_t i, float p, float scale,
                                   luna_rng_key key, float g[8]) {
    const int64_t k = i / 8;
    float hv[8], f[8] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    Vec8Of<T>::load(g, da + i);
    Vec8Of<T>::load(hv, h + i);
    if (p > 0.0f) {
        drop_factors4(key, (uint64_t)(2 * k), p, scale, f);
        drop_factors4(key, (uint64_t)(2 * k + 1), p, scale, f + 4);
    }
    for (int e = 0; e < 8; e++) {
        const float d = p > 0.0f ? __fmul_rn(g[e], f[e]) : g[e];
        g[e] = hv[e] > 0.0f ? d : 0.0f;
    }
    Vec8Of<T>::store(dh + i, g);
}

template <typename T>
__global__ void brd_bwd_vec_kernel(T *dh, const T *da, const T *h, int64_t n, float p, float scale,
                                   luna_rng_key key) {
    GRID_STRIDE(k, n / 8) {
        float g[8];
        brd_bwd_run(dh, da, h, 8 * k, p, scale, key, g);
    }
}

/* The backward with the bias gradient's column sums in the same pass (the general path summed dh
 * in a second pass over it, column_sum.cuh): a thread takes one run of 8 columns (blockIdx.x) of
 * a chunk of LUNA_COLSUM_CHUNK rows (blockIdx.y), row after row (brd_bwd_run, as
 * brd_bwd_vec_kernel), and writes the chunk's sums of dh as stored into ws[chunk][cols] for
 * chunk_total_kernel<1>: each sum a chain of the chunk's rows in order, as chunk_sums_kernel's. */
constexpr int kBrdSumThreads = 128;

template <typename T>
__global__ void brd_bwd_sums_kernel(T *dh, float *ws, const T *da, const T *h, int64_t rows,
                                    int cols, float p, float scale, luna_rng_key key) {
    const int c0 = (blockIdx.x * kBrdSumThreads + threadIdx.x) * 8;
    if (c0 >= cols) return;
    const int64_t r0 = (int64_t)blockIdx.y * LUNA_COLSUM_CHUNK;
    const int64_t r1 = r0 + LUNA_COLSUM_CHUNK < rows ? r0 + LUNA_COLSUM_CHUNK : rows;
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t r = r0; r < r1; r++) {
        float g[8];
        brd_bwd_run(dh, da, h, r * cols + c0, p, scale, key, g);
        for (int e = 0; e < 8; e++)
            sum[e] = __fadd_rn(sum[e], as_stored(g[e], dh));
    }
    for (int e = 0; e < 8; e++)
        ws[(int64_t)blockIdx.y * cols + c0 + e] = sum[e];
}
