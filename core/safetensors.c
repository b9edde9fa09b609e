#include "core/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"
#include "core/json.h"

/* The format is little-endian; so is every machine this toolkit targets. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

#define MAX_HEADER_BYTES ((uint64_t)100 << 20) /* the reference implementation's limit */

struct luna_safetensors {
    char *path;
    luna_mapped_file map;
    luna_json *header;
    int count;
    luna_st_tensor *tensors; /* sorted by data offset */
    const luna_json *metadata;
};

static const struct {
    const char *name;
    size_t size;
    int dtype;
} dtypes[] = {
    {"F32", 4, LUNA_F32}, {"BF16", 2, LUNA_BF16}, {"I32", 4, LUNA_I32}, {"F64", 8, -1},
    {"F16", 2, -1},       {"I64", 8, -1},         {"U64", 8, -1},       {"U32", 4, -1},
    {"I16", 2, -1},       {"U16", 2, -1},         {"I8", 1, LUNA_I8},   {"U8", 1, -1},
    {"BOOL", 1, -1},      {"F8_E4M3", 1, -1},     {"F8_E5M2", 1, -1},
};

const char *luna_shape_string(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used +=
            (size_t)snprintf(buf + used, size - used, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

/* ---- writing --------------------------------------------------------------------------------- */

luna_status luna_safetensors_write(const char *path, const luna_st_tensor *tensors, int num_tensors,
                                   const luna_st_metadata *metadata, int num_metadata) {
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    if (num_metadata > 0) {
        luna_json_key(&w, "__metadata__");
        luna_json_begin_object(&w);
        for (int i = 0; i < num_metadata; i++) {
            luna_json_key(&w, metadata[i].key);
            luna_json_string(&w, metadata[i].value);
        }
        luna_json_end_object(&w);
    }
    uint64_t offset = 0;
    for (int i = 0; i < num_tensors; i++) {
        const luna_st_tensor *t = &tensors[i];
        if (t->dtype != LUNA_F32 && t->dtype != LUNA_BF16 && t->dtype != LUNA_I32 &&
            t->dtype != LUNA_I8) {
            luna_json_writer_free(&w);
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: tensor '%s': cannot write dtype %d",
                              path, t->name, t->dtype);
        }
        uint64_t bytes = luna_dtype_size((luna_dtype)t->dtype);
        for (int k = 0; k < t->ndim; k++)
            bytes *= (uint64_t)t->shape[k];
        luna_json_key(&w, t->name);
        luna_json_begin_object(&w);
        luna_json_key(&w, "dtype");
        luna_json_string(&w, luna_dtype_name((luna_dtype)t->dtype));
        luna_json_key(&w, "shape");
        luna_json_begin_array(&w);
        for (int k = 0; k < t->ndim; k++)
            luna_json_int(&w, t->shape[k]);
        luna_json_end_array(&w);
        luna_json_key(&w, "data_offsets");
        luna_json_begin_array(&w);
        luna_json_uint(&w, offset);
        luna_json_uint(&w, offset + bytes);
        luna_json_end_array(&w);
        luna_json_end_object(&w);
        offset += bytes;
    }
    luna_json_end_object(&w);
    char *header;
    size_t header_len;
    LUNA_TRY(luna_json_writer_finish(&w, &header, &header_len));
    /* Pad with spaces to a multiple of 8 so the data area is aligned (as the reference writer). */
    size_t padded = (header_len + 7) & ~(size_t)7;
    char *hdr = realloc(header, padded + 1);
    if (!hdr) {
        free(header);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", path);
    }
    memset(hdr + header_len, ' ', padded - header_len);
    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++)
        len_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));

    luna_atomic_file *f;
    luna_status st = luna_atomic_file_create(&f, path);
    if (st != LUNA_OK) {
        free(hdr);
        return st;
    }
    st = luna_atomic_file_write(f, len_bytes, 8);
    if (st == LUNA_OK) st = luna_atomic_file_write(f, hdr, padded);
    for (int i = 0; i < num_tensors && st == LUNA_OK; i++) {
        const luna_st_tensor *t = &tensors[i];
        size_t bytes = luna_dtype_size((luna_dtype)t->dtype);
        for (int k = 0; k < t->ndim; k++)
            bytes *= (size_t)t->shape[k];
        if (bytes) st = luna_atomic_file_write(f, t->data, bytes);
    }
    free(hdr);
    if (st != LUNA_OK) {
        luna_atomic_file_free(f);
        return st;
    }
    return luna_atomic_file_commit(f);
}

