/* Directory locks and stale temporaries (see dir_lock.h). */
#include "core/dir_lock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/file_util.h"

struct luna_dir_lock {
    int fd;
};

bool luna_process_alive(long pid) {
    if (pid <= 0) return false;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* The pid recorded in the lock file, 0 if none or unreadable. */
static long read_pid(int fd) {
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *end;
    long pid = strtol(buf, &end, 10);
    return pid > 0 && (*end == '\n' || *end == '\0') ? pid : 0;
}

luna_status luna_dir_lock_acquire(luna_dir_lock **out, const char *dir, const char *what,
                                  long *stale_pid) {
    *out = NULL;
    if (stale_pid) *stale_pid = 0;
    char *path = luna_path_join(dir, ".lock");
    if (!path) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        luna_status s = luna_error(LUNA_ERR_IO, "%s %s: cannot create %s: %s", what, dir, path,
                                   strerror(errno));
        free(path);
        return s;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        long pid = read_pid(fd);
        close(fd);
        luna_status s;
        if (err == EWOULDBLOCK) {
            char holder[48] = "another process";
            if (pid > 0) snprintf(holder, sizeof holder, "pid %ld", pid);
            s = luna_error(LUNA_ERR_IO,
                           "%s %s: in use by another process (%s holds %s); wait for it to "
                           "finish or choose another %s",
                           what, dir, holder, path, what);
        } else {
            s = luna_error(LUNA_ERR_IO, "%s %s: cannot lock %s: %s", what, dir, path,
                           strerror(err));
        }
        free(path);
        return s;
    }
    long previous = read_pid(fd);
    if (stale_pid && previous > 0 && previous != (long)getpid()) *stale_pid = previous;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    luna_dir_lock *lock = malloc(sizeof *lock);
    if (!lock || ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        int err = errno;
        close(fd);
        free(lock);
        luna_status s = lock ? luna_error(LUNA_ERR_IO, "%s %s: cannot write %s: %s", what, dir,
                                          path, strerror(err))
                             : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        free(path);
        return s;
    }
    free(path);
    lock->fd = fd;
    *out = lock;
    return LUNA_OK;
}

void luna_dir_lock_release(luna_dir_lock *lock) {
    if (!lock) return;
    if (ftruncate(lock->fd, 0) != 0) { /* a leftover pid only makes the next run say so */
    }
    close(lock->fd); /* drops the flock */
    free(lock);
}

/* The pid of "<anything>.tmp-<pid>-<hex>", 0 if the name is not of that form. */
static long temp_owner(const char *name) {
    const char *t = NULL;
    for (const char *p = strstr(name, ".tmp-"); p; p = strstr(p + 1, ".tmp-"))
        t = p;
    if (!t) return 0;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    if (end == t + 5 || *end != '-' || !end[1]) return 0;
    for (const char *h = end + 1; *h; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f'))) return 0;
    return pid;
}

luna_status luna_remove_stale_temporaries(const char *dir, size_t *removed, char *example,
                                          size_t example_size) {
    *removed = 0;
    if (example && example_size) example[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return luna_error(LUNA_ERR_IO, "%s: cannot list the directory: %s", dir, strerror(errno));
    luna_status s = LUNA_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        bool old_link = len > 9 && strcmp(e->d_name + len - 9, ".tmp-link") == 0;
        long pid = old_link ? 0 : temp_owner(e->d_name);
        if (!old_link && (pid <= 0 || luna_process_alive(pid))) continue;
        char *path = luna_path_join(dir, e->d_name);
        if (!path) {
            s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        if (unlink(path) == 0) {
            if (*removed == 0 && example && example_size)
                snprintf(example, example_size, "%s", e->d_name);
            (*removed)++;
        }
        free(path);
    }
    closedir(d);
    return s;
}
