/* The options registry (core/options_registry.h) on a small table of every type: defaults,
 * parsing of each type (both --name VALUE and --name=VALUE), aliases, the positional argument,
 * every usage error (one line naming the option), --help listing every option by group, the
 * printed configuration and its JSON; and luna-train's real table (defaults valid, all in --help).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "tests/test_util.h"
#include "trainer/options.h"
#include "core/options_registry.h"

typedef struct {
    const char *input; /* the positional argument */
    const char *name, *mode, *list;
    int64_t count;
    double rate;
    bool verbose;
    luna_option_words files;
    char list_buf[32];
} test_options;

#define F(field) offsetof(test_options, field)

/* clang-format off */
static const luna_option_spec SPECS[] = {
    {"--name", LUNA_OPT_STRING, "anon", "general", "NAME", NULL, F(name), "a name"},
    {"--count", LUNA_OPT_INT, "3", "general", "N", NULL, F(count), "how many"},
    {"--rate", LUNA_OPT_DOUBLE, "0.5", "numbers", "R", NULL, F(rate), "a rate\nsecond line of help"},
    {"--verbose", LUNA_OPT_FLAG, NULL, "numbers", NULL, NULL, F(verbose), "talk more"},
    {"--mode", LUNA_OPT_CHOICE, "fast", "numbers", "M", "fast|slow", F(mode), "how to go"},
    {"--list", LUNA_OPT_LIST, NULL, "lists", "K...", NULL, F(list), "some numbers"},
    {"--files", LUNA_OPT_WORDS, NULL, "lists", "FILE...", NULL, F(files), "some files"},
};
/* clang-format on */
enum { NAME, COUNT, RATE, VERBOSE, MODE, LIST, FILES, NUM_SPECS };
static const luna_option_alias ALIASES[] = {{"--number", "--count"}};

static const luna_option_table TABLE = {
    .specs = SPECS,
    .count = NUM_SPECS,
    .aliases = ALIASES,
    .num_aliases = 1,
    .positional = "INPUT",
    .positional_offset = F(input),
    .list_buffer_offset = F(list_buf),
    .list_buffer_size = sizeof(((test_options *)0)->list_buf),
};

static test_options opt;
static bool given[NUM_SPECS];
static luna_options_action action;

#define ARGV(...) ((char *[]){"prog", __VA_ARGS__, NULL})
#define ARGC(argv) ((int)(sizeof(argv) / sizeof((argv)[0])) - 1)
/* Parse a command line (string literals; the registry does not write into argv). The argv
 * array lives only in the enclosing block: use a named array where WORDS values are read. */
#define PARSE(...) parse(ARGC(ARGV(__VA_ARGS__)), ARGV(__VA_ARGS__))

static luna_status parse(int argc, char **argv) {
    memset(&opt, 0xA5, sizeof opt); /* garbage: the parser must set every field */
    memset(given, 1, sizeof given);
    return luna_options_parse(&TABLE, &opt, argc, argv, given, &action);
}

