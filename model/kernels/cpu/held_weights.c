/* Weights held constant (decoding): hold_weights / release_weights and the small-batch Linear
 * that uses them (core/backend.h, "Weights held constant").
 *
 * Why: a decoding step multiplies a few hundred rows (sentences × beam) by every decoder weight
 * and by the [V, d] output embedding. OpenBLAS packs both operands into its panel layout on every
 * call; with so few rows, packing W (read W, write the panel, read the panel again) costs about
 * as much as the multiplication itself (a profile of a transformer's decoding:
 * docs/benchmarks.md). Held weights are packed once, when decoding
 * starts, into 16-column panels:
 *
 *   Wp[p][k][j] = W[16p + j, k]      (p < ceil(out/16), k < in, j < 16; zero past `out`)
 *
 * and y[i, n] = Σ_k x[i, k] · W[n, k] (+ b[n]) is computed by an AVX2/FMA micro-kernel on 6 rows ×
 * 16 columns (12 accumulator registers, the shape of OpenBLAS's own Haswell kernel; the rows of x
 * are first packed 6 at a time, interleaved, so that the kernel reads one sequential stream; the
 * last 1-3 rows take two panels at once), one fused multiply-add per k in ascending order from 0,
 * then + b. Every output element is computed the same way whatever the thread count, the kernel
 * or the rows around it (threads split pairs of panels): results
 * are deterministic, and equal OpenBLAS's within the GEMM tolerance of the backend contract (its
 * kernel splits K into blocks and orders the accumulation differently, so not bit for bit).
 * Without AVX2/FMA hold_weights keeps nothing and linear_forward stays on OpenBLAS.
 *
 * Held as int8 (dtype LUNA_I8), W is quantized and packed by held_int8.c, whose kernel (AVX-512
 * VNNI, AVX2 or scalar, the best this CPU runs) then computes linear_forward(W) on every CPU. */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/cpu/held_int8.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_KERNEL 1
#else
#define HAVE_X86_KERNEL 0
#endif

#define PANEL 16 /* output columns per panel: two 8-float AVX registers */
#define MR 6     /* rows per micro-kernel call */
/* Software prefetch, PF_AHEAD k ahead (16 k = 16 cache lines of a panel), on a panel's first pass
 * over the rows and on the last 1-5 rows: there the panel comes from L3 or memory (a step reads
 * ~19 MB of weights) or L2, and with few rows the hardware prefetcher alone leaves the kernel
 * waiting on it (measured with few and many rows: docs/benchmarks.md). Later passes read the
 * panel from L1 and would only spend load slots. */
#define PF_AHEAD 16

typedef struct {
    const float *W; /* the caller's weights (the key) */
    int out, in;
    int refs; /* holds not yet released (two decoders on one model share the panels) */
    luna_dtype dtype;
    float *panels;       /* F32: [ceil(out/16)][in][16] */
    luna_int8_weight q8; /* I8 */
} held_weight;

struct luna_cpu_held {
    held_weight *items;
    int count, cap;
    int last;     /* index of the last hit: decoding looks the same few weights up in turn */
    float *xpack; /* the rows of x packed for the micro-kernel (luna_cpu_held_linear) */
    size_t xpack_cap;
    luna_int8_kernel q8_kernel; /* the int8 kernel (luna_int8_kernel_best unless a test chose) */
    luna_int8_scratch q8_scratch;
};

static luna_status held_state(luna_backend *be, luna_cpu_held **out) {
    luna_cpu_held *h = be->impl;
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory");
        h->q8_kernel = luna_int8_kernel_best();
        be->impl = h;
    }
    *out = h;
    return LUNA_OK;
}

luna_status luna_cpu_set_int8_kernel(luna_backend *be, int kernel) {
    if (!luna_int8_kernel_available((luna_int8_kernel)kernel))
        return luna_error(LUNA_ERR_UNSUPPORTED, "int8 kernel %s: this CPU lacks its instructions",
                          luna_int8_kernel_name((luna_int8_kernel)kernel));
    luna_cpu_held *h = NULL;
    LUNA_TRY(held_state(be, &h));
    h->q8_kernel = (luna_int8_kernel)kernel;
    return LUNA_OK;
}

