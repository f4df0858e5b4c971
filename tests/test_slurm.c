/* slurm: a real single-node Slurm (slurmctld + slurmd on localhost, AuthType=auth/none, generated
 * slurm.conf in a temp dir) runs the job array written by `moe2dense slurm` on a fake-backend
 * experiment (so the CLI is tu_test_bin(), which links that backend); the shard CSVs are merged
 * and checked against the grid. slurm-wlm comes from `make deps` (this test installs nothing);
 * skips (with the reason) only if it is absent or the daemons cannot start.
 * Bounded: daemons get 30 s to come up, the array 120 s to finish. */
#include "testutil.h"
#include "sweep_fixture.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sweep/grid.h"
#include "sweep/slurm.h"
#include "io/results.h"
#include "base/util.h"

static pid_t spawn(const char *const argv[], const char *log) {
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(fileno(stdout), 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 50; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* the daemons are stopped by the teardown even when an assertion fails mid-test */
static pid_t g_ctld, g_d;

static int stop_daemons(void **state) {
    (void)state;
    stop(g_d);
    stop(g_ctld);
    g_d = g_ctld = 0;
    return 0;
}

/* the fake teacher: only its shape matters (E = 32, k = 4) */
static const char *TINY_CONFIG = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 32,"
                                " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"moe_intermediate_size\": 16,"
                                " \"num_experts\": 32, \"num_experts_per_tok\": 4}";
static const char *TINY = "[experiment.tiny]\nmodel = 'MODEL'\nbackend = 'fake'\n"
                         "calibration = { data = 'c.txt' }\nppl = { data = 'p.txt' }\n"
                         "[experiment.tiny.axes]\nscoring = ['sf', 'cp']\ngrouping = ['rr', 'oc']\n"
                         "scaling = ['uniform', 'proportional']\nK = ['k', '2k', 'E']\n";

static int have_slurm(void) {
    return tu_run("command -v slurmctld && command -v slurmd && command -v sbatch && command -v sinfo", NULL,
                  NULL) == 0;
}

static void job_array_runs_shards_and_merge_checks_them(void **state) {
    (void)state;
    if (!have_slurm()) TU_SKIP("slurm-wlm is not installed (make deps installs it)");
    char host[256];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    char *dot = strchr(host, '.');
    if (dot) *dot = 0;
    /* a small fake-backend experiment: 2 x 2 x 2 x 3 = 24 configurations, 3 shards */
    tu_sweep_fixture fx = tu_sweep_fixture_make(TINY_CONFIG, TINY);
    const char *dir = fx.dir, *toml = fx.toml;
    int port = 20000 + (int)(getpid() % 20000);
    char *conf = m2d_path_join(dir, "slurm.conf");
    char *text = m2d_strfmt(
        "ClusterName=m2dtest\nSlurmctldHost=%s\nAuthType=auth/none\nCredType=cred/none\n"
        "SlurmUser=%s\nSlurmdUser=root\nSlurmctldPort=%d\nSlurmdPort=%d\n"
        "StateSaveLocation=%s/state\nSlurmdSpoolDir=%s/spool\nSlurmctldPidFile=%s/ctld.pid\n"
        "SlurmdPidFile=%s/d.pid\nProctrackType=proctrack/pgid\nTaskPlugin=task/none\nReturnToService=2\n"
        "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        "MpiDefault=none\nJobCompType=jobcomp/none\nJobAcctGatherType=jobacct_gather/none\n"
        "AccountingStorageType=accounting_storage/none\nSlurmctldLogFile=%s/ctld.log\nSlurmdLogFile=%s/d.log\n"
        "NodeName=%s CPUs=%ld State=UNKNOWN\nPartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP\n",
        host, getenv("USER") && geteuid() != 0 ? getenv("USER") : "root", port, port + 1, dir, dir, dir, dir, dir,
        dir, host, sysconf(_SC_NPROCESSORS_ONLN), host);
    tu_write(conf, text, strlen(text));
    free(text);
    char *state_dir = m2d_path_join(dir, "state"), *spool = m2d_path_join(dir, "spool");
    m2d_mkdir_p(state_dir);
    m2d_mkdir_p(spool);
    setenv("SLURM_CONF", conf, 1);
    char *ctld_log = m2d_path_join(dir, "ctld.out"), *d_log = m2d_path_join(dir, "d.out");
    const char *ctld_argv[] = {"slurmctld", "-D", "-i", "-f", conf, NULL};
    const char *d_argv[] = {"slurmd", "-D", "-f", conf, NULL};
    g_ctld = spawn(ctld_argv, ctld_log);
    usleep(500000);
    g_d = spawn(d_argv, d_log);
    int up = 0;
    for (int i = 0; i < 60 && !up; i++) {
        char *out = NULL;
        if (tu_run("sinfo -h -o %t", &out, NULL) == 0 && out && strstr(out, "idle")) up = 1;
        free(out);
        if (!up) usleep(500000);
    }
    if (!up) {
        stop_daemons(NULL);
        char *log = m2d_read_file(ctld_log, NULL);
        print_message("slurmctld output:\n%s\n", log ? log : "(none)");
        free(log);
        tu_sweep_fixture_free(&fx);
        TU_SKIP("the single-node Slurm daemons did not come up within 30 s");
    }

    char bin[PATH_MAX];
    if (!realpath(tu_test_bin(), bin)) fail_msg("cannot resolve %s", tu_test_bin());
    char *res = m2d_path_join(dir, "res");
    char *c = m2d_strfmt("cd %s && %s slurm %s --experiment tiny --shards 3 --results-dir %s --time 00:05:00", dir, bin,
                         toml, res);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(out, "sbatch "));
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("timeout 120 sbatch --wait %s/tiny.sbatch", res);
    int rc = tu_run(c, &out, &err);
    if (rc != 0) print_message("sbatch: rc %d\n%s\n%s\n", rc, out ? out : "", err ? err : "");
    assert_int_equal(rc, 0);
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s merge %s/merged.csv %s/tiny.shard-1-of-3.csv %s/tiny.shard-2-of-3.csv %s/tiny.shard-3-of-3.csv "
                   "--experiments %s --experiment tiny", bin, dir, res, res, res, toml);
    rc = tu_run(c, &out, &err);
    if (rc != 0) print_message("merge: %s\n", err ? err : "");
    assert_int_equal(rc, 0);
    free(c);
    free(out);
    free(err);
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(toml, "tiny", NULL, 0, &x), 0);
    assert_int_equal(x.n_configs, 24);
    char *merged = m2d_path_join(dir, "merged.csv");
    m2d_results r;
    assert_int_equal(m2d_results_read(merged, &r), 0);
    assert_int_equal(r.n_rows, 24);
    for (int i = 0; i < r.n_rows; i++) {
        assert_string_equal(m2d_results_get(&r, i, "config_id"), x.configs[i].id);
        assert_string_equal(m2d_results_get(&r, i, "status"), "ok");
    }
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    stop_daemons(NULL);
    tu_sweep_fixture_free(&fx);
    free(merged);
    free(res);
    free(ctld_log);
    free(d_log);
    free(state_dir);
    free(spool);
    free(conf);
}

