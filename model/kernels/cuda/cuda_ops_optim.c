/* The CUDA backend's reductions, optimizer updates and multi-tensor ops (core/backend.h): argument
 * checks as the CPU backend's, scratch from be->scratch, the launchers of reduce.cu and
 * optimizer.cu. The rest of the op table is cuda_ops.c. */
#include "core/allocator.h"
#include "core/tensor_table.h"
#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/cuda/cuda_ops_util.h"

/* ---- reductions --------------------------------------------------------------------------------
 */
typedef cudaError_t (*blocked_fn)(cudaStream_t, float *, const float *, int64_t, double *);

static luna_status reduce(luna_backend *be, const char *what, blocked_fn fn, float *result,
                          const float *x, int64_t n) {
    if (!result || n < 0 || (n > 0 && !x))
        BAD("%s: null pointer or negative size (n=%lld)", what, (long long)n);
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    double *partials;
    LUNA_TRY(scratch_doubles(be, what, (n + REDUCE_BLOCK - 1) / REDUCE_BLOCK, &partials));
    WRITES(result, 1);
    luna_status st = luna_cuda_check(fn(stream(be), result, x, n, partials), what);
    luna_arena_release(be->scratch, mark);
    return st;
}
luna_status luna_cuda_op_sum_squares(luna_backend *be, float *result, const float *x, int64_t n) {
    return reduce(be, "sum_squares", luna_cuda_sum_squares, result, x, n);
}
luna_status luna_cuda_op_sum_pow4(luna_backend *be, float *result, const float *x, int64_t n) {
    return reduce(be, "sum_pow4", luna_cuda_sum_pow4, result, x, n);
}
luna_status luna_cuda_op_sum(luna_backend *be, float *result, const float *x, int64_t n) {
    return reduce(be, "sum", luna_cuda_sum, result, x, n);
}
luna_status luna_cuda_op_dot(luna_backend *be, float *result, const float *x, const float *y,
                             int64_t n) {
    if (!result || n < 0 || (n > 0 && (!x || !y)))
        BAD("dot: null pointer or negative size (n=%lld)", (long long)n);
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    double *partials;
    LUNA_TRY(scratch_doubles(be, "dot", (n + REDUCE_BLOCK - 1) / REDUCE_BLOCK, &partials));
    WRITES(result, 1);
    luna_status st = luna_cuda_check(luna_cuda_dot(stream(be), result, x, y, n, partials), "dot");
    luna_arena_release(be->scratch, mark);
    return st;
}
luna_status luna_cuda_op_max_abs(luna_backend *be, float *result, const float *x, int64_t n) {
    if (!result || n < 0 || (n > 0 && !x))
        BAD("max_abs: null pointer or negative size (n=%lld)", (long long)n);
    WRITES(result, 1);
    LAUNCH("max_abs", luna_cuda_max_abs(stream(be), result, x, n));
}
luna_status luna_cuda_op_sum_squares_backward(luna_backend *be, float *dx, const float *x, float g,
                                              int64_t n) {
    CHECK_N("sum_squares_backward", dx && x);
    WRITES(dx, n);
    LAUNCH("sum_squares_backward", luna_cuda_sum_squares_backward(stream(be), dx, x, g, n));
}
luna_status luna_cuda_op_sum_pow4_backward(luna_backend *be, float *dx, const float *x, float g,
                                           int64_t n) {
    CHECK_N("sum_pow4_backward", dx && x);
    WRITES(dx, n);
    LAUNCH("sum_pow4_backward", luna_cuda_sum_pow4_backward(stream(be), dx, x, g, n));
}
/* dx += g·y, dy += g·x: two fp32 axpys (the CPU computes each element as one product and one
 * sum, as the axpy kernel does). */
luna_status luna_cuda_op_dot_backward(luna_backend *be, float *dx, float *dy, const float *x,
                                      const float *y, float g, int64_t n) {
    if (n < 0 || (n > 0 && ((dx && !y) || (dy && !x)))) BAD("dot_backward: bad arguments");
    if (dx) {
        WRITES(dx, n);
        LUNA_TRY(luna_cuda_check(luna_cuda_axpy(stream(be), 0, dx, g, y, n), "dot_backward"));
    }
    if (!dy) return LUNA_OK;
    WRITES(dy, n);
    LAUNCH("dot_backward", luna_cuda_axpy(stream(be), 0, dy, g, x, n));
}

