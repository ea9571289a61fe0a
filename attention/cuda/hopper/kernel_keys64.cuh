/*
 * attention/cuda/hopper/kernel_keys64.cuh - the device code of the Hopper key-major backward at head size 64,
 * one kernel template for every mode: the constants the modes share, each mode's shared-memory plan and
 * traits (Keys64Mode<MODE>: the plan, the waits' patience, the row state, whether dQ partials leave the CTA), the
 * step helpers, the kernel body with a block per mode after the scores, its two entry points and the host
 * launch of the modes that send dQ, in the including file's anonymous namespace. Included by the
 * instantiation files attention/cuda/hopper/attention_hopper_bwd.cu (bf16, repair), attention_hopper_bwd_gproj.cu
 * (gproj) and attention_hopper_bwd64_fp32.cu (fp32) (their entry points; each mode's design, numerics and
 * barrier protocol are in its file comment), and by the layout probes dev/attention_lab/probes/probe_keys64*.cu,
 * which run the same helpers on one tile.
 *
 * Why one template: the three passes share the key side (work items of 128 keys, two consumer warpgroups of 64
 * keys and a producer warpgroup with setmaxnreg 40 / 232, K/V loaded once per item (two buffers in gproj and fp32,
 * one in bf16 and repair), Q/dO in 2 stages (gproj 3), the row state written by the producer warp, the items taken
 * from a queue) and differ in the step (bf16 and repair step
 * through 128 queries, gproj and fp32 through 64), the operands after S^T and dP^T, the dQ GEMM and whether dQ
 * partials leave the CTA. A mode is its traits and its block of the body, not a copy of the kernel. Why a
 * header: the probes are lab code and stay out of the production objects, yet they must use the kernel's own
 * helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_CUH

#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"
#include "attention/cuda/launch_overlap.cuh"
#include "common/cuda_utils.cuh"

using namespace hopper_wgmma;

namespace {

/* ---- what every mode shares ---- */
constexpr int kHS = 64; /* the head size of this kernel */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of S^T, dV, dK) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kBoxRows = 64;            /* rows per TMA box of qkv / dout */
constexpr int kRowBytes = 128;          /* one row of HS 64 BF16 = one 128B-swizzle row */
constexpr int kAtomBytes = 8 * kRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kDsPitch = kWarpgroupKeys + 8; /* BF16 per row of a staged tile [query][key]: +8 vs bank conflicts */
constexpr int kDsCtaPitch = kBlockK + 8;     /* the same for a tile of the CTA's 128 keys (bf16, repair) */
constexpr uint32_t kUnusedLbo = 16;                /* K-major swizzled operands ignore LBO */
constexpr uint32_t kUnusedLboN64 = 64 * kRowBytes; /* N-major B with N = 64: LBO unused (production's value) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 };       /* the 3 of qkv [B, T, 3, NH, HS] */

/* ---- bf16 and repair: 128-query steps ---- */
constexpr int kWideQ = 128;                        /* queries per step (the N of S^T, dP^T; the k of dV, dK) */
constexpr int kWideQSteps = kWideQ / kWgmmaK;      /* 8 k-steps of dV, dK over a step's queries */
constexpr int kWideScoreRegs = kWideQ / 2;         /* FP32 registers of a 64 x 128 accumulator per thread */
constexpr int kDqRows = kWideQ / kConsumerWarpgroups; /* a step's queries whose dQ one warpgroup computes */
constexpr int kDqCols = 32;                        /* FP32 columns per 128-byte swizzle row (one reduce-add box) */
static_assert(kDqRows == 64 && kWideQSteps == 2 * kTileKSteps, "two 64-query halves of a step");

