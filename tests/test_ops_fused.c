/* Tests of the fused training ops (core/backend.h, "Fused training ops"): each fused op against
 * the composition of the steps it fuses, on the CPU backend BIT FOR BIT (forward and backward,
 * every output, dropout masks included, 1 and 3 threads, the aliasing the contract allows:
 * dres == dy, dh == da, dx == dyd, y == x), on odd shapes (rows 1, 7, 33; d 1, 5, 64, 130, 600 —
 * more than one dropout run of a row; p 0, 0.1, 0.5; bias NULL or not; softmax masks by group and
 * causal). The composition is made of other ops: the bias add on the host (one fp32 addition),
 * dropout_forward / _backward, add, linear_backward with in = 0 (the bias gradient),
 * softmax_forward; the normalisation or activation itself is the same fused op with no bias and
 * no dropout (their own values are tests/test_ops_layer_norm.c, test_ops_activations.c and
 * test_ops_softmax.c), so this checks where the bias, dropout and residual enter. Then the backend
 * under test (LUNA_TEST_BACKEND) against the CPU reference within each op's tier
 * (tests/backend_harness.h). The bf16 kernels are checked by tests/cuda/emu_fused.c. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/kernels/registry.h"
#include "tests/backend_harness.h"

#define LN_EPS 1e-5f

static const int rows_list[] = {1, 7, 33};
static const int d_list[] = {1, 5, 64, 130, 600};
static const float p_list[] = {0.0f, 0.1f, 0.5f};

static luna_rng_key key_of(int salt) {
    luna_rng_key k = {.seed = 1234, .step = 7, .stream_id = 0x500000u + (uint32_t)salt};
    return k;
}

static float *copy(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    ck_assert_ptr_nonnull(y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static void expect_same(const float *got, const float *want, size_t n, const char *what,
                        const char *buf) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            ck_abort_msg("%s: %s[%zu] = %.9g (fused) vs %.9g (composition)", what, buf, i,
                         (double)got[i], (double)want[i]);
}

/* y [rows, d] += b [d]: one fp32 addition per element, as every bias add. */
static void add_bias(float *y, const float *b, int rows, int d) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < d; c++)
            y[(size_t)r * d + c] += b[c];
}

/* db [d] += Σ_rows dy: the bias gradient of the Linear (linear_backward with in = 0). */
static luna_status bias_grad(luna_backend *be, float *db, const float *dy, int rows, int d) {
    return be->ops->linear_backward(be, NULL, NULL, db, dy, NULL, NULL, rows, 0, d, false);
}

/* CPU backends with host memory (device memory is host memory on the CPU backend). */
static luna_backend *cpu(int threads) {
    luna_backend_options o = luna_backend_options_default();
    o.num_threads = threads;
    luna_backend *be = NULL;
    LUNA_CHECK_OK(luna_backend_create(&be, "cpu", &o));
    return be;
}

/* ---- residual_norm ----------------------------------------------------------------------------
 */

