/* luna-train's options: ONE registry (name, type, default, group, help) that drives command-line
 * parsing, --help (grouped), validation, the printed configuration and the "args" JSON stored in
 * checkpoints (Marian's options registry, with fairseq's flag names). The table is parsed by the
 * generic core/options_registry.h, as are the tables of the other programs.
 *
 * Derived defaults: options whose registry default is NULL take their value from a preset:
 *   architecture options (--encoder-layers, --dropout, --label-smoothing, ...) from --arch,
 *   --lr/--warmup-updates/--warmup-init-lr/--milestones/--lr-decay-rate from --lr-scheduler,
 *   --source-lang/--target-lang from the data-bin's file names.
 * A value given on the command line always wins. After luna_train_options_parse() every field
 * holds the effective value (resolved configurations in `model`, `optim`, `lr`, `clip_mode`).
 */
#ifndef LUNA_TRAINER_OPTIONS_H
#define LUNA_TRAINER_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/config.h"
#include "core/status.h"
#include "optim/clip.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "core/options_registry.h"

#define LUNA_TRAIN_MAX_OPTIONS 96

typedef struct {
    const char *data_bin;
    /* model */
    const char *arch, *causal_activation, *linformer_sharing;
    int64_t encoder_layers, decoder_layers, encoder_embed_dim, decoder_embed_dim;
    int64_t encoder_ffn_embed_dim, decoder_ffn_embed_dim, encoder_attention_heads;
    int64_t decoder_attention_heads, projection_length, linformer_k, linformer_max_length;
    bool untie_luna_kv, fix_projection_length, non_contextual_projection, share_all_embeddings;
    double dropout, attention_dropout, activation_dropout, label_smoothing;
    /* optimization */
    const char *optimizer, *rebound, *weight_decay_type, *adam_betas, *clip_mode_name;
    double lr, apollo_beta, apollo_eps, weight_decay, adam_eps, clip_norm;
    int64_t update_freq, max_update, max_epoch;
    /* lr schedule */
    const char *lr_scheduler, *milestones;
    int64_t warmup_updates;
    double warmup_init_lr, lr_decay_rate;
    /* data */
    int64_t max_tokens, max_sentences, max_source_positions, max_target_positions;
    int64_t required_batch_size_multiple;
    const char *train_subset, *valid_subset, *source_lang, *target_lang;
    /* validation */
    int64_t validate_interval, validate_interval_updates, patience;
    bool disable_validation;
    /* checkpoints */
    const char *save_dir, *restore_file;
    int64_t save_interval, save_interval_updates, keep_interval_updates, keep_last_epochs;
    bool no_save, no_epoch_checkpoints, reset_optimizer, reset_dataloader, reset_lr_scheduler;
    /* runtime and logging */
    int64_t seed, threads, log_interval, device_id;
    const char *device, *precision, *log_format;
    bool no_progress_bar, tf32;
    /* data parallelism */
    double bucket_size_mb, comm_timeout;

    /* which options were given on the command line (index into the registry) */
    bool set[LUNA_TRAIN_MAX_OPTIONS];
    /* the command line as given (argv[1..]), for the checkpoint */
    int argc;
    char **argv;
    char milestones_buf[512];

    /* resolved (vocab_size of `model` is 0 until the dictionary is known) */
    luna_config model;
    luna_optimizer_config optim;
    luna_lr_scheduler_config lr_config;
    luna_clip_mode clip_mode;
    bool help, version; /* --help / --version seen: nothing else is checked */
} luna_train_options;

/* The registry. */
const luna_option_spec *luna_train_option_specs(int *count);
const luna_option_table *luna_train_option_table(void);

/* Defaults of every option. */
void luna_train_options_init(luna_train_options *o);

/* Parse argv (argv[0] is the program), apply presets and validate. Errors are
 * LUNA_ERR_INVALID_ARGUMENT with one line such as "unknown option '--foo' (see --help)" or
 * "--update-freq must be >= 1 (got 0)". Values point into argv (which must outlive o). */
luna_status luna_train_options_parse(luna_train_options *o, int argc, char **argv);

/* --help text, options grouped as in the registry. */
void luna_train_options_print_help(FILE *f, const char *prog);

/* The effective configuration, one line per group ("  model: --arch luna_tiny --dropout 0.1 ..."),
 * of the options that apply to this run (luna_train_option_applies): the start of train.log. */
void luna_train_options_print(const luna_train_options *o, FILE *f);

/* Whether option `name` has an effect with the chosen optimizer, lr scheduler, clipping and
 * architecture of the parsed options `o`: no Apollo options for Adam and no Adam options for
 * Apollo, --milestones/--lr-decay-rate only for milestone, --warmup-init-lr not for fixed,
 * --clip-mode only with --clip-norm > 0, the Luna attention options not for a transformer.
 * The checkpoint's JSON (luna_train_options_to_json) keeps every option. */
bool luna_train_option_applies(const luna_train_options *o, const char *name);

/* {"data_bin": ..., "arch": ..., ...} (keys: flag names with '_'), every option's effective value,
 * plus "argv": the command line as given. *json malloc'ed. */
luna_status luna_train_options_to_json(const luna_train_options *o, char **json);

#endif
