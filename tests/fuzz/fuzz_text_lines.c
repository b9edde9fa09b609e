/* libFuzzer target: the text line reader (data/text_lines.c) that luna-preprocess and
 * luna-translate use for raw text. The first byte picks the checks (empty lines allowed, a line
 * length limit); every line of a file that opens is read back and checked to lie in the file. */
#include <stdint.h>
#include <string.h>

#include "data/text_lines.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    luna_text_check check = {.max_line_bytes = size && (data[0] & 2) ? 64 : 0,
                             .allow_empty = size && (data[0] & 1)};
    const char *path = fuzz_write("x.txt", data, size);
    luna_text_lines *t = NULL;
    if (luna_text_lines_open(&t, path, &check) != LUNA_OK) return 0;
    size_t total = 0;
    for (size_t i = 0; i < t->count; i++) {
        size_t len;
        const char *s = luna_text_line(t, i, &len);
        if (s < (const char *)t->map.data || s + len > (const char *)t->map.data + t->map.size ||
            memchr(s, '\n', len) || (check.max_line_bytes && len > check.max_line_bytes))
            __builtin_trap();
        total += len;
    }
    if (total > size) __builtin_trap();
    luna_text_lines_free(t);
    return 0;
}
