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
    if (len == 1) /* [B, 1, H, dh] is [B, H, 1, dh]: a decoding step's rows need no split */
        return luna_linear_scaled(ps, *heads, x, w, rows, d, d, scale);
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

luna_status luna_project(const luna_pass *ps, luna_act **y, const luna_act *x,
                         const luna_linear_w *w, int64_t rows, int in, int out) {
    LUNA_TRY(luna_pass_alloc(ps, y, rows * out, "attention projection"));
    return ps->be->ops->linear_forward(ps->be, *y, x, w->weight, w->bias, rows, in, out);
}

luna_status luna_heads_gemm(luna_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                            const luna_act *A, luna_heads_layout la, const luna_act *Bm,
                            luna_heads_layout lb, float beta, luna_act *C, luna_heads_layout lc,
                            int B, int H) {
    return be->ops->gemm_grid(be, ta, tb, M, N, K, alpha, A, la.ld, la.s, Bm, lb.ld, lb.s, beta, C,
                              lc.ld, lc.s, B, H);
}

/* ---- forward --------------------------------------------------------------------------------- */

luna_status luna_attention_pack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                const luna_act *p, const luna_act *c, const int32_t *c_valid, int B,
                                int m, int L, int d, int H, bool tied, uint32_t site) {
    luna_backend *be = ps->be;
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
    const luna_heads_layout hL = luna_heads_in_rows(L, d, dh), hm = luna_heads_in_rows(m, d, dh);

    /* pack: Qp [B,L,d], Kc/Vc [B,m,d] */
    LUNA_TRY(luna_project(ps, &act->qp, p, &w->pq_proj, (int64_t)B * L, d, d));
    if (tied) {
        LUNA_TRY(luna_project(ps, &act->kc, c, &w->pc_proj, (int64_t)B * m, d, d));
        act->vc = act->kc;
    } else {
        LUNA_TRY(luna_project(ps, &act->kc, c, &w->pk_proj, (int64_t)B * m, d, d));
        LUNA_TRY(luna_project(ps, &act->vc, c, &w->pv_proj, (int64_t)B * m, d, d));
    }
    /* A_pack [B,H,L,m] = softmax(dh^-1/2 · Qp Kcᵀ) */
    LUNA_TRY(luna_pass_alloc(ps, &act->a_pack, (int64_t)G * L * m, "pack attention"));
    LUNA_TRY(luna_heads_gemm(be, false, true, L, m, dh, scale, act->qp, hL, act->kc, hm, 0.0f,
                             act->a_pack, luna_heads_packed(L, m, H), B, H));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a_pack, &act->a_pack_d, act->a_pack, (int64_t)G * L,
                                       m, c_valid, (int64_t)H * L, 0, ps->attention_dropout,
                                       site + 0, "pack attention dropout"));
    /* Y_P [B,L,d] = A_pack_d Vc, each head into its columns */
    LUNA_TRY(luna_pass_alloc(ps, &act->yp, (int64_t)B * L * d, "packed context"));
    LUNA_TRY(luna_heads_gemm(be, false, false, L, dh, m, 1.0f, act->a_pack_d,
                             luna_heads_packed(L, m, H), act->vc, hm, 0.0f, act->yp, hL, B, H));
    /* unpack keys/values Kp/Vp [B,L,d]: they depend on P and the context only */
    if (tied) {
        LUNA_TRY(luna_project(ps, &act->kp, act->yp, &w->c_proj, (int64_t)B * L, d, d));
        act->vp = act->kp;
    } else {
        LUNA_TRY(luna_project(ps, &act->kp, act->yp, &w->k_proj, (int64_t)B * L, d, d));
        LUNA_TRY(luna_project(ps, &act->vp, act->yp, &w->v_proj, (int64_t)B * L, d, d));
    }
    return LUNA_OK;
}

