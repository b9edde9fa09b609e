/* fairseq's MMapIndexedDataset (fairseq/data/indexed_dataset.py), byte-compatible.
 *
 * <prefix>.bin: the token ids of every sentence, back to back, in the index's dtype.
 * <prefix>.idx (all little-endian):
 *   offset 0   9 bytes  magic "MMIDIDX\0\0"
 *   offset 9   <Q       version = 1
 *   offset 17  <B       dtype code (fairseq's _code_to_dtype: 1 uint8, 2 int8, 3 int16, 4 int32,
 *                       5 int64, 6 float (float64; float32 in older fairseq), 7 double, 8 uint16,
 *                       9 uint32, 10 uint64)
 *   offset 18  <Q       N, the number of sentences
 *   offset 26  int32    sizes[N]     (tokens per sentence)
 *              int64    pointers[N]  (byte offset of each sentence in .bin)
 * and nothing else: 26 + 12 N bytes. (Megatron-LM's variant adds a document count and a
 * doc_idx array; fairseq's does not, and neither do we.)
 *
 * The reader maps both files and validates everything up front, so that later accesses cannot
 * go out of bounds: every error names the file and the byte offset of the offending field.
 * The builder chooses the dtype like fairseq (uint16 for vocabularies < 65500, else int32, as
 * the fairseq versions contemporary with Luna do) and writes .bin then .idx atomically.
 */
#ifndef LUNA_DATA_INDEXED_DATASET_H
#define LUNA_DATA_INDEXED_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum {
    LUNA_DTYPE_UINT8 = 1,
    LUNA_DTYPE_INT8 = 2,
    LUNA_DTYPE_INT16 = 3,
    LUNA_DTYPE_INT32 = 4,
    LUNA_DTYPE_INT64 = 5,
    LUNA_DTYPE_FLOAT = 6,
    LUNA_DTYPE_DOUBLE = 7,
    LUNA_DTYPE_UINT16 = 8,
    LUNA_DTYPE_UINT32 = 9,
    LUNA_DTYPE_UINT64 = 10,
} luna_index_dtype;

#define LUNA_MMIDIDX_HEADER_BYTES 26

/* Bytes per element of an integer dtype code; 0 for float or unknown codes. */
size_t luna_index_dtype_size(int code);

/* fairseq's best-fitting dtype for token ids of a vocabulary of `vocab_size` symbols. */
luna_index_dtype luna_index_best_dtype(size_t vocab_size);

/* ---- reader ---------------------------------------------------------------------------------- */

typedef struct luna_indexed_dataset luna_indexed_dataset;

/* Open <prefix>.idx and <prefix>.bin. */
luna_status luna_indexed_dataset_open(luna_indexed_dataset **out, const char *prefix);
void luna_indexed_dataset_free(luna_indexed_dataset *ds);

size_t luna_indexed_dataset_count(const luna_indexed_dataset *ds);
luna_index_dtype luna_indexed_dataset_dtype(const luna_indexed_dataset *ds);
/* (count) tokens per sentence, aligned copy owned by ds. */
const int32_t *luna_indexed_dataset_sizes(const luna_indexed_dataset *ds);
int64_t luna_indexed_dataset_total_tokens(const luna_indexed_dataset *ds);
/* "<prefix>.bin" / "<prefix>.idx", for messages. */
const char *luna_indexed_dataset_bin_path(const luna_indexed_dataset *ds);
const char *luna_indexed_dataset_idx_path(const luna_indexed_dataset *ds);

/* Copy sentence i (sizes[i] tokens) into out, converted to int32. Values that do not fit in
 * int32 (possible only for 32/64-bit dtypes) are stored as -1; luna_indexed_dataset_check_ids()
 * catches them before training. i must be < count. */
void luna_indexed_dataset_get(const luna_indexed_dataset *ds, size_t i, int32_t *out);

/* Verify 0 <= id < limit for every token; the error names the .bin file, the sentence index,
 * the position in the sentence and the byte offset. */
luna_status luna_indexed_dataset_check_ids(const luna_indexed_dataset *ds, int64_t limit,
                                           const char *what);

/* ---- builder --------------------------------------------------------------------------------- */

typedef struct luna_indexed_builder luna_indexed_builder;

/* Start writing <prefix>.bin / <prefix>.idx (integer dtypes only). */
luna_status luna_indexed_builder_create(luna_indexed_builder **out, const char *prefix,
                                        luna_index_dtype dtype);

/* Append one sentence; every id must fit the dtype. */
luna_status luna_indexed_builder_add(luna_indexed_builder *b, const int32_t *tokens, size_t n);

/* Write .bin then .idx into place (each atomically) and free b in every case. */
luna_status luna_indexed_builder_finish(luna_indexed_builder *b);

/* Abandon: remove the temporaries and free (NULL is a no-op). */
void luna_indexed_builder_free(luna_indexed_builder *b);

#endif
