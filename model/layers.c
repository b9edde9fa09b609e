#include "model/layers.h"

/* ---- bias + residual + dropout + LayerNorm (one fused op each way) --------------------------- */

luna_status luna_resnorm_forward(const luna_pass *ps, const luna_norm_w *w, luna_resnorm_act *act,
                                 const luna_act *res, const luna_act *sub, const float *bias,
                                 int64_t rows, int d, float p, uint32_t site) {
    luna_backend *be = ps->be;
    *act = (luna_resnorm_act){.rows = rows, .d = d, .p = p, .site = site};
    LUNA_TRY(luna_pass_alloc(ps, &act->r, rows * d, "residual"));
    LUNA_TRY(luna_pass_alloc_f32(ps, &act->mean, rows, "layer norm statistics"));
    LUNA_TRY(luna_pass_alloc_f32(ps, &act->rstd, rows, "layer norm statistics"));
    LUNA_TRY(luna_pass_alloc(ps, &act->y, rows * d, "layer output"));
    /* dropout off (evaluation, p = 0): the op's p = 0 adds sub + bias unscaled */
    const float pe = luna_pass_drops(ps, p) ? p : 0.0f;
    return be->ops->residual_norm_forward(be, act->y, act->r, act->mean, act->rstd, sub, bias, res,
                                          w->weight, w->bias, rows, d, LUNA_LAYER_NORM_EPS, pe,
                                          luna_pass_key(ps, site));
}

luna_status luna_resnorm_backward(const luna_pass *ps, const luna_norm_w *w, luna_norm_w *g,
                                  const luna_resnorm_act *act, const luna_act *dy, luna_act *dres,
                                  luna_act *dsub, float *dbias) {
    luna_backend *be = ps->be;
    const float pe = luna_pass_drops(ps, act->p) ? act->p : 0.0f;
    return be->ops->residual_norm_backward(be, dres, dsub, dbias, g->weight, g->bias, dy, act->r,
                                           act->mean, act->rstd, w->weight, act->rows, act->d, pe,
                                           luna_pass_key(ps, act->site));
}

/* ---- FFN ------------------------------------------------------------------------------------- */

luna_status luna_ffn_forward(const luna_pass *ps, const luna_linear_w *fc1,
                             const luna_linear_w *fc2, luna_ffn_act *act, const luna_act *x,
                             int64_t rows, int d, int ffn, uint32_t site) {
    luna_backend *be = ps->be;
    *act = (luna_ffn_act){.rows = rows, .d = d, .ffn = ffn, .site = site, .x = x};
    LUNA_TRY(luna_pass_alloc(ps, &act->h, rows * ffn, "FFN hidden"));
    LUNA_TRY(luna_pass_alloc(ps, &act->out, rows * d, "FFN output"));
    const float pe = luna_pass_drops(ps, ps->activation_dropout) ? ps->activation_dropout : 0.0f;
    if (!ps->backward && pe == 0.0f) { /* h = relu(fc1(x)): the relu in the GEMM's epilogue */
        LUNA_TRY(be->ops->linear_relu_forward(be, act->h, x, fc1->weight, fc1->bias, rows, d, ffn));
        return be->ops->linear_forward(be, act->out, act->h, fc2->weight, NULL, rows, ffn, d);
    }
    /* fc1's bias goes in with the GEMM (a cuBLASLt epilogue; the CPU starts from the bias rows):
     * giving it to bias_relu_dropout instead would cost a write of h. Its gradient comes from
     * bias_relu_dropout_backward, in the pass that computes dh anyway. */
    LUNA_TRY(be->ops->linear_forward(be, act->h, x, fc1->weight, fc1->bias, rows, d, ffn));
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_act *a; /* [rows, ffn] dropped activation, not kept */
    LUNA_TRY(luna_pass_alloc(ps, &a, rows * ffn, "FFN activation"));
    luna_status st = be->ops->bias_relu_dropout_forward(be, a, act->h, NULL, rows, ffn, pe,
                                                        luna_pass_key(ps, site));
    if (st == LUNA_OK) /* fc2's bias: added by the following luna_resnorm_forward */
        st = be->ops->linear_forward(be, act->out, a, fc2->weight, NULL, rows, ffn, d);
    luna_arena_release(ps->arena, mark);
    return st;
}

