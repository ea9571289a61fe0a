/*
 * attention/cuda/hopper/kernel_keys64.cuh - the device code of the Hopper key-major backward of bf16 and repair at head size 64: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_bwd.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_bwd64_wide.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_CUH

#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/launch_overlap.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_BWD_HS; /* the head size of this kernel (see the header) */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 128;            /* queries per step (the N of S^T, dP^T; the k of dV, dK) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of S^T, dV, dK) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
/* setmaxnreg split (gproj HS 64's): with 24 / 240 (HS 128's) the repair instantiation spilled 32 bytes (the
   producer's fl(1/l) row state at 24 registers); 56 / 224 spilled 28; 40 / 232: 0 in both modes */
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the 384-thread CTA is launched with (168 each)");
constexpr int kStages = 2;
constexpr int kBoxRows = 64;            /* rows per TMA box of qkv / dout */
constexpr int kRowBytes = 128;          /* one row of HS 64 BF16 = one 128B-swizzle row */
constexpr int kAtomBytes = 8 * kRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kQSteps = kBlockQ / kWgmmaK;         /* 8 k-steps of dV, dK over a step's queries */
constexpr int kScoreRegs = kBlockQ / 2;            /* FP32 registers of a 64 x 128 accumulator per thread */
constexpr int kDqBlocks = kBlockQ / 64;            /* dQ's M blocks of 64 queries */
constexpr int kDsPitch = kWarpgroupKeys + 8;       /* BF16 per row of the staging tile [query][key]: +8 vs bank conflicts */
constexpr int kDqCols = 32;                        /* FP32 columns per 128-byte swizzle row (one reduce-add box) */
constexpr uint32_t kUnusedLbo = 16;                /* K-major swizzled operands ignore LBO */
constexpr uint32_t kUnusedLboN64 = 64 * kRowBytes; /* N-major B with N = 64: LBO unused (production's value) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 };       /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kDqBlocks == 2 && kQSteps == 2 * kTileKSteps, "two 64-query halves of a step");

struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kRowBytes;          /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kRowBytes;       /* 16 KB: two boxes */
    static constexpr int kQTileBytes = kBlockQ * kRowBytes;         /* 16 KB: two boxes */
    static constexpr int kDqBoxBytes = kBlockQ * kDqCols * 4;       /* 16 KB: 128 rows x 32 FP32 */
    static constexpr int kDqTileBytes = 2 * kDqBoxBytes;            /* 32 KB: 128 queries x 64 FP32 */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;         /* 18 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;                   /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;          /* kStages tiles */
    static constexpr int kDqTile = kDO + kStages * kQTileBytes;     /* one per consumer warpgroup */
    static constexpr int kDs = kDqTile + kConsumerWarpgroups * kDqTileBytes; /* one per consumer warpgroup */
    static constexpr int kRowState = kDs + kConsumerWarpgroups * kDsBytes;   /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages;            /* kv_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kAtomBytes;              /* slack to align the base to 1024 */
    static_assert(kQ % kAtomBytes == 0 && kDO % kAtomBytes == 0 && kDqTile % kAtomBytes == 0 &&
                      kQTileBytes % kAtomBytes == 0 && kDqBoxBytes % kAtomBytes == 0,
                  "TMA tiles and swizzled boxes 1024-byte aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state, 4-byte A loads");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};
static_assert(SmemPlan::kKeyTileBytes == KeymajorTiles<1>::kKeyTileBytes && kBlockK == KeymajorTiles<1>::kBlockK &&
                  SmemPlan::kBoxBytes == KeymajorTiles<1>::kBoxBytes,
              "the K/V tiles hopper_bwd_common.cuh's keymajor_load_kv writes");


/* bounded waits that give up (the file comment); this translation unit's record pointer, set by
   attention_hopper_bwd_watch_hangs; NULL (the default): no record */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz; a legitimate wait is microseconds */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* Barrier of the two consumer warpgroups (256 threads). Ids: 0 __syncthreads, 1 and 2 warpgroup_sync(0 / 1). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 3, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* ---- the steps of one (key tile, query step), per consumer warpgroup (kernel and probe share them) ---- */

