/* A small, strict JSON reader (RFC 8259) and writer, for checkpoint headers (safetensors),
 * model configurations and anything else that stores JSON.
 *
 * Reading builds a tree of luna_json values. Numbers keep both a double and, when the text is an
 * integer that fits, its exact int64/uint64 value (safetensors byte offsets must not go through a
 * double). Strings are decoded to UTF-8 (escapes, surrogate pairs) and NUL-terminated; a string
 * that contains U+0000 is rejected. Object keys keep their order; duplicate keys are an error.
 * Errors are LUNA_ERR_FORMAT with the byte offset of the problem.
 *
 * Writing appends to a growing buffer with begin/end calls; commas and escaping are handled. */
#ifndef LUNA_JSON_H
#define LUNA_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum {
    LUNA_JSON_NULL = 0,
    LUNA_JSON_BOOL,
    LUNA_JSON_NUMBER,
    LUNA_JSON_STRING,
    LUNA_JSON_ARRAY,
    LUNA_JSON_OBJECT,
} luna_json_type;

typedef struct luna_json luna_json;
struct luna_json {
    luna_json_type type;
    bool boolean;
    double number;
    bool is_int;      /* the number is written as an integer that fits int64 or uint64 */
    bool is_negative; /* with is_int: the value is int_value (< 0), else uint_value */
    int64_t int_value;
    uint64_t uint_value;
    char *string;     /* STRING: decoded UTF-8, NUL-terminated */
    size_t length;    /* STRING: bytes; ARRAY/OBJECT: number of items */
    luna_json *items; /* ARRAY elements / OBJECT values */
    char **keys;      /* OBJECT keys, parallel to items */
    size_t offset;    /* byte offset of the value in the parsed text */
};

/* Parse text[0..len). On error returns LUNA_ERR_FORMAT ("JSON: byte N: ...") and, if
 * error_offset is non-NULL, stores the byte offset there. */
luna_status luna_json_parse(luna_json **out, const char *text, size_t len, size_t *error_offset);
void luna_json_free(luna_json *value);

/* Object member by key (NULL if absent or `object` is not an object). */
const luna_json *luna_json_get(const luna_json *object, const char *key);
const char *luna_json_type_name(luna_json_type type);

/* ---- writer ---------------------------------------------------------------------------------- */

#define LUNA_JSON_MAX_DEPTH 64

typedef struct {
    char *data;
    size_t length, capacity;
    bool failed; /* out of memory or misuse; reported by luna_json_writer_finish */
    int depth;
    bool first[LUNA_JSON_MAX_DEPTH]; /* no element written yet at this depth */
    bool after_key;
} luna_json_writer;

void luna_json_writer_init(luna_json_writer *w);
void luna_json_begin_object(luna_json_writer *w);
void luna_json_end_object(luna_json_writer *w);
void luna_json_begin_array(luna_json_writer *w);
void luna_json_end_array(luna_json_writer *w);
void luna_json_key(luna_json_writer *w, const char *key);
void luna_json_string(luna_json_writer *w, const char *s);
void luna_json_int(luna_json_writer *w, int64_t v);
void luna_json_uint(luna_json_writer *w, uint64_t v);
/* Shortest text that reads back as the same double; non-finite values write null. */
void luna_json_double(luna_json_writer *w, double v);
void luna_json_bool(luna_json_writer *w, bool v);
void luna_json_null(luna_json_writer *w);
/* Hand over the NUL-terminated text (malloc'ed; caller frees) and reset the writer. */
luna_status luna_json_writer_finish(luna_json_writer *w, char **text, size_t *length);
/* Discard (after an error). */
void luna_json_writer_free(luna_json_writer *w);

#endif
