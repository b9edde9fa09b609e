/* Checkpoint files: base64, save/load roundtrip with all metadata (config, dictionaries,
 * SentencePiece model, training state, optimizer tensors), damaged files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dictionary.h"
#include "data/sentencepiece.h"
#include "core/backend.h"
#include "core/base64.h"
#include "core/file_util.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "trainer/synthetic.h"
#include "model/kernels/cpu/backend_cpu.h"

START_TEST(test_base64) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 7);
    unsigned char data[64];
    for (size_t n = 0; n < sizeof data; n++) {
        for (size_t i = 0; i < n; i++)
            data[i] = (unsigned char)luna_test_uniform(&rng, 0, 256);
        char *text;
        size_t len;
        ck_assert_int_eq(luna_base64_encode(data, n, &text, &len), LUNA_OK);
        ck_assert_uint_eq(len, luna_base64_encoded_length(n));
        unsigned char *back;
        size_t m;
        ck_assert_int_eq(luna_base64_decode(text, len, &back, &m, "t"), LUNA_OK);
        ck_assert_uint_eq(m, n);
        ck_assert(n == 0 || memcmp(back, data, n) == 0);
        free(back);
        free(text);
    }
    char *text;
    ck_assert_int_eq(luna_base64_encode("foobar", 6, &text, NULL), LUNA_OK);
    ck_assert_str_eq(text, "Zm9vYmFy");
    free(text);
    ck_assert_int_eq(luna_base64_encode("fo", 2, &text, NULL), LUNA_OK);
    ck_assert_str_eq(text, "Zm8=");
    free(text);
    unsigned char *out;
    size_t n;
    const char *bad[] = {"Zm8", "Zm=8", "Z!8=", "Zm9=", "====", "Zg==Zg=="};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_int_eq(luna_base64_decode(bad[i], strlen(bad[i]), &out, &n, "blob"),
                         LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "blob"));
}
END_TEST

static int sentence_source(void *ctx, const char **line, size_t *len) {
    static const char *const lines[] = {"the cat sat on the mat", "a dog ran in the park",
                                        "the quick brown fox jumps", "over the lazy dog again"};
    int *i = ctx;
    if (*i >= 400) return 0;
    *line = lines[*i % 4];
    *len = strlen(*line);
    ++*i;
    return 1;
}

typedef struct {
    char *dir;
    luna_backend *be;
    luna_seq2seq *model;
    luna_dictionary *dict;
    char *spm_bytes;
    size_t spm_size;
} fixture;

static void setup_fixture(fixture *f) {
    f->dir = luna_test_make_temp_dir();
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 10;
    ck_assert_int_eq(luna_synthetic_data_bin(f->dir, &so), LUNA_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/dict.src.txt", f->dir);
    ck_assert_int_eq(luna_dictionary_load(&f->dict, path), LUNA_OK);
    ck_assert_int_eq(luna_backend_cpu_create(&f->be, 1), LUNA_OK);
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = luna_dictionary_size(f->dict);
    ck_assert_int_eq(luna_seq2seq_create(&f->model, f->be, &c), LUNA_OK);
    ck_assert_int_eq(luna_seq2seq_init(f->model, 1234), LUNA_OK);
    /* A tiny SentencePiece model. */
    int counter = 0;
    luna_spm_train_options o;
    luna_spm_train_options_init(&o);
    o.next = sentence_source;
    o.next_ctx = &counter;
    snprintf(path, sizeof path, "%s/spm", f->dir);
    o.model_prefix = path;
    o.vocab_size = 30;
    o.model_type = "char";
    ck_assert_int_eq(luna_spm_train(&o), LUNA_OK);
    snprintf(path, sizeof path, "%s/spm.model", f->dir);
    ck_assert_int_eq(luna_read_file(path, &f->spm_bytes, &f->spm_size), LUNA_OK);
}

static void teardown_fixture(fixture *f) {
    luna_seq2seq_free(f->model);
    luna_backend_free(f->be);
    luna_dictionary_free(f->dict);
    free(f->spm_bytes);
    luna_test_remove_tree(f->dir);
    free(f->dir);
}

