/* distill run: `moe2dense distill` end to end on a small random teacher and student — resume is
 * exact (the same losses and the same output, bit for bit, after a stop and a resume, even with
 * another thread count; with the teacher in fp32 and in bf16), the log, the output checkpoint and
 * its manifest, --precision (the KD targets in bf16 against fp32, what is recorded where, a resume
 * in another precision refused), DeepSeek-V2's student written in its checkpoint's shapes, and the
 * one-line errors for bad input. */
#include "testutil.h"
#include "hfcheck.h"
#include "distill_fixture.h"
#include "familyckpt.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "io/st.h"
#include "model/model.h"
#include "testmodel.h"
#include "train/distill.h"

static tu_distill_fixture g_fx;
static char *g_dir, *g_teacher, *g_student, *g_data; /* g_fx's */

/* TOP_K: experts per token of a MoE (0: the default, 2 of 8) */
static char *model_dir_k(const char *name, int moe, uint64_t seed, int top_k) {
    return tu_distill_model(g_dir, name, moe, seed, top_k);
}

static int setup(void **state) {
    (void)state;
    tu_distill_fixture_make(&g_fx);
    g_dir = g_fx.dir, g_teacher = g_fx.teacher, g_student = g_fx.student, g_data = g_fx.data;
    FILE *f = fopen(g_data, "w");
    uint64_t st = 3;
    const char *words[] = {"alpha ", "beta ", "gamma ", "delta ", "the ", "of ", "expert ", "dense\n"};
    for (int i = 0; i < 600; i++) fputs(words[tu_rand_u64(&st) % 8], f);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_distill_fixture_free(&g_fx);
    return 0;
}

static m2d_distill_opts base_opts(const char *out, const char *log) {
    m2d_distill_opts o;
    m2d_distill_defaults(&o);
    o.teacher = g_teacher, o.student = g_student, o.data = g_data, o.out = out, o.log = log;
    o.train.seq_len = 16, o.train.batch = 4, o.train.micro_batch = 2, o.train.threads = 2;
    o.train.optim.steps = 6, o.train.optim.warmup = 2, o.train.optim.lr = 3e-3, o.train.optim.min_lr = 3e-4;
    o.save_every = 2, o.quiet = true;
    return o;
}

static char *path_in(const char *name) { return m2d_path_join(g_dir, name); }

/* the training lines of a log: "step loss grad_norm lr" as printed (17 digits), one per line */
static char *trajectory(const char *log) {
    size_t n;
    char *text = m2d_read_file(log, &n), *out = m2d_strdup("");
    if (!text) fail_msg("%s", m2d_errmsg());
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("%s: a line is not JSON: %s", log, line);
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        if (loss) {
            char *more = m2d_strfmt("%s%d %.17g %.17g %.17g\n", out, cJSON_GetObjectItemCaseSensitive(j, "step")->valueint,
                                    loss->valuedouble, cJSON_GetObjectItemCaseSensitive(j, "grad_norm")->valuedouble,
                                    cJSON_GetObjectItemCaseSensitive(j, "lr")->valuedouble);
            free(out);
            out = more;
        }
        cJSON_Delete(j);
    }
    free(text);
    return out;
}

static char *file_hash(const char *dir, const char *name) {
    char *p = m2d_path_join(dir, name), hex[65];
    size_t n;
    char *d = m2d_read_file(p, &n);
    if (!d) fail_msg("%s", m2d_errmsg());
    m2d_sha256_hex(d, n, hex);
    free(d), free(p);
    return m2d_strdup(hex);
}

static cJSON *read_json(const char *dir, const char *name) {
    char *p = m2d_path_join(dir, name);
    size_t n;
    char *t = m2d_read_file(p, &n);
    if (!t) fail_msg("%s", m2d_errmsg());
    cJSON *j = cJSON_ParseWithLength(t, n);
    free(t), free(p);
    return j;
}

/* every line of LOG has "precision": WANT */
static void check_log_precision(const char *log, const char *want) {
    char *text = m2d_read_file(log, NULL);
    if (!text) fail_msg("%s", m2d_errmsg());
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "precision");
        if (!cJSON_IsString(p) || strcmp(p->valuestring, want)) fail_msg("%s: precision is not %s: %s", log, want, line);
        cJSON_Delete(j);
    }
    free(text);
}

