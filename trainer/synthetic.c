/* Synthetic copy / reversal data-bins (see synthetic.h). */
#include "trainer/synthetic.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "data/dictionary.h"
#include "data/indexed_dataset.h"

void luna_synthetic_options_init(luna_synthetic_options *o) {
    *o = (luna_synthetic_options){.source_lang = "src",
                                  .target_lang = "tgt",
                                  .num_symbols = 8,
                                  .min_len = 3,
                                  .max_len = 8,
                                  .num_train = 1000,
                                  .num_valid = 100,
                                  .reverse = true,
                                  .seed = 1};
}

static uint64_t next_random(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static luna_status write_split(const char *dir, const char *split, int count,
                               const luna_synthetic_options *o, uint64_t *rng) {
    char prefix[2][4096];
    const char *langs[2] = {o->source_lang, o->target_lang};
    luna_indexed_builder *b[2] = {NULL, NULL};
    luna_status s = LUNA_OK;
    for (int k = 0; k < 2 && s == LUNA_OK; k++) {
        snprintf(prefix[k], sizeof prefix[k], "%s/%s.%s-%s.%s", dir, split, o->source_lang,
                 o->target_lang, langs[k]);
        s = luna_indexed_builder_create(&b[k], prefix[k],
                                        luna_index_best_dtype((size_t)o->num_symbols + 4));
    }
    int32_t src[1024], tgt[1024];
    for (int i = 0; i < count && s == LUNA_OK; i++) {
        int len = o->min_len + (int)(next_random(rng) % (uint64_t)(o->max_len - o->min_len + 1));
        for (int t = 0; t < len; t++)
            src[t] = LUNA_DICT_NSPECIAL + (int32_t)(next_random(rng) % (uint64_t)o->num_symbols);
        for (int t = 0; t < len; t++)
            tgt[t] = o->reverse ? src[len - 1 - t] : src[t];
        src[len] = tgt[len] = LUNA_DICT_EOS;
        s = luna_indexed_builder_add(b[0], src, (size_t)len + 1);
        if (s == LUNA_OK) s = luna_indexed_builder_add(b[1], tgt, (size_t)len + 1);
    }
    for (int k = 0; k < 2; k++) {
        if (s == LUNA_OK) {
            s = luna_indexed_builder_finish(b[k]);
            b[k] = NULL;
        }
        luna_indexed_builder_free(b[k]);
    }
    return s;
}

luna_status luna_synthetic_data_bin(const char *dir, const luna_synthetic_options *o) {
    if (o->num_symbols < 1 || o->min_len < 1 || o->max_len < o->min_len || o->max_len > 1000 ||
        o->num_train < 1 || o->num_valid < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "synthetic data-bin: bad options");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return luna_error(LUNA_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    luna_dictionary *d;
    LUNA_TRY(luna_dictionary_create(&d));
    luna_status s = LUNA_OK;
    for (int i = 0; i < o->num_symbols && s == LUNA_OK; i++) {
        char sym[32];
        int n = snprintf(sym, sizeof sym, "w%d", i);
        s = luna_dictionary_add(d, sym, (size_t)n, 100, false, NULL);
    }
    const char *langs[2] = {o->source_lang, o->target_lang};
    for (int k = 0; k < 2 && s == LUNA_OK; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/dict.%s.txt", dir, langs[k]);
        s = luna_dictionary_save(d, path);
    }
    luna_dictionary_free(d);
    uint64_t rng = o->seed;
    if (s == LUNA_OK) s = write_split(dir, "train", o->num_train, o, &rng);
    if (s == LUNA_OK && o->num_valid > 0) s = write_split(dir, "valid", o->num_valid, o, &rng);
    return s;
}
