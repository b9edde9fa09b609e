/* The op-test harness (backend_harness.h): backends by name, device buffers, and the comparison of
 * an op on the backend under test with the CPU reference. */
#include "tests/backend_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/reduce_order.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/registry.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define LH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define LH_ASAN 1
#endif
#endif

/* ---- the table of compared ops: one row per member of struct luna_ops -----------------------
 * Tiers as core/backend.h's contract assigns them: elementwise ops (transcendental ones and the
 * optimizer's elementwise Adam included), layout and gather ops exact; normalisations and
 * softmaxes NORM; GEMMs, contractions and reductions (and the ops that sum over rows: the linear
 * and embedding backward, sum_broadcast, Apollo's fused norms) ACCUM.
 * log_softmax_topk is EXACT: rows are independent, its lse is accumulated in double and only the
 * fp32 log-probs are compared (a different summation order moves the double by ulps that the fp32
 * rounding absorbs), and the chosen indices must agree anyway. */
static const lh_op_row rows[] = {
    {"gemm", LH_ACCUM, "test_ops_linear"},
    {"gemm_grid", LH_ACCUM, "test_ops_linear"},
    {"linear_forward", LH_ACCUM, "test_ops_linear"},
    {"linear_relu_forward", LH_ACCUM, "test_ops_linear_relu"},
    {"linear_backward", LH_ACCUM, "test_ops_linear"},
    {"linear_forward_multi", LH_ACCUM, "test_ops_linear_multi"},
    {"linear_backward_multi", LH_ACCUM, "test_ops_linear_multi"},
    {"embedding_forward", LH_EXACT, "test_ops_embedding"},
    {"embedding_backward", LH_ACCUM, "test_ops_embedding"},
    {"sinusoidal_table", LH_EXACT, "test_ops_embedding"},
    {"positions_add", LH_EXACT, "test_ops_embedding"},
    {"softmax_forward", LH_NORM, "test_ops_softmax"},
    {"dropout_forward", LH_EXACT, "test_ops_activations"},
    {"dropout_backward", LH_EXACT, "test_ops_activations"},
    {"softplus_ln2_forward", LH_NORM, "test_ops_activations"},
    {"softplus_ln2_backward", LH_NORM, "test_ops_activations"},
    {"elu_plus_one_forward", LH_NORM, "test_ops_activations"},
    {"elu_plus_one_backward", LH_NORM, "test_ops_activations"},
    {"residual_norm_forward", LH_NORM, "test_ops_fused"},
    /* ACCUM: their parameter gradients (dγ, dβ, the bias's) are column sums over the rows */
    {"residual_norm_backward", LH_ACCUM, "test_ops_fused"},
    {"bias_relu_dropout_forward", LH_EXACT, "test_ops_fused"},
    {"bias_relu_dropout_backward", LH_ACCUM, "test_ops_fused"},
    {"softmax_dropout_forward", LH_NORM, "test_ops_fused"},
    {"softmax_dropout_backward", LH_NORM, "test_ops_fused"},
    /* ACCUM: products over dh and the keys */
    {"attention_forward", LH_ACCUM, "test_ops_attention"},
    {"attention_backward", LH_ACCUM, "test_ops_attention"},
    {"causal_contraction_forward", LH_ACCUM, "test_ops_causal"},
    {"causal_contraction_backward", LH_ACCUM, "test_ops_causal"},
    {"cross_entropy_forward", LH_ACCUM, "test_ops_cross_entropy"},
    {"cross_entropy_forward_backward", LH_ACCUM, "test_ops_cross_entropy"},
    {"loss_sums", LH_ACCUM, "test_ops_cross_entropy"},
    {"add", LH_EXACT, "test_ops_elementwise"},
    {"axpy", LH_EXACT, "test_ops_elementwise"},
    {"scale_act", LH_EXACT, "test_ops_elementwise"},
    {"split_heads", LH_EXACT, "test_ops_elementwise"},
    {"merge_heads", LH_EXACT, "test_ops_elementwise"},
    {"broadcast_rows", LH_EXACT, "test_ops_elementwise"},
    {"sum_broadcast", LH_ACCUM, "test_ops_elementwise"},
    {"gather_rows", LH_EXACT, "test_ops_decode"},
    {"gather_rows_in_groups", LH_EXACT, "test_ops_gather_groups"},
    {"index_rows_update", LH_EXACT, "test_ops_index_rows"},
    {"log_softmax_topk", LH_EXACT, "test_ops_decode"},
    {"causal_step_products", LH_ACCUM, "test_ops_causal_step"},
    {"cache_products", LH_ACCUM, "test_ops_decode"},
    {"cache_write", LH_EXACT, "test_ops_decode"},
    {"cross_attention", LH_ACCUM, "test_ops_decode"},
    {"beam_select", LH_EXACT, "test_ops_beam_select"},
    {"hold_weights", LH_ACCUM, "test_ops_held"},
    {"release_weights", LH_ACCUM, "test_ops_held"},
    {"multi_sum_squares", LH_ACCUM, "test_ops_multi_tensor"},
    {"clip_coefficients", LH_ACCUM, "test_ops_multi_tensor"},
    {"multi_scale", LH_EXACT, "test_ops_multi_tensor"},
    {"multi_apollo_update", LH_ACCUM, "test_ops_multi_tensor"},
    {"multi_adam_update", LH_EXACT, "test_ops_multi_tensor"},
    {NULL, LH_EXACT, NULL},
};