/* Run A straight through and B stopped after step 3 then resumed (at another thread count) with
 * teacher precision PREC and the student's STUDENT (named TAG); the same trajectory and output bit
 * for bit, and both precisions recorded in the log, the checkpoint and the manifest. Returns A's
 * trajectory. */
static char *check_resume(const char *tag, m2d_precision prec, m2d_precision student) {
    char *outa = m2d_strfmt("%s/%s-a", g_dir, tag), *loga = m2d_strfmt("%s/%s-a.jsonl", g_dir, tag);
    char *outb = m2d_strfmt("%s/%s-b", g_dir, tag), *logb = m2d_strfmt("%s/%s-b.jsonl", g_dir, tag);
    const char *name = m2d_precision_name(prec);
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(outa, loga);
    o.train.precision = prec, o.train.train_precision = student;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    assert_true(r.finished);
    assert_int_equal(r.tokens, 6 * 4 * 16);
    assert_int_equal(r.precision, prec);
    /* B: stops after step 3 (checkpoint), then a line of a step 4 that a crash interrupted */
    o = base_opts(outb, logb);
    o.train.precision = prec, o.train.train_precision = student;
    o.stop_after = 3;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    cJSON *st = read_json(outb, "train-state/state.json");
    const cJSON *idp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "identity"), "precision");
    assert_true(cJSON_IsString(idp));
    assert_string_equal(idp->valuestring, name);
    idp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "identity"), "train_precision");
    assert_string_equal(idp->valuestring, m2d_precision_name(student));
    cJSON_Delete(st);
    assert_false(r.finished);
    assert_int_equal(r.steps_done, 3);
    char *marker = m2d_path_join(outb, "moe2dense.json");
    assert_false(m2d_file_exists(marker)); /* unfinished: no marker */
    FILE *f = fopen(logb, "a");
    fputs("{\"step\": 4, \"tokens\": 256, \"loss\": 123, \"grad_norm\": 1, \"lr\": 1}\n", f);
    fclose(f);
    o = base_opts(outb, logb);
    o.train.precision = prec, o.train.train_precision = student;
    o.resume = true;
    o.train.threads = 1; /* results do not depend on the thread count */
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    assert_true(r.finished);
    assert_true(m2d_file_exists(marker));
    char *ta = trajectory(loga), *tb = trajectory(logb);
    assert_string_equal(ta, tb);
    /* exact: one machine, the same computation in the same order (the trainer's results do not
     * depend on the thread count, a resume restores the state bit for bit) */
    char *ha = file_hash(outa, "model.safetensors"), *hb = file_hash(outb, "model.safetensors");
    assert_string_equal(ha, hb);
    /* the checkpoint is removed once the output is complete */
    char *state_dir = m2d_path_join(outb, "train-state");
    assert_false(m2d_file_exists(state_dir));
    check_log_precision(loga, name), check_log_precision(logb, name);
    cJSON *j = read_json(outb, "moe2dense.json");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "distill"), "settings");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "precision")->valuestring, name);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "precision_requested")->valuestring, name);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "student_training_precision")->valuestring,
                        m2d_precision_name(student));
    /* where each ran: no --device, so both on the CPU */
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "teacher_device")->valuestring, "cpu");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "student_device")->valuestring, "cpu");
    cJSON_Delete(j);
    free(tb), free(ha), free(hb), free(marker), free(state_dir);
    free(outa), free(loga), free(outb), free(logb);
    return ta;
}

static void resume_is_exact(void **state) {
    (void)state;
    free(check_resume("fp32", M2D_PREC_FP32, M2D_PREC_FP32));
}

/* The same with the teacher in bf16 (on any CPU: explicit bf16 rounds the operands where the CPU
 * has no native bf16); its trajectory is not fp32's (the KD targets changed), so bf16 did run. */
static void resume_is_exact_bf16(void **state) {
    (void)state;
    char *t32 = check_resume("p32", M2D_PREC_FP32, M2D_PREC_FP32), *t16 = check_resume("p16", M2D_PREC_BF16, M2D_PREC_FP32);
    assert_string_not_equal(t32, t16);
    free(t32), free(t16);
}

/* The same with the student trained on bf16 operands (--train-precision bf16): exact resumes, and a
 * trajectory of its own (the student's GEMMs did round) */
static void resume_is_exact_student_bf16(void **state) {
    (void)state;
    char *t32 = check_resume("s32", M2D_PREC_FP32, M2D_PREC_FP32), *t16 = check_resume("s16", M2D_PREC_FP32, M2D_PREC_BF16);
    assert_string_not_equal(t32, t16);
    free(t32), free(t16);
}

