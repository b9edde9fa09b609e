/* int8 held weights and their Linear (the math and layouts: held_int8.h). */
#include "model/kernels/cpu/held_int8.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/quantize.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define PANEL 16 /* output columns per panel */
#define MR 4     /* rows per kernel call: a beam of 4 is one block */
#define GROUP 4  /* k per 32-bit lane */
/* Prefetch distance in groups (64 bytes each, one cache line) on a panel's first pass over the
 * rows, when it comes from L2 or further (see held_weights.c's PF_AHEAD). */
#define PF_AHEAD 8
/* Weights of one chunk of panels (panel_rows): half of a 512 KiB L2 and more than fits L1. */
#define CHUNK_BYTES ((size_t)64 << 10)

static inline int panels_of(int out) { return (out + PANEL - 1) / PANEL; }

luna_int8_kernel luna_int8_kernel_best(void) {
    if (luna_int8_kernel_available(LUNA_INT8_AVX512_VNNI)) return LUNA_INT8_AVX512_VNNI;
    if (luna_int8_kernel_available(LUNA_INT8_AVX2)) return LUNA_INT8_AVX2;
    return LUNA_INT8_SCALAR;
}

bool luna_int8_kernel_available(luna_int8_kernel k) {
    switch (k) {
    case LUNA_INT8_SCALAR: return true;
#if HAVE_X86
    case LUNA_INT8_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("avx2");
    case LUNA_INT8_AVX512_VNNI:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
#else
    case LUNA_INT8_AVX2:
    case LUNA_INT8_AVX512_VNNI: return false;
#endif
    }
    return false;
}

const char *luna_int8_kernel_name(luna_int8_kernel k) {
    switch (k) {
    case LUNA_INT8_SCALAR: return "scalar";
    case LUNA_INT8_AVX2: return "avx2";
    case LUNA_INT8_AVX512_VNNI: return "avx512-vnni";
    }
    return "?";
}

/* ---- weights --------------------------------------------------------------------------------- */

void luna_int8_weight_free(luna_int8_weight *w) {
    if (!w) return;
    free(w->panels);
    free(w->scale);
    free(w->colsum);
    memset(w, 0, sizeof *w);
}

luna_status luna_int8_weight_pack(luna_int8_weight *w, const float *W, int out, int in,
                                  int threads) {
    memset(w, 0, sizeof *w);
    const int np = panels_of(out), G = (in + GROUP - 1) / GROUP;
    const size_t cols = (size_t)np * PANEL;
    int8_t *q = malloc((size_t)out * (size_t)in);
    float *scale = calloc(cols, sizeof *scale);
    int32_t *colsum = calloc(cols, sizeof *colsum);
    int8_t *p = NULL;
    if (posix_memalign((void **)&p, 64, cols * (size_t)G * GROUP) != 0) p = NULL;
    if (!q || !scale || !colsum || !p) {
        free(q), free(scale), free(colsum), free(p);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "hold_weights: out of memory for int8 [%d, %d]",
                          out, in);
    }
    luna_quantize_rows_int8(W, out, in, q, scale);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int pp = 0; pp < np; pp++)
        for (int g = 0; g < G; g++)
            for (int j = 0; j < PANEL; j++)
                for (int kk = 0; kk < GROUP; kk++) {
                    const int n = pp * PANEL + j, k = g * GROUP + kk;
                    p[(((size_t)pp * G + g) * PANEL + j) * GROUP + kk] =
                        n < out && k < in ? q[(size_t)n * in + k] : 0;
                }
    for (int n = 0; n < out; n++) {
        int32_t s = 0;
        for (int k = 0; k < in; k++)
            s += q[(size_t)n * in + k];
        colsum[n] = s;
    }
    free(q);
    *w = (luna_int8_weight){out, in, G, p, scale, colsum};
    return LUNA_OK;
}

/* ---- activations ----------------------------------------------------------------------------- */

