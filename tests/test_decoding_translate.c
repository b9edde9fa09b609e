/* End to end: luna-translate and luna-average on a tiny checkpoint (luna_tiny with a character
 * SentencePiece model): plain and fairseq output, stdin, empty lines, an overlong line, invalid
 * UTF-8, a checkpoint without its vocabulary, batch-independence, --score-reference, averaging. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dictionary.h"
#include "data/document.h"
#include "data/sentencepiece.h"
#include "data/staged_dir.h"
#include "core/file_util.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "decoding/text_translator.h"
#include "model/kernels/cpu/cpu_ops.h"

static char *dir, translate[4096], average[4096];

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

/* elu: the causal activation differs, i.e. another architecture than the others; nc: the
 * non-contextual P of the paper's Table 5. */
static void save_checkpoint_arch(const char *name, uint64_t seed, bool with_vocab, bool elu,
                                 bool nc, const char *arch) {
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
    if (!strcmp(name, "doc.safetensors")) /* as luna-preprocess --document-window adds it */
        ck_assert_int_eq(luna_dictionary_add(dict, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR),
                                             1, false, NULL),
                         LUNA_OK);
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, arch), LUNA_OK);
    c.vocab_size = luna_dictionary_size(dict);
    if (c.linformer_k > 0) c.max_source_positions = 20; /* in.txt's third line is longer */
    if (elu) c.causal_activation = LUNA_CAUSAL_ELU;
    c.non_contextual_projection = nc;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, seed), LUNA_OK);
    const void *bytes;
    size_t size;
    ck_assert_int_eq(luna_spm_serialized(spm, &bytes, &size), LUNA_OK);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (with_vocab) {
        char *text;
        size_t text_len;
        ck_assert_int_eq(luna_dictionary_to_text(dict, &text, &text_len), LUNA_OK);
        luna_checkpoint_contents cc = {.source_lang = "en",
                                       .target_lang = "de",
                                       .src_dict_text = text,
                                       .tgt_dict_text = text,
                                       .spm_model = bytes,
                                       .spm_model_size = size};
        ck_assert_int_eq(luna_checkpoint_save(path, m->params, &cc), LUNA_OK);
        free(text);
    } else {
        luna_st_metadata md[1] = {{"format", LUNA_CHECKPOINT_FORMAT}};
        ck_assert_int_eq(luna_params_save(m->params, path, md, 1), LUNA_OK);
    }
    luna_seq2seq_free(m);
    luna_backend_free(be);
    luna_dictionary_free(dict);
    luna_spm_free(spm);
}

static void save_checkpoint(const char *name, uint64_t seed, bool with_vocab, bool elu) {
    save_checkpoint_arch(name, seed, with_vocab, elu, false, "luna_tiny");
}

static void setup(void) {
    dir = luna_test_make_temp_dir();
    luna_test_find_program(translate, sizeof translate, "luna-translate", "LUNA_TRANSLATE");
    luna_test_find_program(average, sizeof average, "luna-average", "LUNA_AVERAGE");
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
    save_checkpoint("a.safetensors", 5, true, false);
    save_checkpoint("b.safetensors", 6, true, false);
    save_checkpoint("elu.safetensors", 7, true, true);
    save_checkpoint("novocab.safetensors", 5, false, false);
    save_checkpoint_arch("nc.safetensors", 5, true, false, true, "luna_tiny");
    save_checkpoint_arch("linformer.safetensors", 5, true, false, false, "linformer_tiny");
    save_checkpoint("doc.safetensors", 5, true, false);
    save_checkpoint_arch("tr.safetensors", 5, true, false, false, "transformer_tiny");
    snprintf(path, sizeof path, "%s/in.txt", dir);
    luna_test_write_file(path, "the cat\n\nover the dog\na dog ran in the park again and again\n");
}

static void teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
}

/* The last program run: exit status, stdout, stderr. */
static luna_test_result last;

/* Run `program` in `dir` with stdin from `input` (NULL: none); returns the exit status. */
static int run_in_dir(const char *program, const char *input, const char *const *args) {
    luna_test_exec_options o = {.dir = dir, .input = input};
    last = luna_test_exec(program, args, &o);
    return last.status;
}
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define TRANSLATE(...) run_in_dir(translate, NULL, ARGS(__VA_ARGS__))
#define AVERAGE(...) run_in_dir(average, NULL, ARGS(__VA_ARGS__))