const lh_op_row *lh_op_rows(void) { return rows; }

const lh_op_row *lh_find_op(const char *op) {
    for (const lh_op_row *r = rows; r->op; r++)
        if (strcmp(r->op, op) == 0) return r;
    return NULL;
}

const char *lh_tier_name(lh_tier tier) {
    switch (tier) {
    case LH_EXACT: return "EXACT (bit-equal)";
    case LH_NORM: return "NORM (1e-6 relative)";
    case LH_ACCUM: return "ACCUM (1e-5 relative to the result's magnitude)";
    }
    return "?";
}

/* ---- backends ----------------------------------------------------------------------------- */
const char *lh_backend_name(void) {
    const char *name = getenv("LUNA_TEST_BACKEND");
    return name && *name ? name : "cpu";
}

static luna_backend *create(const char *name, int threads) {
    luna_backend_options o = luna_backend_options_default();
    o.num_threads = threads;
    luna_backend *be = NULL;
    luna_status st = luna_backend_create(&be, name, &o);
    ck_assert_msg(st == LUNA_OK, "LUNA_TEST_BACKEND=%s: %s", name, luna_error_message());
    ck_assert_msg(be->act_dtype == LUNA_F32,
                  "backend %s: the op suites compare fp32 activations (bf16 off)", name);
    return be;
}

luna_backend *lh_backend(int threads) { return create(lh_backend_name(), threads); }
luna_backend *lh_reference(void) { return create("cpu", 1); }

void lh_set_threads(luna_backend *be, int threads) {
    if (be->device == LUNA_DEVICE_CPU) luna_backend_cpu_set_threads(be, threads);
}

/* ---- device memory: sizes of the live buffers, for lh_free and lh_size --------------------- */
#define LH_MAX_LIVE 4096
static struct {
    const void *ptr;
    size_t bytes;
} live[LH_MAX_LIVE];
static int nlive;

static int find_live(const void *p) {
    for (int i = nlive - 1; i >= 0; i--)
        if (live[i].ptr == p) return i;
    ck_abort_msg("harness: %p is not a buffer from lh_alloc", p);
    return -1;
}

/* The CPU backend rounds allocations up to 256 bytes (its arena's alignment): under ASan the
 * slack is poisoned so that an op stepping past its buffer is caught. */
static size_t cpu_slack(size_t bytes) {
    size_t rounded = (bytes + 255) & ~(size_t)255;
    return (rounded ? rounded : 256) - bytes;
}

