#include "model/luna_attention.h"

#include <math.h>

/* ---- shared helpers -------------------------------------------------------------------------- */

luna_status luna_linear_scaled(const luna_pass *ps, luna_act *y, const luna_act *x,
                               const luna_linear_w *w, int64_t rows, int in, int out, float scale) {
    luna_backend *be = ps->be;
    LUNA_TRY(be->ops->linear_forward(be, y, x, w->weight, w->bias, rows, in, out));
    if (scale != 1.0f) LUNA_TRY(be->ops->scale_act(be, y, scale, rows * out));
    return LUNA_OK;
}

luna_status luna_project_heads(const luna_pass *ps, luna_act **heads, const luna_act *x,
                               const luna_linear_w *w, int B, int len, int d, int H, float scale) {
    const int64_t rows = (int64_t)B * len;
    LUNA_TRY(luna_pass_alloc(ps, heads, rows * d, "attention heads")); /* [B, H, len, dh] */
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_act *flat; /* [B, len, d] */
    LUNA_TRY(luna_pass_alloc(ps, &flat, rows * d, "attention projection"));
    luna_status st = luna_linear_scaled(ps, flat, x, w, rows, d, d, scale);
    if (st == LUNA_OK) st = ps->be->ops->split_heads(ps->be, *heads, flat, B, len, H, d / H);
    luna_arena_release(ps->arena, mark);
    return st;
}

luna_status luna_project_heads_backward(const luna_pass *ps, const luna_act *dheads,
                                        const luna_act *x, const luna_linear_w *w, luna_linear_w *g,
                                        luna_act *dx, int B, int len, int d, int H, float scale) {
    luna_backend *be = ps->be;
    const int64_t rows = (int64_t)B * len;
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_act *dflat; /* [B, len, d] */
    LUNA_TRY(luna_pass_alloc(ps, &dflat, rows * d, "attention projection gradient"));
    luna_status st = be->ops->merge_heads(be, dflat, dheads, B, len, H, d / H);
    if (st == LUNA_OK && scale != 1.0f) st = be->ops->scale_act(be, dflat, scale, rows * d);
    if (st == LUNA_OK)
        st = be->ops->linear_backward(be, dx, g->weight, g->bias, dflat, x, w->weight, rows, d, d,
                                      true);
    luna_arena_release(ps->arena, mark);
    return st;
}

luna_status luna_bgemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                       const luna_act *A, const luna_act *Bm, float beta, luna_act *C, int G) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    return be->ops->gemm(be, ta, tb, M, N, K, alpha, A, lda, (int64_t)M * K, Bm, ldb,
                         (int64_t)K * N, beta, C, N, (int64_t)M * N, G);
}

/* ---- forward --------------------------------------------------------------------------------- */

luna_status luna_attention_pack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                const luna_act *p, const luna_act *c, const int32_t *c_valid,
                                int B, int m, int L, int d, int H, bool tied, uint32_t site) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    *act = (luna_attn_act){.B = B,
                           .m = m,
                           .L = L,
                           .d = d,
                           .H = H,
                           .tied = tied,
                           .site = site,
                           .p = p,
                           .c = c,
                           .c_valid = c_valid};

    /* pack: Qp [B,H,L,dh], Kc/Vc [B,H,m,dh] */
    LUNA_TRY(luna_project_heads(ps, &act->qp, p, &w->pq_proj, B, L, d, H, scale));
    if (tied) {
        LUNA_TRY(luna_project_heads(ps, &act->kc, c, &w->pc_proj, B, m, d, H, 1.0f));
        act->vc = act->kc;
    } else {
        LUNA_TRY(luna_project_heads(ps, &act->kc, c, &w->pk_proj, B, m, d, H, 1.0f));
        LUNA_TRY(luna_project_heads(ps, &act->vc, c, &w->pv_proj, B, m, d, H, 1.0f));
    }
    const int64_t pack_n = (int64_t)G * L * m;
    LUNA_TRY(luna_pass_alloc(ps, &act->a_pack, pack_n, "pack attention")); /* [B,H,L,m] */
    LUNA_TRY(luna_bgemm(be, false, true, L, m, dh, 1.0f, act->qp, act->kc, 0.0f, act->a_pack, G));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a_pack, &act->a_pack_d, act->a_pack, (int64_t)G * L,
                                       m, c_valid, (int64_t)H * L, 0, ps->attention_dropout,
                                       site + 0, "pack attention dropout"));
    /* Y_P = merge(A_pack_d Vc) [B,L,d] */
    LUNA_TRY(luna_pass_alloc(ps, &act->yp, (int64_t)B * L * d, "packed context"));
    {
        luna_arena_mark mark = luna_arena_get_mark(ps->arena);
        luna_act *yph; /* [B,H,L,dh] */
        LUNA_TRY(luna_pass_alloc(ps, &yph, (int64_t)B * L * d, "packed context heads"));
        luna_status st =
            luna_bgemm(be, false, false, L, dh, m, 1.0f, act->a_pack_d, act->vc, 0.0f, yph, G);
        if (st == LUNA_OK) st = op->merge_heads(be, act->yp, yph, B, L, H, dh);
        luna_arena_release(ps->arena, mark);
        LUNA_TRY(st);
    }
    /* unpack keys/values Kp/Vp [B,H,L,dh]: they depend on P and the context only */
    if (tied) {
        LUNA_TRY(luna_project_heads(ps, &act->kp, act->yp, &w->c_proj, B, L, d, H, 1.0f));
        act->vp = act->kp;
    } else {
        LUNA_TRY(luna_project_heads(ps, &act->kp, act->yp, &w->k_proj, B, L, d, H, 1.0f));
        LUNA_TRY(luna_project_heads(ps, &act->vp, act->yp, &w->v_proj, B, L, d, H, 1.0f));
    }
    return LUNA_OK;
}

