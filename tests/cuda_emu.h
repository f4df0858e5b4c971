/* cuda_emu — the CPU emulation of a CUDA block that tests/test_cuda_*.cc run kernels of the cuda
 * backend on (test_cuda_kernels.cc's header comment says what it emulates and how): nvcc's
 * built-ins for host C++, a block's threads as coroutines (ucontext), barriers, shuffles, mma.sync,
 * ldmatrix and cp.async as the PTX ISA defines them, and run_grid. Include it first, then the
 * kernels' header; a test uses part of it, hence the unused-function pragma. */
#ifndef M2D_TESTS_CUDA_EMU_H
#define M2D_TESTS_CUDA_EMU_H
#pragma GCC diagnostic ignored "-Wunused-function"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" { /* cmocka's header declares its C functions without C linkage for C++ */
#include <cmocka.h>
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define FIBER_START(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define FIBER_FINISH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define FIBER_START(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define FIBER_FINISH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#endif

/* ---- what nvcc provides, for host C++ ---- */
#define M2D_MIN(a, b) ((a) < (b) ? (a) : (b))
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static /* one array for the block's coroutines (blocks run one at a time) */
using std::max;
struct float4 {
    float x, y, z, w;
};
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint2 {
    uint32_t x, y;
};
static uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
struct uint4 {
    uint32_t x, y, z, w;
};
static uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
struct float2 {
    float x, y;
};
static float2 make_float2(float a, float b) { return {a, b}; }
static float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- one block of threads as coroutines ---- */
enum { NT_MAX = 256, STACK = 1 << 17 };
enum wait_op { RUN, DONE, BLOCK_BARRIER, SYNCWARP, SHFL, MMA, MMA16, DMMA, LDSM };

typedef struct {
    ucontext_t ctx;
    char *stack;
    void *fake_stack; /* ASan's, across a switch */
    wait_op op;
    double fv;        /* shfl: the value given, then the value received (a float's exactly) */
    int lane_xor;
    float *d;         /* mma: the accumulator fragment (in and out) and the operands */
    uint32_t a[4], b[2];
    bool bf16;        /* m16n8k16: the operands bf16 (else fp16) */
    double *dd, da, db; /* dmma: the accumulator pair and the operands */
    const uint16_t *row; /* ldmatrix: the 16-byte row this lane gives */
    uint32_t *r;         /* ldmatrix: the four registers it receives */
} emu_thread;

static emu_thread T[NT_MAX];
static int NT; /* the running block's threads */
static ucontext_t sched;
static const void *sched_bottom;
static size_t sched_size;
static int cur;
static struct {
    unsigned x, y, z;
} blockIdx, gridDim;
struct tid_t {
    unsigned x;
};
static tid_t emu_tid(void) { return tid_t{(unsigned)cur}; }
#define threadIdx (emu_tid())
#define blockDim (tid_t{(unsigned)NT})
alignas(16) unsigned char tc_raw[112 * 1024]; /* the block's dynamic shared memory */

/* the running thread waits at OP; the scheduler resumes it when the op completes */
static void wait_at(wait_op op) {
    T[cur].op = op;
    FIBER_START(&T[cur].fake_stack, sched_bottom, sched_size);
    swapcontext(&T[cur].ctx, &sched);
    FIBER_FINISH(T[cur].fake_stack, &sched_bottom, &sched_size);
}

static void __syncthreads(void) { wait_at(BLOCK_BARRIER); }
static void __syncwarp(void) { wait_at(SYNCWARP); }
static double shfl_xor(unsigned mask, double v, int lane_xor) {
    assert_true(mask == 0xffffffffu);
    T[cur].fv = v, T[cur].lane_xor = lane_xor;
    wait_at(SHFL);
    return T[cur].fv;
}
static float __shfl_xor_sync(unsigned mask, float v, int lane_xor) { return (float)shfl_xor(mask, v, lane_xor); }
static uint32_t __shfl_xor_sync(unsigned mask, uint32_t v, int lane_xor) { return (uint32_t)shfl_xor(mask, v, lane_xor); }
/* blocks run one at a time and threads switch only at collectives: a plain update is atomic */
static uint32_t atomicMax(uint32_t *p, uint32_t v) {
    uint32_t old = *p;
    *p = std::max(old, v);
    return old;
}
static double __shfl_xor_sync(unsigned mask, double v, int lane_xor) { return shfl_xor(mask, v, lane_xor); }
static int atomicAdd(int *p, int v) {
    int old = *p;
    *p += v;
    return old;
}

static int tf32_violations;
static void m2d_emu_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    T[cur].d = d;
    memcpy(T[cur].a, a, sizeof T[cur].a);
    T[cur].b[0] = b0, T[cur].b[1] = b1;
    wait_at(MMA);
}

static void m2d_emu_mma16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16 = false) {
    T[cur].d = d;
    memcpy(T[cur].a, a, sizeof T[cur].a);
    T[cur].b[0] = b0, T[cur].b[1] = b1, T[cur].bf16 = bf16;
    wait_at(MMA16);
}

