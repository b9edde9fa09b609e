/* Backend-independent parts of the backend boundary: counted allocation and teardown. */
#include "model/backend.h"

#include <stdlib.h>

#include "model/allocator.h"

void *luna_backend_malloc(luna_backend *backend, size_t bytes) {
    void *p = backend->device_malloc(bytes);
    if (!p) return NULL;
    /* Counted with an atomic add: tensors may be created from several threads (data workers). */
    size_t now = __atomic_add_fetch(&backend->bytes_in_use, bytes, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&backend->peak_bytes, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&backend->peak_bytes, &peak, now, true,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return p;
}

void luna_backend_free(luna_backend *backend, void *ptr, size_t bytes) {
    if (!ptr) return;
    backend->device_free(ptr);
    __atomic_sub_fetch(&backend->bytes_in_use, bytes, __ATOMIC_RELAXED);
}

void luna_backend_free_all(luna_backend *backend) {
    if (!backend) return;
    luna_arena_free(backend->scratch);
    free(backend);
}
