/* The multi-tensor description (see core/tensor_table.h). */
#include "core/tensor_table.h"

#include <stdlib.h>
#include <string.h>

void luna_tensor_table_free(luna_tensor_table *t) {
    if (!t) return;
    if (t->dev_ints) luna_mem_release(t->be, t->dev_ints, t->dev_ints_bytes);
    if (t->workspace) luna_mem_release(t->be, t->workspace, t->workspace_doubles * sizeof(double));
    free(t->host_offsets);
    free(t->host_numels);
    free(t->host_block_start);
    if (t->host_tensors)
        for (int i = 0; i < t->num_tensors; i++)
            free((char *)t->host_tensors[i].name);
    free(t->host_tensors);
    free(t);
}

luna_status luna_tensor_table_create(luna_tensor_table **out, luna_backend *be, int n,
                                     const int64_t *offsets, const int64_t *numels) {
    if (!out || !be || n < 0 || (n > 0 && (!offsets || !numels)))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "tensor_table_create: bad arguments");
    *out = NULL;
    luna_tensor_table *t = calloc(1, sizeof *t);
    if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "tensor table: out of host memory");
    t->be = be;
    t->num_tensors = n;
    size_t nn = (size_t)n;
    t->host_offsets = malloc((nn + 1) * sizeof(int64_t));
    t->host_numels = malloc((nn + 1) * sizeof(int64_t));
    t->host_block_start = malloc((nn + 1) * sizeof(int64_t));
    int32_t *block_tensor = NULL;
    luna_status st = LUNA_OK;
    if (!t->host_offsets || !t->host_numels || !t->host_block_start) goto oom;
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) {
        if (offsets[i] < 0 || numels[i] < 0) {
            luna_tensor_table_free(t);
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "tensor_table_create: tensor %d has offset %lld, %lld elements", i,
                              (long long)offsets[i], (long long)numels[i]);
        }
        t->host_offsets[i] = offsets[i];
        t->host_numels[i] = numels[i];
        t->host_block_start[i] = blocks;
        blocks += (numels[i] + LUNA_TENSOR_TABLE_BLOCK - 1) / LUNA_TENSOR_TABLE_BLOCK;
        t->num_elements += numels[i];
        if (numels[i] > t->max_numel) t->max_numel = numels[i];
    }
    t->host_block_start[n] = blocks;
    t->num_blocks = blocks;
    block_tensor = malloc((size_t)(blocks + 1) * sizeof *block_tensor);
    if (!block_tensor) goto oom;
    for (int i = 0; i < n; i++)
        for (int64_t k = t->host_block_start[i]; k < t->host_block_start[i + 1]; k++)
            block_tensor[k] = i;

    /* One device allocation: offsets, numels, block_start (int64), then block_tensor (int32). */
    size_t ints64 = 3 * nn + 1;
    t->dev_ints_bytes = ints64 * sizeof(int64_t) + (size_t)blocks * sizeof(int32_t);
    t->dev_ints = luna_mem_alloc(be, t->dev_ints_bytes ? t->dev_ints_bytes : 8);
    t->workspace_doubles = (size_t)blocks * LUNA_TENSOR_TABLE_WORKSPACE_PER_BLOCK +
                           nn * LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR + 1;
    t->workspace = luna_mem_alloc(be, t->workspace_doubles * sizeof(double));
    if (!t->dev_ints || !t->workspace) {
        size_t bytes = t->dev_ints_bytes + t->workspace_doubles * sizeof(double);
        free(block_tensor);
        luna_tensor_table_free(t);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "tensor table: cannot allocate %zu bytes on %s",
                          bytes, be->name);
    }
    int64_t *d64 = t->dev_ints;
    t->offsets = d64;
    t->numels = d64 + nn;
    t->block_start = d64 + 2 * nn;
    t->block_tensor = (const int32_t *)(d64 + ints64);
    st = luna_mem_from_host(be, d64, t->host_offsets, nn * sizeof(int64_t));
    if (st == LUNA_OK) st = luna_mem_from_host(be, d64 + nn, t->host_numels, nn * sizeof(int64_t));
    if (st == LUNA_OK)
        st = luna_mem_from_host(be, d64 + 2 * nn, t->host_block_start, (nn + 1) * sizeof(int64_t));
    if (st == LUNA_OK)
        st = luna_mem_from_host(be, d64 + ints64, block_tensor, (size_t)blocks * sizeof(int32_t));
    /* from_host may read the host buffers until the stream reaches the copy. */
    if (st == LUNA_OK) st = luna_backend_synchronize(be);
    free(block_tensor);
    if (st != LUNA_OK) {
        luna_tensor_table_free(t);
        luna_error_prefix("tensor table");
        return st;
    }
    *out = t;
    return LUNA_OK;
