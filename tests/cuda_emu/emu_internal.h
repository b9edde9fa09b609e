/* luna-cuda-emu internals shared by the harness's sources (not for kernels or tests). */
#ifndef LUNA_CUDA_EMU_INTERNAL_H
#define LUNA_CUDA_EMU_INTERNAL_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "luna_cuda_emu_api.h"

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    unsigned flags;
    double ms; // host time when recorded, < 0 before
};

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
bool event_valid(cudaEvent_t e);
/* cudaFuncAttributeMaxDynamicSharedMemorySize set for `func` (0 when never set). */
int func_max_dynamic_shared(const void *func);
/* The runtime's lock (recursive), shared by the capture state and the graphs. */
std::recursive_mutex &api_mutex();
/* A copy's checks (ranges, kind, overlap); reports the error. Caller holds api_mutex(). */
cudaError_t check_copy(const char *fn, void *dst, const void *src, size_t n, cudaMemcpyKind kind);
/* Does a copy touch pageable host memory (neither device nor cudaMallocHost)? */
bool pageable_copy(const void *dst, const void *src, size_t n);
void count_host_wait();
double now_ms();

/* ---- stream capture and graphs (emu_graph.cc) -------------------------------------------------
 * While a stream captures, the work queued on it is recorded as graph_ops instead of run; a
 * cudaGraphLaunch runs them in order. The capture_* functions take api_mutex(). */
struct graph_op {
    std::string what; // the call that recorded it, for messages
    void *ctx = nullptr;
    cudaError_t (*run)(void *ctx, cudaStream_t s) = nullptr; // one replay; reports its errors
    void (*destroy)(void *ctx) = nullptr;
    bool pageable = false; // a copy from or to pageable host memory
    graph_op() = default;
    graph_op(const graph_op &) = delete;
    graph_op &operator=(const graph_op &) = delete;
    ~graph_op() {
        if (destroy) destroy(ctx);
    }
};
/* Before a call queues work on `s`: cudaSuccess, with *record telling whether s captures (the
 * caller then checks its arguments and records the work with capture_record instead of running
 * it); or the error, reported under fn's name: s's capture was invalidated
 * (cudaErrorStreamCaptureInvalidated), or s is the legacy stream while a blocking stream captures
 * (cudaErrorStreamCaptureImplicit, which invalidates that capture). */
cudaError_t capture_enqueue(const char *fn, cudaStream_t s, bool *record);
void capture_record(cudaStream_t s, std::shared_ptr<graph_op> op);
std::shared_ptr<graph_op> make_graph_op(const char *what, void *ctx,
                                        cudaError_t (*run)(void *, cudaStream_t),
                                        void (*destroy)(void *));
/* A call on `s` failed with `e` (already reported): invalidates s's capture, if any; returns e. */
cudaError_t capture_failed(cudaStream_t s, cudaError_t e);
/* Records a copy / memset / event record on capturing `s`. */
cudaError_t capture_copy(cudaStream_t s, void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t capture_memset(cudaStream_t s, void *p, int value, size_t n);
cudaError_t capture_event_record(cudaStream_t s, cudaEvent_t ev);
/* The checks of calls that are illegal during a capture (each reports, and invalidates the
 * captures concerned): a host wait on `s` (cudaStreamSynchronize/Query); a device-wide wait
 * (cudaDeviceSynchronize); a synchronous copy through the legacy stream (cudaMemcpy); a
 * potentially unsafe call (cudaMalloc, cudaFree, ...: per the capture modes); a wait for or a
 * query of an event recorded in an active capture; a stream waiting for an event. */
cudaError_t capture_stream_wait(const char *fn, cudaStream_t s);
cudaError_t capture_device_wait(const char *fn);
cudaError_t capture_legacy_sync(const char *fn);
cudaError_t capture_unsafe_call(const char *fn);
cudaError_t capture_event_wait(const char *fn, cudaEvent_t ev);
cudaError_t capture_wait_event(cudaStream_t s, cudaEvent_t ev, unsigned flags);
/* cudaStreamDestroy of a capturing stream is refused; an event destroyed is forgotten. */
cudaError_t capture_stream_destroy(cudaStream_t s);
void capture_forget_event(cudaEvent_t ev);
/* cudaDeviceReset: no capture remains; graphs and executable graphs are destroyed. */
void capture_reset();

} // namespace luna_emu

#endif
