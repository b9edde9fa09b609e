/* Masked softmax over the last axis, x, y [rows, cols].
 *
 * Row r attends to columns c < valid(r):
 *   valid(r) = valid_cols ? valid_cols[r / rows_per_group] : cols, clamped to [0, cols];
 *   causal_period > 0:  valid(r) = min(valid(r), r % causal_period + 1).
 * Forward:  y_rc = exp(x_rc − max_r) / Σ_{c' < valid} exp(x_rc' − max_r) for c < valid(r), else 0
 *           (max_r over the valid columns; a row with no valid column — or only −inf logits — is
 *           all zeros). exp in float, the sum in double. y may alias x.
 * Backward: dx_rc = y_rc · (dy_rc − Σ_c' y_rc' dy_rc')  (masked entries have y = 0, so dx = 0).
 *           The sum is taken in double over the whole row before dx is written (dx may alias dy).
 * The backward row sum uses `omp simd` (a fixed lane order per build, whatever the thread count).
 * expf stays scalar (glibc's vector expf needs -ffast-math).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "model/kernels/cpu/cpu_ops.h"

#define PAR_MIN_WORK 32768

luna_status luna_cpu_softmax_forward(luna_backend *be, luna_act *y_, const luna_act *x_,
                                     int64_t rows, int cols, const int32_t *valid_cols,
                                     int64_t rows_per_group, int causal_period) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
    if (rows < 0 || cols < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "softmax_forward: negative size (rows %lld, cols %d)", (long long)rows,
                          cols);
    if (valid_cols && rows_per_group <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "softmax_forward: rows_per_group %lld must be positive with valid_cols",
                          (long long)rows_per_group);
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        int64_t v = valid_cols ? valid_cols[r / rows_per_group] : cols;
        if (causal_period > 0 && r % causal_period + 1 < v) v = r % causal_period + 1;
        int valid = v < 0 ? 0 : (v > cols ? cols : (int)v);
        float mx = -INFINITY;
        for (int c = 0; c < valid; c++)
            mx = fmaxf(mx, xr[c]);
        if (mx == -INFINITY) valid = 0; /* nothing to attend to */
        double sum = 0.0;
        for (int c = 0; c < valid; c++) {
            float e = expf(xr[c] - mx);
            yr[c] = e;
            sum += (double)e;
        }
        float inv = (float)(1.0 / sum);
        for (int c = 0; c < valid; c++)
            yr[c] *= inv;
        for (int c = valid; c < cols; c++)
            yr[c] = 0.0f;
    }
    return LUNA_OK;
}

/* dy, y [rows, cols] -> dx [rows, cols] (may alias dy). */
luna_status luna_cpu_softmax_backward(luna_backend *be, luna_act *dx_, const luna_act *dy_,
                                      const luna_act *y_, int64_t rows, int cols) {
    float *dx = (float *)dx_;
    const float *dy = (const float *)dy_;
    const float *y = (const float *)y_;
    if (rows < 0 || cols < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "softmax_backward: negative size (rows %lld, cols %d)", (long long)rows,
                          cols);
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * cols;
        const float *restrict yr = y + r * cols;
        float *dxr = dx + r * cols;
        double dot = 0.0; /* Σ_c y_c dy_c */
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < cols; c++)
            dot += (double)(yr[c] * dyr[c]);
        float s = (float)dot;
        for (int c = 0; c < cols; c++)
            dxr[c] = yr[c] * (dyr[c] - s);
    }
    return LUNA_OK;
}
