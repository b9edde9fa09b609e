/* luna-quantize: an fp32 checkpoint as an int8 inference checkpoint.
 *
 *   luna-quantize IN.safetensors OUT.safetensors --dtype int8
 *   luna-quantize IN.safetensors --output OUT.safetensors --dtype int8
 *
 * Every Linear weight (attention projections, Luna's pack/unpack projections, FFN) and embedding
 * table (the shared embedding / output projection) becomes int8 with fp32 per-output-channel
 * scales; biases, LayerNorms and P stay fp32 (the format: model/quantize.h). The configuration,
 * languages, dictionaries and SentencePiece model are kept; training state and optimizer tensors
 * are not (an int8 checkpoint is for translation: luna-train refuses it). luna-translate decodes
 * it in int8 on the CPU, with the translations of `luna-translate IN --quantize int8`. The output
 * is written atomically.
 *
 * Exit status: 0 success, 1 bad input or failure (one line on stderr), 2 usage error.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/options_registry.h"
#include "data/checkpoint_vocab.h"
#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "model/checkpoint.h"
#include "model/kernels/registry.h"
#include "model/quantize.h"
#include "model/seq2seq.h"
#include "tools/programs/program_start.h"

#define PROG "luna-quantize"

typedef struct {
    const char *input, *output, *dtype;
} options;

static options opt;

#define F(field) offsetof(options, field)
#define G "quantization"

/* clang-format off */
static const luna_option_spec OPTIONS[] = {
    {"--dtype", LUNA_OPT_CHOICE, NULL, G, "T", "int8", F(dtype), "the weights' type (required): int8, per output channel, symmetric"},
    {"--output", LUNA_OPT_STRING, NULL, G, "FILE", NULL, F(output), "the quantized checkpoint (or give it as the second argument; written atomically)"},
};
/* clang-format on */
#define NUM_OPTIONS ((int)(sizeof OPTIONS / sizeof OPTIONS[0]))

static const luna_option_table TABLE = {
    .specs = OPTIONS,
    .count = NUM_OPTIONS,
    .positional = "IN",
    .positional_offset = F(input),
};

static const char USAGE[] = "usage: " PROG " IN.safetensors OUT.safetensors --dtype int8\n\n"
                            "Writes IN's model with int8 weights (per-output-channel fp32 "
                            "scales) to OUT,\nfor luna-translate on the CPU.\n";

/* OUT as a second positional word: taken out of argv (the registry takes one positional). */
static const char *second_positional(int *argc, char **argv) {
    int seen = 0;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) == 0 && strlen(a) > 2) {
            if (!strchr(a, '=') && strcmp(a, "--help") != 0 && strcmp(a, "--version") != 0)
                i++; /* the option's value */
            continue;
        }
        if (++seen == 2) {
            memmove(argv + i, argv + i + 1, sizeof(char *) * (size_t)(*argc - i));
            (*argc)--;
            return a;
        }
    }
    return NULL;
}

static int parse_args(int argc, char **argv) {
    const char *out = second_positional(&argc, argv);
    int done = luna_options_parse_program(&TABLE, &opt, argc, argv, NULL, PROG, USAGE);
    if (done >= 0) return done;
    if (out && opt.output)
        return luna_options_usage_error(PROG, "%s", "give OUT or --output, not both");
    if (out) opt.output = out;
    if (!opt.input || !opt.output)
        return luna_options_usage_error(PROG, "%s", "IN and OUT checkpoints are required");
    if (!opt.dtype) return luna_options_usage_error(PROG, "%s", "--dtype int8 is required");
    return -1;
}

static double file_mb(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 ? (double)s.st_size / 1e6 : 0.0;
}

static luna_status quantize(void) {
    luna_backend *be = NULL;
    luna_seq2seq *model = NULL;
    luna_dictionary *src = NULL, *tgt = NULL;
    luna_spm *spm = NULL;
    luna_checkpoint_meta meta;
    memset(&meta, 0, sizeof meta);
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = 2;
    luna_status st = luna_backend_create(&be, "cpu", &bo);
    if (st == LUNA_OK) st = luna_checkpoint_load_model(opt.input, be, &model, &meta);
    if (st == LUNA_OK && model->params->weight_dtype == LUNA_I8)
        st = luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: already an int8 checkpoint", opt.input);
    if (st == LUNA_OK)
        st = luna_checkpoint_load_vocab(opt.input, model->config.vocab_size, &src, &tgt, &spm);
    if (st == LUNA_OK && (!src || !tgt))
        st = luna_error(LUNA_ERR_FORMAT, "%s: the checkpoint carries no vocabulary", opt.input);
    if (st == LUNA_OK) st = luna_params_quantize_int8(model->params);
    char *src_text = NULL, *tgt_text = NULL;
    if (st == LUNA_OK) {
        const void *spm_bytes = NULL;
        size_t spm_size = 0, len;
        if (spm) st = luna_spm_serialized(spm, &spm_bytes, &spm_size);
        if (st == LUNA_OK) st = luna_dictionary_to_text(src, &src_text, &len);
        if (st == LUNA_OK) st = luna_dictionary_to_text(tgt, &tgt_text, &len);
        luna_checkpoint_contents c = {.source_lang = meta.source_lang,
                                      .target_lang = meta.target_lang,
                                      .src_dict_text = src_text,
                                      .tgt_dict_text = tgt_text,
                                      .spm_model = spm_bytes,
                                      .spm_model_size = spm_size};
        if (st == LUNA_OK) st = luna_checkpoint_save(opt.output, model->params, &c);
    }
    if (st == LUNA_OK) {
        const luna_params *p = model->params;
        size_t n8 = 0;
        int t8 = 0;
        for (int i = 0; i < p->num_tensors; i++)
            if (p->tensors[i].int8) n8 += p->tensors[i].numel, t8++;
        printf(PROG ": %s (%.1f MB) -> %s (%.1f MB): %d tensors, %zu of %zu parameters in int8 "
                    "(fp32 parameters: %.1f MB)\n",
               opt.input, file_mb(opt.input), opt.output, file_mb(opt.output), t8, n8,
               p->num_params, (double)p->num_params * 4 / 1e6);
    }
    free(src_text);
    free(tgt_text);
    luna_seq2seq_free(model);
    luna_dictionary_free(src);
    luna_dictionary_free(tgt);
    luna_spm_free(spm);
    luna_checkpoint_meta_release(&meta);
    if (be) luna_backend_free(be);
    return st;
}

int main(int argc, char **argv) {
    luna_program_start(PROG, argv);
    int rc = parse_args(argc, argv);
    if (rc >= 0) return rc;
    if (quantize() != LUNA_OK) {
        fflush(stdout);
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 1;
    }
    return 0;
}
