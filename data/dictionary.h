/* fairseq's Dictionary (fairseq/data/dictionary.py), byte-for-byte in its file format.
 *
 * A dict.<lang>.txt file holds "token count" lines; the four special symbols are implicit and
 * take the first ids: <s>=0, <pad>=1, </s>=2, <unk>=3, then the file's entries in order. A line
 * may end with the flag "#fairseq:overwrite" (a repeated token then gets a new id and lookups
 * find the newest one); a repeated token without the flag is an error, as in fairseq.
 *
 * Building from counts follows Dictionary.finalize(): specials first, then the other symbols by
 * count (descending), ties by symbol (ascending byte order, = Python's str order for UTF-8),
 * stopping at the first count below `threshold`, capped at `nwords`; then "madeupword%04d"
 * entries with count 0 pad the size to a multiple of `padding_factor` (fairseq uses 8).
 */
#ifndef LUNA_DATA_DICTIONARY_H
#define LUNA_DATA_DICTIONARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

enum {
    LUNA_DICT_BOS = 0, /* "<s>" */
    LUNA_DICT_PAD = 1, /* "<pad>" */
    LUNA_DICT_EOS = 2, /* "</s>" */
    LUNA_DICT_UNK = 3, /* "<unk>" */
    LUNA_DICT_NSPECIAL = 4,
};

typedef struct luna_dictionary luna_dictionary;

/* A dictionary holding only the four special symbols. */
luna_status luna_dictionary_create(luna_dictionary **out);
void luna_dictionary_free(luna_dictionary *d);

/* Load dict.<lang>.txt. Errors name the file and line. */
luna_status luna_dictionary_load(luna_dictionary **out, const char *path);
/* Same from text in memory (e.g. a dictionary embedded in a checkpoint); `name` for messages. */
luna_status luna_dictionary_load_from_memory(luna_dictionary **out, const char *text, size_t len,
                                             const char *name);

/* The dict.<lang>.txt text (malloc'ed, NUL-terminated; *len excludes the NUL). */
luna_status luna_dictionary_to_text(const luna_dictionary *d, char **text, size_t *len);
/* Write dict.<lang>.txt atomically. */
luna_status luna_dictionary_save(const luna_dictionary *d, const char *path);

/* fairseq's add_symbol(word, n, overwrite): an existing symbol gets n added to its count
 * (unless overwrite), a new one is appended. *index (optional) receives its id. */
luna_status luna_dictionary_add(luna_dictionary *d, const char *symbol, size_t len, int64_t n,
                                bool overwrite, int32_t *index);

/* Add every symbol of `other` (counts included) to `d`, in other's id order. Used to merge
 * per-thread counters. */
luna_status luna_dictionary_merge_counts(luna_dictionary *d, const luna_dictionary *other);

/* fairseq's finalize(threshold, nwords, padding_factor). threshold <= 0 keeps everything,
 * nwords <= 0 means no cap, padding_factor <= 1 means no padding. */
luna_status luna_dictionary_finalize(luna_dictionary *d, int64_t threshold, int64_t nwords,
                                     int padding_factor);

/* Number of symbols including the specials. */
int32_t luna_dictionary_size(const luna_dictionary *d);

/* Id of a symbol, LUNA_DICT_UNK if absent (fairseq's index()). */
int32_t luna_dictionary_index(const luna_dictionary *d, const char *symbol, size_t len);
/* Id of a symbol, -1 if absent. */
int32_t luna_dictionary_find(const luna_dictionary *d, const char *symbol, size_t len);

/* Symbol / count of an id (NULL / -1 when out of range). */
const char *luna_dictionary_symbol(const luna_dictionary *d, int32_t id);
int64_t luna_dictionary_count(const luna_dictionary *d, int32_t id);

/* True iff both have the same symbols in the same order (counts are not compared: they do not
 * affect which id a token gets). Otherwise *first_diff (optional) is the first differing id. */
bool luna_dictionary_same_symbols(const luna_dictionary *a, const luna_dictionary *b,
                                  int32_t *first_diff);

#endif
