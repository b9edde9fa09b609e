/* luna-cuda-emu, kernel side: what a CUDA source (.cu) needs to compile with g++ -x c++ and run
 * on the CPU. Included by model/kernels/cuda/cuda_compat.h when __CUDACC__ is not defined; never
 * include it directly from a kernel file. README.md (this directory) describes the model:
 *
 * - each CUDA thread is a fiber; a block's fibers run on one OS thread, one after the other in
 *   the order of LUNA_EMU_ORDER, switching only at __syncthreads* and the *_sync warp
 *   intrinsics, which are rendezvous points per block and per warp (32 lanes);
 * - blocks run one after the other; a launch is synchronous (it has finished when it returns);
 * - threadIdx, blockIdx, blockDim, gridDim are per fiber (macros over the current fiber);
 * - shared memory is per block and must be declared with LUNA_SHARED / LUNA_SHARED_2D /
 *   LUNA_DYNAMIC_SHARED (a plain __shared__ does not compile here, on purpose); it is a fresh
 *   malloc of exactly its size per block, filled with 0xff bytes (NaN as float);
 * - device intrinsics are computed exactly (rsqrtf is 1/sqrtf, __expf is expf): GPU results of
 *   the fast-math intrinsics differ by a few ulp, compare with the op's tolerance.
 * NVIDIA's cuda_runtime.h and cuda_bf16.h are used as they are (types, dim3, __nv_bfloat16 and
 * its host arithmetic, round-to-nearest-even conversions). */
#ifndef LUNA_CUDA_EMU_H
#define LUNA_CUDA_EMU_H

#if defined(__CUDACC__)
#error "luna_cuda_emu.h is the g++ side of cuda_compat.h; nvcc uses the CUDA headers"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "luna_cuda_emu_api.h"

#define LUNA_CUDA_EMU 1

namespace luna_emu {

/* What a fiber sees as its CUDA built-in variables. */
struct thread_state {
    uint3 tid;
    uint3 bid;
    dim3 bdim;
    dim3 gdim;
};
/* The running fiber's variables (launches are serialised, so one global suffices). */
extern thread_state *current;

enum warp_kind {
    W_SYNC,
    W_SHFL_IDX,
    W_SHFL_UP,
    W_SHFL_DOWN,
    W_SHFL_XOR,
    W_BALLOT,
    W_ANY,
    W_ALL,
    W_MATCH_ANY,
    W_REDUCE_ADD,
    W_REDUCE_MIN,
    W_REDUCE_MAX
};
enum block_kind { B_SYNC, B_COUNT, B_AND, B_OR };

/* Rendezvous of the lanes named in `mask` (all must arrive with the same kind and mask); the
 * result for the calling lane. `arg` is the lane/delta/xor mask (shuffles) or signedness
 * (reductions), `width` the shuffle segment. */
uint64_t warp_op(int kind, unsigned mask, uint64_t value, int arg, int width);
/* Rendezvous of every thread of the block; the result of __syncthreads_count/and/or. */
int block_barrier(int kind, int pred);
/* The block's storage for one LUNA_SHARED declaration (`key` identifies the declaration). */
void *shared_static(const void *key, size_t bytes, const char *name);
/* The block's dynamic shared memory (the launch's shmem bytes). */
void *shared_dynamic();
unsigned active_mask();

struct launch_desc {
    const char *name;
    const void *func;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    void *closure;
    void (*thunk)(void *closure);
    /* For a launch recorded by a stream capture: the closure copied to the heap and freed, and
     * its pointer arguments checked again at each replay. */
    void *(*clone)(const void *closure);
    void (*destroy)(void *closure);
    bool (*check)(const char *name, const void *closure);
};
/* Checks the configuration and runs every block (emu_sched.cc), or records the launch when its
 * stream captures. */
void run(const launch_desc &d);
/* A pointer argument must be NULL or point into device or cudaMallocHost memory. */
bool check_launch_pointer(const char *kernel, int index, const void *p);

template <class T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp intrinsics take values of at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> inline T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}

