/* moe2dense analyze — selection overlap, effective rank and coherence of every criterion's selection. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/analyze.h"
#include "convert/expert_usage.h"
#include "convert/prune_overlap.h"
#include "calib/calib.h"
#include "cli/cmd.h"
#include "model/model.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense analyze --stats STATS --model DIR [-K N] [--criteria a,b,...] [--compare S2[,S3...]]\n"
    "                         [--csv] [--layers] [--pearson-matrix]\n"
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
    "Paper 004, at 25 %% and 50 %% of each layer's experts pruned (the lowest-scored m = round(r*E)):\n"
    "  damage_overlap_R  overlap of the experts pruned by the proxy damage sum g||f|| (Eq. 8) and by\n"
    "             the exact single-expert damage (Eq. 7) (Fig. 3)\n"
    "  calib_overlap_R   with --compare: for every S(b,a,c) = n^-b sum g^a||f||^c (b in {0,1}, a, c in\n"
    "             {0,1,2}) the overlap |B_1 ∩ B_2 ∩ ...| / m of the experts pruned under each\n"
    "             calibration (Figs. 4-5; S(1,0,0) is constant: n/a)\n"
    "\n"
    "  --stats STATS  statistics from 'moe2dense calibrate' (must belong to --model)\n"
    "  --model DIR    the teacher (some criteria read its weights)\n"
    "  -K N           selection size (default k = num_experts_per_tok, as in the paper's figures)\n"
    "  --criteria L   comma-separated criteria to compare (any scoring name, also do-X)\n"
    "Paper 001 (no training): per layer the Gini coefficient of the experts' activation rates n_e / N\n"
    "  (gini; CSV: the Lorenz curve, metric lorenz, criterion i = 0..E, value = share of the i least\n"
    "  used) (App. L, Fig. 5) and the mean / max off-diagonal Pearson correlation of the experts' down\n"
    "  projections (pearson_mean, pearson_max; App. I, Fig. 4).\n"
    "\n"
    "  --compare L    comma-separated statistics of the same teacher from other calibration data\n"
    "  --pearson-matrix  CSV: also every C_ij (metric pearson, criterion i, other j)\n"
    "  --layers       text output: also print each layer's overlap matrix\n"
    "  --csv          machine-readable output instead of tables, one value per line:\n"
    "                   layer,metric,criterion,other,value\n"
    "                 layer: model layer index, or 'mean' (average over MoE layers);\n"
    "                 metric: overlap (other = second criterion), erank, erank_w, mu_S (other\n"
    "                 empty); mu, thm33_gap, damage_overlap_25/_50 with criterion and other empty,\n"
    "                 calib_overlap_25/_50 with criterion S(b,a,c) (empty value: n/a);\n"
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

static const char *ratio_tag(int r) { return r == 0 ? "25" : "50"; }

static void print_prune_csv(const m2d_prune_analysis *p) {
    for (int l = -1; l < p->n_layers; l++) {
        char lay[32];
        if (l < 0) snprintf(lay, sizeof lay, "mean");
        else snprintf(lay, sizeof lay, "%d", p->layer_ids[l]);
        for (int r = 0; r < M2D_PRUNE_N_RATIOS; r++) {
            double s = 0;
            for (int k = 0; k < p->n_layers; k++) s += p->damage[k * M2D_PRUNE_N_RATIOS + r];
            printf("%s,damage_overlap_%s,,,%.6f\n", lay, ratio_tag(r), l < 0 ? s / p->n_layers : p->damage[l * M2D_PRUNE_N_RATIOS + r]);
        }
        for (int x = 0; p->cross && x < M2D_PRUNE_N_VARIANTS; x++)
            for (int r = 0; r < M2D_PRUNE_N_RATIOS; r++) {
                double s = 0;
                for (int k = 0; k < p->n_layers; k++) s += p->cross[(k * M2D_PRUNE_N_VARIANTS + x) * M2D_PRUNE_N_RATIOS + r];
                double v = l < 0 ? s / p->n_layers : p->cross[(l * M2D_PRUNE_N_VARIANTS + x) * M2D_PRUNE_N_RATIOS + r];
                int na = p->b[x] == 1 && p->a[x] == 0 && p->c[x] == 0; /* S(1,0,0) = 1: constant */
                printf("%s,calib_overlap_%s,S(%d;%d;%d),,", lay, ratio_tag(r), p->b[x], p->a[x], p->c[x]);
                if (na) printf("\n");
                else printf("%.6f\n", v);
            }
    }
}

static void print_prune_text(const m2d_prune_analysis *p) {
    printf("\npaper 004 Fig. 3: overlap of the experts pruned by the proxy damage (Eq. 8) and the exact damage\n"
           "(Eq. 7)\n%-6s %8s %8s\n", "layer", "25%", "50%");
    double m[2] = {0, 0};
    for (int l = 0; l < p->n_layers; l++) {
        printf("%-6d %8.3f %8.3f\n", p->layer_ids[l], p->damage[l * 2], p->damage[l * 2 + 1]);
        m[0] += p->damage[l * 2] / p->n_layers, m[1] += p->damage[l * 2 + 1] / p->n_layers;
    }
    printf("%-6s %8.3f %8.3f\n", "mean", m[0], m[1]);
    if (!p->cross) return;
    printf("\npaper 004 Figs. 4-5: overlap of the experts pruned under the %d calibrations, mean over layers\n"
           "%-10s %8s %8s\n", p->n_sets, "S(b,a,c)", "25%", "50%");
    for (int x = 0; x < M2D_PRUNE_N_VARIANTS; x++) {
        double v[2] = {0, 0};
        for (int l = 0; l < p->n_layers; l++)
            for (int r = 0; r < 2; r++) v[r] += p->cross[(l * M2D_PRUNE_N_VARIANTS + x) * 2 + r] / p->n_layers;
        char name[16];
        snprintf(name, sizeof name, "S(%d,%d,%d)", p->b[x], p->a[x], p->c[x]);
        if (p->b[x] == 1 && p->a[x] == 0 && p->c[x] == 0) printf("%-10s %8s %8s\n", name, "n/a", "n/a");
        else printf("%-10s %8.3f %8.3f\n", name, v[0], v[1]);
    }
}

