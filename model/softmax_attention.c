#include "model/softmax_attention.h"

#include <math.h>

#include "model/luna_attention.h"

luna_status luna_mha_keys(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                          const luna_act *c, const int32_t *c_valid, int B, int m, int d, int H,
                          uint32_t site) {
    *act = (luna_mha_act){.B = B, .m = m, .d = d, .H = H, .site = site, .c = c, .c_valid = c_valid};
    /* K and V [B,m,d] side by side: k_proj and v_proj are one call */
    const luna_linear_w *kv[2] = {&w->k_proj, &w->v_proj};
    LUNA_TRY(luna_project_multi(ps, &act->k, c, kv, 2, (int64_t)B * m, d, d));
    act->v = luna_act_at(ps->be, act->k, (int64_t)B * m * d);
    return LUNA_OK;
}

luna_status luna_mha_attend(const luna_pass *ps, const luna_attn_w *w, luna_mha_act *act,
                            const luna_act *x, int n, bool causal) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, m = act->m, d = act->d, H = act->H;
    if (causal && n != m)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "causal attention needs n == m (%d, %d)", n,
                          m);
    act->x = x;
    act->n = n;
    act->causal = causal;
    /* A [B,H,n,m] = softmax(dh^-1/2 · Q Kᵀ), dropped; O [B,n,d] = A_d V, each head into its
     * columns */
    LUNA_TRY(luna_project(ps, &act->q, x, &w->q_proj, (int64_t)B * n, d, d));
    const luna_attention_shape s =
        luna_attention_shape_in_rows(B, H, n, m, d, act->c_valid, causal);
    const int64_t nd = (int64_t)B * n * d;
    LUNA_TRY(luna_pass_alloc(ps, &act->o, nd, "attention output"));
    LUNA_TRY(luna_attention_core(ps, &s, act->o, &act->a, &act->a_d, act->q, act->k, act->v,
                                 act->site, "attention probabilities"));
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
    const int B = act->B, n = act->n, m = act->m, d = act->d, H = act->H;
    const int64_t nd = (int64_t)B * n * d, md = (int64_t)B * m * d;
    luna_act *d_o, *dk, *dv;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dk, 2 * md, "key and value gradients"));
    dv = luna_act_at(be, dk, md);
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));
    /* O = A_d V, A = softmax(s·Q Kᵀ): dQ (into dO's buffer), dK, dV */
    luna_act *dq = d_o;
    const luna_attention_shape s =
        luna_attention_shape_in_rows(B, H, n, m, d, act->c_valid, act->causal);
    LUNA_TRY(luna_attention_core_backward(ps, &s, dq, dk, dv, d_o, act->q, act->k, act->v, act->a,
                                          act->a_d, act->site));
    LUNA_TRY(op->linear_backward(be, dx, g->q_proj.weight, g->q_proj.bias, dq, act->x,
                                 w->q_proj.weight, (int64_t)B * n, d, d, true));
    const luna_linear_w *kv[2] = {&w->k_proj, &w->v_proj};
    luna_linear_w *gkv[2] = {&g->k_proj, &g->v_proj};
    return luna_project_multi_backward(ps, dk, act->c, kv, gkv, dc, 2, (int64_t)B * m, d, d, true);
}

luna_status luna_mha_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                              const luna_mha_act *act, const luna_act *dy, luna_act *dx,
                              luna_act *dc) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = backward(ps, w, g, act, dy, dx, dc);
    luna_arena_release(ps->arena, mark);
    return st;
}
