#include "model/causal_luna_attention.h"

#include <math.h>

#include "model/luna_attention.h"

static luna_status phi_forward(luna_backend *be, luna_causal_activation a, luna_act *y,
                               const luna_act *z, int64_t n) {
    return a == LUNA_CAUSAL_ELU ? be->ops->elu_plus_one_forward(be, y, z, n)
                                : be->ops->softplus_ln2_forward(be, y, z, n);
}

static luna_status phi_backward(luna_backend *be, luna_causal_activation a, luna_act *dz,
                                const luna_act *dphi, const luna_act *z, int64_t n) {
    return a == LUNA_CAUSAL_ELU ? be->ops->elu_plus_one_backward(be, dz, dphi, z, n)
                                : be->ops->softplus_ln2_backward(be, dz, dphi, z, n);
}

/* ---- training form --------------------------------------------------------------------------- */

/* The causal contractions' rows: the dh-long ones (Q, K, V, O and their gradients) are the heads
 * of [B, n, d] activations, the L-long ones (Φ, S, A) packed [B, H, n, L]. heads_on_p: the
 * (Q, K, Φ) product (p = dh, q = L); else the (A, Φ, V) one (p = L, q = dh). */
static luna_causal_layout causal_layout(int n, int L, int d, int H, bool heads_on_p) {
    const int dh = d / H;
    const int64_t heads_outer = (int64_t)n * d, packed_outer = (int64_t)H * n * L;
    if (heads_on_p)
        return (luna_causal_layout){.H = H,
                                    .p_ld = d,
                                    .q_ld = L,
                                    .p_outer = heads_outer,
                                    .p_inner = dh,
                                    .q_outer = packed_outer,
                                    .q_inner = (int64_t)n * L};
    return (luna_causal_layout){.H = H,
                                .p_ld = L,
                                .q_ld = d,
                                .p_outer = packed_outer,
                                .p_inner = (int64_t)n * L,
                                .q_outer = heads_outer,
                                .q_inner = dh};
}

/* The maps of the layer input X in the parameter table's order (model/param_table.c: q_proj,
 * pc_proj, then c_proj, or k_proj and v_proj untied), so that they are one linear_forward_multi:
 * Q, the P-context, K (= V tied), V. Returns their number. */
static int x_projections(const luna_attn_w *w, bool tied, const luna_linear_w **out) {
    out[0] = &w->q_proj;
    out[1] = &w->pc_proj;
    if (tied) {
        out[2] = &w->c_proj;
        return 3;
    }
    out[2] = &w->k_proj;
    out[3] = &w->v_proj;
    return 4;
}

