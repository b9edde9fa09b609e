/* Incremental decoding of the whole decoder: one step at a time (with beam reordering, sentence
 * removal and row duplication in between) reproduces the teacher-forced full-sequence forward
 * log-probs, for Luna (tied/untied, softplus/elu, P mask or fixed projection) and the transformer
 * baseline; the Luna decoder state's bytes do not change with the step count; starting with one
 * row per sentence (luna_incremental_begin_one_row) gives, bit for bit, begin's results. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoding/incremental.h"
#include "tests/test_util.h"

enum { V = 20, NSTEP = 9, MAXB = 4, BEAM = 2 };

typedef struct {
    const char *preset;
    bool untied, fixed;
    luna_causal_activation act;
    bool non_contextual; /* every layer its own learned P (paper Table 5) */
} variant;

static luna_seq2seq *make_model(luna_backend *be, const variant *v, uint64_t seed) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, v->preset), LUNA_OK);
    c.vocab_size = V;
    c.untie_luna_kv = v->untied;
    c.fix_projection_length = v->fixed;
    c.causal_activation = v->act;
    c.non_contextual_projection = v->non_contextual;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, seed), LUNA_OK);
    return m;
}

static void log_softmax(const float *x, double *y, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        mx = fmax(mx, x[i]);
    for (int i = 0; i < n; i++)
        s += exp(x[i] - mx);
    for (int i = 0; i < n; i++)
        y[i] = x[i] - mx - log(s);
}

/* One step, all V log-probs of each row: the k = V candidates scattered back by token (which also
 * checks that they come best first with every token once). */
static luna_status step_full(luna_incremental *inc, const int32_t *tok, float *lp) {
    const int R = luna_incremental_rows(inc);
    float *top = malloc(sizeof(float) * (size_t)R * V);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)R * V);
    ck_assert_ptr_nonnull(top);
    ck_assert_ptr_nonnull(idx);
    luna_step_output out = {.k = V, .top_log_probs = top, .top_tokens = idx};
    luna_status st = luna_incremental_step(inc, tok, &out);
    for (int r = 0; r < R && st == LUNA_OK; r++) {
        bool seen[V] = {false};
        for (int i = 0; i < V; i++) {
            const int j = idx[r * V + i];
            ck_assert(j >= 0 && j < V && !seen[j]);
            seen[j] = true;
            if (i) ck_assert(top[r * V + i - 1] >= top[r * V + i]);
            lp[r * V + j] = top[r * V + i];
        }
    }
    free(top);
    free(idx);
    return st;
}

