/* The text-to-text translation pipeline (decoding/text_translator.h). */
#include "decoding/text_translator.h"

#include "model/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"
#include "data/document.h"

/* ---- text input ------------------------------------------------------------------------------ */

void luna_text_input_release(luna_text_input *t) {
    free(t->data);
    free(t->line);
    free(t->len);
    memset(t, 0, sizeof *t);
}

luna_status luna_text_check_line(const char *name, size_t lineno, const char *s, size_t n) {
    size_t bad = 0;
    if (memchr(s, 0, n))
        return luna_error(LUNA_ERR_FORMAT, "%s:%zu: NUL byte in the line (give plain text)", name,
                          lineno);
    if (!luna_utf8_valid(s, n, &bad))
        return luna_error(LUNA_ERR_FORMAT,
                          "%s:%zu: invalid UTF-8 at byte %zu of the line (convert the input "
                          "to UTF-8, e.g. with iconv)",
                          name, lineno, bad + 1);
    return LUNA_OK;
}

luna_status luna_text_input_read(const char *path, luna_text_input *t) {
    const char *name = path ? path : "<stdin>";
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) return luna_error(LUNA_ERR_IO, "%s: cannot open (check the path)", name);
    size_t cap = 1 << 16, n = 0;
    t->data = malloc(cap);
    for (size_t got; t->data && (got = fread(t->data + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *g = realloc(t->data, cap *= 2);
            if (!g) free(t->data);
            t->data = g;
        }
    }
    bool err = ferror(f);
    if (path) fclose(f);
    if (!t->data) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory reading", name);
    if (err) return luna_error(LUNA_ERR_IO, "%s: read error", name);
    t->data[n] = 0;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += t->data[i] == '\n';
    lines += n > 0 && t->data[n - 1] != '\n';
    t->line = malloc(sizeof(char *) * (lines + 1));
    t->len = malloc(sizeof(size_t) * (lines + 1));
    if (!t->line || !t->len) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    for (size_t i = 0, start = 0; i < lines; i++) {
        size_t end = start;
        while (end < n && t->data[end] != '\n')
            end++;
        size_t len = end - start;
        if (len > 0 && t->data[start + len - 1] == '\r') len--;
        t->data[start + len] = 0;
        LUNA_TRY(luna_text_check_line(name, i + 1, t->data + start, len));
        t->line[i] = t->data + start;
        t->len[i] = len;
        start = end + 1;
    }
    t->count = lines;
    return LUNA_OK;
}

bool luna_text_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f')
            return false;
    return true;
}

/* ---- the translator -------------------------------------------------------------------------- */

static void release(luna_text_translator *t);

/* Frees t's own parts (a clone reads its origin's model, vocabulary and meta), then lets go of
 * its origin. */
static void destroy(luna_text_translator *t) {
    luna_incremental_free(t->inc);
    luna_seq2seq_free(t->model);
    if (!t->origin) {
        luna_dictionary_free(t->src_dict);
        luna_dictionary_free(t->tgt_dict);
        luna_spm_free(t->spm);
        luna_checkpoint_meta_release(&t->meta);
    }
    if (t->be) luna_backend_free(t->be);
    free(t->checkpoint);
    free(t->device);
    luna_text_translator *origin = t->origin;
    free(t);
    if (origin) release(origin);
}

/* An origin lives while its owner or a clone still reads it. */
static void release(luna_text_translator *t) {
    if (atomic_fetch_sub(&t->refs, 1) == 1) destroy(t);
}

void luna_text_translator_free(luna_text_translator *t) {
    if (!t) return;
    if (t->origin)
        destroy(t);
    else
        release(t);
}

static char *dup_string(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

luna_status luna_text_translator_clone(luna_text_translator **out, luna_text_translator *src) {
    *out = NULL;
    luna_text_translator *o = src->origin ? src->origin : src;
    if (strcmp(o->device, "cpu") != 0) /* a device backend keeps its own held weights */
        return luna_text_translator_create(out, o->checkpoint, o->device, &o->bo, o->quantize_int8);
    luna_text_translator *t = calloc(1, sizeof *t);
    if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    atomic_fetch_add(&o->refs, 1);
    t->origin = o;
    t->src_dict = o->src_dict, t->tgt_dict = o->tgt_dict, t->spm = o->spm, t->meta = o->meta;
    t->bo = o->bo, t->quantize_int8 = o->quantize_int8;
    luna_status st = LUNA_OK;
    if (!(t->checkpoint = dup_string(o->checkpoint)) || !(t->device = dup_string(o->device)))
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == LUNA_OK) st = luna_backend_create(&t->be, o->device, &o->bo);
    /* before the decoder holds its weights: its holds find the origin's */
    if (st == LUNA_OK) st = luna_backend_share_held_weights(t->be, o->be);
    if (st == LUNA_OK) st = luna_seq2seq_create_shared(&t->model, t->be, o->model);
    if (st == LUNA_OK) st = luna_incremental_create(&t->inc, t->model);
    if (st != LUNA_OK) {
        destroy(t);
        return st;
    }
    *out = t;
    return LUNA_OK;
}

