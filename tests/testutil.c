#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/tensor.h"
#include "base/util.h"
#include "engine/backend.h"

const char *tu_models_dir(void) {
    const char *d = getenv("M2D_MODELS");
    if (!d) d = "../shared/models";
    struct stat st;
    return stat(d, &st) == 0 ? d : NULL;
}

char *tu_model_path(const char *name) {
    const char *m = tu_models_dir();
    if (!m) return NULL;
    char *d = m2d_path_join(m, name);
    if (!m2d_file_exists(d)) {
        free(d);
        return NULL;
    }
    return d;
}

char *tu_data_path(const char *rel) {
    static _Thread_local char buf[4][4096];
    static _Thread_local int slot;
    const char *d = getenv("M2D_DATA");
    if (!d) d = "data";
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", d, rel);
    return b;
}

const char *tu_bin(void) {
    const char *b = getenv("M2D_BIN");
    return b ? b : "build/moe2dense";
}

const char *tu_test_bin(void) {
    const char *b = getenv("M2D_TEST_BIN");
    return b ? b : "build/tests/moe2dense-test";
}

char *tu_tmpdir(void) {
    char tmpl[] = "/tmp/m2d-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return m2d_strdup(d);
}

char *tu_work;

int tu_work_setup(void **state) {
    (void)state;
    tu_work = tu_tmpdir();
    return 0;
}

static struct tu_deferred { void *p; void (*release)(void *); } *deferred;
static size_t n_deferred, cap_deferred;

void *tu_defer(void *p, void (*release)(void *)) {
    if (n_deferred == cap_deferred) {
        cap_deferred = cap_deferred ? 2 * cap_deferred : 16;
        deferred = m2d_realloc(deferred, cap_deferred * sizeof *deferred);
    }
    deferred[n_deferred++] = (struct tu_deferred){p, release};
    return p;
}

size_t tu_defer_mark(void) { return n_deferred; }

void tu_release(size_t mark) {
    while (n_deferred > mark) {
        n_deferred--;
        deferred[n_deferred].release(deferred[n_deferred].p);
    }
    if (mark == 0) free(deferred), deferred = NULL, cap_deferred = 0;
}

int tu_work_teardown(void **state) {
    (void)state;
    tu_release(0);
    tu_rm_rf(tu_work);
    free(tu_work);
    tu_work = NULL;
    return 0;
}

int tu_rm_rf(const char *path) {
    char *cmd = m2d_strfmt("rm -rf '%s'", path);
    int rc = system(cmd);
    free(cmd);
    return rc;
}

static char *slurp_and_remove(const char *path) {
    size_t n;
    char *s = m2d_read_file(path, &n);
    unlink(path);
    return s;
}

int tu_run(const char *cmd, char **out, char **err) {
    char *dir = tu_tmpdir();
    char *o = m2d_path_join(dir, "out"), *e = m2d_path_join(dir, "err");
    char *full = m2d_strfmt("(%s) >'%s' 2>'%s' </dev/null", cmd, o, e);
    int rc = system(full);
    int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    char *os = slurp_and_remove(o), *es = slurp_and_remove(e);
    if (out) *out = os; else free(os);
    if (err) *err = es; else free(es);
    rmdir(dir);
    free(full); free(o); free(e); free(dir);
    return status;
}

void tu_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

uint64_t tu_rand_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_gamma_f32(int k) { return k * 0x1p-24 / (1 - k * 0x1p-24); }

double tu_bf16(double v) { return m2d_bf16_to_f32(m2d_f32_to_bf16((float)v)); }

double tu_rand_uniform(uint64_t *s) { return (double)(tu_rand_u64(s) >> 11) * 0x1.0p-53; }

double tu_rand_normal(uint64_t *s) {
    double u1 = tu_rand_uniform(s), u2 = tu_rand_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

void tu_replace_in_file(const char *path, const char *from, const char *to) {
    size_t n;
    char *s = m2d_read_file(path, &n);
    assert_non_null(s);
    char *at = strstr(s, from);
    if (!at) fail_msg("'%s' not in %s", from, path);
    char *t = m2d_strfmt("%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    tu_write(path, t, strlen(t));
    free(s);
    free(t);
}

const char *tu_ref_python(void) {
    static int setup_done;
    if (!getenv("M2D_REF_COUNTED") && !setup_done) {
        setup_done = 1;
        tu_run("sh tests/ref/setup.sh light", NULL, NULL); /* records the outcome */
    }
    char *st = m2d_read_file("tests/ref/.venv.status", NULL);
    if (!st) fail_msg("tests/ref/.venv.status: %s (tests/ref/setup.sh did not run)", m2d_errmsg());
    st[strcspn(st, "\n")] = 0;
    int ok = strcmp(st, "ok") == 0, no_python = strncmp(st, "no-python:", 10) == 0;
    static char why[512];
    snprintf(why, sizeof why, "test reference tests/ref/.venv unavailable: %s", st);
    free(st);
    if (ok) return "tests/ref/.venv/bin/python";
    if (no_python || getenv("M2D_REF_COUNTED")) TU_SKIP(why);
    fail_msg("%s", why);
    return NULL;
}

void tu_run_killed(const char *cmd, long delay_us) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    usleep((useconds_t)delay_us);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void tu_copy_file(const char *from, const char *to) {
    size_t n;
    char *data = m2d_read_file(from, &n);
    if (!data) fail_msg("%s", m2d_errmsg());
    tu_write(to, data, n);
    free(data);
}

/* after a failed m2d_backend_new: the device is missing (1), or the test fails */
static int failed_for_no_device(void) {
    if (!strstr(m2d_errmsg(), "no CUDA device")) fail_msg("%s", m2d_errmsg());
    return 1;
}

int tu_device_absent(const char *backend) {
    m2d_backend *be;
    if (m2d_backend_new(backend, NULL, &be)) return failed_for_no_device();
    m2d_backend_free(be);
    return 0;
}

int tu_backend_trains(const char *name) {
    m2d_backend *be;
    if (m2d_backend_new(name, NULL, &be) && failed_for_no_device()) {
        if (getenv("M2D_REQUIRE_GPU")) fail_msg("M2D_REQUIRE_GPU is set, but: %s", m2d_errmsg());
        print_message("backend %s: %s: skipped: no GPU\n", name, m2d_errmsg());
        return 0;
    }
    int t = m2d_backend_supports(be, M2D_CAP_TRAIN);
    m2d_backend_free(be);
    if (!t) print_message("backend %s lacks the capability 'train': not run\n", name);
    return t;
}
