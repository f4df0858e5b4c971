/* hostile: the regressions of issue 18 (reliability and security), each a case a hostile or
 * unlucky user produced on main before the fix:
 *  - the committed corpora tests/hostile/results and tests/hostile/analyze: every file is refused
 *    by report, merge (and a resumed sweep) with exit status 1 and exactly the one line recorded in
 *    the corpus' expect.txt (FILE:LINE:COL and the field), and no file in the directory changes;
 *  - tools/plots.sh: data never becomes gnuplot code (a plot is drawn from good data, the
 *    condenser analyses' Lorenz and Pearson plots included; the injections of the corpus create
 *    nothing and stop the script);
 *  - outputs never follow a planted symbolic link (m2d_write_file_atomic, the safetensors writer,
 *    a command's --out), and a failed write (disk full, injected with RLIMIT_FSIZE) leaves the old
 *    file and no temp file;
 *  - locks: a second holder is told who holds the lock; a second sweep on one CSV is refused,
 *    two concurrent sweeps never duplicate a row; a waiting holder gets the lock when it is freed;
 *  - the grid size limit, refused in one line before anything is built. */
#include "testutil.h"
#include "sweep_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "io/analyze_csv.h"
#include "io/results.h"
#include "io/st.h"
#include "model/model.h"
#include "sweep/grid.h"

/* ---------------- helpers ---------------- */

/* "name size mtime" of every entry of DIR, sorted, one a line (malloc'd): what a refused command
 * must leave as it was */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *snapshot(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    char **names = NULL;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = m2d_path_join(dir, e->d_name);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        names = realloc(names, (size_t)(n + 1) * sizeof *names);
        names[n++] = m2d_strfmt("%s %lld %lld.%09ld", e->d_name, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                                st.st_mtim.tv_nsec);
        free(p);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    char *s = m2d_strdup("");
    for (int i = 0; i < n; i++) {
        char *t = m2d_strfmt("%s%s\n", s, names[i]);
        free(s);
        free(names[i]);
        s = t;
    }
    free(names);
    return s;
}

typedef struct {
    char file[128], msg[512];
} expect_line;

/* tests/hostile/KIND/expect.txt: "FILE<TAB>MESSAGE" lines ('#' comments) */
static int read_expect(const char *kind, expect_line **out) {
    char *path = m2d_strfmt("tests/hostile/%s/expect.txt", kind);
    size_t len;
    char *text = m2d_read_file(path, &len);
    if (!text) fail_msg("%s", m2d_errmsg());
    int n = 0;
    expect_line *e = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = 0;
        e = realloc(e, (size_t)(n + 1) * sizeof *e);
        snprintf(e[n].file, sizeof e[n].file, "%s", line);
        snprintf(e[n].msg, sizeof e[n].msg, "%s", tab + 1);
        n++;
    }
    free(text);
    free(path);
    assert_true(n >= 10);
    *out = e;
    return n;
}

static char *abs_path(const char *rel) {
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    return m2d_path_join(cwd, rel);
}

/* Run CMD in DIR: the exit status must be 1, stderr one line starting "moe2dense WHO: MSG" (the
 * corpora record whole messages), DIR unchanged. */
static void expect_refused_in(const char *dir, const char *cmd, const char *who, const char *msg) {
    char *before = snapshot(dir);
    char *c = m2d_strfmt("cd '%s' && %s", dir, cmd), *out = NULL, *err = NULL;
    int rc = tu_run(c, &out, &err);
    char *want = m2d_strfmt("moe2dense %s: %s", who, msg);
    size_t el = err ? strlen(err) : 0;
    if (rc != 1 || !err || strncmp(err, want, strlen(want)) != 0 || el == 0 || err[el - 1] != '\n' ||
        strchr(err, '\n') != err + el - 1)
        fail_msg("%s\nexit %d (want 1)\nstderr: %s\nwant:   %s", cmd, rc, err ? err : "(none)", want);
    char *after = snapshot(dir);
    assert_string_equal(after, before);
    free(want);
    free(after);
    free(before);
    free(c);
    free(out);
    free(err);
}

/* ---------------- the corpora ---------------- */

static void results_corpus_refused_by_report_and_merge(void **state) {
    (void)state;
    expect_line *e;
    int n = read_expect("results", &e);
    char *bin = abs_path(tu_bin());
    for (int i = 0; i < n; i++) {
        char *dir = tu_tmpdir(), *src = m2d_strfmt("tests/hostile/results/%s", e[i].file);
        char *dst = m2d_path_join(dir, e[i].file);
        tu_copy_file(src, dst);
        char *c = m2d_strfmt("'%s' report %s --out table.md --plot-data plotdata", bin, e[i].file);
        expect_refused_in(dir, c, "report", e[i].msg);
        free(c);
        c = m2d_strfmt("'%s' report %s --format csv", bin, e[i].file);
        expect_refused_in(dir, c, "report", e[i].msg);
        free(c);
        c = m2d_strfmt("'%s' merge merged.csv %s", bin, e[i].file);
        expect_refused_in(dir, c, "merge", e[i].msg);
        free(c);
        tu_rm_rf(dir);
        free(dst);
        free(src);
        free(dir);
    }
    free(bin);
    free(e);
}

static const char *GOOD_RESULTS =
    "# experiment=hand\n"
    "config_id,scoring,grouping,scaling,K_expr,K,params,ppl,status,dedup_of\n"
    "000000000010,do-cp,rr,uniform,k,8,,3837,ok,\n"
    "000000000011,do-cp,rr,uniform,2k,16,,5137,ok,\n"
    "000000000013,do-cp,ab,uniform,k,8,,3837,ok,000000000010\n"
    "000000000014,do-cp,ab,uniform,2k,16,,2840.4,ok,\n"
    "0000000000a0,sf,rr,uniform,k,8,,20633,ok,\n"
    "0000000000b0,sf,rr,uniform,2k,16,,21112,ok,\n"
    "0000000000d0,sf,ab,uniform,k,8,,21074,ok,\n"
    "0000000000f0,sf,ab,uniform,2k,16,,,failed: non-finite perplexity,\n";

