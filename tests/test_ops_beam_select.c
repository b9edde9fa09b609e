/* Tests of the beam_select op (core/backend.h, "Decoding"; core/beam_select.h): one step of the
 * beam search's selection for a pool of sentences, against a host reference written from the
 * search's definition (decoding/beam_search.h) with a plain sort instead of the op's heap: every
 * candidate of a sentence's rows (each row's list with its n-gram bans and </s> before min_len
 * dropped, kb kept), ordered by score, ties by arrival; </s> among the first `beam` (not ignored)
 * finalized; the next beam from the first `beam` candidates that did not end; a finished
 * sentence (now or at an earlier step) keeps its rows with </s>. Pools mix sentences at step 0
 * with one row or `beam` rows, sentences forced to end (NaN picked log-probs among them),
 * sentences finished at an earlier step, ignored places, tied scores, −inf candidates and lists
 * that the bans leave short; slots are a permutation with unused ones, their hypotheses random
 * trees of back-pointers (the reference walks them as paths). The op's every output (done flags,
 * parent rows and tokens, each new hypothesis's next position (token, score, back-pointer), the
 * ignore flags, the finished records with their log-probs, and what it must leave untouched) must
 * equal the reference byte for byte on the backend under test (LUNA_TEST_BACKEND), and the CPU
 * reference's (EXACT). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/beam_select.h"
#include "tests/backend_harness.h"

enum { EOS = 2, UNK = 3 };

/* A pool and its step's inputs, in host memory. */
typedef struct {
    int S, H, beam, kb, k_list, cap, min_len, ngram, R;
    int rows; /* slot rows H·beam: histories are position-major, position i of row q at i·rows + q
               */
    int32_t *sent;                 /* row_first [S + 1], step [S], max_len [S], slot [S] */
    int32_t *done;                 /* [S] finished at an earlier step */
    float *lists;                  /* top_lp [R·k_list], then picked [R] */
    int32_t *top_tok, *tok, *back; /* back: the parent's slot row at the previous position */
    double *score;
    uint8_t *ignore;
    size_t fin_bytes; /* per slot */
} pool;

/* The op's outputs in host memory: the slots' positions (updated in place: initially the pool's),
 * and the rest (initially a fill the op must leave where it does not write). */
typedef struct {
    int32_t *tok, *back, *summary;
    double *score;
    uint8_t *ignore_out;
    unsigned char *finished;
} outputs;

static size_t words(size_t bytes) { return (bytes + 3) / 4; }

static void outputs_init(const pool *p, outputs *o) {
    const size_t rows = (size_t)p->H * p->beam, n = rows * p->cap;
    o->tok = malloc(sizeof(int32_t) * n);
    o->back = malloc(sizeof(int32_t) * n);
    o->score = malloc(sizeof(double) * n);
    o->ignore_out = malloc(4 * words(rows));
    o->summary = malloc(sizeof(int32_t) * (size_t)p->S * (1 + 2 * p->beam));
    o->finished = malloc(p->fin_bytes * (size_t)p->H);
    ck_assert(o->tok && o->back && o->score && o->ignore_out && o->summary && o->finished);
    memcpy(o->tok, p->tok, sizeof(int32_t) * n);
    memcpy(o->back, p->back, sizeof(int32_t) * n);
    memcpy(o->score, p->score, sizeof(double) * n);
    memset(o->ignore_out, 0x5a, 4 * words(rows));
    for (size_t i = 0; i < (size_t)p->S * (1 + 2 * p->beam); i++)
        o->summary[i] = i < (size_t)p->S ? p->done[i] : -9;
    memset(o->finished, 0xa5, p->fin_bytes * (size_t)p->H);
    for (int h = 0; h < p->H; h++) /* hypotheses finished before this step: 0 to beam */
        *luna_beam_finished_count(o->finished + (size_t)h * p->fin_bytes) = h % (p->beam + 1);
}

static void outputs_free(outputs *o) {
    free(o->tok), free(o->back), free(o->score), free(o->ignore_out), free(o->summary);
    free(o->finished);
}

/* ---- the reference -------------------------------------------------------------------------- */
typedef struct {
    double score;
    int beam, token, seq;
} ref_cand;

