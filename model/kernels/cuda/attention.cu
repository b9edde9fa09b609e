/* attention_forward/backward in one kernel per sentence and head, for bf16 activations and rows
 * of at most 128 (core/backend.h; the composition it replaces is core/attention_composed.c).
 *
 * The composition runs three kernels forward (the scores' GEMM, the softmax with dropout, the
 * second GEMM) and five backward (four GEMMs, the softmax's backward), the GEMMs batches of
 * products of 32 × 64 × 32 at WMT lengths, and writes the scores and their gradient to memory
 * between them. Here a block of 4 warps stages
 * Q, K, V (and dO) of one sentence and head in shared memory as bf16, zero-padded to multiples
 * of 16, and every product is a tensor-core product (nvcuda::wmma m16n16k16, fp32 accumulators):
 *   forward   S = Q Kᵀ (fp32, on chip); a = softmax(scale·S) masked as softmax_forward is;
 *             a_d = dropout(a) with the factors of softmax_dropout (the same mask bit for bit);
 *             O = a_d V;  a and a_d are written (the backward reads them).
 *   backward  F = dO Vᵀ; dS' = scale · a ⊙ (g − Σ a·g), g = dropout_backward(F) (in a's tile);
 *             dQ = dS' K, dK = dS'ᵀ Q, dV = a_dᵀ dO (dK + dV in one accumulator when they share
 *             a buffer: tied keys and values).
 * Differences from the composition, within the tiers' bf16 bounds: the scores and their
 * gradient stay fp32 (the composition rounds them to bf16 in memory), the softmax sums are fp32
 * warp trees, and scale multiplies dS before its rounding instead of the products after it.
 * Each tile is a fixed warp's and sums in a fixed order: identical results run to run. */
#include "model/kernels/cuda/cuda_compat.h"

#include <type_traits>

#include "core/philox.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

#include "model/kernels/cuda/dropout_factors.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> ARow;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> ACol;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> BRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> BCol;

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kMaxLen = 128; /* n, m and dh: a row of scores is 4 values a lane */

inline __host__ __device__ int up16(int v) { return (v + 15) / 16 * 16; }
inline __host__ __device__ size_t align128(size_t b) { return (b + 127) / 128 * 128; }
inline __host__ __device__ int imax2(int a, int b) { return a > b ? a : b; }

/* Tile row lengths: bf16 rows padded by 8 elements (16 bytes: WMMA's ldm rule, and rows that
 * start on different banks), fp32 rows by 4. */
struct Dims {
    int n16, m16, d16;
    int ldd; /* bf16 [*, d16]: Q, K, V, dO */
    int ldm; /* bf16 [n16, m16]: a_d (forward); a then dS', and a_d (backward) */
    int ldf; /* fp32 [max(n16, m16), max(m16, d16)]: scores, their gradient, each product */
};
inline __host__ __device__ Dims dims_of(int n, int m, int dh) {
    Dims d;
    d.n16 = up16(n), d.m16 = up16(m), d.d16 = up16(dh);
    d.ldd = d.d16 + 8, d.ldm = d.m16 + 8, d.ldf = imax2(d.m16, d.d16) + 4;
    return d;
}

/* Byte offsets of the shared buffers (128-byte aligned; WMMA wants 32). */
struct Plan {
    size_t q, k, v, g, pa, pd, f, bytes;
};
inline __host__ __device__ Plan plan_of(const Dims &d, bool backward) {
    Plan p;
    size_t o = 0;
    p.q = o, o += align128((size_t)d.n16 * d.ldd * 2);
    p.k = o, o += align128((size_t)d.m16 * d.ldd * 2);
    p.v = o, o += align128((size_t)d.m16 * d.ldd * 2);
    p.g = o, o += backward ? align128((size_t)d.n16 * d.ldd * 2) : 0;
    p.pa = o, o += align128((size_t)d.n16 * d.ldm * 2);
    p.pd = o, o += backward ? align128((size_t)d.n16 * d.ldm * 2) : 0;
    p.f = o, o += align128((size_t)imax2(d.n16, d.m16) * d.ldf * 4);
    p.bytes = o;
    return p;
}

