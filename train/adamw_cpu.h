/*
 * train/adamw_cpu.h - AdamW, global gradient norm and clipping on the CPU.
 *
 * Why: the CPU trainer's optimizer, and the reference the CUDA optimizer and
 * the PyTorch twin (torch.optim.AdamW) are checked against. The update is
 *   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
 *   mhat = m/(1-b1^t);    vhat = v/(1-b2^t);
 *   p -= lr * ( mhat/(sqrt(vhat)+eps) + wd*p )   [wd only on tensors whose
 *                                                 table entry has weight_decay == 1]
 * which equals PyTorch's AdamW (p *= 1-lr*wd, then the Adam step).
 *
 * Offers: AdamWParams, adamw_cpu_step, grad_global_norm_cpu, grad_clip_cpu.
 */
#ifndef TRAIN_ADAMW_CPU_H
#define TRAIN_ADAMW_CPU_H

#include <stddef.h>

#include "model/gpt_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} AdamWParams;

/* One AdamW step over n parameters laid out by `table` (NUM_PARAM_TENSORS
   entries; their ranges must tile [0, n) exactly, else it dies). m and v are
   the moment buffers (n floats each, zero before step 1). t is 1-based. */
void adamw_cpu_step(float* params, const float* grads, float* m, float* v, size_t n, int t,
                    AdamWParams p, const ParamTensorInfo* table);

/* L2 norm of grads[0..n), accumulated in double. */
float grad_global_norm_cpu(const float* grads, size_t n);

/* If max_norm > 0 and norm > max_norm, scales grads by max_norm / norm
   (exactly that ratio; PyTorch's clip_grad_norm_ adds 1e-6 to norm). */
void grad_clip_cpu(float* grads, size_t n, float norm, float max_norm);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_ADAMW_CPU_H */
