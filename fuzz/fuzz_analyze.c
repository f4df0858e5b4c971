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
        if (!isfinite(r->value) || !m2d_results_is_name(r->criterion)) abort();
        if (r->metric == M2D_AN_OVERLAP && (!m2d_results_is_name(r->other) || r->value < 0 || r->value > 1)) abort();
        if (r->metric != M2D_AN_OVERLAP && r->other[0]) abort();
    }
    m2d_an_csv_free(&a);
    return 0;
}