static void m2d_emu_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    m2d_emu_mma16(d, a, b0, b1, true);
}

/* bf16 as nvcc's cuda_bf16.h has it, for the MoE kernels' epilogue: the bits, rounding to nearest
 * even; a NaN becomes the canonical 0x7fff (cuda_bf16.hpp's host path; the device's cvt.rn.bf16.f32
 * gives it too), where the CPU's m2d_f32_to_bf16 keeps the sign and payload */
struct __nv_bfloat16 {
    uint16_t x;
};
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{bf16_bits(f)}; }
static float bf16_float(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
static float __bfloat162float(__nv_bfloat16 b) { return bf16_float(b.x); }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fmul_rn(float a, float b) { return a * b; }
static float __fdiv_rn(float a, float b) { return a / b; }
static float __fsub_rn(float a, float b) { return a - b; }
static double __dadd_rn(double a, double b) { return a + b; }
static double __dsub_rn(double a, double b) { return a - b; }
static double __dmul_rn(double a, double b) { return a * b; }

/* fp32 -> fp16 bits, to nearest even (what __floats2half2_rn does): overflow to infinity,
 * subnormals by the spacing 2^-24 */
static uint16_t m2d_emu_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u;       /* NaN */
    if (x >= 0x477ff000u) return sign | 0x7c00u;      /* >= 65520: infinity (65504 + half an ulp, to even) */
    if (x < 0x38800000u) {                            /* below 2^-14: a multiple of 2^-24 (exact scaling) */
        float a = fabsf(f) * 16777216.0f;
        return sign | (uint16_t)nearbyintf(a);        /* 1024: the smallest normal, by its bits */
    }
    uint32_t r = (x + 0xfffu + ((x >> 13) & 1u)) >> 13; /* the 13 dropped bits, to even (may carry) */
    return sign | (uint16_t)(r - ((127u - 15u) << 10));
}

static float m2d_emu_h2f(uint32_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(1024 + m), e - 25);
    return h & 0x8000u ? -v : v;
}

static void m2d_emu_dmma(double (&d)[2], double a, double b) {
    T[cur].dd = d, T[cur].da = a, T[cur].db = b;
    wait_at(DMMA);
}

static int ldsm_misaligned, ldsm_loads;
/* cp.async of 16 bytes: both addresses 16-byte aligned (PTX ISA), or the GPU faults */
static int cp_async_misaligned;
static void m2d_emu_cp_async_check(const void *smem, const void *gmem) {
    cp_async_misaligned += (((uintptr_t)smem | (uintptr_t)gmem) & 15) != 0;
}
static void m2d_emu_ldsm_x4(uint32_t (&r)[4], const uint16_t *row) {
    T[cur].row = row, T[cur].r = r;
    wait_at(LDSM);
}


