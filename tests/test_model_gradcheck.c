/* Whole-model finite-difference gradient checks on tiny configurations (independent of the
 * PyTorch fixtures): every parameter tensor gets a few sampled entries checked against central
 * differences of the summed label-smoothed loss. Also: dropout reproducibility and thread-count
 * independence of a training step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/seq2seq.h"
#include "tests/test_util.h"

enum { B = 3, M = 6, N = 6, V = 23 };

typedef struct {
    int32_t src[B * M], src_len[B], prev[B * N], tgt[B * N];
    luna_batch batch;
} test_batch;

/* Right-padded sentences of different lengths, sources ending with </s> (2). */
static void make_batch(test_batch *t, const int *src_lens, const int *tgt_lens, uint64_t seed) {
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

static luna_config tiny(const char *arch) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, arch), LUNA_OK);
    c.vocab_size = V;
    c.encoder_embed_dim = c.decoder_embed_dim = 16;
    c.encoder_ffn_embed_dim = c.decoder_ffn_embed_dim = 24;
    c.encoder_attention_heads = c.decoder_attention_heads = 2;
    c.dropout = c.attention_dropout = c.activation_dropout = 0.0;
    return c;
}

typedef struct {
    luna_seq2seq *model;
    const luna_batch *batch;
    bool training;
    uint64_t step;
} loss_ctx;

static double eval_loss(loss_ctx *ctx) {
    double loss;
    if (ctx->training) {
        /* The same dropout masks as the analytic pass: same (seed, step). */
        ck_assert_int_eq(
            luna_seq2seq_forward_backward(ctx->model, ctx->batch, ctx->step, &loss, NULL), LUNA_OK);
    } else {
        ck_assert_int_eq(luna_seq2seq_forward(ctx->model, ctx->batch, &loss, NULL, NULL), LUNA_OK);
    }
    return loss;
}

