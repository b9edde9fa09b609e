/* Declarations of the CPU kernels (model/kernels/cpu/); backend_cpu.c puts them in its kernel
 * table. Semantics: see the matching entry of struct luna_ops in core/backend.h. The kernels
 * receive arguments checked by core/op_checks.c. */
#ifndef LUNA_CPU_OPS_H
#define LUNA_CPU_OPS_H

#include "core/backend.h"

luna_status luna_cpu_gemm_grid(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                               float alpha, const luna_act *A, int lda, luna_grid_stride sa,
                               const luna_act *B, int ldb, luna_grid_stride sb, float beta,
                               luna_act *C, int ldc, luna_grid_stride sc, int outer, int inner);
luna_status luna_cpu_gemm(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                          float alpha, const luna_act *A, int lda, int64_t stride_a,
                          const luna_act *B, int ldb, int64_t stride_b, float beta, luna_act *C,
                          int ldc, int64_t stride_c, int batch);
luna_status luna_cpu_linear_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                    const float *W, const float *b, int64_t rows, int in, int out);
luna_status luna_cpu_linear_relu_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                         const float *W, const float *b, int64_t rows, int in,
                                         int out);
/* Held weights (held_weights.c): the CPU state behind hold/release_weights, kept in be->impl. */
typedef struct luna_cpu_held luna_cpu_held;
luna_status luna_cpu_hold_weights(luna_backend *be, const float *W, int out, int in,
                                  luna_dtype dtype);
luna_status luna_cpu_release_weights(luna_backend *be, const float *W);
void luna_cpu_held_free(luna_cpu_held *h);
/* dst's holds and held Linears use src's table of held weights from now on (held_table.h: one
 * copy of the packed weights for both, holds counted over both, safe across threads); dst must
 * hold nothing of its own yet. The table lives until the last backend using it is freed. */
luna_status luna_cpu_share_held(luna_backend *dst, luna_backend *src);
/* The weights held in be's table (shared or not) and the bytes of their packed copies. */
void luna_cpu_held_usage(luna_backend *be, int *entries, size_t *bytes);
/* The int8 kernel of this backend's int8 holds (a luna_int8_kernel, held_int8.h): tests and
 * benches choose one; an unavailable one is LUNA_ERR_UNSUPPORTED. */
luna_status luna_cpu_set_int8_kernel(luna_backend *be, int kernel);
int luna_cpu_int8_kernel(luna_backend *be);
/* The kernel of this backend's fp32 holds: AVX-512 where the CPU has it, else AVX2 + FMA (the
 * same chains, bit-identical results); tests and benchmarks choose (an error when the CPU lacks
 * the kernel's instructions). Without AVX2 + FMA fp32 holds keep nothing and the Linear stays on
 * OpenBLAS (luna_cpu_f32_kernel says LUNA_F32_OPENBLAS). Names: "avx2", "avx512", "openblas". */
enum { LUNA_F32_OPENBLAS = -1, LUNA_F32_AVX2 = 0, LUNA_F32_AVX512 = 1 };
luna_status luna_cpu_set_f32_kernel(luna_backend *be, int kernel);
int luna_cpu_f32_kernel(luna_backend *be);
const char *luna_cpu_f32_kernel_name(int kernel);
/* y = x·Wᵀ (+ b) through the held panels of W: LUNA_OK when done; LUNA_ERR_UNSUPPORTED (no error
 * recorded, nothing written) when W is not held with this shape or its fp32 panels find no room,
 * so the caller goes on to OpenBLAS with W; LUNA_ERR_OUT_OF_MEMORY (recorded) when W is held as
 * int8 and the quantized activations find no room — its fp32 values may be gone, so there is no
 * fallback. */
luna_status luna_cpu_held_linear(luna_backend *be, float *y, const float *x, const float *W,
                                 const float *b, int64_t rows, int in, int out);
luna_status luna_cpu_linear_backward(luna_backend *be, luna_act *dx, float *dW, float *db,
                                     const luna_act *dy, const luna_act *x, const float *W,
                                     int64_t rows, int in, int out, bool accumulate_dx);
