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

/* The stride, in floats, between the weights of the maps ws[0..count) (and their biases, all
 * present or all absent), when there is one and the weights do not overlap; else 0. */
static int64_t common_stride(const luna_linear_w *const *ws, int count, int in, int out) {
    if (count < 2) return 0;
    const int64_t s = ws[1]->weight - ws[0]->weight;
    if (s < (int64_t)out * (in > 0 ? in : 1)) return 0;
    for (int i = 0; i < count; i++) {
        if (ws[i]->weight != ws[0]->weight + i * s || !ws[i]->bias != !ws[0]->bias) return 0;
        if (ws[0]->bias && ws[i]->bias != ws[0]->bias + i * s) return 0;
    }
    return s;
}

luna_status luna_project_multi(const luna_pass *ps, luna_act **y, const luna_act *x,
                               const luna_linear_w *const *ws, int count, int64_t rows, int in,
                               int out) {
    luna_backend *be = ps->be;
    const int64_t ny = rows * out;
    LUNA_TRY(luna_pass_alloc(ps, y, count * ny, "attention projections"));
    const int64_t s = common_stride(ws, count, in, out);
    if (s > 0)
        return be->ops->linear_forward_multi(be, *y, x, ws[0]->weight, ws[0]->bias, s, count, rows,
                                             in, out);
    for (int i = 0; i < count; i++)
        LUNA_TRY(be->ops->linear_forward(be, luna_act_at(be, *y, i * ny), x, ws[i]->weight,
                                         ws[i]->bias, rows, in, out));
    return LUNA_OK;
}

luna_status luna_project_multi_backward(const luna_pass *ps, const luna_act *dy, const luna_act *x,
                                        const luna_linear_w *const *ws, luna_linear_w *const *gs,
                                        luna_act *dx, int count, int64_t rows, int in, int out,
                                        bool accumulate_dx) {
    luna_backend *be = ps->be;
    const int64_t s = common_stride(ws, count, in, out);
    if (s > 0 && common_stride((const luna_linear_w *const *)gs, count, in, out) == s)
        return be->ops->linear_backward_multi(be, dx, gs[0]->weight, gs[0]->bias, dy, x,
                                              ws[0]->weight, s, count, rows, in, out,
                                              accumulate_dx);
    for (int i = 0; i < count; i++)
        LUNA_TRY(be->ops->linear_backward(be, dx, gs[i]->weight, gs[i]->bias,
                                          luna_act_at(be, dy, i * rows * out), x, ws[i]->weight,
                                          rows, in, out, accumulate_dx || i > 0));
    return LUNA_OK;
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

/* The maps of the context C the pack attention projects (pc_proj; untied pk_proj, pv_proj), in
 * the parameter table's order (model/param_table.c), which puts them right after q_proj: with_q
 * starts the list with q_proj, the unpack's map of X, for self-attention (C = X), so that all are
 * one linear_forward_multi. Returns their number. */
static int context_projections(const luna_attn_w *w, bool tied, bool with_q,
                               const luna_linear_w **out) {
    int k = 0;
    if (with_q) out[k++] = &w->q_proj;
    if (tied) {
        out[k++] = &w->pc_proj;
    } else {
        out[k++] = &w->pk_proj;
        out[k++] = &w->pv_proj;
    }
    return k;
}

/* The pack with act->kc, act->vc made: A_pack [B,H,L,m] = softmax(dh^-1/2 · Qp Kcᵀ), dropped;
 * Y_P [B,L,d] = A_pack_d Vc, each head into its columns; the unpack's keys/values Kp/Vp [B,L,d]
 * (they depend on P and the context only). */
static luna_status pack_rest(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act) {
    const int B = act->B, m = act->m, L = act->L, d = act->d, H = act->H;
    const luna_attention_shape s = luna_attention_shape_in_rows(B, H, L, m, d, act->c_valid, false);
    LUNA_TRY(luna_pass_alloc(ps, &act->yp, (int64_t)B * L * d, "packed context"));
    LUNA_TRY(luna_attention_core(ps, &s, act->yp, &act->a_pack, &act->a_pack_d, act->qp, act->kc,
                                 act->vc, act->site + 0, "pack attention"));
    if (act->tied) {
        LUNA_TRY(luna_project(ps, &act->kp, act->yp, &w->c_proj, (int64_t)B * L, d, d));
        act->vp = act->kp;
    } else {
        LUNA_TRY(luna_project(ps, &act->kp, act->yp, &w->k_proj, (int64_t)B * L, d, d));
        LUNA_TRY(luna_project(ps, &act->vp, act->yp, &w->v_proj, (int64_t)B * L, d, d));
    }
    return LUNA_OK;
}

/* The pack's fields and Qp [B,L,d] = pq_proj(P). */
static luna_status pack_begin(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
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
    return luna_project(ps, &act->qp, p, &w->pq_proj, (int64_t)B * L, d, d);
}

luna_status luna_attention_pack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                const luna_act *p, const luna_act *c, const int32_t *c_valid, int B,
                                int m, int L, int d, int H, bool tied, uint32_t site) {
    LUNA_TRY(pack_begin(ps, w, act, p, c, c_valid, B, m, L, d, H, tied, site));
    /* Kc/Vc [B,m,d] */
    const luna_linear_w *cw[2];
    const int nc = context_projections(w, tied, false, cw);
    LUNA_TRY(luna_project_multi(ps, &act->kc, c, cw, nc, (int64_t)B * m, d, d));
    act->vc = tied ? act->kc : luna_act_at(ps->be, act->kc, (int64_t)B * m * d);
    return pack_rest(ps, w, act);
}