/* Check `samples` entries of every tensor. Returns the worst scaled error. */
static double check_model(const char *what, luna_config c, const test_batch *tb, bool training,
                          int samples) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, 11), LUNA_OK);
    /* Make LayerNorm and P gains non-trivial so their gradients are exercised generically. */
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 5);
    luna_params *p = m->params;
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        if (strstr(t->name, "layer_norm"))
            for (size_t j = 0; j < t->numel; j++)
                p->data[t->offset + j] += luna_test_uniform(&rng, -0.3f, 0.3f);
        /* ReLU units decisively on or off (fc1 biases ±2): finite differences then rarely cross
         * a kink, where the loss has no derivative. Both branches are still exercised. */
        if (strstr(t->name, "fc1.bias"))
            for (size_t j = 0; j < t->numel; j++)
                p->data[t->offset + j] = j % 2 ? -2.0f : 2.0f;
    }
    loss_ctx ctx = {.model = m, .batch = &tb->batch, .training = training, .step = 3};
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    double loss;
    if (training)
        ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb->batch, ctx.step, &loss, NULL),
                         LUNA_OK);
    else
        ck_assert_int_eq(luna_seq2seq_forward_backward_eval(m, &tb->batch, &loss, NULL), LUNA_OK);
    float *grad = malloc(p->num_params * sizeof(float));
    memcpy(grad, p->grad, p->num_params * sizeof(float));
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        double gmax = 0;
        for (size_t j = 0; j < t->numel; j++)
            gmax = fmax(gmax, fabs(grad[t->offset + j]));
        if (!t->has_grad) {
            ck_assert_msg(gmax == 0.0, "%s: %s should get no gradient", what, t->name);
            continue;
        }
        /* (1) Directional derivative along a random ±1 direction: the whole tensor at once,
         * far above the fp32 noise of the loss (~1e-6 absolute, ~1e-3 in fd at these steps).
         * Embedding and P enter scaled by √d: smaller steps there. The loss is not smooth (ReLU
         * kinks); a kink crossed by a perturbation spoils that (direction, step), so up to two
         * directions x three steps are tried and the best is judged — a wrong gradient is wrong
         * along every direction. */
        float *x0 = p->data + t->offset;
        float *saved = malloc(t->numel * sizeof(float));
        signed char *dir = malloc(t->numel);
        memcpy(saved, x0, t->numel * sizeof(float));
        double fd = 0, an = 0, l1 = 0, err = INFINITY;
        for (size_t j = 0; j < t->numel; j++)
            l1 += fabs(grad[t->offset + j]);
        for (int attempt = 0; attempt < 2 && err >= 0.01; attempt++) {
            double an_k = 0;
            for (size_t j = 0; j < t->numel; j++) {
                dir[j] = luna_test_uniform(&rng, 0, 1) < 0.5f ? -1 : 1;
                an_k += dir[j] * (double)grad[t->offset + j];
            }
            for (int k = 0; k < 3; k++) {
                const float h = (i < 2 ? 1e-4f : 2.5e-4f) * (float)(1 << k);
                for (size_t j = 0; j < t->numel; j++)
                    x0[j] = saved[j] + h * dir[j];
                double up = eval_loss(&ctx);
                for (size_t j = 0; j < t->numel; j++)
                    x0[j] = saved[j] - h * dir[j];
                double down = eval_loss(&ctx);
                memcpy(x0, saved, t->numel * sizeof(float));
                double fdk = (up - down) / (2.0 * h);
                double e = fabs(fdk - an_k) / (fabs(an_k) + 0.005 * l1 + 0.25);
                if (e < err) {
                    err = e;
                    fd = fdk;
                    an = an_k;
                }
            }
        }
        if (err > worst) {
            worst = err;
            worst_name = t->name;
        }
        ck_assert_msg(err < 0.01,
                      "%s: %s: directional derivative: finite difference %.7g vs analytic %.7g "
                      "(sum |g| %.3g)",
                      what, t->name, fd, an, l1);
        free(dir);
        free(saved);
        /* (2) A few single entries, with a tolerance for fp32 noise and ReLU kinks. */
        for (int s = 0; s < samples; s++) {
            size_t j = (size_t)luna_test_uniform(&rng, 0, (float)t->numel - 1e-3f);
            if (i == 0) { /* embedding: a row that is used (tokens 2, 4.., not padding row 1) */
                int row = 4 + (int)luna_test_uniform(&rng, 0, V - 4 - 1e-3f);
                j = (size_t)row * (size_t)t->shape[1] + j % (size_t)t->shape[1];
            }
            float *x = p->data + t->offset + j;
            float keep = *x;
            const float he = i < 2 ? 2.5e-3f : 1e-2f;
            *x = keep + he;
            double u = eval_loss(&ctx);
            *x = keep - he;
            double dn = eval_loss(&ctx);
            *x = keep;
            double fde = (u - dn) / ((double)(keep + he) - (double)(keep - he));
            double ane = grad[t->offset + j];
            ck_assert_msg(fabs(fde - ane) <= 0.1 * fabs(ane) + 0.05 * gmax + 2e-4,
                          "%s: %s[%zu]: finite difference %.6g vs analytic %.6g (tensor max "
                          "|g| %.3g)",
                          what, t->name, j, fde, ane, gmax);
        }
    }
    printf("gradcheck %-28s loss %.5f, %d tensors (+%d entries each), worst directional error %.2e "
           "(%s)\n",
           what, loss, p->num_tensors, samples, worst, worst_name);
    free(grad);
    luna_seq2seq_free(m);
    luna_backend_free(be);
    return worst;
}

static const int src_lens[B] = {5, 3, 6}, tgt_lens[B] = {4, 6, 2};

START_TEST(gradcheck_luna_tied_softplus_dynamic) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 1);
    luna_config c = tiny("luna_tiny"); /* l = 8 > longest source: L = 6 with P masks */
    check_model("luna tied softplus l=8", c, &tb, false, 3);
}
END_TEST

