/*
 * model/qknorm.cuh - QK-norm (--qk-norm 1): RMSNorm of every q and k head
 * over its HS elements, with gains gq, gk (HS each, shared by all heads of a
 * layer), forward and backward including the gain gradients.
 *
 * Why: QK-norm (Qwen3, OLMo2) bounds |q| and |k|, the quantities the BF16
 * attention failure grows from, so the issue-19 experiment needs it on the
 * GPU. Per head h of row n:  q_h <- q_h * rsqrt(mean(q_h^2) + eps) * gq,
 * the same for k with gk, eps 1e-5; v passes through. It runs on the qkv
 * matmul's output, before RoPE.
 *
 * Buffers: the forward reads the matmul output inp [N, 3, NH, HS] and writes
 * a separate out of the same layout (normalized q, k and a copy of v): out is
 * what RoPE rotates in place and attention reads, inp is kept for the
 * backward (which needs x, not the normalized values, since a gain may be 0).
 * rstd (FP32) is saved per head row as [N, 2, NH] (q heads, then k heads).
 * The backward works in place on dqkv: on entry the gradient w.r.t. out (after
 * RoPE's backward), on exit the q, k parts hold the gradient w.r.t. inp and
 * dv is untouched; the gain gradients are ACCUMULATED (+=), as every
 * parameter gradient. With xhat = x * rstd and g = dy * gain, per head row:
 *   dx = rstd * (g - xhat * mean(g * xhat)),  dgain[j] += sum over rows, heads of dy[j] * xhat[j].
 * The gain sums are deterministic: fixed chunks of QKNORM_ROWS_PER_CHUNK
 * (row, head) pairs into an FP32 scratch, then the chunks added in order.
 *
 * Threads: one group of G lanes per head row (G = HS/8 rounded up to a power
 * of two, at most 32), 8 elements per lane per step, group sums by shuffles
 * in a fixed order. Shapes: HS % 8 == 0, HS <= 1024.
 *
 * Offers: qknorm_forward, qknorm_backward, qknorm_scratch_floats.
 */
#ifndef MODEL_QKNORM_CUH
#define MODEL_QKNORM_CUH

#include "model/kernel_common.cuh"

#define QKNORM_EPS 1e-5f
#define QKNORM_BLOCK 256
#define QKNORM_ROWS_PER_CHUNK 1024 /* (row, head) pairs per partial sum of the gain gradients */

/* Lanes per head row: HS/8 rounded up to a power of two, at most a warp. */
static inline int qknorm_group(int HS) {
    int g = 1;
    while (g < HS / 8 && g < 32) g *= 2;
    return g;
}

/* FP32 floats of scratch qknorm_backward needs for N rows of NH heads. */
static inline size_t qknorm_scratch_floats(long long N, int NH, int HS) {
    return (size_t)ceil_div(N * NH, QKNORM_ROWS_PER_CHUNK) * 2 * (size_t)HS;
}

