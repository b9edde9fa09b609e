/* Checkpoint files (see checkpoint.h for the format). */
#include "trainer/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/base64.h"
#include "model/seq2seq.h"

luna_status luna_checkpoint_save(const char *path, const luna_params *params,
                                 const luna_checkpoint_contents *c) {
    if (!c || !c->src_dict || !c->tgt_dict || !c->source_lang || !c->target_lang)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "%s: checkpoint needs both dictionaries and languages", path);
    int nt = params->num_tensors + c->num_extra_tensors;
    float *host = malloc(params->num_params * sizeof(float));
    luna_st_tensor *list = calloc((size_t)nt, sizeof *list);
    char *config_json = NULL, *src_text = NULL, *tgt_text = NULL, *spm_b64 = NULL;
    size_t len;
    luna_status s = LUNA_OK;
    if (!host || !list)
        s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of host memory for saving", path);
    if (s == LUNA_OK) s = luna_config_to_json(&params->config, &config_json);
    if (s == LUNA_OK) s = luna_dictionary_to_text(c->src_dict, &src_text, &len);
    if (s == LUNA_OK) s = luna_dictionary_to_text(c->tgt_dict, &tgt_text, &len);
    if (s == LUNA_OK)
        s = luna_base64_encode(c->spm_model, c->spm_model ? c->spm_model_size : 0, &spm_b64, NULL);
    if (s == LUNA_OK) {
        params->be->copy_to_host(host, params->data, params->num_params * sizeof(float));
        for (int i = 0; i < params->num_tensors; i++) {
            const luna_param_info *t = &params->tensors[i];
            list[i] = (luna_st_tensor){.name = t->name,
                                       .dtype = LUNA_F32,
                                       .ndim = t->ndim,
                                       .shape = {t->shape[0], t->shape[1]},
                                       .data = host + t->offset,
                                       .nbytes = t->numel * sizeof(float)};
        }
        for (int i = 0; i < c->num_extra_tensors; i++)
            list[params->num_tensors + i] = c->extra_tensors[i];
        const luna_st_metadata meta[] = {
            {"format", LUNA_CHECKPOINT_FORMAT},
            {"config", config_json},
            {"src_dict", src_text},
            {"tgt_dict", tgt_text},
            {"spm_model", spm_b64},
            {"source_lang", c->source_lang},
            {"target_lang", c->target_lang},
            {"training_state", c->training_state ? c->training_state : ""},
        };
        s = luna_safetensors_write(path, list, nt, meta, (int)(sizeof meta / sizeof meta[0]));
    }
    free(spm_b64);
    free(tgt_text);
    free(src_text);
    free(config_json);
    free(list);
    free(host);
    return s;
}

void luna_checkpoint_meta_release(luna_checkpoint_meta *meta) {
    if (!meta) return;
    free(meta->source_lang);
    free(meta->target_lang);
    free(meta->training_state);
    memset(meta, 0, sizeof *meta);
}

static const char *const REQUIRED_KEYS[] = {"config",    "src_dict",    "tgt_dict",
                                            "spm_model", "source_lang", "target_lang"};

luna_status luna_checkpoint_open(luna_safetensors **out, const char *path) {
    *out = NULL;
    luna_safetensors *st;
    LUNA_TRY(luna_safetensors_open(&st, path));
    const char *format = luna_safetensors_metadata(st, "format");
    if (!format || strcmp(format, LUNA_CHECKPOINT_FORMAT) != 0) {
        luna_safetensors_close(st);
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: __metadata__.format is %s%s%s, expected \"" LUNA_CHECKPOINT_FORMAT
                          "\" (not a luna checkpoint; convert it first)",
                          path, format ? "\"" : "", format ? format : "missing",
                          format ? "\"" : "");
    }
    for (size_t i = 0; i < sizeof REQUIRED_KEYS / sizeof REQUIRED_KEYS[0]; i++)
        if (!luna_safetensors_metadata(st, REQUIRED_KEYS[i])) {
            luna_safetensors_close(st);
            return luna_error(LUNA_ERR_FORMAT,
                              "%s: __metadata__ has no \"%s\": the checkpoint lacks its "
                              "vocabulary or configuration (damaged, or written by another "
                              "tool; use one written by luna-train or luna-average)",
                              path, REQUIRED_KEYS[i]);
        }
    *out = st;
    return LUNA_OK;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

