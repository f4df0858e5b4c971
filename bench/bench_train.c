/* bench_train — throughput of a distillation step (train/trainer.h) on the tiny teacher, against
 * the sgemm peak measured in the same process.
 *
 * The student is the DO-ACP / OC / proportional K = 2k conversion of tiny-qwen3moe (calibrated on
 * 4 random windows, built in memory). A step: B = 8 windows of L = 512 tokens (micro-batches of
 * 2), forward KL, AdamW; timed after one warm-up step, median of BENCH_STEPS (default 3) steps.
 * FLOPs counted per token: the teacher's forward (attention projections, the k routed experts,
 * the router, causal attention) and its LM head (the KD loss computes the teacher's logits), and
 * 3x the student's forward (forward + backward) including its LM head and causal attention. Rows:
 * the step, with --recompute, and with the student's GEMMs on bf16 operands (--train-precision);
 * then the training GEMMs alone at a real student's shapes, fp32 against bf16.
 * `bench_train wide`: a whole step at a real student's widths instead (wide_step below).
 * Env: M2D_MODELS (default ../shared/models), BENCH_STEPS, BENCH_THREADS (default: all cores). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/calib.h"
#include "convert/convert.h"
#include "engine/backend.h"
#include "model/model.h"
#include "testmodel.h"
#include "train/trainer.h"
#include "yardstick.h"

static double sgemm_gflops(int n) {
    float *a = m2d_malloc((size_t)n * n * 4), *b = m2d_malloc((size_t)n * n * 4), *c = m2d_malloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    double best = 1e300;
    for (int r = 0; r < 3; r++) {
        double t0 = m2d_now();
        for (int i = 0; i < 4; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = (m2d_now() - t0) / 4;
        if (t < best) best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * n * n * n / best * 1e-9;
}

/* forward FLOPs per token of one layer stack: projections + FFN matrices + causal attention */
static double layer_flops(const m2d_config *c, double ffn_weights, int L) {
    double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    double proj = c->hidden_size * (2 * qd + 2 * kvd);
    return c->num_hidden_layers * (2 * (proj + ffn_weights) + 2.0 * L * qd); /* QK^T + AV over L/2 keys */
}

static double step_flops_per_token(const m2d_config *t, const m2d_config *s, int L) {
    double head = 2.0 * t->vocab_size * t->hidden_size;
    double teacher = layer_flops(t, 3.0 * t->hidden_size * t->moe_intermediate_size * t->num_experts_per_tok +
                                        (double)t->hidden_size * t->num_experts, L) + head;
    double student = layer_flops(s, 3.0 * s->hidden_size * s->intermediate_size, L) + 2.0 * s->vocab_size * s->hidden_size;
    return teacher + 3 * student;
}

static int build_student(const m2d_model *t, m2d_model **student) {
    int L = 256, n = 4;
    int32_t *ids = m2d_malloc(sizeof(int32_t) * (size_t)L * n);
    uint64_t st = 7;
    for (int i = 0; i < L * n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((st >> 33) % (uint64_t)t->cfg.vocab_size);
    }
    m2d_calib_opts co = {.seq_len = L, .n_samples = n};
    m2d_stats *stats;
    m2d_convert_plan *plan;
    m2d_convert_opts o = {.scoring = "do-acp", .grouping = "oc", .scaling = "proportional",
                          .K = 2 * t->cfg.num_experts_per_tok, .target = M2D_TARGET_DENSE};
    int rc = m2d_calib_run(t, ids, (int64_t)L * n, &co, &stats);
    if (rc == 0) rc = m2d_convert_plan_build(t, stats, &o, &plan);
    if (rc == 0) rc = m2d_convert_build(t, plan, student);
    if (rc == 0) m2d_convert_plan_free(plan);
    m2d_calib_stats_free(stats);
    free(ids);
    return rc;
}

