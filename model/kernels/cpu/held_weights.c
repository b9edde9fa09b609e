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
 * last 1-3 rows take two panels at once) or, where the CPU has AVX-512, on 6 rows × 2 panels (one
 * register per panel row), one fused multiply-add per k in ascending order from 0, then + b.
 * Every output element is computed the same way whatever the thread count, the kernel or the
 * rows around it (threads split the rows in whole blocks, or with few rows the pairs of panels):
 * results are deterministic, and equal OpenBLAS's within the GEMM tolerance of the backend
 * contract (its kernel splits K into blocks and orders the accumulation differently, so not bit
 * for bit).
 * Without AVX2/FMA hold_weights keeps nothing and linear_forward stays on OpenBLAS.
 *
 * Held as int8 (dtype LUNA_I8), W is quantized and packed by held_int8.c, whose kernel (AVX-512
 * VNNI, AVX2 or scalar, the best this CPU runs) then computes linear_forward(W) on every CPU.
 *
 * The holds themselves (the packed copies and their counts) live in a table (held_table.c) that
 * several backends may share, so translators of one model on several threads keep one copy. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/cpu/transpose8.h"
#include "model/kernels/cpu/held_int8.h"
#include "model/kernels/cpu/held_table.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_KERNEL 1
#else
#define HAVE_X86_KERNEL 0
#endif

#define PANEL LUNA_HELD_PANEL
#define MR 6 /* rows per micro-kernel call */
/* Software prefetch, PF_AHEAD k ahead (16 k = 16 cache lines of a panel), on a panel's first pass
 * over the rows and on the last 1-5 rows: there the panel comes from L3 or memory (a step reads
 * ~19 MB of weights) or L2, and with few rows the hardware prefetcher alone leaves the kernel
 * waiting on it (measured with few and many rows: docs/benchmarks.md). Later passes read the
 * panel from L1 and would only spend load slots. */
#define PF_AHEAD 16

typedef luna_held_weight held_weight;

/* A backend's side of its holds: the table (its own, or shared with other CPU backends:
 * luna_cpu_share_held) and what one backend's calls use alone. */
struct luna_cpu_held {
    luna_held_table *table;
    int last;     /* index of the last hit: decoding looks the same few weights up in turn */
    float *xpack; /* the rows of x packed for the micro-kernel (luna_cpu_held_linear) */
    size_t xpack_cap;
    luna_int8_kernel q8_kernel; /* the int8 kernel (luna_int8_kernel_best unless a test chose) */
    int f32_kernel;             /* LUNA_F32_AVX2 or LUNA_F32_AVX512 (the best unless one chose) */
    luna_int8_scratch q8_scratch;
};

static bool f32_kernel_available(int kernel) {
#if HAVE_X86_KERNEL
    __builtin_cpu_init();
    if (kernel == LUNA_F32_AVX512) return __builtin_cpu_supports("avx512f");
    return kernel == LUNA_F32_AVX2 && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
#else
    (void)kernel;
    return false;
#endif
}

/* fp32 holds keep panels only where a kernel runs them (AVX2 + FMA, the minimum) */
static bool kernel_available(void) { return f32_kernel_available(LUNA_F32_AVX2); }

