/* Build a directory's new files in a hidden sibling, then move them into place at once.
 *
 * luna-preprocess writes a data-bin this way so that a failure (bad input found late, full disk,
 * a crash) never leaves a half-written --destdir: until luna_staged_dir_commit() the destination
 * is untouched. Commit renames the staging directory onto the destination when that does not
 * exist yet (one atomic step), otherwise renames each staged file over its counterpart (each
 * step atomic; files already in the destination that were not staged are left alone).
 */
#ifndef LUNA_DATA_STAGED_DIR_H
#define LUNA_DATA_STAGED_DIR_H

#include <stddef.h>

#include "core/status.h"

typedef struct luna_staged_dir luna_staged_dir;

/* Create "<parent>/.<name>.staging-<pid>-XXXXXX" for destination "<parent>/<name>" (creating
 * the parent directories if needed). The destination, if it exists, must be a directory. Staging
 * directories of the same destination left by processes that no longer run (killed before their
 * commit) are removed first; luna_staged_dir_stale_removed() says how many (the caller prints
 * the notice) and names the first in *example. */
luna_status luna_staged_dir_create(luna_staged_dir **out, const char *dest);
size_t luna_staged_dir_stale_removed(const luna_staged_dir *s, const char **example);

/* The staging directory (write files here) and the destination. */
const char *luna_staged_dir_path(const luna_staged_dir *s);
const char *luna_staged_dir_dest(const luna_staged_dir *s);

/* Move everything into place and free s (in every case; on failure the staging directory is
 * removed). */
luna_status luna_staged_dir_commit(luna_staged_dir *s);

/* Remove the staging directory and everything in it, free s (NULL is a no-op). */
void luna_staged_dir_free(luna_staged_dir *s);

/* mkdir -p. */
luna_status luna_make_dirs(const char *path);

#endif
