/* data/pair_dataset + data/batching: collation, token budgets, order, shuffling, sharding,
 * resumption and filtering. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/batching.h"
#include "data/pair_dataset.h"
#include "core/file_util.h"
#include "tests/test_util.h"

/* ---- helpers ------------------------------------------------------------------------------------
 */

static int32_t max_i32(int32_t a, int32_t b) { return a > b ? a : b; }

static void random_sizes(uint64_t seed, size_t n, int32_t lo, int32_t hi, int32_t *src,
                         int32_t *tgt) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) {
        src[i] = (int32_t)luna_test_uniform(&rng, (float)lo, (float)hi + 1);
        tgt[i] = (int32_t)luna_test_uniform(&rng, (float)lo, (float)hi + 1);
    }
}

static luna_batch_plan *plan_of(const int32_t *src, const int32_t *tgt, size_t n,
                                const luna_batching_options *o) {
    luna_batch_plan *p = NULL;
    luna_status st = luna_batch_plan_create_from_sizes(&p, src, tgt, n, o, "test");
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    return p;
}

/* All batches of one epoch of one shard, as batch indices into the plan (-1 terminated is not
 * needed: *count is set). Batches are identified by their first index pointer. */
static size_t epoch_batches(luna_batch_iterator *it, const luna_batch_plan *p, size_t *out,
                            bool *repeated) {
    const uint32_t *ids;
    size_t n, k = 0;
    bool rep;
    while (luna_batch_iterator_next(it, &ids, &n, &rep)) {
        size_t b = 0;
        while (p->indices + p->offsets[b] != ids)
            b++;
        ck_assert_uint_eq(n, p->offsets[b + 1] - p->offsets[b]);
        if (repeated) repeated[k] = rep;
        out[k++] = b;
    }
    return k;
}

/* ---- plan properties ----------------------------------------------------------------------------
 */

START_TEST(token_budget_and_greedy_cut) {
    enum { N = 5000 };
    int32_t src[N], tgt[N];
    random_sizes(1, N, 1, 120, src, tgt);
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_tokens = 1000;
    o.max_source_positions = o.max_target_positions = 0;
    int32_t multiples[2] = {1, 8};
    for (int m = 0; m < 2; m++) {
        o.required_batch_size_multiple = multiples[m];
        luna_batch_plan *p = plan_of(src, tgt, N, &o);
        ck_assert_uint_eq(p->num_sentences, N);
        ck_assert_uint_gt(p->num_batches, N * 30 / 1000); /* >= total padded tokens / budget */
        for (size_t b = 0; b < p->num_batches; b++) {
            size_t n = p->offsets[b + 1] - p->offsets[b];
            int32_t longest = 0;
            for (size_t k = p->offsets[b]; k < p->offsets[b + 1]; k++)
                longest = max_i32(longest, max_i32(src[p->indices[k]], tgt[p->indices[k]]));
            ck_assert_int_le((int64_t)n * longest, o.max_tokens);
            if (multiples[m] == 1 && b + 1 < p->num_batches) {
                /* Greedy: the next sentence would not have fitted. */
                uint32_t next = p->indices[p->offsets[b + 1]];
                int32_t l2 = max_i32(longest, max_i32(src[next], tgt[next]));
                ck_assert_int_gt((int64_t)(n + 1) * l2, o.max_tokens);
            }
            if (multiples[m] == 8 && b + 1 < p->num_batches && n >= 8) ck_assert_uint_eq(n % 8, 0);
        }
        luna_batch_plan_free(p);
    }
}
END_TEST

/* The case where fairseq's batch_by_size overshoots: after cutting a multiple of 8, the carried
 * remainder plus a much longer sentence no longer fits. Luna re-checks and cuts again. */
START_TEST(no_overshoot_after_multiple_cut) {
    int32_t src[14], tgt[14];
    for (int i = 0; i < 13; i++)
        src[i] = tgt[i] = 10;
    src[13] = tgt[13] = 190;
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_tokens = 200;
    o.shuffle = false;
    luna_batch_plan *p = plan_of(src, tgt, 14, &o);
    ck_assert_uint_eq(p->num_batches, 3);
    ck_assert_uint_eq(p->offsets[1], 8);  /* a multiple of 8 */
    ck_assert_uint_eq(p->offsets[2], 13); /* the remainder alone */
    ck_assert_uint_eq(p->indices[13], 13);
    luna_batch_plan_free(p);
}
END_TEST

