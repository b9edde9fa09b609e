/* Helpers shared by the CUDA backend's op files (cuda_ops.c, cuda_ops_optim.c). */
#ifndef LUNA_KERNELS_CUDA_OPS_UTIL_H
#define LUNA_KERNELS_CUDA_OPS_UTIL_H

#include "core/allocator.h"
#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"

static inline cudaStream_t stream(const luna_backend *be) { return luna_cuda_impl_of(be)->stream; }
static inline int bf16(const luna_backend *be) { return luna_cuda_impl_of(be)->bf16; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Launch status of a kernel as the op's status. */
#define LAUNCH(op, call) return luna_cuda_check((call), op)
#define BAD(...) return luna_error(LUNA_ERR_INVALID_ARGUMENT, __VA_ARGS__)
#define WRITES(p, n) luna_cuda_weights_written(be, (p), (size_t)(n) * sizeof(float))

/* n doubles of scratch (at least one), or an out-of-memory error naming the op. */
static inline luna_status scratch_doubles(luna_backend *be, const char *op, int64_t n,
                                          double **out) {
    *out = luna_arena_alloc(be->scratch, (size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!*out) {
        luna_error_prefix("%s: scratch for %lld doubles", op, (long long)n);
        return LUNA_ERR_OUT_OF_MEMORY;
    }
    return LUNA_OK;
}

/* Return the status of `call`, a launcher that sums columns (bias gradients, LayerNorm's dγ/dβ)
 * with the workspace `ws` it names: nout sums of cols columns over rows, taken from be->scratch
 * for the launch (the stream orders its reuse) and released after it. */
#define LAUNCH_WITH_COLSUM_WS(op, rows, cols, nout, call)                                          \
    do {                                                                                           \
        const luna_arena_mark mark_ = luna_arena_get_mark(be->scratch);                            \
        luna_cuda_colsum_ws ws = {NULL, luna_cuda_colsum_ws_doubles((rows), (cols), (nout))};      \
        luna_status st_ = scratch_doubles(be, op, ws.n, &ws.p);                                    \
        if (st_ == LUNA_OK) st_ = luna_cuda_check((call), op);                                     \
        luna_arena_release(be->scratch, mark_);                                                    \
        return st_;                                                                                \
    } while (0)

#endif
