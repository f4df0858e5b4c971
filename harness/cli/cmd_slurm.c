/* moe2dense slurm — write an sbatch script running a sweep as a Slurm job array (one shard per task). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "sweep/grid.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense slurm EXPERIMENTS.toml --experiment NAME --shards N [options]\n"
    "\n"
    "Writes an sbatch script for a Slurm job array: array task I runs\n"
    "  moe2dense sweep EXPERIMENTS.toml --experiment NAME --shard I/N --out DIR/NAME.shard-I-of-N.csv\n"
    "(each shard resumes if re-submitted), and prints the sbatch and merge commands. Paths in the\n"
    "script are absolute, so it can be submitted from anywhere on a shared filesystem.\n"
    "\n"
    "options:\n"
    "  --experiment NAME     experiment to run (required)\n"
    "  --shards N            array size (required; at most the number of configurations)\n"
    "  --partition P         #SBATCH --partition\n"
    "  --gpus-per-task G     #SBATCH --gpus-per-task\n"
    "  --time T              #SBATCH --time (e.g. 04:00:00)\n"
    "  --cpus-per-task C     #SBATCH --cpus-per-task (default 1); the sweep uses C threads\n"
    "  --results-dir DIR     where shard CSVs and logs go (default: results/slurm-NAME)\n"
    "  --script FILE         where to write the script (default: DIR/NAME.sbatch)\n"
    "  --set KEY=VALUE       experiment overrides passed on to every shard (repeatable)\n"
    "\n"
    "Each shard computes (or reuses) the calibration cache; with a shared cache_dir the first\n"
    "shard to finish calibrating writes it atomically and later shards reuse it.\n";

/* 'text' with embedded quotes escaped for a POSIX shell */
static char *shq(const char *s) {
    size_t n = 3;
    for (const char *p = s; *p; p++) n += *p == '\'' ? 4 : 1;
    char *o = m2d_malloc(n), *q = o;
    *q++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(q, "'\\''", 4);
            q += 4;
        } else {
            *q++ = *p;
        }
    }
    *q++ = '\'';
    *q = 0;
    return o;
}

static char *absolute(const char *path) {
    if (path[0] == '/') return m2d_strdup(path);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return m2d_strdup(path);
    return m2d_path_join(cwd, path);
}

