/* A device-resident description of N tensors inside flat buffers, for the multi-tensor ops of
 * core/backend.h (multi_sum_squares, multi_scale, multi_adam_update, multi_apollo_update): one
 * launch handles every tensor instead of one op per tensor.
 *
 * Tensor i occupies elements [offsets[i], offsets[i] + numels[i]) of each flat buffer the op is
 * given (parameters, gradients and optimizer state share one layout). Every tensor is cut into
 * blocks of LUNA_TENSOR_TABLE_BLOCK elements (the last block of a tensor may be shorter; a tensor
 * of 0 elements has no block), numbered globally in tensor order: tensor i owns blocks
 * [block_start[i], block_start[i + 1]) and block_tensor[k] names the tensor of block k. These are
 * the fixed blocks of every deterministic reduction (core/reduce_order.h), so a per-tensor
 * reduction over the table equals the same reduction of that tensor alone bit for bit, and a
 * device kernel can map one thread block to one table block.
 *
 * The table is built once (by whoever owns the flat buffers, e.g. the trainer for the trainable
 * parameters) and uploaded with luna_mem_from_host; it also owns a device workspace large enough
 * for the per-block partials and per-tensor scalars of every multi op
 * (LUNA_TENSOR_TABLE_WORKSPACE_* below), so no op over it allocates. The host keeps a copy of the
 * description (for launch planning and error messages) and, for a table made from descriptions
 * (luna_tensor_table_create_named), each tensor's name and shape: what a consumer such as the
 * optimizer needs to name and view per-tensor state without knowing where the tensors come from.
 */
#ifndef LUNA_CORE_TENSOR_TABLE_H
#define LUNA_CORE_TENSOR_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/reduce_order.h"
#include "core/status.h"
#include "core/tensor.h"

#define LUNA_TENSOR_TABLE_BLOCK LUNA_REDUCE_BLOCK /* elements (core/reduce_order.h) */
/* Workspace doubles per block and per tensor the multi ops may use (5 per block: Apollo's four
 * reductions and ΣD; 8 per tensor: the derived per-tensor scalars). */
#define LUNA_TENSOR_TABLE_WORKSPACE_PER_BLOCK 5
#define LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR 8

/* One tensor of a named table: a slice of the flat buffers with the name and shape that views of
 * it carry (checkpoint keys, messages). ndim 0 means a vector of numel elements. */
typedef struct {
    const char *name;
    int64_t offset, numel;
    int ndim;
    int64_t shape[LUNA_MAX_DIMS];
} luna_tensor_desc;

struct luna_tensor_table {
    luna_backend *be;
    int num_tensors;
    int64_t num_blocks;   /* Σ_i ceil(numels[i] / LUNA_TENSOR_TABLE_BLOCK) */
    int64_t num_elements; /* Σ_i numels[i] */
    int64_t max_numel;
    /* device arrays (one allocation) */
    const int64_t *offsets;      /* [num_tensors] elements from the start of a flat buffer */
    const int64_t *numels;       /* [num_tensors] */
    const int64_t *block_start;  /* [num_tensors + 1] */
    const int32_t *block_tensor; /* [num_blocks] */
    double *workspace;           /* device, workspace_doubles */
    size_t workspace_doubles;
    /* host copies */
    int64_t *host_offsets, *host_numels, *host_block_start;
    luna_tensor_desc *host_tensors; /* [num_tensors], names owned; NULL for an unnamed table */
    /* private */
    void *dev_ints;
    size_t dev_ints_bytes;
};
typedef struct luna_tensor_table luna_tensor_table;

/* Builds the table of n ≥ 0 tensors (offsets[i] ≥ 0, numels[i] ≥ 0; host arrays, copied) on
 * `be`'s device. Free with luna_tensor_table_free. */
luna_status luna_tensor_table_create(luna_tensor_table **out, luna_backend *be, int n,
                                     const int64_t *offsets, const int64_t *numels);
void luna_tensor_table_free(luna_tensor_table *t);

/* The same from n ≥ 0 descriptions (copied, names included): every name non-empty and distinct,
 * and a shape's product equal to numel (LUNA_ERR_INVALID_ARGUMENT naming the tensor otherwise). */
luna_status luna_tensor_table_create_named(luna_tensor_table **out, luna_backend *be, int n,
                                           const luna_tensor_desc *tensors);
/* Tensor i's name ("" in an unnamed table); the index of `name` (-1 when absent or unnamed). */
const char *luna_tensor_table_name(const luna_tensor_table *t, int i);
int luna_tensor_table_find(const luna_tensor_table *t, const char *name);
/* An F32 view of tensor i inside the flat device buffer `base` (which has the table's layout),
 * with the tensor's shape ([numel] when it has none). */
luna_tensor luna_tensor_table_view(const luna_tensor_table *t, int i, float *base);
/* One past the last element any tensor occupies: the length a flat buffer must have. */
int64_t luna_tensor_table_extent(const luna_tensor_table *t);

#endif
