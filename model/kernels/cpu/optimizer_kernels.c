/* The optimizer updates over a tensor table (core/backend.h, "Optimizer": multi_apollo_update,
 * multi_adam_update).
 *
 * Precision: parameters and state are stored in fp32. Each element is computed in double from
 * the stored fp32 values; a quantity is rounded to fp32 when it is stored, and later sub-steps of
 * the same update read the rounded value (B before D, m and d before θ), so a backend with the same
 * rule gives the same result up to the order of the double sums.
 *
 * Determinism: Apollo's per-tensor reductions (Σd⁴, ΣΔg·d, ΣB·d², max|Δg|, and ΣD for the stable
 * decay) add in core/reduce_order.h's fixed order over the table's blocks, so each tensor's
 * result is bit-identical for any thread count and whatever the other tensors of the table:
 * threads only choose who computes a block.
 */
#include <math.h>
#include <stdint.h>

#include "core/reduce_order.h"
#include "core/tensor_table.h"
#include "model/kernels/cpu/cpu_ops.h"

#define OPT_PARALLEL_MIN 4 /* blocks: below this, one thread */

enum { REBOUND_CONSTANT = 0, REBOUND_BELIEF = 1 };
enum { WD_L2 = 0, WD_DECOUPLED = 1, WD_STABLE = 2 };

/* Per-block partials of the Apollo reductions. */
typedef struct {
    double s4, sgd, sbd, rmax;
} apollo_partial;

/* Σ over the block [start, start+len) of the four reductions on the OLD state. */
static apollo_partial apollo_block_reduce(const float *restrict theta, const float *restrict g,
                                          const float *restrict m, const float *restrict B,
                                          const float *restrict d, int64_t start, int64_t len,
                                          double l2) {
    double s4[LUNA_REDUCE_LANES] = {0}, sgd[LUNA_REDUCE_LANES] = {0}, sbd[LUNA_REDUCE_LANES] = {0};
    double rmax = 0.0;
    for (int64_t j = 0; j < len; j++) {
        int64_t i = start + j;
        int l = (int)(j % LUNA_REDUCE_LANES);
        double gp = (double)g[i] + l2 * (double)theta[i];
        double dg = gp - (double)m[i];
        double dd = (double)d[i];
        double d2 = dd * dd;
        s4[l] += d2 * d2;
        sgd[l] += dg * dd;
        sbd[l] += (double)B[i] * d2;
        double a = fabs(dg);
        rmax = (a != a || rmax != rmax) ? NAN : (a > rmax ? a : rmax);
    }
    apollo_partial p = {0.0, 0.0, 0.0, rmax};
    for (int l = 0; l < LUNA_REDUCE_LANES; l++) {
        p.s4 += s4[l];
        p.sgd += sgd[l];
        p.sbd += sbd[l];
    }
    return p;
}

static inline double apollo_denominator(double b, double r, double sigma, double eps_over_alpha,
                                        int rebound) {
    double a = fabs(b);
    if (rebound == REBOUND_BELIEF) return (a > r ? a : r) + eps_over_alpha;
    return a > sigma ? a : sigma;
}

/* ---- multi-tensor forms ---------------------------------------------------------------------- */

/* Block k of the table: its tensor, its first element in the flat buffers, its length, and its
 * first element within the tensor. */
typedef struct {
    int tensor;
    int64_t base, start, len;
} table_block;

static inline table_block block_of(const luna_tensor_table *tt, int64_t k) {
    table_block b;
    b.tensor = tt->block_tensor[k];
    b.base = tt->offsets[b.tensor];
    b.start = (k - tt->block_start[b.tensor]) * LUNA_REDUCE_BLOCK;
    int64_t rest = tt->numels[b.tensor] - b.start;
    b.len = rest < LUNA_REDUCE_BLOCK ? rest : LUNA_REDUCE_BLOCK;
    return b;
}

/* Per-tensor scalars of one Apollo step, in tt->workspace. */
#define APOLLO_CHUNK_BLOCKS 256 /* 1M elements */
enum { AP_ALPHA, AP_DEN, AP_DELTA, AP_R, AP_EOA, AP_COEF, AP_NSCALARS };
_Static_assert(AP_NSCALARS <= LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR, "workspace per tensor");
_Static_assert(LUNA_REDUCE_BLOCK == LUNA_TENSOR_TABLE_BLOCK, "one blocking");

