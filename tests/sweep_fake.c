/* sweep_fake — test-only sweep backend "fake": deterministic and instant, for testing the sweep
 * machinery (grid, dedup, CSV, resume, shards, Slurm) without a model. Its "student" is a hash of
 * what the real pipeline's fingerprint covers; at K = k every grouping gives the same student, as
 * in the real conversion; an MoE target's student also depends on its top-k. Test hooks: a scoring named "fail..." fails to build; params "nan" gives
 * a non-finite PPL; params "distill-fail" fails to distill; $M2D_FAKE_DELAY_MS sleeps in evaluate
 * (so tests can kill a sweep mid-run). A distilled student is its student's fingerprint with
 * ":distilled" appended: half the PPL, MC accuracies (1 + a) / 2; it writes no checkpoint. Another
 * loss or teacher_topk than (fkl, 0) appends ":L<loss>:K<K'>" too: its PPL is divided by
 * 2 + loss + K' / 100 instead (the ablation's cells differ).
 * Linked into the tests, the benches and the test CLI (build/tests/moe2dense-test), never into
 * the product binary; it registers itself like any backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sweep/sweep_backend.h"
#include "base/util.h"

static void fake_fingerprint(const m2d_experiment *x, const m2d_grid_config *c, char out[65]) {
    /* at K = k each group is one expert: the grouping cannot matter */
    const char *grouping = c->K == x->k ? "*" : c->grouping;
    char *s = m2d_strfmt("%s|%d|%s|%s|%s", c->scoring, c->K, grouping, c->scaling, c->params);
    if (!strcmp(c->target, "moe")) { /* an MoE student: its router's top-k is part of it (dense: as before) */
        char *t = m2d_strfmt("%s|moe|%d", s, c->top_k ? c->top_k : x->k);
        free(s);
        s = t;
    }
    m2d_sha256_hex(s, strlen(s), out);
    free(s);
}

static int fake_prepare(m2d_sweep_backend *b, const m2d_experiment *x, char model_hash[65], char calib_hash[65]) {
    (void)b;
    char *m = m2d_strfmt("fake-teacher|E=%d|k=%d", x->E, x->k);
    m2d_sha256_hex(m, strlen(m), model_hash);
    char *c = m2d_strfmt("%s|%s|%d|%d|%lld", model_hash, x->calib_data, x->calib_seq_len, x->calib_samples,
                         (long long)x->calib_seed);
    m2d_sha256_hex(c, strlen(c), calib_hash);
    free(m);
    free(c);
    return 0;
}

static int fake_build(m2d_sweep_backend *b, const m2d_grid_config *c, void **student, m2d_sweep_result *res) {
    const m2d_experiment *x = b->x;
    if (strncmp(c->scoring, "fail", 4) == 0) {
        snprintf(res->error, sizeof res->error, "unknown scoring plugin '%s'", c->scoring);
        return -1;
    }
    fake_fingerprint(x, c, res->fingerprint);
    res->d_dense = (int64_t)x->k * (x->d_e ? x->d_e : 1);
    res->n_params = 1000000 + res->d_dense * 1000;
    *student = m2d_strdup(res->fingerprint);
    return 0;
}