void luna_int8_scratch_free(luna_int8_scratch *s) {
    if (!s) return;
    free(s->xs);
    free(s->xa);
    free(s->sx);
    free(s->qrow);
    memset(s, 0, sizeof *s);
}

/* One row: qr [G·4] (zeros past in) and its scale, as luna_quantize_rows_range with
 * LUNA_INT8_ACT_MAX (the same division and rounding), except that a non-finite row gets NaN and
 * zeros. */
static float quantize_row_scalar(const float *x, int in, int G, int8_t *qr) {
    float amax = 0.0f;
    bool finite = true;
    for (int k = 0; k < in; k++) {
        const float a = fabsf(x[k]);
        finite &= a <= 3.402823466e38f;
        amax = fmaxf(amax, a);
    }
    memset(qr, 0, (size_t)G * GROUP);
    if (!finite) return NAN;
    float s;
    luna_quantize_rows_range(x, 1, in, LUNA_INT8_ACT_MAX, qr, &s);
    return s;
}

#if HAVE_X86
__attribute__((target("avx2,fma"))) static float quantize_row_avx2(const float *x, int in, int G,
                                                                   int8_t *qr) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 fmax = _mm256_set1_ps(3.402823466e38f);
    __m256 m = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int k = 0;
    for (; k + 8 <= in; k += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + k), absmask);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, fmax, _CMP_LE_OQ));
        m = _mm256_max_ps(m, a);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float amax = 0.0f;
    bool finite = _mm256_movemask_ps(ok) == 0xff;
    for (int i = 0; i < 8; i++)
        amax = fmaxf(amax, lanes[i]);
    for (; k < in; k++) {
        const float a = fabsf(x[k]);
        finite &= a <= 3.402823466e38f;
        amax = fmaxf(amax, a);
    }
    memset(qr, 0, (size_t)G * GROUP);
    if (!finite) return NAN;
    const float s = amax / (float)LUNA_INT8_ACT_MAX;
    if (s == 0.0f) return s;
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i lo = _mm256_set1_epi32(-LUNA_INT8_ACT_MAX),
                  hi = _mm256_set1_epi32(LUNA_INT8_ACT_MAX);
    k = 0;
    for (; k + 8 <= in; k += 8) {
        /* x / s rounded to nearest even (the MXCSR default, as nearbyintf) */
        __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + k), vs));
        v = _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
        const __m128i v16 =
            _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(qr + k), _mm_packs_epi16(v16, v16));
    }
    for (; k < in; k++) {
        float v =
            fminf(fmaxf(nearbyintf(x[k] / s), -(float)LUNA_INT8_ACT_MAX), (float)LUNA_INT8_ACT_MAX);
        qr[k] = (int8_t)v;
    }
    return s;
}
#endif

/* Groups [g0, G) of a block's MR quantized rows qr [MR][G·4] into the interleaved layout:
 * bs[(g·MR + i)·4 + kk] = qr[i][g·4 + kk] (the scalar kernel's; NULL: not written), and ba the
 * same of q + 64 (AVX2: u8 in [1, 127]) or q + 128 (VNNI). */
static void interleave_groups(bool vnni, const int8_t *qr, int g0, int G, int8_t *bs, uint8_t *ba) {
    const size_t row = (size_t)G * GROUP;
    for (int g = g0; g < G; g++)
        for (int i = 0; i < MR; i++)
            for (int kk = 0; kk < GROUP; kk++) {
                const int8_t v = qr[i * row + (size_t)g * GROUP + kk];
                const size_t at = ((size_t)g * MR + i) * GROUP + kk;
                if (bs) bs[at] = v;
                ba[at] = (uint8_t)(v + (vnni ? 128 : 64));
            }
}

#if HAVE_X86
/* interleave_groups for all G, ba only (the AVX2 and VNNI kernels read no bs), 4 groups at a time
 * by a 4 × 4 transpose of 32-bit lanes; the last G mod 4 groups one at a time. */
