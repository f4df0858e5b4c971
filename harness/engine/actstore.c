/* actstore — residual streams in memory or in an unlinked file (see actstore.h). */
#include "engine/actstore.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

struct m2d_actstore {
    size_t rows, cols;
    float *mem;     /* in memory, or NULL */
    int fd;         /* the spill file, or -1 */
    char *path;     /* its (already unlinked) name, for errors */
};

/* a file only this process can reach: O_EXCL through mkstemp, unlinked before anything is written */
static int spill_file(m2d_actstore *s, const char *dir) {
    if (!dir) dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    s->path = m2d_strfmt("%s/.m2d-activations-XXXXXX", dir);
    s->fd = mkstemp(s->path);
    if (s->fd < 0) return m2d_err("%s: cannot create the activation spill file: %s", s->path, strerror(errno));
    unlink(s->path);
    off_t bytes = (off_t)(s->rows * s->cols * sizeof(float));
    if (ftruncate(s->fd, bytes) != 0)
        return m2d_err("%s: cannot size the activation spill file to %lld bytes: %s", s->path, (long long)bytes,
                       strerror(errno));
    return 0;
}

m2d_actstore *m2d_actstore_open(size_t rows, size_t cols, size_t mem_budget, const char *dir) {
    m2d_actstore *s = m2d_calloc(1, sizeof *s);
    s->rows = rows, s->cols = cols, s->fd = -1;
    size_t bytes = rows * cols * sizeof(float);
    if (bytes <= mem_budget) {
        s->mem = m2d_malloc(bytes ? bytes : 1);
        return s;
    }
    if (spill_file(s, dir) == 0) return s;
    m2d_actstore_free(s);
    return NULL;
}

/* the whole transfer of N bytes at OFF (pread/pwrite may move less than asked) */
static int file_io(m2d_actstore *s, int write, void *buf, size_t n, off_t off) {
    for (size_t done = 0; done < n;) {
        ssize_t k = write ? pwrite(s->fd, (const char *)buf + done, n - done, off + (off_t)done)
                          : pread(s->fd, (char *)buf + done, n - done, off + (off_t)done);
        if (k <= 0)
            return m2d_err("%s: activation spill file: %s failed: %s", s->path, write ? "write" : "read",
                           k == 0 ? "unexpected end of file" : strerror(errno));
        done += (size_t)k;
    }
    return 0;
}

static int move(m2d_actstore *s, int write, size_t row0, size_t n, float *buf) {
    if (row0 + n > s->rows) return m2d_err("actstore: rows [%zu, %zu) outside %zu", row0, row0 + n, s->rows);
    size_t off = row0 * s->cols, len = n * s->cols * sizeof(float);
    if (s->mem) {
        if (write) memcpy(s->mem + off, buf, len);
        else memcpy(buf, s->mem + off, len);
        return 0;
    }
    return file_io(s, write, buf, len, (off_t)(off * sizeof(float)));
}

int m2d_actstore_get(m2d_actstore *s, size_t row0, size_t n, float *dst) { return move(s, 0, row0, n, dst); }
int m2d_actstore_put(m2d_actstore *s, size_t row0, size_t n, const float *src) {
    return move(s, 1, row0, n, (float *)src);
}
int m2d_actstore_spilled(const m2d_actstore *s) { return s->mem == NULL; }

void m2d_actstore_free(m2d_actstore *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s->mem);
    free(s->path);
    free(s);
}
