/* One step of the beam search's selection for a pool of sentences, as host/device code
 * (core/host_device.h): the body of the beam_select op (core/backend.h, "Decoding"), compiled by
 * the C compiler for the CPU backend and by nvcc for the CUDA backend (a thread per sentence), so
 * that the search's state (hypotheses, cumulative scores, finished lists) can stay on the device
 * and each backend selects the same candidates bit for bit: the work is double additions and
 * compares, integer moves, no libm.
 *
 * What a sentence's step does is decoding/inflight.c's host selection, line for line (fairseq's
 * SequenceGenerator, decoding/beam_search.h): the top 2·beam of (cumulative score + log-prob)
 * over (beam, token), banned tokens (n-grams, </s> before min_len) dropped from each row's list,
 * </s> candidates among the first `beam` finalized, the next beam from the first `beam` non-</s>
 * candidates. The length penalty (a pow) is left to the host, which turns a finished sentence's
 * record into hypotheses (luna_search_finalize).
 *
 * Sentences keep their search state in slots: slot h holds the `beam` hypotheses (rows h·beam + j)
 * as a tree of back-pointers, as beam searches usually do: a step writes position t + 1 of each
 * new hypothesis (its token, cumulative score and the row of its parent at position t) and never
 * rewrites an earlier position, so a hypothesis is the path back from its last position and
 * nothing is copied per step; the path is walked for the n-gram bans and to file a finished
 * hypothesis into the slot's record. Positions are stored position-major (position i of every
 * row together), so that the memory a search touches grows with the positions it reaches, not
 * with the length limit `cap`. A sentence's decoder rows are
 * row_first[s] .. row_first[s+1] (one row for a sentence at step 0 that joined with one row,
 * else `beam`); the slot indirection lets finished sentences leave the pool without moving the
 * others' histories. At step 0 a sentence reads nothing of its slot (its history is the BOS </s>,
 * nothing ignored, nothing finished).
 *
 * A finished sentence may stay in the pool for more steps (the host reads the summary only every
 * few steps): its done flag stays set, it selects nothing, and its next rows are its own rows
 * with </s> as their token, so the decoder's next step reads valid rows and tokens. */
#ifndef LUNA_CORE_BEAM_SELECT_H
#define LUNA_CORE_BEAM_SELECT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/beam_candidates.h"
#include "core/host_device.h"

typedef struct luna_beam_select_args {
    int S;      /* sentences in the pool */
    int beam;   /* hypotheses per sentence */
    int kb;     /* candidates taken from each row's list after the bans (2·beam, ≤ V) */
    int k_list; /* entries per row in top_lp / top_tok (≥ kb + the row's bans, or all V) */
    int cap;    /* positions per hypothesis row (> the longest step + 1) */
    int rows;   /* slot rows (slots · beam): position i of row q at i·rows + q (histories) */
    int min_len, ngram;
    int32_t eos, unk;
    /* per decoder row: log_softmax_topk's lists [rows, k_list], best first, and picked [rows]
     * (the log-prob of </s>, read for sentences at step ≥ max_len; NULL when there are none) */
    const float *top_lp;
    const int32_t *top_tok;
    const float *picked;
    /* per sentence, int32: row_first [S + 1], step [S], max_len [S], slot [S] */
    const int32_t *row_first, *step, *max_len, *slot;
    /* per slot row q = h·beam + j and position i ≥ 1, at i·rows + q: the token at position i, the
     * cumulative score with it (stored at (i − 1)·rows + q) and the parent's slot row at
     * position i − 1 (back); the step writes position t + 1 of the new rows. Ignore flags [rows]
     * (fairseq's cands_to_ignore): read from ignore, the next step's written to ignore_out. */
    int32_t *tok;
    double *score;
    int32_t *back;
    const uint8_t *ignore;
    uint8_t *ignore_out;
    /* int32 [S·(1 + 2·beam)]: done [S] (1: the sentence is finished; read first: a sentence
     * finished at an earlier step stays so), then its next rows' parent decoder rows [S·beam] and
     * their tokens [S·beam] (sentence s's at s·beam; a finished sentence's: its own rows, </s>) */
    int32_t *summary;
    /* finished records, luna_beam_finished_bytes(beam, cap) per slot (luna_beam_finished_*) */
    unsigned char *finished;
    /* scratch, luna_beam_select_work_bytes(S, beam, cap) */
    void *work;
} luna_beam_select_args;

/* A slot's finished record: count (int32), then for each finished hypothesis f < count (in the
 * order they finished) eos[f] (double, the cumulative score with </s>) and step[f] (the position
 * of </s>), then position by position i < cap: the hypotheses' tokens (int32; position 0 the
 * BOS, then f's step[f] tokens) and the log-prob of the token after position i (float: the
 * difference of the cumulative scores in double, rounded, as luna_search_finalize files it;
 * f's i ≤ step[f], the last one </s>'s), f-th of each position's beam. */
