/* bench_sweep — the sweep machinery's own cost, without any model: the paper grid (350
 * configurations) through the fake backend (instant build/evaluate), so the time is grid
 * expansion + dedup + one fsync'd CSV row per configuration; plus reading the CSV back and
 * rendering the report. Median of a few repetitions; the machine is shared, treat as rough. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sweep/grid.h"
#include "sweep/report.h"
#include "io/results.h"
#include "sweep/sweep.h"
#include "base/util.h"
#include "yardstick.h"

int main(void) {
    enum { R = 5 };
    char dir[] = "/tmp/m2d-bench-sweep-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char *toml = m2d_path_join(dir, "e.toml");
    const char *text = "[experiment.g]\nmodel = '/nonexistent'\nbackend = 'fake'\n"
                       "teacher = { experts = 128, top_k = 8 }\n"
                       "calibration = { data = 'c' }\nppl = { data = 'p' }\n"
                       "[experiment.g.axes]\nscoring = ['sf', 'pp', 'ps', 'cp', 'acp', 'do-cp', 'do-acp']\n"
                       "grouping = ['rr', 'wc', 'rc', 'ab', 'oc']\nscaling = ['uniform', 'proportional']\n"
                       "K = ['k', '2k', '4k', '8k', 'E']\n";
    if (m2d_write_file_atomic(toml, text, strlen(text))) return 1;
    double t_load[R], t_sweep[R], t_read[R], t_report[R];
    int n = 0;
    for (int r = 0; r < R; r++) {
        char *csv = m2d_strfmt("%s/r%d.csv", dir, r);
        m2d_experiment x;
        double t0 = m2d_now();
        if (m2d_experiment_load(toml, "g", NULL, 0, &x)) {
            fprintf(stderr, "bench_sweep: %s\n", m2d_errmsg());
            return 1;
        }
        t_load[r] = m2d_now() - t0;
        n = x.n_configs;
        m2d_sweep_opts o = {.out = csv, .jobs = 1};
        m2d_sweep_summary s;
        t0 = m2d_now();
        if (m2d_sweep_run(&x, &o, &s)) {
            fprintf(stderr, "bench_sweep: %s\n", m2d_errmsg());
            return 1;
        }
        t_sweep[r] = m2d_now() - t0;
        m2d_results res;
        t0 = m2d_now();
        m2d_results_read(csv, &res);
        t_read[r] = m2d_now() - t0;
        FILE *devnull = fopen("/dev/null", "w");
        t0 = m2d_now();
        m2d_report_write(&res, M2D_REPORT_MD, devnull);
        t_report[r] = m2d_now() - t0;
        fclose(devnull);
        m2d_results_free(&res);
        m2d_experiment_free(&x);
        free(csv);
    }
    qsort(t_load, R, sizeof(double), bench_cmp_double);
    qsort(t_sweep, R, sizeof(double), bench_cmp_double);
    qsort(t_read, R, sizeof(double), bench_cmp_double);
    qsort(t_report, R, sizeof(double), bench_cmp_double);
    printf("paper grid, %d configurations, fake backend (no model), median of %d\n", n, R);
    printf("  load experiments.toml + expand grid   %8.2f ms\n", 1e3 * t_load[R / 2]);
    printf("  sweep (dedup + fsync'd row each)      %8.2f ms  (%.2f ms per configuration)\n", 1e3 * t_sweep[R / 2],
           1e3 * t_sweep[R / 2] / n);
    printf("  read the CSV back (libcsv)            %8.2f ms\n", 1e3 * t_read[R / 2]);
    printf("  report (md table + summary)           %8.2f ms\n", 1e3 * t_report[R / 2]);
    char *cmd = m2d_strfmt("rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_sweep: could not remove %s\n", dir);
    free(cmd);
    free(toml);
    return 0;
}
