/* Causal normalised contraction: the two causal products of Luna decoder self-attention (spec §3).
 *
 * For each of G independent groups (batch × head), positions t = 1..n (1-based):
 *
 *     out_t = (1/t) · Σ_{s≤t} (x_t · a_s) · b_s                x, a [G, n, p];  b, out [G, n, q]
 *           = (1/t) · S_tᵀ x_t,   S_t = Σ_{s≤t} a_s b_sᵀ  [p, q]   (the running "packed" state)
 *
 * (x, a, b) = (Q, K, Φ) gives S_t [l] of spec §3 step 4 (p = d_h, q = l); (A, Φ, V) gives O_t [d_h]
 * of step 6 (p = l, q = d_h).
 *
 * Forward: a scan over t keeping S_t (p×q floats per thread): S_t = S_{t-1} + a_t b_tᵀ (rank-1
 * update, 2pq flops), then out_t = (1/t) S_tᵀ x_t (vector–matrix product, 2pq flops).
 * O(n·p·q) per group; neither the n×n score matrix nor the n×p×q cumulative tensor is formed.
 *
 * Backward. Let L be a scalar with upstream gradient dout_t = ∂L/∂out_t and g_t = dout_t / t.
 * L depends on the inputs through Σ_t dout_t · out_t = Σ_t Σ_{s≤t} (x_t · a_s)(b_s · g_t), so
 *   ∂L/∂x_t = Σ_{s≤t} a_s (b_s · g_t)             = S_t g_t                        [p]
 *   ∂L/∂a_s = Σ_{t≥s} x_t (b_s · g_t)             = R_s b_s,   R_s = Σ_{t≥s} x_t g_tᵀ [p, q]
 *   ∂L/∂b_s = Σ_{t≥s} (x_t · a_s) g_t             = R_sᵀ a_s
 * dx is a second forward scan over S_t; da and db come from one reverse scan s = n..1 over
 * R_s = R_{s+1} + x_s g_sᵀ, both products from the same state. Per position: forward 4pq flops,
 * backward 10pq (two rank-1 updates, three products).
 *
 * Kernel. Every scan step is step_sum or step_both: with a state M [r, c] (row-major),
 *   M[k, :] += u[k] · v           (rank-1 update, contiguous AXPY per row)
 *   out      = Σ_k w[k] M[k, :]   (vector–matrix product, vectorised along the rows)
 *   dots[k]  = M[k, :] · z         (matrix–vector product, one dot per row; step_both only)
 * fused row by row, four rows at a time, so the state is read and written once per step. The
 * forward keeps S [p, q], the dx scan Sᵀ [q, p] (both use only `out`); the reverse scan needs both
 * products and keeps R [p, q] or Rᵀ [q, p], whichever has the longer rows (longer contiguous rows
 * for the vector loops: the faster orientation for the Luna shapes, docs/benchmarks.md).
 *
 * Threads take whole groups (static schedule), so each group's arithmetic is sequential and
 * results are bit-identical for any thread count. Each thread's state (pq + q floats) comes from
 * be->scratch.
 */
#include <omp.h>
#include <stdint.h>

#include "core/allocator.h"
#include "model/kernels/cpu/cpu_ops.h"

/* ISO C mode compiles with -ffp-contract=off; ask for the fused multiply-add where the machine
 * has one (fmaf is then a single instruction the vectoriser understands). */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#include <math.h>
#define MADD(a, b, c) fmaf((a), (b), (c))
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

/* The scan step on the state M [r, c] (see the file comment), in two specialisations (a generic
 * one with optional outputs is not reliably inlined and then vectorises badly):
 *   step_sum:  M[k, :] += u[k]·v;  out = scale · Σ_k w[k] M[k, :]
 *   step_both: M[k, :] += u[k]·v;  out = Σ_k w[k] M[k, :];  dots[k] = M[k, :]·z
 * with u, w, dots [r] and v, z, out [c]. Rows are processed four at a time: M is read and written
 * once per step, out once per four rows. The dot products are reassociated by `omp simd` (the
 * order is fixed for a given binary, whatever the thread count). */
#define ROWS4(k)                                                                                   \
    float *restrict M0 = M + (int64_t)(k)*c, *restrict M1 = M0 + c, *restrict M2 = M1 + c,         \
                    *restrict M3 = M2 + c;                                                         \
    const float u0 = u[k], u1 = u[(k) + 1], u2 = u[(k) + 2], u3 = u[(k) + 3]
#define UPDATE4(j)                                                                                 \
    float m0 = MADD(u0, v[j], M0[j]), m1 = MADD(u1, v[j], M1[j]);                                  \
    float m2 = MADD(u2, v[j], M2[j]), m3 = MADD(u3, v[j], M3[j]);                                  \
    M0[j] = m0;                                                                                    \
    M1[j] = m1;                                                                                    \
    M2[j] = m2;                                                                                    \
    M3[j] = m3

