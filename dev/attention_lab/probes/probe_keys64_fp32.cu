/*
 * dev/attention_lab/probes/probe_keys64_fp32.cu - the layout probe of fp32's key-major pass at HS 64 (attention_hopper_bwd64_fp32.cu):
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
using SmemPlan = Keys64Mode<ATTN_FP32>::Plan;
constexpr int kBlockQ = SmemPlan::kBlockQ;

static_assert(ATTN_HOPPER_FP32_KEYS64_PROBE_TILE == kBlockQ && ATTN_HOPPER_FP32_KEYS64_PROBE_TILE == kWarpgroupKeys,
              "the probe covers one warpgroup's keys and one query tile");

/* Layout probe: one warpgroup (128 threads) at warpgroup 1's offsets (K, V tokens 0..63 in the tiles' second 8 KB
   half, its three staged tiles; Q and dO in stage 1), one step, no softmax: P := S^T, dS := dP^T, split and
   staged by the kernel's helpers. Outputs [64][64] FP32 row-major, by part:
     kProbeScores  st, dpt                    S^T = K Q^T, dP^T = V dO^T
     kProbeDkDv    dv = (bf(S^T) + bf(S^T - bf(S^T))) dO, dk = (bf(dP^T) + bf(r1)) Q  (keys x dims)
     kProbeDq      dq = (bf(dP^T) + bf(r1) + bf(r1 - bf(r1)))^T K                 (queries x dims)
     kProbeDqLo    only the bf(r1) tile non-zero;  kProbeDqLo2: only the bf(r1 - bf(r1)) tile */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeDq = 2, kProbeDqLo = 3, kProbeDqLo2 = 4 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq, *dq_lo, *dq_lo2;
};
template <int kPart>
__global__ void __launch_bounds__(128, 1)
    fp32keys64_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                            int NH, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    unsigned char* k_half = smem + Plan::kK + Plan::kBoxBytes;
    unsigned char* v_half = smem + Plan::kV + Plan::kBoxBytes;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes;
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsWarpgroupBytes); /* warpgroup 1's */
    __shared__ int cta_abort;
    probe_load_tiles(probe_one_box_tiles(q_t, k_half, v_half, do_t), &qkv_map, &dout_map, bar, NH, head,
                     4 * Plan::kBoxBytes, &cta_abort);
    keys64_wait<ATTN_FP32>(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int key_row = warp * 16 + g;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    const uint32_t k_addr = smem_u32(k_half), v_addr = smem_u32(v_half);
    float st[32], dpt[32];
    warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);
    if constexpr (kPart == kProbeScores) {
        store_acc_rows(out.st, st, key_row, t);
        store_acc_rows(out.dpt, dpt, key_row, t);
    } else {
        uint32_t pa[kTileKSteps][4], pa_lo[kTileKSteps][4], pds[kTileKSteps][4], pds_lo[kTileKSteps][4];
#pragma unroll
        for (int kk = 0; kk < kTileKSteps; kk++) {
            uint32_t unused[4], x2[4];
            pack_split_step<false>(pa[kk], pa_lo[kk], unused, st, kk);
            pack_split_step<true>(pds[kk], pds_lo[kk], x2, dpt, kk);
            uint32_t w0[4], w1[4], w2[4]; /* the part's terms, zeros elsewhere */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w0[i] = (kPart == kProbeDq) ? pds[kk][i] : 0u;
                w1[i] = (kPart == kProbeDq || kPart == kProbeDqLo) ? pds_lo[kk][i] : 0u;
                w2[i] = (kPart == kProbeDqLo) ? 0u : x2[i];
            }
            stage_ds_words<kDsPitch>(ds_tiles, w0, kk, key_row, t);
            stage_ds_words<kDsPitch>(ds_tiles + kDsTileElems, w1, kk, key_row, t);
            stage_ds_words<kDsPitch>(ds_tiles + 2 * kDsTileElems, w2, kk, key_row, t);
        }
        if constexpr (kPart == kProbeDkDv) {
            float dv[32], dk[32];
#pragma unroll
            for (int i = 0; i < 32; i++) dv[i] = dk[i] = 0.f;
            issue_dkv_split_batch(dv, dk, pa, pa_lo, pds, pds_lo, q_addr, do_addr);
            wgmma_wait<0>();
            reg_fence(dv);
            reg_fence(dk);
            reg_fence(pa);
            reg_fence(pa_lo);
            reg_fence(pds);
            reg_fence(pds_lo);
            store_acc_rows(out.dv, dv, key_row, t);
            store_acc_rows(out.dk, dk, key_row, t);
        } else {
            warpgroup_sync(0); /* the three tiles written */
            float dq[32];
#pragma unroll
            for (int k = 0; k < 32; k++) dq[k] = 0.f;
            warpgroup_dq_three_terms(dq, ds_tiles, k_addr, warp, g, t);
            store_acc_rows(kPart == kProbeDq ? out.dq : kPart == kProbeDqLo ? out.dq_lo : out.dq_lo2, dq, key_row, t);
        }
    }
}

constexpr const char* kWho = "attention (Hopper fp32 key-major pass, HS 64)";

}  // namespace

void attention_hopper_fp32_keys64_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                               const __nv_bfloat16* dout, float* tiles) {
    probe_require_shape("attention_hopper_fp32_keys64_layout_probe", s, head, ATTN_HOPPER_FP32_KEYS64_PROBE_TILE,
                        s.HS == kHS, "64");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n = (size_t)ATTN_HOPPER_FP32_KEYS64_PROBE_TILE * ATTN_HOPPER_FP32_KEYS64_PROBE_TILE;
    ProbeTileCursor out{tiles};
    const ProbeOut o{out.take(n), out.take(n), out.take(n), out.take(n), out.take(n), out.take(n), out.take(n)};
    for (auto kernel : {fp32keys64_probe_kernel<kProbeScores>, fp32keys64_probe_kernel<kProbeDkDv>,
                        fp32keys64_probe_kernel<kProbeDq>, fp32keys64_probe_kernel<kProbeDqLo>,
                        fp32keys64_probe_kernel<kProbeDqLo2>})
        probe_launch(kernel, 128, SmemPlan::kAlloc, qkv_map, dout_map, s.NH, head, o);
}

void attention_hopper_probe_keys64_fp32_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
