/*
 * attention/attention_hopper_bwd.cu - the Hopper (sm_90a) key-major causal attention backward of bf16 and
 * repair modes at head size 64 (dK, dV and the dQ reduce-adds) on wgmma + TMA. The API and which calls it
 * serves: attention/attention_hopper_bwd.cuh.
 *
 * Why: the portable backward (attention/attention_cuda.cu: prep, attn_bwd_kernel, dQ post-pass) is
 * mma.sync based; this kernel takes attn_bwd_kernel's place on sm_90 for bf16 and repair at HS 64. Its lab
 * is dev/attention_lab/hopper_bwd.cu (first H200 run, dev/results/device_s4/call2: layout probe exact,
 * 104/0 against the portable backward within 4 BF16 ulps, whole backward 1.08x at B8 H16 T1024 and 1.11x
 * at B4 H16 T2048). The prep (D, zeroed accumulator) and the dQ post-pass stay the portable kernels: the
 * lab's twins computed exactly the same thing.
 *
 * What it computes (docs/ATTENTION_NUMERICS.md; attn_bwd_kernel's rounding points, operation for operation):
 *   per key tile, for each query tile from the diagonal on:
 *     S^T = K Q^T, dP^T = V dO^T           (FP32 accumulators, wgmma SS, M = 64 keys per warpgroup)
 *     P = exp2(fma(S, c, -fl(LSE log2 e)))  (bf16: __fmaf_rn)  or  exp2((S - m) c) * fl(1/l)  (repair)
 *     dS = P (dP - D)                       (FP32, masked entries exactly 0)
 *     dV += bf(P)^T dO,  dK += bf(dS)^T Q   (wgmma RS: the accumulator repacked as the A operand)
 *     dQ_acc += bf(dS) K                    (wgmma RS, A = bf(dS) staged through shared memory), the
 *                                           64 x 64 FP32 partial added to the workspace by TMA reduce-add
 *   dK = bf(s dK_acc), dV = bf(dV_acc) into dqkv; dQ = bf(s dQ_acc) is the caller's post-pass.
 * Only the order of the FP32 sums differs from attn_bwd_kernel (tensor-core k-loops; dQ partials arrive
 * per 64 keys here, per 128 there), so dQ/dK/dV agree within a few BF16 ulps of the row scale.
 *
 * Kernel layout: one CTA = 128 keys (kBlockK) of one (b, h); warps 0-3 and 4-7 are two consumer
 * warpgroups of 64 keys each, warp 8 the producer. K and V of the CTA are loaded once (two 64-row TMA
 * boxes each); Q and dO tiles of 64 queries (kBlockQ) come in a 2-stage pipeline: full[s] (32 producer
 * lanes arrived after writing the tile's row state {row_a, row_b, D} to shared memory, plus the TMA bytes)
 * and empty[s] (all 256 consumer threads done with stage s). Each warpgroup's dQ partial (its 64 keys)
 * goes out on its own: stored to one of its two FP32 shared tiles (step parity, 128B swizzle) and added to
 * the workspace by two TMA reduce-adds that one thread issues (session 5: 1.10-1.12x the red.global
 * atomics it replaced, dev/results/device_s5/call3, lab hopper_bwd_fast v7; one tile per CTA instead,
 * which couples the warpgroups, was 0.88-0.92x, call4); its bf(dS) tile is staged in a private shared buffer [query][key] (padded
 * rows) and read back as m16n8k16 A fragments, so no CTA-wide barrier is needed inside the loop. qkv
 * [B, T, 3, NH, 64] and dout [B, T, NH, 64] are 4-D TMA tensors {HS, heads, T, B}: rows past T read as
 * zeros, per batch; shared tiles use the 128-byte swizzle (one 128-byte row = 64 BF16).
 * Bounded waits: every mbarrier wait gives up after ~10 s of clock64 and traps (naming the barrier in a
 * host-mapped record when attention_hopper_bwd_watch_hangs installed one), so a protocol bug is a CUDA
 * error, never a stuck job.
 * HS 128 is attention_hopper_bwd128.cu (its own layout: a producer warpgroup and setmaxnreg, dQ split by
 * head-dimension halves); attention_backward_hopper_keys below dispatches on s.HS.
 * Not done: overlap of the dQ GEMM with dV/dK (needs setmaxnreg and a full producer warpgroup), fp32 and
 * gproj modes (their dS terms / the correction live in the portable kernel).
 */
