/* luna-average: element-wise mean of the parameters of N checkpoints (fairseq's
 * scripts/average_checkpoints.py), written as an inference checkpoint.
 *
 *   luna-average --inputs A B C --output OUT
 *   luna-average --save-dir DIR --num-update-checkpoints N --output OUT   (last N checkpoint_E_U)
 *   luna-average --save-dir DIR --num-epoch-checkpoints N --output OUT    (last N checkpointE)
 *
 * Every input must describe the same model (architecture fields of the configuration) and carry
 * the same dictionaries; the output keeps the first input's metadata (configuration, languages,
 * dictionaries, SentencePiece model) without training state or optimizer tensors, so it is
 * ready for luna-translate. The mean is accumulated in double. The output is written atomically.
 *
 * Exit status: 0 success, 1 bad input or failure (one line on stderr), 2 usage error.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "core/file_util.h"
#include "model/seq2seq.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "model/quantize.h"
#include "core/options_registry.h"
#include "model/kernels/registry.h"

#define PROG "luna-average"

/* ---- options: one registry table drives parsing and --help (core/options_registry.h) ---- */

typedef struct {
    luna_option_words inputs;
    const char *save_dir, *output;
    int64_t num_update, num_epoch;
} options;

static options opt;

#define F(field) offsetof(options, field)
#define G_IN "checkpoints to average"
#define G_OUT "output"

/* clang-format off */
static const luna_option_spec OPTIONS[] = {
    {"--inputs", LUNA_OPT_WORDS, NULL, G_IN, "CKPT...", NULL, F(inputs), "checkpoints to average"},
    {"--save-dir", LUNA_OPT_STRING, NULL, G_IN, "DIR", NULL, F(save_dir), "directory holding checkpoint_<epoch>_<update> and checkpoint<epoch> files"},
    {"--num-update-checkpoints", LUNA_OPT_INT, NULL, G_IN, "N", NULL, F(num_update), "the last N checkpoint_<epoch>_<update> of --save-dir (by update)"},
    {"--num-epoch-checkpoints", LUNA_OPT_INT, NULL, G_IN, "N", NULL, F(num_epoch), "the last N checkpoint<epoch> of --save-dir (by epoch)"},
    {"--output", LUNA_OPT_STRING, NULL, G_OUT, "FILE", NULL, F(output), "the averaged checkpoint (written atomically; required)"},
};
/* clang-format on */
#define NUM_OPTIONS ((int)(sizeof OPTIONS / sizeof OPTIONS[0]))

static const luna_option_table TABLE = {.specs = OPTIONS, .count = NUM_OPTIONS};

static const char USAGE[] =
    "usage: " PROG " (--inputs CKPT... | --save-dir DIR --num-update-checkpoints N |\n"
    "                     --save-dir DIR --num-epoch-checkpoints N) --output FILE\n\n"
    "Averages the parameters of checkpoints (element-wise mean) into an inference\n"
    "checkpoint with the first input's metadata. All inputs must have the same\n"
    "architecture and dictionaries.\n";

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv) {
    bool given[NUM_OPTIONS];
    int done = luna_options_parse_program(&TABLE, &opt, argc, argv, given, PROG, USAGE);
    if (done >= 0) return done;
    const char *counts[] = {"--num-update-checkpoints", "--num-epoch-checkpoints"};
    const int64_t values[] = {opt.num_update, opt.num_epoch};
    for (int k = 0; k < 2; k++)
        if (given[luna_options_find(&TABLE, counts[k])] && values[k] < 1)
            return luna_options_usage_error(PROG, "%s must be a positive integer", counts[k]);
    if (!opt.output) return luna_options_usage_error(PROG, "%s", "--output FILE is required");
    int modes = (opt.inputs.count > 0) + (opt.num_update > 0) + (opt.num_epoch > 0);
    if (modes != 1)
        return luna_options_usage_error(PROG, "%s",
                                        "give exactly one of --inputs, --num-update-checkpoints, "
                                        "--num-epoch-checkpoints");
    if (!opt.inputs.count && !opt.save_dir)
        return luna_options_usage_error(PROG, "%s", "--save-dir DIR is required with --num-*");
    return -1;
}

