/* One pass of the model (model/seq2seq.c) in its parts, for the parts that live in their own
 * files: the loss over the output projection in row chunks (seq2seq_loss.c) and the training pass
 * replayed as graphs (seq2seq_graphs.c).
 *
 * A pass is: prepare (host checks, every upload, the buffers the parts share) → layers (the
 * encoder and decoder) → loss (its GEMMs are as many rows as the batch has non-pad targets) →
 * backward → the loss sums. Only prepare and the loss depend on the batch's contents beyond its
 * shape; the layers and the backward launch the same work for every batch of one shape. */
#ifndef LUNA_MODEL_SEQ2SEQ_INTERNAL_H
#define LUNA_MODEL_SEQ2SEQ_INTERNAL_H

#include "model/seq2seq.h"

typedef struct {
    luna_seq2seq *m;
    luna_pass ps;
    luna_layer_dims dims;
    bool grads; /* a backward pass follows */
    int d, V;
    int32_t *src, *prev, *tgt;    /* device tokens */
    luna_act *x_src, *p0, *x_tgt; /* [B,m,d], [B,L,d], [B,n,d] */
    luna_act *enc_out, *enc_p;    /* final encoder x and p */
    luna_act *dec_out;            /* final decoder x [B,n,d] */
    luna_arena_mark logits_mark;
    luna_act *logits; /* [N,V] when the caller wants them (keep_logits), else NULL */
    /* the loss's rows (seq2seq_loss.c): the non-pad targets, packed when there are pad ones */
    int64_t loss_rows;          /* loss/nll entries written (non-pad rows) */
    int64_t loss_cap;           /* entries of each: nll starts loss_cap after loss */
    bool packed;                /* loss_rows < N: the rows are gathered first */
    int32_t *row_idx, *row_inv; /* device [N] each: packed row → row, row → packed row */
    int32_t *row_tgt;           /* device [N]: the packed rows' targets */
    float *loss, *nll, *lse;    /* [N] each, fp32 */
    /* activation gradients (training only), allocated before the activations */
    luna_act *gx_dec[2], *gx_enc[2], *gp[2], *ge;
} luna_seq2seq_pass;

/* seq2seq.c: token ids (or indices) to a new arena buffer of cap ints, the first count of them
 * from host (luna_mem_ids_from_host). */
luna_status luna_seq2seq_upload_ids(luna_seq2seq_pass *s, int32_t **dev, const int32_t *host,
                                    int64_t count, int64_t cap);

/* seq2seq.c: the encoder and decoder layers of a prepared pass, up to the loss (s->dec_out, the
 * loss's log-sum-exp buffer s->lse, s->logits_mark); and the backward pass after the loss. */
luna_status luna_seq2seq_pass_layers(luna_seq2seq_pass *s);
luna_status luna_seq2seq_pass_backward(luna_seq2seq_pass *s);

/* seq2seq_loss.c. Prepare's part: the packed rows' indices and targets, uploaded (their buffers
 * are [N] whatever the count, so that the pass's addresses depend on its shape alone). */
luna_status luna_seq2seq_loss_upload(luna_seq2seq_pass *s, const luna_batch *b);
/* The output projection and the loss over the rows in chunks, with their backward when s->grads
 * (the decoder output's gradient into s->gx_dec[0]); the arena back at s->logits_mark after. */
luna_status luna_seq2seq_loss(luna_seq2seq_pass *s);
/* The loss and nll sums read back to the host. */
luna_status luna_seq2seq_loss_read(luna_seq2seq_pass *s, double *loss_sum, double *nll_sum);

/* seq2seq_graphs.c: whether a training pass replays as graphs, and the pass that does. */
bool luna_seq2seq_pass_graphed(const luna_seq2seq *m, bool training, bool grads, bool dev_sums);
luna_status luna_seq2seq_pass_run_graphed(luna_seq2seq_pass *s);

#endif