static char *copy_text(const char *text) {
    char *s = strdup(text);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void copy_file(const char *from, const char *to) {
    char a[4096], b[4096], *data;
    size_t size;
    snprintf(a, sizeof a, "%s/%s", dir, from);
    snprintf(b, sizeof b, "%s/%s", dir, to);
    ck_assert_int_eq(luna_read_file(a, &data, &size), LUNA_OK);
    ck_assert_int_eq(luna_write_file_atomic(b, data, size), LUNA_OK);
    free(data);
}

static int count_lines(const char *s, const char *prefix) {
    int n = 0;
    for (const char *p = s; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        n += !strncmp(p, prefix, strlen(prefix));
    return n;
}

START_TEST(translate_plain_and_fairseq) {
    ck_assert_int_eq(
        TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12", "--quiet"), 0);
    char *plain = copy_text(last.out);
    int lines = 0;
    for (const char *p = plain; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, 4);
    ck_assert_msg(strstr(plain, "\n\n") != NULL, "the empty input line must give an empty line");
    /* stdin, one sentence per batch: identical */
    ck_assert_int_eq(
        run_in_dir(translate, "in.txt",
                   ARGS("a.safetensors", "--batch-size", "1", "--max-len-b", "12", "--quiet")),
        0);
    char *plain2 = copy_text(last.out);
    ck_assert_str_eq(plain, plain2);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12", "--nbest",
                               "2", "--output-format", "fairseq"),
                     0);
    char *fs = copy_text(last.out), *err = copy_text(last.err);
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

/* A non-contextual-P checkpoint translates (its config is in the file), as --nbest 2 would, and
 * differently from the contextual model of the same seed. */
START_TEST(translate_non_contextual) {
    ck_assert_int_eq(TRANSLATE("nc.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--output-format", "fairseq"),
                     0);
    char *nc = copy_text(last.out);
    ck_assert_int_eq(count_lines(nc, "H-"), 4);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--output-format", "fairseq"),
                     0);
    ck_assert_str_ne(nc, last.out);
    free(nc);
}
END_TEST

/* A Linformer checkpoint translates sources up to its fixed length (20 here) and refuses a
 * longer one with an error naming the limit. */
START_TEST(translate_linformer) {
    char path[4096];
    snprintf(path, sizeof path, "%s/short.txt", dir);
    luna_test_write_file(path, "the cat\nover the dog\n");
    ck_assert_int_eq(TRANSLATE("linformer.safetensors", "--input", "short.txt", "--max-len-b", "12",
                               "--output-format", "fairseq"),
                     0);
    ck_assert_int_eq(count_lines(last.out, "H-"), 2);
    ck_assert_int_ne(TRANSLATE("linformer.safetensors", "--input", "in.txt", "--max-len-b", "12"),
                     0);
    ck_assert_msg(
        strstr(last.err, "in.txt:4: 39 subword tokens exceed the Linformer maximum of 20"),
        "stderr: %s", last.err);
}
END_TEST

/* A document line "s1 <sep> s2 <sep> s3" (the model's dictionary has <sep>) is one source
 * sequence with two separator tokens, and the plain output has one line per sentence. */
START_TEST(translate_document_lines) {
    char path[4096];
    snprintf(path, sizeof path, "%s/doc.txt", dir);
    luna_test_write_file(path, "the cat <sep> over the dog <sep> a dog ran\nthe park\n");
    ck_assert_int_eq(TRANSLATE("doc.safetensors", "--input", "doc.txt", "--max-len-b", "12",
                               "--output-format", "fairseq"),
                     0);
    ck_assert_ptr_nonnull(strstr(last.out, " <sep> "));
    ck_assert_int_eq(count_lines(last.out, "S-"), 2);
    ck_assert_int_eq(TRANSLATE("doc.safetensors", "--input", "doc.txt", "--max-len-b", "12"), 0);
    int lines = 0;
    for (const char *c = last.out; *c; c++)
        lines += *c == '\n';
    ck_assert_int_eq(lines, 4); /* 3 sentences of the document + 1 */
    /* without <sep> in the dictionary the separator is ordinary text: one line per input line */
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "doc.txt", "--max-len-b", "12"), 0);
    lines = 0;
    for (const char *c = last.out; *c; c++)
        lines += *c == '\n';
    ck_assert_int_eq(lines, 2);
}
END_TEST

