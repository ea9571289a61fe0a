/*
 * dev/attention_lab/probes/probe_rows64.cu - the layout probe of the row pass at HS 64 (attention_hopper_rows.cu):
 * one tile of the kernel's operand forms (TMA maps, descriptors, swizzle, accumulator mapping) through the
 * kernel's own helpers (attention/cuda/hopper/kernel_rows.cuh), written out for the lab's host loops to check, so a
 * wrong layout is named before the attention checks fail. Lab code: only the labs link it
 * (ATTN_HOPPER_PROBE_OBJS, attention/module.mk); declared in dev/attention_lab/hopper_probes.cuh.
 * Compiled for sm_90a only. Its waits are unbounded, as the kernel's (a finite number of copies completes each phase).
 */
#include "attention/cuda/hopper/kernel_rows.cuh"
#include "dev/attention_lab/hopper_probes.cuh"
#include "dev/attention_lab/probes/probe_common.cuh"

namespace {

/* the head size's traits (kernel_rows.cuh) */
constexpr int kHS = 64;
using SmemPlan = RowsShape<kHS>::Plan;
constexpr int kDqRegs = RowsShape<kHS>::kDqRegs;

/* Layout probe: one CTA, the two consumer warpgroups, one tile of everything at token 0 of batch 0 (head
   `head`): the TMA copies of Q, K, V (qkv map) and dO (dout map), S = Q K^T and dP = dO V^T through
   warpgroup_two_ss_64x64 (two 64-key halves, as the kernel), and X = bf(S) K, Y = bf(dP) K through pack_acc_a_operand + warpgroup_rs_k (no softmax).
   Each is written out through the assumed accumulator mapping and checked on the host against plain loops:
   S wrong -> qkv map / K-major descriptors (already verified by hopper_fwd: a regression); dP wrong, S right
   -> the dout map or V as K-major B; X or Y wrong, S and dP right -> K as N-major B or the register A. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ s_out, float* __restrict__ dp_out,
                        float* __restrict__ x_out, float* __restrict__ y_out) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + SmemPlan::kBarriers);
    probe_load_tiles(probe_one_box_tiles(smem + SmemPlan::kQ, smem + SmemPlan::kK, smem + SmemPlan::kV,
                                         smem + SmemPlan::kDO),
                     &qkv_map, &dout_map, bar, NH, head, 4 * SmemPlan::kTileBytes, nullptr);
    mbar_wait(bar, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    const uint32_t wg_row_bytes = wg * kWarpgroupRows * kSwizzleRowBytes;
    const uint32_t k_addr = smem_u32(smem + SmemPlan::kK);
    float x[kDqRegs], y[kDqRegs];
#pragma unroll
    for (int i = 0; i < kDqRegs; i++) x[i] = y[i] = 0.f;
    reg_fence(x); /* the zeroing before any wgmma fence (see warpgroup_two_ss_64x64) */
    reg_fence(y);
#pragma unroll
    for (int sub = 0; sub < kSubTiles; sub++) { /* the kernel's two 64-key halves, X and Y accumulating */
        float sacc[kSRegs], dpacc[kSRegs];
        warpgroup_two_ss_64x64(sacc, dpacc, smem_u32(smem + SmemPlan::kQ) + wg_row_bytes,
                               k_addr + sub * kSubTileBytes, smem_u32(smem + SmemPlan::kDO) + wg_row_bytes,
                               smem_u32(smem + SmemPlan::kV) + sub * kSubTileBytes);
        store_fragment_rows(s_out, dp_out, sacc, dpacc, row0, sub * kSubKeys, kBlockK, t);
        uint32_t sa[kKeySteps][4], dpa[kKeySteps][4];
        pack_acc_a_operand(sa, sacc);
        pack_acc_a_operand(dpa, dpacc);
        warpgroup_rs_k<kDqRegs, false>(y, x, dpa, sa, k_addr + sub * kSubTileBytes,
                                       SmemPlan::kTileBytes); /* the kernel's call */
    }
    store_fragment_rows(x_out, y_out, x, y, row0, 0, kHS, t);
}

constexpr const char* kWho = "attention (Hopper row pass)";

}  // namespace

void attention_hopper_rows_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                        float* s_tile, float* dp_tile, float* x_tile, float* y_tile) {
    if (s.HS == 128) {
        attention_hopper_rows128_layout_probe(s, head, qkv, dout, s_tile, dp_tile, x_tile, y_tile);
        return;
    }
    probe_require_shape("attention_hopper_rows_layout_probe", s, head, ATTN_HOPPER_ROWS_PROBE_ROWS, s.HS == kHS,
                        "64 or 128");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBlockK, kWho, "dout");
    probe_launch(layout_probe_kernel, kConsumerThreads, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, s_tile,
                 dp_tile, x_tile, y_tile);
}
