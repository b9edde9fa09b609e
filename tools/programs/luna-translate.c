/* luna-translate: translate raw text with a checkpoint (which carries its SentencePiece model and
 * dictionaries), like fairseq-interactive/-generate.
 *
 *   luna-translate CHECKPOINT [--input FILE] [--beam 4] [--lenpen 0.6] [--nbest 1] ...
 *
 * Input: one sentence per line (stdin when there is no --input). The whole input is read and
 * checked before anything is translated: invalid UTF-8 (or a NUL byte) is an error naming the
 * line and byte (nothing is written); an empty or blank line gives an empty translation; a line
 * longer than --max-input-tokens subword tokens (</s> included) is truncated with a warning on
 * stderr. Sentences are translated in batches sorted by length and printed in input order.
 *
 * Output: --output-format plain: the detokenized best translation per line; fairseq: for each
 * input i (with --nbest hypotheses) the tab-separated lines of fairseq-generate
 *   S-i <source pieces>;  H-i <score> <pieces>;  D-i <score> <detokenized>;  P-i <per-token scores>
 * with scores in base 2 (score = Σ log2 p / len^lenpen; len counts </s>).
 * --score-reference --reference FILE: instead of searching, score the given translations
 * (plain: one base-2 per-token average score per line; fairseq: S/T/H/P lines).
 * fairseq's --no-repeat-ngram-size, --sampling (--sampling-topk, --seed) and --temperature change
 * the search (decoding/beam_search.h, decoding/sampling.h).
 * Documents (a model trained on luna-preprocess --document-window data, whose dictionary has
 * <sep>): an input line of sentences joined by " <sep> " is translated as one sequence, and the
 * plain output splits the translation at the <sep> tokens back into one line per input sentence
 * (missing ones empty, extra ones joined to the last line).
 *
 * --workers W translates W parts of the input side by side, each with its own decoder state over
 * one shared copy of the model (decoding/translate_workers.h): the throughput configuration of a
 * multi-core CPU.
 *
 * Exit status: 0 success, 1 bad input or failure (one line on stderr), 2 usage error.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/cpu/held_int8.h"
#include "core/options_registry.h"
#include "decoding/text_translator.h"
#include "decoding/translate_workers.h"
#include "model/kernels/registry.h"
#include "tools/programs/program_start.h"

#define PROG "luna-translate"

/* ---- options: one registry table drives parsing and --help (core/options_registry.h) ---- */

typedef struct {
    const char *checkpoint, *input, *output_format, *device, *precision, *reference, *quantize;
    int64_t beam, max_len_b, min_len, nbest, max_tokens, batch_size, threads, workers,
        max_input_tokens, device_id;
    int64_t no_repeat_ngram_size, sampling_topk, seed, max_target_positions;
    double lenpen, max_len_a, unkpen, temperature;
    bool score_reference, quiet, tf32, sampling;
} options;

static options opt;

#define F(field) offsetof(options, field)
#define G_IO "input and output"
#define G_SEARCH "search"
#define G_SAMPLE "sampling (e.g. for back-translation)"
#define G_SCORE "scoring given translations"
#define G_RUN "batching and runtime"

