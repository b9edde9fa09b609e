#include "decoding/cache_slots.h"

#include <stdlib.h>
#include <string.h>

#include "model/pass.h"

luna_status luna_cache_slots_reset(luna_cache_slots *cs, luna_backend *be, luna_arena *arena,
                                   int rows, int T_cap) {
    const size_t n = (size_t)rows * (size_t)T_cap;
    int32_t *a = realloc(cs->host, sizeof(int32_t) * (n ? n : 1));
    if (a) cs->host = a;
    int32_t *b = a ? realloc(cs->tmp, sizeof(int32_t) * (n ? n : 1)) : NULL;
    if (b) cs->tmp = b;
    if (!b) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "cache slots: out of memory");
    memset(cs->host, 0, sizeof(int32_t) * n);
    memset(cs->tmp, 0, sizeof(int32_t) * n);
    cs->rows = rows;
    cs->T_cap = T_cap;
    luna_pass pst = {.be = be, .arena = arena};
    return luna_pass_alloc_i32(&pst, &cs->dev, (int64_t)n, "cache slots");
}

void luna_cache_slots_free(luna_cache_slots *cs) {
    free(cs->host);
    free(cs->tmp);
    *cs = (luna_cache_slots){0};
}

void luna_cache_slots_reorder(luna_cache_slots *cs, const int32_t *rows, int n, int len) {
    const int64_t T_cap = cs->T_cap;
    for (int i = 0; i < n; i++)
        memcpy(cs->tmp + i * T_cap, cs->host + rows[i] * T_cap, sizeof(int32_t) * (size_t)len);
    int32_t *t = cs->host;
    cs->host = cs->tmp, cs->tmp = t;
}

luna_status luna_cache_slots_upload(const luna_cache_slots *cs, luna_backend *be, int n) {
    return luna_mem_from_host(be, cs->dev, cs->host,
                              sizeof(int32_t) * (size_t)n * (size_t)cs->T_cap);
}