/* Lane `lane` of the producer warp fills a stage: lane 0 announces the bytes and loads queries q0 .. q0 + 127 of
   Q and dO as two 64-row boxes each (a box starting at or past T reloads rows q0..: its queries are masked, and
   finite data keeps 0 * x = 0); the other lanes arrive (each after its row-state writes). */
__device__ __forceinline__ void fill_stage(unsigned char* q_stage, unsigned char* do_stage, const CUtensorMap* qkv_map,
                                           const CUtensorMap* dout_map, uint64_t* full_s, int q0, int T, int h, int NH,
                                           int b, int lane) {
    if (lane == 0) {
        mbar_arrive_expect_tx(full_s, 2 * SmemPlan::kQTileBytes);
#pragma unroll
        for (int half = 0; half < kBlockQ / kBoxRows; half++) {
            const int row = (q0 + half * kBoxRows < T) ? q0 + half * kBoxRows : q0;
            tma_load_4d(q_stage + half * SmemPlan::kBoxBytes, qkv_map, full_s, 0, kSlotQ * NH + h, row, b);
            tma_load_4d(do_stage + half * SmemPlan::kBoxBytes, dout_map, full_s, 0, h, row, b);
        }
    } else {
        mbar_arrive(full_s);
    }
}

/* S^T = K_w Q^T and dP^T = V_w dO^T [64 keys x 128 queries] as one commit group, waited for: m64n128k16 SS, the
   B operand the stage's 128-row K-major tile (SBO = one 8-row atom; its two TMA boxes are contiguous, so the
   swizzle continues across them). Written, not accumulated. */
__device__ __forceinline__ void scores_n128(float (&st)[kScoreRegs], float (&dpt)[kScoreRegs], uint32_t kw_addr,
                                            uint32_t q_addr, uint32_t vw_addr, uint32_t do_addr) {
#pragma unroll
    for (int i = 0; i < kScoreRegs; i++) st[i] = dpt[i] = 0.f;
    reg_fence(st); /* keeps the zeroing above the fence */
    reg_fence(dpt);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
        const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n128k16_ss(st, make_smem_desc(kw_addr + off, kUnusedLbo, kAtomBytes),
                            make_smem_desc(q_addr + off, kUnusedLbo, kAtomBytes));
    }
#pragma unroll
    for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
        const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n128k16_ss(dpt, make_smem_desc(vw_addr + off, kUnusedLbo, kAtomBytes),
                            make_smem_desc(do_addr + off, kUnusedLbo, kAtomBytes));
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(st);
    reg_fence(dpt);
}

/* P and dS in place of S^T and dP^T: hopper_bwd_common.cuh's keymajor_probs_column over the 16 column blocks of
   a 128-query step (register 4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e; its row state rs[8j + 2t + e]).
   masked: the step reaches the warpgroup's keys or T; keys past the query and queries past T give exactly 0. */
template <int MODE>
__device__ __forceinline__ void probs_n128(float (&st)[kScoreRegs], float (&dpt)[kScoreRegs], const float4* rs,
                                           int q0, int key0, int t, int T, bool masked, float c) {
#pragma unroll
    for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int ql = 8 * j + 2 * t + e, query = q0 + ql;
            const float4 row = rs[ql];
            keymajor_probs_column<MODE, kScoreRegs>(st, dpt, row, j, e, query, key0, T, masked, c);
        }
}

/* A 64 x 128 FP32 accumulator rounded to BF16 and packed as the register A operand over its 128 columns: k-step kk
   takes registers 8kk..8kk+7 (hopper_wgmma.cuh's pack_acc_a_operand, 8 k-steps instead of 4). */
__device__ __forceinline__ void pack_a_n128(uint32_t (&a)[kQSteps][4], const float (&acc)[kScoreRegs]) {
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        a[kk][0] = pack_bf16x2(acc[8 * kk + 0], acc[8 * kk + 1]); /* row g,   cols 2t, 2t+1 */
        a[kk][1] = pack_bf16x2(acc[8 * kk + 2], acc[8 * kk + 3]); /* row g+8, cols 2t, 2t+1 */
        a[kk][2] = pack_bf16x2(acc[8 * kk + 4], acc[8 * kk + 5]); /* row g,   cols 2t+8, 2t+9 */
        a[kk][3] = pack_bf16x2(acc[8 * kk + 6], acc[8 * kk + 7]); /* row g+8, cols 2t+8, 2t+9 */
    }
}