START_TEST(max_sentences_and_sorted_order) {
    enum { N = 3000 };
    int32_t src[N], tgt[N];
    random_sizes(2, N, 1, 30, src, tgt);
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_sentences = 24;
    o.shuffle = false;
    luna_batch_plan *p = plan_of(src, tgt, N, &o);
    for (size_t b = 0; b < p->num_batches; b++)
        ck_assert_uint_le(p->offsets[b + 1] - p->offsets[b], 24);
    /* Without shuffling: sorted by (src, tgt, index). */
    for (size_t k = 1; k < p->num_sentences; k++) {
        uint32_t a = p->indices[k - 1], b = p->indices[k];
        ck_assert(src[a] < src[b] ||
                  (src[a] == src[b] && (tgt[a] < tgt[b] || (tgt[a] == tgt[b] && a < b))));
    }
    luna_batch_plan_free(p);
    /* With shuffling: still sorted by (src, tgt), ties in a seeded random order. */
    o.shuffle = true;
    p = plan_of(src, tgt, N, &o);
    luna_batch_plan *again = plan_of(src, tgt, N, &o);
    size_t tie_inversions = 0;
    for (size_t k = 1; k < p->num_sentences; k++) {
        uint32_t a = p->indices[k - 1], b = p->indices[k];
        ck_assert(src[a] < src[b] || (src[a] == src[b] && tgt[a] <= tgt[b]));
        tie_inversions += src[a] == src[b] && tgt[a] == tgt[b] && a > b;
    }
    ck_assert_uint_gt(tie_inversions, 100);
    ck_assert(memcmp(p->indices, again->indices, N * sizeof *p->indices) == 0);
    luna_batch_plan_free(again);
    luna_batch_plan_free(p);
}
END_TEST

START_TEST(filtering_counts_and_rejects) {
    enum { N = 100 };
    int32_t src[N], tgt[N];
    for (int i = 0; i < N; i++)
        src[i] = tgt[i] = 5;
    src[10] = 300; /* > max_source_positions */
    tgt[20] = 260; /* > max_target_positions */
    src[30] = 120; /* fits positions but not max_tokens */
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_source_positions = 256;
    o.max_target_positions = 256;
    o.max_tokens = 100;
    luna_batch_plan *p = plan_of(src, tgt, N, &o);
    ck_assert_uint_eq(p->num_filtered_positions, 2);
    ck_assert_uint_eq(p->num_filtered_tokens, 1);
    ck_assert_uint_eq(p->num_sentences, N - 3);
    for (size_t k = 0; k < p->num_sentences; k++)
        ck_assert(p->indices[k] != 10 && p->indices[k] != 20 && p->indices[k] != 30);
    luna_batch_plan_free(p);
    o.skip_invalid = false;
    ck_assert_int_eq(luna_batch_plan_create_from_sizes(&p, src, tgt, N, &o, "train"),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(luna_error_message(), "train: sentence 10: source 300 / target 5") &&
                      strstr(luna_error_message(), "3 pairs in all"),
                  "%s", luna_error_message());
}
END_TEST

/* ---- epochs, shuffling, sharding, resumption ----------------------------------------------------
 */

