/*
 * dev/attention_lab/probes/probe_rows128.cu - the layout probe of the row pass at HS 128 (attention_hopper_rows128.cu):
 * one tile of the kernel's operand forms (TMA maps, descriptors, swizzle, accumulator mapping) through the
 * kernel's own helpers (attention/cuda/hopper/kernel_rows.cuh), written out for the lab's host loops to check, so a
 * wrong layout is named before the attention checks fail. Lab code: only the labs link it
 * (ATTN_HOPPER_PROBE_OBJS, attention/module.mk); declared in dev/attention_lab/hopper_probes.cuh.
 * Compiled for sm_90a only. Its waits record hangs in this object's own record pointer (installed by
 * hopper_lab.cuh's lab_watch_hangs through the installer at the end).
 */
#include "attention/cuda/hopper/kernel_rows.cuh"
#include "dev/attention_lab/hopper_probes.cuh"
#include "dev/attention_lab/probes/probe_common.cuh"

namespace {

/* the head size's traits (kernel_rows.cuh) */
constexpr int kHS = 128;
using SmemPlan = RowsShape<kHS>::Plan;
constexpr int kChunks = RowsShape<kHS>::kChunks, kDqRegs = RowsShape<kHS>::kDqRegs;

/* Layout probe: the two consumer warpgroups (256 threads, no setmaxnreg), at batch 0, head `head`: Q, dO
   tokens 0..127 and K, V tokens 0..127 loaded into STAGE 1 (assumption (c)); then, through the kernel's own
   helpers, for both 64-key halves: S = Q K_h^T and dP = dO V_h^T (a), written out, and X += bf(S) K_h,
   Y += bf(dP) K_h (b) accumulated over the halves. Outputs [128 rows][128] FP32 row-major each. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ s_out, float* __restrict__ dp_out,
                        float* __restrict__ x_out, float* __restrict__ y_out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    unsigned char* k_t = smem + Plan::kK + Plan::kTileBytes; /* stage 1 */
    unsigned char* v_t = smem + Plan::kV + Plan::kTileBytes; /* stage 1 */
    probe_load_tiles(ProbeTiles{q_s, k_t, v_t, do_s, kChunks, Plan::kChunkBytes, Plan::kChunkBytes, 1, 0, 0}, &qkv_map,
                     &dout_map, bar, NH, head, 4 * Plan::kTileBytes, &cta_abort);
    rows_wait(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    const uint32_t wg_rows = wg * Plan::kSliceBytes;
    float x[kDqRegs], y[kDqRegs];
#pragma unroll
    for (int i = 0; i < kDqRegs; i++) x[i] = y[i] = 0.f;
    reg_fence(x);
    reg_fence(y);
#pragma unroll 1
    for (int sub = 0; sub < kSubTiles; sub++) {
        const uint32_t k_half = smem_u32(k_t) + sub * Plan::kSliceBytes;
        float sacc[kSRegs], dpacc[kSRegs];
        warpgroup_scores(sacc, dpacc, smem_u32(q_s) + wg_rows, k_half, smem_u32(do_s) + wg_rows,
                         smem_u32(v_t) + sub * Plan::kSliceBytes);
        store_fragment_rows(s_out, dp_out, sacc, dpacc, row0, sub * kSubKeys, kBlockK, t);
        uint32_t sa[kKeySteps][4], dpa[kKeySteps][4];
        pack_acc_a_operand(sa, sacc);
        pack_acc_a_operand(dpa, dpacc);
        /* the kernel's call: (DSK, PK) <- (bf(dP) K, bf(S) K) */
        warpgroup_rs_k<kDqRegs, true>(y, x, dpa, sa, k_half, SmemPlan::kChunkBytes);
    }
    store_fragment_rows(x_out, y_out, x, y, row0, 0, kHS, t);
}

constexpr const char* kWho = "attention (Hopper row pass, HS 128)";

}  // namespace

void attention_hopper_rows128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                           float* s_tile, float* dp_tile, float* x_tile, float* y_tile) {
    probe_require_shape("attention_hopper_rows128_layout_probe", s, head, ATTN_HOPPER_ROWS_PROBE_ROWS, s.HS == kHS,
                        "128");
    static_assert(ATTN_HOPPER_ROWS_PROBE_ROWS == kBlockQ && ATTN_HOPPER_ROWS_PROBE_ROWS == kBlockK,
                  "the probe covers one CTA's query rows and one key tile");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBlockK, kWho, "dout");
    probe_launch(layout_probe_kernel, kConsumerThreads, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, s_tile,
                 dp_tile, x_tile, y_tile);
}

void attention_hopper_probe_rows128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
