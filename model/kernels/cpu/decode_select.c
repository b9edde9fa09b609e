/* Decoding ops (core/backend.h, "Decoding"): row gathers for beam reordering and strided cache
 * writes, and the fused log-softmax + top-k that hands the host k candidates per row instead of
 * the [rows, V] log-probabilities.
 *
 * log_softmax_topk computes what the host-side code before it did (lse in double; each log-prob
 * rounded to fp32, then the bias added in fp32), so translations are unchanged; rows are
 * independent, so any thread count gives the same bits. The Σ exp runs through a vectorisable
 * double exp (core/exp_double.h, shared with CUDA; within 1 ulp of libm's) in four interleaved
 * partial sums, several times faster than libm's scalar exp (which is a visible share of
 * decoding: docs/benchmarks.md); lse moves by ~1e-16 relative, far below the fp32 rounding of the
 * log-probs. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/allocator.h"
#include "core/exp_double.h"
#include "core/topk_heap.h"
#include "model/kernels/cpu/cpu_ops.h"

luna_status luna_cpu_gather_rows(luna_backend *be, luna_act *dst_, int64_t dst_stride,
                                 const luna_act *src_, int64_t src_stride, const int32_t *idx,
                                 int64_t n, int64_t cols) {
    float *dst = (float *)dst_;
    const float *src = (const float *)src_;
    if (n == 0 || cols == 0) return LUNA_OK;
    const int threads = be->num_threads > 0 ? be->num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * cols >= 65536)
    for (int64_t i = 0; i < n; i++) {
        const int64_t from = idx ? idx[i] : i;
        memcpy(dst + i * dst_stride, src + from * src_stride, sizeof(float) * (size_t)cols);
    }
    return LUNA_OK;
}

/* Each group through a small buffer of its own rows (a thread's slice of scratch): the group's
 * sources read before any of its rows is written. */
luna_status luna_cpu_gather_rows_in_groups(luna_backend *be, luna_act *buf_, int64_t stride,
                                           const int32_t *idx, int64_t n_groups, int group,
                                           int64_t cols) {
    if (n_groups == 0 || cols == 0) return LUNA_OK;
    float *buf = (float *)buf_;
    const int threads = be->num_threads > 0 ? be->num_threads : 1;
    const size_t per = (size_t)group * (size_t)cols;
    const luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    float *tmp = luna_arena_alloc(be->scratch, sizeof(float) * per * (size_t)threads);
    if (!tmp) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "gather_rows_in_groups: scratch");
#pragma omp parallel for num_threads(threads) schedule(static) if (n_groups * (int64_t)per >= 65536)
    for (int64_t g = 0; g < n_groups; g++) {
        float *t = tmp + per * (size_t)omp_get_thread_num();
        for (int i = 0; i < group; i++)
            memcpy(t + (size_t)i * cols, buf + idx[g * group + i] * stride,
                   sizeof(float) * (size_t)cols);
        for (int i = 0; i < group; i++)
            memcpy(buf + (g * group + i) * stride, t + (size_t)i * cols,
                   sizeof(float) * (size_t)cols);
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}

luna_status luna_cpu_index_rows_update(luna_backend *be, int32_t *dst, const int32_t *src,
                                       const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                       const int32_t *set_col, const int32_t *set_val) {
    (void)be;
    for (int64_t i = 0; i < n && cols > 0 && (dst != src || idx); i++)
        memcpy(dst + i * stride, src + (idx ? idx[i] : i) * stride, sizeof(int32_t) * (size_t)cols);
    for (int64_t i = 0; i < n && set_col; i++)
        dst[i * stride + set_col[i]] = set_val[i];
    return LUNA_OK;
}

/* Row r's newest position p = T_r − 1 into slot ind[r, p], every head: a copy of dh floats. */
luna_status luna_cpu_cache_write(luna_backend *be, luna_act *C_, const luna_act *x_,
                                 const int32_t *ind, const int32_t *lens, int R, int H, int dh,
                                 int T, int T_cap, int page) {
    (void)be;
    float *C = (float *)C_;
    const float *x = (const float *)x_;
    for (int64_t r = 0; r < R; r++) {
        const int p = (lens ? lens[r] : T) - 1;
        const int64_t slot = ind[r * T_cap + p];
        for (int h = 0; h < H; h++)
            memcpy(C + ((slot * H + h) * page + p % page) * dh, x + (r * H + h) * dh,
                   sizeof(float) * (size_t)dh);
    }
    return LUNA_OK;
}

