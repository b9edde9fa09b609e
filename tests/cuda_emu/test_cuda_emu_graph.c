/* Stream capture and CUDA graphs in the harness (emu_graph.cc): work queued on a capturing stream
 * is recorded, not run; a graph launch replays it, reading memory as it is at the replay; the
 * calls that are illegal during a capture fail with the GPU's error codes and invalidate it; a
 * stream that is not capturing is unaffected. CTest runs this suite in each thread order. */
#include <check.h>
#include <cublasLt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda_emu/luna_cuda_emu_api.h"
#include "tests/cuda_emu/selftest_kernels.h"
#include "tests/test_util.h"

#define CUDA_OK(call) ck_assert_int_eq((call), cudaSuccess)
#define LT_OK(call) ck_assert_int_eq((call), CUBLAS_STATUS_SUCCESS)

enum { ROWS = 6, COLS = 300, M = 2, K = 3, N = 4 }; /* the row sums are A (M x K) */

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes));
    return p;
}
static void *pinned_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMallocHost(&p, bytes));
    return p;
}
static cudaStream_t stream_create(unsigned flags) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, flags));
    return s;
}
static int all_bytes(const void *d, size_t bytes, unsigned char value) {
    unsigned char *h = malloc(bytes);
    CUDA_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    int ok = 1;
    for (size_t i = 0; i < bytes; i++)
        ok &= h[i] == value;
    free(h);
    return ok;
}
static int all_bytes_ff(const void *d, size_t bytes) { /* never written since cudaMalloc */
    return all_bytes(d, bytes, 0xff);
}
static enum cudaStreamCaptureStatus capture_status(cudaStream_t s) {
    enum cudaStreamCaptureStatus st;
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    return st;
}
static void expect_message(const char *call) {
    const char *m = luna_emu_last_error();
    ck_assert_msg(strstr(m, call) && strstr(m, "during stream capture"),
                  "message '%s' does not name %s during stream capture", m, call);
}

/* ---- a cuBLASLt GEMM D = alpha·A·W + beta·C, A M×K, W K×N, fp32 column-major ----------------- */
typedef struct {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lw, lc;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes;
} gemm;

static void gemm_create(gemm *g, int device_scalars) {
    LT_OK(cublasLtCreate(&g->h));
    LT_OK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtPointerMode_t mode =
        device_scalars ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
    LT_OK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode,
                                         sizeof mode));
    LT_OK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_32F, M, K, M));
    LT_OK(cublasLtMatrixLayoutCreate(&g->lw, CUDA_R_32F, K, N, K));
    LT_OK(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32F, M, N, M));
    cublasLtMatmulPreference_t pref;
    uint64_t ws_max = 1 << 20;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &ws_max, sizeof ws_max));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    LT_OK(cublasLtMatmulAlgoGetHeuristic(g->h, g->desc, g->la, g->lw, g->lc, g->lc, pref, 1, &res,
                                         &found));
    ck_assert_int_eq(found, 1);
    g->algo = res.algo;
    g->ws_bytes = res.workspaceSize;
    g->ws = dev_alloc(g->ws_bytes);
    cublasLtMatmulPreferenceDestroy(pref);
}
static cublasStatus_t gemm_run(gemm *g, const void *alpha, const float *A, const float *W,
                               const void *beta, const float *C, float *D, cudaStream_t s) {
    return cublasLtMatmul(g->h, g->desc, alpha, A, g->la, W, g->lw, beta, C, g->lc, D, g->lc,
                          &g->algo, g->ws, g->ws_bytes, s);
}
static void gemm_destroy(gemm *g) {
    cublasLtMatrixLayoutDestroy(g->la), cublasLtMatrixLayoutDestroy(g->lw);
    cublasLtMatrixLayoutDestroy(g->lc), cublasLtMatmulDescDestroy(g->desc);
    cublasLtDestroy(g->h), cudaFree(g->ws);
}

/* ---- the pipeline captured: H2D (pinned), row sums (kernel), D2D, memset, GEMM, event, D2H -- */
typedef struct {
    float *in_h, *out_h;            /* pinned: ROWS×COLS input, M×N output */
    float *x, *sum, *a, *c, *d, *w; /* device */
    float w_h[K * N], alpha, beta;
    cudaEvent_t ev;
    gemm g;
} pipeline;

