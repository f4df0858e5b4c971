/* report --table 8|16|17 and --figure 7 (harness/sweep/report_scoring_k.c) on a hand-written CSV.
 * k = 8 (the header's teacher=), so K = 8 is "k" and K = 16 "2k". Config ids 0000000000NN written NN. By hand:
 *   sf:  K = 8 -> 06 (the only one); K = 16 -> 08 (2,500; 07 failed), not distilled: empty cells
 *   acp: K = 8 -> 01 (900, tied with its dedup 02: the first in the file); K = 16 -> 04 (400 < 500
 *        of 03); K = 64 = E (05, PPL 100) is neither
 *   random-ffn 09, random-init 0a (their K = k rows); the D2D row 0b (PPL 50) and the MoE student
 *   0c (PPL 10) are never selected.
 * Table 8 bolds the better of a scoring's two rows: acp K = 8 has the better ARC-E (45.00 > 43.00),
 * K = 16 the better post PPL (27 < 30), Wino (55 > 52) and Avg (49 > 48.5); sf's K = 16 was not
 * distilled: nothing to compare, nothing bold. Tables 16/17 bold per column over all students (the
 * same cells here, plus none of the baselines) and add the teacher (ARC-E in its paper metric,
 * acc_norm: 71.00). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/results.h"
#include "sweep/report_scoring_k.h"

static const char *HEADER =
    "# moe2dense-results=1\n"
    "# experiment=hand\n"
    "# model=../shared/models/tiny-qwen3moe\n"
    "# teacher=E=64 k=8\n"
    "# teacher_ppl=9.5 windows=8\n"
    "# teacher_mc=winogrande_acc:0.600000,arc_easy_acc:0.700000,arc_easy_acc_norm:0.710000,mc_avg:0.655000\n";

/* a 64-digit fingerprint from two hex digits */
#define FP16(x) x x x x x x x x x x x x x x x x
#define FP(x) FP16(x) FP16(x)

static const char *ROWS =
    "config_id,scoring,grouping,scaling,K_expr,K,params,target,ppl,winogrande_acc,arc_easy_acc,arc_easy_acc_norm,"
    "mc_avg,mc_student,distill_ppl,status,dedup_of,fingerprint\n"
    "000000000001,acp,rr,uniform,k,8,,dense,900,0.52,0.40,0.45,0.485,distilled,30,ok,,"
    FP("a1") "\n"
    "000000000002,acp,wc,uniform,k,8,,dense,900,0.52,0.40,0.45,0.485,distilled,30,ok,000000000001,"
    FP("a1") "\n"
    "000000000003,acp,rr,proportional,2k,16,,dense,500,0.50,0.44,0.44,0.47,distilled,28,ok,,"
    FP("a2") "\n"
    "000000000004,acp,wc,uniform,2k,16,,dense,400,0.55,0.38,0.43,0.49,distilled,27,ok,,"
    FP("a3") "\n"
    "000000000005,acp,rr,uniform,E,64,,dense,100,,,,,,,ok,,"
    FP("a4") "\n"
    "000000000006,sf,rr,uniform,k,8,,dense,3000,0.51,0.30,0.33,0.42,distilled,40,ok,,"
    FP("b1") "\n"
    "000000000007,sf,rr,uniform,2k,16,,dense,,,,,,,,failed: non-finite perplexity,,"
    FP("b2") "\n"
    "000000000008,sf,rr,proportional,2k,16,,dense,2500,,,,,,,ok,,"
    FP("b3") "\n"
    "000000000009,random-ffn,rr,uniform,k,8,,dense,80000,0.50,0.25,0.26,0.38,distilled,60,ok,,"
    FP("c1") "\n"
    "00000000000a,random-init,rr,uniform,k,8,,dense,90000,0.49,0.24,0.25,0.37,distilled,70,ok,,"
    FP("c2") "\n"
    "00000000000b,d2d,none,none,k,8,shape=L4-H192-F576-A6/2,dense,50,0.60,0.5,0.5,0.55,distilled,20,ok,,"
    FP("d1") "\n"
    "00000000000c,freq,none,none,(1-0.25)E,48,,moe,10,,,,,,,ok,,"
    FP("e1") "\n";

