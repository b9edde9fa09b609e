#include "data/indexed_dataset.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"

/* The format is little-endian and we read it in place (the .bin through the mapping). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "luna's data-bin reader assumes a little-endian host");

static const unsigned char MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

size_t luna_index_dtype_size(int code) {
    switch (code) {
    case LUNA_DTYPE_UINT8:
    case LUNA_DTYPE_INT8: return 1;
    case LUNA_DTYPE_INT16:
    case LUNA_DTYPE_UINT16: return 2;
    case LUNA_DTYPE_INT32:
    case LUNA_DTYPE_UINT32: return 4;
    case LUNA_DTYPE_INT64:
    case LUNA_DTYPE_UINT64: return 8;
    default: return 0; /* 6/7 are floating point: not token ids */
    }
}

luna_index_dtype luna_index_best_dtype(size_t vocab_size) {
    /* fairseq: `if vocab_size < 65500: np.uint16 else: np.int32` (newer releases use uint32 for
     * the second case; int32 is what every fairseq version can read). */
    return vocab_size < 65500 ? LUNA_DTYPE_UINT16 : LUNA_DTYPE_INT32;
}

/* ---- reader ---------------------------------------------------------------------------------- */

struct luna_indexed_dataset {
    char *idx_path, *bin_path;
    luna_mapped_file bin;
    luna_index_dtype dtype;
    size_t elem;
    size_t count;
    int32_t *sizes;    /* (count) */
    int64_t *pointers; /* (count) byte offsets into .bin */
    int64_t total_tokens;
};

static uint64_t read_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static char *concat(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (!s) return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

void luna_indexed_dataset_free(luna_indexed_dataset *ds) {
    if (!ds) return;
    luna_mapped_file_close(&ds->bin);
    free(ds->idx_path);
    free(ds->bin_path);
    free(ds->sizes);
    free(ds->pointers);
    free(ds);
}

/* Parse and validate the index (already mapped) against the .bin size. */
static luna_status parse_index(luna_indexed_dataset *ds, const unsigned char *p, size_t n) {
    const char *path = ds->idx_path;
    if (n < sizeof MAGIC)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset %zu: file too short (%zu bytes; the MMIDIDX header "
                          "needs %d) (re-run luna-preprocess or fairseq-preprocess)",
                          path, n, n, LUNA_MMIDIDX_HEADER_BYTES);
    if (memcmp(p, MAGIC, sizeof MAGIC) != 0) {
        bool legacy = memcmp(p, "TNTIDX\0\0", 8) == 0;
        return luna_error(
            LUNA_ERR_FORMAT, "%s: byte offset 0: bad magic, not a fairseq MMIDIDX index (%s)", path,
            legacy ? "this is fairseq's older 'lazy/cached' format; re-run fairseq-preprocess "
                     "with --dataset-impl mmap"
                   : "re-run luna-preprocess or fairseq-preprocess");
    }
    if (n < LUNA_MMIDIDX_HEADER_BYTES)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset %zu: file too short (%zu bytes; the MMIDIDX header "
                          "needs %d) (re-run luna-preprocess)",
                          path, n, n, LUNA_MMIDIDX_HEADER_BYTES);
    uint64_t version = read_u64(p + 9);
    if (version != 1)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset 9: unsupported version %" PRIu64 " (only version 1 "
                          "exists in fairseq)",
                          path, version);
    int code = p[17];
    ds->elem = luna_index_dtype_size(code);
    if (ds->elem == 0)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset 17: dtype code %d is not an integer type "
                          "(token ids need codes 1-5 or 8-10)",
                          path, code);
    ds->dtype = (luna_index_dtype)code;
    uint64_t count = read_u64(p + 18);
    uint64_t max_count = (UINT64_MAX - LUNA_MMIDIDX_HEADER_BYTES) / 12;
    uint64_t expect = count <= max_count ? LUNA_MMIDIDX_HEADER_BYTES + 12 * count : UINT64_MAX;
    if ((uint64_t)n < expect)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset %zu: truncated: %" PRIu64 " sentences need %" PRIu64
                          " bytes but the file ends after %zu (re-run luna-preprocess)",
                          path, n, count, expect, n);
    if ((uint64_t)n > expect)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset %" PRIu64 ": %" PRIu64 " unexpected bytes after the "
                          "index of %" PRIu64
                          " sentences (the file is corrupt or not a fairseq MMIDIDX)",
                          path, expect, (uint64_t)n - expect, count);
    ds->count = (size_t)count;
    ds->sizes = malloc((ds->count ? ds->count : 1) * sizeof *ds->sizes);
    ds->pointers = malloc((ds->count ? ds->count : 1) * sizeof *ds->pointers);
    if (!ds->sizes || !ds->pointers)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu sentences", path,
                          ds->count);
    /* Copies: the arrays sit at offset 26 in the file, which is not aligned for int32/int64. */
    const size_t sizes_off = LUNA_MMIDIDX_HEADER_BYTES, ptr_off = sizes_off + 4 * ds->count;
    memcpy(ds->sizes, p + sizes_off, 4 * ds->count);
    memcpy(ds->pointers, p + ptr_off, 8 * ds->count);
    const uint64_t bin_size = ds->bin.size;
    uint64_t running = 0;
    ds->total_tokens = 0;
    for (size_t i = 0; i < ds->count; i++) {
        if (ds->sizes[i] < 0)
            return luna_error(LUNA_ERR_FORMAT,
                              "%s: byte offset %zu: sentence %zu has negative size %" PRId32
                              " (the index is corrupt)",
                              path, sizes_off + 4 * i, i, ds->sizes[i]);
        uint64_t bytes = (uint64_t)ds->sizes[i] * ds->elem;
        int64_t ptr = ds->pointers[i];
        if (ptr < 0 || (uint64_t)ptr > bin_size || bytes > bin_size - (uint64_t)ptr)
            return luna_error(LUNA_ERR_FORMAT,
                              "%s: byte offset %zu: sentence %zu (pointer %" PRId64 ", %" PRIu64
                              " bytes) points past the end of %s (%" PRIu64
                              " bytes) (the .idx and .bin do "
                              "not belong together or the .bin is truncated)",
                              path, ptr_off + 8 * i, i, ptr, bytes, ds->bin_path, bin_size);
        if ((uint64_t)ptr != running)
            return luna_error(LUNA_ERR_FORMAT,
                              "%s: byte offset %zu: sentence %zu has pointer %" PRId64 " but the "
                              "sizes before it add up to byte %" PRIu64
                              " (sizes and pointers do not add up; "
                              "the index is corrupt)",
                              path, ptr_off + 8 * i, i, ptr, running);
        running += bytes;
        ds->total_tokens += ds->sizes[i];
    }
    if (running != bin_size)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: byte offset %" PRIu64 ": the index accounts for %" PRIu64 " bytes "
                          "but the file has %" PRIu64 " (the .bin and %s do not belong together)",
                          ds->bin_path, running, running, bin_size, path);
    return LUNA_OK;
}