#include <math.h>
#include <stdint.h>
#include "attention/attention_hopper_bwd.cuh"
#include "attention/tile_order.cuh"
#include "attention/hopper_wgmma.cuh"
#include "attention/hopper_bwd_common.cuh"
#include "attention/launch_overlap.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_BWD_HS; /* the only head size (see the header) */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 32; /* + one producer warp, after the warpgroups (alignment) */
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box (Q, dO tiles; K and V as two boxes each) */
constexpr int kSwizzleRowBytes = 128;   /* one row of HS 64 BF16 = one 128B-swizzle row */
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kDsPitch = kBlockQ + 8;   /* BF16 per row of a staged dS tile [query][key]: +8 against bank conflicts */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ, "one staged dS tile is 64 x 64: the warpgroup's keys x the query tile");

/* Shared-memory plan (byte offsets from a 1024-byte aligned base). Tiles are [rows][128 bytes], swizzled. */
struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kSwizzleRowBytes; /* 16 KB */
    static constexpr int kQTileBytes = kBlockQ * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;           /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;  /* kStages tiles */
    static constexpr int kDs = kDO + kStages * kQTileBytes; /* one [64 query][kDsPitch] BF16 tile per warpgroup */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kRowState = kDs + kConsumerWarpgroups * kDsBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages; /* kv_full, full[stages], empty[stages] */
    /* per warpgroup 2 FP32 dQ tiles [64 queries][64] (step parity), each two 128B-swizzled boxes of 32 columns
       (8 KB): the partial the warpgroup's TMA reduce-adds send */
    static constexpr int kDqTileBytes = kBlockQ * kHS * 4;
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kBytes = kDqTile + kConsumerWarpgroups * 2 * kDqTileBytes;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
    static_assert(kRowState % 16 == 0, "float4 row state");
};
static_assert(SmemPlan::kKeyTileBytes == KeymajorTiles<1>::kKeyTileBytes &&
                  SmemPlan::kQTileBytes == KeymajorTiles<1>::kQTileBytes &&
                  SmemPlan::kBoxBytes == KeymajorTiles<1>::kBoxBytes && kBlockK == KeymajorTiles<1>::kBlockK &&
                  kBlockQ == KeymajorTiles<1>::kBlockQ && kHS == 64,
              "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");

/* mbarrier wait with a limit: polls for about kHangCycles clock cycles (~10 s at 1.98 GHz), then writes
   which barrier hung into g_hang_record (host-mapped pinned memory: it survives the trap) and traps, so a
   protocol bug ends the program with a CUDA error and a named barrier instead of a stuck job. No printf:
   a function call anywhere in the kernel makes ptxas serialise every wgmma (warning C7510). */
constexpr long long kHangCycles = 20000000000ll;
enum HangSite {
    kHangNone = ATTN_HANG_NONE, kHangKvFull = ATTN_HANG_KV_FULL, kHangFull = ATTN_HANG_FULL,
    kHangEmpty = ATTN_HANG_EMPTY, kHangProbe = ATTN_HANG_PROBE
};
/* set by attention_hopper_bwd_watch_hangs; NULL (the default): trap without a record */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, HangSite site, int index) {
    const uint32_t addr = smem_u32(bar);
    uint32_t done = 0;
    const long long start = clock64();
    while (!done) {
        done = mbar_try_wait(addr, parity);
        if (!done && clock64() - start > kHangCycles) {
            volatile AttnHopperHang* rec = g_hang_record;
            if (rec != NULL) {
                rec->index = index;
                rec->parity = (int)parity;
                rec->block_x = (int)blockIdx.x;
                rec->block_y = (int)blockIdx.y;
                rec->thread = (int)threadIdx.x;
                __threadfence_system();
                rec->site = (int)site;
                __threadfence_system();
            }
            __trap();
        }
    }
}


/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

