/* The dispatch layer of the backend boundary (core/backend.h): be->ops is this table, whose
 * entries check an op's arguments once, for every backend, and forward the call unchanged to the
 * backend's own table (be->kernels). A backend's kernels therefore receive checked arguments and
 * check nothing but what only they can see: the contents of their memory (token ids, via
 * luna_op_check_ids / luna_op_bad_id) and their own state (held weights) or limits.
 *
 * Every failure is LUNA_ERR_INVALID_ARGUMENT with one line "<op>: <problem>". Sizes are checked
 * first; pointers only where the op has work to do (an empty op may pass NULL). */
#include <limits.h>
#include <string.h>

#include "core/backend.h"
#include "core/beam_select.h"
#include "core/tensor_table.h"

#define BAD(...) return luna_error(LUNA_ERR_INVALID_ARGUMENT, __VA_ARGS__)
#define P_OK(p) ((p) >= 0.0f && (p) < 1.0f) /* a dropout probability; false for NaN */

static int imax(int a, int b) { return a > b ? a : b; }

/* ---- shared checks ----------------------------------------------------------------------------
 */

/* The leading dimensions and pointers of a (grid of) GEMM(s); sizes already non-negative. */
static luna_status check_gemm(const char *op, bool ta, bool tb, int M, int N, int K,
                              const luna_act *A, int lda, const luna_act *B, int ldb,
                              const luna_act *C, int ldc, int64_t batch) {
    const int a_cols = ta ? M : K, b_cols = tb ? K : N;
    if (lda < imax(1, a_cols) || ldb < imax(1, b_cols) || ldc < imax(1, N))
        BAD("%s: leading dimension too small (lda %d < %d, ldb %d < %d or ldc %d < %d; trans_a "
            "%d, trans_b %d, M %d, N %d, K %d)",
            op, lda, imax(1, a_cols), ldb, imax(1, b_cols), ldc, imax(1, N), ta, tb, M, N, K);
    if (batch == 0 || M == 0 || N == 0) return LUNA_OK;
    if (!C || (K > 0 && (!A || !B))) BAD("%s: null matrix pointer", op);
    return LUNA_OK;
}

static luna_status check_linear(const char *op, int64_t rows, int in, int out) {
    if (rows < 0 || in < 0 || out < 0)
        BAD("%s: negative size (rows %lld, in %d, out %d)", op, (long long)rows, in, out);
    if (rows > INT_MAX)
        BAD("%s: %lld rows exceed the BLAS int range; split the batch", op, (long long)rows);
    return LUNA_OK;
}

/* rows × cols with a dropout probability (the fused ops). */
static luna_status check_rows(const char *op, int64_t rows, int cols, float p) {
    if (rows < 0 || cols < 0)
        BAD("%s: negative size (rows %lld, cols %d)", op, (long long)rows, cols);
    if (!P_OK(p)) BAD("%s: p = %g must be in [0, 1)", op, (double)p);
    return LUNA_OK;
}

/* n elements, every pointer non-NULL when n > 0 (`ok`). */
static luna_status check_n(const char *op, int64_t n, bool ok) {
    if (n < 0 || (n > 0 && !ok))
        BAD("%s: null pointer or negative size (n=%lld)", op, (long long)n);
    return LUNA_OK;
}

static luna_status check_groups(const char *op, const int32_t *valid_cols, int64_t rows_per_group) {
    if (valid_cols && rows_per_group <= 0)
        BAD("%s: rows_per_group %lld must be positive with valid_cols", op,
            (long long)rows_per_group);
    return LUNA_OK;
}

static luna_status check_causal(const char *op, int G, int n, int p, int q,
                                const luna_causal_layout *layout) {
    if (G < 0 || n < 0 || p < 0 || q < 0)
        BAD("%s: negative size (G=%d n=%d p=%d q=%d)", op, G, n, p, q);
    if (layout && (layout->H < 1 || layout->p_ld < p || layout->q_ld < q))
        BAD("%s: bad layout (H %d, row strides %d, %d for rows of %d, %d)", op, layout->H,
            layout->p_ld, layout->q_ld, p, q);
    return LUNA_OK;
}

/* Cross entropy's shape, smoothing and pointers (targets are the backend's to check). */
static luna_status check_ce(const char *op, int64_t N, int V, float epsilon, bool ok) {
    if (N < 0 || V <= 0) BAD("%s: bad shape (N=%lld, V=%d)", op, (long long)N, V);
    if (!(epsilon >= 0.0f && epsilon <= 1.0f))
        BAD("%s: label smoothing %g not in [0, 1]", op, (double)epsilon);
    if (N > 0 && !ok) BAD("%s: null pointer", op);
    return LUNA_OK;
}

static luna_status check_heads(const char *op, const luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh) {
    if (B < 0 || n < 0 || H < 0 || dh < 0)
        BAD("%s: negative size (B=%d n=%d H=%d dh=%d)", op, B, n, H, dh);
    if ((int64_t)B * n * H * dh > 0 && (!out || !x)) BAD("%s: null pointer", op);
    return LUNA_OK;
}

