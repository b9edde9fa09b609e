/* Elementwise and layout kernels of the CUDA backend (cuda_kernels.h; the CPU references are
 * model/kernels/cpu/elementwise.c and activations.c). One thread per element in grid-stride loops;
 * each element computed from its own inputs, so results never depend on the launch shape.
 *
 * Bit-equality with the CPU in fp32: the CPU is compiled as ISO C (no contraction), so where it
 * computes a·b + c as two roundings these kernels use __fmul_rn / __fadd_rn (nvcc would otherwise
 * fuse them into one FMA). Transcendentals (expf, log1pf) are the CUDA library's: within 2 ulp of
 * the CPU's libm on a GPU (exact under the CPU execution harness, which calls libm). */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/philox.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 256;

/* Activation storage: T = float or __nv_bfloat16, loaded to fp32, stored rounded once. */
template <typename T> __global__ void add_kernel(T *y, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(i, n) store(y, i, __fadd_rn(load(a, i), load(b, i)));
}

template <typename T> __global__ void axpy_kernel(T *y, float alpha, const float *x, int64_t n) {
    GRID_STRIDE(i, n) store(y, i, __fadd_rn(load(y, i), __fmul_rn(alpha, x[i])));
}

template <typename T> __global__ void scale_kernel(T *x, float alpha, int64_t n) {
    GRID_STRIDE(i, n) store(x, i, __fmul_rn(load(x, i), alpha));
}

/* Three byte addresses per grid entry g = o·inner + i (luna_cuda_grid_pointers). */
__global__ void grid_pointers_kernel(const char **out, const char *A, int64_t a_outer,
                                     int64_t a_inner, const char *B, int64_t b_outer,
                                     int64_t b_inner, const char *C, int64_t c_outer,
                                     int64_t c_inner, int64_t G, int inner) {
    GRID_STRIDE(g, G) {
        const int64_t o = g / inner, i = g % inner;
        out[g] = A + o * a_outer + i * a_inner;
        out[G + g] = B + o * b_outer + i * b_inner;
        out[2 * G + g] = C + o * c_outer + i * c_inner;
    }
}

__global__ void convert_to_bf16_kernel(__nv_bfloat16 *y, const float *x, int64_t n) {
    GRID_STRIDE(i, n) store(y, i, x[i]);
}

/* softplus with β = ln 2 and PyTorch's threshold 20 (activations.c). */
constexpr float kBeta = 0.6931471805599453f, kThreshold = 20.0f;
template <typename T> __global__ void softplus_fwd_kernel(T *y, const T *x, int64_t n) {
    GRID_STRIDE(i, n) {
        const float z = load(x, i), bz = __fmul_rn(kBeta, z);
        store(y, i, bz > kThreshold ? z : __fdiv_rn(log1pf(expf(bz)), kBeta));
    }
}
template <typename T>
__global__ void softplus_bwd_kernel(T *dx, const T *dy, const T *x, int64_t n) {
    GRID_STRIDE(i, n) {
        const float bz = __fmul_rn(kBeta, load(x, i));
        float g = 1.0f;
        if (!(bz > kThreshold)) {
            const float e = expf(bz);
            g = __fdiv_rn(e, __fadd_rn(1.0f, e));
        }
        store(dx, i, __fmul_rn(load(dy, i), g));
    }
}

template <typename T> __global__ void elu1_fwd_kernel(T *y, const T *x, int64_t n) {
    GRID_STRIDE(i, n) {
        const float v = load(x, i);
        store(y, i, v > 0.0f ? __fadd_rn(v, 1.0f) : expf(v));
    }
}
template <typename T> __global__ void elu1_bwd_kernel(T *dx, const T *dy, const T *x, int64_t n) {
    GRID_STRIDE(i, n) {
        const float v = load(x, i), g = load(dy, i);
        store(dx, i, v > 0.0f ? g : __fmul_rn(g, expf(v)));
    }
}

/* y = x · (keep ? 1/(1−p) : 0), keep from core/philox.h: the CPU's mask by construction. A
 * thread takes elements 4k .. 4k + 3, whose draws are the four words of Philox block k
 * (luna_rng_bits' mapping): one block per four elements, where a block per element computed each
 * block four times over. */
template <typename T>
__global__ void dropout_kernel(T *y, const T *x, int64_t n, float p, float scale,
                               luna_rng_key key) {
    GRID_STRIDE(k, (n + 3) / 4) {
        uint32_t w[4];
        luna_rng_block(key, (uint64_t)k, w);
        LUNA_UNROLL for (int e = 0; e < 4; e++) {
            const int64_t i = 4 * k + e;
            if (i >= n) break;
            const float u = luna_rng_word_uniform(w[e]);
            store(y, i, __fmul_rn(load(x, i), u >= p ? scale : 0.0f));
        }
    }
}

