/* luna-preprocess: raw parallel text -> data-bin (fairseq's binarized format + spm.model).
 *
 *   luna-preprocess --source-lang en --target-lang de --trainpref P --validpref P --testpref P \
 *                   --destdir DIR --joined-dictionary --workers N
 *
 * Steps: check every input (UTF-8, empty lines, line lengths, aligned line counts) before doing
 * any work; train a joint SentencePiece BPE model on the training text (or reuse --spm-model, or
 * take already-tokenized text with --no-spm); build the fairseq dictionary from the training
 * split; encode + binarize every split in parallel. Everything is written to a staging directory
 * next to --destdir and moved into place only when complete.
 *
 * Exit status: 0 success, 1 bad input or failure (one line on stderr), 2 usage error.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/binarizer.h"
#include "data/document.h"
#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "data/staged_dir.h"
#include "data/text_lines.h"
#include "core/file_util.h"
#include "core/options_registry.h"

#define PROG "luna-preprocess"

/* ---- options: one registry table drives parsing and --help (core/options_registry.h) ------ */

typedef struct {
    const char *source_lang, *target_lang, *trainpref, *validpref, *testpref, *destdir, *spm_model;
    const char *srcdict, *tgtdict;
    bool joined, no_spm, skip_empty;
    int64_t workers, bpe_vocab_size, max_line_bytes, thresholdsrc, thresholdtgt, nwordssrc,
        nwordstgt, padding_factor, document_window;
    double character_coverage;
} options;

static options opt;

#define F(field) offsetof(options, field)
#define G_IO "input and output"
#define G_SPM "SentencePiece"
#define G_DICT "dictionary"
#define G_CHECK "input checks"
#define G_RUN "runtime"

/* clang-format off */
static const luna_option_spec OPTIONS[] = {
    {"--source-lang", LUNA_OPT_STRING, NULL, G_IO, "SRC", NULL, F(source_lang), "source language suffix of the text files (required)"},
    {"--target-lang", LUNA_OPT_STRING, NULL, G_IO, "TGT", NULL, F(target_lang), "target language suffix (required)"},
    {"--trainpref", LUNA_OPT_STRING, NULL, G_IO, "P", NULL, F(trainpref), "training text: P.SRC and P.TGT (required unless --srcdict)"},
    {"--validpref", LUNA_OPT_STRING, NULL, G_IO, "P", NULL, F(validpref), "validation text; comma-separated prefixes become valid, valid1, ..."},
    {"--testpref", LUNA_OPT_STRING, NULL, G_IO, "P", NULL, F(testpref), "test text; comma-separated prefixes become test, test1, ..."},
    {"--destdir", LUNA_OPT_STRING, "data-bin", G_IO, "DIR", NULL, F(destdir), "output data-bin directory"},
    {"--bpe-vocab-size", LUNA_OPT_INT, "32000", G_SPM, "N", NULL, F(bpe_vocab_size), "SentencePiece BPE vocabulary size"},
    {"--spm-model", LUNA_OPT_STRING, NULL, G_SPM, "FILE", NULL, F(spm_model), "reuse this SentencePiece model instead of training one"},
    {"--no-spm", LUNA_OPT_FLAG, NULL, G_SPM, NULL, NULL, F(no_spm), "the text is already tokenized/BPE'd: split on whitespace only"},
    {"--character-coverage", LUNA_OPT_DOUBLE, "1.0", G_SPM, "F", NULL, F(character_coverage), "SentencePiece character coverage"},
    {"--joined-dictionary", LUNA_OPT_FLAG, NULL, G_DICT, NULL, NULL, F(joined), "one dictionary for both languages (dict.SRC.txt = dict.TGT.txt)"},
    {"--srcdict", LUNA_OPT_STRING, NULL, G_DICT, "FILE", NULL, F(srcdict), "reuse this source (or joined) dictionary instead of building one"},
    {"--tgtdict", LUNA_OPT_STRING, NULL, G_DICT, "FILE", NULL, F(tgtdict), "reuse this target dictionary instead of building one"},
    {"--thresholdsrc", LUNA_OPT_INT, "0", G_DICT, "N", NULL, F(thresholdsrc), "drop source (or joined) words seen fewer than N times"},
    {"--thresholdtgt", LUNA_OPT_INT, "0", G_DICT, "N", NULL, F(thresholdtgt), "drop target words seen fewer than N times"},
    {"--nwordssrc", LUNA_OPT_INT, "-1", G_DICT, "N", NULL, F(nwordssrc), "cap the source (or joined) dictionary at N symbols (-1: no cap)"},
    {"--nwordstgt", LUNA_OPT_INT, "-1", G_DICT, "N", NULL, F(nwordstgt), "cap the target dictionary at N symbols (-1: no cap)"},
    {"--padding-factor", LUNA_OPT_INT, "8", G_DICT, "N", NULL, F(padding_factor), "pad dictionary sizes to a multiple of N"},
    {"--max-line-bytes", LUNA_OPT_INT, "1048576", G_CHECK, "N", NULL, F(max_line_bytes), "reject lines longer than N bytes"},
    {"--skip-empty", LUNA_OPT_FLAG, NULL, G_CHECK, NULL, NULL, F(skip_empty),
     "drop sentence pairs where either side is empty or blank, in every split "
     "(counted in the summary); without it an empty line is an error, since it usually "
     "means misaligned or damaged data (fairseq would silently keep it as a bare </s>)"},
    {"--document-window", LUNA_OPT_INT, "0", G_IO, "N", NULL, F(document_window),
     "document-level pairs: windows of consecutive sentence pairs of at most N tokens per side, "
     "joined by the symbol " LUNA_DOC_SEPARATOR " (added to the dictionary); the files must keep "
     "documents in order (0: sentence pairs)"},
    {"--workers", LUNA_OPT_INT, "1", G_RUN, "N", NULL, F(workers), "threads for SentencePiece training and encoding"},
};
/* clang-format on */