luna_status luna_cpu_multi_apollo_update(luna_backend *be, float *theta, const float *g,
                                         float *exp_avg, float *approx_hessian, float *update,
                                         const luna_tensor_table *tt, int64_t *steps,
                                         const double *gate, double lr, double beta, double eps,
                                         double sigma, int rebound, double weight_decay,
                                         int wd_type) {
    if (gate && *gate == 0.0) return LUNA_OK; /* the clip summary found the update non-finite */
    const int nt = tt->num_tensors;
    const int64_t nblocks = tt->num_blocks;
    apollo_partial *partials = (apollo_partial *)tt->workspace; /* [nblocks] (4 doubles each) */
    double *dsum = tt->workspace + 4 * nblocks;                 /* [nblocks] */
    double *sc = tt->workspace + LUNA_TENSOR_TABLE_WORKSPACE_PER_BLOCK * nblocks; /* [nt][8] */
    _Static_assert(sizeof(apollo_partial) == 4 * sizeof(double), "partial layout");
    const double l2 = wd_type == WD_L2 ? weight_decay : 0.0;
    const bool stable = wd_type == WD_STABLE;
    const double decoupled = wd_type == WD_DECOUPLED ? weight_decay : 0.0;

    /* Chunks of consecutive tensors of at most APOLLO_CHUNK_BLOCKS blocks (a larger tensor is a
     * chunk alone): a chunk's reduction pass and update pass run back to back while its
     * parameters, gradients and state (5 arrays, 20 MB at most) are still in cache. The chunking
     * does not change any result. */
    for (int t0 = 0; t0 < nt;) {
        int t1 = t0 + 1;
        while (t1 < nt && tt->block_start[t1 + 1] - tt->block_start[t0] <= APOLLO_CHUNK_BLOCKS)
            t1++;
        const int64_t k0 = tt->block_start[t0], k1 = tt->block_start[t1];
        /* Pass 1: the reductions of steps 5–6 (old m, B, d) over the chunk's blocks. */
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (k1 - k0 >= OPT_PARALLEL_MIN)
        for (int64_t k = k0; k < k1; k++) {
            table_block b = block_of(tt, k);
            partials[k] =
                apollo_block_reduce(theta + b.base, g + b.base, exp_avg + b.base,
                                    approx_hessian + b.base, update + b.base, b.start, b.len, l2);
        }
        /* Per-tensor scalars: partials combined in block order. */
        for (int i = t0; i < t1; i++) {
            int64_t t = steps[i] + 1;
            double s4 = 0.0, sgd = 0.0, sbd = 0.0, r = 0.0;
            for (int64_t k = tt->block_start[i]; k < tt->block_start[i + 1]; k++) {
                s4 += partials[k].s4;
                sgd += partials[k].sgd;
                sbd += partials[k].sbd;
                double pr = partials[k].rmax;
                r = (pr != pr || r != r) ? NAN : (pr > r ? pr : r);
            }
            double *x = sc + (size_t)i * LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR;
            const double alpha = (1.0 - beta) / (1.0 - pow(beta, (double)t));
            const double eps_prime = rebound == REBOUND_CONSTANT ? eps / sigma : eps;
            const double den = pow(s4, 0.25) + eps_prime;
            x[AP_ALPHA] = alpha;
            x[AP_DEN] = den;
            x[AP_DELTA] = -alpha * sgd / (den * den) - sbd / (den * den);
            x[AP_R] = r;
            x[AP_EOA] = eps / alpha;
        }

        /* Pass 2: steps 4, 7, 8 (and 9–11 unless stable, which needs mean(D) first). */
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (k1 - k0 >= OPT_PARALLEL_MIN)
        for (int64_t k = k0; k < k1; k++) {
            table_block b = block_of(tt, k);
            const double *x = sc + (size_t)b.tensor * LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR;
            const double alpha = x[AP_ALPHA], den = x[AP_DEN], delta = x[AP_DELTA], r = x[AP_R],
                         eps_over_alpha = x[AP_EOA];
            float *restrict th = theta + b.base, *restrict m = exp_avg + b.base,
                            *restrict Bh = approx_hessian + b.base, *restrict d = update + b.base;
            const float *restrict gr = g + b.base;
            double lane[LUNA_REDUCE_LANES] = {0};
            for (int64_t j = 0; j < b.len; j++) {
                int64_t i = b.start + j;
                double gp = (double)gr[i] + l2 * (double)th[i];
                double dg = gp - (double)m[i];
                float m_new = (float)((double)m[i] + alpha * dg);
                double v = (double)d[i] / den;
                float b_new = (float)((double)Bh[i] + delta * v * v);
                m[i] = m_new;
                Bh[i] = b_new;
                double D = apollo_denominator((double)b_new, r, sigma, eps_over_alpha, rebound);
                if (stable) {
                    lane[j % LUNA_REDUCE_LANES] += D;
                    continue;
                }
                float d_new = (float)((double)m_new / D + decoupled * (double)th[i]);
                d[i] = d_new;
                th[i] = (float)((double)th[i] - lr * (double)d_new);
            }
            double s = 0.0;
            for (int l = 0; l < LUNA_REDUCE_LANES; l++)
                s += lane[l];
            dsum[k] = s;
        }

        if (stable) {
            for (int i = t0; i < t1; i++) {
                double total = 0.0;
                for (int64_t k = tt->block_start[i]; k < tt->block_start[i + 1]; k++)
                    total += dsum[k];
                sc[(size_t)i * LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR + AP_COEF] =
                    weight_decay / (total / (double)tt->numels[i]);
            }
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (k1 - k0 >= OPT_PARALLEL_MIN)
            for (int64_t k = k0; k < k1; k++) {
                table_block b = block_of(tt, k);
                const double *x = sc + (size_t)b.tensor * LUNA_TENSOR_TABLE_WORKSPACE_PER_TENSOR;
                const double r = x[AP_R], eps_over_alpha = x[AP_EOA], coef = x[AP_COEF];
                float *restrict th = theta + b.base, *restrict m = exp_avg + b.base,
                                *restrict Bh = approx_hessian + b.base,
                                *restrict d = update + b.base;
                for (int64_t i = b.start; i < b.start + b.len; i++) {
                    double D = apollo_denominator((double)Bh[i], r, sigma, eps_over_alpha, rebound);
                    float d_new = (float)((double)m[i] / D + coef * (double)th[i]);
                    d[i] = d_new;
                    th[i] = (float)((double)th[i] - lr * (double)d_new);
                }
            }
        }
        t0 = t1;
    }
    for (int i = 0; i < nt; i++)
        steps[i] += 1;
    return LUNA_OK;
}

