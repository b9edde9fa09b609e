/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
 *
 * A counter-based generator maps (key, counter) to random bits with no hidden state, so the
 * random number for element i of a tensor depends only on (seed, step, tensor id, i) — never on
 * how many threads, which backend or which rank computed it. Dropout masks are therefore
 * reproducible and need not be stored: the backward pass regenerates them.
 */
#ifndef LUNA_RNG_H
#define LUNA_RNG_H

#include <stdint.h>

/* Identifies one random stream: a dropout site in one update, or a parameter's initialisation. */
typedef struct {
    uint64_t seed;      /* the run's --seed */
    uint64_t step;      /* update number (and micro-batch), or 0 for initialisation */
    uint32_t stream_id; /* the tensor/site id */
} luna_rng_key;

/* The Philox4x32-10 block function: four 32-bit words from a 128-bit counter and 64-bit key. */
void luna_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* The 32 random bits of elements 4·block0 .. 4·(block0 + nblocks) − 1 of the stream `key`, in
 * element order (out[4·nblocks]): the same bits as luna_rng_bits, computed eight blocks at a
 * time in a layout the compiler vectorises (dropout generates ~10^8 of them per update). */
void luna_rng_bits_blocks(luna_rng_key key, uint64_t block0, int64_t nblocks, uint32_t *out);

/* The 32 random bits for element `index` of the stream `key`. */
uint32_t luna_rng_bits(luna_rng_key key, uint64_t index);

/* Uniform in [0, 1) with 24 random bits, for element `index`. */
float luna_rng_uniform(luna_rng_key key, uint64_t index);

/* Standard normal for element `index` (Box–Muller on the element's own 4-word block). */
float luna_rng_normal(luna_rng_key key, uint64_t index);

/* Dropout keeps element `index` iff its uniform draw is >= p. */
static inline int luna_rng_dropout_keep(luna_rng_key key, uint64_t index, float p) {
    return luna_rng_uniform(key, index) >= p;
}

#endif
