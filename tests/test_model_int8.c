/* int8 models (model/quantize.h) on luna_tiny and transformer_tiny:
 * - quantizing moves each int8 weight by at most half its row's step (max|row| / 254) and
 *   nothing else; the int8 checkpoint holds I8 tensors with F32 "<name>_scale" scales and the
 *   "quantization" key, its tensor bytes are exactly those, and loading it gives the bits of
 *   quantizing at load (luna-translate --quantize int8);
 * - teacher-forced log-probs of the int8 model (decoding holds its weights as int8: int8 GEMMs,
 *   which give other bits than the same weights held as fp32) are within 0.05 nats per token of
 *   the fp32 model's, and those of the loaded file equal those of quantizing at load bit for bit;
 * - bad int8 files give one error naming the file and the tensor: a missing, mis-shaped,
 *   negative or NaN scale, an F32 tensor where I8 is declared, an unknown quantization, a
 *   truncated file; luna-quantize refuses an int8 input and luna-average an int8 checkpoint. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_util.h"
#include "core/quantize.h"
#include "decoding/incremental.h"
#include "model/checkpoint.h"
#include "model/kernels/registry.h"
#include "model/quantize.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"

static char *dir;
static const char *const ARCHS[] = {"luna_tiny", "transformer_tiny"};

static void path_of(char *out, size_t size, const char *name) {
    snprintf(out, size, "%s/%s", dir, name);
}

/* A dictionary text of 26 letters; vocab_size = 26 + 4 specials. */
static char dict_text[26 * 8];

static void save_fp32(const char *arch, const char *name) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, arch), LUNA_OK);
    c.vocab_size = 30;
    luna_seq2seq *m;
    ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(m, 11), LUNA_OK);
    luna_checkpoint_contents cc = {.source_lang = "en",
                                   .target_lang = "de",
                                   .src_dict_text = dict_text,
                                   .tgt_dict_text = dict_text};
    char path[4096];
    path_of(path, sizeof path, name);
    ck_assert_int_eq(luna_checkpoint_save(path, m->params, &cc), LUNA_OK);
    luna_seq2seq_free(m);
    luna_backend_free(be);
}

static void setup(void) {
    dir = luna_test_make_temp_dir();
    char *p = dict_text;
    for (int i = 0; i < 26; i++)
        p += sprintf(p, "%c 1\n", 'a' + i);
    save_fp32(ARCHS[0], "luna.safetensors");
    save_fp32(ARCHS[1], "tr.safetensors");
}

static void teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
}

static luna_seq2seq *load(luna_backend *be, const char *name, bool quantize) {
    char path[4096];
    path_of(path, sizeof path, name);
    luna_seq2seq *m;
    LUNA_CHECK_OK(luna_checkpoint_load_model(path, be, &m, NULL));
    if (quantize) LUNA_CHECK_OK(luna_params_quantize_int8(m->params));
    return m;
}

static void save_as(luna_seq2seq *m, const char *name) {
    char path[4096];
    path_of(path, sizeof path, name);
    luna_checkpoint_contents cc = {.source_lang = "en",
                                   .target_lang = "de",
                                   .src_dict_text = dict_text,
                                   .tgt_dict_text = dict_text};
    LUNA_CHECK_OK(luna_checkpoint_save(path, m->params, &cc));
}

enum { S = 3, M = 7, T = 6 };

/* Teacher-forced log-probs lp [S][T] of fixed targets (incremental decoding: held weights). */
static void score(luna_seq2seq *m, float lp[S][T]) {
    static const int32_t src[S][M] = {
        {5, 6, 7, 8, 9, 10, 2}, {11, 12, 13, 2, 1, 1, 1}, {20, 21, 22, 23, 24, 2, 1}};
    static const int32_t len[S] = {7, 4, 6};
    static const int32_t tgt[S][T] = {
        {7, 8, 9, 10, 11, 2}, {25, 26, 27, 28, 2, 2}, {4, 5, 6, 7, 8, 2}};
    luna_incremental *inc;
    LUNA_CHECK_OK(luna_incremental_create(&inc, m));
    LUNA_CHECK_OK(luna_incremental_begin(inc, &src[0][0], len, S, M, 1, T));
    for (int t = 0; t < T; t++) {
        int32_t prev[S], pick[S];
        float picked[S];
        for (int s = 0; s < S; s++)
            prev[s] = t ? tgt[s][t - 1] : 2, pick[s] = tgt[s][t];
        luna_step_output out = {.k = 0, .pick = pick, .picked = picked};
        LUNA_CHECK_OK(luna_incremental_step(inc, prev, &out));
        for (int s = 0; s < S; s++)
            lp[s][t] = picked[s];
    }
    luna_incremental_free(inc);
}

