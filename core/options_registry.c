/* The table-driven options registry (see options_registry.h). */
#include "core/options_registry.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void *field(void *base, const luna_option_spec *s) { return (char *)base + s->offset; }
static const void *cfield(const void *base, const luna_option_spec *s) {
    return (const char *)base + s->offset;
}

static bool in_choices(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* A value given as text (command line or default) into its field. */
static luna_status set_value(void *base, const luna_option_spec *s, const char *v) {
    char *end = NULL;
    switch (s->type) {
    case LUNA_OPT_STRING:
    case LUNA_OPT_LIST: *(const char **)field(base, s) = v; break;
    case LUNA_OPT_FLAG: *(bool *)field(base, s) = true; break;
    case LUNA_OPT_WORDS:
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "option '%s' takes its values as separate words (%s A B ...)", s->name,
                          s->name);
    case LUNA_OPT_CHOICE:
        if (!s->choices || !in_choices(s->choices, v))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: '%s' is not one of %s", s->name, v,
                              s->choices ? s->choices : "(none)");
        *(const char **)field(base, s) = v;
        break;
    case LUNA_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: '%s' is not an integer", s->name, v);
        if (errno == ERANGE) /* strtoll saturates: 99999999999999999999 is not INT64_MAX */
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "%s: '%s' is out of range (at most %lld, at least %lld)", s->name, v,
                              (long long)INT64_MAX, (long long)INT64_MIN);
        *(int64_t *)field(base, s) = x;
        break;
    }
    case LUNA_OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || !isfinite(x))
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: '%s' is not a finite number", s->name,
                              v);
        *(double *)field(base, s) = x;
        break;
    }
    }
    return LUNA_OK;
}

luna_status luna_options_set_defaults(const luna_option_table *t, void *base) {
    for (int i = 0; i < t->count; i++) {
        const luna_option_spec *s = &t->specs[i];
        switch (s->type) {
        case LUNA_OPT_INT: *(int64_t *)field(base, s) = 0; break;
        case LUNA_OPT_DOUBLE: *(double *)field(base, s) = 0.0; break;
        case LUNA_OPT_FLAG: *(bool *)field(base, s) = false; break;
        case LUNA_OPT_WORDS:
            *(luna_option_words *)field(base, s) = (luna_option_words){NULL, 0};
            break;
        default: *(const char **)field(base, s) = NULL; break;
        }
        if (s->def && s->type != LUNA_OPT_FLAG && s->type != LUNA_OPT_WORDS) {
            luna_status st = set_value(base, s, s->def);
            if (st != LUNA_OK) {
                luna_error_prefix("default of %s", s->name);
                return st;
            }
        }
    }
    return LUNA_OK;
}

static int find_option(const luna_option_table *t, const char *name, size_t len) {
    for (int a = 0; a < t->num_aliases; a++)
        if (strlen(t->aliases[a].alias) == len && strncmp(t->aliases[a].alias, name, len) == 0) {
            name = t->aliases[a].name;
            len = strlen(name);
            break;
        }
    for (int i = 0; i < t->count; i++)
        if (strlen(t->specs[i].name) == len && strncmp(t->specs[i].name, name, len) == 0) return i;
    return -1;
}

int luna_options_find(const luna_option_table *t, const char *name) {
    return find_option(t, name, strlen(name));
}

static bool is_option_word(const char *arg) { return strncmp(arg, "--", 2) == 0; }

luna_status luna_options_parse(const luna_option_table *t, void *base, int argc, char **argv,
                               bool *given, luna_options_action *action) {
    *action = LUNA_OPTIONS_RUN;
    if (t->count > LUNA_OPTIONS_MAX)
        return luna_error(LUNA_ERR_INTERNAL, "options table has %d entries (at most %d)", t->count,
                          LUNA_OPTIONS_MAX);
    if (given) memset(given, 0, sizeof *given * (size_t)t->count);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return *action = LUNA_OPTIONS_HELP, LUNA_OK;
        if (!strcmp(argv[i], "--version")) return *action = LUNA_OPTIONS_VERSION, LUNA_OK;
    }
    LUNA_TRY(luna_options_set_defaults(t, base));
    const char **positional =
        t->positional ? (const char **)((char *)base + t->positional_offset) : NULL;
    if (positional) *positional = NULL;
    size_t list_used = 0; /* bytes of the LIST buffer taken by earlier LIST values */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!is_option_word(arg)) {
            if (arg[0] == '-' && arg[1])
                return luna_error(LUNA_ERR_INVALID_ARGUMENT, "unknown option '%s' (see --help)",
                                  arg);
            if (!positional)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "unexpected argument '%s' (see --help)", arg);
            if (*positional)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "unexpected argument '%s' (%s is already '%s'; see --help)", arg,
                                  t->positional, *positional);
            *positional = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        int k = find_option(t, arg, len);
        if (k < 0)
            return luna_error(LUNA_ERR_INVALID_ARGUMENT, "unknown option '%.*s' (see --help)",
                              (int)len, arg);
        const luna_option_spec *s = &t->specs[k];
        if (given) given[k] = true;
        if (s->type == LUNA_OPT_FLAG) {
            if (eq)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT, "option '%s' takes no value", s->name);
            *(bool *)field(base, s) = true;
            continue;
        }
        if (s->type == LUNA_OPT_WORDS && !eq) {
            int n = 0;
            while (i + 1 + n < argc && !is_option_word(argv[i + 1 + n]))
                n++;
            if (n == 0)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT, "option '%s' needs a value", s->name);
            *(luna_option_words *)field(base, s) = (luna_option_words){argv + i + 1, n};
            i += n;
            continue;
        }
        if (s->type == LUNA_OPT_LIST && !eq) {
            /* The following words up to the next option, joined with spaces. */
            char *buf = (char *)base + t->list_buffer_offset + list_used;
            size_t cap = t->list_buffer_size - list_used, n = 0;
            for (; i + 1 < argc && !is_option_word(argv[i + 1]); i++) {
                size_t w = strlen(argv[i + 1]);
                if (n + (n > 0) + w + 1 > cap)
                    return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                      "option '%s': too many values (at most %zu characters)",
                                      s->name, t->list_buffer_size ? t->list_buffer_size - 1 : 0);
                if (n > 0) buf[n++] = ' ';
                memcpy(buf + n, argv[i + 1], w + 1);
                n += w;
            }
            if (n == 0)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT, "option '%s' needs a value", s->name);
            *(const char **)field(base, s) = buf;
            list_used += n + 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "option '%s' needs a value", s->name);
        LUNA_TRY(set_value(base, s, v));
    }
    return LUNA_OK;
}