/* OUT (NAME in the work directory) holding the checkpoint of an fp32 run stopped after step 2 */
static char *stopped_run(const char *name) {
    char *out = path_in(name);
    tu_distill_stopped(base_opts(out, NULL), 2);
    return out;
}

/* A --resume of OUT, a checkpoint of an fp32 run, with the teacher (other KD targets) or the
 * student in bf16 is refused, naming the identity's field. */
static void precisions_refused(const char *out) {
    for (int student = 0; student < 2; student++) {
        m2d_distill_result r;
        m2d_distill_opts o = base_opts(out, NULL);
        o.resume = true;
        if (student) o.train.train_precision = M2D_PREC_BF16;
        else o.train.precision = M2D_PREC_BF16;
        assert_int_equal(m2d_distill_run(&o, &r), -1);
        char *want = m2d_strfmt("field 'identity.%s': the checkpoint's run had fp32, this run has bf16",
                                student ? "train_precision" : "precision");
        if (!strstr(m2d_errmsg(), want)) fail_msg("%s", m2d_errmsg());
        free(want);
    }
}

static void resume_refuses_another_run(void **state) {
    (void)state;
    char *out = stopped_run("c");
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true;
    o.train.optim.lr = 1e-3;
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    assert_non_null(strstr(m2d_errmsg(), "identity.lr"));
    precisions_refused(out); /* the teacher's or the student's precision changed */
    o = base_opts(out, NULL); /* a fresh run into an unfinished one */
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    assert_non_null(strstr(m2d_errmsg(), "--resume"));
    char *other = path_in("empty-out");
    o = base_opts(other, NULL);
    o.resume = true;
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    assert_non_null(strstr(m2d_errmsg(), "no checkpoint"));
    free(out), free(other);
}

static void output_checkpoint_and_manifest(void **state) {
    (void)state;
    char *out = path_in("d"), *log = path_in("d.jsonl");
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, log);
    o.fp32 = true;
    o.train.optim.steps = 3;
    o.save_every = 0;
    o.train.loss = M2D_LOSS_FKL_MSE;
    o.train.teacher_topk = 3;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    m2d_model *m;
    if (m2d_model_open(out, &m)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(m->cfg.arch, "Qwen3ForCausalLM");
    assert_int_equal(m->cfg.torch_dtype, M2D_F32);
    assert_int_equal(m->layers[0].q_proj->dtype, M2D_F32);
    m2d_model_close(m);
    cJSON *j = read_json(out, "moe2dense.json");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "distill");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(d, "settings"), *mt = cJSON_GetObjectItemCaseSensitive(d, "metrics");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "loss")->valuestring, "fkl+mse");
    /* the default weighting of the MSE is Minitron's, recorded with its weight */
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s, "mse_norm")->valuestring, "minitron");
    assert_true(cJSON_GetObjectItemCaseSensitive(s, "mse_weight")->valuedouble == 1.0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(s, "teacher_topk")->valueint, 3);
    /* the data guard's count: 3 steps x 4 windows over the text's windows of 16 tokens */
    double W = floor(cJSON_GetObjectItemCaseSensitive(s, "data_tokens")->valuedouble / 16);
    assert_true(fabs(cJSON_GetObjectItemCaseSensitive(s, "data_passes")->valuedouble - 3 * 4 / W) < 1e-12);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(mt, "tokens")->valueint, 3 * 4 * 16);
    assert_true(fabs(cJSON_GetObjectItemCaseSensitive(mt, "final_loss")->valuedouble - r.final_loss) < 1e-12);
    cJSON_Delete(j);
    /* every training line has the documented fields */
    size_t n;
    char *text = m2d_read_file(log, &n);
    const char *keys[] = {"step", "tokens", "loss", "grad_norm", "lr", "tokens_per_s"};
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *l = cJSON_Parse(line);
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            assert_non_null(cJSON_GetObjectItemCaseSensitive(l, keys[k]));
        /* fkl+mse lines say how the MSE was weighted; Minitron's MSE part weighs as much as the KL */
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(l, "mse_norm")->valuestring, "minitron");
        double div = cJSON_GetObjectItemCaseSensitive(l, "div")->valuedouble;
        assert_true(fabs(cJSON_GetObjectItemCaseSensitive(l, "mse")->valuedouble - div) < 1e-9 * div);
        cJSON_Delete(l);
    }
    assert_int_equal(lines, 3);
    free(text), free(out), free(log);
}

