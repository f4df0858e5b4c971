/* convert/write — the student as a Hugging Face checkpoint directory, and the output directory
 * rule every checkpoint moe2dense writes follows. See write.h. */
#include "convert/write.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

/* what Hub checkpoints ship beside the weights for their tokenizer, chat template and generation
 * (tokenizer.model: SentencePiece, e.g. Mixtral's slow tokenizer; chat_template.jinja: GPT-OSS) */
static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                              "vocab.json", "merges.txt", "special_tokens_map.json",
                                              "added_tokens.json", "chat_template.jinja", "chat_template.json",
                                              "generation_config.json"};

#define MARK_COMPLETE "moe2dense.json"
#define MARK_INCOMPLETE "moe2dense.incomplete"
#define DIR_LOCK ".moe2dense" /* the lock file is DIR/.moe2dense.lock */

/* 1 when NAME is a file of a checkpoint's weights: model.safetensors, or the index and its shards */
static int weights_name(const char *name) {
    if (!strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json")) return 1;
    unsigned a, b;
    char tail[32];
    return sscanf(name, "model-%5u-of-%5u.%31s", &a, &b, tail) == 3 && !strcmp(tail, "safetensors");
}

/* 1 when NAME is a file this command writes into a student directory */
static int written_name(const char *name) {
    if (weights_name(name) || !strcmp(name, "config.json") || !strcmp(name, MARK_COMPLETE) ||
        !strcmp(name, MARK_INCOMPLETE))
        return 1;
    for (size_t i = 0; i < M2D_ARRAY_LEN(TOKENIZER_FILES); i++)
        if (!strcmp(name, TOKENIZER_FILES[i])) return 1;
    return 0;
}

/* 1 when NAME is the temp file of a write of one of those names that was killed */
static int leftover_name(const char *name) {
    char *base = m2d_strdup(name);
    char *tag = strstr(base, ".m2d-tmp.");
    if (!tag) tag = strstr(base, ".tmp.");
    int yes = 0;
    if (tag) {
        *tag = 0;
        yes = written_name(base) && m2d_atomic_leftover(name, base);
    }
    free(base);
    return yes;
}

typedef struct {
    int complete, incomplete, foreign, leftovers;
} dir_scan;

static int scan_dir(const char *dir, dir_scan *ds) {
    memset(ds, 0, sizeof *ds);
    DIR *dh = opendir(dir);
    if (!dh) return m2d_err("%s: cannot open directory: %s", dir, strerror(errno));
    for (struct dirent *de; (de = readdir(dh));) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, DIR_LOCK ".lock")) continue;
        if (!strcmp(n, MARK_COMPLETE)) ds->complete = 1;
        else if (!strcmp(n, MARK_INCOMPLETE)) ds->incomplete = 1;
        else if (leftover_name(n)) ds->leftovers++;
        else ds->foreign = 1;
    }
    closedir(dh);
    return 0;
}

/* Remove the files of DIR whose names MATCH (only under the directory's lock: none is live). */
static void remove_matching(const char *dir, int (*match)(const char *name)) {
    DIR *dh = opendir(dir);
    for (struct dirent *de; dh && (de = readdir(dh));) {
        if (!match(de->d_name)) continue;
        char *p = m2d_path_join(dir, de->d_name);
        unlink(p);
        free(p);
    }
    if (dh) closedir(dh);
}

/* Remove the temp files of killed writes. */
static void remove_leftovers(const char *dir) { remove_matching(dir, leftover_name); }

/* Make DIR ready for a student, under its lock: empty, a student (moe2dense.json), or what a
 * killed convert left (moe2dense.incomplete and/or temp files of our names) -- anything else is
 * refused. The incomplete marker goes first and the complete one is removed, so an interrupted
 * write never looks complete; the temp files of killed writes are removed. */
