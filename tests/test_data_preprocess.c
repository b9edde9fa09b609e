/* luna-preprocess end to end on tiny generated corpora: the data-bin it writes, determinism
 * across thread counts, and every bad-input case (exit status, one-line message naming the file
 * and line, --destdir untouched).
 *
 * The program is found next to this test executable (both are built into CMAKE_BINARY_DIR), or
 * at $LUNA_PREPROCESS. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dictionary.h"
#include "data/document.h"
#include "data/indexed_dataset.h"
#include "data/pair_dataset.h"
#include "data/sentencepiece.h"
#include "data/staged_dir.h"
#include "core/file_util.h"
#include "tests/test_util.h"

static char program[4096];

typedef luna_test_result result;

/* Run luna-preprocess with NULL-terminated args; capture stdout/stderr (in anonymous files, so
 * that tmp's entry count only changes if the program leaves something behind). */
static result run(const char *const *args) { return luna_test_exec(program, args, NULL); }

static const char *EN[] = {"the",    "house",  "is",     "small", "green",    "tree", "river",
                           "city",   "we",     "walk",   "home",  "children", "play", "in",
                           "garden", "summer", "bright", "old",   "bridge",   "night"};
static const char *DE[] = {"das",    "Haus",   "ist",   "klein", "grün",   "Baum",    "Fluss",
                           "Stadt",  "wir",    "gehen", "nach",  "Kinder", "spielen", "im",
                           "Garten", "Sommer", "hell",  "alte",  "Brücke", "Nacht"};

/* Write <dir>/<name>.en/.de with n aligned generated sentences. */
static void write_corpus(const char *dir, const char *name, int n, uint64_t seed) {
    char path[2][1024];
    snprintf(path[0], sizeof path[0], "%s/%s.en", dir, name);
    snprintf(path[1], sizeof path[1], "%s/%s.de", dir, name);
    FILE *f[2] = {fopen(path[0], "wb"), fopen(path[1], "wb")};
    ck_assert(f[0] && f[1]);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) {
        int len = (int)luna_test_uniform(&rng, 2, 10);
        for (int w = 0; w < len; w++) {
            int k = (int)luna_test_uniform(&rng, 0, 20);
            fprintf(f[0], "%s%s", w ? " " : "", EN[k]);
            fprintf(f[1], "%s%s", w ? " " : "", DE[k]);
        }
        fputs(".\n", f[0]);
        fputs(".\n", f[1]);
    }
    fclose(f[0]);
    fclose(f[1]);
}

static char *tmp;

static void setup(void) {
    tmp = luna_test_make_temp_dir();
    write_corpus(tmp, "train", 400, 1);
    write_corpus(tmp, "valid", 40, 2);
    write_corpus(tmp, "test", 30, 3);
}

static void teardown(void) {
    luna_test_remove_tree(tmp);
    free(tmp);
}

