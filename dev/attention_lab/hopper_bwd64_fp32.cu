/*
 * dev/attention_lab/hopper_bwd64_fp32.cu - lab of fp32 mode's key-major backward pass at head size 64 on Hopper
 * (sm_90a: wgmma + TMA): dK, dV and the dQ partials, in the place that attn_bwd_kernel<64, ATTN_FP32>
 * (attention/attention_cuda.cu, the portable mma.sync kernel) still holds on sm_90 after the Hopper row pass.
 * Its own kernel and layout probe (nothing of it is in the library yet), checked against the production fp32
 * backward on force_portable's path, and timed.
 *
 * Why: every other backward pass runs on Hopper kernels on sm_90; fp32 at HS 64 costs 1.77 / 1.97x bf16 at the
 * HS-64 shapes and +12% per 450m training step (dev/results/device_s5/README.md). The HS-128 twin
 * (attention/attention_hopper_bwd128_fp32.cu) made fp32's HS-128 backward 1.56-1.78x faster.
 *
 * What it computes: exactly the numerics of attn_bwd_kernel<64, ATTN_FP32> and of the HS-128 Hopper kernel
 * (docs/ATTENTION_NUMERICS.md "fp32"; only FP32 summation orders differ):
 *   S^T = K_w Q^T, dP^T = V_w dO^T (FP32), P = exp2((S - m) c) * fl(1/l), dS = P (dP - D), masked entries 0;
 *   dV += bf(P)^T dO + bf(P - bf(P))^T dO               (two RS n64 batches chained into one accumulator)
 *   dK += bf(dS)^T Q + bf(r1)^T Q, r1 = dS - bf(dS)      (the same chaining)
 *   dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K_w    (three staged terms, one FP32 accumulator)
 *   dK = bf(s acc), dV = bf(acc) into dqkv; the s-less dQ partial goes to the workspace's FP32 accumulator by
 *   TMA reduce-add; the post-pass (production's attn_bwd_dq_kernel; here the lab's copy of its expression)
 *   writes dQ = bf(s acc). Workspace contract = attn_bwd_kernel's: dq_acc zeroed, D from the row pass.
 *
 * Layout: attention/attention_hopper_bwd.cu's HS-64 CTA (288 threads: two consumer warpgroups of 64 keys and a
 * producer warp; no setmaxnreg; 2 Q/dO stages; longest key tiles first, tile_order.cuh), reusing
 * hopper_wgmma.cuh's 64 x 64 steps and hopper_bwd_common.cuh's producer steps, row state and epilogue. Per
 * step and consumer warpgroup:
 *   S^T, dP^T                   warpgroup_two_ss_64x64                                   32 + 32 regs
 *   P, dS one k-step (16 queries) at a time -> A words bf(P), bf(P - bf(P)), bf(dS), bf(r1) (16 registers per
 *     k-step) and bf(dS), bf(r1), bf(r1 - bf(r1)) stored to the warpgroup's three private tiles [query][key]
 *     (their previous reads are behind the previous step's last warpgroup barrier)
 *   dV, dK: one batch of 16 m64n64k16 RS (warpgroup_rs_issue_n64, two chained per accumulator):
 *     64 accumulator + 64 A registers in flight
 *   (warpgroup barrier: the three tiles written; this parity's dQ tile read by its last reduce-add)
 *   dQ: three commit groups of 4 RS wgmmas (one per term) into one 32-register accumulator, A loaded from the
 *     tiles into two alternating register sets of 16 (wait<1> before the first set is reloaded)
 *   the partial into the warpgroup's swizzled FP32 dQ tile (step parity) and two TMA reduce-adds
 *   (attention_hopper_bwd.cu's flush, unchanged)
 * Shared memory: K, V 16 KB each, Q, dO 2 stages x 8 KB, three dS tiles [64][72] BF16 per warpgroup (54 KB),
 * row state 2 KB, barriers, four 16 KB FP32 dQ tiles: SmemPlan::kAlloc = 190464 bytes (<= 227 KB, asserted).
 * Registers (`make hopper_bwd64_fp32-regs`, ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math): fp32keys64_kernel
 * 168 (what a 288-thread CTA gets: warps are allotted registers in groups of 4), 0 bytes spill, no C75xx
 * warning; the probe kernels 90 (scores, dQ parts) / 157 (dK + dV), 0 spill. With all three dQ terms' A
 * fragments live at once (48 registers, one batch of 12 wgmmas) ptxas serialised the wgmmas (C7512) and
 * spilled 16 bytes: hence the two alternating sets.
 *
 * Hangs: every mbarrier wait is bounded (~2 s of clock64) and traps (no setmaxnreg here, so a trap is
 * allowed), naming the barrier in the lab's host-mapped record (g_lab_hang, installed into this file's
 * g_fp32keys64_hang); the child then reports a named FAIL.
 *
 * Checks (in order; the probe, the cases and the benchmark shapes each in a child process of their own):
 *   1. layout probe (one warpgroup at warpgroup 1's offsets, stage 1, B1 NH3 T50, head 1, keys 50..63 zero
 *      filled), P := S^T and dS := dP^T split and staged through the kernel's own helpers: S^T, dP^T (proven
 *      forms, re-checked); NEW forms: dV and dK as two chained RS n64 batches of split terms; the three dS terms
 *      staged from packed words at pitch 72 (stage_term_step) and the three dQ groups over them (alternating
 *      A register sets); dQ's second
 *      and third terms alone (2^-8 / 2^-16 of the first: invisible next to it);
 *   2. per case: forward, attention_backward_cuda(fp32, force_portable) = the reference; then
 *      (a) this pass alone on the reference's D into a zeroed accumulator and an all-NaN dqkv, then the lab's
 *          post-pass: dQ, dK, dV within 4 BF16 ulps of the reference;
 *      (b) the composed fp32 backward (accumulator zeroed by cudaMemsetAsync - fp32's prep only zeroes it, D
 *          comes from the row pass -, attention_backward_hopper_rows, this pass, the lab's post-pass) on
 *          poisoned buffers: all three slots within 4 ulps of the reference, every element finite;
 *   3. at B8 H16 T1024 and B4 H16 T2048: medians of 21 timings (warm inputs, queued behind a spin) of this pass
 *      alone, the composed fp32 backward, the default fp32 backward (row pass + the portable key-major kernel)
 *      and the default bf16 backward.
 * Tolerance (the Hopper labs' value, fixed before any run): only FP32 sum orders differ, and a changed FP32 S or
 * dP can flip one BF16 rounding of a split term.
 *
 * Usage: hopper_bwd64_fp32   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed".
 * Not done: never run (written without a GPU); production form (attention_backward_cuda dispatch).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/attention_hopper_bwd.cuh"
#include "attention/hopper_wgmma.cuh"
#include "attention/hopper_bwd_common.cuh"
#include "attention/tile_order.cuh"
#include "attention/attn_cases.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

namespace fp32keys64 {
using namespace hopper_wgmma;

constexpr int kHS = 64;                 /* the head size of this kernel */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 32; /* + one producer warp */
constexpr int kStages = 2;
constexpr int kBoxRows = 64;
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kDsPitch = kBlockQ + 8;   /* BF16 per row of a staged dS term [query][key]: +8 against bank conflicts */
constexpr int kDsTerms = 3;             /* bf(dS), bf(r1), bf(r1 - bf(r1)) */
constexpr int kProbeT = 50;             /* the probe's tokens (< 64: the TMA zero fill shows) */
static_assert(kWarpgroupKeys == kBlockQ && kTileKSteps == kBlockQ / 16, "S^T per warpgroup is 64 x 64: 4 k-steps");

struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;    /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kSwizzleRowBytes; /* 16 KB */
    static constexpr int kQTileBytes = kBlockQ * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;
    static constexpr int kDO = kQ + kStages * kQTileBytes;
    static constexpr int kDs = kDO + kStages * kQTileBytes; /* per warpgroup kDsTerms tiles [64 query][kDsPitch] */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kDsWarpgroupBytes = kDsTerms * kDsBytes;
    static constexpr int kRowState = kDs + kConsumerWarpgroups * kDsWarpgroupBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages;
    static constexpr int kDqTileBytes = kBlockQ * kHS * 4; /* per warpgroup 2 (step parity) */
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kBytes = kDqTile + kConsumerWarpgroups * 2 * kDqTileBytes;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes;
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state, 4-byte A loads");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};
static_assert(SmemPlan::kKeyTileBytes == KeymajorTiles<1>::kKeyTileBytes &&
                  SmemPlan::kQTileBytes == KeymajorTiles<1>::kQTileBytes &&
                  SmemPlan::kBoxBytes == KeymajorTiles<1>::kBoxBytes && kBlockK == KeymajorTiles<1>::kBlockK &&
                  kBlockQ == KeymajorTiles<1>::kBlockQ,
              "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");
constexpr int kDsTileElems = SmemPlan::kDsBytes / 2;

