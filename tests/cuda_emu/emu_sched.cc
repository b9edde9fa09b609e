// luna-cuda-emu: the launch. Blocks run one after the other; a block's threads are fibers run
// in passes: each runnable fiber runs (in the pass's order) until it reaches a rendezvous
// (__syncthreads*, a *_sync warp intrinsic) or returns. After a pass every fiber waits or has
// exited; then complete warp groups are released first (all lanes of the mask waiting at the
// same intrinsic with the same mask), else the block barrier (all threads of the block waiting
// at it); when neither is possible the kernel is broken (deadlock, a barrier missed by exited
// threads, a mask naming an exited lane) and the harness says which thread waits for what.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "emu_internal.h"
#include "luna_cuda_emu.h"

namespace luna_emu {

thread_state *current = nullptr;

namespace {

enum { RUNNABLE, AT_BLOCK, AT_WARP, DONE };
const char *const k_warp_names[] = {"__syncwarp",        "__shfl_sync",       "__shfl_up_sync",
                                    "__shfl_down_sync",  "__shfl_xor_sync",   "__ballot_sync",
                                    "__any_sync",        "__all_sync",        "__match_any_sync",
                                    "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync"};
const char *const k_block_names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                     "__syncthreads_or"};
const size_t k_static_shared_max = 48 * 1024; // per block, as on every CUDA GPU
const size_t k_dynamic_shared_max = 232448;   // sm_90 opt-in maximum (227 KiB)

struct emu_thread {
    thread_state st;
    fiber f;
    int linear = 0, state = DONE;
    int kind = 0, arg = 0, width = 32; // what it waits at
    unsigned mask = 0;
    uint64_t value = 0, result = 0;
};
struct shared_alloc {
    const void *key;
    void *ptr;
    size_t bytes;
};
struct block_state {
    const launch_desc *d = nullptr;
    int n = 0;
    std::vector<shared_alloc> shared;
    size_t static_bytes = 0;
    void *dynamic = nullptr;
    bool failed = false;
};

std::mutex g_mutex; // one launch at a time (fibers of a launch share one OS thread)
std::vector<emu_thread> g_threads;
block_state g_block;
emu_thread *g_cur = nullptr;
bool g_order_set = false;
luna_emu_order g_order = LUNA_EMU_FORWARD;
uint64_t g_seed = 1, g_rng = 1;
uint64_t g_launches = 0;

void init_order() {
    if (g_order_set) return;
    g_order_set = true;
    const char *env = getenv("LUNA_EMU_ORDER");
    if (!env || !*env || !strcmp(env, "forward")) return;
    if (!strcmp(env, "reverse")) {
        g_order = LUNA_EMU_REVERSE;
    } else if (!strncmp(env, "random", 6) && (env[6] == 0 || env[6] == ':')) {
        g_order = LUNA_EMU_RANDOM;
        g_seed = g_rng = env[6] ? strtoull(env + 7, nullptr, 10) : 1;
    } else {
        fprintf(stderr,
                "luna-cuda-emu: LUNA_EMU_ORDER=%s is not forward, reverse or random[:SEED]\n", env);
        abort();
    }
}

uint64_t next_random() { // splitmix64
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <class T> void arrange(std::vector<T> &v) {
    for (size_t i = 0; i < v.size(); i++)
        v[i] = (T)i;
    if (g_order == LUNA_EMU_REVERSE) {
        for (size_t i = 0; i < v.size() / 2; i++)
            std::swap(v[i], v[v.size() - 1 - i]);
    } else if (g_order == LUNA_EMU_RANDOM) {
        for (size_t i = v.size(); i > 1; i--)
            std::swap(v[i - 1], v[next_random() % i]);
    }
}

// A broken kernel: one line naming kernel, block, thread and the thread order, then abort (or,
// in record mode, the sticky error cudaErrorLaunchFailure and the launch stops).
void kernel_error(const emu_thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kernel_error(const emu_thread *t, const char *fmt, ...) {
    char what[512], where[160] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (t)
        snprintf(where, sizeof where, ", thread (%u,%u,%u) (warp %d, lane %d)", t->st.tid.x,
                 t->st.tid.y, t->st.tid.z, t->linear / 32, t->linear % 32);
    const uint3 b = g_threads.empty() ? uint3{0, 0, 0} : g_threads[0].st.bid;
    char order[48];
    if (g_order == LUNA_EMU_RANDOM)
        snprintf(order, sizeof order, "random:%llu", (unsigned long long)g_seed);
    else
        snprintf(order, sizeof order, "%s", luna_emu_order_name(g_order));
    api_error(cudaErrorLaunchFailure, true, "kernel %s, block (%u,%u,%u)%s, order %s: %s",
              g_block.d->name, b.x, b.y, b.z, where, order, what);
    if (error_mode() == LUNA_EMU_ABORT) abort();
    g_block.failed = true;
}

// An error found by the running fiber itself: report it and never resume this fiber.
void fiber_error(const char *what) {
    kernel_error(g_cur, "%s", what);
    g_cur->state = DONE;
    fiber_yield(&g_cur->f, true);
}

void thread_entry(void *arg) {
    fiber_started();
    emu_thread *t = static_cast<emu_thread *>(arg);
    g_block.d->thunk(g_block.d->closure);
    t->state = DONE;
    fiber_yield(&t->f, true);
}

emu_thread &require_fiber(const char *what) {
    if (!g_cur) {
        fprintf(stderr, "luna-cuda-emu: %s called outside a kernel\n", what);
        abort();
    }
    return *g_cur;
}

// The lane a shuffle reads (PTX shfl.sync semantics: the segment of `width` lanes, clamped).
int shuffle_source(int kind, int lane, int b, int width) {
    int seg = 32 - width, max_lane = (lane & seg) | ((kind == W_SHFL_UP ? 0 : 31) & ~seg), j;
    bool ok;
    switch (kind) {
    case W_SHFL_UP:
        j = lane - b;
        ok = j >= max_lane;
        break;
    case W_SHFL_DOWN:
        j = lane + b;
        ok = j <= max_lane;
        break;
    case W_SHFL_XOR:
        j = lane ^ b;
        ok = j <= max_lane;
        break;
    default:
        j = (lane & seg) | (b & ~seg & 31);
        ok = j <= max_lane;
        break;
    }
    return ok ? j : lane;
}

// Releases the warp group that `t` waits in if complete; false if not ready yet.
bool release_warp_group(emu_thread &t) {
    const int base = t.linear & ~31;
    const unsigned m = t.mask;
    const char *name = k_warp_names[t.kind];
    for (int b = 0; b < 32; b++) {
        if (!(m >> b & 1)) continue;
        if (base + b >= g_block.n) {
            kernel_error(&t, "%s mask 0x%08x names lane %d, which does not exist (%d threads)",
                         name, m, b, g_block.n);
            return false;
        }
        emu_thread &u = g_threads[(size_t)(base + b)];
        if (u.state == DONE) {
            kernel_error(&t, "%s mask 0x%08x names lane %d, which has exited", name, m, b);
            return false;
        }
        if (u.state != AT_WARP || u.mask != m || u.kind != t.kind) return false;
    }
    uint64_t ballot = 0;
    for (int b = 0; b < 32; b++)
        if ((m >> b & 1) && g_threads[(size_t)(base + b)].value) ballot |= 1ull << b;
    for (int b = 0; b < 32; b++) {
        if (!(m >> b & 1)) continue;
        emu_thread &u = g_threads[(size_t)(base + b)];
        uint64_t r = 0;
        if (u.kind >= W_SHFL_IDX && u.kind <= W_SHFL_XOR) {
            int j = shuffle_source(u.kind, b, u.arg, u.width);
            if (!(m >> j & 1)) {
                kernel_error(&u, "%s reads lane %d, which is not in mask 0x%08x", name, j, m);
                return false;
            }
            r = g_threads[(size_t)(base + j)].value;
        } else if (u.kind == W_BALLOT) {
            r = ballot;
        } else if (u.kind == W_ANY) {
            r = ballot != 0;
        } else if (u.kind == W_ALL) {
            r = ballot == m;
        } else if (u.kind >= W_MATCH_ANY) {
            int64_t acc = u.kind == W_REDUCE_ADD ? 0 : (int64_t)(int32_t)(uint32_t)u.value;
            for (int c = 0; c < 32; c++) {
                if (!(m >> c & 1)) continue;
                uint64_t v = g_threads[(size_t)(base + c)].value;
                int64_t x = u.arg ? (int64_t)(int32_t)(uint32_t)v : (int64_t)(uint32_t)v;
                if (u.kind == W_MATCH_ANY)
                    r |= (uint64_t)(v == u.value) << c;
                else if (u.kind == W_REDUCE_ADD)
                    acc += x;
                else if (u.kind == W_REDUCE_MIN)
                    acc = c == __builtin_ctz(m) || x < acc ? x : acc;
                else
                    acc = c == __builtin_ctz(m) || x > acc ? x : acc;
            }
            if (u.kind != W_MATCH_ANY) r = (uint32_t)acc;
        }
        u.result = r;
    }
    for (int b = 0; b < 32; b++)
        if (m >> b & 1) g_threads[(size_t)(base + b)].state = RUNNABLE;
    return true;
}

// Describes why nothing can proceed (the first waiting thread and what it waits for).
void report_deadlock() {
    for (emu_thread &t : g_threads) {
        if ((int)(&t - g_threads.data()) >= g_block.n || t.state != AT_WARP) continue;
        const int base = t.linear & ~31;
        for (int b = 0; b < 32; b++) {
            emu_thread &u = g_threads[(size_t)(base + b)];
            if (!(t.mask >> b & 1) || (u.state == AT_WARP && u.mask == t.mask && u.kind == t.kind))
                continue;
            if (u.state == AT_WARP)
                kernel_error(&t, "%s mask 0x%08x: lane %d waits at %s mask 0x%08x instead",
                             k_warp_names[t.kind], t.mask, b, k_warp_names[u.kind], u.mask);
            else
                kernel_error(&t, "%s mask 0x%08x: lane %d waits at %s instead (deadlock)",
                             k_warp_names[t.kind], t.mask, b, k_block_names[u.kind]);
            return;
        }
    }
    kernel_error(nullptr, "deadlock (no thread can proceed)");
}

// After a pass: release what can proceed. False when the block is finished or broken.
bool resolve() {
    int done = 0, at_block = 0;
    for (int i = 0; i < g_block.n; i++) {
        done += g_threads[(size_t)i].state == DONE;
        at_block += g_threads[(size_t)i].state == AT_BLOCK;
    }
    if (done == g_block.n) return false;
    bool released = false;
    for (int i = 0; i < g_block.n && !g_block.failed; i++) {
        emu_thread &t = g_threads[(size_t)i];
        if (t.state == AT_WARP && release_warp_group(t)) released = true;
    }
    if (released || g_block.failed) return !g_block.failed;
    if (at_block > 0 && at_block + done == g_block.n) {
        const emu_thread *first = nullptr;
        int count = 0, all = 1, any = 0, kind = 0;
        for (int i = 0; i < g_block.n; i++)
            if (g_threads[(size_t)i].state == AT_BLOCK) kind = g_threads[(size_t)i].kind;
        for (int i = 0; i < g_block.n; i++) {
            const emu_thread &t = g_threads[(size_t)i];
            if (t.state == DONE) {
                kernel_error(&t, "exited before a %s that %d of the block's %d threads wait at",
                             k_block_names[kind], at_block, g_block.n);
                return false;
            }
            if (first && t.kind != first->kind) {
                kernel_error(&t, "waits at %s while thread (%u,%u,%u) waits at %s",
                             k_block_names[t.kind], first->st.tid.x, first->st.tid.y,
                             first->st.tid.z, k_block_names[first->kind]);
                return false;
            }
            first = &t;
            count += t.value != 0, all &= t.value != 0, any |= t.value != 0;
        }
        for (int i = 0; i < g_block.n; i++) {
            emu_thread &t = g_threads[(size_t)i];
            t.result = t.kind == B_COUNT ? (uint64_t)count : t.kind == B_AND ? all : any;
            t.state = RUNNABLE;
        }
        return true;
    }
    report_deadlock();
    return false;
}

void run_block(uint3 bid, std::vector<int> &order) {
    const launch_desc &d = *g_block.d;
    g_block.failed = false;
    g_block.static_bytes = 0;
    g_block.dynamic = malloc(d.shmem); // exactly the launch's bytes: ASan sees an overrun
    if (d.shmem) memset(g_block.dynamic, 0xff, d.shmem);
    for (int i = 0; i < g_block.n; i++) {
        emu_thread &t = g_threads[(size_t)i];
        unsigned bx = d.block.x, bxy = d.block.x * d.block.y;
        t.st = thread_state{{i % bx, (i % bxy) / bx, i / bxy}, bid, d.block, d.grid};
        t.linear = i;
        t.state = RUNNABLE;
        fiber_make(&t.f, i, thread_entry, &t);
    }
    do {
        arrange(order);
        for (int i : order) {
            emu_thread &t = g_threads[(size_t)i];
            if (t.state != RUNNABLE) continue;
            g_cur = &t;
            current = &t.st;
            fiber_switch_to(&t.f);
            g_cur = nullptr;
            current = nullptr;
            if (g_block.failed) break;
        }
    } while (!g_block.failed && resolve());
    for (shared_alloc &a : g_block.shared)
        free(a.ptr);
    g_block.shared.clear();
    free(g_block.dynamic);
}

} // namespace

uint64_t warp_op(int kind, unsigned mask, uint64_t value, int arg, int width) {
    emu_thread &t = require_fiber(k_warp_names[kind]);
    char what[160];
    if (!(mask >> (t.linear % 32) & 1)) {
        snprintf(what, sizeof what, "%s: the calling lane %d is not in mask 0x%08x",
                 k_warp_names[kind], t.linear % 32, mask);
        fiber_error(what);
    }
    if (width < 1 || width > 32 || (width & (width - 1))) {
        snprintf(what, sizeof what, "%s: width %d is not a power of 2 in [1, 32]",
                 k_warp_names[kind], width);
        fiber_error(what);
    }
    t.state = AT_WARP, t.kind = kind, t.mask = mask, t.value = value, t.arg = arg, t.width = width;
    fiber_yield(&t.f, false);
    return t.result;
}

int block_barrier(int kind, int pred) {
    emu_thread &t = require_fiber(k_block_names[kind]);
    t.state = AT_BLOCK, t.kind = kind, t.value = pred != 0;
    fiber_yield(&t.f, false);
    return (int)t.result;
}

void *shared_static(const void *key, size_t bytes, const char *name) {
    require_fiber("LUNA_SHARED");
    for (shared_alloc &a : g_block.shared)
        if (a.key == key) return a.ptr;
    g_block.static_bytes += bytes;
    if (g_block.static_bytes > k_static_shared_max ||
        g_block.static_bytes + g_block.d->shmem > k_dynamic_shared_max) {
        char what[200];
        snprintf(what, sizeof what,
                 "LUNA_SHARED %s: %zu bytes of static shared memory (+ %zu "
                 "dynamic) exceed 48 KiB static / 227 KiB in all",
                 name, g_block.static_bytes, g_block.d->shmem);
        fiber_error(what);
    }
    void *p = malloc(bytes);
    memset(p, 0xff, bytes); // uninitialised shared memory reads as NaN / -1
    g_block.shared.push_back({key, p, bytes});
    return p;
}

void *shared_dynamic() {
    require_fiber("LUNA_DYNAMIC_SHARED");
    return g_block.dynamic;
}

unsigned active_mask() {
    emu_thread &t = require_fiber("__activemask");
    unsigned m = 0;
    for (int b = 0, base = t.linear & ~31; b < 32 && base + b < g_block.n; b++)
        if (g_threads[(size_t)(base + b)].state != DONE) m |= 1u << b;
    return m;
}

namespace {

// Runs every block of a checked launch (g_mutex held).
void execute(const launch_desc &d) {
    const uint64_t threads = (uint64_t)d.block.x * d.block.y * d.block.z;
    const uint64_t blocks = (uint64_t)d.grid.x * d.grid.y * d.grid.z;
    g_block.d = &d;
    g_block.n = (int)threads;
    if (g_threads.size() < threads) g_threads.resize(threads);
    std::vector<int> order(threads);
    std::vector<uint64_t> block_order(blocks);
    arrange(block_order);
    for (uint64_t i = 0; i < blocks && !g_block.failed; i++) {
        uint64_t b = block_order[i];
        run_block(uint3{(unsigned)(b % d.grid.x), (unsigned)(b / d.grid.x % d.grid.y),
                        (unsigned)(b / ((uint64_t)d.grid.x * d.grid.y))},
                  order);
    }
    g_block.failed = false;
    g_block.d = nullptr;
}

// A launch recorded by a stream capture: its descriptor and its own copy of the closure.
struct recorded_launch {
    launch_desc d;
    ~recorded_launch() { d.destroy(d.closure); }
};

// One replay of a recorded launch (cudaGraphLaunch), on the graph's stream. The pointer arguments
// are checked again: the memory they name may have been freed since the capture.
cudaError_t replay_launch(void *ctx, cudaStream_t s) {
    recorded_launch *r = static_cast<recorded_launch *>(ctx);
    if (!r->d.check(r->d.name, r->d.closure)) return sticky_error();
    std::lock_guard<std::mutex> lock(g_mutex);
    init_order();
    if (sticky_error() != cudaSuccess) return sticky_error();
    launch_desc d = r->d;
    d.stream = s;
    execute(d);
    return sticky_error();
}

} // namespace

void run(const launch_desc &d) {
    std::lock_guard<std::mutex> lock(g_mutex);
    init_order();
    g_launches++;
    if (sticky_error() != cudaSuccess) return; // a broken context runs nothing
    if (!stream_valid(d.stream)) {
        api_error(cudaErrorInvalidResourceHandle, false, "kernel %s: unknown stream", d.name);
        return;
    }
    const uint64_t threads = (uint64_t)d.block.x * d.block.y * d.block.z;
    const uint64_t blocks = (uint64_t)d.grid.x * d.grid.y * d.grid.z;
    if (threads == 0 || threads > 1024 || d.block.x > 1024 || d.block.y > 1024 || d.block.z > 64 ||
        blocks == 0 || d.grid.x > 2147483647u || d.grid.y > 65535 || d.grid.z > 65535) {
        capture_failed(
            d.stream,
            api_error(cudaErrorInvalidConfiguration, false,
                      "kernel %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)", d.name,
                      d.grid.x, d.grid.y, d.grid.z, d.block.x, d.block.y, d.block.z));
        return;
    }
    if (d.shmem > 48 * 1024 &&
        (d.shmem > k_dynamic_shared_max || (size_t)func_max_dynamic_shared(d.func) < d.shmem)) {
        capture_failed(
            d.stream, api_error(cudaErrorInvalidValue, false,
                                "kernel %s: %zu bytes of dynamic shared memory need "
                                "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) "
                                "and at most %zu",
                                d.name, d.shmem, k_dynamic_shared_max));
        return;
    }
    char what[256];
    snprintf(what, sizeof what, "kernel %s", d.name);
    bool record = false;
    if (capture_enqueue(what, d.stream, &record) != cudaSuccess) return;
    if (record) { // counted above, run only by the graph's launches
        launch_desc copy = d;
        copy.closure = d.clone(d.closure);
        capture_record(d.stream,
                       make_graph_op(what, new recorded_launch{copy}, replay_launch,
                                     [](void *p) { delete static_cast<recorded_launch *>(p); }));
        return;
    }
    execute(d);
}

} // namespace luna_emu

extern "C" {

void luna_emu_set_order(luna_emu_order order, uint64_t seed) {
    std::lock_guard<std::mutex> lock(luna_emu::g_mutex);
    luna_emu::g_order_set = true;
    luna_emu::g_order = order;
    luna_emu::g_seed = luna_emu::g_rng = seed;
}

luna_emu_order luna_emu_get_order(void) {
    std::lock_guard<std::mutex> lock(luna_emu::g_mutex);
    luna_emu::init_order();
    return luna_emu::g_order;
}

const char *luna_emu_order_name(luna_emu_order order) {
    return order == LUNA_EMU_REVERSE ? "reverse" : order == LUNA_EMU_RANDOM ? "random" : "forward";
}

uint64_t luna_emu_launch_count(void) { return luna_emu::g_launches; }

} // extern "C"
