/* The MPI communicator (communicator.h): MPI_COMM_WORLD, host collectives, gradients by
 * non-blocking MPI_Iallreduce (in place on the CPU backend's memory; through a host copy for a
 * device backend), the watchdog thread, and the NCCL gradient path when attached. */
#ifdef LUNA_WITH_MPI
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainer/communicator_internal.h"

/* A started gradient reduction that goes through host memory (device backends without NCCL). */
typedef struct {
    float *device, *host;
    size_t n;
} staged;

typedef struct {
    int initialised_here;
    bool thread_multiple;
    MPI_Comm local; /* the ranks of this node */
    /* outstanding non-blocking reductions (gradients, then statistics) */
    MPI_Request *requests;
    size_t nrequests, cap_requests;
    staged *staged;
    size_t nstaged, cap_staged;
    /* the watchdog */
    double timeout;
    pthread_t thread;
    bool thread_started, quit;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    const char *blocked_in; /* NULL: not waiting */
    double blocked_since;
    void (*abort_hook)(void *);
    void *abort_ctx;
#ifdef LUNA_WITH_NCCL
    luna_nccl *nccl;
#endif
} mpi_impl;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static luna_status mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return LUNA_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return luna_error(LUNA_ERR_IO, "MPI: %s failed: %.*s", what, len, msg);
}

/* ---- the watchdog ---------------------------------------------------------------------------- */

static void *watchdog_main(void *arg) {
    luna_communicator *c = arg;
    mpi_impl *m = c->impl;
    pthread_mutex_lock(&m->lock);
    while (!m->quit) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000 * 1000; /* checks 5 times a second */
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&m->wake, &m->lock, &until);
        if (m->quit || !m->blocked_in || now_seconds() - m->blocked_since < m->timeout) continue;
        fprintf(stderr,
                "rank %d: %s did not complete within %g s (--comm-timeout): another rank died, "
                "hangs or is far behind; aborting every rank\n",
                c->rank, m->blocked_in, m->timeout);
        fflush(stderr);
        if (m->abort_hook) m->abort_hook(m->abort_ctx);
        /* MPI_Abort from this thread is legal under MPI_THREAD_MULTIPLE; otherwise exiting makes
         * mpirun (or srun --kill-on-bad-exit) end the others. */
        if (m->thread_multiple) MPI_Abort(MPI_COMM_WORLD, 1);
        _exit(1);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

void luna_comm_watch_enter(luna_communicator *c, const char *what) {
    mpi_impl *m = c->impl;
    if (!m->thread_started) return;
    pthread_mutex_lock(&m->lock);
    m->blocked_in = what;
    m->blocked_since = now_seconds();
    pthread_mutex_unlock(&m->lock);
}

void luna_comm_watch_leave(luna_communicator *c) {
    mpi_impl *m = c->impl;
    if (!m->thread_started) return;
    pthread_mutex_lock(&m->lock);
    m->blocked_in = NULL;
    pthread_mutex_unlock(&m->lock);
}

void luna_comm_set_abort_hook(luna_communicator *c, void (*hook)(void *ctx), void *ctx) {
    mpi_impl *m = c->impl;
    pthread_mutex_lock(&m->lock);
    m->abort_hook = hook;
    m->abort_ctx = ctx;
    pthread_mutex_unlock(&m->lock);
}

/* ---- non-blocking reductions ----------------------------------------------------------------- */

static luna_status push_request(mpi_impl *m, MPI_Request r) {
    if (m->nrequests == m->cap_requests) {
        size_t cap = m->cap_requests ? 2 * m->cap_requests : 64;
        MPI_Request *p = realloc(m->requests, cap * sizeof *p);
        if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "MPI: out of memory");
        m->requests = p;
        m->cap_requests = cap;
    }
    m->requests[m->nrequests++] = r;
    return LUNA_OK;
}

void luna_comm_progress(luna_communicator *c) {
    mpi_impl *m = c->impl;
    int done = 0;
    if (m->nrequests) MPI_Testall((int)m->nrequests, m->requests, &done, MPI_STATUSES_IGNORE);
}