/* lp_j = (float)(x_j − lse) + bias_j (bias NULL: nothing added), NaN → −inf, for j0 ≤ j < V: the
 * CPUs without AVX2, and the vector kernels' last terms. */
static void row_log_probs_scalar(float *lp, const float *x, const float *bias, int j0, int V,
                                 double lse) {
    if (bias)
        for (int j = j0; j < V; j++) {
            const float v = (float)((double)x[j] - lse) + bias[j];
            lp[j] = v != v ? -INFINITY : v;
        }
    else
        for (int j = j0; j < V; j++) {
            const float v = (float)((double)x[j] - lse);
            lp[j] = v != v ? -INFINITY : v;
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* luna_exp_nonpositive's range reduction and Estrin tree (core/exp_double.h) on a vector type T
 * through the intrinsics P##_*_pd (P: _mm256 or _mm512), the same operations in the same order:
 * t → tc (clamped to −708), kd (the rounded n in its low mantissa bits), n and p = exp(r). exp4
 * and exp8 differ only in how they apply 2^n and the clamp. */
#define EXP_REDUCE_POLY(T, P, t, lim, shifter, kd, n, p)                                           \
    const T tc = P##_max_pd(t, lim); /* NaN rows are handled by the caller */                      \
    const T kd = P##_add_pd(P##_mul_pd(tc, P##_set1_pd(1.4426950408889634)), shifter);             \
    const T n = P##_sub_pd(kd, shifter);                                                           \
    const T r1 = P##_fnmadd_pd(n, P##_set1_pd(6.93147180369123816490e-01), tc);                    \
    const T r = P##_fnmadd_pd(n, P##_set1_pd(1.90821492927058770002e-10), r1);                     \
    const T r2 = P##_mul_pd(r, r), r4 = P##_mul_pd(r2, r2), r8 = P##_mul_pd(r4, r4);               \
    const T q01 = P##_fmadd_pd(P##_set1_pd(0.5), r, P##_set1_pd(1.0));                             \
    const T q23 = P##_fmadd_pd(P##_set1_pd(1.0 / 24.0), r, P##_set1_pd(1.0 / 6.0));                \
    const T q45 = P##_fmadd_pd(P##_set1_pd(1.0 / 720.0), r, P##_set1_pd(1.0 / 120.0));             \
    const T q67 = P##_fmadd_pd(P##_set1_pd(1.0 / 40320.0), r, P##_set1_pd(1.0 / 5040.0));          \
    const T q89 = P##_fmadd_pd(P##_set1_pd(1.0 / 3628800.0), r, P##_set1_pd(1.0 / 362880.0));      \
    const T qab = P##_fmadd_pd(P##_set1_pd(1.0 / 479001600.0), r, P##_set1_pd(1.0 / 39916800.0));  \
    const T q03 = P##_fmadd_pd(q23, r2, q01), q47 = P##_fmadd_pd(q67, r2, q45);                    \
    const T q8b = P##_fmadd_pd(qab, r2, q89);                                                      \
    const T q07 = P##_fmadd_pd(q47, r4, q03);                                                      \
    const T q8c = P##_fmadd_pd(P##_set1_pd(1.0 / 6227020800.0), r4, q8b);                          \
    const T p = P##_fmadd_pd(P##_fmadd_pd(q8c, r8, q07), r, P##_set1_pd(1.0))

/* luna_exp_nonpositive on four lanes: 2^n built in the exponent bits, as it does, so the same
 * bits. */
__attribute__((target("avx2,fma"))) static inline __m256d exp4(__m256d t) {
    const __m256d lim = _mm256_set1_pd(-708.0), shifter = _mm256_set1_pd(0x1.8p52);
    EXP_REDUCE_POLY(__m256d, _mm256, t, lim, shifter, kd, n, p);
    (void)n;
    const __m256i bits = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(kd), _mm256_castpd_si256(shifter)),
                         _mm256_set1_epi64x(1023)),
        52);
    const __m256d e = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
    return _mm256_andnot_pd(_mm256_cmp_pd(t, lim, _CMP_LT_OQ), e); /* below −708: 0 */
}