static int by_score_then_arrival(const void *x, const void *y) {
    const ref_cand *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

/* Position i of slot row q of a history. */
#define AT(p, i, q) ((size_t)(i) * (size_t)(p)->rows + (size_t)(q))

/* Slot row q's hypothesis at step t, back from position t: tokens h[0..t] (h[0] the BOS) and
 * cumulative scores sc[0..t) (sc[i] with the token at position i + 1). */
static void ref_path(const pool *p, int t, int q, int32_t *h, double *sc) {
    h[0] = EOS;
    for (int i = t; i >= 1; i--) {
        h[i] = p->tok[AT(p, i, q)];
        sc[i - 1] = p->score[AT(p, i - 1, q)];
        q = p->back[AT(p, i, q)];
    }
}

/* Is w banned for hypothesis h[0..len) (h[0] the BOS)? The n-grams of positions 1..len−1: w is
 * banned when the last n − 1 tokens followed by w already occur. */
static bool ref_banned(const int32_t *h, int len, int n, int w) {
    if (n <= 0) return false;
    for (int i = 1; i + n - 1 < len; i++) {
        bool same = h[i + n - 1] == w;
        for (int m = 0; m < n - 1 && same; m++)
            same = h[i + m] == h[len - n + 1 + m];
        if (same) return true;
    }
    return false;
}

/* A finished sentence's next rows: its own, </s> their token. */
static void ref_finished(const pool *p, outputs *o, int s) {
    const int beam = p->beam, S = p->S, r0 = p->sent[s], rows = p->sent[s + 1] - r0;
    o->summary[s] = 1;
    for (int i = 0; i < beam; i++) {
        o->summary[S + s * beam + i] = r0 + (i < rows ? i : rows - 1);
        o->summary[S + S * beam + s * beam + i] = EOS;
    }
}

static void ref_step(const pool *p, outputs *o) {
    const int beam = p->beam, nc = 2 * beam, kb = p->kb, S = p->S;
    const int32_t *row_first = p->sent, *step = p->sent + S + 1, *max_len = step + S,
                  *slot = max_len + S;
    const float *picked = p->lists + (size_t)p->R * p->k_list;
    ref_cand *c = malloc(sizeof(ref_cand) * (size_t)(beam * kb + nc));
    int32_t *hyp = malloc(sizeof(int32_t) * (size_t)(p->cap + 1));
    double *hsc = malloc(sizeof(double) * (size_t)(p->cap + 1));
    ck_assert(c && hyp && hsc);
    for (int s = 0; s < S; s++) {
        if (p->done[s]) { /* finished before: selects nothing */
            ref_finished(p, o, s);
            continue;
        }
        const int t = step[s], h = slot[s], r0 = row_first[s];
        const bool forced = t >= max_len[s];
        int n = 0;
        for (int k = 0; k < (t == 0 ? 1 : beam); k++) {
            const int q = h * beam + k, r = r0 + k;
            const double base = t ? p->score[AT(p, t - 1, q)] : 0.0;
            ref_path(p, t, q, hyp, hsc);
            if (forced) {
                const float lp = isnan(picked[r]) ? -INFINITY : picked[r];
                c[n++] = (ref_cand){base + lp, k, EOS, k};
                continue;
            }
            int w = 0;
            for (int j = 0; j < p->k_list && w < kb; j++) {
                const int tk = p->top_tok[(size_t)r * p->k_list + j];
                if ((tk == EOS && t < p->min_len) ||
                    (t > 0 && ref_banned(hyp, t + 1, p->ngram, tk)))
                    continue;
                c[n++] = (ref_cand){base + p->lists[(size_t)r * p->k_list + j], k, tk, k * kb + w};
                w++;
            }
            for (; w < kb; w++)
                c[n++] = (ref_cand){-INFINITY, k, UNK, k * kb + w};
        }
        qsort(c, (size_t)n, sizeof *c, by_score_then_arrival);
        for (; n < nc; n++)
            c[n] = (ref_cand){-INFINITY, 0, UNK, 0};
        unsigned char *rec = o->finished + (size_t)h * p->fin_bytes;
        int32_t *count = luna_beam_finished_count(rec);
        if (t == 0) *count = 0;
        bool any = false, ended[64];
        ck_assert_int_le(nc, 64);
        for (int j = 0; j < nc; j++) {
            const bool ign = j < beam && t > 0 && p->ignore[h * beam + j];
            ended[j] = (c[j].token == EOS && c[j].score != -INFINITY) || ign;
            if (j >= beam || !(c[j].token == EOS && c[j].score != -INFINITY) || ign) continue;
            any = true;
            if (*count == beam) continue;
            const int f = (*count)++, parent = h * beam + c[j].beam;
            luna_beam_finished_eos(rec)[f] = c[j].score;
            luna_beam_finished_steps(rec, beam)[f] = t;
            ref_path(p, t, parent, hyp, hsc);
            for (int i = 0; i <= t; i++) { /* log-probs: the next token's, </s>'s last */
                luna_beam_finished_tokens_at(rec, beam, i)[f] = hyp[i];
                luna_beam_finished_log_probs_at(rec, beam, i)[f] =
                    (float)((i < t ? hsc[i] : c[j].score) - (i ? hsc[i - 1] : 0.0));
            }
        }
        if (forced || (any && *count == beam)) {
            ref_finished(p, o, s);
            continue;
        }
        int placed = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < nc && placed < beam; j++) {
                if (ended[j] != (pass == 1)) continue;
                const int i = placed++, nr = h * beam + i, parent = h * beam + c[j].beam;
                o->summary[S + s * beam + i] = r0 + c[j].beam;
                o->summary[S + S * beam + s * beam + i] = c[j].token;
                o->ignore_out[nr] = pass == 1;
                o->tok[AT(p, t + 1, nr)] = c[j].token;
                o->score[AT(p, t, nr)] = c[j].score;
                o->back[AT(p, t + 1, nr)] = parent;
            }
    }
    free(c), free(hyp), free(hsc);
}

