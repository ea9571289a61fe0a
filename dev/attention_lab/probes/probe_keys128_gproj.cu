/*
 * dev/attention_lab/probes/probe_keys128_gproj.cu - the layout probe of gproj's key-major pass at HS 128 (attention_hopper_bwd128_gproj.cu):
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

using SmemPlan = Keys128Mode<ATTN_GPROJ>::Plan; /* the shared-memory plan of the kernel this probes */

static_assert(ATTN_HOPPER_GPROJ128_PROBE_KEYS == kBlockK && ATTN_HOPPER_GPROJ128_PROBE_QUERIES == kBlockQ,
              "the probe covers one CTA's keys and one query tile");

/* Layout probe: the two consumer warpgroups (256 threads), one step, no softmax, at batch 0, head `head`:
   K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 loaded into STAGE 1, a
   per-query lambda [64] from global memory in stage 1's lambda row, through the kernel's own helpers
   (P := S^T, dS := dP^T). Three launches, kPart: kProbeScores writes out_st and out_dpt, kProbeDkDv out_dk
   and out_dv, kProbeCorr out_corr (S^T, dP^T recomputed by each: deterministic; one kernel writing all five
   takes 255 registers, spills and serialises its wgmmas - ptxas keeps the earlier accumulators live):
     out_st   [128 keys][64 queries]  S^T = K Q^T
     out_dpt  [128][64]               dP^T = V dO^T
     out_dk   [128 keys][128]         bf(dP^T) Q + bf(-lambda_q S^T) Q   (the two chained batches)
     out_corr [128][128]              bf(-lambda_q S^T) Q alone
     out_dv   [128][128]              bf(S^T) dO
   FP32, row-major. */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeCorr = 2 };
template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    gproj128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                          int NH, int head, const float* __restrict__ lambda_in, float* __restrict__ out_st,
                          float* __restrict__ out_dpt, float* __restrict__ out_dk, float* __restrict__ out_corr,
                          float* __restrict__ out_dv) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    float* lam_row = reinterpret_cast<float*>(smem + Plan::kLambda) + kBlockQ; /* stage 1's lambda */
    __shared__ int cta_abort;
    if (threadIdx.x < kBlockQ) lam_row[threadIdx.x] = lambda_in[threadIdx.x];
    float st[32], dpt[32];
    const Keys128ProbeThread th = keys128_probe_scores<Plan>(st, dpt, smem, &qkv_map, &dout_map, NH, head, &cta_abort);
    const int t = th.t, key_col = th.key_col;
    const uint32_t q_addr = th.q_addr, do_addr = th.do_addr;
    uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        float lam[2][2];
        load_step_lambdas(lam, lam_row, kk, t);
        pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
    }
    if (kPart == kProbeScores) {
        store_fragment_rows(out_st, out_dpt, st, dpt, key_col, 0, kBlockQ, t);
    } else if (kPart == kProbeDkDv) { /* one commit group per accumulator */
        float dk[kHS / 2];
        probe_rs_batches(dk, pds, plam, q_addr);
        store_acc_rows(out_dk, dk, key_col, t);
        float dv[kHS / 2];
        probe_rs_batches(dv, pa, pa, do_addr, /*second=*/false);
        store_acc_rows(out_dv, dv, key_col, t);
    } else {
        float corr[kHS / 2];
        probe_rs_batches(corr, plam, plam, q_addr, /*second=*/false);
        store_acc_rows(out_corr, corr, key_col, t);
    }
}

constexpr const char* kWho = "attention (Hopper gproj key-major pass, HS 128)";

}  // namespace

void attention_hopper_gproj_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                 const __nv_bfloat16* dout, const float* lambda, float* tiles) {
    probe_require_shape("attention_hopper_gproj_keys128_layout_probe", s, head, ATTN_HOPPER_GPROJ128_PROBE_KEYS,
                        s.HS == kHS, "128");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_kv = (size_t)kBlockK * kHS;
    ProbeTileCursor out{tiles};
    float *o_st = out.take(n_st), *o_dpt = out.take(n_st), *o_dk = out.take(n_kv), *o_corr = out.take(n_kv),
          *o_dv = out.take(n_kv);
    for (auto kernel : {gproj128_probe_kernel<kProbeScores>, gproj128_probe_kernel<kProbeDkDv>,
                        gproj128_probe_kernel<kProbeCorr>})
        probe_launch(kernel, kConsumerThreads, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, lambda, o_st, o_dpt,
                     o_dk, o_corr, o_dv);
}

void attention_hopper_probe_keys128_gproj_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
