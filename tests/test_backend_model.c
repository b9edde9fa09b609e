/* Whole models on the backend under test (LUNA_TEST_BACKEND) against the CPU backend: luna_tiny
 * and transformer_tiny (also with a Linformer encoder: linformer_tiny) at odd sizes, the same
 * seeded parameters on both, then
 *   - forward (no dropout): logits and loss within 1e-5 relative (the project's numerics target);
 *   - a training forward/backward WITH dropout: loss within 1e-5 and every parameter's gradient
 *     within 1e-4 relative to that gradient's largest entry — which also shows the dropout masks
 *     are the CPU's (a single differing mask element moves a gradient far more than 1e-4);
 *   - on a device backend, the same in bf16 activations, within the bounds stated below;
 *   - on a backend with graphs, training passes replayed as graphs equal eager ones bit for bit.
 * With LUNA_TEST_BACKEND=cpu the backend under test is the CPU with 2 threads against 1 thread,
 * which the backend contract requires to be bit-identical. Under -DLUNA_CUDA_EMU=ON this runs
 * the CUDA backend through the CPU execution harness in every thread order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels/registry.h"
#include "model/seq2seq.h"
#include "optim/optimizer.h"
#include "tests/backend_harness.h"
#include "tests/test_util.h"

enum { B = 3, M = 7, N = 6, V = 29 };

/* bf16 activations (one rounding per stored activation; fp32 master weights, gradients and
 * accumulation): the loss within 0.2%, the whole gradient vector within 10% and each gradient
 * tensor within 30% in relative L2 norm. On batches of ~15 target tokens a single tensor's bf16
 * error is a noisy draw (the rounding of every activation on the way back adds up with depth;
 * LUNA_TEST_VERBOSE=1 prints every tensor), so the bounds leave room for the worst tensor and
 * the worst whole gradient seen over many batch seeds, on the harness and on a GPU
 * (docs/testing.md). A wrong bf16 kernel (a transposed weight copy, a dropped rounding mode)
 * gives errors of order 1. */
#define BF16_LOSS_RTOL 2e-3
#define BF16_GRAD_RTOL 0.3
#define BF16_WHOLE_GRAD_RTOL 0.1

typedef struct {
    int32_t src[B * M], src_len[B], prev[B * N], tgt[B * N];
    luna_batch batch;
} test_batch;

/* Right-padded sentences of different lengths (one source as long as the batch, one of 2). */
static void make_batch(test_batch *t, uint64_t seed) {
    const int src_lens[B] = {M, 4, 2}, tgt_lens[B] = {3, N, 5};
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    for (int b = 0; b < B; b++) {
        luna_test_sentence_pair(&rng, V, t->src + b * M, M, src_lens[b], t->prev + b * N,
                                t->tgt + b * N, N, tgt_lens[b]);
        t->src_len[b] = src_lens[b];
    }
    t->batch = (luna_batch){.B = B,
                            .src_len = M,
                            .tgt_len = N,
                            .src_tokens = t->src,
                            .src_lengths = t->src_len,
                            .prev_output_tokens = t->prev,
                            .target = t->tgt};
}

static luna_config tiny(const char *arch, double dropout) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, arch), LUNA_OK);
    c.vocab_size = V;
    c.encoder_embed_dim = c.decoder_embed_dim = 18;
    c.encoder_ffn_embed_dim = c.decoder_ffn_embed_dim = 27;
    c.encoder_attention_heads = c.decoder_attention_heads = 3;
    c.dropout = c.attention_dropout = c.activation_dropout = dropout;
    return c;
}

static float *fetch(luna_backend *be, const float *dev, size_t n) {
    float *h = malloc(n * sizeof *h);
    ck_assert_ptr_nonnull(h);
    LUNA_CHECK_OK(luna_mem_to_host(be, h, dev, n * sizeof *h));
    return h;
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)x[i]));
    return m;
}

/* max_i |got_i − ref_i| / max(max_i |ref_i|, floor): the error relative to the result's scale.
 * floor > 0 for gradients that are zero in exact arithmetic (a key bias under softmax attention
 * gets none: softmax ignores a constant added to a row), whose reference is rounding noise. */
static double rel_linf(const float *got, const float *ref, size_t n, double floor) {
    double err = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        err = isnan(d) ? INFINITY : fmax(err, d);
    }
    return err / fmax(fmax(max_abs(ref, n), floor), 1e-30);
}

/* ‖got − ref‖₂ / max(‖ref‖₂, floor·√n): bf16's rounding is noise spread over every element, so
 * its bound is on the norm of the error, as mixed-precision training is usually judged. */