void *lh_alloc(luna_backend *be, size_t bytes) {
    void *p = luna_mem_alloc(be, bytes);
    ck_assert_msg(p != NULL, "harness: cannot allocate %zu bytes on %s", bytes, be->name);
    ck_assert_msg(nlive < LH_MAX_LIVE, "harness: more than %d live buffers", LH_MAX_LIVE);
    live[nlive].ptr = p;
    live[nlive].bytes = bytes;
    nlive++;
    if (bytes) { /* undefined contents: all-ones bytes (NaN as floats), so unwritten outputs show */
        void *fill = malloc(bytes);
        ck_assert_ptr_nonnull(fill);
        memset(fill, 0xff, bytes);
        LUNA_CHECK_OK(luna_mem_from_host(be, p, fill, bytes));
        free(fill);
    }
#ifdef LH_ASAN
    if (be->device == LUNA_DEVICE_CPU)
        __asan_poison_memory_region((char *)p + bytes, cpu_slack(bytes));
#endif
    return p;
}

void lh_free(luna_backend *be, void *dev) {
    if (!dev) return;
    int i = find_live(dev);
    size_t bytes = live[i].bytes;
    live[i] = live[--nlive];
#ifdef LH_ASAN
    if (be->device == LUNA_DEVICE_CPU)
        __asan_unpoison_memory_region((char *)dev + bytes, cpu_slack(bytes));
#else
    (void)cpu_slack;
#endif
    luna_mem_release(be, dev, bytes);
}

size_t lh_size(const void *dev) { return live[find_live(dev)].bytes; }

void lh_upload(luna_backend *be, void *dev, const void *host, size_t bytes) {
    ck_assert_msg(bytes <= lh_size(dev), "harness: upload of %zu bytes into a %zu-byte buffer",
                  bytes, lh_size(dev));
    LUNA_CHECK_OK(luna_mem_from_host(be, dev, host, bytes));
}

void lh_download(luna_backend *be, void *host, const void *dev, size_t bytes) {
    ck_assert_msg(bytes <= lh_size(dev), "harness: download of %zu bytes from a %zu-byte buffer",
                  bytes, lh_size(dev));
    LUNA_CHECK_OK(luna_mem_to_host(be, host, dev, bytes));
}

static void *upload_new(luna_backend *be, const void *host, size_t bytes) {
    void *dev = lh_alloc(be, bytes);
    if (host)
        lh_upload(be, dev, host, bytes);
    else
        LUNA_CHECK_OK(luna_mem_zero(be, dev, bytes));
    return dev;
}

float *lh_f32(luna_backend *be, const float *host, size_t n) {
    return upload_new(be, host, n * sizeof(float));
}
int32_t *lh_i32(luna_backend *be, const int32_t *host, size_t n) {
    return upload_new(be, host, n * sizeof(int32_t));
}

float *lh_random_f32(luna_backend *be, luna_test_rng *rng, size_t n, float lo, float hi,
                     float **host) {
    float *h = luna_test_random_vector(rng, n, lo, hi);
    float *dev = lh_f32(be, h, n);
    if (host)
        *host = h;
    else
        free(h);
    return dev;
}

float *lh_fetch_f32(luna_backend *be, const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    ck_assert_ptr_nonnull(h);
    lh_download(be, h, dev, n * sizeof *h);
    return h;
}

float lh_scalar(luna_backend *be, const float *dev) {
    float v;
    lh_download(be, &v, dev, sizeof v);
    return v;
}

/* ---- cross-backend comparison --------------------------------------------------------------- */
size_t lh_mismatch(lh_tier tier, bool bit_exact, const float *got, const float *ref, size_t n) {
    if (bit_exact || tier == LH_EXACT) {
        for (size_t i = 0; i < n; i++)
            if (memcmp(&got[i], &ref[i], sizeof(float)) != 0) return i + 1;
        return 0;
    }
    double mag = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i])) mag = fmax(mag, fabs((double)ref[i]));
    for (size_t i = 0; i < n; i++) {
        double a = got[i], b = ref[i];
        if (isnan(b) || isinf(b)) { /* non-finite results must agree exactly */
            if (memcmp(&got[i], &ref[i], sizeof(float)) != 0 && !(isnan(a) && isnan(b)))
                return i + 1;
            continue;
        }
        double tol = tier == LH_NORM ? 1e-6 * fmax(fabs(b), 1e-3 * mag) : 1e-5 * mag;
        if (!(fabs(a - b) <= tol)) return i + 1;
    }
    return 0;
}

