/*
 * dev/attention_lab/probes/probe_keys128_fp32.cu - the layout probe of fp32's key-major pass at HS 128 (attention_hopper_bwd128_fp32.cu):
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

using SmemPlan = Keys128Mode<ATTN_FP32>::Plan; /* the shared-memory plan of the kernel this probes */

static_assert(ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS == kBlockK && ATTN_HOPPER_FP32_KEYS128_PROBE_QUERIES == kBlockQ,
              "the probe covers one CTA's keys and one query tile");

/* Layout probe: the two consumer warpgroups (256 threads), one step, no softmax, at batch 0, head `head`:
   K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 in STAGE 1, P := S^T and
   dS := dP^T split and staged through the kernel's own helpers. One launch per part (S^T, dP^T recomputed
   by each; deterministic):
     kProbeScores  out_st, out_dpt [128 keys][64 queries]   S^T = K Q^T, dP^T = V dO^T       re-check (a)
     kProbeDkDv    out_dv  [128 keys][128]  (bf(S^T) + bf(S^T - bf(S^T))) dO                  (n3)
                   out_dk  [128 keys][128]  (bf(dP^T) + bf(r1)) Q, r1 = dP^T - bf(dP^T)        (n3)
     kProbeDq      out_dq  [64 queries][128]  (bf(dP^T) + bf(r1) + bf(r1 - bf(r1)))^T K        (n1), (n2)
     kProbeDqLo    out_dq_lo: the same with only the bf(r1) tile non-zero                     (n1), (n2)
     kProbeDqLo2   out_dq_lo2: only the bf(r1 - bf(r1)) tile non-zero                          (n1), (n2)
   FP32, row-major. */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeDq = 2, kProbeDqLo = 3, kProbeDqLo2 = 4 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq, *dq_lo, *dq_lo2;
};
/* The probe's split products (parts kProbeDkDv .. kProbeDqLo2) from its S^T (as P) and dP^T (as dS). */
template <int kPart>
__device__ __forceinline__ void fp32keys128_probe_products(const float (&st)[32], const float (&dpt)[32], bf16* ds_tiles,
                                                           uint32_t k_dq_addr, uint32_t q_addr, uint32_t do_addr,
                                                           const ProbeOut& out, int key_col, int warp_in_wg, int g,
                                                           int t) {
    uint32_t pa[kQSteps][4], pa_lo[kQSteps][4], pds[kQSteps][4], pds_lo[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        uint32_t unused[4], x2[4];
        pack_split_step<false>(pa[kk], pa_lo[kk], unused, st, kk);
        pack_split_step<true>(pds[kk], pds_lo[kk], x2, dpt, kk);
        uint32_t w0[4], w1[4], w2[4]; /* the part's tiles: its terms, zeros elsewhere */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w0[i] = (kPart == kProbeDq) ? pds[kk][i] : 0u;
            w1[i] = (kPart == kProbeDq || kPart == kProbeDqLo) ? pds_lo[kk][i] : 0u;
            w2[i] = (kPart == kProbeDqLo) ? 0u : x2[i];
        }
        stage_ds_words<kDsPitch>(ds_tiles, w0, kk, key_col, t);
        stage_ds_words<kDsPitch>(ds_tiles + kDsTileElems, w1, kk, key_col, t);
        stage_ds_words<kDsPitch>(ds_tiles + 2 * kDsTileElems, w2, kk, key_col, t);
    }
    if constexpr (kPart == kProbeDkDv) {
        float acc[kHS / 2];
        probe_rs_batches(acc, pa, pa_lo, do_addr);
        store_acc_rows(out.dv, acc, key_col, t);
        probe_rs_batches(acc, pds, pds_lo, q_addr);
        store_acc_rows(out.dk, acc, key_col, t);
    } else {
        consumers_sync(); /* both warpgroups' halves of the tiles written */
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(dq);
        warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);
        float* o = (kPart == kProbeDq) ? out.dq : (kPart == kProbeDqLo) ? out.dq_lo : out.dq_lo2;
        store_acc_rows(o, dq, warp_in_wg * 16 + g, t, (key_col / kWarpgroupKeys) * kDqCols, kHS);
    }
}

template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    fp32keys128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                             int NH, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    __shared__ int cta_abort;
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs);
    float st[32], dpt[32];
    const Keys128ProbeThread th = keys128_probe_scores<Plan>(st, dpt, smem, &qkv_map, &dout_map, NH, head, &cta_abort);
    if constexpr (kPart == kProbeScores) {
        store_fragment_rows(out.st, out.dpt, st, dpt, th.key_col, 0, kBlockQ, th.t);
    } else {
        fp32keys128_probe_products<kPart>(st, dpt, ds_tiles, th.k_dq_addr, th.q_addr, th.do_addr, out, th.key_col,
                                          th.warp_in_wg, th.g, th.t);
    }
}

constexpr const char* kWho = "attention (Hopper fp32 key-major pass, HS 128)";

}  // namespace

void attention_hopper_fp32_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                const __nv_bfloat16* dout, float* tiles) {
    probe_require_shape("attention_hopper_fp32_keys128_layout_probe", s, head, ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS,
                        s.HS == kHS, "128");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_kv = (size_t)kBlockK * kHS, n_q = (size_t)kBlockQ * kHS;
    ProbeTileCursor out{tiles};
    const ProbeOut o{out.take(n_st), out.take(n_st), out.take(n_kv), out.take(n_kv),
                     out.take(n_q),  out.take(n_q),  out.take(n_q)};
    for (auto kernel : {fp32keys128_probe_kernel<kProbeScores>, fp32keys128_probe_kernel<kProbeDkDv>,
                        fp32keys128_probe_kernel<kProbeDq>, fp32keys128_probe_kernel<kProbeDqLo>,
                        fp32keys128_probe_kernel<kProbeDqLo2>})
        probe_launch(kernel, kConsumerThreads, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, o);
}

void attention_hopper_probe_keys128_fp32_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
