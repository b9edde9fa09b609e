/* End to end: luna-translate and luna-average on a tiny checkpoint (luna_tiny with a character
 * SentencePiece model): plain and fairseq output, stdin, empty lines, an overlong line, invalid
 * UTF-8, a checkpoint without its vocabulary, batch-independence, --score-reference, averaging. */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "model/file_util.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"
#include "trainer/checkpoint.h"

static char *dir, bin[4096];

static int next_line(void *ctx, const char **line, size_t *len) {
    static const char *const lines[] = {"the cat sat on the mat", "a dog ran in the park",
                                        "the quick brown fox jumps", "over the lazy dog again"};
    int *i = ctx;
    if (*i >= 200) return 0;
    *line = lines[*i % 4];
    *len = strlen(*line);
    ++*i;
    return 1;
}

static void save_checkpoint(const char *name, uint64_t seed, bool with_vocab) {
    char path[4096];
    luna_spm *spm;
    snprintf(path, sizeof path, "%s/spm.model", dir);
    ck_assert_int_eq(luna_spm_load(&spm, path), LUNA_OK);
    luna_dictionary *dict;
    ck_assert_int_eq(luna_dictionary_create(&dict), LUNA_OK);
    for (int32_t i = 0; i < luna_spm_vocab_size(spm); i++) {
        const char *piece = luna_spm_id_to_piece(spm, i);
        ck_assert_int_eq(luna_dictionary_add(dict, piece, strlen(piece), 1, false, NULL), LUNA_OK);
    }
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = luna_dictionary_size(dict);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, seed), LUNA_OK);
    const void *bytes;
    size_t size;
    ck_assert_int_eq(luna_spm_serialized(spm, &bytes, &size), LUNA_OK);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (with_vocab) {
        luna_checkpoint_contents cc = {.source_lang = "en",
                                       .target_lang = "de",
                                       .src_dict = dict,
                                       .tgt_dict = dict,
                                       .spm_model = bytes,
                                       .spm_model_size = size};
        ck_assert_int_eq(luna_checkpoint_save(path, m->params, &cc), LUNA_OK);
    } else {
        luna_st_metadata md[1] = {{"format", LUNA_CHECKPOINT_FORMAT}};
        ck_assert_int_eq(luna_params_save(m->params, path, md, 1), LUNA_OK);
    }
    luna_seq2seq_free(m);
    luna_backend_free_all(be);
    luna_dictionary_free(dict);
    luna_spm_free(spm);
}

static void setup(void) {
    dir = luna_test_make_temp_dir();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert(n > 0);
    self[n] = 0;
    snprintf(bin, sizeof bin, "%s", dirname(self));
    char path[4096];
    int counter = 0;
    luna_spm_train_options o;
    luna_spm_train_options_init(&o);
    o.next = next_line;
    o.next_ctx = &counter;
    snprintf(path, sizeof path, "%s/spm", dir);
    o.model_prefix = path;
    o.vocab_size = 30;
    o.model_type = "char";
    ck_assert_int_eq(luna_spm_train(&o), LUNA_OK);
    save_checkpoint("a.safetensors", 5, true);
    save_checkpoint("b.safetensors", 6, true);
    save_checkpoint("novocab.safetensors", 5, false);
    snprintf(path, sizeof path, "%s/in.txt", dir);
    luna_test_write_file(path, "the cat\n\nover the dog\na dog ran in the park again and again\n");
}

static void teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
}