luna_status luna_text_translator_create(luna_text_translator **out, const char *checkpoint,
                                        const char *device, const luna_backend_options *bo,
                                        bool quantize_int8) {
    *out = NULL;
    luna_text_translator *t = calloc(1, sizeof *t);
    if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    atomic_init(&t->refs, 1);
    t->bo = bo ? *bo : luna_backend_options_default();
    t->quantize_int8 = quantize_int8;
    luna_status st = LUNA_OK;
    if (!(t->checkpoint = dup_string(checkpoint)) || !(t->device = dup_string(device)))
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == LUNA_OK) st = luna_backend_create(&t->be, device, bo);
    if (st == LUNA_OK) st = luna_checkpoint_load_model(checkpoint, t->be, &t->model, &t->meta);
    /* before the decoder holds its weights (luna_incremental_create): they are held as int8 */
    if (st == LUNA_OK && quantize_int8) st = luna_params_quantize_int8(t->model->params);
    if (st == LUNA_OK && t->model->params->weight_dtype == LUNA_I8 && strcmp(device, "cpu") != 0)
        st = luna_error(LUNA_ERR_UNSUPPORTED,
                        "%s: int8 weights%s decode on the CPU only; use --device cpu", checkpoint,
                        quantize_int8 ? " (--quantize int8)" : "");
    if (st == LUNA_OK)
        st = luna_checkpoint_load_vocab(checkpoint, t->model->config.vocab_size, &t->src_dict,
                                        &t->tgt_dict, &t->spm);
    if (st == LUNA_OK && (!t->src_dict || !t->tgt_dict ||
                          luna_dictionary_size(t->tgt_dict) != t->model->config.vocab_size))
        st = luna_error(LUNA_ERR_FORMAT,
                        "%s: the checkpoint carries no usable vocabulary (src_dict/tgt_dict); "
                        "use a checkpoint written by luna-train or luna-average",
                        checkpoint);
    if (st == LUNA_OK) st = luna_incremental_create(&t->inc, t->model);
    if (st != LUNA_OK) {
        luna_text_translator_free(t);
        return st;
    }
    *out = t;
    return LUNA_OK;
}

/* ---- encoding -------------------------------------------------------------------------------- */

/* Text -> dictionary ids + </s> (SentencePiece, or whitespace tokens without a model). */
typedef struct {
    const luna_spm *spm; /* NULL: split on spaces and tabs */
    const luna_dictionary *dict;
    luna_spm_pieces pieces;
} encoder;

static luna_status encode(encoder *e, const char *s, size_t n, int32_t **ids, int *len) {
    *ids = NULL;
    *len = 0;
    size_t count = 0;
    char *copy = NULL;
    char **words = NULL;
    if (e->spm) {
        LUNA_TRY(luna_spm_encode_pieces(e->spm, s, n, &e->pieces));
        count = e->pieces.count;
        words = e->pieces.pieces;
    } else {
        copy = malloc(n + 1);
        words = malloc(sizeof(char *) * (n / 2 + 2));
        if (!copy || !words) {
            free(copy), free(words);
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        }
        memcpy(copy, s, n);
        copy[n] = 0;
        /* strtok_r: one translator may encode on several threads (different handles). */
        char *save = NULL;
        for (char *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save))
            words[count++] = tok;
    }
    int32_t *out = malloc(sizeof(int32_t) * (count + 1));
    if (out) {
        for (size_t i = 0; i < count; i++)
            out[i] = luna_dictionary_index(e->dict, words[i], strlen(words[i]));
        out[count] = LUNA_DICT_EOS;
    }
    if (!e->spm) free(copy), free(words);
    if (!out) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    *ids = out;
    *len = (int)count + 1;
    return LUNA_OK;
}

