/* The CUDA backend's optimizer ops (core/backend.h, "Optimizer": clipping and the multi-tensor
 * updates over a tensor table, whose workspace they use): the launchers of reduce.cu and
 * optimizer.cu. The rest of the kernel table is cuda_ops.c. */
#include "core/tensor_table.h"
#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/cuda/cuda_ops_util.h"

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
    if (tt->num_tensors == 0) return LUNA_OK;
    WRITES(result, tt->num_tensors);
    LAUNCH("multi_sum_squares",
           luna_cuda_multi_sum_squares(stream(be), result, x, tt->num_tensors, tt->num_blocks,
                                       tt->offsets, tt->numels, tt->block_start, tt->block_tensor,
                                       tt->workspace));
}
luna_status luna_cuda_op_clip_coefficients(luna_backend *be, float *coef, double *summary,
                                           const float *sumsq, int n, double clip_norm, int mode,
                                           const double *also_finite, int num_also) {
    if (n > 0) WRITES(coef, n);
    LAUNCH("clip_coefficients",
           luna_cuda_clip_coefficients(stream(be), coef, summary, sumsq, n, clip_norm, mode,
                                       also_finite, num_also));
}
luna_status luna_cuda_op_multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                                     const float *coef, float alpha) {
    if (tt->num_blocks == 0) return LUNA_OK;
    WRITES(x, table_extent(tt));
    LAUNCH("multi_scale",
           luna_cuda_multi_scale(stream(be), x, tt->num_blocks, tt->offsets, tt->numels,
                                 tt->block_start, tt->block_tensor, coef, alpha));
}
luna_status luna_cuda_op_multi_apollo_update(luna_backend *be, float *theta, const float *g,
                                             float *exp_avg, float *approx_hessian, float *update,
                                             const luna_tensor_table *tt, int64_t *steps,
                                             const double *gate, double lr, double beta, double eps,
                                             double sigma, int rebound, double weight_decay,
                                             int wd_type) {
    if (tt->num_tensors == 0) return LUNA_OK;
    const int64_t extent = table_extent(tt);
    WRITES(theta, extent), WRITES(exp_avg, extent), WRITES(approx_hessian, extent);
    WRITES(update, extent);
    LAUNCH("multi_apollo_update",
           luna_cuda_multi_apollo_update(
               stream(be), theta, g, exp_avg, approx_hessian, update, tt->num_tensors,
               tt->num_blocks, tt->offsets, tt->numels, tt->block_start, tt->block_tensor,
               tt->workspace, steps, gate, lr, beta, eps, sigma, rebound, weight_decay, wd_type));
}
luna_status luna_cuda_op_multi_adam_update(luna_backend *be, float *theta, const float *g,
                                           float *exp_avg, float *exp_avg_sq,
                                           const luna_tensor_table *tt, int64_t *steps,
                                           const double *gate, double lr, double beta1,
                                           double beta2, double eps, double weight_decay) {
    if (tt->num_tensors == 0) return LUNA_OK;
    const int64_t extent = table_extent(tt);
    WRITES(theta, extent), WRITES(exp_avg, extent), WRITES(exp_avg_sq, extent);
    LAUNCH("multi_adam_update",
           luna_cuda_multi_adam_update(stream(be), theta, g, exp_avg, exp_avg_sq, tt->num_tensors,
                                       tt->num_blocks, tt->offsets, tt->numels, tt->block_start,
                                       tt->block_tensor, tt->workspace, steps, gate, lr, beta1,
                                       beta2, eps, weight_decay));
}
