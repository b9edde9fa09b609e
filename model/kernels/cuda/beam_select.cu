/* beam_select on the GPU (core/backend.h "Decoding"; CPU reference
 * model/kernels/cpu/beam_select.c): core/beam_select.h's step, a thread per sentence. A
 * sentence's step is a serial merge of 2·beam candidates from each of its rows' short lists (a
 * heap of 2·beam) and the copy of its new hypotheses' histories: a few hundred operations, so a
 * thread per sentence and one launch for the pool is the grain that fits; what the kernel saves
 * is the host's part, the candidate lists' readback and the loop over them between two steps. */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/beam_select.h"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 64;

__global__ void beam_select_kernel(luna_beam_select_args a) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < a.S) luna_beam_select_sentence(&a, s);
}

} // namespace

extern "C" cudaError_t luna_cuda_beam_select(cudaStream_t s, const luna_beam_select_args *a) {
    if (a->S <= 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((a->S + kThreads - 1) / kThreads);
    LUNA_LAUNCH(beam_select_kernel, blocks, kThreads, 0, s, *a);
    return cudaGetLastError();
}
