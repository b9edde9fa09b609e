/* Gradient buckets (see grad_buckets.h). */
#include "trainer/grad_buckets.h"

#include <stdlib.h>

typedef struct {
    int first, count; /* tensors [first, first + count) of the table */
    size_t offset, numel;
    int missing; /* tensors not yet reported in this pass */
    bool started;
} bucket;

struct luna_grad_buckets {
    luna_communicator *comm;
    luna_seq2seq *model;
    size_t bucket_bytes;
    bucket *buckets;
    int nbuckets;
    int *bucket_of; /* tensor -> bucket */
    bool *reported; /* tensor -> reported in this pass */
    /* The order buckets start in: the order a full backward pass completes them (simulated at
     * creation from the model's report order). Starting strictly in it keeps the ranks' sequences
     * of collectives equal even when one rank fails mid-pass and finish() starts the rest. */
    int *order;
    int next; /* order[next] is the next bucket to start */
    bool armed;
    int started_early, last_started_early;
};

/* A bucket's range ends at its last tensor: the table is one contiguous buffer (any padding
 * between tensors is zero in both buffers, harmless to sum). */
static void close_bucket(luna_grad_buckets *b, const luna_params *p, int first, int last) {
    bucket *k = &b->buckets[b->nbuckets++];
    k->first = first;
    k->count = last - first + 1;
    k->offset = p->tensors[first].offset;
    k->numel = p->tensors[last].offset + p->tensors[last].numel - k->offset;
    for (int i = first; i <= last; i++)
        b->bucket_of[i] = (int)(k - b->buckets);
}

static luna_status on_ready(void *ctx, int first, int count);

static void reset(luna_grad_buckets *b) {
    for (int k = 0; k < b->nbuckets; k++) {
        b->buckets[k].started = false;
        b->buckets[k].missing = b->buckets[k].count;
    }
    for (int i = 0; i < b->model->params->num_tensors; i++)
        b->reported[i] = false;
    b->next = 0;
}

/* Marks tensors reported; appends the buckets this completes to order[*n] (in bucket index
 * order among those completed by one report). */
static void report(luna_grad_buckets *b, int first, int count, int *order, int *n) {
    for (int i = first; i < first + count; i++) {
        if (b->reported[i]) continue;
        b->reported[i] = true;
        bucket *k = &b->buckets[b->bucket_of[i]];
        if (--k->missing == 0) order[(*n)++] = (int)(k - b->buckets);
    }
}

/* The model's report order (luna_seq2seq_set_grads_ready): decoder layers from the top, encoder
 * layers from the top, then everything. */
static void simulate_order(luna_grad_buckets *b) {
    const luna_seq2seq *m = b->model;
    reset(b);
    int n = 0;
    for (int l = m->config.decoder_layers - 1; l >= 0; l--)
        report(b, m->dec_first[l], m->dec_count[l], b->order, &n);
    for (int l = m->config.encoder_layers - 1; l >= 0; l--)
        report(b, m->enc_first[l], m->enc_count[l], b->order, &n);
    report(b, 0, m->params->num_tensors, b->order, &n);
    reset(b);
}

