/* mc — multiple-choice evaluation the lm-evaluation-harness way (data/LM_EVAL_TASKS.md §1). */
#include "evals/mc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "base/util.h"

/* lm-eval defaults shared by the five tasks */
#define TARGET_DELIM " "
#define FEWSHOT_DELIM "\n\n"

/* ---------------------------------------------------------------- documents */

void m2d_mc_docs_push(m2d_mc_docs *s, m2d_mc_doc d) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->docs = m2d_realloc(s->docs, sizeof(m2d_mc_doc) * (size_t)s->cap);
    }
    s->docs[s->n++] = d;
}

static void doc_free(m2d_mc_doc *d) {
    free(d->text);
    for (int i = 0; i < d->n_choices; i++) free(d->choices[i]);
    free(d->choices);
    free(d->target);
    free(d->key);
}

void m2d_mc_docs_free(m2d_mc_docs *s) {
    for (int i = 0; i < s->n; i++) doc_free(&s->docs[i]);
    free(s->docs);
    memset(s, 0, sizeof *s);
}

static int str_eq(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

int m2d_mc_doc_equal(const m2d_mc_doc *a, const m2d_mc_doc *b) {
    if (a == b) return 1;
    if (a->key && b->key) return strcmp(a->key, b->key) == 0;
    if (a->n_choices != b->n_choices || a->gold != b->gold) return 0;
    if (!str_eq(a->text, b->text) || !str_eq(a->target, b->target)) return 0;
    for (int i = 0; i < a->n_choices; i++)
        if (!str_eq(a->choices[i], b->choices[i])) return 0;
    return 1;
}

const m2d_mc_docs *m2d_mc_task_pool(const m2d_mc_task *t) {
    return t->pool_is_eval ? &t->eval : &t->pool_own;
}

void m2d_mc_task_note(m2d_mc_task *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = m2d_vstrfmt(fmt, ap);
    va_end(ap);
    t->notes = m2d_realloc(t->notes, sizeof(char *) * (size_t)(t->n_notes + 1));
    t->notes[t->n_notes++] = s;
}

void m2d_mc_task_free(m2d_mc_task *t) {
    free(t->description);
    m2d_mc_docs_free(&t->eval);
    m2d_mc_docs_free(&t->pool_own);
    for (int i = 0; i < t->n_notes; i++) free(t->notes[i]);
    free(t->notes);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- registry */

#define MAX_MC_PLUGINS 32
static const void *plugin_items[MAX_MC_PLUGINS];
static m2d_name_table plugins = {plugin_items, 0, MAX_MC_PLUGINS, offsetof(m2d_mc_plugin, name),
                                 "too many multiple-choice tasks (raise MAX_MC_PLUGINS)"};

void m2d_mc_plugin_register(const m2d_mc_plugin *p) { m2d_name_table_add(&plugins, p); }
const m2d_mc_plugin *m2d_mc_plugin_find(const char *name) { return m2d_name_table_find(&plugins, name); }
int m2d_mc_plugin_count(void) { return plugins.n; }
const m2d_mc_plugin *m2d_mc_plugin_at(int i) { return plugins.items[i]; }

char *m2d_mc_plugin_list(void) {
    size_t n = 1;
    for (int i = 0; i < plugins.n; i++) n += strlen(m2d_mc_plugin_at(i)->name) + 2;
    char *s = m2d_calloc(1, n + 32);
    for (int i = 0; i < plugins.n; i++) {
        if (i) strcat(s, ", ");
        strcat(s, m2d_mc_plugin_at(i)->name);
    }
    return s;
}

/* ---------------------------------------------------------------- text helpers */

char *m2d_py_strip(const char *s, size_t len) {
    size_t b = 0, e = len;
    while (b < e) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + b, (utf8proc_ssize_t)(e - b), &cp);
        if (k <= 0 || !m2d_py_isspace(cp)) break;
        b += (size_t)k;
    }
    e = b + m2d_py_rstrip_len(s + b, e - b);
    char *out = m2d_malloc(e - b + 1);
    memcpy(out, s + b, e - b);
    out[e - b] = 0;
    return out;
}

