/* Resuming with the options that define the run (see trainer_internal.h). */
#include "trainer/trainer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "trainer/options.h"

typedef enum { RESET_DATALOADER, RESET_OPTIMIZER, RESET_LR_SCHEDULER } reset_group;

/* The options a checkpoint's run is defined by, as keys of training_state.args, and the reset
 * flag that allows each to change on resume. The architecture and its shapes are compared
 * separately (the parameters could not be loaded otherwise); options that do not change what is
 * computed (--max-update, --threads, --log-interval, --save-dir ...) may always change. */
static const struct {
    const char *key;
    reset_group group;
} DEFINING[] = {
    /* the data order: which batches, in which order, how many per update */
    {"seed", RESET_DATALOADER},
    {"max_tokens", RESET_DATALOADER},
    {"max_sentences", RESET_DATALOADER},
    {"update_freq", RESET_DATALOADER}, /* compared as batches per update: × the rank count */
    {"required_batch_size_multiple", RESET_DATALOADER},
    {"max_source_positions", RESET_DATALOADER},
    {"max_target_positions", RESET_DATALOADER},
    {"train_subset", RESET_DATALOADER},
    /* the optimizer, its hyperparameters, and the regularisation of the loss it minimises */
    {"optimizer", RESET_OPTIMIZER},
    {"apollo_beta", RESET_OPTIMIZER},
    {"apollo_eps", RESET_OPTIMIZER},
    {"rebound", RESET_OPTIMIZER},
    {"weight_decay", RESET_OPTIMIZER},
    {"weight_decay_type", RESET_OPTIMIZER},
    {"adam_betas", RESET_OPTIMIZER},
    {"adam_eps", RESET_OPTIMIZER},
    {"clip_norm", RESET_OPTIMIZER},
    {"clip_mode", RESET_OPTIMIZER},
    {"dropout", RESET_OPTIMIZER},
    {"attention_dropout", RESET_OPTIMIZER},
    {"activation_dropout", RESET_OPTIMIZER},
    {"label_smoothing", RESET_OPTIMIZER},
    /* the learning-rate schedule (a function of the update number and these) */
    {"lr", RESET_LR_SCHEDULER},
    {"lr_scheduler", RESET_LR_SCHEDULER},
    {"warmup_updates", RESET_LR_SCHEDULER},
    {"warmup_init_lr", RESET_LR_SCHEDULER},
    {"milestones", RESET_LR_SCHEDULER},
    {"lr_decay_rate", RESET_LR_SCHEDULER},
};

static const char *const FLAG[] = {"--reset-dataloader", "--reset-optimizer",
                                   "--reset-lr-scheduler"};

static bool same_value(const luna_json *a, const luna_json *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case LUNA_JSON_NULL: return true;
    case LUNA_JSON_BOOL: return a->boolean == b->boolean;
    case LUNA_JSON_STRING: return strcmp(a->string, b->string) == 0;
    case LUNA_JSON_NUMBER:
        if (a->is_int && b->is_int)
            return a->is_negative == b->is_negative && a->int_value == b->int_value &&
                   a->uint_value == b->uint_value;
        return a->number == b->number;
    default: return false; /* no defining option is an array or object */
    }
}

/* The value for a message: numbers in their shortest round-trip form, strings quoted. */
static void show(const luna_json *v, char *buf, size_t size) {
    switch (v->type) {
    case LUNA_JSON_STRING: snprintf(buf, size, "'%s'", v->string); break;
    case LUNA_JSON_BOOL: snprintf(buf, size, "%s", v->boolean ? "on" : "off"); break;
    case LUNA_JSON_NUMBER:
        if (v->is_int && v->is_negative)
            snprintf(buf, size, "%lld", (long long)v->int_value);
        else if (v->is_int)
            snprintf(buf, size, "%llu", (unsigned long long)v->uint_value);
        else
            for (int precision = 1; precision <= 17; precision++) {
                snprintf(buf, size, "%.*g", precision, v->number);
                if (strtod(buf, NULL) == v->number) break;
            }
        break;
    default: snprintf(buf, size, "unset"); break;
    }
}

luna_status luna_trainer_check_resume_options(const luna_trainer *t, const char *path,
                                              const luna_json *state) {
    const luna_json *saved = luna_json_get(state, "args");
    if (!saved || saved->type != LUNA_JSON_OBJECT) return LUNA_OK; /* not written by luna-train */
    char *now_text = NULL;
    LUNA_TRY(luna_train_options_to_json(t->o, &now_text));
    luna_json *now = NULL;
    luna_status s = luna_json_parse(&now, now_text, strlen(now_text), NULL);
    const bool allowed[] = {t->o->reset_dataloader, t->o->reset_optimizer,
                            t->o->reset_lr_scheduler};
    for (size_t i = 0; s == LUNA_OK && i < sizeof DEFINING / sizeof DEFINING[0]; i++) {
        if (allowed[DEFINING[i].group]) continue;
        const luna_json *was = luna_json_get(saved, DEFINING[i].key);
        const luna_json *is = luna_json_get(now, DEFINING[i].key);
        if (!was || !is || same_value(was, is)) continue; /* absent: an older checkpoint */
        if (strcmp(DEFINING[i].key, "update_freq") == 0 && was->is_int && is->is_int) {
            /* W ranks × F equals one process × W·F (the same batches per update, in the same
             * order: resume across rank counts, tests/test_trainer_mpi.c) */
            const luna_json *ws = luna_json_get(state, "world_size");
            const uint64_t saved_ranks =
                ws && ws->is_int && ws->uint_value > 0 ? ws->uint_value : 1;
            const uint64_t ranks = t->comm->world_size > 0 ? (uint64_t)t->comm->world_size : 1;
            const uint64_t before = was->uint_value * saved_ranks, after = is->uint_value * ranks;
            if (before == after) continue;
            s = luna_error(LUNA_ERR_MISMATCH,
                           "%s: --update-freq is %llu (%llu batches per update on %llu rank(s)) "
                           "but the checkpoint was trained with %llu (%llu batches per update on "
                           "%llu rank(s)); resume with the same batches per update, pass "
                           "--reset-dataloader to change it, or use another --save-dir",
                           path, (unsigned long long)is->uint_value, (unsigned long long)after,
                           (unsigned long long)ranks, (unsigned long long)was->uint_value,
                           (unsigned long long)before, (unsigned long long)saved_ranks);
            break;
        }
        char option[64], a[64], b[64];
        snprintf(option, sizeof option, "--%s", DEFINING[i].key);
        for (char *c = option + 2; *c; c++)
            if (*c == '_') *c = '-';
        show(was, a, sizeof a);
        show(is, b, sizeof b);
        s = luna_error(LUNA_ERR_MISMATCH,
                       "%s: %s is %s but the checkpoint was trained with %s (resume with the "
                       "same value, pass %s to change it, or use another --save-dir)",
                       path, option, b, a, FLAG[DEFINING[i].group]);
    }
    luna_json_free(now);
    free(now_text);
    return s;
}
