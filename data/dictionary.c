#include "data/dictionary.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"

static const char *const SPECIALS[LUNA_DICT_NSPECIAL] = {"<s>", "<pad>", "</s>", "<unk>"};
static const char OVERWRITE_FLAG[] = "#fairseq:overwrite";

struct luna_dictionary {
    int32_t size, capacity;
    char **symbols;   /* (size) NUL-terminated copies */
    uint32_t *lens;   /* (size) byte lengths (symbols may not contain NUL, but this saves strlen) */
    uint64_t *hashes; /* (size) */
    int64_t *counts;  /* (size) */
    /* Open-addressing hash table: slot holds id + 1, 0 = empty. Load factor <= 1/2. */
    uint32_t *slots;
    uint32_t nslots; /* power of two */
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a; symbols are short, this is plenty */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* Slot index where `symbol` is, or the empty slot where it would go. */
static uint32_t probe(const luna_dictionary *d, const char *s, size_t n, uint64_t h) {
    uint32_t mask = d->nslots - 1, i = (uint32_t)h & mask;
    for (;;) {
        uint32_t v = d->slots[i];
        if (v == 0) return i;
        int32_t id = (int32_t)(v - 1);
        if (d->hashes[id] == h && d->lens[id] == n && memcmp(d->symbols[id], s, n) == 0) return i;
        i = (i + 1) & mask;
    }
}

static luna_status rehash(luna_dictionary *d, uint32_t nslots) {
    uint32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "dictionary: out of memory");
    free(d->slots);
    d->slots = slots;
    d->nslots = nslots;
    /* Later ids overwrite earlier ones for duplicated (overwritten) symbols, as in fairseq. */
    for (int32_t id = 0; id < d->size; id++)
        d->slots[probe(d, d->symbols[id], d->lens[id], d->hashes[id])] = (uint32_t)id + 1;
    return LUNA_OK;
}

static luna_status append(luna_dictionary *d, const char *s, size_t n, int64_t count, uint64_t h) {
    if (n > UINT32_MAX || d->size == INT32_MAX)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "dictionary: symbol or dictionary too large");
    if (d->size == d->capacity) {
        int32_t cap = d->capacity ? d->capacity * 2 : 64;
        char **symbols = realloc(d->symbols, (size_t)cap * sizeof *symbols);
        if (symbols) d->symbols = symbols;
        uint32_t *lens = realloc(d->lens, (size_t)cap * sizeof *lens);
        if (lens) d->lens = lens;
        uint64_t *hashes = realloc(d->hashes, (size_t)cap * sizeof *hashes);
        if (hashes) d->hashes = hashes;
        int64_t *counts = realloc(d->counts, (size_t)cap * sizeof *counts);
        if (counts) d->counts = counts;
        if (!symbols || !lens || !hashes || !counts)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "dictionary: out of memory");
        d->capacity = cap;
    }
    char *copy = malloc(n + 1);
    if (!copy) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "dictionary: out of memory");
    memcpy(copy, s, n);
    copy[n] = '\0';
    int32_t id = d->size++;
    d->symbols[id] = copy;
    d->lens[id] = (uint32_t)n;
    d->hashes[id] = h;
    d->counts[id] = count;
    if ((uint64_t)d->size * 2 > d->nslots) return rehash(d, d->nslots ? d->nslots * 2 : 256);
    d->slots[probe(d, s, n, h)] = (uint32_t)id + 1;
    return LUNA_OK;
}

luna_status luna_dictionary_create(luna_dictionary **out) {
    *out = NULL;
    luna_dictionary *d = calloc(1, sizeof *d);
    if (!d) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "dictionary: out of memory");
    luna_status st = rehash(d, 256);
    for (int i = 0; st == LUNA_OK && i < LUNA_DICT_NSPECIAL; i++)
        st = append(d, SPECIALS[i], strlen(SPECIALS[i]), 1,
                    hash_bytes(SPECIALS[i], strlen(SPECIALS[i])));
    if (st != LUNA_OK) {
        luna_dictionary_free(d);
        return st;
    }
    *out = d;
    return LUNA_OK;
}