struct Keys64WidePlan {
    static constexpr int kStages = 2; /* Q/dO double buffering */
    static constexpr int kBlockQ = kWideQ;
    static constexpr int kBoxBytes = kBoxRows * kRowBytes;          /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kRowBytes;       /* 16 KB: two boxes */
    static constexpr int kQTileBytes = kBlockQ * kRowBytes;         /* 16 KB: two boxes */
    static constexpr int kDqBoxBytes = kDqRows * kDqCols * 4;       /* 8 KB: 64 rows x 32 FP32 */
    static constexpr int kDqTileBytes = 2 * kDqBoxBytes;            /* 16 KB: a warpgroup's 64 queries x 64 FP32 */
    static constexpr int kDsBytes = kBlockQ * kDsCtaPitch * 2;      /* 34 KB: [128 queries][128 keys + 8] */
    static constexpr int kDsTiles = 2;                              /* by step parity */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;                   /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;          /* kStages tiles */
    static constexpr int kDqTile = kDO + kStages * kQTileBytes;     /* one per consumer warpgroup */
    static constexpr int kDs = kDqTile + kConsumerWarpgroups * kDqTileBytes; /* kDsTiles, both warpgroups' keys */
    static constexpr int kRowState = kDs + kDsTiles * kDsBytes;     /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kKvBuffers = 1;                            /* a second does not fit beside the rest */
    static constexpr int kKvBufferBytes = 0;
    static constexpr int kNumBarriers = 2 + 2 * kStages; /* kv_full, full[stages], empty[stages], kv_empty */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kAtomBytes;              /* slack to align the base to 1024 */
    static_assert(kQ % kAtomBytes == 0 && kDO % kAtomBytes == 0 && kDqTile % kAtomBytes == 0 &&
                      kQTileBytes % kAtomBytes == 0 && kDqBoxBytes % kAtomBytes == 0,
                  "TMA tiles and swizzled boxes 1024-byte aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state, 4-byte A loads");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* ---- gproj and fp32: 64-query tiles ---- */
constexpr int kDsTerms = 3; /* fp32's staged dS terms: bf(dS), bf(r1), bf(r1 - bf(r1)) */

/* Two K/V buffers (item u in buffer u % 2: the next item's K and V land while the consumers finish this one),
   kStages Q and dO tiles of 64 queries (gproj 3, so that a stage's copies have two steps to land; fp32 2), with
   FP32_TILES fp32's per-warpgroup three staged dS terms [64 query][kDsPitch] and one FP32 dQ tile [64 queries][64]
   per warpgroup (the warpgroup sends from it every other step), the row state float4 [kStages][64], the
   barriers. */
template <bool FP32_TILES>
struct Keys64TilePlan {
    static constexpr int kStages = FP32_TILES ? 2 : 3;        /* fp32: no room for a third */
    static constexpr int kBlockQ = 64;
    static constexpr int kBoxBytes = kBoxRows * kRowBytes;    /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kRowBytes; /* 16 KB */
    static constexpr int kQTileBytes = kBlockQ * kRowBytes;   /* 8 KB */
    static constexpr int kKvBuffers = 2;
    static constexpr int kKvBufferBytes = 2 * kKeyTileBytes;  /* K then V */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kKvBuffers * kKvBufferBytes;    /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;    /* kStages tiles */
    static constexpr int kDs = kDO + kStages * kQTileBytes;   /* fp32: per warpgroup kDsTerms tiles */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kDsWarpgroupBytes = kDsTerms * kDsBytes;
    static constexpr int kRowState = kDs + (FP32_TILES ? kConsumerWarpgroups * kDsWarpgroupBytes : 0);
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    /* kv_full[kKvBuffers], full[stages], empty[stages], kv_empty[kKvBuffers] */
    static constexpr int kNumBarriers = 2 * kKvBuffers + 2 * kStages;
    static constexpr int kDqTileBytes = kBlockQ * kHS * 4;    /* fp32: one per warpgroup */
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kAtomBytes - 1) / kAtomBytes * kAtomBytes;
    static constexpr int kBytes = FP32_TILES ? kDqTile + kConsumerWarpgroups * kDqTileBytes
                                             : kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kAtomBytes;        /* slack to align the base to 1024 */
    static_assert(kQ % kAtomBytes == 0 && kDO % kAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state, 4-byte A loads");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
    static_assert(kQTileBytes == KeymajorTiles<1>::kQTileBytes && kBlockQ == KeymajorTiles<1>::kBlockQ,
                  "the Q/dO tiles hopper_bwd_common.cuh's keymajor_fill_stage writes");
};
constexpr int kDsTileElems = Keys64TilePlan<true>::kDsBytes / 2; /* BF16 from one staged term to the next */
static_assert(kWarpgroupKeys == Keys64TilePlan<true>::kBlockQ && kTileKSteps == Keys64TilePlan<true>::kBlockQ / 16,
              "S^T per warpgroup is 64 x 64: 4 k-steps");

/* ---- the modes ---- */

/* The CTA every mode shares: two consumer warpgroups and a producer warpgroup (one warp of it works), the
   setmaxnreg split kProducerRegs / kConsumerRegs of the 384 threads' 168 registers each. With 24 / 240 (HS 128's
   split) repair spilled 32 bytes (the producer's fl(1/l) row state), 56 / 224 28; with a producer warp (288
   threads, 168 registers each) gproj's third A operand cost 92 bytes and fp32 spilled 8. */
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the 384-thread CTA is launched with (168 each)");

/* A mode's traits: Plan (its shared memory and kBlockQ, the queries of a step), kHangCycles (how long a wait
   runs before it gives up: hopper_bwd_common.cuh's mbar_wait_give_up sets the CTA's abort flag and the consumers
   write NaN), kProducerTraps (the producer traps once the CTA gave up; else it writes NaN over the items it took
   and the queue's rest: keymajor_produce_items), kSendsDq (dQ partials leave the CTA by TMA reduce-adds; the
   entry point takes dq_map), kLambda (the producer's keymajor_stage_row_state arm). What a mode does with S^T
   and dP^T is its block of keys64_pass's step, not a method here (kernel_keys128.cuh says why). */
template <int MODE>
struct Keys64Mode { /* bf16 and repair: 128-query steps, bf(dS) staging tiles of both warpgroups, a dQ tile each */
    static_assert(MODE == ATTN_BF16 || MODE == ATTN_REPAIR, "bf16 and repair (gproj and fp32 below)");
    using Plan = Keys64WidePlan;
    static constexpr bool kProducerTraps = false, kSendsDq = true;
    static constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz; a legitimate wait is microseconds */
    static constexpr int kLambda = kKeymajorNoLambda;
};

template <>
struct Keys64Mode<ATTN_GPROJ> { /* gproj: repair's P and dS, bf(-lambda P) into dK, no dQ (the row pass wrote it) */
    using Plan = Keys64TilePlan<false>;
    static constexpr bool kProducerTraps = true, kSendsDq = false;
    static constexpr long long kHangCycles = 20000000000ll; /* ~10 s at 1.98 GHz */
    static constexpr int kLambda = kKeymajorLambdaInW;
};

template <>
struct Keys64Mode<ATTN_FP32> { /* fp32: P and dS split into BF16 terms, dQ over three staged dS terms */
    using Plan = Keys64TilePlan<true>;
    static constexpr bool kProducerTraps = false, kSendsDq = true;
    static constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
    static constexpr int kLambda = kKeymajorNoLambda;
};

static_assert(Keys64WidePlan::kKeyTileBytes == KeymajorTiles<1>::kKeyTileBytes &&
                  kBlockK == KeymajorTiles<1>::kBlockK && Keys64WidePlan::kBoxBytes == KeymajorTiles<1>::kBoxBytes,
              "the K/V tiles hopper_bwd_common.cuh's keymajor_load_kv writes");

/* ---- the waits ---- */

/* this translation unit's hang record, set by its installer (hopper_lab_hooks.cuh, through
   attention_hopper_bwd_watch_hangs); NULL (the default): no record */
__device__ AttnHopperHang* g_hang_record;

/* Every wait of the kernel and the probes: it returns at once once the CTA gave up, and on running out (the mode's
   kHangCycles) records the site and sets *cta_abort (mbar_wait_give_up; no trap: under setmaxnreg a trap on the
   consumer path makes ptxas ignore setmaxnreg.inc). */
template <int MODE>
__device__ __forceinline__ void keys64_wait(uint64_t* bar, uint32_t parity, int site, int index, int* cta_abort) {
    mbar_wait_give_up<Keys64Mode<MODE>::kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* Barrier of the two consumer warpgroups (256 threads). Ids: 0 __syncthreads, 1 and 2 warpgroup_sync(0 / 1). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 3, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* The same barrier, returning whether `pred` was true in any consumer thread (named_bar_sync_any). */
__device__ __forceinline__ bool consumers_sync_any(bool pred) { return named_bar_sync_any(3, kConsumerThreads, pred); }

/* ---- bf16 and repair's steps (128 queries), per consumer warpgroup (kernel and probe share them) ---- */

/* Lane `lane` of the producer warp fills a stage: lane 0 announces the bytes and loads queries q0 .. q0 + 127 of
   Q and dO as two 64-row boxes each (a box starting at or past T reloads rows q0..: its queries are masked, and
   finite data keeps 0 * x = 0); the other lanes arrive (each after its row-state writes). */
__device__ __forceinline__ void fill_stage(unsigned char* q_stage, unsigned char* do_stage, const CUtensorMap* qkv_map,
                                           const CUtensorMap* dout_map, uint64_t* full_s, int q0, int T, int h, int NH,
                                           int b, int lane) {
    if (lane == 0) {
        mbar_arrive_expect_tx(full_s, 2 * Keys64WidePlan::kQTileBytes);
#pragma unroll
        for (int half = 0; half < kWideQ / kBoxRows; half++) {
            const int row = (q0 + half * kBoxRows < T) ? q0 + half * kBoxRows : q0;
            tma_load_4d(q_stage + half * Keys64WidePlan::kBoxBytes, qkv_map, full_s, 0, kSlotQ * NH + h, row, b);
            tma_load_4d(do_stage + half * Keys64WidePlan::kBoxBytes, dout_map, full_s, 0, h, row, b);
        }
    } else {
        mbar_arrive(full_s);
    }
}

/* acc = A B^T [64 keys x 128 queries] over the head dim, issued only: m64n128k16 SS, 4 k-steps; A the warpgroup's
   64 rows of K or V, B the stage's 128-row K-major Q or dO tile (SBO = one 8-row atom; its two TMA boxes are
   contiguous, so the swizzle continues across them). */
__device__ __forceinline__ void issue_scores_n128(float (&acc)[kWideScoreRegs], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
        const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n128k16_ss(acc, make_smem_desc(a_addr + off, kUnusedLbo, kAtomBytes),
                            make_smem_desc(b_addr + off, kUnusedLbo, kAtomBytes));
    }
}

/* S^T = K_w Q^T and dP^T = V_w dO^T (issue_scores_n128) as one commit group, waited for. Written, not
   accumulated. */
__device__ __forceinline__ void scores_n128(float (&st)[kWideScoreRegs], float (&dpt)[kWideScoreRegs], uint32_t kw_addr,
                                            uint32_t q_addr, uint32_t vw_addr, uint32_t do_addr) {
    two_gemms_written(st, dpt, [&] {
        issue_scores_n128(st, kw_addr, q_addr);
        issue_scores_n128(dpt, vw_addr, do_addr);
    });
}

/* P and dS in place of S^T and dP^T: mode_numerics.cuh's keymajor_probs_column over the 16 column blocks of
   a 128-query step (register 4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e; its row state rs[8j + 2t + e]).
   masked: the step reaches the warpgroup's keys or T; keys past the query and queries past T give exactly 0
   (MAY_MASK false: a step the caller knows is not masked, keymajor_probs_column's). */
template <int MODE, bool MAY_MASK>
__device__ __forceinline__ void probs_n128(float (&st)[kWideScoreRegs], float (&dpt)[kWideScoreRegs], const float4* rs,
                                           int q0, int key0, int t, int T, bool masked, float c) {
#pragma unroll
    for (int j = 0; j < kWideQ / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int ql = 8 * j + 2 * t + e, query = q0 + ql;
            const float4 row = rs[ql];
            keymajor_probs_column<MODE, MAY_MASK, kWideScoreRegs>(st, dpt, row, j, e, query, key0, T, masked, c);
        }
}

/* A 64 x 128 FP32 accumulator rounded to BF16 and packed as the register A operand over its 128 columns: k-step kk
   takes registers 8kk..8kk+7 (hopper_wgmma.cuh's pack_acc_a_operand, 8 k-steps instead of 4). */
__device__ __forceinline__ void pack_a_n128(uint32_t (&a)[kWideQSteps][4], const float (&acc)[kWideScoreRegs]) {
#pragma unroll
    for (int kk = 0; kk < kWideQSteps; kk++) {
        a[kk][0] = pack_bf16x2(acc[8 * kk + 0], acc[8 * kk + 1]); /* row g,   cols 2t, 2t+1 */
        a[kk][1] = pack_bf16x2(acc[8 * kk + 2], acc[8 * kk + 3]); /* row g+8, cols 2t, 2t+1 */
        a[kk][2] = pack_bf16x2(acc[8 * kk + 4], acc[8 * kk + 5]); /* row g,   cols 2t+8, 2t+9 */
        a[kk][3] = pack_bf16x2(acc[8 * kk + 6], acc[8 * kk + 7]); /* row g+8, cols 2t+8, 2t+9 */
    }
}

/* dV += bf(P)^T dO, dK += bf(dS)^T Q as one commit group (issued and committed; the caller waits): m64n64k16 RS,
   8 k-steps of 16 queries each over the stage's 128-row tiles read N-major (16 rows = 2048 bytes per k-step;
   k-steps 4..7 are in the second TMA box, 8 KB on). */
__device__ __forceinline__ void issue_dkv(float (&dv)[32], float (&dk)[32], uint32_t (&pa)[kWideQSteps][4],
                                          uint32_t (&pds)[kWideQSteps][4], uint32_t q_addr, uint32_t do_addr) {
    reg_fences(pa, pds, dv, dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWideQSteps; kk++)
        wgmma_m64n64k16_rs(dv, pa[kk], make_smem_desc(do_addr + kk * kWgmmaK * kRowBytes, kUnusedLboN64, kAtomBytes));
#pragma unroll
    for (int kk = 0; kk < kWideQSteps; kk++)
        wgmma_m64n64k16_rs(dk, pds[kk], make_smem_desc(q_addr + kk * kWgmmaK * kRowBytes, kUnusedLboN64, kAtomBytes));
    wgmma_commit();
}

/* The staging tile of the CTA's step `step` (by parity), [128 queries][kDsCtaPitch] BF16: both warpgroups write
   their bf(dS) to it (warpgroup wg keys 64 wg ..), each reads back its kDqRows query rows over all 128 keys. */
__device__ __forceinline__ bf16* ds_cta_tile(unsigned char* smem, int step) {
    return reinterpret_cast<bf16*>(smem + Keys64WidePlan::kDs + (step & 1) * Keys64WidePlan::kDsBytes);
}

/* dq = bf(dS)[64 queries][128 keys] K (64 x 64, reduced over the item's 128 keys): A loaded from the staging tile's
   rows at ds_rows in two 64-key halves (hopper_wgmma.cuh's load_staged_a_operand), K N-major as its two 64-row
   boxes from k_addr (warpgroup_rs_issue_n64); one commit group, waited for. The caller made both warpgroups'
   halves of the rows visible (consumer barrier). */
__device__ __forceinline__ void dq_rows(float (&dq)[32], const bf16* ds_rows, uint32_t k_addr, int warp_in_wg, int g,
                                        int t) {
    uint32_t a0[kTileKSteps][4], a1[kTileKSteps][4];
    load_staged_a_operand<kDsCtaPitch>(a0, ds_rows, warp_in_wg, g, t);
    load_staged_a_operand<kDsCtaPitch>(a1, ds_rows + kWarpgroupKeys, warp_in_wg, g, t);
#pragma unroll
    for (int k = 0; k < 32; k++) dq[k] = 0.f;
    reg_fences(a0, a1, dq);
    wgmma_fence();
    warpgroup_rs_issue_n64(dq, a0, k_addr);
    warpgroup_rs_issue_n64(dq, a1, k_addr + Keys64WidePlan::kBoxBytes);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fences(dq, a0, a1);
}

/* The 64 x 64 dQ partial into the warpgroup's FP32 tile: two 128B-swizzled boxes of 32 columns x 64 rows (8 KB
   each); float2 (row, cols 8n + 2t) is 16-byte chunk (2 (n % 4) + t / 2) ^ (row % 8) of row `row` of box n / 4.
   Rows 16 warp + g (+ 8): row % 8 = g. */
__device__ __forceinline__ void store_dq_tile(unsigned char* dq_tile, const float (&dq)[32], int warp_in_wg, int g,
                                              int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = 16 * warp_in_wg + g + 8 * r;
#pragma unroll
        for (int n = 0; n < kHS / 8; n++) {
            const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
            *reinterpret_cast<float2*>(dq_tile + (n >> 2) * Keys64WidePlan::kDqBoxBytes + row * kRowBytes +
                                       chunk * 16 + (t & 1) * 8) =
                make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
        }
    }
}

