/* LayerNorm over the last axis (spec §4: eps inside the sqrt, biased variance): the row kernels
 * and the column sums of the fused residual_norm (fused.c), the model's only LayerNorm.
 *
 * Forward, per row r of x [rows, d]:
 *   mean_r = (1/d) Σ_c x_rc,  var_r = (1/d) Σ_c (x_rc − mean_r)²   (two passes, in double)
 *   rstd_r = 1 / sqrt(var_r + eps),  x̂_rc = (x_rc − mean_r) · rstd_r,  y_rc = γ_c x̂_rc + β_c.
 * mean and rstd are saved (as float) and y is computed from the saved values, so the backward
 * sees exactly the x̂ the forward used.
 *
 * Backward, with g_rc = dy_rc · γ_c:
 *   dx_rc  = rstd_r · (g_rc − mean_c(g_r·) − x̂_rc · mean_c(g_r· x̂_r·))     (overwritten)
 *   dγ_c  += Σ_r dy_rc x̂_rc,   dβ_c += Σ_r dy_rc                             (accumulated)
 * Row sums use `omp simd` reductions: a fixed lane order for a given build, whatever the
 * thread count. dγ/dβ are column sums: each thread owns a range of columns and adds the rows in
 * the order of model/kernels/column_sum_order.h, in double (bit-identical for any thread count
 * and to the CUDA backend's). They are taken before dx is written,
 * because dx may alias dy.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "model/kernels/column_sum_order.h"
#include "model/kernels/cpu/cpu_ops.h"

/* One row of the forward: x [d] -> y [d], *mean, *rstd. */
void luna_cpu_layer_norm_row(float *yr, float *mean, float *rstd, const float *xr,
                             const float *gamma, const float *beta, int d, float eps) {
    const float *restrict g = gamma;
    const float *restrict bt = beta;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < d; c++)
        s += (double)xr[c];
    double m = s / d;
    double v = 0.0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < d; c++) {
        double t = (double)xr[c] - m;
        v += t * t;
    }
    v /= d;
    float mf = (float)m, rf = (float)(1.0 / sqrt(v + (double)eps));
    *mean = mf;
    *rstd = rf;
    for (int c = 0; c < d; c++)
        yr[c] = (xr[c] - mf) * rf * g[c] + bt[c];
}

/* dγ_c += Σ_r dy_rc x̂_rc, dβ_c += Σ_r dy_rc (either NULL: skipped): thread-owned column tiles,
 * rows in the order of model/kernels/column_sum_order.h. */
void luna_cpu_layer_norm_params(luna_backend *be, float *dgamma, float *dbeta, const float *dy,
                                const float *x, const float *mean, const float *rstd, int64_t rows,
                                int d) {
    int threads = be->num_threads;
    bool par = rows * d >= LUNA_CPU_PAR_ROWS_WORK;
    if (dgamma || dbeta) {
        int tile = luna_cpu_col_tile(d, threads);
        int ntiles = (d + tile - 1) / tile;
#pragma omp parallel for num_threads(threads) schedule(static) if (par)
        for (int t = 0; t < ntiles; t++) {
            int c0 = t * tile, w = d - c0 < tile ? d - c0 : tile;
            double acc_g[LUNA_CPU_COL_TILE_MAX] = {0}, acc_b[LUNA_CPU_COL_TILE_MAX] = {0};
            for (int64_t r0 = 0; r0 < rows; r0 += LUNA_COLSUM_CHUNK) {
                const int64_t r1 = r0 + LUNA_COLSUM_CHUNK < rows ? r0 + LUNA_COLSUM_CHUNK : rows;
                double part_g[LUNA_CPU_COL_TILE_MAX] = {0}, part_b[LUNA_CPU_COL_TILE_MAX] = {0};
                for (int64_t r = r0; r < r1; r++) {
                    const float *restrict dyr = dy + r * d + c0;
                    const float *restrict xr = x + r * d + c0;
                    float m = mean[r], rs = rstd[r];
                    for (int j = 0; j < w; j++) {
                        float xhat = (xr[j] - m) * rs;
                        part_g[j] += (double)(dyr[j] * xhat);
                        part_b[j] += (double)dyr[j];
                    }
                }
                for (int j = 0; j < w; j++)
                    acc_g[j] += part_g[j], acc_b[j] += part_b[j];
            }
            if (dgamma)
                for (int j = 0; j < w; j++)
                    dgamma[c0 + j] = (float)((double)dgamma[c0 + j] + acc_g[j]);
            if (dbeta)
                for (int j = 0; j < w; j++)
                    dbeta[c0 + j] = (float)((double)dbeta[c0 + j] + acc_b[j]);
        }
    }
}

/* One row of dx (may alias dy): the two row means first (reading all of dy_r), then dx_r. */
void luna_cpu_layer_norm_row_backward(float *dxr, const float *dyr, const float *x_r, float m,
                                      float rs, const float *gamma, int d) {
    const float *restrict xr = x_r;
    const float *restrict gm = gamma;
    double s1 = 0.0, s2 = 0.0; /* Σ_c g_c, Σ_c g_c x̂_c */
#pragma omp simd reduction(+ : s1, s2)
    for (int c = 0; c < d; c++) {
        float gc = dyr[c] * gm[c];
        float xhat = (xr[c] - m) * rs;
        s1 += (double)gc;
        s2 += (double)(gc * xhat);
    }
    float m1 = (float)(s1 / d), m2 = (float)(s2 / d);
    for (int c = 0; c < d; c++) {
        float gc = dyr[c] * gm[c];
        float xhat = (xr[c] - m) * rs;
        dxr[c] = rs * (gc - m1 - xhat * m2);
    }
}
