#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char err_buf[1024];

int m2d_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    /* an error is one line, whatever a file put into the values it quotes: a control character
     * (a newline in a garbled field, an escape sequence) is shown as '?' */
    for (unsigned char *p = (unsigned char *)err_buf; *p; p++)
        if (*p < 0x20 || *p == 0x7f) *p = '?';
    return -1;
}

const char *m2d_errmsg(void) { return err_buf[0] ? err_buf : "unknown error"; }
void m2d_err_clear(void) { err_buf[0] = 0; }

int m2d_err_prefix(const char *prefix) {
    char *msg = m2d_strdup(m2d_errmsg()); /* m2d_err overwrites the buffer it would read */
    m2d_err("%s: %s", prefix, msg);
    free(msg);
    return -1;
}

static void oom(size_t n) {
    fprintf(stderr, "moe2dense: out of memory allocating %zu bytes\n", n);
    abort();
}

void *m2d_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *m2d_malloc64(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0) oom(n);
    return p;
}

void *m2d_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *m2d_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *m2d_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = m2d_malloc(n);
    memcpy(d, s, n);
    return d;
}

char *m2d_vstrfmt(const char *fmt, va_list ap) {
    va_list again; /* AP is consumed by the sizing pass */
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *s = m2d_malloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, again);
    va_end(again);
    return s;
}

char *m2d_strfmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = m2d_vstrfmt(fmt, ap);
    va_end(ap);
    return s;
}

char *m2d_read_stream(FILE *f, const char *name, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = m2d_malloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = m2d_realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        m2d_err("%s: read error", name);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

int m2d_open_input(const char *path) {
    /* O_NONBLOCK: a FIFO (or a device) planted in place of a file would block open() for ever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return m2d_err("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    const char *bad = fstat(fd, &st) != 0 ? strerror(errno)
                      : S_ISDIR(st.st_mode) ? "is a directory, not a file"
                      : !S_ISREG(st.st_mode) ? "not a regular file (a FIFO, socket or device); refusing to read it"
                      : NULL;
    if (!bad && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) bad = strerror(errno);
    if (bad) {
        close(fd);
        return m2d_err("%s: %s", path, bad);
    }
    return fd;
}

char *m2d_read_file(const char *path, size_t *len) {
    int fd = m2d_open_input(path);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        if (fd >= 0) close(fd), m2d_err("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = m2d_read_stream(f, path, len);
    fclose(f);
    return buf;
}

int m2d_same_file(const char *a, const char *b) {
    struct stat x, y;
    return a && b && stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int m2d_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int m2d_mkdir_p(const char *path) {
    char *p = m2d_strdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) goto fail;
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) goto fail;
    free(p);
    return 0;
fail:
    m2d_err("%s: cannot create directory: %s", p, strerror(errno));
    free(p);
    return -1;
}

char *m2d_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir);
    if (n && dir[n - 1] == '/') return m2d_strfmt("%s%s", dir, name);
    return m2d_strfmt("%s/%s", dir, name);
}

/* ---- SHA-256 ---- */
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(m2d_sha256 *s, const uint8_t *b) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], bb = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += bb; s->h[2] += c; s->h[3] += d;
    s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

void m2d_sha256_init(m2d_sha256 *s) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0;
    s->fill = 0;
}

void m2d_sha256_update(m2d_sha256 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->len += n;
    if (s->fill == 0) { /* hash whole blocks in place, no copy */
        for (; n >= 64; p += 64, n -= 64) sha256_block(s, p);
    }
    while (n > 0) {
        size_t take = M2D_MIN(n, 64 - s->fill);
        memcpy(s->buf + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill == 64) {
            sha256_block(s, s->buf);
            s->fill = 0;
        }
    }
}