static const char *GOOD_ANALYZE =
    "# K=16\n"
    "layer,metric,criterion,other,value\n"
    "0,overlap,sf,do-cp,0.5\n"
    "mean,overlap,sf,do-cp,0.5\n"
    "mean,overlap,do-cp,sf,0.5\n"
    "mean,overlap,sf,sf,1\n"
    "mean,overlap,do-cp,do-cp,1\n"
    "mean,erank,sf,,3.2\n"
    "mean,erank_w,sf,,2.9\n"
    "mean,erank,do-cp,,5.5\n"
    "mean,erank_w,do-cp,,4.0\n"
    /* every other metric analyze writes (paper 000, 004, 001), n/a values included */
    "mean,mu,,,0.4\n"
    "mean,thm33_gap,,,\n"
    "mean,mu_S,sf,,0.3\n"
    "mean,damage_overlap_25,,,0.75\n"
    "mean,calib_overlap_50,S(1;0;0),,\n"
    "mean,calib_overlap_50,S(0;1;2),,0.5\n"
    "0,gini,,,0.25\n"
    "0,pearson_mean,,,0.01\n"
    "0,pearson_max,,,0.2\n"
    "0,lorenz,0,,0\n"
    "0,lorenz,1,,0.25\n"
    "0,lorenz,2,,1\n"
    "0,pearson,0,0,1\n"
    "0,pearson,0,1,-0.2\n"
    "0,pearson,1,0,-0.2\n"
    "0,pearson,1,1,1\n";

static void analyze_corpus_refused_by_report(void **state) {
    (void)state;
    expect_line *e;
    int n = read_expect("analyze", &e);
    char *bin = abs_path(tu_bin());
    for (int i = 0; i < n; i++) {
        char *dir = tu_tmpdir(), *src = m2d_strfmt("tests/hostile/analyze/%s", e[i].file);
        char *dst = m2d_path_join(dir, e[i].file), *good = m2d_path_join(dir, "good.csv");
        tu_copy_file(src, dst);
        tu_write(good, GOOD_RESULTS, strlen(GOOD_RESULTS));
        char *c = m2d_strfmt("'%s' report good.csv --plot-data plotdata --analyze %s", bin, e[i].file);
        expect_refused_in(dir, c, "report", e[i].msg);
        free(c);
        tu_rm_rf(dir);
        free(good);
        free(dst);
        free(src);
        free(dir);
    }
    free(bin);
    free(e);
}