/* Thread 0 of a warpgroup: the tile's two boxes added to the accumulator rows q.. of head bh (rows past T are
   outside the map and skipped), one bulk group. */
__device__ __forceinline__ void send_dq_tile(const CUtensorMap* dq_map, const unsigned char* dq_tile, int q, int bh) {
    tma_reduce_add_3d(dq_map, dq_tile, 0, q, bh);
    tma_reduce_add_3d(dq_map, dq_tile + Keys64WidePlan::kDqBoxBytes, kDqCols, q, bh);
    bulk_commit_group();
}

/* A warpgroup's 64 x 64 dQ partial added to the accumulator: stored into the warpgroup's swizzled tile, fenced so
   the async proxy (TMA) sees the generic-proxy stores, then, once the whole warpgroup has stored, sent by its
   thread 0 with two reduce-adds when `send` (false past T: those rows are outside the map). */
__device__ __forceinline__ void flush_dq_tile(unsigned char* dq_tile, const float (&dq)[32], int wg, int warp_in_wg,
                                              int g, int t, bool send, const CUtensorMap* dq_map, int q, int bh) {
    store_dq_tile(dq_tile, dq, warp_in_wg, g, t);
    fence_proxy_async();
    warpgroup_sync(wg);
    if (send) send_dq_tile(dq_map, dq_tile, q, bh);
}

