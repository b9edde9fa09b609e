/* luna_generate (decoding/beam_search.h) with in-flight batching: the sentences, sorted by source
 * length, go through a pool of at most batch_size sentences (and max_tokens padded source
 * tokens); when a sentence finishes, its place goes to the next sentence of the input (encoded
 * then, its decoder state started at step 0), so the decoder's Linear layers see a full batch of
 * rows at different positions instead of a batch that empties to its slowest sentence.
 *
 * The search per sentence is luna_beam_search's (decoding/beam_search.h), step for step; what
 * differs is where the sentence's step comes from. Three details keep the results those of a
 * search of the sentence alone (up to the last bits of sums over padded sources, as between
 * batches before): its rows decode as in a batch of their own
 * (luna_incremental_admit); at step 0 a joining sentence has one row, as in the batch search
 * (the GEMMs' results depend on their row count); and </s> before min_len is
 * removed from the row's candidates like an n-gram ban (the rows of the pool are at different
 * steps, so the shared token bias cannot carry it) — the top k of the log-probs with </s> at −inf,
 * as the bias gave.
 *
 * A beam search selects on the backend (the beam_select op, core/beam_select.h): the candidate
 * lists, the hypotheses, their scores and the finished ones stay in the backend's memory, and the
 * host reads back per step only each sentence's done flag, its next rows' parents and tokens
 * (one readback), and a finished sentence's record. That readback comes only every few steps
 * (luna_beam_options.sync_interval): in between the op's parent rows reorder the decoder's state
 * (Luna's, or the transformer's cache-slot table) and its tokens feed the next step on the
 * backend, finished sentences idle in
 * the pool, and new ones join at the next readback. Sampling selects on the host (its draws
 * need the lists there). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/beam_candidates.h"
#include "core/beam_select.h"
#include "data/dictionary.h"
#include "decoding/sampling.h"
#include "decoding/search_internal.h"

typedef struct {
    int beam, K, nc, kb, V, cap, k_cap, S_cap, m_cap;
    int S;               /* active sentences */
    int one_row;         /* the last this many have one decoder row (joined; beam search) */
    int *id;             /* [S_cap] each active sentence's index in the input */
    int *step;           /* [S_cap] its steps taken */
    int *max_len;        /* [S_cap] */
    int *src_len;        /* [S_cap] */
    int32_t *tok, *tok2; /* [S_cap·beam, cap] */
    double *sc, *sc2;    /* [S_cap·beam, cap] cumulative scores */
    bool *ignore, *ignore2;
    luna_cand *cands; /* [S_cap, K] */
    bool *is_eos;     /* [S_cap, K] */
    int32_t *rows;    /* [S_cap·beam]: new sentence indices, then the reorder */
    int32_t *row_tok; /* [S_cap·beam] */
    float *top_lp;    /* [S_cap·beam, k_cap] */
    int32_t *top_tok; /* [S_cap·beam, k_cap] */
    int32_t *ban;     /* [S_cap·beam, cap + 1] n-gram bans and </s> before min_len */
    int *nban;        /* [S_cap·beam] */
    int32_t *pick;    /* [S_cap·beam] </s> */
    float *picked;    /* [S_cap·beam] */
    int32_t *padded;  /* [S_cap, m_cap] + [S_cap] lengths: the admitted sources */
    /* the selection on the backend (beam search) */
    bool on_device;
    int *slot;             /* [S_cap] each active sentence's slot of search state */
    int *free_slot, nfree; /* [S_cap] */
    int32_t *next_rows;    /* [S_cap·beam] the reorder */
    int32_t *sent_host;    /* [4·S_cap + 1] the op's per-sentence table */
    int32_t *summary;      /* [S_cap·(1 + 2·beam)] */
    unsigned char *record; /* one finished record; on a device [S_cap] of them (records_dev's) */
    size_t record_bytes;
    unsigned char *records_dev; /* device [S_cap] records: a readback's finished sentences'
                                   records gathered for one copy (NULL on the CPU) */
    int32_t *rec_tok;           /* [cap] one finished hypothesis's tokens */
    float *rec_lp;              /* [cap] and log-probs */
    luna_backend *be;
    void *dev; /* one block, carved into the buffers below */
    size_t dev_bytes;
    float *d_lp, *d_picked;
    int32_t *d_list_tok, *d_sent, *d_tok, *d_back, *d_summary;
    double *d_score;
    uint8_t *d_ignore[2];
    unsigned char *d_finished;
    void *d_work;
    int cur;                /* which of the ignore flags' buffers is this step's */
    int interval, since;    /* steps between readbacks of the summary; since the last */
    bool fresh;             /* the pool changed: its done flags start at 0 */
    const int32_t *tok_dev; /* the next step's tokens, on the backend (no readback since) */
} flight;

