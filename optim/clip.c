/* Gradient clipping with the non-finite check (see optim/clip.h). */
#include "optim/clip.h"

#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"

_Static_assert(LUNA_CLIP_EACH == 0 && LUNA_CLIP_TOTAL == 1,
               "mode codes of core/backend.h clip_coefficients");

struct luna_clipper {
    luna_backend *be;
    const luna_tensor_table *tt; /* the tensors to clip */
    float *dev;                  /* device: sumsq [N], coef [N] */
    double *summary;             /* device [5]: norm, finite, clipped, then the loss sums */
    size_t dev_bytes;
};

luna_status luna_clip_mode_parse(const char *name, luna_clip_mode *out) {
    if (name && strcmp(name, "each") == 0)
        *out = LUNA_CLIP_EACH;
    else if (name && strcmp(name, "total") == 0)
        *out = LUNA_CLIP_TOTAL;
    else
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "--clip-mode: unknown mode '%s' (use each or total)",
                          name ? name : "(null)");
    return LUNA_OK;
}

const char *luna_clip_mode_name(luna_clip_mode mode) {
    return mode == LUNA_CLIP_EACH ? "each" : mode == LUNA_CLIP_TOTAL ? "total" : "?";
}

void luna_clipper_free(luna_clipper *c) {
    if (!c) return;
    if (c->dev) luna_mem_release(c->be, c->dev, c->dev_bytes);
    free(c);
}

luna_status luna_clipper_create(luna_clipper **out, luna_backend *be, const luna_tensor_table *tt) {
    if (!out || !be || !tt)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clipper_create: NULL argument");
    *out = NULL;
    luna_clipper *c = calloc(1, sizeof *c);
    if (!c) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "clipper: out of host memory");
    c->be = be;
    c->tt = tt;
    /* sumsq and coef, then the summary (8-byte aligned: 2N floats rounded up to 8 bytes). */
    size_t floats = ((size_t)2 * (size_t)tt->num_tensors + 1) & ~(size_t)1;
    c->dev_bytes = floats * sizeof(float) + 5 * sizeof(double);
    c->dev = luna_mem_alloc(be, c->dev_bytes);
    if (!c->dev) {
        size_t bytes = c->dev_bytes;
        luna_clipper_free(c);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "clip_gradients: cannot allocate %zu bytes on %s",
                          bytes, be->name);
    }
    c->summary = (double *)(void *)(c->dev + floats);
    luna_status st = luna_mem_zero(be, c->summary + 3, 2 * sizeof(double));
    if (st != LUNA_OK) {
        luna_clipper_free(c);
        return st;
    }
    *out = c;
    return LUNA_OK;
}

double *luna_clipper_loss_sums(luna_clipper *c) { return c ? c->summary + 3 : NULL; }

const double *luna_clipper_gate(const luna_clipper *c) { return c ? c->summary + 1 : NULL; }

/* The checks both entry points make before touching anything. */
static luna_status check_args(double clip_norm, luna_clip_mode mode) {
    if (!(clip_norm >= 0.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--clip-norm %g: must be >= 0", clip_norm);
    if (mode != LUNA_CLIP_EACH && mode != LUNA_CLIP_TOTAL)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: unknown mode %d", (int)mode);
    return LUNA_OK;
}

luna_status luna_clipper_queue(luna_clipper *c, float *grads, double clip_norm,
                               luna_clip_mode mode) {
    if (!c || (!grads && c->tt->num_elements > 0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: NULL argument");
    LUNA_TRY(check_args(clip_norm, mode));
    const int n = c->tt->num_tensors;
    luna_backend *be = c->be;
    float *sumsq = c->dev, *coef = c->dev + n;
    /* Σg² per tensor, the norm and coefficients (and the finite flag, which also covers the loss
     * sums), the scaling: all on the device. An empty table still writes the summary. */
    luna_status st = n > 0 ? be->ops->multi_sum_squares(be, sumsq, grads, c->tt) : LUNA_OK;
    if (st == LUNA_OK)
        st = be->ops->clip_coefficients(be, coef, c->summary, sumsq, n, clip_norm, (int)mode,
                                        c->summary + 3, 2);
    if (st == LUNA_OK && clip_norm != 0.0 && n > 0)
        st = be->ops->multi_scale(be, grads, c->tt, coef, 1.0f);
    if (st != LUNA_OK) luna_error_prefix("clip_gradients");
    return st;
}

luna_status luna_clipper_finish(luna_clipper *c, luna_clip_summary *out) {
    if (!c || !out) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: NULL argument");
    double host[5];
    luna_status st = luna_mem_to_host(c->be, host, c->summary, sizeof host);
    if (st == LUNA_OK) st = luna_mem_zero(c->be, c->summary + 3, 2 * sizeof(double));
    if (st != LUNA_OK) {
        luna_error_prefix("clip_gradients");
        return st;
    }
    *out = (luna_clip_summary){.grad_norm = host[0],
                               .all_finite = host[1] != 0.0,
                               .clipped = host[2] != 0.0,
                               .loss_sum = host[3],
                               .nll_sum = host[4]};
    return LUNA_OK;
}

luna_status luna_clipper_apply(luna_clipper *c, float *grads, double clip_norm, luna_clip_mode mode,
                               double *grad_norm, bool *clipped, bool *all_finite) {
    if (grad_norm) *grad_norm = 0.0;
    if (clipped) *clipped = false;
    if (all_finite) *all_finite = true;
    luna_clip_summary r;
    LUNA_TRY(luna_clipper_queue(c, grads, clip_norm, mode));
    LUNA_TRY(luna_clipper_finish(c, &r));
    if (grad_norm) *grad_norm = r.grad_norm;
    if (all_finite) *all_finite = r.all_finite;
    if (clipped) *clipped = r.clipped;
    return LUNA_OK;
}

luna_status luna_clip_gradients(luna_backend *be, const luna_tensor_table *tt, float *grads,
                                double clip_norm, luna_clip_mode mode, double *grad_norm,
                                bool *clipped, bool *all_finite) {
    if (grad_norm) *grad_norm = 0.0;
    if (clipped) *clipped = false;
    if (all_finite) *all_finite = true;
    if (!be || !tt) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: NULL argument");
    LUNA_TRY(check_args(clip_norm, mode));
    luna_clipper *c = NULL;
    LUNA_TRY(luna_clipper_create(&c, be, tt));
    luna_status st = luna_clipper_apply(c, grads, clip_norm, mode, grad_norm, clipped, all_finite);
    luna_clipper_free(c);
    return st;
}
