/* Model configuration: every option of ../shared/spec/luna-model.md, the named presets,
 * validation and the JSON form stored in checkpoint metadata (keys as fairseq's argument names).
 *
 * Presets (spec §6 plus small test architectures):
 *   luna_base_tied    d 512, FFN 2048, 6+6 layers, 8 heads, l 32, tied kv, softplus
 *   luna_base_untied  the same with untied kv
 *   transformer_base  the softmax baseline: d 512, FFN 2048, 6+6 layers, 8 heads
 *   luna_tiny         d 32, FFN 64, 2+2 layers, 4 heads, l 8      (tests)
 *   transformer_tiny  d 32, FFN 64, 2+2 layers, 4 heads           (tests)
 *   luna_demo         d 256, FFN 1024, 3+3 layers, 4 heads, l 16  (the CPU demo, tools/demo.sh)
 *   linformer_tiny    transformer_tiny with a Linformer encoder, k 8, N 64, headwise (tests)
 *   linformer_base    transformer_base with a Linformer encoder, k 256, N 1024, headwise
 * All use ReLU FFNs, shared embeddings (encoder input, decoder input, output projection),
 * dropout 0.1, attention/activation dropout 0, label smoothing 0.1, padding_idx 1. The vocabulary
 * size comes from the dictionary (presets leave it 0; it must be set before building a model).
 */
#ifndef LUNA_CONFIG_H
#define LUNA_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "core/json.h"
#include "core/status.h"

typedef enum {
    LUNA_ARCH_LUNA = 0,    /* Luna attention everywhere (spec §2–§4) */
    LUNA_ARCH_TRANSFORMER, /* softmax multi-head attention baseline, no P */
} luna_arch;

typedef enum {
    LUNA_CAUSAL_SOFTPLUS = 0, /* φ(z) = log2(1 + 2^z), softplus with β = ln 2 (default) */
    LUNA_CAUSAL_ELU,          /* φ(z) = elu(z) + 1 */
} luna_causal_activation;

/* Linformer's sharing of the length projections E, F (Wang et al. 2020, §4). */
typedef enum {
    LUNA_LINFORMER_HEADWISE = 0, /* E, F per layer, shared by the heads */
    LUNA_LINFORMER_KV,           /* one E = F per layer */
    LUNA_LINFORMER_LAYERWISE,    /* one E = F for all layers */
} luna_linformer_sharing;

typedef struct {
    luna_arch arch;
    int vocab_size;
    int padding_idx;
    int encoder_embed_dim, encoder_ffn_embed_dim, encoder_layers, encoder_attention_heads;
    int decoder_embed_dim, decoder_ffn_embed_dim, decoder_layers, decoder_attention_heads;
    int projection_length;      /* l (Luna only) */
    bool untie_luna_kv;         /* separate k/v (and pk/pv) projections */
    bool fix_projection_length; /* always l slots, no P mask */
    /* Paper Table 5 ablation: every layer packs its own learned P (encoder layer 0: the
     * encoder's P, layer i > 0 and decoder layer j: encoder./decoder.layers.N.projected_embeddings)
     * instead of the previous layer's packed context; the P LayerNorms then get no gradient. */
    bool non_contextual_projection;
    /* Transformer only: Linformer encoder self-attention when linformer_k > 0, with E, F
     * [linformer_k, max_source_positions]; longer sources are an error naming the limit. */
    int linformer_k, max_source_positions;
    luna_linformer_sharing linformer_sharing;
    luna_causal_activation causal_activation;
    /* fairseq's --share-all-embeddings (one table [V, d] for encoder input, decoder input and
     * output projection; the default and what luna-train builds) and
     * --share-decoder-input-output-embed (when not all are shared: decoder input and output
     * projection share decoder.embed_tokens.weight). Untied tables exist for models converted
     * from fairseq; they are stored as decoder.embed_tokens.weight /
     * decoder.output_projection.weight and need the same dictionary size on both sides. */
    bool share_all_embeddings;
    bool share_decoder_input_output_embed;
    double dropout, attention_dropout, activation_dropout;
    double label_smoothing;
} luna_config;

/* Fill `out` from a preset name; LUNA_ERR_INVALID_ARGUMENT naming the known presets otherwise. */
luna_status luna_config_preset(luna_config *out, const char *name);
/* NULL-terminated list of preset names. */
const char *const *luna_config_preset_names(void);

/* Check ranges and consistency (dims divisible by heads, shared embeddings need equal encoder
 * and decoder dims, probabilities in [0, 1), ...). One-line error naming the option. */
luna_status luna_config_validate(const luna_config *c);

/* Total number of parameters (computed from the parameter layout; see model/param_table.h). */
size_t luna_config_num_parameters(const luna_config *c);

/* JSON object with the keys arch ("luna"|"transformer"), vocab_size, padding_idx,
 * encoder_embed_dim, encoder_ffn_embed_dim, encoder_layers, encoder_attention_heads,
 * decoder_embed_dim, decoder_ffn_embed_dim, decoder_layers, decoder_attention_heads,
 * projection_length, untie_luna_kv, causal_activation ("softplus"|"elu"),
 * fix_projection_length, non_contextual_projection, label_smoothing, dropout, attention_dropout,
 * activation_dropout; with Linformer also linformer_k, max_source_positions, linformer_sharing
 * ("headwise"|"kv"|"layerwise"); share_all_embeddings / share_decoder_input_output_embed only when
 * they are false (so the configurations of shared-embedding models read as before).
 * *json is malloc'ed. */
luna_status luna_config_to_json(const luna_config *c, char **json);
/* Parse such an object. Missing keys keep the luna_base_tied defaults (so fixture/older configs
 * without attention_dropout etc. load), unknown keys are ignored, wrong types are errors.
 * The result is validated. */
luna_status luna_config_from_json(luna_config *out, const char *json, size_t len);
luna_status luna_config_from_json_value(luna_config *out, const luna_json *object);

/* The first architecture field in which `a` and `b` differ — one that shapes the parameters or
 * the computation (arch, vocab_size, padding_idx, dims, layers, heads, projection_length,
 * untie_luna_kv, fix_projection_length, non_contextual_projection, causal_activation; not
 * dropout or label smoothing) — as
 * its JSON key, with both values as text in a_value/b_value (`size` bytes each); NULL when the
 * architectures agree. Checkpoints of different architectures cannot be resumed or averaged. */
const char *luna_config_architecture_difference(const luna_config *a, const luna_config *b,
                                                char *a_value, char *b_value, size_t size);

/* "headwise" | "kv" | "layerwise", and back (LUNA_ERR_INVALID_ARGUMENT naming the choices). */
const char *luna_linformer_sharing_name(luna_linformer_sharing s);
luna_status luna_linformer_sharing_parse(const char *name, luna_linformer_sharing *out);

/* One line "arch=luna d=512 ffn=2048 layers=6+6 heads=8+8 l=32 kv=tied phi=softplus ..." */
void luna_config_describe(const luna_config *c, char *buf, size_t size);

#endif
