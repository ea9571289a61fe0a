/*
 * model/rmsnorm.cuh - RMSNorm forward/backward (--norm rmsnorm), with the
 * fused residual add, for the residual stream of the modern-stack models.
 *
 * Why: Llama-style stacks normalize with y = x * rsqrt(mean(x^2) + eps) * g
 * (gain only, no bias, eps 1e-5: docs/modern_stacks.md's contract). It is
 * LayerNorm without the centring, so the kernels are layernorm.cuh's row
 * family instantiated for ROWNORM_RMS (FP32 statistics,
 * BF16 in and out, the deterministic per-block column sums for the gain
 * gradient); this file owns the RMSNorm entry points and their contract.
 * Saved for backward: rstd per row (FP32); there is no mean.
 *
 * Gradient convention (as layernorm_backward): dinp += (the residual stream's
 * gradient accumulates), dweight += (parameter gradients accumulate over
 * micro-steps). With xhat = x * rstd, g = dout * w:
 *   dinp += rstd * (g - xhat * mean(g * xhat)),  dweight += sum_rows dout * xhat.
 *
 * Offers: rmsnorm_forward, fused_residual_rmsnorm_forward, rmsnorm_backward.
 * Shapes: rows N = B*T, channels C (C % 8 == 0), row-major [N, C].
 */
#ifndef MODEL_RMSNORM_CUH
#define MODEL_RMSNORM_CUH

#include "model/kernel_common.cuh"
#include "model/layernorm.cuh"

/* out = RMSNorm(inp) * weight; rstd[row] saved (FP32). */
static void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                            cudaStream_t stream) {
    rownorm_forward_kernel<ROWNORM_RMS><<<ceil_div(N, ROWNORM_BLOCK / 32), ROWNORM_BLOCK, 0, stream>>>(
        out, nullptr, rstd, nullptr, inp, nullptr, weight, nullptr, N, C);
    cudaCheckLastError();
}

/* residual = bf16(a + b), out = RMSNorm(residual) * weight (the residual add fused, as LayerNorm's). */
static void fused_residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* a,
                                           const floatX* b, const floatX* weight, int N, int C, cudaStream_t stream) {
    rownorm_forward_kernel<ROWNORM_RMS><<<ceil_div(N, ROWNORM_BLOCK / 32), ROWNORM_BLOCK, 0, stream>>>(
        out, nullptr, rstd, residual, a, b, weight, nullptr, N, C);
    cudaCheckLastError();
}

/* dinp += d RMSNorm / d inp; dweight += sum_rows dout * xhat; dresid_bias +=
   column sums of dinp as passed in (NULL: not wanted). inp is the norm's input
   (the residual stream), rstd its saved statistic.
   scratch: rownorm_backward_scratch_floats(N, C) floats. */
static void rmsnorm_backward(floatX* dinp, floatX* dweight, floatX* dresid_bias, float* scratch, const floatX* dout,
                             const floatX* inp, const floatX* weight, const float* rstd, int N, int C,
                             cudaStream_t stream) {
    rownorm_backward<ROWNORM_RMS>(dinp, dweight, nullptr, dresid_bias, scratch, dout, inp, nullptr, rstd, weight, N,
                                  C, stream);
}

#endif /* MODEL_RMSNORM_CUH */