int luna_cpu_int8_kernel(luna_backend *be) {
    const luna_cpu_held *h = be->impl;
    return h ? (int)h->q8_kernel : (int)luna_int8_kernel_best();
}

static held_weight *find(luna_cpu_held *h, const float *W) {
    if (!h || !W) return NULL;
    if (h->last < h->count && h->items[h->last].W == W) return &h->items[h->last];
    for (int i = 0; i < h->count; i++)
        if (h->items[i].W == W) {
            h->last = i;
            return &h->items[i];
        }
    return NULL;
}

static bool kernel_available(void) {
#if HAVE_X86_KERNEL
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

luna_status luna_cpu_hold_weights(luna_backend *be, const float *W, int out, int in,
                                  luna_dtype dtype) {
    /* fp32 without the kernel: nothing to gain, linear_forward uses OpenBLAS */
    if (dtype == LUNA_F32 && !kernel_available()) return LUNA_OK;
    luna_cpu_held *h = NULL;
    LUNA_TRY(held_state(be, &h));
    held_weight *old = find(h, W);
    if (old) {
        if (old->out != out || old->in != in || old->dtype != dtype)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "hold_weights: W is held as [%d, %d] %s, not [%d, %d] %s", old->out,
                              old->in, luna_dtype_name(old->dtype), out, in,
                              luna_dtype_name(dtype));
        old->refs++; /* held already: the weights are constant, the panels still hold */
        return LUNA_OK;
    }
    if (h->count == h->cap) {
        int cap = h->cap ? 2 * h->cap : 32;
        held_weight *items = realloc(h->items, sizeof *items * (size_t)cap);
        if (!items) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory");
        h->items = items;
        h->cap = cap;
    }
    if (dtype == LUNA_I8) {
        luna_int8_weight q8;
        LUNA_TRY(luna_int8_weight_pack(&q8, W, out, in, be->num_threads));
        h->items[h->count++] = (held_weight){W, out, in, 1, LUNA_I8, NULL, q8};
        return LUNA_OK;
    }
    const int np = (out + PANEL - 1) / PANEL;
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof(float) * (size_t)np * in * PANEL) != 0)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory for [%d, %d]", out,
                          in);
#pragma omp parallel for num_threads(be->num_threads) schedule(static)
    for (int q = 0; q < np; q++)
        for (int k = 0; k < in; k++)
            for (int j = 0; j < PANEL; j++) {
                const int n = q * PANEL + j;
                p[((size_t)q * in + k) * PANEL + j] = n < out ? W[(size_t)n * in + k] : 0.0f;
            }
    h->items[h->count++] = (held_weight){W, out, in, 1, LUNA_F32, p, {0}};
    return LUNA_OK;
}

luna_status luna_cpu_release_weights(luna_backend *be, const float *W) {
    luna_cpu_held *h = be->impl;
    if (!W) return LUNA_OK;
    held_weight *it = find(h, W);
    if (!it && !kernel_available()) return LUNA_OK; /* an fp32 hold that kept nothing */
    if (!it)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "release_weights: %p is not held",
                          (const void *)W);
    if (--it->refs > 0) return LUNA_OK;
    free(it->panels);
    luna_int8_weight_free(&it->q8);
    *it = h->items[--h->count];
    h->last = 0;
    return LUNA_OK;
}

void luna_cpu_held_free(luna_cpu_held *h) {
    if (!h) return;
    for (int i = 0; i < h->count; i++) {
        free(h->items[i].panels);
        luna_int8_weight_free(&h->items[i].q8);
    }
    free(h->items);
    free(h->xpack);
    luna_int8_scratch_free(&h->q8_scratch);
    free(h);
}

#if HAVE_X86_KERNEL
/* The rows of x are packed once per call into blocks of MR interleaved rows,
 *   xp[blk][k][i] = x[MR·blk + i, k]      (zero past the last row),
 * so the micro-kernel broadcasts from one sequential stream instead of MR row streams. */