static void residual_norm_case(luna_backend *be, int rows, int d, float p, bool with_bias,
                               bool alias) {
    const size_t n = (size_t)rows * d;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 1000 + d * 10) + (with_bias ? 1 : 0));
    float *sub = luna_test_random_vector(&rng, n, -2, 2),
          *res = luna_test_random_vector(&rng, n, -1, 3);
    float *bias = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    float *g = luna_test_random_vector(&rng, (size_t)d, 0.5f, 1.5f);
    float *b = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    float *dy = luna_test_random_vector(&rng, n, -1, 1);
    float *acc0 = luna_test_random_vector(&rng, (size_t)d * 3, -1, 1); /* dgamma, dbeta, dbias */
    const float *bp = with_bias ? bias : NULL;
    const luna_rng_key key = key_of(d);
    char what[96];
    snprintf(what, sizeof what, "residual_norm rows %d d %d p %g%s%s", rows, d, (double)p,
             with_bias ? " bias" : "", alias ? " dres==dy" : "");
    /* the composition: the bias add, dropout, add, LayerNorm */
    float *t = copy(sub, n), *r0 = malloc(n * 4), *y0 = malloc(n * 4), *m0 = malloc(rows * 4),
          *s0 = malloc(rows * 4);
    if (bp) add_bias(t, bp, rows, d);
    if (p > 0) LUNA_CHECK_OK(be->ops->dropout_forward(be, t, t, (int64_t)n, p, key));
    LUNA_CHECK_OK(be->ops->add(be, r0, t, res, (int64_t)n));
    LUNA_CHECK_OK(lh_layer_norm_forward(be, y0, m0, s0, r0, g, b, rows, d, LN_EPS));
    float *r1 = malloc(n * 4), *y1 = malloc(n * 4), *m1 = malloc(rows * 4), *s1 = malloc(rows * 4);
    LUNA_CHECK_OK(be->ops->residual_norm_forward(be, y1, r1, m1, s1, sub, bp, res, g, b, rows, d,
                                                 LN_EPS, p, key));
    expect_same(r1, r0, n, what, "r");
    expect_same(y1, y0, n, what, "y");
    expect_same(m1, m0, (size_t)rows, what, "mean");
    expect_same(s1, s0, (size_t)rows, what, "rstd");
    /* backward: the LayerNorm backward, dropout_backward, linear_backward's bias sum */
    float *acc_c = copy(acc0, (size_t)d * 3), *acc_f = copy(acc0, (size_t)d * 3);
    float *dres0 = malloc(n * 4), *dsub0 = malloc(n * 4);
    LUNA_CHECK_OK(lh_layer_norm_backward(be, dres0, acc_c, acc_c + d, dy, r0, m0, s0, g, rows, d));
    if (p > 0)
        LUNA_CHECK_OK(be->ops->dropout_backward(be, dsub0, dres0, (int64_t)n, p, key));
    else
        memcpy(dsub0, dres0, n * 4);
    if (bp) LUNA_CHECK_OK(bias_grad(be, acc_c + 2 * d, dsub0, rows, d));
    float *dy1 = copy(dy, n), *dres1 = alias ? dy1 : malloc(n * 4), *dsub1 = malloc(n * 4);
    LUNA_CHECK_OK(be->ops->residual_norm_backward(be, dres1, dsub1, bp ? acc_f + 2 * d : NULL,
                                                  acc_f, acc_f + d, dy1, r1, m1, s1, g, rows, d, p,
                                                  key));
    expect_same(dres1, dres0, n, what, "dres");
    expect_same(dsub1, dsub0, n, what, "dsub");
    expect_same(acc_f, acc_c, (size_t)d * 3, what, "dgamma|dbeta|dbias");
    if (!alias) free(dres1);
    void *all[] = {sub, res, bias, g,  b,  dy,    acc0,  t,     r0,    y0,  m0,
                   s0,  r1,  y1,   m1, s1, acc_c, acc_f, dres0, dsub0, dy1, dsub1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* ---- bias_relu_dropout ------------------------------------------------------------------------
 */

static void bias_relu_dropout_case(luna_backend *be, int rows, int d, float p, bool with_bias,
                                   bool alias) {
    const size_t n = (size_t)rows * d;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 1000 + d * 10 + 3));
    float *h = luna_test_random_vector(&rng, n, -1, 1),
          *bias = luna_test_random_vector(&rng, d, -1, 1);
    float *da = luna_test_random_vector(&rng, n, -1, 1),
          *db0 = luna_test_random_vector(&rng, d, -1, 1);
    if (n > 2) h[1] = 0.0f; /* relu' at 0 is 0 */
    const float *bp = with_bias ? bias : NULL;
    const luna_rng_key key = key_of(d + 1);
    char what[96];
    snprintf(what, sizeof what, "bias_relu_dropout rows %d d %d p %g%s%s", rows, d, (double)p,
             with_bias ? " bias" : "", alias ? " dh==da" : "");
    float *h0 = copy(h, n), *a0 = malloc(n * 4);
    if (bp) add_bias(h0, bp, rows, d);
    LUNA_CHECK_OK(lh_relu_forward(be, a0, h0, (int64_t)n));
    if (p > 0) LUNA_CHECK_OK(be->ops->dropout_forward(be, a0, a0, (int64_t)n, p, key));
    float *h1 = copy(h, n), *a1 = malloc(n * 4);
    LUNA_CHECK_OK(be->ops->bias_relu_dropout_forward(be, a1, h1, bp, rows, d, p, key));
    expect_same(h1, h0, n, what, "h");
    expect_same(a1, a0, n, what, "a");
    /* backward: dropout_backward, relu_backward (at the kept h), the bias sum */
    float *dh0 = malloc(n * 4), *dbc = copy(db0, d), *dbf = copy(db0, d);
    if (p > 0)
        LUNA_CHECK_OK(be->ops->dropout_backward(be, dh0, da, (int64_t)n, p, key));
    else
        memcpy(dh0, da, n * 4);
    LUNA_CHECK_OK(lh_relu_backward(be, dh0, dh0, h0, (int64_t)n));
    if (bp) LUNA_CHECK_OK(bias_grad(be, dbc, dh0, rows, d));
    float *da1 = copy(da, n), *dh1 = alias ? da1 : malloc(n * 4);
    LUNA_CHECK_OK(
        be->ops->bias_relu_dropout_backward(be, dh1, bp ? dbf : NULL, da1, h1, rows, d, p, key));
    expect_same(dh1, dh0, n, what, "dh");
    expect_same(dbf, dbc, (size_t)d, what, "dbias");
    if (!alias) free(dh1);
    void *all[] = {h, bias, da, db0, h0, a0, h1, a1, dh0, dbc, dbf, da1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* ---- softmax_dropout --------------------------------------------------------------------------
 */

typedef struct {
    int group, causal;
    bool masked;
} sm_mask;

static void softmax_dropout_case(luna_backend *be, int rows, int cols, float p, const sm_mask *mk,
                                 bool alias) {
    const size_t n = (size_t)rows * cols;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 1000 + cols * 10 + 5));
    float *x = luna_test_random_vector(&rng, n, -6, 6),
          *dyd = luna_test_random_vector(&rng, n, -1, 1);
    const int groups = (rows + mk->group - 1) / mk->group;
    int32_t *valid = malloc(sizeof(int32_t) * (size_t)groups);
    for (int g = 0; g < groups; g++)
        valid[g] = g == 1 ? 0 : (g * 7 + 3) % (cols + 1); /* group 1 attends to nothing */
    const int32_t *vp = mk->masked ? valid : NULL;
    const luna_rng_key key = key_of(cols + 2);
    char what[112];
    snprintf(what, sizeof what, "softmax_dropout rows %d cols %d p %g%s%s%s", rows, cols, (double)p,
             mk->masked ? " masked" : "", mk->causal ? " causal" : "",
             alias ? " dx==dyd, y==x" : "");
    float *y0 = malloc(n * 4), *yd0 = malloc(n * 4);
    LUNA_CHECK_OK(be->ops->softmax_forward(be, y0, x, rows, cols, vp, mk->group, mk->causal));
    LUNA_CHECK_OK(be->ops->dropout_forward(be, yd0, y0, (int64_t)n, p, key));
    float *x1 = copy(x, n), *y1 = alias ? x1 : malloc(n * 4), *yd1 = malloc(n * 4);
    LUNA_CHECK_OK(be->ops->softmax_dropout_forward(be, y1, yd1, x1, rows, cols, vp, mk->group,
                                                   mk->causal, p, key));
    expect_same(y1, y0, n, what, "y");
    if (p > 0) expect_same(yd1, yd0, n, what, "yd");
    /* yd NULL: only y */
    float *y2 = malloc(n * 4);
    LUNA_CHECK_OK(be->ops->softmax_dropout_forward(be, y2, NULL, x, rows, cols, vp, mk->group,
                                                   mk->causal, p, key));
    expect_same(y2, y0, n, what, "y (yd NULL)");
    /* backward: dropout_backward, the softmax backward */
    float *dx0 = malloc(n * 4);
    LUNA_CHECK_OK(be->ops->dropout_backward(be, dx0, dyd, (int64_t)n, p, key));
    LUNA_CHECK_OK(lh_softmax_backward(be, dx0, dx0, y0, rows, cols));
    float *dyd1 = copy(dyd, n), *dx1 = alias ? dyd1 : malloc(n * 4);
    LUNA_CHECK_OK(be->ops->softmax_dropout_backward(be, dx1, dyd1, y1, rows, cols, p, key));
    expect_same(dx1, dx0, n, what, "dx");
    if (!alias) free(y1), free(dx1);
    void *all[] = {x, dyd, valid, y0, yd0, x1, yd1, y2, dx0, dyd1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static const sm_mask masks[] = {{1, 0, false}, {3, 0, true}, {1, 5, false}, {4, 7, true}};

START_TEST(fused_ops_equal_the_composition_bit_for_bit_on_cpu) {
    for (int threads = 1; threads <= 3; threads += 2) {
        luna_backend *be = cpu(threads);
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
            for (size_t di = 0; di < sizeof d_list / sizeof d_list[0]; di++)
                for (size_t pi = 0; pi < sizeof p_list / sizeof p_list[0]; pi++)
                    for (int v = 0; v < 4; v++) {
                        const int rows = rows_list[ri], d = d_list[di];
                        const float p = p_list[pi];
                        residual_norm_case(be, rows, d, p, v & 1, v & 2);
                        bias_relu_dropout_case(be, rows, d, p, v & 1, v & 2);
                        softmax_dropout_case(be, rows, d, p, &masks[v], v & 1);
                    }
        luna_backend_free(be);
    }
}
END_TEST

/* A bigger case, past the ops' one-thread threshold (rows · d ≥ 32768): the parallel row loops
 * and column tiles with 3 threads give the composition's bits. */
START_TEST(fused_ops_bit_exact_when_parallel) {
    luna_backend *be = cpu(3);
    residual_norm_case(be, 97, 515, 0.1f, true, false);
    bias_relu_dropout_case(be, 97, 515, 0.1f, true, true);
    softmax_dropout_case(be, 97, 515, 0.1f, &masks[3], true);
    luna_backend_free(be);
}
END_TEST

/* A p outside [0, 1) is an error, as for dropout_forward. */
START_TEST(fused_ops_reject_bad_arguments) {
    luna_backend *be = lh_backend(1);
    float *x = lh_f32(be, NULL, 8), *y = lh_f32(be, NULL, 8), *w = lh_f32(be, NULL, 8);
    float *st = lh_f32(be, NULL, 8);
    const luna_rng_key k = key_of(0);
    ck_assert_int_ne(
        be->ops->residual_norm_forward(be, y, w, st, st, x, NULL, x, x, x, 2, 4, LN_EPS, 1.0f, k),
        LUNA_OK);
    ck_assert_int_ne(be->ops->bias_relu_dropout_forward(be, y, w, NULL, 2, 4, -0.1f, k), LUNA_OK);
    ck_assert_int_ne(be->ops->softmax_dropout_forward(be, y, w, x, 2, 4, NULL, 1, 0, 1.5f, k),
                     LUNA_OK);
    ck_assert_int_ne(be->ops->softmax_dropout_backward(be, y, x, w, -1, 4, 0.1f, k), LUNA_OK);
    lh_free(be, x), lh_free(be, y), lh_free(be, w), lh_free(be, st);
    luna_backend_free(be);
}
END_TEST

/* ---- the backend under test against the CPU reference -----------------------------------------
 */

typedef struct {
    int rows, d;
    float p;
    bool bias, alias;
    const sm_mask *mk;
} cmp_args;

static luna_status cmp_rn_fwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *a = args; /* sub res bias g b | y r mean rstd */
    return be->ops->residual_norm_forward(be, v[5], v[6], v[7], v[8], v[0], a->bias ? v[2] : NULL,
                                          v[1], v[3], v[4], a->rows, a->d, LN_EPS, a->p,
                                          key_of(a->d));
}
static luna_status cmp_rn_bwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *a = args; /* r mean rstd g | dy(dres if alias) dres dsub dg db dbias */
    void *dres = a->alias ? v[4] : v[5];
    return be->ops->residual_norm_backward(be, dres, v[6], a->bias ? v[9] : NULL, v[7], v[8], v[4],
                                           v[0], v[1], v[2], v[3], a->rows, a->d, a->p,
                                           key_of(a->d));
}
static luna_status cmp_brd_fwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *a = args; /* bias | h a */
    return be->ops->bias_relu_dropout_forward(be, v[2], v[1], a->bias ? v[0] : NULL, a->rows, a->d,
                                              a->p, key_of(a->d + 1));
}
static luna_status cmp_brd_bwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *a = args; /* h | da dh dbias */
    return be->ops->bias_relu_dropout_backward(be, a->alias ? v[1] : v[2], a->bias ? v[3] : NULL,
                                               v[1], v[0], a->rows, a->d, a->p, key_of(a->d + 1));
}
static luna_status cmp_smd_fwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *a = args; /* valid | x y yd */
    const sm_mask *mk = a->mk;
    return be->ops->softmax_dropout_forward(be, a->alias ? v[1] : v[2], v[3], v[1], a->rows, a->d,
                                            mk->masked ? v[0] : NULL, mk->group, mk->causal, a->p,
                                            key_of(a->d + 2));
}
static luna_status cmp_smd_bwd(luna_backend *be, void *const *v, const void *args) {
    const cmp_args *a = args; /* y | dyd dx */
    return be->ops->softmax_dropout_backward(be, a->alias ? v[1] : v[2], v[1], v[0], a->rows, a->d,
                                             a->p, key_of(a->d + 2));
}