luna_status luna_attention_unpack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                  const luna_act *x, const int32_t *p_valid, int n) {
    luna_backend *be = ps->be;
    const int B = act->B, L = act->L, d = act->d, H = act->H, dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    const luna_heads_layout hn = luna_heads_in_rows(n, d, dh), hL = luna_heads_in_rows(L, d, dh);
    act->x = x;
    act->n = n;
    act->p_valid = p_valid;
    /* unpack: Q [B,n,d]; A [B,H,n,L] = softmax(dh^-1/2 · Q Kpᵀ) */
    LUNA_TRY(luna_project(ps, &act->q, x, &w->q_proj, (int64_t)B * n, d, d));
    LUNA_TRY(luna_pass_alloc(ps, &act->a, (int64_t)G * n * L, "unpack attention"));
    LUNA_TRY(luna_heads_gemm(be, false, true, n, L, dh, scale, act->q, hn, act->kp, hL, 0.0f,
                             act->a, luna_heads_packed(n, L, H), B, H));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a, &act->a_d, act->a, (int64_t)G * n, L, p_valid,
                                       (int64_t)H * n, 0, ps->attention_dropout, act->site + 1,
                                       "unpack attention dropout"));
    /* O [B,n,d] = A_d Vp, each head into its columns; Y_X = out_proj(O) */
    LUNA_TRY(luna_pass_alloc(ps, &act->o, (int64_t)B * n * d, "attention output"));
    LUNA_TRY(luna_heads_gemm(be, false, false, n, dh, L, 1.0f, act->a_d, luna_heads_packed(n, L, H),
                             act->vp, hL, 0.0f, act->o, hn, B, H));
    LUNA_TRY(luna_pass_alloc(ps, &act->y, (int64_t)B * n * d, "attention result"));
    return be->ops->linear_forward(be, act->y, act->o, w->out_proj.weight, NULL, (int64_t)B * n, d,
                                   d);
}

luna_status luna_attention_forward(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                   const luna_act *x, const luna_act *p, const luna_act *c,
                                   const int32_t *c_valid, const int32_t *p_valid, int B, int n,
                                   int m, int L, int d, int H, bool tied, uint32_t site) {
    LUNA_TRY(luna_attention_pack(ps, w, act, p, c, c_valid, B, m, L, d, H, tied, site));
    return luna_attention_unpack(ps, w, act, x, p_valid, n);
}

/* ---- backward -------------------------------------------------------------------------------- */