static luna_status check_broadcast(const char *op, const void *out, const void *x, int B,
                                   int64_t rows, int d) {
    if (B < 0 || rows < 0 || d < 0)
        BAD("%s: negative size (B %d, rows %lld, d %d)", op, B, (long long)rows, d);
    if ((int64_t)B * rows * d > 0 && (!out || !x)) BAD("%s: null pointer", op);
    return LUNA_OK;
}

/* The table, and the buffers of its elements present when it has any (`ok`). */
static luna_status check_table(const char *op, const luna_tensor_table *tt, bool ok) {
    if (!tt || (tt->num_elements > 0 && !ok)) BAD("%s: null pointer", op);
    return LUNA_OK;
}

/* ---- GEMM and linear ---------------------------------------------------------------------------
 */
static luna_status gemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                        const luna_act *A, int lda, int64_t sa, const luna_act *B, int ldb,
                        int64_t sb, float beta, luna_act *C, int ldc, int64_t sc, int batch) {
    if (M < 0 || N < 0 || K < 0 || batch < 0)
        BAD("gemm: negative size (M %d, N %d, K %d, batch %d)", M, N, K, batch);
    LUNA_TRY(check_gemm("gemm", ta, tb, M, N, K, A, lda, B, ldb, C, ldc, batch));
    return be->kernels->gemm(be, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                             batch);
}
static luna_status gemm_grid(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                             const luna_act *A, int lda, luna_grid_stride sa, const luna_act *B,
                             int ldb, luna_grid_stride sb, float beta, luna_act *C, int ldc,
                             luna_grid_stride sc, int outer, int inner) {
    if (M < 0 || N < 0 || K < 0 || outer < 0 || inner < 0)
        BAD("gemm_grid: negative size (M %d, N %d, K %d, outer %d, inner %d)", M, N, K, outer,
            inner);
    LUNA_TRY(
        check_gemm("gemm_grid", ta, tb, M, N, K, A, lda, B, ldb, C, ldc, (int64_t)outer * inner));
    return be->kernels->gemm_grid(be, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc,
                                  sc, outer, inner);
}
static luna_status linear_forward(luna_backend *be, luna_act *y, const luna_act *x, const float *W,
                                  const float *b, int64_t rows, int in, int out) {
    LUNA_TRY(check_linear("linear_forward", rows, in, out));
    return be->kernels->linear_forward(be, y, x, W, b, rows, in, out);
}
static luna_status linear_relu_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                       const float *W, const float *b, int64_t rows, int in,
                                       int out) {
    LUNA_TRY(check_linear("linear_relu_forward", rows, in, out));
    return be->kernels->linear_relu_forward(be, y, x, W, b, rows, in, out);
}
static luna_status linear_backward(luna_backend *be, luna_act *dx, float *dW, float *db,
                                   const luna_act *dy, const luna_act *x, const float *W,
                                   int64_t rows, int in, int out, bool accumulate_dx) {
    LUNA_TRY(check_linear("linear_backward", rows, in, out));
    return be->kernels->linear_backward(be, dx, dW, db, dy, x, W, rows, in, out, accumulate_dx);
}

/* count ≥ 1 projections whose weights (and biases, and gradients) do not overlap. */
static luna_status check_multi(const char *op, int64_t stride, int count, int64_t rows, int in,
                               int out) {
    LUNA_TRY(check_linear(op, rows, in, out));
    if (count < 1) BAD("%s: count %d must be positive", op, count);
    if (count > 1 && stride < (int64_t)out * (in > 0 ? in : 1))
        BAD("%s: stride %lld is less than a weight (%d x %d)", op, (long long)stride, out, in);
    return LUNA_OK;
}
static luna_status linear_forward_multi(luna_backend *be, luna_act *y, const luna_act *x,
                                        const float *W, const float *b, int64_t stride, int count,
                                        int64_t rows, int in, int out) {
    LUNA_TRY(check_multi("linear_forward_multi", stride, count, rows, in, out));
    return be->kernels->linear_forward_multi(be, y, x, W, b, stride, count, rows, in, out);
}
static luna_status linear_backward_multi(luna_backend *be, luna_act *dx, float *dW, float *db,
                                         const luna_act *dy, const luna_act *x, const float *W,
                                         int64_t stride, int count, int64_t rows, int in, int out,
                                         bool accumulate_dx) {
    LUNA_TRY(check_multi("linear_backward_multi", stride, count, rows, in, out));
    return be->kernels->linear_backward_multi(be, dx, dW, db, dy, x, W, stride, count, rows, in,
                                              out, accumulate_dx);
}

/* ---- fused training ops ------------------------------------------------------------------------
 */
