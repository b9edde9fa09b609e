/* The communicator of data-parallel training (Marian's interface): every rank runs the same
 * updates on its own shard of the batches, and the gradients (one flat buffer, model/param_table.h)
 * and the update's statistics are summed across ranks before the optimizer step.
 *
 * The single-process implementation (world size 1) makes every operation a no-op, so CPU and
 * one-GPU runs need no MPI. With LUNA_WITH_MPI (cmake -DLUNA_MPI=ON) an MPI implementation over
 * MPI_COMM_WORLD is available; gradients go through host memory (no CUDA-aware MPI assumed). */
#ifndef LUNA_TRAINER_COMMUNICATOR_H
#define LUNA_TRAINER_COMMUNICATOR_H

#include <stddef.h>

#include "core/backend.h"
#include "core/status.h"

typedef struct luna_communicator luna_communicator;
struct luna_communicator {
    const char *name;
    int rank, world_size;
    /* Sum `n` floats of device memory across ranks, in place. */
    luna_status (*all_reduce_sum_device)(luna_communicator *c, luna_backend *be, float *data,
                                         size_t n);
    /* Sum `n` doubles of host memory across ranks, in place (statistics: tokens, losses). */
    luna_status (*all_reduce_sum_host)(luna_communicator *c, double *data, size_t n);
    /* Every rank waits for the others. */
    luna_status (*barrier)(luna_communicator *c);
    void (*destroy)(luna_communicator *c);
    void *impl;
};

/* World size 1, rank 0. */
luna_status luna_communicator_create_single(luna_communicator **out);

#ifdef LUNA_WITH_MPI
/* Initialises MPI (if not yet) and uses MPI_COMM_WORLD; destroy() finalizes it when this call
 * initialised it. */
luna_status luna_communicator_create_mpi(luna_communicator **out, int *argc, char ***argv);
#endif

/* The MPI communicator when built with MPI and started by mpirun with more than one rank, else
 * the single-process one. */
luna_status luna_communicator_create_default(luna_communicator **out, int *argc, char ***argv);

void luna_communicator_free(luna_communicator *c);

/* Makes a step that may fail on some ranks only collective: every rank passes its own status
 * and all learn whether any failed, so that all stop together instead of the others waiting
 * forever in the next collective. Returns `local` on a rank where it failed (its message kept),
 * an error naming the step on the others, LUNA_OK when every rank succeeded. World size 1: returns
 * `local` without communicating. */
luna_status luna_communicator_agree(luna_communicator *c, luna_status local, const char *what);

#endif
