/* luna-serve's HTTP side on libmicrohttpd (http.h). */
#include "tools/serve/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/json.h"

struct serve_http {
    struct MHD_Daemon *daemon;
    serve_http_config config;
    serve_batcher *batcher;
    serve_metrics *metrics;
    int port;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    atomic_bool stopping; /* read by answers outside the lock */
    long in_flight;       /* requests received before stopping and not yet answered */
};

/* One request, from its headers to the end of its answer. */
typedef struct {
    serve_metrics *metrics;
    serve_endpoint endpoint;
    unsigned code;
    double start;
    bool counted; /* in in_flight */
    bool answered;
    bool too_large;
    char *body;
    size_t length, capacity;
} request_state;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- answers --------------------------------------------------------------------------------- */

/* Queue `data` (malloc'ed; taken over) as the answer. */
static enum MHD_Result answer(struct MHD_Connection *c, request_state *r, unsigned code,
                              const char *type, char *data, size_t length, bool close) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(length, data, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(data);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (code == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                                r->endpoint == SERVE_ENDPOINT_TRANSLATE ? "POST" : "GET");
    if (close) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    const enum MHD_Result ok = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    r->code = code;
    r->answered = true;
    serve_metrics_request_answered(r->metrics);
    return ok;
}

static enum MHD_Result answer_error(serve_http *h, struct MHD_Connection *c, request_state *r,
                                    unsigned code, serve_error_kind kind, const char *message) {
    serve_metrics_error(h->metrics, kind);
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "error");
    luna_json_begin_object(&w);
    luna_json_key(&w, "kind");
    luna_json_string(&w, serve_error_kind_name(kind));
    luna_json_key(&w, "message");
    luna_json_string(&w, message);
    luna_json_end_object(&w);
    luna_json_end_object(&w);
    char *text = NULL;
    size_t n = 0;
    if (luna_json_writer_finish(&w, &text, &n) != LUNA_OK) return MHD_NO;
    /* After a refused body the rest of it may still be on the wire: close. */
    const bool close = code == MHD_HTTP_CONTENT_TOO_LARGE || h->stopping;
    return answer(c, r, code, "application/json", text, n, close);
}

static enum MHD_Result answer_translations(serve_http *h, struct MHD_Connection *c,
                                           request_state *r, serve_job *job, int nhyp) {
    size_t n = 0;
    const serve_translation *t = serve_job_translations(job, &n);
    double queued = 0, decode = 0;
    serve_job_times(job, &queued, &decode);
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "translations");
    luna_json_begin_array(&w);
    for (size_t i = 0; i < n; i++) {
        luna_json_begin_object(&w);
        luna_json_key(&w, "text");
        luna_json_string(&w, t[i].count ? t[i].hyps[0].text : "");
        luna_json_key(&w, "score");
        luna_json_double(&w, t[i].count ? t[i].hyps[0].score : 0.0);
        if (nhyp > 1) {
            luna_json_key(&w, "hypotheses");
            luna_json_begin_array(&w);
            for (int k = 0; k < t[i].count; k++) {
                luna_json_begin_object(&w);
                luna_json_key(&w, "text");
                luna_json_string(&w, t[i].hyps[k].text);
                luna_json_key(&w, "score");
                luna_json_double(&w, t[i].hyps[k].score);
                luna_json_end_object(&w);
            }
            luna_json_end_array(&w);
        }
        luna_json_end_object(&w);
    }
    luna_json_end_array(&w);
    luna_json_key(&w, "queue_ms");
    luna_json_double(&w, (double)(long long)(queued * 1e4) / 10);
    luna_json_key(&w, "decode_ms");
    luna_json_double(&w, (double)(long long)(decode * 1e4) / 10);
    luna_json_end_object(&w);
    char *text = NULL;
    size_t len = 0;
    if (luna_json_writer_finish(&w, &text, &len) != LUNA_OK)
        return answer_error(h, c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, SERVE_ERROR_INTERNAL,
                            "out of memory writing the answer");
    return answer(c, r, MHD_HTTP_OK, "application/json", text, len, h->stopping);
}

/* ---- endpoints ------------------------------------------------------------------------------- */