static void pipeline_create(pipeline *p) {
    p->in_h = pinned_alloc(ROWS * COLS * sizeof(float));
    p->out_h = pinned_alloc(M * N * sizeof(float));
    p->x = dev_alloc(ROWS * COLS * sizeof(float));
    p->sum = dev_alloc(ROWS * sizeof(float));
    p->a = dev_alloc(ROWS * sizeof(float));
    p->c = dev_alloc(M * N * sizeof(float));
    p->d = dev_alloc(M * N * sizeof(float));
    p->w = dev_alloc(K * N * sizeof(float));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 21);
    luna_test_fill_uniform(&rng, p->w_h, K * N, -1.0f, 1.0f);
    CUDA_OK(cudaMemcpy(p->w, p->w_h, sizeof p->w_h, cudaMemcpyHostToDevice));
    p->alpha = 2.0f, p->beta = 1.0f;
    CUDA_OK(cudaEventCreate(&p->ev));
    gemm_create(&p->g, 0);
}
static void pipeline_destroy(pipeline *p) {
    cudaFreeHost(p->in_h), cudaFreeHost(p->out_h);
    cudaFree(p->x), cudaFree(p->sum), cudaFree(p->a), cudaFree(p->c), cudaFree(p->d);
    cudaFree(p->w), cudaEventDestroy(p->ev);
    gemm_destroy(&p->g);
}
static void pipeline_enqueue(pipeline *p, cudaStream_t s) { /* 7 operations */
    CUDA_OK(cudaMemcpyAsync(p->x, p->in_h, ROWS * COLS * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_OK(selftest_row_sum_on(p->sum, p->x, ROWS, COLS, s));
    CUDA_OK(cudaMemcpyAsync(p->a, p->sum, ROWS * sizeof(float), cudaMemcpyDeviceToDevice, s));
    CUDA_OK(cudaMemsetAsync(p->c, 0, M * N * sizeof(float), s));
    LT_OK(gemm_run(&p->g, &p->alpha, p->a, p->w, &p->beta, p->c, p->d, s));
    CUDA_OK(cudaEventRecord(p->ev, s));
    CUDA_OK(cudaMemcpyAsync(p->out_h, p->d, M * N * sizeof(float), cudaMemcpyDeviceToHost, s));
}
/* The pipeline's output computed on the host from the input (alpha 2, C = 0). */
static void pipeline_reference(const pipeline *p, double out[M * N]) {
    double a[ROWS];
    for (int r = 0; r < ROWS; r++) {
        a[r] = 0.0;
        for (int j = 0; j < COLS; j++)
            a[r] += p->in_h[r * COLS + j];
    }
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += a[i + k * M] * p->w_h[k + j * K];
            out[i + j * M] = 2.0 * acc;
        }
}
static void check_output(const pipeline *p) {
    double ref[M * N];
    pipeline_reference(p, ref);
    for (int i = 0; i < M * N; i++)
        ck_assert_msg(fabs(p->out_h[i] - ref[i]) <= 1e-3 * (1.0 + fabs(ref[i])),
                      "output %d: %g, reference %g", i, p->out_h[i], ref[i]);
}

START_TEST(test_capture_records_and_replays) {
    printf("order %s\n", luna_emu_order_name(luna_emu_get_order()));
    pipeline p;
    pipeline_create(&p);
    cudaStream_t s = stream_create(cudaStreamNonBlocking);
    for (int i = 0; i < M * N; i++)
        p.out_h[i] = -7.0f;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 30);
    luna_test_fill_uniform(&rng, p.in_h, ROWS * COLS, -1.0f, 1.0f);
    CUDA_OK(cudaMemset(p.x, 0, ROWS * COLS * sizeof(float)));

    const uint64_t launches0 = luna_emu_launch_count(), nodes0 = luna_emu_graph_node_count();
    const unsigned long long counted0 = selftest_launch_counter();
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck_assert_int_eq(capture_status(s), cudaStreamCaptureStatusActive);
    pipeline_enqueue(&p, s);
    cudaGraph_t graph = NULL;
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    ck_assert_ptr_nonnull(graph);
    ck_assert_int_eq(capture_status(s), cudaStreamCaptureStatusNone);
    /* nothing ran: every destination is as it was, the kernel counted once, no node ran */
    ck_assert(all_bytes(p.x, ROWS * COLS * sizeof(float), 0)); /* the kernel would sum zeros */
    ck_assert(all_bytes_ff(p.sum, ROWS * sizeof(float)));
    ck_assert(all_bytes_ff(p.a, ROWS * sizeof(float)));
    ck_assert(all_bytes_ff(p.c, M * N * sizeof(float)));
    ck_assert(all_bytes_ff(p.d, M * N * sizeof(float)));
    for (int i = 0; i < M * N; i++)
        ck_assert_float_eq(p.out_h[i], -7.0f);
    ck_assert_uint_eq(luna_emu_launch_count() - launches0, 1);
    ck_assert_uint_eq(selftest_launch_counter() - counted0, 1);
    ck_assert_uint_eq(luna_emu_graph_node_count() - nodes0, 0);
    CUDA_OK(cudaEventQuery(p.ev)); /* the capture has ended */

    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph)); /* the executable graph is a copy */
    p.alpha = 5.0f;                   /* host-side alpha was read at the capture (2) */
    pipeline eager = p;
    float eager_out[M * N];
    for (int k = 0; k < 3; k++) {
        luna_test_rng_seed(&rng, 100 + (uint64_t)k); /* new input: read at this replay */
        luna_test_fill_uniform(&rng, p.in_h, ROWS * COLS, -2.0f, 1.0f + (float)k);
        const uint64_t l0 = luna_emu_launch_count(), n0 = luna_emu_graph_node_count(),
                       g0 = luna_emu_graph_launch_count(), w0 = luna_emu_host_wait_count();
        const unsigned long long c0 = selftest_launch_counter();
        CUDA_OK(cudaGraphLaunch(exec, s));
        ck_assert_uint_eq(luna_emu_host_wait_count() - w0, 0); /* pinned copies only */
        CUDA_OK(cudaStreamSynchronize(s));
        ck_assert_uint_eq(luna_emu_graph_launch_count() - g0, 1);
        ck_assert_uint_eq(luna_emu_graph_node_count() - n0, 7);
        ck_assert_uint_eq(luna_emu_launch_count() - l0, 0); /* a replay is no launch call */
        ck_assert_uint_eq(selftest_launch_counter() - c0, 0);
        check_output(&p);
        CUDA_OK(cudaEventSynchronize(p.ev));
        /* the same work queued directly gives the same bits */
        memcpy(eager_out, p.out_h, sizeof eager_out);
        eager.alpha = 2.0f;
        CUDA_OK(cudaMemset(p.c, 0xff, M * N * sizeof(float)));
        pipeline_enqueue(&eager, s);
        CUDA_OK(cudaStreamSynchronize(s));
        ck_assert_int_eq(memcmp(eager_out, p.out_h, sizeof eager_out), 0);
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    ck_assert_int_eq(cudaGraphExecDestroy(exec), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
    CUDA_OK(cudaStreamDestroy(s));
    pipeline_destroy(&p);
}
END_TEST

/* Device-side alpha and beta, and pageable host memory, are read at each replay; a graph that
 * copies pageable memory cannot be instantiated for device launch. */
START_TEST(test_replay_reads_memory_at_replay) {
    gemm g;
    gemm_create(&g, 1);
    float *A = dev_alloc(M * K * 4), *W = dev_alloc(K * N * 4), *D = dev_alloc(M * N * 4);
    float *scal = dev_alloc(2 * sizeof(float)), scal_h[2] = {1.0f, 0.0f};
    float a_h[M * K], w_h[K * N], d_h[M * N];
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 40);
    luna_test_fill_uniform(&rng, w_h, K * N, -1.0f, 1.0f);
    CUDA_OK(cudaMemcpy(W, w_h, sizeof w_h, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(scal, scal_h, sizeof scal_h, cudaMemcpyHostToDevice));
    float *src = malloc(sizeof a_h), *dst = malloc(sizeof d_h); /* pageable */
    cudaStream_t s = stream_create(0);
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaMemcpyAsync(A, src, sizeof a_h, cudaMemcpyHostToDevice, s));
    LT_OK(gemm_run(&g, scal, A, W, scal + 1, NULL, D, s));
    CUDA_OK(cudaMemcpyAsync(dst, D, sizeof d_h, cudaMemcpyDeviceToHost, s));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    ck_assert_int_eq(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch),
                     cudaErrorInvalidValue);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int k = 0; k < 3; k++) {
        luna_test_fill_uniform(&rng, src, M * K, -1.0f, 1.0f);
        memcpy(a_h, src, sizeof a_h);
        scal_h[0] = 1.0f + (float)k;
        CUDA_OK(cudaMemcpy(scal, scal_h, sizeof(float), cudaMemcpyHostToDevice));
        const uint64_t w0 = luna_emu_host_wait_count();
        CUDA_OK(cudaGraphLaunch(exec, s));
        ck_assert_uint_eq(luna_emu_host_wait_count() - w0, 2); /* two pageable copies */
        for (int j = 0; j < N; j++)
            for (int i = 0; i < M; i++) {
                double acc = 0.0;
                for (int q = 0; q < K; q++)
                    acc += (double)a_h[i + q * M] * w_h[q + j * K];
                ck_assert_double_le(fabs(dst[i + j * M] - scal_h[0] * acc), 1e-5);
            }
    }
    /* a graph launched in a capture is recorded with its nodes (here twice) */
    cudaGraph_t outer;
    cudaGraphExec_t outer_exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamEndCapture(s, &outer));
    CUDA_OK(cudaGraphInstantiate(&outer_exec, outer, 0));
    luna_test_fill_uniform(&rng, src, M * K, -1.0f, 1.0f);
    const uint64_t n0 = luna_emu_graph_node_count();
    CUDA_OK(cudaGraphLaunch(outer_exec, s));
    ck_assert_uint_eq(luna_emu_graph_node_count() - n0, 6);
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            double acc = 0.0;
            for (int q = 0; q < K; q++)
                acc += (double)src[i + q * M] * w_h[q + j * K];
            ck_assert_double_le(fabs(dst[i + j * M] - scal_h[0] * acc), 1e-5);
        }
    cudaGraphExecDestroy(outer_exec), cudaGraphDestroy(outer);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(s);
    cudaFree(A), cudaFree(W), cudaFree(D), cudaFree(scal), free(src), free(dst);
    gemm_destroy(&g);
}
END_TEST

