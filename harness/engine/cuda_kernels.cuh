/* cuda_kernels — kernels of the cuda backend that also run on the CPU: the attention on tensor
 * cores (k_attention_tc in 3xTF32; k_attention_h16 in 3xFP16 with k_h16_absmax and k_h16_prep;
 * the argument block of the attention kernels, attn_dev), the MoE's grouped expert GEMMs (k_gx),
 * the LM head's one-pass log-sum-exp (k_lse_rows) and calibration's Gram (k_gram_mma,
 * k_gram_tile, k_gram_add) and reductions (k_reduce_sums, k_reduce_norms, k_reduce_select). Part
 * of backend_cuda.cu, kept in this header so that tests/test_cuda_kernels.cc compiles the same
 * source as host C++ with M2D_CUDA_EMULATED defined (mma.sync, TF32, FP16 and f64, fp16
 * conversions and cp.async then come from its emulation of a warp; threads, barriers and
 * shuffles from its coroutines): their index arithmetic, masks, tiling and sums are checked
 * against float64 on every machine, with or without a GPU. Included once, by backend_cuda.cu. */
#ifndef M2D_CUDA_KERNELS_CUH
#define M2D_CUDA_KERNELS_CUH

#include "engine/cuda_reduce.cuh" /* warp and block reductions */

struct attn_dev {
    const float *q, *ks, *vs, *kp, *vp; /* segment q/k/v, prefix cache of this layer (may be NULL) */
    int ldq, ldk, ldv, nq, np, n_heads, n_kv, hd, ldo;
    size_t head_stride;
    float *out;
    int window;          /* 0: full causal; else the keys p - window < t <= p */
    const float *sinks;  /* [n_heads] sink logits, or NULL */
    float scale;
    int vec;             /* hd % 4 == 0 and k/v rows 16-byte aligned: staged as float4s */
    const uint32_t *absmax; /* attn_kernel 3: max |x| bits per q head, k head, v head (k_h16_absmax),
                             * or NULL */
    const void *h16_tiles;  /* attn_kernel 3: keys and values as k_h16_prep made them */
    int h16_ntiles;         /* tiles a kv head: (np + nq) / TC_KEYS rounded up */
};

/* ---- attention on tensor cores: flash attention in 3xTF32 (k_attention_tc) ----
 * backend_cuda.cu's k_attention_tiled computes every score and weighted value on the CUDA cores.
 * Here both products run as mma.sync m16n8k8 TF32 with fp32 accumulation, each operand x split as
 * x = big + small (big = x rounded to TF32, 11 significant bits; small = the rest rounded to
 * TF32), and a*b = big*big + big*small + small*big: the dropped small*small and the second
 * rounding leave ~2^-22 of |a*b| per product, within a few fp32 roundings (backend.h asks fp32
 * scores; the same split as CUTLASS's 3xTF32 GEMMs). The softmax is online, fp32, per row: max,
 * expf, sum, as k_attention_tiled.
 * A block is 64 query rows of one head (4 warps x 16 rows); keys and values come 32 at a time.
 * Per warp, S = Q K^T is a 16 x 32 tile in registers (the accumulator layout: lane = 4 g + c holds
 * rows g and g + 8, columns 2c and 2c + 1 of each 8-column slab); the weights P go through shared
 * memory into the A-operand layout for O += P V; O stays in registers, rescaled per row. Head
 * dimensions up to 128, padded with zeros to HD (32, 64 or 128).
 * Beside the MMAs (each step measured on an H200, BENCHMARKS.md):
 * - keys and values are split once a block as they are staged, into TF32 planes laid out so that
 *   a B operand's two values are one 8-byte load (tc_smem); a first version split them in every
 *   warp, 4x over, with cvt.rna.tf32.f32 (which ptxas expands with tests for infinities and NaNs):
 *   2,232 instructions around a tile's 240 MMAs at HD 128 against 1,037 here;
 * - the rounding is integer arithmetic (tf32_rna), cvt.rna's bits for finite values;
 * - Q K^T keeps the big x big products and the two small terms in separate accumulators, so each
 *   chain of dependent MMAs is a third and two thirds as long;
 * - the next tile's keys and values are read into registers before this tile's MMAs (their
 *   latency hides behind them: 250 registers at HD 128, two blocks an SM);
 * - the row blocks run last block first: under the causal mask the last rows have the most keys,
 *   and starting them first shortens the grid's tail. */
#define TC_WARPS 4
#define TC_ROWS (16 * TC_WARPS) /* query rows a block */
#define TC_KEYS 32              /* keys a tile */

#ifndef M2D_CUDA_EMULATED
__device__ static __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#else /* the CPU emulation's (tests/test_cuda_kernels.cc): the same operation, a warp's lanes as coroutines */
__device__ static __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    m2d_emu_mma(d, a, b0, b1);
}
#endif

/* the three products of operands split in two (a = ah + al, b = bh + bl; MMA: mma_tf32 or
 * mma_f16): LO += al bh + ah bl, then HI += ah bh. LO and HI may be one accumulator (the small
 * terms first) or two (two shorter chains of dependent MMAs, added by the caller). */
typedef void (*mma_fn)(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t);
template <mma_fn MMA>
__device__ static __forceinline__ void mma_split3(float (&lo)[4], float (&hi)[4], const uint32_t (&ah)[4],
                                                  const uint32_t (&al)[4], uint2 bh, uint2 bl) {
    MMA(lo, al, bh.x, bh.y);
    MMA(lo, ah, bl.x, bl.y);
    MMA(hi, ah, bh.x, bh.y);
}

/* x rounded to TF32 (to nearest on the magnitude, ties away from zero: cvt.rna.tf32.f32's
 * rounding) by integer operations: half a TF32 ulp added to the bits, the low 13 dropped */
__device__ static __forceinline__ uint32_t tf32_rna(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

/* x = big + small, both TF32: |x - big - small| <= 2^-22 |x| */
__device__ static __forceinline__ uint2 tf32_pair(float x) {
    uint32_t big = tf32_rna(x);
    return make_uint2(big, tf32_rna(x - __uint_as_float(big)));
}

/* the A fragment (16 x 8: rows g and g + 8, columns c and c + 4) of a row-major float tile, split */
__device__ static __forceinline__ void a_frag_pair(const float *t, int ld, int g, int c, uint32_t (&ab)[4],
                                                   uint32_t (&as)[4]) {
    const float x[4] = {t[g * ld + c], t[(g + 8) * ld + c], t[g * ld + c + 4], t[(g + 8) * ld + c + 4]};
#pragma unroll
    for (int u = 0; u < 4; u++) {
        uint2 s = tf32_pair(x[u]);
        ab[u] = s.x, as[u] = s.y;
    }
}

/* the rows of key and value t of kv head g: the cached prefix's (t < np) or the segment's */
__device__ static __forceinline__ void tc_kv_rows(const attn_dev &a, int g, int t, const float *&kr, const float *&vr) {
    if (t < a.np) kr = a.kp + g * a.head_stride + (size_t)t * a.hd, vr = a.vp + g * a.head_stride + (size_t)t * a.hd;
    else kr = a.ks + (size_t)(t - a.np) * a.ldk + (size_t)g * a.hd, vr = a.vs + (size_t)(t - a.np) * a.ldv + (size_t)g * a.hd;
}

/* where element j of a row goes so that, within each 8, j and j + 4 sit side by side (j & 3 = c:
 * c at 2c, c + 4 at 2c + 1): a lane's two B values (k = c, c + 4 in m16n8k8 TF32; the half pairs
 * 2c, 2c + 8 in m16n8k16 FP16) become one 8-byte load */
__device__ static __forceinline__ int tc_interleave4(int j) { return (j & ~7) + 2 * (j & 3) + ((j & 4) >> 2); }

/* key and value t of kv head g, columns j .. j + 3 (zeros past `last` and past hd: zero keys add
 * nothing to a score; zero value columns are never written out) */
__device__ static __forceinline__ void tc_kv4(const attn_dev &a, int g, int t, int j, int last, float4 &kv, float4 &vv) {
    const float *kr = NULL, *vr = NULL;
    if (t <= last) tc_kv_rows(a, g, t, kr, vr);
    kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
    if (kr && a.vec && j < a.hd) { /* hd % 4 == 0 with vec: a float4 is whole or past hd */
        kv = *(const float4 *)(kr + j), vv = *(const float4 *)(vr + j);
    } else if (kr) {
        float kx[4], vx[4];
        for (int u = 0; u < 4; u++) kx[u] = j + u < a.hd ? kr[j + u] : 0.0f, vx[u] = j + u < a.hd ? vr[j + u] : 0.0f;
        kv = make_float4(kx[0], kx[1], kx[2], kx[3]), vv = make_float4(vx[0], vx[1], vx[2], vx[3]);
    }
}

/* a thread's two query rows (g and g + 8 of its warp's 16): position, first key, live */
struct tc_rows {
    int pr[2], lr[2], live[2];
};

__device__ static __forceinline__ tc_rows tc_rows_of(const attn_dev &a, int iw, int g) {
    tc_rows r;
    for (int u = 0; u < 2; u++) {
        int i = iw + g + 8 * u;
        r.live[u] = i < a.nq;
        r.pr[u] = a.np + i;
        r.lr[u] = a.window > 0 ? max(0, r.pr[u] + 1 - a.window) : 0;
    }
    return r;
}

/* exp(x), or 2^x in the log2 domain (EXP2: scores and maxima times log2 e, as flash attention
 * does: one MUFU.EX2 and a scaling instead of expf's range reduction) */
template <bool EXP2>
__device__ static __forceinline__ float tc_exp(float x) {
    return EXP2 ? exp2f(x) : expf(x);
}

/* one tile of the online softmax: the warp's 16 x TC_KEYS scores s (entry u of slab nt is row
 * g + 8 (u >> 1), key t0 + 8 nt + 2c + (u & 1)) times SC and masked, the row maxima m and this
 * thread's share of the sums l updated, s replaced by the weights p, and the rescaling of O
 * returned per row; with EXP2, SC and m carry the factor log2 e; MASK false: the caller knows every
 * key of the tile visible to every row (tc_unmasked) */
template <bool EXP2, bool MASK = true>
__device__ static __forceinline__ void tc_softmax(const tc_rows &R, int t0, int c, float sc, float (&s)[TC_KEYS / 8][4],
                                                  float (&m)[2], float (&l)[2], float (&rs)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int r = u >> 1, t = t0 + 8 * nt + 2 * c + (u & 1);
            s[nt][u] = !MASK || (R.live[r] && t >= R.lr[r] && t <= R.pr[r]) ? s[nt][u] * sc : -INFINITY;
            mx[r] = fmaxf(mx[r], s[nt][u]);
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        float mn = fmaxf(m[r], mx[r]);
        /* mn = -inf: no key of this row yet (and no sink); its weights stay 0 */
        rs[r] = mn == -INFINITY ? 1.0f : tc_exp<EXP2>(m[r] - mn);
        m[r] = mn;
        l[r] *= rs[r];
    }
    /* a row with no key yet has m = -inf and every s = -inf: exp(-inf - 0) = 0 without a branch
     * around each exponential */
    const float m0[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float p = tc_exp<EXP2>(s[nt][u] - m0[u >> 1]);
            l[u >> 1] += p;
            s[nt][u] = p;
        }
}

/* a warp's rows before their first tile: O = 0, the maxima at the sink (times MSC: log2 e in the
 * log2 domain) or -inf, this thread's share of the sums 1 for a sink (lane c = 0 holds it) */
