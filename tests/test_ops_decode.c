/* Tests of the decoding ops (core/backend.h, "Decoding"; model/kernels/cpu/decode_select.c):
 * gather_rows (index-select with repeats and permutations, idx NULL as a strided copy, padding
 * between rows untouched, bad sizes rejected) and log_softmax_topk (the k best log-probs of each
 * row against a host reference computed in double as documented: best first, ties by lower index,
 * NaN as -inf, the bias banning and penalising tokens, pick/picked unbiased) and cache_products
 * (a step's attention products over a beam-indirect cache, whole histories or pages of positions
 * per slot: against a double-precision loop over the indexed rows, and on the CPU bit-equal to
 * the one-row gemm over a gathered copy), cache_write and cross_attention (each row against its
 * sentence's source: a double-precision loop, and on the CPU bit-equal to the chains the op
 * promises). Each against a host loop on the backend under test (LUNA_TEST_BACKEND) and, EXACT,
 * against the CPU reference. Ops get device buffers from the harness (tests/backend_harness.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/exp_double.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "tests/backend_harness.h"

/* ---- gather_rows ------------------------------------------------------------------------------
 */
typedef struct {
    int64_t dst_stride, src_stride, n, cols;
    bool with_idx;
} gather_args;

/* d[0] dst [n, dst_stride], d[1] src [src_rows, src_stride], d[2] idx [n]. */
static luna_status run_gather(luna_backend *be, void *const *d, const void *args) {
    const gather_args *a = args;
    return be->ops->gather_rows(be, d[0], a->dst_stride, d[1], a->src_stride,
                                a->with_idx ? d[2] : NULL, a->n, a->cols);
}

/* One case on the backend under test: dst (prefilled with `dst0`) against a host loop, everything
 * outside the gathered columns untouched; then the same case against the CPU reference. */
static void check_gather(const int32_t *idx, int src_rows, int64_t n, int64_t cols,
                         int64_t dst_stride, int64_t src_stride, uint64_t seed) {
    size_t nsrc = (size_t)(src_rows * src_stride), ndst = (size_t)(n * dst_stride);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *src = luna_test_random_vector(&rng, nsrc, -4, 4);
    float *dst0 = luna_test_random_vector(&rng, ndst, 10, 20); /* disjoint from src's values */
    float *got = malloc((ndst ? ndst : 1) * sizeof *got);
    ck_assert_ptr_nonnull(got);
    char what[96];
    snprintf(what, sizeof what, "n %lld cols %lld strides %lld/%lld %s", (long long)n,
             (long long)cols, (long long)dst_stride, (long long)src_stride,
             idx ? "idx" : "idx NULL");

    luna_backend *be = lh_backend(2);
    float *vdst = lh_f32(be, dst0, ndst), *vsrc = lh_f32(be, src, nsrc);
    int32_t *vidx = idx ? lh_i32(be, idx, (size_t)n) : NULL;
    LUNA_CHECK_OK(be->ops->gather_rows(be, vdst, dst_stride, vsrc, src_stride, vidx, n, cols));
    lh_download(be, got, vdst, ndst * sizeof *got);
    for (int64_t i = 0; i < n; i++) {
        int64_t from = idx ? idx[i] : i;
        for (int64_t c = 0; c < dst_stride; c++) {
            float want = c < cols ? src[from * src_stride + c] : dst0[i * dst_stride + c];
            LUNA_EXPECT(memcmp(&got[i * dst_stride + c], &want, sizeof want) == 0,
                        "gather_rows [%s]: dst[%lld][%lld] = %.9g, want %.9g", what, (long long)i,
                        (long long)c, (double)got[i * dst_stride + c], (double)want);
        }
    }
    lh_free(be, vdst);
    lh_free(be, vsrc);
    lh_free(be, vidx);
    luna_backend_free(be);

    gather_args a = {dst_stride, src_stride, n, cols, idx != NULL};
    int32_t none = 0;
    lh_buf bufs[] = {{dst0, ndst, LH_F32, LH_OUT},
                     {src, nsrc, LH_F32, LH_IN},
                     {idx ? idx : &none, idx ? (size_t)n : 1, LH_I32, LH_IN}};
    ck_assert_int_eq(lh_compare("gather_rows", what, 2, run_gather, &a, bufs, 3), LUNA_OK);
    free(src);
    free(dst0);
    free(got);
}

START_TEST(gather_rows_values_and_reference) {
    const int64_t n = 7, cols = 13;
    static const int32_t perm[7] = {6, 2, 0, 5, 1, 3, 4};     /* a permutation of 7 source rows */
    static const int32_t repeats[7] = {3, 3, 0, 8, 3, 10, 0}; /* repeats, out of 11 source rows */
    static const int strides[] = {13, 17, 29};
    uint64_t seed = 1;
    for (int ds = 0; ds < 3; ds++)
        for (int ss = 0; ss < 3; ss++) {
            check_gather(perm, 7, n, cols, strides[ds], strides[ss], seed++);
            check_gather(repeats, 11, n, cols, strides[ds], strides[ss], seed++);
            check_gather(NULL, 7, n, cols, strides[ds], strides[ss], seed++); /* strided copy */
        }
    /* Large enough for the threaded path (n·cols ≥ 65536), reversed. */
    int32_t rev[300];
    for (int i = 0; i < 300; i++)
        rev[i] = 299 - i;
    check_gather(rev, 300, 300, 250, 251, 257, seed++);
    /* Nothing to do: n = 0, cols = 0. */
    check_gather(perm, 7, 0, cols, 17, 13, seed++);
    check_gather(perm, 7, n, 0, 17, 13, seed++);
}
END_TEST

