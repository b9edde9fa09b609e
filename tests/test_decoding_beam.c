/* Beam search (fairseq SequenceGenerator semantics): beam 1 is greedy decoding; on a tiny model
 * with a tiny vocabulary a wide beam finds the exhaustive-search best hypotheses (same length
 * penalty, scores from the independent full-sequence forward); n-best lists are sorted and
 * distinct; batch composition does not change any sentence's output; teacher-forced scoring
 * agrees with the search's scores. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "decoding/beam_search.h"
#include "decoding/search_internal.h"
#include "tests/test_util.h"

static luna_backend *be;

static luna_seq2seq *make_model(const char *preset, int V, uint64_t seed) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, preset), LUNA_OK);
    c.vocab_size = V;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, seed), LUNA_OK);
    return m;
}

/* Full-forward log-probs of the next token after `prefix` (n tokens, without the leading </s>). */
static void next_log_probs(luna_seq2seq *model, const int32_t *src, int slen, const int32_t *prefix,
                           int n, double *out) {
    const int V = model->config.vocab_size, T = n + 1;
    int32_t prev[64], tgt[64], len[1] = {slen};
    prev[0] = 2;
    for (int i = 0; i < n; i++)
        prev[i + 1] = prefix[i];
    for (int i = 0; i < T; i++)
        tgt[i] = 4;
    luna_batch b = {.B = 1,
                    .src_len = slen,
                    .tgt_len = T,
                    .src_tokens = src,
                    .src_lengths = len,
                    .prev_output_tokens = prev,
                    .target = tgt};
    float *logits = malloc(sizeof(float) * T * V);
    ck_assert_int_eq(luna_seq2seq_forward(model, &b, NULL, NULL, logits), LUNA_OK);
    const float *x = logits + (size_t)n * V;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
        mx = fmax(mx, x[j]);
    for (int j = 0; j < V; j++)
        s += exp(x[j] - mx);
    for (int j = 0; j < V; j++)
        out[j] = x[j] - mx - log(s);
    free(logits);
}

static void check_sorted_distinct(const luna_nbest *nb) {
    for (int i = 1; i < nb->count; i++) {
        ck_assert(nb->hyps[i - 1].score >= nb->hyps[i].score);
        for (int j = 0; j < i; j++)
            ck_assert(nb->hyps[i].len != nb->hyps[j].len ||
                      memcmp(nb->hyps[i].tokens, nb->hyps[j].tokens,
                             sizeof(int32_t) * nb->hyps[i].len) != 0);
    }
}

START_TEST(beam1_is_greedy) {
    const int V = 20;
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < 2; p++) {
        luna_seq2seq *model = make_model(presets[p], V, 5);
        luna_incremental *inc;
        ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
        int32_t srcs[3][8] = {{5, 9, 13, 2}, {7, 2}, {4, 4, 8, 19, 11, 6, 2}};
        luna_token_seq seq[3] = {{srcs[0], 4}, {srcs[1], 2}, {srcs[2], 7}};
        luna_beam_options o;
        luna_beam_options_init(&o);
        o.beam = 1;
        o.max_len_b = 10;
        o.min_len = 2;
        luna_nbest out[3];
        ck_assert_int_eq(luna_generate(inc, &o, seq, 3, 0, 0, out, NULL, NULL), LUNA_OK);
        for (int s = 0; s < 3; s++) {
            int32_t hyp[16];
            double total = 0, lp[32];
            int n = 0;
            for (;;) { /* greedy on the full forward: argmax, lowest id on ties */
                next_log_probs(model, srcs[s], seq[s].len, hyp, n, lp);
                lp[1] = -INFINITY;
                if (n < o.min_len) lp[2] = -INFINITY;
                int best = 0;
                for (int j = 1; j < V; j++)
                    if (n >= o.max_len_b ? j == 2 : lp[j] > lp[best]) best = j;
                if (n >= o.max_len_b) best = 2;
                hyp[n++] = best;
                total += lp[best];
                if (best == 2) break;
            }
            ck_assert_int_eq(out[s].count, 1);
            const luna_hypothesis *h = &out[s].hyps[0];
            ck_assert_int_eq(h->len, n);
            ck_assert_mem_eq(h->tokens, hyp, sizeof(int32_t) * n);
            ck_assert_msg(fabs(h->score - total / n) < 1e-5, "score %g vs %g", h->score, total / n);
            luna_nbest_release(&out[s]);
        }
        luna_incremental_free(inc);
        luna_seq2seq_free(model);
    }
}
END_TEST

