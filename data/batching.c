#include "data/batching.h"

#include <stdlib.h>
#include <string.h>

void luna_batching_options_init(luna_batching_options *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 4096;
    o->required_batch_size_multiple = 8;
    o->max_source_positions = 1024;
    o->max_target_positions = 1024;
    o->skip_invalid = true;
    o->shuffle = true;
    o->seed = 1;
    o->num_shards = 1;
    o->shard_id = 0;
}

/* ---- deterministic shuffling ------------------------------------------------------------------
 */

/* SplitMix64 (Steele, Lea, Flood 2014): tiny, statistically solid for shuffling, and fully
 * specified here so a data order never depends on a library's RNG implementation. */
typedef struct {
    uint64_t state;
} shuffle_rng;

static uint64_t splitmix64(shuffle_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Independent streams for (seed, epoch, purpose). */
static shuffle_rng rng_for(uint64_t seed, uint64_t epoch, uint64_t purpose) {
    shuffle_rng r = {seed};
    r.state = splitmix64(&r) ^ (epoch * 0xD1B54A32D192ED03ull);
    r.state = splitmix64(&r) ^ (purpose * 0x8CB92BA72F3D8DD7ull);
    splitmix64(&r);
    return r;
}

/* Uniform in [0, bound) without modulo bias. */
static uint64_t below(shuffle_rng *r, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t x = splitmix64(r);
        if (x >= threshold) return x % bound;
    }
}

/* perm = a uniformly random permutation of 0..n-1 (Fisher-Yates). */
static void permutation(uint32_t *perm, size_t n, shuffle_rng *r) {
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)below(r, i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

enum { PURPOSE_TIES = 1, PURPOSE_EPOCH = 2 };

/* ---- the plan ----------------------------------------------------------------------------------
 */

typedef struct {
    int32_t src, tgt;
    uint32_t tie, idx;
} sort_key;

static int cmp_key(const void *pa, const void *pb) {
    const sort_key *a = pa, *b = pb;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    if (a->tgt != b->tgt) return a->tgt < b->tgt ? -1 : 1;
    return (a->tie > b->tie) - (a->tie < b->tie);
}

void luna_batch_plan_free(luna_batch_plan *p) {
    if (!p) return;
    free(p->offsets);
    free(p->indices);
    free(p);
}

static luna_status check_options(const luna_batching_options *o) {
    if (o->num_shards < 1 || o->shard_id < 0 || o->shard_id >= o->num_shards)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "batching: shard %d of %d is invalid (need 0 <= rank < world size)",
                          o->shard_id, o->num_shards);
    return LUNA_OK;
}

luna_status luna_batch_plan_create_from_sizes(luna_batch_plan **out, const int32_t *src_sizes,
                                              const int32_t *tgt_sizes, size_t count,
                                              const luna_batching_options *o, const char *name) {
    *out = NULL;
    LUNA_TRY(check_options(o));
    if (count > UINT32_MAX)
        return luna_error(LUNA_ERR_UNSUPPORTED, "%s: %zu sentences; batching supports up to 2^32",
                          name, count);
    luna_batch_plan *p = calloc(1, sizeof *p);
    sort_key *keys = malloc((count ? count : 1) * sizeof *keys);
    uint32_t *perm = o->shuffle ? malloc((count ? count : 1) * sizeof *perm) : NULL;
    if (p) {
        p->indices = malloc((count ? count : 1) * sizeof *p->indices);
        p->offsets = malloc((count + 1) * sizeof *p->offsets);
    }
    if (!p || !keys || (o->shuffle && !perm) || !p->indices || !p->offsets) {
        free(keys);
        free(perm);
        luna_batch_plan_free(p);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory batching %zu sentences", name,
                          count);
    }
    /* 1. order. fairseq: indices = permutation(n) (shuffle) or arange(n); then stable sorts by
     * tgt and by src; so ties fall back to the position in `indices`. */
    if (o->shuffle) {
        shuffle_rng r = rng_for(o->seed, 0, PURPOSE_TIES);
        permutation(perm, count, &r);
    }
    for (size_t k = 0; k < count; k++) {
        uint32_t idx = perm ? perm[k] : (uint32_t)k;
        keys[k] = (sort_key){src_sizes[idx], tgt_sizes[idx], (uint32_t)k, idx};
    }
    free(perm);
    qsort(keys, count, sizeof *keys, cmp_key);

    /* 2. filter. In reject mode the error names the first offending pair in corpus order. */
    luna_status st = LUNA_OK;
    size_t m = 0;
    const sort_key *worst = NULL;
    for (size_t k = 0; k < count; k++) {
        const sort_key *e = &keys[k];
        bool too_long = (o->max_source_positions > 0 && e->src > o->max_source_positions) ||
                        (o->max_target_positions > 0 && e->tgt > o->max_target_positions);
        bool too_big = o->max_tokens > 0 && (e->src > o->max_tokens || e->tgt > o->max_tokens);
        if (!too_long && !too_big)
            p->indices[m++] = e->idx;
        else if (too_long)
            p->num_filtered_positions++;
        else
            p->num_filtered_tokens++;
        if ((too_long || too_big) && (!worst || e->idx < worst->idx)) worst = e;
    }
    if (worst && !o->skip_invalid) {
        bool too_long = (o->max_source_positions > 0 && worst->src > o->max_source_positions) ||
                        (o->max_target_positions > 0 && worst->tgt > o->max_target_positions);
        st = luna_error(
            LUNA_ERR_INVALID_ARGUMENT,
            "%s: sentence %u: source %d / target %d tokens exceed %s "
            "(%lld / %lld) (%zu pairs in all; raise the limit, or let luna skip such pairs)",
            name, worst->idx, worst->src, worst->tgt,
            too_long ? "max_source_positions / max_target_positions" : "max_tokens",
            (long long)(too_long ? o->max_source_positions : o->max_tokens),
            (long long)(too_long ? o->max_target_positions : o->max_tokens),
            p->num_filtered_positions + p->num_filtered_tokens);
    }
    free(keys);
    if (st != LUNA_OK) {
        luna_batch_plan_free(p);
        return st;
    }

    /* 3. batch_by_size over the m kept sentences, in order; batches are contiguous runs. */
    const int64_t mult = o->required_batch_size_multiple > 1 ? o->required_batch_size_multiple : 1;
    size_t start = 0;
    int64_t sample_len = 0;
