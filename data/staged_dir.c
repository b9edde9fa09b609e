#include "data/staged_dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dir_lock.h"
#include "core/file_util.h"

struct luna_staged_dir {
    char *dest, *parent, *path;
    size_t stale_removed;
    char stale_example[256];
};

luna_status luna_make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_status st = LUNA_OK;
    for (char *q = p + 1;; q++) {
        bool end = *q == '\0';
        if (*q == '/' || end) {
            char saved = *q;
            *q = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                st = luna_error(LUNA_ERR_IO, "%s: cannot create directory: %s (check permissions)",
                                p, strerror(errno));
                break;
            }
            *q = saved;
        }
        if (end) break;
    }
    struct stat sb;
    if (st == LUNA_OK && (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        st = luna_error(LUNA_ERR_IO, "%s: exists and is not a directory (choose another path)",
                        path);
    free(p);
    return st;
}

/* Remove a directory tree we created (only regular files and directories are expected). */
static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *child = luna_path_join(path, e->d_name);
            if (!child) continue;
            struct stat sb;
            if (lstat(child, &sb) == 0 && S_ISDIR(sb.st_mode))
                remove_tree(child);
            else
                unlink(child);
            free(child);
        }
        closedir(d);
    }
    rmdir(path);
}

void luna_staged_dir_free(luna_staged_dir *s) {
    if (!s) return;
    if (s->path) remove_tree(s->path);
    free(s->dest);
    free(s->parent);
    free(s->path);
    free(s);
}

/* Remove "<parent>/.<name>.staging-<pid>-XXXXXX" directories whose pid no longer runs (a
 * luna-preprocess killed before its commit); those of live processes are theirs. */
static void remove_stale_staging(luna_staged_dir *s, const char *name) {
    DIR *d = opendir(s->parent);
    if (!d) return;
    size_t n = strlen(name);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const char *q = e->d_name;
        if (q[0] != '.' || strncmp(q + 1, name, n) != 0 || strncmp(q + 1 + n, ".staging-", 9) != 0)
            continue;
        char *end;
        long pid = strtol(q + 1 + n + 9, &end, 10);
        if (end == q + 1 + n + 9 || *end != '-' || luna_process_alive(pid)) continue;
        char *path = luna_path_join(s->parent, q);
        if (!path) continue;
        remove_tree(path);
        if (!luna_path_exists(path)) {
            if (!s->stale_removed) snprintf(s->stale_example, sizeof s->stale_example, "%s", q);
            s->stale_removed++;
        }
        free(path);
    }
    closedir(d);
}

size_t luna_staged_dir_stale_removed(const luna_staged_dir *s, const char **example) {
    if (example) *example = s->stale_example;
    return s->stale_removed;
}

luna_status luna_staged_dir_create(luna_staged_dir **out, const char *dest) {
    *out = NULL;
    luna_staged_dir *s = calloc(1, sizeof *s);
    if (!s || !(s->dest = strdup(dest))) {
        free(s);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t n = strlen(s->dest);
    while (n > 1 && s->dest[n - 1] == '/')
        s->dest[--n] = '\0'; /* "out/" names "out" */
    const char *slash = strrchr(s->dest, '/');
    const char *name = slash ? slash + 1 : s->dest;
    s->parent =
        slash ? strndup(s->dest, slash == s->dest ? 1 : (size_t)(slash - s->dest)) : strdup(".");
    size_t len = strlen(s->parent) + strlen(name) + 32;
    s->path = malloc(len);
    luna_status st =
        s->parent && s->path ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    char *tmp_path = s->path;
    s->path = NULL; /* not ours to remove until mkdtemp succeeded */
    if (st == LUNA_OK && (!strcmp(name, ".") || !strcmp(name, "..") || !*name))
        st = luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: give the destination directory by name",
                        dest);
    struct stat sb;
    if (st == LUNA_OK && stat(s->dest, &sb) == 0 && !S_ISDIR(sb.st_mode))
        st = luna_error(LUNA_ERR_IO, "%s: exists and is not a directory (choose another --destdir)",
                        s->dest);
    if (st == LUNA_OK) st = luna_make_dirs(s->parent);
    if (st == LUNA_OK) remove_stale_staging(s, name);
    if (st == LUNA_OK) {
        snprintf(tmp_path, len, "%s/.%s.staging-%ld-XXXXXX", s->parent, name, (long)getpid());
        if (!mkdtemp(tmp_path))
            st = luna_error(
                LUNA_ERR_IO,
                "%s: cannot create a staging directory next to it: %s (check permissions)", s->dest,
                strerror(errno));
        else
            s->path = tmp_path, tmp_path = NULL;
    }
    free(tmp_path);
    if (st != LUNA_OK) {
        luna_staged_dir_free(s);
        return st;
    }
    *out = s;
    return LUNA_OK;
}

const char *luna_staged_dir_path(const luna_staged_dir *s) { return s->path; }
const char *luna_staged_dir_dest(const luna_staged_dir *s) { return s->dest; }

luna_status luna_staged_dir_commit(luna_staged_dir *s) {
    luna_status st = LUNA_OK;
    struct stat sb;
    if (stat(s->dest, &sb) != 0) {
        /* mkdtemp made it 0700; a data-bin is an ordinary shared directory. */
        mode_t mask = umask(0);
        umask(mask);
        chmod(s->path, 0777 & ~mask);
        if (rename(s->path, s->dest) != 0)
            st = luna_error(LUNA_ERR_IO, "%s: cannot move the staging directory into place: %s",
                            s->dest, strerror(errno));
        else {
            free(s->path);
            s->path = NULL;
            st = luna_fsync_dir(s->parent);
        }
    } else {
        DIR *d = opendir(s->path);
        if (!d) st = luna_error(LUNA_ERR_IO, "%s: cannot list: %s", s->path, strerror(errno));
        struct dirent *e;
        while (st == LUNA_OK && (e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *from = luna_path_join(s->path, e->d_name),
                 *to = luna_path_join(s->dest, e->d_name);
            if (!from || !to)
                st = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
            else if (rename(from, to) != 0)
                st = luna_error(LUNA_ERR_IO, "%s: cannot move into place: %s", to, strerror(errno));
            free(from);
            free(to);
        }
        if (d) closedir(d);
        if (st == LUNA_OK) st = luna_fsync_dir(s->dest);
    }
    luna_staged_dir_free(s);
    return st;
}
