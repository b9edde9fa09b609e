/* The multi-tensor ops of clipping over a tensor table (core/backend.h, "Optimizer"):
 * multi_sum_squares, clip_coefficients, multi_scale; the updates are optimizer_kernels.c.
 * The clip coefficients are derived here, on the device side, so clipping needs no host round
 * trip: the host reads back one 3-double summary per update.
 *
 * multi_sum_squares sums in core/reduce_order.h's order: the table's blocks are its blocks, each
 * block's partial the sum of LUNA_REDUCE_LANES lanes (eight, so the compiler can keep them in two
 * AVX registers; the order is still fixed by the code), a tensor's partials added in block order.
 * Threads only choose who computes a block: bit-identical for any thread count. */
#include <math.h>
#include <stdint.h>

#include "core/reduce_order.h"
#include "core/tensor_table.h"
#include "model/kernels/cpu/cpu_ops.h"

_Static_assert(LUNA_TENSOR_TABLE_BLOCK == LUNA_REDUCE_BLOCK,
               "a table's blocks are the reduction's");

enum { CLIP_EACH = 0, CLIP_TOTAL = 1 };

/* P_k = Σ x² over the block x[0, len), len <= LUNA_REDUCE_BLOCK, in lanes. */
static double block_squares(const float *restrict x, int64_t len) {
    double lane[LUNA_REDUCE_LANES] = {0};
    int64_t full = len - len % LUNA_REDUCE_LANES, i = 0;
    for (; i < full; i += LUNA_REDUCE_LANES)
        for (int l = 0; l < LUNA_REDUCE_LANES; l++) {
            double v = (double)x[i + l];
            lane[l] += v * v;
        }
    for (; i < len; i++)
        lane[i - full] += (double)x[i] * (double)x[i];
    double s = 0.0;
    for (int l = 0; l < LUNA_REDUCE_LANES; l++)
        s += lane[l];
    return s;
}

/* result[i] = Σ x_i² for every tensor i: the block partials of all tensors in one parallel pass
 * (into the table's workspace), then each tensor's partials combined in block order. */
luna_status luna_cpu_multi_sum_squares(luna_backend *be, float *result, const float *x,
                                       const luna_tensor_table *tt) {
    const int64_t nblocks = tt->num_blocks;
    double *partials = tt->workspace;
    const int64_t *offsets = tt->offsets, *numels = tt->numels, *bstart = tt->block_start;
    const int32_t *btensor = tt->block_tensor;
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (nblocks > 4)
    for (int64_t k = 0; k < nblocks; k++) {
        int i = btensor[k];
        int64_t start = (k - bstart[i]) * LUNA_REDUCE_BLOCK;
        int64_t len = numels[i] - start < LUNA_REDUCE_BLOCK ? numels[i] - start : LUNA_REDUCE_BLOCK;
        partials[k] = block_squares(x + offsets[i] + start, len);
    }
    for (int i = 0; i < tt->num_tensors; i++) {
        double total = 0.0;
        for (int64_t k = bstart[i]; k < bstart[i + 1]; k++)
            total += partials[k];
        result[i] = (float)total;
    }
    return LUNA_OK;
}

static double clip_coefficient(double clip_norm, double norm) {
    double c = clip_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

/* coef [n], summary [3] = {norm, finite, clipped} from sumsq [n] and also_finite [num_also] (see
 * core/backend.h). Serial: n is the number of tensors (a few hundred), and the order of the double
 * sum is fixed. */
luna_status luna_cpu_clip_coefficients(luna_backend *be, float *coef, double *summary,
                                       const float *sumsq, int n, double clip_norm, int mode,
                                       const double *also_finite, int num_also) {
    (void)be;
    double total_sq = 0.0, max_norm = 0.0;
    bool finite = true;
    for (int i = 0; i < n; i++) {
        double sq = (double)sumsq[i];
        if (!isfinite(sq)) finite = false;
        total_sq += sq;
        double nrm = sqrt(sq);
        if (!(nrm <= max_norm)) max_norm = nrm; /* NaN propagates */
    }
    double norm = mode == CLIP_TOTAL ? sqrt(total_sq) : max_norm;
    if (!finite && isfinite(norm)) norm = INFINITY;
    for (int j = 0; j < num_also; j++)
        if (!isfinite(also_finite[j])) finite = false;
    bool any = false;
    const bool active = finite && clip_norm != 0.0;
    const double total_coef = clip_coefficient(clip_norm, norm);
    for (int i = 0; i < n; i++) {
        double c = 1.0;
        if (active)
            c = mode == CLIP_TOTAL ? total_coef
                                   : clip_coefficient(clip_norm, sqrt((double)sumsq[i]));
        if (c < 1.0)
            any = true;
        else
            c = 1.0;
        coef[i] = (float)c;
    }
    summary[0] = norm;
    summary[1] = finite ? 1.0 : 0.0;
    summary[2] = any ? 1.0 : 0.0;
    return LUNA_OK;
}

/* x_i *= coef[i] (or alpha) for every tensor i of the table, in parallel over the table's blocks;
 * tensors whose factor is exactly 1 are skipped. */
luna_status luna_cpu_multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                                 const float *coef, float alpha) {
    if (!coef && alpha == 1.0f) return LUNA_OK;
    const int64_t nblocks = tt->num_blocks;
    const int64_t *offsets = tt->offsets, *numels = tt->numels, *bstart = tt->block_start;
    const int32_t *btensor = tt->block_tensor;
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (nblocks > 16)
    for (int64_t k = 0; k < nblocks; k++) {
        int i = btensor[k];
        float a = coef ? coef[i] : alpha;
        if (a == 1.0f) continue;
        int64_t start = (k - bstart[i]) * LUNA_REDUCE_BLOCK;
        int64_t len = numels[i] - start < LUNA_REDUCE_BLOCK ? numels[i] - start : LUNA_REDUCE_BLOCK;
        float *restrict p = x + offsets[i] + start;
        for (int64_t j = 0; j < len; j++)
            p[j] *= a;
    }
    return LUNA_OK;
}
