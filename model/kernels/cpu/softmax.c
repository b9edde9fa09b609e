/* Masked softmax over the last axis, x, y [rows, cols]: softmax_forward, and the rows of the
 * fused softmax_dropout (fused.c).
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

/* valid(r): the columns row r attends to, clamped to [0, cols]. */
int luna_cpu_softmax_valid(int64_t r, int cols, const int32_t *valid_cols, int64_t rows_per_group,
                           int causal_period) {
    int64_t v = valid_cols ? valid_cols[r / rows_per_group] : cols;
    if (causal_period > 0 && r % causal_period + 1 < v) v = r % causal_period + 1;
    return v < 0 ? 0 : (v > cols ? cols : (int)v);
}

/* One row of the forward (also the fused softmax_dropout_forward's, fused.c: one definition, so
 * the two are bit-identical). y may alias x. */
void luna_cpu_softmax_row(float *yr, const float *xr, int cols, int valid) {
    float mx = -INFINITY;
    for (int c = 0; c < valid; c++) /* = fmaxf (a NaN never wins; ±0 give the same exps), inlined */
        mx = xr[c] > mx ? xr[c] : mx;
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

/* One row of the backward; dx may alias dy. */
void luna_cpu_softmax_row_backward(float *dxr, const float *dyr, const float *y_r, int cols) {
    const float *restrict yr = y_r;
    double dot = 0.0; /* Σ_c y_c dy_c */
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < cols; c++)
        dot += (double)(yr[c] * dyr[c]);
    float s = (float)dot;
    for (int c = 0; c < cols; c++)
        dxr[c] = yr[c] * (dyr[c] - s);
}

luna_status luna_cpu_softmax_forward(luna_backend *be, luna_act *y_, const luna_act *x_,
                                     int64_t rows, int cols, const int32_t *valid_cols,
                                     int64_t rows_per_group, int causal_period) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * cols >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t r = 0; r < rows; r++)
        luna_cpu_softmax_row(
            y + r * cols, x + r * cols, cols,
            luna_cpu_softmax_valid(r, cols, valid_cols, rows_per_group, causal_period));
    return LUNA_OK;
}
