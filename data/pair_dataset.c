#include "data/pair_dataset.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"

struct luna_pair_dataset {
    luna_indexed_dataset *src, *tgt;
    luna_dictionary *src_dict, *tgt_dict;
};

void luna_pair_dataset_free(luna_pair_dataset *ds) {
    if (!ds) return;
    luna_indexed_dataset_free(ds->src);
    luna_indexed_dataset_free(ds->tgt);
    luna_dictionary_free(ds->src_dict);
    luna_dictionary_free(ds->tgt_dict);
    free(ds);
}

luna_status luna_pair_dataset_open_files(luna_pair_dataset **out, const char *src_prefix,
                                         const char *tgt_prefix, const char *src_dict_path,
                                         const char *tgt_dict_path) {
    *out = NULL;
    luna_pair_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_status st = luna_dictionary_load(&ds->src_dict, src_dict_path);
    if (st == LUNA_OK) st = luna_dictionary_load(&ds->tgt_dict, tgt_dict_path);
    if (st == LUNA_OK) st = luna_indexed_dataset_open(&ds->src, src_prefix);
    if (st == LUNA_OK) st = luna_indexed_dataset_open(&ds->tgt, tgt_prefix);
    if (st == LUNA_OK) {
        size_t ns = luna_indexed_dataset_count(ds->src), nt = luna_indexed_dataset_count(ds->tgt);
        if (ns != nt)
            st = luna_error(LUNA_ERR_MISMATCH,
                            "%s: byte offset 18: %zu sentences, but %s has %zu (the two sides of "
                            "a data-bin split must be aligned; re-run luna-preprocess)",
                            luna_indexed_dataset_idx_path(ds->tgt), nt,
                            luna_indexed_dataset_idx_path(ds->src), ns);
    }
    if (st == LUNA_OK)
        st = luna_indexed_dataset_check_ids(ds->src, luna_dictionary_size(ds->src_dict),
                                            src_dict_path);
    if (st == LUNA_OK)
        st = luna_indexed_dataset_check_ids(ds->tgt, luna_dictionary_size(ds->tgt_dict),
                                            tgt_dict_path);
    /* An empty sentence (size 0) has no </s>; collation would produce an empty row. Every fairseq
     * binarizer appends </s>, so size 0 means the data was not made for translation. */
    const luna_indexed_dataset *sides[2] = {ds->src, ds->tgt};
    for (int s = 0; st == LUNA_OK && s < 2; s++) {
        const int32_t *sizes = luna_indexed_dataset_sizes(sides[s]);
        for (size_t i = 0; i < luna_indexed_dataset_count(sides[s]); i++)
            if (sizes[i] == 0) {
                st = luna_error(LUNA_ERR_FORMAT,
                                "%s: byte offset %zu: sentence %zu has no tokens, not even </s> "
                                "(re-run luna-preprocess)",
                                luna_indexed_dataset_idx_path(sides[s]),
                                (size_t)LUNA_MMIDIDX_HEADER_BYTES + 4 * i, i);
                break;
            }
    }
    if (st != LUNA_OK) {
        luna_pair_dataset_free(ds);
        return st;
    }
    *out = ds;
    return LUNA_OK;
}

static char *format_path(const char *fmt, const char *dir, const char *a, const char *b,
                         const char *c, const char *d) {
    int n = snprintf(NULL, 0, fmt, dir, a, b, c, d);
    char *p = malloc((size_t)n + 1);
    if (p) snprintf(p, (size_t)n + 1, fmt, dir, a, b, c, d);
    return p;
}

