#include "core/rng.h"

#include <math.h>

/* Eight consecutive blocks at once, structure-of-arrays: each round is the scalar round of
 * core/philox.h on eight lanes. With AVX2 the 32×32→64-bit products are vpmuludq on the even and
 * odd lanes. */
#define PHILOX_LANES 8
#ifdef __AVX2__
#include <immintrin.h>

/* hi and lo 32-bit halves of m · c for eight lanes of c. */
static inline void mul_hi_lo(__m256i c, __m256i m, __m256i *hi, __m256i *lo) {
    __m256i even = _mm256_mul_epu32(c, m);                       /* lanes 0, 2, 4, 6 */
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m); /* lanes 1, 3, 5, 7 */
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

static void philox_lanes(luna_rng_key key, uint64_t block0, uint32_t out[4][PHILOX_LANES]) {
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    /* block0 + j for j < 8 may carry into the high word */
    __m256i lo_words = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)block0), lane);
    __m256i carry = _mm256_cmpgt_epi32(
        _mm256_xor_si256(_mm256_set1_epi32((int)(uint32_t)block0), _mm256_set1_epi32(INT32_MIN)),
        _mm256_xor_si256(lo_words, _mm256_set1_epi32(INT32_MIN)));
    __m256i c0 = lo_words;
    __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(block0 >> 32)), carry);
    __m256i c2 = _mm256_set1_epi32((int)key.stream_id);
    const uint64_t step = luna_rng_key_step(key);
    __m256i c3 = _mm256_set1_epi32((int)(uint32_t)step);
    const __m256i m0 = _mm256_set1_epi32((int)LUNA_PHILOX_M0),
                  m1 = _mm256_set1_epi32((int)LUNA_PHILOX_M1);
    uint32_t k0 = (uint32_t)key.seed, k1 = (uint32_t)(key.seed >> 32) ^ (uint32_t)(step >> 32);
    for (int round = 0; round < 10; round++) {
        __m256i hi0, lo0, hi1, lo1;
        mul_hi_lo(c0, m0, &hi0, &lo0);
        mul_hi_lo(c2, m1, &hi1, &lo1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c1 = lo1;
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c3 = lo0;
        k0 += LUNA_PHILOX_W0;
        k1 += LUNA_PHILOX_W1;
    }
    _mm256_storeu_si256((__m256i *)out[0], c0);
    _mm256_storeu_si256((__m256i *)out[1], c1);
    _mm256_storeu_si256((__m256i *)out[2], c2);
    _mm256_storeu_si256((__m256i *)out[3], c3);
}
#else
static void philox_lanes(luna_rng_key key, uint64_t block0, uint32_t out[4][PHILOX_LANES]) {
    for (int j = 0; j < PHILOX_LANES; j++) {
        uint32_t w[4];
        luna_rng_block(key, block0 + (uint64_t)j, w);
        for (int k = 0; k < 4; k++)
            out[k][j] = w[k];
    }
}
#endif

void luna_rng_bits_blocks(luna_rng_key key, uint64_t block0, int64_t nblocks, uint32_t *out) {
    int64_t b = 0;
    for (; b + PHILOX_LANES <= nblocks; b += PHILOX_LANES) {
        uint32_t w[4][PHILOX_LANES];
        philox_lanes(key, block0 + (uint64_t)b, w);
        for (int j = 0; j < PHILOX_LANES; j++)
            for (int k = 0; k < 4; k++)
                out[4 * (b + j) + k] = w[k][j];
    }
    for (; b < nblocks; b++)
        luna_rng_block(key, block0 + (uint64_t)b, out + 4 * b);
}

float luna_rng_normal(luna_rng_key key, uint64_t index) {
    /* Element i uses block i (not i/4) so each normal has two independent 32-bit uniforms. */
    uint32_t words[4];
    luna_rng_block(key, index, words);
    double u1 = ((double)(words[0] >> 8) + 1.0) * (1.0 / 16777217.0); /* (0, 1] */
    double u2 = (double)(words[1] >> 8) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
