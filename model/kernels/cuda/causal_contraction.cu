/* The causal normalised contraction (core/backend.h; CPU reference
 * model/kernels/cpu/causal_contraction.c): out_t = (1/t)·Σ_{s≤t} (x_t·a_s)·b_s as a scan with a
 * p×q state, never n×n. One CUDA block per group (batch × head); the state is spread over the
 * threads by columns (each thread keeps its column, ≤ 256 values, in registers/local memory), so
 * a step needs no barrier; for states of ≤ 64 values a thread, the vectors all threads read are
 * staged in shared memory a tile of positions at a time (scan_tiled_kernel, reverse_tiled_kernel).
 *   forward: thread j < q keeps S[:, j]; per t: S[i, j] = fma(a_t[i], b_t[j], S[i, j]) and
 *            out_t[j] = Σ_i x_t[i]·S[i, j] as a fused multiply-add chain in i, then ·1/t — the
 *            CPU's operations in its order (with FMA: bit-identical where the CPU has FMA).
 *   dx:      the same on Sᵀ (thread j < p keeps Sᵀ[:, j], chain over q), as the CPU.
 *   da, db:  R_s = Σ_{t≥s} x_t g_tᵀ (g_t = dout_t·(1/t)) by a reverse scan, kept twice: by
 *            column owners (db_s[j] = Σ_i a_s[i] R[i, j]) and by row owners (da_s[i] = Σ_j
 *            R[i, j] b_s[j]), both updated with the same fma so the copies agree. The CPU forms
 *            one of these as vectorised dot products (reassociated), so da/db agree within the
 *            ACCUM tier, not bit for bit.
 * p, q ≤ 256 (Luna: d_h and the projection length l). A chunked scan over t (state per chunk,
 * then a prefix over chunks) is the faster design for long n when the cost model asks for it. */
#include "model/kernels/cuda/cuda_compat.h"

#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

constexpr int kMaxDim = 256;

/* The state a thread keeps: R floats when R > 0 — loops unrolled to R with a run-time guard
 * k < len, so every index is a constant and the state stays in registers — or, R = 0, kMaxDim
 * floats indexed at run time, in local memory (with the state there these kernels run many times
 * slower than their bytes and FLOPs allow: docs/benchmarks.md). The kernels below run the generic R
 * = 0 case (p or q over 64); Luna's l = 32 and d_h = 64 go to the tiled kernels further down, which
 * keep their state in registers. */
template <int R> struct State { float v[R > 0 ? R : kMaxDim]; };
#define FOR_STATE(k, len) LUNA_UNROLL for (int k = 0; k < (R > 0 ? R : (len)); k++) if (k < (len))

/* Where row t of group g lies (core/backend.h, luna_causal_layout: one side's strides). */
struct Rows {
    int64_t outer, inner;
    int ld, H;
};
__device__ inline int64_t row_at(const Rows &l, int64_t g, int t) {
    return (g / l.H) * l.outer + (g % l.H) * l.inner + (int64_t)t * l.ld;
}

/* One scan: state M [r, c], thread j < c keeps column j; per position t:
 *   M[k, j] = fma(u_t[k], v_t[j], M[k, j]);  out_t[j] = (Σ_k w_t[k]·M[k, j])·(alpha·(1/(t+1))).
 * u, w have rows r per position (at lr), v and out c per position (at lc). */
template <typename T, int R>
__global__ void scan_kernel(T *out, const T *u, const T *v, const T *w, int n, int r, int c,
                            Rows lr, Rows lc, float alpha) {
    const int j = threadIdx.x;
    if (j >= c) return;
    const int64_t g = blockIdx.x;
    State<R> col;
    FOR_STATE(k, r) col.v[k] = 0.0f;
    for (int t = 0; t < n; t++) {
        const int64_t ru = row_at(lr, g, t), rc = row_at(lc, g, t);
        const float vj = r > 0 ? load(v, rc + j) : 0.0f; /* r = 0: v is not read (as the CPU) */
        float acc = 0.0f;
        FOR_STATE(k, r) {
            col.v[k] = fmaf(load(u, ru + k), vj, col.v[k]);
            acc = fmaf(load(w, ru + k), col.v[k], acc);
        }
        const float scale = alpha * (1.0f / (float)(t + 1));
        store(out, rc + j, scale != 1.0f ? __fmul_rn(acc, scale) : acc);
    }
}

/* The reverse scan for da [G, n, p] and db [G, n, q]: threads j < q own R[:, j] (db), threads
 * q ≤ t < q + p own R[t − q, :] (da). */
