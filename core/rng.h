/* Host-side random numbers on top of the shared Philox definition (core/philox.h): the
 * vectorised bulk generator used by the CPU dropout kernel and the normal draws of parameter
 * initialisation (host only: libm). */
#ifndef LUNA_RNG_H
#define LUNA_RNG_H

#include <stdint.h>

#include "core/philox.h"

/* The 32 random bits of elements 4·block0 .. 4·(block0 + nblocks) − 1 of the stream `key`, in
 * element order (out[4·nblocks]): the same bits as luna_rng_bits, computed eight blocks at a
 * time in a layout the compiler vectorises (dropout generates ~10^8 of them per update). */
void luna_rng_bits_blocks(luna_rng_key key, uint64_t block0, int64_t nblocks, uint32_t *out);

/* Standard normal for element `index` (Box–Muller on the element's own 4-word block). */
float luna_rng_normal(luna_rng_key key, uint64_t index);

#endif