static luna_status held_state(luna_backend *be, luna_cpu_held **out) {
    luna_cpu_held *h = be->impl;
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory");
        const luna_status st = luna_held_table_create(&h->table);
        if (st != LUNA_OK) {
            free(h);
            return st;
        }
        h->q8_kernel = luna_int8_kernel_best();
        h->f32_kernel = f32_kernel_available(LUNA_F32_AVX512) ? LUNA_F32_AVX512 : LUNA_F32_AVX2;
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

luna_status luna_cpu_set_f32_kernel(luna_backend *be, int kernel) {
    if (!f32_kernel_available(kernel))
        return luna_error(LUNA_ERR_UNSUPPORTED, "fp32 kernel %s: this CPU lacks its instructions",
                          luna_cpu_f32_kernel_name(kernel));
    luna_cpu_held *h = NULL;
    LUNA_TRY(held_state(be, &h));
    h->f32_kernel = kernel;
    return LUNA_OK;
}

const char *luna_cpu_f32_kernel_name(int kernel) {
    return kernel == LUNA_F32_AVX512     ? "avx512"
           : kernel == LUNA_F32_AVX2     ? "avx2"
           : kernel == LUNA_F32_OPENBLAS ? "openblas"
                                         : "unknown";
}

int luna_cpu_f32_kernel(luna_backend *be) {
    if (!kernel_available()) return LUNA_F32_OPENBLAS;
    const luna_cpu_held *h = be->impl;
    if (h) return h->f32_kernel;
    return f32_kernel_available(LUNA_F32_AVX512) ? LUNA_F32_AVX512 : LUNA_F32_AVX2;
}

int luna_cpu_int8_kernel(luna_backend *be) {
    const luna_cpu_held *h = be->impl;
    return h ? (int)h->q8_kernel : (int)luna_int8_kernel_best();
}

luna_status luna_cpu_hold_weights(luna_backend *be, const float *W, int out, int in,
                                  luna_dtype dtype) {
    /* the state first, even for a hold that keeps nothing: a backend that held something has
     * it, so sharing its table (luna_cpu_share_held, from another thread) never creates it */
    luna_cpu_held *h = NULL;
    LUNA_TRY(held_state(be, &h));
    /* fp32 without the kernel: nothing to gain, linear_forward uses OpenBLAS */
    if (dtype == LUNA_F32 && !kernel_available()) return LUNA_OK;
    return luna_held_table_hold(h->table, W, out, in, dtype, be->num_threads);
}

luna_status luna_cpu_release_weights(luna_backend *be, const float *W) {
    luna_cpu_held *h = be->impl;
    if (!W) return LUNA_OK;
    bool found = false;
    if (h) luna_held_table_drop(h->table, W, &found);
    if (!found && kernel_available())
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "release_weights: %p is not held",
                          (const void *)W);
    return LUNA_OK; /* released, or an fp32 hold that kept nothing */
}

luna_status luna_cpu_share_held(luna_backend *dst, luna_backend *src) {
    luna_cpu_held *d = NULL, *s = NULL;
    LUNA_TRY(held_state(dst, &d));
    LUNA_TRY(held_state(src, &s));
    if (d->table == s->table) return LUNA_OK;
    int entries = 0;
    size_t bytes = 0;
    luna_held_table_usage(d->table, &entries, &bytes);
    if (entries > 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "share_held_weights: the backend holds %d weights of its own already",
                          entries);
    luna_held_table_retain(s->table);
    luna_held_table_release(d->table);
    d->table = s->table;
    d->last = 0;
    return LUNA_OK;
}

void luna_cpu_held_usage(luna_backend *be, int *entries, size_t *bytes) {
    const luna_cpu_held *h = be->impl;
    luna_held_table_usage(h ? h->table : NULL, entries, bytes);
}

