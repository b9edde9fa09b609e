/* The backend registry (after ggml's): programs and tests create a backend by name, so nothing
 * outside model/kernels/ names a particular backend's constructor.
 *
 *   luna_backend *be;
 *   luna_backend_options o = luna_backend_options_default();
 *   o.num_threads = 2;
 *   LUNA_TRY(luna_backend_create(&be, "cpu", &o));   // or "cuda"
 *   ...
 *   luna_backend_free(be);
 *
 * A build without a backend answers its name with one line saying how to build it. */
#ifndef LUNA_KERNELS_REGISTRY_H
#define LUNA_KERNELS_REGISTRY_H

#include <stdbool.h>

#include "core/backend.h"

typedef struct {
    int num_threads; /* CPU threads (0: the OpenMP default); host threads of a device backend */
    int device_id;   /* CUDA: the GPU ordinal (-1: the current/first one) */
    bool bf16;       /* device backends: keep activations in bf16 (default: fp32 for checking) */
    bool tf32;       /* CUDA, fp32 activations: GEMMs may use TF32 tensor cores (10-bit mantissa
                        inputs, fp32 accumulation); off by default, so fp32 means fp32 */
} luna_backend_options;

luna_backend_options luna_backend_options_default(void);

/* Create the backend `name` ("cpu", "cuda"); opt NULL = defaults. */
luna_status luna_backend_create(luna_backend **out, const char *name,
                                const luna_backend_options *opt);

/* The programs' --precision (auto|fp32|bf16) and --tf32 into o->bf16 / o->tf32 for `device`:
 * auto is bf16 on a device backend when `training` (mixed-precision training, the paper's
 * setting) and fp32 otherwise (decoding gives the CPU's translations unless asked); bf16 and
 * --tf32 on the CPU are errors (one line naming the option). */
luna_status luna_backend_options_set_precision(luna_backend_options *o, const char *device,
                                               const char *precision, bool tf32, bool training);
/* Sets o->device_id from --device-id: -1 (not given) on every device; a GPU number >= 0 only on
 * a device that has them (whether that GPU exists is checked when the backend is created).
 * Anything else is an error naming the option. */
luna_status luna_backend_options_set_device_id(luna_backend_options *o, const char *device,
                                               long long device_id);

#ifdef LUNA_WITH_CUDA
/* The CUDA backend's compute stream (a cudaStream_t) and its GPU ordinal in *device, for code
 * that orders device work of its own against the backend's (NCCL, trainer/communicator_nccl.c);
 * NULL for another backend. */
void *luna_backend_cuda_stream(const luna_backend *be, int *device);
#endif

/* Weights held for decoding (core/backend.h, hold_weights) kept once for several backends: from
 * now on dst's holds and the Linears it runs with held weights use src's held copies (the CPU's
 * packed panels or int8 values; holds counted over both, safe for the backends' threads), so W
 * translators of one model on W threads keep one copy instead of W. dst must hold nothing yet;
 * the copies live until the last backend sharing them is freed. Both CPU backends; any other:
 * LUNA_ERR_UNSUPPORTED (each backend keeps its own). */
luna_status luna_backend_share_held_weights(luna_backend *dst, luna_backend *src);

/* Every backend name the registry knows, NULL-terminated. */
const char *const *luna_backend_names(void);
/* NULL when this build can create `name`, else one line saying why not (for option checks). */
const char *luna_backend_missing(const char *name);

#endif
