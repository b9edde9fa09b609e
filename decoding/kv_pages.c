#include "decoding/kv_pages.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct luna_kv_pages {
    luna_backend *be;
    int layers, d, H;
    void **buf;        /* [2·layers]: layer i's keys at 2i, values at 2i + 1 */
    size_t *buf_bytes; /* [2·layers] bytes of each (equal, but after a failed growth) */
    size_t peak_bytes; /* most bytes held at once (growth holds an old and a new buffer) */
    uint64_t moves;    /* growths so far: the buffers' addresses changed (step graphs) */
    luna_decoder_layer_state *ls;
    int S_cap, beam, pages; /* pages: the most blocks a sentence takes (max_steps positions) */
    size_t block_bytes;     /* one block in one buffer */
    int cap;                /* blocks that fit in the buffers */
    bool *busy;             /* [cap] */
    int lowest_free;        /* no free block below it */
    int used, used_peak;
    int32_t *table, *moved; /* [S_cap, pages]: sentence s's k-th block */
    int *held, *held_moved; /* [S_cap]: blocks each sentence holds */
};

luna_status luna_kv_pages_create(luna_kv_pages **out, luna_backend *be, int layers, int d, int H) {
    *out = NULL;
    luna_kv_pages *kv = calloc(1, sizeof *kv);
    if (kv) kv->buf = calloc(2 * (size_t)layers, sizeof *kv->buf);
    if (kv) kv->buf_bytes = calloc(2 * (size_t)layers, sizeof *kv->buf_bytes);
    if (!kv || !kv->buf || !kv->buf_bytes) {
        if (kv) free(kv->buf);
        free(kv);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "key/value pages: out of memory");
    }
    kv->be = be;
    kv->layers = layers;
    kv->d = d;
    kv->H = H;
    *out = kv;
    return LUNA_OK;
}

void luna_kv_pages_free(luna_kv_pages *kv) {
    if (!kv) return;
    for (int i = 0; i < 2 * kv->layers; i++)
        luna_mem_release(kv->be, kv->buf[i], kv->buf_bytes[i]);
    free(kv->buf);
    free(kv->buf_bytes);
    free(kv->busy);
    free(kv->table);
    free(kv->moved);
    free(kv->held);
    free(kv->held_moved);
    free(kv);
}

static void bind(luna_kv_pages *kv) {
    for (int i = 0; i < kv->layers; i++) {
        kv->ls[i].self_k = kv->buf[2 * i];
        kv->ls[i].self_v = kv->buf[2 * i + 1];
    }
}

/* Buffers of `cap` blocks (cap above the present capacity), the contents kept: one buffer at a
 * time, so that the old and the new copy of only one buffer are held together. */
static luna_status grow(luna_kv_pages *kv, int cap) {
    const size_t bytes = kv->block_bytes * (size_t)cap;
    kv->moves++;
    bool *busy = realloc(kv->busy, sizeof(bool) * (size_t)cap);
    if (!busy) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "key/value pages: out of memory");
    kv->busy = busy;
    memset(busy + kv->cap, 0, sizeof(bool) * (size_t)(cap - kv->cap));
    for (int i = 0; i < 2 * kv->layers; i++) {
        void *p = luna_mem_alloc(kv->be, bytes);
        if (!p)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                              "key/value pages: out of device memory for %d blocks of %zu bytes",
                              cap, kv->block_bytes);
        const size_t held = luna_kv_pages_bytes(kv) + bytes; /* old and new copy of buffer i */
        kv->peak_bytes = held > kv->peak_bytes ? held : kv->peak_bytes;
        luna_status st = luna_mem_copy(kv->be, p, kv->buf[i], kv->block_bytes * (size_t)kv->cap);
        if (st != LUNA_OK) {
            luna_mem_release(kv->be, p, bytes);
            return st;
        }
        luna_mem_release(kv->be, kv->buf[i], kv->buf_bytes[i]);
        kv->buf[i] = p;
        kv->buf_bytes[i] = bytes;
    }
    kv->cap = cap;
    bind(kv);
    return LUNA_OK;
}