static void flight_free(flight *f) {
    void *host[] = {f->slot,    f->free_slot, f->next_rows, f->sent_host,
                    f->summary, f->record,    f->rec_tok,   f->rec_lp};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    if (f->dev) luna_mem_release(f->be, f->dev, f->dev_bytes);
    if (f->records_dev) luna_mem_release(f->be, f->records_dev, f->record_bytes * (size_t)f->S_cap);
    void *all[] = {f->id,     f->step,    f->max_len, f->src_len, f->tok,    f->tok2,   f->sc,
                   f->sc2,    f->ignore,  f->ignore2, f->cands,   f->is_eos, f->rows,   f->row_tok,
                   f->top_lp, f->top_tok, f->ban,     f->nban,    f->pick,   f->picked, f->padded};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* The pool's host arrays; the host selection's (sampling) only without f->on_device. */
static luna_status flight_alloc(flight *f) {
    const size_t S = (size_t)f->S_cap, R = S * f->beam, cap = (size_t)f->cap;
    f->id = malloc(sizeof(int) * S);
    f->step = malloc(sizeof(int) * S);
    f->max_len = malloc(sizeof(int) * S);
    f->src_len = malloc(sizeof(int) * S);
    f->row_tok = malloc(sizeof(int32_t) * R);
    f->pick = malloc(sizeof(int32_t) * R);
    f->padded = malloc(sizeof(int32_t) * (S * f->m_cap + S));
    bool ok = f->id && f->step && f->max_len && f->src_len && f->row_tok && f->pick && f->padded;
    if (!f->on_device) {
        f->tok = malloc(sizeof(int32_t) * R * cap);
        f->tok2 = malloc(sizeof(int32_t) * R * cap);
        f->sc = malloc(sizeof(double) * R * cap);
        f->sc2 = malloc(sizeof(double) * R * cap);
        f->ignore = malloc(sizeof(bool) * R);
        f->ignore2 = malloc(sizeof(bool) * R);
        f->cands = malloc(sizeof(luna_cand) * S * f->K);
        f->is_eos = malloc(sizeof(bool) * S * f->K);
        f->rows = malloc(sizeof(int32_t) * R);
        f->top_lp = malloc(sizeof(float) * R * f->k_cap);
        f->top_tok = malloc(sizeof(int32_t) * R * f->k_cap);
        f->ban = malloc(sizeof(int32_t) * R * (cap + 1));
        f->nban = calloc(R, sizeof(int));
        f->picked = malloc(sizeof(float) * R);
        ok = ok && f->tok && f->tok2 && f->sc && f->sc2 && f->ignore && f->ignore2 && f->cands &&
             f->is_eos && f->rows && f->top_lp && f->top_tok && f->ban && f->nban && f->picked;
    }
    if (!ok)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoding: out of host memory (%d sentences)",
                          f->S_cap);
    for (size_t r = 0; r < R; r++)
        f->pick[r] = LUNA_DICT_EOS;
    return LUNA_OK;
}