/* dx += the gradient through y = x Wᵀ + b, given dy; dW, db += theirs. */
static luna_status project_backward(const luna_pass *ps, const luna_act *dy, const luna_act *x,
                                    const luna_linear_w *w, luna_linear_w *g, luna_act *dx,
                                    int64_t rows, int d) {
    return ps->be->ops->linear_backward(ps->be, dx, g->weight, g->bias, dy, x, w->weight, rows, d,
                                        d, true);
}

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
    const luna_heads_layout hn = luna_heads_in_rows(n, d, dh), hL = luna_heads_in_rows(L, d, dh),
                            hm = luna_heads_in_rows(m, d, dh);
    const luna_heads_layout hnL = luna_heads_packed(n, L, H), hLm = luna_heads_packed(L, m, H);

    /* Y_X = out_proj(O): dO [B,n,d] */
    luna_act *d_o;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "attention gradient"));
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));

    /* O_h = A_d Vp_h: dA_d = dO_h Vp_hᵀ [B,H,n,L], dVp_h = A_dᵀ dO_h [B,L,d] */
    luna_act *da, *dkp, *dvp;
    LUNA_TRY(luna_pass_alloc(ps, &da, (int64_t)G * n * L, "unpack attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dkp, Ld, "unpack key gradient"));
    dvp = dkp;
    if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvp, Ld, "unpack value gradient"));
    LUNA_TRY(luna_heads_gemm(be, false, true, n, L, dh, 1.0f, d_o, hn, act->vp, hL, 0.0f, da, hnL,
                             B, H));
    LUNA_TRY(luna_heads_gemm(be, true, false, L, dh, n, 1.0f, act->a_d, hnL, d_o, hn, 0.0f, dvp, hL,
                             B, H));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, da, da, act->a, (int64_t)G * n, L,
                                                ps->attention_dropout, act->site + 1));
    /* S = s·Q Kpᵀ (s = dh^-1/2): dQ = s·dS Kp [B,n,d] (into dO's buffer), dKp (+)= s·dSᵀ Q */
    luna_act *dq = d_o;
    LUNA_TRY(luna_heads_gemm(be, false, false, n, dh, L, scale, da, hnL, act->kp, hL, 0.0f, dq, hn,
                             B, H));
    LUNA_TRY(luna_heads_gemm(be, true, false, L, dh, n, scale, da, hnL, act->q, hn,
                             tied ? 1.0f : 0.0f, dkp, hL, B, H));

    /* Q = q_proj(X) -> dX; Kp/Vp = proj(Y_P) -> dY_P */
    LUNA_TRY(project_backward(ps, dq, act->x, &w->q_proj, &g->q_proj, dx, (int64_t)B * n, d));
    luna_act *dyp_total; /* [B,L,d] */
    LUNA_TRY(luna_pass_alloc(ps, &dyp_total, Ld, "packed context gradient"));
    if (dyp)
        LUNA_TRY(luna_mem_copy(be, dyp_total, dyp, luna_act_bytes(be, Ld)));
    else
        LUNA_TRY(luna_mem_zero(be, dyp_total, luna_act_bytes(be, Ld)));
    if (tied) {
        LUNA_TRY(project_backward(ps, dkp, act->yp, &w->c_proj, &g->c_proj, dyp_total,
                                  (int64_t)B * L, d));
    } else {
        LUNA_TRY(project_backward(ps, dkp, act->yp, &w->k_proj, &g->k_proj, dyp_total,
                                  (int64_t)B * L, d));
        LUNA_TRY(project_backward(ps, dvp, act->yp, &w->v_proj, &g->v_proj, dyp_total,
                                  (int64_t)B * L, d));
    }

    /* Y_P,h = A_pack_d Vc_h: dA_pack_d = dY_P,h Vc_hᵀ [B,H,L,m], dVc_h = A_pack_dᵀ dY_P,h */
    luna_act *dap, *dkc, *dvc;
    LUNA_TRY(luna_pass_alloc(ps, &dap, (int64_t)G * L * m, "pack attention gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dkc, md, "pack key gradient"));
    dvc = dkc;
    if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvc, md, "pack value gradient"));
    LUNA_TRY(luna_heads_gemm(be, false, true, L, m, dh, 1.0f, dyp_total, hL, act->vc, hm, 0.0f, dap,
                             hLm, B, H));
    LUNA_TRY(luna_heads_gemm(be, true, false, m, dh, L, 1.0f, act->a_pack_d, hLm, dyp_total, hL,
                             0.0f, dvc, hm, B, H));
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, dap, dap, act->a_pack, (int64_t)G * L, m,
                                                ps->attention_dropout, act->site + 0));
    /* S_pack = s·Qp Kcᵀ: dQp = s·dS Kc [B,L,d] (into dY_P's buffer), dKc (+)= s·dSᵀ Qp */
    luna_act *dqp = dyp_total;
    LUNA_TRY(luna_heads_gemm(be, false, false, L, dh, m, scale, dap, hLm, act->kc, hm, 0.0f, dqp,
                             hL, B, H));
    LUNA_TRY(luna_heads_gemm(be, true, false, m, dh, L, scale, dap, hLm, act->qp, hL,
                             tied ? 1.0f : 0.0f, dkc, hm, B, H));

    LUNA_TRY(project_backward(ps, dqp, act->p, &w->pq_proj, &g->pq_proj, dp, (int64_t)B * L, d));
    if (tied) {
        LUNA_TRY(
            project_backward(ps, dkc, act->c, &w->pc_proj, &g->pc_proj, dc, (int64_t)B * m, d));
    } else {
        LUNA_TRY(
            project_backward(ps, dkc, act->c, &w->pk_proj, &g->pk_proj, dc, (int64_t)B * m, d));
        LUNA_TRY(
            project_backward(ps, dvc, act->c, &w->pv_proj, &g->pv_proj, dc, (int64_t)B * m, d));
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
