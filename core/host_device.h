/* Functions shared by host C and CUDA kernels (after llama.cpp's vendor header): one definition,
 * compiled by the C compiler for the CPU backend and by nvcc (or the CPU execution harness of
 * the CUDA backend) for kernels, so both compute bit-identical results by construction.
 *
 *   LUNA_HD static inline uint32_t f(...)   -- callable on host and device
 *
 * Only integer and IEEE float arithmetic that means the same on both sides belongs in such
 * functions (no libm calls whose rounding may differ, no host memory). */
#ifndef LUNA_CORE_HOST_DEVICE_H
#define LUNA_CORE_HOST_DEVICE_H

#if defined(__CUDACC__) || defined(__HIPCC__)
#define LUNA_HD __host__ __device__
#else
#define LUNA_HD
#endif

#endif
