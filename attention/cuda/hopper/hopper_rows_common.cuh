/*
 * attention/cuda/hopper/hopper_rows_common.cuh - device pieces shared by the Hopper (sm_90a) row passes of the backward
 * (kernel_rows.cuh at HS 64 and 128) that are not a mode's numerics (the row state, P and dS with the row sums and
 * the rows' outputs are mode_numerics.cuh's, included here): the DSK/PK GEMMs of one 64-key half.
 *
 * The fragment layout (hopper_wgmma.cuh): a thread holds rows row0 and row0 + 8 of its warpgroup's 64 rows;
 * register 4j + 2r + e of an accumulator is row row0 + 8r, column 8j + 2t + e (t = lane % 4). Everything is in
 * the including file's anonymous namespace.
 */
#ifndef ATTENTION_HOPPER_ROWS_COMMON_CUH
#define ATTENTION_HOPPER_ROWS_COMMON_CUH

#include <stdint.h>
#include <cuda_bf16.h>
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/mode_numerics.cuh"

namespace {

/* DSK += bf(dS) K and PK += bf(P) K over one 64-key half: 4 k-steps of 16 keys against the K rows at k_addr read
   N-major (trans-b = 1: the head dim, N = 2 REGS, contiguous within a 64-column chunk; the next 64-column block
   of N is `chunk_bytes` further: the descriptor's LBO), each k-step 16 rows = 2048 bytes further; the forward's
   O += P V with K in place of V (wgmma_pv: m64n64k16 or m64n128k16 by REGS). FENCE_A: the just-packed A
   registers are fenced first (HS 128's form; HS 64's kernel runs without: a parameter, so each kernel keeps
   the PTX its checks verified). The A registers stay live until the wgmmas that read them are done: fenced,
   committed and waited for by warpgroup_rs_k; warpgroup_rs_k_issue issues the 8 wgmmas alone, into a commit
   group of the caller's, which keeps the A registers live until its wait. */
template <int REGS>
__device__ __forceinline__ void warpgroup_rs_k_issue(float (&dsk)[REGS], float (&pk)[REGS],
                                                     const uint32_t (&dsa)[hopper_wgmma::kTileKSteps][4],
                                                     const uint32_t (&pa)[hopper_wgmma::kTileKSteps][4],
                                                     uint32_t k_addr, uint32_t chunk_bytes) {
    using namespace hopper_wgmma;
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        const uint64_t desc = make_smem_desc(k_addr + kk * 16 * kTileRowBytes, chunk_bytes, kSwizzle128BAtomBytes);
        wgmma_pv(dsk, dsa[kk], desc);
        wgmma_pv(pk, pa[kk], desc);
    }
}

template <int REGS, bool FENCE_A>
__device__ __forceinline__ void warpgroup_rs_k(float (&dsk)[REGS], float (&pk)[REGS],
                                               uint32_t (&dsa)[hopper_wgmma::kTileKSteps][4],
                                               uint32_t (&pa)[hopper_wgmma::kTileKSteps][4], uint32_t k_addr,
                                               uint32_t chunk_bytes) {
    using namespace hopper_wgmma;
    if (FENCE_A) {
        reg_fences(dsa, pa);
    }
    wgmma_fence();
    warpgroup_rs_k_issue(dsk, pk, dsa, pa, k_addr, chunk_bytes);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fences(dsk, pk);
    reg_fence(dsa); /* keeps the A registers live (unchanged) until the wgmmas that read them are done */
    reg_fence(pa);
}

}  // namespace

#endif /* ATTENTION_HOPPER_ROWS_COMMON_CUH */
