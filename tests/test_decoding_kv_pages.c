/* The transformer's key/value caches under in-flight batching (decoding/kv_pages.h): a pool whose
 * sentences finish early and hand their rows to the next ones holds caches for the positions its
 * sentences reach, not every row at max_steps. The cache bytes are the same for max_steps 64 and
 * 512, within the growth's slack of the blocks the live sentences held at most, and below the
 * up-front rows × max_steps; the log-probs are those of each sentence decoded alone (a slot per row
 * over its whole history), across page boundaries and in blocks that finished sentences wrote. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoding/incremental.h"
#include "decoding/kv_pages.h"
#include "tests/test_util.h"

enum { V = 20, BEAM = 2, S_CAP = 3, M = 5, N = 6, TMAX = 40 };
static const int LEN[N] = {5, 40, 7, 3, 33, 20}; /* steps each sentence decodes */

static luna_seq2seq *make_model(luna_backend *be) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "transformer_tiny"), LUNA_OK);
    c.vocab_size = V;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, 3), LUNA_OK);
    return m;
}

static void source(int s, int32_t *src) {
    for (int k = 0; k < M - 1; k++)
        src[k] = 4 + (s * 3 + k * 5) % (V - 4);
    src[M - 1] = 2;
}

/* Row j of sentence s reads this token at step t (</s> first). */
static int32_t token(int s, int j, int t) {
    return t == 0 ? 2 : 4 + (s * 7 + j * 3 + t * 5) % (V - 4);
}

/* One step; the V log-probs of each row scattered by token into lp[row·V + token]. */
static void step(luna_incremental *inc, const int32_t *tok, float *lp) {
    const int R = luna_incremental_rows(inc);
    float top[S_CAP * BEAM * V];
    int32_t idx[S_CAP * BEAM * V];
    luna_step_output out = {.k = V, .top_log_probs = top, .top_tokens = idx};
    LUNA_CHECK_OK(luna_incremental_step(inc, tok, &out));
    for (int i = 0; i < R * V; i++)
        lp[(i / V) * V + idx[i]] = top[i];
}

/* The pool: S_CAP sentences at a time, each leaving after LEN[s] steps, the next joining in its
 * place. lp [N, BEAM, TMAX, V]; returns the most cache bytes held, *live: the most blocks the
 * active sentences held at once (a block per LUNA_KV_PAGE positions written). */
static size_t run_pool(luna_seq2seq *model, int max_steps, float *lp, int *live) {
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    LUNA_CHECK_OK(luna_incremental_begin_pool(inc, S_CAP, M, BEAM, max_steps));
    int id[S_CAP], t_of[S_CAP], S = 0, next = 0;
    size_t most = 0;
    *live = 0;
    while (S > 0 || next < N) {
        const int n = S_CAP - S < N - next ? S_CAP - S : N - next;
        if (n > 0) {
            int32_t src[S_CAP * M], lens[S_CAP];
            for (int i = 0; i < n; i++) {
                source(next + i, src + i * M);
                lens[i] = M;
                id[S + i] = next + i;
                t_of[S + i] = 0;
            }
            LUNA_CHECK_OK(luna_incremental_admit(inc, src, lens, n, M, false));
            S += n;
            next += n;
        }
        int32_t tok[S_CAP * BEAM];
        float out[S_CAP * BEAM * V];
        for (int s = 0; s < S; s++)
            for (int j = 0; j < BEAM; j++)
                tok[s * BEAM + j] = token(id[s], j, t_of[s]);
        step(inc, tok, out);
        int blocks = 0;
        for (int s = 0; s < S; s++) {
            for (int j = 0; j < BEAM; j++)
                memcpy(lp + (((size_t)id[s] * BEAM + j) * TMAX + t_of[s]) * V,
                       out + (s * BEAM + j) * V, sizeof(float) * V);
            t_of[s]++;
            blocks += (t_of[s] + LUNA_KV_PAGE - 1) / LUNA_KV_PAGE;
        }
        *live = blocks > *live ? blocks : *live;
        const size_t bytes = luna_incremental_cache_bytes(inc);
        most = bytes > most ? bytes : most;
        int32_t rows[S_CAP * BEAM];
        int kept = 0;
        for (int s = 0; s < S; s++) {
            if (t_of[s] == LEN[id[s]]) continue;
            for (int j = 0; j < BEAM; j++)
                rows[kept * BEAM + j] = s * BEAM + j;
            id[kept] = id[s];
            t_of[kept++] = t_of[s];
        }
        if (kept < S) LUNA_CHECK_OK(luna_incremental_reorder(inc, rows, kept * BEAM));
        S = kept;
    }
    luna_incremental_free(inc);
    return most;
}

