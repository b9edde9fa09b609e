/* luna-serve's counters and their Prometheus text (metrics.h). */
#include "tools/serve/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const double LATENCY_BOUNDS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,  5,     10,   30,  60};
#define LATENCY_BUCKETS (sizeof LATENCY_BOUNDS / sizeof LATENCY_BOUNDS[0])
static const double COUNT_BOUNDS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
#define COUNT_BUCKETS (sizeof COUNT_BOUNDS / sizeof COUNT_BOUNDS[0])
/* Throughput window: per-second token counts of the last WINDOW whole seconds. */
#define WINDOW 10

typedef struct {
    uint64_t bucket[LATENCY_BUCKETS > COUNT_BUCKETS ? LATENCY_BUCKETS : COUNT_BUCKETS];
    uint64_t count;
    double sum;
} histogram;

struct serve_metrics {
    pthread_mutex_t lock;
    uint64_t requests[SERVE_ENDPOINT_COUNT][600]; /* [endpoint][HTTP status] */
    uint64_t errors[SERVE_ERROR_COUNT];
    histogram latency, batch_sentences, batch_requests;
    uint64_t sentences, target_tokens;
    double decode_seconds;
    long in_flight;
    int64_t window_second[WINDOW]; /* which second each slot counts */
    uint64_t window_tokens[WINDOW];
};

static const char *const ENDPOINT_NAMES[SERVE_ENDPOINT_COUNT] = {"/translate", "/health",
                                                                 "/metrics", "/", "other"};
static const char *const ERROR_NAMES[SERVE_ERROR_COUNT] = {
    "bad_request", "too_large", "queue_full", "shutting_down",
    "deadline",    "not_found", "method",     "internal"};

const char *serve_error_kind_name(serve_error_kind kind) {
    return (unsigned)kind < SERVE_ERROR_COUNT ? ERROR_NAMES[kind] : "unknown";
}

static int64_t now_second(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec;
}

luna_status serve_metrics_create(serve_metrics **out) {
    serve_metrics *m = calloc(1, sizeof *m);
    if (!m) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory for the metrics");
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        return luna_error(LUNA_ERR_INTERNAL, "cannot create the metrics' mutex");
    }
    for (int i = 0; i < WINDOW; i++)
        m->window_second[i] = -1;
    *out = m;
    return LUNA_OK;
}