/* out[b, h, t, :] = x[b, t, h, :] (split) or the inverse (merge); one thread per element. The
 * index arithmetic is in I: 32-bit unsigned when the tensor has < 2^31 elements — 64-bit
 * division is a long software sequence on a GPU, and five of them per element make these copies
 * several times slower than their bytes allow (measured: docs/benchmarks.md). */
template <typename T, typename I>
__global__ void heads_kernel(T *out, const T *x, I B, I n, I H, I dh, int split) {
    const I total = B * n * H * dh;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (I)gridDim.x * blockDim.x) {
        const I e = i % dh, r = i / dh; /* r indexes the (b, ·, ·) rows of the output */
        I b, h, t;
        if (split) { /* out [B, H, n, dh] */
            t = r % n, h = (r / n) % H, b = r / (n * H);
            out[i] = x[(((b * n + t) * H + h) * dh) + e];
        } else { /* out [B, n, H, dh] */
            h = r % H, t = (r / H) % n, b = r / (H * n);
            out[i] = x[(((b * H + h) * n + t) * dh) + e];
        }
    }
}

template <typename T> __global__ void broadcast_kernel(T *out, const T *x, int B, int64_t m) {
    GRID_STRIDE(i, (int64_t)B * m) out[i] = x[i % m];
}

template <typename T>
__global__ void gather_kernel(T *dst, int64_t dst_stride, const T *src, int64_t src_stride,
                              const int32_t *idx, int64_t n, int64_t cols) {
    GRID_STRIDE(i, n * cols) {
        const int64_t r = i / cols, c = i % cols;
        const int64_t from = idx ? idx[r] : r;
        dst[r * dst_stride + c] = src[from * src_stride + c];
    }
}

/* gather_rows_in_groups: a block per (group, chunk of kGroupChunk columns): the group's source
 * rows' chunk into shared memory, then back to its rows. Blocks touch disjoint columns of their
 * group, so the reorder is safe in place. */
constexpr int kGroupChunk = 256;
template <typename T>
__global__ void gather_groups_kernel(T *buf, int64_t stride, const int32_t *idx, int group,
                                     int64_t cols) {
    LUNA_DYNAMIC_SHARED(T, tile); /* [group, kGroupChunk] */
    const int64_t g = blockIdx.x, c0 = (int64_t)blockIdx.y * kGroupChunk;
    const int w = cols - c0 < kGroupChunk ? (int)(cols - c0) : kGroupChunk;
    for (int e = threadIdx.x; e < group * w; e += blockDim.x) {
        const int i = e / w, c = e % w;
        tile[i * kGroupChunk + c] = buf[(int64_t)idx[g * group + i] * stride + c0 + c];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < group * w; e += blockDim.x) {
        const int i = e / w, c = e % w;
        buf[(g * group + i) * stride + c0 + c] = tile[i * kGroupChunk + c];
    }
}

/* A block per row: the row's gather (unless in place), then its set, after the block's copy. */
__global__ void index_rows_kernel(int32_t *dst, const int32_t *src, const int32_t *idx,
                                  int64_t cols, int64_t stride, const int32_t *set_col,
                                  const int32_t *set_val) {
    const int64_t i = blockIdx.x;
    if (cols > 0 && (dst != src || idx)) {
        const int32_t *from = src + (idx ? idx[i] : i) * stride;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            dst[i * stride + c] = from[c];
    }
    __syncthreads();
    if (threadIdx.x == 0 && set_col) dst[i * stride + set_col[i]] = set_val[i];
}

/* C_b[i, j] = beta · C_b[i, j] (beta = 0 writes zeros: C not read) for a strided batch. */
template <typename T>
__global__ void scale_matrix_kernel(T *c, int M, int N, int ldc, int64_t stride, int batch,
                                    float beta) {
    const int64_t mn = (int64_t)M * N;
    GRID_STRIDE(i, mn * batch) {
        const int64_t b = i / mn, r = (i % mn) / N, col = i % N;
        const int64_t at = b * stride + r * ldc + col;
        store(c, at, beta == 0.0f ? 0.0f : __fmul_rn(beta, load(c, at)));
    }
}

