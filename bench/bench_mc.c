/* bench_mc — multiple-choice scoring on the tiny teacher: the shared-prefix KV cache with batched
 * branches (cached) against one full forward per request (naive, lm-eval's way), on the exact
 * requests `moe2dense eval` sends. Also checks both give the same log-likelihoods.
 *
 * Workloads (requests collected from the real tasks, data/ must be populated by `make data`):
 *   mmlu 5-shot   first BENCH_DOCS docs of 4 subjects (description + 5 dev shots shared by all
 *                 questions of a subject: reused from one question to the next when it fits)
 *   arc_easy 0-shot, hellaswag 0-shot, winogrande 5-shot (choices share their context / prefix)
 * Timings are wall clock, best of BENCH_REPEAT runs; the machine is shared, expect noise.
 * Env: M2D_MODELS (default ../shared/models), M2D_DATA (default data), BENCH_DOCS (default 8),
 *      BENCH_REPEAT (default 2), M2D_THREADS. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "evals/lm.h"
#include "evals/mc.h"
#include "base/util.h"

static int collect(m2d_ll_recording *rec, const char *data, const char *tasks, int shots, int limit) {
    m2d_lm lm = m2d_lm_recorder(rec);
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = data;
    m2d_mc_results res;
    if (m2d_mc_run(&lm, tasks, shots, limit, &cfg, &res)) return -1;
    m2d_mc_results_free(&res);
    return 0;
}

/* Score every request: per document (cached) or one at a time (naive). Returns seconds. */
static double score_all(m2d_lm *lm, int per_doc, const m2d_ll_recording *rec, m2d_ll_result *out) {
    double t0 = m2d_now();
    for (int i = 0; i < rec->n;) {
        int j = i + 1;
        if (per_doc)
            while (j < rec->n && rec->group[j] == rec->group[i]) j++;
        if (m2d_lm_loglikelihood(lm, rec->reqs + i, j - i, out + i)) {
            fprintf(stderr, "bench_mc: %s\n", m2d_errmsg());
            exit(1);
        }
        i = j;
    }
    return m2d_now() - t0;
}

int main(void) {
    const char *models = getenv("M2D_MODELS") ? getenv("M2D_MODELS") : "../shared/models";
    const char *data = getenv("M2D_DATA") ? getenv("M2D_DATA") : "data";
    int docs = getenv("BENCH_DOCS") ? atoi(getenv("BENCH_DOCS")) : 8;
    int repeat = getenv("BENCH_REPEAT") ? atoi(getenv("BENCH_REPEAT")) : 2;
    char *dir = m2d_path_join(models, "tiny-qwen3moe");
    if (!m2d_file_exists(dir)) {
        printf("bench_mc: %s not found, skipped\n", dir);
        free(dir);
        return 0;
    }
    struct {
        const char *label, *tasks;
        int shots;
    } loads[] = {
        {"mmlu 5-shot (4 subjects)", "mmlu_abstract_algebra,mmlu_anatomy,mmlu_marketing,mmlu_virology", 5},
        {"arc_easy 0-shot", "arc_easy", 0},
        {"hellaswag 0-shot", "hellaswag", 0},
        {"winogrande 5-shot", "winogrande", 5},
    };
    int threads = m2d_default_threads();
    m2d_lm *cached = NULL, *naive = NULL, *naive_lp = NULL;
    if (m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = threads}, M2D_LM_CACHED, 0, &cached) ||
        m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = threads}, M2D_LM_NAIVE, 0, &naive) ||
        m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = threads}, M2D_LM_NAIVE_LP, 0, &naive_lp)) {
        fprintf(stderr, "bench_mc: %s\n", m2d_errmsg());
        return 1;
    }
    printf("tiny-qwen3moe, %d threads, first %d docs per task/subject, best of %d\n", threads, docs, repeat);
    printf("%-26s %5s %5s %9s %9s %9s %8s %8s %10s %10s %9s\n", "workload", "docs", "reqs", "naive s", "naiveLP s",
           "cached s", "vs naive", "vs LP", "naive tok", "cached tok", "max|dll|");
    for (size_t w = 0; w < M2D_ARRAY_LEN(loads); w++) {
        m2d_ll_recording rec = {0};
        if (collect(&rec, data, loads[w].tasks, loads[w].shots, docs)) {
            printf("%-26s skipped: %s\n", loads[w].label, m2d_errmsg());
            m2d_ll_recording_free(&rec);
            continue;
        }
        m2d_ll_result *a = m2d_calloc((size_t)rec.n, sizeof *a), *b = m2d_calloc((size_t)rec.n, sizeof *b);
        m2d_ll_result *c = m2d_calloc((size_t)rec.n, sizeof *c);
        double tn = 1e300, tc = 1e300, tl = 1e300;
        m2d_lm_stats s0, s1, n0, n1;
        for (int r = 0; r < repeat; r++) {
            m2d_lm_engine_stats(naive, &n0);
            double t = score_all(naive, 0, &rec, b);
            m2d_lm_engine_stats(naive, &n1);
            if (t < tn) tn = t;
            t = score_all(naive_lp, 0, &rec, c);
            if (t < tl) tl = t;
            m2d_lm_engine_stats(cached, &s0);
            t = score_all(cached, 1, &rec, a);
            m2d_lm_engine_stats(cached, &s1);
            if (t < tc) tc = t;
        }
        double worst = 0;
        for (int i = 0; i < rec.n; i++) worst = fmax(worst, fmax(fabs(a[i].ll - b[i].ll), fabs(c[i].ll - b[i].ll)));
        printf("%-26s %5d %5d %9.3f %9.3f %9.3f %7.2fx %7.2fx %10lld %10lld %9.2g\n", loads[w].label, rec.calls, rec.n, tn,
               tl, tc, tn / tc, tl / tc, (long long)(n1.tokens_forwarded - n0.tokens_forwarded),
               (long long)(s1.tokens_forwarded - s0.tokens_forwarded), worst);
        free(c);
        free(a);
        free(b);
        m2d_ll_recording_free(&rec);
    }
    printf("(naive = lm-eval's way: one forward with full logits per request; naiveLP = one forward per\n"
           " request with log-probs streamed at the continuation only; cached = shared prefix in\n"
           " a KV cache kept across documents + all choices as branches of one batch. Token columns:\n"
           " positions run through the model. The second cached repeat reuses the prefix left by the\n"
           " first only for its first document.)\n");
    m2d_lm_free(cached);
    m2d_lm_free(naive);
    m2d_lm_free(naive_lp);
    free(dir);
    return 0;
}