/* median seconds per step of N steps after one warm-up */
static double time_steps(const m2d_model *t, const m2d_model *s, m2d_trainer_opts o, int n, const int32_t *tok) {
    m2d_trainer *tr;
    if (m2d_trainer_new(t, s, &o, &tr)) return -1;
    double *dt = m2d_malloc(sizeof(double) * (size_t)n);
    m2d_step_stats st;
    int rc = m2d_trainer_step(tr, 1, tok, &st);
    for (int i = 0; rc == 0 && i < n; i++) {
        double t0 = m2d_now();
        rc = m2d_trainer_step(tr, i + 2, tok + (size_t)(i % 2) * o.batch * o.seq_len, &st);
        dt[i] = m2d_now() - t0;
    }
    qsort(dt, (size_t)n, sizeof *dt, bench_cmp_double);
    double med = rc ? -1 : dt[n / 2];
    free(dt);
    m2d_trainer_free(tr);
    return med;
}

/* best of 3 seconds of each of a projection's training GEMMs for N rows of IN -> OUT at PREC, on the
 * backend's ops (weights: a training view), each round in one enter/leave bracket as a step is:
 * [0] forward y = x W^T, [1] dx = dy W (the bracket's first: a bf16 weight's transpose is made in
 * it), [2] dW += dy^T x, [3] dx again (the transpose kept: every later micro-batch and LM head
 * block of a step) */
static void gemm_times(m2d_backend *be, int n, int in, int out, m2d_precision prec, double best[4]) {
    const m2d_backend_train_ops *tr = be->ops->train;
    size_t nw = (size_t)out * in, nx = (size_t)n * in, ny = (size_t)n * out, big = M2D_MAX(nw, M2D_MAX(nx, ny));
    float *h = m2d_malloc(sizeof(float) * big);
    uint64_t st = 3;
    for (size_t i = 0; i < big; i++) h[i] = (float)m2d_rand_normal(&st) * 0.05f;
    m2d_buf *wb = be->ops->alloc(be, nw * 4), *xb = be->ops->alloc(be, nx * 4), *yb = be->ops->alloc(be, ny * 4);
    m2d_buf *dxb = be->ops->alloc(be, nx * 4), *dwb = be->ops->alloc(be, nw * 4);
    be->ops->upload(be, wb, 0, h, nw * 4), be->ops->upload(be, xb, 0, h, nx * 4), be->ops->upload(be, yb, 0, h, ny * 4);
    be->ops->upload(be, dwb, 0, h, nw * 4);
    m2d_weight *w = tr->weight_view(be, wb, 0, out, in);
    m2d_mat X = m2d_mat_of(xb, 0, n, in, in), Y = m2d_mat_of(yb, 0, n, out, out);
    m2d_mat DX = m2d_mat_of(dxb, 0, n, in, in), DW = m2d_mat_of(dwb, 0, out, in, in);
    best[0] = best[1] = best[2] = best[3] = 1e300;
    for (int rep = 0; rep < 3; rep++) {
        be->ops->enter(be);
        double t[5];
        t[0] = m2d_now();
        be->ops->gemm(be, &X, w, 0, &Y, 0.0f, prec);
        t[1] = m2d_now();
        tr->gemm_dx(be, &Y, w, &DX, 0.0f, prec);
        t[2] = m2d_now();
        tr->gemm_dw(be, &Y, &X, &DW, 1.0f, prec);
        t[3] = m2d_now();
        tr->gemm_dx(be, &Y, w, &DX, 0.0f, prec);
        t[4] = m2d_now();
        if (be->ops->leave(be)) fprintf(stderr, "bench_train: %s\n", m2d_errmsg());
        for (int k = 0; k < 4; k++) best[k] = M2D_MIN(best[k], t[k + 1] - t[k]);
    }
    be->ops->weight_free(be, w);
    m2d_buf *all[] = {wb, xb, yb, dxb, dwb};
    for (int i = 0; i < 5; i++) be->ops->release(be, all[i]);
    free(h);
}

/* The student's training GEMMs at Qwen3-30B-A3B's K = 8 shapes (d = 2048, F = 6144; 2,048 rows: a
 * micro-batch of 4 x 512; the LM head in the KD loss's row blocks of 128 MiB of logits: 220 rows of
 * 151,936), fp32 against bf16 operands, in GFLOP/s; dx is the steady one (bf16: the weight's
 * transpose made once a step, its time beside) */