/* B sentences × BEAM virtual rows, each with its own random target prefix. */
static double compare(const variant *v, const int *lens, int B) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_seq2seq *model = make_model(be, v, 7);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 11);
    int m = 0;
    for (int b = 0; b < B; b++)
        m = lens[b] > m ? lens[b] : m;
    const int NR = B * BEAM;
    int32_t src[MAXB * 16], slen[MAXB];
    int32_t rsrc[MAXB * BEAM * 16], rlen[MAXB * BEAM], prev[MAXB * BEAM * NSTEP],
        tgt[MAXB * BEAM * NSTEP];
    for (int b = 0; b < B; b++) {
        slen[b] = lens[b];
        for (int t = 0; t < m; t++)
            src[b * m + t] = t < lens[b] - 1 ? 4 + (int)luna_test_uniform(&rng, 0, V - 4.01f)
                                             : (t == lens[b] - 1 ? 2 : 1);
    }
    for (int r = 0; r < NR; r++) {
        memcpy(rsrc + r * m, src + (r / BEAM) * m, sizeof(int32_t) * m);
        rlen[r] = slen[r / BEAM];
        prev[r * NSTEP] = 2;
        for (int t = 0; t < NSTEP; t++) {
            tgt[r * NSTEP + t] = 3 + (int)luna_test_uniform(&rng, 0, V - 3.01f);
            if (t + 1 < NSTEP) prev[r * NSTEP + t + 1] = tgt[r * NSTEP + t];
        }
    }
    /* the full-sequence reference */
    luna_batch batch = {.B = NR,
                        .src_len = m,
                        .tgt_len = NSTEP,
                        .src_tokens = rsrc,
                        .src_lengths = rlen,
                        .prev_output_tokens = prev,
                        .target = tgt};
    float *logits = malloc(sizeof(float) * NR * NSTEP * V);
    double *ref = malloc(sizeof(double) * NR * NSTEP * V);
    ck_assert_int_eq(luna_seq2seq_forward(model, &batch, NULL, NULL, logits), LUNA_OK);
    for (int i = 0; i < NR * NSTEP; i++)
        log_softmax(logits + i * V, ref + i * V, V);

    /* incremental, with reorders: cur[i] = virtual row of active row i */
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    ck_assert_int_eq(luna_incremental_begin(inc, src, slen, B, m, BEAM, NSTEP), LUNA_OK);
    const size_t state_bytes = luna_incremental_state_bytes(inc);
    int cur[MAXB * BEAM], R = NR;
    for (int r = 0; r < NR; r++)
        cur[r] = r;
    float *lp = malloc(sizeof(float) * NR * V);
    double max_err = 0;
    for (int t = 0; t < NSTEP; t++) {
        int32_t order[MAXB * BEAM];
        int n = 0;
        if (t == 3) /* swap the beams of every sentence */
            for (int i = 0; i < R; i++)
                order[n++] = i ^ 1;
        if (t == 5 && B > 1) /* remove sentence 1 */
            for (int i = 0; i < R; i++)
                if (i / BEAM != 1) order[n++] = i;
        if (t == 7) /* both beams continue the first */
            for (int i = 0; i < R; i++)
                order[n++] = i - i % BEAM;
        if (n || t == 3 || t == 7) {
            int nc[MAXB * BEAM];
            for (int i = 0; i < n; i++)
                nc[i] = cur[order[i]];
            ck_assert_int_eq(luna_incremental_reorder(inc, order, n), LUNA_OK);
            memcpy(cur, nc, sizeof(int) * n);
            R = n;
            if (t == 7) /* duplicated rows now follow their parent's targets */
                for (int i = 0; i < R; i++)
                    cur[i] = cur[i - i % BEAM];
        }
        ck_assert_int_eq(luna_incremental_rows(inc), R);
        int32_t tok[MAXB * BEAM];
        for (int i = 0; i < R; i++)
            tok[i] = prev[cur[i] * NSTEP + t];
        ck_assert_int_eq(step_full(inc, tok, lp), LUNA_OK);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < V; j++)
                max_err = fmax(max_err, fabs(lp[i * V + j] - ref[(cur[i] * NSTEP + t) * V + j]));
        ck_assert_uint_eq(luna_incremental_state_bytes(inc), state_bytes);
        ck_assert_uint_eq(luna_incremental_scratch_bytes(inc), 0);
    }
    printf("incremental vs full forward (%s%s%s%s%s, sources", v->preset,
           v->untied ? " untied" : "", v->act == LUNA_CAUSAL_ELU ? " elu" : "",
           v->fixed ? " fixed-L" : "", v->non_contextual ? " non-contextual P" : "");
    for (int b = 0; b < B; b++)
        printf(" %d", lens[b]);
    printf("): max |Δ log p| %.3g, state %zu bytes for %d rows\n", max_err, state_bytes, NR);
    ck_assert_msg(max_err <= 1e-5, "max |diff| %g > 1e-5", max_err);
    free(lp);
    free(logits);
    free(ref);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
    luna_backend_free(be);
    return max_err;
}

static const int LENS_LONG[3] = {3, 7, 12}; /* L = l = 8, P mask 3, 7, 8 */
static const int LENS_SHORT[3] = {2, 5, 4}; /* L = 5 < l */

