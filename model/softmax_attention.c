#include "model/softmax_attention.h"

#include <math.h>

#include "model/luna_attention.h"

luna_status luna_mha_keys(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                          const luna_act *c, const int32_t *c_valid, int B, int m, int d, int H,
                          uint32_t site) {
    *act = (luna_mha_act){.B = B, .m = m, .d = d, .H = H, .site = site, .c = c, .c_valid = c_valid};
    LUNA_TRY(luna_project(ps, &act->k, c, &w->k_proj, (int64_t)B * m, d, d));
    return luna_project(ps, &act->v, c, &w->v_proj, (int64_t)B * m, d, d);
}

luna_status luna_mha_attend(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                            const luna_act *x, int n, bool causal) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, m = act->m, d = act->d, H = act->H, dh = d / H, G = B * H;
    if (causal && n != m)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "causal attention needs n == m (%d, %d)", n,
                          m);
    act->x = x;
    act->n = n;
    act->causal = causal;
    const luna_heads_layout hn = luna_heads_in_rows(n, d, dh), hm = luna_heads_in_rows(m, d, dh);
    /* A [B,H,n,m] = softmax(dh^-1/2 · Q Kᵀ) (the scale in the GEMM's alpha, luna_attention.h) */
    LUNA_TRY(luna_project(ps, &act->q, x, &w->q_proj, (int64_t)B * n, d, d));
    LUNA_TRY(luna_pass_alloc(ps, &act->a, (int64_t)G * n * m, "attention probabilities"));
    LUNA_TRY(luna_heads_gemm(be, false, true, n, m, dh, 1.0f / sqrtf((float)dh), act->q, hn, act->k,
                             hm, 0.0f, act->a, luna_heads_packed(n, m, H), B, H));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a, &act->a_d, act->a, (int64_t)G * n, m,
                                       act->c_valid, (int64_t)H * n, causal ? n : 0,
                                       ps->attention_dropout, act->site, "attention dropout"));
    /* O [B,n,d] = A_d V, each head into its columns */
    const int64_t nd = (int64_t)B * n * d;
    LUNA_TRY(luna_pass_alloc(ps, &act->o, nd, "attention output"));
    LUNA_TRY(luna_heads_gemm(be, false, false, n, dh, m, 1.0f, act->a_d, luna_heads_packed(n, m, H),
                             act->v, hm, 0.0f, act->o, hn, B, H));
    LUNA_TRY(luna_pass_alloc(ps, &act->y, nd, "attention result"));
    return op->linear_forward(be, act->y, act->o, w->out_proj.weight, NULL, (int64_t)B * n, d, d);
}

luna_status luna_mha_forward(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                             const luna_act *x, const luna_act *c, const int32_t *c_valid, int B,
                             int n, int m, int d, int H, bool causal, uint32_t site) {
    if (causal && n != m)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "causal attention needs n == m (%d, %d)", n,
                          m);
    LUNA_TRY(luna_mha_keys(ps, w, act, c, c_valid, B, m, d, H, site));
    return luna_mha_attend(ps, w, act, x, n, causal);
}

static luna_status backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                            const luna_mha_act *act, const luna_act *dy, luna_act *dx,
                            luna_act *dc) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, n = act->n, m = act->m, d = act->d, H = act->H, dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    const int64_t nd = (int64_t)B * n * d, md = (int64_t)B * m * d, nm = (int64_t)G * n * m;
    const luna_heads_layout hn = luna_heads_in_rows(n, d, dh), hm = luna_heads_in_rows(m, d, dh),
                            hnm = luna_heads_packed(n, m, H);
    luna_act *d_o, *da, *dk, *dv;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &da, nm, "attention probability gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dk, md, "key gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dv, md, "value gradient"));
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));
    /* O_h = A_d V_h: dA_d = dO_h V_hᵀ, dV_h = A_dᵀ dO_h */
    LUNA_TRY(
        luna_heads_gemm(be, false, true, n, m, dh, 1.0f, d_o, hn, act->v, hm, 0.0f, da, hnm, B, H));
    LUNA_TRY(luna_heads_gemm(be, true, false, m, dh, n, 1.0f, act->a_d, hnm, d_o, hn, 0.0f, dv, hm,
                             B, H));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, da, da, act->a, (int64_t)G * n, m,
                                                ps->attention_dropout, act->site));
    /* S = s·Q Kᵀ: dQ = s·dS K (into dO's buffer), dK = s·dSᵀ Q */
    luna_act *dq = d_o;
    LUNA_TRY(luna_heads_gemm(be, false, false, n, dh, m, scale, da, hnm, act->k, hm, 0.0f, dq, hn,
                             B, H));
    LUNA_TRY(
        luna_heads_gemm(be, true, false, m, dh, n, scale, da, hnm, act->q, hn, 0.0f, dk, hm, B, H));
    LUNA_TRY(op->linear_backward(be, dx, g->q_proj.weight, g->q_proj.bias, dq, act->x,
                                 w->q_proj.weight, (int64_t)B * n, d, d, true));
    LUNA_TRY(op->linear_backward(be, dc, g->k_proj.weight, g->k_proj.bias, dk, act->c,
                                 w->k_proj.weight, (int64_t)B * m, d, d, true));
    return op->linear_backward(be, dc, g->v_proj.weight, g->v_proj.bias, dv, act->c,
                               w->v_proj.weight, (int64_t)B * m, d, d, true);
}

luna_status luna_mha_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                              const luna_mha_act *act, const luna_act *dy, luna_act *dx,
                              luna_act *dc) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = backward(ps, w, g, act, dy, dx, dc);
    luna_arena_release(ps->arena, mark);
    return st;
}
