#include "decoding/beam_search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dictionary.h"
#include "core/beam_candidates.h"
#include "decoding/sampling.h"
#include "decoding/search_internal.h"

void luna_beam_options_init(luna_beam_options *o) {
    *o = (luna_beam_options){.beam = 5,
                             .lenpen = 1.0,
                             .max_len_a = 0.0,
                             .max_len_b = 200,
                             .max_len_cap = 1023,
                             .min_len = 1,
                             .nbest = 1,
                             .unkpen = 0.0,
                             .no_repeat_ngram_size = 0,
                             .temperature = 1.0,
                             .sampling = false,
                             .sampling_topk = 0,
                             .seed = 1,
                             .sentence_ids = NULL,
                             .sync_interval = 0};
}

static void hyp_release(luna_hypothesis *h) {
    free(h->tokens);
    free(h->positional_scores);
    memset(h, 0, sizeof *h);
}

void luna_nbest_release(luna_nbest *n) {
    if (!n) return;
    for (int i = 0; i < n->count; i++)
        hyp_release(&n->hyps[i]);
    free(n->hyps);
    memset(n, 0, sizeof *n);
}

luna_status luna_search_check_options(const luna_beam_options *o) {
    if (o->beam < 1 || o->nbest < 1 || o->nbest > o->beam || o->min_len < 0 || o->max_len_b < 0 ||
        o->max_len_a < 0 || o->max_len_cap < 1 || !isfinite(o->lenpen) || isnan(o->unkpen) ||
        o->no_repeat_ngram_size < 0 || !(o->temperature > 0) || !isfinite(o->temperature) ||
        o->sync_interval < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "beam search: bad options (beam %d, nbest %d (1..beam), min-len %d, "
                          "max-len-a %g, max-len-b %d, lenpen %g, unkpen %g, "
                          "no-repeat-ngram-size %d, temperature %g (> 0))",
                          o->beam, o->nbest, o->min_len, o->max_len_a, o->max_len_b, o->lenpen,
                          o->unkpen, o->no_repeat_ngram_size, o->temperature);
    return LUNA_OK;
}

/* ---- one batch ------------------------------------------------------------------------------- */

typedef luna_cand cand;

typedef struct {
    int S, beam, K, V, cap, eos, pad, unk;
    int nc;                  /* candidates per sentence: K (beam search) or beam (sampling) */
    int kb;                  /* candidates per row handed to the selection (after the bans) */
    const int *ids;          /* [S] index of each batch sentence in the input (sampling draws) */
    int32_t *ban;            /* [S·beam, cap] n-gram bans of each row (no_repeat_ngram_size) */
    int *nban;               /* [S·beam] */
    int *max_len;            /* [S] per sentence of the batch */
    int *active;             /* [S] current sentence -> batch sentence */
    int32_t *tok, *tok2;     /* [S·beam, cap] */
    double *sc, *sc2;        /* [S·beam, cap] cumulative scores */
    bool *ignore, *ignore2;  /* [S·beam] fairseq's cands_to_ignore */
    cand *cands;             /* [S, K] */
    bool *is_eos;            /* [S, K] */
    int32_t *rows, *row_tok; /* [S·beam] */
    float *top_lp;           /* [S·beam, kb + bans] each row's best log-probs (after the bias) */
    int32_t *top_tok;        /* [S·beam, kb + bans] */
    int32_t *pick;           /* [S·beam] </s> (for the rows that must end) */
    float *picked;           /* [S·beam] log-prob of </s> without the bias */
    float *bias;             /* [V] the token bias: <pad> banned, <unk> penalised, </s> banned
                                before min_len */
} search;

luna_status luna_search_finalize_log_probs(const luna_beam_options *o, const int32_t *t,
                                           const float *lp, luna_nbest *out, int step,
                                           double eos_score) {
    if (out->count >= o->beam) return LUNA_OK;
    const int len = step + 1;
    luna_hypothesis h = {.len = len};
    h.tokens = malloc(sizeof(int32_t) * (size_t)len);
    h.positional_scores = malloc(sizeof(float) * (size_t)len);
    if (!h.tokens || !h.positional_scores) {
        hyp_release(&h);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "beam search: out of host memory");
    }
    for (int i = 0; i < step; i++)
        h.tokens[i] = t[i + 1];
    h.tokens[step] = LUNA_DICT_EOS;
    memcpy(h.positional_scores, lp, sizeof(float) * (size_t)len);
    h.score = eos_score / pow((double)len, o->lenpen);
    out->hyps[out->count++] = h;
    return LUNA_OK;
}

