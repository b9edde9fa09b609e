/* luna-train's options registry (see options.h). */
#include "trainer/options.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "model/kernels/registry.h"

#define F(field) offsetof(luna_train_options, field)
#define G_MODEL "model"
#define G_OPT "optimization"
#define G_LR "learning rate schedule"
#define G_DATA "data"
#define G_VALID "validation and stopping"
#define G_CKPT "checkpoints"
#define G_RUN "runtime and logging"
#define G_DIST "data parallelism (mpirun -np N luna-train ..., srun luna-train ...)"

/* clang-format off */
static const luna_option_spec SPECS[] = {
    {"--arch", LUNA_OPT_STRING, "luna_base_tied", G_MODEL, "ARCH", NULL, F(arch), "model architecture preset: luna_base_tied, luna_base_untied, transformer_base, luna_tiny, transformer_tiny, luna_demo; the options below default to its values"},
    {"--encoder-layers", LUNA_OPT_INT, NULL, G_MODEL, "N", NULL, F(encoder_layers), "encoder layers (default: from --arch)"},
    {"--decoder-layers", LUNA_OPT_INT, NULL, G_MODEL, "N", NULL, F(decoder_layers), "decoder layers (default: from --arch)"},
    {"--encoder-embed-dim", LUNA_OPT_INT, NULL, G_MODEL, "D", NULL, F(encoder_embed_dim), "encoder embedding dimension (default: from --arch)"},
    {"--decoder-embed-dim", LUNA_OPT_INT, NULL, G_MODEL, "D", NULL, F(decoder_embed_dim), "decoder embedding dimension (default: from --arch)"},
    {"--encoder-ffn-embed-dim", LUNA_OPT_INT, NULL, G_MODEL, "D", NULL, F(encoder_ffn_embed_dim), "encoder FFN dimension (default: from --arch)"},
    {"--decoder-ffn-embed-dim", LUNA_OPT_INT, NULL, G_MODEL, "D", NULL, F(decoder_ffn_embed_dim), "decoder FFN dimension (default: from --arch)"},
    {"--encoder-attention-heads", LUNA_OPT_INT, NULL, G_MODEL, "H", NULL, F(encoder_attention_heads), "encoder attention heads (default: from --arch)"},
    {"--decoder-attention-heads", LUNA_OPT_INT, NULL, G_MODEL, "H", NULL, F(decoder_attention_heads), "decoder attention heads (default: from --arch)"},
    {"--projection-length", LUNA_OPT_INT, NULL, G_MODEL, "L", NULL, F(projection_length), "Luna projection length l (default: from --arch)"},
    {"--causal-activation", LUNA_OPT_CHOICE, NULL, G_MODEL, "F", "softplus|elu", F(causal_activation), "activation of the causal Luna attention (default: from --arch)"},
    {"--untie-luna-kv", LUNA_OPT_FLAG, NULL, G_MODEL, NULL, NULL, F(untie_luna_kv), "separate key and value projections in Luna attention"},
    {"--fix-projection-length", LUNA_OPT_FLAG, NULL, G_MODEL, NULL, NULL, F(fix_projection_length), "always use l projected slots (no dynamic projection length)"},
    {"--linformer-k", LUNA_OPT_INT, NULL, G_MODEL, "K", NULL, F(linformer_k), "transformer: Linformer encoder self-attention with keys and values projected to K positions (default: from --arch; linformer_* presets)"},
    {"--linformer-max-length", LUNA_OPT_INT, NULL, G_MODEL, "N", NULL, F(linformer_max_length), "Linformer's fixed maximum source length N of E, F [K, N] (training skips longer pairs, translating them is an error; default: from --arch)"},
    {"--linformer-sharing", LUNA_OPT_CHOICE, NULL, G_MODEL, "S", "headwise|kv|layerwise", F(linformer_sharing), "Linformer E/F sharing: per layer (headwise), E = F per layer (kv), one for all layers (layerwise) (default: from --arch)"},
    {"--non-contextual-projection", LUNA_OPT_FLAG, NULL, G_MODEL, NULL, NULL, F(non_contextual_projection), "every layer packs its own learned P instead of the previous layer's packed context (the paper's Table 5 ablation)"},
    {"--share-all-embeddings", LUNA_OPT_FLAG, NULL, G_MODEL, NULL, NULL, F(share_all_embeddings), "share encoder, decoder and output embeddings (always on: the models here have one table; needs a joined dictionary)"},
    {"--dropout", LUNA_OPT_DOUBLE, NULL, G_MODEL, "P", NULL, F(dropout), "dropout probability (default: from --arch)"},
    {"--attention-dropout", LUNA_OPT_DOUBLE, NULL, G_MODEL, "P", NULL, F(attention_dropout), "dropout on attention weights (default: from --arch)"},
    {"--activation-dropout", LUNA_OPT_DOUBLE, NULL, G_MODEL, "P", NULL, F(activation_dropout), "dropout after the FFN activation (default: from --arch)"},
    {"--label-smoothing", LUNA_OPT_DOUBLE, NULL, G_MODEL, "EPS", NULL, F(label_smoothing), "label smoothing of the cross entropy (default: from --arch)"},
    {"--optimizer", LUNA_OPT_CHOICE, "apollo", G_OPT, "NAME", "apollo|adam", F(optimizer), "optimizer"},
    {"--lr", LUNA_OPT_DOUBLE, NULL, G_OPT, "LR", NULL, F(lr), "peak learning rate (default: from --lr-scheduler: milestone 0.1, inverse_sqrt 5e-4)"},
    {"--apollo-beta", LUNA_OPT_DOUBLE, "0.9", G_OPT, "B", NULL, F(apollo_beta), "Apollo's moving-average coefficient"},
    {"--apollo-eps", LUNA_OPT_DOUBLE, "1e-4", G_OPT, "EPS", NULL, F(apollo_eps), "Apollo's epsilon"},
    {"--rebound", LUNA_OPT_CHOICE, "constant", G_OPT, "R", "constant|belief", F(rebound), "Apollo's rectification of the Hessian approximation"},
    {"--weight-decay", LUNA_OPT_DOUBLE, "0", G_OPT, "WD", NULL, F(weight_decay), "weight decay (WMT recipe: 1e-8)"},
    {"--weight-decay-type", LUNA_OPT_CHOICE, "L2", G_OPT, "T", "L2|decoupled|stable", F(weight_decay_type), "Apollo's weight decay (Adam's is always decoupled)"},
    {"--adam-betas", LUNA_OPT_STRING, "(0.9, 0.98)", G_OPT, "B", NULL, F(adam_betas), "Adam's betas, e.g. '(0.9, 0.98)'"},
    {"--adam-eps", LUNA_OPT_DOUBLE, "1e-8", G_OPT, "EPS", NULL, F(adam_eps), "Adam's epsilon"},
    {"--clip-norm", LUNA_OPT_DOUBLE, "0", G_OPT, "C", NULL, F(clip_norm), "clip gradients to this L2 norm (0: no clipping; Luna recipe 0.1 with --clip-mode each)"},
    {"--clip-mode", LUNA_OPT_CHOICE, "total", G_OPT, "M", "each|total", F(clip_mode_name), "each: clip every tensor's gradient separately (Luna); total: one global norm (fairseq)"},
    {"--update-freq", LUNA_OPT_INT, "1", G_OPT, "N", NULL, F(update_freq), "accumulate gradients of N batches per update"},
    {"--lr-scheduler", LUNA_OPT_CHOICE, "milestone", G_LR, "S", "milestone|inverse_sqrt|fixed", F(lr_scheduler), "learning rate schedule"},
    {"--warmup-updates", LUNA_OPT_INT, NULL, G_LR, "N", NULL, F(warmup_updates), "linear warmup over N updates (default: milestone 1000, inverse_sqrt 4000, fixed 0)"},
    {"--warmup-init-lr", LUNA_OPT_DOUBLE, NULL, G_LR, "LR", NULL, F(warmup_init_lr), "learning rate at the start of the warmup (default: milestone 1e-5, inverse_sqrt 1e-7)"},
    {"--milestones", LUNA_OPT_LIST, NULL, G_LR, "K...", NULL, F(milestones), "milestone: multiply the lr by --lr-decay-rate after these updates (default: 300000 450000)"},
    {"--lr-decay-rate", LUNA_OPT_DOUBLE, NULL, G_LR, "F", NULL, F(lr_decay_rate), "milestone decay factor (default: 0.1)"},
    {"--max-tokens", LUNA_OPT_INT, "4096", G_DATA, "N", NULL, F(max_tokens), "padded tokens per batch (0: no limit)"},
    {"--max-sentences", LUNA_OPT_INT, "0", G_DATA, "N", NULL, F(max_sentences), "sentences per batch (0: no limit; alias --batch-size)"},
    {"--max-source-positions", LUNA_OPT_INT, "1024", G_DATA, "N", NULL, F(max_source_positions), "skip training pairs with longer sources (tokens incl. </s>)"},
    {"--max-target-positions", LUNA_OPT_INT, "1024", G_DATA, "N", NULL, F(max_target_positions), "skip training pairs with longer targets"},
    {"--required-batch-size-multiple", LUNA_OPT_INT, "8", G_DATA, "N", NULL, F(required_batch_size_multiple), "batch sizes are a multiple of N when possible"},
    {"--train-subset", LUNA_OPT_STRING, "train", G_DATA, "SPLIT", NULL, F(train_subset), "training split of the data-bin"},
    {"--valid-subset", LUNA_OPT_STRING, "valid", G_DATA, "SPLIT", NULL, F(valid_subset), "validation split of the data-bin"},
    {"--source-lang", LUNA_OPT_STRING, NULL, G_DATA, "SRC", NULL, F(source_lang), "source language (default: inferred from the data-bin)"},
    {"--target-lang", LUNA_OPT_STRING, NULL, G_DATA, "TGT", NULL, F(target_lang), "target language (default: inferred from the data-bin)"},
    {"--max-update", LUNA_OPT_INT, "-1", G_VALID, "N", NULL, F(max_update), "stop after N updates (-1: no limit; 0: build the model, print it and exit)"},
    {"--max-epoch", LUNA_OPT_INT, "0", G_VALID, "N", NULL, F(max_epoch), "stop after N epochs (0: no limit)"},
    {"--validate-interval", LUNA_OPT_INT, "1", G_VALID, "N", NULL, F(validate_interval), "validate every N epochs"},
    {"--validate-interval-updates", LUNA_OPT_INT, "0", G_VALID, "N", NULL, F(validate_interval_updates), "also validate every N updates (0: only at epoch ends)"},
    {"--patience", LUNA_OPT_INT, "-1", G_VALID, "N", NULL, F(patience), "stop when the validation loss has not improved for N consecutive validations (<= 0: never)"},
    {"--disable-validation", LUNA_OPT_FLAG, NULL, G_VALID, NULL, NULL, F(disable_validation), "never validate"},
    {"--save-dir", LUNA_OPT_STRING, "checkpoints", G_CKPT, "DIR", NULL, F(save_dir), "where checkpoints are written (and resumed from)"},
    {"--restore-file", LUNA_OPT_STRING, "checkpoint_last.safetensors", G_CKPT, "FILE", NULL, F(restore_file), "resume from FILE (relative names are in --save-dir; the default is optional)"},
    {"--save-interval", LUNA_OPT_INT, "1", G_CKPT, "N", NULL, F(save_interval), "save checkpoint<epoch> every N epochs"},
    {"--save-interval-updates", LUNA_OPT_INT, "0", G_CKPT, "N", NULL, F(save_interval_updates), "save checkpoint_<epoch>_<update> every N updates (0: never)"},
    {"--keep-interval-updates", LUNA_OPT_INT, "-1", G_CKPT, "N", NULL, F(keep_interval_updates), "keep only the last N update checkpoints (-1: all)"},
    {"--keep-last-epochs", LUNA_OPT_INT, "-1", G_CKPT, "N", NULL, F(keep_last_epochs), "keep only the last N epoch checkpoints (-1: all)"},
    {"--no-save", LUNA_OPT_FLAG, NULL, G_CKPT, NULL, NULL, F(no_save), "write no checkpoints"},
    {"--no-epoch-checkpoints", LUNA_OPT_FLAG, NULL, G_CKPT, NULL, NULL, F(no_epoch_checkpoints), "write only checkpoint_last and checkpoint_best at epoch ends"},
    {"--reset-optimizer", LUNA_OPT_FLAG, NULL, G_CKPT, NULL, NULL, F(reset_optimizer), "when resuming, start with a fresh optimizer state (and allow other optimizer options, --clip-norm, dropout or label smoothing)"},
    {"--reset-dataloader", LUNA_OPT_FLAG, NULL, G_CKPT, NULL, NULL, F(reset_dataloader), "when resuming, start from the first batch of epoch 1 (and allow another --seed, --max-tokens, --max-sentences, --update-freq)"},
    {"--reset-lr-scheduler", LUNA_OPT_FLAG, NULL, G_CKPT, NULL, NULL, F(reset_lr_scheduler), "when resuming, allow another --lr, --lr-scheduler, --warmup-* or --milestones (the new schedule from the current update on)"},
    {"--seed", LUNA_OPT_INT, "1", G_RUN, "N", NULL, F(seed), "seed of the initialisation, dropout and batch order"},
    {"--device", LUNA_OPT_CHOICE, "cpu", G_RUN, "D", "cpu|cuda", F(device), "where to train"},
    {"--device-id", LUNA_OPT_INT, "-1", G_RUN, "N", NULL, F(device_id), "the GPU of --device cuda (-1: the first, or the local rank's under MPI)"},
    {"--precision", LUNA_OPT_CHOICE, "auto", G_RUN, "P", "auto|fp32|bf16", F(precision), "activations on --device cuda: bf16 (fp32 master weights, gradients and optimizer) or fp32; auto: bf16 on cuda, fp32 on cpu"},
    {"--tf32", LUNA_OPT_FLAG, NULL, G_RUN, NULL, NULL, F(tf32), "--device cuda --precision fp32: let GEMMs use TF32 tensor cores"},
    {"--threads", LUNA_OPT_INT, "0", G_RUN, "N", NULL, F(threads), "CPU threads (0: OpenMP's default)"},
    {"--log-interval", LUNA_OPT_INT, "100", G_RUN, "N", NULL, F(log_interval), "log every N updates"},
    {"--log-format", LUNA_OPT_CHOICE, "simple", G_RUN, "F", "simple|json", F(log_format), "simple: fairseq-like lines; json: one object per line"},
    {"--no-progress-bar", LUNA_OPT_FLAG, NULL, G_RUN, NULL, NULL, F(no_progress_bar), "no progress line on a terminal"},
    {"--bucket-size-mb", LUNA_OPT_DOUBLE, "25", G_DIST, "MB", NULL, F(bucket_size_mb), "gradients are summed across ranks in buckets of this many MB (fp32), each started as soon as the backward pass has finished it; 0: one all-reduce after the backward"},
    {"--comm-timeout", LUNA_OPT_DOUBLE, "1800", G_DIST, "S", NULL, F(comm_timeout), "a collective that has not completed after S seconds (a rank died or hangs) aborts every rank with a message; 0: wait forever"},
};
/* clang-format on */
#define NUM_SPECS ((int)(sizeof SPECS / sizeof SPECS[0]))
_Static_assert(sizeof SPECS / sizeof SPECS[0] <= LUNA_TRAIN_MAX_OPTIONS, "too many options");