/* A usage error: LUNA_ERR_INVALID_ARGUMENT and exactly `message`. */
static void expect_error(luna_status st, const char *message) {
    ck_assert_int_eq(st, LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_str_eq(luna_error_message(), message);
}

START_TEST(defaults_without_arguments) {
    char *argv[] = {"prog", NULL};
    ck_assert_int_eq(parse(1, argv), LUNA_OK);
    ck_assert_int_eq(action, LUNA_OPTIONS_RUN);
    ck_assert_ptr_null(opt.input);
    ck_assert_str_eq(opt.name, "anon");
    ck_assert_int_eq(opt.count, 3);
    ck_assert(opt.rate == 0.5);
    ck_assert(!opt.verbose);
    ck_assert_str_eq(opt.mode, "fast");
    ck_assert_ptr_null(opt.list);
    ck_assert_int_eq(opt.files.count, 0);
    ck_assert_ptr_null(opt.files.words);
    for (int i = 0; i < NUM_SPECS; i++)
        ck_assert_msg(!given[i], "%s marked as given", SPECS[i].name);
}
END_TEST

START_TEST(every_type_parses) {
    char *argv[] = {"prog",   "in.txt", "--name",    "bob",    "--count", "-42",
                    "--rate", "2.5e-3", "--verbose", "--mode", "slow",    "--list",
                    "300",    "450",    "--files",   "a b",    "c",       NULL};
    ck_assert_int_eq(parse(ARGC(argv), argv), LUNA_OK);
    ck_assert_int_eq(action, LUNA_OPTIONS_RUN);
    ck_assert_str_eq(opt.input, "in.txt");
    ck_assert_str_eq(opt.name, "bob");
    ck_assert_int_eq(opt.count, -42);
    ck_assert(opt.rate == 2.5e-3);
    ck_assert(opt.verbose);
    ck_assert_str_eq(opt.mode, "slow");
    ck_assert_str_eq(opt.list, "300 450");
    ck_assert_int_eq(opt.files.count, 2);
    ck_assert_ptr_eq(opt.files.words, argv + 15); /* no copy: the words of argv */
    ck_assert_str_eq(opt.files.words[0], "a b");
    ck_assert_str_eq(opt.files.words[1], "c");
    for (int i = 0; i < NUM_SPECS; i++)
        ck_assert_msg(given[i], "%s not marked as given", SPECS[i].name);
}
END_TEST

START_TEST(equals_form_alias_and_repeats) {
    ck_assert_int_eq(PARSE("--count=7", "--rate=1", "--mode=slow", "--list=1 2", "--name="),
                     LUNA_OK);
    ck_assert_int_eq(opt.count, 7);
    ck_assert(opt.rate == 1.0);
    ck_assert_str_eq(opt.mode, "slow");
    ck_assert_str_eq(opt.list, "1 2");
    ck_assert_str_eq(opt.name, "");
    ck_assert(!given[VERBOSE] && given[COUNT] && given[LIST]);
    /* an alias sets its option; a repeated option keeps the last value */
    ck_assert_int_eq(PARSE("--number", "9", "--list", "1", "2", "--list", "3", "--count", "10"),
                     LUNA_OK);
    ck_assert_int_eq(opt.count, 10);
    ck_assert(given[COUNT]);
    ck_assert_str_eq(opt.list, "3");
    ck_assert_int_eq(luna_options_find(&TABLE, "--number"), COUNT);
    ck_assert_int_eq(luna_options_find(&TABLE, "--files"), FILES);
    ck_assert_int_eq(luna_options_find(&TABLE, "--nope"), -1);
    /* values that look like options are taken by options that need one; "-" is positional */
    ck_assert_int_eq(PARSE("--name", "--verbose", "-", "--count", "-1"), LUNA_OK);
    ck_assert_str_eq(opt.name, "--verbose");
    ck_assert(!opt.verbose);
    ck_assert_str_eq(opt.input, "-");
    ck_assert_int_eq(opt.count, -1);
}
END_TEST

START_TEST(help_and_version_win) {
    ck_assert_int_eq(PARSE("--count", "x", "--bogus", "--help"), LUNA_OK);
    ck_assert_int_eq(action, LUNA_OPTIONS_HELP);
    ck_assert_int_eq(PARSE("-h"), LUNA_OK);
    ck_assert_int_eq(action, LUNA_OPTIONS_HELP);
    ck_assert_int_eq(PARSE("a", "b", "--version"), LUNA_OK);
    ck_assert_int_eq(action, LUNA_OPTIONS_VERSION);
}
END_TEST

START_TEST(unknown_options_and_arguments) {
    expect_error(PARSE("--bogus"), "unknown option '--bogus' (see --help)");
    expect_error(PARSE("--bogus=1"), "unknown option '--bogus' (see --help)");
    expect_error(PARSE("--coun", "1"), "unknown option '--coun' (see --help)");
    expect_error(PARSE("-x"), "unknown option '-x' (see --help)");
    expect_error(PARSE("--"), "unknown option '--' (see --help)");
    expect_error(PARSE("a", "b"), "unexpected argument 'b' (INPUT is already 'a'; see --help)");
    luna_option_table no_positional = TABLE;
    no_positional.positional = NULL;
    char *argv[] = {"prog", "a", NULL};
    expect_error(luna_options_parse(&no_positional, &opt, 2, argv, NULL, &action),
                 "unexpected argument 'a' (see --help)");
}
END_TEST

START_TEST(missing_and_unwanted_values) {
    expect_error(PARSE("--count"), "option '--count' needs a value");
    expect_error(PARSE("--name"), "option '--name' needs a value");
    expect_error(PARSE("--list", "--verbose"), "option '--list' needs a value");
    expect_error(PARSE("--files"), "option '--files' needs a value");
    expect_error(PARSE("--verbose=yes"), "option '--verbose' takes no value");
    expect_error(PARSE("--files=a"),
                 "option '--files' takes its values as separate words (--files A B ...)");
    /* LIST values live in the table's buffer (32 bytes here) */
    expect_error(PARSE("--list", "1234567890", "1234567890", "1234567890", "1"),
                 "option '--list': too many values (at most 31 characters)");
    ck_assert_int_eq(PARSE("--list", "1234567890", "1234567890", "123456789"), LUNA_OK);
    ck_assert_str_eq(opt.list, "1234567890 1234567890 123456789");
}
END_TEST

START_TEST(bad_numbers_and_choices) {
    expect_error(PARSE("--count", "two"), "--count: 'two' is not an integer");
    expect_error(PARSE("--count", "3x"), "--count: '3x' is not an integer");
    expect_error(PARSE("--count", "1.5"), "--count: '1.5' is not an integer");
    expect_error(PARSE("--count="), "--count: '' is not an integer");
    expect_error(PARSE("--number", "x"), "--count: 'x' is not an integer");
    expect_error(PARSE("--rate", "abc"), "--rate: 'abc' is not a finite number");
    expect_error(PARSE("--rate", "nan"), "--rate: 'nan' is not a finite number");
    expect_error(PARSE("--rate", "inf"), "--rate: 'inf' is not a finite number");
    expect_error(PARSE("--rate", "1e999"), "--rate: '1e999' is not a finite number");
    expect_error(PARSE("--mode", "medium"), "--mode: 'medium' is not one of fast|slow");
    expect_error(PARSE("--mode", "fas"), "--mode: 'fas' is not one of fast|slow");
    expect_error(PARSE("--mode", ""), "--mode: '' is not one of fast|slow");
}
END_TEST

/* The text a print function writes. */
static char *capture(void (*print)(FILE *, const void *), const void *arg) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    ck_assert_ptr_nonnull(f);
    print(f, arg);
    ck_assert_int_eq(fclose(f), 0);
    return text;
}

