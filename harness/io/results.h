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
 * next open drops it (truncate) before appending; a reader running alongside the writer sees it
 * the same way (skipped). A failed append (disk full) is cut back off the file. The writer
 * never opens the file through a symbolic link, and the caller holds the file's lock (sweep).
 *
 * Row validation (m2d_results_validate; report, resume, merge and the MC stage read through
 * m2d_results_read_checked): each column the sweep writes has a rule, found by name:
 *   config_id          12 lowercase hex digits, unique in the file (in a distillation ablation's
 *                      sidecar: unique per loss and teacher_topk)
 *   scoring grouping scaling ppl_protocol   a plugin-style name [a-z0-9][a-z0-9_.+-]*, < 32 chars
 *   K_expr             k, Nk, E, E/N, N or (1-R)E (an MoE target at ratio R);   K ppl_seq_len   an integer >= 1
 *   target ratio top_k (grids with MoE students)   dense or moe; empty or a fraction in [0, 1);
 *                      empty or an integer >= 1
 *   params             printable text < 128 chars
 *   d_dense ppl_windows  empty or an integer >= 1; n_params the same, of at most 18 digits
 *                      (the other counts, read as int, at most 2147483647)
 *   ppl                empty or a finite number >= 1 (a perplexity); required when status is ok
 *   TASK_acc TASK_acc_norm mc_avg  empty or a number in [0, 1]
 *   wall_s             a finite number >= 0
 *   status             "ok" or "failed: REASON"
 *   dedup_of           empty or the config_id of another row of the file
 *   fingerprint        empty or 64 lowercase hex digits
 * Other columns are free text. Errors name PATH:LINE:COLUMN and the field. */
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
    int *row_line;                  /* [n_rows] line of each row in the file (NULL: built in memory) */
    int *field_col;                 /* [n_rows * n_cols] column where each field starts (or NULL) */
    char *path;                     /* the file it was read from (NULL: built in memory) */
} m2d_results;

/* Read PATH. A torn last line is skipped (torn_bytes says how long it was); a complete row with
 * the wrong field count, or malformed CSV, is an error naming PATH:LINE:COLUMN. */
int m2d_results_read(const char *path, m2d_results *r);
/* The same from memory (NAME is the file named in errors). */
int m2d_results_parse(const char *name, const char *text, size_t len, m2d_results *r);
/* Every row against the rules above: 0, or -1 + m2d_err "PATH:LINE:COL: field 'F': ...". */
int m2d_results_validate(const m2d_results *r, const char *path);
/* 1 when S is a plugin-style name, [a-z0-9][a-z0-9_.+-]* of fewer than 32 characters: what the
 * scoring/grouping/scaling cells and the grid's axis values must be (safe in file names and in
 * generated plot scripts). */
int m2d_results_is_name(const char *s);
/* m2d_results_read + m2d_results_validate (R is freed on a validation error). */
int m2d_results_read_checked(const char *path, m2d_results *r);
void m2d_results_free(m2d_results *r);
/* Drop the rows of R for which KEEP(R, row, CTX) is 0 (freed; the others keep their order, line
 * numbers and field columns); returns how many went. */
int m2d_results_keep_rows(m2d_results *r, int (*keep)(const m2d_results *r, int row, void *ctx), void *ctx);
int m2d_results_col(const m2d_results *r, const char *name);  /* -1 when absent */
/* The file R was read from, for messages ("results" when built in memory) */
const char *m2d_results_name(const m2d_results *r);
const char *m2d_results_get(const m2d_results *r, int row, const char *name); /* "" when absent */
const char *m2d_results_meta(const m2d_results *r, const char *key);         /* NULL when absent */
/* Set header KEY to VALUE (copied): replaced where R has KEY, else appended last. */
void m2d_results_set_meta(m2d_results *r, const char *key, const char *value);

typedef struct {
    int fd;
    char *path;
    int n_cols;
} m2d_results_writer;

/* Open PATH for appending rows with columns COLS. A missing file is created with the META lines
 * ("key=value") and the column row. An existing file must have the same columns, the same
 * values for each meta key listed IDENTITY (a key absent from both matches; "+KEY": a key added later,
 * which a file without it is not checked for) and valid rows (else: error, nothing written); a torn
 * last line is truncated away. *existing (if not NULL) receives the rows already there. */
int m2d_results_open(const char *path, const char *const *cols, int n_cols, const char *const *meta, int n_meta,
                     const char *const *identity, int n_identity, m2d_results_writer *w, m2d_results *existing);
/* Append one row atomically (single write of the full line, fsync; on a failure the file is cut
 * back to where it was). Fields must not contain newlines (they are replaced by spaces).
 * Callers serialise appends to one writer (the sweep's pool does). */
int m2d_results_append(m2d_results_writer *w, const char *const *fields);
void m2d_results_close(m2d_results_writer *w);

/* Format a CSV line (libcsv quoting where needed) into a malloc'd string ending in '\n'. */
char *m2d_results_format_line(const char *const *fields, int n);
/* Write a whole results file atomically (merge, filtered rewrites). */
int m2d_results_write(const char *path, const m2d_results *r);

#endif