static const luna_option_table TABLE = {.specs = OPTIONS,
                                        .count = (int)(sizeof OPTIONS / sizeof OPTIONS[0])};

static const char USAGE[] =
    "usage: " PROG " --source-lang SRC --target-lang TGT --trainpref P [--validpref P]\n"
    "                       [--testpref P] [--destdir DIR] [--joined-dictionary] [--workers N]\n"
    "                       [options]\n\n"
    "Raw parallel text -> fairseq data-bin: trains a joint SentencePiece BPE model on the "
    "training\n"
    "text, builds the dictionary from the training split, and writes dict.SRC.txt, "
    "dict.TGT.txt,\n"
    "spm.model, spm.vocab and {split}.SRC-TGT.{lang}.{bin,idx} into DIR. Inputs are checked "
    "first\n"
    "(UTF-8, empty lines, line lengths, line counts); DIR is only changed when everything "
    "succeeded.\n";

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv) {
    int done = luna_options_parse_program(&TABLE, &opt, argc, argv, NULL, PROG, USAGE);
    if (done >= 0) return done;
    if (!opt.source_lang || !opt.target_lang)
        return luna_options_usage_error(PROG, "%s", "--source-lang and --target-lang are required");
    bool have_dicts = opt.srcdict && (opt.tgtdict || opt.joined);
    if (!opt.trainpref && !have_dicts)
        return luna_options_usage_error(
            PROG, "%s",
            "--trainpref is required (the dictionary is built from it) unless --srcdict and "
            "--tgtdict (or --joined-dictionary) are given");
    if (!opt.trainpref && !opt.no_spm && !opt.spm_model)
        return luna_options_usage_error(
            PROG, "%s",
            "without --trainpref there is nothing to train SentencePiece on: give --spm-model");
    if (!strcmp(opt.source_lang, opt.target_lang))
        return luna_options_usage_error(PROG, "%s", "source and target languages must differ");
    if (opt.no_spm && opt.spm_model)
        return luna_options_usage_error(PROG, "%s", "--no-spm and --spm-model exclude each other");
    if (opt.workers < 1 || opt.workers > 1024)
        return luna_options_usage_error(PROG, "%s", "--workers must be between 1 and 1024");
    if (opt.bpe_vocab_size < 8 || opt.bpe_vocab_size > 100000000)
        return luna_options_usage_error(PROG, "%s", "--bpe-vocab-size must be in 8..100000000");
    if (opt.document_window < 0 || opt.document_window > 1000000)
        return luna_options_usage_error(PROG, "%s", "--document-window must be in 0..1000000");
    if (opt.padding_factor < 1 || opt.padding_factor > 1000000)
        return luna_options_usage_error(PROG, "%s", "--padding-factor must be in 1..1000000");
    if (opt.max_line_bytes < 1)
        return luna_options_usage_error(PROG, "%s", "--max-line-bytes must be positive");
    if (!(opt.character_coverage > 0.0 && opt.character_coverage <= 1.0))
        return luna_options_usage_error(PROG, "%s", "--character-coverage must be in (0, 1]");
    return -1;
}