luna_status luna_checkpoint_read_meta(const luna_safetensors *st, luna_checkpoint_meta *meta) {
    memset(meta, 0, sizeof *meta);
    LUNA_TRY(luna_config_from_safetensors(&meta->config, st));
    const char *ts = luna_safetensors_metadata(st, "training_state");
    meta->source_lang = dup_or_null(luna_safetensors_metadata(st, "source_lang"));
    meta->target_lang = dup_or_null(luna_safetensors_metadata(st, "target_lang"));
    meta->training_state = ts && *ts ? strdup(ts) : NULL;
    if (!meta->source_lang || !meta->target_lang || (ts && *ts && !meta->training_state)) {
        luna_checkpoint_meta_release(meta);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory reading metadata",
                          luna_safetensors_path(st));
    }
    return LUNA_OK;
}

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
                          "%s has %d symbols but the model's vocab_size is %d (damaged checkpoint)",
                          name, (int)size, vocab);
    }
    return LUNA_OK;
}

luna_status luna_checkpoint_read_dicts(const luna_safetensors *st, luna_dictionary **src_dict,
                                       luna_dictionary **tgt_dict) {
    luna_config config;
    LUNA_TRY(luna_config_from_safetensors(&config, st));
    luna_dictionary *src = NULL, *tgt = NULL;
    /* Embeddings are shared (one table): both dictionaries must fit the vocabulary. */
    luna_status s = read_dict(st, "src_dict", config.vocab_size, &src);
    if (s == LUNA_OK) s = read_dict(st, "tgt_dict", config.vocab_size, &tgt);
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

luna_status luna_checkpoint_load_model(const char *path, luna_backend *be, luna_seq2seq **model,
                                       luna_dictionary **src_dict, luna_dictionary **tgt_dict,
                                       luna_spm **spm, luna_checkpoint_meta *meta) {
    *model = NULL;
    if (src_dict) *src_dict = NULL;
    if (tgt_dict) *tgt_dict = NULL;
    if (spm) *spm = NULL;
    if (meta) memset(meta, 0, sizeof *meta);
    luna_safetensors *st;
    LUNA_TRY(luna_checkpoint_open(&st, path));
    luna_checkpoint_meta m;
    luna_seq2seq *mdl = NULL;
    luna_dictionary *src = NULL, *tgt = NULL;
    luna_spm *sp = NULL;
    luna_status s = luna_checkpoint_read_meta(st, &m);
    if (s != LUNA_OK) {
        luna_safetensors_close(st);
        return s;
    }
    s = luna_checkpoint_read_dicts(st, &src, &tgt);
    if (s == LUNA_OK && spm) s = luna_checkpoint_read_spm(st, &sp);
    if (s == LUNA_OK) s = luna_seq2seq_create(&mdl, be, &m.config);
    if (s == LUNA_OK) s = luna_params_load(mdl->params, st);
    luna_safetensors_close(st);
    if (s != LUNA_OK) {
        luna_seq2seq_free(mdl);
        luna_dictionary_free(src);
        luna_dictionary_free(tgt);
        luna_spm_free(sp);
        luna_checkpoint_meta_release(&m);
        return s;
    }
    *model = mdl;
    if (src_dict)
        *src_dict = src;
    else
        luna_dictionary_free(src);
    if (tgt_dict)
        *tgt_dict = tgt;
    else
        luna_dictionary_free(tgt);
    if (spm) *spm = sp;
    if (meta)
        *meta = m;
    else
        luna_checkpoint_meta_release(&m);
    return LUNA_OK;
}