/* Per-tensor scalars of one Adam step, in tt->workspace. */
enum { AD_STEP_SIZE, AD_KEEP, AD_NSCALARS };

luna_status luna_cpu_multi_adam_update(luna_backend *be, float *theta, const float *g,
                                       float *exp_avg, float *exp_avg_sq,
                                       const luna_tensor_table *tt, int64_t *steps,
                                       const double *gate, double lr, double beta1, double beta2,
                                       double eps, double weight_decay) {
    if (gate && *gate == 0.0) return LUNA_OK;
    const int nt = tt->num_tensors;
    const int64_t nblocks = tt->num_blocks;
    double *sc = tt->workspace; /* [nt][AD_NSCALARS] */
    for (int i = 0; i < nt; i++) {
        int64_t t = steps[i] + 1;
        const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
        sc[(size_t)i * AD_NSCALARS + AD_STEP_SIZE] = lr * sqrt(bc2) / bc1;
        sc[(size_t)i * AD_NSCALARS + AD_KEEP] = 1.0 - lr * weight_decay;
    }
#pragma omp parallel for num_threads(be->num_threads) schedule(static) if (nblocks > 16)
    for (int64_t k = 0; k < nblocks; k++) {
        table_block b = block_of(tt, k);
        const double step_size = sc[(size_t)b.tensor * AD_NSCALARS + AD_STEP_SIZE],
                     keep = sc[(size_t)b.tensor * AD_NSCALARS + AD_KEEP];
        float *restrict th = theta + b.base, *restrict m = exp_avg + b.base,
                        *restrict v = exp_avg_sq + b.base;
        const float *restrict gr = g + b.base;
        for (int64_t i = b.start; i < b.start + b.len; i++) {
            double gi = (double)gr[i];
            float m_new = (float)(beta1 * (double)m[i] + (1.0 - beta1) * gi);
            float v_new = (float)(beta2 * (double)v[i] + (1.0 - beta2) * gi * gi);
            m[i] = m_new;
            v[i] = v_new;
            double denom = sqrt((double)v_new) + eps;
            th[i] = (float)((double)th[i] * keep - step_size * (double)m_new / denom);
        }
    }
    for (int i = 0; i < nt; i++)
        steps[i] += 1;
    return LUNA_OK;
}
