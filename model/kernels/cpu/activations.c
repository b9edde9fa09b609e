/* Elementwise activations, x, y, dx, dy [n]. In place allowed (y == x; dx == dy), so no restrict.
 * Backward takes the forward INPUT x and overwrites dx = dy · φ'(x).
 *
 *   softplus_ln2:  φ(z) = log2(1 + 2^z) = (1/β)·log1p(exp(β z)),  β = ln 2;
 *                  φ(z) = z when β z > 20 (PyTorch's Softplus threshold);
 *                  φ'(z) = sigmoid(β z) = e/(1 + e), e = exp(β z)  (1 when β z > 20)
 *   elu_plus_one:  φ(z) = z + 1 (z > 0), exp(z) (z ≤ 0);  φ'(z) = 1 (z > 0), exp(z) (z ≤ 0)
 *
 * softplus for very negative z: exp(β z) underflows to 0 and φ = 0, φ' = 0 (the true values are
 * below 2^-126). Float math throughout; the inputs are single activations, not sums.
 */
#include <math.h>

#include "model/kernels/cpu/cpu_ops.h"

#define SOFTPLUS_BETA 0.6931471805599453f /* ln 2 */
#define SOFTPLUS_THRESHOLD 20.0f

static inline float softplus_ln2(float z) {
    float bz = SOFTPLUS_BETA * z;
    return bz > SOFTPLUS_THRESHOLD ? z : log1pf(expf(bz)) / SOFTPLUS_BETA;
}

static inline float softplus_ln2_grad(float z) {
    float bz = SOFTPLUS_BETA * z;
    if (bz > SOFTPLUS_THRESHOLD) return 1.0f;
    float e = expf(bz);
    return e / (1.0f + e);
}

luna_status luna_cpu_softplus_ln2_forward(luna_backend *be, luna_act *y_, const luna_act *x_,
                                          int64_t n) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        y[i] = softplus_ln2(x[i]);
    return LUNA_OK;
}

luna_status luna_cpu_softplus_ln2_backward(luna_backend *be, luna_act *dx_, const luna_act *dy_,
                                           const luna_act *x_, int64_t n) {
    float *dx = (float *)dx_;
    const float *dy = (const float *)dy_;
    const float *x = (const float *)x_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        dx[i] = dy[i] * softplus_ln2_grad(x[i]);
    return LUNA_OK;
}

luna_status luna_cpu_elu_plus_one_forward(luna_backend *be, luna_act *y_, const luna_act *x_,
                                          int64_t n) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] + 1.0f : expf(x[i]);
    return LUNA_OK;
}

luna_status luna_cpu_elu_plus_one_backward(luna_backend *be, luna_act *dx_, const luna_act *dy_,
                                           const luna_act *x_, int64_t n) {
    float *dx = (float *)dx_;
    const float *dy = (const float *)dy_;
    const float *x = (const float *)x_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        dx[i] = x[i] > 0.0f ? dy[i] : dy[i] * expf(x[i]);
    return LUNA_OK;
}
