/* The CUDA backend's GEMMs through cuBLASLt (gemm_lt.c): luna's row-major, batched, strided
 * C = alpha·op(A)·op(B) + beta·C (core/backend.h, gemm) as cuBLASLt's column-major product of the
 * transposes, C^T = op(B)^T·op(A)^T, so no data moves. fp32 or bf16 storage (A, B, C the same),
 * fp32 accumulation (CUBLAS_COMPUTE_32F; tf32 = 1 allows TF32 tensor cores for fp32 storage), an
 * optional bias [N] added to every row of C by cuBLASLt's BIAS epilogue (fp32 bias for fp32 C,
 * the activation type for bf16 C, as cuBLASLt requires), the backend's workspace. */
#ifndef LUNA_KERNELS_CUDA_GEMM_LT_H
#define LUNA_KERNELS_CUDA_GEMM_LT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/backend.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct luna_gemm_plans luna_gemm_plans;

/* cuBLASLt matmuls launched so far in this process (device_stats). */
uint64_t luna_cuda_gemm_launches(void);

typedef struct {
    cublasLtHandle_t lt;
    void *workspace; /* device memory for cuBLASLt's split-K and friends */
    size_t workspace_bytes;
    bool tf32;              /* fp32 storage may use TF32 tensor cores */
    luna_gemm_plans *plans; /* NULL, or the plans made so far (luna_gemm_plans_create) */
    bool grid_pointers;     /* grids as one pointer-array GEMM (false, LUNA_CUDA_GRID=strided:
                               one strided batch over the outer index per inner index) */
    /* the backend's scratch arena, and whether its stream is being captured (graphs.c): a
     * captured grid GEMM fills its pointer array in scratch, inside the graph, since the
     * cache's arrays are refilled with other grids' pointers after the capture */
    luna_arena *scratch;
    bool capturing;
} luna_cuda_blas;

/* The plans of the GEMMs called so far: cuBLASLt's descriptors, layouts and the heuristic's
 * algorithm, by everything that decides them (types, transposes, sizes, strides, batch, bias
 * epilogue, alignments). Making them took the host longer than many of the GEMMs it launched
 * (a training update makes ~500 GEMM calls of ~50 shapes; beam search many more of a few). A
 * plan is made once and reused; the same choice as without the cache, so the results do not
 * change. Bounded: past its capacity a GEMM makes its plan for the call, as without it. */
luna_status luna_gemm_plans_create(luna_gemm_plans **out);
void luna_gemm_plans_free(luna_gemm_plans *p);
/* Plans made, and GEMM calls that found their plan made (for tests and benchmarks). */
void luna_gemm_plans_counts(const luna_gemm_plans *p, int64_t *made, int64_t *reused);

/* Grid pointer arrays filled (a launch) and found filled (none), and grid shapes with no
 * pointer-array plan (run per head), for tests and benchmarks. */
void luna_gemm_plans_pointer_counts(const luna_gemm_plans *p, int64_t *fills, int64_t *hits,
                                    int64_t *no_plan);

/* LUNA_OK, or "cuBLASLt: <what> failed: <status name>". */
luna_status luna_cublas_check(cublasStatus_t st, const char *what);

/* Batched strided GEMM with the CPU backend's semantics (row-major, lda/ldb/ldc row strides,
 * batch strides in elements; beta = 0: C not read; K = 0: C = beta·C). bias [N] or NULL. */
luna_status luna_cuda_gemm(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                           bool trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                           int64_t stride_a, const void *B, int ldb, int64_t stride_b, float beta,
                           void *C, int ldc, int64_t stride_c, int batch, const void *bias);

/* One matrix, C = max(0, op(A)·op(B) + bias) (bias [N] or NULL): cuBLASLt's RELU_BIAS (RELU)
 * epilogue, so the relu costs no pass of its own (K ≥ 1). */
luna_status luna_cuda_gemm_relu(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                                bool trans_b, int M, int N, int K, const void *A, int lda,
                                const void *B, int ldb, void *C, int ldc, const void *bias);

/* Batches with a bias each, C_i = op(A_i)·op(B_i) + bias_i (bias_i = bias + i·stride_bias
 * elements, NULL for none): linear_forward_multi's projections of one input (stride_a = 0). */
luna_status luna_cuda_gemm_bias_batched(const luna_cuda_blas *b, cudaStream_t s, int bf16,
                                        bool trans_a, bool trans_b, int M, int N, int K,
                                        const void *A, int lda, int64_t stride_a, const void *B,
                                        int ldb, int64_t stride_b, void *C, int ldc,
                                        int64_t stride_c, int batch, const void *bias,
                                        int64_t stride_bias);

/* The same with the inputs' and the result's storage given apart: bf16 A and B with an fp32 C
 * (weight gradients in bf16 mode: dW += dyᵀ·x accumulated in the fp32 master gradient), or one
 * type for all three; bias [N] of C's type. */
luna_status luna_cuda_gemm_ex(const luna_cuda_blas *b, cudaStream_t s, int ab_bf16, int c_bf16,
                              bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                              const void *A, int lda, int64_t stride_a, const void *B, int ldb,
                              int64_t stride_b, float beta, void *C, int ldc, int64_t stride_c,
                              int batch, const void *bias);

/* Grid-batched GEMM (core/backend.h, gemm_grid) with A, B, C of one storage type. A grid whose
 * strides collapse to one is a strided batch. Otherwise cuBLASLt's pointer-array batches: the
 * matrices' addresses in a device array, made by one launch and kept by key (the same grids at
 * the same addresses recur every training step), so a grid is usually one launch. Where the
 * heuristic has no pointer-array algorithm (remembered per shape), one strided batch over the
 * outer index per inner index. The caller makes sure the outputs do not overlap. */
luna_status luna_cuda_gemm_grid(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                                bool trans_b, int M, int N, int K, float alpha, const void *A,
                                int lda, luna_grid_stride sa, const void *B, int ldb,
                                luna_grid_stride sb, float beta, void *C, int ldc,
                                luna_grid_stride sc, int outer, int inner);

#ifdef __cplusplus
}
#endif

#endif