START_TEST(bad_inputs) {
    char path[4096];
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    luna_test_write_file(path, "fine\nbad \xff\xfe byte\n");
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "bad.txt"), 1);
    char *out = copy_text(last.out), *err = copy_text(last.err);
    ck_assert_str_eq(out, "");
    ck_assert_msg(strstr(err, "bad.txt:2: invalid UTF-8 at byte 5") != NULL, "%s", err);
    free(out), free(err);
    /* overlong: truncated with a warning */
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-input-tokens", "8",
                               "--max-len-b", "4", "--quiet"),
                     0);
    err = copy_text(last.err);
    ck_assert_msg(strstr(err, "in.txt:4:") && strstr(err, "exceed --max-input-tokens 8"), "%s",
                  err);
    free(err);
    /* a checkpoint without dictionaries / SentencePiece model */
    ck_assert_int_eq(TRANSLATE("novocab.safetensors", "--input", "in.txt"), 1);
    err = copy_text(last.err);
    ck_assert_msg(strstr(err, "novocab.safetensors") != NULL, "%s", err);
    printf("no vocabulary: %s", err);
    free(err);
    ck_assert_int_eq(TRANSLATE("missing.safetensors", "--input", "in.txt"), 1);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--beam", "0"), 2);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--output-format", "xml"), 2);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--beam", "x"), 2);
    ck_assert_str_eq(last.err, "luna-translate: --beam: 'x' is not an integer\n");
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--bogus"), 2);
    ck_assert_str_eq(last.err, "luna-translate: unknown option '--bogus' (see --help)\n");
    ck_assert_int_eq(TRANSLATE("a.safetensors", "b.safetensors"), 2);
    ck_assert_ptr_nonnull(strstr(last.err, "unexpected argument 'b.safetensors'"));
}
END_TEST

START_TEST(score_reference_and_average) {
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--score-reference",
                               "--reference", "in.txt", "--quiet"),
                     0);
    char *out = copy_text(last.out);
    ck_assert_int_eq(count_lines(out, "-"), 3); /* 3 negative scores + the empty line's 0 */
    free(out);
    ck_assert_int_eq(
        AVERAGE("--inputs", "a.safetensors", "b.safetensors", "--output", "avg.safetensors"), 0);
    ck_assert_int_eq(
        TRANSLATE("avg.safetensors", "--input", "in.txt", "--max-len-b", "5", "--quiet"), 0);
    /* averaging a checkpoint with itself gives the same translations */
    ck_assert_int_eq(
        AVERAGE("--inputs", "a.safetensors", "a.safetensors", "--output", "aa.safetensors"), 0);
    ck_assert_int_eq(
        TRANSLATE("aa.safetensors", "--input", "in.txt", "--max-len-b", "5", "--quiet"), 0);
    char *x = copy_text(last.out);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "5", "--quiet"),
                     0);
    char *y = copy_text(last.out);
    ck_assert_str_eq(x, y);
    free(x), free(y);
    /* --save-dir selection */
    char path[4096];
    snprintf(path, sizeof path, "%s/ckpts", dir);
    ck_assert_int_eq(luna_make_dirs(path), LUNA_OK);
    copy_file("a.safetensors", "ckpts/checkpoint_1_100.safetensors");
    copy_file("b.safetensors", "ckpts/checkpoint_2_200.safetensors");
    copy_file("a.safetensors", "ckpts/checkpoint_1_50.safetensors");
    ck_assert_int_eq(AVERAGE("--save-dir", "ckpts", "--num-update-checkpoints", "2", "--output",
                             "last2.safetensors"),
                     0);
    out = copy_text(last.out);
    ck_assert_ptr_nonnull(strstr(out, "checkpoint_1_100"));
    ck_assert_ptr_nonnull(strstr(out, "checkpoint_2_200"));
    ck_assert_ptr_null(strstr(out, "checkpoint_1_50"));
    free(out);
    ck_assert_int_eq(
        AVERAGE("--save-dir", "ckpts", "--num-update-checkpoints", "5", "--output", "x"), 1);
    ck_assert_int_eq(AVERAGE("--inputs", "a.safetensors", "elu.safetensors", "--output", "y"), 1);
    ck_assert_msg(strstr(last.err, "elu.safetensors") &&
                      strstr(last.err, "causal_activation is elu there but softplus"),
                  "%s", last.err);
    ck_assert_int_eq(AVERAGE("--inputs", "a.safetensors", "novocab.safetensors", "--output", "y"),
                     1);
    /* usage errors */
    ck_assert_int_eq(
        AVERAGE("--num-update-checkpoints", "0", "--save-dir", "ckpts", "--output", "x"), 2);
    ck_assert_ptr_nonnull(strstr(last.err, "--num-update-checkpoints must be a positive integer"));
    ck_assert_int_eq(AVERAGE("--inputs", "--output", "x"), 2);
    ck_assert_ptr_nonnull(strstr(last.err, "'--inputs' needs a value"));
    ck_assert_int_eq(AVERAGE("--inputs", "a.safetensors"), 2);
    ck_assert_ptr_nonnull(strstr(last.err, "--output FILE is required"));
}
END_TEST