template <int HD>
__device__ static __forceinline__ void tc_begin(const attn_dev &a, int h, int c, float msc, float (&o)[HD / 8][4],
                                                float (&m)[2], float (&l)[2]) {
    for (int nt = 0; nt < HD / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    for (int r = 0; r < 2; r++) m[r] = a.sinks ? a.sinks[h] * msc : -INFINITY, l[r] = a.sinks && c == 0 ? 1.0f : 0.0f;
}

/* O's rows rescaled by the softmax's new maxima (rs: row g, row g + 8) */
template <int HD>
__device__ static __forceinline__ void tc_rescale(float (&o)[HD / 8][4], const float (&rs)[2]) {
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) o[nt][0] *= rs[0], o[nt][1] *= rs[0], o[nt][2] *= rs[1], o[nt][3] *= rs[1];
}

/* whether keys t0 .. t0 + TC_KEYS - 1 are all visible to all 16 rows iw .. of a warp (the last key
 * at or before the first row's position, the first key inside the last row's window): most tiles
 * of a long causal window, whose softmax then skips the masks (rows past nq are never stored, so
 * what they compute does not matter) */
__device__ static __forceinline__ bool tc_unmasked(const attn_dev &a, int iw, int t0) {
    return t0 + TC_KEYS - 1 <= a.np + iw && (a.window <= 0 || t0 >= a.np + iw + 16 - a.window);
}

/* the rows' outputs O OSCALE / l (the quad's shares of l summed first; OSCALE a power of two) */
template <int HD>
__device__ static __forceinline__ void tc_store(const attn_dev &a, const tc_rows &R, int iw, int g, int c, int h,
                                                const float (&o)[HD / 8][4], float (&l)[2], float oscale) {
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    for (int r = 0; r < 2; r++) {
        if (!R.live[r]) continue;
        float *orow = a.out + (size_t)(iw + g + 8 * r) * a.ldo + (size_t)h * a.hd;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++)
            for (int e = 0; e < 2; e++) {
                int j = 8 * nt + 2 * c + e;
                if (j < a.hd) orow[j] = o[nt][2 * r + e] * oscale / l[r];
            }
    }
}

/* Q's rows i0 .. i0 + TC_ROWS - 1 of head h into shared memory, zeros past nq and hd */
template <int HD>
__device__ static void tc_load_q(const attn_dev &a, int i0, int h, float (*q)[HD + 4]) {
    for (int e = threadIdx.x; e < TC_ROWS * HD; e += TC_WARPS * 32) {
        int i = i0 + e / HD, j = e % HD;
        q[e / HD][j] = i < a.nq && j < a.hd ? a.q[(size_t)i * a.ldq + (size_t)h * a.hd + j] : 0.0f;
    }
}

/* Keys and values as TF32 planes (big, small) in the order a lane reads its two B values, so
 * that one 8-byte load gives the pair the MMA takes in consecutive registers:
 * - K, read as (key 8 nt + g; dims 8 ks + c and + c + 4): within each 8 dims, dims c and c + 4
 *   side by side (kb[key][8 ks + 2c + {0, 1}]); rows of HD + 8 words (8 mod 32: a half-warp's 16
 *   loads, (g, c) at 8g + 2c, fall in 32 banks);
 * - V, read as (keys 8 ks + c and + c + 4; dim 8 nt + g): those two keys side by side
 *   (vb[4 ks + c][dim] is a uint2); rows of HD + 4 pairs (2 HD + 8 words, 8 mod 32).
 * 111.6 KB at HD 128: two blocks an SM (228 KB, 1 KB each reserved). */
template <int HD>
struct tc_smem {
    float q[TC_ROWS][HD + 4];
    uint32_t kb[TC_KEYS][HD + 8], ks[TC_KEYS][HD + 8];
    uint2 vb[TC_KEYS / 2][HD + 4], vs[TC_KEYS / 2][HD + 4];
    float p[TC_WARPS][16][TC_KEYS + 4];
};

/* a thread's share of a tile's keys and values (float4 i: key (tid + 128 i) / (HD / 4), columns
 * 4 ((tid + 128 i) % (HD / 4)) ..) */
#define TC_PER_THREAD (TC_KEYS * HD / 4 / (TC_WARPS * 32))

/* keys and values t0 .. t0 + TC_KEYS - 1 of kv head g into registers */
template <int HD>
__device__ static __forceinline__ void tc_fetch(const attn_dev &a, int g, int t0, int last, float4 (&kr)[TC_PER_THREAD],
                                                float4 (&vr)[TC_PER_THREAD]) {
#pragma unroll
    for (int i = 0; i < TC_PER_THREAD; i++) {
        int e = threadIdx.x + i * TC_WARPS * 32;
        tc_kv4(a, g, t0 + e / (HD / 4), 4 * (e % (HD / 4)), last, kr[i], vr[i]);
    }
}

/* float4 E of a tile's keys and values (key E / (HD / 4), columns 4 (E % (HD / 4)) ..) into
 * shared memory, split into the planes */
template <int HD>
__device__ static __forceinline__ void tc_put(tc_smem<HD> &sm, int e, float4 kv, float4 vv) {
    int kk = e / (HD / 4), j = 4 * (e % (HD / 4));
    const float kx[4] = {kv.x, kv.y, kv.z, kv.w}, vx[4] = {vv.x, vv.y, vv.z, vv.w};
    int vrow = 4 * (kk / 8) + kk % 4, vhalf = kk % 8 / 4; /* keys c and c + 4 of 8 share a row */
#pragma unroll
    for (int u = 0; u < 4; u++) {
        int col = j + u, at = tc_interleave4(col); /* dims c, c + 4 side by side */
        uint2 kp = tf32_pair(kx[u]), vp = tf32_pair(vx[u]);
        sm.kb[kk][at] = kp.x, sm.ks[kk][at] = kp.y;
        (vhalf ? sm.vb[vrow][col].y : sm.vb[vrow][col].x) = vp.x;
        (vhalf ? sm.vs[vrow][col].y : sm.vs[vrow][col].x) = vp.y;
    }
}

/* ---- the scales of the 3xFP16 kernel (k_attention_h16, below), read by both kernels ----
 * fp16 has TF32's 11 significant bits but 5 exponent bits (normal from 2^-14 to 65504), so each
 * head's q, k and v are scaled by a power of two (exact) that brings its largest |x| into
 * [2^13, 2^14): k_h16_absmax finds the maxima (as float bits: an order-free max, the same on every
 * run), h16_fit the shifts. A head whose maxima are not finite or need a shift beyond
 * +-H16_SHIFT_MAX (a largest |x| at or past 2^54, or below 2^-27) stays with k_attention_tc, which
 * skips the heads k_attention_h16 takes: both are launched, each head runs once, decided on the
 * device. */
#define H16_SHIFT_MAX 40
#define H16_ROWS 64 /* rows a block of k_h16_absmax */

struct h16_shifts {
    int q, k, v;
};

/* the shift e with max 2^e in [2^13, 2^14) (0 for max 0); false when e is beyond +-H16_SHIFT_MAX
 * (infinities and NaNs, exponent field 255, give e = -115: beyond) */
__device__ static __forceinline__ bool h16_shift(uint32_t maxbits, int &e) {
    int ex = (int)(maxbits >> 23); /* |x|'s bits: no sign */
    e = maxbits == 0 ? 0 : 140 - ex; /* max in [2^(ex-127), 2^(ex-126)); subnormals: ex 0, e 140 */
    return e >= -H16_SHIFT_MAX && e <= H16_SHIFT_MAX;
}

/* head h (kv head kvh): whether k_attention_h16 runs it, and its shifts */
__device__ static __forceinline__ bool h16_fit(const attn_dev &a, int h, int kvh, h16_shifts &sh) {
    return h16_shift(a.absmax[h], sh.q) && h16_shift(a.absmax[a.n_heads + kvh], sh.k) &&
           h16_shift(a.absmax[a.n_heads + a.n_kv + kvh], sh.v);
}

template <int HD>
__global__ static void __launch_bounds__(TC_WARPS * 32) k_attention_tc(attn_dev a) {
#ifndef M2D_CUDA_EMULATED /* the CPU emulation defines tc_raw itself (a global: no extern __shared__ there) */
    extern __shared__ __align__(16) unsigned char tc_raw[];
#endif
    tc_smem<HD> &sm = *(tc_smem<HD> *)tc_raw;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, h = blockIdx.y;
    int kvh = h / (a.n_heads / a.n_kv), i0 = (int)(gridDim.x - 1 - blockIdx.x) * TC_ROWS, iw = i0 + 16 * w;
    h16_shifts sh;
    if (a.absmax && h16_fit(a, h, kvh, sh)) return; /* k_attention_h16 took this head */
    int last = a.np + M2D_MIN(i0 + TC_ROWS, a.nq) - 1; /* the block's last query position */
    int lo_blk = a.window > 0 ? max(0, a.np + i0 + 1 - a.window) : 0;
    tc_rows R = tc_rows_of(a, iw, g);
    int warp_last = a.np + M2D_MIN(iw + 15, a.nq - 1), warp_lo = a.window > 0 ? max(0, a.np + iw + 1 - a.window) : 0;
    tc_load_q<HD>(a, i0, h, sm.q);
    float o[HD / 8][4], m[2], l[2]; /* l: this thread's share of each row's sum (the quad adds them at the end) */
    tc_begin<HD>(a, h, c, 1.0f, o, m, l);
    float4 kr[TC_PER_THREAD], vr[TC_PER_THREAD]; /* the next tile's keys and values */
    tc_fetch<HD>(a, kvh, lo_blk, last, kr, vr);
    for (int t0 = lo_blk; t0 <= last; t0 += TC_KEYS) {
        __syncthreads(); /* the previous tile is consumed (and Q written, the first time) */
#pragma unroll
        for (int i = 0; i < TC_PER_THREAD; i++) tc_put<HD>(sm, threadIdx.x + i * TC_WARPS * 32, kr[i], vr[i]);
        __syncthreads();
        if (t0 + TC_KEYS <= last) tc_fetch<HD>(a, kvh, t0 + TC_KEYS, last, kr, vr); /* in flight over the MMAs */
        if (iw >= a.nq || t0 > warp_last || t0 + TC_KEYS <= warp_lo) continue; /* warp-uniform: nothing here */
        float s[TC_KEYS / 8][4], sl[TC_KEYS / 8][4]; /* big x big; the small terms */
        for (int nt = 0; nt < TC_KEYS / 8; nt++)
            for (int u = 0; u < 4; u++) s[nt][u] = sl[nt][u] = 0.0f;
#pragma unroll 4
        for (int ks = 0; ks < HD / 8; ks++) {
            uint32_t ab[4], as[4];
            a_frag_pair(&sm.q[16 * w][8 * ks], HD + 4, g, c, ab, as);
#pragma unroll
            for (int nt = 0; nt < TC_KEYS / 8; nt++) { /* B = K^T: (k = c, n = g) is K[key g][dim c] */
                uint2 bb = *(const uint2 *)&sm.kb[8 * nt + g][8 * ks + 2 * c];
                uint2 bs = *(const uint2 *)&sm.ks[8 * nt + g][8 * ks + 2 * c];
                mma_split3<mma_tf32>(sl[nt], s[nt], ab, as, bb, bs);
            }
        }
        for (int nt = 0; nt < TC_KEYS / 8; nt++)
            for (int u = 0; u < 4; u++) s[nt][u] += sl[nt][u];
        float rs[2];
        tc_softmax<false>(R, t0, c, a.scale, s, m, l, rs);
#pragma unroll
        for (int nt = 0; nt < TC_KEYS / 8; nt++)
#pragma unroll
            for (int u = 0; u < 4; u++) sm.p[w][g + 8 * (u >> 1)][8 * nt + 2 * c + (u & 1)] = s[nt][u];
        tc_rescale<HD>(o, rs);
        __syncwarp();
#pragma unroll
        for (int ks = 0; ks < TC_KEYS / 8; ks++) {
            uint32_t ab[4], as[4];
            a_frag_pair(&sm.p[w][0][8 * ks], TC_KEYS + 4, g, c, ab, as);
#pragma unroll
            for (int nt = 0; nt < HD / 8; nt++) { /* B = V: (k = c, n = g) is V[key c][dim g]; small terms first */
                uint2 bb = sm.vb[4 * ks + c][8 * nt + g], bs = sm.vs[4 * ks + c][8 * nt + g];
                mma_split3<mma_tf32>(o[nt], o[nt], ab, as, bb, bs);
            }
        }
        __syncwarp(); /* P is read before the next tile writes it */
    }
    tc_store<HD>(a, R, iw, g, c, h, o, l, 1.0f);
}