void luna_dictionary_free(luna_dictionary *d) {
    if (!d) return;
    for (int32_t i = 0; i < d->size; i++)
        free(d->symbols[i]);
    free(d->symbols);
    free(d->lens);
    free(d->hashes);
    free(d->counts);
    free(d->slots);
    free(d);
}

luna_status luna_dictionary_add(luna_dictionary *d, const char *symbol, size_t len, int64_t n,
                                bool overwrite, int32_t *index) {
    uint64_t h = hash_bytes(symbol, len);
    uint32_t v = d->slots[probe(d, symbol, len, h)];
    if (v != 0 && !overwrite) {
        d->counts[v - 1] += n;
        if (index) *index = (int32_t)(v - 1);
        return LUNA_OK;
    }
    LUNA_TRY(append(d, symbol, len, n, h));
    if (index) *index = d->size - 1;
    return LUNA_OK;
}

luna_status luna_dictionary_merge_counts(luna_dictionary *d, const luna_dictionary *other) {
    for (int32_t i = 0; i < other->size; i++)
        LUNA_TRY(luna_dictionary_add(d, other->symbols[i], other->lens[i], other->counts[i], false,
                                     NULL));
    return LUNA_OK;
}

int32_t luna_dictionary_size(const luna_dictionary *d) { return d->size; }

int32_t luna_dictionary_find(const luna_dictionary *d, const char *symbol, size_t len) {
    uint32_t v = d->slots[probe(d, symbol, len, hash_bytes(symbol, len))];
    return v ? (int32_t)(v - 1) : -1;
}

int32_t luna_dictionary_index(const luna_dictionary *d, const char *symbol, size_t len) {
    int32_t id = luna_dictionary_find(d, symbol, len);
    return id >= 0 ? id : LUNA_DICT_UNK;
}

const char *luna_dictionary_symbol(const luna_dictionary *d, int32_t id) {
    return id >= 0 && id < d->size ? d->symbols[id] : NULL;
}

int64_t luna_dictionary_count(const luna_dictionary *d, int32_t id) {
    return id >= 0 && id < d->size ? d->counts[id] : -1;
}

bool luna_dictionary_same_symbols(const luna_dictionary *a, const luna_dictionary *b,
                                  int32_t *first_diff) {
    int32_t n = a->size < b->size ? a->size : b->size;
    for (int32_t i = 0; i < n; i++) {
        if (a->lens[i] != b->lens[i] || memcmp(a->symbols[i], b->symbols[i], a->lens[i]) != 0) {
            if (first_diff) *first_diff = i;
            return false;
        }
    }
    if (a->size != b->size) {
        if (first_diff) *first_diff = n;
        return false;
    }
    return true;
}

/* ---- finalize -------------------------------------------------------------------------------- */

typedef struct {
    const char *symbol;
    uint32_t len;
    int64_t count;
} entry;

static int cmp_symbol(const char *a, uint32_t la, const char *b, uint32_t lb) {
    int c = memcmp(a, b, la < lb ? la : lb);
    if (c != 0) return c;
    return (la > lb) - (la < lb);
}

/* (symbol asc, count asc): mirrors Python's sorted(zip(symbols, counts)). */
static int cmp_by_symbol(const void *pa, const void *pb) {
    const entry *a = pa, *b = pb;
    int c = cmp_symbol(a->symbol, a->len, b->symbol, b->len);
    if (c != 0) return c;
    return (a->count > b->count) - (a->count < b->count);
}

/* Counter.most_common: count desc; its stable sort keeps the symbol order for ties. */
static int cmp_by_count(const void *pa, const void *pb) {
    const entry *a = pa, *b = pb;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;
    return cmp_symbol(a->symbol, a->len, b->symbol, b->len);
}

