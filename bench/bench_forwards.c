/* bench_forwards — the engine's forward against the trainer's (train/net.c) on one dense student,
 * the measurement behind ARCHITECTURE.md "Why the trainer has its own forward".
 *
 * tiny-qwen3-dense (Qwen3, 6 layers, d 384, F 768, bf16 on disk), B = 2 windows of L = 512 random
 * tokens, fp32 GEMMs, all cores (BENCH_THREADS). Rows: the engine's m2d_engine_hidden per window
 * (weights as stored, then prepared: m2d_engine_cache_weights), the trainer's m2d_net_forward over
 * the same windows (fp32 master weights, every activation kept; with --recompute only the layer
 * inputs). The best of BENCH_REPS (default 9) after one warm-up (the best, not the median: on a
 * shared machine the other load only adds time); the largest difference of the final hidden
 * states says both compute one function. Env: M2D_MODELS (default ../shared/models). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "train/net.h"
#include "train/params.h"
#include "yardstick.h"

enum { L = 512, B = 2 };

/* the best seconds of REPS calls of FN after one warm-up; -1 on failure */
static double best(int reps, int (*fn)(void *), void *ctx) {
    double *dt = m2d_malloc(sizeof(double) * (size_t)reps);
    int rc = fn(ctx);
    for (int i = 0; rc == 0 && i < reps; i++) {
        double t0 = m2d_now();
        rc = fn(ctx);
        dt[i] = m2d_now() - t0;
    }
    qsort(dt, (size_t)reps, sizeof *dt, bench_cmp_double);
    double min = rc ? -1 : dt[0];
    free(dt);
    return min;
}

typedef struct {
    m2d_engine *e;
    m2d_net *net;
    const int32_t *tok;
    float *hidden; /* [B L d] */
} job;

static int engine_fwd(void *ctx) {
    job *j = ctx;
    int d = m2d_engine_model(j->e)->cfg.hidden_size;
    for (int w = 0; w < B; w++)
        if (m2d_engine_hidden(j->e, j->tok + (size_t)w * L, L, j->hidden + (size_t)w * L * d, NULL)) return -1;
    return 0;
}

static int net_fwd(void *ctx) { return m2d_net_forward(((job *)ctx)->net, ((job *)ctx)->tok, B); }

static void row(const char *what, double sec) {
    printf("%-44s %8.1f ms %9.0f tokens/s\n", what, sec * 1e3, B * L / sec);
}

/* the trainer's forward (RECOMPUTE: activation checkpointing) timed; its hidden states in OUT */
static double trainer_row(const m2d_model *m, int threads, int recompute, const int32_t *tok, float *out) {
    m2d_backend *be;
    m2d_train_params *p = NULL;
    m2d_net *net = NULL;
    double sec = -1;
    m2d_backend_opts bo = {.n_threads = threads, .precision = M2D_PREC_FP32};
    if (m2d_backend_new("cpu", &bo, &be)) return -1;
    if (m2d_train_params_new(m, be, &p) == 0 &&
        m2d_net_new(&m->cfg, p, &(m2d_net_opts){.seq_len = L, .max_seqs = B, .recompute = recompute}, &net) == 0) {
        be->ops->enter(be);
        sec = best(getenv("BENCH_REPS") ? atoi(getenv("BENCH_REPS")) : 9, net_fwd, &(job){.net = net, .tok = tok});
        m2d_mat h = m2d_net_hidden(net);
        be->ops->download_mat(be, out, h.cols, &h);
        if (be->ops->leave(be)) sec = -1;
    }
    m2d_net_free(net);
    m2d_train_params_free(p);
    m2d_backend_free(be);
    return sec;
}

int main(void) {
    const char *models = getenv("M2D_MODELS") ? getenv("M2D_MODELS") : "../shared/models";
    int threads = getenv("BENCH_THREADS") ? atoi(getenv("BENCH_THREADS")) : m2d_default_threads();
    int reps = getenv("BENCH_REPS") ? atoi(getenv("BENCH_REPS")) : 9;
    char *dir = m2d_path_join(models, "tiny-qwen3-dense");
    m2d_model *m;
    if (m2d_model_open(dir, &m)) {
        printf("bench_forwards: skipped (%s)\n", m2d_errmsg());
        free(dir);
        return 0;
    }
    int d = m->cfg.hidden_size;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * B * L);
    uint64_t st = 11;
    for (int i = 0; i < B * L; i++) tok[i] = (int32_t)(m2d_splitmix64(&st) % (uint64_t)m->cfg.vocab_size);
    float *he = m2d_malloc(sizeof(float) * (size_t)B * L * d), *hn = m2d_malloc(sizeof(float) * (size_t)B * L * d);
    printf("tiny-qwen3-dense: %d layers, d %d, F %d; B=%d x L=%d, fp32 GEMMs, %d threads, best of %d\n",
           m->cfg.num_hidden_layers, d, m->cfg.intermediate_size, B, L, threads, reps);
    m2d_engine *e;
    if (m2d_engine_open(m, &(m2d_engine_opts){.backend = "cpu", .n_threads = threads, .precision = M2D_PREC_FP32}, &e)) goto fail;
    job j = {.e = e, .tok = tok, .hidden = he};
    row("engine, weights as stored (bf16 -> fp32)", best(reps, engine_fwd, &j));
    m2d_engine_cache_weights(e, (size_t)1 << 34);
    row("engine, weights prepared (fp32)", best(reps, engine_fwd, &j));
    m2d_engine_free(e);
    for (int rc = 0; rc < 2; rc++) {
        double sec = trainer_row(m, threads, rc, tok, hn);
        if (sec < 0) goto fail;
        row(rc ? "trainer, --recompute (layer inputs kept)" : "trainer (every activation kept)", sec);
    }
    double diff = 0;
    for (size_t i = 0; i < (size_t)B * L * d; i++) diff = fmax(diff, fabs((double)he[i] - hn[i]));
    size_t saved[2], scratch;
    for (int rc = 0; rc < 2; rc++) m2d_net_activation_bytes(&m->cfg, B * L, L, threads, rc, &saved[rc], &scratch);
    printf("largest |engine - trainer| of the final hidden states: %.3g\n", diff);
    printf("trainer activations kept: %.1f MiB (--recompute: %.1f MiB)\n", saved[0] / 1048576.0,
           saved[1] / 1048576.0);
    free(tok), free(he), free(hn), free(dir);
    m2d_model_close(m);
    return 0;
fail:
    fprintf(stderr, "bench_forwards: %s\n", m2d_errmsg());
    return 1;
}
