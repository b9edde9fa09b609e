/* Strict loading of weights that come from fairseq / the official Luna code:
 *   - untied embeddings (share_all_embeddings false): the decoder's own tables are parameters and
 *     are used (logits change with them; copying the encoder table into them gives the tied model);
 *   - alias tensors (decoder.embed_tokens.weight, decoder.output_projection.weight) in a file
 *     loaded as a shared-embedding model must equal the table they alias, or the load fails
 *     naming both tensors (an untied model is never read as tied with its tables dropped);
 *   - the LayerNorm convention: __metadata__.layernorm_weight "gamma" (luna writes it),
 *     "gamma_minus_1" (loaded as stored + 1), anything else an error; without the key, LayerNorm
 *     weights with mean near 0 are refused, naming γ − 1 and the key that states the convention.
 *
 * Also a helper mode for tools/scripts/convert-checkpoint.py's PyTorch test (tests/reference/
 * test_convert.py): `test_model_interchange --logits CHECKPOINT INPUTS OUT` loads CHECKPOINT
 * with luna_checkpoint_load_model (the programs' loader), runs luna's forward on the batch in
 * INPUTS (input.src_tokens, input.src_lengths, input.prev_output_tokens, input.target: the
 * tests/fixtures/model format) and writes output.logits [B, n, V] (F32) to OUT; and
 * `test_model_interchange --write-checkpoint OUT V` writes a luna checkpoint (see write_mode). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"
#include "core/safetensors.h"
#include "model/checkpoint.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"

enum { B = 2, M = 5, N = 4 };
static const int32_t SRC[B * M] = {5, 9, 7, 12, 2, 8, 6, 2, 1, 1};
static const int32_t SRC_LEN[B] = {5, 3};
static const int32_t PREV[B * N] = {2, 10, 11, 4, 2, 13, 1, 1};
static const int32_t TGT[B * N] = {10, 11, 4, 2, 13, 2, 1, 1};

static char *dir;
static luna_backend *be;

static void setup(void) {
    dir = luna_test_make_temp_dir();
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
}

static void teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
    luna_backend_free(be);
}

static luna_config tiny(bool share_all, bool share_dec) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = 24;
    c.dropout = 0;
    c.share_all_embeddings = share_all;
    c.share_decoder_input_output_embed = share_dec;
    return c;
}

static float *host_params(const luna_params *p) {
    float *h = malloc(p->num_params * sizeof(float));
    LUNA_CHECK_OK(luna_mem_to_host(p->be, h, p->data, p->num_params * sizeof(float)));
    return h;
}

static float *logits_of(luna_seq2seq *m) {
    luna_batch b = {.B = B,
                    .src_len = M,
                    .tgt_len = N,
                    .src_tokens = SRC,
                    .src_lengths = SRC_LEN,
                    .prev_output_tokens = PREV,
                    .target = TGT};
    float *out = malloc(sizeof(float) * B * N * (size_t)m->config.vocab_size);
    double loss;
    LUNA_CHECK_OK(luna_seq2seq_forward(m, &b, &loss, NULL, out));
    return out;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* Copy `src`'s tensor `from` into `dst`'s tensor `to` (host images of two parameter sets). */
static void copy_tensor(const luna_params *dp, float *dst, const char *to, const luna_params *sp,
                        const float *src, const char *from) {
    const luna_param_info *a = luna_params_find(dp, to), *b = luna_params_find(sp, from);
    ck_assert_msg(a && b && a->numel == b->numel, "%s <- %s", to, from);
    memcpy(dst + a->offset, src + b->offset, a->numel * sizeof(float));
}

