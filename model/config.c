#include "model/config.h"

#include <stdio.h>
#include <string.h>

static luna_config base(luna_arch arch) {
    luna_config c = {
        .arch = arch,
        .vocab_size = 0,
        .padding_idx = 1,
        .encoder_embed_dim = 512,
        .encoder_ffn_embed_dim = 2048,
        .encoder_layers = 6,
        .encoder_attention_heads = 8,
        .decoder_embed_dim = 512,
        .decoder_ffn_embed_dim = 2048,
        .decoder_layers = 6,
        .decoder_attention_heads = 8,
        .projection_length = arch == LUNA_ARCH_LUNA ? 32 : 0,
        .untie_luna_kv = false,
        .fix_projection_length = false,
        .share_all_embeddings = true,
        .share_decoder_input_output_embed = true,
        .non_contextual_projection = false,
        .linformer_k = 0,
        .max_source_positions = 0,
        .linformer_sharing = LUNA_LINFORMER_HEADWISE,
        .causal_activation = LUNA_CAUSAL_SOFTPLUS,
        .dropout = 0.1,
        .attention_dropout = 0.0,
        .activation_dropout = 0.0,
        .label_smoothing = 0.1,
    };
    return c;
}

static void make_tiny(luna_config *c) {
    c->encoder_embed_dim = c->decoder_embed_dim = 32;
    c->encoder_ffn_embed_dim = c->decoder_ffn_embed_dim = 64;
    c->encoder_layers = c->decoder_layers = 2;
    c->encoder_attention_heads = c->decoder_attention_heads = 4;
    if (c->arch == LUNA_ARCH_LUNA) c->projection_length = 8;
}

/* luna_demo: sized for the 2-core CPU demo (tools/demo.sh, Multi30k): d 256, FFN 1024, 3+3 layers,
 * 4 heads, l 16, tied kv, softplus; about 8.1M parameters with an 8k joint vocabulary. */
static void make_demo(luna_config *c) {
    c->encoder_embed_dim = c->decoder_embed_dim = 256;
    c->encoder_ffn_embed_dim = c->decoder_ffn_embed_dim = 1024;
    c->encoder_layers = c->decoder_layers = 3;
    c->encoder_attention_heads = c->decoder_attention_heads = 4;
    c->projection_length = 16;
}

static const char *const preset_names[] = {"luna_base_tied", "luna_base_untied", "transformer_base",
                                           "luna_tiny",      "transformer_tiny", "luna_demo",
                                           "linformer_tiny", "linformer_base",   NULL};

const char *const *luna_config_preset_names(void) { return preset_names; }

luna_status luna_config_preset(luna_config *out, const char *name) {
    if (strcmp(name, "luna_base_tied") == 0 || strcmp(name, "luna_base") == 0) {
        *out = base(LUNA_ARCH_LUNA);
    } else if (strcmp(name, "luna_base_untied") == 0) {
        *out = base(LUNA_ARCH_LUNA);
        out->untie_luna_kv = true;
    } else if (strcmp(name, "transformer_base") == 0) {
        *out = base(LUNA_ARCH_TRANSFORMER);
    } else if (strcmp(name, "luna_tiny") == 0) {
        *out = base(LUNA_ARCH_LUNA);
        make_tiny(out);
    } else if (strcmp(name, "transformer_tiny") == 0) {
        *out = base(LUNA_ARCH_TRANSFORMER);
        make_tiny(out);
    } else if (strcmp(name, "luna_demo") == 0) {
        *out = base(LUNA_ARCH_LUNA);
        make_demo(out);
    } else if (strcmp(name, "linformer_tiny") == 0) {
        *out = base(LUNA_ARCH_TRANSFORMER);
        make_tiny(out);
        out->linformer_k = 8;
        out->max_source_positions = 64;
    } else if (strcmp(name, "linformer_base") == 0) {
        *out = base(LUNA_ARCH_TRANSFORMER);
        out->linformer_k = 256;
        out->max_source_positions = 1024;
    } else {
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "unknown architecture '%s' (known: luna_base_tied, luna_base_untied, "
                          "transformer_base, luna_tiny, transformer_tiny, luna_demo, "
                          "linformer_tiny, linformer_base)",
                          name);
    }
    return LUNA_OK;
}

static luna_status check_positive(const char *what, int v) {
    if (v <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "config: %s = %d must be > 0", what, v);
    return LUNA_OK;
}

