/* report_table — see report_table.h. */
#include "sweep/report_table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "criteria/registry.h"

/* ---- names and number formatting ---- */

/* names come from the plugin registrations (criteria/registry.h: display, report_rank) */
const char *m2d_report_display_name(const char *name) { return m2d_plugin_display_name(name); }

int m2d_report_name_order(const char *name) {
    int rank = m2d_plugin_report_rank(name);
    return rank > 0 ? rank - 1 : 1000;
}

void m2d_report_thousands(long long v, char *buf, size_t n) {
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", v);
    size_t len = strlen(digits), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
}

void m2d_report_format_ppl(double v, char *buf, size_t n) {
    if (!isfinite(v)) snprintf(buf, n, "\xe2\x80\x93"); /* en dash, as in the paper */
    else if (v < 99.995) snprintf(buf, n, "%.2f", v);
    else if (v < 999.95) snprintf(buf, n, "%.1f", v);
    else if (v < 99999.5) m2d_report_thousands(llround(v), buf, n);
    else if (v < 999500) snprintf(buf, n, "%.0fk", v / 1e3);
    else if (v < 999.95e6) snprintf(buf, n, "%.1fm", v / 1e6);
    else snprintf(buf, n, "%.1fb", v / 1e9);
}

/* ---- table ---- */

/* LaTeX's specials escaped; the one non-ASCII letter the tables use, Δ (UTF-8 CE 94), as math, so
 * the table compiles without unicode input */
void m2d_report_tex_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (s[0] == '\xce' && s[1] == '\x94') {
            fputs("$\\Delta$", f);
            s++;
            continue;
        }
        if (strchr("&%$#_{}", *s)) fputc('\\', f);
        fputc(*s, f);
    }
}

/* ---- table rows shared by the report's sections ---- */

void m2d_report_csv_cell(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) return (void)fputs(s, f);
    fputc('"', f);
    for (; *s; s++) fputs(*s == '"' ? "\"\"" : (char[2]){*s, 0}, f);
    fputc('"', f);
}

void m2d_report_cells(const m2d_report_out *o, const char *const *cells, int n, const unsigned char *bold) {
    if (o->fmt == M2D_REPORT_CSV) {
        for (int i = 0; i < n; i++) fputs(i ? "," : "", o->f), m2d_report_csv_cell(o->f, cells[i]);
        return (void)fputc('\n', o->f);
    }
    for (int i = 0; i < n; i++) {
        int b = bold && bold[i] && cells[i][0];
        if (o->fmt == M2D_REPORT_MD) fprintf(o->f, "%s %s%s%s", i ? " |" : "|", b ? "**" : "", cells[i], b ? "**" : "");
        else {
            if (i) fputs(" & ", o->f);
            fputs(b ? "\\textbf{" : "", o->f);
            m2d_report_tex_escape(o->f, cells[i]);
            fputs(b ? "}" : "", o->f);
        }
    }
    fputs(o->fmt == M2D_REPORT_MD ? " |\n" : " \\\\\n", o->f);
}

void m2d_report_header(const m2d_report_out *o, const char *const *cells, int n, int names) {
    if (o->fmt == M2D_REPORT_TEX) {
        fputs("\\begin{tabular}{", o->f);
        for (int i = 0; i < n; i++) fputc(i < names ? 'l' : 'r', o->f);
        fputs("}\n\\toprule\n", o->f);
    }
    m2d_report_cells(o, cells, n, NULL);
    if (o->fmt == M2D_REPORT_TEX) {
        fputs("\\midrule\n", o->f);
        return;
    }
    if (o->fmt == M2D_REPORT_CSV) return;
    for (int i = 0; i < n; i++) fputs(i < names ? "|---" : "|---:", o->f);
    fputs("|\n", o->f);
}

void m2d_report_end(const m2d_report_out *o) {
    fputs(o->fmt == M2D_REPORT_TEX ? "\\bottomrule\n\\end{tabular}\n" : "", o->f);
}

/* ---- the run header ---- */

/* The teacher's own PPL and its windows from the run header ("teacher_ppl=812.5 windows=8", the
 * sweep's measurement on the students' windows); 0 when the file has none. */
int m2d_report_teacher_ppl(const m2d_results *r, double *ppl, int *windows) {
    const char *t = m2d_results_meta(r, "teacher_ppl");
    return t && sscanf(t, "%lf windows=%d", ppl, windows) == 2;
}

int m2d_report_teacher_shape(const m2d_results *r, int *k) {
    const char *t = m2d_results_meta(r, "teacher");
    int E = 0;
    *k = 0;
    if (!t || sscanf(t, "E=%d k=%d", &E, k) != 2 || E <= 0 || *k <= 0) E = *k = 0;
    return E;
}

double m2d_report_teacher_mc(const m2d_results *r, const char *key, const char *col) {
    const char *v = m2d_results_meta(r, key);
    size_t n = strlen(col);
    for (const char *p = v; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, col, n) || p[n] != ':') continue;
        char *end;
        double d = strtod(p + n + 1, &end);
        return end != p + n + 1 && (*end == ',' || *end == 0) ? d : NAN;
    }
    return NAN;
}

void m2d_report_format_teacher_acc(double v, m2d_report_format fmt, char *buf, size_t n) {
    if (isfinite(v)) snprintf(buf, n, "%.2f", 100 * v);
    else snprintf(buf, n, "%s", fmt == M2D_REPORT_MD ? "\xe2\x80\x94" : fmt == M2D_REPORT_TEX ? "---" : "");
}

/* ---- plot data ---- */

/* A plot-data file: built in memory, then written atomically (base/outfile.h) into DIR. */
FILE *m2d_report_file_open(m2d_report_file *p, const char *dir, const char *name) {
    p->path = m2d_path_join(dir, name);
    p->buf = NULL;
    p->f = open_memstream(&p->buf, &p->len);
    return p->f;
}

int m2d_report_file_close(m2d_report_file *p) {
    fclose(p->f);
    int rc = m2d_write_file_atomic(p->path, p->buf, p->len);
    free(p->buf);
    free(p->path);
    return rc;
}
