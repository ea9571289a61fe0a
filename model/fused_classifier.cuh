/*
 * model/fused_classifier.cuh - softmax + cross-entropy loss + logit gradient
 * per row, the gradient written over the logits in place.
 *
 * Why: the logits are the model's largest activation (B*T x 50304). Storing
 * normalized probabilities next to them would double that. One block per row
 * finds the row max and the sum of exponentials in FP32, writes the row's
 * loss, and, when training, overwrites the row with
 *   dlogits = (softmax - onehot(target)) * dloss
 * The padded vocabulary columns (V <= c < Vp) are masked: they never enter the
 * softmax and their gradient is exactly 0, so the padded wte rows stay put.
 *
 * Two kernels, one contract, picked by the row's size (fused_classifier_path):
 *  - "smem": the row is copied once into shared memory (cp.async, every
 *    16-byte piece in flight at once), and the max, the sum of exponentials
 *    and the gradient are taken from there: one read and one write of the
 *    logits in device memory. Two rows per SM, so one row's copy overlaps the
 *    other's arithmetic and stores. Used when two rows fit in an SM's shared
 *    memory (Vp <= ~56k on Hopper: the GPT-2 vocabulary).
 *  - "two-pass": an online max / sum over the row from device memory, then a
 *    second read to write the gradient. Any Vp.
 * Both sum in a fixed order (deterministic); their losses differ in the last
 * bits (different FP32 sum orders), and so may the BF16 gradients.
 *
 * Offers: fused_classifier (losses[N] in FP32; logits -> dlogits when
 * write_dlogits), fused_classifier_path (which kernel a Vp gets here), and
 * fused_classifier_two_pass (the any-Vp kernel, for tests of both paths).
 * dloss is the weight of each row's loss in the objective (1 / (B*T*grad_accum_steps) for a mean over the
 * total batch).
 */
#ifndef MODEL_FUSED_CLASSIFIER_CUH
#define MODEL_FUSED_CLASSIFIER_CUH

#include "model/kernel_common.cuh"

#define CLASSIFIER_BLOCK 512
/* shared memory a CTA costs beyond its dynamic bytes: the runtime's reserve per block, block_max/block_sum */
#define CLASSIFIER_SMEM_OVERHEAD 2048

/* dlogits of one pack from its logits (padded columns 0). */
__device__ __forceinline__ Pack8 classifier_grad_pack(Pack8 v, int c, float row_max, float inv_sum, int target,
                                                      float dloss, int V) {
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
    return v;
}

/* ---- "two-pass": any Vp ---- */
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
    for (int c = threadIdx.x * 8; c < Vp; c += CLASSIFIER_BLOCK * 8)
        store_pack8(x + c, classifier_grad_pack(load_pack8(x + c), c, row_max, inv_sum, target, dloss, V));
}

/* ---- "smem": the row read once into shared memory ---- */
__device__ __forceinline__ void classifier_cp_async16(void* smem_dst, const void* gmem_src) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

/* The arithmetic per element is trimmed, since the kernel is as close to its SFU and issue limits as to the
   memory's: only the packs past V's last full one check for padded columns, the max is taken on BF16 pairs
   (exact), and each exponential is exp2(x log2(e) - max log2(e)) in one FMA. */
