/* Safetensors checkpoints: byte format, round trip of the model parameters and configuration,
 * and one-line errors for mismatched, missing, truncated and corrupt files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file_util.h"
#include "core/json.h"
#include "model/param_table.h"
#include "model/pass.h"
#include "core/safetensors.h"
#include "tests/test_util.h"

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

static char *path_of(const char *name) {
    char *p = luna_path_join(dir, name);
    ck_assert_ptr_nonnull(p);
    return p;
}

static unsigned char *slurp(const char *path, size_t *size) {
    char *data;
    ck_assert_int_eq(luna_read_file(path, &data, size), LUNA_OK);
    return (unsigned char *)data;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static luna_config tiny(void) {
    luna_config c;
    ck_assert_int_eq(luna_config_preset(&c, "luna_tiny"), LUNA_OK);
    c.vocab_size = 40;
    return c;
}

/* The exact layout: u64 header length, JSON header padded with spaces to 8 bytes, data. */
START_TEST(byte_format) {
    char *path = path_of("small.safetensors");
    float a[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[3] = {-1, 7, 1 << 30};
    luna_st_tensor t[2] = {
        {.name = "a", .dtype = LUNA_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b.ids", .dtype = LUNA_I32, .ndim = 1, .shape = {3}, .data = b},
    };
    luna_st_metadata meta[1] = {{"note", "quote \" and \\ and\nnewline"}};
    ck_assert_int_eq(luna_safetensors_write(path, t, 2, meta, 1), LUNA_OK);
    size_t size;
    unsigned char *raw = slurp(path, &size);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)raw[i] << (8 * i);
    ck_assert_uint_eq(n % 8, 0);
    ck_assert_uint_eq(size, 8 + n + sizeof a + sizeof b);
    ck_assert_int_eq(memcmp(raw + 8 + n, a, sizeof a), 0);
    ck_assert_int_eq(memcmp(raw + 8 + n + sizeof a, b, sizeof b), 0);
    luna_json *h;
    ck_assert_int_eq(luna_json_parse(&h, (char *)raw + 8, n, NULL), LUNA_OK);
    const luna_json *ea = luna_json_get(h, "a");
    ck_assert_str_eq(luna_json_get(ea, "dtype")->string, "F32");
    ck_assert_int_eq(luna_json_get(ea, "data_offsets")->items[1].int_value, 24);
    ck_assert_str_eq(luna_json_get(luna_json_get(h, "__metadata__"), "note")->string,
                     "quote \" and \\ and\nnewline");
    luna_json_free(h);
    free(raw);

    luna_safetensors *st;
    ck_assert_int_eq(luna_safetensors_open(&st, path), LUNA_OK);
    ck_assert_int_eq(luna_safetensors_count(st), 2);
    const luna_st_tensor *tb;
    int64_t shape_b[1] = {3};
    ck_assert_int_eq(luna_safetensors_expect(st, "b.ids", LUNA_I32, 1, shape_b, &tb), LUNA_OK);
    ck_assert_int_eq(memcmp(tb->data, b, sizeof b), 0);
    ck_assert_str_eq(luna_safetensors_metadata(st, "note"), "quote \" and \\ and\nnewline");
    ck_assert_ptr_null(luna_safetensors_metadata(st, "absent"));
    luna_safetensors_close(st);
    free(path);
}
END_TEST

START_TEST(model_roundtrip) {
    char *path = path_of("checkpoint_last.safetensors");
    luna_config c = tiny();
    c.untie_luna_kv = true;
    luna_params *p, *q;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_init(p, 123), LUNA_OK);
    luna_st_metadata extra[1] = {{"update", "42"}};
    ck_assert_int_eq(luna_params_save(p, path, extra, 1), LUNA_OK);

    luna_safetensors *st;
    ck_assert_int_eq(luna_safetensors_open(&st, path), LUNA_OK);
    ck_assert_int_eq(luna_safetensors_count(st), p->num_tensors);
    ck_assert_str_eq(luna_safetensors_metadata(st, "update"), "42");
    luna_config back;
    ck_assert_int_eq(luna_config_from_safetensors(&back, st), LUNA_OK);
    ck_assert(back.untie_luna_kv && back.vocab_size == 40 && back.projection_length == 8);
    ck_assert_int_eq(luna_params_create(&q, be, &back), LUNA_OK); /* initialised with seed 1 */
    ck_assert_int_ne(memcmp(p->data, q->data, p->num_params * sizeof(float)), 0);
    ck_assert_int_eq(luna_params_load(q, st), LUNA_OK);
    ck_assert_int_eq(memcmp(p->data, q->data, p->num_params * sizeof(float)), 0);
    luna_safetensors_close(st);

    /* No temporary files are left next to the checkpoint. */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    ck_assert_int_eq(system(cmd), 0);
    luna_params_free(q);
    luna_params_free(p);
    free(path);
}
END_TEST

