/* residual_norm for rows of the model's widths (d a multiple of 8, at most 1024): a warp a row,
 * the row held in registers. Included by fused.cu, in its anonymous namespace (uses its drop4,
 * drop_factors4, kThreads, and act_io.cuh's Vec8Of and as_stored).
 *
 * The general kernels (resnorm_fwd_kernel, resnorm_bwd_kernel) walk the row three times through
 * memory, re-reading what they stored, element by element. Here each lane loads its K runs of 8
 * consecutive elements (16-byte vectors: lane + 32·k, k < K = d / 256 rounded up) once, keeps them
 * as floats, and writes each output once; the dropout factors of a run come from two Philox
 * blocks. The arithmetic is the general kernels', operation by operation (r = res + dropout(sub +
 * bias) rounded as stored, mean and variance in double, y = x̂·γ + β; backward
 * dres = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·γ, dsub = dropout(dres as stored)); only
 * the order of the row sums differs (within the NORM tier). */

constexpr int kVecRowMax = 1024;

/* The dropout factors of elements i .. i + 7, i a multiple of 8 (rows of a multiple of 8): two
 * Philox blocks (drop4's without its per-element fallback, which would be inlined at every call);
 * all 1 when p = 0. */
__device__ inline void drops8(luna_rng_key key, int64_t i, float p, float scale, float f[8]) {
    if (p > 0.0f) {
        drop_factors4(key, (uint64_t)(i / 4), p, scale, f);
        drop_factors4(key, (uint64_t)(i / 4) + 1, p, scale, f + 4);
    } else {
        for (int e = 0; e < 8; e++)
            f[e] = 1.0f;
    }
}

/* 8 floats from a float array (bias, γ, β) at a multiple of 8 */
__device__ inline void load8(float *v, const float *p) { Vec8Of<float>::load(v, p); }

template <typename T, int K>
__global__ void resnorm_fwd_vec_kernel(T *y, T *r, float *mean, float *rstd, const T *sub,
                                       const float *bias, const T *res, const float *gamma,
                                       const float *beta, int64_t rows, int d, float eps, float p,
                                       float scale, luna_rng_key key) {
    const int64_t row = (int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, n8 = d / 8;
    if (row >= rows) return; /* the whole warp */
    const int64_t off = row * d;
    float x[K][8] = {}; /* every lane sets the runs it uses; zeros keep the compilers quiet */
    double s = 0.0;
    LUNA_UNROLL for (int k = 0; k < K; k++) {
        const int c0 = (lane + 32 * k) * 8;
        if (c0 >= d) break;
        float t[8], rs[8], b[8] = {0.0f}, f[8];
        Vec8Of<T>::load(t, sub + off + c0);
        Vec8Of<T>::load(rs, res + off + c0);
        if (bias) load8(b, bias + c0);
        drops8(key, off + c0, p, scale, f);
        for (int e = 0; e < 8; e++) {
            float v = t[e];
            if (bias) v = __fadd_rn(v, b[e]);
            if (p > 0.0f) v = __fmul_rn(v, f[e]);
            x[k][e] = as_stored(__fadd_rn(v, rs[e]), r);
            s += (double)x[k][e];
        }
        Vec8Of<T>::store(r + off + c0, x[k]);
    }
    for (int m = 16; m > 0; m /= 2)
        s += __shfl_xor_sync(0xffffffffu, s, m);
    const double mu = __shfl_sync(0xffffffffu, s, 0) / d;
    double v = 0.0;
    LUNA_UNROLL for (int k = 0; k < K; k++) {
        if ((lane + 32 * k) >= n8) break;
        for (int e = 0; e < 8; e++) {
            const double t = (double)x[k][e] - mu;
            v = __dadd_rn(v, __dmul_rn(t, t));
        }
    }
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    v = __shfl_sync(0xffffffffu, v, 0) / d;
    const float mf = (float)mu, rf = (float)(1.0 / sqrt(v + (double)eps));
    if (lane == 0) mean[row] = mf, rstd[row] = rf;
    LUNA_UNROLL for (int k = 0; k < K; k++) {
        const int c0 = (lane + 32 * k) * 8;
        if (c0 >= d) break;
        float g[8], b[8], out[8];
        load8(g, gamma + c0);
        load8(b, beta + c0);
        for (int e = 0; e < 8; e++)
            out[e] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[k][e], mf), rf), g[e]), b[e]);
        Vec8Of<T>::store(y + off + c0, out);
    }
}