/* Where matrix (b, h) of an operand starts. */
__device__ inline int64_t at(luna_grid_stride s, int b, int h) {
    return (int64_t)b * s.outer + (int64_t)h * s.inner;
}

union Vec8 {
    uint4 word;
    bf16 v[8];
};

/* dst [rows16, cols16] (bf16, row length ldd) = src's rows × cols at row stride ld, zero
 * elsewhere; 16-byte moves where every row starts on 16 bytes. */
__device__ inline void stage(bf16 *dst, int ldd, const bf16 *src, int ld, int rows, int cols,
                             int rows16, int cols16) {
    if (cols % 8 == 0 && ld % 8 == 0 && (size_t)src % 16 == 0) {
        const int per_row = cols16 / 8;
        for (int i = threadIdx.x; i < rows16 * per_row; i += kThreads) {
            const int r = i / per_row, c = (i % per_row) * 8;
            Vec8 w;
            w.word = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows && c < cols)
                w.word = *reinterpret_cast<const uint4 *>(src + (int64_t)r * ld + c);
            *reinterpret_cast<uint4 *>(dst + r * ldd + c) = w.word;
        }
        return;
    }
    for (int i = threadIdx.x; i < rows16 * cols16; i += kThreads) {
        const int r = i / cols16, c = i % cols16;
        dst[r * ldd + c] = r < rows && c < cols ? src[(int64_t)r * ld + c] : __float2bfloat16(0.0f);
    }
}

/* dst's rows × cols (bf16, row stride ld) = F (fp32, row length ldf), rounded once. */
__device__ inline void write_rows(bf16 *dst, int ld, const float *F, int ldf, int rows, int cols) {
    if (cols % 8 == 0 && ld % 8 == 0 && (size_t)dst % 16 == 0) {
        const int per_row = cols / 8;
        for (int i = threadIdx.x; i < rows * per_row; i += kThreads) {
            const int r = i / per_row, c = (i % per_row) * 8;
            Vec8 w;
            for (int e = 0; e < 8; e++)
                w.v[e] = __float2bfloat16(F[r * ldf + c + e]);
            *reinterpret_cast<uint4 *>(dst + (int64_t)r * ld + c) = w.word;
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * cols; i += kThreads) {
        const int r = i / cols, c = i % cols;
        dst[(int64_t)r * ld + c] = __float2bfloat16(F[r * ldf + c]);
    }
}

/* F [M16, N16] = U op(W) over k16, U [M16, k16] bf16 rows; op(W) = W [k16, N16] (O = a_d V,
 * dQ = dS' K) or, transposed, Wᵀ with W [N16, k16] (S = Q Kᵀ, F = dO Vᵀ). */
template <bool transposed>
__device__ inline void product(float *F, int ldf, const bf16 *U, int ldu, const bf16 *W, int ldw,
                               int M16, int N16, int k16, int warp) {
    typedef typename std::conditional<transposed, BCol, BRow>::type BFrag;
    const int tn = N16 / 16;
    for (int tile = warp; tile < (M16 / 16) * tn; tile += kWarps) {
        const int ti = tile / tn, tj = tile % tn;
        Acc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < k16; k += 16) {
            ARow fa;
            BFrag fb;
            wmma::load_matrix_sync(fa, U + ti * 16 * ldu + k, ldu);
            wmma::load_matrix_sync(fb, transposed ? W + tj * 16 * ldw + k : W + k * ldw + tj * 16,
                                   ldw);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(F + ti * 16 * ldf + tj * 16, acc, ldf, wmma::mem_row_major);
    }
}

/* F [M16, N16] = U1ᵀ W1 (+ U2ᵀ W2 when U2) over k16: U [k16, M16], W [k16, N16]
 * (dK = dS'ᵀ Q, dV = a_dᵀ dO, or their sum in one accumulator). */
__device__ inline void product_tn(float *F, int ldf, const bf16 *U1, const bf16 *W1, const bf16 *U2,
                                  const bf16 *W2, int ldu, int ldw, int M16, int N16, int k16,
                                  int warp) {
    const int tn = N16 / 16;
    for (int tile = warp; tile < (M16 / 16) * tn; tile += kWarps) {
        const int ti = tile / tn, tj = tile % tn;
        Acc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int pass = 0; pass < (U2 ? 2 : 1); pass++) {
            const bf16 *U = pass ? U2 : U1, *W = pass ? W2 : W1;
            for (int k = 0; k < k16; k += 16) {
                ACol fa; /* Uᵀ: U's rows read as columns */
                BRow fb;
                wmma::load_matrix_sync(fa, U + k * ldu + ti * 16, ldu);
                wmma::load_matrix_sync(fb, W + k * ldw + tj * 16, ldw);
                wmma::mma_sync(acc, fa, fb, acc);
            }
        }
        wmma::store_matrix_sync(F + ti * 16 * ldf + tj * 16, acc, ldf, wmma::mem_row_major);
    }
}