/* V = 8: non-</s> tokens <s>, <unk>, 4..7 (6), max 3 tokens + </s>: 6 + 36 + 216 hypotheses. */
static void exhaustive(const char *preset, double lenpen) {
    enum { V = 8, MAXT = 3, NB = 10 };
    luna_seq2seq *model = make_model(preset, V, 17);
    int32_t src[5] = {4, 6, 5, 7, 2};
    const int toks[6] = {0, 3, 4, 5, 6, 7};
    /* all hypotheses, scored by the full forward in one batch */
    int H = 0;
    int32_t prev[300 * 4], tgt[300 * 4], srcs[300 * 5], lens[300], hl[300];
    for (int len = 1; len <= MAXT; len++) {
        int count = 1;
        for (int i = 0; i < len; i++)
            count *= 6;
        for (int k = 0; k < count; k++, H++) {
            int x = k;
            for (int t = 0; t < 4; t++)
                tgt[H * 4 + t] = prev[H * 4 + t] = 1;
            prev[H * 4] = 2;
            for (int t = 0; t < len; t++, x /= 6) {
                tgt[H * 4 + t] = toks[x % 6];
                prev[H * 4 + t + 1] = toks[x % 6];
            }
            tgt[H * 4 + len] = 2;
            hl[H] = len + 1;
            memcpy(srcs + H * 5, src, sizeof src);
            lens[H] = 5;
        }
    }
    luna_batch b = {.B = H,
                    .src_len = 5,
                    .tgt_len = 4,
                    .src_tokens = srcs,
                    .src_lengths = lens,
                    .prev_output_tokens = prev,
                    .target = tgt};
    float *logits = malloc(sizeof(float) * H * 4 * V);
    ck_assert_int_eq(luna_seq2seq_forward(model, &b, NULL, NULL, logits), LUNA_OK);
    double score[300];
    int rank[300];
    for (int h = 0; h < H; h++) {
        double tot = 0;
        for (int t = 0; t < hl[h]; t++) {
            const float *x = logits + ((size_t)h * 4 + t) * V;
            double mx = -INFINITY, s = 0;
            for (int j = 0; j < V; j++)
                mx = fmax(mx, x[j]);
            for (int j = 0; j < V; j++)
                s += exp(x[j] - mx);
            tot += x[tgt[h * 4 + t]] - mx - log(s);
        }
        score[h] = tot / pow(hl[h], lenpen);
        rank[h] = h;
    }
    for (int i = 1; i < H; i++) /* sort by score, best first */
        for (int j = i; j > 0 && score[rank[j - 1]] < score[rank[j]]; j--) {
            int t = rank[j];
            rank[j] = rank[j - 1];
            rank[j - 1] = t;
        }
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.beam = 256;
    o.nbest = NB;
    o.lenpen = lenpen;
    o.max_len_b = MAXT;
    luna_token_seq seq = {src, 5};
    luna_nbest out;
    ck_assert_int_eq(luna_beam_search(inc, &o, &seq, 1, &out), LUNA_OK);
    ck_assert_int_eq(out.count, NB);
    check_sorted_distinct(&out);
    for (int i = 0; i < NB; i++) {
        const luna_hypothesis *h = &out.hyps[i];
        int r = rank[i];
        ck_assert_int_eq(h->len, hl[r]);
        ck_assert_mem_eq(h->tokens, tgt + r * 4, sizeof(int32_t) * hl[r]);
        ck_assert_msg(fabs(h->score - score[r]) < 1e-5, "%g vs %g", h->score, score[r]);
    }
    printf("exhaustive (%s, lenpen %g, %d hypotheses): beam 256 top-%d = exhaustive top-%d, best "
           "score %.6f (len %d)\n",
           preset, lenpen, H, NB, NB, out.hyps[0].score, out.hyps[0].len);
    luna_nbest_release(&out);
    free(logits);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
}

