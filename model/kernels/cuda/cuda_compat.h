/* The vendor header of the CUDA kernels: the only file that differs between a real build (nvcc)
 * and the CPU execution harness (g++ -x c++ with tests/cuda_emu/, see its README.md). Every .cu
 * file of the CUDA backend includes it first, and then uses only:
 *
 *   LUNA_LAUNCH(kernel, grid, block, shmem, stream, args...)   launch (never <<<...>>>); a
 *       template kernel with commas goes in parentheses: LUNA_LAUNCH((k<float, 4>), ...)
 *   LUNA_SHARED(type, name, count)              static shared array   type name[count]
 *   LUNA_SHARED_2D(type, name, rows, cols)      static shared array   type name[rows][cols]
 *   LUNA_DYNAMIC_SHARED(type, name)             type *name = the launch's dynamic shared memory
 *   LUNA_UNROLL                                 #pragma unroll before a loop (none under g++)
 *   LUNA_UNROLL_BY(n)                           #pragma unroll n (none under g++)
 *   explicit masks in every warp intrinsic (__shfl_xor_sync(0xffffffffu, ...), __syncwarp(m))
 *   nvcuda::wmma (m16n16k16, bf16/fp16 inputs, float accumulators; load/store/fill/mma and
 *       element-wise operations alike on every element: tests/cuda_emu/emu_wmma.h)
 *
 * Under nvcc these are the plain CUDA constructs; under the harness each CUDA thread is a fiber
 * and shared memory is per-block storage of the harness. LUNA_CUDA_EMU is 1 under the harness,
 * 0 under nvcc (kernels should not need it). Every LUNA_LAUNCH also counts itself
 * (luna_cuda_launch_counter: the launches of an update, for the benchmarks). */
#ifndef LUNA_KERNELS_CUDA_COMPAT_H
#define LUNA_KERNELS_CUDA_COMPAT_H

#include <atomic>

/* Kernel launches so far in this process: one counter for every .cu file (an inline function's
 * static is one object in the program). */
inline std::atomic<unsigned long long> &luna_cuda_launch_counter() {
    static std::atomic<unsigned long long> launches{0};
    return launches;
}

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#define LUNA_CUDA_EMU 0
#define LUNA_LAUNCH(kernel, grid, block, shmem, stream, ...)                                       \
    (luna_cuda_launch_counter()++, kernel<<<grid, block, shmem, stream>>>(__VA_ARGS__))
#define LUNA_SHARED(type, name, count) __shared__ type name[count]
#define LUNA_SHARED_2D(type, name, rows, cols) __shared__ type name[rows][cols]
#define LUNA_DYNAMIC_SHARED(type, name)                                                            \
    extern __shared__ __align__(16) unsigned char luna_dynamic_shared_[];                          \
    type *const name = reinterpret_cast<type *>(luna_dynamic_shared_)
#define LUNA_UNROLL _Pragma("unroll")
#define LUNA_PRAGMA_(x) _Pragma(#x)
#define LUNA_UNROLL_BY(n) LUNA_PRAGMA_(unroll n)

#else

#define LUNA_UNROLL
#define LUNA_UNROLL_BY(n)

/* tests/cuda_emu/ is on the include path of targets built with the harness (CMake target
 * luna_cuda_emu); angle brackets keep model/kernels/ free of a tests/ include. */
#include <luna_cuda_emu.h>

#undef LUNA_LAUNCH /* the harness's, counted */
#define LUNA_LAUNCH(kernel, grid, block, shmem, stream, ...)                                       \
    (luna_cuda_launch_counter()++,                                                                 \
     ::luna_emu::launch(#kernel, kernel, grid, block, shmem, stream, ##__VA_ARGS__))

#endif

#endif
