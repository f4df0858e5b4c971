/* toml — a small, strict parser for the TOML subset experiments.toml uses.
 *
 * Supported: tables [a.b], arrays of tables [[a]], bare / quoted / dotted keys, basic strings
 * (with \b \t \n \f \r \" \\ \uXXXX \UXXXXXXXX escapes), literal strings, integers (decimal,
 * optional sign and '_' separators), floats (fraction / exponent, inf, nan), booleans, arrays
 * (multi-line, nested, trailing comma, comments inside) and inline tables { k = v }.
 * Not supported (a clear error): multi-line strings, dates/times, hex/octal/binary integers.
 * Strict: duplicate keys, redefined tables, extending inline tables or static arrays, and
 * trailing garbage are errors. Every error reads "PATH:LINE:COL: message". */
#ifndef M2D_TOML_H
#define M2D_TOML_H

#include <stddef.h>
#include <stdint.h>

typedef enum { M2D_TOML_STRING, M2D_TOML_INT, M2D_TOML_FLOAT, M2D_TOML_BOOL, M2D_TOML_ARRAY,
               M2D_TOML_TABLE } m2d_toml_type;

typedef struct m2d_toml m2d_toml;
struct m2d_toml {
    m2d_toml_type type;
    int line, col;          /* where the value (or the table header) starts; 0: from --set */
    char *str;              /* STRING */
    int64_t i;              /* INT, BOOL (0/1) */
    double f;               /* FLOAT */
    int n, cap;             /* ARRAY / TABLE: element count */
    char **keys;            /* TABLE: key of items[j] */
    m2d_toml **items;       /* ARRAY / TABLE elements */
    int flags;              /* parser bookkeeping (explicit / implicit / inline / array of tables) */
};

/* Parse text; PATH is used in error messages only. NULL + m2d_err on error. */
m2d_toml *m2d_toml_parse(const char *text, size_t len, const char *path);
m2d_toml *m2d_toml_load(const char *path);
void m2d_toml_free(m2d_toml *t);

/* Look-ups (NULL when absent or t is not a table). m2d_toml_path accepts "a.b.c". */
const m2d_toml *m2d_toml_get(const m2d_toml *t, const char *key);
const m2d_toml *m2d_toml_path(const m2d_toml *t, const char *dotted);
const char *m2d_toml_type_name(m2d_toml_type t);

/* Set (replace or create) DOTTED in table ROOT from a command-line string VALUE: VALUE is
 * parsed as a TOML value when it is one (8, 1.5, true, "x", [1, 2]), else taken as a string.
 * Intermediate tables are created. Used by `--set key=value`. The value's nodes get line = col
 * = 0 (they are in no file: messages about them name "--set", not a file position). */
int m2d_toml_set(m2d_toml *root, const char *dotted, const char *value);

#endif