/* A replay whose memory was freed after the capture faults (sticky, as the GPU would) instead of
 * writing freed memory: the kernel's pointer arguments and the copies are checked again. */
START_TEST(test_replay_of_freed_memory_faults) {
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    cudaStream_t s = stream_create(cudaStreamNonBlocking);
    for (int kernel = 0; kernel < 2; kernel++) {
        float *x = dev_alloc(ROWS * COLS * sizeof(float)), *out = dev_alloc(ROWS * sizeof(float));
        CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        if (kernel)
            CUDA_OK(selftest_row_sum_on(out, x, ROWS, COLS, s));
        else
            CUDA_OK(cudaMemsetAsync(out, 0, ROWS * sizeof(float), s));
        cudaGraph_t g;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamEndCapture(s, &g));
        CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
        CUDA_OK(cudaFree(out));
        ck_assert_int_eq(cudaGraphLaunch(exec, s), cudaErrorIllegalAddress);
        ck_assert_msg(
            strstr(luna_emu_last_error(), kernel ? "pointer argument 0" : "cudaGraphLaunch"), "%s",
            luna_emu_last_error());
        CUDA_OK(cudaDeviceReset()); /* frees x, the graph and its exec */
    }
    cudaStreamDestroy(s);
}
END_TEST

/* ---- calls that are illegal during a capture ------------------------------------------------- */
typedef struct {
    cudaStream_t s;
    cudaEvent_t ev;
    float *spare, *x, *out;
} illegal_ctx;
typedef cudaError_t (*illegal_fn)(illegal_ctx *c);
static cudaError_t do_stream_sync(illegal_ctx *c) { return cudaStreamSynchronize(c->s); }
static cudaError_t do_stream_query(illegal_ctx *c) { return cudaStreamQuery(c->s); }
static cudaError_t do_device_sync(illegal_ctx *c) {
    (void)c;
    return cudaDeviceSynchronize();
}
static cudaError_t do_event_sync(illegal_ctx *c) {
    CUDA_OK(cudaEventRecord(c->ev, c->s)); /* legal: recorded */
    return cudaEventSynchronize(c->ev);
}
static cudaError_t do_event_query(illegal_ctx *c) {
    CUDA_OK(cudaEventRecord(c->ev, c->s));
    return cudaEventQuery(c->ev);
}
static cudaError_t do_memcpy(illegal_ctx *c) {
    float h[4];
    return cudaMemcpy(h, c->x, sizeof h, cudaMemcpyDeviceToHost);
}
static cudaError_t do_malloc(illegal_ctx *c) {
    void *p = NULL;
    (void)c;
    cudaError_t e = cudaMalloc(&p, 64);
    ck_assert_ptr_null(p);
    return e;
}
static cudaError_t do_free(illegal_ctx *c) { return cudaFree(c->spare); }
static cudaError_t do_malloc_host(illegal_ctx *c) {
    void *p = NULL;
    (void)c;
    return cudaMallocHost(&p, 64);
}
static cudaError_t do_legacy_launch(illegal_ctx *c) {
    return selftest_row_sum(c->out, c->x, ROWS, COLS); /* stream 0 */
}
static cudaError_t do_wait_outside_event(illegal_ctx *c) {
    return cudaStreamWaitEvent(c->s, c->ev, 0); /* recorded before the capture */
}
static cudaError_t do_malloc_async(illegal_ctx *c) {
    void *p = NULL;
    return cudaMallocAsync(&p, 64, c->s);
}