/* "--name META" as --help shows it. */
static void option_usage(const luna_option_spec *s, char *out, size_t size) {
    const char *meta = s->type == LUNA_OPT_CHOICE ? s->choices : s->meta;
    if (s->type == LUNA_OPT_FLAG) meta = NULL;
    snprintf(out, size, "%s%s%s", s->name, meta ? " " : "", meta ? meta : "");
}

/* --help's layout: "  OPTION META" padded to the option column, one space, then the description
 * wrapped at LUNA_HELP_LINE_WIDTH; an option too long for its column (it would touch the
 * description) puts the description on the next line, at the description column, so the
 * descriptions stay in one column. '\n' in a description starts a new line. */
#define LUNA_HELP_LINE_WIDTH 100
#define LUNA_HELP_MAX_WIDTH 32 /* the widest automatic option column */

#define NBSP '\x01' /* a space that does not break the line: "(default: X)" stays together */

typedef struct {
    FILE *f;
    int col;  /* the description column */
    int used; /* characters on the current line after the column */
} help_writer;

static void help_newline(help_writer *w) {
    fprintf(w->f, "\n%*s", w->col, "");
    w->used = 0;
}

/* One word of n characters (no spaces): on this line when it fits, else on the next; a word
 * longer than a whole line is cut. */
static void help_word(help_writer *w, const char *word, int n) {
    const int avail = LUNA_HELP_LINE_WIDTH - w->col;
    if (w->used > 0 && w->used + 1 + n > avail) help_newline(w);
    if (w->used > 0) fputc(' ', w->f), w->used++;
    while (n > avail - w->used) {
        const int part = avail - w->used;
        for (int i = 0; i < part; i++)
            fputc(word[i] == NBSP ? ' ' : word[i], w->f);
        word += part, n -= part;
        help_newline(w);
    }
    for (int i = 0; i < n; i++)
        fputc(word[i] == NBSP ? ' ' : word[i], w->f);
    w->used += n;
}

static void help_text(help_writer *w, const char *text) {
    for (const char *p = text; *p;) {
        if (*p == '\n') {
            help_newline(w);
            p++;
        } else if (*p == ' ') {
            p++;
        } else {
            const char *e = p;
            while (*e && *e != ' ' && *e != '\n')
                e++;
            help_word(w, p, (int)(e - p));
            p = e;
        }
    }
}

static void print_help_line(FILE *f, int width, const char *left, const char *help,
                            const char *def) {
    help_writer w = {.f = f, .col = 2 + width + 1};
    const bool empty = !*help && !def;
    if (empty) {
        fprintf(f, "  %s\n", left);
        return;
    }
    if ((int)strlen(left) >= width) /* at most one space before the description */
        fprintf(f, "  %s\n%*s", left, w.col, "");
    else
        fprintf(f, "  %-*s ", width, left);
    /* the default is part of the text, so that "(default: X)" wraps like any words */
    const size_t size = strlen(help) + (def ? strlen(def) + 16 : 0) + 1;
    char *text = malloc(size);
    if (text) {
        snprintf(text, size, "%s%s%s%s", help,
                 def ? (*help ? " (default:\x01" : "(default:\x01") : "", def ? def : "",
                 def ? ")" : "");
        help_text(&w, text);
        free(text);
    } else {
        help_text(&w, help); /* out of memory: the defaults are left out */
    }
    fputc('\n', f);
}