template <int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_bwd_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
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

    const AttnTileOrder order = attn_tile_longest_first(); /* key tile 0 sees every query: first */
    const int k0 = order.rank * kBlockK;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int qt_begin = k0 / kBlockQ;   /* the first query tile that reaches key k0 */
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads); /* full: 32 producer lanes (row state) */
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the prep kernel's D and zeroed accumulator are ready from here on;
       the dQ post-pass may be placed on the SMs as soon as every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warp == kConsumerThreads / 32) {
        /* ---- producer warp: lane 0 issues the copies, every lane writes row state for 2 queries ---- */
        if (lane == 0) keymajor_load_kv<1>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            /* stage s is free once the consumers released tile i - kStages (phase i / kStages - 1) */
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), kHangEmpty, s);
            keymajor_stage_row_state<MODE, kKeymajorNoLambda>(row_state + s * kBlockQ, nullptr, stats, D, nullptr,
                                                              bh, T, q0, lane);
            keymajor_fill_stage<1>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map,
                                   &full[s], q0, h, NH, b, lane);
        }
        return;
    }

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warp / 4, warp_in_wg = warp % 4, g = lane >> 2, t = lane & 3;
    const int tid_in_wg = threadIdx.x & 127; /* thread 0 of each warpgroup issues its dQ reduce-adds */
    const int key0 = k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + wg * Plan::kDsBytes);
    const uint32_t k_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, v_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, kHangKvFull, 0);
    __syncwarp();

    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), kHangFull, s);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        float st[32], dpt[32];
        warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);

        /* P and dS in registers (st <- P, dpt <- dS), masked entries exactly 0. Element 4j + 2r + e:
           key key0 + 8r, query q0 + 8j + 2t + e. The mask can bite only where the tile reaches the
           warpgroup's keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int query = q0 + 8 * j + 2 * t + e;
                const float4 row = rs[8 * j + 2 * t + e];
                keymajor_probs_column<MODE>(st, dpt, row, j, e, query, key0, T, masked, c);
            }

        /* dV += bf(P)^T dO, dK += bf(dS)^T Q (A from registers, dO and Q N-major) as one batch; while it
           runs, bf(dS) goes to the staging tile [query][key] (packed again from the FP32 dS, not read
           from pds; the previous step's reads of the tile are behind the first barrier). Then
           dQ_partial = bf(dS) K_w (A loaded back from the tile, K_w N-major) as a second batch, after
           the first completed: with all three GEMMs in flight at once (96 accumulator + 48 A
           registers) ptxas serialises the wgmmas for lack of registers (C7512; a 288-thread CTA is
           given 168 registers per thread). */
        uint32_t pa[kBlockQ / kWgmmaK][4], pds[kBlockQ / kWgmmaK][4];
        pack_acc_a_operand(pa, st);
        pack_acc_a_operand(pds, dpt);
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        warpgroup_rs_issue_n64(dv, pa, do_addr);
        warpgroup_rs_issue_n64(dk, pds, q_addr);
        wgmma_commit();
        /* this step's dQ tile (parity i) was last sent at step i - 2: its reduce-add must have read it (at most
           step i - 1's group still reading) before the barrier below lets the warpgroup rewrite it */
        if (tid_in_wg == 0) bulk_wait_group_read<1>();
        warpgroup_sync(wg);
        stage_tile_transposed<kDsPitch>(ds_s, dpt, warp_in_wg, g, t);
        warpgroup_sync(wg);
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pds);

        uint32_t adq[kWarpgroupKeys / kWgmmaK][4];
        load_staged_a_operand<kDsPitch>(adq, ds_s, warp_in_wg, g, t);
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(adq);
        reg_fence(dq);
        wgmma_fence();
        warpgroup_rs_issue_n64(dq, adq, k_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq);
        reg_fence(adq);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

        /* The dQ partial of this warpgroup's keys (rows = queries q0 + 16 warp_in_wg + g (+8), cols 8n + 2t) into
           the warpgroup's tile of this step's parity, then one thread adds the tile to the accumulator with two
           TMA reduce-adds (rows past T are outside the map: skipped). The tile is two 128B-swizzled boxes of 32
           columns: float2 (row r, cols 8n + 2t) is 16-byte chunk (2 (n % 4) + t / 2) ^ (r % 8) of row r of box
           n / 4, and r % 8 = g. One bulk reduce per 16 KB instead of 128 threads' red.global: the red.global
           atomics cost a quarter of the kernel (dev/results/device_s5/call2, ablation a1). */
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
        fence_proxy_async(); /* the tile's generic-proxy stores, before the async proxy (TMA) reads them */
        warpgroup_sync(wg);
        if (tid_in_wg == 0) {
            tma_reduce_add_3d(&dq_map, dq_tile, 0, q0, bh);
            tma_reduce_add_3d(&dq_map, dq_tile + kBlockQ * kSwizzleRowBytes, 32, q0, bh);
            bulk_commit_group();
        }
    }
    /* the last reduce-adds complete before the CTA's shared memory goes away */
    if (tid_in_wg == 0) bulk_wait_group<0>();

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t); its waits trap,
       so no give-up to show */
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, /*gave_up=*/false);
}

