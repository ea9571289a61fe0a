/*
 * attention/cuda/hopper/attention_hopper_bwd64_fp32.cu - the Hopper (sm_90a) key-major pass of fp32 mode's backward at
 * head size 64 (dK, dV and the dQ partials) on wgmma + TMA: a 288-thread CTA (two consumer warpgroups, one
 * producer warp, no setmaxnreg, 64-query steps) with fp32's split terms. Also the entry points of
 * fp32's Hopper key-major pass for both head sizes (HS 128: attention_hopper_bwd128_fp32.cu). The API and which
 * calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (the fp32 section at its end); attention_backward_cuda
 * runs it in attn_bwd_kernel<64, ATTN_FP32>'s place on sm_90 after the Hopper row pass.
 *
 * Why: with the PORTABLE mma.sync key-major kernel attn_bwd_kernel<64, ATTN_FP32> (attention_cuda.cu) after the
 * Hopper row pass, fp32 at HS 64 costs nearly 2x bf16's fwd+bwd at the HS-64 shapes. With this pass the fp32
 * backward is 1.13x / 1.17x faster at B8 H16 T1024 / B4 H16 T2048 d64 (the pass does 9 causal BF16 GEMMs), dQ,
 * dK, dV within 4 BF16 ulps of attention_backward_cuda(fp32, force_portable)
 * (dev/results/attention_hopper_2026-11-29.md). dev/attention_lab/hopper_bwd64_fp32.cu is the harness that
 * checks and times it.
 *
 * What it computes (docs/attention_numerics.md "fp32"; attn_bwd_kernel<64, ATTN_FP32>'s rounding points,
 * operation for operation; only the FP32 summation order differs):
 *   S^T = K_w Q^T, dP^T = V_w dO^T (FP32), P = exp2((S - m) c) * fl(1/l), dS = P (dP - D), masked entries 0;
 *   dV += bf(P)^T dO + bf(P - bf(P))^T dO               (two RS n64 batches chained into one accumulator)
 *   dK += bf(dS)^T Q + bf(r1)^T Q, r1 = dS - bf(dS)      (the same chaining)
 *   dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K_w    (three staged terms, one FP32 accumulator: 24
 *                                                        significant bits, since dQ sums dS against keys that
 *                                                        may share a large common offset)
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the s-less dQ partial goes to the workspace's
 *   FP32 accumulator by TMA reduce-add, and the portable post-pass (attn_bwd_dq_kernel) writes dQ = bf(s acc).
 *   Workspace contract = attn_bwd_kernel's: the prep kernel zeroed dq_acc [B*NH*T][64], the row pass wrote D.
 *   DQ_SLICES (the deterministic backward, docs/determinism.md): the partials go to the key block's own zeroed
 *   slice; the two warpgroups' adds onto zero commute, so the slice's bits do not depend on their order.
 *
 * Layout: 288 threads (two consumer warpgroups of 64 keys and a producer
 * warp; no setmaxnreg; 2 Q/dO stages; longest key tiles first, tile_order.cuh), with hopper_wgmma.cuh's 64 x 64
 * steps and hopper_bwd_common.cuh's producer steps, row state, split terms (pack_split_step) and epilogue. Per
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
 *   (attention_hopper_bwd.cu's flush, at 64 rows)
 * Shared memory: K, V 16 KB each, Q, dO 2 stages x 8 KB, three dS tiles [64][72] BF16 per warpgroup (54 KB),
 * row state 2 KB, barriers, four 16 KB FP32 dQ tiles: SmemPlan::kAlloc = 190464 bytes (<= 227 KB, asserted).
 * Registers (`make hopper_bwd64_fp32-regs`, ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math): fp32keys64_kernel
 * 168 (what a 288-thread CTA gets: warps are allotted registers in groups of 4), 0 bytes spill, no C75xx
 * warning; the probe kernels 90 (scores, dQ parts) / 157 (dK + dV), 0 spill. With all three dQ terms' A
 * fragments live at once (48 registers, one batch of 12 wgmmas) ptxas serialised the wgmmas (C7512) and
 * spilled 16 bytes: hence the two alternating sets.
 *
 * Hangs (a pipeline protocol bug): every mbarrier wait is bounded (~2 s of clock64; a legitimate wait is
 * microseconds) and TRAPS (no setmaxnreg here, so a trap costs nothing; the setmaxnreg kernels give up and
 * write NaN instead, attention_hopper_bwd128.cu), first writing which barrier it was into the host-mapped AttnHopperHang record that
 * attention_hopper_bwd_watch_hangs installs (through attention_hopper_fp32_keys_watch_hangs). A hang is thus a
 * CUDA error with a named barrier, never a stuck job.
 *
 * The layout probe (attention_hopper_fp32_keys64_layout_probe, for dev/attention_lab/hopper_bwd64_fp32.cu): one
 * warpgroup at warpgroup 1's offsets, stage 1, one step, no softmax, P := S^T and dS := dP^T split and staged
 * through the kernel's own helpers: S^T, dP^T; dV and dK with their two chained split terms; dQ over the three
 * staged terms and its second and third terms alone (2^-8 / 2^-16 of the first: invisible next to it).
 *
 * Not done: overlapping the dQ GEMM with the next step's scores (registers: 168 of 168 at 288 threads); a
 * producer warpgroup with setmaxnreg; 3 stages.
 */
