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
 * Per element (t = step, 1-based; g already multiplied by grad_scale, which
 * carries gradient clipping):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   w -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * w )
 *   param = bf16(w)
 *
 * Launch shape: the update is purely memory bound (per element it reads a
 * BF16 gradient and FP32 master/m/v, writes master/m/v and a BF16 param: 26
 * bytes), so it runs as ONE launch over a small table of ranges of the flat
 * buffers (one per tensor, each with its own weight decay) instead of one
 * launch per tensor, with a grid-stride loop and 4-element vector accesses
 * (16-byte FP32, 8-byte BF16) where the base pointers allow it. A range's
 * unaligned head and its tail go element by element. Every element, vector
 * or scalar path, goes through the same adamw_element() - the same formula
 * and the same operation order as the former one-thread-per-element kernel -
 * so the bits do not depend on the launch shape, the range table, or where
 * a ZeRO-1 shard starts (bit-exact resume and the ZeRO-1 equality checks
 * rely on this; tests/test_layers_gpu.cu compares the vector and scalar
 * paths bit for bit).
 *
 * Ranges index the (already offset) buffers the caller passes: element i is
 * params[i], master[i], m_state[i], v_state[i], grads[i]. A ZeRO-1 rank
 * passes params + lo, grads + lo and its shard-sized master/m/v, with ranges
 * relative to lo; elements outside every range are left untouched.
 *
 * Offers: AdamWHyper, AdamWRange, ADAMW_MAX_RANGES, adamw_update_ranges,
 * adamw_update (one range), bf16_to_float_kernel, float_to_bf16_kernel.
 */
#ifndef MODEL_ADAMW_CUH
#define MODEL_ADAMW_CUH

#include "model/kernel_common.cuh"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int step; /* 1-based count of updates, for bias correction */
} AdamWHyper;

/* Elements [start, end) of the buffers, updated with this weight decay. */
typedef struct {
    long long start, end;
    float weight_decay;
} AdamWRange;

/* Ranges one launch takes (the kernel gets them by value); more are split
   into several launches. GPT-2 has 16 tensors (NUM_PARAM_TENSORS less the
   options' three, which are empty there), so its model needs one. */
#define ADAMW_MAX_RANGES 16
#define ADAMW_THREADS 512
#define ADAMW_VEC 4 /* elements per vector access: float4 and 4 x BF16 (8 bytes) */

typedef struct {
    long long start[ADAMW_MAX_RANGES], end[ADAMW_MAX_RANGES];
    float weight_decay[ADAMW_MAX_RANGES];
    int count;
} AdamWRangeTable;

typedef struct {
    float lr, beta1, beta2, beta1_correction, beta2_correction, eps, grad_scale;
} AdamWScalars;

struct alignas(8) BF16x4 {
    floatX v[ADAMW_VEC];
};

/* The one per-element update. Keep the operation order: its bits are a
   contract (see the header). Updates m, v in place, returns the new weight. */
__device__ __forceinline__ float adamw_element(floatX grad, float& m_io, float& v_io, float w, float weight_decay,
                                               const AdamWScalars& s) {
    const float g = to_float(grad) * s.grad_scale;
    const float m = s.beta1 * m_io + (1.0f - s.beta1) * g;
    const float v = s.beta2 * v_io + (1.0f - s.beta2) * g * g;
    m_io = m;
    v_io = v;
    const float m_hat = m / s.beta1_correction, v_hat = v / s.beta2_correction;
    w -= s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + weight_decay * w);
    return w;
}

__device__ __forceinline__ void adamw_scalar(floatX* params, float* master, float* m_state, float* v_state,
                                             const floatX* grads, long long i, float wd, const AdamWScalars& s) {
    float m = m_state[i], v = v_state[i];
    const float w = adamw_element(grads[i], m, v, master[i], wd, s);
    m_state[i] = m;
    v_state[i] = v;
    master[i] = w;
    params[i] = from_float(w);
}

