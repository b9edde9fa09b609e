#include "core/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- atomic writes --------------------------------------------------------------------------- */

#define ATOMIC_BUFFER_BYTES (1u << 20)

struct luna_atomic_file {
    char *path;     /* destination */
    char *tmp_path; /* "<path>.tmp-<pid>-<n>" in the same directory */
    int fd;
    unsigned char *buffer; /* writes are gathered so that many small appends stay cheap */
    size_t buffered;
    bool failed;
};

/* Temporary names are made unique with pid + a process-wide counter; O_EXCL makes a collision
 * (e.g. a leftover from a crashed run with the same pid) retry instead of clobbering. We do not
 * use mkstemp() because it creates mode 0600 files and fixing the mode needs the process umask.
 * The pid in the name lets a later run see that the writer is gone (core/dir_lock.h). */
static atomic_uint_fast64_t temp_counter;

void luna_temp_name(char *buf, size_t size, const char *path) {
    uint64_t n = atomic_fetch_add(&temp_counter, 1);
    snprintf(buf, size, "%s.tmp-%ld-%llx", path, (long)getpid(), (unsigned long long)n);
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir) return NULL;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return dir;
}

luna_status luna_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return luna_error(LUNA_ERR_IO,
                          "%s: cannot open directory: %s (check the path and permissions)", dir,
                          strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* Some filesystems (e.g. certain network mounts) refuse fsync on directories; that only
     * weakens durability after a power loss, not atomicity, so EINVAL is tolerated. */
    if (rc != 0 && err != EINVAL)
        return luna_error(LUNA_ERR_IO, "%s: cannot fsync directory: %s", dir, strerror(err));
    return LUNA_OK;
}

luna_status luna_atomic_file_create(luna_atomic_file **out, const char *path) {
    *out = NULL;
    luna_atomic_file *f = calloc(1, sizeof *f);
    size_t tmp_len = strlen(path) + 64;
    if (f) {
        f->fd = -1;
        f->path = strdup(path);
        f->tmp_path = malloc(tmp_len);
        f->buffer = malloc(ATOMIC_BUFFER_BYTES);
    }
    if (!f || !f->path || !f->tmp_path || !f->buffer) {
        luna_atomic_file_free(f);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory creating the file", path);
    }
    for (int attempt = 0; attempt < 100; attempt++) {
        luna_temp_name(f->tmp_path, tmp_len, path);
        f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (f->fd >= 0 || errno != EEXIST) break;
    }
    if (f->fd < 0) {
        int err = errno;
        free(f->tmp_path);
        f->tmp_path = NULL; /* nothing was created, nothing to remove */
        luna_atomic_file_free(f);
        return luna_error(LUNA_ERR_IO,
                          "%s: cannot create a temporary file next to it: %s "
                          "(check that the directory exists and is writable)",
                          path, strerror(err));
    }
    *out = f;
    return LUNA_OK;
}

static luna_status flush_buffer(luna_atomic_file *f) {
    size_t done = 0;
    while (done < f->buffered) {
        ssize_t w = write(f->fd, f->buffer + done, f->buffered - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            f->failed = true;
            return luna_error(LUNA_ERR_IO, "%s: write failed: %s (check free disk space)", f->path,
                              strerror(errno));
        }
        done += (size_t)w;
    }
    f->buffered = 0;
    return LUNA_OK;
}

luna_status luna_atomic_file_write(luna_atomic_file *f, const void *data, size_t n) {
    if (f->failed) return luna_error(LUNA_ERR_IO, "%s: write after an earlier failure", f->path);
    const unsigned char *p = data;
    while (n > 0) {
        size_t room = ATOMIC_BUFFER_BYTES - f->buffered;
        size_t take = n < room ? n : room;
        memcpy(f->buffer + f->buffered, p, take);
        f->buffered += take;
        p += take;
        n -= take;
        if (f->buffered == ATOMIC_BUFFER_BYTES) LUNA_TRY(flush_buffer(f));
    }
    return LUNA_OK;
}

const char *luna_atomic_file_path(const luna_atomic_file *f) { return f->path; }