START_TEST(every_sentence_once_and_shuffled_per_epoch) {
    enum { N = 4000 };
    int32_t src[N], tgt[N];
    random_sizes(3, N, 1, 60, src, tgt);
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_tokens = 600;
    luna_batch_plan *p = plan_of(src, tgt, N, &o);
    luna_batch_iterator *it, *twin;
    ck_assert_int_eq(luna_batch_iterator_create(&it, p, &o), LUNA_OK);
    ck_assert_int_eq(luna_batch_iterator_create(&twin, p, &o), LUNA_OK);
    size_t nb = p->num_batches;
    size_t *e1 = malloc(nb * sizeof *e1), *e2 = malloc(nb * sizeof *e2),
           *t2 = malloc(nb * sizeof *t2);
    ck_assert_uint_eq(luna_batch_iterator_epoch_length(it), nb);
    ck_assert_uint_eq(epoch_batches(it, p, e1, NULL), nb);
    /* Every sentence exactly once in the epoch. */
    int *seen = calloc(N, sizeof *seen);
    for (size_t k = 0; k < nb; k++)
        for (size_t j = p->offsets[e1[k]]; j < p->offsets[e1[k] + 1]; j++)
            seen[p->indices[j]]++;
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(seen[i], 1);
    free(seen);
    ck_assert_int_eq(luna_batch_iterator_seek(it, 2, 0), LUNA_OK);
    ck_assert_uint_eq(epoch_batches(it, p, e2, NULL), nb);
    ck_assert(memcmp(e1, e2, nb * sizeof *e1) != 0); /* a different order each epoch */
    ck_assert_int_eq(luna_batch_iterator_seek(twin, 2, 0), LUNA_OK);
    ck_assert_uint_eq(epoch_batches(twin, p, t2, NULL), nb);
    ck_assert(memcmp(e2, t2, nb * sizeof *e2) == 0); /* reproducible from (seed, epoch) */
    /* Another seed gives another order. */
    luna_batching_options o2 = o;
    o2.seed = 2;
    luna_batch_iterator *other;
    ck_assert_int_eq(luna_batch_iterator_create(&other, p, &o2), LUNA_OK);
    ck_assert_int_eq(luna_batch_iterator_seek(other, 2, 0), LUNA_OK);
    ck_assert_uint_eq(epoch_batches(other, p, t2, NULL), nb);
    ck_assert(memcmp(e2, t2, nb * sizeof *e2) != 0);
    /* No shuffling: plan order. */
    o2.shuffle = false;
    luna_batch_iterator_free(other);
    ck_assert_int_eq(luna_batch_iterator_create(&other, p, &o2), LUNA_OK);
    ck_assert_uint_eq(epoch_batches(other, p, t2, NULL), nb);
    for (size_t k = 0; k < nb; k++)
        ck_assert_uint_eq(t2[k], k);
    luna_batch_iterator_free(other);
    free(e1);
    free(e2);
    free(t2);
    luna_batch_iterator_free(it);
    luna_batch_iterator_free(twin);
    luna_batch_plan_free(p);
}
END_TEST

