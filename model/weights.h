/* Typed views of the flat parameter (or gradient) buffer: one struct per layer with a pointer per
 * tensor, bound by model/param_table.c's layout walker. Layers read weights through these;
 * optimizers never see them (they work on the flat buffers of model/param_table.h). */
#ifndef LUNA_MODEL_WEIGHTS_H
#define LUNA_MODEL_WEIGHTS_H

typedef struct {
    float *weight; /* [out, in] */
    float *bias;   /* [out] */
} luna_linear_w;

typedef struct {
    float *weight; /* [d] gain γ */
    float *bias;   /* [d] */
} luna_norm_w;

/* One attention module. Luna tied: pq, q, pc, c, out. Luna untied (bidirectional): pq, q, pk, pv,
 * k, v, out. Causal untied: pq, q, pc, k, v, out. Softmax MHA: k, v, q, out. Absent ones NULL. */
typedef struct {
    luna_linear_w pq_proj, q_proj, pc_proj, c_proj, pk_proj, pv_proj, k_proj, v_proj, out_proj;
    /* Linformer encoder self-attention (softmax MHA + these): E, F [k, N]; compress_v NULL when
     * F = E (key-value / layerwise sharing; layerwise: every layer's view is the same tensor). */
    float *compress_k, *compress_v;
} luna_attn_w;

typedef struct {
    luna_attn_w self_attn;
    luna_norm_w self_attn_layer_norm;
    luna_norm_w self_atten_proj_layer_norm; /* Luna only: P's LayerNorm */
    luna_linear_w fc1, fc2;
    luna_norm_w final_layer_norm;
    float *projected_embeddings; /* [l, d] non-contextual P of layers > 0, else NULL */
} luna_encoder_layer_w;

typedef struct {
    luna_attn_w self_attn;
    luna_norm_w self_attn_layer_norm;
    luna_attn_w encoder_attn;
    luna_norm_w encoder_attn_layer_norm;
    luna_norm_w encoder_atten_proj_layer_norm; /* Luna only */
    luna_linear_w fc1, fc2;
    luna_norm_w final_layer_norm;
    float *projected_embeddings; /* [l, d] non-contextual P, else NULL */
} luna_decoder_layer_w;

typedef struct {
    float *embed_tokens; /* [V, d] encoder.embed_tokens.weight, shared 3 ways */
    /* The decoder's input table and the output projection [V, d]: both alias embed_tokens
     * (share_all_embeddings, the default); otherwise decoder.embed_tokens.weight, and the output
     * projection aliases it (share_decoder_input_output_embed) or is
     * decoder.output_projection.weight. */
    float *decoder_embed_tokens;
    float *output_projection;
    float *projected_embeddings;   /* [l, d] encoder.projected_embeddings (Luna only) */
    luna_encoder_layer_w *encoder; /* [encoder_layers] */
    luna_decoder_layer_w *decoder; /* [decoder_layers] */
} luna_weights;

#endif
