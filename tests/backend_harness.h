/* The op-test harness (after ggml's test-backend-ops): the op suites (tests/test_ops_*.c) run
 * every op on the backend under test, chosen by name with the environment variable
 * LUNA_TEST_BACKEND ("cpu" by default; "cuda" on a CUDA build), and compare it with the CPU
 * backend, the reference.
 *
 * Everything an op reads or writes lives in memory of the backend it runs on: allocated with
 * luna_mem_alloc (lh_alloc), filled with luna_mem_from_host (lh_upload), read back with
 * luna_mem_to_host (lh_download). A suite never passes a host pointer to an op, so the same suite
 * runs unchanged on a device backend. Under AddressSanitizer (-DLUNA_SANITIZE=ON) a CPU
 * allocation is exactly the bytes asked for: the backend's rounding slack is poisoned, so an op
 * that reads or writes one element past its buffer is reported.
 *
 * lh_compare runs one op on the reference and on the backend under test with the same inputs and
 * compares every output with the op's tolerance tier (core/backend.h, "The contract between
 * backends"):
 *   LH_EXACT  elementwise, layout and gather ops: bit-equal;
 *   LH_NORM   normalisations, softmaxes and the activations built on exp/log1p (softplus_ln2,
 *             elu_plus_one: a GPU's expf/log1pf differ from libm's in the last bit; seen on an
 *             H200): within 1e-6 relative, per element (relative to
 *             max(|ref_i|, 1e-3·max|ref|), so cancellation near zero asks no more than fp32 has);
 *   LH_ACCUM  GEMMs, contractions and reductions: within 1e-5 relative to the magnitude of the
 *             result (max|ref| over the output).
 * When the backend under test is the CPU backend the comparison still runs (the reference with 1
 * thread, the backend under test with its own count) and must be bit-exact, as the contract's
 * "deterministic within a backend" says.
 *
 * Each op of struct luna_ops has one row in the harness's table of compared ops (op name, tier,
 * the suite that compares it; backend_harness.c). lh_compare takes the tier from that row and
 * fails for an op without one; tests/test_ops_coverage.c fails when an op of core/backend.h has
 * no row. A new op: add its row, and an lh_compare call in the suite the row names. */
#ifndef LUNA_TESTS_BACKEND_HARNESS_H
#define LUNA_TESTS_BACKEND_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "tests/test_util.h"

typedef enum { LH_EXACT, LH_NORM, LH_ACCUM } lh_tier;

/* A row of the table of compared ops. */
typedef struct {
    const char *op;    /* the member of struct luna_ops */
    lh_tier tier;      /* its tolerance across backends */
    const char *suite; /* the suite (tests/<suite>.c) that calls lh_compare for it */
} lh_op_row;

/* The table, terminated by a row with op == NULL. */
const lh_op_row *lh_op_rows(void);
/* The row of `op`, or NULL. */
const lh_op_row *lh_find_op(const char *op);
const char *lh_tier_name(lh_tier tier);

/* ---- backends ----------------------------------------------------------------------------- */
/* The name of the backend under test: $LUNA_TEST_BACKEND, else "cpu". */
const char *lh_backend_name(void);
/* The backend under test with `threads` host threads (ck_assert on failure; its activations are
 * fp32). Free with luna_backend_free after lh_free-ing its buffers. */
luna_backend *lh_backend(int threads);
/* The CPU reference backend (1 thread). */
luna_backend *lh_reference(void);
/* Thread count of a CPU backend (a no-op for a device backend, whose results do not depend on
 * host threads either). */
void lh_set_threads(luna_backend *be, int threads);

/* ---- device memory -----------------------------------------------------------------------
 * Buffers remember their size (lh_free, lh_size). Every call ck_asserts success. */
void *lh_alloc(luna_backend *be, size_t bytes); /* contents undefined (NaN-filled on CPU) */
void lh_free(luna_backend *be, void *dev);      /* NULL is a no-op */
size_t lh_size(const void *dev);
void lh_upload(luna_backend *be, void *dev, const void *host, size_t bytes);
void lh_download(luna_backend *be, void *host, const void *dev, size_t bytes);
/* Allocate and upload n elements (host NULL: zeros). */
float *lh_f32(luna_backend *be, const float *host, size_t n);
int32_t *lh_i32(luna_backend *be, const int32_t *host, size_t n);
/* n uniform values in [lo, hi) from rng: a device buffer, and its host copy in *host (malloc'd;
 * host may be NULL when the caller needs no copy). */