/* bounded mbarrier wait that traps (no setmaxnreg here), naming the barrier in the lab's mapped record */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz; a legitimate wait is microseconds */
__device__ AttnHopperHang* g_fp32keys64_hang;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index) {
    const uint32_t addr = smem_u32(bar);
    uint32_t done = 0;
    const long long start = clock64();
    while (!done) {
        done = mbar_try_wait(addr, parity);
        if (!done && clock64() - start > kHangCycles) {
            volatile AttnHopperHang* rec = g_fp32keys64_hang;
            if (rec != NULL) {
                rec->index = index;
                rec->parity = (int)parity;
                rec->block_x = (int)blockIdx.x;
                rec->block_y = (int)blockIdx.y;
                rec->thread = (int)threadIdx.x;
                __threadfence_system();
                rec->site = site;
                __threadfence_system();
            }
            __trap();
        }
    }
}

/* (the fp32 split of one k-step, pack_split_step: hopper_bwd_common.cuh) */

/* One k-step's packed words to a warpgroup's staged tile [query][key] (pitch kDsPitch): word w[i] holds key
   key_row + 8 (i & 1) and queries q, q + 1, q = 16kk + 8 (i >> 1) + 2t (low half: q) - the placement of
   hopper_wgmma.cuh's stage_tile_transposed, from words instead of FP32 values. */
__device__ __forceinline__ void stage_term_step(bf16* tile, const uint32_t (&w)[4], int kk, int key_row, int t) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int key = key_row + 8 * (i & 1);
        const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
        tile[q * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w[i] & 0xFFFFu));
        tile[(q + 1) * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w[i] >> 16));
    }
}

/* dV += [bf(P), bf(P - bf(P))]^T dO, dK += [bf(dS), bf(r1)]^T Q: 16 m64n64k16 RS, one commit group (issued and
   committed only; the caller waits). */
__device__ __forceinline__ void issue_dkv_split_batch(float (&dv)[32], float (&dk)[32], uint32_t (&pa)[kTileKSteps][4],
                                                      uint32_t (&pa_lo)[kTileKSteps][4],
                                                      uint32_t (&pds)[kTileKSteps][4],
                                                      uint32_t (&pds_lo)[kTileKSteps][4], uint32_t q_addr,
                                                      uint32_t do_addr) {
    reg_fence(pa);
    reg_fence(pa_lo);
    reg_fence(pds);
    reg_fence(pds_lo);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    warpgroup_rs_issue_n64(dv, pa, do_addr);
    warpgroup_rs_issue_n64(dv, pa_lo, do_addr);
    warpgroup_rs_issue_n64(dk, pds, q_addr);
    warpgroup_rs_issue_n64(dk, pds_lo, q_addr);
    wgmma_commit();
}

/* dq += sum over the three staged terms of A[64 q x 64 keys] K_w[64 keys x 64 dims] (K_w N-major:
   hopper_wgmma.cuh's warpgroup_rs_issue_n64): three commit groups of 4 RS wgmmas into one accumulator, A loaded
   from each tile into two alternating register sets (the third term reuses the first set after wait<1> says its
   group completed: 32 A registers in flight, not 48 - with all three sets live ptxas serialised the wgmmas,
   C7512, at the 168 registers a 288-thread CTA gets). Returns with everything waited for. The caller zeroed dq
   and made the tiles visible (warpgroup barrier). */
__device__ __forceinline__ void warpgroup_dq_three_terms(float (&dq)[32], const bf16* tiles, uint32_t k_addr,
                                                         int warp_in_wg, int g, int t) {
    uint32_t a0[kTileKSteps][4], a1[kTileKSteps][4];
    reg_fence(dq);
#pragma unroll
    for (int term = 0; term < kDsTerms; term++) {
        uint32_t (&a)[kTileKSteps][4] = (term & 1) ? a1 : a0;
        if (term >= 2) { /* the group that read this set (term - 2) is the older of the two in flight */
            wgmma_wait<1>();
            reg_fence(a);
        }
        load_staged_a_operand<kDsPitch>(a, tiles + term * kDsTileElems, warp_in_wg, g, t);
        reg_fence(a);
        wgmma_fence();
        warpgroup_rs_issue_n64(dq, a, k_addr);
        wgmma_commit();
    }
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(a0);
    reg_fence(a1);
}

/* fp32's key-major pass at HS 64 (the file comment). stats {m, l} per row, D [B*NH*T] from the workspace; writes
   the k and v slots of dqkv and adds the s-less dQ partials to dq_acc (through dq_map). */
