/* Gradient clipping and the non-finite check (spec apollo.md "One update", step 3 and 5).
 *
 * Over every tensor of a tensor table (core/tensor_table.h) inside a flat gradient buffer:
 *   LUNA_CLIP_EACH (Luna recipe): each tensor's gradient g is scaled by
 *       min(1, clip_norm / (‖g‖₂ + 1e-6)); *grad_norm = max over tensors of ‖g‖₂.
 *   LUNA_CLIP_TOTAL (fairseq): one global norm N = sqrt(Σ_tensors ‖g‖₂²), every gradient scaled by
 *       min(1, clip_norm / (N + 1e-6)); *grad_norm = N.
 * clip_norm = 0: no clipping, the norms are still computed (*clipped = false).
 * *clipped: some gradient was scaled (coefficient < 1). Norms are measured before clipping.
 * Non-finite: if any gradient element is NaN or ±Inf (or a tensor's Σg² overflows fp32, which
 * fairseq's finiteness check on the norm also treats as overflow), *all_finite = false, NOTHING is
 * modified, *clipped = false and *grad_norm is the non-finite norm; the update is skipped.
 * Σg² per tensor comes from the backend's deterministic multi_sum_squares op (all tensors in one
 * launch; double accumulation, fixed blocking), the norm and the coefficients from its
 * clip_coefficients op (combined in double in table order) and the scaling from multi_scale,
 * so clipping runs on the device: bit-identical for any thread count, three launches and ONE
 * readback (norm, finite, clipped, and the update's loss sums) per update. Any output pointer
 * may be NULL.
 *
 * The optimizer clips inside its step (optim/optimizer.h); a luna_clipper is the piece it uses,
 * public for tools and tests that clip without updating. It holds the device buffers for the
 * table's size, made once: luna_clipper_apply allocates nothing. luna_clip_gradients is the
 * one-shot form (creates and frees a clipper).
 */
#ifndef LUNA_OPTIM_CLIP_H
#define LUNA_OPTIM_CLIP_H

#include <stdbool.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor_table.h"

typedef enum { LUNA_CLIP_EACH, LUNA_CLIP_TOTAL } luna_clip_mode;

typedef struct luna_clipper luna_clipper;

/* `tt` must outlive the clipper; the gradients are given to each apply (tt's layout). */
luna_status luna_clipper_create(luna_clipper **out, luna_backend *be, const luna_tensor_table *tt);
void luna_clipper_free(luna_clipper *c);
luna_status luna_clipper_apply(luna_clipper *c, float *grads, double clip_norm, luna_clip_mode mode,
                               double *grad_norm, bool *clipped, bool *all_finite);

/* The two halves of an apply, for an update that reads the device once (optim/optimizer.h):
 * luna_clipper_queue queues the three ops and reads nothing back; between it and
 * luna_clipper_finish, luna_clipper_gate is the device flag an update op takes as its gate
 * (core/backend.h: 1 finite, 0 skip). The non-finite check also covers the two doubles at
 * luna_clipper_loss_sums (device; zero unless the caller adds to them — the trainer's loss and
 * nll of the update, core/backend.h loss_sums), which luna_clipper_finish reads back with the
 * summary, in one copy, and then zeroes for the next update. */
typedef struct {
    double grad_norm;
    bool clipped, all_finite;
    double loss_sum, nll_sum; /* the sums at luna_clipper_loss_sums when queued */
} luna_clip_summary;
luna_status luna_clipper_queue(luna_clipper *c, float *grads, double clip_norm,
                               luna_clip_mode mode);
luna_status luna_clipper_finish(luna_clipper *c, luna_clip_summary *out);
const double *luna_clipper_gate(const luna_clipper *c);
double *luna_clipper_loss_sums(luna_clipper *c);

luna_status luna_clip_gradients(luna_backend *be, const luna_tensor_table *tt, float *grads,
                                double clip_norm, luna_clip_mode mode, double *grad_norm,
                                bool *clipped, bool *all_finite);

/* "each" | "total" <-> mode. */
luna_status luna_clip_mode_parse(const char *name, luna_clip_mode *out);
const char *luna_clip_mode_name(luna_clip_mode mode);

#endif
