/* File helpers shared by the data layer and the checkpoint code.
 *
 * - Atomic writes: a file is written to a temporary sibling, fsync'ed and renamed over the
 *   destination, then the directory is fsync'ed. Readers therefore see either the old file or
 *   the complete new one, never a prefix (a crash or a full disk in the middle leaves the old
 *   file untouched and removes the temporary).
 * - Read-only mappings of whole files (the data-bin is read via mmap).
 * - A strict UTF-8 validator (text inputs are checked before anything is trained on them).
 */
#ifndef LUNA_FILE_UTIL_H
#define LUNA_FILE_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

/* ---- atomic writes --------------------------------------------------------------------------- */

typedef struct luna_atomic_file luna_atomic_file;

/* "<path>.tmp-<pid>-<n>" into buf: a temporary name next to `path`, n counting this process's
 * temporaries (create it with O_EXCL and try the next name on EEXIST, e.g. the leftover of a
 * dead process that had the same pid). core/dir_lock.h removes those of dead processes. */
void luna_temp_name(char *buf, size_t size, const char *path);

/* Start writing `path`: creates a temporary (luna_temp_name) next to it (same filesystem, so the
 * final rename is atomic). Nothing at `path` changes until luna_atomic_file_commit(). */
luna_status luna_atomic_file_create(luna_atomic_file **out, const char *path);

/* Append n bytes (buffered). After a failure the file can only be freed. */
luna_status luna_atomic_file_write(luna_atomic_file *f, const void *data, size_t n);

/* Flush, fsync, rename over the destination, fsync the directory; frees `f` in every case.
 * On failure the temporary is removed and the previous file (if any) is kept. */
luna_status luna_atomic_file_commit(luna_atomic_file *f);

/* Abandon the write: close and remove the temporary, free `f` (NULL is a no-op). */
void luna_atomic_file_free(luna_atomic_file *f);

/* The destination path given at creation. */
const char *luna_atomic_file_path(const luna_atomic_file *f);

/* Write a whole buffer atomically (create + write + commit). */
luna_status luna_write_file_atomic(const char *path, const void *data, size_t n);

/* fsync a directory so that renames/creations inside it are durable. */
luna_status luna_fsync_dir(const char *dir);

/* ---- whole-file reading ---------------------------------------------------------------------- */

/* A read-only mapping of a whole file. An empty file maps to data == NULL, size == 0. */
typedef struct {
    const unsigned char *data;
    size_t size;
} luna_mapped_file;

luna_status luna_mapped_file_open(luna_mapped_file *out, const char *path);
void luna_mapped_file_close(luna_mapped_file *m);

/* Read a whole file into a malloc'ed buffer with a terminating NUL (not counted in *size). */
luna_status luna_read_file(const char *path, char **data, size_t *size);

/* ---- UTF-8 ----------------------------------------------------------------------------------- */

/* True iff s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
 * On false, *bad_offset (if non-NULL) receives the offset of the first offending byte. */
bool luna_utf8_valid(const char *s, size_t n, size_t *bad_offset);

/* ---- paths ----------------------------------------------------------------------------------- */

/* malloc'ed "<dir>/<name>" (NULL on out of memory). */
char *luna_path_join(const char *dir, const char *name);

/* True iff `path` exists (any file type). */
bool luna_path_exists(const char *path);

#endif
