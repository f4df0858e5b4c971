/* bench_cuda — the cuda backend on a GPU: the GEMM peak through the backend's own gemm op (the
 * yardstick: cuBLASLt, bf16 and fp32 operands, fp32 accumulation), then PPL-eval and
 * prompt-processing (pp512) tokens/s of the engine on 2-layer slices with the real Qwen3-30B-A3B
 * dimensions (the MoE and its K=8 dense student), weights resident, at bf16 and fp32; and one
 * distillation step of that student from that teacher (distill --device cuda's work).
 *
 * Usage: [BENCH_ONLY=moe] bench_cuda [DIR]   (checkpoints are written to DIR, default a fresh folder
 *        in /tmp; the transformers comparison, tools/bench_hf_gpu.py, reads the same checkpoints;
 *        BENCH_ONLY=moe leaves the dense student's slice out)
 *        BENCH_PROFILE=knob=value[,knob=value] bench_cuda DIR: a ppl-2048 forward of the MoE
 *        slice, bf16, with those backend knobs, then a timed one, and nothing else: the target of
 *        an ncu run (tools/gpu_run.sh; its first 4 k_gx launches are the first forward's)
 * Without a cuda backend in the build, or without a GPU, it says so in one line and exits 0 (so
 * `make bench` runs everywhere); M2D_REQUIRE_GPU=1 (tools/gpu_check.sh) makes that exit 1.
 * Each timing is the best of several runs after a warm-up; leave() synchronises the device, so
 * the times include all GPU work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/engine.h"
#include "testmodel.h"
#include "base/util.h"
#include "train/trainer.h"

static int have_cuda(void) {
    for (int i = 0; i < m2d_backend_count(); i++)
        if (strcmp(m2d_backend_kind_at(i)->name, "cuda") == 0) return 1;
    return 0;
}

/* best seconds of REPS timed calls of y = x · W^T on [m, k] x [n, k] at PREC */
static double time_gemm(m2d_backend *be, int m, int n, int k, m2d_precision prec, int reps) {
    const m2d_backend_ops *B = be->ops;
    uint16_t *w = m2d_malloc(sizeof(uint16_t) * (size_t)n * k);
    float *x = m2d_malloc(sizeof(float) * (size_t)m * k);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = m2d_f32_to_bf16((float)((i % 23) * 0.01 - 0.1));
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = (float)((i % 19) * 0.01 - 0.09);
    m2d_tensor t = {"w", M2D_BF16, 2, {n, k}, w, sizeof(uint16_t) * (size_t)n * k};
    m2d_weight *wh = B->weight_new(be, &t);
    m2d_buf *xb = B->alloc(be, sizeof(float) * (size_t)m * k), *yb = B->alloc(be, sizeof(float) * (size_t)m * n);
    double best = 1e30;
    if (xb && yb && B->make_resident(be, wh, NULL) == 0) {
        B->upload(be, xb, 0, x, sizeof(float) * (size_t)m * k);
        m2d_mat X = m2d_mat_of(xb, 0, m, k, k), Y = m2d_mat_of(yb, 0, m, n, n);
        for (int r = 0; r <= reps; r++) {
            double t0 = m2d_now();
            B->enter(be);
            B->gemm(be, &X, wh, 0, &Y, 0.0f, prec);
            if (B->leave(be)) break;
            if (r) best = M2D_MIN(best, m2d_now() - t0); /* r = 0 warms up (heuristic, clocks) */
        }
    }
    B->release(be, xb);
    B->release(be, yb);
    B->weight_free(be, wh);
    free(w);
    free(x);
    return best;
}

/* returns the bf16 peak in TFLOP/s (0 if it could not be measured) */
static double gemm_table(m2d_backend *be) {
    static const int shapes[][3] = {{8192, 8192, 8192}, {512, 4096, 2048}, {2048, 2048, 4096}, {32, 768, 2048}};
    printf("| GEMM m x n x k           | bf16 TFLOP/s | fp32 TFLOP/s |\n|---|---|---|\n");
    double peak = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        double fl = 2.0 * m * n * k, tb = time_gemm(be, m, n, k, M2D_PREC_BF16, 10),
               tf = time_gemm(be, m, n, k, M2D_PREC_FP32, 5);
        printf("| %5d x %5d x %5d      | %12.1f | %12.1f |\n", m, n, k, fl / tb / 1e12, fl / tf / 1e12);
        if (i == 0) peak = fl / tb / 1e12;
    }
    fflush(stdout);
    return peak;
}