void luna_cpu_held_free(luna_cpu_held *h) {
    if (!h) return;
    luna_held_table_release(h->table);
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

/* AVX-512: one register holds a panel's 16 columns, so a tile of mr rows × np panels (np ≤ 2)
 * keeps mr·np accumulators and broadcasts each k's x from the packed block. Against the AVX2
 * kernel: half the instructions and loads per multiply-add (Zen 4 runs a 512-bit FMA on both of
 * its 256-bit units, so the peak is the same: what it saves is issue slots), and two panels per
 * pass over the rows whatever their number (the AVX2 kernel takes two only for the last 1-3). The
 * same chains as the AVX2 kernel (one FMA per k, ascending from 0, then + b): the results are
 * bit-identical. The tile goes straight from the registers to y
 * (+ b in the register), masked to the panels' columns that exist (the AVX2 kernel's copy
 * through a buffer was a visible share of decoding). */
typedef struct {
    float *y;       /* row i0, column 16q of y */
    int64_t ldy;    /* y's row stride (out) */
    const float *b; /* b + 16q, or NULL */
    __mmask16 m[2]; /* the columns of each panel that exist */
} tile_out;

__attribute__((target("avx512f"), always_inline)) static inline void
micro_kernel512(const int mr, const int np, const bool pf, const float *xp, const float *wp,
                size_t pstride, int K, const tile_out *o) {
    __m512 c[MR][2];
    for (int i = 0; i < MR; i++)
        c[i][0] = c[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < K; k++) {
        const float *w = wp + (size_t)k * PANEL;
        if (pf) {
            _mm_prefetch((const char *)(w + (size_t)PF_AHEAD * PANEL), _MM_HINT_T0);
            if (np == 2)
                _mm_prefetch((const char *)(w + pstride + (size_t)PF_AHEAD * PANEL), _MM_HINT_T0);
        }
        const __m512 w0 = _mm512_load_ps(w);
        const __m512 w1 = np == 2 ? _mm512_load_ps(w + pstride) : w0;
        for (int i = 0; i < MR; i++) {
            if (i >= mr) continue;
            const __m512 a = _mm512_set1_ps(xp[(size_t)k * MR + i]);
            c[i][0] = _mm512_fmadd_ps(a, w0, c[i][0]);
            if (np == 2) c[i][1] = _mm512_fmadd_ps(a, w1, c[i][1]);
        }
    }
    for (int p = 0; p < np; p++) {
        const __m512 bias =
            o->b ? _mm512_maskz_loadu_ps(o->m[p], o->b + p * PANEL) : _mm512_setzero_ps();
        for (int i = 0; i < mr; i++) {
            const __m512 v = o->b ? _mm512_add_ps(c[i][p], bias) : c[i][p];
            _mm512_mask_storeu_ps(o->y + i * o->ldy + p * PANEL, o->m[p], v);
        }
    }
}

/* Panels q and q + 1 (when np = 2) for every row, 6 rows at a time, with the AVX-512 kernel. */
__attribute__((target("avx512f"))) static void panel_rows512(const held_weight *hw, int q, int np,
                                                             const float *xp, const float *b,
                                                             float *y, int64_t rows) {
    const int K = hw->in;
    const size_t pstride = (size_t)K * PANEL;
    const float *wp = hw->panels + (size_t)q * pstride;
    const int N = hw->out, n0 = q * PANEL;
    const int nn0 = N - n0 < PANEL ? N - n0 : PANEL;
    const int nn1 = np == 2 ? (N - n0 - PANEL < PANEL ? N - n0 - PANEL : PANEL) : 0;
    tile_out o = {
        y + n0, N, b ? b + n0 : NULL, {(__mmask16)((1u << nn0) - 1), (__mmask16)((1u << nn1) - 1)}};
    /* With several blocks of rows, the next pair of panels is fetched into L2 meanwhile, a share
     * after each block: its first pass then reads L2 instead of waiting on L3 or memory (a
     * decoding step's weights do not stay in the caches from one step to the next). */
    const int npanels = (N + PANEL - 1) / PANEL, blocks = (int)((rows + MR - 1) / MR);
    const size_t next_lines =
        blocks >= 4 && q + 2 < npanels
            ? (size_t)(npanels - q - 2 >= 2 ? 2 : 1) * pstride * sizeof(float) / 64
            : 0;
    const char *next = next_lines ? (const char *)(wp + 2 * pstride) : NULL;
    const size_t per_block = (next_lines + blocks - 1) / blocks;
    size_t line = 0;
    for (int64_t i0 = 0; i0 < rows; i0 += MR) {
        for (const size_t e = line + per_block; line < e && line < next_lines; line++)
            _mm_prefetch(next + line * 64, _MM_HINT_T1);
        const int mr = rows - i0 < MR ? (int)(rows - i0) : MR;
        const float *xr = xp + i0 * K;
        o.y = y + i0 * N + n0;
#define K512(m)                                                                                    \
    case m:                                                                                        \
        if (np == 2)                                                                               \
            micro_kernel512(m, 2, true, xr, wp, pstride, K, &o);                                   \
        else                                                                                       \
            micro_kernel512(m, 1, true, xr, wp, pstride, K, &o);                                   \
        break
        switch (mr) {
        case 6: /* prefetch on the panels' first pass only (see PF_AHEAD) */
            if (np == 2 && i0 == 0)
                micro_kernel512(6, 2, true, xr, wp, pstride, K, &o);
            else if (np == 2)
                micro_kernel512(6, 2, false, xr, wp, pstride, K, &o);
            else if (i0 == 0)
                micro_kernel512(6, 1, true, xr, wp, pstride, K, &o);
            else
                micro_kernel512(6, 1, false, xr, wp, pstride, K, &o);
            break;
            K512(5);
            K512(4);
            K512(3);
            K512(2);
        default:
            if (np == 2)
                micro_kernel512(1, 2, true, xr, wp, pstride, K, &o);
            else
                micro_kernel512(1, 1, true, xr, wp, pstride, K, &o);
        }
#undef K512
    }
}

/* Block i0 / MR of xp [ceil(rows/MR)][K][MR] from x [rows, K] (zeros past the last row). Eight
 * k at a time the rows are transposed in registers and each k's MR values written by one store
 * of 8 lanes (k ascending: the next store overwrites the 2 lanes past them; the eighth k's are
 * stored as 4 + 2, so nothing is written past the 8 k's): strided scalar stores cost a visible
 * share of decoding. A copy either way. */
__attribute__((target("avx2"))) static void pack_block(float *xp, const float *x, int64_t rows,
                                                       int K, int64_t i0) {
    _Static_assert(MR == 6, "pack_block transposes 6 rows");
    float *blk = xp + i0 * K;
    const int mr = rows - i0 < MR ? (int)(rows - i0) : MR;
    const float *xr[MR];
    for (int i = 0; i < MR; i++)
        xr[i] = i < mr ? x + (i0 + i) * K : NULL;
    const __m256 z = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 t[8];
#define ROW(i) (xr[i] ? _mm256_loadu_ps(xr[i] + k) : z)
        luna_transpose8_regs(ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), z, z, t);
#undef ROW
        float *o = blk + (size_t)k * MR;
        for (int j = 0; j < 7; j++)
            _mm256_storeu_ps(o + j * MR, t[j]);
        _mm_storeu_ps(o + 7 * MR, _mm256_castps256_ps128(t[7]));
        _mm_storel_pi((__m64 *)(o + 7 * MR + 4), _mm256_extractf128_ps(t[7], 1));
    }
    for (; k < K; k++)
        for (int i = 0; i < MR; i++)
            blk[(size_t)k * MR + i] = xr[i] ? xr[i][k] : 0.0f;
}
#endif

