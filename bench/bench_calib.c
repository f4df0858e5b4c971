/* bench_calib — cost of the calibration pass on the tiny teacher, against the sgemm peak.
 *
 * Prints: sgemm peak (1024³) and sgemm at the expert shape; a plain teacher forward over the
 * calibration tokens (no hook); all E experts on all tokens through m2d_engine_expert (the part
 * calibration cannot avoid); the full calibration (fast path) and its FLOP rate in the experts;
 * the obviously-correct reference path on a few tokens for the speed-up.
 * Timings are wall clock, best of R runs; the machine is shared, so expect noise.
 * Env: M2D_MODELS (default ../shared/models), BENCH_WINDOWS (default 4), BENCH_REPEAT (default 3).
 *
 * bench_calib rss DIR calib|eval WINDOWS [fp32|bf16] — peak resident memory and time of one
 * calibration (or a PPL-style evaluation) of WINDOWS x 512 random tokens on the checkpoint DIR in
 * that precision (default fp32; calibration also prints its expert GFLOP/s) (e.g. the 2- and 4-layer
 * 30B-shaped slices of `bench_engine write DIR real moe LAYERS`), split into anonymous memory and
 * mapped weight pages (/proc/self/status sampled every 20 ms).
 *
 * bench_calib bound DIR WINDOWS fp32|bf16 ROUNDS — calibration against its FLOP bound, each round
 * between two yardstick measurements (see bound_run): the ratio measured under one load. */
#include <cblas.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "calib/calib.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "model/model.h"
#include "base/util.h"
#include "yardstick.h"

static double best_of(int r, double (*fn)(void *), void *arg) {
    double best = 1e300;
    for (int i = 0; i < r; i++) {
        double t = fn(arg);
        if (t < best) best = t;
    }
    return best;
}

typedef struct { int m, n, k; float *a, *b, *c; } gemm_arg;
static double run_sgemm(void *p) {
    gemm_arg *g = p;
    double t0 = m2d_now();
    int reps = (int)(2e9 / (2.0 * g->m * g->n * g->k)) + 1;
    for (int i = 0; i < reps; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->m, g->n, g->k, 1.0f, g->a, g->k, g->b, g->k, 0.0f, g->c,
                    g->n);
    return (m2d_now() - t0) / reps;
}

static double sgemm_gflops(int m, int n, int k, int repeat) {
    gemm_arg g = {m, n, k, m2d_malloc((size_t)m * k * 4), m2d_malloc((size_t)n * k * 4), m2d_malloc((size_t)m * n * 4)};
    for (size_t i = 0; i < (size_t)m * k; i++) g.a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)n * k; i++) g.b[i] = (float)(i % 5) * 0.1f;
    double t = best_of(repeat, run_sgemm, &g);
    free(g.a); free(g.b); free(g.c);
    return 2.0 * m * n * k / t * 1e-9;
}

typedef struct {
    const m2d_model *m;
    const int32_t *ids;
    int64_t n_ids;
    m2d_calib_opts o;
} calib_arg;

static double run_calib(void *p) {
    calib_arg *a = p;
    m2d_stats *s;
    double t0 = m2d_now();
    if (m2d_calib_run(a->m, a->ids, a->n_ids, &a->o, &s)) {
        fprintf(stderr, "bench_calib: %s\n", m2d_errmsg());
        exit(1);
    }
    double t = m2d_now() - t0;
    m2d_calib_stats_free(s);
    return t;
}

static double run_forward(void *p) {
    calib_arg *a = p;
    m2d_engine *e;
    if (m2d_engine_new(a->m, m2d_default_threads(), &e)) exit(1); /* weights as calibration keeps them */
    int L = a->o.seq_len;
    double lp, t0 = m2d_now();
    for (int w = 0; w < a->o.n_samples; w++)
        if (m2d_engine_logprobs(e, a->ids + (size_t)w * L, L, a->ids + (size_t)w * L, L - 1, &lp)) exit(1);
    double t = m2d_now() - t0;
    m2d_engine_free(e);
    return t;
}

