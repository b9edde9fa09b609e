/* One writer per directory, and the debris of dead writers.
 *
 * - luna_dir_lock_acquire: an advisory flock(2) on "<dir>/.lock", which holds the owner's pid as
 *   text. The kernel drops the lock when its process ends, however it ends, so a lock left by a
 *   killed run never blocks: the next run takes it over and is told which pid left it. A second
 *   process asking while the owner lives gets one line naming the directory and the owner's pid.
 * - luna_remove_stale_temporaries: removes "<file>.tmp-<pid>-<n>" files (luna_temp_name, the
 *   atomic writes of core/file_util.h) whose pid is no longer running, e.g. after a kill during a
 *   save; temporaries of live processes are left alone.
 */
#ifndef LUNA_DIR_LOCK_H
#define LUNA_DIR_LOCK_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

typedef struct luna_dir_lock luna_dir_lock;

/* Lock `dir` (which must exist). `what` names the directory in messages (e.g. "--save-dir").
 * LUNA_ERR_IO "<what> DIR: in use by another process (pid N holds DIR/.lock) ..." when held.
 * *stale_pid is set to the pid recorded by an earlier owner that ended without releasing the
 * lock (a crash or kill), 0 when there was none. */
luna_status luna_dir_lock_acquire(luna_dir_lock **out, const char *dir, const char *what,
                                  long *stale_pid);

/* Release (empties the pid record, then unlocks); NULL is a no-op. */
void luna_dir_lock_release(luna_dir_lock *lock);

/* Whether process `pid` exists (kill(pid, 0); a process of another user counts as running). */
bool luna_process_alive(long pid);

/* Remove the temporaries of dead processes in `dir` (not recursive): names ending in
 * ".tmp-<pid>-<hex>" with <pid> not running, and the fixed ".tmp-link" of earlier versions.
 * *removed counts them; `example` (may be NULL) receives the first name removed. */
luna_status luna_remove_stale_temporaries(const char *dir, size_t *removed, char *example,
                                          size_t example_size);

#endif
