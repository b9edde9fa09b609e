/* The backend boundary (after ggml): model code calls ops through this table; each backend (CPU,
 * CUDA) implements every op, behind one layer of argument checks (core/op_checks.c). Ops take
 * device pointers plus the backend (which carries the thread count or CUDA stream); they never
 * allocate except from `backend->scratch`.
 *
 * Conventions for every op below:
 * - All matrices are row-major and contiguous unless a leading dimension is given.
 * - Shapes are written next to each pointer: x [rows, d] means rows*d elements (of act_dtype for
 *   an activation, fp32 otherwise).
 * - Backward ops ACCUMULATE (+=) into parameter gradients (dW, db, dgamma, dtable) — parameters
 *   are shared (tied embeddings) and gradients are summed over micro-batches — and OVERWRITE the
 *   gradients of activations (dx) unless a flag says otherwise.
 * - Dropout never stores a mask: the mask is a function of (luna_rng_key, element index), see
 *   core/rng.h, and backward regenerates it.
 * - Reductions accumulate in double in a fixed blocking order, so results are bit-identical for
 *   any thread count.
 * - Dropout masks come from core/philox.h, one host/device definition: bit-identical on every
 *   backend by construction.
 * - Every op returns LUNA_OK or an error (with one line naming the op) — e.g. a bad size, scratch
 *   exhausted.
 * Math for each op is in the CPU implementation (model/kernels/cpu/), which is the specification.
 *
 * The contract between backends:
 * - Deterministic within a backend: the same inputs give bit-identical outputs on every run,
 *   for any thread count (CPU) or launch configuration (GPU). No atomics in accumulations.
 * - Across backends, in fp32: every op equals the CPU backend's within a per-op tolerance
 *   (elementwise, layout and gather ops exactly; normalisations, softmaxes and the exp/log1p
 *   activations within 1e-6 relative; GEMMs, contractions and reductions within 1e-5 relative to
 * the magnitude of the result), checked op by op on odd shapes by the op suites
 * (tests/test_ops_*.c), and end to end within 1e-5 on logits and 1e-4 on gradients (the project's
 * numerics targets).
 * - Precision: parameters, their gradients and the optimizer state are fp32 master copies on
 *   every backend; losses, norms and other reductions are accumulated in fp32 or better (double
 *   on CPU). Activations are stored in `act_dtype`, chosen by the backend: fp32 on CPU; fp32 or
 *   bf16 on CUDA (GEMMs in bf16 with fp32 accumulation). With bf16 activations an op's result
 *   equals the CPU's computed from the bf16-rounded inputs within 2^-8 relative (one bf16 ulp)
 *   per stored rounding; end-to-end bounds for bf16 are stated by the CUDA backend's tests.
 *   Signatures say which is which: activations are `luna_act *` (counted in elements of
 *   act_dtype, allocated by luna_pass_alloc), everything else `float *`.
 */
#ifndef LUNA_BACKEND_H
#define LUNA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"

typedef struct luna_ops luna_ops;
/* Where the rows of a causal contraction's operands lie (struct luna_ops, causal_contraction_*):
 * for group g < G = B·H and position t, the p-long rows (x, a, dx, da) at
 *   (g / H)·p_outer + (g % H)·p_inner + t·p_ld
 * and the q-long rows (b, out, db, dout) likewise with the q strides. Packed [G, n, p]:
 * {H 1, p_ld p, p_outer n·p}; heads of a [B, n, H·dh] activation: {p_ld H·dh, p_outer n·H·dh,
 * p_inner dh}. */
typedef struct {
    int H;
    int p_ld, q_ld;
    int64_t p_outer, p_inner, q_outer, q_inner;
} luna_causal_layout;

/* The two strides (elements) of a grid-batched operand (struct luna_ops, gemm_grid). */
typedef struct {
    int64_t outer, inner;
} luna_grid_stride;
/* The shape of attention_forward/backward: sentences b < B, heads h < H; Q_bh, O_bh [n, dh] and
 * K_bh, V_bh [m, dh] are matrices of row stride ld at X + b·s.outer + h·s.inner (gemm_grid's
 * operands); the probabilities packed [B, H, n, m]. */
typedef struct {
    int B, H, n, m, dh;
    float scale;               /* of the scores: dh^-1/2 */
    const int32_t *valid_cols; /* [B]: the keys of sentence b are 0 .. valid_cols[b] − 1; NULL: m */
    bool causal;               /* n == m, row r attends to keys ≤ r */
    int ldq, ldk, ldv, ldo;
    luna_grid_stride sq, sk, sv, so;
} luna_attention_shape;
typedef struct luna_tensor_table luna_tensor_table; /* core/tensor_table.h */

/* An activation buffer: device memory holding elements of the backend's `act_dtype` (fp32 on
 * CPU; bf16 or fp32 on CUDA). Ops take activations as `luna_act *` and parameters, their
 * gradients, optimizer state and statistics (LayerNorm mean/rstd, losses, norms) as `float *`
 * (always fp32). luna_act is void on purpose: model code cannot index an activation or step a
 * pointer through it (the build uses -Wpointer-arith -Werror; an element may be 2 bytes), it
 * offsets with luna_act_at and allocates with luna_pass_alloc (model/pass.h), which count
 * elements of act_dtype. */
#ifdef LUNA_STRICT_ACT
/* Checking build (CMake target luna_strict_act_check): an incomplete type, so passing an fp32
 * pointer where an activation is expected, or the reverse, is a compile error in model code. */
typedef struct luna_act_opaque luna_act;
#else
typedef void luna_act;
#endif

