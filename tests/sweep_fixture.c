/* sweep_fixture — fake teacher + experiments file in a temporary directory (see sweep_fixture.h). */
#include "sweep_fixture.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "testutil.h"

/* TEXT with every "MODEL" replaced by MODEL (malloc'd) */
static char *substitute_model(const char *text, const char *model) {
    char *out = m2d_strdup("");
    for (const char *at = text;;) {
        const char *m = strstr(at, "MODEL");
        char *next = m ? m2d_strfmt("%s%.*s%s", out, (int)(m - at), at, model) : m2d_strfmt("%s%s", out, at);
        free(out);
        out = next;
        if (!m) return out;
        at = m + 5;
    }
}

tu_sweep_fixture tu_sweep_fixture_make(const char *config_json, const char *experiments) {
    tu_sweep_fixture fx;
    fx.dir = tu_tmpdir();
    fx.model = m2d_path_join(fx.dir, "teacher");
    assert_int_equal(m2d_mkdir_p(fx.model), 0);
    char *cfg = m2d_path_join(fx.model, "config.json");
    tu_write(cfg, config_json, strlen(config_json));
    free(cfg);
    char *text = substitute_model(experiments, fx.model);
    fx.toml = m2d_path_join(fx.dir, "experiments.toml");
    tu_write(fx.toml, text, strlen(text));
    free(text);
    fx.csv = m2d_path_join(fx.dir, "results.csv");
    return fx;
}

void tu_sweep_fixture_free(tu_sweep_fixture *fx) {
    tu_rm_rf(fx->dir);
    free(fx->dir);
    free(fx->model);
    free(fx->toml);
    free(fx->csv);
}