static void print_help(FILE *f, const void *table) { luna_options_print_help(table, f); }
static void print_config(FILE *f, const void *o) { luna_options_print_config(&TABLE, o, f); }

START_TEST(help_lists_every_option_by_group) {
    char *help = capture(print_help, &TABLE);
    const char *expected[] = {
        "\ngeneral:\n",
        "  --name NAME       a name (default: anon)\n",
        "  --count N         how many (default: 3)\n",
        "\nnumbers:\n",
        "  --rate R          a rate\n                    second line of help (default: 0.5)\n",
        "  --verbose         talk more\n",
        "  --mode fast|slow  how to go (default: fast)\n",
        "\nlists:\n",
        "  --list K...       some numbers\n",
        "  --files FILE...   some files\n",
        "\nother:\n",
        "  --help            show this help\n",
        "  --version         show the version\n",
    };
    /* every line, in this order */
    const char *at = help;
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const char *p = strstr(at, expected[i]);
        ck_assert_msg(p, "'%s' not (in order) in:\n%s", expected[i], help);
        at = p + strlen(expected[i]);
    }
    ck_assert_str_eq(at, "");
    free(help);
    /* a fixed width */
    luna_option_table wide = TABLE;
    wide.help_width = 24;
    help = capture(print_help, &wide);
    ck_assert_ptr_nonnull(strstr(help, "\n  --count N                how many (default: 3)\n"));
    free(help);
}
END_TEST