START_TEST(gather_rows_rejects_bad_sizes) {
    static const int32_t idx[7] = {0, 1, 2, 3, 4, 5, 6};
    static const int64_t bad[][4] = {/* dst_stride, src_stride, n, cols */
                                     {13, 13, -1, 13},
                                     {13, 13, 7, -1},
                                     {12, 13, 7, 13},
                                     {13, 12, 7, 13},
                                     {-5, 13, 7, 13}};
    float src[7 * 13], dst[7 * 13];
    for (int i = 0; i < 7 * 13; i++) {
        src[i] = (float)i;
        dst[i] = -1.0f;
    }
    luna_backend *be = lh_backend(1);
    float *vdst = lh_f32(be, dst, 7 * 13), *vsrc = lh_f32(be, src, 7 * 13);
    int32_t *vidx = lh_i32(be, idx, 7);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const int64_t *b = bad[k];
        luna_status st = be->ops->gather_rows(be, vdst, b[0], vsrc, b[1], vidx, b[2], b[3]);
        ck_assert_msg(st == LUNA_ERR_INVALID_ARGUMENT, "case %zu: status %d", k, st);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "gather_rows"));
        luna_error_clear();
        /* and the same status on the reference */
        gather_args a = {b[0], b[1], b[2], b[3], true};
        lh_buf bufs[] = {
            {dst, 7 * 13, LH_F32, LH_OUT}, {src, 7 * 13, LH_F32, LH_IN}, {idx, 7, LH_I32, LH_IN}};
        ck_assert_int_eq(lh_compare("gather_rows", "bad sizes", 1, run_gather, &a, bufs, 3),
                         LUNA_ERR_INVALID_ARGUMENT);
    }
    float got[7 * 13];
    lh_download(be, got, vdst, sizeof got);
    ck_assert_int_eq(memcmp(got, dst, sizeof got), 0); /* untouched */
    lh_free(be, vdst);
    lh_free(be, vsrc);
    lh_free(be, vidx);
    luna_backend_free(be);
}
END_TEST

/* ---- log_softmax_topk --------------------------------------------------------------------------
 * The host reference, exactly as core/backend.h documents it: per row, in double,
 *   lse = max + log Σ exp(x − max),  lp_j = (float)(x_j − lse) + bias[j]  (NaN: −inf),
 * all V sorted by lp descending, then j ascending (ties by lower index), the first k kept; picked
 * without the bias. */
typedef struct {
    float lp;
    int32_t j;
} scored;

static int by_lp_then_index(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    if (a->lp != b->lp) return a->lp > b->lp ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

static void topk_reference(const float *x, const float *bias, int V, int k, const int32_t *pick,
                           float *top_lp, int32_t *top_idx, float *picked) {
    float mx = -INFINITY;
    for (int j = 0; j < V; j++)
        mx = fmaxf(mx, x[j]);
    double sum = 0.0;
    for (int j = 0; j < V; j++)
        sum += exp((double)x[j] - (double)mx);
    const double lse = (double)mx + log(sum);
    if (pick) *picked = (float)((double)x[*pick] - lse);
    scored *all = malloc((size_t)V * sizeof *all);
    ck_assert_ptr_nonnull(all);
    for (int j = 0; j < V; j++) {
        float lp = (float)((double)x[j] - lse);
        if (bias) lp += bias[j];
        all[j] = (scored){isnan(lp) ? -INFINITY : lp, j};
    }
    qsort(all, (size_t)V, sizeof *all, by_lp_then_index);
    for (int i = 0; i < k; i++) {
        top_lp[i] = all[i].lp;
        top_idx[i] = all[i].j;
    }
    free(all);
}

typedef struct {
    int64_t rows;
    int V, k;
    bool with_bias, with_pick;
} topk_args;

/* d[0] logits [rows, V], d[1] bias [V], d[2] top_lp [rows, k], d[3] top_idx [rows, k],
 * d[4] pick [rows], d[5] picked [rows]. */
static luna_status run_topk(luna_backend *be, void *const *d, const void *args) {
    const topk_args *a = args;
    return be->ops->log_softmax_topk(be, d[0], a->with_bias ? d[1] : NULL, a->rows, a->V, a->k,
                                     a->k ? d[2] : NULL, a->k ? d[3] : NULL,
                                     a->with_pick ? d[4] : NULL, a->with_pick ? d[5] : NULL);
}

/* Same bits, or both NaN (a NaN's payload is not specified). */
static bool same_float(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

/* Logits with exact ties (values on a grid of 1/4), a row with a NaN logit, and a bias with bans
 * (−inf), penalties, a NaN entry and a penalty on the picked token. */
static void make_topk_inputs(int rows, int V, uint64_t seed, float *x, float *bias, int32_t *pick) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < V; j++) {
            float u = luna_test_uniform(&rng, 0, 1);
            x[(size_t)r * V + j] = r == 1 ? floorf(u * 3.0f) * 0.5f /* few values: many ties */
                                          : floorf(u * 24.0f) * 0.25f - 3.0f;
        }
    if (rows > 3) x[(size_t)3 * V + V / 2] = NAN; /* row 3: every lp NaN, returned as −inf */
    if (rows > 4)
        for (int j = 0; j < V; j++) /* row 4: one clear winner and a run of ties after it */
            x[(size_t)4 * V + j] = j == V - 1 ? 5.0f : j % 2 ? 1.0f : -1.0f;
    for (int j = 0; j < V; j++)
        bias[j] = 0.0f;
    bias[V - 1] = -INFINITY; /* banned: row 4's winner drops to the end */
    bias[2 % V] = -0.75f;    /* penalties on the grid: ties with other tokens */
    bias[5 % V] = -0.25f;
    if (V > 8) bias[7] = NAN; /* lp NaN: −inf */
    for (int r = 0; r < rows; r++)
        pick[r] = (int32_t)((r * 7 + 2) % V); /* row 0 picks token 2: penalised, picked is not */
}

/* The CPU's fp32 kernel for check_topk's backend (LUNA_F32_*; −2: the backend's default): the
 * AVX2 and AVX-512 log-softmax + top-k both meet the reference on a CPU that has both. */
static int topk_f32_kernel = -2;

/* stacked: each row's best tokens all share one residue mod 256 (the CUDA block kernel's lists
 * are per residue: one of them runs out while it dropped tokens, and that row is selected by a
 * heap instead), with ties among them. */
