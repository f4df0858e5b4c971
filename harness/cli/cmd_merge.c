/* moe2dense merge — join shard CSVs into one, checking duplicates and gaps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "sweep/grid.h"
#include "io/results.h"
#include "base/util.h"

static const char USAGE[] =
    "usage: moe2dense merge OUT.csv IN1.csv [IN2.csv ...] [--experiments FILE --experiment NAME]\n"
    "                       [--set KEY=VALUE ...] [--allow-gaps]\n"
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
    "  --allow-gaps        write OUT.csv even when configurations are missing (still reported)\n";

static const char *const IDENTITY[] = {"experiment", "backend", "model_hash", "calib_hash", "ppl"};

static int same_identity(const m2d_results *a, const char *pa, const m2d_results *b, const char *pb) {
    if (a->n_cols != b->n_cols) return m2d_err("%s and %s have different columns", pa, pb);
    for (int c = 0; c < a->n_cols; c++)
        if (strcmp(a->cols[c], b->cols[c]))
            return m2d_err("%s and %s differ in column %d ('%s' vs '%s')", pa, pb, c + 1, a->cols[c], b->cols[c]);
    for (size_t i = 0; i < M2D_ARRAY_LEN(IDENTITY); i++) {
        const char *x = m2d_results_meta(a, IDENTITY[i]), *y = m2d_results_meta(b, IDENTITY[i]);
        if ((x || y) && (!x || !y || strcmp(x, y)))
            return m2d_err("%s and %s come from different runs: header '%s' is '%s' vs '%s'", pa, pb, IDENTITY[i],
                           x ? x : "(absent)", y ? y : "(absent)");
    }
    return 0;
}

static void add_meta(m2d_results *m, const char *k, const char *v) {
    m->meta_keys = m2d_realloc(m->meta_keys, (size_t)(m->n_meta + 1) * sizeof *m->meta_keys);
    m->meta_vals = m2d_realloc(m->meta_vals, (size_t)(m->n_meta + 1) * sizeof *m->meta_vals);
    m->meta_keys[m->n_meta] = m2d_strdup(k);
    m->meta_vals[m->n_meta++] = m2d_strdup(v);
}

static int cmd_merge_run(int argc, char **argv) {
    char **sets = NULL;
    int n_sets = 0;
    if (m2d_extract_sets("merge", &argc, argv, &sets, &n_sets)) {
        free(sets);
        return m2d_cmd_fail("merge");
    }
    const char *exp_file = NULL, *exp_name = NULL;
    int allow_gaps = 0;
    m2d_opt opts[] = {{"--experiments", 1, &exp_file, NULL}, {"--experiment", 1, &exp_name, NULL},
                      {"--allow-gaps", 0, NULL, &allow_gaps}, {0}};
    char **pos = m2d_calloc((size_t)argc + 1, sizeof *pos);
    int npos = 0, n_in = 0, rc = 1, gaps = 0;
    m2d_results *in = NULL, out = {0};
    m2d_experiment x = {0};
    int have_exp = 0;
    if (m2d_parse_opts("merge", argc, argv, opts, pos, argc, &npos)) goto fail;
    if (npos < 2) {
        m2d_err("merge: expected OUT.csv and at least one input CSV (see 'moe2dense help merge')");
        goto fail;
    }
    if (!exp_file != !exp_name) {
        m2d_err("merge: --experiments and --experiment go together");
        goto fail;
    }
    for (int i = 1; i < npos; i++)
        if (strcmp(pos[i], pos[0]) == 0) {
            m2d_err("merge: the output %s is also an input", pos[0]);
            goto fail;
        }
    if (exp_file) {
        if (m2d_experiment_load(exp_file, exp_name, sets, n_sets, &x)) goto fail;
        have_exp = 1;
    }
    n_in = npos - 1;
    in = m2d_calloc((size_t)n_in, sizeof *in);
    for (int i = 0; i < n_in; i++) {
        if (m2d_results_read(pos[i + 1], &in[i])) goto fail;
        if (in[i].torn_bytes)
            fprintf(stderr, "moe2dense merge: %s: ignoring a torn last line (was that shard killed? re-run it to "
                            "finish)\n", pos[i + 1]);
        if (i && same_identity(&in[0], pos[1], &in[i], pos[i + 1])) goto fail;
    }
    if (have_exp && m2d_results_meta(&in[0], "experiment") &&
        strcmp(m2d_results_meta(&in[0], "experiment"), exp_name)) {
        m2d_err("merge: %s is from experiment '%s', not '%s'", pos[1], m2d_results_meta(&in[0], "experiment"),
                exp_name);
        goto fail;
    }
    int id_col = m2d_results_col(&in[0], "config_id");
    if (id_col < 0) {
        m2d_err("merge: %s: field 'config_id': column missing", pos[1]);
        goto fail;
    }
    /* collect rows, rejecting duplicates */
    int total = 0;
    for (int i = 0; i < n_in; i++) total += in[i].n_rows;
    char ***rows = m2d_calloc((size_t)total + 1, sizeof *rows);
    const char **origin = m2d_calloc((size_t)total + 1, sizeof *origin);
    int n = 0, dups = 0;
    for (int i = 0; i < n_in; i++)
        for (int r = 0; r < in[i].n_rows; r++) {
            const char *id = in[i].rows[r][id_col];
            int dup = -1;
            for (int j = 0; j < n && dup < 0; j++)
                if (strcmp(rows[j][id_col], id) == 0) dup = j;
            if (dup >= 0) {
                if (dups++ < 5)
                    fprintf(stderr, "moe2dense merge: duplicate configuration %s in %s and %s\n", id, origin[dup],
                            pos[i + 1]);
                continue;
            }
            origin[n] = pos[i + 1];
            rows[n++] = in[i].rows[r];
        }
    if (dups) {
        free(rows);
        free(origin);
        m2d_err("merge: %d duplicate configuration(s) across the inputs (each shard must run a disjoint slice)", dups);
        goto fail;
    }
    /* gaps */
    char ***ordered = rows;
    if (have_exp) {
        ordered = m2d_calloc((size_t)x.n_configs + 1, sizeof *ordered);
        int placed = 0, missing = 0;
        for (int c = 0; c < x.n_configs; c++) {
            for (int j = 0; j < n; j++)
                if (strcmp(rows[j][id_col], x.configs[c].id) == 0) ordered[placed++] = rows[j];
            if (placed == c - missing) {
                if (missing++ < 10)
                    fprintf(stderr, "moe2dense merge: missing %s (%s %s %s K=%d%s%s)\n", x.configs[c].id,
                            x.configs[c].scoring, x.configs[c].grouping, x.configs[c].scaling, x.configs[c].K,
                            x.configs[c].params[0] ? " " : "", x.configs[c].params);
            }
        }
        if (placed != n) {
            int extra = n - placed;
            free(ordered);
            free(rows);
            free(origin);
            m2d_err("merge: %d row(s) are not configurations of experiment '%s' (another experiment, or different "
                    "--set values?)", extra, exp_name);
            goto fail;
        }
        gaps = missing;
        if (missing) fprintf(stderr, "moe2dense merge: %d of %d configurations missing\n", missing, x.n_configs);
    } else {
        const char *gs = m2d_results_meta(&in[0], "grid_size");
        if (gs && atoi(gs) != n) {
            gaps = atoi(gs) - n;
            fprintf(stderr, "moe2dense merge: %d rows but the grid has %s configurations (pass --experiments and "
                            "--experiment to list the missing ones)\n", n, gs);
        }
    }
    /* header: identity from the inputs, provenance of the merge */
    for (int i = 0; i < in[0].n_meta; i++) {
        const char *k = in[0].meta_keys[i];
        if (strcmp(k, "shard") && strcmp(k, "host") && strcmp(k, "started")) add_meta(&out, k, in[0].meta_vals[i]);
    }
    add_meta(&out, "shard", "all");
    char *from = m2d_strdup("");
    for (int i = 0; i < n_in; i++) {
        const char *h = m2d_results_meta(&in[i], "host"), *s = m2d_results_meta(&in[i], "shard");
        char *next = m2d_strfmt("%s%s%s (shard %s, host %s)", from, i ? "; " : "", pos[i + 1], s ? s : "?",
                                h ? h : "?");
        free(from);
        from = next;
    }
    add_meta(&out, "merged_from", from);
    free(from);
    out.n_cols = in[0].n_cols;
    out.cols = in[0].cols;
    out.n_rows = n;
    out.rows = ordered;
    int wrc = 0;
    if (gaps && !allow_gaps) {
        m2d_err("merge: %d configuration(s) missing; %s not written (re-run the missing shards, or --allow-gaps)",
                gaps, pos[0]);
        wrc = -1;
    } else {
        wrc = m2d_results_write(pos[0], &out);
    }
    out.cols = NULL;
    out.n_cols = 0;
    out.rows = NULL;
    out.n_rows = 0;
    if (ordered != rows) free(ordered);
    free(rows);
    free(origin);
    if (wrc) goto fail;
    printf("merge: %d rows from %d file(s) -> %s%s\n", n, n_in, pos[0], gaps ? " (with gaps)" : "");
    rc = 0;
    goto done;
fail:
    rc = m2d_cmd_fail("merge");
done:
    m2d_results_free(&out);
    for (int i = 0; in && i < n_in; i++) m2d_results_free(&in[i]);
    free(in);
    m2d_experiment_free(&x);
    free(pos);
    free(sets);
    return rc;
}

M2D_COMMAND(merge, "merge", "join shard CSVs of a sweep into one, checking duplicates and gaps", USAGE,
            cmd_merge_run)