static const luna_option_alias ALIASES[] = {{"--batch-size", "--max-sentences"}};

static const luna_option_table TABLE = {
    .specs = SPECS,
    .count = NUM_SPECS,
    .aliases = ALIASES,
    .num_aliases = (int)(sizeof ALIASES / sizeof ALIASES[0]),
    .positional = "DATA-BIN",
    .positional_offset = F(data_bin),
    .list_buffer_offset = F(milestones_buf),
    .list_buffer_size = sizeof(((luna_train_options *)0)->milestones_buf),
    .help_width = 34,
};

const luna_option_spec *luna_train_option_specs(int *count) {
    *count = NUM_SPECS;
    return SPECS;
}

const luna_option_table *luna_train_option_table(void) { return &TABLE; }

void luna_train_options_init(luna_train_options *o) {
    memset(o, 0, sizeof *o);
    (void)luna_options_set_defaults(&TABLE, o); /* the table's defaults are tested */
}

static bool given(const luna_train_options *o, const char *name) {
    return o->set[luna_options_find(&TABLE, name)];
}

static luna_status bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static luna_status bad(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s", msg);
}

/* Model options: preset values unless given. */
static luna_status resolve_model(luna_train_options *o) {
    luna_config c;
    if (luna_config_preset(&c, o->arch) != LUNA_OK) return bad("--arch: %s", luna_error_message());
    struct {
        const char *name;
        int64_t *opt;
        int *cfg;
    } ints[] = {
        {"--encoder-layers", &o->encoder_layers, &c.encoder_layers},
        {"--decoder-layers", &o->decoder_layers, &c.decoder_layers},
        {"--encoder-embed-dim", &o->encoder_embed_dim, &c.encoder_embed_dim},
        {"--decoder-embed-dim", &o->decoder_embed_dim, &c.decoder_embed_dim},
        {"--encoder-ffn-embed-dim", &o->encoder_ffn_embed_dim, &c.encoder_ffn_embed_dim},
        {"--decoder-ffn-embed-dim", &o->decoder_ffn_embed_dim, &c.decoder_ffn_embed_dim},
        {"--encoder-attention-heads", &o->encoder_attention_heads, &c.encoder_attention_heads},
        {"--decoder-attention-heads", &o->decoder_attention_heads, &c.decoder_attention_heads},
        {"--projection-length", &o->projection_length, &c.projection_length},
        {"--linformer-k", &o->linformer_k, &c.linformer_k},
        {"--linformer-max-length", &o->linformer_max_length, &c.max_source_positions},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (given(o, ints[i].name)) {
            if (*ints[i].opt <= 0 || *ints[i].opt > 1000000)
                return bad("%s must be a positive integer (got %lld)", ints[i].name,
                           (long long)*ints[i].opt);
            *ints[i].cfg = (int)*ints[i].opt;
        }
        *ints[i].opt = *ints[i].cfg;
    }
    struct {
        const char *name;
        double *opt, *cfg;
    } probs[] = {
        {"--dropout", &o->dropout, &c.dropout},
        {"--attention-dropout", &o->attention_dropout, &c.attention_dropout},
        {"--activation-dropout", &o->activation_dropout, &c.activation_dropout},
        {"--label-smoothing", &o->label_smoothing, &c.label_smoothing},
    };
    for (size_t i = 0; i < sizeof probs / sizeof probs[0]; i++) {
        if (given(o, probs[i].name)) {
            if (!(*probs[i].opt >= 0 && *probs[i].opt < 1))
                return bad("%s must be in [0, 1) (got %g)", probs[i].name, *probs[i].opt);
            *probs[i].cfg = *probs[i].opt;
        }
        *probs[i].opt = *probs[i].cfg;
    }
    bool luna = c.arch == LUNA_ARCH_LUNA;
    const char *luna_only[] = {"--projection-length", "--causal-activation", "--untie-luna-kv",
                               "--fix-projection-length", "--non-contextual-projection"};
    for (size_t i = 0; i < sizeof luna_only / sizeof luna_only[0]; i++)
        if (!luna && given(o, luna_only[i]))
            return bad("%s applies to Luna architectures only (--arch %s is a transformer)",
                       luna_only[i], o->arch);
    if (given(o, "--causal-activation"))
        c.causal_activation =
            strcmp(o->causal_activation, "elu") == 0 ? LUNA_CAUSAL_ELU : LUNA_CAUSAL_SOFTPLUS;
    o->causal_activation = c.causal_activation == LUNA_CAUSAL_ELU ? "elu" : "softplus";
    if (o->untie_luna_kv) c.untie_luna_kv = true;
    if (o->fix_projection_length) c.fix_projection_length = true;
    if (o->non_contextual_projection) c.non_contextual_projection = true;
    if (given(o, "--linformer-sharing") &&
        luna_linformer_sharing_parse(o->linformer_sharing, &c.linformer_sharing) != LUNA_OK)
        return bad("--linformer-sharing: %s", luna_error_message());
    o->linformer_sharing = luna_linformer_sharing_name(c.linformer_sharing);
    /* Linformer's E, F have a fixed length: training skips longer pairs (fairseq's behaviour)
     * rather than stopping at the first long batch. */
    if (c.linformer_k > 0 && o->max_source_positions > c.max_source_positions)
        o->max_source_positions = c.max_source_positions;
    if (c.arch == LUNA_ARCH_LUNA && (given(o, "--linformer-k") || given(o, "--linformer-sharing")))
        return bad("--linformer-k/--linformer-sharing apply to the transformer architecture only "
                   "(--arch %s is Luna)",
                   o->arch);
    o->untie_luna_kv = c.untie_luna_kv;
    o->fix_projection_length = c.fix_projection_length;
    o->non_contextual_projection = c.non_contextual_projection;
    o->share_all_embeddings = true;
    c.vocab_size = 1000; /* placeholder for validation; the dictionary sets the real one */
    if (luna_config_validate(&c) != LUNA_OK) return bad("%s", luna_error_message());
    c.vocab_size = 0;
    o->model = c;
    return LUNA_OK;
}

