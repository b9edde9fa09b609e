/* bench-model: forward + backward time of the full model on one synthetic batch.
 *
 *   bench-model [--arch luna_base_tied] [--threads N] [--batch 128] [--src-len 32]
 *               [--tgt-len 32] [--vocab 32000] [--projection-length 32] [--dropout 0.1]
 *               [--attention-dropout 0.1] [--activation-dropout 0.1] [--warmup 1] [--steps 3]
 *               [--device cpu|cuda] [--precision auto|fp32|bf16] [--tf32]
 *               [--embed-dim D] [--ffn-dim F] [--layers K] [--heads H] [--fix-projection-length]
 *               [--linformer-k K] [--profile] [--predict-batch P ...] [--update]
 *
 * Prints target tokens/s, seconds per step and the peak activation memory: the activation
 * arena's high-water mark plus the ops' scratch high-water mark (parameters, gradients and
 * optimizer state are not counted: they do not depend on the sequence length). The batch is
 * random tokens of full length (no padding), so every position does work. The last line,
 * "bench-model-result: key=value ...", is for scripts (tools/bench/long.sh).
 * --profile: the timed steps run through the op-cost layer (model/profile/op_profile.h): a table
 * per op family of calls, FLOPs, bytes and time (each op synchronized, so the steps are slower),
 * with PREDICTED H100/H200 times, tokens/s and MFU (model/profile/op_report.h).
 * --predict-batch P (with --profile; up to 4): also counts one step at B/4 and B/2 sentences,
 * checks that the affine fit through them reproduces the counts at B, and prints the table
 * extrapolated to P sentences (a 32k-token update need not be run on a CPU).
 * --update: each step is a whole training update as luna-train does it: gradients zeroed,
 * forward + backward, clipping (total norm 0.1, the WMT recipe) and an Apollo step.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/allocator.h"
#include "model/seq2seq.h"
#include "model/profile/op_profile.h"
#include "model/profile/op_report.h"
#include "model/kernels/registry.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "tools/programs/program_start.h"

static double clock_seconds(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clock_seconds(CLOCK_MONOTONIC); }
/* CPU seconds of the whole process (all threads): on a shared machine a single-threaded run's
 * CPU time measures its work where wall time also measures the other programs. */
static double cpu_now(void) { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: bench-model [--arch NAME] [--threads N] [--batch B] [--src-len M]\n"
        "                   [--tgt-len N] [--vocab V] [--projection-length L] [--dropout P]\n"
        "                   [--attention-dropout P] [--activation-dropout P]\n"
        "                   [--warmup K] [--steps S] [--device cpu|cuda]\n"
        "                   [--precision auto|fp32|bf16] [--tf32]\n"
        "                   [--embed-dim D] [--ffn-dim F] [--layers K] [--heads H]\n"
        "                   [--fix-projection-length] [--linformer-k K] [--profile]\n"
        "                   [--predict-batch P ...] [--update] [--no-graphs]\n"
        "Forward+backward time of the model on one synthetic batch (default: luna_base_tied,\n"
        "l=32, V=32000, all three dropouts 0.1 as in the WMT recipe, 128 x 32 target\n"
        "tokens, sources of 32). --device cuda: activations in bf16 unless --precision fp32\n"
        "(auto = bf16 on cuda, as luna-train). --embed-dim/--ffn-dim/--layers/--heads\n"
        "override the preset's sizes (encoder and decoder alike); --fix-projection-length:\n"
        "Luna uses all l slots even when sources are shorter than l; --linformer-k: a\n"
        "transformer arch gets a Linformer encoder (E, F [K, src-len]). --profile: per-op-family\n"
        "FLOPs, bytes and time with PREDICTED H100/H200 times and MFU; --predict-batch P: the\n"
        "same extrapolated to P sentences from counts at B/4 and B/2 (checked against B).\n"
        "--update: each step also zeroes the gradients, clips (total norm 0.1) and takes an\n"
        "Apollo step; on a device with graphs its forward and backward replay as graphs\n"
        "(from the third step: model/seq2seq.h) unless --no-graphs (or --profile).\n");
}