/* --stats and every --compare statistics, checked against the model */
static int read_compare(const char *list, const m2d_model *m, m2d_stats **sets, int *n) {
    char *copy = m2d_strdup(list), *save = NULL;
    int rc = 0;
    for (char *t = strtok_r(copy, ",", &save); t && rc == 0; t = strtok_r(NULL, ",", &save)) {
        if (*n == 8) rc = m2d_err("analyze: --compare: at most 7 statistics");
        else if ((rc = m2d_stats_read(t, &sets[*n])) == 0 && (rc = m2d_stats_check_model(sets[(*n)++], t, m)) != 0) break;
    }
    free(copy);
    return rc;
}

/* paper 001: Gini / Lorenz of the activation rates, Pearson of the down projections */
static int print_usage_stats(const m2d_model *m, const m2d_stats *s, int csv, int matrix) {
    const int E = s->E;
    double *rate = m2d_malloc((size_t)E * sizeof *rate), *lz = m2d_malloc((size_t)(E + 1) * sizeof *lz);
    double *C = m2d_malloc((size_t)E * E * sizeof *C);
    int rc = 0;
    if (!csv) printf("\npaper 001: Gini of the activation rates n_e/N (App. L), Pearson of the down projections (App. I)\n"
                     "%-6s %8s %13s %12s\n", "layer", "gini", "pearson_mean", "pearson_max");
    for (int l = 0; l < s->n_layers && rc == 0; l++) {
        const m2d_layer_stats *ls = &s->layers[l];
        for (int e = 0; e < E; e++) rate[e] = ls->N > 0 ? ls->n[e] / ls->N : 0;
        if ((rc = m2d_down_pearson(m, ls->layer, C))) break;
        double mean = 0, mx = -1;
        for (int i = 0; i < E; i++)
            for (int j = 0; j < E; j++)
                if (i != j) mean += C[(size_t)i * E + j] / ((double)E * (E - 1)), mx = fmax(mx, C[(size_t)i * E + j]);
        if (E < 2) mean = 0, mx = 0;
        if (!csv) {
            printf("%-6d %8.4f %13.4f %12.4f\n", ls->layer, m2d_gini(rate, E), mean, mx);
            continue;
        }
        printf("%d,gini,,,%.6f\n%d,pearson_mean,,,%.6f\n%d,pearson_max,,,%.6f\n", ls->layer, m2d_gini(rate, E), ls->layer,
               mean, ls->layer, mx);
        m2d_lorenz(rate, E, lz);
        for (int i = 0; i <= E; i++) printf("%d,lorenz,%d,,%.6f\n", ls->layer, i, lz[i]);
        for (int i = 0; matrix && i < E; i++)
            for (int j = 0; j < E; j++) printf("%d,pearson,%d,%d,%.6f\n", ls->layer, i, j, C[(size_t)i * E + j]);
    }
    free(rate), free(lz), free(C);
    return rc;
}

static int cmd_analyze_run(int argc, char **argv) {
    const char *stats = NULL, *model = NULL, *K_s = NULL, *crit = NULL, *compare = NULL;
    int csv = 0, layers = 0, matrix = 0;
    m2d_opt opts[] = {{"--stats", 1, &stats, NULL}, {"--model", 1, &model, NULL}, {"-K", 1, &K_s, NULL},
                      {"--criteria", 1, &crit, NULL}, {"--csv", 0, NULL, &csv}, {"--layers", 0, NULL, &layers},
                      {"--compare", 1, &compare, NULL}, {"--pearson-matrix", 0, NULL, &matrix}, {0}};
    m2d_stats *sets[8] = {0};
    int n_sets = 1;
    m2d_prune_analysis *pa = NULL;
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
    sets[0] = s;
    if (compare && read_compare(compare, m, sets, &n_sets)) goto done;
    if (m2d_prune_analyze((const m2d_stats *const *)sets, n_sets, &pa)) goto done;
    for (int i = 0; i < a->n_skipped; i++) fprintf(stderr, "moe2dense analyze: skipped %s\n", a->skipped[i]);
    if (csv) print_csv(a), print_prune_csv(pa);
    else print_text(a, layers), print_prune_text(pa);
    if (print_usage_stats(m, s, csv, matrix)) goto done;
    rc = 0;
done:
    if (rc) m2d_cmd_fail("analyze");
    m2d_analysis_free(a);
    m2d_prune_analysis_free(pa);
    for (int i = 1; i < 8; i++) m2d_calib_stats_free(sets[i]);
    m2d_calib_stats_free(s);
    if (m) m2d_model_close(m);
    free(names);
    free(copy);
    return rc;
}

M2D_COMMAND(analyze, "analyze", "selection overlap, effective rank and coherence of the scoring criteria", USAGE,
            cmd_analyze_run)
