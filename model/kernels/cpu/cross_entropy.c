/* Log-softmax + label-smoothed cross entropy (spec §8), in nats.
 *
 * logits z [N, V], targets y [N]; rows with y == padding_idx are ignored. Per row:
 *   lse  = log Σ_v exp(z_v) = m + log Σ_v exp(z_v − m),  m = max_v z_v     (no overflow)
 *   −log p_v = lse − z_v
 *   nll  = lse − z_y
 *   loss = (1−ε)·nll + (ε/V)·Σ_v (lse − z_v) = (1−ε)·nll + ε·(lse − (1/V)·Σ_v z_v)
 * with V the full vocabulary. Both ops write loss, nll, lse [N] (all 0 on pad rows);
 * cross_entropy_forward_backward also the gradient, row by row after the row's forward.
 *
 * Gradient (∂loss/∂z_v = p_v − (1−ε)·[v = y] − ε/V,  p_v = exp(z_v − m) / Σ_u exp(z_u − m)):
 *   dz = grad_scale · (softmax − (1−ε)·onehot(y) − ε/V)   on non-pad rows, 0 on pad rows.
 * p_v is formed from m and the row's Σ exp, not from exp(z_v − lse): lse rounded to float carries
 * an absolute error of up to half an ulp of |lse| (~5e-7 at |lse| ≈ 10) into exp's argument, i.e.
 * that relative error into every p_v; m is exact and the sum's error is ~1e-16 in double.
 * Each element of dz depends only on the same element of z (and the row's m and sum), so dlogits
 * may alias logits: the [N, V] logits buffer becomes its own gradient.
 *
 * Precision: exp is evaluated in float by vexpf() below (vectorisable, ≤ 2 ulp) and the row sums
 * (Σ exp, Σ z) are accumulated in double; lse, nll and loss are formed in double and rounded once.
 * Threads take whole rows, so results do not depend on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/kernels/cpu/cpu_ops.h"

/* Branch-free select on the bit patterns: cond ? a : b. (A float ?: would be turned into a branch
 * that, with the default -ftrapping-math, stops GCC from vectorising the loop.) */
static inline float select_f(int cond, float a, float b) {
    uint32_t ua, ub, mask = 0u - (uint32_t)(cond != 0);
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    uint32_t r = (ua & mask) | (ub & ~mask);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* exp(x) for float x, written so that the compiler vectorises loops calling it (libm's expf is
 * a scalar call). Cephes' expf: x = k·ln2 + r, |r| ≤ ln2/2 (ln2 split in two for an exact
 * reduction), exp(r) by a degree-7 polynomial, 2^k through the exponent bits. Relative error
 * ≤ 2 ulp on [−87.3, 88.7]; 0 below (where exp underflows), +inf above; NaN stays NaN. */
static inline float vexpf(float x) {
    const float hi = 88.7228f, lo = -87.3365f;
    float xc = select_f(x > lo, x, lo); /* NaN -> lo: the integer path never sees a NaN */
    xc = select_f(xc < hi, xc, hi);
    /* k = round(x / ln2) by the 1.5·2^23 trick (exact for |k| < 2^22). */
    float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float r2 = r * r;
    float poly = 1.9875691500e-4f;
    poly = poly * r + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    float er = poly * r2 + r + 1.0f;
    /* 2^k, k in [-126, 128], as 2^(k/2)·2^(k−k/2) so that k = 128 (x near hi) stays finite. */
    int32_t k = (int32_t)kf;
    int32_t k1 = k / 2, k2 = k - k1;
    uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    float result = er * s1 * s2;
    result = select_f(x < lo, 0.0f, result);
    result = select_f(x > hi, INFINITY, result);
    return select_f(x != x, x, result);
}

#define LUNA_CE_PARALLEL_MIN 65536 /* elements of logits */

