/* Moving the incremental decoder's rows between steps (decoding/incremental.h: reorder,
 * reorder_beams_device): Luna's running sums and masks, the transformer's cache-slot table and
 * pages, by the beam search's parent rows. */
#include <stdlib.h>
#include <string.h>

#include "decoding/incremental_internal.h"

/* ---- reordering ------------------------------------------------------------------------------ */

/* buf [n_old rows of `stride` elements]: new row i = old row idx[i] (first `cols` elements),
 * through a scratch copy (a gather cannot run in place). idx: device [n]. */
static luna_status gather_in_place(luna_incremental *inc, luna_act *buf, int64_t stride,
                                   int64_t cols, const int32_t *idx, int64_t n) {
    if (n == 0 || cols == 0) return LUNA_OK;
    luna_backend *be = inc->be;
    luna_pass ps = {.be = be, .arena = inc->scratch};
    luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
    luna_act *tmp;
    luna_status st = luna_pass_alloc(&ps, &tmp, n * cols, "reorder");
    if (st == LUNA_OK) st = be->ops->gather_rows(be, tmp, cols, buf, stride, idx, n, cols);
    if (st == LUNA_OK) st = be->ops->gather_rows(be, buf, stride, tmp, cols, NULL, n, cols);
    luna_arena_release(inc->scratch, mark);
    return st;
}

/* The same when every new row's old row is in its own group of `beam` rows (sentences unchanged,
 * none expanded): one pass in place (gather_rows_in_groups), no second buffer. */
static luna_status gather_beams(luna_incremental *inc, luna_act *buf, int64_t cols,
                                const int32_t *idx, int64_t n, bool within) {
    if (!within || inc->beam > 32) return gather_in_place(inc, buf, cols, cols, idx, n);
    return inc->be->ops->gather_rows_in_groups(inc->be, buf, cols, idx, n / inc->beam, inc->beam,
                                               cols);
}

static luna_status upload_index(luna_incremental *inc, int32_t **dev, const int32_t *host,
                                int64_t n) {
    luna_pass ps = {.be = inc->be, .arena = inc->scratch};
    LUNA_TRY(luna_pass_alloc_i32(&ps, dev, n, "reorder index"));
    return luna_mem_from_host(inc->be, *dev, host, sizeof(int32_t) * (size_t)n);
}

/* The state's gathers: rows by `rows` (device [new_R]), sentences by `sent` (device [S], NULL
 * when the sentences are unchanged). */
static luna_status reorder_state(luna_incremental *inc, const int32_t *rows, const int32_t *sent,
                                 int new_rows, int S, bool expand) {
    if (!inc->luna) { /* the caches stay; new row i takes old row rows[i]'s slot indices */
        int written = inc->step; /* positions of the furthest row */
        for (int s = 0; inc->pool && s < inc->S; s++)
            written = s == 0 || inc->sent_step[s] > written ? inc->sent_step[s] : written;
        LUNA_TRY(luna_cache_slots_reorder(&inc->cs, inc->be, rows, new_rows, written));
    }
    const int64_t d = inc->d;
    /* the same sentences in the same places, each with its beam rows: rows move within groups */
    const bool within = !sent && !expand && new_rows == inc->R;
    for (int i = 0; i < inc->layers; i++) {
        luna_decoder_layer_state *ls = &inc->ls[i];
        if (inc->luna) {
            const int64_t Ld = (int64_t)inc->L * d;
            /* P̃ is the same for the beams of a sentence: only a change of sentences, or the
             * expansion of one row per sentence to `beam`, moves it */
            if (sent || expand)
                LUNA_TRY(gather_in_place(inc, ls->causal.pt, Ld, Ld, rows, new_rows));
            LUNA_TRY(gather_beams(inc, ls->causal.ksum, Ld, rows, new_rows, within));
            LUNA_TRY(gather_beams(inc, ls->causal.vsum, Ld, rows, new_rows, within));
            if (sent) LUNA_TRY(gather_in_place(inc, ls->kp, Ld, Ld, sent, S));
            if (sent && ls->vp != ls->kp) LUNA_TRY(gather_in_place(inc, ls->vp, Ld, Ld, sent, S));
            ls->causal.B = new_rows;
        } else if (!inc->pool) {
            /* self-attention caches: through the slot indices above; the pool's source keys and
             * values: through sent_slot (they stay) */
            const int64_t md = (int64_t)inc->m * d;
            if (sent) LUNA_TRY(gather_in_place(inc, ls->cross_k, md, md, sent, S));
            if (sent) LUNA_TRY(gather_in_place(inc, ls->cross_v, md, md, sent, S));
        }
    }
    return LUNA_OK;
}

