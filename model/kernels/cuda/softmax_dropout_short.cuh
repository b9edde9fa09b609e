/* softmax_dropout for short rows (cols ≤ 128: attention rows over l = 32 or a sentence's keys),
 * several rows a warp. Included by fused.cu, in its anonymous namespace (uses its drop4,
 * kThreads, and act_io.cuh's load, store, Vec8Of and as_stored).
 *
 * With a warp a row and an element a lane (the long-row kernels' shape at these widths) a lane
 * does one element's work between two chains of warp shuffles and waits on one dependent memory
 * round trip after another. Here L lanes share a row (L = the power of two ≥ cols / 8) and each
 * lane owns 8 consecutive elements, read and written as one 16-byte vector where the row allows
 * (bf16 rows of a multiple of 8, fp32 rows of a multiple of 4), with its dropout factors from two
 * Philox blocks (drop4) instead of eight. The arithmetic is the long-row kernels' (exp of x − max,
 * the sum in double, y = e·(1/sum), yd = y as stored times the factor; backward
 * dx = y·(g − Σ y·g)); only the order of the sums differs (8 elements a lane, then a tree over
 * the L lanes), within the NORM tier. */

/* A lane's 8 elements c0 .. c0 + 7 of row `row` (those ≥ cols are neither read nor written: 0). */
template <typename T>
__device__ inline void lane_load(float *v, const T *row, int c0, int cols, bool vec) {
    if (vec && c0 + 8 <= cols) {
        Vec8Of<T>::load(v, row + c0);
        return;
    }
    for (int e = 0; e < 8; e++)
        v[e] = c0 + e < cols ? load(row, c0 + e) : 0.0f;
}
template <typename T>
__device__ inline void lane_store(T *row, const float *v, int c0, int cols, bool vec) {
    if (vec && c0 + 8 <= cols) {
        Vec8Of<T>::store(row + c0, v);
        return;
    }
    for (int e = 0; e < 8 && c0 + e < cols; e++)
        store(row, c0 + e, v[e]);
}

template <int L> __device__ inline double lanes_sum(double v) {
    for (int m = L / 2; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}
template <int L> __device__ inline float lanes_max(float v) {
    for (int m = L / 2; m > 0; m /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* Rows handled by one block of kThreads, and the block count for `rows`. */
template <int L> __host__ __device__ constexpr int short_rows_per_block() { return kThreads / L; }
template <int L> inline unsigned short_blocks(int64_t rows) {
    return (unsigned)((rows + short_rows_per_block<L>() - 1) / short_rows_per_block<L>());
}

template <typename T, int L>
__global__ void smd_fwd_short_kernel(T *y, T *yd, const T *x, int64_t rows, int cols,
                                     const int32_t *valid_cols, int64_t rows_per_group,
                                     int causal_period, float p, float scale, luna_rng_key key) {
    const int64_t r = (int64_t)blockIdx.x * short_rows_per_block<L>() + threadIdx.x / L;
    const int c0 = (threadIdx.x % L) * 8;
    const bool live = r < rows; /* dead lanes still join the shuffles, reading and writing nothing */
    const bool vec = cols % Vec8Of<T>::kAlign == 0;
    const int64_t off = live ? r * cols : 0;
    float v[8];
    lane_load(v, x + off, c0, live ? cols : 0, vec);
    int64_t lim = live && valid_cols ? valid_cols[r / rows_per_group] : cols;
    if (live && causal_period > 0 && r % causal_period + 1 < lim) lim = r % causal_period + 1;
    int valid = lim < 0 ? 0 : (lim > cols ? cols : (int)lim);
    float mx = -INFINITY;
    for (int e = 0; e < 8; e++)
        if (c0 + e < valid) mx = fmaxf(mx, v[e]);
    mx = lanes_max<L>(mx);
    if (mx == -INFINITY) valid = 0;
    double sum = 0.0;
    for (int e = 0; e < 8; e++)
        if (c0 + e < valid) sum += (double)expf(__fsub_rn(v[e], mx));
    sum = lanes_sum<L>(sum);
    if (!live) return; /* past the last shuffle */
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < 8; e++)
        v[e] = c0 + e < valid ? __fmul_rn(expf(__fsub_rn(v[e], mx)), inv) : 0.0f;
    lane_store(y + off, v, c0, cols, vec);
    if (!yd) return;
    float f[8];
    drop4(key, off + c0, p, scale, f);
    drop4(key, off + c0 + 4, p, scale, f + 4);
    for (int e = 0; e < 8; e++)
        v[e] = __fmul_rn(as_stored(v[e], y), f[e]);
    lane_store(yd + off, v, c0, cols, vec);
}

/* dx may alias dyd: a lane reads its 8 elements of both before it writes them. */
template <typename T, int L>
__global__ void smd_bwd_short_kernel(T *dx, const T *dyd, const T *y, int64_t rows, int cols,
                                     float p, float scale, luna_rng_key key) {
    const int64_t r = (int64_t)blockIdx.x * short_rows_per_block<L>() + threadIdx.x / L;
    const int c0 = (threadIdx.x % L) * 8;
    const bool live = r < rows;
    const bool vec = cols % Vec8Of<T>::kAlign == 0;
    const int64_t off = live ? r * cols : 0;
    float g[8], yv[8], f[8];
    lane_load(g, dyd + off, c0, live ? cols : 0, vec);
    lane_load(yv, y + off, c0, live ? cols : 0, vec);
    drop4(key, off + c0, p, scale, f);
    drop4(key, off + c0 + 4, p, scale, f + 4);
    double dot = 0.0;
    for (int e = 0; e < 8; e++) {
        g[e] = __fmul_rn(g[e], f[e]);
        if (c0 + e < cols) dot += (double)__fmul_rn(yv[e], g[e]);
    }
    const float s = (float)lanes_sum<L>(dot);
    if (!live) return;
    for (int e = 0; e < 8; e++)
        g[e] = __fmul_rn(yv[e], __fsub_rn(g[e], s));
    lane_store(dx + off, g, c0, cols, vec);
}

/* Launch kernel<T, L> for rows of cols ≤ 128: L = 1, 2, 4, 8 or 16 lanes a row. */
#define SHORT_LAUNCH_(kernel, T, L, rows, s, ...)                                                  \
    LUNA_LAUNCH((kernel<T, L>), short_blocks<L>(rows), kThreads, 0, s, __VA_ARGS__)
#define SHORT_ROW_LAUNCH(kernel, T, cols, rows, s, ...)                                            \
    do {                                                                                           \
        if ((cols) <= 8)                                                                           \
            SHORT_LAUNCH_(kernel, T, 1, rows, s, __VA_ARGS__);                                     \
        else if ((cols) <= 16)                                                                     \
            SHORT_LAUNCH_(kernel, T, 2, rows, s, __VA_ARGS__);                                     \
        else if ((cols) <= 32)                                                                     \
            SHORT_LAUNCH_(kernel, T, 4, rows, s, __VA_ARGS__);                                     \
        else if ((cols) <= 64)                                                                     \
            SHORT_LAUNCH_(kernel, T, 8, rows, s, __VA_ARGS__);                                     \
        else                                                                                       \
            SHORT_LAUNCH_(kernel, T, 16, rows, s, __VA_ARGS__);                                    \
    } while (0)
constexpr int kShortRowMax = 128;