/* bf(dS^T) from its packed words to the warpgroup's staging tile [query][key]: word pds[kk][i] holds key
   key_row + 8 (i & 1) and queries q, q + 1, q = 16kk + 8 (i >> 1) + 2t (low half: q). key_row = 16 warp + g
   within the warpgroup's 64 keys. Done before the wgmma that reads pds is issued (PTX leaves reading the A
   registers of an in-flight wgmma undefined). */
__device__ __forceinline__ void stage_ds(bf16* ds_s, const uint32_t (&pds)[kQSteps][4], int key_row, int t) {
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = key_row + 8 * (i & 1);
            const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
            ds_s[q * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(pds[kk][i] & 0xFFFFu));
            ds_s[(q + 1) * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(pds[kk][i] >> 16));
        }
}

/* dV += bf(P)^T dO, dK += bf(dS)^T Q as one commit group (issued and committed; the caller waits): m64n64k16 RS,
   8 k-steps of 16 queries each over the stage's 128-row tiles read N-major (16 rows = 2048 bytes per k-step;
   k-steps 4..7 are in the second TMA box, 8 KB on). */
__device__ __forceinline__ void issue_dkv(float (&dv)[32], float (&dk)[32], uint32_t (&pa)[kQSteps][4],
                                          uint32_t (&pds)[kQSteps][4], uint32_t q_addr, uint32_t do_addr) {
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++)
        wgmma_m64n64k16_rs(dv, pa[kk], make_smem_desc(do_addr + kk * kWgmmaK * kRowBytes, kUnusedLboN64, kAtomBytes));
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++)
        wgmma_m64n64k16_rs(dk, pds[kk], make_smem_desc(q_addr + kk * kWgmmaK * kRowBytes, kUnusedLboN64, kAtomBytes));
    wgmma_commit();
}

/* dq0 = bf(dS)[queries 0..63] K_w, dq1 = bf(dS)[queries 64..127] K_w (64 x 64 each over the warpgroup's 64 keys):
   A loaded from the staging tile (hopper_wgmma.cuh's load_staged_a_operand), K_w N-major (warpgroup_rs_issue_n64,
   production's form); one commit group, waited for. The caller made the tile visible (warpgroup barrier). */
__device__ __forceinline__ void dq_two_blocks(float (&dq0)[32], float (&dq1)[32], const bf16* ds_s, uint32_t kw_addr,
                                              int warp_in_wg, int g, int t) {
    uint32_t a0[kTileKSteps][4], a1[kTileKSteps][4];
    load_staged_a_operand<kDsPitch>(a0, ds_s, warp_in_wg, g, t);
    load_staged_a_operand<kDsPitch>(a1, ds_s + 64 * kDsPitch, warp_in_wg, g, t);
#pragma unroll
    for (int k = 0; k < 32; k++) dq0[k] = dq1[k] = 0.f;
    reg_fence(a0);
    reg_fence(a1);
    reg_fence(dq0);
    reg_fence(dq1);
    wgmma_fence();
    warpgroup_rs_issue_n64(dq0, a0, kw_addr);
    warpgroup_rs_issue_n64(dq1, a1, kw_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq0);
    reg_fence(dq1);
    reg_fence(a0);
    reg_fence(a1);
}

/* One 64-query block of the dQ partial into the warpgroup's FP32 tile [128 rows][64]: two 128B-swizzled boxes of
   32 columns x 128 rows (16 KB each); float2 (row, cols 8n + 2t) is 16-byte chunk (2 (n % 4) + t / 2) ^ (row % 8)
   of row `row` of box n / 4 (production's flush, 128-row boxes). Rows 64 blk + 16 warp + g (+ 8): row % 8 = g. */
__device__ __forceinline__ void store_dq_block(unsigned char* dq_tile, const float (&dq)[32], int blk, int warp_in_wg,
                                               int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = 64 * blk + 16 * warp_in_wg + g + 8 * r;
#pragma unroll
        for (int n = 0; n < kHS / 8; n++) {
            const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
            *reinterpret_cast<float2*>(dq_tile + (n >> 2) * SmemPlan::kDqBoxBytes + row * kRowBytes + chunk * 16 +
                                       (t & 1) * 8) = make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
        }
    }
}

