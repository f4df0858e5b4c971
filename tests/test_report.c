/* report: the Table 10/11 layout and summary against a hand-written CSV (values checked by hand:
 * best K per row, en dash for the failed cell, empty for absent cells, 3.3m / 736k notation,
 * paper order of scorings although the file lists do-cp first, mean ranks 1.33 / 1.67 over the
 * three cells where both scorings ran). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/registry.h"
#include "sweep/report.h"
#include "sweep/report_distill.h"
#include "io/results.h"
#include "base/util.h"

/* Two test-only plugins: names, ranks and display names in reports come from registrations. */
static int zero_score(const m2d_layer_view *v, double *scores) {
    for (int e = 0; e < v->E; e++) scores[e] = 0;
    return 0;
}
M2D_PLUGIN(test_early, .name = "test-early", .kind = M2D_SCORING, .summary = "test", .score = zero_score,
           .display = "Early Test Scoring", .report_rank = 1)
M2D_PLUGIN(test_plain, .name = "test-plain", .kind = M2D_SCORING, .summary = "test", .score = zero_score,
           .display = "Plain Test Scoring")

static const char *HAND_CSV =
    "# moe2dense-results=1\n"
    "# experiment=hand\n"
    "# ppl=gptq L=2048\n"
    "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,status,dedup_of\n"
    "000000000010,do-cp,rr,uniform,k,8,,3837,ok,\n"
    "000000000011,do-cp,rr,uniform,2k,16,,5137,ok,\n"
    "000000000012,do-cp,rr,uniform,E,128,,3300000,ok,\n"
    "000000000013,do-cp,ab,uniform,k,8,,3837,ok,000000000010\n"
    "000000000014,do-cp,ab,uniform,2k,16,,2840.4,ok,\n"
    "000000000015,do-cp,ab,proportional,E,128,,736000,ok,\n"
    "0000000000a0,sf,rr,uniform,k,8,,20633,ok,\n"
    "0000000000b0,sf,rr,uniform,2k,16,,21112,ok,\n"
    "0000000000c0,sf,rr,uniform,E,128,,22799,ok,\n"
    "0000000000d0,sf,rr,proportional,k,8,,21074,ok,\n"
    "0000000000e0,sf,rr,proportional,2k,16,,19440,ok,\n"
    "0000000000f0,sf,rr,proportional,E,128,,,failed: non-finite perplexity,\n";

static const char *EXPECTED_MD =
    "## Perplexity by configuration — experiment hand — gptq L=2048\n"
    "\n"
    "| Scoring | Grouping | Scaling | K=8 | K=16 | K=128 |\n"
    "|---|---|---|---:|---:|---:|\n"
    "| Selection Frequency | Round-Robin | Uniform | **20,633** | 21,112 | 22,799 |\n"
    "|  |  | Proportional | 21,074 | **19,440** | – |\n"
    "| D-Optimal + CP | Round-Robin | Uniform | **3,837** | 5,137 | 3.3m |\n"
    "|  | Anchor-Based | Uniform | 3,837 | **2,840** |  |\n"
    "|  |  | Proportional |  |  | **736k** |\n"
    "\n"
    "Note on the paper's Table 10: at K = k every group holds one expert, so every grouping gives the same student "
    "(equal fingerprints here, one evaluation); Table 10 nevertheless lists different K = k perplexities for SF, PP, "
    "PS and CP under AB and OC than under RR, WC and RC, which the paper's method cannot produce. Table 12's CP "
    "rows are not in Table 10.\n"
    "\n"
    "## Per-criterion summary\n"
    "\n"
    "Ranked by best PPL. Mean rank: average rank among the 2 scorings over the 3 cells (grouping, scaling, K) where all of them ran.\n"
    "\n"
    "| Rank | Scoring | Best PPL | at (grouping, scaling, K) | Mean rank | Configurations | Failed |\n"
    "|---:|---|---:|---|---:|---:|---:|\n"
    "| 1 | D-Optimal + CP | 2,840 | ab, uniform, K=16 | 1.33 | 6 | 0 |\n"
    "| 2 | Selection Frequency | 19,440 | rr, proportional, K=16 | 1.67 | 6 | 1 |\n";

static char *write_hand(char **dir) {
    *dir = tu_tmpdir();
    char *p = m2d_path_join(*dir, "hand.csv");
    tu_write(p, HAND_CSV, strlen(HAND_CSV));
    return p;
}

static char *render(const m2d_results *r, m2d_report_format fmt) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(m2d_report_write(r, fmt, f), 0);
    fclose(f);
    return buf;
}

static void compact_ppl_notation(void **state) {
    (void)state;
    struct { double v; const char *want; } cases[] = {
        {12.5, "12.50"},     {99.994, "99.99"},   {99.996, "100.0"},  {999.94, "999.9"},
        {999.96, "1,000"},   {20633, "20,633"},   {99999.4, "99,999"}, {99999.6, "100k"},
        {120000, "120k"},    {999499, "999k"},    {999600, "1.0m"},    {21.8e6, "21.8m"},
        {2.34e9, "2.3b"},    {NAN, "\xe2\x80\x93"}, {INFINITY, "\xe2\x80\x93"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char buf[32];
        m2d_report_format_ppl(cases[i].v, buf, sizeof buf);
        if (strcmp(buf, cases[i].want)) fail_msg("%g -> '%s', want '%s'", cases[i].v, buf, cases[i].want);
    }
    assert_string_equal(m2d_report_display_name("do-acp"), "D-Optimal + ACP");
    assert_string_equal(m2d_report_display_name("my-plugin"), "my-plugin");
}

static void markdown_table_and_summary(void **state) {
    (void)state;
    char *dir, *p = write_hand(&dir);
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render(&r, M2D_REPORT_MD);
    assert_string_equal(md, EXPECTED_MD);
    free(md);
    char *tex = render(&r, M2D_REPORT_TEX);
    assert_non_null(strstr(tex, "Selection Frequency & Round-Robin & Uniform & \\textbf{20,633} & 21,112 & 22,799 \\\\\n"));
    assert_non_null(strstr(tex, " &  & Proportional & 21,074 & \\textbf{19,440} & -- \\\\\n"));
    assert_non_null(strstr(tex, "\\end{tabular}"));
    assert_non_null(strstr(tex, "% Note on the paper's Table 10"));
    free(tex);
    char *csv = render(&r, M2D_REPORT_CSV);
    assert_non_null(strstr(csv, "scoring,grouping,scaling,K=8,K=16,K=128,best_K\n"));
    assert_non_null(strstr(csv, "sf,rr,proportional,21074.0000,19440.0000,failed,16\n"));
    assert_non_null(strstr(csv, "do-cp,ab,proportional,,,736000.0000,128\n"));
    free(csv);
    int *rows, n = m2d_report_best_per_pair(&r, &rows);
    assert_int_equal(n, 3);
    assert_string_equal(r.rows[rows[0]][0], "0000000000e0"); /* sf x rr: proportional, K = 16 */
    assert_string_equal(r.rows[rows[1]][0], "000000000010"); /* do-cp x rr: uniform, K = 8 */
    assert_string_equal(r.rows[rows[2]][0], "000000000014"); /* do-cp x ab: uniform, K = 16 */
    free(rows);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir);
    free(p);
}

