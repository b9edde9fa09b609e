/* GEMMs through cuBLASLt (gemm_lt.h). */
#include "model/kernels/cuda/gemm_lt.h"

#include "core/allocator.h"

#include <stdatomic.h>

#include <stdio.h>
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

/* A column-major layout of `rows` × `cols` (ld ≥ rows), batched: strided, or (ptr_mode) the
 * matrices' addresses in a device array of pointers. */
static cublasStatus_t make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int rows,
                                  int cols, int ld, int batch, int64_t stride, bool ptr_mode) {
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld);
    if (s != CUBLAS_STATUS_SUCCESS || (batch == 1 && !ptr_mode)) return s;
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof batch);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (ptr_mode) {
        const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
        return cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode,
                                                sizeof mode);
    }
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
    int32_t ab_bf16, c_bf16, compute, op_a, op_b, has_bias, relu, ptr_mode;
    int32_t M, N, K, lda, ldb, ldc, batch;
    uint32_t align[3];
    int64_t stride_a, stride_b, stride_c, stride_bias;
} plan_key;

typedef struct {
    plan_key key;
    bool used;
    bool unsupported; /* pointer-array plans only: the heuristic had no algorithm for the key */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

#define PLAN_CAPACITY 1024 /* a power of two; a training update makes ~50 shapes */

/* The device pointer arrays of grid GEMMs (luna_cuda_gemm_grid), by everything that decides
 * them: a training step makes the same ~100 grids at the same addresses every step, so after the
 * first step a grid GEMM is one launch, cuBLASLt's. */
typedef struct {
    const void *a, *b, *c;
    int64_t stride[6]; /* bytes: A outer, A inner, B outer, B inner, C outer, C inner */
    int32_t outer, inner;
} ptrs_key;

typedef struct {
    ptrs_key key;
    bool used;
    void **dev;       /* 3·outer·inner pointers: A's, B's, C's */
    int64_t capacity; /* pointers dev holds */
} ptrs_entry;

#define PTRS_CAPACITY 512 /* a power of two */
#define PTRS_PROBE 8

struct luna_gemm_plans {
    plan slot[PLAN_CAPACITY];
    int64_t count, made, reused;
    ptrs_entry ptrs[PTRS_CAPACITY];
    int64_t ptr_fills, ptr_hits, no_pointer_plan;
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
    for (int i = 0; i < PTRS_CAPACITY; i++)
        if (ps->ptrs[i].dev) cudaFree(ps->ptrs[i].dev);
    free(ps);
}

void luna_gemm_plans_counts(const luna_gemm_plans *ps, int64_t *made, int64_t *reused) {
    *made = ps ? ps->made : 0;
    *reused = ps ? ps->reused : 0;
}

static uint64_t bytes_hash(const void *key, size_t n) { /* FNV-1a (keys have zeroed padding) */
    const unsigned char *b = (const unsigned char *)key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
static uint64_t key_hash(const plan_key *k) { return bytes_hash(k, sizeof *k); }

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
    if (k->has_bias || k->relu) {
        const cublasLtEpilogue_t epi =
            k->has_bias ? (k->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                        : CUBLASLT_EPILOGUE_RELU;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                              sizeof epi));
    }
    if (k->has_bias && k->stride_bias != 0)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                              &k->stride_bias, sizeof k->stride_bias));
    /* stored shapes (column-major view of row-major storage): our B is [K, N] row-major = N×K
     * column-major with ld = ldb when not transposed, [N, K] row-major = K×N when transposed */
    const bool pm = k->ptr_mode != 0;
    LT_TRY(make_layout(&p->la, type, trans_b ? k->K : k->N, trans_b ? k->N : k->K, k->ldb, k->batch,
                       k->stride_b, pm));
    LT_TRY(make_layout(&p->lb, type, trans_a ? k->M : k->K, trans_a ? k->K : k->M, k->lda, k->batch,
                       k->stride_a, pm));
    LT_TRY(make_layout(&p->lc, ctype, k->N, k->M, k->ldc, k->batch, k->stride_c, pm));
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
                        "cuBLASLt: no algorithm for M %d N %d K %d batch %d%s (%s)", k->M, k->N,
                        k->K, k->batch, k->ptr_mode ? " of pointers" : "",
                        k->ab_bf16 ? (k->c_bf16 ? "bf16" : "bf16 -> fp32") : "fp32");
        goto done;
    }
    p->algo = heur.algo;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st != LUNA_OK) plan_destroy(p);
    return st;
}

