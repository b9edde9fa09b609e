/* The table behind the CPU backend's hold_weights (held_weights.c): each held W once — its fp32
 * panels or its int8 values, and the holds not yet released — keyed by the caller's pointer.
 *
 * One table may serve several CPU backends (luna_backend_share_held_weights, model/kernels/
 * registry.h): the translators of one model on several threads (luna-translate --workers,
 * luna_translator_clone) then keep one copy of the packed weights, not one each. So holds and
 * releases take the table's write lock, and a lookup takes the read lock and copies the entry
 * out: a Linear on one thread never sees an entry moved or freed by a hold or release on another
 * (what it copied stays valid while W is held, which its caller guarantees for its own hold). */
#ifndef LUNA_CPU_HELD_TABLE_H
#define LUNA_CPU_HELD_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/backend.h"
#include "model/kernels/cpu/held_int8.h"

#define LUNA_HELD_PANEL 16 /* output columns per fp32 panel: two 8-float AVX registers */

typedef struct {
    const float *W; /* the caller's weights (the key) */
    int out, in;
    int refs; /* holds not yet released, over every backend sharing the table */
    luna_dtype dtype;
    float *panels;       /* F32: Wp[p][k][j] = W[16p + j, k], [ceil(out/16)][in][16], 0 past out */
    luna_int8_weight q8; /* I8 */
} luna_held_weight;

typedef struct luna_held_table luna_held_table;

/* A table with one user. */
luna_status luna_held_table_create(luna_held_table **out);
/* One more user (a backend that shares it). */
void luna_held_table_retain(luna_held_table *t);
/* One user fewer; the last frees the table with whatever is still held. NULL: no-op. */
void luna_held_table_release(luna_held_table *t);

/* W's entry copied into *hw (true), or false when W is not held. *hint: the caller's index of its
 * last hit (decoding looks the same few weights up in turn), updated. */
bool luna_held_table_find(luna_held_table *t, const float *W, int *hint, luna_held_weight *hw);
/* One hold of W [out, in] as dtype: counted when W is held already (with another shape or dtype:
 * an error naming both), else packed (threads: OpenMP threads for the packing). */
luna_status luna_held_table_hold(luna_held_table *t, const float *W, int out, int in,
                                 luna_dtype dtype, int threads);
/* Ends one hold of W; the last frees its panels. *found: whether W was held. */
void luna_held_table_drop(luna_held_table *t, const float *W, bool *found);
/* Entries and bytes of packed weights held (tests: a shared table packs once). */
void luna_held_table_usage(luna_held_table *t, int *entries, size_t *bytes);

#endif
