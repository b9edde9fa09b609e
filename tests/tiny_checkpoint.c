/* Tiny translation checkpoints for tests (tests/tiny_checkpoint.h). */
#include "tests/tiny_checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/checkpoint_vocab.h"
#include "data/dictionary.h"
#include "data/document.h"
#include "data/sentencepiece.h"
#include "model/checkpoint.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/seq2seq.h"

static int next_line(void *ctx, const char **line, size_t *len) {
    static const char *const lines[] = {"the cat sat on the mat", "a dog ran in the park",
                                        "the quick brown fox jumps", "over the lazy dog again"};
    int *i = ctx;
    if (*i >= 200) return 0;
    *line = lines[*i % 4];
    *len = strlen(*line);
    ++*i;
    return 1;
}

luna_status luna_test_tiny_checkpoint(const char *dir, const char *name, uint64_t seed,
                                      bool document, bool with_vocab) {
    char path[4096];
    snprintf(path, sizeof path, "%s/spm.model", dir);
    if (access(path, R_OK) != 0) {
        int counter = 0;
        luna_spm_train_options o;
        luna_spm_train_options_init(&o);
        o.next = next_line;
        o.next_ctx = &counter;
        snprintf(path, sizeof path, "%s/spm", dir);
        o.model_prefix = path;
        o.vocab_size = 30;
        o.model_type = "char";
        LUNA_TRY(luna_spm_train(&o));
        snprintf(path, sizeof path, "%s/spm.model", dir);
    }
    luna_spm *spm;
    LUNA_TRY(luna_spm_load(&spm, path));
    luna_dictionary *dict;
    LUNA_TRY(luna_dictionary_create(&dict));
    for (int32_t i = 0; i < luna_spm_vocab_size(spm); i++) {
        const char *piece = luna_spm_id_to_piece(spm, i);
        LUNA_TRY(luna_dictionary_add(dict, piece, strlen(piece), 1, false, NULL));
    }
    if (document) /* as luna-preprocess --document-window adds it */
        LUNA_TRY(luna_dictionary_add(dict, LUNA_DOC_SEPARATOR, strlen(LUNA_DOC_SEPARATOR), 1, false,
                                     NULL));
    luna_backend *be;
    LUNA_TRY(luna_backend_cpu_create(&be, 1));
    luna_config c;
    LUNA_TRY(luna_config_preset(&c, "luna_tiny"));
    c.vocab_size = luna_dictionary_size(dict);
    luna_seq2seq *m;
    LUNA_TRY(luna_seq2seq_create(&m, be, &c));
    LUNA_TRY(luna_seq2seq_init(m, seed));
    const void *bytes;
    size_t size;
    LUNA_TRY(luna_spm_serialized(spm, &bytes, &size));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (with_vocab) {
        char *text;
        size_t text_len;
        LUNA_TRY(luna_dictionary_to_text(dict, &text, &text_len));
        luna_checkpoint_contents cc = {.source_lang = "en",
                                       .target_lang = "de",
                                       .src_dict_text = text,
                                       .tgt_dict_text = text,
                                       .spm_model = bytes,
                                       .spm_model_size = size};
        LUNA_TRY(luna_checkpoint_save(path, m->params, &cc));
        free(text);
    } else {
        luna_st_metadata md[1] = {{"format", LUNA_CHECKPOINT_FORMAT}};
        LUNA_TRY(luna_params_save(m->params, path, md, 1));
    }
    luna_seq2seq_free(m);
    luna_backend_free(be);
    luna_dictionary_free(dict);
    luna_spm_free(spm);
    return LUNA_OK;
}
