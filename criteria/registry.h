/* registry — scoring, grouping and scaling plugins. Each plugin is one file under
 * criteria/<kind>/ that registers itself with M2D_PLUGIN(...); the Makefile picks it up.
 * A plugin sees a read-only view of one MoE layer (statistics + teacher weights) and returns
 * scores / a selection / a grouping / scale factors. It never touches the engine. */
#ifndef M2D_REGISTRY_H
#define M2D_REGISTRY_H

#include "model/model.h"
#include "calib/stats.h"

typedef enum { M2D_SCORING, M2D_GROUPING, M2D_SCALING, M2D_PLUGIN_KINDS } m2d_plugin_kind;

/* key=value plugin parameters, e.g. "b=1,a=1,c=2" for the (b,a,c) family */
typedef struct { int n; const char *const *keys; const double *values; } m2d_params;
double m2d_param(const m2d_params *p, const char *key, double dflt);

/* What a plugin may read about one MoE layer. */
typedef struct {
    const m2d_layer_stats *stats;
    const m2d_layer *weights;   /* teacher tensors of this layer (router, experts); may be NULL in tests */
    int E, k, K, d, d_e;
    const m2d_params *params;
} m2d_layer_view;

typedef struct m2d_plugin m2d_plugin;

/* One MoE layer's groups, as a whole-model grouping hook (group_model) returns them. Arrays are
 * malloc'd by the plugin and freed by the caller (m2d_layer_groups_free). */
typedef struct {
    int n_groups;               /* >= 1 */
    int *group_of;              /* [K] group of selected[i], in [0, n_groups); every group non-empty */
    /* optional (src_start NULL: group g holds the score-weighted merge of its members, as for
     * .group): group g holds Σ_s src_w[s] · W(layer src_layer[s], expert src_expert[s]) over
     * s in [src_start[g], src_start[g+1]), each source's intermediate dimension permuted by
     * src_perm[s] (row a of gate/up and column a of down taken from perm[a]; NULL: identity).
     * src_layer indexes the model view's layers (another layer of a cross-layer scope). */
    int *src_start, *src_layer, *src_expert;
    double *src_w;              /* >= 0, summing to 1 per group */
    int **src_perm;             /* [n_src]: NULL or a permutation of [0, d_e) */
} m2d_layer_groups;
void m2d_layer_groups_free(m2d_layer_groups *g, int n_layers);

/* The whole model, for grouping plugins that decide across layers (M-SMoE's global budget,
 * ConMoE's cross-layer scopes). */
typedef struct {
    int n_layers;
    const m2d_layer_view *layers;  /* every MoE layer in model order; params: the scoring plugin's */
    const int *const *selected;    /* [n_layers][K] the scoring plugin's selection */
    const double *const *scores;   /* [n_layers][E] the scoring plugin's scores (merge weights) */
    const m2d_plugin *scoring;     /* to score a scope of several layers at once (m2d_score_scope) */
    int groups;                    /* groups asked for per layer (the average when the budget is global) */
    double ratio;                  /* fraction of routed experts removed (0: 1 − groups / E) */
    const m2d_params *params;      /* the grouping plugin's */
} m2d_model_view;

/* How many groups a grouping makes (m2d_plugin.group_count). */
enum { M2D_GROUPS_TARGET = 0, /* the target's: k for a dense student, the ratio's for an MoE */
       M2D_GROUPS_EACH = 1    /* one per selected expert: no merging ("none") */ };

struct m2d_plugin {
    const char *name;           /* lower case, as on the command line: "do-acp", "rr", "uniform" */
    m2d_plugin_kind kind;
    const char *summary;        /* one line for `moe2dense list` */
    /* SCORING: scores[E] >= 0 (the importances used for merging and proportional scaling) and the
     * K selected experts in selection order. Plugins that only score set select = NULL and the
     * registry selects top-K (ties -> lower index). */
    int (*score)(const m2d_layer_view *v, double *scores);
    int (*select)(const m2d_layer_view *v, const double *scores, int *selected);
    /* SCORING, optional: scores[n*E] of the experts of N layers taken together as one pool (ConMoE's
     * cross-layer scopes: min-max norms and nearest neighbours over the pool). Without it a pool's
     * scores are each layer's own. With n = 1 it must equal score. */
    int (*score_scope)(const m2d_layer_view *views, int n, double *scores);
    /* GROUPING: group_of[i] in [0, k) for selected[i]; every group non-empty */
    int (*group)(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of);
    /* GROUPING, instead of group: every layer at once (out[n_layers], see m2d_layer_groups) */
    int (*group_model)(const m2d_model_view *mv, m2d_layer_groups *out);
    /* GROUPING: M2D_GROUPS_TARGET or M2D_GROUPS_EACH */
    int group_count;
    /* GROUPING: 1 = consolidates all E experts of a layer (HC-SMoE, M-SMoE, ConMoE): every expert is
     * "selected" (K = E) and assigned to one of the groups; an MoE student keeps all E router rows,
     * each pointing at its group's expert, so the gates of experts in one group add up */
    int remap;
    /* SCALING: alpha[g] for each of the k groups */
    int (*scale)(const m2d_layer_view *v, const int *selected, const double *scores,
                 const int *group_of, double *alpha);
    /* accepted parameters and their defaults, "b=1,a=1,c=1" (NULL: takes none); shown by
     * `moe2dense list`, and m2d_plugin_check_params rejects keys not named here */
    const char *params_default;
    /* long name in reports ("D-Optimal + ACP"); NULL: the name itself */
    const char *display;
    /* position in the paper's tables (1 = first); reports list ranked plugins first, in rank
     * order, then the others in order of first appearance. 0: not in the paper */
    int report_rank;
};

