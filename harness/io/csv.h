/* csv — a strict RFC 4180 reader that knows where each field starts, so that every error names
 * FILE:LINE:COLUMN. Records end at '\n' or "\r\n"; fields are separated by ','; a quoted field
 * may hold ',', newlines and '"' (written ""). Spaces and tabs around an unquoted field are
 * dropped (as libcsv, which writes these files, does when reading). Refused: a quote inside an
 * unquoted field, text after a closing quote, an unterminated quoted field, NUL bytes. Columns
 * are 1-based byte offsets within the line. Empty lines are skipped. */
#ifndef M2D_CSV_H
#define M2D_CSV_H

#include <stddef.h>

/* Called once per record: FIELDS[0..n) are malloc'd NUL-terminated strings whose ownership
 * passes to the callback (the array itself is reused: copy the pointers), COLS their start
 * columns, LINE the record's first line. Return 0 to go on, -1 to stop (with m2d_err set). */
typedef int (*m2d_csv_record_fn)(void *user, char **fields, const int *cols, int n, int line);

/* Parse TEXT[0..len) (the part of file NAME that starts at line FIRST_LINE). 0, or -1 + m2d_err
 * "NAME:LINE:COL: malformed CSV: ..." (or the callback's error). A final record without a
 * trailing newline is delivered too. */
int m2d_csv_parse(const char *name, const char *text, size_t len, int first_line, m2d_csv_record_fn fn,
                  void *user);

#endif
