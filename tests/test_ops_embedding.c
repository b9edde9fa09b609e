/* Tests of the embedding group: token embedding forward/backward (finite differences with repeated
 * and padding tokens, accumulation, out-of-range ids, thread-count determinism) and the fairseq
 * sinusoidal positions against an independent double-precision formula; and every op on the
 * backend under test (LUNA_TEST_BACKEND) against the CPU reference. Ops get device buffers from
 * the harness (tests/backend_harness.h); the checks read them back. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

#ifndef GC_RTOL
#define GC_RTOL 2e-3
#endif
#ifndef GC_FLOOR
#define GC_FLOOR 1e-3
#endif
#define PAD 1 /* fairseq's padding_idx */

/* ---- The ops on device copies of host arrays ---------------------------------------------------
 * Inputs uploaded; outputs (and what they accumulate into) uploaded, computed and read back. */
static luna_status emb_fwd(luna_backend *be, float *out, const float *table, const int32_t *tokens,
                           int n, int V, int d, float scale) {
    size_t no = (size_t)n * d, nt = (size_t)V * d;
    float *vt = lh_f32(be, table, nt), *vo = lh_alloc(be, no * sizeof(float));
    int32_t *vtok = lh_i32(be, tokens, (size_t)n);
    luna_status st = be->ops->embedding_forward(be, vo, vt, vtok, n, V, d, scale, PAD);
    if (st == LUNA_OK) lh_download(be, out, vo, no * sizeof(float));
    lh_free(be, vt);
    lh_free(be, vo);
    lh_free(be, vtok);
    return st;
}

/* dtable accumulates: its contents are uploaded, and read back whatever the status (so that a
 * failing call can be checked to write nothing). */
static luna_status emb_bwd(luna_backend *be, float *dtable, const float *dout,
                           const int32_t *tokens, int n, int V, int d, float scale) {
    size_t no = (size_t)n * d, nt = (size_t)V * d;
    float *vt = lh_f32(be, dtable, nt), *vo = lh_f32(be, dout, no);
    int32_t *vtok = lh_i32(be, tokens, (size_t)n);
    luna_status st = be->ops->embedding_backward(be, vt, vo, vtok, n, V, d, scale, PAD);
    lh_download(be, dtable, vt, nt * sizeof(float));
    lh_free(be, vt);
    lh_free(be, vo);
    lh_free(be, vtok);
    return st;
}

static luna_status sin_table(luna_backend *be, float *out, int first, int npos, int d) {
    size_t n = (size_t)npos * d;
    float *vo = lh_alloc(be, n * sizeof(float));
    luna_status st = be->ops->sinusoidal_table(be, vo, first, npos, d);
    if (st == LUNA_OK) lh_download(be, out, vo, n * sizeof(float));
    lh_free(be, vo);
    return st;
}

/* x [B, N, d] in place. */
static luna_status pos_add(luna_backend *be, float *x, const int32_t *tokens, int B, int N, int d) {
    size_t n = (size_t)B * N * d;
    float *vx = lh_f32(be, x, n);
    int32_t *vtok = lh_i32(be, tokens, (size_t)B * N);
    luna_status st = be->ops->positions_add(be, vx, vtok, B, N, d, PAD);
    if (st == LUNA_OK) lh_download(be, x, vx, n * sizeof(float));
    lh_free(be, vx);
    lh_free(be, vtok);
    return st;
}

/* ---- Token embedding ------------------------------------------------------------------------- */

START_TEST(embedding_forward_scales_rows_and_zeroes_pads) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 1);
    const int V = 6, d = 5, n = 7;
    const int32_t tokens[7] = {3, PAD, 0, 5, 3, PAD, 2};
    float *table = luna_test_random_vector(&rng, V * d, -1, 1),
          *out = luna_test_random_vector(&rng, n * d, -1, 1);
    const float scale = 2.2360679f; /* √5 */
    ck_assert_int_eq(emb_fwd(be, out, table, tokens, n, V, d, scale), LUNA_OK);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < d; c++) {
            float want = tokens[i] == PAD ? 0.0f : scale * table[tokens[i] * d + c];
            LUNA_EXPECT(out[i * d + c] == want, "out[%d][%d] = %g, want %g", i, c, out[i * d + c],
                        want);
        }
    free(table);
    free(out);
    luna_backend_free(be);
}
END_TEST

