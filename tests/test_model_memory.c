/* Activation memory of one layer's forward + backward (arena high-water mark, plus the ops'
 * scratch high-water mark) as the sequence length doubles: linear for Luna layers (ratio ≈ 2 per
 * doubling), quadratic for the softmax baseline (ratio → 4). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "model/param_table.h"
#include "tests/test_util.h"

enum { NUM_LENGTHS = 4 };
static const int lengths[NUM_LENGTHS] = {512, 1024, 2048, 4096};

typedef enum { ENCODER, DECODER } which_layer;

/* Peak bytes of forward + backward of one layer with B = 1, m = n. */
static size_t layer_peak(const char *arch, which_layer which, int n) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, arch), LUNA_OK);
    c.vocab_size = 16;
    c.encoder_layers = c.decoder_layers = 1;
    c.encoder_embed_dim = c.decoder_embed_dim = 32;
    c.encoder_ffn_embed_dim = c.decoder_ffn_embed_dim = 64;
    c.encoder_attention_heads = c.decoder_attention_heads = 2;
    if (c.arch == LUNA_ARCH_LUNA) c.projection_length = 16;
    const int d = 32, B = 1, L = c.arch == LUNA_ARCH_LUNA ? 16 : 0;
    luna_params *p;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);

    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)n);
    size_t nd = (size_t)B * n * d, Ld = (size_t)B * (L ? L : 1) * d;
    float *x = malloc(nd * sizeof(float)), *e = malloc(nd * sizeof(float));
    float *pp = malloc(Ld * sizeof(float)), *dy = malloc(nd * sizeof(float));
    float *dp = malloc(Ld * sizeof(float)), *dx = malloc(nd * sizeof(float));
    float *dpin = malloc(Ld * sizeof(float)), *de = calloc(nd, sizeof(float));
    luna_test_fill_uniform(&rng, x, nd, -1, 1);
    luna_test_fill_uniform(&rng, e, nd, -1, 1);
    luna_test_fill_uniform(&rng, pp, Ld, -1, 1);
    luna_test_fill_uniform(&rng, dy, nd, -1, 1);
    luna_test_fill_uniform(&rng, dp, Ld, -1, 1);
    int32_t src_valid[1] = {n}, tgt_valid[1] = {n}, p_valid[1] = {L};
    luna_layer_dims dims = {.B = B,
                            .n = n,
                            .m = n,
                            .L = L,
                            .src_valid = src_valid,
                            .tgt_valid = tgt_valid,
                            .p_valid = L ? p_valid : NULL};

    luna_arena *arena;
    ck_assert_int_eq(luna_arena_create(&arena, be, 1 << 20), LUNA_OK);
    luna_pass ps = {.be = be,
                    .arena = arena,
                    .training = true,
                    .backward = true,
                    .seed = 1,
                    .step = 1,
                    .dropout = 0.1f,
                    .attention_dropout = 0.1f,
                    .activation_dropout = 0.1f};
    luna_arena_reset_peak(be->scratch);
    size_t used_after_forward = 0;
    if (which == ENCODER) {
        luna_encoder_layer_act act;
        ck_assert_int_eq(
            luna_encoder_layer_forward(&ps, &c, &p->w.encoder[0], &act, x, L ? pp : NULL, &dims, 0),
            LUNA_OK);
        used_after_forward = luna_arena_used_bytes(arena);
        ck_assert_int_eq(luna_encoder_layer_backward(&ps, &c, &p->w.encoder[0], &p->g.encoder[0],
                                                     &act, dy, L ? dp : NULL, dx, L ? dpin : NULL),
                         LUNA_OK);
    } else {
        luna_decoder_layer_act act;
        ck_assert_int_eq(luna_decoder_layer_forward(&ps, &c, &p->w.decoder[0], &act, x,
                                                    L ? pp : NULL, e, &dims, 0),
                         LUNA_OK);
        used_after_forward = luna_arena_used_bytes(arena);
        ck_assert_int_eq(luna_decoder_layer_backward(&ps, &c, &p->w.decoder[0], &p->g.decoder[0],
                                                     &act, dy, L ? dp : NULL, dx, L ? dpin : NULL,
                                                     de),
                         LUNA_OK);
    }
    /* Backward releases its temporaries; the gradients are finite (the pass really ran). */
    ck_assert_uint_eq(luna_arena_used_bytes(arena), used_after_forward);
    for (size_t i = 0; i < nd; i += 97)
        ck_assert(isfinite(dx[i]) && isfinite(de[i]));
    size_t peak = luna_arena_peak_bytes(arena) + luna_arena_peak_bytes(be->scratch);
    free(x), free(e), free(pp), free(dy), free(dp), free(dx), free(dpin), free(de);
    luna_arena_free(arena);
    luna_params_free(p);
    luna_backend_free(be);
    return peak;
}

static void growth(const char *label, const char *arch, which_layer which, double *last_ratio,
                   double *max_ratio) {
    size_t peaks[NUM_LENGTHS];
    *max_ratio = 0;
    for (int i = 0; i < NUM_LENGTHS; i++) {
        peaks[i] = layer_peak(arch, which, lengths[i]);
        if (i > 0) {
            double r = (double)peaks[i] / (double)peaks[i - 1];
            *max_ratio = fmax(*max_ratio, r);
            *last_ratio = r;
        }
    }
    printf("%-26s", label);
    for (int i = 0; i < NUM_LENGTHS; i++)
        printf(" n=%d: %.2f MB", lengths[i], peaks[i] / 1048576.0);
    printf("  ratios:");
    for (int i = 1; i < NUM_LENGTHS; i++)
        printf(" %.3f", (double)peaks[i] / (double)peaks[i - 1]);
    printf("\n");
}

START_TEST(luna_layers_grow_linearly) {
    double last, max;
    growth("luna encoder layer", "luna_tiny", ENCODER, &last, &max);
    ck_assert_msg(max < 2.3, "Luna encoder layer memory ratio per doubling %.3f >= 2.3", max);
    ck_assert_msg(last > 1.7, "implausibly flat growth %.3f", last);
    growth("luna decoder layer", "luna_tiny", DECODER, &last, &max);
    ck_assert_msg(max < 2.3, "Luna decoder layer memory ratio per doubling %.3f >= 2.3", max);
    ck_assert_msg(last > 1.7, "implausibly flat growth %.3f", last);
}
END_TEST

START_TEST(softmax_layers_grow_quadratically) {
    double last, max;
    growth("transformer encoder layer", "transformer_tiny", ENCODER, &last, &max);
    ck_assert_msg(last > 3.0, "softmax encoder layer memory ratio %.3f <= 3 at n=4096", last);
    growth("transformer decoder layer", "transformer_tiny", DECODER, &last, &max);
    ck_assert_msg(last > 3.0, "softmax decoder layer memory ratio %.3f <= 3 at n=4096", last);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_memory");
    TCase *tc = tcase_create("memory");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, luna_layers_grow_linearly);
    tcase_add_test(tc, softmax_layers_grow_quadratically);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
