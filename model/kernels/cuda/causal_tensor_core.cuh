/* The chunked causal contraction on tensor cores, for bf16 activations with p, q ≤ 64 (Luna's d_h
 * and l). Included by causal_contraction.cu (which defines Rows and row_at), in its anonymous
 * namespace.
 *
 * The chunk form of causal_contraction.cu's fp32 kernels, with every product a tensor-core GEMM
 * (nvcuda::wmma m16n16k16, bf16 operands, fp32 accumulators). Per chunk of C = 32 positions:
 *   forward   O = X S + tril(X Aᵀ) B,  out = diag(alpha/t) O,  then S += Aᵀ B;
 *   backward  G = diag(alpha/t) dout, M = tril(G Bᵀ), P = tril(X Aᵀ), R = Σ_{later chunks} Xᵀ G:
 *             dA = Mᵀ X + B Rᵀ,  dB = Pᵀ G + A R  (chunks last to first, R carried), and
 *             dX = M A + G Sᵀ  (chunks first to last, S carried; chunk 0 has S = 0 and is done in
 *             the first pass).
 * The operands are staged in shared memory as bf16, zero-padded to multiples of 16 in p, q and to
 * C rows; the states S, R are kept in fp32 and rounded to bf16 for their products, as are the
 * masked products M and P: each of these roundings is one bf16 rounding of a value the fp32
 * kernels keep in fp32, so results agree with the CPU within bf16 rounding (the tests' bf16
 * bound), not within the fp32 tiers — that is why fp32 activations keep the fp32 kernels. One
 * block (8 warps) per group; the tiles of a product are dealt to the warps in a fixed way and each
 * tile sums in a fixed order: identical results run to run. */

