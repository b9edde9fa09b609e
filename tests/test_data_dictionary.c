/* data/dictionary: fairseq's Dictionary file format, finalize() and lookup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dictionary.h"
#include "core/file_util.h"
#include "tests/test_util.h"

static luna_dictionary *from_text(const char *text) {
    luna_dictionary *d = NULL;
    luna_status st = luna_dictionary_load_from_memory(&d, text, strlen(text), "mem");
    ck_assert_msg(st == LUNA_OK, "%s", luna_error_message());
    return d;
}

static char *to_text(const luna_dictionary *d) {
    char *text;
    size_t len;
    ck_assert_int_eq(luna_dictionary_to_text(d, &text, &len), LUNA_OK);
    ck_assert_uint_eq(strlen(text), len);
    return text;
}

START_TEST(specials_and_unknown) {
    luna_dictionary *d;
    ck_assert_int_eq(luna_dictionary_create(&d), LUNA_OK);
    ck_assert_int_eq(luna_dictionary_size(d), 4);
    ck_assert_str_eq(luna_dictionary_symbol(d, 0), "<s>");
    ck_assert_str_eq(luna_dictionary_symbol(d, 1), "<pad>");
    ck_assert_str_eq(luna_dictionary_symbol(d, 2), "</s>");
    ck_assert_str_eq(luna_dictionary_symbol(d, 3), "<unk>");
    ck_assert_int_eq(luna_dictionary_index(d, "</s>", 4), LUNA_DICT_EOS);
    ck_assert_int_eq(luna_dictionary_index(d, "nope", 4), LUNA_DICT_UNK);
    ck_assert_int_eq(luna_dictionary_find(d, "nope", 4), -1);
    ck_assert_ptr_null(luna_dictionary_symbol(d, 4));
    luna_dictionary_free(d);

    d = from_text("hello 5\nw\xC3\xB6rld 3\n\xE2\x96\x81x 1\n");
    ck_assert_int_eq(luna_dictionary_size(d), 7);
    ck_assert_int_eq(luna_dictionary_index(d, "hello", 5), 4);
    ck_assert_int_eq(luna_dictionary_index(d, "w\xC3\xB6rld", 6), 5);
    ck_assert_int_eq(luna_dictionary_index(d, "\xE2\x96\x81x", 4), 6);
    ck_assert_int_eq(luna_dictionary_index(d, "hell", 4), LUNA_DICT_UNK);
    ck_assert_int_eq(luna_dictionary_count(d, 4), 5);
    /* The saved text is exactly the input (specials are implicit). */
    char *text = to_text(d);
    ck_assert_str_eq(text, "hello 5\nw\xC3\xB6rld 3\n\xE2\x96\x81x 1\n");
    free(text);
    luna_dictionary_free(d);
}
END_TEST

START_TEST(many_symbols_hash_table) {
    luna_dictionary *d;
    ck_assert_int_eq(luna_dictionary_create(&d), LUNA_OK);
    char word[32];
    for (int i = 0; i < 50000; i++) {
        int n = snprintf(word, sizeof word, "w%d", i);
        int32_t id;
        ck_assert_int_eq(luna_dictionary_add(d, word, (size_t)n, i, false, &id), LUNA_OK);
        ck_assert_int_eq(id, i + 4);
    }
    for (int i = 0; i < 50000; i += 7) {
        int n = snprintf(word, sizeof word, "w%d", i);
        ck_assert_int_eq(luna_dictionary_index(d, word, (size_t)n), i + 4);
    }
    /* add_symbol on an existing word adds to its count. */
    ck_assert_int_eq(luna_dictionary_add(d, "w10", 3, 5, false, NULL), LUNA_OK);
    ck_assert_int_eq(luna_dictionary_count(d, 14), 15);
    ck_assert_int_eq(luna_dictionary_size(d), 50004);
    luna_dictionary_free(d);
}
END_TEST