/* Thread 0 of a warpgroup: the tile's two boxes added to the accumulator rows q0.. of head bh (rows past T are
   outside the map and skipped), one bulk group. */
__device__ __forceinline__ void send_dq_tile(const CUtensorMap* dq_map, const unsigned char* dq_tile, int q0, int bh) {
    tma_reduce_add_3d(dq_map, dq_tile, 0, q0, bh);
    tma_reduce_add_3d(dq_map, dq_tile + SmemPlan::kDqBoxBytes, kDqCols, q0, bh);
    bulk_commit_group();
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

/* DQ_SLICES: the deterministic backward's per-key-block dQ slices (keymajor_dq_head; docs/determinism.md) */
template <int MODE, bool DQ_SLICES>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_bwd_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                      const __grid_constant__ CUtensorMap dq_map, const float* __restrict__ stats,
                      const float* __restrict__ D, bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = kv_full + 1;
    uint64_t* empty = full + kStages;
    __shared__ int cta_abort; /* set by a bounded wait that gave up */

    const AttnTileOrder order = attn_tile_longest_first(); /* key tile 0 sees every query: first */
    const int k0 = order.rank * kBlockK;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int dq_head = keymajor_dq_head<DQ_SLICES>(order); /* where this CTA's dQ partials go */
    const int qt_begin = k0 / kBlockQ; /* kBlockQ == kBlockK: the first step is the diagonal one */
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        cta_abort = 0;
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads);
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the prep kernel's D and zeroed accumulator are ready from here on;
       the dQ post-pass may be placed on the SMs as soon as every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>();
        if (warp != kConsumerThreads / 32) return; /* warps 9-11 have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 4 queries ---- */
        if (lane == 0) keymajor_load_kv<1>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
#pragma unroll
            for (int half = 0; half < kBlockQ / 64; half++)
                keymajor_stage_row_state<MODE, kKeymajorNoLambda>(row_state + s * kBlockQ + 64 * half, nullptr, stats,
                                                                  D, nullptr, bh, T, q0 + 64 * half, lane);
            fill_stage(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map, &full[s], q0, T,
                       h, NH, b, lane);
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int tid_in_wg = threadIdx.x & 127; /* thread 0 of each warpgroup sends its dQ tile */
    const int key_row = warp_in_wg * 16 + g;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const int key0 = wg_key_first + key_row;
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + wg * Plan::kDsBytes);
    unsigned char* dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

#pragma unroll 1
    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);

        float st[kScoreRegs], dpt[kScoreRegs];
        scores_n128(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        probs_n128<MODE>(st, dpt, row_state + s * kBlockQ, q0, key0, t, T, masked, c);

        uint32_t pa[kQSteps][4], pds[kQSteps][4];
        pack_a_n128(pa, st);
        pack_a_n128(pds, dpt);
        float dq0[32], dq1[32];
        /* the previous step's A loads of the staging tile are behind its last warpgroup barrier */
        stage_ds(ds_s, pds, key_row, t);
        issue_dkv(dv, dk, pa, pds, q_addr, do_addr);
        /* the previous step's reduce-adds have read the (single) dQ tile before the barrier below lets the
           warpgroup rewrite it */
        if (tid_in_wg == 0) bulk_wait_group_read<0>();
        warpgroup_sync(wg); /* the staging tile is written */
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pds);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
        dq_two_blocks(dq0, dq1, ds_s, kw_addr, warp_in_wg, g, t);
        store_dq_block(dq_tile, dq0, 0, warp_in_wg, g, t);
        store_dq_block(dq_tile, dq1, 1, warp_in_wg, g, t);
        fence_proxy_async(); /* the tile's generic-proxy stores, before the async proxy (TMA) reads them */
        warpgroup_sync(wg);  /* also: every A load of the staging tile is done before the next step restages */
        if (tid_in_wg == 0) send_dq_tile(&dq_map, dq_tile, q0, dq_head);
    }
    /* the last reduce-adds complete before the CTA's shared memory goes away */
    if (tid_in_wg == 0) bulk_wait_group<0>();
    /* any give-up of the CTA (the producer's precedes an arrival every consumer waited for) is visible now */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, gave_up);
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_CUH */