namespace tc {

using namespace nvcuda;
typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> ARow;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> ACol;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> BRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> BCol;

constexpr int kC = 32, kThreads = 256, kWarps = kThreads / 32, kMaxDim = 64;

inline __host__ __device__ int up16(int v) { return (v + 15) / 16 * 16; }
inline __host__ __device__ size_t align128(size_t bytes) { return (bytes + 127) / 128 * 128; }

/* Row lengths (elements) of the shared tiles: bf16 rows padded by 8 (16 bytes: WMMA's ldm rule,
 * and rows that start on different banks), fp32 rows by 4. */
struct Shape {
    int p16, q16;
    int ldp, ldq, ldc;    /* bf16 [*, p16], [*, q16], [C, C] */
    int ldfp, ldfq, ldsf; /* fp32 [C, max(C, p16)], [C, max(C, q16)], state [p16, q16] */
};
inline __host__ __device__ Shape shape_of(int p, int q) {
    Shape s;
    s.p16 = up16(p), s.q16 = up16(q);
    s.ldp = s.p16 + 8, s.ldq = s.q16 + 8, s.ldc = kC + 8;
    s.ldfp = (s.p16 > kC ? s.p16 : kC) + 4, s.ldfq = (s.q16 > kC ? s.q16 : kC) + 4;
    s.ldsf = s.q16 + 4;
    return s;
}

/* The shared-memory plan: byte offsets of each buffer (128-byte aligned: WMMA wants 32). */
struct Plan {
    size_t x, a, b, g, m, pm, fp, fq, st, stb, bytes;
};
inline __host__ __device__ Plan plan_of(const Shape &s, bool backward) {
    Plan l;
    size_t o = 0;
    l.x = o, o += align128((size_t)kC * s.ldp * 2);
    l.a = o, o += align128((size_t)kC * s.ldp * 2);
    l.b = o, o += align128((size_t)kC * s.ldq * 2);
    l.g = o, o += backward ? align128((size_t)kC * s.ldq * 2) : 0;
    l.m = o, o += backward ? align128((size_t)kC * s.ldc * 2) : 0;
    l.pm = o, o += align128((size_t)kC * s.ldc * 2);
    l.fp = o, o += backward ? align128((size_t)kC * s.ldfp * 4) : 0;
    l.fq = o, o += align128((size_t)kC * s.ldfq * 4);
    l.st = o, o += align128((size_t)s.p16 * s.ldsf * 4);
    l.stb = o, o += align128((size_t)s.p16 * s.ldq * 2);
    l.bytes = o;
    return l;
}

/* Whether every row of a side starts on 16 bytes and holds whole groups of 8 values: then rows
 * move as 16-byte vectors (Luna's heads: p, q and the strides multiples of 8). */
__device__ inline bool vectors_fit(const void *base, const Rows &l, int len) {
    return len % 8 == 0 && l.outer % 8 == 0 && l.inner % 8 == 0 && l.ld % 8 == 0 &&
           (size_t)base % 16 == 0;
}

/* 8 bf16 values in one 16-byte word */
union Vec8 {
    uint4 word;
    bf16 v[8];
};

/* dst[tt][k] (C rows × len16) = row c0 + tt of src, element k (0 past tn rows or len columns),
 * times alpha/(c0 + tt + 1) when `scaled` (rounded to bf16 once). */
__device__ inline void stage(bf16 *dst, int ld, const bf16 *src, const Rows &l, int64_t g, int c0,
                             int tn, int len, int len16, bool scaled, float alpha) {
    if (vectors_fit(src, l, len)) { /* ld is a multiple of 8: dst rows are 16-byte aligned too */
        const int per_row = len16 / 8;
        for (int i = threadIdx.x; i < kC * per_row; i += kThreads) {
            const int tt = i / per_row, k = (i % per_row) * 8;
            Vec8 w;
            w.word = make_uint4(0u, 0u, 0u, 0u);
            if (tt < tn && k < len) {
                w.word = *reinterpret_cast<const uint4 *>(src + row_at(l, g, c0 + tt) + k);
                if (scaled) {
                    const float f = alpha * (1.0f / (float)(c0 + tt + 1));
                    for (int e = 0; e < 8; e++)
                        w.v[e] = __float2bfloat16(__bfloat162float(w.v[e]) * f);
                }
            }
            *reinterpret_cast<uint4 *>(dst + tt * ld + k) = w.word;
        }
        return;
    }
    for (int i = threadIdx.x; i < kC * len16; i += kThreads) {
        const int tt = i / len16, k = i % len16;
        bf16 v = __float2bfloat16(0.0f);
        if (tt < tn && k < len) {
            v = src[row_at(l, g, c0 + tt) + k];
            if (scaled)
                v = __float2bfloat16(__bfloat162float(v) * (alpha * (1.0f / (float)(c0 + tt + 1))));
        }
        dst[tt * ld + k] = v;
    }
}

/* dst (bf16) = src (fp32), rows × cols; with `tril`, zero above the diagonal (column > row). */
__device__ inline void to_bf16(bf16 *dst, int ldd, const float *src, int lds, int rows, int cols,
                               bool tril) {
    for (int i = threadIdx.x; i < rows * cols; i += kThreads) {
        const int r = i / cols, c = i % cols;
        dst[r * ldd + c] = __float2bfloat16(tril && c > r ? 0.0f : src[r * lds + c]);
    }
}

/* F[C, C] = U Vᵀ on the tiles on or below the diagonal (U, V [C, k16] bf16 rows); the tiles above
 * it are not written (to_bf16 with tril reads none of them). */
__device__ inline void lower_products(float *F, int ldf, const bf16 *U, const bf16 *V, int ld,
                                      int k16, int warp, int first_warp) {
    constexpr int T = kC / 16;
    int tile = 0;
    for (int ti = 0; ti < T; ti++)
        for (int tj = 0; tj <= ti; tj++, tile++) {
            if ((tile + first_warp) % kWarps != warp) continue;
            Acc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < k16; k += 16) {
                ARow fa;
                BCol fb;
                wmma::load_matrix_sync(fa, U + ti * 16 * ld + k, ld);
                wmma::load_matrix_sync(fb, V + tj * 16 * ld + k, ld);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(F + ti * 16 * ldf + tj * 16, acc, ldf, wmma::mem_row_major);
        }
}

/* St [r16, c16] (fp32) += Uᵀ V over the C rows (U [C, r16], V [C, c16] bf16 rows). */
__device__ inline void state_add(float *St, int ldsf, const bf16 *U, int ldu, const bf16 *V,
                                 int ldv, int r16, int c16, int warp) {
    const int tc = c16 / 16, tiles = (r16 / 16) * tc;
    for (int tile = warp; tile < tiles; tile += kWarps) {
        const int ti = tile / tc, tj = tile % tc;
        Acc acc;
        wmma::load_matrix_sync(acc, St + ti * 16 * ldsf + tj * 16, ldsf, wmma::mem_row_major);
        for (int k = 0; k < kC; k += 16) {
            ACol fa; /* Uᵀ: U's rows read as columns */
            BRow fb;
            wmma::load_matrix_sync(fa, U + k * ldu + ti * 16, ldu);
            wmma::load_matrix_sync(fb, V + k * ldv + tj * 16, ldv);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(St + ti * 16 * ldsf + tj * 16, acc, ldsf, wmma::mem_row_major);
    }
}

/* F[C, w16] (fp32) = tril(T) V + U Σ, tile by tile over the warps: T [C, C] bf16, zero above the
 * diagonal (its tiles right of the diagonal are skipped), V [C, w16]; the state term (U NULL: none)
 * U [C, k16] times Σ = Sb [k16, w16] or, with `transposed`, Sbᵀ (Sb [w16, k16] read as columns).
 * The three products of the contraction: O = X S + tril(X Aᵀ) B (forward), dX = M A (chunk 0) and
 * dX = M A + G Sᵀ (later chunks). */
template <bool transposed>
__device__ inline void masked_plus_state(float *F, int ldf, const bf16 *T, int ldc, const bf16 *V,
                                         int ldv, int w16, const bf16 *U, int ldu, const bf16 *Sb,
                                         int lds, int k16, int warp) {
    const int tw = w16 / 16;
    for (int tile = warp; tile < (kC / 16) * tw; tile += kWarps) {
        const int ti = tile / tw, tj = tile % tw;
        Acc acc;
        wmma::fill_fragment(acc, 0.0f);
        ARow fa;
        if (U)
            for (int k = 0; k < k16; k += 16) {
                wmma::load_matrix_sync(fa, U + ti * 16 * ldu + k, ldu);
                if (transposed) {
                    BCol fb;
                    wmma::load_matrix_sync(fb, Sb + tj * 16 * lds + k, lds);
                    wmma::mma_sync(acc, fa, fb, acc);
                } else {
                    BRow fb;
                    wmma::load_matrix_sync(fb, Sb + k * lds + tj * 16, lds);
                    wmma::mma_sync(acc, fa, fb, acc);
                }
            }
        for (int k = 0; k <= ti * 16; k += 16) {
            BRow fb;
            wmma::load_matrix_sync(fa, T + ti * 16 * ldc + k, ldc);
            wmma::load_matrix_sync(fb, V + k * ldv + tj * 16, ldv);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(F + ti * 16 * ldf + tj * 16, acc, ldf, wmma::mem_row_major);
    }
}

/* out rows c0 .. c0 + tn of one side: F[t][j] (fp32) times alpha/(c0 + t + 1) when `scaled`. */
__device__ inline void write_rows(bf16 *out, const Rows &l, int64_t g, int c0, int tn, int len,
                                  const float *F, int ldf, bool scaled, float alpha) {
    if (vectors_fit(out, l, len)) {
        const int per_row = len / 8;
        for (int i = threadIdx.x; i < tn * per_row; i += kThreads) {
            const int t = i / per_row, j = (i % per_row) * 8;
            const float f = scaled ? alpha * (1.0f / (float)(c0 + t + 1)) : 1.0f;
            Vec8 w;
            for (int e = 0; e < 8; e++)
                w.v[e] = __float2bfloat16(scaled ? F[t * ldf + j + e] * f : F[t * ldf + j + e]);
            *reinterpret_cast<uint4 *>(out + row_at(l, g, c0 + t) + j) = w.word;
        }
        return;
    }
    for (int i = threadIdx.x; i < tn * len; i += kThreads) {
        const int t = i / len, j = i % len;
        float v = F[t * ldf + j];
        if (scaled) v *= alpha * (1.0f / (float)(c0 + t + 1));
        out[row_at(l, g, c0 + t) + j] = __float2bfloat16(v);
    }
}

__global__ void __launch_bounds__(kThreads)
    forward_kernel(bf16 *out, const bf16 *x, const bf16 *a, const bf16 *b, int n, int p, int q,
                   Rows lp, Rows lq, float alpha) {
    LUNA_DYNAMIC_SHARED(unsigned char, smem);
    const Shape s = shape_of(p, q);
    const Plan pl = plan_of(s, false);
    bf16 *X = (bf16 *)(smem + pl.x), *A = (bf16 *)(smem + pl.a), *B = (bf16 *)(smem + pl.b);
    bf16 *Pm = (bf16 *)(smem + pl.pm), *Sb = (bf16 *)(smem + pl.stb);
    float *F = (float *)(smem + pl.fq), *S = (float *)(smem + pl.st);
    const int64_t g = blockIdx.x;
    const int warp = threadIdx.x / 32;
    for (int i = threadIdx.x; i < s.p16 * s.ldsf; i += kThreads)
        S[i] = 0.0f;
    for (int c0 = 0; c0 < n; c0 += kC) {
        const int tn = n - c0 < kC ? n - c0 : kC;
        __syncthreads(); /* the previous chunk's tiles, F and S are done with */
        stage(X, s.ldp, x, lp, g, c0, tn, p, s.p16, false, alpha);
        stage(A, s.ldp, a, lp, g, c0, tn, p, s.p16, false, alpha);
        stage(B, s.ldq, b, lq, g, c0, tn, q, s.q16, false, alpha);
        if (c0 > 0) to_bf16(Sb, s.ldq, S, s.ldsf, s.p16, s.q16, false);
        __syncthreads();
        lower_products(F, s.ldfq, X, A, s.ldp, s.p16, warp, 0);
        __syncthreads();
        to_bf16(Pm, s.ldc, F, s.ldfq, kC, kC, true);
        __syncthreads();
        /* O = X S + tril(X Aᵀ) B */
        masked_plus_state<false>(F, s.ldfq, Pm, s.ldc, B, s.ldq, s.q16, c0 > 0 ? X : nullptr, s.ldp,
                                 Sb, s.ldq, s.p16, warp);
        __syncthreads();
        write_rows(out, lq, g, c0, tn, q, F, s.ldfq, true, alpha);
        if (c0 + tn < n) state_add(S, s.ldsf, A, s.ldp, B, s.ldq, s.p16, s.q16, warp);
    }
}

/* One block per group: chunks last to first for dA, dB (state R) and chunk 0's dX; then chunks
 * 1 onwards for dX (state S). */
__global__ void __launch_bounds__(kThreads)
    backward_kernel(bf16 *dx, bf16 *da, bf16 *db, const bf16 *dout, const bf16 *x, const bf16 *a,
                    const bf16 *b, int n, int p, int q, Rows lp, Rows lq, float alpha) {
    LUNA_DYNAMIC_SHARED(unsigned char, smem);
    const Shape s = shape_of(p, q);
    const Plan pl = plan_of(s, true);
    bf16 *X = (bf16 *)(smem + pl.x), *A = (bf16 *)(smem + pl.a), *B = (bf16 *)(smem + pl.b);
    bf16 *G = (bf16 *)(smem + pl.g), *Mb = (bf16 *)(smem + pl.m), *Pb = (bf16 *)(smem + pl.pm);
    bf16 *Stb = (bf16 *)(smem + pl.stb);
    float *Fp = (float *)(smem + pl.fp), *Fq = (float *)(smem + pl.fq);
    float *St = (float *)(smem + pl.st);
    const int64_t g = blockIdx.x;
    const int warp = threadIdx.x / 32, tp = s.p16 / 16, tq = s.q16 / 16;
    const int nchunks = (n + kC - 1) / kC;

    for (int i = threadIdx.x; i < s.p16 * s.ldsf; i += kThreads)
        St[i] = 0.0f; /* R */
    for (int c = nchunks - 1; c >= 0; c--) {
        const int c0 = c * kC, tn = n - c0 < kC ? n - c0 : kC;
        const bool has_r = c < nchunks - 1;
        __syncthreads();
        stage(X, s.ldp, x, lp, g, c0, tn, p, s.p16, false, alpha);
        stage(A, s.ldp, a, lp, g, c0, tn, p, s.p16, false, alpha);
        stage(B, s.ldq, b, lq, g, c0, tn, q, s.q16, false, alpha);
        stage(G, s.ldq, dout, lq, g, c0, tn, q, s.q16, true, alpha);
        if (has_r) to_bf16(Stb, s.ldq, St, s.ldsf, s.p16, s.q16, false);
        __syncthreads();
        lower_products(Fq, s.ldfq, G, B, s.ldq, s.q16, warp, 0); /* M */
        lower_products(Fp, s.ldfp, X, A, s.ldp, s.p16, warp, 3); /* P, on the other warps */
        __syncthreads();
        to_bf16(Mb, s.ldc, Fq, s.ldfq, kC, kC, true);
        to_bf16(Pb, s.ldc, Fp, s.ldfp, kC, kC, true);
        __syncthreads();
        /* dA = Mᵀ X + B Rᵀ  [C, p16] into Fp;  dB = Pᵀ G + A R  [C, q16] into Fq */
        for (int tile = warp; tile < (kC / 16) * (tp + tq); tile += kWarps) {
            const bool is_a = tile < (kC / 16) * tp;
            const int t = is_a ? tile : tile - (kC / 16) * tp, w = is_a ? tp : tq;
            const int ti = t / w, tj = t % w;
            const bf16 *tri = is_a ? Mb : Pb, *right = is_a ? X : G, *left = is_a ? B : A;
            const int ldr = is_a ? s.ldp : s.ldq, ldl = is_a ? s.ldq : s.ldp;
            const int kl = is_a ? s.q16 : s.p16;
            Acc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = ti * 16; k < kC; k += 16) { /* (tril)ᵀ: tiles at and below row ti */
                ACol fa;
                BRow fb;
                wmma::load_matrix_sync(fa, tri + k * s.ldc + ti * 16, s.ldc);
                wmma::load_matrix_sync(fb, right + k * ldr + tj * 16, ldr);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            if (has_r)
                for (int k = 0; k < kl; k += 16) {
                    ARow fa;
                    wmma::load_matrix_sync(fa, left + ti * 16 * ldl + k, ldl);
                    if (is_a) { /* Rᵀ: R's rows read as columns */
                        BCol fb;
                        wmma::load_matrix_sync(fb, Stb + tj * 16 * s.ldq + k, s.ldq);
                        wmma::mma_sync(acc, fa, fb, acc);
                    } else {
                        BRow fb;
                        wmma::load_matrix_sync(fb, Stb + k * s.ldq + tj * 16, s.ldq);
                        wmma::mma_sync(acc, fa, fb, acc);
                    }
                }
            float *F = is_a ? Fp : Fq;
            const int ldf = is_a ? s.ldfp : s.ldfq;
            wmma::store_matrix_sync(F + ti * 16 * ldf + tj * 16, acc, ldf, wmma::mem_row_major);
        }
        __syncthreads();
        write_rows(da, lp, g, c0, tn, p, Fp, s.ldfp, false, alpha);
        write_rows(db, lq, g, c0, tn, q, Fq, s.ldfq, false, alpha);
        if (c > 0) {
            state_add(St, s.ldsf, X, s.ldp, G, s.ldq, s.p16, s.q16, warp); /* R += Xᵀ G */
            continue;
        }
        /* chunk 0: dX = M A (S = 0) */
        __syncthreads(); /* Fp is written out */
        masked_plus_state<false>(Fp, s.ldfp, Mb, s.ldc, A, s.ldp, s.p16, nullptr, 0, nullptr, 0, 0,
                                 warp);
        __syncthreads();
        write_rows(dx, lp, g, c0, tn, p, Fp, s.ldfp, false, alpha);
    }
    if (nchunks == 1) return;

    /* dX of chunks 1 onwards: S = Σ_{earlier chunks} Aᵀ B */
    __syncthreads();
    for (int i = threadIdx.x; i < s.p16 * s.ldsf; i += kThreads)
        St[i] = 0.0f;
    for (int c = 0; c < nchunks; c++) {
        const int c0 = c * kC, tn = n - c0 < kC ? n - c0 : kC;
        __syncthreads();
        stage(A, s.ldp, a, lp, g, c0, tn, p, s.p16, false, alpha);
        stage(B, s.ldq, b, lq, g, c0, tn, q, s.q16, false, alpha);
        if (c > 0) {
            stage(G, s.ldq, dout, lq, g, c0, tn, q, s.q16, true, alpha);
            to_bf16(Stb, s.ldq, St, s.ldsf, s.p16, s.q16, false);
        }
        __syncthreads();
        if (c > 0) {
            lower_products(Fq, s.ldfq, G, B, s.ldq, s.q16, warp, 0);
            __syncthreads();
            to_bf16(Mb, s.ldc, Fq, s.ldfq, kC, kC, true);
            __syncthreads();
            /* dX = M A + G Sᵀ */
            masked_plus_state<true>(Fp, s.ldfp, Mb, s.ldc, A, s.ldp, s.p16, G, s.ldq, Stb, s.ldq,
                                    s.q16, warp);
            __syncthreads();
            write_rows(dx, lp, g, c0, tn, p, Fp, s.ldfp, false, alpha);
        }
        if (c + 1 < nchunks) state_add(St, s.ldsf, A, s.ldp, B, s.ldq, s.p16, s.q16, warp);
    }
}

/* The launches (bf16 activations, p, q ≤ 64); shared memory over 48 KiB is asked for once per
 * kernel (the largest plan: p = q = 64). */
inline cudaError_t allow_shared(const void *kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

inline cudaError_t forward(cudaStream_t st, bf16 *out, const bf16 *x, const bf16 *a, const bf16 *b,
                           int G, int n, int p, int q, Rows lp, Rows lq, float alpha) {
    const size_t bytes = plan_of(shape_of(p, q), false).bytes;
    const cudaError_t e = allow_shared((const void *)forward_kernel, bytes);
    if (e != cudaSuccess) return e;
    LUNA_LAUNCH(forward_kernel, (unsigned)G, kThreads, bytes, st, out, x, a, b, n, p, q, lp, lq,
                alpha);
    return cudaGetLastError();
}

inline cudaError_t backward(cudaStream_t st, bf16 *dx, bf16 *da, bf16 *db, const bf16 *dout,
                            const bf16 *x, const bf16 *a, const bf16 *b, int G, int n, int p, int q,
                            Rows lp, Rows lq, float alpha) {
    const size_t bytes = plan_of(shape_of(p, q), true).bytes;
    const cudaError_t e = allow_shared((const void *)backward_kernel, bytes);
    if (e != cudaSuccess) return e;
    LUNA_LAUNCH(backward_kernel, (unsigned)G, kThreads, bytes, st, dx, da, db, dout, x, a, b, n, p,
                q, lp, lq, alpha);
    return cudaGetLastError();
}

} // namespace tc