/* The row passes: a row of scores is `lanes` lanes of a warp, 4 keys a lane (lanes: the power
 * of two ≥ m16 / 4, so 32 / lanes rows a warp at a time: Luna's 32-key rows use every lane);
 * the max and the sums go over the row's lanes by a fixed xor tree. */
__host__ __device__ inline int lanes_of(int m16) {
    int lanes = 4;
    while (lanes * 4 < m16)
        lanes *= 2;
    return lanes;
}
__device__ inline float row_max(float v, int lanes) {
    for (int s = lanes / 2; s > 0; s /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
    return v;
}
__device__ inline float row_sum(float v, int lanes) {
    for (int s = lanes / 2; s > 0; s /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, s);
    return v;
}

/* The keys row r of sentence b attends to (softmax_forward's mask). */
__device__ inline int keys_of(const luna_attention_shape &s, int b, int r) {
    int lim = s.valid_cols ? s.valid_cols[b] : s.m;
    if (s.causal && r + 1 < lim) lim = r + 1;
    return lim < 0 ? 0 : (lim > s.m ? s.m : lim);
}

__global__ void __launch_bounds__(kThreads)
    forward_kernel(bf16 *o, bf16 *a, bf16 *a_d, const bf16 *q, const bf16 *k, const bf16 *v,
                   luna_attention_shape s, float p, float pscale, luna_rng_key key) {
    LUNA_DYNAMIC_SHARED(unsigned char, smem);
    const Dims d = dims_of(s.n, s.m, s.dh);
    const Plan pl = plan_of(d, false);
    bf16 *Q = (bf16 *)(smem + pl.q), *K = (bf16 *)(smem + pl.k), *V = (bf16 *)(smem + pl.v);
    bf16 *P = (bf16 *)(smem + pl.pa);
    float *F = (float *)(smem + pl.f);
    const int g = blockIdx.x, b = g / s.H, h = g % s.H;
    const int warp = threadIdx.x / 32, lanes = lanes_of(d.m16), per_warp = 32 / lanes;
    const int c0 = (threadIdx.x % lanes) * 4, sub = threadIdx.x % 32 / lanes;
    stage(Q, d.ldd, q + at(s.sq, b, h), s.ldq, s.n, s.dh, d.n16, d.d16);
    stage(K, d.ldd, k + at(s.sk, b, h), s.ldk, s.m, s.dh, d.m16, d.d16);
    stage(V, d.ldd, v + at(s.sv, b, h), s.ldv, s.m, s.dh, d.m16, d.d16);
    __syncthreads();
    product<true>(F, d.ldf, Q, d.ldd, K, d.ldd, d.n16, d.m16, d.d16, warp);
    __syncthreads();
    /* per_warp rows a warp at a time, 4 consecutive keys a lane (n16 is a multiple of per_warp) */
    for (int r0 = warp * per_warp; r0 < d.n16; r0 += kWarps * per_warp) {
        const int r = r0 + sub;
        int valid = r < s.n ? keys_of(s, b, r) : 0;
        float x[4], mx = -INFINITY;
        for (int e = 0; e < 4; e++) {
            x[e] = c0 + e < valid ? F[r * d.ldf + c0 + e] * s.scale : -INFINITY;
            mx = fmaxf(mx, x[e]);
        }
        mx = row_max(mx, lanes);
        if (mx == -INFINITY) valid = 0; /* no key, or every score −inf: a row of zeros */
        float sum = 0.0f;
        for (int e = 0; e < 4; e++) {
            x[e] = c0 + e < valid ? expf(x[e] - mx) : 0.0f;
            sum += x[e];
        }
        sum = row_sum(sum, lanes);
        const float inv = valid > 0 ? 1.0f / sum : 0.0f;
        const int64_t off = ((int64_t)g * s.n + r) * s.m + c0; /* the element's index in a */
        float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (a_d && r < s.n && c0 < s.m) drop4(key, off, p, pscale, f);
        for (int e = 0; e < 4; e++) {
            const int c = c0 + e;
            const float y = x[e] * inv;
            const bf16 ys = __float2bfloat16(y);
            const bf16 yd = a_d ? __float2bfloat16(__bfloat162float(ys) * f[e]) : ys;
            if (r < s.n && c < s.m) {
                a[off + e] = ys;
                if (a_d) a_d[off + e] = yd;
            }
            if (c < d.m16) P[r * d.ldm + c] = yd;
        }
    }
    __syncthreads();
    product<false>(F, d.ldf, P, d.ldm, V, d.ldd, d.n16, d.d16, d.m16, warp);
    __syncthreads();
    write_rows(o + at(s.so, b, h), s.ldo, F, d.ldf, s.n, s.dh);
}

__global__ void __launch_bounds__(kThreads)
    backward_kernel(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *d_o, const bf16 *q, const bf16 *k,
                    const bf16 *v, const bf16 *a, const bf16 *a_d, luna_attention_shape s, float p,
                    float pscale, luna_rng_key key) {
    LUNA_DYNAMIC_SHARED(unsigned char, smem);
    const Dims d = dims_of(s.n, s.m, s.dh);
    const Plan pl = plan_of(d, true);
    bf16 *Q = (bf16 *)(smem + pl.q), *K = (bf16 *)(smem + pl.k), *V = (bf16 *)(smem + pl.v);
    bf16 *G = (bf16 *)(smem + pl.g), *Pa = (bf16 *)(smem + pl.pa), *Pd = (bf16 *)(smem + pl.pd);
    float *F = (float *)(smem + pl.f);
    const int g = blockIdx.x, b = g / s.H, h = g % s.H;
    const int warp = threadIdx.x / 32, lanes = lanes_of(d.m16), per_warp = 32 / lanes;
    const int c0 = (threadIdx.x % lanes) * 4, sub = threadIdx.x % 32 / lanes;
    const int64_t a0 = (int64_t)g * s.n * s.m;
    /* dO is staged before anything is written: dq may be d_o's buffer */
    stage(Q, d.ldd, q + at(s.sq, b, h), s.ldq, s.n, s.dh, d.n16, d.d16);
    stage(K, d.ldd, k + at(s.sk, b, h), s.ldk, s.m, s.dh, d.m16, d.d16);
    stage(V, d.ldd, v + at(s.sv, b, h), s.ldv, s.m, s.dh, d.m16, d.d16);
    stage(G, d.ldd, d_o + at(s.so, b, h), s.ldo, s.n, s.dh, d.n16, d.d16);
    stage(Pa, d.ldm, a + a0, s.m, s.n, s.m, d.n16, d.m16);
    stage(Pd, d.ldm, a_d ? a_d + a0 : a + a0, s.m, s.n, s.m, d.n16, d.m16);
    __syncthreads();
    product<true>(F, d.ldf, G, d.ldd, V, d.ldd, d.n16, d.m16, d.d16, warp);
    __syncthreads();
    /* dS' = scale · a ⊙ (g − Σ a·g) into a's tile, rows as in the forward (past n: zeros) */
    for (int r0 = warp * per_warp; r0 < d.n16; r0 += kWarps * per_warp) {
        const int r = r0 + sub;
        float gv[4], av[4], f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (a_d && r < s.n && c0 < s.m) drop4(key, a0 + (int64_t)r * s.m + c0, p, pscale, f);
        float dot = 0.0f;
        for (int e = 0; e < 4; e++) {
            const int c = c0 + e;
            const bool in = r < s.n && c < s.m;
            av[e] = in ? __bfloat162float(Pa[r * d.ldm + c]) : 0.0f;
            gv[e] = in ? F[r * d.ldf + c] * f[e] : 0.0f;
            dot += av[e] * gv[e];
        }
        dot = row_sum(dot, lanes);
        for (int e = 0; e < 4; e++)
            if (c0 + e < d.m16)
                Pa[r * d.ldm + c0 + e] = __float2bfloat16(s.scale * (av[e] * (gv[e] - dot)));
    }
    __syncthreads();
    product<false>(F, d.ldf, Pa, d.ldm, K, d.ldd, d.n16, d.d16, d.m16, warp); /* dQ = dS' K */
    __syncthreads();
    write_rows(dq + at(s.sq, b, h), s.ldq, F, d.ldf, s.n, s.dh);
    __syncthreads();
    const bool tied = dk == dv;
    /* dK = dS'ᵀ Q (+ a_dᵀ dO when tied) */
    product_tn(F, d.ldf, Pa, Q, tied ? Pd : nullptr, tied ? G : nullptr, d.ldm, d.ldd, d.m16, d.d16,
               d.n16, warp);
    __syncthreads();
    write_rows(dk + at(s.sk, b, h), s.ldk, F, d.ldf, s.m, s.dh);
    if (tied) return;
    __syncthreads();
    product_tn(F, d.ldf, Pd, G, nullptr, nullptr, d.ldm, d.ldd, d.m16, d.d16, d.n16, warp);
    __syncthreads();
    write_rows(dv + at(s.sv, b, h), s.ldv, F, d.ldf, s.m, s.dh);
}

/* The plan's bytes, or 0 when the shape is outside the kernels' or the device's limits. */
size_t plan_bytes(int n, int m, int dh, bool backward) {
    if (n < 1 || m < 1 || dh < 1 || n > kMaxLen || m > kMaxLen || dh > kMaxLen) return 0;
    const size_t bytes = plan_of(dims_of(n, m, dh), backward).bytes;
    int device = 0, limit = 48 * 1024;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess)
        return 0;
    return bytes <= (size_t)limit ? bytes : 0;
}

