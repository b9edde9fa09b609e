/* The causal normalised contraction (core/backend.h; CPU reference
 * model/kernels/cpu/causal_contraction.c): out_t = (1/t)·Σ_{s≤t} (x_t·a_s)·b_s as a scan with a
 * p×q state, never n×n. One CUDA block per group (batch × head); the state is spread over the
 * threads by columns (each thread keeps its column, ≤ 256 values, in registers/local memory), so
 * a step needs no barrier and no shared memory.
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
 * floats indexed at run time, in local memory (with the state there, these kernels took 29 ms of
 * a 32k-token luna_base_tied update on an H200 against 1.4 ms predicted from their bytes and
 * FLOPs; Luna's l = 32 and d_h = 64 get R = 32 / 64). */
template <int R> struct State { float v[R > 0 ? R : kMaxDim]; };
#define FOR_STATE(k, len) LUNA_UNROLL for (int k = 0; k < (R > 0 ? R : (len)); k++) if (k < (len))

/* One scan: state M [r, c], thread j < c keeps column j; per position t:
 *   M[k, j] = fma(u_t[k], v_t[j], M[k, j]);  out_t[j] = (Σ_k w_t[k]·M[k, j])·(1/(t+1)).
 * u, w have rows r per position, v and out c per position. */
template <typename T, int R>
__global__ void scan_kernel(T *out, const T *u, const T *v, const T *w, int n, int r, int c) {
    const int j = threadIdx.x;
    if (j >= c) return;
    const int64_t g = blockIdx.x;
    State<R> col;
    FOR_STATE(k, r) col.v[k] = 0.0f;
    for (int t = 0; t < n; t++) {
        const int64_t ru = (g * n + t) * r, rc = (g * n + t) * c;
        const float vj = r > 0 ? load(v, rc + j) : 0.0f; /* r = 0: v is not read (as the CPU) */
        float acc = 0.0f;
        FOR_STATE(k, r) {
            col.v[k] = fmaf(load(u, ru + k), vj, col.v[k]);
            acc = fmaf(load(w, ru + k), col.v[k], acc);
        }
        const float scale = 1.0f / (float)(t + 1);
        store(out, rc + j, scale != 1.0f ? __fmul_rn(acc, scale) : acc);
    }
}

/* The reverse scan for da [G, n, p] and db [G, n, q]: threads j < q own R[:, j] (db), threads
 * q ≤ t < q + p own R[t − q, :] (da). */
template <typename T, int R>
__global__ void reverse_kernel(T *da, T *db, const T *dout, const T *x, const T *a, const T *b,
                               int n, int p, int q) {
    const int tid = threadIdx.x;
    if (tid >= p + q) return;
    const int64_t g = blockIdx.x;
    State<R> st;
    const bool column = tid < q;
    const int me = column ? tid : tid - q, len = column ? p : q;
    FOR_STATE(k, len) st.v[k] = 0.0f;
    for (int s = n - 1; s >= 0; s--) {
        const int64_t rp = (g * n + s) * p, rq = (g * n + s) * q;
        const float inv = 1.0f / (float)(s + 1);
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

typedef __nv_bfloat16 bf16_t;

inline unsigned threads_for(int c) { return (unsigned)((c + 31) / 32 * 32); }

/* The state size R for a state of `len` floats per thread (State). */
inline int state_bucket(int len) { return len <= 32 ? 32 : (len <= 64 ? 64 : 0); }

template <typename T>
void launch_scan(cudaStream_t s, int G, unsigned threads, T *out, const T *u, const T *v,
                 const T *w, int n, int r, int c) {
    switch (state_bucket(r)) {
    case 32:
        LUNA_LAUNCH((scan_kernel<T, 32>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c);
        break;
    case 64:
        LUNA_LAUNCH((scan_kernel<T, 64>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c);
        break;
    default: LUNA_LAUNCH((scan_kernel<T, 0>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c);
    }
}

template <typename T>
void launch_reverse(cudaStream_t s, int G, T *da, T *db, const T *dout, const T *x, const T *a,
                    const T *b, int n, int p, int q) {
    const unsigned threads = threads_for(p + q);
    switch (state_bucket(p > q ? p : q)) {
    case 32:
        LUNA_LAUNCH((reverse_kernel<T, 32>), (unsigned)G, threads, 0, s, da, db, dout, x, a, b, n,
                    p, q);
        break;
    case 64:
        LUNA_LAUNCH((reverse_kernel<T, 64>), (unsigned)G, threads, 0, s, da, db, dout, x, a, b, n,
                    p, q);
        break;
    default:
        LUNA_LAUNCH((reverse_kernel<T, 0>), (unsigned)G, threads, 0, s, da, db, dout, x, a, b, n, p,
                    q);
    }
}

} // namespace

extern "C" {

cudaError_t luna_cuda_causal_contraction_forward(cudaStream_t s, int bf16, void *out, const void *x,
                                                 const void *a, const void *b, int G, int n, int p,
                                                 int q) {
    if (G <= 0 || n <= 0 || q <= 0) return cudaSuccess;
    if (p > kMaxDim || q > kMaxDim) return cudaErrorInvalidValue;
    /* state S [p, q]: rows p (u = a, w = x), columns q (v = b, out) */
    if (bf16)
        launch_scan(s, G, threads_for(q), static_cast<bf16_t *>(out),
                    static_cast<const bf16_t *>(a), static_cast<const bf16_t *>(b),
                    static_cast<const bf16_t *>(x), n, p, q);
    else
        launch_scan(s, G, threads_for(q), static_cast<float *>(out), static_cast<const float *>(a),
                    static_cast<const float *>(b), static_cast<const float *>(x), n, p, q);
    return cudaGetLastError();
}

cudaError_t luna_cuda_causal_contraction_backward(cudaStream_t s, int bf16, void *dx, void *da,
                                                  void *db, const void *dout, const void *x,
                                                  const void *a, const void *b, int G, int n, int p,
                                                  int q) {
    if (G <= 0 || n <= 0 || p + q <= 0) return cudaSuccess;
    if (p > kMaxDim || q > kMaxDim) return cudaErrorInvalidValue;
    if (bf16) {
        const bf16_t *D = static_cast<const bf16_t *>(dout), *X = static_cast<const bf16_t *>(x),
                     *A = static_cast<const bf16_t *>(a), *B = static_cast<const bf16_t *>(b);
        if (p > 0) /* dx_t = (1/t) Σ_k dout_t[k] Sᵀ[k, :], Sᵀ [q, p] (u = b, v = a, w = dout) */
            launch_scan(s, G, threads_for(p), static_cast<bf16_t *>(dx), B, A, D, n, q, p);
        launch_reverse(s, G, static_cast<bf16_t *>(da), static_cast<bf16_t *>(db), D, X, A, B, n, p,
                       q);
    } else {
        const float *D = static_cast<const float *>(dout), *X = static_cast<const float *>(x),
                    *A = static_cast<const float *>(a), *B = static_cast<const float *>(b);
        if (p > 0) launch_scan(s, G, threads_for(p), static_cast<float *>(dx), B, A, D, n, q, p);
        launch_reverse(s, G, static_cast<float *>(da), static_cast<float *>(db), D, X, A, B, n, p,
                       q);
    }
    return cudaGetLastError();
}

} // extern "C"