/* D = A B + C of one warp's fragments (layouts in the header comment) */
static void warp_mma(emu_thread *L) {
    float A[16][8], B[8][8], D[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, c = l & 3;
        for (int q = 0; q < 4; q++) tf32_violations += (L[l].a[q] & 0x1fffu) != 0;
        for (int q = 0; q < 2; q++) tf32_violations += (L[l].b[q] & 0x1fffu) != 0;
        A[g][c] = __uint_as_float(L[l].a[0]), A[g + 8][c] = __uint_as_float(L[l].a[1]);
        A[g][c + 4] = __uint_as_float(L[l].a[2]), A[g + 8][c + 4] = __uint_as_float(L[l].a[3]);
        B[c][g] = __uint_as_float(L[l].b[0]), B[c + 4][g] = __uint_as_float(L[l].b[1]);
        D[g][2 * c] = L[l].d[0], D[g][2 * c + 1] = L[l].d[1], D[g + 8][2 * c] = L[l].d[2], D[g + 8][2 * c + 1] = L[l].d[3];
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 8; k++) D[i][j] += A[i][k] * B[k][j]; /* TF32 x TF32 is exact in fp32 */
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, c = l & 3;
        L[l].d[0] = D[g][2 * c], L[l].d[1] = D[g][2 * c + 1], L[l].d[2] = D[g + 8][2 * c], L[l].d[3] = D[g + 8][2 * c + 1];
    }
}

/* D = A B + C of mma.m16n8k16 .f16 with fp32 accumulation (layouts at k_attention_h16): products
 * of fp16 values, exact in fp32, summed in k order in fp32; every operand finite */
static int h16_violations, h16_mmas, tf32_mmas, bf16_mmas;
static void warp_mma16(emu_thread *L) {
    float A[16][16], B[16][8], D[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, c = l & 3;
        for (int h = 0; h < 2; h++) {
            auto v = [&](uint32_t r) { return L[l].bf16 ? bf16_float((uint16_t)(r >> 16 * h)) : m2d_emu_h2f((r >> 16 * h) & 0xffffu); };
            A[g][2 * c + h] = v(L[l].a[0]), A[g + 8][2 * c + h] = v(L[l].a[1]);
            A[g][2 * c + 8 + h] = v(L[l].a[2]), A[g + 8][2 * c + 8 + h] = v(L[l].a[3]);
            B[2 * c + h][g] = v(L[l].b[0]), B[2 * c + 8 + h][g] = v(L[l].b[1]);
        }
        D[g][2 * c] = L[l].d[0], D[g][2 * c + 1] = L[l].d[1], D[g + 8][2 * c] = L[l].d[2], D[g + 8][2 * c + 1] = L[l].d[3];
    }
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) h16_violations += !isfinite(A[i][k]) + (i < 8 ? !isfinite(B[k][i]) : 0);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 16; k++) D[i][j] += A[i][k] * B[k][j]; /* fp16 or bf16 products are exact in fp32 */
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, c = l & 3;
        L[l].d[0] = D[g][2 * c], L[l].d[1] = D[g][2 * c + 1], L[l].d[2] = D[g + 8][2 * c], L[l].d[3] = D[g + 8][2 * c + 1];
    }
    (L[0].bf16 ? bf16_mmas : h16_mmas)++;
}

/* D = A B + C of mma.m8n8k4 .f64 (A a0 (g, c); B b0 (k = c, n = g); C/D (g, 2c), (g, 2c + 1)), the
 * four products summed in k order in fp64 */
static void warp_dmma(emu_thread *L) {
    double A[8][4], B[4][8], D[8][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, c = l & 3;
        A[g][c] = L[l].da, B[c][g] = L[l].db;
        D[g][2 * c] = L[l].dd[0], D[g][2 * c + 1] = L[l].dd[1];
    }
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 4; k++) D[i][j] = fma(A[i][k], B[k][j], D[i][j]);
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, c = l & 3;
        L[l].dd[0] = D[g][2 * c], L[l].dd[1] = D[g][2 * c + 1];
    }
}

/* ldmatrix .x4: lanes 8 j .. 8 j + 7 give the rows of matrix j (16 bytes each, 16-byte aligned);
 * lane l receives in r[j] the word l % 4 of matrix j's row l / 4 (PTX ISA). All rows are read
 * before any register is written, as the hardware's one collective load. */
static void warp_ldsm(emu_thread *L) {
    uint32_t got[32][4];
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 4; j++) {
            const uint16_t *row = L[8 * j + l / 4].row;
            ldsm_misaligned += ((uintptr_t)row & 15) != 0;
            memcpy(&got[l][j], row + 2 * (l % 4), 4);
        }
    for (int l = 0; l < 32; l++) memcpy(L[l].r, got[l], sizeof got[l]);
    ldsm_loads++;
}