/* next (or NULL): the row after this one, fetched into L2 meanwhile, one line per 16 terms. The
 * exps are bound by arithmetic, the next row's first pass (its maximum) by reading a row that the
 * output projection wrote out of cache: the prefetch overlaps the two. */
__attribute__((target("avx2,fma"))) static double sum_exp_avx2(const float *x, int V, float mx,
                                                               const float *next) {
    const __m256d m = _mm256_set1_pd((double)mx);
    __m256d acc = _mm256_setzero_pd();
    int j = 0;
    for (; j + 4 <= V; j += 4) {
        if (next && j % 16 == 0) _mm_prefetch((const char *)(next + j), _MM_HINT_T1);
        acc = _mm256_add_pd(acc, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j)), m)));
    }
    double lane[4];
    _mm256_storeu_pd(lane, acc);
    for (; j < V; j++)
        lane[0] += luna_exp_nonpositive((double)x[j] - (double)mx);
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/* exp4 on eight lanes: the same operations, with 2^n applied by vscalefpd (p·2^n is exact in the
 * normal range either way: the same bits) and the clamp's zeros by a mask; Zen 4 and Intel run it
 * in half the instructions of two exp4 calls. */
__attribute__((target("avx512f"))) static inline __m512d exp8(__m512d t) {
    const __m512d lim = _mm512_set1_pd(-708.0), shifter = _mm512_set1_pd(0x1.8p52);
    EXP_REDUCE_POLY(__m512d, _mm512, t, lim, shifter, kd, n, p);
    (void)kd;
    const __mmask8 keep = _mm512_cmp_pd_mask(t, lim, _CMP_NLT_UQ); /* not below −708 (NaN too) */
    return _mm512_maskz_scalef_pd(keep, p, n);
}

/* sum_exp_avx2's sums, eight terms per exp8: its lanes get terms j..j+3, then j+4..j+7, in that
 * order, so the same bits. */
__attribute__((target("avx512f,avx2,fma"))) static double
sum_exp_avx512(const float *x, int V, float mx, const float *next) {
    const __m512d m8 = _mm512_set1_pd((double)mx);
    __m256d acc = _mm256_setzero_pd();
    int j = 0;
    for (; j + 8 <= V; j += 8) {
        if (next && j % 16 == 0) _mm_prefetch((const char *)(next + j), _MM_HINT_T1);
        const __m512d e = exp8(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j)), m8));
        acc = _mm256_add_pd(acc, _mm512_castpd512_pd256(e));
        acc = _mm256_add_pd(acc, _mm512_extractf64x4_pd(e, 1));
    }
    const __m256d m = _mm256_set1_pd((double)mx);
    for (; j + 4 <= V; j += 4)
        acc = _mm256_add_pd(acc, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j)), m)));
    double lane[4];
    _mm256_storeu_pd(lane, acc);
    for (; j < V; j++)
        lane[0] += luna_exp_nonpositive((double)x[j] - (double)mx);
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/* max_j x_j (a NaN never wins: v > mx ? v : mx, which is maxps(v, mx)) and whether any x_j is
 * NaN, 8 lanes at a time. The lanes may keep −0 where the scalar loop kept +0 (or the reverse):
 * x − mx and lse are the same for either zero. */
__attribute__((target("avx2"))) static float row_max_avx2(const float *x, int V, int *nan) {
    __m256 m = _mm256_set1_ps(-INFINITY), un = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= V; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        m = _mm256_max_ps(v, m);
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lane[8];
    _mm256_storeu_ps(lane, m);
    float mx = -INFINITY;
    for (int l = 0; l < 8; l++)
        mx = lane[l] > mx ? lane[l] : mx;
    int bad = _mm256_movemask_ps(un) != 0;
    for (; j < V; j++) {
        mx = x[j] > mx ? x[j] : mx;
        bad |= x[j] != x[j];
    }
    *nan = bad;
    return mx;
}