static m2d_results parse(const char *header) {
    char *csv = m2d_strfmt("%s%s", header, ROWS);
    m2d_results r;
    if (m2d_results_parse("hand.csv", csv, strlen(csv), &r)) fail_msg("%s", m2d_errmsg());
    free(csv);
    return r;
}

typedef int (*writer)(const m2d_results *, int, m2d_report_format, FILE *);

static int fig7(const m2d_results *r, int unused, m2d_report_format fmt, FILE *f) {
    (void)unused;
    return m2d_report_figure7_write(r, fmt, f);
}

static char *render_rc(const m2d_results *r, writer w, int table, m2d_report_format fmt, int *rc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *rc = w(r, table, fmt, f);
    fclose(f);
    return buf;
}

static char *render(const m2d_results *r, writer w, int table, m2d_report_format fmt) {
    int rc;
    char *buf = render_rc(r, w, table, fmt, &rc);
    if (rc) fail_msg("%s", m2d_errmsg());
    return buf;
}

/* W refuses R with an error holding WANT */
static void refused(const m2d_results *r, writer w, int table, const char *want) {
    int rc;
    free(render_rc(r, w, table, M2D_REPORT_MD, &rc));
    assert_int_equal(rc, -1);
    if (!strstr(m2d_errmsg(), want)) fail_msg("error '%s', want '%s'", m2d_errmsg(), want);
}

/* every line of WANT in TEXT, in order */
static void lines_in_order(const char *text, const char *const *want, size_t n) {
    const char *at = text;
    for (size_t i = 0; i < n; i++) {
        const char *hit = strstr(at, want[i]);
        if (!hit) fail_msg("'%s' missing or out of order in:\n%s", want[i], text);
        at = hit + strlen(want[i]);
    }
}

static void selection_per_scoring_at_k_and_2k(void **state) {
    (void)state;
    m2d_results r = parse(HEADER);
    int *rows, n = m2d_report_best_per_scoring_K(&r, &rows);
    const char *want[] = {"000000000006", "000000000008", "000000000001", "000000000004", "000000000009", "00000000000a"};
    assert_int_equal(n, (int)M2D_ARRAY_LEN(want));
    for (int i = 0; i < n; i++) assert_string_equal(m2d_results_get(&r, rows[i], "config_id"), want[i]);
    free(rows);
    m2d_results_free(&r);
    /* without the header's teacher line the K expressions decide: the same rows */
    r = parse("# moe2dense-results=1\n");
    n = m2d_report_best_per_scoring_K(&r, &rows);
    assert_int_equal(n, (int)M2D_ARRAY_LEN(want));
    for (int i = 0; i < n; i++) assert_string_equal(m2d_results_get(&r, rows[i], "config_id"), want[i]);
    free(rows);
    refused(&r, fig7, 0, "field 'teacher'"); /* Figure 7 needs k from the header */
    m2d_results_free(&r);
    /* a file without a ppl column names it */
    const char *bad = "config_id,scoring,K,status\n000000000001,sf,8,ok\n";
    assert_int_equal(m2d_results_parse("bad.csv", bad, strlen(bad), &r), 0);
    assert_int_equal(m2d_report_best_per_scoring_K(&r, &rows), -1);
    assert_non_null(strstr(m2d_errmsg(), "field 'ppl'"));
    free(rows);
    m2d_results_free(&r);
}