luna_status luna_pair_dataset_open(luna_pair_dataset **out, const char *dir, const char *split,
                                   const char *src_lang, const char *tgt_lang) {
    *out = NULL;
    /* fairseq's load_langpair_dataset: "<split>.<src>-<tgt>.<lang>", else
     * "<split>.<tgt>-<src>.<lang>". */
    char *probe = format_path("%s/%s.%s-%s.%s.idx", dir, split, src_lang, tgt_lang, src_lang);
    if (!probe) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    bool forward = luna_path_exists(probe);
    free(probe);
    const char *a = forward ? src_lang : tgt_lang, *b = forward ? tgt_lang : src_lang;
    char *src_prefix = format_path("%s/%s.%s-%s.%s", dir, split, a, b, src_lang);
    char *tgt_prefix = format_path("%s/%s.%s-%s.%s", dir, split, a, b, tgt_lang);
    char *src_dict = format_path("%s/dict.%s.txt%s%s%s", dir, src_lang, "", "", "");
    char *tgt_dict = format_path("%s/dict.%s.txt%s%s%s", dir, tgt_lang, "", "", "");
    luna_status st =
        src_prefix && tgt_prefix && src_dict && tgt_dict
            ? luna_pair_dataset_open_files(out, src_prefix, tgt_prefix, src_dict, tgt_dict)
            : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    free(src_prefix);
    free(tgt_prefix);
    free(src_dict);
    free(tgt_dict);
    return st;
}

size_t luna_pair_dataset_count(const luna_pair_dataset *ds) {
    return luna_indexed_dataset_count(ds->src);
}
const int32_t *luna_pair_dataset_src_sizes(const luna_pair_dataset *ds) {
    return luna_indexed_dataset_sizes(ds->src);
}
const int32_t *luna_pair_dataset_tgt_sizes(const luna_pair_dataset *ds) {
    return luna_indexed_dataset_sizes(ds->tgt);
}
const luna_dictionary *luna_pair_dataset_src_dict(const luna_pair_dataset *ds) {
    return ds->src_dict;
}
const luna_dictionary *luna_pair_dataset_tgt_dict(const luna_pair_dataset *ds) {
    return ds->tgt_dict;
}

luna_status luna_data_infer_language_pair(const char *dir, const char *split, char **src,
                                          char **tgt) {
    *src = *tgt = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return luna_error(LUNA_ERR_IO, "%s: cannot open the data-bin directory (check the path)",
                          dir);
    size_t split_len = strlen(split);
    luna_status st = LUNA_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && st == LUNA_OK) {
        /* <split>.<X>-<Y>.<X>.idx */
        const char *name = e->d_name;
        size_t n = strlen(name);
        if (n < split_len + 10 || strncmp(name, split, split_len) != 0 || name[split_len] != '.' ||
            strcmp(name + n - 4, ".idx") != 0)
            continue;
        const char *pair = name + split_len + 1;
        const char *dot = strchr(pair, '.');
        const char *dash = memchr(pair, '-', dot ? (size_t)(dot - pair) : 0);
        if (!dot || !dash || dash == pair || dash + 1 == dot) continue;
        size_t xl = (size_t)(dash - pair), yl = (size_t)(dot - dash - 1);
        if ((size_t)(name + n - 4 - (dot + 1)) != xl || strncmp(dot + 1, pair, xl) != 0) continue;
        char *x = strndup(pair, xl), *y = strndup(dash + 1, yl);
        if (!x || !y) {
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        } else if (*src && (strcmp(*src, x) != 0 || strcmp(*tgt, y) != 0)) {
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                            "%s: holds several language pairs (%s-%s and %s-%s) "
                            "(pass --source-lang and --target-lang)",
                            dir, *src, *tgt, x, y);
        } else if (!*src) {
            *src = x;
            *tgt = y;
            x = y = NULL;
        }
        free(x);
        free(y);
    }
    closedir(d);
    if (st == LUNA_OK && !*src)
        st = luna_error(LUNA_ERR_IO,
                        "%s: no %s.<src>-<tgt>.<src>.idx file (is this a data-bin made by "
                        "luna-preprocess or fairseq-preprocess?)",
                        dir, split);
    if (st != LUNA_OK) {
        free(*src);
        free(*tgt);
        *src = *tgt = NULL;
    }
    return st;
}

