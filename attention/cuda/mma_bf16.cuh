/*
 * attention/cuda/mma_bf16.cuh - the tensor-core building blocks of the attention
 * kernels: BF16 mma.sync m16n8k16 with FP32 accumulation, register fragments
 * loaded by ldmatrix from padded shared-memory tiles, cp.async tile copies.
 *
 * Why: every attention kernel (forward, backward, the row pre-pass) multiplies
 * 16-row slices of small tiles held in shared memory; keeping the fragment
 * layout in one place means the index arithmetic is written (and checked)
 * once. Works on sm_80 and later (mma.sync, cp.async).
 *
 * Fragment layout of mma.m16n8k16 (PTX ISA), lane = 4*g + t:
 *   A (16x16, row major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
 *   B (16x8, "col"):      b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
 *   C (16x8, fp32):       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
 * Two neighbouring C tiles (columns 16k..16k+15) hold exactly the A fragment
 * of k-step k, which is how softmax probabilities go from one GEMM into the
 * next without touching shared memory (the FlashAttention-2 register trick).
 *
 * Tiles in shared memory are row major with a row stride of (columns + 8)
 * BF16: with the 8-element (16-byte) pad, the 8 row addresses of one ldmatrix
 * phase fall into 8 different 16-byte bank groups (no conflicts).
 */
#ifndef ATTENTION_MMA_BF16_CUH
#define ATTENTION_MMA_BF16_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace attn_mma {

typedef __nv_bfloat16 bf16;

/* Two floats rounded to BF16 (RNE) and packed: lo in the low half (the lower
   column index), as the fragments expect. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

/* The BF16 remainder of a float after rounding it to BF16: x - bf(x) is exact
   in FP32, and bf(x) + bf(x - bf(x)) carries 16 significant bits (used by the
   fp32 mode to make tensor-core products FP32-accurate). */
__device__ __forceinline__ float bf16_residual(float x) {
    return x - __bfloat162float(__float2bfloat16_rn(x));
}

/* The A operand of the next m16n8k16 MMA from the C fragments of two adjacent 8-column tiles (c0: columns
   0-7, c1: columns 8-15 of the 16-wide k-slice), rounded to BF16: a product (P, dS) feeds the next GEMM
   straight from registers, as FlashAttention-2 does. */
__device__ __forceinline__ void pack_a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}

/* The same for the BF16 remainders x - bf(x) of the fragments (fp32 mode's second operand term). */
__device__ __forceinline__ void pack_a_residual_from_c(uint32_t (&a)[4], const float (&c0)[4],
                                                       const float (&c1)[4]) {
    a[0] = pack_bf16x2(bf16_residual(c0[0]), bf16_residual(c0[1]));
    a[1] = pack_bf16x2(bf16_residual(c0[2]), bf16_residual(c0[3]));
    a[2] = pack_bf16x2(bf16_residual(c1[0]), bf16_residual(c1[1]));
    a[3] = pack_bf16x2(bf16_residual(c1[2]), bf16_residual(c1[3]));
}

/* c += a * b on tensor cores. */
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c0 += a * (n-tile 0), c1 += a * (n-tile 1): one k-step over the two neighbouring 8-column tiles whose B
   fragments one ldsm_b_*_x2 loads (b[0], b[1]: tile 0; b[2], b[3]: tile 1). */
__device__ __forceinline__ void mma_16816_x2(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[4]) {
    mma_16816(c0, a, b[0], b[1]);
    mma_16816(c1, a, b[2], b[3]);
}

/* An A fragment's four words (pack_a_from_c's a[0..3]) to their places in a row-major tile of stride LD:
   row_ptr is this lane's row g at column 2t, j0 and j1 the two 8-column tiles the words belong to. Word 0:
   (g, 8 j0 + 2t..), 1: (g + 8, 8 j0 + 2t..), 2 and 3: the same at 8 j1. */
template <int LD>
__device__ __forceinline__ void store_a_words(bf16* row_ptr, int j0, int j1, const uint32_t (&w)[4]) {
    *reinterpret_cast<uint32_t*>(row_ptr + j0 * 8) = w[0];
    *reinterpret_cast<uint32_t*>(row_ptr + 8 * LD + j0 * 8) = w[1];
    *reinterpret_cast<uint32_t*>(row_ptr + j1 * 8) = w[2];
    *reinterpret_cast<uint32_t*>(row_ptr + 8 * LD + j1 * 8) = w[3];
}