static luna_status residual_norm_forward(luna_backend *be, luna_act *y, luna_act *r, float *mean,
                                         float *rstd, const luna_act *sub, const float *bias,
                                         const luna_act *res, const float *gamma, const float *beta,
                                         int64_t rows, int d, float eps, float p,
                                         luna_rng_key key) {
    LUNA_TRY(check_rows("residual_norm_forward", rows, d, p));
    if (d == 0) BAD("residual_norm_forward: d must be positive (rows %lld)", (long long)rows);
    return be->kernels->residual_norm_forward(be, y, r, mean, rstd, sub, bias, res, gamma, beta,
                                              rows, d, eps, p, key);
}
static luna_status residual_norm_backward(luna_backend *be, luna_act *dres, luna_act *dsub,
                                          float *dbias, float *dgamma, float *dbeta,
                                          const luna_act *dy, const luna_act *r, const float *mean,
                                          const float *rstd, const float *gamma, int64_t rows,
                                          int d, float p, luna_rng_key key) {
    LUNA_TRY(check_rows("residual_norm_backward", rows, d, p));
    if (d == 0) BAD("residual_norm_backward: d must be positive (rows %lld)", (long long)rows);
    return be->kernels->residual_norm_backward(be, dres, dsub, dbias, dgamma, dbeta, dy, r, mean,
                                               rstd, gamma, rows, d, p, key);
}
static luna_status bias_relu_dropout_forward(luna_backend *be, luna_act *a, luna_act *h,
                                             const float *bias, int64_t rows, int cols, float p,
                                             luna_rng_key key) {
    LUNA_TRY(check_rows("bias_relu_dropout_forward", rows, cols, p));
    return be->kernels->bias_relu_dropout_forward(be, a, h, bias, rows, cols, p, key);
}
static luna_status bias_relu_dropout_backward(luna_backend *be, luna_act *dh, float *dbias,
                                              const luna_act *da, const luna_act *h, int64_t rows,
                                              int cols, float p, luna_rng_key key) {
    LUNA_TRY(check_rows("bias_relu_dropout_backward", rows, cols, p));
    return be->kernels->bias_relu_dropout_backward(be, dh, dbias, da, h, rows, cols, p, key);
}
static luna_status softmax_dropout_forward(luna_backend *be, luna_act *y, luna_act *yd,
                                           const luna_act *x, int64_t rows, int cols,
                                           const int32_t *valid_cols, int64_t rows_per_group,
                                           int causal_period, float p, luna_rng_key key) {
    LUNA_TRY(check_rows("softmax_dropout_forward", rows, cols, p));
    LUNA_TRY(check_groups("softmax_dropout_forward", valid_cols, rows_per_group));
    return be->kernels->softmax_dropout_forward(be, y, yd, x, rows, cols, valid_cols,
                                                rows_per_group, causal_period, p, key);
}
static luna_status softmax_dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dyd,
                                            const luna_act *y, int64_t rows, int cols, float p,
                                            luna_rng_key key) {
    LUNA_TRY(check_rows("softmax_dropout_backward", rows, cols, p));
    return be->kernels->softmax_dropout_backward(be, dx, dyd, y, rows, cols, p, key);
}
static luna_status cross_entropy_forward(luna_backend *be, float *loss, float *nll, float *lse,
                                         const luna_act *logits, const int32_t *targets, int64_t N,
                                         int V, float epsilon, int padding_idx) {
    LUNA_TRY(
        check_ce("cross_entropy_forward", N, V, epsilon, loss && nll && lse && logits && targets));
    return be->kernels->cross_entropy_forward(be, loss, nll, lse, logits, targets, N, V, epsilon,
                                              padding_idx);
}
static luna_status cross_entropy_forward_backward(luna_backend *be, float *loss, float *nll,
                                                  float *lse, luna_act *dlogits,
                                                  const luna_act *logits, const int32_t *targets,
                                                  int64_t N, int V, float epsilon, int padding_idx,
                                                  float grad_scale) {
    LUNA_TRY(check_ce("cross_entropy_forward_backward", N, V, epsilon,
                      loss && nll && lse && dlogits && logits && targets));
    return be->kernels->cross_entropy_forward_backward(be, loss, nll, lse, dlogits, logits, targets,
                                                       N, V, epsilon, padding_idx, grad_scale);
}
static luna_status loss_sums(luna_backend *be, double *sums, const float *loss, const float *nll,
                             int64_t n) {
    if (n < 0 || !sums || (n > 0 && (!loss || !nll)))
        BAD("loss_sums: bad arguments (n %lld)", (long long)n);
    return be->kernels->loss_sums(be, sums, loss, nll, n);
}

/* ---- attention: softmax and the causal contraction ---------------------------------------------
 */