void m2d_sha256_final(m2d_sha256 *s, uint8_t out[32]) {
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80;
    m2d_sha256_update(s, &pad, 1);
    uint8_t zero = 0;
    while (s->fill != 56) m2d_sha256_update(s, &zero, 1);
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    m2d_sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void m2d_hex(const uint8_t *bytes, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = 0;
}

void m2d_put_le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

void m2d_sha256_hex(const void *data, size_t n, char out[65]) {
    m2d_sha256 s;
    uint8_t d[32];
    m2d_sha256_init(&s);
    m2d_sha256_update(&s, data, n);
    m2d_sha256_final(&s, d);
    m2d_hex(d, 32, out);
}

uint64_t m2d_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double m2d_rand_normal(uint64_t *state) {
    double u1 = ((double)(m2d_splitmix64(state) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(m2d_splitmix64(state) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

uint64_t m2d_fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

double m2d_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int m2d_default_threads(void) {
    const char *env = getenv("M2D_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- progress ---- */
#define PROGRESS_TTY_S 0.2   /* terminal redraw interval */
#define PROGRESS_LOG_MIN_S 5.0
#define PROGRESS_LOG_MAX_S 60.0
#define PROGRESS_LOG_STEP 0.05

static int progress_mode(void) {
    if (getenv("M2D_QUIET")) return M2D_PROGRESS_OFF;
    if (!isatty(STDERR_FILENO)) return M2D_PROGRESS_LOG;
    return getenv("CI") ? M2D_PROGRESS_OFF : M2D_PROGRESS_TTY;
}

void m2d_progress_start(m2d_progress *p, const char *label, double total) {
    p->label = label;
    p->total = total;
    p->t0 = m2d_now();
    p->last_done = 0;
    p->lines = 0;
    p->mode = progress_mode();
    p->last_print = p->mode == M2D_PROGRESS_TTY ? 0 : p->t0;
}

static void format_secs(double s, char *buf, size_t n) {
    if (s < 0 || s != s) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* Is a line due at NOW with DONE of the work done? */
static int progress_due(const m2d_progress *p, double done, double now) {
    double since = now - p->last_print;
    if (p->mode == M2D_PROGRESS_TTY) return since >= PROGRESS_TTY_S || done >= p->total;
    if (done <= p->last_done) return 0;
    return since >= PROGRESS_LOG_MAX_S ||
           (since >= PROGRESS_LOG_MIN_S && done - p->last_done >= PROGRESS_LOG_STEP * p->total);
}

void m2d_progress_update_at(m2d_progress *p, double done, double now) {
    if (p->mode == M2D_PROGRESS_OFF || !progress_due(p, done, now)) return;
    p->last_print = now;
    p->last_done = done;
    double el = now - p->t0;
    double frac = p->total > 0 ? done / p->total : 0;
    char eta[32], elapsed[32];
    format_secs(frac > 0 ? el * (1 - frac) / frac : 0, eta, sizeof eta);
    format_secs(el, elapsed, sizeof elapsed);
    int tty = p->mode == M2D_PROGRESS_TTY;
    fprintf(stderr, "%s%s %.0f/%.0f (%.1f%%) elapsed %s ETA %s%s", tty ? "\r\033[K" : "", p->label, done,
            p->total, 100 * frac, elapsed, eta, tty ? "" : "\n");
    p->lines += !tty;
    fflush(stderr);
}

void m2d_progress_update(m2d_progress *p, double done) { m2d_progress_update_at(p, done, m2d_now()); }

void m2d_progress_end(m2d_progress *p) {
    if (p->mode == M2D_PROGRESS_TTY) fprintf(stderr, "\r\033[K");
    if (p->mode == M2D_PROGRESS_LOG && p->lines > 0) {
        char elapsed[32];
        format_secs(m2d_now() - p->t0, elapsed, sizeof elapsed);
        fprintf(stderr, "%s done in %s\n", p->label, elapsed);
    }
    fflush(stderr);
    p->mode = M2D_PROGRESS_OFF;
}

/* ---- options ---- */
int m2d_parse_opts(const char *cmd, int argc, char **argv, const m2d_opt *opts,
                   char **positional, int max_positional, int *n_positional) {
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == 0) {
            if (npos >= max_positional) return m2d_err("%s: unexpected argument '%s'", cmd, a);
            positional[npos++] = argv[i];
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const m2d_opt *o = NULL;
        for (const m2d_opt *q = opts; q && q->name; q++)
            if (strlen(q->name) == nlen && strncmp(q->name, a, nlen) == 0) o = q;
        if (!o) return m2d_err("%s: unknown option '%.*s' (see 'moe2dense help %s')", cmd, (int)nlen, a, cmd);
        if (!o->takes_value) {
            if (eq) return m2d_err("%s: option '%s' takes no value", cmd, o->name);
            *o->flag = 1;
        } else if (eq) {
            *o->value = eq + 1;
        } else {
            if (i + 1 >= argc) return m2d_err("%s: option '%s' needs a value", cmd, o->name);
            *o->value = argv[++i];
        }
    }
    if (n_positional) *n_positional = npos;
    return 0;
}

int m2d_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return m2d_err("%s: %s: '%s' is not an integer in [%ld, %ld]", cmd, opt, s, lo, hi);
    *out = v;
    return 0;
}

int m2d_parse_double(const char *cmd, const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return m2d_err("%s: %s: '%s' is not a number", cmd, opt, s);
    *out = v;
    return 0;
}

static const char *name_at(const m2d_name_table *t, int i) {
    return *(const char *const *)((const char *)t->items[i] + t->name_offset);
}

void m2d_name_table_add(m2d_name_table *t, const void *item) {
    if (t->n == t->cap) {
        fprintf(stderr, "moe2dense: %s\n", t->full_msg);
        abort();
    }
    int i = t->n++; /* insertion keeps the table sorted by name */
    t->items[i] = item;
    const char *name = name_at(t, i);
    while (i > 0 && strcmp(name_at(t, i - 1), name) > 0) {
        t->items[i] = t->items[i - 1];
        i--;
    }
    t->items[i] = item;
}

const char *m2d_name_table_list(const m2d_name_table *t, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < t->n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", name_at(t, i));
    return buf;
}

const void *m2d_name_table_find(const m2d_name_table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(name_at(t, i), name) == 0) return t->items[i];
    return NULL;
}

size_t m2d_physical_ram(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
}

size_t m2d_default_mem_budget(void) {
    size_t ram = m2d_physical_ram();
    return ram ? ram / 5 * 4 : (size_t)8 << 30;
}

int m2d_parse_bytes(const char *cmd, const char *opt, const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    int shift = 0, number = end != s;
    const char *units = "KMGT", *u = number && *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (u) shift = 10 * (int)(u - units + 1), end++;
    if (u && *end == 'i') end++;
    if (number && (*end == 'B' || *end == 'b')) end++;
    if (!number || *end || errno || !(v >= 0) || ldexp(v, shift) >= 0x1p63)
        return m2d_err("%s: option %s: '%s' is not a byte count (e.g. 20G, 512M)", cmd, opt, s);
    *out = (size_t)ldexp(v, shift);
    return 0;
}

char *m2d_path_beside(const char *path, const char *suffix) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    return m2d_strfmt("%.*s%s", (int)n, path, suffix);
}

char *m2d_path_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return m2d_strdup(".");
    if (slash == path) return m2d_strdup("/");
    char *d = m2d_strdup(path);
    d[slash - path] = 0;
    return d;
}
