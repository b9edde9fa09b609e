/* Eight rows of 8 floats transposed in AVX2 registers: the one-row dot kernels (gemm.c's
 * row_dots8, cross_attention.c's scores) take 8 rows at a time this way, so that each lane of one
 * accumulator is one row's dot product, summed in ascending k as a single chain; the held
 * Linear packs its blocks of rows k-major with it (held_weights.c). */
#ifndef LUNA_CPU_TRANSPOSE8_H
#define LUNA_CPU_TRANSPOSE8_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* t[i] = (r0[i], r1[i], ..., r7[i]) for i < 8. */
__attribute__((target("avx2"), always_inline)) static inline void
luna_transpose8_regs(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 r4, __m256 r5, __m256 r6,
                     __m256 r7, __m256 t[8]) {
    const __m256 u0 = _mm256_unpacklo_ps(r0, r1), u1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 u2 = _mm256_unpacklo_ps(r2, r3), u3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 u4 = _mm256_unpacklo_ps(r4, r5), u5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 u6 = _mm256_unpacklo_ps(r6, r7), u7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 v0 = _mm256_shuffle_ps(u0, u2, 0x44), v1 = _mm256_shuffle_ps(u0, u2, 0xEE);
    const __m256 v2 = _mm256_shuffle_ps(u1, u3, 0x44), v3 = _mm256_shuffle_ps(u1, u3, 0xEE);
    const __m256 v4 = _mm256_shuffle_ps(u4, u6, 0x44), v5 = _mm256_shuffle_ps(u4, u6, 0xEE);
    const __m256 v6 = _mm256_shuffle_ps(u5, u7, 0x44), v7 = _mm256_shuffle_ps(u5, u7, 0xEE);
    t[0] = _mm256_permute2f128_ps(v0, v4, 0x20);
    t[1] = _mm256_permute2f128_ps(v1, v5, 0x20);
    t[2] = _mm256_permute2f128_ps(v2, v6, 0x20);
    t[3] = _mm256_permute2f128_ps(v3, v7, 0x20);
    t[4] = _mm256_permute2f128_ps(v0, v4, 0x31);
    t[5] = _mm256_permute2f128_ps(v1, v5, 0x31);
    t[6] = _mm256_permute2f128_ps(v2, v6, 0x31);
    t[7] = _mm256_permute2f128_ps(v3, v7, 0x31);
}

/* t[i] = (b[0][k + i], b[1][k + i], ..., b[7][k + i]) for i < 8. */
__attribute__((target("avx2"), always_inline)) static inline void
luna_transpose8(const float *const b[8], int k, __m256 t[8]) {
    luna_transpose8_regs(_mm256_loadu_ps(b[0] + k), _mm256_loadu_ps(b[1] + k),
                         _mm256_loadu_ps(b[2] + k), _mm256_loadu_ps(b[3] + k),
                         _mm256_loadu_ps(b[4] + k), _mm256_loadu_ps(b[5] + k),
                         _mm256_loadu_ps(b[6] + k), _mm256_loadu_ps(b[7] + k), t);
}
#endif

#endif
