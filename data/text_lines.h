/* A checked, memory-mapped view of a text file as lines (one sentence per line).
 *
 * Opening validates every line up front (so that nothing is trained or written from a file
 * that turns out to be bad half-way through): well-formed UTF-8, no NUL bytes, at most
 * max_line_bytes bytes, and optionally not empty. Errors read
 *   "<file>:<line>: <problem> (<what to do>)".
 * A final line without '\n' counts as a line; the '\n' itself is never part of a line.
 */
#ifndef LUNA_DATA_TEXT_LINES_H
#define LUNA_DATA_TEXT_LINES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/file_util.h"
#include "core/status.h"

typedef struct {
    size_t max_line_bytes; /* 0: unlimited */
    bool allow_empty;      /* false: an empty (or whitespace-only) line is an error */
} luna_text_check;

typedef struct {
    char *path;
    luna_mapped_file map;
    size_t count;     /* number of lines */
    size_t *starts;   /* (count + 1) byte offset of each line; starts[count] = end sentinel */
    size_t num_empty; /* lines that are empty or whitespace-only (when allowed) */
} luna_text_lines;

luna_status luna_text_lines_open(luna_text_lines **out, const char *path,
                                 const luna_text_check *check);
void luna_text_lines_free(luna_text_lines *t);

/* Line i (0-based) without its newline. */
static inline const char *luna_text_line(const luna_text_lines *t, size_t i, size_t *len) {
    size_t end = t->starts[i + 1];
    /* starts[i+1] is one past the '\n' unless line i is an unterminated last line. */
    if (end > t->starts[i] && t->map.data[end - 1] == '\n') end--;
    *len = end - t->starts[i];
    return (const char *)t->map.data + t->starts[i];
}

/* True iff the bytes contain nothing but ASCII whitespace (the definition of "empty"). */
bool luna_text_is_blank(const char *s, size_t n);

#endif