__global__ void __launch_bounds__(kThreads, 1)
    fp32keys64_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                      const __grid_constant__ CUtensorMap dq_map, const float* __restrict__ stats,
                      const float* __restrict__ D, bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = kv_full + 1;
    uint64_t* empty = full + kStages;

    const AttnTileOrder order = attn_tile_longest_first();
    const int k0 = order.rank * kBlockK;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int qt_begin = k0 / kBlockQ;
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads);
    __syncthreads();

    if (warp == kConsumerThreads / 32) {
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 2 queries ---- */
        if (lane == 0) keymajor_load_kv<1>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), ATTN_HANG_EMPTY, s);
            /* fp32: {m, fl(1/l), D} (the repair arm of the row state; fp32's stats are {m, l}) */
            keymajor_stage_row_state<ATTN_FP32, kKeymajorNoLambda>(row_state + s * kBlockQ, nullptr, stats, D, nullptr,
                                                                   bh, T, q0, lane);
            keymajor_fill_stage<1>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map,
                                   &full[s], q0, h, NH, b, lane);
        }
        return;
    }

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warp / 4, warp_in_wg = warp % 4, g = lane >> 2, t = lane & 3;
    const int tid_in_wg = threadIdx.x & 127;
    const int key_row = warp_in_wg * 16 + g; /* within the warpgroup's 64 keys */
    const int key0 = k0 + wg * kWarpgroupKeys + key_row;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs + wg * Plan::kDsWarpgroupBytes);
    const uint32_t k_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, v_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0);
    __syncwarp();

#pragma unroll 1
    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        float st[32], dpt[32];
        warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);

        /* P, dS (attn_bwd_kernel's expressions, masked entries exactly 0), their four A words and the three
           staged dS terms one k-step at a time. The previous step's reads of the staged tiles (its dQ A loads)
           are all behind its last warpgroup barrier. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kTileKSteps][4], pa_lo[kTileKSteps][4], pds[kTileKSteps][4], pds_lo[kTileKSteps][4];
#pragma unroll
        for (int kk = 0; kk < kTileKSteps; kk++) {
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 2 * kk + jj;
                    const int query = q0 + 8 * j + 2 * t + e;
                    const float4 row = rs[8 * j + 2 * t + e];
                    keymajor_probs_column<ATTN_FP32>(st, dpt, row, j, e, query, key0, T, masked, c);
                }
            uint32_t unused[4], x2[4];
            pack_split_step<false>(pa[kk], pa_lo[kk], unused, st, kk);
            pack_split_step<true>(pds[kk], pds_lo[kk], x2, dpt, kk);
            stage_term_step(ds_tiles, pds[kk], kk, key_row, t);
            stage_term_step(ds_tiles + kDsTileElems, pds_lo[kk], kk, key_row, t);
            stage_term_step(ds_tiles + 2 * kDsTileElems, x2, kk, key_row, t);
        }
        issue_dkv_split_batch(dv, dk, pa, pa_lo, pds, pds_lo, q_addr, do_addr);
        /* this step's dQ tile (parity i) was last sent at step i - 2: its reduce-add must have read it before
           the barrier below lets the warpgroup rewrite it */
        if (tid_in_wg == 0) bulk_wait_group_read<1>();
        warpgroup_sync(wg); /* the warpgroup's three staged tiles are written */
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(pds);
        reg_fence(pds_lo);

        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        warpgroup_dq_three_terms(dq, ds_tiles, k_addr, warp_in_wg, g, t);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

        /* attention_hopper_bwd.cu's flush: the partial into the warpgroup's swizzled tile of this parity, then
           one thread adds it to the accumulator with two TMA reduce-adds (rows past T are outside the map) */
        unsigned char* dq_tile = smem + Plan::kDqTile + (wg * 2 + (i & 1)) * Plan::kDqTileBytes;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = warp_in_wg * 16 + g + 8 * r;
