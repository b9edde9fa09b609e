/* Checkpoint files (see checkpoint.h for the format). */
#include "model/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base64.h"
#include "model/quantize.h"
#include "model/seq2seq.h"

luna_status luna_checkpoint_save(const char *path, const luna_params *params,
                                 const luna_checkpoint_contents *c) {
    if (!c || !c->src_dict_text || !c->tgt_dict_text || !c->source_lang || !c->target_lang)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "%s: checkpoint needs both dictionaries and languages", path);
    float *host = malloc(params->num_params * sizeof(float));
    luna_st_tensor *params_list = NULL, *list = NULL;
    void *storage = NULL;
    int np = 0;
    char *config_json = NULL, *spm_b64 = NULL;
    luna_status s = LUNA_OK;
    if (!host) s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of host memory for saving", path);
    if (s == LUNA_OK) s = luna_config_to_json(&params->config, &config_json);
    if (s == LUNA_OK)
        s = luna_base64_encode(c->spm_model, c->spm_model ? c->spm_model_size : 0, &spm_b64, NULL);
    if (s == LUNA_OK)
        s = luna_mem_to_host(params->be, host, params->data, params->num_params * sizeof(float));
    /* an int8 model's int8 tensors and their scales (model/quantize.h) */
    if (s == LUNA_OK) s = luna_params_save_list(params, host, &params_list, &np, &storage);
    const int nt = np + c->num_extra_tensors;
    if (s == LUNA_OK && !(list = calloc((size_t)nt, sizeof *list)))
        s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of host memory for saving", path);
    if (s == LUNA_OK) {
        memcpy(list, params_list, sizeof *list * (size_t)np);
        for (int i = 0; i < c->num_extra_tensors; i++)
            list[np + i] = c->extra_tensors[i];
        const luna_st_metadata meta[] = {
            {"format", LUNA_CHECKPOINT_FORMAT},
            {"config", config_json},
            {LUNA_LAYERNORM_KEY, "gamma"},
            {"src_dict", c->src_dict_text},
            {"tgt_dict", c->tgt_dict_text},
            {"spm_model", spm_b64},
            {"source_lang", c->source_lang},
            {"target_lang", c->target_lang},
            {"training_state", c->training_state ? c->training_state : ""},
            {LUNA_QUANTIZATION_KEY, "int8"}, /* written for an int8 model only */
        };
        const int nmeta =
            (int)(sizeof meta / sizeof meta[0]) - (params->weight_dtype == LUNA_I8 ? 0 : 1);
        s = luna_safetensors_write(path, list, nt, meta, nmeta);
    }
    free(spm_b64);
    free(config_json);
    free(list);
    free(params_list);
    free(storage);
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
        /* The message is formatted before closing: `format` points into the file's header. */
        luna_status s =
            luna_error(LUNA_ERR_FORMAT,
                       "%s: __metadata__.format is %s%s%s, expected \"" LUNA_CHECKPOINT_FORMAT
                       "\" (not a luna checkpoint; a fairseq .pt converts with "
                       "tools/scripts/convert-checkpoint.py)",
                       path, format ? "\"" : "", format ? format : "missing", format ? "\"" : "");
        luna_safetensors_close(st);
        return s;
    }
    luna_dtype weights;
    luna_status bad = luna_checkpoint_weight_dtype(st, &weights); /* an unknown quantization */
    if (bad != LUNA_OK) {
        luna_safetensors_close(st);
        return bad;
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

/* Entries of a dictionary's text in the metadata (its non-empty lines; data/ parses it fully). */
static int dict_entries(const char *text) {
    int n = 0;
    for (const char *p = text; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0) n++;
        p = end ? end + 1 : p + len;
    }
    return n;
}

/* A configuration whose vocab_size disagrees with the embedding table is refused before the
 * tensors are checked one by one, so the message names the disagreement rather than a shape. */
static luna_status check_vocab_size(const luna_safetensors *st, const luna_config *c) {
    const luna_st_tensor *t = luna_safetensors_find(st, "encoder.embed_tokens.weight");
    if (!t || t->ndim != 2 || t->shape[0] == c->vocab_size) return LUNA_OK;
    const char *dict = luna_safetensors_metadata(st, "tgt_dict");
    return luna_error(LUNA_ERR_MISMATCH,
                      "%s: __metadata__.config says vocab_size %d, but the embedding table has "
                      "%lld rows and __metadata__.tgt_dict %d entries (+ 4 specials): the "
                      "configuration disagrees with the dictionary",
                      luna_safetensors_path(st), c->vocab_size, (long long)t->shape[0],
                      dict_entries(dict));
}

luna_status luna_checkpoint_load_model(const char *path, luna_backend *be, luna_seq2seq **model,
                                       luna_checkpoint_meta *meta) {
    *model = NULL;
    if (meta) memset(meta, 0, sizeof *meta);
    luna_safetensors *st;
    LUNA_TRY(luna_checkpoint_open(&st, path));
    luna_checkpoint_meta m;
    luna_seq2seq *mdl = NULL;
    luna_status s = luna_checkpoint_read_meta(st, &m);
    if (s == LUNA_OK) s = check_vocab_size(st, &m.config);
    if (s != LUNA_OK) {
        luna_safetensors_close(st);
        luna_checkpoint_meta_release(&m);
        return s;
    }
    s = luna_seq2seq_create_for_inference(&mdl, be, &m.config);
    if (s != LUNA_OK) /* e.g. out of memory for an absurd configuration: say whose it is */
        luna_error_prefix("%s: building the model of its __metadata__.config", path);
    if (s == LUNA_OK) s = luna_params_load(mdl->params, st);
    luna_safetensors_close(st);
    if (s != LUNA_OK) {
        luna_seq2seq_free(mdl);
        luna_checkpoint_meta_release(&m);
        return s;
    }
    *model = mdl;
    if (meta)
        *meta = m;
    else
        luna_checkpoint_meta_release(&m);
    return LUNA_OK;
}