static luna_status ffn_backward(const luna_pass *ps, const luna_linear_w *fc1,
                                const luna_linear_w *fc2, luna_linear_w *g1, luna_linear_w *g2,
                                const luna_ffn_act *act, const luna_act *dout, luna_act *dx) {
    luna_backend *be = ps->be;
    const int64_t n = act->rows * act->ffn;
    const float pe = luna_pass_drops(ps, ps->activation_dropout) ? ps->activation_dropout : 0.0f;
    const luna_rng_key key = luna_pass_key(ps, act->site);
    luna_act *a, *da;
    LUNA_TRY(luna_pass_alloc(ps, &a, n, "FFN activation"));
    LUNA_TRY(luna_pass_alloc(ps, &da, n, "FFN activation gradient"));
    /* recompute a = drop(relu(h)) (h already holds fc1's bias: none added again) */
    LUNA_TRY(be->ops->bias_relu_dropout_forward(be, a, act->h, NULL, act->rows, act->ffn, pe, key));
    /* fc2's bias gradient: accumulated by luna_resnorm_backward */
    LUNA_TRY(be->ops->linear_backward(be, da, g2->weight, NULL, dout, a, fc2->weight, act->rows,
                                      act->ffn, act->d, false));
    LUNA_TRY(be->ops->bias_relu_dropout_backward(be, da, g1->bias, da, act->h, act->rows, act->ffn,
                                                 pe, key));
    return be->ops->linear_backward(be, dx, g1->weight, NULL, da, act->x, fc1->weight, act->rows,
                                    act->d, act->ffn, true);
}

luna_status luna_ffn_backward(const luna_pass *ps, const luna_linear_w *fc1,
                              const luna_linear_w *fc2, luna_linear_w *g1, luna_linear_w *g2,
                              const luna_ffn_act *act, const luna_act *dout, luna_act *dx) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = ffn_backward(ps, fc1, fc2, g1, g2, act, dout, dx);
    luna_arena_release(ps->arena, mark);
    return st;
}

/* ---- encoder layer --------------------------------------------------------------------------- */

#define ENC_SITE(i, k) LUNA_SITE(LUNA_SITE_ENCODER_LAYER, (i), (k))
#define DEC_SITE(i, k) LUNA_SITE(LUNA_SITE_DECODER_LAYER, (i), (k))