/* ---- the corpus: every split's text, checked ----------------------------------------------------
 */

#define MAX_SPLITS 32

typedef struct {
    char name[32]; /* train, valid, valid1, test, ... */
    char *path[2]; /* prefix.SRC, prefix.TGT */
    luna_text_lines *text[2];
    uint8_t *skip; /* pairs dropped by --skip-empty (NULL: none) */
    size_t skipped;
} split;

static split splits[MAX_SPLITS];
static int num_splits;
static const split *train_split; /* NULL without --trainpref */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(args, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, args);
    va_end(args);
    return s;
}

static luna_status add_splits(const char *base, const char *prefixes) {
    if (!prefixes) return LUNA_OK;
    char *copy = strdup(prefixes);
    if (!copy) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    int k = 0;
    luna_status st = LUNA_OK;
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p && st == LUNA_OK;
         p = strtok_r(NULL, ",", &save), k++) {
        if (num_splits == MAX_SPLITS) {
            st = luna_error(LUNA_ERR_INVALID_ARGUMENT, "too many splits (at most %d)", MAX_SPLITS);
            break;
        }
        split *s = &splits[num_splits++];
        if (k == 0)
            snprintf(s->name, sizeof s->name, "%s", base);
        else
            snprintf(s->name, sizeof s->name, "%s%d", base, k);
        s->path[0] = str_printf("%s.%s", p, opt.source_lang);
        s->path[1] = str_printf("%s.%s", p, opt.target_lang);
        if (!s->path[0] || !s->path[1]) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    free(copy);
    return st;
}

/* Open and check every file before any work, so that a bad test set fails in seconds and not
 * after an hour of BPE training. */
static luna_status check_inputs(void) {
    luna_text_check check = {(size_t)opt.max_line_bytes, opt.skip_empty};
    for (int i = 0; i < num_splits; i++) {
        split *s = &splits[i];
        for (int side = 0; side < 2; side++)
            LUNA_TRY(luna_text_lines_open(&s->text[side], s->path[side], &check));
        size_t n0 = s->text[0]->count, n1 = s->text[1]->count;
        if (n0 != n1) {
            int longer = n1 > n0;
            size_t lo = longer ? n0 : n1, hi = longer ? n1 : n0;
            return luna_error(LUNA_ERR_MISMATCH,
                              "%s:%zu: line count differs: %s has %zu lines but %s has %zu "
                              "(the source and target files must be aligned line by line)",
                              s->path[longer], lo + 1, s->path[longer], hi, s->path[!longer], lo);
        }
        if (n0 == 0)
            return luna_error(LUNA_ERR_FORMAT,
                              "%s:1: the file is empty (give a corpus with at least one "
                              "sentence pair)",
                              s->path[0]);
        if (opt.skip_empty && (s->text[0]->num_empty || s->text[1]->num_empty)) {
            s->skip = calloc(n0, 1);
            if (!s->skip) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
            for (size_t k = 0; k < n0; k++) {
                size_t l0, l1;
                const char *a = luna_text_line(s->text[0], k, &l0),
                           *b = luna_text_line(s->text[1], k, &l1);
                s->skip[k] = luna_text_is_blank(a, l0) || luna_text_is_blank(b, l1);
                s->skipped += s->skip[k];
            }
            if (s->skipped == n0)
                return luna_error(LUNA_ERR_FORMAT,
                                  "%s:1: every sentence pair has an empty side (check the files)",
                                  s->path[0]);
        }
    }
    return LUNA_OK;
}

/* ---- SentencePiece ------------------------------------------------------------------------------
 */

typedef struct {
    const split *train;
    int side;
    size_t line;
} train_lines;