/* clang-format off */
static const luna_option_spec OPTIONS[] = {
    {"--input", LUNA_OPT_STRING, NULL, G_IO, "FILE", NULL, F(input), "source sentences, one per line (default: stdin)"},
    {"--output-format", LUNA_OPT_STRING, "plain", G_IO, "FMT", NULL, F(output_format), "plain (detokenized best translation per line) or fairseq (S/H/D/P lines)"},
    {"--max-input-tokens", LUNA_OPT_INT, "1024", G_IO, "N", NULL, F(max_input_tokens), "truncate longer inputs (subword tokens incl. </s>) with a warning"},
    {"--quiet", LUNA_OPT_FLAG, NULL, G_IO, NULL, NULL, F(quiet), "no summary line on stderr"},
    {"--beam", LUNA_OPT_INT, "4", G_SEARCH, "N", NULL, F(beam), "beam size (1 = greedy)"},
    {"--lenpen", LUNA_OPT_DOUBLE, "0.6", G_SEARCH, "F", NULL, F(lenpen), "length penalty: score / len^F"},
    {"--max-len-a", LUNA_OPT_DOUBLE, "0", G_SEARCH, "F", NULL, F(max_len_a), "max length = F·source length + B"},
    {"--max-len-b", LUNA_OPT_INT, "200", G_SEARCH, "B", NULL, F(max_len_b), "see --max-len-a"},
    {"--max-target-positions", LUNA_OPT_INT, "1024", G_SEARCH, "N", NULL, F(max_target_positions), "translations are at most N - 1 tokens (fairseq's default 1024; raise it for documents: the sinusoidal positions have no limit)"},
    {"--min-len", LUNA_OPT_INT, "1", G_SEARCH, "N", NULL, F(min_len), "minimum target length, </s> excluded"},
    {"--nbest", LUNA_OPT_INT, "1", G_SEARCH, "N", NULL, F(nbest), "hypotheses per sentence (fairseq format)"},
    {"--unkpen", LUNA_OPT_DOUBLE, "0", G_SEARCH, "F", NULL, F(unkpen), "subtracted from <unk>'s log-prob"},
    {"--no-repeat-ngram-size", LUNA_OPT_INT, "0", G_SEARCH, "N", NULL, F(no_repeat_ngram_size), "a hypothesis never repeats one of its n-grams of N tokens (0: off)"},
    {"--temperature", LUNA_OPT_DOUBLE, "1", G_SEARCH, "T", NULL, F(temperature), "divide the logits by T > 0 before the softmax (search and sampling; hypothesis scores use it too)"},
    {"--sampling", LUNA_OPT_FLAG, NULL, G_SAMPLE, NULL, NULL, F(sampling), "sample each next token instead of beam search; --beam N draws N independent samples per sentence and the best-scoring ones are printed"},
    {"--sampling-topk", LUNA_OPT_INT, "-1", G_SAMPLE, "K", NULL, F(sampling_topk), "sample from the K most likely tokens only (-1 or 0: the whole vocabulary; K above the vocabulary size means all of it)"},
    {"--seed", LUNA_OPT_INT, "1", G_SAMPLE, "S", NULL, F(seed), "random seed of --sampling: the same seed gives the same samples (any --threads or batching)"},
    {"--score-reference", LUNA_OPT_FLAG, NULL, G_SCORE, NULL, NULL, F(score_reference), "score the --reference translations instead of searching"},
    {"--reference", LUNA_OPT_STRING, NULL, G_SCORE, "FILE", NULL, F(reference), "reference translations, one per line"},
    {"--max-tokens", LUNA_OPT_INT, "6000", G_RUN, "N", NULL, F(max_tokens), "padded source tokens per batch (0: no limit)"},
    {"--batch-size", LUNA_OPT_INT, "128", G_RUN, "N", NULL, F(batch_size), "sentences per batch (0: no limit)"},
    {"--device", LUNA_OPT_CHOICE, "cpu", G_RUN, "D", "cpu|cuda", F(device), "where to run"},
    {"--device-id", LUNA_OPT_INT, "-1", G_RUN, "N", NULL, F(device_id), "the GPU of --device cuda (-1: the first)"},
    {"--precision", LUNA_OPT_CHOICE, "auto", G_RUN, "P", "auto|fp32|bf16", F(precision), "activations on --device cuda (auto: fp32, the CPU's translations; bf16: faster)"},
    {"--tf32", LUNA_OPT_FLAG, NULL, G_RUN, NULL, NULL, F(tf32), "--device cuda --precision fp32: let GEMMs use TF32 tensor cores"},
    {"--threads", LUNA_OPT_INT, "2", G_RUN, "N", NULL, F(threads), "CPU threads (of each worker)"},
    {"--workers", LUNA_OPT_INT, "1", G_RUN, "W", NULL, F(workers), "translate W parts of the input side by side, W decoders on one copy of the model, each with --threads threads (--device cpu; throughput on W x threads cores, the same output)"},
    {"--quantize", LUNA_OPT_CHOICE, "none", G_RUN, "Q", "none|int8", F(quantize), "int8: quantize an fp32 checkpoint's weights to int8 at load (as luna-quantize would) and decode in int8 on the CPU; an int8 checkpoint decodes in int8 without it"},
};
/* clang-format on */

