/* The vocabulary stored in a checkpoint (see checkpoint_vocab.h). */
#include "data/checkpoint_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base64.h"

static luna_status read_dict(const luna_safetensors *st, const char *key, int vocab,
                             luna_dictionary **out) {
    const char *path = luna_safetensors_path(st);
    const char *text = luna_safetensors_metadata(st, key);
    char name[1100];
    snprintf(name, sizeof name, "%s: __metadata__.%s", path, key);
    if (!text) return luna_error(LUNA_ERR_FORMAT, "%s: missing", name);
    LUNA_TRY(luna_dictionary_load_from_memory(out, text, strlen(text), name));
    if (vocab > 0 && luna_dictionary_size(*out) != vocab) {
        int32_t size = luna_dictionary_size(*out);
        luna_dictionary_free(*out);
        *out = NULL;
        return luna_error(LUNA_ERR_MISMATCH,
                          "%s has %d symbols but __metadata__.config says vocab_size %d: the "
                          "configuration disagrees with the dictionary (damaged checkpoint)",
                          name, (int)size, vocab);
    }
    return LUNA_OK;
}

luna_status luna_checkpoint_read_dicts(const luna_safetensors *st, int vocab_size,
                                       luna_dictionary **src_dict, luna_dictionary **tgt_dict) {
    luna_dictionary *src = NULL, *tgt = NULL;
    /* Embeddings are shared (one table): both dictionaries must fit the vocabulary. */
    luna_status s = read_dict(st, "src_dict", vocab_size, &src);
    if (s == LUNA_OK) s = read_dict(st, "tgt_dict", vocab_size, &tgt);
    if (s != LUNA_OK || !src_dict) luna_dictionary_free(src);
    if (s != LUNA_OK || !tgt_dict) luna_dictionary_free(tgt);
    if (s != LUNA_OK) return s;
    if (src_dict) *src_dict = src;
    if (tgt_dict) *tgt_dict = tgt;
    return LUNA_OK;
}

luna_status luna_checkpoint_read_spm(const luna_safetensors *st, luna_spm **spm) {
    *spm = NULL;
    const char *path = luna_safetensors_path(st);
    const char *b64 = luna_safetensors_metadata(st, "spm_model");
    if (!b64 || !*b64) return LUNA_OK;
    char what[1100];
    snprintf(what, sizeof what, "%s: __metadata__.spm_model", path);
    unsigned char *bytes;
    size_t n;
    LUNA_TRY(luna_base64_decode(b64, strlen(b64), &bytes, &n, what));
    luna_status s = luna_spm_load_from_memory(spm, bytes, n, what);
    free(bytes);
    return s;
}

luna_status luna_checkpoint_load_vocab(const char *path, int vocab_size, luna_dictionary **src_dict,
                                       luna_dictionary **tgt_dict, luna_spm **spm) {
    if (src_dict) *src_dict = NULL;
    if (tgt_dict) *tgt_dict = NULL;
    if (spm) *spm = NULL;
    luna_safetensors *st;
    LUNA_TRY(luna_safetensors_open(&st, path));
    luna_dictionary *src = NULL, *tgt = NULL;
    luna_status s =
        luna_checkpoint_read_dicts(st, vocab_size, src_dict ? &src : NULL, tgt_dict ? &tgt : NULL);
    if (s == LUNA_OK && spm) s = luna_checkpoint_read_spm(st, spm);
    luna_safetensors_close(st);
    if (s != LUNA_OK) {
        luna_dictionary_free(src);
        luna_dictionary_free(tgt);
        return s;
    }
    if (src_dict) *src_dict = src;
    if (tgt_dict) *tgt_dict = tgt;
    return LUNA_OK;
}