static luna_status softmax_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t rows,
                                   int cols, const int32_t *valid_cols, int64_t rows_per_group,
                                   int causal_period) {
    if (rows < 0 || cols < 0)
        BAD("softmax_forward: negative size (rows %lld, cols %d)", (long long)rows, cols);
    LUNA_TRY(check_groups("softmax_forward", valid_cols, rows_per_group));
    return be->kernels->softmax_forward(be, y, x, rows, cols, valid_cols, rows_per_group,
                                        causal_period);
}
/* The attention shape: sizes, leading dimensions at least dh wide, causal only when n == m. */
static luna_status check_attention(const char *op, const luna_attention_shape *s, float p) {
    if (!s) BAD("%s: no shape", op);
    if (s->B < 0 || s->H < 0 || s->n < 0 || s->m < 0 || s->dh < 0)
        BAD("%s: negative size (B %d, H %d, n %d, m %d, dh %d)", op, s->B, s->H, s->n, s->m, s->dh);
    if (s->ldq < imax(1, s->dh) || s->ldk < imax(1, s->dh) || s->ldv < imax(1, s->dh) ||
        s->ldo < imax(1, s->dh))
        BAD("%s: a leading dimension is below dh %d (q %d, k %d, v %d, o %d)", op, s->dh, s->ldq,
            s->ldk, s->ldv, s->ldo);
    if (s->causal && s->n != s->m)
        BAD("%s: causal attention needs n == m (%d, %d)", op, s->n, s->m);
    if (!P_OK(p)) BAD("%s: p = %g must be in [0, 1)", op, (double)p);
    return LUNA_OK;
}
static bool attention_empty(const luna_attention_shape *s) {
    return s->B == 0 || s->H == 0 || s->n == 0 || s->m == 0;
}

static luna_status attention_forward(luna_backend *be, luna_act *o, luna_act *a, luna_act *a_d,
                                     const luna_act *q, const luna_act *k, const luna_act *v,
                                     const luna_attention_shape *s, float p, luna_rng_key key) {
    LUNA_TRY(check_attention("attention_forward", s, p));
    if (attention_empty(s)) return LUNA_OK;
    if (!o || !a || (s->dh > 0 && (!q || !k || !v)) || (p > 0.0f && !a_d))
        BAD("attention_forward: null pointer (a_d is needed when p > 0)");
    if (a_d == a) BAD("attention_forward: a_d must not be a's buffer");
    return be->kernels->attention_forward(be, o, a, a_d, q, k, v, s, p, key);
}
static luna_status attention_backward(luna_backend *be, luna_act *dq, luna_act *dk, luna_act *dv,
                                      luna_act *ds, const luna_act *d_o, const luna_act *q,
                                      const luna_act *k, const luna_act *v, const luna_act *a,
                                      const luna_act *a_d, const luna_attention_shape *s, float p,
                                      luna_rng_key key) {
    LUNA_TRY(check_attention("attention_backward", s, p));
    if (attention_empty(s)) return LUNA_OK;
    if (!dq || !dk || !dv || !ds || !d_o || !q || !k || !v || !a || (p > 0.0f && !a_d))
        BAD("attention_backward: null pointer (a_d is needed when p > 0)");
    return be->kernels->attention_backward(be, dq, dk, dv, ds, d_o, q, k, v, a, a_d, s, p, key);
}

static luna_status causal_contraction_forward(luna_backend *be, luna_act *out, const luna_act *x,
                                              const luna_act *a, const luna_act *b, int G, int n,
                                              int p, int q, float alpha,
                                              const luna_causal_layout *layout) {
    LUNA_TRY(check_causal("causal_contraction_forward", G, n, p, q, layout));
    if ((int64_t)G * n * q > 0 && (!out || (p > 0 && (!x || !a || !b))))
        BAD("causal_contraction_forward: null pointer");
    return be->kernels->causal_contraction_forward(be, out, x, a, b, G, n, p, q, alpha, layout);
}
static luna_status causal_contraction_backward(luna_backend *be, luna_act *dx, luna_act *da,
                                               luna_act *db, const luna_act *dout,
                                               const luna_act *x, const luna_act *a,
                                               const luna_act *b, int G, int n, int p, int q,
                                               float alpha, const luna_causal_layout *layout) {
    LUNA_TRY(check_causal("causal_contraction_backward", G, n, p, q, layout));
    if ((int64_t)G * n * (p + q) > 0 && (!dx || !da || !db || !dout || !x || !a || !b))
        BAD("causal_contraction_backward: null pointer");
    return be->kernels->causal_contraction_backward(be, dx, da, db, dout, x, a, b, G, n, p, q,
                                                    alpha, layout);
}

/* ---- embeddings and positions ------------------------------------------------------------------
 */
