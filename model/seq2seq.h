/* The full sequence-to-sequence model (spec §1, §4, §8): shared embeddings, the encoder (which
 * also packs P), the decoder, tied output projection and the label-smoothed cross entropy.
 *
 * Forward (Luna):
 *   x_src = drop(√d·E[src] + pos(src))                                 [B, m, d]
 *   P0    = drop(broadcast_B(√d·P[:L] + sinusoid(0..L-1)))              [B, L, d]
 *           L = min(l, longest source) (dynamic projection; P mask j ≥ src_len_b) or l (fixed)
 *   (e, p) = encoder layers (x_src, P0)
 *   x_tgt = drop(√d·E[prev] + pos(prev))                                [B, n, d]
 *   x     = decoder layers (x_tgt, p, e)        (each decoder layer updates p by packing e)
 *   logits = x·Eᵀ                                                       [B, n, V]
 *   loss  = Σ_{non-pad targets} (1−ε)(−log p_y) + (ε/V) Σ_v (−log p_v)   (nats)
 * The transformer baseline is the same without P and with softmax attention.
 *
 * Backward accumulates the gradient of the SUMMED loss into the model's gradient buffer (the
 * trainer normalises by the number of target tokens of the whole update). The shared embedding's
 * gradient sums the encoder input, decoder input and output projection contributions.
 *
 * Dropout uses keys (seed, step, site): the same (seed, step) reproduces the same masks on any
 * backend or thread count; callers should give every micro-batch its own `step` value.
 */
#ifndef LUNA_SEQ2SEQ_H
#define LUNA_SEQ2SEQ_H

#include <stdint.h>

#include "core/graph_cache.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/param_table.h"
#include "model/pass.h"

/* A batch of right-padded sentences (host memory). Sources end with </s>; prev_output_tokens is
 * the target shifted right (starting with </s>), right-padded like the target. */
typedef struct {
    int B, src_len, tgt_len;           /* sentences, m, n */
    const int32_t *src_tokens;         /* [B, m] */
    const int32_t *src_lengths;        /* [B] non-pad tokens of each source (incl. </s>) */
    const int32_t *prev_output_tokens; /* [B, n] */
    const int32_t *target;             /* [B, n] */
} luna_batch;

typedef struct luna_seq2seq luna_seq2seq;

/* Called by the backward pass when the gradients of parameter tensors [first, first + count) of
 * the table (model/param_table.h) are final for this pass: their ops are issued on the backend
 * and no later op of the pass writes them. Data-parallel training starts the all-reduce of a
 * gradient bucket from it while the rest of the backward runs (trainer/grad_buckets.h). The
 * last call of a pass names every tensor. An error stops the backward. */
typedef luna_status (*luna_grads_ready_fn)(void *ctx, int first, int count);

struct luna_seq2seq {
    luna_config config;
    luna_backend *be;
    luna_params *params; /* params->data / params->grad: the two flat buffers */
    luna_arena *arena;   /* activations of one forward/backward */
    uint64_t seed;       /* dropout seed */
    /* per-pass bookkeeping (valid during a call) */
    luna_encoder_layer_act *enc_act;
    luna_decoder_layer_act *dec_act;
    luna_arena_mark *enc_mark, *dec_mark;
    /* gradient-readiness notification (NULL: none); layer i's tensors are the table's
     * [enc_first[i], enc_first[i] + enc_count[i]) (dec_ likewise) */
    luna_grads_ready_fn grads_ready;
    void *grads_ready_ctx;
    int *enc_first, *enc_count, *dec_first, *dec_count;
    /* logits per chunk of the loss (seq2seq_loss.c); 0: the default, 2^26 */
    int64_t loss_chunk_elems;
    /* training passes replayed as graphs (seq2seq_graphs.c), NULL: none; the dropout step they
     * read (a device uint64) */
    luna_graph_cache *graphs;
    uint64_t *graph_step;
};

/* Build the model: parameters initialised per spec §5 with seed 1 (see luna_seq2seq_init),
 * gradients zero, an activation arena on the backend's device. */
luna_status luna_seq2seq_create(luna_seq2seq **out, luna_backend *be, const luna_config *config);
/* For inference (model/checkpoint.c loads the parameters next): zero parameters and no gradient
 * buffer (luna_params_create_for_inference); luna_seq2seq_backward then fails. */
luna_status luna_seq2seq_create_for_inference(luna_seq2seq **out, luna_backend *be,
                                              const luna_config *config);
/* Another decoder of `shared`'s model on backend be (the same device): its parameters shared,
 * not copied (luna_params_create_shared: read only, and `shared` must outlive it), its own
 * activations; for translators of one model on several threads. */
luna_status luna_seq2seq_create_shared(luna_seq2seq **out, luna_backend *be,
                                       const luna_seq2seq *shared);
void luna_seq2seq_free(luna_seq2seq *model);

