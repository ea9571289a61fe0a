/*
 * attention/cuda/hopper/attention_hopper_bwd.cu - the Hopper (sm_90a) key-major causal attention backward of bf16 and
 * repair modes at head size 64 (dK, dV and the dQ reduce-adds) on wgmma + TMA, with 128-query steps and
 * setmaxnreg. The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh.
 *
 * Why: the portable backward (attention/cuda/attention_cuda.cu: prep, attn_bwd_kernel, dQ post-pass) is mma.sync
 * based; this kernel takes attn_bwd_kernel's place on sm_90 for bf16 and repair at HS 64. It steps through
 * 128 queries at a time (FA3's hdim-64 backward works on 128 x 128 blocks too; read in Dao-AILab/flash-attention
 * hopper/, no code copied): 64-query steps with one producer warp (the layout fp32's HS-64 pass keeps,
 * attention_hopper_bwd64_fp32.cu) make each consumer warpgroup wait on two barriers, fence, stage a 64 x 64 dS
 * tile and send a 16 KB dQ partial around small m64n64 GEMMs per step, and measure slower (the whole bf16
 * backward is 1.06x / 1.18x faster with 128-query steps at B8 H16 T1024 / B4 H16 T2048 d64, within 4 BF16 ulps:
 * dev/results/attention_hopper_2026-11-29.md). dev/attention_lab/hopper_bwd64_wide.cu is the harness that checks
 * and times this kernel.
 *
 * What it computes (docs/attention_numerics.md; attn_bwd_kernel's rounding points, operation for operation):
 *   per key tile, for each 128-query step from the diagonal on:
 *     S^T = K Q^T, dP^T = V dO^T           (FP32 accumulators, wgmma SS, M = 64 keys per warpgroup)
 *     P = exp2(fma(S, c, -fl(LSE log2 e)))  (bf16: __fmaf_rn)  or  exp2((S - m) c) * fl(1/l)  (repair)
 *     dS = P (dP - D)                       (FP32, masked entries exactly 0)
 *     dV += bf(P)^T dO,  dK += bf(dS)^T Q   (wgmma RS: the accumulator repacked as the A operand)
 *     dQ_acc += bf(dS) K                    (wgmma RS, A = bf(dS) staged through shared memory), the
 *                                           128 x 64 FP32 partial added to the workspace by TMA reduce-add
 *   dK = bf(s dK_acc), dV = bf(dV_acc) into dqkv; dQ = bf(s dQ_acc) is the caller's post-pass.
 * Only the order of the FP32 sums differs from attn_bwd_kernel (tensor-core k-loops of 128 queries; dQ
 * partials per 64 keys here, per 128 there), so dQ/dK/dV agree within a few BF16 ulps of the row scale.
 * DQ_SLICES (the deterministic backward, docs/determinism.md): the same kernel adds its partials into its key
 * block's own zeroed slice of the accumulator; the two warpgroups' adds onto zero commute, so the slice's
 * bits do not depend on their order.
 *
 * Layout: one CTA = 128 keys of one (b, h) (longest key tiles first over all heads, tile_order.cuh), 384
 * threads: consumer warpgroups 0 and 1 (64 keys each) and a producer warpgroup (warp 8 works: lane 0 issues
 * TMA, every lane writes the row state {a, b, D} of 4 queries; warps 9-11 leave at once); setmaxnreg 40 / 232
 * (128 * 40 + 256 * 232 = 384 * 168). K and V of the CTA are loaded once (two 64-row TMA boxes each); Q and dO
 * tiles of 128 queries (two 64-row boxes each; a box that starts at or past T loads the first box's rows again:
 * finite data under masked, zero-weight entries) in 2 stages (full: 32 producer lanes + the TMA bytes; empty:
 * the 256 consumer threads, released right after the dV/dK batch). Per step and consumer warpgroup:
 *   S^T, dP^T [64 keys x 128 queries]   m64n128k16 SS, 4 k-steps each, one commit group     64 + 64 regs
 *   P, dS in place, packed to BF16 A words (8 k-steps)                                       32 + 32 regs
 *   bf(dS) from the words to the warpgroup's staging tile [128 queries][64 + 8 keys]
 *   dV += bf(P)^T dO, dK += bf(dS)^T Q  m64n64k16 RS, 8 k-steps each over the 128-row N-major tiles
 *   (warpgroup barrier: the dS tile written; thread 0 first waited until its previous reduce-adds read the
 *    dQ tile)
 *   dQ rows 0-63 and 64-127 = bf(dS) K_w  two accumulators, m64n64k16 RS, A loaded from the staging tile
 *   the 128 x 64 FP32 partial into the warpgroup's 32 KB dQ tile (two 128B-swizzled boxes of 32 columns x 128
 *   rows), fence.proxy.async, warpgroup barrier, two TMA reduce-adds by thread 0 (rows past T: outside the map)
 * qkv [B, T, 3, NH, 64] and dout [B, T, NH, 64] are 4-D TMA tensors {HS, heads, T, B} (hopper_wgmma.cuh's
 * encode_head_map): rows past T read as zeros, per batch; shared tiles use the 128-byte swizzle (one 128-byte
 * row = 64 BF16). Launched with programmatic dependent launch (launch_overlap.cuh): after the barrier init
 * every thread waits for the prep kernel's grid (D, the zeroed accumulator) and lets the dQ post-pass launch.
 * Shared memory (SmemPlan): K, V 16 KB each; Q, dO 2 x 16 KB each; two 32 KB dQ tiles (one per warpgroup,
 * single-buffered: a second pair would pass 227 KB; the score phase separates a send from the next rewrite);
 * two dS staging tiles of 18 KB; row state 2 x 128 float4; barriers: 205864 bytes with the alignment slack
 * (one CTA per SM).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math; `make hopper_bwd64_wide-regs` prints them): both
 * kernel instantiations 168 at entry (232 after setmaxnreg.inc), 0 bytes spill, no C75xx; the probe's two
 * kernels 154 (scores) / 186, 0 spill. What ptxas forced (in the lab): 24 / 240 (HS 128's split) spilled 32 B
 * in repair (the producer's fl(1/l) row state), 56 / 224 28 B, hence 40 / 232; the probe writing S^T / dP^T in
 * the same kernel as the dV/dK GEMMs serialised its wgmmas (C7512), hence a launch of its own.
 *
 * Hangs: every mbarrier wait is bounded (~2 s of clock64; a legitimate wait is microseconds) and GIVES UP
 * instead of trapping (a __trap() on the consumer path makes ptxas ignore setmaxnreg.inc; docs/attention_kernels.md,
 * "Hangs"): hopper_bwd_common.cuh's mbar_wait_give_up records the barrier in the
 * host-mapped record that attention_hopper_bwd_watch_hangs installed (first give-up wins) and sets the CTA's
 * abort flag (every later wait of the CTA returns at once); the CTA runs to its end and its consumers, after a
 * barrier that makes every give-up of the CTA visible, write NaN over all their dK and dV rows. So a protocol
 * bug ends within seconds as NaN gradients and a named barrier (as HS 128), never a stuck job. Named barriers,
 * wgmma waits and setmaxnreg cannot be bounded (their counts are uniform by construction).
 * HS 128 is attention_hopper_bwd128.cu (its own layout: 64-query steps, dQ split by head-dimension halves);
 * attention_backward_hopper_keys below dispatches on s.HS.
 * Not done: dS staged K-major swizzled with dQ as SS wgmmas in the dV/dK batch (measured: the same speed
 * within noise; docs/attention_kernels.md's design table); overlap of the dQ GEMM with the next step's scores; a persistent schedule; fp32 and
 * gproj modes (their own key-major passes: attention_hopper_bwd64_fp32.cu, attention_hopper_bwd_gproj.cu).
 */
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