/* Write p's parameters (host image h) plus `extra` tensors and metadata to `name` in dir. */
static char *write_params(const luna_params *p, const float *h, const luna_st_tensor *extra,
                          int num_extra, const char *ln_convention) {
    int n = p->num_tensors + num_extra;
    luna_st_tensor *list = calloc((size_t)n, sizeof *list);
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        list[i] = (luna_st_tensor){.name = t->name,
                                   .dtype = LUNA_F32,
                                   .ndim = t->ndim,
                                   .shape = {t->shape[0], t->shape[1]},
                                   .data = h + t->offset,
                                   .nbytes = t->numel * sizeof(float)};
    }
    for (int i = 0; i < num_extra; i++)
        list[p->num_tensors + i] = extra[i];
    char *json;
    LUNA_CHECK_OK(luna_config_to_json(&p->config, &json));
    luna_st_metadata meta[2] = {{"config", json}, {LUNA_LAYERNORM_KEY, ln_convention}};
    char *path = luna_path_join(dir, "w.safetensors");
    LUNA_CHECK_OK(luna_safetensors_write(path, list, n, meta, ln_convention ? 2 : 1));
    free(json);
    free(list);
    return path;
}

static luna_status load_into(luna_params *p, const char *path) {
    luna_safetensors *st;
    LUNA_CHECK_OK(luna_safetensors_open(&st, path));
    luna_status s = luna_params_load(p, st);
    luna_safetensors_close(st);
    return s;
}

/* Untied tables are parameters of their own (2·V·d more), survive save/load, and are used. */
START_TEST(untied_embeddings_are_used) {
    luna_config ct = tiny(true, true), cu = tiny(false, false), c2 = tiny(false, true);
    const size_t Vd = (size_t)ct.vocab_size * (size_t)ct.decoder_embed_dim;
    ck_assert_uint_eq(luna_config_num_parameters(&cu), luna_config_num_parameters(&ct) + 2 * Vd);
    ck_assert_uint_eq(luna_config_num_parameters(&c2), luna_config_num_parameters(&ct) + Vd);
    luna_seq2seq *mt, *mu;
    LUNA_CHECK_OK(luna_seq2seq_create(&mt, be, &ct));
    LUNA_CHECK_OK(luna_seq2seq_create(&mu, be, &cu));
    ck_assert_ptr_ne(mu->params->w.output_projection, mu->params->w.embed_tokens);
    ck_assert_ptr_ne(mu->params->w.decoder_embed_tokens, mu->params->w.embed_tokens);
    /* u := t's parameters, decoder tables random (init): the logits differ from t's */
    float *ht = host_params(mt->params), *hu = host_params(mu->params);
    for (int i = 0; i < mt->params->num_tensors; i++)
        copy_tensor(mu->params, hu, mt->params->tensors[i].name, mt->params, ht,
                    mt->params->tensors[i].name);
    LUNA_CHECK_OK(luna_mem_from_host(be, mu->params->data, hu, mu->params->num_params * 4));
    float *lt = logits_of(mt), *lu = logits_of(mu);
    const size_t nl = (size_t)B * N * (size_t)ct.vocab_size;
    ck_assert_msg(max_diff(lt, lu, nl) > 0.1, "untied tables ignored: %g", max_diff(lt, lu, nl));
    /* through a file: the same logits */
    char *path = write_params(mu->params, hu, NULL, 0, "gamma");
    luna_seq2seq *mr;
    LUNA_CHECK_OK(luna_seq2seq_create_for_inference(&mr, be, &cu));
    LUNA_CHECK_OK(load_into(mr->params, path));
    float *lr = logits_of(mr);
    ck_assert(max_diff(lr, lu, nl) == 0);
    /* decoder input table := the encoder's: the output projection still makes a difference */
    copy_tensor(mu->params, hu, "decoder.embed_tokens.weight", mt->params, ht,
                "encoder.embed_tokens.weight");
    LUNA_CHECK_OK(luna_mem_from_host(be, mu->params->data, hu, mu->params->num_params * 4));
    float *lu1 = logits_of(mu);
    ck_assert_msg(max_diff(lt, lu1, nl) > 0.1, "output projection ignored");
    free(lu1);
    /* and the output projection too: exactly the tied model */
    copy_tensor(mu->params, hu, "decoder.output_projection.weight", mt->params, ht,
                "encoder.embed_tokens.weight");
    LUNA_CHECK_OK(luna_mem_from_host(be, mu->params->data, hu, mu->params->num_params * 4));
    float *lu2 = logits_of(mu);
    ck_assert_msg(max_diff(lt, lu2, nl) == 0, "%g", max_diff(lt, lu2, nl));
    /* gradients reach the decoder's tables */
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(mu));
    luna_batch b = {.B = B,
                    .src_len = M,
                    .tgt_len = N,
                    .src_tokens = SRC,
                    .src_lengths = SRC_LEN,
                    .prev_output_tokens = PREV,
                    .target = TGT};
    LUNA_CHECK_OK(luna_seq2seq_forward_backward_eval(mu, &b, NULL, NULL));
    float *g = malloc(mu->params->num_params * sizeof(float));
    LUNA_CHECK_OK(luna_mem_to_host(be, g, mu->params->grad, mu->params->num_params * 4));
    const char *tables[] = {"decoder.embed_tokens.weight", "decoder.output_projection.weight"};
    for (int k = 0; k < 2; k++) {
        const luna_param_info *t = luna_params_find(mu->params, tables[k]);
        double s = 0;
        for (size_t j = 0; j < t->numel; j++)
            s += fabs(g[t->offset + j]);
        ck_assert_msg(s > 0, "%s has no gradient", tables[k]);
    }
    free(g);
    free(lu2);
    free(lr);
    free(lt);
    free(lu);
    free(ht);
    free(hu);
    free(path);
    luna_seq2seq_free(mr);
    luna_seq2seq_free(mt);
    luna_seq2seq_free(mu);
}
END_TEST