/* ---- fp32's steps (64 queries): the split terms (pack_split_step: mode_numerics.cuh) ---- */

/* dV += [bf(P), bf(P - bf(P))]^T dO, dK += [bf(dS), bf(r1)]^T Q: 16 m64n64k16 RS, one commit group (issued and
   committed only; the caller waits). */
__device__ __forceinline__ void issue_dkv_split_batch(float (&dv)[32], float (&dk)[32], uint32_t (&pa)[kTileKSteps][4],
                                                      uint32_t (&pa_lo)[kTileKSteps][4],
                                                      uint32_t (&pds)[kTileKSteps][4],
                                                      uint32_t (&pds_lo)[kTileKSteps][4], uint32_t q_addr,
                                                      uint32_t do_addr) {
    reg_fences(pa, pa_lo, pds, pds_lo, dv, dk);
    wgmma_fence();
    warpgroup_rs_issue_n64(dv, pa, do_addr);
    warpgroup_rs_issue_n64(dv, pa_lo, do_addr);
    warpgroup_rs_issue_n64(dk, pds, q_addr);
    warpgroup_rs_issue_n64(dk, pds_lo, q_addr);
    wgmma_commit();
}

/* dq += sum over the three staged terms of A[64 q x 64 keys] K[64 keys x 64 dims] (K N-major: hopper_wgmma.cuh's
   warpgroup_rs_issue_n64), over KEY_HALVES 64-key halves: term-major commit groups of 4 RS wgmmas into one
   accumulator, A loaded from each tile into two alternating register sets (a set is reloaded only after wait<1>
   says the group that read it completed: 32 A registers in flight, not 48 - with all three sets live ptxas
   serialised the wgmmas, C7512, at the 168 registers a 288-thread CTA gets). KEY_HALVES 1: the warpgroup's own
   tiles against K_w at k_addr (the layout probe's one warpgroup); 2 (the kernel's turns): tiles (keys 0..63) and
   tiles1 (keys 64..127), both warpgroups', against K's two 64-row boxes from k_addr. Returns with everything
   waited for. The caller zeroed dq and made the tiles visible (the probe: a warpgroup barrier; the kernel: the
   consumer barrier). */
