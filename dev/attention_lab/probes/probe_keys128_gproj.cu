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
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace {

using SmemPlan = Keys128Mode<ATTN_GPROJ>::Plan; /* the shared-memory plan of the kernel this probes */

static_assert(ATTN_HOPPER_GPROJ128_PROBE_KEYS == kBlockK && ATTN_HOPPER_GPROJ128_PROBE_QUERIES == kBlockQ,
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

/* The probe's RS products: acc = first B (+ second B if `second`), both register-A batches of
   keymajor128_rs_issue into the one accumulator, as the kernel chains dK's two batches. */
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
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    float* lam_row = reinterpret_cast<float*>(smem + Plan::kLambda) + kBlockQ; /* stage 1's lambda */
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    if (threadIdx.x < kBlockQ) lam_row[threadIdx.x] = lambda_in[threadIdx.x];
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
    uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        float lam[2][2];
        load_step_lambdas(lam, lam_row, kk, t);
        pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
    }
    if (kPart == kProbeScores) {
        store_key_rows(out_st, st, key_col, t);
        store_key_rows(out_dpt, dpt, key_col, t);
    } else if (kPart == kProbeDkDv) { /* one commit group per accumulator */
        float dk[kHS / 2];
        probe_rs_batches(dk, pds, plam, q_addr);
        store_key_rows(out_dk, dk, key_col, t);
        float dv[kHS / 2];
        probe_rs_batches(dv, pa, pa, do_addr, /*second=*/false);
        store_key_rows(out_dv, dv, key_col, t);
    } else {
        float corr[kHS / 2];
        probe_rs_batches(corr, plam, plam, q_addr, /*second=*/false);
        store_key_rows(out_corr, corr, key_col, t);
    }
}

constexpr const char* kWho = "attention (Hopper gproj key-major pass, HS 128)";

}  // namespace

void attention_hopper_gproj_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                 const __nv_bfloat16* dout, const float* lambda, float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_GPROJ128_PROBE_KEYS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_gproj_keys128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d "
            "NH=%d T=%d HS=%d head %d)", ATTN_HOPPER_GPROJ128_PROBE_KEYS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_kv = (size_t)kBlockK * kHS;
    float* o_st = tiles;
    float* o_dpt = o_st + n_st;
    float* o_dk = o_dpt + n_st;
    float* o_corr = o_dk + n_kv;
    float* o_dv = o_corr + n_kv;
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeScores>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeDkDv>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeCorr>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    gproj128_probe_kernel<kProbeScores><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda,
                                                                                  o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    gproj128_probe_kernel<kProbeDkDv><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda,
                                                                                o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    gproj128_probe_kernel<kProbeCorr><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda,
                                                                                o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
}

void attention_hopper_probe_keys128_gproj_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
