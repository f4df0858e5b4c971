/* blas_core: OpenBLAS runs its kernels for this CPU, not the generic ones it falls back to for a
 * CPU newer than the library (engine/blas_core.h): the rule, and what a process really runs with
 * and without M2D_BLAS_CORE=keep (this binary run again, printing its kernel set). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/blas_core.h"

static const char *self; /* this test binary */

/* Only the generic set ("Prescott") is replaced, and only by a set this CPU can run. */
static void better_only_for_generic(void **state) {
    (void)state;
    const char *named[] = {"SkylakeX", "Haswell", "Zen", "SapphireRapids", "Cooperlake"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(named); i++) assert_null(m2d_blas_core_better(named[i]));
    assert_null(m2d_blas_core_better(NULL));
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512cd");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *want = avx512 ? "SkylakeX" : avx2 ? "Haswell" : NULL;
    const char *got = m2d_blas_core_better("Prescott");
    if (want) assert_string_equal(got, want);
    else assert_null(got);
}

/* the kernel set a fresh process of this binary runs with ENV (a prefix of `env` arguments) */
static char *core_of_child(const char *env) {
    char *cmd = m2d_strfmt("env -u OPENBLAS_CORETYPE -u M2D_BLAS_CORE %s '%s' --core", env, self), *out = NULL;
    if (tu_run(cmd, &out, NULL) != 0 || !out) fail_msg("%s failed", cmd);
    out[strcspn(out, "\n")] = 0;
    free(cmd);
    return out;
}

/* By default a process runs the better set wherever the library's own choice is generic; with
 * M2D_BLAS_CORE=keep it runs the library's choice. On a CPU the library knows, both are the same. */
static void process_runs_the_better_set(void **state) {
    (void)state;
    char *own = core_of_child("M2D_BLAS_CORE=keep"), *used = core_of_child("");
    const char *better = m2d_blas_core_better(own);
    assert_string_equal(used, better ? better : own);
    print_message("OpenBLAS kernels: the library's choice %s, run with %s\n", own, used);
    assert_null(m2d_blas_core_better(used));
    free(own), free(used);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--core") == 0) {
        printf("%s\n", m2d_blas_core());
        return 0;
    }
    self = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(better_only_for_generic),
        cmocka_unit_test(process_runs_the_better_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
