/* moe2dense calibrate — one pass of the unmodified teacher over calibration windows -> stats file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "calib/ensure.h"
#include "cli/cmd.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense calibrate --model DIR --data FILE --out STATS [--seq-len L] [--samples N]\n"
    "                           [--seed S] [--windows fixed|documents] [--threads T] [--precision P]\n"
    "                           [--device cpu|cuda[:N]] [--pass auto|window|layer]\n"
    "                           [--mem-budget BYTES] [--force]\n"
    "\n"
    "Runs the unmodified teacher over calibration windows of FILE and, at every MoE layer, records\n"
    "the statistics of SPEC §1 in double precision: routed counts, router probabilities, gate\n"
    "weights, output norms of every expert on every token, the E x E output Gram matrix, output\n"
    "means and routed mean/variance, per-sample ES-Act/ES-Mag, renormalised-gate sums, the exact\n"
    "single-expert pruning damage (paper 004 Eq. 7) and the router-logit Gram (M-SMoE). Every later\n"
    "command reads STATS.\n"
    "\n"
    "  --model DIR    the teacher, a Hugging Face MoE checkpoint with tokenizer.json\n"
    "                 (" M2D_CMD_TEACHER_FAMILIES ")\n"
    "  --data FILE    calibration text (UTF-8); encoded whole, without BOS\n"
    "  --out STATS    stats file to write (atomically)\n"
    "  --seq-len L    window length in tokens (default min(2048, max_position_embeddings))\n"
    "  --samples N    number of windows (default 32; all windows, with a warning, if the text has fewer)\n"
    "  --seed S       choose the N windows at random among all non-overlapping ones (splitmix64,\n"
    "                 seeded partial Fisher-Yates, see calib.h); default: the first N windows\n"
    "  --windows W    fixed (default): consecutive blocks of L tokens of the text encoded whole;\n"
    "                 documents: one window per WikiText article (a line ' = Title = ' starts one),\n"
    "                 each encoded on its own and cut at L tokens, so windows vary in length\n"
    "                 (ES-Act then differs from SF/k)\n"
    "  --threads T    threads (default $M2D_THREADS or all cores)\n"
    "  --precision P  the teacher's GEMMs: fp32 (default; exact), bf16 (operands rounded to bf16,\n"
    "                 fp32 accumulation) or auto (bf16 where the CPU computes it natively); the\n"
    "                 one used is recorded in STATS (statistics themselves are summed in fp64)\n"
    "  --device D     where the teacher runs: cpu (default), cuda or cuda:N (needs a `make CUDA=1`\n"
    "                 build and a GPU: an absent device is an error, never a CPU run); auto is bf16\n"
    "                 there; the statistics agree with the CPU's within the tolerances of test_calib\n"
    M2D_CMD_PASS_USAGE
    "                 (the spill file goes beside STATS, unlinked at once)\n"
    "  --force        recompute even if STATS is already up to date\n"
    "\n"
    "Windows are consecutive, non-overlapping blocks of L tokens from the start of the encoded\n"
    "text; their start offsets are recorded in STATS. If STATS exists, is intact and was computed\n"
    "from the same model weights, windows, gate convention and precision, it is kept ('up to date').\n";

typedef struct {
    const char *model, *data, *out, *device, *seed_s, *pass_s, *budget_s;
    long L, N, seed, thr;
    m2d_pass_mode pass;
    size_t budget;
    int documents, force;
    m2d_precision prec, used; /* requested, and the one used on the device */
} calib_args;