static void train_gemms(int threads) {
    m2d_backend_opts bo = {.n_threads = threads};
    m2d_backend *be;
    if (m2d_backend_new("cpu", &bo, &be)) return;
    const int shapes[][3] = {{2048, 2048, 6144}, {2048, 6144, 2048}, {2048, 2048, 4096}, {220, 2048, 151936}};
    printf("\ntraining GEMMs (GFLOP/s; forward y = x W^T, dx = dy W, dW += dy^T x):\n");
    printf("| rows x in -> out | fp32 forward | fp32 dx | fp32 dW | bf16 forward | bf16 dx | bf16 dW | bf16 W^T (once a step) "
           "| bf16 / fp32 (the three) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int n = shapes[i][0], in = shapes[i][1], out = shapes[i][2];
        double f = 2.0 * n * in * out * 1e-9, a[4], b[4];
        gemm_times(be, n, in, out, M2D_PREC_FP32, a);
        gemm_times(be, n, in, out, M2D_PREC_BF16, b);
        printf("| %d x %d -> %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f ms | %.2fx |\n", n, in, out, f / a[0],
               f / a[3], f / a[2], f / b[0], f / b[3], f / b[2], (b[1] - b[3]) * 1e3, (a[0] + a[3] + a[2]) / (b[0] + b[3] + b[2]));
        fflush(stdout);
    }
    m2d_backend_free(be);
}

/* A whole KD step at a real student's widths (Qwen3-30B-A3B's K = 8 student: d = 2048, F = 6144,
 * 32 q / 4 kv heads of 128) with 4 layers and an 8,192-token vocabulary (so that teacher, student
 * and their training state fit a 24 GB machine: 260 M parameters, 4.2 GB of state), distilled from
 * itself (a dense teacher: the step's teacher part is one forward of the same model); B = 4 x L =
 * 512, micro-batches of 2; fp32 against the student's GEMMs in bf16, and the teacher's too; median
 * of 3 steps after one warm-up. bench_train wide [DIR] (default /tmp/m2d-bench-train-wide, written if absent). */
static int wide_step(const char *dir, int threads) {
    if (!m2d_file_exists(dir)) {
        m2d_testmodel_opts mo;
        m2d_testmodel_defaults(&mo);
        mo.moe = false, mo.init_std = 0.02f, mo.dtype = M2D_BF16;
        mo.vocab_size = 8192, mo.hidden_size = 2048, mo.num_hidden_layers = 4;
        mo.num_attention_heads = 32, mo.num_key_value_heads = 4, mo.head_dim = 128;
        mo.intermediate_size = 6144, mo.rope_theta = 1e6, mo.max_position_embeddings = 4096, mo.eos_token_id = 8189;
        if (m2d_testmodel_write(dir, &mo)) return -1;
    }
    m2d_model *t, *s;
    if (m2d_model_open(dir, &t) || m2d_model_open(dir, &s)) return -1;
    m2d_trainer_opts o = {.seq_len = 512, .batch = 4, .micro_batch = 2, .loss = M2D_LOSS_FKL, .threads = threads};
    m2d_optim_defaults(&o.optim);
    o.optim.steps = 4;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * 2 * (size_t)o.batch * o.seq_len);
    uint64_t st = 5;
    for (int i = 0; i < 2 * o.batch * o.seq_len; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((st >> 33) % (uint64_t)s->cfg.vocab_size);
    }
    /* FLOPs a token: the teacher's forward once and the student's three times, as above */
    double fpt = 4 * layer_flops(&s->cfg, 3.0 * s->cfg.hidden_size * s->cfg.intermediate_size, o.seq_len) +
                 4 * 2.0 * s->cfg.vocab_size * s->cfg.hidden_size;
    double tokens = (double)o.batch * o.seq_len, sec[3];
    printf("\nwhole KD step at a real student's widths (%s: d %d, F %d, 4 layers, vocab %d; B = %d x L = %d, "
           "micro-batch %d; %d threads; median of 3):\n", dir, s->cfg.hidden_size, s->cfg.intermediate_size,
           s->cfg.vocab_size, o.batch, o.seq_len, o.micro_batch, threads);
    int rc = 0;
    const char *rows[] = {"step, fp32", "step, --train-precision bf16", "the same, teacher --precision bf16"};
    for (int p = 0; p < 3 && rc == 0; p++) {
        o.train_precision = p ? M2D_PREC_BF16 : M2D_PREC_FP32;
        o.precision = p == 2 ? M2D_PREC_BF16 : M2D_PREC_FP32;
        sec[p] = time_steps(t, s, o, 3, tok);
        if (sec[p] < 0) rc = -1;
        else printf("%-36s %10.3f s/step %8.0f tokens/s %7.1f GFLOP/s\n", rows[p], sec[p], tokens / sec[p],
                    fpt * tokens / sec[p] * 1e-9);
    }
    if (rc == 0)
        printf("against fp32: %.2fx, %.2fx; peak RSS %.1f MB\n", sec[0] / sec[1], sec[0] / sec[2],
               m2d_peak_rss() / 1048576.0);
    free(tok);
    m2d_model_close(s);
    m2d_model_close(t);
    return rc;
}

