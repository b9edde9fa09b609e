/* data/sentencepiece: training, encoding, decoding and errors through the C interface. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/sentencepiece.h"
#include "core/file_util.h"
#include "tests/test_util.h"

static const char *WORDS[] = {"the",    "house", "is",      "small",  "a",        "garden",
                              "with",   "green", "trees",   "and",    "old",      "walls",
                              "river",  "flows", "through", "city",   "children", "play",
                              "near",   "water", "under",   "bright", "summer",   "sun",
                              "people", "walk",  "quickly", "home"};
#define NWORDS (sizeof WORDS / sizeof WORDS[0])
#define NSENT 1500

static char *dir;
static char *corpus_path;
static char *sentences[NSENT];

/* Sentences of 3-12 words, single spaces (so SentencePiece's normalization is the identity).
 * Runs before the suite, outside any test, so it must not use ck_assert. */
static void make_corpus(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/luna-test-spm-XXXXXX", base && *base ? base : "/tmp");
    dir = mkdtemp(tmpl) ? strdup(tmpl) : NULL;
    corpus_path = dir ? luna_path_join(dir, "corpus.txt") : NULL;
    FILE *f = corpus_path ? fopen(corpus_path, "wb") : NULL;
    if (!f) {
        fprintf(stderr, "test_data_spm: cannot create the corpus in %s\n", tmpl);
        exit(EXIT_FAILURE);
    }
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    for (int i = 0; i < NSENT; i++) {
        char line[256] = "";
        int n = (int)luna_test_uniform(&rng, 3, 13);
        for (int w = 0; w < n; w++) {
            if (w) strcat(line, " ");
            strcat(line, WORDS[(size_t)luna_test_uniform(&rng, 0, (float)NWORDS)]);
        }
        if (i % 5 == 0) strcat(line, ".");
        sentences[i] = strdup(line);
        fprintf(f, "%s\n", line);
    }
    if (fclose(f) != 0) exit(EXIT_FAILURE);
}

static void free_corpus(void) {
    for (int i = 0; i < NSENT; i++)
        free(sentences[i]);
    free(corpus_path);
    luna_test_remove_tree(dir);
    free(dir);
}

static luna_spm *train(const char *name, int vocab) {
    char *prefix = luna_path_join(dir, name);
    const char *inputs[1] = {corpus_path};
    luna_spm_train_options o;
    luna_spm_train_options_init(&o);
    o.input_files = inputs;
    o.n_input_files = 1;
    o.model_prefix = prefix;
    o.vocab_size = vocab;
    o.num_threads = 2;
    luna_status st = luna_spm_train(&o);
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    char path[1024];
    snprintf(path, sizeof path, "%s.model", prefix);
    luna_spm *spm;
    ck_assert_int_eq(luna_spm_load(&spm, path), LUNA_OK);
    free(prefix);
    return spm;
}

START_TEST(train_encode_decode_roundtrip) {
    luna_spm *spm = train("m", 120);
    ck_assert_int_eq(luna_spm_vocab_size(spm), 120);
    /* The .vocab file has one "piece<TAB>score" line per piece. */
    char path[1024], *vocab;
    size_t n;
    snprintf(path, sizeof path, "%s/m.vocab", dir);
    ck_assert_int_eq(luna_read_file(path, &vocab, &n), LUNA_OK);
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += vocab[i] == '\n';
    ck_assert_int_eq(lines, 120);
    ck_assert(strncmp(vocab, "<unk>\t0\n<s>\t0\n</s>\t0\n", 20) == 0);
    free(vocab);

    luna_spm_pieces p;
    luna_spm_pieces_init(&p);
    size_t total_pieces = 0;
    for (int i = 0; i < NSENT; i += 7) {
        const char *s = sentences[i];
        ck_assert_int_eq(luna_spm_encode_pieces(spm, s, strlen(s), &p), LUNA_OK);
        ck_assert_uint_gt(p.count, 0);
        total_pieces += p.count;
        for (size_t k = 0; k < p.count; k++) {
            ck_assert_int_eq(luna_spm_piece_to_id(spm, p.pieces[k], strlen(p.pieces[k])), p.ids[k]);
            ck_assert_str_eq(luna_spm_id_to_piece(spm, p.ids[k]), p.pieces[k]);
        }
        ck_assert(strncmp(p.pieces[0], "\xE2\x96\x81", 3) == 0);
        char *text;
        ck_assert_int_eq(luna_spm_decode_pieces(spm, (const char *const *)p.pieces, p.count, &text),
                         LUNA_OK);
        ck_assert_str_eq(text, s);
        free(text);
        int32_t *ids;
        size_t nids;
        ck_assert_int_eq(luna_spm_encode_ids(spm, s, strlen(s), &ids, &nids), LUNA_OK);
        ck_assert_uint_eq(nids, p.count);
        ck_assert(memcmp(ids, p.ids, nids * sizeof *ids) == 0);
        ck_assert_int_eq(luna_spm_decode_ids(spm, ids, nids, &text), LUNA_OK);
        ck_assert_str_eq(text, s);
        free(text);
        free(ids);
    }
    /* BPE merged something: fewer pieces than characters. */
    ck_assert_uint_lt(total_pieces, (size_t)NSENT / 7 * 30);
    /* A character never seen in training: its piece is the text itself, with the unknown id. */
    const char *odd = "the \xE2\x98\x83 house";
    ck_assert_int_eq(luna_spm_encode_pieces(spm, odd, strlen(odd), &p), LUNA_OK);
    int unknown = 0;
    for (size_t k = 0; k < p.count; k++)
        if (p.ids[k] == luna_spm_unk_id(spm)) {
            unknown++;
            ck_assert_ptr_nonnull(strstr(p.pieces[k], "\xE2\x98\x83"));
        }
    ck_assert_int_eq(unknown, 1);
    ck_assert_int_eq(luna_spm_piece_to_id(spm, "no-such-piece", 13), luna_spm_unk_id(spm));
    ck_assert_ptr_null(luna_spm_id_to_piece(spm, 120));
    int32_t bad_id = 500;
    char *text;
    ck_assert_int_eq(luna_spm_decode_ids(spm, &bad_id, 1, &text), LUNA_ERR_INVALID_ARGUMENT);
    luna_spm_pieces_release(&p);

    /* The serialized model reloads to the same segmentation. */
    const void *bytes;
    size_t size;
    ck_assert_int_eq(luna_spm_serialized(spm, &bytes, &size), LUNA_OK);
    luna_spm *copy;
    ck_assert_int_eq(luna_spm_load_from_memory(&copy, bytes, size, "copy"), LUNA_OK);
    int32_t *a, *b;
    size_t na, nb;
    ck_assert_int_eq(luna_spm_encode_ids(spm, sentences[1], strlen(sentences[1]), &a, &na),
                     LUNA_OK);
    ck_assert_int_eq(luna_spm_encode_ids(copy, sentences[1], strlen(sentences[1]), &b, &nb),
                     LUNA_OK);
    ck_assert_uint_eq(na, nb);
    ck_assert(memcmp(a, b, na * sizeof *a) == 0);
    free(a);
    free(b);
    luna_spm_free(copy);
    luna_spm_free(spm);
}
END_TEST

