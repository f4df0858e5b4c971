/* slurm — the sbatch script of a sharded sweep (see slurm.h). */
#include "sweep/slurm.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "sweep/grid.h"

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

/* "TEXT" + PATTERN as sbatch reads an #SBATCH filename: TEXT literal (backslash escapes, %% for
 * %), then the Slurm filename PATTERN (e.g. %A_%a.log) as is */
static char *sbatch_quote(const char *text, const char *pattern) {
    size_t n = 3 + strlen(pattern);
    for (const char *p = text; *p; p++) n += 2;
    char *o = m2d_malloc(n), *q = o;
    *q++ = '"';
    for (const char *p = text; *p; p++) {
        if (*p == '"' || *p == '\\') *q++ = '\\';
        if (*p == '%') *q++ = '%';
        *q++ = *p;
    }
    strcpy(q, pattern);
    q += strlen(pattern);
    *q++ = '"';
    *q = 0;
    return o;
}

/* A path that goes into the script or a printed command: no control characters (a newline
 * would end the #SBATCH or shell line it is on). */
static int check_path(const char *what, const char *path) {
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return m2d_err("slurm: %s '%s' holds a control character; refusing to put it in a script", what, path);
    return 0;
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

static int check_opts(const m2d_slurm_opts *o) {
    if (o->shards < 1) return m2d_err("slurm: --shards %d: must be at least 1", o->shards);
    if (o->cpus_per_task < 1) return m2d_err("slurm: --cpus-per-task %d: must be at least 1", o->cpus_per_task);
    if ((o->partition && check_value("--partition", o->partition)) ||
        (o->gpus_per_task && check_value("--gpus-per-task", o->gpus_per_task)) ||
        (o->time_limit && check_value("--time", o->time_limit)) || (o->mem && check_value("--mem", o->mem)) ||
        check_value("--experiment", o->experiment))
        return -1;
    /* a count of 0 ("0", "h100:0") gives the task no GPU, yet its sweep would ask for --device cuda */
    const char *count = o->gpus_per_task ? strrchr(o->gpus_per_task, ':') : NULL;
    count = count ? count + 1 : o->gpus_per_task;
    if (count && strspn(count, "0") == strlen(count))
        return m2d_err("slurm: --gpus-per-task %s: gives no GPU (leave it out for tasks on CPUs)", o->gpus_per_task);
    return 0;
}

/* The binary the tasks run: the given one, or this process's executable. */
static char *binary_path(const m2d_slurm_opts *o) {
    if (o->binary) return absolute(o->binary);
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        m2d_err("slurm: cannot find this binary's path (/proc/self/exe)");
        return NULL;
    }
    self[len] = 0;
    return m2d_strdup(self);
}

/* " --set 'k=v'" for every override */
static char *set_args(const m2d_slurm_opts *o) {
    char *args = m2d_strdup("");
    for (int i = 0; i < o->n_sets; i++) {
        char *q = shq(o->sets[i]);
        char *next = m2d_strfmt("%s --set %s", args, q);
        free(q);
        free(args);
        args = next;
    }
    return args;
}

/* the optional #SBATCH lines */
static char *sbatch_options(const m2d_slurm_opts *o) {
    const char *p = o->partition, *g = o->gpus_per_task, *t = o->time_limit, *m = o->mem;
    return m2d_strfmt("%s%s%s%s%s%s%s%s%s%s%s%s", p ? "#SBATCH --partition=" : "", p ? p : "", p ? "\n" : "",
                      g ? "#SBATCH --gpus-per-task=" : "", g ? g : "", g ? "\n" : "", t ? "#SBATCH --time=" : "",
                      t ? t : "", t ? "\n" : "", m ? "#SBATCH --mem=" : "", m ? m : "", m ? "\n" : "");
}

typedef struct {
    const char *bin, *dir, *qscript, *sets, *limit;
    int n_configs;
} script_parts;

