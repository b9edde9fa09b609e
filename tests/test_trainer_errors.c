/* luna-train as a program: option errors, bad inputs (another language pair, another
 * architecture, a truncated checkpoint, an int8 checkpoint, an unwritable --save-dir, a full disk
 * while saving), the SIGTERM save-and-exit, --max-update 0, --help and the JSON log. Each failure
 * must be one line on stderr naming the file, with the documented exit status. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/file_util.h"
#include "core/json.h"
#include "model/seq2seq.h"
#include "model/kernels/registry.h"
#include "tests/test_util.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "trainer/synthetic.h"
#include "model/kernels/cpu/backend_cpu.h"

static char program[4096];
static char *tmp;
static char bin[1024], bin_ende[1024];

typedef luna_test_result result;

/* Start luna-train with NULL-terminated args (stdout/stderr to files in tmp/logs); `fsize` > 0
 * limits the size of files it may write (a full disk). */
static void start(luna_test_process *p, const char *const *args, long fsize) {
    char out_path[1100], err_path[1100];
    snprintf(out_path, sizeof out_path, "%s/logs/stdout.txt", tmp);
    snprintf(err_path, sizeof err_path, "%s/logs/stderr.txt", tmp);
    luna_test_exec_options o = {
        .stdout_path = out_path, .stderr_path = err_path, .max_file_size = fsize};
    luna_test_start(p, program, args, &o);
}

static result run_limited(const char *const *args, long fsize) {
    luna_test_process p;
    start(&p, args, fsize);
    return luna_test_finish(&p);
}
static result run(const char *const *args) { return run_limited(args, 0); }

/* A failure: the exit status, exactly one line on stderr, containing every `needles` string. */
static void expect_error(const result *r, int status, const char *const *needles) {
    ck_assert_msg(r->status == status, "exit status %d, expected %d; stderr: %s", r->status, status,
                  r->err);
    size_t len = strlen(r->err);
    ck_assert_msg(len > 0 && r->err[len - 1] == '\n' && strchr(r->err, '\n') == r->err + len - 1,
                  "expected one line on stderr, got: %s", r->err);
    ck_assert_msg(strncmp(r->err, "luna-train: ", 12) == 0, "stderr: %s", r->err);
    for (; *needles; needles++)
        ck_assert_msg(strstr(r->err, *needles), "'%s' not in: %s", *needles, r->err);
}

static void setup(void) {
    luna_test_find_program(program, sizeof program, "luna-train", "LUNA_TRAIN");
    tmp = luna_test_make_temp_dir();
    char path[1100];
    snprintf(path, sizeof path, "%s/logs", tmp);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 200;
    so.num_valid = 20;
    snprintf(bin, sizeof bin, "%s/bin", tmp);
    ck_assert_int_eq(luna_synthetic_data_bin(bin, &so), LUNA_OK);
    so.source_lang = "en";
    so.target_lang = "de";
    snprintf(bin_ende, sizeof bin_ende, "%s/bin-ende", tmp);
    ck_assert_int_eq(luna_synthetic_data_bin(bin_ende, &so), LUNA_OK);
}