/* The search state on the backend (f->on_device): one block of the backend's memory. */
static luna_status flight_alloc_device(flight *f) {
    const size_t S = (size_t)f->S_cap, R = S * f->beam, cap = (size_t)f->cap;
    f->record_bytes = luna_beam_finished_bytes(f->beam, f->cap);
    f->slot = malloc(sizeof(int) * S);
    f->free_slot = malloc(sizeof(int) * S);
    f->next_rows = malloc(sizeof(int32_t) * R);
    f->sent_host = malloc(sizeof(int32_t) * (4 * S + 1));
    f->summary = malloc(sizeof(int32_t) * (S + 2 * R));
    /* a device gathers a readback's finished records and sends them in one copy (a wait each
     * otherwise); on the CPU each record is read where it is */
    const bool gather = f->be->device != LUNA_DEVICE_CPU;
    f->record = malloc(f->record_bytes * (gather ? S : 1));
    if (gather) f->records_dev = luna_mem_alloc(f->be, f->record_bytes * S);
    if (gather && !f->records_dev)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoding: out of %s memory for the search",
                          f->be->name);
    f->rec_tok = malloc(sizeof(int32_t) * cap);
    f->rec_lp = malloc(sizeof(float) * cap);
    if (!f->slot || !f->free_slot || !f->next_rows || !f->sent_host || !f->summary || !f->record ||
        !f->rec_tok || !f->rec_lp)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoding: out of host memory (%d sentences)",
                          f->S_cap);
    for (int h = 0; h < f->S_cap; h++)
        f->free_slot[h] = f->S_cap - 1 - h;
    f->nfree = f->S_cap;
    const size_t bytes[] = {sizeof(float) * R * f->k_cap,
                            sizeof(int32_t) * R * f->k_cap,
                            sizeof(float) * R,
                            sizeof(int32_t) * (4 * S + 1),
                            sizeof(int32_t) * R * cap,
                            sizeof(int32_t) * R * cap,
                            sizeof(double) * R * cap,
                            R,
                            R,
                            sizeof(int32_t) * (S + 2 * R),
                            f->record_bytes * S,
                            luna_beam_select_work_bytes(f->S_cap, f->beam, f->cap)};
    enum { N = sizeof bytes / sizeof bytes[0] };
    size_t at[N], total = 0;
    for (int i = 0; i < N; i++) {
        at[i] = total;
        total += (bytes[i] + 255) / 256 * 256;
    }
    f->dev = luna_mem_alloc(f->be, total);
    if (!f->dev)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY,
                          "decoding: out of %s memory for the search (%zu bytes)", f->be->name,
                          total);
    f->dev_bytes = total;
    unsigned char *b = f->dev;
    f->d_lp = (float *)(b + at[0]), f->d_list_tok = (int32_t *)(b + at[1]);
    f->d_picked = (float *)(b + at[2]), f->d_sent = (int32_t *)(b + at[3]);
    f->d_tok = (int32_t *)(b + at[4]), f->d_back = (int32_t *)(b + at[5]);
    f->d_score = (double *)(b + at[6]);
    f->d_ignore[0] = b + at[7], f->d_ignore[1] = b + at[8];
    f->d_summary = (int32_t *)(b + at[9]), f->d_finished = b + at[10];
    f->d_work = b + at[11];
    return LUNA_OK;
}

/* The decoder's first row of sentence s (luna_incremental_admit's layout). */
static int drow(const flight *f, int s) {
    const int full = f->S - f->one_row;
    return s <= full ? s * f->beam : full * f->beam + (s - full);
}

static int max_len_of(const luna_beam_options *o, int src_len) {
    const double ml = o->max_len_a * src_len + o->max_len_b;
    return ml < o->max_len_cap ? (int)ml : o->max_len_cap;
}

/* Admit the input's sentences order[*next..) while the pool has room: at most S_cap sentences
 * and, with max_tokens, (sentences)·(longest source) ≤ max_tokens (a sentence always enters an
 * empty pool). */