/* ---- device memory ---------------------------------------------------------------------------
 * What a backend implements besides the ops (llm.c/ggml style vtable). Every call takes the
 * backend, so a device backend orders it on its stream:
 *   alloc/release   device memory (release takes what alloc returned; NULL is a no-op);
 *   zero, copy      stream-ordered like an op (device -> device);
 *   from_host       stream-ordered; the host buffer may be reused as soon as the call returns;
 *   to_host         complete when it returns: the host buffer holds the data (it waits for the
 *                   work queued before it — the one place the host synchronises implicitly);
 *   synchronize     waits for all queued work (timing, before freeing memory the stream uses);
 *   ids_from_host   (optional; NULL: from_host) token ids: from_host, and the backend may keep
 *                   the ids' range so that ops checking those ids against a vocabulary skip their
 *                   own check (on CUDA a wait each) until the next to_host or synchronize. The
 *                   buffer is an input until then: no op writes it.
 *   ids_in_range    (optional; NULL: nothing to do) the caller states that n ids in the backend's
 *                   memory lie in [lo, hi] (ids an op produced, e.g. beam_select's next tokens),
 *                   kept as ids_from_host keeps an upload's range, under the same rules.
 *   device_stats    (optional; NULL on the CPU) the device work submitted and the host's waits
 *                   so far (luna_device_stats): what an update costs the host (benchmarks).
 *   graph_begin / graph_end / graph_launch / graph_free   (optional; NULL: no graphs) capture
 *                   the ops queued between begin and end as one graph instead of running them,
 *                   then replay it, as often as wanted, with one launch (CUDA graphs). A replay
 *                   runs the captured launches with the arguments they had (pointers, sizes,
 *                   scalars) on whatever memory holds then: the caller keeps every buffer
 *                   alive and at its address, and puts what changes into device memory before
 *                   the launch. While capturing, host transfers and allocations fail (a graph
 *                   replays device work only; a failed capture yields no graph and ran nothing).
 *   graph_state     (optional; NULL: none) a word that changes whenever the launches an op makes
 *                   for the same arguments may change: the CUDA backend remakes a weight's bf16
 *                   copy on its first use after the weight is written, so which copies are
 *                   current decides whether a linear op launches a conversion. A graph is
 *                   replayed only in the state it was captured in (luna_graph_key_add_backend).
 * Errors (a failed launch or copy, reported asynchronously by a device) come back as statuses. */
typedef struct {
    uint64_t kernels;       /* kernel launches (this process, every device) */
    uint64_t library_calls; /* GEMMs launched through a library (cuBLASLt) */
    uint64_t waits;         /* host waits on this backend's stream (readbacks, synchronize) */
    double wait_seconds;    /* host time spent in them */
    uint64_t graphs;        /* graph launches (replays of captured work) */
} luna_device_stats;
typedef struct {
    void *(*alloc)(luna_backend *be, size_t bytes);             /* NULL when out of memory */
    void (*release)(luna_backend *be, void *ptr, size_t bytes); /* bytes: as allocated */
    luna_status (*zero)(luna_backend *be, void *ptr, size_t bytes);
    luna_status (*copy)(luna_backend *be, void *dst, const void *src, size_t bytes);
    luna_status (*from_host)(luna_backend *be, void *dst, const void *host, size_t bytes);
    luna_status (*to_host)(luna_backend *be, void *host, const void *src, size_t bytes);
    luna_status (*synchronize)(luna_backend *be);
    void (*destroy)(luna_backend *be); /* the backend's own resources (stream, handles, context) */
    luna_status (*ids_from_host)(luna_backend *be, int32_t *dst, const int32_t *host, int64_t n);
    void (*ids_in_range)(luna_backend *be, const int32_t *ids, int64_t n, int32_t lo, int32_t hi);
    void (*device_stats)(luna_backend *be, luna_device_stats *out);
    luna_status (*graph_begin)(luna_backend *be);
    luna_status (*graph_end)(luna_backend *be, void **graph);
    luna_status (*graph_launch)(luna_backend *be, void *graph);
    void (*graph_free)(luna_backend *be, void *graph);
    uint64_t (*graph_state)(luna_backend *be);
} luna_backend_memory;

struct luna_backend {
    const char *name; /* "cpu", "cuda" */
    luna_device device;
    luna_dtype act_dtype; /* storage type of activations (model/pass.h): F32 on CPU */
    int num_threads;      /* CPU: OpenMP threads for ops (GEMM threads follow it) */
    void *impl;           /* the backend's private state (CUDA: stream, cuBLAS handle, ...) */
    luna_arena *scratch;  /* temporary space for ops; ops release what they take before returning */
    const luna_ops *ops;  /* what callers call: the argument checks, then `kernels` */
    const luna_ops *kernels; /* the backend's own implementations (luna_backend_set_kernels) */
    const luna_backend_memory *mem;

    size_t bytes_in_use;  /* device bytes allocated through luna_mem_alloc and not yet released */
    size_t peak_bytes;    /* high-water mark of bytes_in_use */
    size_t alloc_calls;   /* luna_mem_alloc calls so far (tests: "no allocation in an update") */
    size_t to_host_calls; /* luna_mem_to_host calls so far (tests: "one readback per update") */
};

#if defined(__GNUC__)
#define LUNA_MUST_CHECK __attribute__((warn_unused_result))
#else
#define LUNA_MUST_CHECK
#endif

/* Element i of an activation buffer (i elements of be->act_dtype past p). */
static inline luna_act *luna_act_at(const luna_backend *be, const luna_act *p, int64_t i) {
    return (luna_act *)((const char *)p + i * (int64_t)luna_dtype_size(be->act_dtype));
}
/* Bytes of n activation elements. */
static inline size_t luna_act_bytes(const luna_backend *be, int64_t n) {
    return (size_t)n * luna_dtype_size(be->act_dtype);
}

/* Counted device allocation (tensors, arena chunks); NULL when out of memory. A release gives the
 * bytes that were allocated (the CPU backend maps large buffers from the OS and unmaps them). */
void *luna_mem_alloc(luna_backend *be, size_t bytes);
void luna_mem_release(luna_backend *be, void *ptr, size_t bytes);
/* Stream-ordered transfers (see luna_backend_memory for when the host may touch its buffer). */
LUNA_MUST_CHECK luna_status luna_mem_zero(luna_backend *be, void *ptr, size_t bytes);
LUNA_MUST_CHECK luna_status luna_mem_copy(luna_backend *be, void *dst, const void *src,
                                          size_t bytes);
LUNA_MUST_CHECK luna_status luna_mem_from_host(luna_backend *be, void *dst, const void *host,
                                               size_t bytes);
LUNA_MUST_CHECK luna_status luna_mem_to_host(luna_backend *be, void *host, const void *src,
                                             size_t bytes);
/* n token ids (see ids_from_host above) */
LUNA_MUST_CHECK luna_status luna_mem_ids_from_host(luna_backend *be, int32_t *dst,
                                                   const int32_t *host, int64_t n);