oom:
    free(block_tensor);
    luna_tensor_table_free(t);
    return luna_error(LUNA_ERR_OUT_OF_MEMORY, "tensor table: out of host memory");
}

/* A description is usable when it names the tensor and its shape matches its size. */
static luna_status check_desc(const luna_tensor_desc *d, int i) {
    if (!d->name || !d->name[0])
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "tensor_table_create: tensor %d has no name",
                          i);
    if (d->ndim < 0 || d->ndim > LUNA_MAX_DIMS)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "tensor_table_create: %s has %d dimensions",
                          d->name, d->ndim);
    int64_t prod = 1;
    for (int k = 0; k < d->ndim && prod >= 0; k++)
        prod = d->shape[k] >= 0 ? prod * d->shape[k] : -1;
    if (d->ndim > 0 && prod != d->numel)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "tensor_table_create: %s: its shape has %lld elements, not %lld", d->name,
                          (long long)prod, (long long)d->numel);
    return LUNA_OK;
}

luna_status luna_tensor_table_create_named(luna_tensor_table **out, luna_backend *be, int n,
                                           const luna_tensor_desc *tensors) {
    if (!out || n < 0 || (n > 0 && !tensors))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "tensor_table_create: bad arguments");
    *out = NULL;
    size_t nn = (size_t)n;
    for (int i = 0; i < n; i++) {
        LUNA_TRY(check_desc(&tensors[i], i));
        for (int j = 0; j < i; j++)
            if (strcmp(tensors[i].name, tensors[j].name) == 0)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "tensor_table_create: two tensors named %s", tensors[i].name);
    }
    int64_t *offsets = malloc((nn + 1) * sizeof *offsets);
    int64_t *numels = malloc((nn + 1) * sizeof *numels);
    luna_tensor_desc *copy = calloc(nn + 1, sizeof *copy);
    bool ok = offsets && numels && copy;
    for (int i = 0; ok && i < n; i++) {
        offsets[i] = tensors[i].offset;
        numels[i] = tensors[i].numel;
        copy[i] = tensors[i];
        copy[i].name = strdup(tensors[i].name);
        ok = copy[i].name != NULL;
    }
    luna_status st = ok ? luna_tensor_table_create(out, be, n, offsets, numels)
                        : luna_error(LUNA_ERR_OUT_OF_MEMORY, "tensor table: out of host memory");
    free(offsets);
    free(numels);
    if (st != LUNA_OK) {
        for (int i = 0; copy && i < n; i++)
            free((char *)copy[i].name);
        free(copy);
        return st;
    }
    (*out)->host_tensors = copy;
    return LUNA_OK;
}

const char *luna_tensor_table_name(const luna_tensor_table *t, int i) {
    if (!t || !t->host_tensors || i < 0 || i >= t->num_tensors) return "";
    return t->host_tensors[i].name;
}

int luna_tensor_table_find(const luna_tensor_table *t, const char *name) {
    if (!t || !t->host_tensors || !name) return -1;
    for (int i = 0; i < t->num_tensors; i++)
        if (strcmp(t->host_tensors[i].name, name) == 0) return i;
    return -1;
}

luna_tensor luna_tensor_table_view(const luna_tensor_table *t, int i, float *base) {
    int64_t shape[LUNA_MAX_DIMS] = {t->host_numels[i]};
    int ndim = 1;
    if (t->host_tensors && t->host_tensors[i].ndim > 0) {
        ndim = t->host_tensors[i].ndim;
        memcpy(shape, t->host_tensors[i].shape, sizeof shape);
    }
    return luna_tensor_view(base + t->host_offsets[i], t->be->device, LUNA_F32, ndim, shape);
}

int64_t luna_tensor_table_extent(const luna_tensor_table *t) {
    int64_t end = 0;
    for (int i = 0; t && i < t->num_tensors; i++)
        if (t->host_offsets[i] + t->host_numels[i] > end)
            end = t->host_offsets[i] + t->host_numels[i];
    return end;
}