static int prepare_dir(const char *dir, m2d_lock *lock) {
    if (m2d_make_output_dir(dir)) return -1;
    char *lp = m2d_path_join(dir, DIR_LOCK), *mark = m2d_path_join(dir, MARK_INCOMPLETE);
    char *done = m2d_path_join(dir, MARK_COMPLETE);
    dir_scan ds;
    int rc = m2d_lock_acquire(lock, lp, "convert", "another convert or distill writes this directory", 0);
    if (rc == 0) rc = scan_dir(dir, &ds);
    if (rc == 0 && ds.foreign && !ds.complete && !ds.incomplete)
        rc = m2d_err("%s: directory is not empty and holds no moe2dense.json; refusing to write a student there", dir);
    static const char note[] = "a moe2dense convert is writing this directory, or was interrupted: not a complete "
                               "student (rerun the convert)\n";
    if (rc == 0) rc = m2d_write_file_atomic(mark, note, strlen(note));
    if (rc == 0 && unlink(done) != 0 && errno != ENOENT)
        rc = m2d_err("%s: cannot remove the old moe2dense.json: %s", dir, strerror(errno));
    if (rc == 0 && ds.leftovers) {
        remove_leftovers(dir);
        fprintf(stderr, "moe2dense convert: %s: removed %d temporary file(s) left by an interrupted convert\n", dir,
                ds.leftovers);
    }
    if (rc) m2d_lock_release(lock);
    free(lp);
    free(mark);
    free(done);
    return rc;
}

/* Print J (which this frees) to DIR/NAME atomically. */
static int write_json(const char *dir, const char *name, cJSON *j) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    char *path = m2d_path_join(dir, name);
    int rc = m2d_write_file_atomic(path, text, strlen(text));
    free(path);
    free(text);
    return rc;
}

/* The student's config.json: the text its in-memory config was parsed from (student_config). */
static int write_config(const m2d_model *s, const char *dir) {
    if (!s->config_text) return m2d_err("convert: the student %s has no config text", s->dir);
    char *path = m2d_path_join(dir, "config.json");
    int rc = m2d_write_file_atomic(path, s->config_text, strlen(s->config_text));
    free(path);
    return rc;
}

/* The teacher's tokenizer files, and none it lacks: a file an earlier student of another teacher
 * left in DIR (an added_tokens.json, a chat template) would change what transformers loads. */
static int copy_tokenizer_files(const m2d_model *t, const char *dir) {
    for (size_t i = 0; i < M2D_ARRAY_LEN(TOKENIZER_FILES); i++) {
        char *src = m2d_path_join(t->dir, TOKENIZER_FILES[i]), *dst = m2d_path_join(dir, TOKENIZER_FILES[i]);
        int rc = 0;
        if (m2d_file_exists(src)) {
            size_t n;
            char *data = m2d_read_file(src, &n);
            rc = data ? m2d_write_file_atomic(dst, data, n) : -1;
            free(data);
        } else if (unlink(dst) != 0 && errno != ENOENT) {
            rc = m2d_err("%s: cannot remove %s of an earlier student: %s", dir, TOKENIZER_FILES[i], strerror(errno));
        }
        free(src);
        free(dst);
        if (rc) return -1;
    }
    return 0;
}

/* By reference: the student's tensors and the teacher's mapped ones outlive the write, so the
 * writer holds no copy of the checkpoint it writes. */
static int add_tensor(m2d_st_writer *w, const m2d_tensor *t) {
    return m2d_st_writer_add_ref(w, t->name, t->dtype, t->ndim, t->shape, t->data);
}

/* The FFN block of a student layer: its FFN roles (dense gate/up/down, router), then each expert's;
 * or as the student's architecture stores them (write_ffn). */
static int add_layer_tensors(m2d_st_writer *w, const m2d_model *s, int layer) {
    if (s->arch->write_ffn) return s->arch->write_ffn(s, layer, w);
    const m2d_layer *l = &s->layers[layer];
    const m2d_config *c = &s->cfg;
    for (int r = 0; r < M2D_T_COUNT; r++)
        if (m2d_layer_role_is_ffn(r) && l->w[r] && add_tensor(w, l->w[r])) return -1;
    for (int e = 0; l->router && e < c->num_experts; e++)
        for (int r = 0; r < M2D_X_COUNT; r++)
            if (l->x[r] && add_tensor(w, l->x[r][e])) return -1;
    return 0;
}

