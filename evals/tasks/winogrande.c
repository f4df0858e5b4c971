/* winogrande (lm-eval winogrande/default.yaml + preprocess_winogrande.py): winogrande_xl,
 * evaluated on dev (validation), few-shot from train_xl; partial scoring: the two options change
 * the context (sentence[:i] + option), the continuation " " + sentence[i+1:].strip() is shared. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "evals/mc.h"
#include "base/util.h"

static const cJSON *str_field(const cJSON *j, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, name);
    return cJSON_IsString(f) ? f : NULL;
}

static int wino_line(void *user, const void *json, const char *path, int line) {
    m2d_mc_docs *docs = user;
    const cJSON *j = json;
    static const char *fields[] = {"sentence", "option1", "option2", "answer"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(fields); i++)
        if (!str_field(j, fields[i])) return m2d_err("%s:%d: field '%s': missing or not a string", path, line, fields[i]);
    const char *sentence = str_field(j, "sentence")->valuestring;
    const char *answer = str_field(j, "answer")->valuestring;
    const char *blank = strchr(sentence, '_');
    if (!blank) return m2d_err("%s:%d: field 'sentence': no '_' blank", path, line);
    int gold;
    if (strcmp(answer, "1") == 0) gold = 0;
    else if (strcmp(answer, "2") == 0) gold = 1;
    else return m2d_err("%s:%d: field 'answer': '%s' is not \"1\" or \"2\"", path, line, answer);
    size_t i = (size_t)(blank - sentence);
    m2d_mc_doc d = {0};
    d.n_choices = 2;
    d.choices = m2d_calloc(2, sizeof(char *));
    d.choices[0] = m2d_strfmt("%.*s%s", (int)i, sentence, str_field(j, "option1")->valuestring);
    d.choices[1] = m2d_strfmt("%.*s%s", (int)i, sentence, str_field(j, "option2")->valuestring);
    d.gold = gold;
    d.target = m2d_py_strip(blank + 1, strlen(blank + 1));
    /* HF winogrande keeps sentence, option1, option2, answer (qID dropped) */
    d.key = m2d_strfmt("%s\x1f%s\x1f%s\x1f%s", sentence, str_field(j, "option1")->valuestring,
                       str_field(j, "option2")->valuestring, answer);
    m2d_mc_docs_push(docs, d);
    return 0;
}

static int wino_load(const char *data_dir, int sub, int shots, m2d_mc_task *t) {
    (void)sub;
    char *dev = m2d_strfmt("%s/winogrande/winogrande_1.1/dev.jsonl", data_dir);
    char *xl = m2d_strfmt("%s/winogrande/winogrande_1.1/train_xl.jsonl", data_dir);
    char *l = m2d_strfmt("%s/winogrande/winogrande_1.1/train_l.jsonl", data_dir);
    int rc = m2d_jsonl_each(dev, wino_line, &t->eval);
    if (!rc && shots > 0) {
        if (m2d_file_exists(xl)) {
            rc = m2d_jsonl_each(xl, wino_line, &t->pool_own);
        } else {
            rc = m2d_jsonl_each(l, wino_line, &t->pool_own);
            if (!rc)
                m2d_mc_task_note(t, "few-shot pool is train_l (%d items) instead of lm-eval's train_xl (40,398): "
                                    "%s is absent (data/SOURCES.md)", t->pool_own.n, xl);
        }
    }
    free(dev); free(xl); free(l);
    t->description = m2d_strdup("");
    t->sampler = M2D_FEWSHOT_RANDOM;
    t->multiple_input = 1;
    t->draw_extra = 1; /* no test_split and no fewshot_split in the yaml: None == None */
    t->has_acc_norm = 0;
    return rc;
}

M2D_MC_TASK(winogrande, .name = "winogrande",
            .summary = "Winogrande (xl) dev (1267), partial scoring, few-shot from train_xl (else train_l); acc",
            .paper_shots = 5, .paper_metric = "acc", .n_subtasks = 1, .load = wino_load)