/* An alias that differs from its table is an error naming both; an equal one loads. */
START_TEST(alias_must_equal_its_table) {
    luna_config ct = tiny(true, true);
    luna_params *p;
    LUNA_CHECK_OK(luna_params_create(&p, be, &ct));
    float *h = host_params(p);
    const luna_param_info *e = luna_params_find(p, "encoder.embed_tokens.weight");
    float *copy = malloc(e->numel * sizeof(float));
    memcpy(copy, h + e->offset, e->numel * sizeof(float));
    luna_st_tensor alias[2] = {
        {.name = "decoder.embed_tokens.weight",
         .dtype = LUNA_F32,
         .ndim = 2,
         .shape = {e->shape[0], e->shape[1]},
         .data = copy,
         .nbytes = e->numel * 4},
        {.name = "decoder.output_projection.weight",
         .dtype = LUNA_F32,
         .ndim = 2,
         .shape = {e->shape[0], e->shape[1]},
         .data = h + e->offset,
         .nbytes = e->numel * 4},
    };
    char *path = write_params(p, h, alias, 2, "gamma");
    LUNA_CHECK_OK(load_into(p, path));
    free(path);
    copy[5 * e->shape[1] + 3] += 0.25f; /* row 5 differs */
    path = write_params(p, h, alias, 2, "gamma");
    ck_assert_int_eq(load_into(p, path), LUNA_ERR_MISMATCH);
    const char *msg = luna_error_message();
    ck_assert_msg(strstr(msg, path) &&
                      strstr(msg, "'decoder.embed_tokens.weight' differs from "
                                  "'encoder.embed_tokens.weight'") &&
                      strstr(msg, "row 5") && strstr(msg, "untied") && !strchr(msg, '\n'),
                  "%s", msg);
    free(path);
    /* a wrong shape: also named */
    alias[0].shape[0] = e->shape[0] - 1;
    alias[0].nbytes = (size_t)(e->shape[0] - 1) * (size_t)e->shape[1] * 4;
    path = write_params(p, h, alias, 1, "gamma");
    ck_assert_int_eq(load_into(p, path), LUNA_ERR_MISMATCH);
    ck_assert_msg(strstr(luna_error_message(), "does not have the dtype and shape"), "%s",
                  luna_error_message());
    free(path);
    /* with untied decoder input but shared decoder output, the output alias is checked against
     * decoder.embed_tokens.weight */
    luna_config c2 = tiny(false, true);
    luna_params *p2;
    LUNA_CHECK_OK(luna_params_create(&p2, be, &c2));
    float *h2 = host_params(p2);
    const luna_param_info *d2 = luna_params_find(p2, "decoder.embed_tokens.weight");
    luna_st_tensor out = {.name = "decoder.output_projection.weight",
                          .dtype = LUNA_F32,
                          .ndim = 2,
                          .shape = {d2->shape[0], d2->shape[1]},
                          .data = h2 + luna_params_find(p2, "encoder.embed_tokens.weight")->offset,
                          .nbytes = d2->numel * 4};
    path = write_params(p2, h2, &out, 1, "gamma");
    ck_assert_int_eq(load_into(p2, path), LUNA_ERR_MISMATCH);
    ck_assert_msg(strstr(luna_error_message(), "'decoder.output_projection.weight' differs from "
                                               "'decoder.embed_tokens.weight'"),
                  "%s", luna_error_message());
    free(path);
    out.data = h2 + d2->offset;
    path = write_params(p2, h2, &out, 1, "gamma");
    LUNA_CHECK_OK(load_into(p2, path));
    free(path);
    free(h2);
    luna_params_free(p2);
    free(copy);
    free(h);
    luna_params_free(p);
}
END_TEST