luna_status luna_search_finalize(const luna_beam_options *o, const int32_t *t, const double *s,
                                 luna_nbest *out, int step, double eos_score) {
    if (out->count >= o->beam) return LUNA_OK;
    float *lp = malloc(sizeof(float) * (size_t)(step + 1));
    if (!lp) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "beam search: out of host memory");
    for (int i = 0; i <= step; i++) /* as beam_select's records (core/beam_select.h) */
        lp[i] = (float)((i < step ? s[i] : eos_score) - (i ? s[i - 1] : 0.0));
    luna_status st = luna_search_finalize_log_probs(o, t, lp, out, step, eos_score);
    free(lp);
    return st;
}

static luna_status run_batch(luna_incremental *inc, const luna_beam_options *o, search *z,
                             luna_nbest *out) {
    const int beam = z->beam, K = z->K, cap = z->cap, nc = z->nc, kb = z->kb;
    const int ngram = o->no_repeat_ngram_size;
    int S = z->S;
    for (int s = 0; s < S; s++)
        z->active[s] = s;
    for (int r = 0; r < S * beam; r++) {
        z->tok[(size_t)r * cap] = z->eos;
        z->ignore[r] = false;
    }
    /* beam search: step 0 decodes one row per sentence (luna_incremental_begin_one_row; its beams
     * are identical there), the first reorder expands it; sampling draws on every row */
    const bool one_row = !o->sampling;
    for (int step = 0;; step++) {
        const int rpb = step == 0 && one_row ? 1 : beam; /* the decoder's rows per sentence */
        const int R = S * rpb;
        for (int r = 0; r < R; r++) /* decoder row r is the search's row r / rpb · beam + r % rpb */
            z->row_tok[r] = z->tok[(size_t)(r / rpb * beam + r % rpb) * cap + step];
        /* the bias: </s> banned before min_len (a sentence at max_len reads its </s> unbiased) */
        if (step == 0 || step == o->min_len) {
            z->bias[z->eos] = step < o->min_len ? -INFINITY : 0.0f;
            LUNA_TRY(luna_incremental_set_token_bias(inc, z->bias));
        }
        bool must_end = false;
        for (int s = 0; s < S; s++)
            must_end = must_end || step >= z->max_len[z->active[s]];
        /* n-gram bans: ask for kb + (most bans of a row) candidates, drop the banned below */
        int most_bans = 0;
        for (int r = 0; ngram > 0 && r < R; r++) {
            z->nban[r] = luna_ngram_bans(z->tok + (size_t)(r / rpb * beam + r % rpb) * cap,
                                         step + 1, ngram, z->ban + (size_t)r * cap);
            most_bans = z->nban[r] > most_bans ? z->nban[r] : most_bans;
        }
        const int k_req = kb + most_bans < z->V ? kb + most_bans : z->V;
        luna_step_output so = {.k = k_req,
                               .top_log_probs = z->top_lp,
                               .top_tokens = z->top_tok,
                               .pick = must_end ? z->pick : NULL,
                               .picked = z->picked};
        LUNA_TRY(luna_incremental_step(inc, z->row_tok, &so));
        for (int r = 0; most_bans > 0 && r < R; r++) /* rows in order: [r, k_req] -> [r, kb] */
            luna_drop_banned(z->top_lp + (size_t)r * k_req, z->top_tok + (size_t)r * k_req, k_req,
                             kb, z->ban + (size_t)r * cap, z->nban[r], z->unk);
        for (int r = 0; most_bans > 0 && r < R; r++)
            if (r > 0) {
                memmove(z->top_lp + (size_t)r * kb, z->top_lp + (size_t)r * k_req,
                        sizeof(float) * (size_t)kb);
                memmove(z->top_tok + (size_t)r * kb, z->top_tok + (size_t)r * k_req,
                        sizeof(int32_t) * (size_t)kb);
            }
        /* candidates and finalization, per sentence: the top K of (score + log-prob) over the
         * beams' candidates (each row's K best hold the sentence's K best) */
        int remaining = 0;
        for (int s = 0; s < S; s++) {
            cand *top = z->cands + (size_t)s * K;
            const bool forced = step >= z->max_len[z->active[s]]; /* only </s> allowed */
            const int b = z->active[s];
            int n = 0;
            /* sampling: candidate k is row k's draw (every row draws, at step 0 too) */
            for (int k = 0; k < (step == 0 && !o->sampling ? 1 : beam); k++) {
                const int r = s * rpb + k; /* the decoder's row; the search's is s·beam + k */
                const double base = step ? z->sc[(size_t)(s * beam + k) * cap + step - 1] : 0.0;
                if (forced) {
                    const float lp = isnan(z->picked[r]) ? -INFINITY : z->picked[r];
                    const cand c = {base + lp, k, z->eos, k};
                    if (o->sampling)
                        top[n++] = c; /* row order, as every draw */
                    else
                        luna_cand_offer(top, &n, K, c);
                    continue;
                }
                const float *lp = z->top_lp + (size_t)r * kb;
                const int32_t *tk = z->top_tok + (size_t)r * kb;
                if (o->sampling) {
                    const double u = luna_sampling_uniform(o->seed, (uint64_t)z->ids[b],
                                                           (uint64_t)step * beam + k);
                    const int j = luna_sample_index(lp, kb, u);
                    top[n++] = (cand){base + lp[j], k, tk[j], k};
                    continue;
                }
                for (int j = 0; j < kb; j++)
                    luna_cand_offer(top, &n, K, (cand){base + lp[j], k, tk[j], k * kb + j});
            }
            if (!o->sampling) luna_cand_sort(top, n);
            for (; n < nc; n++)
                top[n] = (cand){-INFINITY, 0, z->unk, 0}; /* dead fillers */
            bool *eos = z->is_eos + (size_t)s * K;
            bool any = false;
            for (int j = 0; j < nc; j++) {
                eos[j] = top[j].token == z->eos && top[j].score != -INFINITY;
                if (j < beam && eos[j] && !z->ignore[s * beam + j]) {
                    const size_t r = (size_t)(s * beam + top[j].beam) * cap;
                    LUNA_TRY(luna_search_finalize(o, z->tok + r, z->sc + r, &out[b], step,
                                                  top[j].score));
                    any = true;
                }
                if (j < beam) eos[j] = eos[j] || z->ignore[s * beam + j];
            }
            bool done = step >= z->max_len[b] || (any && out[b].count == beam);
            z->rows[s] = done ? -1 : remaining;    /* new index of sentence s, or -1 */
            if (!done) z->active[remaining++] = b; /* active[s'] for s' > s not yet read */
        }
        if (remaining == 0) break;
        /* next beam: the first `beam` non-</s> candidates of each remaining sentence */
        for (int s = 0; s < S; s++) {
            const int s2 = z->rows[s];
            if (s2 < 0) continue;
            const cand *top = z->cands + (size_t)s * K;
            const bool *eos = z->is_eos + (size_t)s * K;
            int picked = 0;
            for (int pass = 0; pass < 2 && picked < beam; pass++)
                for (int j = 0; j < nc && picked < beam; j++) {
                    if (eos[j] != (pass == 1)) continue;
                    const int nr = s2 * beam + picked++, parent = s * beam + top[j].beam;
                    z->ignore2[nr] = pass == 1;
                    memcpy(z->tok2 + (size_t)nr * cap, z->tok + (size_t)parent * cap,
                           sizeof(int32_t) * (size_t)(step + 1));
                    z->tok2[(size_t)nr * cap + step + 1] = top[j].token;
                    memcpy(z->sc2 + (size_t)nr * cap, z->sc + (size_t)parent * cap,
                           sizeof(double) * (size_t)step);
                    z->sc2[(size_t)nr * cap + step] = top[j].score;
                    z->row_tok[nr] = parent / beam * rpb + parent % beam; /* the reorder index */
                }
        }
        LUNA_TRY(luna_incremental_reorder(inc, z->row_tok, remaining * beam));
        int32_t *ti = z->tok;
        z->tok = z->tok2, z->tok2 = ti;
        double *si = z->sc;
        z->sc = z->sc2, z->sc2 = si;
        bool *ii = z->ignore;
        z->ignore = z->ignore2, z->ignore2 = ii;
        S = remaining;
    }
    return LUNA_OK;
}

