/* The table of held weights (held_table.h). */
#include "model/kernels/cpu/held_table.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct luna_held_table {
    pthread_rwlock_t lock; /* holds and releases write; lookups read */
    atomic_int users;
    luna_held_weight *items;
    int count, cap;
};

luna_status luna_held_table_create(luna_held_table **out) {
    *out = NULL;
    luna_held_table *t = calloc(1, sizeof *t);
    if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory");
    if (pthread_rwlock_init(&t->lock, NULL) != 0) {
        free(t);
        return luna_error(LUNA_ERR_INTERNAL, "hold_weights: cannot create the table's lock");
    }
    atomic_init(&t->users, 1);
    *out = t;
    return LUNA_OK;
}

void luna_held_table_retain(luna_held_table *t) { atomic_fetch_add(&t->users, 1); }

static void free_entry(luna_held_weight *hw) {
    free(hw->panels);
    luna_int8_weight_free(&hw->q8);
}

void luna_held_table_release(luna_held_table *t) {
    if (!t || atomic_fetch_sub(&t->users, 1) != 1) return;
    for (int i = 0; i < t->count; i++)
        free_entry(&t->items[i]);
    free(t->items);
    pthread_rwlock_destroy(&t->lock);
    free(t);
}

/* The index of W's entry, or −1 (under either lock). */
static int index_of(const luna_held_table *t, const float *W, int hint) {
    if (hint >= 0 && hint < t->count && t->items[hint].W == W) return hint;
    for (int i = 0; i < t->count; i++)
        if (t->items[i].W == W) return i;
    return -1;
}

bool luna_held_table_find(luna_held_table *t, const float *W, int *hint, luna_held_weight *hw) {
    if (!t || !W) return false;
    pthread_rwlock_rdlock(&t->lock);
    const int i = index_of(t, W, *hint);
    if (i >= 0) {
        *hw = t->items[i];
        *hint = i;
    }
    pthread_rwlock_unlock(&t->lock);
    return i >= 0;
}

static luna_status pack_f32(float **out, const float *W, int out_dim, int in, int threads) {
    const int np = (out_dim + LUNA_HELD_PANEL - 1) / LUNA_HELD_PANEL;
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof(float) * (size_t)np * in * LUNA_HELD_PANEL) != 0)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory for [%d, %d]",
                          out_dim, in);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int q = 0; q < np; q++)
        for (int k = 0; k < in; k++)
            for (int j = 0; j < LUNA_HELD_PANEL; j++) {
                const int n = q * LUNA_HELD_PANEL + j;
                p[((size_t)q * in + k) * LUNA_HELD_PANEL + j] =
                    n < out_dim ? W[(size_t)n * in + k] : 0.0f;
            }
    *out = p;
    return LUNA_OK;
}

luna_status luna_held_table_hold(luna_held_table *t, const float *W, int out, int in,
                                 luna_dtype dtype, int threads) {
    pthread_rwlock_wrlock(&t->lock);
    luna_status st = LUNA_OK;
    const int i = index_of(t, W, -1);
    if (i >= 0) {
        const luna_held_weight *old = &t->items[i];
        if (old->out != out || old->in != in || old->dtype != dtype)
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                            "hold_weights: W is held as [%d, %d] %s, not [%d, %d] %s", old->out,
                            old->in, luna_dtype_name(old->dtype), out, in, luna_dtype_name(dtype));
        else
            t->items[i].refs++; /* held already: the weights are constant, the panels still hold */
        pthread_rwlock_unlock(&t->lock);
        return st;
    }
    if (t->count == t->cap) {
        const int cap = t->cap ? 2 * t->cap : 32;
        luna_held_weight *items = realloc(t->items, sizeof *items * (size_t)cap);
        if (items) {
            t->items = items;
            t->cap = cap;
        } else {
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory");
        }
    }
    luna_held_weight hw = {W, out, in, 1, dtype, NULL, {0}};
    if (st == LUNA_OK)
        st = dtype == LUNA_I8 ? luna_int8_weight_pack(&hw.q8, W, out, in, threads)
                              : pack_f32(&hw.panels, W, out, in, threads);
    if (st == LUNA_OK) t->items[t->count++] = hw;
    pthread_rwlock_unlock(&t->lock);
    return st;
}

void luna_held_table_drop(luna_held_table *t, const float *W, bool *found) {
    *found = false;
    if (!t) return;
    pthread_rwlock_wrlock(&t->lock);
    const int i = index_of(t, W, -1);
    if (i >= 0) {
        *found = true;
        if (--t->items[i].refs == 0) {
            free_entry(&t->items[i]);
            t->items[i] = t->items[--t->count];
        }
    }
    pthread_rwlock_unlock(&t->lock);
}

void luna_held_table_usage(luna_held_table *t, int *entries, size_t *bytes) {
    *entries = 0;
    *bytes = 0;
    if (!t) return;
    pthread_rwlock_rdlock(&t->lock);
    for (int i = 0; i < t->count; i++) {
        const luna_held_weight *hw = &t->items[i];
        const size_t cols =
            (size_t)(hw->out + LUNA_HELD_PANEL - 1) / LUNA_HELD_PANEL * LUNA_HELD_PANEL;
        *bytes += hw->dtype == LUNA_I8
                      ? cols * (size_t)hw->q8.groups * 4 + cols * (sizeof(float) + sizeof(int32_t))
                      : cols * (size_t)hw->in * sizeof(float);
    }
    *entries = t->count;
    pthread_rwlock_unlock(&t->lock);
}