template <typename T, int R>
__global__ void reverse_kernel(T *da, T *db, const T *dout, const T *x, const T *a, const T *b,
                               int n, int p, int q, Rows lp, Rows lq, float alpha) {
    const int tid = threadIdx.x;
    if (tid >= p + q) return;
    const int64_t g = blockIdx.x;
    State<R> st;
    const bool column = tid < q;
    const int me = column ? tid : tid - q, len = column ? p : q;
    FOR_STATE(k, len) st.v[k] = 0.0f;
    for (int s = n - 1; s >= 0; s--) {
        const int64_t rp = row_at(lp, g, s), rq = row_at(lq, g, s);
        const float inv = alpha * (1.0f / (float)(s + 1));
        float acc = 0.0f;
        if (column) { /* R[i, me] += x_s[i]·g_s[me];  db_s[me] = Σ_i a_s[i]·R[i, me] */
            const float gj = __fmul_rn(load(dout, rq + me), inv);
            FOR_STATE(i, p) {
                st.v[i] = fmaf(load(x, rp + i), gj, st.v[i]);
                acc = fmaf(load(a, rp + i), st.v[i], acc);
            }
            store(db, rq + me, acc);
        } else { /* R[me, j] += x_s[me]·g_s[j];  da_s[me] = Σ_j R[me, j]·b_s[j] */
            const float xi = load(x, rp + me);
            FOR_STATE(j, q) {
                st.v[j] = fmaf(xi, __fmul_rn(load(dout, rq + j), inv), st.v[j]);
                acc = fmaf(st.v[j], load(b, rq + j), acc);
            }
            store(da, rp + me, acc);
        }
    }
}

/* The same two scans for a state of R ≤ 64 floats per thread (Luna's l = 32 and d_h = 64), with
 * the vectors every thread of the block reads — u_t, w_t in the forward scan; x_s, a_s, dout_s,
 * b_s in the reverse one — staged in shared memory as fp32, kTile positions at a time, by
 * coalesced loads, and read back as float4 broadcasts. Why: reading them from global memory,
 * every thread loads each element itself (a 2-byte load and a conversion per multiply-add), which
 * keeps the reverse scan far from the memory bandwidth (measured: docs/benchmarks.md). The
 * arithmetic is the kernels' above, operation for operation, so the results are bit-identical. */
constexpr int kTile = 16;

/* tn rows from src + at (len values each, ld apart) into dst[tt][0:R) as fp32, zeros past len */
template <typename T, int R>
__device__ inline void stage(float *dst, const T *src, int64_t at, int ld, int tn, int len) {
    for (int i = threadIdx.x; i < kTile * R; i += blockDim.x) {
        const int tt = i / R, k = i % R;
        dst[i] = tt < tn && k < len ? load(src, at + (int64_t)tt * ld + k) : 0.0f;
    }
}

/* One position's step of a thread's state st from two staged vectors f and w (k < len):
 *   st[k] = fma(f_k, factor, st[k]);  return Σ_k w_k·st[k] as an fma chain in k,
 * with f_k = f[k]·pre (rounded) when PRE. The forward scan (f = u_t, factor v_t[j]), the reverse
 * scan's column owners (f = x_s, factor g_s[j]) and its row owners (f = dout_s, pre = 1/(s+1),
 * factor x_s[i]) are this step; fma's product is commutative, so the operations are the earlier
 * kernels' bit for bit. */
template <int R, bool PRE>
__device__ inline float staged_step(float (&st)[R], const float4 *f4, const float4 *w4,
                                    float factor, float pre, int len) {
    float acc = 0.0f;
    LUNA_UNROLL for (int k4 = 0; k4 < R / 4; k4++) {
        if (4 * k4 < len) {
            const float4 ff = f4[k4], ww = w4[k4];
            const float fs[4] = {ff.x, ff.y, ff.z, ff.w}, ws[4] = {ww.x, ww.y, ww.z, ww.w};
            LUNA_UNROLL for (int e = 0; e < 4; e++) {
                const int k = 4 * k4 + e;
                if (k < len) {
                    const float f = PRE ? __fmul_rn(fs[e], pre) : fs[e];
                    st[k] = fmaf(f, factor, st[k]);
                    acc = fmaf(ws[e], st[k], acc);
                }
            }
        }
    }
    return acc;
}