/* The teacher's backend is part of a run (its KD targets' sums depend on the device): a checkpoint
 * whose teacher ran elsewhere is refused, naming the field. */
static void resume_refuses_another_teacher_device(void **state) {
    (void)state;
    char *out = stopped_run("tb");
    cJSON *st = read_json(out, "train-state/state.json");
    cJSON *id = cJSON_GetObjectItemCaseSensitive(st, "identity");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(id, "teacher_backend")->valuestring, "cpu");
    cJSON_ReplaceItemInObjectCaseSensitive(id, "teacher_backend", cJSON_CreateString("cuda:0"));
    char *text = cJSON_Print(st), *path = m2d_path_join(out, "train-state/state.json");
    tu_write(path, text, strlen(text));
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true;
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    if (!strstr(m2d_errmsg(), "identity.teacher_backend")) fail_msg("%s", m2d_errmsg());
    cJSON_Delete(st);
    free(text), free(path), free(out);
}

/* A checkpoint written before runs recorded their precisions (no identity.precision, no
 * identity.train_precision) was made with the teacher and the student in fp32: it resumes in fp32
 * and is refused in bf16, the teacher's or the student's. One written before the teacher's backend
 * was recorded apart (no identity.teacher_backend) had it on the student's: it resumes there. */
static void legacy_checkpoint_means_fp32(void **state) {
    (void)state;
    char *out = stopped_run("legacy");
    m2d_distill_result r;
    m2d_distill_opts o;
    cJSON *st = read_json(out, "train-state/state.json");
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "identity"), "precision");
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "identity"), "train_precision");
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "identity"), "teacher_backend");
    char *text = cJSON_Print(st), *path = m2d_path_join(out, "train-state/state.json");
    tu_write(path, text, strlen(text));
    precisions_refused(out);
    o = base_opts(out, NULL);
    o.resume = true;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    assert_true(r.finished);
    cJSON_Delete(st);
    free(text), free(path), free(out);
}

/* log-softmax of each row of Z [rows, V] in double */
static double *log_probs(const float *z, int rows, int V) {
    double *lp = malloc(sizeof(double) * (size_t)rows * V);
    for (int i = 0; i < rows; i++) {
        const float *zi = z + (size_t)i * V;
        double mx = zi[0], s = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, zi[v]);
        for (int v = 0; v < V; v++) s += exp(zi[v] - mx);
        for (int v = 0; v < V; v++) lp[(size_t)i * V + v] = zi[v] - mx - log(s);
    }
    return lp;
}

/* The teacher's logits (the KD targets, as a step forms them) on the windows TOK with PREC; the
 * precision the trainer resolved into *used. */
static float *teacher_logits(const m2d_model *t, const m2d_model *s, m2d_precision prec, const int32_t *tok,
                             m2d_precision *used) {
    m2d_trainer_opts o = base_opts(NULL, NULL).train;
    o.optim.steps = 1, o.precision = prec;
    m2d_trainer *tr;
    if (m2d_trainer_new(t, s, &o, &tr)) fail_msg("%s", m2d_errmsg());
    int rows = o.micro_batch * o.seq_len, V = t->cfg.vocab_size;
    float *z = malloc(sizeof(float) * (size_t)rows * V);
    if (m2d_trainer_teacher_logits(tr, tok, o.micro_batch, z)) fail_msg("%s", m2d_errmsg());
    *used = m2d_trainer_precision(tr);
    m2d_trainer_free(tr);
    /* the whole teacher in that precision, its LM head included: the engine's own logits */
    m2d_engine *e;
    if (m2d_engine_open(t, &(m2d_engine_opts){.n_threads = o.threads, .precision = prec}, &e)) fail_msg("%s", m2d_errmsg());
    float *ze = malloc(sizeof(float) * (size_t)rows * V);
    for (int w = 0; w < o.micro_batch; w++)
        if (m2d_engine_logits(e, tok + (size_t)w * o.seq_len, o.seq_len, ze + (size_t)w * o.seq_len * V))
            fail_msg("%s", m2d_errmsg());
    /* exact: one machine, the trainer's teacher is the engine's forward of the same windows */
    assert_memory_equal(ze, z, sizeof(float) * (size_t)rows * V);
    m2d_engine_free(e);
    free(ze);
    return z;
}