/* ---- attention on tensor cores in 3xFP16 (k_attention_h16, attn_kernel 3) ----
 * k_attention_tc's algorithm with mma.sync m16n8k16 FP16 (fp32 accumulation) instead of m16n8k8
 * TF32: the same 11 significant bits an operand part, twice the work an instruction. Each head's
 * q, k and v are scaled by powers of two into fp16's range (h16_fit, above); x = hi + lo, both fp16
 * (h16_pair): |x - hi - lo| <= 2^-22 |x|, k_attention_tc's bound, where lo is normal (|x| >=
 * 2^-3 after the scaling), else 2^-25 absolute: at most 2^-38 of the head's largest |x|. The
 * products are exact in fp32 (11 x 11 bits), so the scores and outputs carry k_attention_tc's
 * error; the shifts come off exactly (powers of two) before the softmax and at the store. What
 * changes besides the instruction:
 * - the weights P stay in registers: m16n8k16's A fragment (rows g, g + 8; columns 2c, 2c + 1 and
 *   2c + 8, 2c + 9) is the accumulator layout of two adjacent 8-key slabs of S (no shared memory
 *   round trip, no __syncwarp); P is scaled by 2^14 before its split, so that lo is normal down to
 *   p = 2^-17 (below, 2^-39 absolute against a row sum >= 1);
 * - Q is split and scaled once a block (k_attention_tc splits it in every tile), into whole A
 *   fragments: one 16-byte load a lane (as rows, two 8-byte loads cost four moves an MMA);
 * - the softmax in the log2 domain (tc_softmax<true>: exp2f, one MUFU.EX2, for expf's range
 *   reduction; one more fp32 rounding of the exponent's argument);
 * - keys and values are split and scaled once a layer (k_h16_prep, into device memory in the
 *   shared-memory layout), not once a block, and a block copies each tile with cp.async (with two
 *   buffers, while it computes on the previous one).
 * Fragments (PTX ISA, mma.m16n8k16 .f16; each register two halves, the lower index low): A a0 =
 * (row g, k 2c, 2c + 1), a1 = (row g + 8, k 2c ..), a2 = (row g, k 2c + 8, 2c + 9), a3 = (row
 * g + 8, k 2c + 8 ..); B b0 = (k 2c, 2c + 1; n g), b1 = (k 2c + 8, 2c + 9; n g); C as m16n8k8. */
#ifndef M2D_CUDA_EMULATED
__device__ static __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* (x0, x1) rounded to fp16 (to nearest even), x0 in the low half */
__device__ static __forceinline__ uint32_t h2_rn(float x0, float x1) {
    __half2 h = __floats2half2_rn(x0, x1);
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ static __forceinline__ float2 h2_float(uint32_t u) { return __half22float2(*reinterpret_cast<__half2 *>(&u)); }
/* the same MMA on bf16 operands (the layouts of mma_f16) */
__device__ static __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#else
__device__ static __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    m2d_emu_mma16(d, a, b0, b1);
}
__device__ static __forceinline__ uint32_t h2_rn(float x0, float x1) { return m2d_emu_f2h(x0) | (uint32_t)m2d_emu_f2h(x1) << 16; }
__device__ static __forceinline__ float2 h2_float(uint32_t u) { return make_float2(m2d_emu_h2f(u & 0xffffu), m2d_emu_h2f(u >> 16)); }
__device__ static __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    m2d_emu_mma_bf16(d, a, b0, b1);
}
#endif

/* (x0, x1) = hi + lo, each a pair of fp16 values */
__device__ static __forceinline__ uint2 h16_pair(float x0, float x1) {
    uint32_t hi = h2_rn(x0, x1);
    float2 b = h2_float(hi);
    return make_uint2(hi, h2_rn(x0 - b.x, x1 - b.y));
}

/* One tile of TC_KEYS keys of a kv head, split and scaled, as k_attention_h16 reads it in shared
 * memory (k_h16_prep writes them all to device memory first, padding included, so a block copies a
 * tile as it is): K as rows of HD / 2 + 8 words of half pairs (8 mod 32 for HD 64 and 128, 24 for
 * 32: a half-warp's 8-byte loads at (row g, word 2c) fall in 32 banks); V as (keys 16 ks + 2c, + 1
 * | keys 16 ks + 8 + 2c, + 1) for one dim, four halves, in rows 4 ks + c of HD + 4 (vh[row][dim]
 * read as one uint2). 35 KB at HD 128. */
template <int HD>
struct h16_tile {
    uint32_t kh[TC_KEYS][HD / 2 + 8], kl[TC_KEYS][HD / 2 + 8];
    uint16_t vh[TC_KEYS / 4][HD + 4][4], vl[TC_KEYS / 4][HD + 4][4];
};

/* k_attention_h16<HD>: each warp takes a row tile of 16, a block TC_WARPS of them; two tile
 * buffers, the next tile copied during this one. (A variant with two row tiles a warp and one
 * buffer, each K and V fragment feeding two MMAs, ran no faster on an H200: BENCHMARKS.md.) */
#define H16_ROWS_BLK (TC_WARPS * 16)

/* Shared memory: Q as whole A fragments, a lane's four registers one 16-byte load (qh[8 w + g][4 ks
 * + c]: rows 16 w + g and + 8 of warp w's row tile, k step ks; rows of HD / 4 + 4 uint4s, 4 mod
 * 8: a quarter-warp's loads, (g, c) at 4 c + 16 g words, fall in 32 banks); the two tile
 * buffers. At HD 128: 107 KB, two blocks an SM. */
template <int HD>
struct h16_smem {
    uint4 qh[H16_ROWS_BLK / 2][HD / 4 + 4], ql[H16_ROWS_BLK / 2][HD / 4 + 4];
    h16_tile<HD> kv[2];
};

/* q[i][j] of head h times SC (zero past nq and hd) */
__device__ static __forceinline__ float h16_q(const attn_dev &a, int i, int h, int j, float sc) {
    return i < a.nq && j < a.hd ? a.q[(size_t)i * a.ldq + (size_t)h * a.hd + j] * sc : 0.0f;
}

/* Q's rows i0 .. of the block, head h, times SC, split into the A-fragment planes */
template <int HD>
__device__ static void h16_load_q(const attn_dev &a, int i0, int h, float sc, h16_smem<HD> &sm) {
    for (int e = threadIdx.x; e < H16_ROWS_BLK / 2 * HD / 4; e += TC_WARPS * 32) {
        int rp = e / (HD / 4), f = e % (HD / 4), ks = f / 4, c = f % 4; /* row pair rp: tile rp / 8, g = rp % 8 */
        int r0 = i0 + 16 * (rp / 8) + rp % 8, j = 16 * ks + 2 * c;
        uint2 p[4]; /* a0 .. a3: (row g, k 2c, + 1), (row g + 8, ..), (row g, k 2c + 8, + 9), (row g + 8, ..) */
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = r0 + 8 * (u & 1), jj = j + 8 * (u >> 1);
            p[u] = h16_pair(h16_q(a, i, h, jj, sc), h16_q(a, i, h, jj + 1, sc));
        }
        sm.qh[rp][f] = make_uint4(p[0].x, p[1].x, p[2].x, p[3].x);
        sm.ql[rp][f] = make_uint4(p[0].y, p[1].y, p[2].y, p[3].y);
    }
}

/* where a tile's key KK goes in the V planes (h16_tile): row 4 (KK / 16) + ..., slot of four */
__device__ static __forceinline__ void tc_v_place(int kk, int &row, int &slot) {
    int r = kk % 16;
    row = 4 * (kk / 16) + (r & 7) / 2, slot = 2 * (r >> 3) + (r & 1);
}

/* float4 E of a tile's keys and values (key E / (HD / 4), dims 4 (E % (HD / 4)) ..), times SK and
 * SV, split into the planes */
template <int HD>
__device__ static __forceinline__ void h16_put(h16_tile<HD> &sm, int e, float4 kv, float4 vv, float sk, float sv) {
    int kk = e / (HD / 4), j = 4 * (e % (HD / 4));
    uint2 k01 = h16_pair(kv.x * sk, kv.y * sk), k23 = h16_pair(kv.z * sk, kv.w * sk);
    /* the words of dim pairs j / 2 and j / 2 + 1: pairs (2c, 2c + 1) and (2c + 8, 2c + 9) side by side */
    sm.kh[kk][tc_interleave4(j / 2)] = k01.x, sm.kl[kk][tc_interleave4(j / 2)] = k01.y;
    sm.kh[kk][tc_interleave4(j / 2 + 1)] = k23.x, sm.kl[kk][tc_interleave4(j / 2 + 1)] = k23.y;
    int row, slot;
    tc_v_place(kk, row, slot);
    uint2 v01 = h16_pair(vv.x * sv, vv.y * sv), v23 = h16_pair(vv.z * sv, vv.w * sv);
    const uint32_t hi[2] = {v01.x, v23.x}, lo[2] = {v01.y, v23.y};
#pragma unroll
    for (int u = 0; u < 4; u++) {
        sm.vh[row][j + u][slot] = (uint16_t)(hi[u >> 1] >> (16 * (u & 1)));
        sm.vl[row][j + u][slot] = (uint16_t)(lo[u >> 1] >> (16 * (u & 1)));
    }
}

/* the P fragments (hi, lo) of keys 16 ks .. 16 ks + 15 from the weights p (slabs 2 ks, 2 ks + 1),
 * times 2^14 */
__device__ static __forceinline__ void h16_p_frag(const float (&p)[TC_KEYS / 8][4], int ks, uint32_t (&ah)[4],
                                                  uint32_t (&al)[4]) {
    const float two14 = 16384.0f;
#pragma unroll
    for (int q = 0; q < 4; q++) { /* a_q: slab 2 ks + (q >> 1), row half q & 1 */
        const float *s = p[2 * ks + (q >> 1)] + 2 * (q & 1);
        uint2 x = h16_pair(s[0] * two14, s[1] * two14);
        ah[q] = x.x, al[q] = x.y;
    }
}

/* 16 bytes from device to shared memory without the registers (cp.async), and the waits for them:
 * a block copies the next tile while it computes on this one */