static char *p(const char *name) {
    static char buf[8][1024];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", tmp, name);
    return b;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static bool same_file(const char *a, const char *b) {
    char *da, *db;
    size_t na, nb;
    ck_assert_int_eq(luna_read_file(a, &da, &na), LUNA_OK);
    ck_assert_int_eq(luna_read_file(b, &db, &nb), LUNA_OK);
    bool same = na == nb && memcmp(da, db, na) == 0;
    free(da);
    free(db);
    return same;
}

START_TEST(end_to_end_with_sentencepiece) {
    char train[1024], valid[1024], test[1024], out1[1024], out2[1024];
    snprintf(train, sizeof train, "%s", p("train"));
    snprintf(valid, sizeof valid, "%s", p("valid"));
    snprintf(test, sizeof test, "%s", p("test"));
    snprintf(out1, sizeof out1, "%s", p("bin1"));
    snprintf(out2, sizeof out2, "%s", p("nested/bin2"));
    const char *args[] = {"--source-lang",
                          "en",
                          "--target-lang",
                          "de",
                          "--trainpref",
                          train,
                          "--validpref",
                          valid,
                          "--testpref",
                          test,
                          "--destdir",
                          out1,
                          "--joined-dictionary",
                          "--workers",
                          "2",
                          "--bpe-vocab-size",
                          "120",
                          NULL};
    result r = run(args);
    ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "[en] train"));
    ck_assert_ptr_nonnull(strstr(r.out, "400 sentences"));
    ck_assert_ptr_nonnull(strstr(r.out, "sentences/s"));
    const char *files[] = {"dict.en.txt",        "dict.de.txt",        "spm.model",
                           "spm.vocab",          "train.en-de.en.bin", "train.en-de.en.idx",
                           "train.en-de.de.bin", "train.en-de.de.idx", "valid.en-de.en.idx",
                           "valid.en-de.de.bin", "test.en-de.en.bin",  "test.en-de.de.idx"};
    char a[2048], b[2048];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(a, sizeof a, "%s/%s", out1, files[i]);
        ck_assert_msg(luna_path_exists(a), "missing %s", a);
    }
    ck_assert_int_eq(count_entries(out1), 16);
    snprintf(a, sizeof a, "%s/dict.en.txt", out1);
    snprintf(b, sizeof b, "%s/dict.de.txt", out1);
    ck_assert(same_file(a, b)); /* joined */
    luna_dictionary *dict;
    ck_assert_int_eq(luna_dictionary_load(&dict, a), LUNA_OK);
    ck_assert_int_eq(luna_dictionary_size(dict) % 8, 0);

    /* The data decodes back to the input text. */
    luna_pair_dataset *ds;
    ck_assert_msg(luna_pair_dataset_open(&ds, out1, "valid", "en", "de") == LUNA_OK, "%s",
                  luna_error_message());
    ck_assert_uint_eq(luna_pair_dataset_count(ds), 40);
    snprintf(a, sizeof a, "%s/spm.model", out1);
    luna_spm *spm;
    ck_assert_int_eq(luna_spm_load(&spm, a), LUNA_OK);
    luna_data_batch *batch;
    ck_assert_int_eq(luna_data_batch_create(&batch), LUNA_OK);
    const uint32_t ids[2] = {0, 39};
    ck_assert_int_eq(luna_data_batch_fill(batch, ds, ids, 2), LUNA_OK);
    char *valid_de;
    size_t nvalid;
    snprintf(a, sizeof a, "%s.de", valid);
    ck_assert_int_eq(luna_read_file(a, &valid_de, &nvalid), LUNA_OK);
    const char *pieces[64];
    int np = 0;
    for (int j = 0; j < batch->tgt_len && batch->target[j] != LUNA_DICT_EOS; j++)
        pieces[np++] = luna_dictionary_symbol(dict, batch->target[j]);
    ck_assert_int_eq(batch->target[np], LUNA_DICT_EOS);
    char *text;
    ck_assert_int_eq(luna_spm_decode_pieces(spm, pieces, (size_t)np, &text), LUNA_OK);
    ck_assert_uint_eq(strlen(text) + 1, (size_t)(strchr(valid_de, '\n') - valid_de) + 1);
    ck_assert(strncmp(valid_de, text, strlen(text)) == 0);
    free(text);
    free(valid_de);
    luna_data_batch_free(batch);
    luna_spm_free(spm);
    luna_pair_dataset_free(ds);
    luna_dictionary_free(dict);

    /* One worker, another (nested, not yet existing) directory: byte-identical output. */
    const char *args1[] = {"--source-lang",
                           "en",
                           "--target-lang",
                           "de",
                           "--trainpref",
                           train,
                           "--validpref",
                           valid,
                           "--testpref",
                           test,
                           "--destdir",
                           out2,
                           "--joined-dictionary",
                           "--workers",
                           "1",
                           "--bpe-vocab-size",
                           "120",
                           NULL};
    r = run(args1);
    ck_assert_msg(r.status == 0, "%s", r.err);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (!strcmp(files[i], "spm.model"))
            continue; /* the model records its trainer's thread count */
        snprintf(a, sizeof a, "%s/%s", out1, files[i]);
        snprintf(b, sizeof b, "%s/%s", out2, files[i]);
        ck_assert_msg(same_file(a, b), "%s differs between --workers 2 and 1", files[i]);
    }
    /* Re-running into an existing data-bin with the same dictionary is allowed. */
    r = run(args);
    ck_assert_msg(r.status == 0, "%s", r.err);
}
END_TEST

