/* Backend-independent parts of the backend boundary: counted allocation, the memory calls, and
 * teardown. */
#include "core/backend.h"

#include <stdlib.h>

#include "core/allocator.h"

void *luna_mem_alloc(luna_backend *be, size_t bytes) {
    __atomic_add_fetch(&be->alloc_calls, 1, __ATOMIC_RELAXED);
    void *p = be->mem->alloc(be, bytes);
    if (!p) return NULL;
    /* Counted with an atomic add: tensors may be created from several threads (data workers). */
    size_t now = __atomic_add_fetch(&be->bytes_in_use, bytes, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&be->peak_bytes, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&be->peak_bytes, &peak, now, true,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return p;
}

void luna_mem_release(luna_backend *be, void *ptr, size_t bytes) {
    if (!ptr) return;
    be->mem->release(be, ptr, bytes);
    __atomic_sub_fetch(&be->bytes_in_use, bytes, __ATOMIC_RELAXED);
}

luna_status luna_mem_zero(luna_backend *be, void *ptr, size_t bytes) {
    return bytes ? be->mem->zero(be, ptr, bytes) : LUNA_OK;
}
luna_status luna_mem_copy(luna_backend *be, void *dst, const void *src, size_t bytes) {
    return bytes && dst != src ? be->mem->copy(be, dst, src, bytes) : LUNA_OK;
}
luna_status luna_mem_from_host(luna_backend *be, void *dst, const void *host, size_t bytes) {
    return bytes ? be->mem->from_host(be, dst, host, bytes) : LUNA_OK;
}
luna_status luna_mem_ids_from_host(luna_backend *be, int32_t *dst, const int32_t *host, int64_t n) {
    if (n <= 0) return LUNA_OK;
    if (be->mem->ids_from_host) return be->mem->ids_from_host(be, dst, host, n);
    return be->mem->from_host(be, dst, host, (size_t)n * sizeof(int32_t));
}
void luna_mem_ids_in_range(luna_backend *be, const int32_t *ids, int64_t n, int32_t lo,
                           int32_t hi) {
    if (n > 0 && be->mem->ids_in_range) be->mem->ids_in_range(be, ids, n, lo, hi);
}
luna_status luna_mem_to_host(luna_backend *be, void *host, const void *src, size_t bytes) {
    __atomic_add_fetch(&be->to_host_calls, 1, __ATOMIC_RELAXED);
    return bytes ? be->mem->to_host(be, host, src, bytes) : LUNA_OK;
}
luna_status luna_backend_synchronize(luna_backend *be) { return be->mem->synchronize(be); }

void luna_backend_free(luna_backend *be) {
    if (!be) return;
    luna_arena_free(be->scratch);
    if (be->mem && be->mem->destroy) be->mem->destroy(be);
    free(be);
}

bool luna_graphs_available(const luna_backend *be) { return be->mem->graph_begin != NULL; }
luna_status luna_graph_begin(luna_backend *be) {
    if (!be->mem->graph_begin)
        return luna_error(LUNA_ERR_UNSUPPORTED, "%s: no graphs on this backend", be->name);
    return be->mem->graph_begin(be);
}
luna_status luna_graph_end(luna_backend *be, void **graph) {
    *graph = NULL;
    if (!be->mem->graph_end)
        return luna_error(LUNA_ERR_UNSUPPORTED, "%s: no graphs on this backend", be->name);
    return be->mem->graph_end(be, graph);
}
luna_status luna_graph_launch(luna_backend *be, void *graph) {
    if (!be->mem->graph_launch)
        return luna_error(LUNA_ERR_UNSUPPORTED, "%s: no graphs on this backend", be->name);
    return be->mem->graph_launch(be, graph);
}
void luna_graph_free(luna_backend *be, void *graph) {
    if (graph && be->mem->graph_free) be->mem->graph_free(be, graph);
}
uint64_t luna_graph_state(luna_backend *be) {
    return be->mem->graph_state ? be->mem->graph_state(be) : 0;
}
