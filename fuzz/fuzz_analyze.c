/* libFuzzer target for the `analyze --csv` reader (what make plots draws from): any input parses
 * or fails with one error line naming the file; an accepted file holds only validated names and
 * numbers in range, so nothing it carries can become gnuplot code. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/analyze_csv.h"
#include "io/results.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* what a criterion / other field may hold: empty, a name, an expert index, or S(b;a;c) */
static int safe_field(const char *s) {
    if (!s[0] || m2d_results_is_name(s)) return 1;
    if (strspn(s, "0123456789") == strlen(s) && strlen(s) <= 6) return 1;
    return strlen(s) == 8 && s[0] == 'S' && s[1] == '(' && strspn(s + 2, "012;") == 5 && s[7] == ')';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_an_csv a;
    if (m2d_an_csv_parse("fuzz.csv", (const char *)data, size, &a) != 0) {
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz.csv", 8) != 0 || strchr(msg, '\n')) abort();
        return 0;
    }
    if (a.K < 0 || a.K > 65536) abort();
    for (int i = 0; i < a.n; i++) {
        const m2d_an_row *r = &a.rows[i];
        int na_ok = r->metric == M2D_AN_THM33_GAP || r->metric == M2D_AN_CALIB_25 || r->metric == M2D_AN_CALIB_50;
        if (!(isfinite(r->value) || (na_ok && isnan(r->value)))) abort();
        if (!safe_field(r->criterion) || !safe_field(r->other)) abort();
        if (r->metric == M2D_AN_OVERLAP && (!m2d_results_is_name(r->other) || r->value < 0 || r->value > 1)) abort();
        if (r->metric != M2D_AN_OVERLAP && r->metric != M2D_AN_PEARSON && r->other[0]) abort();
    }
    m2d_an_csv_free(&a);
    return 0;
}