/* MPI counts are int: reductions in chunks of 2^30 elements. */
static luna_status start_sum(luna_communicator *c, void *data, size_t n, MPI_Datatype type,
                             size_t elem) {
    mpi_impl *m = c->impl;
    for (size_t off = 0; off < n; off += (size_t)1 << 30) {
        size_t k = n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30);
        MPI_Request r;
        LUNA_TRY(mpi_check(MPI_Iallreduce(MPI_IN_PLACE, (char *)data + off * elem, (int)k, type,
                                          MPI_SUM, MPI_COMM_WORLD, &r),
                           "MPI_Iallreduce"));
        LUNA_TRY(push_request(m, r));
    }
    luna_comm_progress(c);
    return LUNA_OK;
}

luna_status luna_comm_start_host(luna_communicator *c, double *data, size_t n) {
    return n ? start_sum(c, data, n, MPI_DOUBLE, sizeof(double)) : LUNA_OK;
}

luna_status luna_comm_wait_host(luna_communicator *c) {
    mpi_impl *m = c->impl;
    if (!m->nrequests) return LUNA_OK;
    luna_comm_watch_enter(c, "MPI_Waitall (gradient and statistics all-reduce)");
    int rc = MPI_Waitall((int)m->nrequests, m->requests, MPI_STATUSES_IGNORE);
    luna_comm_watch_leave(c);
    m->nrequests = 0;
    return mpi_check(rc, "MPI_Waitall");
}

static luna_status mpi_reduce_start(luna_communicator *c, luna_backend *be, float *data,
                                    size_t n) {
    mpi_impl *m = c->impl;
    if (n == 0) return LUNA_OK;
#ifdef LUNA_WITH_NCCL
    if (m->nccl) return luna_nccl_reduce_start(m->nccl, data, n);
#endif
    if (be->device == LUNA_DEVICE_CPU) return start_sum(c, data, n, MPI_FLOAT, sizeof(float));
    /* a device without NCCL: through a host copy of this range */
    if (m->nstaged == m->cap_staged) {
        size_t cap = m->cap_staged ? 2 * m->cap_staged : 16;
        staged *p = realloc(m->staged, cap * sizeof *p);
        if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "MPI: out of memory");
        m->staged = p;
        m->cap_staged = cap;
    }
    float *host = malloc(n * sizeof(float));
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "MPI: out of host memory (%zu floats)", n);
    luna_status s = luna_mem_to_host(be, host, data, n * sizeof(float));
    if (s != LUNA_OK) {
        free(host);
        return s;
    }
    m->staged[m->nstaged++] = (staged){.device = data, .host = host, .n = n};
    return start_sum(c, host, n, MPI_FLOAT, sizeof(float));
}

static luna_status mpi_reduce_finish(luna_communicator *c, luna_backend *be, double *stats,
                                     size_t n) {
    mpi_impl *m = c->impl;
    double t0 = now_seconds();
    /* the statistics travel beside the last gradient bucket: one more request, no round trip */
    luna_status s = luna_comm_start_host(c, stats, n);
#ifdef LUNA_WITH_NCCL
    if (s == LUNA_OK && m->nccl) s = luna_nccl_reduce_finish(m->nccl);
#endif
    luna_status w = luna_comm_wait_host(c);
    if (s == LUNA_OK) s = w;
    for (size_t i = 0; i < m->nstaged; i++) {
        if (s == LUNA_OK)
            s = luna_mem_from_host(be, m->staged[i].device, m->staged[i].host,
                                   m->staged[i].n * sizeof(float));
        free(m->staged[i].host);
    }
    m->nstaged = 0;
    /* from_host copies may still read the host buffers on a device stream: freed above only
     * after the copy, which luna_mem_from_host allows ("host buffer may be reused as soon as the
     * call returns") */
    c->reduce_seconds += now_seconds() - t0;
    return s;
}

/* ---- blocking host collectives --------------------------------------------------------------- */

static luna_status mpi_host_op(luna_communicator *c, double *data, size_t n, MPI_Op op) {
    luna_comm_watch_enter(c, "MPI_Allreduce (statistics)");
    int rc = MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_DOUBLE, op, MPI_COMM_WORLD);
    luna_comm_watch_leave(c);
    return mpi_check(rc, "MPI_Allreduce(statistics)");
}
static luna_status mpi_sum_host(luna_communicator *c, double *data, size_t n) {
    return mpi_host_op(c, data, n, MPI_SUM);
}
static luna_status mpi_min_host(luna_communicator *c, double *data, size_t n) {
    return mpi_host_op(c, data, n, MPI_MIN);
}

