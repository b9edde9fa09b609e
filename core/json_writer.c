/* The JSON writer of core/json.h (the reader is core/json.c). */
#include "core/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ---------------------------------------------------------------------------------- */

void luna_json_writer_init(luna_json_writer *w) {
    memset(w, 0, sizeof *w);
    w->first[0] = true;
}

static void append(luna_json_writer *w, const char *s, size_t n) {
    if (w->failed) return;
    if (w->length + n + 1 > w->capacity) {
        size_t cap = w->capacity ? w->capacity : 256;
        while (cap < w->length + n + 1)
            cap *= 2;
        char *data = realloc(w->data, cap);
        if (!data) {
            w->failed = true;
            return;
        }
        w->data = data;
        w->capacity = cap;
    }
    memcpy(w->data + w->length, s, n);
    w->length += n;
    w->data[w->length] = '\0';
}

static void append_str(luna_json_writer *w, const char *s) { append(w, s, strlen(s)); }

/* Separator before a value (or key) at the current depth. */
static void before_value(luna_json_writer *w) {
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (!w->first[w->depth]) append(w, ",", 1);
    w->first[w->depth] = false;
}

static void open_container(luna_json_writer *w, const char *bracket) {
    before_value(w);
    append_str(w, bracket);
    if (w->depth + 1 >= LUNA_JSON_MAX_DEPTH) {
        w->failed = true;
        return;
    }
    w->first[++w->depth] = true;
}

static void close_container(luna_json_writer *w, const char *bracket) {
    if (w->depth == 0 || w->after_key) {
        w->failed = true;
        return;
    }
    w->depth--;
    append_str(w, bracket);
}

void luna_json_begin_object(luna_json_writer *w) { open_container(w, "{"); }
void luna_json_end_object(luna_json_writer *w) { close_container(w, "}"); }
void luna_json_begin_array(luna_json_writer *w) { open_container(w, "["); }
void luna_json_end_array(luna_json_writer *w) { close_container(w, "]"); }

static void write_escaped(luna_json_writer *w, const char *s) {
    append(w, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"': append(w, "\\\"", 2); break;
        case '\\': append(w, "\\\\", 2); break;
        case '\n': append(w, "\\n", 2); break;
        case '\r': append(w, "\\r", 2); break;
        case '\t': append(w, "\\t", 2); break;
        default:
            if (*c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *c);
                append_str(w, esc);
            } else {
                append(w, (const char *)c, 1);
            }
        }
    }
    append(w, "\"", 1);
}

void luna_json_key(luna_json_writer *w, const char *key) {
    before_value(w);
    write_escaped(w, key);
    append(w, ":", 1);
    w->after_key = true;
}

void luna_json_string(luna_json_writer *w, const char *s) {
    before_value(w);
    write_escaped(w, s);
}

void luna_json_int(luna_json_writer *w, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    before_value(w);
    append_str(w, buf);
}

void luna_json_uint(luna_json_writer *w, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    before_value(w);
    append_str(w, buf);
}

void luna_json_double(luna_json_writer *w, double v) {
    before_value(w);
    if (!isfinite(v)) {
        append_str(w, "null");
        return;
    }
    char buf[40];
    if (v == floor(v) && fabs(v) < 1e15) { /* integral: 900, not the shortest form 9e+02 */
        snprintf(buf, sizeof buf, "%.0f", v);
        append_str(w, buf);
        return;
    }
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(buf, sizeof buf, "%.*g", precision, v);
        if (strtod(buf, NULL) == v) break;
    }
    append_str(w, buf);
}

void luna_json_bool(luna_json_writer *w, bool v) {
    before_value(w);
    append_str(w, v ? "true" : "false");
}

void luna_json_null(luna_json_writer *w) {
    before_value(w);
    append_str(w, "null");
}

luna_status luna_json_writer_finish(luna_json_writer *w, char **text, size_t *length) {
    if (w->failed || w->depth != 0 || w->after_key || !w->data) {
        bool oom = w->failed && w->depth == 0;
        luna_json_writer_free(w);
        return oom ? luna_error(LUNA_ERR_OUT_OF_MEMORY, "JSON writer: out of memory")
                   : luna_error(LUNA_ERR_INTERNAL, "JSON writer: unbalanced or empty document");
    }
    *text = w->data;
    if (length) *length = w->length;
    w->data = NULL;
    luna_json_writer_init(w);
    return LUNA_OK;
}

void luna_json_writer_free(luna_json_writer *w) {
    free(w->data);
    luna_json_writer_init(w);
}
