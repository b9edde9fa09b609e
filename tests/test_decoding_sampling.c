/* fairseq's decoding conveniences (decoding/sampling.h): --no-repeat-ngram-size and --sampling
 * with --sampling-topk, --temperature and --seed.
 *
 * N-gram blocking: the ban list on hand-made sequences; on tiny random models whose plain beam
 * output repeats n-grams, no returned hypothesis repeats an n-gram of the blocked size, and size 0
 * is the default search. Sampling: the same seed gives the same samples (any thread count, any
 * batching), other seeds other samples (nearly flat distribution); top-k 1 and a tiny temperature
 * are greedy decoding; the draw matches a known distribution (chi-square, fixed seed) on the host
 * and, end to end, the model's tempered first-token distribution. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoding/beam_search.h"
#include "decoding/sampling.h"
#include "tests/test_util.h"

static luna_backend *be;

static luna_seq2seq *make_model(luna_backend *b, const char *preset, int V, uint64_t seed) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, preset), LUNA_OK);
    c.vocab_size = V;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, b, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, seed), LUNA_OK);
    return m;
}

/* Whether tok[0..len) (without the final </s>) holds some n-gram twice. */
static bool repeats_ngram(const int32_t *tok, int len, int n) {
    for (int i = 0; i + n <= len; i++)
        for (int j = i + 1; j + n <= len; j++)
            if (memcmp(tok + i, tok + j, sizeof(int32_t) * (size_t)n) == 0) return true;
    return false;
}

static bool same_nbest(const luna_nbest *a, const luna_nbest *b, bool scores) {
    if (a->count != b->count) return false;
    for (int i = 0; i < a->count; i++) {
        const luna_hypothesis *x = &a->hyps[i], *y = &b->hyps[i];
        if (x->len != y->len || memcmp(x->tokens, y->tokens, sizeof(int32_t) * x->len) != 0)
            return false;
        if (scores && (x->score != y->score ||
                       memcmp(x->positional_scores, y->positional_scores, sizeof(float) * x->len)))
            return false;
    }
    return true;
}

static void release_all(luna_nbest *out, int n) {
    for (int i = 0; i < n; i++)
        luna_nbest_release(&out[i]);
}

/* ---- n-gram blocking ------------------------------------------------------------------------- */

START_TEST(ngram_bans_known_values) {
    /* BOS, then 5 6 7 5 6: the last (n−1)-gram "5 6" occurred before, followed by 7 */
    const int32_t tok[6] = {2, 5, 6, 7, 5, 6};
    int32_t ban[6];
    ck_assert_int_eq(luna_ngram_bans(tok, 6, 3, ban), 1);
    ck_assert_int_eq(ban[0], 7);
    ck_assert_int_eq(luna_ngram_bans(tok, 6, 2, ban), 1); /* "6" was followed by 7 */
    ck_assert_int_eq(ban[0], 7);
    ck_assert_int_eq(luna_ngram_bans(tok, 6, 4, ban), 0); /* "7 5 6" is new */
    ck_assert_int_eq(luna_ngram_bans(tok, 6, 1, ban), 5); /* every token so far, BOS excluded */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(ban[i], tok[i + 1]);
    ck_assert_int_eq(luna_ngram_bans(tok, 2, 3, ban), 0); /* too short */
    ck_assert_int_eq(luna_ngram_bans(tok, 1, 1, ban), 0); /* BOS only */
    /* the banned tokens leave the list, the rest keep their order; missing places are −inf */
    float lp[5] = {-0.1f, -0.5f, -1.0f, -2.0f, -3.0f};
    int32_t tk[5] = {7, 4, 9, 5, 8};
    const int32_t bans[2] = {9, 7};
    luna_drop_banned(lp, tk, 5, 3, bans, 2, 3);
    ck_assert(tk[0] == 4 && tk[1] == 5 && tk[2] == 8);
    ck_assert(lp[0] == -0.5f && lp[1] == -2.0f && lp[2] == -3.0f);
    float lp2[2] = {-0.1f, -0.2f};
    int32_t tk2[2] = {7, 9};
    luna_drop_banned(lp2, tk2, 2, 2, bans, 2, 3);
    ck_assert(lp2[0] == -INFINITY && tk2[0] == 3 && lp2[1] == -INFINITY);
}
END_TEST

