/* The CPU backend: host memory, OpenMP threads, OpenBLAS GEMM. Its kernels are the reference
 * implementation every other backend is tested against. Programs create it through the registry
 * (luna_backend_create(&be, "cpu", &options), model/kernels/registry.h); the functions here are
 * the CPU-only part of its interface. */
#ifndef LUNA_KERNELS_BACKEND_CPU_H
#define LUNA_KERNELS_BACKEND_CPU_H

#include "core/backend.h"

/* The CPU backend with `num_threads` OpenMP threads (0: keep the OpenMP default). Also sets
 * OpenBLAS's thread count. Owns a scratch arena. Free with luna_backend_free. */
luna_status luna_backend_cpu_create(luna_backend **out, int num_threads);

/* Change the thread count of a CPU backend (results do not depend on it). */
void luna_backend_cpu_set_threads(luna_backend *be, int num_threads);

/* OpenBLAS chooses its kernels when it is loaded, from the CPU's model number; a model it does
 * not know (seen: "Intel(R) Xeon(R) Processor", family 6 model 207, with Debian's 0.3.21) gets
 * the generic SSE3 "Prescott" kernels: GEMMs several times slower than the AVX-512 "SkylakeX"
 * ones on the same CPU (docs/benchmarks.md). Only OPENBLAS_CORETYPE, read at load time, changes
 * the choice.
 * luna_cpu_blas_better_core returns the family to use ("SkylakeX" with AVX-512, "Haswell" with
 * AVX2 + FMA) when the loaded one is such a fallback and OPENBLAS_CORETYPE is unset, else NULL;
 * programs then set the variable and start again (tools/programs/program_start.h). Different
 * kernels round differently: results are reproducible for a given kernel family. */
const char *luna_cpu_blas_better_core(void);
const char *luna_cpu_blas_loaded_core(void); /* the family in use (openblas_get_corename) */

#endif