static luna_status admit(luna_incremental *inc, const luna_beam_options *o, flight *f,
                         const luna_token_seq *src, const int *order, int n, int *next,
                         int max_tokens, luna_nbest *out) {
    int longest = 0;
    for (int s = 0; s < f->S; s++)
        longest = f->src_len[s] > longest ? f->src_len[s] : longest;
    int k = 0;
    while (*next + k < n && f->S + k < f->S_cap) {
        const int len = src[order[*next + k]].len, m = len > longest ? len : longest;
        if (max_tokens > 0 && f->S + k > 0 && (int64_t)(f->S + k + 1) * m > max_tokens) break;
        longest = m;
        k++;
    }
    if (k == 0) return LUNA_OK;
    int m = 0;
    for (int i = 0; i < k; i++)
        m = src[order[*next + i]].len > m ? src[order[*next + i]].len : m;
    int32_t *lens = f->padded + (size_t)k * m;
    for (int i = 0; i < k; i++) {
        const int b = order[*next + i], s = f->S + i;
        const luna_token_seq *x = &src[b];
        if (x->len < 1 || x->tokens[x->len - 1] != LUNA_DICT_EOS)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "beam search: sentence %d does not end with </s>", b);
        for (int t = 0; t < m; t++)
            f->padded[(size_t)i * m + t] =
                t < x->len ? x->tokens[t] : luna_incremental_config(inc)->padding_idx;
        lens[i] = x->len;
        out[b] = (luna_nbest){.hyps = calloc((size_t)o->beam, sizeof(luna_hypothesis))};
        if (!out[b].hyps) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "beam search: out of memory");
        f->id[s] = b;
        if (f->on_device) /* a slot of search state on the backend (read from step 1 on) */
            f->slot[s] = f->free_slot[--f->nfree];
        f->step[s] = 0;
        f->src_len[s] = x->len;
        f->max_len[s] = max_len_of(o, x->len);
        for (int j = 0; j < f->beam && !f->on_device; j++) {
            f->tok[(size_t)(s * f->beam + j) * f->cap] = LUNA_DICT_EOS;
            f->ignore[s * f->beam + j] = false;
        }
    }
    LUNA_TRY(luna_incremental_admit(inc, f->padded, lens, k, m, !o->sampling));
    f->S += k;
    f->one_row = o->sampling ? 0 : k;
    *next += k;
    return LUNA_OK;
}

/* Sentence s's candidates (the top K of score + log-prob over its beams, or one draw per row)
 * into f->cands, its finalized hypotheses into out; returns whether it is done. */
static luna_status select_sentence(const luna_beam_options *o, flight *f, int s, luna_nbest *out,
                                   bool *done) {
    const int beam = f->beam, K = f->K, cap = f->cap, kb = f->kb, nc = f->nc;
    const int step = f->step[s], b = f->id[s];
    const bool forced = step >= f->max_len[s]; /* only </s> allowed */
    luna_cand *top = f->cands + (size_t)s * K;
    int n = 0;
    for (int k = 0; k < (step == 0 && !o->sampling ? 1 : beam); k++) {
        const int r = drow(f, s) + k; /* the decoder's row; the search's is s·beam + k */
        const double base = step ? f->sc[(size_t)(s * beam + k) * cap + step - 1] : 0.0;
        if (forced) {
            const float lp = isnan(f->picked[r]) ? -INFINITY : f->picked[r];
            const luna_cand c = {base + lp, k, LUNA_DICT_EOS, k};
            if (o->sampling)
                top[n++] = c;
            else
                luna_cand_offer(top, &n, K, c);
            continue;
        }
        const float *lp = f->top_lp + (size_t)r * kb;
        const int32_t *tk = f->top_tok + (size_t)r * kb;
        if (o->sampling) {
            const int id = o->sentence_ids ? o->sentence_ids[b] : b;
            const double u =
                luna_sampling_uniform(o->seed, (uint64_t)id, (uint64_t)step * beam + k);
            const int j = luna_sample_index(lp, kb, u);
            top[n++] = (luna_cand){base + lp[j], k, tk[j], k};
            continue;
        }
        for (int j = 0; j < kb; j++)
            luna_cand_offer(top, &n, K, (luna_cand){base + lp[j], k, tk[j], k * kb + j});
    }
    if (!o->sampling) luna_cand_sort(top, n);
    for (; n < nc; n++)
        top[n] = (luna_cand){-INFINITY, 0, LUNA_DICT_UNK, 0}; /* dead fillers */
    bool *eos = f->is_eos + (size_t)s * K;
    bool any = false;
    for (int j = 0; j < nc; j++) {
        eos[j] = top[j].token == LUNA_DICT_EOS && top[j].score != -INFINITY;
        if (j < beam && eos[j] && !f->ignore[s * beam + j]) {
            const size_t r = (size_t)(s * beam + top[j].beam) * cap;
            LUNA_TRY(luna_search_finalize(o, f->tok + r, f->sc + r, out, step, top[j].score));
            any = true;
        }
        if (j < beam) eos[j] = eos[j] || f->ignore[s * beam + j];
    }
    *done = forced || (any && out->count == beam);
    return LUNA_OK;
}