static int write_slice(const char *dir, int moe) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = moe;
    o.init_std = 0.02f;
    o.dtype = M2D_BF16;
    o.vocab_size = 151936; o.hidden_size = 2048; o.num_hidden_layers = 2;
    o.num_attention_heads = 32; o.num_key_value_heads = 4; o.head_dim = 128;
    o.num_experts = 128; o.num_experts_per_tok = 8; o.moe_intermediate_size = 768;
    o.intermediate_size = 8 * 768; o.rope_theta = 1e6; o.max_position_embeddings = 40960;
    o.eos_token_id = 151645;
    char *cfg = m2d_path_join(dir, "config.json");
    int done = m2d_file_exists(cfg);
    free(cfg);
    if (done) return 0; /* written by an earlier run into the same DIR */
    if (m2d_testmodel_write(dir, &o)) {
        fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
        return -1;
    }
    return 0;
}

/* best seconds of one logprobs call over L tokens: all rows scored (ppl) or the last one (pp) */
static double time_forward(m2d_engine *e, int V, int L, int pp, int reps) {
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)(L + 1));
    double *lp = m2d_malloc(sizeof(double) * (size_t)L), best = 1e30;
    uint64_t s = 12345;
    for (int i = 0; i <= L; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    int n = pp ? L : L - 1, first = pp ? L - 1 : 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = m2d_now();
        if (m2d_engine_logprobs(e, tok, n, tok + 1, first, lp)) {
            fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
            best = 0;
            break;
        }
        if (r) best = M2D_MIN(best, m2d_now() - t0);
    }
    free(tok);
    free(lp);
    return best;
}

/* Calibration's device work on one MoE layer of M: every expert on 512 tokens plus the fp64 Gram.
 * Timed (best of 3 after a warm-up): the outputs copied to the host whole (m2d_engine_all_experts);
 * reduced on the device (m2d_engine_all_experts_reduced: sums, norms and 9 rows a token) into
 * pageable host arrays; the same with page-locked ones (m2d_engine_pin), as calibration runs it;
 * and that with the experts expert by expert (knob all_batched 0) and by the grouped kernels
 * (all_grouped_rows 512): the A/Bs of the defaults. Its FLOPs (3 GEMMs per expert) against PEAK
 * give the fraction of the yardstick (issue 23: within 1.5x of the bound). Then the op times of
 * the reduced pass on each path, and with the Gram by FMA tiles (gram_kernel 0). */
typedef struct {
    int reduced, pinned, grouped_rows, batched, gram, overlap;
    const char *what;
} calib_run;

static const calib_run calib_runs[] = {
    {0, 0, 64, 1, 1, 0, "the host copy of f"},
    {1, 0, 64, 1, 1, 0, "the device-side reductions into pageable memory"},
    {1, 1, 64, 1, 1, 0, "the device-side reductions (what calibration runs)"},
    {1, 1, 64, 0, 1, 0, "the device-side reductions, experts one by one"},
    {1, 1, 512, 1, 1, 0, "the device-side reductions, experts by the grouped kernels (k_gx)"},
    {1, 1, 64, 1, 0, 0, "the device-side reductions, the Gram by FMA tiles"},
    {1, 1, 64, 1, 2, 0, "the device-side reductions, the Gram's loads prefetched"},
    {1, 1, 64, 1, 1, 1, "the device-side reductions, the selected rows copied during the Gram"},
};

static int calib_knobs(m2d_backend *be, const calib_run *r) {
    return be->ops->tune(be, "all_grouped_rows", r->grouped_rows) || be->ops->tune(be, "all_batched", r->batched) ||
           be->ops->tune(be, "gram_kernel", r->gram) || be->ops->tune(be, "calib_overlap", r->overlap);
}