void luna_atomic_file_free(luna_atomic_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    if (f->tmp_path) unlink(f->tmp_path);
    free(f->tmp_path);
    free(f->path);
    free(f->buffer);
    free(f);
}

luna_status luna_atomic_file_commit(luna_atomic_file *f) {
    luna_status st = f->failed ? luna_error(LUNA_ERR_IO, "%s: commit after a failed write", f->path)
                               : flush_buffer(f);
    if (st == LUNA_OK && fsync(f->fd) != 0)
        st = luna_error(LUNA_ERR_IO, "%s: fsync failed: %s", f->path, strerror(errno));
    if (st == LUNA_OK) {
        int rc = close(f->fd);
        f->fd = -1;
        if (rc != 0) st = luna_error(LUNA_ERR_IO, "%s: close failed: %s", f->path, strerror(errno));
    }
    if (st == LUNA_OK && rename(f->tmp_path, f->path) != 0)
        st = luna_error(LUNA_ERR_IO, "%s: cannot rename the temporary file into place: %s", f->path,
                        strerror(errno));
    if (st == LUNA_OK) {
        free(f->tmp_path); /* renamed: must not be unlinked by free() */
        f->tmp_path = NULL;
        char *dir = dir_of(f->path);
        st = dir ? luna_fsync_dir(dir) : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        free(dir);
    }
    luna_atomic_file_free(f);
    return st;
}

luna_status luna_write_file_atomic(const char *path, const void *data, size_t n) {
    luna_atomic_file *f;
    LUNA_TRY(luna_atomic_file_create(&f, path));
    luna_status st = luna_atomic_file_write(f, data, n);
    if (st != LUNA_OK) {
        luna_atomic_file_free(f);
        return st;
    }
    return luna_atomic_file_commit(f);
}

/* ---- whole-file reading ---------------------------------------------------------------------- */

luna_status luna_mapped_file_open(luna_mapped_file *out, const char *path) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return luna_error(LUNA_ERR_IO, "%s: cannot open: %s (check the path)", path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return luna_error(LUNA_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return luna_error(LUNA_ERR_IO, "%s: not a regular file (give a file path)", path);
    }
    if (st.st_size == 0) { /* mmap of length 0 is an error; an empty file is valid */
        close(fd);
        return LUNA_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd); /* the mapping keeps the file referenced */
    if (p == MAP_FAILED) return luna_error(LUNA_ERR_IO, "%s: cannot mmap: %s", path, strerror(err));
    out->data = p;
    out->size = (size_t)st.st_size;
    return LUNA_OK;
}

void luna_mapped_file_close(luna_mapped_file *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

luna_status luna_read_file(const char *path, char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    luna_mapped_file m;
    LUNA_TRY(luna_mapped_file_open(&m, path));
    char *buf = malloc(m.size + 1);
    if (!buf) {
        luna_mapped_file_close(&m);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory reading %zu bytes", path,
                          m.size);
    }
    if (m.size) memcpy(buf, m.data, m.size);
    buf[m.size] = '\0';
    *data = buf;
    *size = m.size;
    luna_mapped_file_close(&m);
    return LUNA_OK;
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */

bool luna_utf8_valid(const char *str, size_t n, size_t *bad_offset) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path: 8 bytes at a time while no high bit is set. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte (RFC 3629 table) */
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c == 0xE0)
            len = 3, lo = 0xA0; /* no overlongs */
        else if (c == 0xED)
            len = 3, hi = 0x9F; /* no surrogates */
        else if (c >= 0xE1 && c <= 0xEF)
            len = 3;
        else if (c == 0xF0)
            len = 4, lo = 0x90; /* no overlongs */
        else if (c >= 0xF1 && c <= 0xF3)
            len = 4;
        else if (c == 0xF4)
            len = 4, hi = 0x8F; /* nothing above U+10FFFF */
        else
            goto bad; /* 0x80-0xC1, 0xF5-0xFF */
        if (i + len > n) goto bad;
        if (s[i + 1] < lo || s[i + 1] > hi) goto bad;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) goto bad;
        i += len;
    }
    return true;
bad:
    if (bad_offset) *bad_offset = i;
    return false;
}

/* ---- paths ----------------------------------------------------------------------------------- */

char *luna_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

bool luna_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
