/* sweep_pipeline — the real backend: calibrate once (cached) -> convert in memory -> perplexity.
 * Wired to h-calib (m2d_stats, convert), h-engine (evals/ppl.h) as those modules land. */
#include "sweep.h"
#include "util.h"

int m2d_sweep_backend_pipeline(const m2d_experiment *x, m2d_sweep_backend *b) {
    (void)b;
    return m2d_err("experiment '%s': the conversion pipeline (calibrate/convert/ppl) is not linked into this build "
                   "yet; use backend = \"fake\" to exercise the sweep machinery", x->name);
}
