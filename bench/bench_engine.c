/* bench_engine — sgemm peak (the yardstick), then PPL-eval and prompt-processing throughput of the
 * engine on random checkpoints: the tiny teacher's shape and its dense student, and 2-layer slices
 * with the real Qwen3-30B-A3B dimensions (MoE and its K=8 dense student), written to /tmp.
 *
 * Each case runs in a fresh process (this binary re-executed with "case ...") so that peak RSS
 * (getrusage) is the case's own. Timings on a shared 2-core machine are noisy: compare ratios
 * from one run. Usage: bench_engine [--quick] (quick: tiny shapes only)
 *        bench_engine precision [--quick] (issue 13: each case in fp32 and in bf16, alternated, with
 *            the in-process yardsticks of both precisions: the GEMM module's 2048^3 rate)
 *        bench_engine write DIR real|tiny moe|dense [LAYERS] (a checkpoint to profile; real: 2 layers)
 *        bench_engine write DIR qwen3-30b [LAYERS] (Qwen3-30B-A3B as released: its config.json with
 *            LAYERS layers, default 48, random bf16 weights N(0, 0.02), norms 1 + N(0, 0.1), in ~4 GB
 *            shards model-0000i-of-0000n.safetensors + model.safetensors.index.json; 48 layers are
 *            61.06 GB of disk, each layer ~1.25 GB. Every tensor is generated while it is written, so
 *            the writer's memory is one 64 MiB chunk whatever LAYERS is)
 *        bench_engine case DIR LABEL ppl|pp L REPS CACHE PEAK (one measurement; CACHE bit 0: weights
 *            prepared at load, bit 1: experts one at a time, bit 2: bf16) */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/blas_core.h"
#include "engine/engine.h"
#include "engine/gemm.h"
#include "engine/pool.h"
#include "testmodel.h"
#include "yardstick.h"
#include "base/util.h"

/* OpenBLAS's own multi-threaded sgemm on square n (the yardstick); the engine's CPU backend makes
 * OpenBLAS single-threaded inside its calls and splits the work over its own threads */
static double sgemm_peak(int n, int threads) {
    m2d_backend_host_blas_threads(threads);
    float *a = m2d_malloc(sizeof(float) * (size_t)n * n), *b = m2d_malloc(sizeof(float) * (size_t)n * n),
          *c = m2d_malloc(sizeof(float) * (size_t)n * n);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)((i % 17) * 0.01);
    double best = 1e30;
    for (int r = 0; r < 9; r++) {
        double t0 = m2d_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double t = m2d_now() - t0;
        if (r && t < best) best = t; /* first call warms up the thread pool */
    }
    free(a); free(b); free(c);
    return 2.0 * n * n * (double)n / best / 1e9;
}

static long peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

