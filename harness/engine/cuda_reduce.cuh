/* cuda_reduce — the warp and block reductions the cuda backend's kernels share (cuda_kernels.cuh,
 * cuda_train_kernels.cuh). Every lane ends with the same bits; a block's sum is a fixed tree (the
 * same order on every run), its max order-free. Emulated on the CPU by tests/cuda_emu.h. */
#ifndef M2D_CUDA_REDUCE_CUH
#define M2D_CUDA_REDUCE_CUH

__device__ static double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* block-wide sum / max (blockDim.x a multiple of 32, <= 1024); every thread gets the result */
__device__ static double block_sum_d(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[wid] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0;
    return warp_sum_d(v);
}

__device__ static float block_max_f(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_f(v);
    __syncthreads();
    if (lane == 0) part[wid] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max_f(v);
}

#endif