LUNA_HD static inline size_t luna_beam_finished_header(int beam) {
    return 8 + 8 * (size_t)beam + (4 * (size_t)beam + 7) / 8 * 8;
}
LUNA_HD static inline size_t luna_beam_finished_bytes(int beam, int cap) {
    return luna_beam_finished_header(beam) + (size_t)cap * 8 * (size_t)beam;
}
LUNA_HD static inline int32_t *luna_beam_finished_count(unsigned char *rec) {
    return (int32_t *)rec;
}
LUNA_HD static inline double *luna_beam_finished_eos(unsigned char *rec) {
    return (double *)(rec + 8);
}
LUNA_HD static inline int32_t *luna_beam_finished_steps(unsigned char *rec, int beam) {
    return (int32_t *)(rec + 8 + 8 * (size_t)beam);
}
/* the `beam` tokens, and log-probs, of position i */
LUNA_HD static inline int32_t *luna_beam_finished_tokens_at(unsigned char *rec, int beam, int i) {
    return (int32_t *)(rec + luna_beam_finished_header(beam) + (size_t)i * 8 * (size_t)beam);
}
LUNA_HD static inline float *luna_beam_finished_log_probs_at(unsigned char *rec, int beam, int i) {
    return (float *)(luna_beam_finished_tokens_at(rec, beam, i) + beam);
}

/* Element i of slot row q in a history. */
LUNA_HD static inline size_t luna_beam_hist(const luna_beam_select_args *a, int i, size_t q) {
    return (size_t)i * (size_t)a->rows + q;
}

/* scratch per sentence: its candidates, its bans and one hypothesis's tokens */
LUNA_HD static inline size_t luna_beam_select_work_bytes(int S, int beam, int cap) {
    return (size_t)S * (2 * (size_t)beam * sizeof(luna_cand) + 2 * ((size_t)cap + 1) * 4);
}

/* Slot row q's hypothesis at step t: its tokens into seq[0..t] (seq[0] the BOS). */
LUNA_HD static inline void luna_beam_path(const luna_beam_select_args *a, int t, size_t q,
                                          int32_t *seq) {
    for (int i = t; i >= 1; i--) {
        seq[i] = a->tok[luna_beam_hist(a, i, q)];
        q = (size_t)a->back[luna_beam_hist(a, i, q)];
    }
    seq[0] = a->eos;
}

/* Files slot row q's hypothesis at step t, ended by </s> with cumulative score eos_score, as
 * finished hypothesis f of the record: its tokens and each position's log-prob, the difference
 * of the cumulative scores (walked back from </s>'s). */
LUNA_HD static inline void luna_beam_file(const luna_beam_select_args *a, unsigned char *rec, int f,
                                          int t, size_t q, double eos_score) {
    const int beam = a->beam;
    luna_beam_finished_eos(rec)[f] = eos_score;
    luna_beam_finished_steps(rec, beam)[f] = t;
    double later = eos_score; /* the cumulative score with the token after position i */
    for (int i = t; i >= 1; i--) {
        const double now = a->score[luna_beam_hist(a, i - 1, q)]; /* with the token at i */
        luna_beam_finished_log_probs_at(rec, beam, i)[f] = (float)(later - now);
        luna_beam_finished_tokens_at(rec, beam, i)[f] = a->tok[luna_beam_hist(a, i, q)];
        later = now;
        q = (size_t)a->back[luna_beam_hist(a, i, q)];
    }
    luna_beam_finished_log_probs_at(rec, beam, 0)[f] = (float)(later - 0.0);
    luna_beam_finished_tokens_at(rec, beam, 0)[f] = a->eos;
}

/* The tokens that would complete an n-gram already in tok[1..len) (tok[0] is the BOS, skipped;
 * token i at tok[i·stride]): for every i ≥ 1 with tok[i .. i+n−2] = tok[len−n+1 .. len) and
 * i + n − 1 < len, tok[i+n−1]. Writes them (with repeats) into ban[0..) (room for len entries)
 * and returns how many. n ≥ 1. */
LUNA_HD static inline int luna_beam_ngram_bans(const int32_t *tok, size_t stride, int len, int n,
                                               int32_t *ban) {
    if (n < 1 || len - (n - 1) < 1) return 0;
    const int key = len - (n - 1); /* the last n − 1 tokens start here */
    int nb = 0;
    for (int i = 1; i + n - 1 < len; i++) {
        int m = 0;
        while (m < n - 1 && tok[(size_t)(i + m) * stride] == tok[(size_t)(key + m) * stride])
            m++;
        if (m == n - 1) ban[nb++] = tok[(size_t)(i + n - 1) * stride];
    }
    return nb;
}

/* Candidate j of a sorted list of nc is "ended" for the next beam: a live </s>, or, among the
 * first beam, a place marked to ignore. */
LUNA_HD static inline bool luna_beam_ended(const luna_beam_select_args *a, const luna_cand *top,
                                           int j, int t, int h) {
    const bool eos = top[j].token == a->eos && top[j].score != -INFINITY;
    return eos || (j < a->beam && t > 0 && a->ignore[(size_t)h * a->beam + j]);
}