/* child: one model, one mode; prints one table row */
static int run_case(const char *dir, const char *label, const char *mode, int L, int reps, int cache, double peak) {
    m2d_model *m;
    if (m2d_model_open(dir, &m)) {
        fprintf(stderr, "bench: %s\n", m2d_errmsg());
        return 1;
    }
    m2d_engine *e;
    setenv("M2D_WEIGHT_CACHE_MB", "0", 1); /* the policy is chosen explicitly below */
    m2d_precision prec = cache & 4 ? M2D_PREC_BF16 : M2D_PREC_FP32;
    if (m2d_engine_open(m, &(m2d_engine_opts){.n_threads = 2, .precision = prec}, &e)) return 1;
    double tc = m2d_now();
    /* CACHE bit 0: weights prepared at load; bit 1: experts one at a time (multi-threaded GEMMs) */
    if (cache & 2) m2d_engine_set_expert_parallel(e, 0);
    cache &= 1;
    size_t cached = cache ? m2d_engine_cache_weights(e, (size_t)64 << 30) : 0;
    tc = m2d_now() - tc;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)(L + 1));
    uint64_t s = 12345;
    for (int i = 0; i <= L; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)m->cfg.vocab_size);
    }
    double *lp = m2d_malloc(sizeof(double) * (size_t)L);
    int pp = strcmp(mode, "pp") == 0;
    /* ppl: positions 0..L-2 predict 1..L-1 (as `ppl --protocol gptq`); pp: L tokens, last row only */
    int n = pp ? L : L - 1, first = pp ? L - 1 : 0;
    double best = 1e30, rate_sum = 0;
    for (int r = 0; r < reps + 1; r++) { /* +1: the first pass pages the mmap in */
        double t0 = m2d_now();
        if (m2d_engine_logprobs(e, tok, n, tok + 1, first, lp)) {
            fprintf(stderr, "bench: %s\n", m2d_errmsg());
            return 1;
        }
        double t = m2d_now() - t0;
        if (r && t < best) best = t;
        if (r) rate_sum += n / t;
    }
    double fl = yardstick_forward_flops(&m->cfg, n, n - first);
    const char *rec = getenv("M2D_BENCH_RECORD"); /* precision mode: the parent reads tok/s back */
    if (rec) {
        FILE *f = fopen(rec, "w");
        /* best tokens/s, peak RSS, then the mean of the repetitions' tokens/s (llama-bench's avg_ts
         * statistic, which bench/peer_llamacpp.sh compares it with) */
        if (f) fprintf(f, "%.6f %ld %.6f\n", n / best, peak_rss_mb(), rate_sum / reps), fclose(f);
        free(tok); free(lp);
        m2d_engine_free(e);
        m2d_model_close(m);
        return 0;
    }
    /* the machine is shared: also compare with an sgemm peak measured right now, in this process */
    double local_peak = sgemm_peak(2048, 2);
    printf("| %-28s | %-4s | %5d | %9.1f | %8.1f | %5.0f%% | %5.0f%% | %7ld | %s |\n", label, mode, L, n / best,
           fl / best / 1e9, 100 * fl / best / 1e9 / peak, 100 * fl / best / 1e9 / local_peak, peak_rss_mb(),
           cache ? m2d_strfmt("%s prepared %.2f GB (%.1f s)", m2d_precision_name(prec), cached / 1e9, tc)
                 : m2d_strfmt("%s, as stored", m2d_precision_name(prec)));
    fflush(stdout);
    free(tok);
    free(lp);
    m2d_engine_free(e);
    m2d_model_close(m);
    return 0;
}

static void spawn(const char *self, const char *dir, const char *label, const char *mode, int L, int reps, int cache,
                  double peak) {
    char Ls[16], rs[16], cs[16], ps[32];
    snprintf(Ls, sizeof Ls, "%d", L);
    snprintf(rs, sizeof rs, "%d", reps);
    snprintf(cs, sizeof cs, "%d", cache);
    snprintf(ps, sizeof ps, "%.3f", peak);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "case", dir, label, mode, Ls, rs, cs, ps, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("| %-28s | %-4s | FAILED |\n", label, mode);
}

static int write_model(const char *dir, int real, int moe, int layers) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = moe;
    o.init_std = 0.02f;
    o.dtype = M2D_BF16;
    if (real) { /* Qwen3-30B-A3B layer dimensions, 2 layers */
        o.vocab_size = 151936; o.hidden_size = 2048; o.num_hidden_layers = layers > 0 ? layers : 2;
        o.num_attention_heads = 32; o.num_key_value_heads = 4; o.head_dim = 128;
        o.num_experts = 128; o.num_experts_per_tok = 8; o.moe_intermediate_size = 768;
        o.intermediate_size = 8 * 768; o.rope_theta = 1e6; o.max_position_embeddings = 40960;
        o.eos_token_id = 151645;
    } else { /* tiny-qwen3moe dimensions */
        o.vocab_size = 8192; o.hidden_size = 192; o.num_hidden_layers = 4;
        o.num_attention_heads = 6; o.num_key_value_heads = 2; o.head_dim = 32;
        o.num_experts = 64; o.num_experts_per_tok = 8; o.moe_intermediate_size = 72;
        o.intermediate_size = 8 * 72; o.max_position_embeddings = 512; o.eos_token_id = 8189;
    }
    if (m2d_testmodel_write(dir, &o)) {
        fprintf(stderr, "bench: %s\n", m2d_errmsg());
        return -1;
    }
    return 0;
}

/* Qwen3-30B-A3B's published config.json, NUM_HIDDEN_LAYERS left open */
static const char QWEN3_30B_CONFIG[] =
    "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n  \"decoder_sparse_step\": 1,\n  \"eos_token_id\": 151645,\n  \"head_dim\": 128,\n"
    "  \"hidden_act\": \"silu\",\n  \"hidden_size\": 2048,\n  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 6144,\n  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": 48,\n"
    "  \"mlp_only_layers\": [],\n  \"model_type\": \"qwen3_moe\",\n  \"moe_intermediate_size\": 768,\n"
    "  \"norm_topk_prob\": true,\n  \"num_attention_heads\": 32,\n  \"num_experts\": 128,\n"
    "  \"num_experts_per_tok\": 8,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": 4,\n"
    "  \"output_router_logits\": false,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000.0,\n  \"router_aux_loss_coef\": 0.001,\n  \"sliding_window\": null,\n"
    "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.51.0\",\n"
    "  \"use_cache\": true,\n  \"use_sliding_window\": false,\n  \"vocab_size\": 151936\n}\n";