/* The report's own refusals name the file too, not only the row validator's. */
static void report_refusals_name_the_file(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *bin = abs_path(tu_bin());
    const char *no_scoring = "# experiment=x\nconfig_id,grouping,scaling,K_expr,K,params,ppl,status,dedup_of\n"
                             "000000000010,rr,uniform,k,8,,12.5,ok,\n";
    char *p = m2d_path_join(dir, "nocol.csv"), *good = m2d_path_join(dir, "good.csv");
    tu_write(p, no_scoring, strlen(no_scoring));
    tu_write(good, GOOD_RESULTS, strlen(GOOD_RESULTS));
    const char *cases[][2] = {
        {"nocol.csv", "nocol.csv: field 'scoring': column missing"},
        {"nocol.csv --table 8", "nocol.csv: field 'scoring': column missing"},
        {"good.csv --table 3", "good.csv: --table 3: no D2D candidates"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *c = m2d_strfmt("'%s' report %s --out table.md", bin, cases[i][0]);
        expect_refused_in(dir, c, "report", cases[i][1]);
        free(c);
    }
    tu_rm_rf(dir);
    free(good), free(p), free(bin), free(dir);
}

/* Found by fuzz_analyze: a "# K=" line of many digits at the very end of an unterminated buffer
 * made strtol read past it (ASan: heap-buffer-overflow); the buffer here is exactly the text. */
static void analyze_k_line_at_end_of_buffer(void **state) {
    (void)state;
    const char text[] = "# K=777777777777777777776";
    char *buf = m2d_malloc(sizeof text - 1);
    memcpy(buf, text, sizeof text - 1);
    m2d_an_csv a;
    assert_int_equal(m2d_an_csv_parse("a.csv", buf, sizeof text - 1, &a), -1);
    assert_non_null(strstr(m2d_errmsg(), "a.csv:1:5: field 'K'"));
    /* found by fuzz_analyze next: a lone "\r" (an empty line at the end) made the CSV scanner step
     * past the buffer, and an empty first field copied from a NULL buffer (UBSan) */
    buf[0] = '\r';
    assert_int_equal(m2d_an_csv_parse("a.csv", buf, 1, &a), -1);
    assert_non_null(strstr(m2d_errmsg(), "a.csv"));
    buf[0] = ',';
    assert_int_equal(m2d_an_csv_parse("a.csv", buf, 1, &a), -1);
    m2d_results r;
    assert_int_equal(m2d_results_parse("r.csv", buf, 1, &r), -1);
    buf[0] = '\r';
    m2d_results_parse("r.csv", buf, 1, &r); /* an empty file: refused or empty, never out of bounds */
    m2d_results_free(&r);
    free(buf);
}

/* Counts are read as int (K, top_k, widths, windows): beyond INT_MAX is refused rather than wrapped
 * (K=4294967304 read as 8); a parameter total may be an int64. */
static const char *validate_one_row(const char *cols, const char *row) {
    char *text = m2d_strfmt("%s\n%s\n", cols, row);
    m2d_results r;
    assert_int_equal(m2d_results_parse("r.csv", text, strlen(text), &r), 0);
    int rc = m2d_results_validate(&r, "r.csv");
    m2d_results_free(&r);
    free(text);
    return rc ? m2d_errmsg() : NULL;
}

static void counts_bounded_by_their_readers(void **state) {
    (void)state;
    const char *cols = "config_id,scoring,grouping,scaling,K_expr,K,params,n_params,ppl,ppl_windows,status,dedup_of";
    assert_null(validate_one_row(cols, "000000000010,sf,rr,uniform,k,2147483647,,30532122624,12,4,ok,"));
    assert_null(validate_one_row(cols, "000000000010,sf,rr,uniform,k,8,,999999999999999999,12,4,ok,"));
    const char *bad[][2] = {
        {"000000000010,sf,rr,uniform,k,2147483648,,1,12,4,ok,", "field 'K': '2147483648' is out of range"},
        {"000000000010,sf,rr,uniform,k,99999999999999999999,,1,12,4,ok,", "field 'K': '99999999999999999999' is out of range"},
        {"000000000010,sf,rr,uniform,k,8,,1,12,4294967297,ok,", "field 'ppl_windows': '4294967297' is out of range"},
        {"000000000010,sf,rr,uniform,k,8,,1000000000000000000,12,4,ok,", "field 'n_params': '1000000000000000000' is out"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad); i++) {
        const char *msg = validate_one_row(cols, bad[i][0]);
        if (!msg || !strstr(msg, bad[i][1])) fail_msg("%s: %s (want %s)", bad[i][0], msg ? msg : "accepted", bad[i][1]);
    }
}

/* ---------------- plots.sh: data only ---------------- */

/* Run tools/plots.sh in DIR on RESULTS and ANALYZE (names inside DIR); its exit status. */
static int run_plots(const char *dir, const char *results, const char *analyze, char **err) {
    char *repo = abs_path("."), *bin = abs_path(tu_bin());
    char *c = m2d_strfmt("cd '%s' && RESULTS=%s ANALYZE=%s PLOTS_DIR=plots M2D_BIN='%s' sh '%s/tools/plots.sh'", dir,
                         results, analyze, bin, repo);
    int rc = tu_run(c, NULL, err);
    free(c);
    free(bin);
    free(repo);
    return rc;
}

static void plots_draw_data_never_code(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *good = m2d_path_join(dir, "good.csv"), *an = m2d_path_join(dir, "an.csv");
    tu_write(good, GOOD_RESULTS, strlen(GOOD_RESULTS));
    tu_write(an, GOOD_ANALYZE, strlen(GOOD_ANALYZE));
    char *err = NULL;
    /* good data: every plot is drawn (so the refusals below are about the data, not the script) */
    int rc = run_plots(dir, "good.csv", "an.csv", &err);
    if (rc) fail_msg("plots.sh on good data: exit %d: %s", rc, err ? err : "");
    free(err);
    const char *made[] = {"heatmap_sf.png", "heatmap_do-cp.png", "marginal.svg", "overlap.png", "erank.png",
                          "lorenz.png", "pearson.svg", "pearson_matrix.png"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(made); i++) {
        char *p = m2d_strfmt("%s/plots/%s", dir, made[i]);
        if (!m2d_file_exists(p)) fail_msg("plots.sh did not draw %s", p);
        free(p);
    }
    tu_rm_rf(dir);
    /* an MoE-only grid (its students are in the report's MoE section): no heat maps or marginals
     * to draw, and no failure for it; the analyze plots are drawn */
    const char *moe_only = "# experiment=m\n"
                           "config_id,scoring,grouping,scaling,K_expr,K,params,target,ratio,top_k,ppl,status,dedup_of\n"
                           "000000000002,reap,none,none,(1-0.25)E,48,,moe,0.25,8,12.5,ok,\n";
    assert_int_equal(m2d_mkdir_p(dir), 0);
    tu_write(good, moe_only, strlen(moe_only));
    tu_write(an, GOOD_ANALYZE, strlen(GOOD_ANALYZE));
    rc = run_plots(dir, "good.csv", "an.csv", &err);
    if (rc) fail_msg("plots.sh on an MoE-only grid: exit %d: %s", rc, err ? err : "");
    free(err);
    char *marginal = m2d_strfmt("%s/plots/marginal.png", dir), *lorenz = m2d_strfmt("%s/plots/lorenz.png", dir);
    assert_false(m2d_file_exists(marginal));
    assert_true(m2d_file_exists(lorenz));
    free(marginal), free(lorenz);
    tu_rm_rf(dir);
    /* Figure 7 of a grid distilled at K = k only (its K = 2k bars all absent): drawn */
    const char *k_only = "# experiment=kk\n# teacher=E=64 k=8\n"
                         "config_id,scoring,grouping,scaling,K_expr,K,params,target,ppl,mc_avg,mc_student,distill_ppl,"
                         "status,dedup_of\n"
                         "000000000001,acp,rr,uniform,k,8,,dense,900,0.485,distilled,30,ok,\n"
                         "000000000002,sf,rr,uniform,k,8,,dense,3000,0.42,distilled,40,ok,\n";
    assert_int_equal(m2d_mkdir_p(dir), 0);
    tu_write(good, k_only, strlen(k_only));
    tu_write(an, GOOD_ANALYZE, strlen(GOOD_ANALYZE));
    rc = run_plots(dir, "good.csv", "an.csv", &err);
    if (rc) fail_msg("plots.sh on a grid distilled at K = k only: exit %d: %s", rc, err ? err : "");
    free(err);
    char *fig7 = m2d_strfmt("%s/plots/figure7.png", dir);
    if (!m2d_file_exists(fig7)) fail_msg("plots.sh did not draw %s", fig7);
    free(fig7);
    tu_rm_rf(dir);
    free(good);
    free(an);
    free(dir);
    /* the injections of the corpora: refused, nothing executed, nothing drawn */
    const char *cases[][2] = {{"results/scoring_gnuplot_code.csv", NULL},
                              {NULL, "analyze/K_gnuplot_code.csv"},
                              {NULL, "analyze/criterion_code.csv"},
                              {NULL, "analyze/other_code.csv"},
                              {NULL, "analyze/lorenz_index_code.csv"},
                              {NULL, "analyze/svar_code.csv"}};
    char *repo_x = abs_path("X");
    assert_false(m2d_file_exists(repo_x));
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        dir = tu_tmpdir();
        good = m2d_path_join(dir, "r.csv");
        an = m2d_path_join(dir, "a.csv");
        if (cases[i][0]) {
            char *src = m2d_strfmt("tests/hostile/%s", cases[i][0]);
            tu_copy_file(src, good);
            free(src);
        } else {
            tu_write(good, GOOD_RESULTS, strlen(GOOD_RESULTS));
        }
        if (cases[i][1]) {
            char *src = m2d_strfmt("tests/hostile/%s", cases[i][1]);
            tu_copy_file(src, an);
            free(src);
        }
        err = NULL;
        assert_int_not_equal(run_plots(dir, "r.csv", "a.csv", &err), 0);
        assert_non_null(strstr(err, "moe2dense report: "));
        char *x = m2d_path_join(dir, "X"), *plots = m2d_path_join(dir, "plots"), *png = m2d_path_join(plots, "marginal.png");
        assert_false(m2d_file_exists(x));
        assert_false(m2d_file_exists(repo_x));
        assert_false(m2d_file_exists(png));
        free(err);
        free(x);
        free(png);
        free(plots);
        tu_rm_rf(dir);
        free(good);
        free(an);
        free(dir);
    }
    free(repo_x);
}

