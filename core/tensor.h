/* Tensors: a typed, shaped view of device memory.
 *
 * Layout is always contiguous row-major (the last axis varies fastest); strides are implied by the
 * shape. A tensor either owns its memory (luna_tensor_create, freed by luna_tensor_free) or views
 * memory owned by something else (an arena, a parameter block, a caller's buffer). Model code
 * never dereferences `data`: it passes it to backend ops, which know where it lives (`device`).
 */
#ifndef LUNA_TENSOR_H
#define LUNA_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define LUNA_MAX_DIMS 4

typedef enum {
    LUNA_F32 = 0,
    LUNA_BF16, /* the CUDA backend's activations in --precision bf16 */
    LUNA_I32,
    LUNA_I8, /* int8 checkpoints' weights (core/quantize.h) */
} luna_dtype;

typedef enum {
    LUNA_DEVICE_CPU = 0,
    LUNA_DEVICE_CUDA,
} luna_device;

typedef struct luna_backend luna_backend;
typedef struct luna_arena luna_arena;

typedef struct {
    void *data;
    int ndim;
    int64_t shape[LUNA_MAX_DIMS];
    luna_dtype dtype;
    luna_device device;
    bool owns_data;
    luna_backend *backend; /* allocator of `data` when owns_data */
} luna_tensor;

size_t luna_dtype_size(luna_dtype dtype);
const char *luna_dtype_name(luna_dtype dtype);
int64_t luna_tensor_numel(const luna_tensor *t);
size_t luna_tensor_bytes(const luna_tensor *t);

/* Allocate an owning, zero-filled tensor on the backend's device. */
luna_status luna_tensor_create(luna_tensor *out, luna_backend *backend, luna_dtype dtype, int ndim,
                               const int64_t *shape);
/* Carve a (non-owning) tensor out of an arena; released with the arena mark. */
luna_status luna_tensor_from_arena(luna_tensor *out, luna_arena *arena, luna_dtype dtype, int ndim,
                                   const int64_t *shape);
/* A non-owning view of existing memory. */
luna_tensor luna_tensor_view(void *data, luna_device device, luna_dtype dtype, int ndim,
                             const int64_t *shape);
/* Frees owned memory (no-op for views); leaves the struct zeroed. */
void luna_tensor_free(luna_tensor *t);

/* "f32[2,3,4]" into buf. */
const char *luna_tensor_describe(const luna_tensor *t, char *buf, size_t size);

#endif