static void teardown(void) {
    luna_test_remove_tree(tmp);
    free(tmp);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define TINY "--arch", "luna_tiny", "--max-tokens", "128", "--threads", "1", "--no-progress-bar"

START_TEST(test_option_errors) {
    result r = run(ARGS(bin, "--foo"));
    ck_assert_str_eq(r.err, "luna-train: unknown option '--foo' (see --help)\n");
    ck_assert_int_eq(r.status, 2);
    r = run(ARGS(bin, "--update-freq", "0"));
    expect_error(&r, 2, ARGS("--update-freq", "got 0"));
    r = run(ARGS(bin, "--warmup-init-lr", "0.5", "--lr", "0.1"));
    expect_error(&r, 2, ARGS("--warmup-init-lr", "--lr"));
    r = run(ARGS(bin, "--clip-mode", "bogus"));
    expect_error(&r, 2, ARGS("--clip-mode", "bogus", "each|total"));
    if (luna_backend_missing("cuda")) { /* a build without the CUDA backend says so */
        r = run(ARGS(bin, "--device", "cuda"));
        expect_error(&r, 2, ARGS("built without CUDA"));
    } else { /* a CUDA (or harness) build: its precision options are checked before any work */
        r = run(ARGS(bin, "--device", "cuda", "--tf32"));
        expect_error(&r, 2, ARGS("--tf32", "--precision fp32"));
    }
    r = run(ARGS(bin, "--device-id", "99")); /* --device cpu has no device numbers */
    expect_error(&r, 2, ARGS("--device-id 99", "--device cpu"));
    r = run(ARGS(bin, "--device-id", "-2"));
    expect_error(&r, 2, ARGS("--device-id -2", "0 or more"));
    if (!luna_backend_missing("cuda")) {
        r = run(ARGS(bin, "--device", "cuda", "--device-id", "-2"));
        expect_error(&r, 2, ARGS("--device-id -2", "0 or more"));
    }
    r = run(ARGS(bin, "--precision", "bf16"));
    expect_error(&r, 2, ARGS("--precision bf16", "fp32 only"));
    r = run(ARGS(bin, "--lr", "abc"));
    expect_error(&r, 2, ARGS("--lr", "abc"));
    r = run(ARGS(bin, "--arch", "luna_huge"));
    expect_error(&r, 2, ARGS("--arch", "luna_huge"));
    r = run(ARGS(bin, "--arch", "transformer_tiny", "--projection-length", "4"));
    expect_error(&r, 2, ARGS("--projection-length", "Luna"));
    r = run(ARGS(bin, "--encoder-embed-dim", "30")); /* 30 not divisible by 8 heads */
    expect_error(&r, 2, ARGS("encoder"));
    r = run(ARGS("--max-update", "0"));
    expect_error(&r, 2, ARGS("DATA-BIN"));
    r = run(ARGS(bin, bin));
    expect_error(&r, 2, ARGS("unexpected argument"));
    r = run(ARGS(bin, "--dropout", "1.5"));
    expect_error(&r, 2, ARGS("--dropout"));
    r = run(ARGS(bin, "--lr-scheduler", "cosine"));
    expect_error(&r, 2, ARGS("--lr-scheduler", "cosine"));
    r = run(ARGS(bin, "--milestones", "500", "100"));
    expect_error(&r, 2, ARGS("--milestones"));
    r = run(ARGS("--help"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "optimization:"));
    ck_assert_ptr_nonnull(strstr(r.out, "--clip-mode each|total"));
    ck_assert_ptr_nonnull(strstr(r.out, "--encoder-layers"));
}
END_TEST

START_TEST(test_max_update_zero) {
    char save[1100];
    snprintf(save, sizeof save, "%s/never-created", tmp);
    result r =
        run(ARGS(bin, TINY, "--max-update", "0", "--save-dir", save, "--encoder-layers", "3"));
    ck_assert_msg(r.status == 0, "%s", r.err);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = 12;
    c.encoder_layers = 3;
    char expect[128];
    snprintf(expect, sizeof expect, "num. model params: %zu ", luna_config_num_parameters(&c));
    ck_assert_msg(strstr(r.out, expect), "'%s' not in: %s", expect, r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "--encoder-layers 3"));
    ck_assert_ptr_null(strstr(r.out, "update 1"));
    ck_assert(!luna_path_exists(save));
    /* the printed options are those of this run: Apollo's, not Adam's */
    ck_assert_ptr_nonnull(strstr(r.out, "--apollo-beta 0.9"));
    ck_assert_ptr_null(strstr(r.out, "--adam-betas"));
    r = run(ARGS(bin, TINY, "--max-update", "0", "--save-dir", save, "--optimizer", "adam"));
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "--adam-betas (0.9, 0.98)"));
    ck_assert_ptr_null(strstr(r.out, "--apollo-beta"));
    ck_assert_ptr_null(strstr(r.out, "--rebound"));
}
END_TEST

static void train_ok(const char *data, const char *save, const char *max_update) {
    result r = run(ARGS(data, TINY, "--max-update", max_update, "--save-dir", save));
    ck_assert_msg(r.status == 0, "%s", r.err);
}

