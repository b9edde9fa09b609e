#include "decoding/incremental.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoding/incremental_internal.h"

/* The transformer's longest position in steps of this many while steps are graphs: a graph
 * serves that many steps (luna_decoder_dims.T_round). */
#define LUNA_GRAPH_T_ROUND 16

/* A pool's step has one shape between readbacks, a few as sentences leave and join. */
#define STEP_GRAPHS 8

static luna_status step_graphs_create(luna_incremental *inc) {
    return luna_graph_cache_create(&inc->graphs, inc->be, STEP_GRAPHS, 1, 0);
}

luna_status luna_incremental_create(luna_incremental **out, luna_seq2seq *model) {
    *out = NULL;
    const luna_config *c = &model->config;
    if (c->encoder_embed_dim != c->decoder_embed_dim)
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "incremental decoding: encoder and decoder dims differ (%d, %d)",
                          c->encoder_embed_dim, c->decoder_embed_dim);
    luna_incremental *inc = calloc(1, sizeof *inc);
    if (!inc) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    inc->model = model;
    inc->inv_temperature = 1.0f;
    inc->be = model->be;
    inc->layers = c->decoder_layers;
    inc->d = c->decoder_embed_dim;
    inc->H = c->decoder_attention_heads;
    inc->V = c->vocab_size;
    inc->luna = c->arch == LUNA_ARCH_LUNA;
    inc->ls = calloc((size_t)inc->layers, sizeof *inc->ls);
    luna_status st =
        inc->ls ? LUNA_OK
                : luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    if (st == LUNA_OK) st = luna_arena_create(&inc->state, inc->be, (size_t)16 << 20);
    if (st == LUNA_OK) st = luna_arena_create(&inc->scratch, inc->be, (size_t)32 << 20);
    const char *graphs = getenv("LUNA_STEP_GRAPHS");
    if (st == LUNA_OK && luna_graphs_available(inc->be) && !(graphs && !strcmp(graphs, "0")))
        st = step_graphs_create(inc);
    /* the decoder's weights stay constant while this state exists */
    if (st == LUNA_OK) st = luna_decoder_hold_weights(model, true);
    if (st == LUNA_OK) inc->held = true;
    if (st != LUNA_OK) {
        luna_incremental_free(inc);
        return st;
    }
    *out = inc;
    return LUNA_OK;
}

void luna_incremental_free(luna_incremental *inc) {
    if (!inc) return;
    if (inc->held) (void)luna_decoder_hold_weights(inc->model, false);
    luna_graph_cache_free(inc->graphs); /* before the memory its graphs use */
    luna_arena_free(inc->state);
    luna_arena_free(inc->scratch);
    luna_kv_pages_free(inc->kv);
    if (inc->bias) luna_mem_release(inc->be, inc->bias, sizeof(float) * (size_t)inc->V);
    free(inc->sent_host);
    free(inc->sent_step);
    free(inc->sent_block);
    free(inc->sent_slot);
    free(inc->slot_host);
    luna_cache_slots_free(&inc->cs);
    free(inc->ls);
    free(inc);
}

const luna_config *luna_incremental_config(const luna_incremental *inc) {
    return &inc->model->config;
}
luna_backend *luna_incremental_backend(const luna_incremental *inc) { return inc->be; }
int luna_incremental_rows(const luna_incremental *inc) { return inc->R; }
int luna_incremental_sentences(const luna_incremental *inc) { return inc->S; }
int luna_incremental_beam(const luna_incremental *inc) { return inc->beam; }
int luna_incremental_steps(const luna_incremental *inc) { return inc->step; }
int luna_incremental_projection_slots(const luna_incremental *inc) { return inc->L; }
size_t luna_incremental_state_bytes(const luna_incremental *inc) {
    return luna_arena_used_bytes(inc->state) +
           (inc->pool && inc->kv ? luna_kv_pages_bytes(inc->kv) : 0);
}
size_t luna_incremental_cache_bytes(const luna_incremental *inc) {
    if (inc->luna) return 0;
    if (inc->pool) return inc->kv ? luna_kv_pages_bytes(inc->kv) : 0;
    return luna_act_bytes(inc->be,
                          (int64_t)2 * inc->layers * inc->cap_rows * inc->max_steps * inc->d);
}
size_t luna_incremental_scratch_bytes(const luna_incremental *inc) {
    return luna_arena_used_bytes(inc->scratch);
}
size_t luna_incremental_scratch_peak(const luna_incremental *inc) {
    return luna_arena_peak_bytes(inc->scratch);
}