/* SKIP[st index of X] = 1 when X is one of the teacher's stored tensors (not one post_bind made). */
static void mark_stored(const m2d_model *t, const m2d_tensor *x, char *skip) {
    int i = x ? m2d_st_index_of(t->st, x->name) : -1;
    if (i >= 0 && m2d_st_at(t->st, i) == x) skip[i] = 1;
}

/* Mark the teacher's FFN-block tensors of layer L (the ones the student replaces) in SKIP[st index]:
 * those bound to FFN roles and experts, and those post_bind read for them. */
static void mark_ffn_block(const m2d_model *t, int l, char *skip) {
    const m2d_layer *L = &t->layers[l];
    for (int r = 0; r < M2D_T_COUNT; r++)
        if (m2d_layer_role_is_ffn(r)) mark_stored(t, L->w[r], skip);
    for (int r = 0; r < M2D_X_COUNT; r++)
        for (int e = 0; L->x[r] && e < t->cfg.num_experts; e++) mark_stored(t, L->x[r][e], skip);
    for (int i = 0; i < t->n_claimed; i++)
        if (t->claimed[i].layer == l && t->claimed[i].part == M2D_PART_FFN) mark_stored(t, t->claimed[i].t, skip);
}

/* The student's tensor in the place of the teacher's stored non-FFN tensor X (a random-init
 * baseline replaces them, the ones its architecture claimed too; otherwise it is X itself). */
static const m2d_tensor *student_twin(const m2d_model *t, const m2d_model *s, const m2d_tensor *x) {
    for (int i = 0; i < t->n_claimed; i++)
        if (t->claimed[i].t == x) return s->claimed[i].t;
    if (x == t->embed) return s->embed;
    if (x == t->final_norm) return s->final_norm;
    if (x == t->lm_head) return s->lm_head;
    if (x == t->lm_head_stored) return s->lm_head_stored;
    for (int l = 0; l < t->cfg.num_hidden_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++)
            if (t->layers[l].w[r] == x && !m2d_layer_role_is_ffn(r)) return s->layers[l].w[r];
    return x;
}

/* Teacher tensor X as stored (bit-exact copy), or under its name the student's replacement. */
static int add_kept_tensor(m2d_st_writer *w, const m2d_model *t, const m2d_model *s, const m2d_tensor *x, int twins) {
    const m2d_tensor *y = twins ? student_twin(t, s, x) : x;
    if (!y) y = x;
    return m2d_st_writer_add_ref(w, x->name, y->dtype, y->ndim, y->shape, y->data);
}

/* The weights of an earlier output go first (DIR is marked incomplete meanwhile): a stale
 * model.safetensors would hide a new index from every reader. */
int m2d_convert_write_checkpoint(m2d_st_writer *w, const char *dir, uint64_t max_shard) {
    remove_matching(dir, weights_name);
    if (m2d_st_writer_data_bytes(w) > max_shard) return m2d_st_writer_write_sharded(w, dir, (size_t)max_shard, NULL);
    char *p = m2d_path_join(dir, "model.safetensors");
    int rc = m2d_st_writer_write(w, p);
    free(p);
    return rc;
}