/* ---- pools ---------------------------------------------------------------------------------- */
static float rnd(luna_test_rng *g) { return luna_test_uniform(g, 0, 1); }
static int pick_int(luna_test_rng *g, int n) { return (int)(luna_test_uniform(g, 0, 1) * n) % n; }

/* A random pool: S sentences of `beam` hypotheses over a vocabulary of V tokens (few, so that
 * n-grams repeat and lists tie). */
static void pool_make(pool *p, luna_test_rng *g, int S, int beam, int V, int ngram, int min_len) {
    memset(p, 0, sizeof *p);
    p->S = S, p->H = S + 3, p->beam = beam, p->cap = 14, p->ngram = ngram, p->min_len = min_len;
    p->rows = p->H * beam;
    p->kb = 2 * beam < V ? 2 * beam : V;
    p->sent = malloc(sizeof(int32_t) * (size_t)(4 * S + 1));
    p->done = malloc(sizeof(int32_t) * (size_t)S);
    int32_t *row_first = p->sent, *step = p->sent + S + 1, *max_len = step + S, *slot = max_len + S;
    int most_bans = 0;
    row_first[0] = 0;
    for (int s = 0; s < S; s++) {
        step[s] = pick_int(g, 4) == 0 ? 0 : pick_int(g, p->cap - 2);
        const bool one_row = step[s] == 0 && pick_int(g, 2) == 0;
        row_first[s + 1] = row_first[s] + (one_row ? 1 : beam);
        max_len[s] = step[s] + pick_int(g, 5) - 1; /* some forced to end */
        p->done[s] = pick_int(g, 6) == 0;          /* some finished at an earlier step */
        const int bans =
            (ngram > 0 && step[s] + 1 - ngram > 0 ? step[s] + 1 - ngram : 0) + (step[s] < min_len);
        most_bans = bans > most_bans ? bans : most_bans;
    }
    for (int s = 0; s < S; s++) /* distinct slots in a shuffled order, some unused */
        slot[s] = s + 2;
    for (int s = S - 1; s > 0; s--) {
        const int u = pick_int(g, s + 1);
        const int32_t x = slot[s];
        slot[s] = slot[u], slot[u] = x;
    }
    p->R = row_first[S];
    p->k_list = p->kb + most_bans < V ? p->kb + most_bans : V;
    const size_t rows = (size_t)p->H * beam;
    p->tok = malloc(sizeof(int32_t) * rows * p->cap);
    p->back = malloc(sizeof(int32_t) * rows * p->cap);
    p->score = malloc(sizeof(double) * rows * p->cap);
    p->ignore = calloc(4 * words(rows), 1);
    p->lists = malloc(sizeof(float) * ((size_t)p->R * p->k_list + p->R));
    p->top_tok = malloc(sizeof(int32_t) * (size_t)p->R * p->k_list);
    p->fin_bytes = luna_beam_finished_bytes(beam, p->cap);
    ck_assert(p->sent && p->tok && p->back && p->score && p->ignore && p->lists && p->top_tok);
    /* each position's rows: a token, a parent among the slot's rows at the position before, and
     * a cumulative score below the parent's (steps of 0.5 repeat: tied sums) */
    for (int i = 0; i < p->cap; i++)
        for (size_t q = 0; q < rows; q++) {
            const int parent = (int)(q / beam) * beam + pick_int(g, beam);
            p->tok[AT(p, i, q)] = i ? 4 + pick_int(g, V - 4 > 3 ? 3 : V - 4) : EOS;
            p->back[AT(p, i, q)] = parent;
            const double before = i ? p->score[AT(p, i - 1, parent)] : 0.0;
            p->score[AT(p, i, q)] = before - (pick_int(g, 3) == 0 ? 0.5 : rnd(g));
        }
    for (size_t q = 0; q < rows; q++)
        p->ignore[q] = pick_int(g, 4) == 0;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)V);
    ck_assert_ptr_nonnull(perm);
    for (int r = 0; r < p->R; r++) {
        for (int v = 0; v < V; v++)
            perm[v] = v;
        for (int v = V - 1; v > 0; v--) { /* a row's tokens: distinct, </s> often near the top */
            const int u = pick_int(g, v + 1);
            const int32_t x = perm[v];
            perm[v] = perm[u], perm[u] = x;
        }
        if (pick_int(g, 2) == 0)
            for (int v = 0; v < V; v++)
                if (perm[v] == EOS) perm[v] = perm[0], perm[0] = EOS;
        float lp = -rnd(g);
        for (int j = 0; j < p->k_list; j++) {
            if (j > 0 && pick_int(g, 3) != 0) lp -= rnd(g); /* else a tie */
            const bool dead = j > 0 && pick_int(g, 9) == 0;
            p->lists[(size_t)r * p->k_list + j] = dead ? -INFINITY : lp;
            if (dead) lp = -INFINITY;
            p->top_tok[(size_t)r * p->k_list + j] = perm[j];
        }
        const float pk = -rnd(g) * 3;
        p->lists[(size_t)p->R * p->k_list + r] = pick_int(g, 5) == 0 ? NAN : pk;
    }
    free(perm);
}

