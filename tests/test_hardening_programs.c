/* Hostile conditions end to end: luna-translate writing to a full device, non-finite
 * weights refused by luna-translate, luna-average and a resuming luna-train, two trainers on one
 * --save-dir, stale locks and temporaries of killed runs, resuming with other defining options,
 * a corrupt spm.model in a data-bin, and stale staging directories of luna-preprocess. Every
 * failure must be one line on stderr naming what is wrong. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/dir_lock.h"
#include "core/file_util.h"
#include "core/safetensors.h"
#include "data/checkpoint_vocab.h"
#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "model/checkpoint.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"
#include "trainer/synthetic.h"

static char *dir; /* one per suite run (unchecked fixture): data and checkpoints made once */
static char translate[4096], average[4096], train[4096], preprocess[4096];
static char bin[1100], trained[1100];

typedef luna_test_result result;
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define TINY "--arch", "luna_tiny", "--max-tokens", "128", "--threads", "1", "--no-progress-bar"

static const char *in_dir(const char *name) {
    static char buf[8][1300];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static result run(const char *program, const char *const *args, const char *stdout_path) {
    luna_test_exec_options o = {.dir = dir, .stdout_path = stdout_path};
    return luna_test_exec(program, args, &o);
}

/* A failure: status 1 and exactly one line on stderr containing every needle. */
static void expect_one_line_error(const result *r, const char *const *needles) {
    ck_assert_msg(r->status == 1, "exit status %d, expected 1; stderr: %s", r->status, r->err);
    size_t len = strlen(r->err);
    ck_assert_msg(len > 0 && strchr(r->err, '\n') == r->err + len - 1,
                  "expected one line on stderr, got: %s", r->err);
    for (; *needles; needles++)
        ck_assert_msg(strstr(r->err, *needles), "'%s' not in: %s", *needles, r->err);
}

static int next_line(void *ctx, const char **line, size_t *len) {
    static const char *const lines[] = {"the cat sat on the mat", "a dog ran in the park"};
    int *i = ctx;
    if (*i >= 100) return 0;
    *line = lines[*i % 2];
    *len = strlen(*line);
    ++*i;
    return 1;
}

/* An inference checkpoint of luna_tiny with a character SentencePiece model. */
static void save_checkpoint(const char *path) {
    luna_spm *spm;
    ck_assert_int_eq(luna_spm_load(&spm, in_dir("spm.model")), LUNA_OK);
    luna_dictionary *dict;
    ck_assert_int_eq(luna_dictionary_create(&dict), LUNA_OK);
    for (int32_t i = 0; i < luna_spm_vocab_size(spm); i++) {
        const char *piece = luna_spm_id_to_piece(spm, i);
        ck_assert_int_eq(luna_dictionary_add(dict, piece, strlen(piece), 1, false, NULL), LUNA_OK);
    }
    luna_backend *be = luna_test_backend(1);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = luna_dictionary_size(dict);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, 5), LUNA_OK);
    const void *bytes;
    size_t size, text_len;
    ck_assert_int_eq(luna_spm_serialized(spm, &bytes, &size), LUNA_OK);
    char *text;
    ck_assert_int_eq(luna_dictionary_to_text(dict, &text, &text_len), LUNA_OK);
    luna_checkpoint_contents cc = {.source_lang = "en",
                                   .target_lang = "de",
                                   .src_dict_text = text,
                                   .tgt_dict_text = text,
                                   .spm_model = bytes,
                                   .spm_model_size = size};
    ck_assert_int_eq(luna_checkpoint_save(path, m->params, &cc), LUNA_OK);
    free(text);
    luna_seq2seq_free(m);
    luna_backend_free(be);
    luna_dictionary_free(dict);
    luna_spm_free(spm);
}