static void step_sum(float *restrict M, int r, int c, const float *restrict u,
                     const float *restrict v, const float *restrict w, float *restrict out,
                     float scale) {
    for (int j = 0; j < c; j++)
        out[j] = 0.0f;
    int k = 0;
    for (; k + 4 <= r; k += 4) {
        ROWS4(k);
        const float w0 = w[k], w1 = w[k + 1], w2 = w[k + 2], w3 = w[k + 3];
        for (int j = 0; j < c; j++) {
            UPDATE4(j);
            out[j] = MADD(w3, m3, MADD(w2, m2, MADD(w1, m1, MADD(w0, m0, out[j]))));
        }
    }
    for (; k < r; k++) {
        float *restrict Mk = M + (int64_t)k * c;
        for (int j = 0; j < c; j++) {
            Mk[j] = MADD(u[k], v[j], Mk[j]);
            out[j] = MADD(w[k], Mk[j], out[j]);
        }
    }
    if (scale != 1.0f)
        for (int j = 0; j < c; j++)
            out[j] *= scale;
}

static void step_both(float *restrict M, int r, int c, const float *restrict u,
                      const float *restrict v, const float *restrict w, float *restrict out,
                      const float *restrict z, float *restrict dots) {
    for (int j = 0; j < c; j++)
        out[j] = 0.0f;
    int k = 0;
    for (; k + 4 <= r; k += 4) {
        ROWS4(k);
        const float w0 = w[k], w1 = w[k + 1], w2 = w[k + 2], w3 = w[k + 3];
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int j = 0; j < c; j++) {
            UPDATE4(j);
            out[j] = MADD(w3, m3, MADD(w2, m2, MADD(w1, m1, MADD(w0, m0, out[j]))));
            s0 = MADD(m0, z[j], s0);
            s1 = MADD(m1, z[j], s1);
            s2 = MADD(m2, z[j], s2);
            s3 = MADD(m3, z[j], s3);
        }
        dots[k] = s0;
        dots[k + 1] = s1;
        dots[k + 2] = s2;
        dots[k + 3] = s3;
    }
    for (; k < r; k++) {
        float *restrict Mk = M + (int64_t)k * c;
        float sk = 0.0f;
#pragma omp simd reduction(+ : sk)
        for (int j = 0; j < c; j++) {
            Mk[j] = MADD(u[k], v[j], Mk[j]);
            out[j] = MADD(w[k], Mk[j], out[j]);
            sk = MADD(Mk[j], z[j], sk);
        }
        dots[k] = sk;
    }
}

/* Per-thread state: `floats` floats each, rounded up to 64 floats (256 bytes: no false sharing,
 * aligned rows for the vector loads), for be->num_threads threads. */
static float *thread_states(luna_backend *be, const char *what, int64_t floats, int64_t *stride) {
    *stride = (floats + 63) & ~(int64_t)63;
    int nt = be->num_threads > 0 ? be->num_threads : 1;
    float *s = luna_arena_alloc(be->scratch, (size_t)(*stride * nt) * sizeof(float));
    if (!s) luna_error_prefix("%s: scratch for %d thread states", what, nt);
    return s;
}

/* The layout of the rows: the caller's, or packed [G, n, p] and [G, n, q]. */
static luna_causal_layout layout_of(const luna_causal_layout *layout, int n, int p, int q) {
    return layout ? *layout
                  : (luna_causal_layout){.H = 1,
                                         .p_ld = p,
                                         .q_ld = q,
                                         .p_outer = (int64_t)n * p,
                                         .q_outer = (int64_t)n * q};
}

/* Element offsets of row t of group g: p-long (x, a, dx, da) and q-long (b, out, db, dout). */
static inline int64_t row_p(const luna_causal_layout *l, int g, int t) {
    return (int64_t)(g / l->H) * l->p_outer + (int64_t)(g % l->H) * l->p_inner +
           (int64_t)t * l->p_ld;
}
static inline int64_t row_q(const luna_causal_layout *l, int g, int t) {
    return (int64_t)(g / l->H) * l->q_outer + (int64_t)(g % l->H) * l->q_inner +
           (int64_t)t * l->q_ld;
}

/* out [G, n, q] = alpha·(1/t) Σ_{s≤t} (x_t·a_s) b_s for x, a [G, n, p], b [G, n, q] (rows
 * where the layout puts them). alpha·(1/t) is one factor: for a power-of-two alpha the bits of
 * scaling x first. */