cudaError_t allow_shared(const void *kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

} // namespace

extern "C" {

int luna_cuda_attention_fits(int bf16, int n, int m, int dh, int backward) {
    return bf16 && plan_bytes(n, m, dh, backward != 0) > 0;
}

cudaError_t luna_cuda_attention_forward(cudaStream_t st, void *o, void *a, void *a_d, const void *q,
                                        const void *k, const void *v, const luna_attention_shape *s,
                                        float p, luna_rng_key key) {
    if (s->B <= 0 || s->H <= 0) return cudaSuccess;
    const size_t bytes = plan_bytes(s->n, s->m, s->dh, false);
    if (bytes == 0) return cudaErrorInvalidValue;
    const cudaError_t e = allow_shared((const void *)forward_kernel, bytes);
    if (e != cudaSuccess) return e;
    if (!(p > 0.0f)) a_d = NULL;
    LUNA_LAUNCH(forward_kernel, (unsigned)(s->B * s->H), kThreads, bytes, st, (bf16 *)o, (bf16 *)a,
                (bf16 *)a_d, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, *s, p,
                drop_scale(p), key);
    return cudaGetLastError();
}

cudaError_t luna_cuda_attention_backward(cudaStream_t st, void *dq, void *dk, void *dv,
                                         const void *d_o, const void *q, const void *k,
                                         const void *v, const void *a, const void *a_d,
                                         const luna_attention_shape *s, float p, luna_rng_key key) {
    if (s->B <= 0 || s->H <= 0) return cudaSuccess;
    const size_t bytes = plan_bytes(s->n, s->m, s->dh, true);
    if (bytes == 0) return cudaErrorInvalidValue;
    const cudaError_t e = allow_shared((const void *)backward_kernel, bytes);
    if (e != cudaSuccess) return e;
    if (!(p > 0.0f)) a_d = NULL;
    LUNA_LAUNCH(backward_kernel, (unsigned)(s->B * s->H), kThreads, bytes, st, (bf16 *)dq,
                (bf16 *)dk, (bf16 *)dv, (const bf16 *)d_o, (const bf16 *)q, (const bf16 *)k,
                (const bf16 *)v, (const bf16 *)a, (const bf16 *)a_d, *s, p, drop_scale(p), key);
    return cudaGetLastError();
}

} // extern "C"