START_TEST(gradcheck_luna_untied_elu_fixed) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 2);
    luna_config c = tiny("luna_tiny");
    c.untie_luna_kv = true;
    c.causal_activation = LUNA_CAUSAL_ELU;
    c.fix_projection_length = true;
    check_model("luna untied elu fixed l=8", c, &tb, false, 3);
}
END_TEST

START_TEST(gradcheck_luna_short_projection) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 3);
    luna_config c = tiny("luna_tiny");
    c.projection_length = 4; /* l < longest source; sentence 1 (length 3) masks slot 3 */
    check_model("luna tied l=4", c, &tb, false, 3);
}
END_TEST

/* fairseq models without --share-all-embeddings (converted checkpoints): the decoder's input
 * table and the output projection are parameters of their own. */
START_TEST(gradcheck_luna_untied_embeddings) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 5);
    luna_config c = tiny("luna_tiny");
    c.share_all_embeddings = false;
    c.share_decoder_input_output_embed = false;
    check_model("luna untied embeddings", c, &tb, false, 3);
}
END_TEST

/* Non-contextual P (paper Table 5): every layer's own P gets the gradient of that layer's P
 * input; no P LayerNorm gets one (check_model asserts zero for has_grad = false). With dropout
 * too: each layer's P has its own dropout site. */
START_TEST(gradcheck_luna_non_contextual) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 7);
    luna_config c = tiny("luna_tiny"); /* 2+2 layers: P of encoder layer 1, decoder 0 and 1 */
    c.non_contextual_projection = true;
    check_model("luna non-contextual P", c, &tb, false, 3);
    c.dropout = 0.2;
    c.attention_dropout = 0.15;
    check_model("luna non-contextual dropout", c, &tb, true, 2);
}
END_TEST

/* Linformer encoder self-attention, every sharing mode: E, F get the gradient of the first
 * len_b columns; k = 4 < the longest source (6), N = 7 > it (column 6 of E, F stays unused). */
START_TEST(gradcheck_linformer) {
    static const luna_linformer_sharing modes[] = {LUNA_LINFORMER_HEADWISE, LUNA_LINFORMER_KV,
                                                   LUNA_LINFORMER_LAYERWISE};
    for (int i = 0; i < 3; i++) {
        test_batch tb;
        make_batch(&tb, src_lens, tgt_lens, 8 + (uint64_t)i);
        luna_config c = tiny("linformer_tiny");
        c.linformer_k = 4;
        c.max_source_positions = 7;
        c.linformer_sharing = modes[i];
        char what[64];
        snprintf(what, sizeof what, "linformer %s", luna_linformer_sharing_name(modes[i]));
        check_model(what, c, &tb, false, 3);
    }
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 11);
    luna_config c = tiny("linformer_tiny");
    c.linformer_k = 4;
    c.max_source_positions = 7;
    c.dropout = 0.2;
    c.attention_dropout = 0.15;
    check_model("linformer dropout", c, &tb, true, 2);
}
END_TEST

/* A source longer than Linformer's fixed length is an error naming the limit. */
START_TEST(linformer_too_long) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 12);
    luna_config c = tiny("linformer_tiny");
    c.max_source_positions = 5; /* the longest source has 6 tokens */
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    double loss;
    ck_assert_int_ne(luna_seq2seq_forward(m, &tb.batch, &loss, NULL, NULL), LUNA_OK);
    ck_assert_msg(strstr(luna_error_message(), "exceeds the Linformer maximum of 5"), "%s",
                  luna_error_message());
    luna_seq2seq_free(m);
    luna_backend_free(be);
}
END_TEST

/* Linformer leaves source pads out of the length projection: a sentence's logits are the same
 * alone (no padding) as in a batch padded to a longer source. (Projecting the pad keys too
 * would change them: E's columns past the sentence would multiply pad keys.) */