static float *host_params(const luna_params *p) {
    float *h = malloc(sizeof(float) * p->num_params);
    LUNA_CHECK_OK(luna_mem_to_host(p->be, h, p->data, sizeof(float) * p->num_params));
    return h;
}

START_TEST(int8_model_matches_fp32_within_bound) {
    const char *const fp32_files[] = {"luna.safetensors", "tr.safetensors"};
    for (int a = 0; a < 2; a++) {
        luna_backend *be;
        ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
        luna_seq2seq *f = load(be, fp32_files[a], false), *q = load(be, fp32_files[a], true);
        ck_assert_int_eq(f->params->weight_dtype, LUNA_F32);
        ck_assert_int_eq(q->params->weight_dtype, LUNA_I8);
        /* weights: within half a step; everything else untouched */
        float *hf = host_params(f->params), *hq = host_params(q->params);
        const luna_params *p = f->params;
        size_t n8 = 0, rows8 = 0;
        int t8 = 0;
        for (int i = 0; i < p->num_tensors; i++) {
            const luna_param_info *t = &p->tensors[i];
            if (!t->int8) {
                ck_assert_int_eq(memcmp(hf + t->offset, hq + t->offset, 4 * t->numel), 0);
                continue;
            }
            t8++, n8 += t->numel, rows8 += (size_t)t->shape[0];
            for (int64_t r = 0; r < t->shape[0]; r++) {
                const float *wf = hf + t->offset + r * t->shape[1];
                const float *wq = hq + t->offset + r * t->shape[1];
                float amax = 0.0f;
                for (int64_t k = 0; k < t->shape[1]; k++)
                    amax = fmaxf(amax, fabsf(wf[k]));
                for (int64_t k = 0; k < t->shape[1]; k++)
                    ck_assert_msg(fabsf(wq[k] - wf[k]) <= amax / 254.0f * 1.0001f,
                                  "%s row %lld: %g moved to %g", t->name, (long long)r, wf[k],
                                  wq[k]);
            }
        }
        ck_assert_int_ge(t8, 10);
        /* the int8 file: its tensors' bytes, its key; loading it = quantizing at load */
        save_as(q, "q.safetensors");
        char path[4096];
        path_of(path, sizeof path, "q.safetensors");
        luna_safetensors *st;
        LUNA_CHECK_OK(luna_checkpoint_open(&st, path));
        ck_assert_str_eq(luna_safetensors_metadata(st, LUNA_QUANTIZATION_KEY), "int8");
        size_t bytes = 0;
        for (int i = 0; i < luna_safetensors_count(st); i++)
            bytes += luna_safetensors_at(st, i)->nbytes;
        ck_assert_uint_eq(bytes, n8 + 4 * rows8 + 4 * (p->num_params - n8));
        const luna_st_tensor *emb = luna_safetensors_find(st, "encoder.embed_tokens.weight");
        ck_assert_int_eq(emb->dtype, LUNA_I8);
        ck_assert_ptr_nonnull(luna_safetensors_find(st, "encoder.embed_tokens.weight_scale"));
        luna_safetensors_close(st);
        luna_seq2seq *l = load(be, "q.safetensors", false);
        ck_assert_int_eq(l->params->weight_dtype, LUNA_I8);
        float *hl = host_params(l->params);
        ck_assert_int_eq(memcmp(hl, hq, sizeof(float) * p->num_params), 0);
        /* log-probs: the bound against fp32, and the same bits from file and from load */
        float lf[S][T], lq[S][T], ll[S][T];
        score(f, lf), score(q, lq), score(l, ll);
        double worst = 0.0;
        for (int s = 0; s < S; s++)
            for (int t = 0; t < T; t++) {
                ck_assert(isfinite(lq[s][t]));
                worst = fmax(worst, fabs((double)lq[s][t] - lf[s][t]));
            }
        printf("%s: int8 log-probs within %.4f nats of fp32's\n", ARCHS[a], worst);
        ck_assert_msg(worst <= 0.05, "%s: int8 log-probs differ from fp32 by %.4f nats", ARCHS[a],
                      worst);
        ck_assert_msg(worst > 0.0, "%s: int8 log-probs equal fp32's: int8 not used?", ARCHS[a]);
        ck_assert_int_eq(memcmp(lq, ll, sizeof lq), 0);
        /* the same dequantized weights held as fp32 give other bits: decoding the int8 model
         * multiplies in int8 (activations quantized per row) */
        float lw[S][T];
        q->params->weight_dtype = LUNA_F32;
        score(q, lw);
        q->params->weight_dtype = LUNA_I8;
        ck_assert_msg(memcmp(lq, lw, sizeof lq) != 0, "%s: int8 decoding used fp32 GEMMs",
                      ARCHS[a]);
        free(hf), free(hq), free(hl);
        luna_seq2seq_free(f), luna_seq2seq_free(q), luna_seq2seq_free(l);
        luna_backend_free(be);
    }
}
END_TEST