static int parse_args(int argc, char **argv, calib_args *a) {
    const char *L_s = NULL, *N_s = NULL, *thr_s = NULL, *win_s = NULL, *prec_s = "fp32";
    m2d_opt opts[] = {{"--model", 1, &a->model, NULL},  {"--data", 1, &a->data, NULL},      {"--out", 1, &a->out, NULL},
                      {"--seq-len", 1, &L_s, NULL},  {"--samples", 1, &N_s, NULL},    {"--seed", 1, &a->seed_s, NULL},
                      {"--threads", 1, &thr_s, NULL}, {"--force", 0, NULL, &a->force},   {"--windows", 1, &win_s, NULL},
                      {"--precision", 1, &prec_s, NULL}, {"--device", 1, &a->device, NULL},
                      {"--pass", 1, &a->pass_s, NULL}, {"--mem-budget", 1, &a->budget_s, NULL},
                      {0}};
    if (m2d_parse_opts("calibrate", argc, argv, opts, NULL, 0, NULL)) return -1;
    if (!a->model || !a->data || !a->out)
        return m2d_err("calibrate: --model, --data and --out are required (see 'moe2dense help calibrate')");
    if ((L_s && m2d_parse_int("calibrate", "--seq-len", L_s, 2, 1 << 20, &a->L)) ||
        (N_s && m2d_parse_int("calibrate", "--samples", N_s, 1, 1 << 24, &a->N)) ||
        (a->seed_s && m2d_parse_int("calibrate", "--seed", a->seed_s, 0, 0x7fffffffffffffffL, &a->seed)) ||
        (thr_s && m2d_parse_int("calibrate", "--threads", thr_s, 1, 4096, &a->thr)))
        return -1;
    a->documents = win_s && !strcmp(win_s, "documents");
    if (win_s && !a->documents && strcmp(win_s, "fixed"))
        return m2d_err("calibrate: --windows '%s': expected fixed or documents", win_s);
    return m2d_precision_parse(prec_s, "calibrate: --precision", &a->prec) ||
                   m2d_cmd_pass_args("calibrate", a->pass_s, a->budget_s, &a->pass, &a->budget) ||
                   m2d_device_check(a->device, "calibrate: --device") ||
                   m2d_engine_resolve_precision(a->device, a->prec, &a->used)
               ? -1
               : 0;
}

/* The teacher's calibration, or the up-to-date STATS kept; the job's options from A. */
static int calibrate(calib_args *a, const m2d_model *m, const m2d_tokenizer *tk, m2d_calib_job *j) {
    if (a->L == 0) a->L = m2d_calib_default_seq_len(&m->cfg);
    j->opts = (m2d_calib_opts){.seq_len = (int)a->L, .n_samples = (int)a->N, .seeded = a->seed_s != NULL,
                               .seed = (uint64_t)a->seed, .n_threads = (int)a->thr, .data_path = a->data,
                               .progress = 1, .precision = (int)a->used, .device = a->device,
                               .pass = a->pass, .mem_budget = a->budget};
    j->force = a->force;
    j->cmd = "calibrate"; /* the entry's lock: a sweep's shards may be computing the same file */
    char *spill = m2d_path_dir(a->out);
    j->opts.spill_dir = spill;
    m2d_cmd_print_pass("calibrate", m, a->pass, a->budget, (int64_t)a->L * (a->N ? a->N : M2D_CALIB_DEFAULT_SAMPLES));
    int rc = m2d_calib_job_tokens(j, tk, a->documents) || m2d_calib_ensure(j, m, a->out) ? -1 : 0;
    j->opts.spill_dir = NULL;
    free(spill);
    return rc;
}

static void print_result(const calib_args *a, const m2d_calib_job *j, const m2d_model *m) {
    const m2d_stats *s = j->stats;
    if (j->cached) {
        printf("%s is up to date (model %.12s, calibration %.12s, %d windows x %ld tokens, %s)\n", a->out,
               s->model_hash, s->calib_hash, s->n_windows, a->L, s->precision);
        return;
    }
    printf("wrote %s: %d MoE layers, %d %s x %s%ld tokens = %.0f tokens, %.1f s (%.1f GFLOP/s in experts), "
           "peak RSS %.0f MiB\n", a->out, s->n_layers, s->n_windows, a->documents ? "documents" : "windows",
           a->documents ? "up to " : "", a->L, s->N, j->seconds,
           m2d_calib_expert_flops(&m->cfg, s->N) / j->seconds * 1e-9, m2d_cmd_peak_rss_mib());
    printf("model %s\ncalibration %s\nprecision %s (requested %s)\ndevice %s\n", s->model_hash, s->calib_hash,
           s->precision, m2d_precision_name(a->prec), a->device);
}

static int cmd_calibrate_run(int argc, char **argv) {
    calib_args a = {.N = M2D_CALIB_DEFAULT_SAMPLES, .device = "cpu"};
    m2d_model *m = NULL;
    m2d_tokenizer *tk = NULL;
    m2d_calib_job j = {0};
    int rc = parse_args(argc, argv, &a) ||
             m2d_check_output_path(a.out) || /* refused now, not after the calibration */
             m2d_model_open_lazy(a.model, &m) || m2d_tokenizer_load(a.model, &tk) || calibrate(&a, m, tk, &j);
    if (rc) m2d_cmd_fail("calibrate");
    else print_result(&a, &j, m);
    m2d_calib_job_free(&j);
    if (tk) m2d_tokenizer_free(tk);
    if (m) m2d_model_close(m);
    return rc;
}

static char *calibrate_usage(void) { return m2d_cmd_usage_families(USAGE); }

M2D_COMMAND_BUILT(calibrate, "calibrate", "run the teacher over calibration text and write the stats file", calibrate_usage,
            cmd_calibrate_run)