typedef struct {
    long long key;
    char *path;
} found;

static int by_key_desc(const void *a, const void *b) {
    long long x = ((const found *)a)->key, y = ((const found *)b)->key;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The last n checkpoints of --save-dir, oldest first (fairseq's order: the mean is the same). */
static luna_status pick_last(bool updates, long n, char ***paths, int *count) {
    DIR *d = opendir(opt.save_dir);
    if (!d)
        return luna_error(LUNA_ERR_IO, "%s: cannot open the directory (check --save-dir)",
                          opt.save_dir);
    found *f = NULL;
    size_t k = 0, cap = 0;
    luna_status st = LUNA_OK;
    for (struct dirent *e; st == LUNA_OK && (e = readdir(d));) {
        unsigned long long ep = 0;
        long long up = 0;
        int end = -1;
        if (updates)
            sscanf(e->d_name, "checkpoint_%llu_%lld.safetensors%n", &ep, &up, &end);
        else
            sscanf(e->d_name, "checkpoint%llu.safetensors%n", &ep, &end);
        if (end < 0 || e->d_name[end]) continue;
        if (k == cap) {
            found *g = realloc(f, (cap = cap ? 2 * cap : 16) * sizeof *g);
            if (!g)
                st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
            else
                f = g;
        }
        if (st == LUNA_OK) {
            f[k].key = updates ? up : (long long)ep;
            f[k].path = luna_path_join(opt.save_dir, e->d_name);
            if (!f[k++].path) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    closedir(d);
    if (st == LUNA_OK && (long)k < n)
        st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                        "%s: found %zu %s checkpoints, fewer than the %ld asked for", opt.save_dir,
                        k, updates ? "checkpoint_<epoch>_<update>" : "checkpoint<epoch>", n);
    if (st == LUNA_OK) {
        qsort(f, k, sizeof *f, by_key_desc);
        *paths = malloc(sizeof(char *) * (size_t)n);
        if (!*paths) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        for (long i = 0; st == LUNA_OK && i < n; i++)
            (*paths)[i] = f[n - 1 - i].path, f[n - 1 - i].path = NULL;
        *count = (int)n;
    }
    for (size_t i = 0; i < k; i++)
        free(f[i].path);
    free(f);
    return st;
}

static luna_status average(char **paths, int n) {
    luna_backend *be = NULL;
    luna_seq2seq *model = NULL;
    luna_dictionary *src = NULL, *tgt = NULL;
    luna_spm *spm = NULL;
    luna_checkpoint_meta meta;
    memset(&meta, 0, sizeof meta);
    double *sum = NULL;
    float *host = NULL;
    luna_params *p = NULL;
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = 2;
    luna_status st = luna_backend_create(&be, "cpu", &bo); /* averaging runs on the host */
    if (st == LUNA_OK) st = luna_checkpoint_load_model(paths[0], be, &model, &meta);
    if (st == LUNA_OK)
        st = luna_checkpoint_load_vocab(paths[0], model->config.vocab_size, &src, &tgt, &spm);
    const size_t np = model ? model->params->num_params : 0;
    if (st == LUNA_OK) {
        sum = calloc(np ? np : 1, sizeof *sum);
        host = malloc(sizeof(float) * (np ? np : 1));
        if (!sum || !host)
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory averaging its %zu parameters", paths[0], np);
    }
    if (st == LUNA_OK) st = luna_params_create(&p, be, &model->config);
    for (int i = 0; i < n && st == LUNA_OK; i++) {
        luna_safetensors *f = NULL;
        luna_checkpoint_meta m;
        memset(&m, 0, sizeof m);
        luna_dictionary *s2 = NULL, *t2 = NULL;
        st = luna_checkpoint_open(&f, paths[i]);
        luna_dtype weights = LUNA_F32;
        if (st == LUNA_OK) st = luna_checkpoint_weight_dtype(f, &weights);
        if (st == LUNA_OK && weights == LUNA_I8)
            st = luna_error(LUNA_ERR_UNSUPPORTED,
                            "%s: an int8 checkpoint; average the fp32 checkpoints, then quantize "
                            "the average with luna-quantize",
                            paths[i]);
        if (st == LUNA_OK) st = luna_checkpoint_read_meta(f, &m);
        char a[32], b[32];
        const char *field =
            st == LUNA_OK
                ? luna_config_architecture_difference(&m.config, &model->config, a, b, sizeof a)
                : NULL;
        if (field)
            st = luna_error(LUNA_ERR_MISMATCH,
                            "%s: another architecture than %s: %s is %s there but %s in %s "
                            "(average checkpoints of one training run)",
                            paths[i], paths[0], field, a, b, paths[0]);
        if (st == LUNA_OK) st = luna_checkpoint_read_dicts(f, model->config.vocab_size, &s2, &t2);
        if (st == LUNA_OK && (!luna_dictionary_same_symbols(src, s2, NULL) ||
                              !luna_dictionary_same_symbols(tgt, t2, NULL)))
            st = luna_error(LUNA_ERR_MISMATCH, "%s: dictionaries differ from %s's", paths[i],
                            paths[0]);
        if (st == LUNA_OK) st = luna_params_load(p, f);
        if (st == LUNA_OK) st = luna_mem_to_host(be, host, p->data, np * sizeof(float));
        if (st == LUNA_OK) {
            for (size_t j = 0; j < np; j++)
                sum[j] += host[j];
        }
        luna_dictionary_free(s2);
        luna_dictionary_free(t2);
        luna_checkpoint_meta_release(&m);
        if (f) luna_safetensors_close(f);
    }
    if (st == LUNA_OK) {
        for (size_t j = 0; j < np; j++)
            host[j] = (float)(sum[j] / n);
        st = luna_mem_from_host(be, model->params->data, host, np * sizeof(float));
        const void *spm_bytes = NULL;
        size_t spm_size = 0, text_len;
        char *src_text = NULL, *tgt_text = NULL;
        if (st == LUNA_OK && spm) st = luna_spm_serialized(spm, &spm_bytes, &spm_size);
        if (st == LUNA_OK) st = luna_dictionary_to_text(src, &src_text, &text_len);
        if (st == LUNA_OK) st = luna_dictionary_to_text(tgt, &tgt_text, &text_len);
        luna_checkpoint_contents c = {.source_lang = meta.source_lang,
                                      .target_lang = meta.target_lang,
                                      .src_dict_text = src_text,
                                      .tgt_dict_text = tgt_text,
                                      .spm_model = spm_bytes,
                                      .spm_model_size = spm_size};
        if (st == LUNA_OK) st = luna_checkpoint_save(opt.output, model->params, &c);
        free(src_text);
        free(tgt_text);
    }
    if (st == LUNA_OK) {
        printf(PROG ": averaged %d checkpoints (%zu parameters) into %s\n", n, np, opt.output);
        for (int i = 0; i < n; i++)
            printf("  %s\n", paths[i]);
    }
    free(sum);
    free(host);
    luna_params_free(p);
    luna_seq2seq_free(model);
    luna_dictionary_free(src);
    luna_dictionary_free(tgt);
    luna_spm_free(spm);
    luna_checkpoint_meta_release(&meta);
    if (be) luna_backend_free(be);
    return st;
}

int main(int argc, char **argv) {
    int rc = parse_args(argc, argv);
    if (rc >= 0) return rc;
    char **paths = NULL;
    int n = 0;
    luna_status st = LUNA_OK;
    if (opt.inputs.count) {
        paths = opt.inputs.words;
        n = opt.inputs.count;
    } else {
        st = pick_last(opt.num_update > 0, opt.num_update > 0 ? opt.num_update : opt.num_epoch,
                       &paths, &n);
    }
    if (st == LUNA_OK) st = average(paths, n);
    if (!opt.inputs.count && paths) {
        for (int i = 0; i < n; i++)
            free(paths[i]);
        free(paths);
    }
    if (st != LUNA_OK) {
        fflush(stdout);
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 1;
    }
    return 0;
}