/* Stable sort by score, best first; keep nbest. */
void luna_search_sort_nbest(luna_nbest *n, int nbest) {
    for (int i = 1; i < n->count; i++) {
        luna_hypothesis h = n->hyps[i];
        int j = i;
        while (j > 0 && n->hyps[j - 1].score < h.score) {
            n->hyps[j] = n->hyps[j - 1];
            j--;
        }
        n->hyps[j] = h;
    }
    while (n->count > nbest)
        hyp_release(&n->hyps[--n->count]);
}

/* ids [S]: each sentence's index in the input (the sampling draws'); NULL: 0..S−1. */
static luna_status search_batch(luna_incremental *inc, const luna_beam_options *o,
                                const luna_token_seq *src, const int *ids, int S, luna_nbest *out) {
    LUNA_TRY(luna_search_check_options(o));
    if (S <= 0) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "beam search: no sentences");
    const luna_config *c = luna_incremental_config(inc);
    const int V = c->vocab_size;
    const int topk = o->sampling_topk > 0 && o->sampling_topk < V ? o->sampling_topk : V;
    search z = {.S = S,
                .beam = o->beam,
                .K = 2 * o->beam,
                .nc = o->sampling ? o->beam : 2 * o->beam,
                .kb = o->sampling ? topk : (2 * o->beam < V ? 2 * o->beam : V),
                .V = V,
                .eos = LUNA_DICT_EOS,
                .pad = c->padding_idx,
                .unk = LUNA_DICT_UNK};
    int *own_ids = NULL;
    if (!ids) {
        if (!(own_ids = malloc(sizeof(int) * (size_t)S)))
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "beam search: out of host memory");
        for (int s = 0; s < S; s++)
            own_ids[s] = s;
        ids = own_ids;
    }
    z.ids = ids;
    int m = 0, max_steps = 0;
    for (int s = 0; s < S; s++)
        m = src[s].len > m ? src[s].len : m;
    const size_t R = (size_t)S * o->beam;
    z.max_len = malloc(sizeof(int) * (size_t)S);
    int32_t *padded = malloc(sizeof(int32_t) * ((size_t)S * m + S));
    for (int s = 0; z.max_len && s < S; s++) {
        double ml = o->max_len_a * src[s].len + o->max_len_b;
        z.max_len[s] = ml < o->max_len_cap ? (int)ml : o->max_len_cap;
        max_steps = z.max_len[s] + 1 > max_steps ? z.max_len[s] + 1 : max_steps;
    }
    z.cap = max_steps + 1;
    z.active = malloc(sizeof(int) * (size_t)S);
    z.tok = malloc(sizeof(int32_t) * R * z.cap);
    z.tok2 = malloc(sizeof(int32_t) * R * z.cap);
    z.sc = malloc(sizeof(double) * R * z.cap);
    z.sc2 = malloc(sizeof(double) * R * z.cap);
    z.ignore = malloc(sizeof(bool) * R);
    z.ignore2 = malloc(sizeof(bool) * R);
    z.cands = malloc(sizeof(cand) * (size_t)S * z.K);
    z.is_eos = malloc(sizeof(bool) * (size_t)S * z.K);
    z.rows = malloc(sizeof(int32_t) * R);
    z.row_tok = malloc(sizeof(int32_t) * R);
    /* room for kb candidates plus the bans of a row (at most one per earlier position) */
    const size_t k_cap = (size_t)(o->no_repeat_ngram_size > 0 && z.kb + z.cap < V ? z.kb + z.cap
                                  : o->no_repeat_ngram_size > 0                   ? V
                                                                                  : z.kb);
    z.top_lp = malloc(sizeof(float) * R * k_cap);
    z.top_tok = malloc(sizeof(int32_t) * R * k_cap);
    z.ban = malloc(sizeof(int32_t) * R * (o->no_repeat_ngram_size > 0 ? z.cap : 1));
    z.nban = calloc(R, sizeof(int));
    z.pick = malloc(sizeof(int32_t) * R);
    z.picked = malloc(sizeof(float) * R);
    z.bias = calloc((size_t)z.V, sizeof(float));
    luna_status st = LUNA_OK;
    for (size_t r = 0; z.pick && r < R; r++)
        z.pick[r] = z.eos;
    if (z.bias) {
        z.bias[z.pad] = -INFINITY;
        z.bias[z.unk] = -(float)o->unkpen;
    }
    if (!z.max_len || !padded || !z.active || !z.tok || !z.tok2 || !z.sc || !z.sc2 || !z.ignore ||
        !z.ignore2 || !z.cands || !z.is_eos || !z.rows || !z.row_tok || !z.top_lp || !z.top_tok ||
        !z.pick || !z.picked || !z.bias || !z.ban || !z.nban)
        st =
            luna_error(LUNA_ERR_OUT_OF_MEMORY, "beam search: out of host memory (%d sentences)", S);
    for (int s = 0; s < S && st == LUNA_OK; s++) {
        out[s] = (luna_nbest){.hyps = calloc((size_t)o->beam, sizeof(luna_hypothesis))};
        if (!out[s].hyps) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "beam search: out of memory");
        if (src[s].len < 1 || src[s].tokens[src[s].len - 1] != LUNA_DICT_EOS)
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                            "beam search: sentence %d does not end with </s>", s);
        int32_t *p = padded + (size_t)s * m;
        for (int t = 0; t < m && st == LUNA_OK; t++)
            p[t] = t < src[s].len ? src[s].tokens[t] : z.pad;
        padded[(size_t)S * m + s] = src[s].len;
    }
    if (st == LUNA_OK) st = luna_incremental_set_temperature(inc, o->temperature);
    if (st == LUNA_OK)
        st = o->sampling ? luna_incremental_begin(inc, padded, padded + (size_t)S * m, S, m,
                                                  o->beam, max_steps)
                         : luna_incremental_begin_one_row(inc, padded, padded + (size_t)S * m, S, m,
                                                          o->beam, max_steps);
    if (st == LUNA_OK) st = run_batch(inc, o, &z, out);
    for (int s = 0; s < S && st == LUNA_OK; s++)
        luna_search_sort_nbest(&out[s], o->nbest);
    if (st != LUNA_OK)
        for (int s = 0; s < S; s++)
            luna_nbest_release(&out[s]);
    free(padded);
    free(z.max_len);
    free(z.active);
    free(z.tok);
    free(z.tok2);
    free(z.sc);
    free(z.sc2);
    free(z.ignore);
    free(z.ignore2);
    free(z.cands);
    free(z.is_eos);
    free(z.rows);
    free(z.row_tok);
    free(z.top_lp);
    free(z.top_tok);
    free(z.pick);
    free(z.picked);
    free(z.bias);
    free(z.ban);
    free(z.nban);
    free(own_ids);
    return st;
}

