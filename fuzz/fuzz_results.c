/* libFuzzer target for the results CSV reader and the row validator (report, resume, merge read
 * every sweep CSV through them): any input parses or fails with one error line naming the file,
 * never crashes, leaks or reads out of bounds; a validated file's numbers are what the rules say. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/results.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line_naming(const char *name) {
    const char *msg = m2d_errmsg();
    if (strncmp(msg, name, strlen(name)) != 0 || strchr(msg, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_results r;
    if (m2d_results_parse("fuzz.csv", (const char *)data, size, &r) != 0) {
        one_line_naming("fuzz.csv");
        return 0;
    }
    if (r.torn_bytes > size) abort();
    if (m2d_results_validate(&r, "fuzz.csv") != 0) {
        one_line_naming("fuzz.csv:");
    } else {
        /* what the validator promises, checked on what it let through */
        for (int i = 0; i < r.n_rows; i++) {
            const char *ppl = m2d_results_get(&r, i, "ppl");
            if (ppl[0] && !(strtod(ppl, NULL) >= 1 && isfinite(strtod(ppl, NULL)))) abort();
            const char *st = m2d_results_get(&r, i, "status");
            if (m2d_results_col(&r, "status") >= 0 && strcmp(st, "ok") && strncmp(st, "failed: ", 8)) abort();
            const char *sc = m2d_results_get(&r, i, "scoring");
            if (m2d_results_col(&r, "scoring") >= 0 && !m2d_results_is_name(sc)) abort();
        }
    }
    m2d_results_free(&r);
    return 0;
}