/* KD targets with the teacher in bf16 against fp32 on the same windows, per position.
 *
 * The teacher routes every token to all 8 of its experts (top-k = E): its forward is then a
 * continuous function of the activations. With the default top-2, a token whose two best experts
 * are nearly tied may pick another expert in bf16 than in fp32 (measured on the tiny random
 * teacher of the other tests: 3 of 32 positions), an O(1) change of that token's output and,
 * through attention, of its window's later positions -- a discontinuity of routing, not an error
 * bound of bf16.
 *
 * Tolerance: every GEMM of the teacher's forward (q/k/v/o, router, experts, LM head) rounds its
 * activations to bf16 (unit roundoff 2^-9 = 2e-3; the weights are bf16 already) and accumulates in
 * fp32, so each adds a relative error ~2^-9 to its output; the ~10 chained GEMMs of the 2 layers,
 * renormalised by the RMSNorms, give each position's log-probabilities a relative difference of
 * ~1e-3 (printed; measured on AMD EPYC Zen 5: 1.0e-3 overall, 2.2e-3 at the worst position; with
 * top-2, at the positions before any flip, 0.4e-3 .. 1.5e-3); 1e-2 per position is 2^-9 times five
 * chained GEMMs, with room for the attention softmax. The targets must also be, bit for bit, the
 * teacher engine's own logits in that precision (its LM head in it too). The lower bound 1e-4 for the whole is far above fp32's reordering noise
 * (~1e-7): the targets really were computed in bf16. AUTO gives exactly what it resolves to (bf16
 * on CPUs with native bf16, such as AVX512-BF16; fp32 elsewhere), bit for bit. */
static void teacher_targets_in_bf16(void **state) {
    (void)state;
    m2d_model *t, *s;
    char *all = model_dir_k("teacher-all-experts", 1, 1, 8);
    if (m2d_model_open(all, &t) || m2d_model_open(g_student, &s)) fail_msg("%s", m2d_errmsg());
    m2d_trainer_opts o = base_opts(NULL, NULL).train;
    int rows = o.micro_batch * o.seq_len, V = t->cfg.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)rows);
    uint64_t st = 7;
    for (int i = 0; i < rows; i++) tok[i] = (int32_t)(tu_rand_u64(&st) % 256);
    m2d_precision u32, u16, uauto, want_auto;
    float *z32 = teacher_logits(t, s, M2D_PREC_FP32, tok, &u32), *z16 = teacher_logits(t, s, M2D_PREC_BF16, tok, &u16);
    float *za = teacher_logits(t, s, M2D_PREC_AUTO, tok, &uauto);
    assert_int_equal(u32, M2D_PREC_FP32);
    assert_int_equal(u16, M2D_PREC_BF16);
    double *l32 = log_probs(z32, rows, V), *l16 = log_probs(z16, rows, V), num = 0, den = 0, worst = 0;
    for (int r = 0; r < rows; r++) {
        double a = 0, b = 0;
        for (size_t i = (size_t)r * V; i < (size_t)(r + 1) * V; i++)
            a += (l16[i] - l32[i]) * (l16[i] - l32[i]), b += l32[i] * l32[i];
        worst = fmax(worst, sqrt(a / b)), num += a, den += b;
    }
    double rel = sqrt(num / den);
    print_message("teacher log-probs bf16 vs fp32: relative difference %.3g, worst position %.3g\n", rel, worst);
    assert_true(rel > 1e-4 && worst < 1e-2);
    if (m2d_engine_resolve_precision(NULL, M2D_PREC_AUTO, &want_auto)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(uauto, want_auto);
    print_message("auto resolved to %s on this CPU: checked against the %s targets bit for bit\n",
                  m2d_precision_name(uauto), m2d_precision_name(uauto));
    assert_memory_equal(za, uauto == M2D_PREC_BF16 ? z16 : z32, sizeof(float) * (size_t)rows * V);
    free(l32), free(l16), free(z32), free(z16), free(za), free(tok), free(all);
    m2d_model_close(t), m2d_model_close(s);
}