/* dx[i] += Σ_b dout[b, i] in b order, in fp32 (sum_broadcast), one thread per element. */
template <typename T>
__global__ void sum_broadcast_kernel(float *dx, const T *dout, int B, int64_t m) {
    GRID_STRIDE(i, m) {
        float acc = dx[i];
        for (int b = 0; b < B; b++)
            acc = __fadd_rn(acc, load(dout, (int64_t)b * m + i));
        dx[i] = acc;
    }
}

/* y[r, c] += b[c] (linear_forward's bias when in = 0). */
template <typename T>
__global__ void bias_add_kernel(T *y, const float *b, int64_t rows, int cols) {
    GRID_STRIDE(i, rows * cols) store(y, i, __fadd_rn(load(y, i), b[i % cols]));
}

/* linear_backward's bias gradient: column_sum of column_sum.cuh. */
#include "model/kernels/cuda/column_sum.cuh"

typedef __nv_bfloat16 bf16_t;

/* heads_kernel on E units (a copy: the element type does not matter), 32-bit index arithmetic
 * when the tensor has < 2^31 of them. */
template <typename E>
cudaError_t heads_launch(cudaStream_t s, void *out, const void *x, int64_t B, int64_t n, int64_t H,
                         int64_t dh, int split) {
    const int64_t total = B * n * H * dh;
    if (total < ((int64_t)1 << 31)) {
        typedef uint32_t I;
        LUNA_LAUNCH((heads_kernel<E, I>), grid_blocks(total, kThreads), kThreads, 0, s,
                    static_cast<E *>(out), static_cast<const E *>(x), (I)B, (I)n, (I)H, (I)dh,
                    split);
    } else {
        typedef int64_t I;
        LUNA_LAUNCH((heads_kernel<E, I>), grid_blocks(total, kThreads), kThreads, 0, s,
                    static_cast<E *>(out), static_cast<const E *>(x), (I)B, (I)n, (I)H, (I)dh,
                    split);
    }
    return cudaGetLastError();
}

} // namespace

#define A(T, p) static_cast<T *>(p)
#define CA(T, p) static_cast<const T *>(p)

