/* luna-serve's HTTP side, on libmicrohttpd (one thread per connection, so a client that sends
 * its body slowly holds only its own thread; requests wait for their translations in their
 * connection's thread while the batcher's worker translates).
 *
 *   POST /translate  JSON request (request.h) -> {"translations": [{"text", "score"
 *                    [, "hypotheses": [{"text", "score"}, ...]]}, ...], "queue_ms", "decode_ms"}
 *   GET  /health     {"status": "ok", ...} (503 {"status": "stopping"} once stopping)
 *   GET  /metrics    Prometheus text (metrics.h)
 *   GET  /           the web page
 *
 * Errors are {"error": {"kind": "<metrics.h's kind>", "message": "<one line>"}} with 400
 * (malformed JSON, invalid member), 404, 405, 413 (body, sentence count or sentence too large),
 * 500, 503 (queue full, with Retry-After; or stopping) and 504 (the request's deadline passed). */
#ifndef LUNA_SERVE_HTTP_H
#define LUNA_SERVE_HTTP_H

#include <stddef.h>

#include "core/status.h"
#include "tools/serve/batcher.h"
#include "tools/serve/metrics.h"
#include "tools/serve/request.h"

typedef struct {
    const char *host; /* numeric address or name to bind */
    int port;         /* 0: any free port (serve_http_port says which) */
    size_t max_body_bytes;
    unsigned connection_limit;     /* open connections at once */
    unsigned connection_timeout_s; /* idle connections are closed after this */
    serve_limits limits;
    const char *model_name; /* shown by /health and the page */
    const char *page;       /* GET / (page_length bytes of HTML) */
    size_t page_length;
} serve_http_config;

typedef struct serve_http serve_http;

/* Bind and start serving. The batcher and metrics are borrowed. */
luna_status serve_http_start(serve_http **out, const serve_http_config *config,
                             serve_batcher *batcher, serve_metrics *metrics);
int serve_http_port(const serve_http *h);
/* Stop accepting connections; requests that arrive on open connections from now on get 503.
 * Then wait (at most max_seconds) until every request received before has been answered.
 * Returns the number still unanswered. */
int serve_http_drain(serve_http *h, double max_seconds);
/* Close every connection and free. */
void serve_http_stop(serve_http *h);

#endif