#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/launch_overlap.cuh"
#include "attention/cuda/tile_order.cuh"
#include "common/cuda_utils.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_FP32_KEYS64_HS; /* the head size of this kernel */
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
static_assert(ATTN_HOPPER_FP32_KEYS64_PROBE_TILE == kBlockQ && ATTN_HOPPER_FP32_KEYS64_PROBE_TILE == kWarpgroupKeys,
              "the probe covers one warpgroup's keys and one query tile");
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

/* Bounded mbarrier wait that traps (no setmaxnreg here), first naming the barrier in the host-mapped record
   (set by attention_hopper_bwd_watch_hangs through attention_hopper_fp32_keys_watch_hangs; NULL: trap without a
   record). No printf: a function call anywhere in the kernel makes ptxas serialise every wgmma (C7510). */
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
   the k and v slots of dqkv and adds the s-less dQ partials to dq_acc (through dq_map). DQ_SLICES: the
   deterministic backward's per-key-block dQ slices (keymajor_dq_head; docs/determinism.md). */
template <bool DQ_SLICES>
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
    const int dq_head = keymajor_dq_head<DQ_SLICES>(order); /* where this CTA's dQ partials go */
    const int qt_begin = k0 / kBlockQ;
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads);
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

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

        /* attention_hopper_bwd.cu's flush at 64 rows: the partial into the warpgroup's swizzled tile of this parity, then
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
            tma_reduce_add_3d(&dq_map, dq_tile, 0, q0, dq_head);
            tma_reduce_add_3d(&dq_map, dq_tile + kBlockQ * kSwizzleRowBytes, 32, q0, dq_head);
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


/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch, probe                                                                  */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper fp32 key-major pass, HS 64)";
constexpr size_t kTmaAlignBytes = 16; /* global address alignment TMA requires */

/* 1 iff this file's kernel computes the call: fp32, HS 64, B*NH <= 65535 (grid y), TMA-aligned qkv and dout. */
int fp32_keys64_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout) {
    if (mode != ATTN_FP32 || s.HS != kHS) return 0;
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0 && ((uintptr_t)dout % kTmaAlignBytes) == 0;
}

}  // namespace

int attention_hopper_fp32_keys_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout) {
    if (s.HS == ATTN_HOPPER_FP32_KEYS128_HS) return attention_hopper_fp32_keys128_supports(mode, s, qkv, dout);
    return fp32_keys64_supports(mode, s, qkv, dout);
}

void attention_backward_hopper_fp32_keys(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                         const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                         cudaStream_t stream, int dq_slices) {
    if (s.HS == ATTN_HOPPER_FP32_KEYS128_HS) {
        attention_backward_hopper_fp32_keys128(s, qkv, dout, stats, D, dq_acc, dqkv, stream, dq_slices);
        return;
    }
    if (!fp32_keys64_supports(ATTN_FP32, s, qkv, dout)) {
        die("attention_backward_hopper_fp32_keys: unsupported call (B=%d NH=%d T=%d HS=%d)\n"
            "  hint: HS %d or %d, B*NH <= 65535, 16-byte aligned qkv and dout; call attention_backward_cuda, which"
            " checks support (attention_hopper_fp32_keys_supports)", s.B, s.NH, s.T, s.HS, kHS,
            ATTN_HOPPER_FP32_KEYS128_HS);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    static_assert(kBlockK == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per CTA key block");
    const int n_key_blocks = ceil_div(s.T, kBlockK);
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho, dq_slices ? n_key_blocks : 1);
    auto kernel = dq_slices ? fp32keys64_kernel<true> : fp32keys64_kernel<false>;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    const dim3 grid((unsigned)n_key_blocks, (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, kernel, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map, dout_map,
                               dq_map, stats, D, dqkv, s.NH, s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS));
}

void attention_hopper_fp32_keys_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_fp32keys64_hang, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
    attention_hopper_fp32_keys128_watch_hangs(device_ptr_of_mapped_record);
}

void attention_hopper_fp32_keys64_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                               const __nv_bfloat16* dout, float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_FP32_KEYS64_PROBE_TILE || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_fp32_keys64_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d"
            " T=%d HS=%d head %d)", ATTN_HOPPER_FP32_KEYS64_PROBE_TILE, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n = (size_t)ATTN_HOPPER_FP32_KEYS64_PROBE_TILE * ATTN_HOPPER_FP32_KEYS64_PROBE_TILE;
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