/* Layout probe: one warpgroup, one tile of everything at token 0 of batch 0 (K, V, Q of `head` from qkv;
   dO of `head` from dout; T < 64 so the TMA zero fill shows), through the kernel's own helpers, no
   softmax:
     out_st  = S^T = K Q^T              (form (1): m64n64k16 SS; K-major A and B)
     out_dpt = dP^T = V dO^T            (forms (1), (2): the dout map)
     out_dv  = bf(S^T) dO               (register A repack, dO N-major)
     out_dk  = bf(dP^T) Q               (form (4): Q read N-major after being read K-major)
     out_dq  = bf(dP^T)^T K             (forms (5), (6): staging [query][key] + A loads; K N-major)
   [64 x 64] FP32 each, row-major (the numbered operand forms: dev/attention_lab/hopper_bwd.cu's header).
   The kernel loads its 128 keys as two 64-row boxes (form (3)); the probe loads tokens 0..63 into the
   SECOND 8 KB half of the K and V tiles and reads them there (warpgroup 1's offset), and Q/dO into stage
   1, so the non-zero offsets are what is exercised. */
__global__ void __launch_bounds__(128, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ out_st, float* __restrict__ out_dpt,
                        float* __restrict__ out_dv, float* __restrict__ out_dk, float* __restrict__ out_dq) {
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
    /* tiles: K and V into their second 8 KB half (warpgroup 1's place), Q and dO into stage 1 */
    unsigned char* k_half = smem + Plan::kK + Plan::kBoxBytes;
    unsigned char* v_half = smem + Plan::kV + Plan::kBoxBytes;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes;
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 4 * Plan::kBoxBytes);
        tma_load_4d(k_half, &qkv_map, bar, 0, kSlotK * NH + head, 0, 0);
        tma_load_4d(v_half, &qkv_map, bar, 0, kSlotV * NH + head, 0, 0);
        tma_load_4d(q_t, &qkv_map, bar, 0, kSlotQ * NH + head, 0, 0);
        tma_load_4d(do_t, &dout_map, bar, 0, head, 0, 0);
    }
    mbar_wait_bounded(bar, 0, kHangProbe, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    const uint32_t k_addr = smem_u32(k_half), v_addr = smem_u32(v_half);
    float st[32], dpt[32];
    warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);
    auto write_acc = [&](float* dst, const float (&acc)[32]) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++) dst[(warp * 16 + g + 8 * r) * 64 + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
    };
    write_acc(out_st, st);
    write_acc(out_dpt, dpt);
    uint32_t pa[4][4], pds[4][4];
    pack_acc_a_operand(pa, st);
    pack_acc_a_operand(pds, dpt);
    float dv[32], dk[32], dq[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dv[i] = dk[i] = dq[i] = 0.f;
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    warpgroup_rs_issue_n64(dv, pa, do_addr);
    warpgroup_rs_issue_n64(dk, pds, q_addr);
    wgmma_commit();
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsBytes); /* warpgroup 1's buffer */
    warpgroup_sync(0);
    stage_tile_transposed<kDsPitch>(ds_s, dpt, warp, g, t);
    warpgroup_sync(0);
    uint32_t adq[4][4];
    load_staged_a_operand<kDsPitch>(adq, ds_s, warp, g, t);
    reg_fence(dq);
    reg_fence(adq);
    wgmma_fence();
    warpgroup_rs_issue_n64(dq, adq, k_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(dq);
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(adq);
    write_acc(out_dv, dv);
    write_acc(out_dk, dk);
    write_acc(out_dq, dq);
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

/* qkv (heads = 3 NH) or dout (heads = NH) as a 4-D TMA tensor (hopper_wgmma.cuh's encode_head_map): boxes of
   {64 columns, 1 head, 64 tokens, 1 batch}. */
CUtensorMap make_head_map(const bf16* base, AttnShape s, int heads, const char* what) {
    return encode_head_map(base, s, heads, kBoxRows, "attention (Hopper backward)", what);
}

constexpr size_t kTmaAlignBytes = 16; /* global address alignment TMA requires */

template <int MODE>
void hopper_bwd_keys_launch(AttnShape s, const CUtensorMap& qkv_map, const CUtensorMap& dout_map, const float* stats,
                            const float* D, float* dq_acc, bf16* dqkv, cudaStream_t stream) {
    cudaCheck(cudaFuncSetAttribute(hopper_bwd_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, "attention (Hopper backward)");
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, hopper_bwd_kernel<MODE>, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map,
                               dout_map, dq_map, stats, D, dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                               attn_exp2_scale(kHS));
}

}  // namespace

