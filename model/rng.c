#include "model/rng.h"

#include <math.h>

/* Philox constants from the Random123 reference implementation. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void luna_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Counter layout: (block index lo, block index hi, stream id, step lo); the key mixes the seed
 * with the step's high bits. Element i lives in block i/4, word i%4. */
static void block_for(luna_rng_key key, uint64_t block, uint32_t out[4]) {
    uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), key.stream_id,
                           (uint32_t)key.step};
    uint32_t k[2] = {(uint32_t)key.seed, (uint32_t)(key.seed >> 32) ^ (uint32_t)(key.step >> 32)};
    luna_philox4x32(counter, k, out);
}

uint32_t luna_rng_bits(luna_rng_key key, uint64_t index) {
    uint32_t words[4];
    block_for(key, index >> 2, words);
    return words[index & 3];
}

float luna_rng_uniform(luna_rng_key key, uint64_t index) {
    return (float)(luna_rng_bits(key, index) >> 8) * (1.0f / 16777216.0f);
}

float luna_rng_normal(luna_rng_key key, uint64_t index) {
    /* Element i uses block i (not i/4) so each normal has two independent 32-bit uniforms. */
    uint32_t words[4];
    block_for(key, index, words);
    double u1 = ((double)(words[0] >> 8) + 1.0) * (1.0 / 16777217.0); /* (0, 1] */
    double u2 = (double)(words[1] >> 8) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
