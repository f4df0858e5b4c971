/* testutil — shared helpers for the cmocka test binaries. */
#ifndef M2D_TESTUTIL_H
#define M2D_TESTUTIL_H

#include <setjmp.h> /* cmocka needs these before cmocka.h */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

/* ../shared/models (or $M2D_MODELS) joined with NAME; NULL when absent. */
const char *tu_models_dir(void);
/* The shared model NAME (e.g. "tiny-qwen3moe") under tu_models_dir(), malloc'd; NULL when absent. */
char *tu_model_path(const char *name);
/* data dir ($M2D_DATA, default "data"), joined with a relative path (static buffer per call). */
char *tu_data_path(const char *rel);
/* path to the built binary ($M2D_BIN, default build/moe2dense). */
const char *tu_bin(void);
/* path to the same CLI linked with the test-only sweep backends, e.g. "fake" ($M2D_TEST_BIN,
 * default build/tests/moe2dense-test): for experiments with backend = "fake". */
const char *tu_test_bin(void);
/* A fresh temporary directory (removed at exit by the caller's choice: tu_rm_rf). */
char *tu_tmpdir(void);
/* A work directory shared by the tests of one binary: cmocka group setup/teardown that make
 * tu_work (a fresh tu_tmpdir) and remove it with everything in it. */
extern char *tu_work;
int tu_work_setup(void **state);
int tu_work_teardown(void **state);
int tu_rm_rf(const char *path);
/* Resources a check holds while it may fail: cmocka's fail_msg longjmps out of the check, so
 * whatever it allocated is registered here and released by tu_release (the check's own success
 * path, from the mark it took) or, after a failure, by the next tu_release(0) / tu_work_teardown:
 * nothing leaks when a check fails (LeakSanitizer under SAN=1). Returns P. */
void *tu_defer(void *p, void (*release)(void *));
size_t tu_defer_mark(void);
void tu_release(size_t mark);
/* Run a shell command; capture stdout and stderr (malloc'd, may be NULL); return exit status. */
int tu_run(const char *cmd, char **out, char **err);
/* Start CMD in /bin/sh (its own process), SIGKILL it after DELAY_US microseconds, reap it: a crash
 * at a chosen moment (crash-safety tests). */
void tu_run_killed(const char *cmd, long delay_us);
/* Copy the file FROM to TO (fails the test when FROM cannot be read). */
void tu_copy_file(const char *from, const char *to);
/* Write bytes to a file (test fixtures). */
void tu_write(const char *path, const void *data, size_t n);
/* Replace the first FROM in the file at PATH with TO (fails the test when FROM is absent). */
void tu_replace_in_file(const char *path, const char *from, const char *to);
/* Deterministic PRNG for test data (splitmix64). */
uint64_t tu_rand_u64(uint64_t *state);
double tu_rand_uniform(uint64_t *state);   /* [0, 1) */
double tu_rand_normal(uint64_t *state);    /* N(0, 1) */
/* γ_K = K u / (1 - K u), u = 2^-24: the bound of a recursive fp32 sum of K terms (or a chain of K
 * fmas), |computed - exact| <= γ_K Σ|terms| (Higham §3.1), for the GEMM kernels' tests. */
double tu_gamma_f32(int k);
/* V rounded to bf16 (through fp32, nearest even: the BF16 precision's operand rounding), as a double */
double tu_bf16(double v);
/* The python3 of the test references' virtual environment (tests/ref/.venv: HF tokenizers,
 * lm-eval), made by tests/ref/setup.sh. `make test` runs that setup once, before any test, and
 * tests/run.sh counts a failed install once ("ref-setup"); this only reads the recorded outcome:
 * ready -> the path; Python missing -> the test is skipped; install failed -> skipped when the
 * run has already counted it (M2D_REF_COUNTED=1), else the test fails with the recorded reason.
 * A test binary started by hand runs the setup itself, once per process. */
const char *tu_ref_python(void);
/* Skip a cmocka test with a printed reason. */
/* Skip the test saying WHY. Under CI (.ci/run sets CI) only a missing GPU may skip: anything else
 * a fresh clone's make test lacks (data, models, python, slurm daemons) fails the test there. */
#define TU_SKIP(why)                                                                  \
    do {                                                                              \
        if (getenv("CI") && !strstr(why, "no GPU")) fail_msg("would skip in CI: %s", why); \
        print_message("skipped: %s\n", why);                                         \
        skip();                                                                       \
    } while (0)

/* 1 when the registered backend BACKEND's device is missing on this machine (in CUDA=1 builds
 * without a GPU: "no CUDA device"); 0 when it can be created; any other failure fails the test */
int tu_device_absent(const char *backend);
/* 1 when the registered backend NAME can be created here and lists the capability "train" (the
 * CPU always); a device this machine lacks is "skipped: no GPU" (printed), or a failure under
 * M2D_REQUIRE_GPU (the GPU runner); a backend without training says so. */
int tu_backend_trains(const char *name);

#endif
