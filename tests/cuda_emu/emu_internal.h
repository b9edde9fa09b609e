/* luna-cuda-emu internals shared by the harness's sources (not for kernels or tests). */
#ifndef LUNA_CUDA_EMU_INTERNAL_H
#define LUNA_CUDA_EMU_INTERNAL_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "luna_cuda_emu_api.h"

namespace luna_emu {

/* ---- fibers (emu_fiber.cc): a stack and a saved context ---------------------------------------
 */
struct fiber {
    void *sp = nullptr;    /* saved stack pointer (x86-64 switch) */
    void *uctx = nullptr;  /* ucontext_t (other architectures) */
    char *stack = nullptr; /* lowest usable byte */
    size_t stack_size = 0;
    void *asan_fake = nullptr; /* AddressSanitizer's fake stack while switched out */
};
/* Prepares `f` (stack from the pool slot `slot`) to run entry(arg) on its first switch_to. */
void fiber_make(fiber *f, int slot, void (*entry)(void *), void *arg);
/* Scheduler -> fiber; returns when the fiber yields or finishes. */
void fiber_switch_to(fiber *f);
/* Fiber -> scheduler. `finished`: the fiber will never be resumed. */
void fiber_yield(fiber *f, bool finished);
/* First thing a fiber's entry calls (AddressSanitizer bookkeeping). */
void fiber_started();

/* ---- the fake runtime (emu_cudart.cc) ---------------------------------------------------------
 */
/* Records err (sticky: it stays until cudaDeviceReset) and the message; prints the message. */
cudaError_t api_error(cudaError_t err, bool sticky, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The sticky error, cudaSuccess if none. */
cudaError_t sticky_error();
void set_last_error(cudaError_t err);
luna_emu_error_mode error_mode();
void set_message(const char *msg);
/* Is [p, p + bytes) inside one cudaMalloc allocation? (`host`: one cudaMallocHost allocation) */
bool device_range(const void *p, size_t bytes);
bool pinned_range(const void *p, size_t bytes);
bool stream_valid(cudaStream_t s);
/* cudaFuncAttributeMaxDynamicSharedMemorySize set for `func` (0 when never set). */
int func_max_dynamic_shared(const void *func);

} // namespace luna_emu

#endif