/* acc[i][j] (row stride 32) = Σ_k xp[k][i] · wp[k][j] for i < mr (≤ 6), j < 16 (one panel; or
 * 32, two panels, the second at wp + pstride), one fused multiply-add per k in ascending order
 * from 0: every output element is one chain, whatever the kernel. mr is a constant at every call
 * site, so the loops unroll into live accumulators; few rows (mr ≤ 3) take two panels at once to
 * keep enough independent chains for the FMA units. The k loop is unrolled by 4: its own
 * instructions otherwise take issue slots from the multiply-adds (docs/benchmarks.md). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
micro_kernel1(const int mr, const bool pf, const float *xp, const float *wp, int K, float *acc) {
    __m256 c[MR][2];
    for (int i = 0; i < MR; i++)
        c[i][0] = c[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < K; k++) {
        if (pf) _mm_prefetch((const char *)(wp + (size_t)(k + PF_AHEAD) * PANEL), _MM_HINT_T0);
        const __m256 w0 = _mm256_load_ps(wp + (size_t)k * PANEL);
        const __m256 w1 = _mm256_load_ps(wp + (size_t)k * PANEL + 8);
        for (int i = 0; i < MR; i++) {
            if (i >= mr) continue;
            const __m256 a = _mm256_broadcast_ss(xp + (size_t)k * MR + i);
            c[i][0] = _mm256_fmadd_ps(a, w0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, w1, c[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(acc + i * 2 * PANEL, c[i][0]);
        _mm256_storeu_ps(acc + i * 2 * PANEL + 8, c[i][1]);
    }
}

/* Two panels (the second at wp + pstride) for mr ≤ 3 rows: 4·mr chains. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
micro_kernel2(const int mr, const bool pf, const float *xp, const float *wp, size_t pstride, int K,
              float *acc) {
    __m256 c[3][4];
    for (int i = 0; i < 3; i++)
        c[i][0] = c[i][1] = c[i][2] = c[i][3] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *w = wp + (size_t)k * PANEL;
        if (pf) {
            _mm_prefetch((const char *)(w + (size_t)PF_AHEAD * PANEL), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + pstride + (size_t)PF_AHEAD * PANEL), _MM_HINT_T0);
        }
        const __m256 w0 = _mm256_load_ps(w), w1 = _mm256_load_ps(w + 8);
        const __m256 w2 = _mm256_load_ps(w + pstride), w3 = _mm256_load_ps(w + pstride + 8);
        for (int i = 0; i < 3; i++) {
            if (i >= mr) continue;
            const __m256 a = _mm256_broadcast_ss(xp + (size_t)k * MR + i);
            c[i][0] = _mm256_fmadd_ps(a, w0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, w1, c[i][1]);
            c[i][2] = _mm256_fmadd_ps(a, w2, c[i][2]);
            c[i][3] = _mm256_fmadd_ps(a, w3, c[i][3]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < 4; p++)
            _mm256_storeu_ps(acc + i * 2 * PANEL + p * 8, c[i][p]);
}

/* y rows [i0, i0 + mr) of panels q.. q + np - 1 from acc (row stride 2·PANEL), + b. */
static void store_rows(const held_weight *hw, int q, int np, const float *acc, const float *b,
                       float *y, int64_t i0, int mr) {
    const int N = hw->out;
    for (int p = 0; p < np; p++) {
        const int n0 = (q + p) * PANEL, nn = N - n0 < PANEL ? N - n0 : PANEL;
        for (int i = 0; i < mr; i++) {
            float *yr = y + (i0 + i) * N + n0;
            const float *ar = acc + i * 2 * PANEL + p * PANEL;
            if (b)
                for (int j = 0; j < nn; j++)
                    yr[j] = ar[j] + b[n0 + j];
            else
                memcpy(yr, ar, sizeof(float) * (size_t)nn);
        }
    }
}

