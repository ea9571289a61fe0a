/*
 * model/gelu.cuh - GELU (tanh approximation, as GPT-2) forward.
 *
 * Why: the MLP's non-linearity. In training it lives in cuBLASLt epilogues
 * (matmul.cuh): the fc matmul's GELU_AUX_BIAS writes gelu(pre) and keeps the
 * pre-activation, and the fcproj input-gradient matmul's DGELU multiplies by
 * gelu'(pre), so neither direction needs a pass of its own. What cuBLASLt
 * cannot do is the one place left for this kernel: --recompute rebuilds
 * gelu(pre) in backward from the stored pre-activation, with no GEMM to fuse
 * into. (tests/test_layers_gpu holds the epilogue's GELU against this
 * kernel on the same BF16 inputs: on the H200 they agree bit for bit.)
 *
 * gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
 * Offers: gelu_forward. Element counts % 8 == 0.
 */
#ifndef MODEL_GELU_CUH
#define MODEL_GELU_CUH

#include "model/kernel_common.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

__device__ __forceinline__ float gelu_value(float x) {
    const float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, long long n) {
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    const Pack8 x = load_pack8(inp + i);
    Pack8 o;
#pragma unroll
    for (int k = 0; k < 8; k++) o.v[k] = from_float(gelu_value(to_float(x.v[k])));
    store_pack8(out + i, o);
}

static void gelu_forward(floatX* out, const floatX* inp, long long n, cudaStream_t stream) {
    gelu_forward_kernel<<<ceil_div(n / 8, 256), 256, 0, stream>>>(out, inp, n);
    cudaCheckLastError();
}

#endif /* MODEL_GELU_CUH */
