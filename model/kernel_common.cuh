/*
 * model/kernel_common.cuh - what every layer kernel of the GPU model shares.
 *
 * Why: the layer kernels (encoder, layernorm, matmul, gelu, classifier, AdamW,
 * norms) agree on one storage type for parameters, activations and gradients
 * (BF16, "floatX"), on FP32 for statistics, master weights and moments, and on
 * one way to fail (cudaCheck with file and line). Keeping this in one small
 * header stops each kernel file from growing its own copy.
 *
 * Offers: floatX (= __nv_bfloat16), cudaCheck / cudaCheckLastError / ceil_div
 * (from common/cuda_utils.cuh), warp_sum / warp_max, block_sum (fixed
 * reduction order: deterministic), to_float / from_float, and the
 * Pack128 helper for 16-byte vector loads of BF16 data.
 */
#ifndef MODEL_KERNEL_COMMON_CUH
#define MODEL_KERNEL_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "common/utils.h"
#include "common/cuda_utils.cuh"

typedef __nv_bfloat16 floatX;

__device__ __forceinline__ float to_float(floatX x) { return __bfloat162float(x); }
__device__ __forceinline__ floatX from_float(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every
   thread gets the result. The order is fixed, so results are reproducible. */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  /* partial[] may still be read by a previous call */
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = (lane < warps) ? partial[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = (lane < warps) ? partial[lane] : -INFINITY;
    return warp_max(v);
}

/* Eight BF16 values moved as one 16-byte load or store. Callers guarantee
   16-byte alignment (every buffer offset and channel count used with it is a
   multiple of 8 elements; the model checks C % 8 == 0 at start-up). */
struct alignas(16) Pack8 {
    floatX v[8];
};
__device__ __forceinline__ Pack8 load_pack8(const floatX* p) { return *reinterpret_cast<const Pack8*>(p); }
__device__ __forceinline__ void store_pack8(floatX* p, const Pack8& x) { *reinterpret_cast<Pack8*>(p) = x; }

#endif /* MODEL_KERNEL_COMMON_CUH */