static int parse_int(const char *flag, const char *s, int lo) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > 1 << 30) {
        fprintf(stderr, "bench-model: %s %s: expected an integer >= %d\n", flag, s, lo);
        exit(2);
    }
    return (int)v;
}

/* With --update, the optimizer of a whole training update over the trainable tensors (else
 * NULL). */
static luna_tensor_table *g_trainable;
static luna_optimizer *g_opt;

/* One step: forward + backward, and with --update the rest of luna-train's update around it. */
static luna_status train_step(luna_seq2seq *model, const luna_batch *batch, uint64_t seed,
                              double *loss) {
    if (!g_opt) return luna_seq2seq_forward_backward(model, batch, seed, loss, NULL);
    /* as luna-train: the loss stays on the device until the step's one readback */
    LUNA_TRY(luna_seq2seq_zero_grad(model));
    LUNA_TRY(
        luna_seq2seq_forward_backward_sums(model, batch, seed, luna_optimizer_loss_sums(g_opt)));
    luna_optimizer_step_args a = {
        .lr = 1e-4, .grad_scale = 1.0, .clip_norm = 0.1, .clip_mode = LUNA_CLIP_TOTAL};
    luna_optimizer_step_result r;
    LUNA_TRY(luna_optimizer_step(g_opt, &a, &r));
    *loss = r.loss_sum;
    if (!r.finite)
        return luna_error(LUNA_ERR_NUMERIC, "non-finite loss or gradients (loss %g, norm %g)",
                          r.loss_sum, r.grad_norm);
    return LUNA_OK;
}

/* The counters of one forward+backward step at the first b sentences of `batch`. */
static luna_status count_step(luna_seq2seq *model, luna_op_profile *prof, const luna_batch *batch,
                              int b, luna_op_counter *out) {
    luna_batch part = *batch;
    part.B = b;
    double loss;
    luna_op_profile_reset(prof);
    luna_status st = train_step(model, &part, 7, &loss);
    if (st != LUNA_OK) return st;
    memcpy(out, luna_op_profile_counters(prof), sizeof(luna_op_counter) * LUNA_OP_COUNT);
    return LUNA_OK;
}

/* Prints the profile of the timed steps (per step) and, with predict_batch, the extrapolation. */
static luna_status report(luna_seq2seq *model, luna_op_profile *prof, const luna_batch *batch,
                          int steps, const int *predict_batch, int npredict, int act_bytes) {
    static luna_op_counter per_step[LUNA_OP_COUNT], quarter[LUNA_OP_COUNT], half[LUNA_OP_COUNT],
        fit[LUNA_OP_COUNT];
    const luna_op_counter *c = luna_op_profile_counters(prof);
    for (int i = 0; i < LUNA_OP_COUNT; i++) {
        per_step[i] = c[i];
        per_step[i].calls /= steps, per_step[i].mm_flops /= steps, per_step[i].flops /= steps;
        per_step[i].act_elems /= steps, per_step[i].bytes /= steps, per_step[i].seconds /= steps;
    }
    const double tokens_per_sentence = batch->tgt_len;
    printf("\nbench-model: op profile of one update (%s), %d x %d target tokens:\n",
           g_opt ? "forward+backward+clip+Apollo" : "forward+backward", batch->B, batch->tgt_len);
    luna_op_report_print(stdout, per_step, true, act_bytes, tokens_per_sentence * batch->B,
                         "target tokens");
    if (!npredict) return LUNA_OK;
    const int B = batch->B;
    luna_status st = count_step(model, prof, batch, B / 4, quarter);
    if (st == LUNA_OK) st = count_step(model, prof, batch, B / 2, half);
    if (st != LUNA_OK) return st;
    /* The costs are affine in the batch size: the fit through B/4 and B/2 must give B's counts. */
    luna_op_counters_extrapolate(fit, quarter, B / 4, half, B / 2, B);
    double err = luna_op_counters_max_rel_diff(fit, per_step);
    printf("\nbench-model: affine check: counts at %d sentences from the fit through %d and %d: "
           "max relative difference %.2e\n",
           B, B / 4, B / 2, err);
    if (err > 1e-9)
        return luna_error(LUNA_ERR_INTERNAL,
                          "the op costs are not affine in the batch size "
                          "(%.2e): cannot extrapolate",
                          err);
    for (int k = 0; k < npredict; k++) {
        luna_op_counters_extrapolate(fit, quarter, B / 4, half, B / 2, predict_batch[k]);
        printf("\nbench-model: op profile EXTRAPOLATED to %d x %d target tokens (no measured "
               "time):\n",
               predict_batch[k], batch->tgt_len);
        luna_op_report_print(stdout, fit, false, act_bytes, tokens_per_sentence * predict_batch[k],
                             "target tokens");
    }
    return LUNA_OK;
}