template <int KEY_HALVES = 1>
__device__ __forceinline__ void warpgroup_dq_three_terms(float (&dq)[32], const bf16* tiles, uint32_t k_addr,
                                                         int warp_in_wg, int g, int t,
                                                         const bf16* tiles1 = nullptr) {
    uint32_t a0[kTileKSteps][4], a1[kTileKSteps][4];
    reg_fence(dq);
#pragma unroll
    for (int piece = 0; piece < KEY_HALVES * kDsTerms; piece++) {
        const int term = piece / KEY_HALVES, half = piece % KEY_HALVES;
        uint32_t (&a)[kTileKSteps][4] = (piece & 1) ? a1 : a0;
        if (piece >= 2) { /* the group that read this set (piece - 2) is the older of the two in flight */
            wgmma_wait<1>();
            reg_fence(a);
        }
        load_staged_a_operand<kDsPitch>(a, (half ? tiles1 : tiles) + term * kDsTileElems, warp_in_wg, g, t);
        reg_fence(a);
        wgmma_fence();
        warpgroup_rs_issue_n64(dq, a, k_addr + half * Keys64WidePlan::kBoxBytes);
        wgmma_commit();
    }
    wgmma_wait<0>();
    reg_fences(dq, a0, a1);
}

/* fp32: the named barrier by which the warpgroup that computed a step's dQ (bar.arrive, after its A loads) lets
   the other restage its terms at the next step (bar.sync): 256 threads. Ids 1-3: warpgroup_sync's and
   consumers_sync's. */
constexpr int kTermsFreeBarrier = 4;

/* ---- the kernel ---- */

/* The key-major pass at HS 64 of mode MODE (the instantiation file's comment has the mode's design). stats
   per row ({LSE} for bf16, {m, l} otherwise), D [B*NH*T] (and gproj's lambda) from the workspace; writes the
   k and v slots of dqkv; modes that send dQ add the s-less dQ partials to the accumulator behind dq_map.
   DQ_SLICES: the deterministic backward's per-key-block dQ slices (keymajor_dq_head; docs/determinism.md).
   cta_abort: the CTA's abort flag, set by a wait that gave up. The body of both entry points below (their
   parameter lists differ: gproj has lambda, no dq_map).
   Work items: a key block of 128 keys of a head each, ceil(T / 128) x heads (B * NH) of them in the longest-first
   order of tile_order.cuh. The grid is 1-D and a CTA runs items until none is left (hopper_bwd_common.cuh's
   keymajor_produce_items: the first from its position, then, in a persistent launch of fewer CTAs than items,
   each next one from a queue): the Q/dO stages and their phases run on over the CTA's items, the producer loads
   the next item's first stages while the consumers finish this one, the dQ reduce-adds are waited for once, at
   the end (dev/attention_lab/protocol_model.py plays this protocol under random interleavings). */