START_TEST(no_repeat_ngram_blocks_repeats) {
    /* 12 tokens over a small vocabulary (min_len = max_len): a random tiny model's search loops */
    const int V = 12, L = 12;
    int32_t srcs[3][6] = {{5, 9, 11, 2}, {7, 2}, {4, 4, 8, 10, 6, 2}};
    luna_token_seq seq[3] = {{srcs[0], 4}, {srcs[1], 2}, {srcs[2], 6}};
    luna_beam_options plain;
    luna_beam_options_init(&plain);
    plain.max_len_b = L;
    plain.min_len = L;
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < 2; p++) {
        /* the first model seed whose plain greedy output repeats a trigram (so a bigram too) */
        luna_seq2seq *model = NULL;
        luna_incremental *inc = NULL;
        luna_nbest out[3];
        uint64_t model_seed = 0;
        for (uint64_t seed = 1; seed <= 20 && !model; seed++) {
            model = make_model(be, presets[p], V, model_seed = seed);
            ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
            plain.beam = plain.nbest = 1;
            ck_assert_int_eq(luna_beam_search(inc, &plain, seq, 3, out), LUNA_OK);
            bool rep = false;
            for (int s = 0; s < 3; s++)
                rep = rep || repeats_ngram(out[s].hyps[0].tokens, out[s].hyps[0].len - 1, 3);
            release_all(out, 3);
            if (rep) break;
            luna_incremental_free(inc);
            luna_seq2seq_free(model);
            model = NULL;
        }
        ck_assert_msg(model, "%s: no model seed in 1..20 repeats a trigram", presets[p]);
        fprintf(stderr, "%s: plain search repeats trigrams with model seed %d\n", presets[p],
                (int)model_seed);
        for (int beam = 1; beam <= 4; beam += 3)
            for (int n = 2; n <= 3; n++) {
                luna_beam_options o = plain;
                o.beam = o.nbest = beam;
                o.no_repeat_ngram_size = n;
                ck_assert_int_eq(luna_beam_search(inc, &o, seq, 3, out), LUNA_OK);
                for (int s = 0; s < 3; s++) {
                    ck_assert_int_eq(out[s].count, beam);
                    for (int h = 0; h < out[s].count; h++) {
                        const luna_hypothesis *y = &out[s].hyps[h];
                        ck_assert_int_eq(y->len, L + 1);
                        ck_assert(isfinite(y->score));
                        ck_assert_msg(!repeats_ngram(y->tokens, y->len - 1, n),
                                      "%s beam %d: sentence %d hypothesis %d repeats a %d-gram",
                                      presets[p], beam, s, h, n);
                    }
                }
                release_all(out, 3);
            }
        /* size 0 is the default search, bit for bit */
        luna_nbest a[3], b[3];
        luna_beam_options o = plain;
        o.beam = o.nbest = 4;
        ck_assert_int_eq(luna_beam_search(inc, &o, seq, 3, a), LUNA_OK);
        o.no_repeat_ngram_size = 0;
        ck_assert_int_eq(luna_beam_search(inc, &o, seq, 3, b), LUNA_OK);
        for (int s = 0; s < 3; s++)
            ck_assert(same_nbest(&a[s], &b[s], true));
        release_all(a, 3);
        release_all(b, 3);
        luna_incremental_free(inc);
        luna_seq2seq_free(model);
    }
}
END_TEST

/* ---- sampling -------------------------------------------------------------------------------- */

static int32_t src_tok[4][8] = {{5, 9, 13, 2}, {7, 2}, {4, 4, 8, 19, 11, 6, 2}, {6, 12, 2}};
static const luna_token_seq SRC[4] = {
    {src_tok[0], 4}, {src_tok[1], 2}, {src_tok[2], 7}, {src_tok[3], 3}};

static void sample_opts(luna_beam_options *o, int beam, uint64_t seed) {
    luna_beam_options_init(o);
    o->sampling = true;
    o->beam = o->nbest = beam;
    o->max_len_b = 12;
    o->seed = seed;
}

