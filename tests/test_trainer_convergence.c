/* A tiny Luna model learns a synthetic task end to end through the trainer: the target is the
 * reversed source (8 symbols + 4 specials, lengths 3-8). The validation loss must fall below
 * 0.1 nats per token (label smoothing 0), well below the 2.08 nats of guessing a symbol. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/test_util.h"
#include "trainer/communicator.h"
#include "trainer/options.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

START_TEST(test_reversal) {
    char *tmp = luna_test_make_temp_dir();
    char bin[1024], save[1024];
    snprintf(bin, sizeof bin, "%s/bin", tmp);
    snprintf(save, sizeof save, "%s/ckpt", tmp);
    luna_synthetic_options so;
    luna_synthetic_options_init(&so); /* reversal, 8 symbols, lengths 3-8, 1000 + 100 pairs */
    ck_assert_int_eq(luna_synthetic_data_bin(bin, &so), LUNA_OK);
    char *argv[] = {"luna-train",
                    bin,
                    "--arch",
                    "luna_tiny",
                    "--optimizer",
                    "adam",
                    "--lr",
                    "0.01",
                    "--lr-scheduler",
                    "inverse_sqrt",
                    "--warmup-updates",
                    "100",
                    "--warmup-init-lr",
                    "1e-5",
                    "--clip-norm",
                    "1",
                    "--dropout",
                    "0",
                    "--label-smoothing",
                    "0",
                    "--max-tokens",
                    "256",
                    "--max-update",
                    "1500",
                    "--validate-interval",
                    "5",
                    "--patience",
                    "-1",
                    "--save-dir",
                    save,
                    "--no-save",
                    "--threads",
                    "1",
                    "--no-progress-bar",
                    "--log-interval",
                    "100",
                    NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    luna_train_options o;
    ck_assert_msg(luna_train_options_parse(&o, argc, argv) == LUNA_OK, "%s", luna_error_message());
    luna_communicator *comm;
    ck_assert_int_eq(luna_communicator_create_single(&comm), LUNA_OK);
    luna_trainer *t;
    ck_assert_msg(luna_trainer_create(&t, &o, comm, stdout) == LUNA_OK, "%s", luna_error_message());
    ck_assert_msg(luna_trainer_run(t, NULL) == LUNA_OK, "%s", luna_error_message());
    double best_nats = luna_trainer_best_valid_loss(t) * log(2.0);
    double last_epoch_nats = luna_trainer_last_epoch_loss(t) * log(2.0);
    printf("best valid loss %.4f nats/token, last epoch train loss %.4f nats/token\n", best_nats,
           last_epoch_nats);
    ck_assert_msg(best_nats < 0.1, "valid loss %.4f nats/token, expected < 0.1", best_nats);
    ck_assert_msg(last_epoch_nats < 0.3, "train loss %.4f nats/token", last_epoch_nats);
    luna_trainer_free(t);
    luna_communicator_free(comm);
    luna_test_remove_tree(tmp);
    free(tmp);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trainer_convergence");
    TCase *tc = tcase_create("convergence");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reversal);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