static const luna_option_table TABLE = {
    .specs = OPTIONS,
    .count = (int)(sizeof OPTIONS / sizeof OPTIONS[0]),
    .positional = "CHECKPOINT",
    .positional_offset = F(checkpoint),
};

static const char USAGE[] =
    "usage: " PROG " CHECKPOINT [--input FILE] [--beam N] [--lenpen F] [options]\n\n"
    "Translates raw text (stdin or --input) with a checkpoint written by luna-train or\n"
    "luna-average; the checkpoint's SentencePiece model and dictionaries are used.\n"
    "Translations are written to stdout in input order.\n";

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv) {
    int done = luna_options_parse_program(&TABLE, &opt, argc, argv, NULL, PROG, USAGE);
    if (done >= 0) return done;
    if (!opt.checkpoint)
        return luna_options_usage_error(PROG, "%s", "a CHECKPOINT argument is required");
    if (strcmp(opt.output_format, "plain") && strcmp(opt.output_format, "fairseq"))
        return luna_options_usage_error(PROG, "--output-format must be plain or fairseq, not '%s'",
                                        opt.output_format);
    const char *missing = luna_backend_missing(opt.device);
    if (missing)
        return luna_options_usage_error(PROG, "--device %s: %s; use --device cpu", opt.device,
                                        missing);
    luna_backend_options bo = luna_backend_options_default();
    if (luna_backend_options_set_precision(&bo, opt.device, opt.precision, opt.tf32, false) !=
            LUNA_OK ||
        luna_backend_options_set_device_id(&bo, opt.device, (long long)opt.device_id) != LUNA_OK)
        return luna_options_usage_error(PROG, "%s", luna_error_message());
    if (opt.beam < 1 || opt.beam > 1024)
        return luna_options_usage_error(PROG, "%s", "--beam must be in 1..1024");
    if (opt.nbest < 1 || opt.nbest > opt.beam)
        return luna_options_usage_error(PROG, "%s", "--nbest must be between 1 and --beam");
    if (opt.min_len < 0 || opt.max_len_b < 0 || opt.max_len_a < 0)
        return luna_options_usage_error(
            PROG, "%s", "--min-len, --max-len-a and --max-len-b must not be negative");
    if (opt.max_tokens < 0 || opt.batch_size < 0)
        return luna_options_usage_error(
            PROG, "%s", "--max-tokens and --batch-size must not be negative (0: no limit)");
    if (opt.threads < 1 || opt.threads > 1024)
        return luna_options_usage_error(PROG, "%s", "--threads must be in 1..1024");
    if (opt.workers < 1 || opt.workers > 64)
        return luna_options_usage_error(PROG, "%s", "--workers must be in 1..64");
    if (opt.workers > 1 && strcmp(opt.device, "cpu"))
        return luna_options_usage_error(PROG, "%s", "--workers needs --device cpu");
    if (opt.workers > 1 && opt.score_reference)
        return luna_options_usage_error(PROG, "%s",
                                        "--workers applies to translation, not --score-reference");
    if (opt.max_input_tokens < 2)
        return luna_options_usage_error(PROG, "%s", "--max-input-tokens must be at least 2");
    /* Passed on as int: larger values would wrap (2^32 + 5 into 5) instead of failing. */
    const struct {
        const char *name;
        int64_t value;
    } as_int[] = {{"--min-len", opt.min_len},
                  {"--max-len-b", opt.max_len_b},
                  {"--max-tokens", opt.max_tokens},
                  {"--batch-size", opt.batch_size},
                  {"--max-input-tokens", opt.max_input_tokens},
                  {"--max-target-positions", opt.max_target_positions}};
    for (size_t i = 0; i < sizeof as_int / sizeof as_int[0]; i++)
        if (as_int[i].value > 1000000000)
            return luna_options_usage_error(PROG, "%s must be at most 1000000000 (got %lld)",
                                            as_int[i].name, (long long)as_int[i].value);
    if (opt.max_target_positions < 2)
        return luna_options_usage_error(PROG, "%s", "--max-target-positions must be at least 2");
    if (!(opt.temperature > 0))
        return luna_options_usage_error(PROG, "--temperature must be positive (got %g)",
                                        opt.temperature);
    if (opt.no_repeat_ngram_size < 0 || opt.no_repeat_ngram_size > 1000000000)
        return luna_options_usage_error(PROG, "--no-repeat-ngram-size must be in 0..1000000000");
    if (opt.sampling_topk < -1 || opt.sampling_topk > 1000000000)
        return luna_options_usage_error(
            PROG, "%s", "--sampling-topk must be -1 or 0 (whole vocabulary) or in 1..1000000000");
    if (opt.sampling_topk > 0 && !opt.sampling)
        return luna_options_usage_error(PROG, "%s", "--sampling-topk needs --sampling");
    if (opt.seed < 0)
        return luna_options_usage_error(PROG, "--seed must not be negative (got %lld)",
                                        (long long)opt.seed);
    if (opt.sampling && opt.score_reference)
        return luna_options_usage_error(PROG, "%s",
                                        "--sampling and --score-reference exclude each other");
    if (opt.score_reference != (opt.reference != NULL))
        return luna_options_usage_error(PROG, "%s",
                                        "--score-reference and --reference FILE go together");
    return -1;
}