typedef struct {
    void *dev[LH_MAX_BUFS];
    void *out[LH_MAX_BUFS]; /* host copies of the outputs after the op */
    luna_status status;
} run_result;

static size_t elem_size(lh_type t) { return t == LH_F32 ? sizeof(float) : sizeof(int32_t); }

static void run_on(luna_backend *be, run_result *r, lh_op_fn fn, const void *args,
                   const lh_buf *bufs, int nbufs) {
    for (int i = 0; i < nbufs; i++)
        r->dev[i] = upload_new(be, bufs[i].host, bufs[i].count * elem_size(bufs[i].type));
    r->status = fn(be, r->dev, args);
    if (r->status != LUNA_OK) luna_error_clear();
    for (int i = 0; i < nbufs; i++) {
        size_t bytes = bufs[i].count * elem_size(bufs[i].type);
        r->out[i] = NULL;
        if (bufs[i].role == LH_OUT) {
            r->out[i] = malloc(bytes ? bytes : 1);
            ck_assert_ptr_nonnull(r->out[i]);
            lh_download(be, r->out[i], r->dev[i], bytes);
        }
        lh_free(be, r->dev[i]);
    }
}

luna_status lh_compare(const char *op, const char *what, int threads, lh_op_fn fn, const void *args,
                       const lh_buf *bufs, int nbufs) {
    const lh_op_row *row = lh_find_op(op);
    ck_assert_msg(row != NULL, "lh_compare: op %s has no row in the harness's table", op);
    return lh_compare_tier(op, row->tier, what, threads, fn, args, bufs, nbufs);
}

luna_status lh_compare_tier(const char *op, lh_tier tier, const char *what, int threads,
                            lh_op_fn fn, const void *args, const lh_buf *bufs, int nbufs) {
    ck_assert_int_le(nbufs, LH_MAX_BUFS);
    luna_backend *ref = lh_reference(), *ut = lh_backend(threads);
    bool exact = strcmp(ut->name, "cpu") == 0; /* within a backend: deterministic, bit-equal */
    run_result a, b;
    run_on(ref, &a, fn, args, bufs, nbufs);
    run_on(ut, &b, fn, args, bufs, nbufs);
    ck_assert_msg(a.status == b.status, "%s [%s]: status %d on cpu, %d on %s", op, what, a.status,
                  b.status, ut->name);
    for (int i = 0; i < nbufs; i++) {
        if (bufs[i].role != LH_OUT) continue;
        if (a.status == LUNA_OK) {
            size_t n = bufs[i].count, bad;
            if (bufs[i].type == LH_I32) {
                const int32_t *x = b.out[i], *y = a.out[i];
                for (bad = 0; bad < n && x[bad] == y[bad]; bad++) {
                }
                ck_assert_msg(bad == n, "%s [%s]: buffer %d [%zu] = %d on %s, %d on cpu", op, what,
                              i, bad, bad < n ? x[bad] : 0, ut->name, bad < n ? y[bad] : 0);
            } else if ((bad = lh_mismatch(tier, exact, b.out[i], a.out[i], n)) != 0) {
                const float *x = b.out[i], *y = a.out[i];
                ck_abort_msg("%s [%s]: buffer %d [%zu] = %.9g on %s (%d threads), %.9g on the cpu "
                             "reference; tolerance %s",
                             op, what, i, bad - 1, (double)x[bad - 1], ut->name, threads,
                             (double)y[bad - 1],
                             exact ? "bit-equal (same backend)" : lh_tier_name(tier));
            }
        }
        free(a.out[i]);
        free(b.out[i]);
    }
    luna_backend_free(ref);
    luna_backend_free(ut);
    return a.status;
}

