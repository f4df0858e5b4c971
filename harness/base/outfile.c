/* outfile — atomic replacement of output files, exclusive temp files, output locks (see outfile.h). */
#include "base/outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"

#define TMP_TAG ".m2d-tmp."
#define TMP_RANDOM 10

/* ---- paths ---- */

int m2d_check_inplace_path(const char *path) {
    struct stat st;
    if (m2d_check_output_path(path)) return -1;
    if (lstat(path, &st) == 0 && st.st_nlink > 1)
        return m2d_err("%s: has %lu names (a hard link); refusing to write another file through it: give a path of "
                       "its own", path, (unsigned long)st.st_nlink);
    return 0;
}

int m2d_check_output_path(const char *path) {
    struct stat st;
    if (!path || !*path) return m2d_err("output path is empty");
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : m2d_err("%s: %s", path, strerror(errno));
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        return m2d_err("%s: is a symbolic link (to %s); refusing to write through it or replace it: give the real "
                       "path", path, target);
    }
    if (!S_ISREG(st.st_mode))
        return m2d_err("%s: exists and is not a regular file; refusing to replace it", path);
    return 0;
}

int m2d_check_output_dir(const char *path) {
    char *bare = m2d_path_beside(path, ""); /* without its trailing slashes: lstat("LINK/") follows the link */
    struct stat st;
    int rc = 0;
    if (lstat(bare, &st) != 0) rc = errno == ENOENT ? 0 : m2d_err("%s: %s", path, strerror(errno));
    else if (S_ISLNK(st.st_mode))
        rc = m2d_err("%s: is a symbolic link; refusing to write, rename or remove files through it: remove it", path);
    else if (!S_ISDIR(st.st_mode)) rc = m2d_err("%s: exists and is not a directory", path);
    free(bare);
    return rc;
}

int m2d_make_output_dir(const char *path) { return m2d_check_output_dir(path) || m2d_mkdir_p(path) ? -1 : 0; }

/* The directory of PATH ("." when it has none) and its last component (malloc'd both). */
static int split_path(const char *path, char **dir, char **base) {
    const char *slash = strrchr(path, '/');
    const char *b = slash ? slash + 1 : path;
    if (!*b || !strcmp(b, ".") || !strcmp(b, ".."))
        return m2d_err("%s: not a file name (it names a directory)", path);
    *base = m2d_strdup(b);
    if (!slash) *dir = m2d_strdup(".");
    else if (slash == path) *dir = m2d_strdup("/");
    else *dir = m2d_strfmt("%.*s", (int)(slash - path), path);
    return 0;
}

/* TMP_RANDOM characters [a-z0-9]: getrandom, else a mix of the clock, pid and a counter. */
static void random_suffix(char *out) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    static _Thread_local uint64_t counter;
    unsigned char r[TMP_RANDOM];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40) ^ ++counter;
        for (int i = 0; i < TMP_RANDOM; i++) {
            z += 0x9E3779B97F4A7C15ull;
            uint64_t x = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            r[i] = (unsigned char)(x >> 56);
        }
    }
    for (int i = 0; i < TMP_RANDOM; i++) out[i] = digits[r[i] % 36];
    out[TMP_RANDOM] = 0;
}

int m2d_atomic_leftover(const char *name, const char *base) {
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) != 0) return 0;
    const char *rest = name + bl;
    if (!strncmp(rest, TMP_TAG, strlen(TMP_TAG))) {
        rest += strlen(TMP_TAG);
        if (strlen(rest) != TMP_RANDOM) return 0;
        for (; *rest; rest++)
            if (!((*rest >= 'a' && *rest <= 'z') || (*rest >= '0' && *rest <= '9'))) return 0;
        return 1;
    }
    if (strncmp(rest, ".tmp.", 5) != 0 || !rest[5]) return 0; /* before version 0.2: NAME.tmp.PID */
    for (rest += 5; *rest; rest++)
        if (*rest < '0' || *rest > '9') return 0;
    return 1;
}