template <class F, class Tuple> struct closure {
    F fn;
    Tuple args;
};
template <class C> void thunk(void *p) {
    C *c = static_cast<C *>(p);
    std::apply(c->fn, c->args); /* each fiber gets its own copies of the parameters */
}
template <class T> inline bool check_arg(const char *kernel, size_t i, const T &v) {
    if constexpr (std::is_pointer<T>::value &&
                  !std::is_function<typename std::remove_pointer<T>::type>::value)
        return check_launch_pointer(kernel, (int)i, (const void *)v);
    (void)kernel, (void)i, (void)v;
    return true;
}
template <class Tuple, size_t... I>
inline bool check_args(const char *kernel, const Tuple &t, std::index_sequence<I...>) {
    bool ok = true;
    ((ok = check_arg(kernel, I, std::get<I>(t)) && ok), ...);
    return ok;
}
template <class C> void *clone_closure(const void *p) { return new C(*static_cast<const C *>(p)); }
template <class C> void destroy_closure(void *p) { delete static_cast<C *>(p); }
template <class C> bool check_closure(const char *kernel, const void *p) {
    const C *c = static_cast<const C *>(p);
    return check_args(kernel, c->args,
                      std::make_index_sequence<std::tuple_size<decltype(c->args)>::value>{});
}

/* What LUNA_LAUNCH expands to: the arguments are converted to the kernel's parameter types and
 * copied once (as CUDA does), pointer arguments are checked, then every block runs. */
template <class... P, class... A>
void launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
            cudaStream_t stream, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "LUNA_LAUNCH: wrong number of kernel arguments");
    using tuple = std::tuple<typename std::decay<P>::type...>;
    closure<void (*)(P...), tuple> c{kernel, tuple(std::forward<A>(args)...)};
    if (!check_args(name, c.args, std::index_sequence_for<P...>{})) return;
    using C = decltype(c);
    launch_desc d{name,
                  reinterpret_cast<const void *>(kernel),
                  grid,
                  block,
                  shmem,
                  stream,
                  &c,
                  &thunk<C>,
                  &clone_closure<C>,
                  &destroy_closure<C>,
                  &check_closure<C>};
    run(d);
}

} // namespace luna_emu