#ifndef M2D_CUDA_EMULATED
__device__ static __forceinline__ void cp_async16(void *smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ static __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* every group but the latest N complete */
template <int N>
__device__ static __forceinline__ void cp_async_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#else /* the emulation copies at once (and counts addresses the hardware would fault on) */
__device__ static __forceinline__ void cp_async16(void *smem, const void *gmem) {
    m2d_emu_cp_async_check(smem, gmem);
    memcpy(smem, gmem, 16);
}
__device__ static __forceinline__ void cp_async_commit(void) {}
template <int N>
__device__ static __forceinline__ void cp_async_wait(void) {}
#endif

/* tile T of kv head g (k_h16_prep's or k_b16_prep's: TILE) into shared memory, its copies
 * committed as one group */
template <class TILE>
__device__ static __forceinline__ void tc_copy_tile(const attn_dev &a, int g, int T, TILE &dst) {
    const uint4 *src = (const uint4 *)((const TILE *)a.h16_tiles + (size_t)g * a.h16_ntiles + T);
    uint4 *d = (uint4 *)&dst;
    for (int e = threadIdx.x; e < (int)(sizeof(TILE) / 16); e += TC_WARPS * 32) cp_async16(d + e, src + e);
    cp_async_commit();
}

/* keys and values of every kv head in range (h16_shift) as tiles: block (T, g) makes tile T of kv
 * head g, zeros past the sequence (np + nq keys) and past hd */
template <int HD>
__global__ static void __launch_bounds__(TC_WARPS * 32) k_h16_prep(attn_dev a) {
    int T = blockIdx.x, g = blockIdx.y, ek, ev;
    if (!h16_shift(a.absmax[a.n_heads + g], ek) || !h16_shift(a.absmax[a.n_heads + a.n_kv + g], ev)) return;
    h16_tile<HD> &t = ((h16_tile<HD> *)a.h16_tiles)[(size_t)g * a.h16_ntiles + T];
    float sk = ldexpf(1.0f, ek), sv = ldexpf(1.0f, ev);
    for (int e = threadIdx.x; e < TC_KEYS * HD / 4; e += TC_WARPS * 32) {
        float4 kv, vv;
        tc_kv4(a, g, TC_KEYS * T + e / (HD / 4), 4 * (e % (HD / 4)), a.np + a.nq - 1, kv, vv);
        h16_put<HD>(t, e, kv, vv, sk, sv);
    }
}

/* a warp's 16 x TC_KEYS scores of tile KV: hi x hi in s, the lo terms in sl (two chains of
 * dependent MMAs, not one), then added */
template <int HD>
__device__ static __forceinline__ void h16_scores(const h16_smem<HD> &sm, const h16_tile<HD> &kv, int w, int g, int c,
                                                  float (&s)[TC_KEYS / 8][4]) {
    float sl[TC_KEYS / 8][4];
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
        for (int u = 0; u < 4; u++) sl[nt][u] = s[nt][u] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < HD / 16; ks++) {
        uint4 qh = sm.qh[8 * w + g][4 * ks + c], ql = sm.ql[8 * w + g][4 * ks + c];
        const uint32_t ah[4] = {qh.x, qh.y, qh.z, qh.w}, al[4] = {ql.x, ql.y, ql.z, ql.w};
#pragma unroll
        for (int nt = 0; nt < TC_KEYS / 8; nt++) { /* B = K^T: (k = 2c, n = g) is K[key g][dim 2c] */
            uint2 bh = *(const uint2 *)&kv.kh[8 * nt + g][8 * ks + 2 * c];
            uint2 bl = *(const uint2 *)&kv.kl[8 * nt + g][8 * ks + 2 * c];
            mma_split3<mma_f16>(sl[nt], s[nt], ah, al, bh, bl);
        }
    }
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
        for (int u = 0; u < 4; u++) s[nt][u] += sl[nt][u];
}

/* O += P V of tile KV, the weights P from the registers; lo terms first */
template <int HD>
__device__ static __forceinline__ void h16_pv(const h16_tile<HD> &kv, int g, int c, const float (&p)[TC_KEYS / 8][4],
                                              float (&o)[HD / 8][4]) {
#pragma unroll
    for (int ks = 0; ks < TC_KEYS / 16; ks++) {
        uint32_t ah[4], al[4];
        h16_p_frag(p, ks, ah, al);
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) { /* B = V: (k = 2c, n = g) is V[key 2c][dim g] */
            uint2 bh = *(const uint2 *)kv.vh[4 * ks + c][8 * nt + g], bl = *(const uint2 *)kv.vl[4 * ks + c][8 * nt + g];
            mma_split3<mma_f16>(o[nt], o[nt], ah, al, bh, bl);
        }
    }
}

/* this tile of keys and values in shared memory (SMEM's two buffers kv), ready for every warp: the
 * next tile's copies start first and only this one's are waited for (an empty group where there is
 * no next tile keeps the count) */
template <class SMEM>
__device__ static __forceinline__ void tc_tile_ready(const attn_dev &a, int kvh, int t0, int last, int buf, SMEM &sm) {
    if (t0 + TC_KEYS <= last) tc_copy_tile(a, kvh, t0 / TC_KEYS + 1, sm.kv[buf ^ 1]);
    else cp_async_commit();
    cp_async_wait<1>();
    __syncthreads(); /* every thread's copies, and Q written, the first time */
}

template <int HD>
__global__ static void __launch_bounds__(TC_WARPS * 32) k_attention_h16(attn_dev a) {
#ifndef M2D_CUDA_EMULATED
    extern __shared__ __align__(16) unsigned char tc_raw[];
#endif
    h16_smem<HD> &sm = *(h16_smem<HD> *)tc_raw;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, h = blockIdx.y;
    int kvh = h / (a.n_heads / a.n_kv), i0 = (int)(gridDim.x - 1 - blockIdx.x) * H16_ROWS_BLK, iw = i0 + 16 * w;
    h16_shifts sh;
    if (!h16_fit(a, h, kvh, sh)) return; /* k_attention_tc takes this head */
    int last = a.np + M2D_MIN(i0 + H16_ROWS_BLK, a.nq) - 1;
    /* tiles start at multiples of TC_KEYS (k_h16_prep's); keys before a row's window are masked */
    int lo_blk = (a.window > 0 ? max(0, a.np + i0 + 1 - a.window) : 0) / TC_KEYS * TC_KEYS;
    tc_rows R = tc_rows_of(a, iw, g);
    int warp_last = a.np + M2D_MIN(iw + 15, a.nq - 1), warp_lo = a.window > 0 ? max(0, a.np + iw + 1 - a.window) : 0;
    /* the shifts off, and the softmax in the log2 domain */
    const float log2e = 1.4426950408889634f;
    float sc = ldexpf(a.scale, -sh.q - sh.k) * log2e, oscale = ldexpf(1.0f, -14 - sh.v);
    tc_copy_tile(a, kvh, lo_blk / TC_KEYS, sm.kv[0]);
    h16_load_q<HD>(a, i0, h, ldexpf(1.0f, sh.q), sm);
    float o[HD / 8][4], m[2], l[2]; /* registers: every index below is unrolled */
    tc_begin<HD>(a, h, c, log2e, o, m, l);
    for (int t0 = lo_blk, buf = 0; t0 <= last; t0 += TC_KEYS, buf ^= 1) {
        tc_tile_ready(a, kvh, t0, last, buf, sm);
        if (iw < a.nq && t0 <= warp_last && t0 + TC_KEYS > warp_lo) { /* warp-uniform: keys for these rows */
            float s[TC_KEYS / 8][4], rs[2];
            h16_scores<HD>(sm, sm.kv[buf], w, g, c, s);
            if (tc_unmasked(a, iw, t0)) tc_softmax<true, false>(R, t0, c, sc, s, m, l, rs);
            else tc_softmax<true>(R, t0, c, sc, s, m, l, rs);
            tc_rescale<HD>(o, rs);
            h16_pv<HD>(sm.kv[buf], g, c, s, o);
        }
        __syncthreads(); /* this tile is consumed before a later copy overwrites it */
    }
    tc_store<HD>(a, R, iw, g, c, h, o, l, oscale);
}

/* ---- attention on bf16 operands (m2d_attn_args.prec BF16; k_attention_b16) ----
 * What the CPU backend computes for BF16 (backend_cpu_attn.c), on tensor cores: q, k, v rounded to
 * bf16 (nearest even), their products exact in fp32 (mma.sync m16n8k16 BF16, fp32 accumulation),
 * and the softmax's numerators p = exp(s - m) rounded to bf16 before P V, with m the row's maximum
 * over all its keys (and its sink): a flash kernel would round p against a running maximum and
 * rescale, another rounding than the CPU's. So two passes over the keys: the maxima first (Q K^T
 * alone), then the scores again, the weights against the final maxima (no rescaling), their sum
 * unrounded in fp32, and O += P V. One MMA a product where k_attention_h16 takes three, and half
 * its shared memory a tile: keys and values are rounded once a layer (k_b16_prep), in
 * k_attention_h16's layout without the lo planes and without scaling (bf16 has fp32's range). */
__device__ static __forceinline__ uint32_t b2_rn(float x0, float x1) {
    __nv_bfloat16 b[2] = {__float2bfloat16_rn(x0), __float2bfloat16_rn(x1)};
    uint32_t u;
    memcpy(&u, b, sizeof u);
    return u;
}

template <int HD>
struct b16_tile {
    uint32_t kh[TC_KEYS][HD / 2 + 8];
    uint16_t vh[TC_KEYS / 4][HD + 4][4];
};

template <int HD>
struct b16_smem {
    uint4 qh[H16_ROWS_BLK / 2][HD / 4 + 4];
    b16_tile<HD> kv[2];
};

/* Q's rows i0 .. of the block, head h, in bf16 A fragments (h16_load_q's layout) */
template <int HD>
__device__ static void b16_load_q(const attn_dev &a, int i0, int h, b16_smem<HD> &sm) {
    for (int e = threadIdx.x; e < H16_ROWS_BLK / 2 * HD / 4; e += TC_WARPS * 32) {
        int rp = e / (HD / 4), f = e % (HD / 4), ks = f / 4, c = f % 4;
        int r0 = i0 + 16 * (rp / 8) + rp % 8, j = 16 * ks + 2 * c;
        uint32_t p[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = r0 + 8 * (u & 1), jj = j + 8 * (u >> 1);
            p[u] = b2_rn(h16_q(a, i, h, jj, 1.0f), h16_q(a, i, h, jj + 1, 1.0f));
        }
        sm.qh[rp][f] = make_uint4(p[0], p[1], p[2], p[3]);
    }
}

/* keys and values of every kv head as bf16 tiles: block (T, g) makes tile T of kv head g, zeros
 * past the sequence and past hd */
template <int HD>
__global__ static void __launch_bounds__(TC_WARPS * 32) k_b16_prep(attn_dev a) {
    int T = blockIdx.x, g = blockIdx.y;
    b16_tile<HD> &t = ((b16_tile<HD> *)a.h16_tiles)[(size_t)g * a.h16_ntiles + T];
    for (int e = threadIdx.x; e < TC_KEYS * HD / 4; e += TC_WARPS * 32) {
        float4 kv, vv;
        tc_kv4(a, g, TC_KEYS * T + e / (HD / 4), 4 * (e % (HD / 4)), a.np + a.nq - 1, kv, vv);
        int kk = e / (HD / 4), j = 4 * (e % (HD / 4)), row, slot;
        t.kh[kk][tc_interleave4(j / 2)] = b2_rn(kv.x, kv.y), t.kh[kk][tc_interleave4(j / 2 + 1)] = b2_rn(kv.z, kv.w);
        tc_v_place(kk, row, slot);
        const uint32_t v[2] = {b2_rn(vv.x, vv.y), b2_rn(vv.z, vv.w)};
#pragma unroll
        for (int u = 0; u < 4; u++) t.vh[row][j + u][slot] = (uint16_t)(v[u >> 1] >> (16 * (u & 1)));
    }
}

/* a warp's 16 x TC_KEYS scores of tile KV */
template <int HD>
__device__ static __forceinline__ void b16_scores(const b16_smem<HD> &sm, const b16_tile<HD> &kv, int w, int g, int c,
                                                  float (&s)[TC_KEYS / 8][4]) {
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
        for (int u = 0; u < 4; u++) s[nt][u] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < HD / 16; ks++) {
        uint4 q = sm.qh[8 * w + g][4 * ks + c];
        const uint32_t af[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int nt = 0; nt < TC_KEYS / 8; nt++) {
            uint2 b = *(const uint2 *)&kv.kh[8 * nt + g][8 * ks + 2 * c];
            mma_bf16(s[nt], af, b.x, b.y);
        }
    }
}

