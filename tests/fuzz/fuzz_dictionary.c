/* libFuzzer target: the fairseq dictionary reader (data/dictionary.c). A dictionary that loads
 * is written back as text and must load again with the same size. */
#include <stdint.h>
#include <stdlib.h>

#include "data/dictionary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    luna_dictionary *d = NULL;
    if (luna_dictionary_load_from_memory(&d, (const char *)data, size, "dict.fuzz.txt") != LUNA_OK)
        return 0;
    char *text = NULL;
    size_t len = 0;
    if (luna_dictionary_to_text(d, &text, &len) == LUNA_OK) {
        luna_dictionary *again = NULL;
        if (luna_dictionary_load_from_memory(&again, text, len, "again") != LUNA_OK ||
            luna_dictionary_size(again) != luna_dictionary_size(d))
            __builtin_trap();
        luna_dictionary_free(again);
        free(text);
    }
    luna_dictionary_free(d);
    return 0;
}
