/* Golden tests against the independent PyTorch oracle (tests/reference/, float64, rounded to F32):
 * for every fixture tests/fixtures/model/<name>.safetensors, load the parameters and the batch, run
 * forward and backward without dropout, and compare the loss, the nll, the logits and EVERY
 * parameter gradient.
 *
 * Error measure, per tensor (normwise): max_i |ours_i − ref_i| / max(max_i |ref_i|, floor),
 * required ≤ 1e-4. floor = 1e-3 · G for gradients, G = the largest |reference gradient| of the
 * fixture: some gradients vanish by symmetry (the bias of a key projection feeding a softmax: the
 * oracle has ~1e-17, fp32 has ~1e-8 of rounding), so they are judged against the model's gradient
 * scale. floor = 1e-6 for the logits and losses. (Elementwise relative error is meaningless for
 * entries that are ~0 by cancellation.) The largest error per family (loss, logits, embedding, P,
 * attention, layer norm, FFN) is printed.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"

#define TOLERANCE 1e-4
#define FIXTURE_DIR LUNA_SOURCE_DIR "/tests/fixtures/model"

enum { FAM_LOSS, FAM_LOGITS, FAM_EMBED, FAM_P, FAM_ATTN, FAM_NORM, FAM_FFN, NUM_FAMILIES };
static const char *family_names[NUM_FAMILIES] = {"loss/nll", "logits",         "grad embedding",
                                                 "grad P",   "grad attention", "grad layer norm",
                                                 "grad FFN"};
static double overall[NUM_FAMILIES];

static int family_of(const char *name) {
    if (strstr(name, "embed_tokens")) return FAM_EMBED;
    if (strstr(name, "projected_embeddings")) return FAM_P;
    if (strstr(name, "layer_norm")) return FAM_NORM;
    if (strstr(name, "attn.")) return FAM_ATTN;
    return FAM_FFN;
}

static double normwise_error(const float *ours, const float *ref, size_t n, double floor) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        float r;
        memcpy(&r, ref + i, sizeof r); /* fixture data may be unaligned */
        double d = fabs((double)ours[i] - (double)r);
        if (isnan(d)) return INFINITY;
        diff = fmax(diff, d);
        scale = fmax(scale, fabs((double)r));
    }
    return diff / fmax(scale, floor);
}

static const void *expect_tensor(const luna_safetensors *st, const char *name, luna_dtype dtype,
                                 int ndim, int64_t a, int64_t b, int64_t c) {
    int64_t shape[3] = {a, b, c};
    const luna_st_tensor *t;
    luna_status s = luna_safetensors_expect(st, name, dtype, ndim, shape, &t);
    ck_assert_msg(s == LUNA_OK, "%s", luna_error_message());
    return t->data;
}

static int32_t *copy_i32(const void *data, size_t n) {
    int32_t *out = malloc(n * sizeof(int32_t));
    memcpy(out, data, n * sizeof(int32_t));
    return out;
}