static void compare_case(int rows, int d, float p, int v) {
    const size_t n = (size_t)rows * d;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)(rows * 977 + d * 31 + v));
    float *a1 = luna_test_random_vector(&rng, n, -2, 2),
          *a2 = luna_test_random_vector(&rng, n, -1, 3);
    float *vb = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    float *g = luna_test_random_vector(&rng, (size_t)d, 0.5f, 1.5f);
    float *b = luna_test_random_vector(&rng, (size_t)d, -1, 1);
    float *dy = luna_test_random_vector(&rng, n, -1, 1);
    float *acc = luna_test_random_vector(&rng, (size_t)d * 3, -1, 1);
    cmp_args a = {rows, d, p, v & 1, (v & 2) != 0, &masks[v]};
    char what[96];
    snprintf(what, sizeof what, "rows %d d %d p %g case %d", rows, d, (double)p, v);
    /* residual_norm: the backward from the reference's r, mean, rstd */
    luna_backend *ref = lh_reference();
    float *r = malloc(n * 4), *mean = malloc(rows * 4), *rstd = malloc(rows * 4),
          *y = malloc(n * 4);
    LUNA_CHECK_OK(ref->ops->residual_norm_forward(ref, y, r, mean, rstd, a1, vb, a2, g, b, rows, d,
                                                  LN_EPS, p, key_of(d)));
    lh_buf fw[] = {{a1, n, LH_F32, LH_IN},
                   {a2, n, LH_F32, LH_IN},
                   {vb, (size_t)d, LH_F32, LH_IN},
                   {g, (size_t)d, LH_F32, LH_IN},
                   {b, (size_t)d, LH_F32, LH_IN},
                   {NULL, n, LH_F32, LH_OUT},
                   {NULL, n, LH_F32, LH_OUT},
                   {NULL, (size_t)rows, LH_F32, LH_OUT},
                   {NULL, (size_t)rows, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("residual_norm_forward", what, 2, cmp_rn_fwd, &a, fw, 9), LUNA_OK);
    lh_buf bw[] = {{r, n, LH_F32, LH_IN},
                   {mean, (size_t)rows, LH_F32, LH_IN},
                   {rstd, (size_t)rows, LH_F32, LH_IN},
                   {g, (size_t)d, LH_F32, LH_IN},
                   {dy, n, LH_F32, a.alias ? LH_OUT : LH_IN},
                   {NULL, n, LH_F32, LH_OUT},
                   {NULL, n, LH_F32, LH_OUT},
                   {acc, (size_t)d, LH_F32, LH_OUT},
                   {acc + d, (size_t)d, LH_F32, LH_OUT},
                   {acc + 2 * d, (size_t)d, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("residual_norm_backward", what, 2, cmp_rn_bwd, &a, bw, 10),
                     LUNA_OK);
    /* bias_relu_dropout */
    lh_buf bf[] = {
        {vb, (size_t)d, LH_F32, LH_IN}, {a1, n, LH_F32, LH_OUT}, {NULL, n, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("bias_relu_dropout_forward", what, 2, cmp_brd_fwd, &a, bf, 3),
                     LUNA_OK);
    lh_buf bb[] = {{a1, n, LH_F32, LH_IN},
                   {dy, n, LH_F32, a.alias ? LH_OUT : LH_IN},
                   {NULL, n, LH_F32, LH_OUT},
                   {acc, (size_t)d, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("bias_relu_dropout_backward", what, 2, cmp_brd_bwd, &a, bb, 4),
                     LUNA_OK);
    /* softmax_dropout: masks by group, causal; the backward from the reference's y */
    const int groups = (rows + a.mk->group - 1) / a.mk->group;
    int32_t *valid = malloc(sizeof(int32_t) * (size_t)groups);
    for (int k = 0; k < groups; k++)
        valid[k] = k == 1 ? 0 : (k * 7 + 3) % (d + 1);
    float *sx = luna_test_random_vector(&rng, n, -6, 6), *sy = malloc(n * 4);
    LUNA_CHECK_OK(ref->ops->softmax_dropout_forward(ref, sy, NULL, sx, rows, d,
                                                    a.mk->masked ? valid : NULL, a.mk->group,
                                                    a.mk->causal, p, key_of(d + 2)));
    lh_buf sf[] = {{valid, (size_t)groups, LH_I32, LH_IN},
                   {sx, n, LH_F32, a.alias ? LH_OUT : LH_IN},
                   {NULL, n, LH_F32, LH_OUT},
                   {NULL, n, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("softmax_dropout_forward", what, 2, cmp_smd_fwd, &a, sf, 4),
                     LUNA_OK);
    lh_buf sb[] = {{sy, n, LH_F32, LH_IN},
                   {dy, n, LH_F32, a.alias ? LH_OUT : LH_IN},
                   {NULL, n, LH_F32, LH_OUT}};
    ck_assert_int_eq(lh_compare("softmax_dropout_backward", what, 2, cmp_smd_bwd, &a, sb, 3),
                     LUNA_OK);
    luna_backend_free(ref);
    void *all[] = {a1, a2, vb, g, b, dy, acc, r, mean, rstd, y, valid, sx, sy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

START_TEST(fused_ops_match_reference_backend) {
    /* 4200 rows: column sums over 66 chunks (model/kernels/column_sum_order.h), 40 columns;
     * 1100 columns: rows longer than a GPU gives one warp (a block per row there); 131 × 520: a
     * lane's three runs of 8, the last one partial (residual_norm's backward with its column
     * sums in the row pass on a GPU: rows a multiple of 8 wide) over two chunks and a part */
    static const int shapes[][2] = {{1, 1},     {7, 5},    {33, 64},  {7, 130},
                                    {4200, 40}, {3, 1100}, {131, 520}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int v = 0; v < 4; v++)
            compare_case(shapes[s][0], shapes[s][1], v == 3 ? 0.5f : (v == 0 ? 0.0f : 0.1f), v);
}
END_TEST

static Suite *fused_suite(void) {
    Suite *s = suite_create("ops_fused");
    TCase *tc = tcase_create("fused");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, fused_ops_equal_the_composition_bit_for_bit_on_cpu);
    tcase_add_test(tc, fused_ops_bit_exact_when_parallel);
    tcase_add_test(tc, fused_ops_reject_bad_arguments);
    tcase_add_test(tc, fused_ops_match_reference_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(fused_suite()); }