START_TEST(pool_caches_follow_the_positions_reached) {
    luna_backend *be = luna_test_backend(2);
    luna_seq2seq *model = make_model(be);
    const luna_config *c = &model->config;
    const size_t n_lp = (size_t)N * BEAM * TMAX * V;
    float *lp = calloc(n_lp, sizeof(float)), *lp2 = calloc(n_lp, sizeof(float));
    ck_assert(lp && lp2);
    int live, live2;
    const size_t bytes = run_pool(model, 64, lp, &live);
    const size_t bytes2 = run_pool(model, 512, lp2, &live2);
    /* growth from S_CAP blocks by half: at most 1.5× the most blocks held, plus one */
    const size_t block = sizeof(float) * BEAM * LUNA_KV_PAGE * c->decoder_embed_dim;
    const size_t per_block = 2 * (size_t)c->decoder_layers * block;
    const int cap_bound = live * 3 / 2 + 1 > S_CAP ? live * 3 / 2 + 1 : S_CAP;
    const size_t up_front =
        2 * (size_t)c->decoder_layers * S_CAP * BEAM * 64 * c->decoder_embed_dim * sizeof(float);
    printf("key/value pages: %zu bytes at most for max_steps 64 and %zu for 512 (%d blocks held at "
           "most, %zu bytes each; %zu bytes up front for rows x 64 positions)\n",
           bytes, bytes2, live, per_block, up_front);
    ck_assert_int_eq(live, live2);
    ck_assert_uint_eq(bytes, bytes2);
    ck_assert_uint_le(bytes, (size_t)cap_bound * per_block);
    ck_assert_uint_lt(bytes, up_front);
    ck_assert_int_eq(memcmp(lp, lp2, sizeof(float) * n_lp), 0);

    /* each sentence alone, its rows at slot r over the whole history */
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    double max_err = 0;
    for (int s = 0; s < N; s++) {
        int32_t src[M], len = M;
        source(s, src);
        LUNA_CHECK_OK(luna_incremental_begin(inc, src, &len, 1, M, BEAM, 64));
        for (int t = 0; t < LEN[s]; t++) {
            int32_t tok[BEAM];
            float out[BEAM * V];
            for (int j = 0; j < BEAM; j++)
                tok[j] = token(s, j, t);
            step(inc, tok, out);
            for (int j = 0; j < BEAM; j++)
                for (int v = 0; v < V; v++)
                    max_err = fmax(max_err, fabs(out[j * V + v] -
                                                 lp[(((size_t)s * BEAM + j) * TMAX + t) * V + v]));
        }
    }
    printf("pooled vs alone: max |d log p| %.3g over %d sentences of up to %d steps\n", max_err, N,
           TMAX);
    ck_assert_msg(max_err <= 1e-5, "max |diff| %g > 1e-5", max_err);
    luna_incremental_free(inc);
    free(lp);
    free(lp2);
    luna_seq2seq_free(model);
    luna_backend_free(be);
}
END_TEST

static Suite *kv_pages_suite(void) {
    Suite *s = suite_create("decoding_kv_pages");
    TCase *tc = tcase_create("pages");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, pool_caches_follow_the_positions_reached);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(kv_pages_suite()); }
