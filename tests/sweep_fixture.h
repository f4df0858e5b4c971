/* sweep_fixture — a temporary directory holding a fake teacher (config.json only) and an
 * experiments file, for tests of the sweep machinery on the "fake" backend (tests/sweep_fake.c). */
#ifndef M2D_SWEEP_FIXTURE_H
#define M2D_SWEEP_FIXTURE_H

typedef struct {
    char *dir;    /* the temporary directory (removed by tu_sweep_fixture_free) */
    char *model;  /* DIR/teacher, holding config.json */
    char *toml;   /* DIR/experiments.toml */
    char *csv;    /* DIR/results.csv (not created) */
} tu_sweep_fixture;

/* CONFIG_JSON becomes the teacher's config.json; EXPERIMENTS the experiments file, with every
 * "MODEL" replaced by the teacher's path. */
tu_sweep_fixture tu_sweep_fixture_make(const char *config_json, const char *experiments);
void tu_sweep_fixture_free(tu_sweep_fixture *fx);

#endif