char *m2d_py_replace(const char *s, const char *old, const char *rep) {
    size_t lo = strlen(old), lr = strlen(rep), n = 0;
    if (lo == 0) return m2d_strdup(s);
    for (const char *p = strstr(s, old); p; p = strstr(p + lo, old)) n++;
    size_t ls = strlen(s);
    char *out = m2d_malloc(ls - n * lo + n * lr + 1); /* the n matches do not overlap: ls >= n * lo */
    char *w = out;
    const char *r = s;
    for (const char *p = strstr(r, old); p; p = strstr(r, old)) {
        memcpy(w, r, (size_t)(p - r));
        w += p - r;
        memcpy(w, rep, lr);
        w += lr;
        r = p + lo;
    }
    strcpy(w, r);
    return out;
}

size_t m2d_utf8_codepoints(const char *s) {
    size_t n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

int m2d_jsonl_each(const char *path, int (*line_fn)(void *user, const void *json, const char *path, int line),
                   void *user) {
    size_t len;
    char *buf = m2d_read_file(path, &len);
    if (!buf) return -1;
    int rc = 0, line = 0;
    char *p = buf;
    while (p < buf + len) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        char *end = nl ? nl : buf + len;
        line++;
        *end = 0;
        const char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (*q) {
            cJSON *j = cJSON_Parse(p);
            if (!j || !cJSON_IsObject(j)) {
                cJSON_Delete(j);
                rc = m2d_err("%s:%d: malformed JSON line", path, line);
                break;
            }
            rc = line_fn(user, j, path, line);
            cJSON_Delete(j);
            if (rc) break;
        }
        p = end + 1;
    }
    free(buf);
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- prompts and requests */

int m2d_mc_fewshot(const m2d_mc_task *t, m2d_pyrandom *rng, int doc_index, int k, int *idx, int *n_out) {
    const m2d_mc_docs *pool = m2d_mc_task_pool(t);
    *n_out = 0;
    if (k <= 0) return 0; /* lm-eval does not touch the sampler for zero-shot */
    if (t->sampler == M2D_FEWSHOT_FIRST_N) {
        if (k > pool->n)
            return m2d_err("%s: %d-shot needs %d few-shot documents, the pool has %d", t->name, k, k, pool->n);
        for (int i = 0; i < k; i++) idx[i] = i;
        *n_out = k;
        return 0;
    }
    int draw = t->pool_is_eval || t->draw_extra ? k + 1 : k;
    if (draw > pool->n)
        return m2d_err("%s: %d-shot draws %d few-shot documents, the pool has %d", t->name, k, draw, pool->n);
    int *drawn = m2d_malloc(sizeof(int) * (size_t)draw);
    if (m2d_pyrandom_sample(rng, pool->n, draw, drawn)) {
        free(drawn);
        return -1;
    }
    const m2d_mc_doc *doc = &t->eval.docs[doc_index];
    for (int i = 0; i < draw && *n_out < k; i++)
        if (!m2d_mc_doc_equal(&pool->docs[drawn[i]], doc)) idx[(*n_out)++] = drawn[i];
    free(drawn);
    return 0;
}

/* A few-shot example: text + " " + gold answer + "\n\n"; for multiple-input tasks the gold
 * option's context + " " + target + "\n\n". */
static size_t example_render(const m2d_mc_task *t, const m2d_mc_doc *ex, char *w) {
    const char *head = t->multiple_input ? ex->choices[ex->gold] : ex->text;
    const char *tail = t->multiple_input ? ex->target : ex->choices[ex->gold];
    size_t lh = strlen(head), lt = strlen(tail);
    if (w) {
        memcpy(w, head, lh);
        memcpy(w + lh, TARGET_DELIM, 1);
        memcpy(w + lh + 1, tail, lt);
        memcpy(w + lh + 1 + lt, FEWSHOT_DELIM, 2);
    }
    return lh + 1 + lt + 2;
}

char *m2d_mc_fewshot_prefix(const m2d_mc_task *t, const int *idx, int n) {
    const m2d_mc_docs *pool = m2d_mc_task_pool(t);
    const char *desc = t->description ? t->description : "";
    size_t total = strlen(desc);
    for (int i = 0; i < n; i++) total += example_render(t, &pool->docs[idx[i]], NULL);
    char *out = m2d_malloc(total + 1), *w = out;
    memcpy(w, desc, strlen(desc));
    w += strlen(desc);
    for (int i = 0; i < n; i++) w += example_render(t, &pool->docs[idx[i]], w);
    *w = 0;
    return out;
}

int m2d_mc_doc_requests(const m2d_mc_task *t, int doc_index, const char *prefix, m2d_ll_request *reqs) {
    const m2d_mc_doc *d = &t->eval.docs[doc_index];
    for (int c = 0; c < d->n_choices; c++) {
        if (t->multiple_input) {
            reqs[c].context = m2d_strfmt("%s%s", prefix, d->choices[c]);
            reqs[c].continuation = m2d_strfmt("%s%s", TARGET_DELIM, d->target);
        } else {
            reqs[c].context = m2d_strfmt("%s%s", prefix, d->text);
            reqs[c].continuation = m2d_strfmt("%s%s", TARGET_DELIM, d->choices[c]);
        }
    }
    return 0;
}

void m2d_mc_requests_free(m2d_ll_request *reqs, int n) {
    for (int i = 0; i < n; i++) {
        free((char *)reqs[i].context);
        free((char *)reqs[i].continuation);
    }
}

/* ---------------------------------------------------------------- metrics */

/* numpy's argmax: the first maximum, where a NaN is the maximum (the first NaN wins) */
static int argmax_np(const double *x, int n) {
    int best = 0;
    for (int c = 1; c < n && !isnan(x[best]); c++)
        if (isnan(x[c]) || x[c] > x[best]) best = c; /* strict: ties keep the lowest index */
    return best;
}

void m2d_mc_score(const m2d_mc_doc *d, const double *ll, int *acc, int *acc_norm) {
    double *norm = m2d_malloc(sizeof(double) * (size_t)(d->n_choices > 0 ? d->n_choices : 1));
    for (int c = 0; c < d->n_choices; c++) /* lm-eval divides by float(len(choice)): "" gives ±inf or NaN */
        norm[c] = ll[c] / (double)m2d_utf8_codepoints(d->choices[c]);
    *acc = argmax_np(ll, d->n_choices) == d->gold;
    *acc_norm = argmax_np(norm, d->n_choices) == d->gold;
    free(norm);
}

double m2d_mc_stderr(double sum, int n) {
    if (n < 2) return NAN;
    /* items are 0/1: sum((x - mu)^2) = sum - n mu^2 = n p (1 - p) */
    double p = sum / n;
    double var = (sum * (1 - p) * (1 - p) + (n - sum) * p * p) / (n - 1);
    return sqrt(var) / sqrt((double)n);
}

double m2d_mc_pooled_stderr(const double *stderrs, const int *sizes, int n) {
    double num = 0, total = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(stderrs[i])) return NAN;
        num += (sizes[i] - 1) * stderrs[i] * stderrs[i] * sizes[i];
        total += sizes[i];
    }
    if (total - n <= 0) return NAN;
    return sqrt(num / (total - n) / total);
}