/* Qwen3-30B-A3B with LAYERS layers (the release's 48 when 0), sharded as released: at most 4 GB
 * (transformers' "4GB", 4 * 10^9 bytes) a shard. */
static int write_qwen3_30b(const char *dir, int layers) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.init_std = 0.02f;
    o.dtype = M2D_BF16;
    o.vocab_size = 151936; o.hidden_size = 2048; o.num_hidden_layers = layers > 0 ? layers : 48;
    o.num_attention_heads = 32; o.num_key_value_heads = 4; o.head_dim = 128;
    o.num_experts = 128; o.num_experts_per_tok = 8; o.moe_intermediate_size = 768; o.intermediate_size = 6144;
    o.norm_topk_prob = true; o.tie_word_embeddings = false;
    o.rope_theta = 1e6; o.rms_norm_eps = 1e-6; o.max_position_embeddings = 40960;
    o.bos_token_id = 151643; o.eos_token_id = 151645;
    o.shard_bytes = (size_t)4000000000u;
    char *cfg = m2d_strfmt(QWEN3_30B_CONFIG, o.num_hidden_layers);
    o.config_json = cfg;
    int rc = m2d_testmodel_write(dir, &o);
    free(cfg);
    if (rc) fprintf(stderr, "bench: %s\n", m2d_errmsg());
    return rc;
}

/* the checkpoints of a run (written to /tmp, removed after their cases) */
static const struct { const char *sub, *label; int real, moe; } models[] = {
    {"tiny-moe", "tiny teacher shape (MoE)", 0, 1},
    {"tiny-dense", "tiny dense student (K=8)", 0, 0},
    {"real-moe", "30B-A3B 2-layer slice (MoE)", 1, 1},
    {"real-dense", "30B-A3B K=8 student, 2 layers", 1, 0},
};

/* one case in a child (CACHE as in run_case); its tokens/s and peak RSS (MB) through a file */
static double spawn_rate(const char *self, const char *dir, const char *mode, int reps, int cache, long *rss) {
    char rec[] = "/tmp/m2d-bench-rec-XXXXXX";
    int fd = mkstemp(rec);
    if (fd < 0) return 0;
    close(fd);
    setenv("M2D_BENCH_RECORD", rec, 1);
    spawn(self, dir, "", mode, 512, reps, cache, 1);
    unsetenv("M2D_BENCH_RECORD");
    double r = 0;
    FILE *f = fopen(rec, "r");
    if (!f || fscanf(f, "%lf %ld", &r, rss) != 2) r = 0;
    if (f) fclose(f);
    unlink(rec);
    return r;
}

/* Issue 13: the engine in fp32 and in bf16 on the same checkpoints, alternated twice (best of
 * each), as fractions of the yardstick of their own precision, re-measured next to each case's
 * runs (best of those too): the machine is shared, so a yardstick from another moment misleads */
