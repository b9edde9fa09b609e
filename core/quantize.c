#include "core/quantize.h"

#include <math.h>

void luna_quantize_rows_int8(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale) {
    luna_quantize_rows_range(w, rows, cols, LUNA_INT8_MAX, q, scale);
}

void luna_quantize_rows_range(const float *w, int64_t rows, int64_t cols, int qmax, int8_t *q,
                              float *scale) {
    const float m = (float)qmax;
    /* comparisons rather than fmaxf / fminf, which are library calls without -ffinite-math-only
     * and made loading a model's weights several times slower; a NaN compares false (ignored in
     * the maximum, quantized to 0) */
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + r * cols;
        int8_t *qr = q + r * cols;
        float amax = 0.0f;
        for (int64_t k = 0; k < cols; k++) {
            const float a = fabsf(wr[k]);
            amax = a > amax ? a : amax;
        }
        const float s = amax / m;
        scale[r] = s;
        if (s == 0.0f) { /* a zero row, or one so small that amax / qmax rounds to 0 */
            for (int64_t k = 0; k < cols; k++)
                qr[k] = 0;
            continue;
        }
        for (int64_t k = 0; k < cols; k++) {
            float v = nearbyintf(wr[k] / s);
            v = v > m ? m : v;
            v = v < -m ? -m : v;
            qr[k] = v == v ? (int8_t)v : 0;
        }
    }
}

void luna_dequantize_rows_int8(const int8_t *q, const float *scale, int64_t rows, int64_t cols,
                               float *w) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            w[r * cols + k] = (float)q[r * cols + k] * scale[r];
}