/* encode(), and for a dictionary with <sep> a line "s1 <sep> s2 ..." as s1 <sep> s2 ... </s>. */
static luna_status encode_document(encoder *e, const char *s, size_t n, int32_t **ids, int *len) {
    const size_t k = strlen(LUNA_DOC_SEPARATOR);
    const int32_t sep = luna_dictionary_find(e->dict, LUNA_DOC_SEPARATOR, k);
    const char *at = NULL;
    for (size_t j = 0; sep >= 0 && !at && j + k <= n; j++)
        if (!memcmp(s + j, LUNA_DOC_SEPARATOR, k)) at = s + j;
    if (!at) return encode(e, s, n, ids, len);
    int32_t *head, *tail;
    int hn, tn;
    LUNA_TRY(encode(e, s, (size_t)(at - s), &head, &hn));
    luna_status st = encode_document(e, at + k, n - (size_t)(at - s) - k, &tail, &tn);
    if (st != LUNA_OK) {
        free(head);
        return st;
    }
    int32_t *out = realloc(head, sizeof(int32_t) * (size_t)(hn + tn));
    if (!out) {
        free(head), free(tail);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    out[hn - 1] = sep; /* head's </s> */
    memcpy(out + hn, tail, sizeof(int32_t) * (size_t)tn);
    free(tail);
    *ids = out;
    *len = hn + tn;
    return LUNA_OK;
}

void luna_encoded_text_release(luna_encoded_text *e) {
    for (size_t i = 0; e->ids && i < e->count; i++)
        free(e->ids[i]);
    free(e->ids), free(e->len), free(e->truncated);
    memset(e, 0, sizeof *e);
}

luna_status luna_text_translator_encode(const luna_text_translator *t, const luna_dictionary *d,
                                        const char *const *lines, const size_t *len, size_t n,
                                        bool pieces, int max_input_tokens, const char *name,
                                        luna_truncate_warning warn, void *warn_ctx,
                                        luna_encoded_text *out) {
    memset(out, 0, sizeof *out);
    out->ids = calloc(n + 1, sizeof(int32_t *));
    out->len = calloc(n + 1, sizeof(int));
    out->truncated = calloc(n + 1, sizeof(bool));
    out->count = n;
    if (!out->ids || !out->len || !out->truncated)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    encoder e = {.spm = pieces ? NULL : t->spm, .dict = d};
    luna_spm_pieces_init(&e.pieces);
    luna_status st = LUNA_OK;
    const luna_config *c = &t->model->config;
    for (size_t i = 0; i < n && st == LUNA_OK; i++) {
        if (luna_text_blank(lines[i], len[i])) continue; /* empty translation */
        st = encode_document(&e, lines[i], len[i], &out->ids[i], &out->len[i]);
        if (st != LUNA_OK) luna_error_prefix("%s:%zu", name, i + 1);
        if (st == LUNA_OK && max_input_tokens > 0 && out->len[i] > max_input_tokens) {
            if (warn) warn(warn_ctx, name, i + 1, out->len[i], max_input_tokens);
            out->len[i] = max_input_tokens;
            out->ids[i][max_input_tokens - 1] = LUNA_DICT_EOS;
            out->truncated[i] = true;
        }
        /* Linformer's E, F have a fixed length: a longer source cannot be encoded at all. */
        if (st == LUNA_OK && max_input_tokens > 0 && c->linformer_k > 0 &&
            out->len[i] > c->max_source_positions)
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT,
                            "%s:%zu: %d subword tokens exceed the Linformer maximum of %d "
                            "(the model's max_source_positions; shorten or split the line)",
                            name, i + 1, out->len[i], c->max_source_positions);
    }
    luna_spm_pieces_release(&e.pieces);
    return st;
}

/* ---- searching and scoring ------------------------------------------------------------------- */

luna_status luna_text_translator_generate(luna_text_translator *t, const luna_beam_options *o,
                                          const luna_encoded_text *src, int max_tokens,
                                          int batch_size, luna_nbest *out, size_t *searched) {
    const size_t n = src->count;
    *searched = 0;
    memset(out, 0, sizeof *out * n);
    luna_token_seq *seq = calloc(n + 1, sizeof *seq);
    size_t *idx = malloc(sizeof *idx * (n + 1));
    luna_nbest *res = calloc(n + 1, sizeof *res);
    luna_status st = LUNA_OK;
    if (!seq || !idx || !res) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n && st == LUNA_OK; i++) {
        if (!src->ids[i]) continue;
        seq[k] = (luna_token_seq){src->ids[i], src->len[i]};
        idx[k++] = i;
    }
    if (st == LUNA_OK)
        st = luna_generate(t->inc, o, seq, (int)k, max_tokens, batch_size, res, NULL, NULL);
    for (size_t j = 0; j < k && st == LUNA_OK; j++)
        out[idx[j]] = res[j];
    if (st == LUNA_OK) *searched = k;
    free(seq), free(idx), free(res);
    return st;
}