/* ---- launch and shared memory (the nvcc definitions are in cuda_compat.h) ------------------- */
#define LUNA_LAUNCH(kernel, grid, block, shmem, stream, ...)                                       \
    ::luna_emu::launch(#kernel, kernel, grid, block, shmem, stream, ##__VA_ARGS__)

#define LUNA_EMU_SHARED_ARRAY_(type, name, dims)                                                   \
    typedef type luna_emu_shared_t_##name dims;                                                    \
    static const char luna_emu_shared_key_##name = 0;                                              \
    luna_emu_shared_t_##name &name =                                                               \
        *static_cast<luna_emu_shared_t_##name *>(::luna_emu::shared_static(                        \
            &luna_emu_shared_key_##name, sizeof(luna_emu_shared_t_##name), #name))
#define LUNA_SHARED(type, name, count) LUNA_EMU_SHARED_ARRAY_(type, name, [count])
#define LUNA_SHARED_2D(type, name, rows, cols) LUNA_EMU_SHARED_ARRAY_(type, name, [rows][cols])
#define LUNA_DYNAMIC_SHARED(type, name)                                                            \
    type *const name = static_cast<type *>(::luna_emu::shared_dynamic())

/* A plain __shared__ would be one copy per fiber here: refuse it at compile time. */
#undef __shared__
#define __shared__ LUNA_EMU_ERROR_declare_shared_memory_with_LUNA_SHARED_not___shared__
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
/* Empty rather than __attribute__((noinline)): libstdc++ writes __attribute__((__noinline__)). */
#ifndef __noinline__
#define __noinline__
#endif

/* ---- built-in variables ---------------------------------------------------------------------- */
#define threadIdx (static_cast<const uint3 &>(::luna_emu::current->tid))
#define blockIdx (static_cast<const uint3 &>(::luna_emu::current->bid))
#define blockDim (static_cast<const dim3 &>(::luna_emu::current->bdim))
#define gridDim (static_cast<const dim3 &>(::luna_emu::current->gdim))
#define warpSize 32

/* ---- synchronisation ------------------------------------------------------------------------- */
inline void __syncthreads() { luna_emu::block_barrier(luna_emu::B_SYNC, 0); }
inline int __syncthreads_count(int p) { return luna_emu::block_barrier(luna_emu::B_COUNT, p); }
inline int __syncthreads_and(int p) { return luna_emu::block_barrier(luna_emu::B_AND, p); }
inline int __syncthreads_or(int p) { return luna_emu::block_barrier(luna_emu::B_OR, p); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    luna_emu::warp_op(luna_emu::W_SYNC, mask, 0, 0, 32);
}
inline unsigned __activemask() { return luna_emu::active_mask(); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return luna_emu::from_bits<T>(
        luna_emu::warp_op(luna_emu::W_SHFL_IDX, mask, luna_emu::to_bits(v), src, width));
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return luna_emu::from_bits<T>(
        luna_emu::warp_op(luna_emu::W_SHFL_UP, mask, luna_emu::to_bits(v), (int)delta, width));
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return luna_emu::from_bits<T>(
        luna_emu::warp_op(luna_emu::W_SHFL_DOWN, mask, luna_emu::to_bits(v), (int)delta, width));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return luna_emu::from_bits<T>(
        luna_emu::warp_op(luna_emu::W_SHFL_XOR, mask, luna_emu::to_bits(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)luna_emu::warp_op(luna_emu::W_BALLOT, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred) {
    return (int)luna_emu::warp_op(luna_emu::W_ANY, mask, pred != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int pred) {
    return (int)luna_emu::warp_op(luna_emu::W_ALL, mask, pred != 0, 0, 32);
}
template <class T> inline unsigned __match_any_sync(unsigned mask, T v) {
    return (unsigned)luna_emu::warp_op(luna_emu::W_MATCH_ANY, mask, luna_emu::to_bits(v), 0, 32);
}
#define LUNA_EMU_REDUCE_(fn, kind)                                                                 \
    inline unsigned fn(unsigned mask, unsigned v) {                                                \
        return (unsigned)luna_emu::warp_op(kind, mask, v, 0, 32);                                  \
    }                                                                                              \
    inline int fn(unsigned mask, int v) {                                                          \
        return (int)luna_emu::warp_op(kind, mask, (uint32_t)v, 1, 32);                             \
    }
LUNA_EMU_REDUCE_(__reduce_add_sync, luna_emu::W_REDUCE_ADD)
LUNA_EMU_REDUCE_(__reduce_min_sync, luna_emu::W_REDUCE_MIN)
LUNA_EMU_REDUCE_(__reduce_max_sync, luna_emu::W_REDUCE_MAX)
#undef LUNA_EMU_REDUCE_

/* ---- atomics: fibers of a launch share one OS thread, so plain read-modify-write is atomic --- */
#define LUNA_EMU_ATOMIC_(name, T, expr)                                                            \
    inline T name(T *a, T v) {                                                                     \
        T o = *a;                                                                                  \
        *a = (expr);                                                                               \
        return o;                                                                                  \
    }
#define LUNA_EMU_ATOMIC_INT_(T)                                                                    \
    LUNA_EMU_ATOMIC_(atomicAdd, T,                                                                 \
                     (T)((std::make_unsigned<T>::type)o + (std::make_unsigned<T>::type)v))         \
    LUNA_EMU_ATOMIC_(atomicSub, T,                                                                 \
                     (T)((std::make_unsigned<T>::type)o - (std::make_unsigned<T>::type)v))         \
    LUNA_EMU_ATOMIC_(atomicExch, T, v)                                                             \
    LUNA_EMU_ATOMIC_(atomicMin, T, v < o ? v : o)                                                  \
    LUNA_EMU_ATOMIC_(atomicMax, T, v > o ? v : o)                                                  \
    LUNA_EMU_ATOMIC_(atomicAnd, T, o &v)                                                           \
    LUNA_EMU_ATOMIC_(atomicOr, T, o | v)                                                           \
    LUNA_EMU_ATOMIC_(atomicXor, T, o ^ v)                                                          \
    inline T atomicCAS(T *a, T cmp, T v) {                                                         \
        T o = *a;                                                                                  \
        if (o == cmp) *a = v;                                                                      \
        return o;                                                                                  \
    }
LUNA_EMU_ATOMIC_INT_(int)
LUNA_EMU_ATOMIC_INT_(unsigned int)
LUNA_EMU_ATOMIC_INT_(unsigned long long)
LUNA_EMU_ATOMIC_INT_(long long)
LUNA_EMU_ATOMIC_(atomicAdd, float, o + v)
LUNA_EMU_ATOMIC_(atomicAdd, double, o + v)
LUNA_EMU_ATOMIC_(atomicExch, float, v)
LUNA_EMU_ATOMIC_(atomicAdd, __nv_bfloat16,
                 __float2bfloat16(__bfloat162float(o) + __bfloat162float(v)))
LUNA_EMU_ATOMIC_(atomicInc, unsigned int, o >= v ? 0u : o + 1u)
LUNA_EMU_ATOMIC_(atomicDec, unsigned int, (o == 0u || o > v) ? v : o - 1u)
#undef LUNA_EMU_ATOMIC_INT_
#undef LUNA_EMU_ATOMIC_

/* ---- math and bit intrinsics (exact versions of CUDA's) -------------------------------------- */
/* CUDA device code sees the classification functions unqualified, as C does. */
using std::isfinite;
using std::isinf;
using std::isnan;
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
/* The _rn add/sub/mul are never contracted into an FMA by nvcc; g++ (GNU mode: -ffp-contract=fast)
 * would fuse x * y + z once these are inlined, so the result is pinned in a register first. */
template <typename T> inline T luna_emu_no_contract(T v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(v));
#else
    volatile T w = v;
    v = w;
#endif
    return v;
}
inline float __fadd_rn(float x, float y) { return luna_emu_no_contract(x + y); }
inline float __fsub_rn(float x, float y) { return luna_emu_no_contract(x - y); }
inline float __fmul_rn(float x, float y) { return luna_emu_no_contract(x * y); }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline double __dadd_rn(double x, double y) { return luna_emu_no_contract(x + y); }
inline double __dmul_rn(double x, double y) { return luna_emu_no_contract(x * y); }
inline double __fma_rn(double x, double y, double z) { return std::fma(x, y, z); }
inline float __saturatef(float x) {
    return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f);
} /* NaN -> 0 */
inline float normcdff(float x) { return 0.5f * std::erfc(-x * 0.70710678118654752f); }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline int __float_as_int(float x) { return luna_emu::from_bits<int>(luna_emu::to_bits(x)); }
inline unsigned __float_as_uint(float x) {
    return luna_emu::from_bits<unsigned>(luna_emu::to_bits(x));
}
inline float __int_as_float(int x) { return luna_emu::from_bits<float>(luna_emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) {
    return luna_emu::from_bits<float>(luna_emu::to_bits(x));
}
inline long long __double_as_longlong(double x) {
    return luna_emu::from_bits<long long>(luna_emu::to_bits(x));
}
inline double __longlong_as_double(long long x) {
    return luna_emu::from_bits<double>(luna_emu::to_bits(x));
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __umulhi(unsigned x, unsigned y) {
    return (unsigned)(((unsigned long long)x * y) >> 32);
}
template <class T> inline T __ldg(const T *p) { return *p; }
/* CUDA's global min/max overloads (integers and floats). */
#define LUNA_EMU_MINMAX_(T)                                                                        \
    inline T min(T a, T b) { return b < a ? b : a; }                                               \
    inline T max(T a, T b) { return a < b ? b : a; }
LUNA_EMU_MINMAX_(int)
LUNA_EMU_MINMAX_(unsigned int)
LUNA_EMU_MINMAX_(long)
LUNA_EMU_MINMAX_(unsigned long)
LUNA_EMU_MINMAX_(long long)
LUNA_EMU_MINMAX_(unsigned long long)
#undef LUNA_EMU_MINMAX_
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

#include "emu_wmma.h" /* nvcuda::wmma (CUDA's <mma.h>) */

#endif
