#include "model/pass.h"

/* ---- pass helpers ---------------------------------------------------------------------------- */

luna_status luna_pass_dropout(const luna_pass *ps, float *y, const float *x, int64_t n, float p,
                              uint32_t site) {
    if (!luna_pass_drops(ps, p)) {
        if (y != x) LUNA_TRY(luna_mem_copy(ps->be, y, x, (size_t)n * sizeof(float)));
        return LUNA_OK;
    }
    return ps->be->ops->dropout_forward(ps->be, y, x, n, p, luna_pass_key(ps, site));
}

luna_status luna_pass_dropout_backward(const luna_pass *ps, float *dx, const float *dy, int64_t n,
                                       float p, uint32_t site) {
    if (!luna_pass_drops(ps, p)) {
        if (dx != dy) LUNA_TRY(luna_mem_copy(ps->be, dx, dy, (size_t)n * sizeof(float)));
        return LUNA_OK;
    }
    return ps->be->ops->dropout_backward(ps->be, dx, dy, n, p, luna_pass_key(ps, site));
}

luna_status luna_pass_alloc(const luna_pass *ps, float **out, int64_t count, const char *what) {
    *out = luna_arena_alloc(ps->arena, (size_t)count * sizeof(float));
    if (!*out)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                          "out of %s memory for %s (%lld floats; %zu bytes of activations in use)",
                          ps->be->name, what, (long long)count, luna_arena_used_bytes(ps->arena));
    return LUNA_OK;
}

luna_status luna_pass_alloc_i32(const luna_pass *ps, int32_t **out, int64_t count,
                                const char *what) {
    *out = luna_arena_alloc(ps->arena, (size_t)count * sizeof(int32_t));
    if (!*out)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of %s memory for %s (%lld ints)",
                          ps->be->name, what, (long long)count);
    return LUNA_OK;
}
