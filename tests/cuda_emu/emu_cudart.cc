// luna-cuda-emu: the CUDA runtime subset the backend uses, defined against NVIDIA's own
// declarations (cuda_runtime_api.h), so host code is the same source for libcudart and for this
// library. Work is synchronous (a stream is a token; events record host time), unless the stream
// captures: then emu_graph.cc records it and enforces the capture rules. Arguments are
// checked as the real runtime would, and more strictly where the real one is undefined:
// - cudaMalloc allocates exactly the bytes asked for (256-byte aligned, filled with 0xff bytes,
//   NaN as float), so AddressSanitizer reports an overrun and uninitialised reads show;
// - a copy's or memset's device range must lie inside one allocation; the copy kind must match
//   the pointers (H2D: destination device, source not device; ...); overlapping copies fail;
// - freeing an unknown or interior pointer, cudaFree of cudaMallocHost memory (and the reverse),
//   an unknown or destroyed stream or event: cudaErrorInvalidValue / InvalidResourceHandle.
// Every error prints one line "luna-cuda-emu: ..." on stderr.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "emu_internal.h"

namespace luna_emu {
namespace {

struct allocation {
    size_t bytes;
    bool pinned; // cudaMallocHost / cudaHostAlloc
};
std::recursive_mutex g_mu;
std::map<uintptr_t, allocation> g_allocs;
std::set<cudaStream_t> g_streams;
std::set<cudaEvent_t> g_events;
std::map<const void *, int> g_func_shared;
cudaError_t g_last = cudaSuccess, g_sticky = cudaSuccess;
std::string g_message;
size_t g_device_bytes = 0;
uint64_t g_host_waits = 0; // luna_emu_host_wait_count
int g_error_mode = -1;
const size_t k_total_memory = (size_t)80 << 30;

const allocation *find(const void *p, uintptr_t *base) {
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    uintptr_t a = (uintptr_t)p;
    if (a >= it->first + (it->second.bytes ? it->second.bytes : 1)) return nullptr;
    if (base) *base = it->first;
    return &it->second;
}

bool in_kind(const void *p, size_t bytes, bool pinned) {
    uintptr_t base;
    const allocation *a = find(p, &base);
    return a && a->pinned == pinned && (uintptr_t)p + bytes <= base + a->bytes;
}
bool is_device(const void *p) {
    const allocation *a = find(p, nullptr);
    return a && !a->pinned;
}

} // namespace

double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

cudaError_t check_copy(const char *fn, void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    if (g_sticky) return g_sticky;
    if (n == 0) return cudaSuccess;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ||
                   (kind == cudaMemcpyDefault && is_device(dst));
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ||
                   (kind == cudaMemcpyDefault && is_device(src));
    if ((unsigned)kind > (unsigned)cudaMemcpyDefault)
        return api_error(cudaErrorInvalidMemcpyDirection, false, "%s: kind %d", fn, (int)kind);
    if (dst_dev ? !in_kind(dst, n, false) : is_device(dst))
        return api_error(
            cudaErrorInvalidValue, false, "%s: destination %p (%zu bytes) is %s", fn, dst, n,
            dst_dev ? "not inside one device allocation" : "device memory, kind says host");
    if (src_dev ? !in_kind(src, n, false) : is_device(src))
        return api_error(
            cudaErrorInvalidValue, false, "%s: source %p (%zu bytes) is %s", fn, src, n,
            src_dev ? "not inside one device allocation" : "device memory, kind says host");
    if ((const char *)dst < (const char *)src + n && (const char *)src < (const char *)dst + n)
        return api_error(cudaErrorInvalidValue, false, "%s: source and destination overlap", fn);
    return cudaSuccess;
}
bool pageable_copy(const void *dst, const void *src, size_t n) {
    return n && ((!in_kind(dst, n, false) && !in_kind(dst, n, true)) ||
                 (!in_kind(src, n, false) && !in_kind(src, n, true)));
}
void count_host_wait() { g_host_waits++; }
std::recursive_mutex &api_mutex() { return g_mu; }

namespace {

cudaError_t stream_check(const char *fn, cudaStream_t s) {
    if (g_sticky) return g_sticky;
    if (!stream_valid(s))
        return api_error(cudaErrorInvalidResourceHandle, false, "%s: unknown stream %p", fn,
                         (void *)s);
    return cudaSuccess;
}

cudaError_t alloc(void **p, size_t bytes, bool pinned, const char *fn) {
    if (!p) return api_error(cudaErrorInvalidValue, false, "%s: NULL result pointer", fn);
    *p = nullptr;
    if (g_sticky) return g_sticky;
    if (bytes == 0) return cudaSuccess;
    if (bytes > k_total_memory - g_device_bytes || posix_memalign(p, 256, bytes) != 0)
        return api_error(cudaErrorMemoryAllocation, false, "%s: out of memory (%zu bytes)", fn,
                         bytes);
    if (!pinned) memset(*p, 0xff, bytes), g_device_bytes += bytes;
    g_allocs[(uintptr_t)*p] = allocation{bytes, pinned};
    return cudaSuccess;
}

cudaError_t release(void *p, bool pinned, const char *fn) {
    if (!p) return cudaSuccess;
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.pinned != pinned)
        return api_error(cudaErrorInvalidValue, false,
                         "%s: %p is not the start of a live %s allocation", fn, p,
                         pinned ? "cudaMallocHost" : "cudaMalloc");
    if (!pinned) g_device_bytes -= it->second.bytes;
    g_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

} // namespace

cudaError_t api_error(cudaError_t err, bool sticky, const char *fmt, ...) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "luna-cuda-emu: %s\n", msg);
    g_message = msg;
    g_last = err;
    if (sticky) g_sticky = err;
    return err;
}
cudaError_t sticky_error() { return g_sticky; }
void set_message(const char *msg) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    g_message = msg;
}
void set_last_error(cudaError_t err) { g_last = err; }
luna_emu_error_mode error_mode() {
    if (g_error_mode < 0) {
        const char *e = getenv("LUNA_EMU_ON_ERROR");
        g_error_mode = e && !strcmp(e, "record") ? LUNA_EMU_RECORD : LUNA_EMU_ABORT;
    }
    return (luna_emu_error_mode)g_error_mode;
}
bool device_range(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    return in_kind(p, bytes, false);
}
bool pinned_range(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    return in_kind(p, bytes, true);
}
bool stream_valid(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || g_streams.count(s);
}
bool event_valid(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    return g_events.count(e) != 0;
}
int func_max_dynamic_shared(const void *func) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    auto it = g_func_shared.find(func);
    return it == g_func_shared.end() ? 0 : it->second;
}
bool check_launch_pointer(const char *kernel, int index, const void *p) {
    std::lock_guard<std::recursive_mutex> lock(g_mu);
    if (!p || find(p, nullptr) || (p && find((const char *)p - 1, nullptr)))
        return true; // or one past the end
    api_error(cudaErrorIllegalAddress, true,
              "kernel %s: pointer argument %d (%p) is not device memory (a host pointer?)", kernel,
              index, p);
    if (error_mode() == LUNA_EMU_ABORT) abort();
    return false;
}

} // namespace luna_emu

