/* grid_read — what the files of experiments.toml's reader share (internal to harness/sweep's grid
 * files: grid.c the experiment, grid_read.c the typed look-ups, grid_expand.c axes, rules and the
 * grid, grid_sections.c the [mc] and [distill] tables). Every error names FILE:LINE:COL (or
 * "--set") of the value and the key. */
#ifndef M2D_SWEEP_GRID_READ_H
#define M2D_SWEEP_GRID_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/toml.h"
#include "sweep/grid.h"

/* the file and the experiment a value is read for */
typedef struct {
    const char *file, *exp;
} ctx;

/* ---- typed look-ups (grid_read.c) ---- */
/* "FILE:LINE:COL: experiment 'NAME'", or "--set: experiment 'NAME'" for a value given on the
 * command line (its nodes have line 0: m2d_toml_set) */
const char *m2d_grid_where_at(const char *file, const char *exp, const m2d_toml *v, char *buf, size_t n);
const char *m2d_grid_where(const ctx *c, const m2d_toml *v, char *buf, size_t n);
/* What V is, for "must be X, not Y" (an empty array says so). */
const char *m2d_grid_what_it_is(const m2d_toml *v);
int m2d_grid_key_err(const ctx *c, const m2d_toml *v, const char *key, const char *want);
int m2d_grid_get_str(const ctx *c, const m2d_toml *t, const char *key, const char *dflt, char **out);
/* A path: a non-empty string (an empty one would become "/config.json" and the like). */
int m2d_grid_get_path(const ctx *c, const m2d_toml *t, const char *key, const char *dflt, char **out);
int m2d_grid_get_int(const ctx *c, const m2d_toml *t, const char *key, int64_t dflt, int64_t lo, int64_t hi, int64_t *out);
int m2d_grid_get_int32(const ctx *c, const m2d_toml *t, const char *key, int dflt, int lo, int hi, int *out);
/* Unknown keys are errors: a typo must not silently fall back to a default. */
int m2d_grid_check_keys(const ctx *c, const m2d_toml *t, const char *where, const char *const *allowed, int n);
/* A number (integer or float) >= 0 and finite. */
int m2d_grid_get_double(const ctx *c, const m2d_toml *t, const char *key, double *out);
int m2d_grid_get_bool(const ctx *c, const m2d_toml *t, const char *key, bool *out);

/* ---- the grid (grid_expand.c) ---- */
int m2d_grid_build(const ctx *c, m2d_experiment *x);

/* ---- [mc] and [distill] (grid_sections.c) ---- */
int m2d_grid_read_mc(const ctx *c, m2d_experiment *x);
/* [distill]: the stage that distills the chosen students (sweep_distill.h); absent: no stage */
int m2d_grid_read_distill(const ctx *c, m2d_experiment *x);
/* Every id of distill.configs must be a configuration of the grid. */
int m2d_grid_check_distill_ids(const ctx *c, const m2d_experiment *x);

#endif