luna_status luna_beam_search(luna_incremental *inc, const luna_beam_options *o,
                             const luna_token_seq *src, int S, luna_nbest *out) {
    return search_batch(inc, o, src, NULL, S, out);
}

/* ---- many sentences -------------------------------------------------------------------------- */

/* A sentence's sort key: its length, then its index (qsort's comparator gets no context, and
 * searches run concurrently, one per translator thread: the key carries what it compares). */
typedef struct {
    int len, index;
} length_key;

static int by_length(const void *a, const void *b) {
    const length_key *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* order[n]: indices sorted by source length; *next = end of the batch starting at `start`. */
static int batch_end(const luna_token_seq *src, const int *order, int n, int start, int max_tokens,
                     int batch_size) {
    int end = start + 1;
    while (end < n && (batch_size <= 0 || end - start < batch_size) &&
           (max_tokens <= 0 || (int64_t)(end - start + 1) * src[order[end]].len <= max_tokens))
        end++;
    return end;
}

luna_status luna_search_sorted_order(const luna_token_seq *src, int n, int **order) {
    *order = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    length_key *key = malloc(sizeof *key * (size_t)(n > 0 ? n : 1));
    if (!*order || !key) {
        free(*order), free(key);
        *order = NULL;
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "decoding: out of host memory");
    }
    for (int i = 0; i < n; i++)
        key[i] = (length_key){src[i].len, i};
    qsort(key, (size_t)n, sizeof *key, by_length);
    for (int i = 0; i < n; i++)
        (*order)[i] = key[i].index;
    free(key);
    return LUNA_OK;
}

