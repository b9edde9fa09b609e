/* Shared by the MPI communicator (communicator_mpi.c) and its NCCL extension
 * (communicator_nccl.c). Not for other modules. */
#ifndef LUNA_TRAINER_COMMUNICATOR_INTERNAL_H
#define LUNA_TRAINER_COMMUNICATOR_INTERNAL_H

#include <stddef.h>

#include "trainer/communicator.h"

/* The watchdog: a blocking wait is bracketed by enter/leave; one that lasts longer than the
 * timeout aborts the job (communicator.h). `what` must outlive the wait (a literal). */
void luna_comm_watch_enter(luna_communicator *c, const char *what);
void luna_comm_watch_leave(luna_communicator *c);
/* Called by the watchdog before it aborts the job (NCCL: ncclCommAbort), from its own thread. */
void luna_comm_set_abort_hook(luna_communicator *c, void (*hook)(void *ctx), void *ctx);
/* Lets MPI progress the outstanding non-blocking reductions (from a polling loop). */
void luna_comm_progress(luna_communicator *c);
/* Starts the non-blocking MPI sum of `n` host doubles, completed by the next
 * luna_comm_wait_host(). */
luna_status luna_comm_start_host(luna_communicator *c, double *data, size_t n);
luna_status luna_comm_wait_host(luna_communicator *c);

#ifdef LUNA_WITH_NCCL
/* The NCCL gradient path of a communicator (communicator_nccl.c). */
typedef struct luna_nccl luna_nccl;
/* Collective over the MPI communicator c: rank 0 makes the ncclUniqueId, MPI_Bcast sends it,
 * every rank joins with the GPU of `be` (selected when the backend was created). */
luna_status luna_nccl_create(luna_nccl **out, luna_communicator *c, luna_backend *be);
luna_status luna_nccl_reduce_start(luna_nccl *n, float *data, size_t count);
/* Waits (polling, under the watchdog) for the reductions started since the last finish; the
 * backend's compute stream is ordered after them. */
luna_status luna_nccl_reduce_finish(luna_nccl *n);
void luna_nccl_free(luna_nccl *n);
#endif

#endif