/* One step of every active sentence; finished ones leave the pool. *finished: how many left. */
static luna_status step_pool(luna_incremental *inc, const luna_beam_options *o, flight *f,
                             luna_nbest *out, int *finished) {
    const int beam = f->beam, cap = f->cap, kb = f->kb, R = drow(f, f->S);
    const int ngram = o->no_repeat_ngram_size;
    bool must_end = false;
    int most_bans = 0;
    for (int s = 0; s < f->S; s++)
        for (int r = drow(f, s); r < drow(f, s + 1); r++) { /* decoder row r */
            const int t = f->step[s];
            const int32_t *row = f->tok + (size_t)(s * beam + r - drow(f, s)) * cap;
            f->row_tok[r] = row[t];
            must_end = must_end || t >= f->max_len[s];
            int32_t *ban = f->ban + (size_t)r * (cap + 1);
            f->nban[r] = ngram > 0 ? luna_ngram_bans(row, t + 1, ngram, ban) : 0;
            if (t < o->min_len) ban[f->nban[r]++] = LUNA_DICT_EOS;
            most_bans = f->nban[r] > most_bans ? f->nban[r] : most_bans;
        }
    const int k_req = kb + most_bans < f->V ? kb + most_bans : f->V;
    luna_step_output so = {.k = k_req,
                           .top_log_probs = f->top_lp,
                           .top_tokens = f->top_tok,
                           .pick = must_end ? f->pick : NULL,
                           .picked = f->picked};
    LUNA_TRY(luna_incremental_step(inc, f->row_tok, &so));
    for (int r = 0; most_bans > 0 && r < R; r++) { /* rows in order: [r, k_req] -> [r, kb] */
        float *lp = f->top_lp + (size_t)r * k_req;
        int32_t *tk = f->top_tok + (size_t)r * k_req;
        luna_drop_banned(lp, tk, k_req, kb, f->ban + (size_t)r * (cap + 1), f->nban[r],
                         LUNA_DICT_UNK);
        if (r > 0) {
            memmove(f->top_lp + (size_t)r * kb, lp, sizeof(float) * (size_t)kb);
            memmove(f->top_tok + (size_t)r * kb, tk, sizeof(int32_t) * (size_t)kb);
        }
    }
    int remaining = 0;
    for (int s = 0; s < f->S; s++) {
        bool done;
        LUNA_TRY(select_sentence(o, f, s, &out[f->id[s]], &done));
        f->rows[s] = done ? -1 : remaining++;
        if (done) luna_search_sort_nbest(&out[f->id[s]], o->nbest);
    }
    *finished = f->S - remaining;
    /* next beam: the first `beam` non-</s> candidates of each remaining sentence, which moves to
     * index rows[s] (its per-sentence values move with it) */
    int32_t *reorder = f->row_tok; /* read by the step above, free now */
    for (int s = 0; s < f->S; s++) {
        const int s2 = f->rows[s];
        if (s2 < 0) continue;
        const luna_cand *top = f->cands + (size_t)s * f->K;
        const bool *eos = f->is_eos + (size_t)s * f->K;
        const int step = f->step[s];
        int picked = 0;
        for (int pass = 0; pass < 2 && picked < beam; pass++)
            for (int j = 0; j < f->nc && picked < beam; j++) {
                if (eos[j] != (pass == 1)) continue;
                const int nr = s2 * beam + picked++, parent = s * beam + top[j].beam;
                reorder[nr] = drow(f, s) + top[j].beam; /* the parent's decoder row */
                f->ignore2[nr] = pass == 1;
                memcpy(f->tok2 + (size_t)nr * cap, f->tok + (size_t)parent * cap,
                       sizeof(int32_t) * (size_t)(step + 1));
                f->tok2[(size_t)nr * cap + step + 1] = top[j].token;
                memcpy(f->sc2 + (size_t)nr * cap, f->sc + (size_t)parent * cap,
                       sizeof(double) * (size_t)step);
                f->sc2[(size_t)nr * cap + step] = top[j].score;
            }
        f->id[s2] = f->id[s]; /* s2 ≤ s: sentences before s are placed already */
        f->step[s2] = step + 1;
        f->max_len[s2] = f->max_len[s];
        f->src_len[s2] = f->src_len[s];
    }
    LUNA_TRY(luna_incremental_reorder(inc, reorder, remaining * beam));
    int32_t *ti = f->tok;
    f->tok = f->tok2, f->tok2 = ti;
    double *si = f->sc;
    f->sc = f->sc2, f->sc2 = si;
    bool *ii = f->ignore;
    f->ignore = f->ignore2, f->ignore2 = ii;
    f->S = remaining;
    f->one_row = 0;
    return LUNA_OK;
}