static double run_experts(void *p) {
    calib_arg *a = p;
    const m2d_config *c = &a->m->cfg;
    m2d_engine *e;
    if (m2d_engine_new(a->m, m2d_default_threads(), &e)) exit(1);
    int L = a->o.seq_len, d = c->hidden_size;
    float *x = m2d_malloc((size_t)L * d * 4), *y = m2d_malloc((size_t)L * d * 4);
    for (size_t i = 0; i < (size_t)L * d; i++) x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    double t0 = m2d_now();
    for (int w = 0; w < a->o.n_samples; w++)
        for (int l = 0; l < c->num_hidden_layers; l++) {
            if (!c->layer_is_moe[l]) continue;
            for (int ex = 0; ex < c->num_experts; ex++)
                if (m2d_engine_expert(e, l, ex, x, L, y)) exit(1);
        }
    double t = m2d_now() - t0;
    free(x); free(y);
    m2d_engine_free(e);
    return t;
}

/* ---- rss mode ---- */
static volatile int rss_stop;
static long rss_peak_anon, rss_peak_file; /* kB */

static void rss_sample(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %ld", &v) == 1 && v > rss_peak_anon) rss_peak_anon = v;
        if (sscanf(line, "RssFile: %ld", &v) == 1 && v > rss_peak_file) rss_peak_file = v;
    }
    if (f) fclose(f);
}

static void *rss_sampler(void *arg) {
    (void)arg;
    while (!rss_stop) {
        rss_sample();
        usleep(20000);
    }
    return NULL;
}

/* bytes of DIR's *.safetensors files */
static double checkpoint_bytes(const char *dir) {
    double b = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        struct stat sb;
        char *p = m2d_path_join(dir, e->d_name);
        if (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0 && stat(p, &sb) == 0) b += (double)sb.st_size;
        free(p);
    }
    if (d) closedir(d);
    return b;
}

/* N token ids uniform over the vocabulary V, the same sequence every run (malloc'd) */
static int32_t *random_tokens(int64_t n, int V) {
    int32_t *ids = m2d_malloc(sizeof(int32_t) * (size_t)n);
    uint64_t st = 1;
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((st >> 33) % (uint64_t)V);
    }
    return ids;
}

static int rss_run(const char *dir, const char *mode, int windows, const char *prec_s) {
    m2d_precision prec;
    if (m2d_precision_parse(prec_s, "bench_calib rss", &prec)) {
        fprintf(stderr, "%s\n", m2d_errmsg());
        return 1;
    }
    m2d_model *m;
    if (m2d_model_open(dir, &m)) {
        fprintf(stderr, "bench_calib: %s\n", m2d_errmsg());
        return 1;
    }
    int L = 512, calib = strcmp(mode, "calib") == 0;
    int64_t n = (int64_t)windows * L;
    int32_t *ids = random_tokens(n, m->cfg.vocab_size);
    double peak = calib ? yardstick_gemm_peak(prec) : 0; /* the bound's yardstick, before and after the run */
    pthread_t tid;
    pthread_create(&tid, NULL, rss_sampler, NULL);
    double t0 = m2d_now();
    int rc = 0;
    if (calib) {
        calib_arg a = {m, ids, n, {.seq_len = L, .n_samples = windows, .precision = (int)prec}};
        double tc = run_calib(&a);
        peak = fmax(peak, yardstick_gemm_peak(prec));
        double fl = yardstick_calib_flops(&m->cfg, windows, L), bound = fl / (peak * 1e9);
        printf("calibration in %s: %.2f s, %.0f GFLOP/s in the experts; %.3f TFLOP in all, FLOP bound %.2f s at the "
               "%s yardstick %.0f GFLOP/s (GEMM module 2048^3, best of before and after): %.2fx the bound\n",
               prec_s, tc, m2d_calib_expert_flops(&m->cfg, (double)n) / tc * 1e-9, fl * 1e-12, bound, prec_s, peak,
               tc / bound);
    } else {
        m2d_engine *e;
        double *lp = m2d_malloc(sizeof(double) * (size_t)L);
        rc = m2d_engine_open(m, &(m2d_engine_opts){.n_threads = m2d_default_threads(), .precision = prec}, &e);
        for (int w = 0; w < windows && rc == 0; w++) /* as `ppl --protocol gptq`: L-1 predictions */
            rc = m2d_engine_logprobs(e, ids + (size_t)w * L, L - 1, ids + (size_t)w * L + 1, 0, lp);
        if (rc) fprintf(stderr, "bench_calib: %s\n", m2d_errmsg());
        if (rc == 0) m2d_engine_free(e);
        free(lp);
    }
    double t = m2d_now() - t0;
    rss_stop = 1;
    pthread_join(tid, NULL);
    rss_sample();
    printf("%s: %s, %d layers, %d x %d tokens: %.1f s, peak anonymous %.0f MB, peak mapped weights %.0f MB "
           "(file %.0f MB)\n", dir, calib ? "calibrate" : "evaluate", m->cfg.num_hidden_layers, windows, L, t,
           rss_peak_anon / 1024.0, rss_peak_file / 1024.0, checkpoint_bytes(dir) / 1e6);
    free(ids);
    m2d_model_close(m);
    return rc;
}