int attention_hopper_bwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv, const void* dout) {
    if (mode != ATTN_BF16 && mode != ATTN_REPAIR) return 0;
    if (mode == ATTN_REPAIR && opt.tile_max_shift) return 0; /* the shift arm stays portable end to end */
    if (s.HS != kHS && s.HS != ATTN_HOPPER_BWD128_HS) return 0; /* HS 128: attention_hopper_bwd128.cu */
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0 && ((uintptr_t)dout % kTmaAlignBytes) == 0;
}

void attention_backward_hopper_keys(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                    cudaStream_t stream) {
    const AttnOptions no_options = {};
    if (!attention_hopper_bwd_supports(mode, no_options, s, qkv, dout)) {
        die("attention_backward_hopper_keys: unsupported call (mode %s, B=%d NH=%d T=%d HS=%d, qkv %p, dout %p)\n"
            "  hint: bf16 or repair mode, head size %d or %d, B*NH <= 65535, qkv and dout 16-byte aligned; use "
            "attention_backward_cuda, which falls back to the portable kernels",
            (int)mode >= 0 && mode < ATTN_NUM_MODES ? attn_mode_name(mode) : "?", s.B, s.NH, s.T, s.HS,
            (const void*)qkv, (const void*)dout, kHS, ATTN_HOPPER_BWD128_HS);
    }
    if (s.HS == ATTN_HOPPER_BWD128_HS) {
        attention_backward_hopper_keys128(mode, s, qkv, dout, stats, D, dq_acc, dqkv, stream);
        return;
    }
    const CUtensorMap qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    const CUtensorMap dout_map = make_head_map(dout, s, s.NH, "dout");
    if (mode == ATTN_BF16) hopper_bwd_keys_launch<ATTN_BF16>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else hopper_bwd_keys_launch<ATTN_REPAIR>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
}

void attention_hopper_bwd_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
    attention_hopper_bwd128_watch_hangs(device_ptr_of_mapped_record);
    attention_hopper_rows128_watch_hangs(device_ptr_of_mapped_record);
    attention_hopper_gproj_keys_watch_hangs(device_ptr_of_mapped_record);
    attention_hopper_fp32_keys_watch_hangs(device_ptr_of_mapped_record); /* HS 64 and 128 */
}

const char* attn_hopper_hang_site_name(int site) {
    switch (site) {
        case ATTN_HANG_KV_FULL: return "kv_full (K/V tiles)";
        case ATTN_HANG_FULL: return "full (Q/dO tile + row state)";
        case ATTN_HANG_EMPTY: return "empty (stage released by the consumers)";
        case ATTN_HANG_PROBE: return "probe tiles";
        default: return "none";
    }
}

void attention_hopper_bwd_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                       float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_BWD_PROBE_TILE || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_bwd_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d T=%d "
            "HS=%d head %d)", ATTN_HOPPER_BWD_PROBE_TILE, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    const CUtensorMap dout_map = make_head_map(dout, s, s.NH, "dout");
    const size_t tile = (size_t)ATTN_HOPPER_BWD_PROBE_TILE * ATTN_HOPPER_BWD_PROBE_TILE;
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, 128, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, tiles, tiles + tile,
                                                      tiles + 2 * tile, tiles + 3 * tile, tiles + 4 * tile);
    cudaCheckLastError();
}