static enum MHD_Result translate(serve_http *h, struct MHD_Connection *c, request_state *r) {
    char message[512];
    serve_request req;
    switch (serve_request_parse(r->body ? r->body : "", r->length, &h->config.limits, &req, message,
                                sizeof message)) {
    case SERVE_REQUEST_OK: break;
    case SERVE_REQUEST_BAD:
        return answer_error(h, c, r, MHD_HTTP_BAD_REQUEST, SERVE_ERROR_BAD_REQUEST, message);
    case SERVE_REQUEST_TOO_LARGE:
        return answer_error(h, c, r, MHD_HTTP_CONTENT_TOO_LARGE, SERVE_ERROR_TOO_LARGE, message);
    default:
        return answer_error(h, c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, SERVE_ERROR_INTERNAL, message);
    }
    free(r->body); /* the request holds copies of the sentences */
    r->body = NULL;
    const int nhyp = req.search.num_hypotheses;
    const long long timeout = (long long)req.timeout_ms;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    serve_client *client = ci ? ci->socket_context : NULL;
    serve_job *job = NULL;
    const serve_job_outcome o = serve_batcher_translate(h->batcher, client, &req, &job);
    enum MHD_Result ret;
    switch (o) {
    case SERVE_JOB_DONE: ret = answer_translations(h, c, r, job, nhyp); break;
    case SERVE_JOB_QUEUE_FULL:
        ret = answer_error(h, c, r, MHD_HTTP_SERVICE_UNAVAILABLE, SERVE_ERROR_QUEUE_FULL,
                           "the queue is full (--max-queue); retry after a second");
        break;
    case SERVE_JOB_SHUTTING_DOWN:
        ret = answer_error(h, c, r, MHD_HTTP_SERVICE_UNAVAILABLE, SERVE_ERROR_SHUTTING_DOWN,
                           "the server is shutting down");
        break;
    case SERVE_JOB_EXPIRED:
        snprintf(message, sizeof message,
                 "not translated within the request's deadline of %lld ms (timeout_ms; the "
                 "server's --timeout-ms)",
                 timeout);
        ret = answer_error(h, c, r, MHD_HTTP_GATEWAY_TIMEOUT, SERVE_ERROR_DEADLINE, message);
        break;
    default:
        snprintf(message, sizeof message, "translation failed: %s",
                 job ? serve_job_error(job) : "out of memory");
        ret = answer_error(h, c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, SERVE_ERROR_INTERNAL, message);
    }
    serve_job_release(h->batcher, job);
    return ret;
}

static enum MHD_Result health(serve_http *h, struct MHD_Connection *c, request_state *r) {
    size_t qs = 0, qj = 0, run = 0;
    serve_batcher_depth(h->batcher, &qs, &qj, &run);
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "status");
    luna_json_string(&w, h->stopping ? "stopping" : "ok");
    luna_json_key(&w, "model");
    luna_json_string(&w, h->config.model_name);
    luna_json_key(&w, "version");
    luna_json_string(&w, LUNA_VERSION);
    luna_json_key(&w, "queue_sentences");
    luna_json_uint(&w, qs);
    luna_json_end_object(&w);
    char *text = NULL;
    size_t n = 0;
    if (luna_json_writer_finish(&w, &text, &n) != LUNA_OK) return MHD_NO;
    return answer(c, r, h->stopping ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                  "application/json", text, n, h->stopping);
}

static enum MHD_Result metrics(serve_http *h, struct MHD_Connection *c, request_state *r) {
    size_t qs = 0, qj = 0, run = 0;
    serve_batcher_depth(h->batcher, &qs, &qj, &run);
    char *text = NULL;
    size_t n = 0;
    if (serve_metrics_render(h->metrics, qs, qj, run, &text, &n) != LUNA_OK) return MHD_NO;
    return answer(c, r, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, n,
                  h->stopping);
}

static enum MHD_Result page(serve_http *h, struct MHD_Connection *c, request_state *r) {
    char *copy = malloc(h->config.page_length + 1);
    if (!copy) return MHD_NO;
    memcpy(copy, h->config.page, h->config.page_length);
    return answer(c, r, MHD_HTTP_OK, "text/html; charset=utf-8", copy, h->config.page_length,
                  h->stopping);
}

static serve_endpoint endpoint_of(const char *url) {
    if (!strcmp(url, "/translate")) return SERVE_ENDPOINT_TRANSLATE;
    if (!strcmp(url, "/health")) return SERVE_ENDPOINT_HEALTH;
    if (!strcmp(url, "/metrics")) return SERVE_ENDPOINT_METRICS;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return SERVE_ENDPOINT_PAGE;
    return SERVE_ENDPOINT_OTHER;
}

/* ---- libmicrohttpd's callbacks --------------------------------------------------------------- */