START_TEST(no_spm_separate_dictionaries_and_reused_model) {
    char train[1024], out[1024], spm_out[1024], model[1024];
    snprintf(train, sizeof train, "%s", p("train"));
    snprintf(out, sizeof out, "%s", p("plain"));
    snprintf(spm_out, sizeof spm_out, "%s", p("reused"));
    /* "a\u00A0b" must split like Python's str.split(). */
    FILE *f = fopen(p("train.en"), "ab");
    fputs("nbsp\xC2\xA0word\n", f);
    fclose(f);
    f = fopen(p("train.de"), "ab");
    fputs("eins zwei\n", f);
    fclose(f);
    const char *args[] = {"--source-lang", "en", "--target-lang", "de", "--trainpref", train,
                          "--destdir",     out,  "--no-spm",      NULL};
    result r = run(args);
    ck_assert_msg(r.status == 0, "%s", r.err);
    char a[2048];
    snprintf(a, sizeof a, "%s/dict.en.txt", out);
    luna_dictionary *en, *de;
    ck_assert_int_eq(luna_dictionary_load(&en, a), LUNA_OK);
    snprintf(a, sizeof a, "%s/dict.de.txt", out);
    ck_assert_int_eq(luna_dictionary_load(&de, a), LUNA_OK);
    ck_assert_int_ge(luna_dictionary_find(en, "house", 5), 4);
    ck_assert_int_eq(luna_dictionary_find(en, "Haus", 4), -1); /* separate dictionaries */
    ck_assert_int_ge(luna_dictionary_find(de, "Haus", 4), 4);
    ck_assert_int_ge(luna_dictionary_find(en, "nbsp", 4), 4);
    ck_assert_int_ge(luna_dictionary_find(en, "word", 4), 4);
    snprintf(a, sizeof a, "%s/spm.model", out);
    ck_assert(!luna_path_exists(a));
    luna_dictionary_free(en);
    luna_dictionary_free(de);

    /* --srcdict/--tgtdict: binarize another split against the existing dictionaries. */
    char srcdict[2048], tgtdict[2048], valid[1024], more[1024], b[2048];
    snprintf(srcdict, sizeof srcdict, "%s/dict.en.txt", out);
    snprintf(tgtdict, sizeof tgtdict, "%s/dict.de.txt", out);
    snprintf(valid, sizeof valid, "%s", p("valid"));
    snprintf(more, sizeof more, "%s", p("more"));
    const char *dict_args[] = {"--source-lang", "en",        "--target-lang", "de",
                               "--validpref",   valid,       "--destdir",     more,
                               "--no-spm",      "--srcdict", srcdict,         "--tgtdict",
                               tgtdict,         NULL};
    r = run(dict_args);
    ck_assert_msg(r.status == 0, "%s", r.err);
    snprintf(b, sizeof b, "%s/dict.de.txt", more);
    ck_assert(same_file(tgtdict, b));
    luna_pair_dataset *ds;
    ck_assert_int_eq(luna_pair_dataset_open(&ds, more, "valid", "en", "de"), LUNA_OK);
    ck_assert_uint_eq(luna_pair_dataset_count(ds), 40);
    luna_pair_dataset_free(ds);

    /* --spm-model: train once, reuse the model. */
    snprintf(model, sizeof model, "%s", p("bin-model"));
    const char *train_args[] = {"--source-lang",
                                "en",
                                "--target-lang",
                                "de",
                                "--trainpref",
                                train,
                                "--destdir",
                                model,
                                "--joined-dictionary",
                                "--bpe-vocab-size",
                                "110",
                                NULL};
    r = run(train_args);
    ck_assert_msg(r.status == 0, "%s", r.err);
    snprintf(a, sizeof a, "%s/spm.model", model);
    const char *reuse_args[] = {"--source-lang",
                                "en",
                                "--target-lang",
                                "de",
                                "--trainpref",
                                train,
                                "--destdir",
                                spm_out,
                                "--joined-dictionary",
                                "--spm-model",
                                a,
                                NULL};
    r = run(reuse_args);
    ck_assert_msg(r.status == 0, "%s", r.err);
    snprintf(b, sizeof b, "%s/spm.model", spm_out);
    ck_assert(same_file(a, b));
    snprintf(a, sizeof a, "%s/train.en-de.de.bin", model);
    snprintf(b, sizeof b, "%s/train.en-de.de.bin", spm_out);
    ck_assert(same_file(a, b));
}
END_TEST