static void calib_row(m2d_engine *e, const m2d_model *m, double peak) {
    const m2d_config *c = &m->cfg;
    int n = 512, d = c->hidden_size, E = c->num_experts, k1 = c->num_experts_per_tok + 1;
    float *x = m2d_malloc(sizeof(float) * (size_t)n * d), *f = m2d_malloc(sizeof(float) * (size_t)n * E * d);
    float *sel = m2d_malloc(sizeof(float) * (size_t)n * k1 * d);
    int32_t *ids = m2d_malloc(sizeof(int32_t) * (size_t)n * k1);
    double *g = m2d_calloc((size_t)E * E, sizeof(double)), *sum = m2d_calloc((size_t)E * d, sizeof(double));
    double *n2 = m2d_malloc(sizeof(double) * (size_t)E * n);
    for (size_t i = 0; i < (size_t)n * d; i++) x[i] = (float)((i % 29) * 0.01 - 0.14);
    for (int i = 0; i < n * k1; i++) ids[i] = (i / k1 + 17 * (i % k1)) % E; /* distinct experts a token */
    double fl = 2.0 * 3 * n * (double)d * c->moe_intermediate_size * E;
    m2d_backend *be = m2d_engine_backend(e);
    int nr = (int)(sizeof calib_runs / sizeof calib_runs[0]);
    for (int run = 0; run < nr; run++) {
        const calib_run *r = &calib_runs[run];
        if (calib_knobs(be, r)) break; /* a backend without the knobs */
        if (r->pinned && !calib_runs[run - 1].pinned) { /* as calibrate: its block arrays, the engine's x */
            m2d_engine_pin(e, sel, sizeof(float) * (size_t)n * k1 * d);
            m2d_engine_pin(e, n2, sizeof(double) * (size_t)E * n);
            m2d_engine_pin(e, x, sizeof(float) * (size_t)n * d);
        }
        double best = 1e30;
        for (int rep = 0; rep <= 3; rep++) {
            double t0 = m2d_now();
            int rc = r->reduced ? m2d_engine_all_experts_reduced(e, 0, x, n, ids, k1, sel, sum, n2, g, NULL)
                                : m2d_engine_all_experts(e, 0, x, n, f, g);
            if (rc) {
                fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
                best = 0;
                break;
            }
            if (rep) best = M2D_MIN(best, m2d_now() - t0);
        }
        if (best > 0)
            printf("calibration, 1 layer x %d tokens (%s): %.1f ms, %.1f TFLOP/s in experts, %.2fx the bound at the "
                   "bf16 yardstick (the Gram and %s included)\n", n, m2d_precision_name(m2d_engine_precision(e)),
                   best * 1e3, fl / best / 1e12, peak > 0 ? best / (fl / (peak * 1e12)) : 0, r->what);
    }
    /* where the reduced pass spends its device time (experts_all, gram, experts_reduce), per path */
    for (int run = 2; run < nr; run++) {
        printf("op times, one pass: %s:\n", calib_runs[run].what);
        fflush(stdout);
        if (calib_knobs(be, &calib_runs[run]) || be->ops->tune(be, "profile", 1)) break;
        if (m2d_engine_all_experts_reduced(e, 0, x, n, ids, k1, sel, sum, n2, g, NULL))
            fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
        be->ops->tune(be, "profile", 0);
        fflush(stderr);
    }
    calib_knobs(be, &calib_runs[2]); /* the defaults */
    m2d_engine_unpin(e, sel);
    m2d_engine_unpin(e, n2);
    m2d_engine_unpin(e, x);
    free(x), free(f), free(g), free(sel), free(ids), free(sum), free(n2);
}

/* one row's kernels: moe_grouped 3 (mma.sync, k_gx), 1 (WMMA) or 0 (per-expert reference); attn_kernel
 * 3 (tensor cores, 3xFP16), 2 (tensor cores, 3xTF32), 1 (tiles on the CUDA cores) or 0 (reference);
 * lse_two_pass: the LM head's log-sum-exp in two passes (lse_kernel 0, the reference) instead of
 * one; ldsm: k_gx's fragments by ldmatrix (knob gx_ldsm); wide: its wide blocks (gx_wide);
 * attention: the precision of attention's operands (m2d_engine_opts.attention: bf16 is
 * transformers' SDPA's arithmetic, the like-for-like row against it). The rows are A/Bs of the
 * paths on the same GPU in the same run. */
