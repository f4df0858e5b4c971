/* blas_core — OpenBLAS's kernels for this CPU (see blas_core.h). */
#include "engine/blas_core.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *m2d_blas_core(void) { return openblas_get_corename(); }

/* "Prescott" is the set OpenBLAS's DYNAMIC_ARCH falls back to for any CPU it does not know ("Falling
 * back to Prescott core"); a real Prescott-era CPU has no AVX2, so nothing better is asked for there */
const char *m2d_blas_core_better(const char *core) {
    if (!core || strcmp(core, "Prescott") != 0) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

/* under valgrind (its preloaded core): an exec would leave it */
static int under_valgrind(void) {
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload");
}

/* Runs before main (after OpenBLAS has loaded and chosen): the process again with the better
 * kernels. glibc passes the program's arguments to constructors. Never twice (the variable is set
 * for the second run), nor under valgrind. */
__attribute__((constructor)) static void rerun_with_better_core(int argc, char **argv, char **envp) {
    (void)argc, (void)envp;
    const char *keep = getenv("M2D_BLAS_CORE");
    if (getenv("OPENBLAS_CORETYPE") || (keep && strcmp(keep, "keep") == 0) || under_valgrind() || !argv) return;
    const char *better = m2d_blas_core_better(m2d_blas_core());
    if (!better || setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* no exec: carry on with the library's kernels */
}
