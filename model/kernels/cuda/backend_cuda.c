/* The CUDA backend (core/backend.h): creation from the registry (model/kernels/registry.c), the
 * memory vtable on one stream, and the device error flags. The ops are in cuda_ops.c, the bf16
 * weight copies in weight_copies.c, the kernels in the .cu files beside them.
 *
 * Memory: luna_mem_alloc takes blocks from the caching allocator (device_runtime.h), so a training
 * step after the first calls no cudaMalloc. LUNA_CUDA_CACHE=0 in the environment turns caching off
 * (every allocation an exact cudaMalloc, every release a cudaFree): slow, but compute-sanitizer and
 * the CPU execution harness's AddressSanitizer then see each buffer's true end, as PyTorch's
 * PYTORCH_NO_CUDA_MEMORY_CACHING does.
 *
 * Transfers: from_host copies the host bytes into pinned staging memory and queues an
 * asynchronous copy from there, so the caller may reuse its buffer at once (core/backend.h) and
 * the host does not wait for the device: a copy from pageable memory may make it wait for the
 * stream ("API synchronization behavior" of the CUDA runtime), which stalls a training update
 * (each wait drains the queue the host had run ahead with). The staging memory is two halves used
 * in turn; a half is reused only after an event recorded when it was left, long since passed in
 * practice. Larger copies than a half go straight from the caller's memory. to_host waits for the
 * copy (its contract), reading small results through pinned memory. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/allocator.h"
#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/registry.h"

#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20) /* NVIDIA's recommendation for Hopper */

void *luna_cuda_raw_alloc(luna_backend *be, size_t bytes) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    void *p = NULL;
    if (!c->cache_memory) {
        cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
        if (err != cudaSuccess) {
            (void)luna_cuda_check(err, "cudaMalloc");
            return NULL;
        }
        return p;
    }
    pthread_mutex_lock(&c->alloc_lock);
    luna_status st = luna_cuda_cache_alloc(c->cache, bytes, &p);
    pthread_mutex_unlock(&c->alloc_lock);
    return st == LUNA_OK ? p : NULL;
}

void luna_cuda_raw_release(luna_backend *be, void *p) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (!p) return;
    if (!c->cache_memory) {
        /* cudaFree waits for the device; a block in use by queued work stays valid until then */
        (void)cudaFree(p);
        return;
    }
    pthread_mutex_lock(&c->alloc_lock);
    (void)luna_cuda_cache_release(c->cache, p); /* a foreign pointer is the caller's bug */
    pthread_mutex_unlock(&c->alloc_lock);
}

static void *cuda_alloc(luna_backend *be, size_t bytes) {
    if (luna_cuda_not_capturing(be, "an allocation") != LUNA_OK) return NULL;
    return luna_cuda_raw_alloc(be, bytes);
}

/* Id ranges (ids_from_host) end where their memory is written through the memory calls, and all
 * of them at a to_host or synchronize (after which the memory may be reused). */
static void id_ranges_written(luna_cuda_impl *c, const void *p, size_t bytes) {
    const char *a = (const char *)p, *b = a + bytes;
    int k = 0;
    pthread_mutex_lock(&c->id_lock);
    for (int i = 0; i < c->nid_ranges; i++) {
        const char *s = (const char *)c->id_ranges[i].p;
        const char *e = s + (size_t)c->id_ranges[i].n * sizeof(int32_t);
        if (e <= a || s >= b) c->id_ranges[k++] = c->id_ranges[i];
    }
    c->nid_ranges = k;
    pthread_mutex_unlock(&c->id_lock);
}

static void id_ranges_clear(luna_cuda_impl *c) {
    pthread_mutex_lock(&c->id_lock);
    c->nid_ranges = 0;
    pthread_mutex_unlock(&c->id_lock);
}

static void cuda_release(luna_backend *be, void *p, size_t bytes) {
    /* the memory may come back as anything: the ranges in it end */
    if (bytes)
        id_ranges_written(luna_cuda_impl_of(be), p, bytes);
    else
        id_ranges_clear(luna_cuda_impl_of(be));
    luna_cuda_weights_freed(be, p);
    luna_cuda_raw_release(be, p);
}

/* The host's waits, counted and timed (device_stats): each a synchronize of the stream or of
 * an event. */
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static cudaError_t wait_stream(luna_cuda_impl *c) {
    const uint64_t t0 = now_ns();
    const cudaError_t e = cudaStreamSynchronize(c->stream);
    c->waits++;
    c->wait_ns += now_ns() - t0;
    return e;
}
static cudaError_t wait_event(luna_cuda_impl *c, cudaEvent_t ev) {
    const uint64_t t0 = now_ns();
    const cudaError_t e = cudaEventSynchronize(ev);
    c->waits++;
    c->wait_ns += now_ns() - t0;
    return e;
}