static luna_status score_batch(luna_incremental *inc, const luna_token_seq *src,
                               const luna_token_seq *tgt, const int *idx, int S,
                               float **positional) {
    const luna_config *c = luna_incremental_config(inc);
    const int V = c->vocab_size;
    int m = 0, n = 0;
    for (int s = 0; s < S; s++) {
        m = src[idx[s]].len > m ? src[idx[s]].len : m;
        n = tgt[idx[s]].len > n ? tgt[idx[s]].len : n;
        if (tgt[idx[s]].len < 1)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "score: target %d is empty", idx[s]);
    }
    int32_t *buf = malloc(sizeof(int32_t) * ((size_t)S * m + 2 * (size_t)S));
    int32_t *pick = malloc(sizeof(int32_t) * (size_t)S);
    float *lp = malloc(sizeof(float) * (size_t)S);
    luna_status st =
        buf && pick && lp ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "score: out of memory");
    int32_t *lens = buf ? buf + (size_t)S * m : NULL, *tok = lens ? lens + S : NULL;
    for (int s = 0; s < S && st == LUNA_OK; s++) {
        const luna_token_seq *x = &src[idx[s]];
        for (int t = 0; t < m; t++)
            buf[(size_t)s * m + t] = t < x->len ? x->tokens[t] : c->padding_idx;
        lens[s] = x->len;
        positional[idx[s]] = malloc(sizeof(float) * (size_t)tgt[idx[s]].len);
        if (!positional[idx[s]]) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "score: out of memory");
    }
    if (st == LUNA_OK) st = luna_incremental_set_temperature(inc, 1.0); /* model's own scores */
    if (st == LUNA_OK) st = luna_incremental_begin(inc, buf, lens, S, m, 1, n);
    for (int t = 0; t < n && st == LUNA_OK; t++) {
        for (int s = 0; s < S; s++) {
            const luna_token_seq *y = &tgt[idx[s]];
            tok[s] = t == 0 ? LUNA_DICT_EOS : (t <= y->len ? y->tokens[t - 1] : c->padding_idx);
            if (tok[s] < 0 || tok[s] >= V) tok[s] = c->padding_idx; /* reported below */
            pick[s] =
                t < y->len && y->tokens[t] >= 0 && y->tokens[t] < V ? y->tokens[t] : c->padding_idx;
        }
        luna_step_output so = {.pick = pick, .picked = lp};
        st = luna_incremental_step(inc, tok, &so);
        for (int s = 0; s < S && st == LUNA_OK; s++) {
            const luna_token_seq *y = &tgt[idx[s]];
            if (t >= y->len) continue;
            if (y->tokens[t] < 0 || y->tokens[t] >= V)
                st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                "score: target %d: token %d out of range", idx[s], y->tokens[t]);
            else
                positional[idx[s]][t] = lp[s];
        }
    }
    free(buf);
    free(pick);
    free(lp);
    return st;
}

luna_status luna_score_targets(luna_incremental *inc, const luna_token_seq *src,
                               const luna_token_seq *tgt, int n, int max_tokens, int batch_size,
                               float **positional) {
    for (int i = 0; i < n; i++)
        positional[i] = NULL;
    int *order;
    LUNA_TRY(luna_search_sorted_order(src, n, &order));
    luna_status st = LUNA_OK;
    for (int start = 0; start < n && st == LUNA_OK;) {
        int end = batch_end(src, order, n, start, max_tokens, batch_size);
        st = score_batch(inc, src, tgt, order + start, end - start, positional);
        start = end;
    }
    if (st != LUNA_OK)
        for (int i = 0; i < n; i++)
            free(positional[i]), positional[i] = NULL;
    free(order);
    return st;
}