static void table8_bold_per_scoring(void **state) {
    (void)state;
    m2d_results r = parse(HEADER);
    const char *acp = m2d_report_display_name("acp"), *sf = m2d_report_display_name("sf");
    char *md = render(&r, m2d_report_scoring_k_write, 8, M2D_REPORT_MD);
    char *l[] = {
        m2d_strdup("Table 8 (App. L, the base teacher)"),
        m2d_strdup("Here: teacher tiny-qwen3moe (E = 64, k = 8), experiment hand."),
        m2d_strdup("| Scoring | K | Pre-distill PPL | Post-distill PPL | Wino | ARC-E | Avg |\n"
                   "|---|---:|---:|---:|---:|---:|---:|\n"),
        m2d_strfmt("| %s | 8 | 3,000 | 40.00 | 51.00 | 33.00 | 42.00 |\n", sf),
        m2d_strfmt("| %s | 16 | 2,500 |  |  |  |  |\n", sf),
        m2d_strfmt("| %s | 8 | 900.0 | 30.00 | 52.00 | **45.00** | 48.50 |\n", acp),
        m2d_strfmt("| %s | 16 | 400.0 | **27.00** | **55.00** | 43.00 | **49.00** |\n", acp),
        m2d_strdup("| Random FFN + teacher attn |  | 80,000 | 60.00 | 50.00 | 26.00 | 38.00 |\n"),
        m2d_strdup("| Random initialization |  | 90,000 | 70.00 | 49.00 | 25.00 | 37.00 |\n\n"),
        m2d_strdup("Selected configurations: sf K=8: rr/uniform (000000000006); sf K=16: rr/proportional (000000000008); acp K=8: "
                   "rr/uniform (000000000001); acp K=16: wc/uniform (000000000004); random-ffn K=8: rr/uniform (000000000009); random-init K=8: "
                   "rr/uniform (00000000000a).\n")};
    lines_in_order(md, (const char *const *)l, M2D_ARRAY_LEN(l));
    assert_null(strstr(md, "Teacher")); /* the paper's Table 8 has no teacher row */
    assert_null(strstr(md, "d2d")), assert_null(strstr(md, "freq"));
    for (size_t i = 0; i < M2D_ARRAY_LEN(l); i++) free(l[i]);
    free(md);
    char *tex = render(&r, m2d_report_scoring_k_write, 8, M2D_REPORT_TEX);
    char *t = m2d_strfmt("%s & 16 & 400.0 & \\textbf{27.00} & \\textbf{55.00} & 43.00 & \\textbf{49.00} \\\\\n", acp);
    const char *tl[] = {"\\begin{tabular}{lrrrrrr}\n\\toprule\n", t, "\\bottomrule\n\\end{tabular}\n"};
    lines_in_order(tex, tl, M2D_ARRAY_LEN(tl));
    free(t), free(tex);
    char *csv = render(&r, m2d_report_scoring_k_write, 8, M2D_REPORT_CSV);
    assert_string_equal(csv, "Scoring,K,config_id,grouping,scaling,Pre-distill PPL,Post-distill PPL,Wino,ARC-E,Avg\n"
                             "sf,8,000000000006,rr,uniform,3000.0000,40.0000,51.00,33.00,42.00\n"
                             "sf,16,000000000008,rr,proportional,2500.0000,,,,\n"
                             "acp,8,000000000001,rr,uniform,900.0000,30.0000,52.00,45.00,48.50\n"
                             "acp,16,000000000004,wc,uniform,400.0000,27.0000,55.00,43.00,49.00\n"
                             "random-ffn,,000000000009,rr,uniform,80000.0000,60.0000,50.00,26.00,38.00\n"
                             "random-init,,00000000000a,rr,uniform,90000.0000,70.0000,49.00,25.00,37.00\n");
    free(csv);
    m2d_results_free(&r);
}