static luna_status embedding_forward(luna_backend *be, luna_act *out, const float *table,
                                     const int32_t *tokens, int64_t n, int V, int d, float scale,
                                     int padding_idx) {
    if (n < 0 || V < 0 || d < 0)
        BAD("embedding_forward: negative size (n %lld, V %d, d %d)", (long long)n, V, d);
    return be->kernels->embedding_forward(be, out, table, tokens, n, V, d, scale, padding_idx);
}
static luna_status embedding_backward(luna_backend *be, float *dtable, const luna_act *dout,
                                      const int32_t *tokens, int64_t n, int V, int d, float scale,
                                      int padding_idx) {
    if (n < 0 || V < 0 || d < 0)
        BAD("embedding_backward: negative size (n %lld, V %d, d %d)", (long long)n, V, d);
    return be->kernels->embedding_backward(be, dtable, dout, tokens, n, V, d, scale, padding_idx);
}
static luna_status sinusoidal_table(luna_backend *be, luna_act *out, int first_pos, int npos,
                                    int d) {
    if (npos < 0 || d < 0) BAD("sinusoidal_table: negative size (npos %d, d %d)", npos, d);
    return be->kernels->sinusoidal_table(be, out, first_pos, npos, d);
}
static luna_status positions_add(luna_backend *be, luna_act *x, const int32_t *tokens, int B, int n,
                                 int d, int padding_idx) {
    if (B < 0 || n < 0 || d < 0) BAD("positions_add: negative size (B %d, n %d, d %d)", B, n, d);
    return be->kernels->positions_add(be, x, tokens, B, n, d, padding_idx);
}

/* ---- elementwise, activations and layout -------------------------------------------------------
 */
static luna_status dropout_forward(luna_backend *be, luna_act *y, const luna_act *x, int64_t n,
                                   float p, luna_rng_key key) {
    if (!P_OK(p)) BAD("dropout_forward: p = %g must be in [0, 1)", (double)p);
    LUNA_TRY(check_n("dropout_forward", n, y && x));
    return be->kernels->dropout_forward(be, y, x, n, p, key);
}
static luna_status dropout_backward(luna_backend *be, luna_act *dx, const luna_act *dy, int64_t n,
                                    float p, luna_rng_key key) {
    if (!P_OK(p)) BAD("dropout_backward: p = %g must be in [0, 1)", (double)p);
    LUNA_TRY(check_n("dropout_backward", n, dx && dy));
    return be->kernels->dropout_backward(be, dx, dy, n, p, key);
}
static luna_status softplus_ln2_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                        int64_t n) {
    LUNA_TRY(check_n("softplus_ln2_forward", n, y && x));
    return be->kernels->softplus_ln2_forward(be, y, x, n);
}
static luna_status softplus_ln2_backward(luna_backend *be, luna_act *dx, const luna_act *dy,
                                         const luna_act *x, int64_t n) {
    LUNA_TRY(check_n("softplus_ln2_backward", n, dx && dy && x));
    return be->kernels->softplus_ln2_backward(be, dx, dy, x, n);
}
static luna_status elu_plus_one_forward(luna_backend *be, luna_act *y, const luna_act *x,
                                        int64_t n) {
    LUNA_TRY(check_n("elu_plus_one_forward", n, y && x));
    return be->kernels->elu_plus_one_forward(be, y, x, n);
}
static luna_status elu_plus_one_backward(luna_backend *be, luna_act *dx, const luna_act *dy,
                                         const luna_act *x, int64_t n) {
    LUNA_TRY(check_n("elu_plus_one_backward", n, dx && dy && x));
    return be->kernels->elu_plus_one_backward(be, dx, dy, x, n);
}
static luna_status add(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                       int64_t n) {
    LUNA_TRY(check_n("add", n, y && a && b));
    return be->kernels->add(be, y, a, b, n);
}
static luna_status axpy(luna_backend *be, luna_act *y, float alpha, const float *x, int64_t n) {
    LUNA_TRY(check_n("axpy", n, y && x));
    return be->kernels->axpy(be, y, alpha, x, n);
}
static luna_status scale_act(luna_backend *be, luna_act *x, float alpha, int64_t n) {
    LUNA_TRY(check_n("scale_act", n, x));
    return be->kernels->scale_act(be, x, alpha, n);
}
static luna_status split_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh) {
    LUNA_TRY(check_heads("split_heads", out, x, B, n, H, dh));
    return be->kernels->split_heads(be, out, x, B, n, H, dh);
}
static luna_status merge_heads(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh) {
    LUNA_TRY(check_heads("merge_heads", out, x, B, n, H, dh));
    return be->kernels->merge_heads(be, out, x, B, n, H, dh);
}
static luna_status broadcast_rows(luna_backend *be, luna_act *out, const luna_act *x, int B,
                                  int64_t rows, int d) {
    LUNA_TRY(check_broadcast("broadcast_rows", out, x, B, rows, d));
    return be->kernels->broadcast_rows(be, out, x, B, rows, d);
}
static luna_status sum_broadcast(luna_backend *be, float *dx, const luna_act *dout, int B,
                                 int64_t rows, int d) {
    LUNA_TRY(check_broadcast("sum_broadcast", dx, dout, B, rows, d));
    return be->kernels->sum_broadcast(be, dx, dout, B, rows, d);
}

/* ---- optimizer: clipping and the updates over a tensor table -----------------------------------
 */