__attribute__((target("avx2"))) static void interleave_avx2(bool vnni, const int8_t *qr, int G,
                                                            uint8_t *ba) {
    const size_t row = (size_t)G * GROUP;
    const __m128i offset = _mm_set1_epi8((char)(vnni ? 128 : 64));
    int g = 0;
    for (; g + 4 <= G; g += 4) {
        __m128i r[MR];
        for (int i = 0; i < MR; i++)
            r[i] = _mm_loadu_si128((const __m128i *)(qr + i * row + (size_t)g * GROUP));
        const __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]), t1 = _mm_unpackhi_epi32(r[0], r[1]);
        const __m128i t2 = _mm_unpacklo_epi32(r[2], r[3]), t3 = _mm_unpackhi_epi32(r[2], r[3]);
        const __m128i o[4] = {_mm_unpacklo_epi64(t0, t2), _mm_unpackhi_epi64(t0, t2),
                              _mm_unpacklo_epi64(t1, t3), _mm_unpackhi_epi64(t1, t3)};
        for (int j = 0; j < 4; j++) {
            const size_t at = (size_t)(g + j) * MR * GROUP;
            _mm_storeu_si128((__m128i *)(ba + at), _mm_add_epi8(o[j], offset));
        }
    }
    interleave_groups(vnni, qr, g, G, NULL, ba);
}
#endif

/* Rows [i0, i0 + MR) of x into block i0 / MR of xs / xa (zero rows past `rows`); qr holds
 * MR·G·4 bytes (the block's rows of qx before interleaving). */
static void pack_block(luna_int8_kernel kern, const luna_int8_weight *w, luna_int8_scratch *s,
                       const float *x, int64_t rows, int64_t i0, int8_t *qr) {
    const int G = w->groups, in = w->in;
    const size_t row = (size_t)G * GROUP;
    int8_t *bs = s->xs + (size_t)i0 * row;
    uint8_t *ba = s->xa + (size_t)i0 * row;
    for (int i = 0; i < MR; i++) {
        float sx = 0.0f;
        int8_t *q = qr + i * row;
        if (i0 + i < rows) {
#if HAVE_X86
            if (kern != LUNA_INT8_SCALAR)
                sx = quantize_row_avx2(x + (i0 + i) * in, in, G, q);
            else
#endif
                sx = quantize_row_scalar(x + (i0 + i) * in, in, G, q);
        } else {
            memset(q, 0, row);
        }
        s->sx[i0 + i] = sx;
    }
    const bool vnni = kern == LUNA_INT8_AVX512_VNNI;
#if HAVE_X86
    if (kern != LUNA_INT8_SCALAR) {
        interleave_avx2(vnni, qr, G, ba);
        return;
    }
#endif
    interleave_groups(vnni, qr, 0, G, bs, ba);
}

/* ---- kernels: acc [MR][PANEL·np] (row stride 2·PANEL) for one block of rows ----------------- */

static void kernel_scalar(int mr, const int8_t *xs, const int8_t *wp, size_t pstride, int np, int G,
                          int32_t *acc) {
    for (int p = 0; p < np; p++)
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < PANEL; j++) {
                int32_t a = 0;
                for (int g = 0; g < G; g++)
                    for (int kk = 0; kk < GROUP; kk++)
                        a += (int32_t)xs[((size_t)g * MR + i) * GROUP + kk] *
                             (int32_t)wp[p * pstride + ((size_t)g * PANEL + j) * GROUP + kk];
                acc[i * 2 * PANEL + p * PANEL + j] = a;
            }
}

#if HAVE_X86
static inline int32_t load_lane(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One panel, mr ≤ 4 rows: per group and row, vpmaddubsw multiplies the row's qx + 64 (u8, at most
 * 127) by the weights into s16 pairs (at most 2·127², no saturation), vpmaddwd by ones sums the
 * pairs into s32; then acc −= 64·colsum (the offset of qx). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
