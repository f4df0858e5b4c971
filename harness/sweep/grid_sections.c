/* grid_sections — an experiment's [mc] and [distill] tables: tasks and shots, the distillation
 * settings, its selection and ablation axes, the validation text (grid_read.h). */
#include "sweep/grid_read.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

int m2d_grid_read_mc(const ctx *c, m2d_experiment *x) {
    const m2d_toml *mc = m2d_toml_get(x->table, "mc");
    x->mc_configs = m2d_strdup("none");
    if (!mc) return 0;
    if (mc->type != M2D_TOML_TABLE) return m2d_grid_key_err(c, mc, "mc", "a table");
    static const char *const keys[] = {"tasks", "shots", "limit", "configs", "data_dir"};
    if (m2d_grid_check_keys(c, mc, "[mc]", keys, 5)) return -1;
    if (m2d_grid_get_str(c, mc, "data_dir", "data", &x->mc_data_dir)) return -1;
    const m2d_toml *tasks = m2d_toml_get(mc, "tasks");
    if (!tasks || tasks->type != M2D_TOML_ARRAY) return m2d_grid_key_err(c, tasks, "mc.tasks", "an array of task names");
    const m2d_toml *shots = m2d_toml_get(mc, "shots");
    if (shots && shots->type != M2D_TOML_TABLE) return m2d_grid_key_err(c, shots, "mc.shots", "a table task = shots");
    x->mc_tasks = m2d_calloc((size_t)tasks->n, sizeof *x->mc_tasks);
    x->mc_shots = m2d_calloc((size_t)tasks->n, sizeof *x->mc_shots);
    for (int i = 0; i < tasks->n; i++) {
        if (tasks->items[i]->type != M2D_TOML_STRING) return m2d_grid_key_err(c, tasks->items[i], "mc.tasks", "strings");
        for (int j = 0; j < i; j++) /* one column pair per task */
            if (!strcmp(tasks->items[j]->str, tasks->items[i]->str))
                return m2d_grid_key_err(c, tasks->items[i], "mc.tasks", "task names, each once");
        x->mc_tasks[x->n_mc] = m2d_strdup(tasks->items[i]->str);
        const m2d_toml *s = m2d_toml_get(shots, tasks->items[i]->str);
        if (s && (s->type != M2D_TOML_INT || s->i < 0 || s->i > 100))
            return m2d_grid_key_err(c, s, "mc.shots", "an integer in [0, 100]");
        x->mc_shots[x->n_mc++] = s ? (int)s->i : 0;
    }
    for (int j = 0; shots && j < shots->n; j++) { /* a misspelt task would silently run 0 shots */
        int listed = 0;
        for (int i = 0; i < x->n_mc && !listed; i++) listed = !strcmp(shots->keys[j], x->mc_tasks[i]);
        if (!listed) return m2d_grid_key_err(c, shots->items[j], "mc.shots", "keyed by tasks listed in mc.tasks");
    }
    if (m2d_grid_get_int32(c, mc, "limit", 0, 0, 1 << 30, &x->mc_limit)) return -1;
    free(x->mc_configs);
    x->mc_configs = NULL;
    if (m2d_grid_get_str(c, mc, "configs", "best-per-pair", &x->mc_configs)) return -1;
    if (strcmp(x->mc_configs, "none") && strcmp(x->mc_configs, "all") && strcmp(x->mc_configs, "best-per-pair"))
        return m2d_grid_key_err(c, m2d_toml_get(mc, "configs"), "mc.configs", "\"none\", \"all\" or \"best-per-pair\"");
    return 0;
}