START_TEST(luna_tied_softplus) {
    variant v = {"luna_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, false};
    compare(&v, LENS_LONG, 3);
    compare(&v, LENS_SHORT, 3);
}
END_TEST
START_TEST(luna_untied_elu) {
    variant v = {"luna_tiny", true, false, LUNA_CAUSAL_ELU, false};
    compare(&v, LENS_LONG, 3);
    compare(&v, LENS_SHORT, 3);
}
END_TEST
START_TEST(luna_tied_elu_fixed) {
    variant v = {"luna_tiny", false, true, LUNA_CAUSAL_ELU, false};
    compare(&v, LENS_SHORT, 3);
}
END_TEST
START_TEST(luna_untied_softplus_fixed) {
    variant v = {"luna_tiny", true, true, LUNA_CAUSAL_SOFTPLUS, false};
    compare(&v, LENS_LONG, 3);
}
END_TEST
/* The decoder's per-layer P in incremental decoding is the training forward's. */
START_TEST(luna_non_contextual) {
    variant v = {"luna_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, true};
    compare(&v, LENS_LONG, 3);
    compare(&v, LENS_SHORT, 3);
}
END_TEST
START_TEST(transformer) {
    variant v = {"transformer_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, false};
    compare(&v, LENS_LONG, 3);
    compare(&v, LENS_SHORT, 3);
}
END_TEST

/* The Luna state is allocated once at begin and never grows: steps 1..512. */
START_TEST(luna_state_constant) {
    enum { S = 2, STEPS = 512, M = 6 };
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    variant v = {"luna_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, false};
    luna_seq2seq *model = make_model(be, &v, 3);
    int32_t src[S * M] = {5, 6, 7, 8, 9, 2, 10, 11, 2, 1, 1, 1}, lens[S] = {6, 3};
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    ck_assert_int_eq(luna_incremental_begin(inc, src, lens, S, M, 1, STEPS), LUNA_OK);
    const size_t bytes = luna_incremental_state_bytes(inc);
    float *lp = malloc(sizeof(float) * S * V);
    int32_t tok[S] = {2, 2};
    for (int t = 1; t <= STEPS; t++) {
        ck_assert_int_eq(step_full(inc, tok, lp), LUNA_OK);
        ck_assert_uint_eq(luna_incremental_state_bytes(inc), bytes);
        ck_assert_uint_eq(luna_incremental_scratch_bytes(inc), 0);
        for (int b = 0; b < S; b++) {
            ck_assert(isfinite(lp[b * V + 5]));
            tok[b] = 4 + (t * 7 + b) % (V - 4);
        }
    }
    const luna_config *c = &model->config;
    const int L = luna_incremental_projection_slots(inc);
    /* per row and layer: P̃, Σ K Φᵀ, Σ Φᵀ V (3·L·d); per sentence and layer: c_proj(Y_P) (L·d) */
    size_t floats = (size_t)c->decoder_layers * (3 + 1) * S * L * c->decoder_embed_dim;
    printf("Luna decoder state: %zu bytes for %d sentences (L=%d, d=%d, %d layers; %zu payload), "
           "constant over steps 1..%d; scratch peak %zu bytes\n",
           bytes, S, L, c->decoder_embed_dim, c->decoder_layers, floats * sizeof(float), STEPS,
           luna_incremental_scratch_peak(inc));
    ck_assert_uint_ge(bytes, floats * sizeof(float));
    ck_assert_uint_le(bytes, floats * sizeof(float) + 64 * 256);
    /* stepping past max_steps is an error, not a buffer overrun */
    ck_assert_int_ne(step_full(inc, tok, lp), LUNA_OK);
    free(lp);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
    luna_backend_free(be);
}
END_TEST

/* begin_one_row: step 0 on one row per sentence, the first reorder expands each to BEAM rows;
 * every step's log-probs are bit-identical to begin's (row s·BEAM at step 0), through a second
 * reorder that swaps beams and drops a sentence. */
static void one_row_matches(const variant *v) {
    enum { S = 3, M = 7, R = S * BEAM };
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_seq2seq *model = make_model(be, v, 5);
    int32_t src[S * M] = {5, 6, 7, 8, 9, 2, 1, /* */ 10, 11, 2, 1, 1, 1, 1, /* */
                          4, 5, 6, 7, 8, 9, 2};
    int32_t lens[S] = {6, 3, 7};
    luna_incremental *full, *one;
    ck_assert_int_eq(luna_incremental_create(&full, model), LUNA_OK);
    ck_assert_int_eq(luna_incremental_create(&one, model), LUNA_OK);
    ck_assert_int_eq(luna_incremental_begin(full, src, lens, S, M, BEAM, 4), LUNA_OK);
    ck_assert_int_eq(luna_incremental_begin_one_row(one, src, lens, S, M, BEAM, 4), LUNA_OK);
    ck_assert_int_eq(luna_incremental_rows(one), S);
    float lp_full[R * V], lp_one[R * V];
    int32_t tok[R] = {2, 2, 2, 2, 2, 2};
    ck_assert_int_eq(step_full(full, tok, lp_full), LUNA_OK);
    ck_assert_int_eq(step_full(one, tok, lp_one), LUNA_OK);
    for (int s = 0; s < S; s++)
        ck_assert(memcmp(lp_one + s * V, lp_full + s * BEAM * V, sizeof(float) * V) == 0);
    /* a beam group from two sentences is refused (row 1 is sentence 1's) */
    int32_t mixed[R] = {0, 1, 1, 1, 2, 2};
    ck_assert_int_eq(luna_incremental_reorder(one, mixed, R), LUNA_ERR_INVALID_ARGUMENT);
    int32_t exp_full[R], exp_one[R];
    for (int i = 0; i < R; i++)
        exp_full[i] = i - i % BEAM, exp_one[i] = i / BEAM;
    ck_assert_int_eq(luna_incremental_reorder(full, exp_full, R), LUNA_OK);
    ck_assert_int_eq(luna_incremental_reorder(one, exp_one, R), LUNA_OK);
    ck_assert_int_eq(luna_incremental_rows(one), R);
    for (int t = 1; t < 4; t++) {
        const int rows = luna_incremental_rows(full);
        for (int i = 0; i < rows; i++)
            tok[i] = 4 + (7 * t + 3 * i) % (V - 4);
        ck_assert_int_eq(step_full(full, tok, lp_full), LUNA_OK);
        ck_assert_int_eq(step_full(one, tok, lp_one), LUNA_OK);
        ck_assert(memcmp(lp_one, lp_full, sizeof(float) * (size_t)rows * V) == 0);
        if (t == 2) { /* swap the beams, drop sentence 1 */
            int32_t order[R];
            int n = 0;
            for (int i = 0; i < rows; i++)
                if (i / BEAM != 1) order[n++] = i ^ 1;
            ck_assert_int_eq(luna_incremental_reorder(full, order, n), LUNA_OK);
            ck_assert_int_eq(luna_incremental_reorder(one, order, n), LUNA_OK);
        }
    }
    luna_incremental_free(full);
    luna_incremental_free(one);
    luna_seq2seq_free(model);
    luna_backend_free(be);
}

START_TEST(one_row_first_step) {
    const variant tr = {"transformer_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, false};
    const variant lu = {"luna_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, false};
    const variant lf = {"luna_tiny", true, true, LUNA_CAUSAL_ELU, false};
    one_row_matches(&tr);
    one_row_matches(&lu);
    one_row_matches(&lf);
}
END_TEST

START_TEST(bad_inputs) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    variant v = {"luna_tiny", false, false, LUNA_CAUSAL_SOFTPLUS, false};
    luna_seq2seq *model = make_model(be, &v, 3);
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, model), LUNA_OK);
    int32_t src[4] = {5, 1, 2, 1}, lens[1] = {4};
    ck_assert_int_eq(luna_incremental_begin(inc, src, lens, 1, 4, 1, 4), LUNA_ERR_INVALID_ARGUMENT);
    int32_t src2[4] = {5, 6, 2, 1}, lens2[1] = {3};
    ck_assert_int_eq(luna_incremental_begin(inc, src2, lens2, 1, 4, 2, 4), LUNA_OK);
    int32_t bad_tok[2] = {2, V};
    float lp[2 * V];
    ck_assert_int_eq(step_full(inc, bad_tok, lp), LUNA_ERR_INVALID_ARGUMENT);
    int32_t order[2] = {0, 2};
    ck_assert_int_eq(luna_incremental_reorder(inc, order, 2), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_incremental_reorder(inc, order, 1), LUNA_ERR_INVALID_ARGUMENT);
    luna_incremental_free(inc);
    luna_seq2seq_free(model);
    luna_backend_free(be);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("decoding_incremental");
    TCase *tc = tcase_create("incremental");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, luna_tied_softplus);
    tcase_add_test(tc, luna_untied_elu);
    tcase_add_test(tc, luna_tied_elu_fixed);
    tcase_add_test(tc, luna_untied_softplus_fixed);
    tcase_add_test(tc, luna_non_contextual);
    tcase_add_test(tc, transformer);
    tcase_add_test(tc, luna_state_constant);
    tcase_add_test(tc, one_row_first_step);
    tcase_add_test(tc, bad_inputs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
