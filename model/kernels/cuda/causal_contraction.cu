/* The causal normalised contraction (core/backend.h; CPU reference
 * model/kernels/cpu/causal_contraction.c): out_t = alpha·(1/t)·Σ_{s≤t} (x_t·a_s)·b_s, never n×n.
 *
 * bf16 activations with p, q ≤ 64 (Luna: d_h and the projection length l) run the chunked form on
 * tensor cores (causal_tensor_core.cuh). fp32 activations with p, q ≤ 64: the chunked form on
 * CUDA cores (further down; tensor cores would round the operands to bf16 or TF32): per chunk
 * of ≤ 32 positions, masked small matrix products on shared memory plus a p×q state carried from
 * chunk to chunk, one block per group (batch × head). A scan over positions is a chain of n
 * dependent steps per group; the chunked form does the same work as n / C steps of parallel
 * products, every thread owning output elements. Results follow the tolerance tiers of
 * core/backend.h (ACCUM against the CPU), not the CPU's bits; each output is one thread's sum in
 * a fixed order, so they are identical run to run.
 *
 * Otherwise (p or q up to 256) as a scan with a p×q state, the state spread over the threads by
 * columns (each thread keeps its column in local memory):
 *   forward: thread j < q keeps S[:, j]; per t: S[i, j] = fma(a_t[i], b_t[j], S[i, j]) and
 *            out_t[j] = Σ_i x_t[i]·S[i, j], then ·alpha/t.
 *   dx:      the same on Sᵀ (thread j < p keeps Sᵀ[:, j]).
 *   da, db:  R_s = Σ_{t≥s} x_t g_tᵀ (g_t = dout_t·alpha/t) by a reverse scan, kept twice: by
 *            column owners (db_s[j] = Σ_i a_s[i] R[i, j]) and by row owners (da_s[i] = Σ_j
 *            R[i, j] b_s[j]). */
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

/* ==== The chunked form (p, q ≤ 64: Luna's d_h and l) ==========================================
 * Positions are cut into chunks of C ≤ 32. Within a chunk [c0, c0 + C) with rows X_c, A_c [C, p]
 * and B_c [C, q] and the state S = Σ_{s<c0} a_s b_sᵀ [p, q] before it:
 *   out_c = diag(alpha/t) · (X_c S + tril(X_c A_cᵀ) B_c),   then S += A_cᵀ B_c;
 * and backward, with G_c = diag(alpha/t) dout_c, M = tril(G_c B_cᵀ), P = tril(X_c A_cᵀ) and
 * R = Σ_{t ≥ c0 + C} x_t g_tᵀ [p, q] (the state after the chunk, from a reverse pass):
 *   dX_c = M A_c + G_c Sᵀ,   dA_c = Mᵀ X_c + B_c Rᵀ,   dB_c = Pᵀ G_c + A_c R.
 * Every product is a small matrix product over shared memory in which each thread owns output
 * elements and sums in a fixed order (fp32, run-to-run deterministic); the only sequential chain is
 * over the n / C chunks of a group, against n positions for a scan. One block per group; the
 * operands are staged as fp32 with rows padded by one float so that threads walking either index
 * hit distinct banks. */
constexpr int kChunkThreads = 256;
constexpr int kChunkMaxDim = 64;
constexpr size_t kChunkSmemMax = 48 * 1024;

struct ChunkShape {
    int C;             /* positions per chunk */
    int ldp, ldq, ldc; /* padded row lengths of the [C, p], [C, q] and [C, C] tiles */
    int lds;           /* of the state [p, q] */
};

/* Floats of shared memory: `pTiles` [C, p] tiles, `qTiles` [C, q] tiles, `cTiles` [C, C] tiles
 * and the state. */
__host__ __device__ inline size_t chunk_floats(const ChunkShape &c, int p, int pTiles, int qTiles,
                                               int cTiles) {
    return (size_t)c.C * (pTiles * c.ldp + qTiles * c.ldq + cTiles * c.ldc) + (size_t)p * c.lds;
}

/* The largest chunk (32 or 16) whose tiles fit in 48 KiB; C = 0 if none (then the scans run). */
inline ChunkShape chunk_shape(int p, int q, int pTiles, int qTiles, int cTiles) {
    for (int C = 32; C >= 16; C /= 2) {
        const ChunkShape c{C, p + 1, q + 1, C + 1, q + 1};
        if (p <= kChunkMaxDim && q <= kChunkMaxDim &&
            chunk_floats(c, p, pTiles, qTiles, cTiles) * sizeof(float) <= kChunkSmemMax)
            return c;
    }
    return ChunkShape{0, 0, 0, 0, 0};
}