typedef struct {
    m2d_precision prec, attention;
    int moe, attn, lse_two_pass, ldsm, wide;
    int moe_only; /* a row for the MoE slice alone */
    int op_times; /* where its device time goes, too */
    const char *note;
} kernel_run;

static int set_kernels(m2d_engine *e, const kernel_run *r) {
    m2d_backend *be = m2d_engine_backend(e);
    return be->ops->tune(be, "moe_grouped", r->moe) || be->ops->tune(be, "attn_kernel", r->attn) ||
           be->ops->tune(be, "lse_kernel", !r->lse_two_pass) || be->ops->tune(be, "gx_ldsm", r->ldsm) ||
           be->ops->tune(be, "gx_wide", r->wide);
}

/* where one pp512 and one ppl-2048 call spend their device time, op by op (the backend's knob
 * profile: CUDA events around each op; its table goes to stderr) */
static void op_times(m2d_engine *e, int V) {
    m2d_backend *be = m2d_engine_backend(e);
    for (int pp = 1; pp >= 0; pp--) {
        printf("op times, one %s call:\n", pp ? "pp512" : "ppl-2048");
        fflush(stdout);
        if (be->ops->tune(be, "profile", 1)) return; /* a backend without the knob */
        time_forward(e, V, pp ? 512 : 2048, pp, 1);
        be->ops->tune(be, "profile", 0);
        fflush(stderr);
    }
}

static void model_rows(const char *dir, const char *label, double peak) {
    m2d_model *m;
    if (m2d_model_open(dir, &m)) {
        fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
        return;
    }
    /* bf16 with the default kernels; attention on bf16 operands (k_attention_b16); the
     * log-sum-exp in two passes; k_gx by ldmatrix, in wide blocks, both; the MoE by the WMMA
     * grouped kernel; attention in 3xTF32 and on the CUDA cores; the reference kernels; fp32 */
    const m2d_precision bf = M2D_PREC_BF16;
    const kernel_run runs[] = {
        {.prec = bf, .moe = 3, .attn = 3, .op_times = 1, .note = ""},
        {.prec = bf, .attention = bf, .moe = 3, .attn = 3, .op_times = 1, .note = " (attention in bf16)"},
        {.prec = bf, .moe = 3, .attn = 3, .lse_two_pass = 1, .note = " (log-sum-exp in two passes)"},
        {.prec = bf, .moe = 3, .attn = 3, .ldsm = 1, .moe_only = 1, .op_times = 1, .note = " (k_gx by ldmatrix)"},
        {.prec = bf, .moe = 3, .attn = 3, .wide = 1, .moe_only = 1, .op_times = 1, .note = " (k_gx in wide blocks)"},
        {.prec = bf, .moe = 3, .attn = 3, .ldsm = 1, .wide = 1, .moe_only = 1, .op_times = 1,
         .note = " (k_gx wide, by ldmatrix)"},
        {.prec = bf, .moe = 1, .attn = 3, .moe_only = 1, .op_times = 1, .note = " (MoE by WMMA tiles)"},
        {.prec = bf, .moe = 3, .attn = 2, .note = " (attention 3xTF32)"},
        {.prec = bf, .moe = 3, .attn = 1, .note = " (attention by SIMT tiles)"},
        {.prec = bf, .lse_two_pass = 1, .moe_only = 1, .note = " (reference kernels)"},
        {.prec = M2D_PREC_FP32, .moe = 3, .attn = 3, .note = ""}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if (m->cfg.num_experts == 0 && runs[i].moe_only) continue;
        m2d_engine *e;
        if (m2d_engine_open(m, &(m2d_engine_opts){.backend = "cuda", .precision = runs[i].prec,
                                                  .attention = runs[i].attention}, &e)) {
            fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
            continue;
        }
        if (set_kernels(e, &runs[i]))
            fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
        size_t res = m2d_engine_cache_weights(e, m2d_engine_backend(e)->ops->resident_budget(m2d_engine_backend(e)));
        double tp = time_forward(e, m->cfg.vocab_size, 512, 1, 5), tl = time_forward(e, m->cfg.vocab_size, 2048, 0, 3);
        char lab[64];
        snprintf(lab, sizeof lab, "%s%s", label, runs[i].note);
        printf("| %-42s | %s | %6.2f GB | %10.0f | %10.0f |\n", lab, m2d_precision_name(runs[i].prec), res / 1e9,
               tp > 0 ? 512 / tp : 0, tl > 0 ? 2047 / tl : 0);
        fflush(stdout);
        if (runs[i].op_times) op_times(e, m->cfg.vocab_size);
        if (m->cfg.num_experts > 0 && i == 0) calib_row(e, m, peak);
        m2d_engine_free(e);
    }
    m2d_model_close(m);
}

