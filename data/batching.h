/* Token-budget batching and the epoch iterator, after fairseq's
 * LanguagePairDataset.ordered_indices + filter_by_size + batch_by_size + EpochBatchIterator.
 *
 * 1. Order: sentences sorted by source length, then target length (fairseq sorts by target with
 *    a stable sort and then by source: the source length is the primary key). Ties keep a
 *    seeded random order when shuffling (fairseq's permutation under numpy_seed(seed)), else the
 *    index order.
 * 2. Filter: pairs with source > max_source_positions or target > max_target_positions tokens
 *    (</s> included), or longer than max_tokens, are skipped and counted, or rejected with an
 *    error naming the first one (skip_invalid = false).
 * 3. Batches are cut greedily as fairseq's batch_by_size: a batch is full when adding a sentence
 *    would make  (sentences) * (longest max(src, tgt) in the batch) > max_tokens  or reach
 *    max_sentences; the emitted part is a multiple of required_batch_size_multiple when it can be,
 *    the rest carries over. (Unlike fairseq, the carried-over rest is re-checked, so no batch
 *    ever exceeds max_tokens padded tokens.) The batches are fixed for the whole run.
 * 4. Each epoch (1-based) shuffles the batch order with a generator seeded by (seed, epoch), then
 *    rank r of W data-parallel ranks takes batches r, r+W, r+2W, ... Every rank gets
 *    ceil(num_batches / W) batches: the missing ones at the end are taken from the start of the
 *    epoch's order again and flagged `repeated` (fairseq instead feeds empty dummy batches), so
 *    all ranks step together and no batch is lost.
 * 5. The position (epoch, offset) can be saved and restored: the epoch's order is a pure function
 *    of (seed, epoch), so a resumed run continues with exactly the batches it would have seen.
 */
#ifndef LUNA_DATA_BATCHING_H
#define LUNA_DATA_BATCHING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/pair_dataset.h"
#include "core/status.h"

typedef struct {
    int64_t max_tokens;                   /* padded tokens per batch; <= 0: unlimited */
    int32_t max_sentences;                /* <= 0: unlimited */
    int32_t required_batch_size_multiple; /* fairseq's default is 8; <= 1: none */
    int32_t max_source_positions;         /* <= 0: unlimited */
    int32_t max_target_positions;         /* <= 0: unlimited */
    bool skip_invalid;                    /* skip (and count) too-long pairs instead of failing */
    bool shuffle;                         /* random tie order and per-epoch batch order */
    uint64_t seed;
    int32_t num_shards, shard_id; /* data-parallel world size and rank */
} luna_batching_options;

/* max_tokens 4096, no sentence cap, multiple 8, positions 1024/1024, skip_invalid, shuffle,
 * seed 1, one shard. */
void luna_batching_options_init(luna_batching_options *o);

/* The fixed batches of a dataset. */
typedef struct {
    size_t num_batches;
    size_t *offsets;               /* (num_batches + 1) into indices */
    uint32_t *indices;             /* sentence ids, batch after batch */
    size_t num_sentences;          /* sentences in batches */
    size_t num_filtered_positions; /* skipped for exceeding max_source/target_positions */
    size_t num_filtered_tokens;    /* skipped for not fitting max_tokens on their own */
} luna_batch_plan;

luna_status luna_batch_plan_create(luna_batch_plan **out, const luna_pair_dataset *ds,
                                   const luna_batching_options *o);
/* The same from raw size arrays (what the plan actually depends on); `name` for messages. */
luna_status luna_batch_plan_create_from_sizes(luna_batch_plan **out, const int32_t *src_sizes,
                                              const int32_t *tgt_sizes, size_t count,
                                              const luna_batching_options *o, const char *name);
void luna_batch_plan_free(luna_batch_plan *p);

/* Iterates one shard's batches epoch after epoch. The plan must outlive the iterator. */
typedef struct luna_batch_iterator luna_batch_iterator;

luna_status luna_batch_iterator_create(luna_batch_iterator **out, const luna_batch_plan *plan,
                                       const luna_batching_options *o);
void luna_batch_iterator_free(luna_batch_iterator *it);

/* Batches per epoch on this shard. */
size_t luna_batch_iterator_epoch_length(const luna_batch_iterator *it);

/* Position the iterator at batch `offset` (0-based, on this shard) of `epoch` (>= 1). A fresh
 * iterator starts at (1, 0). */
luna_status luna_batch_iterator_seek(luna_batch_iterator *it, uint64_t epoch, uint64_t offset);

/* The next batch of the current epoch: sets ids/n (pointing into the plan) and repeated, returns
 * true; returns false at the end of the epoch (then seek to (epoch + 1, 0) to go on). */
bool luna_batch_iterator_next(luna_batch_iterator *it, const uint32_t **ids, size_t *n,
                              bool *repeated);

/* Where the next call to next() will continue: save these two numbers in a checkpoint. */
void luna_batch_iterator_position(const luna_batch_iterator *it, uint64_t *epoch, uint64_t *offset);

#endif