/* Copy `src` to `dst` with element 3 of tensor `name` replaced by `value`. */
static void copy_with_value(const char *src, const char *dst, const char *name, float value) {
    char *raw;
    size_t size;
    ck_assert_int_eq(luna_read_file(src, &raw, &size), LUNA_OK);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)(unsigned char)raw[i] << (8 * i);
    luna_safetensors *st;
    ck_assert_int_eq(luna_safetensors_open(&st, src), LUNA_OK);
    const luna_st_tensor *t = luna_safetensors_find(st, name);
    ck_assert_ptr_nonnull(t);
    size_t begin = (size_t)((const char *)t->data - (const char *)luna_safetensors_at(st, 0)->data);
    luna_safetensors_close(st);
    memcpy(raw + 8 + hlen + begin + 3 * sizeof(float), &value, sizeof value);
    FILE *f = fopen(dst, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(raw, 1, size, f), size);
    fclose(f);
    free(raw);
}

static void suite_setup(void) {
    dir = luna_test_make_temp_dir();
    luna_test_find_program(translate, sizeof translate, "luna-translate", "LUNA_TRANSLATE");
    luna_test_find_program(average, sizeof average, "luna-average", "LUNA_AVERAGE");
    luna_test_find_program(train, sizeof train, "luna-train", "LUNA_TRAIN");
    luna_test_find_program(preprocess, sizeof preprocess, "luna-preprocess", "LUNA_PREPROCESS");
    int counter = 0;
    luna_spm_train_options o;
    luna_spm_train_options_init(&o);
    o.next = next_line;
    o.next_ctx = &counter;
    char prefix[1300];
    snprintf(prefix, sizeof prefix, "%s", in_dir("spm"));
    o.model_prefix = prefix;
    o.vocab_size = 25;
    o.model_type = "char";
    ck_assert_int_eq(luna_spm_train(&o), LUNA_OK);
    save_checkpoint(in_dir("a.safetensors"));
    /* Many lines, so that the output outgrows stdio's buffer (the lost writes were those). */
    FILE *f = fopen(in_dir("in.txt"), "w");
    for (int i = 0; i < 200; i++)
        fprintf(f, "the cat sat on the mat %d\n", i);
    fclose(f);
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 200;
    so.num_valid = 20;
    snprintf(bin, sizeof bin, "%s", in_dir("bin"));
    ck_assert_int_eq(luna_synthetic_data_bin(bin, &so), LUNA_OK);
    /* A training run to resume from: 2 updates with the default options. */
    snprintf(trained, sizeof trained, "%s", in_dir("trained"));
    result r = run(train, ARGS(bin, TINY, "--max-update", "2", "--save-dir", trained), NULL);
    ck_assert_msg(r.status == 0, "luna-train: %s", r.err);
}

static void suite_teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
}

/* A copy of the trained --save-dir to resume from (each test changes its own). */
static const char *fresh_save_dir(const char *name) {
    const char *save = in_dir(name);
    luna_test_remove_tree(save);
    ck_assert_int_eq(mkdir(save, 0755), 0);
    char *raw;
    size_t size;
    char src[1300], dst[1300];
    snprintf(src, sizeof src, "%s/checkpoint_last.safetensors", trained);
    snprintf(dst, sizeof dst, "%s/checkpoint_last.safetensors", save);
    ck_assert_int_eq(luna_read_file(src, &raw, &size), LUNA_OK);
    ck_assert_int_eq(luna_write_file_atomic(dst, raw, size), LUNA_OK);
    free(raw);
    return save;
}

/* Buffered stdio writes fail late: every write and the final fflush are checked, so a full
 * device is an error rather than exit 0 with the translations lost. */
START_TEST(translate_to_full_device_fails) {
    const char *const *cases[] = {
        ARGS("a.safetensors", "--input", "in.txt", "--beam", "1", "--max-len-b", "5"),
        ARGS("a.safetensors", "--input", "in.txt", "--beam", "1", "--max-len-b", "5",
             "--output-format", "fairseq"),
        ARGS("a.safetensors", "--input", "in.txt", "--score-reference", "--reference", "in.txt"),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r = run(translate, cases[i], "/dev/full");
        expect_one_line_error(&r, ARGS("luna-translate: stdout: write error",
                                       "No space left on device"));
    }
    result r = run(translate, cases[0], NULL); /* the same to a file works */
    ck_assert_msg(r.status == 0, "%s", r.err);
}
END_TEST

/* Integer options out of their type's range are usage errors (status 2) naming the option, never
 * truncated (--max-len-b 4294967301 cast to int is 5) or saturated. --device-id is checked on
 * every device: the CPU has no device numbers and no device has a negative one. */
