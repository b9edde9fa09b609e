/* Safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 * length N, N bytes of JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"key": "string", ...}}, then the raw little-endian tensor bytes, offsets
 * relative to the end of the header. Readable by the `safetensors` Python package and PyTorch.
 *
 * Writing is atomic (temporary sibling, fsync, rename: core/file_util.h). Reading maps the file
 * and validates everything before anything is used: the header length, the JSON, every entry's
 * dtype/shape/offsets, that offsets are in bounds, that byte counts match dtype × shape, and that
 * the tensors tile the data area exactly. A problem is reported in one line naming the file and
 * the byte offset (or the tensor).
 */
#ifndef LUNA_SAFETENSORS_H
#define LUNA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

/* A tensor to write, or one found in a file. `dtype_name` is the safetensors spelling ("F32",
 * "BF16", "I32", "I8", and when reading also any other, e.g. "I64", "F16"); `dtype` is its
 * luna_dtype when known (LUNA_F32/LUNA_BF16/LUNA_I32/LUNA_I8), else -1. `data` points at host
 * memory (when reading: into the read-only mapping, not necessarily aligned — copy it with memcpy).
 */
typedef struct {
    const char *name;
    int dtype; /* luna_dtype, or -1 */
    const char *dtype_name;
    int ndim;
    int64_t shape[LUNA_MAX_DIMS];
    const void *data;
    size_t nbytes;
} luna_st_tensor;

typedef struct {
    const char *key;
    const char *value;
} luna_st_metadata;

/* Write `tensors` (dtype must be a luna_dtype; data in host memory) and metadata atomically. */
luna_status luna_safetensors_write(const char *path, const luna_st_tensor *tensors, int num_tensors,
                                   const luna_st_metadata *metadata, int num_metadata);

typedef struct luna_safetensors luna_safetensors;

luna_status luna_safetensors_open(luna_safetensors **out, const char *path);
void luna_safetensors_close(luna_safetensors *st);

const char *luna_safetensors_path(const luna_safetensors *st);
int luna_safetensors_count(const luna_safetensors *st);
/* In file order (by data offset). */
const luna_st_tensor *luna_safetensors_at(const luna_safetensors *st, int index);
const luna_st_tensor *luna_safetensors_find(const luna_safetensors *st, const char *name);
/* Metadata value (NULL if absent). */
const char *luna_safetensors_metadata(const luna_safetensors *st, const char *key);

/* LUNA_ERR_NUMERIC with one line "FILE: tensor 'NAME': non-finite value (nan|inf) at element I
 * ..." when an F32 or BF16 tensor holds a NaN or an infinity; LUNA_OK otherwise (other dtypes
 * always pass). Every loader of weights calls it, so a damaged or diverged checkpoint is refused
 * at load instead of translating to empty lines. */
luna_status luna_safetensors_check_finite(const luna_safetensors *st, const luna_st_tensor *t);

/* Find `name` and check its dtype and shape; LUNA_ERR_MISMATCH (or LUNA_ERR_FORMAT if missing)
 * with one line "FILE: tensor 'NAME': shape [..] (F32), expected [..] (F32)". */
luna_status luna_safetensors_expect(const luna_safetensors *st, const char *name, luna_dtype dtype,
                                    int ndim, const int64_t *shape, const luna_st_tensor **out);

/* "[2,3,4]" into buf. */
const char *luna_shape_string(int ndim, const int64_t *shape, char *buf, size_t size);

#endif
