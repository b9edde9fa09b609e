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

#include "data/dictionary.h"
#include "data/document.h"
#include "data/sentencepiece.h"
#include "decoding/beam_search.h"
#include "core/file_util.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/cpu/held_int8.h"
#include "model/kernels/registry.h"
#include "model/quantize.h"
#include "core/options_registry.h"
#include "tools/programs/program_start.h"

#define PROG "luna-translate"

/* ---- options: one registry table drives parsing and --help (core/options_registry.h) ---- */

typedef struct {
    const char *checkpoint, *input, *output_format, *device, *precision, *reference, *quantize;
    int64_t beam, max_len_b, min_len, nbest, max_tokens, batch_size, threads, max_input_tokens,
        device_id;
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
    {"--threads", LUNA_OPT_INT, "2", G_RUN, "N", NULL, F(threads), "CPU threads"},
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

/* ---- input ----------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t count;
    char **line;
    size_t *len;
} text;

static void text_free(text *t) {
    free(t->data);
    free(t->line);
    free(t->len);
    memset(t, 0, sizeof *t);
}

/* Read a whole file (or stdin: path NULL) as checked UTF-8 lines. */
static luna_status read_text(const char *path, text *t) {
    const char *name = path ? path : "<stdin>";
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) return luna_error(LUNA_ERR_IO, "%s: cannot open (check the path)", name);
    size_t cap = 1 << 16, n = 0;
    t->data = malloc(cap);
    for (size_t got; t->data && (got = fread(t->data + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *g = realloc(t->data, cap *= 2);
            if (!g) free(t->data);
            t->data = g;
        }
    }
    bool err = ferror(f);
    if (path) fclose(f);
    if (!t->data) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory reading", name);
    if (err) return luna_error(LUNA_ERR_IO, "%s: read error", name);
    t->data[n] = 0;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += t->data[i] == '\n';
    lines += n > 0 && t->data[n - 1] != '\n';
    t->line = malloc(sizeof(char *) * (lines + 1));
    t->len = malloc(sizeof(size_t) * (lines + 1));
    if (!t->line || !t->len) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    for (size_t i = 0, start = 0; i < lines; i++) {
        size_t end = start;
        while (end < n && t->data[end] != '\n')
            end++;
        size_t len = end - start;
        if (len > 0 && t->data[start + len - 1] == '\r') len--;
        t->data[start + len] = 0;
        size_t bad = 0;
        if (memchr(t->data + start, 0, len))
            return luna_error(LUNA_ERR_FORMAT, "%s:%zu: NUL byte in the line (give plain text)",
                              name, i + 1);
        if (!luna_utf8_valid(t->data + start, len, &bad))
            return luna_error(LUNA_ERR_FORMAT,
                              "%s:%zu: invalid UTF-8 at byte %zu of the line (convert the input "
                              "to UTF-8, e.g. with iconv)",
                              name, i + 1, bad + 1);
        t->line[i] = t->data + start;
        t->len[i] = len;
        start = end + 1;
    }
    t->count = lines;
    return LUNA_OK;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f')
            return false;
    return true;
}

/* Text -> dictionary ids + </s> (SentencePiece, or whitespace tokens without a model). */
typedef struct {
    const luna_spm *spm;
    const luna_dictionary *dict;
    luna_spm_pieces pieces;
} encoder;

static luna_status encode(encoder *e, const char *s, size_t n, int32_t **ids, int *len) {
    *ids = NULL;
    *len = 0;
    size_t count = 0;
    char *copy = NULL;
    char **words = NULL;
    if (e->spm) {
        LUNA_TRY(luna_spm_encode_pieces(e->spm, s, n, &e->pieces));
        count = e->pieces.count;
        words = e->pieces.pieces;
    } else {
        copy = malloc(n + 1);
        words = malloc(sizeof(char *) * (n / 2 + 2));
        if (!copy || !words) {
            free(copy), free(words);
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        }
        memcpy(copy, s, n);
        copy[n] = 0;
        for (char *tok = strtok(copy, " \t"); tok; tok = strtok(NULL, " \t"))
            words[count++] = tok;
    }
    int32_t *out = malloc(sizeof(int32_t) * (count + 1));
    if (out) {
        for (size_t i = 0; i < count; i++)
            out[i] = luna_dictionary_index(e->dict, words[i], strlen(words[i]));
        out[count] = LUNA_DICT_EOS;
    }
    if (!e->spm) free(copy), free(words);
    if (!out) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    *ids = out;
    *len = (int)count + 1;
    return LUNA_OK;
}

/* encode(), and for a dictionary with <sep> a line "s1 <sep> s2 ..." as s1 <sep> s2 ... </s>. */
static luna_status encode_document(encoder *e, const char *s, size_t n, int32_t **ids, int *len) {
    const size_t k = strlen(LUNA_DOC_SEPARATOR);
    const int32_t sep = luna_dictionary_find(e->dict, LUNA_DOC_SEPARATOR, k);
    const char *at = NULL;
    for (size_t j = 0; sep >= 0 && !at && j + k <= n; j++)
        if (!memcmp(s + j, LUNA_DOC_SEPARATOR, k)) at = s + j;
    if (!at) return encode(e, s, n, ids, len);
    int32_t *head, *tail;
    int hn, tn;
    LUNA_TRY(encode(e, s, (size_t)(at - s), &head, &hn));
    luna_status st = encode_document(e, at + k, n - (size_t)(at - s) - k, &tail, &tn);
    if (st != LUNA_OK) {
        free(head);
        return st;
    }
    int32_t *out = realloc(head, sizeof(int32_t) * (size_t)(hn + tn));
    if (!out) {
        free(head), free(tail);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    out[hn - 1] = sep; /* head's </s> */
    memcpy(out + hn, tail, sizeof(int32_t) * (size_t)tn);
    free(tail);
    *ids = out;
    *len = hn + tn;
    return LUNA_OK;
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

/* Detokenize (tokens without </s>) into a malloc'ed string. */
static luna_status detok(const luna_spm *spm, const luna_dictionary *d, const int32_t *t, int n,
                         char **out) {
    const char **p = malloc(sizeof(char *) * (size_t)(n + 1));
    if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    size_t total = 1;
    for (int i = 0; i < n; i++)
        total += strlen(p[i] = luna_dictionary_symbol(d, t[i])) + 1;
    luna_status st = LUNA_OK;
    if (spm) {
        st = luna_spm_decode_pieces(spm, p, (size_t)n, out);
    } else if ((*out = malloc(total))) {
        (*out)[0] = 0;
        for (int i = 0; i < n; i++)
            strcat(strcat(*out, i ? " " : ""), p[i]);
    } else {
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    free(p);
    return st;
}

/* Hypothesis tokens without the final </s>. */
static int body_len(const int32_t *t, int n) {
    return n > 0 && t[n - 1] == LUNA_DICT_EOS ? n - 1 : n;
}

/* ---- main ------------------------------------------------------------------------------------ */

typedef struct {
    luna_backend *be;
    luna_seq2seq *model;
    luna_dictionary *src_dict, *tgt_dict;
    luna_spm *spm;
    luna_checkpoint_meta meta;
    luna_incremental *inc;
    text in, ref;
    int32_t **src_ids, **ref_ids;
    int *src_len, *ref_len;
    luna_nbest *out;
    float **pos;
} program;

static luna_status encode_all(program *p, const text *t, const luna_dictionary *d, bool truncate,
                              const char *name, int32_t ***ids, int **lens) {
    *ids = calloc(t->count + 1, sizeof(int32_t *));
    *lens = calloc(t->count + 1, sizeof(int));
    if (!*ids || !*lens) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    encoder e = {.spm = p->spm, .dict = d};
    luna_spm_pieces_init(&e.pieces);
    luna_status st = LUNA_OK;
    for (size_t i = 0; i < t->count && st == LUNA_OK; i++) {
        if (blank(t->line[i], t->len[i])) continue; /* empty translation */
        st = encode_document(&e, t->line[i], t->len[i], &(*ids)[i], &(*lens)[i]);
        if (st != LUNA_OK) luna_error_prefix("%s:%zu", name, i + 1);
        if (st == LUNA_OK && truncate && (*lens)[i] > opt.max_input_tokens) {
            fprintf(stderr,
                    PROG ": warning: %s:%zu: %d subword tokens exceed --max-input-tokens %lld; "
                         "truncated to %lld\n",
                    name, i + 1, (*lens)[i], (long long)opt.max_input_tokens,
                    (long long)opt.max_input_tokens);
            (*lens)[i] = (int)opt.max_input_tokens;
            (*ids)[i][opt.max_input_tokens - 1] = LUNA_DICT_EOS;
        }
        /* Linformer's E, F have a fixed length: a longer source cannot be encoded at all. */
        const luna_config *c = &p->model->config;
        if (st == LUNA_OK && truncate && c->linformer_k > 0 && (*lens)[i] > c->max_source_positions)
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                            "%s:%zu: %d subword tokens exceed the Linformer maximum of %d "
                            "(the model's max_source_positions; shorten or split the line)",
                            name, i + 1, (*lens)[i], c->max_source_positions);
    }
    luna_spm_pieces_release(&e.pieces);
    return st;
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

/* Plain output of a document line: one line per source sentence (module comment). */
static luna_status write_document(program *p, size_t i, const luna_hypothesis *h, int body,
                                  int32_t sep) {
    int *seg = malloc(sizeof(int) * 2 * (size_t)(h->len + p->src_len[i] + 2));
    if (!seg) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    int *start = seg, *len = seg + h->len + 1, *src_start = len + h->len + 1;
    int lines = luna_document_segments(p->src_ids[i], p->src_len[i], sep, src_start,
                                       src_start + p->src_len[i] + 1);
    int n = luna_document_segments(h->tokens, body, sep, start, len);
    luna_status st = LUNA_OK;
    for (int j = 0; j < lines && st == LUNA_OK; j++) {
        /* the last line takes the rest: extra <sep>s stay as text there */
        int from = j < n ? start[j] : body, to = j < n ? start[j] + len[j] : body;
        if (j == lines - 1 && j < n) to = body;
        char *d;
        st = detok(p->spm, p->tgt_dict, h->tokens + from, to - from, &d);
        if (st == LUNA_OK) printf("%s\n", d);
        free(d);
    }
    free(seg);
    return st;
}

static luna_status write_translations(program *p, size_t n) {
    const bool fs = !strcmp(opt.output_format, "fairseq");
    const int32_t sep =
        luna_dictionary_find(p->tgt_dict, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR));
    for (size_t i = 0; i < n; i++) {
        const luna_nbest *nb = &p->out[i];
        if (fs) {
            printf("S-%zu\t", i);
            if (p->src_ids[i]) print_pieces(p->src_dict, p->src_ids[i], p->src_len[i] - 1);
            putchar('\n');
        }
        if (nb->count == 0 && !fs) putchar('\n');
        if (nb->count == 0 && fs) printf("H-%zu\t-inf\t\nD-%zu\t-inf\t\nP-%zu\t\n", i, i, i);
        for (int k = 0; k < (fs ? nb->count : (nb->count ? 1 : 0)); k++) {
            const luna_hypothesis *h = &nb->hyps[k];
            const int body = body_len(h->tokens, h->len);
            char *d;
            LUNA_TRY(detok(p->spm, p->tgt_dict, h->tokens, body, &d));
            if (!fs && sep >= 0 && p->src_ids[i]) {
                free(d);
                LUNA_TRY(write_document(p, i, h, body, sep));
                continue;
            }
            if (!fs) {
                printf("%s\n", d);
            } else {
                const double s2 = (float)(h->score / M_LN2);
                printf("H-%zu\t", i), print_float(stdout, s2), putchar('\t');
                print_pieces(p->tgt_dict, h->tokens, body);
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
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        const int len = p->ref_ids[i] ? p->ref_len[i] : 0;
        for (int t = 0; t < len; t++)
            sum += p->pos[i] ? p->pos[i][t] : 0;
        const double avg2 = len ? (float)(sum / len / M_LN2) : 0.0;
        if (!fs) {
            print_float(stdout, avg2), putchar('\n');
            LUNA_TRY(check_stdout(false));
            continue;
        }
        printf("S-%zu\t", i);
        if (p->src_ids[i]) print_pieces(p->src_dict, p->src_ids[i], p->src_len[i] - 1);
        printf("\nT-%zu\t", i);
        if (len) print_pieces(p->tgt_dict, p->ref_ids[i], len - 1);
        printf("\nH-%zu\t", i), print_float(stdout, avg2), putchar('\t');
        if (len) print_pieces(p->tgt_dict, p->ref_ids[i], len - 1);
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
    LUNA_TRY(luna_backend_create(&p->be, opt.device, &bo));
    LUNA_TRY(luna_checkpoint_load_model(opt.checkpoint, p->be, &p->model, &p->meta));
    if (strcmp(opt.quantize, "int8") == 0) LUNA_TRY(luna_params_quantize_int8(p->model->params));
    if (p->model->params->weight_dtype == LUNA_I8 && strcmp(opt.device, "cpu") != 0)
        return luna_error(
            LUNA_ERR_UNSUPPORTED, "%s: int8 weights%s decode on the CPU only; use --device cpu",
            opt.checkpoint, strcmp(opt.quantize, "int8") == 0 ? " (--quantize int8)" : "");
    LUNA_TRY(luna_checkpoint_load_vocab(opt.checkpoint, p->model->config.vocab_size, &p->src_dict,
                                        &p->tgt_dict, &p->spm));
    if (!p->src_dict || !p->tgt_dict ||
        luna_dictionary_size(p->tgt_dict) != p->model->config.vocab_size)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: the checkpoint carries no usable vocabulary (src_dict/tgt_dict); "
                          "use a checkpoint written by luna-train or luna-average",
                          opt.checkpoint);
    if (!p->spm && !opt.quiet)
        fprintf(stderr,
                PROG ": note: %s has no SentencePiece model (trained with --no-spm): the "
                     "input must already be tokenized; tokens are split on spaces\n",
                opt.checkpoint);
    LUNA_TRY(read_text(opt.input, &p->in));
    const size_t n = p->in.count;
    if (opt.score_reference) {
        LUNA_TRY(read_text(opt.reference, &p->ref));
        if (p->ref.count != n)
            return luna_error(LUNA_ERR_MISMATCH, "%s: %zu lines, but the input has %zu",
                              opt.reference, p->ref.count, n);
    }
    const char *in_name = opt.input ? opt.input : "<stdin>";
    LUNA_TRY(encode_all(p, &p->in, p->src_dict, true, in_name, &p->src_ids, &p->src_len));
    if (opt.score_reference)
        LUNA_TRY(
            encode_all(p, &p->ref, p->tgt_dict, false, opt.reference, &p->ref_ids, &p->ref_len));
    /* the non-empty sentences */
    luna_token_seq *src = malloc(sizeof *src * (n + 1)), *tgt = malloc(sizeof *tgt * (n + 1));
    size_t *idx = malloc(sizeof *idx * (n + 1));
    p->out = calloc(n + 1, sizeof *p->out);
    p->pos = calloc(n + 1, sizeof *p->pos);
    if (!src || !tgt || !idx || !p->out || !p->pos) {
        free(src), free(tgt), free(idx);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!p->src_ids[i] || (opt.score_reference && !p->ref_ids[i])) continue;
        src[k] = (luna_token_seq){p->src_ids[i], p->src_len[i]};
        if (opt.score_reference) tgt[k] = (luna_token_seq){p->ref_ids[i], p->ref_len[i]};
        idx[k++] = i;
    }
    luna_status st = luna_incremental_create(&p->inc, p->model);
    double t0 = now(), c0 = cpu_now();
    luna_nbest *res = calloc(k + 1, sizeof *res);
    float **pos = calloc(k + 1, sizeof *pos);
    if (st == LUNA_OK && (!res || !pos)) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == LUNA_OK && opt.score_reference) {
        st = luna_score_targets(p->inc, src, tgt, (int)k, (int)opt.max_tokens, (int)opt.batch_size,
                                pos);
    } else if (st == LUNA_OK) {
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
        st = luna_generate(p->inc, &o, src, (int)k, (int)opt.max_tokens, (int)opt.batch_size, res,
                           NULL, NULL);
    }
    const double secs = now() - t0, cpu_secs = cpu_now() - c0;
    long long tokens = 0;
    for (size_t j = 0; j < k && st == LUNA_OK; j++) {
        p->out[idx[j]] = res[j];
        p->pos[idx[j]] = pos[j];
        tokens += res[j].count ? res[j].hyps[0].len : (opt.score_reference ? tgt[j].len : 0);
    }
    free(src), free(tgt), free(idx), free(res), free(pos);
    if (st == LUNA_OK && !opt.quiet && opt.nbest > 1 && !strcmp(opt.output_format, "plain"))
        fprintf(stderr, PROG ": note: plain output shows the best hypothesis only; use "
                             "--output-format fairseq for the n-best list\n");
    if (st == LUNA_OK) st = opt.score_reference ? write_scores(p, n) : write_translations(p, n);
    const bool int8 = p->model->params->weight_dtype == LUNA_I8; /* and its kernel, said below */
    if (st == LUNA_OK && !opt.quiet)
        fprintf(stderr,
                PROG ": %s %zu sentences (%zu empty) in %.2f s: %.2f sentences/s, %.1f target "
                     "tokens/s (beam %lld, %lld threads; %.2f s CPU%s%s)\n",
                opt.score_reference ? "scored" : "translated", n, n - k, secs,
                secs > 0 ? k / secs : 0.0, secs > 0 ? tokens / secs : 0.0, (long long)opt.beam,
                (long long)opt.threads, cpu_secs, int8 ? ", int8 " : "",
                int8 ? luna_int8_kernel_name((luna_int8_kernel)luna_cpu_int8_kernel(p->be)) : "");
    return st;
}

static void program_free(program *p) {
    for (size_t i = 0; i < p->in.count; i++) {
        if (p->src_ids) free(p->src_ids[i]);
        if (p->ref_ids) free(p->ref_ids[i]);
        if (p->out) luna_nbest_release(&p->out[i]);
        if (p->pos) free(p->pos[i]);
    }
    free(p->src_ids), free(p->ref_ids), free(p->src_len), free(p->ref_len), free(p->out),
        free(p->pos);
    text_free(&p->in);
    text_free(&p->ref);
    luna_incremental_free(p->inc);
    luna_seq2seq_free(p->model);
    luna_dictionary_free(p->src_dict);
    luna_dictionary_free(p->tgt_dict);
    luna_spm_free(p->spm);
    luna_checkpoint_meta_release(&p->meta);
    if (p->be) luna_backend_free(p->be);
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