static luna_status mpi_broadcast(luna_communicator *c, void *data, size_t bytes, int root) {
    luna_comm_watch_enter(c, "MPI_Bcast");
    int rc = MPI_Bcast(data, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    luna_comm_watch_leave(c);
    return mpi_check(rc, "MPI_Bcast");
}

static luna_status mpi_gather(luna_communicator *c, const void *mine, void *all, size_t bytes) {
    luna_comm_watch_enter(c, "MPI_Allgather");
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    luna_comm_watch_leave(c);
    return mpi_check(rc, "MPI_Allgather");
}

static luna_status mpi_barrier(luna_communicator *c) {
    luna_comm_watch_enter(c, "MPI_Barrier");
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    luna_comm_watch_leave(c);
    return mpi_check(rc, "MPI_Barrier");
}

static luna_status mpi_attach_device(luna_communicator *c, luna_backend *be) {
#ifdef LUNA_WITH_NCCL
    mpi_impl *m = c->impl;
    if (be->device == LUNA_DEVICE_CUDA && !m->nccl) {
        LUNA_TRY(luna_nccl_create(&m->nccl, c, be));
        c->name = "mpi+nccl";
    }
#else
    (void)c, (void)be;
#endif
    return LUNA_OK;
}

static void mpi_destroy(luna_communicator *c) {
    mpi_impl *m = c->impl;
#ifdef LUNA_WITH_NCCL
    luna_comm_set_abort_hook(c, NULL, NULL);
    luna_nccl_free(m->nccl);
#endif
    if (m->thread_started) {
        pthread_mutex_lock(&m->lock);
        m->quit = true;
        pthread_cond_signal(&m->wake);
        pthread_mutex_unlock(&m->lock);
        pthread_join(m->thread, NULL);
    }
    for (size_t i = 0; i < m->nstaged; i++)
        free(m->staged[i].host);
    free(m->staged);
    free(m->requests);
    if (m->local != MPI_COMM_NULL) MPI_Comm_free(&m->local);
    if (m->initialised_here) MPI_Finalize();
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->wake);
    free(m);
    free(c);
}

luna_status luna_communicator_create_mpi(luna_communicator **out, int *argc, char ***argv,
                                         double timeout_seconds) {
    luna_communicator *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->wake, NULL);
    m->local = MPI_COMM_NULL;
    c->impl = m;
    c->destroy = mpi_destroy;
    int flag = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&flag);
    luna_status s = LUNA_OK;
    if (!flag) {
        s = mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init");
        m->initialised_here = s == LUNA_OK;
    } else {
        MPI_Query_thread(&provided);
    }
    m->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    if (s == LUNA_OK) s = mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), "MPI_Comm_rank");
    if (s == LUNA_OK) s = mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &c->world_size), "MPI_Comm_size");
    if (s == LUNA_OK)
        s = mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank,
                                          MPI_INFO_NULL, &m->local),
                      "MPI_Comm_split_type");
    if (s == LUNA_OK) s = mpi_check(MPI_Comm_rank(m->local, &c->local_rank), "MPI_Comm_rank");
    if (s == LUNA_OK) s = mpi_check(MPI_Comm_size(m->local, &c->local_size), "MPI_Comm_size");
    m->timeout = timeout_seconds;
    if (s == LUNA_OK && timeout_seconds > 0) {
        if (pthread_create(&m->thread, NULL, watchdog_main, c) != 0)
            s = luna_error(LUNA_ERR_INTERNAL, "MPI: cannot start the watchdog thread");
        else
            m->thread_started = true;
    }
    if (s != LUNA_OK) {
        mpi_destroy(c);
        return s;
    }
    c->name = "mpi";
    c->reduce_start = mpi_reduce_start;
    c->reduce_finish = mpi_reduce_finish;
    c->all_reduce_sum_host = mpi_sum_host;
    c->all_reduce_min_host = mpi_min_host;
    c->broadcast_host = mpi_broadcast;
    c->gather_host = mpi_gather;
    c->barrier = mpi_barrier;
    c->attach_device = mpi_attach_device;
    *out = c;
    return LUNA_OK;
}
#else
/* ISO C forbids an empty translation unit. */
typedef int luna_communicator_mpi_unused;
#endif
