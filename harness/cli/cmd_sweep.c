/* moe2dense sweep — run an experiment's configuration grid into a resumable CSV. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "sweep/grid.h"
#include "sweep/sweep.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense sweep EXPERIMENTS.toml --experiment NAME [options]\n"
    "\n"
    "Runs every configuration of the experiment's grid (scoring x grouping x scaling x K, trimmed by\n"
    "include/exclude rules): calibration statistics once (cached), then per configuration convert in\n"
    "memory and evaluate. One CSV row per configuration, appended crash-safely; a re-run resumes.\n"
    "Two deduplications: axis values that resolve to the same settings (K = 8k and K = E when\n"
    "E = 8k) make one configuration, the others are dropped from the grid (the dry run counts them);\n"
    "configurations whose students have the same fingerprint (selected sets, groups, merge weights,\n"
    "alpha) are evaluated once, the others recorded with dedup_of=<config id>.\n"
    "A failing configuration is recorded as 'failed: reason'.\n"
    "Calibration statistics are cached in the experiment's cache_dir (default results/cache) under\n"
    "<model hash>-<calibration hash>.m2dstats and reused by every later run and shard.\n"
    "With an [mc] table, a second stage evaluates the multiple-choice tasks on the configurations\n"
    "mc.configs selects (best-per-pair: per scoring x grouping the (K, scaling) with the lowest\n"
    "PPL among its dense students, as the paper does; or all), into CSV.mc.csv (resumable), then\n"
    "fills the CSV's MC\n"
    "columns. In a shard it is skipped: run it on the merged CSV (sweep ... --out MERGED.csv).\n"
    "With a [d2d] table (teacher = a dense checkpoint, candidates = shape specs \"L4-H192-F576-A6/2\"),\n"
    "the dense-to-dense baseline joins the grid: its Minitron importance computed once (cached in\n"
    "cache_dir), each candidate pruned (scoring d2d, params shape=SPEC) and scored like the\n"
    "others, and the [distill] stage distills only the one with the lowest PPL, from the dense\n"
    "teacher with the same settings; the dry run prints each candidate's parameters against the\n"
    "K = k student's and a step's cost with each teacher (`report CSV --table 3` lays it out).\n"
    "\n"
    "options:\n"
    "  --experiment NAME   experiment table [experiment.NAME] (required)\n"
    "  --dry-run           print the grid, the number of distinct students and a run-time estimate\n"
    "  --shard I/N         run only the I-th of N disjoint slices (1 <= I <= N; students are dealt\n"
    "                      evenly, configurations that may share a student stay in one shard)\n"
    "  --out CSV           results file (default: the experiment's `out`, results/NAME.csv)\n"
    "  --set KEY=VALUE     override a key of the experiment (repeatable), e.g. --set model=DIR,\n"
    "                      --set ppl.max_windows=8, --set axes.K='[\"k\",\"2k\"]'\n"
    "  --jobs N            configurations evaluated in parallel (default 1)\n"
    "  --threads N         compute (BLAS/engine) threads per job (default: cores / jobs)\n"
    "  --precision P       the engine's GEMMs in calibration and evaluation, and the teacher's\n"
    "                      forward of the [distill] stage (the student trains in fp32): fp32\n"
    "                      (default; exact), bf16 (operands rounded to bf16, fp32 accumulation) or\n"
    "                      auto (bf16 where the CPU computes it natively); recorded in the CSV\n"
    "                      headers (precision=), which must match to resume; bf16 calibration is\n"
    "                      cached separately\n"
    "  --attention A       attention's operands when students and teachers are evaluated (PPL,\n"
    "                      MC): fp32 (default; exact) or bf16 (q, k, v and the softmax's numerators\n"
    "                      rounded to bf16, as transformers' bf16 SDPA; faster where bf16 outruns\n"
    "                      fp32: AMX, GPUs); calibration and distillation stay fp32. Recorded in\n"
    "                      the CSV headers (precision=P attention=bf16), which must match to resume\n"
    "  --device D          where those engines run: cpu (default), cuda or cuda:N (a `make CUDA=1`\n"
    "                      build and a GPU; an absent device is an error, never a CPU run); off the\n"
    "                      CPU recorded in the CSV headers (device=), which must match to resume;\n"
    "                      the [distill] stage's teacher and student run there too\n"
    "  --retry-failed      run configurations recorded as failed again (their rows are replaced)\n"
    "  --no-resume         refuse to run if the CSV exists (default: resume, skipping recorded rows)\n"
    "  --max-configs N     refuse a grid of more than N configurations (default " M2D_STR(M2D_GRID_DEFAULT_MAX_CONFIGS)
    ";\n"
    "                      counted from the axes before anything is built)\n"
    "\n"
    "Before any work the experiment is checked (plugins, their parameters, lengths against the\n"
    "teacher's max_position_embeddings, data files; the dry run checks the same) and the CSV is\n"
    "locked: a second sweep on the same CSV is refused, naming the process that holds it; an\n"
    "existing CSV's rows are validated (a bad row is an error naming FILE:LINE:COLUMN).\n"
    "Exit status: 0 all configurations ran (a non-finite perplexity is a result), 1 error (nothing\n"
    "more was run), 3 finished but some configurations could not be run (their rows say\n"
    "'failed: reason'; fix the cause and re-run with --retry-failed).\n"
    "\n"
    "CSV: leading '# key=value' lines are the run header (version, experiment, model and calibration\n"
    "hashes, PPL protocol, shard, host, start time); then the columns config_id, scoring, grouping,\n"
    "scaling, K_expr, K, params, d_dense, n_params, ppl, ppl_protocol, ppl_seq_len, ppl_windows,\n"
    "[TASK_acc, TASK_acc_norm..., mc_avg], wall_s, status, dedup_of, fingerprint.\n"
    "Progress (done/total, current configuration, ETA) is shown on a terminal.\n";

/* the command line, as given */
typedef struct {
    const char *exp, *shard, *out, *jobs, *threads, *max_configs, *prec_s, *device, *attn_s;
    int dry, retry, no_resume;
    char *pos[1];
} sweep_args;