START_TEST(translate_integer_options_in_range) {
    const char *const *cases[] = {
        ARGS("a.safetensors", "--input", "in.txt", "--max-len-b", "4294967301"),
        ARGS("a.safetensors", "--input", "in.txt", "--beam", "99999999999999999999"),
        ARGS("a.safetensors", "--input", "in.txt", "--batch-size", "4294967296"),
        /* --device cpu has no device numbers; no device has a negative one */
        ARGS("a.safetensors", "--input", "in.txt", "--device-id", "99"),
        ARGS("a.safetensors", "--input", "in.txt", "--device-id", "-2"),
    };
    const char *names[] = {"--max-len-b", "--beam", "--batch-size", "--device-id 99",
                           "--device-id -2"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r = run(translate, cases[i], NULL);
        ck_assert_msg(r.status == 2 && strstr(r.err, names[i]) &&
                          strchr(r.err, '\n') == r.err + strlen(r.err) - 1,
                      "%s: exit %d: %s", names[i], r.status, r.err);
    }
}
END_TEST

/* Non-finite weights are refused by every program that loads them: they would translate to empty
 * lines, average into the result, or surface in a resumed training only as a diverging loss. */
START_TEST(nonfinite_weights_refused_by_every_program) {
    const char *tensor = "decoder.layers.1.fc2.weight";
    copy_with_value(in_dir("a.safetensors"), in_dir("nan.safetensors"), tensor, NAN);
    result r = run(translate, ARGS("nan.safetensors", "--input", "in.txt"), NULL);
    expect_one_line_error(&r, ARGS("nan.safetensors", tensor, "non-finite value (nan)"));
    copy_with_value(in_dir("a.safetensors"), in_dir("inf.safetensors"), tensor, -INFINITY);
    r = run(average, ARGS("--inputs", "a.safetensors", "inf.safetensors", "--output", "avg.st"),
            NULL);
    expect_one_line_error(&r, ARGS("inf.safetensors", tensor, "non-finite value (inf)"));
    ck_assert(!luna_path_exists(in_dir("avg.st")));
    const char *save = fresh_save_dir("nan-resume");
    char ckpt[1300];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint_last.safetensors", save);
    copy_with_value(ckpt, ckpt, "encoder.layers.0.fc1.weight", NAN);
    r = run(train, ARGS(bin, TINY, "--max-update", "3", "--save-dir", save), NULL);
    expect_one_line_error(&r, ARGS(ckpt, "encoder.layers.0.fc1.weight", "non-finite"));
}
END_TEST

static long dead_pid(void) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) _exit(0);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    return (long)pid; /* reaped: no such process any more (pids are not reused this soon) */
}

/* A --save-dir is locked: two trainers on it would interleave their checkpoints. */
START_TEST(second_trainer_on_save_dir_refused) {
    const char *save = fresh_save_dir("locked");
    /* Held by this process. */
    luna_dir_lock *lock;
    long stale;
    ck_assert_int_eq(luna_dir_lock_acquire(&lock, save, "--save-dir", &stale), LUNA_OK);
    result r = run(train, ARGS(bin, TINY, "--max-update", "3", "--save-dir", save), NULL);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "--save-dir") && strstr(r.err, save) && strstr(r.err, pid) &&
                      strchr(r.err, '\n') == r.err + strlen(r.err) - 1,
                  "stderr: %s", r.err);
    luna_dir_lock_release(lock);
    /* Two real trainers: the second is refused while the first runs, naming its pid. */
    luna_test_process first;
    luna_test_exec_options o = {.dir = dir};
    luna_test_start(&first, train,
                    ARGS(bin, TINY, "--max-update", "100000", "--save-dir", save,
                         "--disable-validation"),
                    &o);
    char lock_path[1400], *text = NULL;
    snprintf(lock_path, sizeof lock_path, "%s/.lock", save);
    snprintf(pid, sizeof pid, "%ld\n", (long)first.pid);
    bool held = false;
    for (int i = 0; i < 600 && !held; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        size_t n;
        if (luna_read_file(lock_path, &text, &n) == LUNA_OK) {
            held = strcmp(text, pid) == 0;
            free(text);
        }
    }
    ck_assert_msg(held, "the first trainer did not lock %s", save);
    r = run(train, ARGS(bin, TINY, "--max-update", "3", "--save-dir", save), NULL);
    snprintf(pid, sizeof pid, "pid %ld", (long)first.pid);
    expect_one_line_error(&r, ARGS("--save-dir", save, "in use by another process", pid));
    ck_assert_int_eq(kill(first.pid, SIGTERM), 0);
    r = luna_test_finish(&first);
    ck_assert_msg(r.status == 0, "first trainer: exit %d: %s", r.status, r.err);
    /* Released on exit: the lock file holds no pid, and a new run takes it without a word. */
    size_t n;
    ck_assert_int_eq(luna_read_file(lock_path, &text, &n), LUNA_OK);
    ck_assert_uint_eq(n, 0);
    free(text);
}
END_TEST

