/* The CUDA backend's device runtime (issue "CUDA backend", deliver 2): CUDA errors as luna
 * statuses, device selection with a one-line error when no GPU or driver is usable, and a caching
 * device allocator, so that a training step after the first allocates nothing from the driver.
 *
 * Host C against NVIDIA's cuda_runtime_api.h: it links the real libcudart, or the CPU execution
 * harness's fake one (tests/cuda_emu), unchanged.
 *
 * The allocator (after PyTorch's caching allocator, much simplified): requests are rounded up to
 * a size class — multiples of 512 bytes up to 1 MiB, then multiples of 2 MiB — and a released
 * block goes to a free list of its class instead of back to cudaFree. An allocation takes a free
 * block of exactly its class, else calls cudaMalloc; when cudaMalloc fails it frees every cached
 * block and tries once more. Blocks are never split, so fragmentation is bounded by the rounding
 * (≤ 2 MiB or 512 bytes per block). in_use / peak count the classes' bytes handed out; reserved
 * counts what the driver gave. Single-threaded, like the backend (one stream). */
#ifndef LUNA_KERNELS_CUDA_DEVICE_RUNTIME_H
#define LUNA_KERNELS_CUDA_DEVICE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LUNA_OK for cudaSuccess; otherwise an error "CUDA: <what> failed: <error name> (<error
 * string>)". Clears the non-sticky error state (cudaGetLastError). */
luna_status luna_cuda_check(cudaError_t err, const char *what);
#define LUNA_CUDA_TRY(call) LUNA_TRY(luna_cuda_check((call), #call))

/* Select the GPU: device_id ≥ 0, or −1 for device 0. Errors: no usable GPU or driver (the CUDA
 * message, e.g. "CUDA driver version is insufficient for CUDA runtime version"), an id outside
 * [0, count). On success *out = the device made current. */
luna_status luna_cuda_select_device(int device_id, int *out);

typedef struct luna_cuda_cache luna_cuda_cache;

typedef struct {
    size_t in_use;       /* bytes (size classes) handed out and not released */
    size_t peak;         /* high-water mark of in_use */
    size_t reserved;     /* bytes obtained from cudaMalloc and not yet freed */
    uint64_t mallocs;    /* cudaMalloc calls so far */
    uint64_t frees;      /* cudaFree calls so far */
    uint64_t cache_hits; /* allocations served from a free list */
} luna_cuda_cache_stats;

luna_status luna_cuda_cache_create(luna_cuda_cache **out);
/* Frees every block (released or not) with cudaFree. NULL is a no-op. */
void luna_cuda_cache_free(luna_cuda_cache *c);
/* *ptr = device memory of at least `bytes` (256-byte aligned; 0 bytes gives a 512-byte block). */
luna_status luna_cuda_cache_alloc(luna_cuda_cache *c, size_t bytes, void **ptr);
/* Return a block to its free list (NULL: no-op; a pointer not from this cache: error). The
 * caller must have ordered the release after the work that uses the block (same stream). */
luna_status luna_cuda_cache_release(luna_cuda_cache *c, void *ptr);
/* The size class of the block at ptr (0 when ptr is not a block of this cache). */
size_t luna_cuda_cache_block_size(const luna_cuda_cache *c, const void *ptr);
/* cudaFree every cached (released) block. */
luna_status luna_cuda_cache_trim(luna_cuda_cache *c);
luna_cuda_cache_stats luna_cuda_cache_get_stats(const luna_cuda_cache *c);
/* The size class of a request (exposed for tests). */
size_t luna_cuda_cache_class(size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