int m2d_atomic_remove_leftovers(const char *path) {
    char *dir, *base;
    if (split_path(path, &dir, &base)) return 0;
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!m2d_atomic_leftover(e->d_name, base)) continue;
        char *p = m2d_path_join(dir, e->d_name);
        if (unlink(p) == 0) n++;
        free(p);
    }
    if (d) closedir(d);
    free(dir);
    free(base);
    return n;
}

/* ---- atomic replacement ---- */

static void atomic_free(m2d_atomic_file *f) {
    free(f->path);
    free(f->tmp);
    f->path = f->tmp = NULL;
    f->fd = -1;
}

int m2d_atomic_open(m2d_atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (m2d_check_output_path(path)) return -1;
    char *dir, *base;
    if (split_path(path, &dir, &base)) return -1;
    struct stat st;
    int have_old = stat(path, &st) == 0;
    int fd = -1;
    for (int attempt = 0; attempt < 64 && fd < 0; attempt++) {
        char rnd[TMP_RANDOM + 1];
        random_suffix(rnd);
        free(f->tmp);
        f->tmp = m2d_strfmt("%s/%s" TMP_TAG "%s", dir, base, rnd);
        /* exclusive and never through a link: a name planted in advance makes this fail, and we retry */
        fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    int err = errno;
    free(dir);
    free(base);
    if (fd < 0) {
        m2d_err("%s: cannot create a temporary file next to it: %s", path, strerror(err));
        atomic_free(f);
        return -1;
    }
    if (have_old) (void)fchmod(fd, st.st_mode & 07777); /* keep the permissions of the file replaced */
    f->fd = fd;
    f->path = m2d_strdup(path);
    return 0;
}

int m2d_atomic_write(m2d_atomic_file *f, const void *data, size_t n) {
    const char *p = data;
    while (n > 0 && !f->failed) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            m2d_err("%s: write failed: %s", f->path, w < 0 ? strerror(errno) : "no progress");
            f->failed = 1;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return f->failed ? -1 : 0;
}

void m2d_atomic_abort(m2d_atomic_file *f) {
    if (f->tmp) { /* a zeroed F holds nothing (and fd 0 is not ours) */
        if (f->fd >= 0) close(f->fd);
        unlink(f->tmp);
    }
    atomic_free(f);
}

/* fsync the directory holding PATH, so the rename itself survives a power loss */
static int sync_dir_of(const char *path) {
    char *dir, *base;
    if (split_path(path, &dir, &base)) return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != EROFS))
        rc = m2d_err("%s: cannot sync its directory %s: %s", path, dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    free(base);
    return rc;
}

int m2d_atomic_commit(m2d_atomic_file *f) {
    if (f->fd < 0) return m2d_err("%s: not open for writing", f->path ? f->path : "(output)");
    if (f->failed) {
        char *msg = m2d_strdup(m2d_errmsg());
        m2d_atomic_abort(f);
        m2d_err("%s", msg);
        free(msg);
        return -1;
    }
    int rc = 0;
    if (fsync(f->fd) != 0) rc = m2d_err("%s: cannot flush to disk: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && rc == 0) rc = m2d_err("%s: cannot finish writing: %s", f->path, strerror(errno));
    f->fd = -1;
    if (rc == 0 && rename(f->tmp, f->path) != 0)
        rc = m2d_err("%s: cannot move the finished file into place: %s", f->path, strerror(errno));
    if (rc != 0) {
        m2d_atomic_abort(f);
        return -1;
    }
    rc = sync_dir_of(f->path);
    atomic_free(f);
    return rc;
}

int m2d_write_file_atomic(const char *path, const void *data, size_t len) {
    m2d_atomic_file f;
    if (m2d_atomic_open(&f, path)) return -1;
    m2d_atomic_write(&f, data, len);
    return m2d_atomic_commit(&f);
}

/* ---- locks ---- */

/* "pid P on host H since T" from the holder's lock file, or a generic phrase. */
static void describe_holder(int fd, char *buf, size_t n) {
    char raw[256];
    ssize_t got = pread(fd, raw, sizeof raw - 1, 0);
    raw[got > 0 ? got : 0] = 0;
    long pid = 0;
    char host[128] = "?", since[64] = "?";
    if (sscanf(raw, "pid=%ld host=%127s since=%63s", &pid, host, since) >= 1 && pid > 0)
        snprintf(buf, n, "pid %ld on host %s since %s", pid, host, since);
    else
        snprintf(buf, n, "another process");
}

static void record_holder(int fd) {
    char host[128], since[64];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if (*p == ' ' || *p == '\n') *p = '_';
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char line[256];
    int len = snprintf(line, sizeof line, "pid=%ld host=%s since=%s\n", (long)getpid(), host, since);
    if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)len, 0) == len) return;
    /* the owner description is a courtesy for the message of a second process; the lock holds anyway */
}

