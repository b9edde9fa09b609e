#include "model/pass.h"

/* ---- pass helpers ---------------------------------------------------------------------------- */

luna_status luna_pass_dropout(const luna_pass *ps, luna_act *y, const luna_act *x, int64_t n,
                              float p, uint32_t site) {
    if (!luna_pass_drops(ps, p)) {
        if (y != x) LUNA_TRY(luna_mem_copy(ps->be, y, x, luna_act_bytes(ps->be, n)));
        return LUNA_OK;
    }
    return ps->be->ops->dropout_forward(ps->be, y, x, n, p, luna_pass_key(ps, site));
}

luna_status luna_pass_dropout_backward(const luna_pass *ps, luna_act *dx, const luna_act *dy,
                                       int64_t n, float p, uint32_t site) {
    if (!luna_pass_drops(ps, p)) {
        if (dx != dy) LUNA_TRY(luna_mem_copy(ps->be, dx, dy, luna_act_bytes(ps->be, n)));
        return LUNA_OK;
    }
    return ps->be->ops->dropout_backward(ps->be, dx, dy, n, p, luna_pass_key(ps, site));
}

luna_status luna_pass_softmax_dropout(const luna_pass *ps, luna_act *y, luna_act **y_d,
                                      const luna_act *x, int64_t rows, int cols,
                                      const int32_t *valid_cols, int64_t rows_per_group,
                                      int causal_period, float p, uint32_t site, const char *what) {
    luna_backend *be = ps->be;
    *y_d = y;
    if (luna_pass_drops(ps, p)) LUNA_TRY(luna_pass_alloc(ps, y_d, rows * cols, what));
    const bool drop = *y_d != y;
    return be->ops->softmax_dropout_forward(be, y, drop ? *y_d : NULL, x, rows, cols, valid_cols,
                                            rows_per_group, causal_period, drop ? p : 0.0f,
                                            luna_pass_key(ps, site));
}

luna_status luna_pass_softmax_dropout_backward(const luna_pass *ps, luna_act *dx,
                                               const luna_act *dyd, const luna_act *y, int64_t rows,
                                               int cols, float p, uint32_t site) {
    luna_backend *be = ps->be;
    return be->ops->softmax_dropout_backward(
        be, dx, dyd, y, rows, cols, luna_pass_drops(ps, p) ? p : 0.0f, luna_pass_key(ps, site));
}

static void *pass_alloc_bytes(const luna_pass *ps, size_t bytes, int64_t count, const char *type,
                              const char *what) {
    void *p = count >= 0 ? luna_arena_alloc(ps->arena, bytes) : NULL;
    if (!p)
        luna_error(LUNA_ERR_OUT_OF_MEMORY,
                   "out of %s memory for %s (%lld %s; %zu bytes of activations in use)",
                   ps->be->name, what, (long long)count, type, luna_arena_used_bytes(ps->arena));
    return p;
}

luna_status luna_pass_alloc(const luna_pass *ps, luna_act **out, int64_t count, const char *what) {
    *out = pass_alloc_bytes(ps, luna_act_bytes(ps->be, count), count,
                            luna_dtype_name(ps->be->act_dtype), what);
    return *out ? LUNA_OK : LUNA_ERR_OUT_OF_MEMORY;
}

luna_status luna_pass_alloc_f32(const luna_pass *ps, float **out, int64_t count, const char *what) {
    *out = pass_alloc_bytes(ps, (size_t)count * sizeof(float), count, "f32", what);
    return *out ? LUNA_OK : LUNA_ERR_OUT_OF_MEMORY;
}

luna_status luna_pass_alloc_i32(const luna_pass *ps, int32_t **out, int64_t count,
                                const char *what) {
    *out = luna_arena_alloc(ps->arena, (size_t)count * sizeof(int32_t));
    if (!*out)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of %s memory for %s (%lld ints)",
                          ps->be->name, what, (long long)count);
    return LUNA_OK;
}