/* Rewrites q.safetensors as `name` with `edit` applied to a copy of its tensor list and
 * metadata (the quantization value `quant`, NULL: unchanged). */
typedef void (*edit_fn)(luna_st_tensor *list, int n, float *scratch);

static void rewrite(const char *name, edit_fn edit, const char *quant) {
    char path[4096], out[4096];
    path_of(path, sizeof path, "q.safetensors");
    path_of(out, sizeof out, name);
    luna_safetensors *st;
    LUNA_CHECK_OK(luna_safetensors_open(&st, path));
    const int n = luna_safetensors_count(st);
    luna_st_tensor *list = malloc(sizeof *list * n);
    for (int i = 0; i < n; i++)
        list[i] = *luna_safetensors_at(st, i);
    float *scratch = calloc(1 << 20, sizeof(float));
    if (edit) edit(list, n, scratch);
    static const char *const keys[] = {"format",      "config",      "layernorm_weight",
                                       "src_dict",    "tgt_dict",    "spm_model",
                                       "source_lang", "target_lang", "training_state"};
    luna_st_metadata md[10];
    int nm = 0;
    for (int i = 0; i < 9; i++)
        md[nm++] = (luna_st_metadata){keys[i], luna_safetensors_metadata(st, keys[i])};
    md[nm++] = (luna_st_metadata){LUNA_QUANTIZATION_KEY, quant ? quant : "int8"};
    LUNA_CHECK_OK(luna_safetensors_write(out, list, n, md, nm));
    free(scratch);
    free(list);
    luna_safetensors_close(st);
}

static int find(luna_st_tensor *list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0) return i;
    ck_abort_msg("%s not found", name);
    return -1;
}

#define FC1 "decoder.layers.0.fc1.weight"
static void drop_scale(luna_st_tensor *l, int n, float *s) {
    (void)s;
    l[find(l, n, FC1 "_scale")].name = "unrelated.scale";
}
static void short_scale(luna_st_tensor *l, int n, float *s) {
    (void)s;
    luna_st_tensor *t = &l[find(l, n, FC1 "_scale")];
    t->shape[0]--, t->nbytes -= 4;
}
static void negative_scale(luna_st_tensor *l, int n, float *s) {
    luna_st_tensor *t = &l[find(l, n, FC1 "_scale")];
    memcpy(s, t->data, t->nbytes);
    s[3] = -s[3];
    t->data = s;
}
static void nan_scale(luna_st_tensor *l, int n, float *s) {
    luna_st_tensor *t = &l[find(l, n, FC1 "_scale")];
    memcpy(s, t->data, t->nbytes);
    s[2] = NAN;
    t->data = s;
}
static void f32_weight(luna_st_tensor *l, int n, float *s) {
    luna_st_tensor *t = &l[find(l, n, FC1)];
    t->dtype = LUNA_F32, t->data = s, t->nbytes *= 4;
    ck_assert_uint_le(t->nbytes, (1u << 20) * sizeof(float));
}