static luna_status check_probability(const char *what, double p) {
    if (!(p >= 0.0 && p < 1.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "config: %s = %g must be in [0, 1)", what, p);
    return LUNA_OK;
}

luna_status luna_config_validate(const luna_config *c) {
    if (c->arch != LUNA_ARCH_LUNA && c->arch != LUNA_ARCH_TRANSFORMER)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "config: invalid arch %d", (int)c->arch);
    if (c->vocab_size <= 4)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: vocab_size = %d (must be set from the dictionary, > 4)",
                          c->vocab_size);
    if (c->padding_idx < 0 || c->padding_idx >= c->vocab_size)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "config: padding_idx = %d out of [0, %d)",
                          c->padding_idx, c->vocab_size);
    LUNA_TRY(check_positive("encoder_embed_dim", c->encoder_embed_dim));
    LUNA_TRY(check_positive("encoder_ffn_embed_dim", c->encoder_ffn_embed_dim));
    LUNA_TRY(check_positive("encoder_layers", c->encoder_layers));
    LUNA_TRY(check_positive("encoder_attention_heads", c->encoder_attention_heads));
    LUNA_TRY(check_positive("decoder_embed_dim", c->decoder_embed_dim));
    LUNA_TRY(check_positive("decoder_ffn_embed_dim", c->decoder_ffn_embed_dim));
    LUNA_TRY(check_positive("decoder_layers", c->decoder_layers));
    LUNA_TRY(check_positive("decoder_attention_heads", c->decoder_attention_heads));
    if (c->encoder_embed_dim != c->decoder_embed_dim)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: shared embeddings need encoder_embed_dim (%d) == "
                          "decoder_embed_dim (%d)",
                          c->encoder_embed_dim, c->decoder_embed_dim);
    if (c->encoder_embed_dim % c->encoder_attention_heads != 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: encoder_embed_dim %d is not divisible by "
                          "encoder_attention_heads %d",
                          c->encoder_embed_dim, c->encoder_attention_heads);
    if (c->decoder_embed_dim % c->decoder_attention_heads != 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: decoder_embed_dim %d is not divisible by "
                          "decoder_attention_heads %d",
                          c->decoder_embed_dim, c->decoder_attention_heads);
    if (c->encoder_embed_dim < 4)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: embed_dim %d too small for sinusoidal positions (>= 4)",
                          c->encoder_embed_dim);
    if (c->arch == LUNA_ARCH_LUNA)
        LUNA_TRY(check_positive("projection_length", c->projection_length));
    if (c->non_contextual_projection && c->arch != LUNA_ARCH_LUNA)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: non_contextual_projection applies to Luna architectures only");
    if (c->linformer_k < 0 || (c->linformer_k > 0 && c->arch != LUNA_ARCH_TRANSFORMER))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: linformer_k = %d (Linformer is an option of the transformer "
                          "architecture, k >= 0)",
                          c->linformer_k);
    if (c->linformer_k > 0 && c->max_source_positions <= 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: Linformer needs max_source_positions > 0 (got %d)",
                          c->max_source_positions);
    if ((unsigned)c->linformer_sharing > LUNA_LINFORMER_LAYERWISE)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "config: invalid linformer_sharing %d",
                          (int)c->linformer_sharing);
    if (c->causal_activation != LUNA_CAUSAL_SOFTPLUS && c->causal_activation != LUNA_CAUSAL_ELU)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "config: invalid causal_activation %d",
                          (int)c->causal_activation);
    LUNA_TRY(check_probability("dropout", c->dropout));
    LUNA_TRY(check_probability("attention_dropout", c->attention_dropout));
    LUNA_TRY(check_probability("activation_dropout", c->activation_dropout));
    if (!(c->label_smoothing >= 0.0 && c->label_smoothing <= 1.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "config: label_smoothing = %g must be in [0, 1]", c->label_smoothing);
    return LUNA_OK;
}

luna_status luna_config_to_json(const luna_config *c, char **json) {
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "arch");
    luna_json_string(&w, c->arch == LUNA_ARCH_LUNA ? "luna" : "transformer");
