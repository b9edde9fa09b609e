/* int8 models (see quantize.h). */
#include "model/quantize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quantize.h"

luna_status luna_checkpoint_weight_dtype(const luna_safetensors *st, luna_dtype *out) {
    const char *q = luna_safetensors_metadata(st, LUNA_QUANTIZATION_KEY);
    *out = LUNA_F32;
    if (!q) return LUNA_OK;
    if (strcmp(q, "int8") == 0) {
        *out = LUNA_I8;
        return LUNA_OK;
    }
    return luna_error(LUNA_ERR_FORMAT,
                      "%s: __metadata__." LUNA_QUANTIZATION_KEY " is \"%s\"; this luna reads "
                      "\"int8\" (or no key, fp32)",
                      luna_safetensors_path(st), q);
}

bool luna_int8_scale_of(const luna_params *p, const luna_safetensors *st, const char *name) {
    const char *q = luna_safetensors_metadata(st, LUNA_QUANTIZATION_KEY);
    const size_t n = strlen(name), k = strlen(LUNA_INT8_SCALE_SUFFIX);
    if (!q || strcmp(q, "int8") != 0 || n <= k || n - k >= 128) return false;
    if (strcmp(name + n - k, LUNA_INT8_SCALE_SUFFIX) != 0) return false;
    char base[128];
    memcpy(base, name, n - k);
    base[n - k] = '\0';
    const luna_param_info *t = luna_params_find(p, base);
    return t && t->int8;
}

luna_status luna_int8_tensor_load(const luna_safetensors *st, const luna_param_info *t,
                                  float *dst) {
    const char *path = luna_safetensors_path(st);
    const luna_st_tensor *q, *s;
    LUNA_TRY(luna_safetensors_expect(st, t->name, LUNA_I8, t->ndim, t->shape, &q));
    char scale_name[160];
    snprintf(scale_name, sizeof scale_name, "%s" LUNA_INT8_SCALE_SUFFIX, t->name);
    const int64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 1;
    if (!luna_safetensors_find(st, scale_name))
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: tensor '%s' is missing: the int8 tensor '%s' needs its scales "
                          "(F32 [%lld])",
                          path, scale_name, t->name, (long long)rows);
    LUNA_TRY(luna_safetensors_expect(st, scale_name, LUNA_F32, 1, (const int64_t[]){rows}, &s));
    LUNA_TRY(luna_safetensors_check_finite(st, s));
    float *scale = malloc(sizeof(float) * (size_t)rows);
    if (!scale) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    memcpy(scale, s->data, sizeof(float) * (size_t)rows); /* the mapping need not be aligned */
    for (int64_t r = 0; r < rows; r++)
        if (scale[r] < 0.0f) {
            luna_status e = luna_error(LUNA_ERR_FORMAT,
                                       "%s: tensor '%s': negative scale %g at row %lld (scales "
                                       "are max|row| / 127)",
                                       path, scale_name, (double)scale[r], (long long)r);
            free(scale);
            return e;
        }
    luna_dequantize_rows_int8(q->data, scale, rows, cols, dst);
    free(scale);
    return LUNA_OK;
}

luna_status luna_params_quantize_int8(luna_params *p) {
    if (p->weight_dtype == LUNA_I8) return LUNA_OK;
    const size_t bytes = p->num_params * sizeof(float);
    float *host = malloc(bytes);
    size_t max_numel = 0, max_rows = 0;
    for (int i = 0; i < p->num_tensors; i++)
        if (p->tensors[i].int8) {
            if (p->tensors[i].numel > max_numel) max_numel = p->tensors[i].numel;
            if ((size_t)p->tensors[i].shape[0] > max_rows)
                max_rows = (size_t)p->tensors[i].shape[0];
        }
    int8_t *q = malloc(max_numel ? max_numel : 1);
    float *scale = malloc(sizeof(float) * (max_rows ? max_rows : 1));
    luna_status st = host && q && scale ? LUNA_OK
                                        : luna_error(LUNA_ERR_OUT_OF_MEMORY,
                                                     "quantize: out of host memory for %zu "
                                                     "parameters",
                                                     p->num_params);
    if (st == LUNA_OK) st = luna_mem_to_host(p->be, host, p->data, bytes);
    for (int i = 0; i < p->num_tensors && st == LUNA_OK; i++) {
        const luna_param_info *t = &p->tensors[i];
        if (!t->int8) continue;
        float *w = host + t->offset;
        luna_quantize_rows_int8(w, t->shape[0], t->shape[1], q, scale);
        luna_dequantize_rows_int8(q, scale, t->shape[0], t->shape[1], w);
    }
    if (st == LUNA_OK) st = luna_mem_from_host(p->be, p->data, host, bytes);
    if (st == LUNA_OK) p->weight_dtype = LUNA_I8;
    free(host);
    free(q);
    free(scale);
    return st;
}

luna_status luna_params_save_list(const luna_params *p, const float *host, luna_st_tensor **list,
                                  int *count, void **storage) {
    *list = NULL, *count = 0, *storage = NULL;
    const bool int8 = p->weight_dtype == LUNA_I8;
    int n8 = 0;
    size_t qbytes = 0, rows = 0;
    for (int i = 0; int8 && i < p->num_tensors; i++)
        if (p->tensors[i].int8) {
            n8++;
            qbytes += p->tensors[i].numel;
            rows += (size_t)p->tensors[i].shape[0];
        }
    enum { NAME = 160 };
    luna_st_tensor *l = calloc((size_t)(p->num_tensors + n8), sizeof *l);
    char *mem = malloc(sizeof(float) * rows + (size_t)n8 * NAME + qbytes + 1);
    if (!l || !mem) {
        free(l), free(mem);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "saving: out of host memory");
    }
    float *scales = (float *)mem;
    char *names = mem + sizeof(float) * rows;
    int8_t *q = (int8_t *)(names + (size_t)n8 * NAME);
    int k = 0;
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        luna_st_tensor e = {.name = t->name,
                            .dtype = LUNA_F32,
                            .ndim = t->ndim,
                            .shape = {t->shape[0], t->shape[1]},
                            .data = host + t->offset,
                            .nbytes = t->numel * sizeof(float)};
        if (int8 && t->int8) {
            /* the parameters hold q·scale: quantizing them again gives back q and the scales */
            luna_quantize_rows_int8(host + t->offset, t->shape[0], t->shape[1], q, scales);
            e.dtype = LUNA_I8, e.data = q, e.nbytes = t->numel;
            l[k++] = e;
            snprintf(names, NAME, "%s" LUNA_INT8_SCALE_SUFFIX, t->name);
            l[k++] = (luna_st_tensor){.name = names,
                                      .dtype = LUNA_F32,
                                      .ndim = 1,
                                      .shape = {t->shape[0]},
                                      .data = scales,
                                      .nbytes = sizeof(float) * (size_t)t->shape[0]};
            q += t->numel, scales += t->shape[0], names += NAME;
        } else {
            l[k++] = e;
        }
    }
    *list = l, *count = k, *storage = mem;
    return LUNA_OK;
}