kernel_avx2(const int mr, const bool pf, const uint8_t *xa, const int8_t *wp, int G,
            const int32_t *colsum, int32_t *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c[MR][2];
    for (int i = 0; i < MR; i++)
        c[i][0] = c[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wp + (size_t)g * PANEL * GROUP;
        if (pf) _mm_prefetch((const char *)(wg + PF_AHEAD * PANEL * GROUP), _MM_HINT_T0);
        const __m256i w0 = _mm256_load_si256((const __m256i *)wg);
        const __m256i w1 = _mm256_load_si256((const __m256i *)(wg + 32));
        for (int i = 0; i < MR; i++) {
            if (i >= mr) continue;
            const __m256i a = _mm256_set1_epi32(load_lane(xa + ((size_t)g * MR + i) * GROUP));
            c[i][0] =
                _mm256_add_epi32(c[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w0), ones));
            c[i][1] =
                _mm256_add_epi32(c[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w1), ones));
        }
    }
    const __m256i off0 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)colsum), 6);
    const __m256i off1 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(colsum + 8)), 6);
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_si256((__m256i *)(acc + i * 2 * PANEL), _mm256_sub_epi32(c[i][0], off0));
        _mm256_storeu_si256((__m256i *)(acc + i * 2 * PANEL + 8), _mm256_sub_epi32(c[i][1], off1));
    }
}

/* Two panels (the second at wp + pstride; np = 1: one), mr ≤ 4 rows: 8 chains of vpdpbusd,
 * then acc −= 128·colsum (the u8 offset of qx). */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) static inline void
kernel_vnni(const int mr, const bool pf, const uint8_t *xa, const int8_t *wp, size_t pstride,
            int np, int G, const int32_t *colsum, int32_t *acc) {
    __m512i c[MR][2];
    for (int i = 0; i < MR; i++)
        c[i][0] = c[i][1] = _mm512_setzero_si512();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wp + (size_t)g * PANEL * GROUP;
        if (pf) {
            _mm_prefetch((const char *)(wg + PF_AHEAD * PANEL * GROUP), _MM_HINT_T0);
            if (np == 2)
                _mm_prefetch((const char *)(wg + pstride + PF_AHEAD * PANEL * GROUP), _MM_HINT_T0);
        }
        const __m512i w0 = _mm512_load_si512((const void *)wg);
        const __m512i w1 = np == 2 ? _mm512_load_si512((const void *)(wg + pstride)) : w0;
        for (int i = 0; i < MR; i++) {
            if (i >= mr) continue;
            const __m512i a = _mm512_set1_epi32(load_lane(xa + ((size_t)g * MR + i) * GROUP));
            c[i][0] = _mm512_dpbusd_epi32(c[i][0], a, w0);
            if (np == 2) c[i][1] = _mm512_dpbusd_epi32(c[i][1], a, w1);
        }
    }
    for (int p = 0; p < np; p++) {
        const __m512i off = _mm512_slli_epi32(_mm512_loadu_si512(colsum + p * PANEL), 7);
        for (int i = 0; i < mr; i++)
            _mm512_storeu_si512(acc + i * 2 * PANEL + p * PANEL, _mm512_sub_epi32(c[i][p], off));
    }
}