luna_status luna_indexed_dataset_open(luna_indexed_dataset **out, const char *prefix) {
    *out = NULL;
    luna_indexed_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", prefix);
    ds->idx_path = concat(prefix, ".idx");
    ds->bin_path = concat(prefix, ".bin");
    luna_status st = ds->idx_path && ds->bin_path
                         ? LUNA_OK
                         : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_mapped_file idx = {NULL, 0};
    if (st == LUNA_OK) st = luna_mapped_file_open(&idx, ds->idx_path);
    if (st == LUNA_OK) st = luna_mapped_file_open(&ds->bin, ds->bin_path);
    if (st == LUNA_OK) st = parse_index(ds, idx.data, idx.size);
    luna_mapped_file_close(&idx); /* everything needed was copied */
    if (st != LUNA_OK) {
        luna_indexed_dataset_free(ds);
        return st;
    }
    *out = ds;
    return LUNA_OK;
}

size_t luna_indexed_dataset_count(const luna_indexed_dataset *ds) { return ds->count; }
luna_index_dtype luna_indexed_dataset_dtype(const luna_indexed_dataset *ds) { return ds->dtype; }
const int32_t *luna_indexed_dataset_sizes(const luna_indexed_dataset *ds) { return ds->sizes; }
int64_t luna_indexed_dataset_total_tokens(const luna_indexed_dataset *ds) {
    return ds->total_tokens;
}
const char *luna_indexed_dataset_bin_path(const luna_indexed_dataset *ds) { return ds->bin_path; }
const char *luna_indexed_dataset_idx_path(const luna_indexed_dataset *ds) { return ds->idx_path; }

/* Convert n elements of `dtype` at p to int32 (-1 for values outside int32). */
#define CONVERT(T, LOWER_OK, UPPER_OK)                                                             \
    do {                                                                                           \
        for (size_t k = 0; k < n; k++) {                                                           \
            T v;                                                                                   \
            memcpy(&v, p + k * sizeof(T), sizeof(T));                                              \
            out[k] = (LOWER_OK) && (UPPER_OK) ? (int32_t)v : -1;                                   \
        }                                                                                          \
    } while (0)