/* ---------------------------------------------------------------- running */

void m2d_mc_config_default(m2d_mc_config *c) {
    memset(c, 0, sizeof *c);
    c->data_dir = "data";
    c->seed = 1234;
}

typedef struct {
    const m2d_mc_plugin *plugin;
    int sub;          /* subtask index, or -1 for a plugin without subtasks */
} run_item;

typedef struct {
    run_item *items;
    int n, cap;
} run_list;

static void run_list_add(run_list *l, const m2d_mc_plugin *p, int sub) {
    for (int i = 0; i < l->n; i++)
        if (l->items[i].plugin == p && l->items[i].sub == sub) return; /* listed twice: run once */
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->items = m2d_realloc(l->items, sizeof(run_item) * (size_t)l->cap);
    }
    l->items[l->n++] = (run_item){p, sub};
}

static const char *paper_tasks[] = {"winogrande", "hellaswag", "arc_easy", "arc_challenge", "mmlu"};

static int add_task_name(run_list *l, const char *name) {
    const m2d_mc_plugin *p = m2d_mc_plugin_find(name);
    if (p) {
        if (p->n_subtasks <= 1) run_list_add(l, p, -1);
        else for (int i = 0; i < p->n_subtasks; i++) run_list_add(l, p, i);
        return 0;
    }
    /* a single subtask: "<family>_<subtask>" */
    for (int i = 0; i < plugins.n; i++) {
        p = m2d_mc_plugin_at(i);
        size_t lp = strlen(p->name);
        if (p->n_subtasks <= 1 || strncmp(name, p->name, lp) != 0 || name[lp] != '_') continue;
        for (int s = 0; s < p->n_subtasks; s++)
            if (strcmp(name + lp + 1, p->subtask_name(s)) == 0) {
                run_list_add(l, p, s);
                return 0;
            }
    }
    char *avail = m2d_mc_plugin_list();
    m2d_err("--tasks: unknown task '%s' (available: all, %s, mmlu_<subject>)", name, avail);
    free(avail);
    return -1;
}