/* FD, opened at lock path PATH, is a lock file this code made (or one left by a killed holder): a
 * regular file of one name, empty or starting "pid=". Anything else there (a hard link to a user's
 * file, a file of theirs) is refused, since a holder rewrites its lock file and removes it. */
static int check_lock_file(int fd, const char *path) {
    struct stat st;
    char head[4];
    if (fstat(fd, &st) != 0) return m2d_err("%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return m2d_err("%s: is not a regular file, so not a moe2dense lock file", path);
    if (st.st_nlink > 1)
        return m2d_err("%s: has %lu names (a hard link), so it is not a moe2dense lock file; refusing to overwrite it",
                       path, (unsigned long)st.st_nlink);
    /* a holder that took a stale lock file over truncates it before it writes its pid=: a read of
     * nothing is that moment, not a foreign file */
    ssize_t got = st.st_size > 0 ? pread(fd, head, sizeof head, 0) : 0;
    if (got > 0 && (got < (ssize_t)strlen("pid=") || memcmp(head, "pid=", 4) != 0))
        return m2d_err("%s: does not hold a moe2dense lock (pid=...); refusing to overwrite it", path);
    return 0;
}

/* 1 when FD is still the file at PATH (a releasing holder unlinks it: then we must retry) */
static int still_linked(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Block on FD's lock, saying once whom we wait for. */
static int wait_for(int fd, const char *target, const char *cmd, const char *what) {
    char who[256];
    describe_holder(fd, who, sizeof who);
    fprintf(stderr, "moe2dense %s: %s: waiting for %s (%s)\n", cmd, target, who, what);
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) return m2d_err("%s.lock: cannot lock: %s", target, strerror(errno));
    return 0;
}

int m2d_lock_acquire(m2d_lock *l, const char *target, const char *cmd, const char *what, int wait) {
    l->fd = -1;
    l->path = m2d_strfmt("%s.lock", target);
    for (;;) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0) {
            m2d_err("%s: cannot open: %s", l->path, errno == ELOOP ? "it is a symbolic link" : strerror(errno));
            break;
        }
        if (check_lock_file(fd, l->path) != 0) {
            close(fd);
            break;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int busy = errno == EWOULDBLOCK;
            if (busy && !wait) {
                char who[256];
                describe_holder(fd, who, sizeof who);
                m2d_err("%s: in use by %s (%s)", target, who, what);
            } else if (!busy) {
                m2d_err("%s: cannot lock: %s", l->path, strerror(errno));
            }
            if (!busy || !wait || wait_for(fd, target, cmd, what) != 0) {
                close(fd);
                break;
            }
        }
        if (still_linked(fd, l->path)) {
            record_holder(fd);
            l->fd = fd;
            return 0;
        }
        close(fd); /* the previous holder released (and unlinked) it: take the new file */
    }
    free(l->path);
    l->path = NULL;
    return -1;
}

void m2d_lock_release(m2d_lock *l) {
    if (l->path && l->fd >= 0) { /* a zeroed L holds nothing (and fd 0 is not ours) */
        unlink(l->path);
        close(l->fd);
    }
    free(l->path);
    l->path = NULL;
    l->fd = -1;
}