static void tables16_17_bold_per_column_and_teacher(void **state) {
    (void)state;
    m2d_results r = parse(HEADER);
    const char *acp = m2d_report_display_name("acp");
    for (int table = 16; table <= 17; table++) {
        char *md = render(&r, m2d_report_scoring_k_write, table, M2D_REPORT_MD);
        char *cap = m2d_strfmt("Table %d (App. O, %s): cross-model validation; bold: best per column", table,
                               table == 16 ? "DeepSeek-V2-Lite" : "GPT-OSS-20B");
        char *k8 = m2d_strfmt("| %s | 8 | 900.0 | 30.00 | 52.00 | **45.00** | 48.50 |\n", acp);
        char *k16 = m2d_strfmt("| %s | 16 | 400.0 | **27.00** | **55.00** | 43.00 | **49.00** |\n", acp);
        const char *l[] = {cap, k8, k16, "| Random FFN + teacher attn |  | 80,000 | 60.00 | 50.00 | 26.00 | 38.00 |\n",
                           "| Teacher (MoE) |  | 9.50 |  | 60.00 | 71.00 | 65.50 |\n"};
        lines_in_order(md, l, M2D_ARRAY_LEN(l));
        free(cap), free(k8), free(k16), free(md);
    }
    /* a teacher without teacher_mc: its accuracies are em dashes (--- in tex), not blanks */
    m2d_results_set_meta(&r, "teacher_mc", "mc_avg:0.5");
    char *tex = render(&r, m2d_report_scoring_k_write, 16, M2D_REPORT_TEX);
    if (!strstr(tex, "Teacher (MoE) &  & 9.50 &  & --- & --- & 50.00 \\\\\n")) fail_msg("tex teacher row:\n%s", tex);
    free(tex);
    m2d_results_free(&r);
    /* nothing at K = k or 2k: an error naming the table */
    const char *none = "# teacher=E=64 k=8\nconfig_id,scoring,grouping,scaling,K_expr,K,ppl,status\n000000000001,sf,rr,uniform,E,64,9,ok\n";
    assert_int_equal(m2d_results_parse("none.csv", none, strlen(none), &r), 0);
    refused(&r, m2d_report_scoring_k_write, 17, "none.csv: --table 17: no student at K = k or K = 2k");
    m2d_results_free(&r);
}

