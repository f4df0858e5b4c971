/* mmlu (lm-eval mmlu/default): 57 subjects, test split, 5 dev rows as few-shot with the first_n
 * sampler, description "The following are multiple choice questions (with answers) about
 * <subject with spaces>.\n\n", continuations " A".." D"; acc; groups stem / humanities /
 * social_sciences / other and the total micro-averaged (weight_by_size). */
#include <csv.h>
#include <stdlib.h>
#include <string.h>

#include "evals/mc.h"
#include "base/util.h"

static const struct { const char *name, *group; } subjects[] = {
    {"abstract_algebra", "stem"}, {"anatomy", "stem"}, {"astronomy", "stem"},
    {"business_ethics", "other"}, {"clinical_knowledge", "other"}, {"college_biology", "stem"},
    {"college_chemistry", "stem"}, {"college_computer_science", "stem"}, {"college_mathematics", "stem"},
    {"college_medicine", "other"}, {"college_physics", "stem"}, {"computer_security", "stem"},
    {"conceptual_physics", "stem"}, {"econometrics", "social_sciences"}, {"electrical_engineering", "stem"},
    {"elementary_mathematics", "stem"}, {"formal_logic", "humanities"}, {"global_facts", "other"},
    {"high_school_biology", "stem"}, {"high_school_chemistry", "stem"}, {"high_school_computer_science", "stem"},
    {"high_school_european_history", "humanities"}, {"high_school_geography", "social_sciences"},
    {"high_school_government_and_politics", "social_sciences"}, {"high_school_macroeconomics", "social_sciences"},
    {"high_school_mathematics", "stem"}, {"high_school_microeconomics", "social_sciences"},
    {"high_school_physics", "stem"}, {"high_school_psychology", "social_sciences"},
    {"high_school_statistics", "stem"}, {"high_school_us_history", "humanities"},
    {"high_school_world_history", "humanities"}, {"human_aging", "other"}, {"human_sexuality", "social_sciences"},
    {"international_law", "humanities"}, {"jurisprudence", "humanities"}, {"logical_fallacies", "humanities"},
    {"machine_learning", "stem"}, {"management", "other"}, {"marketing", "other"}, {"medical_genetics", "other"},
    {"miscellaneous", "other"}, {"moral_disputes", "humanities"}, {"moral_scenarios", "humanities"},
    {"nutrition", "other"}, {"philosophy", "humanities"}, {"prehistory", "humanities"},
    {"professional_accounting", "other"}, {"professional_law", "humanities"}, {"professional_medicine", "other"},
    {"professional_psychology", "social_sciences"}, {"public_relations", "social_sciences"},
    {"security_studies", "social_sciences"}, {"sociology", "social_sciences"},
    {"us_foreign_policy", "social_sciences"}, {"virology", "other"}, {"world_religions", "humanities"},
};

static const char *mmlu_subject(int i) { return subjects[i].name; }
static const char *mmlu_group(int i) { return subjects[i].group; }

/* libcsv callbacks: collect the fields of a row, then turn the row into a document. */
typedef struct {
    const char *path, *subject;
    m2d_mc_docs *docs;
    char *fields[8];
    int n_fields, row, rc;
} csv_state;

static void csv_field(void *s, size_t len, void *user) {
    csv_state *st = user;
    if (st->n_fields < 8) {
        char *f = m2d_malloc(len + 1);
        memcpy(f, s, len);
        f[len] = 0;
        st->fields[st->n_fields] = f;
    }
    st->n_fields++;
}

static void csv_clear(csv_state *st) {
    for (int i = 0; i < st->n_fields && i < 8; i++) free(st->fields[i]);
    st->n_fields = 0;
}

static void csv_row(int term, void *user) {
    (void)term;
    csv_state *st = user;
    st->row++;
    if (st->rc) { csv_clear(st); return; }
    if (st->n_fields != 6) {
        st->rc = m2d_err("%s:row %d: field 'answer': expected 6 fields (question, A, B, C, D, answer), got %d",
                         st->path, st->row, st->n_fields);
        csv_clear(st);
        return;
    }
    const char *ans = st->fields[5];
    if (!(ans[0] >= 'A' && ans[0] <= 'D' && ans[1] == 0)) {
        st->rc = m2d_err("%s:row %d: field 'answer': '%s' is not one of A, B, C, D", st->path, st->row, ans);
        csv_clear(st);
        return;
    }
    char **f = st->fields;
    char *q = m2d_py_strip(f[0], strlen(f[0]));
    m2d_mc_doc d = {0};
    d.text = m2d_strfmt("%s\nA. %s\nB. %s\nC. %s\nD. %s\nAnswer:", q, f[1], f[2], f[3], f[4]);
    free(q);
    d.n_choices = 4;
    d.choices = m2d_calloc(4, sizeof(char *));
    for (int i = 0; i < 4; i++) d.choices[i] = m2d_strfmt("%c", 'A' + i);
    d.gold = ans[0] - 'A';
    d.key = m2d_strfmt("%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s", f[0], f[1], f[2], f[3], f[4], f[5], st->subject);
    m2d_mc_docs_push(st->docs, d);
    csv_clear(st);
}

static int no_space(unsigned char c) { (void)c; return 0; } /* keep spaces: Python csv.reader does */

static int mmlu_csv(const char *path, const char *subject, m2d_mc_docs *docs) {
    size_t len;
    char *buf = m2d_read_file(path, &len);
    if (!buf) return -1;
    struct csv_parser p;
    csv_init(&p, 0);
    csv_set_space_func(&p, no_space);
    csv_state st = {.path = path, .subject = subject, .docs = docs};
    if (csv_parse(&p, buf, len, csv_field, csv_row, &st) != len && !st.rc)
        st.rc = m2d_err("%s:row %d: field 'question': %s", path, st.row + 1, csv_strerror(csv_error(&p)));
    if (!st.rc && csv_fini(&p, csv_field, csv_row, &st) != 0 && !st.rc)
        st.rc = m2d_err("%s:row %d: field 'answer': %s", path, st.row + 1, csv_strerror(csv_error(&p)));
    csv_clear(&st);
    csv_free(&p);
    free(buf);
    return st.rc;
}

static int mmlu_load(const char *data_dir, int i, int shots, m2d_mc_task *t) {
    (void)shots;
    const char *s = subjects[i].name;
    char *test = m2d_strfmt("%s/mmlu/data/test/%s_test.csv", data_dir, s);
    char *dev = m2d_strfmt("%s/mmlu/data/dev/%s_dev.csv", data_dir, s);
    int rc = mmlu_csv(test, s, &t->eval);
    if (!rc) rc = mmlu_csv(dev, s, &t->pool_own);
    free(test);
    free(dev);
    char *spaced = m2d_py_replace(s, "_", " ");
    t->description = m2d_strfmt("The following are multiple choice questions (with answers) about %s.\n\n", spaced);
    free(spaced);
    t->sampler = M2D_FEWSHOT_FIRST_N;
    t->has_acc_norm = 0;
    return rc;
}

M2D_MC_TASK(mmlu, .name = "mmlu",
            .summary = "MMLU 57 subjects, test (14,042), first-n dev shots; acc, micro groups stem/humanities/social_sciences/other",
            .paper_shots = 5, .paper_metric = "acc", .n_subtasks = (int)M2D_ARRAY_LEN(subjects),
            .subtask_name = mmlu_subject, .subtask_group = mmlu_group, .load = mmlu_load)