/* Non-contextual P (paper Table 5): the per-layer P tensors and the config flag survive a save
 * and load; a contextual model refuses the file (an unknown encoder.layers.1 parameter). */
START_TEST(non_contextual_roundtrip) {
    char *path = path_of("noncontextual.safetensors");
    luna_config c = tiny();
    c.non_contextual_projection = true;
    luna_params *p, *q, *r;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_init(p, 77), LUNA_OK);
    ck_assert_ptr_nonnull(luna_params_find(p, "encoder.layers.1.projected_embeddings"));
    ck_assert_ptr_nonnull(luna_params_find(p, "decoder.layers.0.projected_embeddings"));
    ck_assert_ptr_null(luna_params_find(p, "encoder.layers.0.projected_embeddings"));
    ck_assert(!luna_params_find(p, "encoder.layers.0.self_atten_proj_layer_norm.weight")->has_grad);
    ck_assert_int_eq(luna_params_save(p, path, NULL, 0), LUNA_OK);
    luna_safetensors *st;
    ck_assert_int_eq(luna_safetensors_open(&st, path), LUNA_OK);
    luna_config back;
    ck_assert_int_eq(luna_config_from_safetensors(&back, st), LUNA_OK);
    ck_assert(back.non_contextual_projection);
    ck_assert_int_eq(luna_params_create(&q, be, &back), LUNA_OK);
    ck_assert_int_eq(luna_params_load(q, st), LUNA_OK);
    ck_assert_uint_eq(q->num_params, p->num_params);
    ck_assert_int_eq(memcmp(p->data, q->data, p->num_params * sizeof(float)), 0);
    luna_config ctx = back;
    ctx.non_contextual_projection = false;
    ck_assert_int_eq(luna_params_create(&r, be, &ctx), LUNA_OK);
    ck_assert_int_ne(luna_params_load(r, st), LUNA_OK);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "projected_embeddings"));
    luna_safetensors_close(st);
    luna_params_free(r);
    luna_params_free(q);
    luna_params_free(p);
    free(path);
}
END_TEST

/* Linformer: E, F (per layer, or the one layerwise tensor) and the config survive save and load. */
START_TEST(linformer_roundtrip) {
    static const luna_linformer_sharing modes[] = {LUNA_LINFORMER_HEADWISE, LUNA_LINFORMER_KV,
                                                   LUNA_LINFORMER_LAYERWISE};
    static const char *const names[] = {"encoder.layers.1.self_attn.compress_v.weight",
                                        "encoder.layers.1.self_attn.compress_k.weight",
                                        "encoder.compress_layer.weight"};
    for (int i = 0; i < 3; i++) {
        char *path = path_of("linformer.safetensors");
        luna_config c;
        ck_assert_int_eq(luna_config_preset(&c, "linformer_tiny"), LUNA_OK);
        c.vocab_size = 40;
        c.linformer_sharing = modes[i];
        luna_params *p, *q;
        ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
        ck_assert_int_eq(luna_params_init(p, 99), LUNA_OK);
        const luna_param_info *t = luna_params_find(p, names[i]);
        ck_assert_ptr_nonnull(t);
        ck_assert(t->shape[0] == 8 && t->shape[1] == 64);
        ck_assert_int_eq(luna_params_save(p, path, NULL, 0), LUNA_OK);
        luna_safetensors *st;
        ck_assert_int_eq(luna_safetensors_open(&st, path), LUNA_OK);
        luna_config back;
        ck_assert_int_eq(luna_config_from_safetensors(&back, st), LUNA_OK);
        ck_assert(back.linformer_k == 8 && back.max_source_positions == 64 &&
                  back.linformer_sharing == modes[i]);
        ck_assert_int_eq(luna_params_create(&q, be, &back), LUNA_OK);
        ck_assert_int_eq(luna_params_load(q, st), LUNA_OK);
        ck_assert_int_eq(memcmp(p->data, q->data, p->num_params * sizeof(float)), 0);
        luna_safetensors_close(st);
        luna_params_free(q);
        luna_params_free(p);
        free(path);
    }
}
END_TEST

