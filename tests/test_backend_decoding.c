/* Beam search in flight (luna_generate) on the backend under test (LUNA_TEST_BACKEND) against the
 * CPU backend: luna_tiny and transformer_tiny with the same seeded parameters, fp32, 7 sentences
 * through a pool of 3 (sentences join mid-search, at other positions), beam 4, 2-best, plain and
 * with n-gram bans, --min-len and --unkpen, with the selection read back at the backend's default
 * interval (on a device every 8 steps: the selection, Luna's decoder state and the transformer's
 * cache-slot table stay on the device in between, and the finished sentences' records are
 * gathered there for one copy) and every 3 steps. Every hypothesis has the CPU's tokens; scores
 * within 1e-5 (the backends' sums round differently in the last bits). With LUNA_TEST_BACKEND=cpu
 * both sides are the CPU (2 threads against 1), which must agree to the bit. On a device with
 * graphs, Luna's pool steps replayed as graphs give the bits of the same steps launched one by one
 * (graphs_change_nothing). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "decoding/beam_search.h"
#include "decoding/incremental.h"
#include "model/seq2seq.h"
#include "tests/backend_harness.h"
#include "tests/test_util.h"

enum { V = 37, NSENT = 7 };

static luna_seq2seq *make_model(luna_backend *be, const char *preset) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, preset), LUNA_OK);
    c.vocab_size = V;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, 5), LUNA_OK);
    return m;
}

/* graphs: the incremental decoder's step graphs on (where the backend has them) or off; *replays
 * (when not NULL): how many steps were replayed, after checking no capture failed. */
static void generate_with(luna_seq2seq *m, const luna_beam_options *o, const luna_token_seq *src,
                          luna_nbest *out, bool graphs, int64_t *replays) {
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, m), LUNA_OK);
    ck_assert_int_eq(luna_incremental_set_graphs(inc, graphs), LUNA_OK);
    ck_assert_msg(luna_generate(inc, o, src, NSENT, 0, 3, out, NULL, NULL) == LUNA_OK, "%s",
                  luna_error_message());
    int64_t r, c, failed;
    luna_incremental_graph_counts(inc, &r, &c, &failed);
    ck_assert_int_eq(failed, 0);
    if (!graphs) ck_assert_int_eq(r + c, 0);
    if (replays) *replays = r;
    luna_incremental_free(inc);
}

static void generate(luna_seq2seq *m, const luna_beam_options *o, const luna_token_seq *src,
                     luna_nbest *out) {
    generate_with(m, o, src, out, true, NULL);
}

static void make_sources(int32_t toks[NSENT][12], luna_token_seq *src);

/* Beam 4, 2-best, at most 1.2·len + 3 tokens; bans: --min-len 3, n-gram bans of 2, --unkpen 0.5;
 * sync_interval 0: the backend's default. */
static luna_beam_options search_options(bool bans, int sync_interval) {
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.beam = 4;
    o.nbest = 2;
    o.max_len_a = 1.2;
    o.max_len_b = 3;
    o.min_len = bans ? 3 : 1;
    o.no_repeat_ngram_size = bans ? 2 : 0;
    o.unkpen = bans ? 0.5 : 0;
    o.sync_interval = sync_interval;
    return o;
}

START_TEST(generate_matches_cpu) {
    luna_backend *dev = lh_backend(2), *cpu = lh_reference();
    const bool exact = dev->device == LUNA_DEVICE_CPU;
    int32_t toks[NSENT][12];
    luna_token_seq src[NSENT];
    make_sources(toks, src);
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < 2; p++) {
        luna_seq2seq *md = make_model(dev, presets[p]), *mc = make_model(cpu, presets[p]);
        for (int variant = 0; variant < 4; variant++) {
            const luna_beam_options o = search_options(variant % 2, variant < 2 ? 0 : 3);
            luna_nbest ref[NSENT], got[NSENT];
            generate(mc, &o, src, ref);
            generate(md, &o, src, got);
            for (int s = 0; s < NSENT; s++) {
                ck_assert_int_eq(got[s].count, ref[s].count);
                for (int i = 0; i < got[s].count; i++) {
                    const luna_hypothesis *a = &got[s].hyps[i], *r = &ref[s].hyps[i];
                    ck_assert_msg(a->len == r->len &&
                                      !memcmp(a->tokens, r->tokens, sizeof(int32_t) * a->len),
                                  "%s variant %d: sentence %d hypothesis %d: not the CPU's tokens",
                                  presets[p], variant, s, i);
                    ck_assert_msg(exact ? a->score == r->score : fabs(a->score - r->score) < 1e-5,
                                  "%s variant %d: sentence %d hypothesis %d: score %.9g, CPU %.9g",
                                  presets[p], variant, s, i, a->score, r->score);
                }
                luna_nbest_release(&got[s]);
                luna_nbest_release(&ref[s]);
            }
        }
        luna_seq2seq_free(md);
        luna_seq2seq_free(mc);
    }
    luna_backend_free(dev);
    luna_backend_free(cpu);
}
END_TEST

