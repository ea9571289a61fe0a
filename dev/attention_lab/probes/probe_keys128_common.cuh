/*
 * dev/attention_lab/probes/probe_keys128_common.cuh - what the three HS-128 key-major probes (probe_keys128.cu,
 * probe_keys128_fp32.cu, probe_keys128_gproj.cu) share: their tiles in the mode's shared-memory plan (K, V
 * tokens 0..127; Q, dO tokens 0..63 in stage 1), their load and S^T, dP^T, and the register-A batches into one
 * accumulator. Lab code, included after attention/cuda/hopper/kernel_keys128.cuh and probe_common.cuh.
 */
#ifndef DEV_ATTENTION_LAB_PROBES_PROBE_KEYS128_COMMON_CUH
#define DEV_ATTENTION_LAB_PROBES_PROBE_KEYS128_COMMON_CUH

namespace {

/* K and V tiles (both boxes of every chunk), Q and dO in stage 1, of Plan (Keys128Mode<MODE>::Plan) at `smem`. */
template <class Plan>
__device__ __forceinline__ ProbeTiles keys128_probe_tiles(unsigned char* smem) {
    return ProbeTiles{smem + Plan::kQ + Plan::kQTileBytes, smem + Plan::kK, smem + Plan::kV,
                      smem + Plan::kDO + Plan::kQTileBytes, kChunks, Plan::kQChunkBytes, Plan::kKeyChunkBytes,
                      kBlockK / kBoxRows, kBoxRows, Plan::kBoxBytes};
}

/* This thread's place in the probe CTA (two consumer warpgroups; key_col: its first key row) and the shared
   addresses its products read: Q and dO of stage 1, K from its warpgroup's dQ columns. */
struct Keys128ProbeThread {
    int g, t, wg, warp_in_wg, key_col;
    uint32_t q_addr, do_addr, k_dq_addr;
};

/* The whole CTA: loads the probe's tiles into Plan's layout at `smem` (shared writes the probe needs before the
   barrier, gproj's lambdas, come before this call), waits (bounded, ATTN_HANG_PROBE), and computes this
   warpgroup's S^T = K Q^T and dP^T = V dO^T over its 64 keys through the kernel's keymajor128_scores. */
template <class Plan>
__device__ __forceinline__ Keys128ProbeThread keys128_probe_scores(float (&st)[32], float (&dpt)[32],
                                                                   unsigned char* smem, const CUtensorMap* qkv_map,
                                                                   const CUtensorMap* dout_map, int NH, int head,
                                                                   int* cta_abort) {
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    const ProbeTiles tiles = keys128_probe_tiles<Plan>(smem);
    probe_load_tiles(tiles, qkv_map, dout_map, bar, NH, head, 2 * Plan::kKeyTileBytes + 2 * Plan::kQTileBytes,
                     cta_abort);
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0, cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Keys128ProbeThread th;
    th.g = lane >> 2;
    th.t = lane & 3;
    th.wg = warp / 4;
    th.warp_in_wg = warp % 4;
    th.key_col = th.wg * kWarpgroupKeys + th.warp_in_wg * 16 + th.g;
    th.q_addr = smem_u32(tiles.q);
    th.do_addr = smem_u32(tiles.dout);
    th.k_dq_addr = smem_u32(tiles.k) + th.wg * Plan::kKeyChunkBytes;
    keymajor128_scores(st, dpt, smem_u32(tiles.k) + th.wg * Plan::kBoxBytes, smem_u32(tiles.v) + th.wg * Plan::kBoxBytes,
                       th.q_addr, th.do_addr);
    return th;
}

/* acc = bf(first) B (+ bf(second_a) B if `second`): both register-A batches of keymajor128_rs_issue into the one
   accumulator, as the kernel chains dK's two batches; one commit group, waited for. */
__device__ __forceinline__ void probe_rs_batches(float (&acc)[kHS / 2], uint32_t (&first)[kQSteps][4],
                                                 uint32_t (&second_a)[kQSteps][4], uint32_t b_addr,
                                                 bool second = true) {
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
    reg_fence(first);
    reg_fence(second_a);
    reg_fence(acc);
    wgmma_fence();
    keymajor128_rs_issue(acc, first, b_addr);
    if (second) keymajor128_rs_issue(acc, second_a, b_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(acc);
    reg_fence(first);
    reg_fence(second_a);
}

}  // namespace

#endif /* DEV_ATTENTION_LAB_PROBES_PROBE_KEYS128_COMMON_CUH */
