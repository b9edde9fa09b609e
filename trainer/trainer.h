/* The training loop (spec apollo.md "One update, in order"), validation, early stopping and the
 * checkpoint policy, driven by the parsed luna-train options.
 *
 * One update: update_freq micro-batches (forward/backward, gradients accumulated; dropout keys
 * (seed, num_updates · update_freq + micro-batch index), so a resumed run draws the same masks);
 * all-reduce of the gradients and statistics; gradients divided by the update's target tokens;
 * clipping (each/total); non-finite gradients skip the update (reported and counted: weights and
 * optimizer state unchanged; 20 in a row end training with an error: divergence); optimizer step
 * with lr = luna_lr_at(num_updates); num_updates += 1.
 * Losses are reported in base 2 per target token (the model returns sums in nats).
 *
 * Checkpoints in --save-dir (fairseq names, .safetensors, model/checkpoint.h format):
 *   checkpoint_last     after every save, at the end, and on SIGINT/SIGTERM
 *   checkpoint_best     whenever a validation improves the best validation loss
 *   checkpoint<E>       at the end of epoch E (every --save-interval epochs; --keep-last-epochs)
 *   checkpoint_<E>_<U>  every --save-interval-updates updates (--keep-interval-updates)
 * One state is written once and hard-linked under its other names (copied where links fail).
 * Resume: when the restore file exists (by default checkpoint_last in --save-dir) the parameters,
 * optimizer state, num_updates, iterator position (epoch, offset), best loss and patience counter
 * are restored and training continues exactly as if it had not stopped.
 */
#ifndef LUNA_TRAINER_TRAINER_H
#define LUNA_TRAINER_TRAINER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/param_table.h"
#include "model/pass.h"
#include "core/status.h"
#include "trainer/communicator.h"
#include "trainer/options.h"

typedef struct luna_trainer luna_trainer;

/* Open the data-bin, build the model and optimizer, check --save-dir (created if needed, must be
 * writable; not touched with --max-update 0) and resume from the restore file if there is one.
 * Log lines go to `log` (stdout in luna-train); the progress line (TTY only) to stderr.
 * `opts` and `comm` must outlive the trainer. Errors: one line naming the file. */
luna_status luna_trainer_create(luna_trainer **out, luna_train_options *opts,
                                luna_communicator *comm, FILE *log);
void luna_trainer_free(luna_trainer *t);

/* Print the configuration, the model and "num. model params: N". */
void luna_trainer_print_summary(const luna_trainer *t);

/* Train until --max-update / --max-epoch / --patience, or until *stop becomes non-zero (then the
 * current update finishes and checkpoint_last is written). `stop` may be NULL. */
luna_status luna_trainer_run(luna_trainer *t, volatile sig_atomic_t *stop);

/* For tests and tools. */
const luna_params *luna_trainer_params(const luna_trainer *t);
int64_t luna_trainer_num_updates(const luna_trainer *t);
/* The last validation's loss (base 2 per token; NAN before any) and the best one. */
double luna_trainer_last_valid_loss(const luna_trainer *t);
double luna_trainer_best_valid_loss(const luna_trainer *t);
/* The average training loss (base 2 per token) of the last completed epoch (NAN before). */
double luna_trainer_last_epoch_loss(const luna_trainer *t);
/* Updates skipped for non-finite gradients. */
int64_t luna_trainer_skipped_updates(const luna_trainer *t);

#endif
