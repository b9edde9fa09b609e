/* Communicators (see communicator.h): the single-process one, the default choice and the
 * failure agreement shared by all; MPI in communicator_mpi.c, NCCL in communicator_nccl.c. */
#include "trainer/communicator.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- single process -------------------------------------------------------------------------- */

static luna_status single_reduce_start(luna_communicator *c, luna_backend *be, float *data,
                                       size_t n) {
    (void)c, (void)be, (void)data, (void)n;
    return LUNA_OK;
}
static luna_status single_reduce_finish(luna_communicator *c, luna_backend *be, double *stats,
                                        size_t n) {
    (void)c, (void)be, (void)stats, (void)n;
    return LUNA_OK;
}
static luna_status single_host(luna_communicator *c, double *data, size_t n) {
    (void)c, (void)data, (void)n;
    return LUNA_OK;
}
static luna_status single_broadcast(luna_communicator *c, void *data, size_t bytes, int root) {
    (void)c, (void)data, (void)bytes, (void)root;
    return LUNA_OK;
}
static luna_status single_gather(luna_communicator *c, const void *mine, void *all, size_t bytes) {
    (void)c;
    memmove(all, mine, bytes);
    return LUNA_OK;
}
static luna_status single_barrier(luna_communicator *c) {
    (void)c;
    return LUNA_OK;
}
static luna_status single_attach(luna_communicator *c, luna_backend *be) {
    (void)c, (void)be;
    return LUNA_OK;
}
static void single_destroy(luna_communicator *c) { free(c); }

luna_status luna_communicator_create_single(luna_communicator **out) {
    luna_communicator *c = calloc(1, sizeof *c);
    if (!c) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    c->name = "single";
    c->rank = 0;
    c->world_size = 1;
    c->local_rank = 0;
    c->local_size = 1;
    c->reduce_start = single_reduce_start;
    c->reduce_finish = single_reduce_finish;
    c->all_reduce_sum_host = single_host;
    c->all_reduce_min_host = single_host;
    c->broadcast_host = single_broadcast;
    c->gather_host = single_gather;
    c->barrier = single_barrier;
    c->attach_device = single_attach;
    c->destroy = single_destroy;
    *out = c;
    return LUNA_OK;
}

luna_status luna_communicator_create_default(luna_communicator **out, int *argc, char ***argv,
                                             double timeout_seconds) {
#ifdef LUNA_WITH_MPI
    /* Open MPI, PMI-1/2 (MPICH, Intel MPI, srun --mpi=pmi2), PMIx (srun --mpi=pmix) */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK"))
        return luna_communicator_create_mpi(out, argc, argv, timeout_seconds);
#endif
    (void)argc, (void)argv, (void)timeout_seconds;
    return luna_communicator_create_single(out);
}

void luna_communicator_free(luna_communicator *c) {
    if (c) c->destroy(c);
}

/* ---- failures -------------------------------------------------------------------------------- */

luna_status luna_communicator_share_failure(luna_communicator *c, luna_status local,
                                            double failed_ranks, const char *what) {
    if (failed_ranks <= 0) return local;
    /* Who failed first (lowest rank), and its message, so that every rank (and rank 0, which
     * logs) says what went wrong rather than "another rank failed". */
    double lowest = local != LUNA_OK ? (double)c->rank : (double)c->world_size;
    char message[512];
    memset(message, 0, sizeof message);
    if (local != LUNA_OK) snprintf(message, sizeof message, "%s", luna_error_message());
    luna_status s = c->all_reduce_min_host(c, &lowest, 1);
    if (s == LUNA_OK && lowest < c->world_size)
        s = c->broadcast_host(c, message, sizeof message, (int)lowest);
    if (local != LUNA_OK) {
        if (s != LUNA_OK) luna_error_clear();
        luna_error(local, "%s", message); /* this rank's own message, unprefixed */
        return local;
    }
    if (s != LUNA_OK) return s;
    message[sizeof message - 1] = 0;
    return luna_error(LUNA_ERR_INTERNAL, "rank %d: %s (%s failed on %.0f rank(s); rank %d stops too)",
                      (int)lowest, message, what, failed_ranks, c->rank);
}

luna_status luna_communicator_agree(luna_communicator *c, luna_status local, const char *what) {
    if (c->world_size <= 1) return local;
    double failed = local != LUNA_OK ? 1.0 : 0.0;
    char saved[512] = "";
    if (local != LUNA_OK) snprintf(saved, sizeof saved, "%s", luna_error_message());
    luna_status s = c->all_reduce_sum_host(c, &failed, 1);
    if (s != LUNA_OK) {
        if (local == LUNA_OK) return s;
        luna_error_clear();
        return luna_error(local, "%s", saved);
    }
    if (local != LUNA_OK) luna_error(local, "%s", saved);
    return luna_communicator_share_failure(c, local, failed, what);
}