static void check_topk(int rows, int V, int k, bool with_bias, bool with_pick, uint64_t seed,
                       bool stacked) {
    size_t nx = (size_t)rows * V, nk = (size_t)rows * k;
    float *x = malloc(nx * sizeof *x), *bias = malloc((size_t)V * sizeof *bias);
    int32_t *pick = malloc((size_t)rows * sizeof *pick);
    float *want_lp = malloc((nk ? nk : 1) * sizeof(float)), *got_lp = malloc((nk ? nk : 1) * 4);
    int32_t *want_idx = malloc((nk ? nk : 1) * 4), *got_idx = malloc((nk ? nk : 1) * 4);
    float want_picked[8], got_picked[8];
    ck_assert_int_le(rows, 8);
    ck_assert(x && bias && pick && want_lp && got_lp && want_idx && got_idx);
    make_topk_inputs(rows, V, seed, x, bias, pick);
    for (int r = 0; stacked && r < rows; r++)
        for (int j = r % 3; j < V; j += 256)
            x[(size_t)r * V + j] = 20.0f + (float)((j / 256) % 7); /* 7 values: ties */

    for (int r = 0; r < rows; r++)
        topk_reference(x + (size_t)r * V, with_bias ? bias : NULL, V, k,
                       with_pick ? &pick[r] : NULL, want_lp + (size_t)r * k,
                       want_idx + (size_t)r * k, &want_picked[r]);
    char what[96];
    snprintf(what, sizeof what, "rows %d V %d k %d%s%s%s", rows, V, k, with_bias ? " bias" : "",
             with_pick ? " pick" : "", stacked ? " stacked" : "");

    luna_backend *be = lh_backend(2);
    if (topk_f32_kernel != -2 && be->device == LUNA_DEVICE_CPU)
        LUNA_CHECK_OK(luna_cpu_set_f32_kernel(be, topk_f32_kernel));
    float *vx = lh_f32(be, x, nx), *vbias = lh_f32(be, bias, (size_t)V);
    float *vlp = k ? lh_alloc(be, nk * 4) : NULL;
    int32_t *vidx = k ? lh_alloc(be, nk * 4) : NULL;
    int32_t *vpick = lh_i32(be, pick, (size_t)rows);
    float *vpicked = lh_alloc(be, (size_t)rows * 4);
    LUNA_CHECK_OK(be->ops->log_softmax_topk(be, vx, with_bias ? vbias : NULL, rows, V, k, vlp, vidx,
                                            with_pick ? vpick : NULL, with_pick ? vpicked : NULL));
    if (k) {
        lh_download(be, got_lp, vlp, nk * 4);
        lh_download(be, got_idx, vidx, nk * 4);
    }
    if (with_pick) lh_download(be, got_picked, vpicked, (size_t)rows * 4);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < k; i++) {
            size_t e = (size_t)r * k + (size_t)i;
            LUNA_EXPECT(got_idx[e] == want_idx[e] && same_float(got_lp[e], want_lp[e]),
                        "log_softmax_topk [%s]: row %d rank %d: token %d lp %.9g, want token %d "
                        "lp %.9g",
                        what, r, i, got_idx[e], (double)got_lp[e], want_idx[e], (double)want_lp[e]);
        }
        if (with_pick)
            LUNA_EXPECT(same_float(got_picked[r], want_picked[r]),
                        "log_softmax_topk [%s]: picked[%d] (token %d) = %.9g, want %.9g", what, r,
                        pick[r], (double)got_picked[r], (double)want_picked[r]);
    }
    void *all[] = {vx, vbias, vlp, vidx, vpick, vpicked};
    for (int i = 0; i < 6; i++)
        lh_free(be, all[i]);
    luna_backend_free(be);

    /* EXACT against the CPU reference (rows are independent: no reduction order to differ). */
    topk_args a = {rows, V, k, with_bias, with_pick};
    lh_buf bufs[] = {{x, nx, LH_F32, LH_IN},
                     {bias, (size_t)V, LH_F32, LH_IN},
                     {NULL, nk ? nk : 1, LH_F32, LH_OUT},
                     {NULL, nk ? nk : 1, LH_I32, LH_OUT},
                     {pick, (size_t)rows, LH_I32, LH_IN},
                     {NULL, (size_t)rows, LH_F32, with_pick ? LH_OUT : LH_IN}};
    ck_assert_int_eq(lh_compare("log_softmax_topk", what, 2, run_topk, &a, bufs, 6), LUNA_OK);
    free(x);
    free(bias);
    free(pick);
    free(want_lp);
    free(got_lp);
    free(want_idx);
    free(got_idx);
}

START_TEST(log_softmax_topk_matches_host_reference) {
    static const int Vs[] = {37, 1000}, Vk[] = {13, 37, 1000};
    uint64_t seed = 100;
    /* on a CPU backend: each vector kernel the CPU has, forced (the default is the widest) */
    luna_backend *cpu = NULL;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    for (int kern = LUNA_F32_AVX2; kern <= LUNA_F32_AVX512; kern++)
        if (!strcmp(lh_backend_name(), "cpu") && luna_cpu_set_f32_kernel(cpu, kern) == LUNA_OK) {
            topk_f32_kernel = kern;
            for (int v = 0; v < 3; v++)
                for (int mode = 0; mode < 4; mode++)
                    check_topk(5, Vk[v], 8, mode & 1, mode & 2, seed++, false);
            check_topk(8, 10000, 8, true, true, seed++, false);
            printf("log_softmax_topk: the %s kernel checked\n", luna_cpu_f32_kernel_name(kern));
        }
    luna_backend_free(cpu);
    topk_f32_kernel = -2;
    for (int v = 0; v < 2; v++) {
        int V = Vs[v];
        /* 32 and 33: the CUDA kernel's per-thread lists hold 32; above, its row-per-thread path */
        const int ks[] = {0, 1, 8, 32, 33, V};
        for (int ki = 0; ki < 6; ki++)
            for (int mode = 0; mode < 4; mode++)
                check_topk(5, V, ks[ki], mode & 1, mode & 2, seed++, false);
    }
    /* rows·V ≥ 16384: the CPU's threaded path (2 threads against the 1-thread reference). */
    check_topk(8, 10000, 8, true, true, seed++, false);
    check_topk(8, 10000, 10000, false, true, seed++, false);
    /* above 32 by the block kernel (n-gram bans: k = 2·beam + bans), up to its 256, and above:
     * random rows, and rows whose best tokens share one residue mod 256 */
    for (int stacked = 0; stacked < 2; stacked++) {
        check_topk(6, 10000, 40, true, true, seed++, stacked);
        check_topk(6, 10000, 256, false, true, seed++, stacked);
        check_topk(3, 10000, 300, true, false, seed++, stacked);
    }
}
END_TEST

/* The AVX2 and AVX-512 log-softmax + top-k give the same bits, and the right maximum, where a
 * row's one clear maximum sits at any place of the vectorised maximum's blocks of 64 (every
 * quarter) and in the tail past them. The maximum is 1000 above the rest: lse is then exactly it
 * (every other term underflows), and a maximum taken without it overflows the Σ exp. */
