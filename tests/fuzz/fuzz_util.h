/* Shared by the libFuzzer targets in tests/fuzz/ (built with -DLUNA_FUZZ=ON, run by
 * tools/ci/fuzz.sh). The readers under test take paths and map files, so the file-based targets
 * write each input to a per-process directory in /dev/shm (memory; $TMPDIR when /dev/shm is
 * missing) and open that. */
#ifndef LUNA_FUZZ_UTIL_H
#define LUNA_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* `name` inside this process's scratch directory (created on first use; removed at exit). */
static const char *fuzz_path(const char *name);

static char fuzz_dir_[256];

static void fuzz_cleanup_(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_);
    if (fuzz_dir_[0] && system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir_);
}

static const char *fuzz_path(const char *name) {
    static char path[512];
    if (!fuzz_dir_[0]) {
        struct stat sb;
        const char *base = stat("/dev/shm", &sb) == 0 ? "/dev/shm" : getenv("TMPDIR");
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/luna-fuzz-%ld", base ? base : "/tmp",
                 (long)getpid());
        if (mkdir(fuzz_dir_, 0700) != 0 && stat(fuzz_dir_, &sb) != 0) abort();
        atexit(fuzz_cleanup_);
    }
    snprintf(path, sizeof path, "%s/%s", fuzz_dir_, name);
    return path;
}

/* Write data to `name` in the scratch directory and return its path. */
static const char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
    const char *path = fuzz_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
    return path;
}

#endif