/* n ids in the backend's memory within [lo, hi] (see ids_in_range above) */
void luna_mem_ids_in_range(luna_backend *be, const int32_t *ids, int64_t n, int32_t lo, int32_t hi);
/* Graphs (luna_backend_memory): whether the backend has them, and its calls. begin on a backend
 * without them: LUNA_ERR_UNSUPPORTED; end: *graph NULL and an error when the capture failed. */
bool luna_graphs_available(const luna_backend *be);
LUNA_MUST_CHECK luna_status luna_graph_begin(luna_backend *be);
LUNA_MUST_CHECK luna_status luna_graph_end(luna_backend *be, void **graph);
LUNA_MUST_CHECK luna_status luna_graph_launch(luna_backend *be, void *graph);
void luna_graph_free(luna_backend *be, void *graph); /* NULL: nothing */
uint64_t luna_graph_state(luna_backend *be);         /* graph_state above, 0 without it */
LUNA_MUST_CHECK luna_status luna_backend_synchronize(luna_backend *be);

/* Frees the backend: its scratch arena, its own resources, the struct. Backends are created by
 * name with luna_backend_create (model/kernels/registry.h). */
void luna_backend_free(luna_backend *be);

/* ---- the ops ----------------------------------------------------------------------------------
 * Model, optimizer and decoding code call be->ops->X. be->ops is the dispatch layer of
 * core/op_checks.c: it checks every op's arguments once, for every backend, and forwards the call
 * to the backend's own table be->kernels, installed by luna_backend_set_kernels. Kernels receive
 * checked arguments; they check only what they alone can read (token ids in their memory, with
 * luna_op_check_ids / luna_op_bad_id, so the message is the same on every backend) and their own
 * state. An op exists because library code calls it: a test's reference computation that no
 * library code needs lives with the tests (tests/backend_harness.h, "references that are not
 * ops"). */
struct luna_beam_select_args; /* core/beam_select.h */

struct luna_ops {
    /* ==== GEMM and linear ========================================================================
     * gemm: batched strided GEMM: for b in [0, batch):
     *   C_b = alpha · op(A_b) · op(B_b) + beta · C_b,  op(X) = X or Xᵀ,
     *   op(A_b) [M, K], op(B_b) [K, N], C_b [M, N]; X_b = X + b·stride_x; ld* are row strides of
     *   the matrices as stored (A stored [M, K] if !trans_a else [K, M]).
     * Backward of C = A·B is two more GEMMs: dA = dC·Bᵀ, dB = Aᵀ·dC (callers compose them). */
    luna_status (*gemm)(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                        float alpha, const luna_act *A, int lda, int64_t stride_a,
                        const luna_act *B, int ldb, int64_t stride_b, float beta, luna_act *C,
                        int ldc, int64_t stride_c, int batch);
    /* gemm_grid: the same over a grid of outer × inner products, each operand's matrices at two
     * strides:  for o in [0, outer), i in [0, inner):  X_oi = X + o·sX.outer + i·sX.inner.
     * Attention heads are the use: the heads of a [batch, len, H·dh] activation are the matrices
     * X + b·len·H·dh + h·dh with row stride H·dh — one grid, no copy into [batch, H, len, dh].
     * gemm is the grid with inner = 1; results equal the same products made one by one. */
    luna_status (*gemm_grid)(luna_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
                             float alpha, const luna_act *A, int lda, luna_grid_stride stride_a,
                             const luna_act *B, int ldb, luna_grid_stride stride_b, float beta,
                             luna_act *C, int ldc, luna_grid_stride stride_c, int outer, int inner);
    /* Linear: y = x Wᵀ + b (PyTorch layout W [out, in]).
     * forward: x [rows, in], W [out, in], b [out] or NULL, y [rows, out] (overwritten).
     * backward: dx [rows, in] (= dy W; overwritten, or added when accumulate_dx; NULL to skip),
     *   dW [out, in] += dyᵀ x (NULL to skip), db [out] += Σ_rows dy (NULL to skip; the bias
     *   gradient alone is linear_backward with in = 0).
     * linear_relu_forward: y = max(0, x Wᵀ + b) (a NaN stays NaN, −0 becomes +0: relu as
     *   bias_relu_dropout_forward computes it, which with p = 0 after linear_forward gives the
     *   same bits on the same backend); the FFN's first layer when no dropout and no backward
     *   follow (decoding, validation): a device applies the relu in the GEMM's epilogue. */
    luna_status (*linear_forward)(luna_backend *be, luna_act *y, const luna_act *x, const float *W,
                                  const float *b, int64_t rows, int in, int out);
    luna_status (*linear_relu_forward)(luna_backend *be, luna_act *y, const luna_act *x,
                                       const float *W, const float *b, int64_t rows, int in,
                                       int out);
    luna_status (*linear_backward)(luna_backend *be, luna_act *dx, float *dW, float *db,
                                   const luna_act *dy, const luna_act *x, const float *W,
                                   int64_t rows, int in, int out, bool accumulate_dx);
    /* Projections that read one input (a source's keys and values; the causal layer's query,
     * key and P-context), `count` Linear maps of x [rows, in] whose weights sit `stride` floats
     * apart: the parameter table stores a module's projections as weight, bias, next weight, ...,
     * so stride = out·in + out (model/param_table.c). For i < count:
     *   W_i = W + i·stride, b_i = b + i·stride (b NULL: none), y_i = y + i·rows·out.
     * linear_forward_multi: y_i = x W_iᵀ + b_i. A device runs one strided-batched GEMM (x read
     *   at batch stride 0, the bias at batch stride `stride`) instead of count GEMMs.
     * linear_backward_multi: given dy_i = dy + i·rows·out, dW_i += dy_iᵀ x and db_i += Σ_rows
     *   dy_i (dW_i = dW + i·stride, db_i = db + i·stride; NULL to skip; a device makes the
     *   weight gradients in one batched GEMM), and dx = Σ_i dy_i W_i, added in order i = 0, 1, ...
     *   (overwritten first unless accumulate_dx; NULL to skip).
     * Both equal the count linear_forward / linear_backward calls in order: on the CPU the same
     * bits, on a device within the GEMM's tolerance. */
    luna_status (*linear_forward_multi)(luna_backend *be, luna_act *y, const luna_act *x,
                                        const float *W, const float *b, int64_t stride, int count,
                                        int64_t rows, int in, int out);
    luna_status (*linear_backward_multi)(luna_backend *be, luna_act *dx, float *dW, float *db,
                                         const luna_act *dy, const luna_act *x, const float *W,
                                         int64_t stride, int count, int64_t rows, int in, int out,
                                         bool accumulate_dx);