/* Sum over the aligned group of G lanes that holds this lane (fixed order). Every lane of the warp calls it. */
__device__ __forceinline__ float qknorm_group_sum(float v, int G) {
    for (int offset = G / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* Head rows r in [0, N*3*NH) sit at qkv + r*HS; part (r / NH) % 3: 0 q, 1 k, 2 v (copied). */
__global__ void qknorm_forward_kernel(floatX* out, float* rstd_out, const floatX* inp, const floatX* gq,
                                      const floatX* gk, int N, int NH, int HS, int G) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long r = tid / G;
    const int lane = (int)(tid % G);
    const int active = r < (long long)N * 3 * NH; /* inactive lanes still join the shuffles */
    const int part = (int)(r / NH % 3), h = (int)(r % NH);
    const floatX* x = inp + r * HS;
    float sq = 0.0f;
    if (active && part < 2)
        for (int c = lane * 8; c < HS; c += G * 8) {
            const Pack8 v = load_pack8(x + c);
#pragma unroll
            for (int k = 0; k < 8; k++) sq += to_float(v.v[k]) * to_float(v.v[k]);
        }
    sq = qknorm_group_sum(sq, G);
    if (!active) return;
    if (part == 2) {
        for (int c = lane * 8; c < HS; c += G * 8) store_pack8(out + r * HS + c, load_pack8(x + c));
        return;
    }
    const float rstd = rsqrtf(sq / HS + QKNORM_EPS);
    const floatX* gain = part == 0 ? gq : gk;
    for (int c = lane * 8; c < HS; c += G * 8) {
        const Pack8 v = load_pack8(x + c), w = load_pack8(gain + c);
        Pack8 o;
#pragma unroll
        for (int k = 0; k < 8; k++) o.v[k] = from_float(to_float(v.v[k]) * rstd * to_float(w.v[k]));
        store_pack8(out + r * HS + c, o);
    }
    if (lane == 0) rstd_out[(r / (3 * NH)) * 2 * NH + part * NH + h] = rstd;
}

/* Head rows rr in [0, N*2*NH) (q and k only; rr is also the rstd index), in place on dqkv. */
__global__ void qknorm_backward_input_kernel(floatX* dqkv, const floatX* inp, const float* rstd, const floatX* gq,
                                             const floatX* gk, int N, int NH, int HS, int G) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long rr = tid / G;
    const int lane = (int)(tid % G);
    const int active = rr < (long long)N * 2 * NH;
    const int part = (int)(rr / NH % 2);
    const long long off = ((rr / (2 * NH)) * 3 * NH + rr % (2 * NH)) * HS; /* row n, part, head h */
    const floatX* gain = part == 0 ? gq : gk;
    const float r = active ? rstd[rr] : 0.0f;
    float sum_gx = 0.0f;
    if (active)
        for (int c = lane * 8; c < HS; c += G * 8) {
            const Pack8 d = load_pack8(dqkv + off + c), x = load_pack8(inp + off + c), w = load_pack8(gain + c);
#pragma unroll
            for (int k = 0; k < 8; k++) sum_gx += to_float(d.v[k]) * to_float(w.v[k]) * to_float(x.v[k]) * r;
        }
    const float mean_gx = qknorm_group_sum(sum_gx, G) / HS;
    if (!active) return;
    for (int c = lane * 8; c < HS; c += G * 8) {
        Pack8 d = load_pack8(dqkv + off + c);
        const Pack8 x = load_pack8(inp + off + c), w = load_pack8(gain + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float g = to_float(d.v[k]) * to_float(w.v[k]), xhat = to_float(x.v[k]) * r;
            d.v[k] = from_float(r * (g - xhat * mean_gx));
        }
        store_pack8(dqkv + off + c, d);
    }
}

/*
 * Gain-gradient partial sums over one chunk of (row, head) pairs: partial[chunk][c] for c in [0, 2*HS)
 * (q's HS columns, then k's) = sum over the chunk of dy[.][c] * xhat[.][c]. Block QKNORM_BLOCK threads:
 * P = 2*HS/8 column packs across, Y = QKNORM_BLOCK / P pairs at a time down; then a fixed-order sum over Y.
 */
__global__ void qknorm_gain_partial_kernel(float* partial, const floatX* dqkv, const floatX* inp, const float* rstd,
                                           int N, int NH, int HS) {
    __shared__ float smem[QKNORM_BLOCK * 8];
    const int P = 2 * HS / 8, Y = QKNORM_BLOCK / P;
    const int tx = threadIdx.x % P, ty = threadIdx.x / P;
    const int part = tx / (HS / 8), j = (tx % (HS / 8)) * 8;
    const long long pairs = (long long)N * NH, first = (long long)blockIdx.x * QKNORM_ROWS_PER_CHUNK;
    const long long last = min(pairs, first + QKNORM_ROWS_PER_CHUNK);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (ty < Y)
        for (long long q = first + ty; q < last; q += Y) { /* q = n * NH + h */
            const long long n = q / NH;
            const int h = (int)(q % NH);
            const long long off = ((n * 3 + part) * NH + h) * HS + j;
            const float r = rstd[n * 2 * NH + part * NH + h];
            const Pack8 d = load_pack8(dqkv + off), x = load_pack8(inp + off);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += to_float(d.v[k]) * to_float(x.v[k]) * r;
        }
    if (ty < Y)
#pragma unroll
        for (int k = 0; k < 8; k++) smem[ty * 2 * HS + tx * 8 + k] = acc[k];
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * HS; c += QKNORM_BLOCK) {
        float s = 0.0f;
        for (int y = 0; y < Y; y++) s += smem[y * 2 * HS + c];
        partial[(long long)blockIdx.x * 2 * HS + c] = s;
    }
}