/* The unpack with act->q made: A [B,H,n,L] = softmax(dh^-1/2 · Q Kpᵀ), dropped; O [B,n,d] = A_d
 * Vp, each head into its columns; Y_X = out_proj(O). */
static luna_status unpack_rest(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act) {
    luna_backend *be = ps->be;
    const int B = act->B, n = act->n, L = act->L, d = act->d, H = act->H;
    const luna_attention_shape s = luna_attention_shape_in_rows(B, H, n, L, d, act->p_valid, false);
    LUNA_TRY(luna_pass_alloc(ps, &act->o, (int64_t)B * n * d, "attention output"));
    LUNA_TRY(luna_attention_core(ps, &s, act->o, &act->a, &act->a_d, act->q, act->kp, act->vp,
                                 act->site + 1, "unpack attention"));
    LUNA_TRY(luna_pass_alloc(ps, &act->y, (int64_t)B * n * d, "attention result"));
    return be->ops->linear_forward(be, act->y, act->o, w->out_proj.weight, NULL, (int64_t)B * n, d,
                                   d);
}

luna_status luna_attention_unpack(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                  const luna_act *x, const int32_t *p_valid, int n) {
    act->x = x;
    act->n = n;
    act->p_valid = p_valid;
    /* Q [B,n,d] */
    LUNA_TRY(luna_project(ps, &act->q, x, &w->q_proj, (int64_t)act->B * n, act->d, act->d));
    return unpack_rest(ps, w, act);
}

luna_status luna_attention_forward(const luna_pass *ps, const luna_attn_w *w, luna_attn_act *act,
                                   const luna_act *x, const luna_act *p, const luna_act *c,
                                   const int32_t *c_valid, const int32_t *p_valid, int B, int n,
                                   int m, int L, int d, int H, bool tied, uint32_t site) {
    if (c != x || n != m) {
        LUNA_TRY(luna_attention_pack(ps, w, act, p, c, c_valid, B, m, L, d, H, tied, site));
        return luna_attention_unpack(ps, w, act, x, p_valid, n);
    }
    /* self-attention: Q and Kc (Vc) are projections of X, one call ([B,n,d] each) */
    LUNA_TRY(pack_begin(ps, w, act, p, c, c_valid, B, m, L, d, H, tied, site));
    const luna_linear_w *xw[3];
    const int nxw = context_projections(w, tied, true, xw);
    const int64_t nd = (int64_t)B * n * d;
    LUNA_TRY(luna_project_multi(ps, &act->q, x, xw, nxw, (int64_t)B * n, d, d));
    act->kc = luna_act_at(ps->be, act->q, nd);
    act->vc = tied ? act->kc : luna_act_at(ps->be, act->q, 2 * nd);
    act->self = true;
    LUNA_TRY(pack_rest(ps, w, act));
    act->x = x;
    act->n = n;
    act->p_valid = p_valid;
    return unpack_rest(ps, w, act);
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
    /* self-attention into one dx: dQ, dKc (and dVc) side by side for one backward of the
     * projections of X at the end (the order q, then the context's, as the separate calls) */
    const bool joint = act->self && dx == dc;
    luna_act *dq = d_o, *dxp = NULL;
    if (joint) {
        LUNA_TRY(luna_pass_alloc(ps, &dxp, (tied ? 2 : 3) * nd, "self-attention gradients"));
        dq = dxp;
    }
    const luna_attention_shape su =
        luna_attention_shape_in_rows(B, H, n, L, d, act->p_valid, false);
    LUNA_TRY(luna_attention_core_backward(ps, &su, dq, dkp, dvp, d_o, act->q, act->kp, act->vp,
                                          act->a, act->a_d, act->site + 1));

    /* Q = q_proj(X) -> dX; Kp/Vp = proj(Y_P) -> dY_P */
    if (!joint)
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
    if (joint) {
        dkc = luna_act_at(be, dxp, nd);
        dvc = tied ? dkc : luna_act_at(be, dxp, 2 * nd);
    } else {
        LUNA_TRY(luna_pass_alloc(ps, &dkc, md, "pack key gradient"));
        dvc = dkc;
        if (!tied) LUNA_TRY(luna_pass_alloc(ps, &dvc, md, "pack value gradient"));
    }
    luna_act *dqp = dyp_total;
    const luna_attention_shape sp =
        luna_attention_shape_in_rows(B, H, L, m, d, act->c_valid, false);
    LUNA_TRY(luna_attention_core_backward(ps, &sp, dqp, dkc, dvc, dyp_total, act->qp, act->kc,
                                          act->vc, act->a_pack, act->a_pack_d, act->site + 0));

    LUNA_TRY(project_backward(ps, dqp, act->p, &w->pq_proj, &g->pq_proj, dp, (int64_t)B * L, d));
    if (joint) {
        const luna_linear_w *xw[3];
        luna_linear_w *xg[3];
        const int nxw = context_projections(w, tied, true, xw);
        (void)context_projections(g, tied, true, (const luna_linear_w **)xg);
        return luna_project_multi_backward(ps, dxp, act->x, xw, xg, dx, nxw, (int64_t)B * n, d, d,
                                           true);
    }
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
