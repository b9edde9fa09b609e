/* bf16 copies of fp32 weights, and the counted holds of hold_weights (backend_cuda.h).
 *
 * In bf16 mode (core/backend.h, "Precision") parameters stay fp32 master copies; cuBLASLt wants
 * both GEMM inputs in one type, so linear multiplies bf16 activations by a bf16 copy of W. A copy
 * is made on first use and reused until its fp32 original is written: every op and memory call
 * of this backend that writes fp32 device memory reports the range (luna_cuda_weights_written),
 * and the copies overlapping it are marked stale. So the copies are refreshed once per update
 * (the optimizer writes the parameters), on first use in the next forward pass, and micro-batches
 * of one update (--update-freq) share them. A copy takes numel · 2 bytes beside the weight.
 *
 * The table is a short array (a model has a few hundred Linear weights), searched linearly. */
#include <stdlib.h>

#include "model/kernels/cuda/backend_cuda.h"
#include "model/kernels/cuda/cuda_kernels.h"

static bool overlaps(uintptr_t a, size_t abytes, uintptr_t b, size_t bbytes) {
    return a < b + bbytes && b < a + abytes;
}

void luna_cuda_weights_written(luna_backend *be, const void *p, size_t bytes) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    for (size_t i = 0; i < c->ncopies; i++)
        if (c->copies[i].valid &&
            overlaps(c->copies[i].src, c->copies[i].numel * sizeof(float), (uintptr_t)p, bytes))
            c->copies[i].valid = false;
}

/* FNV-1a over the table's entries, in table order (an entry that moves changes it too). */
uint64_t luna_cuda_weights_state(luna_backend *be) {
    const luna_cuda_impl *c = luna_cuda_impl_of(be);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < c->ncopies; i++) {
        const uint64_t words[4] = {(uint64_t)c->copies[i].src, (uint64_t)c->copies[i].numel,
                                   (uint64_t)(uintptr_t)c->copies[i].copy,
                                   (uint64_t)c->copies[i].valid};
        for (int w = 0; w < 4; w++) {
            h ^= words[w];
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

/* A weight's memory is going back to the allocator: its copies go too. (Correctness does not
 * depend on it — whatever is later stored at that address arrives through a reported write — but
 * it keeps copies of freed models from piling up.) The block's extent comes from the caching
 * allocator; with caching off only copies of a weight at the block's start are found. */
void luna_cuda_weights_freed(luna_backend *be, const void *p) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    size_t bytes = 1;
    if (c->cache_memory) {
        pthread_mutex_lock(&c->alloc_lock);
        bytes = luna_cuda_cache_block_size(c->cache, p);
        pthread_mutex_unlock(&c->alloc_lock);
    }
    for (size_t i = c->ncopies; i-- > 0;)
        if (overlaps(c->copies[i].src, 1, (uintptr_t)p, bytes ? bytes : 1)) {
            luna_cuda_raw_release(be, c->copies[i].copy);
            c->copies[i] = c->copies[--c->ncopies];
        }
}

luna_status luna_cuda_weight_bf16(luna_backend *be, const float *W, size_t numel,
                                  const void **copy) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    luna_cuda_weight_copy *e = NULL;
    for (size_t i = 0; i < c->ncopies && !e; i++)
        if (c->copies[i].src == (uintptr_t)W && c->copies[i].numel == numel) e = &c->copies[i];
    if (!e) {
        if (c->ncopies == c->cap_copies) {
            size_t cap = c->cap_copies ? 2 * c->cap_copies : 64;
            luna_cuda_weight_copy *t = realloc(c->copies, cap * sizeof *t);
            if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "linear: out of host memory");
            c->copies = t, c->cap_copies = cap;
        }
        void *buf = luna_cuda_raw_alloc(be, numel * 2);
        if (!buf)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                              "linear: no device memory for the bf16 copy of a weight (%zu "
                              "elements)",
                              numel);
        e = &c->copies[c->ncopies++];
        *e = (luna_cuda_weight_copy){(uintptr_t)W, numel, buf, false};
    }
    if (!e->valid) {
        LUNA_TRY(luna_cuda_check(luna_cuda_convert_to_bf16(c->stream, e->copy, W, (int64_t)numel),
                                 "convert_to_bf16 (weight copy)"));
        /* A captured conversion runs when its graph is launched, which a failed capture never
         * is: the copy stays stale, and the graph converts it at every replay (a later use in
         * the same capture converts it again). */
        e->valid = !c->capturing;
    }
    *copy = e->copy;
    return LUNA_OK;
}

luna_status luna_cuda_hold_weights(luna_backend *be, const float *W, int out, int in,
                                   luna_dtype dtype) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (dtype != LUNA_F32)
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "hold_weights: int8 weights are CPU-only; the CUDA backend decodes fp32 "
                          "and bf16 (translate an int8 model with --device cpu)");
    for (size_t i = 0; i < c->nholds; i++)
        if (c->holds[i].W == W) {
            if (c->holds[i].out != out || c->holds[i].in != in)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "hold_weights: W is held as [%d, %d], not [%d, %d]",
                                  c->holds[i].out, c->holds[i].in, out, in);
            c->holds[i].count++;
            return LUNA_OK;
        }
    if (c->nholds == c->cap_holds) {
        size_t cap = c->cap_holds ? 2 * c->cap_holds : 64;
        luna_cuda_hold *t = realloc(c->holds, cap * sizeof *t);
        if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of host memory");
        c->holds = t, c->cap_holds = cap;
    }
    c->holds[c->nholds++] = (luna_cuda_hold){W, out, in, 1};
    return LUNA_OK;
}

luna_status luna_cuda_release_weights(luna_backend *be, const float *W) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    if (!W) return LUNA_OK;
    for (size_t i = 0; i < c->nholds; i++)
        if (c->holds[i].W == W) {
            if (--c->holds[i].count == 0) c->holds[i] = c->holds[--c->nholds];
            return LUNA_OK;
        }
    return luna_error(LUNA_ERR_INVALID_ARGUMENT, "release_weights: %p is not held", (void *)W);
}

void luna_cuda_weights_clear(luna_backend *be) {
    luna_cuda_impl *c = luna_cuda_impl_of(be);
    for (size_t i = 0; i < c->ncopies; i++)
        luna_cuda_raw_release(be, c->copies[i].copy);
    free(c->copies);
    free(c->holds);
    c->copies = NULL, c->holds = NULL;
    c->ncopies = c->cap_copies = c->nholds = c->cap_holds = 0;
}
