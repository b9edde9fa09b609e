#include "core/tensor.h"

#include <stdio.h>
#include <string.h>

#include "core/allocator.h"
#include "core/backend.h"

size_t luna_dtype_size(luna_dtype dtype) {
    switch (dtype) {
    case LUNA_F32: return 4;
    case LUNA_BF16: return 2;
    case LUNA_I32: return 4;
    case LUNA_I8: return 1;
    }
    return 0;
}

const char *luna_dtype_name(luna_dtype dtype) {
    switch (dtype) {
    case LUNA_F32: return "F32";
    case LUNA_BF16: return "BF16";
    case LUNA_I32: return "I32";
    case LUNA_I8: return "I8";
    }
    return "?";
}

int64_t luna_tensor_numel(const luna_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t luna_tensor_bytes(const luna_tensor *t) {
    return (size_t)luna_tensor_numel(t) * luna_dtype_size(t->dtype);
}

static luna_status set_shape(luna_tensor *t, luna_dtype dtype, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > LUNA_MAX_DIMS)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "tensor: %d dimensions (at most %d)", ndim,
                          LUNA_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->ndim = ndim;
    t->dtype = dtype;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "tensor: negative size %lld on axis %d",
                              (long long)shape[i], i);
        t->shape[i] = shape[i];
    }
    return LUNA_OK;
}

luna_status luna_tensor_create(luna_tensor *out, luna_backend *backend, luna_dtype dtype, int ndim,
                               const int64_t *shape) {
    LUNA_TRY(set_shape(out, dtype, ndim, shape));
    out->device = backend->device;
    out->backend = backend;
    size_t bytes = luna_tensor_bytes(out);
    out->data = luna_mem_alloc(backend, bytes);
    if (!out->data && bytes > 0)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "tensor: cannot allocate %zu bytes on %s", bytes,
                          backend->name);
    luna_status st = luna_mem_zero(backend, out->data, bytes);
    if (st != LUNA_OK) {
        luna_mem_release(backend, out->data, bytes);
        out->data = NULL;
        return st;
    }
    out->owns_data = true;
    return LUNA_OK;
}

luna_status luna_tensor_from_arena(luna_tensor *out, luna_arena *arena, luna_dtype dtype, int ndim,
                                   const int64_t *shape) {
    LUNA_TRY(set_shape(out, dtype, ndim, shape));
    out->device = luna_arena_device(arena);
    out->data = luna_arena_alloc(arena, luna_tensor_bytes(out));
    if (!out->data) return LUNA_ERR_OUT_OF_MEMORY; /* message set by the arena */
    return LUNA_OK;
}

luna_tensor luna_tensor_view(void *data, luna_device device, luna_dtype dtype, int ndim,
                             const int64_t *shape) {
    luna_tensor t;
    if (set_shape(&t, dtype, ndim, shape) != LUNA_OK) {
        memset(&t, 0, sizeof t);
        return t;
    }
    t.data = data;
    t.device = device;
    return t;
}

void luna_tensor_free(luna_tensor *t) {
    if (t->owns_data && t->data) luna_mem_release(t->backend, t->data, luna_tensor_bytes(t));
    memset(t, 0, sizeof *t);
}

const char *luna_tensor_describe(const luna_tensor *t, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "%s[", luna_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && used < size; i++)
        used +=
            (size_t)snprintf(buf + used, size - used, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}