/* Assert a failure: status, one line naming `where`, and no trace in the parent directory. */
static void expect_failure(const char *const *args, int status, const char *where,
                           const char *dest) {
    int before = count_entries(tmp);
    result r = run(args);
    ck_assert_msg(r.status == status, "expected status %d, got %d: %s", status, r.status, r.err);
    ck_assert_msg(strncmp(r.err, "luna-preprocess: ", 17) == 0, "%s", r.err);
    char *nl = strchr(r.err, '\n');
    ck_assert_msg(nl && nl[1] == '\0', "not exactly one line: '%s'", r.err);
    ck_assert_msg(strstr(r.err, where), "'%s' does not mention '%s'", r.err, where);
    if (dest) ck_assert_msg(!luna_path_exists(dest), "%s was created", dest);
    ck_assert_int_eq(count_entries(tmp), before); /* no staging directory left behind */
}

/* Words per line of a --no-spm corpus file (the tokens of the line without </s>). */
static int line_words(const char *path, int *words, int max) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    int n = 0, w = 0, in_word = 0, c;
    while ((c = fgetc(f)) != EOF) {
        if (c == '\n') {
            ck_assert_int_lt(n, max);
            words[n++] = w;
            w = in_word = 0;
        } else if (c == ' ') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            w++;
        }
    }
    fclose(f);
    return n;
}

/* --document-window N: greedy windows of consecutive pairs with at most N tokens per side; each
 * window is its sentences with every </s> but the last replaced by <sep>; no sentence-level
 * files are left in the data-bin. */
START_TEST(document_windows) {
    enum { WINDOW = 30, MAXL = 1000 };
    char out[1024];
    snprintf(out, sizeof out, "%s", p("docs"));
    const char *args[] = {"--source-lang",
                          "en",
                          "--target-lang",
                          "de",
                          "--trainpref",
                          p("train"),
                          "--destdir",
                          out,
                          "--no-spm",
                          "--joined-dictionary",
                          "--document-window",
                          "30",
                          NULL};
    result r = run(args);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "document windows of at most 30 tokens from 400"));
    static int words[2][MAXL];
    int n = line_words(p("train.en"), words[0], MAXL);
    ck_assert_int_eq(line_words(p("train.de"), words[1], MAXL), n);
    char a[2048];
    snprintf(a, sizeof a, "%s/dict.en.txt", out);
    luna_dictionary *d;
    ck_assert_int_eq(luna_dictionary_load(&d, a), LUNA_OK);
    const int32_t sep = luna_dictionary_find(d, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR));
    ck_assert_int_ge(sep, LUNA_DICT_NSPECIAL);
    for (int side = 0; side < 2; side++) {
        snprintf(a, sizeof a, "%s/train.en-de.%s", out, side ? "de" : "en");
        luna_indexed_dataset *ds;
        ck_assert_int_eq(luna_indexed_dataset_open(&ds, a), LUNA_OK);
        /* replay the greedy packing over both sides' sentence lengths (words + </s>) */
        size_t w = 0;
        int32_t buf[4 * WINDOW];
        for (int i = 0; i < n;) {
            int len[2] = {0, 0}, k = 0;
            while (i < n && (k == 0 || (len[0] + words[0][i] + 1 <= WINDOW &&
                                        len[1] + words[1][i] + 1 <= WINDOW))) {
                len[0] += words[0][i] + 1, len[1] += words[1][i] + 1;
                i++, k++;
            }
            ck_assert_uint_lt(w, luna_indexed_dataset_count(ds));
            ck_assert_int_eq(luna_indexed_dataset_sizes(ds)[w], len[side]);
            ck_assert_int_le(len[side], WINDOW);
            luna_indexed_dataset_get(ds, w, buf);
            int seps = 0;
            for (int t = 0; t < len[side]; t++)
                seps += buf[t] == sep;
            ck_assert_int_eq(seps, k - 1);
            ck_assert_int_eq(buf[len[side] - 1], LUNA_DICT_EOS);
            w++;
        }
        ck_assert_uint_eq(w, luna_indexed_dataset_count(ds));
        ck_assert_uint_lt(w, (size_t)n / 2); /* really windows, not sentences */
        luna_indexed_dataset_free(ds);
    }
    luna_dictionary_free(d);
    snprintf(a, sizeof a, "%s/train.sentences.en-de.en.bin", out);
    ck_assert(!luna_path_exists(a));
}
END_TEST