luna_status luna_encoder_layer_forward(const luna_pass *ps, const luna_config *c,
                                       const luna_encoder_layer_w *w, luna_encoder_layer_act *act,
                                       const luna_act *x, const luna_act *p,
                                       const luna_layer_dims *dm, int i) {
    const int B = dm->B, m = dm->m, L = dm->L, d = c->encoder_embed_dim;
    const int H = c->encoder_attention_heads;
    const int64_t rows = (int64_t)B * m;
    const float drop = ps->dropout;
    act->index = i;
    if (c->arch == LUNA_ARCH_LUNA) {
        LUNA_TRY(luna_attention_forward(ps, &w->self_attn, &act->attn, x, p, x, dm->src_valid,
                                        dm->p_valid, B, m, m, L, d, H, !c->untie_luna_kv,
                                        ENC_SITE(i, LUNA_SITE_SELF_ATTN)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &act->x1, x, act->attn.y,
                                      w->self_attn.out_proj.bias, rows, d, drop,
                                      ENC_SITE(i, LUNA_SITE_LAYER + 0)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->self_atten_proj_layer_norm, &act->p1, p, act->attn.yp,
                                      NULL, (int64_t)B * L, d, drop,
                                      ENC_SITE(i, LUNA_SITE_LAYER + 1)));
        act->p_out = act->p1.y;
    } else if (c->linformer_k > 0) {
        LUNA_TRY(luna_linformer_forward(ps, &w->self_attn, &act->lin, x, dm->src_valid, B, m, d, H,
                                        c->linformer_k, c->max_source_positions,
                                        ENC_SITE(i, LUNA_SITE_SELF_ATTN)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &act->x1, x, act->lin.y,
                                      w->self_attn.out_proj.bias, rows, d, drop,
                                      ENC_SITE(i, LUNA_SITE_LAYER + 0)));
        act->p_out = NULL;
    } else {
        LUNA_TRY(luna_mha_forward(ps, &w->self_attn, &act->mha, x, x, dm->src_valid, B, m, m, d, H,
                                  false, ENC_SITE(i, LUNA_SITE_SELF_ATTN)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &act->x1, x, act->mha.y,
                                      w->self_attn.out_proj.bias, rows, d, drop,
                                      ENC_SITE(i, LUNA_SITE_LAYER + 0)));
        act->p_out = NULL;
    }
    LUNA_TRY(luna_ffn_forward(ps, &w->fc1, &w->fc2, &act->ffn, act->x1.y, rows, d,
                              c->encoder_ffn_embed_dim, ENC_SITE(i, LUNA_SITE_LAYER + 2)));
    LUNA_TRY(luna_resnorm_forward(ps, &w->final_layer_norm, &act->x2, act->x1.y, act->ffn.out,
                                  w->fc2.bias, rows, d, drop, ENC_SITE(i, LUNA_SITE_LAYER + 3)));
    act->x_out = act->x2.y;
    return LUNA_OK;
}