/* entry u of slab nt (row g + 8 (u >> 1), key t0 + 8 nt + 2c + (u & 1)) visible to its row */
template <bool MASK>
__device__ static __forceinline__ bool b16_sees(const tc_rows &R, int t0, int c, int nt, int u) {
    int r = u >> 1, t = t0 + 8 * nt + 2 * c + (u & 1);
    return !MASK || (R.live[r] && t >= R.lr[r] && t <= R.pr[r]);
}

/* pass 1: the rows' maxima m of the scores times SC (log2 domain), over the quad */
template <bool MASK>
__device__ static __forceinline__ void b16_max(const tc_rows &R, int t0, int c, float sc, const float (&s)[TC_KEYS / 8][4],
                                               float (&m)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (b16_sees<MASK>(R, t0, c, nt, u)) mx[u >> 1] = fmaxf(mx[u >> 1], s[nt][u] * sc);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        m[r] = fmaxf(m[r], mx[r]);
    }
}

/* pass 2: s replaced by the weights 2^(s sc - m) (0 where masked), this thread's share of the sums
 * l added unrounded */
template <bool MASK>
__device__ static __forceinline__ void b16_weights(const tc_rows &R, int t0, int c, float sc, float (&s)[TC_KEYS / 8][4],
                                                   const float (&m0)[2], float (&l)[2]) {
#pragma unroll
    for (int nt = 0; nt < TC_KEYS / 8; nt++)
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float p = b16_sees<MASK>(R, t0, c, nt, u) ? exp2f(s[nt][u] * sc - m0[u >> 1]) : 0.0f;
            l[u >> 1] += p;
            s[nt][u] = p;
        }
}

/* O += P V of tile KV, the weights P from the registers, rounded to bf16 (h16_p_frag's layout) */
template <int HD>
__device__ static __forceinline__ void b16_pv(const b16_tile<HD> &kv, int g, int c, const float (&p)[TC_KEYS / 8][4],
                                              float (&o)[HD / 8][4]) {
#pragma unroll
    for (int ks = 0; ks < TC_KEYS / 16; ks++) {
        uint32_t af[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float *x = p[2 * ks + (q >> 1)] + 2 * (q & 1);
            af[q] = b2_rn(x[0], x[1]);
        }
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            uint2 b = *(const uint2 *)kv.vh[4 * ks + c][8 * nt + g];
            mma_bf16(o[nt], af, b.x, b.y);
        }
    }
}

/* a thread's place in k_attention_b16: warp w, the lane's (g, c), head h, its kv head, the block's
 * rows i0 .. (last block first) with its last key and first tile, the warp's rows iw .. and their
 * keys. (k_attention_h16 computes the same inline: its measured code is left as it was timed.) */
struct b16_place {
    int w, g, c, h, kvh, i0, iw, last, lo_blk, warp_last, warp_lo;
    tc_rows R;
};

__device__ static __forceinline__ b16_place b16_place_of(const attn_dev &a) {
    b16_place p;
    int lane = threadIdx.x & 31;
    p.w = threadIdx.x >> 5, p.g = lane >> 2, p.c = lane & 3, p.h = blockIdx.y, p.kvh = p.h / (a.n_heads / a.n_kv);
    p.i0 = (int)(gridDim.x - 1 - blockIdx.x) * H16_ROWS_BLK, p.iw = p.i0 + 16 * p.w;
    p.last = a.np + M2D_MIN(p.i0 + H16_ROWS_BLK, a.nq) - 1;
    p.lo_blk = (a.window > 0 ? max(0, a.np + p.i0 + 1 - a.window) : 0) / TC_KEYS * TC_KEYS;
    p.R = tc_rows_of(a, p.iw, p.g);
    p.warp_last = a.np + M2D_MIN(p.iw + 15, a.nq - 1), p.warp_lo = a.window > 0 ? max(0, a.np + p.iw + 1 - a.window) : 0;
    return p;
}

/* whether tile t0 holds keys of the warp's rows (warp-uniform) */
__device__ static __forceinline__ bool b16_warp_sees(const attn_dev &a, const b16_place &p, int t0) {
    return p.iw < a.nq && t0 <= p.warp_last && t0 + TC_KEYS > p.warp_lo;
}

template <int HD>
__global__ static void __launch_bounds__(TC_WARPS * 32) k_attention_b16(attn_dev a) {
#ifndef M2D_CUDA_EMULATED
    extern __shared__ __align__(16) unsigned char tc_raw[];
#endif
    b16_smem<HD> &sm = *(b16_smem<HD> *)tc_raw;
    const b16_place P = b16_place_of(a);
    const int w = P.w, g = P.g, c = P.c, h = P.h, kvh = P.kvh, iw = P.iw, last = P.last, lo_blk = P.lo_blk;
    const float log2e = 1.4426950408889634f, sc = a.scale * log2e;
    float m[2], l[2], o[HD / 8][4], s[TC_KEYS / 8][4];
    for (int r = 0; r < 2; r++) m[r] = a.sinks ? a.sinks[h] * log2e : -INFINITY;
    tc_copy_tile(a, kvh, lo_blk / TC_KEYS, sm.kv[0]);
    b16_load_q<HD>(a, P.i0, h, sm);
    for (int t0 = lo_blk, buf = 0; t0 <= last; t0 += TC_KEYS, buf ^= 1) { /* pass 1: the maxima */
        tc_tile_ready(a, kvh, t0, last, buf, sm);
        if (b16_warp_sees(a, P, t0)) {
            b16_scores<HD>(sm, sm.kv[buf], w, g, c, s);
            if (tc_unmasked(a, iw, t0)) b16_max<false>(P.R, t0, c, sc, s, m);
            else b16_max<true>(P.R, t0, c, sc, s, m);
        }
        __syncthreads(); /* this tile is consumed before a later copy overwrites it */
    }
    /* a row with no key (past nq) keeps m = -inf: its weights are 0 against 0 */
    const float m0[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
    for (int r = 0; r < 2; r++) l[r] = a.sinks && c == 0 ? exp2f(a.sinks[h] * log2e - m0[r]) : 0.0f;
    for (int nt = 0; nt < HD / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    tc_copy_tile(a, kvh, lo_blk / TC_KEYS, sm.kv[0]);
    for (int t0 = lo_blk, buf = 0; t0 <= last; t0 += TC_KEYS, buf ^= 1) { /* pass 2: the weights and P V */
        tc_tile_ready(a, kvh, t0, last, buf, sm);
        if (b16_warp_sees(a, P, t0)) {
            b16_scores<HD>(sm, sm.kv[buf], w, g, c, s);
            if (tc_unmasked(a, iw, t0)) b16_weights<false>(P.R, t0, c, sc, s, m0, l);
            else b16_weights<true>(P.R, t0, c, sc, s, m0, l);
            b16_pv<HD>(sm.kv[buf], g, c, s, o);
        }
        __syncthreads();
    }
    tc_store<HD>(a, P.R, iw, g, c, h, o, l, 1.0f);
}

/* absmax[y] = max |x| (as float bits, NaN above infinity) over head y's values: q heads, then k
 * heads, then v heads (segment rows and the cached prefix); absmax zeroed before. A block: rows
 * H16_ROWS x blockIdx.x .. of one head (blockIdx.y), a warp's maximum by shuffles, then atomicMax. */
__global__ static void k_h16_absmax(attn_dev a, uint32_t *absmax) {
    int y = blockIdx.y, isq = y < a.n_heads, g = isq ? y : (y - a.n_heads) % a.n_kv, isv = y >= a.n_heads + a.n_kv;
    int rows = isq ? a.nq : a.np + a.nq, r0 = blockIdx.x * H16_ROWS, r1 = M2D_MIN(r0 + H16_ROWS, rows);
    uint32_t mx = 0;
    for (int64_t e = threadIdx.x; e < (int64_t)(r1 - r0) * a.hd; e += blockDim.x) {
        int t = r0 + (int)(e / a.hd), j = (int)(e % a.hd);
        const float *x, *kr, *vr;
        if (isq) x = a.q + (size_t)t * a.ldq + (size_t)y * a.hd;
        else tc_kv_rows(a, g, t, kr, vr), x = isv ? vr : kr;
        mx = max(mx, __float_as_uint(x[j]) & 0x7fffffffu);
    }
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0 && mx) atomicMax(&absmax[y], mx);
}

/* ---- calibration's Gram: g[i][j] += Σ_t Σ_c F[t, i*d + c] F[t, j*d + c] ----
 * Every product and sum in fp64 (SPEC §1) at either precision (more accurate than backend.h
 * promises for BF16). A block: a 64 x 64 tile of (i, j) over one of GRAM_SLICES fixed slices of
 * the rows; each thread 4 x 4 entries (rows ty + 16 r, columns tx + 16 q), so each pair of
 * staged values feeds 4 FMAs (the one-entry-a-thread tiles read shared memory twice per FMA and
 * were bound by it); each entry sums its slice in a fixed order (t, then c), then k_gram_add adds
 * the slices in order: the same bits on every run. Tiles wholly below the diagonal are skipped. */
#define GRAM_TILE 64    /* experts a side of a block's tile */
#define GRAM_CC 16      /* columns staged at a time */
#define GRAM_SLICES 64  /* fixed slices of the rows (blocks along z) */
#define GRAM_THREADS 256

/* columns c0 .. c0 + GRAM_CC - 1 of experts i0 .. and j0 .. (GRAM_TILE each) of one row of F into
 * the staged tiles A and B as fp64, zeros past E and d; THREADS threads share the copy */
template <int LD>
__device__ static __forceinline__ void gram_stage(const float *row, int i0, int j0, int E, int d, int c0, int threads,
                                                  double (*A)[LD], double (*B)[LD]) {
    for (int e = threadIdx.x; e < GRAM_TILE * GRAM_CC; e += threads) {
        int r = e / GRAM_CC, cc = e % GRAM_CC, col = c0 + cc;
        A[r][cc] = i0 + r < E && col < d ? (double)row[(size_t)(i0 + r) * d + col] : 0.0;
        B[r][cc] = j0 + r < E && col < d ? (double)row[(size_t)(j0 + r) * d + col] : 0.0;
    }
}

__global__ static void __launch_bounds__(GRAM_THREADS) k_gram_tile(const float *f, int ld, int n, int E, int d, double *part) {
    /* stride GRAM_CC + 1 doubles: tx's 16 rows of B read in one column fall in distinct banks */
    __shared__ double A[GRAM_TILE][GRAM_CC + 1], B[GRAM_TILE][GRAM_CC + 1];
    int i0 = blockIdx.y * GRAM_TILE, j0 = blockIdx.x * GRAM_TILE, s = blockIdx.z;
    if (i0 > j0 + GRAM_TILE - 1) return; /* wholly below the diagonal: not needed (the whole block) */
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int t0 = (int)((int64_t)n * s / GRAM_SLICES), t1 = (int)((int64_t)n * (s + 1) / GRAM_SLICES);
    double acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) acc[r][q] = 0.0;
    for (int t = t0; t < t1; t++) {
        const float *row = f + (size_t)t * ld;
        for (int c0 = 0; c0 < d; c0 += GRAM_CC) {
            gram_stage(row, i0, j0, E, d, c0, GRAM_THREADS, A, B);
            __syncthreads();
#pragma unroll 4
            for (int cc = 0; cc < GRAM_CC; cc++) {
                double a[4], b[4];
                for (int r = 0; r < 4; r++) a[r] = A[ty + 16 * r][cc], b[r] = B[tx + 16 * r][cc];
                for (int r = 0; r < 4; r++)
                    for (int q = 0; q < 4; q++) acc[r][q] = fma(a[r], b[q], acc[r][q]);
            }
            __syncthreads();
        }
    }
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
            int i = i0 + ty + 16 * r, j = j0 + tx + 16 * q;
            if (i < E && j < E) part[((size_t)s * E + i) * E + j] = acc[r][q];
        }
}