template <typename T, int R>
__global__ void scan_tiled_kernel(T *out, const T *u, const T *v, const T *w, int n, int r, int c,
                                  Rows lr, Rows lc, float alpha) {
    LUNA_SHARED(float4, su4, kTile * R / 4);
    LUNA_SHARED(float4, sw4, kTile * R / 4);
    float *su = reinterpret_cast<float *>(su4), *sw = reinterpret_cast<float *>(sw4);
    const int j = threadIdx.x;
    const int64_t g = blockIdx.x;
    float col[R];
    LUNA_UNROLL for (int k = 0; k < R; k++) col[k] = 0.0f;
    for (int t0 = 0; t0 < n; t0 += kTile) {
        const int tn = n - t0 < kTile ? n - t0 : kTile;
        __syncthreads(); /* the previous tile is read */
        const int64_t at = row_at(lr, g, t0);
        stage<T, R>(su, u, at, lr.ld, tn, r);
        stage<T, R>(sw, w, at, lr.ld, tn, r);
        __syncthreads();
        if (j >= c) continue;
        for (int tt = 0; tt < tn; tt++) {
            const int t = t0 + tt;
            const int64_t rc = row_at(lc, g, t);
            const float vj = r > 0 ? load(v, rc + j) : 0.0f; /* r = 0: v is not read (as the CPU) */
            const float acc =
                staged_step<R, false>(col, su4 + tt * (R / 4), sw4 + tt * (R / 4), vj, 1.0f, r);
            const float scale = alpha * (1.0f / (float)(t + 1));
            store(out, rc + j, scale != 1.0f ? __fmul_rn(acc, scale) : acc);
        }
    }
}

template <typename T, int R>
__global__ void reverse_tiled_kernel(T *da, T *db, const T *dout, const T *x, const T *a,
                                     const T *b, int n, int p, int q, Rows lp, Rows lq,
                                     float alpha) {
    LUNA_SHARED(float4, sx4, kTile * R / 4);
    LUNA_SHARED(float4, sa4, kTile * R / 4);
    LUNA_SHARED(float4, sd4, kTile * R / 4);
    LUNA_SHARED(float4, sb4, kTile * R / 4);
    float *sx = reinterpret_cast<float *>(sx4), *sa = reinterpret_cast<float *>(sa4),
          *sd = reinterpret_cast<float *>(sd4), *sb = reinterpret_cast<float *>(sb4);
    const int tid = threadIdx.x;
    const int64_t g = blockIdx.x;
    const bool column = tid < q, active = tid < p + q;
    const int me = column ? tid : tid - q;
    float st[R];
    LUNA_UNROLL for (int k = 0; k < R; k++) st[k] = 0.0f;
    const int ntiles = (n + kTile - 1) / kTile;
    for (int tile = ntiles - 1; tile >= 0; tile--) {
        const int s0 = tile * kTile, tn = n - s0 < kTile ? n - s0 : kTile;
        __syncthreads(); /* the previous tile is read */
        const int64_t at_p = row_at(lp, g, s0), at_q = row_at(lq, g, s0);
        stage<T, R>(sx, x, at_p, lp.ld, tn, p);
        stage<T, R>(sa, a, at_p, lp.ld, tn, p);
        stage<T, R>(sd, dout, at_q, lq.ld, tn, q);
        stage<T, R>(sb, b, at_q, lq.ld, tn, q);
        __syncthreads();
        if (!active) continue;
        for (int tt = tn - 1; tt >= 0; tt--) {
            const int s = s0 + tt;
            const int64_t rp = row_at(lp, g, s), rq = row_at(lq, g, s);
            const float inv = alpha * (1.0f / (float)(s + 1));
            const int64_t at = tt * (R / 4);
            if (column) { /* R[i, me] += x_s[i]·g_s[me];  db_s[me] = Σ_i a_s[i]·R[i, me] */
                const float gj = __fmul_rn(sd[tt * R + me], inv);
                store(db, rq + me, staged_step<R, false>(st, sx4 + at, sa4 + at, gj, 1.0f, p));
            } else { /* R[me, j] += x_s[me]·g_s[j];  da_s[me] = Σ_j R[me, j]·b_s[j] */
                const float xi = sx[tt * R + me];
                store(da, rp + me, staged_step<R, true>(st, sd4 + at, sb4 + at, xi, inv, q));
            }
        }
    }
}

typedef __nv_bfloat16 bf16_t;

inline unsigned threads_for(int c) { return (unsigned)((c + 31) / 32 * 32); }

/* The state size R for a state of `len` floats per thread (State). */
inline int state_bucket(int len) { return len <= 32 ? 32 : (len <= 64 ? 64 : 0); }