#define INT_KEY(field)                                                                             \
    luna_json_key(&w, #field);                                                                     \
    luna_json_int(&w, c->field)
    INT_KEY(vocab_size);
    INT_KEY(padding_idx);
    INT_KEY(encoder_embed_dim);
    INT_KEY(encoder_ffn_embed_dim);
    INT_KEY(encoder_layers);
    INT_KEY(encoder_attention_heads);
    INT_KEY(decoder_embed_dim);
    INT_KEY(decoder_ffn_embed_dim);
    INT_KEY(decoder_layers);
    INT_KEY(decoder_attention_heads);
    INT_KEY(projection_length);
#undef INT_KEY
    luna_json_key(&w, "untie_luna_kv");
    luna_json_bool(&w, c->untie_luna_kv);
    luna_json_key(&w, "causal_activation");
    luna_json_string(&w, c->causal_activation == LUNA_CAUSAL_ELU ? "elu" : "softplus");
    luna_json_key(&w, "fix_projection_length");
    luna_json_bool(&w, c->fix_projection_length);
    if (!c->share_all_embeddings) {
        luna_json_key(&w, "share_all_embeddings");
        luna_json_bool(&w, false);
        luna_json_key(&w, "share_decoder_input_output_embed");
        luna_json_bool(&w, c->share_decoder_input_output_embed);
    }
    /* Written only when set, so checkpoints of the default model keep their exact metadata. */
    if (c->non_contextual_projection) {
        luna_json_key(&w, "non_contextual_projection");
        luna_json_bool(&w, true);
    }
    if (c->linformer_k > 0) {
        luna_json_key(&w, "linformer_k");
        luna_json_int(&w, c->linformer_k);
        luna_json_key(&w, "max_source_positions");
        luna_json_int(&w, c->max_source_positions);
        luna_json_key(&w, "linformer_sharing");
        luna_json_string(&w, luna_linformer_sharing_name(c->linformer_sharing));
    }
    luna_json_key(&w, "label_smoothing");
    luna_json_double(&w, c->label_smoothing);
    luna_json_key(&w, "dropout");
    luna_json_double(&w, c->dropout);
    luna_json_key(&w, "attention_dropout");
    luna_json_double(&w, c->attention_dropout);
    luna_json_key(&w, "activation_dropout");
    luna_json_double(&w, c->activation_dropout);
    luna_json_end_object(&w);
    return luna_json_writer_finish(&w, json, NULL);
}

static luna_status get_int(const luna_json *obj, const char *key, int *out) {
    const luna_json *v = luna_json_get(obj, key);
    if (!v) return LUNA_OK;
    if (v->type != LUNA_JSON_NUMBER || !v->is_int || v->int_value < -2147483647 ||
        v->int_value > 2147483647)
        return luna_error(LUNA_ERR_FORMAT, "config: '%s' must be an integer (byte %zu)", key,
                          v->offset);
    *out = (int)v->int_value;
    return LUNA_OK;
}

static luna_status get_double(const luna_json *obj, const char *key, double *out) {
    const luna_json *v = luna_json_get(obj, key);
    if (!v) return LUNA_OK;
    if (v->type != LUNA_JSON_NUMBER)
        return luna_error(LUNA_ERR_FORMAT, "config: '%s' must be a number (byte %zu)", key,
                          v->offset);
    *out = v->number;
    return LUNA_OK;
}

static luna_status get_bool(const luna_json *obj, const char *key, bool *out) {
    const luna_json *v = luna_json_get(obj, key);
    if (!v) return LUNA_OK;
    if (v->type != LUNA_JSON_BOOL)
        return luna_error(LUNA_ERR_FORMAT, "config: '%s' must be true or false (byte %zu)", key,
                          v->offset);
    *out = v->boolean;
    return LUNA_OK;
}