/* A kill during a save leaves "<file>.tmp-*" (and "<file>.tmp-link"): the next run removes them,
 * and the lock of a killed trainer does not block it. */
START_TEST(stale_lock_and_temporaries_cleaned) {
    const char *save = fresh_save_dir("stale");
    long gone = dead_pid();
    char path[1400], text[64];
    snprintf(path, sizeof path, "%s/.lock", save);
    snprintf(text, sizeof text, "%ld\n", gone);
    luna_test_write_file(path, text);
    const char *debris[] = {"checkpoint_last.safetensors.tmp-%ld-0", "checkpoint1.safetensors.tmp-%ld-1f",
                            "checkpoint_best.safetensors.tmp-link"};
    for (int i = 0; i < 3; i++) {
        char name[200];
        snprintf(name, sizeof name, debris[i], gone);
        snprintf(path, sizeof path, "%s/%s", save, name);
        luna_test_write_file(path, "partial");
    }
    /* A temporary of a live process (this one) is not touched. */
    char live[1400];
    snprintf(live, sizeof live, "%s/checkpoint9.safetensors.tmp-%ld-0", save, (long)getpid());
    luna_test_write_file(live, "in progress");
    result r = run(train, ARGS(bin, TINY, "--max-update", "3", "--save-dir", save), NULL);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    snprintf(text, sizeof text, "took over the lock of pid %ld", gone);
    ck_assert_msg(strstr(r.out, text), "stdout: %s", r.out);
    ck_assert_msg(strstr(r.out, "removed 3 stale temporary file(s)"), "stdout: %s", r.out);
    for (int i = 0; i < 3; i++) {
        char name[200];
        snprintf(name, sizeof name, debris[i], gone);
        snprintf(path, sizeof path, "%s/%s", save, name);
        ck_assert_msg(!luna_path_exists(path), "%s still exists", path);
    }
    ck_assert(luna_path_exists(live));
    unlink(live);
    /* A run leaves no temporary of its own. */
    r = run(train, ARGS(bin, TINY, "--max-update", "4", "--save-dir", save), NULL);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_ptr_null(strstr(r.out, "stale temporary"));
    ck_assert_ptr_null(strstr(r.out, "took over"));
}
END_TEST

/* Resuming with a different --seed, --max-tokens, --lr, --dropout or --update-freq would silently
 * make another run than the checkpoint's: refused, naming the option. */