luna_status luna_attention_unpack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                  const luna_act *x, const int32_t *p_valid, int n) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, L = act->L, d = act->d, H = act->H, dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    act->x = x;
    act->n = n;
    act->p_valid = p_valid;
    /* unpack: Q [B,H,n,dh] against Kp/Vp */
    LUNA_TRY(luna_project_heads(ps, &act->q, x, &w->q_proj, B, n, d, H, scale));
    const int64_t un_n = (int64_t)G * n * L;
    LUNA_TRY(luna_pass_alloc(ps, &act->a, un_n, "unpack attention")); /* [B,H,n,L] */
    LUNA_TRY(luna_bgemm(be, false, true, n, L, dh, 1.0f, act->q, act->kp, 0.0f, act->a, G));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a, &act->a_d, act->a, (int64_t)G * n, L, p_valid,
                                       (int64_t)H * n, 0, ps->attention_dropout, act->site + 1,
                                       "unpack attention dropout"));
    /* O = merge(A_d Vp) [B,n,d]; Y_X = out_proj(O) */
    LUNA_TRY(luna_pass_alloc(ps, &act->o, (int64_t)B * n * d, "attention output"));
    {
        luna_arena_mark mark = luna_arena_get_mark(ps->arena);
        luna_act *oh; /* [B,H,n,dh] */
        LUNA_TRY(luna_pass_alloc(ps, &oh, (int64_t)B * n * d, "attention output heads"));
        luna_status st =
            luna_bgemm(be, false, false, n, dh, L, 1.0f, act->a_d, act->vp, 0.0f, oh, G);
        if (st == LUNA_OK) st = op->merge_heads(be, act->o, oh, B, n, H, dh);
        luna_arena_release(ps->arena, mark);
        LUNA_TRY(st);
    }
    LUNA_TRY(luna_pass_alloc(ps, &act->y, (int64_t)B * n * d, "attention result"));
    return op->linear_forward(be, act->y, act->o, w->out_proj.weight, NULL, (int64_t)B * n, d, d);
}

luna_status luna_attention_forward(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                   const luna_act *x, const luna_act *p, const luna_act *c,
                                   const int32_t *c_valid, const int32_t *p_valid, int B, int n,
                                   int m, int L, int d, int H, bool tied, uint32_t site) {
    LUNA_TRY(luna_attention_pack(ps, w, act, p, c, c_valid, B, m, L, d, H, tied, site));
    return luna_attention_unpack(ps, w, act, x, p_valid, n);
}

/* ---- backward -------------------------------------------------------------------------------- */