void luna_options_print_help(const luna_option_table *t, FILE *f) {
    char left[128];
    int width = t->help_width;
    if (width <= 0) { /* the longest (up to a limit), and at least two spaces before the help */
        width = (int)strlen("--version");
        for (int i = 0; i < t->count; i++) {
            option_usage(&t->specs[i], left, sizeof left);
            if ((int)strlen(left) > width) width = (int)strlen(left);
        }
        width = width + 1 < LUNA_HELP_MAX_WIDTH ? width + 1 : LUNA_HELP_MAX_WIDTH;
    }
    const char *group = NULL;
    for (int i = 0; i < t->count; i++) {
        const luna_option_spec *s = &t->specs[i];
        const char *g = s->group ? s->group : "options";
        if (!group || strcmp(group, g) != 0) {
            group = g;
            fprintf(f, "\n%s:\n", group);
        }
        option_usage(s, left, sizeof left);
        bool show_def = s->def && s->type != LUNA_OPT_FLAG && s->type != LUNA_OPT_WORDS;
        print_help_line(f, width, left, s->help ? s->help : "", show_def ? s->def : NULL);
    }
    fprintf(f, "\nother:\n");
    print_help_line(f, width, "--help", "show this help", NULL);
    print_help_line(f, width, "--version", "show the version", NULL);
}

static bool has_value(const void *base, const luna_option_spec *s) {
    const void *p = cfield(base, s);
    switch (s->type) {
    case LUNA_OPT_FLAG: return *(const bool *)p;
    case LUNA_OPT_WORDS: return ((const luna_option_words *)p)->count > 0;
    case LUNA_OPT_INT:
    case LUNA_OPT_DOUBLE: return true;
    default: return *(const char *const *)p != NULL;
    }
}

void luna_options_print_config(const luna_option_table *t, const void *base, FILE *f) {
    luna_options_print_config_shown(t, base, NULL, f);
}

void luna_options_print_config_shown(const luna_option_table *t, const void *base,
                                     const bool *shown, FILE *f) {
    const char *group = NULL;
    for (int i = 0; i < t->count; i++) {
        const luna_option_spec *s = &t->specs[i];
        if ((shown && !shown[i]) || !has_value(base, s)) continue;
        const char *g = s->group ? s->group : "options";
        if (!group || strcmp(group, g) != 0) { /* the heading of a group with something to show */
            group = g;
            fprintf(f, "\n%s:", group);
        }
        fprintf(f, " %s", s->name);
        const void *p = cfield(base, s);
        switch (s->type) {
        case LUNA_OPT_INT: fprintf(f, " %lld", (long long)*(const int64_t *)p); break;
        case LUNA_OPT_DOUBLE: fprintf(f, " %g", *(const double *)p); break;
        case LUNA_OPT_FLAG: break;
        case LUNA_OPT_WORDS: {
            const luna_option_words *w = p;
            for (int k = 0; k < w->count; k++)
                fprintf(f, " %s", w->words[k]);
            break;
        }
        default: fprintf(f, " %s", *(const char *const *)p); break;
        }
    }
    fputc('\n', f);
}

void luna_options_write_json(const luna_option_table *t, const void *base, luna_json_writer *w) {
    for (int i = 0; i < t->count; i++) {
        const luna_option_spec *s = &t->specs[i];
        char key[64];
        snprintf(key, sizeof key, "%s", strncmp(s->name, "--", 2) == 0 ? s->name + 2 : s->name);
        for (char *c = key; *c; c++)
            if (*c == '-') *c = '_';
        luna_json_key(w, key);
        const void *p = cfield(base, s);
        switch (s->type) {
        case LUNA_OPT_INT: luna_json_int(w, *(const int64_t *)p); break;
        case LUNA_OPT_DOUBLE: luna_json_double(w, *(const double *)p); break;
        case LUNA_OPT_FLAG: luna_json_bool(w, *(const bool *)p); break;
        case LUNA_OPT_WORDS: {
            const luna_option_words *words = p;
            luna_json_begin_array(w);
            for (int k = 0; k < words->count; k++)
                luna_json_string(w, words->words[k]);
            luna_json_end_array(w);
            break;
        }
        default:
            if (*(const char *const *)p)
                luna_json_string(w, *(const char *const *)p);
            else
                luna_json_null(w);
        }
    }
}

int luna_options_parse_program(const luna_option_table *t, void *base, int argc, char **argv,
                               bool *given, const char *prog, const char *usage) {
    luna_options_action action;
    if (luna_options_parse(t, base, argc, argv, given, &action) != LUNA_OK) {
        fprintf(stderr, "%s: %s\n", prog, luna_error_message());
        return 2;
    }
    if (action == LUNA_OPTIONS_HELP) {
        fputs(usage, stdout);
        luna_options_print_help(t, stdout);
        return 0;
    }
    if (action == LUNA_OPTIONS_VERSION) {
        printf("%s (luna) %s\n", prog, LUNA_VERSION);
        return 0;
    }
    return -1;
}

int luna_options_usage_error(const char *prog, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see %s --help)\n", prog);
    va_end(ap);
    return 2;
}