/* luna-translate's way back to sentences: the segments between separators (empty ones too). */
START_TEST(document_segments) {
    const int32_t sep = 9, t[] = {5, 6, 9, 7, 9, 9, 8};
    int start[8], len[8];
    ck_assert_int_eq(luna_document_segments(t, 7, sep, start, len), 4);
    const int want_start[] = {0, 3, 5, 6}, want_len[] = {2, 1, 0, 1};
    for (int j = 0; j < 4; j++) {
        ck_assert_int_eq(start[j], want_start[j]);
        ck_assert_int_eq(len[j], want_len[j]);
    }
    ck_assert_int_eq(luna_document_segments(t, 2, sep, start, len), 1);
    ck_assert_int_eq(len[0], 2);
    ck_assert_int_eq(luna_document_segments(t, 0, sep, start, len), 1);
    ck_assert_int_eq(len[0], 0);
}
END_TEST

START_TEST(bad_inputs_fail_cleanly) {
    char train[1024], valid[1024], dest[1024], where[4096];
    snprintf(train, sizeof train, "%s", p("train"));
    snprintf(valid, sizeof valid, "%s", p("valid"));
    snprintf(dest, sizeof dest, "%s", p("out"));
    const char *args[] = {
        "--source-lang", "en", "--target-lang", "de", "--trainpref", train, "--validpref", valid,
        "--destdir",     dest, "--no-spm",      NULL, NULL,          NULL};

    /* Missing file. */
    write_corpus(tmp, "lonely", 10, 5);
    remove(p("lonely.de"));
    char lonely[1024];
    snprintf(lonely, sizeof lonely, "%s", p("lonely"));
    args[5] = lonely;
    snprintf(where, sizeof where, "%s.de: cannot open", lonely);
    expect_failure(args, 1, where, dest);
    args[5] = train;

    /* Line counts differ: the first unmatched line of the longer file. */
    write_corpus(tmp, "uneven", 10, 6);
    FILE *f = fopen(p("uneven.de"), "ab");
    fputs("extra\n", f);
    fclose(f);
    char uneven[1024];
    snprintf(uneven, sizeof uneven, "%s", p("uneven"));
    args[7] = uneven;
    snprintf(where, sizeof where, "%s.de:11: line count differs", uneven);
    expect_failure(args, 1, where, dest);

    /* Invalid UTF-8 (line 3), empty line (line 2), too long line (line 4). */
    struct {
        const char *lang, *text, *problem;
        int line;
        const char *extra;
    } cases[] = {
        {"en", "one .\ntwo .\nbad \xC3\x28 .\nfour .\n", "invalid UTF-8", 3, NULL},
        {"de", "eins .\n\ndrei .\nvier .\n", "empty line", 2, NULL},
        {"de",
         "eins .\nzwei .\ndrei .\nthis line is far too long for the limit given on the command "
         "line, "
         "much longer than any generated sentence, so it is the one that fails .\n",
         "line is 137 bytes", 4, "--max-line-bytes"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_corpus(tmp, "broken", 4, 7);
        char path[1024];
        snprintf(path, sizeof path, "%s.%s", p("broken"), cases[c].lang);
        luna_test_write_file(path, cases[c].text);
        char broken[1024];
        snprintf(broken, sizeof broken, "%s", p("broken"));
        args[7] = broken;
        args[11] = cases[c].extra;
        args[12] = cases[c].extra ? "100" : NULL;
        snprintf(where, sizeof where, "%s:%d: %s", path, cases[c].line, cases[c].problem);
        expect_failure(args, 1, where, dest);
    }
    args[11] = args[12] = NULL;

    /* --skip-empty drops the pair and says so. */
    write_corpus(tmp, "holes", 5, 8);
    luna_test_write_file(p("holes.de"), "eins .\n \t\ndrei .\nvier .\nfünf .\n");
    char holes[1024];
    snprintf(holes, sizeof holes, "%s", p("holes"));
    args[7] = holes;
    args[11] = "--skip-empty";
    result r = run(args);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "valid: skipping 1 of 5 sentence pairs"));
    luna_pair_dataset *ds;
    ck_assert_int_eq(luna_pair_dataset_open(&ds, dest, "valid", "en", "de"), LUNA_OK);
    ck_assert_uint_eq(luna_pair_dataset_count(ds), 4);
    luna_pair_dataset_free(ds);
    args[11] = NULL;

    /* An existing --destdir whose dictionary differs: refused, and left exactly as it was. */
    char dict[2048], saved[1024];
    snprintf(dict, sizeof dict, "%s/dict.en.txt", dest);
    snprintf(saved, sizeof saved, "%s", p("saved-dict"));
    luna_test_write_file(dict, "house 100\nthe 1\n");
    luna_test_write_file(saved, "house 100\nthe 1\n");
    args[7] = valid;
    snprintf(where, sizeof where, "%s:1: the existing dictionary differs", dict);
    int files_before = count_entries(dest);
    expect_failure(args, 1, where, NULL);
    ck_assert(same_file(dict, saved));
    ck_assert_int_eq(count_entries(dest), files_before);
}
END_TEST