START_TEST(test_bad_inputs) {
    char save[1100], ckpt[1200], path[1200];
    snprintf(save, sizeof save, "%s/ck", tmp);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint_last.safetensors", save);
    train_ok(bin, save, "3");
    ck_assert(luna_path_exists(ckpt));

    /* A data-bin of another language pair. */
    result r = run(ARGS(bin_ende, TINY, "--max-update", "6", "--save-dir", save));
    expect_error(&r, 1, ARGS(ckpt, "src-tgt", "en-de"));
    /* Another architecture. */
    r = run(ARGS(bin, TINY, "--max-update", "6", "--save-dir", save, "--encoder-layers", "3"));
    expect_error(&r, 1, ARGS(ckpt, "architecture", "encoder_layers"));
    /* Another optimizer: the state does not fit; --reset-optimizer starts a fresh one. */
    r = run(ARGS(bin, TINY, "--max-update", "5", "--save-dir", save, "--optimizer", "adam"));
    expect_error(&r, 1, ARGS(ckpt, "--reset-optimizer"));
    r = run(ARGS(bin, TINY, "--max-update", "5", "--save-dir", save, "--optimizer", "adam",
                 "--reset-optimizer"));
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "optimizer reset"));
    /* A truncated checkpoint. */
    char save2[1100], ckpt2[1200];
    snprintf(save2, sizeof save2, "%s/ck-truncated", tmp);
    ck_assert_int_eq(mkdir(save2, 0755), 0);
    snprintf(ckpt2, sizeof ckpt2, "%s/checkpoint_last.safetensors", save2);
    char *bytes;
    size_t size;
    ck_assert_int_eq(luna_read_file(ckpt, &bytes, &size), LUNA_OK);
    ck_assert_int_eq(luna_write_file_atomic(ckpt2, bytes, size / 2), LUNA_OK);
    free(bytes);
    r = run(ARGS(bin, TINY, "--max-update", "6", "--save-dir", save2));
    expect_error(&r, 1, ARGS(ckpt2));
    /* An int8 checkpoint (luna-quantize) is for translation: training refuses it. */
    char quantize[4096], save3[1100], ckpt3[1200];
    luna_test_find_program(quantize, sizeof quantize, "luna-quantize", "LUNA_QUANTIZE");
    snprintf(save3, sizeof save3, "%s/ck-int8", tmp);
    ck_assert_int_eq(mkdir(save3, 0755), 0);
    snprintf(ckpt3, sizeof ckpt3, "%s/checkpoint_last.safetensors", save3);
    result q = luna_test_exec(quantize, ARGS(ckpt, ckpt3, "--dtype", "int8"), NULL);
    ck_assert_msg(q.status == 0, "%s", q.err);
    r = run(ARGS(bin, TINY, "--max-update", "6", "--save-dir", save3));
    expect_error(&r, 1, ARGS(ckpt3, "int8 checkpoint", "is for translation only"));
    /* An explicit --restore-file that does not exist. */
    snprintf(path, sizeof path, "%s/nope.safetensors", tmp);
    r = run(ARGS(bin, TINY, "--max-update", "6", "--save-dir", save2, "--restore-file", path));
    expect_error(&r, 1, ARGS(path, "does not exist"));
    /* An unwritable --save-dir (below a regular file: fails even for root), checked first. */
    snprintf(path, sizeof path, "%s/logs/stdout.txt/sub", tmp);
    r = run(ARGS(bin, TINY, "--max-update", "6", "--save-dir", path));
    expect_error(&r, 1, ARGS("--save-dir", path));
    ck_assert_ptr_null(strstr(r.out, "update"));
    /* A data-bin that is not there. */
    snprintf(path, sizeof path, "%s/missing-bin", tmp);
    r = run(ARGS(path, TINY, "--max-update", "6", "--save-dir", save2));
    expect_error(&r, 1, ARGS(path));
}
END_TEST

START_TEST(test_divergence) {
    /* An absurd learning rate: the weights overflow, gradients become non-finite; each such
     * update is skipped and reported, and a run of them ends training with exit status 1. */
    char save[1100];
    snprintf(save, sizeof save, "%s/ck-diverge", tmp);
    result r = run(ARGS(bin, TINY, "--max-update", "200", "--save-dir", save, "--optimizer", "adam",
                        "--lr", "1e30", "--lr-scheduler", "fixed", "--dropout", "0"));
    expect_error(&r, 1, ARGS("non-finite", "diverged"));
    ck_assert_ptr_nonnull(strstr(r.out, "update skipped"));
}
END_TEST

START_TEST(test_disk_full) {
    char save[1100], ckpt[1200];
    snprintf(save, sizeof save, "%s/ck-full", tmp);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint_last.safetensors", save);
    train_ok(bin, save, "2");
    char *before;
    size_t before_size;
    ck_assert_int_eq(luna_read_file(ckpt, &before, &before_size), LUNA_OK);
    /* Resume and try to save with room for half a checkpoint. */
    result r = run_limited(ARGS(bin, TINY, "--max-update", "4", "--save-dir", save),
                           (long)before_size / 2);
    expect_error(&r, 1, ARGS(save, ".safetensors", "write failed", "saved before are intact"));
    char *after;
    size_t after_size;
    ck_assert_int_eq(luna_read_file(ckpt, &after, &after_size), LUNA_OK);
    ck_assert_uint_eq(after_size, before_size);
    ck_assert(memcmp(before, after, before_size) == 0);
    free(before);
    free(after);
    /* No temporary left behind: only checkpoint1? and checkpoint_last/best. */
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -q tmp", save);
    ck_assert_int_ne(system(cmd), 0);
    /* The first save of a fresh --save-dir fails: the message does not claim an earlier one. */
    snprintf(save, sizeof save, "%s/ck-full-first", tmp);
    r = run_limited(ARGS(bin, TINY, "--max-update", "2", "--save-dir", save),
                    (long)before_size / 2);
    expect_error(&r, 1, ARGS(save, "write failed", "none had been saved"));
    ck_assert_ptr_null(strstr(r.err, "intact"));
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -q safetensors", save);
    ck_assert_int_ne(system(cmd), 0);
}
END_TEST