void serve_metrics_free(serve_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static void observe(histogram *h, const double *bounds, size_t n, double v) {
    for (size_t i = 0; i < n; i++)
        if (v <= bounds[i]) {
            h->bucket[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

void serve_metrics_request_begin(serve_metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->in_flight++;
    pthread_mutex_unlock(&m->lock);
}

void serve_metrics_request_answered(serve_metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->in_flight--;
    pthread_mutex_unlock(&m->lock);
}

void serve_metrics_request_end(serve_metrics *m, serve_endpoint e, unsigned code, double seconds) {
    pthread_mutex_lock(&m->lock);
    if (code == 0) m->in_flight--;
    if ((unsigned)e < SERVE_ENDPOINT_COUNT && code < 600) m->requests[e][code]++;
    if (e == SERVE_ENDPOINT_TRANSLATE)
        observe(&m->latency, LATENCY_BOUNDS, LATENCY_BUCKETS, seconds);
    pthread_mutex_unlock(&m->lock);
}

void serve_metrics_error(serve_metrics *m, serve_error_kind kind) {
    pthread_mutex_lock(&m->lock);
    if ((unsigned)kind < SERVE_ERROR_COUNT) m->errors[kind]++;
    pthread_mutex_unlock(&m->lock);
}

void serve_metrics_batch(serve_metrics *m, size_t requests, size_t sentences, size_t target_tokens,
                         double decode_seconds) {
    const int64_t s = now_second();
    pthread_mutex_lock(&m->lock);
    observe(&m->batch_sentences, COUNT_BOUNDS, COUNT_BUCKETS, (double)sentences);
    observe(&m->batch_requests, COUNT_BOUNDS, COUNT_BUCKETS, (double)requests);
    m->sentences += sentences;
    m->target_tokens += target_tokens;
    m->decode_seconds += decode_seconds;
    const int slot = (int)(s % WINDOW);
    if (m->window_second[slot] != s) {
        m->window_second[slot] = s;
        m->window_tokens[slot] = 0;
    }
    m->window_tokens[slot] += target_tokens;
    pthread_mutex_unlock(&m->lock);
}

/* ---- rendering ------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t length, capacity;
    bool failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(text *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = t->capacity - t->length;
        const int n = vsnprintf(t->data ? t->data + t->length : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < room) {
            t->length += (size_t)n;
            return;
        }
        const size_t cap = 2 * t->capacity + (size_t)n + 1024;
        char *d = realloc(t->data, cap);
        if (!d) {
            t->failed = true;
            return;
        }
        t->data = d;
        t->capacity = cap;
    }
}

static void put_histogram(text *t, const char *name, const char *help, const histogram *h,
                          const double *bounds, size_t n) {
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < n; i++) {
        cumulative += h->bucket[i];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cumulative);
    }
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
        (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

static long resident_bytes(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

luna_status serve_metrics_render(serve_metrics *m, size_t queue_sentences, size_t queue_requests,
                                 size_t running_requests, char **out, size_t *length) {
    text t = {0};
    const long rss = resident_bytes();
    const int64_t s = now_second();
    pthread_mutex_lock(&m->lock);
    put(&t, "# HELP luna_serve_requests_total HTTP answers sent, by endpoint and status.\n"
            "# TYPE luna_serve_requests_total counter\n");
    for (int e = 0; e < SERVE_ENDPOINT_COUNT; e++)
        for (unsigned c = 0; c < 600; c++)
            if (m->requests[e][c])
                put(&t, "luna_serve_requests_total{endpoint=\"%s\",code=\"%u\"} %llu\n",
                    ENDPOINT_NAMES[e], c, (unsigned long long)m->requests[e][c]);
    put(&t, "# HELP luna_serve_errors_total Error answers by kind.\n"
            "# TYPE luna_serve_errors_total counter\n");
    for (int k = 0; k < SERVE_ERROR_COUNT; k++)
        put(&t, "luna_serve_errors_total{kind=\"%s\"} %llu\n", ERROR_NAMES[k],
            (unsigned long long)m->errors[k]);
    put_histogram(&t, "luna_serve_request_seconds", "POST /translate latency (seconds).",
                  &m->latency, LATENCY_BOUNDS, LATENCY_BUCKETS);
    put_histogram(&t, "luna_serve_batch_sentences", "Sentences per engine call.",
                  &m->batch_sentences, COUNT_BOUNDS, COUNT_BUCKETS);
    put_histogram(&t, "luna_serve_batch_requests", "Requests per engine call.", &m->batch_requests,
                  COUNT_BOUNDS, COUNT_BUCKETS);
    uint64_t recent = 0;
    for (int i = 0; i < WINDOW; i++) /* the last WINDOW whole seconds, not the current one */
        if (m->window_second[i] < s && m->window_second[i] >= s - WINDOW)
            recent += m->window_tokens[i];
    put(&t,
        "# HELP luna_serve_sentences_total Sentences translated.\n"
        "# TYPE luna_serve_sentences_total counter\nluna_serve_sentences_total %llu\n"
        "# HELP luna_serve_target_tokens_total Target tokens of the best hypotheses.\n"
        "# TYPE luna_serve_target_tokens_total counter\nluna_serve_target_tokens_total %llu\n"
        "# HELP luna_serve_decode_seconds_total Seconds the engine spent translating.\n"
        "# TYPE luna_serve_decode_seconds_total counter\nluna_serve_decode_seconds_total %.6f\n"
        "# HELP luna_serve_tokens_per_second Target tokens per second over the last %d s.\n"
        "# TYPE luna_serve_tokens_per_second gauge\nluna_serve_tokens_per_second %.1f\n",
        (unsigned long long)m->sentences, (unsigned long long)m->target_tokens, m->decode_seconds,
        WINDOW, (double)recent / WINDOW);
    put(&t,
        "# HELP luna_serve_queue_sentences Sentences waiting for the worker.\n"
        "# TYPE luna_serve_queue_sentences gauge\nluna_serve_queue_sentences %zu\n"
        "# HELP luna_serve_queue_requests Requests waiting for the worker.\n"
        "# TYPE luna_serve_queue_requests gauge\nluna_serve_queue_requests %zu\n"
        "# HELP luna_serve_running_requests Requests being translated.\n"
        "# TYPE luna_serve_running_requests gauge\nluna_serve_running_requests %zu\n"
        "# HELP luna_serve_in_flight_requests Requests received and not yet answered.\n"
        "# TYPE luna_serve_in_flight_requests gauge\nluna_serve_in_flight_requests %ld\n"
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
        "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %ld\n",
        queue_sentences, queue_requests, running_requests, m->in_flight, rss);
    pthread_mutex_unlock(&m->lock);
    if (t.failed) {
        free(t.data);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory rendering the metrics");
    }
    *out = t.data;
    *length = t.length;
    return LUNA_OK;
}