/* bound mode: ROUNDS calibrations of WINDOWS x 512 random tokens on DIR at PREC, each between two
 * measurements of the bf16/fp32 yardstick (the GEMM module's 2048³), so that every round's ratio
 * to its FLOP bound is taken under the load of its own minutes: this shared machine's AMX rate
 * moves by 2x within an hour, and a run's "best of before and after" pairs one round's time with
 * another moment's rate. Per round: the ratio against the mean of the two yardsticks around it
 * and against the higher one (the conservative reading); then the medians. */
static int bound_run(const char *dir, int windows, const char *prec_s, int rounds) {
    m2d_precision prec;
    m2d_model *m;
    if (m2d_precision_parse(prec_s, "bench_calib bound", &prec) || rounds < 1 || m2d_model_open(dir, &m)) {
        fprintf(stderr, "bench_calib bound: %s\n", rounds < 1 ? "ROUNDS must be >= 1" : m2d_errmsg());
        return 1;
    }
    int L = 512;
    int64_t n = (int64_t)windows * L;
    int32_t *ids = random_tokens(n, m->cfg.vocab_size);
    calib_arg a = {m, ids, n, {.seq_len = L, .n_samples = windows, .precision = (int)prec}};
    double fl = yardstick_calib_flops(&m->cfg, windows, L), *mean = m2d_malloc(sizeof(double) * (size_t)rounds);
    double *high = m2d_malloc(sizeof(double) * (size_t)rounds), before = yardstick_gemm_peak(prec);
    printf("%s: calibration of %d x %d tokens in %s, %.3f TFLOP; per round: yardstick before, time, yardstick "
           "after, x the bound at their mean / at the higher\n", dir, windows, L, prec_s, fl * 1e-12);
    for (int r = 0; r < rounds; r++) {
        double tc = run_calib(&a), after = yardstick_gemm_peak(prec);
        mean[r] = tc / (fl / ((before + after) / 2 * 1e9));
        high[r] = tc / (fl / (fmax(before, after) * 1e9));
        printf("round %d: %.0f GFLOP/s, %.2f s, %.0f GFLOP/s: %.2fx / %.2fx\n", r + 1, before, tc, after, mean[r], high[r]);
        before = after;
    }
    qsort(mean, (size_t)rounds, sizeof *mean, bench_cmp_double);
    qsort(high, (size_t)rounds, sizeof *high, bench_cmp_double);
    printf("median of %d rounds: %.2fx the FLOP bound at the yardsticks' mean (%.2fx at the higher); range %.2f-%.2fx\n",
           rounds, mean[rounds / 2], high[rounds / 2], mean[0], mean[rounds - 1]);
    free(mean); free(high); free(ids);
    m2d_model_close(m);
    return 0;
}

