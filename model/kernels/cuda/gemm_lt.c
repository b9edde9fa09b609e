/* GEMMs through cuBLASLt (gemm_lt.h). */
#include "model/kernels/cuda/gemm_lt.h"

#include <stdlib.h>
#include <string.h>

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

/* ---- plans -------------------------------------------------------------------------------- */

typedef struct {
    int32_t ab_bf16, c_bf16, compute, op_a, op_b, has_bias;
    int32_t M, N, K, lda, ldb, ldc, batch;
    uint32_t align[3];
    int64_t stride_a, stride_b, stride_c;
} plan_key;

typedef struct {
    plan_key key;
    bool used;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

#define PLAN_CAPACITY 1024 /* a power of two; a training update makes ~50 shapes */

struct luna_gemm_plans {
    plan slot[PLAN_CAPACITY];
    int64_t count, made, reused;
};

luna_status luna_gemm_plans_create(luna_gemm_plans **out) {
    *out = calloc(1, sizeof **out);
    return *out ? LUNA_OK
                : luna_error(LUNA_ERR_OUT_OF_MEMORY, "cuBLASLt: no memory for the GEMM plans");
}

static void plan_destroy(plan *p) {
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    p->lc = p->lb = p->la = NULL;
    p->desc = NULL;
}

void luna_gemm_plans_free(luna_gemm_plans *ps) {
    if (!ps) return;
    for (int i = 0; i < PLAN_CAPACITY; i++)
        if (ps->slot[i].used) plan_destroy(&ps->slot[i]);
    free(ps);
}

void luna_gemm_plans_counts(const luna_gemm_plans *ps, int64_t *made, int64_t *reused) {
    *made = ps ? ps->made : 0;
    *reused = ps ? ps->reused : 0;
}

static uint64_t key_hash(const plan_key *k) { /* FNV-1a over the key's bytes (zeroed padding) */
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The slot of key k: its plan (used), or the free slot to put it in; NULL when full. */
static plan *plan_slot(luna_gemm_plans *ps, const plan_key *k) {
    for (uint64_t i = key_hash(k), n = 0; n < PLAN_CAPACITY; i++, n++) {
        plan *p = &ps->slot[i & (PLAN_CAPACITY - 1)];
        if (!p->used || memcmp(&p->key, k, sizeof *k) == 0) return p;
    }
    return NULL;
}

/* Make plan p for key k: descriptor, layouts, preference and the heuristic's first algorithm. */
static luna_status plan_make(const luna_cuda_blas *b, const plan_key *k, plan *p) {
    const cudaDataType_t type = k->ab_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t ctype = k->c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t op_a = (cublasOperation_t)k->op_a, op_b = (cublasOperation_t)k->op_b;
    const bool trans_b = op_a == CUBLAS_OP_T, trans_a = op_b == CUBLAS_OP_T;
    cublasLtMatmulPreference_t pref = NULL;
    luna_status st = LUNA_OK;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, (cublasComputeType_t)k->compute, CUDA_R_32F));
    LT_TRY(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    LT_TRY(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    if (k->has_bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                              sizeof epi));
    }
    /* stored shapes (column-major view of row-major storage): our B is [K, N] row-major = N×K
     * column-major with ld = ldb when not transposed, [N, K] row-major = K×N when transposed */
    LT_TRY(make_layout(&p->la, type, trans_b ? k->K : k->N, trans_b ? k->N : k->K, k->ldb, k->batch,
                       k->stride_b));
    LT_TRY(make_layout(&p->lb, type, trans_a ? k->M : k->K, trans_a ? k->K : k->M, k->lda, k->batch,
                       k->stride_a));
    LT_TRY(make_layout(&p->lc, ctype, k->N, k->M, k->ldc, k->batch, k->stride_c));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &b->workspace_bytes, sizeof b->workspace_bytes));
    const uint32_t align[4] = {k->align[0], k->align[1], k->align[2], k->align[2]};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT_TRY(
            cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(b->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                          &heur, &found));
    if (found < 1) {
        st = luna_error(LUNA_ERR_UNSUPPORTED,
                        "cuBLASLt: no algorithm for M %d N %d K %d batch %d (%s)", k->M, k->N, k->K,
                        k->batch, k->ab_bf16 ? (k->c_bf16 ? "bf16" : "bf16 -> fp32") : "fp32");
        goto done;
    }
    p->algo = heur.algo;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st != LUNA_OK) plan_destroy(p);
    return st;
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
     * "A" is our B (stored N×K column-major when not transposed in row-major terms). The
     * alignments go into the preference: cuBLASLt's heuristic assumes 256-byte aligned matrices
     * unless told otherwise (alignment() above). */
    const size_t es_ab = ab_bf16 ? 2 : 4, es_c = c_bf16 ? 2 : 4;
    plan_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared as bytes */
    k.ab_bf16 = ab_bf16;
    k.c_bf16 = c_bf16;
    k.compute = !ab_bf16 && b->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    k.op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* on our B */
    k.op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* on our A */
    k.has_bias = bias != NULL;
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc, k.batch = batch;
    k.stride_a = batch > 1 ? stride_a : 0; /* unused (and not set) for one matrix */
    k.stride_b = batch > 1 ? stride_b : 0;
    k.stride_c = batch > 1 ? stride_c : 0;
    k.align[0] = alignment(B, stride_b, es_ab, batch);
    k.align[1] = alignment(A, stride_a, es_ab, batch);
    k.align[2] = alignment(C, stride_c, es_c, batch);
    plan local = {0}, *p = b->plans ? plan_slot(b->plans, &k) : NULL;
    luna_status st = LUNA_OK;
    if (p && p->used) {
        b->plans->reused++;
    } else {
        plan *made = p ? p : &local;
        LUNA_TRY(plan_make(b, &k, made));
        if (p) {
            p->key = k;
            p->used = true;
            b->plans->count++;
            b->plans->made++;
        } else {
            p = &local; /* no cache, or a full one: this call's plan only */
        }
    }
    if (bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    LT_TRY(cublasLtMatmul(b->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                          &p->algo, b->workspace, b->workspace_bytes, s));
done:
    if (p == &local) plan_destroy(&local);
    return st;
}