static int write_weights(const m2d_model *t, const m2d_model *s, const char *dir, int twins, uint64_t max_shard) {
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    int rc = 0, n = m2d_st_count(t->st);
    char *replaced = m2d_calloc((size_t)t->cfg.num_hidden_layers, 1), *skip = m2d_calloc((size_t)n + 1, 1);
    for (int l = 0; l < t->cfg.num_hidden_layers; l++) {
        replaced[l] = t->cfg.layer_is_moe[l] || s->layers[l].gate_proj != t->layers[l].gate_proj;
        if (replaced[l]) mark_ffn_block(t, l, skip);
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (!skip[i]) rc = add_kept_tensor(w, t, s, m2d_st_at(t->st, i), twins);
    for (int l = 0; l < t->cfg.num_hidden_layers && rc == 0; l++)
        if (replaced[l]) rc = add_layer_tensors(w, s, l);
    free(replaced);
    free(skip);
    if (rc == 0) rc = m2d_convert_write_checkpoint(w, dir, max_shard);
    m2d_st_writer_free(w);
    return rc;
}

/* per group: [[layer, expert, weight, permuted?], ...] */
static cJSON *sources_json(const m2d_layer_plan *l) {
    cJSON *a = cJSON_CreateArray();
    for (int g = 0; g < l->n_groups; g++) {
        cJSON *grp = cJSON_CreateArray();
        for (int s = l->src_start[g]; s < l->src_start[g + 1]; s++) {
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemToArray(one, cJSON_CreateNumber(l->src_layer[s]));
            cJSON_AddItemToArray(one, cJSON_CreateNumber(l->src_expert[s]));
            cJSON_AddItemToArray(one, cJSON_CreateNumber(l->src_w[s]));
            cJSON_AddItemToArray(one, cJSON_CreateBool(l->src_perm[s] != NULL));
            cJSON_AddItemToArray(grp, one);
        }
        cJSON_AddItemToArray(a, grp);
    }
    return a;
}

static cJSON *manifest_json(const m2d_model *t, const m2d_convert_plan *p, const char *stats_path) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "moe2dense_version", M2D_VERSION);
    cJSON_AddStringToObject(j, "fingerprint", p->fingerprint);
    cJSON_AddStringToObject(j, "target", p->target == M2D_TARGET_DENSE ? "dense" : "moe");
    if (p->target == M2D_TARGET_MOE) {
        cJSON_AddStringToObject(j, "moe_router", p->moe_router == M2D_MOE_ROUTER_SHARED ? "shared" : "average");
        cJSON_AddNumberToObject(j, "ratio", p->ratio);
        cJSON_AddNumberToObject(j, "top_k", p->top_k);
    }
    cJSON *te = cJSON_AddObjectToObject(j, "teacher");
    cJSON_AddStringToObject(te, "dir", t->dir);
    cJSON_AddStringToObject(te, "architecture", t->cfg.arch);
    cJSON_AddStringToObject(te, "weights_hash", t->weights_hash);
    cJSON *st = cJSON_AddObjectToObject(j, "stats");
    cJSON_AddStringToObject(st, "path", stats_path ? stats_path : "");
    cJSON_AddStringToObject(st, "model_hash", p->teacher_hash);
    cJSON_AddStringToObject(st, "calib_hash", p->calib_hash);
    cJSON_AddStringToObject(st, "precision", p->calib_precision);
    if (p->baseline) {
        cJSON *b = cJSON_AddObjectToObject(j, "baseline");
        cJSON_AddStringToObject(b, "kind", m2d_baseline_name(p->baseline));
        cJSON_AddNumberToObject(b, "seed", (double)p->baseline_seed);
        cJSON_AddNumberToObject(b, "init_std", p->init_std);
        cJSON_AddStringToObject(b, "random", p->baseline == M2D_BASELINE_RANDOM_FFN
                                                 ? "every layer's FFN gate/up/down: normal(0, init_std), biases 0"
                                                 : "every tensor: matrices normal(0, init_std), RMSNorm weights 1, "
                                                   "biases 0");
        cJSON_AddStringToObject(b, "teacher", p->baseline == M2D_BASELINE_RANDOM_FFN
                                                  ? "attention, embeddings, norms, LM head: bit for bit"
                                                  : "nothing (the plan below fixes only the FFN width)");
    }
    cJSON_AddStringToObject(j, "scoring", p->scoring);
    cJSON_AddStringToObject(j, "grouping", p->grouping);
    cJSON_AddStringToObject(j, "scaling", p->scaling);
    cJSON_AddNumberToObject(j, "K", p->K);
    cJSON_AddNumberToObject(j, "groups", p->n_groups);
    cJSON *par = cJSON_AddObjectToObject(j, "params");
    for (int i = 0; i < p->n_params; i++) cJSON_AddNumberToObject(par, p->param_keys[i], p->param_values[i]);
    cJSON *layers = cJSON_AddArrayToObject(j, "layers");
    for (int i = 0; i < p->n_layers; i++) {
        const m2d_layer_plan *l = &p->layers[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", l->layer);
        cJSON_AddItemToObject(o, "selected", cJSON_CreateIntArray(l->selected, l->K));
        cJSON_AddItemToObject(o, "scores", cJSON_CreateDoubleArray(l->scores, t->cfg.num_experts));
        cJSON *gs = cJSON_AddArrayToObject(o, "groups"), *ws = cJSON_AddArrayToObject(o, "merge_weights");
        for (int g = 0; g < l->n_groups; g++) {
            int a = l->group_start[g], n = l->group_start[g + 1] - a;
            cJSON_AddItemToArray(gs, cJSON_CreateIntArray(l->members + a, n));
            cJSON_AddItemToArray(ws, cJSON_CreateDoubleArray(l->merge_w + a, n));
        }
        cJSON_AddItemToObject(o, "alpha", cJSON_CreateDoubleArray(l->alpha, l->n_groups));
        if (l->src_start) cJSON_AddItemToObject(o, "sources", sources_json(l));
        cJSON_AddItemToArray(layers, o);
    }
    return j;
}

