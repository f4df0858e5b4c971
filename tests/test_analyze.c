/* analyze: effective rank and coherence on analytic cases, the analysis over a calibrated test
 * checkpoint, and the three commands (calibrate, convert, analyze) end to end on the CLI with
 * their error paths. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/analyze.h"
#include "convert/expert_usage.h"
#include "convert/prune_overlap.h"
#include "calib/calib.h"
#include "model/model.h"
#include "testmodel.h"
#include "base/util.h"
#include "io/analyze_csv.h"
#include "sweep/report.h"

static void effective_rank_analytic(void **state) {
    (void)state;
    double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    assert_true(fabs(m2d_effective_rank(I3, 3) - 3) < 1e-12);
    /* rank one: v vᵀ has a single non-zero singular value */
    double v[3] = {1, 2, 3}, R1[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) R1[i * 3 + j] = v[i] * v[j];
    assert_true(fabs(m2d_effective_rank(R1, 3) - 1) < 1e-9);
    /* diag(1, 1, 0): 2; diag(3, 1): exp(H(3/4, 1/4)) */
    double D[9] = {1, 0, 0, 0, 1, 0, 0, 0, 0};
    assert_true(fabs(m2d_effective_rank(D, 3) - 2) < 1e-12);
    double D2[4] = {3, 0, 0, 1};
    double h = -(0.75 * log(0.75) + 0.25 * log(0.25));
    assert_true(fabs(m2d_effective_rank(D2, 2) - exp(h)) < 1e-12);
    /* rotation invariant: Q diag(3,1) Qᵀ, Q a 45° rotation */
    double c = sqrt(0.5), Q2[4] = {2 * c * c * 2, 2 * c * c * 1, 0, 0};
    Q2[0] = 3 * c * c + 1 * c * c; Q2[1] = 3 * c * c - 1 * c * c; Q2[2] = Q2[1]; Q2[3] = Q2[0];
    assert_true(fabs(m2d_effective_rank(Q2, 2) - exp(h)) < 1e-12);
    double Z[4] = {0, 0, 0, 0};
    assert_true(m2d_effective_rank(Z, 2) == 0);
}

static void coherence_analytic(void **state) {
    (void)state;
    double A[9] = {4, 1, -3, 1, 1, 0, -3, 0, 9};
    /* |A01|/sqrt(4·1) = 0.5, |A02|/sqrt(4·9) = 0.5, A12 = 0 */
    assert_true(fabs(m2d_mutual_coherence(A, 3) - 0.5) < 1e-15);
    double B[4] = {1, 0.9, 0.9, 1};
    assert_true(fabs(m2d_mutual_coherence(B, 2) - 0.9) < 1e-15);
    double Z[4] = {0, 1, 1, 1}; /* a zero diagonal: the pair counts as 0 */
    assert_true(m2d_mutual_coherence(Z, 2) == 0);
    assert_true(m2d_mutual_coherence(B, 1) == 0);
    /* paper 000 Thm 3.3's bound: K log((1 + (K−1)μ)/(1 − (K−1)μ)); none when (K−1)μ >= 1 */
    assert_true(fabs(m2d_thm33_gap(0.1, 3) - 3 * log(1.2 / 0.8)) < 1e-15);
    assert_true(m2d_thm33_gap(0.0, 5) == 0);
    assert_true(isnan(m2d_thm33_gap(0.5, 3)));
}