static char *render(const m2d_slurm_opts *o, const script_parts *sp) {
    char now[64], cwd[PATH_MAX];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char *exp_abs = absolute(o->experiments);
    char *qbin = shq(sp->bin), *qexpfile = shq(exp_abs), *qdir = shq(sp->dir), *qexp = shq(o->experiment);
    char *workdir = shq(getcwd(cwd, sizeof cwd) ? cwd : "."), *opt_lines = sbatch_options(o);
    char *log = m2d_strfmt("%s/%s-", sp->dir, o->experiment), *qlog = sbatch_quote(log, "%A_%a.log");
    const char *exp = o->experiment;
    int n = o->shards, c = o->cpus_per_task;
    char *text = m2d_strfmt(
        "#!/bin/bash\n"
        "# Generated by moe2dense %s slurm on %s: experiment %s, %d configurations in %d shards.\n"
        "# Submit: sbatch %s\n"
        "#SBATCH --job-name=m2d-%s\n"
        "#SBATCH --array=1-%d\n"
        "#SBATCH --cpus-per-task=%d\n"
        "#SBATCH --ntasks=1\n"
        "#SBATCH --output=%s\n"
        "%s"
        "set -euo pipefail\n"
        "cd %s\n"
        "shard=${SLURM_ARRAY_TASK_ID:?this script runs as a Slurm array task}\n"
        "export M2D_THREADS=${SLURM_CPUS_PER_TASK:-%d}\n"
        "exec %s sweep %s --experiment %s --shard \"$shard/%d\" \\\n"
        "  --out %s/%s.shard-\"$shard\"-of-%d.csv --threads \"$M2D_THREADS\"%s%s%s\n",
        M2D_VERSION, now, exp, sp->n_configs, n, sp->qscript, exp, n, c, qlog, opt_lines, workdir, c, qbin,
        qexpfile, qexp, n, qdir, exp, n, sp->limit, sp->sets,
        /* a task given GPUs runs its engines on them: Slurm's CUDA_VISIBLE_DEVICES makes its first cuda */
        o->gpus_per_task ? " --device cuda" : "");
    free(exp_abs);
    free(qbin);
    free(qexpfile);
    free(qdir);
    free(qexp);
    free(workdir);
    free(opt_lines);
    free(log);
    free(qlog);
    return text;
}

/* `moe2dense merge` of the shard CSVs, every word quoted (the glob stays outside the quotes); the
 * experiments file absolute, as in the script (the merge may run from another directory) */
static char *merge_command(const m2d_slurm_opts *o, const char *bin, const char *dir, const char *sets,
                           const char *limit) {
    char *out = m2d_strfmt("%s.csv", o->experiment), *exps = absolute(o->experiments);
    char *qbin = shq(bin), *qout = shq(out), *qdir = shq(dir), *qname = shq(o->experiment), *qexps = shq(exps);
    free(exps);
    char *cmd = m2d_strfmt("%s merge %s %s/%s.shard-*-of-%d.csv --experiments %s --experiment %s%s%s", qbin, qout, qdir,
                           qname, o->shards, qexps, qname, limit, sets);
    free(out);
    free(qbin);
    free(qout);
    free(qdir);
    free(qname);
    free(qexps);
    return cmd;
}

/* The results directory (created) and the script path, both absolute. */
static int resolve_paths(const m2d_slurm_opts *o, char **dir, char **script) {
    char *d = o->results_dir ? m2d_strdup(o->results_dir) : m2d_strfmt("results/slurm-%s", o->experiment);
    *dir = absolute(d);
    free(d);
    if (m2d_mkdir_p(*dir)) return -1;
    char *s = o->script ? m2d_strdup(o->script) : m2d_strfmt("%s/%s.sbatch", *dir, o->experiment);
    *script = absolute(s);
    free(s);
    return 0;
}

int m2d_slurm_write(const m2d_slurm_opts *o, m2d_slurm_job *job) {
    memset(job, 0, sizeof *job);
    if (check_opts(o)) return -1;
    m2d_experiment x = {0};
    char *dir = NULL, *bin = NULL, *sets = NULL, *text = NULL;
    int rc = m2d_experiment_load(o->experiments, o->experiment, o->sets, o->n_sets, &x);
    /* a shard past the groups of configurations that share a student would run none, yet load
     * the teacher, calibrate and score it on a node of its own */
    int groups = rc == 0 ? m2d_grid_shard_groups(&x) : 0;
    if (rc == 0 && o->shards > groups)
        rc = m2d_err("slurm: --shards %d exceeds the %d group(s) of configurations of experiment '%s' that can run "
                     "apart (%d configurations; those that share a student stay in one shard)", o->shards, groups,
                     o->experiment, x.n_configs);
    if (rc == 0) rc = resolve_paths(o, &dir, &job->script_path);
    if (rc == 0 && !(bin = binary_path(o))) rc = -1;
    if (rc == 0 && (check_path("binary", bin) || check_path("results directory", dir) ||
                    check_path("script", job->script_path) || check_path("experiments file", o->experiments)))
        rc = -1;
    char *limit = o->max_configs > 0 ? m2d_strfmt(" --max-configs %lld", o->max_configs) : m2d_strdup("");
    char *qscript = shq(job->script_path ? job->script_path : "");
    if (rc == 0) {
        sets = set_args(o);
        script_parts sp = {bin, dir, qscript, sets, limit, x.n_configs};
        text = render(o, &sp);
        rc = m2d_write_file_atomic(job->script_path, text, strlen(text));
    }
    if (rc == 0) {
        job->n_configs = x.n_configs;
        job->submit_command = m2d_strfmt("sbatch %s", qscript);
        job->merge_command = merge_command(o, bin, dir, sets, limit);
    }
    free(limit);
    free(qscript);
    m2d_experiment_free(&x);
    free(dir);
    free(bin);
    free(sets);
    free(text);
    if (rc) m2d_slurm_job_free(job);
    return rc;
}

void m2d_slurm_job_free(m2d_slurm_job *job) {
    free(job->script_path);
    free(job->submit_command);
    free(job->merge_command);
    memset(job, 0, sizeof *job);
}