/* dgq[j] += sum over chunks (in order) of partial[chunk][j], dgk[j] the same for column HS + j. */
__global__ void qknorm_gain_final_kernel(floatX* dgq, floatX* dgk, const float* partial, int chunks, int HS) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= 2 * HS) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++) s += partial[(long long)k * 2 * HS + c];
    floatX* dg = c < HS ? dgq + c : dgk + (c - HS);
    *dg = from_float(to_float(*dg) + s);
}

static void qknorm_check_shape(const void* a, const void* b, int HS, const char* what) {
    if (HS % 8 != 0 || HS > 1024)
        die("qk-norm: head size %d must be a multiple of 8 and at most 1024 (16-byte vectors, one block per chunk)", HS);
    if (a == b) die("qk-norm: %s", what);
}

/* out = qkv with q, k RMS-normalized per head (gains gq, gk) and v copied; rstd [N, 2, NH] saved. inp (the
   qkv matmul's output) must stay untouched until the backward, and out must be another buffer. */
static void qknorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* gq, const floatX* gk, int N,
                           int NH, int HS, cudaStream_t stream) {
    qknorm_check_shape(out, inp, HS, "the forward cannot run in place (the backward reads its input)");
    const int G = qknorm_group(HS);
    const long long threads = (long long)N * 3 * NH * G;
    qknorm_forward_kernel<<<ceil_div(threads, QKNORM_BLOCK), QKNORM_BLOCK, 0, stream>>>(out, rstd, inp, gq, gk, N, NH,
                                                                                        HS, G);
    cudaCheckLastError();
}

/* In place on dqkv (see the top comment): dq, dk become gradients w.r.t. inp's q, k; dgq, dgk +=. inp and rstd
   are the forward's. scratch: qknorm_scratch_floats(N, NH, HS) floats. The gain sums run first: they read the
   incoming dq, dk that the input kernel then overwrites. */
static void qknorm_backward(floatX* dqkv, floatX* dgq, floatX* dgk, float* scratch, const floatX* inp,
                            const float* rstd, const floatX* gq, const floatX* gk, int N, int NH, int HS,
                            cudaStream_t stream) {
    qknorm_check_shape(dqkv, inp, HS, "the backward's gradient buffer must not be the forward's input");
    const int chunks = (int)ceil_div((long long)N * NH, QKNORM_ROWS_PER_CHUNK);
    qknorm_gain_partial_kernel<<<chunks, QKNORM_BLOCK, 0, stream>>>(scratch, dqkv, inp, rstd, N, NH, HS);
    cudaCheckLastError();
    qknorm_gain_final_kernel<<<ceil_div(2 * HS, 256), 256, 0, stream>>>(dgq, dgk, scratch, chunks, HS);
    cudaCheckLastError();
    const int G = qknorm_group(HS);
    const long long threads = (long long)N * 2 * NH * G;
    qknorm_backward_input_kernel<<<ceil_div(threads, QKNORM_BLOCK), QKNORM_BLOCK, 0, stream>>>(dqkv, inp, rstd, gq,
                                                                                               gk, N, NH, HS, G);
    cudaCheckLastError();
}

#endif /* MODEL_QKNORM_CUH */
