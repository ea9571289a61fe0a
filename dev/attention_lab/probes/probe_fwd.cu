/*
 * dev/attention_lab/probes/probe_fwd.cu - the layout probe of the Hopper forward (attention_hopper.cu):
 * one tile of the kernel's operand forms (TMA maps, descriptors, swizzle, accumulator mapping) through the
 * kernel's own helpers (attention/cuda/hopper/kernel_fwd.cuh), written out for the lab's host loops to check, so a
 * wrong layout is named before the attention checks fail. Lab code: only the labs link it
 * (ATTN_HOPPER_PROBE_OBJS, attention/module.mk); declared in dev/attention_lab/hopper_probes.cuh.
 * Compiled for sm_90a only. Its waits are unbounded, as the kernel's (a finite number of copies completes each phase).
 */
#include "attention/cuda/hopper/kernel_fwd.cuh"
#include "dev/attention_lab/hopper_probes.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace {

/* Layout probe: one CTA, the two consumer warpgroups, one tile of everything at token 0 of batch 0: the
   TMA copies (slot, head, zero fill past T), S = Q K^T by warpgroup_qk, written out through the assumed
   accumulator mapping, and O = bf(S) V by pack_p_operand + issue_pv (no softmax). The host checks
   both against plain loops, so a failure says which assumption is wrong: S wrong -> the TMA map, the
   K-major descriptors/swizzle or the accumulator mapping; S right and O wrong -> the N-major V
   descriptor or the register-A mapping. */
template <int HS>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, int NH, int head, float* __restrict__ s_out,
                        float* __restrict__ o_out) {
    using Plan = SmemPlan<HS, kFwdStages>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    const int tile_offset[3] = {Plan::kQ, Plan::kK, Plan::kV}; /* by slot */
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 3 * Plan::kTileBytes);
        for (int slot = kSlotQ; slot <= kSlotV; slot++)
            for (int ch = 0; ch < Plan::kChunks; ch++)
                tma_load_4d(smem + tile_offset[slot] + ch * Plan::kChunkBytes, &qkv_map, bar, ch * kChunkCols,
                            slot * NH + head, 0, 0);
    }
    mbar_wait(bar, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    float sacc[kSRegs];
    warpgroup_qk<HS>(sacc, smem_u32(smem + Plan::kQ) + wg * kWarpgroupRows * kSwizzleRowBytes,
                     smem_u32(smem + Plan::kK));
#pragma unroll
    for (int j = 0; j < kBlockK / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) s_out[(row0 + 8 * r) * kBlockK + 8 * j + 2 * t + e] = sacc[4 * j + 2 * r + e];
    uint32_t pa[kPvSteps][4];
    pack_p_operand<false>(pa, sacc);
    float o[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) o[i] = 0.f;
    wgmma_fence();
    issue_pv<HS>(o, pa, smem_u32(smem + Plan::kV));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(pa);
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) o_out[(row0 + 8 * r) * HS + 8 * n + 2 * t + e] = o[4 * n + 2 * r + e];
}

constexpr const char* kWho = "attention (Hopper forward probe)";

}  // namespace

void attention_hopper_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, float* s_tile, float* o_tile) {
    if (s.B != 1 || s.T > kBlockK || head < 0 || head >= s.NH || (s.HS != 64 && s.HS != 128)) {
        die("attention_hopper_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS 64 or 128 (got B=%d NH=%d T=%d "
            "HS=%d head %d)", kBlockK, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv"); /* the forward's map */
    if (s.HS == 64) {
        constexpr int smem = SmemPlan<64, kFwdStages>::kAlloc;
        cudaCheck(cudaFuncSetAttribute(layout_probe_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        layout_probe_kernel<64><<<1, kConsumerThreads, smem>>>(map, s.NH, head, s_tile, o_tile);
    } else {
        constexpr int smem = SmemPlan<128, kFwdStages>::kAlloc;
        cudaCheck(cudaFuncSetAttribute(layout_probe_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        layout_probe_kernel<128><<<1, kConsumerThreads, smem>>>(map, s.NH, head, s_tile, o_tile);
    }
    cudaCheckLastError();
}
