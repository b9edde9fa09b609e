/* Elementwise ops and layout changes: dropout, add/axpy/scale_act, split/merge heads, broadcast.
 * (The activation functions are in activations.c.)
 *
 * All loops are OpenMP-parallel over elements with a static schedule (each element is computed
 * by exactly one thread from its own inputs, so results never depend on the thread count), and
 * run on one thread below LUNA_CPU_PAR_ELEMENTS elements where a parallel region costs more than it
 * saves.
 */
#include <string.h>

#include "model/kernels/cpu/cpu_ops.h"

/* ---- Dropout ------------------------------------------------------------------------------------
 * y[i] = x[i] · keep(i) / (1 − p),  keep(i) = luna_rng_uniform(key, i) >= p,  x, y [n].
 *
 * The mask is never stored: backward regenerates keep(i) from (key, i). Element i's 32 random
 * bits are word i%4 of the Philox block i/4, drawn eight blocks at a time by
 * luna_rng_bits_blocks (core/rng.c). tests/test_ops_activations.c checks that keep(i) here
 * equals luna_rng_dropout_keep(key, i, p) for every i. */

/* y = x · keep / (1 − p) (dropped elements are x·0: a NaN input stays NaN, as in PyTorch).
 * Shared by forward (x) and backward (dy): the op is linear with a fixed diagonal mask. */
static luna_status dropout_apply(luna_backend *be, float *y, const float *x, int64_t n, float p,
                                 luna_rng_key key) {
    if (n == 0) return LUNA_OK;
    if (p == 0.0f) {
        if (y != x) memmove(y, x, (size_t)n * sizeof *y);
        return LUNA_OK;
    }
    const float scale = 1.0f / (1.0f - p);
    /* Chunks of DROPOUT_CHUNK elements (a multiple of 4: whole Philox blocks), bits generated
     * eight blocks at a time (luna_rng_bits_blocks), then applied. */
    enum { DROPOUT_CHUNK = 512 };
    const int64_t nchunks = (n + DROPOUT_CHUNK - 1) / DROPOUT_CHUNK;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS / 4)
    for (int64_t c = 0; c < nchunks; c++) {
        uint32_t bits[DROPOUT_CHUNK];
        const int64_t i0 = c * DROPOUT_CHUNK;
        const int m = n - i0 < DROPOUT_CHUNK ? (int)(n - i0) : DROPOUT_CHUNK;
        luna_rng_bits_blocks(key, (uint64_t)(i0 / 4), (m + 3) / 4, bits);
        for (int w = 0; w < m; w++) {
            float u = luna_rng_word_uniform(bits[w]); /* = luna_rng_uniform(key, i0 + w) */
            y[i0 + w] = x[i0 + w] * (u >= p ? scale : 0.0f);
        }
    }
    return LUNA_OK;
}

/* The factors of elements i0 .. i0 + m − 1 (cpu_ops.h; the fused ops, fused.c): the blocks that
 * cover them, the same words and comparison as dropout_apply. */
void luna_cpu_dropout_mults(luna_rng_key key, int64_t i0, int m, float p, float *mult) {
    uint32_t bits[LUNA_CPU_DROPOUT_RUN + 8];
    const float scale = 1.0f / (1.0f - p);
    const int64_t b0 = i0 / 4;
    const int off = (int)(i0 - b0 * 4);
    luna_rng_bits_blocks(key, (uint64_t)b0, (off + m + 3) / 4, bits);
    for (int j = 0; j < m; j++)
        mult[j] = luna_rng_word_uniform(bits[off + j]) >= p ? scale : 0.0f;
}

luna_status luna_cpu_dropout_forward(luna_backend *be, luna_act *y_, const luna_act *x_, int64_t n,
                                     float p, luna_rng_key key) {
    float *y = (float *)y_;
    const float *x = (const float *)x_;
    return dropout_apply(be, y, x, n, p, key);
}

/* dx = dy · keep / (1 − p) with the forward's mask (same key). dx may alias dy. */
luna_status luna_cpu_dropout_backward(luna_backend *be, luna_act *dx_, const luna_act *dy_,
                                      int64_t n, float p, luna_rng_key key) {
    float *dx = (float *)dx_;
    const float *dy = (const float *)dy_;
    return dropout_apply(be, dx, dy, n, p, key);
}

/* ---- Arithmetic (in place allowed: y may be a or b, etc.; hence no restrict) ------------------
 */