int main(int argc, char **argv) {
    const char *models = getenv("M2D_MODELS") ? getenv("M2D_MODELS") : "../shared/models";
    int steps = getenv("BENCH_STEPS") ? atoi(getenv("BENCH_STEPS")) : 3;
    int threads = getenv("BENCH_THREADS") ? atoi(getenv("BENCH_THREADS")) : m2d_default_threads();
    if (argc > 1 && strcmp(argv[1], "wide") == 0) {
        if (wide_step(argc > 2 ? argv[2] : "/tmp/m2d-bench-train-wide", threads) == 0) return 0;
        fprintf(stderr, "bench_train: %s\n", m2d_errmsg());
        return 1;
    }
    char *dir = m2d_path_join(models, "tiny-qwen3moe");
    m2d_model *t, *s = NULL;
    if (m2d_model_open(dir, &t)) {
        printf("bench_train: skipped (%s)\n", m2d_errmsg());
        free(dir);
        return 0;
    }
    if (build_student(t, &s)) {
        fprintf(stderr, "bench_train: %s\n", m2d_errmsg());
        return 1;
    }
    m2d_trainer_opts o = {.seq_len = 512, .batch = 8, .micro_batch = 2, .loss = M2D_LOSS_FKL, .threads = threads};
    m2d_optim_defaults(&o.optim);
    o.optim.steps = steps + 1;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * 2 * (size_t)o.batch * o.seq_len);
    uint64_t st = 11;
    for (int i = 0; i < 2 * o.batch * o.seq_len; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((st >> 33) % (uint64_t)t->cfg.vocab_size);
    }
    m2d_backend_host_blas_threads(threads);
    double peak = sgemm_gflops(1024);
    m2d_backend_host_blas_threads(1);
    double fpt = step_flops_per_token(&t->cfg, &s->cfg, o.seq_len), tokens = (double)o.batch * o.seq_len;
    printf("tiny-qwen3moe -> dense K=%d student (width %d); step: B=%d x L=%d, micro-batch %d, fkl, AdamW; %d "
           "threads; median of %d steps\n", 2 * t->cfg.num_experts_per_tok, s->cfg.intermediate_size, o.batch, o.seq_len,
           o.micro_batch, threads, steps);
    printf("%-36s %10.1f GFLOP/s\n", "sgemm 1024^3 (in-run peak)", peak);
    printf("%-36s %10.3f GFLOP\n", "FLOPs per token (teacher + 3x student)", fpt * 1e-9);
    const char *rows[] = {"step", "step, --recompute", "step, --train-precision bf16"};
    for (int row = 0; row < 3; row++) {
        o.recompute = row == 1;
        o.train_precision = row == 2 ? M2D_PREC_BF16 : M2D_PREC_FP32;
        double sec = time_steps(t, s, o, steps, tok);
        if (sec < 0) {
            fprintf(stderr, "bench_train: %s\n", m2d_errmsg());
            return 1;
        }
        double gf = fpt * tokens / sec * 1e-9;
        printf("%-36s %10.3f s/step %8.0f tokens/s %7.1f GFLOP/s (%4.1f%% of peak)\n",
               rows[row], sec, tokens / sec, gf, 100 * gf / peak);
    }
    printf("%-36s %10.1f MB\n", "peak RSS (process)", m2d_peak_rss() / 1048576.0);
    train_gemms(threads);
    free(tok);
    m2d_convert_student_free(s);
    m2d_model_close(t);
    free(dir);
    return 0;
}
