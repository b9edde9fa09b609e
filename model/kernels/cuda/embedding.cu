/* Token embeddings and sinusoidal positions (core/backend.h; CPU reference
 * model/kernels/cpu/embedding.c, which these follow operation by operation).
 *
 * embedding_forward: one thread per output element, out = scale·table[token] (zeros for the
 *   padding token). A token outside [0, V) reads nothing: its row becomes NaN and *bad is set
 *   to 1 (the backend reports it at its next synchronisation; the CPU reports it at once).
 * embedding_backward: dtable[tok, c] += scale·dout[i, c] in token order for each (tok, c) — the
 *   CPU's order, so bit-identical and deterministic without atomics. Each (tok, c) has one owner
 *   thread: column c in the block row of bucket tok mod kEmbBuckets, which walks every token (a
 *   tile of them at a time through shared memory) and adds the rows of its bucket's tokens.
 *   (One thread per column walking all the tokens would give d = 512 two blocks: a GPU idle;
 *   measured: docs/benchmarks.md.)
 * sinusoidal_table / positions_add: angles pos·f_i and sin/cos in double, rounded once, as the
 *   CPU; positions_add tabulates the n positions a batch can hold (padding_idx + 1 .. + n, into
 *   `table` [n·d] scratch: n·d double sines, not B·n·d), counts each sentence's real tokens (one
 *   thread per sentence, into `counts` [B·n] scratch), then adds table row count − 1, i.e.
 *   PE(padding_idx + count), to each non-pad row. */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void emb_fwd_kernel(T *out, const float *table, const int32_t *tokens, int64_t n, int V,
                               int d, float scale, int padding_idx, int *bad) {
    GRID_STRIDE(e, n * d) {
        const int64_t i = e / d, c = e % d;
        const int tok = tokens[i];
        float v;
        if (tok < 0 || tok >= V) {
            v = __int_as_float(0x7fc00000); /* NaN: visible, and no out-of-bounds read */
            if (bad) *bad = 1;
        } else {
            v = tok == padding_idx ? 0.0f : __fmul_rn(scale, table[(int64_t)tok * d + c]);
        }
        store(out, e, v);
    }
}

constexpr int kEmbBuckets = 64, kEmbTile = 1024;

template <typename T>
__global__ void emb_bwd_kernel(float *dtable, const T *dout, const int32_t *tokens, int64_t n,
                               int V, int d, float scale, int padding_idx) {
    LUNA_SHARED(int32_t, tile, kEmbTile);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int bucket = (int)blockIdx.y;
    for (int64_t i0 = 0; i0 < n; i0 += kEmbTile) {
        const int m = n - i0 < kEmbTile ? (int)(n - i0) : kEmbTile;
        for (int j = threadIdx.x; j < m; j += blockDim.x)
            tile[j] = tokens[i0 + j];
        __syncthreads();
        if (c < d)
            for (int j = 0; j < m; j++) {
                const int tok = tile[j];
                if (tok == padding_idx || tok < 0 || tok >= V || tok % kEmbBuckets != bucket)
                    continue;
                float *row = dtable + (int64_t)tok * d + c;
                *row = __fadd_rn(*row, __fmul_rn(scale, load(dout, (i0 + j) * d + c)));
            }
        __syncthreads(); /* the tile is reloaded */
    }
}

/* f_i = exp(−i·ln(10000)/(half − 1)) in double (half = 1: f_0 = 1), as the CPU. */
__device__ inline double frequency(int i, int half) {
    const double c = half > 1 ? log(10000.0) / (double)(half - 1) : 0.0;
    return exp((double)i * -c);
}

/* PE(pos)[col] for a row of width d. */
__device__ inline float pe(double pos, int col, int d) {
    const int half = d / 2;
    if (col >= 2 * half) return 0.0f; /* d odd: the last feature */
    const int i = col < half ? col : col - half;
    const double a = __dmul_rn(pos, frequency(i, half));
    return (float)(col < half ? sin(a) : cos(a));
}

template <typename T> __global__ void sin_table_kernel(T *out, int first_pos, int npos, int d) {
    GRID_STRIDE(e, (int64_t)npos * d) {
        const int64_t j = e / d;
        store(out, e, pe((double)first_pos + (double)j, (int)(e % d), d));
    }
}

__global__ void count_kernel(int32_t *counts, const int32_t *tokens, int B, int n,
                             int padding_idx) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    int32_t k = 0;
    for (int t = 0; t < n; t++) {
        const int64_t i = (int64_t)b * n + t;
        counts[i] = tokens[i] == padding_idx ? 0 : ++k;
    }
}

template <typename T>
__global__ void positions_add_kernel(T *x, const int32_t *counts, const float *table, int64_t rows,
                                     int d) {
    GRID_STRIDE(e, rows * d) {
        const int32_t k = counts[e / d];
        if (k == 0) continue;
        store(x, e, __fadd_rn(load(x, e), table[(int64_t)(k - 1) * d + e % d]));
    }
}

#include "model/kernels/cuda/embedding_index.cuh"