static luna_status parse_betas(const char *text, double *b1, double *b2) {
    char buf[128];
    size_t j = 0;
    for (const char *p = text; *p && j + 1 < sizeof buf; p++)
        buf[j++] = (*p == '(' || *p == ')' || *p == '[' || *p == ']' || *p == ',') ? ' ' : *p;
    buf[j] = '\0';
    char *end;
    *b1 = strtod(buf, &end);
    char *end2;
    *b2 = strtod(end, &end2);
    while (*end2 == ' ')
        end2++;
    if (end == buf || end2 == end || *end2 || !(*b1 >= 0 && *b1 < 1) || !(*b2 >= 0 && *b2 < 1))
        return bad("--adam-betas: '%s' is not two numbers in [0, 1), e.g. '(0.9, 0.98)'", text);
    return LUNA_OK;
}

static luna_status resolve_optimization(luna_train_options *o) {
    luna_optimizer_config *c = &o->optim;
    luna_optimizer_config_defaults(c, strcmp(o->optimizer, "adam") == 0 ? LUNA_OPTIMIZER_ADAM
                                                                        : LUNA_OPTIMIZER_APOLLO);
    if (luna_optimizer_config_parse_names(c, o->optimizer, o->rebound, o->weight_decay_type) !=
        LUNA_OK)
        return bad("%s", luna_error_message());
    if (!(o->apollo_beta >= 0 && o->apollo_beta < 1))
        return bad("--apollo-beta must be in [0, 1) (got %g)", o->apollo_beta);
    if (!(o->apollo_eps > 0)) return bad("--apollo-eps must be > 0 (got %g)", o->apollo_eps);
    if (!(o->adam_eps > 0)) return bad("--adam-eps must be > 0 (got %g)", o->adam_eps);
    if (o->weight_decay < 0) return bad("--weight-decay must be >= 0 (got %g)", o->weight_decay);
    LUNA_TRY(parse_betas(o->adam_betas, &c->adam_beta1, &c->adam_beta2));
    c->apollo_beta = o->apollo_beta;
    c->apollo_eps = o->apollo_eps;
    c->weight_decay = o->weight_decay;
    c->adam_eps = o->adam_eps;
    if (o->clip_norm < 0) return bad("--clip-norm must be >= 0 (got %g)", o->clip_norm);
    o->clip_mode = strcmp(o->clip_mode_name, "each") == 0 ? LUNA_CLIP_EACH : LUNA_CLIP_TOTAL;
    if (!(o->bucket_size_mb >= 0 && o->bucket_size_mb <= 1e6))
        return bad("--bucket-size-mb must be in [0, 1e6] (got %g)", o->bucket_size_mb);
    if (!(o->comm_timeout >= 0))
        return bad("--comm-timeout must be >= 0 seconds (got %g)", o->comm_timeout);
    if (o->update_freq < 1 || o->update_freq > 1000000)
        return bad("--update-freq must be >= 1 (got %lld)", (long long)o->update_freq);

    luna_lr_scheduler_config *l = &o->lr_config;
    luna_lr_scheduler_kind kind;
    if (luna_lr_scheduler_kind_parse(o->lr_scheduler, &kind) != LUNA_OK)
        return bad("--lr-scheduler: %s", luna_error_message());
    luna_lr_scheduler_defaults(l, kind);
    if (given(o, "--lr")) l->lr = o->lr;
    if (given(o, "--warmup-updates")) l->warmup_updates = o->warmup_updates;
    if (given(o, "--warmup-init-lr")) l->warmup_init_lr = o->warmup_init_lr;
    if (given(o, "--lr-decay-rate")) l->decay_rate = o->lr_decay_rate;
    if (given(o, "--milestones")) {
        l->num_milestones = 0;
        if (luna_lr_parse_milestones(l, o->milestones) != LUNA_OK)
            return bad("--milestones: %s", luna_error_message());
    }
    if (!(l->lr > 0)) return bad("--lr must be > 0 (got %g)", l->lr);
    if (l->warmup_updates < 0)
        return bad("--warmup-updates must be >= 0 (got %lld)", (long long)l->warmup_updates);
    if (l->warmup_init_lr > l->lr)
        return bad("--warmup-init-lr %g is larger than --lr %g (warmup goes up to --lr)",
                   l->warmup_init_lr, l->lr);
    if (luna_lr_scheduler_check(l) != LUNA_OK) return bad("%s", luna_error_message());
    o->lr = l->lr;
    o->warmup_updates = l->warmup_updates;
    o->warmup_init_lr = l->warmup_init_lr;
    o->lr_decay_rate = l->decay_rate;
    size_t n = 0;
    o->milestones_buf[0] = '\0';
    for (int i = 0; i < l->num_milestones && n < sizeof o->milestones_buf; i++)
        n += (size_t)snprintf(o->milestones_buf + n, sizeof o->milestones_buf - n, "%s%lld",
                              i ? " " : "", (long long)l->milestones[i]);
    o->milestones = o->milestones_buf;
    return LUNA_OK;
}

