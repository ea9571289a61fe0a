/*
 * model/swiglu.cuh - the SwiGLU non-linearity (--mlp swiglu), forward and
 * backward, on the fused gate/up buffer.
 *
 * Why: Llama-style MLPs compute u = x W_fc^T with one fused W_fc (2H, C), so
 * one GEMM writes u [N, 2H] whose first H columns are the gate a and last H
 * the up projection b; the hidden activation is h = silu(a) * b
 * = a * sigmoid(a) * b, h [N, H]. cuBLASLt has no epilogue for a product of
 * two halves of its output, so (unlike GELU, matmul.cuh) SwiGLU is its own
 * pass each way. The backward takes dh [N, H] and u, and OVERWRITES the fused
 * gradient du [N, 2H] (the analogue of the DGELU matmul's output):
 *   da = dh * b * sigmoid(a) * (1 + a * (1 - sigmoid(a))),  db = dh * silu(a).
 * FP32 arithmetic on BF16 values, one rounding per output. The forward is
 * also what --recompute would run to rebuild h from the stored u.
 *
 * Offers: swiglu_forward, swiglu_backward. Shapes: rows N, hidden H with
 * H % 8 == 0 (16-byte vectors), u and du row-major [N, 2H], h and dh [N, H].
 */
#ifndef MODEL_SWIGLU_CUH
#define MODEL_SWIGLU_CUH

#include "model/kernel_common.cuh"

#define SWIGLU_BLOCK 256

__device__ __forceinline__ float swiglu_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/* One thread: 8 consecutive hidden units j of row n. */
__global__ void swiglu_forward_kernel(floatX* h, const floatX* u, int N, int H) {
    const long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int packs = H / 8;
    if (item >= (long long)N * packs) return;
    const long long n = item / packs;
    const int j = (int)(item % packs) * 8;
    const Pack8 a = load_pack8(u + n * 2 * H + j), b = load_pack8(u + n * 2 * H + H + j);
    Pack8 o;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float x = to_float(a.v[k]);
        o.v[k] = from_float(x * swiglu_sigmoid(x) * to_float(b.v[k]));
    }
    store_pack8(h + n * H + j, o);
}

__global__ void swiglu_backward_kernel(floatX* du, const floatX* dh, const floatX* u, int N, int H) {
    const long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int packs = H / 8;
    if (item >= (long long)N * packs) return;
    const long long n = item / packs;
    const int j = (int)(item % packs) * 8;
    const Pack8 a = load_pack8(u + n * 2 * H + j), b = load_pack8(u + n * 2 * H + H + j);
    const Pack8 d = load_pack8(dh + n * H + j);
    Pack8 da, db;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float x = to_float(a.v[k]), s = swiglu_sigmoid(x), g = to_float(d.v[k]);
        da.v[k] = from_float(g * to_float(b.v[k]) * s * (1.0f + x * (1.0f - s)));
        db.v[k] = from_float(g * x * s);
    }
    store_pack8(du + n * 2 * H + j, da);
    store_pack8(du + n * 2 * H + H + j, db);
}

static void swiglu_check_shape(int H) {
    if (H % 8 != 0) die("swiglu: hidden size %d is not a multiple of 8 (16-byte vectors)\n  hint: --mlp-hidden", H);
}

/* h [N, H] = silu(u[:, :H]) * u[:, H:]. */
static void swiglu_forward(floatX* h, const floatX* u, int N, int H, cudaStream_t stream) {
    swiglu_check_shape(H);
    const long long items = (long long)N * (H / 8);
    swiglu_forward_kernel<<<ceil_div(items, SWIGLU_BLOCK), SWIGLU_BLOCK, 0, stream>>>(h, u, N, H);
    cudaCheckLastError();
}

/* du [N, 2H] = d h / d u applied to dh [N, H] (overwritten; du must not alias dh or u). */
static void swiglu_backward(floatX* du, const floatX* dh, const floatX* u, int N, int H, cudaStream_t stream) {
    swiglu_check_shape(H);
    if (du == dh || du == u) die("swiglu_backward: du must be its own buffer (it is written while dh and u are read)");
    const long long items = (long long)N * (H / 8);
    swiglu_backward_kernel<<<ceil_div(items, SWIGLU_BLOCK), SWIGLU_BLOCK, 0, stream>>>(du, dh, u, N, H);
    cudaCheckLastError();
}

#endif /* MODEL_SWIGLU_CUH */