luna_status luna_causal_attention_forward(const luna_pass *ps, const luna_attn_w *w,
                                          luna_causal_act *act, const luna_act *x,
                                          const luna_act *p, const int32_t *p_valid, int B, int n,
                                          int L, int d, int H, bool tied,
                                          luna_causal_activation activation, uint32_t site) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    *act = (luna_causal_act){.B = B,
                             .n = n,
                             .L = L,
                             .d = d,
                             .H = H,
                             .tied = tied,
                             .activation = activation,
                             .site = site,
                             .x = x,
                             .p = p,
                             .p_valid = p_valid};
    const int64_t nL = (int64_t)G * n * L, nd = (int64_t)B * n * d;
    const luna_causal_layout qk = causal_layout(n, L, d, H, true),
                             av = causal_layout(n, L, d, H, false);

    /* 1. pq_proj(P) [B,L,d]; the projections of X [B,n,d]: Q (unscaled: dh^-1/2 is the
     * contraction's alpha), pc_proj, K = V = c_proj (untied: k_proj, v_proj), in one call */
    LUNA_TRY(luna_project(ps, &act->pt, p, &w->pq_proj, (int64_t)B * L, d, d));
    const luna_linear_w *xw[4];
    const int nx = x_projections(w, tied, xw);
    luna_act *xp;
    LUNA_TRY(luna_project_multi(ps, &xp, x, xw, nx, (int64_t)B * n, d, d));
    act->q = xp;
    act->pc = luna_act_at(be, xp, nd);
    act->k = luna_act_at(be, xp, 2 * nd);
    act->v = tied ? act->k : luna_act_at(be, xp, 3 * nd);

    /* 2. Φ = φ(pc P̃ᵀ) [B,H,n,L] with P̃ = dh^-1/2 · pq_proj(P) (the scale in the GEMM's alpha),
     * dropped */
    LUNA_TRY(luna_pass_alloc(ps, &act->z, nL, "causal projection scores"));
    LUNA_TRY(luna_heads_gemm(be, false, true, n, L, dh, scale, act->pc,
                             luna_heads_in_rows(n, d, dh), act->pt, luna_heads_in_rows(L, d, dh),
                             0.0f, act->z, luna_heads_packed(n, L, H), B, H));
    LUNA_TRY(luna_pass_alloc(ps, &act->phi_d, nL, "causal projection weights"));
    LUNA_TRY(phi_forward(be, activation, act->phi_d, act->z, nL));
    LUNA_TRY(luna_pass_dropout(ps, act->phi_d, act->phi_d, nL, ps->attention_dropout, site + 2));

    /* 4-5. S_t = (dh^-1/2/t) Σ_{s≤t} (Q_t·K_s) Φ_s; A = softmax_L(S) with the P mask, dropped */
    LUNA_TRY(luna_pass_alloc(ps, &act->a, nL, "causal attention"));
    LUNA_TRY(op->causal_contraction_forward(be, act->a, act->q, act->k, act->phi_d, G, n, dh, L,
                                            scale, &qk));
    LUNA_TRY(luna_pass_softmax_dropout(ps, act->a, &act->a_d, act->a, (int64_t)G * n, L, p_valid,
                                       (int64_t)H * n, 0, ps->attention_dropout, site + 3,
                                       "causal attention dropout"));

    /* 6-7. O_t = (1/t) Σ_{s≤t} (A_t·Φ_s) V_s, each head into its columns; Y = out_proj(O) */
    LUNA_TRY(luna_pass_alloc(ps, &act->o, nd, "causal attention output"));
    LUNA_TRY(op->causal_contraction_forward(be, act->o, act->a_d, act->phi_d, act->v, G, n, L, dh,
                                            1.0f, &av));
    LUNA_TRY(luna_pass_alloc(ps, &act->y, nd, "causal attention result"));
    return op->linear_forward(be, act->y, act->o, w->out_proj.weight, NULL, (int64_t)B * n, d, d);
}

/* dx += the gradient through y = x Wᵀ + b, given dy; dW, db += theirs. */
static luna_status project_backward(const luna_pass *ps, const luna_act *dy, const luna_act *x,
                                    const luna_linear_w *w, luna_linear_w *g, luna_act *dx,
                                    int64_t rows, int d) {
    return ps->be->ops->linear_backward(ps->be, dx, g->weight, g->bias, dy, x, w->weight, rows, d,
                                        d, true);
}