extern "C" {

unsigned long long luna_cuda_kernel_launches(void) { return luna_cuda_launch_counter().load(); }

cudaError_t luna_cuda_add(cudaStream_t s, int bf16, void *y, const void *a, const void *b,
                          int64_t n) {
    if (n <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(add_kernel<bf16_t>, grid_blocks(n, kThreads), kThreads, 0, s, A(bf16_t, y),
                    CA(bf16_t, a), CA(bf16_t, b), n);
    else
        LUNA_LAUNCH(add_kernel<float>, grid_blocks(n, kThreads), kThreads, 0, s, A(float, y),
                    CA(float, a), CA(float, b), n);
    return cudaGetLastError();
}

cudaError_t luna_cuda_axpy(cudaStream_t s, int bf16, void *y, float alpha, const float *x,
                           int64_t n) {
    if (n <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(axpy_kernel<bf16_t>, grid_blocks(n, kThreads), kThreads, 0, s, A(bf16_t, y),
                    alpha, x, n);
    else
        LUNA_LAUNCH(axpy_kernel<float>, grid_blocks(n, kThreads), kThreads, 0, s, A(float, y),
                    alpha, x, n);
    return cudaGetLastError();
}

cudaError_t luna_cuda_scale_act(cudaStream_t s, int bf16, void *x, float alpha, int64_t n) {
    if (n <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(scale_kernel<bf16_t>, grid_blocks(n, kThreads), kThreads, 0, s, A(bf16_t, x),
                    alpha, n);
    else
        LUNA_LAUNCH(scale_kernel<float>, grid_blocks(n, kThreads), kThreads, 0, s, A(float, x),
                    alpha, n);
    return cudaGetLastError();
}

cudaError_t luna_cuda_convert_to_bf16(cudaStream_t s, void *dst, const float *src, int64_t n) {
    if (n <= 0) return cudaSuccess;
    LUNA_LAUNCH(convert_to_bf16_kernel, grid_blocks(n, kThreads), kThreads, 0, s,
                static_cast<__nv_bfloat16 *>(dst), src, n);
    return cudaGetLastError();
}

#define UNARY(name, kernel)                                                                        \
    cudaError_t name(cudaStream_t s, int bf16, void *y, const void *x, int64_t n) {                \
        if (n <= 0) return cudaSuccess;                                                            \
        if (bf16)                                                                                  \
            LUNA_LAUNCH(kernel<bf16_t>, grid_blocks(n, kThreads), kThreads, 0, s, A(bf16_t, y),    \
                        CA(bf16_t, x), n);                                                         \
        else                                                                                       \
            LUNA_LAUNCH(kernel<float>, grid_blocks(n, kThreads), kThreads, 0, s, A(float, y),      \
                        CA(float, x), n);                                                          \
        return cudaGetLastError();                                                                 \
    }
#define BACKWARD(name, kernel)                                                                     \
    cudaError_t name(cudaStream_t s, int bf16, void *dx, const void *dy, const void *x,            \
                     int64_t n) {                                                                  \
        if (n <= 0) return cudaSuccess;                                                            \
        if (bf16)                                                                                  \
            LUNA_LAUNCH(kernel<bf16_t>, grid_blocks(n, kThreads), kThreads, 0, s, A(bf16_t, dx),   \
                        CA(bf16_t, dy), CA(bf16_t, x), n);                                         \
        else                                                                                       \
            LUNA_LAUNCH(kernel<float>, grid_blocks(n, kThreads), kThreads, 0, s, A(float, dx),     \
                        CA(float, dy), CA(float, x), n);                                           \
        return cudaGetLastError();                                                                 \
    }

UNARY(luna_cuda_softplus_ln2_forward, softplus_fwd_kernel)
BACKWARD(luna_cuda_softplus_ln2_backward, softplus_bwd_kernel)
UNARY(luna_cuda_elu_plus_one_forward, elu1_fwd_kernel)
BACKWARD(luna_cuda_elu_plus_one_backward, elu1_bwd_kernel)

cudaError_t luna_cuda_dropout(cudaStream_t s, int bf16, void *y, const void *x, int64_t n, float p,
                              luna_rng_key key) {
    if (n <= 0) return cudaSuccess;
    const float scale = 1.0f / (1.0f - p); /* host-side, as the CPU computes it */
    if (bf16)
        LUNA_LAUNCH(dropout_kernel<bf16_t>, grid_blocks((n + 3) / 4, kThreads), kThreads, 0, s,
                    A(bf16_t, y), CA(bf16_t, x), n, p, scale, key);
    else
        LUNA_LAUNCH(dropout_kernel<float>, grid_blocks((n + 3) / 4, kThreads), kThreads, 0, s,
                    A(float, y), CA(float, x), n, p, scale, key);
    return cudaGetLastError();
}

cudaError_t luna_cuda_heads_permute(cudaStream_t s, int bf16, void *out, const void *x, int B,
                                    int n, int H, int dh, int split) {
    if ((int64_t)B * n * H * dh <= 0) return cudaSuccess;
    /* A head's dh values are contiguous on both sides: copy them in the widest unit that divides
     * the row and both addresses (16-byte vectors for bf16 d_h = 64: 8x fewer elements). */
    const int64_t row_bytes = (int64_t)dh * (bf16 ? 2 : 4);
    const uintptr_t al = (uintptr_t)out | (uintptr_t)x | (uintptr_t)row_bytes;
    if (al % 16 == 0) return heads_launch<uint4>(s, out, x, B, n, H, row_bytes / 16, split);
    if (al % 8 == 0) return heads_launch<uint2>(s, out, x, B, n, H, row_bytes / 8, split);
    if (al % 4 == 0) return heads_launch<uint32_t>(s, out, x, B, n, H, row_bytes / 4, split);
    return heads_launch<uint16_t>(s, out, x, B, n, H, row_bytes / 2, split);
}

cudaError_t luna_cuda_grid_pointers(cudaStream_t s, void **out, const void *A, int64_t a_outer,
                                    int64_t a_inner, const void *B, int64_t b_outer,
                                    int64_t b_inner, const void *C, int64_t c_outer,
                                    int64_t c_inner, int outer, int inner) {
    const int64_t G = (int64_t)outer * inner;
    if (G <= 0) return cudaSuccess;
    LUNA_LAUNCH(grid_pointers_kernel, grid_blocks(G, kThreads), kThreads, 0, s, (const char **)out,
                (const char *)A, a_outer, a_inner, (const char *)B, b_outer, b_inner,
                (const char *)C, c_outer, c_inner, G, inner);
    return cudaGetLastError();
}

cudaError_t luna_cuda_broadcast_rows(cudaStream_t s, int bf16, void *out, const void *x, int B,
                                     int64_t rows, int d) {
    const int64_t m = rows * d, total = (int64_t)B * m;
    if (total <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(broadcast_kernel<bf16_t>, grid_blocks(total, kThreads), kThreads, 0, s,
                    A(bf16_t, out), CA(bf16_t, x), B, m);
    else
        LUNA_LAUNCH(broadcast_kernel<float>, grid_blocks(total, kThreads), kThreads, 0, s,
                    A(float, out), CA(float, x), B, m);
    return cudaGetLastError();
}

cudaError_t luna_cuda_gather_rows(cudaStream_t s, int bf16, void *dst, int64_t dst_stride,
                                  const void *src, int64_t src_stride, const int32_t *idx,
                                  int64_t n, int64_t cols) {
    const int64_t total = n * cols;
    if (total <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(gather_kernel<bf16_t>, grid_blocks(total, kThreads), kThreads, 0, s,
                    A(bf16_t, dst), dst_stride, CA(bf16_t, src), src_stride, idx, n, cols);
    else
        LUNA_LAUNCH(gather_kernel<float>, grid_blocks(total, kThreads), kThreads, 0, s,
                    A(float, dst), dst_stride, CA(float, src), src_stride, idx, n, cols);
    return cudaGetLastError();
}

cudaError_t luna_cuda_gather_rows_in_groups(cudaStream_t s, int bf16, void *buf, int64_t stride,
                                            const int32_t *idx, int64_t n_groups, int group,
                                            int64_t cols) {
    if (n_groups <= 0 || cols <= 0) return cudaSuccess;
    const dim3 grid((unsigned)n_groups, (unsigned)((cols + kGroupChunk - 1) / kGroupChunk));
    if (bf16)
        LUNA_LAUNCH(gather_groups_kernel<bf16_t>, grid, 256,
                    (size_t)group * kGroupChunk * sizeof(bf16_t), s, A(bf16_t, buf), stride, idx,
                    group, cols);
    else
        LUNA_LAUNCH(gather_groups_kernel<float>, grid, 256,
                    (size_t)group * kGroupChunk * sizeof(float), s, A(float, buf), stride, idx,
                    group, cols);
    return cudaGetLastError();
}

cudaError_t luna_cuda_index_rows_update(cudaStream_t s, int32_t *dst, const int32_t *src,
                                        const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                        const int32_t *set_col, const int32_t *set_val) {
    if (n <= 0 || (!set_col && (cols == 0 || (dst == src && !idx)))) return cudaSuccess;
    LUNA_LAUNCH(index_rows_kernel, (unsigned)n, 128, 0, s, dst, src, idx, cols, stride, set_col,
                set_val);
    return cudaGetLastError();
}

cudaError_t luna_cuda_sum_broadcast(cudaStream_t s, int bf16, float *dx, const void *dout, int B,
                                    int64_t rows, int d) {
    const int64_t m = rows * d;
    if (m <= 0 || B <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(sum_broadcast_kernel<bf16_t>, grid_blocks(m, kThreads), kThreads, 0, s, dx,
                    CA(bf16_t, dout), B, m);
    else
        LUNA_LAUNCH(sum_broadcast_kernel<float>, grid_blocks(m, kThreads), kThreads, 0, s, dx,
                    CA(float, dout), B, m);
    return cudaGetLastError();
}

cudaError_t luna_cuda_bias_add_forward(cudaStream_t s, int bf16, void *y, const float *b,
                                       int64_t rows, int cols) {
    const int64_t n = rows * cols;
    if (n <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(bias_add_kernel<bf16_t>, grid_blocks(n, kThreads), kThreads, 0, s, A(bf16_t, y),
                    b, rows, cols);
    else
        LUNA_LAUNCH(bias_add_kernel<float>, grid_blocks(n, kThreads), kThreads, 0, s, A(float, y),
                    b, rows, cols);
    return cudaGetLastError();
}

cudaError_t luna_cuda_bias_add_backward(cudaStream_t s, int bf16, float *db, const void *dy,
                                        int64_t rows, int cols, luna_cuda_colsum_ws ws) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    return bf16 ? column_sum<bf16_t>(s, db, CA(bf16_t, dy), rows, cols, ws)
                : column_sum<float>(s, db, CA(float, dy), rows, cols, ws);
}

cudaError_t luna_cuda_scale_matrix(cudaStream_t s, int bf16, void *c, int M, int N, int ldc,
                                   int64_t stride, int batch, float beta) {
    const int64_t total = (int64_t)M * N * batch;
    if (total <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(scale_matrix_kernel<bf16_t>, grid_blocks(total, kThreads), kThreads, 0, s,
                    A(bf16_t, c), M, N, ldc, stride, batch, beta);
    else
        LUNA_LAUNCH(scale_matrix_kernel<float>, grid_blocks(total, kThreads), kThreads, 0, s,
                    A(float, c), M, N, ldc, stride, batch, beta);
    return cudaGetLastError();
}

} // extern "C"