luna_status luna_cpu_linear_forward_multi(luna_backend *be, luna_act *y, const luna_act *x,
                                          const float *W, const float *b, int64_t stride, int count,
                                          int64_t rows, int in, int out);
luna_status luna_cpu_linear_backward_multi(luna_backend *be, luna_act *dx, float *dW, float *db,
                                           const luna_act *dy, const luna_act *x, const float *W,
                                           int64_t stride, int count, int64_t rows, int in, int out,
                                           bool accumulate_dx);
luna_status luna_cpu_embedding_forward(luna_backend *be, luna_act *out, const float *table,
                                       const int32_t *tokens, int64_t n, int V, int d, float scale,
                                       int padding_idx);
luna_status luna_cpu_embedding_backward(luna_backend *be, float *dtable, const luna_act *dout,
                                        const int32_t *tokens, int64_t n, int V, int d, float scale,
                                        int padding_idx);
luna_status luna_cpu_sinusoidal_table(luna_backend *be, luna_act *out, int first_pos, int npos,
                                      int d);
luna_status luna_cpu_positions_add(luna_backend *be, luna_act *x, const int32_t *tokens, int B,
                                   int n, int d, int padding_idx);
luna_status luna_cpu_softmax_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t rows,
                                     int cols, const int32_t *valid_cols, int64_t rows_per_group,
                                     int causal_period);
luna_status luna_cpu_dropout_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t n,
                                     float p, luna_rng_key key);
luna_status luna_cpu_dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dy, int64_t n,
                                      float p, luna_rng_key key);
luna_status luna_cpu_softplus_ln2_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                          int64_t n);
luna_status luna_cpu_softplus_ln2_backward(luna_backend *be, luna_act *dx, const luna_act *dy,
                                           const luna_act *x, int64_t n);
luna_status luna_cpu_elu_plus_one_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                          int64_t n);
luna_status luna_cpu_elu_plus_one_backward(luna_backend *be, luna_act *dx, const luna_act *dy,
                                           const luna_act *x, int64_t n);
luna_status luna_cpu_causal_contraction_forward(luna_backend *be, luna_act *out, const luna_act *x,
                                                const luna_act *a, const luna_act *b, int G, int n,
                                                int p, int q, float alpha,
                                                const luna_causal_layout *layout);
luna_status luna_cpu_causal_contraction_backward(luna_backend *be, luna_act *dx, luna_act *da,
                                                 luna_act *db, const luna_act *dout,
                                                 const luna_act *x, const luna_act *a,
                                                 const luna_act *b, int G, int n, int p, int q,
                                                 float alpha, const luna_causal_layout *layout);
luna_status luna_cpu_cross_entropy_forward(luna_backend *be, float *loss, float *nll, float *lse,
                                           const luna_act *logits, const int32_t *targets,
                                           int64_t N, int V, float epsilon, int padding_idx);
luna_status luna_cpu_cross_entropy_forward_backward(luna_backend *be, float *loss, float *nll,
                                                    float *lse, luna_act *dlogits,
                                                    const luna_act *logits, const int32_t *targets,
                                                    int64_t N, int V, float epsilon,
                                                    int padding_idx, float grad_scale);
luna_status luna_cpu_loss_sums(luna_backend *be, double *sums, const float *loss, const float *nll,
                               int64_t n);
luna_status luna_cpu_add(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                         int64_t n);
luna_status luna_cpu_axpy(luna_backend *be, luna_act *y, float alpha, const float *x, int64_t n);
luna_status luna_cpu_scale_act(luna_backend *be, luna_act *x, float alpha, int64_t n);
luna_status luna_cpu_split_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                                 int H, int dh);
luna_status luna_cpu_merge_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                                 int H, int dh);
luna_status luna_cpu_broadcast_rows(luna_backend *be, luna_act *out, const luna_act *x, int B,
                                    int64_t rows, int d);