static luna_status check_apollo(const char *op, double beta, double eps, double sigma, int rebound,
                                int wd_type) {
    if ((rebound != 0 && rebound != 1) || wd_type < 0 || wd_type > 2 ||
        !(beta >= 0.0 && beta < 1.0) || !(eps > 0.0) || !(sigma > 0.0))
        BAD("%s: bad hyperparameters (beta %g, eps %g, sigma %g, rebound %d, weight decay type "
            "%d)",
            op, beta, eps, sigma, rebound, wd_type);
    return LUNA_OK;
}
static luna_status multi_sum_squares(luna_backend *be, float *result, const float *x,
                                     const luna_tensor_table *tt) {
    LUNA_TRY(check_table("multi_sum_squares", tt, x));
    if (tt->num_tensors > 0 && !result) BAD("multi_sum_squares: null pointer");
    return be->kernels->multi_sum_squares(be, result, x, tt);
}
static luna_status clip_coefficients(luna_backend *be, float *coef, double *summary,
                                     const float *sumsq, int n, double clip_norm, int mode,
                                     const double *also_finite, int num_also) {
    if (!summary || n < 0 || (n > 0 && (!coef || !sumsq)) || !(clip_norm >= 0.0) ||
        (mode != 0 && mode != 1) || num_also < 0 || (num_also > 0 && !also_finite))
        BAD("clip_coefficients: bad arguments (n %d, clip_norm %g, mode %d, num_also %d)", n,
            clip_norm, mode, num_also);
    return be->kernels->clip_coefficients(be, coef, summary, sumsq, n, clip_norm, mode, also_finite,
                                          num_also);
}
static luna_status multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                               const float *coef, float alpha) {
    LUNA_TRY(check_table("multi_scale", tt, x));
    return be->kernels->multi_scale(be, x, tt, coef, alpha);
}
static luna_status multi_apollo_update(luna_backend *be, float *theta, const float *g,
                                       float *exp_avg, float *approx_hessian, float *update,
                                       const luna_tensor_table *tt, int64_t *steps,
                                       const double *gate, double lr, double beta, double eps,
                                       double sigma, int rebound, double weight_decay,
                                       int wd_type) {
    LUNA_TRY(
        check_table("multi_apollo_update", tt, theta && g && exp_avg && approx_hessian && update));
    if (tt->num_tensors > 0 && !steps) BAD("multi_apollo_update: null pointer");
    LUNA_TRY(check_apollo("multi_apollo_update", beta, eps, sigma, rebound, wd_type));
    return be->kernels->multi_apollo_update(be, theta, g, exp_avg, approx_hessian, update, tt,
                                            steps, gate, lr, beta, eps, sigma, rebound,
                                            weight_decay, wd_type);
}
static luna_status multi_adam_update(luna_backend *be, float *theta, const float *g, float *exp_avg,
                                     float *exp_avg_sq, const luna_tensor_table *tt, int64_t *steps,
                                     const double *gate, double lr, double beta1, double beta2,
                                     double eps, double weight_decay) {
    LUNA_TRY(check_table("multi_adam_update", tt, theta && g && exp_avg && exp_avg_sq));
    if (tt->num_tensors > 0 && !steps) BAD("multi_adam_update: null pointer");
    if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0) || !(eps > 0.0))
        BAD("multi_adam_update: bad hyperparameters (betas %g %g, eps %g)", beta1, beta2, eps);
    return be->kernels->multi_adam_update(be, theta, g, exp_avg, exp_avg_sq, tt, steps, gate, lr,
                                          beta1, beta2, eps, weight_decay);
}

/* ---- decoding ----------------------------------------------------------------------------------
 */