luna_status luna_kv_pages_begin(luna_kv_pages *kv, luna_decoder_layer_state *ls, int S_cap,
                                int beam, int max_steps) {
    if (S_cap <= 0 || beam <= 0 || max_steps <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "key/value pages: bad pool (sentences %d, beam %d, max steps %d)", S_cap,
                          beam, max_steps);
    const int pages = (max_steps + LUNA_KV_PAGE - 1) / LUNA_KV_PAGE;
    const size_t table = (size_t)S_cap * pages;
    int32_t *t = realloc(kv->table, sizeof(int32_t) * table);
    if (t) kv->table = t;
    int32_t *m = t ? realloc(kv->moved, sizeof(int32_t) * table) : NULL;
    if (m) kv->moved = m;
    int *h = m ? realloc(kv->held, sizeof(int) * (size_t)S_cap) : NULL;
    if (h) kv->held = h;
    int *hm = h ? realloc(kv->held_moved, sizeof(int) * (size_t)S_cap) : NULL;
    if (hm) kv->held_moved = hm;
    if (!hm) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "key/value pages: out of memory");
    memset(kv->held, 0, sizeof(int) * (size_t)S_cap);
    kv->ls = ls;
    kv->S_cap = S_cap;
    kv->beam = beam;
    kv->pages = pages;
    /* [beam slots, H, LUNA_KV_PAGE, dh] = beam · LUNA_KV_PAGE rows of d */
    kv->block_bytes = luna_act_bytes(kv->be, (int64_t)beam * LUNA_KV_PAGE * kv->d);
    size_t least = kv->buf_bytes[0];
    for (int i = 1; i < 2 * kv->layers; i++)
        least = kv->buf_bytes[i] < least ? kv->buf_bytes[i] : least;
    kv->cap = (int)(least / kv->block_bytes);
    free(kv->busy);
    kv->busy = calloc(kv->cap > 0 ? (size_t)kv->cap : 1, sizeof(bool));
    if (!kv->busy) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "key/value pages: out of memory");
    kv->lowest_free = kv->used = kv->used_peak = 0;
    bind(kv);
    return kv->cap < S_cap ? grow(kv, S_cap) : LUNA_OK;
}

luna_status luna_kv_pages_block(luna_kv_pages *kv, int s, int t, int32_t *block) {
    const int k = t / LUNA_KV_PAGE;
    if (s < 0 || s >= kv->S_cap || t < 0 || k >= kv->pages || k > kv->held[s])
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "key/value pages: sentence %d at position %d (%d of %d sentences; it "
                          "holds %d pages of %d)",
                          s, t, s, kv->S_cap, s >= 0 && s < kv->S_cap ? kv->held[s] : 0,
                          LUNA_KV_PAGE);
    int32_t *row = kv->table + (size_t)s * kv->pages;
    if (k < kv->held[s]) {
        *block = row[k];
        return LUNA_OK;
    }
    int b = kv->lowest_free;
    while (b < kv->cap && kv->busy[b])
        b++;
    if (b == kv->cap) {
        const int most = kv->S_cap * kv->pages;
        const int cap = kv->cap + (kv->cap + 1) / 2 < most ? kv->cap + (kv->cap + 1) / 2 : most;
        if (cap <= kv->cap)
            return luna_error(LUNA_ERR_INTERNAL, "key/value pages: all %d blocks in use", kv->cap);
        LUNA_TRY(grow(kv, cap));
    }
    kv->busy[b] = true;
    kv->lowest_free = b + 1;
    kv->used++;
    kv->used_peak = kv->used > kv->used_peak ? kv->used : kv->used_peak;
    row[kv->held[s]++] = b;
    *block = b;
    return LUNA_OK;
}

luna_status luna_kv_pages_reorder(luna_kv_pages *kv, const int32_t *from, int n_new, int n_old) {
    if (n_new < 0 || n_old < n_new || n_old > kv->S_cap)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "key/value pages: %d sentences from %d (of %d)", n_new, n_old, kv->S_cap);
    /* held_moved marks the old sentences taken (−1) while checking */
    for (int s = 0; s < n_old; s++)
        kv->held_moved[s] = 0;
    for (int i = 0; i < n_new; i++) {
        if (from[i] < 0 || from[i] >= n_old || kv->held_moved[from[i]] < 0)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "key/value pages: sentence %d from %d: out of [0, %d) or taken twice",
                              i, from[i], n_old);
        kv->held_moved[from[i]] = -1;
    }
    for (int s = 0; s < n_old; s++) /* the sentences that leave give their blocks back */
        for (int k = 0; kv->held_moved[s] == 0 && k < kv->held[s]; k++) {
            const int b = kv->table[(size_t)s * kv->pages + k];
            kv->busy[b] = false;
            kv->lowest_free = b < kv->lowest_free ? b : kv->lowest_free;
            kv->used--;
        }
    for (int i = 0; i < n_new; i++) {
        memcpy(kv->moved + (size_t)i * kv->pages, kv->table + (size_t)from[i] * kv->pages,
               sizeof(int32_t) * (size_t)kv->held[from[i]]);
        kv->held_moved[i] = kv->held[from[i]];
    }
    int32_t *t = kv->table;
    kv->table = kv->moved, kv->moved = t;
    int *h = kv->held;
    kv->held = kv->held_moved, kv->held_moved = h;
    for (int s = n_new; s < kv->S_cap; s++)
        kv->held[s] = 0;
    return LUNA_OK;
}

size_t luna_kv_pages_bytes(const luna_kv_pages *kv) {
    size_t n = 0;
    for (int i = 0; i < 2 * kv->layers; i++)
        n += kv->buf_bytes[i];
    return n;
}
size_t luna_kv_pages_peak_bytes(const luna_kv_pages *kv) { return kv->peak_bytes; }
uint64_t luna_kv_pages_moves(const luna_kv_pages *kv) { return kv ? kv->moves : 0; }
int luna_kv_pages_blocks_used(const luna_kv_pages *kv) { return kv->used; }
int luna_kv_pages_blocks_peak(const luna_kv_pages *kv) { return kv->used_peak; }