/* The fairseq conveniences from the command line: --no-repeat-ngram-size 0 is the default
 * output; --sampling is reproducible for a seed (any --threads) and changes with it; invalid
 * values are one-line usage errors. */
START_TEST(sampling_and_no_repeat_flags) {
    ck_assert_int_eq(
        TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12", "--quiet"), 0);
    char *plain = copy_text(last.out);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--no-repeat-ngram-size", "0", "--quiet"),
                     0);
    ck_assert_str_eq(plain, last.out);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--no-repeat-ngram-size", "2", "--quiet"),
                     0);
    free(plain);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--sampling", "--beam", "3", "--seed", "7", "--quiet"),
                     0);
    char *s7 = copy_text(last.out);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--sampling", "--beam", "3", "--seed", "7", "--threads", "1",
                               "--batch-size", "1", "--quiet"),
                     0);
    ck_assert_str_eq(s7, last.out);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                               "--sampling", "--temperature", "50", "--seed", "8", "--quiet"),
                     0);
    ck_assert_str_ne(s7, last.out);
    free(s7);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "in.txt", "--sampling",
                               "--sampling-topk", "5", "--nbest", "2", "--beam", "2",
                               "--output-format", "fairseq", "--quiet"),
                     0);
    ck_assert_int_eq(count_lines(last.out, "H-"), 7);
    const struct {
        const char *flag, *value, *message;
    } bad[] = {{"--temperature", "0", "--temperature must be positive"},
               {"--temperature", "-2", "--temperature must be positive"},
               {"--no-repeat-ngram-size", "-1", "--no-repeat-ngram-size must be in"},
               {"--sampling-topk", "-3", "--sampling-topk must be -1 or 0"},
               {"--sampling-topk", "5", "--sampling-topk needs --sampling"},
               {"--seed", "-1", "--seed must not be negative"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(TRANSLATE("a.safetensors", bad[i].flag, bad[i].value), 2);
        ck_assert_msg(strstr(last.err, bad[i].message) && !strchr(last.err, '\n')[1], "%s",
                      last.err);
    }
    ck_assert_int_eq(
        TRANSLATE("a.safetensors", "--sampling", "--score-reference", "--reference", "in.txt"), 2);
    ck_assert_ptr_nonnull(strstr(last.err, "exclude each other"));
}
END_TEST

/* --workers W: the input's parts translated side by side give one translator's output. With
 * --batch-size 1 every sentence decodes alone either way: the n-best lists and their scores bit
 * for bit, on a Luna and a transformer checkpoint, and the sampled ones (each sentence draws by
 * its place in the whole input). With larger pools a sentence's neighbours differ, which moves
 * the last bits of its scores as --batch-size does: the translations are the same. The summary
 * says W; bad values and combinations are usage errors. */
