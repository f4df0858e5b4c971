/* moe2dense merge — join shard CSVs into one, checking duplicates and gaps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "sweep/grid.h"
#include "sweep/shard_merge.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense merge OUT.csv IN1.csv [IN2.csv ...] [--experiments FILE --experiment NAME]\n"
    "                       [--set KEY=VALUE ...] [--allow-gaps] [--max-configs N]\n"
    "\n"
    "Joins the CSVs of a sharded sweep (moe2dense sweep --shard I/N, moe2dense slurm) into OUT.csv\n"
    "(written atomically). The inputs must have the same columns and the same run identity\n"
    "(experiment, backend, model hash, calibration hash, PPL protocol). Errors: a configuration in\n"
    "two rows (duplicate), and gaps: fewer rows than the grid (header grid_size), or, with\n"
    "--experiments/--experiment, each grid configuration that is missing (listed) and any row that\n"
    "is not part of the experiment. With the experiment the rows are written in grid order.\n"
    "\n"
    "options:\n"
    "  --experiments FILE  experiments.toml to check against (with --experiment)\n"
    "  --experiment NAME   the experiment the shards ran\n"
    "  --set KEY=VALUE     the same overrides the sweep used (e.g. model=DIR), repeatable\n"
    "  --allow-gaps        write OUT.csv even when configurations are missing (still reported)\n"
    "  --max-configs N     the sweep's grid limit, when it ran with one (see 'moe2dense help sweep')\n"
    "\n"
    "Every input row is validated first (a bad row is an error naming FILE:LINE:COLUMN); OUT is\n"
    "locked while it is written (a sweep writing OUT makes merge refuse).\n";

static int cmd_merge_run(int argc, char **argv) {
    char **sets = NULL;
    int n_sets = 0;
    if (m2d_extract_sets("merge", &argc, argv, &sets, &n_sets)) {
        free(sets);
        return m2d_cmd_fail("merge");
    }
    const char *exp_file = NULL, *exp_name = NULL, *max_configs = NULL;
    int allow_gaps = 0;
    m2d_opt opts[] = {{"--experiments", 1, &exp_file, NULL}, {"--experiment", 1, &exp_name, NULL},
                      {"--allow-gaps", 0, NULL, &allow_gaps}, {"--max-configs", 1, &max_configs, NULL}, {0}};
    char **pos = m2d_calloc((size_t)argc + 1, sizeof *pos);
    int npos = 0, rc = -1;
    m2d_shard_merge_result res = {0};
    long mc = 0;
    if (m2d_parse_opts("merge", argc, argv, opts, pos, argc, &npos) == 0 &&
        (!max_configs || m2d_parse_int("merge", "--max-configs", max_configs, 1, 1L << 40, &mc) == 0)) {
        m2d_grid_set_max_configs(mc);
        if (npos < 2) {
            m2d_err("merge: expected OUT.csv and at least one input CSV (see 'moe2dense help merge')");
        } else {
            m2d_shard_merge_opts o = {pos[0], pos + 1, npos - 1, exp_file, exp_name, sets, n_sets, allow_gaps};
            rc = m2d_shard_merge(&o, &res);
        }
    }
    for (int i = 0; i < res.n_notes; i++) fprintf(stderr, "moe2dense merge: %s\n", res.notes[i]);
    if (rc == 0)
        printf("merge: %d rows from %d file(s) -> %s%s\n", res.rows, res.files, pos[0], res.gaps ? " (with gaps)" : "");
    m2d_shard_merge_result_free(&res);
    free(pos);
    free(sets);
    return rc == 0 ? 0 : m2d_cmd_fail("merge");
}

M2D_COMMAND(merge, "merge", "join shard CSVs of a sweep into one, checking duplicates and gaps", USAGE,
            cmd_merge_run)
