/* Gradient all-reduce in buckets, overlapped with the backward pass (PyTorch DDP's scheme on
 * luna's flat gradient buffer, model/param_table.h).
 *
 * The table's tensors are cut into buckets of at most `bucket_bytes` (a larger tensor is a bucket
 * of its own), walking the table from its end: the backward pass finishes the decoder's top layer
 * first and the shared embedding last, so this order lets buckets fill in the order the backward
 * completes them. Each bucket is a contiguous range of the gradient buffer, reduced in place by
 * one reduce_start() call. During the last micro-batch of an update ("armed"), the model reports
 * finished tensors (luna_seq2seq_set_grads_ready) and a bucket starts as soon as all its tensors
 * are done; finish() starts those left (all of them when not armed, e.g. bucketing off), sums the
 * update's statistics beside them and waits.
 *
 * Every rank starts the same buckets in the same order (the layer order is fixed), which is what
 * the collectives need; a rank that failed mid-update still calls finish(), so its peers are
 * never left waiting in a bucket. */
#ifndef LUNA_TRAINER_GRAD_BUCKETS_H
#define LUNA_TRAINER_GRAD_BUCKETS_H

#include <stdbool.h>
#include <stddef.h>

#include "model/seq2seq.h"
#include "trainer/communicator.h"

typedef struct luna_grad_buckets luna_grad_buckets;

/* bucket_bytes 0: one bucket for the whole buffer, reduced after the backward (no overlap). */
luna_status luna_grad_buckets_create(luna_grad_buckets **out, luna_communicator *comm,
                                     luna_seq2seq *model, size_t bucket_bytes);
void luna_grad_buckets_free(luna_grad_buckets *b);

/* The next backward pass is the update's last: start buckets as the model reports them. */
void luna_grad_buckets_arm(luna_grad_buckets *b);
/* Start every bucket not yet started, sum stats[n] across ranks with them and wait for all. */
luna_status luna_grad_buckets_finish(luna_grad_buckets *b, double *stats, size_t n);

int luna_grad_buckets_count(const luna_grad_buckets *b);
size_t luna_grad_buckets_bytes(const luna_grad_buckets *b); /* the configured size */
/* Buckets started before the backward pass ended, in the last finished update. */
int luna_grad_buckets_started_early(const luna_grad_buckets *b);

#endif