static void figure7_table_and_plot_data(void **state) {
    (void)state;
    m2d_results r = parse(HEADER);
    const char *acp = m2d_report_display_name("acp"), *sf = m2d_report_display_name("sf");
    char *md = render(&r, fig7, 0, M2D_REPORT_MD);
    char *a = m2d_strfmt("| %s | 42.00 |  |\n", sf), *b = m2d_strfmt("| %s | 48.50 | 49.00 |\n", acp);
    const char *l[] = {"| Scoring | K = 8 (pure pruning) | K = 16 (merging) |\n", a, b,
                       "\nRandom FFN + teacher attn (the dashed line): 38.00 %\n"};
    lines_in_order(md, l, M2D_ARRAY_LEN(l));
    free(a), free(b), free(md);
    char *csv = render(&r, fig7, 0, M2D_REPORT_CSV);
    assert_string_equal(csv, "scoring,K,avg\nsf,8,42.0000\nsf,16,\nacp,8,48.5000\nacp,16,49.0000\nrandom-ffn,,38.0000\n");
    free(csv);
    char *dir = tu_tmpdir();
    assert_int_equal(m2d_report_figure7_plot_data(&r, dir), 0);
    char *dat = m2d_path_join(dir, "figure7.dat"), *txt = m2d_path_join(dir, "figure7.txt");
    char *d = m2d_read_file(dat, NULL), *t = m2d_read_file(txt, NULL);
    char *want = m2d_strfmt("# scoring avg_K=k avg_K=2k (MC average after distillation, %%; NaN: absent)\n"
                            "\"%s\" 42 NaN\n\"%s\" 48.5 49\n", sf, acp);
    assert_string_equal(d, want);
    assert_string_equal(t, "8 16 1 38 38 49 1 1\n"); /* the y range: 38 (random FFN) to 49; bars at both K */
    free(d), free(t), free(want);
    /* no selected student with an accuracy after distillation: no files */
    m2d_results_free(&r);
    const char *plain = "# teacher=E=64 k=8\nconfig_id,scoring,grouping,scaling,K_expr,K,ppl,status\n000000000001,sf,rr,uniform,k,8,9,ok\n";
    assert_int_equal(m2d_results_parse("plain.csv", plain, strlen(plain), &r), 0);
    tu_rm_rf(dir);
    assert_int_equal(m2d_mkdir_p(dir), 0);
    assert_int_equal(m2d_report_figure7_plot_data(&r, dir), 0);
    assert_false(m2d_file_exists(dat));
    md = render(&r, fig7, 0, M2D_REPORT_MD); /* nothing distilled: empty cells, no baseline average */
    a = m2d_strfmt("| %s |  |  |\n", sf);
    if (!strstr(md, a) || !strstr(md, "(the dashed line): not measured\n")) fail_msg("figure 7 without accuracies:\n%s", md);
    free(a), free(md);
    m2d_results_free(&r);
    /* the random FFN distilled and scored, no scoring's student: a line without a bar, no files */
    const char *only_random = "# teacher=E=64 k=8\nconfig_id,scoring,grouping,scaling,K_expr,K,ppl,mc_avg,distill_ppl,status\n"
                              "000000000001,acp,rr,uniform,k,8,9,,,ok\n"
                              "000000000002,random-ffn,rr,uniform,k,8,90,0.3,40,ok\n";
    assert_int_equal(m2d_results_parse("random.csv", only_random, strlen(only_random), &r), 0);
    assert_int_equal(m2d_report_figure7_plot_data(&r, dir), 0);
    assert_false(m2d_file_exists(dat));
    m2d_results_free(&r);
    free(dat), free(txt);
    tu_rm_rf(dir);
    free(dir);
}

/* the command line: the new numbers are accepted, others (and Figure 6) refused in one line */
static void cli_tables_and_figures(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "hand.csv"), *csv = m2d_strfmt("%s%s", HEADER, ROWS);
    tu_write(p, csv, strlen(csv));
    struct {
        const char *args, *want_out, *want_err;
    } cases[] = {
        {"--table 8", "| Random initialization |", NULL},
        {"--table 16 --format csv", "teacher,,,,,9.5000,,60.00,71.00,65.50\n", NULL},
        {"--figure 7", "| Scoring | K = 8 (pure pruning) | K = 16 (merging) |", NULL},
        {"--table 9", NULL, "report: --table: '9' is not 3, 4, 5, 6, 8, 16 or 17"},
        {"--figure 6", NULL, "Figure 6: not produced"},
        {"--figure 7 --table 8", NULL, "--figure 7 goes without --table"},
        {"--table 6", "| D2D pruning (L4-H192-F576-A6/2) | dense |", NULL},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *c = m2d_strfmt("%s report %s %s", tu_bin(), p, cases[i].args), *out = NULL, *err = NULL;
        int rc = tu_run(c, &out, &err);
        if (cases[i].want_out && (rc != 0 || !strstr(out, cases[i].want_out)))
            fail_msg("%s: rc %d, out:\n%s\nerr: %s", c, rc, out, err);
        if (cases[i].want_err && (rc == 0 || !strstr(err, cases[i].want_err) || strchr(err, '\n') != strrchr(err, '\n')))
            fail_msg("%s: rc %d, err: %s", c, rc, err);
        free(c), free(out), free(err);
    }
    tu_rm_rf(dir);
    free(dir), free(p), free(csv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(selection_per_scoring_at_k_and_2k),
        cmocka_unit_test(table8_bold_per_scoring),
        cmocka_unit_test(tables16_17_bold_per_column_and_teacher),
        cmocka_unit_test(figure7_table_and_plot_data),
        cmocka_unit_test(cli_tables_and_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
