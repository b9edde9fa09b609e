/* Error reporting used across the whole library.
 *
 * Every fallible function returns a luna_status; on failure it also records a one-line message
 * (file, position, problem, what to do) retrievable with luna_error_message(). Libraries never
 * call exit(): the programs in tools/ print the message and choose the exit code.
 */
#ifndef LUNA_STATUS_H
#define LUNA_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LUNA_OK = 0,
    LUNA_ERR_INVALID_ARGUMENT, /* a caller passed something the function cannot use */
    LUNA_ERR_OUT_OF_MEMORY,
    LUNA_ERR_IO,          /* open/read/write/fsync/rename failed */
    LUNA_ERR_FORMAT,      /* a file's content is malformed (bad magic, truncated, bad UTF-8, ...) */
    LUNA_ERR_MISMATCH,    /* two inputs disagree (shapes, dictionaries, architectures) */
    LUNA_ERR_NUMERIC,     /* non-finite values where finite ones are required */
    LUNA_ERR_UNSUPPORTED, /* valid request that this build or backend cannot do */
    LUNA_ERR_INTERNAL,
} luna_status;

/* Record an error message (printf-style) and return `status`, so callers can write
 *   return luna_error(LUNA_ERR_FORMAT, "%s: line %ld: invalid UTF-8", path, line); */
luna_status luna_error(luna_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *luna_error_message(void);

/* Prefix the current message with more context: "<context>: <previous message>". */
void luna_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void luna_error_clear(void);

const char *luna_status_name(luna_status status);

/* Propagate a failing status unchanged. */
#define LUNA_TRY(expr)                                                                             \
    do {                                                                                           \
        luna_status luna_try_status_ = (expr);                                                     \
        if (luna_try_status_ != LUNA_OK) return luna_try_status_;                                  \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