/* A finished sentence's next rows: its own, </s> their token. */
LUNA_HD static inline void luna_beam_select_finished(const luna_beam_select_args *a, int s) {
    const int beam = a->beam, r0 = a->row_first[s], rows = a->row_first[s + 1] - r0;
    a->summary[s] = 1;
    for (int p = 0; p < beam; p++) {
        a->summary[a->S + (size_t)s * beam + p] = r0 + (p < rows ? p : rows - 1);
        a->summary[a->S + (size_t)a->S * beam + (size_t)s * beam + p] = a->eos;
    }
}

/* Sentence s's step. */
LUNA_HD static inline void luna_beam_select_sentence(const luna_beam_select_args *a, int s) {
    const int beam = a->beam, nc = 2 * beam, kb = a->kb, cap = a->cap;
    if (a->summary[s]) { /* finished at an earlier step */
        luna_beam_select_finished(a, s);
        return;
    }
    const int t = a->step[s], h = a->slot[s], r0 = a->row_first[s];
    const bool forced = t >= a->max_len[s]; /* only </s> allowed */
    luna_cand *top = (luna_cand *)a->work + (size_t)s * nc;
    int32_t *ban = (int32_t *)((luna_cand *)a->work + (size_t)a->S * nc) +
                   (size_t)s * 2 * ((size_t)cap + 1),
            *seq = ban + cap + 1;
    int n = 0;
    for (int k = 0; k < (t == 0 ? 1 : beam); k++) {
        const size_t q = (size_t)h * beam + k, r = (size_t)r0 + k;
        const double base = t ? a->score[luna_beam_hist(a, t - 1, q)] : 0.0;
        if (forced) {
            const float lp = a->picked[r] != a->picked[r] ? -INFINITY : a->picked[r];
            luna_cand_offer(top, &n, nc, luna_cand_make(base + lp, k, a->eos, k));
            continue;
        }
        int nban = 0;
        if (a->ngram > 0 && t + 1 - a->ngram > 0) {
            luna_beam_path(a, t, q, seq);
            nban = luna_beam_ngram_bans(seq, 1, t + 1, a->ngram, ban);
        }
        if (t < a->min_len) ban[nban++] = a->eos;
        const float *lp = a->top_lp + r * a->k_list;
        const int32_t *tk = a->top_tok + r * a->k_list;
        int w = 0;
        for (int j = 0; j < a->k_list && w < kb; j++) {
            bool banned = false;
            for (int b = 0; b < nban && !banned; b++)
                banned = tk[j] == ban[b];
            if (banned) continue;
            luna_cand_offer(top, &n, nc, luna_cand_make(base + lp[j], k, tk[j], k * kb + w));
            w++;
        }
        for (; w < kb; w++) /* fewer than kb left after the bans: dead places */
            luna_cand_offer(top, &n, nc, luna_cand_make(base + -INFINITY, k, a->unk, k * kb + w));
    }
    luna_cand_sort(top, n);
    for (; n < nc; n++)
        top[n] = luna_cand_make(-INFINITY, 0, a->unk, 0); /* dead fillers */
    unsigned char *rec = a->finished + (size_t)h * luna_beam_finished_bytes(beam, cap);
    int32_t *count = luna_beam_finished_count(rec);
    if (t == 0) *count = 0;
    bool any = false;
    for (int j = 0; j < beam; j++) {
        const bool eos = top[j].token == a->eos && top[j].score != -INFINITY;
        if (!eos || (t > 0 && a->ignore[(size_t)h * beam + j])) continue;
        any = true;
        if (*count >= beam) continue;
        luna_beam_file(a, rec, (*count)++, t, (size_t)h * beam + top[j].beam, top[j].score);
    }
    if (forced || (any && *count == beam)) {
        luna_beam_select_finished(a, s);
        return;
    }
    /* the next beam: the first `beam` candidates not ended, then ended ones (marked to ignore) */
    int32_t *parent_row = a->summary + a->S + (size_t)s * beam;
    int32_t *next_tok = a->summary + a->S + (size_t)a->S * beam + (size_t)s * beam;
    int picked = 0;
    for (int pass = 0; pass < 2 && picked < beam; pass++)
        for (int j = 0; j < nc && picked < beam; j++) {
            if (luna_beam_ended(a, top, j, t, h) != (pass == 1)) continue;
            const int p = picked++;
            const size_t nr = (size_t)h * beam + p;
            parent_row[p] = r0 + top[j].beam;
            next_tok[p] = top[j].token;
            a->ignore_out[nr] = pass == 1;
            /* position t + 1: written here only, read from the next step on */
            a->tok[luna_beam_hist(a, t + 1, nr)] = top[j].token;
            a->score[luna_beam_hist(a, t, nr)] = top[j].score;
            a->back[luna_beam_hist(a, t + 1, nr)] = h * beam + top[j].beam;
        }
}

#endif
