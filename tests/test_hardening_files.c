/* Hostile and damaged files at the library level: a JSON object with 200k keys parses in
 * linear time, a safetensors shape whose product wraps is refused, a checkpoint of another
 * format is refused without touching freed memory (run under ASan by tools/test.sh --sanitize),
 * non-finite weights are refused at load naming the tensor, a negative dictionary count is an
 * error naming file:line, and integer options that overflow are errors naming the option. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/file_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "data/dictionary.h"
#include "model/checkpoint.h"
#include "model/param_table.h"
#include "model/seq2seq.h"
#include "tests/test_util.h"
#include "trainer/options.h"

#if defined(__SANITIZE_ADDRESS__)
/* absurd_config_names_checkpoint asks for 200 TB: under ASan that must fail like malloc does,
 * not abort the suite (ASAN_OPTIONS from the environment still apply on top of this). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

static char *dir;

static void setup(void) { dir = luna_test_make_temp_dir(); }
static void teardown(void) {
    luna_test_remove_tree(dir);
    free(dir);
}

/* CPU time of this process: a bound that holds on a loaded machine. For these inputs a linear
 * parser stays far below the 5 s bound and a quadratic one far above it (docs/benchmarks.md). */
static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static char *path_of(const char *name) {
    char *p = luna_path_join(dir, name);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* A safetensors file: 8-byte length, `header`, then `data_len` zero bytes. */
static void write_safetensors(const char *path, const char *header, size_t data_len) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t n = strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(n >> (8 * i));
    ck_assert_uint_eq(fwrite(len, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(header, 1, n, f), n);
    for (size_t i = 0; i < data_len; i++)
        fputc(0, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Duplicate keys found by a linear scan per key would make parsing O(n²) in the key count. */
START_TEST(json_many_keys_linear) {
    const size_t n = 200000;
    size_t cap = n * 16 + 16, len = 0;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    text[len++] = '{';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s\"k%zu\":%zu", i ? "," : "", i, i);
    text[len++] = '}';
    double t0 = seconds();
    luna_json *v;
    LUNA_CHECK_OK(luna_json_parse(&v, text, len, NULL));
    double secs = seconds() - t0;
    ck_assert_msg(secs < 5.0, "200k keys took %.2f s of CPU", secs);
    ck_assert_uint_eq(v->length, n);
    ck_assert_uint_eq(luna_json_get(v, "k123456")->uint_value, 123456);
    luna_json_free(v);
    /* A duplicate far into a big object, and in a small one, is still found. */
    len -= 1;
    len += (size_t)snprintf(text + len, cap - len, ",\"k150000\":1}");
    size_t at = 0;
    ck_assert_int_eq(luna_json_parse(&v, text, len, &at), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "duplicate object key"));
    ck_assert_uint_eq(at, len - 12); /* the key, after the comma */
    ck_assert_int_eq(luna_json_parse(&v, "{\"a\":1,\"b\":2,\"a\":3}", 19, &at), LUNA_ERR_FORMAT);
    ck_assert_uint_eq(at, 13);
    free(text);
}
END_TEST

/* The same through a safetensors header of 200k (empty) tensors. */
START_TEST(safetensors_many_tensors_linear) {
    const size_t n = 200000;
    size_t cap = n * 64 + 16, len = 0;
    char *h = malloc(cap);
    ck_assert_ptr_nonnull(h);
    h[len++] = '{';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i);
    h[len++] = '}';
    h[len] = '\0';
    char *path = path_of("many.safetensors");
    write_safetensors(path, h, 0);
    double t0 = seconds();
    luna_safetensors *st;
    LUNA_CHECK_OK(luna_safetensors_open(&st, path));
    double secs = seconds() - t0;
    ck_assert_msg(secs < 5.0, "200k tensors took %.2f s of CPU", secs);
    ck_assert_int_eq(luna_safetensors_count(st), (int)n);
    luna_safetensors_close(st);
    free(path);
    free(h);
}
END_TEST

/* The element count must be checked before it is multiplied: otherwise 2^16 · 2^48 = 2^64
 * wraps to 0 and the tensor is accepted with 0 bytes. */
