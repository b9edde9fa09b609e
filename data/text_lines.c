#include "data/text_lines.h"

#include <stdlib.h>
#include <string.h>

bool luna_text_is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\v' && c != '\f') return false;
    }
    return true;
}

void luna_text_lines_free(luna_text_lines *t) {
    if (!t) return;
    luna_mapped_file_close(&t->map);
    free(t->starts);
    free(t->path);
    free(t);
}

static luna_status check_line(const luna_text_lines *t, const luna_text_check *check, size_t lineno,
                              const char *s, size_t n) {
    if (check->max_line_bytes && n > check->max_line_bytes)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s:%zu: line is %zu bytes, longer than --max-line-bytes %zu "
                          "(split or drop the line, or raise --max-line-bytes)",
                          t->path, lineno, n, check->max_line_bytes);
    const char *nul = memchr(s, '\0', n);
    if (nul)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s:%zu: NUL byte at byte %zu of the line (the file must be "
                          "UTF-8 text, one sentence per line)",
                          t->path, lineno, (size_t)(nul - s) + 1);
    size_t bad;
    if (!luna_utf8_valid(s, n, &bad))
        return luna_error(LUNA_ERR_FORMAT,
                          "%s:%zu: invalid UTF-8 at byte %zu of the line (convert the file "
                          "to UTF-8, e.g. with iconv)",
                          t->path, lineno, bad + 1);
    if (!check->allow_empty && luna_text_is_blank(s, n))
        return luna_error(LUNA_ERR_FORMAT,
                          "%s:%zu: empty line (remove the sentence pair, or pass "
                          "--skip-empty to drop such pairs)",
                          t->path, lineno);
    return LUNA_OK;
}

luna_status luna_text_lines_open(luna_text_lines **out, const char *path,
                                 const luna_text_check *check) {
    *out = NULL;
    luna_text_lines *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    luna_status st = luna_mapped_file_open(&t->map, path);
    size_t cap = 0;
    const char *base = (const char *)t->map.data;
    size_t pos = 0;
    while (st == LUNA_OK && pos < t->map.size) {
        if (t->count + 2 > cap) {
            cap = cap ? cap * 2 : 4096;
            size_t *starts = realloc(t->starts, cap * sizeof *starts);
            if (!starts) {
                st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory indexing lines", path);
                break;
            }
            t->starts = starts;
        }
        const char *nl = memchr(base + pos, '\n', t->map.size - pos);
        size_t n = nl ? (size_t)(nl - (base + pos)) : t->map.size - pos;
        t->starts[t->count++] = pos;
        st = check_line(t, check, t->count, base + pos, n);
        if (st == LUNA_OK && luna_text_is_blank(base + pos, n)) t->num_empty++;
        pos += n + (nl ? 1 : 0);
    }
    if (st == LUNA_OK && !t->starts && !(t->starts = malloc(sizeof *t->starts)))
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (st != LUNA_OK) {
        luna_text_lines_free(t);
        return st;
    }
    t->starts[t->count] = t->map.size;
    *out = t;
    return LUNA_OK;
}