START_TEST(sampling_same_seed_same_samples) {
    const int V = 20;
    luna_seq2seq *model = make_model(be, "luna_tiny", V, 3);
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    luna_beam_options o;
    sample_opts(&o, 3, 11);
    luna_nbest a[4], b[4];
    ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, a, NULL, NULL), LUNA_OK);
    ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, b, NULL, NULL), LUNA_OK);
    for (int s = 0; s < 4; s++)
        ck_assert(same_nbest(&a[s], &b[s], true));
    release_all(b, 4);
    /* one sentence per batch: the draws are keyed by the sentence's input index */
    ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 1, b, NULL, NULL), LUNA_OK);
    for (int s = 0; s < 4; s++)
        ck_assert(same_nbest(&a[s], &b[s], true));
    release_all(b, 4);
    /* one thread instead of two (the same model on another backend) */
    luna_backend *be1 = luna_test_backend(1);
    luna_seq2seq *model1 = make_model(be1, "luna_tiny", V, 3);
    luna_incremental *inc1;
    ck_assert_int_eq(luna_incremental_create(&inc1, model1), LUNA_OK);
    ck_assert_int_eq(luna_generate(inc1, &o, SRC, 4, 0, 0, b, NULL, NULL), LUNA_OK);
    for (int s = 0; s < 4; s++)
        ck_assert(same_nbest(&a[s], &b[s], true));
    release_all(b, 4);
    /* sorted by score, each a complete sample */
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(a[s].count, 3);
        for (int h = 0; h < a[s].count; h++) {
            const luna_hypothesis *y = &a[s].hyps[h];
            ck_assert_int_eq(y->tokens[y->len - 1], 2);
            if (h) ck_assert(a[s].hyps[h - 1].score >= y->score);
        }
    }
    release_all(a, 4);
    luna_incremental_free(inc1);
    luna_seq2seq_free(model1);
    luna_backend_free(be1);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
}
END_TEST

START_TEST(sampling_seeds_differ) {
    luna_seq2seq *model = make_model(be, "luna_tiny", 20, 3);
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    luna_beam_options o;
    sample_opts(&o, 1, 1);
    o.temperature = 1000; /* nearly flat: every token about as likely */
    o.min_len = 6;
    luna_nbest a[4], b[4];
    ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, a, NULL, NULL), LUNA_OK);
    for (uint64_t seed = 2; seed <= 4; seed++) {
        o.seed = seed;
        ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, b, NULL, NULL), LUNA_OK);
        for (int s = 0; s < 4; s++)
            ck_assert_msg(!same_nbest(&a[s], &b[s], false), "seed %d: sentence %d unchanged",
                          (int)seed, s);
        release_all(b, 4);
    }
    /* and the sentences of one run differ from each other (their own draws) */
    ck_assert(!same_nbest(&a[0], &a[3], false));
    release_all(a, 4);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
}
END_TEST

