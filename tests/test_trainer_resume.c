/* Exact resume: 40 updates straight vs 20 + resume (a new trainer reading checkpoint_last from
 * disk) + 20 give bit-identical parameters and optimizer state (CPU, dropout on, update_freq 2,
 * an epoch boundary crossed after the resume point). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/safetensors.h"
#include "tests/test_util.h"
#include "model/checkpoint.h"
#include "trainer/communicator.h"
#include "trainer/options.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

static char *tmp;
static char bin[1024];

static void setup(void) {
    tmp = luna_test_make_temp_dir();
    snprintf(bin, sizeof bin, "%s/bin", tmp);
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 600;
    so.num_valid = 40;
    ck_assert_int_eq(luna_synthetic_data_bin(bin, &so), LUNA_OK);
}

static void teardown(void) {
    luna_test_remove_tree(tmp);
    free(tmp);
}

/* Train with the shared options to `max_update` in `save_dir`; returns num_updates at the start
 * (after a possible resume). */
static int64_t train(const char *save_dir, const char *max_update, const char *optimizer,
                     int64_t *end_updates) {
    char *argv[] = {"luna-train",
                    bin,
                    "--arch",
                    "luna_tiny",
                    "--optimizer",
                    (char *)optimizer,
                    "--lr",
                    "0.01",
                    "--warmup-updates",
                    "10",
                    "--clip-norm",
                    "0.1",
                    "--clip-mode",
                    "each",
                    "--dropout",
                    "0.1",
                    "--attention-dropout",
                    "0.1",
                    "--activation-dropout",
                    "0.1",
                    "--update-freq",
                    "2",
                    "--max-tokens",
                    "128",
                    "--max-update",
                    (char *)max_update,
                    "--validate-interval-updates",
                    "10",
                    "--save-dir",
                    (char *)save_dir,
                    "--threads",
                    "1",
                    "--no-progress-bar",
                    "--seed",
                    "7",
                    "--log-interval",
                    "5",
                    NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    luna_train_options o;
    ck_assert_msg(luna_train_options_parse(&o, argc, argv) == LUNA_OK, "%s", luna_error_message());
    luna_communicator *comm;
    ck_assert_int_eq(luna_communicator_create_single(&comm), LUNA_OK);
    FILE *log = fopen("/dev/null", "w");
    luna_trainer *t;
    ck_assert_msg(luna_trainer_create(&t, &o, comm, log) == LUNA_OK, "%s", luna_error_message());
    int64_t start = luna_trainer_num_updates(t);
    ck_assert_msg(luna_trainer_run(t, NULL) == LUNA_OK, "%s", luna_error_message());
    *end_updates = luna_trainer_num_updates(t);
    ck_assert_int_eq(luna_trainer_skipped_updates(t), 0);
    luna_trainer_free(t);
    luna_communicator_free(comm);
    fclose(log);
    return start;
}

static bool json_equal(const luna_json *a, const luna_json *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case LUNA_JSON_NULL: return true;
    case LUNA_JSON_BOOL: return a->boolean == b->boolean;
    case LUNA_JSON_NUMBER: return memcmp(&a->number, &b->number, sizeof a->number) == 0;
    case LUNA_JSON_STRING: return strcmp(a->string, b->string) == 0;
    default:
        if (a->length != b->length) return false;
        for (size_t i = 0; i < a->length; i++)
            if ((a->keys && strcmp(a->keys[i], b->keys[i]) != 0) ||
                !json_equal(&a->items[i], &b->items[i]))
                return false;
        return true;
    }
}

/* Every tensor bit-identical; the resumable part of the training state equal. */
static void compare_checkpoints(const char *dir_a, const char *dir_b) {
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/checkpoint_last.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/checkpoint_last.safetensors", dir_b);
    luna_safetensors *a, *b;
    ck_assert_msg(luna_checkpoint_open(&a, pa) == LUNA_OK, "%s", luna_error_message());
    ck_assert_msg(luna_checkpoint_open(&b, pb) == LUNA_OK, "%s", luna_error_message());
    ck_assert_int_eq(luna_safetensors_count(a), luna_safetensors_count(b));
    int optimizer_tensors = 0;
    for (int i = 0; i < luna_safetensors_count(a); i++) {
        const luna_st_tensor *ta = luna_safetensors_at(a, i);
        const luna_st_tensor *tb = luna_safetensors_find(b, ta->name);
        ck_assert_msg(tb != NULL, "tensor %s missing", ta->name);
        ck_assert_uint_eq(ta->nbytes, tb->nbytes);
        ck_assert_msg(memcmp(ta->data, tb->data, ta->nbytes) == 0, "tensor %s differs", ta->name);
        if (strncmp(ta->name, "optimizer.", 10) == 0) optimizer_tensors++;
    }
    ck_assert_int_gt(optimizer_tensors, 0);
    const char *sa = luna_safetensors_metadata(a, "training_state");
    const char *sb = luna_safetensors_metadata(b, "training_state");
    luna_json *ja, *jb;
    ck_assert_int_eq(luna_json_parse(&ja, sa, strlen(sa), NULL), LUNA_OK);
    ck_assert_int_eq(luna_json_parse(&jb, sb, strlen(sb), NULL), LUNA_OK);
    const char *keys[] = {"num_updates",      "epoch",           "iterator_offset", "best_loss",
                          "patience_counter", "skipped_updates", "optimizer",       "lr"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const luna_json *x = luna_json_get(ja, keys[k]), *y = luna_json_get(jb, keys[k]);
        ck_assert_msg(x && y && json_equal(x, y), "training_state.%s differs", keys[k]);
    }
    ck_assert_uint_eq(luna_json_get(ja, "num_updates")->uint_value, 40);
    ck_assert_uint_ge(luna_json_get(ja, "epoch")->uint_value, 2); /* crossed an epoch */
    luna_json_free(ja);
    luna_json_free(jb);
    luna_safetensors_close(a);
    luna_safetensors_close(b);
}

static void check_resume(const char *optimizer) {
    char straight[1100], split[1100];
    snprintf(straight, sizeof straight, "%s/%s-straight", tmp, optimizer);
    snprintf(split, sizeof split, "%s/%s-split", tmp, optimizer);
    int64_t end;
    ck_assert_int_eq(train(straight, "40", optimizer, &end), 0);
    ck_assert_int_eq(end, 40);
    ck_assert_int_eq(train(split, "20", optimizer, &end), 0);
    ck_assert_int_eq(end, 20);
    ck_assert_int_eq(train(split, "40", optimizer, &end), 20); /* resumed from disk */
    ck_assert_int_eq(end, 40);
    compare_checkpoints(straight, split);
}

START_TEST(test_resume_apollo) { check_resume("apollo"); }
END_TEST

START_TEST(test_resume_adam) { check_resume("adam"); }
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trainer_resume");
    TCase *tc = tcase_create("resume");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_resume_apollo);
    tcase_add_test(tc, test_resume_adam);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