__attribute__((target("avx2,fma"))) static void block_avx2(int mr, bool pf, const uint8_t *xa,
                                                           const int8_t *wp, size_t pstride, int np,
                                                           int G, const int32_t *colsum,
                                                           int32_t *acc) {
    for (int p = 0; p < np; p++) {
        const int8_t *w = wp + p * pstride;
        const int32_t *cs = colsum + p * PANEL;
        int32_t *a = acc + p * PANEL;
        switch (mr) {
        case 4: kernel_avx2(4, pf, xa, w, G, cs, a); break;
        case 3: kernel_avx2(3, pf, xa, w, G, cs, a); break;
        case 2: kernel_avx2(2, pf, xa, w, G, cs, a); break;
        default: kernel_avx2(1, pf, xa, w, G, cs, a); break;
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
block_vnni(int mr, bool pf, const uint8_t *xa, const int8_t *wp, size_t pstride, int np, int G,
           const int32_t *colsum, int32_t *acc) {
    if (np == 2) {
        switch (mr) {
        case 4: kernel_vnni(4, pf, xa, wp, pstride, 2, G, colsum, acc); break;
        case 3: kernel_vnni(3, pf, xa, wp, pstride, 2, G, colsum, acc); break;
        case 2: kernel_vnni(2, pf, xa, wp, pstride, 2, G, colsum, acc); break;
        default: kernel_vnni(1, pf, xa, wp, pstride, 2, G, colsum, acc); break;
        }
    } else {
        switch (mr) {
        case 4: kernel_vnni(4, pf, xa, wp, pstride, 1, G, colsum, acc); break;
        case 3: kernel_vnni(3, pf, xa, wp, pstride, 1, G, colsum, acc); break;
        case 2: kernel_vnni(2, pf, xa, wp, pstride, 1, G, colsum, acc); break;
        default: kernel_vnni(1, pf, xa, wp, pstride, 1, G, colsum, acc); break;
        }
    }
}
#endif

#if HAVE_X86
/* 16 outputs of one row: the scalar epilogue's operations in the same order (int32 → float
 * rounds to nearest like the cast; one product sx·sW; one fused multiply-add). */
__attribute__((target("avx2,fma"))) static void store16_avx2(float *yr, const int32_t *ar, float s,
                                                             const float *sw, const float *b) {
    const __m256 vs = _mm256_set1_ps(s);
    for (int h = 0; h < PANEL; h += 8) {
        const __m256 a = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(ar + h)));
        const __m256 sc = _mm256_mul_ps(vs, _mm256_loadu_ps(sw + h));
        const __m256 bb = b ? _mm256_loadu_ps(b + h) : _mm256_setzero_ps();
        _mm256_storeu_ps(yr + h, _mm256_fmadd_ps(a, sc, bb));
    }
}
#endif

/* y rows [i0, i0 + mr), panels q.. q + np − 1: fmaf((float)acc, sx·sW, b). */
static void store_rows(luna_int8_kernel kern, const luna_int8_weight *w, int q, int np,
                       const int32_t *acc, const float *sx, const float *b, float *y, int64_t i0,
                       int mr) {
    const int N = w->out;
    for (int p = 0; p < np; p++) {
        const int n0 = (q + p) * PANEL, nn = N - n0 < PANEL ? N - n0 : PANEL;
        for (int i = 0; i < mr; i++) {
            float *yr = y + (i0 + i) * N + n0;
            const int32_t *ar = acc + i * 2 * PANEL + p * PANEL;
            const float s = sx[i0 + i];
#if HAVE_X86
            if (kern != LUNA_INT8_SCALAR && nn == PANEL) {
                store16_avx2(yr, ar, s, w->scale + n0, b ? b + n0 : NULL);
                continue;
            }
#else
            (void)kern;
#endif
            for (int j = 0; j < nn; j++)
                yr[j] = fmaf((float)ar[j], s * w->scale[n0 + j], b ? b[n0 + j] : 0.0f);
        }
    }
}

/* Panels q and q + 1 (np = 2) or q alone, for every row. */
/* Panels [q0, q0 + nq) for every row: row block by row block, the chunk's panels in pairs. The
 * chunk is sized to stay in L2 while the rows pass over it, and a row block's outputs are then
 * nq·16 consecutive floats per row: with one panel at a time over all the rows, the stores of a
 * tall y (a step's [128, V] logits) touched a new page and line per row and cost as much as the
 * products. */
static void panel_rows(luna_int8_kernel kern, const luna_int8_weight *w, int q0, int nq,
                       const luna_int8_scratch *s, const float *b, float *y, int64_t rows) {
    const int G = w->groups;
    const size_t pstride = (size_t)G * PANEL * GROUP, xstride = (size_t)G * MR * GROUP;
    int32_t acc[MR * 2 * PANEL];
    for (int64_t i0 = 0; i0 < rows; i0 += MR) {
        const int mr = rows - i0 < MR ? (int)(rows - i0) : MR;
        const int8_t *xs = s->xs + (size_t)(i0 / MR) * xstride;
        const uint8_t *xa = s->xa + (size_t)(i0 / MR) * xstride;
        for (int q = q0; q < q0 + nq; q += 2) {
            const int np = q + 1 < q0 + nq ? 2 : 1;
            const int8_t *wp = w->panels + (size_t)q * pstride;
            switch (kern) {
#if HAVE_X86
            case LUNA_INT8_AVX2:
                block_avx2(mr, i0 == 0, xa, wp, pstride, np, G, w->colsum + q * PANEL, acc);
                break;
            case LUNA_INT8_AVX512_VNNI:
                block_vnni(mr, i0 == 0, xa, wp, pstride, np, G, w->colsum + q * PANEL, acc);
                break;
#endif
            default: kernel_scalar(mr, xs, wp, pstride, np, G, acc); break;
            }
            store_rows(kern, w, q, np, acc, s->sx, b, y, i0, mr);
        }
    }
}

bool luna_int8_linear(luna_int8_kernel kern, const luna_int8_weight *w, luna_int8_scratch *s,
                      float *y, const float *x, const float *b, int64_t rows, int threads) {
    if (rows <= 0) return true;
    const int G = w->groups, np = panels_of(w->out);
    const int64_t nblk = (rows + MR - 1) / MR;
    const size_t need = (size_t)nblk * MR * (size_t)G * GROUP;
    if (need > s->cap) {
        int8_t *xs = NULL;
        uint8_t *xa = NULL;
        if (posix_memalign((void **)&xs, 64, need) != 0) xs = NULL;
        if (posix_memalign((void **)&xa, 64, need) != 0) xa = NULL;
        if (!xs || !xa) {
            free(xs), free(xa);
            return false;
        }
        free(s->xs), free(s->xa);
        s->xs = xs, s->xa = xa, s->cap = need;
    }
    if ((size_t)(nblk * MR) > s->rows_cap) {
        float *sx = malloc(sizeof(float) * (size_t)(nblk * MR));
        if (!sx) return false;
        free(s->sx);
        s->sx = sx, s->rows_cap = (size_t)(nblk * MR);
    }
    /* small products stay on one thread (fork/join ~µs), as held_weights.c */
    if (rows * (int64_t)w->in * w->out < 65536) threads = 1;
    const size_t qrow = (size_t)MR * G * GROUP; /* per thread: pack_block's rows */
    /* chunks of an even number of panels: at most CHUNK_BYTES of weights, at least one per thread
     */
    int chunk = (int)(CHUNK_BYTES / ((size_t)G * PANEL * GROUP));
    if (chunk > (np + threads - 1) / threads) chunk = (np + threads - 1) / threads;
    chunk = chunk < 2 ? 2 : chunk + chunk % 2;
    const int nchunks = (np + chunk - 1) / chunk;
    if ((size_t)threads * qrow > s->qrow_cap) {
        int8_t *q = malloc((size_t)threads * qrow);
        if (!q) return false;
        free(s->qrow);
        s->qrow = q, s->qrow_cap = (size_t)threads * qrow;
    }
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int8_t *qr = s->qrow + (size_t)omp_get_thread_num() * qrow;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblk; blk++)
            pack_block(kern, w, s, x, rows, blk * MR, qr);
#pragma omp for schedule(static)
        for (int c = 0; c < nchunks; c++) {
            const int q0 = c * chunk;
            panel_rows(kern, w, q0, np - q0 < chunk ? np - q0 : chunk, s, b, y, rows);
        }
    }
    return true;
}