#pragma unroll
            for (int n = 0; n < kHS / 8; n++) {
                const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
                *reinterpret_cast<float2*>(dq_tile + (n >> 2) * (kBlockQ * kSwizzleRowBytes) + row * kSwizzleRowBytes +
                                           chunk * 16 + (t & 1) * 8) = make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
            }
        }
        fence_proxy_async();
        warpgroup_sync(wg); /* also: every A load of the staged tiles is done before the next step restages */
        if (tid_in_wg == 0) {
            tma_reduce_add_3d(&dq_map, dq_tile, 0, q0, bh);
            tma_reduce_add_3d(&dq_map, dq_tile + kBlockQ * kSwizzleRowBytes, 32, q0, bh);
            bulk_commit_group();
        }
    }
    if (tid_in_wg == 0) bulk_wait_group<0>();
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, /*gave_up=*/false);
}

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
__device__ __forceinline__ void probe_write(float* dst, const float (&acc)[32], int warp, int g, int t) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) dst[(warp * 16 + g + 8 * r) * 64 + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
}
template <int kPart>
__global__ void __launch_bounds__(128, 1)
    fp32keys64_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                            int NH, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    unsigned char* k_half = smem + Plan::kK + Plan::kBoxBytes;
    unsigned char* v_half = smem + Plan::kV + Plan::kBoxBytes;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes;
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsWarpgroupBytes); /* warpgroup 1's */
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 4 * Plan::kBoxBytes);
        tma_load_4d(k_half, &qkv_map, bar, 0, kKeymajorSlotK * NH + head, 0, 0);
        tma_load_4d(v_half, &qkv_map, bar, 0, kKeymajorSlotV * NH + head, 0, 0);
        tma_load_4d(q_t, &qkv_map, bar, 0, kKeymajorSlotQ * NH + head, 0, 0);
        tma_load_4d(do_t, &dout_map, bar, 0, head, 0, 0);
    }
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int key_row = warp * 16 + g;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    const uint32_t k_addr = smem_u32(k_half), v_addr = smem_u32(v_half);
    float st[32], dpt[32];
    warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);
    if constexpr (kPart == kProbeScores) {
        probe_write(out.st, st, warp, g, t);
        probe_write(out.dpt, dpt, warp, g, t);
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
            stage_term_step(ds_tiles, w0, kk, key_row, t);
            stage_term_step(ds_tiles + kDsTileElems, w1, kk, key_row, t);
            stage_term_step(ds_tiles + 2 * kDsTileElems, w2, kk, key_row, t);
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
            probe_write(out.dv, dv, warp, g, t);
            probe_write(out.dk, dk, warp, g, t);
        } else {
            warpgroup_sync(0); /* the three tiles written */
            float dq[32];
#pragma unroll
            for (int k = 0; k < 32; k++) dq[k] = 0.f;
            warpgroup_dq_three_terms(dq, ds_tiles, k_addr, warp, g, t);
            probe_write(kPart == kProbeDq ? out.dq : kPart == kProbeDqLo ? out.dq_lo : out.dq_lo2, dq, warp, g, t);
        }
    }
}

/* ---- host: maps, launch, probe ---- */

constexpr const char* kWho = "hopper_bwd64_fp32 lab (fp32 key-major pass, HS 64)";

void watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_fp32keys64_hang, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

/* the pass (asynchronous on `stream`); the caller zeroed dq_acc (or wants the partials added) */
void launch_pass(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, const float* D, float* dq_acc,
                 bf16* dqkv, cudaStream_t stream) {
    if (s.HS != kHS || s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535 || ((uintptr_t)qkv % 16) != 0 ||
        ((uintptr_t)dout % 16) != 0)
        die("%s: unsupported call (B=%d NH=%d T=%d HS=%d)\n  hint: HS 64, B*NH <= 65535, 16-byte aligned qkv and dout",
            kWho, s.B, s.NH, s.T, s.HS);
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho);
    cudaCheck(cudaFuncSetAttribute(fp32keys64_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    fp32keys64_kernel<<<grid, kThreads, SmemPlan::kAlloc, stream>>>(qkv_map, dout_map, dq_map, stats, D, dqkv, s.NH, s.T,
                                                                    attn_softmax_scale(kHS), attn_exp2_scale(kHS));
    cudaCheckLastError();
}

/* tiles: 7 arrays of 64 x 64 FP32 (st, dpt, dv, dk, dq, dq_lo, dq_lo2) */
void layout_probe(AttnShape s, int head, const bf16* qkv, const bf16* dout, float* tiles) {
    if (s.B != 1 || s.T > 64 || head < 0 || head >= s.NH || s.HS != kHS)
        die("%s: the probe needs B = 1, T <= 64, 0 <= head < NH, HS 64 (got B=%d NH=%d T=%d HS=%d head %d)", kWho, s.B,
            s.NH, s.T, s.HS, head);
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n = 64 * 64;
    ProbeOut o;
    o.st = tiles;
    o.dpt = o.st + n;
    o.dv = o.dpt + n;
    o.dk = o.dv + n;
    o.dq = o.dk + n;
    o.dq_lo = o.dq + n;
    o.dq_lo2 = o.dq_lo + n;
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<1, 128, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, o);
        cudaCheckLastError();
    };
    launch(fp32keys64_probe_kernel<kProbeScores>);
    launch(fp32keys64_probe_kernel<kProbeDkDv>);
    launch(fp32keys64_probe_kernel<kProbeDq>);
    launch(fp32keys64_probe_kernel<kProbeDqLo>);
    launch(fp32keys64_probe_kernel<kProbeDqLo2>);
}

}  // namespace fp32keys64