/* A finished sentence's hypotheses from its slot's record (in the order they finished, as
 * select_sentence files them), then sorted. */
/* Sentence s's hypotheses from its finished record: `rec` on the host (read_records), or NULL
 * to read it from the backend here. */
static luna_status collect_finished(const luna_beam_options *o, flight *f, int s,
                                    unsigned char *rec, luna_nbest *out) {
    const int h = f->slot[s], beam = f->beam, cap = f->cap;
    if (!rec) {
        LUNA_TRY(luna_mem_to_host(f->be, f->record, f->d_finished + (size_t)h * f->record_bytes,
                                  f->record_bytes));
        rec = f->record;
    }
    const int count = *luna_beam_finished_count(rec);
    for (int k = 0; k < count; k++) {
        const int step = luna_beam_finished_steps(rec, beam)[k];
        for (int i = 0; i <= step && i < cap; i++) {
            f->rec_tok[i] = luna_beam_finished_tokens_at(rec, beam, i)[k];
            f->rec_lp[i] = luna_beam_finished_log_probs_at(rec, beam, i)[k];
        }
        LUNA_TRY(luna_search_finalize_log_probs(o, f->rec_tok, f->rec_lp, out, step,
                                                luna_beam_finished_eos(rec)[k]));
    }
    luna_search_sort_nbest(out, o->nbest);
    f->free_slot[f->nfree++] = h;
    return LUNA_OK;
}

/* On a device: the records of the sentences the summary marks done, gathered on the device in
 * the order of their sentences and read back in one copy into f->record; *n of them. */
static luna_status read_records(flight *f, int S, int *n) {
    *n = 0;
    if (!f->records_dev) return LUNA_OK;
    for (int s = 0; s < S; s++)
        if (f->summary[s])
            LUNA_TRY(luna_mem_copy(f->be, f->records_dev + (size_t)(*n)++ * f->record_bytes,
                                   f->d_finished + (size_t)f->slot[s] * f->record_bytes,
                                   f->record_bytes));
    if (*n == 0) return LUNA_OK;
    return luna_mem_to_host(f->be, f->record, f->records_dev, f->record_bytes * (size_t)*n);
}