/* ---- the same Gram on the fp64 tensor cores (k_gram_mma, knob gram_kernel 1, the default; 2 with
 * the next chunk's loads in flight during this chunk's DMMAs, until a GPU has timed both) ----
 * k_gram_tile's FMAs read two staged doubles for four FMAs, and shared memory bounds them; here
 * mma.sync m8n8k4 f64 (DMMA) multiplies 8 x 4 by 4 x 8 tiles in the tensor cores: per k-step a
 * lane loads 8 doubles for 16 MMAs (4096 FMAs a warp). Every product and sum stays fp64 (the
 * products of fp32 values are exact; the MMA's sums are fp64 roundings: the same bound as
 * k_gram_tile's). A block: a 64 x 64 tile of (i, j) over one of GRAM_MMA_SLICES slices of the rows,
 * 4 warps of 32 x 32 (4 x 4 MMA tiles of 8 x 8). Fragments (PTX ISA, m8n8k4 .f64; g = lane / 4,
 * c = lane % 4): A a0 = (row g, k c), B b0 = (k c, column g), C/D = (row g, columns 2c, 2c + 1).
 * Staged rows of GRAM_CC + 4 doubles (40 words, 8 mod 32): a half-warp's 16 loads of (row g,
 * column c), at words 8g + 2c, fall in 32 distinct banks. */
#define GRAM_MMA_SLICES 128 /* fixed slices of the rows: 3 x 128 blocks for E = 128 */
#define GRAM_MMA_THREADS 128

#ifndef M2D_CUDA_EMULATED
__device__ static __forceinline__ void mma_f64(double (&d)[2], double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a), "d"(b));
}
#else
__device__ static __forceinline__ void mma_f64(double (&d)[2], double a, double b) { m2d_emu_dmma(d, a, b); }
#endif

/* gram_stage's copy in two halves, for k_gram_mma's prefetch: this thread's GRAM_PER values of
 * each tile into registers (gram_fetch: the next stage's loads in flight while this one's MMAs
 * run), then into the staged tiles as fp64 (gram_put); the same values as gram_stage's */
#define GRAM_PER (GRAM_TILE * GRAM_CC / GRAM_MMA_THREADS)
__device__ static __forceinline__ void gram_fetch(const float *row, int i0, int j0, int E, int d, int c0,
                                                  float (&ra)[GRAM_PER], float (&rb)[GRAM_PER]) {
#pragma unroll
    for (int u = 0; u < GRAM_PER; u++) {
        int e = threadIdx.x + u * GRAM_MMA_THREADS, r = e / GRAM_CC, col = c0 + e % GRAM_CC;
        ra[u] = i0 + r < E && col < d ? row[(size_t)(i0 + r) * d + col] : 0.0f;
        rb[u] = j0 + r < E && col < d ? row[(size_t)(j0 + r) * d + col] : 0.0f;
    }
}
template <int LD>
__device__ static __forceinline__ void gram_put(double (*A)[LD], double (*B)[LD], const float (&ra)[GRAM_PER],
                                                const float (&rb)[GRAM_PER]) {
#pragma unroll
    for (int u = 0; u < GRAM_PER; u++) {
        int e = threadIdx.x + u * GRAM_MMA_THREADS, r = e / GRAM_CC, cc = e % GRAM_CC;
        A[r][cc] = (double)ra[u], B[r][cc] = (double)rb[u];
    }
}

/* one staged chunk's DMMAs of a warp (its 32 x 32 quarter at wi, wj) */
template <int LD>
__device__ static __forceinline__ void gram_mma_chunk(const double (*A)[LD], const double (*B)[LD], int wi, int wj, int g,
                                                      int c, double (&acc)[4][4][2]) {
#pragma unroll
    for (int k0 = 0; k0 < GRAM_CC; k0 += 4) {
        double a[4], b[4];
#pragma unroll
        for (int q = 0; q < 4; q++) a[q] = A[wi + 8 * q + g][k0 + c], b[q] = B[wj + 8 * q + g][k0 + c];
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int nj = 0; nj < 4; nj++) mma_f64(acc[mi][nj], a[mi], b[nj]);
    }
}

/* PREFETCH (gram_kernel 2): the next chunk's values fetched into registers before this chunk's
 * DMMAs (the same chunks, values and DMMAs in the same order: the same bits as without) */
template <bool PREFETCH>
__global__ static void __launch_bounds__(GRAM_MMA_THREADS) k_gram_mma(const float *f, int ld, int n, int E, int d,
                                                                       double *part) {
    __shared__ __align__(16) double A[GRAM_TILE][GRAM_CC + 4], B[GRAM_TILE][GRAM_CC + 4];
    int i0 = blockIdx.y * GRAM_TILE, j0 = blockIdx.x * GRAM_TILE, s = blockIdx.z;
    if (i0 > j0 + GRAM_TILE - 1) return; /* wholly below the diagonal: not needed (the whole block) */
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int wi = 32 * (w >> 1), wj = 32 * (w & 1); /* the warp's quarter of the tile */
    int t0 = (int)((int64_t)n * s / GRAM_MMA_SLICES), t1 = (int)((int64_t)n * (s + 1) / GRAM_MMA_SLICES);
    double acc[4][4][2];
    for (int mi = 0; mi < 4; mi++)
        for (int nj = 0; nj < 4; nj++) acc[mi][nj][0] = acc[mi][nj][1] = 0.0;
    if (PREFETCH) {
        int nc = (d + GRAM_CC - 1) / GRAM_CC, Q = (t1 - t0) * nc; /* stages: rows t, then chunks */
        float ra[GRAM_PER], rb[GRAM_PER];
        if (Q > 0) gram_fetch(f + (size_t)t0 * ld, i0, j0, E, d, 0, ra, rb);
        for (int q = 0; q < Q; q++) {
            gram_put(A, B, ra, rb);
            __syncthreads();
            if (q + 1 < Q)
                gram_fetch(f + (size_t)(t0 + (q + 1) / nc) * ld, i0, j0, E, d, (q + 1) % nc * GRAM_CC, ra, rb);
            gram_mma_chunk(A, B, wi, wj, g, c, acc);
            __syncthreads();
        }
    } else {
        for (int t = t0; t < t1; t++) {
            const float *row = f + (size_t)t * ld;
            for (int c0 = 0; c0 < d; c0 += GRAM_CC) {
                gram_stage(row, i0, j0, E, d, c0, GRAM_MMA_THREADS, A, B);
                __syncthreads();
                gram_mma_chunk(A, B, wi, wj, g, c, acc);
                __syncthreads();
            }
        }
    }
    for (int mi = 0; mi < 4; mi++)
        for (int nj = 0; nj < 4; nj++)
            for (int u = 0; u < 2; u++) {
                int i = i0 + wi + 8 * mi + g, j = j0 + wj + 8 * nj + 2 * c + u;
                if (i < E && j < E) part[((size_t)s * E + i) * E + j] = acc[mi][nj][u];
            }
}

/* g[i][j] += the SLICES partial sums, in slice order, for i <= j (backend.h: the upper triangle) */
__global__ static void k_gram_add(const double *part, int slices, int E, double *g) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)E * E) return;
    int i = (int)(id / E), j = (int)(id % E);
    if (i > j) return;
    double s = 0;
    for (int q = 0; q < slices; q++) s += part[(size_t)q * E * E + id];
    g[id] += s;
}

/* ---- calibration's reductions of the expert outputs (backend.h experts_reduce) ----
 * f stays on the device; what leaves it is E x d sums, E x n norms and k1 rows a token (on
 * Qwen3-30B-A3B 9 of 128 experts' rows instead of all). */

/* sum_f[e, j] += f_e(t)[j] over t = 0 .. n-1 in order, one thread an element: fp64 additions of
 * fp32 values in the CPU's order, so the CPU's bits */
__global__ static void k_reduce_sums(const float *f, int ld, int n, int E, int d, double *sum_f) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)E * d) return;
    double acc = sum_f[id];
    for (int t = 0; t < n; t++) acc += (double)f[(size_t)t * ld + id]; /* expert e's row at e*d: id = e*d + j */
    sum_f[id] = acc;
}

/* norm2[e, t] = ‖f_e(t)‖², one warp a (token, expert): lane sums, then the warp's (fp64) */
__global__ static void k_reduce_norms(const float *f, int ld, int n, int E, int d, double *norm2) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)E * n) return; /* whole warps: blockDim a multiple of 32 */
    int e = (int)(w / n), t = (int)(w % n);
    const float *row = f + (size_t)t * ld + (size_t)e * d;
    double q = 0;
    for (int j = lane; j < d; j += 32) q += (double)row[j] * row[j];
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    if (lane == 0) norm2[(size_t)e * n + t] = q;
}

/* sel[t, r, :] = f_{ids[t, r]}(t), zeros for id -1 */
__global__ static void k_reduce_select(const float *f, int ld, int n, int d, const int32_t *ids, int k1, float *sel) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)n * k1 * d) return;
    int64_t tr = id / d;
    int j = (int)(id % d), t = (int)(tr / k1), ex = ids[tr];
    sel[id] = ex < 0 ? 0.0f : f[(size_t)t * ld + (size_t)ex * d + j];
}

/* ---- the MoE's grouped expert GEMMs on mma.sync (k_gx: knob moe_grouped 3) ----
 * backend_cuda.cu's k_grouped (WMMA, 32 x 64 tiles, a k step's loads through the registers) ran
 * the Qwen3-30B-A3B slice's experts at ~77 TFLOP/s on an H200 (2 ms a layer of 2,048 tokens for
 * 155 GFLOP). Here a block computes BM (32 or 64) bucket rows x GX_BN weight rows with mma.sync
 * m16n8k16 BF16 (fp32 accumulation, as CUBLAS_COMPUTE_32F): each warp 32 rows x GX_BN / WN
 * weight rows (BM 64: 2 x 2 warps, 32 x 64, 16 MMAs a k16 step for 10 fragment loads), the
 * operand tiles copied by cp.async into GX_STAGES shared-memory stages (the copies of steps
 * k + 1 .. k + GX_STAGES - 1 in flight while step k computes: at pp512 ncu found k_gx at 39-46 %
 * of the DRAM bandwidth and 35 % of the SMs' throughput, latency-bound, yet 6 stages timed no
 * faster than 3 on an H200, BENCHMARKS.md run 11). NB 2 (gate and up): the block's weight rows
 * are 64 gate and 64 up rows of the same 64 output columns (128 and 128 with the knob gx_wide),
 * so the epilogue has both for SwiGLU; NB 1 (down): 128 rows of one matrix. The epilogue is k_grouped's: the accumulators through shared
 * memory, the biases, the activation, H rounded to bf16 or fp32 outputs. Operands bf16 only,
 * K a multiple of 8 and 16-byte aligned rows (gx_fits); k_grouped takes the rest.
 * Fragments as m16n8k16 .f16 (k_attention_h16's comment): A a0 = (row g, k 2c, 2c + 1), a1 =
 * (row g + 8, ..), a2 = (row g, k 2c + 8, + 9), a3 = (row g + 8, ..); B b0 = (k 2c, 2c + 1; n g),
 * b1 = (k 2c + 8, + 9; n g): a weight row n holds B's column n, so both are 32-bit loads of
 * (row, k pair) from row-major tiles; rows of GX_LDS = 40 halves (20 words): the 8 rows g of a
 * load, at words 20 g + c, fall in 32 distinct banks. */