static luna_status backward(const luna_pass *ps, const luna_attn_w *w, luna_attn_w *g,
                            const luna_causal_act *act, const luna_act *dy, luna_act *dx,
                            luna_act *dp) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = act->B, n = act->n, L = act->L, d = act->d, H = act->H;
    const int dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    const int64_t nL = (int64_t)G * n * L, nd = (int64_t)B * n * d, Ld = (int64_t)B * L * d;
    const luna_causal_layout qk = causal_layout(n, L, d, H, true),
                             av = causal_layout(n, L, d, H, false);

    /* 7. out_proj: dO [B,n,d] */
    luna_act *d_o;
    LUNA_TRY(luna_pass_alloc(ps, &d_o, nd, "causal attention gradient"));
    LUNA_TRY(op->linear_backward(be, d_o, g->out_proj.weight, NULL, dy, act->o, w->out_proj.weight,
                                 (int64_t)B * n, d, d, false));

    /* 6. O = contraction(A_d, Φ_d, V): dA_d, dΦ (first part), dV */
    luna_act *da, *dphi, *dphi2, *dq, *dk, *dv;
    LUNA_TRY(luna_pass_alloc(ps, &da, nL, "causal attention probability gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dphi, nL, "causal projection weight gradient"));
    LUNA_TRY(luna_pass_alloc(ps, &dphi2, nL, "causal projection weight gradient"));
    /* the gradients of X's projections side by side, in x_projections' order */
    luna_act *dxp;
    const luna_linear_w *xw[4];
    luna_linear_w *xg[4];
    const int nx = x_projections(w, act->tied, xw);
    (void)x_projections(g, act->tied, (const luna_linear_w **)xg);
    LUNA_TRY(luna_pass_alloc(ps, &dxp, nx * nd, "causal projection gradients"));
    dq = dxp;
    luna_act *const dpc = luna_act_at(be, dxp, nd);
    dk = luna_act_at(be, dxp, 2 * nd);
    if (act->tied)
        LUNA_TRY(luna_pass_alloc(ps, &dv, nd, "causal value gradient"));
    else
        dv = luna_act_at(be, dxp, 3 * nd);
    LUNA_TRY(op->causal_contraction_backward(be, da, dphi, dv, d_o, act->a_d, act->phi_d, act->v, G,
                                             n, L, dh, 1.0f, &av));
    /* 5. dropout and softmax */
    LUNA_TRY(luna_pass_softmax_dropout_backward(ps, da, da, act->a, (int64_t)G * n, L,
                                                ps->attention_dropout, act->site + 3));
    /* 4. S = contraction(Q, K, Φ_d) with alpha dh^-1/2: dQ, dK, dΦ (second part) */
    LUNA_TRY(op->causal_contraction_backward(be, dq, dk, dphi2, da, act->q, act->k, act->phi_d, G,
                                             n, dh, L, scale, &qk));
    LUNA_TRY(op->add(be, dphi, dphi, dphi2, nL));
    if (act->tied) LUNA_TRY(op->add(be, dk, dk, dv, nd));

    /* 2. Φ = dropout(φ(Z)), Z = dh^-1/2 · pc pq_projᵀ: dZ (into dphi); dpc = dh^-1/2 · dZ pq_proj;
     * dpq_proj = dh^-1/2 · dZᵀ pc (per head, into the heads' columns) */
    LUNA_TRY(luna_pass_dropout_backward(ps, dphi, dphi, nL, ps->attention_dropout, act->site + 2));
    LUNA_TRY(phi_backward(be, act->activation, dphi, dphi, act->z, nL));
    luna_act *dpt;
    LUNA_TRY(luna_pass_alloc(ps, &dpt, Ld, "causal P gradient"));
    const luna_heads_layout hn = luna_heads_in_rows(n, d, dh), hL = luna_heads_in_rows(L, d, dh);
    const luna_heads_layout hnL = luna_heads_packed(n, L, H);
    LUNA_TRY(luna_heads_gemm(be, false, false, n, dh, L, scale, dphi, hnL, act->pt, hL, 0.0f, dpc,
                             hn, B, H));
    LUNA_TRY(luna_heads_gemm(be, true, false, L, dh, n, scale, dphi, hnL, act->pc, hn, 0.0f, dpt,
                             hL, B, H));

    /* 1: the projections */
    LUNA_TRY(project_backward(ps, dpt, act->p, &w->pq_proj, &g->pq_proj, dp, (int64_t)B * L, d));
    return luna_project_multi_backward(ps, dxp, act->x, xw, xg, dx, nx, (int64_t)B * n, d, d, true);
}

luna_status luna_causal_attention_backward(const luna_pass *ps, const luna_attn_w *w,
                                           luna_attn_w *g, const luna_causal_act *act,
                                           const luna_act *dy, luna_act *dx, luna_act *dp) {
    luna_arena_mark mark = luna_arena_get_mark(ps->arena);
    luna_status st = backward(ps, w, g, act, dy, dx, dp);
    luna_arena_release(ps->arena, mark);
    return st;
}

/* ---- incremental decoding -------------------------------------------------------------------- */

size_t luna_causal_state_bytes(const luna_backend *be, int L, int d) {
    return luna_act_bytes(be, (int64_t)3 * L * d);
}

luna_status luna_causal_state_init(luna_backend *be, luna_arena *arena, const luna_attn_w *w,
                                   luna_causal_state *st, const luna_act *p, const int32_t *p_valid,
                                   int B, int L, int d, int H, bool tied,
                                   luna_causal_activation activation) {
    luna_pass ps = {.be = be, .arena = arena};
    const int64_t Ld = (int64_t)B * L * d;
    *st = (luna_causal_state){
        .B = B, .L = L, .d = d, .H = H, .tied = tied, .activation = activation, .p_valid = p_valid};
    LUNA_TRY(
        luna_project_heads(&ps, &st->pt, p, &w->pq_proj, B, L, d, H, 1.0f / sqrtf((float)(d / H))));
    LUNA_TRY(luna_pass_alloc(&ps, &st->ksum, Ld, "causal decoding state"));
    LUNA_TRY(luna_pass_alloc(&ps, &st->vsum, Ld, "causal decoding state"));
    LUNA_TRY(luna_mem_zero(be, st->ksum, luna_act_bytes(be, Ld)));
    LUNA_TRY(luna_mem_zero(be, st->vsum, luna_act_bytes(be, Ld)));
    return LUNA_OK;
}

static luna_status step(luna_pass *ps, const luna_attn_w *w, luna_causal_state *st,
                        const luna_act *x, luna_act *y) {
    luna_backend *be = ps->be;
    const luna_ops *op = be->ops;
    const int B = st->B, L = st->L, d = st->d, H = st->H, dh = d / H, G = B * H;
    const float scale = 1.0f / sqrtf((float)dh);
    /* Φ_t = φ(pc_proj(x) P̃ᵀ) [G, 1, L] */
    luna_act *xp, *pc, *phi, *q, *k, *v, *s, *o;
    /* q (scaled), pc, k (and v) of the one position: [B, 1, H, dh] is [B, H, 1, dh] */
    const luna_linear_w *xw[4];
    const int nx = x_projections(w, st->tied, xw);
    const int64_t Bd = (int64_t)B * d;
    LUNA_TRY(luna_project_multi(ps, &xp, x, xw, nx, B, d, d));
    q = xp;
    if (scale != 1.0f) LUNA_TRY(op->scale_act(be, q, scale, Bd));
    pc = luna_act_at(be, xp, Bd);
    k = luna_act_at(be, xp, 2 * Bd);
    v = st->tied ? k : luna_act_at(be, xp, 3 * Bd);
    LUNA_TRY(luna_pass_alloc(ps, &phi, (int64_t)G * L, "causal step"));
    LUNA_TRY(luna_bgemm(be, false, true, 1, L, dh, 1.0f, pc, st->pt, 0.0f, phi, G));
    LUNA_TRY(phi_forward(be, st->activation, phi, phi, (int64_t)G * L));
    st->t++;
    /* Σ K Φᵀ += k_tᵀ φ_t [dh, L]; S_t = q_t Σ K Φᵀ / t (t each row's own, in-flight rows at
     * different positions); A_t = softmax with the P mask */
    LUNA_TRY(luna_bgemm(be, true, false, dh, L, 1, 1.0f, k, phi, 1.0f, st->ksum, G));
    LUNA_TRY(luna_pass_alloc(ps, &s, (int64_t)G * L, "causal step"));
    LUNA_TRY(op->causal_step_products(be, s, q, st->ksum, st->row_t, st->t, B, H, dh, L));
    LUNA_TRY(op->softmax_forward(be, s, s, G, L, st->p_valid, H, 0));
    /* Σ Φᵀ V += φ_tᵀ v_t [L, dh]; O_t = A_t Σ Φᵀ V / t */
    LUNA_TRY(luna_bgemm(be, true, false, L, dh, 1, 1.0f, phi, v, 1.0f, st->vsum, G));
    /* one position: [B, H, 1, dh] is [B, d], the heads merged already */
    LUNA_TRY(luna_pass_alloc(ps, &o, (int64_t)B * d, "causal step"));
    LUNA_TRY(op->causal_step_products(be, o, s, st->vsum, st->row_t, st->t, B, H, L, dh));
    return op->linear_forward(be, y, o, w->out_proj.weight, NULL, B, d, d);
}

luna_status luna_causal_attention_step(luna_backend *be, luna_arena *scratch, const luna_attn_w *w,
                                       luna_causal_state *st, const luna_act *x, luna_act *y) {
    luna_pass ps = {.be = be, .arena = scratch};
    luna_arena_mark mark = luna_arena_get_mark(scratch);
    luna_status s = step(&ps, w, st, x, y);
    luna_arena_release(scratch, mark);
    return s;
}