static void pool_free(pool *p) {
    free(p->sent), free(p->done), free(p->lists), free(p->top_tok), free(p->tok), free(p->back);
    free(p->score);
    free(p->ignore);
}

/* d: lists, top_tok, sent, tok, score, back, ignore, ignore_out, summary, finished, work */
static luna_status run_select(luna_backend *be, void *const *d, const void *args) {
    const pool *p = args;
    const int32_t *sent = d[2];
    luna_beam_select_args a = {.S = p->S,
                               .beam = p->beam,
                               .kb = p->kb,
                               .k_list = p->k_list,
                               .cap = p->cap,
                               .rows = p->rows,
                               .min_len = p->min_len,
                               .ngram = p->ngram,
                               .eos = EOS,
                               .unk = UNK,
                               .top_lp = d[0],
                               .top_tok = d[1],
                               .picked = (const float *)d[0] + (size_t)p->R * p->k_list,
                               .row_first = sent,
                               .step = sent + p->S + 1,
                               .max_len = sent + 2 * p->S + 1,
                               .slot = sent + 3 * p->S + 1,
                               .tok = d[3],
                               .score = d[4],
                               .back = d[5],
                               .ignore = d[6],
                               .ignore_out = d[7],
                               .summary = d[8],
                               .finished = d[9],
                               .work = d[10]};
    return be->ops->beam_select(be, &a);
}

static void buffers(const pool *p, const outputs *o, lh_buf *b) {
    const size_t rows = (size_t)p->H * p->beam, n = rows * p->cap;
    b[0] = (lh_buf){p->lists, (size_t)p->R * p->k_list + p->R, LH_F32, LH_IN};
    b[1] = (lh_buf){p->top_tok, (size_t)p->R * p->k_list, LH_I32, LH_IN};
    b[2] = (lh_buf){p->sent, (size_t)(4 * p->S + 1), LH_I32, LH_IN};
    b[3] = (lh_buf){o->tok, n, LH_I32, LH_OUT};
    b[4] = (lh_buf){o->score, 2 * n, LH_I32, LH_OUT};
    b[5] = (lh_buf){o->back, n, LH_I32, LH_OUT};
    b[6] = (lh_buf){p->ignore, words(rows), LH_I32, LH_IN};
    b[7] = (lh_buf){o->ignore_out, words(rows), LH_I32, LH_OUT};
    b[8] = (lh_buf){o->summary, (size_t)p->S * (1 + 2 * p->beam), LH_I32, LH_OUT};
    b[9] = (lh_buf){o->finished, words(p->fin_bytes * p->H), LH_I32, LH_OUT};
    b[10] =
        (lh_buf){NULL, words(luna_beam_select_work_bytes(p->S, p->beam, p->cap)), LH_I32, LH_IN};
}

static void check_bytes(const char *what, const char *name, const void *got, const void *want,
                        size_t bytes) {
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < bytes; i++)
        ck_assert_msg(g[i] == w[i], "beam_select [%s]: %s differs at byte %zu (%u, want %u)", what,
                      name, i, g[i], w[i]);
}