/* Feeds the trainer both sides of the training split, minus pairs skipped as empty. */
static int next_train_line(void *ctx, const char **line, size_t *len) {
    train_lines *t = ctx;
    while (t->side < 2) {
        const luna_text_lines *text = t->train->text[t->side];
        if (t->line >= text->count) {
            t->side++;
            t->line = 0;
            continue;
        }
        size_t i = t->line++;
        if (t->train->skip && t->train->skip[i]) continue;
        *line = luna_text_line(text, i, len);
        return 1;
    }
    return 0;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static luna_status prepare_spm(const char *stage, luna_spm **spm) {
    *spm = NULL;
    char *prefix = luna_path_join(stage, "spm");
    char *model = luna_path_join(stage, "spm.model"), *vocab = luna_path_join(stage, "spm.vocab");
    luna_status st =
        prefix && model && vocab ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == LUNA_OK && opt.spm_model) {
        st = luna_spm_load(spm, opt.spm_model);
        const void *bytes;
        size_t size;
        if (st == LUNA_OK) st = luna_spm_serialized(*spm, &bytes, &size);
        if (st == LUNA_OK) st = luna_write_file_atomic(model, bytes, size);
        if (st == LUNA_OK) st = luna_spm_save_vocab(*spm, vocab);
        if (st == LUNA_OK)
            printf(PROG ": using SentencePiece model %s (%d pieces)\n", opt.spm_model,
                   luna_spm_vocab_size(*spm));
    } else if (st == LUNA_OK) {
        double t0 = now_seconds();
        train_lines ctx = {train_split, 0, 0};
        luna_spm_train_options o;
        luna_spm_train_options_init(&o);
        o.next = next_train_line;
        o.next_ctx = &ctx;
        o.model_prefix = prefix;
        o.vocab_size = (int)opt.bpe_vocab_size;
        o.character_coverage = opt.character_coverage;
        o.num_threads = (int)opt.workers;
        o.input_sentence_size =
            10000000; /* beyond 10M sentences, a random sample is plenty for BPE */
        o.max_sentence_length =
            (size_t)opt.max_line_bytes; /* no checked line is silently dropped */
        st = luna_spm_train(&o);
        if (st == LUNA_OK) st = luna_spm_load(spm, model);
        if (st == LUNA_OK)
            printf(PROG
                   ": trained SentencePiece BPE (%d pieces, character coverage %g) in %.1f s\n",
                   luna_spm_vocab_size(*spm), opt.character_coverage, now_seconds() - t0);
    }
    free(prefix);
    free(model);
    free(vocab);
    return st;
}

/* ---- dictionaries
 * --------------------------------------------------------------------------------- */

/* The dictionary from --srcdict/--tgtdict (`given`), or counted on the training split. */
static luna_status build_dict(const luna_tokenizer *tok, const char *given, const int *sides,
                              int nsides, long threshold, long nwords, luna_dictionary **out) {
    if (given) return luna_dictionary_load(out, given);
    if (!train_split)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "no dictionary for %s (give --trainpref or --tgtdict)", opt.target_lang);
    LUNA_TRY(luna_dictionary_create(out));
    luna_status st = LUNA_OK;
    for (int k = 0; k < nsides && st == LUNA_OK; k++)
        st = luna_count_tokens(tok, train_split->text[sides[k]], train_split->skip, *out);
    /* document windows: the separator, counted once per line so that it survives thresholds */
    if (st == LUNA_OK && opt.document_window > 0)
        st = luna_dictionary_add(*out, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR),
                                 (int64_t)train_split->text[sides[0]]->count, false, NULL);
    if (st == LUNA_OK)
        st = luna_dictionary_finalize(*out, threshold, nwords, (int)opt.padding_factor);
    return st;
}

/* Binarize split s, side `side`, into <dir>/<name>.<src>-<tgt>.<lang> ("name" = the split's, or
 * "<split>.sentences" as the input of document windows). */
static luna_status binarize_side(const luna_tokenizer *tok, const char *dir, const split *s,
                                 const char *name, int side, const luna_dictionary *dict,
                                 const char *lang) {
    char *prefix = str_printf("%s/%s.%s-%s.%s", dir, name, opt.source_lang, opt.target_lang, lang);
    if (!prefix) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_binarize_stats stats;
    luna_status st = luna_binarize(tok, s->text[side], s->skip, dict, prefix, &stats);
    free(prefix);
    if (st == LUNA_OK)
        printf(PROG ": [%s] %s %s: %lld sentences, %lld tokens, %.3f%% <unk>, %.2f s, %.0f "
                    "sentences/s\n",
               lang, s->name, s->path[side], (long long)stats.sentences, (long long)stats.tokens,
               stats.tokens ? 100.0 * (double)stats.unknown / (double)stats.tokens : 0.0,
               stats.seconds, stats.seconds > 0 ? (double)stats.sentences / stats.seconds : 0.0);
    return st;
}

/* --document-window: the split's sentence pairs, then the windows over them (spec of the
 * windows: data/document.h); the sentence-level files are removed afterwards. */