START_TEST(wide_beam_is_exhaustive) {
    exhaustive("luna_tiny", 0.6);
    exhaustive("luna_tiny", 2.0);
    exhaustive("luna_tiny", 0.0);
    exhaustive("transformer_tiny", 1.0);
}
END_TEST

/* Every sentence's n-best list is the same whatever batch it is decoded in. */
START_TEST(batch_composition) {
    const int V = 24, N = 7;
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < 2; p++) {
        luna_seq2seq *model = make_model(presets[p], V, 9);
        luna_incremental *inc;
        ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
        int32_t toks[7][16];
        luna_token_seq seq[7];
        const int lens[7] = {5, 2, 11, 7, 3, 14, 7};
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 2);
        for (int s = 0; s < N; s++) {
            for (int t = 0; t < lens[s] - 1; t++)
                toks[s][t] = 4 + (int)luna_test_uniform(&rng, 0, V - 4.01f);
            toks[s][lens[s] - 1] = 2;
            seq[s] = (luna_token_seq){toks[s], lens[s]};
        }
        luna_beam_options o;
        luna_beam_options_init(&o);
        o.beam = 4;
        o.nbest = 3;
        o.lenpen = 0.6;
        o.max_len_a = 1.2;
        o.max_len_b = 3;
        luna_nbest ref[7], out[7];
        for (int s = 0; s < N; s++) /* each alone */
            ck_assert_int_eq(luna_beam_search(inc, &o, &seq[s], 1, &ref[s]), LUNA_OK);
        const int settings[4][2] = {{0, 0}, {0, 3}, {30, 0}, {60, 2}}; /* max_tokens, batch_size */
        double max_diff = 0;
        for (int k = 0; k < 4; k++) {
            ck_assert_int_eq(
                luna_generate(inc, &o, seq, N, settings[k][0], settings[k][1], out, NULL, NULL),
                LUNA_OK);
            for (int s = 0; s < N; s++) {
                ck_assert_int_eq(out[s].count, ref[s].count);
                check_sorted_distinct(&out[s]);
                for (int i = 0; i < out[s].count; i++) {
                    const luna_hypothesis *a = &out[s].hyps[i], *r = &ref[s].hyps[i];
                    ck_assert_int_eq(a->len, r->len);
                    ck_assert_mem_eq(a->tokens, r->tokens, sizeof(int32_t) * a->len);
                    max_diff = fmax(max_diff, fabs(a->score - r->score));
                }
                luna_nbest_release(&out[s]);
            }
        }
        printf("batch composition (%s): identical hypotheses, max score difference %.3g\n",
               presets[p], max_diff);
        ck_assert(max_diff < 1e-5);

        /* teacher-forced scores of the best hypotheses = the search's positional scores */
        luna_token_seq tgt[7];
        float *pos[7];
        for (int s = 0; s < N; s++)
            tgt[s] = (luna_token_seq){ref[s].hyps[0].tokens, ref[s].hyps[0].len};
        ck_assert_int_eq(luna_score_targets(inc, seq, tgt, N, 40, 0, pos), LUNA_OK);
        for (int s = 0; s < N; s++) {
            for (int t = 0; t < tgt[s].len; t++)
                ck_assert(fabs(pos[s][t] - ref[s].hyps[0].positional_scores[t]) < 1e-5);
            free(pos[s]);
            luna_nbest_release(&ref[s]);
        }
        luna_incremental_free(inc);
        luna_seq2seq_free(model);
    }
}
END_TEST