START_TEST(mismatch_errors_name_file_and_tensor) {
    char *path = path_of("tied.safetensors");
    luna_config c = tiny();
    luna_params *p, *q;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_save(p, path, NULL, 0), LUNA_OK);
    luna_safetensors *st;
    ck_assert_int_eq(luna_safetensors_open(&st, path), LUNA_OK);

    /* Different FFN size: a shape mismatch naming the tensor, both shapes and the file. */
    luna_config wide = c;
    wide.encoder_ffn_embed_dim = 128;
    ck_assert_int_eq(luna_params_create(&q, be, &wide), LUNA_OK);
    ck_assert_int_eq(luna_params_load(q, st), LUNA_ERR_MISMATCH);
    const char *msg = luna_error_message();
    ck_assert_ptr_nonnull(strstr(msg, path));
    ck_assert_ptr_nonnull(strstr(msg, "'encoder.layers.0.fc1.weight'"));
    ck_assert_ptr_nonnull(strstr(msg, "[64,32]"));
    ck_assert_ptr_nonnull(strstr(msg, "expected [128,32]"));
    ck_assert_ptr_null(strchr(msg, '\n'));
    luna_params_free(q);

    /* Untied model from a tied file: the file's tensors are not parameters of this model. */
    luna_config untied = c;
    untied.untie_luna_kv = true;
    ck_assert_int_eq(luna_params_create(&q, be, &untied), LUNA_OK);
    ck_assert_int_eq(luna_params_load(q, st), LUNA_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "pc_proj"));
    luna_params_free(q);

    /* More layers than the file has: a missing tensor. */
    luna_config deep = c;
    deep.decoder_layers = 3;
    ck_assert_int_eq(luna_params_create(&q, be, &deep), LUNA_OK);
    ck_assert_int_eq(luna_params_load(q, st), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "'decoder.layers.2."));
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "missing"));
    luna_params_free(q);

    /* Wrong dtype. */
    int32_t ids[2] = {1, 2};
    luna_st_tensor t = {.name = "x", .dtype = LUNA_I32, .ndim = 1, .shape = {2}, .data = ids};
    char *p2 = path_of("ids.safetensors");
    ck_assert_int_eq(luna_safetensors_write(p2, &t, 1, NULL, 0), LUNA_OK);
    luna_safetensors *st2;
    ck_assert_int_eq(luna_safetensors_open(&st2, p2), LUNA_OK);
    int64_t two[1] = {2};
    ck_assert_int_eq(luna_safetensors_expect(st2, "x", LUNA_F32, 1, two, NULL), LUNA_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "(I32), expected [2] (F32)"));
    luna_safetensors_close(st2);
    free(p2);

    luna_safetensors_close(st);
    luna_params_free(p);
    free(path);
}
END_TEST

static luna_status open_expect_fail(const char *path) {
    luna_safetensors *st = NULL;
    luna_status s = luna_safetensors_open(&st, path);
    ck_assert_ptr_null(st);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), path));
    ck_assert_ptr_null(strchr(luna_error_message(), '\n'));
    return s;
}

