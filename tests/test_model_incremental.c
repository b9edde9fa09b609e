/* Causal Luna attention: the training form (all positions at once, causal_contraction scans) and
 * the incremental decoding form (luna_causal_attention_step with the state P̃, Σ K Φᵀ, Σ Φᵀ V, t)
 * compute the same outputs. Also: the state does not grow with t. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/causal_luna_attention.h"
#include "model/param_table.h"
#include "model/pass.h"
#include "tests/test_util.h"

static double compare_forms(bool untied, luna_causal_activation act, bool masked) {
    enum { B = 3, n = 37, L = 8 };
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = 16;
    c.untie_luna_kv = untied;
    c.causal_activation = act;
    const int d = c.decoder_embed_dim, H = c.decoder_attention_heads;
    luna_params *p;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_init(p, 21), LUNA_OK);
    const luna_attn_w *w = &p->w.decoder[1].self_attn;

    luna_test_rng rng;
    luna_test_rng_seed(&rng, 3);
    float *x = malloc(sizeof(float) * B * n * d), *pp = malloc(sizeof(float) * B * L * d);
    luna_test_fill_uniform(&rng, x, (size_t)B * n * d, -1.5f, 1.5f);
    luna_test_fill_uniform(&rng, pp, (size_t)B * L * d, -1.5f, 1.5f);
    int32_t valid[B] = {8, 3, 5};

    luna_arena *arena;
    ck_assert_int_eq(luna_arena_create(&arena, be, 1 << 20), LUNA_OK);
    luna_pass ps = {.be = be, .arena = arena, .training = false};
    luna_causal_act a;
    ck_assert_int_eq(luna_causal_attention_forward(&ps, w, &a, x, pp, masked ? valid : NULL, B, n,
                                                   L, d, H, !untied, act, 0),
                     LUNA_OK);

    /* The incremental form, one position at a time. */
    luna_causal_state st;
    ck_assert_int_eq(luna_causal_state_init(be, arena, w, &st, pp, masked ? valid : NULL, B, L, d,
                                            H, !untied, act),
                     LUNA_OK);
    size_t used_after_init = luna_arena_used_bytes(arena);
    float *xt = malloc(sizeof(float) * B * d), *yt = malloc(sizeof(float) * B * d);
    double max_ref = 0, max_err = 0;
    const float *ya = a.y; /* CPU backend: fp32 activations in host memory */
    for (int t = 0; t < n; t++) {
        for (int b = 0; b < B; b++)
            memcpy(xt + b * d, x + ((size_t)b * n + t) * d, sizeof(float) * d);
        ck_assert_int_eq(luna_causal_attention_step(be, arena, w, &st, xt, yt), LUNA_OK);
        ck_assert_uint_eq(luna_arena_used_bytes(arena), used_after_init); /* O(1) state */
        for (int b = 0; b < B; b++)
            for (int j = 0; j < d; j++) {
                double ref = ya[((size_t)b * n + t) * d + j];
                max_ref = fmax(max_ref, fabs(ref));
                max_err = fmax(max_err, fabs(ref - yt[b * d + j]));
            }
    }
    ck_assert_int_eq(st.t, n);
    double rel = max_err / fmax(max_ref, 1e-30);
    printf("incremental vs training form (%s, %s, %s): max |diff| %.3g, max |y| %.3g, "
           "relative %.3g\n",
           untied ? "untied" : "tied", act == LUNA_CAUSAL_ELU ? "elu" : "softplus",
           masked ? "P mask" : "no mask", max_err, max_ref, rel);
    ck_assert_msg(rel <= 1e-5, "relative error %g > 1e-5", rel);
    ck_assert_uint_eq(luna_causal_state_bytes(be, L, d) * B, 3 * sizeof(float) * (size_t)B * L * d);
    free(xt);
    free(yt);
    free(x);
    free(pp);
    luna_arena_free(arena);
    luna_params_free(p);
    luna_backend_free(be);
    return rel;
}

START_TEST(tied_softplus_masked) { compare_forms(false, LUNA_CAUSAL_SOFTPLUS, true); }
END_TEST
START_TEST(untied_elu_masked) { compare_forms(true, LUNA_CAUSAL_ELU, true); }
END_TEST
START_TEST(tied_elu_unmasked) { compare_forms(false, LUNA_CAUSAL_ELU, false); }
END_TEST
START_TEST(untied_softplus_unmasked) { compare_forms(true, LUNA_CAUSAL_SOFTPLUS, false); }
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_incremental");
    TCase *tc = tcase_create("incremental");
    tcase_add_test(tc, tied_softplus_masked);
    tcase_add_test(tc, untied_elu_masked);
    tcase_add_test(tc, tied_elu_unmasked);
    tcase_add_test(tc, untied_softplus_unmasked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
