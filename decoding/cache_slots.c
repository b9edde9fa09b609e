#include "decoding/cache_slots.h"

#include <stdlib.h>
#include <string.h>

#include "model/pass.h"

luna_status luna_cache_slots_reset(luna_cache_slots *cs, luna_backend *be, luna_arena *arena,
                                   int rows, int T_cap) {
    const size_t n = (size_t)rows * (size_t)T_cap;
    int32_t *h = realloc(cs->host, sizeof(int32_t) * (2 * (size_t)rows + 1));
    if (!h) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "cache slots: out of memory");
    cs->host = h;
    memset(cs->host, 0, sizeof(int32_t) * 2 * (size_t)rows);
    cs->rows = rows;
    cs->T_cap = T_cap;
    luna_pass pst = {.be = be, .arena = arena};
    LUNA_TRY(luna_pass_alloc_i32(&pst, &cs->dev, (int64_t)n, "cache slots"));
    LUNA_TRY(luna_pass_alloc_i32(&pst, &cs->spare, (int64_t)n, "cache slots"));
    LUNA_TRY(luna_pass_alloc_i32(&pst, &cs->step_dev, 2 * (int64_t)rows, "cache slots"));
    LUNA_TRY(luna_mem_zero(be, cs->dev, sizeof(int32_t) * n));
    return luna_mem_zero(be, cs->spare, sizeof(int32_t) * n);
}

void luna_cache_slots_free(luna_cache_slots *cs) {
    free(cs->host);
    *cs = (luna_cache_slots){0};
}

luna_status luna_cache_slots_write(luna_cache_slots *cs, luna_backend *be, int n) {
    if (n == 0) return LUNA_OK;
    /* the n slots next to the n positions: one upload */
    if (n < cs->rows) memmove(cs->host + n, cs->host + cs->rows, sizeof(int32_t) * (size_t)n);
    LUNA_TRY(luna_mem_from_host(be, cs->step_dev, cs->host, sizeof(int32_t) * 2 * (size_t)n));
    return be->ops->index_rows_update(be, cs->dev, cs->dev, NULL, n, 0, cs->T_cap, cs->step_dev,
                                      cs->step_dev + n);
}

luna_status luna_cache_slots_reorder(luna_cache_slots *cs, luna_backend *be, const int32_t *rows,
                                     int n, int len) {
    if (n == 0) return LUNA_OK;
    LUNA_TRY(
        be->ops->index_rows_update(be, cs->spare, cs->dev, rows, n, len, cs->T_cap, NULL, NULL));
    int32_t *t = cs->dev;
    cs->dev = cs->spare, cs->spare = t;
    return LUNA_OK;
}
