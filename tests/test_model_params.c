/* Parameter layout, counts (spec §6), names (§7), initialisation (§5) and the configuration's
 * presets and JSON form. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/param_table.h"
#include "model/pass.h"
#include "tests/test_util.h"

#define WMT_VOCAB 40624

static luna_config preset(const char *name, int vocab) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, name), LUNA_OK);
    c.vocab_size = vocab;
    return c;
}

START_TEST(exact_parameter_counts_of_spec_table) {
    struct {
        const char *arch;
        int l;
        size_t expected;
    } rows[] = {
        {"luna_base_tied", 16, 69686272},   {"luna_base_tied", 32, 69694464},
        {"luna_base_untied", 16, 77565952}, {"luna_base_untied", 32, 77574144},
        {"transformer_base", 0, 64937984},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        luna_config c = preset(rows[i].arch, WMT_VOCAB);
        if (rows[i].l) c.projection_length = rows[i].l;
        size_t n = luna_config_num_parameters(&c);
        printf("params: %-17s l=%-2d V=%d: %zu (spec %zu)\n", rows[i].arch, rows[i].l, WMT_VOCAB, n,
               rows[i].expected);
        ck_assert_uint_eq(n, rows[i].expected);
    }
}
END_TEST

/* Names and shapes of the official state_dict (spec §7), and per-layer tensor counts (§6). */
START_TEST(names_shapes_and_order) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_config c = preset("luna_tiny", 50);
    luna_params *p;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_str_eq(p->tensors[0].name, "encoder.embed_tokens.weight");
    ck_assert_str_eq(p->tensors[1].name, "encoder.projected_embeddings");
    ck_assert_int_eq(p->tensors[1].shape[0], 8);
    ck_assert_int_eq(p->tensors[1].shape[1], 32);
    const char *expected[] = {
        "encoder.layers.0.self_attn.pq_proj.weight",
        "encoder.layers.0.self_attn.c_proj.bias",
        "encoder.layers.0.self_attn_layer_norm.weight",
        "encoder.layers.0.self_atten_proj_layer_norm.bias",
        "encoder.layers.1.fc1.weight",
        "encoder.layers.1.final_layer_norm.weight",
        "decoder.layers.0.self_attn.pc_proj.weight",
        "decoder.layers.0.encoder_attn.out_proj.bias",
        "decoder.layers.0.encoder_attn_layer_norm.weight",
        "decoder.layers.1.encoder_atten_proj_layer_norm.weight",
        "decoder.layers.1.final_layer_norm.bias",
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        ck_assert_msg(luna_params_find(p, expected[i]) != NULL, "missing %s", expected[i]);
    const luna_param_info *fc1 = luna_params_find(p, "decoder.layers.1.fc1.weight");
    ck_assert_int_eq(fc1->shape[0], 64);
    ck_assert_int_eq(fc1->shape[1], 32);
    /* Contiguous, in order, covering the buffer; views point at the right offsets. */
    size_t off = 0;
    for (int i = 0; i < p->num_tensors; i++) {
        ck_assert_uint_eq(p->tensors[i].offset, off);
        off += p->tensors[i].numel;
    }
    ck_assert_uint_eq(off, p->num_params);
    ck_assert_ptr_eq(p->w.decoder[1].fc1.weight, p->data + fc1->offset);
    ck_assert_ptr_eq(p->g.decoder[1].fc1.weight, p->grad + fc1->offset);
    ck_assert_ptr_null(p->w.encoder[0].self_attn.k_proj.weight);
    /* Per layer (tied): encoder 5 Linears + FFN + 3 LN, decoder 10 Linears + FFN + 4 LN. */
    int enc0 = 0, dec0 = 0;
    for (int i = 0; i < p->num_tensors; i++) {
        enc0 += strncmp(p->tensors[i].name, "encoder.layers.0.", 17) == 0;
        dec0 += strncmp(p->tensors[i].name, "decoder.layers.0.", 17) == 0;
    }
    ck_assert_int_eq(enc0, 2 * (5 + 2 + 3));
    ck_assert_int_eq(dec0, 2 * (10 + 2 + 4));
    /* Only the last decoder layer's P LayerNorm has no gradient. */
    int no_grad = 0;
    for (int i = 0; i < p->num_tensors; i++)
        no_grad += !p->tensors[i].has_grad;
    ck_assert_int_eq(no_grad, 2);
    ck_assert(
        !luna_params_find(p, "decoder.layers.1.encoder_atten_proj_layer_norm.weight")->has_grad);
    luna_params_free(p);

    /* Untied: bidirectional has pk/pv/k/v, causal keeps pc and has k/v. */
    c.untie_luna_kv = true;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_ptr_nonnull(luna_params_find(p, "encoder.layers.0.self_attn.pv_proj.weight"));
    ck_assert_ptr_null(luna_params_find(p, "encoder.layers.0.self_attn.pc_proj.weight"));
    ck_assert_ptr_nonnull(luna_params_find(p, "decoder.layers.0.self_attn.pc_proj.weight"));
    ck_assert_ptr_nonnull(luna_params_find(p, "decoder.layers.0.self_attn.v_proj.weight"));
    ck_assert_ptr_null(luna_params_find(p, "decoder.layers.0.self_attn.pk_proj.weight"));
    luna_params_free(p);

    luna_config t = preset("transformer_tiny", 50);
    ck_assert_int_eq(luna_params_create(&p, be, &t), LUNA_OK);
    ck_assert_str_eq(p->tensors[1].name, "encoder.layers.0.self_attn.k_proj.weight");
    ck_assert_ptr_nonnull(luna_params_find(p, "decoder.layers.1.encoder_attn.q_proj.bias"));
    ck_assert_ptr_null(luna_params_find(p, "encoder.projected_embeddings"));
    luna_params_free(p);
    luna_backend_free(be);
}
END_TEST