/* step_pool with the selection on the backend (beam search). */
static luna_status step_pool_device(luna_incremental *inc, const luna_beam_options *o, flight *f,
                                    luna_nbest *out, int *finished) {
    const int beam = f->beam, S = f->S, ngram = o->no_repeat_ngram_size;
    bool must_end = false;
    int most_bans = 0; /* a bound: the bans themselves are counted on the backend */
    for (int s = 0; s < S; s++) {
        const int t = f->step[s];
        must_end = must_end || t >= f->max_len[s];
        const int bans = (ngram > 0 && t + 1 - ngram > 0 ? t + 1 - ngram : 0) + (t < o->min_len);
        most_bans = bans > most_bans ? bans : most_bans;
        if (t == 0)
            for (int r = drow(f, s); r < drow(f, s + 1); r++)
                f->row_tok[r] = LUNA_DICT_EOS;
    }
    int k_req = f->kb + most_bans < f->V ? f->kb + most_bans : f->V;
    if (most_bans > 0 && luna_incremental_uses_graphs(inc)) {
        /* candidates for the bans in steps of 8: a step graph serves 8 steps, not one (the
         * extra candidates rank below those the selection needs, so it never takes them) */
        const int k8 = f->kb + (most_bans + 7) / 8 * 8;
        k_req = k8 < f->k_cap ? k8 : f->k_cap;
    }
    luna_step_output so = {.k = k_req,
                           .top_log_probs = f->d_lp,
                           .top_tokens = f->d_list_tok,
                           .pick = must_end ? f->pick : NULL,
                           .picked = f->d_picked,
                           .on_device = true};
    /* read the summary back now, or go on on the backend; a sentence at its length limit
     * finishes this step, and must leave before it would step past it */
    const bool readback = must_end || f->since + 1 >= f->interval;
    if (f->fresh)
        LUNA_TRY(luna_mem_zero(f->be, f->d_summary, sizeof(int32_t) * (size_t)S)); /* done */
    f->fresh = false;
    if (f->tok_dev)
        LUNA_TRY(luna_incremental_step_device_tokens(inc, f->tok_dev, &so));
    else
        LUNA_TRY(luna_incremental_step(inc, f->row_tok, &so));
    int32_t *row_first = f->sent_host, *step = row_first + S + 1, *max_len = step + S,
            *slot = max_len + S;
    for (int s = 0; s <= S; s++)
        row_first[s] = drow(f, s);
    for (int s = 0; s < S; s++)
        step[s] = f->step[s], max_len[s] = f->max_len[s], slot[s] = f->slot[s];
    LUNA_TRY(luna_mem_from_host(f->be, f->d_sent, f->sent_host, sizeof(int32_t) * (4 * S + 1)));
    const int c = f->cur;
    const luna_beam_select_args a = {.S = S,
                                     .beam = beam,
                                     .kb = f->kb,
                                     .k_list = k_req,
                                     .cap = f->cap,
                                     .rows = f->S_cap * beam,
                                     .min_len = o->min_len,
                                     .ngram = ngram,
                                     .eos = LUNA_DICT_EOS,
                                     .unk = LUNA_DICT_UNK,
                                     .top_lp = f->d_lp,
                                     .top_tok = f->d_list_tok,
                                     .picked = must_end ? f->d_picked : NULL,
                                     .row_first = f->d_sent,
                                     .step = f->d_sent + S + 1,
                                     .max_len = f->d_sent + 2 * S + 1,
                                     .slot = f->d_sent + 3 * S + 1,
                                     .tok = f->d_tok,
                                     .score = f->d_score,
                                     .back = f->d_back,
                                     .ignore = f->d_ignore[c],
                                     .ignore_out = f->d_ignore[1 - c],
                                     .summary = f->d_summary,
                                     .finished = f->d_finished,
                                     .work = f->d_work};
    LUNA_TRY(f->be->ops->beam_select(f->be, &a));
    f->cur = 1 - c;
    if (!readback) { /* the next step starts from the op's rows and tokens */
        LUNA_TRY(luna_incremental_reorder_beams_device(inc, f->d_summary + S));
        f->tok_dev = f->d_summary + S + (size_t)S * beam;
        for (int s = 0; s < S; s++)
            f->step[s]++;
        f->one_row = 0;
        f->since++;
        *finished = 0;
        return LUNA_OK;
    }
    f->tok_dev = NULL;
    f->since = 0;
    f->fresh = true;
    LUNA_TRY(luna_mem_to_host(f->be, f->summary, f->d_summary,
                              sizeof(int32_t) * (size_t)S * (1 + 2 * beam)));
    const int32_t *parent = f->summary + S, *token = parent + (size_t)S * beam;
    int remaining = 0, gathered, done = 0;
    LUNA_TRY(read_records(f, S, &gathered));
    for (int s = 0; s < S; s++) {
        if (f->summary[s]) {
            unsigned char *rec = gathered ? f->record + (size_t)done++ * f->record_bytes : NULL;
            LUNA_TRY(collect_finished(o, f, s, rec, &out[f->id[s]]));
            continue;
        }
        const int s2 = remaining++; /* s2 ≤ s: sentences before s are placed already */
        for (int p = 0; p < beam; p++) {
            f->next_rows[s2 * beam + p] = parent[s * beam + p];
            f->row_tok[s2 * beam + p] = token[s * beam + p];
        }
        f->id[s2] = f->id[s];
        f->step[s2] = f->step[s] + 1;
        f->max_len[s2] = f->max_len[s];
        f->src_len[s2] = f->src_len[s];
        f->slot[s2] = f->slot[s];
    }
    *finished = S - remaining;
    LUNA_TRY(luna_incremental_reorder(inc, f->next_rows, remaining * beam));
    f->S = remaining;
    f->one_row = 0;
    return LUNA_OK;
}

