/* util — errors, allocation, files, hashing, progress: the small pieces every module uses. */
#ifndef M2D_UTIL_H
#define M2D_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/outfile.h" /* m2d_write_file_atomic and the other output helpers */

#define M2D_VERSION "0.1.0"

/* Errors: a failing function records one line (naming the file and the field)
 * with m2d_err() and returns -1 (or NULL). The command layer prints it once. A control character
 * in the message (a newline a garbled file put in a quoted value) is recorded as '?'. */
int m2d_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *m2d_errmsg(void);
/* Put "PREFIX: " in front of the recorded error (e.g. the input file a parser did not know); -1. */
int m2d_err_prefix(const char *prefix);
void m2d_err_clear(void);

/* Allocation that aborts with a message on out-of-memory (the only fatal path). */
void *m2d_malloc(size_t n);
void *m2d_calloc(size_t n, size_t size);
void *m2d_malloc64(size_t n); /* 64-byte aligned (a cache line, an AVX-512 vector); free() releases it */
void *m2d_realloc(void *p, size_t n);
char *m2d_strdup(const char *s);
char *m2d_strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *m2d_vstrfmt(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/* Every input file is opened here (or through m2d_read_file): a read-only descriptor of a regular
 * file. A directory, FIFO, socket or device is refused with one line naming PATH, without blocking
 * (a FIFO planted in place of a checkpoint would hang open() for ever). -1 + m2d_err on failure. */
int m2d_open_input(const char *path);
/* Whole-file read (NUL-terminated; *len excludes the NUL) of a regular file (m2d_open_input).
 * NULL + m2d_err on failure. */
char *m2d_read_file(const char *path, size_t *len);
/* The same for an open stream read to its end (e.g. stdin); NAME is the file named in errors. */
char *m2d_read_stream(FILE *f, const char *name, size_t *len);
int m2d_file_exists(const char *path);
/* 1 when A and B both exist and are the same file or directory (device and inode: also through
 * links and other spellings of the path): an output that is one of the run's inputs. */
int m2d_same_file(const char *a, const char *b);
int m2d_mkdir_p(const char *path);
char *m2d_path_join(const char *dir, const char *name);
/* The directory part of PATH ("." when it has none), malloc'd. */
char *m2d_path_dir(const char *path);
/* PATH without its trailing slashes, then SUFFIX (malloc'd): a file beside the directory PATH
 * ("out/" + ".importance.json" is "out.importance.json", not "out/.importance.json"). */
char *m2d_path_beside(const char *path, const char *suffix);

/* SHA-256 (FIPS 180-4), used for cache keys and data checks. */
typedef struct { uint32_t h[8]; uint64_t len; uint8_t buf[64]; size_t fill; } m2d_sha256;
void m2d_sha256_init(m2d_sha256 *s);
void m2d_sha256_update(m2d_sha256 *s, const void *data, size_t n);
void m2d_sha256_final(m2d_sha256 *s, uint8_t out[32]);
void m2d_sha256_hex(const void *data, size_t n, char out[65]);
void m2d_hex(const uint8_t *bytes, size_t n, char *out); /* out holds 2n+1 */
/* 8 bytes little-endian (the calibration hash, the stats file) */
void m2d_put_le64(uint8_t *b, uint64_t v);

/* Deterministic random numbers (random baselines, data order): splitmix64 (state += 0x9E3779B97F4A7C15,
 * then the standard finaliser); a standard normal draw by Box-Muller from two splitmix64 outputs,
 * u1 = (x1 >> 11 + 1)·2^-53 in (0, 1], u2 = (x2 >> 11)·2^-53: sqrt(-2 ln u1)·cos(2π u2) (the sine
 * half is not used, so every draw consumes exactly two outputs); FNV-1a-64 of a string (per-tensor
 * streams: seed XOR fnv1a64(name)). */
uint64_t m2d_splitmix64(uint64_t *state);
double m2d_rand_normal(uint64_t *state);
uint64_t m2d_fnv1a64(const char *s);

/* Wall clock in seconds (monotonic). */
double m2d_now(void);
/* This machine's physical memory in bytes (0 when unknown), and the default memory budget of a pass:
 * 80 % of it (the rest for the system, the page cache of the next layer, the tokenizer). */
size_t m2d_physical_ram(void);
size_t m2d_default_mem_budget(void);
/* Threads to use: $M2D_THREADS, else the number of online CPUs. */
int m2d_default_threads(void);

/* Progress with ETA on stderr. On a terminal (and $CI unset) one line redrawn in place (\r) at
 * most every 0.2 s. Otherwise (a log, CI) whole lines, rate-limited for small logs: a line when
 * at least 5 % more is done and 5 s have passed since the last one, or after 60 s with any
 * progress, and a closing "done" line when any was printed (runs under 5 s print nothing).
 * $M2D_QUIET (set by tests/run.sh) silences both. update_at takes the clock (tests). */
typedef struct {
    const char *label;
    double total, t0, last_print, last_done;
    int mode;              /* M2D_PROGRESS_OFF, _TTY or _LOG */
    int lines;             /* lines printed in _LOG mode */
} m2d_progress;
enum { M2D_PROGRESS_OFF, M2D_PROGRESS_TTY, M2D_PROGRESS_LOG };
void m2d_progress_start(m2d_progress *p, const char *label, double total);
void m2d_progress_update(m2d_progress *p, double done);
void m2d_progress_update_at(m2d_progress *p, double done, double now);
void m2d_progress_end(m2d_progress *p);

/* Minimal option parser: "--name value", "--name=value", flags, "-K value".
 * Unknown options and missing values are errors naming the command and option. */
typedef struct {
    const char *name;      /* "--model" or "-K" */
    int takes_value;       /* 1: *value set; 0: *flag set to 1 */
    const char **value;
    int *flag;
} m2d_opt;
int m2d_parse_opts(const char *cmd, int argc, char **argv, const m2d_opt *opts,
                   char **positional, int max_positional, int *n_positional);
int m2d_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
int m2d_parse_double(const char *cmd, const char *opt, const char *s, double *out);
/* A byte count: an integer or decimal with an optional K, M, G or T (powers of 1024, optional "iB"/"B"). */
int m2d_parse_bytes(const char *cmd, const char *opt, const char *s, size_t *out);

/* The registries (commands, architectures, plugins, tasks): a fixed array of pointers to structs
 * with a `const char *name` at NAME_OFFSET, kept sorted by name as constructors add to it before
 * main, so listings come out sorted whatever the link order. */
typedef struct {
    const void **items;
    int n, cap;
    size_t name_offset;    /* offsetof(T, name) */
    const char *full_msg;  /* abort message when full, e.g. "too many commands (raise MAX_COMMANDS)" */
} m2d_name_table;
void m2d_name_table_add(m2d_name_table *t, const void *item); /* aborts when full */
const void *m2d_name_table_find(const m2d_name_table *t, const char *name);
/* "a, b, c": the names in order, into BUF (truncated to CAP); returns BUF (for messages). */
const char *m2d_name_table_list(const m2d_name_table *t, char *buf, size_t cap);

#define M2D_STR_(x) #x
#define M2D_STR(x) M2D_STR_(x) /* a macro's value as a string literal */
#define M2D_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define M2D_MIN(a, b) ((a) < (b) ? (a) : (b))
#define M2D_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
