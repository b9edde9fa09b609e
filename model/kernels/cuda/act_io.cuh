/* Activation storage for the CUDA kernels (included after cuda_compat.h): an activation is
 * float or __nv_bfloat16; kernels load it to fp32 and store once, rounding to nearest even. */
#ifndef LUNA_KERNELS_CUDA_ACT_IO_CUH
#define LUNA_KERNELS_CUDA_ACT_IO_CUH

__device__ inline float load(const float *p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float *p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16 *p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

/* 8 consecutive activations (or fp32 parameters) as one or two 16-byte words, for kernels whose
 * rows start on 16 bytes: bf16 rows of a multiple of 8 elements, fp32 rows of a multiple of 4. */
template <typename T> struct Vec8Of;
template <> struct Vec8Of<float> {
    static constexpr int kAlign = 4; /* elements: rows of a multiple of 4 floats start on 16 bytes */
    __device__ static void load(float *v, const float *p) {
        const float4 a = reinterpret_cast<const float4 *>(p)[0];
        const float4 b = reinterpret_cast<const float4 *>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    }
    __device__ static void store(float *p, const float *v) {
        reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
};
template <> struct Vec8Of<__nv_bfloat16> {
    static constexpr int kAlign = 8;
    union Word {
        uint4 u;
        __nv_bfloat16 h[8];
    };
    __device__ static void load(float *v, const __nv_bfloat16 *p) {
        Word w;
        w.u = *reinterpret_cast<const uint4 *>(p);
        for (int e = 0; e < 8; e++)
            v[e] = __bfloat162float(w.h[e]);
    }
    __device__ static void store(__nv_bfloat16 *p, const float *v) {
        Word w;
        for (int e = 0; e < 8; e++)
            w.h[e] = __float2bfloat16(v[e]);
        *reinterpret_cast<uint4 *>(p) = w.u;
    }
};

/* The value rounded as T stores it. */
__device__ inline float as_stored(float v, const float *) { return v; }
__device__ inline float as_stored(float v, const __nv_bfloat16 *) {
    return __bfloat162float(__float2bfloat16(v));
}

/* One thread per index in a grid-stride loop. */
#define GRID_STRIDE(i, n)                                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* Blocks of `threads` for n elements in a grid-stride loop: enough to fill a GPU, never more than
 * needed (a grid-stride loop's result does not depend on the grid). */
constexpr int64_t kGridMaxBlocks = 4096;
inline unsigned grid_blocks(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < kGridMaxBlocks ? (b > 0 ? b : 1) : kGridMaxBlocks);
}

#endif