typedef struct {
    luna_backend *be;
    float *table, *out, *w;
    const int32_t *tokens;
    int n, V, d;
    float scale;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    luna_status st = emb_fwd(c->be, c->out, c->table, c->tokens, c->n, c->V, c->d, c->scale);
    LUNA_EXPECT(st == LUNA_OK, "%s", luna_error_message());
    return luna_test_weighted_sum(c->out, c->w, (size_t)c->n * c->d);
}

START_TEST(embedding_gradient_matches_finite_differences) {
    luna_backend *be = lh_backend(2);
    /* Repeated tokens (4 three times), padding tokens, V = 1 and d = 1 edge cases. */
    static const int32_t tok_a[] = {4, PAD, 0, 4, 2, 4, PAD, 5};
    static const int32_t tok_b[] = {0};
    static const int32_t tok_c[] = {2, 2, PAD};
    struct {
        const int32_t *tokens;
        int n, V, d;
    } cases[] = {{tok_a, 8, 7, 5}, {tok_a, 8, 6, 33}, {tok_b, 1, 1, 1}, {tok_c, 3, 3, 1}};
    double worst = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int n = cases[k].n, V = cases[k].V, d = cases[k].d;
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 10 + k);
        emb_ctx c = {be,
                     luna_test_random_vector(&rng, V * d, -1, 1),
                     luna_test_random_vector(&rng, n * d, 0, 0),
                     luna_test_random_vector(&rng, n * d, -1, 1),
                     cases[k].tokens,
                     n,
                     V,
                     d,
                     1.7f};
        float *dtable = calloc(V * d, sizeof(float));
        ck_assert_int_eq(emb_bwd(be, dtable, c.w, c.tokens, n, V, d, c.scale), LUNA_OK);
        if (V > PAD)
            for (int j = 0; j < d; j++)
                ck_assert_float_eq(dtable[PAD * d + j], 0.0f);
        worst = fmax(worst, luna_test_gradcheck("embedding dtable", emb_loss, &c, c.table, V * d,
                                                dtable, 1e-2, GC_RTOL, GC_FLOOR));
        free(c.table);
        free(c.out);
        free(c.w);
        free(dtable);
    }
    printf("embedding: worst gradcheck error %.3g\n", worst);
    luna_backend_free(be);
}
END_TEST

/* dtable accumulates (+=) and the result does not depend on the thread count (heavily repeated
 * tokens, more columns than one tile). */
START_TEST(embedding_backward_accumulates_deterministically) {
    luna_backend *be = lh_backend(2);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 3);
    const int V = 7, d = 100, n = 5000;
    int32_t *tokens = malloc(n * sizeof *tokens);
    for (int i = 0; i < n; i++)
        tokens[i] = (int32_t)(luna_test_uniform(&rng, 0, 1) * V) % V;
    float *dout = luna_test_random_vector(&rng, (size_t)n * d, -1, 1),
          *d0 = luna_test_random_vector(&rng, V * d, -1, 1);
    float *dt[2];
    for (int t = 0; t < 2; t++) {
        lh_set_threads(be, 2 - t);
        dt[t] = malloc(sizeof(float) * V * d);
        memcpy(dt[t], d0, sizeof(float) * V * d);
        ck_assert_int_eq(emb_bwd(be, dt[t], dout, tokens, n, V, d, 0.5f), LUNA_OK);
    }
    ck_assert_int_eq(memcmp(dt[0], dt[1], sizeof(float) * V * d), 0);
    for (int v = 0; v < V; v++)
        for (int c = 0; c < d; c++) {
            double s = d0[v * d + c];
            if (v != PAD)
                for (int i = 0; i < n; i++)
                    if (tokens[i] == v) s += 0.5 * dout[(size_t)i * d + c];
            LUNA_EXPECT(fabs(dt[0][v * d + c] - s) <= 1e-4, "dtable[%d][%d] = %g, want %g", v, c,
                        dt[0][v * d + c], s);
        }
    free(tokens);
    free(dout);
    free(d0);
    free(dt[0]);
    free(dt[1]);
    luna_backend_free(be);
}
END_TEST

START_TEST(embedding_rejects_out_of_range_ids) {
    luna_backend *be = lh_backend(1);
    float table[4 * 3] = {0}, out[4 * 3], dtable[4 * 3] = {0}, dout[4 * 3] = {1, 1, 1, 1, 1, 1};
    const int32_t big[4] = {0, 3, 4, 1}, neg[4] = {2, -1, 0, 0};
    ck_assert_int_eq(emb_fwd(be, out, table, big, 4, 4, 3, 1.0f), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "token id 4 at position 2"));
    ck_assert_int_eq(emb_bwd(be, dtable, dout, neg, 4, 4, 3, 1.0f), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "token id -1 at position 1"));
    for (int i = 0; i < 12; i++)
        ck_assert_float_eq(dtable[i], 0.0f); /* nothing written */
    luna_backend_free(be);
}
END_TEST