static void convert(luna_index_dtype dtype, const unsigned char *p, size_t n, int32_t *out) {
    switch (dtype) {
    case LUNA_DTYPE_UINT8: CONVERT(uint8_t, 1, 1); break;
    case LUNA_DTYPE_INT8: CONVERT(int8_t, 1, 1); break;
    case LUNA_DTYPE_INT16: CONVERT(int16_t, 1, 1); break;
    case LUNA_DTYPE_UINT16: CONVERT(uint16_t, 1, 1); break;
    case LUNA_DTYPE_INT32: CONVERT(int32_t, 1, 1); break;
    case LUNA_DTYPE_UINT32: CONVERT(uint32_t, 1, v <= INT32_MAX); break;
    case LUNA_DTYPE_INT64: CONVERT(int64_t, v >= INT32_MIN, v <= INT32_MAX); break;
    case LUNA_DTYPE_UINT64: CONVERT(uint64_t, 1, v <= INT32_MAX); break;
    default: memset(out, 0xff, n * sizeof *out); break; /* rejected at open */
    }
}

void luna_indexed_dataset_get(const luna_indexed_dataset *ds, size_t i, int32_t *out) {
    convert(ds->dtype, ds->bin.data + ds->pointers[i], (size_t)ds->sizes[i], out);
}

luna_status luna_indexed_dataset_check_ids(const luna_indexed_dataset *ds, int64_t limit,
                                           const char *what) {
    int32_t *buf = NULL;
    size_t cap = 0;
    luna_status st = LUNA_OK;
    for (size_t i = 0; i < ds->count && st == LUNA_OK; i++) {
        size_t n = (size_t)ds->sizes[i];
        if (n > cap) {
            free(buf);
            cap = n * 2;
            buf = malloc(cap * sizeof *buf);
            if (!buf) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", ds->bin_path);
        }
        luna_indexed_dataset_get(ds, i, buf);
        for (size_t k = 0; k < n; k++) {
            if (buf[k] < 0 || buf[k] >= limit) {
                /* Re-read the raw value for the message (buf holds -1 for values beyond int32). */
                const unsigned char *raw = ds->bin.data + ds->pointers[i] + k * ds->elem;
                int64_t v = buf[k];
                if (ds->dtype == LUNA_DTYPE_INT64 || ds->dtype == LUNA_DTYPE_UINT64)
                    memcpy(&v, raw, 8);
                if (ds->dtype == LUNA_DTYPE_UINT32) {
                    uint32_t u;
                    memcpy(&u, raw, 4);
                    v = u;
                }
                st = luna_error(
                    LUNA_ERR_MISMATCH,
                    "%s: byte offset %" PRId64 ": sentence %zu, token %zu: id %" PRId64
                    " is outside %s (%" PRId64 " symbols) (the data and the dictionary do not "
                    "belong together; re-run luna-preprocess)",
                    ds->bin_path, ds->pointers[i] + (int64_t)(k * ds->elem), i, k, v, what, limit);
                break;
            }
        }
    }
    free(buf);
    return st;
}

/* ---- builder --------------------------------------------------------------------------------- */

struct luna_indexed_builder {
    luna_atomic_file *bin;
    char *idx_path;
    luna_index_dtype dtype;
    size_t elem;
    int32_t *sizes;
    size_t count, capacity;
    unsigned char *scratch; /* one sentence converted to the dtype */
    size_t scratch_capacity;
};

void luna_indexed_builder_free(luna_indexed_builder *b) {
    if (!b) return;
    luna_atomic_file_free(b->bin);
    free(b->idx_path);
    free(b->sizes);
    free(b->scratch);
    free(b);
}

luna_status luna_indexed_builder_create(luna_indexed_builder **out, const char *prefix,
                                        luna_index_dtype dtype) {
    *out = NULL;
    if (luna_index_dtype_size(dtype) == 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: dtype code %d is not an integer type",
                          prefix, (int)dtype);
    luna_indexed_builder *b = calloc(1, sizeof *b);
    char *bin_path = concat(prefix, ".bin");
    if (b) b->idx_path = concat(prefix, ".idx");
    luna_status st = b && bin_path && b->idx_path
                         ? LUNA_OK
                         : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == LUNA_OK) {
        b->dtype = dtype;
        b->elem = luna_index_dtype_size(dtype);
        st = luna_atomic_file_create(&b->bin, bin_path);
    }
    free(bin_path);
    if (st != LUNA_OK) {
        luna_indexed_builder_free(b);
        return st;
    }
    *out = b;
    return LUNA_OK;
}