__global__ void __launch_bounds__(CLASSIFIER_BLOCK, 2)
fused_classifier_smem_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                             int write_dlogits) {
    extern __shared__ __align__(16) unsigned char classifier_row_smem[];
    const Pack8* xs = reinterpret_cast<const Pack8*>(classifier_row_smem);
    const long long row = blockIdx.x;
    floatX* x = logits + row * Vp;
    const int packs = Vp / 8, full_packs = V / 8; /* packs below full_packs hold no padded column */
    /* pack i of the row is thread i % CLASSIFIER_BLOCK's in every pass: consecutive threads move consecutive 16
       bytes (coalesced in device memory, conflict-free in shared memory) */
    for (int i = threadIdx.x; i < packs; i += CLASSIFIER_BLOCK)
        classifier_cp_async16(classifier_row_smem + 16 * (size_t)i, x + 8 * (size_t)i);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    const __nv_bfloat162 lowest = __floats2bfloat162_rn(-INFINITY, -INFINITY);
    __nv_bfloat162 m2 = lowest;
    for (int i = threadIdx.x; i < full_packs; i += CLASSIFIER_BLOCK) {
        const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&xs[i]);
        m2 = __hmax2(m2, __hmax2(__hmax2(v2[0], v2[1]), __hmax2(v2[2], v2[3])));
    }
    float m = fmaxf(__low2float(m2), __high2float(m2));
    for (int i = full_packs + threadIdx.x; i < packs; i += CLASSIFIER_BLOCK)
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (8 * i + k < V) m = fmaxf(m, to_float(xs[i].v[k]));
    const float row_max = block_max(m);
    const float kLog2e = 1.4426950408889634f, max_l2 = row_max * kLog2e;
    float s = 0.0f;
    for (int i = threadIdx.x; i < full_packs; i += CLASSIFIER_BLOCK) {
        const Pack8 v = xs[i];
#pragma unroll
        for (int k = 0; k < 8; k++) s += exp2f(fmaf(to_float(v.v[k]), kLog2e, -max_l2));
    }
    for (int i = full_packs + threadIdx.x; i < packs; i += CLASSIFIER_BLOCK)
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (8 * i + k < V) s += exp2f(fmaf(to_float(xs[i].v[k]), kLog2e, -max_l2));
    const float row_sum = block_sum(s);
    const int target = targets[row];
    if (threadIdx.x == 0) {
        const float lse = row_max + logf(row_sum);
        losses[row] = lse - to_float(xs[target / 8].v[target % 8]);
    }
    if (!write_dlogits) return;
    const float inv_sum = 1.0f / row_sum;
    for (int i = threadIdx.x; i < packs; i += CLASSIFIER_BLOCK) {
        Pack8 v = xs[i];
        const int c = 8 * i;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float p = exp2f(fmaf(to_float(v.v[k]), kLog2e, -max_l2)) * inv_sum;
            const float g = (p - (c + k == target ? 1.0f : 0.0f)) * dloss;
            v.v[k] = from_float(i < full_packs || c + k < V ? g : 0.0f);
        }
        store_pack8(x + c, v);
    }
}

/* The dynamic shared memory of the smem kernel for rows of Vp columns. */
static inline size_t fused_classifier_smem_bytes(int Vp) { return (size_t)Vp * sizeof(floatX); }

/* Which kernel rows of Vp columns get on the current device: "smem" when two such rows fit in one SM's shared
   memory (and in one block's opt-in limit), else "two-pass". Asked of the device once per process. */
static const char* fused_classifier_path(int Vp) {
    static int per_sm = -1, per_block = -1;
    if (per_sm < 0) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
        cudaCheck(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    const size_t bytes = fused_classifier_smem_bytes(Vp);
    const int fits = bytes <= (size_t)per_block && 2 * (bytes + CLASSIFIER_SMEM_OVERHEAD) <= (size_t)per_sm;
    return fits ? "smem" : "two-pass";
}

static void fused_classifier_check(int Vp) {
    if (Vp % 8 != 0) die("fused_classifier: padded vocab %d must be a multiple of 8", Vp);
}

/* The any-Vp kernel whatever the row's size (the tests run both paths on the same rows). */
static void fused_classifier_two_pass(floatX* logits, float* losses, const int* targets, float dloss, int N, int V,
                                      int Vp, int write_dlogits, cudaStream_t stream) {
    fused_classifier_check(Vp);
    fused_classifier_kernel<<<N, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    cudaCheckLastError();
}

/* logits [N, Vp] BF16; targets [N] on the device, each in [0, V). */
static void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             int write_dlogits, cudaStream_t stream) {
    fused_classifier_check(Vp);
    if (fused_classifier_path(Vp)[0] != 's') {
        fused_classifier_two_pass(logits, losses, targets, dloss, N, V, Vp, write_dlogits, stream);
        return;
    }
    const size_t bytes = fused_classifier_smem_bytes(Vp);
    static size_t attribute_bytes = 0; /* the opt-in set so far (a function attribute, not a stream operation) */
    if (bytes > attribute_bytes) {
        cudaCheck(cudaFuncSetAttribute(fused_classifier_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes));
        attribute_bytes = bytes;
    }
    fused_classifier_smem_kernel<<<N, CLASSIFIER_BLOCK, bytes, stream>>>(logits, losses, targets, dloss, V, Vp,
                                                                          write_dlogits);
    cudaCheckLastError();
}

#endif /* MODEL_FUSED_CLASSIFIER_CUH */