template <typename T>
void launch_scan(cudaStream_t s, int G, unsigned threads, T *out, const T *u, const T *v,
                 const T *w, int n, int r, int c, Rows lr, Rows lc, float alpha) {
    switch (state_bucket(r)) {
    case 32:
        LUNA_LAUNCH((scan_tiled_kernel<T, 32>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c,
                    lr, lc, alpha);
        break;
    case 64:
        LUNA_LAUNCH((scan_tiled_kernel<T, 64>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c,
                    lr, lc, alpha);
        break;
    default:
        LUNA_LAUNCH((scan_kernel<T, 0>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c, lr, lc,
                    alpha);
    }
}

template <typename T>
void launch_reverse(cudaStream_t s, int G, T *da, T *db, const T *dout, const T *x, const T *a,
                    const T *b, int n, int p, int q, Rows lp, Rows lq, float alpha) {
    const unsigned threads = threads_for(p + q);
    switch (state_bucket(p > q ? p : q)) {
    case 32:
        LUNA_LAUNCH((reverse_tiled_kernel<T, 32>), (unsigned)G, threads, 0, s, da, db, dout, x, a,
                    b, n, p, q, lp, lq, alpha);
        break;
    case 64:
        LUNA_LAUNCH((reverse_tiled_kernel<T, 64>), (unsigned)G, threads, 0, s, da, db, dout, x, a,
                    b, n, p, q, lp, lq, alpha);
        break;
    default:
        LUNA_LAUNCH((reverse_kernel<T, 0>), (unsigned)G, threads, 0, s, da, db, dout, x, a, b, n, p,
                    q, lp, lq, alpha);
    }
}

/* The two sides' rows (NULL: packed [G, n, p] and [G, n, q]). */
void sides(const luna_causal_layout *ly, int n, int p, int q, Rows *lp, Rows *lq) {
    if (!ly) {
        *lp = Rows{(int64_t)n * p, 0, p, 1};
        *lq = Rows{(int64_t)n * q, 0, q, 1};
        return;
    }
    *lp = Rows{ly->p_outer, ly->p_inner, ly->p_ld, ly->H};
    *lq = Rows{ly->q_outer, ly->q_inner, ly->q_ld, ly->H};
}

} // namespace

extern "C" {

cudaError_t luna_cuda_causal_contraction_forward(cudaStream_t s, int bf16, void *out, const void *x,
                                                 const void *a, const void *b, int G, int n, int p,
                                                 int q, float alpha,
                                                 const luna_causal_layout *layout) {
    if (G <= 0 || n <= 0 || q <= 0) return cudaSuccess;
    if (p > kMaxDim || q > kMaxDim) return cudaErrorInvalidValue;
    Rows lp, lq;
    sides(layout, n, p, q, &lp, &lq);
    /* state S [p, q]: rows p (u = a, w = x), columns q (v = b, out) */
    if (bf16)
        launch_scan(s, G, threads_for(q), static_cast<bf16_t *>(out),
                    static_cast<const bf16_t *>(a), static_cast<const bf16_t *>(b),
                    static_cast<const bf16_t *>(x), n, p, q, lp, lq, alpha);
    else
        launch_scan(s, G, threads_for(q), static_cast<float *>(out), static_cast<const float *>(a),
                    static_cast<const float *>(b), static_cast<const float *>(x), n, p, q, lp, lq,
                    alpha);
    return cudaGetLastError();
}

cudaError_t luna_cuda_causal_contraction_backward(cudaStream_t s, int bf16, void *dx, void *da,
                                                  void *db, const void *dout, const void *x,
                                                  const void *a, const void *b, int G, int n, int p,
                                                  int q, float alpha,
                                                  const luna_causal_layout *layout) {
    if (G <= 0 || n <= 0 || p + q <= 0) return cudaSuccess;
    if (p > kMaxDim || q > kMaxDim) return cudaErrorInvalidValue;
    Rows lp, lq;
    sides(layout, n, p, q, &lp, &lq);
    if (bf16) {
        const bf16_t *D = static_cast<const bf16_t *>(dout), *X = static_cast<const bf16_t *>(x),
                     *A = static_cast<const bf16_t *>(a), *B = static_cast<const bf16_t *>(b);
        if (p > 0) /* dx_t = (alpha/t) Σ_k dout_t[k] Sᵀ[k, :], Sᵀ [q, p] (u = b, v = a, w = dout) */
            launch_scan(s, G, threads_for(p), static_cast<bf16_t *>(dx), B, A, D, n, q, p, lq, lp,
                        alpha);
        launch_reverse(s, G, static_cast<bf16_t *>(da), static_cast<bf16_t *>(db), D, X, A, B, n, p,
                       q, lp, lq, alpha);
    } else {
        const float *D = static_cast<const float *>(dout), *X = static_cast<const float *>(x),
                    *A = static_cast<const float *>(a), *B = static_cast<const float *>(b);
        if (p > 0)
            launch_scan(s, G, threads_for(p), static_cast<float *>(dx), B, A, D, n, q, p, lq, lp,
                        alpha);
        launch_reverse(s, G, static_cast<float *>(da), static_cast<float *>(db), D, X, A, B, n, p,
                       q, lp, lq, alpha);
    }
    return cudaGetLastError();
}

} // extern "C"