/* EXPERIMENTS.toml and --experiment (an absent one: the file's experiments named) */
static int parse_args(int argc, char **argv, sweep_args *a) {
    m2d_opt opts[] = {{"--experiment", 1, &a->exp, NULL}, {"--shard", 1, &a->shard, NULL},
                      {"--out", 1, &a->out, NULL},        {"--jobs", 1, &a->jobs, NULL},
                      {"--threads", 1, &a->threads, NULL}, {"--dry-run", 0, NULL, &a->dry},
                      {"--retry-failed", 0, NULL, &a->retry}, {"--no-resume", 0, NULL, &a->no_resume},
                      {"--max-configs", 1, &a->max_configs, NULL}, {"--precision", 1, &a->prec_s, NULL},
                      {"--device", 1, &a->device, NULL}, {"--attention", 1, &a->attn_s, NULL}, {0}};
    int npos = 0;
    if (m2d_parse_opts("sweep", argc, argv, opts, a->pos, 1, &npos)) return -1;
    if (npos != 1) return m2d_err("sweep: expected EXPERIMENTS.toml (see 'moe2dense help sweep')");
    if (a->exp) return 0;
    char *names = m2d_experiment_names(a->pos[0]);
    m2d_err("sweep: --experiment NAME is required (%s has: %s)", a->pos[0], names ? names : "none");
    free(names);
    return -1;
}

