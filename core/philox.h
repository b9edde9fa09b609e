/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011), as host/device inline
 * functions: the CPU kernels and the CUDA kernels include this one definition, so dropout masks
 * are bit-identical across backends by construction (core/host_device.h).
 *
 * A counter-based generator maps (key, counter) to random bits with no hidden state, so the
 * random number for element i of a tensor depends only on (seed, step, tensor id, i) — never on
 * how many threads, which backend or which rank computed it. Dropout masks are therefore
 * reproducible and need not be stored: the backward pass regenerates them.
 *
 * Counter layout: (block index lo, block index hi, stream id, step lo); the key mixes the seed
 * with the step's high bits. Element i lives in block i/4, word i%4. */
#ifndef LUNA_CORE_PHILOX_H
#define LUNA_CORE_PHILOX_H

#include <stdint.h>

#include "core/host_device.h"

/* Identifies one random stream: a dropout site in one update, or a parameter's initialisation. */
typedef struct {
    uint64_t seed;      /* the run's --seed */
    uint64_t step;      /* update number (and micro-batch), or 0 for initialisation */
    uint32_t stream_id; /* the tensor/site id */
    /* NULL, or the step's address in the backend's memory, read when the kernel runs instead of
     * `step`: a pass replayed as a graph keeps its launch arguments, so the step that changes
     * from one replay to the next must come from memory (model/seq2seq_graphs.c) */
    const uint64_t *step_at;
} luna_rng_key;

/* The key's step: `step`, or the value at step_at. */
LUNA_HD static inline uint64_t luna_rng_key_step(luna_rng_key key) {
    return key.step_at ? *key.step_at : key.step;
}

/* Philox constants from the Random123 reference implementation. */
#define LUNA_PHILOX_M0 0xD2511F53u
#define LUNA_PHILOX_M1 0xCD9E8D57u
#define LUNA_PHILOX_W0 0x9E3779B9u
#define LUNA_PHILOX_W1 0xBB67AE85u

/* The Philox4x32-10 block function: four 32-bit words from a 128-bit counter and 64-bit key. */
LUNA_HD static inline void luna_philox4x32(const uint32_t counter[4], const uint32_t key[2],
                                           uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)LUNA_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)LUNA_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += LUNA_PHILOX_W0;
        k1 += LUNA_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four words of block `block` of the stream `key` (elements 4·block .. 4·block + 3). */
LUNA_HD static inline void luna_rng_block(luna_rng_key key, uint64_t block, uint32_t out[4]) {
    const uint64_t step = luna_rng_key_step(key);
    uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), key.stream_id, (uint32_t)step};
    uint32_t k[2] = {(uint32_t)key.seed, (uint32_t)(key.seed >> 32) ^ (uint32_t)(step >> 32)};
    luna_philox4x32(counter, k, out);
}

/* The 32 random bits for element `index` of the stream `key`. The word is selected, not indexed:
 * a run-time index into words[] puts the array in a GPU thread's local memory. */
LUNA_HD static inline uint32_t luna_rng_bits(luna_rng_key key, uint64_t index) {
    uint32_t words[4];
    luna_rng_block(key, index >> 2, words);
    const uint32_t lo = index & 1 ? words[1] : words[0], hi = index & 1 ? words[3] : words[2];
    return index & 2 ? hi : lo;
}

/* Uniform in [0, 1) with 24 random bits from a word (exact in float). */
LUNA_HD static inline float luna_rng_word_uniform(uint32_t bits) {
    return (float)(bits >> 8) * (1.0f / 16777216.0f);
}

LUNA_HD static inline float luna_rng_uniform(luna_rng_key key, uint64_t index) {
    return luna_rng_word_uniform(luna_rng_bits(key, index));
}

/* Dropout keeps element `index` iff its uniform draw is >= p. */
LUNA_HD static inline int luna_rng_dropout_keep(luna_rng_key key, uint64_t index, float p) {
    return luna_rng_uniform(key, index) >= p;
}

#endif
