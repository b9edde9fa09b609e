/* data/indexed_dataset: fairseq MMIDIDX reader and builder.
 *
 * The fixtures are written by write_fixture() below, an independent writer that follows
 * fairseq's MMapIndexedDataset.Index.writer byte by byte:
 *   f.write(b"MMIDIDX\x00\x00"); f.write(struct.pack("<Q", 1)); f.write(struct.pack("<B", code))
 *   f.write(struct.pack("<Q", len(sizes))); f.write(np.array(sizes, np.int32).tobytes())
 *   f.write(np.array(pointers, np.int64).tobytes())    # pointers: running byte offsets
 * and the .bin is np.array(tokens, dtype).tobytes() for each sentence in turn. Every byte is
 * packed explicitly little-endian here, without using the library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/indexed_dataset.h"
#include "core/file_util.h"
#include "tests/test_util.h"

static void put_le(FILE *f, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        ck_assert_int_ne(fputc((int)((v >> (8 * i)) & 0xFF), f), EOF);
}

static char *path_of(const char *dir, const char *name) {
    char *p = luna_path_join(dir, name);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Write prefix.idx/.bin holding `n` sentences (sizes[i] tokens from `tokens`, flattened). */
static void write_fixture(const char *prefix, int code, int elem, const int32_t *sizes, size_t n,
                          const int64_t *tokens) {
    char path[1024];
    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *bin = fopen(path, "wb");
    ck_assert_ptr_nonnull(bin);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (int32_t j = 0; j < sizes[i]; j++)
            put_le(bin, (uint64_t)tokens[k++], elem);
    ck_assert_int_eq(fclose(bin), 0);
    snprintf(path, sizeof path, "%s.idx", prefix);
    FILE *idx = fopen(path, "wb");
    ck_assert_ptr_nonnull(idx);
    ck_assert_uint_eq(fwrite("MMIDIDX\0\0", 1, 9, idx), 9);
    put_le(idx, 1, 8);
    put_le(idx, (uint64_t)code, 1);
    put_le(idx, n, 8);
    for (size_t i = 0; i < n; i++)
        put_le(idx, (uint32_t)sizes[i], 4);
    uint64_t address = 0;
    for (size_t i = 0; i < n; i++) {
        put_le(idx, address, 8);
        address += (uint64_t)sizes[i] * (uint64_t)elem;
    }
    ck_assert_int_eq(fclose(idx), 0);
}

static unsigned char *slurp(const char *path, size_t *n) {
    char *data;
    ck_assert_int_eq(luna_read_file(path, &data, n), LUNA_OK);
    return (unsigned char *)data;
}

static void spew(const char *path, const unsigned char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* Random corpus: n sentences (some empty), ids in [0, limit). */
static int32_t *random_corpus(luna_test_rng *rng, size_t n, int32_t limit, int32_t *sizes,
                              size_t *total) {
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        sizes[i] = i == 3 ? 0 : (int32_t)luna_test_uniform(rng, 1, 40);
        *total += (size_t)sizes[i];
    }
    int32_t *tokens = malloc((*total + 1) * sizeof *tokens);
    for (size_t k = 0; k < *total; k++)
        tokens[k] = (int32_t)luna_test_uniform(rng, 0, (float)limit);
    tokens[0] = limit - 1; /* the largest id occurs */
    return tokens;
}