static luna_status check_ranges(const luna_train_options *o) {
    struct {
        const char *name;
        int64_t v, lo;
    } r[] = {
        {"--max-tokens", o->max_tokens, 0},
        {"--max-sentences", o->max_sentences, 0},
        {"--max-source-positions", o->max_source_positions, 1},
        {"--max-target-positions", o->max_target_positions, 1},
        {"--required-batch-size-multiple", o->required_batch_size_multiple, 1},
        {"--max-update", o->max_update, -1},
        {"--max-epoch", o->max_epoch, 0},
        {"--validate-interval", o->validate_interval, 1},
        {"--validate-interval-updates", o->validate_interval_updates, 0},
        {"--save-interval", o->save_interval, 1},
        {"--save-interval-updates", o->save_interval_updates, 0},
        {"--keep-interval-updates", o->keep_interval_updates, -1},
        {"--keep-last-epochs", o->keep_last_epochs, -1},
        {"--seed", o->seed, 0},
        {"--threads", o->threads, 0},
        {"--log-interval", o->log_interval, 1},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo)
            return bad("%s must be >= %lld (got %lld)", r[i].name, (long long)r[i].lo,
                       (long long)r[i].v);
    if (o->max_tokens == 0 && o->max_sentences == 0)
        return bad("--max-tokens 0 and --max-sentences 0: give at least one batch size limit");
    if (o->threads > 1024)
        return bad("--threads must be <= 1024 (got %lld)", (long long)o->threads);
    const char *missing = luna_backend_missing(o->device);
    if (missing) return bad("--device %s: %s; use --device cpu", o->device, missing);
    luna_backend_options bo = luna_backend_options_default();
    if (luna_backend_options_set_precision(&bo, o->device, o->precision, o->tf32, true) !=
            LUNA_OK ||
        luna_backend_options_set_device_id(&bo, o->device, (long long)o->device_id) != LUNA_OK)
        return bad("%s", luna_error_message());
    if (!*o->save_dir) return bad("--save-dir must not be empty");
    return LUNA_OK;
}