luna_status luna_dictionary_finalize(luna_dictionary *d, int64_t threshold, int64_t nwords,
                                     int padding_factor) {
    if (nwords <= 0) nwords = d->size;
    size_t nrest = (size_t)(d->size - LUNA_DICT_NSPECIAL);
    entry *e = malloc((nrest ? nrest : 1) * sizeof *e);
    luna_dictionary *out = NULL;
    luna_status st = e ? luna_dictionary_create(&out)
                       : luna_error(LUNA_ERR_OUT_OF_MEMORY, "dictionary: out of memory");
    if (st != LUNA_OK) goto done;
    for (int i = 0; i < LUNA_DICT_NSPECIAL; i++)
        out->counts[i] = d->counts[i];
    for (size_t i = 0; i < nrest; i++) {
        int32_t id = (int32_t)i + LUNA_DICT_NSPECIAL;
        e[i] = (entry){d->symbols[id], d->lens[id], d->counts[id]};
    }
    /* fairseq builds Counter(dict(sorted(zip(symbols, counts)))): a symbol repeated through
     * #fairseq:overwrite keeps the last value dict() saw, i.e. its largest count. */
    qsort(e, nrest, sizeof *e, cmp_by_symbol);
    size_t nunique = 0;
    for (size_t i = 0; i < nrest; i++) {
        if (nunique > 0 &&
            cmp_symbol(e[nunique - 1].symbol, e[nunique - 1].len, e[i].symbol, e[i].len) == 0)
            e[nunique - 1] = e[i];
        else
            e[nunique++] = e[i];
    }
    qsort(e, nunique, sizeof *e, cmp_by_count);
    int64_t take = nwords - LUNA_DICT_NSPECIAL;
    for (size_t i = 0; st == LUNA_OK && (int64_t)i < take && i < nunique; i++) {
        if (e[i].count < threshold) break;
        /* overwrite=true: a special symbol that was also counted as a word gets its own id,
         * exactly as new_indices[symbol] = len(new_symbols) does in fairseq. */
        st = luna_dictionary_add(out, e[i].symbol, e[i].len, e[i].count, true, NULL);
    }
    /* pad_to_multiple_: add_symbol(..., n=0) does not grow the dictionary when the made-up word
     * already exists, so the loop is driven by the size, not by the counter. */
    for (int i = 0; st == LUNA_OK && padding_factor > 1 && out->size % padding_factor != 0; i++) {
        char word[32];
        int n = snprintf(word, sizeof word, "madeupword%04d", i);
        st = luna_dictionary_add(out, word, (size_t)n, 0, false, NULL);
    }
    if (st != LUNA_OK) goto done;
    /* Swap the contents so the caller's handle now holds the finalized dictionary. */
    luna_dictionary tmp = *d;
    *d = *out;
    *out = tmp;
done:
    luna_dictionary_free(out);
    free(e);
    return st;
}

/* ---- text format ----------------------------------------------------------------------------- */

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

/* Python's int(field) for the plain decimal forms fairseq writes: [+-]digits. */
static bool parse_count(const char *s, size_t n, int64_t *out) {
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i == n) return false;
    int64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        int digit = s[i] - '0';
        if (v > (INT64_MAX - digit) / 10) return false;
        v = v * 10 + digit;
    }
    *out = neg ? -v : v;
    return true;
}

/* Position of the last ' ' in s[0..n), or -1 (str.rsplit(" ", 1)). */
static long last_space(const char *s, size_t n) {
    for (size_t i = n; i > 0; i--)
        if (s[i - 1] == ' ') return (long)(i - 1);
    return -1;
}