static luna_status cuda_zero(luna_backend *be, void *p, size_t bytes) {
    id_ranges_written(luna_cuda_impl_of(be), p, bytes);
    luna_cuda_weights_written(be, p, bytes);
    return luna_cuda_check(cudaMemsetAsync(p, 0, bytes, luna_cuda_impl_of(be)->stream),
                           "cudaMemsetAsync");
}

static luna_status cuda_copy(luna_backend *be, void *dst, const void *src, size_t bytes) {
    id_ranges_written(luna_cuda_impl_of(be), dst, bytes);
    luna_cuda_weights_written(be, dst, bytes);
    return luna_cuda_check(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, luna_cuda_impl_of(be)->stream),
        "cudaMemcpyAsync (device to device)");
}

#define STAGING_HALF_BYTES ((size_t)4 << 20)
#define STAGING_ALIGN 256

/* A region of `bytes` in the current staging half (moving to the other half, after its event,
 * when this one is full), or NULL when bytes exceed a half. Called with staging_lock held. */
static luna_status staging_take(luna_cuda_impl *c, size_t bytes, unsigned char **region) {
    *region = NULL;
    if (bytes > STAGING_HALF_BYTES) return LUNA_OK;
    if (c->staging_used + bytes > STAGING_HALF_BYTES) {
        LUNA_CUDA_TRY(cudaEventRecord(c->half_done[c->staging_half], c->stream));
        c->half_pending[c->staging_half] = true;
        c->staging_half ^= 1;
        c->staging_used = 0;
        if (c->half_pending[c->staging_half]) { /* its copies were queued a half ago */
            LUNA_CUDA_TRY(wait_event(c, c->half_done[c->staging_half]));
            c->half_pending[c->staging_half] = false;
        }
    }
    *region = c->staging + (size_t)c->staging_half * STAGING_HALF_BYTES + c->staging_used;
    c->staging_used += (bytes + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    return LUNA_OK;
}

static luna_status cuda_from_host(luna_backend *be, void *dst, const void *host, size_t bytes) {
    LUNA_TRY(luna_cuda_not_capturing(be, "a host-to-device copy"));
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    id_ranges_written(c, dst, bytes);
    luna_cuda_weights_written(be, dst, bytes);
    if (bytes == 0) return LUNA_OK;
    pthread_mutex_lock(&c->staging_lock);
    unsigned char *region = NULL;
    luna_status st = c->staging ? staging_take(c, bytes, &region) : LUNA_OK;
    const void *from = host;
    if (st == LUNA_OK && region) {
        memcpy(region, host, bytes);
        from = region;
    }
    if (st == LUNA_OK)
        st = luna_cuda_check(cudaMemcpyAsync(dst, from, bytes, cudaMemcpyHostToDevice, c->stream),
                             "cudaMemcpyAsync (host to device)");
    pthread_mutex_unlock(&c->staging_lock);
    return st;
}

/* Token ids from the host: their range is seen here, before the copy, so the ops' checks of
 * them need no wait (luna_cuda_check_ids). */
static void cuda_ids_in_range(luna_backend *be, const int32_t *ids, int64_t n, int32_t lo,
                              int32_t hi);
static luna_status cuda_ids_from_host(luna_backend *be, int32_t *dst, const int32_t *host,
                                      int64_t n) {
    LUNA_TRY(cuda_from_host(be, dst, host, (size_t)n * sizeof(int32_t)));
    int32_t lo = host[0], hi = host[0];
    for (int64_t i = 1; i < n; i++) {
        lo = host[i] < lo ? host[i] : lo;
        hi = host[i] > hi ? host[i] : hi;
    }
    cuda_ids_in_range(be, dst, n, lo, hi);
    return LUNA_OK;
}

/* A range of ids, from an upload or stated by the caller (ids an op produced). */
static void cuda_ids_in_range(luna_backend *be, const int32_t *dst, int64_t n, int32_t lo,
                              int32_t hi) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    id_ranges_written(c, dst, (size_t)n * sizeof(int32_t)); /* an older range there ends */
    pthread_mutex_lock(&c->id_lock);
    if (c->nid_ranges == LUNA_CUDA_ID_RANGES) { /* the oldest goes */
        memmove(c->id_ranges, c->id_ranges + 1, sizeof c->id_ranges[0] * (LUNA_CUDA_ID_RANGES - 1));
        c->nid_ranges--;
    }
    c->id_ranges[c->nid_ranges].p = dst;
    c->id_ranges[c->nid_ranges].n = n;
    c->id_ranges[c->nid_ranges].lo = lo;
    c->id_ranges[c->nid_ranges].hi = hi;
    c->nid_ranges++;
    pthread_mutex_unlock(&c->id_lock);
}

