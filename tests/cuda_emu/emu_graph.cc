// luna-cuda-emu: stream capture and CUDA graphs. While a stream captures, the work queued on it
// (kernels, cudaMemcpyAsync, cudaMemsetAsync, cudaEventRecord, cublasLtMatmul, graph launches) is
// recorded as a list of operations instead of run; cudaStreamEndCapture hands it over as a
// cudaGraph_t, cudaGraphInstantiate copies it into a cudaGraphExec_t, and every cudaGraphLaunch
// runs the operations in the order they were queued, synchronously like every launch here. What
// an operation reads when it runs (memory contents, device-side scalars) is read at each replay;
// what the real runtime copies when the call is made (kernel arguments, host-side scalars,
// descriptors) was copied at capture.
//
// The calls that are illegal during a capture fail as on the GPU (CUDA Programming Guide, "CUDA
// Graphs": "Prohibited and Unhandled Operations", "Invalidation"; the error codes' definitions in
// driver_types.h) and invalidate the capture, so that cudaStreamEndCapture returns
// cudaErrorStreamCaptureInvalidated and no graph:
// - waiting for or querying a capturing stream (cudaStreamSynchronize, cudaStreamQuery):
//   cudaErrorStreamCaptureUnsupported; cudaDeviceSynchronize while any stream captures: the same;
// - waiting for or querying an event recorded in an active capture: cudaErrorCapturedEvent;
// - the legacy stream (a launch, a copy on stream 0, cudaMemcpy) while a blocking stream captures:
//   cudaErrorStreamCaptureImplicit;
// - potentially unsafe calls (cudaMalloc, cudaFree, cudaMallocHost, cudaHostAlloc, cudaFreeHost,
//   and here cudaMemcpy also when only non-blocking streams capture) from a thread that the capture
//   modes prohibit (cudaThreadExchangeStreamCaptureMode): cudaErrorStreamCaptureUnsupported;
// - a capturing stream waiting for an event from outside its capture (without
//   cudaEventWaitExternal): cudaErrorStreamCaptureIsolation; from another capture:
//   cudaErrorStreamCaptureMerge;
// - any failed call queued on a capturing stream (stricter than the GPU, which may drop the work
//   silently).
// Not emulated (an error that says so, and the capture is invalidated): graph memory nodes
// (cudaMallocAsync / cudaFreeAsync on a capturing stream), other streams joining a capture by
// waiting for one of its events, NCCL collectives on a capturing stream.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "emu_internal.h"

using op_list = std::vector<std::shared_ptr<luna_emu::graph_op>>;
struct CUgraph_st {
    op_list ops;
};
struct CUgraphExec_st {
    op_list ops;
    unsigned long long flags;
};