START_TEST(safetensors_shape_product_overflow) {
    char *path = path_of("wrap.safetensors");
    write_safetensors(path,
                      "{\"t\":{\"dtype\":\"F32\",\"shape\":[65536,281474976710656],"
                      "\"data_offsets\":[0,0]}}",
                      0);
    luna_safetensors *st = NULL;
    ck_assert_int_eq(luna_safetensors_open(&st, path), LUNA_ERR_FORMAT);
    ck_assert_ptr_null(st);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), path));
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "tensor 't': tensor too large"));
    /* A zero dimension is legal (0 bytes). */
    write_safetensors(path, "{\"t\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[0,0]}}", 0);
    LUNA_CHECK_OK(luna_safetensors_open(&st, path));
    luna_safetensors_close(st);
    free(path);
}
END_TEST

/* The message quotes the "format" string, which lives inside the file's header: it must be
 * formatted before the file is closed (otherwise a heap-use-after-free, caught by ASan). */
START_TEST(checkpoint_other_format_message) {
    char *path = path_of("model.pt.safetensors");
    write_safetensors(path,
                      "{\"__metadata__\":{\"format\":\"pt-zip-archive-of-a-torch-model\"},"
                      "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      4);
    luna_safetensors *st = NULL;
    ck_assert_int_eq(luna_checkpoint_open(&st, path), LUNA_ERR_FORMAT);
    ck_assert_ptr_null(st);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "\"pt-zip-archive-of-a-torch-model\""));
    ck_assert_ptr_nonnull(strstr(luna_error_message(), path));
    free(path);
}
END_TEST

/* Unchecked, NaN/Inf weights load silently and translate to empty lines with exit status 0. */
START_TEST(nonfinite_weights_refused) {
    luna_backend *be = luna_test_backend(1);
    luna_config c;
    LUNA_CHECK_OK(luna_config_preset(&c, "luna_tiny"));
    c.vocab_size = 40;
    luna_params *p;
    LUNA_CHECK_OK(luna_params_create(&p, be, &c));
    char *path = path_of("w.safetensors");
    LUNA_CHECK_OK(luna_params_save(p, path, NULL, 0));
    const float bad[2] = {NAN, -INFINITY};
    const char *what[2] = {"(nan) at element 5", "(inf) at element 5"};
    for (int k = 0; k < 2; k++) {
        char *raw;
        size_t size;
        LUNA_CHECK_OK(luna_read_file(path, &raw, &size));
        /* The tensor's place in the file: the data area follows the header, and tensors are
         * listed by offset, so the first one begins the data area. */
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++)
            hlen |= (uint64_t)(unsigned char)raw[i] << (8 * i);
        size_t base = 8 + (size_t)hlen;
        luna_safetensors *st;
        LUNA_CHECK_OK(luna_safetensors_open(&st, path));
        const luna_st_tensor *t = luna_safetensors_find(st, "decoder.layers.0.fc1.weight");
        ck_assert_ptr_nonnull(t);
        size_t begin =
            (size_t)((const char *)t->data - (const char *)luna_safetensors_at(st, 0)->data);
        luna_safetensors_close(st);
        memcpy(raw + base + begin + 5 * sizeof(float), &bad[k], sizeof(float));
        char *damaged = path_of("damaged.safetensors");
        FILE *f = fopen(damaged, "wb");
        ck_assert_uint_eq(fwrite(raw, 1, size, f), size);
        fclose(f);
        LUNA_CHECK_OK(luna_safetensors_open(&st, damaged));
        ck_assert_int_eq(luna_params_load(p, st), LUNA_ERR_NUMERIC);
        luna_safetensors_close(st);
        const char *m = luna_error_message();
        ck_assert_msg(strstr(m, damaged) && strstr(m, "'decoder.layers.0.fc1.weight'") &&
                          strstr(m, what[k]) && !strchr(m, '\n'),
                      "message: %s", m);
        free(damaged);
        free(raw);
    }
    luna_params_free(p);
    luna_backend_free(be);
    free(path);
}
END_TEST