/* The plan of key k: found made, or made now (into its cache slot, or into *local when there is
 * no cache or it is full). A pointer-array key that cannot get a plan, for whatever reason (no
 * algorithm; a cuBLASLt without the mode), is remembered and gives LUNA_ERR_UNSUPPORTED: the
 * caller falls back to strided batches, said once per shape since it costs a launch per head. */
static luna_status find_plan(const luna_cuda_blas *b, const plan_key *k, plan *local, plan **out) {
    plan *p = b->plans ? plan_slot(b->plans, k) : NULL;
    if (p && p->used) {
        if (p->unsupported)
            return luna_error(LUNA_ERR_UNSUPPORTED, "cuBLASLt: no pointer-array plan");
        b->plans->reused++;
        *out = p;
        return LUNA_OK;
    }
    plan *made = p ? p : local;
    luna_status st = plan_make(b, k, made);
    if (st != LUNA_OK && k->ptr_mode) {
        if (p) {
            p->key = *k;
            p->used = p->unsupported = true;
            b->plans->count++;
            b->plans->no_pointer_plan++;
            fprintf(stderr,
                    "luna: cuda: no cuBLASLt pointer-array plan for %d x %d x %d (batch %d: %s): "
                    "these grid GEMMs run as one strided batch per head\n",
                    k->M, k->N, k->K, k->batch, luna_error_message());
        }
        return LUNA_ERR_UNSUPPORTED;
    }
    LUNA_TRY(st);
    if (p) {
        p->key = *k;
        p->used = true;
        b->plans->count++;
        b->plans->made++;
    }
    *out = made;
    return LUNA_OK;
}

static _Atomic uint64_t g_gemm_launches;
uint64_t luna_cuda_gemm_launches(void) { return g_gemm_launches; }

/* cuBLASLt's matmul with plan p: A, B, C the matrices (strided key) or the device arrays of their
 * addresses (ptr_mode key), our row-major names. */