START_TEST(configuration_and_json) {
    /* argv outlives opt (WORDS point into it) */
    char *argv[] = {"prog", "in", "--verbose", "--list", "1", "2", "--files", "x", "y", NULL};
    ck_assert_int_eq(parse(ARGC(argv), argv), LUNA_OK);
    char *text = capture(print_config, &opt);
    ck_assert_str_eq(text, "\ngeneral: --name anon --count 3\nnumbers: --rate 0.5 --verbose "
                           "--mode fast\nlists: --list 1 2 --files x y\n");
    free(text);
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_options_write_json(&TABLE, &opt, &w);
    luna_json_end_object(&w);
    char *json;
    ck_assert_int_eq(luna_json_writer_finish(&w, &json, NULL), LUNA_OK);
    luna_json *j;
    ck_assert_msg(luna_json_parse(&j, json, strlen(json), NULL) == LUNA_OK, "%s", json);
    ck_assert_uint_eq(j->length, NUM_SPECS);
    ck_assert_str_eq(luna_json_get(j, "name")->string, "anon");
    ck_assert_int_eq(luna_json_get(j, "count")->uint_value, 3);
    ck_assert(luna_json_get(j, "rate")->number == 0.5);
    ck_assert(luna_json_get(j, "verbose")->boolean);
    ck_assert_str_eq(luna_json_get(j, "mode")->string, "fast");
    ck_assert_str_eq(luna_json_get(j, "list")->string, "1 2");
    const luna_json *files = luna_json_get(j, "files");
    ck_assert_int_eq(files->type, LUNA_JSON_ARRAY);
    ck_assert_uint_eq(files->length, 2);
    ck_assert_str_eq(files->items[1].string, "y");
    luna_json_free(j);
    free(json);
}
END_TEST

START_TEST(bad_default_is_reported) {
    luna_option_spec bad[] = {{"--n", LUNA_OPT_INT, "ten", "g", "N", NULL, F(count), "n"}};
    luna_option_table t = {.specs = bad, .count = 1};
    ck_assert_int_eq(luna_options_set_defaults(&t, &opt), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "default of --n"));
}
END_TEST

/* luna-train's table: its defaults are valid and --help shows every option. */
START_TEST(train_table) {
    const luna_option_table *t = luna_train_option_table();
    int count;
    const luna_option_spec *specs = luna_train_option_specs(&count);
    ck_assert_ptr_eq(specs, t->specs);
    ck_assert_int_eq(count, t->count);
    static luna_train_options o;
    ck_assert_int_eq(luna_options_set_defaults(t, &o), LUNA_OK);
    char *help = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&help, &size);
    ck_assert_ptr_nonnull(f);
    luna_train_options_print_help(f, "luna-train");
    ck_assert_int_eq(fclose(f), 0);
    for (int i = 0; i < count; i++) {
        char needle[128];
        snprintf(needle, sizeof needle, "\n  %s ", specs[i].name);
        ck_assert_msg(strstr(help, needle), "%s not in --help", specs[i].name);
        snprintf(needle, sizeof needle, "\n%s:\n", specs[i].group);
        ck_assert_msg(strstr(help, needle), "group %s not in --help", specs[i].group);
    }
    free(help);
    /* the alias and LIST values go through the registry */
    char *argv[] = {"luna-train",   "bin",  "--batch-size", "16",
                    "--milestones", "3000", "4000",         NULL};
    ck_assert_int_eq(luna_train_options_parse(&o, 7, argv), LUNA_OK);
    ck_assert_int_eq(o.max_sentences, 16);
    ck_assert_str_eq(o.milestones, "3000 4000");
    ck_assert_str_eq(o.data_bin, "bin");
}
END_TEST

/* The printed configuration of `argv` (luna-train's start of train.log). */
static char *train_config(int argc, char **argv) {
    static luna_train_options o;
    ck_assert_msg(luna_train_options_parse(&o, argc, argv) == LUNA_OK, "%s", luna_error_message());
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    ck_assert_ptr_nonnull(f);
    luna_train_options_print(&o, f);
    ck_assert_int_eq(fclose(f), 0);
    return text;
}

