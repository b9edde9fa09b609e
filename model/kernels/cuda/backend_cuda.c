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
 * Transfers: from_host is cudaMemcpyAsync from pageable host memory, which returns once the
 * runtime has staged the host bytes (CUDA runtime API, "API synchronization behavior"), so the
 * caller may reuse its buffer at once, as core/backend.h promises; to_host waits for the copy. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

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

static void *cuda_alloc(luna_backend *be, size_t bytes) { return luna_cuda_raw_alloc(be, bytes); }

static void cuda_release(luna_backend *be, void *p) {
    luna_cuda_weights_freed(be, p);
    luna_cuda_raw_release(be, p);
}

static luna_status cuda_zero(luna_backend *be, void *p, size_t bytes) {
    luna_cuda_weights_written(be, p, bytes);
    return luna_cuda_check(cudaMemsetAsync(p, 0, bytes, luna_cuda_impl_of(be)->stream),
                           "cudaMemsetAsync");
}

static luna_status cuda_copy(luna_backend *be, void *dst, const void *src, size_t bytes) {
    luna_cuda_weights_written(be, dst, bytes);
    return luna_cuda_check(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, luna_cuda_impl_of(be)->stream),
        "cudaMemcpyAsync (device to device)");
}

static luna_status cuda_from_host(luna_backend *be, void *dst, const void *host, size_t bytes) {
    luna_cuda_weights_written(be, dst, bytes);
    return luna_cuda_check(
        cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, luna_cuda_impl_of(be)->stream),
        "cudaMemcpyAsync (host to device)");
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
    const int none = INT_MAX;
    LUNA_CUDA_TRY(
        cudaMemcpyAsync(c->first_bad, &none, sizeof none, cudaMemcpyHostToDevice, c->stream));
    LUNA_CUDA_TRY(luna_cuda_find_bad_id_launch(c->stream, ids, n, V, exempt ? *exempt : 0,
                                               exempt != NULL, c->first_bad));
    int first = INT_MAX;
    LUNA_CUDA_TRY(
        cudaMemcpyAsync(&first, c->first_bad, sizeof first, cudaMemcpyDeviceToHost, c->stream));
    LUNA_CUDA_TRY(cudaStreamSynchronize(c->stream));
    if (first == INT_MAX) return LUNA_OK;
    int32_t id;
    LUNA_CUDA_TRY(cudaMemcpy(&id, ids + first, sizeof id, cudaMemcpyDeviceToHost));
    return luna_op_bad_id(op, what, first, id, V);
}

static luna_status cuda_to_host(luna_backend *be, void *host, const void *src, size_t bytes) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    LUNA_CUDA_TRY(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    return luna_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
}

static luna_status cuda_synchronize(luna_backend *be) {
    return luna_cuda_check(cudaStreamSynchronize(luna_cuda_impl_of(be)->stream),
                           "cudaStreamSynchronize");
}

static void cuda_destroy(luna_backend *be) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (!c) return;
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    luna_cuda_weights_clear(be);
    luna_cuda_raw_release(be, c->first_bad);
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
};

static luna_status setup(luna_backend *be, const luna_backend_options *opt) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    LUNA_TRY(luna_cuda_select_device(opt->device_id, &c->device));
    LUNA_CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    LUNA_TRY(luna_cuda_cache_create(&c->cache));
    LUNA_TRY(luna_cublas_check(cublasLtCreate(&c->blas.lt), "cublasLtCreate"));
    LUNA_TRY(luna_gemm_plans_create(&c->blas.plans));
    c->blas.tf32 = opt->tf32;
    c->blas.workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
    c->blas.workspace = luna_cuda_raw_alloc(be, c->blas.workspace_bytes);
    c->first_bad = luna_cuda_raw_alloc(be, sizeof(int));
    if (!c->blas.workspace || !c->first_bad)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                          "--device cuda: cannot allocate the cuBLASLt workspace (%zu bytes)",
                          c->blas.workspace_bytes);
    return luna_arena_create(&be->scratch, be, (size_t)16 << 20);
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