luna_status luna_train_options_parse(luna_train_options *o, int argc, char **argv) {
    luna_train_options_init(o);
    o->argc = argc > 0 ? argc - 1 : 0;
    o->argv = argc > 0 ? argv + 1 : argv;
    luna_options_action action;
    LUNA_TRY(luna_options_parse(&TABLE, o, argc, argv, o->set, &action));
    if (action != LUNA_OPTIONS_RUN) {
        o->help = action == LUNA_OPTIONS_HELP;
        o->version = action == LUNA_OPTIONS_VERSION;
        return LUNA_OK;
    }
    if (!o->data_bin)
        return bad("missing DATA-BIN directory (usage: luna-train DATA-BIN [options])");
    LUNA_TRY(resolve_model(o));
    LUNA_TRY(resolve_optimization(o));
    return check_ranges(o);
}

void luna_train_options_print_help(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s DATA-BIN [options]\n\n"
            "Train a Luna (or Transformer) translation model on a fairseq data-bin (made by\n"
            "luna-preprocess or fairseq-preprocess with a joined dictionary). Checkpoints go to\n"
            "--save-dir; running the same command again resumes from checkpoint_last exactly.\n"
            "SIGINT/SIGTERM: the current update finishes, checkpoint_last is written, exit 0.\n"
            "Data parallel (a -DLUNA_MPI=ON build): one process per GPU or CPU share,\n"
            "  mpirun -np 8 %s DATA-BIN --device cuda ...          (one node, 8 GPUs)\n"
            "  mpirun -H a:8,b:8 -x NCCL_SOCKET_IFNAME=eth0 %s ... (two nodes)\n"
            "  srun -N 2 --ntasks-per-node 8 --kill-on-bad-exit=1 %s ...  (Slurm)\n"
            "each rank on the GPU of its local rank; NCCL_DEBUG=INFO shows NCCL's choices.\n",
            prog, prog, prog, prog);
    luna_options_print_help(&TABLE, f);
}