using namespace luna_emu;
#define LOCK std::lock_guard<std::recursive_mutex> lock_(g_mu)

extern "C" {

cudaError_t cudaMalloc(void **p, size_t bytes) {
    LOCK;
    if (cudaError_t e = capture_unsafe_call("cudaMalloc")) return e;
    return alloc(p, bytes, false, "cudaMalloc");
}
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    LOCK;
    bool record = false;
    cudaError_t e = stream_check("cudaMallocAsync", s);
    if (!e) e = capture_enqueue("cudaMallocAsync", s, &record);
    if (!e && record) /* the real runtime adds a graph memory node */
        e = capture_failed(s, api_error(cudaErrorNotSupported, false,
                                        "cudaMallocAsync during stream capture: graph memory "
                                        "nodes are not emulated (allocate before the capture)"));
    return e ? e : alloc(p, bytes, false, "cudaMallocAsync");
}
cudaError_t cudaFree(void *p) {
    LOCK;
    if (cudaError_t e = capture_unsafe_call("cudaFree")) return e;
    return release(p, false, "cudaFree");
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    LOCK;
    bool record = false;
    cudaError_t e = stream_check("cudaFreeAsync", s);
    if (!e) e = capture_enqueue("cudaFreeAsync", s, &record);
    if (!e && record)
        e = capture_failed(s, api_error(cudaErrorNotSupported, false,
                                        "cudaFreeAsync during stream capture: graph memory "
                                        "nodes are not emulated (free after the capture)"));
    return e ? e : release(p, false, "cudaFreeAsync");
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    LOCK;
    if (cudaError_t e = capture_unsafe_call("cudaMallocHost")) return e;
    return alloc(p, bytes, true, "cudaMallocHost");
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned) {
    LOCK;
    if (cudaError_t e = capture_unsafe_call("cudaHostAlloc")) return e;
    return alloc(p, bytes, true, "cudaHostAlloc");
}
cudaError_t cudaFreeHost(void *p) {
    LOCK;
    if (cudaError_t e = capture_unsafe_call("cudaFreeHost")) return e;
    return release(p, true, "cudaFreeHost");
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    LOCK;
    g_host_waits++; /* synchronous: the host waits for the device's queue */
    cudaError_t e = capture_legacy_sync("cudaMemcpy");
    if (!e) e = check_copy("cudaMemcpy", dst, src, n, kind);
    if (!e && n) memcpy(dst, src, n);
    return e;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
    LOCK;
    bool record = false;
    cudaError_t e = stream_check("cudaMemcpyAsync", s);
    if (!e) e = capture_enqueue("cudaMemcpyAsync", s, &record);
    if (!e) e = capture_failed(s, check_copy("cudaMemcpyAsync", dst, src, n, kind));
    if (!e && record) return n ? capture_copy(s, dst, src, n, kind) : cudaSuccess;
    /* with pageable host memory the copy is staged and the host may wait for the stream: counted */
    if (!e && pageable_copy(dst, src, n)) g_host_waits++;
    if (!e && n) memcpy(dst, src, n);
    return e;
}
cudaError_t cudaMemset(void *p, int value, size_t n) {
    return cudaMemsetAsync(p, value, n, nullptr);
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    LOCK;
    bool record = false;
    cudaError_t e = stream_check("cudaMemset", s);
    if (!e) e = capture_enqueue("cudaMemsetAsync", s, &record);
    if (e || n == 0) return e;
    if (!in_kind(p, n, false))
        return capture_failed(
            s, api_error(cudaErrorInvalidValue, false,
                         "cudaMemset: %p (%zu bytes) is not inside one device allocation", p, n));
    if (record) return capture_memset(s, p, value, n);
    memset(p, value, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t n, size_t offset,
                               cudaMemcpyKind kind) {
    LOCK;
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice &&
        kind != cudaMemcpyDefault)
        return api_error(cudaErrorInvalidMemcpyDirection, false, "cudaMemcpyToSymbol: kind %d",
                         (int)kind);
    if (cudaError_t e = capture_legacy_sync("cudaMemcpyToSymbol")) return e;
    memcpy((char *)const_cast<void *>(symbol) + offset, src, n); // a __constant__/__device__ global
    return g_sticky;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    LOCK;
    *free_bytes = k_total_memory - g_device_bytes;
    *total = k_total_memory;
    return g_sticky;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    LOCK;
    *s = new CUstream_st{flags};
    g_streams.insert(*s);
    return g_sticky;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCK;
    if (!g_streams.count(s))
        return api_error(cudaErrorInvalidResourceHandle, false,
                         "cudaStreamDestroy: unknown stream %p", (void *)s);
    if (cudaError_t e = capture_stream_destroy(s)) return e;
    g_streams.erase(s);
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCK;
    g_host_waits++;
    cudaError_t e = stream_check("cudaStreamSynchronize", s);
    return e ? e : capture_stream_wait("cudaStreamSynchronize", s);
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    LOCK;
    cudaError_t e = stream_check("cudaStreamQuery", s);
    return e ? e : capture_stream_wait("cudaStreamQuery", s);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags) {
    LOCK;
    cudaError_t e = stream_check("cudaStreamWaitEvent", s);
    if (!e && !g_events.count(ev))
        e = api_error(cudaErrorInvalidResourceHandle, false, "cudaStreamWaitEvent: unknown event");
    return e ? capture_failed(s, e) : capture_wait_event(s, ev, flags);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
    LOCK;
    *ev = new CUevent_st{flags, -1.0};
    g_events.insert(*ev);
    return g_sticky;
}
cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    LOCK;
    if (!g_events.erase(ev))
        return api_error(cudaErrorInvalidResourceHandle, false, "cudaEventDestroy: unknown event");
    capture_forget_event(ev);
    delete ev;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
    LOCK;
    bool record = false;
    cudaError_t e = stream_check("cudaEventRecord", s);
    if (!e) e = capture_enqueue("cudaEventRecord", s, &record);
    if (e) return e;
    if (!g_events.count(ev))
        return capture_failed(
            s, api_error(cudaErrorInvalidResourceHandle, false, "cudaEventRecord: unknown event"));
    if (record) return capture_event_record(s, ev);
    capture_forget_event(ev); /* recorded outside any capture now */
    ev->ms = now_ms();
    return cudaSuccess;
}
static cudaError_t event_wait(const char *fn, cudaEvent_t ev) {
    LOCK;
    g_host_waits++;
    if (!g_events.count(ev))
        return api_error(cudaErrorInvalidResourceHandle, false, "%s: unknown event", fn);
    cudaError_t e = capture_event_wait(fn, ev);
    return e ? e : g_sticky;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) { return event_wait("cudaEventSynchronize", ev); }