static luna_status generate(luna_incremental *inc, const luna_beam_options *o,
                            const luna_token_seq *src, const int *order, int n, int max_tokens,
                            int batch_size, luna_nbest *out,
                            void (*progress)(void *ctx, int done, int total), void *ctx) {
    const luna_config *c = luna_incremental_config(inc);
    const int V = c->vocab_size;
    const int topk = o->sampling_topk > 0 && o->sampling_topk < V ? o->sampling_topk : V;
    flight f = {.beam = o->beam,
                .K = 2 * o->beam,
                .nc = o->sampling ? o->beam : 2 * o->beam,
                .kb = o->sampling ? topk : (2 * o->beam < V ? 2 * o->beam : V),
                .V = V};
    int max_steps = 0, shortest = src[order[0]].len;
    f.m_cap = src[order[n - 1]].len;
    for (int i = 0; i < n; i++)
        max_steps =
            max_len_of(o, src[i].len) + 1 > max_steps ? max_len_of(o, src[i].len) + 1 : max_steps;
    f.cap = max_steps + 1;
    f.S_cap = batch_size > 0 && batch_size < n ? batch_size : n;
    if (max_tokens > 0) { /* the most sentences max_tokens lets in at once */
        const int most = shortest > 0 && max_tokens / shortest > 1 ? max_tokens / shortest : 1;
        f.S_cap = most < f.S_cap ? most : f.S_cap;
    }
    /* room for kb candidates plus the bans of a row (at most one per earlier position, and
     * </s>) */
    f.k_cap = f.kb + f.cap + 1 < V ? f.kb + f.cap + 1 : V;
    f.on_device = !o->sampling;
    f.be = luna_incremental_backend(inc);
    f.interval = o->sync_interval > 0 ? o->sync_interval : f.be->device == LUNA_DEVICE_CPU ? 1 : 8;
    f.fresh = true;
    luna_status st = flight_alloc(&f);
    if (st == LUNA_OK && f.on_device) st = flight_alloc_device(&f);
    float *bias = calloc((size_t)V, sizeof(float));
    if (st == LUNA_OK && !bias) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoding: out of memory");
    if (st == LUNA_OK) {
        bias[c->padding_idx] = -INFINITY;
        bias[LUNA_DICT_UNK] = -(float)o->unkpen;
        st = luna_incremental_set_token_bias(inc, bias);
    }
    free(bias);
    if (st == LUNA_OK) st = luna_incremental_set_temperature(inc, o->temperature);
    if (st == LUNA_OK) st = luna_incremental_begin_pool(inc, f.S_cap, f.m_cap, o->beam, max_steps);
    int next = 0, done = 0;
    while (st == LUNA_OK) {
        if (!f.tok_dev) /* sentences join at a readback */
            st = admit(inc, o, &f, src, order, n, &next, max_tokens, out);
        if (st != LUNA_OK || f.S == 0) break;
        int finished = 0;
        st = f.on_device ? step_pool_device(inc, o, &f, out, &finished)
                         : step_pool(inc, o, &f, out, &finished);
        done += finished;
        if (st == LUNA_OK && finished > 0 && progress) progress(ctx, done, n);
    }
    flight_free(&f);
    return st;
}

luna_status luna_generate(luna_incremental *inc, const luna_beam_options *opt,
                          const luna_token_seq *src, int n, int max_tokens, int batch_size,
                          luna_nbest *out, void (*progress)(void *ctx, int done, int total),
                          void *ctx) {
    for (int i = 0; i < n; i++)
        out[i] = (luna_nbest){0};
    if (n <= 0) return LUNA_OK;
    LUNA_TRY(luna_search_check_options(opt));
    int *order;
    LUNA_TRY(luna_search_sorted_order(src, n, &order));
    luna_status st = generate(inc, opt, src, order, n, max_tokens, batch_size, out, progress, ctx);
    if (st != LUNA_OK)
        for (int i = 0; i < n; i++)
            luna_nbest_release(&out[i]);
    free(order);
    return st;
}