/* distill.configs: "best-per-pair" | "best-per-scoring-K" | "all" | an array of config ids (checked against the grid later) */
static int read_distill_configs(const ctx *c, const m2d_toml *d, m2d_experiment *x) {
    const m2d_toml *v = m2d_toml_get(d, "configs");
    if (v && v->type == M2D_TOML_ARRAY) {
        if (v->n == 0) return m2d_grid_key_err(c, v, "distill.configs", "a non-empty array of config ids");
        x->distill_ids = m2d_calloc((size_t)v->n, sizeof *x->distill_ids);
        for (int i = 0; i < v->n; i++) {
            if (v->items[i]->type != M2D_TOML_STRING) return m2d_grid_key_err(c, v->items[i], "distill.configs", "strings");
            x->distill_ids[x->n_distill_ids++] = m2d_strdup(v->items[i]->str);
        }
        x->distill_configs = m2d_strdup("list");
        return 0;
    }
    if (m2d_grid_get_str(c, x->table, "distill.configs", "best-per-pair", &x->distill_configs)) return -1;
    if (strcmp(x->distill_configs, "all") && strcmp(x->distill_configs, "best-per-pair") &&
        strcmp(x->distill_configs, "best-per-scoring-K"))
        return m2d_grid_key_err(c, v, "distill.configs",
                                "\"all\", \"best-per-pair\", \"best-per-scoring-K\" or an array of config ids");
    return 0;
}

/* keys looked up from the experiment table T0 as "distill.KEY", so errors name them that way */
static int read_distill_numbers(const ctx *c, const m2d_toml *t0, m2d_distill_opts *o) {
    m2d_trainer_opts *t = &o->train;
    int64_t tokens = 0, seed = 0;
    if (m2d_grid_get_int(c, t0, "distill.tokens", 0, 0, (int64_t)1 << 50, &tokens) ||
        m2d_grid_get_int32(c, t0, "distill.steps", 0, 0, 100000000, &t->optim.steps) ||
        m2d_grid_get_int32(c, t0, "distill.seq_len", t->seq_len, 2, 1 << 20, &t->seq_len) ||
        m2d_grid_get_int32(c, t0, "distill.batch", t->batch, 1, 1 << 20, &t->batch) ||
        m2d_grid_get_int32(c, t0, "distill.micro_batch", 0, 0, 1 << 20, &t->micro_batch) ||
        m2d_grid_get_int32(c, t0, "distill.warmup", t->optim.warmup, 0, 100000000, &t->optim.warmup) ||
        m2d_grid_get_int32(c, t0, "distill.eval_every", 0, 0, 100000000, &o->eval_every) ||
        m2d_grid_get_int32(c, t0, "distill.save_every", 0, 0, 100000000, &o->save_every) ||
        m2d_grid_get_int(c, t0, "distill.seed", 0, 0, INT64_MAX, &seed) || m2d_grid_get_double(c, t0, "distill.lr", &t->optim.lr) ||
        m2d_grid_get_double(c, t0, "distill.min_lr", &t->optim.min_lr) ||
        m2d_grid_get_double(c, t0, "distill.weight_decay", &t->optim.weight_decay) ||
        m2d_grid_get_double(c, t0, "distill.clip", &t->optim.clip) || m2d_grid_get_double(c, t0, "distill.mse_weight", &t->mse_weight) ||
        m2d_grid_get_bool(c, t0, "distill.recompute", &t->recompute) || m2d_grid_get_bool(c, t0, "distill.fp32", &o->fp32))
        return -1;
    o->tokens = tokens;
    o->seed = (uint64_t)seed;
    if ((tokens > 0) == (t->optim.steps > 0))
        return m2d_err("%s: experiment '%s': [distill] needs exactly one of 'tokens' and 'steps'", c->file, c->exp);
    if (t->optim.lr <= 0) return m2d_grid_key_err(c, m2d_toml_path(t0, "distill.lr"), "distill.lr", "a positive number");
    return 0;
}

/* The validation file beside the PPL data: PPL's file name with its "test" read as "valid"
 * (WikiText-2: wiki.test.raw -> wiki.valid.raw); NULL when the name has no "test". */
static char *valid_beside(const char *ppl) {
    const char *base = strrchr(ppl, '/'), *t = strstr(base ? base + 1 : ppl, "test");
    return t ? m2d_strfmt("%.*svalid%s", (int)(t - ppl), ppl, t + 4) : NULL;
}

