/* Fused ops (core/backend.h, "Fused ops"; issue 14): bias + dropout + residual + LayerNorm,
 * bias + ReLU + dropout, mask + softmax + dropout, forward and backward.
 *
 * Each equals the composition of the unfused CPU ops bit for bit, so a model step gives the same
 * numbers whichever it calls:
 * - the elementwise parts are the same fp32 expressions in the same order: bias_add
 *   (y + b), relu (x < 0 ? 0 : x + 0), dropout (x · (keep ? 1/(1−p) : 0), the factors from
 *   luna_cpu_dropout_mults: the same Philox words of the same element indices), add (a + b);
 * - the row reductions are the same functions (luna_cpu_layer_norm_row[_backward],
 *   luna_cpu_softmax_row[_backward]: layer_norm.c, softmax.c) and the column sums too
 *   (luna_cpu_layer_norm_params, luna_cpu_bias_add_backward: thread-owned column tiles adding the
 *   rows in model/kernels/column_sum_order.h's order in double), so results are bit-identical
 *   for any thread count.
 * Rows are independent: one pass over the rows per op (each row's dropout factors generated in
 * runs of LUNA_CPU_DROPOUT_RUN elements), plus the column-sum passes of the backward ops, which
 * need every row in order (dγ, dβ read dy before dres overwrites it).
 */
#include <omp.h>
#include <stdint.h>

#include "model/kernels/cpu/cpu_ops.h"

#define PAR_MIN_WORK 32768

static luna_status check(const char *what, int64_t rows, int cols, float p) {
    if (rows < 0 || cols < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: negative size (rows %lld, cols %d)", what,
                          (long long)rows, cols);
    if (!(p >= 0.0f && p < 1.0f))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: p = %g must be in [0, 1)", what,
                          (double)p);
    return LUNA_OK;
}

/* ---- bias + dropout + residual + LayerNorm --------------------------------------------------- */

luna_status luna_cpu_residual_norm_forward(luna_backend *be, luna_act *y_, luna_act *r_,
                                           float *mean, float *rstd, const luna_act *sub_,
                                           const float *bias, const luna_act *res_,
                                           const float *gamma, const float *beta, int64_t rows,
                                           int d, float eps, float p, luna_rng_key key) {
    float *y = (float *)y_, *r = (float *)r_;
    const float *sub = (const float *)sub_, *res = (const float *)res_;
    LUNA_TRY(check("residual_norm_forward", rows, d, p));
    if (d == 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "residual_norm_forward: d must be positive (rows %lld)", (long long)rows);
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (rows * d >= PAR_MIN_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * d;
        for (int c0 = 0; c0 < d; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = d - c0 < LUNA_CPU_DROPOUT_RUN ? d - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                float t = sub[e];
                if (bias) t = t + bias[c0 + j]; /* linear_forward's bias_add */
                if (p > 0.0f) t = t * mult[j];  /* dropout_forward */
                r[e] = t + res[e];              /* add(r, dropped, res) */
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
    LUNA_TRY(check("residual_norm_backward", rows, d, p));
    if (d == 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "residual_norm_backward: d must be positive (rows %lld)",
                          (long long)rows);
    /* dγ, dβ first: they read dy, which dres may overwrite */
    luna_cpu_layer_norm_params(be, dgamma, dbeta, dy, r, mean, rstd, rows, d);
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (rows * d >= PAR_MIN_WORK)
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
    if (dbias) LUNA_TRY(luna_cpu_bias_add_backward(be, dbias, dsub_, rows, d));
    return LUNA_OK;
}

/* ---- bias + ReLU + dropout ------------------------------------------------------------------- */

luna_status luna_cpu_bias_relu_dropout_forward(luna_backend *be, luna_act *a_, luna_act *h_,
                                               const float *bias, int64_t rows, int cols, float p,
                                               luna_rng_key key) {
    float *a = (float *)a_, *h = (float *)h_;
    LUNA_TRY(check("bias_relu_dropout_forward", rows, cols, p));
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= PAR_MIN_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * cols;
        for (int c0 = 0; c0 < cols; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = cols - c0 < LUNA_CPU_DROPOUT_RUN ? cols - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                if (bias) h[e] += bias[c0 + j];                   /* bias_add_forward */
                const float v = h[e] < 0.0f ? 0.0f : h[e] + 0.0f; /* relu_forward (NaN stays) */
                a[e] = p > 0.0f ? v * mult[j] : v;                /* dropout_forward */
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
    LUNA_TRY(check("bias_relu_dropout_backward", rows, cols, p));
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= PAR_MIN_WORK)
    for (int64_t i = 0; i < rows; i++) {
        float mult[LUNA_CPU_DROPOUT_RUN];
        const int64_t row = i * cols;
        for (int c0 = 0; c0 < cols; c0 += LUNA_CPU_DROPOUT_RUN) {
            const int m = cols - c0 < LUNA_CPU_DROPOUT_RUN ? cols - c0 : LUNA_CPU_DROPOUT_RUN;
            if (p > 0.0f) luna_cpu_dropout_mults(key, row + c0, m, p, mult);
            for (int j = 0; j < m; j++) {
                const int64_t e = row + c0 + j;
                const float g = p > 0.0f ? da[e] * mult[j] : da[e]; /* dropout_backward */
                dh[e] = h[e] > 0.0f ? g : 0.0f;                     /* relu_backward */
            }
        }
    }
    if (dbias) LUNA_TRY(luna_cpu_bias_add_backward(be, dbias, dh_, rows, cols));
    return LUNA_OK;
}

/* ---- mask + softmax + dropout ---------------------------------------------------------------- */

luna_status luna_cpu_softmax_dropout_forward(luna_backend *be, luna_act *y_, luna_act *yd_,
                                             const luna_act *x_, int64_t rows, int cols,
                                             const int32_t *valid_cols, int64_t rows_per_group,
                                             int causal_period, float p, luna_rng_key key) {
    float *y = (float *)y_, *yd = (float *)yd_;
    const float *x = (const float *)x_;
    LUNA_TRY(check("softmax_dropout_forward", rows, cols, p));
    if (valid_cols && rows_per_group <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "softmax_dropout_forward: rows_per_group %lld must be positive with "
                          "valid_cols",
                          (long long)rows_per_group);
    const bool drop = yd && p > 0.0f;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= PAR_MIN_WORK)
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
    LUNA_TRY(check("softmax_dropout_backward", rows, cols, p));
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= PAR_MIN_WORK)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t row = i * cols;
        /* g = dropout_backward(dyd) into dx's row (elementwise: dx may alias dyd), then the
         * softmax backward of the row in place, as softmax_backward(dx, dx, y) */
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