/* Distillation on the GPU: optimizer steps of the dense slice STUDENT from the MoE slice TEACHER
 * (its forward and LM head at bf16; the student's GEMMs at STUDENT_PREC, its AdamW in fp32, as
 * distill runs them), one window of L tokens a step: the mean of 3 steps after a warm-up one (a
 * step is synchronous: the loss comes back to the host). `tools/distill_ref.py --bench --device
 * cuda --teacher-dtype bf16 --attn sdpa` times the same step in PyTorch (tools/gpu_run.sh). */
/* the student's bf16 weights rounded at every GEMM: M2D_CUDA_WCACHE=0, or the reference kernels */
static int wcache_off(void) {
    const char *w = getenv("M2D_CUDA_WCACHE"), *f = getenv("M2D_CUDA_FAST");
    return (w && strcmp(w, "0") == 0) || (f && strcmp(f, "0") == 0);
}

static void distill_row(const char *teacher_dir, const char *student_dir, int L, m2d_precision student_prec) {
    m2d_model *t = NULL, *s = NULL;
    m2d_trainer *tr = NULL;
    m2d_trainer_opts o = {.seq_len = L, .batch = 1, .loss = M2D_LOSS_FKL, .backend = "cuda",
                          .precision = M2D_PREC_BF16, .train_precision = student_prec};
    m2d_optim_defaults(&o.optim);
    o.optim.steps = 4;
    if (m2d_model_open(teacher_dir, &t) || m2d_model_open(student_dir, &s) || m2d_trainer_new(t, s, &o, &tr)) {
        fprintf(stderr, "bench_cuda: distill: %s\n", m2d_errmsg());
    } else {
        int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)L);
        uint64_t r = 777;
        for (int i = 0; i < L; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int32_t)((r >> 33) % (uint64_t)t->cfg.vocab_size);
        }
        double t0 = 0, teacher = 0;
        m2d_step_stats st;
        int rc = 0;
        for (int step = 1; step <= 4 && !rc; step++) {
            if (step == 2) t0 = m2d_now();
            rc = m2d_trainer_step(tr, step, tok, &st);
            if (step >= 2) teacher += st.teacher_s;
        }
        if (rc) fprintf(stderr, "bench_cuda: distill: %s\n", m2d_errmsg());
        else
            printf("\n| distillation step (L = %d, 1 window, teacher bf16, student %s%s) | %.1f ms | %.0f tokens/s | "
                   "teacher forward %.1f ms | peak host RSS %.2f GB |\n",
                   L, m2d_precision_name(student_prec),
                   wcache_off() ? ", weights rounded at every GEMM" : "", (m2d_now() - t0) / 3 * 1e3, 3 * L / (m2d_now() - t0), teacher / 3 * 1e3, m2d_peak_rss() / 1e9);
        free(tok);
    }
    m2d_trainer_free(tr);
    m2d_model_close(s);
    m2d_model_close(t);
}

/* a ppl-2048 forward of the MoE slice in DIR at bf16, then a timed one, with the backend knobs of
 * KNOBS ("name=value,name=value"): 0 when they ran; -1 an error in m2d_errmsg, -2 one printed */
