/* Reductions to a device scalar (the optimizer's per-tensor norms and products, spec apollo.md)
 * and the backward of the differentiable ones.
 *
 * Determinism. Every sum is accumulated in double in a FIXED order that does not depend on the
 * thread count:
 *   - x [n] is cut into blocks of LUNA_REDUCE_BLOCK = 4096 elements (the last may be shorter);
 *   - block k's partial P_k = Σ_{lane=0..7} L_lane, where L_lane is the sequential double sum of
 *     the block's elements i ≡ lane (mod 8) in increasing i (eight lanes, so the compiler can keep
 *     them in two AVX registers; the order is still fixed by the code, not by the compiler);
 *   - the result is ((P_0 + P_1) + P_2) + ... in block order, rounded once to float.
 * Threads only decide WHO computes which P_k, never how it is computed or combined, so the
 * result is bit-identical for 1, 2, 3, ... threads. Partials of more than LUNA_REDUCE_STACK blocks
 * live in be->scratch (8 bytes per 4096 elements).
 *
 * max_abs is exact in any order; it returns NaN if any element is NaN (so a non-finite gradient
 * cannot hide behind a finite maximum).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/allocator.h"
#include "core/tensor_table.h"
#include "model/kernels/cpu/cpu_ops.h"

#define LUNA_REDUCE_BLOCK 4096
#define LUNA_REDUCE_LANES 8
#define LUNA_REDUCE_STACK 256   /* blocks whose partials fit on the stack (1M elements) */
#define LUNA_PARALLEL_MIN 65536 /* below this, elementwise loops run on one thread */

typedef enum { RED_SUM, RED_SQUARES, RED_POW4, RED_DOT } reduce_kind;

/* P_k for the block x[0, len) (and y for RED_DOT), len <= LUNA_REDUCE_BLOCK. */
static double block_partial(reduce_kind kind, const float *restrict x, const float *restrict y,
                            int64_t len) {
    double lane[LUNA_REDUCE_LANES] = {0};
    int64_t full = len - len % LUNA_REDUCE_LANES, i = 0;
    switch (kind) {
    case RED_SUM:
        for (; i < full; i += LUNA_REDUCE_LANES)
            for (int l = 0; l < LUNA_REDUCE_LANES; l++)
                lane[l] += (double)x[i + l];
        for (; i < len; i++)
            lane[i - full] += (double)x[i];
        break;
    case RED_SQUARES:
        for (; i < full; i += LUNA_REDUCE_LANES)
            for (int l = 0; l < LUNA_REDUCE_LANES; l++) {
                double v = (double)x[i + l];
                lane[l] += v * v;
            }
        for (; i < len; i++)
            lane[i - full] += (double)x[i] * (double)x[i];
        break;
    case RED_POW4:
        for (; i < full; i += LUNA_REDUCE_LANES)
            for (int l = 0; l < LUNA_REDUCE_LANES; l++) {
                double v = (double)x[i + l] * (double)x[i + l];
                lane[l] += v * v;
            }
        for (; i < len; i++) {
            double v = (double)x[i] * (double)x[i];
            lane[i - full] += v * v;
        }
        break;
    case RED_DOT:
        for (; i < full; i += LUNA_REDUCE_LANES)
            for (int l = 0; l < LUNA_REDUCE_LANES; l++)
                lane[l] += (double)x[i + l] * (double)y[i + l];
        for (; i < len; i++)
            lane[i - full] += (double)x[i] * (double)y[i];
        break;
    }
    double s = 0.0;
    for (int l = 0; l < LUNA_REDUCE_LANES; l++)
        s += lane[l];
    return s;
}

/* result = Σ_k P_k in block order (see the file comment). x, y [n]. */
static luna_status blocked_reduce(luna_backend *be, const char *what, float *result,
                                  reduce_kind kind, const float *x, const float *y, int64_t n) {
    if (!result || n < 0 || (n > 0 && (!x || (kind == RED_DOT && !y))))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: null pointer or negative size (n=%lld)",
                          what, (long long)n);
    int64_t nblocks = (n + LUNA_REDUCE_BLOCK - 1) / LUNA_REDUCE_BLOCK;
    double stack_partials[LUNA_REDUCE_STACK];
    double *partials = stack_partials;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    if (nblocks > LUNA_REDUCE_STACK) {
        partials = luna_arena_alloc(be->scratch, (size_t)nblocks * sizeof *partials);
        if (!partials) {
            luna_error_prefix("%s: scratch for %lld block partials", what, (long long)nblocks);
            return LUNA_ERR_OUT_OF_MEMORY;
        }
    }
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (nblocks > 4)
    for (int64_t k = 0; k < nblocks; k++) {
        int64_t start = k * LUNA_REDUCE_BLOCK;
        int64_t len = n - start < LUNA_REDUCE_BLOCK ? n - start : LUNA_REDUCE_BLOCK;
        partials[k] = block_partial(kind, x + start, kind == RED_DOT ? y + start : NULL, len);
    }
    double total = 0.0;
    for (int64_t k = 0; k < nblocks; k++)
        total += partials[k];
    luna_arena_release(be->scratch, mark);
    *result = (float)total;
    return LUNA_OK;
}