    /* ==== Fused training ops: one pass over the rows instead of three or four ====================
     * `p` is the dropout probability in [0, 1) (0: no dropout, key unused), keep(i) =
     * luna_rng_dropout_keep(key, i, p) with i the element's index in its [rows, d] buffer — the
     * masks of dropout_forward, so a fused op drops the elements the separate ops would.
     *
     * residual_norm: the post-norm sublayer end (model/layers.c), bias + dropout + residual +
     * LayerNorm over the last axis (eps inside the sqrt, biased variance). sub, res, r, y
     * [rows, d]; bias [d] or NULL; gamma, beta [d]; mean, rstd [rows].
     *   forward:  r = res + dropout(sub + bias), y = LayerNorm(r; gamma, beta, eps); r, mean and
     *             rstd are kept for backward. r may alias sub or res (elementwise); y must not
     *             overlap r, sub or res. LayerNorm alone is p = 0, no bias, res = 0.
     *   backward: dres = the LayerNorm backward of dy (overwritten; dres may alias dy):
     *               with x̂ = (r − mean)·rstd, g = dy·γ:
     *               dres = rstd · (g − mean_c(g) − x̂ · mean_c(g·x̂)),
     *             dsub = dropout_backward(dres) (overwritten; must not overlap dres or dy),
     *             dbias [d] += Σ_rows dsub (NULL: skip),
     *             dgamma [d] += Σ_rows dy·x̂, dbeta [d] += Σ_rows dy (either NULL: skip). */
    luna_status (*residual_norm_forward)(luna_backend *be, luna_act *y, luna_act *r, float *mean,
                                         float *rstd, const luna_act *sub, const float *bias,
                                         const luna_act *res, const float *gamma, const float *beta,
                                         int64_t rows, int d, float eps, float p, luna_rng_key key);
    luna_status (*residual_norm_backward)(luna_backend *be, luna_act *dres, luna_act *dsub,
                                          float *dbias, float *dgamma, float *dbeta,
                                          const luna_act *dy, const luna_act *r, const float *mean,
                                          const float *rstd, const float *gamma, int64_t rows,
                                          int d, float p, luna_rng_key key);
    /* bias_relu_dropout: the FFN's hidden activation. h, a [rows, cols]; bias [cols] or NULL.
     *   forward:  h += bias (in place; NULL: h unchanged; h is kept: the pre-activation),
     *             a = dropout(relu(h)), relu(z) = max(z, 0) (NaN stays NaN). a must not overlap h.
     *   backward: dh = dropout_backward(da) ⊙ [h > 0] (overwritten; dh may alias da),
     *             dbias [cols] += Σ_rows dh (NULL: skip). */
    luna_status (*bias_relu_dropout_forward)(luna_backend *be, luna_act *a, luna_act *h,
                                             const float *bias, int64_t rows, int cols, float p,
                                             luna_rng_key key);
    luna_status (*bias_relu_dropout_backward)(luna_backend *be, luna_act *dh, float *dbias,
                                              const luna_act *da, const luna_act *h, int64_t rows,
                                              int cols, float p, luna_rng_key key);
    /* softmax_dropout: attention probabilities, x, y, yd [rows, cols].
     *   forward:  y = softmax_forward(x; valid_cols, rows_per_group, causal_period) (kept; y may
     *             alias x), yd = dropout(y) in the same pass; yd NULL or p = 0: only y is written.
     *             yd must not overlap x or y.
     *   backward: g = dropout_backward(dyd), dx = y ⊙ (g − Σ_c y·g) (masked entries 0); dx may
     *             alias dyd. */
    luna_status (*softmax_dropout_forward)(luna_backend *be, luna_act *y, luna_act *yd,
                                           const luna_act *x, int64_t rows, int cols,
                                           const int32_t *valid_cols, int64_t rows_per_group,
                                           int causal_period, float p, luna_rng_key key);
    luna_status (*softmax_dropout_backward)(luna_backend *be, luna_act *dx, const luna_act *dyd,
                                            const luna_act *y, int64_t rows, int cols, float p,
                                            luna_rng_key key);
    /* Log-softmax + label-smoothed cross entropy (spec §8). logits [N, V], targets [N]; rows with
     * targets == padding_idx are ignored. Per row (nats):
     *   nll = −log p_y,  loss = (1−ε)·nll + (ε/V)·Σ_v (−log p_v).
     * cross_entropy_forward writes loss[N], nll[N] (0 on pad rows) and lse[N] (log-sum-exp).
     * cross_entropy_forward_backward (training: the loss of a chunk, then its gradient, reading
     * the logits once) writes the same and dlogits = grad_scale · (softmax − (1−ε)·onehot(y) −
     * ε/V) on non-pad rows, 0 on pad rows; dlogits may alias logits (the [N, V] buffer is reused).
     * A target outside [0, V) other than padding_idx is an error. */
    luna_status (*cross_entropy_forward)(luna_backend *be, float *loss, float *nll, float *lse,
                                         const luna_act *logits, const int32_t *targets, int64_t N,
                                         int V, float epsilon, int padding_idx);
    luna_status (*cross_entropy_forward_backward)(luna_backend *be, float *loss, float *nll,
                                                  float *lse, luna_act *dlogits,
                                                  const luna_act *logits, const int32_t *targets,
                                                  int64_t N, int V, float epsilon, int padding_idx,
                                                  float grad_scale);
    /* loss_sums: sums[0] += Σ_i loss[i], sums[1] += Σ_i nll[i] over i in [0, n): each Σ in
     * double from 0 (the CPU: in order i = 0..n−1, as a host loop over the values would; a
     * device: a fixed tree of its own), then added to the sum so far. loss, nll [n] fp32 (the
     * entries the ops above wrote), sums [2] doubles, all device memory: the losses of an update's
     * micro-batches add up where they are, and are read back once, with the update's summary
     * (optim/optimizer.h). */
    luna_status (*loss_sums)(luna_backend *be, double *sums, const float *loss, const float *nll,
                             int64_t n);

