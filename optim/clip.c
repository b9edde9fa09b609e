/* Gradient clipping with the non-finite check (see optim/clip.h). */
#include "optim/clip.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static double clip_coefficient(double clip_norm, double norm) {
    double c = clip_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
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
    int nt = p->num_tensors;
    if (nt <= 0) return LUNA_OK;

    /* Σg² per tensor into one device array, then one copy to the host. */
    size_t bytes = (size_t)nt * sizeof(float);
    float *dev = luna_mem_alloc(be, bytes);
    float *host = malloc(bytes);
    if (!dev || !host) {
        if (dev) luna_mem_release(be, dev, bytes);
        free(host);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "clip_gradients: out of memory");
    }
    luna_status st = LUNA_OK;
    for (int i = 0; i < nt && st == LUNA_OK; i++) {
        const luna_param_info *info = &p->tensors[i];
        if (!info->has_grad) continue;
        st = be->ops->sum_squares(be, dev + i, p->grad + info->offset, (int64_t)info->numel);
    }
    if (st == LUNA_OK) st = luna_backend_synchronize(be);
    if (st == LUNA_OK) st = luna_mem_to_host(be, host, dev, bytes);
    luna_mem_release(be, dev, bytes);
    if (st != LUNA_OK) {
        free(host);
        luna_error_prefix("clip_gradients");
        return st;
    }

    /* Norms; a NaN/Inf element (or an fp32 overflow of Σg²) makes its Σg² non-finite. */
    double total_sq = 0.0, max_norm = 0.0;
    bool finite = true;
    for (int i = 0; i < nt; i++) {
        if (!p->tensors[i].has_grad) continue;
        double sq = (double)host[i];
        if (!isfinite(sq)) finite = false;
        total_sq += sq;
        double nrm = sqrt(sq);
        if (!(nrm <= max_norm)) max_norm = nrm; /* NaN propagates */
    }
    double norm = mode == LUNA_CLIP_TOTAL ? sqrt(total_sq) : max_norm;
    if (!finite && isfinite(norm)) norm = INFINITY;
    if (grad_norm) *grad_norm = norm;
    if (all_finite) *all_finite = finite;
    if (!finite || clip_norm == 0.0) {
        free(host);
        return LUNA_OK;
    }

    bool any = false;
    double total_coef = clip_coefficient(clip_norm, norm);
    for (int i = 0; i < nt && st == LUNA_OK; i++) {
        const luna_param_info *info = &p->tensors[i];
        if (!info->has_grad) continue;
        double coef = mode == LUNA_CLIP_TOTAL ? total_coef
                                              : clip_coefficient(clip_norm, sqrt((double)host[i]));
        if (coef >= 1.0) continue;
        any = true;
        st = be->ops->scale(be, p->grad + info->offset, (float)coef, (int64_t)info->numel);
    }
    free(host);
    if (clipped) *clipped = any;
    if (st != LUNA_OK) luna_error_prefix("clip_gradients");
    return st;
}