/* ---- ldmatrix versions: one instruction loads four 8x8 BF16 matrices, each
   lane giving the shared-memory address of one matrix row (lanes 8i..8i+7:
   rows of matrix i) and receiving, in register i, row lane/4, columns
   2(lane%4)..+1 of matrix i (with .trans: rows 2(lane%4)..+1 of column lane/4).
   Rows are 16-byte aligned and, with the padded stride, conflict-free. ---- */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row_ptr) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(row_ptr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row_ptr) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(row_ptr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* A fragment of rows row0..row0+15, columns col0..col0+15 of a row-major tile:
   matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are a0..a3. */
template <int LD>
__device__ __forceinline__ void ldsm_a(uint32_t (&a)[4], const bf16* tile, int row0, int col0, int lane) {
    ldmatrix_x4(a, tile + (row0 + (lane & 15)) * LD + col0 + ((lane >> 4) << 3));
}

/* The same A fragment from a tile that stores A transposed, tile[k][m] (e.g. dS^T as the
   backward's registers hold it, read back as the A operand of dQ = dS K), by the transposing
   load: matrix i covers m0 + 8(i & 1).., k0 + 8(i >> 1).., so lane 4g + t receives
   tile[k0 + 2t..+1][m0 + g] = A[g][2t..+1] in a0 (and likewise a1..a3). */
template <int LD>
__device__ __forceinline__ void ldsm_a_t(uint32_t (&a)[4], const bf16* tile, int m0, int k0, int lane) {
    const int i = lane >> 3, r = lane & 7;
    ldmatrix_x4_trans(a, tile + (k0 + r + ((i >> 1) << 3)) * LD + m0 + ((i & 1) << 3));
}

/* B fragments (k0..k0+15) of the two n-tiles n0 and n0+8 from a tile that stores B
   transposed, tile[n][k] (e.g. K for S = Q K^T): b[0], b[1] of n-tile n0, b[2], b[3] of n0+8.
   Matrices: (n0.., k0), (n0.., k0+8), (n0+8.., k0), (n0+8.., k0+8). */
template <int LD>
__device__ __forceinline__ void ldsm_b_nk_x2(uint32_t (&b)[4], const bf16* tile, int n0, int k0, int lane) {
    const int i = lane >> 3, r = lane & 7;
    ldmatrix_x4(b, tile + (n0 + r + ((i >> 1) << 3)) * LD + k0 + ((i & 1) << 3));
}

/* B fragments (k0..k0+15) of the two n-tiles n0 and n0+8 from a tile that stores B as
   is, tile[k][n] (e.g. V for O = P V), by the transposing load: b[0], b[1] of n0, b[2], b[3] of n0+8.
   Matrices (rows k, columns n): (k0.., n0), (k0+8.., n0), (k0.., n0+8), (k0+8.., n0+8). */
template <int LD>
__device__ __forceinline__ void ldsm_b_kn_x2(uint32_t (&b)[4], const bf16* tile, int k0, int n0, int lane) {
    const int i = lane >> 3, r = lane & 7;
    ldmatrix_x4_trans(b, tile + (k0 + r + ((i & 1) << 3)) * LD + n0 + ((i >> 1) << 3));
}

/* 16-byte global -> shared copy that bypasses registers; valid == false
   writes zeros (rows past the end of the sequence). */
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Copies rows row0..row0+ROWS-1 (HS BF16 each, consecutive rows row_stride
   elements apart from `base`) into a padded tile; rows >= nrows become zeros. */
template <int ROWS, int HS, int LD, int THREADS>
__device__ __forceinline__ void load_rows_async(bf16* tile, const bf16* base, long long row_stride, int row0,
                                                int nrows, int tid) {
    constexpr int CHUNKS = HS / 8; /* 16-byte chunks per row */
    for (int i = tid; i < ROWS * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, ch = i % CHUNKS;
        const int row = row0 + r;
        const bool valid = row < nrows;
        const bf16* src = base + (long long)(valid ? row : 0) * row_stride + ch * 8;
        cp_async_16(tile + r * LD + ch * 8, src, valid);
    }
}

/* Sum over the 4 lanes of a quad (the lanes that share one C-fragment row). */
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}

}  // namespace attn_mma

#endif /* ATTENTION_MMA_BF16_CUH */
