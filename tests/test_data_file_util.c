/* core/file_util: atomic writes, mappings, UTF-8 validation; data/staged_dir; data/text_lines. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/staged_dir.h"
#include "data/text_lines.h"
#include "core/file_util.h"
#include "tests/test_util.h"

static char *join(const char *a, const char *b) {
    char *p = luna_path_join(a, b);
    ck_assert_ptr_nonnull(p);
    return p;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

START_TEST(atomic_write_replaces_and_leaves_no_temporaries) {
    char *dir = luna_test_make_temp_dir();
    char *path = join(dir, "f.txt");
    ck_assert_int_eq(luna_write_file_atomic(path, "old", 3), LUNA_OK);
    /* An abandoned write keeps the old file and removes its temporary. */
    luna_atomic_file *f;
    ck_assert_int_eq(luna_atomic_file_create(&f, path), LUNA_OK);
    ck_assert_int_eq(luna_atomic_file_write(f, "partial", 7), LUNA_OK);
    ck_assert_int_eq(count_entries(dir), 2);
    luna_atomic_file_free(f);
    ck_assert_int_eq(count_entries(dir), 1);
    char *data;
    size_t n;
    ck_assert_int_eq(luna_read_file(path, &data, &n), LUNA_OK);
    ck_assert_str_eq(data, "old");
    free(data);
    /* A large committed write (crosses the internal buffer) replaces it. */
    size_t big = (3u << 20) + 17;
    char *buf = malloc(big);
    for (size_t i = 0; i < big; i++)
        buf[i] = (char)('a' + i % 26);
    ck_assert_int_eq(luna_atomic_file_create(&f, path), LUNA_OK);
    ck_assert_int_eq(luna_atomic_file_write(f, buf, 5), LUNA_OK);
    ck_assert_int_eq(luna_atomic_file_write(f, buf + 5, big - 5), LUNA_OK);
    ck_assert_int_eq(luna_atomic_file_commit(f), LUNA_OK);
    ck_assert_int_eq(luna_read_file(path, &data, &n), LUNA_OK);
    ck_assert_uint_eq(n, big);
    ck_assert(memcmp(data, buf, big) == 0);
    ck_assert_int_eq(count_entries(dir), 1);
    free(data);
    free(buf);
    /* Writing into a missing directory fails with a message naming the path. */
    char *bad = join(dir, "missing/f.txt");
    ck_assert_int_eq(luna_write_file_atomic(bad, "x", 1), LUNA_ERR_IO);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), bad));
    free(bad);
    free(path);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(mapped_file_and_empty_file) {
    char *dir = luna_test_make_temp_dir();
    char *path = join(dir, "e");
    luna_test_write_file(path, "");
    luna_mapped_file m;
    ck_assert_int_eq(luna_mapped_file_open(&m, path), LUNA_OK);
    ck_assert_uint_eq(m.size, 0);
    luna_mapped_file_close(&m);
    luna_test_write_file(path, "abc");
    ck_assert_int_eq(luna_mapped_file_open(&m, path), LUNA_OK);
    ck_assert_uint_eq(m.size, 3);
    ck_assert(memcmp(m.data, "abc", 3) == 0);
    luna_mapped_file_close(&m);
    ck_assert_int_eq(luna_mapped_file_open(&m, dir), LUNA_ERR_IO); /* a directory */
    free(path);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(utf8_validation) {
    size_t off = 99;
    ck_assert(luna_utf8_valid("plain ascii text longer than eight", 34, NULL));
    ck_assert(luna_utf8_valid("gr\xC3\xBC\xC3\x9F \xE2\x82\xAC \xF0\x9F\x98\x80", 15, NULL));
    ck_assert(!luna_utf8_valid("abc\xFFxyz", 7, &off));
    ck_assert_uint_eq(off, 3);
    ck_assert(!luna_utf8_valid("abcdefghij\xC3", 11, &off)); /* truncated sequence */
    ck_assert_uint_eq(off, 10);
    ck_assert(!luna_utf8_valid("\xC0\xAF", 2, &off)); /* overlong '/' */
    ck_assert_uint_eq(off, 0);
    ck_assert(!luna_utf8_valid("x\xED\xA0\x80", 4, &off)); /* surrogate U+D800 */
    ck_assert_uint_eq(off, 1);
    ck_assert(!luna_utf8_valid("\xF4\x90\x80\x80", 4, &off)); /* above U+10FFFF */
    ck_assert(!luna_utf8_valid("\xE2\x28\xA1", 3, &off));     /* bad continuation */
}
END_TEST

START_TEST(text_lines_checks) {
    char *dir = luna_test_make_temp_dir();
    char *path = join(dir, "t.txt");
    luna_text_check check = {20, false};
    luna_text_lines *t;
    luna_test_write_file(path, "one\ntwo two\nlast no newline");
    ck_assert_int_eq(luna_text_lines_open(&t, path, &check), LUNA_OK);
    ck_assert_uint_eq(t->count, 3);
    size_t n;
    const char *s = luna_text_line(t, 2, &n);
    ck_assert_uint_eq(n, 15);
    ck_assert(memcmp(s, "last no newline", 15) == 0);
    s = luna_text_line(t, 1, &n);
    ck_assert_uint_eq(n, 7);
    luna_text_lines_free(t);

    struct {
        const char *text, *where;
    } bad[] = {
        {"ok\n\nok\n", ":2: empty line"},
        {"ok\n  \t\nok\n", ":2: empty line"},
        {"ok\nok\nbad \xC3\x28\n", ":3: invalid UTF-8 at byte 5"},
        {"ok\nthis line is longer than twenty bytes\n", ":2: line is 37 bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        luna_test_write_file(path, bad[i].text);
        ck_assert_int_eq(luna_text_lines_open(&t, path, &check), LUNA_ERR_FORMAT);
        ck_assert_msg(strstr(luna_error_message(), path) &&
                          strstr(luna_error_message(), bad[i].where),
                      "case %zu: %s", i, luna_error_message());
    }
    check.allow_empty = true;
    luna_test_write_file(path, "ok\n\nok\n \n");
    ck_assert_int_eq(luna_text_lines_open(&t, path, &check), LUNA_OK);
    ck_assert_uint_eq(t->count, 4);
    ck_assert_uint_eq(t->num_empty, 2);
    luna_text_lines_free(t);
    free(path);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(staged_dir_commit_and_abort) {
    char *dir = luna_test_make_temp_dir();
    char *dest = join(dir, "sub/out");
    luna_staged_dir *s;
    /* Abort: nothing appears. */
    ck_assert_int_eq(luna_staged_dir_create(&s, dest), LUNA_OK);
    char *f = join(luna_staged_dir_path(s), "a");
    luna_test_write_file(f, "1");
    free(f);
    luna_staged_dir_free(s);
    ck_assert(!luna_path_exists(dest));
    char *sub = join(dir, "sub");
    ck_assert_int_eq(count_entries(sub), 0);
    /* Commit to a new directory, then over an existing one (other files kept). */
    ck_assert_int_eq(luna_staged_dir_create(&s, dest), LUNA_OK);
    f = join(luna_staged_dir_path(s), "a");
    luna_test_write_file(f, "1");
    free(f);
    ck_assert_int_eq(luna_staged_dir_commit(s), LUNA_OK);
    char *keep = join(dest, "keep");
    luna_test_write_file(keep, "k");
    ck_assert_int_eq(luna_staged_dir_create(&s, dest), LUNA_OK);
    f = join(luna_staged_dir_path(s), "a");
    luna_test_write_file(f, "2");
    free(f);
    ck_assert_int_eq(luna_staged_dir_commit(s), LUNA_OK);
    char *a = join(dest, "a"), *data;
    size_t n;
    ck_assert_int_eq(luna_read_file(a, &data, &n), LUNA_OK);
    ck_assert_str_eq(data, "2");
    free(data);
    ck_assert(luna_path_exists(keep));
    ck_assert_int_eq(count_entries(sub), 1); /* no staging leftovers */
    free(a);
    free(keep);
    free(sub);
    free(dest);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("data_file_util");
    TCase *tc = tcase_create("file_util");
    tcase_add_test(tc, atomic_write_replaces_and_leaves_no_temporaries);
    tcase_add_test(tc, mapped_file_and_empty_file);
    tcase_add_test(tc, utf8_validation);
    tcase_add_test(tc, text_lines_checks);
    tcase_add_test(tc, staged_dir_commit_and_abort);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