START_TEST(workers_same_output) {
    char path[4096];
    snprintf(path, sizeof path, "%s/many.txt", dir);
    luna_test_write_file(path, "the cat\nover the dog\n\na dog ran in the park again\nthe mat\n"
                               "a dog\nthe quick brown fox jumps over\nthe cat\nran\n"
                               "over the lazy dog again and again\nthe park\n");
    const char *ckpts[] = {"a.safetensors", "tr.safetensors"};
    for (size_t c = 0; c < 2; c++)
        for (int alone = 1; alone >= 0; alone--) {
            const char *fmt = alone ? "fairseq" : "plain", *bs = alone ? "1" : "128";
            ck_assert_int_eq(TRANSLATE(ckpts[c], "--input", "many.txt", "--max-len-b", "12",
                                       "--beam", "3", "--nbest", "2", "--output-format", fmt,
                                       "--batch-size", bs, "--threads", "1"),
                             0);
            char *one = copy_text(last.out);
            ck_assert_int_eq(count_lines(one, "H-"), alone ? 21 : 0); /* 10 × 2 + the blank's */
            ck_assert_int_eq(TRANSLATE(ckpts[c], "--input", "many.txt", "--max-len-b", "12",
                                       "--beam", "3", "--nbest", "2", "--output-format", fmt,
                                       "--batch-size", bs, "--threads", "1", "--workers", "3"),
                             0);
            ck_assert_msg(!strcmp(one, last.out), "%s, %s output differs with --workers 3",
                          ckpts[c], fmt);
            ck_assert_msg(strstr(last.err, "3 workers x 1 threads"), "%s", last.err);
            free(one);
        }
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "many.txt", "--max-len-b", "12",
                               "--sampling", "--beam", "2", "--seed", "3", "--batch-size", "1",
                               "--quiet"),
                     0);
    char *sampled = copy_text(last.out);
    ck_assert_int_eq(TRANSLATE("a.safetensors", "--input", "many.txt", "--max-len-b", "12",
                               "--sampling", "--beam", "2", "--seed", "3", "--batch-size", "1",
                               "--quiet", "--workers", "2", "--threads", "1"),
                     0);
    ck_assert_msg(!strcmp(sampled, last.out), "sampled output differs with --workers 2");
    free(sampled);
    const char *bad[][4] = {{"--workers", "0", "--workers must be in 1..64", NULL},
                            {"--workers", "65", "--workers must be in 1..64", NULL},
                            {"--workers", "2", "--score-reference", "not --score-reference"}};
    for (size_t i = 0; i < 3; i++) {
        const char *msg = bad[i][3] ? bad[i][3] : bad[i][2];
        int rc = bad[i][3] ? TRANSLATE("a.safetensors", bad[i][0], bad[i][1], bad[i][2],
                                       "--reference", "in.txt")
                           : TRANSLATE("a.safetensors", bad[i][0], bad[i][1]);
        ck_assert_int_eq(rc, 2);
        ck_assert_msg(strstr(last.err, msg) && !strchr(last.err, '\n')[1], "%s", last.err);
    }
}
END_TEST

/* A translator's clones (luna_text_translator_clone) read its model instead of a copy: the same
 * parameter buffer, vocabulary and table of held weights (a hold through a clone's backend shows
 * in the origin's), a clone of a clone reads the first origin; they translate as the origin does,
 * also once it is freed (ASan: nothing read after its free, nothing leaked). */