static luna_status backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                            const luna_attn_act *act, const luna_act *dy, const luna_act *dyp,
                            luna_act *dx, luna_act *dp, luna_act *dc) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, n = act->n, m = act->m, L = act->L, d = act->d, H = act->H;
    const int dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    const bool tied = act->tied;
    const int64_t nd = (int64_t)B * n * d, Ld = (int64_t)B * L * d, md = (int64_t)B * m * d;

    /* Y_X = out_proj(O): dO [B,n,d] -> heads dOh [B,H,n,dh] */
    luna_act *d_o, *doh;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &doh, nd, "attention gradient heads"));
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));
    LUNA_TRY(op->split_heads(be, doh, d_o, B, n, H, dh));

    /* O_h = A_d Vp: dA_d = dOh Vpᵀ [B,H,n,L], dVp = A_dᵀ dOh [B,H,L,dh] */
    const int64_t un_n = (int64_t)G * n * L;
    luna_act *da, *dkp, *dvp;
    LUNA_TRY(luna_pass_alloc(ps, &da, un_n, "unpack attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dkp, Ld, "unpack key gradient"));
    dvp = dkp;
    if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvp, Ld, "unpack value gradient"));
    LUNA_TRY(luna_bgemm(be, false, true, n, L, dh, 1.0f, doh, act->vp, 0.0f, da, G));
    LUNA_TRY(luna_bgemm(be, true, false, L, dh, n, 1.0f, act->a_d, doh, 0.0f, dvp, G));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, da, da, act->a, (int64_t)G * n, L,
                                                ps->attention_dropout, act->site + 1));
    /* S = Q Kpᵀ: dQ = dS Kp [B,H,n,dh] (reuses doh), dKp (+)= dSᵀ Q */
    LUNA_TRY(luna_bgemm(be, false, false, n, dh, L, 1.0f, da, act->kp, 0.0f, doh, G));
    LUNA_TRY(luna_bgemm(be, true, false, L, dh, n, 1.0f, da, act->q, tied ? 1.0f : 0.0f, dkp, G));

    /* Q = q_proj(X)·scale -> dX; Kp/Vp = proj(Y_P) -> dY_P */
    LUNA_TRY(luna_project_heads_backward(ps, doh, act->x, &w->q_proj, &g->q_proj, dx, B, n, d, H,
                                         scale));
    luna_act *dyp_total; /* [B,L,d] */
    LUNA_TRY(luna_pass_alloc(ps, &dyp_total, Ld, "packed context gradient"));
    if (dyp)
        LUNA_TRY(luna_mem_copy(be, dyp_total, dyp, luna_act_bytes(be, Ld)));
    else
        LUNA_TRY(luna_mem_zero(be, dyp_total, luna_act_bytes(be, Ld)));
    if (tied) {
        LUNA_TRY(luna_project_heads_backward(ps, dkp, act->yp, &w->c_proj, &g->c_proj, dyp_total, B,
                                             L, d, H, 1.0f));
    } else {
        LUNA_TRY(luna_project_heads_backward(ps, dkp, act->yp, &w->k_proj, &g->k_proj, dyp_total, B,
                                             L, d, H, 1.0f));
        LUNA_TRY(luna_project_heads_backward(ps, dvp, act->yp, &w->v_proj, &g->v_proj, dyp_total, B,
                                             L, d, H, 1.0f));
    }

    /* Y_P = merge(A_pack_d Vc): dYp_h [B,H,L,dh] */
    luna_act *dyph;
    LUNA_TRY(luna_pass_alloc(ps, &dyph, Ld, "packed context gradient heads"));
    LUNA_TRY(op->split_heads(be, dyph, dyp_total, B, L, H, dh));
    const int64_t pack_n = (int64_t)G * L * m;
    luna_act *dap, *dkc, *dvc;
    LUNA_TRY(luna_pass_alloc(ps, &dap, pack_n, "pack attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dkc, md, "pack key gradient"));
    dvc = dkc;
    if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvc, md, "pack value gradient"));
    LUNA_TRY(luna_bgemm(be, false, true, L, m, dh, 1.0f, dyph, act->vc, 0.0f, dap, G));
    LUNA_TRY(luna_bgemm(be, true, false, m, dh, L, 1.0f, act->a_pack_d, dyph, 0.0f, dvc, G));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, dap, dap, act->a_pack, (int64_t)G * L, m,
                                                ps->attention_dropout, act->site + 0));
    /* S_pack = Qp Kcᵀ: dQp = dS Kc [B,H,L,dh] (reuses dyph), dKc (+)= dSᵀ Qp */
    LUNA_TRY(luna_bgemm(be, false, false, L, dh, m, 1.0f, dap, act->kc, 0.0f, dyph, G));
    LUNA_TRY(luna_bgemm(be, true, false, m, dh, L, 1.0f, dap, act->qp, tied ? 1.0f : 0.0f, dkc, G));

    LUNA_TRY(luna_project_heads_backward(ps, dyph, act->p, &w->pq_proj, &g->pq_proj, dp, B, L, d, H,
                                         scale));
    if (tied) {
        LUNA_TRY(luna_project_heads_backward(ps, dkc, act->c, &w->pc_proj, &g->pc_proj, dc, B, m, d,
                                             H, 1.0f));
    } else {
        LUNA_TRY(luna_project_heads_backward(ps, dkc, act->c, &w->pk_proj, &g->pk_proj, dc, B, m, d,
                                             H, 1.0f));
        LUNA_TRY(luna_project_heads_backward(ps, dvc, act->c, &w->pv_proj, &g->pv_proj, dc, B, m, d,
                                             H, 1.0f));
    }
    return LUNA_OK;
}

luna_status luna_attention_backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                                    const luna_attn_act *act, const luna_act *dy,
                                    const luna_act *dyp, luna_act *dx, luna_act *dp, luna_act *dc) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = backward(ps, w, g, act, dy, dyp, dx, dp, dc);
    luna_arena_release(ps->arena, mark);
    return st;
}
