/* cross_attention (core/backend.h, "Decoding"): a decoding step's attention from each row to its
 * sentence's source keys and values, all rows in one call.
 *
 * The rows of a sentence (its beams) are adjacent and read the same slot, so the work is split
 * into tasks of a run of up to RUN adjacent rows with one slot (every head): each key and value
 * row is loaded once for the whole run. Per query and head:
 *   a_p = alpha · Σ_k q_k K_p[k]     (one fused multiply-add chain per p, k ascending from 0;
 *                                     alpha after the sum, as a gemm applies it)
 *   w   = softmax_forward's row over p < n (model/kernels/cpu/softmax.c)
 *   y_j = Σ_p w_p V_p[j]              (one chain per j, p ascending from 0)
 * With AVX2 the scores take 8 key rows at a time, transposed in registers (the transposes shared
 * by the run's queries; past n, rows of zeros whose lanes are dropped: scalar chains would wait on
 * the fused multiply-add's latency), and the outputs 16 columns at a time; the chains are the same,
 * so every kernel, thread count and run length gives the same bits. Rows are independent: a row's
 * result does not depend on the rows around it. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/allocator.h"
#include "model/kernels/cpu/cpu_ops.h"

#define RUN 4 /* queries per task: a beam of 4 is one run */

/* sc[i·m + p] = Σ_k q_i[k] K_p[k] for i < nq (q_i = q + i·qs), p < n; K_p = K + p·ks. */
static void scores_scalar(int nq, int n, int dh, const float *q, int64_t qs, const float *K,
                          int64_t ks, float *sc, int m) {
    for (int i = 0; i < nq; i++)
        for (int p = 0; p < n; p++) {
            float c = 0.0f;
            for (int k = 0; k < dh; k++)
                c = fmaf(q[i * qs + k], K[p * ks + k], c);
            sc[i * m + p] = c;
        }
}

/* y_i[j] = Σ_p w[i·m + p] V_p[j] for i < nq (y_i = y + i·ys), j < dh. */
static void outputs_scalar(int nq, int n, int dh, const float *w, int m, const float *V, int64_t vs,
                           float *y, int64_t ys) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < dh; j++) {
            float c = 0.0f;
            for (int p = 0; p < n; p++)
                c = fmaf(w[i * m + p], V[p * vs + j], c);
            y[i * ys + j] = c;
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "model/kernels/cpu/transpose8.h"

/* zero: dh zeros, the rows past n in the last block of 8 (whose lanes are not stored). nq is a
 * constant at each call site (scores_avx2), so the accumulators stay in registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
scores_nq(const int nq, int n, int dh, const float *q, int64_t qs, const float *K, int64_t ks,
          float *sc, int m, const float *zero) {
    for (int p0 = 0; p0 < n; p0 += 8) {
        const int nl = n - p0 < 8 ? n - p0 : 8;
        const float *b[8];
        for (int l = 0; l < 8; l++)
            b[l] = l < nl ? K + (p0 + l) * ks : zero;
        __m256 c[RUN];
        for (int i = 0; i < RUN; i++)
            c[i] = _mm256_setzero_ps();
        int k = 0;
        for (; k + 8 <= dh; k += 8) {
            __m256 t[8]; /* t_i = b[0..7][k + i] */
            luna_transpose8(b, k, t);
            for (int i = 0; i < RUN; i++) {
                if (i >= nq) break;
                const float *qi = q + i * qs + k;
                for (int kk = 0; kk < 8; kk++)
                    c[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(qi + kk), t[kk], c[i]);
            }
        }
        for (int i = 0; i < nq; i++) {
            float out[8];
            _mm256_storeu_ps(out, c[i]);
            for (int l = 0; l < nl; l++) {
                float cl = out[l];
                for (int kk = k; kk < dh; kk++)
                    cl = fmaf(q[i * qs + kk], b[l][kk], cl);
                sc[i * m + p0 + l] = cl;
            }
        }
    }
}

__attribute__((target("avx2,fma"), always_inline)) static inline void
outputs_nq(const int nq, int n, int dh, const float *w, int m, const float *V, int64_t vs, float *y,
           int64_t ys) {
    int j = 0;
    for (; j + 16 <= dh; j += 16) {
        __m256 c[RUN][2];
        for (int i = 0; i < RUN; i++)
            c[i][0] = c[i][1] = _mm256_setzero_ps();
        for (int p = 0; p < n; p++) {
            const __m256 v0 = _mm256_loadu_ps(V + p * vs + j),
                         v1 = _mm256_loadu_ps(V + p * vs + j + 8);
            for (int i = 0; i < RUN; i++) {
                if (i >= nq) break;
                const __m256 a = _mm256_broadcast_ss(w + i * m + p);
                c[i][0] = _mm256_fmadd_ps(a, v0, c[i][0]);
                c[i][1] = _mm256_fmadd_ps(a, v1, c[i][1]);
            }
        }
        for (int i = 0; i < nq; i++) {
            _mm256_storeu_ps(y + i * ys + j, c[i][0]);
            _mm256_storeu_ps(y + i * ys + j + 8, c[i][1]);
        }
    }
    for (; j + 8 <= dh; j += 8)
        for (int i = 0; i < nq; i++) {
            __m256 c = _mm256_setzero_ps();
            for (int p = 0; p < n; p++)
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i * m + p),
                                    _mm256_loadu_ps(V + p * vs + j), c);
            _mm256_storeu_ps(y + i * ys + j, c);
        }
    if (j < dh) outputs_scalar(nq, n, dh - j, w, m, V + j, vs, y + j, ys);
}