static double rel_l2(const float *got, const float *ref, size_t n, double floor) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - ref[i];
        e += d * d, r += (double)ref[i] * ref[i];
    }
    return isnan(e) ? INFINITY : sqrt(e) / fmax(fmax(sqrt(r), floor * sqrt((double)n)), 1e-30);
}

static bool bit_exact_expected(const luna_backend *be) { return be->device == LUNA_DEVICE_CPU; }

static void check_close(const char *what, const char *arch, double err, double tol, bool exact) {
    if (exact)
        ck_assert_msg(err == 0.0, "%s %s: CPU 2 threads differ from 1 thread (%.3g)", arch, what,
                      err);
    else
        ck_assert_msg(err <= tol, "%s %s: relative error %.3g > %.3g", arch, what, err, tol);
}

/* Forward without dropout: logits and loss. */
static void compare_forward(const char *arch, luna_backend *dev) {
    luna_backend *ref = lh_reference();
    luna_config c = tiny(arch, 0.0);
    luna_seq2seq *mr, *md;
    LUNA_CHECK_OK(luna_seq2seq_create(&mr, ref, &c));
    LUNA_CHECK_OK(luna_seq2seq_create(&md, dev, &c));
    test_batch t;
    make_batch(&t, 5);
    float *lr = malloc(sizeof(float) * B * N * V), *ld = malloc(sizeof(float) * B * N * V);
    double loss_r, nll_r, loss_d, nll_d;
    LUNA_CHECK_OK(luna_seq2seq_forward(mr, &t.batch, &loss_r, &nll_r, lr));
    LUNA_CHECK_OK(luna_seq2seq_forward(md, &t.batch, &loss_d, &nll_d, ld));
    const double el = rel_linf(ld, lr, (size_t)B * N * V, 0);
    const double eloss = fabs(loss_d - loss_r) / fabs(loss_r);
    printf("%s on %s: forward logits %.3g, loss %.3g (relative)\n", arch, dev->name, el, eloss);
    check_close("logits", arch, el, 1e-5, bit_exact_expected(dev));
    check_close("loss", arch, eloss, 1e-5, bit_exact_expected(dev));
    free(lr), free(ld);
    luna_seq2seq_free(mr), luna_seq2seq_free(md);
    luna_backend_free(ref);
}

/* Training forward/backward with dropout (step 3): loss and every gradient. */
static void compare_training(const char *arch, luna_backend *dev, bool l2, double loss_tol,
                             double grad_tol, double *worst_loss, double *worst_grad) {
    luna_backend *ref = lh_reference();
    luna_config c = tiny(arch, 0.2);
    luna_seq2seq *mr, *md;
    LUNA_CHECK_OK(luna_seq2seq_create(&mr, ref, &c));
    LUNA_CHECK_OK(luna_seq2seq_create(&md, dev, &c));
    ck_assert_uint_eq(mr->params->num_params, md->params->num_params);
    test_batch t;
    make_batch(&t, 9);
    double loss_r, nll_r, loss_d, nll_d;
    LUNA_CHECK_OK(luna_seq2seq_forward_backward(mr, &t.batch, 3, &loss_r, &nll_r));
    LUNA_CHECK_OK(luna_seq2seq_forward_backward(md, &t.batch, 3, &loss_d, &nll_d));
    const bool exact = bit_exact_expected(dev);
    const double eloss = fabs(loss_d - loss_r) / fabs(loss_r);
    check_close("training loss", arch, eloss, loss_tol, exact);
    *worst_loss = fmax(*worst_loss, eloss);
    const size_t n = mr->params->num_params;
    float *gr = fetch(ref, mr->params->grad, n), *gd = fetch(dev, md->params->grad, n);
    const double floor = 1e-3 * max_abs(gr, n); /* 1e-3 of the model's largest gradient */
    for (int i = 0; i < mr->params->num_tensors; i++) {
        const luna_param_info *p = &mr->params->tensors[i];
        if (!p->has_grad) continue;
        const double e = l2 ? rel_l2(gd + p->offset, gr + p->offset, p->numel, floor)
                            : rel_linf(gd + p->offset, gr + p->offset, p->numel, floor);
        char what[200];
        snprintf(what, sizeof what, "gradient of %s", p->name);
        if (getenv("LUNA_TEST_VERBOSE")) printf("  %s %s: %.3g\n", arch, what, e);
        check_close(what, arch, e, grad_tol, exact);
        *worst_grad = fmax(*worst_grad, e);
    }
    if (l2) { /* the whole gradient vector: per-tensor noise averages out */
        const double ew = rel_l2(gd, gr, n, 0);
        printf("%s on %s bf16: whole gradient %.3g (relative L2)\n", arch, dev->name, ew);
        check_close("whole gradient", arch, ew, BF16_WHOLE_GRAD_RTOL, exact);
    }
    free(gr), free(gd);
    luna_seq2seq_free(mr), luna_seq2seq_free(md);
    luna_backend_free(ref);
}

