/*
 * model/gelu.cuh - GELU (tanh approximation, as GPT-2) forward and backward.
 *
 * Why: the MLP's non-linearity. Forward normally happens inside the fc
 * matmul's cuBLASLt epilogue (matmul.cuh, GELU_AUX_BIAS), which also keeps
 * the pre-activation for backward; this standalone forward serves
 * --recompute (rebuild gelu(fch) in backward instead of storing it) and the
 * tests. Backward multiplies the incoming gradient in place by
 * gelu'(pre-activation), so no extra buffer is needed.
 *
 * gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
 * Offers: gelu_forward, gelu_backward_inplace. Element counts % 8 == 0.
 */
#ifndef MODEL_GELU_CUH
#define MODEL_GELU_CUH

#include "model/kernel_common.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

__device__ __forceinline__ float gelu_value(float x) {
    const float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

__device__ __forceinline__ float gelu_derivative(float x) {
    const float cube = 0.044715f * x * x * x;
    const float arg = GELU_SCALE * (x + cube);
    const float th = tanhf(arg);
    const float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
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

__global__ void gelu_backward_inplace_kernel(floatX* d, const floatX* inp, long long n) {
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    const Pack8 x = load_pack8(inp + i);
    Pack8 g = load_pack8(d + i);
#pragma unroll
    for (int k = 0; k < 8; k++) g.v[k] = from_float(to_float(g.v[k]) * gelu_derivative(to_float(x.v[k])));
    store_pack8(d + i, g);
}

static void gelu_forward(floatX* out, const floatX* inp, long long n, cudaStream_t stream) {
    gelu_forward_kernel<<<ceil_div(n / 8, 256), 256, 0, stream>>>(out, inp, n);
    cudaCheckLastError();
}

/* d <- d * gelu'(inp), elementwise; inp is the pre-activation. */
static void gelu_backward_inplace(floatX* d, const floatX* inp, long long n, cudaStream_t stream) {
    gelu_backward_inplace_kernel<<<ceil_div(n / 8, 256), 256, 0, stream>>>(d, inp, n);
    cudaCheckLastError();
}

#endif /* MODEL_GELU_CUH */
