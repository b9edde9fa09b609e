/* What every compute program does first: make sure OpenBLAS runs the kernels this CPU can run
 * (model/kernels/cpu/backend_cpu.h, luna_cpu_blas_better_core). OpenBLAS picks them when it is
 * loaded, so the program sets OPENBLAS_CORETYPE and executes itself again (same pid, same
 * arguments; the second start finds the variable set and goes on). A failed exec only costs
 * speed: a one-line notice, then the slow kernels. */
#ifndef LUNA_TOOLS_PROGRAM_START_H
#define LUNA_TOOLS_PROGRAM_START_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/kernels/cpu/backend_cpu.h"

static inline void luna_program_start(const char *prog, char **argv) {
    const char *core = luna_cpu_blas_better_core();
    if (!core) return;
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "%s: note: OpenBLAS uses its generic %s kernels on this CPU; restarting with "
                    "OPENBLAS_CORETYPE=%s failed (set it yourself for faster GEMMs)\n",
            prog, luna_cpu_blas_loaded_core(), core);
}

#endif