/* The first call of a request: its state, and the answers that need no body. */
static enum MHD_Result begin(serve_http *h, struct MHD_Connection *c, const char *url,
                             const char *method, void **con_cls) {
    request_state *r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    *con_cls = r;
    r->start = now();
    r->metrics = h->metrics;
    r->endpoint = endpoint_of(url);
    serve_metrics_request_begin(h->metrics);
    /* Only translation clients are waited for (a /metrics poller is not). */
    if (r->endpoint == SERVE_ENDPOINT_TRANSLATE) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        serve_client_request_begin(h->batcher, ci ? ci->socket_context : NULL);
    }
    pthread_mutex_lock(&h->lock);
    const bool stopping = h->stopping;
    if (!stopping) h->in_flight++, r->counted = true;
    pthread_mutex_unlock(&h->lock);
    if (stopping)
        return answer_error(h, c, r, MHD_HTTP_SERVICE_UNAVAILABLE, SERVE_ERROR_SHUTTING_DOWN,
                            "the server is shutting down");
    const bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    const bool get = !strcmp(method, MHD_HTTP_METHOD_GET);
    if (r->endpoint == SERVE_ENDPOINT_OTHER)
        return answer_error(h, c, r, MHD_HTTP_NOT_FOUND, SERVE_ERROR_NOT_FOUND,
                            "no such endpoint (POST /translate, GET /health, GET /metrics, GET /)");
    if (r->endpoint == SERVE_ENDPOINT_TRANSLATE ? !post : !get)
        return answer_error(h, c, r, MHD_HTTP_METHOD_NOT_ALLOWED, SERVE_ERROR_METHOD,
                            r->endpoint == SERVE_ENDPOINT_TRANSLATE
                                ? "/translate takes POST with a JSON body"
                                : "this endpoint takes GET");
    if (r->endpoint == SERVE_ENDPOINT_TRANSLATE) {
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->config.max_body_bytes) {
            char message[200];
            snprintf(message, sizeof message,
                     "the body (%s bytes) is larger than this server's limit of %zu bytes "
                     "(--max-body-bytes)",
                     cl, h->config.max_body_bytes);
            return answer_error(h, c, r, MHD_HTTP_CONTENT_TOO_LARGE, SERVE_ERROR_TOO_LARGE,
                                message);
        }
        return MHD_YES; /* the body follows */
    }
    if (r->endpoint == SERVE_ENDPOINT_HEALTH) return health(h, c, r);
    if (r->endpoint == SERVE_ENDPOINT_METRICS) return metrics(h, c, r);
    return page(h, c, r);
}

static bool append(request_state *r, const char *data, size_t n, size_t max) {
    if (r->length + n > max) return false;
    if (r->length + n + 1 > r->capacity) {
        size_t cap = r->capacity ? r->capacity : 4096;
        while (cap < r->length + n + 1)
            cap *= 2;
        if (cap > max + 1) cap = max + 1;
        char *b = realloc(r->body, cap);
        if (!b) return false;
        r->body = b, r->capacity = cap;
    }
    memcpy(r->body + r->length, data, n);
    r->length += n;
    r->body[r->length] = 0;
    return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    serve_http *h = cls;
    request_state *r = *con_cls;
    if (!r) return begin(h, c, url, method, con_cls);
    if (r->answered) { /* answered before its body: drop what still arrives */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!r->too_large && !append(r, upload_data, *upload_data_size, h->config.max_body_bytes))
            r->too_large = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->too_large) {
        char message[200];
        snprintf(message, sizeof message,
                 "the body is larger than this server's limit of %zu bytes (--max-body-bytes)",
                 h->config.max_body_bytes);
        return answer_error(h, c, r, MHD_HTTP_CONTENT_TOO_LARGE, SERVE_ERROR_TOO_LARGE, message);
    }
    return translate(h, c, r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)toe;
    serve_http *h = cls;
    request_state *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    serve_metrics_request_end(h->metrics, r->endpoint, r->answered ? r->code : 0, now() - r->start);
    if (r->endpoint == SERVE_ENDPOINT_TRANSLATE) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        serve_client_request_end(h->batcher, ci ? ci->socket_context : NULL);
    }
    if (r->counted) {
        pthread_mutex_lock(&h->lock);
        if (--h->in_flight == 0) pthread_cond_broadcast(&h->idle);
        pthread_mutex_unlock(&h->lock);
    }
    free(r->body);
    free(r);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)c;
    serve_http *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = serve_client_open(h->batcher);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        serve_client_close(h->batcher, *socket_context);
        *socket_context = NULL;
    }
}

/* ---- the daemon ------------------------------------------------------------------------------ */

luna_status serve_http_start(serve_http **out, const serve_http_config *config,
                             serve_batcher *batcher, serve_metrics *metrics) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", config->port);
    const int gai = getaddrinfo(config->host, port, &hints, &ai);
    if (gai != 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--host %s: %s", config->host,
                          gai_strerror(gai));
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    h->config = *config, h->batcher = batcher, h->metrics = metrics;
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->idle, NULL);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)config->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        h, MHD_OPTION_CONNECTION_LIMIT, config->connection_limit, MHD_OPTION_CONNECTION_TIMEOUT,
        config->connection_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        pthread_cond_destroy(&h->idle);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return luna_error(LUNA_ERR_IO,
                          "cannot listen on %s port %d (in use, or not an address of this "
                          "machine; --host/--port)",
                          config->host, config->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : config->port;
    *out = h;
    return LUNA_OK;
}

int serve_http_port(const serve_http *h) { return h->port; }

int serve_http_drain(serve_http *h, double max_seconds) {
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    pthread_mutex_unlock(&h->lock);
    const MHD_socket listener = MHD_quiesce_daemon(h->daemon);
    if (listener != MHD_INVALID_SOCKET) close(listener);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)max_seconds;
    pthread_mutex_lock(&h->lock);
    while (h->in_flight > 0 && pthread_cond_timedwait(&h->idle, &h->lock, &until) == 0) {
    }
    const int left = (int)h->in_flight;
    pthread_mutex_unlock(&h->lock);
    return left;
}

void serve_http_stop(serve_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->daemon);
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->lock);
    free(h);
}