START_TEST(test_sigterm) {
    char save[1100], ckpt[1200], out_path[1100];
    snprintf(save, sizeof save, "%s/ck-term", tmp);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint_last.safetensors", save);
    snprintf(out_path, sizeof out_path, "%s/logs/stdout.txt", tmp);
    luna_test_process proc;
    start(&proc,
          ARGS(bin, TINY, "--max-update", "1000000", "--save-dir", save, "--log-interval", "1",
               "--disable-validation"),
          0);
    /* Wait until it has made a few updates. */
    bool started = false;
    for (int i = 0; i < 600 && !started; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        char *text;
        size_t n;
        if (luna_read_file(out_path, &text, &n) == LUNA_OK) {
            started = strstr(text, "update 3 ") != NULL;
            free(text);
        }
    }
    ck_assert_msg(started, "luna-train did not start training");
    ck_assert_int_eq(kill(proc.pid, SIGTERM), 0);
    result r = luna_test_finish(&proc);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "interrupted"));
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_seq2seq *model;
    luna_checkpoint_meta meta;
    ck_assert_msg(luna_checkpoint_load_model(ckpt, be, &model, &meta) == LUNA_OK, "%s",
                  luna_error_message());
    luna_json *state;
    ck_assert_int_eq(
        luna_json_parse(&state, meta.training_state, strlen(meta.training_state), NULL), LUNA_OK);
    ck_assert_uint_ge(luna_json_get(state, "num_updates")->uint_value, 3);
    luna_json_free(state);
    luna_checkpoint_meta_release(&meta);
    luna_seq2seq_free(model);
    luna_backend_free(be);
}
END_TEST

START_TEST(test_json_log_and_retention) {
    char save[1100], path[1300];
    snprintf(save, sizeof save, "%s/ck-json", tmp);
    result r = run(ARGS(bin, TINY, "--max-update", "12", "--save-dir", save, "--log-format", "json",
                        "--log-interval", "2", "--save-interval-updates", "3",
                        "--keep-interval-updates", "2", "--validate-interval-updates", "4"));
    ck_assert_msg(r.status == 0, "%s", r.err);
    int lines = 0, valid = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        luna_json *j;
        ck_assert_msg(luna_json_parse(&j, line, strlen(line), NULL) == LUNA_OK, "not JSON: %s",
                      line);
        ck_assert_int_eq(j->type, LUNA_JSON_OBJECT);
        if (luna_json_get(j, "valid_loss"))
            valid++;
        else
            ck_assert_ptr_nonnull(luna_json_get(j, "epoch"));
        luna_json_free(j);
    }
    ck_assert_int_ge(lines, 6);
    ck_assert_int_ge(valid, 3);
    ck_assert_ptr_nonnull(strstr(r.err, "num. model params"));
    /* checkpoint_<epoch>_<update> every 3 updates, only the last 2 kept. */
    int kept = 0;
    for (int u = 3; u <= 12; u += 3)
        for (int e = 1; e <= 3; e++) {
            snprintf(path, sizeof path, "%s/checkpoint_%d_%d.safetensors", save, e, u);
            if (luna_path_exists(path)) {
                kept++;
                ck_assert_int_ge(u, 9);
            }
        }
    ck_assert_int_eq(kept, 2);
    snprintf(path, sizeof path, "%s/checkpoint_best.safetensors", save);
    ck_assert(luna_path_exists(path));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trainer_errors");
    TCase *tc = tcase_create("errors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_option_errors);
    tcase_add_test(tc, test_max_update_zero);
    tcase_add_test(tc, test_bad_inputs);
    tcase_add_test(tc, test_divergence);
    tcase_add_test(tc, test_disk_full);
    tcase_add_test(tc, test_sigterm);
    tcase_add_test(tc, test_json_log_and_retention);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
