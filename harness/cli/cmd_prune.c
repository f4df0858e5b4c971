/* moe2dense prune — Minitron importance of a dense teacher, then its pruned student of one shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/importance.h"
#include "cli/cmd.h"
#include "convert/prune.h"
#include "engine/engine.h"
#include "model/model.h"

static const char USAGE[] =
    "usage: moe2dense prune --teacher DIR --data FILE --shape SPEC --out DIR [--importance FILE]\n"
    "                       [--seq-len L] [--samples N] [--seed S] [--threads T] [--precision P]\n"
    "                       [--device D]\n"
    "       moe2dense prune --teacher DIR --data FILE --importance FILE --importance-only [...]\n"
    "\n"
    "Dense-to-dense structured pruning (Minitron; the paper's App. M baseline). The teacher runs over\n"
    "calibration windows of FILE (as 'calibrate' chooses them) and records activation importance:\n"
    "FFN neurons (silu(gate)*up), query heads (L2 norm of each head's output before o_proj),\n"
    "embedding channels (every RMSNorm's output, summed over layers), layers (block importance\n"
    "1 - cos(input, output), and the NLL with the layer skipped); per window the mean over tokens,\n"
    "then the L2 norm over windows. The student keeps the most important of each (whole kv groups,\n"
    "and the same number of their own query heads in each) and cuts every tensor to them.\n"
    "\n"
    "  --teacher DIR     a dense Hugging Face checkpoint (Qwen3ForCausalLM) with tokenizer.json\n"
    "  --data FILE       calibration text (UTF-8), encoded whole without BOS\n"
    "  --shape SPEC      target shape, e.g. L4-H192-F576-A6/2: layers, hidden size, FFN width, query\n"
    "                    heads / kv heads; a part left out is the teacher's; L4n ranks layers by the\n"
    "                    skip NLL instead of block importance\n"
    "  --out DIR         output directory: absent, empty, or an earlier moe2dense output\n"
    "  --importance F    the importance file (JSON; default OUT.importance.json): kept when up to date\n"
    "                    (same weights, windows and precision), else computed and written atomically;\n"
    "                    a damaged file is an error, never overwritten\n"
    "  --importance-only write the importance file and stop (no --shape, no --out)\n"
    "  --seq-len L       window length (default min(2048, max_position_embeddings))\n"
    "  --samples N       windows (default 32)\n"
    "  --seed S          choose the windows at random (as calibrate); default the first N\n"
    "  --threads T       threads (default $M2D_THREADS or all cores)\n"
    "  --precision P     the teacher's GEMMs: fp32 (default), bf16 or auto\n"
    "  --device D        cpu (default), cuda or cuda:N\n"
    "\n"
    "Writes config.json (the teacher's, with the new sizes), model.safetensors (teacher dtype, every\n"
    "value copied from the teacher; over 5 GB as transformers' shards + model.safetensors.index.json,\n"
    "as convert does), the tokenizer files and moe2dense.json (method, shape,\n"
    "parameters, importance file sha256, kept indices; last). Prints the shape and parameter count.\n";

typedef struct {
    const char *teacher, *data, *shape, *out, *imp, *device;
    long L, N, seed, thr;
    int seeded, only;
    m2d_precision prec;
} prune_args;

static int parse_args(int argc, char **argv, prune_args *a) {
    const char *L_s = NULL, *N_s = NULL, *seed_s = NULL, *thr_s = NULL, *prec_s = "fp32";
    m2d_opt o[] = {{"--teacher", 1, &a->teacher, NULL}, {"--data", 1, &a->data, NULL}, {"--shape", 1, &a->shape, NULL},
                   {"--out", 1, &a->out, NULL}, {"--importance", 1, &a->imp, NULL}, {"--seq-len", 1, &L_s, NULL},
                   {"--samples", 1, &N_s, NULL}, {"--seed", 1, &seed_s, NULL}, {"--threads", 1, &thr_s, NULL},
                   {"--precision", 1, &prec_s, NULL}, {"--device", 1, &a->device, NULL},
                   {"--importance-only", 0, NULL, &a->only}, {0}};
    if (m2d_parse_opts("prune", argc, argv, o, NULL, 0, NULL)) return -1;
    if (!a->teacher || !a->data || (a->only ? !a->imp : !a->shape || !a->out))
        return m2d_err("prune: --teacher, --data and --shape with --out (or --importance with --importance-only) "
                       "are required (see 'moe2dense help prune')");
    a->seeded = seed_s != NULL;
    return (L_s && m2d_parse_int("prune", "--seq-len", L_s, 2, 1 << 20, &a->L)) ||
                   (N_s && m2d_parse_int("prune", "--samples", N_s, 1, 1 << 24, &a->N)) ||
                   (seed_s && m2d_parse_int("prune", "--seed", seed_s, 0, 0x7fffffffffffffffL, &a->seed)) ||
                   (thr_s && m2d_parse_int("prune", "--threads", thr_s, 1, 4096, &a->thr)) ||
                   m2d_precision_parse(prec_s, "prune: --precision", &a->prec) ||
                   m2d_device_check(a->device, "prune: --device")
               ? -1
               : 0;
}

static int cmd_prune_run(int argc, char **argv) {
    prune_args a = {.device = "cpu"};
    m2d_prune_shape s = {0};
    m2d_model *m = NULL;
    m2d_importance *imp = NULL;
    char *imp_path = NULL, spec[128];
    int cached = 0;
    int rc = parse_args(argc, argv, &a) || (!a.only && m2d_prune_shape_parse(a.shape, &s)) ||
             m2d_model_open(a.teacher, &m) || (!a.only && m2d_prune_shape_check(&m->cfg, &s));
    if (!rc) {
        imp_path = a.imp ? m2d_strdup(a.imp) : m2d_path_beside(a.out, ".importance.json");
        m2d_calib_opts o = {.seq_len = (int)a.L, .n_samples = (int)a.N, .seeded = a.seeded, .seed = (uint64_t)a.seed,
                            .n_threads = (int)a.thr, .data_path = a.data, .precision = (int)a.prec,
                            .device = a.device};
        rc = m2d_importance_ensure(m, &o, imp_path, "prune", &imp, &cached) || (!a.only && m2d_prune_write(m, imp_path, &s, a.out));
    }
    if (rc) m2d_cmd_fail("prune");
    else printf("%s %s: %d windows x %d tokens, NLL %.4f\n", cached ? "kept up-to-date" : "wrote", imp_path,
                imp->n_windows, imp->seq_len, imp->nll_full);
    if (!rc && !a.only) {
        m2d_prune_shape_format(&m->cfg, &s, spec, sizeof spec);
        printf("wrote %s: %s, %lld parameters\n", a.out, spec, (long long)m2d_prune_params(&m->cfg, &s));
    }
    m2d_importance_free(imp);
    free(imp_path);
    if (m) m2d_model_close(m);
    return rc;
}

M2D_COMMAND(prune, "prune", "prune a dense teacher to a smaller dense student (Minitron importance)", USAGE,
            cmd_prune_run)
