/* state — distillation checkpoints (see state.h). */
#include "train/state.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "io/st.h"

#define STATE_FORMAT "moe2dense-train-state-1"

static const char *const PARTS[] = {"weights", "adam_m", "adam_v"};
static const m2d_pbuf PART_BUF[] = {M2D_PBUF_WEIGHTS, M2D_PBUF_ADAM_M, M2D_PBUF_ADAM_V};

void m2d_run_identity_add(m2d_run_identity *id, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *v = m2d_vstrfmt(fmt, ap);
    va_end(ap);
    if (id->n == id->cap) {
        id->cap = id->cap ? 2 * id->cap : 16;
        id->items = m2d_realloc(id->items, sizeof *id->items * (size_t)id->cap);
    }
    id->items[id->n++] = m2d_strfmt("%s=%s", key, v);
    free(v);
}

void m2d_run_identity_free(m2d_run_identity *id) {
    for (int i = 0; i < id->n; i++) free(id->items[i]);
    free(id->items);
    memset(id, 0, sizeof *id);
}

static char *part_name(int step, int part) { return m2d_strfmt("step-%d.%s.safetensors", step, PARTS[part]); }

int m2d_train_state_exists(const char *dir) {
    char *p = m2d_path_join(dir, "state.json");
    int e = m2d_file_exists(p);
    free(p);
    return e;
}

/* the SHA-256 of a piece's values (p->total floats as stored: little-endian F32) */
static void piece_sha256(const void *data, size_t total, char out[65]) { m2d_sha256_hex(data, sizeof(float) * total, out); }

static int save_part(const char *dir, m2d_train_params *p, int step, int part, float *host, char sha[65]) {
    m2d_train_params_download(p, PART_BUF[part], host);
    piece_sha256(host, p->total, sha);
    m2d_st_writer *w = m2d_st_writer_new();
    int64_t shape[1] = {(int64_t)p->total};
    char *name = part_name(step, part), *path = m2d_path_join(dir, name);
    int rc = m2d_st_writer_add_ref(w, PARTS[part], M2D_F32, 1, shape, host);
    if (rc == 0) rc = m2d_st_writer_write(w, path);
    m2d_st_writer_free(w);
    free(name), free(path);
    return rc;
}

#define NO_STATE (-1)      /* no state.json */
#define DAMAGED_STATE (-2) /* a state.json without a whole step: its pieces are not touched */

/* the step named by DIR/state.json (NO_STATE, DAMAGED_STATE) */
static int saved_step(const char *dir) {
    char *path = m2d_path_join(dir, "state.json");
    size_t n;
    int exists = m2d_file_exists(path);
    char *text = exists ? m2d_read_file(path, &n) : NULL;
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    int step = !exists ? NO_STATE : cJSON_IsNumber(s) && s->valuedouble == (double)s->valueint ? s->valueint : DAMAGED_STATE;
    cJSON_Delete(j);
    free(text), free(path);
    return step;
}

static void remove_step(const char *dir, int step) {
    for (int part = 0; part < 3; part++) {
        char *name = part_name(step, part), *path = m2d_path_join(dir, name);
        unlink(path);
        free(name), free(path);
    }
}

int m2d_train_state_save(const char *dir, m2d_train_params *p, int step, const m2d_run_identity *id,
                         const double *losses) {
    if (m2d_mkdir_p(dir)) return -1;
    int old = saved_step(dir);
    float *host = m2d_malloc(sizeof(float) * (p->total ? p->total : 1));
    char sha[3][65];
    int rc = 0;
    for (int part = 0; part < 3 && rc == 0; part++) rc = save_part(dir, p, step, part, host, sha[part]);
    free(host);
    if (rc) return -1;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(j, "step", step);
    cJSON_AddNumberToObject(j, "parameters", (double)p->total);
    cJSON_AddItemToObject(j, "losses", cJSON_CreateDoubleArray(losses, step));
    cJSON *hashes = cJSON_AddObjectToObject(j, "sha256"); /* of each piece's values, checked on resume */
    for (int part = 0; part < 3; part++) cJSON_AddStringToObject(hashes, PARTS[part], sha[part]);
    cJSON *idj = cJSON_AddObjectToObject(j, "identity");
    for (int i = 0; i < id->n; i++) {
        char *eq = strchr(id->items[i], '=');
        char *key = m2d_strdup(id->items[i]);
        key[eq - id->items[i]] = 0;
        cJSON_AddStringToObject(idj, key, eq + 1);
        free(key);
    }
    char *text = cJSON_Print(j), *path = m2d_path_join(dir, "state.json");
    cJSON_Delete(j);
    rc = m2d_write_file_atomic(path, text, strlen(text));
    free(text), free(path);
    if (rc == 0 && old >= 0 && old != step) remove_step(dir, old);
    return rc;
}

