/* Launchers of the CUDA backend's kernels (the .cu files of model/kernels/cuda/), callable from C.
 * Each enqueues its kernel on `stream` and returns the launch's status (cudaGetLastError); argument
 * checks are the caller's (the backend's op wrappers, with luna statuses).
 *
 * Activations are `void *` with `bf16` saying their storage: 0 = fp32, 1 = bf16 (__nv_bfloat16).
 * Kernels load activations to fp32, compute in fp32 exactly as the CPU backend does (the same
 * operations in the same order; no contraction into fused multiply-adds where the CPU has none),
 * and round once when they store (round to nearest even for bf16). fp32 buffers (parameters,
 * gradients) are `float *`. Semantics of each: the op of the same name in core/backend.h. */
#ifndef LUNA_KERNELS_CUDA_KERNELS_H
#define LUNA_KERNELS_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/backend.h"
#include "core/philox.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "model/kernels/column_sum_order.h"

/* Kernel launches so far in this process (every LUNA_LAUNCH of every .cu file; elementwise.cu). */
unsigned long long luna_cuda_kernel_launches(void);

/* Device workspace of the column sums (bias gradients, LayerNorm's dγ/dβ; column_sum.cuh): n
 * doubles at p, from the backend's scratch. Its size: the running totals (nout·cols) and a round
 * of chunk sums (nout·cols per chunk of LUNA_COLSUM_CHUNK rows), at most LUNA_CUDA_COLSUM_WS_MAX
 * doubles unless one chunk alone needs more. */
typedef struct {
    double *p;
    int64_t n;
} luna_cuda_colsum_ws;
#define LUNA_CUDA_COLSUM_WS_MAX ((int64_t)1 << 20) /* 8 MB */

static inline int64_t luna_cuda_colsum_ws_doubles(int64_t rows, int cols, int nout) {
    const int64_t per_chunk = (int64_t)nout * (cols > 0 ? cols : 1);
    const int64_t nchunks = rows > 0 ? (rows + LUNA_COLSUM_CHUNK - 1) / LUNA_COLSUM_CHUNK : 1;
    int64_t k = LUNA_CUDA_COLSUM_WS_MAX / per_chunk - 1;
    if (k < 1) k = 1;
    if (k > nchunks) k = nchunks;
    return per_chunk * (1 + k);
}
/* Chunks per round for a workspace of n doubles (< 1: too small). */
static inline int64_t luna_cuda_colsum_round(int64_t rows, int cols, int nout, int64_t n) {
    const int64_t per_chunk = (int64_t)nout * cols;
    const int64_t nchunks = (rows + LUNA_COLSUM_CHUNK - 1) / LUNA_COLSUM_CHUNK;
    const int64_t k = n / per_chunk - 1;
    return k < nchunks ? k : nchunks;
}

/* ---- elementwise.cu ---- */
cudaError_t luna_cuda_add(cudaStream_t s, int bf16, void *y, const void *a, const void *b,
                          int64_t n);
cudaError_t luna_cuda_axpy(cudaStream_t s, int bf16, void *y, float alpha, const float *x,
                           int64_t n);
cudaError_t luna_cuda_scale_act(cudaStream_t s, int bf16, void *x, float alpha, int64_t n);
cudaError_t luna_cuda_softplus_ln2_forward(cudaStream_t s, int bf16, void *y, const void *x,
                                           int64_t n);
cudaError_t luna_cuda_softplus_ln2_backward(cudaStream_t s, int bf16, void *dx, const void *dy,
                                            const void *x, int64_t n);
cudaError_t luna_cuda_elu_plus_one_forward(cudaStream_t s, int bf16, void *y, const void *x,
                                           int64_t n);
cudaError_t luna_cuda_elu_plus_one_backward(cudaStream_t s, int bf16, void *dx, const void *dy,
                                            const void *x, int64_t n);
/* y = x · keep / (1 − p) with keep from core/philox.h (the CPU's masks, bit for bit); p in
 * (0, 1) (p = 0 is a copy, done by the caller). Forward and backward are the same map. */
cudaError_t luna_cuda_dropout(cudaStream_t s, int bf16, void *y, const void *x, int64_t n, float p,
                              luna_rng_key key);
/* split (1) or merge (0) heads: [B, n, H, dh] <-> [B, H, n, dh]; out must not overlap x. */
cudaError_t luna_cuda_heads_permute(cudaStream_t s, int bf16, void *out, const void *x, int B,
                                    int n, int H, int dh, int split);
/* The matrices of a grid GEMM as cuBLASLt's pointer-array batches: for g = o·inner + i < G,
 * out[g] = A + o·a_outer + i·a_inner, out[G + g] = B + …, out[2G + g] = C + … (byte strides). */