#define NUM_TOKENS(i)                                                                              \
    ((int64_t)(src_sizes[p->indices[i]] > tgt_sizes[p->indices[i]] ? src_sizes[p->indices[i]]      \
                                                                   : tgt_sizes[p->indices[i]]))
    for (size_t i = 0; i < m; i++) {
        int64_t nt = NUM_TOKENS(i);
        if (nt > sample_len) sample_len = nt;
        for (;;) {
            int64_t len = (int64_t)(i - start);
            bool full = len > 0 && ((o->max_sentences > 0 && len == o->max_sentences) ||
                                    (o->max_tokens > 0 && (len + 1) * sample_len > o->max_tokens));
            if (!full) break;
            int64_t mod_len = mult * (len / mult) > len % mult ? mult * (len / mult) : len % mult;
            p->offsets[p->num_batches++] = start;
            start += (size_t)mod_len;
            sample_len = nt;
            for (size_t j = start; j < i; j++)
                if (NUM_TOKENS(j) > sample_len) sample_len = NUM_TOKENS(j);
        }
    }
#undef NUM_TOKENS
    if (start < m) p->offsets[p->num_batches++] = start;
    p->offsets[p->num_batches] = m;
    p->num_sentences = m;
    *out = p;
    return LUNA_OK;
}

luna_status luna_batch_plan_create(luna_batch_plan **out, const luna_pair_dataset *ds,
                                   const luna_batching_options *o) {
    return luna_batch_plan_create_from_sizes(out, luna_pair_dataset_src_sizes(ds),
                                             luna_pair_dataset_tgt_sizes(ds),
                                             luna_pair_dataset_count(ds), o, "data-bin split");
}

/* ---- the iterator ------------------------------------------------------------------------------
 */

struct luna_batch_iterator {
    const luna_batch_plan *plan;
    luna_batching_options opts;
    uint64_t epoch, offset;
    uint32_t *order; /* (num_batches) this epoch's batch order */
};

void luna_batch_iterator_free(luna_batch_iterator *it) {
    if (!it) return;
    free(it->order);
    free(it);
}

size_t luna_batch_iterator_epoch_length(const luna_batch_iterator *it) {
    size_t n = it->plan->num_batches, w = (size_t)it->opts.num_shards;
    return (n + w - 1) / w;
}

luna_status luna_batch_iterator_seek(luna_batch_iterator *it, uint64_t epoch, uint64_t offset) {
    if (epoch < 1)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "batch iterator: epochs count from 1, got %llu",
                          (unsigned long long)epoch);
    if (offset > luna_batch_iterator_epoch_length(it))
        return luna_error(
            LUNA_ERR_INVALID_ARGUMENT,
            "batch iterator: offset %llu is past the end of the epoch "
            "(%zu batches) (the data or the batching options changed since the checkpoint)",
            (unsigned long long)offset, luna_batch_iterator_epoch_length(it));
    size_t n = it->plan->num_batches;
    if (it->opts.shuffle) {
        shuffle_rng r = rng_for(it->opts.seed, epoch, PURPOSE_EPOCH);
        permutation(it->order, n, &r);
    } else {
        for (size_t i = 0; i < n; i++)
            it->order[i] = (uint32_t)i;
    }
    it->epoch = epoch;
    it->offset = offset;
    return LUNA_OK;
}

luna_status luna_batch_iterator_create(luna_batch_iterator **out, const luna_batch_plan *plan,
                                       const luna_batching_options *o) {
    *out = NULL;
    LUNA_TRY(check_options(o));
    luna_batch_iterator *it = calloc(1, sizeof *it);
    if (it) it->order = malloc((plan->num_batches ? plan->num_batches : 1) * sizeof *it->order);
    if (!it || !it->order) {
        luna_batch_iterator_free(it);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "batch iterator: out of memory");
    }
    it->plan = plan;
    it->opts = *o;
    luna_status st = luna_batch_iterator_seek(it, 1, 0);
    if (st != LUNA_OK) {
        luna_batch_iterator_free(it);
        return st;
    }
    *out = it;
    return LUNA_OK;
}

bool luna_batch_iterator_next(luna_batch_iterator *it, const uint32_t **ids, size_t *n,
                              bool *repeated) {
    size_t nb = it->plan->num_batches;
    if (nb == 0 || it->offset >= luna_batch_iterator_epoch_length(it)) return false;
    size_t pos = (size_t)it->offset * (size_t)it->opts.num_shards + (size_t)it->opts.shard_id;
    if (repeated) *repeated = pos >= nb;
    size_t b = it->order[pos % nb];
    *ids = it->plan->indices + it->plan->offsets[b];
    *n = it->plan->offsets[b + 1] - it->plan->offsets[b];
    it->offset++;
    return true;
}

void luna_batch_iterator_position(const luna_batch_iterator *it, uint64_t *epoch,
                                  uint64_t *offset) {
    *epoch = it->epoch;
    *offset = it->offset;
}