/* row_max_avx2's maximum and NaN flag, 64 terms per iteration in four accumulators (a maximum
 * does not depend on the order it is taken in; the tail through a masked load of −inf): the
 * one-accumulator loop waited on vmaxps's latency. */
__attribute__((target("avx512f"))) static float row_max_avx512(const float *x, int V, int *nan) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    __mmask16 un = 0;
    int j = 0;
    for (; j + 64 <= V; j += 64) {
        const __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16);
        const __m512 v2 = _mm512_loadu_ps(x + j + 32), v3 = _mm512_loadu_ps(x + j + 48);
        m0 = _mm512_max_ps(v0, m0), m1 = _mm512_max_ps(v1, m1);
        m2 = _mm512_max_ps(v2, m2), m3 = _mm512_max_ps(v3, m3);
        un |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v2, v3, _CMP_UNORD_Q);
    }
    for (; j < V; j += 16) {
        const __mmask16 in = V - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (V - j)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(ninf, in, x + j);
        m0 = _mm512_max_ps(v, m0);
        un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    *nan = un != 0;
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* row_log_probs_avx2's values, 8 per iteration (the subtraction in 8 double lanes, the same
 * operations, so the same values). */
__attribute__((target("avx512f,avx2"))) static void
row_log_probs_avx512(float *lp, const float *x, const float *bias, int V, double lse) {
    const __m512d l = _mm512_set1_pd(lse);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= V; j += 8) {
        __m256 v = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j)), l));
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(lp + j, _mm256_blendv_ps(v, ninf, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    }
    row_log_probs_scalar(lp, x, bias, j, V, lse);
}

/* lp_j = (float)(x_j − lse) + bias_j (bias NULL: 0), NaN → −inf: the scalar loop's operations,
 * 4 at a time (the conversions round to nearest as the casts do). */
__attribute__((target("avx2"))) static void
row_log_probs_avx2(float *lp, const float *x, const float *bias, int V, double lse) {
    const __m256d l = _mm256_set1_pd(lse);
    const __m128 ninf = _mm_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 4 <= V; j += 4) {
        __m128 v = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j)), l));
        if (bias) v = _mm_add_ps(v, _mm_loadu_ps(bias + j));
        _mm_storeu_ps(lp + j, _mm_blendv_ps(v, ninf, _mm_cmpunord_ps(v, v)));
    }
    row_log_probs_scalar(lp, x, bias, j, V, lse);
}
#endif

/* luna_cpu_sum_exp (cpu_ops.h), with the vector kernels' prefetch of the next row; kernel: a
 * LUNA_F32_* (the backend's fp32 kernel), a vector width it allows and the CPU has */
static double sum_exp(const float *x, int V, float mx, const float *next, int kernel) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kernel == LUNA_F32_AVX512 && __builtin_cpu_supports("avx512f"))
        return sum_exp_avx512(x, V, mx, next);
    if (kernel >= LUNA_F32_AVX2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return sum_exp_avx2(x, V, mx, next);
#else
    (void)next, (void)kernel;
#endif
    double lane[4] = {0, 0, 0, 0};
    int j = 0;
    for (; j + 4 <= V; j += 4)
        for (int l = 0; l < 4; l++)
            lane[l] += luna_exp_nonpositive((double)x[j + l] - (double)mx);
    for (; j < V; j++)
        lane[0] += luna_exp_nonpositive((double)x[j] - (double)mx);
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

double luna_cpu_sum_exp(const float *x, int V, float mx, int kernel) {
    return sum_exp(x, V, mx, NULL, kernel);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* luna_topk_offer over lp[0..V) in order, skipping 8 tokens at a time when none beats the
 * current k-th best (one vector comparison): the same heap, as each skipped token would be
 * refused. */
__attribute__((target("avx2"))) static void topk_scan_avx2(float *hl, int32_t *hi, int k,
                                                           const float *lp, int V) {
    int n = 0, j = 0;
    for (; j < V && n < k; j++)
        luna_topk_offer(hl, hi, &n, k, lp[j], j);
    for (; j + 8 <= V; j += 8) {
        const __m256 thr = _mm256_set1_ps(hl[0]);
        if (!_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(lp + j), thr, _CMP_GT_OQ))) continue;
        for (int l = 0; l < 8; l++)
            luna_topk_offer(hl, hi, &n, k, lp[j + l], j + l);
    }
    for (; j < V; j++)
        luna_topk_offer(hl, hi, &n, k, lp[j], j);
}
#endif