static void moments(const float *x, size_t n, double *mean, double *sd, double *maxabs) {
    double s = 0, s2 = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        m = fmax(m, fabs(x[i]));
    }
    *mean = s / n;
    *sd = sqrt(s2 / n - *mean * *mean);
    *maxabs = m;
}

/* §5: distributions and bounds per tensor kind; reproducible per seed; padding row zero. */
START_TEST(initialisation_follows_spec) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_config c = preset("luna_base_tied", 1000);
    c.encoder_layers = c.decoder_layers = 1;
    luna_params *p;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_init(p, 7), LUNA_OK);
    const int d = 512;
    double mean, sd, mx;
    /* Embedding N(0, d^-1/2), padding row zero. */
    const float *E = p->w.embed_tokens;
    for (int j = 0; j < d; j++)
        ck_assert_float_eq(E[1 * d + j], 0.0f);
    moments(E + 2 * d, (size_t)998 * d, &mean, &sd, &mx);
    ck_assert_msg(fabs(sd - 1.0 / sqrt(d)) < 0.002 && fabs(mean) < 0.001, "embed sd %g", sd);
    /* xavier gain 1/√2 on pq: bound = sqrt(6/1024)/√2 */
    double bound = sqrt(6.0 / 1024) / sqrt(2.0);
    moments(p->w.encoder[0].self_attn.pq_proj.weight, (size_t)d * d, &mean, &sd, &mx);
    ck_assert(mx <= bound && mx > 0.99 * bound);
    ck_assert_msg(fabs(sd - bound / sqrt(3.0)) < 0.001, "pq sd %g", sd);
    /* out_proj: gain 1, bias 0 */
    moments(p->w.decoder[0].encoder_attn.out_proj.weight, (size_t)d * d, &mean, &sd, &mx);
    ck_assert(mx <= sqrt(6.0 / 1024) && mx > 0.99 * sqrt(6.0 / 1024));
    moments(p->w.decoder[0].encoder_attn.out_proj.bias, d, &mean, &sd, &mx);
    ck_assert(mx == 0.0);
    /* q bias and fc1 weights/biases: U(±1/√fan_in) */
    moments(p->w.encoder[0].self_attn.q_proj.bias, d, &mean, &sd, &mx);
    ck_assert(mx <= 1 / sqrt(d) && mx > 0.9 / sqrt(d));
    moments(p->w.encoder[0].fc2.weight, (size_t)d * 2048, &mean, &sd, &mx);
    ck_assert(mx <= 1 / sqrt(2048.0) && mx > 0.99 / sqrt(2048.0));
    moments(p->w.encoder[0].fc1.bias, 2048, &mean, &sd, &mx);
    ck_assert(mx <= 1 / sqrt(512.0) && mx > 0.95 / sqrt(512.0));
    /* LayerNorm 1 / 0 */
    for (int j = 0; j < d; j++) {
        ck_assert_float_eq(p->w.encoder[0].self_atten_proj_layer_norm.weight[j], 1.0f);
        ck_assert_float_eq(p->w.decoder[0].final_layer_norm.bias[j], 0.0f);
    }
    /* P: N(0, d^-1/2) */
    moments(p->w.projected_embeddings, (size_t)32 * d, &mean, &sd, &mx);
    ck_assert_msg(fabs(sd - 1.0 / sqrt(d)) < 0.004, "P sd %g", sd);
    /* Same seed, same values; another seed, different values. */
    float *copy = malloc(p->num_params * sizeof(float));
    memcpy(copy, p->data, p->num_params * sizeof(float));
    ck_assert_int_eq(luna_params_init(p, 7), LUNA_OK);
    ck_assert_int_eq(memcmp(copy, p->data, p->num_params * sizeof(float)), 0);
    ck_assert_int_eq(luna_params_init(p, 8), LUNA_OK);
    ck_assert_int_ne(memcmp(copy, p->data, p->num_params * sizeof(float)), 0);
    /* Different tensors of the same shape draw different values (own stream each). */
    ck_assert_int_ne(memcmp(p->w.encoder[0].self_attn.pq_proj.weight,
                            p->w.encoder[0].self_attn.q_proj.weight, 64 * sizeof(float)),
                     0);
    free(copy);
    luna_params_free(p);
    luna_backend_free(be);
}
END_TEST