/* ---- Sinusoidal positions -------------------------------------------------------------------- */

/* PE(pos)[i], written independently of the kernel: frequencies as powers of 10000. */
static double pe_ref(int pos, int i, int d) {
    int half = d / 2;
    if (i >= 2 * half) return 0.0; /* odd d: zero last column */
    int k = i < half ? i : i - half;
    double f = half > 1 ? pow(10000.0, -(double)k / (half - 1)) : 1.0;
    return i < half ? sin(pos * f) : cos(pos * f);
}

START_TEST(sinusoidal_table_matches_formula) {
    luna_backend *be = lh_backend(2);
    static const int dims[] = {1, 2, 3, 4, 7, 8, 33, 512};
    static const int firsts[] = {0, 2, 1000};
    for (size_t a = 0; a < sizeof dims / sizeof dims[0]; a++)
        for (size_t b = 0; b < 3; b++) {
            int d = dims[a], first = firsts[b], npos = 37;
            float *out = malloc(sizeof(float) * npos * d);
            ck_assert_int_eq(sin_table(be, out, first, npos, d), LUNA_OK);
            for (int j = 0; j < npos; j++)
                for (int i = 0; i < d; i++) {
                    double want = pe_ref(first + j, i, d);
                    /* Rounded once from double (pow vs exp: ~1e-13 apart in the angle). */
                    double tol = 1e-7;
                    LUNA_EXPECT(fabs(out[j * d + i] - want) <= tol,
                                "d %d PE(%d)[%d] = %.9g, want %.9g", d, first + j, i,
                                out[j * d + i], want);
                }
            free(out);
        }
    /* Spot values: d = 6 has f = (1, 1e-2, 1e-4), so PE(2) = [sin 2, sin .02, sin 2e-4 | cos ...].
     */
    float pe[6];
    static const double ang[3] = {2.0, 0.02, 2e-4};
    ck_assert_int_eq(sin_table(be, pe, 2, 1, 6), LUNA_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert_float_eq_tol(pe[i], sin(ang[i]), 1e-7);
        ck_assert_float_eq_tol(pe[3 + i], cos(ang[i]), 1e-7);
    }
    luna_backend_free(be);
}
END_TEST

START_TEST(positions_add_follows_make_positions) {
    luna_backend *be = lh_backend(2);
    enum { B = 5, N = 7 };
    const int32_t tokens[B * N] = {
        8,   9,   10,  4,   2,   PAD, PAD, /* right padding */
        PAD, PAD, PAD, 8,   9,   4,   2,   /* left padding: first real token still at 2 */
        5,   6,   7,   8,   9,   10,  2,   /* no padding */
        PAD, PAD, PAD, PAD, PAD, PAD, PAD, /* all pads */
        7,   PAD, 0,   3,   PAD, 9,   2,   /* interior pads (cumsum continues) */
    };
    static const int dims[] = {1, 6, 7, 64};
    for (size_t a = 0; a < sizeof dims / sizeof dims[0]; a++) {
        int d = dims[a];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 50 + a);
        float *x0 = luna_test_random_vector(&rng, (size_t)B * N * d, -1, 1);
        float *x = malloc(sizeof(float) * B * N * d);
        memcpy(x, x0, sizeof(float) * B * N * d);
        ck_assert_int_eq(pos_add(be, x, tokens, B, N, d), LUNA_OK);
        for (int b = 0; b < B; b++) {
            int count = 0, first_pos = -1;
            for (int t = 0; t < N; t++) {
                const float *xi = x + ((size_t)b * N + t) * d, *x0i = x0 + ((size_t)b * N + t) * d;
                if (tokens[b * N + t] == PAD) { /* pads: bit-identical, nothing added */
                    LUNA_EXPECT(memcmp(xi, x0i, sizeof(float) * d) == 0, "pad (%d, %d) changed", b,
                                t);
                    continue;
                }
                int pos = PAD + ++count;
                if (first_pos < 0) first_pos = pos;
                for (int i = 0; i < d; i++) {
                    double want = (double)x0i[i] + pe_ref(pos, i, d);
                    LUNA_EXPECT(fabs(xi[i] - want) <= 3e-7,
                                "x(%d, %d)[%d] = %.9g, want %.9g (pos %d)", b, t, i, xi[i], want,
                                pos);
                }
            }
            if (b != 3) ck_assert_int_eq(first_pos, 2);
        }
        /* Same rows as the table op (used by incremental decoding): bit-identical. */
        float *pe = malloc(sizeof(float) * 4 * d), *z = calloc((size_t)N * d, sizeof(float));
        ck_assert_int_eq(sin_table(be, pe, 2, 4, d), LUNA_OK);
        ck_assert_int_eq(pos_add(be, z, tokens + N, 1, N, d), LUNA_OK);
        ck_assert_int_eq(memcmp(z + 3 * d, pe, sizeof(float) * 4 * d), 0);
        free(pe);
        free(z);
        free(x0);
        free(x);
    }
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference ---------------------------------------- */
typedef struct {
    const char *op;
    int64_t n;
    int V, d, B, first;
    float scale;
} cmp_args;