luna_status luna_grad_buckets_create(luna_grad_buckets **out, luna_communicator *comm,
                                     luna_seq2seq *model, size_t bucket_bytes) {
    *out = NULL;
    const luna_params *p = model->params;
    luna_grad_buckets *b = calloc(1, sizeof *b);
    if (b) {
        b->buckets = calloc((size_t)p->num_tensors, sizeof *b->buckets);
        b->bucket_of = calloc((size_t)p->num_tensors, sizeof *b->bucket_of);
        b->reported = calloc((size_t)p->num_tensors, sizeof *b->reported);
        b->order = calloc((size_t)p->num_tensors, sizeof *b->order);
    }
    if (!b || !b->buckets || !b->bucket_of || !b->reported || !b->order) {
        luna_grad_buckets_free(b);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    b->comm = comm;
    b->model = model;
    b->bucket_bytes = bucket_bytes;
    if (bucket_bytes == 0) {
        close_bucket(b, p, 0, p->num_tensors - 1);
    } else {
        /* From the end of the table: the order in which the backward finishes the layers. A
         * bucket never mixes a layer's tensors with the others (embeddings, P, final norms),
         * which are reported only when the backward ends and would hold the layer back. */
        bool *in_layer = b->reported; /* scratch until the first pass */
        for (int l = 0; l < model->config.encoder_layers; l++)
            for (int i = 0; i < model->enc_count[l]; i++)
                in_layer[model->enc_first[l] + i] = true;
        for (int l = 0; l < model->config.decoder_layers; l++)
            for (int i = 0; i < model->dec_count[l]; i++)
                in_layer[model->dec_first[l] + i] = true;
        int last = p->num_tensors - 1;
        size_t bytes = 0;
        for (int i = p->num_tensors - 1; i >= 0; i--) {
            size_t t = p->tensors[i].numel * sizeof(float);
            if (i < last && (bytes + t > bucket_bytes || in_layer[i] != in_layer[i + 1])) {
                close_bucket(b, p, i + 1, last);
                last = i;
                bytes = 0;
            }
            bytes += t;
        }
        close_bucket(b, p, 0, last);
        for (int i = 0; i < p->num_tensors; i++)
            in_layer[i] = false;
    }
    simulate_order(b);
    luna_seq2seq_set_grads_ready(model, on_ready, b);
    *out = b;
    return LUNA_OK;
}

void luna_grad_buckets_free(luna_grad_buckets *b) {
    if (!b) return;
    if (b->model && b->model->grads_ready_ctx == b) luna_seq2seq_set_grads_ready(b->model, NULL, NULL);
    free(b->buckets);
    free(b->bucket_of);
    free(b->reported);
    free(b->order);
    free(b);
}

static luna_status start(luna_grad_buckets *b, bucket *k) {
    k->started = true;
    luna_params *p = b->model->params;
    return b->comm->reduce_start(b->comm, b->model->be, p->grad + k->offset, k->numel);
}

/* The model's report: tensors [first, first + count) are final; every bucket complete now starts.
 * The reports come in the same order on every rank (the layer order), so every rank issues the
 * same sequence of collectives. */
static luna_status on_ready(void *ctx, int first, int count) {
    luna_grad_buckets *b = ctx;
    if (!b->armed) return LUNA_OK;
    for (int i = first; i < first + count; i++) {
        if (b->reported[i]) continue;
        b->reported[i] = true;
        b->buckets[b->bucket_of[i]].missing--;
    }
    while (b->next < b->nbuckets && b->buckets[b->order[b->next]].missing == 0) {
        LUNA_TRY(start(b, &b->buckets[b->order[b->next++]]));
        /* a report of all tensors is the backward's last: what starts then is not early */
        if (count < b->model->params->num_tensors) b->started_early++;
    }
    return LUNA_OK;
}

void luna_grad_buckets_arm(luna_grad_buckets *b) { b->armed = b->comm->world_size > 1; }

luna_status luna_grad_buckets_finish(luna_grad_buckets *b, double *stats, size_t n) {
    luna_status s = LUNA_OK;
    while (b->next < b->nbuckets && s == LUNA_OK)
        s = start(b, &b->buckets[b->order[b->next++]]);
    luna_status f = b->comm->reduce_finish(b->comm, b->model->be, stats, n);
    if (s == LUNA_OK) s = f;
    reset(b);
    b->armed = false;
    b->last_started_early = b->started_early;
    b->started_early = 0;
    return s;
}

int luna_grad_buckets_count(const luna_grad_buckets *b) { return b->nbuckets; }
size_t luna_grad_buckets_bytes(const luna_grad_buckets *b) { return b->bucket_bytes; }
int luna_grad_buckets_started_early(const luna_grad_buckets *b) { return b->last_started_early; }