START_TEST(test_illegal_calls_invalidate_the_capture) {
    const struct {
        const char *call;
        illegal_fn fn;
        unsigned flags; /* of the capturing stream */
        cudaError_t err;
    } cases[] = {
        {"cudaStreamSynchronize", do_stream_sync, cudaStreamNonBlocking,
         cudaErrorStreamCaptureUnsupported},
        {"cudaStreamQuery", do_stream_query, cudaStreamNonBlocking,
         cudaErrorStreamCaptureUnsupported},
        {"cudaDeviceSynchronize", do_device_sync, cudaStreamNonBlocking,
         cudaErrorStreamCaptureUnsupported},
        {"cudaEventSynchronize", do_event_sync, cudaStreamNonBlocking, cudaErrorCapturedEvent},
        {"cudaEventQuery", do_event_query, cudaStreamNonBlocking, cudaErrorCapturedEvent},
        {"cudaMemcpy", do_memcpy, cudaStreamDefault, cudaErrorStreamCaptureImplicit},
        {"cudaMemcpy", do_memcpy, cudaStreamNonBlocking, cudaErrorStreamCaptureUnsupported},
        {"cudaMalloc", do_malloc, cudaStreamNonBlocking, cudaErrorStreamCaptureUnsupported},
        {"cudaFree", do_free, cudaStreamNonBlocking, cudaErrorStreamCaptureUnsupported},
        {"cudaMallocHost", do_malloc_host, cudaStreamNonBlocking,
         cudaErrorStreamCaptureUnsupported},
        {"kernel row_sum_kernel", do_legacy_launch, cudaStreamDefault,
         cudaErrorStreamCaptureImplicit},
        {"cudaStreamWaitEvent", do_wait_outside_event, cudaStreamNonBlocking,
         cudaErrorStreamCaptureIsolation},
        {"cudaMallocAsync", do_malloc_async, cudaStreamNonBlocking, cudaErrorNotSupported},
    };
    illegal_ctx c;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 50);
    float *x_h = malloc(ROWS * COLS * sizeof(float)), out_h[ROWS];
    luna_test_fill_uniform(&rng, x_h, ROWS * COLS, -1.0f, 1.0f);
    c.x = dev_alloc(ROWS * COLS * sizeof(float));
    CUDA_OK(cudaMemcpy(c.x, x_h, ROWS * COLS * sizeof(float), cudaMemcpyHostToDevice));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        c.s = stream_create(cases[i].flags);
        c.out = dev_alloc(ROWS * sizeof(float));
        c.spare = dev_alloc(64);
        CUDA_OK(cudaEventCreate(&c.ev));
        CUDA_OK(cudaEventRecord(c.ev, c.s));
        CUDA_OK(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeGlobal));
        CUDA_OK(selftest_row_sum_on(c.out, c.x, ROWS, COLS, c.s));
        cudaError_t e = cases[i].fn(&c);
        ck_assert_msg(e == cases[i].err, "%s (case %zu): %s, expected %s", cases[i].call, i,
                      cudaGetErrorName(e), cudaGetErrorName(cases[i].err));
        expect_message(cases[i].call);
        ck_assert_int_eq(capture_status(c.s), cudaStreamCaptureStatusInvalidated);
        /* the stream refuses work until the capture ends, which returns no graph */
        ck_assert_int_eq(selftest_row_sum_on(c.out, c.x, ROWS, COLS, c.s),
                         cudaErrorStreamCaptureInvalidated);
        cudaGraph_t graph = (cudaGraph_t)&c;
        ck_assert_int_eq(cudaStreamEndCapture(c.s, &graph), cudaErrorStreamCaptureInvalidated);
        ck_assert_ptr_null(graph);
        ck_assert_int_eq(capture_status(c.s), cudaStreamCaptureStatusNone);
        ck_assert(all_bytes_ff(c.out, ROWS * sizeof(float))); /* the recorded kernel never ran */
        /* the stream works again (once the last error is taken) */
        ck_assert_int_eq(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
        CUDA_OK(selftest_row_sum_on(c.out, c.x, ROWS, COLS, c.s));
        CUDA_OK(cudaStreamSynchronize(c.s));
        CUDA_OK(cudaMemcpy(out_h, c.out, sizeof out_h, cudaMemcpyDeviceToHost));
        for (int r = 0; r < ROWS; r++) {
            double ref = 0.0;
            for (int j = 0; j < COLS; j++)
                ref += x_h[r * COLS + j];
            ck_assert_double_le(fabs(out_h[r] - ref), 1e-4);
        }
        CUDA_OK(cudaEventDestroy(c.ev));
        CUDA_OK(cudaFree(c.spare));
        CUDA_OK(cudaFree(c.out));
        CUDA_OK(cudaStreamDestroy(c.s));
    }
    cudaFree(c.x), free(x_h);
}
END_TEST