/* The run header's teacher (E, k) and teacher_ppl (issue 30): md and tex get a teacher row with
 * its PPL in every K column, the K = E column is labelled and the legend says both; the csv
 * format stays the students' table. The same file without those keys renders as before. */
static void teacher_row_and_K_is_E(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "teacher.csv");
    char *text = m2d_strfmt("# experiment=hand\n# teacher=E=128 k=8\n# teacher_ppl=812.345678 windows=8\n%s",
                            strstr(HAND_CSV, "# ppl="));
    tu_write(p, text, strlen(text));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render(&r, M2D_REPORT_MD);
    const char *want =
        "Teacher: the unconverted MoE, scored on the same 8 window(s) as every student.\n"
        "K = 128 is E, the teacher's expert count (every expert selected; k = 8).\n"
        "\n"
        "| Scoring | Grouping | Scaling | K=8 | K=16 | K=128 (= E) |\n"
        "|---|---|---|---:|---:|---:|\n"
        "| Teacher (MoE, E = 128, top-8) |  |  | 812.3 | 812.3 | 812.3 |\n"
        "| Selection Frequency | Round-Robin | Uniform | **20,633** | 21,112 | 22,799 |\n";
    if (!strstr(md, want)) fail_msg("want:\n%s\nin:\n%s", want, md);
    /* the rest of the table is the students' as before */
    assert_non_null(strstr(md, strstr(EXPECTED_MD, "| D-Optimal + CP | Round-Robin")));
    free(md);
    char *tex = render(&r, M2D_REPORT_TEX);
    assert_non_null(strstr(tex, " & $K{=}128$ (= E) \\\\\n\\midrule\n"
                                "Teacher (MoE, E = 128, top-8) &  &  & 812.3 & 812.3 & 812.3 \\\\\n\\midrule\n"));
    free(tex);
    char *csv = render(&r, M2D_REPORT_CSV);
    assert_null(strstr(csv, "Teacher"));
    assert_non_null(strstr(csv, "scoring,grouping,scaling,K=8,K=16,K=128,best_K\n"));
    free(csv);
    m2d_results_free(&r);
    free(text);
    tu_rm_rf(dir);
    free(dir);
    free(p);
}

static void plot_data_files(void **state) {
    (void)state;
    char *dir, *p = write_hand(&dir);
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *pd = m2d_path_join(dir, "plotdata");
    assert_int_equal(m2d_report_plot_data(&r, pd), 0);
    char *heat = m2d_path_join(pd, "heat_do-cp.dat");
    char *s = m2d_read_file(heat, NULL);
    /* exact on every CPU (here and below): hand-written results (decimal text) parsed and printed
     * again, both correctly rounded (strtod, printf), no arithmetic on them */
    assert_string_equal(s, "rows K=8 K=16 K=128\nrr/uniform 3837 5137 3.3e+06\nab/uniform 3837 2840.4 NaN\n"
                           "ab/proportional NaN NaN 736000\n");
    free(s);
    char *marg = m2d_path_join(pd, "marginal_scaling.dat");
    s = m2d_read_file(marg, NULL);
    /* proportional: 21074, 19440, 736000 -> geometric mean 67056.4, median 21074, best 19440 */
    assert_non_null(strstr(s, "\"proportional\" 67056.4 21074 19440 3\n"));
    free(s);
    free(heat);
    free(marg);
    free(pd);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir);
    free(p);
}

/* Scorings in the table: ranked ones by rank (ties: first appearance), then the others by first
 * appearance; each under the display name its plugin registered (or its own name). */
static void names_and_order_come_from_registrations(void **state) {
    (void)state;
    const char *csv = "# experiment=order\n"
                      "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,status,dedup_of\n"
                      "a,test-plain,rr,uniform,k,8,,10,ok,\n"
                      "b,zz-unregistered,rr,uniform,k,8,,11,ok,\n"
                      "c,do-cp,rr,uniform,k,8,,12,ok,\n"
                      "d,sf,rr,uniform,k,8,,13,ok,\n"
                      "e,test-early,rr,uniform,k,8,,14,ok,\n";
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "order.csv");
    tu_write(p, csv, strlen(csv));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render(&r, M2D_REPORT_MD);
    const char *want[] = {"| Selection Frequency |", "| Early Test Scoring |", "| D-Optimal + CP |",
                          "| Plain Test Scoring |", "| zz-unregistered |"};
    const char *at = md;
    for (size_t i = 0; i < M2D_ARRAY_LEN(want); i++) {
        const char *hit = strstr(at, want[i]);
        if (!hit) fail_msg("'%s' missing or out of order in:\n%s", want[i], md);
        at = hit + 1;
    }
    assert_string_equal(m2d_report_display_name("test-plain"), "Plain Test Scoring");
    assert_string_equal(m2d_report_display_name("do-reap"), "do-reap"); /* made on demand: no display name */
    free(md);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir);
    free(p);
}

/* MoE students (target moe; paper 003's comparison): their own section, not the dense table.
 * By hand: columns sorted by ratio, then top-k descending: (25 %, 8), (25 %, 4), (50 %, 8); bold
 * is the lowest PPL of each column (11 < 12.5; 20 alone; 18 < 150000, the failed conmoe cell an
 * en dash) and the highest MC (55 > 50; 25 alone); the one dense row alone in the dense table. */
static const char *MOE_CSV =
    "# moe2dense-results=1\n"
    "# experiment=prune\n"
    "config_id,scoring,grouping,scaling,K_expr,K,params,target,ratio,top_k,ppl,mc_avg,status,dedup_of\n"
    "000000000001,reap,none,uniform,k,8,,dense,,,30,,ok,\n"
    "000000000002,reap,none,none,(1-0.25)E,48,,moe,0.25,8,12.5,0.5,ok,\n"
    "000000000003,reap,none,none,(1-0.25)E,48,,moe,0.25,4,20,,ok,\n"
    "000000000004,reap,none,none,(1-0.5)E,32,,moe,0.5,8,18,,ok,\n"
    "000000000005,conmoe,remap,none,(1-0.25)E,48,scope=4,moe,0.25,8,11,0.55,ok,\n"
    "000000000006,conmoe,remap,none,(1-0.5)E,32,scope=4,moe,0.5,8,,,failed: non-finite perplexity,\n"
    "000000000007,freq,hc-smoe,none,(1-0.5)E,32,,moe,0.5,8,150000,0.25,ok,\n";

static const char *EXPECTED_MOE_MD =
    "\n## MoE students (target moe) — experiment prune\n"
    "\n"
    "6 configuration(s), 3 method(s). Columns: the fraction of each layer's routed experts removed (K = experts "
    "kept) and the student's experts per token (top-k). Bold: the best method of each column; –: failed.\n"
    "\n"
    "WikiText-2 perplexity:\n"
    "\n"
    "| Scoring | Grouping | Params | 25 % removed (K=48), top-8 | 25 % removed (K=48), top-4 | 50 % removed (K=32), top-8 |\n"
    "|---|---|---|---:|---:|---:|\n"
    "| REAP | None | - | 12.50 | **20.00** | **18.00** |\n"
    "| ConMoE | ConMoE remap | scope=4 | **11.00** |  | – |\n"
    "| freq | HC-SMoE | - |  |  | 150k |\n"
    "\n"
    "Multiple-choice average (%):\n"
    "\n"
    "| Scoring | Grouping | Params | 25 % removed (K=48), top-8 | 25 % removed (K=48), top-4 | 50 % removed (K=32), top-8 |\n"
    "|---|---|---|---:|---:|---:|\n"
    "| REAP | None | - | 50.0 |  |  |\n"
    "| ConMoE | ConMoE remap | scope=4 | **55.0** |  | – |\n"
    "| freq | HC-SMoE | - |  |  | **25.0** |\n";

