/* The fused training ops (core/backend.h, "Fused training ops"): bias + dropout + residual +
 * LayerNorm, bias + ReLU + dropout, mask + softmax + dropout, forward and backward.
 *
 * Each is the composition of the separate steps it replaces, in one pass over the rows:
 * - the elementwise parts are single fp32 expressions in a fixed order: bias (y + b), relu
 *   (x < 0 ? 0 : x + 0), dropout (x · (keep ? 1/(1−p) : 0), the factors from
 *   luna_cpu_dropout_mults: the Philox words of dropout_forward for the same element indices),
 *   residual (a + b);
 * - the row reductions are the row kernels of layer_norm.c and softmax.c (softmax_forward's rows
 *   too), the column sums luna_cpu_layer_norm_params and luna_cpu_bias_grad (linear_backward's
 *   bias gradient): thread-owned column tiles adding the rows in
 *   model/kernels/column_sum_order.h's order in double, so results are bit-identical for any
 *   thread count.
 * Rows are independent: one pass over the rows per op (each row's dropout factors generated in
 * runs of LUNA_CPU_DROPOUT_RUN elements), plus the column-sum passes of the backward ops, which
 * need every row in order (dγ, dβ read dy before dres overwrites it).
 */
#include <omp.h>
#include <stdint.h>

#include "model/kernels/cpu/cpu_ops.h"

/* ---- bias + dropout + residual + LayerNorm --------------------------------------------------- */

luna_status luna_cpu_residual_norm_forward(luna_backend *be, luna_act *y_, luna_act *r_,
                                           float *mean, float *rstd, const luna_act *sub_,
                                           const float *bias, const luna_act *res_,
                                           const float *gamma, const float *beta, int64_t rows,
                                           int d, float eps, float p, luna_rng_key key) {
    float *y = (float *)y_, *r = (float *)r_;
    const float *sub = (const float *)sub_, *res = (const float *)res_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * d >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * d;
        for (int c0 = 0; c0 < d; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = d - c0 < LUNA_CPU_DROPOUT_RUN ? d - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                float t = sub[e];
                if (bias) t = t + bias[c0 + j]; /* the sublayer's bias */
                if (p > 0.0f) t = t * mult[j];  /* dropout */
                r[e] = t + res[e];              /* the residual */
            }
        }
        luna_cpu_layer_norm_row(y + row, &mean[i], &rstd[i], r + row, gamma, beta, d, eps);
    }
    return LUNA_OK;
}

luna_status luna_cpu_residual_norm_backward(luna_backend *be, luna_act *dres_, luna_act *dsub_,
                                            float *dbias, float *dgamma, float *dbeta,
                                            const luna_act *dy_, const luna_act *r_,
                                            const float *mean, const float *rstd,
                                            const float *gamma, int64_t rows, int d, float p,
                                            luna_rng_key key) {
    float *dres = (float *)dres_, *dsub = (float *)dsub_;
    const float *dy = (const float *)dy_, *r = (const float *)r_;
    /* dγ, dβ first: they read dy, which dres may overwrite */
    luna_cpu_layer_norm_params(be, dgamma, dbeta, dy, r, mean, rstd, rows, d);
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * d >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * d;
        luna_cpu_layer_norm_row_backward(dres + row, dy + row, r + row, mean[i], rstd[i], gamma, d);
        for (int c0 = 0; c0 < d; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = d - c0 < LUNA_CPU_DROPOUT_RUN ? d - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                dsub[e] = p > 0.0f ? dres[e] * mult[j] : dres[e];
            }
        }
    }
    if (dbias) luna_cpu_bias_grad(be, dbias, dsub, rows, d);
    return LUNA_OK;
}

/* ---- bias + ReLU + dropout ------------------------------------------------------------------- */

luna_status luna_cpu_bias_relu_dropout_forward(luna_backend *be, luna_act *a_, luna_act *h_,
                                               const float *bias, int64_t rows, int cols, float p,
                                               luna_rng_key key) {
    float *a = (float *)a_, *h = (float *)h_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * cols;
        for (int c0 = 0; c0 < cols; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = cols - c0 < LUNA_CPU_DROPOUT_RUN ? cols - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                if (bias) h[e] += bias[c0 + j];                   /* bias */
                const float v = h[e] < 0.0f ? 0.0f : h[e] + 0.0f; /* relu (NaN stays NaN) */
                a[e] = p > 0.0f ? v * mult[j] : v;                /* dropout */
            }
        }
    }
    return LUNA_OK;
}

luna_status luna_cpu_bias_relu_dropout_backward(luna_backend *be, luna_act *dh_, float *dbias,
                                                const luna_act *da_, const luna_act *h_,
                                                int64_t rows, int cols, float p, luna_rng_key key) {
    float *dh = (float *)dh_;
    const float *da = (const float *)da_, *h = (const float *)h_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * cols;
        for (int c0 = 0; c0 < cols; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = cols - c0 < LUNA_CPU_DROPOUT_RUN ? cols - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                const float g = p > 0.0f ? da[e] * mult[j] : da[e]; /* dropout */
                dh[e] = h[e] > 0.0f ? g : 0.0f;                     /* relu' (0 at 0) */
            }
        }
    }
    if (dbias) luna_cpu_bias_grad(be, dbias, dh, rows, cols);
    return LUNA_OK;
}

/* ---- mask + softmax + dropout ---------------------------------------------------------------- */

luna_status luna_cpu_softmax_dropout_forward(luna_backend *be, luna_act *y_, luna_act *yd_,
                                             const luna_act *x_, int64_t rows, int cols,
                                             const int32_t *valid_cols, int64_t rows_per_group,
                                             int causal_period, float p, luna_rng_key key) {
    float *y = (float *)y_, *yd = (float *)yd_;
    const float *x = (const float *)x_;
    const bool drop = yd && p > 0.0f;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t row = i * cols;
        luna_cpu_softmax_row(
            y + row, x + row, cols,
            luna_cpu_softmax_valid(i, cols, valid_cols, rows_per_group, causal_period));
        if (!drop) continue;
        float mult[LUNA_CPU_DROPOUT_RUN];
        for (int c0 = 0; c0 < cols; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = cols - c0 < LUNA_CPU_DROPOUT_RUN ? cols - c0 : LUNA_CPU_DROPOUT_RUN;
            luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++)
                yd[row + c0 + j] = y[row + c0 + j] * mult[j];
        }
    }
    return LUNA_OK;
}

luna_status luna_cpu_softmax_dropout_backward(luna_backend *be, luna_act *dx_, const luna_act *dyd_,
                                              const luna_act *y_, int64_t rows, int cols, float p,
                                              luna_rng_key key) {
    float *dx = (float *)dx_;
    const float *dyd = (const float *)dyd_, *y = (const float *)y_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t row = i * cols;
        /* g = dropout_backward(dyd) into dx's row (elementwise: dx may alias dyd), then the
         * softmax backward of the row in place */
        float mult[LUNA_CPU_DROPOUT_RUN];
        for (int c0 = 0; c0 < cols; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = cols - c0 < LUNA_CPU_DROPOUT_RUN ? cols - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                dx[e] = p > 0.0f ? dyd[e] * mult[j] : dyd[e];
            }
        }
        luna_cpu_softmax_row_backward(dx + row, dx + row, y + row, cols);
    }
    return LUNA_OK;
}