/* The sentence of row r and the first row of sentence s (the layout of dims_of). */
static int first_row(const luna_incremental *inc, int s) {
    const int f = inc->S - inc->one_row;
    return s <= f ? s * inc->rpb : f * inc->rpb + (s - f);
}

static luna_decoder_dims dims_of(const luna_incremental *inc) {
    return (luna_decoder_dims){.S = inc->S,
                               .beam = inc->rpb,
                               .R = inc->R,
                               .R_cap = inc->cap_rows,
                               .m = inc->m,
                               .L = inc->L,
                               .max_steps = inc->max_steps,
                               .cache_page = inc->pool && !inc->luna ? LUNA_KV_PAGE : 0,
                               .step = inc->step,
                               .row_valid = inc->row_valid,
                               .sent_valid = inc->sent_valid,
                               .cache_slots = inc->luna ? NULL : inc->cs.dev,
                               .sent_step = inc->pool ? inc->sent_step : NULL,
                               .one_row_sentences = inc->one_row,
                               .sent_slot = inc->pool && !inc->luna ? inc->sent_slot : NULL,
                               .slot_valid = inc->pool && !inc->luna ? inc->slot_valid : NULL,
                               .positions = inc->pool ? inc->positions : NULL,
                               .T_round = inc->graphs && inc->pool ? LUNA_GRAPH_T_ROUND : 0};
}

luna_status luna_incremental_upload_masks(luna_incremental *inc) {
    if (!inc->masked || inc->R == 0) return LUNA_OK;
    LUNA_TRY(luna_mem_from_host(inc->be, inc->sent_valid, inc->sent_host,
                                sizeof(int32_t) * (size_t)inc->S));
    if (!inc->row_valid) return LUNA_OK;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)inc->R);
    if (!rows) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    for (int r = 0; r < inc->R; r++)
        rows[r] = inc->sent_host[luna_incremental_row_sentence(inc, r)];
    luna_status st =
        luna_mem_from_host(inc->be, inc->row_valid, rows, sizeof(int32_t) * (size_t)inc->R);
    free(rows);
    return st;
}

static luna_status check_source(const luna_config *c, const int32_t *src, const int32_t *lens,
                                int S, int m) {
    for (int b = 0; b < S; b++) {
        if (lens[b] < 1 || lens[b] > m)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: sentence %d: source length %d out of [1, %d]",
                              b, lens[b], m);
        for (int t = 0; t < m; t++) {
            int32_t tok = src[(int64_t)b * m + t];
            if (tok < 0 || tok >= c->vocab_size || (tok == c->padding_idx) != (t >= lens[b]))
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "incremental decoding: sentence %d: source token %d at %d is out "
                                  "of range or not right-padded to length %d",
                                  b, tok, t, lens[b]);
        }
    }
    return LUNA_OK;
}

/* ---- begin ----------------------------------------------------------------------------------- */

static luna_status begin(luna_incremental *inc, const int32_t *src, const int32_t *lens) {
    const luna_config *c = &inc->model->config;
    luna_backend *be = inc->be;
    const int S = inc->S, m = inc->m;
    luna_pass ps = {.be = be, .arena = inc->scratch}, pst = {.be = be, .arena = inc->state};
    int longest = 0;
    for (int b = 0; b < S; b++)
        longest = lens[b] > longest ? lens[b] : longest;
    inc->L = luna_decoder_projection_slots(c, longest);
    const int L = inc->L;
    inc->masked = !inc->luna || !c->fix_projection_length;
    for (int b = 0; b < S; b++)
        inc->sent_host[b] = !inc->luna ? lens[b] : lens[b] < L ? lens[b] : L;
    /* masks: per sentence (kept; P mask or source lengths) and per row (Luna's causal step) */
    inc->row_valid = inc->sent_valid = NULL;
    if (inc->masked) LUNA_TRY(luna_pass_alloc_i32(&pst, &inc->sent_valid, S, "decoder masks"));
    if (inc->masked && inc->luna)
        LUNA_TRY(luna_pass_alloc_i32(&pst, &inc->row_valid, inc->cap_rows, "decoder masks"));
    LUNA_TRY(luna_incremental_upload_masks(inc));
    /* the encoder's masks: source lengths, and the P mask when dynamic */
    int32_t *tok, *src_valid, *p_valid = NULL;
    LUNA_TRY(luna_pass_alloc_i32(&ps, &tok, (int64_t)S * m, "source tokens"));
    LUNA_TRY(luna_mem_from_host(be, tok, src, sizeof(int32_t) * (size_t)S * m));
    LUNA_TRY(luna_pass_alloc_i32(&ps, &src_valid, S, "source lengths"));
    LUNA_TRY(luna_mem_from_host(be, src_valid, lens, sizeof(int32_t) * (size_t)S));
    if (inc->luna && inc->masked) p_valid = inc->sent_valid;
    luna_decoder_dims dims = dims_of(inc);
    return luna_decoder_begin(inc->model, inc->state, inc->scratch, tok, src_valid, p_valid, &dims,
                              inc->ls);
}