luna_status luna_cpu_sum_broadcast(luna_backend *be, float *dx, const luna_act *dout, int B,
                                   int64_t rows, int d);

luna_status luna_cpu_gather_rows_in_groups(luna_backend *be, luna_act *buf, int64_t stride,
                                           const int32_t *idx, int64_t n_groups, int group,
                                           int64_t cols);
luna_status luna_cpu_index_rows_update(luna_backend *be, int32_t *dst, const int32_t *src,
                                       const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                       const int32_t *set_col, const int32_t *set_val);
luna_status luna_cpu_gather_rows(luna_backend *be, luna_act *dst, int64_t dst_stride,
                                 const luna_act *src, int64_t src_stride, const int32_t *idx,
                                 int64_t n, int64_t cols);
/* Σ_j exp(x_j − mx) in double over a row without NaN (mx its maximum), each term
 * luna_exp_nonpositive: lane l sums the j ≡ l (mod 4) in order, lane 0 then the last V mod 4, the
 * lanes added as (0 + 1) + (2 + 3); with AVX2 four lanes at once, with AVX-512 eight terms per
 * vector of exps, the same bits (log_softmax_topk's lse, and the CUDA kernel's). kernel: the
 * widest vectors to use, a LUNA_F32_* (log_softmax_topk uses its backend's fp32 kernel); the CPU
 * must have them, else the next narrower ones run. */
double luna_cpu_sum_exp(const float *x, int V, float mx, int kernel);
luna_status luna_cpu_log_softmax_topk(luna_backend *be, const luna_act *logits, const float *bias,
                                      int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                      const int32_t *pick, float *picked);
luna_status luna_cpu_causal_step_products(luna_backend *be, luna_act *y, const luna_act *x,
                                          const luna_act *S, const int32_t *t, int t_all, int R,
                                          int H, int K, int N);
luna_status luna_cpu_cache_products(luna_backend *be, bool values, luna_act *y, const luna_act *x,
                                    const luna_act *C, const int32_t *ind, const int32_t *lens,
                                    int R, int H, int dh, int T, int T_cap, int page);
luna_status luna_cpu_cross_attention(luna_backend *be, luna_act *y, const luna_act *q,
                                     const luna_act *K, const luna_act *V, const int32_t *row_slot,
                                     const int32_t *slot_len, int R, int H, int dh, int m,
                                     float alpha);
/* beam_select: core/beam_select.h's step for each sentence in turn. */
luna_status luna_cpu_beam_select(luna_backend *be, const struct luna_beam_select_args *a);
luna_status luna_cpu_cache_write(luna_backend *be, luna_act *C, const luna_act *x,
                                 const int32_t *ind, const int32_t *lens, int R, int H, int dh,
                                 int T, int T_cap, int page);

luna_status luna_cpu_multi_sum_squares(luna_backend *be, float *result, const float *x,
                                       const luna_tensor_table *tt);
luna_status luna_cpu_clip_coefficients(luna_backend *be, float *coef, double *summary,
                                       const float *sumsq, int n, double clip_norm, int mode,
                                       const double *also_finite, int num_also);
luna_status luna_cpu_multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                                 const float *coef, float alpha);
luna_status luna_cpu_multi_apollo_update(luna_backend *be, float *theta, const float *g,
                                         float *exp_avg, float *approx_hessian, float *update,
                                         const luna_tensor_table *tt, int64_t *steps,
                                         const double *gate, double lr, double beta, double eps,
                                         double sigma, int rebound, double weight_decay,
                                         int wd_type);
luna_status luna_cpu_multi_adam_update(luna_backend *be, float *theta, const float *g,
                                       float *exp_avg, float *exp_avg_sq,
                                       const luna_tensor_table *tt, int64_t *steps,
                                       const double *gate, double lr, double beta1, double beta2,
                                       double eps, double weight_decay);

/* ---- shared by the kernels ------------------------------------------------------------------
 * Work below which a loop runs on one thread (a parallel region costs more than it saves): an
 * elementwise loop's elements, a row kernel's rows × cols. They decide who computes what, never a
 * result. */
