/* moe2dense convert — build a dense (or smaller MoE) student from a teacher and its stats file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "cli/cmd.h"
#include "convert/convert.h"
#include "model/model.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense convert --model DIR --stats STATS --scoring S --grouping G --scaling C -K N\n"
    "                         --out DIR [--target dense|moe] [--groups M] [--ratio R] [--top-k N]\n"
    "                         [--moe-router shared|average] [--param key=value ...] [--fingerprint]\n"
    "       moe2dense convert --model DIR --stats STATS --baseline random-ffn|random-init [--seed S]\n"
    "                         [-K N] --out DIR\n"
    "\n"
    "Per MoE layer: the scoring plugin S scores the experts and selects K of them; the grouping\n"
    "plugin G splits them into k groups (k = num_experts_per_tok); each group is merged by\n"
    "score-weighted averaging of gate/up/down (uniform if the group's scores sum to 0); the scaling\n"
    "plugin C gives each group's down projection a factor alpha; the k groups are concatenated into\n"
    "one dense SwiGLU FFN of width k*d_e. Attention, embeddings, norms and the LM head are copied\n"
    "bit for bit; dense teacher layers narrower than the dense width are zero-padded.\n"
    "\n"
    "  --model DIR       the teacher, a Hugging Face MoE checkpoint\n"
    "                    (" M2D_CMD_TEACHER_FAMILIES ")\n"
    "  --stats STATS     statistics from 'moe2dense calibrate' on this teacher (checked)\n"
    "  --scoring S       scoring plugin, e.g. acp, do-acp, cp, reap ('moe2dense list')\n"
    "  --grouping G      grouping plugin: rr, wc, rc, ab, oc; none (every selected expert on its own);\n"
    "                    hc-smoe, m-smoe, remap (consolidate all E experts, --target moe)\n"
    "  --scaling C       scaling plugin: uniform, proportional, avg-cp, indicator (not used with\n"
    "                    --target moe)\n"
    "  -K N              experts selected per layer, k <= N <= E (--target moe: 1 <= N <= E; not\n"
    "                    needed with --ratio)\n"
    "  --out DIR         output directory: absent, empty, or an earlier convert output\n"
    "  --target T        dense (default): the family's dense model (Qwen3-MoE: Qwen3ForCausalLM; the\n"
    "                    others: README, inspect) with intermediate_size = groups*d_e;\n"
    "                    moe: the teacher's architecture, a smaller MoE (REAP-style): each group merged\n"
    "                    into one expert, reached as --moe-router says\n"
    "  --groups M        groups per layer. dense: default k (grouping none: K, every selected expert\n"
    "                    active, paper 001 §2 (i)); moe: default K (pure pruning)\n"
    "  --ratio R         --target moe: fraction of routed experts removed per layer (0.25, 0.5);\n"
    "                    keeps max(1, round((1-R)*E)) experts (the remapping groupings keep all E\n"
    "                    router rows and make that many groups)\n"
    "  --top-k N         --target moe: the student's num_experts_per_tok (default min(k, experts);\n"
    "                    paper 001 §2 (iii): fewer experts per token)\n"
    "  --moe-router R    --target moe only: shared (default: every retained expert keeps its own\n"
    "                    router row and points at its group's merged expert; num_experts = K, so\n"
    "                    routing is the teacher's restricted to the K rows and the gates of routed\n"
    "                    members of one group add up) or average (one expert per group, router row =\n"
    "                    merge-weighted average of the members'; num_experts = groups)\n"
    "  --param key=value plugin parameter (repeatable, or comma-separated k=v,k=v); each key goes to\n"
    "                    the chosen plugins that accept it, a key none accepts is an error\n"
    "  --fingerprint     print only the student fingerprint (no --out needed, nothing written)\n"
    "  --baseline B      the paper's baselines (Table 3), a dense student of the width above:\n"
    "                    random-ffn: the teacher's attention, embeddings, norms and LM head bit for\n"
    "                    bit, every layer's FFN drawn from normal(0, initializer_range) (the teacher\n"
    "                    config's, else 0.02) as Hugging Face initialises a Linear; random-init: the\n"
    "                    whole student so initialised (matrices normal, RMSNorm weights 1). Scoring,\n"
    "                    grouping and scaling default to sf, rr, uniform and K to k (they fix only\n"
    "                    the width; the plan is recorded). moe2dense.json gains \"baseline\"\n"
    "  --seed S          the baseline's seed (default 0): tensor NAME draws from splitmix64 seeded\n"
    "                    with S XOR FNV-1a-64(NAME), Box-Muller normals; the same S, the same bytes\n"
    "\n"
    "Writes config.json, model.safetensors (teacher dtype, bf16 round-to-nearest-even; a student\n"
    "over 5 GB as transformers' shards: model-0000i-of-0000n.safetensors of at most 5 GB and\n"
    "model.safetensors.index.json), the tokenizer files and moe2dense.json (configuration, stats hashes, per layer the selected\n"
    "experts, groups, merge weights, sources and alpha; written last, so its presence marks a\n"
    "complete output). Prints the student fingerprint: equal fingerprints mean bit-identical students.\n";

/* Collect every --param (repeatable) into one "k=v,k=v" string and drop them from argv. */
static char *take_params(int *argc, char **argv) {
    char *all = m2d_strdup("");
    int j = 1;
    for (int i = 1; i < *argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--param") && i + 1 < *argc) v = argv[++i];
        else if (!strncmp(argv[i], "--param=", 8)) v = argv[i] + 8;
        if (v) {
            char *n = m2d_strfmt("%s%s%s", all, *all ? "," : "", v);
            free(all);
            all = n;
            continue;
        }
        argv[j++] = argv[i];
    }
    *argc = j;
    return all;
}

