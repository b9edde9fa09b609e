/* Kernels of the harness's own tests (selftest_kernels.cu), behind C launchers: the same .cu
 * compiles with nvcc -arch=sm_90a (CMake -DLUNA_CUDA=ON) and with g++ against the harness.
 * Pointers are device pointers; each launcher returns the launch's cudaGetLastError(). */
#ifndef LUNA_CUDA_EMU_SELFTEST_KERNELS_H
#define LUNA_CUDA_EMU_SELFTEST_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[b] = Σ x[b·256 .. b·256+255] (zero-padded past n): a 256-thread shared-memory tree
 * reduction per block, blocks = ceil(n / 256). missing_barrier omits the __syncthreads between
 * the stores and the first reads. */
cudaError_t selftest_block_sum(float *out, const float *x, int n, int missing_barrier);
/* The same reduction with `threads` threads (a power of 2) and dynamic shared memory. */
cudaError_t selftest_block_sum_dynamic(float *out, const float *x, int n, int threads);
/* out[w] = Σ of warp w's 32 values x[32w ..] with __shfl_xor_sync (n a multiple of 32), one
 * 128-thread block per 4 warps; also ballot[w] = __ballot_sync(x > 0) and
 * prefix[i] = inclusive prefix sum within the warp by __shfl_up_sync. */
cudaError_t selftest_warp_sum(float *out, unsigned *ballot, float *prefix, const float *x, int n);
/* Lanes >= `live` of a 32-thread block return, then the rest shuffle with a full mask. */
cudaError_t selftest_shuffle_exited_lane(float *out, int live);
/* Threads >= `live` of a 64-thread block return, then the rest call __syncthreads. */
cudaError_t selftest_partial_syncthreads(float *out, int live);
/* y = bf16 round trip of x (__float2bfloat16 then __bfloat162float), and bf16 sums
 * s[i] = bf16(x[i]) + bf16(x[i]) computed in __nv_bfloat16 arithmetic. */
cudaError_t selftest_bf16(float *y, float *s, const float *x, int n);
/* out [cols, rows] = in [rows, cols]ᵀ through a 32×33 shared tile (2-D blocks of 32×8). */
cudaError_t selftest_transpose(float *out, const float *in, int rows, int cols);
/* y[i] = x[i] · K for K in {2, 3}: a template kernel launched through LUNA_LAUNCH((k<K>), ...). */
cudaError_t selftest_template_scale(float *y, const float *x, int n, int k);
/* Reads x[n] (one past the end): AddressSanitizer must report it. */
cudaError_t selftest_read_past_end(float *out, const float *x, int n);
/* out[r] = Σ_j x[r, j] for x [rows, d]: one 256-thread block per row (README.md's example). */
cudaError_t selftest_row_sum(float *out, const float *x, int rows, int d);
/* The same on `stream` (the others launch on the legacy stream, which cannot be captured). */
cudaError_t selftest_row_sum_on(float *out, const float *x, int rows, int d, cudaStream_t stream);
/* luna_cuda_launch_counter(): the LUNA_LAUNCH calls of the process so far. */
unsigned long long selftest_launch_counter(void);
/* Half a warp at __syncwarp, the other half at __syncthreads: a deadlock the harness names. */
cudaError_t selftest_divergent_sync(float *out);
/* The benchmark kernel: one block of 256 threads, 4 barriers. */
cudaError_t selftest_barrier_block(float *out);

#ifdef __cplusplus
}
#endif

#endif