START_TEST(linformer_padding_invariant) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 13);
    luna_config c = tiny("linformer_tiny");
    c.linformer_k = 4;
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    float *all = malloc(sizeof(float) * B * N * V), *one = malloc(sizeof(float) * N * V);
    double loss;
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &loss, NULL, all), LUNA_OK);
    const int s = 1, len = src_lens[s]; /* 3 tokens, padded to 6 in the batch */
    luna_batch alone = {.B = 1,
                        .src_len = len,
                        .tgt_len = N,
                        .src_tokens = tb.src + s * M,
                        .src_lengths = tb.src_len + s,
                        .prev_output_tokens = tb.prev + s * N,
                        .target = tb.tgt + s * N};
    ck_assert_int_eq(luna_seq2seq_forward(m, &alone, &loss, NULL, one), LUNA_OK);
    double diff = 0;
    for (int i = 0; i < N * V; i++)
        diff = fmax(diff, fabs((double)one[i] - all[s * N * V + i]));
    ck_assert_msg(diff < 1e-5, "padding changed the logits by %g", diff);
    free(all), free(one);
    luna_seq2seq_free(m);
    luna_backend_free(be);
}
END_TEST

START_TEST(gradcheck_transformer) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 4);
    check_model("transformer", tiny("transformer_tiny"), &tb, false, 3);
}
END_TEST

/* With all dropouts on: the backward regenerates exactly the forward's masks at every site. */
START_TEST(gradcheck_with_dropout) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 5);
    luna_config c = tiny("luna_tiny");
    c.dropout = 0.2;
    c.attention_dropout = 0.15;
    c.activation_dropout = 0.1;
    check_model("luna dropout", c, &tb, true, 2);
    luna_config t = tiny("transformer_tiny");
    t.dropout = 0.2;
    t.attention_dropout = 0.15;
    t.activation_dropout = 0.1;
    check_model("transformer dropout", t, &tb, true, 2);
}
END_TEST

/* Same (seed, step): bit-identical loss and gradients, for 1 and 2 threads and with the losses
 * summed on the device (forward_backward_sums); another step or seed gives other masks. */
START_TEST(dropout_reproducible) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 6);
    luna_config c = tiny("luna_tiny");
    c.dropout = c.attention_dropout = c.activation_dropout = 0.1;
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    size_t n = m->params->num_params;
    float *g1 = malloc(n * sizeof(float));
    double l1, l2, l3, l4, nll;
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 10, &l1, &nll), LUNA_OK);
    ck_assert(nll < l1 + 10 && nll > 0);
    memcpy(g1, m->params->grad, n * sizeof(float));
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    luna_backend_cpu_set_threads(be, 2);
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 10, &l2, NULL), LUNA_OK);
    ck_assert(l1 == l2);
    ck_assert_int_eq(memcmp(g1, m->params->grad, n * sizeof(float)), 0);
    /* The trainer's form, the losses added up on the device: the same bits and gradients. */
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    double *sums = luna_mem_alloc(be, 2 * sizeof(double)), got[2] = {0.0, 0.0};
    LUNA_CHECK_OK(luna_mem_from_host(be, sums, got, sizeof got));
    LUNA_CHECK_OK(luna_seq2seq_forward_backward_sums(m, &tb.batch, 10, sums));
    LUNA_CHECK_OK(luna_mem_to_host(be, got, sums, sizeof got));
    ck_assert_msg(got[0] == l1 && got[1] == nll, "sums %.17g %.17g, read back %.17g %.17g", got[0],
                  got[1], l1, nll);
    ck_assert_int_eq(memcmp(g1, m->params->grad, n * sizeof(float)), 0);
    luna_mem_release(be, sums, 2 * sizeof(double));
    /* Gradients accumulate: a second call doubles them. */
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 10, &l2, NULL), LUNA_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabsf(m->params->grad[i] - 2 * g1[i]) <= 1e-5f * fabsf(2 * g1[i]) + 1e-12f,
                      "accumulated gradient %g != 2 x %g", m->params->grad[i], g1[i]);
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 11, &l3, NULL), LUNA_OK);
    ck_assert(l3 != l1);
    m->seed = 99;
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 10, &l4, NULL), LUNA_OK);
    ck_assert(l4 != l1);
    /* Evaluation has no dropout: differs from training, and is deterministic. */
    double e1, e2;
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &e1, NULL, NULL), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &e2, NULL, NULL), LUNA_OK);
    ck_assert(e1 == e2 && e1 != l1);
    free(g1);
    luna_seq2seq_free(m);
    luna_backend_free(be);
}
END_TEST