static luna_status binarize_windows(const luna_tokenizer *tok, const char *dir, const split *s,
                                    luna_dictionary *const dicts[2], const char *const langs[2]) {
    char name[64];
    snprintf(name, sizeof name, "%.31s.sentences", s->name);
    for (int side = 0; side < 2; side++)
        LUNA_TRY(binarize_side(tok, dir, s, name, side, dicts[opt.joined ? 0 : side], langs[side]));
    const luna_dictionary *td = dicts[opt.joined ? 0 : 1];
    int32_t sep = luna_dictionary_find(dicts[0], LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR));
    if (sep < 0 || sep != luna_dictionary_find(td, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR)))
        return luna_error(LUNA_ERR_FORMAT,
                          "--document-window: the dictionaries must both have the symbol %s at "
                          "the same id (a given --srcdict/--tgtdict lacks it?)",
                          LUNA_DOC_SEPARATOR);
    char *in[2] = {NULL, NULL}, *out[2] = {NULL, NULL};
    luna_status st = LUNA_OK;
    for (int side = 0; side < 2; side++) {
        in[side] =
            str_printf("%s/%s.%s-%s.%s", dir, name, opt.source_lang, opt.target_lang, langs[side]);
        out[side] = str_printf("%s/%s.%s-%s.%s", dir, s->name, opt.source_lang, opt.target_lang,
                               langs[side]);
        if (!in[side] || !out[side]) st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    luna_window_stats ws;
    size_t vocab = (size_t)luna_dictionary_size(dicts[0]);
    if ((size_t)luna_dictionary_size(td) > vocab) vocab = (size_t)luna_dictionary_size(td);
    if (st == LUNA_OK)
        st = luna_document_windows((const char *const *)in, (const char *const *)out, sep,
                                   (int)opt.document_window, vocab, &ws);
    if (st == LUNA_OK)
        printf(PROG ": %s: %zu document windows of at most %lld tokens from %zu sentence pairs "
                    "(mean %.0f / %.0f tokens, longest %d / %d)\n",
               s->name, ws.windows, (long long)opt.document_window, ws.sentences,
               ws.windows ? (double)ws.tokens[0] / (double)ws.windows : 0.0,
               ws.windows ? (double)ws.tokens[1] / (double)ws.windows : 0.0, ws.longest[0],
               ws.longest[1]);
    for (int side = 0; side < 2; side++) {
        for (int k = 0; st == LUNA_OK && k < 2; k++) {
            char *f = str_printf("%s.%s", in[side], k ? "idx" : "bin");
            if (!f || remove(f) != 0)
                st = luna_error(LUNA_ERR_IO, "%s: cannot remove the sentence-level file",
                                f ? f : in[side]);
            free(f);
        }
        free(in[side]);
        free(out[side]);
    }
    return st;
}

/* A --destdir that already holds a dictionary must get the same one: its existing splits were
 * binarized with it, and silently renumbering the tokens would corrupt them. */
static luna_status check_existing_dict(const luna_dictionary *dict, const char *lang) {
    char *name = str_printf("dict.%s.txt", lang);
    char *path = name ? luna_path_join(opt.destdir, name) : NULL;
    free(name);
    if (!path) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_status st = LUNA_OK;
    if (luna_path_exists(path)) {
        luna_dictionary *old = NULL;
        st = luna_dictionary_load(&old, path);
        int32_t diff;
        if (st == LUNA_OK && !luna_dictionary_same_symbols(old, dict, &diff)) {
            const char *a = luna_dictionary_symbol(old, diff),
                       *b = luna_dictionary_symbol(dict, diff);
            st = luna_error(
                LUNA_ERR_MISMATCH,
                "%s:%d: the existing dictionary differs from the one built from "
                "the training data ('%s' here, '%s' now) (choose a new --destdir or remove the old "
                "one)",
                path, diff - LUNA_DICT_NSPECIAL + 1, a ? a : "<end of file>",
                b ? b : "<end of dictionary>");
        }
        luna_dictionary_free(old);
    }
    free(path);
    return st;
}

/* ---- main
 * ----------------------------------------------------------------------------------------- */