    /* ==== Attention: masked softmax and the causal contraction ===================================
     * softmax_forward: over the last axis, x, y [rows, cols]. Row r attends to columns
     *   c < valid(r), with valid(r) = valid_cols ? valid_cols[r / rows_per_group] : cols, and if
     *   causal_period > 0: valid(r) = min(valid(r), r % causal_period + 1). Masked entries of y
     *   are 0; a row with valid(r) = 0 is all zeros. In place allowed. (Training uses
     *   softmax_dropout, which also has the backward.) */
    luna_status (*softmax_forward)(luna_backend *be, luna_act *y, const luna_act *x, int64_t rows,
                                   int cols, const int32_t *valid_cols, int64_t rows_per_group,
                                   int causal_period);
    /* Softmax attention of every sentence and head (luna_attention_shape):
     *   forward:  a = softmax_forward(scale · Q_bh K_bhᵀ; valid_cols[b], causal) [B, H, n, m]
     *             (kept), a_d = dropout(a) when p > 0 (else a_d is NULL and a is used),
     *             O_bh = a_d,bh V_bh (overwritten).
     *   backward: ds [B, H, n, m] (scratch) = softmax_dropout_backward(dO_bh V_bhᵀ),
     *             dQ_bh = scale · dS K_bh, dV_bh = a_dᵀ dO_bh, dK_bh = scale · dSᵀ Q_bh, each
     *             overwritten (dq, dk, dv at q's, k's, v's layout; dO at o's); dq may be d_o's
     *             buffer; when dk == dv that buffer gets dV + dK.
     * It is the composition of gemm_grid and softmax_dropout_forward/backward on these arguments
     * in this order (the CPU's bits: core/attention_composed.c); a backend may instead compute a
     * sentence and head in one kernel with the scores on chip, within the tiers. */
    luna_status (*attention_forward)(luna_backend *be, luna_act *o, luna_act *a, luna_act *a_d,
                                     const luna_act *q, const luna_act *k, const luna_act *v,
                                     const luna_attention_shape *shape, float p, luna_rng_key key);
    luna_status (*attention_backward)(luna_backend *be, luna_act *dq, luna_act *dk, luna_act *dv,
                                      luna_act *ds, const luna_act *d_o, const luna_act *q,
                                      const luna_act *k, const luna_act *v, const luna_act *a,
                                      const luna_act *a_d, const luna_attention_shape *shape,
                                      float p, luna_rng_key key);
    /* Causal normalised contraction (the two causal Luna products of spec §3). For each of G
     * independent groups (batch × head) and t = 1..n:
     *   out_t = alpha · (1/t) · Σ_{s≤t} (x_t · a_s) · b_s,
     * x, a [G, n, p]; b, out [G, n, q]. With (x, a, b) = (Q, K, Φ) this is S_t [l] (alpha:
     * Q's dh^-1/2); with (A, Φ, V) it is O_t [d_h]. Computed as a scan over t with a running
     * p×q state (Σ_{s≤t} a_s b_sᵀ), never materialising n×n or n×p×q tensors.
     * Backward (overwrites dx, da, db): with g_t = alpha · dout_t / t,
     *   dx_t = (Σ_{s≤t} a_s b_sᵀ) g_t,  da_s = R_s b_s,  db_s = R_sᵀ a_s,  R_s = Σ_{t≥s} x_t g_tᵀ.
     * layout: where the rows lie (NULL: packed as above), so heads are read where a Linear
     * wrote them (luna_causal_layout). */
    luna_status (*causal_contraction_forward)(luna_backend *be, luna_act *out, const luna_act *x,
                                              const luna_act *a, const luna_act *b, int G, int n,
                                              int p, int q, float alpha,
                                              const luna_causal_layout *layout);
    luna_status (*causal_contraction_backward)(luna_backend *be, luna_act *dx, luna_act *da,
                                               luna_act *db, const luna_act *dout,
                                               const luna_act *x, const luna_act *a,
                                               const luna_act *b, int G, int n, int p, int q,
                                               float alpha, const luna_causal_layout *layout);

    /* ==== Embeddings and positions ===============================================================
     * embedding: out[i] = scale · table[tokens[i]] (the padding_idx row gives zeros); tokens [n]
     *   int32, table [V, d], out [n, d]. Backward: dtable[tokens[i]] += scale · dout[i] for
     *   tokens[i] != padding_idx; deterministic (no atomics: threads own column ranges). Token
     *   ids outside [0, V) are an error. */
    luna_status (*embedding_forward)(luna_backend *be, luna_act *out, const float *table,
                                     const int32_t *tokens, int64_t n, int V, int d, float scale,
                                     int padding_idx);
    luna_status (*embedding_backward)(luna_backend *be, float *dtable, const luna_act *dout,
                                      const int32_t *tokens, int64_t n, int V, int d, float scale,
                                      int padding_idx);
    /* Sinusoidal positions (spec §1, fairseq convention).
     * sinusoidal_table: out[j] = PE(first_pos + j) for j in [0, npos), out [npos, d]. PE(pos)[i] =
     *   sin(pos·f_i) for i < d/2, cos(pos·f_{i-d/2}) after, f_i = exp(-i·ln(10000)/(d/2 - 1)).
     *   (d odd: the last feature is 0, as fairseq pads.)
     * positions_add: x [B, n, d] += PE(position) for non-pad tokens, where position = padding_idx
     *   + number of non-pad tokens in tokens[b, 0..t] (fairseq's make_positions); pads get nothing
     *   added. (Incremental decoding adds sinusoidal_table rows itself.) No parameters, so its
     *   backward is the identity on dx: there is no backward op. */
    luna_status (*sinusoidal_table)(luna_backend *be, luna_act *out, int first_pos, int npos,
                                    int d);
    luna_status (*positions_add)(luna_backend *be, luna_act *x, const int32_t *tokens, int B, int n,
                                 int d, int padding_idx);