/* The loss in row chunks (seq2seq.c: logits, loss and the output projection's backward per
 * chunk, the [N, V] logits never whole) equals the loss in one piece: the same loss, nll and
 * validation logits-free loss; gradients within float rounding (the projection's dE is summed
 * chunk by chunk), for a chunk of 5 rows over 18 (3 full chunks and a partial one), with dropout.
 */
START_TEST(loss_chunks_match_one_piece) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 8);
    luna_config c = tiny("luna_tiny");
    c.dropout = c.attention_dropout = c.activation_dropout = 0.1;
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    size_t n = m->params->num_params;
    float *g1 = malloc(n * sizeof(float));
    double l1, n1, l2, n2, e1, e2;
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 3, &l1, &n1), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &e1, NULL, NULL), LUNA_OK);
    memcpy(g1, m->params->grad, n * sizeof(float));
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    m->loss_chunk_elems = 5 * V; /* 5 rows per chunk */
    ck_assert_int_eq(luna_seq2seq_forward_backward(m, &tb.batch, 3, &l2, &n2), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &e2, NULL, NULL), LUNA_OK);
    ck_assert_msg(fabs(l1 - l2) <= 1e-6 * fabs(l1) && fabs(n1 - n2) <= 1e-6 * fabs(n1),
                  "loss %.9g / %.9g, nll %.9g / %.9g", l1, l2, n1, n2);
    ck_assert_msg(fabs(e1 - e2) <= 1e-6 * fabs(e1), "validation loss %.9g / %.9g", e1, e2);
    double worst = 0, gmax = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)m->params->grad[i] - g1[i]);
        if (diff > worst) worst = diff;
        if (fabs(g1[i]) > gmax) gmax = fabs(g1[i]);
    }
    ck_assert(gmax > 0);
    ck_assert_msg(worst <= 1e-5 * gmax, "gradients differ by %g (largest %g)", worst, gmax);
    free(g1);
    luna_seq2seq_free(m);
    luna_backend_free(be);
}
END_TEST

/* Malformed batches are rejected with a clear message, not computed on. */
START_TEST(batch_validation) {
    test_batch tb;
    make_batch(&tb, src_lens, tgt_lens, 7);
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_seq2seq *m;
    luna_config c = tiny("luna_tiny");
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    double loss;
    tb.src_len[1] = 4; /* disagrees with the padding */
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &loss, NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "right-padded"));
    tb.src_len[1] = 3;
    tb.prev[2] = V; /* out of the vocabulary */
    ck_assert_int_eq(luna_seq2seq_forward(m, &tb.batch, &loss, NULL, NULL),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "out of"));
    luna_seq2seq_free(m);
    luna_backend_free(be);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_gradcheck");
    TCase *tc = tcase_create("gradcheck");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gradcheck_luna_tied_softplus_dynamic);
    tcase_add_test(tc, gradcheck_luna_untied_elu_fixed);
    tcase_add_test(tc, gradcheck_luna_short_projection);
    tcase_add_test(tc, gradcheck_luna_untied_embeddings);
    tcase_add_test(tc, gradcheck_luna_non_contextual);
    tcase_add_test(tc, gradcheck_linformer);
    tcase_add_test(tc, linformer_too_long);
    tcase_add_test(tc, linformer_padding_invariant);
    tcase_add_test(tc, gradcheck_transformer);
    tcase_add_test(tc, gradcheck_with_dropout);
    tcase_add_test(tc, dropout_reproducible);
    tcase_add_test(tc, loss_chunks_match_one_piece);
    tcase_add_test(tc, batch_validation);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