static void analysis_on_test_checkpoint(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    int32_t ids[256];
    uint64_t st = 2;
    for (int i = 0; i < 256; i++) ids[i] = (int32_t)(tu_rand_u64(&st) % 64);
    m2d_calib_opts co = {.seq_len = 64, .n_samples = 4, .n_threads = 1};
    m2d_stats *s;
    assert_int_equal(m2d_calib_run(m, ids, 256, &co, &s), 0);
    const char *names[] = {"sf", "acp", "do-acp", "cp"};
    m2d_analysis *a;
    assert_int_equal(m2d_analyze(m, s, 4, names, 4, &a), 0);
    assert_int_equal(a->n_crit, 4);
    assert_int_equal(a->n_layers, 2);
    for (int l = 0; l < 2; l++) { /* μ over all E experts of the kernel, by brute force */
        const m2d_layer_stats *ls = &s->layers[l];
        double mu = 0, mu_sel_max = 0;
        for (int i = 0; i < ls->E; i++)
            for (int j = 0; j < ls->E; j++)
                if (i != j && ls->gram[i * ls->E + i] > 0 && ls->gram[j * ls->E + j] > 0)
                    mu = fmax(mu, fabs(ls->gram[i * ls->E + j]) / sqrt(ls->gram[i * ls->E + i] * ls->gram[j * ls->E + j]));
        assert_true(fabs(a->mu[l] - mu) < 1e-12);
        for (int x = 0; x < 4; x++) mu_sel_max = fmax(mu_sel_max, a->coherence[l * 4 + x]);
        assert_true(mu_sel_max <= mu + 1e-12); /* a submatrix's μ_S never exceeds the whole kernel's */
        assert_true(isnan(a->thm33_gap[l]) || fabs(a->thm33_gap[l] - m2d_thm33_gap(mu, 4)) < 1e-12);
    }
    for (int l = 0; l < 2; l++)
        for (int x = 0; x < 4; x++) {
            assert_true(a->overlap[(l * 4 + x) * 4 + x] == 1.0);
            assert_true(a->erank[l * 4 + x] >= 1 - 1e-9 && a->erank[l * 4 + x] <= 4 + 1e-9);
            assert_true(a->coherence[l * 4 + x] >= 0 && a->coherence[l * 4 + x] <= 1 + 1e-12);
            for (int y = 0; y < 4; y++) {
                double v = a->overlap[(l * 4 + x) * 4 + y];
                assert_true(v == a->overlap[(l * 4 + y) * 4 + x]);
                /* brute-force intersection */
                const int *Sx = a->selected + (l * 4 + x) * 4, *Sy = a->selected + (l * 4 + y) * 4;
                int common = 0;
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) common += Sx[i] == Sy[j];
                assert_true(v == common / 4.0);
            }
        }
    m2d_analysis_free(a);
    const char *bad[] = {"nope"};
    assert_int_equal(m2d_analyze(m, s, 4, bad, 1, &a), -1);
    assert_non_null(strstr(m2d_errmsg(), "nope"));
    m2d_calib_stats_free(s);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* ---------------- paper 004: pruned-set overlaps ---------------- */

/* the m lowest by a stable sort on (score ascending, index descending): the experts a top-(E − m)
 * selection with ties → lower index leaves out */
static void brute_bottom(const double *sc, int E, int m, char *out) {
    int idx[64];
    for (int i = 0; i < E; i++) idx[i] = i;
    for (int i = 0; i < E; i++)
        for (int j = i + 1; j < E; j++)
            /* == : the tie rule itself, on the same bits the library sorts */
            if (sc[idx[j]] < sc[idx[i]] || (sc[idx[j]] == sc[idx[i]] && idx[j] > idx[i])) {
                int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
            }
    memset(out, 0, (size_t)E);
    for (int i = 0; i < m; i++) out[idx[i]] = 1;
}

static double brute_overlap(const double *x, const double *y, int E, double ratio) {
    int m = (int)lround(ratio * E), c = 0;
    char a[64], b[64];
    brute_bottom(x, E, m, a), brute_bottom(y, E, m, b);
    for (int e = 0; e < E; e++) c += a[e] && b[e];
    return m ? (double)c / m : 1;
}