START_TEST(log_softmax_topk_kernels_agree) {
    enum { R = 8, V = 1000, K = 8 };
    static const int peak[R] = {3, 21, 37, 59, 84, 500, 960, 999};
    float *x = malloc(sizeof(float) * R * V), lp[2][R * K], picked[2][R];
    int32_t idx[2][R * K], pick[R];
    ck_assert_ptr_nonnull(x);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 11);
    for (int r = 0; r < R; r++) {
        for (int j = 0; j < V; j++)
            x[r * V + j] = luna_test_uniform(&rng, -3.0f, 3.0f);
        x[r * V + peak[r]] = 1000.0f;
        pick[r] = peak[r];
    }
    int ran = 0;
    for (int kern = LUNA_F32_AVX2; kern <= LUNA_F32_AVX512; kern++) {
        luna_backend *be = NULL;
        LUNA_CHECK_OK(luna_backend_cpu_create(&be, 1));
        if (luna_cpu_set_f32_kernel(be, kern) == LUNA_OK) {
            LUNA_CHECK_OK(be->ops->log_softmax_topk(be, (const luna_act *)x, NULL, R, V, K, lp[ran],
                                                    idx[ran], pick, picked[ran]));
            ran++;
        }
        luna_backend_free(be);
    }
    for (int i = 0; i < ran; i++) /* each kernel: the peak first, at log-prob 0 */
        for (int r = 0; r < R; r++) {
            ck_assert_int_eq(idx[i][r * K], peak[r]);
            ck_assert_msg(lp[i][r * K] == 0.0f && picked[i][r] == 0.0f,
                          "kernel %d row %d: lp %g, picked %g", i, r, (double)lp[i][r * K],
                          (double)picked[i][r]);
        }
    if (ran == 2) {
        ck_assert_msg(memcmp(lp[0], lp[1], sizeof lp[0]) == 0, "top log-probs differ");
        ck_assert_msg(memcmp(idx[0], idx[1], sizeof idx[0]) == 0, "top tokens differ");
        ck_assert_msg(memcmp(picked[0], picked[1], sizeof picked[0]) == 0, "picked differ");
    } else {
        printf("log_softmax_topk_kernels_agree: only %d of the AVX2 and AVX-512 kernels on this "
               "CPU: compared with nothing\n",
               ran);
    }
    free(x);
}
END_TEST

/* The CPU's Σ exp (scalar, and AVX2 and AVX-512 where present) against the documented lanes of
 * luna_exp_nonpositive, bit for bit: the CUDA kernel sums the same lanes with the same function,
 * so the two backends' lse agree. Lengths around the vector widths; terms below exp(−708), −inf. */
START_TEST(sum_exp_lanes_equal_scalar) {
    static const int Vs[] = {1, 3, 4, 5, 7, 8, 12, 15, 37, 1000, 7792};
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    float *x = malloc(7792 * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (int v = 0; v < (int)(sizeof Vs / sizeof Vs[0]); v++) {
        const int V = Vs[v];
        for (int j = 0; j < V; j++)
            x[j] = luna_test_uniform(&rng, -30.0f, 12.0f);
        if (V > 4) x[V - 2] = -1000.0f, x[1] = -INFINITY;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = x[j] > mx ? x[j] : mx;
        double lane[4] = {0, 0, 0, 0};
        for (int j = 0; j < V; j++) /* the last V mod 4 terms in lane 0 */
            lane[j < V - V % 4 ? j % 4 : 0] += luna_exp_nonpositive((double)x[j] - (double)mx);
        const double want = (lane[0] + lane[1]) + (lane[2] + lane[3]);
        /* OPENBLAS: the scalar loop; a kernel the CPU lacks runs the next narrower one */
        for (int kern = LUNA_F32_OPENBLAS; kern <= LUNA_F32_AVX512; kern++) {
            const double got = luna_cpu_sum_exp(x, V, mx, kern);
            ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "V %d, %s: Σ exp %.17g, want %.17g",
                          V, luna_cpu_f32_kernel_name(kern), got, want);
        }
    }
    free(x);
}
END_TEST

/* The properties the reference encodes, checked on hand-made rows (so that a wrong reference
 * cannot hide a wrong op): ties by lower index, a ban, a penalty, NaN last, picked unbiased. */