static luna_status gather_rows(luna_backend *be, luna_act *dst, int64_t dst_stride,
                               const luna_act *src, int64_t src_stride, const int32_t *idx,
                               int64_t n, int64_t cols) {
    if (n < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
        BAD("gather_rows: bad sizes (n %lld, cols %lld, strides %lld, %lld)", (long long)n,
            (long long)cols, (long long)dst_stride, (long long)src_stride);
    if (n > 0 && cols > 0 && (!dst || !src)) BAD("gather_rows: null pointer");
    return be->kernels->gather_rows(be, dst, dst_stride, src, src_stride, idx, n, cols);
}
static luna_status gather_rows_in_groups(luna_backend *be, luna_act *buf, int64_t stride,
                                         const int32_t *idx, int64_t n_groups, int group,
                                         int64_t cols) {
    if (n_groups < 0 || group < 1 || group > 32 || cols < 0 || stride < cols)
        BAD("gather_rows_in_groups: bad sizes (groups %lld of %d, cols %lld, stride %lld)",
            (long long)n_groups, group, (long long)cols, (long long)stride);
    if (n_groups > 0 && cols > 0 && (!buf || !idx)) BAD("gather_rows_in_groups: null pointer");
    return be->kernels->gather_rows_in_groups(be, buf, stride, idx, n_groups, group, cols);
}
static luna_status index_rows_update(luna_backend *be, int32_t *dst, const int32_t *src,
                                     const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                     const int32_t *set_col, const int32_t *set_val) {
    if (n < 0 || cols < 0 || stride < cols || stride < 1)
        BAD("index_rows_update: bad sizes (n %lld, cols %lld, stride %lld)", (long long)n,
            (long long)cols, (long long)stride);
    if (n > 0 && (!dst || (cols > 0 && !src) || (set_col && !set_val)))
        BAD("index_rows_update: null pointer");
    if (n > 0 && cols > 0 && dst == src && idx)
        BAD("index_rows_update: a gather in place (dst == src with an index)");
    return be->kernels->index_rows_update(be, dst, src, idx, n, cols, stride, set_col, set_val);
}
static luna_status log_softmax_topk(luna_backend *be, const luna_act *logits, const float *bias,
                                    int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                    const int32_t *pick, float *picked) {
    if (rows < 0 || V < 1 || k < 0 || k > V)
        BAD("log_softmax_topk: bad sizes (rows %lld, V %d, k %d)", (long long)rows, V, k);
    if (rows > 0 && (!logits || (k > 0 && (!top_lp || !top_idx)) || (pick && !picked)))
        BAD("log_softmax_topk: null pointer");
    return be->kernels->log_softmax_topk(be, logits, bias, rows, V, k, top_lp, top_idx, pick,
                                         picked);
}
static luna_status causal_step_products(luna_backend *be, luna_act *y, const luna_act *x,
                                        const luna_act *S, const int32_t *t, int t_all, int R,
                                        int H, int K, int N) {
    if (R < 0 || H < 1 || K < 1 || N < 1 || (!t && t_all < 1))
        BAD("causal_step_products: bad sizes (R %d, H %d, K %d, N %d, t_all %d)", R, H, K, N,
            t_all);
    if (R > 0 && (!y || !x || !S)) BAD("causal_step_products: null pointer");
    return be->kernels->causal_step_products(be, y, x, S, t, t_all, R, H, K, N);
}
static luna_status cache_products(luna_backend *be, bool values, luna_act *y, const luna_act *x,
                                  const luna_act *C, const int32_t *ind, const int32_t *lens, int R,
                                  int H, int dh, int T, int T_cap, int page) {
    if (R < 0 || H < 1 || dh < 1 || T < 1 || T > T_cap || page < 1)
        BAD("cache_products: bad sizes (R %d, H %d, dh %d, T %d, T_cap %d, page %d)", R, H, dh, T,
            T_cap, page);
    if (R > 0 && (!y || !x || !C || !ind)) BAD("cache_products: null pointer");
    return be->kernels->cache_products(be, values, y, x, C, ind, lens, R, H, dh, T, T_cap, page);
}
static luna_status cache_write(luna_backend *be, luna_act *C, const luna_act *x, const int32_t *ind,
                               const int32_t *lens, int R, int H, int dh, int T, int T_cap,
                               int page) {
    if (R < 0 || H < 1 || dh < 1 || T < 1 || T > T_cap || page < 1)
        BAD("cache_write: bad sizes (R %d, H %d, dh %d, T %d, T_cap %d, page %d)", R, H, dh, T,
            T_cap, page);
    if (R > 0 && (!C || !x || !ind)) BAD("cache_write: null pointer");
    return be->kernels->cache_write(be, C, x, ind, lens, R, H, dh, T, T_cap, page);
}
static luna_status cross_attention(luna_backend *be, luna_act *y, const luna_act *q,
                                   const luna_act *K, const luna_act *V, const int32_t *row_slot,
                                   const int32_t *slot_len, int R, int H, int dh, int m,
                                   float alpha) {
    if (R < 0 || H < 1 || dh < 1 || m < 1)
        BAD("cross_attention: bad sizes (R %d, H %d, dh %d, m %d)", R, H, dh, m);
    if (R > 0 && (!y || !q || !K || !V || !row_slot)) BAD("cross_attention: null pointer");
    return be->kernels->cross_attention(be, y, q, K, V, row_slot, slot_len, R, H, dh, m, alpha);
}
static luna_status beam_select(luna_backend *be, const luna_beam_select_args *a) {
    if (!a) BAD("beam_select: null arguments");
    if (a->S < 0 || a->beam < 1 || a->kb < 1 || a->kb > 2 * a->beam || a->k_list < a->kb ||
        a->cap < 2 || a->rows < a->beam || a->ngram < 0)
        BAD("beam_select: bad sizes (S %d, beam %d, kb %d, k_list %d, cap %d, rows %d, ngram %d)",
            a->S, a->beam, a->kb, a->k_list, a->cap, a->rows, a->ngram);
    if (a->S > 0 && (!a->top_lp || !a->top_tok || !a->row_first || !a->step || !a->max_len ||
                     !a->slot || !a->tok || !a->score || !a->back || !a->ignore || !a->ignore_out ||
                     !a->summary || !a->finished || !a->work))
        BAD("beam_select: null pointer");
    return be->kernels->beam_select(be, a);
}
static luna_status hold_weights(luna_backend *be, const float *W, int out, int in,
                                luna_dtype dtype) {
    if (!W || out <= 0 || in <= 0)
        BAD("hold_weights: W %p, out %d, in %d", (const void *)W, out, in);
    if (dtype != LUNA_F32 && dtype != LUNA_I8)
        BAD("hold_weights: dtype %s (F32 or I8)", luna_dtype_name(dtype));
    return be->kernels->hold_weights(be, W, out, in, dtype);
}
static luna_status release_weights(luna_backend *be, const float *W) {
    if (!W) return LUNA_OK;
    return be->kernels->release_weights(be, W);
}

static const luna_ops checked_ops = {
    .gemm = gemm,
    .gemm_grid = gemm_grid,
    .linear_forward = linear_forward,
    .linear_relu_forward = linear_relu_forward,
    .linear_backward = linear_backward,
    .linear_forward_multi = linear_forward_multi,
    .linear_backward_multi = linear_backward_multi,
    .residual_norm_forward = residual_norm_forward,
    .residual_norm_backward = residual_norm_backward,
    .bias_relu_dropout_forward = bias_relu_dropout_forward,
    .bias_relu_dropout_backward = bias_relu_dropout_backward,
    .softmax_dropout_forward = softmax_dropout_forward,
    .softmax_dropout_backward = softmax_dropout_backward,
    .cross_entropy_forward = cross_entropy_forward,
    .cross_entropy_forward_backward = cross_entropy_forward_backward,
    .loss_sums = loss_sums,
    .softmax_forward = softmax_forward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .causal_contraction_forward = causal_contraction_forward,
    .causal_contraction_backward = causal_contraction_backward,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .sinusoidal_table = sinusoidal_table,
    .positions_add = positions_add,
    .dropout_forward = dropout_forward,
    .dropout_backward = dropout_backward,
    .softplus_ln2_forward = softplus_ln2_forward,
    .softplus_ln2_backward = softplus_ln2_backward,
    .elu_plus_one_forward = elu_plus_one_forward,
    .elu_plus_one_backward = elu_plus_one_backward,
    .add = add,
    .axpy = axpy,
    .scale_act = scale_act,
    .split_heads = split_heads,
    .merge_heads = merge_heads,
    .broadcast_rows = broadcast_rows,
    .sum_broadcast = sum_broadcast,
    .multi_sum_squares = multi_sum_squares,
    .clip_coefficients = clip_coefficients,
    .multi_scale = multi_scale,
    .multi_apollo_update = multi_apollo_update,
    .multi_adam_update = multi_adam_update,
    .gather_rows = gather_rows,
    .gather_rows_in_groups = gather_rows_in_groups,
    .index_rows_update = index_rows_update,
    .log_softmax_topk = log_softmax_topk,
    .causal_step_products = causal_step_products,
    .cache_products = cache_products,
    .cache_write = cache_write,
    .cross_attention = cross_attention,
    .beam_select = beam_select,
    .hold_weights = hold_weights,
    .release_weights = release_weights,
};

/* The ops as an array of function pointers (struct luna_ops has nothing else). */
typedef void (*any_fn)(void);
#define NUM_OPS (sizeof(luna_ops) / sizeof(any_fn))
_Static_assert(sizeof(luna_ops) % sizeof(any_fn) == 0, "struct luna_ops holds only op pointers");

luna_status luna_backend_set_kernels(luna_backend *be, const luna_ops *kernels) {
    any_fn fns[NUM_OPS];
    memcpy(fns, kernels, sizeof fns);
    for (size_t i = 0; i < NUM_OPS; i++)
        if (!fns[i])
            return luna_error(LUNA_ERR_INTERNAL,
                              "backend %s: op %zu of struct luna_ops has no kernel (every backend "
                              "implements every op)",
                              be->name, i);
    memcpy(fns, &checked_ops, sizeof fns);
    for (size_t i = 0; i < NUM_OPS; i++)
        if (!fns[i])
            return luna_error(LUNA_ERR_INTERNAL,
                              "op %zu of struct luna_ops has no check (core/op_checks.c)", i);
    be->kernels = kernels;
    be->ops = &checked_ops;
    return LUNA_OK;
}

/* ---- data checks: the backend reads the ids, the message is one -------------------------------
 */
luna_status luna_op_bad_id(const char *op, const char *what, int64_t pos, int32_t id, int V) {
    return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                      "%s: %s %d at position %lld is outside the vocabulary [0, %d)", op, what,
                      (int)id, (long long)pos, V);
}

luna_status luna_op_check_ids(const char *op, const char *what, const int32_t *ids, int64_t n,
                              int V, const int32_t *exempt) {
    for (int64_t i = 0; i < n; i++)
        if ((ids[i] < 0 || ids[i] >= V) && !(exempt && ids[i] == *exempt))
            return luna_op_bad_id(op, what, i, ids[i], V);
    return LUNA_OK;
}