/* Keys added to the identity after checkpoints were first written: a checkpoint without one was
 * made by a run that had this value (the teacher always ran in fp32 before --precision, the
 * student before --train-precision), or (SAME_AS) the value of that other key: the teacher's
 * backend was recorded apart from the student's only later, and is taken to be the student's. */
static const struct { const char *key, *absent_means, *same_as; } LATER_KEYS[] = {
    {"precision", "fp32", NULL}, {"train_precision", "fp32", NULL}, {"teacher_backend", NULL, "backend"}};

static const char *absent_value(const cJSON *saved, const char *key) {
    for (size_t i = 0; i < M2D_ARRAY_LEN(LATER_KEYS); i++) {
        if (strcmp(key, LATER_KEYS[i].key)) continue;
        if (!LATER_KEYS[i].same_as) return LATER_KEYS[i].absent_means;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(saved, LATER_KEYS[i].same_as);
        return cJSON_IsString(v) ? v->valuestring : NULL;
    }
    return NULL;
}

/* every key of ID must be in the saved identity with the same value */
static int check_identity(const char *path, const cJSON *saved, const m2d_run_identity *id) {
    for (int i = 0; i < id->n; i++) {
        const char *eq = strchr(id->items[i], '=');
        char *key = m2d_strdup(id->items[i]);
        key[eq - id->items[i]] = 0;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(saved, key);
        const char *had = cJSON_IsString(v) ? v->valuestring : v ? NULL : absent_value(saved, key);
        int rc = 0;
        if (v && !cJSON_IsString(v)) rc = m2d_err("%s: field 'identity.%s': not a string", path, key);
        else if (!had) rc = m2d_err("%s: field 'identity.%s': missing", path, key);
        else if (strcmp(had, eq + 1))
            rc = m2d_err1("%s: field 'identity.%s': the checkpoint's run had %s, this run has %s (resume needs the "
                          "same run)", path, key, had, eq + 1);
        free(key);
        if (rc) return -1;
    }
    return 0;
}

/* the first element of piece PART that it may not hold (not finite; a negative second moment),
 * or -1 */
static int64_t bad_element(int part, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (PART_BUF[part] == M2D_PBUF_ADAM_V && x[i] < 0)) return (int64_t)i;
    return -1;
}

int m2d_train_state_check_piece(const char *path, const m2d_st *st, int part, size_t total, const char *sha256,
                                const float **data) {
    const m2d_tensor *t = m2d_st_find(st, PARTS[part]);
    if (!t || t->dtype != M2D_F32 || t->ndim != 1 || t->shape[0] != (int64_t)total || m2d_st_count(st) != 1)
        return m2d_err("%s: tensor '%s': missing or not the only tensor, F32 [%zu]", path, PARTS[part], total);
    char sha[65];
    piece_sha256(t->data, total, sha);
    if (strcmp(sha, sha256))
        return m2d_err("%s: tensor '%s': SHA-256 %.16s... is not state.json's %.16s... (field 'sha256.%s'): the "
                       "piece is damaged", path, PARTS[part], sha, sha256, PARTS[part]);
    int64_t bad = bad_element(part, t->data, total);
    if (bad >= 0)
        return m2d_err("%s: tensor '%s': element %lld is %g (%s)", path, PARTS[part], (long long)bad,
                       (double)((const float *)t->data)[bad], part == 2 ? "not finite or negative" : "not finite");
    *data = t->data;
    return 0;
}

static int load_part(const char *dir, m2d_train_params *p, int step, int part, const char *sha256) {
    char *name = part_name(step, part), *path = m2d_path_join(dir, name);
    m2d_st *st = NULL;
    const float *data = NULL;
    int rc = m2d_st_open(path, &st);
    if (rc == 0) rc = m2d_train_state_check_piece(path, st, part, p->total, sha256, &data);
    if (rc == 0) m2d_train_params_upload(p, PART_BUF[part], data);
    m2d_st_close(st);
    free(name), free(path);
    return rc;
}

/* the losses of the saved steps (exact: cJSON prints doubles with 17 digits) */
static int parse_losses(const char *path, const cJSON *a, int step, double *losses) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != step)
        return m2d_err("%s: field 'losses': not a list of %d numbers", path, step);
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
            return m2d_err("%s: field 'losses': item %d is not a finite number", path, i);
        losses[i] = x->valuedouble;
    }
    return 0;
}

