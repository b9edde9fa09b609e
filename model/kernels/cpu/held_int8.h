/* int8 weights held for decoding (hold_weights with LUNA_I8, core/backend.h) and the Linear that
 * uses them: y = x·Wᵀ + b with W quantized per output channel and x per row, integer products
 * summed exactly in int32, dequantized in the epilogue with the bias fused.
 *
 * The math (every kernel computes exactly this; results are the same bits whatever the kernel,
 * the thread count or the rows around a row):
 *   (qW, sW) = luna_quantize_rows_int8(W)      per output channel n (core/quantize.h): |qW| ≤ 127
 *   (qx, sx) = luna_quantize_rows_range(x, LUNA_INT8_ACT_MAX)
 *                                              per row i: |qx| ≤ 63; a row holding a NaN or an
 *                                              infinity gets sx = NaN (its outputs are NaN), qx = 0
 *   acc[i, n] = Σ_k qx[i, k] · qW[n, k]        (int32, exact: |acc| ≤ 63 · 127 · in)
 *   y[i, n]   = fmaf((float)acc[i, n], sx[i] · sW[n], b[n])      (b NULL: + 0)
 * so |y − x·Wᵀ − b| ≤ sW[n]/2 · Σ_k |x[i, k]| + sx[i]/2 · Σ_k |qW[n, k]·sW[n]| plus fp32 rounding
 * (tests/test_ops_int8.c checks this bound against a float64 product).
 *
 * Why activations have 7 bits (±63) and weights 8: AVX2 has no u8 × s8 dot product into s32;
 * vpmaddubsw multiplies u8 × s8 into s16 pairs that saturate above 2¹⁵ − 1. With |qx| ≤ 63 the
 * row enters as qx + 64 (u8, at most 127), a pair is at most 2·127² = 32258, and no instruction
 * has to move x's signs onto the weights (the vpsignb per row and group that an 8-bit x needs, a
 * quarter of the kernel's vector operations): the products run ~1.2× faster (same rule as
 * FBGEMM's reduce_range on AVX2). The weights keep their 8 bits (and int8 checkpoints their
 * meaning); every kernel quantizes x the same way, so a CPU with VNNI translates exactly as one
 * without. The quality cost, measured: docs/benchmarks.md.
 *
 * Kernels, chosen once per backend from the CPU's features (luna_int8_kernel_best):
 *   AVX-512 VNNI  vpdpbusd: u8 × s8 → s32 with 4 products per lane and no intermediate saturation;
 *                 x enters as qx + 128 (u8), and acc = Σ (qx + 128)·qW − 128·Σ_k qW (column
 *                 sums kept with the panels);
 *   AVX2          vpmaddubsw multiplies qx + 64 (u8) by qW into s16 pairs that never saturate
 *                 (above), vpmaddwd by ones widens them into the s32 accumulators, and
 *                 acc = Σ (qx + 64)·qW − 64·Σ_k qW;
 *   scalar        the same sums in C (any CPU; the reference the tests compare the others with).
 *
 * Layout: W is packed once into 16-column panels of 4-k groups,
 *   Wp[p][g][j][kk] = qW[16p + j, 4g + kk]    (zero past `out` and past `in`),
 * 64 bytes per (p, g): two AVX2 registers of 8 columns × 4 k, or one AVX-512 register. x is packed
 * per call in blocks of MR rows, xp[blk][g][i][kk] = qx[MR·blk + i, 4g + kk], so a kernel
 * broadcasts one row's 4 k as a 32-bit lane. */
#ifndef LUNA_CPU_HELD_INT8_H
#define LUNA_CPU_HELD_INT8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* The activations' range: |qx| ≤ 63 (above). */
#define LUNA_INT8_ACT_MAX 63

typedef enum {
    LUNA_INT8_SCALAR = 0,
    LUNA_INT8_AVX2,
    LUNA_INT8_AVX512_VNNI,
} luna_int8_kernel;

/* The fastest kernel this CPU runs; whether it runs `k`; its name ("scalar", "avx2",
 * "avx512-vnni"). */
luna_int8_kernel luna_int8_kernel_best(void);
bool luna_int8_kernel_available(luna_int8_kernel k);
const char *luna_int8_kernel_name(luna_int8_kernel k);

typedef struct {
    int out, in, groups; /* groups = ceil(in / 4) */
    int8_t *panels;      /* [ceil(out/16)][groups][16][4], 64-byte aligned */
    float *scale;        /* [ceil(out/16)·16] sW (0 past out) */
    int32_t *colsum;     /* [ceil(out/16)·16] Σ_k qW[n, k] (the VNNI kernel's u8 offset) */
} luna_int8_weight;

/* Quantizes W [out, in] and packs it (threads: OpenMP threads for the packing). */
luna_status luna_int8_weight_pack(luna_int8_weight *w, const float *W, int out, int in,
                                  int threads);
void luna_int8_weight_free(luna_int8_weight *w);

/* Per-call buffers (the packed rows of x and their scales), grown as needed. */
typedef struct {
    int8_t *xs;   /* qx, packed (the scalar kernel's) */
    uint8_t *xa;  /* AVX2: qx + 64; VNNI: qx + 128; packed like xs */
    float *sx;    /* [rows rounded up to MR] */
    int8_t *qrow; /* [threads][4·groups·4]: a block's rows of qx before packing */
    size_t cap, rows_cap, qrow_cap;
} luna_int8_scratch;

void luna_int8_scratch_free(luna_int8_scratch *s);

/* y [rows, out] = x [rows, in] · Wᵀ + b (b NULL: none) as above, with kernel k (which must be
 * available). false when out of memory (nothing written). */
bool luna_int8_linear(luna_int8_kernel k, const luna_int8_weight *w, luna_int8_scratch *s, float *y,
                      const float *x, const float *b, int64_t rows, int threads);

#endif