/* embedding: d[0] table / dtable, d[1] tokens, d[2] out / dout. sinusoidal_table: d[2] out.
 * positions_add: d[1] tokens [B, n], d[2] x. */
static luna_status cmp_run(luna_backend *be, void *const *d, const void *args) {
    const cmp_args *a = args;
    const luna_ops *o = be->ops;
    if (!strcmp(a->op, "embedding_forward"))
        return o->embedding_forward(be, d[2], d[0], d[1], a->n, a->V, a->d, a->scale, PAD);
    if (!strcmp(a->op, "embedding_backward"))
        return o->embedding_backward(be, d[0], d[2], d[1], a->n, a->V, a->d, a->scale, PAD);
    if (!strcmp(a->op, "sinusoidal_table"))
        return o->sinusoidal_table(be, d[2], a->first, (int)a->n, a->d);
    return o->positions_add(be, d[2], d[1], a->B, (int)a->n, a->d, PAD); /* "positions_add" */
}

START_TEST(embedding_ops_match_reference_backend) {
    /* n, V, d; the last: more tokens than a GPU's token tile and V above its bucket count */
    const int shapes[][3] = {{1, 2, 1}, {7, 11, 13}, {65, 9, 6}, {130, 37, 33}, {2100, 300, 70}};
    static const char *const ops[] = {"embedding_forward", "embedding_backward", "sinusoidal_table",
                                      "positions_add"};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int n = shapes[k][0], V = shapes[k][1], d = shapes[k][2];
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 90 + k);
        size_t nt = (size_t)V * d, no = (size_t)n * d;
        float *table = luna_test_random_vector(&rng, nt, -1, 1);
        float *out = luna_test_random_vector(&rng, no, -1, 1);
        int32_t *tokens = malloc((size_t)n * sizeof *tokens);
        for (int i = 0; i < n; i++) /* repeated ids (accumulation) and pads */
            tokens[i] = i % 4 == 3 ? PAD : (int32_t)luna_test_uniform(&rng, 0, (float)V - 0.5f);
        for (size_t i = 0; i < 4; i++) {
            cmp_args a = {ops[i], n, V, d, 1, 3 + (int)k, 0.75f};
            if (i == 3 && n % 5 == 0) { /* positions_add: [B, n/B] */
                a.B = 5;
                a.n = n / 5;
            }
            lh_buf bufs[] = {{table, nt, LH_F32, i == 1 ? LH_OUT : LH_IN},
                             {tokens, (size_t)n, LH_I32, LH_IN},
                             {out, no, LH_F32, i == 1 ? LH_IN : LH_OUT}};
            char what[48];
            snprintf(what, sizeof what, "n %d V %d d %d", n, V, d);
            ck_assert_int_eq(lh_compare(ops[i], what, 2, cmp_run, &a, bufs, 3), LUNA_OK);
        }
        free(table);
        free(out);
        free(tokens);
    }
}
END_TEST

static Suite *embedding_suite(void) {
    Suite *s = suite_create("ops_embedding");
    TCase *tc = tcase_create("embedding_positions");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, embedding_forward_scales_rows_and_zeroes_pads);
    tcase_add_test(tc, embedding_gradient_matches_finite_differences);
    tcase_add_test(tc, embedding_backward_accumulates_deterministically);
    tcase_add_test(tc, embedding_rejects_out_of_range_ids);
    tcase_add_test(tc, sinusoidal_table_matches_formula);
    tcase_add_test(tc, positions_add_follows_make_positions);
    tcase_add_test(tc, embedding_ops_match_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(embedding_suite()); }