/* sha256.weights|adam_m|adam_v: 64 lowercase hex digits each */
static int parse_hashes(const char *path, const cJSON *h, char sha[3][65]) {
    for (int part = 0; part < 3; part++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, PARTS[part]);
        const char *s = cJSON_IsString(v) ? v->valuestring : "";
        int ok = strlen(s) == 64;
        for (int i = 0; ok && i < 64; i++) ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
        if (!ok) return m2d_err("%s: field 'sha256.%s': missing or not 64 lowercase hex digits", path, PARTS[part]);
        memcpy(sha[part], s, 65);
    }
    return 0;
}

/* 'step': a whole number in [1, MAX_STEPS] */
static int parse_step(const char *path, const cJSON *s, int max_steps, int *step) {
    if (!cJSON_IsNumber(s) || !(s->valuedouble >= 1) || s->valuedouble != floor(s->valuedouble))
        return m2d_err("%s: field 'step': missing or not a positive whole number", path);
    if (s->valuedouble > max_steps)
        return m2d_err("%s: field 'step': %.17g is past this run's %d steps", path, s->valuedouble, max_steps);
    *step = (int)s->valuedouble;
    return 0;
}

int m2d_train_state_parse(const char *path, const char *text, size_t n, const m2d_run_identity *id, size_t total,
                          int max_steps, int *step, double *losses, char sha256[3][65]) {
    cJSON *j = cJSON_ParseWithLength(text, n);
    if (!j) return m2d_err("%s: invalid JSON", path);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format"), *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    const cJSON *np = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    int rc = 0, st = 0;
    if (!cJSON_IsString(f) || strcmp(f->valuestring, STATE_FORMAT))
        rc = m2d_err("%s: field 'format': not %s", path, STATE_FORMAT);
    else if (parse_step(path, s, max_steps, &st)) rc = -1;
    else if (!cJSON_IsNumber(np) || np->valuedouble != (double)total)
        rc = m2d_err("%s: field 'parameters': not the student's %zu", path, total);
    else rc = check_identity(path, cJSON_GetObjectItemCaseSensitive(j, "identity"), id);
    if (rc == 0) rc = parse_hashes(path, cJSON_GetObjectItemCaseSensitive(j, "sha256"), sha256);
    if (rc == 0) rc = parse_losses(path, cJSON_GetObjectItemCaseSensitive(j, "losses"), st, losses);
    if (rc == 0) *step = st;
    cJSON_Delete(j);
    return rc;
}

int m2d_train_state_load(const char *dir, m2d_train_params *p, const m2d_run_identity *id, int max_steps, int *step,
                         double *losses) {
    char *path = m2d_path_join(dir, "state.json");
    size_t n;
    char sha[3][65];
    char *text = m2d_read_file(path, &n);
    int rc = text ? m2d_train_state_parse(path, text, n, id, p->total, max_steps, step, losses, sha) : -1;
    for (int part = 0; part < 3 && rc == 0; part++) rc = load_part(dir, p, *step, part, sha[part]);
    free(text), free(path);
    return rc;
}

/* 1 when NAME is a file this module writes into DIR: state.json or a step's piece */
static int state_file_name(const char *name, int *step) {
    char part[16], tail[16];
    *step = -1;
    if (!strcmp(name, "state.json")) return 1;
    if (sscanf(name, "step-%9d.%15[a-z_].%15s", step, part, tail) != 3 || strcmp(tail, "safetensors")) return 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(part, PARTS[i])) return 1;
    return 0;
}

/* 1 when NAME is what an interrupted save left: a temp file of one of this module's files, or a
 * piece of another step than SAVED (written before state.json named it) */
static int save_leftover(const char *name, int saved) {
    int step;
    const char *tag = strstr(name, ".m2d-tmp.");
    if (!tag) return saved != DAMAGED_STATE && state_file_name(name, &step) && step >= 0 && step != saved;
    char *base = m2d_strfmt("%.*s", (int)(tag - name), name);
    int yes = state_file_name(base, &step) && m2d_atomic_leftover(name, base);
    free(base);
    return yes;
}

int m2d_train_state_remove_leftovers(const char *dir) {
    int saved = saved_step(dir), n = 0;
    DIR *dh = opendir(dir);
    for (struct dirent *de; dh && (de = readdir(dh));) {
        if (!save_leftover(de->d_name, saved)) continue;
        char *p = m2d_path_join(dir, de->d_name);
        n += unlink(p) == 0;
        free(p);
    }
    if (dh) closedir(dh);
    return n;
}

int m2d_train_state_remove(const char *dir) {
    int step = saved_step(dir);
    char *path = m2d_path_join(dir, "state.json");
    if (unlink(path) != 0 && errno != ENOENT) {
        m2d_err("%s: cannot remove: %s", path, strerror(errno));
        free(path);
        return -1;
    }
    free(path);
    if (step >= 0) remove_step(dir, step);
    m2d_train_state_remove_leftovers(dir);
    rmdir(dir);
    return 0;
}