__attribute__((target("avx2,fma"))) static void scores_avx2(int nq, int n, int dh, const float *q,
                                                            int64_t qs, const float *K, int64_t ks,
                                                            float *sc, int m, const float *zero) {
    switch (nq) {
    case 4: scores_nq(4, n, dh, q, qs, K, ks, sc, m, zero); break;
    case 3: scores_nq(3, n, dh, q, qs, K, ks, sc, m, zero); break;
    case 2: scores_nq(2, n, dh, q, qs, K, ks, sc, m, zero); break;
    default: scores_nq(1, n, dh, q, qs, K, ks, sc, m, zero); break;
    }
}

__attribute__((target("avx2,fma"))) static void outputs_avx2(int nq, int n, int dh, const float *w,
                                                             int m, const float *V, int64_t vs,
                                                             float *y, int64_t ys) {
    switch (nq) {
    case 4: outputs_nq(4, n, dh, w, m, V, vs, y, ys); break;
    case 3: outputs_nq(3, n, dh, w, m, V, vs, y, ys); break;
    case 2: outputs_nq(2, n, dh, w, m, V, vs, y, ys); break;
    default: outputs_nq(1, n, dh, w, m, V, vs, y, ys); break;
    }
}

/* The slot's n rows of keys and values (all heads: n·d contiguous floats each) towards L1 before
 * the run's heads read them, head by head, a row every d floats: the hardware prefetcher does not
 * keep up with that stride. */
static void prefetch_rows(const float *K, const float *V, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n * d; i += 16) {
        _mm_prefetch((const char *)(K + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(V + i), _MM_HINT_T0);
    }
}

static bool avx2_available(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

luna_status luna_cpu_cross_attention(luna_backend *be, luna_act *y_, const luna_act *q_,
                                     const luna_act *K_, const luna_act *V_,
                                     const int32_t *row_slot, const int32_t *slot_len, int R, int H,
                                     int dh, int m, float alpha) {
    if (R == 0) return LUNA_OK;
    float *y = (float *)y_;
    const float *q = (const float *)q_, *K = (const float *)K_, *V = (const float *)V_;
    const int64_t d = (int64_t)H * dh;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    /* runs: first row of each (run_at[nr] = R) */
    int *run_at = luna_arena_alloc(be->scratch, sizeof(int) * ((size_t)R + 1));
    int nr = 0;
    for (int r = 0; run_at && r < R; r++)
        if (r == 0 || row_slot[r] != row_slot[r - 1] || r - run_at[nr - 1] == RUN) run_at[nr++] = r;
    const int threads = (int64_t)R * H * m * dh >= LUNA_CPU_PAR_ROWS_WORK && be->num_threads > 1
                            ? be->num_threads
                            : 1;
    float *scores =
        run_at ? luna_arena_alloc(be->scratch, sizeof(float) * RUN * (size_t)m * (size_t)threads)
               : NULL;
    float *zero = scores ? luna_arena_alloc(be->scratch, sizeof(float) * (size_t)dh) : NULL;
    if (!zero) {
        luna_arena_release(be->scratch, mark);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "cross_attention: scratch exhausted");
    }
    run_at[nr] = R;
    memset(zero, 0, sizeof(float) * (size_t)dh);
#if defined(__x86_64__) && defined(__GNUC__)
    const bool simd = avx2_available();
#endif
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int t = 0; t < nr; t++) {
        const int r0 = run_at[t], nq = run_at[t + 1] - r0;
        const int64_t s = row_slot[r0];
        float *sc = scores + (size_t)omp_get_thread_num() * RUN * (size_t)m;
        int n = slot_len ? slot_len[s] : m;
        n = n < 0 ? 0 : (n > m ? m : n);
#if defined(__x86_64__) && defined(__GNUC__)
        if (simd) prefetch_rows(K + s * m * d, V + s * m * d, n, d);
#endif
        for (int h = 0; h < H; h++) {
            const float *qr = q + r0 * d + h * dh, *Ks = K + s * m * d + h * dh,
                        *Vs = V + s * m * d + h * dh;
            float *yr = y + r0 * d + h * dh;
#if defined(__x86_64__) && defined(__GNUC__)
            if (simd)
                scores_avx2(nq, n, dh, qr, d, Ks, d, sc, m, zero);
            else
#endif
                scores_scalar(nq, n, dh, qr, d, Ks, d, sc, m);
            for (int i = 0; i < nq; i++) {
                float *a = sc + (size_t)i * m;
                if (alpha != 1.0f)
                    for (int p = 0; p < n; p++)
                        a[p] *= alpha;
                luna_cpu_softmax_row(a, a, n, n);
            }
#if defined(__x86_64__) && defined(__GNUC__)
            if (simd)
                outputs_avx2(nq, n, dh, sc, m, Vs, d, yr, d);
            else
#endif
                outputs_scalar(nq, n, dh, sc, m, Vs, d, yr, d);
        }
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}