luna_status luna_text_translator_score(luna_text_translator *t, const luna_encoded_text *src,
                                       const luna_encoded_text *tgt, int max_tokens, int batch_size,
                                       float **positional, size_t *scored) {
    *scored = 0;
    if (src->count != tgt->count)
        return luna_error(LUNA_ERR_MISMATCH, "%zu translations for %zu sentences", tgt->count,
                          src->count);
    const size_t n = src->count;
    memset(positional, 0, sizeof *positional * n);
    luna_token_seq *s = calloc(n + 1, sizeof *s), *g = calloc(n + 1, sizeof *g);
    size_t *idx = malloc(sizeof *idx * (n + 1));
    float **pos = calloc(n + 1, sizeof *pos);
    luna_status st = LUNA_OK;
    if (!s || !g || !idx || !pos) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n && st == LUNA_OK; i++) {
        if (!src->ids[i] || !tgt->ids[i]) continue;
        s[k] = (luna_token_seq){src->ids[i], src->len[i]};
        g[k] = (luna_token_seq){tgt->ids[i], tgt->len[i]};
        idx[k++] = i;
    }
    if (st == LUNA_OK) st = luna_score_targets(t->inc, s, g, (int)k, max_tokens, batch_size, pos);
    for (size_t j = 0; j < k && st == LUNA_OK; j++)
        positional[idx[j]] = pos[j];
    if (st == LUNA_OK) *scored = k;
    free(s), free(g), free(idx), free(pos);
    return st;
}

/* ---- output text ----------------------------------------------------------------------------- */

luna_status luna_text_translator_detokenize(const luna_text_translator *t, const luna_dictionary *d,
                                            const int32_t *tokens, int n, bool pieces, char **out) {
    *out = NULL;
    const char **p = malloc(sizeof(char *) * (size_t)(n + 1));
    if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    size_t total = 1;
    for (int i = 0; i < n; i++)
        total += strlen(p[i] = luna_dictionary_symbol(d, tokens[i])) + 1;
    luna_status st = LUNA_OK;
    if (t->spm && !pieces) {
        st = luna_spm_decode_pieces(t->spm, p, (size_t)n, out);
    } else if ((*out = malloc(total))) {
        char *w = *out;
        for (int i = 0; i < n; i++) {
            if (i) *w++ = ' ';
            size_t k = strlen(p[i]);
            memcpy(w, p[i], k);
            w += k;
        }
        *w = 0;
    } else {
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    free(p);
    return st;
}

/* A document's hypothesis: one detokenized line per source sentence, joined by '\n'. */
static luna_status document_text(const luna_text_translator *t, const int32_t *src_ids, int src_len,
                                 const luna_hypothesis *h, int body, int32_t sep, bool pieces,
                                 char **out) {
    *out = NULL;
    int *seg = malloc(sizeof(int) * 2 * (size_t)(h->len + src_len + 2));
    if (!seg) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    int *start = seg, *len = seg + h->len + 1, *src_start = len + h->len + 1;
    int lines = luna_document_segments(src_ids, src_len, sep, src_start, src_start + src_len + 1);
    int n = luna_document_segments(h->tokens, body, sep, start, len);
    luna_status st = LUNA_OK;
    size_t size = 0;
    char *text = NULL;
    for (int j = 0; j < lines && st == LUNA_OK; j++) {
        /* the last line takes the rest: extra <sep>s stay as text there */
        int from = j < n ? start[j] : body, to = j < n ? start[j] + len[j] : body;
        if (j == lines - 1 && j < n) to = body;
        char *d;
        st = luna_text_translator_detokenize(t, t->tgt_dict, h->tokens + from, to - from, pieces,
                                             &d);
        if (st != LUNA_OK) break;
        size_t k = strlen(d);
        char *g = realloc(text, size + k + 2);
        if (!g) {
            free(d);
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        text = g;
        if (j) text[size++] = '\n';
        memcpy(text + size, d, k + 1);
        size += k;
        free(d);
    }
    free(seg);
    if (st == LUNA_OK && !text && !(text = calloc(1, 1)))
        st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != LUNA_OK) {
        free(text);
        return st;
    }
    *out = text;
    return LUNA_OK;
}

luna_status luna_text_translator_hypothesis_text(const luna_text_translator *t,
                                                 const int32_t *src_ids, int src_len,
                                                 const luna_hypothesis *h, bool pieces,
                                                 char **out) {
    const int body = luna_hypothesis_body_len(h->tokens, h->len);
    const int32_t sep =
        luna_dictionary_find(t->tgt_dict, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR));
    if (sep >= 0 && src_ids) return document_text(t, src_ids, src_len, h, body, sep, pieces, out);
    return luna_text_translator_detokenize(t, t->tgt_dict, h->tokens, body, pieces, out);
}