static int parse_task_list(const char *tasks, run_list *l) {
    char *copy = m2d_strdup(tasks), *save = NULL;
    int rc = 0, any = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *e = tok + strlen(tok);
        while (e > tok && e[-1] == ' ') *--e = 0;
        if (!*tok) continue;
        any = 1;
        if (strcmp(tok, "all") == 0) {
            for (size_t i = 0; i < M2D_ARRAY_LEN(paper_tasks) && !rc; i++) rc = add_task_name(l, paper_tasks[i]);
        } else {
            rc = add_task_name(l, tok);
        }
    }
    free(copy);
    if (!rc && !any) rc = m2d_err("--tasks: empty task list");
    return rc;
}

static m2d_mc_task_result *results_add(m2d_mc_results *r, const char *name) {
    r->tasks = m2d_realloc(r->tasks, sizeof(m2d_mc_task_result) * (size_t)(r->n_tasks + 1));
    m2d_mc_task_result *t = &r->tasks[r->n_tasks++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

/* Streams dumped requests into an atomic output (base/outfile.h): in place only when the run succeeds. */
typedef struct {
    int open;
    m2d_atomic_file f;
} dump_file;

static int dump_open(dump_file *d, const char *path) {
    memset(d, 0, sizeof *d);
    if (!path) return 0;
    if (m2d_atomic_open(&d->f, path)) return -1;
    d->open = 1;
    return 0;
}

static void dump_request(dump_file *d, const char *task, int doc, int choice, const m2d_ll_request *rq) {
    if (!d->open) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task", task);
    cJSON_AddNumberToObject(o, "doc", doc);
    cJSON_AddNumberToObject(o, "choice", choice);
    cJSON_AddStringToObject(o, "context", rq->context);
    cJSON_AddStringToObject(o, "continuation", rq->continuation);
    char *s = cJSON_PrintUnformatted(o);
    char *line = m2d_strfmt("%s\n", s);
    m2d_atomic_write(&d->f, line, strlen(line)); /* a failure is kept and reported by the commit */
    free(line);
    free(s);
    cJSON_Delete(o);
}

static int dump_close(dump_file *d, int ok) {
    int rc = 0;
    if (d->open && ok) rc = m2d_atomic_commit(&d->f);
    else if (d->open) m2d_atomic_abort(&d->f);
    memset(d, 0, sizeof *d);
    return rc;
}

/* Evaluate one loaded task: per document few-shot draw, requests, scoring. */
static int eval_task(m2d_lm *lm, const m2d_mc_task *t, int shots, int limit, int64_t seed,
                     dump_file *dump, int progress, m2d_mc_task_result *res, int64_t *n_requests) {
    int n = t->eval.n;
    if (limit > 0 && limit < n) n = limit;
    m2d_pyrandom rng;
    m2d_pyrandom_seed(&rng, seed); /* one generator per task, consumed document after document */
    int *idx = m2d_malloc(sizeof(int) * (size_t)(shots > 0 ? shots : 1));
    double sum_acc = 0, sum_norm = 0;
    m2d_progress pr;
    if (progress) m2d_progress_start(&pr, t->name, n);
    int rc = 0;
    for (int d = 0; d < n && !rc; d++) {
        const m2d_mc_doc *doc = &t->eval.docs[d];
        int n_ex;
        if ((rc = m2d_mc_fewshot(t, &rng, d, shots, idx, &n_ex))) break;
        char *prefix = m2d_mc_fewshot_prefix(t, idx, n_ex);
        m2d_ll_request *reqs = m2d_calloc((size_t)doc->n_choices, sizeof *reqs);
        m2d_ll_result *out = m2d_calloc((size_t)doc->n_choices, sizeof *out);
        double *ll = m2d_calloc((size_t)doc->n_choices, sizeof *ll);
        m2d_mc_doc_requests(t, d, prefix, reqs);
        for (int c = 0; c < doc->n_choices; c++) dump_request(dump, t->name, d, c, &reqs[c]);
        rc = m2d_lm_loglikelihood(lm, reqs, doc->n_choices, out);
        if (!rc) {
            for (int c = 0; c < doc->n_choices; c++) ll[c] = out[c].ll;
            int a, an;
            m2d_mc_score(doc, ll, &a, &an);
            sum_acc += a;
            sum_norm += an;
            *n_requests += doc->n_choices;
        }
        m2d_mc_requests_free(reqs, doc->n_choices);
        free(reqs); free(out); free(ll); free(prefix);
        if (progress) m2d_progress_update(&pr, d + 1);
    }
    if (progress) m2d_progress_end(&pr);
    free(idx);
    if (rc) return -1;
    res->n = n;
    res->shots = shots;
    res->acc = n ? sum_acc / n : NAN;
    res->acc_stderr = m2d_mc_stderr(sum_acc, n);
    res->has_acc_norm = t->has_acc_norm;
    res->acc_norm = t->has_acc_norm && n ? sum_norm / n : NAN;
    res->acc_norm_stderr = t->has_acc_norm ? m2d_mc_stderr(sum_norm, n) : NAN;
    for (int i = 0; i < t->n_notes; i++) {
        res->notes = m2d_realloc(res->notes, sizeof(char *) * (size_t)(res->n_notes + 1));
        res->notes[res->n_notes++] = m2d_strdup(t->notes[i]);
    }
    return 0;
}

/* Micro average over members (lm-eval weight_by_size) with pooled stderr. */
static void group_result(m2d_mc_task_result *g, const m2d_mc_task_result *const *members, int n) {
    double *se = m2d_malloc(sizeof(double) * (size_t)(n ? n : 1));
    int *sz = m2d_malloc(sizeof(int) * (size_t)(n ? n : 1));
    double sum = 0;
    int total = 0;
    for (int i = 0; i < n; i++) {
        sum += members[i]->acc * members[i]->n;
        total += members[i]->n;
        se[i] = members[i]->acc_stderr;
        sz[i] = members[i]->n;
    }
    g->is_group = 1;
    g->n = total;
    g->shots = n ? members[0]->shots : 0;
    g->acc = total ? sum / total : NAN;
    g->acc_stderr = m2d_mc_pooled_stderr(se, sz, n);
    g->has_acc_norm = 0;
    g->acc_norm = g->acc_norm_stderr = NAN;
    free(se);
    free(sz);
}

/* Adds "<family>_<group>" results and the "<family>" total when every subtask of a family ran.
 * lm-eval nests them: the family's stderr pools the group stderrs, not the subjects'. */
static void add_groups(m2d_mc_results *r, const m2d_mc_plugin *p, int first, int count) {
    if (!p->subtask_group || count != p->n_subtasks) return;
    const char *names[16];
    int n_groups = 0;
    for (int s = 0; s < p->n_subtasks; s++) {
        const char *g = p->subtask_group(s);
        int k = 0;
        while (k < n_groups && strcmp(names[k], g) != 0) k++;
        if (k == n_groups && n_groups < 16) names[n_groups++] = g;
    }
    const m2d_mc_task_result **members = m2d_malloc(sizeof(*members) * (size_t)p->n_subtasks);
    int group_first = r->n_tasks;
    for (int k = 0; k < n_groups; k++) {
        int m = 0;
        for (int s = 0; s < p->n_subtasks; s++)
            if (strcmp(p->subtask_group(s), names[k]) == 0) members[m++] = &r->tasks[first + s];
        char name[96];
        snprintf(name, sizeof name, "%s_%s", p->name, names[k]);
        m2d_mc_task_result tmp_g;
        memset(&tmp_g, 0, sizeof tmp_g);
        group_result(&tmp_g, members, m); /* before results_add: its realloc moves the members */
        m2d_mc_task_result *g = results_add(r, name);
        memcpy(tmp_g.name, g->name, sizeof tmp_g.name);
        *g = tmp_g;
    }
    for (int k = 0; k < n_groups; k++) members[k] = &r->tasks[group_first + k];
    m2d_mc_task_result tmp;
    memset(&tmp, 0, sizeof tmp);
    group_result(&tmp, members, n_groups);
    free(members);
    /* notes of the family (same for every subject) are carried by the total */
    m2d_mc_task_result *tot = results_add(r, p->name);
    const m2d_mc_task_result *first_sub = &r->tasks[first]; /* after the realloc */
    char keep[96];
    memcpy(keep, tot->name, sizeof keep);
    *tot = tmp;
    memcpy(tot->name, keep, sizeof keep);
    for (int i = 0; i < first_sub->n_notes; i++) {
        tot->notes = m2d_realloc(tot->notes, sizeof(char *) * (size_t)(tot->n_notes + 1));
        tot->notes[tot->n_notes++] = m2d_strdup(first_sub->notes[i]);
    }
}

static void paper_average(m2d_mc_results *r) {
    double sum = 0;
    for (size_t i = 0; i < M2D_ARRAY_LEN(paper_tasks); i++) {
        const m2d_mc_plugin *p = m2d_mc_plugin_find(paper_tasks[i]);
        const m2d_mc_task_result *t = m2d_mc_results_find(r, paper_tasks[i]);
        if (!p || !t) return;
        sum += strcmp(p->paper_metric, "acc_norm") == 0 ? t->acc_norm : t->acc;
    }
    r->has_paper_average = 1;
    r->paper_average = sum / (double)M2D_ARRAY_LEN(paper_tasks);
}

static int run_documents(m2d_lm *lm, const char *tasks, int shots, int limit, const m2d_mc_config *cfg,
                         m2d_mc_results *out) {
    memset(out, 0, sizeof *out);
    out->limit = limit > 0 ? limit : 0;
    out->seed = cfg->seed;
    if (shots < 0 && shots != M2D_MC_SHOTS_PAPER) return m2d_err("--shots: must be >= 0 or 'paper' (got %d)", shots);
    run_list l = {0};
    if (parse_task_list(tasks, &l)) { free(l.items); return -1; }
    dump_file dump;
    if (dump_open(&dump, cfg->dump_requests)) { free(l.items); return -1; }
    const char *data_dir = cfg->data_dir ? cfg->data_dir : "data";
    int rc = 0;
    for (int i = 0; i < l.n && !rc; i++) {
        const m2d_mc_plugin *p = l.items[i].plugin;
        int k = shots == M2D_MC_SHOTS_PAPER ? p->paper_shots : shots;
        m2d_mc_task task;
        memset(&task, 0, sizeof task);
        int sub = l.items[i].sub;
        if (sub >= 0) snprintf(task.name, sizeof task.name, "%s_%s", p->name, p->subtask_name(sub));
        else snprintf(task.name, sizeof task.name, "%s", p->name);
        if ((rc = p->load(data_dir, sub < 0 ? 0 : sub, k, &task))) { m2d_mc_task_free(&task); break; }
        m2d_mc_task_result *res = results_add(out, task.name);
        rc = eval_task(lm, &task, k, out->limit, cfg->seed, &dump, cfg->progress, res, &out->n_requests);
        m2d_mc_task_free(&task);
        /* after the last subtask of a family: its groups */
        if (!rc && sub >= 0 && (i + 1 == l.n || l.items[i + 1].plugin != p)) {
            int count = 0;
            while (count <= i && l.items[i - count].plugin == p) count++;
            add_groups(out, p, out->n_tasks - count, count);
        }
    }
    free(l.items);
    if (dump_close(&dump, rc == 0) && !rc) rc = -1;
    if (rc) { m2d_mc_results_free(out); return -1; }
    paper_average(out);
    return 0;
}

/* A layer-major engine's evaluation: the requests recorded (a first run, quiet, dumping nothing),
 * all scored in one pass of the engine (evals/lm.h m2d_lm_engine_score_all), then the evaluation
 * run again on those scores. */
static int run_one_pass(m2d_lm *lm, const char *tasks, int shots, int limit, const m2d_mc_config *cfg,
                        m2d_mc_results *out) {
    m2d_ll_recording rec = {0};
    m2d_lm recorder = m2d_lm_recorder(&rec);
    m2d_mc_config quiet = *cfg;
    quiet.progress = 0, quiet.dump_requests = NULL;
    int rc = run_documents(&recorder, tasks, shots, limit, &quiet, out);
    m2d_mc_results_free(out);
    m2d_ll_result *res = m2d_calloc((size_t)rec.n + 1, sizeof *res);
    if (rc == 0) rc = m2d_lm_engine_score_all(lm, rec.reqs, rec.n, res);
    m2d_ll_replay rp = {&rec, res, 0};
    m2d_lm replay = m2d_lm_replayer(&rp);
    if (rc == 0) rc = run_documents(&replay, tasks, shots, limit, cfg, out);
    free(res);
    m2d_ll_recording_free(&rec);
    return rc;
}

int m2d_mc_run(m2d_lm *lm, const char *tasks, int shots, int limit, const m2d_mc_config *cfg,
               m2d_mc_results *out) {
    m2d_mc_config dflt;
    if (!cfg) { m2d_mc_config_default(&dflt); cfg = &dflt; }
    m2d_engine *e = m2d_lm_engine_of(lm);
    if (e && m2d_engine_pass(e)->layer_major) return run_one_pass(lm, tasks, shots, limit, cfg, out);
    return run_documents(lm, tasks, shots, limit, cfg, out);
}

void m2d_mc_results_free(m2d_mc_results *r) {
    for (int i = 0; i < r->n_tasks; i++) {
        for (int j = 0; j < r->tasks[i].n_notes; j++) free(r->tasks[i].notes[j]);
        free(r->tasks[i].notes);
    }
    free(r->tasks);
    memset(r, 0, sizeof *r);
}

const m2d_mc_task_result *m2d_mc_results_find(const m2d_mc_results *r, const char *name) {
    for (int i = 0; i < r->n_tasks; i++)
        if (strcmp(r->tasks[i].name, name) == 0) return &r->tasks[i];
    return NULL;
}

/* A subject of a family whose groups were reported (kept out of the text table). */
static int is_grouped_subtask(const m2d_mc_results *r, const m2d_mc_task_result *t) {
    if (t->is_group) return 0;
    for (int i = 0; i < plugins.n; i++) {
        const m2d_mc_plugin *p = m2d_mc_plugin_at(i);
        size_t lp = strlen(p->name);
        if (p->n_subtasks > 1 && strncmp(t->name, p->name, lp) == 0 && t->name[lp] == '_' &&
            m2d_mc_results_find(r, p->name))
            return 1;
    }
    return 0;
}

static void fmt_val(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "N/A");
    else snprintf(buf, n, "%.4f", v);
}

void m2d_mc_results_print(const m2d_mc_results *r, FILE *f) {
    fprintf(f, "%-32s %5s %6s  %-8s %-8s  %-8s %-8s\n", "task", "shots", "n", "acc", "stderr", "acc_norm", "stderr");
    for (int i = 0; i < r->n_tasks; i++) {
        const m2d_mc_task_result *t = &r->tasks[i];
        if (is_grouped_subtask(r, t)) continue;
        char a[16], as[16], an[16], ans[16];
        fmt_val(a, sizeof a, t->acc);
        fmt_val(as, sizeof as, t->acc_stderr);
        fmt_val(an, sizeof an, t->has_acc_norm ? t->acc_norm : NAN);
        fmt_val(ans, sizeof ans, t->has_acc_norm ? t->acc_norm_stderr : NAN);
        if (!t->has_acc_norm) { strcpy(an, "-"); strcpy(ans, "-"); }
        char name[100];
        snprintf(name, sizeof name, "%s%s", t->is_group && strchr(t->name, '_') ? "  " : "", t->name);
        fprintf(f, "%-32s %5d %6d  %-8s %-8s  %-8s %-8s\n", name, t->shots, t->n, a, as, an, ans);
    }
    if (r->has_paper_average)
        fprintf(f, "paper average (winogrande acc, hellaswag acc_norm, arc_easy acc_norm, arc_challenge acc_norm, "
                   "mmlu acc micro): %.4f\n", r->paper_average);
    if (r->limit) fprintf(f, "limit: first %d documents per task (per subject for mmlu)\n", r->limit);
    int any = 0;
    for (int i = 0; i < r->n_tasks; i++) {
        const m2d_mc_task_result *t = &r->tasks[i];
        if (is_grouped_subtask(r, t)) continue;
        for (int j = 0; j < t->n_notes; j++) {
            if (!any++) fprintf(f, "deviations from lm-evaluation-harness:\n");
            fprintf(f, "  %s: %s\n", t->name, t->notes[j]);
        }
    }
}

static void json_num(cJSON *o, const char *k, double v) {
    if (isnan(v)) cJSON_AddStringToObject(o, k, "N/A"); /* lm-eval writes "N/A" too */
    else cJSON_AddNumberToObject(o, k, v);
}

char *m2d_mc_results_json(const m2d_mc_results *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON *res = cJSON_AddObjectToObject(root, "results");
    for (int i = 0; i < r->n_tasks; i++) {
        const m2d_mc_task_result *t = &r->tasks[i];
        cJSON *o = cJSON_AddObjectToObject(res, t->name);
        cJSON_AddBoolToObject(o, "group", t->is_group);
        cJSON_AddNumberToObject(o, "n", t->n);
        cJSON_AddNumberToObject(o, "shots", t->shots);
        json_num(o, "acc", t->acc);
        json_num(o, "acc_stderr", t->acc_stderr);
        if (t->has_acc_norm) {
            json_num(o, "acc_norm", t->acc_norm);
            json_num(o, "acc_norm_stderr", t->acc_norm_stderr);
        }
        cJSON *notes = cJSON_AddArrayToObject(o, "deviations");
        for (int j = 0; j < t->n_notes; j++) cJSON_AddItemToArray(notes, cJSON_CreateString(t->notes[j]));
    }
    if (r->has_paper_average) json_num(root, "paper_average", r->paper_average);
    else cJSON_AddNullToObject(root, "paper_average");
    cJSON_AddStringToObject(root, "paper_average_definition",
                            "mean of winogrande acc, hellaswag acc_norm, arc_easy acc_norm, arc_challenge acc_norm, mmlu acc (micro)");
    if (r->limit) cJSON_AddNumberToObject(root, "limit", r->limit);
    else cJSON_AddNullToObject(root, "limit");
    cJSON_AddNumberToObject(root, "requests", (double)r->n_requests);
    cJSON *c = cJSON_AddObjectToObject(root, "config");
    cJSON_AddNumberToObject(c, "fewshot_random_seed", (double)r->seed);
    cJSON_AddStringToObject(c, "fewshot_sampler", "python random.Random(seed).sample, one generator per task; mmlu: first_n");
    cJSON_AddStringToObject(c, "target_delimiter", " ");
    cJSON_AddStringToObject(c, "fewshot_delimiter", "\n\n");
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}