/* In-flight batching (luna_generate): with a pool smaller than the input, sentences join while
 * others are mid-search, at other positions, with the options that act per row (n-gram bans,
 * min_len, unkpen, sampling draws), with the selection's summary read every step or every 3;
 * each sentence's hypotheses are those of its search alone
 * (luna_beam_search, one batch of one): the same tokens, scores within 1e-5 (a sentence's source
 * is padded to another length, which can move the last bits of OpenBLAS's sums). */
START_TEST(inflight_equals_alone) {
    const int V = 24, N = 9;
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < 2; p++) {
        luna_seq2seq *model = make_model(presets[p], V, 11);
        luna_incremental *inc;
        ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
        int32_t toks[9][16];
        luna_token_seq seq[9];
        const int lens[9] = {3, 9, 2, 12, 5, 5, 14, 4, 8};
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 7);
        for (int s = 0; s < N; s++) {
            for (int t = 0; t < lens[s] - 1; t++)
                toks[s][t] = 3 + (int)luna_test_uniform(&rng, 0, V - 3.01f);
            toks[s][lens[s] - 1] = 2;
            seq[s] = (luna_token_seq){toks[s], lens[s]};
        }
        for (int variant = 0; variant < 3; variant++) {
            luna_beam_options o;
            luna_beam_options_init(&o);
            o.beam = 5; /* ≥ 4: OpenBLAS's GEMM results depend on the row count from 4 on */
            o.nbest = 2;
            o.lenpen = 0.6;
            o.max_len_a = 1.5;
            o.max_len_b = 2;
            o.min_len = variant == 1 ? 4 : 1;
            o.no_repeat_ngram_size = variant == 1 ? 2 : 0;
            o.unkpen = variant == 1 ? 0.5 : 0;
            o.sampling = variant == 2;
            o.sampling_topk = variant == 2 ? 5 : 0;
            luna_nbest ref[9], out[9];
            for (int s = 0; s < N; s++) {
                if (o.sampling) { /* the draws are keyed by the input index: one at a time */
                    luna_nbest tmp[9];
                    ck_assert_int_eq(luna_generate(inc, &o, seq, N, 0, 1, tmp, NULL, NULL),
                                     LUNA_OK);
                    ref[s] = tmp[s];
                    for (int i = 0; i < N; i++)
                        if (i != s) luna_nbest_release(&tmp[i]);
                } else {
                    ck_assert_int_eq(luna_beam_search(inc, &o, &seq[s], 1, &ref[s]), LUNA_OK);
                }
            }
            const int settings[3][2] = {{0, 2}, {0, 4}, {25, 0}}; /* max_tokens, batch_size */
            /* each setting also with the summary read every 3 steps (sentences finished in
             * between idle in the pool; Luna's state and the transformer's cache-slot table are
             * reordered from the backend's rows) */
            for (int k = 0; k < 6; k++) {
                o.sync_interval = k < 3 ? 0 : 3;
                ck_assert_int_eq(luna_generate(inc, &o, seq, N, settings[k % 3][0],
                                               settings[k % 3][1], out, NULL, NULL),
                                 LUNA_OK);
                for (int s = 0; s < N; s++) {
                    ck_assert_int_eq(out[s].count, ref[s].count);
                    for (int i = 0; i < out[s].count; i++) {
                        const luna_hypothesis *a = &out[s].hyps[i], *r = &ref[s].hyps[i];
                        ck_assert_msg(a->len == r->len &&
                                          !memcmp(a->tokens, r->tokens, sizeof(int32_t) * a->len),
                                      "%s, variant %d, setting %d: sentence %d hypothesis %d "
                                      "differs from its search alone",
                                      presets[p], variant, k, s, i);
                        /* padded to other lengths, OpenBLAS's sums may round differently */
                        ck_assert_msg(fabs(a->score - r->score) < 1e-5,
                                      "%s v%d s%d: %.17g vs %.17g", presets[p], variant, k,
                                      a->score, r->score);
                        for (int t = 0; t < a->len; t++)
                            ck_assert(fabs(a->positional_scores[t] - r->positional_scores[t]) <
                                      1e-5);
                    }
                    luna_nbest_release(&out[s]);
                }
            }
            for (int s = 0; s < N; s++)
                luna_nbest_release(&ref[s]);
        }
        luna_incremental_free(inc);
        luna_seq2seq_free(model);
    }
}
END_TEST