START_TEST(sharding_disjoint_and_complete) {
    enum { N = 2000, W = 3 };
    int32_t src[N], tgt[N];
    random_sizes(4, N, 1, 50, src, tgt);
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_tokens = 512;
    o.num_shards = W;
    luna_batch_plan *p = plan_of(src, tgt, N, &o);
    size_t nb = p->num_batches;
    for (size_t n = N - 1; nb % W == 0; n--) { /* make the remainder case happen */
        luna_batch_plan_free(p);
        p = plan_of(src, tgt, n, &o);
        nb = p->num_batches;
    }
    ck_assert_uint_ne(nb % W, 0);
    size_t per_rank = (nb + W - 1) / W;
    int *count = calloc(nb, sizeof *count);
    size_t *got = malloc(per_rank * sizeof *got);
    bool *rep = malloc(per_rank * sizeof *rep);
    size_t repeats = 0;
    for (int r = 0; r < W; r++) {
        o.shard_id = r;
        luna_batch_iterator *it;
        ck_assert_int_eq(luna_batch_iterator_create(&it, p, &o), LUNA_OK);
        ck_assert_int_eq(luna_batch_iterator_seek(it, 5, 0), LUNA_OK);
        ck_assert_uint_eq(luna_batch_iterator_epoch_length(it), per_rank);
        ck_assert_uint_eq(epoch_batches(it, p, got, rep), per_rank); /* same count on every rank */
        for (size_t k = 0; k < per_rank; k++) {
            if (rep[k])
                repeats++;
            else
                count[got[k]]++;
        }
        luna_batch_iterator_free(it);
    }
    for (size_t b = 0; b < nb; b++)
        ck_assert_int_eq(count[b], 1); /* disjoint and complete */
    ck_assert_uint_eq(repeats, W * per_rank - nb);
    free(count);
    free(got);
    free(rep);
    luna_batch_iterator *bad_it = NULL;
    luna_batching_options bad = o;
    bad.num_shards = 2;
    bad.shard_id = 2;
    ck_assert_int_eq(luna_batch_iterator_create(&bad_it, p, &bad), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(bad_it);
    luna_batch_plan_free(p);
}
END_TEST

START_TEST(save_and_restore_position) {
    enum { N = 3000 };
    int32_t src[N], tgt[N];
    random_sizes(5, N, 1, 40, src, tgt);
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_tokens = 400;
    o.seed = 1234;
    luna_batch_plan *p = plan_of(src, tgt, N, &o);
    luna_batch_iterator *a, *b;
    ck_assert_int_eq(luna_batch_iterator_create(&a, p, &o), LUNA_OK);
    /* Uninterrupted reference: epoch 3 in full. */
    ck_assert_int_eq(luna_batch_iterator_seek(a, 3, 0), LUNA_OK);
    size_t nb = p->num_batches, *ref = malloc(nb * sizeof *ref), *rest = malloc(nb * sizeof *rest);
    ck_assert_uint_eq(epoch_batches(a, p, ref, NULL), nb);
    /* Interrupted after 17 batches; the position goes into a "checkpoint"; a new iterator resumes.
     */
    ck_assert_int_eq(luna_batch_iterator_seek(a, 3, 0), LUNA_OK);
    const uint32_t *ids;
    size_t n;
    for (int k = 0; k < 17; k++)
        ck_assert(luna_batch_iterator_next(a, &ids, &n, NULL));
    uint64_t epoch, offset;
    luna_batch_iterator_position(a, &epoch, &offset);
    ck_assert_uint_eq(epoch, 3);
    ck_assert_uint_eq(offset, 17);
    ck_assert_int_eq(luna_batch_iterator_create(&b, p, &o), LUNA_OK);
    ck_assert_int_eq(luna_batch_iterator_seek(b, epoch, offset), LUNA_OK);
    ck_assert_uint_eq(epoch_batches(b, p, rest, NULL), nb - 17);
    ck_assert(memcmp(rest, ref + 17, (nb - 17) * sizeof *ref) == 0);
    luna_batch_iterator_position(b, &epoch, &offset);
    ck_assert_uint_eq(offset, nb);
    ck_assert(!luna_batch_iterator_next(b, &ids, &n, NULL));
    ck_assert_int_eq(luna_batch_iterator_seek(b, 3, nb + 1), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_batch_iterator_seek(b, 0, 0), LUNA_ERR_INVALID_ARGUMENT);
    free(ref);
    free(rest);
    luna_batch_iterator_free(a);
    luna_batch_iterator_free(b);
    luna_batch_plan_free(p);
}
END_TEST

/* ---- on-disk pair datasets and collation --------------------------------------------------------
 */

static void write_split(const char *dir, const char *lang, const int32_t *const *sents,
                        const int32_t *lens, size_t n, const char *dict_text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/train.xx-yy.%s", dir, lang);
    luna_indexed_builder *b;
    ck_assert_int_eq(luna_indexed_builder_create(&b, path, LUNA_DTYPE_UINT16), LUNA_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(luna_indexed_builder_add(b, sents[i], (size_t)lens[i]), LUNA_OK);
    ck_assert_int_eq(luna_indexed_builder_finish(b), LUNA_OK);
    snprintf(path, sizeof path, "%s/dict.%s.txt", dir, lang);
    luna_test_write_file(path, dict_text);
}

static const char *DICT8 = "a 1\nb 1\nc 1\nd 1\n"; /* 8 symbols: ids 0..7 */

START_TEST(collate_right_padded_batch) {
    char *dir = luna_test_make_temp_dir();
    const int32_t s0[] = {4, 5, 2}, s1[] = {6, 2}, s2[] = {7, 7, 7, 7, 2};
    const int32_t t0[] = {5, 2}, t1[] = {4, 6, 7, 2}, t2[] = {2};
    const int32_t *src[] = {s0, s1, s2}, *tgt[] = {t0, t1, t2};
    const int32_t sl[] = {3, 2, 5}, tl[] = {2, 4, 1};
    write_split(dir, "xx", src, sl, 3, DICT8);
    write_split(dir, "yy", tgt, tl, 3, DICT8);
    char *a = NULL, *b = NULL;
    ck_assert_int_eq(luna_data_infer_language_pair(dir, "train", &a, &b), LUNA_OK);
    ck_assert_str_eq(a, "xx");
    ck_assert_str_eq(b, "yy");
    luna_pair_dataset *ds;
    ck_assert_msg(luna_pair_dataset_open(&ds, dir, "train", a, b) == LUNA_OK, "%s",
                  luna_error_message());
    free(a);
    free(b);
    ck_assert_uint_eq(luna_pair_dataset_count(ds), 3);
    ck_assert_int_eq(luna_dictionary_size(luna_pair_dataset_tgt_dict(ds)), 8);
    luna_data_batch *batch;
    ck_assert_int_eq(luna_data_batch_create(&batch), LUNA_OK);
    const uint32_t ids[3] = {1, 0, 2};
    ck_assert_int_eq(luna_data_batch_fill(batch, ds, ids, 3), LUNA_OK);
    ck_assert_int_eq(batch->batch_size, 3);
    ck_assert_int_eq(batch->src_len, 5);
    ck_assert_int_eq(batch->tgt_len, 4);
    const int32_t want_src[15] = {6, 2, 1, 1, 1, /**/ 4, 5, 2, 1, 1, /**/ 7, 7, 7, 7, 2};
    const int32_t want_tgt[12] = {4, 6, 7, 2, /**/ 5, 2, 1, 1, /**/ 2, 1, 1, 1};
    const int32_t want_prev[12] = {2, 4, 6, 7, /**/ 2, 5, 1, 1, /**/ 2, 1, 1, 1};
    ck_assert(memcmp(batch->src_tokens, want_src, sizeof want_src) == 0);
    ck_assert(memcmp(batch->target, want_tgt, sizeof want_tgt) == 0);
    ck_assert(memcmp(batch->prev_output_tokens, want_prev, sizeof want_prev) == 0);
    ck_assert_int_eq(batch->src_lengths[0], 2);
    ck_assert_int_eq(batch->src_lengths[2], 5);
    ck_assert_int_eq(batch->tgt_lengths[1], 2);
    ck_assert_int_eq(batch->ids[0], 1);
    ck_assert_int_eq(batch->ntokens, 7);
    /* Refill smaller, then larger: buffers are reused and grown. */
    ck_assert_int_eq(luna_data_batch_fill(batch, ds, ids + 2, 1), LUNA_OK);
    ck_assert_int_eq(batch->src_len, 5);
    ck_assert_int_eq(batch->ntokens, 1);
    const uint32_t bad[1] = {3};
    ck_assert_int_eq(luna_data_batch_fill(batch, ds, bad, 1), LUNA_ERR_INVALID_ARGUMENT);
    luna_data_batch_free(batch);
    /* The plan over the real dataset. */
    luna_batching_options o;
    luna_batching_options_init(&o);
    luna_batch_plan *p;
    ck_assert_int_eq(luna_batch_plan_create(&p, ds, &o), LUNA_OK);
    ck_assert_uint_eq(p->num_sentences, 3);
    luna_batch_plan_free(p);
    luna_pair_dataset_free(ds);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(dictionary_data_mismatch_and_count_mismatch) {
    char *dir = luna_test_make_temp_dir();
    const int32_t s0[] = {4, 2}, s1[] = {6, 9, 2};
    const int32_t *src[] = {s0, s1};
    const int32_t sl[] = {2, 3};
    write_split(dir, "xx", src, sl, 2, DICT8); /* id 9 >= 8 symbols */
    write_split(dir, "yy", src, sl, 1, "a 1\nb 1\nc 1\nd 1\ne 1\nf 1\n");
    luna_pair_dataset *ds = NULL;
    ck_assert_int_eq(luna_pair_dataset_open(&ds, dir, "train", "xx", "yy"), LUNA_ERR_MISMATCH);
    ck_assert_msg(strstr(luna_error_message(), "train.xx-yy.yy.idx") &&
                      strstr(luna_error_message(), "1 sentences"),
                  "%s", luna_error_message());
    write_split(dir, "yy", src, sl, 2, "a 1\nb 1\nc 1\nd 1\ne 1\nf 1\n");
    ck_assert_int_eq(luna_pair_dataset_open(&ds, dir, "train", "xx", "yy"), LUNA_ERR_MISMATCH);
    const char *msg = luna_error_message();
    ck_assert_msg(strstr(msg, "train.xx-yy.xx.bin") && strstr(msg, "sentence 1, token 1: id 9") &&
                      strstr(msg, "dict.xx.txt") && strstr(msg, "byte offset 6"),
                  "%s", msg);
    ck_assert_ptr_null(ds);
    /* The reversed file naming (<tgt>-<src>) is found like fairseq does; missing dict is named. */
    char path[1024];
    snprintf(path, sizeof path, "%s/dict.zz.txt", dir);
    ck_assert_int_eq(luna_pair_dataset_open(&ds, dir, "train", "zz", "xx"), LUNA_ERR_IO);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), path));
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("data_batching");
    TCase *tc = tcase_create("batching");
    tcase_add_test(tc, token_budget_and_greedy_cut);
    tcase_add_test(tc, no_overshoot_after_multiple_cut);
    tcase_add_test(tc, max_sentences_and_sorted_order);
    tcase_add_test(tc, filtering_counts_and_rejects);
    tcase_add_test(tc, every_sentence_once_and_shuffled_per_epoch);
    tcase_add_test(tc, sharding_disjoint_and_complete);
    tcase_add_test(tc, save_and_restore_position);
    tcase_add_test(tc, collate_right_padded_batch);
    tcase_add_test(tc, dictionary_data_mismatch_and_count_mismatch);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