template <int MODE, bool DQ_SLICES>
__device__ __forceinline__ void keys64_pass(const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                                            const CUtensorMap* dq_map, const float* __restrict__ stats,
                                            const float* __restrict__ D, const float* __restrict__ lambda,
                                            bf16* __restrict__ dqkv, int NH, int T, float scale, float c,
                                            int section, int heads, int* cta_abort) {
    using Mode = Keys64Mode<MODE>;
    using Plan = typename Mode::Plan;
    constexpr int kBlockQ = Plan::kBlockQ;
    extern __shared__ unsigned char smem_raw[];
    /* the 1024-aligned base: one value, two forms (hopper_wgmma.cuh's function, the expression written out);
       they compile to different address arithmetic, and each mode keeps the code it was measured with */
    unsigned char* smem;
    if constexpr (kBlockQ == kWideQ)
        smem = aligned_smem_base(smem_raw);
    else
        smem = smem_raw + ((kAtomBytes - (smem_u32(smem_raw) & (kAtomBytes - 1))) & (kAtomBytes - 1));
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    constexpr int kKvBuffers = Plan::kKvBuffers, kStages = Plan::kStages;
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers); /* [kKvBuffers] */
    uint64_t* full = kv_full + kKvBuffers;
    uint64_t* empty = full + kStages;

    /* [kKvBuffers]: every consumer thread, after an item's last read of the buffer's K and V */
    uint64_t* kv_empty = empty + kStages;
    /* per K/V buffer the item whose K and V the producer loads into it, as it decoded it (no query tiles: none
       left), and the producer's own copy of the item it fills stages for */
    __shared__ KeymajorItem item_slot, item_slot1, taken_slot; /* item_slot1: kKvBuffers 2 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        *cta_abort = 0;
        /* full: 32 producer lanes (row state) + the TMA bytes; empty and kv_empty: every consumer thread, after
           its last read */
        for (int kb = 1; kb < kKvBuffers; kb++) {
            mbar_init(&kv_full[kb], 1); /* fenced with the others in init_pipeline_barriers */
            item_slot1.n_q_tiles = 0; /* not written yet: nothing for a give-up to poison */
        }
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads);
        for (int kb = 0; kb < kKvBuffers; kb++) mbar_init(&kv_empty[kb], kConsumerThreads); /* threads only */
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* its warps 1-3 have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of kBlockQ / 32 queries ---- */
        auto wait = [&](uint64_t* bar, uint32_t parity, int site, int index) {
            keys64_wait<MODE>(bar, parity, site, index, cta_abort);
        };
        /* a stage: its row state (fp32: {m, fl(1/l), D}, the repair arm; its stats are {m, l}), then every
           lane's arrival, which releases its own row-state writes (lane 0's also announces the TMA bytes) */
        auto fill = [&](int s, int q0, int bh, int h, int b) {
#pragma unroll
            for (int half = 0; half < kBlockQ / 64; half++)
                keymajor_stage_row_state<MODE, Mode::kLambda>(row_state + s * kBlockQ + 64 * half, nullptr,
                                                              stats, D, lambda, bh, T, q0 + 64 * half, lane);
            if constexpr (kBlockQ == kWideQ)
                fill_stage(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map,
                           &full[s], q0, T, h, NH, b, lane);
            else
                keymajor_fill_stage<1>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map,
                                       &dout_map, &full[s], q0, h, NH, b, lane);
        };
        auto load_kv = [&](int kb, int k0, int h, int b) {
            keymajor_load_kv<1>(k_s + kb * Plan::kKvBufferBytes, v_s + kb * Plan::kKvBufferBytes, &qkv_map,
                                &kv_full[kb], k0, T, h, NH, b);
        };
        keymajor_produce_items<kHS, kBlockQ, kStages, kKvBuffers, DQ_SLICES, Mode::kProducerTraps>(
            NH, T, section, heads, kv_full, empty, kv_empty, &item_slot, &item_slot1, &taken_slot, dqkv, cta_abort,
            lane, wait, fill, load_kv);
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63 of each item; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int tid_in_wg = threadIdx.x & 127; /* thread 0 of each warpgroup sends its dQ tile */
    const int key_row = warp_in_wg * 16 + g; /* within the warpgroup's 64 keys */
    /* the warpgroup's dQ tile (bf16, repair, fp32) */
    unsigned char* const dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
    int seq = 0; /* the CTA's steps before this item (the producer's count) */