/* One row of the backward by a warp (lane's K runs of 8; dres may alias dy: a lane reads its runs
 * of dy before it writes them): dres and dsub stored; with SUMS, the lane's columns' Σ dy·x̂,
 * Σ dy and Σ dsub (as stored) accumulated into sg, sb, ss (unused without). */
template <typename T, int K, bool SUMS>
__device__ inline void resnorm_bwd_row(T *dres, T *dsub, const T *dy, const T *x,
                                       const float *gamma, int64_t off, int d, float m, float rs,
                                       float p, float scale, luna_rng_key key, float (*sg)[8],
                                       float (*sb)[8], float (*ss)[8]) {
    const int lane = threadIdx.x % 32;
    float gc[K][8] = {}, xh[K][8] = {};
    double s1 = 0.0, s2 = 0.0;
    LUNA_UNROLL for (int k = 0; k < K; k++) {
        const int c0 = (lane + 32 * k) * 8;
        if (c0 >= d) break;
        float g[8], xv[8], gm[8];
        Vec8Of<T>::load(g, dy + off + c0);
        Vec8Of<T>::load(xv, x + off + c0);
        load8(gm, gamma + c0);
        for (int e = 0; e < 8; e++) {
            gc[k][e] = __fmul_rn(g[e], gm[e]);
            xh[k][e] = __fmul_rn(__fsub_rn(xv[e], m), rs);
            s1 += (double)gc[k][e];
            s2 += (double)__fmul_rn(gc[k][e], xh[k][e]);
            if (SUMS) {
                sg[k][e] = __fmaf_rn(g[e], xh[k][e], sg[k][e]);
                sb[k][e] = __fadd_rn(sb[k][e], g[e]);
            }
        }
    }
    for (int w = 16; w > 0; w /= 2) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, w);
        s2 += __shfl_xor_sync(0xffffffffu, s2, w);
    }
    const float m1 = (float)(__shfl_sync(0xffffffffu, s1, 0) / d),
                m2 = (float)(__shfl_sync(0xffffffffu, s2, 0) / d);
    LUNA_UNROLL for (int k = 0; k < K; k++) {
        const int c0 = (lane + 32 * k) * 8;
        if (c0 >= d) break;
        float dr[8], f[8];
        drops8(key, off + c0, p, scale, f);
        for (int e = 0; e < 8; e++)
            dr[e] = __fmul_rn(rs, __fsub_rn(__fsub_rn(gc[k][e], m1), __fmul_rn(xh[k][e], m2)));
        Vec8Of<T>::store(dres + off + c0, dr);
        for (int e = 0; e < 8; e++) {
            const float g = as_stored(dr[e], dres);
            dr[e] = p > 0.0f ? __fmul_rn(g, f[e]) : g;
            if (SUMS) ss[k][e] = __fadd_rn(ss[k][e], as_stored(dr[e], dsub));
        }
        Vec8Of<T>::store(dsub + off + c0, dr);
    }
}

