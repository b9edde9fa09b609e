/* Symmetric int8 quantization of the rows of a matrix: the one definition shared by int8
 * checkpoints (model/quantize.c, tools/programs/luna-quantize.c) and the CPU backend's int8
 * weights (model/kernels/cpu/held_int8.c).
 *
 * Row r of w [rows, cols] becomes scale[r] = max_k |w[r, k]| / 127 and
 *   q[r, k] = clamp(nearest-even(w[r, k] / scale[r]), -127, 127)    (scale 0: a row of zeros),
 * so w ≈ q · scale with |w − q·scale| ≤ scale / 2 per element. -128 is never produced: the
 * CPU kernels' products rely on |q| ≤ 127 (model/kernels/cpu/held_int8.c).
 *
 * Quantizing rows that are themselves q·scale (a dequantized int8 checkpoint) gives back q exactly
 * and the scale within two ulps: the per-element error of q·scale against q·scale' is then
 * ≤ 127·2⁻²² relative, far below half a step, so nearest rounding lands on q again. Loading an
 * int8 checkpoint into fp32 and quantizing it once more is therefore lossless. */
#ifndef LUNA_CORE_QUANTIZE_H
#define LUNA_CORE_QUANTIZE_H

#include <stdint.h>

#define LUNA_INT8_MAX 127

/* q [rows, cols] and scale [rows] from w [rows, cols] (row stride cols), as above. A non-finite
 * w gives an unspecified (but in-range) q; callers check finiteness first. */
void luna_quantize_rows_int8(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale);

/* The same with qmax (1 ≤ qmax ≤ 127) in place of 127: scale[r] = max_k |w[r, k]| / qmax and
 * |q| ≤ qmax (the CPU's int8 Linear quantizes its activations to ±63: held_int8.h). */
void luna_quantize_rows_range(const float *w, int64_t rows, int64_t cols, int qmax, int8_t *q,
                              float *scale);

/* w [rows, cols] = q · scale[row], element by element in fp32. */
void luna_dequantize_rows_int8(const int8_t *q, const float *scale, int64_t rows, int64_t cols,
                               float *w);

#endif
