/* A command-line options registry (Marian's single options registry, with fairseq's flag names):
 * one table of {name, type, default, group, meta, choices, offset, help} per program drives
 * parsing into any struct (each value lives at base + offset), --help grouped by `group`, the
 * printed effective configuration and its JSON form. What is particular to a program (ranges,
 * options that exclude each other, defaults derived from other options) stays with the program,
 * on top of luna_options_parse().
 *
 * Command-line syntax:
 *   --name VALUE or --name=VALUE;  FLAG options take no value;
 *   LIST and WORDS options take the following words up to the next word starting with "--";
 *   --help/-h or --version anywhere: nothing else is parsed or checked;
 *   at most one positional argument (the table's `positional`), anywhere; "-" counts as one.
 * A repeated option takes its last value. Errors are LUNA_ERR_INVALID_ARGUMENT with one line
 * naming the option, e.g. "unknown option '--foo' (see --help)", "option '--lr' needs a value",
 * "--lr: 'abc' is not a finite number", "--clip-mode: 'x' is not one of each|total".
 */
#ifndef LUNA_TRAINER_OPTIONS_REGISTRY_H
#define LUNA_TRAINER_OPTIONS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/json.h"
#include "core/status.h"

typedef enum {
    LUNA_OPT_STRING, /* const char * (points into argv or at the default) */
    LUNA_OPT_INT,    /* int64_t */
    LUNA_OPT_DOUBLE, /* double, finite */
    LUNA_OPT_FLAG,   /* bool, takes no value */
    LUNA_OPT_CHOICE, /* const char *, one of `choices` ("a|b|c") */
    LUNA_OPT_LIST,   /* const char *: one or more following words, joined by spaces */
    LUNA_OPT_WORDS,  /* luna_option_words: one or more following words, as they are in argv */
} luna_opt_type;

typedef struct {
    const char *name; /* "--lr" */
    luna_opt_type type;
    const char *def;     /* default as text; NULL: none (zero, NULL, false, no words) */
    const char *group;   /* --help heading; options of one group are adjacent in the table */
    const char *meta;    /* value placeholder in --help ("N", "LR", ...); CHOICE shows choices */
    const char *choices; /* CHOICE: "apollo|adam" */
    size_t offset;       /* of the value in the program's options struct */
    const char *help;    /* may contain '\n' (continuation lines are indented in --help) */
} luna_option_spec;

/* LUNA_OPT_WORDS value: words[0..count) point into argv (no copy; argv must outlive it). */
typedef struct {
    char **words;
    int count;
} luna_option_words;

typedef struct {
    const char *alias, *name; /* {"--batch-size", "--max-sentences"} */
} luna_option_alias;

typedef struct {
    const luna_option_spec *specs;
    int count; /* at most LUNA_OPTIONS_MAX */
    const luna_option_alias *aliases;
    int num_aliases;
    /* The one positional argument: its name in messages ("DATA-BIN") and the offset of its
     * const char * in the struct; NULL name: the program takes none. */
    const char *positional;
    size_t positional_offset;
    /* A char array in the struct that holds LIST values (words joined by spaces); size 0: the
     * table has no LIST option with a command-line value. */
    size_t list_buffer_offset, list_buffer_size;
    int help_width; /* width of the option column in --help; 0: fit the longest option, at most
                       32 (a longer option puts its description on the next line) */
} luna_option_table;

#define LUNA_OPTIONS_MAX 128

typedef enum {
    LUNA_OPTIONS_RUN,     /* options parsed: go on */
    LUNA_OPTIONS_HELP,    /* --help or -h was given */
    LUNA_OPTIONS_VERSION, /* --version was given */
} luna_options_action;

/* Every option of the table to its default (no default: 0, NULL, false, no words). */
luna_status luna_options_set_defaults(const luna_option_table *t, void *base);

/* Set defaults, then parse argv (argv[0] is the program) into `base`. `given` (NULL or
 * t->count entries) tells which options appeared on the command line. *action says whether
 * --help/--version asked for something else instead (then nothing else is parsed). Values point
 * into argv, which must outlive `base`. */
luna_status luna_options_parse(const luna_option_table *t, void *base, int argc, char **argv,
                               bool *given, luna_options_action *action);

/* The front end every program shares: parse argv into `base` (as luna_options_parse); on an
 * error print "PROG: message" to stderr and return 2; on --help print `usage` (the usage lines
 * and a description) and the option list to stdout and return 0; on --version print
 * "PROG (luna) VERSION" and return 0. Returns -1 when the program should go on. */
int luna_options_parse_program(const luna_option_table *t, void *base, int argc, char **argv,
                               bool *given, const char *prog, const char *usage);

/* A usage error of a program's own checks: prints "PROG: <formatted message> (see PROG --help)"
 * to stderr and returns 2 (the usage-error exit status). */
int luna_options_usage_error(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Index of the option called `name` (an alias names its option), or -1. */
int luna_options_find(const luna_option_table *t, const char *name);

/* The option list of --help, one group after another ("\ngroup:\n  --name META  help (default:
 * X)"), ending with the group "other" (--help, --version). Two columns: the descriptions start
 * in one column (on the next line for an option wider than its column) and are wrapped at 100
 * characters a line; '\n' in a help text starts a new line. The caller prints the usage first. */
void luna_options_print_help(const luna_option_table *t, FILE *f);

/* The effective values, one line per group ("\ngroup: --name value --flag ..."; flags that are
 * off and strings without a value are left out; so is a group with nothing left), then a newline.
 */
void luna_options_print_config(const luna_option_table *t, const void *base, FILE *f);

/* The same for the options with shown[i] (t->count entries; NULL: all); a group with nothing to
 * show is left out. */
void luna_options_print_config_shown(const luna_option_table *t, const void *base,
                                     const bool *shown, FILE *f);

/* One JSON key per option (flag name without "--", '-' -> '_') with its value, written into the
 * object that `w` has open. */
void luna_options_write_json(const luna_option_table *t, const void *base, luna_json_writer *w);

#endif
