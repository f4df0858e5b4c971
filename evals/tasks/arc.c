/* arc_easy / arc_challenge (lm-eval arc/arc_easy.yaml): test split, few-shot from train,
 * "Question: {{question}}\nAnswer:", choices = choices.text, gold = labels.index(answerKey). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "evals/mc.h"
#include "base/util.h"

static int arc_line(void *user, const void *json, const char *path, int line) {
    m2d_mc_docs *docs = user;
    const cJSON *j = json;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "question");
    const cJSON *stem = cJSON_GetObjectItemCaseSensitive(q, "stem");
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(q, "choices");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(j, "answerKey");
    if (!cJSON_IsString(stem)) return m2d_err("%s:%d: field 'question.stem': missing or not a string", path, line);
    if (!cJSON_IsArray(choices) || cJSON_GetArraySize(choices) < 2)
        return m2d_err("%s:%d: field 'question.choices': missing or fewer than 2 choices", path, line);
    if (!cJSON_IsString(key)) return m2d_err("%s:%d: field 'answerKey': missing or not a string", path, line);
    int n = cJSON_GetArraySize(choices);
    m2d_mc_doc d = {0};
    d.choices = m2d_calloc((size_t)n, sizeof(char *));
    d.gold = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(choices, i);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *label = cJSON_GetObjectItemCaseSensitive(c, "label");
        if (!cJSON_IsString(text) || !cJSON_IsString(label)) {
            for (int t = 0; t < d.n_choices; t++) free(d.choices[t]);
            free(d.choices);
            return m2d_err("%s:%d: field 'question.choices[%d]': needs string 'text' and 'label'", path, line, i);
        }
        d.choices[d.n_choices++] = m2d_strdup(text->valuestring);
        if (d.gold < 0 && strcmp(label->valuestring, key->valuestring) == 0) d.gold = i;
    }
    if (d.gold < 0) {
        for (int t = 0; t < d.n_choices; t++) free(d.choices[t]);
        free(d.choices);
        return m2d_err("%s:%d: field 'answerKey': '%s' is not one of the choice labels", path, line, key->valuestring);
    }
    d.text = m2d_strfmt("Question: %s\nAnswer:", stem->valuestring);
    d.key = cJSON_PrintUnformatted(j); /* id, question, answerKey: the whole HF row */
    m2d_mc_docs_push(docs, d);
    return 0;
}

static int arc_load(const char *data_dir, const char *set, m2d_mc_task *t) {
    char *eval = m2d_strfmt("%s/arc/ARC-V1-Feb2018-2/ARC-%s/ARC-%s-Test.jsonl", data_dir, set, set);
    char *train = m2d_strfmt("%s/arc/ARC-V1-Feb2018-2/ARC-%s/ARC-%s-Train.jsonl", data_dir, set, set);
    int rc = m2d_jsonl_each(eval, arc_line, &t->eval);
    if (!rc) rc = m2d_jsonl_each(train, arc_line, &t->pool_own);
    free(eval);
    free(train);
    t->description = m2d_strdup("");
    t->sampler = M2D_FEWSHOT_RANDOM;
    t->has_acc_norm = 1;
    return rc;
}

static int arc_easy_load(const char *data_dir, int i, int shots, m2d_mc_task *t) {
    (void)i; (void)shots;
    return arc_load(data_dir, "Easy", t);
}

static int arc_challenge_load(const char *data_dir, int i, int shots, m2d_mc_task *t) {
    (void)i; (void)shots;
    return arc_load(data_dir, "Challenge", t);
}

M2D_MC_TASK(arc_easy, .name = "arc_easy", .summary = "ARC-Easy test (2376), few-shot from train; acc, acc_norm",
            .paper_shots = 25, .paper_metric = "acc_norm", .n_subtasks = 1, .load = arc_easy_load)
M2D_MC_TASK(arc_challenge, .name = "arc_challenge",
            .summary = "ARC-Challenge test (1172), few-shot from train; acc, acc_norm", .paper_shots = 25,
            .paper_metric = "acc_norm", .n_subtasks = 1, .load = arc_challenge_load)
