/* luna-cuda-emu: the warp matrix functions (nvcuda::wmma, CUDA's <mma.h>) for kernels compiled
 * with g++ against the harness. Included by luna_cuda_emu.h.
 *
 * On a GPU a fragment's elements are spread over the 32 lanes of a warp in an unspecified
 * mapping. Here every lane holds the whole tile (row-major, `x[rows * cols]`) and does the whole
 * operation itself, so the results are the ones the warp computes together: a kernel may use
 * load/store/fill/mma and element-wise operations applied alike to every element of x[]; code
 * that depends on which element a lane holds has no meaning on the GPU and is not supported.
 * Each operation starts with a warp rendezvous (__syncwarp), so a call that not every lane of the
 * warp reaches is reported as on the GPU. mma_sync forms each product exactly (bf16 x bf16 and
 * fp16 x fp16 fit in float) and adds in fp32 in index order: tensor cores add in an order (and
 * with internal precision) of their own, so compare results within the ACCUM tier.
 * Supported shapes: m16n16k16 with __nv_bfloat16 or __half inputs and float accumulators. */
#ifndef LUNA_CUDA_EMU_WMMA_H
#define LUNA_CUDA_EMU_WMMA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K> struct shape;
template <int M, int N, int K> struct shape<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct shape<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct shape<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};
inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_float(__half v) { return __half2float(v); }
} // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the harness emulates m16n16k16 only");
    static constexpr int rows = detail::shape<Use, M, N, K>::rows;
    static constexpr int cols = detail::shape<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    T x[rows * cols]; /* the whole tile, row-major (see the file comment) */
};

template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, T v) {
    for (int i = 0; i < f.num_elements; i++)
        f.x[i] = v;
}

/* matrix_a / matrix_b: the layout is the fragment's; ldm in elements. */
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm) {
    static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value,
                  "matrix_a/matrix_b fragments name their layout");
    ::__syncwarp();
    constexpr int R = fragment<Use, M, N, K, T, L>::rows, C = fragment<Use, M, N, K, T, L>::cols;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            f.x[r * C + c] = std::is_same<L, row_major>::value ? p[(size_t)r * ldm + c]
                                                               : p[(size_t)c * ldm + r];
}

/* accumulators: the layout is given at the call */
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p,
                             unsigned ldm, layout_t layout) {
    ::__syncwarp();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            f.x[r * N + c] = layout == mem_row_major ? p[(size_t)r * ldm + c]
                                                     : p[(size_t)c * ldm + r];
}

template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
                              unsigned ldm, layout_t layout) {
    ::__syncwarp();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) =
                f.x[r * N + c];
}

/* d = a·b + c (d may be c) */
template <int M, int N, int K, class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                     const fragment<matrix_a, M, N, K, T, LA> &a,
                     const fragment<matrix_b, M, N, K, T, LB> &b,
                     const fragment<accumulator, M, N, K, float> &c) {
    ::__syncwarp();
    float out[M * N];
    for (int r = 0; r < M; r++)
        for (int col = 0; col < N; col++) {
            float acc = c.x[r * N + col];
            for (int k = 0; k < K; k++)
                acc += detail::to_float(a.x[r * K + k]) * detail::to_float(b.x[k * N + col]);
            out[r * N + col] = acc;
        }
    for (int i = 0; i < M * N; i++)
        d.x[i] = out[i];
}

} // namespace wmma
} // namespace nvcuda

#endif
