/* attention_forward/backward by gemm_grid and softmax_dropout (core/attention_composed.h): the
 * separate calls of the model's attention, in its order, so the op gives their results bit for
 * bit (the CPU's translations and training are those of the separate calls). */
#include "core/attention_composed.h"

luna_status luna_attention_composed_forward(luna_backend *be, luna_act *o, luna_act *a,
                                            luna_act *a_d, const luna_act *q, const luna_act *k,
                                            const luna_act *v, const luna_attention_shape *s,
                                            float p, luna_rng_key key) {
    const luna_ops *op = be->ops;
    const int B = s->B, H = s->H, n = s->n, m = s->m, dh = s->dh;
    const luna_grid_stride sa = {(int64_t)H * n * m, (int64_t)n * m};
    const bool drop = a_d && p > 0.0f;
    LUNA_TRY(op->gemm_grid(be, false, true, n, m, dh, s->scale, q, s->ldq, s->sq, k, s->ldk, s->sk,
                           0.0f, a, m, sa, B, H));
    LUNA_TRY(op->softmax_dropout_forward(be, a, drop ? a_d : NULL, a, (int64_t)B * H * n, m,
                                         s->valid_cols, (int64_t)H * n, s->causal ? n : 0,
                                         drop ? p : 0.0f, key));
    return op->gemm_grid(be, false, false, n, dh, m, 1.0f, drop ? a_d : a, m, sa, v, s->ldv, s->sv,
                         0.0f, o, s->ldo, s->so, B, H);
}

luna_status luna_attention_composed_backward(luna_backend *be, luna_act *dq, luna_act *dk,
                                             luna_act *dv, luna_act *ds, const luna_act *d_o,
                                             const luna_act *q, const luna_act *k,
                                             const luna_act *v, const luna_act *a,
                                             const luna_act *a_d, const luna_attention_shape *s,
                                             float p, luna_rng_key key) {
    const luna_ops *op = be->ops;
    const int B = s->B, H = s->H, n = s->n, m = s->m, dh = s->dh;
    const luna_grid_stride sa = {(int64_t)H * n * m, (int64_t)n * m};
    const bool drop = a_d && p > 0.0f;
    /* O = A_d V: dA_d = dO Vᵀ (into ds), dV = A_dᵀ dO */
    LUNA_TRY(op->gemm_grid(be, false, true, n, m, dh, 1.0f, d_o, s->ldo, s->so, v, s->ldv, s->sv,
                           0.0f, ds, m, sa, B, H));
    LUNA_TRY(op->gemm_grid(be, true, false, m, dh, n, 1.0f, drop ? a_d : a, m, sa, d_o, s->ldo,
                           s->so, 0.0f, dv, s->ldv, s->sv, B, H));
    LUNA_TRY(
        op->softmax_dropout_backward(be, ds, ds, a, (int64_t)B * H * n, m, drop ? p : 0.0f, key));
    /* S = scale · Q Kᵀ: dQ = scale · dS K (dO was read for the last time above), dK = scale ·
     * dSᵀ Q, added to dV when they share a buffer */
    LUNA_TRY(op->gemm_grid(be, false, false, n, dh, m, s->scale, ds, m, sa, k, s->ldk, s->sk, 0.0f,
                           dq, s->ldq, s->sq, B, H));
    return op->gemm_grid(be, true, false, m, dh, n, s->scale, ds, m, sa, q, s->ldq, s->sq,
                         dk == dv ? 1.0f : 0.0f, dk, s->ldk, s->sk, B, H);
}
