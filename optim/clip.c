/* Gradient clipping with the non-finite check (see optim/clip.h). */
#include "optim/clip.h"

#include <stdlib.h>
#include <string.h>

#include "core/tensor_table.h"

_Static_assert(LUNA_CLIP_EACH == 0 && LUNA_CLIP_TOTAL == 1,
               "mode codes of core/backend.h clip_coefficients");

struct luna_clipper {
    luna_backend *be;
    luna_params *p;
    luna_tensor_table *tt; /* the tensors with has_grad, in parameter order */
    float *dev;            /* device: sumsq [N], coef [N] */
    double *summary;       /* device [3]: norm, finite, clipped */
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
    luna_tensor_table_free(c->tt);
    if (c->dev) luna_mem_release(c->be, c->dev, c->dev_bytes);
    free(c);
}

luna_status luna_clipper_create(luna_clipper **out, luna_backend *be, luna_params *p) {
    if (!out || !be || !p)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clipper_create: NULL argument");
    *out = NULL;
    luna_clipper *c = calloc(1, sizeof *c);
    int nt = p->num_tensors > 0 ? p->num_tensors : 0;
    int64_t *offsets = malloc((size_t)(nt + 1) * sizeof *offsets);
    int64_t *numels = malloc((size_t)(nt + 1) * sizeof *numels);
    if (!c || !offsets || !numels) {
        free(c);
        free(offsets);
        free(numels);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "clipper: out of host memory");
    }
    c->be = be;
    c->p = p;
    int n = 0;
    for (int i = 0; i < nt; i++) {
        if (!p->tensors[i].has_grad) continue;
        offsets[n] = (int64_t)p->tensors[i].offset;
        numels[n++] = (int64_t)p->tensors[i].numel;
    }
    luna_status st = luna_tensor_table_create(&c->tt, be, n, offsets, numels);
    free(offsets);
    free(numels);
    if (st == LUNA_OK) {
        /* sumsq and coef, then the summary (8-byte aligned: 2N floats rounded up to 8 bytes). */
        size_t floats = ((size_t)2 * (size_t)n + 1) & ~(size_t)1;
        c->dev_bytes = floats * sizeof(float) + 3 * sizeof(double);
        c->dev = luna_mem_alloc(be, c->dev_bytes);
        if (!c->dev)
            st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "clipper: cannot allocate %zu bytes on %s",
                            c->dev_bytes, be->name);
        else
            c->summary = (double *)(void *)(c->dev + floats);
    }
    if (st != LUNA_OK) {
        luna_clipper_free(c);
        luna_error_prefix("clip_gradients");
        return st;
    }
    *out = c;
    return LUNA_OK;
}

luna_status luna_clipper_apply(luna_clipper *c, double clip_norm, luna_clip_mode mode,
                               double *grad_norm, bool *clipped, bool *all_finite) {
    if (grad_norm) *grad_norm = 0.0;
    if (clipped) *clipped = false;
    if (all_finite) *all_finite = true;
    if (!c) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: NULL argument");
    if (!(clip_norm >= 0.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--clip-norm %g: must be >= 0", clip_norm);
    if (mode != LUNA_CLIP_EACH && mode != LUNA_CLIP_TOTAL)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: unknown mode %d", (int)mode);
    const int n = c->tt->num_tensors;
    if (n == 0) return LUNA_OK;
    luna_backend *be = c->be;
    float *sumsq = c->dev, *coef = c->dev + n;
    /* Σg² per tensor, the norm and coefficients, the scaling: all on the device. */
    luna_status st = be->ops->multi_sum_squares(be, sumsq, c->p->grad, c->tt);
    if (st == LUNA_OK)
        st = be->ops->clip_coefficients(be, coef, c->summary, sumsq, n, clip_norm, (int)mode);
    if (st == LUNA_OK && clip_norm != 0.0)
        st = be->ops->multi_scale(be, c->p->grad, c->tt, coef, 1.0f);
    double host[3] = {0.0, 1.0, 0.0};
    if (st == LUNA_OK) st = luna_mem_to_host(be, host, c->summary, sizeof host);
    if (st != LUNA_OK) {
        luna_error_prefix("clip_gradients");
        return st;
    }
    if (grad_norm) *grad_norm = host[0];
    if (all_finite) *all_finite = host[1] != 0.0;
    if (clipped) *clipped = host[2] != 0.0;
    return LUNA_OK;
}

luna_status luna_clip_gradients(luna_backend *be, luna_params *p, double clip_norm,
                                luna_clip_mode mode, double *grad_norm, bool *clipped,
                                bool *all_finite) {
    if (grad_norm) *grad_norm = 0.0;
    if (clipped) *clipped = false;
    if (all_finite) *all_finite = true;
    if (!be || !p) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: NULL argument");
    if (!(clip_norm >= 0.0))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--clip-norm %g: must be >= 0", clip_norm);
    if (mode != LUNA_CLIP_EACH && mode != LUNA_CLIP_TOTAL)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "clip_gradients: unknown mode %d", (int)mode);
    luna_clipper *c = NULL;
    LUNA_TRY(luna_clipper_create(&c, be, p));
    luna_status st = luna_clipper_apply(c, clip_norm, mode, grad_norm, clipped, all_finite);
    luna_clipper_free(c);
    return st;
}