/* ---- collation ------------------------------------------------------------------------------- */

luna_status luna_data_batch_create(luna_data_batch **out) {
    *out = calloc(1, sizeof **out);
    return *out ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
}

void luna_data_batch_free(luna_data_batch *b) {
    if (!b) return;
    free(b->src_tokens);
    free(b->src_lengths);
    free(b->target);
    free(b->prev_output_tokens);
    free(b->tgt_lengths);
    free(b->ids);
    free(b);
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    void *q = realloc(*p, need * elem);
    if (!q) return false;
    *p = q;
    return true;
}

luna_status luna_data_batch_fill(luna_data_batch *b, const luna_pair_dataset *ds,
                                 const uint32_t *ids, size_t n) {
    const int32_t *ss = luna_pair_dataset_src_sizes(ds), *ts = luna_pair_dataset_tgt_sizes(ds);
    size_t count = luna_pair_dataset_count(ds);
    int32_t src_len = 0, tgt_len = 0;
    for (size_t k = 0; k < n; k++) {
        if (ids[k] >= count)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "batch: sentence id %u is outside the dataset (%zu)", ids[k], count);
        if (ss[ids[k]] > src_len) src_len = ss[ids[k]];
        if (ts[ids[k]] > tgt_len) tgt_len = ts[ids[k]];
    }
    size_t cap_b = b->capacity_b_, cap_s = b->capacity_src_, cap_t = b->capacity_tgt_;
    size_t need_s = n * (size_t)src_len, need_t = n * (size_t)tgt_len;
    bool ok = grow((void **)&b->src_lengths, &cap_b, n, sizeof(int32_t)) &&
              grow((void **)&b->tgt_lengths, &cap_b, n, sizeof(int32_t)) &&
              grow((void **)&b->ids, &cap_b, n, sizeof(int64_t)) &&
              grow((void **)&b->src_tokens, &cap_s, need_s, sizeof(int32_t)) &&
              grow((void **)&b->target, &cap_t, need_t, sizeof(int32_t)) &&
              grow((void **)&b->prev_output_tokens, &cap_t, need_t, sizeof(int32_t));
    if (!ok) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "batch: out of memory for %zu sentences", n);
    if (n > b->capacity_b_) b->capacity_b_ = n;
    if (need_s > b->capacity_src_) b->capacity_src_ = need_s;
    if (need_t > b->capacity_tgt_) b->capacity_tgt_ = need_t;
    b->batch_size = (int32_t)n;
    b->src_len = src_len;
    b->tgt_len = tgt_len;
    b->ntokens = 0;
    b->repeated = false;
    for (size_t k = 0; k < n; k++) {
        uint32_t id = ids[k];
        int32_t *src = b->src_tokens + k * (size_t)src_len;          // (src_len)
        int32_t *tgt = b->target + k * (size_t)tgt_len;              // (tgt_len)
        int32_t *prev = b->prev_output_tokens + k * (size_t)tgt_len; // (tgt_len)
        luna_indexed_dataset_get(ds->src, id, src);
        luna_indexed_dataset_get(ds->tgt, id, tgt);
        for (int32_t j = ss[id]; j < src_len; j++)
            src[j] = LUNA_DICT_PAD;
        for (int32_t j = ts[id]; j < tgt_len; j++)
            tgt[j] = LUNA_DICT_PAD;
        /* move_eos_to_beginning: </s> t0 .. t(L-2); the target's final </s> is what is predicted
         * last, so it is dropped from the decoder input. */
        prev[0] = LUNA_DICT_EOS;
        for (int32_t j = 1; j < ts[id]; j++)
            prev[j] = tgt[j - 1];
        for (int32_t j = ts[id]; j < tgt_len; j++)
            prev[j] = LUNA_DICT_PAD;
        b->src_lengths[k] = ss[id];
        b->tgt_lengths[k] = ts[id];
        b->ids[k] = id;
        b->ntokens += ts[id];
    }
    return LUNA_OK;
}