START_TEST(usage_errors) {
    const char *unknown[] = {"--source-lang", "en", "--bogus", NULL};
    expect_failure(unknown, 2, "unknown option '--bogus'", NULL);
    const char *missing_value[] = {"--source-lang", NULL};
    expect_failure(missing_value, 2, "needs a value", NULL);
    const char *no_train[] = {"--source-lang", "en", "--target-lang", "de", NULL};
    expect_failure(no_train, 2, "--trainpref is required", NULL);
    const char *dict_without_spm[] = {
        "--source-lang", "en", "--target-lang", "de", "--srcdict", "d", "--tgtdict", "d", NULL};
    expect_failure(dict_without_spm, 2, "give --spm-model", NULL);
    const char *bad_number[] = {
        "--source-lang", "en", "--target-lang", "de", "--trainpref", "x", "--workers", "two", NULL};
    expect_failure(bad_number, 2, "--workers: 'two' is not an integer", NULL);
    const char *flag_value[] = {"--source-lang", "en", "--no-spm=yes", NULL};
    expect_failure(flag_value, 2, "option '--no-spm' takes no value", NULL);
    const char *positional[] = {"--source-lang", "en", "corpus.txt", NULL};
    expect_failure(positional, 2, "unexpected argument 'corpus.txt'", NULL);
    const char *range[] = {
        "--source-lang", "en", "--target-lang", "de", "--trainpref", "x", "--workers", "0", NULL};
    expect_failure(range, 2, "--workers must be between 1 and 1024", NULL);
    const char *help[] = {"--help", NULL};
    result r = run(help);
    ck_assert_int_eq(r.status, 0);
    const char *flags[] = {"--source-lang SRC",
                           "--target-lang TGT",
                           "--trainpref P",
                           "--validpref P",
                           "--testpref P",
                           "--destdir DIR",
                           "--bpe-vocab-size N",
                           "--spm-model FILE",
                           "--no-spm",
                           "--character-coverage F",
                           "--joined-dictionary",
                           "--srcdict FILE",
                           "--tgtdict FILE",
                           "--thresholdsrc N",
                           "--thresholdtgt N",
                           "--nwordssrc N",
                           "--nwordstgt N",
                           "--padding-factor N",
                           "--max-line-bytes N",
                           "--skip-empty",
                           "--workers N",
                           "dictionary:",
                           "(default: 32000)"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        ck_assert_msg(strstr(r.out, flags[i]), "'%s' not in --help: %s", flags[i], r.out);
    const char *version[] = {"--version", NULL};
    r = run(version);
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "luna-preprocess (luna) "));
}
END_TEST

int main(void) {
    luna_test_find_program(program, sizeof program, "luna-preprocess", "LUNA_PREPROCESS");
    Suite *s = suite_create("data_preprocess");
    TCase *tc = tcase_create("preprocess");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, end_to_end_with_sentencepiece);
    tcase_add_test(tc, no_spm_separate_dictionaries_and_reused_model);
    tcase_add_test(tc, document_windows);
    tcase_add_test(tc, document_segments);
    tcase_add_test(tc, bad_inputs_fail_cleanly);
    tcase_add_test(tc, usage_errors);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
