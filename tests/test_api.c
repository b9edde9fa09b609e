/* The public C API (decoding/api/luna.h) through the shared libluna, on tiny checkpoints
 * (tests/tiny_checkpoint.h): translations, n-best scores, piece input, documents and
 * --score-reference scores equal luna-translate's; a handle shared by threads gives the same
 * results as one call; every kind of bad argument fails with a status and a message, never exits.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoding/api/luna.h"
#include "tests/test_util.h"
#include "tests/tiny_checkpoint.h"

static char *dir, translate[4096], ck[4096], doc_ck[4096];
static const char *const SENTENCES[] = {"the cat", "", "over the dog",
                                        "a dog ran in the park again and again"};
#define N_SENT 4

static void setup(void) {
    dir = luna_test_make_temp_dir();
    luna_test_find_program(translate, sizeof translate, "luna-translate", "LUNA_TRANSLATE");
    LUNA_CHECK_OK(luna_test_tiny_checkpoint(dir, "a.safetensors", 5, false, true));
    LUNA_CHECK_OK(luna_test_tiny_checkpoint(dir, "doc.safetensors", 5, true, true));
    LUNA_CHECK_OK(luna_test_tiny_checkpoint(dir, "novocab.safetensors", 5, false, false));
    snprintf(ck, sizeof ck, "%s/a.safetensors", dir);
    snprintf(doc_ck, sizeof doc_ck, "%s/doc.safetensors", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/in.txt", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < N_SENT; i++)
        fprintf(f, "%s\n", SENTENCES[i]);
    fclose(f);
    /* luna-translate must run the OpenBLAS kernels this process runs (luna.h) */
    setenv("OPENBLAS_CORETYPE", luna_blas_core(), 1);
}

static void teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* luna-translate's stdout (exit status 0 asserted). */
static char *run_translate(const char *const *args) {
    luna_test_exec_options o = {.dir = dir};
    luna_test_result r = luna_test_exec(translate, args, &o);
    ck_assert_msg(r.status == 0, "luna-translate: %s", r.err);
    char *s = strdup(r.out);
    ck_assert_ptr_nonnull(s);
    return s;
}

/* The text after "<prefix>" up to the end of its line, in a fresh string (NULL: none). */
static char *field(const char *out, const char *prefix, int skip_tabs) {
    const char *p = strstr(out, prefix);
    if (!p) return NULL;
    p += strlen(prefix);
    for (int i = 0; i < skip_tabs; i++)
        p = strchr(p, '\t') + 1;
    size_t n = strcspn(p, "\n");
    char *s = strndup(p, n);
    ck_assert_ptr_nonnull(s);
    return s;
}

static luna_translator *open_translator(const char *path, int threads) {
    luna_translator_options to;
    luna_translator_options_init(&to);
    to.threads = threads;
    luna_translator *t = NULL;
    ck_assert_msg(luna_translator_create(&t, path, &to) == LUNA_API_OK, "%s", luna_last_error());
    return t;
}

static luna_search_options short_search(void) {
    luna_search_options o;
    luna_search_options_init(&o);
    o.max_len_b = 12;
    return o;
}