cudaError_t luna_cuda_grid_pointers(cudaStream_t s, void **out, const void *A, int64_t a_outer,
                                    int64_t a_inner, const void *B, int64_t b_outer,
                                    int64_t b_inner, const void *C, int64_t c_outer,
                                    int64_t c_inner, int outer, int inner);
cudaError_t luna_cuda_broadcast_rows(cudaStream_t s, int bf16, void *out, const void *x, int B,
                                     int64_t rows, int d);
/* dst[i, 0:cols] = src[idx ? idx[i] : i, 0:cols], rows dst_stride / src_stride apart. */
cudaError_t luna_cuda_gather_rows(cudaStream_t s, int bf16, void *dst, int64_t dst_stride,
                                  const void *src, int64_t src_stride, const int32_t *idx,
                                  int64_t n, int64_t cols);
/* gather_rows_in_groups (core/backend.h): n_groups < 2^31, group ≤ 32 (32 KB of shared
 * memory a block in fp32). */
cudaError_t luna_cuda_gather_rows_in_groups(cudaStream_t s, int bf16, void *buf, int64_t stride,
                                            const int32_t *idx, int64_t n_groups, int group,
                                            int64_t cols);
/* index_rows_update (core/backend.h): a block per row; n < 2^31. */
cudaError_t luna_cuda_index_rows_update(cudaStream_t s, int32_t *dst, const int32_t *src,
                                        const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                        const int32_t *set_col, const int32_t *set_val);

/* dx [rows·d] += Σ_b dout[b] in b order (fp32, as the CPU). */
cudaError_t luna_cuda_sum_broadcast(cudaStream_t s, int bf16, float *dx, const void *dout, int B,
                                    int64_t rows, int d);
cudaError_t luna_cuda_bias_add_forward(cudaStream_t s, int bf16, void *y, const float *b,
                                       int64_t rows, int cols);
/* db [cols] += Σ_r dy[r] in row order in double (one thread per column: the CPU's order). */
cudaError_t luna_cuda_bias_add_backward(cudaStream_t s, int bf16, float *db, const void *dy,
                                        int64_t rows, int cols, luna_cuda_colsum_ws ws);
/* C_b = beta · C_b for C_b [M, N] (row stride ldc) at b·stride, b < batch; beta = 0: zeros. */
cudaError_t luna_cuda_scale_matrix(cudaStream_t s, int bf16, void *c, int M, int N, int ldc,
                                   int64_t stride, int batch, float beta);

/* dst [n] bf16 = src [n] fp32 rounded to nearest even (the bf16 copies of weights). */
cudaError_t luna_cuda_convert_to_bf16(cudaStream_t s, void *dst, const float *src, int64_t n);

/* ---- embedding.cu ---- */
/* A token outside [0, V) gives a NaN row and sets *bad = 1 (bad: device int, or NULL). */
cudaError_t luna_cuda_embedding_forward(cudaStream_t s, int bf16, void *out, const float *table,
                                        const int32_t *tokens, int64_t n, int V, int d, float scale,
                                        int padding_idx, int *bad);
/* scratch: device memory of luna_cuda_embedding_backward_scratch(n, V) bytes (the positions
 * sorted by token: each token's rows added in position order), or NULL (each (token, column)
 * owner walks every token: no scratch, slower). Either way the CPU's order of additions. */
int64_t luna_cuda_embedding_backward_scratch(int64_t n, int V);
cudaError_t luna_cuda_embedding_backward(cudaStream_t s, int bf16, float *dtable, const void *dout,
                                         const int32_t *tokens, int64_t n, int V, int d,
                                         float scale, int padding_idx, void *scratch);
cudaError_t luna_cuda_sinusoidal_table(cudaStream_t s, int bf16, void *out, int first_pos, int npos,
                                       int d);
/* counts: device scratch [B·n] int32; table: device scratch [n·d] fp32. */
cudaError_t luna_cuda_positions_add(cudaStream_t s, int bf16, void *x, const int32_t *tokens, int B,
                                    int n, int d, int padding_idx, int32_t *counts, float *table);

/* *first_bad = min(*first_bad, i) for every i < n (< 2^31) with ids[i] outside [0, V), except
 * ids equal to `exempt` when has_exempt (a padding target); an integer atomicMin, so the result
 * (the first bad position) does not depend on the schedule. */
cudaError_t luna_cuda_find_bad_id_launch(cudaStream_t s, const int32_t *ids, int64_t n, int V,
                                         int exempt, int has_exempt, int *first_bad);

