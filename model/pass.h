/* The per-pass context (`luna_pass`) that every layer's forward/backward receives: backend,
 * activation arena, training flag and the dropout keys; and the dropout-site numbering that makes
 * dropout reproducible (a mask is a function of (seed, step, site, element), core/rng.h). */
#ifndef LUNA_MODEL_PASS_H
#define LUNA_MODEL_PASS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/rng.h"

typedef struct {
    luna_backend *be;
    luna_arena *arena; /* activations saved by forward; backward temporaries */
    bool training;     /* dropout on */
    bool backward;     /* a backward pass follows: the forward keeps what it needs (false in
                          decoding and validation: e.g. the FFN's relu goes into its GEMM) */
    uint64_t seed;     /* dropout keys are (seed, step, site) */
    uint64_t step;
    const uint64_t *step_at; /* NULL, or where the kernels read the step (luna_rng_key.step_at) */
    float dropout, attention_dropout, activation_dropout;
} luna_pass;

/* Site ids: component (8 bits) | layer (12 bits) | site within the layer (8 bits). Parameter
 * initialisation uses LUNA_INIT_STREAM | tensor index, which no site reaches. */
#define LUNA_SITE(component, layer, k)                                                             \
    (((uint32_t)(component) << 20) | ((uint32_t)(layer) << 8) | (uint32_t)(k))
#define LUNA_INIT_STREAM 0x80000000u
enum {
    LUNA_SITE_ENCODER_EMBED = 1,
    LUNA_SITE_PROJECTED_EMBED,
    LUNA_SITE_DECODER_EMBED,
    LUNA_SITE_ENCODER_LAYER,
    LUNA_SITE_DECODER_LAYER,
};
/* Within a layer: attention modules use k in [0, 8) (self) and [8, 16) (cross); the layer's own
 * sites (residual dropouts, FFN) start at 16. */
#define LUNA_SITE_SELF_ATTN 0
#define LUNA_SITE_CROSS_ATTN 8
#define LUNA_SITE_LAYER 16

static inline luna_rng_key luna_pass_key(const luna_pass *ps, uint32_t site) {
    luna_rng_key k = {
        .seed = ps->seed, .step = ps->step, .stream_id = site, .step_at = ps->step_at};
    return k;
}

/* Dropout with probability p at `site`, in place allowed; a no-op copy (or nothing when y == x)
 * when !training or p == 0. The backward regenerates the same mask. */
luna_status luna_pass_dropout(const luna_pass *ps, luna_act *y, const luna_act *x, int64_t n,
                              float p, uint32_t site);
luna_status luna_pass_dropout_backward(const luna_pass *ps, luna_act *dx, const luna_act *dy,
                                       int64_t n, float p, uint32_t site);
static inline bool luna_pass_drops(const luna_pass *ps, float p) { return ps->training && p > 0; }

/* Attention probabilities (the fused softmax_dropout op): y = masked softmax of x (in place
 * allowed; kept for backward) and, in the same pass, *y_d = dropout(y) at `site` in a new arena
 * buffer (`what`) when luna_pass_drops(p), else *y_d = y. The backward overwrites dx [rows, cols]
 * (may alias dyd) with the softmax backward of dropout_backward(dyd). */
luna_status luna_pass_softmax_dropout(const luna_pass *ps, luna_act *y, luna_act **y_d,
                                      const luna_act *x, int64_t rows, int cols,
                                      const int32_t *valid_cols, int64_t rows_per_group,
                                      int causal_period, float p, uint32_t site, const char *what);
luna_status luna_pass_softmax_dropout_backward(const luna_pass *ps, luna_act *dx,
                                               const luna_act *dyd, const luna_act *y, int64_t rows,
                                               int cols, float p, uint32_t site);

/* Arena allocation, with an out-of-memory error naming `what`: `count` activation elements (of
 * the backend's act_dtype: what ops take as luna_act), fp32 values (statistics kept for backward,
 * losses: always fp32) or int32s (tokens, masks). */
luna_status luna_pass_alloc(const luna_pass *ps, luna_act **out, int64_t count, const char *what);
luna_status luna_pass_alloc_f32(const luna_pass *ps, float **out, int64_t count, const char *what);
luna_status luna_pass_alloc_i32(const luna_pass *ps, int32_t **out, int64_t count,
                                const char *what);

#endif