/* A and B name one file (the same path, or the same inode through links) */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!strcmp(a, b)) return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* distill.val_data: the held-out text the validation curve (Figure 5; eval_every > 0) is measured
 * on; default the validation file beside ppl.data (none without a curve when there is none).
 * Refused when it is ppl.data, the split the tables report. */
static int read_distill_val(const ctx *c, m2d_experiment *x) {
    const m2d_toml *v = m2d_toml_path(x->table, "distill.val_data");
    char *dflt = v ? NULL : valid_beside(x->ppl_data), at[512];
    if (!v && !dflt && x->distill.eval_every == 0) return 0;
    if (!v && !dflt)
        return m2d_err("%s: missing 'distill.val_data' (ppl.data '%s' has no \"test\" in its name to find the "
                       "validation split beside it)", m2d_grid_where(c, NULL, at, sizeof at), x->ppl_data);
    int rc = m2d_grid_get_path(c, x->table, "distill.val_data", dflt, &x->distill_val_data);
    free(dflt);
    if (rc == 0 && same_file(x->distill_val_data, x->ppl_data))
        rc = m2d_err("%s: 'distill.val_data': '%s' is ppl.data, the split the tables report; validate on a "
                     "held-out split (e.g. WikiText-2 validation)", m2d_grid_where(c, v, at, sizeof at), x->distill_val_data);
    return rc;
}

/* one value of the distill.loss axis (V: a string) into *OUT */
static int read_loss_value(const ctx *c, const m2d_toml *v, void *out) {
    if (v->type != M2D_TOML_STRING || m2d_loss_parse(v->str, out))
        return m2d_grid_key_err(c, v, "distill.loss", "\"fkl\", \"rkl\" or \"fkl+mse\" (or a list of them)");
    return 0;
}

/* one value of the distill.teacher_topk axis (V: an integer >= 0; 0: the teacher's own routing) */
static int read_topk_value(const ctx *c, const m2d_toml *v, void *out) {
    if (v->type != M2D_TOML_INT || v->i < 0 || v->i > (1 << 20))
        return m2d_grid_key_err(c, v, "distill.teacher_topk", "an integer in [0, 1048576] (or a list of them)");
    *(int *)out = (int)v->i;
    return 0;
}

/* distill.KEY: a scalar or a non-empty list of distinct values, read one by one with READ into
 * VALS (SIZE bytes each; DFLT when absent); returns the count, -1 on error. *LISTED: 1 for a list. */
static int read_axis_values(const ctx *c, const m2d_toml *d, const char *key, const void *dflt, size_t size,
                            int (*read)(const ctx *, const m2d_toml *, void *), void **vals, int *listed) {
    const m2d_toml *v = m2d_toml_get(d, key);
    char dotted[64];
    snprintf(dotted, sizeof dotted, "distill.%s", key);
    int n = !v ? 1 : v->type == M2D_TOML_ARRAY ? v->n : 1;
    *listed |= v && v->type == M2D_TOML_ARRAY;
    if (n == 0) return m2d_grid_key_err(c, v, dotted, "a value or a non-empty list");
    unsigned char *out = m2d_calloc((size_t)n, size);
    *vals = out;
    for (int i = 0; i < n; i++) {
        unsigned char *slot = out + (size_t)i * size;
        if (!v) memcpy(slot, dflt, size);
        else if (read(c, v->type == M2D_TOML_ARRAY ? v->items[i] : v, slot)) return -1;
        for (int j = 0; j < i; j++)
            if (!memcmp(out + (size_t)j * size, slot, size))
                return m2d_grid_key_err(c, v->items[i], dotted, "a list of distinct values");
    }
    return n;
}

/* distill.loss and distill.teacher_topk: the ablation axes (Tables 4, 5), scalars or lists; the
 * first values are the stage's defaults (x->distill.train) */