luna_status luna_config_from_json_value(luna_config *out, const luna_json *obj) {
    if (!obj || obj->type != LUNA_JSON_OBJECT)
        return luna_error(LUNA_ERR_FORMAT, "config: expected a JSON object");
    luna_config c = base(LUNA_ARCH_LUNA);
    const luna_json *arch = luna_json_get(obj, "arch");
    if (arch) {
        if (arch->type == LUNA_JSON_STRING && strcmp(arch->string, "luna") == 0) {
            c.arch = LUNA_ARCH_LUNA;
        } else if (arch->type == LUNA_JSON_STRING && strcmp(arch->string, "transformer") == 0) {
            c.arch = LUNA_ARCH_TRANSFORMER;
            c.projection_length = 0;
        } else {
            return luna_error(LUNA_ERR_FORMAT,
                              "config: 'arch' must be \"luna\" or \"transformer\" (byte %zu)",
                              arch->offset);
        }
    }
    LUNA_TRY(get_int(obj, "vocab_size", &c.vocab_size));
    LUNA_TRY(get_int(obj, "padding_idx", &c.padding_idx));
    LUNA_TRY(get_int(obj, "encoder_embed_dim", &c.encoder_embed_dim));
    LUNA_TRY(get_int(obj, "encoder_ffn_embed_dim", &c.encoder_ffn_embed_dim));
    LUNA_TRY(get_int(obj, "encoder_layers", &c.encoder_layers));
    LUNA_TRY(get_int(obj, "encoder_attention_heads", &c.encoder_attention_heads));
    LUNA_TRY(get_int(obj, "decoder_embed_dim", &c.decoder_embed_dim));
    LUNA_TRY(get_int(obj, "decoder_ffn_embed_dim", &c.decoder_ffn_embed_dim));
    LUNA_TRY(get_int(obj, "decoder_layers", &c.decoder_layers));
    LUNA_TRY(get_int(obj, "decoder_attention_heads", &c.decoder_attention_heads));
    LUNA_TRY(get_int(obj, "projection_length", &c.projection_length));
    LUNA_TRY(get_bool(obj, "untie_luna_kv", &c.untie_luna_kv));
    LUNA_TRY(get_bool(obj, "fix_projection_length", &c.fix_projection_length));
    LUNA_TRY(get_bool(obj, "share_all_embeddings", &c.share_all_embeddings));
    LUNA_TRY(
        get_bool(obj, "share_decoder_input_output_embed", &c.share_decoder_input_output_embed));
    if (c.share_all_embeddings) c.share_decoder_input_output_embed = true;
    LUNA_TRY(get_bool(obj, "non_contextual_projection", &c.non_contextual_projection));
    LUNA_TRY(get_int(obj, "linformer_k", &c.linformer_k));
    LUNA_TRY(get_int(obj, "max_source_positions", &c.max_source_positions));
    const luna_json *sharing = luna_json_get(obj, "linformer_sharing");
    if (sharing && (sharing->type != LUNA_JSON_STRING ||
                    luna_linformer_sharing_parse(sharing->string, &c.linformer_sharing) != LUNA_OK))
        return luna_error(LUNA_ERR_FORMAT,
                          "config: 'linformer_sharing' must be \"headwise\", \"kv\" or "
                          "\"layerwise\" (byte %zu)",
                          sharing->offset);
    const luna_json *act = luna_json_get(obj, "causal_activation");
    if (act) {
        if (act->type == LUNA_JSON_STRING && strcmp(act->string, "softplus") == 0)
            c.causal_activation = LUNA_CAUSAL_SOFTPLUS;
        else if (act->type == LUNA_JSON_STRING && strcmp(act->string, "elu") == 0)
            c.causal_activation = LUNA_CAUSAL_ELU;
        else
            return luna_error(LUNA_ERR_FORMAT,
                              "config: 'causal_activation' must be \"softplus\" or \"elu\" "
                              "(byte %zu)",
                              act->offset);
    }
    LUNA_TRY(get_double(obj, "label_smoothing", &c.label_smoothing));
    LUNA_TRY(get_double(obj, "dropout", &c.dropout));
    LUNA_TRY(get_double(obj, "attention_dropout", &c.attention_dropout));
    LUNA_TRY(get_double(obj, "activation_dropout", &c.activation_dropout));
    LUNA_TRY(luna_config_validate(&c));
    *out = c;
    return LUNA_OK;
}

luna_status luna_config_from_json(luna_config *out, const char *json, size_t len) {
    luna_json *root;
    LUNA_TRY(luna_json_parse(&root, json, len, NULL));
    luna_status st = luna_config_from_json_value(out, root);
    luna_json_free(root);
    return st;
}

const char *luna_linformer_sharing_name(luna_linformer_sharing s) {
    return s == LUNA_LINFORMER_KV ? "kv" : s == LUNA_LINFORMER_LAYERWISE ? "layerwise" : "headwise";
}

luna_status luna_linformer_sharing_parse(const char *name, luna_linformer_sharing *out) {
    for (int s = LUNA_LINFORMER_HEADWISE; s <= LUNA_LINFORMER_LAYERWISE; s++)
        if (strcmp(name, luna_linformer_sharing_name((luna_linformer_sharing)s)) == 0) {
            *out = (luna_linformer_sharing)s;
            return LUNA_OK;
        }
    return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                      "unknown Linformer sharing '%s' (headwise, kv, layerwise)", name);
}

