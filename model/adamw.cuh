/*
 * model/adamw.cuh - the AdamW update on FP32 master weights.
 *
 * Why: parameters live in BF16 for the forward/backward, but BF16 cannot
 * hold small updates (lr * step is often below half an ulp of the weight),
 * so the optimizer keeps FP32 master copies and FP32 moments, updates those,
 * and writes the rounded BF16 parameters the next forward uses. Weight decay
 * is decoupled (AdamW) and applied to 2-D weights only; the caller passes
 * weight_decay = 0 for biases, LayerNorm parameters (the table's
 * weight_decay flag in model/gpt_config.h decides).
 *
 * The update works on one contiguous range of the flat buffers, so the same
 * kernel serves one tensor at a time and, later, one ZeRO-1 shard per rank.
 *
 * Per element (t = step, 1-based; g already multiplied by grad_scale, which
 * carries gradient clipping):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   w -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * w )
 *   param = bf16(w)
 * Offers: AdamWHyper, adamw_update.
 */
#ifndef MODEL_ADAMW_CUH
#define MODEL_ADAMW_CUH

#include "model/kernel_common.cuh"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int step; /* 1-based count of updates, for bias correction */
} AdamWHyper;

__global__ void adamw_kernel(floatX* params, float* master, float* m_state, float* v_state, const floatX* grads,
                             long long n, float lr, float beta1, float beta2, float beta1_correction,
                             float beta2_correction, float eps, float weight_decay, float grad_scale) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = to_float(grads[i]) * grad_scale;
    const float m = beta1 * m_state[i] + (1.0f - beta1) * g;
    const float v = beta2 * v_state[i] + (1.0f - beta2) * g * g;
    m_state[i] = m;
    v_state[i] = v;
    const float m_hat = m / beta1_correction, v_hat = v / beta2_correction;
    float w = master[i];
    w -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * w);
    master[i] = w;
    params[i] = from_float(w);
}

/* Updates elements [0, n) of the given (already offset) buffers. */
static void adamw_update(floatX* params, float* master, float* m_state, float* v_state, const floatX* grads,
                         long long n, AdamWHyper h, float weight_decay, float grad_scale, cudaStream_t stream) {
    if (n <= 0) return;
    const float c1 = 1.0f - powf(h.beta1, (float)h.step);
    const float c2 = 1.0f - powf(h.beta2, (float)h.step);
    adamw_kernel<<<ceil_div(n, 512), 512, 0, stream>>>(params, master, m_state, v_state, grads, n, h.lr, h.beta1,
                                                       h.beta2, c1, c2, h.eps, weight_decay, grad_scale);
    cudaCheckLastError();
}

/* master = float(params) (start of training from BF16 weights), elementwise. */
__global__ void bf16_to_float_kernel(float* out, const floatX* in, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = to_float(in[i]);
}
/* params = bf16(master) (start of training from FP32 weights). */
__global__ void float_to_bf16_kernel(floatX* out, const float* in, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float(in[i]);
}

#endif /* MODEL_ADAMW_CUH */