/* one-line errors naming the file or the option, non-zero exit, nothing written */
static void command_errors(void **state) {
    (void)state;
    struct { const char *args, *want; } cases[] = {
        {"--data /nonexistent/train.txt --steps 2", "/nonexistent/train.txt"},
        {"--steps 2 --tokens 100", "exactly one of --steps and --tokens"},
        {"--steps 2 --batch 4 --micro-batch 3", "--micro-batch 3 must divide --batch 4"},
        {"--steps 2 --loss kl", "--loss"},
        {"--steps 2 --mse-weight 2", "--mse-weight needs --loss fkl+mse"},
        {"--steps 2 --seq-len 4096", "max_position_embeddings"},
        {"--steps 2 --teacher-topk 99", "num_experts"},
        {"--steps 2 --eval-every 3", "--eval-data"},
        {"--steps 2 --lr -1", "--lr"},
        {"--steps 2 --precision fp16", "distill: --precision: 'fp16' is not a precision (auto, fp32, bf16)"},
        {"--steps 2 --train-precision auto", "distill: --train-precision auto: the student trains in fp32 or bf16"},
        {"--steps 2 --train-precision fp16", "distill: --train-precision: 'fp16' is not a precision"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = m2d_strfmt("%s/err%zu", g_dir, i);
        const char *data = strstr(cases[i].args, "--data") ? "" : g_data;
        char *cmd = m2d_strfmt("%s distill --teacher %s --student %s --out %s --seq-len 16 --batch 2 %s%s %s", tu_bin(),
                               g_teacher, g_student, out, *data ? "--data " : "", data, cases[i].args);
        char *err = NULL;
        int rc = tu_run(cmd, NULL, &err);
        assert_int_not_equal(rc, 0);
        if (!err || !strstr(err, cases[i].want)) fail_msg("%s: expected an error with '%s', got: %s", cmd, cases[i].want, err);
        assert_true(strchr(err, '\n') == err + strlen(err) - 1); /* one line */
        char *marker = m2d_path_join(out, "moe2dense.json");
        assert_false(m2d_file_exists(marker));
        free(marker), free(err), free(cmd), free(out);
    }
}

/* the command with --precision auto: the resolved precision on stderr, in the closing line and in
 * moe2dense.json, and the student's training named fp32 */
static void command_precision_auto(void **state) {
    (void)state;
    m2d_precision want;
    if (m2d_engine_resolve_precision(NULL, M2D_PREC_AUTO, &want)) fail_msg("%s", m2d_errmsg());
    const char *name = m2d_precision_name(want);
    char *out = path_in("cli-auto");
    char *cmd = m2d_strfmt("%s distill --teacher %s --student %s --data %s --out %s --seq-len 16 --batch 2 --steps 2 "
                           "--threads 2 --precision auto", tu_bin(), g_teacher, g_student, g_data, out);
    char *o = NULL, *err = NULL;
    if (tu_run(cmd, &o, &err)) fail_msg("%s: %s", cmd, err);
    char *line = m2d_strfmt("teacher forward and validation: %s (requested auto); student training: fp32", name);
    char *tail = m2d_strfmt(", teacher %s\n", name);
    if (!strstr(err, line)) fail_msg("stderr lacks '%s': %s", line, err);
    if (!strstr(o, tail)) fail_msg("stdout lacks '%s': %s", tail, o);
    cJSON *j = read_json(out, "moe2dense.json");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "distill"), "settings");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(st, "precision")->valuestring, name);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(st, "precision_requested")->valuestring, "auto");
    print_message("distill --precision auto ran as %s on this CPU\n", name);
    cJSON_Delete(j);
    free(line), free(tail), free(o), free(err), free(cmd), free(out);
}

/* the command with --train-precision bf16: named on stderr, in the log and in moe2dense.json */
static void command_train_precision(void **state) {
    (void)state;
    char *out = path_in("cli-train-bf16"), *log = path_in("cli-train-bf16.jsonl");
    char *cmd = m2d_strfmt("%s distill --teacher %s --student %s --data %s --out %s --log %s --seq-len 16 --batch 2 "
                           "--steps 2 --threads 2 --train-precision bf16", tu_bin(), g_teacher, g_student, g_data, out, log);
    char *o = NULL, *err = NULL;
    if (tu_run(cmd, &o, &err)) fail_msg("%s: %s", cmd, err);
    if (!strstr(err, "; student training: bf16\n")) fail_msg("stderr lacks the student's precision: %s", err);
    cJSON *j = read_json(out, "moe2dense.json");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "distill"), "settings");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(st, "student_training_precision")->valuestring, "bf16");
    cJSON_Delete(j);
    char *text = m2d_read_file(log, NULL);
    assert_non_null(strstr(text, "\"student_precision\": \"bf16\""));
    free(text), free(o), free(err), free(cmd), free(out), free(log);
}