int main(int argc, char **argv) {
    luna_program_start("bench-model", argv);
    const char *arch = "luna_base_tied", *device = "cpu", *precision = "auto";
    bool tf32 = false, fix_projection_length = false, profile = false, update = false;
    bool graphs = true;
    int predict_batch[4], npredict = 0;
    int threads = 0, B = 128, M = 32, N = 32, V = 32000, L = 32, warmup = 1, steps = 3;
    int embed_dim = 0, ffn_dim = 0, layers = 0, heads = 0; /* 0: the preset's */
    int linformer_k = 0;
    double dropout = 0.1, attention_dropout = 0.1, activation_dropout = 0.1;
    static const struct option options[] = {
        {"arch", required_argument, NULL, 'a'},
        {"threads", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, 'b'},
        {"src-len", required_argument, NULL, 'm'},
        {"tgt-len", required_argument, NULL, 'n'},
        {"vocab", required_argument, NULL, 'v'},
        {"projection-length", required_argument, NULL, 'l'},
        {"dropout", required_argument, NULL, 'd'},
        {"attention-dropout", required_argument, NULL, 'A'},
        {"activation-dropout", required_argument, NULL, 'R'},
        {"warmup", required_argument, NULL, 'w'},
        {"steps", required_argument, NULL, 's'},
        {"device", required_argument, NULL, 'D'},
        {"precision", required_argument, NULL, 'P'},
        {"tf32", no_argument, NULL, 'T'},
        {"embed-dim", required_argument, NULL, 'E'},
        {"ffn-dim", required_argument, NULL, 'F'},
        {"layers", required_argument, NULL, 'K'},
        {"heads", required_argument, NULL, 'H'},
        {"fix-projection-length", no_argument, NULL, 'X'},
        {"linformer-k", required_argument, NULL, 'k'},
        {"profile", no_argument, NULL, 'p'},
        {"update", no_argument, NULL, 'U'},
        {"no-graphs", no_argument, NULL, 'G'},
        {"predict-batch", required_argument, NULL, 'B'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'a': arch = optarg; break;
        case 't': threads = parse_int("--threads", optarg, 1); break;
        case 'b': B = parse_int("--batch", optarg, 1); break;
        case 'm': M = parse_int("--src-len", optarg, 1); break;
        case 'n': N = parse_int("--tgt-len", optarg, 1); break;
        case 'v': V = parse_int("--vocab", optarg, 5); break;
        case 'l': L = parse_int("--projection-length", optarg, 1); break;
        case 'd': dropout = atof(optarg); break;
        case 'A': attention_dropout = atof(optarg); break;
        case 'R': activation_dropout = atof(optarg); break;
        case 'w': warmup = parse_int("--warmup", optarg, 0); break;
        case 's': steps = parse_int("--steps", optarg, 1); break;
        case 'D': device = optarg; break;
        case 'P': precision = optarg; break;
        case 'T': tf32 = true; break;
        case 'E': embed_dim = parse_int("--embed-dim", optarg, 4); break;
        case 'F': ffn_dim = parse_int("--ffn-dim", optarg, 1); break;
        case 'K': layers = parse_int("--layers", optarg, 1); break;
        case 'H': heads = parse_int("--heads", optarg, 1); break;
        case 'X': fix_projection_length = true; break;
        case 'k': linformer_k = parse_int("--linformer-k", optarg, 1); break;
        case 'p': profile = true; break;
        case 'U': update = true; break;
        case 'G': graphs = false; break;
        case 'B':
            if (npredict == 4) {
                fprintf(stderr, "bench-model: at most 4 --predict-batch\n");
                return 2;
            }
            predict_batch[npredict++] = parse_int("--predict-batch", optarg, 1);
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (npredict && (!profile || B % 4 != 0)) {
        fprintf(stderr, "bench-model: --predict-batch needs --profile and a --batch divisible by "
                        "4\n");
        return 2;
    }
    luna_config cfg;
    if (luna_config_preset(&cfg, arch) != LUNA_OK) {
        fprintf(stderr, "bench-model: %s\n", luna_error_message());
        return 2;
    }
    cfg.vocab_size = V;
    if (cfg.arch == LUNA_ARCH_LUNA) cfg.projection_length = L;
    cfg.dropout = dropout;
    cfg.attention_dropout = attention_dropout;
    cfg.activation_dropout = activation_dropout;
    if (embed_dim) cfg.encoder_embed_dim = cfg.decoder_embed_dim = embed_dim;
    if (ffn_dim) cfg.encoder_ffn_embed_dim = cfg.decoder_ffn_embed_dim = ffn_dim;
    if (layers) cfg.encoder_layers = cfg.decoder_layers = layers;
    cfg.fix_projection_length = fix_projection_length;
    if (linformer_k) { /* Linformer encoder (transformer archs): E, F [k, source length] */
        cfg.linformer_k = linformer_k;
        cfg.max_source_positions = M;
    }
    if (heads) cfg.encoder_attention_heads = cfg.decoder_attention_heads = heads;

    luna_backend *be;
    luna_seq2seq *model;
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = threads;
    if (luna_backend_options_set_precision(&bo, device, precision, tf32, true) != LUNA_OK ||
        luna_backend_create(&be, device, &bo) != LUNA_OK ||
        luna_seq2seq_create(&model, be, &cfg) != LUNA_OK ||
        /* the profile's per-op waits cannot be in a graph */
        luna_seq2seq_set_graphs(model, graphs && !profile) != LUNA_OK) {
        fprintf(stderr, "bench-model: %s\n", luna_error_message());
        return 1;
    }
    if (update) {
        luna_optimizer_config oc;
        luna_optimizer_config_defaults(&oc, LUNA_OPTIMIZER_APOLLO);
        if (luna_params_trainable_table(model->params, &g_trainable) != LUNA_OK ||
            luna_optimizer_create(&g_opt, be, &oc, g_trainable, model->params->data,
                                  model->params->grad) != LUNA_OK) {
            fprintf(stderr, "bench-model: %s\n", luna_error_message());
            return 1;
        }
    }
    /* Full-length random sentences: sources end with </s> (2), targets likewise. */
    int32_t *src = malloc(sizeof(int32_t) * B * M), *len = malloc(sizeof(int32_t) * B);
    int32_t *prev = malloc(sizeof(int32_t) * B * N), *tgt = malloc(sizeof(int32_t) * B * N);
    uint64_t x = 88172645463325252ull;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < M; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            src[b * M + i] = i == M - 1 ? 2 : 4 + (int32_t)(x % (uint64_t)(V - 4));
        }
        len[b] = M;
        for (int i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            tgt[b * N + i] = i == N - 1 ? 2 : 4 + (int32_t)(x % (uint64_t)(V - 4));
            prev[b * N + i] = i == 0 ? 2 : tgt[b * N + i - 1];
        }
    }
    luna_batch batch = {.B = B,
                        .src_len = M,
                        .tgt_len = N,
                        .src_tokens = src,
                        .src_lengths = len,
                        .prev_output_tokens = prev,
                        .target = tgt};
    char desc[512];
    luna_config_describe(&cfg, desc, sizeof desc);
    printf("bench-model: %s\n", desc);
    printf("bench-model: %zu parameters, batch %d x %d target tokens (sources %d), device %s "
           "(%s activations), %d threads\n",
           model->params->num_params, B, N, M, be->name, bo.bf16 ? "bf16" : "fp32",
           be->num_threads);
    double loss = 0, total = 0, cpu_total = 0;
    luna_op_profile *prof = NULL;
    /* a device's work per step: kernels, library GEMMs, the host's waits (not under --profile,
     * which waits after every op) */
    luna_device_stats dev0 = {0}, dev1 = {0};
    const bool dev_stats = be->mem->device_stats && !profile;
    for (int s = 0; s < warmup + steps; s++) {
        if (profile && s == warmup && luna_op_profile_attach(&prof, be, true) != LUNA_OK) {
            fprintf(stderr, "bench-model: %s\n", luna_error_message());
            return 1;
        }
        if (dev_stats && s == warmup) be->mem->device_stats(be, &dev0);
        double t0 = now(), c0 = cpu_now();
        if (train_step(model, &batch, (uint64_t)s, &loss) != LUNA_OK) {
            fprintf(stderr, "bench-model: %s\n", luna_error_message());
            return 1;
        }
        double dt = now() - t0;
        if (s >= warmup) total += dt, cpu_total += cpu_now() - c0;
        if (dev_stats && s == warmup + steps - 1) be->mem->device_stats(be, &dev1);
        printf("bench-model: step %d%s: %.3f s, loss %.4f nats/token\n", s,
               s < warmup ? " (warmup)" : "", dt, loss / ((double)B * N));
    }
    double per_step = total / steps;
    /* The ops' scratch arena holds their temporaries (e.g. the causal scan's chunk state); its
     * high-water mark adds to the activations' (an upper bound: the two peaks may differ in time).
     */
    size_t arena_peak = luna_seq2seq_activation_peak(model);
    size_t scratch_peak = be->scratch ? luna_arena_peak_bytes(be->scratch) : 0;
    size_t peak = arena_peak + scratch_peak;
    printf("bench-model: %.1f target tokens/s, %.3f s/step (%.3f CPU s), activation peak %zu bytes "
           "(%.1f MiB: arena %.1f + op scratch %.1f)\n",
           (double)B * N / per_step, per_step, cpu_total / steps, peak, peak / 1048576.0,
           arena_peak / 1048576.0, scratch_peak / 1048576.0);
    if (dev_stats) {
        /* the host's own time: the step's wall time less its waits for the device */
        const double waited = (dev1.wait_seconds - dev0.wait_seconds) / steps;
        printf("bench-model: per step on %s: %.1f kernel launches, %.1f cuBLASLt GEMMs, %.1f graph "
               "launches, %.1f host waits (%.2f ms waiting); host time %.2f ms of %.2f ms\n",
               be->name, (double)(dev1.kernels - dev0.kernels) / steps,
               (double)(dev1.library_calls - dev0.library_calls) / steps,
               (double)(dev1.graphs - dev0.graphs) / steps,
               (double)(dev1.waits - dev0.waits) / steps, 1e3 * waited, 1e3 * (per_step - waited),
               1e3 * per_step);
    }
    if (luna_seq2seq_uses_graphs(model)) {
        int64_t replays, captures, failed;
        luna_seq2seq_graph_counts(model, &replays, &captures, &failed);
        printf("bench-model: pass graphs: %lld replayed, %lld captured, %lld captures failed\n",
               (long long)replays, (long long)captures, (long long)failed);
        if (failed)
            printf("bench-model: a capture failed: %s\n", luna_graph_cache_failure(model->graphs));
    }
    printf("bench-model-result: arch=%s linformer_k=%d l=%d batch=%d src_len=%d tgt_len=%d d=%d "
           "layers=%d "
           "heads=%d threads=%d steps_per_s=%.6f s_per_step=%.6f cpu_s_per_step=%.6f "
           "peak_bytes=%zu\n",
           arch, cfg.linformer_k, cfg.arch == LUNA_ARCH_LUNA ? cfg.projection_length : 0, B, M, N,
           cfg.encoder_embed_dim, cfg.encoder_layers, cfg.encoder_attention_heads, be->num_threads,
           1.0 / per_step, per_step, cpu_total / steps, peak);
    if (prof &&
        report(model, prof, &batch, steps, predict_batch, npredict, bo.bf16 ? 2 : 4) != LUNA_OK) {
        fprintf(stderr, "bench-model: %s\n", luna_error_message());
        return 1;
    }
    luna_op_profile_detach(prof);
    free(src), free(len), free(prev), free(tgt);
    luna_optimizer_free(g_opt);
    luna_tensor_table_free(g_trainable);
    luna_seq2seq_free(model);
    luna_backend_free(be);
    return 0;
}
