/*
 * model/global_norm.cuh - the global L2 norm of all gradients, deterministic.
 *
 * Why: gradient clipping and the run log need ||g|| over every parameter.
 * A fixed grid of blocks each sums squares over a fixed grid-stride slice in
 * FP32 and writes one partial; a single block then adds the partials in
 * order in FP64. No atomics, so the same gradients give the same norm bits,
 * which bit-exact resume relies on (clipping feeds the norm into the update).
 *
 * Offers: GLOBAL_NORM_BLOCKS, global_norm_squared (result left on the device
 * as one double, for the caller to copy back or reduce across ranks later).
 */
#ifndef MODEL_GLOBAL_NORM_CUH
#define MODEL_GLOBAL_NORM_CUH

#include "model/kernel_common.cuh"

#define GLOBAL_NORM_BLOCKS 264 /* 2 x the H200's 132 SMs; fixed, so the sum order is fixed */
#define GLOBAL_NORM_THREADS 512

__global__ void global_norm_partial_kernel(float* partial, const floatX* data, long long n) {
    float acc = 0.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = to_float(data[i]);
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void global_norm_final_kernel(double* out, const float* partial, int count) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < count; i++) s += (double)partial[i];
    *out = s;
}

/* *out_dev = sum of squares of data[0..n). scratch: GLOBAL_NORM_BLOCKS floats. */
static void global_norm_squared(double* out_dev, float* scratch, const floatX* data, long long n,
                                cudaStream_t stream) {
    global_norm_partial_kernel<<<GLOBAL_NORM_BLOCKS, GLOBAL_NORM_THREADS, 0, stream>>>(scratch, data, n);
    cudaCheckLastError();
    global_norm_final_kernel<<<1, 32, 0, stream>>>(out_dev, scratch, GLOBAL_NORM_BLOCKS);
    cudaCheckLastError();
}

#endif /* MODEL_GLOBAL_NORM_CUH */