/* a parameter list holds commas: one quoted CSV cell, so the K columns stay under their header */
static void csv_table_quotes_params(void **state) {
    (void)state;
    static const char *CSV = "# moe2dense-results=1\n# experiment=p\n"
                             "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,status,dedup_of\n"
                             "000000000001,bac,rr,uniform,k,8,\"b=1,a=1,c=2\",100,ok,\n"
                             "000000000002,bac,rr,uniform,2k,16,\"b=1,a=1,c=2\",90,ok,\n";
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "p.csv");
    tu_write(p, CSV, strlen(CSV));
    m2d_results r;
    assert_int_equal(m2d_results_read_checked(p, &r), 0);
    char *csv = render(&r, M2D_REPORT_CSV);
    assert_non_null(strstr(csv, "scoring,grouping,scaling,params,K=8,K=16,best_K\n"));
    assert_non_null(strstr(csv, "bac,rr,uniform,\"b=1,a=1,c=2\",100.0000,90.0000,16\n"));
    free(csv);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir), free(p);
}

static void moe_students_section(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "m.csv");
    tu_write(p, MOE_CSV, strlen(MOE_CSV));
    m2d_results r;
    assert_int_equal(m2d_results_read_checked(p, &r), 0); /* K_expr (1-R)E, target, ratio, top_k validate */
    char *md = render(&r, M2D_REPORT_MD);
    const char *sec = strstr(md, "\n## MoE students");
    assert_non_null(sec);
    assert_string_equal(sec, EXPECTED_MOE_MD);
    /* the dense table holds the dense row only */
    assert_non_null(strstr(md, "| Scoring | Grouping | Scaling | K=8 |\n|---|---|---|---:|\n| REAP | None | Uniform | **30.00** |\n\n"));
    assert_null(strstr(md, "K=48 |"));
    free(md);
    char *tex = render(&r, M2D_REPORT_TEX);
    assert_non_null(strstr(tex, "\\begin{tabular}{lllrrr}\n\\toprule\nScoring & Grouping & Params & 25 \\% removed (K=48), "
                                "top-8 & 25 \\% removed (K=48), top-4 & 50 \\% removed (K=32), top-8 \\\\\n\\midrule\n"));
    assert_non_null(strstr(tex, "ConMoE & ConMoE remap & scope=4 & \\textbf{11.00} &  & -- \\\\\n"));
    assert_non_null(strstr(tex, "freq & HC-SMoE & - &  &  & \\textbf{25.0} \\\\\n"));
    free(tex);
    char *csv = render(&r, M2D_REPORT_CSV); /* the dense table only */
    /* parsed and printed, no arithmetic: exact on every CPU */
    assert_string_equal(csv, "scoring,grouping,scaling,K=8,best_K\nreap,none,uniform,30.0000,8\n");
    free(csv);
    /* best per pair (MC, distillation, Table 12): a pair's dense student before its smaller MoEs
     * (REAP x none: the dense 30, not the MoE 12.5); a pair with MoE students only keeps its best */
    int *best, nb = m2d_report_best_per_pair(&r, &best);
    assert_int_equal(nb, 3);
    const char *want[] = {"000000000001", "000000000005", "000000000007"};
    for (int i = 0; i < nb; i++) assert_string_equal(r.rows[best[i]][0], want[i]);
    free(best);
    /* heat maps: the dense students only */
    char *pd = m2d_path_join(dir, "pd"), *heat = m2d_path_join(pd, "heat_reap.dat");
    assert_int_equal(m2d_report_plot_data(&r, pd), 0);
    char *s = m2d_read_file(heat, NULL);
    assert_string_equal(s, "rows K=8\nnone/uniform 30\n");
    free(s), free(heat), free(pd);
    m2d_results_free(&r);
    /* an MoE-only file: no dense table, no summary */
    char *only = m2d_strdup(MOE_CSV), *dense = strstr(only, "000000000001");
    memmove(dense, strchr(dense, '\n') + 1, strlen(strchr(dense, '\n') + 1) + 1);
    tu_write(p, only, strlen(only));
    assert_int_equal(m2d_results_read_checked(p, &r), 0);
    md = render(&r, M2D_REPORT_MD);
    assert_string_equal(md, EXPECTED_MOE_MD);
    free(md), free(only);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir), free(p);
}

/* The condenser analyses' plot data (paper 001 App. L and I) from a hand-written analyze file:
 * x = i/E of each Lorenz point (E = 4: the largest i of the layer), one block per layer, the mean
 * Gini (0.2 + 0) / 2 = 0.1 over layers 2 and 5; per layer mean / max Pearson; the matrix of the
 * first layer with one (5). */
static void condenser_plot_data(void **state) {
    (void)state;
    const char *csv = "layer,metric,criterion,other,value\n"
                      "2,gini,,,0.2\n2,pearson_mean,,,0.01\n2,pearson_max,,,0.3\n"
                      "2,lorenz,0,,0\n2,lorenz,1,,0.1\n2,lorenz,2,,0.3\n2,lorenz,3,,0.55\n2,lorenz,4,,1\n"
                      "5,gini,,,0\n5,pearson_mean,,,-0.02\n5,pearson_max,,,0.5\n"
                      "5,lorenz,0,,0\n5,lorenz,1,,0.25\n5,lorenz,2,,0.5\n5,lorenz,3,,0.75\n5,lorenz,4,,1\n"
                      "5,pearson,0,0,1\n5,pearson,0,1,0.5\n5,pearson,1,0,0.5\n5,pearson,1,1,1\n";
    m2d_an_csv a;
    if (m2d_an_csv_parse("a.csv", csv, strlen(csv), &a)) fail_msg("%s", m2d_errmsg());
    char *dir = tu_tmpdir();
    assert_int_equal(m2d_report_analyze_plot_data(&a, dir), 0);
    struct { const char *file, *want; } files[] = {
        {"lorenz.txt", "2 0.1 2 5\n"},
        {"lorenz.dat", "# x = i/E (fraction of experts, least used first), y = share of activations, layer\n"
                       "0 0 2\n0.25 0.1 2\n0.5 0.3 2\n0.75 0.55 2\n1 1 2\n\n\n"
                       "0 0 5\n0.25 0.25 5\n0.5 0.5 5\n0.75 0.75 5\n1 1 5\n"},
        {"pearson.dat", "# layer mean max (off-diagonal Pearson correlation of the experts' down projections)\n"
                        "2 0.01 0.3\n5 -0.02 0.5\n"},
        {"pearson.txt", "2 1 5\n"},
        {"pearson_matrix.dat", "1 0.5\n0.5 1\n"},
        {"overlap.dat", "x\n"}};
    for (size_t i = 0; i < M2D_ARRAY_LEN(files); i++) {
        char *f = m2d_path_join(dir, files[i].file), *got = m2d_read_file(f, NULL);
        if (!got) fail_msg("%s not written", files[i].file);
        if (strcmp(got, files[i].want)) fail_msg("%s:\n%s\nwant:\n%s", files[i].file, got, files[i].want);
        free(f), free(got);
    }
    m2d_an_csv_free(&a);
    /* without the condenser rows: zero blocks, no matrix (plots.sh then draws neither) */
    const char *bare = "layer,metric,criterion,other,value\nmean,erank,sf,,2\n";
    assert_int_equal(m2d_an_csv_parse("b.csv", bare, strlen(bare), &a), 0);
    assert_int_equal(m2d_report_analyze_plot_data(&a, dir), 0);
    char *f = m2d_path_join(dir, "lorenz.txt"), *got = m2d_read_file(f, NULL);
    assert_string_equal(got, "0 0 0 0\n");
    free(f), free(got);
    f = m2d_path_join(dir, "pearson.txt"), got = m2d_read_file(f, NULL);
    assert_string_equal(got, "0 0 0\n");
    free(f), free(got);
    m2d_an_csv_free(&a);
    tu_rm_rf(dir);
    free(dir);
}

