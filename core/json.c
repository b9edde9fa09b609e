#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reader ---------------------------------------------------------------------------------- */

typedef struct {
    const char *text;
    size_t len, pos;
    size_t error_offset;
    int depth;
} parser;

static luna_status fail(parser *p, size_t at, const char *what) {
    p->error_offset = at;
    return luna_error(LUNA_ERR_FORMAT, "JSON: byte %zu: %s", at, what);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static void free_value(luna_json *v) {
    if (v->type == LUNA_JSON_STRING) free(v->string);
    if (v->type == LUNA_JSON_ARRAY || v->type == LUNA_JSON_OBJECT) {
        for (size_t i = 0; i < v->length; i++) {
            free_value(&v->items[i]);
            if (v->keys) free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof *v);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static luna_status read_hex4(parser *p, unsigned *out) {
    if (p->len - p->pos < 4) return fail(p, p->pos, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_digit(p->text[p->pos + i]);
        if (h < 0) return fail(p, p->pos + i, "invalid hex digit in \\u escape");
        v = v * 16 + (unsigned)h;
    }
    p->pos += 4;
    *out = v;
    return LUNA_OK;
}

static size_t put_utf8(char *dst, unsigned cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of a well-formed UTF-8 sequence at s (n bytes available), or 0. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, cp = c & 0x07;
    else
        return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return len;
}

/* Parses a string starting at the opening quote; *out is malloc'ed, *out_len its length. */
static luna_status parse_string(parser *p, char **out, size_t *out_len) {
    size_t start = p->pos++;
    /* The decoded string is never longer than the source text. */
    size_t end = p->pos;
    while (end < p->len && p->text[end] != '"')
        end += p->text[end] == '\\' ? 2 : 1;
    if (end >= p->len) return fail(p, start, "unterminated string");
    char *buf = malloc(end - p->pos + 1);
    if (!buf) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "JSON: out of memory");
    size_t n = 0;
    luna_status st = LUNA_OK;
    while (st == LUNA_OK) {
        if (p->pos >= p->len) {
            st = fail(p, start, "unterminated string");
            break;
        }
        unsigned char c = (unsigned char)p->text[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            st = fail(p, p->pos, "control character in string");
        } else if (c == '\\') {
            size_t at = p->pos;
            if (++p->pos >= p->len) {
                st = fail(p, at, "truncated escape");
                break;
            }
            char e = p->text[p->pos++];
            switch (e) {
            case '"': buf[n++] = '"'; break;
            case '\\': buf[n++] = '\\'; break;
            case '/': buf[n++] = '/'; break;
            case 'b': buf[n++] = '\b'; break;
            case 'f': buf[n++] = '\f'; break;
            case 'n': buf[n++] = '\n'; break;
            case 'r': buf[n++] = '\r'; break;
            case 't': buf[n++] = '\t'; break;
            case 'u': {
                unsigned cp;
                st = read_hex4(p, &cp);
                if (st != LUNA_OK) break;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (p->len - p->pos < 2 || p->text[p->pos] != '\\' ||
                        p->text[p->pos + 1] != 'u') {
                        st = fail(p, at, "unpaired surrogate in \\u escape");
                        break;
                    }
                    p->pos += 2;
                    st = read_hex4(p, &lo);
                    if (st != LUNA_OK) break;
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        st = fail(p, at, "unpaired surrogate in \\u escape");
                        break;
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    st = fail(p, at, "unpaired surrogate in \\u escape");
                    break;
                } else if (cp == 0) {
                    st = fail(p, at, "\\u0000 in string is not supported");
                    break;
                }
                n += put_utf8(buf + n, cp);
                break;
            }
            default: st = fail(p, at, "invalid escape");
            }
        } else {
            size_t k = utf8_sequence((const unsigned char *)p->text + p->pos, p->len - p->pos);
            if (k == 0) {
                st = fail(p, p->pos, "invalid UTF-8 in string");
                break;
            }
            memcpy(buf + n, p->text + p->pos, k);
            n += k;
            p->pos += k;
        }
    }
    if (st != LUNA_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return LUNA_OK;
}

static luna_status parse_number(parser *p, luna_json *v) {
    size_t start = p->pos;
    const char *t = p->text;
    bool integer = true;
    if (p->pos < p->len && t[p->pos] == '-') p->pos++;
    if (p->pos >= p->len) return fail(p, start, "invalid number");
    if (t[p->pos] == '0') {
        p->pos++;
    } else if (t[p->pos] >= '1' && t[p->pos] <= '9') {
        while (p->pos < p->len && t[p->pos] >= '0' && t[p->pos] <= '9')
            p->pos++;
    } else {
        return fail(p, start, "invalid number");
    }
    if (p->pos < p->len && t[p->pos] == '.') {
        integer = false;
        p->pos++;
        size_t digits = p->pos;
        while (p->pos < p->len && t[p->pos] >= '0' && t[p->pos] <= '9')
            p->pos++;
        if (p->pos == digits) return fail(p, start, "invalid number (no digits after '.')");
    }
    if (p->pos < p->len && (t[p->pos] == 'e' || t[p->pos] == 'E')) {
        integer = false;
        p->pos++;
        if (p->pos < p->len && (t[p->pos] == '+' || t[p->pos] == '-')) p->pos++;
        size_t digits = p->pos;
        while (p->pos < p->len && t[p->pos] >= '0' && t[p->pos] <= '9')
            p->pos++;
        if (p->pos == digits) return fail(p, start, "invalid number (no exponent digits)");
    }
    size_t n = p->pos - start;
    char tmp[400];
    if (n >= sizeof tmp) return fail(p, start, "number too long");
    memcpy(tmp, t + start, n);
    tmp[n] = '\0';
    v->type = LUNA_JSON_NUMBER;
    v->number = strtod(tmp, NULL);
    if (integer) {
        errno = 0;
        if (tmp[0] == '-') {
            long long x = strtoll(tmp, NULL, 10);
            if (errno == 0) {
                v->is_int = true;
                v->is_negative = x < 0;
                v->int_value = x;
                v->uint_value = x < 0 ? 0 : (uint64_t)x;
            }
        } else {
            unsigned long long x = strtoull(tmp, NULL, 10);
            if (errno == 0) {
                v->is_int = true;
                v->uint_value = x;
                v->int_value = x > INT64_MAX ? INT64_MAX : (int64_t)x;
            }
        }
    }
    return LUNA_OK;
}

static luna_status parse_value(parser *p, luna_json *v);

/* Duplicate-key detection in O(1) per key: an open-addressing table of item indices (+1, 0 is
 * empty) over the keys parsed so far, kept at most half full. Only objects with more than
 * KEY_INDEX_MIN keys build one; smaller ones compare linearly. */
#define KEY_INDEX_MIN 16

typedef struct {
    size_t *slots;
    size_t capacity; /* a power of two, or 0 */
} key_index;

static uint64_t key_hash(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void key_index_put(key_index *ix, const luna_json *obj, size_t item) {
    size_t mask = ix->capacity - 1;
    for (size_t i = (size_t)key_hash(obj->keys[item]) & mask;; i = (i + 1) & mask)
        if (!ix->slots[i]) {
            ix->slots[i] = item + 1;
            return;
        }
}

/* Whether `key` is already a key of obj (items [0, obj->length)); false with *oom on failure. */
static bool key_seen(key_index *ix, const luna_json *obj, const char *key, bool *oom) {
    if (obj->length < KEY_INDEX_MIN) {
        for (size_t i = 0; i < obj->length; i++)
            if (strcmp(obj->keys[i], key) == 0) return true;
        return false;
    }
    if (2 * (obj->length + 1) > ix->capacity) { /* (re)build, at least twice as large */
        size_t cap = 64;
        while (cap < 4 * (obj->length + 1))
            cap *= 2;
        size_t *slots = calloc(cap, sizeof *slots);
        if (!slots) {
            *oom = true;
            return false;
        }
        free(ix->slots);
        ix->slots = slots;
        ix->capacity = cap;
        for (size_t i = 0; i < obj->length; i++)
            key_index_put(ix, obj, i);
    }
    size_t mask = ix->capacity - 1;
    for (size_t i = (size_t)key_hash(key) & mask; ix->slots[i]; i = (i + 1) & mask)
        if (strcmp(obj->keys[ix->slots[i] - 1], key) == 0) return true;
    return false;
}

static luna_status parse_container_items(parser *p, luna_json *v, bool object, key_index *ix);

static luna_status parse_container(parser *p, luna_json *v, bool object) {
    key_index ix = {0};
    luna_status st = parse_container_items(p, v, object, &ix);
    free(ix.slots);
    return st;
}

static luna_status parse_container_items(parser *p, luna_json *v, bool object, key_index *ix) {
    size_t start = p->pos++;
    if (++p->depth > 512) return fail(p, start, "nesting too deep");
    v->type = object ? LUNA_JSON_OBJECT : LUNA_JSON_ARRAY;
    size_t capacity = 0;
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == (object ? '}' : ']')) {
        p->pos++;
        p->depth--;
        return LUNA_OK;
    }
    for (;;) {
        if (v->length == capacity) {
            capacity = capacity ? 2 * capacity : 8;
            luna_json *items = realloc(v->items, capacity * sizeof *items);
            if (!items) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "JSON: out of memory");
            v->items = items;
            if (object) {
                char **keys = realloc(v->keys, capacity * sizeof *keys);
                if (!keys) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "JSON: out of memory");
                v->keys = keys;
            }
        }
        skip_ws(p);
        char *key = NULL;
        if (object) {
            if (p->pos >= p->len || p->text[p->pos] != '"')
                return fail(p, p->pos, "expected a string key");
            size_t key_at = p->pos, key_len;
            LUNA_TRY(parse_string(p, &key, &key_len));
            bool oom = false;
            if (strlen(key) != key_len || key_seen(ix, v, key, &oom)) {
                free(key);
                return fail(p, key_at, "duplicate object key");
            }
            if (oom) {
                free(key);
                return luna_error(LUNA_ERR_OUT_OF_MEMORY, "JSON: out of memory");
            }
            skip_ws(p);
            if (p->pos >= p->len || p->text[p->pos] != ':') {
                free(key);
                return fail(p, p->pos, "expected ':'");
            }
            p->pos++;
        }
        memset(&v->items[v->length], 0, sizeof v->items[0]);
        if (object) v->keys[v->length] = key;
        v->length++; /* counted now so that an error below frees it */
        if (object && ix->capacity) key_index_put(ix, v, v->length - 1);
        LUNA_TRY(parse_value(p, &v->items[v->length - 1]));
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, start, object ? "unterminated object" : "unterminated array");
        char c = p->text[p->pos++];
        if (c == ',') continue;
        if (c == (object ? '}' : ']')) break;
        return fail(p, p->pos - 1, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    p->depth--;
    return LUNA_OK;
}

static luna_status parse_literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return fail(p, p->pos, "invalid literal");
    p->pos += n;
    return LUNA_OK;
}