/* One row's forward: lse, nll, loss (see the file comment). */
static void row_forward(const float *restrict z, int V, int32_t y, double eps, float *loss,
                        float *nll, float *lse, float *max_out, double *esum_out) {
    float m = z[0];
    double zsum = 0.0;
#pragma omp simd reduction(max : m) reduction(+ : zsum)
    for (int v = 0; v < V; v++) {
        m = z[v] > m ? z[v] : m;
        zsum += (double)z[v];
    }
    double esum = 0.0;
#pragma omp simd reduction(+ : esum)
    for (int v = 0; v < V; v++)
        esum += (double)vexpf(z[v] - m);
    const double row_lse = (double)m + log(esum);
    const double row_nll = row_lse - (double)z[y];
    const double smooth = row_lse - zsum / (double)V; /* (1/V) Σ_v −log p_v */
    *lse = (float)row_lse;
    *nll = (float)row_nll;
    *loss = (float)((1.0 - eps) * row_nll + eps * smooth);
    *max_out = m;
    *esum_out = esum;
}

/* A pad row's gradient. */
static void zero_row(float *dz, int V) {
    for (int v = 0; v < V; v++)
        dz[v] = 0.0f;
}

/* One row's gradient from its max m and scale = grad_scale / Σ exp(z − m) (formed in double,
 * rounded once); dz may be z (each element read before it is written). */
static void row_backward(float *dz, const float *z, int V, int32_t y, float m, float scale,
                         float smooth, float target_term) {
#pragma omp simd
    for (int v = 0; v < V; v++)
        dz[v] = vexpf(z[v] - m) * scale - smooth;
    dz[y] -= target_term;
}

/* loss, nll, lse [N] from logits [N, V] and targets [N]. */
luna_status luna_cpu_cross_entropy_forward(luna_backend *be, float *loss, float *nll, float *lse,
                                           const luna_act *logits_, const int32_t *targets,
                                           int64_t N, int V, float epsilon, int padding_idx) {
    const float *logits = (const float *)logits_;
    LUNA_TRY(luna_op_check_ids("cross_entropy_forward", "target", targets, N, V, &padding_idx));
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (N * (int64_t)V > LUNA_CE_PARALLEL_MIN)
    for (int64_t r = 0; r < N; r++) {
        const int32_t y = targets[r];
        if (y == padding_idx)
            loss[r] = nll[r] = lse[r] = 0.0f;
        else {
            float m;
            double esum;
            row_forward(logits + r * (int64_t)V, V, y, epsilon, &loss[r], &nll[r], &lse[r], &m,
                        &esum);
        }
    }
    return LUNA_OK;
}

/* Forward and backward row by row: the row is read from cache the second time. */
luna_status luna_cpu_cross_entropy_forward_backward(luna_backend *be, float *loss, float *nll,
                                                    float *lse, luna_act *dlogits_,
                                                    const luna_act *logits_, const int32_t *targets,
                                                    int64_t N, int V, float epsilon,
                                                    int padding_idx, float grad_scale) {
    float *dlogits = (float *)dlogits_;
    const float *logits = (const float *)logits_;
    LUNA_TRY(
        luna_op_check_ids("cross_entropy_forward_backward", "target", targets, N, V, &padding_idx));
    const float smooth = grad_scale * (epsilon / (float)V);
    const float target_term = grad_scale * (1.0f - epsilon);
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (N * (int64_t)V > LUNA_CE_PARALLEL_MIN)
    for (int64_t r = 0; r < N; r++) {
        float *dz = dlogits + r * (int64_t)V;
        const float *z = logits + r * (int64_t)V;
        const int32_t y = targets[r];
        if (y == padding_idx) {
            loss[r] = nll[r] = lse[r] = 0.0f;
            zero_row(dz, V);
            continue;
        }
        float m;
        double esum;
        row_forward(z, V, y, epsilon, &loss[r], &nll[r], &lse[r], &m, &esum);
        row_backward(dz, z, V, y, m, (float)((double)grad_scale / esum), smooth, target_term);
    }
    return LUNA_OK;
}

/* In order, in double: the sums a host loop over the values read back would form. */
luna_status luna_cpu_loss_sums(luna_backend *be, double *sums, const float *loss, const float *nll,
                               int64_t n) {
    (void)be;
    double a = 0.0, b = 0.0;
    for (int64_t i = 0; i < n; i++) {
        a += loss[i];
        b += nll[i];
    }
    sums[0] += a;
    sums[1] += b;
    return LUNA_OK;
}