luna_status luna_cpu_held_linear(luna_backend *be, float *y, const float *x, const float *W,
                                 const float *b, int64_t rows, int in, int out) {
    luna_cpu_held *h = be->impl;
    held_weight held;
    const held_weight *hw = &held;
    if (!luna_held_table_find(h->table, W, &h->last, &held) || hw->in != in || hw->out != out ||
        rows <= 0)
        return LUNA_ERR_UNSUPPORTED;
    if (hw->dtype == LUNA_I8) {
        if (luna_int8_linear(h->q8_kernel, &hw->q8, &h->q8_scratch, y, x, b, rows, be->num_threads))
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
    /* small products stay on one thread (fork/join ~µs); with few rows the threads pack blocks
     * of rows, then split the pairs of panels (one region: the packing is not left to one
     * thread while the other waits) */
    const int threads = rows * (int64_t)in * out >= 65536 ? be->num_threads : 1;
    const int64_t nblk = (rows + MR - 1) / MR;
    void (*const run)(const held_weight *, int, int, const float *, const float *, float *,
                      int64_t) = h->f32_kernel == LUNA_F32_AVX512 ? panel_rows512 : panel_rows;
    if (threads > 1 && nblk >= 2 * (int64_t)threads) {
        /* many rows: each thread packs its own contiguous blocks of rows and runs every panel
         * over them, so its x stays in its own cache and no barrier separates packing from the
         * products (split by panels, each thread reads every block, half of them packed by the
         * other core). Each output element is the same chain either way: the same bits. */
#pragma omp parallel num_threads(threads)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int64_t b0 = nblk * t / nt, b1 = nblk * (t + 1) / nt;
            const int64_t r0 = b0 * MR, r1 = b1 * MR < rows ? b1 * MR : rows;
            for (int64_t blk = b0; blk < b1; blk++)
                pack_block(xp, x, rows, in, blk * MR);
            for (int q2 = 0; q2 < npairs && r1 > r0; q2++) {
                run(hw, 2 * q2, 2 * q2 + 1 < np ? 2 : 1, xp + r0 * in, b, y + r0 * out, r1 - r0);
            }
        }
        return LUNA_OK;
    }
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblk; blk++)
            pack_block(xp, x, rows, in, blk * MR);
#pragma omp for schedule(static)
        for (int q2 = 0; q2 < npairs; q2++)
            run(hw, 2 * q2, 2 * q2 + 1 < np ? 2 : 1, xp, b, y, rows);
    }
    return LUNA_OK;
#else
    return LUNA_ERR_UNSUPPORTED;
#endif
}
