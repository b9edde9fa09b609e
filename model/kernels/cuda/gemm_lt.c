/* GEMMs through cuBLASLt (gemm_lt.h). */
#include "model/kernels/cuda/gemm_lt.h"

#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/cuda/device_runtime.h"

luna_status luna_cublas_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return LUNA_OK;
    return luna_error(st == CUBLAS_STATUS_ALLOC_FAILED    ? LUNA_ERR_OUT_OF_MEMORY
                      : st == CUBLAS_STATUS_NOT_SUPPORTED ? LUNA_ERR_UNSUPPORTED
                                                          : LUNA_ERR_INTERNAL,
                      "cuBLASLt: %s failed: %s", what, cublasLtGetStatusName(st));
}

#define LT_TRY(call)                                                                               \
    do {                                                                                           \
        st = luna_cublas_check((call), #call);                                                     \
        if (st != LUNA_OK) goto done;                                                              \
    } while (0)

/* A column-major layout of `rows` × `cols` (ld ≥ rows), batched. */
static cublasStatus_t make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int rows,
                                  int cols, int ld, int batch, int64_t stride) {
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld);
    if (s != CUBLAS_STATUS_SUCCESS || batch == 1) return s;
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof batch);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride);
}

/* The largest power of two ≤ 256 dividing the address of every batch's matrix. cuBLASLt's
 * heuristic assumes 256-byte aligned matrices unless told otherwise, and an algorithm chosen
 * for aligned data may fault or read wrongly on a matrix at an odd offset (a slice of a larger
 * buffer), so the real alignment goes into the preference. */
static uint32_t alignment(const void *p, int64_t stride_elems, size_t elem, int batch) {
    uintptr_t a = (uintptr_t)p;
    if (batch > 1) a |= (uintptr_t)(stride_elems < 0 ? -stride_elems : stride_elems) * elem;
    uint32_t al = 256;
    while (al > 1 && a % al)
        al >>= 1;
    return al;
}

luna_status luna_cuda_gemm(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                           bool trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                           int64_t stride_a, const void *B, int ldb, int64_t stride_b, float beta,
                           void *C, int ldc, int64_t stride_c, int batch, const void *bias) {
    return luna_cuda_gemm_ex(b, s, bf16, bf16, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a,
                             B, ldb, stride_b, beta, C, ldc, stride_c, batch, bias);
}

luna_status luna_cuda_gemm_ex(const luna_cuda_blas *b, cudaStream_t s, int ab_bf16, int c_bf16,
                              bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                              const void *A, int lda, int64_t stride_a, const void *B, int ldb,
                              int64_t stride_b, float beta, void *C, int ldc, int64_t stride_c,
                              int batch, const void *bias) {
    if (!ab_bf16 && c_bf16)
        return luna_error(LUNA_ERR_UNSUPPORTED, "gemm: fp32 inputs with a bf16 result");
    if (M < 0 || N < 0 || K < 0 || batch < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "gemm: negative size (M %d, N %d, K %d, batch %d)", M, N, K, batch);
    if (M == 0 || N == 0 || batch == 0) return LUNA_OK;
    if (K == 0) { /* cuBLASLt needs k ≥ 1: C = beta·C (and + bias) by a kernel */
        if (bias) return luna_error(LUNA_ERR_UNSUPPORTED, "gemm: K = 0 with a bias on cuda");
        return luna_cuda_check(
            luna_cuda_scale_matrix(s, c_bf16, C, M, N, ldc, stride_c, batch, beta),
            "scale_matrix (gemm with K = 0)");
    }
    /* Row-major C [M, N] = op(A) op(B)  <=>  column-major C^T [N, M] = op(B)^T op(A)^T: cuBLASLt's
     * "A" is our B (stored N×K column-major when not transposed in row-major terms). */
    const cudaDataType_t type = ab_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t ctype = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        !ab_bf16 && b->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* on our B */
    const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* on our A */
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    luna_status st = LUNA_OK;
    LT_TRY(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    if (bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_TRY(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    }
    /* stored shapes (column-major view of row-major storage): our B is [K, N] row-major = N×K
     * column-major with ld = ldb when not transposed, [N, K] row-major = K×N when transposed */
    LT_TRY(make_layout(&la, type, trans_b ? K : N, trans_b ? N : K, ldb, batch, stride_b));
    LT_TRY(make_layout(&lb, type, trans_a ? M : K, trans_a ? K : M, lda, batch, stride_a));
    LT_TRY(make_layout(&lc, ctype, N, M, ldc, batch, stride_c));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &b->workspace_bytes, sizeof b->workspace_bytes));
    const size_t es_ab = ab_bf16 ? 2 : 4, es_c = c_bf16 ? 2 : 4;
    const uint32_t align[4] = {
        alignment(B, stride_b, es_ab, batch), alignment(A, stride_a, es_ab, batch),
        alignment(C, stride_c, es_c, batch), alignment(C, stride_c, es_c, batch)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT_TRY(
            cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(b->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    if (found < 1) {
        st = luna_error(LUNA_ERR_UNSUPPORTED,
                        "cuBLASLt: no algorithm for M %d N %d K %d batch %d (%s)", M, N, K, batch,
                        ab_bf16 ? (c_bf16 ? "bf16" : "bf16 -> fp32") : "fp32");
        goto done;
    }
    LT_TRY(cublasLtMatmul(b->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur.algo,
                          b->workspace, b->workspace_bytes, s));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return st;
}
