/*
 * attention/cuda/hopper/kernel_keys64_fp32.cuh - the device code of fp32 mode's Hopper key-major pass at head size 64: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_bwd64_fp32.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_bwd64_fp32.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_FP32_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_FP32_CUH

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

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_FP32_CUH */