    /* ==== Elementwise, activations and layout ====================================================
     * dropout: y = x · keep / (1 − p), keep(i) = luna_rng_dropout_keep(key, i, p); in place
     *   allowed; p = 0 copies. Backward: dx = dy · keep / (1 − p).
     * Activations (elementwise; in place allowed; backward takes the forward INPUT x and writes
     *   dx = dy · φ'(x); dx may alias dy): softplus_ln2: φ(z) = log2(1 + 2^z) = softplus(z; β =
     *   ln 2), linear when β·z > 20 (PyTorch threshold); elu_plus_one: φ(z) = elu(z) + 1 = z + 1
     *   (z > 0), exp(z) else.
     * add: y = a + b (activations); axpy: y += alpha·x (y an activation, x an fp32 parameter: the
     *   projected embeddings' scale·P added to the sinusoids); scale_act: x *= alpha on an
     *   activation.
     * split_heads: [B, n, H, dh] -> [B, H, n, dh]; merge_heads is its inverse (and its backward).
     * broadcast_rows: out[b] = x for b in [0, B) (x [rows, d], out [B, rows, d]); its backward
     *   sum_broadcast: dx += Σ_b dout[b] (dx an fp32 parameter gradient). */
    luna_status (*dropout_forward)(luna_backend *be, luna_act *y, const luna_act *x, int64_t n,
                                   float p, luna_rng_key key);
    luna_status (*dropout_backward)(luna_backend *be, luna_act *dx, const luna_act *dy, int64_t n,
                                    float p, luna_rng_key key);
    luna_status (*softplus_ln2_forward)(luna_backend *be, luna_act *y, const luna_act *x,
                                        int64_t n);
    luna_status (*softplus_ln2_backward)(luna_backend *be, luna_act *dx, const luna_act *dy,
                                         const luna_act *x, int64_t n);
    luna_status (*elu_plus_one_forward)(luna_backend *be, luna_act *y, const luna_act *x,
                                        int64_t n);
    luna_status (*elu_plus_one_backward)(luna_backend *be, luna_act *dx, const luna_act *dy,
                                         const luna_act *x, int64_t n);
    luna_status (*add)(luna_backend *be, luna_act *y, const luna_act *a, const luna_act *b,
                       int64_t n);
    luna_status (*axpy)(luna_backend *be, luna_act *y, float alpha, const float *x, int64_t n);
    luna_status (*scale_act)(luna_backend *be, luna_act *x, float alpha, int64_t n);
    luna_status (*split_heads)(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh);
    luna_status (*merge_heads)(luna_backend *be, luna_act *out, const luna_act *x, int B, int n,
                               int H, int dh);
    luna_status (*broadcast_rows)(luna_backend *be, luna_act *out, const luna_act *x, int B,
                                  int64_t rows, int d);
    luna_status (*sum_broadcast)(luna_backend *be, float *dx, const luna_act *dout, int B,
                                 int64_t rows, int d);

    /* ==== Optimizer: clipping and the updates, every tensor of a table in one launch =============
     * tt (core/tensor_table.h) describes N tensors inside flat buffers: tensor i of a buffer X is
     * X[offsets[i], offsets[i] + numels[i]); the ops take the buffers' base pointers. Per-block
     * partials and per-tensor scalars live in tt->workspace: no op here allocates. Tensors of 0
     * elements are allowed. Every sum is accumulated in double in the fixed order of
     * core/reduce_order.h (blocks of LUNA_REDUCE_BLOCK elements numbered over the whole table,
     * LUNA_REDUCE_LANES lanes per block, blocks combined in order), so each tensor's result is
     * the same bits whatever the other tensors, the thread count or the launch configuration.
     *
     * multi_sum_squares: result[i] = Σ x_i², rounded once to fp32; result [N] device.
     * clip_coefficients (spec apollo.md step 3, optim/clip.h), from sumsq [N] (the Σg² above):
     *   mode 0 (each): norm = max_i sqrt(sumsq[i]) (NaN propagates), coef[i] = c(sqrt(sumsq[i]));
     *   mode 1 (total): norm = sqrt(Σ_i sumsq[i]) (double, in order i = 0..N-1), coef[i] = c(norm);
     *   c(x) = min(1, clip_norm / (x + 1e-6)) computed in double, stored as fp32.
     *   finite = every sumsq[i] is finite (else norm = +Inf unless already NaN/Inf) and every
     *   also_finite[j], j < num_also, is finite (device doubles the update also depends on: the
     *   trainer's loss sums; NULL when num_also = 0; they do not change the norm); when
     *   !finite or clip_norm = 0 every coef[i] = 1 (nothing is scaled). summary [3] doubles:
     *   {norm, finite ? 1 : 0, (some coef[i] < 1) ? 1 : 0}. coef [N], summary [3] device.
     * multi_scale: x_i *= coef[i] (an fp32 product), or x_i *= alpha for every i when coef is
     *   NULL; a tensor whose factor is exactly 1 is left untouched (x·1 = x).
     * multi_apollo_update / multi_adam_update: one optimizer step of every tensor i (theta, g and
     *   the state are flat buffers in tt's layout) with step t_i = steps[i] + 1; steps [N] int64
     *   device counters, incremented by the op (the host keeps its own copy). g is the (clipped)
     *   gradient and is only read; theta and the state are updated in place. gate: NULL, or a
     *   device double (clip_coefficients' summary[1]) read when the op runs: 0 means the update
     *   is skipped and nothing changes, steps included — so the host need not read the summary
     *   before queueing the update. Hyperparameters are
     *   doubles; every element is computed in double from the stored fp32 values and each stored
     *   quantity is rounded to fp32 when written (later sub-steps read the rounded value).
     *
     * Apollo (spec apollo.md steps 1–11), per tensor: m = exp_avg, B = approx_hessian,
     *   d = update; rebound: 0 constant, 1 belief; wd_type: 0 L2, 1 decoupled, 2 stable (= the
     *   enums of optim/optimizer.h). With g' = g + wd·θ (L2) else g, α = (1−β)/(1−β^t),
     *   Δg = g' − m:
     *     S4 = Σ d⁴, S_gd = Σ Δg·d, S_Bd = Σ B·d², r = max|Δg|   (old m, B, d; one fused pass)
     *     ε' = ε/σ (constant) or ε (belief);  den = S4^(1/4) + ε';  v = d/den
     *     δ = −α·S_gd/den² − S_Bd/den²     (= −α·Σ Δg·v / den − Σ B·v², the spec's scalar)
     *     m ← m + α·Δg;  B ← B + δ·v²;  D = max(|B|, σ)  (belief: max(|B|, r) + ε/α)
     *     d ← m / D;  decoupled: d ← d + wd·θ;  stable: d ← d + (wd / mean(D))·θ
     *     θ ← θ − lr·d
     *   The per-tensor sums (and mean(D)) in the fixed order above; on a GPU a reduction pass
     *   over all blocks, per-tensor scalars, then the elementwise pass, with no host round trip.
     * Adam (fairseq's FairseqAdam, AdamW-style decoupled decay): m = exp_avg, v = exp_avg_sq;
     *   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  step_size = lr·sqrt(1−β2^t)/(1−β1^t);
     *   θ ← θ − lr·wd·θ;  θ ← θ − step_size·m/(sqrt(v)+ε)  (ε is added to sqrt(v) before bias
     *   correction, as fairseq, not torch.optim.AdamW). */
    luna_status (*multi_sum_squares)(luna_backend *be, float *result, const float *x,
                                     const luna_tensor_table *tt);
    luna_status (*clip_coefficients)(luna_backend *be, float *coef, double *summary,
                                     const float *sumsq, int n, double clip_norm, int mode,
                                     const double *also_finite, int num_also);
    luna_status (*multi_scale)(luna_backend *be, float *x, const luna_tensor_table *tt,
                               const float *coef, float alpha);
    luna_status (*multi_apollo_update)(luna_backend *be, float *theta, const float *g,
                                       float *exp_avg, float *approx_hessian, float *update,
                                       const luna_tensor_table *tt, int64_t *steps,
                                       const double *gate, double lr, double beta, double eps,
                                       double sigma, int rebound, double weight_decay, int wd_type);
    luna_status (*multi_adam_update)(luna_backend *be, float *theta, const float *g, float *exp_avg,
                                     float *exp_avg_sq, const luna_tensor_table *tt, int64_t *steps,
                                     const double *gate, double lr, double beta1, double beta2,
                                     double eps, double weight_decay);