/* ---- reading --------------------------------------------------------------------------------- */

static luna_status bad(const luna_safetensors *st, uint64_t offset, const char *what,
                       const char *name) {
    if (name)
        return luna_error(LUNA_ERR_FORMAT, "%s: byte %llu: tensor '%s': %s", st->path,
                          (unsigned long long)offset, name, what);
    return luna_error(LUNA_ERR_FORMAT, "%s: byte %llu: %s", st->path, (unsigned long long)offset,
                      what);
}

static int compare_offset(const void *a, const void *b) {
    const luna_st_tensor *x = a, *y = b;
    const char *px = x->data, *py = y->data;
    return px < py ? -1 : px > py ? 1 : 0;
}

static luna_status parse_entry(luna_safetensors *st, const char *name, const luna_json *e,
                               uint64_t header_end, luna_st_tensor *t, uint64_t *begin_out) {
    uint64_t at = 8 + e->offset; /* byte offset of this entry in the file */
    if (e->type != LUNA_JSON_OBJECT) return bad(st, at, "entry is not an object", name);
    const luna_json *dtype = luna_json_get(e, "dtype");
    const luna_json *shape = luna_json_get(e, "shape");
    const luna_json *offs = luna_json_get(e, "data_offsets");
    if (!dtype || dtype->type != LUNA_JSON_STRING) return bad(st, at, "missing dtype", name);
    if (!shape || shape->type != LUNA_JSON_ARRAY) return bad(st, at, "missing shape", name);
    if (!offs || offs->type != LUNA_JSON_ARRAY || offs->length != 2)
        return bad(st, at, "missing data_offsets [begin, end]", name);
    size_t elem = 0;
    t->dtype = -1;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (strcmp(dtype->string, dtypes[i].name) == 0) {
            elem = dtypes[i].size;
            t->dtype = dtypes[i].dtype;
            t->dtype_name = dtypes[i].name;
        }
    }
    if (!elem) return bad(st, 8 + dtype->offset, "unknown dtype", name);
    if (shape->length > LUNA_MAX_DIMS)
        return bad(st, 8 + shape->offset, "too many dimensions", name);
    uint64_t numel = 1;
    t->ndim = (int)shape->length;
    for (size_t k = 0; k < shape->length; k++) {
        const luna_json *s = &shape->items[k];
        if (s->type != LUNA_JSON_NUMBER || !s->is_int || s->is_negative ||
            s->uint_value > ((uint64_t)1 << 48))
            return bad(st, 8 + s->offset, "invalid dimension", name);
        t->shape[k] = (int64_t)s->uint_value;
        /* Checked before multiplying: [2^16, 2^48] must not wrap to 0 elements. */
        if (s->uint_value != 0 && numel > ((uint64_t)1 << 48) / s->uint_value)
            return bad(st, 8 + s->offset, "tensor too large", name);
        numel *= s->uint_value;
    }
    const luna_json *b = &offs->items[0], *en = &offs->items[1];
    if (b->type != LUNA_JSON_NUMBER || !b->is_int || b->is_negative ||
        en->type != LUNA_JSON_NUMBER || !en->is_int || en->is_negative ||
        en->uint_value < b->uint_value)
        return bad(st, 8 + offs->offset, "invalid data_offsets", name);
    uint64_t begin = b->uint_value, end = en->uint_value;
    if (end - begin != numel * elem)
        return bad(st, 8 + offs->offset, "data_offsets do not match dtype and shape", name);
    if (end > st->map.size - header_end) {
        char what[160];
        snprintf(what, sizeof what,
                 "data ends at byte %llu but the file has %zu bytes (truncated file?)",
                 (unsigned long long)(header_end + end), st->map.size);
        return bad(st, 8 + offs->offset, what, name);
    }
    t->name = name;
    t->data = st->map.data + header_end + begin;
    t->nbytes = (size_t)(end - begin);
    *begin_out = begin;
    return LUNA_OK;
}

