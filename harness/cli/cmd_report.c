/* moe2dense report — the paper's Table 10/11 layout and a per-criterion summary from a results CSV. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "sweep/report.h"
#include "sweep/report_d2d.h"
#include "sweep/report_distill.h"
#include "sweep/report_scoring_k.h"
#include "io/results.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense report RESULTS.csv [--format md|tex|csv] [--out FILE] [--plot-data DIR]\n"
    "                        [--analyze ANALYZE.csv] [--best-per-pair] [--table 3|4|5|6|8|16|17]\n"
    "                        [--figure 4|7]\n"
    "\n"
    "Table in the layout of the paper's Tables 10/11: one row per scoring x grouping x scaling, one\n"
    "column per K; the best K of each row in bold; '–' for failed configurations (e.g. NaN PPL);\n"
    "PPL >= 100,000 in compact notation (120k, 1.1m). md and tex add a per-criterion summary (best PPL\n"
    "per scoring, where it was reached, mean rank across the cells where every scoring ran). When\n"
    "the sweep had a distillation stage, md and tex add \"After distillation\": the paper's Table 12\n"
    "(per scoring x grouping the student selected by pre-distillation PPL, its scaling, K, PPL\n"
    "before/after and per-benchmark accuracy after; a teacher row), and one line per\n"
    "distilled student (PPL before and after, tokens, final loss). MoE students (target moe: the grid's\n"
    "ratio and top_k axes) are not in that table: md and tex give them their own section, one row per\n"
    "method (scoring x grouping x params), one column per (ratio, top-k) with the experts kept, PPL and,\n"
    "when the MC stage measured some, the MC average; the best method of each column in bold.\n"
    "md and tex begin with the calibration the sweep actually used (its header's calibration= line:\n"
    "windows used and requested, seq_len, tokens; a note when the data held fewer windows).\n"
    "\n"
    "options:\n"
    "  --format F        md (default), tex (booktabs tabular) or csv (the dense table: raw numbers,\n"
    "                    best_K column)\n"
    "  --out FILE        write there (atomically) instead of stdout\n"
    "  --plot-data DIR   also write the gnuplot inputs for plots/*.gp (heat_*.dat, marginal_*.dat;\n"
    "                    with distilled students distill.dat and the training and validation curves\n"
    "                    from RESULTS.csv.distill/*.jsonl; with post-distillation accuracies\n"
    "                    figure4_<axis>.dat, see --figure 4)\n"
    "  --analyze FILE    with --plot-data: also the inputs of the overlap and erank plots from\n"
    "                    `moe2dense analyze --csv` output (validated: names and numbers only)\n"
    "  --table 3         only the MoE-to-dense vs dense-to-dense comparison of a sweep with a [d2d]\n"
    "                    block (paper Table 3 / Figure 1 layout): MoE-to-dense DO-ACP at K = k, the\n"
    "                    best of the grid, the D2D student the paper's rule selected, random-ffn,\n"
    "                    random-init and both teachers; parameters, PPL before and after distillation,\n"
    "                    MC average, seconds per step and per teacher forward; then Table 13 (every D2D\n"
    "                    candidate: shape, width-only or width + depth, parameters, PPL before, the\n"
    "                    selected one). With --plot-data also figure1.dat (plots/figure1.gp)\n"
    "  --table 4|5       only the paper's Table 4 (teacher top-k' ablation: one row per k' at forward KL,\n"
    "                    'k (default)' the teacher's own routing) or Table 5 (loss ablation: one row per\n"
    "                    loss at k' = k), per distilled student, from the distillation ablation's\n"
    "                    sidecar RESULTS.csv.distill.csv (a [distill] loss or teacher_topk list): PPL,\n"
    "                    accuracies, average and the differences to the reference row (md, tex, csv)\n"
    "  --table 6         Table 3's comparison in the layout of the paper's Table 6 (extended training:\n"
    "                    the same students at a larger distill.tokens, e.g. experiment extended-distill):\n"
    "                    every distilled converted student (the paper: DO-ACP K = k and SF K = 2k) in\n"
    "                    place of the best of the grid, and the tokens per student above it\n"
    "  --table 8|16|17   per scoring the configuration with the lowest pre-distillation PPL at K = k\n"
    "                    (pure pruning) and at K = 2k (merging) -- what distill.configs =\n"
    "                    \"best-per-scoring-K\" distills -- after distillation: K, PPL before and after,\n"
    "                    each paper benchmark the file has and the average; the random-ffn and\n"
    "                    random-init baselines below. 8: the paper's Table 8 (base teacher, bold: the\n"
    "                    better K per scoring; experiment base-distill); 16, 17: its Tables 16 and 17\n"
    "                    (cross-model validation, DeepSeek-V2-Lite and GPT-OSS-20B there; this file's\n"
    "                    teacher is named in the caption; bold: best per column; a teacher row;\n"
    "                    experiment cross-model-distill). md, tex, csv\n"
    "  --figure 7        only the paper's Figure 7 as a table: the MC average after distillation per\n"
    "                    scoring at K = k and at K = 2k (the --table 16 students) and the random-FFN\n"
    "                    baseline; with --plot-data, figure7.dat and figure7.txt are written with every\n"
    "                    report whose selected students have one (plots/figure7.gp: bars, dashed line)\n"
    "  --figure 4        only the paper's Figure 4 as tables (md, tex, csv): per value of scoring and\n"
    "                    grouping (scaling and K when they vary), the mean, min and max of the MC\n"
    "                    average after distillation over Table 12's students (the pairs' selected\n"
    "                    students that were distilled and scored; each distinct student once per\n"
    "                    value: rows sharing a fingerprint are one student) and their count; each\n"
    "                    axis headed by its spread (highest mean - lowest, in points). With\n"
    "                    --plot-data, figure4_<axis>.dat are written with every report\n"
    "                    (plots/figure4.gp)\n"
    "  --best-per-pair   list the configurations the paper evaluates on multiple-choice tasks: per\n"
    "                    scoring x grouping, the (K, scaling) with the lowest PPL among its dense\n"
    "                    students (its smaller MoEs where it has none); config ids, one list: no\n"
    "                    --table or --format with it\n"
    "\n"
    "Figure 6 (MMLU chain-of-thought error distribution) is not produced: it classifies free-form\n"
    "generations (sampling, up to 2,048 tokens, an LLM judge); this harness scores log-likelihoods only.\n"
    "\n"
    "Every row is validated first (numbers parse and lie in range, the status is known, config ids\n"
    "are unique): a bad row is an error naming FILE:LINE:COLUMN and the field. A torn last line (a\n"
    "sweep still writing, or killed) is ignored with a note.\n";

static const char *const TABLES[] = {"3", "4", "5", "6", "8", "16", "17", NULL}, *const FIGURES[] = {"4", "7", NULL};

static int one_of(const char *v, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(v, *list)) return 1;
    return 0;
}

/* the one section asked for (--best-per-pair, --table N, --figure N), else the whole report */
static int write_section(const char *path, const m2d_results *r, int best, const char *table, const char *figure,
                         m2d_report_format fmt, FILE *f) {
    int t = table ? atoi(table) : 0;
    if (best) return m2d_report_write_best_per_pair(r, f);
    if (t == 3 || t == 6) return m2d_report_d2d_write(r, t, fmt, f);
    if (t == 4 || t == 5) return m2d_report_ablation_write(path, r, t, fmt, f);
    if (t) return m2d_report_scoring_k_write(r, t, fmt, f);
    if (figure && !strcmp(figure, "7")) return m2d_report_figure7_write(r, fmt, f);
    if (figure) return m2d_report_write_figure4(r, fmt, f);
    return m2d_report_write(r, fmt, f);
}