/* hl/hi[0..k) = the k best of lp[0..V) (V ≥ k), best first, ties by lower index: a heap of k
 * (core/topk_heap.h, O(V log k)), then its sort (O(k log k)). */
static void topk_scan(float *hl, int32_t *hi, int k, const float *lp, int V) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) {
        topk_scan_avx2(hl, hi, k, lp, V);
        luna_topk_sort(hl, hi, k);
        return;
    }
#endif
    int n = 0;
    for (int j = 0; j < V; j++)
        luna_topk_offer(hl, hi, &n, k, lp[j], j);
    luna_topk_sort(hl, hi, k);
}

luna_status luna_cpu_log_softmax_topk(luna_backend *be, const luna_act *logits_, const float *bias,
                                      int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                      const int32_t *pick, float *picked) {
    const float *logits = (const float *)logits_;
    if (rows == 0) return LUNA_OK;
    if (pick) LUNA_TRY(luna_op_check_ids("log_softmax_topk", "picked token", pick, rows, V, NULL));
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    const int threads = be->num_threads > 0 ? be->num_threads : 1;
    const int kernel = luna_cpu_f32_kernel(be);
#if defined(__x86_64__) && defined(__GNUC__)
    const bool avx2 = __builtin_cpu_supports("avx2");
    const bool avx512 = kernel == LUNA_F32_AVX512 && __builtin_cpu_supports("avx512f");
#endif
    float *lp_rows = NULL; /* [threads][V]: one row's log-probs, per thread */
    if (k > 0) {
        lp_rows = luna_arena_alloc(be->scratch, sizeof(float) * (size_t)threads * (size_t)V);
        if (!lp_rows) {
            luna_arena_release(be->scratch, mark);
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "log_softmax_topk: scratch exhausted");
        }
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1 && rows * V >= 16384)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V;
        float mx = -INFINITY;
        int nan = 0;
#if defined(__x86_64__) && defined(__GNUC__)
        if (avx512)
            mx = row_max_avx512(x, V, &nan);
        else if (avx2)
            mx = row_max_avx2(x, V, &nan);
        else
#endif
            for (int j = 0; j < V; j++) {
                const float v = x[j];
                mx = v > mx ? v : mx; /* = fmaxf (a NaN never wins), inlined */
                nan |= v != v;
            }
        /* a NaN logit, or ±inf − ±inf at the maximum, makes the whole row NaN, as with libm exp */
        const double sum =
            nan || isinf(mx) ? NAN : sum_exp(x, V, mx, r + 1 < rows ? x + V : NULL, kernel);
        const double lse = (double)mx + log(sum);
        if (pick) {
            const int j = pick[r];
            picked[r] = (float)((double)x[j] - lse); /* without the bias */
        }
        if (k == 0) continue;
        /* the row's log-probs (fp32, biased, NaN as −inf) in one vectorised pass, then the top k
         * by one comparison per token against the current k-th best */
        float *lp = lp_rows + (size_t)omp_get_thread_num() * (size_t)V;
#if defined(__x86_64__) && defined(__GNUC__)
        if (avx512)
            row_log_probs_avx512(lp, x, bias, V, lse);
        else if (avx2)
            row_log_probs_avx2(lp, x, bias, V, lse);
        else
#endif
            row_log_probs_scalar(lp, x, bias, 0, V, lse);
        topk_scan(top_lp + r * k, top_idx + r * k, k, lp, V); /* the heap in the output row */
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}