luna_status luna_safetensors_open(luna_safetensors **out, const char *path) {
    *out = NULL;
    luna_safetensors *st = calloc(1, sizeof *st);
    if (!st) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    st->path = strdup(path);
    if (!st->path) {
        free(st);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    luna_status s = luna_mapped_file_open(&st->map, path);
    if (s != LUNA_OK) {
        free(st->path);
        free(st);
        return s;
    }
    if (st->map.size < 8) {
        s = bad(st, st->map.size, "file too short for a safetensors header (truncated?)", NULL);
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)st->map.data[i] << (8 * i);
    if (n < 2 || n > MAX_HEADER_BYTES) {
        s = bad(st, 0, "implausible header length (not a safetensors file?)", NULL);
        goto fail;
    }
    if (n > st->map.size - 8) {
        char what[128];
        snprintf(what, sizeof what,
                 "header of %llu bytes runs past the end of the file (truncated?)",
                 (unsigned long long)n);
        s = bad(st, st->map.size, what, NULL);
        goto fail;
    }
    size_t json_error;
    s = luna_json_parse(&st->header, (const char *)st->map.data + 8, (size_t)n, &json_error);
    if (s != LUNA_OK) {
        char what[256];
        snprintf(what, sizeof what, "corrupt header: %s", luna_error_message());
        s = bad(st, 8 + json_error, what, NULL);
        goto fail;
    }
    if (st->header->type != LUNA_JSON_OBJECT) {
        s = bad(st, 8, "header is not a JSON object", NULL);
        goto fail;
    }
    uint64_t header_end = 8 + n;
    st->tensors = calloc(st->header->length ? st->header->length : 1, sizeof *st->tensors);
    uint64_t *begins = calloc(st->header->length ? st->header->length : 1, sizeof *begins);
    if (!st->tensors || !begins) {
        free(begins);
        s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    for (size_t i = 0; i < st->header->length; i++) {
        const char *key = st->header->keys[i];
        const luna_json *e = &st->header->items[i];
        if (strcmp(key, "__metadata__") == 0) {
            if (e->type != LUNA_JSON_OBJECT) {
                s = bad(st, 8 + e->offset, "__metadata__ is not an object", NULL);
                break;
            }
            for (size_t k = 0; k < e->length; k++) {
                if (e->items[k].type != LUNA_JSON_STRING) {
                    s = bad(st, 8 + e->items[k].offset, "__metadata__ value is not a string", NULL);
                    break;
                }
            }
            if (s != LUNA_OK) break;
            st->metadata = e;
            continue;
        }
        s = parse_entry(st, key, e, header_end, &st->tensors[st->count], &begins[st->count]);
        if (s != LUNA_OK) break;
        st->count++;
    }
    if (s == LUNA_OK) {
        /* The tensors must tile the data area: sorted by offset, each begins where the previous
         * one ended, the last ends at the end of the file. */
        qsort(st->tensors, (size_t)st->count, sizeof *st->tensors, compare_offset);
        uint64_t expect = 0;
        for (int i = 0; i < st->count && s == LUNA_OK; i++) {
            uint64_t begin =
                (uint64_t)((const uint8_t *)st->tensors[i].data - st->map.data) - header_end;
            if (begin != expect)
                s = bad(st, header_end + begin,
                        begin < expect ? "overlaps the previous tensor" : "gap before this tensor",
                        st->tensors[i].name);
            expect = begin + st->tensors[i].nbytes;
        }
        if (s == LUNA_OK && header_end + expect != st->map.size)
            s = bad(st, header_end + expect, "trailing bytes after the last tensor", NULL);
    }
    free(begins);
    if (s != LUNA_OK) goto fail;
    *out = st;
    return LUNA_OK;
fail:
    luna_safetensors_close(st);
    return s;
}

void luna_safetensors_close(luna_safetensors *st) {
    if (!st) return;
    luna_json_free(st->header);
    free(st->tensors);
    luna_mapped_file_close(&st->map);
    free(st->path);
    free(st);
}

const char *luna_safetensors_path(const luna_safetensors *st) { return st->path; }
int luna_safetensors_count(const luna_safetensors *st) { return st->count; }

const luna_st_tensor *luna_safetensors_at(const luna_safetensors *st, int index) {
    return index >= 0 && index < st->count ? &st->tensors[index] : NULL;
}

const luna_st_tensor *luna_safetensors_find(const luna_safetensors *st, const char *name) {
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

const char *luna_safetensors_metadata(const luna_safetensors *st, const char *key) {
    const luna_json *v = luna_json_get(st->metadata, key);
    return v ? v->string : NULL;
}

/* Index of the first element whose exponent bits are all ones (NaN or +-Inf), or n. The data may
 * be unaligned (foreign files), hence memcpy of a constant size (a plain load); blocks of 1024
 * with an OR-reduction keep the common all-finite case vectorised and memory-bound. */
#define FIRST_NONFINITE(NAME, TYPE, MASK)                                                          \
    static size_t NAME(const uint8_t *data, size_t n) {                                          \
        for (size_t start = 0; start < n; start += 1024) {                                        \
            size_t end = n - start < 1024 ? n : start + 1024;                                     \
            TYPE any = 0;                                                                         \
            for (size_t i = start; i < end; i++) {                                                \
                TYPE bits;                                                                        \
                memcpy(&bits, data + i * sizeof bits, sizeof bits);                               \
                any |= (TYPE)((bits & MASK) == MASK);                                             \
            }                                                                                     \
            if (!any) continue;                                                                   \
            for (size_t i = start; i < end; i++) {                                                \
                TYPE bits;                                                                        \
                memcpy(&bits, data + i * sizeof bits, sizeof bits);                               \
                if ((bits & MASK) == MASK) return i;                                              \
            }                                                                                     \
        }                                                                                         \
        return n;                                                                                 \
    }
FIRST_NONFINITE(first_nonfinite_f32, uint32_t, 0x7f800000u)
FIRST_NONFINITE(first_nonfinite_bf16, uint16_t, (uint16_t)0x7f80u)

luna_status luna_safetensors_check_finite(const luna_safetensors *st, const luna_st_tensor *t) {
    if (t->dtype != LUNA_F32 && t->dtype != LUNA_BF16) return LUNA_OK;
    size_t elem = luna_dtype_size((luna_dtype)t->dtype), n = t->nbytes / elem;
    size_t i = elem == 4 ? first_nonfinite_f32(t->data, n) : first_nonfinite_bf16(t->data, n);
    if (i == n) return LUNA_OK;
    uint32_t bits = 0;
    memcpy(&bits, (const uint8_t *)t->data + i * elem, elem);
    bool nan = elem == 4 ? (bits & 0x007fffffu) != 0 : (bits & 0x7fu) != 0;
    return luna_error(LUNA_ERR_NUMERIC,
                      "%s: tensor '%s': non-finite value (%s) at element %zu (the checkpoint is "
                      "damaged or was saved after training diverged; use an earlier one)",
                      st->path, t->name, nan ? "nan" : "inf", i);
}

luna_status luna_safetensors_expect(const luna_safetensors *st, const char *name, luna_dtype dtype,
                                    int ndim, const int64_t *shape, const luna_st_tensor **out) {
    const luna_st_tensor *t = luna_safetensors_find(st, name);
    if (!t) return luna_error(LUNA_ERR_FORMAT, "%s: tensor '%s' is missing", st->path, name);
    bool same = t->dtype == (int)dtype && t->ndim == ndim;
    for (int k = 0; same && k < ndim; k++)
        same = t->shape[k] == shape[k];
    if (!same) {
        char got[96], want[96];
        return luna_error(LUNA_ERR_MISMATCH, "%s: tensor '%s': shape %s (%s), expected %s (%s)",
                          st->path, name, luna_shape_string(t->ndim, t->shape, got, sizeof got),
                          t->dtype_name, luna_shape_string(ndim, shape, want, sizeof want),
                          luna_dtype_name(dtype));
    }
    if (out) *out = t;
    return LUNA_OK;
}
