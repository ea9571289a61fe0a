/*
 * dev/attention_lab/probes/probe_keys64_gproj.cu - the layout probe of gproj's key-major pass at HS 64 (attention_hopper_bwd_gproj.cu):
 * one tile of the kernel's operand forms (TMA maps, descriptors, swizzle, accumulator mapping) through the
 * kernel's own helpers (attention/cuda/hopper/kernel_keys64.cuh), written out for the lab's host loops to check, so a
 * wrong layout is named before the attention checks fail. Lab code: only the labs link it
 * (ATTN_HOPPER_PROBE_OBJS, attention/module.mk); declared in dev/attention_lab/hopper_probes.cuh.
 * Compiled for sm_90a only. Its waits record hangs in this object's own record pointer (installed by
 * hopper_lab.cuh's lab_watch_hangs through the installer at the end).
 */
#include "attention/cuda/hopper/kernel_keys64.cuh"
#include "dev/attention_lab/hopper_probes.cuh"
#include "dev/attention_lab/probes/probe_common.cuh"

namespace {

/* the mode's shared-memory plan and step height (kernel_keys64.cuh's traits) */
using SmemPlan = Keys64Mode<ATTN_GPROJ>::Plan;
constexpr int kBlockQ = SmemPlan::kBlockQ;

static_assert(ATTN_HOPPER_BWD_PROBE_TILE == kBlockQ && ATTN_HOPPER_BWD_PROBE_TILE == kWarpgroupKeys,
              "the probe's tile is one consumer warpgroup step");

/* Layout probe of the new operand form: one warpgroup, one tile at token 0 of batch 0 (T < 64: zero fill),
   K and V in the SECOND 8 KB half of their tiles (warpgroup 1's offset), Q/dO in stage 1, a per-query
   lambda [64] from global memory in the row state's .w, no softmax:
     out_st   = S^T = K Q^T,  out_dpt = dP^T = V dO^T           (forms attention_hopper_bwd.cu's probe verified)
     out_dk   = bf(dP^T) Q + bf(-lambda_q S^T) Q                (two RS batches into one accumulator)
     out_corr = bf(-lambda_q S^T) Q                             (the correction alone)
   [64 x 64] FP32 each, row-major [key][d] (S^T, dP^T: [key][query]). */
__global__ void __launch_bounds__(128, 1)
    gproj_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                       int NH, int head, const float* __restrict__ lambda_in, float* __restrict__ out_st,
                       float* __restrict__ out_dpt, float* __restrict__ out_dk, float* __restrict__ out_corr) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    __shared__ int cta_abort;
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    float4* rs = reinterpret_cast<float4*>(smem + Plan::kRowState) + kBlockQ; /* stage 1's row state */
    unsigned char* k_half = smem + Plan::kK + Plan::kBoxBytes;
    unsigned char* v_half = smem + Plan::kV + Plan::kBoxBytes;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes;
    if (threadIdx.x < kBlockQ) rs[threadIdx.x] = make_float4(0.f, 1.f, 0.f, lambda_in[threadIdx.x]);
    probe_load_tiles(probe_one_box_tiles(q_t, k_half, v_half, do_t), &qkv_map, &dout_map, bar, NH, head,
                     4 * Plan::kBoxBytes, &cta_abort);
    keys64_wait<ATTN_GPROJ>(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[32], dpt[32];
    warpgroup_two_ss_64x64(st, dpt, smem_u32(k_half), q_addr, smem_u32(v_half), do_addr);
    store_acc_rows(out_st, st, warp * 16 + g, t);
    store_acc_rows(out_dpt, dpt, warp * 16 + g, t);
    uint32_t pa[kTileKSteps][4], pds[kTileKSteps][4], plam[kTileKSteps][4]; /* pa: unused here (attention_hopper_bwd.cu's probe checks it) */
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        float lam[2][2];
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++) lam[jj][e] = rs[16 * kk + 8 * jj + 2 * t + e].w;
        pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
    }
    float dk[32], corr[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = corr[i] = 0.f;
    reg_fence(pds);
    reg_fence(plam);
    reg_fence(dk);
    reg_fence(corr);
    wgmma_fence();
    warpgroup_rs_issue_n64(dk, pds, q_addr);
    warpgroup_rs_issue_n64(dk, plam, q_addr);
    warpgroup_rs_issue_n64(corr, plam, q_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dk);
    reg_fence(corr);
    reg_fence(pds);
    reg_fence(plam);
    store_acc_rows(out_dk, dk, warp * 16 + g, t);
    store_acc_rows(out_corr, corr, warp * 16 + g, t);
}

constexpr const char* kWho = "attention (Hopper gproj key-major pass)";

}  // namespace

void attention_hopper_gproj_keys_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                              const __nv_bfloat16* dout, const float* lambda, float* tiles) {
    probe_require_shape("attention_hopper_gproj_keys_layout_probe", s, head, ATTN_HOPPER_BWD_PROBE_TILE, s.HS == kHS,
                        "64");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t tile = (size_t)ATTN_HOPPER_BWD_PROBE_TILE * ATTN_HOPPER_BWD_PROBE_TILE;
    probe_launch(gproj_probe_kernel, 128, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, lambda, tiles,
                 tiles + tile, tiles + 2 * tile, tiles + 3 * tile);
}

void attention_hopper_probe_keys64_gproj_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