static void check_fixture(const char *path) {
    luna_safetensors *st;
    ck_assert_msg(luna_safetensors_open(&st, path) == LUNA_OK, "%s", luna_error_message());
    luna_config c;
    ck_assert_msg(luna_config_from_safetensors(&c, st) == LUNA_OK, "%s", luna_error_message());
    c.dropout = c.attention_dropout = c.activation_dropout = 0.0;
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 2), LUNA_OK);
    luna_seq2seq *m;
    ck_assert_msg(luna_seq2seq_create(&m, be, &c) == LUNA_OK, "%s", luna_error_message());
    ck_assert_msg(luna_params_load(m->params, st) == LUNA_OK, "%s", luna_error_message());

    const luna_st_tensor *src = luna_safetensors_find(st, "input.src_tokens");
    const luna_st_tensor *prev = luna_safetensors_find(st, "input.prev_output_tokens");
    ck_assert_msg(src && prev && src->ndim == 2 && prev->ndim == 2, "%s: inputs missing", path);
    const int B = (int)src->shape[0], M = (int)src->shape[1], N = (int)prev->shape[1];
    const int V = c.vocab_size;
    int32_t *src_tokens =
        copy_i32(expect_tensor(st, "input.src_tokens", LUNA_I32, 2, B, M, 0), (size_t)B * M);
    int32_t *src_lengths =
        copy_i32(expect_tensor(st, "input.src_lengths", LUNA_I32, 1, B, 0, 0), (size_t)B);
    int32_t *prev_tokens = copy_i32(
        expect_tensor(st, "input.prev_output_tokens", LUNA_I32, 2, B, N, 0), (size_t)B * N);
    int32_t *target =
        copy_i32(expect_tensor(st, "input.target", LUNA_I32, 2, B, N, 0), (size_t)B * N);
    luna_batch batch = {.B = B,
                        .src_len = M,
                        .tgt_len = N,
                        .src_tokens = src_tokens,
                        .src_lengths = src_lengths,
                        .prev_output_tokens = prev_tokens,
                        .target = target};
    const float *ref_logits = expect_tensor(st, "output.logits", LUNA_F32, 3, B, N, V);
    float ref_loss, ref_nll;
    memcpy(&ref_loss, expect_tensor(st, "output.loss", LUNA_F32, 1, 1, 0, 0), sizeof ref_loss);
    memcpy(&ref_nll, expect_tensor(st, "output.nll", LUNA_F32, 1, 1, 0, 0), sizeof ref_nll);

    double worst[NUM_FAMILIES] = {0};
    const char *worst_name[NUM_FAMILIES] = {0};
    /* forward: logits and losses */
    float *logits = malloc(sizeof(float) * B * N * V);
    double loss, nll;
    ck_assert_msg(luna_seq2seq_forward(m, &batch, &loss, &nll, logits) == LUNA_OK, "%s: %s", path,
                  luna_error_message());
    worst[FAM_LOSS] =
        fmax(fabs(loss - ref_loss) / fabs(ref_loss), fabs(nll - ref_nll) / fabs(ref_nll));
    worst_name[FAM_LOSS] = "output.loss";
    worst[FAM_LOGITS] = normwise_error(logits, ref_logits, (size_t)B * N * V, 1e-6);
    worst_name[FAM_LOGITS] = "output.logits";

    /* backward: every parameter's gradient */
    LUNA_CHECK_OK(luna_seq2seq_zero_grad(m));
    double loss2;
    ck_assert_msg(luna_seq2seq_forward_backward_eval(m, &batch, &loss2, NULL) == LUNA_OK, "%s: %s",
                  path, luna_error_message());
    ck_assert(loss2 == loss);
    const luna_params *p = m->params;
    int compared = 0;
    double G = 0;
    for (int i = 0; i < luna_safetensors_count(st); i++) {
        const luna_st_tensor *t = luna_safetensors_at(st, i);
        if (strncmp(t->name, "grad.", 5) != 0 || t->dtype != LUNA_F32) continue;
        for (size_t j = 0; j < t->nbytes / sizeof(float); j++) {
            float v;
            memcpy(&v, (const char *)t->data + j * sizeof v, sizeof v);
            G = fmax(G, fabs(v));
        }
    }
    for (int i = 0; i < p->num_tensors; i++) {
        const luna_param_info *t = &p->tensors[i];
        char name[160];
        snprintf(name, sizeof name, "grad.%s", t->name);
        const luna_st_tensor *g = luna_safetensors_find(st, name);
        const float *ours = p->grad + t->offset;
        if (!g) {
            /* Only a parameter without a gradient (spec §7) may lack one in the oracle. */
            ck_assert_msg(!t->has_grad, "%s: %s missing in the fixture", path, name);
            for (size_t j = 0; j < t->numel; j++)
                ck_assert_float_eq(ours[j], 0.0f);
            continue;
        }
        const float *ref = expect_tensor(st, name, LUNA_F32, t->ndim, t->shape[0], t->shape[1], 0);
        double e = normwise_error(ours, ref, t->numel, 1e-3 * G);
        int f = family_of(t->name);
        if (e > worst[f]) {
            worst[f] = e;
            worst_name[f] = t->name;
        }
        compared++;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    printf("%s: %d gradients compared; loss %.6f (ref %.6f)\n", base, compared, loss, ref_loss);
    bool ok = true;
    for (int f = 0; f < NUM_FAMILIES; f++) {
        if (!worst_name[f]) continue;
        printf("  %-16s max error %.2e  (%s)\n", family_names[f], worst[f], worst_name[f]);
        overall[f] = fmax(overall[f], worst[f]);
        ok = ok && worst[f] <= TOLERANCE;
    }
    ck_assert_msg(ok, "%s: an error exceeds %g (see the table above)", base, TOLERANCE);

    free(logits);
    free(src_tokens);
    free(src_lengths);
    free(prev_tokens);
    free(target);
    luna_seq2seq_free(m);
    luna_backend_free(be);
    luna_safetensors_close(st);
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(all_fixtures_match_the_oracle) {
    DIR *d = opendir(FIXTURE_DIR);
    ck_assert_msg(d != NULL, "no fixture directory %s (run tests/reference/make_fixtures.py)",
                  FIXTURE_DIR);
    char *names[256];
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) && count < 256) {
        size_t n = strlen(e->d_name);
        if (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0)
            names[count++] = strdup(e->d_name);
    }
    closedir(d);
    ck_assert_msg(count > 0, "no fixtures in %s (run tests/reference/make_fixtures.py)",
                  FIXTURE_DIR);
    qsort(names, (size_t)count, sizeof names[0], compare_names);
    for (int i = 0; i < count; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", FIXTURE_DIR, names[i]);
        check_fixture(path);
        free(names[i]);
    }
    printf("largest normwise relative error over %d fixtures (tolerance %g):\n", count, TOLERANCE);
    for (int f = 0; f < NUM_FAMILIES; f++)
        printf("  %-16s %.2e\n", family_names[f], overall[f]);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_reference");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, all_fixtures_match_the_oracle);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