static void roundtrip(luna_index_dtype dtype, int32_t limit) {
    char *dir = luna_test_make_temp_dir();
    char *prefix = path_of(dir, "train.en-de.en"), *fixture = path_of(dir, "fixture");
    luna_test_rng rng;
    luna_test_rng_seed(&rng, (uint64_t)dtype);
    enum { N = 300 };
    int32_t sizes[N];
    size_t total;
    int32_t *tokens = random_corpus(&rng, N, limit, sizes, &total);
    luna_indexed_builder *b;
    ck_assert_int_eq(luna_indexed_builder_create(&b, prefix, dtype), LUNA_OK);
    size_t k = 0;
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(luna_indexed_builder_add(b, tokens + k, (size_t)sizes[i]), LUNA_OK);
        k += (size_t)sizes[i];
    }
    ck_assert_int_eq(luna_indexed_builder_finish(b), LUNA_OK);

    luna_indexed_dataset *ds;
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_OK);
    ck_assert_uint_eq(luna_indexed_dataset_count(ds), N);
    ck_assert_int_eq(luna_indexed_dataset_dtype(ds), dtype);
    ck_assert_int_eq(luna_indexed_dataset_total_tokens(ds), (int64_t)total);
    int32_t buf[64];
    k = 0;
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(luna_indexed_dataset_sizes(ds)[i], sizes[i]);
        luna_indexed_dataset_get(ds, i, buf);
        ck_assert(memcmp(buf, tokens + k, (size_t)sizes[i] * sizeof *buf) == 0);
        k += (size_t)sizes[i];
    }
    ck_assert_int_eq(luna_indexed_dataset_check_ids(ds, limit, "dict"), LUNA_OK);
    luna_indexed_dataset_free(ds);

    /* Byte-identical to the independent writer's files. */
    int64_t *wide = malloc((total + 1) * sizeof *wide);
    for (size_t j = 0; j < total; j++)
        wide[j] = tokens[j];
    write_fixture(fixture, dtype, (int)luna_index_dtype_size(dtype), sizes, N, wide);
    const char *ext[2] = {".idx", ".bin"};
    for (int e = 0; e < 2; e++) {
        char a[1024], c[1024];
        snprintf(a, sizeof a, "%s%s", prefix, ext[e]);
        snprintf(c, sizeof c, "%s%s", fixture, ext[e]);
        size_t na, nc;
        unsigned char *da = slurp(a, &na), *dc = slurp(c, &nc);
        ck_assert_uint_eq(na, nc);
        ck_assert_msg(memcmp(da, dc, na) == 0, "%s differs from the fixture", a);
        free(da);
        free(dc);
    }
    free(wide);
    free(tokens);
    free(prefix);
    free(fixture);
    luna_test_remove_tree(dir);
    free(dir);
}

START_TEST(roundtrip_uint16) { roundtrip(LUNA_DTYPE_UINT16, 65000); }
END_TEST

START_TEST(roundtrip_int32) { roundtrip(LUNA_DTYPE_INT32, 200000); }
END_TEST

START_TEST(best_dtype_like_fairseq) {
    ck_assert_int_eq(luna_index_best_dtype(32000), LUNA_DTYPE_UINT16);
    ck_assert_int_eq(luna_index_best_dtype(65499), LUNA_DTYPE_UINT16);
    ck_assert_int_eq(luna_index_best_dtype(65500), LUNA_DTYPE_INT32);
}
END_TEST