/* complete warp W's collective if all its lanes wait at the same one; 1 when it did */
static int warp_step(int w) {
    emu_thread *L = T + 32 * w;
    wait_op op = L[0].op;
    if (op != SYNCWARP && op != SHFL && op != MMA && op != MMA16 && op != DMMA && op != LDSM) return 0;
    for (int l = 1; l < 32; l++)
        if (L[l].op != op) return 0;
    if (op == SHFL) {
        double v[32];
        for (int l = 0; l < 32; l++) v[l] = L[l].fv;
        for (int l = 0; l < 32; l++) L[l].fv = v[l ^ L[l].lane_xor];
    } else if (op == MMA) {
        warp_mma(L), tf32_mmas++;
    } else if (op == MMA16) {
        warp_mma16(L);
    } else if (op == DMMA) {
        warp_dmma(L);
    } else if (op == LDSM) {
        warp_ldsm(L);
    }
    for (int l = 0; l < 32; l++) L[l].op = RUN;
    return 1;
}

static std::function<void()> g_kernel; /* the kernel call every thread of a block makes */

static void thread_main(void) {
    FIBER_FINISH(NULL, &sched_bottom, &sched_size);
    g_kernel();
    T[cur].op = DONE;
    FIBER_START(NULL, sched_bottom, sched_size); /* this fiber ends */
    swapcontext(&T[cur].ctx, &sched);
}

/* the context switches live in functions of their own: getcontext and swapcontext return twice,
 * and a caller's loop variables would be at the mercy of that (-Wclobbered) */
static __attribute__((noinline)) void thread_start(int t) {
    getcontext(&T[t].ctx);
    T[t].ctx.uc_stack.ss_sp = T[t].stack;
    T[t].ctx.uc_stack.ss_size = STACK;
    T[t].ctx.uc_link = NULL;
    makecontext(&T[t].ctx, thread_main, 0);
    T[t].op = RUN;
}

static __attribute__((noinline)) void thread_resume(int t) {
    void *fake = NULL;
    cur = t;
    FIBER_START(&fake, T[t].stack, STACK);
    swapcontext(&sched, &T[t].ctx);
    FIBER_FINISH(fake, NULL, NULL);
}

/* one block to the end: run every runnable thread until it waits, then complete what can be */
static void run_block(unsigned bx, unsigned by, unsigned bz) {
    blockIdx.x = bx, blockIdx.y = by, blockIdx.z = bz;
    for (int t = 0; t < NT; t++) thread_start(t);
    for (;;) {
        int ran = 0, done = 0, at_barrier = 0, stepped = 0;
        for (int t = 0; t < NT; t++)
            if (T[t].op == RUN) thread_resume(t), ran = 1;
        if (ran) continue;
        for (int t = 0; t < NT; t++) done += T[t].op == DONE, at_barrier += T[t].op == BLOCK_BARRIER;
        if (done == NT) return;
        for (int w = 0; w < NT / 32; w++) stepped |= warp_step(w);
        if (stepped) continue;
        if (at_barrier != NT) fail_msg("deadlock: %d threads done, %d at __syncthreads, the rest at warp collectives that do not match", done, at_barrier);
        for (int t = 0; t < NT; t++) T[t].op = RUN;
    }
}

/* KERNEL over a grid of GX x GY x GZ blocks of THREADS threads, block after block */
static void run_grid(unsigned gx, unsigned gy, unsigned gz, int threads, std::function<void()> kernel) {
    assert_true(threads % 32 == 0 && threads <= NT_MAX);
    NT = threads, g_kernel = kernel;
    gridDim.x = gx, gridDim.y = gy, gridDim.z = gz;
    cp_async_misaligned = 0;
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) run_block(x, y, z);
    if (cp_async_misaligned) fail_msg("%d cp.async copies from or to addresses not 16-byte aligned", cp_async_misaligned);
}


/* the threads' stacks, for a cmocka group */
static int emu_setup(void **state) {
    (void)state;
    for (int t = 0; t < NT_MAX; t++) T[t].stack = (char *)malloc(STACK);
    return 0;
}

static int emu_teardown(void **state) {
    (void)state;
    for (int t = 0; t < NT_MAX; t++) free(T[t].stack);
    return 0;
}

#define M2D_CUDA_EMULATED 1
#endif