#define GM_MAX_E 256
#define GM_MAX_K 32 /* top-k at most (plan_tokens) */
#define GX_BK 32        /* inner-dimension step */
#define GX_STAGES 3       /* cp.async stages */
#define GX_LDS (GX_BK + 8)
#define GX_BN 128       /* weight rows a block (GX_BN_WIDE with the knob gx_wide 1) */
#define GX_BN_WIDE 256
#define GX_T 128        /* threads a block: 4 warps */

/* ---- the MoE's bucket plan on many blocks (k_plan_count, k_plan_scan, k_plan_place) ----
 * The first plan kernel was one block of 1,024 threads, chunk after chunk: 147 µs a layer at 2,048
 * tokens x 8 experts on an H200 (ncu), a tenth of the MoE op; these three gave 3 % more tokens/s
 * on the Qwen3-30B-A3B slice and the same bits (BENCHMARKS.md, run 11). The pairs (t k + j) come
 * in chunks of whole tokens, at most PLAN_T pairs, one block each:
 *   k_plan_count  a chunk's pairs per expert (shared-memory counts) into base[chunk][E];
 *   k_plan_scan   one block, a thread an expert: its rows in earlier chunks, the bucket starts
 *                 (start), so base[chunk][e] = the first row of chunk's pairs of expert e; the
 *                 tiles of BM rows in expert order;
 *   k_plan_place  a pair's row = base[chunk][e] + the pairs of e before it in the chunk (counted
 *                 in shared memory: < PLAN_T compares); then each of the chunk's tokens' rows
 *                 sorted ascending.
 * The plan is the host's moe_plan_make's, value for value: a stable counting sort (token order
 * within a bucket), the tiles, each token's rows sorted, -1 and the error flag for ids out of range. */
#define PLAN_T 256

struct gm_plan { /* int32 arrays in SLOT_MOE_PLAN */
    int32_t *start;   /* [E + 1] bucket starts; start[E] = the rows in use */
    int32_t *pair;    /* [nk] the pair (t*k + j) of each bucket row */
    int32_t *row_of;  /* [nk] the bucket row of each pair, -1: expert id out of range */
    int32_t *tok_rows; /* [nk] each token's rows ascending (expert-id order), -1 padded */
    int32_t *tile_e, *tile_r0; /* [max_tiles] each tile's expert and first row */
    int32_t *n_tiles; /* [1] */
    int32_t *err;     /* [1] set to 1 by an expert id out of range */
    int32_t *base;    /* [chunks][E] chunk counts, then each chunk's first rows */
};

/* tokens a chunk (k <= GM_MAX_K), and the chunks of n tokens */
__host__ __device__ static inline int plan_tokens(int k) { return PLAN_T / k; }
__host__ __device__ static inline int plan_chunks(int n, int k) { return (n + plan_tokens(k) - 1) / plan_tokens(k); }

/* this block's chunk: pairs [i0, i1) */
__device__ static __forceinline__ void plan_chunk(int n, int k, int &i0, int &i1) {
    i0 = blockIdx.x * plan_tokens(k) * k;
    i1 = M2D_MIN(i0 + plan_tokens(k) * k, n * k);
}

__global__ static void __launch_bounds__(PLAN_T) k_plan_count(const int32_t *topk, int n, int k, int E, gm_plan p) {
    __shared__ int cnt[GM_MAX_E];
    int i0, i1;
    plan_chunk(n, k, i0, i1);
    for (int e = threadIdx.x; e < E; e += PLAN_T) cnt[e] = 0;
    __syncthreads();
    int i = i0 + (int)threadIdx.x;
    if (i < i1) {
        int e = topk[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1); /* integer counts: order-independent */
        else *p.err = 1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += PLAN_T) p.base[(size_t)blockIdx.x * E + e] = cnt[e];
}

/* one block of PLAN_T >= E threads */
__global__ static void __launch_bounds__(PLAN_T) k_plan_scan(int chunks, int E, int bm, gm_plan p) {
    __shared__ int tot[GM_MAX_E], tile0[GM_MAX_E + 1];
    int e = threadIdx.x;
    if (e < E) { /* expert e's rows before each chunk */
        int s = 0;
        for (int c = 0; c < chunks; c++) {
            int v = p.base[(size_t)c * E + e];
            p.base[(size_t)c * E + e] = s;
            s += v;
        }
        tot[e] = s;
    }
    __syncthreads();
    if (e == 0) {
        int s = 0;
        tile0[0] = 0;
        for (int q = 0; q < E; q++) {
            p.start[q] = s;
            s += tot[q];
            tile0[q + 1] = tile0[q] + (tot[q] + bm - 1) / bm;
        }
        p.start[E] = s;
        *p.n_tiles = tile0[E];
    }
    __syncthreads();
    if (e < E) {
        int s0 = p.start[e];
        for (int c = 0; c < chunks; c++) p.base[(size_t)c * E + e] += s0;
        for (int q = tile0[e]; q < tile0[e + 1]; q++) p.tile_e[q] = e, p.tile_r0[q] = s0 + (q - tile0[e]) * bm;
    }
}

__global__ static void __launch_bounds__(PLAN_T) k_plan_place(const int32_t *topk, int n, int k, int E, gm_plan p) {
    __shared__ int ex[PLAN_T], row[PLAN_T];
    int i0, i1, tid = threadIdx.x;
    plan_chunk(n, k, i0, i1);
    int i = i0 + tid, e = i < i1 ? topk[i] : -1;
    ex[tid] = e >= 0 && e < E ? e : -1;
    __syncthreads();
    if (i < i1) {
        int pos = -1;
        if (ex[tid] >= 0) {
            pos = p.base[(size_t)blockIdx.x * E + e];
            for (int j = 0; j < tid; j++) pos += ex[j] == e;
            p.pair[pos] = i;
        }
        p.row_of[i] = pos, row[tid] = pos;
    }
    __syncthreads();
    int t = i0 / k + tid;
    if (tid < plan_tokens(k) && t < n) { /* insertion sort of the token's k rows; -1 last */
        int32_t *o = p.tok_rows + (size_t)t * k, m = 0;
        for (int j = 0; j < k; j++) {
            int r = row[tid * k + j];
            if (r < 0) continue;
            int q = m++;
            while (q > 0 && o[q - 1] > r) o[q] = o[q - 1], q--;
            o[q] = r;
        }
        for (int j = m; j < k; j++) o[j] = -1;
    }
}

/* the weights of the grouped GEMM: NB matrices [N, K] per expert (gate and up, or down), their
 * biases (NULL: none), all of one dtype each (kernel parameters: 8 KiB, under CUDA's 32 KiB) */
struct gm_ptrs {
    const void *w[2][GM_MAX_E];
    const void *b[2][GM_MAX_E];
};

struct gm_args {
    const __nv_bfloat16 *a; /* operand rows: expert e's row r at a + e*a_es + r*lda */
    int lda;
    int64_t a_es;
    int K, N;               /* inner dimension, output columns (weight rows) */
    const int32_t *tile_e, *tile_r0, *n_tiles, *start; /* tiles; bucket e ends at start[e + 1] */
    int rows_const;         /* > 0: every expert's rows are [0, rows_const) (start unused) */
    void *c;                /* result: expert e's row r at c + e*c_es + r*ldc (bf16 H or fp32 Y) */
    int ldc;
    int64_t c_es;
    int b_bf16;             /* biases stored bf16 (else fp32) */
    int clamp;              /* GLU: the clamped SwiGLU (alpha, limit) instead of SwiGLU */
    float alpha, limit;
};

/* silu(g) * u of one element (k_glu and the grouped MoE's epilogues) */
__device__ static float swiglu1(float g, float u) { return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u); }

/* GPT-OSS's clamped SwiGLU (backend_cpu.c swiglu_clamp) */
__device__ static float swiglu_clamp1(float g, float u, float alpha, float limit) {
    float a = fminf(g, limit), b = fminf(fmaxf(u, -limit), limit);
    return __fmul_rn(__fadd_rn(b, 1.0f), __fdiv_rn(a, __fadd_rn(1.0f, expf(__fmul_rn(-alpha, a)))));
}

__device__ static float gm_bias(const void *b, int bf16, int j) {
    if (!b) return 0.0f;
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)b)[j]) : ((const float *)b)[j];
}

/* tile TILE's expert and rows [r0, r1): from the plan, or every expert on [0, rows_const) (the
 * grid then exact); false for a spare block past the plan's tiles */
template <int BM>
__device__ static __forceinline__ bool gm_tile(const gm_args &g, int tile, int &e, int &r0, int &r1) {
    if (g.rows_const > 0) {
        int per = (g.rows_const + BM - 1) / BM;
        e = tile / per, r0 = tile % per * BM, r1 = M2D_MIN(r0 + BM, g.rows_const);
        return true;
    }
    if (tile >= *g.n_tiles) return false;
    e = g.tile_e[tile], r0 = g.tile_r0[tile], r1 = M2D_MIN(r0 + BM, g.start[e + 1]);
    return true;
}

/* the bias-added result C (the tile's accumulators, NB x COLS columns) written out: NB 2,
 * act(gate, up) rounded to bf16 (columns j of gate and COLS + j of up); NB 1, fp32 */
template <int NB, int BM, int LDC>
__device__ static void gm_epilogue(const gm_args &g, const gm_ptrs &p, int e, int r0, int r1, int n0, int cols,
                                   const float *C) {
    for (int q = threadIdx.x; q < BM * cols; q += blockDim.x) {
        int m = q / cols, j = q % cols, r = r0 + m, col = n0 + j;
        if (r >= r1 || col >= g.N) continue;
        float v = __fadd_rn(C[m * LDC + j], gm_bias(p.b[0][e], g.b_bf16, col));
        size_t o = (size_t)e * g.c_es + (size_t)r * g.ldc + col;
        if (NB == 1) {
            ((float *)g.c)[o] = v;
            continue;
        }
        float u = __fadd_rn(C[m * LDC + cols + j], gm_bias(p.b[1][e], g.b_bf16, col));
        float h = g.clamp ? swiglu_clamp1(v, u, g.alpha, g.limit) : swiglu1(v, u);
        ((__nv_bfloat16 *)g.c)[o] = __float2bfloat16_rn(h);
    }
}

#ifndef M2D_CUDA_EMULATED
/* BYTES (16 or 0) of 16 from device memory, the rest zeros */
__device__ static __forceinline__ void cp_async16_fill(void *smem, const void *gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(smem)),
                 "l"(gmem), "r"(bytes));
}
#else
__device__ static __forceinline__ void cp_async16_fill(void *smem, const void *gmem, int bytes) {
    m2d_emu_cp_async_check(smem, gmem);
    memset(smem, 0, 16);
    memcpy(smem, gmem, (size_t)bytes);
}
#endif

/* ldmatrix .x4 (PTX ISA, "warp-level matrix load"): four 8 x 8 matrices of 16-bit values from
 * shared memory, lanes 8 j .. 8 j + 7 giving the 16-byte rows of matrix j (ROW: this lane's row);
 * lane l receives in r[j] the 32-bit word l % 4 of matrix j's row l / 4 */
#ifndef M2D_CUDA_EMULATED
__device__ static __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(row)));
}
#else
__device__ static __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t *row) { m2d_emu_ldsm_x4(r, row); }
#endif

template <int BM, int BN>
struct gx_smem {
    union {
        struct {
            uint16_t a[GX_STAGES][BM][GX_LDS], b[GX_STAGES][BN][GX_LDS];
        } in;
        float c[BM][BN + 4]; /* the accumulators, for the epilogue */
    };
};