static luna_status begin_rows(luna_incremental *inc, const int32_t *src_tokens,
                              const int32_t *src_lengths, int S, int m, int beam, int max_steps,
                              int rows_per_sentence) {
    if (S <= 0 || m <= 0 || beam <= 0 || max_steps <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: bad sizes (sentences %d, source length %d, beam "
                          "%d, max steps %d)",
                          S, m, beam, max_steps);
    LUNA_TRY(check_source(&inc->model->config, src_tokens, src_lengths, S, m));
    luna_graph_cache_clear(inc->graphs);
    luna_arena_reset(inc->state);
    luna_arena_reset(inc->scratch);
    luna_kv_pages_free(inc->kv); /* a pool's pages: this batch's caches come from the arena */
    inc->kv = NULL;
    int32_t *sh = realloc(inc->sent_host, sizeof(int32_t) * (size_t)S);
    if (!sh) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    inc->sent_host = sh;
    if (!inc->luna)
        LUNA_TRY(luna_cache_slots_reset(&inc->cs, inc->be, inc->state, S * beam, max_steps));
    inc->pool = false;
    inc->one_row = 0;
    inc->S = S;
    inc->cap_rows = S * beam;
    inc->R = S * rows_per_sentence;
    inc->rpb = rows_per_sentence;
    inc->beam = beam;
    inc->m = m;
    inc->max_steps = max_steps;
    inc->step = 0;
    luna_status st = begin(inc, src_tokens, src_lengths);
    luna_arena_reset(inc->scratch);
    if (st != LUNA_OK) {
        luna_arena_reset(inc->state);
        inc->S = inc->R = inc->cap_rows = 0;
        luna_error_prefix("incremental decoding: begin");
    }
    return st;
}

luna_status luna_incremental_begin(luna_incremental *inc, const int32_t *src_tokens,
                                   const int32_t *src_lengths, int S, int m, int beam,
                                   int max_steps) {
    return begin_rows(inc, src_tokens, src_lengths, S, m, beam, max_steps, beam);
}

luna_status luna_incremental_begin_one_row(luna_incremental *inc, const int32_t *src_tokens,
                                           const int32_t *src_lengths, int S, int m, int beam,
                                           int max_steps) {
    return begin_rows(inc, src_tokens, src_lengths, S, m, beam, max_steps, 1);
}

/* ---- in-flight batching ---------------------------------------------------------------------- */

luna_status luna_incremental_begin_pool(luna_incremental *inc, int S_cap, int m_cap, int beam,
                                        int max_steps) {
    if (S_cap <= 0 || m_cap <= 0 || beam <= 0 || max_steps <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: bad pool sizes (sentences %d, source length %d, "
                          "beam %d, max steps %d)",
                          S_cap, m_cap, beam, max_steps);
    const luna_config *c = &inc->model->config;
    luna_graph_cache_clear(inc->graphs); /* the state they read is about to move */
    luna_arena_reset(inc->state);
    luna_arena_reset(inc->scratch);
    inc->S = inc->R = 0;
    int32_t *a[3] = {realloc(inc->sent_host, sizeof(int32_t) * (size_t)S_cap), NULL, NULL};
    if (a[0]) inc->sent_host = a[0];
    if (a[0] && (a[1] = realloc(inc->sent_step, sizeof(int32_t) * (size_t)S_cap)))
        inc->sent_step = a[1];
    if (a[1] && (a[2] = realloc(inc->sent_block, sizeof(int32_t) * (size_t)S_cap)))
        inc->sent_block = a[2];
    int32_t *b[2] = {a[2] ? realloc(inc->sent_slot, sizeof(int32_t) * (size_t)S_cap) : NULL, NULL};
    if (b[0]) inc->sent_slot = b[0];
    if (b[0] && (b[1] = realloc(inc->slot_host, sizeof(int32_t) * (size_t)S_cap)))
        inc->slot_host = b[1];
    if (!b[1]) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    if (!inc->luna)
        LUNA_TRY(luna_cache_slots_reset(&inc->cs, inc->be, inc->state, S_cap * beam, max_steps));
    inc->pool = true;
    inc->one_row = 0;
    inc->S_cap = S_cap;
    inc->cap_rows = S_cap * beam;
    inc->rpb = inc->beam = beam;
    inc->m = m_cap;
    inc->max_steps = max_steps;
    inc->step = 0;
    inc->L = luna_decoder_projection_slots(c, m_cap);
    inc->masked = !inc->luna || !c->fix_projection_length;
    luna_pass pst = {.be = inc->be, .arena = inc->state};
    inc->row_valid = inc->sent_valid = inc->slot_valid = NULL;
    luna_status st = LUNA_OK;
    if (inc->masked) st = luna_pass_alloc_i32(&pst, &inc->sent_valid, S_cap, "decoder masks");
    if (st == LUNA_OK && inc->masked && !inc->luna)
        st = luna_pass_alloc_i32(&pst, &inc->slot_valid, S_cap, "source lengths by slot");
    if (st == LUNA_OK && inc->masked && inc->luna)
        st = luna_pass_alloc_i32(&pst, &inc->row_valid, inc->cap_rows, "decoder masks");
    inc->positions = NULL;
    if (st == LUNA_OK)
        st = luna_pass_alloc(&pst, &inc->positions, (int64_t)max_steps * inc->d, "positions");
    if (st == LUNA_OK) st = luna_decoder_positions(inc->be, c, inc->positions, max_steps);
    luna_decoder_dims dims = dims_of(inc);
    dims.S = S_cap;
    if (st == LUNA_OK) st = luna_decoder_alloc(inc->model, inc->state, &dims, inc->ls);
    /* the transformer's self-attention caches: pages, as the sentences reach them */
    if (st == LUNA_OK && !inc->luna && !inc->kv)
        st = luna_kv_pages_create(&inc->kv, inc->be, inc->layers, inc->d, inc->H);
    if (st == LUNA_OK && !inc->luna)
        st = luna_kv_pages_begin(inc->kv, inc->ls, S_cap, beam, max_steps);
    if (st != LUNA_OK) {
        luna_arena_reset(inc->state);
        inc->pool = false;
        inc->S = inc->R = inc->cap_rows = 0;
        luna_error_prefix("incremental decoding: pool");
    }
    return st;
}

static luna_status admit(luna_incremental *inc, const int32_t *src, const int32_t *lens, int n,
                         int m, int rows) {
    const luna_config *c = &inc->model->config;
    luna_backend *be = inc->be;
    luna_pass ps = {.be = be, .arena = inc->scratch};
    int longest = 0;
    for (int b = 0; b < n; b++)
        longest = lens[b] > longest ? lens[b] : longest;
    const int L = luna_decoder_projection_slots(c, longest);
    int32_t *host = malloc(sizeof(int32_t) * (size_t)n);
    if (!host) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    for (int b = 0; b < n; b++) /* the new sentences' own P masks */
        host[b] = lens[b] < L ? lens[b] : L;
    int32_t *tok, *src_valid, *p_valid = NULL;
    luna_status st = luna_pass_alloc_i32(&ps, &tok, (int64_t)n * m, "source tokens");
    if (st == LUNA_OK) st = luna_mem_from_host(be, tok, src, sizeof(int32_t) * (size_t)n * m);
    if (st == LUNA_OK) st = luna_pass_alloc_i32(&ps, &src_valid, n, "source lengths");
    if (st == LUNA_OK) st = luna_mem_from_host(be, src_valid, lens, sizeof(int32_t) * (size_t)n);
    if (st == LUNA_OK && inc->luna && inc->masked)
        st = luna_pass_alloc_i32(&ps, &p_valid, n, "P masks");
    if (st == LUNA_OK && p_valid)
        st = luna_mem_from_host(be, p_valid, host, sizeof(int32_t) * (size_t)n);
    free(host);
    LUNA_TRY(st);
    luna_decoder_dims dims = {.S = n, .beam = rows, .R = n * rows, .m = m, .L = L, .max_steps = 0};
    return luna_decoder_admit(inc->model, inc->scratch, tok, src_valid, p_valid, &dims, inc->S,
                              inc->luna ? NULL : inc->sent_slot + inc->S, inc->R, inc->m, inc->L,
                              inc->ls);
}

/* The transformer's new sentences S.. S + n − 1 into free slots (the lowest ones), their source
 * lengths into slot_valid. */
static luna_status take_slots(luna_incremental *inc, const int32_t *lens, int n) {
    bool *used = calloc((size_t)inc->S_cap, sizeof *used);
    if (!used) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    for (int s = 0; s < inc->S; s++)
        used[inc->sent_slot[s]] = true;
    for (int b = 0, k = 0; b < n; b++) {
        while (used[k])
            k++; /* S + n ≤ S_cap: a free one exists */
        used[k] = true;
        inc->sent_slot[inc->S + b] = k;
        inc->slot_host[k] = lens[b];
    }
    free(used);
    if (!inc->slot_valid) return LUNA_OK;
    return luna_mem_from_host(inc->be, inc->slot_valid, inc->slot_host,
                              sizeof(int32_t) * (size_t)inc->S_cap);
}

luna_status luna_incremental_admit(luna_incremental *inc, const int32_t *src_tokens,
                                   const int32_t *src_lengths, int n, int m, bool one_row) {
    if (!inc->pool || n <= 0 || m <= 0 || m > inc->m || inc->S + n > inc->S_cap || inc->one_row)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: admit %d sentences of length %d to %s (%d of %d "
                          "sentences, source length %d)",
                          n, m, inc->pool ? "the pool" : "no pool", inc->S, inc->S_cap, inc->m);
    LUNA_TRY(check_source(&inc->model->config, src_tokens, src_lengths, n, m));
    luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
    luna_status st = inc->luna ? LUNA_OK : take_slots(inc, src_lengths, n);
    if (st == LUNA_OK) st = admit(inc, src_tokens, src_lengths, n, m, one_row ? 1 : inc->beam);
    luna_arena_release(inc->scratch, mark);
    if (st != LUNA_OK) {
        luna_error_prefix("incremental decoding: admit");
        return st;
    }
    for (int b = 0; b < n; b++) {
        inc->sent_host[inc->S + b] = !inc->luna                ? src_lengths[b]
                                     : src_lengths[b] < inc->L ? src_lengths[b]
                                                               : inc->L;
        inc->sent_step[inc->S + b] = 0;
    }
    inc->S += n;
    inc->R += n * (one_row ? 1 : inc->beam);
    inc->one_row = one_row ? n : 0;
    for (int i = 0; i < inc->layers && inc->luna; i++)
        inc->ls[i].causal.B = inc->R;
    st = luna_incremental_upload_masks(inc);
    if (st != LUNA_OK) luna_error_prefix("incremental decoding: admit");
    return st;
}

/* ---- one step -------------------------------------------------------------------------------- */

luna_status luna_incremental_set_token_bias(luna_incremental *inc, const float *bias) {
    const size_t bytes = sizeof(float) * (size_t)inc->V;
    if (!bias) {
        if (inc->bias) luna_mem_release(inc->be, inc->bias, bytes);
        inc->bias = NULL;
        return LUNA_OK;
    }
    if (!inc->bias && !(inc->bias = luna_mem_alloc(inc->be, bytes)))
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of device memory "
                                                  "for the token bias");
    return luna_mem_from_host(inc->be, inc->bias, bias, bytes);
}

luna_status luna_incremental_set_graphs(luna_incremental *inc, bool on) {
    const char *env = getenv("LUNA_STEP_GRAPHS");
    if (env && !strcmp(env, "0")) on = false; /* the user's word stands */
    if (!on || inc->graphs || !luna_graphs_available(inc->be)) {
        if (!on) luna_graph_cache_free(inc->graphs), inc->graphs = NULL;
        return LUNA_OK;
    }
    return step_graphs_create(inc);
}

bool luna_incremental_uses_graphs(const luna_incremental *inc) { return inc->graphs && inc->pool; }

void luna_incremental_graph_counts(const luna_incremental *inc, int64_t *replays, int64_t *captures,
                                   int64_t *failed) {
    luna_graph_cache_counts(inc->graphs, replays, captures, failed);
}

luna_status luna_incremental_set_temperature(luna_incremental *inc, double T) {
    if (!(T > 0) || !isfinite(T))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: temperature %g must be a positive number", T);
    inc->inv_temperature = (float)(1.0 / T);
    return LUNA_OK;
}

/* A step's device work after its uploads: the decoder, the temperature, the log-softmax and its
 * candidates (what a graph holds, core/graph_cache.h). */
typedef struct {
    luna_incremental *inc;
    const luna_pass *ps;
    luna_decoder_dims dims;
    luna_decoder_step_rows rows;
    const int32_t *tok, *pick;
    int k;
    float *top_lp, *picked;
    int32_t *top_idx;
} device_step;

static luna_status run_device_step(void *ctx) {
    const device_step *d = ctx;
    luna_incremental *inc = d->inc;
    luna_backend *be = inc->be;
    luna_act *logits;
    LUNA_TRY(
        luna_decoder_step_run(d->ps, inc->model, &d->dims, inc->ls, d->tok, &d->rows, &logits));
    /* x·(1/T) rather than fairseq's x/T: one scale op; the two differ by at most an ulp */
    if (inc->inv_temperature != 1.0f)
        LUNA_TRY(be->ops->scale_act(be, logits, inc->inv_temperature, (int64_t)inc->R * inc->V));
    return be->ops->log_softmax_topk(be, logits, inc->bias, inc->R, inc->V, d->k, d->top_lp,
                                     d->top_idx, d->pick, d->picked);
}

/* tokens: the host's (checked by the caller) or, tokens_on_device, the backend's (produced by
 * beam_select, within the vocabulary by construction). */
static luna_status step(luna_incremental *inc, const int32_t *tokens, bool tokens_on_device,
                        const luna_step_output *out) {
    luna_backend *be = inc->be;
    const int R = inc->R, V = inc->V, k = out->k;
    luna_pass ps = {.be = be, .arena = inc->scratch};
    int32_t *tok, *top_idx = NULL, *pick = NULL;
    float *top_lp = NULL, *picked = NULL;
    if (tokens_on_device) {
        tok = (int32_t *)tokens;
        luna_mem_ids_in_range(be, tok, R, 0, V - 1);
    } else { /* as ids: a device then knows their range and its embedding needs no wait */
        LUNA_TRY(luna_pass_alloc_i32(&ps, &tok, R, "decoder tokens"));
        LUNA_TRY(luna_mem_ids_from_host(be, tok, tokens, R));
    }
    if (out->on_device) {
        top_lp = out->top_log_probs, top_idx = out->top_tokens, picked = out->picked;
    } else if (k > 0) {
        LUNA_TRY(luna_pass_alloc_f32(&ps, &top_lp, (int64_t)R * k, "candidates"));
        LUNA_TRY(luna_pass_alloc_i32(&ps, &top_idx, (int64_t)R * k, "candidates"));
    }
    if (out->pick) {
        LUNA_TRY(luna_pass_alloc_i32(&ps, &pick, R, "picked tokens"));
        if (!out->on_device) LUNA_TRY(luna_pass_alloc_f32(&ps, &picked, R, "picked log-probs"));
        LUNA_TRY(luna_mem_ids_from_host(be, pick, out->pick, R));
    }
    if (!inc->luna) { /* row r writes position t in slot r (pool: in its sentence's block) */
        for (int s = 0; inc->pool && s < inc->S; s++)
            LUNA_TRY(luna_kv_pages_block(inc->kv, s, inc->sent_step[s], &inc->sent_block[s]));
        for (int r = 0; r < R; r++) {
            const int s = luna_incremental_row_sentence(inc, r), j = r - first_row(inc, s);
            luna_cache_slots_set(&inc->cs, r, inc->pool ? inc->sent_step[s] : inc->step,
                                 inc->pool ? inc->sent_block[s] * inc->beam + j : r);
        }
        LUNA_TRY(luna_cache_slots_write(&inc->cs, be, R));
    }
    device_step d = {.inc = inc,
                     .ps = &ps,
                     .dims = dims_of(inc),
                     .tok = tok,
                     .pick = pick,
                     .k = k,
                     .top_lp = top_lp,
                     .picked = picked,
                     .top_idx = top_idx};
    LUNA_TRY(luna_decoder_step_upload(&ps, &d.dims, &d.rows));
    if (inc->graphs && d.rows.rows_t) { /* a pool: launches position-free */
        /* what the step's launches depend on besides the pool's device state */
        luna_graph_key key;
        luna_graph_key_init(&key);
        const uint64_t sizes[] = {(uint64_t)R,
                                  (uint64_t)inc->S,
                                  (uint64_t)inc->one_row,
                                  (uint64_t)k,
                                  (uint64_t)(inc->luna ? 0 : d.rows.T),
                                  luna_kv_pages_moves(inc->kv)};
        luna_graph_key_add_words(&key, sizes, sizeof sizes / sizeof sizes[0]);
        const void *buffers[] = {d.dims.cache_slots, tok, top_lp, top_idx, pick, picked, inc->bias};
        luna_graph_key_add_ptrs(&key, buffers, sizeof buffers / sizeof buffers[0]);
        luna_graph_key_add_f32s(&key, &inc->inv_temperature, 1);
        luna_graph_key_add_arena(&key, inc->scratch);
        luna_graph_key_add_backend(&key, be);
        luna_graph_call call;
        luna_graph_call_begin(&call, inc->graphs, &key);
        LUNA_TRY(luna_graph_call_segment(&call, 0, inc->scratch, run_device_step, &d));
    } else {
        LUNA_TRY(run_device_step(&d));
    }
    if (out->on_device) return LUNA_OK;
    if (k > 0) {
        LUNA_TRY(luna_mem_to_host(be, out->top_log_probs, top_lp, sizeof(float) * (size_t)R * k));
        LUNA_TRY(luna_mem_to_host(be, out->top_tokens, top_idx, sizeof(int32_t) * (size_t)R * k));
    }
    if (pick) LUNA_TRY(luna_mem_to_host(be, out->picked, picked, sizeof(float) * (size_t)R));
    return LUNA_OK;
}

static luna_status step_checked(luna_incremental *inc, const int32_t *tokens, bool tokens_on_device,
                                const luna_step_output *out) {
    const int R = inc->R, V = inc->V;
    if (R <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "incremental decoding: no active rows");
    for (int s = 0; s < (inc->pool ? inc->S : 1); s++) {
        const int t = inc->pool ? inc->sent_step[s] : inc->step;
        if (t >= inc->max_steps)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: step %d exceeds max_steps %d given to begin",
                              t + 1, inc->max_steps);
    }
    if (out->k < 0 || out->k > V || (out->k > 0 && (!out->top_log_probs || !out->top_tokens)) ||
        (out->pick && !out->picked))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: bad step output (k %d of %d candidates)", out->k,
                          V);
    for (int r = 0; r < R; r++)
        if ((!tokens_on_device && (tokens[r] < 0 || tokens[r] >= V)) ||
            (out->pick && (out->pick[r] < 0 || out->pick[r] >= V)))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: row %d: token %d out of [0, %d)", r,
                              !tokens_on_device && (tokens[r] < 0 || tokens[r] >= V) ? tokens[r]
                                                                                     : out->pick[r],
                              V);
    luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
    luna_status st = step(inc, tokens, tokens_on_device, out);
    luna_arena_release(inc->scratch, mark);
    if (st != LUNA_OK) {
        luna_error_prefix("incremental decoding: step %d", inc->step);
        return st;
    }
    inc->step++;
    for (int s = 0; inc->pool && s < inc->S; s++)
        inc->sent_step[s]++;
    return LUNA_OK;
}

luna_status luna_incremental_step(luna_incremental *inc, const int32_t *tokens,
                                  const luna_step_output *out) {
    return step_checked(inc, tokens, false, out);
}

luna_status luna_incremental_step_device_tokens(luna_incremental *inc, const int32_t *tokens,
                                                const luna_step_output *out) {
    return step_checked(inc, tokens, true, out);
}
