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
