/* POST /translate's body (request.h). */
#include "tools/serve/request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

bool serve_search_equal(const serve_search *a, const serve_search *b) {
    return a->beam_size == b->beam_size && a->length_penalty == b->length_penalty &&
           a->max_length == b->max_length && a->num_hypotheses == b->num_hypotheses &&
           a->pieces == b->pieces;
}

void serve_request_release(serve_request *r) {
    for (size_t i = 0; r->sentences && i < r->count; i++)
        free(r->sentences[i]);
    free(r->sentences);
    free(r->lengths);
    memset(r, 0, sizeof *r);
}

typedef struct {
    char *message;
    size_t size;
} reply;

static serve_request_verdict say(reply *y, serve_request_verdict v, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static serve_request_verdict say(reply *y, serve_request_verdict v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (y->size) vsnprintf(y->message, y->size, fmt, ap);
    va_end(ap);
    return v;
}

/* An integer member in [lo, hi] (absent: *value unchanged). */
static serve_request_verdict get_int(reply *y, const luna_json *body, const char *key, int64_t lo,
                                     int64_t hi, int64_t *value) {
    const luna_json *v = luna_json_get(body, key);
    if (!v) return SERVE_REQUEST_OK;
    if (v->type != LUNA_JSON_NUMBER || !v->is_int)
        return say(y, SERVE_REQUEST_BAD, "\"%s\" must be an integer (got %s)", key,
                   v->type == LUNA_JSON_NUMBER ? "a fraction" : luna_json_type_name(v->type));
    const bool low = v->is_negative ? v->int_value < lo : lo > 0 && v->uint_value < (uint64_t)lo;
    const bool high = !v->is_negative && v->uint_value > (uint64_t)hi;
    if (low || high)
        return say(y, SERVE_REQUEST_BAD, "\"%s\" must be in %lld..%lld", key, (long long)lo,
                   (long long)hi);
    *value = v->is_negative ? v->int_value : (int64_t)v->uint_value;
    return SERVE_REQUEST_OK;
}

/* A sentence is one line of UTF-8 text (the JSON reader has checked the UTF-8 and NULs). */
static serve_request_verdict check_sentence(reply *y, size_t i, const luna_json *s,
                                            const serve_limits *limits) {
    if (s->type != LUNA_JSON_STRING)
        return say(y, SERVE_REQUEST_BAD, "sentence %zu: must be a string (got %s)", i,
                   luna_json_type_name(s->type));
    if (s->length > limits->max_sentence_bytes)
        return say(y, SERVE_REQUEST_TOO_LARGE,
                   "sentence %zu: %zu bytes, more than this server's limit of %zu "
                   "(--max-sentence-bytes); split it",
                   i, s->length, limits->max_sentence_bytes);
    for (size_t k = 0; k < s->length; k++) {
        const unsigned char c = (unsigned char)s->string[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return say(y, SERVE_REQUEST_BAD,
                       "sentence %zu: control character 0x%02x at byte %zu (a sentence is one "
                       "line: send each line as its own sentence)",
                       i, c, k);
    }
    return SERVE_REQUEST_OK;
}

static const char *const KEYS[] = {"sentences",      "beam_size", "length_penalty", "max_length",
                                   "num_hypotheses", "pieces",    "timeout_ms"};

static serve_request_verdict read_options(reply *y, const luna_json *body,
                                          const serve_limits *limits, serve_request *r) {
    for (size_t i = 0; i < body->length; i++) {
        bool known = false;
        for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++)
            known = known || !strcmp(body->keys[i], KEYS[k]);
        if (!known)
            return say(y, SERVE_REQUEST_BAD,
                       "unknown member \"%.64s\" (known: sentences, beam_size, length_penalty, "
                       "max_length, num_hypotheses, pieces, timeout_ms)",
                       body->keys[i]);
    }
    int64_t beam = r->search.beam_size, maxlen = r->search.max_length,
            nhyp = r->search.num_hypotheses, timeout = r->timeout_ms;
    serve_request_verdict v;
    if ((v = get_int(y, body, "beam_size", 1, limits->max_beam_size, &beam)) ||
        (v = get_int(y, body, "max_length", 1, 1022, &maxlen)) ||
        (v = get_int(y, body, "num_hypotheses", 1, beam, &nhyp)) ||
        (v = get_int(y, body, "timeout_ms", 1, limits->max_timeout_ms, &timeout)))
        return v;
    if (nhyp > beam)
        return say(y, SERVE_REQUEST_BAD,
                   "\"num_hypotheses\" (%lld) must not exceed the beam (%lld)", (long long)nhyp,
                   (long long)beam);
    const luna_json *lp = luna_json_get(body, "length_penalty");
    if (lp && (lp->type != LUNA_JSON_NUMBER || !isfinite(lp->number) || fabs(lp->number) > 10))
        return say(y, SERVE_REQUEST_BAD, "\"length_penalty\" must be a number in -10..10");
    const luna_json *pc = luna_json_get(body, "pieces");
    if (pc && pc->type != LUNA_JSON_BOOL)
        return say(y, SERVE_REQUEST_BAD, "\"pieces\" must be true or false (got %s)",
                   luna_json_type_name(pc->type));
    r->search.beam_size = (int)beam;
    r->search.max_length = (int)maxlen;
    r->search.num_hypotheses = (int)nhyp;
    if (lp) r->search.length_penalty = lp->number;
    if (pc) r->search.pieces = pc->boolean;
    r->timeout_ms = timeout;
    return SERVE_REQUEST_OK;
}

static serve_request_verdict read_body(reply *y, const luna_json *body, const serve_limits *limits,
                                       serve_request *r) {
    if (body->type != LUNA_JSON_OBJECT)
        return say(y, SERVE_REQUEST_BAD,
                   "the body must be a JSON object like {\"sentences\": [\"...\"]} (got %s)",
                   luna_json_type_name(body->type));
    serve_request_verdict v = read_options(y, body, limits, r);
    if (v) return v;
    const luna_json *s = luna_json_get(body, "sentences");
    if (!s) return say(y, SERVE_REQUEST_BAD, "\"sentences\" is missing (an array of strings)");
    if (s->type != LUNA_JSON_ARRAY)
        return say(y, SERVE_REQUEST_BAD, "\"sentences\" must be an array of strings (got %s)",
                   luna_json_type_name(s->type));
    if (s->length > limits->max_sentences)
        return say(y, SERVE_REQUEST_TOO_LARGE,
                   "%zu sentences, more than this server's limit of %zu per request "
                   "(--max-sentences); send them in several requests",
                   s->length, limits->max_sentences);
    for (size_t i = 0; i < s->length; i++)
        if ((v = check_sentence(y, i, &s->items[i], limits))) return v;
    r->sentences = calloc(s->length + 1, sizeof *r->sentences);
    r->lengths = calloc(s->length + 1, sizeof *r->lengths);
    if (!r->sentences || !r->lengths) return say(y, SERVE_REQUEST_NO_MEMORY, "out of memory");
    for (size_t i = 0; i < s->length; i++, r->count++) {
        const luna_json *e = &s->items[i];
        if (!(r->sentences[i] = malloc(e->length + 1)))
            return say(y, SERVE_REQUEST_NO_MEMORY, "out of memory");
        memcpy(r->sentences[i], e->string, e->length + 1);
        r->lengths[i] = e->length;
        r->total_bytes += e->length;
    }
    return SERVE_REQUEST_OK;
}

serve_request_verdict serve_request_parse(const char *body, size_t len, const serve_limits *limits,
                                          serve_request *out, char *message, size_t size) {
    reply y = {message, size};
    if (size) message[0] = 0;
    memset(out, 0, sizeof *out);
    out->search = limits->defaults;
    out->timeout_ms = limits->default_timeout_ms;
    luna_json *json = NULL;
    size_t at = 0;
    if (luna_json_parse(&json, body, len, &at) != LUNA_OK) {
        /* The reader's message already names the byte: "JSON: byte N: ...". */
        say(&y, SERVE_REQUEST_BAD, "malformed %s", luna_error_message());
        return SERVE_REQUEST_BAD;
    }
    serve_request_verdict v = read_body(&y, json, limits, out);
    luna_json_free(json);
    if (v != SERVE_REQUEST_OK) serve_request_release(out);
    return v;
}