char *m2d_convert_manifest(const m2d_model *t, const m2d_convert_plan *p, const char *stats_path) {
    cJSON *j = manifest_json(t, p, stats_path);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

int m2d_convert_write(const m2d_model *t, const m2d_model *s, const m2d_convert_plan *plan, const char *stats_path,
                      const char *dir) {
    return m2d_convert_write_sharded(t, s, plan, stats_path, dir, M2D_CONVERT_SHARD_BYTES);
}

int m2d_convert_write_sharded(const m2d_model *t, const m2d_model *s, const m2d_convert_plan *plan,
                              const char *stats_path, const char *dir, uint64_t max_shard_bytes) {
    if (!t->st) return m2d_err("convert: the teacher %s has no safetensors to copy from", t->dir);
    if (max_shard_bytes == 0) return m2d_err("convert: %s: the shard size must be positive", dir);
    m2d_lock lock;
    if (prepare_dir(dir, &lock)) return -1;
    int rc = write_weights(t, s, dir, plan->baseline == M2D_BASELINE_RANDOM_INIT, max_shard_bytes) ||
                     write_config(s, dir) || copy_tokenizer_files(t, dir) ||
             write_json(dir, "moe2dense.json", manifest_json(t, plan, stats_path)) ? -1 : 0;
    if (rc == 0) { /* complete: moe2dense.json is in place, the marker of an unfinished write goes */
        char *mark = m2d_path_join(dir, MARK_INCOMPLETE);
        unlink(mark);
        free(mark);
    }
    m2d_lock_release(&lock);
    return rc;
}

int m2d_convert_prepare_dir(const char *dir, m2d_lock *lock) { return prepare_dir(dir, lock); }

int m2d_convert_lock_dir(const char *dir, m2d_lock *lock) {
    char *lp = m2d_path_join(dir, DIR_LOCK);
    int rc = m2d_lock_acquire(lock, lp, "distill", "another run writes this directory", 0);
    free(lp);
    return rc;
}

int m2d_convert_finish_dir(const char *dir) {
    char *mark = m2d_path_join(dir, MARK_INCOMPLETE);
    int rc = unlink(mark) != 0 && errno != ENOENT ? m2d_err("%s: cannot remove: %s", mark, strerror(errno)) : 0;
    free(mark);
    return rc;
}

int m2d_convert_copy_tokenizer(const m2d_model *from, const char *to_dir) { return copy_tokenizer_files(from, to_dir); }