typedef __nv_bfloat16 bf16_t;

} // namespace

extern "C" {

cudaError_t luna_cuda_embedding_forward(cudaStream_t s, int bf16, void *out, const float *table,
                                        const int32_t *tokens, int64_t n, int V, int d, float scale,
                                        int padding_idx, int *bad) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    if (bf16)
        LUNA_LAUNCH(emb_fwd_kernel<bf16_t>, grid_blocks(n * d, kThreads), kThreads, 0, s,
                    static_cast<bf16_t *>(out), table, tokens, n, V, d, scale, padding_idx, bad);
    else
        LUNA_LAUNCH(emb_fwd_kernel<float>, grid_blocks(n * d, kThreads), kThreads, 0, s,
                    static_cast<float *>(out), table, tokens, n, V, d, scale, padding_idx, bad);
    return cudaGetLastError();
}

int64_t luna_cuda_embedding_backward_scratch(int64_t n, int V) {
    return n > 0 && V > 0 ? index_words(n, V) * (int64_t)sizeof(int32_t) : 0;
}

cudaError_t luna_cuda_embedding_backward(cudaStream_t s, int bf16, float *dtable, const void *dout,
                                         const int32_t *tokens, int64_t n, int V, int d,
                                         float scale, int padding_idx, void *scratch) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    if (scratch && n <= INT32_MAX) {
        if (bf16)
            return indexed_backward(s, dtable, static_cast<const bf16_t *>(dout), tokens, n, V, d,
                                    scale, padding_idx, static_cast<int32_t *>(scratch));
        return indexed_backward(s, dtable, static_cast<const float *>(dout), tokens, n, V, d, scale,
                                padding_idx, static_cast<int32_t *>(scratch));
    }
    const dim3 blocks((unsigned)((d + kThreads - 1) / kThreads), kEmbBuckets);
    if (bf16)
        LUNA_LAUNCH(emb_bwd_kernel<bf16_t>, blocks, kThreads, 0, s, dtable,
                    static_cast<const bf16_t *>(dout), tokens, n, V, d, scale, padding_idx);
    else
        LUNA_LAUNCH(emb_bwd_kernel<float>, blocks, kThreads, 0, s, dtable,
                    static_cast<const float *>(dout), tokens, n, V, d, scale, padding_idx);
    return cudaGetLastError();
}

cudaError_t luna_cuda_sinusoidal_table(cudaStream_t s, int bf16, void *out, int first_pos, int npos,
                                       int d) {
    if (npos <= 0 || d <= 0) return cudaSuccess;
    const int64_t total = (int64_t)npos * d;
    if (bf16)
        LUNA_LAUNCH(sin_table_kernel<bf16_t>, grid_blocks(total, kThreads), kThreads, 0, s,
                    static_cast<bf16_t *>(out), first_pos, npos, d);
    else
        LUNA_LAUNCH(sin_table_kernel<float>, grid_blocks(total, kThreads), kThreads, 0, s,
                    static_cast<float *>(out), first_pos, npos, d);
    return cudaGetLastError();
}

cudaError_t luna_cuda_positions_add(cudaStream_t s, int bf16, void *x, const int32_t *tokens, int B,
                                    int n, int d, int padding_idx, int32_t *counts, float *table) {
    if (B <= 0 || n <= 0 || d <= 0) return cudaSuccess;
    LUNA_LAUNCH(sin_table_kernel<float>, grid_blocks((int64_t)n * d, kThreads), kThreads, 0, s,
                table, padding_idx + 1, n, d);
    LUNA_LAUNCH(count_kernel, (unsigned)((B + kThreads - 1) / kThreads), kThreads, 0, s, counts,
                tokens, B, n, padding_idx);
    const int64_t rows = (int64_t)B * n;
    if (bf16)
        LUNA_LAUNCH(positions_add_kernel<bf16_t>, grid_blocks(rows * d, kThreads), kThreads, 0, s,
                    static_cast<bf16_t *>(x), counts, table, rows, d);
    else
        LUNA_LAUNCH(positions_add_kernel<float>, grid_blocks(rows * d, kThreads), kThreads, 0, s,
                    static_cast<float *>(x), counts, table, rows, d);
    return cudaGetLastError();
}

} // extern "C"

namespace {
__global__ void find_bad_id_kernel(const int32_t *ids, int64_t n, int V, int exempt, int has_exempt,
                                   int *first_bad) {
    GRID_STRIDE(i, n) {
        const int32_t t = ids[i];
        if ((t < 0 || t >= V) && !(has_exempt && t == exempt)) atomicMin(first_bad, (int)i);
    }
}
} // namespace

cudaError_t luna_cuda_find_bad_id_launch(cudaStream_t s, const int32_t *ids, int64_t n, int V,
                                         int exempt, int has_exempt, int *first_bad) {
    if (n <= 0) return cudaSuccess;
    const int64_t blocks = (n + 255) / 256;
    LUNA_LAUNCH(find_bad_id_kernel, (unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, s, ids, n, V,
                exempt, has_exempt, first_bad);
    return cudaGetLastError();
}