/* --baseline: the plan only fixes the width, so the plugins default to simple ones and K to k. */
static int baseline_defaults(const char **scoring, const char **grouping, const char **scaling, const char **K_s,
                             const char **target) {
    if (strcmp(*target, "dense")) return m2d_err("a baseline is a dense student, not --target %s", *target);
    if (!*scoring) *scoring = "sf";
    if (!*grouping) *grouping = "rr";
    if (!*scaling) *scaling = "uniform";
    (void)K_s; /* no -K: K = k, set once the teacher is open */
    return 0;
}

/* --seed: a non-negative integer up to 2^53 (recorded exactly in moe2dense.json). */
static int parse_seed(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    if (end == s || *end || errno || *s == '-' || *out > (1ull << 53))
        return m2d_err("convert: --seed '%s': expected an integer in [0, 2^53]", s);
    return 0;
}

/* the command line, as given */
typedef struct {
    const char *model, *stats, *scoring, *grouping, *scaling, *K_s, *out, *target, *groups_s, *moe_router, *ratio_s,
        *topk_s, *baseline_s, *seed_s;
    int fp_only;
} convert_args;

static int parse_args(int ac, char **av, convert_args *a) {
    m2d_opt opts[] = {{"--model", 1, &a->model, NULL},         {"--stats", 1, &a->stats, NULL},
                      {"--scoring", 1, &a->scoring, NULL},     {"--grouping", 1, &a->grouping, NULL},
                      {"--scaling", 1, &a->scaling, NULL},     {"-K", 1, &a->K_s, NULL},
                      {"--out", 1, &a->out, NULL},             {"--target", 1, &a->target, NULL},
                      {"--groups", 1, &a->groups_s, NULL},     {"--fingerprint", 0, NULL, &a->fp_only},
                      {"--moe-router", 1, &a->moe_router, NULL}, {"--ratio", 1, &a->ratio_s, NULL},
                      {"--top-k", 1, &a->topk_s, NULL},        {"--baseline", 1, &a->baseline_s, NULL},
                      {"--seed", 1, &a->seed_s, NULL},         {0}};
    return m2d_parse_opts("convert", ac, av, opts, NULL, 0, NULL);
}

/* --baseline and --seed, then the flags every conversion needs */
static int check_required(convert_args *a, m2d_convert_opts *co) {
    if (a->baseline_s && (m2d_baseline_parse(a->baseline_s, &co->baseline) ||
                          baseline_defaults(&a->scoring, &a->grouping, &a->scaling, &a->K_s, &a->target)))
        return m2d_err_prefix("convert: --baseline");
    if (a->seed_s && !a->baseline_s) return m2d_err("convert: --seed is only for --baseline");
    unsigned long long seed = 0;
    if (a->seed_s && parse_seed(a->seed_s, &seed)) return -1;
    co->baseline_seed = seed;
    if (!a->model || !a->stats || !a->scoring || !a->grouping || (!a->K_s && !a->ratio_s && !a->baseline_s) ||
        (!a->out && !a->fp_only))
        return m2d_err("convert: --model, --stats, --scoring, --grouping, -K (or --ratio) and --out are required (see "
                       "'moe2dense help convert')");
    return 0;
}

/* --target and the flags that belong to one target only */
static int parse_target(const convert_args *a, m2d_convert_opts *co) {
    if (!strcmp(a->target, "dense")) co->target = M2D_TARGET_DENSE;
    else if (!strcmp(a->target, "moe")) co->target = M2D_TARGET_MOE;
    else return m2d_err("convert: --target '%s': expected dense or moe", a->target);
    int dense = co->target == M2D_TARGET_DENSE;
    if (dense && !a->scaling)
        return m2d_err("convert: --scaling is required for --target dense (uniform, proportional, avg-cp)");
    if (!dense && a->scaling)
        fprintf(stderr, "moe2dense convert: note: --scaling is not used with --target moe (the router weights "
                        "the experts)\n");
    co->moe_router = M2D_MOE_ROUTER_SHARED;
    if (a->moe_router && dense) return m2d_err("convert: --moe-router is only for --target moe");
    if (a->moe_router && !strcmp(a->moe_router, "average")) co->moe_router = M2D_MOE_ROUTER_AVERAGE;
    else if (a->moe_router && strcmp(a->moe_router, "shared"))
        return m2d_err("convert: --moe-router '%s': expected shared or average", a->moe_router);
    if (dense && (a->ratio_s || a->topk_s)) return m2d_err("convert: --ratio and --top-k are only for --target moe");
    return 0;
}