/* ---- reduce.cu: core/reduce_order.h's order, bit-identical to the CPU; result [num_tensors],
 * the table's device arrays (core/tensor_table.h), partials its workspace ---- */
cudaError_t luna_cuda_multi_sum_squares(cudaStream_t s, float *result, const float *x,
                                        int num_tensors, int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *partials);

/* ---- optimizer.cu: clipping and Adam over a tensor table's device arrays ---- */
cudaError_t luna_cuda_clip_coefficients(cudaStream_t s, float *coef, double *summary,
                                        const float *sumsq, int n, double clip_norm, int mode,
                                        const double *also_finite, int num_also);
cudaError_t luna_cuda_multi_scale(cudaStream_t s, float *x, int64_t num_blocks,
                                  const int64_t *offsets, const int64_t *numels,
                                  const int64_t *block_start, const int32_t *block_tensor,
                                  const float *coef, float alpha);
/* workspace: ≥ 2·num_tensors doubles; steps [num_tensors] advanced by one. */
cudaError_t luna_cuda_multi_adam_update(cudaStream_t s, float *theta, const float *g,
                                        float *exp_avg, float *exp_avg_sq, int num_tensors,
                                        int64_t num_blocks, const int64_t *offsets,
                                        const int64_t *numels, const int64_t *block_start,
                                        const int32_t *block_tensor, double *workspace,
                                        int64_t *steps, const double *gate, double lr, double beta1,
                                        double beta2, double eps, double weight_decay);

/* workspace: the table's (5·num_blocks + 8·num_tensors doubles); steps advanced by one. */
cudaError_t luna_cuda_multi_apollo_update(cudaStream_t s, float *theta, const float *g,
                                          float *exp_avg, float *approx_hessian, float *update,
                                          int num_tensors, int64_t num_blocks,
                                          const int64_t *offsets, const int64_t *numels,
                                          const int64_t *block_start, const int32_t *block_tensor,
                                          double *workspace, int64_t *steps, const double *gate,
                                          double lr, double beta, double eps, double sigma,
                                          int rebound, double weight_decay, int wd_type);

/* ---- cross_entropy.cu (N < 2^31 rows); bad: device int set to 1 for a target outside
 * [0, V) other than padding_idx (that row is NaN), or NULL ---- */
cudaError_t luna_cuda_cross_entropy_forward(cudaStream_t s, int bf16, float *loss, float *nll,
                                            float *lse, const void *logits, const int32_t *targets,
                                            int64_t N, int V, float epsilon, int padding_idx,
                                            int *bad);

cudaError_t luna_cuda_cross_entropy_forward_backward(cudaStream_t s, int bf16, float *loss,
                                                     float *nll, float *lse, void *dlogits,
                                                     const void *logits, const int32_t *targets,
                                                     int64_t N, int V, float epsilon,
                                                     int padding_idx, float grad_scale);
/* sums[0] += Σ loss[0, n), sums[1] += Σ nll[0, n) (doubles, a fixed tree). */
cudaError_t luna_cuda_loss_sums(cudaStream_t s, double *sums, const float *loss, const float *nll,
                                int64_t n);

/* ---- decode_select.cu: the k best log-probs per row (k ≤ V) and the picked one ---- */
cudaError_t luna_cuda_log_softmax_topk(cudaStream_t s, int bf16, const void *logits,
                                       const float *bias, int64_t rows, int V, int k, float *top_lp,
                                       int32_t *top_idx, const int32_t *pick, float *picked);
/* ---- decode_causal.cu: causal_step_products (core/backend.h), rows at their own positions t
 * (device [R]; NULL: every row at t_all). cudaErrorInvalidValue when K floats exceed 48 KB of
 * shared memory or R·H a grid. */
cudaError_t luna_cuda_causal_step_products(cudaStream_t s, int bf16, void *y, const void *x,
                                           const void *S, const int32_t *t, int t_all, int R, int H,
                                           int K, int N);
/* cache_products (core/backend.h): scores (values 0) y[g·T + p] or outputs (values 1)
 * y[g·dh + j] over the cache C (slots of `page` positions) read through the slot indices
 * ind [R, T_cap], row r over its first lens[r] positions (lens NULL: T); cache_write: each row's
 * newest position of x [R, H, dh] into C. */
cudaError_t luna_cuda_cache_products(cudaStream_t s, int bf16, int values, void *y, const void *x,
                                     const void *C, const int32_t *ind, const int32_t *lens, int R,
                                     int H, int dh, int T, int T_cap, int page);
cudaError_t luna_cuda_cache_write(cudaStream_t s, int bf16, void *C, const void *x,
                                  const int32_t *ind, const int32_t *lens, int R, int H, int dh,
                                  int T, int T_cap, int page);

