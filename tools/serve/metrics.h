/* luna-serve's counters, rendered for GET /metrics in the Prometheus text format (version 0.0.4):
 *
 *   luna_serve_requests_total{endpoint,code}     answers sent, by endpoint and HTTP status
 *   luna_serve_errors_total{kind}                error answers by kind (bad_request, too_large,
 *                                                queue_full, shutting_down, deadline, not_found,
 *                                                method, internal)
 *   luna_serve_request_seconds                   histogram of POST /translate latency
 *   luna_serve_sentences_total, luna_serve_target_tokens_total, luna_serve_decode_seconds_total
 *   luna_serve_tokens_per_second                 target tokens per second over the last 10 s
 *   luna_serve_batch_sentences, _batch_requests  histograms of what each engine call carried
 *   luna_serve_queue_sentences, _queue_requests  queued now (gauges)
 *   luna_serve_running_requests                  requests being translated now
 *   luna_serve_in_flight_requests                requests received and not yet answered
 *   process_resident_memory_bytes                the server's RSS
 *
 * Thread safety: one mutex; every function may be called from any thread. */
#ifndef LUNA_SERVE_METRICS_H
#define LUNA_SERVE_METRICS_H

#include <stddef.h>

#include "core/status.h"

typedef enum {
    SERVE_ENDPOINT_TRANSLATE = 0,
    SERVE_ENDPOINT_HEALTH,
    SERVE_ENDPOINT_METRICS,
    SERVE_ENDPOINT_PAGE,
    SERVE_ENDPOINT_OTHER,
    SERVE_ENDPOINT_COUNT
} serve_endpoint;

typedef enum {
    SERVE_ERROR_BAD_REQUEST = 0, /* 400 */
    SERVE_ERROR_TOO_LARGE,       /* 413 */
    SERVE_ERROR_QUEUE_FULL,      /* 503 */
    SERVE_ERROR_SHUTTING_DOWN,   /* 503 */
    SERVE_ERROR_DEADLINE,        /* 504 */
    SERVE_ERROR_NOT_FOUND,       /* 404 */
    SERVE_ERROR_METHOD,          /* 405 */
    SERVE_ERROR_INTERNAL,        /* 500 */
    SERVE_ERROR_COUNT
} serve_error_kind;

typedef struct serve_metrics serve_metrics;

luna_status serve_metrics_create(serve_metrics **out);
void serve_metrics_free(serve_metrics *m);

/* A request arrived (in flight) / its answer was queued (no longer in flight: the gauge must not
 * count answers still being sent, or a client that has its answer still sees itself counted) /
 * its connection finished with it after `seconds`: HTTP status `code`, or 0 when it closed
 * unanswered (then it leaves the in-flight count here). */
void serve_metrics_request_begin(serve_metrics *m);
void serve_metrics_request_answered(serve_metrics *m);
void serve_metrics_request_end(serve_metrics *m, serve_endpoint e, unsigned code, double seconds);
void serve_metrics_error(serve_metrics *m, serve_error_kind kind);
/* One engine call: `requests` jobs with `sentences` sentences in all. */
void serve_metrics_batch(serve_metrics *m, size_t requests, size_t sentences, size_t target_tokens,
                         double decode_seconds);

/* The exposition text (malloc'ed, NUL-terminated); the batcher's gauges are passed in. */
luna_status serve_metrics_render(serve_metrics *m, size_t queue_sentences, size_t queue_requests,
                                 size_t running_requests, char **text, size_t *length);

const char *serve_error_kind_name(serve_error_kind kind);

#endif