static const char *const archs[] = {"luna_tiny", "transformer_tiny", "linformer_tiny"};
enum { NUM_ARCHS = sizeof archs / sizeof archs[0] };

/* ---- training passes replayed as graphs (model/seq2seq.h: luna_seq2seq_set_graphs) -------- */

enum { GB = 4, GM = 9, GN = 8, GRAPH_PASSES = 12 };

typedef struct {
    int32_t src[GB * GM], src_len[GB], prev[GB * GN], tgt[GB * GN];
    luna_batch batch;
} shaped_batch;

/* A batch of shape [Bs, Ms] → [Bs, Ns]: sentence 0 as long as the shape on both sides (so P's
 * length is the same for every batch of the shape), the others of random lengths, so that
 * batches of one shape differ in their non-pad targets (the loss's row count). */
static void make_shaped(shaped_batch *t, int Bs, int Ms, int Ns, uint64_t seed) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    for (int b = 0; b < Bs; b++) {
        const int sl = b == 0 ? Ms : 2 + (int)luna_test_uniform(&rng, 0, Ms - 2 + 1 - 1e-3f);
        const int tl = b == 0 ? Ns : 1 + (int)luna_test_uniform(&rng, 0, Ns - 1 + 1 - 1e-3f);
        luna_test_sentence_pair(&rng, V, t->src + b * Ms, Ms, sl, t->prev + b * Ns, t->tgt + b * Ns,
                                Ns, tl);
        t->src_len[b] = sl;
    }
    t->batch = (luna_batch){.B = Bs,
                            .src_len = Ms,
                            .tgt_len = Ns,
                            .src_tokens = t->src,
                            .src_lengths = t->src_len,
                            .prev_output_tokens = t->prev,
                            .target = t->tgt};
}

/* GRAPH_PASSES training passes with dropout over two batch shapes, an Apollo step after most of
 * them (some updates have two passes, as with --update-freq 2: the second pass finds the bf16
 * weight copies current, the first stale); the loss sums of every update and the final weights. */
static void train_passes(luna_backend *be, const char *arch, bool graphs, double *losses,
                         float **weights, int64_t *replays) {
    luna_config c = tiny(arch, 0.2);
    luna_seq2seq *m;
    LUNA_CHECK_OK(luna_seq2seq_create(&m, be, &c));
    LUNA_CHECK_OK(luna_seq2seq_set_graphs(m, graphs));
    /* a Linformer encoder's GEMMs are sized by the sources' lengths: no graphs */
    ck_assert(luna_seq2seq_uses_graphs(m) == (graphs && c.linformer_k == 0));
    luna_tensor_table *tt;
    luna_optimizer *opt;
    luna_optimizer_config oc;
    luna_optimizer_config_defaults(&oc, LUNA_OPTIMIZER_APOLLO);
    LUNA_CHECK_OK(luna_params_trainable_table(m->params, &tt));
    LUNA_CHECK_OK(luna_optimizer_create(&opt, be, &oc, tt, m->params->data, m->params->grad));
    /* e.g. pass 2 finds shape 0's copies made current by pass 1 (no step between): a graph
     * captured then holds no conversions, and must not replay after pass 2's step */
    static const int shape[GRAPH_PASSES] = {0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0};
    static const bool step_after[GRAPH_PASSES] = {1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1};
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    for (int k = 0; k < GRAPH_PASSES; k++) {
        shaped_batch t;
        if (shape[k] == 0)
            make_shaped(&t, 3, GM, 6, 100 + (uint64_t)k);
        else
            make_shaped(&t, GB, 5, GN, 100 + (uint64_t)k);
        LUNA_CHECK_OK(luna_seq2seq_forward_backward_sums(m, &t.batch, 7 + (uint64_t)k,
                                                         luna_optimizer_loss_sums(opt)));
        losses[k] = NAN;
        if (!step_after[k]) continue;
        luna_optimizer_step_args a = {
            .lr = 1e-2, .grad_scale = 0.05, .clip_norm = 0, .clip_mode = LUNA_CLIP_TOTAL};
        luna_optimizer_step_result r;
        LUNA_CHECK_OK(luna_optimizer_step(opt, &a, &r));
        losses[k] = r.loss_sum;
        LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    }
    int64_t captures, failed;
    luna_seq2seq_graph_counts(m, replays, &captures, &failed);
    ck_assert_msg(failed == 0, "%s: %lld captures failed: %s", arch, (long long)failed,
                  luna_graph_cache_failure(m->graphs));
    *weights = fetch(be, m->params->data, m->params->num_params);
    luna_optimizer_free(opt);
    luna_tensor_table_free(tt);
    luna_seq2seq_free(m);
}

