/* The harness's fake cuBLASLt (emu_cublaslt.cc), driven through NVIDIA's cublasLt.h from C the
 * way a backend's GEMM path calls it: descriptors, heuristic, workspace, cublasLtMatmul. Checked
 * against a naive double-precision reference on odd shapes with transposes, batches, ld > rows,
 * alpha/beta, every supported epilogue and fp32 / bf16 storage; and the argument checks. */
#include <check.h>
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda_emu/luna_cuda_emu_api.h"
#include "tests/test_util.h"

static uint16_t to_bf16(float f) { /* round to nearest even (no NaN inputs here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    int m, n, k, ta, tb, batch;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t in, out; /* A/B type, C/D (and bias) type */
    float alpha, beta;
    int pad; /* ld = rows + pad */
} gemm_case;

/* Host matrix of `rows`×`cols` (column-major, ld, batch·stride) as `type`, with its float
 * values (after rounding to the type) in `vals`. */
static void *make_matrix(luna_test_rng *rng, cudaDataType_t type, size_t elems, float *vals) {
    size_t es = type == CUDA_R_16BF ? 2 : 4;
    unsigned char *h = malloc(elems * es);
    for (size_t i = 0; i < elems; i++) {
        float v = luna_test_uniform(rng, -1.0f, 1.0f);
        if (type == CUDA_R_16BF) {
            uint16_t b = to_bf16(v);
            memcpy(h + 2 * i, &b, 2);
            vals[i] = from_bf16(b);
        } else {
            memcpy(h + 4 * i, &v, 4);
            vals[i] = v;
        }
    }
    void *d = NULL;
    ck_assert_int_eq(cudaMalloc(&d, elems * es), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, h, elems * es, cudaMemcpyHostToDevice), cudaSuccess);
    free(h);
    return d;
}

static cublasLtMatrixLayout_t layout(cudaDataType_t type, int rows, int cols, int64_t ld, int batch,
                                     int64_t stride) {
    cublasLtMatrixLayout_t l;
    ck_assert_int_eq(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                      sizeof batch),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatrixLayoutSetAttribute(
                         l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                     CUBLAS_STATUS_SUCCESS);
    return l;
}

/* Runs one case through the heuristic and cublasLtMatmul; returns the max error relative to
 * max|reference| (after checking it against the tolerance of the output type). */
static void run_case(cublasLtHandle_t h, const gemm_case *c, luna_test_rng *rng) {
    const int ar = c->ta ? c->k : c->m, ac = c->ta ? c->m : c->k, br = c->tb ? c->n : c->k,
              bc = c->tb ? c->k : c->n;
    const int64_t lda = ar + c->pad, ldb = br + c->pad, ldc = c->m + c->pad;
    const int64_t sa = lda * ac + 3, sb = ldb * bc + 1, sc = ldc * c->n + 2; /* odd batch strides */
    const size_t na = (size_t)(sa * c->batch), nb = (size_t)(sb * c->batch),
                 nc = (size_t)(sc * c->batch);
    float *va = malloc(na * 4), *vb = malloc(nb * 4), *vc = malloc(nc * 4), vbias[64],
          *got = malloc(nc * 4);
    void *A = make_matrix(rng, c->in, na, va), *B = make_matrix(rng, c->in, nb, vb);
    void *C = make_matrix(rng, c->out, nc, vc),
         *bias = make_matrix(rng, c->out, (size_t)c->m, vbias);
    cublasLtMatmulDesc_t desc;
    ck_assert_int_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                     CUBLAS_STATUS_SUCCESS);
    cublasOperation_t ta = c->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = c->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    ck_assert_int_eq(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &c->epilogue, sizeof c->epilogue),
                     CUBLAS_STATUS_SUCCESS);
    if (c->epilogue & CUBLASLT_EPILOGUE_BIAS)
        ck_assert_int_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof bias),
                         CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t la = layout(c->in, ar, ac, lda, c->batch, sa),
                           lb = layout(c->in, br, bc, ldb, c->batch, sb);
    cublasLtMatrixLayout_t lc = layout(c->out, c->m, c->n, ldc, c->batch, sc);
    cublasLtMatmulPreference_t pref;
    uint64_t ws_max = 1 << 22;
    ck_assert_int_eq(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max),
                     CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    ck_assert_int_eq(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &found),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(found, 1);
    void *ws = NULL;
    ck_assert_int_eq(cudaMalloc(&ws, res.workspaceSize), cudaSuccess);
    /* D = C (in place), as a GEMM with beta accumulates. */
    ck_assert_int_eq(cublasLtMatmul(h, desc, &c->alpha, A, la, B, lb, &c->beta, C, lc, C, lc,
                                    &res.algo, ws, res.workspaceSize, 0),
                     CUBLAS_STATUS_SUCCESS);
    size_t es = c->out == CUDA_R_16BF ? 2 : 4;
    unsigned char *raw = malloc(nc * es);
    ck_assert_int_eq(cudaMemcpy(raw, C, nc * es, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < nc; i++) {
        if (es == 2) {
            uint16_t b;
            memcpy(&b, raw + 2 * i, 2);
            got[i] = from_bf16(b);
        } else {
            memcpy(&got[i], raw + 4 * i, 4);
        }
    }
    double max_err = 0.0, max_ref = 1e-30;
    for (int b = 0; b < c->batch; b++)
        for (int j = 0; j < c->n; j++)
            for (int i = 0; i < c->m; i++) {
                double acc = 0.0;
                for (int k = 0; k < c->k; k++) {
                    double x = va[b * sa + (c->ta ? k + i * lda : i + k * lda)];
                    double y = vb[b * sb + (c->tb ? j + k * ldb : k + j * ldb)];
                    acc += x * y;
                }
                double ref = c->alpha * acc + c->beta * vc[b * sc + i + j * ldc];
                if (c->epilogue & CUBLASLT_EPILOGUE_BIAS) ref += vbias[i];
                if ((c->epilogue & CUBLASLT_EPILOGUE_RELU) && ref < 0.0) ref = 0.0;
                double e = fabs(got[b * sc + i + j * ldc] - ref);
                max_err = e > max_err ? e : max_err;
                max_ref = fabs(ref) > max_ref ? fabs(ref) : max_ref;
            }
    /* padding between columns and batches is untouched */
    for (int b = 0; b < c->batch; b++)
        for (int j = 0; j < c->n; j++)
            for (int i = c->m; i < ldc && b * sc + i + j * ldc < (int64_t)nc; i++)
                ck_assert_float_eq(got[b * sc + i + j * ldc], vc[b * sc + i + j * ldc]);
    double tol = c->out == CUDA_R_16BF ? 1.0 / 256 : 1e-6;
    ck_assert_msg(max_err <= tol * max_ref,
                  "m %d n %d k %d ta %d tb %d batch %d epi %d in %d out %d: error %g of %g", c->m,
                  c->n, c->k, c->ta, c->tb, c->batch, (int)c->epilogue, (int)c->in, (int)c->out,
                  max_err, max_ref);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb),
        cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(bias), cudaFree(ws);
    free(va), free(vb), free(vc), free(got), free(raw);
}

