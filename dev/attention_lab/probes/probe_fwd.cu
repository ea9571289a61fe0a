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
#include "dev/attention_lab/probes/probe_common.cuh"

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
    probe_load_tiles(ProbeTiles{smem + Plan::kQ, smem + Plan::kK, smem + Plan::kV, nullptr, Plan::kChunks,
                                Plan::kChunkBytes, Plan::kChunkBytes, 1, 0, 0},
                     &qkv_map, nullptr, bar, NH, head, 3 * Plan::kTileBytes, nullptr);
    mbar_wait(bar, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    float sacc[kSRegs];
    warpgroup_qk<HS>(sacc, smem_u32(smem + Plan::kQ) + wg * kWarpgroupRows * kSwizzleRowBytes,
                     smem_u32(smem + Plan::kK));
    store_acc_rows(s_out, sacc, row0, t);
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
    store_acc_rows(o_out, o, row0, t);
}

constexpr const char* kWho = "attention (Hopper forward probe)";

}  // namespace

void attention_hopper_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, float* s_tile, float* o_tile) {
    probe_require_shape("attention_hopper_layout_probe", s, head, kBlockK, s.HS == 64 || s.HS == 128, "64 or 128");
    const CUtensorMap map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv"); /* the forward's map */
    if (s.HS == 64)
        probe_launch(layout_probe_kernel<64>, kConsumerThreads, SmemPlan<64, kFwdStages>::kAlloc, map, s.NH, head,
                     s_tile, o_tile);
    else
        probe_launch(layout_probe_kernel<128>, kConsumerThreads, SmemPlan<128, kFwdStages>::kAlloc, map, s.NH, head,
                     s_tile, o_tile);
}
