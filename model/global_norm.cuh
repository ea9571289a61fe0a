/*
 * model/global_norm.cuh - the global L2 norm of all gradients, deterministic.
 *
 * Why: gradient clipping and the run log need ||g|| over every parameter.
 * A fixed grid of blocks each sums squares over a fixed grid-stride slice in
 * FP32 and writes one partial; a single block then adds the partials in
 * order in FP64. No atomics, so the same gradients give the same norm bits,
 * which bit-exact resume relies on (clipping feeds the norm into the update).
 *
 * The pass is purely memory bound (2 bytes read per element, 0.92 GB for
 * 450m), so threads read 8 BF16 values per 16-byte load over the aligned
 * body of the range (the loop unrolled so several loads are in flight) and
 * the few elements before the first 16-byte boundary and after the last one
 * go one by one. Which element lands in which thread's sum depends only on
 * n and the start address modulo 16 bytes, so the result is still a fixed
 * function of the input; it differs from the former one-element-per-thread
 * order only in the rounding of the FP32 partials (tests/test_layers_gpu.cu
 * holds it to 1e-5 of the fp64 sum, with unaligned starts and ragged ends).
 *
 * Offers: GLOBAL_NORM_BLOCKS, global_norm_squared (result left on the device
 * as one double, for the caller to copy back or reduce across ranks later).
 */
#ifndef MODEL_GLOBAL_NORM_CUH
#define MODEL_GLOBAL_NORM_CUH

#include "model/kernel_common.cuh"

#define GLOBAL_NORM_BLOCKS 264 /* 2 x the H200's 132 SMs; fixed, so the sum order is fixed */
#define GLOBAL_NORM_THREADS 512

__global__ void __launch_bounds__(GLOBAL_NORM_THREADS)
    global_norm_partial_kernel(float* partial, const floatX* data, long long n) {
    float acc = 0.0f;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    /* head: elements before the first 16-byte boundary (BF16 pointers are 2-byte aligned) */
    const uintptr_t misalign = (uintptr_t)data % sizeof(Pack8);
    long long head = misalign == 0 ? 0 : (long long)((sizeof(Pack8) - misalign) / sizeof(floatX));
    if (head > n) head = n;
    const long long packs = (n - head) / 8;
    const floatX* body = data + head;
    const long long tail_start = head + packs * 8;
    if (tid < head) {
        const float v = to_float(data[tid]);
        acc += v * v;
    }
#pragma unroll 4
    for (long long p = tid; p < packs; p += stride) {
        const Pack8 x = load_pack8(body + p * 8);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float v = to_float(x.v[k]);
            acc += v * v;
        }
    }
    if (tail_start + tid < n) {
        const float v = to_float(data[tail_start + tid]);
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
