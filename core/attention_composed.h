/* attention_forward/backward (core/backend.h) as the composition of a backend's gemm_grid and
 * softmax_dropout ops: the CPU backend's implementation, and the CUDA backend's where its
 * one-kernel form does not apply (fp32 activations, rows too long for shared memory). */
#ifndef LUNA_CORE_ATTENTION_COMPOSED_H
#define LUNA_CORE_ATTENTION_COMPOSED_H

#include "core/backend.h"

luna_status luna_attention_composed_forward(luna_backend *be, luna_act *o, luna_act *a,
                                            luna_act *a_d, const luna_act *q, const luna_act *k,
                                            const luna_act *v, const luna_attention_shape *s,
                                            float p, luna_rng_key key);
luna_status luna_attention_composed_backward(luna_backend *be, luna_act *dq, luna_act *dk,
                                             luna_act *dv, luna_act *ds, const luna_act *d_o,
                                             const luna_act *q, const luna_act *k,
                                             const luna_act *v, const luna_act *a,
                                             const luna_act *a_d, const luna_attention_shape *s,
                                             float p, luna_rng_key key);

#endif