void luna_config_describe(const luna_config *c, char *buf, size_t size) {
    if (c->arch == LUNA_ARCH_LUNA) {
        snprintf(buf, size,
                 "arch=luna d=%d ffn=%d/%d layers=%d+%d heads=%d+%d l=%d%s%s kv=%s phi=%s V=%d "
                 "dropout=%g attention_dropout=%g activation_dropout=%g label_smoothing=%g",
                 c->encoder_embed_dim, c->encoder_ffn_embed_dim, c->decoder_ffn_embed_dim,
                 c->encoder_layers, c->decoder_layers, c->encoder_attention_heads,
                 c->decoder_attention_heads, c->projection_length,
                 c->fix_projection_length ? " (fixed)" : "",
                 c->non_contextual_projection ? " P=non-contextual" : "",
                 c->untie_luna_kv ? "untied" : "tied",
                 c->causal_activation == LUNA_CAUSAL_ELU ? "elu" : "softplus", c->vocab_size,
                 c->dropout, c->attention_dropout, c->activation_dropout, c->label_smoothing);
    } else {
        char lin[96] = "";
        if (c->linformer_k > 0)
            snprintf(lin, sizeof lin, " encoder=linformer(k=%d max=%d %s)", c->linformer_k,
                     c->max_source_positions, luna_linformer_sharing_name(c->linformer_sharing));
        snprintf(buf, size,
                 "arch=transformer%s d=%d ffn=%d/%d layers=%d+%d heads=%d+%d V=%d dropout=%g "
                 "attention_dropout=%g activation_dropout=%g label_smoothing=%g",
                 lin, c->encoder_embed_dim, c->encoder_ffn_embed_dim, c->decoder_ffn_embed_dim,
                 c->encoder_layers, c->decoder_layers, c->encoder_attention_heads,
                 c->decoder_attention_heads, c->vocab_size, c->dropout, c->attention_dropout,
                 c->activation_dropout, c->label_smoothing);
    }
    size_t used = strlen(buf);
    if (!c->share_all_embeddings && used < size)
        snprintf(buf + used, size - used, " embeddings=%s",
                 c->share_decoder_input_output_embed ? "encoder+decoder" : "untied");
}

const char *luna_config_architecture_difference(const luna_config *a, const luna_config *b,
                                                char *a_value, char *b_value, size_t size) {
    if (a->arch != b->arch) {
        snprintf(a_value, size, "%s", a->arch == LUNA_ARCH_LUNA ? "luna" : "transformer");
        snprintf(b_value, size, "%s", b->arch == LUNA_ARCH_LUNA ? "luna" : "transformer");
        return "arch";
    }
    if (a->causal_activation != b->causal_activation) {
        snprintf(a_value, size, "%s", a->causal_activation == LUNA_CAUSAL_ELU ? "elu" : "softplus");
        snprintf(b_value, size, "%s", b->causal_activation == LUNA_CAUSAL_ELU ? "elu" : "softplus");
        return "causal_activation";
    }
    const struct {
        const char *name;
        long long a, b;
    } f[] = {
        {"vocab_size", a->vocab_size, b->vocab_size},
        {"padding_idx", a->padding_idx, b->padding_idx},
        {"encoder_embed_dim", a->encoder_embed_dim, b->encoder_embed_dim},
        {"decoder_embed_dim", a->decoder_embed_dim, b->decoder_embed_dim},
        {"encoder_ffn_embed_dim", a->encoder_ffn_embed_dim, b->encoder_ffn_embed_dim},
        {"decoder_ffn_embed_dim", a->decoder_ffn_embed_dim, b->decoder_ffn_embed_dim},
        {"encoder_layers", a->encoder_layers, b->encoder_layers},
        {"decoder_layers", a->decoder_layers, b->decoder_layers},
        {"encoder_attention_heads", a->encoder_attention_heads, b->encoder_attention_heads},
        {"decoder_attention_heads", a->decoder_attention_heads, b->decoder_attention_heads},
        {"projection_length", a->projection_length, b->projection_length},
        {"untie_luna_kv", a->untie_luna_kv, b->untie_luna_kv},
        {"fix_projection_length", a->fix_projection_length, b->fix_projection_length},
        {"share_all_embeddings", a->share_all_embeddings, b->share_all_embeddings},
        {"share_decoder_input_output_embed", a->share_decoder_input_output_embed,
         b->share_decoder_input_output_embed},
        {"non_contextual_projection", a->non_contextual_projection, b->non_contextual_projection},
        {"linformer_k", a->linformer_k, b->linformer_k},
        {"max_source_positions", a->max_source_positions, b->max_source_positions},
        {"linformer_sharing", a->linformer_sharing, b->linformer_sharing},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].a != f[i].b) {
            snprintf(a_value, size, "%lld", f[i].a);
            snprintf(b_value, size, "%lld", f[i].b);
            return f[i].name;
        }
    return NULL;
}