#define LUNA_CPU_PAR_ELEMENTS 65536
#define LUNA_CPU_PAR_ROWS_WORK 32768
/* Columns owned by one thread in the column sums (bias, LayerNorm and embedding gradients):
 * about cols/threads, in [16, LUNA_CPU_COL_TILE_MAX] (≥ 16 floats: a cache line, no false
 * sharing). Only the work split depends on it. */
#define LUNA_CPU_COL_TILE_MAX 64
static inline int luna_cpu_col_tile(int cols, int threads) {
    int t = (cols + threads - 1) / (threads > 0 ? threads : 1);
    t = (t + 15) / 16 * 16;
    return t < 16 ? 16 : (t > LUNA_CPU_COL_TILE_MAX ? LUNA_CPU_COL_TILE_MAX : t);
}
/* db [cols] += Σ_r dy [r, cols] (linear_backward's bias gradient, the fused ops' dbias). */
void luna_cpu_bias_grad(luna_backend *be, float *db, const float *dy, int64_t rows, int cols);

/* Row kernels shared by softmax_forward and the fused ops (fused.c). */
void luna_cpu_layer_norm_row(float *yr, float *mean, float *rstd, const float *xr,
                             const float *gamma, const float *beta, int d, float eps);
void luna_cpu_layer_norm_row_backward(float *dxr, const float *dyr, const float *xr, float mean,
                                      float rstd, const float *gamma, int d);
void luna_cpu_layer_norm_params(luna_backend *be, float *dgamma, float *dbeta, const float *dy,
                                const float *x, const float *mean, const float *rstd, int64_t rows,
                                int d);
int luna_cpu_softmax_valid(int64_t r, int cols, const int32_t *valid_cols, int64_t rows_per_group,
                           int causal_period);
void luna_cpu_softmax_row(float *yr, const float *xr, int cols, int valid);
void luna_cpu_softmax_row_backward(float *dxr, const float *dyr, const float *yr, int cols);
/* Dropout multipliers of elements i0 .. i0 + m − 1 (m ≤ LUNA_CPU_DROPOUT_RUN): mult[j] =
 * keep(i0 + j) ? 1/(1 − p) : 0, the factor dropout_forward applies (p in (0, 1)). */
#define LUNA_CPU_DROPOUT_RUN 512
void luna_cpu_dropout_mults(luna_rng_key key, int64_t i0, int m, float p, float *mult);
luna_status luna_cpu_residual_norm_forward(luna_backend *be, luna_act *y, luna_act *r, float *mean,
                                           float *rstd, const luna_act *sub, const float *bias,
                                           const luna_act *res, const float *gamma,
                                           const float *beta, int64_t rows, int d, float eps,
                                           float p, luna_rng_key key);
luna_status luna_cpu_residual_norm_backward(luna_backend *be, luna_act *dres, luna_act *dsub,
                                            float *dbias, float *dgamma, float *dbeta,
                                            const luna_act *dy, const luna_act *r,
                                            const float *mean, const float *rstd,
                                            const float *gamma, int64_t rows, int d, float p,
                                            luna_rng_key key);
luna_status luna_cpu_bias_relu_dropout_forward(luna_backend *be, luna_act *a, luna_act *h,
                                               const float *bias, int64_t rows, int cols, float p,
                                               luna_rng_key key);
luna_status luna_cpu_bias_relu_dropout_backward(luna_backend *be, luna_act *dh, float *dbias,
                                                const luna_act *da, const luna_act *h, int64_t rows,
                                                int cols, float p, luna_rng_key key);
luna_status luna_cpu_softmax_dropout_forward(luna_backend *be, luna_act *y, luna_act *yd,
                                             const luna_act *x, int64_t rows, int cols,
                                             const int32_t *valid_cols, int64_t rows_per_group,
                                             int causal_period, float p, luna_rng_key key);
luna_status luna_cpu_softmax_dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dyd,
                                              const luna_act *y, int64_t rows, int cols, float p,
                                              luna_rng_key key);

#endif