/* ------------------------------------------------------------------------------------------------ */
/* host: checks and timing                                                                           */
/* ------------------------------------------------------------------------------------------------ */

typedef __nv_bfloat16 bf16;
static const int kHS = fp32keys64::kHS;
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* dQ = bf(s * accumulator) into the q slot of dqkv: attention_cuda.cu's attn_bwd_dq_kernel expression (file-local
   there). */
__global__ void lab_dq_postpass(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T, float scale,
                                long long pairs) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const long long e = 2 * i;
    const int d = (int)(e % kHS);
    const long long row = e / kHS;
    const int tok = (int)(row % T);
    const long long bh = row / T, b = bh / NH, h = bh % NH;
    const float2 v = *reinterpret_cast<const float2*>(dq_acc + e);
    bf16* dst = dqkv + (b * T + tok) * 3LL * NH * kHS + h * kHS + d;
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v.x * scale, v.y * scale);
}

/* A synchronisation result plus the hang record: on either, one FAIL line naming the barrier (or the CUDA
   error), then the child reports and ends. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return;
    if (hung)
        CHECK(0, "HANG in %s: mbarrier %s never completed (index %d, parity %d, block (%d, %d), thread %d)", where,
              attn_hopper_hang_site_name(r->site), r->index, r->parity, r->block_x, r->block_y, r->thread);
    if (e != cudaSuccess)
        CHECK(0, "CUDA error after %s: %s (hint: run under compute-sanitizer)", where, cudaGetErrorString(e));
    lab_child_report_and_exit();
}

static const double kMaxUlps = 4.0; /* the file comment's tolerance, fixed before any run */
static const char* kSlotName[3] = {"dQ", "dK", "dV"};

static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs force_portable: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp\n", what,
           kSlotName[slot], d.max_abs, d.max_ulps, d.over_1ulp, d.count);
    CHECK(d.nan_ref == 0, "%s: the force_portable backward has every element finite (%zu NaN)", kSlotName[slot],
          d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left of the poison)", what, kSlotName[slot],
          d.nan_new);
    CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of force_portable (max %.2f)", what, kSlotName[slot],
          kMaxUlps, d.max_ulps);
}

/* The lab's pass on workspace `ws` (carve_workspace's slots: dq_acc [rows * HS], D [rows], lambda [rows]; the
   accumulator zeroed and D written by the caller) into dqkv `into`, then the lab's post-pass. */
static void pass_and_postpass(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, void* ws, bf16* into,
                              cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    float* dq_acc = (float*)ws;
    const float* D = dq_acc + rows * s.HS;
    fp32keys64::launch_pass(s, qkv, dout, stats, D, dq_acc, into, st);
    const long long pairs = (long long)rows * kHS / 2;
    lab_dq_postpass<<<(unsigned)ceil_div(pairs, 256), 256, 0, st>>>(dq_acc, into, s.NH, s.T, attn_softmax_scale(kHS),
                                                                    pairs);
    cudaCheckLastError();
}

/* (a): accumulator zeroed, D copied from `from_ws`, dqkv all NaN; then the pass and the post-pass */
static void pass_alone(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, const void* from_ws,
                       void* ws, bf16* into, cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    float* dq_acc = (float*)ws;
    cudaCheck(cudaMemsetAsync(dq_acc, 0, rows * s.HS * sizeof(float), st));
    cudaCheck(cudaMemcpyAsync(dq_acc + rows * s.HS, (const float*)from_ws + rows * s.HS, rows * sizeof(float),
                              cudaMemcpyDeviceToDevice, st));
    cudaCheck(cudaMemsetAsync(into, 0xFF, attn_qkv_count(s) * 2, st));
    pass_and_postpass(s, qkv, dout, stats, ws, into, st);
}

/* (b): the composed fp32 backward: fp32's prep only zeroes the accumulator (D is the row pass's), so a memset;
   the Hopper row pass (D); the lab's pass; the lab's post-pass */
static void composed_backward(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, void* ws,
                              bf16* dqkv, cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    float* dq_acc = (float*)ws;
    float* D = dq_acc + rows * s.HS;
    float* lambda = D + rows;
    cudaCheck(cudaMemsetAsync(dq_acc, 0, rows * s.HS * sizeof(float), st));
    attention_backward_hopper_rows(ATTN_FP32, s, qkv, dout, stats, D, lambda, dqkv, st);
    pass_and_postpass(s, qkv, dout, stats, ws, dqkv, st);
}

