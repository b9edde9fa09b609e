/* Learning-rate schedules as pure functions of the update count (see optim/lr_scheduler.h). */
#include "optim/lr_scheduler.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void luna_lr_scheduler_defaults(luna_lr_scheduler_config *c, luna_lr_scheduler_kind kind) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->decay_rate = 0.1;
    switch (kind) {
    case LUNA_LR_MILESTONE:
        c->lr = 0.1;
        c->warmup_updates = 1000;
        c->warmup_init_lr = 1e-5;
        c->milestones[0] = 300000;
        c->milestones[1] = 450000;
        c->num_milestones = 2;
        break;
    case LUNA_LR_INVERSE_SQRT:
        c->lr = 5e-4;
        c->warmup_updates = 4000;
        c->warmup_init_lr = 1e-7;
        break;
    case LUNA_LR_FIXED:
        c->lr = 0.1;
        c->warmup_updates = 0;
        c->warmup_init_lr = -1.0;
        break;
    }
}

static double init_lr(const luna_lr_scheduler_config *c) {
    if (c->warmup_init_lr >= 0.0) return c->warmup_init_lr;
    return c->warmup_updates > 0 ? 0.0 : c->lr;
}

double luna_lr_at(const luna_lr_scheduler_config *c, int64_t k) {
    if (k < 0) k = 0;
    const int64_t W = c->warmup_updates > 0 ? c->warmup_updates : 0;
    switch (c->kind) {
    case LUNA_LR_FIXED:
        if (W > 0 && k < W) return c->lr * (double)(k + 1) / (double)W;
        return c->lr;
    case LUNA_LR_MILESTONE: {
        if (W > 0 && k <= W) {
            double l0 = init_lr(c);
            return l0 + (double)k * ((c->lr - l0) / (double)W);
        }
        double lr = c->lr;
        for (int i = 0; i < c->num_milestones; i++)
            if (c->milestones[i] > W && c->milestones[i] <= k) lr *= c->decay_rate;
        return lr;
    }
    case LUNA_LR_INVERSE_SQRT: {
        if (W > 0 && k < W) {
            double l0 = init_lr(c);
            return l0 + (double)k * ((c->lr - l0) / (double)W);
        }
        if (W == 0) return k == 0 ? c->lr : c->lr * sqrt(1.0 / (double)k);
        return c->lr * sqrt((double)W) * pow((double)k, -0.5);
    }
    }
    return c->lr;
}

luna_status luna_lr_scheduler_kind_parse(const char *name, luna_lr_scheduler_kind *out) {
    if (name && strcmp(name, "fixed") == 0)
        *out = LUNA_LR_FIXED;
    else if (name && strcmp(name, "milestone") == 0)
        *out = LUNA_LR_MILESTONE;
    else if (name && strcmp(name, "inverse_sqrt") == 0)
        *out = LUNA_LR_INVERSE_SQRT;
    else
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--lr-scheduler: unknown scheduler '%s' (use milestone, inverse_sqrt or "
                          "fixed)",
                          name ? name : "(null)");
    return LUNA_OK;
}

const char *luna_lr_scheduler_kind_name(luna_lr_scheduler_kind kind) {
    switch (kind) {
    case LUNA_LR_FIXED: return "fixed";
    case LUNA_LR_MILESTONE: return "milestone";
    case LUNA_LR_INVERSE_SQRT: return "inverse_sqrt";
    }
    return "?";
}

luna_status luna_lr_parse_milestones(luna_lr_scheduler_config *c, const char *text) {
    if (!c || !text) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--milestones: NULL argument");
    luna_lr_scheduler_config tmp = *c;
    const char *s = text;
    for (;;) {
        while (*s && (isspace((unsigned char)*s) || *s == ',' || *s == '[' || *s == ']'))
            s++;
        if (!*s) break;
        if (!isdigit((unsigned char)*s) && *s != '-' && *s != '+')
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--milestones '%s': '%c' at position %d is not part of an integer",
                              text, *s, (int)(s - text));
        char *end = NULL;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno != 0 ||
            (*end && !isspace((unsigned char)*end) && *end != ',' && *end != ']'))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--milestones '%s': bad integer at position %d", text,
                              (int)(s - text));
        if (v <= 0)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--milestones '%s': milestone %lld must be > 0", text, v);
        if (tmp.num_milestones >= LUNA_LR_MAX_MILESTONES)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--milestones '%s': more than %d milestones", text,
                              LUNA_LR_MAX_MILESTONES);
        if (tmp.num_milestones > 0 && v <= tmp.milestones[tmp.num_milestones - 1])
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--milestones '%s': %lld does not increase (after %lld)", text, v,
                              (long long)tmp.milestones[tmp.num_milestones - 1]);
        tmp.milestones[tmp.num_milestones++] = (int64_t)v;
        s = end;
    }
    *c = tmp;
    return LUNA_OK;
}

luna_status luna_lr_scheduler_check(const luna_lr_scheduler_config *c) {
    if (!c) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "lr scheduler: NULL config");
    if (c->kind != LUNA_LR_FIXED && c->kind != LUNA_LR_MILESTONE && c->kind != LUNA_LR_INVERSE_SQRT)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "lr scheduler: unknown kind %d", (int)c->kind);
    if (!(c->lr > 0.0) || !isfinite(c->lr))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--lr %g: must be > 0", c->lr);
    if (c->warmup_updates < 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--warmup-updates %lld: must be >= 0",
                          (long long)c->warmup_updates);
    if (!isfinite(c->warmup_init_lr))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--warmup-init-lr: not finite");
    if (c->kind == LUNA_LR_MILESTONE && !(c->decay_rate > 0.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--lr-decay-rate %g: must be > 0",
                          c->decay_rate);
    if (c->num_milestones < 0 || c->num_milestones > LUNA_LR_MAX_MILESTONES)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--milestones: %d milestones (at most %d)",
                          c->num_milestones, LUNA_LR_MAX_MILESTONES);
    for (int i = 0; i < c->num_milestones; i++)
        if (c->milestones[i] <= 0 || (i > 0 && c->milestones[i] <= c->milestones[i - 1]))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "--milestones: must be positive and strictly increasing");
    return LUNA_OK;
}
