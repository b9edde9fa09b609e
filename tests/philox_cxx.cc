// core/philox.h compiled as C++17, the way the CUDA backend's kernels (.cu, compiled by nvcc or
// by g++ -x c++ in the CPU execution harness) include it. test_core.c checks that these bits
// equal the C compilation's, so CPU and GPU dropout masks agree by construction.
#include <cstdint>

#include "core/philox.h"

extern "C" uint32_t luna_test_philox_cxx_bits(uint64_t seed, uint64_t step, uint32_t stream,
                                              uint64_t index) {
    luna_rng_key key = {seed, step, stream, nullptr};
    return luna_rng_bits(key, index);
}

extern "C" int luna_test_philox_cxx_keep(uint64_t seed, uint64_t step, uint32_t stream,
                                         uint64_t index, float p) {
    luna_rng_key key = {seed, step, stream, nullptr};
    return luna_rng_dropout_keep(key, index, p);
}