static int fake_evaluate(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res) {
    const m2d_experiment *x = b->x;
    const char *delay = getenv("M2D_FAKE_DELAY_MS");
    if (delay && atoi(delay) > 0) {
        struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const char *fp = student;
    unsigned h = (unsigned)strtoul((char[9]){fp[0], fp[1], fp[2], fp[3], fp[4], fp[5], fp[6], fp[7], 0}, NULL, 16);
    res->ppl = strcmp(c->params, "nan") == 0 ? NAN : 10.0 * exp((double)(h % 1000) / 250.0);
    const char *ab = strstr(fp, ":distilled:L"); /* an ablation's (loss, K'): 2 + loss + K' / 100 */
    if (strstr(fp, ":distilled")) res->ppl /= ab ? 2 + atoi(ab + 12) + atoi(strstr(ab, ":K") + 2) / 100.0 : 2;
    res->ppl_windows = x->ppl_max_windows ? x->ppl_max_windows : 1;
    return 0;
}

static int fake_evaluate_mc(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res) {
    (void)c;
    const m2d_experiment *x = b->x;
    const char *fp = student;
    double avg = 0;
    for (int t = 0; t < x->n_mc; t++) {
        unsigned h = (unsigned)(fp[t % 60] * 31 + fp[(t + 1) % 60]);
        res->mc[2 * t] = (double)(h % 100) / 100.0;
        res->mc[2 * t + 1] = (double)((h / 7) % 100) / 100.0;
        if (strstr(fp, ":distilled"))
            for (int m = 2 * t; m < 2 * t + 2; m++) res->mc[m] = (1 + res->mc[m]) / 2;
        avg += res->mc[2 * t];
    }
    if (x->n_mc) res->mc[2 * x->n_mc] = avg / x->n_mc;
    return 0;
}

/* the teachers' MC: fixed values (the MoE teacher's 0.6 + t / 100 (acc) and 0.65 + t / 100
 * (acc_norm), the dense teacher's 0.1 above), so a test can find them in the header */
static int fake_evaluate_teacher_mc(m2d_sweep_backend *b, int d2d, m2d_sweep_result *res) {
    const m2d_experiment *x = b->x;
    if (d2d && !x->has_d2d) return 1;
    double avg = 0;
    for (int t = 0; t < x->n_mc; t++) {
        res->mc[2 * t] = 0.6 + t / 100.0 + 0.1 * d2d;
        res->mc[2 * t + 1] = res->mc[2 * t] + 0.05;
        avg += res->mc[2 * t];
    }
    if (x->n_mc) res->mc[2 * x->n_mc] = avg / x->n_mc;
    return 0;
}

static int fake_distill(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, const m2d_distill_opts *o,
                        void **distilled, m2d_distill_result *res, char error[256]) {
    if (o->train.precision != b->precision) { /* the sweep's precision is the distillation's teacher's */
        snprintf(error, 256, "fake: the distillation's precision %s is not the sweep's %s",
                 m2d_precision_name(o->train.precision), m2d_precision_name(b->precision));
        return -1;
    }
    if (strcmp(c->params, "distill-fail") == 0) {
        snprintf(error, 256, "distill: step 1: the loss is not finite");
        return -1;
    }
    const m2d_trainer_opts *t = &o->train;
    int64_t per = (int64_t)t->batch * t->seq_len;
    res->steps = res->steps_done = t->optim.steps ? t->optim.steps : (int)((o->tokens + per - 1) / per);
    res->tokens = res->steps_done * per;
    res->final_loss = (double)(((const char *)student)[0] % 16) / 8.0;
    res->finished = true;
    if (t->loss == M2D_LOSS_FKL && t->teacher_topk == 0) *distilled = m2d_strfmt("%s:distilled", (const char *)student);
    else *distilled = m2d_strfmt("%s:distilled:L%d:K%d", (const char *)student, (int)t->loss, t->teacher_topk);
    return 0;
}

static void fake_free_student(m2d_sweep_backend *b, void *student) {
    (void)b;
    free(student);
}

static int fake_plan_fingerprint(m2d_sweep_backend *b, const m2d_experiment *x, const m2d_grid_config *c,
                                 char fp[65]) {
    (void)b;
    if (strncmp(c->scoring, "fail", 4) == 0) return 1; /* fails to build: no student */
    fake_fingerprint(x, c, fp);
    return 0;
}

M2D_SWEEP_BACKEND(fake, .name = "fake", .prepare = fake_prepare, .build = fake_build, .evaluate = fake_evaluate,
                  .free_student = fake_free_student, .evaluate_mc = fake_evaluate_mc, .distill = fake_distill,
                  .evaluate_teacher_mc = fake_evaluate_teacher_mc,
                  .plan_fingerprint = fake_plan_fingerprint)