    /* ==== Decoding ===============================================================================
     * gather_rows: dst[i, 0:cols] = src[idx[i], 0:cols] for i in [0, n) (idx NULL: src[i]), rows
     *   dst_stride / src_stride elements apart (activations). Reorders beams (index-select) and,
     *   with idx NULL, writes a step's keys into a strided cache. dst and src must not overlap.
     *   Indices outside [0, src_rows) are the caller's bug (not checked on a device).
     * gather_rows_in_groups: in place, within each of n_groups groups of `group` consecutive rows
     *   of buf (activations, rows `stride` apart): row g·group + i becomes old row idx[g·group +
     *   i] (first `cols` elements), which must lie in the same group — a beam reorder within each
     *   sentence in one pass and without a second buffer (gather_rows needs both). group ≤ 32.
     * index_rows_update: the transformer's cache-slot table (decoding/cache_slots.h) kept on the
     *   backend: dst[i, 0:cols] = src[idx ? idx[i] : i, 0:cols] for i in [0, n), rows `stride`
     *   int32 apart (a beam reorder of the table; cols 0: none), then, when set_col is not NULL,
     *   dst[i, set_col[i]] = set_val[i] (a step's new slots; set_col[i] in [0, stride)). All
     *   int32 device arrays; dst and src must not overlap unless dst == src with idx NULL (then
     *   only the sets change anything). Indices are the caller's (not checked on a device).
     * log_softmax_topk: per row r of logits [rows, V] (activations), in double:
     *   lse_r = max + log Σ_j exp(x_rj − max),  lp_rj = (float)(x_rj − lse_r) + bias[j]
     *   (bias [V] fp32, NULL: none; −inf bans a token), then
     *   top_lp / top_idx [rows, k]: the k largest lp_rj, best first, ties by lower j first, a NaN
     *   counted (and returned) as −inf; picked[r] = (float)(x_r,pick[r] − lse_r), without the
     *   bias, for pick [rows] (NULL: none; an id outside [0, V) is an error).
     *   The host receives k candidates per row instead of V log-probs (beam search) or one
     *   log-prob per row (scoring); k ≤ V, k = 0 allowed.
     * causal_step_products: the causal Luna decoder step's running-sum products at each row's
     *   own position (rows at different positions under in-flight batching), for the G = R·H
     *   groups g = r·H + h (x, S, y activations):
     *     y[g·N + n] = (1/t_r) · Σ_{k<K} x[g·K + k] · S[g·K·N + k·N + n],   n < N
     *   with t_r = t[r] + 1 (t: device int32 [R], each row's steps before this one) or t_r =
     *   t_all when t is NULL. The scores (K = dh, N = L, S = Σ K Φᵀ) and the outputs (K = L,
     *   N = dh, S = Σ Φᵀ V). 1/t_r is the float 1.0f / t_r; on the CPU the bits of the one-row
     *   gemm with alpha 1/t_r over each run of rows at one position, elsewhere within the GEMM
     *   tolerance. Reading t on the device keeps the step free of per-position host work (one
     *   launch whatever the positions; a CUDA graph can replay it).
     * cache_products: a decoding step's self-attention products over a key/value cache read
     *   through a beam indirection, so that reordering beams moves indices, not cached rows. The
     *   cache C (activations) holds groups (slot, h) of `page` rows of dh elements, group at
     *   (slot·H + h)·page·dh, its row p' at + p'·dh; row r of the batch finds its position p in
     *   slot ind[r·T_cap + p] (device int32 [R, T_cap]; only p < T read), row p' = p mod page.
     *   page ≥ T_cap: a slot holds a row's whole history; a smaller page lets the caller hand out
     *   a slot per `page` positions as rows reach them (decoding/kv_pages.h). Row r reads its
     *   first T_r = lens ? lens[r] : T positions (lens: device int32 [R], 1 ≤ lens[r] ≤ T: rows
     *   at different positions under in-flight batching). For g = r·H + h:
     *     values false (scores):  y[g·T + p]  = Σ_{k<dh} x[g·dh + k] · C[ind[r, p], h, p', k]
     *     values true (outputs):  y[g·dh + j] = Σ_{p<T_r} x[g·T + p] · C[ind[r, p], h, p', j]
     *   for p < T_r (scores at p ≥ T_r untouched). (x, y activations.) Each sum is one chain of
     *   fused multiply-adds in ascending order from 0 — on the CPU the bits of the one-row gemm
     *   over a gathered copy of the rows (K ≤ 256), elsewhere within the GEMM tolerance. Slot
     *   indices outside the cache are the caller's bug (not checked on a device).
     * cache_write: a step's keys or values into that cache: row r's newest position
     *   p = (lens ? lens[r] : T) − 1 goes to slot ind[r·T_cap + p], C[ind[r, p], h, p mod page, :]
     *   = x[(r·H + h)·dh, :] for every head (x, C activations; a copy: exact).
     * cross_attention: a decoding step's attention from each row to its sentence's source (the
     *   transformer's encoder-decoder attention), fused: K, V [slots, m, H·dh] (activations; the
     *   keys and values of slot s's m source positions, heads in the rows), q [R, H·dh]; row r
     * reads slot row_slot[r] (device int32 [R]) over its first n_r = slot_len ?
     * slot_len[row_slot[r]] : m positions (device int32 [slots], clamped to [0, m]). For each head
     * h: a_p = alpha · Σ_{k<dh} q[r, h·dh + k] · K[s, p, h·dh + k]          (p < n_r) w =
     * softmax(a) over p < n_r (exp in float, the sum in double, as softmax_forward) y[r, h·dh + j]
     * = Σ_{p<n_r} w_p · V[s, p, h·dh + j]                (n_r = 0: 0) Each Σ is one chain of fused
     * multiply-adds in ascending order from 0: on the CPU the bits of the batched gemms +
     * softmax_forward that computed it before (luna_mha_attend with a sentence's beams as the
     * queries), elsewhere within the GEMM tolerance. One call covers every row whatever its
     * sentence, so the beams of all sentences share one launch. hold_weights: W [out, in] (fp32, a
     * Linear weight) will not change until release_weights(W); the backend may keep it in a layout
     * its linear_forward(W) uses faster (CPU: 16-column panels for a small-batch kernel,
     * model/kernels/cpu/held_weights.c; a backend may keep nothing). Holds of one W are counted
     * (each needs its release). linear_forward with a held W equals the unheld op within the GEMM
     * tolerance above and is deterministic; on the CPU a row's result is also independent of the
     * other rows (not on CUDA, whose cuBLASLt chooses its algorithm by shape, so the row count can
     * move the last bits). Decoding holds the decoder's weights for its lifetime
     * (model/decoder_step.h); training holds nothing. dtype LUNA_F32 holds W as it is; LUNA_I8
     * (int8 models, model/quantize.h) holds W quantized per output channel, and linear_forward(W)
     * then quantizes x per row and multiplies in int8 (CPU only: model/kernels/cpu/held_int8.h
     * states the math and its error bound; the CUDA backend refuses it). One W is held with one
     * dtype at a time. release_weights: ends one hold; the last drops what hold_weights kept (W
     * NULL: no-op; a W not held is an error). W must be released before its memory is freed or
     * reused.
     * beam_select: one step of the beam search's selection for a pool of a->S sentences, the
     *   search's state in the backend's memory (core/beam_select.h states the arguments and the
     *   records; every pointer in *a is the backend's memory, a itself the host's): per sentence
     *   the top 2·beam of cumulative score + log-prob over its rows' candidate lists (bans
     *   dropped), its </s> candidates finalized into its slot's record, done or the next beam's
     *   parent rows, tokens, histories and scores. Every backend runs core/beam_select.h's
     *   luna_beam_select_sentence for each sentence: results are bit-identical across backends
     *   (LH_EXACT). A sentence's slot, rows and step must be consistent (the caller's bug
     *   otherwise: not checked on a device). */
    luna_status (*gather_rows)(luna_backend *be, luna_act *dst, int64_t dst_stride,
                               const luna_act *src, int64_t src_stride, const int32_t *idx,
                               int64_t n, int64_t cols);
    luna_status (*gather_rows_in_groups)(luna_backend *be, luna_act *buf, int64_t stride,
                                         const int32_t *idx, int64_t n_groups, int group,
                                         int64_t cols);
    luna_status (*index_rows_update)(luna_backend *be, int32_t *dst, const int32_t *src,
                                     const int32_t *idx, int64_t n, int64_t cols, int64_t stride,
                                     const int32_t *set_col, const int32_t *set_val);
    luna_status (*log_softmax_topk)(luna_backend *be, const luna_act *logits, const float *bias,
                                    int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                    const int32_t *pick, float *picked);
    luna_status (*causal_step_products)(luna_backend *be, luna_act *y, const luna_act *x,
                                        const luna_act *S, const int32_t *t, int t_all, int R,
                                        int H, int K, int N);
    luna_status (*cache_products)(luna_backend *be, bool values, luna_act *y, const luna_act *x,
                                  const luna_act *C, const int32_t *ind, const int32_t *lens, int R,
                                  int H, int dh, int T, int T_cap, int page);
    luna_status (*cache_write)(luna_backend *be, luna_act *C, const luna_act *x, const int32_t *ind,
                               const int32_t *lens, int R, int H, int dh, int T, int T_cap,
                               int page);
    luna_status (*cross_attention)(luna_backend *be, luna_act *y, const luna_act *q,
                                   const luna_act *K, const luna_act *V, const int32_t *row_slot,
                                   const int32_t *slot_len, int R, int H, int dh, int m,
                                   float alpha);
    luna_status (*beam_select)(luna_backend *be, const struct luna_beam_select_args *a);
    luna_status (*hold_weights)(luna_backend *be, const float *W, int out, int in,
                                luna_dtype dtype);
    luna_status (*release_weights)(luna_backend *be, const float *W);
};

/* Installs `kernels` (every op non-NULL) as be->kernels behind the checks of core/op_checks.c
 * (be->ops). Every backend's constructor calls it. */
luna_status luna_backend_set_kernels(luna_backend *be, const luna_ops *kernels);

/* Data checks a backend makes itself, with one message for every backend:
 * luna_op_check_ids: ids [n] in host memory within [0, V) (except an id equal to *exempt, exempt
 *   non-NULL: a padding target), else the error of the first bad one;
 * luna_op_bad_id: the error for id `id` at position `pos` ("<op>: <what> <id> at position <pos>
 *   is outside the vocabulary [0, V)"), for a backend that found it in device memory. */
luna_status luna_op_check_ids(const char *op, const char *what, const int32_t *ids, int64_t n,
                              int V, const int32_t *exempt);
luna_status luna_op_bad_id(const char *op, const char *what, int64_t pos, int32_t id, int V);

#endif