/* Panels q and q + 1 (when np = 2) for every row. */
__attribute__((target("avx2,fma"))) static void panel_rows(const held_weight *hw, int q, int np,
                                                           const float *xp, const float *b,
                                                           float *y, int64_t rows) {
    const int K = hw->in;
    const size_t pstride = (size_t)K * PANEL;
    const float *wp = hw->panels + (size_t)q * pstride;
    float acc[MR * 2 * PANEL];
    const int64_t full = rows / MR * MR;
    for (int p = 0; p < np; p++) /* full blocks: one panel at a time (it stays in L1) */
        for (int64_t i0 = 0; i0 < full; i0 += MR) {
            if (i0 == 0) /* the panel's first pass (see PF_AHEAD) */
                micro_kernel1(6, true, xp, wp + p * pstride, K, acc);
            else
                micro_kernel1(6, false, xp + i0 * K, wp + p * pstride, K, acc);
            store_rows(hw, q + p, 1, acc, b, y, i0, MR);
        }
    const int mr = (int)(rows - full);
    if (mr == 0) return;
    const float *xr = xp + full * K;
    if (np == 2) {
        switch (mr) {
        case 5: micro_kernel1(5, true, xr, wp, K, acc); break;
        case 4: micro_kernel1(4, true, xr, wp, K, acc); break;
        case 3: micro_kernel2(3, true, xr, wp, pstride, K, acc); break;
        case 2: micro_kernel2(2, true, xr, wp, pstride, K, acc); break;
        default: micro_kernel2(1, true, xr, wp, pstride, K, acc); break;
        }
        if (mr <= 3) {
            store_rows(hw, q, 2, acc, b, y, full, mr);
            return;
        }
        store_rows(hw, q, 1, acc, b, y, full, mr);
        wp += pstride, q++;
    }
    switch (mr) {
    case 5: micro_kernel1(5, true, xr, wp, K, acc); break;
    case 4: micro_kernel1(4, true, xr, wp, K, acc); break;
    case 3: micro_kernel1(3, true, xr, wp, K, acc); break;
    case 2: micro_kernel1(2, true, xr, wp, K, acc); break;
    default: micro_kernel1(1, true, xr, wp, K, acc); break;
    }
    store_rows(hw, q, 1, acc, b, y, full, mr);
}

/* Block i0 / MR of xp [ceil(rows/MR)][K][MR] from x [rows, K] (zeros past the last row). */
static void pack_block(float *xp, const float *x, int64_t rows, int K, int64_t i0) {
    float *blk = xp + i0 * K;
    const int mr = rows - i0 < MR ? (int)(rows - i0) : MR;
    for (int i = 0; i < MR; i++) {
        const float *xr = x + (i0 + i) * K;
        if (i < mr)
            for (int k = 0; k < K; k++)
                blk[(size_t)k * MR + i] = xr[k];
        else
            for (int k = 0; k < K; k++)
                blk[(size_t)k * MR + i] = 0.0f;
    }
}
#endif

luna_status luna_cpu_held_linear(luna_backend *be, float *y, const float *x, const float *W,
                                 const float *b, int64_t rows, int in, int out) {
    luna_cpu_held *h = be->impl;
    held_weight *hw = find(h, W);
    if (!hw || hw->in != in || hw->out != out || rows <= 0) return LUNA_ERR_UNSUPPORTED;
    if (hw->dtype == LUNA_I8) {
        if (luna_int8_linear(h->q8_kernel, &hw->q8, &h->q8_scratch, y, x, b, rows,
                             be->num_threads))
            return LUNA_OK;
        return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                          "linear: no memory for the int8 activations of %lld rows x %d",
                          (long long)rows, in);
    }
#if HAVE_X86_KERNEL
    const int np = (out + PANEL - 1) / PANEL, npairs = (np + 1) / 2;
    const size_t need = (size_t)((rows + MR - 1) / MR * MR) * (size_t)in;
    if (need > h->xpack_cap) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, sizeof(float) * need) != 0)
            return LUNA_ERR_UNSUPPORTED; /* OpenBLAS with W, which needs no packing room */
        free(h->xpack);
        h->xpack = p;
        h->xpack_cap = need;
    }
    float *xp = h->xpack;
    /* threads pack blocks of rows, then split the pairs of panels (one region: the packing is
     * not left to one thread while the other waits); small products stay on one thread
     * (fork/join ~µs) */
    const int threads = rows * (int64_t)in * out >= 65536 ? be->num_threads : 1;
    const int64_t nblk = (rows + MR - 1) / MR;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblk; blk++)
            pack_block(xp, x, rows, in, blk * MR);
#pragma omp for schedule(static)
        for (int q2 = 0; q2 < npairs; q2++)
            panel_rows(hw, 2 * q2, 2 * q2 + 1 < np ? 2 : 1, xp, b, y, rows);
    }
    return LUNA_OK;
#else
    return LUNA_ERR_UNSUPPORTED;
#endif
}