static void set_layernorm(luna_params *p, float *h, float delta, luna_test_rng *rng) {
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        if (!strstr(t->name, "layer_norm.weight")) continue;
        for (size_t j = 0; j < t->numel; j++)
            h[t->offset + j] = luna_test_uniform(rng, 0.7f, 1.3f) + delta;
    }
}

START_TEST(layernorm_convention) {
    luna_config c = tiny(true, true);
    luna_params *p, *q;
    LUNA_CHECK_OK(luna_params_create(&p, be, &c));
    LUNA_CHECK_OK(luna_params_create_for_inference(&q, be, &c));
    float *h = host_params(p);
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    set_layernorm(p, h, 0.0f, &rng);
    float *gamma = malloc(p->num_params * sizeof(float));
    memcpy(gamma, h, p->num_params * sizeof(float));
    /* declared γ, and undeclared but plausible (an older luna file): no warning */
    const char *conventions[2] = {"gamma", NULL};
    for (int k = 0; k < 2; k++) {
        char *path = write_params(p, h, NULL, 0, conventions[k]);
        LUNA_CHECK_OK(load_into(q, path));
        free(path);
    }
    /* γ − 1, declared: loads as γ (float rounding of (γ − 1) + 1 only) */
    luna_test_rng_seed(&rng, 7);
    set_layernorm(p, h, -1.0f, &rng);
    char *path = write_params(p, h, NULL, 0, "gamma_minus_1");
    LUNA_CHECK_OK(load_into(q, path));
    float *back = host_params(q);
    ck_assert_msg(max_diff(back, gamma, p->num_params) < 1e-6, "%g",
                  max_diff(back, gamma, p->num_params));
    free(path);
    /* γ − 1, undeclared: refused, in one line naming the file, the cause and the key that states
     * the convention */
    path = write_params(p, h, NULL, 0, NULL);
    ck_assert_int_eq(load_into(q, path), LUNA_ERR_FORMAT);
    const char *msg = luna_error_message();
    ck_assert_msg(strstr(msg, path) && strstr(msg, "gamma - 1") && strstr(msg, "2023") &&
                      strstr(msg, "__metadata__.layernorm_weight") && !strchr(msg, '\n'),
                  "error: '%s'", msg);
    free(path);
    /* an unknown convention: error naming the key */
    path = write_params(p, h, NULL, 0, "gain");
    ck_assert_int_eq(load_into(q, path), LUNA_ERR_FORMAT);
    ck_assert_msg(strstr(luna_error_message(), "layernorm_weight is \"gain\""), "%s",
                  luna_error_message());
    free(path);
    free(back);
    free(gamma);
    free(h);
    luna_params_free(q);
    luna_params_free(p);
}
END_TEST

