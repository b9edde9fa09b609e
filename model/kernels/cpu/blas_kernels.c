/* OpenBLAS kernel family check (see backend_cpu.h, luna_cpu_blas_better_core). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/cpu/backend_cpu.h"

/* Kernel families older than AVX2+FMA: what OpenBLAS falls back to for a CPU model it does not
 * know (Prescott for an unknown Intel model). */
static bool is_legacy_core(const char *name) {
    static const char *const legacy[] = {"Prescott", "Core2",  "Penryn", "Dunnington",
                                         "Nehalem",  "Atom",   "Katmai", "Coppermine",
                                         "Northwood", "Banias", "Sandybridge"};
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++)
        if (!strcmp(name, legacy[i])) return true;
    return false;
}

const char *luna_cpu_blas_loaded_core(void) { return openblas_get_corename(); }

const char *luna_cpu_blas_better_core(void) {
    const char *forced = getenv("OPENBLAS_CORETYPE");
    if (forced && *forced) return NULL; /* the user's (or our earlier) choice stands */
    const char *loaded = openblas_get_corename();
    if (!loaded || !is_legacy_core(loaded)) return NULL;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}