static bool fits(luna_index_dtype dtype, int32_t v) {
    switch (dtype) {
    case LUNA_DTYPE_UINT8: return v >= 0 && v <= UINT8_MAX;
    case LUNA_DTYPE_INT8: return v >= INT8_MIN && v <= INT8_MAX;
    case LUNA_DTYPE_INT16: return v >= INT16_MIN && v <= INT16_MAX;
    case LUNA_DTYPE_UINT16: return v >= 0 && v <= UINT16_MAX;
    case LUNA_DTYPE_UINT32:
    case LUNA_DTYPE_UINT64: return v >= 0;
    default: return true;
    }
}

luna_status luna_indexed_builder_add(luna_indexed_builder *b, const int32_t *tokens, size_t n) {
    const char *path = luna_atomic_file_path(b->bin);
    if (n > INT32_MAX)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: sentence of %zu tokens is too long", path,
                          n);
    if (b->count == b->capacity) {
        size_t cap = b->capacity ? b->capacity * 2 : 1024;
        int32_t *sizes = realloc(b->sizes, cap * sizeof *sizes);
        if (!sizes) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        b->sizes = sizes;
        b->capacity = cap;
    }
    if (n * b->elem > b->scratch_capacity) {
        unsigned char *s = realloc(b->scratch, n * b->elem * 2);
        if (!s) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        b->scratch = s;
        b->scratch_capacity = n * b->elem * 2;
    }
    for (size_t k = 0; k < n; k++) {
        int32_t v = tokens[k];
        if (!fits(b->dtype, v))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "%s: sentence %zu: id %" PRId32 " does not fit dtype code %d", path,
                              b->count, v, (int)b->dtype);
        unsigned char *dst = b->scratch + k * b->elem;
        switch (b->elem) { /* little-endian host: the low bytes of a widened value */
        case 1: {
            uint8_t x = (uint8_t)v;
            memcpy(dst, &x, 1);
            break;
        }
        case 2: {
            uint16_t x = (uint16_t)v;
            memcpy(dst, &x, 2);
            break;
        }
        case 4: memcpy(dst, &v, 4); break;
        default: {
            int64_t x = v;
            memcpy(dst, &x, 8);
            break;
        }
        }
    }
    LUNA_TRY(luna_atomic_file_write(b->bin, b->scratch, n * b->elem));
    b->sizes[b->count++] = (int32_t)n;
    return LUNA_OK;
}

luna_status luna_indexed_builder_finish(luna_indexed_builder *b) {
    size_t bytes = LUNA_MMIDIDX_HEADER_BYTES + 12 * b->count;
    unsigned char *idx = malloc(bytes);
    luna_atomic_file *idx_file = NULL;
    luna_status st =
        idx ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", b->idx_path);
    if (st == LUNA_OK) {
        uint64_t version = 1, count = b->count;
        memcpy(idx, MAGIC, 9);
        memcpy(idx + 9, &version, 8);
        idx[17] = (unsigned char)b->dtype;
        memcpy(idx + 18, &count, 8);
        if (b->count) memcpy(idx + LUNA_MMIDIDX_HEADER_BYTES, b->sizes, 4 * b->count);
        int64_t address = 0; /* _get_pointers: running byte offset */
        unsigned char *ptrs = idx + LUNA_MMIDIDX_HEADER_BYTES + 4 * b->count;
        for (size_t i = 0; i < b->count; i++) {
            memcpy(ptrs + 8 * i, &address, 8);
            address += (int64_t)b->sizes[i] * (int64_t)b->elem;
        }
        st = luna_atomic_file_create(&idx_file, b->idx_path);
    }
    if (st == LUNA_OK) st = luna_atomic_file_write(idx_file, idx, bytes);
    /* Both temporaries are complete before either is renamed, so the window in which a reader
     * could see a new .bin with an old .idx is two renames wide (and the reader detects it). */
    if (st == LUNA_OK) {
        st = luna_atomic_file_commit(b->bin);
        b->bin = NULL;
    }
    if (st == LUNA_OK) {
        st = luna_atomic_file_commit(idx_file);
        idx_file = NULL;
    }
    luna_atomic_file_free(idx_file);
    free(idx);
    luna_indexed_builder_free(b);
    return st;
}