/* a log path that is a symbolic link is refused, not followed (the target stays as it was) */
static void log_symlink_refused(void **state) {
    (void)state;
    char *out = path_in("g"), *target = path_in("target.txt"), *link_path = path_in("link.jsonl");
    tu_write(target, "keep\n", 5);
    assert_int_equal(symlink(target, link_path), 0);
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, link_path);
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    if (!strstr(m2d_errmsg(), "link.jsonl")) fail_msg("%s", m2d_errmsg());
    char *t = m2d_read_file(target, NULL);
    assert_string_equal(t, "keep\n");
    free(t), free(out), free(target), free(link_path);
    /* a hard link to another run's log: that log would be truncated too */
    char *other = path_in("other.jsonl"), *hard = path_in("hard.jsonl");
    tu_write(other, "{\"step\": 1}\n", 12);
    assert_int_equal(link(other, hard), 0);
    out = path_in("g2");
    o = base_opts(out, hard);
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    if (!strstr(m2d_errmsg(), "hard.jsonl") || !strstr(m2d_errmsg(), "hard link")) fail_msg("%s", m2d_errmsg());
    t = m2d_read_file(other, NULL);
    assert_string_equal(t, "{\"step\": 1}\n");
    free(t), free(out), free(other), free(hard);
}

/* OUT/train-state planted as a symbolic link in a finished output that is run again is refused
 * in one line naming it: saves, leftovers' removal and the final cleanup would all go through it.
 * The target's files stay as they were. */
static void state_dir_symlink_refused(void **state) {
    (void)state;
    char *out = path_in("h"), *victim = path_in("victim"), *link = m2d_path_join(out, "train-state");
    assert_int_equal(m2d_mkdir_p(out), 0);
    assert_int_equal(m2d_mkdir_p(victim), 0);
    char *keep = m2d_path_join(victim, "step-9.weights.safetensors");
    tu_write(keep, "keep\n", 5);
    assert_int_equal(symlink(victim, link), 0);
    char *marker = m2d_path_join(out, "moe2dense.json"); /* OUT a finished output, run again */
    tu_write(marker, "{}\n", 3);
    for (int resume = 0; resume < 2; resume++) {
        m2d_distill_result r;
        m2d_distill_opts o = base_opts(out, NULL);
        o.resume = resume;
        assert_int_equal(m2d_distill_run(&o, &r), -1);
        if (!strstr(m2d_errmsg(), "train-state") || !strstr(m2d_errmsg(), "symbolic link")) fail_msg("%s", m2d_errmsg());
    }
    char *t = m2d_read_file(keep, NULL);
    assert_string_equal(t, "keep\n");
    char *planted = m2d_path_join(victim, "state.json");
    assert_false(m2d_file_exists(planted));
    free(t), free(planted), free(keep), free(out), free(victim), free(link), free(marker);
}

/* a student with MoE layers is refused: only dense students train */
static void moe_student_refused(void **state) {
    (void)state;
    char *out = path_in("e");
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, NULL);
    o.student = g_teacher;
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    assert_non_null(strstr(m2d_errmsg(), "MoE layer"));
    free(out);
}

/* the stored tensors of checkpoint DIR (model.safetensors) */
static m2d_st *stored(const char *dir) {
    char *path = m2d_path_join(dir, "model.safetensors");
    m2d_st *st;
    if (m2d_st_open(path, &st)) fail_msg("%s", m2d_errmsg());
    free(path);
    return st;
}

/* Student DIR distilled 2 steps into OUT (fp32), then OUT distilled 1 step into AGAIN: the output
 * is the trained student -- loaded again, its perplexity before the second run's first step equals
 * the first run's final validation, bit for bit (the same engine on the same fp32 weights) -- and
 * holds DIR's tensors under their names and shapes. Returns DIR's and OUT's stored tensors. */
