/* bench-translate: decoding throughput (sentences/s and target tokens/s) of beam search.
 *
 *   bench-translate CHECKPOINT INPUT [--beam 4] [--threads 2] [--lenpen 0.6] [--max-len-a 0]
 *                   [--max-len-b 200] [--min-len 1] [--max-tokens 6000] [--batch-size 128]
 *                   [--limit N]
 *   bench-translate CHECKPOINT --ids IDS [...]   (dictionary ids per line, without </s>)
 *   bench-translate --preset NAME [--vocab 40624] [--sentences 64] [--src-len 30] [...]
 *   any form: [--device cpu|cuda] [--precision auto|fp32|bf16] (auto: fp32, as luna-translate)
 *             [--profile] [--int8] [--sync-interval N] [--no-graphs]
 *
 * The first form translates the raw text INPUT (SentencePiece from the checkpoint); the second
 * builds a randomly initialised model (e.g. luna_base_tied) and random sources, for timing
 * without a trained checkpoint (random models usually run to max length: set --max-len-b; with
 * --min-len equal to it every sentence takes exactly that many steps, as tools/bench/hf_generate.py
 * makes Hugging Face generate do for a side-by-side figure).
 * Prints one summary line (and the same as JSON with --json); --print also prints each best
 * hypothesis (ids without </s>, TAB, base-2 score) like decode_reference.py; --dump-ids FILE
 * writes the encoded sources for it.
 * tests/reference/decode_reference.py decodes the same checkpoint with the PyTorch oracle for
 * the throughput ratio.
 * --profile: decoding runs through the op-cost layer (model/profile/op_profile.h, each op
 * synchronized) and a per-op-family table follows, with PREDICTED H100/H200 times, target
 * tokens/s and MFU for the same decoding work (model/profile/op_report.h).
 * --int8: the checkpoint's weights quantized to int8 at load (luna-translate --quantize int8).
 * --sync-interval N: the beam search reads its selection back every N steps (0, the default:
 * every step on the CPU, every 8 on a device; luna_beam_options.sync_interval).
 * --no-graphs: on a device with graphs, launch a pool's steps kernel by kernel instead of
 * replaying them as graphs (core/graph_cache.h; --profile, which synchronizes each op, too).
 * On a device each run also prints the kernel launches, library GEMMs, graph launches and host
 * waits per step (a replayed step's kernels are not counted again: launches are the host's).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "decoding/beam_search.h"
#include "core/file_util.h"
#include "model/seq2seq.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "model/quantize.h"
#include "model/profile/op_profile.h"
#include "model/profile/op_report.h"
#include "model/kernels/registry.h"
#include "tools/programs/program_start.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int fail(void) {
    fprintf(stderr, "bench-translate: %s\n", luna_error_message());
    return 1;
}

int main(int argc, char **argv) {
    luna_program_start("bench-translate", argv);
    const char *ckpt = NULL, *input = NULL, *preset = NULL, *dump_ids = NULL, *ids_file = NULL;
    const char *device = "cpu", *precision = "auto";
    long threads = 2, limit = 0, vocab = 40624, sentences = 64, src_len = 30, max_tokens = 6000,
         batch_size = 128;
    bool json = false, print_hyps = false, profile = false, int8 = false, no_graphs = false;
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.beam = 4;
    o.lenpen = 0.6;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf(
                "usage: bench-translate CHECKPOINT INPUT [--beam N] [--threads N] [--lenpen F]\n"
                "         [--max-len-a F] [--max-len-b N] [--min-len N] [--max-tokens N]\n"
                "         [--batch-size N]\n"
                "         [--limit N] [--json] [--device cpu|cuda] [--precision auto|fp32|bf16]\n"
                "         [--profile] [--int8] [--sync-interval N] [--no-graphs]\n"
                "       bench-translate --preset NAME [--vocab N] [--sentences N] [--src-len N]"
                " ...\n");
            return 0;
        }
        if (!strcmp(a, "--no-graphs")) {
            no_graphs = true;
            continue;
        }
        if (!strcmp(a, "--profile") || !strcmp(a, "--int8")) {
            *(!strcmp(a, "--profile") ? &profile : &int8) = true;
            continue;
        }
        if (!strcmp(a, "--json") || !strcmp(a, "--print")) {
            *(!strcmp(a, "--json") ? &json : &print_hyps) = true;
            continue;
        }
        if (a[0] != '-') {
            if (!ckpt)
                ckpt = a;
            else
                input = a;
            continue;
        }
        if (!v) return fprintf(stderr, "bench-translate: %s needs a value\n", a), 2;
        i++;
        if (!strcmp(a, "--beam"))
            o.beam = atoi(v);
        else if (!strcmp(a, "--threads"))
            threads = atol(v);
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--precision"))
            precision = v;
        else if (!strcmp(a, "--lenpen"))
            o.lenpen = atof(v);
        else if (!strcmp(a, "--max-len-a"))
            o.max_len_a = atof(v);
        else if (!strcmp(a, "--max-len-b"))
            o.max_len_b = atoi(v);
        else if (!strcmp(a, "--min-len"))
            o.min_len = atoi(v);
        else if (!strcmp(a, "--max-tokens"))
            max_tokens = atol(v);
        else if (!strcmp(a, "--batch-size"))
            batch_size = atol(v);
        else if (!strcmp(a, "--limit"))
            limit = atol(v);
        else if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--dump-ids"))
            dump_ids = v;
        else if (!strcmp(a, "--ids"))
            ids_file = v;
        else if (!strcmp(a, "--vocab"))
            vocab = atol(v);
        else if (!strcmp(a, "--sentences"))
            sentences = atol(v);
        else if (!strcmp(a, "--src-len"))
            src_len = atol(v);
        else if (!strcmp(a, "--sync-interval"))
            o.sync_interval = atoi(v);
        else
            return fprintf(stderr, "bench-translate: unknown option %s\n", a), 2;
    }
    if (ids_file) input = ids_file;
    if (!preset && (!ckpt || !input))
        return fprintf(stderr, "bench-translate: give CHECKPOINT INPUT or --preset NAME\n"), 2;

    luna_backend *be;
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = (int)threads;
    if (luna_backend_options_set_precision(&bo, device, precision, false, false) != LUNA_OK ||
        luna_backend_create(&be, device, &bo) != LUNA_OK)
        return fail();
    luna_seq2seq *model = NULL;
    luna_dictionary *dict = NULL;
    luna_spm *spm = NULL;
    int n = 0;
    luna_token_seq *src = NULL;
    int32_t **ids = NULL;
    if (preset) {
        luna_config c;
        if (luna_config_preset(&c, preset) != LUNA_OK) return fail();
        c.vocab_size = (int)vocab;
        if (luna_seq2seq_create(&model, be, &c) != LUNA_OK) return fail();
        n = (int)sentences;
        src = calloc((size_t)n, sizeof *src);
        ids = calloc((size_t)n, sizeof *ids);
        uint64_t x = 88172645463325252ull;
        for (int i = 0; i < n; i++) {
            int len = (int)(src_len / 2 + i % (src_len + 1)); /* lengths spread around src_len */
            ids[i] = malloc(sizeof(int32_t) * (size_t)(len + 1));
            for (int t = 0; t < len; t++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                ids[i][t] = 4 + (int32_t)(x % (uint64_t)(vocab - 4));
            }
            ids[i][len] = LUNA_DICT_EOS;
            src[i] = (luna_token_seq){ids[i], len + 1};
        }
    } else {
        if (luna_checkpoint_load_model(ckpt, be, &model, NULL) != LUNA_OK ||
            luna_checkpoint_load_vocab(ckpt, model->config.vocab_size, &dict, NULL, &spm) !=
                LUNA_OK ||
            (int8 && luna_params_quantize_int8(model->params) != LUNA_OK))
            return fail();
        if (!spm && !ids_file)
            return fprintf(stderr, "bench-translate: %s has no SentencePiece model\n", ckpt), 1;
        char *text;
        size_t size;
        if (luna_read_file(input, &text, &size) != LUNA_OK) return fail();
        int cap = 1024;
        src = malloc(sizeof *src * (size_t)cap);
        ids = malloc(sizeof *ids * (size_t)cap);
        for (char *line = text, *next; *line && (!limit || n < limit); line = next) {
            next = strchr(line, '\n');
            next = next ? (*next = 0, next + 1) : line + strlen(line);
            int32_t *t = NULL;
            size_t k = 0;
            if (ids_file) { /* dictionary ids separated by spaces */
                t = malloc(sizeof(int32_t) * (strlen(line) / 2 + 1));
                for (char *q = line, *e; *q; q = e) {
                    long id = strtol(q, &e, 10);
                    if (e == q) break;
                    t[k++] = (int32_t)id;
                }
            } else if (luna_spm_encode_ids(spm, line, strlen(line), &t, &k) != LUNA_OK) {
                return fail();
            }
            if (n == cap) {
                cap *= 2;
                src = realloc(src, sizeof *src * (size_t)cap);
                ids = realloc(ids, sizeof *ids * (size_t)cap);
            }
            /* SentencePiece ids -> dictionary ids through the pieces */
            ids[n] = malloc(sizeof(int32_t) * (k + 1));
            for (size_t j = 0; j < k; j++) {
                const char *piece = ids_file ? NULL : luna_spm_id_to_piece(spm, t[j]);
                ids[n][j] = ids_file ? t[j] : luna_dictionary_index(dict, piece, strlen(piece));
            }
            if (k > 1022) k = 1022;
            ids[n][k] = LUNA_DICT_EOS;
            src[n] = (luna_token_seq){ids[n], (int)k + 1};
            n++;
            free(t);
        }
        free(text);
    }
    if (dump_ids) {
        FILE *f = fopen(dump_ids, "w");
        if (!f) return fprintf(stderr, "bench-translate: cannot write %s\n", dump_ids), 1;
        for (int i = 0; i < n; i++) {
            for (int t = 0; t < src[i].len - 1; t++)
                fprintf(f, t ? " %d" : "%d", src[i].tokens[t]);
            fputc('\n', f);
        }
        fclose(f);
    }
    luna_incremental *inc;
    if (luna_incremental_create(&inc, model) != LUNA_OK) return fail();
    if (luna_incremental_set_graphs(inc, !no_graphs && !profile) != LUNA_OK) return fail();
    luna_nbest *out = calloc((size_t)n + 1, sizeof *out);
    /* Attached after the decoder holds its weights (a one-off) and detached before it releases
     * them: the profile is the decoding work itself. */
    luna_op_profile *prof = NULL;
    if (profile && luna_op_profile_attach(&prof, be, true) != LUNA_OK) return fail();
    /* a device's work per decoder step: kernels, library GEMMs, the host's waits */
    luna_device_stats dev0 = {0}, dev1 = {0};
    const bool dev_stats = be->mem->device_stats && !profile;
    if (dev_stats) be->mem->device_stats(be, &dev0);
    double t0 = now();
    if (luna_generate(inc, &o, src, n, (int)max_tokens, (int)batch_size, out, NULL, NULL) !=
        LUNA_OK)
        return fail();
    double secs = now() - t0;
    if (dev_stats) be->mem->device_stats(be, &dev1);
    static luna_op_counter counters[LUNA_OP_COUNT];
    if (prof) memcpy(counters, luna_op_profile_counters(prof), sizeof counters);
    luna_op_profile_detach(prof);
    if (print_hyps)
        for (int i = 0; i < n; i++) {
            for (int t = 0; out[i].count && t < out[i].hyps[0].len - 1; t++)
                printf(t ? " %d" : "%d", out[i].hyps[0].tokens[t]);
            printf("\t%.17g\n", out[i].count ? out[i].hyps[0].score / M_LN2 : -INFINITY);
        }
    long long tokens = 0, src_tokens = 0;
    for (int i = 0; i < n; i++) {
        tokens += out[i].count ? out[i].hyps[0].len : 0;
        src_tokens += src[i].len;
        luna_nbest_release(&out[i]);
        free(ids[i]);
    }
    /* before the summary line, which stays the last line (scripts read it with tail -n 1) */
    const int steps = luna_incremental_steps(inc);
    if (dev_stats && steps > 0)
        printf("bench-translate: per decoder step on %s (%d steps): %.1f kernel launches, %.1f "
               "cuBLASLt GEMMs, %.2f graph launches, %.2f host waits (%.3f ms waiting); host time "
               "%.3f ms of %.3f ms\n",
               be->name, steps, (double)(dev1.kernels - dev0.kernels) / steps,
               (double)(dev1.library_calls - dev0.library_calls) / steps,
               (double)(dev1.graphs - dev0.graphs) / steps,
               (double)(dev1.waits - dev0.waits) / steps,
               1e3 * (dev1.wait_seconds - dev0.wait_seconds) / steps,
               1e3 * (secs - (dev1.wait_seconds - dev0.wait_seconds)) / steps, 1e3 * secs / steps);
    char desc[256];
    luna_config_describe(&model->config, desc, sizeof desc);
    printf("bench-translate: %d sentences (%lld source, %lld target tokens incl. </s>), beam %d, "
           "%ld threads: %.2f s, %.2f sentences/s, %.1f target tokens/s  [%s]\n",
           n, src_tokens, tokens, o.beam, threads, secs, n / secs, tokens / secs, desc);
    if (json)
        printf(
            "{\"sentences\": %d, \"target_tokens\": %lld, \"seconds\": %.4f, \"sentences_per_s\": "
            "%.3f, \"tokens_per_s\": %.2f, \"beam\": %d, \"threads\": %ld}\n",
            n, tokens, secs, n / secs, tokens / secs, o.beam, threads);
    if (profile) {
        printf("\nbench-translate: op profile of the decoding above (beam %d, %lld target "
               "tokens; the time above includes the profile's per-op synchronization):\n",
               o.beam, tokens);
        luna_op_report_print(stdout, counters, true, (int)luna_dtype_size(be->act_dtype),
                             (double)tokens, "target tokens");
    }
    free(out);
    free(src);
    free(ids);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
    luna_dictionary_free(dict);
    luna_spm_free(spm);
    luna_backend_free(be);
    return 0;
}
