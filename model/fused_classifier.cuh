/*
 * model/fused_classifier.cuh - softmax + cross-entropy loss + logit gradient
 * in one pass over the logits, the gradient written over the logits in place.
 *
 * Why: the logits are the model's largest activation (B*T x 50304). Storing
 * normalized probabilities next to them would double that. One block per row
 * finds the row max and the sum of exponentials (online, in FP32), writes the
 * row's loss, and, when training, overwrites the row with
 *   dlogits = (softmax - onehot(target)) * dloss
 * The padded vocabulary columns (V <= c < Vp) are masked: they never enter the
 * softmax and their gradient is exactly 0, so the padded wte rows stay put.
 *
 * Offers: fused_classifier (losses[N] in FP32; logits -> dlogits when
 * write_dlogits). dloss is the weight of each row's loss in the objective
 * (1 / (B*T*grad_accum_steps) for a mean over the total batch).
 */
#ifndef MODEL_FUSED_CLASSIFIER_CUH
#define MODEL_FUSED_CLASSIFIER_CUH

#include "model/kernel_common.cuh"

#define CLASSIFIER_BLOCK 512

__global__ void __launch_bounds__(CLASSIFIER_BLOCK)
fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                        int write_dlogits) {
    const long long row = blockIdx.x;
    floatX* x = logits + row * Vp;
    /* Online max / sum of exp per thread over its columns (Vp % 8 == 0). */
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x * 8; c < Vp; c += CLASSIFIER_BLOCK * 8) {
        const Pack8 v = load_pack8(x + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (c + k >= V) break;
            const float val = to_float(v.v[k]);
            if (val > m) {
                s = s * expf(m - val) + 1.0f;
                m = val;
            } else {
                s += expf(val - m);
            }
        }
    }
    const float row_max = block_max(m);
    const float row_sum = block_sum(m == -INFINITY ? 0.0f : s * expf(m - row_max));
    const int target = targets[row];
    if (threadIdx.x == 0) {
        const float lse = row_max + logf(row_sum);
        losses[row] = lse - to_float(x[target]);
    }
    if (!write_dlogits) return;
    __syncthreads(); /* thread 0 has read x[target] before anyone overwrites it */
    const float inv_sum = 1.0f / row_sum;
    for (int c = threadIdx.x * 8; c < Vp; c += CLASSIFIER_BLOCK * 8) {
        Pack8 v = load_pack8(x + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int col = c + k;
            float g = 0.0f;
            if (col < V) {
                const float p = expf(to_float(v.v[k]) - row_max) * inv_sum;
                g = (p - (col == target ? 1.0f : 0.0f)) * dloss;
            }
            v.v[k] = from_float(g);
        }
        store_pack8(x + c, v);
    }
}

/* logits [N, Vp] BF16; targets [N] on the device, each in [0, V). */
static void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             int write_dlogits, cudaStream_t stream) {
    if (Vp % 8 != 0) die("fused_classifier: padded vocab %d must be a multiple of 8", Vp);
    fused_classifier_kernel<<<N, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    cudaCheckLastError();
}

#endif /* MODEL_FUSED_CLASSIFIER_CUH */
