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

#endif
