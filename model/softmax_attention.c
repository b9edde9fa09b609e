#include "model/softmax_attention.h"

#include <math.h>

#include "model/luna_attention.h"

luna_status luna_mha_keys(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                          const luna_act *c, const int32_t *c_valid, int B, int m, int d, int H,
                          uint32_t site) {
    *act = (luna_mha_act){
        .B = B, .m = m, .d = d, .H = H, .site = site, .c = c, .c_valid = c_valid};
    LUNA_TRY(luna_project_heads(ps, &act->k, c, &w->k_proj, B, m, d, H, 1.0f));
    return luna_project_heads(ps, &act->v, c, &w->v_proj, B, m, d, H, 1.0f);
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
    LUNA_TRY(luna_project_heads(ps, &act->q, x, &w->q_proj, B, n, d, H, 1.0f / sqrtf((float)dh)));
    const int64_t nm = (int64_t)G * n * m;
    LUNA_TRY(luna_pass_alloc(ps, &act->a, nm, "attention probabilities")); /* [B,H,n,m] */
    LUNA_TRY(luna_bgemm(be, false, true, n, m, dh, 1.0f, act->q, act->k, 0.0f, act->a, G));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a, &act->a_d, act->a, (int64_t)G * n, m,
                                       act->c_valid, (int64_t)H * n, causal ? n : 0,
                                       ps->attention_dropout, act->site, "attention dropout"));
    const int64_t nd = (int64_t)B * n * d;
    LUNA_TRY(luna_pass_alloc(ps, &act->o, nd, "attention output"));
    {
        luna_arena_mark mark = luna_arena_get_mark(ps->arena);
        luna_act *oh; /* [B,H,n,dh] */
        LUNA_TRY(luna_pass_alloc(ps, &oh, nd, "attention output heads"));
        luna_status st =
            luna_bgemm(be, false, false, n, dh, m, 1.0f, act->a_d, act->v, 0.0f, oh, G);
        if (st == LUNA_OK) st = op->merge_heads(be, act->o, oh, B, n, H, dh);
        luna_arena_release(ps->arena, mark);
        LUNA_TRY(st);
    }
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
    const int64_t nd = (int64_t)B * n * d, md = (int64_t)B * m * d, nm = (int64_t)G * n * m;
    luna_act *d_o, *doh, *da, *dk, *dv;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &doh, nd, "attention gradient heads"));
    LUNA_TRY(luna_pass_alloc(ps, &da, nm, "attention probability gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dk, md, "key gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dv, md, "value gradient"));
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));
    LUNA_TRY(op->split_heads(be, doh, d_o, B, n, H, dh));
    /* O = A_d V: dA_d = dO Vᵀ, dV = A_dᵀ dO */
    LUNA_TRY(luna_bgemm(be, false, true, n, m, dh, 1.0f, doh, act->v, 0.0f, da, G));
    LUNA_TRY(luna_bgemm(be, true, false, m, dh, n, 1.0f, act->a_d, doh, 0.0f, dv, G));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, da, da, act->a, (int64_t)G * n, m,
                                                ps->attention_dropout, act->site));
    /* S = Q Kᵀ: dQ = dS K (into doh), dK = dSᵀ Q */
    LUNA_TRY(luna_bgemm(be, false, false, n, dh, m, 1.0f, da, act->k, 0.0f, doh, G));
    LUNA_TRY(luna_bgemm(be, true, false, m, dh, n, 1.0f, da, act->q, 0.0f, dk, G));
    LUNA_TRY(luna_project_heads_backward(ps, doh, act->x, &w->q_proj, &g->q_proj, dx, B, n, d, H,
                                         1.0f / sqrtf((float)dh)));
    LUNA_TRY(
        luna_project_heads_backward(ps, dk, act->c, &w->k_proj, &g->k_proj, dc, B, m, d, H, 1.0f));
    LUNA_TRY(
        luna_project_heads_backward(ps, dv, act->c, &w->v_proj, &g->v_proj, dc, B, m, d, H, 1.0f));
    return LUNA_OK;
}

luna_status luna_mha_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                              const luna_mha_act *act, const luna_act *dy, luna_act *dx,
                              luna_act *dc) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = backward(ps, w, g, act, dy, dx, dc);
    luna_arena_release(ps->arena, mark);
    return st;
}