static int precision_mode(const char *self, int quick) {
    double y32 = yardstick_gemm_peak(M2D_PREC_FP32), y16 = yardstick_gemm_peak(M2D_PREC_BF16);
    printf("yardsticks (GEMM module, 2048^3, W bf16, 2 threads, %s): fp32 %.0f GFLOP/s, bf16 %.0f GFLOP/s "
           "(OpenBLAS sgemm %.0f, %s kernels)\n\n", m2d_gemm_isa_name(), y32, y16, sgemm_peak(2048, 2), m2d_blas_core());
    printf("| model | mode | fp32 tok/s | bf16 tok/s | bf16 / fp32 | fp32 of its yardstick now | bf16 of its yardstick now | "
           "RSS MB fp32 / bf16 |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);
    char tmpl[] = "/tmp/m2d-bench-XXXXXX";
    char *root = mkdtemp(tmpl);
    if (!root) return 1;
    const char *modes[] = {"pp", "ppl"};
    int rc = 0;
    for (size_t i = 0; i < M2D_ARRAY_LEN(models) && rc == 0; i++) {
        if (quick && models[i].real) continue;
        char *dir = m2d_path_join(root, models[i].sub);
        if (write_model(dir, models[i].real, models[i].moe, 0)) rc = 1;
        m2d_model *m = NULL;
        if (rc == 0 && m2d_model_open(dir, &m)) rc = 1;
        for (int md = 0; md < 2 && rc == 0; md++) {
            int pp = md == 0, n = pp ? 512 : 511, reps = models[i].real ? 3 : 8;
            double fl = yardstick_forward_flops(&m->cfg, n, pp ? 1 : n), r32 = 0, r16 = 0;
            long rss32 = 0, rss16 = 0;
            double p32 = 0, p16 = 0;
            for (int round = 0; round < 2; round++) { /* alternated: both see the same load */
                r32 = fmax(r32, spawn_rate(self, dir, modes[md], reps, 0, &rss32));
                p32 = fmax(p32, yardstick_gemm_peak(M2D_PREC_FP32));
                r16 = fmax(r16, spawn_rate(self, dir, modes[md], reps, 4, &rss16));
                p16 = fmax(p16, yardstick_gemm_peak(M2D_PREC_BF16));
            }
            printf("| %s | %s512 | %.1f | %.1f | %.2fx | %.0f %% | %.0f %% | %ld / %ld |\n", models[i].label,
                   pp ? "pp" : "ppl L=", r32, r16, r16 / r32, 100 * fl * r32 / n / 1e9 / p32,
                   100 * fl * r16 / n / 1e9 / p16, rss32, rss16);
            fflush(stdout);
        }
        m2d_model_close(m);
        char *cmd = m2d_strfmt("rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "bench: could not remove %s\n", dir);
        free(cmd);
        free(dir);
    }
    rmdir(root);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 9 && strcmp(argv[1], "case") == 0)
        return run_case(argv[2], argv[3], argv[4], atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), atof(argv[8]));
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "write") == 0 && strcmp(argv[3], "qwen3-30b") == 0)
        return write_qwen3_30b(argv[2], argc == 5 ? atoi(argv[4]) : 0) ? 1 : 0;
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "write") == 0) /* keep a checkpoint for profiling */
        return write_model(argv[2], strcmp(argv[3], "real") == 0, strcmp(argv[4], "moe") == 0,
                           argc == 6 ? atoi(argv[5]) : 0) ? 1 : 0;
    int quick = argc > 1 && strcmp(argv[argc - 1], "--quick") == 0;
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 1;
    self[sl] = 0;
    if (argc > 1 && strcmp(argv[1], "precision") == 0) return precision_mode(self, quick);
    double peak = sgemm_peak(2048, 2);
    printf("sgemm peak (n=2048, 2 threads, best of 8): %.1f GFLOP/s\n\n", peak);
    printf("| model | mode | L | tokens/s | GFLOP/s | of peak | of peak now | RSS MB | weights |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    fflush(stdout);
    char tmpl[] = "/tmp/m2d-bench-XXXXXX";
    char *root = mkdtemp(tmpl);
    if (!root) return 1;
    int rc = 0;
    for (size_t i = 0; i < M2D_ARRAY_LEN(models) && rc == 0; i++) {
        if (quick && models[i].real) continue;
        char *dir = m2d_path_join(root, models[i].sub);
        double t0 = m2d_now();
        if (write_model(dir, models[i].real, models[i].moe, 0)) rc = 1;
        fprintf(stderr, "bench: wrote %s in %.1f s\n", dir, m2d_now() - t0);
        if (rc == 0) {
            int reps = models[i].real ? 4 : 10; /* best-of: robust to bursts of load from other processes */
            spawn(self, dir, models[i].label, "ppl", 512, reps, 0, peak);
            spawn(self, dir, models[i].label, "ppl", 512, reps, 1, peak);
            spawn(self, dir, models[i].label, "pp", 512, reps, 0, peak);
            spawn(self, dir, models[i].label, "pp", 512, reps, 1, peak);
        }
        char *cmd = m2d_strfmt("rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "bench: could not remove %s\n", dir);
        free(cmd);
        free(dir);
    }
    rmdir(root);
    printf("\n'of peak now': against an sgemm peak re-measured in the same process right after the case\n"
           "(the machine is shared, so both see similar load).\n");
    printf("FLOPs: projections + causal attention + routed experts (k per token) + router + LM head on\n"
           "the scored rows; pp = 512 tokens with logits for the last one only (llama-bench pp512).\n");
    return rc;
}