START_TEST(sampling_topk1_and_cold_are_greedy) {
    const int V = 20;
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < 2; p++) {
        luna_seq2seq *model = make_model(be, presets[p], V, 5);
        luna_incremental *inc;
        ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
        luna_beam_options g;
        luna_beam_options_init(&g);
        g.beam = 1;
        g.max_len_b = 12;
        luna_nbest greedy[4], x[4];
        ck_assert_int_eq(luna_generate(inc, &g, SRC, 4, 0, 0, greedy, NULL, NULL), LUNA_OK);
        luna_beam_options o;
        sample_opts(&o, 1, 5);
        o.sampling_topk = 1; /* tokens and scores */
        ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, x, NULL, NULL), LUNA_OK);
        for (int s = 0; s < 4; s++)
            ck_assert(same_nbest(&greedy[s], &x[s], true));
        release_all(x, 4);
        o.sampling_topk = 0; /* the whole vocabulary, nearly all mass on the best token */
        o.temperature = 1e-4;
        ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, x, NULL, NULL), LUNA_OK);
        for (int s = 0; s < 4; s++)
            ck_assert(same_nbest(&greedy[s], &x[s], false));
        release_all(x, 4);
        /* three samples, top-1: three copies of the greedy translation */
        sample_opts(&o, 3, 5);
        o.sampling_topk = 1;
        ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, x, NULL, NULL), LUNA_OK);
        for (int s = 0; s < 4; s++) {
            ck_assert_int_eq(x[s].count, 3);
            for (int h = 0; h < 3; h++) {
                luna_nbest one = {.count = 1, .hyps = &x[s].hyps[h]};
                ck_assert(same_nbest(&greedy[s], &one, true));
            }
        }
        release_all(x, 4);
        /* a top-k above the vocabulary is the whole vocabulary */
        luna_nbest y[4];
        sample_opts(&o, 2, 9);
        ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, x, NULL, NULL), LUNA_OK);
        o.sampling_topk = V + 7;
        ck_assert_int_eq(luna_generate(inc, &o, SRC, 4, 0, 0, y, NULL, NULL), LUNA_OK);
        for (int s = 0; s < 4; s++)
            ck_assert(same_nbest(&x[s], &y[s], true));
        release_all(x, 4);
        release_all(y, 4);
        release_all(greedy, 4);
        luna_incremental_free(inc);
        luna_seq2seq_free(model);
    }
}
END_TEST

/* Σ (count − expected)² / expected */
static double chi_square(const int *count, const double *p, int k, int n) {
    double x2 = 0;
    for (int j = 0; j < k; j++) {
        const double e = p[j] * n;
        x2 += (count[j] - e) * (count[j] - e) / e;
    }
    return x2;
}

START_TEST(sampling_frequencies_host) {
    /* a fixed distribution (best first), a banned token last */
    const double p[6] = {0.4, 0.25, 0.15, 0.1, 0.07, 0.03};
    float lp[7];
    for (int j = 0; j < 6; j++)
        lp[j] = (float)log(p[j]);
    lp[6] = -INFINITY;
    enum { N = 20000 };
    int count[7] = {0};
    for (int i = 0; i < N; i++) {
        const double u = luna_sampling_uniform(42, 0, (uint64_t)i);
        ck_assert(u >= 0.0 && u < 1.0);
        count[luna_sample_index(lp, 7, u)]++;
    }
    ck_assert_int_eq(count[6], 0);
    /* 5 degrees of freedom: P(χ² > 20.5) = 0.001 */
    const double x2 = chi_square(count, p, 6, N);
    fprintf(stderr, "host draw: chi-square %.2f (5 degrees of freedom)\n", x2);
    ck_assert_msg(x2 < 20.5, "chi-square %g", x2);
    /* the extremes of u */
    ck_assert_int_eq(luna_sample_index(lp, 7, 0.0), 0);
    ck_assert_int_eq(luna_sample_index(lp, 7, 0.9999999999), 5);
    const float dead[2] = {-INFINITY, -INFINITY};
    ck_assert_int_eq(luna_sample_index(dead, 2, 0.5), 0);
}
END_TEST

/* Full-forward log-probs of the first target token (after </s>). */
static void first_log_probs(luna_seq2seq *model, const int32_t *src, int slen, double *out) {
    const int V = model->config.vocab_size;
    int32_t prev[1] = {2}, tgt[1] = {4}, len[1] = {slen};
    luna_batch b = {.B = 1,
                    .src_len = slen,
                    .tgt_len = 1,
                    .src_tokens = src,
                    .src_lengths = len,
                    .prev_output_tokens = prev,
                    .target = tgt};
    float *x = malloc(sizeof(float) * V);
    LUNA_CHECK_OK(luna_seq2seq_forward(model, &b, NULL, NULL, x));
    for (int j = 0; j < V; j++)
        out[j] = x[j];
    free(x);
}

