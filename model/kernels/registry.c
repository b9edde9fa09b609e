/* The backend registry (registry.h): a table of names and constructors; the CUDA entry exists in
 * every build so that a build without CUDA can say so. LUNA_HAVE_CUDA_BACKEND is defined by
 * CMakeLists.txt for -DLUNA_CUDA=ON builds that have the backend's sources. */
#include "model/kernels/registry.h"

#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cpu/cpu_ops.h"

#ifdef LUNA_HAVE_CUDA_BACKEND
luna_status luna_backend_cuda_create(luna_backend **out, const luna_backend_options *opt);
#endif

static luna_status create_cpu(luna_backend **out, const luna_backend_options *opt) {
    if (opt->device_id != -1)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--device-id %d: the CPU backend has no device numbers (leave "
                          "--device-id out with --device cpu)",
                          opt->device_id);
    return luna_backend_cpu_create(out, opt->num_threads);
}

#ifdef LUNA_HAVE_CUDA_BACKEND
static luna_status create_cuda(luna_backend **out, const luna_backend_options *opt) {
    return luna_backend_cuda_create(out, opt);
}
#else
#define create_cuda NULL
#endif

typedef struct {
    const char *name;
    luna_status (*create)(luna_backend **out, const luna_backend_options *opt);
    const char *missing; /* why it is absent from this build */
} entry;

static const entry backends[] = {
    {"cpu", create_cpu, NULL},
    {"cuda", create_cuda,
     "this luna was built without CUDA (configure with cmake -DLUNA_CUDA=ON on a machine with the "
     "CUDA toolkit)"},
};
static const char *const names[] = {"cpu", "cuda", NULL};

luna_backend_options luna_backend_options_default(void) {
    return (luna_backend_options){.num_threads = 0, .device_id = -1, .bf16 = false, .tf32 = false};
}

luna_status luna_backend_options_set_precision(luna_backend_options *o, const char *device,
                                               const char *precision, bool tf32, bool training) {
    const bool cpu = strcmp(device, "cpu") == 0;
    if (strcmp(precision, "auto") == 0)
        o->bf16 = !cpu && training;
    else if (strcmp(precision, "fp32") == 0)
        o->bf16 = false;
    else if (strcmp(precision, "bf16") == 0)
        o->bf16 = true;
    else
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--precision %s: unknown (auto, fp32 or bf16)",
                          precision);
    if (cpu && o->bf16)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--precision bf16: the CPU backend computes in fp32 only (use --device "
                          "cuda, or --precision fp32)");
    if (tf32 && (cpu || o->bf16))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--tf32: applies to --device cuda with --precision fp32 only");
    o->tf32 = tf32;
    return LUNA_OK;
}

luna_status luna_backend_options_set_device_id(luna_backend_options *o, const char *device,
                                               long long device_id) {
    if (device_id < -1 || device_id > 1000000)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--device-id %lld: a GPU number is 0 or more (-1: the default)",
                          device_id);
    if (device_id != -1 && strcmp(device, "cpu") == 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--device-id %lld: --device cpu has no device numbers (leave "
                          "--device-id out)",
                          device_id);
    o->device_id = (int)device_id;
    return LUNA_OK;
}

luna_status luna_backend_share_held_weights(luna_backend *dst, luna_backend *src) {
    if (strcmp(dst->name, "cpu") != 0 || strcmp(src->name, "cpu") != 0)
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "share_held_weights: %s and %s backends keep their own held weights",
                          dst->name, src->name);
    return luna_cpu_share_held(dst, src);
}

const char *const *luna_backend_names(void) { return names; }

const char *luna_backend_missing(const char *name) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i].name, name) == 0)
            return backends[i].create ? NULL : backends[i].missing;
    return "unknown device (known: cpu, cuda)";
}

luna_status luna_backend_create(luna_backend **out, const char *name,
                                const luna_backend_options *opt) {
    *out = NULL;
    luna_backend_options defaults = luna_backend_options_default();
    if (!opt) opt = &defaults;
    if (opt->device_id < -1)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--device-id %d: a GPU number is 0 or more (-1: the default)",
                          opt->device_id);
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        if (strcmp(backends[i].name, name) != 0) continue;
        if (!backends[i].create)
            return luna_error(LUNA_ERR_UNSUPPORTED, "--device %s: %s", name, backends[i].missing);
        return backends[i].create(out, opt);
    }
    return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--device %s: unknown device (known: cpu, cuda)",
                      name);
}
