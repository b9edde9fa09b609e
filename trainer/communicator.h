/* The communicator of data-parallel training (Marian's interface): every rank runs the same
 * updates on its own shard of the batches, and the gradients (one flat buffer, model/param_table.h)
 * and the update's statistics are summed across ranks before the optimizer step.
 *
 * Three implementations:
 *   single  world size 1: every operation is a no-op (CPU and one-GPU runs need no MPI);
 *   mpi     (LUNA_WITH_MPI) MPI_COMM_WORLD: host collectives, and gradients through host memory
 *           with non-blocking MPI_Iallreduce (no CUDA-aware MPI assumed) — also the launcher's
 *           bootstrap: rank, world, local rank;
 *   nccl    (LUNA_WITH_NCCL, over mpi) gradients summed by NCCL on the GPU on a communication
 *           stream of its own, ordered against the backend's compute stream by events; the
 *           ncclUniqueId travels by MPI_Bcast; host collectives stay on MPI.
 *
 * Gradients are reduced in buckets (trainer/grad_buckets.h): reduce_start() launches the sum of
 * one range as soon as the backward pass has finished it, reduce_finish() sums the update's
 * statistics with the last of them and waits for all. Every blocking call is watched: when one
 * does not complete within the timeout (a rank died or hangs), the rank prints one line and
 * aborts the whole job (MPI_Abort; ncclCommAbort first), so no rank waits forever. */
#ifndef LUNA_TRAINER_COMMUNICATOR_H
#define LUNA_TRAINER_COMMUNICATOR_H

#include <stddef.h>

#include "core/backend.h"
#include "core/status.h"

typedef struct luna_communicator luna_communicator;
struct luna_communicator {
    const char *name; /* "single", "mpi", "mpi+nccl" */
    int rank, world_size;
    int local_rank, local_size; /* ranks on this node (shared memory), this rank's place there */
    /* Start summing `n` floats of the backend's memory across ranks, in place. The data must not
     * be touched until reduce_finish() returns; calls are matched across ranks by their order. */
    luna_status (*reduce_start)(luna_communicator *c, luna_backend *be, float *data, size_t n);
    /* Sum `n` host doubles (the update's statistics; n may be 0) and wait for every reduction
     * started since the last finish: afterwards the backend's next ops see the sums. */
    luna_status (*reduce_finish)(luna_communicator *c, luna_backend *be, double *stats, size_t n);
    /* Sum (or take the minimum of) `n` host doubles across ranks, in place; blocking. */
    luna_status (*all_reduce_sum_host)(luna_communicator *c, double *data, size_t n);
    luna_status (*all_reduce_min_host)(luna_communicator *c, double *data, size_t n);
    /* Copy `bytes` of host memory from rank `root` to every rank. */
    luna_status (*broadcast_host)(luna_communicator *c, void *data, size_t bytes, int root);
    /* Every rank's `bytes` of host memory, in rank order, into all[world_size · bytes]. */
    luna_status (*gather_host)(luna_communicator *c, const void *mine, void *all, size_t bytes);
    /* Every rank waits for the others. */
    luna_status (*barrier)(luna_communicator *c);
    /* Use the GPU of backend `be` for reduce_start (nccl over mpi); a no-op where the
     * implementation has nothing better than the host path. Collective. */
    luna_status (*attach_device)(luna_communicator *c, luna_backend *be);
    void (*destroy)(luna_communicator *c);
    void *impl;
    /* counters of this process (reported in the log) */
    double reduce_seconds; /* spent waiting in reduce_finish */
};

/* World size 1, rank 0. */
luna_status luna_communicator_create_single(luna_communicator **out);

#ifdef LUNA_WITH_MPI
/* Initialises MPI (if not yet; thread level MULTIPLE requested, for the watchdog) and uses
 * MPI_COMM_WORLD; destroy() finalizes it when this call initialised it. timeout_seconds > 0: the
 * watchdog (see above); 0: none. */
luna_status luna_communicator_create_mpi(luna_communicator **out, int *argc, char ***argv,
                                         double timeout_seconds);
#endif

/* The MPI communicator when built with MPI and started by a launcher (mpirun, srun) with more
 * than one rank, else the single-process one. */
luna_status luna_communicator_create_default(luna_communicator **out, int *argc, char ***argv,
                                             double timeout_seconds);

void luna_communicator_free(luna_communicator *c);

/* Makes a step that may fail on some ranks only collective: every rank passes its own status
 * and all learn whether any failed, so that all stop together instead of the others waiting
 * forever in the next collective. Returns LUNA_OK when every rank succeeded; otherwise every rank
 * returns the message of the lowest failing rank, prefixed "rank R: " when it is another rank's
 * (this rank's own error unchanged). World size 1: returns `local` without communicating. */
luna_status luna_communicator_agree(luna_communicator *c, luna_status local, const char *what);

/* The second half of agree() for callers that already summed a failure count with other
 * statistics (`failed_ranks`): shares the lowest failing rank's message as agree() does. */
luna_status luna_communicator_share_failure(luna_communicator *c, luna_status local,
                                            double failed_ranks, const char *what);

#endif
