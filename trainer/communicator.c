/* Communicators (see communicator.h). */
#include "trainer/communicator.h"

#include <stdlib.h>

#ifdef LUNA_WITH_MPI
#include <mpi.h>
#endif

/* ---- single process -------------------------------------------------------------------------- */

static luna_status single_all_reduce_device(luna_communicator *c, luna_backend *be, float *data,
                                            size_t n) {
    (void)c, (void)be, (void)data, (void)n;
    return LUNA_OK;
}
static luna_status single_all_reduce_host(luna_communicator *c, double *data, size_t n) {
    (void)c, (void)data, (void)n;
    return LUNA_OK;
}
static luna_status single_barrier(luna_communicator *c) {
    (void)c;
    return LUNA_OK;
}
static void single_destroy(luna_communicator *c) { free(c); }

luna_status luna_communicator_create_single(luna_communicator **out) {
    luna_communicator *c = calloc(1, sizeof *c);
    if (!c) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    c->name = "single";
    c->rank = 0;
    c->world_size = 1;
    c->all_reduce_sum_device = single_all_reduce_device;
    c->all_reduce_sum_host = single_all_reduce_host;
    c->barrier = single_barrier;
    c->destroy = single_destroy;
    *out = c;
    return LUNA_OK;
}

/* ---- MPI ------------------------------------------------------------------------------------- */

#ifdef LUNA_WITH_MPI
typedef struct {
    int initialised_here;
    float *host;
    size_t capacity;
} mpi_impl;

static luna_status mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return LUNA_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return luna_error(LUNA_ERR_IO, "MPI: %s failed: %.*s", what, len, msg);
}

static luna_status mpi_all_reduce_device(luna_communicator *c, luna_backend *be, float *data,
                                         size_t n) {
    mpi_impl *m = c->impl;
    if (n == 0) return LUNA_OK;
    if (m->capacity < n) {
        float *h = realloc(m->host, n * sizeof(float));
        if (!h)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "MPI: out of host memory (%zu floats)", n);
        m->host = h;
        m->capacity = n;
    }
    LUNA_TRY(luna_mem_to_host(be, m->host, data, n * sizeof(float)));
    /* MPI counts are int: reduce in chunks. */
    for (size_t off = 0; off < n; off += (size_t)1 << 30) {
        size_t k = n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30);
        LUNA_TRY(mpi_check(
            MPI_Allreduce(MPI_IN_PLACE, m->host + off, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce(gradients)"));
    }
    return luna_mem_from_host(be, data, m->host, n * sizeof(float));
}

static luna_status mpi_all_reduce_host(luna_communicator *c, double *data, size_t n) {
    (void)c;
    return mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
                     "MPI_Allreduce(statistics)");
}

static luna_status mpi_barrier(luna_communicator *c) {
    (void)c;
    return mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

static void mpi_destroy(luna_communicator *c) {
    mpi_impl *m = c->impl;
    if (m->initialised_here) MPI_Finalize();
    free(m->host);
    free(m);
    free(c);
}

luna_status luna_communicator_create_mpi(luna_communicator **out, int *argc, char ***argv) {
    luna_communicator *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int flag = 0;
    MPI_Initialized(&flag);
    luna_status s = LUNA_OK;
    if (!flag) {
        s = mpi_check(MPI_Init(argc, argv), "MPI_Init");
        m->initialised_here = s == LUNA_OK;
    }
    if (s == LUNA_OK) s = mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), "MPI_Comm_rank");
    if (s == LUNA_OK) s = mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &c->world_size), "MPI_Comm_size");
    if (s != LUNA_OK) {
        free(c);
        free(m);
        return s;
    }
    c->name = "mpi";
    c->impl = m;
    c->all_reduce_sum_device = mpi_all_reduce_device;
    c->all_reduce_sum_host = mpi_all_reduce_host;
    c->barrier = mpi_barrier;
    c->destroy = mpi_destroy;
    *out = c;
    return LUNA_OK;
}
#endif

luna_status luna_communicator_create_default(luna_communicator **out, int *argc, char ***argv) {
#ifdef LUNA_WITH_MPI
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK"))
        return luna_communicator_create_mpi(out, argc, argv);
#endif
    (void)argc, (void)argv;
    return luna_communicator_create_single(out);
}

void luna_communicator_free(luna_communicator *c) {
    if (c) c->destroy(c);
}

luna_status luna_communicator_agree(luna_communicator *c, luna_status local, const char *what) {
    if (c->world_size <= 1) return local;
    double failed = local != LUNA_OK ? 1.0 : 0.0;
    luna_status s = c->all_reduce_sum_host(c, &failed, 1);
    if (local != LUNA_OK) return local;
    if (s != LUNA_OK) return s;
    if (failed > 0)
        return luna_error(LUNA_ERR_INTERNAL,
                          "%s failed on %.0f other rank(s) (see the message of that rank); rank %d "
                          "stops too",
                          what, failed, c->rank);
    return LUNA_OK;
}