#pragma unroll 1
    for (int use = 0;; use++) {
        /* the item is what the producer wrote to the buffer's slot before the phase of kv_full completed */
        const int kvb = use % kKvBuffers;
        keys64_wait<MODE>(&kv_full[kvb], (uint32_t)((use / kKvBuffers) & 1), ATTN_HANG_KV_FULL, kvb, cta_abort);
        const KeymajorItem& slot = *keymajor_slot<kKvBuffers>(kvb, &item_slot, &item_slot1);
        const int n_q_tiles = slot.n_q_tiles;
        if (n_q_tiles == 0) break;
        const int k0 = slot.k0, dq_head = slot.dq_head, qt_begin = slot.qt_begin;
        const uint32_t kw_addr = smem_u32(k_s) + kvb * Plan::kKvBufferBytes + wg * Plan::kBoxBytes;
        const uint32_t vw_addr = smem_u32(v_s) + kvb * Plan::kKvBufferBytes + wg * Plan::kBoxBytes;
        const int wg_key_first = k0 + wg * kWarpgroupKeys;
        /* one sum, two associations: they compile to different machine code, and each mode keeps the code it was
           measured with */
        const int key0 = (MODE == ATTN_GPROJ) ? k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g : wg_key_first + key_row;
        float dk[32], dv[32];
#pragma unroll
        for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

        __syncwarp();

#pragma unroll 1
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = (seq + i) % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            keys64_wait<MODE>(&full[s], (uint32_t)(((seq + i) / kStages) & 1), ATTN_HANG_FULL, s, cta_abort);
            __syncwarp();
            const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes);
            const uint32_t do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
            const float4* rs = row_state + s * kBlockQ;

            /* the mode's step; element 4j + 2r + e of st, dpt: key key0 + 8r, query q0 + 8j + 2t + e */
            if constexpr (kBlockQ == kWideQ) { /* bf16, repair */
                float st[kWideScoreRegs], dpt[kWideScoreRegs];
                /* P and dS, then their A operands; the mask can bite only where the step reaches the warpgroup's keys
                   or T */
                const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
                uint32_t pa[kWideQSteps][4], pds[kWideQSteps][4];
                scores_n128(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
                with_step_mask<kKeymajorSplitMask<MODE>>(masked, [&](auto mask) {
                    probs_n128<MODE, decltype(mask)::value>(st, dpt, rs, q0, key0, t, T, masked, c);
                    pack_a_n128(pa, st);
                    pack_a_n128(pds, dpt);
                });
                /* both warpgroups stage into the step's tile (by step parity: a warpgroup restages a tile only
                   after the consumer barrier of the step between, which the other passes after its A loads of it) */
                bf16* const ds_cta = ds_cta_tile(smem, seq + i);
                stage_ds_all<kDsCtaPitch>(ds_cta + wg * kWarpgroupKeys, pds, key_row, t);
                issue_dkv(dv, dk, pa, pds, q_addr, do_addr);
                /* the previous step's reduce-adds have read the warpgroup's dQ tile before it is rewritten */
                if (tid_in_wg == 0) bulk_wait_group_read<0>();
                consumers_sync(); /* the tile holds both warpgroups' bf(dS) */
                wgmma_wait<0>();
                reg_fences(dv, dk, pa, pds);
                mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
                float dq[32];
                dq_rows(dq, ds_cta + wg * kDqRows * kDsCtaPitch, smem_u32(k_s), warp_in_wg, g, t);
                flush_dq_tile(dq_tile, dq, wg, warp_in_wg, g, t, tid_in_wg == 0 && q0 + wg * kDqRows < T, dq_map,
                              q0 + wg * kDqRows, dq_head);
            } else if constexpr (MODE == ATTN_GPROJ) {
                float st[32], dpt[32];
                warpgroup_two_ss_64x64(st, dpt, kw_addr, q_addr, vw_addr, do_addr);

                /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions) and the three A operands, one
                   k-step (16 queries) at a time */
                const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
                uint32_t pa[kTileKSteps][4], pds[kTileKSteps][4], plam[kTileKSteps][4];
                with_step_mask<kKeymajorSplitMask<MODE>>(masked, [&](auto mask) {
#pragma unroll
                    for (int kk = 0; kk < kTileKSteps; kk++) {
                        float lam[2][2];
                        keymajor_probs_step<ATTN_REPAIR, decltype(mask)::value, true>(st, dpt, rs, kk, q0, t, key0, T,
                                                                                      masked, c, lam);
                        pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
                    }
                });

                /* dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: one batch of 12 wgmmas, the
                   two dK ones chained on the same accumulator (wgmma orders same-accumulator operations); P and
                   dS are dead while it runs (64 accumulator + 48 A registers in flight). */
                keymajor_gproj_dkv_batch<kHS>(dv, dk, pa, pds, plam, q_addr, do_addr);
                mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
            } else { /* fp32 */
                bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs + wg * Plan::kDsWarpgroupBytes);
                float st[32], dpt[32];
                warpgroup_two_ss_64x64(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
                const int step = seq + i; /* the CTA's step: its parity says whose turn dQ is */
                if (step > 0 && ((step - 1) & 1) != wg) /* the other warpgroup read these tiles at step - 1 */
                    named_bar_sync(kTermsFreeBarrier, kConsumerThreads);

                /* P, dS (attn_bwd_kernel's expressions, masked entries exactly 0), their four A words and the three
                   staged dS terms one k-step at a time. This warpgroup's previous dQ A loads of the staged tiles are
                   behind its last warpgroup barrier, the other's behind the barrier above. */
                const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
                uint32_t pa[kTileKSteps][4], pa_lo[kTileKSteps][4], pds[kTileKSteps][4], pds_lo[kTileKSteps][4];
                with_step_mask<kKeymajorSplitMask<MODE>>(masked, [&](auto mask) {
#pragma unroll
                    for (int kk = 0; kk < kTileKSteps; kk++)
                        keymajor_fp32_split_step<kDsPitch, kDsTileElems, decltype(mask)::value>(
                            st, dpt, rs, kk, q0, t, key0, T, masked, c, pa[kk], pa_lo[kk], pds[kk], pds_lo[kk],
                            ds_tiles, key_row);
                });
                issue_dkv_split_batch(dv, dk, pa, pa_lo, pds, pds_lo, q_addr, do_addr);
                /* the warpgroups take turns by step: the one whose turn it is computes the step's dQ over the
                   item's 128 keys from both warpgroups' staged terms and sends one 64-row partial from its dQ tile
                   (whose last send, two steps back, must have read it) */
                const bool my_turn = (step & 1) == wg;
                if (my_turn && tid_in_wg == 0) bulk_wait_group_read<0>();
                consumers_sync(); /* both warpgroups' three staged tiles are written */
                wgmma_wait<0>();
                reg_fences(dv, dk, pa, pa_lo, pds, pds_lo);
                mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
                if (my_turn) {
                    float dq[32];
#pragma unroll
                    for (int k = 0; k < 32; k++) dq[k] = 0.f;
                    warpgroup_dq_three_terms<2>(dq, reinterpret_cast<const bf16*>(smem + Plan::kDs),
                                                smem_u32(k_s) + kvb * Plan::kKvBufferBytes, warp_in_wg, g, t,
                                                reinterpret_cast<const bf16*>(smem + Plan::kDs +
                                                                              Plan::kDsWarpgroupBytes));
                    named_bar_arrive(kTermsFreeBarrier, kConsumerThreads); /* the other may restage its terms */
                    /* bf16's flush at 64 rows: the partial into the warpgroup's swizzled tile, then one thread adds
                       it to the accumulator with two TMA reduce-adds (rows past T are outside the map) */
                    flush_dq_tile(dq_tile, dq, wg, warp_in_wg, g, t, tid_in_wg == 0, dq_map, q0, dq_head);
                }
            }
        }
        /* the item's head, read here (live through the epilogue only), before the arrival below lets the producer
           rewrite the slot */
        const int b = slot.b, h = slot.h;
        mbar_arrive(&kv_empty[kvb]); /* this thread's GEMMs no longer read the item's K and V */
        /* any give-up of the CTA is visible to every consumer thread alike */
        const bool gave_up = consumers_sync_any(*static_cast<volatile int*>(cta_abort) != 0);
        /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t); NaN instead if
           a wait of this CTA gave up (its accumulators are garbage: the result must not look fine) */
        keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, gave_up);
        if (gave_up) break; /* the producer sees the give-up too (keymajor_produce_items) */
        seq += n_q_tiles;
    }
    /* the last reduce-adds complete before the CTA's shared memory goes away */
    if constexpr (Mode::kSendsDq)
        if (tid_in_wg == 0) bulk_wait_group<0>();
}