START_TEST(translations_and_scores_are_luna_translates) {
    luna_translator *t = open_translator(ck, 2);
    ck_assert_int_eq(luna_translator_has_spm(t), 1);
    luna_search_options o = short_search();
    o.nbest = 2;
    luna_translation *r;
    ck_assert_msg(luna_translator_translate_batch(t, SENTENCES, NULL, N_SENT, &o, &r) ==
                      LUNA_API_OK,
                  "%s", luna_last_error());
    char *fs = run_translate(ARGS("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                                  "--nbest", "2", "--output-format", "fairseq", "--quiet"));
    char *plain =
        run_translate(ARGS("a.safetensors", "--input", "in.txt", "--max-len-b", "12", "--quiet"));
    /* plain: the best hypotheses, one line each */
    const char *line = plain;
    for (int i = 0; i < N_SENT; i++) {
        size_t n = strcspn(line, "\n");
        ck_assert_int_ge(r[i].num_hypotheses, 1);
        ck_assert_msg(strlen(r[i].hypotheses[0].text) == n &&
                          !strncmp(r[i].hypotheses[0].text, line, n),
                      "sentence %d: API '%s', luna-translate '%.*s'", i, r[i].hypotheses[0].text,
                      (int)n, line);
        line += n + 1;
    }
    /* fairseq: both hypotheses' scores (D-) and texts, and the per-token scores (P-) */
    for (int i = 0; i < N_SENT; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "D-%d\t", i);
        const char *at = fs;
        for (int k = 0; k < (i == 1 ? 1 : 2); k++) {
            at = strstr(at, prefix);
            ck_assert_ptr_nonnull(at);
            char *score = field(at, prefix, 0), *text = field(at, prefix, 1);
            *strchr(score, '\t') = 0;
            const luna_hypothesis_result *h = &r[i].hypotheses[k];
            ck_assert_msg(strtod(score, NULL) == h->score, "D-%d #%d: %s vs %.9g", i, k, score,
                          h->score);
            ck_assert_str_eq(text, h->text);
            free(score), free(text);
            snprintf(prefix + 16, 16, "P-%d\t", i);
            char *pos = field(at, prefix + 16, 0);
            char *p = pos;
            for (int j = 0; j < h->num_tokens; j++) {
                char *end;
                double v = strtod(p, &end);
                ck_assert_ptr_ne(end, p);
                ck_assert_msg(fabs(v - h->token_scores[j]) <= 5.1e-5, "P-%d[%d]: %g vs %g", i, j, v,
                              h->token_scores[j]);
                p = end;
            }
            ck_assert_str_eq(p, "");
            free(pos);
            at += strlen(prefix);
        }
    }
    /* the blank sentence: one empty hypothesis scored -inf, as luna-translate's H-1 -inf */
    ck_assert_int_eq(r[1].num_hypotheses, 1);
    ck_assert_str_eq(r[1].hypotheses[0].text, "");
    ck_assert(isinf(r[1].hypotheses[0].score) && r[1].hypotheses[0].score < 0);
    ck_assert_int_eq(r[0].num_hypotheses, 2);
    luna_translations_free(r, N_SENT);
    free(fs), free(plain);
    luna_translator_free(t);
}
END_TEST

/* Piece input gives piece output, the search's own pieces (the H- line). */
START_TEST(pieces_in_pieces_out) {
    luna_translator *t = open_translator(ck, 1);
    char *fs = run_translate(ARGS("a.safetensors", "--input", "in.txt", "--max-len-b", "12",
                                  "--output-format", "fairseq", "--quiet"));
    char *src = field(fs, "S-3\t", 0), *hyp = field(fs, "H-3\t", 1);
    luna_search_options o = short_search();
    o.pieces = 1;
    luna_translation *r;
    const char *in[] = {src};
    ck_assert_msg(luna_translator_translate_batch(t, in, NULL, 1, &o, &r) == LUNA_API_OK, "%s",
                  luna_last_error());
    ck_assert_str_eq(r[0].hypotheses[0].text, hyp);
    printf("pieces: '%s' -> '%s'\n", src, hyp);
    luna_translations_free(r, 1);
    free(fs), free(src), free(hyp);
    luna_translator_free(t);
}
END_TEST

/* A document line's hypothesis is its sentences joined by '\n': luna-translate's plain lines. */
START_TEST(document_lines) {
    char path[4096];
    const char *line = "the cat <sep> over the dog <sep> a dog ran";
    snprintf(path, sizeof path, "%s/doc.txt", dir);
    luna_test_write_file(path, "the cat <sep> over the dog <sep> a dog ran\n");
    char *plain = run_translate(
        ARGS("doc.safetensors", "--input", "doc.txt", "--max-len-b", "12", "--quiet"));
    luna_translator *t = open_translator(doc_ck, 1);
    luna_search_options o = short_search();
    luna_translation *r;
    ck_assert_msg(luna_translator_translate_batch(t, &line, NULL, 1, &o, &r) == LUNA_API_OK, "%s",
                  luna_last_error());
    size_t n = strlen(r[0].hypotheses[0].text);
    ck_assert_int_eq(strlen(plain), n + 1);
    ck_assert(!strncmp(plain, r[0].hypotheses[0].text, n));
    luna_translations_free(r, 1);
    luna_translator_free(t);
    free(plain);
}
END_TEST

START_TEST(scores_are_score_references) {
    luna_translator *t = open_translator(ck, 2);
    const char *tgt[] = {"a dog", "the cat", "", "the park"};
    char path[4096];
    snprintf(path, sizeof path, "%s/ref.txt", dir);
    luna_test_write_file(path, "a dog\nthe cat\n\nthe park\n");
    char *out = run_translate(ARGS("a.safetensors", "--input", "in.txt", "--score-reference",
                                   "--reference", "ref.txt", "--quiet"));
    luna_score_result *r;
    ck_assert_msg(luna_translator_score_batch(t, SENTENCES, NULL, tgt, NULL, N_SENT, NULL, &r) ==
                      LUNA_API_OK,
                  "%s", luna_last_error());
    const char *p = out;
    for (int i = 0; i < N_SENT; i++) {
        char *end;
        ck_assert_msg(strtod(p, &end) == r[i].score, "line %d: %.*s vs %.9g", i,
                      (int)strcspn(p, "\n"), p, r[i].score);
        p = end + 1;
    }
    ck_assert_int_eq(r[1].num_tokens, 0); /* blank source */
    ck_assert_int_eq(r[2].num_tokens, 0); /* blank target */
    ck_assert_int_gt(r[0].num_tokens, 1);
    double sum = 0;
    for (int k = 0; k < r[3].num_tokens; k++)
        sum += r[3].token_scores[k];
    ck_assert_double_eq_tol(sum / r[3].num_tokens, r[3].score, 1e-5);
    luna_score_results_free(r, N_SENT);
    free(out);
    luna_translator_free(t);
}
END_TEST

/* ---- threads ------------------------------------------------------------------------------- */

typedef struct {
    luna_translator *t;
    char *texts[N_SENT];
    int failed;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    luna_search_options o = short_search();
    for (int rep = 0; rep < 3 && !w->failed; rep++) {
        luna_translation *r;
        if (luna_translator_translate_batch(w->t, SENTENCES, NULL, N_SENT, &o, &r) != LUNA_API_OK) {
            w->failed = 1;
            break;
        }
        for (int i = 0; i < N_SENT; i++) {
            if (rep == 0)
                w->texts[i] = strdup(r[i].hypotheses[0].text);
            else if (strcmp(w->texts[i], r[i].hypotheses[0].text))
                w->failed = 2;
        }
        luna_translations_free(r, N_SENT);
    }
    return NULL;
}

/* Workers w[0..n) succeeded with the lone call's texts (freed here). */
static void expect_alone(worker *w, int n, const worker *alone) {
    for (int i = 0; i < n; i++) {
        ck_assert_msg(w[i].failed == 0, "worker %d failed (%d)", i, w[i].failed);
        for (int s = 0; s < N_SENT; s++) {
            ck_assert_str_eq(w[i].texts[s], alone->texts[s]);
            free(w[i].texts[s]);
        }
    }
}

/* Four threads on one handle and two more on a second one: every result is the lone call's. */
START_TEST(threads_share_a_translator) {
    luna_translator *t = open_translator(ck, 1), *u = open_translator(ck, 2);
    worker alone = {.t = t};
    work(&alone);
    ck_assert_int_eq(alone.failed, 0);
    enum { W = 6 };
    worker w[W];
    pthread_t th[W];
    for (int i = 0; i < W; i++) {
        w[i] = (worker){.t = i < 4 ? t : u};
        ck_assert_int_eq(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    expect_alone(w, W, &alone);
    for (int s = 0; s < N_SENT; s++)
        free(alone.texts[s]);
    luna_translator_free(t);
    luna_translator_free(u);
}
END_TEST

/* Clones (luna_translator_clone), a clone of a clone among them, translate at once with their
 * origin on threads of their own, each as the lone call did; they go on after the origin's handle
 * is freed. */
START_TEST(clones_translate_as_their_origin) {
    luna_translator *t = open_translator(ck, 1);
    worker alone = {.t = t};
    work(&alone);
    ck_assert_int_eq(alone.failed, 0);
    enum { W = 4 };
    luna_translator *h[W] = {t};
    ck_assert_msg(luna_translator_clone(&h[1], t) == LUNA_API_OK, "%s", luna_last_error());
    ck_assert_msg(luna_translator_clone(&h[2], h[1]) == LUNA_API_OK, "%s", luna_last_error());
    ck_assert_msg(luna_translator_clone(&h[3], t) == LUNA_API_OK, "%s", luna_last_error());
    worker w[W + 1];
    pthread_t th[W];
    for (int i = 0; i < W; i++) {
        w[i] = (worker){.t = h[i]};
        ck_assert_int_eq(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    luna_translator_free(t);
    w[W] = (worker){.t = h[2]};
    work(&w[W]);
    expect_alone(w, W + 1, &alone);
    for (int s = 0; s < N_SENT; s++)
        free(alone.texts[s]);
    for (int i = 1; i < W; i++)
        luna_translator_free(h[i]);
    luna_translator *c = (luna_translator *)&c;
    ck_assert_int_eq(luna_translator_clone(&c, NULL), LUNA_API_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(luna_translator_clone(NULL, NULL), LUNA_API_ERR_INVALID_ARGUMENT);
}
END_TEST

/* ---- errors -------------------------------------------------------------------------------- */

#define EXPECT_ERROR(call, status, text)                                                           \
    do {                                                                                           \
        luna_api_status s_ = (call);                                                               \
        ck_assert_msg(s_ == (status), "%s: status %d, expected %d (%s)", #call, s_, status,        \
                      luna_last_error());                                                          \
        ck_assert_msg(strstr(luna_last_error(), text), "%s: message '%s' lacks '%s'", #call,       \
                      luna_last_error(), text);                                                    \
    } while (0)

START_TEST(errors_are_statuses_with_messages) {
    luna_translator *t = (luna_translator *)1;
    char path[4096];
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    EXPECT_ERROR(luna_translator_create(&t, path, NULL), LUNA_API_ERR_IO, "missing.safetensors");
    ck_assert_ptr_null(t);
    snprintf(path, sizeof path, "%s/novocab.safetensors", dir);
    EXPECT_ERROR(luna_translator_create(&t, path, NULL), LUNA_API_ERR_FORMAT,
                 "lacks its vocabulary");
    snprintf(path, sizeof path, "%s/in.txt", dir); /* not a checkpoint at all */
    luna_api_status s = luna_translator_create(&t, path, NULL);
    ck_assert_int_ne(s, LUNA_API_OK);
    ck_assert_msg(strstr(luna_last_error(), "in.txt"), "%s", luna_last_error());
    luna_translator_options to;
    luna_translator_options_init(&to);
    to.threads = 0;
    EXPECT_ERROR(luna_translator_create(&t, ck, &to), LUNA_API_ERR_INVALID_ARGUMENT, "threads");
    luna_translator_options_init(&to);
    to.device = "tpu";
    ck_assert_int_ne(luna_translator_create(&t, ck, &to), LUNA_API_OK);
    ck_assert_ptr_nonnull(strstr(luna_last_error(), "tpu"));
    luna_translator_options_init(&to);
    to.precision = "fp8";
    EXPECT_ERROR(luna_translator_create(&t, ck, &to), LUNA_API_ERR_INVALID_ARGUMENT, "fp8");
    EXPECT_ERROR(luna_translator_create(&t, NULL, NULL), LUNA_API_ERR_INVALID_ARGUMENT,
                 "checkpoint");

    t = open_translator(ck, 1);
    luna_translation *r = (luna_translation *)1;
    luna_search_options o;
    luna_search_options_init(&o), o.beam = 0;
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, &o, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "beam must be in 1..1024");
    ck_assert_ptr_null(r);
    luna_search_options_init(&o), o.nbest = 5;
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, &o, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "nbest");
    luna_search_options_init(&o), o.temperature = 0;
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, &o, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "temperature");
    luna_search_options_init(&o), o.max_len_b = -1;
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, &o, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "max_len_b");
    luna_search_options_init(&o), o.sampling_topk = 3;
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, &o, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "sampling_topk needs sampling");
    luna_search_options_init(&o), o.max_input_tokens = 1;
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, &o, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "max_input_tokens");
    /* text: invalid UTF-8, a NUL inside a counted string, a NULL string */
    const char *bad_text[] = {"fine", "bad \xff\xfe byte"};
    EXPECT_ERROR(luna_translator_translate_batch(t, bad_text, NULL, 2, NULL, &r),
                 LUNA_API_ERR_FORMAT, "sentence:2: invalid UTF-8 at byte 5");
    const size_t lens[] = {4, 3};
    const char *nul_text[] = {"fine", "a\0b"};
    EXPECT_ERROR(luna_translator_translate_batch(t, nul_text, lens, 2, NULL, &r),
                 LUNA_API_ERR_FORMAT, "sentence:2: NUL byte");
    const char *null_text[] = {"fine", NULL};
    EXPECT_ERROR(luna_translator_translate_batch(t, null_text, NULL, 2, NULL, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "sentence 2 is NULL");
    EXPECT_ERROR(luna_translator_translate_batch(NULL, SENTENCES, NULL, 1, NULL, &r),
                 LUNA_API_ERR_INVALID_ARGUMENT, "translator is NULL");
    EXPECT_ERROR(luna_translator_translate_batch(t, SENTENCES, NULL, 1, NULL, NULL),
                 LUNA_API_ERR_INVALID_ARGUMENT, "results is NULL");
    luna_score_result *sr;
    EXPECT_ERROR(luna_translator_score_batch(t, SENTENCES, NULL, bad_text, NULL, 2, NULL, &sr),
                 LUNA_API_ERR_FORMAT, "target:2: invalid UTF-8");
    /* an empty batch is fine; a too-long source is cut and flagged */
    ck_assert_int_eq(luna_translator_translate_batch(t, SENTENCES, NULL, 0, NULL, &r), LUNA_API_OK);
    luna_translations_free(r, 0);
    luna_search_options_init(&o), o.max_input_tokens = 10, o.max_len_b = 3;
    ck_assert_int_eq(luna_translator_translate_batch(t, SENTENCES, NULL, N_SENT, &o, &r),
                     LUNA_API_OK);
    ck_assert_int_eq(r[0].truncated, 0);
    ck_assert_int_eq(r[3].truncated, 1);
    luna_translations_free(r, N_SENT);
    /* still usable after the errors */
    ck_assert_int_eq(luna_translator_translate_batch(t, SENTENCES, NULL, 1, NULL, &r), LUNA_API_OK);
    luna_translations_free(r, 1);
    luna_translator_free(t);
    luna_translator_free(NULL);
}
END_TEST

/* set_workers: one call's sentences split over 3 workers, then 2, then 1, translate as the lone
 * worker did; bad counts are errors, and a device translator keeps one worker. */
START_TEST(workers_split_a_call) {
    luna_translator *t = open_translator(ck, 1);
    worker alone = {.t = t};
    work(&alone);
    ck_assert_int_eq(alone.failed, 0);
    const int counts[] = {3, 2, 1, 2};
    for (int c = 0; c < 4; c++) {
        ck_assert_msg(luna_translator_set_workers(t, counts[c]) == LUNA_API_OK, "%s",
                      luna_last_error());
        worker w = {.t = t};
        work(&w);
        expect_alone(&w, 1, &alone);
    }
    for (int s = 0; s < N_SENT; s++)
        free(alone.texts[s]);
    EXPECT_ERROR(luna_translator_set_workers(t, 0), LUNA_API_ERR_INVALID_ARGUMENT,
                 "workers must be in 1..1024");
    EXPECT_ERROR(luna_translator_set_workers(t, 1025), LUNA_API_ERR_INVALID_ARGUMENT, "workers");
    EXPECT_ERROR(luna_translator_set_workers(NULL, 2), LUNA_API_ERR_INVALID_ARGUMENT, "NULL");
    luna_translator_free(t); /* with its 2 workers */
#ifdef LUNA_TEST_CUDA_HARNESS
    luna_translator_options to;
    luna_translator_options_init(&to);
    to.device = "cuda";
    ck_assert_msg(luna_translator_create(&t, ck, &to) == LUNA_API_OK, "%s", luna_last_error());
    EXPECT_ERROR(luna_translator_set_workers(t, 2), LUNA_API_ERR_UNSUPPORTED, "for the CPU");
    ck_assert_int_eq(luna_translator_set_workers(t, 1), LUNA_API_OK);
    luna_translator_free(t);
#endif
}
END_TEST

START_TEST(version) {
    ck_assert_str_eq(luna_version(), LUNA_VERSION);
    ck_assert_ptr_nonnull(luna_blas_core());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, translations_and_scores_are_luna_translates);
    tcase_add_test(tc, pieces_in_pieces_out);
    tcase_add_test(tc, document_lines);
    tcase_add_test(tc, scores_are_score_references);
    tcase_add_test(tc, threads_share_a_translator);
    tcase_add_test(tc, clones_translate_as_their_origin);
    tcase_add_test(tc, workers_split_a_call);
    tcase_add_test(tc, errors_are_statuses_with_messages);
    tcase_add_test(tc, version);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