/* a block's 4 warps over its BM x BN tile: WM x WN warps of WR rows (MI m16 fragments) and
 * BN / WN weight rows (NF n8 fragments). BN 128: 32-row warps (BM 64: 2 x 2 warps of 32 x 64);
 * BN 256 (knob gx_wide): one row of 4 warps of BM x 64, twice the MMAs for each fragment loaded
 * at BM 64, and each A tile copied once for twice the weight rows. */
template <int BM, int BN>
struct gx_warps {
    static constexpr int WM = BN == GX_BN_WIDE ? 1 : BM / 32, WN = 4 / WM, WR = BM / WM, MI = WR / 16, NF = BN / WN / 8;
};

/* inner step KT's operand tiles into stage S, as one cp.async group: the bucket rows r0 .. r1 of
 * A (rows past r1 copy row r0: computed, never stored) and the block's weight rows (past N, row 0;
 * NB 2: gate rows n0 .. n0 + BN / 2 - 1, then up's); chunks past K are zeros */
template <int NB, int BM, int BN>
__device__ static __forceinline__ void gx_load(const gm_args &g, const gm_ptrs &p, int e, const __nv_bfloat16 *A,
                                               int r0, int r1, int n0, int kt, gx_smem<BM, BN> &sm) {
    int s = kt % GX_STAGES, k0 = kt * GX_BK;
#pragma unroll
    for (int i = 0; i < BM * (GX_BK / 8) / GX_T; i++) {
        int q = threadIdx.x + i * GX_T, m = q / (GX_BK / 8), kc = k0 + q % (GX_BK / 8) * 8, r = r0 + m < r1 ? r0 + m : r0;
        bool in = kc < g.K;
        cp_async16_fill(&sm.in.a[s][m][kc - k0], A + (size_t)r * g.lda + (in ? kc : 0), in ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < BN * (GX_BK / 8) / GX_T; i++) {
        int q = threadIdx.x + i * GX_T, row = q / (GX_BK / 8), kc = k0 + q % (GX_BK / 8) * 8;
        int b = NB == 2 ? row / (BN / 2) : 0, n = n0 + (NB == 2 ? row % (BN / 2) : row);
        bool in = kc < g.K;
        const __nv_bfloat16 *w = (const __nv_bfloat16 *)p.w[b][e] + (size_t)(n < g.N ? n : 0) * g.K;
        cp_async16_fill(&sm.in.b[s][row][kc - k0], w + (in ? kc : 0), in ? 16 : 0);
    }
    cp_async_commit();
}

/* the 32-bit word of halves (k, k + 1) of a tile row */
__device__ static __forceinline__ uint32_t gx_word(const uint16_t *row, int k) { return *(const uint32_t *)(row + k); }

/* one stage's MMAs of warp (wm, wn): rows WR wm .., weight rows BN / WN wn .. (fragment loads
 * of 32-bit words, or LDSM: ldmatrix, a quarter of the load instructions; the same values, so the
 * same MMAs in the same order and the same bits) */
template <int BM, int BN, bool LDSM, int WR = gx_warps<BM, BN>::WR, int MI = gx_warps<BM, BN>::MI,
          int NF = gx_warps<BM, BN>::NF>
__device__ static __forceinline__ void gx_mma(const gx_smem<BM, BN> &sm, int s, int wm, int wn, int lane,
                                              float (&acc)[MI][NF][4]) {
    int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int ks = 0; ks < GX_BK; ks += 16) {
        uint32_t af[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            if (LDSM) { /* matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): a0 .. a3 */
                ldsm_x4(af[mi], &sm.in.a[s][WR * wm + 16 * mi + (lane & 15)][ks + (lane >> 4) * 8]);
            } else {
                const uint16_t *r = sm.in.a[s][WR * wm + 16 * mi + g], *r8 = sm.in.a[s][WR * wm + 16 * mi + g + 8];
                af[mi][0] = gx_word(r, ks + 2 * c), af[mi][1] = gx_word(r8, ks + 2 * c);
                af[mi][2] = gx_word(r, ks + 2 * c + 8), af[mi][3] = gx_word(r8, ks + 2 * c + 8);
            }
        }
        if (!LDSM) {
#pragma unroll
            for (int ni = 0; ni < NF; ni++) {
                const uint16_t *w = sm.in.b[s][NF * 8 * wn + 8 * ni + g];
                uint32_t b0 = gx_word(w, ks + 2 * c), b1 = gx_word(w, ks + 2 * c + 8);
#pragma unroll
                for (int mi = 0; mi < MI; mi++) mma_bf16(acc[mi][ni], af[mi], b0, b1);
            }
        } else {
#pragma unroll
            for (int ni = 0; ni < NF; ni += 2) { /* matrices (ni's rows, k 0-7), (ni, 8-15), (ni + 1, 0-7), (ni + 1, 8-15) */
                uint32_t b[4];
                ldsm_x4(b, sm.in.b[s][NF * 8 * wn + 8 * (ni + (lane >> 4)) + (lane & 7)] + ks + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) mma_bf16(acc[mi][ni + h], af[mi], b[2 * h], b[2 * h + 1]);
            }
        }
    }
}

/* one block per (tile, BN / NB output columns); shared memory sizeof(gx_smem<BM, BN>), dynamic;
 * BN GX_BN or GX_BN_WIDE (knob gx_wide 1); LDSM: the fragments by ldmatrix (knob gx_ldsm 1) */
template <int NB, int BM, int BN, bool LDSM>
__global__ static void __launch_bounds__(GX_T) k_gx(gm_args g, gm_ptrs p) {
    using W = gx_warps<BM, BN>;
    constexpr int WN = W::WN, WR = W::WR, MI = W::MI, NF = W::NF, COLS = BN / NB;
#ifndef M2D_CUDA_EMULATED
    extern __shared__ __align__(16) unsigned char tc_raw[];
#endif
    gx_smem<BM, BN> &sm = *(gx_smem<BM, BN> *)tc_raw;
    int e, r0, r1, n0 = blockIdx.y * COLS;
    if (!gm_tile<BM>(g, blockIdx.x, e, r0, r1)) return;
    const __nv_bfloat16 *A = g.a + e * g.a_es;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = w / WN, wn = w % WN, gq = lane >> 2, c = lane & 3;
    float acc[MI][NF][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NF; ni++)
            for (int u = 0; u < 4; u++) acc[mi][ni][u] = 0.0f;
    int KT = (g.K + GX_BK - 1) / GX_BK;
    for (int kt = 0; kt < GX_STAGES - 1; kt++) {
        if (kt < KT) gx_load<NB, BM, BN>(g, p, e, A, r0, r1, n0, kt, sm);
        else cp_async_commit(); /* empty groups keep the count */
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<GX_STAGES - 2>(); /* step kt's copies (this thread's) done */
        __syncthreads();                /* everyone's; and step kt - 1's stage free to refill */
        if (kt + GX_STAGES - 1 < KT) gx_load<NB, BM, BN>(g, p, e, A, r0, r1, n0, kt + GX_STAGES - 1, sm);
        else cp_async_commit();
        gx_mma<BM, BN, LDSM>(sm, kt % GX_STAGES, wm, wn, lane, acc);
    }
    cp_async_wait<0>();
    __syncthreads(); /* the stages are dead: the accumulators go through the same shared memory */
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NF; ni++)
            for (int h = 0; h < 2; h++) {
                float *o = &sm.c[WR * wm + 16 * mi + gq + 8 * h][NF * 8 * wn + 8 * ni + 2 * c];
                o[0] = acc[mi][ni][2 * h], o[1] = acc[mi][ni][2 * h + 1];
            }
    __syncthreads();
    gm_epilogue<NB, BM, BN + 4>(g, p, e, r0, r1, n0, COLS, &sm.c[0][0]);
}

/* ---- the LM head's log-sum-exp in one pass over the logits (k_lse_rows: knob lse_kernel 1, the default) ----
 * backend_cuda.cu's k_lse_chunk reads a chunk's logits twice (the row's maximum, then the sum of
 * expf(z - max)); at 2,048 rows x 16,384 logits a chunk is 134 MB, beyond L2, so both passes come
 * from DRAM, and for one row (a prompt's last token) its 256 threads walk 64 values each, one load
 * at a time, twice. Here each thread keeps a running maximum m and sum s (fp32 terms
 * expf(z - m), the sum in fp64, rescaled by exp(m_old - m) in fp64 when m grows), reading
 * LSE_UNROLL float4s before folding them (four loads in flight a thread); the block then takes
 * M = max m and S = sum s exp(m - M) in fp64. Each term is the same fp32 expf as k_lse_chunk's,
 * only of z - m for m <= M, then scaled in fp64: the sum agrees with the two-pass one to a few
 * fp32 ulps of its largest terms. The state st ([3][n]: max, sum, target logit, fp64) is folded
 * as k_lse_chunk does. */
#define LSE_T 256
#define LSE_UNROLL 4

/* row i's state (st [3][n]: max, sum, target logit) with a chunk's maximum M and sum S of exp(z -
 * M) over its logits zr (vocabulary v0 .. v0 + nv - 1), and its target logit if it holds it */
__device__ static void lse_state_fold(double *st, int n, int i, float M, double S, const float *zr, int v0, int nv,
                                      int target) {
    double *mx = st + i, *sum = st + n + i, *tgt = st + 2 * n + i;
    if (target >= v0 && target < v0 + nv) *tgt = zr[target - v0];
    if (M == -INFINITY) return; /* a masked chunk adds nothing (S may be NaN: -inf - -inf) */
    if (M > *mx) {
        *sum = *sum * exp(*mx - M) + S;
        *mx = M;
    } else {
        *sum += S * exp(M - *mx);
    }
}

/* x into the running (m, s) */
__device__ static __forceinline__ void lse_fold(float x, float &m, double &s) {
    if (x > m) {
        s *= exp((double)m - (double)x); /* m = -inf: 0 (or NaN, a NaN seen: it stays) */
        m = x;
    }
    if (x != -INFINITY) s += (double)expf(x - m); /* -inf adds nothing (m may be -inf still); NaN stays */
}

/* one block per row r of z [rows, nv] (row r0 + r of the state): the chunk at vocabulary offset
 * v0 folded into st; VEC: nv a multiple of 4 and z 16-byte aligned (float4 loads) */
__global__ static void __launch_bounds__(LSE_T) k_lse_rows(const float *z, int nv, int v0, const int32_t *targets,
                                                           double *st, int n, int r0, int vec) {
    int r = blockIdx.x, i = r0 + r;
    const float *zr = z + (size_t)r * nv;
    float m = -INFINITY;
    double s = 0.0;
    if (vec) {
        const float4 *z4 = (const float4 *)zr;
        int n4 = nv / 4;
        for (int j0 = threadIdx.x; j0 < n4; j0 += LSE_T * LSE_UNROLL) {
            float4 v[LSE_UNROLL];
#pragma unroll
            for (int u = 0; u < LSE_UNROLL; u++) {
                int j = j0 + u * LSE_T;
                v[u] = j < n4 ? z4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            }
#pragma unroll
            for (int u = 0; u < LSE_UNROLL; u++) lse_fold(v[u].x, m, s), lse_fold(v[u].y, m, s), lse_fold(v[u].z, m, s), lse_fold(v[u].w, m, s);
        }
    } else {
        for (int j = threadIdx.x; j < nv; j += LSE_T) lse_fold(zr[j], m, s);
    }
    float M = block_max_f(m);
    double S = block_sum_d(m == -INFINITY ? 0.0 : s * exp((double)m - (double)M));
    if (threadIdx.x == 0) lse_state_fold(st, n, i, M, S, zr, v0, nv, targets[i]);
}

#endif