/* Whether ids [0, n) lie in one uploaded range whose values are all in [0, V). */
static bool ids_known_in_range(luna_cuda_impl *c, const int32_t *ids, int64_t n, int V) {
    bool known = false;
    pthread_mutex_lock(&c->id_lock);
    for (int i = 0; i < c->nid_ranges; i++) {
        const int32_t *s = c->id_ranges[i].p;
        if (ids >= s && ids + n <= s + c->id_ranges[i].n) {
            known = c->id_ranges[i].lo >= 0 && c->id_ranges[i].hi < V;
            break;
        }
    }
    pthread_mutex_unlock(&c->id_lock);
    return known;
}

/* Token ids are checked on the device (backend_cuda.h): the position of the first bad id and the
 * id are read back now, so the op that met bad input returns the error itself, as on CPU. One
 * stream synchronisation per checked op; the queue is short there (embedding and cross entropy
 * run at the ends of a pass, after the previous step's loss readback drained it). */
luna_status luna_cuda_check_ids(luna_backend *be, const char *op, const char *what,
                                const int32_t *ids, int64_t n, int V, const int *exempt) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (n <= 0) return LUNA_OK;
    if (n > INT_MAX)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "%s: %lld token ids exceed 2^31 (split the batch)", op, (long long)n);
    if (ids_known_in_range(c, ids, n, V)) return LUNA_OK;
    /* through pinned host words: copies from pageable memory would add waits of their own */
    int *none = &c->pinned_ids[0], *result = &c->pinned_ids[1];
    *none = INT_MAX;
    LUNA_CUDA_TRY(
        cudaMemcpyAsync(c->first_bad, none, sizeof *none, cudaMemcpyHostToDevice, c->stream));
    LUNA_CUDA_TRY(luna_cuda_find_bad_id_launch(c->stream, ids, n, V, exempt ? *exempt : 0,
                                               exempt != NULL, c->first_bad));
    LUNA_CUDA_TRY(
        cudaMemcpyAsync(result, c->first_bad, sizeof *result, cudaMemcpyDeviceToHost, c->stream));
    LUNA_CUDA_TRY(wait_stream(c));
    const int first = *result;
    if (first == INT_MAX) return LUNA_OK;
    int32_t id;
    LUNA_CUDA_TRY(cudaMemcpy(&id, ids + first, sizeof id, cudaMemcpyDeviceToHost));
    return luna_op_bad_id(op, what, first, id, V);
}

static luna_status cuda_to_host(luna_backend *be, void *host, const void *src, size_t bytes) {
    LUNA_TRY(luna_cuda_not_capturing(be, "a device-to-host copy"));
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    id_ranges_clear(c);
    pthread_mutex_lock(&c->staging_lock);
    unsigned char *region = NULL;
    luna_status st = c->staging ? staging_take(c, bytes, &region) : LUNA_OK;
    if (st == LUNA_OK)
        st = luna_cuda_check(cudaMemcpyAsync(region ? (void *)region : host, src, bytes,
                                             cudaMemcpyDeviceToHost, c->stream),
                             "cudaMemcpyAsync (device to host)");
    if (st == LUNA_OK) st = luna_cuda_check(wait_stream(c), "cudaStreamSynchronize");
    if (st == LUNA_OK && region) memcpy(host, region, bytes);
    pthread_mutex_unlock(&c->staging_lock);
    return st;
}

static luna_status cuda_synchronize(luna_backend *be) {
    LUNA_TRY(luna_cuda_not_capturing(be, "a synchronize"));
    id_ranges_clear(luna_cuda_impl_of(be));
    return luna_cuda_check(wait_stream(luna_cuda_impl_of(be)), "cudaStreamSynchronize");
}

static void cuda_device_stats(luna_backend *be, luna_device_stats *out) {
    const luna_cuda_impl *c = luna_cuda_impl_of(be);
    *out = (luna_device_stats){.kernels = luna_cuda_kernel_launches(),
                               .library_calls = luna_cuda_gemm_launches(),
                               .waits = c->waits,
                               .wait_seconds = 1e-9 * (double)c->wait_ns,
                               .graphs = c->graph_launches};
}

