#include "core/status.h"

#include <stdio.h>
#include <string.h>

#define LUNA_ERROR_CAPACITY 1024

static _Thread_local char error_message[LUNA_ERROR_CAPACITY];

luna_status luna_error(luna_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, args);
    va_end(args);
    return status;
}

const char *luna_error_message(void) { return error_message; }

void luna_error_prefix(const char *fmt, ...) {
    char prefix[LUNA_ERROR_CAPACITY];
    char previous[LUNA_ERROR_CAPACITY];
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    memcpy(previous, error_message, sizeof previous);
    /* Truncation of an over-long message is acceptable; build it piecewise to say so. */
    size_t used = strnlen(prefix, sizeof prefix - 1);
    memcpy(error_message, prefix, used);
    if (used + 2 < sizeof error_message) {
        memcpy(error_message + used, ": ", 2);
        used += 2;
    }
    size_t rest = strnlen(previous, sizeof previous - 1);
    if (rest > sizeof error_message - 1 - used) rest = sizeof error_message - 1 - used;
    memcpy(error_message + used, previous, rest);
    error_message[used + rest] = '\0';
}

void luna_error_clear(void) { error_message[0] = '\0'; }

const char *luna_status_name(luna_status status) {
    switch (status) {
    case LUNA_OK: return "ok";
    case LUNA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case LUNA_ERR_OUT_OF_MEMORY: return "out of memory";
    case LUNA_ERR_IO: return "I/O error";
    case LUNA_ERR_FORMAT: return "format error";
    case LUNA_ERR_MISMATCH: return "mismatch";
    case LUNA_ERR_NUMERIC: return "numeric error";
    case LUNA_ERR_UNSUPPORTED: return "unsupported";
    case LUNA_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
