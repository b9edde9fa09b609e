/* Encoder and decoder layers (spec §4): post-LayerNorm (eps 1e-5), dropout before every residual,
 * ReLU FFN with activation dropout. Luna layers carry P through their own LayerNorm; the softmax
 * baseline (transformer) uses the same layers with multi-head attention and no P.
 *
 * Encoder layer (x [B, m, d], p [B, L, d]):
 *   (x̂, p̂) = LunaAttn(x, p, x);  x = LN(x + drop(x̂));  p = LN_p(p + drop(p̂))
 *   x = LN(x + drop(fc2(drop_act(relu(fc1(x))))))
 * Decoder layer (x [B, n, d], p, encoder output e [B, m, d]):
 *   x = LN(x + drop(CausalLuna(x, p)))
 *   (x̂, p̂) = LunaAttn(x, p, e);  x = LN(x + drop(x̂));  p = LN_p(p + drop(p̂))
 *   x = LN(x + drop(FFN(x)))
 * Backward functions OVERWRITE the gradients of the layer inputs (dx_in, dp_in) and ADD into the
 * gradient of the encoder output (de), which every decoder layer's cross-attention reads.
 */
#ifndef LUNA_LAYERS_H
#define LUNA_LAYERS_H

#include "model/causal_luna_attention.h"
#include "model/config.h"
#include "model/linformer_attention.h"
#include "model/luna_attention.h"
#include "model/pass.h"
#include "model/weights.h"
#include "model/softmax_attention.h"

#define LUNA_LAYER_NORM_EPS 1e-5f

/* y = LN(res + drop(sub + bias)): the fused residual_norm op (core/backend.h). bias is the
 * sublayer's output-projection bias (attention out_proj, fc2), which the sublayer leaves out of
 * `sub` so that this op adds it in the same pass (NULL: none, e.g. Luna's packed context). */
typedef struct {
    int64_t rows;
    int d;
    float p;
    uint32_t site;
    luna_act *r;        /* [rows, d] LayerNorm input */
    float *mean, *rstd; /* [rows] fp32 statistics */
    luna_act *y;        /* [rows, d] output */
} luna_resnorm_act;

luna_status luna_resnorm_forward(const luna_pass *ps, const luna_norm_w *w, luna_resnorm_act *act,
                                 const luna_act *res, const luna_act *sub, const float *bias,
                                 int64_t rows, int d, float p, uint32_t site);
/* dres [rows, d] = d(res) (overwritten), dsub [rows, d] = d(sub) (overwritten), dbias [d] +=
 * d(bias) (NULL: no bias). */
luna_status luna_resnorm_backward(const luna_pass *ps, const luna_norm_w *w, luna_norm_w *g,
                                  const luna_resnorm_act *act, const luna_act *dy, luna_act *dres,
                                  luna_act *dsub, float *dbias);

/* out = fc2(drop_act(relu(fc1(x)))) WITHOUT fc2's bias (the following luna_resnorm adds it: pass
 * fc2.bias there); the dropped activation is recomputed in backward. fc1's bias, ReLU and the
 * activation dropout are one fused op (bias_relu_dropout, core/backend.h); without dropout and
 * backward (decoding, validation) fc1 and the relu are one (linear_relu_forward). */
typedef struct {
    int64_t rows;
    int d, ffn;
    uint32_t site;
    const luna_act *x; /* [rows, d] */
    luna_act *h;       /* [rows, ffn] fc1 output with its bias (before relu; after it when no
                          backward follows, ps->backward false: linear_relu_forward) */
    luna_act *out;     /* [rows, d] */
} luna_ffn_act;

luna_status luna_ffn_forward(const luna_pass *ps, const luna_linear_w *fc1,
                             const luna_linear_w *fc2, luna_ffn_act *act, const luna_act *x,
                             int64_t rows, int d, int ffn, uint32_t site);
/* dx [rows, d] += d(x). */
luna_status luna_ffn_backward(const luna_pass *ps, const luna_linear_w *fc1,
                              const luna_linear_w *fc2, luna_linear_w *g1, luna_linear_w *g2,
                              const luna_ffn_act *act, const luna_act *dout, luna_act *dx);

/* Sizes shared by the layers of one batch. Luna: p_valid [B] (device) is the P mask or NULL
 * (fixed projection length). c_valid / e_valid: source lengths [B]; t_valid: target lengths
 * (transformer decoder key padding). */
typedef struct {
    int B, n, m, L;           /* batch, target length, source length, P slots (0 for transformer) */
    const int32_t *src_valid; /* [B] */
    const int32_t *tgt_valid; /* [B] */
    const int32_t *p_valid;   /* [B] or NULL */
} luna_layer_dims;

typedef struct {
    int index;
    luna_attn_act attn;     /* Luna */
    luna_mha_act mha;       /* transformer */
    luna_linformer_act lin; /* transformer with linformer_k > 0 */
    luna_resnorm_act x1, p1, x2;
    luna_ffn_act ffn;
    luna_act *x_out; /* [B, m, d] */
    luna_act *p_out; /* [B, L, d] (Luna) */
} luna_encoder_layer_act;

typedef struct {
    int index;
    luna_causal_act causal; /* Luna self-attention */
    luna_mha_act self_mha;  /* transformer self-attention */
    luna_attn_act cross;    /* Luna cross-attention */
    luna_mha_act cross_mha; /* transformer cross-attention */
    luna_resnorm_act x1, x2, p2, x3;
    luna_ffn_act ffn;
    luna_act *x_out; /* [B, n, d] */
    luna_act *p_out; /* [B, L, d] (Luna) */
} luna_decoder_layer_act;

luna_status luna_encoder_layer_forward(const luna_pass *ps, const luna_config *c,
                                       const luna_encoder_layer_w *w, luna_encoder_layer_act *act,
                                       const luna_act *x, const luna_act *p,
                                       const luna_layer_dims *dims, int index);
/* dp_out/dp_in unused (NULL) for the transformer. Luna: dp_out NULL when the P output is unused
 * (non-contextual P) — its LayerNorm then gets no gradient. */
luna_status luna_encoder_layer_backward(const luna_pass *ps, const luna_config *c,
                                        const luna_encoder_layer_w *w, luna_encoder_layer_w *g,
                                        const luna_encoder_layer_act *act, const luna_act *dx_out,
                                        const luna_act *dp_out, luna_act *dx_in, luna_act *dp_in);

luna_status luna_decoder_layer_forward(const luna_pass *ps, const luna_config *c,
                                       const luna_decoder_layer_w *w, luna_decoder_layer_act *act,
                                       const luna_act *x, const luna_act *p, const luna_act *e,
                                       const luna_layer_dims *dims, int index);
/* dp_out NULL: P output unused (last layer) — its LayerNorm then gets no gradient. */
luna_status luna_decoder_layer_backward(const luna_pass *ps, const luna_config *c,
                                        const luna_decoder_layer_w *w, luna_decoder_layer_w *g,
                                        const luna_decoder_layer_act *act, const luna_act *dx_out,
                                        const luna_act *dp_out, luna_act *dx_in, luna_act *dp_in,
                                        luna_act *de);

#endif
