/* convert — build the student from a teacher, its calibration statistics and three plugins
 * (SPEC §4): per MoE layer, score + select K experts, group them into k groups, merge each group
 * by score-weighted averaging, scale each group's down projection by α_g, concatenate into one
 * dense SwiGLU FFN of width k·d_e, followed by the layer's shared experts (DeepSeek, Qwen2-MoE:
 * copied, α = 1, not part of K). A teacher whose gates carry a factor (DeepSeek's
 * routed_scaling_factor) has every α of a dense student multiplied by it (the scaling rules speak
 * of p). Everything else is the teacher's, bit for bit.
 *
 * The plan (what to build: selection, groups, merge weights, α per layer) is separate from the
 * build (the weights), so a sweep can fingerprint a plan and skip students it has already seen.
 *
 * Canonical group order: groups are ordered by their smallest member expert index and members
 * within a group by expert index; the dense FFN concatenates groups in that order. Two plans
 * with the same fingerprint therefore produce bit-identical weights.
 *
 * Weight precision: every merged matrix is accumulated in fp64 (Σ w_e α W_e), rounded once to
 * fp32, then stored in the teacher's expert dtype (bf16: round-to-nearest-even), both in memory
 * and on disk, so the in-memory student and the written checkpoint are the same model.
 *
 * --target moe (REAP-style smaller MoE): each group is merged into one expert as above (α = 1:
 * the router's gate weights do the weighting). How the router reaches it (SPEC §4):
 *  - shared (default): every retained expert keeps its own router row, and every member of a
 *    group points at the group's merged expert. Qwen3-MoE has one expert per router row, so the
 *    merged weights are stored once per member: num_experts = K, slots in increasing teacher
 *    expert id (so top-k ties still go to the lower teacher index). Routing is the teacher's,
 *    restricted to the K retained rows; two routed members of one group both add the merged
 *    expert, with their own gate weights.
 *  - average: one expert per group, whose router row is the merge-weighted average of its
 *    members' rows: num_experts = number of groups (smaller, but routing changes).
 * With one expert per group (--groups K, the default: pure pruning) both are the same student.
 * Pruning (K < E, one expert per group) is paper 003's Eq. 2: softmax over the K retained rows,
 * top-k, renormalised when the teacher renormalises — on such a model exactly the teacher's
 * probabilities restricted to the survivors and renormalised over the new top-k.
 * Remapping groupings (HC-SMoE, M-SMoE, ConMoE; plugin .remap): all E experts are members
 * (K = E) and the student keeps every router row, shared mode: the router is the teacher's
 * unchanged, top-k over the same E logits, and slot e holds its group's expert, so the output is
 * Σ_{i∈top-k} g_i f_{group(i)} = Σ_groups (Σ_{i in group} g_i) f_group — the gates of routed
 * experts of one group add up (paper 003 Eq. 3, paper 002 §4.3). Exactly the papers' function; the
 * only difference is fp32 summation order (g_1 f + g_2 f instead of (g_1 + g_2) f). The
 * checkpoint stores E slots (paper 002 App. B.2: "materialised"), slots of one group sharing
 * their data in memory.
 * num_experts_per_tok = min(top_k or k, num_experts). */
#ifndef M2D_CONVERT_H
#define M2D_CONVERT_H

#include "base/outfile.h"
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

/* ---- the math on plain arrays (tested directly) ---- */
/* w[i] = s[i] / Σ s (uniform 1/n when Σ s = 0; negative scores are an error upstream). */
void m2d_merge_weights(const double *member_scores, int n, double *w);
/* out[j] = round_f32(scale · Σ_i w[i] · src[i][j]) with fp64 accumulation. */
void m2d_merge_matrices(const float *const *src, const double *w, int n, size_t numel, double scale, float *out);
/* Dense SwiGLU FFN from n blocks of WIDTHS[b] (gate/up [w_b, d], down [d, w_b]): gate/up
 * row-concatenated, down column-concatenated, in block order. */
void m2d_concat_ffn_blocks(int n, int d, const int *widths, const float *const *gates, const float *const *ups,
                           const float *const *downs, float *gate, float *up, float *down);
/* Dense SwiGLU FFN from k groups (each gate/up [d_e, d], down [d, d_e]):
 * gate/up [k·d_e, d] row-concatenated, down [d, k·d_e] column-concatenated (already scaled). */
void m2d_concat_ffn(int k, int d, int d_e, const float *const *gates, const float *const *ups,
                    const float *const *downs, float *gate, float *up, float *down);
/* y = W_down (silu(W_gate x) ⊙ W_up x) for one vector x [d] -> y [d] (fp64 accumulation). */
void m2d_swiglu_ref(int d, int inter, const float *gate, const float *up, const float *down, const float *x, float *y);

/* ---- plan ---- */
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
/* Student fingerprint: sha256 of "moe2dense-student-v1", the teacher weights hash, the target and
 * per MoE layer its canonical groups (member ids, merge weights and α as exact hex floats, the
 * sources and a hash of each permutation when given; the student's top-k when changed).
 * Equal fingerprints => bit-identical students. Filled into plan->fingerprint by plan_build. */
void m2d_convert_fingerprint(const m2d_convert_plan *p, char out[65]);

/* ---- student ---- */
/* Build the student in memory. It shares the teacher's unchanged tensors (attention, norms,
 * embeddings, LM head): the teacher must stay open while the student is used. */
int m2d_convert_build(const m2d_model *teacher, const m2d_convert_plan *plan, m2d_model **student);
void m2d_convert_student_free(m2d_model *student);
/* Write the student as a Hugging Face checkpoint into DIR (created if needed): config.json,
 * model.safetensors (teacher dtype), tokenizer files, moe2dense.json (written last: its
 * presence marks a complete output). DIR must be absent, empty or an earlier moe2dense output. */
int m2d_convert_write(const m2d_model *teacher, const m2d_model *student, const m2d_convert_plan *plan,
                      const char *stats_path, const char *dir);

/* The output directory rule of every checkpoint moe2dense writes (convert, distill), for a writer
 * that fills DIR over a long time (distill): DIR is created if absent; a directory with files but
 * neither moe2dense.json nor moe2dense.incomplete is refused; moe2dense.incomplete is written and
 * an earlier output's moe2dense.json removed (it is written last: its presence marks a complete
 * output). m2d_convert_finish_dir removes moe2dense.incomplete after moe2dense.json is written.
 * DIR's lock is taken and stays held in *LOCK (released by the caller when the run ends), so two
 * runs never write one directory; m2d_convert_lock_dir takes only the lock (a resumed run). */
int m2d_convert_prepare_dir(const char *dir, m2d_lock *lock);
int m2d_convert_lock_dir(const char *dir, m2d_lock *lock);
int m2d_convert_finish_dir(const char *dir);
/* Copy the tokenizer files (tokenizer.json, tokenizer_config.json, ...) of model FROM into TO_DIR. */
int m2d_convert_copy_tokenizer(const m2d_model *from, const char *to_dir);

#endif
