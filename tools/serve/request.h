/* The body of luna-serve's POST /translate: a JSON object read strictly (core/json.h) into the
 * sentences and search options of one request.
 *
 *   {"sentences": ["A man is sleeping.", ...],     required: an array of strings (may be empty)
 *    "beam_size": 4, "length_penalty": 0.6,        optional: the search (defaults: the server's)
 *    "max_length": 200, "num_hypotheses": 1,
 *    "pieces": false, "timeout_ms": 30000}
 *
 * Anything else is refused with one line naming the member or sentence and the problem: a key
 * that is not one of these (so a misspelt option is never silently ignored), a wrong type, a
 * value out of range, a sentence with a line break or other control character than tab (a
 * sentence is one line), or more sentences or a longer sentence than the server's limits (which
 * is "too large", HTTP 413, rather than "bad", HTTP 400). The parser never translates and never
 * calls the model: it is the part of the server exposed to untrusted bytes and is fuzzed alone
 * (tests/fuzz/fuzz_serve_request.c). */
#ifndef LUNA_SERVE_REQUEST_H
#define LUNA_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Search options of one request; two requests may share a batch only when these are equal. */
typedef struct {
    int beam_size;         /* 1..limits.max_beam_size */
    double length_penalty; /* finite, -10..10 */
    int max_length;        /* target tokens before </s>, 1..1022 */
    int num_hypotheses;    /* 1..beam_size */
    bool pieces; /* sentences are space-separated SentencePiece pieces, as is the output */
} serve_search;

bool serve_search_equal(const serve_search *a, const serve_search *b);

typedef struct {
    size_t max_sentences;      /* more in one request: too large */
    size_t max_sentence_bytes; /* a longer sentence: too large */
    int max_beam_size;
    int64_t max_timeout_ms; /* the largest timeout a request may ask for */
    serve_search defaults;  /* for the members a request leaves out */
    int64_t default_timeout_ms;
} serve_limits;

typedef struct {
    char **sentences; /* count NUL-terminated UTF-8 strings (one allocation each) */
    size_t *lengths;
    size_t count;
    size_t total_bytes;
    serve_search search;
    int64_t timeout_ms;
} serve_request;

typedef enum {
    SERVE_REQUEST_OK = 0,
    SERVE_REQUEST_BAD,       /* malformed JSON or invalid member: 400 */
    SERVE_REQUEST_TOO_LARGE, /* over a limit: 413 */
    SERVE_REQUEST_NO_MEMORY, /* 500 */
} serve_request_verdict;

/* Parse body[0..len). On anything but OK, `message` (size bytes) holds one line saying what is
 * wrong and `out` is left empty. On OK, release `out` with serve_request_release. */
serve_request_verdict serve_request_parse(const char *body, size_t len, const serve_limits *limits,
                                          serve_request *out, char *message, size_t size);
void serve_request_release(serve_request *r);

#endif
