/* luna-serve's request queue and its worker threads, which translate the sentences of concurrent
 * requests together (one worker by default; each has its own translator, so with several, batches
 * run side by side).
 *
 * Every POST /translate becomes a job (its sentences and search options) in one FIFO queue. The
 * first free worker takes the oldest job and adds the later ones with the same search options
 * (serve_search_equal) while the batch stays within max_batch_tokens source tokens (estimated by
 * the engine; a job larger than that runs alone), then translates them in one engine call. It
 * waits for more jobs to join at most max_wait_ms from when it is free, and not at all
 * when no other client is expected: a client counts as expected while it has a request in
 * progress that is not in the queue (its body is still arriving, or its previous answer is
 * still being sent) or when its previous request ended less than max_wait_ms ago on a
 * connection still open (a client in a request loop); only POST /translate requests count. So
 * a lone client's request starts at once, and closed-loop clients that are answered together are
 * batched together again.
 *
 * Backpressure: a job that would take the queue over max_queue_sentences is refused (the caller
 * answers 503). Deadlines: a job still queued at its deadline is taken out and fails as expired
 * (504); one already being translated when its waiter gives up finishes and is dropped.
 * serve_batcher_stop refuses new jobs, lets the worker finish every queued one, and joins it.
 *
 * Thread safety: every function may be called from any thread (one mutex; an engine runs outside
 * it, only ever on its worker's thread, so each translator sees one caller). */
#ifndef LUNA_SERVE_BATCHER_H
#define LUNA_SERVE_BATCHER_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "tools/serve/engine.h"
#include "tools/serve/metrics.h"
#include "tools/serve/request.h"

typedef struct {
    size_t max_batch_tokens;    /* source tokens per engine call */
    double max_wait_ms;         /* longest wait for a batch to fill */
    size_t max_queue_sentences; /* queued (not yet running) sentences */
} serve_batcher_config;

typedef struct serve_batcher serve_batcher;
typedef struct serve_job serve_job;
typedef struct serve_client serve_client;

typedef enum {
    SERVE_JOB_DONE = 0,
    SERVE_JOB_QUEUE_FULL,    /* refused at submission: 503 */
    SERVE_JOB_SHUTTING_DOWN, /* refused at submission: 503 */
    SERVE_JOB_EXPIRED,       /* the deadline passed: 504 */
    SERVE_JOB_FAILED,        /* the engine failed: 500, message in serve_job_error */
} serve_job_outcome;

/* `workers` threads, each translating with its own engines[i] (borrowed: they must outlive the
 * batcher); metrics may be NULL. */
luna_status serve_batcher_create(serve_batcher **out, serve_engine *const *engines, int workers,
                                 serve_metrics *metrics, const serve_batcher_config *config);
/* Stop (serve_batcher_stop) and free. */
void serve_batcher_free(serve_batcher *b);
/* Refuse new jobs, finish the queued ones, join the worker. Idempotent. */
void serve_batcher_stop(serve_batcher *b);

/* A connection (for the "expected" rule above); NULL when out of memory, which only loses the
 * prediction. Close it when the connection closes. */
serve_client *serve_client_open(serve_batcher *b);
void serve_client_close(serve_batcher *b, serve_client *c);
/* A request on this connection starts (its headers arrived) / ends (its answer was sent). */
void serve_client_request_begin(serve_batcher *b, serve_client *c);
void serve_client_request_end(serve_batcher *b, serve_client *c);

/* Queue the request's sentences (the job takes over `request`'s contents) and wait until they
 * are translated or `request->timeout_ms` has passed since the call. On DONE, *job holds the
 * translations (serve_job_translations); release it with serve_job_release in every case where
 * it is non-NULL. */
serve_job_outcome serve_batcher_translate(serve_batcher *b, serve_client *client,
                                          serve_request *request, serve_job **job);
const serve_translation *serve_job_translations(const serve_job *job, size_t *count);
const char *serve_job_error(const serve_job *job);
/* Seconds from submission until the worker started / finished the job's batch. */
void serve_job_times(const serve_job *job, double *queued_s, double *decode_s);
void serve_job_release(serve_batcher *b, serve_job *job);

/* Right now: queued sentences and jobs, and jobs being translated. */
void serve_batcher_depth(serve_batcher *b, size_t *sentences, size_t *jobs, size_t *running);

#endif