START_TEST(empty_dataset_and_empty_sentence) {
    char *dir = luna_test_make_temp_dir();
    char *prefix = path_of(dir, "empty");
    luna_indexed_builder *b;
    ck_assert_int_eq(luna_indexed_builder_create(&b, prefix, LUNA_DTYPE_UINT16), LUNA_OK);
    ck_assert_int_eq(luna_indexed_builder_finish(b), LUNA_OK);
    luna_indexed_dataset *ds;
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_OK);
    ck_assert_uint_eq(luna_indexed_dataset_count(ds), 0);
    luna_indexed_dataset_free(ds);
    char idx[1024];
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    size_t n;
    free(slurp(idx, &n));
    ck_assert_uint_eq(n, LUNA_MMIDIDX_HEADER_BYTES);

    /* Only empty sentences: the .bin is empty too. */
    ck_assert_int_eq(luna_indexed_builder_create(&b, prefix, LUNA_DTYPE_INT32), LUNA_OK);
    ck_assert_int_eq(luna_indexed_builder_add(b, NULL, 0), LUNA_OK);
    ck_assert_int_eq(luna_indexed_builder_add(b, NULL, 0), LUNA_OK);
    ck_assert_int_eq(luna_indexed_builder_finish(b), LUNA_OK);
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_OK);
    ck_assert_uint_eq(luna_indexed_dataset_count(ds), 2);
    ck_assert_int_eq(luna_indexed_dataset_sizes(ds)[1], 0);
    luna_indexed_dataset_free(ds);
    free(prefix);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(fixture_dtypes_read) {
    char *dir = luna_test_make_temp_dir();
    char *prefix = path_of(dir, "fx");
    const int32_t sizes[3] = {2, 0, 3};
    const int64_t tokens[5] = {0, 255, 7, 100, 2};
    const int codes[] = {1, 2, 3, 4, 5, 8, 9, 10};
    const int elems[] = {1, 1, 2, 4, 8, 2, 4, 8};
    for (size_t c = 0; c < sizeof codes / sizeof codes[0]; c++) {
        int64_t t[5];
        memcpy(t, tokens, sizeof t);
        if (codes[c] == 2) t[1] = 127; /* int8 */
        write_fixture(prefix, codes[c], elems[c], sizes, 3, t);
        luna_indexed_dataset *ds;
        ck_assert_msg(luna_indexed_dataset_open(&ds, prefix) == LUNA_OK, "code %d: %s", codes[c],
                      luna_error_message());
        int32_t buf[3];
        luna_indexed_dataset_get(ds, 0, buf);
        ck_assert_int_eq(buf[0], 0);
        ck_assert_int_eq(buf[1], (int32_t)t[1]);
        luna_indexed_dataset_get(ds, 2, buf);
        ck_assert_int_eq(buf[0], 7);
        ck_assert_int_eq(buf[1], 100);
        ck_assert_int_eq(buf[2], 2);
        luna_indexed_dataset_free(ds);
    }
    free(prefix);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

/* Each corruption must fail with LUNA_ERR_FORMAT and a message naming the file and offset. */
START_TEST(corrupt_files_are_reported) {
    char *dir = luna_test_make_temp_dir();
    char *prefix = path_of(dir, "c");
    char idx_path[1024], bin_path[1024];
    snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
    snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
    const int32_t sizes[3] = {2, 1, 3};
    const int64_t tokens[6] = {5, 6, 7, 8, 9, 10};
    write_fixture(prefix, 8, 2, sizes, 3, tokens);
    size_t idx_n, bin_n;
    unsigned char *idx = slurp(idx_path, &idx_n), *bin = slurp(bin_path, &bin_n);
    ck_assert_uint_eq(idx_n, 26 + 36);
    ck_assert_uint_eq(bin_n, 12);
    unsigned char *work = malloc(idx_n + 16);

    struct {
        const char *what, *file, *where;
        size_t cut;          /* truncate the idx to this many bytes (0: keep) */
        size_t at;           /* patch the idx at this offset ... */
        unsigned char value; /* ... with this byte (when at != 0 or what says so) */
        bool patch;
        size_t extra_idx, extra_bin; /* bytes appended */
    } cases[] = {
        {"bad magic", "idx", "byte offset 0: bad magic", 0, 0, 'X', true, 0, 0},
        {"too short", "idx", "byte offset 5: file too short", 5, 0, 0, false, 0, 0},
        {"header cut", "idx", "byte offset 20: file too short", 20, 0, 0, false, 0, 0},
        {"bad version", "idx", "byte offset 9: unsupported version 2", 0, 9, 2, true, 0, 0},
        {"float dtype", "idx", "byte offset 17: dtype code 6", 0, 17, 6, true, 0, 0},
        {"truncated", "idx", "byte offset 57: truncated", 57, 0, 0, false, 0, 0},
        {"trailing idx", "idx", "byte offset 62: 3 unexpected bytes", 0, 0, 0, false, 3, 0},
        {"sizes do not add up", "idx",
         "byte offset 46: sentence 1 has pointer 4 but the sizes before it add up to byte 6", 0, 26,
         3, true, 0, 0},
        {"pointer past end", "idx",
         "byte offset 54: sentence 2 (pointer 200, 6 bytes) points past the end", 0, 54, 200, true,
         0, 0},
        {"bin longer", "bin", "byte offset 12: the index accounts for 12 bytes but the file has 14",
         0, 0, 0, false, 0, 2},
        {"bin shorter", "idx", "points past the end", 0, 0, 0, false, 0, (size_t)-2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(work, idx, idx_n);
        size_t n = cases[c].cut ? cases[c].cut : idx_n;
        if (cases[c].patch) work[cases[c].at] = cases[c].value;
        memset(work + n, 0, cases[c].extra_idx);
        n += cases[c].extra_idx;
        spew(idx_path, work, n);
        unsigned char binbuf[32];
        memcpy(binbuf, bin, bin_n);
        memset(binbuf + bin_n, 0, 16);
        size_t bn = bin_n + cases[c].extra_bin; /* (size_t)-2 wraps to bin_n - 2 */
        spew(bin_path, binbuf, bn);
        luna_indexed_dataset *ds = NULL;
        ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_ERR_FORMAT);
        ck_assert_ptr_null(ds);
        const char *msg = luna_error_message();
        const char *file = !strcmp(cases[c].file, "idx") ? idx_path : bin_path;
        ck_assert_msg(strncmp(msg, file, strlen(file)) == 0 && strstr(msg, cases[c].where),
                      "%s: got '%s'", cases[c].what, msg);
    }
    /* fairseq's legacy format gets a hint. */
    memcpy(work, "TNTIDX\0\0", 8);
    spew(idx_path, work, idx_n);
    luna_indexed_dataset *ds = NULL;
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "--dataset-impl mmap"));
    /* Missing files are I/O errors naming the file. */
    spew(idx_path, idx, idx_n);
    remove(bin_path);
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_ERR_IO);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), bin_path));
    free(work);
    free(idx);
    free(bin);
    free(prefix);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(ids_outside_dictionary) {
    char *dir = luna_test_make_temp_dir();
    char *prefix = path_of(dir, "m");
    const int32_t sizes[3] = {2, 1, 3};
    const int64_t tokens[6] = {5, 6, 7, 8, 40, 10};
    write_fixture(prefix, 4, 4, sizes, 3, tokens);
    luna_indexed_dataset *ds;
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_OK);
    ck_assert_int_eq(luna_indexed_dataset_check_ids(ds, 41, "dict.de.txt"), LUNA_OK);
    ck_assert_int_eq(luna_indexed_dataset_check_ids(ds, 40, "dict.de.txt"), LUNA_ERR_MISMATCH);
    const char *msg = luna_error_message();
    ck_assert_msg(strstr(msg, luna_indexed_dataset_bin_path(ds)) &&
                      strstr(msg, "byte offset 16: sentence 2, token 1: id 40") &&
                      strstr(msg, "dict.de.txt"),
                  "%s", msg);
    luna_indexed_dataset_free(ds);
    /* A 64-bit id beyond int32 is reported with its real value. */
    const int64_t big[6] = {5, 6, 7, 8, 5000000000LL, 10};
    write_fixture(prefix, 5, 8, sizes, 3, big);
    ck_assert_int_eq(luna_indexed_dataset_open(&ds, prefix), LUNA_OK);
    ck_assert_int_eq(luna_indexed_dataset_check_ids(ds, 100, "d"), LUNA_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "id 5000000000"));
    luna_indexed_dataset_free(ds);
    free(prefix);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(builder_rejects_and_abandons_cleanly) {
    char *dir = luna_test_make_temp_dir();
    char *prefix = path_of(dir, "b");
    luna_indexed_builder *b;
    ck_assert_int_eq(luna_indexed_builder_create(&b, prefix, LUNA_DTYPE_UINT16), LUNA_OK);
    int32_t ok[2] = {1, 65535}, bad[2] = {1, 65536}, neg[1] = {-1};
    ck_assert_int_eq(luna_indexed_builder_add(b, ok, 2), LUNA_OK);
    ck_assert_int_eq(luna_indexed_builder_add(b, bad, 2), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_indexed_builder_add(b, neg, 1), LUNA_ERR_INVALID_ARGUMENT);
    luna_indexed_builder_free(b); /* abandoned: nothing may remain */
    char idx[1024];
    snprintf(idx, sizeof idx, "%s.bin", prefix);
    ck_assert(!luna_path_exists(idx));
    ck_assert_int_eq(luna_indexed_builder_create(&b, prefix, LUNA_DTYPE_FLOAT),
                     LUNA_ERR_INVALID_ARGUMENT);
    free(prefix);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("data_indexed");
    TCase *tc = tcase_create("indexed_dataset");
    tcase_add_test(tc, roundtrip_uint16);
    tcase_add_test(tc, roundtrip_int32);
    tcase_add_test(tc, best_dtype_like_fairseq);
    tcase_add_test(tc, empty_dataset_and_empty_sentence);
    tcase_add_test(tc, fixture_dtypes_read);
    tcase_add_test(tc, corrupt_files_are_reported);
    tcase_add_test(tc, ids_outside_dictionary);
    tcase_add_test(tc, builder_rejects_and_abandons_cleanly);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