/* dst[tt][k] = src row c0 + tt, element k (tt < tn, k < len), times alpha/(c0 + tt + 1) when
 * `scaled` (the g_t of the backward). */
template <typename T>
__device__ inline void stage_rows(float *dst, int ld, const T *src, const Rows &l, int64_t g,
                                  int c0, int tn, int len, bool scaled, float alpha) {
    for (int i = threadIdx.x; i < tn * len; i += blockDim.x) {
        const int tt = i / len, k = i % len;
        const float v = load(src, row_at(l, g, c0 + tt) + k);
        dst[tt * ld + k] = scaled ? v * (alpha * (1.0f / (float)(c0 + tt + 1))) : v;
    }
}

/* Sc[t][s] = s ≤ t ? Σ_k U[t][k]·V[s][k] : 0 (t, s < tn; rows of len). */
__device__ inline void tril_products(float *Sc, int ldc, const float *U, const float *V, int ld,
                                     int tn, int len) {
    for (int i = threadIdx.x; i < tn * tn; i += blockDim.x) {
        const int t = i / tn, s = i % tn;
        float acc = 0.0f;
        if (s <= t)
            for (int k = 0; k < len; k++)
                acc = fmaf(U[t * ld + k], V[s * ld + k], acc);
        Sc[t * ldc + s] = acc;
    }
}

/* State[k][j] += Σ_{s<tn} U[s][k]·V[s][j]  (U [tn, r] at ldu, V [tn, c] at ldv, state [r, c]). */
__device__ inline void state_add(float *St, int lds, const float *U, int ldu, const float *V,
                                 int ldv, int tn, int r, int c) {
    for (int i = threadIdx.x; i < r * c; i += blockDim.x) {
        const int k = i / c, j = i % c;
        float acc = St[k * lds + j];
        for (int s = 0; s < tn; s++)
            acc = fmaf(U[s * ldu + k], V[s * ldv + j], acc);
        St[k * lds + j] = acc;
    }
}

template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    chunked_forward_kernel(T *out, const T *x, const T *a, const T *b, int n, int p, int q, Rows lp,
                           Rows lq, float alpha, ChunkShape cs) {
    LUNA_DYNAMIC_SHARED(float, smem);
    const int C = cs.C, ldp = cs.ldp, ldq = cs.ldq, ldc = cs.ldc, lds = cs.lds;
    float *X = smem, *A = X + C * ldp, *B = A + C * ldp, *P = B + C * ldq, *S = P + C * ldc;
    const int64_t g = blockIdx.x;
    for (int i = threadIdx.x; i < p * lds; i += blockDim.x)
        S[i] = 0.0f;
    for (int c0 = 0; c0 < n; c0 += C) {
        const int tn = n - c0 < C ? n - c0 : C;
        __syncthreads(); /* the previous chunk's tiles and state update are done */
        stage_rows(X, ldp, x, lp, g, c0, tn, p, false, alpha);
        stage_rows(A, ldp, a, lp, g, c0, tn, p, false, alpha);
        if (p > 0) stage_rows(B, ldq, b, lq, g, c0, tn, q, false, alpha);
        __syncthreads();
        tril_products(P, ldc, X, A, ldp, tn, p);
        __syncthreads();
        /* out_t[j] = alpha/t · (Σ_k x_t[k] S[k][j] + Σ_{s≤t} P[t][s] b_s[j]) */
        for (int i = threadIdx.x; i < tn * q; i += blockDim.x) {
            const int t = i / q, j = i % q;
            float acc = 0.0f;
            for (int k = 0; k < p; k++)
                acc = fmaf(X[t * ldp + k], S[k * lds + j], acc);
            if (p > 0)
                for (int s = 0; s <= t; s++)
                    acc = fmaf(P[t * ldc + s], B[s * ldq + j], acc);
            store(out, row_at(lq, g, c0 + t) + j, acc * (alpha * (1.0f / (float)(c0 + t + 1))));
        }
        __syncthreads(); /* S is read */
        if (c0 + tn < n) state_add(S, lds, A, ldp, B, ldq, tn, p, q);
    }
}

