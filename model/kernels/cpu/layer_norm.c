/* LayerNorm over the last axis (spec §4: eps inside the sqrt, biased variance).
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

#define PAR_MIN_WORK 32768
#define COL_TILE_MAX 64
#define COL_TILE_MIN 16

static int col_tile(int cols, int threads) {
    int t = (cols + threads - 1) / (threads > 0 ? threads : 1);
    t = (t + 15) / 16 * 16;
    return t < COL_TILE_MIN ? COL_TILE_MIN : (t > COL_TILE_MAX ? COL_TILE_MAX : t);
}

/* One row of the forward (also the fused residual_norm_forward's, fused.c: one definition, so the
 * two are bit-identical): x [d] -> y [d], *mean, *rstd. */
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

/* x [rows, d] -> y [rows, d], mean [rows], rstd [rows]; gamma, beta [d]. */
luna_status luna_cpu_layer_norm_forward(luna_backend *be, luna_act *y_, float *mean, float *rstd,
                                        const luna_act *x_, const float *gamma, const float *beta,
                                        int64_t rows, int d, float eps) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
    if (rows < 0 || d <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "layer_norm_forward: bad size (rows %lld, d %d; d must be positive)",
                          (long long)rows, d);
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (rows * d >= PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++)
        luna_cpu_layer_norm_row(y + r * d, &mean[r], &rstd[r], x + r * d, gamma, beta, d, eps);
    return LUNA_OK;
}

/* dγ_c += Σ_r dy_rc x̂_rc, dβ_c += Σ_r dy_rc (either NULL: skipped): thread-owned column tiles,
 * rows in the order of model/kernels/column_sum_order.h (shared with the fused
 * residual_norm_backward). */
void luna_cpu_layer_norm_params(luna_backend *be, float *dgamma, float *dbeta, const float *dy,
                                const float *x, const float *mean, const float *rstd, int64_t rows,
                                int d) {
    int threads = be->num_threads;
    bool par = rows * d >= PAR_MIN_WORK;
    if (dgamma || dbeta) {
        int tile = col_tile(d, threads);
        int ntiles = (d + tile - 1) / tile;
#pragma omp parallel for num_threads(threads) schedule(static) if (par)
        for (int t = 0; t < ntiles; t++) {
            int c0 = t * tile, w = d - c0 < tile ? d - c0 : tile;
            double acc_g[COL_TILE_MAX] = {0}, acc_b[COL_TILE_MAX] = {0};
            for (int64_t r0 = 0; r0 < rows; r0 += LUNA_COLSUM_CHUNK) {
                const int64_t r1 = r0 + LUNA_COLSUM_CHUNK < rows ? r0 + LUNA_COLSUM_CHUNK : rows;
                double part_g[COL_TILE_MAX] = {0}, part_b[COL_TILE_MAX] = {0};
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

/* dy, x [rows, d]; mean, rstd [rows]; gamma [d] -> dx [rows, d] (may alias dy);
 * dgamma, dbeta [d] += (either may be NULL: not wanted). */
luna_status luna_cpu_layer_norm_backward(luna_backend *be, luna_act *dx_, float *dgamma,
                                         float *dbeta, const luna_act *dy_, const luna_act *x_,
                                         const float *mean, const float *rstd, const float *gamma,
                                         int64_t rows, int d) {
    float *dx = (float *)dx_;
    const float *dy = (const float *)dy_;
    const float *x = (const float *)x_;
    if (rows < 0 || d <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "layer_norm_backward: bad size (rows %lld, d %d; d must be positive)",
                          (long long)rows, d);
    /* 1. dγ, dβ (before dx is written: dx may alias dy), 2. dx row by row. */
    luna_cpu_layer_norm_params(be, dgamma, dbeta, dy, x, mean, rstd, rows, d);
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (rows * d >= PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++)
        luna_cpu_layer_norm_row_backward(dx + r * d, dy + r * d, x + r * d, mean[r], rstd[r], gamma,
                                         d);
    return LUNA_OK;
}