/* the run's options from the flags (--max-configs sets the grid's limit) */
static int sweep_options(const sweep_args *a, m2d_sweep_opts *o) {
    long v;
    if (a->jobs && m2d_parse_int("sweep", "--jobs", a->jobs, 1, 1024, &v)) return -1;
    if (a->jobs) o->jobs = (int)v;
    if (a->threads && m2d_parse_int("sweep", "--threads", a->threads, 1, 1024, &v)) return -1;
    if (a->threads) o->threads = (int)v;
    if (a->shard && m2d_parse_shard(a->shard, &o->shard_i, &o->shard_n)) return -1;
    if (m2d_precision_parse(a->prec_s, "sweep: --precision", &o->precision) ||
        m2d_cmd_attention_arg("sweep", a->attn_s, &o->attention))
        return -1;
    if (a->device && m2d_device_check(a->device, "sweep: --device")) return -1;
    o->device = a->device;
    if (a->max_configs) {
        if (m2d_parse_int("sweep", "--max-configs", a->max_configs, 1, 1L << 40, &v)) return -1;
        m2d_grid_set_max_configs(v);
    }
    o->out = a->out;
    o->retry_failed = a->retry;
    return 0;
}

/* The summary lines; 3 when some configuration, MC evaluation or distillation failed, else 0. */
static int print_summary(const m2d_experiment *x, const m2d_sweep_summary *s, const char *path) {
    printf("sweep %s: %d configurations: %d already done, %d evaluated, %d students identical to an earlier one by "
           "fingerprint (recorded as dedup_of, not evaluated), %d failed -> %s\n",
           x->name, s->total, s->skipped, s->evaluated, s->dedup, s->failed, path);
    printf("sweep %s: %.2f s wall: %.2f s prepare (teacher, calibration, data), %.2f s in build+evaluate "
           "(%d job(s) x %d thread(s))\n", x->name, s->wall_s, s->prepare_s, s->eval_s, s->jobs, s->threads);
    if (s->mc_selected)
        printf("sweep %s: multiple choice: %d configuration(s) selected (%s), %d evaluated now -> %s.mc.csv\n",
               x->name, s->mc_selected, x->mc_configs, s->mc_evaluated, path);
    if (s->distill_selected)
        printf("sweep %s: distillation: %d configuration(s) selected (%s), %d distilled now in %.2f s -> "
               "%s.distill.csv, checkpoints in %s.distill/\n", x->name, s->distill_selected, x->distill_configs,
               s->distill_evaluated, s->stages_s, path, path);
    if (!s->unrunnable && !s->mc_failed && !s->distill_failed) return 0;
    fprintf(stderr, "moe2dense sweep: %d configuration(s) could not be run%s%.0d%s%s%.0d%s (rows say 'failed: "
                    "reason'; fix the cause, then --retry-failed)\n", s->unrunnable, s->mc_failed ? ", " : "",
            s->mc_failed, s->mc_failed ? " multiple-choice evaluation(s) failed" : "", s->distill_failed ? ", " : "",
            s->distill_failed, s->distill_failed ? " distillation(s) failed" : "");
    return 3;
}

static int cmd_sweep_run(int argc, char **argv) {
    char **sets = NULL;
    int n_sets = 0;
    if (m2d_extract_sets("sweep", &argc, argv, &sets, &n_sets)) {
        free(sets);
        return m2d_cmd_fail("sweep");
    }
    sweep_args a = {.prec_s = "fp32"};
    m2d_experiment x = {0};
    m2d_sweep_opts o = {.out = NULL};
    int rc = parse_args(argc, argv, &a) || sweep_options(&a, &o) ||
                     m2d_experiment_load(a.pos[0], a.exp, sets, n_sets, &x)
                 ? -1
                 : 0;
    m2d_sweep_summary s;
    if (rc == 0 && a.dry) {
        rc = m2d_sweep_dry_run(&x, &o, stdout) ? -1 : 0;
    } else if (rc == 0) {
        o.no_resume = a.no_resume;
        rc = m2d_sweep_run(&x, &o, &s) ? -1 : print_summary(&x, &s, a.out ? a.out : x.out);
    }
    if (rc < 0) rc = m2d_cmd_fail("sweep");
    m2d_experiment_free(&x);
    free(sets);
    return rc;
}

M2D_COMMAND(sweep, "sweep", "run an experiment's configuration grid into a resumable CSV", USAGE, cmd_sweep_run)
