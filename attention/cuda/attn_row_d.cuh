/*
 * attention/cuda/attn_row_d.cuh - D_i = dO_i . O_i from the stored BF16 O: the one sum order of every kernel that
 * forms it.
 *
 * Why: D enters dS = P (dP - D) of every query of a row, so the passes of one backward must agree on it to the
 * bit. The portable chain and the Hopper bf16/repair chains take it from the prep kernel (attention_cuda.cu,
 * attn_bwd_prep_kernel: HS/8 lanes per row, one 16-byte pack each, a butterfly over the lanes); gproj's Hopper row
 * pass forms it itself from the same loads (kernel_rows.cuh), so its chain needs no prep kernel. Both take the
 * per-pack sums and the tree of adds from here, and so give the same bits.
 *
 * The order: s_j = the FMA chain dO.O over pack j's 8 elements in element order (pack j = columns 8j .. 8j+7);
 * then, for k = HS/16, HS/32, ..., 1: s_j <- s_j + s_(j xor k) (the prep's butterfly, where lane j holds s_j).
 * A quad of 4 lanes that holds packs {t, t + 4, ...} reaches the butterfly's value at k = 2 after adding its own
 * packs in the same pairs (attn_row_d_quad_partial), then finishes with k = 2 and 1 over the quad.
 *
 * Offers: attn_row_d_pack, attn_row_d_quad_partial.
 */
#ifndef ATTENTION_CUDA_ATTN_ROW_D_CUH
#define ATTENTION_CUDA_ATTN_ROW_D_CUH

#include <stdint.h>
#include <cuda_bf16.h>

/* sum + the 8 products dO . O of one pack (16 bytes of each), in element order, one FMA each. */
__device__ __forceinline__ float attn_row_d_pack(uint4 o8, uint4 g8, float sum) {
    const uint32_t ow[4] = {o8.x, o8.y, o8.z, o8.w}, gw[4] = {g8.x, g8.y, g8.z, g8.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ow[k]));
        const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gw[k]));
        sum = __fmaf_rn(gf.x, of.x, sum);
        sum = __fmaf_rn(gf.y, of.y, sum);
    }
    return sum;
}

/* The butterfly's value at k = 2 for quad lane t (0..3) of a row of HS columns at o and g (16-byte aligned):
   HS 64, packs t and t+4: s_t + s_(t+4); HS 128, packs t, t+4, t+8, t+12: (s_t + s_(t+8)) + (s_(t+4) + s_(t+12)).
   The quad then adds lane t xor 2's value, then lane t xor 1's. */
template <int HS>
__device__ __forceinline__ float attn_row_d_quad_partial(const __nv_bfloat16* o, const __nv_bfloat16* g, int t) {
    static_assert(HS == 64 || HS == 128, "head size 64 or 128");
    const uint4* o4 = reinterpret_cast<const uint4*>(o);
    const uint4* g4 = reinterpret_cast<const uint4*>(g);
    const float s0 = attn_row_d_pack(__ldg(o4 + t), __ldg(g4 + t), 0.f);
    const float s4 = attn_row_d_pack(__ldg(o4 + t + 4), __ldg(g4 + t + 4), 0.f);
    if constexpr (HS == 64) {
        return s0 + s4;
    } else {
        const float s8 = attn_row_d_pack(__ldg(o4 + t + 8), __ldg(g4 + t + 8), 0.f);
        const float s12 = attn_row_d_pack(__ldg(o4 + t + 12), __ldg(g4 + t + 12), 0.f);
        return (s0 + s8) + (s4 + s12);
    }
}

#endif /* ATTENTION_CUDA_ATTN_ROW_D_CUH */