static void cuda_destroy(luna_backend *be) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (!c) return;
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    luna_cuda_weights_clear(be);
    luna_cuda_raw_release(be, c->first_bad);
    if (c->pinned_ids) (void)cudaFreeHost(c->pinned_ids);
    if (c->staging) (void)cudaFreeHost(c->staging);
    for (int h = 0; h < 2; h++)
        if (c->half_done[h]) (void)cudaEventDestroy(c->half_done[h]);
    pthread_mutex_destroy(&c->staging_lock);
    pthread_mutex_destroy(&c->id_lock);
    luna_cuda_raw_release(be, c->blas.workspace);
    luna_gemm_plans_free(c->blas.plans); /* before the handle they were made with */
    if (c->blas.lt) (void)cublasLtDestroy(c->blas.lt);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    luna_cuda_cache_free(c->cache);
    pthread_mutex_destroy(&c->alloc_lock);
    free(c);
    be->impl = NULL;
}

static const luna_backend_memory cuda_memory = {
    .alloc = cuda_alloc,
    .release = cuda_release,
    .zero = cuda_zero,
    .copy = cuda_copy,
    .from_host = cuda_from_host,
    .to_host = cuda_to_host,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
    .ids_from_host = cuda_ids_from_host,
    .ids_in_range = cuda_ids_in_range,
    .device_stats = cuda_device_stats,
    .graph_begin = luna_cuda_graph_begin,
    .graph_end = luna_cuda_graph_end,
    .graph_launch = luna_cuda_graph_launch,
    .graph_free = luna_cuda_graph_free,
    .graph_state = luna_cuda_weights_state,
};

static luna_status setup(luna_backend *be, const luna_backend_options *opt) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    LUNA_TRY(luna_cuda_select_device(opt->device_id, &c->device));
    LUNA_CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    LUNA_TRY(luna_cuda_cache_create(&c->cache));
    LUNA_TRY(luna_cublas_check(cublasLtCreate(&c->blas.lt), "cublasLtCreate"));
    LUNA_TRY(luna_gemm_plans_create(&c->blas.plans));
    c->blas.tf32 = opt->tf32;
    const char *grid = getenv("LUNA_CUDA_GRID"); /* for measuring the two ways of gemm_grid */
    c->blas.grid_pointers = !(grid && strcmp(grid, "strided") == 0);
    c->blas.workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
    c->blas.workspace = luna_cuda_raw_alloc(be, c->blas.workspace_bytes);
    c->first_bad = luna_cuda_raw_alloc(be, sizeof(int));
    if (!c->blas.workspace || !c->first_bad)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                          "--device cuda: cannot allocate the cuBLASLt workspace (%zu bytes)",
                          c->blas.workspace_bytes);
    LUNA_CUDA_TRY(cudaMallocHost((void **)&c->pinned_ids, 2 * sizeof(int)));
    LUNA_CUDA_TRY(cudaMallocHost((void **)&c->staging, 2 * STAGING_HALF_BYTES));
    for (int h = 0; h < 2; h++)
        LUNA_CUDA_TRY(cudaEventCreateWithFlags(&c->half_done[h], cudaEventDisableTiming));
    LUNA_TRY(luna_arena_create(&be->scratch, be, (size_t)16 << 20));
    c->blas.scratch = be->scratch;
    return LUNA_OK;
}

void *luna_backend_cuda_stream(const luna_backend *be, int *device) {
    if (!be || be->device != LUNA_DEVICE_CUDA) return NULL;
    const luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (device) *device = c->device;
    return (void *)c->stream;
}

luna_status luna_backend_cuda_create(luna_backend **out, const luna_backend_options *opt) {
    *out = NULL;
    luna_backend *be = calloc(1, sizeof *be);
    luna_cuda_impl *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "backend: cannot allocate the CUDA backend");
    }
    pthread_mutex_init(&c->alloc_lock, NULL);
    pthread_mutex_init(&c->staging_lock, NULL);
    pthread_mutex_init(&c->id_lock, NULL);
    const char *cache = getenv("LUNA_CUDA_CACHE");
    c->cache_memory = !(cache && strcmp(cache, "0") == 0);
    c->bf16 = opt->bf16;
    be->name = "cuda";
    be->device = LUNA_DEVICE_CUDA;
    be->act_dtype = opt->bf16 ? LUNA_BF16 : LUNA_F32;
    be->num_threads = opt->num_threads > 0 ? opt->num_threads : 1;
    be->impl = c;
    be->mem = &cuda_memory;
    luna_status st = luna_backend_set_kernels(be, &luna_cuda_kernels);
    if (st == LUNA_OK) st = setup(be, opt);
    if (st != LUNA_OK) {
        luna_backend_free(be); /* keeps the error message: teardown records none */
        return st;
    }
    *out = be;
    return LUNA_OK;
}