void m2d_plugin_register(const m2d_plugin *p);
const m2d_plugin *m2d_plugin_find(m2d_plugin_kind kind, const char *name);
int m2d_plugin_count(m2d_plugin_kind kind);
const m2d_plugin *m2d_plugin_at(m2d_plugin_kind kind, int i); /* sorted by name */
const char *m2d_plugin_kind_name(m2d_plugin_kind kind);

#define M2D_PLUGIN(ident, ...)                                                   \
    static const m2d_plugin ident##_plugin = {__VA_ARGS__};                      \
    __attribute__((constructor)) static void ident##_plugin_register(void) {     \
        m2d_plugin_register(&ident##_plugin);                                    \
    }

/* A family of plugins made on demand: m2d_plugin_find(kind, PREFIX + X), when no plugin of that
 * name is registered and X is a registered plugin of the same kind, asks DERIVE to fill a plugin
 * from base X (e.g. "do-" + any scoring: X's scores with D-optimal selection, registered by
 * criteria/scoring/do_any.c). The registry sets name and kind, keeps what DERIVE made for the
 * rest of the process (so lookups of one name return one pointer) and knows no family itself. */
typedef struct {
    const char *prefix;         /* "do-" */
    m2d_plugin_kind kind;
    const char *pattern;        /* for `moe2dense list`: "do-<scoring>" */
    const char *summary;        /* one line for `moe2dense list` */
    /* fill OUT (all but name and kind) from BASE; -1 when BASE cannot be a base (no plugin made) */
    int (*derive)(const m2d_plugin *base, m2d_plugin *out);
} m2d_plugin_factory;

void m2d_plugin_factory_register(const m2d_plugin_factory *f);
int m2d_plugin_factory_count(m2d_plugin_kind kind);
const m2d_plugin_factory *m2d_plugin_factory_at(m2d_plugin_kind kind, int i); /* in registration order */

#define M2D_PLUGIN_FACTORY(ident, ...)                                                 \
    static const m2d_plugin_factory ident##_factory = {__VA_ARGS__};                   \
    __attribute__((constructor)) static void ident##_factory_register(void) {          \
        m2d_plugin_factory_register(&ident##_factory);                                 \
    }

/* The report name of plugin NAME of any kind: its display name, else NAME; and its report rank
 * (0 when unknown or unranked). */
const char *m2d_plugin_display_name(const char *name);
int m2d_plugin_report_rank(const char *name);

/* Parse "k=v,k=v" (empty or NULL: no params). Caller frees with m2d_params_free. */
int m2d_params_parse(const char *s, m2d_params *out);
void m2d_params_free(m2d_params *p);
/* -1 + m2d_err naming the plugin and key if params has a key the plugin does not accept. */
int m2d_plugin_check_params(const m2d_plugin *p, const m2d_params *params);

/* Run a scoring plugin end to end on one layer: scores[E] and selected[K]. */
int m2d_score_and_select(const m2d_plugin *scoring, const m2d_layer_view *v, double *scores, int *selected);
/* Top-K by score, ties -> lower index (the default selection). */
void m2d_select_topk(const double *scores, int E, int K, int *selected);
/* Run a grouping plugin: group_of[K] validated (v->k non-empty groups) and canonical
 * (groups numbered by first appearance in `selected` order, so equal partitions compare equal). */
int m2d_group_run(const m2d_plugin *grouping, const m2d_layer_view *v, const int *selected,
                  const double *scores, int *group_of);
void m2d_groups_canonicalize(int K, int *group_of);
/* Scores of N layers' experts as one pool (score_scope, else each layer's score), validated
 * finite and >= 0: scores[n*E], layer i's at scores + i*E. */
int m2d_score_scope(const m2d_plugin *scoring, const m2d_layer_view *views, int n, double *scores);
/* Run a whole-model grouping (group_model): out[mv->n_layers] validated (ranges, non-empty groups,
 * sources, permutations) and canonical (groups numbered by first appearance in selected order). */
int m2d_group_model_run(const m2d_plugin *grouping, const m2d_model_view *mv, m2d_layer_groups *out);
/* Run a scaling plugin: alpha[k], validated finite and >= 0. */
int m2d_scale_run(const m2d_plugin *scaling, const m2d_layer_view *v, const int *selected,
                  const double *scores, const int *group_of, double *alpha);

#endif
