/* hellaswag (lm-eval hellaswag/hellaswag.yaml + utils.py): validation (10,042), few-shot from
 * train. process_docs: query = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()),
 * choices = preprocess(endings), gold = int(label).
 *
 * Data here: the canonical jsonl (data/hellaswag/data/hellaswag_{val,train}.jsonl) when present;
 * otherwise the lossy llama.cpp text variant (6 lines per item: query, gold, 4 endings), whose
 * context keeps ctx_b uncapitalised and which has no train split (pool = validation minus the
 * current item). Both deviations are recorded in the result. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "evals/mc.h"
#include "base/util.h"

#define HS_DIR "hellaswag/data"
#define HS_TEXT "hellaswag/derived/klosax-hellaswag_text_data/hellaswag_val_full.txt"

/* Python str.capitalize(): first character to title case, the rest to lower case. utf8proc has
 * the simple (1:1) case mappings; Python uses the full ones, which differ only for a handful of
 * characters (e.g. 'ß' title-cases to "Ss", 'İ' lower-cases to "i̇"). */
static char *py_capitalize(const char *s) {
    size_t len = strlen(s);
    char *out = m2d_malloc(len * 4 + 1), *w = out;
    size_t i = 0;
    int first = 1;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0) { *w++ = s[i++]; first = 0; continue; } /* invalid byte: copied as is */
        cp = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        w += utf8proc_encode_char(cp, (utf8proc_uint8_t *)w);
        i += (size_t)k;
        first = 0;
    }
    *w = 0;
    return out;
}

/* re.sub("\\[.*?\\]", "", s): each '[' up to the nearest ']' on the same line ('.' excludes '\n'). */
static char *remove_brackets(const char *s) {
    size_t len = strlen(s);
    char *out = m2d_malloc(len + 1), *w = out;
    for (size_t i = 0; i < len;) {
        if (s[i] == '[') {
            size_t j = i + 1;
            while (j < len && s[j] != ']' && s[j] != '\n') j++;
            if (j < len && s[j] == ']') { i = j + 1; continue; }
        }
        *w++ = s[i++];
    }
    *w = 0;
    return out;
}

/* utils.preprocess: strip; " [title]" -> ". "; remove [..]; "  " -> " " (one pass). */
char *m2d_hellaswag_preprocess(const char *text) {
    char *a = m2d_py_strip(text, strlen(text));
    char *b = m2d_py_replace(a, " [title]", ". ");
    char *c = remove_brackets(b);
    char *d = m2d_py_replace(c, "  ", " ");
    free(a); free(b); free(c);
    return d;
}

static int hs_json_line(void *user, const void *json, const char *path, int line) {
    m2d_mc_docs *docs = user;
    const cJSON *j = json;
    static const char *fields[] = {"activity_label", "ctx_a", "ctx_b"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(fields); i++)
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, fields[i])))
            return m2d_err("%s:%d: field '%s': missing or not a string", path, line, fields[i]);
    const cJSON *endings = cJSON_GetObjectItemCaseSensitive(j, "endings");
    if (!cJSON_IsArray(endings) || cJSON_GetArraySize(endings) < 2)
        return m2d_err("%s:%d: field 'endings': missing or fewer than 2 endings", path, line);
    const cJSON *label = cJSON_GetObjectItemCaseSensitive(j, "label");
    int n = cJSON_GetArraySize(endings), gold = -1;
    if (cJSON_IsNumber(label)) gold = label->valueint;
    else if (cJSON_IsString(label) && label->valuestring[0] && strspn(label->valuestring, "0123456789") == strlen(label->valuestring))
        gold = atoi(label->valuestring);
    if (gold < 0 || gold >= n) return m2d_err("%s:%d: field 'label': missing or not an index into endings", path, line);
    for (int i = 0; i < n; i++)
        if (!cJSON_IsString(cJSON_GetArrayItem(endings, i)))
            return m2d_err("%s:%d: field 'endings[%d]': not a string", path, line, i);
    const char *al = cJSON_GetObjectItemCaseSensitive(j, "activity_label")->valuestring;
    const char *ca = cJSON_GetObjectItemCaseSensitive(j, "ctx_a")->valuestring;
    char *cb = py_capitalize(cJSON_GetObjectItemCaseSensitive(j, "ctx_b")->valuestring);
    char *raw = m2d_strfmt("%s: %s %s", al, ca, cb);
    m2d_mc_doc d = {0};
    d.text = m2d_hellaswag_preprocess(raw);
    free(raw); free(cb);
    d.n_choices = n;
    d.choices = m2d_calloc((size_t)n, sizeof(char *));
    for (int i = 0; i < n; i++) d.choices[i] = m2d_hellaswag_preprocess(cJSON_GetArrayItem(endings, i)->valuestring);
    d.gold = gold;
    d.key = cJSON_PrintUnformatted(j); /* HF keeps every jsonl field */
    m2d_mc_docs_push(docs, d);
    return 0;
}