/* Slurm option values must not smuggle newlines or shell syntax into #SBATCH lines */
static int check_value(const char *opt, const char *v) {
    for (const char *p = v; *p; p++)
        if (!(((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr(":-_.,=", *p))))
            return m2d_err("slurm: %s: '%s' has a character Slurm would not accept here", opt, v);
    return 0;
}

static int cmd_slurm_run(int argc, char **argv) {
    char **sets = NULL;
    int n_sets = 0;
    if (m2d_extract_sets("slurm", &argc, argv, &sets, &n_sets)) {
        free(sets);
        return m2d_cmd_fail("slurm");
    }
    const char *exp = NULL, *shards = NULL, *partition = NULL, *gpus = NULL, *tlimit = NULL, *cpus = "1",
               *dir = NULL, *script = NULL;
    m2d_opt opts[] = {{"--experiment", 1, &exp, NULL},        {"--shards", 1, &shards, NULL},
                      {"--partition", 1, &partition, NULL},   {"--gpus-per-task", 1, &gpus, NULL},
                      {"--time", 1, &tlimit, NULL},           {"--cpus-per-task", 1, &cpus, NULL},
                      {"--results-dir", 1, &dir, NULL},       {"--script", 1, &script, NULL},
                      {0}};
    char *pos[1];
    int npos = 0, rc = 1;
    m2d_experiment x = {0};
    char *dir_abs = NULL, *script_path = NULL, *bin = NULL, *expfile = NULL, *text = NULL, *workdir = NULL;
    long n, c;
    if (m2d_parse_opts("slurm", argc, argv, opts, pos, 1, &npos)) goto fail;
    if (npos != 1 || !exp || !shards) {
        m2d_err("slurm: expected EXPERIMENTS.toml --experiment NAME --shards N (see 'moe2dense help slurm')");
        goto fail;
    }
    if (m2d_parse_int("slurm", "--shards", shards, 1, 100000, &n) ||
        m2d_parse_int("slurm", "--cpus-per-task", cpus, 1, 4096, &c))
        goto fail;
    if ((partition && check_value("--partition", partition)) || (gpus && check_value("--gpus-per-task", gpus)) ||
        (tlimit && check_value("--time", tlimit)) || check_value("--experiment", exp))
        goto fail;
    if (m2d_experiment_load(pos[0], exp, sets, n_sets, &x)) goto fail;
    if (n > x.n_configs) {
        m2d_err("slurm: --shards %ld exceeds the %d configurations of experiment '%s'", n, x.n_configs, exp);
        goto fail;
    }
    {
        char *d = dir ? m2d_strdup(dir) : m2d_strfmt("results/slurm-%s", exp);
        dir_abs = absolute(d);
        free(d);
    }
    if (m2d_mkdir_p(dir_abs)) goto fail;
    {
        char *s = script ? m2d_strdup(script) : m2d_strfmt("%s/%s.sbatch", dir_abs, exp);
        script_path = absolute(s);
        free(s);
    }
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        m2d_err("slurm: cannot find this binary's path (/proc/self/exe)");
        goto fail;
    }
    self[len] = 0;
    bin = shq(self);
    {
        char *e = absolute(pos[0]);
        expfile = shq(e);
        free(e);
    }
    {
        char cwd[PATH_MAX];
        workdir = shq(getcwd(cwd, sizeof cwd) ? cwd : ".");
    }
    char *set_args = m2d_strdup("");
    for (int i = 0; i < n_sets; i++) {
        char *q = shq(sets[i]);
        char *next = m2d_strfmt("%s --set %s", set_args, q);
        free(q);
        free(set_args);
        set_args = next;
    }
    char now[64];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char *qdir = shq(dir_abs), *qexp = shq(exp);
    char *opt_lines = m2d_strfmt("%s%s%s%s%s%s%s%s%s", partition ? "#SBATCH --partition=" : "",
                                 partition ? partition : "", partition ? "\n" : "", gpus ? "#SBATCH --gpus-per-task=" : "",
                                 gpus ? gpus : "", gpus ? "\n" : "", tlimit ? "#SBATCH --time=" : "",
                                 tlimit ? tlimit : "", tlimit ? "\n" : "");
    text = m2d_strfmt(
        "#!/bin/bash\n"
        "# Generated by moe2dense %s slurm on %s: experiment %s, %d configurations in %ld shards.\n"
        "# Submit: sbatch %s\n"
        "#SBATCH --job-name=m2d-%s\n"
        "#SBATCH --array=1-%ld\n"
        "#SBATCH --cpus-per-task=%ld\n"
        "#SBATCH --ntasks=1\n"
        "#SBATCH --output=%s/%s-%%A_%%a.log\n"
        "%s"
        "set -euo pipefail\n"
        "cd %s\n"
        "shard=${SLURM_ARRAY_TASK_ID:?this script runs as a Slurm array task}\n"
        "export M2D_THREADS=${SLURM_CPUS_PER_TASK:-%ld}\n"
        "exec %s sweep %s --experiment %s --shard \"$shard/%ld\" \\\n"
        "  --out %s/%s.shard-\"$shard\"-of-%ld.csv --threads \"$M2D_THREADS\"%s\n",
        M2D_VERSION, now, exp, x.n_configs, n, script_path, exp, n, c, dir_abs, exp, opt_lines, workdir, c, bin,
        expfile, qexp, n, qdir, exp, n, set_args);
    free(qdir);
    free(qexp);
    free(opt_lines);
    if (m2d_write_file_atomic(script_path, text, strlen(text))) {
        free(set_args);
        goto fail;
    }
    printf("wrote %s (%ld array tasks, %d configurations)\n", script_path, n, x.n_configs);
    printf("submit: sbatch %s\n", script_path);
    printf("merge:  %s merge %s.csv %s/%s.shard-*-of-%ld.csv --experiments %s --experiment %s%s\n", self, exp,
           dir_abs, exp, n, pos[0], exp, set_args);
    free(set_args);
    rc = 0;
    goto done;
fail:
    rc = m2d_cmd_fail("slurm");
done:
    m2d_experiment_free(&x);
    free(dir_abs);
    free(script_path);
    free(bin);
    free(expfile);
    free(workdir);
    free(text);
    free(sets);
    return rc;
}

M2D_COMMAND(slurm, "slurm", "write an sbatch script that runs a sweep as a Slurm job array of shards", USAGE,
            cmd_slurm_run)