/* ---- optimizer updates -------------------------------------------------------------------------
 */
luna_status luna_cuda_op_apollo_update(luna_backend *be, float *theta, const float *g,
                                       float *exp_avg, float *approx_hessian, float *update,
                                       int64_t n, int64_t step, double lr, double beta, double eps,
                                       double sigma, int rebound, double weight_decay,
                                       int wd_type) {
    if (n < 0 || (n > 0 && (!theta || !g || !exp_avg || !approx_hessian || !update)))
        BAD("apollo_update: null pointer or negative size (n=%lld)", (long long)n);
    if (step < 1 || (rebound != 0 && rebound != 1) || wd_type < 0 || wd_type > 2 ||
        !(beta >= 0.0 && beta < 1.0) || !(eps > 0.0) || !(sigma > 0.0))
        BAD("apollo_update: bad hyperparameters (step %lld, beta %g, eps %g, sigma %g, rebound "
            "%d, weight decay type %d)",
            (long long)step, beta, eps, sigma, rebound, wd_type);
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    double *ws;
    LUNA_TRY(
        scratch_doubles(be, "apollo_update", 5 * ((n + REDUCE_BLOCK - 1) / REDUCE_BLOCK) + 8, &ws));
    WRITES(theta, n), WRITES(exp_avg, n), WRITES(approx_hessian, n), WRITES(update, n);
    luna_status st = luna_cuda_check(
        luna_cuda_apollo_update(stream(be), theta, g, exp_avg, approx_hessian, update, n, step, lr,
                                beta, eps, sigma, rebound, weight_decay, wd_type, ws),
        "apollo_update");
    luna_arena_release(be->scratch, mark);
    return st;
}
luna_status luna_cuda_op_adam_update(luna_backend *be, float *theta, const float *g, float *exp_avg,
                                     float *exp_avg_sq, int64_t n, int64_t step, double lr,
                                     double beta1, double beta2, double eps, double weight_decay) {
    if (n < 0 || (n > 0 && (!theta || !g || !exp_avg || !exp_avg_sq)))
        BAD("adam_update: null pointer or negative size (n=%lld)", (long long)n);
    if (step < 1 || !(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0) ||
        !(eps > 0.0))
        BAD("adam_update: bad hyperparameters (step %lld, betas %g %g, eps %g)", (long long)step,
            beta1, beta2, eps);
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    double *ws;
    LUNA_TRY(
        scratch_doubles(be, "adam_update", 5 * ((n + REDUCE_BLOCK - 1) / REDUCE_BLOCK) + 8, &ws));
    WRITES(theta, n), WRITES(exp_avg, n), WRITES(exp_avg_sq, n);
    luna_status st =
        luna_cuda_check(luna_cuda_adam_update(stream(be), theta, g, exp_avg, exp_avg_sq, n, step,
                                              lr, beta1, beta2, eps, weight_decay, ws),
                        "adam_update");
    luna_arena_release(be->scratch, mark);
    return st;
}

/* The flat buffers of a table: [0, extent) elements (the last tensor's end). */
static int64_t table_extent(const luna_tensor_table *tt) {
    int64_t end = 0;
    for (int i = 0; i < tt->num_tensors; i++) {
        const int64_t e = tt->host_offsets[i] + tt->host_numels[i];
        if (e > end) end = e;
    }
    return end;
}