template <typename T, int K>
__global__ void resnorm_bwd_vec_kernel(T *dres, T *dsub, const T *dy, const T *x, const float *mean,
                                       const float *rstd, const float *gamma, int64_t rows, int d,
                                       float p, float scale, luna_rng_key key) {
    const int64_t row = (int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    if (row >= rows) return; /* the whole warp */
    resnorm_bwd_row<T, K, false>(dres, dsub, dy, x, gamma, row * d, d, mean[row], rstd[row], p,
                                 scale, key, nullptr, nullptr, nullptr);
}

/* The backward with its column sums in the same pass: dγ_c = Σ_r dy·x̂, dβ_c = Σ_r dy and
 * dbias_c = Σ_r dsub (as stored), which the general path summed in two more passes (re-reading
 * dy and x, then dsub: five launches). A block of kSumWarps warps takes a chunk of
 * LUNA_COLSUM_CHUNK rows, warp w its rows w, w + kSumWarps, ... one at a time
 * (resnorm_bwd_row, as resnorm_bwd_vec_kernel), each lane keeping its columns' three partial sums
 * in registers; the warps' partials then add in shared memory, in warp order, into the chunk's sums
 * ws[chunk][3][d], which chunk_total_kernel<3> adds over the chunks (column_sum.cuh). The sums are
 * fp32 chains of at most LUNA_COLSUM_CHUNK / kSumWarps rows and a fixed tree: run-to-run
 * deterministic, within the ACCUM tier of the CPU's chunked double sums. */
constexpr int kSumWarps = 4;

template <typename T, int K>
__global__ void resnorm_bwd_sums_kernel(T *dres, T *dsub, float *ws, const T *dy, const T *x,
                                        const float *mean, const float *rstd, const float *gamma,
                                        int64_t rows, int d, float p, float scale,
                                        luna_rng_key key) {
    LUNA_SHARED_2D(float, part, kSumWarps, kVecRowMax);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r0 = (int64_t)blockIdx.x * LUNA_COLSUM_CHUNK;
    const int64_t r1 = r0 + LUNA_COLSUM_CHUNK < rows ? r0 + LUNA_COLSUM_CHUNK : rows;
    float sg[K][8] = {}, sb[K][8] = {}, ss[K][8] = {}; /* Σ dy·x̂, Σ dy, Σ dsub */
    for (int64_t row = r0 + w; row < r1; row += kSumWarps)
        resnorm_bwd_row<T, K, true>(dres, dsub, dy, x, gamma, row * d, d, mean[row], rstd[row], p,
                                    scale, key, sg, sb, ss);
    for (int o = 0; o < 3; o++) { /* one output at a time through the shared array */
        LUNA_UNROLL for (int k = 0; k < K; k++) {
            const int c0 = (lane + 32 * k) * 8;
            if (c0 >= d) break;
            for (int e = 0; e < 8; e++)
                part[w][c0 + e] = o == 0 ? sg[k][e] : (o == 1 ? sb[k][e] : ss[k][e]);
        }
        __syncthreads();
        for (int c = threadIdx.x; c < d; c += kSumWarps * 32) {
            float t = part[0][c];
            for (int j = 1; j < kSumWarps; j++)
                t = __fadd_rn(t, part[j][c]);
            ws[((int64_t)blockIdx.x * 3 + o) * d + c] = t;
        }
        __syncthreads();
    }
}

/* Launch kernel<T, K> (K = d / 256 rounded up, d a multiple of 8 up to kVecRowMax) on `blocks`
 * blocks of `threads`. */
#define VEC_K_LAUNCH(kernel, T, d, blocks, threads, s, ...)                                        \
    do {                                                                                           \
        if ((d) <= 256)                                                                            \
            LUNA_LAUNCH((kernel<T, 1>), blocks, threads, 0, s, __VA_ARGS__);                       \
        else if ((d) <= 512)                                                                       \
            LUNA_LAUNCH((kernel<T, 2>), blocks, threads, 0, s, __VA_ARGS__);                       \
        else if ((d) <= 768)                                                                       \
            LUNA_LAUNCH((kernel<T, 3>), blocks, threads, 0, s, __VA_ARGS__);                       \
        else                                                                                       \
            LUNA_LAUNCH((kernel<T, 4>), blocks, threads, 0, s, __VA_ARGS__);                       \
    } while (0)

/* A warp a row (the general kernels when the row does not fit: vec_row_fits). */
#define VEC_ROW_LAUNCH(kernel, T, d, rows, s, ...)                                                 \
    VEC_K_LAUNCH(kernel, T, d, (unsigned)(((rows) + kThreads / 32 - 1) / (kThreads / 32)),         \
                 kThreads, s, __VA_ARGS__)

/* resnorm_bwd_sums_kernel: a block of kSumWarps warps per chunk of rows. */
#define VEC_SUMS_LAUNCH(T, d, rows, s, ...)                                                        \
    VEC_K_LAUNCH(resnorm_bwd_sums_kernel, T, d, (unsigned)colsum_chunks(rows), kSumWarps * 32, s,  \
                 __VA_ARGS__)
inline bool vec_row_fits(int d) { return d % 8 == 0 && d <= kVecRowMax; }
