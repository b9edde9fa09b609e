/* luna-serve's queue and batching worker (batcher.h). */
#include "tools/serve/batcher.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_FINISHED, JOB_FAILED, JOB_EXPIRED } job_state;

struct serve_job {
    serve_request req;
    serve_translation *out; /* [req.count] when finished */
    char error[512];
    job_state state;
    int refs; /* the waiter, and the queue or the worker while they hold it */
    size_t cost;
    double submitted, started, finished, deadline;
    serve_client *client;
    serve_job *next;
};

struct serve_client {
    bool busy;        /* a request on the connection has begun and not ended */
    bool waiting_job; /* ... and its job is queued or being translated */
    double last_end;  /* when its last request ended (0: none yet) */
    serve_client *prev, *next;
};

struct serve_batcher {
    serve_engine *const *engines; /* one per worker */
    int workers;
    serve_metrics *metrics;
    serve_batcher_config config;
    pthread_mutex_t lock;
    pthread_cond_t work; /* the worker: a job arrived, a client left, or stop */
    pthread_cond_t done; /* the waiters: some job changed state */
    struct worker_arg {
        serve_batcher *b;
        serve_engine *engine;
        pthread_t thread;
    } * threads;
    int started; /* threads running */
    bool stopping, joined;
    serve_job *head, *tail;
    size_t queued_sentences, queued_jobs, running_jobs;
    serve_client *clients;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct timespec at(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return ts;
}

/* ---- clients: who is expected to send a request soon ------------------------------------------
 */

serve_client *serve_client_open(serve_batcher *b) {
    serve_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_lock(&b->lock);
    c->next = b->clients;
    if (b->clients) b->clients->prev = c;
    b->clients = c;
    pthread_mutex_unlock(&b->lock);
    return c;
}

void serve_client_close(serve_batcher *b, serve_client *c) {
    if (!c) return;
    pthread_mutex_lock(&b->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        b->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_cond_signal(&b->work);
    pthread_mutex_unlock(&b->lock);
    free(c);
}

void serve_client_request_begin(serve_batcher *b, serve_client *c) {
    if (!c) return;
    pthread_mutex_lock(&b->lock);
    c->busy = true;
    pthread_mutex_unlock(&b->lock);
}

void serve_client_request_end(serve_batcher *b, serve_client *c) {
    if (!c) return;
    pthread_mutex_lock(&b->lock);
    c->busy = false;
    c->last_end = now();
    pthread_mutex_unlock(&b->lock);
}

/* Clients that may send a job soon (batcher.h); called with the lock held. */
static size_t expected_clients(const serve_batcher *b, double t) {
    const double recent = b->config.max_wait_ms / 1000.0;
    size_t n = 0;
    for (const serve_client *c = b->clients; c; c = c->next)
        if (c->busy ? !c->waiting_job : (c->last_end > 0 && t - c->last_end < recent)) n++;
    return n;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static void job_drop(serve_job *j) { /* lock held, or the job is private */
    if (--j->refs > 0) return;
    for (size_t i = 0; j->out && i < j->req.count; i++)
        serve_translation_release(&j->out[i]);
    free(j->out);
    serve_request_release(&j->req);
    free(j);
}

void serve_job_release(serve_batcher *b, serve_job *job) {
    if (!job) return;
    pthread_mutex_lock(&b->lock);
    job_drop(job);
    pthread_mutex_unlock(&b->lock);
}

const serve_translation *serve_job_translations(const serve_job *job, size_t *count) {
    *count = job->req.count;
    return job->out;
}

const char *serve_job_error(const serve_job *job) { return job->error; }

void serve_job_times(const serve_job *job, double *queued_s, double *decode_s) {
    *queued_s = job->started > 0 ? job->started - job->submitted : 0;
    *decode_s = job->finished > 0 ? job->finished - job->started : 0;
}

static void unlink_job(serve_batcher *b, serve_job *j) { /* lock held; j is queued */
    serve_job **p = &b->head, *prev = NULL;
    while (*p && *p != j)
        prev = *p, p = &(*p)->next;
    if (!*p) return;
    *p = j->next;
    if (b->tail == j) b->tail = prev;
    j->next = NULL;
    b->queued_sentences -= j->req.count;
    b->queued_jobs--;
}

/* A job leaves the queue without being translated: lock held. */
static void expire(serve_batcher *b, serve_job *j) {
    unlink_job(b, j);
    j->state = JOB_EXPIRED;
    if (j->client) j->client->waiting_job = false;
    job_drop(j); /* the queue's reference */
    pthread_cond_broadcast(&b->done);
}

/* ---- the worker ------------------------------------------------------------------------------ */

typedef struct {
    serve_job **jobs;
    size_t count, capacity, sentences, tokens;
} batch;

static bool batch_add(batch *bt, serve_job *j) {
    if (bt->count == bt->capacity) {
        size_t cap = bt->capacity ? 2 * bt->capacity : 16;
        serve_job **g = realloc(bt->jobs, cap * sizeof *g);
        if (!g) return false;
        bt->jobs = g, bt->capacity = cap;
    }
    bt->jobs[bt->count++] = j;
    bt->sentences += j->req.count;
    bt->tokens += j->cost;
    return true;
}

/* Move the queued jobs that fit (same search, within the token budget) into the batch; lock
 * held. Returns false when the budget is used up or a compatible job had to be left behind. */
static bool gather(serve_batcher *b, batch *bt) {
    const serve_search *s = &bt->jobs[0]->req.search;
    bool room = true;
    for (serve_job *j = b->head, *next; j; j = next) {
        next = j->next;
        if (j->state != JOB_QUEUED || !serve_search_equal(&j->req.search, s)) continue;
        if (bt->tokens + j->cost > b->config.max_batch_tokens) {
            room = false;
            continue;
        }
        unlink_job(b, j);
        if (!batch_add(bt, j)) { /* out of memory: it stays queued for the next batch */
            j->next = b->head, b->head = j;
            if (!b->tail) b->tail = j;
            b->queued_sentences += j->req.count, b->queued_jobs++;
            return false;
        }
        j->state = JOB_RUNNING;
    }
    return room && bt->tokens < b->config.max_batch_tokens;
}

/* Run one batch outside the lock and hand out the translations. */
static void run_batch(serve_batcher *b, serve_engine *engine, batch *bt) {
    const double t0 = now();
    const char **sent = malloc((bt->sentences + 1) * sizeof *sent);
    size_t *len = malloc((bt->sentences + 1) * sizeof *len);
    serve_translation *out = calloc(bt->sentences + 1, sizeof *out);
    size_t tokens = 0, k = 0;
    luna_status st = LUNA_ERR_OUT_OF_MEMORY;
    char message[512] = "out of memory for a batch";
    if (sent && len && out) {
        for (size_t i = 0; i < bt->count; i++)
            for (size_t s = 0; s < bt->jobs[i]->req.count; s++, k++) {
                sent[k] = bt->jobs[i]->req.sentences[s];
                len[k] = bt->jobs[i]->req.lengths[s];
            }
        st = serve_engine_translate(engine, &bt->jobs[0]->req.search, sent, len, k, out, &tokens);
        if (st != LUNA_OK) snprintf(message, sizeof message, "%s", luna_error_message());
    }
    const double t1 = now();
    if (b->metrics && st == LUNA_OK)
        serve_metrics_batch(b->metrics, bt->count, bt->sentences, tokens, t1 - t0);
    pthread_mutex_lock(&b->lock);
    k = 0;
    for (size_t i = 0; i < bt->count; i++) {
        serve_job *j = bt->jobs[i];
        j->started = t0, j->finished = t1;
        if (st == LUNA_OK) {
            j->out = calloc(j->req.count + 1, sizeof *j->out);
            if (j->out)
                memcpy(j->out, out + k, j->req.count * sizeof *out);
            else
                for (size_t s = 0; s < j->req.count; s++)
                    serve_translation_release(&out[k + s]);
        }
        k += j->req.count;
        j->state = st == LUNA_OK && j->out ? JOB_FINISHED : JOB_FAILED;
        if (j->state == JOB_FAILED)
            snprintf(j->error, sizeof j->error, "%s", st == LUNA_OK ? "out of memory" : message);
        if (j->client) j->client->waiting_job = false;
        job_drop(j); /* the worker's reference */
    }
    pthread_cond_broadcast(&b->done);
    pthread_mutex_unlock(&b->lock);
    free(sent), free(len), free(out);
}

static void *worker(void *arg) {
    serve_batcher *b = ((struct worker_arg *)arg)->b;
    serve_engine *engine = ((struct worker_arg *)arg)->engine;
    batch bt = {0};
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stopping)
            pthread_cond_wait(&b->work, &b->lock);
        if (!b->head) break; /* stopping, and nothing left */
        const double t = now();
        serve_job *first = b->head;
        if (first->deadline <= t) {
            expire(b, first);
            continue;
        }
        bt.count = bt.sentences = bt.tokens = 0;
        unlink_job(b, first);
        if (!batch_add(&bt, first)) { /* out of memory: fail this job, keep serving */
            first->state = JOB_FAILED;
            snprintf(first->error, sizeof first->error, "out of memory for a batch");
            if (first->client) first->client->waiting_job = false;
            job_drop(first);
            pthread_cond_broadcast(&b->done);
            continue;
        }
        first->state = JOB_RUNNING;
        /* From when the worker is free, not from the oldest arrival: jobs queued during the
         * previous batch would otherwise leave at once without the clients just answered. */
        const double close_at = t + b->config.max_wait_ms / 1000.0;
        while (gather(b, &bt) && !b->stopping) {
            const double t2 = now();
            if (t2 >= close_at || expected_clients(b, t2) == 0) break;
            const struct timespec until = at(close_at);
            pthread_cond_timedwait(&b->work, &b->lock, &until);
        }
        b->running_jobs += bt.count;
        pthread_mutex_unlock(&b->lock);
        run_batch(b, engine, &bt);
        pthread_mutex_lock(&b->lock);
        b->running_jobs -= bt.count;
    }
    pthread_mutex_unlock(&b->lock);
    free(bt.jobs);
    return NULL;
}

/* ---- the public side ------------------------------------------------------------------------- */

luna_status serve_batcher_create(serve_batcher **out, serve_engine *const *engines, int workers,
                                 serve_metrics *metrics, const serve_batcher_config *config) {
    serve_batcher *b = calloc(1, sizeof *b);
    if (!b || !(b->threads = calloc((size_t)workers, sizeof *b->threads))) {
        free(b);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory for the batcher");
    }
    b->engines = engines, b->workers = workers, b->metrics = metrics, b->config = *config;
    pthread_condattr_t ca;
    bool ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
    ok = ok && pthread_mutex_init(&b->lock, NULL) == 0;
    ok = ok && pthread_cond_init(&b->work, &ca) == 0;
    ok = ok && pthread_cond_init(&b->done, &ca) == 0;
    pthread_condattr_destroy(&ca);
    for (int i = 0; ok && i < workers; i++, b->started++) {
        b->threads[i] = (struct worker_arg){.b = b, .engine = engines[i]};
        ok = pthread_create(&b->threads[i].thread, NULL, worker, &b->threads[i]) == 0;
    }
    if (!ok) {
        serve_batcher_free(b); /* joins the workers that started */
        return luna_error(LUNA_ERR_INTERNAL, "cannot start the batching threads");
    }
    *out = b;
    return LUNA_OK;
}

void serve_batcher_stop(serve_batcher *b) {
    pthread_mutex_lock(&b->lock);
    b->stopping = true;
    pthread_cond_broadcast(&b->work);
    const bool join = !b->joined;
    b->joined = true;
    pthread_mutex_unlock(&b->lock);
    for (int i = 0; join && i < b->started; i++)
        pthread_join(b->threads[i].thread, NULL);
}

void serve_batcher_free(serve_batcher *b) {
    if (!b) return;
    serve_batcher_stop(b);
    while (b->clients) {
        serve_client *c = b->clients;
        b->clients = c->next;
        free(c);
    }
    pthread_cond_destroy(&b->work);
    pthread_cond_destroy(&b->done);
    pthread_mutex_destroy(&b->lock);
    free(b->threads);
    free(b);
}

void serve_batcher_depth(serve_batcher *b, size_t *sentences, size_t *jobs, size_t *running) {
    pthread_mutex_lock(&b->lock);
    *sentences = b->queued_sentences;
    *jobs = b->queued_jobs;
    *running = b->running_jobs;
    pthread_mutex_unlock(&b->lock);
}

serve_job_outcome serve_batcher_translate(serve_batcher *b, serve_client *client,
                                          serve_request *request, serve_job **out) {
    *out = NULL;
    serve_job *j = calloc(1, sizeof *j);
    if (!j) {
        serve_request_release(request);
        return SERVE_JOB_FAILED;
    }
    *out = j;
    j->req = *request;
    memset(request, 0, sizeof *request);
    j->refs = 1;
    j->submitted = now();
    j->deadline = j->submitted + (double)j->req.timeout_ms / 1000.0;
    j->client = client;
    for (size_t i = 0; i < j->req.count; i++)
        j->cost += serve_engine_cost(b->engines[0], j->req.sentences[i], j->req.lengths[i],
                                     j->req.search.pieces);
    if (j->req.count == 0) { /* nothing to translate */
        j->out = calloc(1, sizeof *j->out);
        j->state = j->out ? JOB_FINISHED : JOB_FAILED;
        snprintf(j->error, sizeof j->error, "out of memory");
        return j->out ? SERVE_JOB_DONE : SERVE_JOB_FAILED;
    }
    pthread_mutex_lock(&b->lock);
    if (b->stopping) {
        pthread_mutex_unlock(&b->lock);
        return SERVE_JOB_SHUTTING_DOWN;
    }
    if (b->queued_sentences + j->req.count > b->config.max_queue_sentences) {
        pthread_mutex_unlock(&b->lock);
        return SERVE_JOB_QUEUE_FULL;
    }
    j->refs = 2;
    j->state = JOB_QUEUED;
    if (b->tail)
        b->tail->next = j;
    else
        b->head = j;
    b->tail = j;
    b->queued_sentences += j->req.count;
    b->queued_jobs++;
    if (client) client->waiting_job = true;
    pthread_cond_signal(&b->work);
    const struct timespec until = at(j->deadline);
    while (j->state == JOB_QUEUED || j->state == JOB_RUNNING) {
        if (pthread_cond_timedwait(&b->done, &b->lock, &until) == ETIMEDOUT &&
            (j->state == JOB_QUEUED || j->state == JOB_RUNNING)) {
            if (j->state == JOB_QUEUED) {
                expire(b, j);
            } else {
                /* The worker finishes it and drops the result; the connection may close before,
                 * so the job forgets it. */
                j->state = JOB_EXPIRED;
                if (client) client->waiting_job = false;
                j->client = NULL;
            }
            break;
        }
    }
    const job_state st = j->state;
    pthread_mutex_unlock(&b->lock);
    return st == JOB_FINISHED  ? SERVE_JOB_DONE
           : st == JOB_EXPIRED ? SERVE_JOB_EXPIRED
                               : SERVE_JOB_FAILED;
}