/* llama.cpp text format: per item, query / gold index / 4 endings, one per line. */
static int hs_text_load(const char *path, m2d_mc_docs *docs) {
    size_t len;
    char *buf = m2d_read_file(path, &len);
    if (!buf) return -1;
    char *lines[6];
    int line = 0, rc = 0;
    char *p = buf;
    while (p < buf + len && !rc) {
        int got = 0;
        for (; got < 6 && p < buf + len; got++) {
            char *nl = memchr(p, '\n', (size_t)(buf + len - p));
            char *end = nl ? nl : buf + len;
            if (end > p && end[-1] == '\r') end[-1] = 0;
            *end = 0;
            lines[got] = p;
            p = end + 1;
        }
        line += got;
        if (got == 0) break;
        if (got < 6) { rc = m2d_err("%s:%d: truncated item (needs 6 lines: query, gold, 4 endings)", path, line); break; }
        char *e;
        long gold = strtol(lines[1], &e, 10);
        if (e == lines[1] || *e || gold < 0 || gold > 3) {
            rc = m2d_err("%s:%d: field 'gold': '%s' is not an index 0-3", path, line - 4, lines[1]);
            break;
        }
        m2d_mc_doc d = {0};
        d.text = m2d_strdup(lines[0]);
        d.n_choices = 4;
        d.choices = m2d_calloc(4, sizeof(char *));
        for (int i = 0; i < 4; i++) d.choices[i] = m2d_strdup(lines[2 + i]);
        d.gold = (int)gold;
        d.key = m2d_strfmt("validation#%d", docs->n); /* only the evaluated item itself is dropped */
        m2d_mc_docs_push(docs, d);
    }
    free(buf);
    return rc;
}

static int hs_load(const char *data_dir, int sub, int shots, m2d_mc_task *t) {
    (void)sub;
    char *val = m2d_strfmt("%s/" HS_DIR "/hellaswag_val.jsonl", data_dir);
    char *train = m2d_strfmt("%s/" HS_DIR "/hellaswag_train.jsonl", data_dir);
    char *text = m2d_strfmt("%s/" HS_TEXT, data_dir);
    int rc;
    t->description = m2d_strdup("");
    t->sampler = M2D_FEWSHOT_RANDOM;
    t->has_acc_norm = 1;
    t->draw_extra = 1; /* no test_split and no fewshot_split in the yaml: None == None */
    if (m2d_file_exists(val)) {
        rc = m2d_jsonl_each(val, hs_json_line, &t->eval);
    } else if (m2d_file_exists(text)) {
        rc = hs_text_load(text, &t->eval);
        m2d_mc_task_note(t, "canonical %s absent: used the lossy text variant %s; its contexts keep ctx_b "
                            "uncapitalised (lm-eval applies ctx_b.capitalize()) and its bracket removal is "
                            "llama.cpp's, not the regex \\[.*?\\]", val, text);
    } else {
        rc = m2d_err("%s: missing (and no text variant %s; run `make data`)", val, text);
    }
    if (!rc && shots > 0) {
        if (m2d_file_exists(train)) {
            rc = m2d_jsonl_each(train, hs_json_line, &t->pool_own);
        } else {
            t->pool_is_eval = 1;
            m2d_mc_task_note(t, "train split absent (%s): few-shot pool is the validation split minus the "
                                "current item (k+1 drawn, current dropped)", train);
        }
    }
    free(val); free(train); free(text);
    return rc;
}

M2D_MC_TASK(hellaswag, .name = "hellaswag",
            .summary = "HellaSwag validation (10,042); canonical jsonl or the lossy text variant; acc, acc_norm",
            .paper_shots = 10, .paper_metric = "acc_norm", .n_subtasks = 1, .load = hs_load)
