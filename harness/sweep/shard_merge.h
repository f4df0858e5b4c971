/* shard_merge — join the results CSVs of a sharded sweep into one (`moe2dense merge`).
 *
 * The inputs must have the same columns and the same run identity (experiment, backend, model
 * hash, calibration hash, PPL protocol). A configuration in two rows is an error (duplicate).
 * Gaps: without an experiment, fewer rows than the header's grid_size; with one, each grid
 * configuration without a row (listed), and any row that is not part of the experiment is an
 * error. With the experiment the rows are written in grid order. OUT is written atomically, and
 * not at all on an error or (unless allow_gaps) a gap. */
#ifndef M2D_SHARD_MERGE_H
#define M2D_SHARD_MERGE_H

typedef struct {
    const char *out;              /* OUT.csv */
    char *const *inputs;          /* the shard CSVs */
    int n_inputs;
    const char *experiments;      /* experiments.toml and the experiment name: both or neither */
    const char *experiment;
    char *const *sets;            /* the --set overrides the sweep used */
    int n_sets;
    int allow_gaps;               /* write OUT even when configurations are missing */
} m2d_shard_merge_opts;

typedef struct {
    int rows, files;              /* rows written, input files */
    int gaps;                     /* configurations missing */
    char **notes;                 /* diagnostics in order (torn lines, duplicates, missing ones) */
    int n_notes;
} m2d_shard_merge_result;

/* 0 and OUT written; -1 + m2d_err ("merge: ..."). RES (notes) is filled either way: free it. */
int m2d_shard_merge(const m2d_shard_merge_opts *o, m2d_shard_merge_result *res);
void m2d_shard_merge_result_free(m2d_shard_merge_result *res);

#endif