/* m2d_slurm_write in-process (no Slurm needed): the script's lines, quoting, paths and errors. */
static void script_lines_quoting_and_errors(void **state) {
    (void)state;
    tu_sweep_fixture fx = tu_sweep_fixture_make(TINY_CONFIG, TINY);
    char *res = m2d_path_join(fx.dir, "res dir"), *sets[] = {"description=it's", "ppl.max_windows=2"};
    m2d_slurm_opts o = {.experiments = fx.toml, .experiment = "tiny", .sets = sets, .n_sets = 2, .shards = 3,
                        .cpus_per_task = 2, .partition = "debug", .time_limit = "00:05:00", .results_dir = res,
                        .binary = "/opt/m2d's bin/moe2dense"};
    m2d_slurm_job job;
    assert_int_equal(m2d_slurm_write(&o, &job), 0);
    assert_int_equal(job.n_configs, 24);
    char *want_path = m2d_path_join(res, "tiny.sbatch");
    assert_string_equal(job.script_path, want_path);
    char *text = m2d_read_file(job.script_path, NULL);
    assert_non_null(text);
    const char *lines[] = {
        "#!/bin/bash\n", "experiment tiny, 24 configurations in 3 shards.\n", "#SBATCH --array=1-3\n",
        "#SBATCH --cpus-per-task=2\n", "#SBATCH --partition=debug\n", "#SBATCH --time=00:05:00\n",
        "export M2D_THREADS=${SLURM_CPUS_PER_TASK:-2}\n",
        "exec '/opt/m2d'\\''s bin/moe2dense' sweep '", "' --experiment 'tiny' --shard \"$shard/3\" \\\n",
        "/res dir'/tiny.shard-\"$shard\"-of-3.csv --threads \"$M2D_THREADS\" --set 'description=it'\\''s' "
        "--set 'ppl.max_windows=2'\n"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(lines); i++)
        if (!strstr(text, lines[i])) fail_msg("script lacks '%s':\n%s", lines[i], text);
    assert_null(strstr(text, "--gpus-per-task")); /* not asked for */
    assert_null(strstr(text, "--device"));        /* so the engines stay on the CPU */
    char *exec_toml = m2d_strfmt("sweep '%s'", fx.toml); /* absolute already: as given */
    assert_non_null(strstr(text, exec_toml));
    /* the printed commands are quoted for copy-paste: a path with a quote, a space or '$' stays one word */
    assert_non_null(strstr(job.merge_command, "'/opt/m2d'\\''s bin/moe2dense' merge 'tiny.csv' '"));
    assert_non_null(strstr(job.merge_command, "/res dir'/'tiny'.shard-*-of-3.csv --experiments '"));
    char *submit = m2d_strfmt("sbatch '%s'", want_path);
    assert_string_equal(job.submit_command, submit);
    free(submit);
    /* #SBATCH --output is quoted the way sbatch reads it: the space stays in the path */
    char *out_line = m2d_strfmt("#SBATCH --output=\"%s/tiny-%%A_%%a.log\"\n", res);
    if (!strstr(text, out_line)) fail_msg("script lacks '%s':\n%s", out_line, text);
    free(out_line);
    free(exec_toml);
    free(text);
    m2d_slurm_job_free(&job);
    /* GPUs asked for: the tasks get them and their sweeps run on the first one */
    o.gpus_per_task = "1", o.mem = "80G";
    assert_int_equal(m2d_slurm_write(&o, &job), 0);
    text = m2d_read_file(job.script_path, NULL);
    assert_non_null(strstr(text, "#SBATCH --gpus-per-task=1\n"));
    assert_non_null(strstr(text, "#SBATCH --mem=80G\n"));
    assert_non_null(strstr(text, "--set 'ppl.max_windows=2' --device cuda\n"));
    o.mem = NULL;
    free(text);
    m2d_slurm_job_free(&job);
    /* a count of no GPU would still ask its sweeps for --device cuda: refused */
    const char *none[] = {"0", "h100:0", "00"};
    for (int i = 0; i < 3; i++) {
        o.gpus_per_task = none[i];
        assert_int_equal(m2d_slurm_write(&o, &job), -1);
        assert_non_null(strstr(m2d_errmsg(), "gives no GPU"));
    }
    o.gpus_per_task = "h100:2";
    assert_int_equal(m2d_slurm_write(&o, &job), 0);
    o.gpus_per_task = NULL;
    free(want_path);
    m2d_slurm_job_free(&job);
    /* a results directory with '"', '%' and '$': escaped for sbatch, single-quoted for the shell */
    char *odd = m2d_path_join(fx.dir, "a \"q\" 50% $HOME");
    o.results_dir = odd;
    assert_int_equal(m2d_slurm_write(&o, &job), 0);
    text = m2d_read_file(job.script_path, NULL);
    out_line = m2d_strfmt("#SBATCH --output=\"%s/a \\\"q\\\" 50%%%% $HOME/tiny-%%A_%%a.log\"\n", fx.dir);
    if (!strstr(text, out_line)) fail_msg("script lacks '%s':\n%s", out_line, text);
    submit = m2d_strfmt("sbatch '%s/a \"q\" 50%% $HOME/tiny.sbatch'", fx.dir);
    assert_string_equal(job.submit_command, submit);
    free(submit);
    free(out_line);
    free(text);
    m2d_slurm_job_free(&job);
    o.results_dir = res;

    /* values that would reach #SBATCH lines or exceed the grid are refused; nothing is written */
    char *other = m2d_path_join(fx.dir, "other.sbatch");
    o.script = other;
    o.partition = "debug\n#SBATCH --uid=0";
    assert_int_equal(m2d_slurm_write(&o, &job), -1);
    assert_non_null(strstr(m2d_errmsg(), "slurm: --partition: "));
    o.partition = NULL;
    /* as many shards as groups of configurations that share a student: each runs some; one more
     * would run none (yet load, calibrate and score the teacher) */
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "tiny", sets, 2, &x), 0);
    int groups = m2d_grid_shard_groups(&x);
    assert_true(groups > 3 && groups < x.n_configs); /* K = k configurations share a student */
    for (int i = 1; i <= groups; i++) {
        int *idx, n = m2d_grid_shard(&x, i, groups, &idx);
        assert_true(n > 0);
        free(idx);
    }
    o.shards = groups + 1;
    assert_int_equal(m2d_slurm_write(&o, &job), -1);
    char *want = m2d_strfmt("--shards %d exceeds the %d group(s) of configurations of experiment 'tiny'", groups + 1, groups);
    if (!strstr(m2d_errmsg(), want)) fail_msg("%s", m2d_errmsg());
    free(want);
    m2d_experiment_free(&x);
    o.shards = 3;
    o.experiment = "tiny;x";
    assert_int_equal(m2d_slurm_write(&o, &job), -1);
    assert_non_null(strstr(m2d_errmsg(), "slurm: --experiment: 'tiny;x'"));
    o.experiment = "nope";
    assert_int_equal(m2d_slurm_write(&o, &job), -1);
    assert_non_null(strstr(m2d_errmsg(), "no experiment 'nope'"));
    assert_false(m2d_file_exists(other));
    /* --script puts the script elsewhere */
    o.experiment = "tiny";
    assert_int_equal(m2d_slurm_write(&o, &job), 0);
    assert_string_equal(job.script_path, other);
    assert_true(m2d_file_exists(other));
    m2d_slurm_job_free(&job);
    free(other);
    free(odd);
    free(res);
    tu_sweep_fixture_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(script_lines_quoting_and_errors),
        cmocka_unit_test_teardown(job_array_runs_shards_and_merge_checks_them, stop_daemons),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
