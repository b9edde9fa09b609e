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

luna_attention_shape luna_attention_shape_in_rows(int B, int H, int n, int m, int d,
                                                  const int32_t *valid_cols, bool causal) {
    const int dh = d / H;
    const luna_heads_layout hn = luna_heads_in_rows(n, d, dh), hm = luna_heads_in_rows(m, d, dh);
    return (luna_attention_shape){.B = B,
                                  .H = H,
                                  .n = n,
                                  .m = m,
                                  .dh = dh,
                                  .scale = 1.0f / sqrtf((float)dh),
                                  .valid_cols = valid_cols,
                                  .causal = causal,
                                  .ldq = hn.ld,
                                  .ldk = hm.ld,
                                  .ldv = hm.ld,
                                  .ldo = hn.ld,
                                  .sq = hn.s,
                                  .sk = hm.s,
                                  .sv = hm.s,
                                  .so = hn.s};
}

luna_status luna_attention_core(const luna_pass *ps, const luna_attention_shape *s, luna_act *o,
                                luna_act **a, luna_act **a_d, const luna_act *q, const luna_act *k,
                                const luna_act *v, uint32_t site, const char *what) {
    const int64_t count = (int64_t)s->B * s->H * s->n * s->m;
    const bool drop = luna_pass_drops(ps, ps->attention_dropout);
    LUNA_TRY(luna_pass_alloc(ps, a, count, what));
    *a_d = *a;
    if (drop) LUNA_TRY(luna_pass_alloc(ps, a_d, count, what));
    return ps->be->ops->attention_forward(ps->be, o, *a, drop ? *a_d : NULL, q, k, v, s,
                                          drop ? ps->attention_dropout : 0.0f,
                                          luna_pass_key(ps, site));
}

luna_status luna_attention_core_backward(const luna_pass *ps, const luna_attention_shape *s,
                                         luna_act *dq, luna_act *dk, luna_act *dv,
                                         const luna_act *d_o, const luna_act *q, const luna_act *k,
                                         const luna_act *v, const luna_act *a, const luna_act *a_d,
                                         uint32_t site) {
    const bool drop = luna_pass_drops(ps, ps->attention_dropout);
    luna_act *ds;
    LUNA_TRY(luna_pass_alloc(ps, &ds, (int64_t)s->B * s->H * s->n * s->m,
                             "attention probability gradient"));
    return ps->be->ops->attention_backward(
        ps->be, dq, dk, dv, ds, d_o, q, k, v, a, drop ? a_d : NULL, s,
        drop ? ps->attention_dropout : 0.0f, luna_pass_key(ps, site));
}

/* ---- forward --------------------------------------------------------------------------------- */

luna_status luna_attention_pack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                const luna_act *p, const luna_act *c, const int32_t *c_valid, int B,
                                int m, int L, int d, int H, bool tied, uint32_t site) {
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

    /* pack: Qp [B,L,d], Kc/Vc [B,m,d] */
    LUNA_TRY(luna_project(ps, &act->qp, p, &w->pq_proj, (int64_t)B * L, d, d));
    if (tied) {
        LUNA_TRY(luna_project(ps, &act->kc, c, &w->pc_proj, (int64_t)B * m, d, d));
        act->vc = act->kc;
    } else {
        LUNA_TRY(luna_project(ps, &act->kc, c, &w->pk_proj, (int64_t)B * m, d, d));
        LUNA_TRY(luna_project(ps, &act->vc, c, &w->pv_proj, (int64_t)B * m, d, d));
    }
    /* A_pack [B,H,L,m] = softmax(dh^-1/2 · Qp Kcᵀ), dropped; Y_P [B,L,d] = A_pack_d Vc, each
     * head into its columns */
    const luna_attention_shape s = luna_attention_shape_in_rows(B, H, L, m, d, c_valid, false);
    LUNA_TRY(luna_pass_alloc(ps, &act->yp, (int64_t)B * L * d, "packed context"));
    LUNA_TRY(luna_attention_core(ps, &s, act->yp, &act->a_pack, &act->a_pack_d, act->qp, act->kc,
                                 act->vc, site + 0, "pack attention"));
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
    const int B = act->B, L = act->L, d = act->d, H = act->H;
    act->x = x;
    act->n = n;
    act->p_valid = p_valid;
    /* unpack: Q [B,n,d]; A [B,H,n,L] = softmax(dh^-1/2 · Q Kpᵀ), dropped; O [B,n,d] = A_d Vp,
     * each head into its columns; Y_X = out_proj(O) */
    LUNA_TRY(luna_project(ps, &act->q, x, &w->q_proj, (int64_t)B * n, d, d));
    const luna_attention_shape s = luna_attention_shape_in_rows(B, H, n, L, d, p_valid, false);
    LUNA_TRY(luna_pass_alloc(ps, &act->o, (int64_t)B * n * d, "attention output"));
    LUNA_TRY(luna_attention_core(ps, &s, act->o, &act->a, &act->a_d, act->q, act->kp, act->vp,
                                 act->site + 1, "unpack attention"));
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
    const bool tied = act->tied;
    const int64_t nd = (int64_t)B * n * d, Ld = (int64_t)B * L * d, md = (int64_t)B * m * d;

    /* Y_X = out_proj(O): dO [B,n,d] */
    luna_act *d_o;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "attention gradient"));
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));

    /* unpack attention (O = A_d Vp, A = softmax(s·Q Kpᵀ)): dQ [B,n,d] (into dO's buffer), dKp
     * and dVp [B,L,d] (one buffer, their sum, when tied) */
    luna_act *dkp, *dvp;
    LUNA_TRY(luna_pass_alloc(ps, &dkp, Ld, "unpack key gradient"));
    dvp = dkp;
    if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvp, Ld, "unpack value gradient"));
    luna_act *dq = d_o;
    const luna_attention_shape su =
        luna_attention_shape_in_rows(B, H, n, L, d, act->p_valid, false);
    LUNA_TRY(luna_attention_core_backward(ps, &su, dq, dkp, dvp, d_o, act->q, act->kp, act->vp,
                                          act->a, act->a_d, act->site + 1));

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

    /* pack attention (Y_P = A_pack_d Vc, A_pack = softmax(s·Qp Kcᵀ)): dQp [B,L,d] (into dY_P's
     * buffer), dKc and dVc [B,m,d] (one buffer, their sum, when tied) */
    luna_act *dkc, *dvc;
    LUNA_TRY(luna_pass_alloc(ps, &dkc, md, "pack key gradient"));
    dvc = dkc;
    if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvc, md, "pack value gradient"));
    luna_act *dqp = dyp_total;
    const luna_attention_shape sp =
        luna_attention_shape_in_rows(B, H, L, m, d, act->c_valid, false);
    LUNA_TRY(luna_attention_core_backward(ps, &sp, dqp, dkc, dvc, dyp_total, act->qp, act->kc,
                                          act->vc, act->a_pack, act->a_pack_d, act->site + 0));

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
