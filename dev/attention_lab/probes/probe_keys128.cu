/*
 * dev/attention_lab/probes/probe_keys128.cu - the layout probe of the bf16/repair key-major kernel at HS 128 (attention_hopper_bwd128.cu):
 * one tile of the kernel's operand forms (TMA maps, descriptors, swizzle, accumulator mapping) through the
 * kernel's own helpers (attention/cuda/hopper/kernel_keys128.cuh), written out for the lab's host loops to check, so a
 * wrong layout is named before the attention checks fail. Lab code: only the labs link it
 * (ATTN_HOPPER_PROBE_OBJS, attention/module.mk); declared in dev/attention_lab/hopper_probes.cuh.
 * Compiled for sm_90a only. Its waits record hangs in this object's own record pointer (installed by
 * hopper_lab.cuh's lab_watch_hangs through the installer at the end).
 */
#include "attention/cuda/hopper/kernel_keys128.cuh"
#include "dev/attention_lab/hopper_probes.cuh"
#include "dev/attention_lab/probes/probe_common.cuh"
#include "dev/attention_lab/probes/probe_keys128_common.cuh"

namespace {

using SmemPlan = Keys128Mode<ATTN_BF16>::Plan; /* the shared-memory plan of the kernel this probes */

/* Layout probe: the two consumer warpgroups (256 threads), one step of everything, no softmax, at batch 0,
   head `head`: K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 loaded into
   STAGE 1, dS staged in BUFFER 1 (the non-zero offsets are what is exercised), through the kernel's own
   helpers:
     out_st  [128 keys][64 queries]  S^T = K Q^T            (a)
     out_dpt [128][64]               dP^T = V dO^T          (a), the dout map at HS 128
     out_dv  [128 keys][128]         dV = bf(S^T) dO        (b)
     out_dk  [128][128]              dK = bf(dP^T) Q        (b), Q read N-major after K-major
     out_dq  [64 queries][128]       dQ = bf(dP^T)^T K      (c), (d): both warpgroups' dS, 128 keys
   FP32, row-major. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ out_st, float* __restrict__ out_dpt,
                        float* __restrict__ out_dv, float* __restrict__ out_dk, float* __restrict__ out_dq) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    __shared__ int cta_abort;
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsBytes); /* buffer 1 */
    float st[32], dpt[32];
    const Keys128ProbeThread th = keys128_probe_scores<Plan>(st, dpt, smem, &qkv_map, &dout_map, NH, head, &cta_abort);
    const int g = th.g, t = th.t, wg = th.wg, warp_in_wg = th.warp_in_wg, key_col = th.key_col;
    store_fragment_rows(out_st, out_dpt, st, dpt, key_col, 0, kBlockQ, t);
    uint32_t pa[4][4], pds[4][4];
    pack_acc_a_operand(pa, st);
    pack_acc_a_operand(pds, dpt);
    stage_ds_all<kDsPitch>(ds_s, pds, key_col, t);
    float dv[kHS / 2], dk[kHS / 2], dq[32];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dv[i] = dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) dq[i] = 0.f;
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    keymajor128_rs_issue(dv, pa, th.do_addr);
    keymajor128_rs_issue(dk, pds, th.q_addr);
    wgmma_commit();
    consumers_sync();
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(pa);
    reg_fence(pds);
    uint32_t adq[8][4];
    load_ds_operand(adq, ds_s, warp_in_wg, g, t);
    reg_fence(adq);
    reg_fence(dq);
    wgmma_fence();
    warpgroup_dq_issue(dq, adq, th.k_dq_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(adq);
    store_fragment_rows(out_dv, out_dk, dv, dk, key_col, 0, kHS, t);
    store_acc_rows(out_dq, dq, warp_in_wg * 16 + g, t, wg * kDqCols, kHS);
}

constexpr const char* kWho = "attention (Hopper backward, HS 128)";

}  // namespace

void attention_hopper_bwd128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          float* tiles) {
    probe_require_shape("attention_hopper_bwd128_layout_probe", s, head, ATTN_HOPPER_BWD128_PROBE_KEYS, s.HS == kHS,
                        "128");
    static_assert(ATTN_HOPPER_BWD128_PROBE_KEYS == kBlockK && ATTN_HOPPER_BWD128_PROBE_QUERIES == kBlockQ,
                  "the probe covers one CTA's keys and one query tile");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_dkv = (size_t)kBlockK * kHS;
    ProbeTileCursor out{tiles};
    float *o_st = out.take(n_st), *o_dpt = out.take(n_st), *o_dv = out.take(n_dkv), *o_dk = out.take(n_dkv),
          *o_dq = out.take((size_t)kBlockQ * kHS);
    probe_launch(layout_probe_kernel, kConsumerThreads, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, o_st, o_dpt,
                 o_dv, o_dk, o_dq);
}

void attention_hopper_probe_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