/* beam_select (core/backend.h "Decoding"; beam_select.cu): a thread per sentence. */
struct luna_beam_select_args;
cudaError_t luna_cuda_beam_select(cudaStream_t s, const struct luna_beam_select_args *a);

/* cross_attention (core/backend.h "Decoding"): m ≤ 8192 (cudaErrorInvalidValue otherwise). */
cudaError_t luna_cuda_cross_attention(cudaStream_t s, int bf16, void *y, const void *q,
                                      const void *K, const void *V, const int32_t *row_slot,
                                      const int32_t *slot_len, int R, int H, int dh, int m,
                                      float alpha);

/* ---- attention.cu: attention_forward/backward for bf16 activations, one block per sentence and
 * head. luna_cuda_attention_fits says whether a shape is taken (n, m, dh ≤ 128 and the block's
 * shared memory within the device's limit); the launchers return cudaErrorInvalidValue for one
 * that is not. ---- */
int luna_cuda_attention_fits(int bf16, int n, int m, int dh, int backward);
cudaError_t luna_cuda_attention_forward(cudaStream_t s, void *o, void *a, void *a_d, const void *q,
                                        const void *k, const void *v,
                                        const luna_attention_shape *shape, float p,
                                        luna_rng_key key);
cudaError_t luna_cuda_attention_backward(cudaStream_t s, void *dq, void *dk, void *dv,
                                         const void *d_o, const void *q, const void *k,
                                         const void *v, const void *a, const void *a_d,
                                         const luna_attention_shape *shape, float p,
                                         luna_rng_key key);

/* ---- causal_contraction.cu (p, q ≤ 256: cudaErrorInvalidValue otherwise) ---- */
cudaError_t luna_cuda_causal_contraction_forward(cudaStream_t s, int bf16, void *out, const void *x,
                                                 const void *a, const void *b, int G, int n, int p,
                                                 int q, float alpha,
                                                 const luna_causal_layout *layout);
cudaError_t luna_cuda_causal_contraction_backward(cudaStream_t s, int bf16, void *dx, void *da,
                                                  void *db, const void *dout, const void *x,
                                                  const void *a, const void *b, int G, int n, int p,
                                                  int q, float alpha,
                                                  const luna_causal_layout *layout);

/* ---- softmax.cu (rows < 2^31: one block per row) ---- */
cudaError_t luna_cuda_softmax_forward(cudaStream_t s, int bf16, void *y, const void *x,
                                      int64_t rows, int cols, const int32_t *valid_cols,
                                      int64_t rows_per_group, int causal_period);

/* ---- fused.cu (rows < 2^31: one block per row for the row kernels). p in [0, 1); p = 0: no
 * dropout. softmax_dropout_forward writes yd only when yd != NULL and p > 0. ---- */
cudaError_t luna_cuda_residual_norm_forward(cudaStream_t s, int bf16, void *y, void *r, float *mean,
                                            float *rstd, const void *sub, const float *bias,
                                            const void *res, const float *gamma, const float *beta,
                                            int64_t rows, int d, float eps, float p,
                                            luna_rng_key key);
cudaError_t luna_cuda_residual_norm_backward(cudaStream_t s, int bf16, void *dres, void *dsub,
                                             float *dbias, float *dgamma, float *dbeta,
                                             const void *dy, const void *r, const float *mean,
                                             const float *rstd, const float *gamma, int64_t rows,
                                             int d, float p, luna_rng_key key,
                                             luna_cuda_colsum_ws ws);
cudaError_t luna_cuda_bias_relu_dropout_forward(cudaStream_t s, int bf16, void *a, void *h,
                                                const float *bias, int64_t rows, int cols, float p,
                                                luna_rng_key key);
cudaError_t luna_cuda_bias_relu_dropout_backward(cudaStream_t s, int bf16, void *dh, float *dbias,
                                                 const void *da, const void *h, int64_t rows,
                                                 int cols, float p, luna_rng_key key,
                                                 luna_cuda_colsum_ws ws);
cudaError_t luna_cuda_softmax_dropout_forward(cudaStream_t s, int bf16, void *y, void *yd,
                                              const void *x, int64_t rows, int cols,
                                              const int32_t *valid_cols, int64_t rows_per_group,
                                              int causal_period, float p, luna_rng_key key);
cudaError_t luna_cuda_softmax_dropout_backward(cudaStream_t s, int bf16, void *dx, const void *dyd,
                                               const void *y, int64_t rows, int cols, float p,
                                               luna_rng_key key);

#ifdef __cplusplus
}
#endif

#endif