/* On a backend with graphs, training replayed as graphs equals eager training bit for bit: the
 * losses of every update and the weights after them, in fp32 and bf16 activations. */
START_TEST(training_graphs_change_nothing) {
    const char *arch = archs[_i % NUM_ARCHS];
    const bool bf16 = _i >= NUM_ARCHS;
    luna_backend_options o = luna_backend_options_default();
    o.bf16 = bf16;
    luna_backend *be;
    if (strcmp(lh_backend_name(), "cpu") == 0) {
        printf("training graphs: the CPU backend has no graphs (nothing to compare)\n");
        return;
    }
    LUNA_CHECK_OK(luna_backend_create(&be, lh_backend_name(), &o));
    ck_assert(luna_graphs_available(be));
    double eager_loss[GRAPH_PASSES], graph_loss[GRAPH_PASSES];
    float *eager_w, *graph_w;
    int64_t eager_replays, graph_replays;
    train_passes(be, arch, false, eager_loss, &eager_w, &eager_replays);
    train_passes(be, arch, true, graph_loss, &graph_w, &graph_replays);
    ck_assert_int_eq(eager_replays, 0);
    /* each shape: eager twice (no bf16 copies yet, then stale ones), captured, then replayed */
    if (strcmp(arch, "linformer_tiny") == 0)
        ck_assert_int_eq(graph_replays, 0);
    else
        ck_assert_int_ge(graph_replays, 6);
    for (int k = 0; k < GRAPH_PASSES; k++)
        if (!isnan(eager_loss[k]))
            ck_assert_msg(eager_loss[k] == graph_loss[k],
                          "%s %s: update after pass %d: loss %.9g "
                          "replayed, %.9g eager",
                          arch, bf16 ? "bf16" : "fp32", k, graph_loss[k], eager_loss[k]);
    luna_config c = tiny(arch, 0.2);
    luna_seq2seq *probe;
    LUNA_CHECK_OK(luna_seq2seq_create(&probe, be, &c));
    const size_t n = probe->params->num_params;
    luna_seq2seq_free(probe);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += memcmp(&eager_w[i], &graph_w[i], sizeof(float)) != 0;
    printf("training graphs, %s %s: %lld segments replayed, %zu of %zu weights differ\n", arch,
           bf16 ? "bf16" : "fp32", (long long)graph_replays, differ, n);
    ck_assert_uint_eq(differ, 0);
    free(eager_w), free(graph_w);
    luna_backend_free(be);
}
END_TEST

START_TEST(fp32_forward_matches_cpu) {
    luna_backend *dev = lh_backend(2);
    compare_forward(archs[_i], dev);
    luna_backend_free(dev);
}
END_TEST

START_TEST(fp32_training_step_matches_cpu) {
    luna_backend *dev = lh_backend(2);
    double wl = 0, wg = 0;
    compare_training(archs[_i], dev, false, 1e-5, 1e-4, &wl, &wg);
    printf("%s on %s: training loss %.3g, worst gradient %.3g (relative)\n", archs[_i], dev->name,
           wl, wg);
    luna_backend_free(dev);
}
END_TEST

/* bf16 activations: only a device backend has them (the CPU is fp32 only). */
START_TEST(bf16_training_step_within_bounds) {
    if (strcmp(lh_backend_name(), "cpu") == 0) {
        printf("bf16: the CPU backend has fp32 activations only (nothing to compare)\n");
        return;
    }
    luna_backend_options o = luna_backend_options_default();
    o.bf16 = true;
    luna_backend *dev;
    LUNA_CHECK_OK(luna_backend_create(&dev, lh_backend_name(), &o));
    ck_assert_int_eq(dev->act_dtype, LUNA_BF16);
    double wl = 0, wg = 0;
    compare_training(archs[_i], dev, true, BF16_LOSS_RTOL, BF16_GRAD_RTOL, &wl, &wg);
    printf("%s on %s bf16: training loss %.3g, worst gradient %.3g (relative)\n", archs[_i],
           dev->name, wl, wg);
    luna_backend_free(dev);
}
END_TEST

static Suite *backend_model_suite(void) {
    Suite *s = suite_create("backend_model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, fp32_forward_matches_cpu, 0, NUM_ARCHS);
    tcase_add_loop_test(tc, fp32_training_step_matches_cpu, 0, NUM_ARCHS);
    tcase_add_loop_test(tc, bf16_training_step_within_bounds, 0, NUM_ARCHS);
    tcase_add_loop_test(tc, training_graphs_change_nothing, 0, 2 * NUM_ARCHS);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(backend_model_suite()); }
