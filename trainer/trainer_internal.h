/* Internals shared by trainer.c (the loop), train_state.c (checkpoint policy and training state)
 * and train_log.c (meters and log lines). Not installed; not for other modules.
 */
#ifndef LUNA_TRAINER_INTERNAL_H
#define LUNA_TRAINER_INTERNAL_H

#include "data/batching.h"
#include "data/pair_dataset.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/dir_lock.h"
#include "core/json.h"
#include "model/seq2seq.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "trainer/grad_buckets.h"
#include "trainer/trainer.h"

/* This many non-finite updates in a row end training with an error. */
#define LUNA_MAX_CONSECUTIVE_SKIPS 20

/* Sums over a span of updates (a log interval, an epoch, a validation). */
typedef struct {
    double loss, nll; /* nats */
    double ntokens, nsentences;
    double gnorm_sum; /* over non-skipped updates */
    int64_t updates, clipped;
    double start_time;    /* seconds (monotonic) when the span began */
    double train_seconds; /* time spent in updates during the span */
} luna_meters;

struct luna_trainer {
    luna_train_options *o;
    luna_communicator *comm;
    luna_grad_buckets *buckets;   /* world size > 1: the gradient all-reduce */
    char *ranks_table;            /* world size > 1: one line per rank (host, pid, device) */
    luna_dir_lock *save_dir_lock; /* rank 0, when it writes checkpoints */
    FILE *log;
    bool progress; /* progress line on stderr (a terminal) */

    luna_backend *be;
    luna_pair_dataset *train, *valid; /* valid may be NULL (no split / disabled) */
    luna_batch_plan *train_plan, *valid_plan;
    luna_batch_iterator *it, *valid_it;
    luna_data_batch *batch;
    luna_seq2seq *model;
    luna_tensor_table *trainable; /* the model's trainable tensors: what the optimizer updates */
    luna_optimizer *opt;          /* scales, clips and updates over `trainable` */
    double *valid_sums;           /* device [2]: a validation's loss and nll, read once */
    char *src_lang, *tgt_lang;
    char *spm_bytes; /* spm.model of the data-bin (NULL when absent) */
    size_t spm_size;

    /* training state (saved in checkpoints) */
    int64_t num_updates, skipped_updates;
    uint64_t epoch, offset; /* iterator position of the next batch */
    double best_loss;       /* INFINITY before any validation */
    int64_t patience_counter;
    double train_wall; /* seconds spent in updates, all runs together */

    /* this run */
    double lr, last_valid_loss, last_epoch_loss;
    int64_t last_saved_update; /* -1: nothing saved yet in this run */
    int consecutive_skips;     /* non-finite updates in a row (a run of them is divergence) */
    luna_meters interval, epoch_meters;
    double run_start;
    int64_t run_start_updates;
};

double luna_trainer_now(void);

/* ---- train_state.c -------------------------------------------------------------------------- */

/* Check --save-dir: create it (with parents) if needed and probe that a file can be written. */
luna_status luna_trainer_check_save_dir(const char *dir);

/* The restore file's path (relative names are inside --save-dir); malloc'ed. *explicit_ is true
 * when the user named it (then it must exist). */
char *luna_trainer_restore_path(const luna_trainer *t, bool *explicit_);

/* Load a training checkpoint into the trainer (parameters, optimizer state unless
 * --reset-optimizer, counters and iterator position unless --reset-dataloader), after checking
 * that it matches the data-bin (languages, dictionaries) and the architecture. */
luna_status luna_trainer_restore(luna_trainer *t, const char *path);

/* Resume compatibility: the options that define the run (seed, batch sizes, update frequency,
 * optimizer and its hyperparameters, dropout, the learning-rate schedule, ...) must equal those
 * in training_state.args of checkpoint `path`, unless --reset-dataloader, --reset-optimizer or
 * --reset-lr-scheduler allows their group to change. LUNA_ERR_MISMATCH naming the option and
 * both values otherwise (resume_check.c). */
luna_status luna_trainer_check_resume_options(const luna_trainer *t, const char *path,
                                              const luna_json *state);

/* Write the current state as the given checkpoint names (file names inside --save-dir): the
 * first is written, the others are hard links (or copies). Then apply the retention rules. */
luna_status luna_trainer_save(luna_trainer *t, const char *const *names, int count);

/* ---- train_log.c ---------------------------------------------------------------------------- */

void luna_meters_reset(luna_meters *m);
void luna_meters_add(luna_meters *dst, const luna_meters *src);
/* The log line of a span of training updates ("epoch 001 | update 100 | loss ..."). `tag` is
 * NULL for an interval line, "end of epoch" for the epoch summary. */
void luna_log_train(luna_trainer *t, const luna_meters *m, const char *tag);
/* "epoch 001 | valid on 'valid' subset | loss ... | num_updates N | best_loss ...". */
void luna_log_valid(luna_trainer *t, const luna_meters *m, double seconds);
/* A free-form message line ("| ..."), JSON {"message": ...} in json mode. */
void luna_log_message(luna_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The progress line (stderr, carriage return) and clearing it before other output. */
void luna_progress_update(luna_trainer *t);
void luna_progress_clear(luna_trainer *t);

#endif