START_TEST(resume_with_other_defining_options) {
    const struct {
        const char *option, *value, *saved, *reset;
    } cases[] = {
        {"--seed", "2", "1", "--reset-dataloader"},
        {"--max-tokens", "256", "128", "--reset-dataloader"},
        {"--update-freq", "2", "1", "--reset-dataloader"},
        {"--lr", "0.05", "0.1", "--reset-lr-scheduler"},
        {"--dropout", "0.3", "0.1", "--reset-optimizer"},
        {"--optimizer", "adam", "'apollo'", "--reset-optimizer"},
    };
    const char *tiny[] = {TINY};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *save = fresh_save_dir("resume");
        const char *args[20];
        int n = 0;
        args[n++] = bin;
        for (size_t k = 0; k < sizeof tiny / sizeof tiny[0]; k++)
            args[n++] = tiny[k]; /* --max-tokens 128; a later --max-tokens wins */
        args[n++] = "--max-update", args[n++] = "3", args[n++] = "--save-dir", args[n++] = save;
        args[n++] = cases[i].option, args[n++] = cases[i].value, args[n] = NULL;
        result r = run(train, args, NULL);
        bool word = cases[i].value[0] >= 'a';
        char is[64], was[80];
        snprintf(is, sizeof is, "%s is %s%s%s", cases[i].option, word ? "'" : "", cases[i].value,
                 word ? "'" : "");
        snprintf(was, sizeof was, "trained with %s", cases[i].saved);
        expect_one_line_error(&r, ARGS("checkpoint_last.safetensors", is, was, cases[i].reset));
        args[n++] = cases[i].reset, args[n] = NULL; /* the flag allows it */
        r = run(train, args, NULL);
        ck_assert_msg(r.status == 0, "%s %s %s: exit %d: %s", cases[i].option, cases[i].value,
                      cases[i].reset, r.status, r.err);
    }
}
END_TEST

/* A corrupt spm.model in a data-bin is refused before it is embedded in every checkpoint. */
START_TEST(corrupt_spm_model_in_data_bin) {
    const char *bad = in_dir("bin-badspm");
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 50;
    so.num_valid = 5;
    ck_assert_int_eq(luna_synthetic_data_bin(bad, &so), LUNA_OK);
    char spm[1400];
    snprintf(spm, sizeof spm, "%s/spm.model", bad);
    luna_test_write_file(spm, "this is not a SentencePiece model\n");
    result r = run(train, ARGS(bad, TINY, "--max-update", "1", "--save-dir", in_dir("badspm-ck")),
                   NULL);
    expect_one_line_error(&r, ARGS(spm, "not a valid SentencePiece model"));
    ck_assert(!luna_path_exists(in_dir("badspm-ck/checkpoint_last.safetensors")));
}
END_TEST

/* A luna-preprocess killed before its commit leaves ".<dest>.staging-*": the next run removes it. */
START_TEST(preprocess_removes_stale_staging) {
    FILE *f = fopen(in_dir("pp.en"), "w"), *g = fopen(in_dir("pp.de"), "w");
    for (int i = 0; i < 20; i++)
        fprintf(f, "a b c %d\n", i), fprintf(g, "x y %d\n", i);
    fclose(f);
    fclose(g);
    long gone = dead_pid();
    char stale[1400], live[1400], file[1500];
    snprintf(stale, sizeof stale, "%s/.pp-bin.staging-%ld-AbC123", dir, gone);
    snprintf(live, sizeof live, "%s/.pp-bin.staging-%ld-XyZ789", dir, (long)getpid());
    ck_assert_int_eq(mkdir(stale, 0755), 0);
    ck_assert_int_eq(mkdir(live, 0755), 0);
    snprintf(file, sizeof file, "%s/dict.en.txt", stale);
    luna_test_write_file(file, "a 1\n");
    result r = run(preprocess,
                   ARGS("--source-lang", "en", "--target-lang", "de", "--trainpref", "pp",
                        "--destdir", "pp-bin", "--no-spm"),
                   NULL);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_msg(strstr(r.out, "removed 1 staging directory") && strstr(r.out, "AbC123"),
                  "stdout: %s", r.out);
    ck_assert(!luna_path_exists(stale));
    ck_assert(luna_path_exists(live));
    ck_assert(luna_path_exists(in_dir("pp-bin/dict.en.txt")));
    rmdir(live);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("hardening_programs");
    TCase *tc = tcase_create("programs");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, suite_setup, suite_teardown);
    tcase_add_test(tc, translate_to_full_device_fails);
    tcase_add_test(tc, translate_integer_options_in_range);
    tcase_add_test(tc, nonfinite_weights_refused_by_every_program);
    tcase_add_test(tc, second_trainer_on_save_dir_refused);
    tcase_add_test(tc, stale_lock_and_temporaries_cleaned);
    tcase_add_test(tc, resume_with_other_defining_options);
    tcase_add_test(tc, corrupt_spm_model_in_data_bin);
    tcase_add_test(tc, preprocess_removes_stale_staging);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