cudaError_t cudaEventQuery(cudaEvent_t ev) { return event_wait("cudaEventQuery", ev); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    LOCK;
    if (!g_events.count(a) || !g_events.count(b) ||
        ((a->flags | b->flags) & cudaEventDisableTiming))
        return api_error(cudaErrorInvalidResourceHandle, false,
                         "cudaEventElapsedTime: unknown event or one without timing");
    if (cudaError_t e = capture_event_wait("cudaEventElapsedTime", a)) return e;
    if (cudaError_t e = capture_event_wait("cudaEventElapsedTime", b)) return e;
    if (a->ms < 0 || b->ms < 0)
        return api_error(cudaErrorInvalidResourceHandle, false,
                         "cudaEventElapsedTime: event not recorded");
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    LOCK;
    cudaError_t e = g_last;
    g_last = g_sticky;
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    LOCK;
    return g_last;
}
cudaError_t cudaDeviceSynchronize(void) {
    LOCK;
    g_host_waits++;
    cudaError_t e = capture_device_wait("cudaDeviceSynchronize");
    return e ? e : g_sticky;
}
cudaError_t cudaDeviceReset(void) {
    LOCK;
    capture_reset();
    for (auto &a : g_allocs)
        free((void *)a.first);
    g_allocs.clear();
    g_device_bytes = 0;
    g_last = g_sticky = cudaSuccess;
    g_message.clear();
    return cudaSuccess;
}
/* One device; LUNA_EMU_NO_DEVICE=1 answers as a machine without a usable driver does (what the
 * real runtime returns on this project's GPU-less machines), to test that path. */