START_TEST(test_gemm_against_reference) {
    static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 1, 9}, {3, 40, 2}};
    static const cublasLtEpilogue_t epilogues[] = {CUBLASLT_EPILOGUE_DEFAULT,
                                                   CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU,
                                                   CUBLASLT_EPILOGUE_RELU_BIAS};
    static const cudaDataType_t types[][2] = {
        {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F}};
    cublasLtHandle_t h;
    ck_assert_int_eq(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 21);
    int cases = 0;
    for (int s = 0; s < 5; s++)
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++)
                for (int ty = 0; ty < 3; ty++) {
                    gemm_case c = {shapes[s][0],
                                   shapes[s][1],
                                   shapes[s][2],
                                   t & 1,
                                   t >> 1,
                                   1 + (s + t + e) % 3,
                                   epilogues[e],
                                   types[ty][0],
                                   types[ty][1],
                                   0.75f,
                                   (e + ty) % 2 ? 0.5f : 0.0f,
                                   (s + ty) % 3};
                    run_case(h, &c, &rng);
                    cases++;
                }
    printf("%d GEMM cases match the reference\n", cases);
    ck_assert_int_eq(cublasLtDestroy(h), CUBLAS_STATUS_SUCCESS);
}
END_TEST

/* What the real library rejects (or would silently get wrong) is an error here. */
START_TEST(test_argument_checks) {
    cublasLtHandle_t h;
    ck_assert_int_eq(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t desc;
    ck_assert_int_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                     CUBLAS_STATUS_SUCCESS);
    float *buf = NULL, alpha = 1.0f, beta = 0.0f;
    ck_assert_int_eq(cudaMalloc((void **)&buf, 4096 * sizeof(float)), cudaSuccess);
    ck_assert_int_eq(cudaMemset(buf, 0, 4096 * sizeof(float)), cudaSuccess);
    cublasLtMatrixLayout_t a = layout(CUDA_R_32F, 8, 4, 8, 1, 0),
                           b = layout(CUDA_R_32F, 4, 6, 4, 1, 0);
    cublasLtMatrixLayout_t d = layout(CUDA_R_32F, 8, 6, 8, 1, 0);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_SUCCESS);
    /* a leading dimension below the rows */
    cublasLtMatrixLayout_t bad_ld = layout(CUDA_R_32F, 8, 4, 7, 1, 0);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, bad_ld, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    ck_assert(strstr(luna_emu_last_error(), "ld must be >= rows"));
    /* inner dimensions that differ (A 8×4, B 5×6) */
    cublasLtMatrixLayout_t b5 = layout(CUDA_R_32F, 5, 6, 5, 1, 0);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a, buf + 64, b5, &beta, buf + 128, d,
                                    buf + 128, d, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* a matrix running past the end of its allocation */
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf + 4096 - 16, a, buf + 64, b, &beta,
                                    buf + 128, d, buf + 128, d, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* attribute of the wrong size (BIAS_BATCH_STRIDE is int64_t) */
    int32_t small = 5;
    ck_assert_int_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                    &small, sizeof small),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* the heuristic's algorithm assumes 16-byte aligned matrices (preference default 256) and
     * its workspace; a 4-byte aligned A, or no workspace, is refused */
    cublasLtMatmulPreference_t pref;
    uint64_t ws_max = 1 << 20;
    ck_assert_int_eq(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max),
                     CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    ck_assert_int_eq(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref, 1, &res, &found),
                     CUBLAS_STATUS_SUCCESS);
    void *ws = NULL;
    ck_assert_int_eq(cudaMalloc(&ws, res.workspaceSize), cudaSuccess);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf + 1, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, &res.algo, ws, res.workspaceSize, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    ck_assert(strstr(luna_emu_last_error(), "16-byte aligned"));
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, &res.algo, ws, res.workspaceSize, 0),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, &res.algo, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* with a 4-byte minimum alignment in the preference, the same call is fine */
    uint32_t four = 4;
    ck_assert_int_eq(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four, sizeof four),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref, 1, &res, &found),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf + 1, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, &res.algo, ws, res.workspaceSize, 0),
                     CUBLAS_STATUS_SUCCESS);
    /* a BIAS epilogue without a bias pointer; an epilogue that is not emulated */
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    ck_assert_int_eq(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
        CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    epi = CUBLASLT_EPILOGUE_GELU;
    ck_assert_int_eq(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
        CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a, buf + 64, b, &beta, buf + 128, d,
                                    buf + 128, d, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    /* D's batches overlapping (stride below ld·cols) */
    cublasLtMatrixLayout_t a2 = layout(CUDA_R_32F, 8, 4, 8, 2, 32),
                           b2 = layout(CUDA_R_32F, 4, 6, 4, 2, 24);
    cublasLtMatrixLayout_t d2 = layout(CUDA_R_32F, 8, 6, 8, 2, 40);
    epi = CUBLASLT_EPILOGUE_DEFAULT;
    ck_assert_int_eq(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
        CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, a2, buf + 64, b2, &beta, buf + 128, d2,
                                    buf + 128, d2, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    ck_assert(strstr(luna_emu_last_error(), "overlap"));
    cublasLtMatrixLayout_t layouts[] = {a, b, d, bad_ld, b5, a2, b2, d2};
    for (int i = 0; i < 8; i++)
        cublasLtMatrixLayoutDestroy(layouts[i]);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
    cudaFree(buf), cudaFree(ws);
}
END_TEST

/* CUBLAS_COMPUTE_32F_FAST_TF32 rounds A and B to TF32 (10 mantissa bits) as tensor cores do. */
START_TEST(test_fast_tf32_rounds_inputs) {
    cublasLtHandle_t h;
    ck_assert_int_eq(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    float host[3] = {1.0f + 1.0f / 4096, 1.0f, 0.0f}, alpha = 1.0f, beta = 0.0f, out[2];
    float *buf = NULL;
    ck_assert_int_eq(cudaMalloc((void **)&buf, sizeof host), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    cublasLtMatrixLayout_t one = layout(CUDA_R_32F, 1, 1, 1, 1, 0);
    const cublasComputeType_t compute[2] = {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    for (int i = 0; i < 2; i++) {
        cublasLtMatmulDesc_t desc;
        ck_assert_int_eq(cublasLtMatmulDescCreate(&desc, compute[i], CUDA_R_32F),
                         CUBLAS_STATUS_SUCCESS);
        ck_assert_int_eq(cublasLtMatmul(h, desc, &alpha, buf, one, buf + 1, one, &beta, buf + 2,
                                        one, buf + 2, one, NULL, NULL, 0, 0),
                         CUBLAS_STATUS_SUCCESS);
        ck_assert_int_eq(cudaMemcpy(&out[i], buf + 2, sizeof(float), cudaMemcpyDeviceToHost),
                         cudaSuccess);
        cublasLtMatmulDescDestroy(desc);
    }
    ck_assert_float_eq(out[0], 1.0f + 1.0f / 4096);
    ck_assert_float_eq(out[1], 1.0f);
    cublasLtMatrixLayoutDestroy(one);
    cublasLtDestroy(h);
    cudaFree(buf);
}
END_TEST

static Suite *cublaslt_suite(void) {
    Suite *s = suite_create("cuda_emu_cublaslt");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gemm_against_reference);
    tcase_add_test(tc, test_argument_checks);
    tcase_add_test(tc, test_fast_tf32_rounds_inputs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(cublaslt_suite()); }