static void pruned_overlaps_against_brute_force(void **state) {
    (void)state;
    /* hand case: E = 8, ratio 0.25 → m = 2; ties at the bottom prune the higher index */
    double x[8] = {5, 1, 1, 7, 0, 3, 9, 2}, y[8] = {5, 0, 4, 7, 1, 3, 9, 0};
    char pr[8];
    assert_int_equal(m2d_pruned_set(x, 8, 0.25, pr), 2);
    assert_true(pr[4] && pr[2] && !pr[1]); /* 0, then the tie 1/1 prunes expert 2 */
    const double *v[2] = {x, y};
    /* x prunes {4, 2}; y: 0 at experts 1 and 7 → prunes {7, 1}: no common expert */
    assert_true(m2d_pruned_overlap(v, 2, 8, 0.25) == 0);
    assert_true(m2d_pruned_overlap(v, 1, 8, 0.5) == 1);
    assert_true(m2d_pruned_overlap(v, 2, 8, 0.25) == brute_overlap(x, y, 8, 0.25));
    /* two calibrations of the test model on different tokens */
    char *dir = tu_tmpdir();
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    m2d_stats *st[2];
    for (int c = 0; c < 2; c++) {
        int32_t ids[256];
        uint64_t r = 11 + c;
        for (int i = 0; i < 256; i++) ids[i] = (int32_t)(tu_rand_u64(&r) % 64);
        m2d_calib_opts co = {.seq_len = 64, .n_samples = 4, .n_threads = 1};
        assert_int_equal(m2d_calib_run(m, ids, 256, &co, &st[c]), 0);
    }
    m2d_prune_analysis *p;
    assert_int_equal(m2d_prune_analyze((const m2d_stats *const *)st, 2, &p), 0);
    int differs = 0;
    for (int l = 0; l < p->n_layers; l++) {
        const m2d_layer_stats *a = &st[0]->layers[l], *b = &st[1]->layers[l];
        double proxy[8], sa[8], sb[8];
        for (int e = 0; e < 8; e++) proxy[e] = a->sum_rf[e]; /* Eq. 8 with the Eq. 1 gate */
        for (int r = 0; r < 2; r++)
            assert_true(p->damage[l * 2 + r] == brute_overlap(proxy, a->damage, 8, m2d_prune_ratios[r]));
        for (int x2 = 0; x2 < M2D_PRUNE_N_VARIANTS; x2++) {
            int bb = p->b[x2], aa = p->a[x2], cc = p->c[x2];
            for (int e = 0; e < 8; e++) { /* S(b,a,c) straight from the token sums it names */
                const double *ta[3][3] = {{a->n, a->sum_f, a->sum_f2}, {a->sum_r, a->sum_rf, a->sum_rf2},
                                          {a->sum_r2, a->sum_r2f, a->sum_r2f2}};
                const double *tb[3][3] = {{b->n, b->sum_f, b->sum_f2}, {b->sum_r, b->sum_rf, b->sum_rf2},
                                          {b->sum_r2, b->sum_r2f, b->sum_r2f2}};
                sa[e] = bb ? (a->n[e] > 0 ? ta[aa][cc][e] / a->n[e] : 0) : ta[aa][cc][e];
                sb[e] = bb ? (b->n[e] > 0 ? tb[aa][cc][e] / b->n[e] : 0) : tb[aa][cc][e];
            }
            for (int r = 0; r < 2; r++) {
                double want = brute_overlap(sa, sb, 8, m2d_prune_ratios[r]);
                assert_true(p->cross[(l * M2D_PRUNE_N_VARIANTS + x2) * 2 + r] == want);
                differs |= want < 1;
            }
        }
    }
    assert_true(differs); /* the two calibrations do disagree somewhere */
    m2d_prune_analysis_free(p);
    /* statistics of another model are refused */
    snprintf(st[1]->model_hash, sizeof st[1]->model_hash, "%s", "0000");
    assert_int_equal(m2d_prune_analyze((const m2d_stats *const *)st, 2, &p), -1);
    assert_non_null(strstr(m2d_errmsg(), "model_hash"));
    for (int c = 0; c < 2; c++) m2d_calib_stats_free(st[c]);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* paper 001 App. L / App. I: Gini and Lorenz of activation rates, Pearson of down projections */
static void gini_lorenz_pearson(void **state) {
    (void)state;
    double one[4] = {0, 1, 0, 0}, lin[4] = {4, 1, 3, 2}, lz[5];
    assert_true(fabs(m2d_gini(one, 4) - 0.75) < 1e-15); /* one expert takes all: (n − 1)/n */
    assert_true(m2d_gini(lin, 1) == 0);
    m2d_lorenz(lin, 4, lz);
    const double want[5] = {0, 0.1, 0.3, 0.6, 1};
    for (int i = 0; i < 5; i++) assert_true(fabs(lz[i] - want[i]) < 1e-15);
    uint64_t st = 4;
    double x[9];
    for (int i = 0; i < 9; i++) x[i] = (double)(tu_rand_u64(&st) % 100);
    double num = 0, mean = 0;
    for (int i = 0; i < 9; i++) {
        mean += x[i] / 9;
        for (int j = 0; j < 9; j++) num += fabs(x[i] - x[j]);
    }
    assert_true(fabs(m2d_gini(x, 9) - num / (2 * 81 * mean)) < 1e-14); /* the double-sum definition */
    /* Pearson of the test model's down projections vs a direct fp64 loop */
    char *dir = tu_tmpdir();
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    const int E = m->cfg.num_experts;
    double *C = m2d_malloc((size_t)E * E * sizeof *C);
    assert_int_equal(m2d_down_pearson(m, 1, C), 0);
    int64_t n = m2d_tensor_numel(m->layers[1].exp_down[0]);
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) {
            float *a = m2d_tensor_f32(m->layers[1].exp_down[i]), *b = m2d_tensor_f32(m->layers[1].exp_down[j]);
            double ma = 0, mb = 0, ab = 0, aa = 0, bb = 0;
            for (int64_t t = 0; t < n; t++) ma += a[t] / (double)n, mb += b[t] / (double)n;
            for (int64_t t = 0; t < n; t++)
                ab += (a[t] - ma) * (b[t] - mb), aa += (a[t] - ma) * (a[t] - ma), bb += (b[t] - mb) * (b[t] - mb);
            /* fp32 SYRK blocks accumulated in fp64: ~1e-6 relative on O(1) correlations */
            if (fabs(C[i * E + j] - ab / sqrt(aa * bb)) > 1e-5) fail_msg("C[%d,%d] %g vs %g", i, j, C[i * E + j], ab / sqrt(aa * bb));
            free(a), free(b);
        }
    free(C);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* ---------------- the commands end to end (tiny teacher) ---------------- */

static int run(const char *cmd, char **out, char **err) {
    int rc = tu_run(cmd, out, err);
    return rc;
}

/* What `analyze --csv` writes is what make plots reads: the validated reader (report --analyze)
 * accepts every line of it, and the condenser plots get their data (4 MoE layers of the test
 * teacher; the Pearson matrix with --pearson-matrix). */
static void accepted_by_plots(const char *csv, const char *dir, int with_matrix) {
    m2d_an_csv a;
    if (m2d_an_csv_parse("analyze.csv", csv, strlen(csv), &a)) fail_msg("%s", m2d_errmsg());
    char *pd = m2d_path_join(dir, "plotdata");
    if (m2d_report_analyze_plot_data(&a, pd)) fail_msg("%s", m2d_errmsg());
    char *lt = m2d_path_join(pd, "lorenz.txt"), *pt = m2d_path_join(pd, "pearson.txt");
    char *l = m2d_read_file(lt, NULL), *p = m2d_read_file(pt, NULL);
    assert_int_equal(strncmp(l, "4 ", 2), 0);
    assert_int_equal(strncmp(p, with_matrix ? "4 1 " : "4 0 ", 4), 0);
    free(l), free(p), free(lt), free(pt);
    tu_rm_rf(pd);
    free(pd);
    m2d_an_csv_free(&a);
}

static void commands_end_to_end(void **state) {
    (void)state;
    const char *models = tu_models_dir();
    if (!models) TU_SKIP("no ../shared/models");
    char *dir = tu_tmpdir();
    char teacher[4096], text[4096];
    snprintf(teacher, sizeof teacher, "%s/tiny-qwen3moe", models);
    snprintf(text, sizeof text, "%s", tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.valid.raw"));
    if (!m2d_file_exists(text)) {
        tu_rm_rf(dir);
        free(dir);
        TU_SKIP("no data/wikitext-2-raw (run make data)");
    }
    const char *bin = tu_bin();
    char *out = NULL, *err = NULL, *cmd;
    /* calibrate: 2 windows of 64 tokens */
    cmd = m2d_strfmt("%s calibrate --model %s --data %s --out %s/s.bin --seq-len 64 --samples 2 --seed 3", bin, teacher,
                     text, dir);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "wrote"));
    free(out); free(err);
    /* again: up to date */
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "up to date"));
    free(out); free(err);
    /* another precision is another calibration (not up to date); recorded in the stats */
    char *cmd16 = m2d_strfmt("%s --precision bf16", cmd);
    assert_int_equal(run(cmd16, &out, &err), 0);
    assert_non_null(strstr(out, "wrote"));
    assert_non_null(strstr(out, "precision bf16 (requested bf16)"));
    free(out); free(err); free(cmd16);
    cmd16 = m2d_strfmt("%s --precision half", cmd);
    assert_int_not_equal(run(cmd16, &out, &err), 0);
    assert_non_null(strstr(err, "calibrate: --precision: 'half' is not a precision (auto, fp32, bf16)"));
    free(out); free(err); free(cmd16); free(cmd);
    m2d_stats *s;
    char *sp = m2d_path_join(dir, "s.bin");
    assert_int_equal(m2d_stats_read(sp, &s), 0);
    assert_int_equal(s->n_windows, 2);
    assert_int_equal(s->seq_len, 64);
    assert_string_equal(s->precision, "bf16");
    m2d_calib_stats_free(s);

    /* convert: dense student, loads, and carries the tokenizer */
    cmd = m2d_strfmt("%s convert --model %s --stats %s --scoring do-acp --grouping oc --scaling proportional -K 12 "
                     "--out %s/student",
                     bin, teacher, sp, dir);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "fingerprint"));
    free(out); free(err); free(cmd);
    char *sd = m2d_path_join(dir, "student");
    m2d_model *m;
    if (m2d_model_open(sd, &m)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m->cfg.intermediate_size, 8 * 72);
    m2d_model_close(m);
    char *tj = m2d_path_join(sd, "tokenizer.json");
    assert_true(m2d_file_exists(tj));
    free(tj);
    /* ConMoE from the command line: 50 % of the experts as prototypes over scopes of 2 layers,
     * every router row kept (64 experts), the prototypes' sources recorded */
    cmd = m2d_strfmt("%s convert --model %s --stats %s --target moe --scoring conmoe --grouping remap --ratio 0.5 "
                     "--param scope=2 --out %s/remap",
                     bin, teacher, sp, dir);
    assert_int_equal(run(cmd, &out, &err), 0);
    free(out); free(err); free(cmd);
    char *rd = m2d_path_join(dir, "remap");
    if (m2d_model_open(rd, &m)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m->cfg.num_experts, 64);
    m2d_model_close(m);
    char *rj = m2d_path_join(rd, "moe2dense.json");
    char *js = m2d_read_file(rj, NULL);
    assert_non_null(strstr(js, "\"remap\""));
    free(js); free(rj); free(rd);
    /* moe2dense.json records the precision the statistics were computed in */
    tj = m2d_path_join(sd, "moe2dense.json");
    char *mj = m2d_read_file(tj, NULL);
    cJSON *mo = cJSON_Parse(mj);
    assert_non_null(mo);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(mo, "stats"), "precision")->valuestring, "bf16");
    cJSON_Delete(mo);
    free(mj); free(tj);

    /* bad inputs, each with a clear message */
    struct { const char *args, *needle; } bad[] = {
        {"--scoring nope --grouping rr --scaling uniform -K 8", "available: "},
        {"--scoring acp --grouping rr --scaling uniform -K 4", "-K 4 is outside [k, E] = [8, 64]"},
        {"--scoring acp --grouping rr --scaling uniform -K 65", "-K 65"},
        {"--scoring acp --grouping rr --scaling uniform -K 8 --param zz=1", "zz"},
        {"--scoring acp --grouping rr --scaling uniform -K 8 --param zz", "key=value"},
        {"--scoring acp --grouping rr --scaling uniform -K 8 --target sparse", "dense or moe"},
        {"--scoring acp --grouping rr --scaling uniform -K 8 --ratio 0.5", "only for --target moe"},
        {"--scoring acp --grouping rr --scaling uniform -K 8 --groups 9", "--groups 9 is outside [1, K = 8]"},
        {"--scoring acp --grouping none --scaling uniform -K 16 --groups 8", "groups must be K = 16"},
        {"--scoring acp --grouping rr --target moe --ratio 1.5", "expected a fraction"},
        {"--scoring acp --grouping rr --target moe -K 8 --top-k 0", "--top-k"},
        {"--scoring acp --grouping rr -K 8", "--scaling is required"},
        {"--scoring acp --grouping rr --target moe -K 8 --groups 9", "--groups 9 is outside [1, K = 8]"},
        {"--scoring acp --grouping rr --target moe -K 8 --moe-router mean", "expected shared or average"},
        {"--scoring acp --grouping rr --scaling uniform -K 8 --moe-router shared", "only for --target moe"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad); i++) {
        cmd = m2d_strfmt("%s convert --model %s --stats %s --out %s/x %s", bin, teacher, sp, dir, bad[i].args);
        assert_int_not_equal(run(cmd, &out, &err), 0);
        if (!strstr(err, bad[i].needle)) fail_msg("'%s': stderr '%s' lacks '%s'", bad[i].args, err, bad[i].needle);
        free(out); free(err); free(cmd);
    }
    /* stats of another model (the student is not the teacher) */
    cmd = m2d_strfmt("%s convert --model %s --stats %s --out %s/x --scoring acp --grouping rr --scaling uniform -K 8",
                     bin, sd, sp, dir);
    assert_int_not_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "s.bin"));
    free(out); free(err); free(cmd);
    /* a truncated stats file */
    size_t n;
    char *bytes = m2d_read_file(sp, &n);
    char *tp = m2d_path_join(dir, "t.bin");
    tu_write(tp, bytes, n / 2);
    cmd = m2d_strfmt("%s analyze --model %s --stats %s", bin, teacher, tp);
    assert_int_not_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "t.bin"));
    free(out); free(err); free(cmd); free(bytes); free(tp);

    /* analyze: text and CSV */
    cmd = m2d_strfmt("%s analyze --model %s --stats %s --criteria sf,acp,do-acp --csv", bin, teacher, sp);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "layer,metric,criterion,other,value\n"));
    assert_non_null(strstr(out, "mean,overlap,sf,sf,1.000000"));
    assert_non_null(strstr(out, "mean,mu,,,"));
    assert_non_null(strstr(out, "mean,thm33_gap,,,"));
    assert_non_null(strstr(out, ",mu_S,do-acp,,"));
    assert_non_null(strstr(out, "3,erank,do-acp,,"));
    accepted_by_plots(out, dir, 0);
    free(out); free(err); free(cmd);
    cmd = m2d_strfmt("%s analyze --model %s --stats %s -K 16", bin, teacher, sp);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "K = 16"));
    free(out); free(err); free(cmd);
    /* paper 004: damage overlap, and the overlap across a second calibration (other windows) */
    cmd = m2d_strfmt("%s calibrate --model %s --data %s --out %s/s2.bin --seq-len 64 --samples 2 --seed 9", bin, teacher,
                     text, dir);
    assert_int_equal(run(cmd, &out, &err), 0);
    free(out); free(err); free(cmd);
    cmd = m2d_strfmt("%s analyze --model %s --stats %s --criteria sf --compare %s/s2.bin --csv", bin, teacher, sp, dir);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "mean,damage_overlap_25,,,"));
    assert_non_null(strstr(out, "mean,calib_overlap_50,S(1;0;2),,"));
    assert_non_null(strstr(out, "mean,calib_overlap_50,S(1;0;0),,\n")); /* constant score: n/a */
    assert_non_null(strstr(out, ",gini,,,"));
    assert_non_null(strstr(out, ",lorenz,0,,0.000000\n"));
    assert_non_null(strstr(out, ",lorenz,64,,1.000000\n"));
    assert_non_null(strstr(out, ",pearson_max,,,"));
    assert_null(strstr(out, ",pearson,"));
    accepted_by_plots(out, dir, 0);
    free(out); free(err); free(cmd);
    cmd = m2d_strfmt("%s analyze --model %s --stats %s --criteria sf --csv --pearson-matrix", bin, teacher, sp);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, ",pearson,3,3,1.000000\n")); /* C_ii = 1 */
    accepted_by_plots(out, dir, 1);
    free(out); free(err); free(cmd);
    cmd = m2d_strfmt("%s analyze --model %s --stats %s --criteria sf --compare %s/nope.bin", bin, teacher, sp, dir);
    assert_int_not_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "nope.bin"));
    free(out); free(err); free(cmd);
    /* missing options and files */
    cmd = m2d_strfmt("%s calibrate --model %s --out %s/y.bin", bin, teacher, dir);
    assert_int_not_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "--data"));
    free(out); free(err); free(cmd);
    cmd = m2d_strfmt("%s calibrate --model %s --data /nonexistent.txt --out %s/y.bin", bin, teacher, dir);
    assert_int_not_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "/nonexistent.txt"));
    free(out); free(err); free(cmd);
    char *yp = m2d_path_join(dir, "y.bin");
    assert_false(m2d_file_exists(yp));
    free(yp);
    free(sd);
    free(sp);
    tu_rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(effective_rank_analytic),
        cmocka_unit_test(coherence_analytic),
        cmocka_unit_test(analysis_on_test_checkpoint),
        cmocka_unit_test(pruned_overlaps_against_brute_force),
        cmocka_unit_test(gini_lorenz_pearson),
        cmocka_unit_test(commands_end_to_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