START_TEST(clones_share_the_model) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tr.safetensors", dir);
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = 1;
    luna_text_translator *t = NULL, *c1 = NULL, *c2 = NULL;
    LUNA_CHECK_OK(luna_text_translator_create(&t, path, "cpu", &bo, false));
    LUNA_CHECK_OK(luna_text_translator_clone(&c1, t));
    LUNA_CHECK_OK(luna_text_translator_clone(&c2, c1));
    ck_assert_ptr_eq(c1->origin, t);
    ck_assert_ptr_eq(c2->origin, t);
    ck_assert_ptr_eq(c2->model->params->data, t->model->params->data);
    ck_assert_ptr_eq(c2->spm, t->spm);
    ck_assert_ptr_eq(c2->tgt_dict, t->tgt_dict);
    ck_assert_ptr_ne(c2->be, t->be);
    ck_assert_ptr_ne(c2->inc, t->inc);
    int n0 = 0, n = 0;
    size_t b0 = 0, b = 0;
    luna_cpu_held_usage(t->be, &n0, &b0);
    luna_cpu_held_usage(c2->be, &n, &b);
    ck_assert_int_eq(n, n0);
    ck_assert_uint_eq(b, b0);
    float W[16 * 8] = {0};
    LUNA_CHECK_OK(c2->be->ops->hold_weights(c2->be, W, 16, 8, LUNA_I8));
    luna_cpu_held_usage(t->be, &n, &b);
    ck_assert_int_eq(n, n0 + 1);
    LUNA_CHECK_OK(c2->be->ops->release_weights(c2->be, W));
    const char *lines[] = {"the cat", "over the lazy dog again", "a dog ran"};
    const size_t len[] = {7, 23, 9};
    luna_encoded_text src;
    LUNA_CHECK_OK(luna_text_translator_encode(t, t->src_dict, lines, len, 3, false, 0, "test", NULL,
                                              NULL, &src));
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.beam = 3;
    o.max_len_b = 12;
    luna_nbest want[3], got[3];
    size_t searched = 0;
    LUNA_CHECK_OK(luna_text_translator_generate(t, &o, &src, 0, 0, want, &searched));
    luna_text_translator_free(t); /* the origin's owner first: its clones keep it alive */
    for (int k = 0; k < 2; k++) {
        LUNA_CHECK_OK(luna_text_translator_generate(k ? c2 : c1, &o, &src, 0, 0, got, &searched));
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(got[i].count, want[i].count);
            ck_assert_int_eq(got[i].hyps[0].len, want[i].hyps[0].len);
            ck_assert(!memcmp(got[i].hyps[0].tokens, want[i].hyps[0].tokens,
                              sizeof(int32_t) * (size_t)want[i].hyps[0].len));
            ck_assert(got[i].hyps[0].score == want[i].hyps[0].score);
            luna_nbest_release(&got[i]);
        }
    }
    for (int i = 0; i < 3; i++)
        luna_nbest_release(&want[i]);
    luna_encoded_text_release(&src);
    luna_text_translator_free(c1);
    luna_text_translator_free(c2);
#ifdef LUNA_TEST_CUDA_HARNESS
    /* a device translator's clone loads the checkpoint again */
    LUNA_CHECK_OK(luna_text_translator_create(&t, path, "cuda", NULL, false));
    LUNA_CHECK_OK(luna_text_translator_clone(&c1, t));
    ck_assert_ptr_null(c1->origin);
    ck_assert_ptr_ne(c1->model->params->data, t->model->params->data);
    luna_text_translator_free(t);
    luna_text_translator_free(c1);
#endif
}
END_TEST

/* --help lists every option, by group. */
START_TEST(help_lists_every_option) {
    const char *translate_flags[] = {"--input",     "--output-format", "--max-input-tokens",
                                     "--quiet",     "--beam",          "--lenpen",
                                     "--max-len-a", "--max-len-b",     "--min-len",
                                     "--nbest",     "--unkpen",        "--score-reference",
                                     "--reference", "--max-tokens",    "--batch-size",
                                     "--device",    "--threads",       "--help",
                                     "--version",   "search:",         "--no-repeat-ngram-size",
                                     "--sampling",  "--sampling-topk", "--temperature",
                                     "--seed",      "--workers"};
    ck_assert_int_eq(TRANSLATE("--help"), 0);
    for (size_t i = 0; i < sizeof translate_flags / sizeof translate_flags[0]; i++)
        ck_assert_msg(strstr(last.out, translate_flags[i]), "%s not in: %s", translate_flags[i],
                      last.out);
    const char *average_flags[] = {
        "--inputs CKPT...",          "--save-dir DIR", "--num-update-checkpoints N",
        "--num-epoch-checkpoints N", "--output FILE",  "--version"};
    ck_assert_int_eq(AVERAGE("--help"), 0);
    for (size_t i = 0; i < sizeof average_flags / sizeof average_flags[0]; i++)
        ck_assert_msg(strstr(last.out, average_flags[i]), "%s not in: %s", average_flags[i],
                      last.out);
    ck_assert_int_eq(AVERAGE("--version"), 0);
    ck_assert_ptr_nonnull(strstr(last.out, "luna-average (luna) "));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("decoding_translate");
    TCase *tc = tcase_create("translate");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, translate_plain_and_fairseq);
    tcase_add_test(tc, translate_non_contextual);
    tcase_add_test(tc, translate_linformer);
    tcase_add_test(tc, translate_document_lines);
    tcase_add_test(tc, bad_inputs);
    tcase_add_test(tc, score_reference_and_average);
    tcase_add_test(tc, help_lists_every_option);
    tcase_add_test(tc, sampling_and_no_repeat_flags);
    tcase_add_test(tc, workers_same_output);
    tcase_add_test(tc, clones_share_the_model);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
