/* convert/plan — what to build (SPEC §4; the conversion as a whole: convert.h). The plan holds,
 * per MoE layer, the selection, the groups, the merge weights and α; it is separate from the build
 * (the weights), so a sweep can fingerprint a plan and skip students it has already seen.
 *
 * Canonical group order: groups are ordered by their smallest member expert index and members
 * within a group by expert index; the dense FFN concatenates groups in that order. Two plans
 * with the same fingerprint therefore produce bit-identical weights. */
#ifndef M2D_CONVERT_PLAN_H
#define M2D_CONVERT_PLAN_H

#include "model/model.h"
#include "criteria/registry.h"
#include "calib/stats.h"

typedef enum { M2D_TARGET_DENSE, M2D_TARGET_MOE } m2d_target;
typedef enum { M2D_MOE_ROUTER_SHARED, M2D_MOE_ROUTER_AVERAGE } m2d_moe_router; /* --target moe only */
/* The paper's baselines (Table 3) as dense students of the converted student's shape (--baseline):
 *  - random-ffn: attention, embeddings, norms and LM head the teacher's, bit for bit; every layer's
 *    dense FFN (gate/up/down) drawn from normal(0, initializer_range) as Hugging Face initialises
 *    a Linear (biases 0);
 *  - random-init: the whole student as Hugging Face initialises it: every matrix (embedding, q/k/v/o,
 *    FFN, LM head) normal(0, initializer_range), every RMSNorm weight 1, biases 0.
 * initializer_range from the teacher's config.json, 0.02 (transformers' default) when absent.
 * Deterministic: tensor NAME uses the stream state = seed XOR m2d_fnv1a64(NAME), element i
 * (row-major) the i-th m2d_rand_normal draw, rounded to fp32 and then to the teacher's dtype. The
 * plan (selection, groups) is still built and recorded; it fixes only the width. */
typedef enum { M2D_BASELINE_NONE, M2D_BASELINE_RANDOM_FFN, M2D_BASELINE_RANDOM_INIT } m2d_baseline;
/* "random-ffn" / "random-init" -> kind (0), or -1 + m2d_err naming both; m2d_baseline_name: NULL for none;
 * m2d_baseline_lookup: the kind, NONE for any other name. A baseline name given as opts.scoring (a
 * sweep's scoring axis: scoring = ["do-acp", "random-ffn"]) makes that baseline, seed
 * opts.baseline_seed, planned with scoring sf (the grouping, scaling and K fix the width). */
int m2d_baseline_parse(const char *name, m2d_baseline *out);
m2d_baseline m2d_baseline_lookup(const char *name);
const char *m2d_baseline_name(m2d_baseline b);

typedef struct {
    const char *scoring, *grouping, *scaling; /* plugin names; scaling unused for --target moe */
    int K;                  /* experts selected per MoE layer: k <= K <= E (dense), 1 <= K <= E (moe) */
    m2d_target target;
    int n_groups;           /* groups per layer; 0: k (dense; K for grouping "none"), K (moe) */
    m2d_params params;      /* passed to every plugin */
    m2d_moe_router moe_router; /* --target moe: how members reach their merged expert */
    double ratio;           /* --target moe, > 0: fraction of routed experts removed per layer; sets
                               K = max(1, round((1 − ratio)·E)) and groups = K, or for a remapping
                               grouping K = E and groups = that number (K, n_groups must be 0) */
    int top_k;              /* --target moe, > 0: the student's num_experts_per_tok (paper 001 §2 (iii)) */
    m2d_baseline baseline;  /* dense only: a random baseline of the student's shape (see above) */
    uint64_t baseline_seed;
} m2d_convert_opts;

typedef struct {
    int layer;              /* model layer index */
    int K, n_groups;
    int d_e;                /* expert width (the length of a permutation) */
    double *scores;         /* [E] scoring plugin's importances */
    int *selected;          /* [K] in the scoring plugin's selection order */
    /* canonical groups: group g holds members[group_start[g] .. group_start[g+1]) */
    int *group_start;       /* [n_groups + 1] */
    int *members;           /* [K] expert ids, grouped, ascending within a group */
    double *merge_w;        /* [K] merge weight of members[i] within its group (sums to 1 per group) */
    double *alpha;          /* [n_groups] down-projection scale (1 for --target moe) */
    /* optional (whole-model groupings: ConMoE prototypes, M-SMoE aligned merges): group g holds
     * Σ_s src_w[s] · W(model layer src_layer[s], expert src_expert[s]) over s in
     * [src_start[g], src_start[g+1]), intermediate dimension permuted by src_perm[s] (NULL:
     * identity); merge_w is then 0 (unused). NULL: groups hold their members' merge. */
    int *src_start, *src_layer, *src_expert;
    double *src_w;
    int **src_perm;
} m2d_layer_plan;

typedef struct {
    m2d_target target;
    m2d_moe_router moe_router;
    char *scoring, *grouping, *scaling;
    int K, n_groups;        /* n_groups: the largest over layers (whole-model groupings vary per layer) */
    double ratio;           /* as given (0: none) */
    int top_k;              /* student num_experts_per_tok for --target moe */
    int n_params; char **param_keys; double *param_values;
    int n_layers;           /* MoE layers */
    m2d_layer_plan *layers;
    char teacher_hash[65], calib_hash[65];
    char calib_precision[8]; /* the stats' GEMM precision ("fp32"/"bf16"), recorded in moe2dense.json */
    m2d_baseline baseline;  /* as given; the fingerprint covers kind, seed and std */
    uint64_t baseline_seed;
    double init_std;        /* the baseline's normal std (initializer_range) */
    char fingerprint[65];   /* see m2d_convert_fingerprint */
} m2d_convert_plan;

/* w[i] = s[i] / Σ s (uniform 1/n when Σ s = 0; negative scores are an error upstream). */
void m2d_merge_weights(const double *member_scores, int n, double *w);

/* Parse "key=value" (value a number) into opts->params storage owned by the caller's arrays. */
int m2d_convert_parse_param(const char *kv, char **key, double *value);
/* Run the plugins on every MoE layer. Validates K, plugin names (errors list the available
 * ones), the stats against the model, and every plugin result. */
/* What m2d_convert_plan_build refuses without looking at statistics or weights: K and the groups
 * against the teacher's config C (from directory DIR), unknown plugins, parameters no chosen
 * plugin takes. 0, or -1 + m2d_err (the sweep's check runs it on every configuration first). */
int m2d_convert_check(const m2d_config *c, const char *dir, const m2d_convert_opts *o);
int m2d_convert_plan_build(const m2d_model *teacher, const m2d_stats *stats, const m2d_convert_opts *o,
                           m2d_convert_plan **out);
void m2d_convert_plan_free(m2d_convert_plan *p);
/* Experts per MoE layer of a --target moe student: K (shared) or the number of groups (average). */
int m2d_convert_moe_experts(const m2d_convert_plan *p);
/* Parameters of STUDENT (built from P) counting every distinct expert once: a shared-router MoE
 * stores a group's expert in each member's slot (the same data), which its config's count repeats. */
int64_t m2d_convert_student_params(const m2d_convert_plan *p, const m2d_model *student);
#endif