static void expect_load_error(const char *name, const char *needle) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    char path[4096];
    path_of(path, sizeof path, name);
    luna_seq2seq *m = NULL;
    ck_assert_int_ne(luna_checkpoint_load_model(path, be, &m, NULL), LUNA_OK);
    ck_assert_ptr_null(m);
    const char *msg = luna_error_message();
    ck_assert_msg(strstr(msg, path) && strstr(msg, needle) && !strchr(msg, '\n'),
                  "%s: '%s' not in the one-line error: %s", name, needle, msg);
    luna_backend_free(be);
}

START_TEST(bad_int8_files_are_one_line_errors) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_seq2seq *q = load(be, "tr.safetensors", true);
    save_as(q, "q.safetensors");
    luna_seq2seq_free(q);
    luna_backend_free(be);
    rewrite("noscale.safetensors", drop_scale, NULL);
    expect_load_error("noscale.safetensors", "tensor '" FC1 "_scale' is missing");
    rewrite("short.safetensors", short_scale, NULL);
    expect_load_error("short.safetensors", FC1 "_scale': shape [63] (F32), expected [64] (F32)");
    rewrite("negative.safetensors", negative_scale, NULL);
    expect_load_error("negative.safetensors", "negative scale");
    rewrite("nan.safetensors", nan_scale, NULL);
    expect_load_error("nan.safetensors", "non-finite value");
    rewrite("f32.safetensors", f32_weight, NULL);
    expect_load_error("f32.safetensors", FC1 "': shape [64,32] (F32), expected [64,32] (I8)");
    rewrite("int4.safetensors", NULL, "int4");
    expect_load_error("int4.safetensors", "__metadata__.quantization is \"int4\"");
    /* a file cut short inside the last tensor */
    char path[4096], cut[4096], *bytes;
    size_t size;
    path_of(path, sizeof path, "q.safetensors");
    path_of(cut, sizeof cut, "cut.safetensors");
    LUNA_CHECK_OK(luna_read_file(path, &bytes, &size));
    LUNA_CHECK_OK(luna_write_file_atomic(cut, bytes, size - 100));
    free(bytes);
    expect_load_error("cut.safetensors", "");
    /* the programs: luna-quantize refuses an int8 input, luna-average an int8 checkpoint */
    char quantize[4096], average[4096];
    luna_test_find_program(quantize, sizeof quantize, "luna-quantize", "LUNA_QUANTIZE");
    luna_test_find_program(average, sizeof average, "luna-average", "LUNA_AVERAGE");
    luna_test_exec_options o = {.dir = dir};
    luna_test_result r = luna_test_exec(
        quantize, (const char *const[]){"q.safetensors", "x.safetensors", "--dtype", "int8", NULL},
        &o);
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "q.safetensors: already an int8 checkpoint"));
    r = luna_test_exec(quantize, (const char *const[]){"tr.safetensors", "x.safetensors", NULL},
                       &o);
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--dtype int8 is required"));
    r = luna_test_exec(quantize, (const char *const[]){"--help", NULL}, &o);
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "--dtype"));
    ck_assert_ptr_nonnull(strstr(r.out, "--output FILE"));
    r = luna_test_exec(
        quantize, (const char *const[]){"tr.safetensors", "y.safetensors", "--dtype", "int8", NULL},
        &o);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "in int8"));
    r = luna_test_exec(average,
                       (const char *const[]){"--inputs", "tr.safetensors", "y.safetensors",
                                             "--output", "z.safetensors", NULL},
                       &o);
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "y.safetensors: an int8 checkpoint"));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_int8");
    TCase *tc = tcase_create("int8");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, int8_model_matches_fp32_within_bound);
    tcase_add_test(tc, bad_int8_files_are_one_line_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