static luna_status run(void) {
    LUNA_TRY(add_splits("train", opt.trainpref));
    train_split = opt.trainpref ? &splits[0] : NULL;
    LUNA_TRY(add_splits("valid", opt.validpref));
    LUNA_TRY(add_splits("test", opt.testpref));
    LUNA_TRY(check_inputs());
    for (int i = 0; i < num_splits; i++)
        if (splits[i].skipped)
            printf(PROG
                   ": %s: skipping %zu of %zu sentence pairs with an empty side (--skip-empty)\n",
                   splits[i].name, splits[i].skipped, splits[i].text[0]->count);

    luna_staged_dir *stage = NULL;
    LUNA_TRY(luna_staged_dir_create(&stage, opt.destdir));
    const char *stale_example;
    size_t stale = luna_staged_dir_stale_removed(stage, &stale_example);
    if (stale)
        printf(PROG ": note: removed %zu staging director%s of an earlier run that no longer "
                    "runs (e.g. %s)\n",
               stale, stale == 1 ? "y" : "ies", stale_example);
    const char *dir = luna_staged_dir_path(stage);
    luna_spm *spm = NULL;
    luna_dictionary *dicts[2] = {NULL, NULL};
    luna_status st = opt.no_spm ? LUNA_OK : prepare_spm(dir, &spm);
    luna_tokenizer tok = {spm, (int)opt.workers};

    const char *langs[2] = {opt.source_lang, opt.target_lang};
    if (st == LUNA_OK) {
        double t0 = now_seconds();
        if (opt.joined) {
            st = build_dict(&tok, opt.srcdict, (const int[]){0, 1}, 2, opt.thresholdsrc,
                            opt.nwordssrc, &dicts[0]);
            int32_t diff;
            if (st == LUNA_OK && opt.tgtdict) st = luna_dictionary_load(&dicts[1], opt.tgtdict);
            if (st == LUNA_OK && opt.tgtdict &&
                !luna_dictionary_same_symbols(dicts[0], dicts[1], &diff))
                st = luna_error(
                    LUNA_ERR_MISMATCH,
                    "%s:%d: differs from --srcdict %s, but --joined-dictionary needs "
                    "one dictionary (give the same file twice, or drop --joined-dictionary)",
                    opt.tgtdict, diff - LUNA_DICT_NSPECIAL + 1, opt.srcdict);
        } else {
            st = build_dict(&tok, opt.srcdict, (const int[]){0}, 1, opt.thresholdsrc, opt.nwordssrc,
                            &dicts[0]);
            if (st == LUNA_OK)
                st = build_dict(&tok, opt.tgtdict, (const int[]){1}, 1, opt.thresholdtgt,
                                opt.nwordstgt, &dicts[1]);
        }
        if (st == LUNA_OK && opt.joined)
            printf(PROG ": joined dictionary: %d symbols in %.1f s\n",
                   luna_dictionary_size(dicts[0]), now_seconds() - t0);
        else if (st == LUNA_OK)
            printf(PROG ": dictionaries: %d symbols (%s), %d symbols (%s) in %.1f s\n",
                   luna_dictionary_size(dicts[0]), opt.source_lang, luna_dictionary_size(dicts[1]),
                   opt.target_lang, now_seconds() - t0);
    }
    for (int side = 0; side < 2 && st == LUNA_OK; side++) {
        const luna_dictionary *d = dicts[opt.joined ? 0 : side];
        char *name = str_printf("dict.%s.txt", langs[side]);
        char *path = name ? luna_path_join(dir, name) : NULL;
        st = path ? check_existing_dict(d, langs[side])
                  : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        if (st == LUNA_OK) st = luna_dictionary_save(d, path);
        free(name);
        free(path);
    }
    for (int i = 0; i < num_splits && st == LUNA_OK; i++) {
        if (opt.document_window > 0) {
            st = binarize_windows(&tok, dir, &splits[i], dicts, langs);
            continue;
        }
        for (int side = 0; side < 2 && st == LUNA_OK; side++)
            st = binarize_side(&tok, dir, &splits[i], splits[i].name, side,
                               dicts[opt.joined ? 0 : side], langs[side]);
    }
    luna_spm_free(spm);
    luna_dictionary_free(dicts[0]);
    luna_dictionary_free(dicts[1]);
    if (st != LUNA_OK) {
        luna_staged_dir_free(stage); /* --destdir untouched */
        return st;
    }
    st = luna_staged_dir_commit(stage);
    if (st == LUNA_OK) printf(PROG ": wrote %s\n", opt.destdir);
    return st;
}

int main(int argc, char **argv) {
    int rc = parse_args(argc, argv);
    if (rc >= 0) return rc;
    luna_status st = run();
    for (int i = 0; i < num_splits; i++) {
        for (int side = 0; side < 2; side++) {
            luna_text_lines_free(splits[i].text[side]);
            free(splits[i].path[side]);
        }
        free(splits[i].skip);
    }
    if (st != LUNA_OK) {
        fflush(stdout);
        fprintf(stderr, PROG ": %s\n", luna_error_message());
        return 1;
    }
    return 0;
}