START_TEST(overwrite_flag_and_errors) {
    /* "#fairseq:overwrite": the repeated token gets a new id and lookups find it. */
    luna_dictionary *d =
        from_text("a 1\nb 2\na 3 #fairseq:overwrite\n<unk> 9 #fairseq:overwrite\r\n");
    ck_assert_int_eq(luna_dictionary_size(d), 8);
    ck_assert_int_eq(luna_dictionary_index(d, "a", 1), 6);
    ck_assert_int_eq(luna_dictionary_index(d, "<unk>", 5), 7);
    char *text = to_text(d);
    ck_assert_str_eq(text, "a 1\nb 2\na 3 #fairseq:overwrite\n<unk> 9 #fairseq:overwrite\n");
    free(text);
    luna_dictionary_free(d);
    /* Tokens may contain spaces: only the last field is the count (rsplit(" ", 1)). */
    d = from_text("x y 4\n");
    ck_assert_int_eq(luna_dictionary_index(d, "x y", 3), 4);
    luna_dictionary_free(d);

    struct {
        const char *text, *where;
    } bad[] = {
        {"a 1\nb 2\na 3\n", "mem:3: duplicate token 'a'"},
        {"a 1\n<s> 2\n", "mem:2: duplicate token '<s>'"},
        {"a 1\njusttoken\n", "mem:2: expected '<token> <count>"},
        {"a 1\nb x\n", "mem:2: expected"},
        {"a 1\n\nb 2\n", "mem:2: expected"},
        {"a 1\nb\xFF 2\n", "mem:2: invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d = NULL;
        ck_assert_int_eq(
            luna_dictionary_load_from_memory(&d, bad[i].text, strlen(bad[i].text), "mem"),
            LUNA_ERR_FORMAT);
        ck_assert_ptr_null(d);
        ck_assert_msg(strstr(luna_error_message(), bad[i].where), "case %zu: %s", i,
                      luna_error_message());
    }
}
END_TEST

/* Expected outputs below were derived by hand from fairseq's Dictionary.finalize():
 * Counter(dict(sorted(zip(symbols, counts)))).most_common(), threshold break, pad_to_multiple_. */
START_TEST(finalize_like_fairseq) {
    luna_dictionary *d;
    ck_assert_int_eq(luna_dictionary_create(&d), LUNA_OK);
    const char *words[] = {"c", "b", "a", "d", "\xC3\xA9", "z"};
    const int64_t counts[] = {5, 5, 7, 1, 5, 5};
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(luna_dictionary_add(d, words[i], strlen(words[i]), counts[i], false, NULL),
                         LUNA_OK);
    ck_assert_int_eq(luna_dictionary_finalize(d, 0, -1, 8), LUNA_OK);
    /* 4 specials + 6 words = 10 -> padded to 16 with madeupword0000..0005; ties by byte order
     * ('z' < 'é' as in Python's str order). */
    char *text = to_text(d);
    ck_assert_str_eq(text,
                     "a 7\nb 5\nc 5\nz 5\n\xC3\xA9 5\nd 1\nmadeupword0000 0\nmadeupword0001 0\n"
                     "madeupword0002 0\nmadeupword0003 0\nmadeupword0004 0\nmadeupword0005 0\n");
    ck_assert_int_eq(luna_dictionary_size(d), 16);
    ck_assert_int_eq(luna_dictionary_size(d) % 8, 0);
    ck_assert_int_eq(luna_dictionary_index(d, "a", 1), 4);
    ck_assert_int_eq(luna_dictionary_index(d, "d", 1), 9);
    free(text);
    luna_dictionary_free(d);

    /* threshold stops at the first count below it; nwords caps the size (specials included). */
    ck_assert_int_eq(luna_dictionary_create(&d), LUNA_OK);
    for (int i = 0; i < 6; i++)
        luna_dictionary_add(d, words[i], strlen(words[i]), counts[i], false, NULL);
    ck_assert_int_eq(luna_dictionary_finalize(d, 2, -1, 1), LUNA_OK);
    text = to_text(d);
    ck_assert_str_eq(text, "a 7\nb 5\nc 5\nz 5\n\xC3\xA9 5\n");
    free(text);
    luna_dictionary_free(d);
    ck_assert_int_eq(luna_dictionary_create(&d), LUNA_OK);
    for (int i = 0; i < 6; i++)
        luna_dictionary_add(d, words[i], strlen(words[i]), counts[i], false, NULL);
    ck_assert_int_eq(luna_dictionary_finalize(d, 0, 7, 1), LUNA_OK);
    text = to_text(d);
    ck_assert_str_eq(text, "a 7\nb 5\nc 5\n");
    free(text);
    luna_dictionary_free(d);

    /* Exactly a multiple of 8: no padding. A made-up word that already exists is not re-added
     * (fairseq's add_symbol(n=0) returns the existing id), so the next number is used. */
    ck_assert_int_eq(luna_dictionary_create(&d), LUNA_OK);
    const char *w2[] = {"madeupword0000", "q"};
    luna_dictionary_add(d, w2[0], strlen(w2[0]), 3, false, NULL);
    luna_dictionary_add(d, w2[1], 1, 2, false, NULL);
    ck_assert_int_eq(luna_dictionary_finalize(d, 0, 0, 4), LUNA_OK);
    text = to_text(d);
    ck_assert_str_eq(text, "madeupword0000 3\nq 2\nmadeupword0001 0\nmadeupword0002 0\n");
    free(text);
    luna_dictionary_free(d);
}
END_TEST

START_TEST(save_load_roundtrip_and_compare) {
    char *dir = luna_test_make_temp_dir();
    char *path = luna_path_join(dir, "dict.en.txt");
    luna_dictionary *d = from_text("x 3\ny 2\n"), *e = NULL;
    ck_assert_int_eq(luna_dictionary_save(d, path), LUNA_OK);
    ck_assert_int_eq(luna_dictionary_load(&e, path), LUNA_OK);
    int32_t diff = -1;
    ck_assert(luna_dictionary_same_symbols(d, e, &diff));
    luna_dictionary_free(e);
    e = from_text("x 3\nz 2\n");
    ck_assert(!luna_dictionary_same_symbols(d, e, &diff));
    ck_assert_int_eq(diff, 5);
    luna_dictionary_free(e);
    e = from_text("x 3\ny 2\nw 1\n");
    ck_assert(!luna_dictionary_same_symbols(d, e, &diff));
    ck_assert_int_eq(diff, 6);
    luna_dictionary_free(e);
    luna_dictionary_free(d);
    /* A broken file is reported with its path and line. */
    luna_test_write_file(path, "x 3\ny\n");
    ck_assert_int_eq(luna_dictionary_load(&e, path), LUNA_ERR_FORMAT);
    char where[512];
    snprintf(where, sizeof where, "%s:2:", path);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), where));
    free(path);
    luna_test_remove_tree(dir);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("data_dictionary");
    TCase *tc = tcase_create("dictionary");
    tcase_add_test(tc, specials_and_unknown);
    tcase_add_test(tc, many_symbols_hash_table);
    tcase_add_test(tc, overwrite_flag_and_errors);
    tcase_add_test(tc, finalize_like_fairseq);
    tcase_add_test(tc, save_load_roundtrip_and_compare);
    suite_add_tcase(s, tc);
    return luna_test_run(s);
}
