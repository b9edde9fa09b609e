// Kernels of the harness's own tests: written the way the CUDA backend's kernels are (include
// cuda_compat.h, LUNA_LAUNCH, LUNA_SHARED*, explicit warp masks), so this file is also the
// sample that CMake compiles with nvcc -arch=sm_90a under -DLUNA_CUDA=ON.
#include "model/kernels/cuda/cuda_compat.h"

#include "tests/cuda_emu/selftest_kernels.h"

namespace {

const unsigned k_full = 0xffffffffu;

__global__ void block_sum_kernel(float *out, const float *x, int n, int missing_barrier) {
    LUNA_SHARED(float, s, 256);
    const int t = threadIdx.x, i = blockIdx.x * 256 + t;
    s[t] = i < n ? x[i] : 0.0f;
    if (!missing_barrier) __syncthreads();
    for (int stride = 128; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

__global__ void block_sum_dynamic_kernel(float *out, const float *x, int n) {
    LUNA_DYNAMIC_SHARED(float, s);
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

__global__ void warp_sum_kernel(float *out, unsigned *ballot, float *prefix, const float *x,
                                int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    if (i >= n) return; // n is a multiple of 32: whole warps leave
    float v = x[i], p = v;
    unsigned b = __ballot_sync(k_full, v > 0.0f);
    for (int d = 1; d < 32; d *= 2) {
        float up = __shfl_up_sync(k_full, p, d);
        if (lane >= d) p += up;
    }
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(k_full, v, m);
    prefix[i] = p;
    if (lane == 0) out[i / 32] = v, ballot[i / 32] = b;
}

__global__ void shuffle_exited_kernel(float *out, int live) {
    if ((int)threadIdx.x >= live) return;
    float v = __shfl_xor_sync(k_full, (float)threadIdx.x, 1);
    out[threadIdx.x] = v;
}

__global__ void partial_syncthreads_kernel(float *out, int live) {
    if ((int)threadIdx.x >= live) return;
    out[threadIdx.x] = 1.0f;
    __syncthreads();
}

__global__ void bf16_kernel(float *y, float *s, const float *x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __nv_bfloat16 b = __float2bfloat16(x[i]);
    y[i] = __bfloat162float(b);
    s[i] = __bfloat162float(b + b);
}

__global__ void transpose_kernel(float *out, const float *in, int rows, int cols) {
    LUNA_SHARED_2D(float, tile, 32, 33);
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int r = threadIdx.y; r < 32; r += blockDim.y)
        if (r0 + r < rows && c0 + (int)threadIdx.x < cols)
            tile[r][threadIdx.x] = in[(size_t)(r0 + r) * cols + c0 + threadIdx.x];
    __syncthreads();
    for (int c = threadIdx.y; c < 32; c += blockDim.y)
        if (c0 + c < cols && r0 + (int)threadIdx.x < rows)
            out[(size_t)(c0 + c) * rows + r0 + threadIdx.x] = tile[threadIdx.x][c];
}

template <int K> __global__ void scale_kernel(float *y, const float *x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * K;
}

__global__ void read_past_end_kernel(float *out, const float *x, int n) {
    if (threadIdx.x == 0) out[0] = x[n];
}

__global__ void barrier_block_kernel(float *out) {
    LUNA_SHARED(float, s, 256);
    const int t = threadIdx.x;
    s[t] = (float)t;
    __syncthreads();
    float v = s[255 - t];
    __syncthreads();
    s[t] = v + 1.0f;
    __syncthreads();
    v = s[(t + 1) % 256];
    __syncthreads();
    if (t == 0) out[0] = v + s[0];
}

// The example of README.md: warp sums by shuffles, then across warps through shared memory.
__global__ void row_sum_kernel(float *out, const float *x, int d) {
    LUNA_SHARED(float, partial, 8);
    const int t = threadIdx.x;
    float v = 0.0f;
    for (int i = t; i < d; i += blockDim.x)
        v += x[(size_t)blockIdx.x * d + i];
    for (int m = 16; m > 0; m /= 2)
        v += __shfl_xor_sync(k_full, v, m);
    if (t % 32 == 0) partial[t / 32] = v;
    __syncthreads();
    if (t == 0) {
        float s = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++)
            s += partial[w];
        out[blockIdx.x] = s;
    }
}

// Lanes 0-15 wait at __syncwarp(full mask) while lanes 16-31 wait at __syncthreads: deadlock.
__global__ void divergent_sync_kernel(float *out) {
    if (threadIdx.x < 16)
        __syncwarp(k_full);
    else
        __syncthreads();
    out[threadIdx.x] = 1.0f;
}

int blocks_for(int n, int threads) { return (n + threads - 1) / threads; }

} // namespace

extern "C" {

cudaError_t selftest_block_sum(float *out, const float *x, int n, int missing_barrier) {
    LUNA_LAUNCH(block_sum_kernel, blocks_for(n, 256), 256, 0, 0, out, x, n, missing_barrier);
    return cudaGetLastError();
}

cudaError_t selftest_block_sum_dynamic(float *out, const float *x, int n, int threads) {
    LUNA_LAUNCH(block_sum_dynamic_kernel, blocks_for(n, threads), threads, threads * sizeof(float),
                0, out, x, n);
    return cudaGetLastError();
}

cudaError_t selftest_warp_sum(float *out, unsigned *ballot, float *prefix, const float *x, int n) {
    LUNA_LAUNCH(warp_sum_kernel, blocks_for(n, 128), 128, 0, 0, out, ballot, prefix, x, n);
    return cudaGetLastError();
}

cudaError_t selftest_shuffle_exited_lane(float *out, int live) {
    LUNA_LAUNCH(shuffle_exited_kernel, 1, 32, 0, 0, out, live);
    return cudaGetLastError();
}

cudaError_t selftest_partial_syncthreads(float *out, int live) {
    LUNA_LAUNCH(partial_syncthreads_kernel, 1, 64, 0, 0, out, live);
    return cudaGetLastError();
}

cudaError_t selftest_bf16(float *y, float *s, const float *x, int n) {
    LUNA_LAUNCH(bf16_kernel, blocks_for(n, 128), 128, 0, 0, y, s, x, n);
    return cudaGetLastError();
}

cudaError_t selftest_transpose(float *out, const float *in, int rows, int cols) {
    dim3 grid(blocks_for(cols, 32), blocks_for(rows, 32)), block(32, 8);
    LUNA_LAUNCH(transpose_kernel, grid, block, 0, 0, out, in, rows, cols);
    return cudaGetLastError();
}

cudaError_t selftest_template_scale(float *y, const float *x, int n, int k) {
    if (k == 2)
        LUNA_LAUNCH((scale_kernel<2>), blocks_for(n, 64), 64, 0, 0, y, x, n);
    else
        LUNA_LAUNCH((scale_kernel<3>), blocks_for(n, 64), 64, 0, 0, y, x, n);
    return cudaGetLastError();
}

cudaError_t selftest_read_past_end(float *out, const float *x, int n) {
    LUNA_LAUNCH(read_past_end_kernel, 1, 32, 0, 0, out, x, n);
    return cudaGetLastError();
}

cudaError_t selftest_row_sum(float *out, const float *x, int rows, int d) {
    LUNA_LAUNCH(row_sum_kernel, rows, 256, 0, 0, out, x, d);
    return cudaGetLastError();
}

cudaError_t selftest_row_sum_on(float *out, const float *x, int rows, int d, cudaStream_t stream) {
    LUNA_LAUNCH(row_sum_kernel, rows, 256, 0, stream, out, x, d);
    return cudaGetLastError();
}

unsigned long long selftest_launch_counter(void) { return luna_cuda_launch_counter().load(); }

cudaError_t selftest_divergent_sync(float *out) {
    LUNA_LAUNCH(divergent_sync_kernel, 1, 32, 0, 0, out);
    return cudaGetLastError();
}

cudaError_t selftest_barrier_block(float *out) {
    LUNA_LAUNCH(barrier_block_kernel, 1, 256, 0, 0, out);
    return cudaGetLastError();
}

} // extern "C"