/* Every architecture field is caught by name with both values; dropout and label smoothing are
 * training settings, not architecture. */
START_TEST(config_architecture_difference_names_the_field) {
    luna_config a, b;
    char va[32], vb[32];
    ck_assert_int_eq(luna_config_preset(&a, "luna_base_tied"), LUNA_OK);
    a.vocab_size = 1000;
    b = a;
    ck_assert_ptr_null(luna_config_architecture_difference(&a, &b, va, vb, sizeof va));
    b.dropout = 0.3;
    b.label_smoothing = 0.0;
    ck_assert_ptr_null(luna_config_architecture_difference(&a, &b, va, vb, sizeof va));
    struct {
        const char *name;
        int *field;
    } ints[] = {{"vocab_size", &b.vocab_size},
                {"padding_idx", &b.padding_idx},
                {"encoder_embed_dim", &b.encoder_embed_dim},
                {"decoder_embed_dim", &b.decoder_embed_dim},
                {"encoder_ffn_embed_dim", &b.encoder_ffn_embed_dim},
                {"decoder_ffn_embed_dim", &b.decoder_ffn_embed_dim},
                {"encoder_layers", &b.encoder_layers},
                {"decoder_layers", &b.decoder_layers},
                {"encoder_attention_heads", &b.encoder_attention_heads},
                {"decoder_attention_heads", &b.decoder_attention_heads},
                {"projection_length", &b.projection_length}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        b = a;
        *ints[i].field += 1;
        const char *f = luna_config_architecture_difference(&a, &b, va, vb, sizeof va);
        ck_assert_ptr_nonnull(f);
        ck_assert_str_eq(f, ints[i].name);
        char want[32];
        snprintf(want, sizeof want, "%d", *ints[i].field);
        ck_assert_str_eq(vb, want);
    }
    b = a;
    b.untie_luna_kv = !a.untie_luna_kv;
    ck_assert_str_eq(luna_config_architecture_difference(&a, &b, va, vb, sizeof va),
                     "untie_luna_kv");
    b = a;
    b.fix_projection_length = !a.fix_projection_length;
    ck_assert_str_eq(luna_config_architecture_difference(&a, &b, va, vb, sizeof va),
                     "fix_projection_length");
    b = a;
    b.causal_activation = LUNA_CAUSAL_ELU;
    ck_assert_str_eq(luna_config_architecture_difference(&a, &b, va, vb, sizeof va),
                     "causal_activation");
    ck_assert_str_eq(va, "softplus");
    ck_assert_str_eq(vb, "elu");
    b = a;
    b.arch = LUNA_ARCH_TRANSFORMER;
    ck_assert_str_eq(luna_config_architecture_difference(&a, &b, va, vb, sizeof va), "arch");
    ck_assert_str_eq(vb, "transformer");
}
END_TEST

static bool configs_equal(const luna_config *a, const luna_config *b) {
    return a->arch == b->arch && a->vocab_size == b->vocab_size &&
           a->padding_idx == b->padding_idx && a->encoder_embed_dim == b->encoder_embed_dim &&
           a->encoder_ffn_embed_dim == b->encoder_ffn_embed_dim &&
           a->encoder_layers == b->encoder_layers &&
           a->encoder_attention_heads == b->encoder_attention_heads &&
           a->decoder_embed_dim == b->decoder_embed_dim &&
           a->decoder_ffn_embed_dim == b->decoder_ffn_embed_dim &&
           a->decoder_layers == b->decoder_layers &&
           a->decoder_attention_heads == b->decoder_attention_heads &&
           a->projection_length == b->projection_length && a->untie_luna_kv == b->untie_luna_kv &&
           a->fix_projection_length == b->fix_projection_length &&
           a->causal_activation == b->causal_activation && a->dropout == b->dropout &&
           a->attention_dropout == b->attention_dropout &&
           a->activation_dropout == b->activation_dropout &&
           a->label_smoothing == b->label_smoothing;
}