/* ---- the capture calls' own errors, and the capture modes ------------------------------------ */
typedef struct {
    cudaStream_t s;
    enum cudaStreamCaptureMode mode; /* the thread's */
    cudaError_t malloc_err, end_err;
} thread_job;
static void *other_thread(void *arg) {
    thread_job *j = arg;
    enum cudaStreamCaptureMode m = j->mode;
    CUDA_OK(cudaThreadExchangeStreamCaptureMode(&m));
    void *p = NULL;
    j->malloc_err = cudaMalloc(&p, 64);
    if (p) cudaFree(p);
    cudaGraph_t g = NULL;
    j->end_err = cudaStreamEndCapture(j->s, &g);
    return NULL;
}
static thread_job run_other_thread(cudaStream_t s, enum cudaStreamCaptureMode thread_mode) {
    thread_job j = {s, thread_mode, cudaSuccess, cudaSuccess};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, &j), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    return j;
}

START_TEST(test_capture_errors_and_modes) {
    cudaStream_t s = stream_create(cudaStreamNonBlocking);
    cudaGraph_t g = NULL;
    ck_assert_int_eq(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    ck_assert_int_eq(cudaStreamIsCapturing(s, NULL), cudaErrorInvalidValue);
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    unsigned long long id = 0;
    enum cudaStreamCaptureStatus st;
    CUDA_OK(cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
    ck_assert_int_eq(st, cudaStreamCaptureStatusActive);
    ck_assert_uint_ne(id, 0);
    ck_assert_int_eq(cudaStreamDestroy(s), cudaErrorIllegalState); /* end the capture first */
    /* global mode: another thread's cudaMalloc is refused too, unless it opts out */
    thread_job j = run_other_thread(s, cudaStreamCaptureModeThreadLocal);
    CUDA_OK(j.malloc_err);
    ck_assert_int_eq(j.end_err, cudaErrorStreamCaptureWrongThread);
    ck_assert_int_eq(capture_status(s), cudaStreamCaptureStatusActive);
    j = run_other_thread(s, cudaStreamCaptureModeGlobal);
    ck_assert_int_eq(j.malloc_err, cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(capture_status(s), cudaStreamCaptureStatusInvalidated);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    /* thread-local mode: another thread's calls do not concern it; this thread's do */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    j = run_other_thread(s, cudaStreamCaptureModeGlobal);
    CUDA_OK(j.malloc_err);
    ck_assert_int_eq(capture_status(s), cudaStreamCaptureStatusActive);
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    /* relaxed mode: the capture allows them; so does a thread switched to relaxed */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CUDA_OK(cudaMalloc(&p, 64));
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CUDA_OK(cudaThreadExchangeStreamCaptureMode(&m));
    ck_assert_int_eq(m, cudaStreamCaptureModeGlobal);
    CUDA_OK(cudaMalloc(&p, 64));
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaThreadExchangeStreamCaptureMode(&m));
    CUDA_OK(cudaStreamEndCapture(s, &g)); /* an empty graph */
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(g));
    ck_assert_int_eq(cudaGraphDestroy(g), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
    CUDA_OK(cudaStreamDestroy(s));
}
END_TEST

/* While one stream captures, another stream's work (and, when the capturing stream does not block
 * on it, the legacy stream's) runs at once, and its waits are legal. */
START_TEST(test_other_streams_unaffected) {
    pipeline p;
    pipeline_create(&p);
    cudaStream_t cap = stream_create(cudaStreamNonBlocking), s = stream_create(0);
    float *out = dev_alloc(ROWS * sizeof(float));
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 60);
    luna_test_fill_uniform(&rng, p.in_h, ROWS * COLS, -1.0f, 1.0f);
    CUDA_OK(cudaMemcpy(p.x, p.in_h, ROWS * COLS * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal));
    CUDA_OK(selftest_row_sum_on(out, p.x, ROWS, COLS, cap));
    for (int i = 0; i < M * N; i++)
        p.out_h[i] = -7.0f;
    luna_test_fill_uniform(&rng, p.in_h, ROWS * COLS, -1.0f, 1.0f);
    const uint64_t nodes0 = luna_emu_graph_node_count();
    pipeline_enqueue(&p, s); /* runs now */
    for (int i = 0; i < M * N; i++)
        ck_assert_float_ne(p.out_h[i], -7.0f);
    check_output(&p);
    CUDA_OK(cudaEventQuery(p.ev));
    CUDA_OK(cudaEventSynchronize(p.ev));
    CUDA_OK(cudaStreamQuery(s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamWaitEvent(s, p.ev, 0));
    ck_assert_int_eq(capture_status(s), cudaStreamCaptureStatusNone);
    ck_assert_int_eq(capture_status(NULL), cudaStreamCaptureStatusNone);
    CUDA_OK(selftest_row_sum(p.sum, p.x, ROWS, COLS)); /* legacy stream */
    ck_assert_uint_eq(luna_emu_graph_node_count(), nodes0);
    cudaGraph_t g;
    CUDA_OK(cudaStreamEndCapture(cap, &g));
    ck_assert(all_bytes_ff(out, ROWS * sizeof(float))); /* (cudaMemcpy: after the capture) */
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_OK(cudaGraphLaunch(exec, s)); /* any stream may launch it */
    ck_assert_uint_eq(luna_emu_graph_node_count() - nodes0, 1);
    float got[ROWS], want[ROWS];
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(want, p.sum, sizeof want, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(memcmp(got, want, sizeof got), 0);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(g), cudaFree(out);
    cudaStreamDestroy(cap), cudaStreamDestroy(s);
    pipeline_destroy(&p);
}
END_TEST

static Suite *graph_suite(void) {
    Suite *s = suite_create("cuda_emu_graph");
    TCase *tc = tcase_create("graphs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_capture_records_and_replays);
    tcase_add_test(tc, test_replay_reads_memory_at_replay);
    tcase_add_test(tc, test_replay_of_freed_memory_faults);
    tcase_add_test(tc, test_illegal_calls_invalidate_the_capture);
    tcase_add_test(tc, test_capture_errors_and_modes);
    tcase_add_test(tc, test_other_streams_unaffected);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(graph_suite()); }
