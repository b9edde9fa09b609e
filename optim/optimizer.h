/* Optimizers: Apollo (spec apollo.md, the Luna recipe) and Adam/AdamW (fairseq's FairseqAdam).
 *
 * The optimizer sees tensors, not a model: a tensor table (core/tensor_table.h, made with
 * luna_tensor_table_create_named) names the tensors it updates and places them inside two flat
 * device buffers, the parameters and their gradients. The caller decides what goes in the table
 * (the trainer passes the model's trainable tensors); tensors outside it are neither updated nor
 * decayed. The optimizer owns its state on the backend's device, one block per state kind laid out
 * like the parameter buffer (the same offsets), so sharding or saving the state is a matter of
 * offsets:
 *   Apollo: exp_avg (m), approx_hessian (B), update (d)     Adam: exp_avg (m), exp_avg_sq (v)
 * plus a host-side step counter t per tensor. All state starts at zero.
 *
 * luna_optimizer_step() is the whole update (spec apollo.md "One update", steps 2-6): it scales
 * the gradients (grad_scale, e.g. 1/target tokens), clips them and checks them for non-finite
 * values (optim/clip.h), and, when they are finite, updates the parameters and the state through
 * ONE backend op, multi_apollo_update / multi_adam_update (core/backend.h) over the table, so the
 * same code runs on the GPU. An update allocates nothing and reads back once (the clip summary
 * with the update's loss sums, luna_optimizer_loss_sums).
 *
 * Precision: state and parameters are stored in fp32; each step computes every element in double
 * from the stored values and rounds what it stores (see model/kernels/cpu/optimizer_kernels.c).
 */
#ifndef LUNA_OPTIM_OPTIMIZER_H
#define LUNA_OPTIM_OPTIMIZER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/tensor_table.h"
#include "optim/clip.h"

/* σ of the constant rebound (apollo.md; older releases used σ = 1 with lr ×100, equivalent). */
#define LUNA_APOLLO_SIGMA 0.01

typedef enum { LUNA_OPTIMIZER_APOLLO, LUNA_OPTIMIZER_ADAM } luna_optimizer_kind;
/* The values of these two enums are the codes the backend ops take (core/backend.h). */
typedef enum { LUNA_REBOUND_CONSTANT, LUNA_REBOUND_BELIEF } luna_rebound;
typedef enum {
    LUNA_WEIGHT_DECAY_L2,
    LUNA_WEIGHT_DECAY_DECOUPLED,
    LUNA_WEIGHT_DECAY_STABLE
} luna_weight_decay_type;

typedef struct {
    luna_optimizer_kind kind;
    double apollo_beta, apollo_eps; /* 0.9, 1e-4; sigma = 0.01 (constant rebound) per apollo.md */
    luna_rebound rebound;
    double weight_decay;                      /* 0 default; WMT recipe 1e-8 */
    luna_weight_decay_type weight_decay_type; /* Apollo only; Adam's decay is always decoupled */
    double adam_beta1, adam_beta2, adam_eps;  /* 0.9, 0.98, 1e-8 */
} luna_optimizer_config;

/* Defaults for `kind`: Apollo β 0.9, ε 1e-4, constant rebound, L2; Adam β (0.9, 0.98), ε 1e-8;
 * weight_decay 0. (All fields are set whatever the kind.) */
void luna_optimizer_config_defaults(luna_optimizer_config *c, luna_optimizer_kind kind);

/* Flag values <-> enums. Each name argument may be NULL (field left unchanged):
 *   optimizer "apollo" | "adam";  rebound "constant" | "belief";
 *   weight_decay_type "L2" (also "l2") | "decoupled" | "stable".
 * Unknown names: LUNA_ERR_INVALID_ARGUMENT naming the flag and the accepted values. */
luna_status luna_optimizer_config_parse_names(luna_optimizer_config *c, const char *optimizer,
                                              const char *rebound, const char *weight_decay_type);
const char *luna_optimizer_kind_name(luna_optimizer_kind kind); /* "apollo" / "adam" */
const char *luna_rebound_name(luna_rebound rebound);            /* "constant" / "belief" */
const char *
luna_weight_decay_type_name(luna_weight_decay_type type); /* "L2"/"decoupled"/"stable" */

typedef struct luna_optimizer luna_optimizer;