START_TEST(log_softmax_topk_known_values) {
    enum { V = 6 };
    /* row 0: ties 2.0 at j = 1, 3, 4; row 1: all equal; row 2: a NaN logit */
    const float x[3 * V] = {0.0f, 2.0f, 1.0f, 2.0f, 2.0f, -1.0f, 0.5f, 0.5f, 0.5f,
                            0.5f, 0.5f, 0.5f, 1.0f, NAN,  3.0f,  0.0f, 0.0f, 0.0f};
    /* bias: token 4 banned, token 3 penalised */
    const float bias[V] = {0.0f, 0.0f, 0.0f, -0.5f, -INFINITY, 0.0f};
    const int32_t pick[3] = {4, 0, 2};
    float lp[3 * V], picked[3];
    int32_t idx[3 * V];
    luna_backend *be = lh_backend(1);
    float *vx = lh_f32(be, x, 3 * V), *vb = lh_f32(be, bias, V), *vlp = lh_alloc(be, sizeof lp);
    int32_t *vidx = lh_alloc(be, sizeof idx), *vpick = lh_i32(be, pick, 3);
    float *vpicked = lh_alloc(be, sizeof picked);
    for (int biased = 0; biased < 2; biased++) {
        LUNA_CHECK_OK(be->ops->log_softmax_topk(be, vx, biased ? vb : NULL, 3, V, V, vlp, vidx,
                                                vpick, vpicked));
        lh_download(be, lp, vlp, sizeof lp);
        lh_download(be, idx, vidx, sizeof idx);
        lh_download(be, picked, vpicked, sizeof picked);
        /* the documented lse, summed in index order */
        const double lse0 = 2.0 + log(exp(-2.0) + 1.0 + exp(-1.0) + 1.0 + 1.0 + exp(-3.0));
        const float top0 = (float)(2.0 - lse0), lp1 = (float)(0.5 - (0.5 + log(6.0)));
        static const int32_t order0[2][V] = {{1, 3, 4, 2, 0, 5}, {1, 3, 2, 0, 5, 4}};
        static const int32_t order1[2][V] = {{0, 1, 2, 3, 4, 5}, {0, 1, 2, 5, 3, 4}};
        for (int i = 0; i < V; i++) {
            ck_assert_int_eq(idx[i], order0[biased][i]);
            ck_assert_int_eq(idx[V + i], order1[biased][i]);
            ck_assert_int_eq(idx[2 * V + i], i); /* NaN row: all −inf, in index order */
            ck_assert(isinf(lp[2 * V + i]) && lp[2 * V + i] < 0);
        }
        ck_assert(lp[0] == top0);
        if (biased) { /* token 3 penalised by 0.5, token 4 banned */
            ck_assert(lp[1] == top0 - 0.5f && lp[V - 1] == -INFINITY);
            ck_assert(lp[V + 4] == lp1 - 0.5f && lp[V + 5] == -INFINITY);
        } else {
            ck_assert(lp[1] == top0 && lp[2] == top0 && lp[V - 1] == (float)(-1.0 - lse0));
        }
        ck_assert(lp[V + 0] == lp1 && lp[V + 3] == lp1);
        /* picked: the unbiased log-prob, token 4 of row 0 banned by the bias or not */
        ck_assert(picked[0] == top0);
        ck_assert(picked[1] == lp1);
        ck_assert(isnan(picked[2]));
    }
    /* bad sizes and a pick out of range */
    ck_assert_int_eq(be->ops->log_softmax_topk(be, vx, NULL, 3, V, V + 1, vlp, vidx, NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    luna_error_clear();
    ck_assert_int_eq(be->ops->log_softmax_topk(be, vx, NULL, 3, V, -1, vlp, vidx, NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    luna_error_clear();
    if (be->device == LUNA_DEVICE_CPU) { /* the CPU checks the picks (a device need not) */
        const int32_t bad_pick[3] = {0, V, 0};
        lh_upload(be, vpick, bad_pick, sizeof bad_pick);
        ck_assert_int_eq(
            be->ops->log_softmax_topk(be, vx, NULL, 3, V, 1, vlp, vidx, vpick, vpicked),
            LUNA_ERR_INVALID_ARGUMENT);
        luna_error_clear();
    }
    void *all[] = {vx, vb, vlp, vidx, vpick, vpicked};
    for (int i = 0; i < 6; i++)
        lh_free(be, all[i]);
    luna_backend_free(be);
}
END_TEST

/* ---- cache_products ---------------------------------------------------------------------------
 */
typedef struct {
    bool values, ragged;
    int R, H, dh, T, T_cap, page;
} cache_args;

/* d[0] y, d[1] x, d[2] C [slots, H, page, dh], d[3] ind [R, T_cap], d[4] lens [R]. */
static luna_status run_cache(luna_backend *be, void *const *d, const void *args) {
    const cache_args *a = args;
    return be->ops->cache_products(be, a->values, d[0], d[1], d[2], d[3], a->ragged ? d[4] : NULL,
                                   a->R, a->H, a->dh, a->T, a->T_cap, a->page);
}

/* Row r's positions under `ragged` (rows at different positions, in-flight batching): 1..T, the
 * last row T. */
static int cache_row_len(bool ragged, int r, int R, int T) {
    return ragged && r < R - 1 ? 1 + (r * 7 + 3) % T : T;
}

/* One case: y on the backend under test against a double-precision host loop over the indexed
 * rows (1e-5 of max|y|); on the CPU, each y one fmaf chain in ascending order, and for T ≤ 256
 * bit-equal to the one-row gemm over a gathered
 * copy of the rows (what decoding computed before the indirection); then against the CPU
 * reference. Indices past T are out of range: reading one would be caught (ASan, the harness). */
static void check_cache(bool values, bool ragged, int R, int H, int dh, int T, int T_cap, int page,
                        int slots, uint64_t seed) {
    const int64_t G = (int64_t)R * H, group = (int64_t)page * dh;
    const size_t nC = (size_t)slots * H * group, nx = (size_t)G * (values ? T : dh),
                 ny = (size_t)G * (values ? dh : T), nind = (size_t)R * T_cap;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *C = luna_test_random_vector(&rng, nC, -1, 1);
    float *x = luna_test_random_vector(&rng, nx, -1, 1);
    int32_t *ind = malloc(sizeof(int32_t) * nind), *lens = malloc(sizeof(int32_t) * (size_t)R);
    float *got = malloc(sizeof(float) * ny), *gathered = malloc(sizeof(float) * G * T * dh);
    float *y0 = malloc(sizeof(float) * ny);
    double *want = malloc(sizeof(double) * ny);
    ck_assert(ind && lens && got && gathered && y0 && want);
    for (int r = 0; r < R; r++)
        lens[r] = cache_row_len(ragged, r, R, T);
    for (size_t i = 0; i < ny; i++)
        y0[i] = 7.0f; /* scores past a row's length stay as they were */
    for (int r = 0; r < R; r++)
        for (int p = 0; p < T_cap; p++)
            ind[r * T_cap + p] = p < T ? (int32_t)luna_test_uniform(&rng, 0, (float)slots - 0.01f)
                                       : 1000000 + p; /* never read */
    /* gathered[g, p, :] = the row that (r, h) reads at position p */
    for (int64_t g = 0; g < G; g++)
        for (int p = 0; p < T; p++)
            memcpy(gathered + (g * T + p) * dh,
                   C + ((int64_t)ind[(g / H) * T_cap + p] * H + g % H) * group +
                       (int64_t)(p % page) * dh,
                   sizeof(float) * (size_t)dh);
    double ymax = 0;
    for (int64_t g = 0; g < G; g++) {
        const float *Kg = gathered + g * T * dh;
        const int Tr = lens[g / H];
        if (values)
            for (int j = 0; j < dh; j++) {
                double acc = 0;
                for (int p = 0; p < Tr; p++)
                    acc += (double)x[g * T + p] * Kg[(int64_t)p * dh + j];
                want[g * dh + j] = acc;
            }
        else
            for (int p = 0; p < T; p++) {
                double acc = 0;
                for (int k = 0; k < dh; k++)
                    acc += (double)x[g * dh + k] * Kg[(int64_t)p * dh + k];
                want[g * T + p] = p < Tr ? acc : 7.0;
            }
    }
    for (size_t i = 0; i < ny; i++)
        ymax = fmax(ymax, fabs(want[i]));
    char what[112];
    snprintf(what, sizeof what, "%s R %d H %d dh %d T %d T_cap %d page %d%s",
             values ? "values" : "scores", R, H, dh, T, T_cap, page, ragged ? " ragged" : "");

    luna_backend *be = lh_backend(2);
    float *vy = lh_f32(be, y0, ny), *vx = lh_f32(be, x, nx), *vC = lh_f32(be, C, nC);
    int32_t *vind = lh_i32(be, ind, nind), *vlens = lh_i32(be, lens, (size_t)R);
    LUNA_CHECK_OK(be->ops->cache_products(be, values, vy, vx, vC, vind, ragged ? vlens : NULL, R, H,
                                          dh, T, T_cap, page));
    lh_download(be, got, vy, ny * sizeof *got);
    for (size_t i = 0; i < ny; i++)
        LUNA_EXPECT(fabs(got[i] - want[i]) <= 1e-5 * fmax(ymax, 1e-30),
                    "cache_products [%s]: y[%zu] = %.9g, want %.9g", what, i, (double)got[i],
                    want[i]);
    if (strcmp(lh_backend_name(), "cpu") == 0) /* each y one fmaf chain, ascending from 0 */
        for (int64_t g = 0; g < G; g++) {
            const float *Kg = gathered + g * T * dh;
            const int Tr = lens[g / H];
            for (int j = 0; j < (values ? dh : Tr); j++) {
                float c = 0.0f;
                if (values)
                    for (int p = 0; p < Tr; p++)
                        c = fmaf(x[g * T + p], Kg[(int64_t)p * dh + j], c);
                else
                    for (int k = 0; k < dh; k++)
                        c = fmaf(x[g * dh + k], Kg[(int64_t)j * dh + k], c);
                const size_t i = (size_t)(g * (values ? dh : T) + j);
                LUNA_EXPECT(memcmp(&c, &got[i], sizeof c) == 0,
                            "cache_products [%s]: y[%zu] = %.9g, its fmaf chain %.9g", what, i,
                            (double)got[i], (double)c);
            }
        }
    if (strcmp(lh_backend_name(), "cpu") == 0 && T <= 256 && !ragged) {
        float *vg = lh_f32(be, gathered, (size_t)G * T * dh), *vy2 = lh_f32(be, NULL, ny);
        float *copy = malloc(sizeof(float) * ny);
        ck_assert_ptr_nonnull(copy);
        if (values) /* o_g [1, dh] = x_g [1, T] · K_g [T, dh] */
            LUNA_CHECK_OK(be->ops->gemm(be, false, false, 1, dh, T, 1.0f, vx, T, T, vg, dh,
                                        (int64_t)T * dh, 0.0f, vy2, dh, dh, (int)G));
        else /* s_g [1, T] = x_g [1, dh] · K_g [T, dh]ᵀ */
            LUNA_CHECK_OK(be->ops->gemm(be, false, true, 1, T, dh, 1.0f, vx, dh, dh, vg, dh,
                                        (int64_t)T * dh, 0.0f, vy2, T, T, (int)G));
        lh_download(be, copy, vy2, ny * sizeof *copy);
        for (size_t i = 0; i < ny; i++)
            LUNA_EXPECT(memcmp(&copy[i], &got[i], sizeof(float)) == 0,
                        "cache_products [%s]: y[%zu] = %.9g, the gathered gemm's %.9g", what, i,
                        (double)got[i], (double)copy[i]);
        lh_free(be, vg);
        lh_free(be, vy2);
        free(copy);
    }
    lh_free(be, vy);
    lh_free(be, vx);
    lh_free(be, vC);
    lh_free(be, vind);
    lh_free(be, vlens);
    luna_backend_free(be);

    cache_args a = {values, ragged, R, H, dh, T, T_cap, page};
    lh_buf bufs[] = {{y0, ny, LH_F32, LH_OUT},
                     {x, nx, LH_F32, LH_IN},
                     {C, nC, LH_F32, LH_IN},
                     {ind, nind, LH_I32, LH_IN},
                     {lens, (size_t)R, LH_I32, LH_IN}};
    ck_assert_int_eq(lh_compare("cache_products", what, 2, run_cache, &a, bufs, 5), LUNA_OK);
    free(C);
    free(x);
    free(ind);
    free(lens);
    free(y0);
    free(got);
    free(gathered);
    free(want);
}

START_TEST(cache_products_read_through_the_indices) {
    /* page ≥ T_cap: a slot per row history; smaller: a slot per page of positions (decoding's
     * key/value pages), including pages that do not divide T_cap and a page of one position */
    static const int shapes[][7] = {
        /* R, H, dh, T, T_cap, page, slots */
        {3, 2, 64, 1, 5, 5, 3},       {3, 2, 64, 19, 23, 23, 4},   {5, 3, 13, 8, 8, 8, 5},
        {2, 4, 40, 33, 40, 40, 7},    {16, 4, 64, 24, 30, 30, 16}, /* G·T·dh ≥ 32768: threaded */
        {2, 1, 16, 300, 301, 301, 2}, {3, 2, 64, 19, 23, 4, 9},    {5, 3, 13, 8, 8, 1, 11},
        {16, 4, 64, 24, 30, 16, 33},  {3, 2, 8, 5, 6, 16, 3}};
    uint64_t seed = 500;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int mode = 0; mode < 4; mode++) { /* scores/values, all rows T long or ragged */
            const int *s = shapes[i];
            check_cache(mode & 1, mode & 2, s[0], s[1], s[2], s[3], s[4], s[5], s[6], seed++);
        }
}
END_TEST

/* cache_write: each row's newest position (T, or its own length) into the slot its index names,
 * every head; the rest of the cache untouched. Exact, against a host loop and the CPU. */
typedef struct {
    bool ragged;
    int R, H, dh, T, T_cap, page;
} write_args;

/* d[0] C, d[1] x, d[2] ind, d[3] lens */
static luna_status run_write(luna_backend *be, void *const *d, const void *args) {
    const write_args *a = args;
    return be->ops->cache_write(be, d[0], d[1], d[2], a->ragged ? d[3] : NULL, a->R, a->H, a->dh,
                                a->T, a->T_cap, a->page);
}

static void check_write(bool ragged, int R, int H, int dh, int T, int T_cap, int page,
                        uint64_t seed) {
    const int slots = R * ((T_cap + page - 1) / page); /* distinct slots: no two rows collide */
    const size_t nC = (size_t)slots * H * page * dh, nx = (size_t)R * H * dh;
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *C = luna_test_random_vector(&rng, nC, -1, 1);
    float *x = luna_test_random_vector(&rng, nx, -1, 1);
    float *want = malloc(sizeof(float) * nC), *got = malloc(sizeof(float) * nC);
    int32_t *ind = malloc(sizeof(int32_t) * (size_t)R * T_cap), *lens = malloc(sizeof(int32_t) * R);
    ck_assert(want && got && ind && lens);
    for (int r = 0; r < R; r++) {
        lens[r] = cache_row_len(ragged, r, R, T);
        for (int p = 0; p < T_cap; p++) /* row r's page of p: slot r·pages + p / page */
            ind[r * T_cap + p] = r * ((T_cap + page - 1) / page) + p / page;
    }
    memcpy(want, C, sizeof(float) * nC);
    for (int r = 0; r < R; r++) {
        const int p = lens[r] - 1;
        for (int h = 0; h < H; h++)
            for (int k = 0; k < dh; k++)
                want[(((size_t)ind[r * T_cap + p] * H + h) * page + p % page) * dh + k] =
                    x[((size_t)r * H + h) * dh + k];
    }
    char what[96];
    snprintf(what, sizeof what, "R %d H %d dh %d T %d T_cap %d page %d%s", R, H, dh, T, T_cap, page,
             ragged ? " ragged" : "");
    luna_backend *be = lh_backend(1);
    float *vC = lh_f32(be, C, nC), *vx = lh_f32(be, x, nx);
    int32_t *vind = lh_i32(be, ind, (size_t)R * T_cap), *vlens = lh_i32(be, lens, (size_t)R);
    LUNA_CHECK_OK(
        be->ops->cache_write(be, vC, vx, vind, ragged ? vlens : NULL, R, H, dh, T, T_cap, page));
    lh_download(be, got, vC, sizeof(float) * nC);
    for (size_t i = 0; i < nC; i++)
        LUNA_EXPECT(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                    "cache_write [%s]: C[%zu] = %.9g, want %.9g", what, i, (double)got[i],
                    (double)want[i]);
    lh_free(be, vC), lh_free(be, vx), lh_free(be, vind), lh_free(be, vlens);
    luna_backend_free(be);
    write_args a = {ragged, R, H, dh, T, T_cap, page};
    lh_buf bufs[] = {{C, nC, LH_F32, LH_OUT},
                     {x, nx, LH_F32, LH_IN},
                     {ind, (size_t)R * T_cap, LH_I32, LH_IN},
                     {lens, (size_t)R, LH_I32, LH_IN}};
    ck_assert_int_eq(lh_compare("cache_write", what, 1, run_write, &a, bufs, 4), LUNA_OK);
    free(C), free(x), free(want), free(got), free(ind), free(lens);
}

START_TEST(cache_write_to_each_rows_position) {
    static const int shapes[][6] = {/* R, H, dh, T, T_cap, page */
                                    {3, 2, 64, 1, 5, 5},
                                    {5, 3, 13, 8, 8, 8},
                                    {4, 4, 16, 19, 23, 4},
                                    {6, 1, 8, 7, 9, 1},
                                    {16, 4, 64, 24, 30, 16}};
    uint64_t seed = 900;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ragged = 0; ragged < 2; ragged++) {
            const int *s = shapes[i];
            check_write(ragged, s[0], s[1], s[2], s[3], s[4], s[5], seed++);
        }
}
END_TEST

START_TEST(cache_products_rejects_bad_sizes) {
    static const int bad[][6] = {/* R, H, dh, T, T_cap, page */
                                 {-1, 2, 4, 2, 3, 3}, {2, 0, 4, 2, 3, 3}, {2, 2, 0, 2, 3, 3},
                                 {2, 2, 4, 0, 3, 3},  {2, 2, 4, 4, 3, 3}, {2, 2, 4, 2, 3, 0}};
    luna_backend *be = lh_backend(1);
    float *buf = lh_f32(be, NULL, 64);
    int32_t *ind = lh_i32(be, NULL, 8);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const int *b = bad[k];
        luna_status st = be->ops->cache_products(be, false, buf, buf, buf, ind, NULL, b[0], b[1],
                                                 b[2], b[3], b[4], b[5]);
        ck_assert_msg(st == LUNA_ERR_INVALID_ARGUMENT, "case %zu: status %d", k, st);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "cache_products"));
        luna_error_clear();
    }
    /* no rows: nothing to do, whatever the pointers */
    LUNA_CHECK_OK(
        be->ops->cache_products(be, true, NULL, NULL, NULL, NULL, NULL, 0, 2, 4, 2, 3, 3));
    lh_free(be, buf);
    lh_free(be, ind);
    luna_backend_free(be);
}
END_TEST

