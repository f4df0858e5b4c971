/* distill run: `moe2dense distill` end to end on a small random teacher and student — resume is
 * exact (the same losses and the same output, bit for bit, after a stop and a resume, even with
 * another thread count), the log, the output checkpoint and its manifest, and the one-line
 * errors for bad input. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "model/model.h"
#include "testmodel.h"
#include "train/distill.h"

static char *g_dir, *g_teacher, *g_student, *g_data;

static char *model_dir(const char *name, int moe, uint64_t seed) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = moe, o.seed = seed, o.vocab_size = 320, o.eos_token_id = 256, o.init_std = 0.2f;
    o.intermediate_size = moe ? 64 : 32;
    char *dir = m2d_path_join(g_dir, name), *tok = m2d_path_join(dir, "tokenizer.json");
    if (m2d_testmodel_write(dir, &o)) fail_msg("%s", m2d_errmsg());
    size_t n;
    char *t = m2d_read_file("tests/golden/hf/tokenizer.json", &n); /* byte-level: ids = bytes */
    if (!t) fail_msg("%s", m2d_errmsg());
    tu_write(tok, t, n);
    free(t), free(tok);
    return dir;
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tmpdir();
    g_teacher = model_dir("teacher", 1, 1);
    g_student = model_dir("student", 0, 2);
    g_data = m2d_path_join(g_dir, "train.txt");
    FILE *f = fopen(g_data, "w");
    uint64_t st = 3;
    const char *words[] = {"alpha ", "beta ", "gamma ", "delta ", "the ", "of ", "expert ", "dense\n"};
    for (int i = 0; i < 600; i++) fputs(words[tu_rand_u64(&st) % 8], f);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rm_rf(g_dir);
    free(g_dir), free(g_teacher), free(g_student), free(g_data);
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

static void resume_is_exact(void **state) {
    (void)state;
    char *outa = path_in("a"), *loga = path_in("a.jsonl"), *outb = path_in("b"), *logb = path_in("b.jsonl");
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(outa, loga);
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    assert_true(r.finished);
    assert_int_equal(r.tokens, 6 * 4 * 16);
    /* B: stops after step 3 (checkpoint), then a line of a step 4 that a crash interrupted */
    o = base_opts(outb, logb);
    o.stop_after = 3;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    assert_false(r.finished);
    assert_int_equal(r.steps_done, 3);
    char *marker = m2d_path_join(outb, "moe2dense.json");
    assert_false(m2d_file_exists(marker)); /* unfinished: no marker */
    FILE *f = fopen(logb, "a");
    fputs("{\"step\": 4, \"tokens\": 256, \"loss\": 123, \"grad_norm\": 1, \"lr\": 1}\n", f);
    fclose(f);
    o = base_opts(outb, logb);
    o.resume = true;
    o.train.threads = 1; /* results do not depend on the thread count */
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    assert_true(r.finished);
    assert_true(m2d_file_exists(marker));
    char *ta = trajectory(loga), *tb = trajectory(logb);
    assert_string_equal(ta, tb);
    char *ha = file_hash(outa, "model.safetensors"), *hb = file_hash(outb, "model.safetensors");
    assert_string_equal(ha, hb);
    /* the checkpoint is removed once the output is complete */
    char *state_dir = m2d_path_join(outb, "train-state");
    assert_false(m2d_file_exists(state_dir));
    free(ta), free(tb), free(ha), free(hb), free(marker), free(state_dir);
    free(outa), free(loga), free(outb), free(logb);
}

static void resume_refuses_another_run(void **state) {
    (void)state;
    char *out = path_in("c");
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, NULL);
    o.stop_after = 2;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    o = base_opts(out, NULL);
    o.resume = true;
    o.train.optim.lr = 1e-3;
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    assert_non_null(strstr(m2d_errmsg(), "identity.lr"));
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

static cJSON *read_json(const char *dir, const char *name) {
    char *p = m2d_path_join(dir, name);
    size_t n;
    char *t = m2d_read_file(p, &n);
    if (!t) fail_msg("%s", m2d_errmsg());
    cJSON *j = cJSON_ParseWithLength(t, n);
    free(t), free(p);
    return j;
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
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(s, "teacher_topk")->valueint, 3);
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
        cJSON_Delete(l);
    }
    assert_int_equal(lines, 3);
    free(text), free(out), free(log);
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

/* a log path that is a symbolic link is refused, not followed (the target stays as it was) */
static void log_symlink_refused(void **state) {
    (void)state;
    char *out = path_in("g"), *target = path_in("target.txt"), *link = path_in("link.jsonl");
    tu_write(target, "keep\n", 5);
    assert_int_equal(symlink(target, link), 0);
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, link);
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    if (!strstr(m2d_errmsg(), "link.jsonl")) fail_msg("%s", m2d_errmsg());
    char *t = m2d_read_file(target, NULL);
    assert_string_equal(t, "keep\n");
    free(t), free(out), free(target), free(link);
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

/* a dense student with a feature the training engine does not implement is refused by name
 * (here linear RoPE scaling), before any step */
static void unsupported_student_refused(void **state) {
    (void)state;
    char *dir = path_in("scaled"), *out = path_in("f");
    assert_int_equal(m2d_mkdir_p(dir), 0);
    const char *files[] = {"model.safetensors", "tokenizer.json"};
    for (int i = 0; i < 2; i++) {
        char *from = m2d_path_join(g_student, files[i]), *to = m2d_path_join(dir, files[i]);
        size_t n;
        char *data = m2d_read_file(from, &n);
        assert_non_null(data);
        tu_write(to, data, n);
        free(data), free(from), free(to);
    }
    char *cfg_from = m2d_path_join(g_student, "config.json"), *cfg_to = m2d_path_join(dir, "config.json");
    char *cfg_text = m2d_read_file(cfg_from, NULL);
    assert_non_null(cfg_text);
    cJSON *j = cJSON_Parse(cfg_text);
    free(cfg_text);
    assert_non_null(j);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "rope_parameters");
    cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "linear");
    cJSON_AddNumberToObject(rs, "factor", 2.0);
    cJSON_AddNumberToObject(j, "rope_theta", 10000.0);
    char *text = cJSON_Print(j);
    tu_write(cfg_to, text, strlen(text));
    m2d_distill_result r;
    m2d_distill_opts o = base_opts(out, NULL);
    o.student = dir;
    assert_int_equal(m2d_distill_run(&o, &r), -1);
    if (!strstr(m2d_errmsg(), "the training engine does not implement rope_scaling")) fail_msg("%s", m2d_errmsg());
    cJSON_Delete(j);
    free(text), free(cfg_from), free(cfg_to), free(dir), free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resume_is_exact),
        cmocka_unit_test(resume_refuses_another_run),
        cmocka_unit_test(output_checkpoint_and_manifest),
        cmocka_unit_test(command_errors),
        cmocka_unit_test(moe_student_refused),
        cmocka_unit_test(unsupported_student_refused),
        cmocka_unit_test(log_symlink_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