/* State zero, one block per state kind as long as the table's extent. `tt` (named), `params`
 * and `grads` (device buffers in tt's layout) and `be` must outlive the optimizer. Checks the
 * configuration (β in [0, 1), ε > 0, weight_decay ≥ 0). */
luna_status luna_optimizer_create(luna_optimizer **out, luna_backend *be,
                                  const luna_optimizer_config *cfg, const luna_tensor_table *tt,
                                  float *params, float *grads);
void luna_optimizer_free(luna_optimizer *opt);

/* One update's inputs. */
typedef struct {
    double lr;         /* the scheduler's value for this update (optim/lr_scheduler.h) */
    double grad_scale; /* every gradient is first multiplied by this, rounded to fp32 (the trainer:
                        * 1 / target tokens of the update); 1: no scaling */
    double clip_norm;  /* > 0: clip (optim/clip.h); 0: no clipping, the norm is still measured */
    luna_clip_mode clip_mode;
} luna_optimizer_step_args;

/* What one update found (the trainer's gnorm and clip meters). */
typedef struct {
    double grad_norm; /* after grad_scale, before clipping */
    bool clipped;     /* some coefficient < 1 */
    bool finite;      /* false: a non-finite gradient or loss sum; parameters, state and step counts
                       * unchanged */
    double loss_sum, nll_sum; /* the sums at luna_optimizer_loss_sums when the step began */
} luna_optimizer_step_result;

/* The update of every tensor of the table (see the file comment): scale, clip, and when the
 * gradients and the loss sums are finite one optimizer step with learning rate args->lr,
 * incrementing each tensor's t. The gradients are left scaled and clipped (and only scaled when
 * not finite). The step queues all of it, then reads the device once: the clip summary and the
 * loss sums in one copy (the update op itself checks the finite flag, on the device). */
luna_status luna_optimizer_step(luna_optimizer *opt, const luna_optimizer_step_args *args,
                                luna_optimizer_step_result *result);

/* Device [2] doubles, the update's loss and nll: zero after each step; a trainer adds its
 * micro-batches' sums to them (luna_seq2seq_forward_backward_sums) so that the step's one readback
 * brings them back, and a non-finite loss skips the update as a non-finite gradient does. */
double *luna_optimizer_loss_sums(luna_optimizer *opt);

const luna_optimizer_config *luna_optimizer_get_config(const luna_optimizer *opt);
/* The step count t of tensor `index` of the table (-1 when out of range). */
int64_t luna_optimizer_tensor_step(const luna_optimizer *opt, int index);

/* Checkpointing: the state as named tensors (device pointers into the state blocks) and the
 * per-tensor step counters. Order: state kind major (all exp_avg, then approx_hessian, then
 * update; Adam: exp_avg, exp_avg_sq), table order within a kind. Names:
 * "optimizer.exp_avg.<tensor name>", "optimizer.approx_hessian.<..>", "optimizer.update.<..>"
 * (Apollo), "optimizer.exp_avg_sq.<..>" (Adam). `view` is a non-owning F32 tensor with the
 * tensor's shape on the backend's device; write into it to restore. */
int luna_optimizer_num_state_tensors(const luna_optimizer *opt);
luna_status luna_optimizer_state_tensor(const luna_optimizer *opt, int i, const char **name,
                                        luna_tensor *view);

/* JSON with the kind, the configuration and the per-tensor step counts:
 *   {"kind":"apollo","config":{"apollo_beta":0.9,...},"steps":{"<tensor name>":t,...}}
 * (*json_out malloc'd, caller frees). */
luna_status luna_optimizer_state_to_json(const luna_optimizer *opt, char **json_out);
/* Restores the step counts. The kind and every configuration value must equal this optimizer's
 * (LUNA_ERR_MISMATCH naming the first difference, e.g. "optimizer state: rebound is 'belief' in
 * the checkpoint but 'constant' here (use --reset-optimizer to start a fresh optimizer)"), and
 * every tensor of the table must have a step count and every step count a tensor of the table
 * (LUNA_ERR_MISMATCH otherwise). Nothing is changed on error. The tensors themselves are
 * restored through luna_optimizer_state_tensor views. */
luna_status luna_optimizer_state_from_json(luna_optimizer *opt, const char *json);

#endif