/* The entry point of the modes that send dQ partials (bf16, repair, fp32). */
template <int MODE, bool DQ_SLICES>
__global__ void __launch_bounds__(kThreads, 1)
    keys64_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                  const __grid_constant__ CUtensorMap dq_map, const float* __restrict__ stats,
                  const float* __restrict__ D, bf16* __restrict__ dqkv, int NH, int T, float scale, float c,
                  int section, int heads) {
    static_assert(Keys64Mode<MODE>::kSendsDq, "gproj's entry point is keys64_gproj_kernel");
    __shared__ int cta_abort; /* set by a bounded wait that gave up (keys64_wait) */
    keys64_pass<MODE, DQ_SLICES>(qkv_map, dout_map, &dq_map, stats, D, nullptr, dqkv, NH, T, scale, c, section,
                                 heads, &cta_abort);
}

/* gproj's entry point: lambda [B*NH*T] from the row pass, no dQ. A template (MODE = ATTN_GPROJ) so that only
   the gproj object emits it. */
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    keys64_gproj_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        const float* __restrict__ stats, const float* __restrict__ D,
                        const float* __restrict__ lambda, bf16* __restrict__ dqkv, int NH, int T, float scale,
                        float c, int section, int heads) {
    static_assert(MODE == ATTN_GPROJ, "the other modes' entry point is keys64_kernel");
    __shared__ int cta_abort; /* set by a bounded wait that gave up (keys64_wait) */
    keys64_pass<MODE, false>(qkv_map, dout_map, nullptr, stats, D, lambda, dqkv, NH, T, scale, c, section, heads,
                             &cta_abort);
}

/* ---- host ---- */

/* One launch of the pass of MODE on the call's tensors: the qkv / dout maps, the grid over the work items
   (hopper_item_grid: one CTA per SM taking its items from the queue, or with ATTN_BWD_PERSISTENT=0 one per item)
   and the PDL launch after the previous kernel of the chain; the modes that send dQ (bf16, repair, fp32) also the
   dQ accumulator's map (boxes of a step's queries x 32 FP32 columns; with c.dq_slices one slice per key block and
   the DQ_SLICES kernel), gproj lambda in its place. */
static_assert(kBlockK == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per CTA key block");
template <int MODE>
void keys64_launch(const HopperBwdCall& c) {
    using Mode = Keys64Mode<MODE>;
    constexpr int kAlloc = Mode::Plan::kAlloc;
    const AttnShape s = c.s;
    const char* const who = "attention (Hopper key-major pass, HS 64)"; /* in a tensor map's error */
    const HeadMaps maps = encode_qkv_dout_maps(s, c.qkv, c.dout, kBoxRows, who);
    const int n_key_blocks = ceil_div(s.T, kBlockK);
    const dim3 grid(hopper_item_grid((long long)n_key_blocks * s.B * s.NH,
                                     hopper_env_switch("ATTN_BWD_PERSISTENT", 1), who));
    if constexpr (MODE == ATTN_GPROJ) {
        cudaCheck(cudaFuncSetAttribute(keys64_gproj_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kAlloc));
        launch_after_previous_grid(1, keys64_gproj_kernel<MODE>, grid, dim3(kThreads), kAlloc, c.stream,
                                   maps.qkv, maps.dout, c.stats, c.D, c.lambda, c.dqkv, s.NH, s.T,
                                   attn_softmax_scale(kHS), attn_exp2_scale(kHS), attn_tile_section_gproj_hs64(s),
                                   s.B * s.NH);
    } else {
        const auto kernel = c.dq_slices ? keys64_kernel<MODE, true> : keys64_kernel<MODE, false>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kAlloc));
        /* 64-row boxes: a warpgroup's dQ rows of a 128-query step (bf16, repair), a 64-query step (fp32) */
        static_assert(Keys64TilePlan<true>::kBlockQ == kDqRows, "fp32's step is one box of the dQ map");
        const CUtensorMap dq_map = encode_dq_acc_map(c.dq_acc, s, kDqRows, who, c.dq_slices ? n_key_blocks : 1);
        launch_after_previous_grid(1, kernel, grid, dim3(kThreads), kAlloc, c.stream, maps.qkv, maps.dout,
                                   dq_map, c.stats, c.D, c.dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                                   attn_exp2_scale(kHS), attn_tile_section(s, kTileSectionQdOdQ), s.B * s.NH);
    }
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_CUH */
