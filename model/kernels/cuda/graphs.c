/* Graphs on the CUDA backend (core/backend.h, luna_backend_memory: graph_begin ... graph_free):
 * stream capture of the backend's stream, instantiated once and replayed with cudaGraphLaunch.
 *
 * Why: a decoder step is ~20 launches a layer on a few hundred rows, each a few microseconds of
 * device work; launched one by one the host's launch time is the step's time. A replay is one
 * launch. What a replay cannot do is run host code: transfers and allocations are refused while
 * capturing (luna_cuda_not_capturing: the staging memory a captured upload reads from would hold
 * another step's data at a replay), and the caller uploads what changes before the launch.
 *
 * Capture mode ThreadLocal: this thread's unsafe calls fail (and invalidate the capture); data
 * loading threads of other work may allocate meanwhile. */
#include <pthread.h>

#include "model/kernels/cuda/backend_cuda.h"

luna_status luna_cuda_not_capturing(luna_backend *be, const char *what) {
    const luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (c->capturing && pthread_equal(c->capture_thread, pthread_self()))
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "cuda: %s while capturing a graph (a graph replays device work only)",
                          what);
    return LUNA_OK;
}

luna_status luna_cuda_graph_begin(luna_backend *be) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (c->capturing) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "cuda: a capture is running");
    LUNA_TRY(luna_cuda_check(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
                             "cudaStreamBeginCapture"));
    c->capturing = true;
    c->blas.capturing = true;
    c->capture_thread = pthread_self();
    return LUNA_OK;
}

luna_status luna_cuda_graph_end(luna_backend *be, void **graph) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    *graph = NULL;
    if (!c->capturing) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "cuda: no capture is running");
    c->capturing = false;
    c->blas.capturing = false;
    cudaGraph_t g = NULL;
    LUNA_TRY(luna_cuda_check(cudaStreamEndCapture(c->stream, &g), "cudaStreamEndCapture"));
    cudaGraphExec_t exec = NULL;
    const luna_status st =
        luna_cuda_check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
    (void)cudaGraphDestroy(g);
    LUNA_TRY(st);
    *graph = exec;
    return LUNA_OK;
}

luna_status luna_cuda_graph_launch(luna_backend *be, void *graph) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    LUNA_TRY(
        luna_cuda_check(cudaGraphLaunch((cudaGraphExec_t)graph, c->stream), "cudaGraphLaunch"));
    c->graph_launches++;
    return LUNA_OK;
}

void luna_cuda_graph_free(luna_backend *be, void *graph) {
    (void)be;
    if (graph) (void)cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
