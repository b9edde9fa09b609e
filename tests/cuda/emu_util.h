/* Shared helpers of the CUDA kernel tests (tests/cuda/emu_*.c, run against the CPU execution
 * harness): bf16 rounding on the host, device buffers, and comparisons with the CPU backend. */
#ifndef LUNA_TESTS_CUDA_EMU_UTIL_H
#define LUNA_TESTS_CUDA_EMU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/test_util.h"

/* fp32 -> bf16 bits, round to nearest even (a NaN stays a quiet NaN). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A device buffer of `bytes` (at least 1), filled from host when host is not NULL. */
static inline void *dev(const void *host, size_t bytes) {
    void *d = NULL;
    ck_assert_int_eq(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    if (host && bytes)
        ck_assert_int_eq(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static inline void down(void *host, const void *d, size_t bytes) {
    ck_assert_int_eq(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* An activation buffer on the device from host values: fp32, or bf16 (h rounded in place to
 * what the device holds); and back to fp32 on the host. */
static inline void *up_act(float *h, size_t n, int bf16) { /* bf16: rounds h in place */
    if (!bf16) return dev(h, 4 * n);
    uint16_t *b = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        b[i] = to_bf16(h[i]), h[i] = from_bf16(b[i]);
    void *d = dev(b, 2 * n);
    free(b);
    return d;
}
static inline void down_act(float *h, const void *d, size_t n, int bf16) {
    if (!bf16) {
        ck_assert_int_eq(cudaMemcpy(h, d, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
        return;
    }
    uint16_t *b = malloc(2 * n);
    ck_assert_int_eq(cudaMemcpy(b, d, 2 * n, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        h[i] = from_bf16(b[i]);
    free(b);
}

/* A column-sum workspace (cuda_kernels.h) for nout sums over rows × cols: the launchers' size, or
 * with `one_chunk` the least that works — one chunk a round, so that every chunk after the first
 * goes through the running totals. Free with cudaFree(ws.p). */
static inline luna_cuda_colsum_ws colsum_ws(int64_t rows, int cols, int nout, int one_chunk) {
    luna_cuda_colsum_ws ws;
    ws.n = one_chunk ? 2 * (int64_t)nout * cols : luna_cuda_colsum_ws_doubles(rows, cols, nout);
    ws.p = (double *)dev(NULL, (size_t)ws.n * sizeof(double));
    return ws;
}

/* |got − want| ≤ tol · max(1, |want|) elementwise (NaN matches NaN). */
static inline void close_enough(const float *want, const float *got, int64_t n, double tol,
                                const char *what) {
    for (int64_t i = 0; i < n; i++) {
        const double w = want[i], g = got[i], scale = fabs(w) > 1.0 ? fabs(w) : 1.0;
        ck_assert_msg(fabs(g - w) <= tol * scale || (isnan(w) && isnan(g)),
                      "%s: element %lld: CUDA %.9g, CPU %.9g", what, (long long)i, g, w);
    }
}

#endif