/* luna checkpoints record the convention they write. */
START_TEST(checkpoints_record_the_convention) {
    luna_config c = tiny(true, true);
    luna_params *p;
    LUNA_CHECK_OK(luna_params_create(&p, be, &c));
    char *path = luna_path_join(dir, "ck.safetensors");
    luna_checkpoint_contents cc = {.source_lang = "en",
                                   .target_lang = "de",
                                   .src_dict_text = "a 1\n",
                                   .tgt_dict_text = "a 1\n"};
    LUNA_CHECK_OK(luna_checkpoint_save(path, p, &cc));
    luna_safetensors *st;
    LUNA_CHECK_OK(luna_safetensors_open(&st, path));
    ck_assert_str_eq(luna_safetensors_metadata(st, LUNA_LAYERNORM_KEY), "gamma");
    luna_safetensors_close(st);
    LUNA_CHECK_OK(luna_params_save(p, path, NULL, 0));
    LUNA_CHECK_OK(luna_safetensors_open(&st, path));
    ck_assert_str_eq(luna_safetensors_metadata(st, LUNA_LAYERNORM_KEY), "gamma");
    luna_safetensors_close(st);
    free(path);
    luna_params_free(p);
}
END_TEST

static int32_t *read_i32(const luna_safetensors *st, const char *name, size_t n) {
    const luna_st_tensor *t = luna_safetensors_find(st, name);
    if (!t || t->dtype != LUNA_I32 || t->nbytes != n * sizeof(int32_t)) return NULL;
    int32_t *out = malloc(n * sizeof(int32_t));
    memcpy(out, t->data, n * sizeof(int32_t));
    return out;
}

/* --logits CHECKPOINT INPUTS OUT (see the top of the file). */
static int logits_mode(const char *ckpt, const char *inputs, const char *out) {
    luna_backend *cpu;
    luna_seq2seq *m = NULL;
    luna_safetensors *in = NULL;
    luna_status s = luna_backend_cpu_create(&cpu, 1);
    if (s == LUNA_OK) s = luna_checkpoint_load_model(ckpt, cpu, &m, NULL);
    if (s == LUNA_OK) s = luna_safetensors_open(&in, inputs);
    if (s != LUNA_OK) {
        fprintf(stderr, "test_model_interchange: %s\n", luna_error_message());
        return 1;
    }
    const luna_st_tensor *src = luna_safetensors_find(in, "input.src_tokens");
    const luna_st_tensor *prev = luna_safetensors_find(in, "input.prev_output_tokens");
    if (!src || !prev || src->ndim != 2 || prev->ndim != 2) {
        fprintf(stderr, "test_model_interchange: %s: inputs missing\n", inputs);
        return 1;
    }
    int b = (int)src->shape[0], ms = (int)src->shape[1], n = (int)prev->shape[1];
    int V = m->config.vocab_size;
    int32_t *st_ = read_i32(in, "input.src_tokens", (size_t)b * ms);
    int32_t *sl = read_i32(in, "input.src_lengths", (size_t)b);
    int32_t *pv = read_i32(in, "input.prev_output_tokens", (size_t)b * n);
    int32_t *tg = read_i32(in, "input.target", (size_t)b * n);
    float *logits = malloc(sizeof(float) * (size_t)b * n * V);
    if (!st_ || !sl || !pv || !tg) s = luna_error(LUNA_ERR_FORMAT, "%s: bad inputs", inputs);
    luna_batch batch = {.B = b,
                        .src_len = ms,
                        .tgt_len = n,
                        .src_tokens = st_,
                        .src_lengths = sl,
                        .prev_output_tokens = pv,
                        .target = tg};
    double loss;
    if (s == LUNA_OK) s = luna_seq2seq_forward(m, &batch, &loss, NULL, logits);
    luna_st_tensor t = {.name = "output.logits",
                        .dtype = LUNA_F32,
                        .ndim = 3,
                        .shape = {b, n, V},
                        .data = logits,
                        .nbytes = sizeof(float) * (size_t)b * n * V};
    if (s == LUNA_OK) s = luna_safetensors_write(out, &t, 1, NULL, 0);
    if (s != LUNA_OK) fprintf(stderr, "test_model_interchange: %s\n", luna_error_message());
    free(logits);
    free(st_);
    free(sl);
    free(pv);
    free(tg);
    luna_safetensors_close(in);
    luna_seq2seq_free(m);
    luna_backend_free(cpu);
    return s == LUNA_OK ? 0 : 1;
}

