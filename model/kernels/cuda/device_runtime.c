/* CUDA errors, device selection and the caching allocator (device_runtime.h). */
#include "model/kernels/cuda/device_runtime.h"

#include <stdbool.h>
#include <stdlib.h>

luna_status luna_cuda_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return LUNA_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */
    return luna_error(err == cudaErrorMemoryAllocation ? LUNA_ERR_OUT_OF_MEMORY : LUNA_ERR_INTERNAL,
                      "CUDA: %s failed: %s (%s)", what, cudaGetErrorName(err),
                      cudaGetErrorString(err));
}

luna_status luna_cuda_select_device(int device_id, int *out) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return luna_error(LUNA_ERR_UNSUPPORTED, "--device cuda: no usable GPU: %s (%s)",
                          cudaGetErrorString(err), cudaGetErrorName(err));
    }
    if (count <= 0)
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "--device cuda: no GPU found (cudaGetDeviceCount 0)");
    if (device_id < -1)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--device-id %d: a GPU number is 0 or more (-1: the first)", device_id);
    const int dev = device_id < 0 ? 0 : device_id;
    if (dev >= count)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--device cuda: GPU %d requested, this machine has %d (0..%d)", dev,
                          count, count - 1);
    LUNA_CUDA_TRY(cudaSetDevice(dev));
    *out = dev;
    return LUNA_OK;
}

/* ---- the caching allocator --------------------------------------------------------------------
 * Every block ever obtained is in `blocks` (in use or free); free ones are found by a linear scan
 * over their class. Training holds a few hundred blocks, so the scan costs nanoseconds beside a
 * kernel launch; a hash by class would replace it if that ever shows. */

typedef struct {
    void *ptr;
    size_t size; /* its class */
    bool in_use;
} block;

struct luna_cuda_cache {
    block *blocks;
    size_t count, cap;
    luna_cuda_cache_stats stats;
};

size_t luna_cuda_cache_class(size_t bytes) {
    const size_t small = 512, large = (size_t)2 << 20;
    if (bytes == 0) return small;
    if (bytes <= ((size_t)1 << 20)) return (bytes + small - 1) / small * small;
    return (bytes + large - 1) / large * large;
}

luna_status luna_cuda_cache_create(luna_cuda_cache **out) {
    *out = calloc(1, sizeof **out);
    return *out ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "CUDA allocator: out of memory");
}

static void free_block(luna_cuda_cache *c, size_t i) {
    (void)cudaFree(c->blocks[i].ptr);
    c->stats.frees++;
    c->stats.reserved -= c->blocks[i].size;
    c->blocks[i] = c->blocks[--c->count];
}

void luna_cuda_cache_free(luna_cuda_cache *c) {
    if (!c) return;
    while (c->count)
        free_block(c, c->count - 1);
    free(c->blocks);
    free(c);
}

luna_status luna_cuda_cache_trim(luna_cuda_cache *c) {
    for (size_t i = c->count; i-- > 0;)
        if (!c->blocks[i].in_use) free_block(c, i);
    return LUNA_OK;
}

static void take(luna_cuda_cache *c, block *b) {
    b->in_use = true;
    c->stats.in_use += b->size;
    if (c->stats.in_use > c->stats.peak) c->stats.peak = c->stats.in_use;
}

luna_status luna_cuda_cache_alloc(luna_cuda_cache *c, size_t bytes, void **ptr) {
    *ptr = NULL;
    const size_t size = luna_cuda_cache_class(bytes);
    if (size < bytes) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "CUDA allocator: %zu bytes", bytes);
    for (size_t i = 0; i < c->count; i++)
        if (!c->blocks[i].in_use && c->blocks[i].size == size) {
            take(c, &c->blocks[i]);
            c->stats.cache_hits++;
            *ptr = c->blocks[i].ptr;
            return LUNA_OK;
        }
    if (c->count == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        block *b = realloc(c->blocks, cap * sizeof *b);
        if (!b) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "CUDA allocator: out of host memory");
        c->blocks = b;
        c->cap = cap;
    }
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, size);
    c->stats.mallocs++;
    if (err == cudaErrorMemoryAllocation) { /* give the cached blocks back and try once more */
        (void)cudaGetLastError();
        LUNA_TRY(luna_cuda_cache_trim(c));
        err = cudaMalloc(&p, size);
        c->stats.mallocs++;
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return luna_error(err == cudaErrorMemoryAllocation ? LUNA_ERR_OUT_OF_MEMORY
                                                           : LUNA_ERR_INTERNAL,
                          "CUDA: cudaMalloc of %zu bytes failed: %s (%s; %zu bytes in use, %zu "
                          "reserved)",
                          size, cudaGetErrorName(err), cudaGetErrorString(err), c->stats.in_use,
                          c->stats.reserved);
    }
    c->blocks[c->count] = (block){p, size, false};
    c->stats.reserved += size;
    take(c, &c->blocks[c->count++]);
    *ptr = p;
    return LUNA_OK;
}

luna_status luna_cuda_cache_release(luna_cuda_cache *c, void *ptr) {
    if (!ptr) return LUNA_OK;
    for (size_t i = 0; i < c->count; i++)
        if (c->blocks[i].ptr == ptr) {
            if (!c->blocks[i].in_use)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "CUDA allocator: block %p released twice", ptr);
            c->blocks[i].in_use = false;
            c->stats.in_use -= c->blocks[i].size;
            return LUNA_OK;
        }
    return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                      "CUDA allocator: %p was not allocated by this allocator", ptr);
}

size_t luna_cuda_cache_block_size(const luna_cuda_cache *c, const void *ptr) {
    for (size_t i = 0; i < c->count; i++)
        if (c->blocks[i].ptr == ptr) return c->blocks[i].size;
    return 0;
}

luna_cuda_cache_stats luna_cuda_cache_get_stats(const luna_cuda_cache *c) { return c->stats; }