float *lh_random_f32(luna_backend *be, luna_test_rng *rng, size_t n, float lo, float hi,
                     float **host);
/* A malloc'd host copy of n floats of a device buffer. */
float *lh_fetch_f32(luna_backend *be, const float *dev, size_t n);
/* One float of a device buffer (a reduction's scalar result). */
float lh_scalar(luna_backend *be, const float *dev);

/* ---- cross-backend comparison --------------------------------------------------------------- */
typedef enum {
    LH_IN,  /* read by the op */
    LH_OUT, /* written (or accumulated into) by the op: its initial contents are uploaded too, and
               it is compared afterwards */
} lh_role;
typedef enum { LH_F32, LH_I32 } lh_type;

typedef struct {
    const void *host; /* initial contents, `count` elements (NULL: zeros) */
    size_t count;     /* elements */
    lh_type type;
    lh_role role;
} lh_buf;

#define LH_MAX_BUFS 12
/* Runs the op on `be` with dev[i] the device copy of bufs[i]; `args` is the caller's. */
typedef luna_status (*lh_op_fn)(luna_backend *be, void *const *dev, const void *args);

/* Runs `fn` on the reference and on the backend under test (created with `threads`) with the
 * same inputs; both must return the same status, and every LH_OUT buffer must agree within the
 * tier of `op`'s row (bit-exact when the backend under test is the CPU). `what` names the case in
 * messages. Returns the status both returned. */
luna_status lh_compare(const char *op, const char *what, int threads, lh_op_fn fn, const void *args,
                       const lh_buf *bufs, int nbufs);
/* The same within `tier` instead of the row's: an output held to a tighter tier than the op's
 * (the cross-entropy gradient, NORM, beside its loss, ACCUM). */
luna_status lh_compare_tier(const char *op, lh_tier tier, const char *what, int threads,
                            lh_op_fn fn, const void *args, const lh_buf *bufs, int nbufs);

/* The comparison of one output (exposed for the harness's own checks): 0 when `got` matches
 * `ref` within `tier` (bit_exact: memcmp), else the index + 1 of the first bad element. */
size_t lh_mismatch(lh_tier tier, bool bit_exact, const float *got, const float *ref, size_t n);

/* ---- references that are not ops -----------------------------------------------------------
 * Computations the suites compare against that no library code needs, so they are not ops of
 * struct luna_ops: each is composed from the ops (and so runs on any backend, device pointers in
 * and out; temporaries from luna_mem_alloc) or is a plain host computation. The composed ones are
 * the ops they are made of, bit for bit. */
/* LayerNorm over the last axis: residual_norm with no bias, no dropout and a zero residual.
 * forward: x, y [rows, d], mean, rstd [rows]; backward: dx (may alias dy) overwritten, dgamma,
 * dbeta [d] accumulated (either NULL: skipped). */
luna_status lh_layer_norm_forward(luna_backend *be, float *y, float *mean, float *rstd,
                                  const float *x, const float *gamma, const float *beta,
                                  int64_t rows, int d, float eps);
luna_status lh_layer_norm_backward(luna_backend *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *mean,
                                   const float *rstd, const float *gamma, int64_t rows, int d);
/* ReLU (y = x < 0 ? 0 : x + 0) and its backward (dx = x > 0 ? dy : 0): bias_relu_dropout with no
 * bias and no dropout. y must not overlap x; dx may alias dy. n < 2^31. */
luna_status lh_relu_forward(luna_backend *be, float *y, const float *x, int64_t n);
luna_status lh_relu_backward(luna_backend *be, float *dx, const float *dy, const float *x,
                             int64_t n);
/* The softmax backward dx = y ⊙ (dy − Σ_c y·dy) (dx may alias dy): softmax_dropout_backward with
 * no dropout. */
luna_status lh_softmax_backward(luna_backend *be, float *dx, const float *dy, const float *y,
                                int64_t rows, int cols);
/* The cross-entropy gradient alone: cross_entropy_forward_backward's dlogits (its loss, nll and
 * lse in temporaries). dlogits may alias logits. */
luna_status lh_cross_entropy_backward(luna_backend *be, float *dlogits, const float *logits,
                                      const int32_t *targets, int64_t N, int V, float epsilon,
                                      int padding_idx, float grad_scale);
/* Σ x² of host memory x [n] in core/reduce_order.h's order (blocks, lanes, blocks in order, one
 * rounding to fp32): what multi_sum_squares gives for a tensor of n elements, on every backend. */
float lh_sum_squares_reference(const float *x, int64_t n);

#endif