/* One pool: the op on the backend under test against the reference, then against the CPU. */
static void check_pool(int S, int beam, int V, int ngram, int min_len, uint64_t seed) {
    luna_test_rng g;
    luna_test_rng_seed(&g, seed);
    pool p;
    pool_make(&p, &g, S, beam, V, ngram, min_len);
    outputs want, got;
    outputs_init(&p, &want);
    outputs_init(&p, &got);
    lh_buf b[11];
    buffers(&p, &got, b);
    char what[96];
    snprintf(what, sizeof what, "S %d beam %d V %d ngram %d min_len %d seed %llu", S, beam, V,
             ngram, min_len, (unsigned long long)seed);

    luna_backend *be = lh_backend(1);
    void *d[11];
    for (int i = 0; i < 11; i++) {
        d[i] = lh_alloc(be, 4 * (b[i].count ? b[i].count : 1));
        if (b[i].host) lh_upload(be, d[i], b[i].host, 4 * b[i].count);
    }
    LUNA_CHECK_OK(run_select(be, d, &p));
    ref_step(&p, &want);
    const size_t rows = (size_t)p.H * beam, n = rows * p.cap;
    lh_download(be, got.tok, d[3], 4 * n);
    lh_download(be, got.score, d[4], 8 * n);
    lh_download(be, got.back, d[5], 4 * n);
    lh_download(be, got.ignore_out, d[7], 4 * words(rows));
    lh_download(be, got.summary, d[8], 4 * b[8].count);
    lh_download(be, got.finished, d[9], p.fin_bytes * p.H);
    check_bytes(what, "summary", got.summary, want.summary, 4 * b[8].count);
    check_bytes(what, "tokens", got.tok, want.tok, 4 * n);
    check_bytes(what, "scores", got.score, want.score, 8 * n);
    check_bytes(what, "back-pointers", got.back, want.back, 4 * n);
    check_bytes(what, "ignore flags", got.ignore_out, want.ignore_out, 4 * words(rows));
    check_bytes(what, "finished records", got.finished, want.finished, p.fin_bytes * p.H);
    for (int i = 0; i < 11; i++)
        lh_free(be, d[i]);
    luna_backend_free(be);

    outputs fresh;
    outputs_init(&p, &fresh);
    buffers(&p, &fresh, b);
    ck_assert_int_eq(lh_compare("beam_select", what, 1, run_select, &p, b, 11), LUNA_OK);
    outputs_free(&fresh);
    outputs_free(&want);
    outputs_free(&got);
    pool_free(&p);
}

START_TEST(beam_select_matches_the_search_definition) {
    const int beams[] = {1, 2, 4, 5};
    for (int i = 0; i < 4; i++)
        for (uint64_t seed = 1; seed <= 6; seed++)
            check_pool(3 + (int)seed * 5, beams[i], 12, 0, 1, seed * 31 + (uint64_t)i);
}
END_TEST

START_TEST(beam_select_drops_ngram_and_min_len_bans) {
    for (int ngram = 1; ngram <= 3; ngram++)
        for (uint64_t seed = 1; seed <= 5; seed++)
            check_pool(17, 4, 9, ngram, (int)seed % 4, seed * 7 + (uint64_t)ngram);
}
END_TEST

START_TEST(beam_select_short_vocabulary) {
    /* V below 2·beam: kb = V, every list holds the whole vocabulary */
    for (uint64_t seed = 1; seed <= 4; seed++)
        check_pool(9, 5, 6, (int)seed % 3, 2, seed);
}
END_TEST

START_TEST(beam_select_rejects_bad_arguments) {
    luna_backend *be = lh_backend(1);
    int32_t *buf = lh_i32(be, NULL, 64);
    luna_beam_select_args a = {.S = 1, .beam = 2, .kb = 5, .k_list = 5, .cap = 4, .rows = 2};
    ck_assert_int_eq(be->ops->beam_select(be, &a), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "beam_select: bad sizes"));
    a.kb = 4;
    ck_assert_int_eq(be->ops->beam_select(be, &a), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "beam_select: null pointer"));
    ck_assert_int_eq(be->ops->beam_select(be, NULL), LUNA_ERR_INVALID_ARGUMENT);
    a.S = 0; /* an empty pool: nothing to do */
    LUNA_CHECK_OK(be->ops->beam_select(be, &a));
    lh_free(be, buf);
    luna_backend_free(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ops_beam_select");
    TCase *tc = tcase_create("beam_select");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, beam_select_matches_the_search_definition);
    tcase_add_test(tc, beam_select_drops_ngram_and_min_len_bans);
    tcase_add_test(tc, beam_select_short_vocabulary);
    tcase_add_test(tc, beam_select_rejects_bad_arguments);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