/* ---------------- atomic outputs ---------------- */

static int count_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".m2d-tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void atomic_write_never_follows_a_link(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *victim = m2d_path_join(dir, "victim"), *out = m2d_path_join(dir, "out.txt");
    tu_write(victim, "precious\n", 9);
    /* a link at the output itself: refused, named with its target; the target untouched */
    assert_int_equal(symlink(victim, out), 0);
    assert_int_equal(m2d_write_file_atomic(out, "evil", 4), -1);
    assert_non_null(strstr(m2d_errmsg(), "out.txt: is a symbolic link (to "));
    assert_null(strchr(m2d_errmsg(), '\n'));
    size_t n;
    char *v = m2d_read_file(victim, &n);
    assert_string_equal(v, "precious\n");
    free(v);
    struct stat st;
    assert_int_equal(lstat(out, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(unlink(out), 0);
    /* links planted at every temp name older versions used (OUT.tmp.PID for nearby pids) are not
     * opened: the temp file is created exclusively under a random name */
    for (long pid = getpid() - 2; pid <= getpid() + 2; pid++) {
        char *t = m2d_strfmt("%s.tmp.%ld", out, pid);
        assert_int_equal(symlink(victim, t), 0);
        free(t);
    }
    assert_int_equal(m2d_write_file_atomic(out, "new\n", 4), 0);
    v = m2d_read_file(victim, &n);
    assert_string_equal(v, "precious\n");
    free(v);
    v = m2d_read_file(out, &n);
    assert_string_equal(v, "new\n");
    free(v);
    assert_int_equal(lstat(out, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(count_temp_files(dir), 0);
    /* an existing file's permissions are kept */
    assert_int_equal(chmod(out, 0600), 0);
    assert_int_equal(m2d_write_file_atomic(out, "newer\n", 6), 0);
    assert_int_equal(stat(out, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* a directory at the output: refused */
    char *sub = m2d_path_join(dir, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(m2d_write_file_atomic(sub, "x", 1), -1);
    assert_non_null(strstr(m2d_errmsg(), "not a regular file"));
    /* the safetensors writer goes through the same door */
    char *st_out = m2d_path_join(dir, "model.safetensors");
    assert_int_equal(symlink(victim, st_out), 0);
    m2d_st_writer *w = m2d_st_writer_new();
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    assert_int_equal(m2d_st_writer_add(w, "t", M2D_F32, 1, shape, x), 0);
    assert_int_equal(m2d_st_writer_write(w, st_out), -1);
    assert_non_null(strstr(m2d_errmsg(), "is a symbolic link"));
    v = m2d_read_file(victim, &n);
    assert_string_equal(v, "precious\n");
    free(v);
    m2d_st_writer_free(w);
    /* a command's --out: refused with exit status 1, the link and its target as they were */
    char *csv = m2d_path_join(dir, "r.csv"), *link = m2d_path_join(dir, "table.md");
    tu_write(csv, GOOD_RESULTS, strlen(GOOD_RESULTS));
    assert_int_equal(symlink(victim, link), 0);
    char *bin = abs_path(tu_bin()), *c = m2d_strfmt("'%s' report r.csv --out table.md", bin);
    expect_refused_in(dir, c, "report", "table.md: is a symbolic link (to ");
    free(c);
    free(bin);
    tu_rm_rf(dir);
    free(csv);
    free(link);
    free(st_out);
    free(sub);
    free(out);
    free(victim);
    free(dir);
}

/* The probe's reproduction: `calibrate --out OUT` with OUT a planted link. */
static void calibrate_out_through_a_link_refused(void **state) {
    (void)state;
    char *model = tu_model_path("tiny-qwen3moe");
    const char *data = tu_data_path("train-text/wikitext-103-train-prefix/wiki.train.tokens");
    if (!model || !m2d_file_exists(data)) TU_SKIP("tiny-qwen3moe or the calibration text missing (make data)");
    char *dir = tu_tmpdir(), *victim = m2d_path_join(dir, "victim"), *out = m2d_path_join(dir, "t.stats");
    tu_write(victim, "precious\n", 9);
    assert_int_equal(symlink("victim", out), 0);
    char *bin = abs_path(tu_bin()), *abs_data = abs_path(data);
    char *abs_model = model[0] == '/' ? m2d_strdup(model) : abs_path(model);
    char *c = m2d_strfmt("'%s' calibrate --model '%s' --data '%s' --seq-len 8 --samples 1 --out t.stats", bin,
                         abs_model, abs_data);
    expect_refused_in(dir, c, "calibrate", "t.stats: is a symbolic link (to victim)");
    free(c);
    free(abs_model);
    free(abs_data);
    free(bin);
    tu_rm_rf(dir);
    free(out);
    free(victim);
    free(dir);
    free(model);
}

/* An output directory planted as a symbolic link is refused, not written through (with or without
 * a trailing slash): report --plot-data and convert --out, as distill's --out already was. */
static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n == 0;
}

static void output_dirs_never_follow_a_link(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *real = m2d_path_join(dir, "real"), *link = m2d_path_join(dir, "out");
    char *good = m2d_path_join(dir, "good.csv"), *bin = abs_path(tu_bin());
    tu_write(good, GOOD_RESULTS, strlen(GOOD_RESULTS));
    assert_int_equal(mkdir(real, 0755), 0);
    assert_int_equal(symlink("real", link), 0);
    const char *forms[] = {"out", "out/"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(forms); i++) {
        char *c = m2d_strfmt("'%s' report good.csv --plot-data %s", bin, forms[i]);
        char *want = m2d_strfmt("%s: is a symbolic link; refusing to write", forms[i]);
        expect_refused_in(dir, c, "report", want);
        assert_true(dir_is_empty(real));
        free(want), free(c);
    }
    char *model = tu_model_path("tiny-qwen3moe");
    const char *data = tu_data_path("train-text/wikitext-103-train-prefix/wiki.train.tokens");
    if (model && m2d_file_exists(data)) {
        char *abs_data = abs_path(data), *abs_model = model[0] == '/' ? m2d_strdup(model) : abs_path(model);
        char *c = m2d_strfmt("cd '%s' && '%s' calibrate --model '%s' --data '%s' --seq-len 8 --samples 1 --out t.stats",
                             dir, bin, abs_model, abs_data);
        if (tu_run(c, NULL, NULL) != 0) fail_msg("%s failed", c);
        free(c);
        c = m2d_strfmt("'%s' convert --model '%s' --stats t.stats --baseline random-ffn --out out", bin, abs_model);
        expect_refused_in(dir, c, "convert", "out: is a symbolic link; refusing to write");
        assert_true(dir_is_empty(real));
        free(c), free(abs_data), free(abs_model);
    }
    free(model);
    tu_rm_rf(dir);
    free(bin), free(good), free(link), free(real), free(dir);
}

/* Disk full, injected: FN(ARG) runs in a child process whose files may not grow beyond LIMIT bytes
 * (RLIMIT_FSIZE: write() fails with EFBIG part way; SIGXFSZ ignored), so the limit does not reach
 * the test runner. FN returns 0 when it failed the way it should. */
static void in_child_with_file_limit(rlim_t limit, int (*fn)(void *), void *arg) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        _exit(setrlimit(RLIMIT_FSIZE, &rl) ? 10 : fn(arg));
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static int write_a_megabyte(void *out) {
    size_t n = 1 << 20;
    char *big = calloc(1, n);
    int rc = m2d_write_file_atomic(out, big, n);
    free(big);
    /* the error names the output */
    return rc == -1 && strstr(m2d_errmsg(), "stats.bin: write failed") ? 0 : 11;
}

static void full_disk_leaves_old_file_and_no_temp(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *out = m2d_path_join(dir, "stats.bin");
    tu_write(out, "old\n", 4);
    in_child_with_file_limit(4096, write_a_megabyte, out);
    size_t n;
    char *v = m2d_read_file(out, &n);
    assert_string_equal(v, "old\n");
    free(v);
    assert_int_equal(count_temp_files(dir), 0); /* nothing complete-looking is left */
    tu_rm_rf(dir);
    free(out);
    free(dir);
}

static const char *ROW_COLS[] = {"config_id", "status", "ppl"}, *ROW_META[] = {"experiment=x"},
                  *ROW_IDENT[] = {"experiment"};

static int append_a_long_row(void *csv) {
    m2d_results_writer w;
    if (m2d_results_open(csv, ROW_COLS, 3, ROW_META, 1, ROW_IDENT, 1, &w, NULL)) return 11;
    char status[200];
    memset(status, 'x', sizeof status - 1);
    status[sizeof status - 1] = 0;
    memcpy(status, "failed: ", 8);
    const char *row[] = {"0000000000a2", status, ""};
    int rc = m2d_results_append(&w, row);
    m2d_results_close(&w);
    return rc == -1 && strstr(m2d_errmsg(), "r.csv: cannot append a row") ? 0 : 12;
}

/* The same for a results row: an append that does not fit is cut back off, so the file holds the
 * rows before it and no partial row (a resume then runs that configuration again). */
static void full_disk_row_append_cut_back(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *csv = m2d_path_join(dir, "r.csv");
    m2d_results_writer w;
    assert_int_equal(m2d_results_open(csv, ROW_COLS, 3, ROW_META, 1, ROW_IDENT, 1, &w, NULL), 0);
    const char *row1[] = {"0000000000a1", "ok", "12.5"};
    assert_int_equal(m2d_results_append(&w, row1), 0);
    m2d_results_close(&w);
    size_t before_n;
    char *before = m2d_read_file(csv, &before_n);
    in_child_with_file_limit(before_n + 10, append_a_long_row, csv); /* room for 10 bytes of the row */
    size_t after_n;
    char *after = m2d_read_file(csv, &after_n);
    assert_int_equal(after_n, before_n);
    assert_memory_equal(after, before, before_n); /* file bytes: exact */
    free(after);
    free(before);
    tu_rm_rf(dir);
    free(csv);
    free(dir);
}

/* ---------------- locks ---------------- */

typedef struct {
    const char *target;
    int held_ms;
} holder_arg;

static void *hold_lock(void *p) {
    holder_arg *a = p;
    m2d_lock l;
    if (m2d_lock_acquire(&l, a->target, "test", "holding", 0)) return (void *)1;
    usleep((useconds_t)a->held_ms * 1000);
    m2d_lock_release(&l);
    return NULL;
}

static void lock_names_holder_and_waits(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *target = m2d_path_join(dir, "r.csv");
    m2d_lock a, b;
    assert_int_equal(m2d_lock_acquire(&a, target, "test", "first", 0), 0);
    /* a second open of the lock file conflicts, even in this process (flock is per open file) */
    assert_int_equal(m2d_lock_acquire(&b, target, "test", "another sweep writes it", 0), -1);
    char *who = m2d_strfmt("r.csv: in use by pid %ld on host ", (long)getpid());
    assert_non_null(strstr(m2d_errmsg(), who));
    assert_non_null(strstr(m2d_errmsg(), "(another sweep writes it)"));
    free(who);
    m2d_lock_release(&a);
    char *lockfile = m2d_strfmt("%s.lock", target);
    assert_false(m2d_file_exists(lockfile));
    /* waiting: the lock is taken once the holder lets go */
    holder_arg h = {target, 300};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hold_lock, &h), 0);
    for (int i = 0; i < 200 && !m2d_file_exists(lockfile); i++) usleep(5000);
    usleep(20000);
    double t0 = m2d_now();
    assert_int_equal(m2d_lock_acquire(&b, target, "test", "waiting", 1), 0);
    assert_true(m2d_now() - t0 > 0.05); /* it did wait (the holder keeps it 300 ms) */
    void *res;
    pthread_join(t, &res);
    assert_null(res);
    m2d_lock_release(&b);
    /* a link planted at the lock file is not opened */
    char *victim = m2d_path_join(dir, "victim");
    tu_write(victim, "v", 1);
    assert_int_equal(symlink(victim, lockfile), 0);
    assert_int_equal(m2d_lock_acquire(&a, target, "test", "x", 0), -1);
    assert_non_null(strstr(m2d_errmsg(), "symbolic link"));
    size_t n;
    char *v = m2d_read_file(victim, &n);
    assert_string_equal(v, "v");
    free(v);
    free(victim);
    free(lockfile);
    tu_rm_rf(dir);
    free(target);
    free(dir);
}

/* A lock file is only ever one this code made: another name of a user's file (a hard link) or a
 * file of theirs at OUT.lock is refused, not truncated and rewritten (nor removed on release). */
static void lock_never_clobbers_a_file(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *target = m2d_path_join(dir, "merged.csv"), *lockfile = m2d_strfmt("%s.lock", target);
    char *precious = m2d_path_join(dir, "p.txt"), *good = m2d_path_join(dir, "good.csv");
    tu_write(precious, "precious\n", 9);
    tu_write(good, GOOD_RESULTS, strlen(GOOD_RESULTS));
    assert_int_equal(link(precious, lockfile), 0);
    char *bin = abs_path(tu_bin()), *c = m2d_strfmt("'%s' merge merged.csv good.csv --allow-gaps", bin);
    expect_refused_in(dir, c, "merge", "merged.csv.lock: has 2 names (a hard link)");
    m2d_lock l;
    assert_int_equal(m2d_lock_acquire(&l, target, "test", "x", 0), -1);
    assert_non_null(strstr(m2d_errmsg(), "merged.csv.lock: has 2 names"));
    /* a user's own file at the lock path, of one name */
    assert_int_equal(unlink(precious), 0);
    expect_refused_in(dir, c, "merge", "merged.csv.lock: does not hold a moe2dense lock (pid=...)");
    size_t n;
    char *v = m2d_read_file(lockfile, &n);
    assert_string_equal(v, "precious\n");
    free(v);
    /* a lock file left by a killed holder (or an empty one) is taken */
    tu_write(lockfile, "pid=1 host=h since=t\n", 21);
    assert_int_equal(m2d_lock_acquire(&l, target, "test", "x", 0), 0);
    m2d_lock_release(&l);
    tu_write(lockfile, "", 0);
    assert_int_equal(m2d_lock_acquire(&l, target, "test", "x", 0), 0);
    m2d_lock_release(&l);
    tu_rm_rf(dir);
    free(c), free(bin), free(good), free(precious), free(lockfile), free(target), free(dir);
}

/* ---------------- sweeps on one results file ---------------- */

static const char *EXPERIMENTS =
    "[experiment.grid]\n"
    "model = 'MODEL'\n"
    "backend = 'fake'\n"
    "calibration = { data = 'calib.txt', seq_len = 64, samples = 4 }\n"
    "ppl = { data = 'ppl.txt', seq_len = 64, max_windows = 2 }\n"
    "[experiment.grid.axes]\n"
    "scoring = ['sf', 'pp', 'cp', 'do-cp']\n"
    "grouping = ['rr', 'oc']\n"
    "scaling = ['uniform', 'proportional']\n"
    "K = ['k', '2k', 'E']\n";

static tu_sweep_fixture make_fixture(void) {
    const char *json = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"num_experts\": 64, \"num_experts_per_tok\": 8,"
                       " \"moe_intermediate_size\": 72, \"hidden_size\": 192, \"num_hidden_layers\": 4,"
                       " \"vocab_size\": 8192, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"head_dim\": 32}";
    return tu_sweep_fixture_make(json, EXPERIMENTS);
}

/* every configuration exactly once */
static void check_rows_unique_and_complete(const char *csv, int n_configs) {
    m2d_results r;
    if (m2d_results_read_checked(csv, &r)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(r.n_rows, n_configs);
    assert_int_equal(r.torn_bytes, 0);
    m2d_results_free(&r);
}

static void second_sweep_on_one_csv_refused(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    /* a holder of the results file's lock (as a running sweep): the sweep says who and exits 1 */
    m2d_lock l;
    assert_int_equal(m2d_lock_acquire(&l, fx.csv, "test", "a sweep", 0), 0);
    char *c = m2d_strfmt("%s sweep %s --experiment grid --out %s", tu_test_bin(), fx.toml, fx.csv);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 1);
    char *who = m2d_strfmt("moe2dense sweep: %s: in use by pid %ld on host ", fx.csv, (long)getpid());
    if (!strstr(err, who)) fail_msg("stderr: %s", err);
    assert_false(m2d_file_exists(fx.csv));
    free(who);
    free(out);
    free(err);
    m2d_lock_release(&l);
    /* two sweeps started together: exactly one runs, the other refuses; no row twice */
    char *slow = m2d_strfmt("M2D_FAKE_DELAY_MS=20 exec %s sweep %s --experiment grid --out %s --jobs 1 >/dev/null "
                            "2>%s/a.err", tu_test_bin(), fx.toml, fx.csv, fx.dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", slow, (char *)NULL);
        _exit(127);
    }
    char *lockfile = m2d_strfmt("%s.lock", fx.csv);
    for (int i = 0; i < 1000 && !m2d_file_exists(lockfile); i++) usleep(5000);
    assert_true(m2d_file_exists(lockfile));
    out = err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 1);
    assert_non_null(strstr(err, "in use by pid "));
    assert_non_null(strstr(err, "another sweep writes it"));
    free(out);
    free(err);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    check_rows_unique_and_complete(fx.csv, x.n_configs);
    assert_false(m2d_file_exists(lockfile)); /* released at the end */
    m2d_experiment_free(&x);
    free(lockfile);
    free(slow);
    free(c);
    tu_sweep_fixture_free(&fx);
}

/* A resume reads the CSV through the row validator: a corrupted row is an error naming
 * FILE:LINE:COL, the file is left as it was (a torn last line is still dropped and re-run). */
static void resume_refuses_bad_rows(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *c = m2d_strfmt("%s sweep %s --experiment grid --out %s", tu_test_bin(), fx.toml, fx.csv);
    assert_int_equal(tu_run(c, NULL, NULL), 0);
    size_t n;
    char *good = m2d_read_file(fx.csv, &n);
    /* the fourth data row's fields, with one changed at a time */
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    int st_col = m2d_results_col(&r, "status");
    assert_true(st_col >= 0);
    m2d_results_free(&r);
    const char *cases[][3] = {
        /* from, to, expected error */
        {",ok,", ",done,", "field 'status': 'done' is not a status"},
        {"\n", "\nXYZ\n", "the row has 1 fields"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        /* change the first occurrence after the column row */
        char *col_row = strstr(good, "\nconfig_id,");
        assert_non_null(col_row);
        char *hit = strstr(col_row + 1, cases[i][0]);
        assert_non_null(hit);
        char *bad = m2d_strfmt("%.*s%s%s", (int)(hit - good), good, cases[i][1], hit + strlen(cases[i][0]));
        tu_write(fx.csv, bad, strlen(bad));
        char *out = NULL, *err = NULL;
        assert_int_equal(tu_run(c, &out, &err), 1);
        if (!strstr(err, cases[i][2]) || !strstr(err, "results.csv:")) fail_msg("stderr: %s", err);
        size_t m;
        char *after = m2d_read_file(fx.csv, &m);
        assert_int_equal(m, strlen(bad));
        assert_memory_equal(after, bad, m); /* file bytes left as written: exact */
        free(after);
        free(out);
        free(err);
        free(bad);
    }
    /* a duplicated row: the last one appended again */
    char *last = good + n - 1;
    while (last > good && last[-1] != '\n') last--;
    char *dup = m2d_strfmt("%s%s", good, last);
    tu_write(fx.csv, dup, strlen(dup));
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 1);
    if (!strstr(err, "is a duplicate (also on line")) fail_msg("stderr: %s", err);
    free(out);
    free(err);
    free(dup);
    free(good);
    free(c);
    tu_sweep_fixture_free(&fx);
}

/* A grid is counted from its axes before anything is built; above the limit, one line names the
 * count and the flag that raises it (the dry run, the run and merge alike). */
static void grid_limit_refused_in_one_line(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *c = m2d_strfmt("%s sweep %s --experiment grid --dry-run --max-configs 40", tu_test_bin(), fx.toml);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 1);
    assert_non_null(strstr(err, "the grid has 48 configurations (scoring 4 x grouping 2 x scaling 2 x K 3 x params 1"));
    assert_non_null(strstr(err, "more than the limit of 40"));
    assert_non_null(strstr(err, "--max-configs N"));
    assert_ptr_equal(strchr(err, '\n'), err + strlen(err) - 1);
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s sweep %s --experiment grid --out %s --max-configs 40", tu_test_bin(), fx.toml, fx.csv);
    assert_int_equal(tu_run(c, NULL, NULL), 1);
    assert_false(m2d_file_exists(fx.csv));
    free(c);
    c = m2d_strfmt("%s sweep %s --experiment grid --dry-run --max-configs 48", tu_test_bin(), fx.toml);
    assert_int_equal(tu_run(c, NULL, NULL), 0);
    free(c);
    /* a big grid is refused at once (counted, not built): 100 params x 57 K x 16 = 91200 */
    char *params = m2d_strdup("axes.params=['a=0'"), *ks = m2d_strdup("axes.K=[8");
    for (int i = 1; i < 100; i++) {
        char *t = m2d_strfmt("%s,'a=%d'", params, i);
        free(params);
        params = t;
    }
    for (int k = 9; k <= 64; k++) {
        char *t = m2d_strfmt("%s,%d", ks, k);
        free(ks);
        ks = t;
    }
    char *p2 = m2d_strfmt("%s]", params), *k2 = m2d_strfmt("%s]", ks);
    char *big[] = {p2, k2};
    m2d_grid_set_max_configs(0);
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", big, 2, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "the grid has 91200 configurations"));
    assert_non_null(strstr(m2d_errmsg(), "more than the limit of " M2D_STR(M2D_GRID_DEFAULT_MAX_CONFIGS)));
    /* within a raised limit it is built */
    p2[strlen(p2) - 1] = 0;
    char *cut = strstr(p2, ",'a=10'");
    assert_non_null(cut);
    strcpy(cut, "]");
    m2d_grid_set_max_configs(10000);
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", big, 2, &x), 0);
    assert_int_equal(x.n_configs, 10 * 57 * 16);
    m2d_experiment_free(&x);
    free(params);
    free(ks);
    free(p2);
    free(k2);
    m2d_grid_set_max_configs(0);
    tu_sweep_fixture_free(&fx);
}

/* A killed-and-resumed sweep gives the same rows as an uninterrupted one, wall times aside: also
 * the dedup rows whose target finished before the kill (their d_dense and n_params were empty). */
static int row_of(const m2d_results *r, const char *id) {
    for (int i = 0; i < r->n_rows; i++)
        if (!strcmp(m2d_results_get(r, i, "config_id"), id)) return i;
    return -1;
}

static void kill_and_resume_equals_uninterrupted(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *whole = m2d_path_join(fx.dir, "whole.csv");
    char *c = m2d_strfmt("%s sweep %s --experiment grid --out %s --jobs 2", tu_test_bin(), fx.toml, whole);
    assert_int_equal(tu_run(c, NULL, NULL), 0);
    free(c);
    char *cmd = m2d_strfmt("M2D_FAKE_DELAY_MS=4 exec %s sweep %s --experiment grid --out %s --jobs 2 >/dev/null 2>&1",
                           tu_test_bin(), fx.toml, fx.csv);
    const int delays[] = {1000, 20000, 50000, 90000, 140000};
    for (size_t k = 0; k < M2D_ARRAY_LEN(delays); k++) tu_run_killed(cmd, delays[k]);
    c = m2d_strfmt("%s sweep %s --experiment grid --out %s --jobs 2", tu_test_bin(), fx.toml, fx.csv);
    assert_int_equal(tu_run(c, NULL, NULL), 0);
    free(c);
    m2d_results a, b;
    if (m2d_results_read_checked(whole, &a) || m2d_results_read_checked(fx.csv, &b)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(a.n_rows, b.n_rows);
    assert_int_equal(a.n_cols, b.n_cols);
    int dedup = 0;
    for (int i = 0; i < a.n_rows; i++) {
        int j = row_of(&b, a.rows[i][0]);
        assert_true(j >= 0);
        for (int col = 0; col < a.n_cols; col++) {
            if (!strcmp(a.cols[col], "wall_s")) continue;
            if (strcmp(a.rows[i][col], b.rows[j][col]) != 0)
                fail_msg("config %s, column %s: '%s' uninterrupted, '%s' resumed", a.rows[i][0], a.cols[col],
                         a.rows[i][col], b.rows[j][col]);
        }
        dedup += m2d_results_get(&a, i, "dedup_of")[0] != 0;
    }
    assert_true(dedup > 0);
    m2d_results_free(&a);
    m2d_results_free(&b);
    free(cmd);
    free(whole);
    tu_sweep_fixture_free(&fx);
}

/* A configuration the sweep could not run (its row says "failed: REASON") makes the sweep exit 3
 * after finishing the others; a non-finite perplexity is a result, not a failure to run. */
static void unrunnable_configurations_exit_non_zero(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *c = m2d_strfmt("%s sweep %s --experiment grid --out %s --set \"axes.scoring=['sf', 'failing']\"", tu_test_bin(),
                         fx.toml, fx.csv);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 3);
    assert_non_null(strstr(err, "moe2dense sweep: 12 configuration(s) could not be run"));
    free(out);
    free(err);
    /* resumed, the failed rows are still what they were: still 3 */
    assert_int_equal(tu_run(c, NULL, NULL), 3);
    free(c);
    m2d_results r;
    assert_int_equal(m2d_results_read_checked(fx.csv, &r), 0);
    assert_int_equal(r.n_rows, 24);
    m2d_results_free(&r);
    /* a NaN perplexity only: exit 0 */
    char *nan_csv = m2d_path_join(fx.dir, "nan.csv");
    c = m2d_strfmt("%s sweep %s --experiment grid --out %s --set \"axes.params=['nan']\"", tu_test_bin(), fx.toml,
                   nan_csv);
    assert_int_equal(tu_run(c, NULL, NULL), 0);
    assert_int_equal(m2d_results_read_checked(nan_csv, &r), 0);
    assert_string_equal(m2d_results_get(&r, 0, "status"), "failed: non-finite perplexity");
    m2d_results_free(&r);
    free(c);
    free(nan_csv);
    tu_sweep_fixture_free(&fx);
}

/* The smaller items: one line each, naming the file (or --set) and the field. */
static void small_messages_name_the_value(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    const char *cases[][2] = {
        {"--set 'axes.scoring=[]'", "--set: experiment 'grid': 'scoring' must be a non-empty array, not an empty array"},
        {"--set model=", "--set: experiment 'grid': 'model' must be a non-empty path, not an empty string"},
        {"--set ppl.seq_len=abc", "--set: experiment 'grid': 'ppl.seq_len' must be an integer, not string"},
        {"--set 'axes.K=[0]'", "--set: experiment 'grid': axes.K: K '0' = 0 is outside [k, E] = [8, 64]"},
        /* the value given replaced a table: blamed, not the file's missing key */
        {"--set ppl=5", "--set: experiment 'grid': 'ppl' must be a table, not integer"},
        {"--set .=5", "--set .: empty key part"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *c = m2d_strfmt("%s sweep %s --experiment grid --dry-run %s", tu_test_bin(), fx.toml, cases[i][0]);
        char *out = NULL, *err = NULL;
        int rc = tu_run(c, &out, &err);
        char *want = m2d_strfmt("moe2dense sweep: %s", cases[i][1]);
        if (rc != 1 || strncmp(err, want, strlen(want)) != 0 || strchr(err, '\n') != err + strlen(err) - 1)
            fail_msg("%s\nexit %d\nstderr: %s\nwant: %s", c, rc, err, want);
        free(want);
        free(c);
        free(out);
        free(err);
    }
    /* a size beyond int: out of range, not "must be an integer" */
    char *cfg = m2d_path_join(fx.model, "config.json");
    tu_replace_in_file(cfg, "\"hidden_size\": 192", "\"hidden_size\": 1e12");
    m2d_config mc;
    assert_int_equal(m2d_config_load(fx.model, &mc, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "config.json: field 'hidden_size': 1000000000000 is out of range"));
    free(cfg);
    tu_sweep_fixture_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(results_corpus_refused_by_report_and_merge),
        cmocka_unit_test(analyze_corpus_refused_by_report),
        cmocka_unit_test(report_refusals_name_the_file),
        cmocka_unit_test(analyze_k_line_at_end_of_buffer),
        cmocka_unit_test(counts_bounded_by_their_readers),
        cmocka_unit_test(plots_draw_data_never_code),
        cmocka_unit_test(atomic_write_never_follows_a_link),
        cmocka_unit_test(calibrate_out_through_a_link_refused),
        cmocka_unit_test(output_dirs_never_follow_a_link),
        cmocka_unit_test(full_disk_leaves_old_file_and_no_temp),
        cmocka_unit_test(full_disk_row_append_cut_back),
        cmocka_unit_test(lock_names_holder_and_waits),
        cmocka_unit_test(lock_never_clobbers_a_file),
        cmocka_unit_test(second_sweep_on_one_csv_refused),
        cmocka_unit_test(resume_refuses_bad_rows),
        cmocka_unit_test(grid_limit_refused_in_one_line),
        cmocka_unit_test(kill_and_resume_equals_uninterrupted),
        cmocka_unit_test(unrunnable_configurations_exit_non_zero),
        cmocka_unit_test(small_messages_name_the_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