/* ---- references that are not ops ------------------------------------------------------------ */
/* n floats of device memory (zeros when zero), from luna_mem_alloc: *st set on failure. */
static float *temp(luna_backend *be, size_t n, bool zero, luna_status *st) {
    if (*st != LUNA_OK) return NULL;
    float *p = luna_mem_alloc(be, (n ? n : 1) * sizeof(float));
    if (!p) {
        *st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "harness: %zu floats of temporaries", n);
        return NULL;
    }
    if (zero) *st = luna_mem_zero(be, p, (n ? n : 1) * sizeof(float));
    return p;
}
static void temp_free(luna_backend *be, float *p, size_t n) {
    luna_mem_release(be, p, (n ? n : 1) * sizeof(float));
}

static const luna_rng_key no_dropout = {0};

luna_status lh_layer_norm_forward(luna_backend *be, float *y, float *mean, float *rstd,
                                  const float *x, const float *gamma, const float *beta,
                                  int64_t rows, int d, float eps) {
    const size_t n = (size_t)rows * (size_t)(d > 0 ? d : 0);
    luna_status st = LUNA_OK;
    float *zero = temp(be, n, true, &st), *r = temp(be, n, false, &st);
    if (st == LUNA_OK)
        st = be->ops->residual_norm_forward(be, y, r, mean, rstd, x, NULL, zero, gamma, beta, rows,
                                            d, eps, 0.0f, no_dropout);
    temp_free(be, zero, n);
    temp_free(be, r, n);
    return st;
}

luna_status lh_layer_norm_backward(luna_backend *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *mean,
                                   const float *rstd, const float *gamma, int64_t rows, int d) {
    const size_t n = (size_t)rows * (size_t)(d > 0 ? d : 0);
    luna_status st = LUNA_OK;
    float *dsub = temp(be, n, false, &st);
    if (st == LUNA_OK)
        st = be->ops->residual_norm_backward(be, dx, dsub, NULL, dgamma, dbeta, dy, x, mean, rstd,
                                             gamma, rows, d, 0.0f, no_dropout);
    temp_free(be, dsub, n);
    return st;
}

luna_status lh_relu_forward(luna_backend *be, float *y, const float *x, int64_t n) {
    /* bias_relu_dropout writes h back only with a bias: with none, x is read, not written */
    return be->ops->bias_relu_dropout_forward(be, y, (float *)x, NULL, 1, (int)n, 0.0f, no_dropout);
}

luna_status lh_relu_backward(luna_backend *be, float *dx, const float *dy, const float *x,
                             int64_t n) {
    return be->ops->bias_relu_dropout_backward(be, dx, NULL, dy, x, 1, (int)n, 0.0f, no_dropout);
}

luna_status lh_softmax_backward(luna_backend *be, float *dx, const float *dy, const float *y,
                                int64_t rows, int cols) {
    return be->ops->softmax_dropout_backward(be, dx, dy, y, rows, cols, 0.0f, no_dropout);
}

luna_status lh_cross_entropy_backward(luna_backend *be, float *dlogits, const float *logits,
                                      const int32_t *targets, int64_t N, int V, float epsilon,
                                      int padding_idx, float grad_scale) {
    const size_t n = N > 0 ? (size_t)N : 0;
    luna_status st = LUNA_OK;
    float *loss = temp(be, n, false, &st), *nll = temp(be, n, false, &st);
    float *lse = temp(be, n, false, &st);
    if (st == LUNA_OK)
        st = be->ops->cross_entropy_forward_backward(be, loss, nll, lse, dlogits, logits, targets,
                                                     N, V, epsilon, padding_idx, grad_scale);
    temp_free(be, loss, n);
    temp_free(be, nll, n);
    temp_free(be, lse, n);
    return st;
}

float lh_sum_squares_reference(const float *x, int64_t n) {
    double total = 0.0;
    for (int64_t k0 = 0; k0 < n; k0 += LUNA_REDUCE_BLOCK) {
        const int64_t len = n - k0 < LUNA_REDUCE_BLOCK ? n - k0 : LUNA_REDUCE_BLOCK;
        double lane[LUNA_REDUCE_LANES] = {0}, block = 0.0;
        for (int64_t j = 0; j < len; j++) {
            const double v = (double)x[k0 + j];
            lane[j % LUNA_REDUCE_LANES] += v * v;
        }
        for (int l = 0; l < LUNA_REDUCE_LANES; l++)
            block += lane[l];
        total += block;
    }
    return (float)total;
}