static luna_status encoder_backward(const luna_pass *ps, const luna_config *c,
                                    const luna_encoder_layer_w *w, luna_encoder_layer_w *g,
                                    const luna_encoder_layer_act *act, const luna_act *dx_out,
                                    const luna_act *dp_out, luna_act *dx_in, luna_act *dp_in) {
    const int64_t xd = act->x1.rows * act->x1.d;
    luna_act *dx1, *dsub;
    LUNA_TRY(luna_pass_alloc(ps, &dx1, xd, "encoder layer gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dsub, xd, "encoder layer gradient"));
    /* x2 = LN(x1 + drop(FFN(x1))) */
    LUNA_TRY(luna_resnorm_backward(ps, &w->final_layer_norm, &g->final_layer_norm, &act->x2, dx_out,
                                   dx1, dsub, g->fc2.bias));
    LUNA_TRY(luna_ffn_backward(ps, &w->fc1, &w->fc2, &g->fc1, &g->fc2, &act->ffn, dsub, dx1));
    /* x1 = LN(x + drop(x̂)), p1 = LN_p(p + drop(p̂)) */
    LUNA_TRY(luna_resnorm_backward(ps, &w->self_attn_layer_norm, &g->self_attn_layer_norm, &act->x1,
                                   dx1, dx_in, dsub, g->self_attn.out_proj.bias));
    if (c->arch == LUNA_ARCH_LUNA) {
        luna_act *dpsub = NULL;
        if (dp_out) {
            LUNA_TRY(luna_pass_alloc(ps, &dpsub, act->p1.rows * act->p1.d, "encoder P gradient"));
            LUNA_TRY(luna_resnorm_backward(ps, &w->self_atten_proj_layer_norm,
                                           &g->self_atten_proj_layer_norm, &act->p1, dp_out, dp_in,
                                           dpsub, NULL));
        } else { /* P output unused (non-contextual P): only the attention's use of p */
            LUNA_TRY(
                luna_mem_zero(ps->be, dp_in, luna_act_bytes(ps->be, act->p1.rows * act->p1.d)));
        }
        return luna_attention_backward(ps, &w->self_attn, &g->self_attn, &act->attn, dsub, dpsub,
                                       dx_in, dp_in, dx_in);
    }
    if (c->linformer_k > 0)
        return luna_linformer_backward(ps, &w->self_attn, &g->self_attn, &act->lin, dsub, dx_in);
    return luna_mha_backward(ps, &w->self_attn, &g->self_attn, &act->mha, dsub, dx_in, dx_in);
}

luna_status luna_encoder_layer_backward(const luna_pass *ps, const luna_config *c,
                                        const luna_encoder_layer_w *w, luna_encoder_layer_w *g,
                                        const luna_encoder_layer_act *act, const luna_act *dx_out,
                                        const luna_act *dp_out, luna_act *dx_in, luna_act *dp_in) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = encoder_backward(ps, c, w, g, act, dx_out, dp_out, dx_in, dp_in);
    luna_arena_release(ps->arena, mark);
    return st;
}

/* ---- decoder layer --------------------------------------------------------------------------- */

luna_status luna_decoder_layer_forward(const luna_pass *ps, const luna_config *c,
                                       const luna_decoder_layer_w *w, luna_decoder_layer_act *act,
                                       const luna_act *x, const luna_act *p, const luna_act *e,
                                       const luna_layer_dims *dm, int i) {
    const int B = dm->B, n = dm->n, m = dm->m, L = dm->L, d = c->decoder_embed_dim;
    const int H = c->decoder_attention_heads;
    const int64_t rows = (int64_t)B * n;
    const float drop = ps->dropout;
    act->index = i;
    const luna_act *xhat;
    if (c->arch == LUNA_ARCH_LUNA) {
        LUNA_TRY(luna_causal_attention_forward(
            ps, &w->self_attn, &act->causal, x, p, dm->p_valid, B, n, L, d, H, !c->untie_luna_kv,
            c->causal_activation, DEC_SITE(i, LUNA_SITE_SELF_ATTN)));
        xhat = act->causal.y;
    } else {
        LUNA_TRY(luna_mha_forward(ps, &w->self_attn, &act->self_mha, x, x, dm->tgt_valid, B, n, n,
                                  d, H, true, DEC_SITE(i, LUNA_SITE_SELF_ATTN)));
        xhat = act->self_mha.y;
    }
    LUNA_TRY(luna_resnorm_forward(ps, &w->self_attn_layer_norm, &act->x1, x, xhat,
                                  w->self_attn.out_proj.bias, rows, d, drop,
                                  DEC_SITE(i, LUNA_SITE_LAYER + 0)));
    if (c->arch == LUNA_ARCH_LUNA) {
        LUNA_TRY(luna_attention_forward(ps, &w->encoder_attn, &act->cross, act->x1.y, p, e,
                                        dm->src_valid, dm->p_valid, B, n, m, L, d, H,
                                        !c->untie_luna_kv, DEC_SITE(i, LUNA_SITE_CROSS_ATTN)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->encoder_attn_layer_norm, &act->x2, act->x1.y,
                                      act->cross.y, w->encoder_attn.out_proj.bias, rows, d, drop,
                                      DEC_SITE(i, LUNA_SITE_LAYER + 1)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->encoder_atten_proj_layer_norm, &act->p2, p,
                                      act->cross.yp, NULL, (int64_t)B * L, d, drop,
                                      DEC_SITE(i, LUNA_SITE_LAYER + 2)));
        act->p_out = act->p2.y;
    } else {
        LUNA_TRY(luna_mha_forward(ps, &w->encoder_attn, &act->cross_mha, act->x1.y, e,
                                  dm->src_valid, B, n, m, d, H, false,
                                  DEC_SITE(i, LUNA_SITE_CROSS_ATTN)));
        LUNA_TRY(luna_resnorm_forward(ps, &w->encoder_attn_layer_norm, &act->x2, act->x1.y,
                                      act->cross_mha.y, w->encoder_attn.out_proj.bias, rows, d,
                                      drop, DEC_SITE(i, LUNA_SITE_LAYER + 1)));
        act->p_out = NULL;
    }
    LUNA_TRY(luna_ffn_forward(ps, &w->fc1, &w->fc2, &act->ffn, act->x2.y, rows, d,
                              c->decoder_ffn_embed_dim, DEC_SITE(i, LUNA_SITE_LAYER + 3)));
    LUNA_TRY(luna_resnorm_forward(ps, &w->final_layer_norm, &act->x3, act->x2.y, act->ffn.out,
                                  w->fc2.bias, rows, d, drop, DEC_SITE(i, LUNA_SITE_LAYER + 4)));
    act->x_out = act->x3.y;
    return LUNA_OK;
}

static luna_status decoder_backward(const luna_pass *ps, const luna_config *c,
                                    const luna_decoder_layer_w *w, luna_decoder_layer_w *g,
                                    const luna_decoder_layer_act *act, const luna_act *dx_out,
                                    const luna_act *dp_out, luna_act *dx_in, luna_act *dp_in,
                                    luna_act *de) {
    luna_backend *be = ps->be;
    const int64_t xd = act->x1.rows * act->x1.d;
    const bool luna = c->arch == LUNA_ARCH_LUNA;
    luna_act *dx2, *dx1, *dsub;
    LUNA_TRY(luna_pass_alloc(ps, &dx2, xd, "decoder layer gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dx1, xd, "decoder layer gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dsub, xd, "decoder layer gradient"));
    /* x3 = LN(x2 + drop(FFN(x2))) */
    LUNA_TRY(luna_resnorm_backward(ps, &w->final_layer_norm, &g->final_layer_norm, &act->x3, dx_out,
                                   dx2, dsub, g->fc2.bias));
    LUNA_TRY(luna_ffn_backward(ps, &w->fc1, &w->fc2, &g->fc1, &g->fc2, &act->ffn, dsub, dx2));
    /* x2 = LN(x1 + drop(x̂)), p2 = LN_p(p + drop(p̂)) */
    LUNA_TRY(luna_resnorm_backward(ps, &w->encoder_attn_layer_norm, &g->encoder_attn_layer_norm,
                                   &act->x2, dx2, dx1, dsub, g->encoder_attn.out_proj.bias));
    if (luna) {
        const int64_t pd = act->p2.rows * act->p2.d;
        luna_act *dpsub = NULL;
        if (dp_out) {
            LUNA_TRY(luna_pass_alloc(ps, &dpsub, pd, "decoder P gradient"));
            LUNA_TRY(luna_resnorm_backward(ps, &w->encoder_atten_proj_layer_norm,
                                           &g->encoder_atten_proj_layer_norm, &act->p2, dp_out,
                                           dp_in, dpsub, NULL));
        } else {
            LUNA_TRY(luna_mem_zero(be, dp_in, luna_act_bytes(be, pd)));
        }
        LUNA_TRY(luna_attention_backward(ps, &w->encoder_attn, &g->encoder_attn, &act->cross, dsub,
                                         dpsub, dx1, dp_in, de));
    } else {
        LUNA_TRY(luna_mha_backward(ps, &w->encoder_attn, &g->encoder_attn, &act->cross_mha, dsub,
                                   dx1, de));
    }
    /* x1 = LN(x + drop(SelfAttn(x))) */
    LUNA_TRY(luna_resnorm_backward(ps, &w->self_attn_layer_norm, &g->self_attn_layer_norm, &act->x1,
                                   dx1, dx_in, dsub, g->self_attn.out_proj.bias));
    if (luna)
        return luna_causal_attention_backward(ps, &w->self_attn, &g->self_attn, &act->causal, dsub,
                                              dx_in, dp_in);
    return luna_mha_backward(ps, &w->self_attn, &g->self_attn, &act->self_mha, dsub, dx_in, dx_in);
}

luna_status luna_decoder_layer_backward(const luna_pass *ps, const luna_config *c,
                                        const luna_decoder_layer_w *w, luna_decoder_layer_w *g,
                                        const luna_decoder_layer_act *act, const luna_act *dx_out,
                                        const luna_act *dp_out, luna_act *dx_in, luna_act *dp_in,
                                        luna_act *de) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = decoder_backward(ps, c, w, g, act, dx_out, dp_out, dx_in, dp_in, de);
    luna_arena_release(ps->arena, mark);
    return st;
}
