/*
 * train/adamw_cpu.c - AdamW with decoupled weight decay, the global gradient
 * norm and clipping, on the CPU (see adamw_cpu.h for the update rule).
 *
 * Why: the CPU trainer's optimizer and the reference for the CUDA optimizer.
 * Decay applies per tensor, from the parameter table's weight_decay flag (2-D
 * weights yes; biases and LayerNorm parameters no), so no index arithmetic
 * decides what decays. Moments and the update are FP32; bias corrections are
 * computed in double once per step.
 */
#include "train/adamw_cpu.h"

#include <math.h>

#include "common/utils.h"

void adamw_cpu_step(float* params, const float* grads, float* m, float* v, size_t n, int t, AdamWParams p,
                    const ParamTensorInfo* table) {
    if (t < 1) die("adamw_cpu_step: step t must be >= 1 (1-based), got %d", t);
    size_t covered = 0;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        if (table[id].offset != covered) die("adamw_cpu_step: parameter table is not contiguous at '%s'", table[id].name);
        covered += table[id].count;
    }
    if (covered != n) die("adamw_cpu_step: the parameter table covers %zu elements, but n = %zu", covered, n);

    const float correction1 = (float)(1.0 - pow((double)p.beta1, (double)t));
    const float correction2 = (float)(1.0 - pow((double)p.beta2, (double)t));
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        const float decay = table[id].weight_decay ? p.weight_decay : 0.0f;
        const size_t begin = table[id].offset, end = begin + table[id].count;
#pragma omp parallel for schedule(static)
        for (size_t i = begin; i < end; i++) {
            const float g = grads[i];
            const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * g;
            const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            const float mhat = mi / correction1;
            const float vhat = vi / correction2;
            params[i] -= p.lr * (mhat / (sqrtf(vhat) + p.eps) + decay * params[i]);
        }
    }
}

/* Sum of squares in fixed chunks, each summed in order and the chunk sums added
   in order: the same bits for any thread count (an OpenMP reduction's order
   depends on it, and the norm feeds clipping, so the weights would too). */
#define NORM_CHUNK ((size_t)1 << 16)
float grad_global_norm_cpu(const float* grads, size_t n) {
    const size_t chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double* partial = (double*)mallocCheck((chunks ? chunks : 1) * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        const size_t end = (c + 1) * NORM_CHUNK < n ? (c + 1) * NORM_CHUNK : n;
        double sum = 0.0;
        for (size_t i = c * NORM_CHUNK; i < end; i++) sum += (double)grads[i] * (double)grads[i];
        partial[c] = sum;
    }
    double sum = 0.0;
    for (size_t c = 0; c < chunks; c++) sum += partial[c];
    free(partial);
    return (float)sqrt(sum);
}

void grad_clip_cpu(float* grads, size_t n, float norm, float max_norm) {
    if (!(max_norm > 0.0f) || !(norm > max_norm)) return;
    const float scale = max_norm / norm;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) grads[i] *= scale;
}