/* vectorized != 0 promises: master/m_state/v_state 16-byte aligned and
   params/grads 8-byte aligned at element 0, so any element index that is a
   multiple of ADAMW_VEC is aligned in every buffer. */
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_ranges_kernel(floatX* params, float* master, float* m_state, float* v_state, const floatX* grads,
                        AdamWRangeTable table, AdamWScalars s, int vectorized) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int r = 0; r < table.count; r++) {
        const long long start = table.start[r], end = table.end[r];
        const float wd = table.weight_decay[r];
        long long body = start, body_end = start; /* [body, body_end): the vector part */
        if (vectorized) {
            body = (start + ADAMW_VEC - 1) / ADAMW_VEC * ADAMW_VEC;
            body_end = end / ADAMW_VEC * ADAMW_VEC;
            if (body_end < body) body = body_end = start; /* range inside one vector: all scalar */
        }
        /* scalar head [start, body) and tail [body_end, end): fewer than 2*ADAMW_VEC elements
           when vectorized, the whole range otherwise */
        const long long head = body - start;
        for (long long k = tid; k < head + (end - body_end); k += stride) {
            const long long i = k < head ? start + k : body_end + (k - head);
            adamw_scalar(params, master, m_state, v_state, grads, i, wd, s);
        }
        for (long long i = body + tid * ADAMW_VEC; i < body_end; i += stride * ADAMW_VEC) {
            const BF16x4 g = *reinterpret_cast<const BF16x4*>(grads + i);
            float4 w = *reinterpret_cast<const float4*>(master + i);
            float4 m = *reinterpret_cast<const float4*>(m_state + i);
            float4 v = *reinterpret_cast<const float4*>(v_state + i);
            w.x = adamw_element(g.v[0], m.x, v.x, w.x, wd, s);
            w.y = adamw_element(g.v[1], m.y, v.y, w.y, wd, s);
            w.z = adamw_element(g.v[2], m.z, v.z, w.z, wd, s);
            w.w = adamw_element(g.v[3], m.w, v.w, w.w, wd, s);
            BF16x4 p;
            p.v[0] = from_float(w.x);
            p.v[1] = from_float(w.y);
            p.v[2] = from_float(w.z);
            p.v[3] = from_float(w.w);
            *reinterpret_cast<float4*>(m_state + i) = m;
            *reinterpret_cast<float4*>(v_state + i) = v;
            *reinterpret_cast<float4*>(master + i) = w;
            *reinterpret_cast<BF16x4*>(params + i) = p;
        }
    }
}

static int adamw_grid_cap(void) {
    static int cap = 0; /* resident blocks of the current device, queried once */
    if (cap == 0) {
        int device = 0, sms = 0, per_sm = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adamw_ranges_kernel, ADAMW_THREADS, 0));
        cap = sms * (per_sm > 0 ? per_sm : 1);
    }
    return cap;
}

/* One AdamW step over `count` ranges of the buffers (see the header for the
   indexing), in as few launches as ADAMW_MAX_RANGES allows. */
static void adamw_update_ranges(floatX* params, float* master, float* m_state, float* v_state, const floatX* grads,
                                const AdamWRange* ranges, int count, AdamWHyper h, float grad_scale,
                                cudaStream_t stream) {
    AdamWScalars s;
    s.lr = h.lr;
    s.beta1 = h.beta1;
    s.beta2 = h.beta2;
    s.beta1_correction = 1.0f - powf(h.beta1, (float)h.step);
    s.beta2_correction = 1.0f - powf(h.beta2, (float)h.step);
    s.eps = h.eps;
    s.grad_scale = grad_scale;
    const int vectorized = (uintptr_t)master % 16 == 0 && (uintptr_t)m_state % 16 == 0 &&
                           (uintptr_t)v_state % 16 == 0 && (uintptr_t)params % 8 == 0 && (uintptr_t)grads % 8 == 0;
    for (int first = 0; first < count; first += ADAMW_MAX_RANGES) {
        AdamWRangeTable table;
        table.count = 0;
        long long most_work = 0; /* threads the widest range can use */
        for (int r = first; r < count && r < first + ADAMW_MAX_RANGES; r++) {
            if (ranges[r].end <= ranges[r].start) continue;
            table.start[table.count] = ranges[r].start;
            table.end[table.count] = ranges[r].end;
            table.weight_decay[table.count] = ranges[r].weight_decay;
            table.count++;
            const long long n = ranges[r].end - ranges[r].start;
            const long long work = vectorized ? ceil_div(n, (long long)ADAMW_VEC) + 2 * ADAMW_VEC : n;
            if (work > most_work) most_work = work;
        }
        if (table.count == 0) continue;
        long long blocks = ceil_div(most_work, (long long)ADAMW_THREADS);
        if (blocks > adamw_grid_cap()) blocks = adamw_grid_cap();
        adamw_ranges_kernel<<<(int)blocks, ADAMW_THREADS, 0, stream>>>(params, master, m_state, v_state, grads,
                                                                      table, s, vectorized);
        cudaCheckLastError();
    }
}

/* Updates elements [0, n) of the given (already offset) buffers with one
   weight decay. */
static void adamw_update(floatX* params, float* master, float* m_state, float* v_state, const floatX* grads,
                         long long n, AdamWHyper h, float weight_decay, float grad_scale, cudaStream_t stream) {
    if (n <= 0) return;
    const AdamWRange range = {0, n, weight_decay};
    adamw_update_ranges(params, master, m_state, v_state, grads, &range, 1, h, grad_scale, stream);
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
