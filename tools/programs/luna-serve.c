/* luna-serve: translate over HTTP with a checkpoint kept loaded; requests from concurrent clients
 * are translated together (tools/serve/batcher.h).
 *
 *   luna-serve CHECKPOINT [--host 127.0.0.1] [--port 8080] [--threads 2] ...
 *
 * Endpoints (tools/serve/http.h): POST /translate (JSON, tools/serve/request.h), GET /health,
 * GET /metrics (Prometheus text), GET / (a web page to try translations). Once listening it
 * prints "luna-serve: listening on http://HOST:PORT/" on stdout (--port 0: a free port, named
 * there). SIGTERM or SIGINT: stop accepting, answer every request already received, exit 0.
 *
 * Exit status: 0 after a signal, 1 when the checkpoint cannot be loaded or the address bound (one
 * line on stderr), 2 usage error.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/options_registry.h"
#include "tools/programs/program_start.h"
#include "tools/serve/batcher.h"
#include "tools/serve/engine.h"
#include "tools/serve/http.h"
#include "tools/serve/metrics.h"
#include "tools/serve/page.h"

#define PROG "luna-serve"

typedef struct {
    const char *checkpoint, *host, *device;
    int64_t port, threads, max_batch_tokens, max_queue, max_sentences, max_sentence_bytes,
        max_body_bytes, timeout_ms, connection_limit, connection_timeout, beam, max_beam, max_len_b,
        max_input_tokens, batch_size, workers;
    double max_wait_ms, lenpen;
} options;

static options opt;

#define F(field) offsetof(options, field)
#define G_NET "network"
#define G_BATCH "batching and limits"
#define G_SEARCH "search defaults (a request may set its own)"
#define G_RUN "runtime"

/* clang-format off */
static const luna_option_spec OPTIONS[] = {
    {"--host", LUNA_OPT_STRING, "127.0.0.1", G_NET, "ADDR", NULL, F(host), "address to listen on (0.0.0.0 or :: for every interface: the server has no authentication)"},
    {"--port", LUNA_OPT_INT, "8080", G_NET, "N", NULL, F(port), "TCP port (0: any free port, printed at start)"},
    {"--connection-limit", LUNA_OPT_INT, "256", G_NET, "N", NULL, F(connection_limit), "open connections at once (one thread each); more are refused"},
    {"--connection-timeout", LUNA_OPT_INT, "30", G_NET, "S", NULL, F(connection_timeout), "close a connection idle for S seconds (also a body that stalls)"},
    {"--max-batch-tokens", LUNA_OPT_INT, "4096", G_BATCH, "N", NULL, F(max_batch_tokens), "source tokens (estimated) translated together in one batch"},
    {"--max-wait-ms", LUNA_OPT_DOUBLE, "10", G_BATCH, "MS", NULL, F(max_wait_ms), "longest wait for other clients' requests to fill a batch (none when no other client is expected)"},
    {"--max-queue", LUNA_OPT_INT, "1024", G_BATCH, "N", NULL, F(max_queue), "queued sentences; a request that does not fit gets 503 with Retry-After"},
    {"--max-sentences", LUNA_OPT_INT, "64", G_BATCH, "N", NULL, F(max_sentences), "sentences per request (more: 413)"},
    {"--max-sentence-bytes", LUNA_OPT_INT, "4096", G_BATCH, "N", NULL, F(max_sentence_bytes), "bytes per sentence (more: 413)"},
    {"--max-body-bytes", LUNA_OPT_INT, "1048576", G_BATCH, "N", NULL, F(max_body_bytes), "bytes of a request body (more: 413)"},
    {"--timeout-ms", LUNA_OPT_INT, "30000", G_BATCH, "MS", NULL, F(timeout_ms), "a request not translated within MS gets 504; a request's \"timeout_ms\" may only be shorter"},
    {"--beam", LUNA_OPT_INT, "4", G_SEARCH, "N", NULL, F(beam), "beam size (\"beam_size\")"},
    {"--max-beam", LUNA_OPT_INT, "16", G_SEARCH, "N", NULL, F(max_beam), "the largest \"beam_size\" a request may ask for"},
    {"--lenpen", LUNA_OPT_DOUBLE, "0.6", G_SEARCH, "F", NULL, F(lenpen), "length penalty (\"length_penalty\")"},
    {"--max-len-b", LUNA_OPT_INT, "200", G_SEARCH, "N", NULL, F(max_len_b), "longest translation in tokens (\"max_length\", 1..1022)"},
    {"--max-input-tokens", LUNA_OPT_INT, "1024", G_SEARCH, "N", NULL, F(max_input_tokens), "longer sentences are truncated (subword tokens incl. </s>), as by luna-translate"},
    {"--device", LUNA_OPT_CHOICE, "cpu", G_RUN, "D", "cpu|cuda", F(device), "where to translate"},
    {"--threads", LUNA_OPT_INT, "2", G_RUN, "N", NULL, F(threads), "CPU threads of each translator"},
    {"--workers", LUNA_OPT_INT, "1", G_RUN, "N", NULL, F(workers), "translators (each with --threads threads; on the CPU they share one copy of the model), translating batches side by side"},
    {"--batch-size", LUNA_OPT_INT, "128", G_RUN, "N", NULL, F(batch_size), "sentences searched together within a batch (luna-translate's --batch-size; 0: no limit)"},
};
/* clang-format on */