/* Run a shell command in `dir`; returns the exit status; stdout/stderr in out.txt/err.txt. */
static int sh(const char *fmt, const char *arg) {
    char cmd[16384], inner[4096];
    snprintf(inner, sizeof inner, fmt, arg ? arg : "");
    snprintf(cmd, sizeof cmd, "cd '%s' && export PATH='%s':$PATH && (%s) > out.txt 2> err.txt", dir,
             bin, inner);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *slurp(const char *name) {
    char path[4096], *data;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(luna_read_file(path, &data, &size), LUNA_OK);
    return data;
}

static int count_lines(const char *s, const char *prefix) {
    int n = 0;
    for (const char *p = s; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        n += !strncmp(p, prefix, strlen(prefix));
    return n;
}

START_TEST(translate_plain_and_fairseq) {
    ck_assert_int_eq(sh("luna-translate a.safetensors --input in.txt --max-len-b 12 --quiet", 0),
                     0);
    char *plain = slurp("out.txt");
    int lines = 0;
    for (const char *p = plain; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, 4);
    ck_assert_msg(strstr(plain, "\n\n") != NULL, "the empty input line must give an empty line");
    /* stdin, one sentence per batch: identical */
    ck_assert_int_eq(
        sh("cat in.txt | luna-translate a.safetensors --batch-size 1 --max-len-b 12 --quiet", 0),
        0);
    char *plain2 = slurp("out.txt");
    ck_assert_str_eq(plain, plain2);
    ck_assert_int_eq(sh("luna-translate a.safetensors --input in.txt --max-len-b 12 --nbest 2 "
                        "--output-format fairseq",
                        0),
                     0);
    char *fs = slurp("out.txt"), *err = slurp("err.txt");
    ck_assert_int_eq(count_lines(fs, "S-"), 4);
    ck_assert_int_eq(count_lines(fs, "H-"), 7); /* 3 × 2 hypotheses + the empty line's */
    ck_assert_int_eq(count_lines(fs, "D-"), 7);
    ck_assert_int_eq(count_lines(fs, "P-"), 7);
    ck_assert_ptr_nonnull(strstr(fs, "H-1\t-inf"));
    ck_assert_ptr_nonnull(strstr(err, "sentences/s"));
    printf("fairseq output:\n%s", fs);
    free(plain), free(plain2), free(fs), free(err);
}
END_TEST

START_TEST(bad_inputs) {
    char path[4096];
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    luna_test_write_file(path, "fine\nbad \xff\xfe byte\n");
    ck_assert_int_eq(sh("luna-translate a.safetensors --input bad.txt", 0), 1);
    char *out = slurp("out.txt"), *err = slurp("err.txt");
    ck_assert_str_eq(out, "");
    ck_assert_msg(strstr(err, "bad.txt:2: invalid UTF-8 at byte 5") != NULL, "%s", err);
    free(out), free(err);
    /* overlong: truncated with a warning */
    ck_assert_int_eq(sh("luna-translate a.safetensors --input in.txt --max-input-tokens 8 "
                        "--max-len-b 4 --quiet",
                        0),
                     0);
    err = slurp("err.txt");
    ck_assert_msg(strstr(err, "in.txt:4:") && strstr(err, "exceed --max-input-tokens 8"), "%s",
                  err);
    free(err);
    /* a checkpoint without dictionaries / SentencePiece model */
    ck_assert_int_eq(sh("luna-translate novocab.safetensors --input in.txt", 0), 1);
    err = slurp("err.txt");
    ck_assert_msg(strstr(err, "novocab.safetensors") != NULL, "%s", err);
    printf("no vocabulary: %s", err);
    free(err);
    ck_assert_int_eq(sh("luna-translate missing.safetensors --input in.txt", 0), 1);
    ck_assert_int_eq(sh("luna-translate a.safetensors --beam 0", 0), 2);
    ck_assert_int_eq(sh("luna-translate a.safetensors --output-format xml", 0), 2);
}
END_TEST

START_TEST(score_reference_and_average) {
    ck_assert_int_eq(sh("luna-translate a.safetensors --input in.txt --score-reference --reference "
                        "in.txt --quiet",
                        0),
                     0);
    char *out = slurp("out.txt");
    ck_assert_int_eq(count_lines(out, "-"), 3); /* 3 negative scores + the empty line's 0 */
    free(out);
    ck_assert_int_eq(
        sh("luna-average --inputs a.safetensors b.safetensors --output avg.safetensors", 0), 0);
    ck_assert_int_eq(sh("luna-translate avg.safetensors --input in.txt --max-len-b 5 --quiet", 0),
                     0);
    /* averaging a checkpoint with itself gives the same translations */
    ck_assert_int_eq(
        sh("luna-average --inputs a.safetensors a.safetensors --output aa.safetensors", 0), 0);
    ck_assert_int_eq(sh("luna-translate aa.safetensors --input in.txt --max-len-b 5 --quiet", 0),
                     0);
    char *x = slurp("out.txt");
    ck_assert_int_eq(sh("luna-translate a.safetensors --input in.txt --max-len-b 5 --quiet", 0), 0);
    char *y = slurp("out.txt");
    ck_assert_str_eq(x, y);
    free(x), free(y);
    /* --save-dir selection */
    char path[4096];
    snprintf(path, sizeof path, "%s/ckpts", dir);
    ck_assert_int_eq(sh("mkdir ckpts && cp a.safetensors ckpts/checkpoint_1_100.safetensors && cp "
                        "b.safetensors ckpts/checkpoint_2_200.safetensors && cp a.safetensors "
                        "ckpts/checkpoint_1_50.safetensors",
                        0),
                     0);
    ck_assert_int_eq(sh("luna-average --save-dir ckpts --num-update-checkpoints 2 --output "
                        "last2.safetensors",
                        0),
                     0);
    out = slurp("out.txt");
    ck_assert_ptr_nonnull(strstr(out, "checkpoint_1_100"));
    ck_assert_ptr_nonnull(strstr(out, "checkpoint_2_200"));
    ck_assert_ptr_null(strstr(out, "checkpoint_1_50"));
    free(out);
    ck_assert_int_eq(sh("luna-average --save-dir ckpts --num-update-checkpoints 5 --output x", 0),
                     1);
    ck_assert_int_eq(sh("luna-average --inputs a.safetensors novocab.safetensors --output y", 0),
                     1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("decoding_translate");
    TCase *tc = tcase_create("translate");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, translate_plain_and_fairseq);
    tcase_add_test(tc, bad_inputs);
    tcase_add_test(tc, score_reference_and_average);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