/* Python's repr of a float: the shortest digits that read back as the same double. */
static void print_float(FILE *f, double x) {
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eni")) strcat(buf, ".0");
    fputs(buf, f);
}

static void print_pieces(const luna_dictionary *d, const int32_t *t, int n) {
    for (int i = 0; i < n; i++) {
        if (i) putchar(' ');
        fputs(luna_dictionary_symbol(d, t[i]), stdout);
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

typedef struct {
    luna_text_translator *tr;
    luna_text_translator **workers; /* [opt.workers]: tr, then the other workers' */
    luna_text_input in, ref;
    luna_encoded_text src, tgt;
    luna_nbest *out;
    float **pos;
} program;

static void warn_truncated(void *ctx, const char *name, size_t lineno, int tokens, int max) {
    (void)ctx;
    fprintf(stderr,
            PROG ": warning: %s:%zu: %d subword tokens exceed --max-input-tokens %lld; "
                 "truncated to %lld\n",
            name, lineno, tokens, (long long)max, (long long)max);
}

static luna_status encode_all(program *p, const luna_text_input *t, const luna_dictionary *d,
                              bool truncate, const char *name, luna_encoded_text *out) {
    return luna_text_translator_encode(p->tr, d, (const char *const *)t->line, t->len, t->count,
                                       false, truncate ? (int)opt.max_input_tokens : 0, name,
                                       warn_truncated, NULL, out);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The process's CPU seconds (all threads): on a shared machine, what the decoding itself cost. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Whether stdout has lost output so far (every sentence checks, so a full disk stops the run at
 * once); `final` also flushes. A failed write sets the stream's error flag even when a later
 * flush has nothing left to write, so checking only the last fflush is not enough. */
static luna_status check_stdout(bool final) {
    /* errno is the failed write's: checked right after each sentence's writes. */
    if ((final && fflush(stdout) != 0) || ferror(stdout))
        return luna_error(LUNA_ERR_IO, "stdout: write error: %s (output is incomplete)",
                          errno ? strerror(errno) : "unknown error");
    return LUNA_OK;
}

static luna_status write_translations(program *p, size_t n) {
    const bool fs = !strcmp(opt.output_format, "fairseq");
    const luna_dictionary *sd = p->tr->src_dict, *td = p->tr->tgt_dict;
    for (size_t i = 0; i < n; i++) {
        const luna_nbest *nb = &p->out[i];
        if (fs) {
            printf("S-%zu\t", i);
            if (p->src.ids[i]) print_pieces(sd, p->src.ids[i], p->src.len[i] - 1);
            putchar('\n');
        }
        if (nb->count == 0 && !fs) putchar('\n');
        if (nb->count == 0 && fs) printf("H-%zu\t-inf\t\nD-%zu\t-inf\t\nP-%zu\t\n", i, i, i);
        for (int k = 0; k < (fs ? nb->count : (nb->count ? 1 : 0)); k++) {
            const luna_hypothesis *h = &nb->hyps[k];
            const int body = luna_hypothesis_body_len(h->tokens, h->len);
            char *d;
            if (!fs) {
                LUNA_TRY(luna_text_translator_hypothesis_text(p->tr, p->src.ids[i], p->src.len[i],
                                                              h, false, &d));
                printf("%s\n", d);
            } else {
                LUNA_TRY(luna_text_translator_detokenize(p->tr, td, h->tokens, body, false, &d));
                const double s2 = (float)(h->score / M_LN2);
                printf("H-%zu\t", i), print_float(stdout, s2), putchar('\t');
                print_pieces(td, h->tokens, body);
                printf("\nD-%zu\t", i), print_float(stdout, s2), printf("\t%s\nP-%zu\t", d, i);
                for (int t = 0; t < h->len; t++)
                    printf("%s%.4f", t ? " " : "", h->positional_scores[t] / M_LN2);
                putchar('\n');
            }
            free(d);
        }
        LUNA_TRY(check_stdout(false));
    }
    return check_stdout(true);
}

static luna_status write_scores(program *p, size_t n) {
    const bool fs = !strcmp(opt.output_format, "fairseq");
    const luna_dictionary *sd = p->tr->src_dict, *td = p->tr->tgt_dict;
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        const int len = p->tgt.ids[i] ? p->tgt.len[i] : 0;
        for (int t = 0; t < len; t++)
            sum += p->pos[i] ? p->pos[i][t] : 0;
        const double avg2 = len ? (float)(sum / len / M_LN2) : 0.0;
        if (!fs) {
            print_float(stdout, avg2), putchar('\n');
            LUNA_TRY(check_stdout(false));
            continue;
        }
        printf("S-%zu\t", i);
        if (p->src.ids[i]) print_pieces(sd, p->src.ids[i], p->src.len[i] - 1);
        printf("\nT-%zu\t", i);
        if (len) print_pieces(td, p->tgt.ids[i], len - 1);
        printf("\nH-%zu\t", i), print_float(stdout, avg2), putchar('\t');
        if (len) print_pieces(td, p->tgt.ids[i], len - 1);
        printf("\nP-%zu\t", i);
        for (int t = 0; t < len; t++)
            printf("%s%.4f", t ? " " : "", p->pos[i][t] / M_LN2);
        putchar('\n');
        LUNA_TRY(check_stdout(false));
    }
    return check_stdout(true);
}

static luna_status run(program *p) {
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = (int)opt.threads;
    bo.device_id = (int)opt.device_id;
    LUNA_TRY(luna_backend_options_set_precision(&bo, opt.device, opt.precision, opt.tf32, false));
    LUNA_TRY(luna_text_translator_create(&p->tr, opt.checkpoint, opt.device, &bo,
                                         strcmp(opt.quantize, "int8") == 0));
    if (!(p->workers = calloc((size_t)opt.workers, sizeof *p->workers)))
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    p->workers[0] = p->tr;
    for (int v = 1; v < opt.workers; v++) /* the model and its held panels shared, not copied */
        LUNA_TRY(luna_text_translator_clone(&p->workers[v], p->tr));
    if (!p->tr->spm && !opt.quiet)
        fprintf(stderr,
                PROG ": note: %s has no SentencePiece model (trained with --no-spm): the "
                     "input must already be tokenized; tokens are split on spaces\n",
                opt.checkpoint);
    LUNA_TRY(luna_text_input_read(opt.input, &p->in));
    const size_t n = p->in.count;
    if (opt.score_reference) {
        LUNA_TRY(luna_text_input_read(opt.reference, &p->ref));
        if (p->ref.count != n)
            return luna_error(LUNA_ERR_MISMATCH, "%s: %zu lines, but the input has %zu",
                              opt.reference, p->ref.count, n);
    }
    const char *in_name = opt.input ? opt.input : "<stdin>";
    LUNA_TRY(encode_all(p, &p->in, p->tr->src_dict, true, in_name, &p->src));
    if (opt.score_reference)
        LUNA_TRY(encode_all(p, &p->ref, p->tr->tgt_dict, false, opt.reference, &p->tgt));
    p->out = calloc(n + 1, sizeof *p->out);
    p->pos = calloc(n + 1, sizeof *p->pos);
    if (!p->out || !p->pos) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_status st;
    size_t k = 0;
    double t0 = now(), c0 = cpu_now();
    if (opt.score_reference) {
        st = luna_text_translator_score(p->tr, &p->src, &p->tgt, (int)opt.max_tokens,
                                        (int)opt.batch_size, p->pos, &k);
    } else {
        luna_beam_options o;
        luna_beam_options_init(&o);
        o.beam = (int)opt.beam;
        o.lenpen = opt.lenpen;
        o.max_len_a = opt.max_len_a;
        o.max_len_b = (int)opt.max_len_b;
        o.max_len_cap = (int)opt.max_target_positions - 1;
        o.min_len = (int)opt.min_len;
        o.nbest = (int)opt.nbest;
        o.unkpen = opt.unkpen;
        o.no_repeat_ngram_size = (int)opt.no_repeat_ngram_size;
        o.temperature = opt.temperature;
        o.sampling = opt.sampling;
        o.sampling_topk = (int)opt.sampling_topk;
        o.seed = (uint64_t)opt.seed;
        st = luna_translate_workers_generate(p->workers, (int)opt.workers, &o, &p->src,
                                             (int)opt.max_tokens, (int)opt.batch_size, p->out, &k);
    }
    const double secs = now() - t0, cpu_secs = cpu_now() - c0;
    long long tokens = 0;
    for (size_t i = 0; i < n && st == LUNA_OK; i++) {
        if (opt.score_reference)
            tokens += p->pos[i] ? p->tgt.len[i] : 0;
        else
            tokens += p->out[i].count ? p->out[i].hyps[0].len : 0;
    }
    if (st == LUNA_OK && !opt.quiet && opt.nbest > 1 && !strcmp(opt.output_format, "plain"))
        fprintf(stderr, PROG ": note: plain output shows the best hypothesis only; use "
                             "--output-format fairseq for the n-best list\n");
    if (st == LUNA_OK) st = opt.score_reference ? write_scores(p, n) : write_translations(p, n);
    /* the CPU's Linear kernel, said below: int8's, or the fp32 held weights' */
    const bool int8 = p->tr->model->params->weight_dtype == LUNA_I8;
    const bool cpu = p->tr->be->device == LUNA_DEVICE_CPU;
    char workers[32] = "";
    if (opt.workers > 1)
        snprintf(workers, sizeof workers, "%lld workers x ", (long long)opt.workers);
    if (st == LUNA_OK && !opt.quiet)
        fprintf(stderr,
                PROG ": %s %zu sentences (%zu empty) in %.2f s: %.2f sentences/s, %.1f target "
                     "tokens/s (beam %lld, %s%lld threads; %.2f s CPU%s%s)\n",
                opt.score_reference ? "scored" : "translated", n, n - k, secs,
                secs > 0 ? k / secs : 0.0, secs > 0 ? tokens / secs : 0.0, (long long)opt.beam,
                workers, (long long)opt.threads, cpu_secs,
                int8  ? ", int8 "
                : cpu ? ", fp32 "
                      : "",
                int8  ? luna_int8_kernel_name((luna_int8_kernel)luna_cpu_int8_kernel(p->tr->be))
                : cpu ? luna_cpu_f32_kernel_name(luna_cpu_f32_kernel(p->tr->be))
                      : "");
    return st;
}

static void program_free(program *p) {
    for (size_t i = 0; i < p->in.count; i++) {
        if (p->out) luna_nbest_release(&p->out[i]);
        if (p->pos) free(p->pos[i]);
    }
    free(p->out), free(p->pos);
    luna_encoded_text_release(&p->src);
    luna_encoded_text_release(&p->tgt);
    luna_text_input_release(&p->in);
    luna_text_input_release(&p->ref);
    for (int v = 1; p->workers && v < opt.workers; v++)
        luna_text_translator_free(p->workers[v]);
    free(p->workers);
    luna_text_translator_free(p->tr);
}

int main(int argc, char **argv) {
    luna_program_start("luna-translate", argv);
    int rc = parse_args(argc, argv);
    if (rc >= 0) return rc;
    program p;
    memset(&p, 0, sizeof p);
    luna_status st = run(&p);
    program_free(&p);
    /* The last chance to see a lost write (e.g. the error came from stdio's own buffering). */
    bool closed = false;
    if (st == LUNA_OK) {
        closed = true;
        if (fclose(stdout) != 0)
            st = luna_error(LUNA_ERR_IO, "stdout: write error: %s (output is incomplete)",
                            strerror(errno));
    }
    if (st != LUNA_OK) {
        if (!closed) fflush(stdout);
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 1;
    }
    return 0;
}
