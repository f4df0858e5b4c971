/* moe2dense calibrate — one pass of the unmodified teacher over calibration windows -> stats file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "cli/cmd.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense calibrate --model DIR --data FILE --out STATS [--seq-len L] [--samples N]\n"
    "                           [--seed S] [--windows fixed|documents] [--threads T] [--precision P]\n"
    "                           [--device cpu|cuda[:N]]\n"
    "                           [--force]\n"
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
    "  --force        recompute even if STATS is already up to date\n"
    "\n"
    "Windows are consecutive, non-overlapping blocks of L tokens from the start of the encoded\n"
    "text; their start offsets are recorded in STATS. If STATS exists, is intact and was computed\n"
    "from the same model weights, windows, gate convention and precision, it is kept ('up to date').\n";

static int cmd_calibrate_run(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *out = NULL, *L_s = NULL, *N_s = NULL, *seed_s = NULL, *thr_s = NULL,
               *win_s = NULL, *prec_s = "fp32", *device = "cpu";
    int force = 0;
    m2d_opt opts[] = {{"--model", 1, &model, NULL},  {"--data", 1, &data, NULL},      {"--out", 1, &out, NULL},
                      {"--seq-len", 1, &L_s, NULL},  {"--samples", 1, &N_s, NULL},    {"--seed", 1, &seed_s, NULL},
                      {"--threads", 1, &thr_s, NULL}, {"--force", 0, NULL, &force},   {"--windows", 1, &win_s, NULL},
                      {"--precision", 1, &prec_s, NULL}, {"--device", 1, &device, NULL},
                      {0}};
    m2d_model *m = NULL;
    m2d_tokenizer *tk = NULL;
    m2d_stats *s = NULL, *old = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    int64_t *starts = NULL, *docs = NULL;
    int *lens = NULL, n_docs = 0;
    size_t n_ids = 0, len;
    int rc = 1;
    if (m2d_parse_opts("calibrate", argc, argv, opts, NULL, 0, NULL)) goto done;
    if (!model || !data || !out) {
        m2d_err("calibrate: --model, --data and --out are required (see 'moe2dense help calibrate')");
        goto done;
    }
    long L = 0, N = M2D_CALIB_DEFAULT_SAMPLES, seed = 0, thr = 0;
    if (L_s && m2d_parse_int("calibrate", "--seq-len", L_s, 2, 1 << 20, &L)) goto done;
    if (N_s && m2d_parse_int("calibrate", "--samples", N_s, 1, 1 << 24, &N)) goto done;
    if (seed_s && m2d_parse_int("calibrate", "--seed", seed_s, 0, 0x7fffffffffffffffL, &seed)) goto done;
    if (thr_s && m2d_parse_int("calibrate", "--threads", thr_s, 1, 4096, &thr)) goto done;
    int documents = win_s && !strcmp(win_s, "documents");
    if (win_s && !documents && strcmp(win_s, "fixed")) {
        m2d_err("calibrate: --windows '%s': expected fixed or documents", win_s);
        goto done;
    }
    m2d_precision prec, used;
    if (m2d_precision_parse(prec_s, "calibrate: --precision", &prec) || m2d_device_check(device, "calibrate: --device") ||
        m2d_engine_resolve_precision(device, prec, &used))
        goto done;
    if (m2d_check_output_path(out)) goto done; /* refused now, not after the calibration */
    if (m2d_model_open(model, &m) || m2d_tokenizer_load(model, &tk)) goto done;
    if (!(text = m2d_read_file(data, &len))) goto done;
    if (documents ? m2d_calib_encode_documents(tk, text, len, &ids, &n_ids, &docs, &n_docs)
                  : m2d_tokenizer_encode(tk, text, len, &ids, &n_ids)) {
        m2d_err_prefix(data);
        goto done;
    }
    if (L == 0) L = m2d_calib_default_seq_len(&m->cfg);
    m2d_calib_opts o = {.seq_len = (int)L, .n_samples = (int)N, .seeded = seed_s != NULL, .seed = (uint64_t)seed,
                        .n_threads = (int)thr, .data_path = data, .progress = 1, .doc_starts = docs,
                        .n_docs = n_docs, .precision = (int)prec, .device = device};
    /* up to date? same model, same windows (same calib hash) */
    if (!force && m2d_file_exists(out) && m2d_stats_read(out, &old) == 0) {
        int nw;
        char h[65];
        if (m2d_calib_choose(m, ids, (int64_t)n_ids, &o, &starts, &lens, &nw, h) == 0) {
            if (!strcmp(h, old->calib_hash) && !strcmp(old->precision, m2d_precision_name(used)) &&
                m2d_stats_check_model(old, out, m) == 0) {
                printf("%s is up to date (model %.12s, calibration %.12s, %d windows x %ld tokens, %s)\n", out,
                       old->model_hash, old->calib_hash, old->n_windows, L, old->precision);
                rc = 0;
                goto done;
            }
        }
    }
    m2d_err_clear();
    double t0 = m2d_now();
    if (m2d_calib_run(m, ids, (int64_t)n_ids, &o, &s)) goto done;
    double dt = m2d_now() - t0;
    if (m2d_stats_write(s, out)) goto done;
    printf("wrote %s: %d MoE layers, %d %s x %s%ld tokens = %.0f tokens, %.1f s (%.1f GFLOP/s in experts), "
           "peak RSS %.0f MiB\n", out, s->n_layers, s->n_windows, documents ? "documents" : "windows",
           documents ? "up to " : "", L, s->N, dt, m2d_calib_expert_flops(&m->cfg, s->N) / dt * 1e-9,
           m2d_cmd_peak_rss_mib());
    printf("model %s\ncalibration %s\nprecision %s (requested %s)\ndevice %s\n", s->model_hash, s->calib_hash,
           s->precision, m2d_precision_name(prec), device);
    rc = 0;
done:
    if (rc) m2d_cmd_fail("calibrate");
    m2d_calib_stats_free(s);
    m2d_calib_stats_free(old);
    if (tk) m2d_tokenizer_free(tk);
    if (m) m2d_model_close(m);
    free(text);
    free(ids);
    free(starts);
    free(lens);
    free(docs);
    return rc;
}

M2D_COMMAND(calibrate, "calibrate", "run the teacher over calibration text and write the stats file", USAGE,
            cmd_calibrate_run)