/* ---- cross_attention --------------------------------------------------------------------------
 * Each row against its slot's keys and values over the slot's length: against a float64 host loop
 * (1e-5: the outputs are convex combinations of values in [−1, 1]); on the CPU bit-equal to the
 * chains the op promises (fmaf in ascending order, alpha after the sum, softmax_forward's row);
 * then the backend under test against the CPU. Rows come in runs that share a slot (a sentence's
 * beams), lengths include 0 (the row is 0) and m, and slot_len NULL means m. */
typedef struct {
    bool lens;
    int R, H, dh, m;
    float alpha;
} cross_args;

/* d[0] y, d[1] q, d[2] K, d[3] V, d[4] row_slot, d[5] slot_len */
static luna_status run_cross(luna_backend *be, void *const *d, const void *args) {
    const cross_args *a = args;
    return be->ops->cross_attention(be, d[0], d[1], d[2], d[3], d[4], a->lens ? d[5] : NULL, a->R,
                                    a->H, a->dh, a->m, a->alpha);
}

/* softmax_forward's row (model/kernels/cpu/softmax.c) on the host */
static void softmax_host(float *a, int n) {
    float mx = -INFINITY;
    for (int p = 0; p < n; p++)
        mx = fmaxf(mx, a[p]);
    if (mx == -INFINITY) n = 0;
    double sum = 0;
    for (int p = 0; p < n; p++) {
        a[p] = expf(a[p] - mx);
        sum += (double)a[p];
    }
    const float inv = (float)(1.0 / sum);
    for (int p = 0; p < n; p++)
        a[p] *= inv;
}