struct CheckCase {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

static void check_case(CheckCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_FP32;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: fp32 key-major pass at HS 64 (lab kernel)",
             s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; carve_workspace's layout, which"
          " this lab reads)", ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_def, *dqkv_pass;
    float* stats;
    void *ws_ref, *ws_def, *ws_pass;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_def, nqkv * 2);
    lab_alloc_poisoned(&dqkv_pass, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_def, ws_bytes);
    lab_alloc_poisoned(&ws_pass, ws_bytes);
    AttnOptions opt = {0}, portable = {0};
    portable.force_portable = 1;
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    CHECK(attention_hopper_rows_supports(mode, s, qkv, dout), "the Hopper row pass serves fp32 at this shape (the"
          " composed backward's D)");

    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, st);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable backward");
    pass_alone(s, qkv, dout, stats, ws_ref, ws_pass, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "(a) the lab's pass on the reference's D + the lab's post-pass");
    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_pass, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, "(a) the pass on the reference's D:");
    composed_backward(s, qkv, dout, stats, ws_def, dqkv_def, st);
    sync_or_report(cudaStreamSynchronize(st), "(b) the composed fp32 backward (memset, Hopper row pass, lab pass,"
                   " post-pass)");
    cudaCheck(cudaMemcpy(h_new, dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, "(b) the composed backward:");

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t ev[kReps + 1];
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventCreate(&ev[r]));
        bf16 *out_b, *dqkv_b;
        float* stats_b;
        void* ws_b;
        cudaCheck(cudaMalloc(&out_b, nout * 2));
        cudaCheck(cudaMalloc(&dqkv_b, nqkv * 2));
        cudaCheck(cudaMalloc(&stats_b, nstats * 4));
        cudaCheck(cudaMalloc(&ws_b, attention_cuda_workspace_bytes(s, ATTN_BF16)));
        attention_forward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, NULL, st);
        float* dq_acc_pass = (float*)ws_pass;
        const float* D_pass = dq_acc_pass + rows * s.HS;
        auto run_default = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        auto run_composed = [&]() { composed_backward(s, qkv, dout, stats, ws_def, dqkv_def, st); };
        auto run_bf16 = [&]() { attention_backward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, dout, dqkv_b, ws_b, st); };
        /* alone: keeps adding into ws_pass's accumulator (its values do not matter any more) */
        auto run_pass = [&]() { fp32keys64::launch_pass(s, qkv, dout, stats, D_pass, dq_acc_pass, dqkv_pass, st); };
        auto time_of = [&](auto fn, const char* what) {
            float t[kReps];
            for (int i = 0; i < kWarmup; i++) fn();
            sync_or_report(cudaStreamSynchronize(st), what);
            spin_for_ns<<<1, 1, 0, st>>>(2000000ull + 100000ull * kReps);
            cudaCheckLastError();
            cudaCheck(cudaEventRecord(ev[0], st));
            for (int i = 0; i < kReps; i++) {
                fn();
                cudaCheck(cudaEventRecord(ev[i + 1], st));
            }
            sync_or_report(cudaStreamSynchronize(st), what);
            for (int i = 0; i < kReps; i++) cudaCheck(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
            return median_ms(t, kReps);
        };
        const float ms_pass = time_of(run_pass, "timing the lab's pass alone");
        const float ms_default = time_of(run_default, "timing the default fp32 backward");
        const float ms_composed = time_of(run_composed, "timing the composed fp32 backward");
        const float ms_bf16 = time_of(run_bf16, "timing the default bf16 backward");
        /* 9 causal BF16 GEMMs: S^T, dP^T (1 each), dV, dK (2 each: the split), dQ (3) */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d, warm inputs, queued behind a spin): the lab's pass alone %.4f ms (%.1f TFLOP/s"
               " counting its 9 BF16 GEMMs, causal)\n", (int)kReps, ms_pass, 9.0 * gemm / ms_pass * 1e-9);
        printf("  time: fp32 backward: default (path %s: row pass + portable key-major kernel) %.4f ms, composed"
               " (memset + Hopper row pass + the lab's pass + the lab's post-pass) %.4f ms = %.2fx faster\n",
               attn_bwd_path_name(attention_backward_cuda_path(mode, opt, s, qkv, dout)), ms_default, ms_composed,
               ms_default / ms_composed);
        printf("  time: bf16 default backward %.4f ms -> fp32/bf16 backward: default %.2fx, composed %.2fx\n", ms_bf16,
               ms_default / ms_bf16, ms_composed / ms_bf16);
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventDestroy(ev[r]));
        cudaCheck(cudaFree(out_b)); cudaCheck(cudaFree(dqkv_b)); cudaCheck(cudaFree(stats_b)); cudaCheck(cudaFree(ws_b));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_def)); cudaCheck(cudaFree(dqkv_pass));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_def)); cudaCheck(cudaFree(ws_pass));
}