START_TEST(config_json_roundtrip_and_validation) {
    luna_config c = preset("luna_base_untied", 32000);
    c.causal_activation = LUNA_CAUSAL_ELU;
    c.fix_projection_length = true;
    c.projection_length = 16;
    c.attention_dropout = 0.05;
    char *json;
    ck_assert_int_eq(luna_config_to_json(&c, &json), LUNA_OK);
    ck_assert_ptr_nonnull(strstr(json, "\"arch\":\"luna\""));
    ck_assert_ptr_nonnull(strstr(json, "\"causal_activation\":\"elu\""));
    ck_assert_ptr_nonnull(strstr(json, "\"dropout\":0.1"));
    luna_config back;
    ck_assert_int_eq(luna_config_from_json(&back, json, strlen(json)), LUNA_OK);
    ck_assert(configs_equal(&back, &c));
    free(json);
    /* The fixture form (a subset of keys, transformer). */
    const char *fixture =
        "{\"arch\": \"transformer\", \"vocab_size\": 40, \"padding_idx\": 1, "
        "\"encoder_embed_dim\": 16, \"encoder_ffn_embed_dim\": 32, \"encoder_layers\": 2, "
        "\"encoder_attention_heads\": 2, \"decoder_embed_dim\": 16, \"decoder_ffn_embed_dim\": "
        "32, \"decoder_layers\": 1, \"decoder_attention_heads\": 4, \"projection_length\": 0, "
        "\"untie_luna_kv\": false, \"causal_activation\": \"softplus\", "
        "\"fix_projection_length\": false, \"label_smoothing\": 0.1, \"dropout\": 0.0}";
    ck_assert_int_eq(luna_config_from_json(&back, fixture, strlen(fixture)), LUNA_OK);
    ck_assert_int_eq(back.arch, LUNA_ARCH_TRANSFORMER);
    ck_assert_int_eq(back.decoder_layers, 1);
    ck_assert_int_eq(back.decoder_attention_heads, 4);
    ck_assert(back.dropout == 0.0);
    /* Errors name the option. */
    const char *bad = "{\"vocab_size\": 40, \"encoder_attention_heads\": 7}";
    ck_assert_int_eq(luna_config_from_json(&back, bad, strlen(bad)), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "encoder_attention_heads"));
    const char *typed = "{\"vocab_size\": \"40\"}";
    ck_assert_int_eq(luna_config_from_json(&back, typed, strlen(typed)), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "vocab_size"));
    ck_assert_int_eq(luna_config_preset(&back, "luna_huge"), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "luna_base_tied"));
    for (const char *const *n = luna_config_preset_names(); *n; n++)
        ck_assert_int_eq(luna_config_preset(&back, *n), LUNA_OK);
}
END_TEST

START_TEST(json_reader_edge_cases) {
    luna_json *v;
    const char *ok = " {\"a\": [1, -2, 3.5e2, true, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\", "
                     "\"big\": 18446744073709551615}";
    ck_assert_int_eq(luna_json_parse(&v, ok, strlen(ok), NULL), LUNA_OK);
    const luna_json *a = luna_json_get(v, "a");
    ck_assert_int_eq(a->length, 5);
    ck_assert(a->items[1].is_int && a->items[1].int_value == -2);
    ck_assert(!a->items[2].is_int && a->items[2].number == 350.0);
    ck_assert_str_eq(luna_json_get(v, "s")->string, "x\xc3\xa9\xf0\x9f\x98\x80\n");
    ck_assert(luna_json_get(v, "big")->uint_value == UINT64_MAX);
    luna_json_free(v);
    const char *bads[] = {"{\"a\":1,}",  "[1 2]", "{\"a\":1,\"a\":2}",
                          "\"\\ud800\"", "01",    "{\"a\":tru}",
                          "[1]x",        "\"abc"};
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        size_t at = 999;
        ck_assert_msg(luna_json_parse(&v, bads[i], strlen(bads[i]), &at) == LUNA_ERR_FORMAT,
                      "accepted %s", bads[i]);
        ck_assert_uint_le(at, strlen(bads[i]));
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_params");
    TCase *tc = tcase_create("params");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, exact_parameter_counts_of_spec_table);
    tcase_add_test(tc, names_shapes_and_order);
    tcase_add_test(tc, initialisation_follows_spec);
    tcase_add_test(tc, config_json_roundtrip_and_validation);
    tcase_add_test(tc, config_architecture_difference_names_the_field);
    tcase_add_test(tc, json_reader_edge_cases);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