static int g_current_device = 0;
static int device_count() {
    const char *v = getenv("LUNA_EMU_DEVICE_COUNT");
    int n = v && *v ? atoi(v) : 1;
    return n >= 1 && n <= 64 ? n : 1;
}
cudaError_t cudaGetDeviceCount(int *n) {
    const char *none = getenv("LUNA_EMU_NO_DEVICE");
    if (none && *none && strcmp(none, "0") != 0) {
        *n = 0;
        return api_error(cudaErrorInsufficientDriver, false, "cudaGetDeviceCount: no device");
    }
    *n = device_count();
    return cudaSuccess;
}
/* Every process has one emulated GPU, which answers to any ordinal below LUNA_EMU_DEVICE_COUNT
 * (default 1): ranks of one machine each pick "their" GPU by local rank, as on an 8-GPU node. */
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count())
        return api_error(cudaErrorInvalidDevice, false,
                         "cudaSetDevice(%d): %d device(s) (LUNA_EMU_DEVICE_COUNT)", d,
                         device_count());
    g_current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = g_current_device;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    LOCK;
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) g_func_shared[func] = value;
    return g_sticky;
}

// An H100-like device (sm_90, 132 SMs, 80 GiB).
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (device < 0 || device >= device_count())
        return api_error(cudaErrorInvalidDevice, false, "cudaGetDeviceProperties(%d)", device);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "luna-cuda-emu (CPU)");
    p->totalGlobalMem = k_total_memory;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 232448;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->l2CacheSize = 50 << 20;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    default:
        return api_error(cudaErrorInvalidValue, false,
                         "cudaDeviceGetAttribute: attribute %d not emulated", (int)attr);
    }
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    default: return "cudaErrorUnknown";
#define C(x)                                                                                       \
    case x: return #x;
        // clang-format off
        C(cudaSuccess) C(cudaErrorInvalidValue) C(cudaErrorMemoryAllocation)
        C(cudaErrorInvalidConfiguration) C(cudaErrorInvalidMemcpyDirection) C(cudaErrorInvalidDevice)
        C(cudaErrorInvalidResourceHandle) C(cudaErrorIllegalAddress) C(cudaErrorLaunchFailure)
        C(cudaErrorNoDevice) C(cudaErrorNotSupported) C(cudaErrorInsufficientDriver)
        C(cudaErrorIllegalState) C(cudaErrorStreamCaptureUnsupported)
        C(cudaErrorStreamCaptureInvalidated) C(cudaErrorStreamCaptureMerge)
        C(cudaErrorStreamCaptureIsolation) C(cudaErrorStreamCaptureImplicit)
        C(cudaErrorCapturedEvent) C(cudaErrorStreamCaptureWrongThread)
        // clang-format on
#undef C
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
        return "operation not permitted on an event last recorded in a capturing stream";
    default: return cudaGetErrorName(e);
    }
}

void luna_emu_set_error_mode(luna_emu_error_mode mode) {
    LOCK;
    g_error_mode = mode;
}
const char *luna_emu_last_error(void) {
    LOCK;
    return g_message.c_str();
}
uint64_t luna_emu_device_bytes(void) {
    LOCK;
    return g_device_bytes;
}
uint64_t luna_emu_host_wait_count(void) {
    LOCK;
    return g_host_waits;
}

} // extern "C"