int main(int argc, char **argv) {
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "rss") == 0)
        return rss_run(argv[2], argv[3], atoi(argv[4]), argc == 6 ? argv[5] : "fp32");
    if (argc == 6 && strcmp(argv[1], "bound") == 0) return bound_run(argv[2], atoi(argv[3]), argv[4], atoi(argv[5]));
    const char *models = getenv("M2D_MODELS");
    if (!models) models = "../shared/models";
    char *dir = m2d_path_join(models, "tiny-qwen3moe");
    int windows = getenv("BENCH_WINDOWS") ? atoi(getenv("BENCH_WINDOWS")) : 4;
    int repeat = getenv("BENCH_REPEAT") ? atoi(getenv("BENCH_REPEAT")) : 3;
    m2d_model *m;
    if (m2d_model_open(dir, &m)) {
        printf("bench_calib: skipped (%s)\n", m2d_errmsg());
        free(dir);
        return 0;
    }
    const m2d_config *c = &m->cfg;
    int L = m2d_calib_default_seq_len(c);
    int64_t n_ids = (int64_t)windows * L;
    int32_t *ids = m2d_malloc((size_t)n_ids * sizeof *ids);
    uint64_t st = 1;
    for (int64_t i = 0; i < n_ids; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((st >> 33) % (uint64_t)c->vocab_size);
    }
    calib_arg a = {m, ids, n_ids, {.seq_len = L, .n_samples = windows}};
    double tokens = (double)n_ids, fl = m2d_calib_expert_flops(c, tokens);

    printf("tiny-qwen3moe: E=%d k=%d d=%d d_e=%d, %d windows x %d tokens, %d threads, best of %d\n", c->num_experts,
           c->num_experts_per_tok, c->hidden_size, c->moe_intermediate_size, windows, L, m2d_default_threads(), repeat);
    double peak = sgemm_gflops(1024, 1024, 1024, repeat);
    double shape = sgemm_gflops(L, c->moe_intermediate_size, c->hidden_size, repeat);
    printf("%-44s %10.1f GFLOP/s\n", "sgemm 1024^3 (peak reference)", peak);
    printf("%-44s %10.1f GFLOP/s\n", "sgemm at the expert shape (L x d_e x d)", shape);
    double tf = best_of(repeat, run_forward, &a);
    printf("%-44s %10.3f s\n", "teacher forward, no hook", tf);
    double te = best_of(repeat, run_experts, &a);
    printf("%-44s %10.3f s  %6.1f GFLOP/s (%4.1f%% of peak)\n", "all experts on all tokens (engine_expert)", te,
           fl / te * 1e-9, 100 * fl / te * 1e-9 / peak);
    double tc = best_of(repeat, run_calib, &a);
    printf("%-44s %10.3f s  %6.1f GFLOP/s in experts (%4.1f%% of peak)\n", "calibrate (fast path, full stats)", tc,
           fl / tc * 1e-9, 100 * fl / tc * 1e-9 / peak);
    printf("%-44s %10.3f s  (forward %.0f%%, experts %.0f%%, stats+Gram %.0f%%)\n", "  breakdown estimate", tc,
           100 * tf / tc, 100 * te / tc, 100 * (tc - tf - te) / tc);
    printf("%-44s %10.0f tokens/s\n", "calibration throughput", tokens / tc);
    /* reference path on one short window, scaled per token */
    calib_arg r = {m, ids, 64, {.seq_len = 64, .n_samples = 1, .reference = 1}};
    calib_arg f = {m, ids, 64, {.seq_len = 64, .n_samples = 1}};
    double tr = best_of(1, run_calib, &r), tff = best_of(repeat, run_calib, &f);
    printf("%-44s %10.3f s vs fast %.3f s: fast path %.0fx faster\n", "reference accumulator, 64 tokens", tr, tff,
           tr / tff);
    /* conversion: plan (plugins) + in-memory build per student, what a sweep pays per configuration */
    m2d_stats *st_c;
    a.o.n_samples = 1;
    if (m2d_calib_run(m, ids, L, &a.o, &st_c)) return 1;
    const char *scorings[] = {"acp", "do-acp"};
    for (int i = 0; i < 2; i++) {
        m2d_convert_opts co = {.scoring = scorings[i], .grouping = "oc", .scaling = "proportional",
                               .K = 2 * c->num_experts_per_tok, .target = M2D_TARGET_DENSE};
        double tp = 1e300, tb = 1e300;
        for (int r = 0; r < repeat; r++) {
            m2d_convert_plan *p;
            m2d_model *s;
            double t0 = m2d_now();
            if (m2d_convert_plan_build(m, st_c, &co, &p)) return 1;
            double t1 = m2d_now();
            if (m2d_convert_build(m, p, &s)) return 1;
            double t2 = m2d_now();
            tp = t1 - t0 < tp ? t1 - t0 : tp;
            tb = t2 - t1 < tb ? t2 - t1 : tb;
            m2d_convert_student_free(s);
            m2d_convert_plan_free(p);
        }
        char label[96];
        snprintf(label, sizeof label, "convert %s/oc/proportional K=%d: plan, build", scorings[i], co.K);
        printf("%-44s %10.4f s, %.4f s per student\n", label, tp, tb);
    }
    m2d_calib_stats_free(st_c);
    free(ids);
    m2d_model_close(m);
    free(dir);
    return 0;
}