bool luna_train_option_applies(const luna_train_options *o, const char *name) {
    static const struct {
        const char *name, *only; /* the option applies only with `only` */
    } only[] = {
        {"--apollo-beta", "apollo"},   {"--apollo-eps", "apollo"},
        {"--rebound", "apollo"},       {"--weight-decay-type", "apollo"},
        {"--adam-betas", "adam"},      {"--adam-eps", "adam"},
        {"--milestones", "milestone"}, {"--lr-decay-rate", "milestone"},
    };
    for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
        if (!strcmp(name, only[i].name))
            return !strcmp(only[i].only, o->optimizer) || !strcmp(only[i].only, o->lr_scheduler);
    /* fixed warms up from 0 (fairseq), never from --warmup-init-lr */
    if (!strcmp(name, "--warmup-init-lr")) return strcmp(o->lr_scheduler, "fixed") != 0;
    if (!strcmp(name, "--clip-mode")) return o->clip_norm > 0;
    if (!strcmp(name, "--projection-length") || !strcmp(name, "--causal-activation") ||
        !strcmp(name, "--untie-luna-kv") || !strcmp(name, "--fix-projection-length") ||
        !strcmp(name, "--non-contextual-projection"))
        return o->model.arch == LUNA_ARCH_LUNA;
    if (!strcmp(name, "--linformer-k")) return o->model.arch == LUNA_ARCH_TRANSFORMER;
    if (!strcmp(name, "--linformer-max-length") || !strcmp(name, "--linformer-sharing"))
        return o->model.linformer_k > 0;
    return true;
}

void luna_train_options_print(const luna_train_options *o, FILE *f) {
    bool shown[LUNA_TRAIN_MAX_OPTIONS];
    for (int i = 0; i < NUM_SPECS; i++)
        shown[i] = luna_train_option_applies(o, SPECS[i].name);
    fprintf(f, "data-bin: %s", o->data_bin);
    luna_options_print_config_shown(&TABLE, o, shown, f);
}

luna_status luna_train_options_to_json(const luna_train_options *o, char **json) {
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "data_bin");
    luna_json_string(&w, o->data_bin);
    luna_options_write_json(&TABLE, o, &w);
    luna_json_key(&w, "argv");
    luna_json_begin_array(&w);
    for (int i = 0; i < o->argc; i++)
        luna_json_string(&w, o->argv[i]);
    luna_json_end_array(&w);
    luna_json_end_object(&w);
    return luna_json_writer_finish(&w, json, NULL);
}
