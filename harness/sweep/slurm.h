/* slurm — an sbatch script that runs a sweep as a Slurm job array (`moe2dense slurm`).
 *
 * Array task I of N runs
 *   moe2dense sweep EXPERIMENTS.toml --experiment NAME --shard I/N --out DIR/NAME.shard-I-of-N.csv
 * (each shard resumes if re-submitted). Paths in the script are absolute and every value that
 * reaches the shell is quoted, in the script and in the submit and merge commands printed for
 * copy-paste (a path with spaces or '$' stays one word); the #SBATCH --output path is quoted
 * the way sbatch reads it ("...", backslash escapes, %% for %); other #SBATCH values are
 * restricted to characters Slurm accepts there, and no path may hold a control character, so
 * nothing smuggles a newline or shell syntax into the script. */
#ifndef M2D_SLURM_H
#define M2D_SLURM_H

typedef struct {
    const char *experiments;      /* EXPERIMENTS.toml as given */
    const char *experiment;       /* NAME */
    char *const *sets;            /* --set overrides passed on to every shard */
    int n_sets;
    int shards;                   /* array size: 1 .. the experiment's configurations */
    int cpus_per_task;            /* #SBATCH --cpus-per-task; the sweep's --threads */
    const char *partition;        /* #SBATCH --partition (NULL: none) */
    const char *gpus_per_task;    /* #SBATCH --gpus-per-task (NULL: none) */
    const char *time_limit;       /* #SBATCH --time (NULL: none) */
    const char *mem;              /* #SBATCH --mem (NULL: none, the cluster's default; see sweep --dry-run's
                                   * peak memory) */
    const char *results_dir;      /* shard CSVs and logs (NULL: results/slurm-NAME) */
    const char *script;           /* the script (NULL: RESULTS_DIR/NAME.sbatch) */
    const char *binary;           /* the moe2dense the tasks run (NULL: this process's executable) */
    long long max_configs;        /* the grid limit passed on to every shard and merge (0: default) */
} m2d_slurm_opts;

typedef struct {
    char *script_path;            /* absolute */
    char *submit_command;         /* `sbatch SCRIPT`, quoted for a POSIX shell */
    char *merge_command;          /* `moe2dense merge ...` joining the shard CSVs when the array is done */
    int n_configs;
} m2d_slurm_job;

/* Validate, load the experiment, create the results directory, write the script atomically.
 * -1 + m2d_err ("slurm: ..." or the experiment's error). */
int m2d_slurm_write(const m2d_slurm_opts *o, m2d_slurm_job *job);
void m2d_slurm_job_free(m2d_slurm_job *job);

#endif