static int read_distill_axes(const ctx *c, const m2d_toml *d, m2d_experiment *x) {
    const m2d_loss_kind fkl = M2D_LOSS_FKL;
    const int own = 0;
    void *losses = NULL, *topks = NULL;
    x->n_distill_losses = read_axis_values(c, d, "loss", &fkl, sizeof fkl, read_loss_value, &losses, &x->distill_ablation);
    x->distill_losses = losses;
    if (x->n_distill_losses < 0) return -1;
    x->n_distill_topks = read_axis_values(c, d, "teacher_topk", &own, sizeof own, read_topk_value, &topks,
                                          &x->distill_ablation);
    x->distill_topks = topks;
    if (x->n_distill_topks < 0) return -1;
    x->distill.train.loss = x->distill_losses[0];
    x->distill.train.teacher_topk = x->distill_topks[0];
    return 0;
}

/* [distill]: the stage that distills the chosen students (sweep_distill.h); absent: no stage */
int m2d_grid_read_distill(const ctx *c, m2d_experiment *x) {
    const m2d_toml *d = m2d_toml_get(x->table, "distill");
    if (!d) return 0;
    if (d->type != M2D_TOML_TABLE) return m2d_grid_key_err(c, d, "distill", "a table");
    static const char *const keys[] = {"configs", "data", "tokens", "steps", "seq_len", "batch", "micro_batch",
                                       "recompute", "lr", "min_lr", "warmup", "weight_decay", "clip", "loss",
                                       "mse_weight", "teacher_topk", "order", "seed", "eval_every", "save_every",
                                       "fp32", "val_data", "mse_norm", "train_precision"};
    if (m2d_grid_check_keys(c, d, "[distill]", keys, M2D_ARRAY_LEN(keys))) return -1;
    x->has_distill = 1;
    m2d_distill_defaults(&x->distill);
    x->distill.quiet = true;
    char *order = NULL, *norm = NULL, *tprec = NULL;
    int rc = read_distill_configs(c, d, x);
    if (rc == 0) rc = m2d_grid_get_str(c, x->table, "distill.data", NULL, &x->distill_data);
    if (rc == 0) rc = read_distill_numbers(c, x->table, &x->distill);
    if (rc == 0) rc = read_distill_val(c, x);
    if (rc == 0) rc = read_distill_axes(c, d, x);
    if (rc == 0) rc = m2d_grid_get_str(c, x->table, "distill.order", "shuffle", &order);
    if (rc == 0 && m2d_order_parse(order, &x->distill.order))
        rc = m2d_grid_key_err(c, m2d_toml_get(d, "order"), "distill.order", "\"shuffle\" or \"sequential\"");
    if (rc == 0) rc = m2d_grid_get_str(c, x->table, "distill.mse_norm", "minitron", &norm);
    if (rc == 0 && m2d_mse_norm_parse(norm, &x->distill.train.mse_norm))
        rc = m2d_grid_key_err(c, m2d_toml_get(d, "mse_norm"), "distill.mse_norm", "\"minitron\" or \"sum\"");
    if (rc == 0) rc = m2d_grid_get_str(c, x->table, "distill.train_precision", "fp32", &tprec);
    if (rc == 0 && m2d_train_precision_parse(tprec, "distill.train_precision", &x->distill.train.train_precision))
        rc = m2d_grid_key_err(c, m2d_toml_get(d, "train_precision"), "distill.train_precision", "\"fp32\" or \"bf16\"");
    free(order), free(norm), free(tprec);
    return rc;
}

/* Every id of distill.configs must be a configuration of the grid. */
int m2d_grid_check_distill_ids(const ctx *c, const m2d_experiment *x) {
    for (int i = 0; i < x->n_distill_ids; i++) {
        int found = 0;
        for (int j = 0; j < x->n_configs && !found; j++) found = !strcmp(x->configs[j].id, x->distill_ids[i]);
        if (!found)
            return m2d_err("%s: experiment '%s': distill.configs: '%s' is not a config id of the grid (see "
                           "'moe2dense sweep --dry-run')", c->file, c->exp, x->distill_ids[i]);
    }
    return 0;
}

/* The backend must be registered: the product has "pipeline"; test builds add "fake". */
