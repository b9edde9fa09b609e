/* Time per update of gradient clipping + the optimizer step over a model's parameter table.
 *
 *   bench-optimizer [--arch luna_base_tied] [--vocab 32000] [--optimizer apollo|adam|both]
 *                   [--clip-mode each|total] [--clip-norm 0.1] [--threads 1,2] [--reps 5]
 *
 * The update is luna_optimizer_step (optim/), which clips inside: multi-tensor ops over the
 * trainable tensors' table, one launch each, one scalar readback, no allocation per update.
 * The gradients are restored before every update (outside the timed region), so every timed
 * update clips. Prints ms/update (best and median of --reps) and the ops, readbacks and
 * allocations per update. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "model/config.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/param_table.h"
#include "optim/clip.h"
#include "optim/optimizer.h"

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void usage(void) {
    printf("usage: bench-optimizer [--arch NAME] [--vocab V] [--optimizer apollo|adam|both]\n"
           "                       [--clip-mode each|total] [--clip-norm C] [--threads LIST]\n"
           "                       [--reps R]\n"
           "  ms per update of clipping + optimizer step (multi-tensor ops)\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what) {
    fprintf(stderr, "bench-optimizer: %s: %s\n", what, luna_error_message());
    exit(1);
}

int main(int argc, char **argv) {
    const char *arch = "luna_base_tied", *which = "both", *mode_name = "each";
    int vocab = 32000, reps = 5;
    double clip_norm = 0.1;
    char threads_list[64] = "1,2";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench-optimizer: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--arch"))
            arch = argv[++i];
        else if (!strcmp(argv[i], "--vocab"))
            vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--optimizer"))
            which = argv[++i];
        else if (!strcmp(argv[i], "--clip-mode"))
            mode_name = argv[++i];
        else if (!strcmp(argv[i], "--clip-norm"))
            clip_norm = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads"))
            snprintf(threads_list, sizeof threads_list, "%s", argv[++i]);
        else {
            fprintf(stderr, "bench-optimizer: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    luna_clip_mode mode;
    if (luna_clip_mode_parse(mode_name, &mode) != LUNA_OK) die("--clip-mode");
    if (reps <= 0 || reps > 64 || vocab <= 4 || !(clip_norm > 0)) {
        fprintf(stderr, "bench-optimizer: --reps (at most 64), --vocab and --clip-norm must be "
                        "positive\n");
        return 2;
    }
    luna_config cfg;
    if (luna_config_preset(&cfg, arch) != LUNA_OK) die("--arch");
    cfg.vocab_size = vocab;
    luna_backend *be;
    if (luna_backend_cpu_create(&be, 1) != LUNA_OK) die("backend");
    luna_params *p;
    if (luna_params_create(&p, be, &cfg) != LUNA_OK) die("parameters");
    if (luna_params_init(p, 1) != LUNA_OK) die("init");
    /* Gradients: uniform, tensor norms of about 1 (so clip-norm 0.1 clips every tensor). */
    size_t np = p->num_params;
    float *g0 = malloc(np * sizeof *g0);
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < np; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        g0[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        float f = 1.0f / sqrtf((float)(t->numel ? t->numel : 1) / 3.0f);
        for (size_t j = 0; j < t->numel; j++)
            g0[t->offset + j] *= f;
    }
    int trainable = 0;
    for (int i = 0; i < p->num_tensors; i++)
        trainable += p->tensors[i].has_grad;
    printf("bench-optimizer: %s, %zu parameters in %d tensors (%d trained), clip-mode %s, "
           "clip-norm %g\n",
           arch, np, p->num_tensors, trainable, mode_name, clip_norm);

    for (int kind = 0; kind <= 1; kind++) {
        if (strcmp(which, "both") && strcmp(which, kind ? "adam" : "apollo")) continue;
        luna_optimizer_config oc;
        luna_optimizer_config_defaults(&oc, kind ? LUNA_OPTIMIZER_ADAM : LUNA_OPTIMIZER_APOLLO);
        luna_tensor_table *tt;
        luna_optimizer *opt;
        if (luna_params_trainable_table(p, &tt) != LUNA_OK) die("tensor table");
        if (luna_optimizer_create(&opt, be, &oc, tt, p->data, p->grad) != LUNA_OK) die("optimizer");
        char list[64], *save = NULL;
        snprintf(list, sizeof list, "%s", threads_list);
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            luna_backend_cpu_set_threads(be, atoi(tok));
            double times[64];
            size_t reads = 0, allocs = 0;
            for (int r = 0; r <= reps; r++) { /* r = 0: warm-up */
                if (luna_mem_from_host(be, p->grad, g0, np * sizeof(float)) != LUNA_OK)
                    die("gradients");
                size_t reads0 = be->to_host_calls, allocs0 = be->alloc_calls;
                double t0 = now_seconds();
                luna_optimizer_step_args a = {
                    .lr = 1e-4, .grad_scale = 1.0, .clip_norm = clip_norm, .clip_mode = mode};
                luna_status st = luna_optimizer_step(opt, &a, NULL);
                if (st == LUNA_OK) st = luna_backend_synchronize(be);
                double t = now_seconds() - t0;
                if (st != LUNA_OK) die("update");
                if (r > 0) times[r - 1] = t;
                reads = be->to_host_calls - reads0;
                allocs = be->alloc_calls - allocs0;
            }
            qsort(times, (size_t)reps, sizeof(double), cmp_double);
            /* 4 ops: multi_sum_squares, clip_coefficients, multi_scale, the update */
            printf("  %-6s threads=%s: %8.2f ms/update best, %8.2f median  (4 ops, %zu readbacks, "
                   "%zu allocations per update)\n",
                   kind ? "adam" : "apollo", tok, times[0] * 1e3, times[reps / 2] * 1e3, reads,
                   allocs);
        }
        luna_optimizer_free(opt);
        luna_tensor_table_free(tt);
    }
    free(g0);
    luna_params_free(p);
    luna_backend_free(be);
    return 0;
}
