/* The CUDA backend's fused training ops (core/backend.h, "Fused training ops"): scratch for the
 * column sums and the launchers of fused.cu. */
#include "core/attention_composed.h"
#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/cuda/cuda_ops_util.h"

luna_status luna_cuda_op_residual_norm_forward(luna_backend *be, luna_act *y, luna_act *r,
                                               float *mean, float *rstd, const luna_act *sub,
                                               const float *bias, const luna_act *res,
                                               const float *gamma, const float *beta, int64_t rows,
                                               int d, float eps, float p, luna_rng_key key) {
    LAUNCH("residual_norm_forward",
           luna_cuda_residual_norm_forward(stream(be), bf16(be), y, r, mean, rstd, sub, bias, res,
                                           gamma, beta, rows, d, eps, p, key));
}

luna_status luna_cuda_op_residual_norm_backward(luna_backend *be, luna_act *dres, luna_act *dsub,
                                                float *dbias, float *dgamma, float *dbeta,
                                                const luna_act *dy, const luna_act *r,
                                                const float *mean, const float *rstd,
                                                const float *gamma, int64_t rows, int d, float p,
                                                luna_rng_key key) {
    WRITES(dbias, d);
    WRITES(dgamma, d);
    WRITES(dbeta, d);
    LAUNCH_WITH_COLSUM_WS("residual_norm_backward", rows, d, 3,
                          luna_cuda_residual_norm_backward(stream(be), bf16(be), dres, dsub, dbias,
                                                           dgamma, dbeta, dy, r, mean, rstd, gamma,
                                                           rows, d, p, key, ws));
}

luna_status luna_cuda_op_bias_relu_dropout_forward(luna_backend *be, luna_act *a, luna_act *h,
                                                   const float *bias, int64_t rows, int cols,
                                                   float p, luna_rng_key key) {
    LAUNCH("bias_relu_dropout_forward", luna_cuda_bias_relu_dropout_forward(
                                            stream(be), bf16(be), a, h, bias, rows, cols, p, key));
}

luna_status luna_cuda_op_bias_relu_dropout_backward(luna_backend *be, luna_act *dh, float *dbias,
                                                    const luna_act *da, const luna_act *h,
                                                    int64_t rows, int cols, float p,
                                                    luna_rng_key key) {
    WRITES(dbias, cols);
    LAUNCH_WITH_COLSUM_WS("bias_relu_dropout_backward", rows, cols, 1,
                          luna_cuda_bias_relu_dropout_backward(stream(be), bf16(be), dh, dbias, da,
                                                               h, rows, cols, p, key, ws));
}

luna_status luna_cuda_op_softmax_dropout_forward(luna_backend *be, luna_act *y, luna_act *yd,
                                                 const luna_act *x, int64_t rows, int cols,
                                                 const int32_t *valid_cols, int64_t rows_per_group,
                                                 int causal_period, float p, luna_rng_key key) {
    LAUNCH("softmax_dropout_forward",
           luna_cuda_softmax_dropout_forward(stream(be), bf16(be), y, yd, x, rows, cols, valid_cols,
                                             rows_per_group, causal_period, p, key));
}

luna_status luna_cuda_op_softmax_dropout_backward(luna_backend *be, luna_act *dx,
                                                  const luna_act *dyd, const luna_act *y,
                                                  int64_t rows, int cols, float p,
                                                  luna_rng_key key) {
    LAUNCH("softmax_dropout_backward", luna_cuda_softmax_dropout_backward(
                                           stream(be), bf16(be), dx, dyd, y, rows, cols, p, key));
}

/* One kernel per sentence and head where attention.cu takes the shape (bf16 activations, short
 * rows); the composition of gemm_grid and softmax_dropout otherwise (fp32 keeps the fp32 tiers). */
luna_status luna_cuda_op_attention_forward(luna_backend *be, luna_act *o, luna_act *a,
                                           luna_act *a_d, const luna_act *q, const luna_act *k,
                                           const luna_act *v, const luna_attention_shape *s,
                                           float p, luna_rng_key key) {
    if (!luna_cuda_attention_fits(bf16(be), s->n, s->m, s->dh, 0))
        return luna_attention_composed_forward(be, o, a, a_d, q, k, v, s, p, key);
    LAUNCH("attention_forward",
           luna_cuda_attention_forward(stream(be), o, a, a_d, q, k, v, s, p, key));
}

luna_status luna_cuda_op_attention_backward(luna_backend *be, luna_act *dq, luna_act *dk,
                                            luna_act *dv, luna_act *ds, const luna_act *d_o,
                                            const luna_act *q, const luna_act *k, const luna_act *v,
                                            const luna_act *a, const luna_act *a_d,
                                            const luna_attention_shape *s, float p,
                                            luna_rng_key key) {
    if (!luna_cuda_attention_fits(bf16(be), s->n, s->m, s->dh, 1))
        return luna_attention_composed_backward(be, dq, dk, dv, ds, d_o, q, k, v, a, a_d, s, p,
                                                key);
    LAUNCH("attention_backward",
           luna_cuda_attention_backward(stream(be), dq, dk, dv, d_o, q, k, v, a, a_d, s, p, key));
}