START_TEST(options_and_limits) {
    luna_seq2seq *model = make_model("luna_tiny", 16, 4);
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    int32_t src[3] = {5, 6, 2};
    luna_token_seq seq = {src, 3};
    luna_nbest out;
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.nbest = 6; /* > beam */
    ck_assert_int_eq(luna_beam_search(inc, &o, &seq, 1, &out), LUNA_ERR_INVALID_ARGUMENT);
    /* max_len 0: only the empty hypothesis */
    luna_beam_options_init(&o);
    o.max_len_b = 0;
    ck_assert_int_eq(luna_beam_search(inc, &o, &seq, 1, &out), LUNA_OK);
    ck_assert_int_eq(out.count, 1);
    ck_assert_int_eq(out.hyps[0].len, 1);
    luna_nbest_release(&out);
    /* min_len = max_len: every hypothesis has exactly max_len tokens + </s>; huge unkpen bans <unk>
     */
    o.max_len_b = 4;
    o.min_len = 4;
    o.unkpen = 1e30;
    o.nbest = 5;
    ck_assert_int_eq(luna_beam_search(inc, &o, &seq, 1, &out), LUNA_OK);
    ck_assert_int_eq(out.count, 5);
    for (int i = 0; i < out.count; i++) {
        ck_assert_int_eq(out.hyps[i].len, 5);
        for (int t = 0; t < 5; t++)
            ck_assert_int_ne(out.hyps[i].tokens[t], 3);
    }
    check_sorted_distinct(&out);
    luna_nbest_release(&out);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
}
END_TEST

/* Searches run concurrently (translate workers, luna-serve's translators): the order by source
 * length that every search starts with is each caller's own, whatever the other threads sort. */
enum { SORT_N = 3000, SORT_ROUNDS = 40 };
typedef struct {
    luna_token_seq src[SORT_N];
    int bad;
} sorter;

static void *sort_many(void *arg) {
    sorter *z = arg;
    for (int r = 0; r < SORT_ROUNDS; r++) {
        int *order = NULL;
        if (luna_search_sorted_order(z->src, SORT_N, &order) != LUNA_OK) {
            z->bad++;
            continue;
        }
        for (int i = 1; i < SORT_N; i++) {
            const luna_token_seq *a = &z->src[order[i - 1]], *b = &z->src[order[i]];
            z->bad += a->len > b->len || (a->len == b->len && order[i - 1] > order[i]);
        }
        free(order);
    }
    return NULL;
}

START_TEST(sorted_order_concurrent) {
    static sorter z[2];
    for (int i = 0; i < SORT_N; i++) { /* two different length patterns */
        z[0].src[i] = (luna_token_seq){NULL, 1 + (i * 7919) % 97};
        z[1].src[i] = (luna_token_seq){NULL, 1 + (SORT_N - i) % 13};
    }
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, sort_many, &z[1]), 0);
    sort_many(&z[0]);
    pthread_join(th, NULL);
    ck_assert_msg(z[0].bad == 0 && z[1].bad == 0, "misordered: %d and %d pairs", z[0].bad,
                  z[1].bad);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("decoding_beam");
    TCase *tc = tcase_create("beam");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, beam1_is_greedy);
    tcase_add_test(tc, wide_beam_is_exhaustive);
    tcase_add_test(tc, batch_composition);
    tcase_add_test(tc, inflight_equals_alone);
    tcase_add_test(tc, options_and_limits);
    tcase_add_test(tc, sorted_order_concurrent);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    if (luna_backend_cpu_create(&be, 2) != LUNA_OK) return 1;
    int rc = luna_test_run(suite());
    luna_backend_free(be);
    return rc;
}
