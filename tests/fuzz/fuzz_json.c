/* libFuzzer target: the JSON reader (core/json.c), and the model configuration read from JSON
 * (the "config" of every checkpoint). Any input must either parse or fail with a message; a
 * parsed tree is walked completely. */
#include <stdint.h>
#include <string.h>

#include "core/json.h"
#include "model/config.h"

static size_t walk(const luna_json *v, int depth) {
    size_t n = 1;
    if (v->type == LUNA_JSON_STRING && strlen(v->string) != v->length) __builtin_trap();
    if (v->type == LUNA_JSON_OBJECT || v->type == LUNA_JSON_ARRAY)
        for (size_t i = 0; i < v->length; i++) {
            if (v->type == LUNA_JSON_OBJECT && luna_json_get(v, v->keys[i]) != &v->items[i])
                __builtin_trap(); /* keys are unique: lookup finds the item itself */
            n += walk(&v->items[i], depth + 1);
        }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    luna_json *v = NULL;
    size_t at = 0;
    if (luna_json_parse(&v, (const char *)data, size, &at) == LUNA_OK) {
        walk(v, 0);
        luna_json_free(v);
    } else if (at > size || luna_error_message()[0] == '\0') {
        __builtin_trap();
    }
    luna_config c;
    (void)luna_config_from_json(&c, (const char *)data, size);
    return 0;
}