/* The layout probe on B1 NH3 T50 HS64 (head 1; tokens 50..63 zero-filled) against double loops on the kernel's
   own S^T and dP^T, split as the kernel splits them. */
static void layout_probe(void) {
    test_section("layout probe HS64 fp32: S^T, dP^T (proven); NEW: dV, dK as two chained RS n64 batches of split"
                 " terms; three dS terms staged from words (pitch 72) and three dQ groups over them; its 2nd, 3rd"
                 " terms alone");
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, fp32keys64::kProbeT, kHS}, 1);
    const int n = 64;
    const size_t tile = (size_t)n * n, total = 7 * tile;
    float* d_out;
    lab_alloc_poisoned(&d_out, total * 4);
    fp32keys64::layout_probe(in.s, in.head, in.qkv, in.dout, d_out);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    const float *g_st = h, *g_dpt = h + tile, *g_dv = h + 2 * tile, *g_dk = h + 3 * tile, *g_dq = h + 4 * tile;
    const float *g_dq_lo = h + 5 * tile, *g_dq_lo2 = h + 6 * tile;
    int bad[7];
    fp32_keymajor_probe_products(in, n, n, g_st, g_dpt, g_dv, g_dk, g_dq, g_dq_lo, g_dq_lo2, bad);
    CHECK(bad[0] == 0, "S^T = K Q^T through warpgroup_two_ss_64x64 (warpgroup 1's K half, stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T through warpgroup_two_ss_64x64 (the dout map)");
    CHECK(bad[2] == 0, "dV (NEW form): bf(P), bf(P - bf(P)) packed per k-step, two RS n64 batches chained (dO N-major)");
    CHECK(bad[3] == 0, "dK (NEW form): bf(dS), bf(r1) packed per k-step, two RS n64 batches chained (Q N-major)");
    CHECK(bad[4] == 0, "dQ (NEW form): three terms staged from words at pitch 72, three groups of 4 RS n64, one accumulator");
    CHECK(bad[5] == 0, "dQ's second term (its tile, its staging) alone");
    CHECK(bad[6] == 0, "dQ's third term (its tile, its staging) alone");
    free(h);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}

/* lab_watch_hangs installs the production kernels' record; this file's kernels get the same mapped record */
static void watch_hangs_here(void) {
    lab_watch_hangs();
    AttnHopperHang* dev = NULL;
    cudaCheck(cudaHostGetDevicePointer((void**)&dev, g_lab_hang, 0));
    fp32keys64::watch_hangs(dev);
}

static void run_child(int child) {
    attn_rng_init(&g_rng, 0x9E3779B97F4A7C15ull + (unsigned long long)child);
    require_sm90("hopper_bwd64_fp32");
    watch_hangs_here();
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st;
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1) {
        /* T = 1, T < 64, odd T, T not a multiple of the 128-key tile, B*NH up to 32, sharp softmax, key offsets */
        const CheckCase cases[] = {
            {{1, 1, 1, 64}, 1.f, 0.f},    {{1, 2, 50, 64}, 1.f, 0.f},   {{1, 1, 77, 64}, 1.f, 0.f},
            {{1, 2, 128, 64}, 1.f, 0.f},  {{1, 1, 129, 64}, 1.f, 0.f},  {{2, 3, 1001, 64}, 1.f, 0.f},
            {{4, 8, 257, 64}, 1.f, 0.f},
            {{1, 4, 500, 64}, 8.f, 0.f},   /* sharp softmax (q x8) */
            {{2, 4, 1000, 64}, 1.f, 20.f}, /* K += 20 u */
            {{1, 4, 777, 64}, 8.f, 20.f},  /* both, odd T */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    } else {
        const CheckCase bench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};
        for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    }
    cudaCheck(cudaStreamDestroy(st));
}

int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd64_fp32: the lab's Hopper fp32 key-major pass at HS 64 (dK, dV, dQ partials) vs the production"
           " fp32 backward (force_portable); the probe, the checks and the benchmark shapes each in its own process\n");
    static const char* kChildName[3] = {"the layout probe", "the checks", "the benchmark shapes and timings"};
    return lab_run_children("hopper_bwd64_fp32", 3, kChildName, run_child, 0);
}