/* Re-initialise all parameters from `seed` and use it for dropout (the trainer's --seed). */
luna_status luna_seq2seq_init(luna_seq2seq *model, uint64_t seed);

/* Training step on one batch: forward with dropout, backward, gradients ADDED to
 * model->params->grad. *loss_sum / *nll_sum: summed over non-pad target tokens, in nats. */
luna_status luna_seq2seq_forward_backward(luna_seq2seq *model, const luna_batch *batch,
                                          uint64_t step, double *loss_sum, double *nll_sum);

/* The same training step without reading anything back: the batch's loss and nll sums are ADDED
 * to sums[0] and sums[1], device doubles (core/backend.h loss_sums; the trainer passes
 * luna_optimizer_loss_sums, which the optimizer's step reads back and checks for finiteness).
 * Equal to the host's sums on the CPU backend. */
luna_status luna_seq2seq_forward_backward_sums(luna_seq2seq *model, const luna_batch *batch,
                                               uint64_t step, double *sums);

/* Validation's form of it: forward only, no dropout, the batch's loss and nll sums ADDED to the
 * device doubles sums[0], sums[1] (nothing read back). */
luna_status luna_seq2seq_forward_sums(luna_seq2seq *model, const luna_batch *batch, double *sums);

/* Same without dropout (for gradient checks and reference comparisons). */
luna_status luna_seq2seq_forward_backward_eval(luna_seq2seq *model, const luna_batch *batch,
                                               double *loss_sum, double *nll_sum);

/* Validation: forward only, no dropout. logits (host [B, n, V], fp32: needs a backend with fp32
 * activations) may be NULL. */
luna_status luna_seq2seq_forward(luna_seq2seq *model, const luna_batch *batch, double *loss_sum,
                                 double *nll_sum, float *logits);

LUNA_MUST_CHECK luna_status luna_seq2seq_zero_grad(luna_seq2seq *model);

/* Backward passes report finished gradients to fn (NULL: stop reporting): after each decoder
 * layer (top first), after each encoder layer, and once for all tensors at the end. */
void luna_seq2seq_set_grads_ready(luna_seq2seq *model, luna_grads_ready_fn fn, void *ctx);

/* Training passes as graphs (a backend with graphs, core/graph_cache.h; not with a Linformer
 * encoder, whose GEMMs are sized by each source's length): a training pass
 * (luna_seq2seq_forward_backward_sums) with no gradient-readiness callback runs its layers and its
 * backward as two graphs per batch shape (sentences, source and target lengths, P's length),
 * captured on the shape's second pass and replayed from the third; the loss between them stays
 * eager (its GEMMs are as many rows as the batch has non-pad targets). The dropout step is read
 * from device memory. Results equal the eager passes' bit for bit. On by default where the
 * backend has graphs, unless the environment has LUNA_STEP_GRAPHS=0. */
luna_status luna_seq2seq_set_graphs(luna_seq2seq *model, bool on);
bool luna_seq2seq_uses_graphs(const luna_seq2seq *model);
void luna_seq2seq_graph_counts(const luna_seq2seq *model, int64_t *replays, int64_t *captures,
                               int64_t *failed);

/* Activation arena high-water mark (bytes) since creation or the last reset. */
size_t luna_seq2seq_activation_peak(const luna_seq2seq *model);
void luna_seq2seq_reset_activation_peak(luna_seq2seq *model);

/* The encoder (spec §1, §4), shared by training and decoding: x_src = drop(√d·E[src] +
 * pos(src)) [B, m, d], P0 = drop(broadcast_B(√d·P[:L] + sinusoid(0..L-1))) [B, L, d] (NULL when
 * dims->L = 0), then the encoder layers, each layer's activations in acts[i] (marks[i]: the arena
 * position before layer i, for backward; marks may be NULL). src: device tokens [B, m]. The
 * final encoder output and P in *enc_out, *enc_p. Dropout only when ps->training. */
luna_status luna_seq2seq_encode(const luna_pass *ps, const luna_config *c, const luna_weights *w,
                                const int32_t *src, const luna_layer_dims *dims,
                                luna_encoder_layer_act *acts, luna_arena_mark *marks,
                                luna_act **x_src, luna_act **p0, luna_act **enc_out,
                                luna_act **enc_p);

/* A layer's P input from a learned P [l, d] (device fp32): out = drop(broadcast_B(√d·P[:L] +
 * sinusoid(0..L-1))) [B, L, d], dropout site `site` (only when ps->training). P0 of the encoder;
 * with non_contextual_projection every layer's P (paper Table 5). */
luna_status luna_seq2seq_project(const luna_pass *ps, const float *P, int B, int L, int d,
                                 uint32_t site, luna_act **out);

/* Number of non-pad target tokens of a batch. */
int64_t luna_batch_target_tokens(const luna_batch *batch, int padding_idx);

#endif