namespace luna_emu {
namespace {

struct capture {
    unsigned long long id;
    cudaStreamCaptureMode mode;
    std::thread::id thread;
    bool invalidated = false;
    std::string why;             // the message of the call that invalidated it
    CUgraph_st *graph = nullptr; // what has been recorded (owned until the capture ends)
};

std::map<cudaStream_t, capture> g_captures;                // the streams in capture mode
std::map<cudaEvent_t, unsigned long long> g_event_capture; // event -> capture id it was recorded in
std::set<CUgraph_st *> g_graphs;
std::set<CUgraphExec_st *> g_execs;
unsigned long long g_next_id = 1;
uint64_t g_graph_launches = 0, g_graph_nodes = 0;
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

#define LOCK std::lock_guard<std::recursive_mutex> lock_(api_mutex())

cudaStream_t norm(cudaStream_t s) { return s ? s : cudaStreamLegacy; }
// A blocking stream synchronises with the legacy stream (the per-thread stream does too).
bool blocking(cudaStream_t s) {
    return s == cudaStreamPerThread ||
           (s != cudaStreamLegacy && !(s->flags & cudaStreamNonBlocking));
}
const char *mode_name(cudaStreamCaptureMode m) {
    return m == cudaStreamCaptureModeGlobal        ? "global"
           : m == cudaStreamCaptureModeThreadLocal ? "thread-local"
                                                   : "relaxed";
}
capture *find(cudaStream_t s) {
    auto it = g_captures.find(norm(s));
    return it == g_captures.end() ? nullptr : &it->second;
}
capture *by_id(unsigned long long id, cudaStream_t *stream) {
    for (auto &c : g_captures)
        if (c.second.id == id) {
            if (stream) *stream = c.first;
            return &c.second;
        }
    return nullptr;
}
void invalidate(capture *c, const char *why) {
    if (c && !c->invalidated) c->invalidated = true, c->why = why;
}

// Reports `e` with the message, invalidating the captures in `victims`.
cudaError_t fail(cudaError_t e, const std::vector<capture *> &victims, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
cudaError_t fail(cudaError_t e, const std::vector<capture *> &victims, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (capture *c : victims)
        invalidate(c, msg);
    return api_error(e, false, "%s", msg);
}

// The captures a use of the legacy stream would depend on: those of blocking streams.
std::vector<capture *> blocking_captures(cudaStream_t *first) {
    std::vector<capture *> v;
    for (auto &c : g_captures)
        if (blocking(c.first)) {
            if (v.empty() && first) *first = c.first;
            v.push_back(&c.second);
        }
    return v;
}

cudaError_t legacy_conflict(const char *fn) {
    cudaStream_t first = nullptr;
    std::vector<capture *> v = blocking_captures(&first);
    if (v.empty()) return cudaSuccess;
    return fail(cudaErrorStreamCaptureImplicit, v,
                "%s during stream capture: it uses the legacy stream while blocking stream %p "
                "captures (cudaErrorStreamCaptureImplicit; the capture is invalidated)",
                fn, (void *)first);
}

// ---- the recorded operations ------------------------------------------------------------------
struct copy_op {
    void *dst;
    const void *src;
    size_t n;
    cudaMemcpyKind kind;
};
struct memset_op {
    void *p;
    int value;
    size_t n;
};

// A recorded operation that cannot run any more (its memory was freed since the capture): the
// GPU would fault, so the error is sticky.
cudaError_t replay_fault(const char *what, const char *why) {
    return api_error(cudaErrorIllegalAddress, true, "cudaGraphLaunch: the recorded %s %s", what,
                     why);
}

cudaError_t run_copy(void *ctx, cudaStream_t) {
    LOCK;
    const copy_op *c = static_cast<const copy_op *>(ctx);
    if (sticky_error()) return sticky_error();
    if (check_copy("cudaGraphLaunch (a recorded cudaMemcpyAsync)", c->dst, c->src, c->n, c->kind))
        return replay_fault("cudaMemcpyAsync", "no longer names valid memory");
    if (pageable_copy(c->dst, c->src, c->n)) count_host_wait(); // staged through the host
    memcpy(c->dst, c->src, c->n);
    return cudaSuccess;
}
cudaError_t run_memset(void *ctx, cudaStream_t) {
    LOCK;
    const memset_op *m = static_cast<const memset_op *>(ctx);
    if (sticky_error()) return sticky_error();
    if (!device_range(m->p, m->n))
        return replay_fault("cudaMemsetAsync", "no longer names one device allocation");
    memset(m->p, m->value, m->n);
    return cudaSuccess;
}
cudaError_t run_event(void *ctx, cudaStream_t) {
    LOCK;
    cudaEvent_t ev = static_cast<cudaEvent_t>(ctx);
    if (!event_valid(ev))
        return api_error(cudaErrorInvalidResourceHandle, false,
                         "cudaGraphLaunch: the event of a recorded cudaEventRecord was destroyed");
    g_event_capture.erase(ev);
    ev->ms = now_ms();
    return cudaSuccess;
}

} // namespace

std::shared_ptr<graph_op> make_graph_op(const char *what, void *ctx,
                                        cudaError_t (*run)(void *, cudaStream_t),
                                        void (*destroy)(void *)) {
    auto op = std::make_shared<graph_op>();
    op->what = what;
    op->ctx = ctx;
    op->run = run;
    op->destroy = destroy;
    return op;
}

cudaError_t capture_enqueue(const char *fn, cudaStream_t s, bool *record) {
    LOCK;
    *record = false;
    if (capture *c = find(s)) {
        if (c->invalidated)
            return api_error(cudaErrorStreamCaptureInvalidated, false,
                             "%s during stream capture: the capture of stream %p was invalidated "
                             "(by: %s); end it with cudaStreamEndCapture",
                             fn, (void *)norm(s), c->why.c_str());
        *record = true;
        return cudaSuccess;
    }
    return norm(s) == cudaStreamLegacy ? legacy_conflict(fn) : cudaSuccess;
}

void capture_record(cudaStream_t s, std::shared_ptr<graph_op> op) {
    LOCK;
    if (capture *c = find(s)) c->graph->ops.push_back(std::move(op));
}

cudaError_t capture_failed(cudaStream_t s, cudaError_t e) {
    if (e == cudaSuccess) return e;
    LOCK;
    capture *c = find(s);
    if (c && !c->invalidated) {
        std::string why = std::string(luna_emu_last_error()) + " (failed during stream capture)";
        invalidate(c, why.c_str());
    }
    return e;
}

cudaError_t capture_copy(cudaStream_t s, void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    LOCK;
    // Pageable host memory is legal here: graphs launched from the host may copy it (only
    // device-launched graphs and conditional bodies may not); it is read at each replay.
    auto op = make_graph_op("cudaMemcpyAsync", new copy_op{dst, src, n, k}, run_copy,
                            [](void *p) { delete static_cast<copy_op *>(p); });
    op->pageable = pageable_copy(dst, src, n);
    capture_record(s, op);
    return cudaSuccess;
}

cudaError_t capture_memset(cudaStream_t s, void *p, int value, size_t n) {
    LOCK;
    capture_record(s, make_graph_op("cudaMemsetAsync", new memset_op{p, value, n}, run_memset,
                                    [](void *q) { delete static_cast<memset_op *>(q); }));
    return cudaSuccess;
}

cudaError_t capture_event_record(cudaStream_t s, cudaEvent_t ev) {
    LOCK;
    g_event_capture[ev] = find(s)->id;
    capture_record(s, make_graph_op("cudaEventRecord", ev, run_event, nullptr));
    return cudaSuccess;
}

cudaError_t capture_stream_wait(const char *fn, cudaStream_t s) {
    LOCK;
    if (capture *c = find(s)) {
        if (c->invalidated) {
            bool unused;
            return capture_enqueue(fn, s, &unused);
        }
        return fail(cudaErrorStreamCaptureUnsupported, {c},
                    "%s during stream capture: stream %p is capturing; its work is recorded, not "
                    "run (cudaErrorStreamCaptureUnsupported; the capture is invalidated)",
                    fn, (void *)norm(s));
    }
    return norm(s) == cudaStreamLegacy ? legacy_conflict(fn) : cudaSuccess;
}

cudaError_t capture_device_wait(const char *fn) {
    LOCK;
    if (g_captures.empty()) return cudaSuccess;
    std::vector<capture *> all;
    for (auto &c : g_captures)
        all.push_back(&c.second);
    return fail(
        cudaErrorStreamCaptureUnsupported, all,
        "%s during stream capture: stream %p is capturing (cudaErrorStreamCaptureUnsupported; "
        "the capture is invalidated)",
        fn, (void *)g_captures.begin()->first);
}

cudaError_t capture_unsafe_call(const char *fn) {
    LOCK;
    if (t_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    const std::thread::id me = std::this_thread::get_id();
    std::vector<capture *> v;
    cudaStream_t first = nullptr;
    for (auto &c : g_captures) {
        const bool mine = c.second.thread == me && c.second.mode != cudaStreamCaptureModeRelaxed;
        const bool global =
            t_mode == cudaStreamCaptureModeGlobal && c.second.mode == cudaStreamCaptureModeGlobal;
        if (mine || global) {
            if (v.empty()) first = c.first;
            v.push_back(&c.second);
        }
    }
    if (v.empty()) return cudaSuccess;
    return fail(
        cudaErrorStreamCaptureUnsupported, v,
        "%s during stream capture: a potentially unsafe call while stream %p captures in %s "
        "mode (cudaErrorStreamCaptureUnsupported; the capture is invalidated); make it "
        "before the capture, or in relaxed mode (cudaThreadExchangeStreamCaptureMode)",
        fn, (void *)first, mode_name(v[0]->mode));
}

cudaError_t capture_legacy_sync(const char *fn) {
    LOCK;
    cudaError_t e = legacy_conflict(fn);
    return e ? e : capture_unsafe_call(fn);
}

cudaError_t capture_event_wait(const char *fn, cudaEvent_t ev) {
    LOCK;
    auto it = g_event_capture.find(ev);
    cudaStream_t s = nullptr;
    capture *c = it == g_event_capture.end() ? nullptr : by_id(it->second, &s);
    if (!c) return cudaSuccess;
    return fail(cudaErrorCapturedEvent, {c},
                "%s during stream capture: event %p was last recorded in the capture of stream %p "
                "(cudaErrorCapturedEvent; the capture is invalidated)",
                fn, (void *)ev, (void *)s);
}

cudaError_t capture_wait_event(cudaStream_t s, cudaEvent_t ev, unsigned flags) {
    LOCK;
    bool record = false;
    if (cudaError_t e = capture_enqueue("cudaStreamWaitEvent", s, &record)) return e;
    auto it = g_event_capture.find(ev);
    cudaStream_t from = nullptr;
    capture *ec = it == g_event_capture.end() ? nullptr : by_id(it->second, &from);
    if (record) {
        capture *c = find(s);
        if (ec == c) return cudaSuccess; // in stream order already
        if (ec)
            return fail(cudaErrorStreamCaptureMerge, {c, ec},
                        "cudaStreamWaitEvent during stream capture: stream %p would merge with the "
                        "capture of stream %p (cudaErrorStreamCaptureMerge; the captures are "
                        "invalidated)",
                        (void *)norm(s), (void *)from);
        if (flags & cudaEventWaitExternal) return cudaSuccess; // replays are synchronous
        return fail(cudaErrorStreamCaptureIsolation, {c},
                    "cudaStreamWaitEvent during stream capture: stream %p waits for event %p, "
                    "which is not part of its capture (cudaErrorStreamCaptureIsolation; the "
                    "capture is invalidated; cudaEventWaitExternal makes it an external wait)",
                    (void *)norm(s), (void *)ev);
    }
    if (!ec) return cudaSuccess;
    return fail(cudaErrorNotSupported, {ec},
                "cudaStreamWaitEvent during stream capture: stream %p would join the capture of "
                "stream %p by waiting for its event %p; a capture across streams is not emulated "
                "(the capture is invalidated)",
                (void *)norm(s), (void *)from, (void *)ev);
}

cudaError_t capture_stream_destroy(cudaStream_t s) {
    LOCK;
    if (!find(s)) return cudaSuccess;
    return api_error(cudaErrorIllegalState, false,
                     "cudaStreamDestroy during stream capture: stream %p is capturing; end the "
                     "capture first",
                     (void *)s);
}

void capture_forget_event(cudaEvent_t ev) {
    LOCK;
    g_event_capture.erase(ev);
}

void capture_reset() {
    LOCK;
    for (auto &c : g_captures)
        delete c.second.graph;
    g_captures.clear();
    g_event_capture.clear();
    for (CUgraph_st *g : g_graphs)
        delete g;
    for (CUgraphExec_st *x : g_execs)
        delete x;
    g_graphs.clear();
    g_execs.clear();
}

} // namespace luna_emu

using namespace luna_emu;

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    LOCK;
    if (sticky_error()) return sticky_error();
    if (!stream_valid(s))
        return api_error(cudaErrorInvalidResourceHandle, false,
                         "cudaStreamBeginCapture: unknown stream %p", (void *)s);
    if (norm(s) == cudaStreamLegacy)
        return api_error(cudaErrorStreamCaptureUnsupported, false,
                         "cudaStreamBeginCapture: the legacy (NULL) stream cannot be captured");
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return api_error(cudaErrorInvalidValue, false, "cudaStreamBeginCapture: mode %d",
                         (int)mode);
    if (find(s))
        return api_error(cudaErrorIllegalState, false,
                         "cudaStreamBeginCapture: stream %p is capturing already", (void *)s);
    capture c;
    c.id = g_next_id++;
    c.mode = mode;
    c.thread = std::this_thread::get_id();
    c.graph = new CUgraph_st;
    g_captures[norm(s)] = c;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    LOCK;
    capture *c = find(s);
    if (!c)
        return api_error(cudaErrorIllegalState, false,
                         "cudaStreamEndCapture: stream %p is not capturing", (void *)s);
    if (!graph) return api_error(cudaErrorInvalidValue, false, "cudaStreamEndCapture: graph NULL");
    if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
        return api_error(cudaErrorStreamCaptureWrongThread, false,
                         "cudaStreamEndCapture: the %s-mode capture of stream %p began in "
                         "another thread",
                         mode_name(c->mode), (void *)s);
    const capture done = *c;
    g_captures.erase(norm(s));
    for (auto it = g_event_capture.begin(); it != g_event_capture.end();)
        it = it->second == done.id ? g_event_capture.erase(it) : std::next(it);
    if (done.invalidated) {
        delete done.graph;
        *graph = nullptr;
        return api_error(cudaErrorStreamCaptureInvalidated, false,
                         "cudaStreamEndCapture: the capture of stream %p was invalidated (by: %s); "
                         "no graph",
                         (void *)s, done.why.c_str());
    }
    g_graphs.insert(done.graph);
    *graph = done.graph;
    return cudaSuccess;
}

static cudaError_t capture_info(const char *fn, cudaStream_t s, cudaStreamCaptureStatus *status,
                                unsigned long long *id, cudaGraph_t *graph) {
    LOCK;
    if (!status) return api_error(cudaErrorInvalidValue, false, "%s: status NULL", fn);
    if (!stream_valid(s))
        return api_error(cudaErrorInvalidResourceHandle, false, "%s: unknown stream %p", fn,
                         (void *)s);
    // Asking the legacy stream while a blocking stream captures fails, but invalidates nothing.
    if (norm(s) == cudaStreamLegacy && !blocking_captures(nullptr).empty())
        return api_error(cudaErrorStreamCaptureImplicit, false,
                         "%s during stream capture: the legacy stream while a blocking stream "
                         "captures (cudaErrorStreamCaptureImplicit)",
                         fn);
    const capture *c = find(s);
    *status = !c               ? cudaStreamCaptureStatusNone
              : c->invalidated ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
    if (c && !c->invalidated) {
        if (id) *id = c->id;
        if (graph) *graph = c->graph; // still owned by the capture
    }
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    return capture_info("cudaStreamIsCapturing", s, status, nullptr, nullptr);
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus *status,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                     size_t *num_deps) {
    if (deps || edges || num_deps)
        return api_error(cudaErrorNotSupported, false,
                         "cudaStreamGetCaptureInfo: dependency sets are not emulated");
    return capture_info("cudaStreamGetCaptureInfo", s, status, id, graph);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
    if (!mode ||
        (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
         *mode != cudaStreamCaptureModeRelaxed))
        return api_error(cudaErrorInvalidValue, false,
                         "cudaThreadExchangeStreamCaptureMode: invalid mode");
    std::swap(t_mode, *mode);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
    LOCK;
    if (!exec || !g_graphs.count(graph))
        return api_error(cudaErrorInvalidValue, false, "cudaGraphInstantiate: %s",
                         exec ? "unknown graph" : "exec NULL");
    *exec = nullptr;
    const unsigned long long known =
        cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
        cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
    if (flags & ~known)
        return api_error(cudaErrorInvalidValue, false, "cudaGraphInstantiate: flags %#llx", flags);
    if (flags & cudaGraphInstantiateFlagDeviceLaunch)
        for (const auto &op : graph->ops)
            if (op->pageable)
                return api_error(cudaErrorInvalidValue, false,
                                 "cudaGraphInstantiate: a graph launched from the device may "
                                 "copy only device or pinned memory; it records a %s of "
                                 "pageable host memory",
                                 op->what.c_str());
    *exec = new CUgraphExec_st{graph->ops, flags};
    g_execs.insert(*exec);
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                          unsigned long long flags) {
    return cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    op_list ops;
    {
        LOCK;
        if (sticky_error()) return sticky_error();
        if (!g_execs.count(exec))
            return api_error(cudaErrorInvalidValue, false, "cudaGraphLaunch: unknown graph exec");
        if (!stream_valid(s))
            return api_error(cudaErrorInvalidResourceHandle, false,
                             "cudaGraphLaunch: unknown stream %p", (void *)s);
        bool record = false;
        if (cudaError_t e = capture_enqueue("cudaGraphLaunch", s, &record)) return e;
        if (record) { // the capturing stream's graph gets the executable graph's operations
            for (const auto &op : exec->ops) {
                if (op->run == run_event)
                    g_event_capture[static_cast<cudaEvent_t>(op->ctx)] = find(s)->id;
                capture_record(s, op);
            }
            return cudaSuccess;
        }
        ops = exec->ops;
        g_graph_launches++;
    }
    // Run without the lock, as separate launches are: a kernel takes the launch lock first.
    for (const auto &op : ops) {
        {
            LOCK;
            g_graph_nodes++;
        }
        if (cudaError_t e = op->run(op->ctx, s)) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    LOCK;
    if (!g_execs.erase(exec))
        return api_error(cudaErrorInvalidValue, false, "cudaGraphExecDestroy: unknown graph exec");
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    LOCK;
    if (!g_graphs.erase(graph))
        return api_error(cudaErrorInvalidValue, false, "cudaGraphDestroy: unknown graph");
    delete graph;
    return cudaSuccess;
}

uint64_t luna_emu_graph_launch_count(void) {
    LOCK;
    return g_graph_launches;
}
uint64_t luna_emu_graph_node_count(void) {
    LOCK;
    return g_graph_nodes;
}

} // extern "C"