static luna_status matmul(const luna_cuda_blas *b, cudaStream_t s, plan *p, float alpha,
                          const void *A, const void *B, float beta, void *C, const void *bias) {
    luna_status st = LUNA_OK;
    if (bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    g_gemm_launches++;
    LT_TRY(cublasLtMatmul(b->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                          &p->algo, b->workspace, b->workspace_bytes, s));
done:
    return st;
}

/* find_plan, then matmul; a plan made outside the cache is destroyed after its one call. */
static luna_status run_plan(const luna_cuda_blas *b, cudaStream_t s, const plan_key *k, float alpha,
                            const void *A, const void *B, float beta, void *C, const void *bias) {
    plan local = {0}, *p = NULL;
    LUNA_TRY(find_plan(b, k, &local, &p));
    luna_status st = matmul(b, s, p, alpha, A, B, beta, C, bias);
    if (p == &local) plan_destroy(&local);
    return st;
}

/* The fields of a plan key every GEMM sets alike. */
static void key_init(plan_key *k, const luna_cuda_blas *b, int ab_bf16, int c_bf16, bool trans_a,
                     bool trans_b, int M, int N, int K, int lda, int ldb, int ldc, int batch) {
    memset(k, 0, sizeof *k); /* padding too: the key is hashed and compared as bytes */
    k->ab_bf16 = ab_bf16;
    k->c_bf16 = c_bf16;
    k->compute = !ab_bf16 && b->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    k->op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* on our B */
    k->op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* on our A */
    k->M = M, k->N = N, k->K = K, k->lda = lda, k->ldb = ldb, k->ldc = ldc, k->batch = batch;
}

/* luna_cuda_gemm_ex, with relu: C = max(0, ...) in the epilogue. */
static luna_status gemm_epilogue(const luna_cuda_blas *b, cudaStream_t s, int ab_bf16, int c_bf16,
                                 bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                 const void *A, int lda, int64_t stride_a, const void *B, int ldb,
                                 int64_t stride_b, float beta, void *C, int ldc, int64_t stride_c,
                                 int batch, const void *bias, int64_t stride_bias, bool relu) {
    if (!ab_bf16 && c_bf16)
        return luna_error(LUNA_ERR_UNSUPPORTED, "gemm: fp32 inputs with a bf16 result");
    if (M < 0 || N < 0 || K < 0 || batch < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "gemm: negative size (M %d, N %d, K %d, batch %d)", M, N, K, batch);
    if (M == 0 || N == 0 || batch == 0) return LUNA_OK;
    if (K == 0) { /* cuBLASLt needs k ≥ 1: C = beta·C (and + bias) by a kernel */
        if (bias || relu)
            return luna_error(LUNA_ERR_UNSUPPORTED, "gemm: K = 0 with an epilogue on cuda");
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
    key_init(&k, b, ab_bf16, c_bf16, trans_a, trans_b, M, N, K, lda, ldb, ldc, batch);
    k.has_bias = bias != NULL;
    k.relu = relu;
    k.stride_a = batch > 1 ? stride_a : 0; /* unused (and not set) for one matrix */
    k.stride_b = batch > 1 ? stride_b : 0;
    k.stride_c = batch > 1 ? stride_c : 0;
    k.stride_bias = batch > 1 && bias ? stride_bias : 0;
    k.align[0] = alignment(B, stride_b, es_ab, batch);
    k.align[1] = alignment(A, stride_a, es_ab, batch);
    k.align[2] = alignment(C, stride_c, es_c, batch);
    return run_plan(b, s, &k, alpha, A, B, beta, C, bias);
}

luna_status luna_cuda_gemm_ex(const luna_cuda_blas *b, cudaStream_t s, int ab_bf16, int c_bf16,
                              bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                              const void *A, int lda, int64_t stride_a, const void *B, int ldb,
                              int64_t stride_b, float beta, void *C, int ldc, int64_t stride_c,
                              int batch, const void *bias) {
    return gemm_epilogue(b, s, ab_bf16, c_bf16, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a,
                         B, ldb, stride_b, beta, C, ldc, stride_c, batch, bias, 0, false);
}

luna_status luna_cuda_gemm_relu(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                                bool trans_b, int M, int N, int K, const void *A, int lda,
                                const void *B, int ldb, void *C, int ldc, const void *bias) {
    return gemm_epilogue(b, s, bf16, bf16, trans_a, trans_b, M, N, K, 1.0f, A, lda, 0, B, ldb, 0,
                         0.0f, C, ldc, 0, 1, bias, 0, true);
}

luna_status luna_cuda_gemm_bias_batched(const luna_cuda_blas *b, cudaStream_t s, int bf16,
                                        bool trans_a, bool trans_b, int M, int N, int K,
                                        const void *A, int lda, int64_t stride_a, const void *B,
                                        int ldb, int64_t stride_b, void *C, int ldc,
                                        int64_t stride_c, int batch, const void *bias,
                                        int64_t stride_bias) {
    return gemm_epilogue(b, s, bf16, bf16, trans_a, trans_b, M, N, K, 1.0f, A, lda, stride_a, B,
                         ldb, stride_b, 0.0f, C, ldc, stride_c, batch, bias, stride_bias, false);
}

/* ---- grids -------------------------------------------------------------------------------- */

void luna_gemm_plans_pointer_counts(const luna_gemm_plans *ps, int64_t *fills, int64_t *hits,
                                    int64_t *no_plan) {
    *fills = ps ? ps->ptr_fills : 0;
    *hits = ps ? ps->ptr_hits : 0;
    *no_plan = ps ? ps->no_pointer_plan : 0;
}

/* The device array of the grid's matrix addresses (A's, then B's, then C's): found, or filled by
 * one launch into an entry of the cache (allocated, or grown, the first time). */
static luna_status grid_pointers(luna_gemm_plans *ps, cudaStream_t s, const ptrs_key *k,
                                 void ***out) {
    const uint64_t h = bytes_hash(k, sizeof *k);
    ptrs_entry *e = NULL;
    for (int n = 0; n < PTRS_PROBE; n++) {
        ptrs_entry *c = &ps->ptrs[(h + (uint64_t)n) & (PTRS_CAPACITY - 1)];
        if (c->used && memcmp(&c->key, k, sizeof *k) == 0) {
            ps->ptr_hits++;
            *out = c->dev;
            return LUNA_OK;
        }
        if (!e && !c->used) e = c;
    }
    if (!e) e = &ps->ptrs[h & (PTRS_CAPACITY - 1)]; /* full around here: replace the first */
    const int64_t need = 3 * (int64_t)k->outer * k->inner;
    if (e->capacity < need) {
        /* cudaFree waits for the device: the array may still be read by a queued GEMM */
        if (e->dev) LUNA_TRY(luna_cuda_check(cudaFree(e->dev), "cudaFree (GEMM pointers)"));
        e->dev = NULL;
        e->used = false;
        e->capacity = 0;
        LUNA_TRY(luna_cuda_check(cudaMalloc((void **)&e->dev, (size_t)need * sizeof(void *)),
                                 "cudaMalloc (GEMM pointers)"));
        e->capacity = need;
    }
    e->used = false; /* until filled */
    LUNA_TRY(luna_cuda_check(
        luna_cuda_grid_pointers(s, e->dev, k->a, k->stride[0], k->stride[1], k->b, k->stride[2],
                                k->stride[3], k->c, k->stride[4], k->stride[5], k->outer, k->inner),
        "grid_pointers"));
    e->key = *k;
    e->used = true;
    ps->ptr_fills++;
    *out = e->dev;
    return LUNA_OK;
}

/* While the stream is captured, the grid's pointer array in scratch, filled by a launch that the
 * graph holds (*out; the caller releases the scratch after its GEMM). Otherwise *out = NULL: the
 * cache's array serves, and the scratch space is only taken and given back, so that a capture of
 * the same work finds the arena's chunks large enough (it cannot allocate). */
static luna_status scratch_pointers(const luna_cuda_blas *b, cudaStream_t s, const ptrs_key *k,
                                    void ***out) {
    *out = NULL;
    if (!b->scratch) return LUNA_OK; /* a bare luna_cuda_blas (tests): never captured */
    const size_t bytes = 3 * (size_t)k->outer * (size_t)k->inner * sizeof(void *);
    void **dev = luna_arena_alloc(b->scratch, bytes);
    if (!dev)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "grid GEMM: no scratch for %zu bytes of pointers",
                          bytes);
    if (!b->capturing) return LUNA_OK;
    LUNA_TRY(luna_cuda_check(luna_cuda_grid_pointers(s, dev, k->a, k->stride[0], k->stride[1], k->b,
                                                     k->stride[2], k->stride[3], k->c, k->stride[4],
                                                     k->stride[5], k->outer, k->inner),
                             "grid_pointers"));
    *out = dev;
    return LUNA_OK;
}

/* The largest power of two ≤ 256 dividing every matrix address of a grid operand. */
static uint32_t grid_alignment(const void *p, luna_grid_stride st, size_t elem) {
    uintptr_t a = (uintptr_t)p;
    a |= (uintptr_t)(st.outer < 0 ? -st.outer : st.outer) * elem;
    a |= (uintptr_t)(st.inner < 0 ? -st.inner : st.inner) * elem;
    uint32_t al = 256;
    while (al > 1 && a % al)
        al >>= 1;
    return al;
}

luna_status luna_cuda_gemm_grid(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                                bool trans_b, int M, int N, int K, float alpha, const void *A,
                                int lda, luna_grid_stride sa, const void *B, int ldb,
                                luna_grid_stride sb, float beta, void *C, int ldc,
                                luna_grid_stride sc, int outer, int inner) {
    const int64_t G = (int64_t)outer * inner;
    if (M == 0 || N == 0 || G == 0) return LUNA_OK;
    /* one stride for all (one index, or strides that collapse): a plain strided batch */
    if (inner == 1 || outer == 1 ||
        (sa.outer == inner * sa.inner && sb.outer == inner * sb.inner &&
         sc.outer == inner * sc.inner && G <= INT32_MAX))
        return luna_cuda_gemm(b, s, bf16, trans_a, trans_b, M, N, K, alpha, A, lda,
                              inner == 1 ? sa.outer : sa.inner, B, ldb,
                              inner == 1 ? sb.outer : sb.inner, beta, C, ldc,
                              inner == 1 ? sc.outer : sc.inner, (int)G, NULL);
    const size_t es = bf16 ? 2 : 4;
    if (K > 0 && b->plans && b->grid_pointers && G <= INT32_MAX) {
        ptrs_key pk;
        memset(&pk, 0, sizeof pk);
        pk.a = A, pk.b = B, pk.c = C;
        const luna_grid_stride strides[3] = {sa, sb, sc};
        for (int i = 0; i < 3; i++) {
            pk.stride[2 * i] = strides[i].outer * (int64_t)es;
            pk.stride[2 * i + 1] = strides[i].inner * (int64_t)es;
        }
        pk.outer = outer, pk.inner = inner;
        plan_key k;
        key_init(&k, b, bf16, bf16, trans_a, trans_b, M, N, K, lda, ldb, ldc, (int)G);
        k.ptr_mode = 1;
        k.align[0] = grid_alignment(B, sb, es);
        k.align[1] = grid_alignment(A, sa, es);
        k.align[2] = grid_alignment(C, sc, es);
        /* the plan first: a shape without one fills no pointer array */
        plan local = {0}, *p = NULL;
        luna_status st = find_plan(b, &k, &local, &p);
        if (st != LUNA_ERR_UNSUPPORTED) {
            void **dev = NULL;
            luna_arena_mark mark = {0};
            if (b->scratch) mark = luna_arena_get_mark(b->scratch);
            if (st == LUNA_OK) st = scratch_pointers(b, s, &pk, &dev);
            if (st == LUNA_OK && !dev) st = grid_pointers(b->plans, s, &pk, &dev);
            if (st == LUNA_OK) st = matmul(b, s, p, alpha, dev, dev + G, beta, dev + 2 * G, NULL);
            if (b->scratch) luna_arena_release(b->scratch, mark);
            if (p == &local) plan_destroy(&local);
            return st;
        }
    }
    /* no pointer-array algorithm (or K = 0, or LUNA_CUDA_GRID=strided): one strided batch over
     * the outer index per inner */
    for (int i = 0; i < inner; i++)
        LUNA_TRY(luna_cuda_gemm(b, s, bf16, trans_a, trans_b, M, N, K, alpha,
                                (const char *)A + (size_t)i * (size_t)sa.inner * es, lda, sa.outer,
                                (const char *)B + (size_t)i * (size_t)sb.inner * es, ldb, sb.outer,
                                beta, (char *)C + (size_t)i * (size_t)sc.inner * es, ldc, sc.outer,
                                outer, NULL));
    return LUNA_OK;
}