luna_status luna_cpu_causal_contraction_forward(luna_backend *be, luna_act *out_,
                                                const luna_act *x_, const luna_act *a_,
                                                const luna_act *b_, int G, int n, int p, int q,
                                                float alpha, const luna_causal_layout *layout) {
    float *out = (float *)out_;
    const float *x = (const float *)x_;
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
    const luna_causal_layout ly = layout_of(layout, n, p, q);
    if ((int64_t)G * n * q == 0) return LUNA_OK;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    int64_t stride;
    float *states = thread_states(be, "causal_contraction_forward", (int64_t)p * q, &stride);
    if (!states) return LUNA_ERR_OUT_OF_MEMORY;
    const float *restrict X = x, *restrict A = a, *restrict Bm = b;
    float *restrict O = out;
#pragma omp parallel num_threads(be->num_threads) if ((int64_t)G * n * p * q > 65536)
    {
        float *restrict S = states + stride * omp_get_thread_num();
#pragma omp for schedule(static)
        for (int g = 0; g < G; g++) {
            for (int64_t i = 0; i < (int64_t)p * q; i++)
                S[i] = 0.0f;
            for (int t = 0; t < n; t++) {
                int64_t rp = row_p(&ly, g, t), rq = row_q(&ly, g, t);
                /* S[i, :] += a_t[i]·b_t;  out_t = (alpha/t) Σ_i x_t[i] S[i, :] */
                step_sum(S, p, q, A + rp, Bm + rq, X + rp, O + rq, alpha * (1.0f / (float)(t + 1)));
            }
        }
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}

/* dx, da [G, n, p], db [G, n, q] (overwritten) from dout [G, n, q]; see the file comment
 * (alpha goes into g_t = alpha·dout_t / t, so into all three). */
luna_status luna_cpu_causal_contraction_backward(luna_backend *be, luna_act *dx_, luna_act *da_,
                                                 luna_act *db_, const luna_act *dout_,
                                                 const luna_act *x_, const luna_act *a_,
                                                 const luna_act *b_, int G, int n, int p, int q,
                                                 float alpha, const luna_causal_layout *layout) {
    float *dx = (float *)dx_;
    float *da = (float *)da_;
    float *db = (float *)db_;
    const float *dout = (const float *)dout_;
    const float *x = (const float *)x_;
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
    const luna_causal_layout ly = layout_of(layout, n, p, q);
    if ((int64_t)G * n * (p + q) == 0) return LUNA_OK;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    const int64_t pq = (int64_t)p * q;
    int64_t stride;
    float *states = thread_states(be, "causal_contraction_backward", pq + q, &stride);
    if (!states) return LUNA_ERR_OUT_OF_MEMORY;
    const float *restrict X = x, *restrict A = a, *restrict Bm = b, *restrict D = dout;
    float *restrict DX = dx, *restrict DA = da, *restrict DB = db;
#pragma omp parallel num_threads(be->num_threads) if ((int64_t)G * n * p * q > 16384)
    {
        float *restrict M = states + stride * omp_get_thread_num(); /* S_t, then R_s */
        float *restrict gs = M + pq;                                /* g_s = dout_s / s [q] */
#pragma omp for schedule(static)
        for (int g = 0; g < G; g++) {
            /* dx_t = S_t g_t = (1/t) Σ_j dout_t[j] Sᵀ[j, :],  Sᵀ[j, :] += b_t[j]·a_t. */
            for (int64_t i = 0; i < pq; i++)
                M[i] = 0.0f;
            for (int t = 0; t < n; t++) {
                int64_t rp = row_p(&ly, g, t), rq = row_q(&ly, g, t);
                step_sum(M, q, p, Bm + rq, A + rp, D + rq, DX + rp,
                         alpha * (1.0f / (float)(t + 1)));
            }
            /* Reverse: R_s = R_{s+1} + x_s g_sᵀ, db_s = R_sᵀ a_s, da_s = R_s b_s, from R [p, q]
             * (q ≥ p: db along the rows, da as dots) or Rᵀ [q, p] (the other way round). */
            for (int64_t i = 0; i < pq; i++)
                M[i] = 0.0f;
            for (int s = n - 1; s >= 0; s--) {
                int64_t rp = row_p(&ly, g, s), rq = row_q(&ly, g, s);
                const float inv = alpha * (1.0f / (float)(s + 1));
                for (int j = 0; j < q; j++)
                    gs[j] = D[rq + j] * inv;
                if (q >= p)
                    step_both(M, p, q, X + rp, gs, A + rp, DB + rq, Bm + rq, DA + rp);
                else
                    step_both(M, q, p, gs, X + rp, Bm + rq, DA + rp, A + rp, DB + rq);
            }
        }
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}

/* causal_step_products (core/backend.h): each run of rows at one position is one batched
 * one-row gemm with alpha 1/t, so the CPU's decoding keeps the bits of the gemm that scales its
 * sum once (the translations of a step whose rows share a position do not change). t is host
 * memory on the CPU. */
luna_status luna_cpu_causal_step_products(luna_backend *be, luna_act *y_, const luna_act *x_,
                                          const luna_act *S_, const int32_t *t, int t_all, int R,
                                          int H, int K, int N) {
    float *y = (float *)y_;
    const float *x = (const float *)x_, *S = (const float *)S_;
    for (int r0 = 0; r0 < R;) {
        int r1 = t ? r0 + 1 : R;
        const int tr = t ? t[r0] + 1 : t_all;
        while (t && r1 < R && t[r1] + 1 == tr)
            r1++;
        const int64_t g0 = (int64_t)r0 * H;
        LUNA_TRY(luna_cpu_gemm(be, false, false, 1, N, K, 1.0f / (float)tr, x + g0 * K, K, K,
                               S + g0 * K * N, N, (int64_t)K * N, 0.0f, y + g0 * N, N, N,
                               (r1 - r0) * H));
        r0 = r1;
    }
    return LUNA_OK;
}