luna_status luna_incremental_reorder(luna_incremental *inc, const int32_t *rows, int new_rows) {
    const int beam = inc->beam, R = inc->R, rpb = inc->rpb; /* rpb: the old grouping */
    if (new_rows < 0 || new_rows % beam || new_rows > inc->cap_rows)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: reorder to %d rows (beam %d, capacity %d)",
                          new_rows, beam, inc->cap_rows);
    const int S = new_rows / beam;
    const bool expand = rpb != beam || inc->one_row > 0;
    if (new_rows == 0) { /* every sentence finished (a pool admits new ones after) */
        if (inc->kv) LUNA_TRY(luna_kv_pages_reorder(inc->kv, NULL, 0, inc->S));
        inc->R = inc->S = inc->one_row = 0;
        for (int i = 0; i < inc->layers && inc->luna; i++)
            inc->ls[i].causal.B = 0;
        return LUNA_OK;
    }
    bool rows_identity = new_rows == R && !expand, sent_identity = S == inc->S;
    for (int i = 0; i < new_rows; i++) {
        if (rows[i] < 0 || rows[i] >= R ||
            luna_incremental_row_sentence(inc, rows[i]) !=
                luna_incremental_row_sentence(inc, rows[i - i % beam]))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "incremental decoding: reorder: row %d <- %d is out of [0, %d) or "
                              "mixes sentences within a beam group",
                              i, rows[i], R);
        rows_identity = rows_identity && rows[i] == i;
        sent_identity = sent_identity && luna_incremental_row_sentence(inc, rows[i]) == i / beam;
    }
    if (rows_identity) return LUNA_OK;
    /* host: the new sentences' old indices */
    int32_t *sent = malloc(sizeof(int32_t) * (2 * (size_t)S + 1));
    if (!sent) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "incremental decoding: out of memory");
    for (int s = 0; s < S; s++)
        sent[s] = luna_incremental_row_sentence(inc, rows[s * beam]);
    luna_arena_mark mark = luna_arena_get_mark(inc->scratch);
    int32_t *rows_dev = NULL, *sent_dev = NULL;
    luna_status st = upload_index(inc, &rows_dev, rows, new_rows);
    if (st == LUNA_OK && inc->pool && inc->kv) /* finished sentences give their pages back */
        st = luna_kv_pages_reorder(inc->kv, sent, S, inc->S);
    if (st == LUNA_OK && !sent_identity && S > 0) st = upload_index(inc, &sent_dev, sent, S);
    if (st == LUNA_OK) st = reorder_state(inc, rows_dev, sent_dev, new_rows, S, expand);
    luna_arena_release(inc->scratch, mark);
    if (st == LUNA_OK) {
        int32_t *per_sent[] = {inc->sent_host, inc->pool ? inc->sent_step : NULL,
                               inc->pool && !inc->luna ? inc->sent_slot : NULL};
        int32_t *old = sent + S; /* the sentences' old indices, kept while each array moves */
        memcpy(old, sent, sizeof(int32_t) * (size_t)S);
        for (int a = 0; a < 3; a++) {
            if (!per_sent[a]) continue;
            for (int s = 0; s < S; s++) /* the old values, then the new ones in their place */
                sent[s] = per_sent[a][old[s]];
            memcpy(per_sent[a], sent, sizeof(int32_t) * (size_t)S);
        }
        inc->R = new_rows;
        inc->S = S;
        inc->rpb = beam;
        inc->one_row = 0;
        st = luna_incremental_upload_masks(inc);
    }
    free(sent);
    if (st != LUNA_OK) luna_error_prefix("incremental decoding: reorder");
    return st;
}

luna_status luna_incremental_reorder_beams_device(luna_incremental *inc, const int32_t *rows) {
    if (!inc->pool)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "incremental decoding: a reorder from the device's rows needs a pool "
                          "(luna_incremental_begin_pool)");
    const int beam = inc->beam, S = inc->S;
    if (S == 0) return LUNA_OK;
    const bool expand = inc->rpb != beam || inc->one_row > 0;
    luna_status st = reorder_state(inc, rows, NULL, S * beam, S, expand);
    if (st == LUNA_OK) {
        inc->R = S * beam;
        inc->rpb = beam;
        inc->one_row = 0;
        st = luna_incremental_upload_masks(inc);
    }
    if (st != LUNA_OK) luna_error_prefix("incremental decoding: reorder");
    return st;
}
