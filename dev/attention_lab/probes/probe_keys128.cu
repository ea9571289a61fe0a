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
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace {

using SmemPlan = Keys128Mode<ATTN_BF16>::Plan; /* the shared-memory plan of the kernel this probes */

/* The probe's outputs of two accumulators over this thread's key rows: [keys][N] FP32, row-major; element
   4j + 2r + e is row key_col + 8r, column 8j + 2t + e (hopper_wgmma.cuh's fragment layout). */
template <int REGS>
__device__ __forceinline__ void store_key_rows(float* out0, float* out1, const float (&acc0)[REGS],
                                               const float (&acc1)[REGS], int key_col, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                out0[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc0[4 * j + 2 * r + e];
                out1[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc1[4 * j + 2 * r + e];
            }
}

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
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsBytes); /* buffer 1 */
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
    float st[32], dpt[32];
    keymajor128_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes,
                       smem_u32(q_t), smem_u32(do_t));
    store_key_rows(out_st, out_dpt, st, dpt, key_col, t);
    uint32_t pa[4][4], pds[4][4];
    pack_acc_a_operand(pa, st);
    pack_acc_a_operand(pds, dpt);
    stage_ds(ds_s, pds, key_col, t);
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
    keymajor128_rs_issue(dv, pa, smem_u32(do_t));
    keymajor128_rs_issue(dk, pds, smem_u32(q_t));
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
    warpgroup_dq_issue(dq, adq, smem_u32(k_s) + wg * Plan::kKeyChunkBytes);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(adq);
    store_key_rows(out_dv, out_dk, dv, dk, key_col, t);
#pragma unroll
    for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                out_dq[(warp_in_wg * 16 + g + 8 * r) * kHS + wg * kDqCols + 8 * n + 2 * t + e] = dq[4 * n + 2 * r + e];
}

constexpr const char* kWho = "attention (Hopper backward, HS 128)";

}  // namespace

void attention_hopper_bwd128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_BWD128_PROBE_KEYS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_bwd128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d T=%d "
            "HS=%d head %d)", ATTN_HOPPER_BWD128_PROBE_KEYS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    static_assert(ATTN_HOPPER_BWD128_PROBE_KEYS == kBlockK && ATTN_HOPPER_BWD128_PROBE_QUERIES == kBlockQ,
                  "the probe covers one CTA's keys and one query tile");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_dkv = (size_t)kBlockK * kHS;
    float* o_st = tiles;
    float* o_dpt = o_st + n_st;
    float* o_dv = o_dpt + n_st;
    float* o_dk = o_dv + n_dkv;
    float* o_dq = o_dk + n_dkv;
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, o_st, o_dpt, o_dv,
                                                                   o_dk, o_dq);
    cudaCheckLastError();
}

void attention_hopper_probe_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}