luna_status luna_dictionary_load_from_memory(luna_dictionary **out, const char *text, size_t len,
                                             const char *name) {
    *out = NULL;
    luna_dictionary *d;
    LUNA_TRY(luna_dictionary_create(&d));
    luna_status st = LUNA_OK;
    size_t pos = 0;
    long lineno = 0;
    while (st == LUNA_OK && pos < len) {
        lineno++;
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        while (n > 0 && is_space(line[n - 1]))
            n--; /* line.rstrip() */
        size_t bad;
        if (!luna_utf8_valid(line, n, &bad)) {
            st = luna_error(LUNA_ERR_FORMAT,
                            "%s:%ld: invalid UTF-8 at byte %zu of the line (a dictionary "
                            "must be UTF-8 text)",
                            name, lineno, bad + 1);
            break;
        }
        long sp = last_space(line, n);
        bool overwrite = false;
        int64_t count = 0;
        if (sp >= 0 && (size_t)sp + 1 + strlen(OVERWRITE_FLAG) == n &&
            memcmp(line + sp + 1, OVERWRITE_FLAG, strlen(OVERWRITE_FLAG)) == 0) {
            overwrite = true;
            n = (size_t)sp;
            sp = last_space(line, n);
        }
        if (sp < 0 || !parse_count(line + sp + 1, n - (size_t)sp - 1, &count)) {
            st = luna_error(
                LUNA_ERR_FORMAT,
                "%s:%ld: expected '<token> <count> [#fairseq:overwrite]', got "
                "'%.*s' (a fairseq dict.<lang>.txt has one token and its count per line)",
                name, lineno, (int)(n < 80 ? n : 80), line);
            break;
        }
        if (count < 0) {
            st = luna_error(LUNA_ERR_FORMAT,
                            "%s:%ld: negative count %" PRId64 " for '%.*s' (counts are "
                            "occurrences: 0 or more)",
                            name, lineno, count, (int)(sp < 80 ? sp : 80), line);
            break;
        }
        size_t wlen = (size_t)sp;
        if (memchr(line, '\0', wlen)) {
            st = luna_error(LUNA_ERR_FORMAT, "%s:%ld: token contains a NUL byte", name, lineno);
            break;
        }
        if (!overwrite && luna_dictionary_find(d, line, wlen) >= 0) {
            st = luna_error(LUNA_ERR_FORMAT,
                            "%s:%ld: duplicate token '%.*s' (append ' #fairseq:overwrite' "
                            "to the line if the repetition is intended)",
                            name, lineno, (int)(wlen < 80 ? wlen : 80), line);
            break;
        }
        st = luna_dictionary_add(d, line, wlen, count, overwrite, NULL);
    }
    if (st != LUNA_OK) {
        luna_dictionary_free(d);
        return st;
    }
    *out = d;
    return LUNA_OK;
}

luna_status luna_dictionary_load(luna_dictionary **out, const char *path) {
    *out = NULL;
    char *text;
    size_t len;
    LUNA_TRY(luna_read_file(path, &text, &len));
    luna_status st = luna_dictionary_load_from_memory(out, text, len, path);
    free(text);
    return st;
}

luna_status luna_dictionary_to_text(const luna_dictionary *d, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t cap = 1;
    for (int32_t i = LUNA_DICT_NSPECIAL; i < d->size; i++)
        cap += d->lens[i] + 48;
    char *buf = malloc(cap);
    /* seen[last id of a symbol]: whether an earlier entry with that symbol was written. */
    bool *seen = calloc((size_t)d->size, sizeof *seen);
    if (!buf || !seen) {
        free(buf);
        free(seen);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "dictionary: out of memory");
    }
    for (int32_t i = 0; i < LUNA_DICT_NSPECIAL; i++)
        seen[luna_dictionary_find(d, d->symbols[i], d->lens[i])] = true;
    size_t n = 0;
    for (int32_t i = LUNA_DICT_NSPECIAL; i < d->size; i++) {
        int32_t last = luna_dictionary_find(d, d->symbols[i], d->lens[i]);
        /* fairseq's save() omits the flag, so a dictionary with an overwritten symbol would not
         * load back; writing the flag on the repeated entries keeps the file loadable. */
        bool repeated = seen[last];
        seen[last] = true;
        memcpy(buf + n, d->symbols[i], d->lens[i]);
        n += d->lens[i];
        n += (size_t)snprintf(buf + n, cap - n, " %" PRId64 "%s\n", d->counts[i],
                              repeated ? " #fairseq:overwrite" : "");
    }
    buf[n] = '\0';
    free(seen);
    *text = buf;
    *len = n;
    return LUNA_OK;
}

luna_status luna_dictionary_save(const luna_dictionary *d, const char *path) {
    char *text;
    size_t len;
    LUNA_TRY(luna_dictionary_to_text(d, &text, &len));
    luna_status st = luna_write_file_atomic(path, text, len);
    free(text);
    return st;
}
