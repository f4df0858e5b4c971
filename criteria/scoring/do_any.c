/* do-X for any scoring X without its own selection: X's scores (so merging and proportional
 * scaling see X's importances) with D-optimal selection over them (criteria/dopt.h). Made on
 * demand by the registry from this factory: "do-reap", "do-man", ... need no file of their own;
 * do-cp and do-acp (the paper's) are registered by name so `moe2dense list` shows them. */
#include "criteria/dopt.h"
#include "base/util.h"

static int derive_do(const m2d_plugin *base, m2d_plugin *out) {
    if (base->select) return -1; /* a scoring with its own selection has nothing to replace */
    out->summary = m2d_strfmt("D-optimal selection over %s importances (scores stay %s)", base->name, base->name);
    out->score = base->score;
    out->score_scope = base->score_scope; /* a cross-layer scope pools X's scores as X does */
    out->select = m2d_dopt_select;
    out->params_default = base->params_default;
    return 0;
}

M2D_PLUGIN_FACTORY(do_any, .prefix = "do-", .kind = M2D_SCORING, .pattern = "do-<scoring>",
                   .summary = "D-optimal selection over any scoring above (e.g. do-reap, do-man)",
                   .derive = derive_do)
