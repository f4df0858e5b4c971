/* moe2dense analyze — selection overlap, effective rank and coherence of every criterion's selection. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/analyze.h"
#include "calib/calib.h"
#include "cli/cmd.h"
#include "model/model.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense analyze --stats STATS --model DIR [-K N] [--criteria a,b,...] [--csv] [--layers]\n"
    "\n"
    "For every scoring criterion (default: all registered, see 'moe2dense list') select K experts\n"
    "per MoE layer and report:\n"
    "  overlap    |S_a ∩ S_b| / K between every pair of criteria (paper Fig. 2)\n"
    "  erank      effective rank (Roy & Vetterli: exp of the entropy of the normalised singular\n"
    "             values) of the selected output Gram G_S / N (paper Fig. 3; max K)\n"
    "  erank_w    the same for the importance-weighted kernel sqrt(I_i I_j) G_ij / N, I = the\n"
    "             criterion's own scores (the kernel D-optimal selection maximises)\n"
    "  mu         mutual coherence max_{i!=j} |G_ij| / sqrt(G_ii G_jj) of the whole expert kernel\n"
    "             (all E experts, paper 000 Thm 3.3), per layer, and the theorem's bound\n"
    "             thm33_gap = K log((1+(K-1)mu)/(1-(K-1)mu)) on F(S_diag)'s loss (n/a if (K-1)mu >= 1)\n"
    "  mu_S       the same over the selection's submatrix G_S\n"
    "A criterion that cannot run (e.g. it needs parameters) is reported and skipped.\n"
    "\n"
    "  --stats STATS  statistics from 'moe2dense calibrate' (must belong to --model)\n"
    "  --model DIR    the teacher (some criteria read its weights)\n"
    "  -K N           selection size (default k = num_experts_per_tok, as in the paper's figures)\n"
    "  --criteria L   comma-separated criteria to compare (any scoring name, also do-X)\n"
    "  --layers       text output: also print each layer's overlap matrix\n"
    "  --csv          machine-readable output instead of tables, one value per line:\n"
    "                   layer,metric,criterion,other,value\n"
    "                 layer: model layer index, or 'mean' (average over MoE layers);\n"
    "                 metric: overlap (other = second criterion), erank, erank_w, mu_S (other\n"
    "                 empty); mu and thm33_gap with criterion and other empty (empty value: n/a);\n"
    "                 a header line names the columns.\n";

static double mean_over_layers(const m2d_analysis *a, const double *v, size_t stride, size_t off) {
    double s = 0;
    for (int l = 0; l < a->n_layers; l++) s += v[(size_t)l * stride + off];
    return a->n_layers ? s / a->n_layers : 0;
}

static void print_csv(const m2d_analysis *a) {
    int C = a->n_crit;
    printf("layer,metric,criterion,other,value\n");
    for (int l = -1; l < a->n_layers; l++) {
        char lay[32];
        if (l < 0) snprintf(lay, sizeof lay, "mean");
        else snprintf(lay, sizeof lay, "%d", a->layer_ids[l]);
        double mu = l < 0 ? mean_over_layers(a, a->mu, 1, 0) : a->mu[l];
        double gap = l < 0 ? mean_over_layers(a, a->thm33_gap, 1, 0) : a->thm33_gap[l];
        printf("%s,mu,,,%.6f\n", lay, mu);
        if (isfinite(gap)) printf("%s,thm33_gap,,,%.6f\n", lay, gap);
        else printf("%s,thm33_gap,,,\n", lay);
        for (int c = 0; c < C; c++) {
            const char *metric[3] = {"erank", "erank_w", "mu_S"};
            const double *arr[3] = {a->erank, a->erank_w, a->coherence};
            for (int k = 0; k < 3; k++) {
                double v = l < 0 ? mean_over_layers(a, arr[k], (size_t)C, (size_t)c) : arr[k][(size_t)l * C + c];
                printf("%s,%s,%s,,%.6f\n", lay, metric[k], a->names[c], v);
            }
            for (int o = 0; o < C; o++) {
                double v = l < 0 ? mean_over_layers(a, a->overlap, (size_t)C * C, (size_t)c * C + o)
                                 : a->overlap[((size_t)l * C + c) * C + o];
                printf("%s,overlap,%s,%s,%.6f\n", lay, a->names[c], a->names[o], v);
            }
        }
    }
}

static void print_overlap(const m2d_analysis *a, int l) {
    int C = a->n_crit;
    printf("%-10s", "");
    for (int c = 0; c < C; c++) printf(" %7.7s", a->names[c]);
    putchar('\n');
    for (int x = 0; x < C; x++) {
        printf("%-10.10s", a->names[x]);
        for (int y = 0; y < C; y++) {
            double v = l < 0 ? mean_over_layers(a, a->overlap, (size_t)C * C, (size_t)x * C + y)
                             : a->overlap[((size_t)l * C + x) * C + y];
            printf(" %7.2f", v);
        }
        putchar('\n');
    }
}

static void print_text(const m2d_analysis *a, int per_layer) {
    int C = a->n_crit;
    printf("selection overlap |S_a ∩ S_b| / K at K = %d, mean over %d MoE layers:\n", a->K, a->n_layers);
    print_overlap(a, -1);
    if (per_layer)
        for (int l = 0; l < a->n_layers; l++) {
            printf("\nlayer %d overlap:\n", a->layer_ids[l]);
            print_overlap(a, l);
        }
    printf("\nmutual coherence mu of the whole expert kernel (paper 000 Thm 3.3) and the theorem's bound on\n"
           "what the diagonal proxy loses, K log((1+(K-1)mu)/(1-(K-1)mu)) (n/a when (K-1)mu >= 1); K = %d\n", a->K);
    printf("%-6s %8s %10s\n", "layer", "mu", "thm33_gap");
    for (int l = 0; l < a->n_layers; l++) {
        char gap[32] = "n/a";
        if (isfinite(a->thm33_gap[l])) snprintf(gap, sizeof gap, "%.4f", a->thm33_gap[l]);
        printf("%-6d %8.4f %10s\n", a->layer_ids[l], a->mu[l], gap);
    }
    printf("\neffective rank of G_S (erank), of the weighted kernel (erank_w), coherence of G_S (mu_S); K = %d\n", a->K);
    printf("%-10s %-6s %8s %8s %8s\n", "criterion", "layer", "erank", "erank_w", "mu_S");
    for (int c = 0; c < C; c++) {
        for (int l = 0; l < a->n_layers; l++)
            printf("%-10s %-6d %8.3f %8.3f %8.4f\n", a->names[c], a->layer_ids[l], a->erank[l * C + c],
                   a->erank_w[l * C + c], a->coherence[l * C + c]);
        printf("%-10s %-6s %8.3f %8.3f %8.4f\n", a->names[c], "mean", mean_over_layers(a, a->erank, C, c),
               mean_over_layers(a, a->erank_w, C, c), mean_over_layers(a, a->coherence, C, c));
    }
}

static int cmd_analyze_run(int argc, char **argv) {
    const char *stats = NULL, *model = NULL, *K_s = NULL, *crit = NULL;
    int csv = 0, layers = 0;
    m2d_opt opts[] = {{"--stats", 1, &stats, NULL}, {"--model", 1, &model, NULL}, {"-K", 1, &K_s, NULL},
                      {"--criteria", 1, &crit, NULL}, {"--csv", 0, NULL, &csv}, {"--layers", 0, NULL, &layers},
                      {0}};
    m2d_model *m = NULL;
    m2d_stats *s = NULL;
    m2d_analysis *a = NULL;
    char *copy = NULL;
    const char **names = NULL;
    int n_names = 0, rc = 1;
    if (m2d_parse_opts("analyze", argc, argv, opts, NULL, 0, NULL)) goto done;
    if (!stats || !model) {
        m2d_err("analyze: --stats and --model are required (see 'moe2dense help analyze')");
        goto done;
    }
    if (m2d_model_open(model, &m) || m2d_stats_read(stats, &s) || m2d_stats_check_model(s, stats, m)) goto done;
    long K = s->k;
    if (K_s && m2d_parse_int("analyze", "-K", K_s, 1, s->E, &K)) goto done;
    if (crit) {
        copy = m2d_strdup(crit);
        names = m2d_calloc(strlen(crit) + 1, sizeof *names);
        char *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) names[n_names++] = t;
        if (!n_names) {
            m2d_err("analyze: --criteria is empty");
            goto done;
        }
    }
    if (m2d_analyze(m, s, (int)K, names, n_names, &a)) goto done;
    for (int i = 0; i < a->n_skipped; i++) fprintf(stderr, "moe2dense analyze: skipped %s\n", a->skipped[i]);
    if (csv) print_csv(a);
    else print_text(a, layers);
    rc = 0;
done:
    if (rc) m2d_cmd_fail("analyze");
    m2d_analysis_free(a);
    m2d_calib_stats_free(s);
    if (m) m2d_model_close(m);
    free(names);
    free(copy);
    return rc;
}

M2D_COMMAND(analyze, "analyze", "selection overlap, effective rank and coherence of the scoring criteria", USAGE,
            cmd_analyze_run)
