/*
 * model/rope.cuh - rotary position embedding (--pos rope) of the q and k
 * parts of the attention input, forward and backward, in place.
 *
 * Why: Llama-style stacks have no wpe; position enters by rotating each
 * (x_i, x_{i+HS/2}) pair of every q and k head by the angle t * inv_freq_i
 * (the rotate-half convention; the angles come from model/rope_table.h, so
 * the CPU reference and this kernel use the same cos/sin bits):
 *   x'_i = x_i cos - x_{i+HS/2} sin,   x'_{i+HS/2} = x_{i+HS/2} cos + x_i sin.
 * In place, on the qkv buffer [B, T, 3, NH, HS] (attention.h's layout) that
 * attention then reads: the rotation is linear and needs none of its inputs
 * for the backward (which is the transposed rotation, the same formula with
 * -sin), so the pre-rotation q/k need not be kept, attention's forward and
 * backward (and the diagnostics and captures) see the rotated keys, and no
 * activation buffer is added. v is not touched. Arithmetic in FP32 on the
 * BF16 values, one rounding to BF16 per output.
 *
 * Offers: rope_table_upload (the device table for positions [0, T)),
 * rope_forward (q, k rotated in place), rope_backward (dq, dk rotated back in
 * place). Shapes: HS % 16 == 0 (8 pairs per thread, 16-byte vectors), the
 * table covers at least the T of the call.
 */
#ifndef MODEL_ROPE_CUH
#define MODEL_ROPE_CUH

#include "model/kernel_common.cuh"
#include "model/rope_table.h"

#define ROPE_BLOCK 256

/* One thread: 8 consecutive pairs (i0 .. i0+7, with their partners at +HS/2) of one head of q or k at one
   position. SIGN = +1 rotates by +angle (forward), -1 by -angle (backward: the transpose). Work items run
   pair-pack fastest, then head, then q/k, then row, so a warp reads contiguous head slices. */
template <int SIGN>
__global__ void rope_rotate_kernel(floatX* qkv, const RopeCosSin* __restrict__ table, int N, int T, int NH, int HS) {
    const int half = HS / 2, packs = half / 8;
    const long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (long long)N * 2 * NH * packs) return;
    const int p = (int)(item % packs);
    const long long head_row = item / packs; /* (n, part, h) with part 0 = q, 1 = k */
    const int h = (int)(head_row % NH), part = (int)(head_row / NH % 2);
    const long long n = head_row / (2 * NH);
    const int t = (int)(n % T);
    floatX* x = qkv + ((n * 3 + part) * NH + h) * HS + p * 8;
    const Pack8 lo = load_pack8(x), hi = load_pack8(x + half);
    /* 8 entries = 64 bytes, 16-byte aligned since half % 8 == 0 */
    const float4* cs4 = reinterpret_cast<const float4*>(table + (size_t)t * half + p * 8);
    float c[8], s[8];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float4 v = __ldg(cs4 + k);
        c[2 * k] = v.x; s[2 * k] = v.y; c[2 * k + 1] = v.z; s[2 * k + 1] = v.w;
    }
    Pack8 out_lo, out_hi;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = to_float(lo.v[k]), b = to_float(hi.v[k]), sn = SIGN * s[k];
        out_lo.v[k] = from_float(a * c[k] - b * sn);
        out_hi.v[k] = from_float(b * c[k] + a * sn);
    }
    store_pack8(x, out_lo);
    store_pack8(x + half, out_hi);
}

/* Allocates and fills the device table for positions [0, T) (model/rope_table.h); the caller frees it. */
static RopeCosSin* rope_table_upload(int T, int HS, double base) {
    if (HS % 2 != 0 || T < 1) die("rope: head size %d must be even and positions %d at least 1", HS, T);
    const size_t n = rope_table_entries(T, HS);
    RopeCosSin* host = (RopeCosSin*)mallocCheck(n * sizeof(RopeCosSin));
    rope_table_fill(host, T, HS, base);
    RopeCosSin* dev = NULL;
    cudaCheck(cudaMalloc((void**)&dev, n * sizeof(RopeCosSin)));
    cudaCheck(cudaMemcpy(dev, host, n * sizeof(RopeCosSin), cudaMemcpyHostToDevice));
    free(host);
    return dev;
}

template <int SIGN>
static void rope_launch(floatX* qkv, const RopeCosSin* table, int table_T, int B, int T, int NH, int HS,
                        cudaStream_t stream) {
    if (HS % 16 != 0) die("rope: head size %d is not a multiple of 16 (the GPU kernel rotates 8 pairs per thread)", HS);
    if (T > table_T) die("rope: sequence length %d exceeds the table's %d positions", T, table_T);
    const long long items = (long long)B * T * 2 * NH * (HS / 16);
    rope_rotate_kernel<SIGN><<<ceil_div(items, ROPE_BLOCK), ROPE_BLOCK, 0, stream>>>(qkv, table, B * T, T, NH, HS);
    cudaCheckLastError();
}

/* q and k of qkv [B, T, 3, NH, HS] rotated in place by the angles of position t = row % T. table: table_T
   positions (rope_table_upload), table_T >= T. */
static void rope_forward(floatX* qkv, const RopeCosSin* table, int table_T, int B, int T, int NH, int HS,
                         cudaStream_t stream) {
    rope_launch<1>(qkv, table, table_T, B, T, NH, HS, stream);
}

/* The backward: dq and dk of dqkv (same layout) rotated in place by -angle (the transpose of the forward's
   rotation), turning gradients w.r.t. the rotated q/k into gradients w.r.t. their inputs; dv untouched. */
static void rope_backward(floatX* dqkv, const RopeCosSin* table, int table_T, int B, int T, int NH, int HS,
                          cudaStream_t stream) {
    rope_launch<-1>(dqkv, table, table_T, B, T, NH, HS, stream);
}

#endif /* MODEL_ROPE_CUH */