static const luna_option_table TABLE = {
    .specs = OPTIONS,
    .count = (int)(sizeof OPTIONS / sizeof OPTIONS[0]),
    .positional = "CHECKPOINT",
    .positional_offset = F(checkpoint),
};

static const char USAGE[] =
    "usage: " PROG " CHECKPOINT [--host ADDR] [--port N] [--threads N] [options]\n\n"
    "Serves translations with a checkpoint written by luna-train or luna-average over HTTP;\n"
    "requests from concurrent clients are translated together in batches.\n\n"
    "  POST /translate  {\"sentences\": [\"...\"], \"beam_size\": 4, \"length_penalty\": 0.6,\n"
    "                   \"max_length\": 200, \"num_hypotheses\": 1, \"pieces\": false,\n"
    "                   \"timeout_ms\": 30000}  (all but sentences optional)\n"
    "                   -> {\"translations\": [{\"text\": \"...\", \"score\": -0.5}, ...],\n"
    "                       \"queue_ms\": 1.2, \"decode_ms\": 80.1}\n"
    "                   scores: base 2, as luna-translate's fairseq H- lines; num_hypotheses > 1\n"
    "                   adds \"hypotheses\": [{\"text\", \"score\"}, ...] to each translation\n"
    "  GET /health      {\"status\": \"ok\", ...}\n"
    "  GET /metrics     Prometheus text: requests, errors by kind, latency, tokens/s, queue\n"
    "  GET /            a web page to type or paste text and see its translation\n\n"
    "Errors are {\"error\": {\"kind\": ..., \"message\": ...}}: 400 malformed JSON or a bad "
    "member,\n"
    "413 too large (body, sentences, a sentence), 503 queue full (Retry-After) or stopping,\n"
    "504 deadline passed. Prints \"luna-serve: listening on http://HOST:PORT/\" when ready.\n"
    "SIGTERM/SIGINT: stop accepting, answer every request already received, exit 0.\n";