/* --write-checkpoint OUT V: a luna_tiny checkpoint written by luna_checkpoint_save (the writer of
 * luna-train and luna-average), vocabulary V (dictionary "w<i> <100 - i>" lines, as
 * test_convert.py writes them), random weights with LayerNorm gains in U(0.6, 1.4) and non-zero
 * biases, so that a converter that mishandles any tensor changes the outputs. */
static int write_mode(const char *out, int V) {
    luna_config c;
    luna_backend *cpu = NULL;
    luna_params *p = NULL;
    luna_status s = luna_config_preset(&c, "luna_tiny"); /* no ck_assert: not inside a test */
    c.vocab_size = V;
    if (s == LUNA_OK) s = luna_backend_cpu_create(&cpu, 1);
    if (s == LUNA_OK) s = luna_params_create(&p, cpu, &c);
    float *h = NULL;
    char *dict = calloc((size_t)V, 24);
    if (s == LUNA_OK && (h = malloc(p->num_params * sizeof(float))) != NULL)
        s = luna_mem_to_host(cpu, h, p->data, p->num_params * sizeof(float));
    if (s == LUNA_OK && h && dict) {
        luna_test_rng rng;
        luna_test_rng_seed(&rng, 11);
        for (int i = 0; i < p->num_tensors; i++) {
            const luna_param_info *t = &p->tensors[i];
            bool ln = strstr(t->name, "layer_norm.weight") != NULL;
            bool bias = strstr(t->name, ".bias") != NULL;
            for (size_t j = 0; ln || bias ? j < t->numel : 0; j++)
                h[t->offset + j] =
                    ln ? luna_test_uniform(&rng, 0.6f, 1.4f) : luna_test_uniform(&rng, -0.2f, 0.2f);
        }
        s = luna_mem_from_host(cpu, p->data, h, p->num_params * sizeof(float));
        size_t used = 0;
        for (int i = 0; i < V - 4; i++)
            used += (size_t)sprintf(dict + used, "w%d %d\n", i, 100 - i);
    }
    luna_checkpoint_contents cc = {
        .source_lang = "en", .target_lang = "de", .src_dict_text = dict, .tgt_dict_text = dict};
    if (s == LUNA_OK && h && dict) s = luna_checkpoint_save(out, p, &cc);
    if (s != LUNA_OK) fprintf(stderr, "test_model_interchange: %s\n", luna_error_message());
    free(dict);
    free(h);
    luna_params_free(p);
    if (cpu) luna_backend_free(cpu);
    return s == LUNA_OK && h && dict ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--logits") == 0)
        return logits_mode(argv[2], argv[3], argv[4]);
    if (argc == 4 && strcmp(argv[1], "--write-checkpoint") == 0)
        return write_mode(argv[2], atoi(argv[3]));
    Suite *s = suite_create("model_interchange");
    TCase *tc = tcase_create("strict loading");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, untied_embeddings_are_used);
    tcase_add_test(tc, alias_must_equal_its_table);
    tcase_add_test(tc, layernorm_convention);
    tcase_add_test(tc, checkpoints_record_the_convention);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