static int cmd_report_run(int argc, char **argv) {
    const char *format = NULL, *out = NULL, *plot = NULL, *analyze = NULL, *table = NULL, *figure = NULL;
    int best = 0;
    m2d_opt opts[] = {{"--format", 1, &format, NULL}, {"--out", 1, &out, NULL}, {"--plot-data", 1, &plot, NULL},
                      {"--analyze", 1, &analyze, NULL}, {"--best-per-pair", 0, NULL, &best}, {"--table", 1, &table, NULL},
                      {"--figure", 1, &figure, NULL}, {0}};
    char *pos[1];
    int npos = 0;
    if (m2d_parse_opts("report", argc, argv, opts, pos, 1, &npos)) return m2d_cmd_fail("report");
    if (npos != 1) {
        m2d_err("report: expected RESULTS.csv (see 'moe2dense help report')");
        return m2d_cmd_fail("report");
    }
    if (best && (table || format)) { /* one plain list of config ids: neither a table nor a format applies */
        m2d_err("report: --best-per-pair goes without %s", table ? "--table" : "--format");
        return m2d_cmd_fail("report");
    }
    m2d_report_format fmt;
    if (!format || !strcmp(format, "md")) fmt = M2D_REPORT_MD;
    else if (!strcmp(format, "tex")) fmt = M2D_REPORT_TEX;
    else if (!strcmp(format, "csv")) fmt = M2D_REPORT_CSV;
    else {
        m2d_err("report: --format: '%s' is not md, tex or csv", format);
        return m2d_cmd_fail("report");
    }
    if (table && !one_of(table, TABLES)) {
        m2d_err("report: --table: '%s' is not 3, 4, 5, 6, 8, 16 or 17", table);
        return m2d_cmd_fail("report");
    }
    if (figure && !one_of(figure, FIGURES)) {
        m2d_err("report: --figure: '%s' is not 4 or 7 (Figure 1: --table 3; Figure 6: not produced, see 'moe2dense "
                "help report')", figure);
        return m2d_cmd_fail("report");
    }
    if (figure && (table || best)) {
        m2d_err("report: --figure %s goes without %s", figure, table ? "--table" : "--best-per-pair");
        return m2d_cmd_fail("report");
    }
    if (analyze && !plot) {
        m2d_err("report: --analyze goes with --plot-data DIR");
        return m2d_cmd_fail("report");
    }
    if (out && (m2d_same_file(out, pos[0]) || m2d_same_file(out, analyze))) {
        m2d_err("report: --out %s: is an input of this report; refusing to overwrite it", out);
        return m2d_cmd_fail("report");
    }
    m2d_an_csv an = {0};
    if (analyze && m2d_an_csv_read(analyze, &an)) return m2d_cmd_fail("report");
    m2d_results r;
    if (m2d_results_read_checked(pos[0], &r)) {
        m2d_an_csv_free(&an);
        return m2d_cmd_fail("report");
    }
    if (r.torn_bytes) fprintf(stderr, "moe2dense report: %s: ignoring a torn last line (a sweep is running or was killed)\n", pos[0]);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = write_section(pos[0], &r, best, table, figure, fmt, f);
    fclose(f);
    if (rc == 0 && plot) rc = m2d_report_plot_data(&r, plot);
    if (rc == 0 && plot) rc = m2d_report_distill_plot_data(pos[0], &r, plot);
    if (rc == 0 && plot) rc = m2d_report_d2d_plot_data(&r, plot);
    if (rc == 0 && plot) rc = m2d_report_figure7_plot_data(&r, plot);
    if (rc == 0 && analyze) rc = m2d_report_analyze_plot_data(&an, plot);
    if (rc == 0) {
        if (out) rc = m2d_write_file_atomic(out, buf, len);
        else fwrite(buf, 1, len, stdout); /* a failed write: main's check of stdout reports it */
    }
    free(buf);
    m2d_results_free(&r);
    m2d_an_csv_free(&an);
    return rc ? m2d_cmd_fail("report") : 0;
}

M2D_COMMAND(report, "report", "paper-style PPL tables (md/tex/csv) and a per-criterion summary from a sweep CSV",
            USAGE, cmd_report_run)
