/* libFuzzer target for the experiments.toml parser (built by `make fuzz`): any input must parse or
 * fail with one error line, never crash, leak or read out of bounds; a parsed document's look-ups
 * and --set overrides must work too. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/toml.h"
#include "base/util.h"

static void walk(const m2d_toml *t, int depth) {
    if (!t || depth > 80) return;
    if (t->type == M2D_TOML_TABLE)
        for (int i = 0; i < t->n; i++) {
            (void)m2d_toml_get(t, t->keys[i]);
            walk(t->items[i], depth + 1);
        }
    else if (t->type == M2D_TOML_ARRAY)
        for (int i = 0; i < t->n; i++) walk(t->items[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_toml *t = m2d_toml_parse((const char *)data, size, "fuzz.toml");
    if (!t) {
        /* errors are one line naming the file */
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz.toml:", 10) != 0 || strchr(msg, '\n')) __builtin_trap();
        return 0;
    }
    walk(t, 0);
    (void)m2d_toml_path(t, "experiment.demo.axes.K");
    /* the input's first line, used as a --set value */
    size_t n = 0;
    while (n < size && n < 200 && data[n] != '\n' && data[n] != 0) n++;
    char value[201];
    memcpy(value, data, n);
    value[n] = 0;
    m2d_toml_set(t, "experiment.x.value", value);
    m2d_toml_free(t);
    return 0;
}