START_TEST(sampling_frequencies_model) {
    /* 1000 samples of the first token at temperature 2 against softmax(logits / 2) over the
     * tokens allowed at step 0 (<pad> and, before min_len, </s> are banned) */
    enum { V = 12, N = 1000 };
    const double T = 2.0;
    luna_seq2seq *model = make_model(be, "luna_tiny", V, 8);
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    double x[V], p[V];
    first_log_probs(model, src_tok[1], 2, x);
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < V; j++)
        if (j != 1 && j != 2) mx = fmax(mx, x[j] / T);
    for (int j = 0; j < V; j++)
        z += j != 1 && j != 2 ? exp(x[j] / T - mx) : 0.0;
    double lse_all = 0; /* the tempered log-softmax over all V, for the positional scores */
    for (int j = 0; j < V; j++)
        lse_all += exp(x[j] / T - mx);
    lse_all = mx + log(lse_all);
    for (int j = 0; j < V; j++)
        p[j] = j != 1 && j != 2 ? exp(x[j] / T - mx) / z : 0.0;
    luna_beam_options o;
    sample_opts(&o, N, 2024);
    o.temperature = T;
    o.max_len_b = 1; /* one token, then </s> */
    luna_nbest out;
    ck_assert_int_eq(luna_beam_search(inc, &o, &SRC[1], 1, &out), LUNA_OK);
    ck_assert_int_eq(out.count, N);
    int count[V] = {0};
    for (int h = 0; h < N; h++) {
        const luna_hypothesis *y = &out.hyps[h];
        ck_assert_int_eq(y->len, 2);
        const int t = y->tokens[0];
        ck_assert(t != 1 && t != 2);
        count[t]++;
        ck_assert_msg(fabs(y->positional_scores[0] - (x[t] / T - lse_all)) < 1e-4,
                      "token %d: score %g, want %g", t, y->positional_scores[0],
                      x[t] / T - lse_all);
    }
    /* merge the tokens expected fewer than 5 times into one cell */
    int cc[V] = {0}, k = 0, rest_c = 0;
    double cp[V], rest_p = 0;
    for (int j = 0; j < V; j++) {
        if (j == 1 || j == 2) continue;
        if (p[j] * N < 5) {
            rest_p += p[j], rest_c += count[j];
            continue;
        }
        cp[k] = p[j], cc[k++] = count[j];
    }
    if (rest_p > 0) cp[k] = rest_p, cc[k++] = rest_c;
    ck_assert_int_ge(k, 4);
    /* k − 1 ≤ 9 degrees of freedom: P(χ² > 27.9) = 0.001 for 9, less for fewer */
    const double x2 = chi_square(cc, cp, k, N);
    fprintf(stderr, "model draw: chi-square %.2f over %d cells\n", x2, k);
    ck_assert_msg(x2 < 27.9, "chi-square %g over %d cells", x2, k);
    luna_nbest_release(&out);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
}
END_TEST

START_TEST(bad_options) {
    luna_seq2seq *model = make_model(be, "luna_tiny", 16, 4);
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    luna_nbest out;
    luna_beam_options o;
    const double temps[3] = {0.0, -1.0, INFINITY};
    for (int i = 0; i < 3; i++) {
        sample_opts(&o, 2, 1);
        o.temperature = temps[i];
        ck_assert_int_eq(luna_beam_search(inc, &o, &SRC[0], 1, &out), LUNA_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "temperature"));
    }
    luna_beam_options_init(&o);
    o.no_repeat_ngram_size = -1;
    ck_assert_int_eq(luna_beam_search(inc, &o, &SRC[0], 1, &out), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_incremental_set_temperature(inc, 0.0), LUNA_ERR_INVALID_ARGUMENT);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("decoding_sampling");
    TCase *tc = tcase_create("sampling");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, ngram_bans_known_values);
    tcase_add_test(tc, no_repeat_ngram_blocks_repeats);
    tcase_add_test(tc, sampling_same_seed_same_samples);
    tcase_add_test(tc, sampling_seeds_differ);
    tcase_add_test(tc, sampling_topk1_and_cold_are_greedy);
    tcase_add_test(tc, sampling_frequencies_host);
    tcase_add_test(tc, sampling_frequencies_model);
    tcase_add_test(tc, bad_options);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    if (luna_backend_cpu_create(&be, 2) != LUNA_OK) return 1;
    int rc = luna_test_run(suite());
    luna_backend_free(be);
    return rc;
}
