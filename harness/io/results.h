/* results — the sweep's CSV: crash-safe appends, tolerant reads, resume.
 *
 * File layout (RFC 4180 CSV, written and read with libcsv):
 *   # moe2dense-results=1            leading '#' lines: the run header, "key=value" each
 *   # experiment=demo                (pandas: read_csv(path, comment='#'))
 *   # model_hash=...  calib_hash=...  version=...  host=...  started=...
 *   config_id,scoring,...            the column header row
 *   <one row per configuration>
 * The header (comments + column row) is created atomically (temp file + rename). Each row is
 * appended with ONE write() of the complete line on an O_APPEND descriptor, then fsync, so a
 * crash (even SIGKILL) leaves at most one torn last line: it has no trailing newline, and the
 * next open drops it (truncate) before appending. */
#ifndef M2D_RESULTS_H
#define M2D_RESULTS_H

#include <stddef.h>

typedef struct {
    int n_meta;
    char **meta_keys, **meta_vals;  /* from "# key=value" lines, in order */
    int n_cols;
    char **cols;
    int n_rows;
    char ***rows;                   /* rows[r][c] (n_cols each), NUL-terminated strings */
    size_t torn_bytes;              /* bytes after the last newline (a torn row), not part of rows */
} m2d_results;

/* Read PATH. A torn last line is skipped (torn_bytes says how long it was); a complete row with
 * the wrong field count is an error naming the line. */
int m2d_results_read(const char *path, m2d_results *r);
void m2d_results_free(m2d_results *r);
int m2d_results_col(const m2d_results *r, const char *name);  /* -1 when absent */
const char *m2d_results_get(const m2d_results *r, int row, const char *name); /* "" when absent */
const char *m2d_results_meta(const m2d_results *r, const char *key);         /* NULL when absent */

typedef struct {
    int fd;
    char *path;
    int n_cols;
} m2d_results_writer;

/* Open PATH for appending rows with columns COLS. A missing file is created with the META lines
 * ("key=value") and the column row. An existing file must have the same columns and the same
 * values for each meta key listed in IDENTITY (else: error, nothing written); a torn last line
 * is truncated away. *existing (if not NULL) receives the rows already there. */
int m2d_results_open(const char *path, const char *const *cols, int n_cols, const char *const *meta, int n_meta,
                     const char *const *identity, int n_identity, m2d_results_writer *w, m2d_results *existing);
/* Append one row atomically (single write of the full line, fsync). Fields must not contain
 * newlines (they are replaced by spaces). Thread-safe for distinct rows. */
int m2d_results_append(m2d_results_writer *w, const char *const *fields);
void m2d_results_close(m2d_results_writer *w);

/* Format a CSV line (libcsv quoting where needed) into a malloc'd string ending in '\n'. */
char *m2d_results_format_line(const char *const *fields, int n);
/* Write a whole results file atomically (merge, filtered rewrites). */
int m2d_results_write(const char *path, const m2d_results *r);

#endif