/* A count is never negative: "b -3" is an error, not a count of -3. */
START_TEST(dictionary_negative_count) {
    luna_dictionary *d = NULL;
    const char *text = "a 5\nb -3\n";
    ck_assert_int_eq(luna_dictionary_load_from_memory(&d, text, strlen(text), "dict.en.txt"),
                     LUNA_ERR_FORMAT);
    ck_assert_ptr_null(d);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "dict.en.txt:2: negative count -3"));
    text = "a 5\nb 0\n";
    LUNA_CHECK_OK(luna_dictionary_load_from_memory(&d, text, strlen(text), "dict.en.txt"));
    luna_dictionary_free(d);
}
END_TEST

/* strtoll saturates: unchecked, --max-update 99999999999999999999 and --seed 2^64+1 would both
 * silently become INT64_MAX. */
START_TEST(integer_option_overflow) {
    const char *cases[][2] = {{"--max-update", "99999999999999999999"},
                              {"--seed", "18446744073709551617"},
                              {"--max-tokens", "-99999999999999999999"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {"luna-train", "bin", (char *)cases[i][0], (char *)cases[i][1], NULL};
        luna_train_options o;
        ck_assert_int_eq(luna_train_options_parse(&o, 4, argv), LUNA_ERR_INVALID_ARGUMENT);
        const char *m = luna_error_message();
        ck_assert_msg(strstr(m, cases[i][0]) && strstr(m, cases[i][1]) && strstr(m, "out of range"),
                      "message: %s", m);
    }
    char *argv[] = {"luna-train", "bin", "--seed", "9223372036854775807", NULL};
    luna_train_options o;
    LUNA_CHECK_OK(luna_train_options_parse(&o, 4, argv));
    ck_assert_int_eq(o.seed, INT64_MAX);
}
END_TEST

/* An allocation failure for an absurd configuration names the checkpoint whose configuration
 * asked for it, not just "out of memory". */
START_TEST(absurd_config_names_checkpoint) {
    luna_config c;
    LUNA_CHECK_OK(luna_config_preset(&c, "luna_tiny"));
    c.vocab_size = 1000;
    c.encoder_embed_dim = c.decoder_embed_dim = 65536;
    c.encoder_ffn_embed_dim = c.decoder_ffn_embed_dim = 65536;
    c.encoder_layers = c.decoder_layers = 1000; /* ~5e13 parameters: 200 TB */
    char *config;
    LUNA_CHECK_OK(luna_config_to_json(&c, &config));
    const luna_st_metadata meta[] = {
        {"format", LUNA_CHECKPOINT_FORMAT}, {"config", config},     {"src_dict", "a 1\n"},
        {"tgt_dict", "a 1\n"},              {"spm_model", ""},      {"source_lang", "en"},
        {"target_lang", "de"},
    };
    char *path = path_of("huge.safetensors");
    float x = 0;
    luna_st_tensor t = {.name = "x", .dtype = LUNA_F32, .ndim = 1, .shape = {1}, .data = &x};
    LUNA_CHECK_OK(luna_safetensors_write(path, &t, 1, meta, 7));
    luna_backend *be = luna_test_backend(1);
    luna_seq2seq *model = NULL;
    luna_status s = luna_checkpoint_load_model(path, be, &model, NULL);
    ck_assert_int_ne(s, LUNA_OK);
    ck_assert_ptr_null(model);
    const char *m = luna_error_message();
    ck_assert_msg(strstr(m, path) && !strchr(m, '\n'), "message: %s", m);
    luna_backend_free(be);
    free(path);
    free(config);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("hardening_files");
    TCase *tc = tcase_create("hostile");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, json_many_keys_linear);
    tcase_add_test(tc, safetensors_many_tensors_linear);
    tcase_add_test(tc, safetensors_shape_product_overflow);
    tcase_add_test(tc, checkpoint_other_format_message);
    tcase_add_test(tc, nonfinite_weights_refused);
    tcase_add_test(tc, dictionary_negative_count);
    tcase_add_test(tc, integer_option_overflow);
    tcase_add_test(tc, absurd_config_names_checkpoint);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
