/* Learning-rate schedules (spec apollo.md "LR schedules"; fairseq's lr_scheduler semantics).
 *
 * luna_lr_at(c, k) is a PURE function of the number of completed updates k (so resuming needs no
 * scheduler state). Timing, exactly as fairseq: the learning rate used by update number k + 1
 * (the (k+1)-th optimizer step) is luna_lr_at(c, k). The trainer sets lr = luna_lr_at(c, 0)
 * before the first update; after each update it increments num_updates and sets
 * lr = luna_lr_at(c, num_updates) for the next one. Skipped updates (non-finite gradients) do not
 * increment num_updates, so the lr is unchanged.
 *
 * Formulas (W = warmup_updates, l0 = warmup_init_lr, L = lr):
 *  - LUNA_LR_MILESTONE (Luna recipe): k ≤ W: l0 + k·(L − l0)/W; k > W: L · decay_rate^N(k),
 *    N(k) = number of milestones m with W < m ≤ k (apollo.md: "after update k, if k is a milestone,
 *    lr ← lr·decay_rate"; a milestone inside the warmup is overridden by the warmup formula and
 *    has no effect). W = 0: L · decay_rate^N(k) for every k (no warmup).
 *    WMT: l0 1e-5, L 0.1, W 1000, milestones 300000 450000, decay 0.1.
 *  - LUNA_LR_INVERSE_SQRT (fairseq inverse_sqrt): k < W: l0 + k·(L − l0)/W; k ≥ W: L·sqrt(W/k).
 *    W = 0: L at k = 0, L·sqrt(1/k) after.
 *  - LUNA_LR_FIXED (fairseq fixed): L; during warmup (k < W) L·(k + 1)/W.
 * warmup_init_lr < 0 means fairseq's default: 0 if W > 0, else L.
 */
#ifndef LUNA_OPTIM_LR_SCHEDULER_H
#define LUNA_OPTIM_LR_SCHEDULER_H

#include <stdint.h>

#include "core/status.h"

#define LUNA_LR_MAX_MILESTONES 16

typedef enum { LUNA_LR_FIXED, LUNA_LR_MILESTONE, LUNA_LR_INVERSE_SQRT } luna_lr_scheduler_kind;

typedef struct {
    luna_lr_scheduler_kind kind;
    double lr; /* lr_max (--lr) */
    int64_t warmup_updates;
    double warmup_init_lr;                      /* < 0: fairseq default (see above) */
    int64_t milestones[LUNA_LR_MAX_MILESTONES]; /* strictly increasing, > 0 */
    int num_milestones;
    double decay_rate; /* --lr-decay-rate */
} luna_lr_scheduler_config;

/* The WMT Luna recipe for milestone (lr 0.1, warmup 1000 from 1e-5, milestones 300000 450000,
 * decay 0.1); inverse_sqrt: lr 5e-4, warmup 4000 from 1e-7 (fairseq transformer WMT);
 * fixed: lr 0.1, no warmup. */
void luna_lr_scheduler_defaults(luna_lr_scheduler_config *c, luna_lr_scheduler_kind kind);

/* The learning rate for update k + 1 (see the file comment). */
double luna_lr_at(const luna_lr_scheduler_config *c, int64_t num_updates);

/* "fixed" | "milestone" | "inverse_sqrt" <-> kind. */
luna_status luna_lr_scheduler_kind_parse(const char *name, luna_lr_scheduler_kind *out);
const char *luna_lr_scheduler_kind_name(luna_lr_scheduler_kind kind);

/* APPENDS milestones parsed from `text` to c->milestones: integers separated by spaces and/or
 * commas, optionally in brackets ("300000 450000", "300000,450000", "[300000, 450000]").
 * For `--milestones 300000 450000` call it once per argv word (set num_milestones = 0 first).
 * Errors (LUNA_ERR_INVALID_ARGUMENT): not an integer, ≤ 0, not strictly increasing, > 16. */
luna_status luna_lr_parse_milestones(luna_lr_scheduler_config *c, const char *text);

/* Checks the configuration (lr > 0, warmup ≥ 0, decay_rate > 0, milestones increasing). */
luna_status luna_lr_scheduler_check(const luna_lr_scheduler_config *c);

#endif
