/*
 * dev/attention_lab/probes/probe_keys64.cu - the layout probe of the bf16/repair key-major kernel at HS 64 (attention_hopper_bwd.cu):
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
using SmemPlan = Keys64Mode<ATTN_BF16>::Plan;
constexpr int kBlockQ = SmemPlan::kBlockQ;

/* One warpgroup (128 threads) at warpgroup 1's offsets: K tokens 0..127 (both boxes) and V tokens 64..127 (the
   tile's second 8 KB half), Q and dO tokens 0..127 in stage 1 (through fill_stage, warp 0 as the producer lanes);
   one step, no softmax (P := S^T, dS := dP^T). Its bf(dS^T) is staged to the CTA's staging tile (parity 1) twice,
   as warpgroup 1's keys (64..127) and as warpgroup 0's (0..63), so that dQ over the tile's 128 keys is
   bf(dS) (K[0..63] + K[64..127]) and reads both K boxes; dq_rows runs for query rows 0..63 and 64..127.
   Outputs (FP32, row-major, ProbeOut):
     st, dpt [64 keys][128 queries]; dv, dk [64 keys][64]; dq [128 queries][64] from the registers;
   and dq once more through warpgroup 1's dQ tile and two TMA reduce-adds per 64 rows into dq_acc (the caller zeroed
   it; head `head`).
   Two launches (kPart): kProbeScores writes st and dpt only (with these stores in the same kernel as the GEMMs
   below, ptxas kept S^T, dP^T live next to dV, dK and serialised the wgmmas: C7512); kProbeGemms the rest
   through the kernel's helpers (its own S^T, dP^T: identical). */
enum ProbePart { kProbeScores = 0, kProbeGemms = 1 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq;
};
template <int kPart>
__global__ void __launch_bounds__(128, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        const __grid_constant__ CUtensorMap dq_map, int NH, int T, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* kv_bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* q_bar = kv_bar + 1;
    __shared__ int cta_abort;
    constexpr int kWg = 1; /* the offsets of consumer warpgroup 1 */
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_half = smem + Plan::kV + kWg * Plan::kBoxBytes;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;   /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    bf16* ds_cta = ds_cta_tile(smem, 1);
    unsigned char* dq_tile = smem + Plan::kDqTile + kWg * Plan::kDqTileBytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    probe_init_barrier(kv_bar, 1, &cta_abort);
    probe_init_barrier(q_bar, 32, nullptr);
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(kv_bar, 3 * Plan::kBoxBytes);
        for (int box = 0; box < kConsumerWarpgroups; box++)
            tma_load_4d(k_s + box * Plan::kBoxBytes, &qkv_map, kv_bar, 0, kSlotK * NH + head, box * kBoxRows, 0);
        tma_load_4d(v_half, &qkv_map, kv_bar, 0, kSlotV * NH + head, kWg * kBoxRows, 0);
    }
    if (warp == 0) fill_stage(q_t, do_t, &qkv_map, &dout_map, q_bar, 0, T, head, NH, 0, lane);
    keys64_wait<ATTN_BF16>(kv_bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    keys64_wait<ATTN_BF16>(q_bar, 0, ATTN_HANG_PROBE, 1, &cta_abort);
    __syncwarp();
    const int key_row = warp * 16 + g;
    const uint32_t kw_addr = smem_u32(k_s) + kWg * Plan::kBoxBytes, vw_addr = smem_u32(v_half);
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[kWideScoreRegs], dpt[kWideScoreRegs];
    scores_n128(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
    if constexpr (kPart == kProbeScores) {
        store_acc_rows(out.st, st, warp * 16 + g, t);
        store_acc_rows(out.dpt, dpt, warp * 16 + g, t);
        return;
    }
    uint32_t pa[kWideQSteps][4], pds[kWideQSteps][4];
    pack_a_n128(pa, st);
    pack_a_n128(pds, dpt);
    for (int wg = 0; wg < kConsumerWarpgroups; wg++)
        stage_ds_all<kDsCtaPitch>(ds_cta + wg * kWarpgroupKeys, pds, key_row, t);
    float dv[32], dk[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dv[i] = dk[i] = 0.f;
    issue_dkv(dv, dk, pa, pds, q_addr, do_addr);
    warpgroup_sync(0);
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(pa);
    reg_fence(pds);
    store_acc_rows(out.dv, dv, warp * 16 + g, t);
    store_acc_rows(out.dk, dk, warp * 16 + g, t);
    for (int rows = 0; rows < kBlockQ; rows += kDqRows) {
        float dq[32];
        dq_rows(dq, ds_cta + rows * kDsCtaPitch, smem_u32(k_s), warp, g, t);
        store_acc_rows(out.dq, dq, rows + warp * 16 + g, t);
        store_dq_tile(dq_tile, dq, warp, g, t);
        fence_proxy_async();
        warpgroup_sync(0);
        if (threadIdx.x == 0) {
            send_dq_tile(&dq_map, dq_tile, rows, head); /* B = 1: the accumulator's head index is the head */
            bulk_wait_group<0>();
        }
        warpgroup_sync(0); /* the reduce-adds read the tile before the next rows rewrite it */
    }
}

constexpr const char* kWho = "attention (Hopper backward, HS 64)";

}  // namespace

void attention_hopper_bwd_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                       float* tiles, float* dq_acc) {
    probe_require_shape("attention_hopper_bwd_layout_probe", s, head, ATTN_HOPPER_BWD_PROBE_QUERIES, s.HS == kHS, "64");
    static_assert(ATTN_HOPPER_BWD_PROBE_KEYS == kWarpgroupKeys && ATTN_HOPPER_BWD_PROBE_QUERIES == kBlockQ,
                  "the probe covers one consumer warpgroup's keys and one query step");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kDqRows, kWho);
    const size_t n_st = (size_t)kWarpgroupKeys * kBlockQ, n_kv = (size_t)kWarpgroupKeys * kHS;
    ProbeTileCursor out{tiles};
    const ProbeOut o{out.take(n_st), out.take(n_st), out.take(n_kv), out.take(n_kv), out.take((size_t)kBlockQ * kHS)};
    for (auto kernel : {layout_probe_kernel<kProbeScores> /* S^T, dP^T */,
                        layout_probe_kernel<kProbeGemms> /* dV, dK, dQ (registers and through the reduce-adds) */})
        probe_launch(kernel, 128, SmemPlan::kAlloc, qkv_map, dout_map, dq_map, s.NH, s.T, head, o);
}

void attention_hopper_probe_keys64_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
