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
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace {

using SmemPlan = Keys128Mode<ATTN_FP32>::Plan; /* the shared-memory plan of the kernel this probes */

static_assert(ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS == kBlockK && ATTN_HOPPER_FP32_KEYS128_PROBE_QUERIES == kBlockQ,
              "the probe covers one CTA's keys and one query tile");

/* The probe's outputs of one accumulator over this thread's key rows: [keys][N] FP32, row-major; element
   4j + 2r + e is row key_col + 8r, column 8j + 2t + e (hopper_wgmma.cuh's fragment layout). */
template <int REGS>
__device__ __forceinline__ void store_key_rows(float* out, const float (&acc)[REGS], int key_col, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) out[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
}

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
        stage_ds_step(ds_tiles, w0, kk, key_col, t);
        stage_ds_step(ds_tiles + kDsTileElems, w1, kk, key_col, t);
        stage_ds_step(ds_tiles + 2 * kDsTileElems, w2, kk, key_col, t);
    }
    if constexpr (kPart == kProbeDkDv) {
        float acc[kHS / 2];
#pragma unroll
        for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(acc);
        wgmma_fence();
        keymajor128_rs_issue(acc, pa, do_addr);
        keymajor128_rs_issue(acc, pa_lo, do_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        store_key_rows(out.dv, acc, key_col, t);
#pragma unroll
        for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
        reg_fence(pds);
        reg_fence(pds_lo);
        reg_fence(acc);
        wgmma_fence();
        keymajor128_rs_issue(acc, pds, q_addr);
        keymajor128_rs_issue(acc, pds_lo, q_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        store_key_rows(out.dk, acc, key_col, t);
    } else {
        consumers_sync(); /* both warpgroups' halves of the tiles written */
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(dq);
        warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);
        float* o = (kPart == kProbeDq) ? out.dq : (kPart == kProbeDqLo) ? out.dq_lo : out.dq_lo2;
#pragma unroll
        for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    o[(warp_in_wg * 16 + g + 8 * r) * kHS + (key_col / kWarpgroupKeys) * kDqCols + 8 * n + 2 * t + e] =
                        dq[4 * n + 2 * r + e];
    }
}

template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    fp32keys128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                             int NH, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs);
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 2 * Plan::kKeyTileBytes + 2 * Plan::kQTileBytes);
        for (int ch = 0; ch < kChunks; ch++) {
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                const int dst = ch * Plan::kKeyChunkBytes + half * Plan::kBoxBytes;
                tma_load_4d(k_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotK * NH + head, half * kBoxRows, 0);
                tma_load_4d(v_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotV * NH + head, half * kBoxRows, 0);
            }
            tma_load_4d(q_t + ch * Plan::kQChunkBytes, &qkv_map, bar, ch * kChunkCols, kSlotQ * NH + head, 0, 0);
            tma_load_4d(do_t + ch * Plan::kQChunkBytes, &dout_map, bar, ch * kChunkCols, head, 0, 0);
        }
    }
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp / 4, warp_in_wg = warp % 4;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[32], dpt[32];
    keymajor128_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes, q_addr,
                       do_addr);
    if constexpr (kPart == kProbeScores) {
        store_key_rows(out.st, st, key_col, t);
        store_key_rows(out.dpt, dpt, key_col, t);
    } else {
        fp32keys128_probe_products<kPart>(st, dpt, ds_tiles, smem_u32(k_s) + wg * Plan::kKeyChunkBytes, q_addr, do_addr,
                                         out, key_col, warp_in_wg, g, t);
    }
}

constexpr const char* kWho = "attention (Hopper fp32 key-major pass, HS 128)";

}  // namespace

void attention_hopper_fp32_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                const __nv_bfloat16* dout, float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_fp32_keys128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d "
            "NH=%d T=%d HS=%d head %d)", ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_kv = (size_t)kBlockK * kHS, n_q = (size_t)kBlockQ * kHS;
    ProbeOut o;
    o.st = tiles;
    o.dpt = o.st + n_st;
    o.dv = o.dpt + n_st;
    o.dk = o.dv + n_kv;
    o.dq = o.dk + n_kv;
    o.dq_lo = o.dq + n_q;
    o.dq_lo2 = o.dq_lo + n_q;
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, o);
        cudaCheckLastError();
    };
    launch(fp32keys128_probe_kernel<kProbeScores>);
    launch(fp32keys128_probe_kernel<kProbeDkDv>);
    launch(fp32keys128_probe_kernel<kProbeDq>);
    launch(fp32keys128_probe_kernel<kProbeDqLo>);
    launch(fp32keys128_probe_kernel<kProbeDqLo2>);
}

void attention_hopper_probe_keys128_fp32_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