static luna_status parse_value(parser *p, luna_json *v) {
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, p->pos, "unexpected end of input");
    v->offset = p->pos;
    char c = p->text[p->pos];
    switch (c) {
    case '{': return parse_container(p, v, true);
    case '[': return parse_container(p, v, false);
    case '"': {
        char *s;
        size_t n;
        LUNA_TRY(parse_string(p, &s, &n));
        v->type = LUNA_JSON_STRING;
        v->string = s;
        v->length = n;
        return LUNA_OK;
    }
    case 't':
        v->type = LUNA_JSON_BOOL;
        v->boolean = true;
        return parse_literal(p, "true");
    case 'f': v->type = LUNA_JSON_BOOL; return parse_literal(p, "false");
    case 'n': v->type = LUNA_JSON_NULL; return parse_literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
        return fail(p, p->pos, "unexpected character");
    }
}

luna_status luna_json_parse(luna_json **out, const char *text, size_t len, size_t *error_offset) {
    *out = NULL;
    luna_json *root = calloc(1, sizeof *root);
    if (!root) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "JSON: out of memory");
    parser p = {.text = text, .len = len};
    luna_status st = parse_value(&p, root);
    if (st == LUNA_OK) {
        skip_ws(&p);
        if (p.pos != p.len) st = fail(&p, p.pos, "trailing characters after the value");
    }
    if (st != LUNA_OK) {
        if (error_offset) *error_offset = p.error_offset;
        luna_json_free(root);
        return st;
    }
    *out = root;
    return LUNA_OK;
}

void luna_json_free(luna_json *value) {
    if (!value) return;
    free_value(value);
    free(value);
}

const luna_json *luna_json_get(const luna_json *object, const char *key) {
    if (!object || object->type != LUNA_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < object->length; i++)
        if (object->keys[i] && strcmp(object->keys[i], key) == 0) return &object->items[i];
    return NULL;
}

const char *luna_json_type_name(luna_json_type type) {
    switch (type) {
    case LUNA_JSON_NULL: return "null";
    case LUNA_JSON_BOOL: return "boolean";
    case LUNA_JSON_NUMBER: return "number";
    case LUNA_JSON_STRING: return "string";
    case LUNA_JSON_ARRAY: return "array";
    case LUNA_JSON_OBJECT: return "object";
    }
    return "?";
}