static void expect_options(const char *text, const char *const *present,
                           const char *const *absent) {
    for (; present && *present; present++) {
        char needle[128];
        snprintf(needle, sizeof needle, " %s ", *present);
        ck_assert_msg(strstr(text, needle), "'%s' missing from:\n%s", *present, text);
    }
    for (; absent && *absent; absent++)
        ck_assert_msg(!strstr(text, *absent), "'%s' does not apply but is in:\n%s", *absent, text);
}

/* train.log's options: only those of the chosen optimizer, scheduler, clipping and architecture. */
START_TEST(train_log_shows_options_that_apply) {
    char *apollo[] = {"luna-train", "bin", NULL}; /* Apollo, milestone, no clipping, Luna */
    char *text = train_config(2, apollo);
    expect_options(text,
                   (const char *const[]){"--optimizer", "--apollo-beta", "--apollo-eps",
                                         "--rebound", "--weight-decay-type", "--weight-decay",
                                         "--milestones", "--lr-decay-rate", "--warmup-init-lr",
                                         "--projection-length", "--causal-activation", NULL},
                   (const char *const[]){"--adam-betas", "--adam-eps", "--clip-mode", NULL});
    ck_assert_ptr_nonnull(strstr(text, "data-bin: bin\nmodel: --arch luna_base_tied"));
    free(text);
    char *adam[] = {"luna-train",
                    "bin",
                    "--optimizer",
                    "adam",
                    "--lr-scheduler",
                    "inverse_sqrt",
                    "--clip-norm",
                    "0.1",
                    "--arch",
                    "transformer_tiny",
                    NULL};
    text = train_config(10, adam);
    expect_options(
        text,
        (const char *const[]){"--adam-betas", "--adam-eps", "--weight-decay", "--warmup-updates",
                              "--warmup-init-lr", "--clip-norm", "--clip-mode", NULL},
        (const char *const[]){"--apollo", "--rebound", "--weight-decay-type", "--milestones",
                              "--lr-decay-rate", "--projection-length", "--causal-activation",
                              "--untie-luna-kv", "--fix-projection-length",
                              "--non-contextual-projection", NULL});
    free(text);
    char *fixed[] = {"luna-train", "bin", "--lr-scheduler", "fixed", NULL};
    text = train_config(4, fixed);
    expect_options(text, (const char *const[]){"--lr", "--warmup-updates", NULL},
                   (const char *const[]){"--warmup-init-lr", "--milestones", NULL});
    free(text);
    /* the checkpoint's JSON keeps every option */
    static luna_train_options o;
    ck_assert_int_eq(luna_train_options_parse(&o, 10, adam), LUNA_OK);
    char *json;
    ck_assert_int_eq(luna_train_options_to_json(&o, &json), LUNA_OK);
    ck_assert_ptr_nonnull(strstr(json, "\"apollo_beta\""));
    free(json);
}
END_TEST

/* The --help layout: no line over 100 characters; every description starts in one column C (on
 * the option's line, after at least two spaces that the option and its META do not contain, or on
 * the next line when the option is too long for its column), and continuation lines start at C.
 * `text` is a whole --help output: the lines after the first group heading are checked. */
static void check_help_layout(const char *what, const char *text) {
    int col = -1, lineno = 0;
    bool in_options = false;
    for (const char *line = text; *line; lineno++) {
        const char *nl = strchr(line, '\n');
        const int len = nl ? (int)(nl - line) : (int)strlen(line);
        ck_assert_msg(len <= 100, "%s: line %d has %d characters: %.*s", what, lineno + 1, len, len,
                      line);
        if (len > 0 && line[0] != ' ' && line[len - 1] == ':') in_options = true; /* a heading */
        if (in_options && len > 0 && line[0] == ' ') {
            ck_assert_msg(line[len - 1] != ' ', "%s: trailing space: %.*s", what, len, line);
            const bool option = len > 3 && line[0] == ' ' && line[1] == ' ' && line[2] == '-';
            if (option) {
                const char *gap = strstr(line + 2, "  "); /* the end of "--name META" */
                if (gap && gap < line + len) { /* else a long option: its description follows */
                    int c = (int)(gap - line);
                    while (c < len && line[c] == ' ')
                        c++;
                    if (col < 0) col = c;
                    ck_assert_msg(c == col, "%s: description at column %d, not %d: %.*s", what,
                                  c + 1, col + 1, len, line);
                }
            } else {
                int c = 0;
                while (c < len && line[c] == ' ')
                    c++;
                if (col < 0) col = c;
                ck_assert_msg(c == col, "%s: continuation at column %d, not %d: %.*s", what, c + 1,
                              col + 1, len, line);
            }
        }
        line += len + (nl != NULL);
    }
    ck_assert_msg(in_options && col > 0, "%s: no option list in:\n%s", what, text);
}

