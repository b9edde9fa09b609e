/* luna-train: train a Luna (or Transformer) translation model on a data-bin.
 *
 *   luna-train DATA-BIN --arch luna_base_tied --optimizer apollo --lr 0.1 \
 *              --lr-scheduler milestone --warmup-updates 1000 --warmup-init-lr 1e-5 \
 *              --clip-norm 0.1 --clip-mode each --max-tokens 8192 --save-dir checkpoints
 *
 * Every option is in one registry (trainer/options.c); --help lists them by group. Running the
 * same command again with the same --save-dir resumes from checkpoint_last exactly.
 * SIGINT/SIGTERM: the current update finishes, checkpoint_last is written, exit status 0 (a second
 * signal kills at once).
 *
 * Exit status: 0 success (or interrupted and saved), 1 bad input or failure (one line on stderr),
 * 2 usage error.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "trainer/communicator.h"
#include "trainer/options.h"
#include "trainer/trainer.h"
#include "tools/programs/program_start.h"

#define PROG "luna-train"

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second signal takes the default action */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int main(int argc, char **argv) {
    luna_program_start("luna-train", argv);
    static luna_train_options opts;
    if (luna_train_options_parse(&opts, argc, argv) != LUNA_OK) {
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 2;
    }
    if (opts.help) {
        luna_train_options_print_help(stdout, PROG);
        return 0;
    }
    if (opts.version) {
        printf(PROG " (luna) %s\n", LUNA_VERSION);
        return 0;
    }
    luna_communicator *comm = NULL;
    if (luna_communicator_create_default(&comm, &argc, &argv, opts.comm_timeout) != LUNA_OK) {
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 1;
    }
    /* Signals are caught from the start, so that an early SIGTERM still ends with a checkpoint
     * after the first update rather than killing the process mid-setup. */
    install_signal_handlers();
    luna_trainer *trainer = NULL;
    if (luna_trainer_create(&trainer, &opts, comm, stdout) != LUNA_OK) {
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        luna_communicator_free(comm);
        return 1;
    }
    luna_trainer_print_summary(trainer);
    int status = 0;
    if (opts.max_update != 0 && luna_trainer_run(trainer, &stop_requested) != LUNA_OK) {
        fflush(stdout);
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        status = 1;
    }
    luna_trainer_free(trainer);
    luna_communicator_free(comm);
    return status;
}