luna_status luna_cuda_op_multi_sum_squares(luna_backend *be, float *result, const float *x,
                                           const luna_tensor_table *tt) {
    if (!tt || (tt->num_tensors > 0 && !result) || (tt->num_elements > 0 && !x))
        BAD("multi_sum_squares: null pointer");
    if (tt->num_tensors == 0) return LUNA_OK;
    WRITES(result, tt->num_tensors);
    LAUNCH("multi_sum_squares",
           luna_cuda_multi_sum_squares(stream(be), result, x, tt->num_tensors, tt->num_blocks,
                                       tt->offsets, tt->numels, tt->block_start, tt->block_tensor,
                                       tt->workspace));
}
luna_status luna_cuda_op_clip_coefficients(luna_backend *be, float *coef, double *summary,
                                           const float *sumsq, int n, double clip_norm, int mode) {
    if (!summary || n < 0 || (n > 0 && (!coef || !sumsq)) || !(clip_norm >= 0.0) ||
        (mode != 0 && mode != 1))
        BAD("clip_coefficients: bad arguments (n %d, clip_norm %g, mode %d)", n, clip_norm, mode);
    if (n > 0) WRITES(coef, n);
    LAUNCH("clip_coefficients",
           luna_cuda_clip_coefficients(stream(be), coef, summary, sumsq, n, clip_norm, mode));
}
luna_status luna_cuda_op_multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                                     const float *coef, float alpha) {
    if (!tt || (tt->num_elements > 0 && !x)) BAD("multi_scale: null pointer");
    if (tt->num_blocks == 0) return LUNA_OK;
    WRITES(x, table_extent(tt));
    LAUNCH("multi_scale",
           luna_cuda_multi_scale(stream(be), x, tt->num_blocks, tt->offsets, tt->numels,
                                 tt->block_start, tt->block_tensor, coef, alpha));
}
luna_status luna_cuda_op_multi_apollo_update(luna_backend *be, float *theta, const float *g,
                                             float *exp_avg, float *approx_hessian, float *update,
                                             const luna_tensor_table *tt, int64_t *steps, double lr,
                                             double beta, double eps, double sigma, int rebound,
                                             double weight_decay, int wd_type) {
    if (!tt || (tt->num_tensors > 0 && !steps) ||
        (tt->num_elements > 0 && (!theta || !g || !exp_avg || !approx_hessian || !update)))
        BAD("multi_apollo_update: null pointer");
    if ((rebound != 0 && rebound != 1) || wd_type < 0 || wd_type > 2 ||
        !(beta >= 0.0 && beta < 1.0) || !(eps > 0.0) || !(sigma > 0.0))
        BAD("multi_apollo_update: bad hyperparameters (beta %g, eps %g, sigma %g, rebound %d, "
            "weight decay type %d)",
            beta, eps, sigma, rebound, wd_type);
    if (tt->num_tensors == 0) return LUNA_OK;
    const int64_t extent = table_extent(tt);
    WRITES(theta, extent), WRITES(exp_avg, extent), WRITES(approx_hessian, extent);
    WRITES(update, extent);
    LAUNCH("multi_apollo_update",
           luna_cuda_multi_apollo_update(stream(be), theta, g, exp_avg, approx_hessian, update,
                                         tt->num_tensors, tt->num_blocks, tt->offsets, tt->numels,
                                         tt->block_start, tt->block_tensor, tt->workspace, steps,
                                         lr, beta, eps, sigma, rebound, weight_decay, wd_type));
}
luna_status luna_cuda_op_multi_adam_update(luna_backend *be, float *theta, const float *g,
                                           float *exp_avg, float *exp_avg_sq,
                                           const luna_tensor_table *tt, int64_t *steps, double lr,
                                           double beta1, double beta2, double eps,
                                           double weight_decay) {
    if (!tt || (tt->num_tensors > 0 && !steps) ||
        (tt->num_elements > 0 && (!theta || !g || !exp_avg || !exp_avg_sq)))
        BAD("multi_adam_update: null pointer");
    if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0) || !(eps > 0.0))
        BAD("multi_adam_update: bad hyperparameters (betas %g %g, eps %g)", beta1, beta2, eps);
    if (tt->num_tensors == 0) return LUNA_OK;
    const int64_t extent = table_extent(tt);
    WRITES(theta, extent), WRITES(exp_avg, extent), WRITES(exp_avg_sq, extent);
    LAUNCH("multi_adam_update",
           luna_cuda_multi_adam_update(stream(be), theta, g, exp_avg, exp_avg_sq, tt->num_tensors,
                                       tt->num_blocks, tt->offsets, tt->numels, tt->block_start,
                                       tt->block_tensor, tt->workspace, steps, lr, beta1, beta2,
                                       eps, weight_decay));
}