static void cli_formats_and_errors(void **state) {
    (void)state;
    char *dir, *p = write_hand(&dir);
    char *out = NULL, *err = NULL;
    char *c = m2d_strfmt("%s report %s", tu_bin(), p);
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_string_equal(out, EXPECTED_MD);
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s report %s --format pdf", tu_bin(), p);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "--format"));
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s report %s/missing.csv", tu_bin(), dir);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "missing.csv"));
    free(c);
    free(out);
    free(err);
    char *before = m2d_read_file(p, NULL); /* issue 27: --out is never the input */
    c = m2d_strfmt("%s report %s --out %s", tu_bin(), p, p);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "is an input of this report"));
    char *after = m2d_read_file(p, NULL);
    assert_string_equal(before, after);
    free(before), free(after), free(c), free(out), free(err);
    tu_rm_rf(dir);
    free(dir);
    free(p);
}

/* A sweep with a distillation stage: a and b are one student (a dedup), c another of the same
 * pair with a worse distilled PPL, d a different scoring, e not distilled. */
static const char *DISTILL_CSV =
    "# moe2dense-results=1\n"
    "# experiment=dist\n"
    "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,mc_avg,distill_ppl,distill_final_loss,distill_tokens,"
    "status,dedup_of,fingerprint\n"
    "0a,sf,rr,uniform,k,8,,120.5,0.41,40.25,0.8125,4096,ok,,f1\n"
    "0b,sf,oc,uniform,k,8,,120.5,0.41,40.25,0.8125,4096,ok,0a,f1\n"
    "0c,sf,rr,proportional,2k,16,,99,0.37,45.5,0.9,4096,ok,,f2\n"
    "0d,do-acp,rr,uniform,2k,16,,60,0.52,30,0.5,4096,ok,,f3\n"
    "0e,do-acp,oc,uniform,2k,16,,70,,,,,ok,,f4\n";

static const char *EXPECTED_DISTILL_MD =
    "\n## After distillation — experiment dist\n"
    "\n"
    "3 distilled student(s).\n"
    "\n"
    "Table 12: per scoring x grouping the student the paper selects (the (K, scaling) with the lowest "
    "pre-distillation PPL), after distillation. Pre/Post: WikiText-2 PPL before/after; accuracy in %, each task's "
    "paper metric; empty: that student was not distilled.\n"
    "\n"
    "| Scoring | Grouping | Scaling | K | Pre | Post | Avg |\n"
    "|---|---|---|---:|---:|---:|---:|\n"
    "| Selection Frequency | Round-Robin | Proportional | 16 | 99.00 | 45.50 | 37.00 |\n"
    "| Selection Frequency | Output Cluster | Uniform | 8 | 120.5 | 40.25 | 41.00 |\n"
    "| D-Optimal + ACP | Round-Robin | Uniform | 16 | 60.00 | 30.00 | 52.00 |\n"
    "| D-Optimal + ACP | Output Cluster | Uniform | 16 | 70.00 | \xe2\x80\x93 |  |\n"
    "\n"
    "Every distilled student:\n"
    "\n"
    "| Scoring | Grouping | Scaling | K | PPL converted | PPL distilled | Tokens | Final loss | MC avg |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|\n"
    "| Selection Frequency | Round-Robin | Uniform | 8 | 120.5 | 40.25 | 4096 | 0.8125 | 41.0 |\n"
    "| Selection Frequency | Round-Robin | Proportional | 16 | 99.00 | 45.50 | 4096 | 0.9000 | 37.0 |\n"
    "| D-Optimal + ACP | Round-Robin | Uniform | 16 | 60.00 | 30.00 | 4096 | 0.5000 | 52.0 |\n";

/* The "After distillation" section: one line per distilled student (the dedup b is a, e was not
 * distilled); Table 12's (sf, rr) is c, the pair's best pre-distillation PPL (99 < 120.5), though a
 * distilled better (40.25 < 45.5); (sf, oc) is b = a's student; (do-acp, oc) is e, not distilled;
 * the plot data: distill.dat, the
 * curves of the one run whose log exists, and a hostile config id refused. */
static void distillation_section_and_plot_data(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "d.csv");
    tu_write(p, DISTILL_CSV, strlen(DISTILL_CSV));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render(&r, M2D_REPORT_MD);
    const char *sec = strstr(md, "\n## After distillation");
    assert_non_null(sec);
    assert_string_equal(sec, EXPECTED_DISTILL_MD);
    free(md);
    char *tex = render(&r, M2D_REPORT_TEX);
    assert_non_null(strstr(tex, "Selection Frequency & Round-Robin & Uniform & 8 & 120.5 & 40.25 & 4096 & 0.8125 & 41.0 \\\\\n"));
    free(tex);
    /* curves: a's log with two steps and one validation; c has no log */
    char *logdir = m2d_strfmt("%s.distill", p), *log = m2d_strfmt("%s/0a.jsonl", logdir);
    assert_int_equal(m2d_mkdir_p(logdir), 0);
    const char *jl = "{\"step\": 0, \"tokens\": 0, \"eval\": \"wikitext2-gptq\", \"ppl\": 120, \"val_ce\": 4.8}\n"
                     "{\"step\": 1, \"tokens\": 2048, \"loss\": 1.5, \"grad_norm\": 3}\n"
                     "{\"step\": 2, \"tokens\": 4096, \"loss\": 1.25, \"grad_norm\": 2}\n";
    tu_write(log, jl, strlen(jl));
    char *pd = m2d_path_join(dir, "pd");
    assert_int_equal(m2d_mkdir_p(pd), 0);
    assert_int_equal(m2d_report_distill_plot_data(p, &r, pd), 0);
    struct { const char *file, *want; } files[] = {
        {"distill.dat", "# configuration ppl_converted ppl_distilled\n\"sf/rr/uniform/K=8\" 120.5 40.25\n"
                        "\"sf/rr/proportional/K=16\" 99 45.5\n\"do-acp/rr/uniform/K=16\" 60 30\n"},
        {"distill_loss.dat", "\"sf/rr/uniform/K=8\"\n2048 1.5\n4096 1.25\n"},
        {"distill_val.dat", "\"sf/rr/uniform/K=8\"\n0 4.8 120\n"},
        {"distill_curves.txt", "1 1\n"}};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *f = m2d_path_join(pd, files[i].file), *got = m2d_read_file(f, NULL);
        assert_non_null(got);
        assert_string_equal(got, files[i].want);
        free(f), free(got);
    }
    /* a malformed log line names the file and the line */
    tu_write(log, "{\"step\": 1}\n", 12);
    assert_int_equal(m2d_report_distill_plot_data(p, &r, pd), -1);
    assert_non_null(strstr(m2d_errmsg(), "0a.jsonl: line 1: field 'tokens': not a number"));
    m2d_results_free(&r);
    /* config ids name files: one that is not hex is refused */
    const char *bad = "config_id,scoring,grouping,scaling,K,ppl,distill_ppl,status,fingerprint\n"
                      "../x,sf,rr,uniform,8,10,5,ok,f\n";
    tu_write(p, bad, strlen(bad));
    assert_int_equal(m2d_results_read(p, &r), 0);
    assert_int_equal(m2d_report_distill_plot_data(p, &r, pd), -1);
    assert_non_null(strstr(m2d_errmsg(), "field 'config_id': '../x' is not a config id"));
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir), free(p), free(logdir), free(log), free(pd);
}