/* Long options, a long description with a long word, a default that wraps, '\n'. */
START_TEST(help_wraps_at_100_in_one_column) {
    static const char long_help[] =
        "a description long enough to need three lines of help: lorem ipsum dolor sit amet, "
        "consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna "
        "aliqua, with a word that is longer than a whole line: "
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "\nand a forced second paragraph";
    const luna_option_spec specs[] = {
        {"--short", LUNA_OPT_INT, "12345", "g", "N", NULL, F(count), long_help},
        {"--a-very-long-option-name-indeed", LUNA_OPT_CHOICE, "first", "g", NULL,
         "first|second|third", F(mode), "the description goes on the next line"},
        {"--flag", LUNA_OPT_FLAG, NULL, "g", NULL, NULL, F(verbose), ""},
    };
    luna_option_table t = {.specs = specs, .count = 3};
    char *help = capture(print_help, &t);
    check_help_layout("constructed table", help);
    /* the option column stops at 32 characters: the long option's description is below it */
    ck_assert_ptr_nonnull(strstr(help, "  --a-very-long-option-name-indeed first|second|third\n"
                                       "                                   the description"));
    ck_assert_ptr_nonnull(strstr(help, "(default: 12345)"));
    ck_assert_ptr_nonnull(strstr(help, "\n                                   and a forced second"));
    ck_assert_ptr_nonnull(strstr(help, "\n  --flag\n"));
    free(help);
    /* a fixed column: an option as wide as it gets its description on the next line */
    t.help_width = 7;
    help = capture(print_help, &t);
    check_help_layout("fixed width 7", help);
    ck_assert_ptr_nonnull(strstr(help, "  --short N\n          a description"));
    free(help);
}
END_TEST

/* Every program's --help. */
START_TEST(programs_help_layout) {
    const char *programs[] = {"luna-train", "luna-translate", "luna-preprocess", "luna-average"};
    for (size_t i = 0; i < sizeof programs / sizeof programs[0]; i++) {
        char path[4096];
        luna_test_find_program(path, sizeof path, programs[i], NULL);
        luna_test_result r = luna_test_exec(path, (const char *const[]){"--help", NULL}, NULL);
        ck_assert_msg(r.status == 0, "%s --help: status %d", programs[i], r.status);
        ck_assert_msg(strlen(r.out) < sizeof r.out - 1, "%s --help: output cut", programs[i]);
        check_help_layout(programs[i], r.out);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("options_registry");
    TCase *tc = tcase_create("registry");
    tcase_add_test(tc, defaults_without_arguments);
    tcase_add_test(tc, every_type_parses);
    tcase_add_test(tc, equals_form_alias_and_repeats);
    tcase_add_test(tc, help_and_version_win);
    tcase_add_test(tc, unknown_options_and_arguments);
    tcase_add_test(tc, missing_and_unwanted_values);
    tcase_add_test(tc, bad_numbers_and_choices);
    tcase_add_test(tc, help_lists_every_option_by_group);
    tcase_add_test(tc, configuration_and_json);
    tcase_add_test(tc, bad_default_is_reported);
    tcase_add_test(tc, train_table);
    tcase_add_test(tc, train_log_shows_options_that_apply);
    tcase_add_test(tc, help_wraps_at_100_in_one_column);
    tcase_add_test(tc, programs_help_layout);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
