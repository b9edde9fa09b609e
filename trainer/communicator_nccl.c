/* NCCL gradient all-reduce over the MPI communicator (communicator.h, communicator_internal.h).
 *
 * One communication stream per rank. A bucket's reduction is ordered after the backward ops that
 * produced it by an event recorded on the compute stream (the comm stream waits for it, the host
 * does not), so the all-reduce of the last layers' gradients runs while the GPU computes the
 * earlier layers' backward. At the end of the update an event recorded on the comm stream makes
 * the compute stream wait for the sums (the optimizer's ops come after them in stream order); the
 * host polls that event (with ncclCommGetAsyncError, as NCCL recommends for failure detection)
 * under the communicator's watchdog, and ncclCommAbort ends a collective that cannot complete.
 *
 * Gradients are reduced in fp32 (the master gradients; bf16 reduction would halve the bytes but
 * sums 8 ranks' gradients with an 8-bit mantissa — not offered). */
#if defined(LUNA_WITH_MPI) && defined(LUNA_WITH_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/registry.h"
#include "trainer/communicator_internal.h"

struct luna_nccl {
    luna_communicator *c;
    ncclComm_t comm;
    cudaStream_t compute, stream;
    /* compute -> comm before each bucket (one event serves all: cudaStreamWaitEvent waits for
     * the record made just before it, a later record does not change that wait) */
    cudaEvent_t ready;
    cudaEvent_t done; /* comm -> compute, at the end of the update */
    int started;                   /* buckets started since the last finish */
    bool aborted;
};

static luna_status nccl_check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return LUNA_OK;
    return luna_error(LUNA_ERR_IO, "NCCL: %s failed: %s", what, ncclGetErrorString(r));
}

static luna_status cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return LUNA_OK;
    return luna_error(LUNA_ERR_INTERNAL, "CUDA: %s failed: %s (%s)", what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

static void abort_hook(void *ctx) {
    luna_nccl *n = ctx;
    if (n->comm && !n->aborted) {
        n->aborted = true;
        ncclCommAbort(n->comm);
    }
}

luna_status luna_nccl_create(luna_nccl **out, luna_communicator *c, luna_backend *be) {
    *out = NULL;
    int device = -1;
    void *compute = luna_backend_cuda_stream(be, &device);
    if (!compute)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "NCCL: the backend is not the CUDA backend");
    luna_nccl *n = calloc(1, sizeof *n);
    if (!n) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    n->c = c;
    n->compute = (cudaStream_t)compute;
    /* The GPU was chosen when the backend was created (before this, as NCCL requires). */
    luna_status s = cuda_check(cudaSetDevice(device), "cudaSetDevice");
    if (s == LUNA_OK)
        s = cuda_check(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking),
                       "cudaStreamCreate");
    if (s == LUNA_OK)
        s = cuda_check(cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming),
                       "cudaEventCreate");
    if (s == LUNA_OK)
        s = cuda_check(cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming),
                       "cudaEventCreate");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    luna_status id_status = LUNA_OK;
    if (s == LUNA_OK && c->rank == 0) id_status = nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    /* every rank learns whether rank 0 has an id before any waits in ncclCommInitRank */
    s = luna_communicator_agree(c, s != LUNA_OK ? s : id_status, "NCCL setup");
    if (s == LUNA_OK) s = c->broadcast_host(c, &id, sizeof id, 0);
    if (s == LUNA_OK) {
        luna_comm_set_abort_hook(c, abort_hook, n);
        luna_comm_watch_enter(c, "ncclCommInitRank");
        s = nccl_check(ncclCommInitRank(&n->comm, c->world_size, id, c->rank), "ncclCommInitRank");
        luna_comm_watch_leave(c);
    }
    s = luna_communicator_agree(c, s, "NCCL setup");
    if (s != LUNA_OK) {
        luna_nccl_free(n);
        return s;
    }
    *out = n;
    return LUNA_OK;
}

luna_status luna_nccl_reduce_start(luna_nccl *n, float *data, size_t count) {
    /* the bucket's gradients are complete once the compute stream reaches this point */
    LUNA_TRY(cuda_check(cudaEventRecord(n->ready, n->compute), "cudaEventRecord"));
    LUNA_TRY(cuda_check(cudaStreamWaitEvent(n->stream, n->ready, 0), "cudaStreamWaitEvent"));
    /* watched too: an enqueue can block (NCCL's queue full; the harness's synchronous fake) */
    luna_comm_watch_enter(n->c, "ncclAllReduce (gradients)");
    ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat32, ncclSum, n->comm, n->stream);
    luna_comm_watch_leave(n->c);
    LUNA_TRY(nccl_check(r, "ncclAllReduce"));
    n->started++;
    return LUNA_OK;
}

luna_status luna_nccl_reduce_finish(luna_nccl *n) {
    if (n->started == 0) return LUNA_OK;
    n->started = 0;
    LUNA_TRY(cuda_check(cudaEventRecord(n->done, n->stream), "cudaEventRecord"));
    /* the optimizer (compute stream) reads the sums only after them */
    LUNA_TRY(cuda_check(cudaStreamWaitEvent(n->compute, n->done, 0), "cudaStreamWaitEvent"));
    /* The host waits too (the trainer reads the reduced statistics next, and a failed or hung
     * peer must surface here): poll, letting MPI progress the statistics meanwhile. */
    luna_comm_watch_enter(n->c, "ncclAllReduce (gradients)");
    luna_status s = LUNA_OK;
    for (;;) {
        cudaError_t e = cudaEventQuery(n->done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            s = cuda_check(e, "the gradient all-reduce");
            break;
        }
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
        if (r != ncclSuccess || async != ncclSuccess) {
            s = nccl_check(r != ncclSuccess ? r : async, "the gradient all-reduce");
            break;
        }
        luna_comm_progress(n->c);
        sched_yield();
    }
    luna_comm_watch_leave(n->c);
    return s;
}

void luna_nccl_free(luna_nccl *n) {
    if (!n) return;
    if (n->comm && !n->aborted) ncclCommDestroy(n->comm); /* an abort freed it */
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->done) cudaEventDestroy(n->done);
    if (n->stream) cudaStreamDestroy(n->stream);
    free(n);
}
#else
/* ISO C forbids an empty translation unit. */
typedef int luna_communicator_nccl_unused;
#endif