/* Table 12 on a paper-like CSV (the paper's D-Optimal + ACP rows): the K = k student (a, b: one
 * student, fingerprint f1) is the same in every grouping. Best-per-pair by pre-distillation PPL
 * picks a (K = 8) for Round-Robin and c (K = 16, 4,333 < 5,134) for Weight Cluster; d has the
 * lowest post-distillation PPL of Round-Robin (18.00) but a worse pre-distillation PPL, so it is
 * never shown; e (Router Cluster) was selected but not distilled: its cells stay empty. Cells
 * take each task's paper metric (acc_norm for HellaSwag and ARC, acc otherwise). */
static const char *PAPER12_CSV =
    "# moe2dense-results=1\n"
    "# teacher_ppl=9.5 windows=8\n"
    "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,winogrande_acc,winogrande_acc_norm,hellaswag_acc,"
    "hellaswag_acc_norm,arc_easy_acc,arc_easy_acc_norm,arc_challenge_acc,arc_challenge_acc_norm,mmlu_acc,"
    "mmlu_acc_norm,mc_avg,distill_ppl,distill_final_loss,distill_tokens,status,dedup_of,fingerprint\n"
    "0a,do-acp,rr,uniform,k,8,,5134,0.5699,,0.35,0.4113,0.50,0.5737,0.25,0.2986,0.3170,,0.4341,19.2,0.5,4096,ok,,f1\n"
    "0b,do-acp,wc,uniform,k,8,,5134,0.5699,,0.35,0.4113,0.50,0.5737,0.25,0.2986,0.3170,,0.4341,19.2,0.5,4096,ok,0a,f1\n"
    "0c,do-acp,wc,proportional,2k,16,,4333,0.5422,,0.33,0.3959,0.49,0.5467,0.24,0.2824,0.2891,,0.4113,20.6,0.6,4096,"
    "ok,,f2\n"
    "0d,do-acp,rr,proportional,2k,16,,6000,0.60,,0.40,0.45,0.60,0.60,0.30,0.33,0.33,,0.4620,18.0,0.4,4096,ok,,f3\n"
    "0e,do-acp,rc,uniform,2k,16,,3000,,,,,,,,,,,,,,,ok,,f4\n";

static void table12_shows_the_best_per_pair_students(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "t12.csv");
    tu_write(p, PAPER12_CSV, strlen(PAPER12_CSV));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render(&r, M2D_REPORT_MD);
    const char *t12 = strstr(md, "| Scoring | Grouping | Scaling | K | Pre | Post | Wino | Hella | ARC-E | ARC-C | MMLU | Avg |");
    assert_non_null(t12);
    /* the header has no teacher_mc: the teacher's accuracies are em dashes, not blanks */
    assert_non_null(strstr(t12, "| Teacher (MoE) |  |  |  | 9.50 |  | \xe2\x80\x94 | \xe2\x80\x94 | \xe2\x80\x94 | "
                                "\xe2\x80\x94 | \xe2\x80\x94 | \xe2\x80\x94 |\n"));
    assert_non_null(strstr(t12, "| D-Optimal + ACP | Round-Robin | Uniform | 8 | 5,134 | 19.20 | 56.99 | 41.13 | 57.37 | "
                                "29.86 | 31.70 | 43.41 |\n"));
    assert_non_null(strstr(t12, "| D-Optimal + ACP | Weight Cluster | Proportional | 16 | 4,333 | 20.60 | 54.22 | 39.59 | "
                                "54.67 | 28.24 | 28.91 | 41.13 |\n"));
    assert_non_null(strstr(t12, "| D-Optimal + ACP | Router Cluster | Uniform | 16 | 3,000 | \xe2\x80\x93 |  |  |  |  |  |  |\n"));
    /* never the post-distillation minimum, never K = k copied into Weight Cluster */
    const char *end = strstr(t12, "\n\n");
    assert_non_null(end);
    char *table = m2d_strfmt("%.*s", (int)(end - t12), t12);
    assert_null(strstr(table, "18.00"));
    assert_null(strstr(table, "46.20"));
    assert_null(strstr(table, "| Weight Cluster | Uniform | 8 |"));
    free(table);
    free(md);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir), free(p);
}

/* Figure 4 (paper: marginal post-distillation accuracy per design axis) on a hand-written CSV.
 * Table 12's students (best pre-distillation PPL per scoring x grouping): do-acp rr 01, wc 04
 * (4,333 < 5,134: not 03, the K = k twin of 01 that carries 01's copied results), rc 05 (= 01's
 * student: dedup_of and equal fingerprint), ab 06, oc 07 (not distilled: left out); sf rr 11, wc
 * 12, ab 13 (its MC cells are the converted student's: left out), rc 14. 02 has the best accuracy
 * of all (46.20) but is not selected. By hand, in percent:
 *   scoring  sf: 37.57, 37.61, 37.23 -> 37.47; do-acp: 43.41 (01 = 05, once), 41.13, 42.12 -> 42.22
 *            (with 05 counted again it would be 42.5175, 4 students); spread 4.75
 *   grouping rr: 43.41, 37.57 -> 40.49; wc: 41.13, 37.61 -> 39.37; rc: 43.41, 37.23 -> 40.32;
 *            ab: 42.12; spread 42.12 - 39.37 = 2.75
 *   scaling  uniform: 43.41, 37.61, 37.23 -> 39.41667; proportional: 41.13, 42.12, 37.57 -> 40.27333;
 *            spread 0.85667
 *   K        8: 43.41, 37.23 -> 40.32; 16: 41.13, 42.12, 37.57, 37.61 -> 39.6075; spread 0.7125 */