static int profile_forward(const char *dir, const char *knobs) {
    m2d_model *m;
    m2d_engine *e = NULL;
    if (write_slice(dir, 1)) return -2; /* it said why */
    if (m2d_model_open(dir, &m)) return -1;
    int rc = m2d_engine_open(m, &(m2d_engine_opts){.backend = "cuda", .precision = M2D_PREC_BF16}, &e);
    m2d_backend *be = rc ? NULL : m2d_engine_backend(e);
    char *list = m2d_strdup(knobs), *save = NULL;
    for (char *kv = strtok_r(list, ",", &save); rc == 0 && kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) rc = m2d_err("BENCH_PROFILE: '%s': expected knob=value", kv);
        else *eq = 0, rc = be->ops->tune(be, kv, atoi(eq + 1));
    }
    free(list);
    if (rc == 0) { /* a warm-up call and a timed one (time_forward prints its own error: 0 s) */
        m2d_engine_cache_weights(e, be->ops->resident_budget(be));
        double t = time_forward(e, m->cfg.vocab_size, 2048, 0, 1);
        if (t > 0) printf("BENCH_PROFILE %s: one ppl-2048 forward %.2f ms\n", knobs, 1e3 * t);
        rc = t > 0 ? 0 : -2;
    }
    if (be) m2d_engine_free(e);
    m2d_model_close(m);
    return rc;
}

int main(int argc, char **argv) {
    int strict = getenv("M2D_REQUIRE_GPU") != NULL;
    m2d_backend *be;
    const char *prof = getenv("BENCH_PROFILE");
    if (prof) { /* the GPU first: no 3.7 GB slice written for a machine without one */
        if (!have_cuda() || m2d_backend_new("cuda", NULL, &be)) {
            fprintf(stderr, "bench_cuda: BENCH_PROFILE: %s\n", have_cuda() ? m2d_errmsg() : "no cuda backend in this build");
            return 1;
        }
        m2d_backend_free(be);
        char *dir = m2d_path_join(argc > 1 ? argv[1] : "/tmp/m2d-bench-cuda-profile", "qwen3-30b-a3b-2l");
        int rc = profile_forward(dir, prof);
        if (rc == -1) fprintf(stderr, "bench_cuda: %s\n", m2d_errmsg());
        free(dir);
        return rc ? 1 : 0;
    }
    if (!have_cuda() || m2d_backend_new("cuda", NULL, &be)) {
        printf("bench_cuda: skipped: %s\n", have_cuda() ? m2d_errmsg() : "no cuda backend in this build (make CUDA=1)");
        return strict;
    }
    printf("# bench_cuda (see BENCHMARKS.md)\n\n");
    double peak = gemm_table(be);
    m2d_backend_free(be);
    printf("\nbf16 GEMM peak (8192^3): %.1f TFLOP/s\n\n", peak);
    char *root = argc > 1 ? m2d_strdup(argv[1]) : m2d_strfmt("/tmp/m2d-bench-cuda-%d", (int)getpid());
    char *moe = m2d_path_join(root, "qwen3-30b-a3b-2l"), *dense = m2d_path_join(root, "qwen3-30b-a3b-2l-dense-k8");
    m2d_mkdir_p(root);
    printf("| model (2-layer slice)                      | prec | resident | pp512 tok/s | ppl-2048 tok/s |\n|---|---|---|---|---|\n");
    if (write_slice(moe, 1) == 0) model_rows(moe, "Qwen3-30B-A3B MoE", peak);
    const char *only = getenv("BENCH_ONLY"); /* "moe": the MoE slice alone (a short GPU call) */
    if (!(only && strcmp(only, "moe") == 0) && write_slice(dense, 0) == 0) {
        model_rows(dense, "dense student K=8", peak);
        distill_row(moe, dense, 512, M2D_PREC_FP32);
        distill_row(moe, dense, 512, M2D_PREC_BF16); /* --train-precision bf16: tensor cores */
        char *user = getenv("M2D_CUDA_WCACHE") ? m2d_strdup(getenv("M2D_CUDA_WCACHE")) : NULL;
        setenv("M2D_CUDA_WCACHE", "0", 1); /* the same, each weight rounded at every GEMM (knob bf16_wcache 0) */
        distill_row(moe, dense, 512, M2D_PREC_BF16);
        if (user) setenv("M2D_CUDA_WCACHE", user, 1);
        else unsetenv("M2D_CUDA_WCACHE");
        free(user);
    }
    printf("\ncheckpoints: %s (tools/bench_hf_gpu.py %s %s)\n", root, moe, dense);
    free(moe);
    free(dense);
    free(root);
    return 0;
}