static void check_cross(bool with_lens, int R, int H, int dh, int m, int slots, int run,
                        uint64_t seed) {
    const int64_t d = (int64_t)H * dh;
    const size_t nq = (size_t)R * d, nK = (size_t)slots * m * d;
    const float alpha = 1.0f / sqrtf((float)dh);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *q = luna_test_random_vector(&rng, nq, -2, 2);
    float *K = luna_test_random_vector(&rng, nK, -1, 1);
    float *V = luna_test_random_vector(&rng, nK, -1, 1);
    int32_t *row_slot = malloc(sizeof(int32_t) * (size_t)R),
            *slot_len = malloc(sizeof(int32_t) * slots);
    float *got = malloc(sizeof(float) * nq), *chain = malloc(sizeof(float) * nq);
    float *a = malloc(sizeof(float) * (size_t)m);
    double *want = malloc(sizeof(double) * nq), *e = malloc(sizeof(double) * (size_t)m);
    ck_assert(row_slot && slot_len && got && chain && a && want && e);
    for (int r = 0; r < R; r++) /* runs of `run` rows share a slot, in a shuffled order */
        row_slot[r] = (int32_t)((r / run * 7 + 3) % slots);
    for (int s = 0; s < slots; s++)
        slot_len[s] = s == 0 ? m : (s == 1 ? 0 : 1 + (s * 5 + 2) % m);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) {
            const int64_t s = row_slot[r];
            const int n = with_lens ? slot_len[s] : m;
            const float *qg = q + r * d + h * dh;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p < n; p++) {
                const float *kp = K + (s * m + p) * d + h * dh;
                double acc = 0;
                float c = 0.0f;
                for (int k = 0; k < dh; k++) {
                    acc += (double)qg[k] * kp[k];
                    c = fmaf(qg[k], kp[k], c);
                }
                e[p] = alpha * acc;
                a[p] = c * alpha;
                mx = fmax(mx, e[p]);
            }
            for (int p = 0; p < n; p++)
                sum += (e[p] = exp(e[p] - mx));
            softmax_host(a, n);
            for (int j = 0; j < dh; j++) {
                double acc = 0;
                float c = 0.0f;
                for (int p = 0; p < n; p++) {
                    const float v = V[(s * m + p) * d + h * dh + j];
                    acc += e[p] / sum * v;
                    c = fmaf(a[p], v, c);
                }
                want[r * d + h * dh + j] = acc;
                chain[r * d + h * dh + j] = c;
            }
        }
    char what[112];
    snprintf(what, sizeof what, "R %d H %d dh %d m %d slots %d run %d%s", R, H, dh, m, slots, run,
             with_lens ? " lengths" : "");
    luna_backend *be = lh_backend(2);
    float *vy = lh_f32(be, NULL, nq), *vq = lh_f32(be, q, nq), *vK = lh_f32(be, K, nK),
          *vV = lh_f32(be, V, nK);
    int32_t *vslot = lh_i32(be, row_slot, (size_t)R), *vlen = lh_i32(be, slot_len, (size_t)slots);
    LUNA_CHECK_OK(be->ops->cross_attention(be, vy, vq, vK, vV, vslot, with_lens ? vlen : NULL, R, H,
                                           dh, m, alpha));
    lh_download(be, got, vy, nq * sizeof *got);
    const bool cpu = strcmp(lh_backend_name(), "cpu") == 0;
    for (size_t i = 0; i < nq; i++) {
        LUNA_EXPECT(fabs(got[i] - want[i]) <= 1e-5,
                    "cross_attention [%s]: y[%zu] = %.9g, want %.9g", what, i, (double)got[i],
                    want[i]);
        if (cpu)
            LUNA_EXPECT(memcmp(&got[i], &chain[i], sizeof(float)) == 0,
                        "cross_attention [%s]: y[%zu] = %.9g, the chains' %.9g", what, i,
                        (double)got[i], (double)chain[i]);
    }
    lh_free(be, vy), lh_free(be, vq), lh_free(be, vK), lh_free(be, vV);
    lh_free(be, vslot), lh_free(be, vlen);
    luna_backend_free(be);
    cross_args ca = {with_lens, R, H, dh, m, alpha};
    lh_buf bufs[] = {{got, nq, LH_F32, LH_OUT},
                     {q, nq, LH_F32, LH_IN},
                     {K, nK, LH_F32, LH_IN},
                     {V, nK, LH_F32, LH_IN},
                     {row_slot, (size_t)R, LH_I32, LH_IN},
                     {slot_len, (size_t)slots, LH_I32, LH_IN}};
    ck_assert_int_eq(lh_compare("cross_attention", what, 2, run_cross, &ca, bufs, 6), LUNA_OK);
    free(q), free(K), free(V), free(row_slot), free(slot_len), free(got), free(chain), free(a);
    free(want), free(e);
}