/* result = Σ x², x [n]. */
luna_status luna_cpu_sum_squares(luna_backend *be, float *result, const float *x, int64_t n) {
    return blocked_reduce(be, "sum_squares", result, RED_SQUARES, x, NULL, n);
}

/* result = Σ x⁴, x [n]. */
luna_status luna_cpu_sum_pow4(luna_backend *be, float *result, const float *x, int64_t n) {
    return blocked_reduce(be, "sum_pow4", result, RED_POW4, x, NULL, n);
}

/* result = Σ x·y, x, y [n]. */
luna_status luna_cpu_dot(luna_backend *be, float *result, const float *x, const float *y,
                         int64_t n) {
    return blocked_reduce(be, "dot", result, RED_DOT, x, y, n);
}

/* result = Σ x, x [n]. */
luna_status luna_cpu_sum(luna_backend *be, float *result, const float *x, int64_t n) {
    return blocked_reduce(be, "sum", result, RED_SUM, x, NULL, n);
}

/* result[i] = Σ x_i² for every tensor i of the table (core/backend.h multi_sum_squares): the
 * block partials of all tensors in one parallel pass (tt's global blocks are reduce.c's blocks),
 * then each tensor's partials combined in block order, as blocked_reduce does. */
luna_status luna_cpu_multi_sum_squares(luna_backend *be, float *result, const float *x,
                                       const luna_tensor_table *tt) {
    _Static_assert(LUNA_TENSOR_TABLE_BLOCK == LUNA_REDUCE_BLOCK, "one blocking");
    if (!tt || (tt->num_tensors > 0 && !result) || (tt->num_elements > 0 && !x))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "multi_sum_squares: null pointer");
    const int64_t nblocks = tt->num_blocks;
    double *partials = tt->workspace;
    const int64_t *offsets = tt->offsets, *numels = tt->numels, *bstart = tt->block_start;
    const int32_t *btensor = tt->block_tensor;
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (nblocks > 4)
    for (int64_t k = 0; k < nblocks; k++) {
        int i = btensor[k];
        int64_t start = (k - bstart[i]) * LUNA_REDUCE_BLOCK;
        int64_t len = numels[i] - start < LUNA_REDUCE_BLOCK ? numels[i] - start : LUNA_REDUCE_BLOCK;
        partials[k] = block_partial(RED_SQUARES, x + offsets[i] + start, NULL, len);
    }
    for (int i = 0; i < tt->num_tensors; i++) {
        double total = 0.0;
        for (int64_t k = bstart[i]; k < bstart[i + 1]; k++)
            total += partials[k];
        result[i] = (float)total;
    }
    return LUNA_OK;
}

/* result = max |x| (0 for n = 0; NaN if any x is NaN), x [n]. */
luna_status luna_cpu_max_abs(luna_backend *be, float *result, const float *x, int64_t n) {
    if (!result || n < 0 || (n > 0 && !x))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "max_abs: null pointer or negative size (n=%lld)", (long long)n);
    float best = 0.0f;
    int nan_seen = 0;
    // clang-format off
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (n > LUNA_PARALLEL_MIN) \
    reduction(max : best) reduction(| : nan_seen)
    // clang-format on
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        best = a > best ? a : best;
        nan_seen |= a != a;
    }
    *result = nan_seen ? NAN : best;
    return LUNA_OK;
}

/* dx [n] += 2·g·x  (d(Σx²)/dx for the scalar upstream gradient g). */
luna_status luna_cpu_sum_squares_backward(luna_backend *be, float *dx, const float *x, float g,
                                          int64_t n) {
    if (n < 0 || (n > 0 && (!dx || !x)))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "sum_squares_backward: bad arguments");
    float *restrict d = dx;
    const float *restrict v = x;
    const float c = 2.0f * g;
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (n > LUNA_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        d[i] += c * v[i];
    return LUNA_OK;
}

/* dx [n] += 4·g·x³. */
luna_status luna_cpu_sum_pow4_backward(luna_backend *be, float *dx, const float *x, float g,
                                       int64_t n) {
    if (n < 0 || (n > 0 && (!dx || !x)))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "sum_pow4_backward: bad arguments");
    float *restrict d = dx;
    const float *restrict v = x;
    const float c = 4.0f * g;
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (n > LUNA_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        d[i] += c * (v[i] * v[i] * v[i]);
    return LUNA_OK;
}

/* dx [n] += g·y, dy [n] += g·x. dx == dy is allowed (the gradient of Σ x·x taken with x == y:
 * two successive updates); either may be NULL to skip it. */
luna_status luna_cpu_dot_backward(luna_backend *be, float *dx, float *dy, const float *x,
                                  const float *y, float g, int64_t n) {
    if (n < 0 || (n > 0 && ((dx && !y) || (dy && !x))))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "dot_backward: bad arguments");
    if (dx) LUNA_TRY(luna_cpu_axpy(be, dx, g, y, n));
    if (dy) LUNA_TRY(luna_cpu_axpy(be, dy, g, x, n));
    return LUNA_OK;
}