/* ------------------------------------------------------------------------------------------------ */
/* layout probe                                                                                      */
/* ------------------------------------------------------------------------------------------------ */

/* One warpgroup (128 threads) at warpgroup 1's offsets: K and V tokens 64..127 in the tiles' second 8 KB halves,
   Q and dO tokens 0..127 in stage 1 (through fill_stage, warp 0 as the producer lanes), warpgroup 1's staging
   and dQ tiles; one step, no softmax (P := S^T, dS := dP^T). Outputs (FP32, row-major, ProbeOut):
     st, dpt [64 keys][128 queries]; dv, dk [64 keys][64]; dq [128 queries][64] from the registers;
   and dq once more through the dQ tile and two TMA reduce-adds into dq_acc (the caller zeroed it; head `head`).
   Two launches (kPart): kProbeScores writes st and dpt only (with these stores in the same kernel as the GEMMs
   below, ptxas kept S^T, dP^T live next to dV, dK and serialised the wgmmas: C7512); kProbeGemms the rest
   through the kernel's helpers (its own S^T, dP^T: identical). */
enum ProbePart { kProbeScores = 0, kProbeGemms = 1 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq;
};
template <int REGS>
__device__ __forceinline__ void probe_write(float* dst, const float (&acc)[REGS], int row0, int g, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) dst[(row0 + g + 8 * r) * kCols + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
}
template <int kPart>
__global__ void __launch_bounds__(128, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        const __grid_constant__ CUtensorMap dq_map, int NH, int T, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* kv_bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* q_bar = kv_bar + 1;
    __shared__ int cta_abort;
    constexpr int kWg = 1; /* the offsets of consumer warpgroup 1 */
    unsigned char* k_half = smem + Plan::kK + kWg * Plan::kBoxBytes;
    unsigned char* v_half = smem + Plan::kV + kWg * Plan::kBoxBytes;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;   /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + kWg * Plan::kDsBytes);
    unsigned char* dq_tile = smem + Plan::kDqTile + kWg * Plan::kDqTileBytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(kv_bar, 1);
        mbar_init(q_bar, 32);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(kv_bar, 2 * Plan::kBoxBytes);
        tma_load_4d(k_half, &qkv_map, kv_bar, 0, kSlotK * NH + head, kWg * kBoxRows, 0);
        tma_load_4d(v_half, &qkv_map, kv_bar, 0, kSlotV * NH + head, kWg * kBoxRows, 0);
    }
    if (warp == 0) fill_stage(q_t, do_t, &qkv_map, &dout_map, q_bar, 0, T, head, NH, 0, lane);
    mbar_wait_bounded(kv_bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    mbar_wait_bounded(q_bar, 0, ATTN_HANG_PROBE, 1, &cta_abort);
    __syncwarp();
    const int key_row = warp * 16 + g;
    const uint32_t kw_addr = smem_u32(k_half), vw_addr = smem_u32(v_half);
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[kScoreRegs], dpt[kScoreRegs];
    scores_n128(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
    if constexpr (kPart == kProbeScores) {
        probe_write(out.st, st, warp * 16, g, t);
        probe_write(out.dpt, dpt, warp * 16, g, t);
        return;
    }
    uint32_t pa[kQSteps][4], pds[kQSteps][4];
    pack_a_n128(pa, st);
    pack_a_n128(pds, dpt);
    stage_ds(ds_s, pds, key_row, t);
    float dv[32], dk[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dv[i] = dk[i] = 0.f;
    issue_dkv(dv, dk, pa, pds, q_addr, do_addr);
    warpgroup_sync(0);
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(pa);
    reg_fence(pds);
    probe_write(out.dv, dv, warp * 16, g, t);
    probe_write(out.dk, dk, warp * 16, g, t);
    float dq0[32], dq1[32];
    dq_two_blocks(dq0, dq1, ds_s, kw_addr, warp, g, t);
    probe_write(out.dq, dq0, warp * 16, g, t);
    probe_write(out.dq, dq1, 64 + warp * 16, g, t);
    store_dq_block(dq_tile, dq0, 0, warp, g, t);
    store_dq_block(dq_tile, dq1, 1, warp, g, t);
    fence_proxy_async();
    warpgroup_sync(0);
    if (threadIdx.x == 0) {
        send_dq_tile(&dq_map, dq_tile, 0, head); /* B = 1: the accumulator's head index is the head */
        bulk_wait_group<0>();
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper backward, HS 64)";

constexpr size_t kTmaAlignBytes = 16; /* global address alignment TMA requires */

template <int MODE, bool DQ_SLICES>
void hopper_bwd_keys_launch(AttnShape s, const CUtensorMap& qkv_map, const CUtensorMap& dout_map, const float* stats,
                            const float* D, float* dq_acc, bf16* dqkv, cudaStream_t stream) {
    cudaCheck(cudaFuncSetAttribute(hopper_bwd_kernel<MODE, DQ_SLICES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    /* the reduce-adds' boxes are 128 rows (one step's queries) x 32 FP32 columns */
    const int n_key_blocks = ceil_div(s.T, kBlockK);
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho, DQ_SLICES ? n_key_blocks : 1);
    const dim3 grid((unsigned)n_key_blocks, (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, hopper_bwd_kernel<MODE, DQ_SLICES>, grid, dim3(kThreads), SmemPlan::kAlloc, stream,
                               qkv_map, dout_map, dq_map, stats, D, dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                               attn_exp2_scale(kHS));
}
static_assert(kBlockK == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per CTA key block");

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
                                    cudaStream_t stream, int dq_slices) {
    const AttnOptions no_options = {};
    if (!attention_hopper_bwd_supports(mode, no_options, s, qkv, dout)) {
        die("attention_backward_hopper_keys: unsupported call (mode %s, B=%d NH=%d T=%d HS=%d, qkv %p, dout %p)\n"
            "  hint: bf16 or repair mode, head size %d or %d, B*NH <= 65535, qkv and dout 16-byte aligned; use "
            "attention_backward_cuda, which falls back to the portable kernels",
            (int)mode >= 0 && mode < ATTN_NUM_MODES ? attn_mode_name(mode) : "?", s.B, s.NH, s.T, s.HS,
            (const void*)qkv, (const void*)dout, kHS, ATTN_HOPPER_BWD128_HS);
    }
    if (s.HS == ATTN_HOPPER_BWD128_HS) {
        attention_backward_hopper_keys128(mode, s, qkv, dout, stats, D, dq_acc, dqkv, stream, dq_slices);
        return;
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    if (mode == ATTN_BF16 && !dq_slices)
        hopper_bwd_keys_launch<ATTN_BF16, false>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else if (mode == ATTN_BF16)
        hopper_bwd_keys_launch<ATTN_BF16, true>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else if (!dq_slices)
        hopper_bwd_keys_launch<ATTN_REPAIR, false>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else
        hopper_bwd_keys_launch<ATTN_REPAIR, true>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
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
                                       float* tiles, float* dq_acc) {
    if (s.B != 1 || s.T > ATTN_HOPPER_BWD_PROBE_QUERIES || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_bwd_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d T=%d "
            "HS=%d head %d)", ATTN_HOPPER_BWD_PROBE_QUERIES, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    static_assert(ATTN_HOPPER_BWD_PROBE_KEYS == kWarpgroupKeys && ATTN_HOPPER_BWD_PROBE_QUERIES == kBlockQ,
                  "the probe covers one consumer warpgroup's keys and one query step");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho);
    const size_t n_st = (size_t)kWarpgroupKeys * kBlockQ, n_kv = (size_t)kWarpgroupKeys * kHS;
    ProbeOut o;
    o.st = tiles;
    o.dpt = o.st + n_st;
    o.dv = o.dpt + n_st;
    o.dk = o.dv + n_kv;
    o.dq = o.dk + n_kv;
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<1, 128, SmemPlan::kAlloc>>>(qkv_map, dout_map, dq_map, s.NH, s.T, head, o);
        cudaCheckLastError();
    };
    launch(layout_probe_kernel<kProbeScores>); /* S^T, dP^T */
    launch(layout_probe_kernel<kProbeGemms>);  /* dV, dK, dQ (registers and through the reduce-adds) */
}
