/* outfile — how every file a command writes reaches the disk, and the locks that keep two
 * processes off one output.
 *
 * Atomic replacement (m2d_atomic_*, m2d_write_file_atomic): the bytes go to a temp file created
 * exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, random name "NAME.m2d-tmp.XXXXXXXXXX" in the target's
 * own directory, so a link planted there is never opened and the rename stays on one file
 * system), then fsync(file), rename over the target, fsync(directory). Readers see the old file
 * or the new one, never a part; a crash leaves at most a temp file (m2d_atomic_leftover()
 * recognises it). Permissions: an existing target's are kept, else 0666 & ~umask.
 * The target itself must be absent or a regular file: a symbolic link at the final path is
 * refused (one line naming the link and its target), not followed and not replaced — whether a
 * link was planted or placed on purpose cannot be told apart, so the user passes the real path.
 * Links in the directories above it are the user's layout and are followed.
 *
 * Locks (m2d_lock_*): an exclusive flock(2) on "TARGET.lock" (created O_NOFOLLOW), held while a
 * process owns TARGET (a sweep's results CSV, a calibration cache entry being computed, a student
 * directory being written). The holder writes "pid=... host=... since=..." into the lock file;
 * another process is told who holds it. The kernel drops the lock when the holder dies (also on
 * kill -9), so a lock is never stale; release unlinks the file. */
#ifndef M2D_OUTFILE_H
#define M2D_OUTFILE_H

#include <stddef.h>

typedef struct {
    int fd;          /* the temp file, -1 when closed */
    char *path;      /* the target */
    char *tmp;       /* the temp file's path */
    int failed;      /* a write failed: commit refuses */
} m2d_atomic_file;

/* Create the temp file for PATH. -1 + m2d_err (PATH a symlink or not a regular file, directory
 * not writable). */
int m2d_atomic_open(m2d_atomic_file *f, const char *path);
/* Append N bytes (a failure is recorded: the commit then refuses and removes the temp file). */
int m2d_atomic_write(m2d_atomic_file *f, const void *data, size_t n);
/* fsync, rename over the target, fsync the directory; frees F. On any failure the temp file is
 * removed, the target is untouched, and -1 + m2d_err. */
int m2d_atomic_commit(m2d_atomic_file *f);
/* Remove the temp file and free F (the target is untouched). Safe on a zeroed or closed F. */
void m2d_atomic_abort(m2d_atomic_file *f);

/* The whole file at once: open + write + commit. */
int m2d_write_file_atomic(const char *path, const void *data, size_t len);

/* 0 when PATH may be written (absent, or a regular file); -1 + m2d_err naming PATH (a symbolic
 * link: and its target; a directory, device, fifo, ...). */
int m2d_check_output_path(const char *path);
/* The same for a file written in place (appended to, truncated: a log): also refused when it has
 * other names (a hard link), whose file the write would change too. */
int m2d_check_inplace_path(const char *path);
/* The same for a directory an output goes into: absent, or a real directory (not a symbolic link,
 * which every write, rename and removal under it would follow); else one line and -1. */
int m2d_check_output_dir(const char *path);
/* The same, then PATH (and its parents) created when absent: the directory outputs go into. */
int m2d_make_output_dir(const char *path);

/* 1 when NAME (a directory entry) is a temp file this module creates for BASE ("BASE.m2d-tmp.*"),
 * or the "BASE.tmp.PID" of earlier versions: what a killed writer of BASE leaves behind. */
int m2d_atomic_leftover(const char *name, const char *base);

/* Remove the leftovers (m2d_atomic_leftover) of PATH from its directory; how many were removed.
 * Only while holding PATH's lock (or an equivalent one): a live writer's temp file looks the same. */
int m2d_atomic_remove_leftovers(const char *path);

typedef struct {
    int fd;          /* -1: not held */
    char *path;      /* TARGET.lock */
} m2d_lock;

/* Take the exclusive lock of TARGET (the file TARGET.lock). WAIT = 0: when another process holds
 * it, -1 + m2d_err "TARGET: in use by pid P on host H since T (WHAT)". WAIT = 1: print one line
 * saying whom it waits for (prefixed "moe2dense CMD: "), then block until it is free. */
int m2d_lock_acquire(m2d_lock *l, const char *target, const char *cmd, const char *what, int wait);
/* Unlink the lock file and drop the lock. Safe on a zeroed or released L. */
void m2d_lock_release(m2d_lock *l);

#endif
