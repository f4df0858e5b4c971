/* blas_core — OpenBLAS's kernels for this CPU.
 *
 * OpenBLAS (Debian 12: 0.3.21, built with DYNAMIC_ARCH) picks its kernel set when the library
 * loads, from the CPU's identity, or from OPENBLAS_CORETYPE when that is set. A CPU newer than the
 * library (Intel Sapphire and Emerald Rapids for 0.3.21) is not recognised and gets the generic
 * "Prescott" kernels (SSE3): measured on an Emerald Rapids (family 6 model 207), one thread, sgemm
 * 1024^3 21 GFLOP/s against 133 with the SkylakeX kernels, dsyrk (calibration's Gram) 7 against 43.
 * So every process of this project (the binary, its tests and benchmarks: a constructor here) that
 * finds the generic kernels on a CPU with AVX-512 (AVX2 + FMA) runs itself again, once, with
 * OPENBLAS_CORETYPE=SkylakeX (Haswell): the kernels OpenBLAS's newer releases pick there. A
 * user's own OPENBLAS_CORETYPE is kept; M2D_BLAS_CORE=keep keeps the library's choice (benches
 * compare the two). Results stay within fp32/fp64 summation order of each other: tests compare
 * with tolerances, and one process never mixes two kernel sets. */
#ifndef M2D_ENGINE_BLAS_CORE_H
#define M2D_ENGINE_BLAS_CORE_H

/* The kernel set OpenBLAS runs ("SkylakeX", "Haswell", "Prescott", ...). */
const char *m2d_blas_core(void);
/* The set to ask for instead of CORE on this CPU, or NULL when CORE is fine (not the generic
 * "Prescott", or no better set here). */
const char *m2d_blas_core_better(const char *core);

#endif