static int parse_args(int argc, char **argv) {
    int done = luna_options_parse_program(&TABLE, &opt, argc, argv, NULL, PROG, USAGE);
    if (done >= 0) return done;
    if (!opt.checkpoint)
        return luna_options_usage_error(PROG, "%s", "a CHECKPOINT argument is required");
    const struct {
        const char *name;
        int64_t value, lo, hi;
    } ranges[] = {{"--port", opt.port, 0, 65535},
                  {"--connection-limit", opt.connection_limit, 1, 65536},
                  {"--connection-timeout", opt.connection_timeout, 1, 86400},
                  {"--max-batch-tokens", opt.max_batch_tokens, 1, 1000000000},
                  {"--max-queue", opt.max_queue, 1, 1000000000},
                  {"--max-sentences", opt.max_sentences, 1, 1000000},
                  {"--max-sentence-bytes", opt.max_sentence_bytes, 1, 1000000000},
                  {"--max-body-bytes", opt.max_body_bytes, 2, 1000000000},
                  {"--timeout-ms", opt.timeout_ms, 1, 86400000},
                  {"--max-beam", opt.max_beam, 1, 1024},
                  {"--beam", opt.beam, 1, opt.max_beam},
                  {"--max-len-b", opt.max_len_b, 1, 1022},
                  {"--max-input-tokens", opt.max_input_tokens, 2, 1000000000},
                  {"--threads", opt.threads, 1, 1024},
                  {"--workers", opt.workers, 1, 64},
                  {"--batch-size", opt.batch_size, 0, 1000000000}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (ranges[i].value < ranges[i].lo || ranges[i].value > ranges[i].hi)
            return luna_options_usage_error(PROG, "%s must be in %lld..%lld (got %lld)",
                                            ranges[i].name, (long long)ranges[i].lo,
                                            (long long)ranges[i].hi, (long long)ranges[i].value);
    if (opt.max_sentences > opt.max_queue)
        return luna_options_usage_error(PROG,
                                        "--max-sentences (%lld) must not exceed --max-queue "
                                        "(%lld): such a request could never be queued",
                                        (long long)opt.max_sentences, (long long)opt.max_queue);
    if (!(opt.max_wait_ms >= 0 && opt.max_wait_ms <= 10000))
        return luna_options_usage_error(PROG, "--max-wait-ms must be in 0..10000 (got %g)",
                                        opt.max_wait_ms);
    if (!(opt.lenpen >= -10 && opt.lenpen <= 10))
        return luna_options_usage_error(PROG, "--lenpen must be in -10..10 (got %g)", opt.lenpen);
    return -1;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* SIGTERM/SIGINT reach whichever thread does not block them (OpenBLAS starts its threads
 * before main, with every signal open), so a handler, not sigwait, takes them: the first one is
 * written to a pipe that the main thread waits on; a second one while draining exits at once. */
static int signal_pipe[2] = {-1, -1};
static volatile sig_atomic_t signals_seen;

static void on_signal(int sig) {
    if (signals_seen++) {
        static const char msg[] = PROG ": second signal: exiting without finishing\n";
        if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) _exit(1);
        _exit(1);
    }
    const char c = (char)sig;
    if (write(signal_pipe[1], &c, 1) < 0) _exit(1);
}

static luna_status catch_signals(void) {
    if (pipe(signal_pipe) != 0)
        return luna_error(LUNA_ERR_INTERNAL, "cannot create a pipe: %s", strerror(errno));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that disconnects must not end the server */
    return LUNA_OK;
}

static int wait_for_signal(void) {
    char c = 0;
    while (read(signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    return c;
}

/* Serve until SIGTERM/SIGINT. */
static luna_status serve(serve_engine *const *engines, serve_metrics *metrics) {
    serve_batcher *batcher = NULL;
    const serve_batcher_config bc = {.max_batch_tokens = (size_t)opt.max_batch_tokens,
                                     .max_wait_ms = opt.max_wait_ms,
                                     .max_queue_sentences = (size_t)opt.max_queue};
    LUNA_TRY(serve_batcher_create(&batcher, engines, (int)opt.workers, metrics, &bc));
    serve_http_config hc = {
        .host = opt.host,
        .port = (int)opt.port,
        .max_body_bytes = (size_t)opt.max_body_bytes,
        .connection_limit = (unsigned)opt.connection_limit,
        .connection_timeout_s = (unsigned)opt.connection_timeout,
        .limits = {.max_sentences = (size_t)opt.max_sentences,
                   .max_sentence_bytes = (size_t)opt.max_sentence_bytes,
                   .max_beam_size = (int)opt.max_beam,
                   .max_timeout_ms = opt.timeout_ms,
                   .default_timeout_ms = opt.timeout_ms,
                   .defaults = {.beam_size = (int)opt.beam,
                                .length_penalty = opt.lenpen,
                                .max_length = (int)opt.max_len_b,
                                .num_hypotheses = 1,
                                .pieces = false}},
        .model_name = base_name(opt.checkpoint),
        .page = (const char *)serve_page_html,
        .page_length = serve_page_html_length,
    };
    serve_http *http = NULL;
    luna_status st = serve_http_start(&http, &hc, batcher, metrics);
    if (st != LUNA_OK) {
        serve_batcher_free(batcher);
        return st;
    }
    const bool v6 = strchr(opt.host, ':') != NULL;
    printf(PROG ": listening on http://%s%s%s:%d/ (%s, %lld worker%s of %lld threads)\n",
           v6 ? "[" : "", opt.host, v6 ? "]" : "", serve_http_port(http), base_name(opt.checkpoint),
           (long long)opt.workers, opt.workers > 1 ? "s" : "", (long long)opt.threads);
    fflush(stdout);
    const int sig = wait_for_signal();
    fprintf(stderr, PROG ": %s: no new requests; finishing the ones received\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* Every request has a deadline, so in-flight work ends by the longest one; a body still
     * arriving is bounded by the connection timeout. */
    const double wait = (double)opt.timeout_ms / 1000.0 + (double)opt.connection_timeout + 5;
    const int left = serve_http_drain(http, wait);
    serve_batcher_stop(batcher);
    serve_http_stop(http);
    serve_batcher_free(batcher);
    if (left > 0)
        fprintf(stderr, PROG ": %d requests were still unanswered after %.0f s\n", left, wait);
    fprintf(stderr, PROG ": stopped\n");
    return LUNA_OK;
}

int main(int argc, char **argv) {
    luna_program_start(PROG, argv);
    int rc = parse_args(argc, argv);
    if (rc >= 0) return rc;
    serve_engine *engines[64] = {NULL};
    serve_metrics *metrics = NULL;
    const serve_engine_options eo = {.checkpoint = opt.checkpoint,
                                     .device = opt.device,
                                     .threads = (int)opt.threads,
                                     .max_input_tokens = (int)opt.max_input_tokens,
                                     .batch_sentences = (int)opt.batch_size};
    luna_status st = catch_signals();
    if (st == LUNA_OK) st = serve_metrics_create(&metrics);
    if (st == LUNA_OK) st = serve_engine_create(&engines[0], &eo);
    for (int i = 1; st == LUNA_OK && i < opt.workers; i++) /* one copy of the model for all */
        st = serve_engine_clone(&engines[i], engines[0]);
    if (st == LUNA_OK) st = serve(engines, metrics);
    for (int i = 0; i < opt.workers; i++)
        serve_engine_free(engines[i]);
    serve_metrics_free(metrics);
    if (st != LUNA_OK) {
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 1;
    }
    return 0;
}
