/* beam_select on the CPU (core/backend.h, "Decoding"): core/beam_select.h's step, the code the
 * CUDA backend runs on the device, for each sentence in turn. A step selects among a few
 * candidates per sentence (2·beam of each row's list): far below what a thread team would pay
 * back. */
#include "core/beam_select.h"

#include "model/kernels/cpu/cpu_ops.h"

luna_status luna_cpu_beam_select(luna_backend *be, const luna_beam_select_args *a) {
    (void)be;
    for (int s = 0; s < a->S; s++)
        luna_beam_select_sentence(a, s);
    return LUNA_OK;
}