START_TEST(truncated_and_corrupt_files) {
    char *path = path_of("model.safetensors");
    luna_config c = tiny();
    luna_params *p;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_save(p, path, NULL, 0), LUNA_OK);
    size_t size;
    unsigned char *raw = slurp(path, &size);
    char *bad = path_of("bad.safetensors");
    char expect[64];

    /* Truncated in the data: names the file, the tensor that runs past the end and the size. */
    write_bytes(bad, raw, size - 10);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "truncated"));
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "decoder.layers.1.final_layer_norm.bias"));
    snprintf(expect, sizeof expect, "the file has %zu bytes", size - 10);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), expect));

    /* Truncated in the header. */
    write_bytes(bad, raw, 100);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "byte 100"));
    write_bytes(bad, raw, 5);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "too short"));

    /* Trailing garbage. */
    unsigned char *longer = malloc(size + 4);
    memcpy(longer, raw, size);
    memset(longer + size, 0, 4);
    write_bytes(bad, longer, size + 4);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    snprintf(expect, sizeof expect, "byte %zu: trailing bytes", size);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), expect));
    free(longer);

    /* Corrupt JSON: the byte offset of the damage in the file. */
    unsigned char *corrupt = malloc(size);
    memcpy(corrupt, raw, size);
    const char *where = strstr((char *)corrupt + 8, "\"shape\"");
    size_t at = (size_t)((const unsigned char *)where - corrupt);
    corrupt[at + 7] = ';'; /* "shape"; instead of "shape": */
    write_bytes(bad, corrupt, size);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    snprintf(expect, sizeof expect, "byte %zu:", at + 7);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), expect));

    /* Offsets that do not match the shape. */
    memcpy(corrupt, raw, size);
    char *shape = strstr((char *)corrupt + 8, "\"shape\":[40,32]");
    ck_assert_ptr_nonnull(shape);
    shape[9] = '1'; /* [41,32] */
    write_bytes(bad, corrupt, size);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "do not match dtype and shape"));

    /* Implausible header length: not a safetensors file. */
    write_bytes(bad, "garbage garbage garbage", 23);
    ck_assert_int_eq(open_expect_fail(bad), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "byte 0"));

    /* A missing file is an I/O error naming it. */
    char *none = path_of("none.safetensors");
    ck_assert_int_ne(open_expect_fail(none), LUNA_OK);
    free(none);
    free(corrupt);
    free(raw);
    free(bad);
    luna_params_free(p);
    free(path);
}
END_TEST

/* A failed save leaves the previous checkpoint untouched. */
START_TEST(failed_save_keeps_previous_file) {
    char *path = path_of("keep.safetensors");
    luna_config c = tiny();
    luna_params *p;
    ck_assert_int_eq(luna_params_create(&p, be, &c), LUNA_OK);
    ck_assert_int_eq(luna_params_save(p, path, NULL, 0), LUNA_OK);
    size_t before;
    unsigned char *raw = slurp(path, &before);
    luna_st_tensor bogus = {.name = "x", .dtype = 7, .ndim = 1, .shape = {1}, .data = raw};
    ck_assert_int_eq(luna_safetensors_write(path, &bogus, 1, NULL, 0), LUNA_ERR_INVALID_ARGUMENT);
    size_t after;
    unsigned char *raw2 = slurp(path, &after);
    ck_assert_uint_eq(before, after);
    ck_assert_int_eq(memcmp(raw, raw2, before), 0);
    free(raw);
    free(raw2);
    luna_params_free(p);
    free(path);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_safetensors");
    TCase *tc = tcase_create("safetensors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, byte_format);
    tcase_add_test(tc, model_roundtrip);
    tcase_add_test(tc, non_contextual_roundtrip);
    tcase_add_test(tc, linformer_roundtrip);
    tcase_add_test(tc, mismatch_errors_name_file_and_tensor);
    tcase_add_test(tc, truncated_and_corrupt_files);
    tcase_add_test(tc, failed_save_keeps_previous_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
