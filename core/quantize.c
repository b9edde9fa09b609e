#include "core/quantize.h"

#include <math.h>

void luna_quantize_rows_int8(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale) {
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + r * cols;
        int8_t *qr = q + r * cols;
        float amax = 0.0f;
        for (int64_t k = 0; k < cols; k++)
            amax = fmaxf(amax, fabsf(wr[k]));
        const float s = amax / (float)LUNA_INT8_MAX;
        scale[r] = s;
        for (int64_t k = 0; k < cols; k++) {
            /* a row so small that amax / 127 rounds to 0 quantizes to zeros, like a zero row */
            float v = s > 0.0f ? nearbyintf(wr[k] / s) : 0.0f;
            v = fminf(fmaxf(v, -(float)LUNA_INT8_MAX), (float)LUNA_INT8_MAX);
            qr[k] = (int8_t)(v == v ? v : 0.0f);
        }
    }
}

void luna_dequantize_rows_int8(const int8_t *q, const float *scale, int64_t rows, int64_t cols,
                               float *w) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            w[r * cols + k] = (float)q[r * cols + k] * scale[r];
}