/* y = a + b, all [n]. */
luna_status luna_cpu_add(luna_backend *be, luna_act *y_, const luna_act *a_, const luna_act *b_,
                         int64_t n) {
    float *y = (float *)y_;
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
    return LUNA_OK;
}

/* y += alpha · x, both [n]. */
luna_status luna_cpu_axpy(luna_backend *be, luna_act *y_, float alpha, const float *x, int64_t n) {
    float *y = (float *)y_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return LUNA_OK;
}

/* x *= alpha, x [n] (an activation: fp32 on this backend). */
luna_status luna_cpu_scale_act(luna_backend *be, luna_act *x_, float alpha, int64_t n) {
    float *x = (float *)x_;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t i = 0; i < n; i++)
        x[i] *= alpha;
    return LUNA_OK;
}

/* ---- Head layout ------------------------------------------------------------------------------
 * split_heads: out[b, h, t, :] = x[b, t, h, :]   x [B, n, H, dh] -> out [B, H, n, dh]
 * merge_heads: out[b, t, h, :] = x[b, h, t, :]   x [B, H, n, dh] -> out [B, n, H, dh]
 * Each is the other's inverse and (being a permutation) its adjoint, hence its backward.
 * out must not overlap x. */
static luna_status heads_permute(luna_backend *be, float *restrict out, const float *restrict x,
                                 int B, int n, int H, int dh, bool split) {
    int64_t total = (int64_t)B * n * H * dh;
    if (total == 0) return LUNA_OK;
    const size_t row = (size_t)dh * sizeof(float);
#pragma omp parallel for collapse(2) num_threads(be->num_threads)                                  \
    schedule(static) if (total > LUNA_CPU_PAR_ELEMENTS)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < n; t++) {
                int64_t bnh = (((int64_t)b * n + t) * H + h) * dh; /* [b, t, h, :] */
                int64_t bhn = (((int64_t)b * H + h) * n + t) * dh; /* [b, h, t, :] */
                if (split)
                    memcpy(out + bhn, x + bnh, row);
                else
                    memcpy(out + bnh, x + bhn, row);
            }
        }
    }
    return LUNA_OK;
}

luna_status luna_cpu_split_heads(luna_backend *be, luna_act *out_, const luna_act *x_, int B, int n,
                                 int H, int dh) {
    float *out = (float *)out_;
    const float *x = (const float *)x_;
    return heads_permute(be, out, x, B, n, H, dh, true);
}

luna_status luna_cpu_merge_heads(luna_backend *be, luna_act *out_, const luna_act *x_, int B, int n,
                                 int H, int dh) {
    float *out = (float *)out_;
    const float *x = (const float *)x_;
    return heads_permute(be, out, x, B, n, H, dh, false);
}

/* ---- Broadcast over a leading batch axis --------------------------------------------------------
 * broadcast_rows: out[b, r, :] = x[r, :]           x [rows, d] -> out [B, rows, d]
 * sum_broadcast:  dx[r, :] += Σ_b dout[b, r, :]    (its adjoint), summed in b order per element. */
luna_status luna_cpu_broadcast_rows(luna_backend *be, luna_act *out_, const luna_act *x_, int B,
                                    int64_t rows, int d) {
    float *out = (float *)out_;
    const float *x = (const float *)x_;
    const int64_t m = rows * d;
    if ((int64_t)B * m == 0) return LUNA_OK;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if ((int64_t)B * m > LUNA_CPU_PAR_ELEMENTS)
    for (int b = 0; b < B; b++)
        memcpy(out + (int64_t)b * m, x, (size_t)m * sizeof *out);
    return LUNA_OK;
}

luna_status luna_cpu_sum_broadcast(luna_backend *be, float *dx, const luna_act *dout_, int B,
                                   int64_t rows, int d) {
    const float *dout = (const float *)dout_;
    const int64_t m = rows * d;
    if ((int64_t)B * m == 0) return LUNA_OK;
    float *restrict acc = dx;
    const float *restrict src = dout;
    enum { CHUNK = 2048 }; /* elements of dx per task: stays in L1 while the B slices stream by */
    const int64_t nchunks = (m + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if ((int64_t)B * m > LUNA_CPU_PAR_ELEMENTS)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * CHUNK, hi = lo + CHUNK < m ? lo + CHUNK : m;
        for (int b = 0; b < B; b++) {
            const float *restrict s = src + (int64_t)b * m;
            for (int64_t i = lo; i < hi; i++)
                acc[i] += s[i];
        }
    }
    return LUNA_OK;
}