START_TEST(parallel_encoding_matches_serial) {
    luna_spm *spm = train("p", 100);
    size_t *serial = calloc(NSENT, sizeof *serial), *parallel = calloc(NSENT, sizeof *parallel);
    for (int i = 0; i < NSENT; i++) {
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(luna_spm_encode_ids(spm, sentences[i], strlen(sentences[i]), &ids, &n),
                         LUNA_OK);
        for (size_t k = 0; k < n; k++)
            serial[i] = serial[i] * 31 + (size_t)ids[k] + 1;
        free(ids);
    }
    int failures = 0;
#pragma omp parallel for num_threads(2) reduction(+ : failures)
    for (int i = 0; i < NSENT; i++) {
        luna_spm_pieces p;
        luna_spm_pieces_init(&p);
        if (luna_spm_encode_pieces(spm, sentences[i], strlen(sentences[i]), &p) != LUNA_OK)
            failures++;
        for (size_t k = 0; k < p.count; k++)
            parallel[i] = parallel[i] * 31 + (size_t)p.ids[k] + 1;
        luna_spm_pieces_release(&p);
    }
    ck_assert_int_eq(failures, 0);
    ck_assert(memcmp(serial, parallel, NSENT * sizeof *serial) == 0);
    free(serial);
    free(parallel);
    luna_spm_free(spm);
}
END_TEST

typedef struct {
    int i;
} feed;

static int next_line(void *ctx, const char **line, size_t *len) {
    feed *f = ctx;
    if (f->i >= NSENT) return 0;
    *line = sentences[f->i++];
    *len = strlen(*line);
    return 1;
}

START_TEST(train_from_callback_and_errors) {
    char *prefix = luna_path_join(dir, "cb");
    feed f = {0};
    luna_spm_train_options o;
    luna_spm_train_options_init(&o);
    o.next = next_line;
    o.next_ctx = &f;
    o.model_prefix = prefix;
    o.vocab_size = 90;
    ck_assert_msg(luna_spm_train(&o) == LUNA_OK, "%s", luna_error_message());
    ck_assert_int_eq(f.i, NSENT);
    char path[1024];
    snprintf(path, sizeof path, "%s.model", prefix);
    luna_spm *spm;
    ck_assert_int_eq(luna_spm_load(&spm, path), LUNA_OK);
    ck_assert_int_eq(luna_spm_vocab_size(spm), 90);
    luna_spm_free(spm);

    /* A vocabulary larger than the text supports: SentencePiece's reason is passed on. */
    f.i = 0;
    o.vocab_size = 100000;
    ck_assert_int_eq(luna_spm_train(&o), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "Vocabulary size"));
    /* Missing input file. */
    const char *missing[1] = {"/nonexistent/corpus.txt"};
    o.next = NULL;
    o.input_files = missing;
    o.n_input_files = 1;
    o.vocab_size = 90;
    ck_assert_int_ne(luna_spm_train(&o), LUNA_OK);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "/nonexistent/corpus.txt"));
    /* Bad options. */
    o.input_files = NULL;
    ck_assert_int_eq(luna_spm_train(&o), LUNA_ERR_INVALID_ARGUMENT);

    /* Loading: missing file, then a file that is not a model. */
    spm = NULL;
    ck_assert_int_eq(luna_spm_load(&spm, "/nonexistent/spm.model"), LUNA_ERR_IO);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "/nonexistent/spm.model"));
    ck_assert_int_eq(luna_spm_load(&spm, corpus_path), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), corpus_path));
    ck_assert_ptr_null(spm);
    free(prefix);
}
END_TEST

int main(void) {
    make_corpus();
    Suite *s = suite_create("data_spm");
    TCase *tc = tcase_create("sentencepiece");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, train_encode_decode_roundtrip);
    tcase_add_test(tc, parallel_encoding_matches_serial);
    tcase_add_test(tc, train_from_callback_and_errors);
    suite_add_tcase(s, tc);
    int rc = luna_test_run(s);
    free_corpus();
    return rc;
}
