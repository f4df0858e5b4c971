/* moe2dense slurm — write an sbatch script running a sweep as a Slurm job array (one shard per task). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cmd.h"
#include "sweep/grid.h"
#include "sweep/slurm.h"
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
    "  --shards N            array size (required; at most the groups of configurations that can run\n"
    "                        apart: those sharing a student stay in one shard)\n"
    "  --partition P         #SBATCH --partition\n"
    "  --gpus-per-task G     #SBATCH --gpus-per-task, and each task's sweep runs with --device cuda\n"
    "                        (the first GPU Slurm gives it; needs a `make CUDA=1` binary)\n"
    "  --time T              #SBATCH --time (e.g. 04:00:00)\n"
    "  --mem M               #SBATCH --mem (e.g. 80G; 'sweep --dry-run' prints the peak memory of a task)\n"
    "  --cpus-per-task C     #SBATCH --cpus-per-task (default 1); the sweep uses C threads\n"
    "  --results-dir DIR     where shard CSVs and logs go (default: results/slurm-NAME)\n"
    "  --script FILE         where to write the script (default: DIR/NAME.sbatch)\n"
    "  --set KEY=VALUE       experiment overrides passed on to every shard (repeatable)\n"
    "  --max-configs N       the grid limit (see 'moe2dense help sweep'), passed on to every shard\n"
    "\n"
    "Each shard computes (or reuses) the calibration cache; with a shared cache_dir the first\n"
    "shard to finish calibrating writes it atomically and later shards reuse it.\n";

static int cmd_slurm_run(int argc, char **argv) {
    char **sets = NULL;
    int n_sets = 0;
    if (m2d_extract_sets("slurm", &argc, argv, &sets, &n_sets)) {
        free(sets);
        return m2d_cmd_fail("slurm");
    }
    const char *exp = NULL, *shards = NULL, *cpus = "1", *max_configs = NULL;
    m2d_slurm_opts o = {.sets = sets, .n_sets = n_sets};
    m2d_opt opts[] = {{"--experiment", 1, &exp, NULL},          {"--shards", 1, &shards, NULL},
                      {"--partition", 1, &o.partition, NULL},   {"--gpus-per-task", 1, &o.gpus_per_task, NULL},
                      {"--time", 1, &o.time_limit, NULL},       {"--cpus-per-task", 1, &cpus, NULL},
                      {"--mem", 1, &o.mem, NULL},
                      {"--results-dir", 1, &o.results_dir, NULL}, {"--script", 1, &o.script, NULL},
                      {"--max-configs", 1, &max_configs, NULL}, {0}};
    char *pos[1];
    int npos = 0, rc = -1;
    long n, c, mc = 0;
    m2d_slurm_job job = {0};
    if (m2d_parse_opts("slurm", argc, argv, opts, pos, 1, &npos)) goto done;
    if (npos != 1 || !exp || !shards) {
        m2d_err("slurm: expected EXPERIMENTS.toml --experiment NAME --shards N (see 'moe2dense help slurm')");
        goto done;
    }
    if (m2d_parse_int("slurm", "--shards", shards, 1, 100000, &n) ||
        m2d_parse_int("slurm", "--cpus-per-task", cpus, 1, 4096, &c) ||
        (max_configs && m2d_parse_int("slurm", "--max-configs", max_configs, 1, 1L << 40, &mc)))
        goto done;
    m2d_grid_set_max_configs(mc);
    o.max_configs = mc;
    o.experiments = pos[0];
    o.experiment = exp;
    o.shards = (int)n;
    o.cpus_per_task = (int)c;
    rc = m2d_slurm_write(&o, &job);
    if (rc == 0) {
        printf("wrote %s (%d array tasks, %d configurations)\n", job.script_path, o.shards, job.n_configs);
        printf("submit: %s\n", job.submit_command);
        printf("merge:  %s\n", job.merge_command);
    }
done:
    m2d_slurm_job_free(&job);
    free(sets);
    return rc == 0 ? 0 : m2d_cmd_fail("slurm");
}

M2D_COMMAND(slurm, "slurm", "write an sbatch script that runs a sweep as a Slurm job array of shards", USAGE,
            cmd_slurm_run)