/* --ratio, -K, --top-k, --groups */
static int parse_numbers(const convert_args *a, m2d_convert_opts *co) {
    if (a->ratio_s) {
        char *end;
        co->ratio = strtod(a->ratio_s, &end);
        if (end == a->ratio_s || *end || !(co->ratio > 0 && co->ratio < 1))
            return m2d_err("convert: --ratio '%s': expected a fraction of experts removed in (0, 1), e.g. 0.25",
                           a->ratio_s);
    }
    long K = 0, top_k = 0, groups = 0;
    if ((a->K_s && m2d_parse_int("convert", "-K", a->K_s, 1, 1 << 20, &K)) ||
        (a->topk_s && m2d_parse_int("convert", "--top-k", a->topk_s, 1, 1 << 20, &top_k)) ||
        (a->groups_s && m2d_parse_int("convert", "--groups", a->groups_s, 1, 1 << 20, &groups)))
        return -1;
    co->K = (int)K, co->top_k = (int)top_k, co->n_groups = (int)groups;
    return 0;
}

static void print_written(const convert_args *a, const m2d_convert_opts *co, const m2d_model *student,
                          const m2d_convert_plan *plan) {
    if (co->baseline)
        printf("wrote %s (%s baseline, dense width %d, seed %llu, std %g) fingerprint %s\n", a->out, a->baseline_s,
               student->cfg.intermediate_size, (unsigned long long)co->baseline_seed, plan->init_std,
               plan->fingerprint);
    else
        printf("wrote %s (%s student, %d MoE layers, K=%d, %d groups) fingerprint %s\n", a->out,
               co->target == M2D_TARGET_DENSE ? "dense" : "moe", plan->n_layers, plan->K, plan->n_groups,
               plan->fingerprint);
}

/* The teacher and its statistics (checked), the plan, and the student built and written (or only
 * the plan's fingerprint printed). */
static int convert(const convert_args *a, m2d_convert_opts *co) {
    m2d_model *m = NULL, *student = NULL;
    m2d_stats *s = NULL;
    m2d_convert_plan *plan = NULL;
    int rc = m2d_model_open(a->model, &m) || m2d_stats_read(a->stats, &s) || m2d_stats_check_model(s, a->stats, m);
    if (rc == 0 && co->baseline && !a->K_s) co->K = m->cfg.num_experts_per_tok;
    if (rc == 0) rc = m2d_convert_plan_build(m, s, co, &plan);
    if (rc == 0 && a->fp_only) printf("%s\n", plan->fingerprint);
    else if (rc == 0)
        rc = m2d_convert_build(m, plan, &student) || m2d_convert_write(m, student, plan, a->stats, a->out);
    if (rc == 0 && !a->fp_only) print_written(a, co, student, plan);
    m2d_convert_student_free(student);
    m2d_convert_plan_free(plan);
    m2d_calib_stats_free(s);
    if (m) m2d_model_close(m);
    return rc ? -1 : 0;
}

static int cmd_convert_run(int argc, char **argv) {
    char **av = m2d_malloc((size_t)(argc + 1) * sizeof *av);
    memcpy(av, argv, (size_t)argc * sizeof *av);
    int ac = argc;
    char *params_s = take_params(&ac, av);
    convert_args a = {.target = "dense"};
    m2d_convert_opts co = {.params = {0, NULL, NULL}};
    int rc = parse_args(ac, av, &a) || check_required(&a, &co) || parse_target(&a, &co) || parse_numbers(&a, &co);
    if (rc == 0 && m2d_params_parse(params_s, &co.params)) rc = m2d_err_prefix("convert: --param");
    if (rc == 0) {
        co.scoring = a.scoring, co.grouping = a.grouping, co.scaling = a.scaling;
        rc = convert(&a, &co);
    }
    if (rc) m2d_cmd_fail("convert");
    m2d_params_free(&co.params);
    free(params_s);
    free(av);
    return rc ? 1 : 0;
}

static char *convert_usage(void) { return m2d_cmd_usage_families(USAGE); }

M2D_COMMAND_BUILT(convert, "convert", "build a dense (or smaller MoE) student from a teacher and its stats", convert_usage,
            cmd_convert_run)