/* One block per group: a reverse pass over the chunks for da, db (state R), then a forward pass
 * for dx (state S). */
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    chunked_backward_kernel(T *dx, T *da, T *db, const T *dout, const T *x, const T *a, const T *b,
                            int n, int p, int q, Rows lp, Rows lq, float alpha, ChunkShape cs) {
    LUNA_DYNAMIC_SHARED(float, smem);
    const int C = cs.C, ldp = cs.ldp, ldq = cs.ldq, ldc = cs.ldc, lds = cs.lds;
    float *X = smem, *A = X + C * ldp, *B = A + C * ldp, *Gt = B + C * ldq, *M = Gt + C * ldq,
          *P = M + C * ldc, *St = P + C * ldc;
    const int64_t g = blockIdx.x;
    const int nchunks = (n + C - 1) / C;

    for (int i = threadIdx.x; i < p * lds; i += blockDim.x)
        St[i] = 0.0f; /* R */
    for (int c = nchunks - 1; c >= 0; c--) {
        const int c0 = c * C, tn = n - c0 < C ? n - c0 : C;
        __syncthreads();
        stage_rows(X, ldp, x, lp, g, c0, tn, p, false, alpha);
        stage_rows(A, ldp, a, lp, g, c0, tn, p, false, alpha);
        stage_rows(B, ldq, b, lq, g, c0, tn, q, false, alpha);
        stage_rows(Gt, ldq, dout, lq, g, c0, tn, q, true, alpha);
        __syncthreads();
        tril_products(M, ldc, Gt, B, ldq, tn, q);
        tril_products(P, ldc, X, A, ldp, tn, p);
        __syncthreads();
        /* da_s[k] = Σ_j b_s[j] R[k][j] + Σ_{t≥s} M[t][s] x_t[k] */
        for (int i = threadIdx.x; i < tn * p; i += blockDim.x) {
            const int s = i / p, k = i % p;
            float acc = 0.0f;
            for (int j = 0; j < q; j++)
                acc = fmaf(B[s * ldq + j], St[k * lds + j], acc);
            for (int t = s; t < tn; t++)
                acc = fmaf(M[t * ldc + s], X[t * ldp + k], acc);
            store(da, row_at(lp, g, c0 + s) + k, acc);
        }
        /* db_s[j] = Σ_k a_s[k] R[k][j] + Σ_{t≥s} P[t][s] g_t[j] */
        for (int i = threadIdx.x; i < tn * q; i += blockDim.x) {
            const int s = i / q, j = i % q;
            float acc = 0.0f;
            for (int k = 0; k < p; k++)
                acc = fmaf(A[s * ldp + k], St[k * lds + j], acc);
            for (int t = s; t < tn; t++)
                acc = fmaf(P[t * ldc + s], Gt[t * ldq + j], acc);
            store(db, row_at(lq, g, c0 + s) + j, acc);
        }
        __syncthreads(); /* R is read */
        if (c > 0) state_add(St, lds, X, ldp, Gt, ldq, tn, p, q);
    }

    __syncthreads();
    for (int i = threadIdx.x; i < p * lds; i += blockDim.x)
        St[i] = 0.0f; /* S */
    for (int c0 = 0; c0 < n; c0 += C) {
        const int tn = n - c0 < C ? n - c0 : C;
        __syncthreads();
        stage_rows(A, ldp, a, lp, g, c0, tn, p, false, alpha);
        stage_rows(B, ldq, b, lq, g, c0, tn, q, false, alpha);
        stage_rows(Gt, ldq, dout, lq, g, c0, tn, q, true, alpha);
        __syncthreads();
        tril_products(M, ldc, Gt, B, ldq, tn, q);
        __syncthreads();
        /* dx_t[k] = Σ_j g_t[j] S[k][j] + Σ_{s≤t} M[t][s] a_s[k] */
        for (int i = threadIdx.x; i < tn * p; i += blockDim.x) {
            const int t = i / p, k = i % p;
            float acc = 0.0f;
            for (int j = 0; j < q; j++)
                acc = fmaf(Gt[t * ldq + j], St[k * lds + j], acc);
            for (int s = 0; s <= t; s++)
                acc = fmaf(M[t * ldc + s], A[s * ldp + k], acc);
            store(dx, row_at(lp, g, c0 + t) + k, acc);
        }
        __syncthreads();
        if (c0 + tn < n) state_add(St, lds, A, ldp, B, ldq, tn, p, q);
    }
}

#include "model/kernels/cuda/causal_tensor_core.cuh"

typedef __nv_bfloat16 bf16_t;

/* bf16 activations with 1 ≤ p, q ≤ 64 (Luna's shapes): the tensor-core kernels. */
inline bool tensor_cores(int bf16, int p, int q) {
    return bf16 && p >= 1 && q >= 1 && p <= tc::kMaxDim && q <= tc::kMaxDim;
}

inline unsigned threads_for(int c) { return (unsigned)((c + 31) / 32 * 32); }