/* three of 5 tokens join the pool together and reach their length limit together: their
 * records are read back in one gathered copy */
static void make_sources(int32_t toks[NSENT][12], luna_token_seq *src) {
    const int lens[NSENT] = {5, 9, 5, 12, 5, 6, 8};
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 21);
    for (int s = 0; s < NSENT; s++) {
        for (int t = 0; t < lens[s] - 1; t++)
            toks[s][t] = 4 + (int)luna_test_uniform(&rng, 0, V - 4.01f);
        toks[s][lens[s] - 1] = 2;
        src[s] = (luna_token_seq){toks[s], lens[s]};
    }
}

/* A device replays a pool's steps as graphs (core/graph_cache.h), Luna's and the
 * transformer's (whose score rows then span its longest position rounded up): the same
 * hypotheses and scores, bit for bit, as the same steps launched one kernel at a time, and steps
 * replayed; with n-gram bans and --min-len (the candidates per row change as they grow) and
 * reading back every 3 steps. */
START_TEST(graphs_change_nothing) {
    luna_backend *dev = lh_backend(2);
    if (!luna_graphs_available(dev)) {
        printf("graphs: the %s backend has none (nothing to compare)\n", dev->name);
        luna_backend_free(dev);
        return;
    }
    int32_t toks[NSENT][12];
    luna_token_seq src[NSENT];
    make_sources(toks, src);
    for (int v = 0; v < 4; v++) {
        const char *preset = v < 2 ? "luna_tiny" : "transformer_tiny";
        const int variant = v % 2;
        luna_seq2seq *m = make_model(dev, preset);
        const luna_beam_options o = search_options(variant, variant ? 3 : 0);
        luna_nbest eager[NSENT], replayed[NSENT];
        int64_t replays = 0;
        generate_with(m, &o, src, eager, false, NULL);
        generate_with(m, &o, src, replayed, true, &replays);
        printf("graphs, %s variant %d: %lld steps replayed\n", preset, variant, (long long)replays);
        /* Luna: one shape between readbacks; the transformer's alternates two cache-slot tables
         * and steps its longest position by 16, so fewer of its short searches' steps repeat */
        ck_assert_int_gt(replays, v < 2 ? 10 : 3);
        for (int s = 0; s < NSENT; s++) {
            ck_assert_int_eq(replayed[s].count, eager[s].count);
            for (int i = 0; i < eager[s].count; i++) {
                const luna_hypothesis *a = &replayed[s].hyps[i], *r = &eager[s].hyps[i];
                ck_assert_msg(a->len == r->len && a->score == r->score &&
                                  !memcmp(a->tokens, r->tokens, sizeof(int32_t) * a->len),
                              "%s variant %d: sentence %d hypothesis %d: replayed %.9g (%d "
                              "tokens), eager %.9g (%d)",
                              preset, variant, s, i, a->score, a->len, r->score, r->len);
            }
            luna_nbest_release(&eager[s]);
            luna_nbest_release(&replayed[s]);
        }
        luna_seq2seq_free(m);
    }
    luna_backend_free(dev);
}
END_TEST

static Suite *decoding_suite(void) {
    Suite *s = suite_create("backend_decoding");
    TCase *tc = tcase_create("generate");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, generate_matches_cpu);
    tcase_add_test(tc, graphs_change_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(decoding_suite()); }