#define FP_A1 "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
#define FP_A2 "a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2"
#define FP_A3 "a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3"
#define FP_A4 "a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4a4"
#define FP_A5 "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5"
#define FP_B1 "b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1"
#define FP_B2 "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"
#define FP_B3 "b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3"
#define FP_B4 "b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4"
#define FP_C1 "c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1"
#define FP_C2 "c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2"
static const char *FIG4_CSV =
    "# moe2dense-results=1\n"
    "# experiment=fig4\n"
    "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,mc_avg,distill_ppl,distill_final_loss,distill_tokens,"
    "mc_student,status,dedup_of,fingerprint\n"
    "000000000001,do-acp,rr,uniform,k,8,,5134,0.4341,19.2,0.5,4096,distilled,ok,," FP_A1 "\n"
    "000000000002,do-acp,rr,proportional,2k,16,,6000,0.4620,18,0.5,4096,distilled,ok,," FP_A2 "\n"
    "000000000003,do-acp,wc,uniform,k,8,,5134,0.4341,19.2,0.5,4096,distilled,ok,000000000001," FP_A1 "\n"
    "000000000004,do-acp,wc,proportional,2k,16,,4333,0.4113,20.6,0.5,4096,distilled,ok,," FP_A3 "\n"
    "000000000005,do-acp,rc,uniform,k,8,,5134,0.4341,19.2,0.5,4096,distilled,ok,000000000001," FP_A1 "\n"
    "000000000006,do-acp,ab,proportional,2k,16,,3939,0.4212,19.8,0.5,4096,distilled,ok,," FP_A4 "\n"
    "000000000007,do-acp,oc,uniform,2k,16,,3000,,,,,,ok,," FP_A5 "\n"
    "000000000011,sf,rr,proportional,2k,16,,19440,0.3757,29.3,0.5,4096,distilled,ok,," FP_B1 "\n"
    "000000000012,sf,wc,uniform,2k,16,,12896,0.3761,27.9,0.5,4096,distilled,ok,," FP_B2 "\n"
    "000000000013,sf,ab,proportional,k,8,,11668,0.3631,29.2,0.5,4096,converted,ok,," FP_B3 "\n"
    "000000000014,sf,rc,uniform,k,8,,11342,0.3723,28.5,0.5,4096,distilled,ok,," FP_B4 "\n"
    /* a baseline and a dense-to-dense candidate, distilled with a high accuracy: they vary no design
     * axis of the conversion, so neither counts (counted, they would add an OC and a "none" row) */
    "000000000021,random-ffn,oc,proportional,k,8,,30000,0.9900,40.1,0.5,4096,distilled,ok,," FP_C1 "\n"
    "000000000022,d2d,none,none,k,8,shape=L3-H208,900,0.9800,35.5,0.5,4096,distilled,ok,," FP_C2 "\n";

static const char *EXPECTED_FIG4_MD =
    "\n(a) Scoring: spread 4.75 pp (highest mean D-Optimal + ACP 42.22 %, lowest Selection Frequency 37.47 %)\n"
    "\n"
    "| Scoring | Mean (%) | Min (%) | Max (%) | Students |\n"
    "|---|---:|---:|---:|---:|\n"
    "| Selection Frequency | 37.47 | 37.23 | 37.61 | 3 |\n"
    "| D-Optimal + ACP | 42.22 | 41.13 | 43.41 | 3 |\n"
    "\n"
    "(b) Grouping: spread 2.75 pp (highest mean Anchor-Based 42.12 %, lowest Weight Cluster 39.37 %)\n"
    "\n"
    "| Grouping | Mean (%) | Min (%) | Max (%) | Students |\n"
    "|---|---:|---:|---:|---:|\n"
    "| Round-Robin | 40.49 | 37.57 | 43.41 | 2 |\n"
    "| Weight Cluster | 39.37 | 37.61 | 41.13 | 2 |\n"
    "| Router Cluster | 40.32 | 37.23 | 43.41 | 2 |\n"
    "| Anchor-Based | 42.12 | 42.12 | 42.12 | 1 |\n"
    "\n"
    "(c) Scaling: spread 0.86 pp (highest mean Proportional 40.27 %, lowest Uniform 39.42 %)\n"
    "\n"
    "| Scaling | Mean (%) | Min (%) | Max (%) | Students |\n"
    "|---|---:|---:|---:|---:|\n"
    "| Uniform | 39.42 | 37.23 | 43.41 | 3 |\n"
    "| Proportional | 40.27 | 37.57 | 42.12 | 3 |\n"
    "\n"
    "(d) K: spread 0.71 pp (highest mean K = 8 40.32 %, lowest K = 16 39.61 %)\n"
    "\n"
    "| K | Mean (%) | Min (%) | Max (%) | Students |\n"
    "|---|---:|---:|---:|---:|\n"
    "| 8 | 40.32 | 37.23 | 43.41 | 2 |\n"
    "| 16 | 39.61 | 37.57 | 42.12 | 4 |\n";

static const char *EXPECTED_FIG4_CSV =
    "axis,value,mean,min,max,students,spread_pp\n"
    "scoring,sf,37.47,37.23,37.61,3,4.75\n"
    "scoring,do-acp,42.22,41.13,43.41,3,4.75\n"
    "grouping,rr,40.49,37.57,43.41,2,2.75\n"
    "grouping,wc,39.37,37.61,41.13,2,2.75\n"
    "grouping,rc,40.32,37.23,43.41,2,2.75\n"
    "grouping,ab,42.12,42.12,42.12,1,2.75\n"
    "scaling,uniform,39.42,37.23,43.41,3,0.86\n"
    "scaling,proportional,40.27,37.57,42.12,3,0.86\n"
    "K,8,40.32,37.23,43.41,2,0.71\n"
    "K,16,39.61,37.57,42.12,4,0.71\n";

static char *render_figure4(const m2d_results *r, m2d_report_format fmt) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(m2d_report_write_figure4(r, fmt, f), 0);
    fclose(f);
    return buf;
}