/* The scans, for p or q over 64 (the chunked kernels take Luna's shapes). */
template <typename T>
void launch_scan(cudaStream_t s, int G, unsigned threads, T *out, const T *u, const T *v,
                 const T *w, int n, int r, int c, Rows lr, Rows lc, float alpha) {
    LUNA_LAUNCH((scan_kernel<T, 0>), (unsigned)G, threads, 0, s, out, u, v, w, n, r, c, lr, lc,
                alpha);
}

template <typename T>
void launch_reverse(cudaStream_t s, int G, T *da, T *db, const T *dout, const T *x, const T *a,
                    const T *b, int n, int p, int q, Rows lp, Rows lq, float alpha) {
    LUNA_LAUNCH((reverse_kernel<T, 0>), (unsigned)G, threads_for(p + q), 0, s, da, db, dout, x, a,
                b, n, p, q, lp, lq, alpha);
}

template <typename T>
void contraction_forward(cudaStream_t s, T *out, const T *x, const T *a, const T *b, int G, int n,
                         int p, int q, Rows lp, Rows lq, float alpha) {
    const ChunkShape cs = chunk_shape(p, q, 2, 1, 1);
    if (cs.C > 0) {
        const size_t bytes = chunk_floats(cs, p, 2, 1, 1) * sizeof(float);
        LUNA_LAUNCH(chunked_forward_kernel<T>, (unsigned)G, kChunkThreads, bytes, s, out, x, a, b,
                    n, p, q, lp, lq, alpha, cs);
    } else { /* state S [p, q]: rows p (u = a, w = x), columns q (v = b, out) */
        launch_scan(s, G, threads_for(q), out, a, b, x, n, p, q, lp, lq, alpha);
    }
}

template <typename T>
void contraction_backward(cudaStream_t s, T *dx, T *da, T *db, const T *dout, const T *x,
                          const T *a, const T *b, int G, int n, int p, int q, Rows lp, Rows lq,
                          float alpha) {
    const ChunkShape cs = chunk_shape(p, q, 2, 2, 2);
    if (cs.C > 0) {
        const size_t bytes = chunk_floats(cs, p, 2, 2, 2) * sizeof(float);
        LUNA_LAUNCH(chunked_backward_kernel<T>, (unsigned)G, kChunkThreads, bytes, s, dx, da, db,
                    dout, x, a, b, n, p, q, lp, lq, alpha, cs);
        return;
    }
    if (p > 0) /* dx_t = (alpha/t) Σ_k dout_t[k] Sᵀ[k, :], Sᵀ [q, p] (u = b, v = a, w = dout) */
        launch_scan(s, G, threads_for(p), dx, b, a, dout, n, q, p, lq, lp, alpha);
    launch_reverse(s, G, da, db, dout, x, a, b, n, p, q, lp, lq, alpha);
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
    if (tensor_cores(bf16, p, q))
        return tc::forward(s, static_cast<bf16_t *>(out), static_cast<const bf16_t *>(x),
                           static_cast<const bf16_t *>(a), static_cast<const bf16_t *>(b), G, n, p,
                           q, lp, lq, alpha);
    if (bf16)
        contraction_forward(s, static_cast<bf16_t *>(out), static_cast<const bf16_t *>(x),
                            static_cast<const bf16_t *>(a), static_cast<const bf16_t *>(b), G, n, p,
                            q, lp, lq, alpha);
    else
        contraction_forward(s, static_cast<float *>(out), static_cast<const float *>(x),
                            static_cast<const float *>(a), static_cast<const float *>(b), G, n, p,
                            q, lp, lq, alpha);
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
    if (tensor_cores(bf16, p, q))
        return tc::backward(s, static_cast<bf16_t *>(dx), static_cast<bf16_t *>(da),
                            static_cast<bf16_t *>(db), static_cast<const bf16_t *>(dout),
                            static_cast<const bf16_t *>(x), static_cast<const bf16_t *>(a),
                            static_cast<const bf16_t *>(b), G, n, p, q, lp, lq, alpha);
    if (bf16)
        contraction_backward(s, static_cast<bf16_t *>(dx), static_cast<bf16_t *>(da),
                             static_cast<bf16_t *>(db), static_cast<const bf16_t *>(dout),
                             static_cast<const bf16_t *>(x), static_cast<const bf16_t *>(a),
                             static_cast<const bf16_t *>(b), G, n, p, q, lp, lq, alpha);
    else
        contraction_backward(s, static_cast<float *>(dx), static_cast<float *>(da),
                             static_cast<float *>(db), static_cast<const float *>(dout),
                             static_cast<const float *>(x), static_cast<const float *>(a),
                             static_cast<const float *>(b), G, n, p, q, lp, lq, alpha);
    return cudaGetLastError();
}

} // extern "C"