START_TEST(test_roundtrip) {
    fixture f;
    setup_fixture(&f);
    float extra_data[6] = {1, 2, 3, 4, 5, 6};
    luna_st_tensor extra = {.name = "optimizer.exp_avg.x",
                            .dtype = LUNA_F32,
                            .ndim = 2,
                            .shape = {2, 3},
                            .data = extra_data,
                            .nbytes = sizeof extra_data};
    char *dict_text;
    size_t dict_len;
    ck_assert_int_eq(luna_dictionary_to_text(f.dict, &dict_text, &dict_len), LUNA_OK);
    luna_checkpoint_contents c = {.source_lang = "src",
                                  .target_lang = "tgt",
                                  .src_dict_text = dict_text,
                                  .tgt_dict_text = dict_text,
                                  .spm_model = f.spm_bytes,
                                  .spm_model_size = f.spm_size,
                                  .training_state = "{\"num_updates\":7}",
                                  .extra_tensors = &extra,
                                  .num_extra_tensors = 1};
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint_last.safetensors", f.dir);
    ck_assert_int_eq(luna_checkpoint_save(path, f.model->params, &c), LUNA_OK);

    luna_seq2seq *m2;
    luna_dictionary *sd, *td;
    luna_spm *spm;
    luna_checkpoint_meta meta;
    ck_assert_msg(luna_checkpoint_load_model(path, f.be, &m2, &meta) == LUNA_OK, "%s",
                  luna_error_message());
    ck_assert_msg(luna_checkpoint_load_vocab(path, m2->params->config.vocab_size, &sd, &td, &spm) ==
                      LUNA_OK,
                  "%s", luna_error_message());
    const luna_params *p = f.model->params;
    ck_assert_uint_eq(m2->params->num_params, p->num_params);
    ck_assert(memcmp(m2->params->data, p->data, p->num_params * sizeof(float)) == 0);
    /* a model loaded for inference has no gradient buffer: a backward pass is a clear error */
    ck_assert_ptr_null(m2->params->grad);
    ck_assert_int_eq(luna_seq2seq_zero_grad(m2), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "inference"));
    luna_error_clear();
    ck_assert(luna_dictionary_same_symbols(sd, f.dict, NULL));
    ck_assert(luna_dictionary_same_symbols(td, f.dict, NULL));
    ck_assert_ptr_nonnull(spm);
    const void *ser;
    size_t ser_size;
    ck_assert_int_eq(luna_spm_serialized(spm, &ser, &ser_size), LUNA_OK);
    ck_assert_uint_eq(ser_size, f.spm_size);
    ck_assert(memcmp(ser, f.spm_bytes, ser_size) == 0);
    char *j1, *j2;
    ck_assert_int_eq(luna_config_to_json(&meta.config, &j1), LUNA_OK);
    ck_assert_int_eq(luna_config_to_json(&p->config, &j2), LUNA_OK);
    ck_assert_str_eq(j1, j2);
    free(j1);
    free(j2);
    ck_assert_str_eq(meta.source_lang, "src");
    ck_assert_str_eq(meta.target_lang, "tgt");
    ck_assert_str_eq(meta.training_state, "{\"num_updates\":7}");
    luna_checkpoint_meta_release(&meta);
    luna_spm_free(spm);
    luna_dictionary_free(sd);
    luna_dictionary_free(td);
    luna_seq2seq_free(m2);

    /* The optimizer tensor is there, readable by name. */
    luna_safetensors *st;
    ck_assert_int_eq(luna_checkpoint_open(&st, path), LUNA_OK);
    const luna_st_tensor *t = luna_safetensors_find(st, "optimizer.exp_avg.x");
    ck_assert_ptr_nonnull(t);
    ck_assert(memcmp(t->data, extra_data, sizeof extra_data) == 0);
    ck_assert_str_eq(luna_safetensors_metadata(st, "format"), LUNA_CHECKPOINT_FORMAT);
    luna_safetensors_close(st);

    /* Without spm and training state: *spm is NULL, training_state NULL; NULL outputs ok. */
    c.spm_model = NULL;
    c.training_state = NULL;
    c.num_extra_tensors = 0;
    ck_assert_int_eq(luna_checkpoint_save(path, f.model->params, &c), LUNA_OK);
    spm = (luna_spm *)&c;
    ck_assert_int_eq(luna_checkpoint_load_model(path, f.be, &m2, &meta), LUNA_OK);
    ck_assert_int_eq(luna_checkpoint_load_vocab(path, 0, NULL, NULL, &spm), LUNA_OK);
    ck_assert_ptr_null(spm);
    ck_assert_ptr_null(meta.training_state);
    luna_checkpoint_meta_release(&meta);
    luna_seq2seq_free(m2);

    /* Truncated: one line naming the file, nothing allocated. */
    ck_assert_int_eq(truncate(path, 2000), 0);
    ck_assert_int_ne(luna_checkpoint_load_model(path, f.be, &m2, NULL), LUNA_OK);
    ck_assert_ptr_null(m2);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), path));
    ck_assert_ptr_null(strchr(luna_error_message(), '\n'));

    /* Not a luna checkpoint (plain safetensors). */
    ck_assert_int_eq(luna_params_save(f.model->params, path, NULL, 0), LUNA_OK);
    ck_assert_int_eq(luna_checkpoint_load_model(path, f.be, &m2, NULL), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "luna-checkpoint-1"));
    free(dict_text);
    teardown_fixture(&f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trainer_checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_base64);
    tcase_add_test(tc, test_roundtrip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