static void figure4_marginals_of_the_distilled_students(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "fig4.csv");
    tu_write(p, FIG4_CSV, strlen(FIG4_CSV));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render_figure4(&r, M2D_REPORT_MD);
    assert_non_null(strstr(md, "## Figure 4: accuracy after distillation by design axis — experiment fig4\n"));
    const char *a = strstr(md, "\n(a) Scoring");
    assert_non_null(a);
    assert_string_equal(a, EXPECTED_FIG4_MD);
    free(md);
    char *csv = render_figure4(&r, M2D_REPORT_CSV);
    assert_string_equal(csv, EXPECTED_FIG4_CSV);
    free(csv);
    char *tex = render_figure4(&r, M2D_REPORT_TEX);
    assert_non_null(strstr(tex, "% (a) Scoring: spread 4.75 pp"));
    assert_non_null(strstr(tex, "\\begin{tabular}{lrrrr}\n\\toprule\nScoring & Mean (\\%) & Min (\\%) & Max (\\%) & "
                                "Students \\\\\n\\midrule\n"));
    assert_non_null(strstr(tex, "D-Optimal + ACP & 42.22 & 41.13 & 43.41 & 3 \\\\\n"));
    free(tex);
    /* plot data: the same numbers (%.6g), names raw, K as K=N */
    char *pd = m2d_path_join(dir, "pd");
    assert_int_equal(m2d_report_plot_data(&r, pd), 0);
    const char *head = "# value mean_acc min_acc max_acc n_students (MC average after distillation, %; Table 12's "
                       "students, each distinct student once per value)\n";
    struct { const char *file, *rows; } files[] = {
        {"figure4_scoring.dat", "\"sf\" 37.47 37.23 37.61 3\n\"do-acp\" 42.22 41.13 43.41 3\n"},
        {"figure4_grouping.dat", "\"rr\" 40.49 37.57 43.41 2\n\"wc\" 39.37 37.61 41.13 2\n\"rc\" 40.32 37.23 43.41 2\n"
                                 "\"ab\" 42.12 42.12 42.12 1\n"},
        {"figure4_scaling.dat", "\"uniform\" 39.4167 37.23 43.41 3\n\"proportional\" 40.2733 37.57 42.12 3\n"},
        {"figure4_K.dat", "\"K=8\" 40.32 37.23 43.41 2\n\"K=16\" 39.6075 37.57 42.12 4\n"}};
    for (size_t i = 0; i < M2D_ARRAY_LEN(files); i++) {
        char *f = m2d_path_join(pd, files[i].file), *got = m2d_read_file(f, NULL), *want = m2d_strfmt("%s%s", head, files[i].rows);
        if (!got) fail_msg("%s not written", files[i].file);
        assert_string_equal(got, want);
        free(f), free(got), free(want);
    }
    m2d_results_free(&r);
    /* the CLI: --figure 4 in csv; other figures and --table refused */
    char *out = NULL, *err = NULL, *c = m2d_strfmt("%s report %s --figure 4 --format csv", tu_bin(), p);
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_string_equal(out, EXPECTED_FIG4_CSV);
    free(c), free(out), free(err);
    c = m2d_strfmt("%s report %s --figure 5", tu_bin(), p);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "--figure: '5' is not 4"));
    free(c), free(out), free(err);
    c = m2d_strfmt("%s report %s --figure 4 --table 4", tu_bin(), p);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "--figure 4 goes without --table"));
    free(c), free(out), free(err);
    /* --best-per-pair prints its one list: a table or format beside it would be ignored, so refused */
    const char *with[][2] = {{"--table 3", "--best-per-pair goes without --table"},
                             {"--format tex", "--best-per-pair goes without --format"}};
    for (int i = 0; i < 2; i++) {
        c = m2d_strfmt("%s report %s --best-per-pair %s", tu_bin(), p, with[i][0]);
        assert_int_not_equal(tu_run(c, &out, &err), 0);
        if (!strstr(err, with[i][1])) fail_msg("%s: %s", c, err);
        free(c), free(out), free(err);
    }
    tu_rm_rf(dir);
    free(dir), free(p), free(pd);
}

/* Without a post-distillation accuracy: no figure4_*.dat (the rest of the plot data as before),
 * and --figure 4 says so. HAND_CSV has no distillation at all; DISTILL_CSV distilled students but
 * measured no MC task after distillation once its mc_avg column is gone. */
static void figure4_without_distilled_accuracy(void **state) {
    (void)state;
    char *dir, *p = write_hand(&dir);
    const char *dist_no_mc =
        "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,distill_ppl,distill_final_loss,distill_tokens,"
        "status,dedup_of,fingerprint\n"
        "0a,sf,rr,uniform,k,8,,120.5,40.25,0.8125,4096,ok,,f1\n";
    char *p2 = m2d_path_join(dir, "nomc.csv");
    tu_write(p2, dist_no_mc, strlen(dist_no_mc));
    const char *paths[] = {p, p2};
    for (size_t i = 0; i < M2D_ARRAY_LEN(paths); i++) {
        m2d_results r;
        assert_int_equal(m2d_results_read(paths[i], &r), 0);
        char *pd = m2d_path_join(dir, i ? "pd2" : "pd1");
        assert_int_equal(m2d_report_plot_data(&r, pd), 0);
        const char *axes[] = {"scoring", "grouping", "scaling", "K"};
        for (size_t a = 0; a < M2D_ARRAY_LEN(axes); a++) {
            char *name = m2d_strfmt("figure4_%s.dat", axes[a]), *f = m2d_path_join(pd, name);
            assert_false(m2d_file_exists(f));
            free(name), free(f);
        }
        char *marg = m2d_path_join(pd, "marginal_scoring.dat");
        assert_true(m2d_file_exists(marg));
        char *md = render_figure4(&r, M2D_REPORT_MD);
        assert_non_null(strstr(md, "\nNo such student: no selected row has an MC average measured after distillation"));
        assert_null(strstr(md, "(a) Scoring"));
        free(md);
        char *csv = render_figure4(&r, M2D_REPORT_CSV);
        assert_string_equal(csv, "axis,value,mean,min,max,students,spread_pp\n");
        free(csv);
        free(marg), free(pd);
        m2d_results_free(&r);
    }
    tu_rm_rf(dir);
    free(dir), free(p), free(p2);
}

/* The paper's own Table 12 (its 35 selected students, each distilled separately: one row and one
 * student per cell; pre-distillation PPL, post-distillation PPL and average accuracy as printed)
 * gives the paper's Figure 4 numbers: DO-ACP 42.64 %, PP 36.94 %, the "5.7 pp gap"; RR 40.08 %,
 * WC 39.70 %, RC 39.64 %, OC 39.63 %, AB 38.92 % (Section 4.2), a 1.16 pp grouping spread ("~1 pp",
 * "1.2 pp"). */
static const char *PAPER_T12_CSV =
    "config_id,scoring,grouping,scaling,K_expr,K,ppl,mc_avg,distill_ppl,status\n"
    "01,sf,rr,proportional,16,16,19440,0.3756,29.3,ok\n"
    "02,sf,wc,uniform,16,16,12896,0.3762,27.9,ok\n"
    "03,sf,rc,uniform,16,16,11342,0.3725,28.5,ok\n"
    "04,sf,ab,proportional,8,8,11668,0.3631,29.2,ok\n"
    "05,sf,oc,uniform,64,64,8638,0.3752,27.7,ok\n"
    "06,pp,rr,proportional,8,8,13340,0.3699,30.9,ok\n"
    "07,pp,wc,uniform,16,16,11085,0.3712,30.1,ok\n"
    "08,pp,rc,proportional,16,16,13299,0.3671,29.9,ok\n"
    "09,pp,ab,uniform,8,8,9463,0.3712,28.6,ok\n"
    "0a,pp,oc,uniform,8,8,9463,0.3677,28.7,ok\n"
    "0b,ps,rr,uniform,16,16,15236,0.3683,29.2,ok\n"
    "0c,ps,wc,uniform,16,16,10976,0.3740,27.7,ok\n"
    "0d,ps,rc,proportional,16,16,8850,0.3721,28.8,ok\n"
    "0e,ps,ab,uniform,32,32,10425,0.3651,28.6,ok\n"
    "0f,ps,oc,uniform,64,64,8509,0.3734,28.2,ok\n"
    "10,cp,rr,proportional,16,16,3696,0.4035,24.4,ok\n"
    "11,cp,wc,proportional,16,16,2148,0.4043,24.3,ok\n"
    "12,cp,rc,proportional,16,16,2264,0.4032,23.3,ok\n"
    "13,cp,ab,uniform,8,8,6033,0.3980,21.5,ok\n"
    "14,cp,oc,uniform,8,8,6033,0.3998,21.5,ok\n"
    "15,acp,rr,uniform,8,8,6334,0.4252,19.1,ok\n"
    "16,acp,wc,uniform,16,16,5527,0.4121,21.3,ok\n"
    "17,acp,rc,uniform,16,16,3384,0.3976,21.3,ok\n"
    "18,acp,ab,uniform,16,16,4829,0.3945,21.7,ok\n"
    "19,acp,oc,uniform,16,16,2002,0.4050,20.5,ok\n"
    "1a,do-cp,rr,uniform,8,8,3837,0.4289,19.1,ok\n"
    "1b,do-cp,wc,uniform,8,8,3837,0.4298,19.0,ok\n"
    "1c,do-cp,rc,uniform,8,8,3837,0.4296,19.0,ok\n"
    "1d,do-cp,ab,uniform,16,16,2840,0.4113,20.7,ok\n"
    "1e,do-cp,oc,proportional,16,16,3805,0.4204,20.5,ok\n"
    "1f,do-acp,rr,uniform,8,8,5134,0.4341,19.2,ok\n"
    "20,do-acp,wc,proportional,16,16,4333,0.4113,20.6,ok\n"
    "21,do-acp,rc,uniform,8,8,5134,0.4330,19.2,ok\n"
    "22,do-acp,ab,proportional,16,16,3939,0.4212,19.8,ok\n"
    "23,do-acp,oc,uniform,8,8,5134,0.4325,19.2,ok\n";