START_TEST(cross_attention_reads_each_rows_slot) {
    static const int shapes[][6] = {/* R, H, dh, m, slots, rows per run */
                                    {4, 4, 64, 17, 1, 4},  {9, 2, 13, 5, 3, 4},
                                    {33, 4, 64, 40, 9, 4}, /* R·H·m·dh ≥ 32768: threaded */
                                    {2, 1, 8, 300, 2, 1},  {7, 3, 16, 1, 7, 1},
                                    {10, 2, 32, 23, 4, 3}};
    uint64_t seed = 1300;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int lens = 0; lens < 2; lens++) {
            const int *s = shapes[i];
            check_cross(lens, s[0], s[1], s[2], s[3], s[4], s[5], seed++);
        }
}
END_TEST

START_TEST(cross_attention_rejects_bad_sizes) {
    luna_backend *be = lh_backend(1);
    float *buf = lh_f32(be, NULL, 64);
    int32_t zero = 0, *slot = lh_i32(be, &zero, 1);
    static const int bad[][4] = {{-1, 1, 8, 4}, {1, 0, 8, 4}, {1, 1, 0, 4}, {1, 1, 8, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int *b = bad[i];
        luna_status st =
            be->ops->cross_attention(be, buf, buf, buf, buf, slot, NULL, b[0], b[1], b[2], b[3], 1);
        ck_assert_msg(st == LUNA_ERR_INVALID_ARGUMENT, "case %zu: status %d", i, st);
        ck_assert_ptr_nonnull(strstr(luna_error_message(), "cross_attention"));
        luna_error_clear();
    }
    ck_assert_int_eq(be->ops->cross_attention(be, buf, buf, buf, buf, NULL, NULL, 1, 1, 8, 4, 1),
                     LUNA_ERR_INVALID_ARGUMENT); /* no slot indices */
    luna_error_clear();
    /* no rows: nothing to do, whatever the pointers */
    LUNA_CHECK_OK(be->ops->cross_attention(be, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1, 8, 4, 1));
    lh_free(be, buf), lh_free(be, slot);
    luna_backend_free(be);
}
END_TEST

static Suite *decode_suite(void) {
    Suite *s = suite_create("ops_decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gather_rows_values_and_reference);
    tcase_add_test(tc, gather_rows_rejects_bad_sizes);
    tcase_add_test(tc, cache_write_to_each_rows_position);
    tcase_add_test(tc, log_softmax_topk_matches_host_reference);
    tcase_add_test(tc, log_softmax_topk_known_values);
    tcase_add_test(tc, sum_exp_lanes_equal_scalar);
    tcase_add_test(tc, log_softmax_topk_kernels_agree);
    tcase_add_test(tc, cache_products_read_through_the_indices);
    tcase_add_test(tc, cache_products_rejects_bad_sizes);
    tcase_add_test(tc, cross_attention_reads_each_rows_slot);
    tcase_add_test(tc, cross_attention_rejects_bad_sizes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(decode_suite()); }