static void distill_twice(const char *dir, const char *out, const char *again, m2d_st **in, m2d_st **got) {
    m2d_distill_result r, r2;
    m2d_distill_opts o = base_opts(out, NULL);
    o.student = dir, o.fp32 = true, o.save_every = 0, o.eval_data = g_data, o.eval_windows = 2;
    o.train.optim.steps = 2;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    m2d_distill_opts o2 = o;
    o2.student = out, o2.out = again, o2.train.optim.steps = 1;
    if (m2d_distill_run(&o2, &r2)) fail_msg("%s", m2d_errmsg());
    assert_true(isfinite(r.post_ppl) && r.post_ppl != r.pre_ppl);
    assert_true(r2.pre_ppl == r.post_ppl);
    *in = stored(dir), *got = stored(out);
    assert_int_equal(m2d_st_count(*got), m2d_st_count(*in));
    for (int i = 0; i < m2d_st_count(*in); i++) {
        const m2d_tensor *a = m2d_st_at(*in, i), *b = m2d_st_find(*got, a->name);
        if (!b) fail_msg("%s: not in the output", a->name);
        assert_int_equal(b->ndim, a->ndim);
        assert_memory_equal(b->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    }
}

/* tensor NAME differs between IN and GOT (trained) */
static void assert_moved(const m2d_st *in, const m2d_st *got, const char *name) {
    const m2d_tensor *a = m2d_st_find(in, name), *b = m2d_st_find(got, name);
    assert_non_null(a), assert_non_null(b);
    size_t n = (size_t)m2d_tensor_numel(a);
    float *w0 = malloc(sizeof(float) * n), *w1 = malloc(sizeof(float) * n);
    m2d_to_f32(a->dtype, a->data, 0, (int64_t)n, w0);
    m2d_to_f32(b->dtype, b->data, 0, (int64_t)n, w1);
    assert_true(memcmp(w0, w1, sizeof(float) * n) != 0);
    free(w0), free(w1);
}

/* DeepSeek-V2's dense student (latent attention; its golden: every layer dense, values of 12 in
 * heads of 24, so the loader pads o_proj) distills (distill_twice), and the output holds o_proj
 * [d, heads * v_head_dim] as stored, not the loader's padded copy, trained */
static void deepseek_student_distilled(void **state) {
    (void)state;
    char *out = path_in("f"), *again = path_in("f2");
    cJSON *g = hf_load_golden("deepseekv2-student"); /* a converted student's golden: its tensors, no seed */
    cJSON_AddNumberToObject(g, "seed", 3);
    char *dir = hf_build_listed(g, g_dir);
    cJSON_Delete(g);
    char *from = m2d_path_join(g_student, "tokenizer.json"), *to = m2d_path_join(dir, "tokenizer.json");
    tu_copy_file(from, to);
    m2d_st *in, *got;
    distill_twice(dir, out, again, &in, &got);
    const m2d_tensor *op = m2d_st_find(got, "model.layers.0.self_attn.o_proj.weight");
    assert_true(op->shape[0] == 64 && op->shape[1] == 4 * 12);
    assert_moved(in, got, op->name);
    m2d_model *m;
    if (m2d_model_open(out, &m)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(m->cfg.arch, "DeepseekV2ForCausalLM");
    m2d_model_close(m);
    m2d_st_close(in), m2d_st_close(got);
    free(from), free(to), free(dir), free(out), free(again);
}

/* GPT-OSS's dense student (one expert of width k d_e routed top-1, biases, sinks) distills
 * (distill_twice) and is written in GPT-OSS's own layout (model.h write_ffn: the fused, interleaved
 * gate_up with its biases, a zero one-expert router), the FFN trained */
static void gptoss_student_distilled(void **state) {
    (void)state;
    char *out = path_in("g"), *again = path_in("g2");
    cJSON *g = hf_load_golden("gptoss-student"); /* a converted student's golden: its tensors, no seed */
    cJSON_AddNumberToObject(g, "seed", 3);
    char *dir = tu_family_build(g, g_dir);
    cJSON_Delete(g);
    m2d_st *in, *got;
    distill_twice(dir, out, again, &in, &got);
    assert_moved(in, got, "model.layers.0.mlp.experts.gate_up_proj");
    m2d_st_close(in), m2d_st_close(got);
    free(dir), free(out), free(again);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resume_is_exact),
        cmocka_unit_test(resume_is_exact_bf16),
        cmocka_unit_test(resume_is_exact_student_bf16),
        cmocka_unit_test(legacy_checkpoint_means_fp32),
        cmocka_unit_test(teacher_targets_in_bf16),
        cmocka_unit_test(resume_refuses_another_run),
        cmocka_unit_test(resume_refuses_another_teacher_device),
        cmocka_unit_test(output_checkpoint_and_manifest),
        cmocka_unit_test(command_errors),
        cmocka_unit_test(command_precision_auto),
        cmocka_unit_test(command_train_precision),
        cmocka_unit_test(moe_student_refused),
        cmocka_unit_test(deepseek_student_distilled),
        cmocka_unit_test(gptoss_student_distilled),
        cmocka_unit_test(log_symlink_refused),
        cmocka_unit_test(state_dir_symlink_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
