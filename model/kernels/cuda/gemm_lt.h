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

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    cublasLtHandle_t lt;
    void *workspace; /* device memory for cuBLASLt's split-K and friends */
    size_t workspace_bytes;
    bool tf32; /* fp32 storage may use TF32 tensor cores */
} luna_cuda_blas;

/* LUNA_OK, or "cuBLASLt: <what> failed: <status name>". */
luna_status luna_cublas_check(cublasStatus_t st, const char *what);

/* Batched strided GEMM with the CPU backend's semantics (row-major, lda/ldb/ldc row strides,
 * batch strides in elements; beta = 0: C not read; K = 0: C = beta·C). bias [N] or NULL. */
luna_status luna_cuda_gemm(const luna_cuda_blas *b, cudaStream_t s, int bf16, bool trans_a,
                           bool trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                           int64_t stride_a, const void *B, int ldb, int64_t stride_b, float beta,
                           void *C, int ldc, int64_t stride_c, int batch, const void *bias);

/* The same with the inputs' and the result's storage given apart: bf16 A and B with an fp32 C
 * (weight gradients in bf16 mode: dW += dyᵀ·x accumulated in the fp32 master gradient), or one
 * type for all three; bias [N] of C's type. */
luna_status luna_cuda_gemm_ex(const luna_cuda_blas *b, cudaStream_t s, int ab_bf16, int c_bf16,
                              bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                              const void *A, int lda, int64_t stride_a, const void *B, int ldb,
                              int64_t stride_b, float beta, void *C, int ldc, int64_t stride_c,
                              int batch, const void *bias);

#ifdef __cplusplus
}
#endif

#endif