static void figure4_of_the_papers_table12(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "paper12.csv");
    tu_write(p, PAPER_T12_CSV, strlen(PAPER_T12_CSV));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render_figure4(&r, M2D_REPORT_MD);
    const char *want[] = {
        "(a) Scoring: spread 5.70 pp (highest mean D-Optimal + ACP 42.64 %, lowest Pre-Selection Probability 36.94 %)",
        "| Pre-Selection Probability | 36.94 | 36.71 | 37.12 | 5 |", "| D-Optimal + ACP | 42.64 | 41.13 | 43.41 | 5 |",
        "(b) Grouping: spread 1.16 pp (highest mean Round-Robin 40.08 %, lowest Anchor-Based 38.92 %)",
        "| Round-Robin | 40.08 | 36.83 | 43.41 | 7 |", "| Weight Cluster | 39.70 | 37.12 | 42.98 | 7 |",
        "| Router Cluster | 39.64 | 36.71 | 43.30 | 7 |", "| Anchor-Based | 38.92 | 36.31 | 42.12 | 7 |",
        "| Output Cluster | 39.63 | 36.77 | 43.25 | 7 |"};
    const char *at = md;
    for (size_t i = 0; i < M2D_ARRAY_LEN(want); i++) {
        const char *hit = strstr(at, want[i]);
        if (!hit) fail_msg("'%s' missing or out of order in:\n%s", want[i], md);
        at = hit + 1;
    }
    free(md);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir), free(p);
}

/* An axis with one value has no spread to name; one whose means are all equal names none. */
static void figure4_one_value_and_equal_means(void **state) {
    (void)state;
    const char *csv = "config_id,scoring,grouping,scaling,K_expr,K,ppl,mc_avg,distill_ppl,status\n"
                      "01,sf,rr,uniform,k,8,100,0.40,50,ok\n"
                      "02,sf,wc,uniform,2k,16,90,0.40,45,ok\n";
    char *dir = tu_tmpdir(), *p = m2d_path_join(dir, "eq.csv");
    tu_write(p, csv, strlen(csv));
    m2d_results r;
    assert_int_equal(m2d_results_read(p, &r), 0);
    char *md = render_figure4(&r, M2D_REPORT_MD);
    assert_non_null(strstr(md, "\n(a) Scoring: spread 0.00 pp (one value)\n"));
    assert_non_null(strstr(md, "\n(b) Grouping: spread 0.00 pp (every mean 40.00 %)\n"));
    assert_non_null(strstr(md, "\n(c) K: spread 0.00 pp (every mean 40.00 %)\n"));
    assert_null(strstr(md, "Scaling"));
    free(md);
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(dir), free(p);
}

/* The teacher row's accuracies come from the header's teacher_mc (issue 24), each task in its
 * paper metric as the students' cells: Wino acc 60.12, Hella acc_norm 45.21 (not acc 40.00),
 * ARC-E/C acc_norm, MMLU acc, the average; tex shows an absent one as "---". */
static void table12_teacher_row_has_teacher_mc(void **state) {
    (void)state;
    const char *mc = "# teacher_mc=winogrande_acc:0.601200,hellaswag_acc:0.400000,hellaswag_acc_norm:0.452100,"
                     "arc_easy_acc:0.650000,arc_easy_acc_norm:0.700100,arc_challenge_acc:0.300000,"
                     "arc_challenge_acc_norm:0.350200,mmlu_acc:0.330300,mc_avg:0.486800\n";
    const char *after = strstr(PAPER12_CSV, "# teacher_ppl=9.5 windows=8\n") + strlen("# teacher_ppl=9.5 windows=8\n");
    char *csv = m2d_strfmt("%.*s%s%s", (int)(after - PAPER12_CSV), PAPER12_CSV, mc, after);
    m2d_results r;
    assert_int_equal(m2d_results_parse("t12.csv", csv, strlen(csv), &r), 0);
    char *md = render(&r, M2D_REPORT_MD);
    if (!strstr(md, "| Teacher (MoE) |  |  |  | 9.50 |  | 60.12 | 45.21 | 70.01 | 35.02 | 33.03 | 48.68 |\n"))
        fail_msg("teacher row without its MC accuracies:\n%s", md);
    free(md);
    /* without MMLU in the header: that cell alone is absent */
    m2d_results_set_meta(&r, "teacher_mc", "winogrande_acc:0.6012,hellaswag_acc_norm:0.4521,arc_easy_acc_norm:0.7001,"
                                           "arc_challenge_acc_norm:0.3502,mc_avg:0.4868");
    char *tex = render(&r, M2D_REPORT_TEX);
    if (!strstr(tex, "Teacher (MoE) &  &  &  & 9.50 &  & 60.12 & 45.21 & 70.01 & 35.02 & --- & 48.68"))
        fail_msg("tex teacher row:\n%s", tex);
    free(tex);
    m2d_results_free(&r);
    free(csv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(compact_ppl_notation),
        cmocka_unit_test(markdown_table_and_summary),
        cmocka_unit_test(teacher_row_and_K_is_E),
        cmocka_unit_test(plot_data_files),
        cmocka_unit_test(distillation_section_and_plot_data),
        cmocka_unit_test(table12_shows_the_best_per_pair_students),
        cmocka_unit_test(figure4_marginals_of_the_distilled_students),
        cmocka_unit_test(figure4_without_distilled_accuracy),
        cmocka_unit_test(figure4_of_the_papers_table12),
        cmocka_unit_test(figure4_one_value_and_equal_means),
        cmocka_unit_test(table12_teacher_row_has_teacher_mc),
        cmocka_unit_test(names_and_order_come_from_registrations),
        cmocka_unit_test(csv_table_quotes_params),
        cmocka_unit_test(moe_students_section),
        cmocka_unit_test(condenser_plot_data),
        cmocka_unit_test(cli_formats_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
