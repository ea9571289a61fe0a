/*
 * dev/attention_lab/hopper_bwd64_wide.cu - lab of a wider HS-64 key-major backward for bf16 and repair modes on
 * Hopper (sm_90a: wgmma + TMA): query steps of 128 rows instead of production's 64. Its own kernel and layout
 * probe (nothing of it is in the library), checked against the production backward (attention_backward_cuda,
 * default options = the Hopper key-major kernel of attention/attention_hopper_bwd.cu) and timed next to it.
 *
 * Why: at B8 H16 T1024 d64 our bf16 backward is 0.246 ms, cuDNN's 0.193 (H200). Per step of 64 queries each
 * consumer warpgroup of production waits on two barriers, fences, stages a 64 x 64 dS tile and sends a 16 KB
 * dQ partial; the GEMMs are small (m64n64). The hypothesis this lab tests: steps of 128 queries (N = 128 for
 * S^T and dP^T, k = 128 for dV and dK) halve those per-step costs and use larger wgmma shapes. FA3's hdim-64
 * backward (Dao-AILab/flash-attention hopper/, flash_bwd_launch_template.h: kBlockM = 128, kBlockN = 128, two
 * MMA warpgroups, setmaxnreg) works on 128 x 128 blocks too; read, no code copied.
 *
 * What it computes: production's rounding points exactly (docs/ATTENTION_NUMERICS.md; attention_hopper_bwd.cu):
 *   S^T = K_w Q^T, dP^T = V_w dO^T (FP32), P = recompute_prob<MODE> (hopper_bwd_common.cuh: bf16
 *   exp2(fma(S, c, -fl(LSE log2 e))), repair exp2((S - m) c) fl(1/l)), dS = P (dP - D), masked entries exactly 0;
 *   dV += bf(P)^T dO, dK += bf(dS)^T Q, dQ_acc += bf(dS) K (FP32; the s-less partial of the warpgroup's 64 keys
 *   reduce-added into the zeroed FP32 accumulator); dK = bf(s acc), dV = bf(acc). Only FP32 sum orders differ
 *   (k-loops of 128 queries). The workspace contract is production's: the portable prep wrote D and zeroed the
 *   accumulator, the portable dQ post-pass writes dQ = bf(s acc); this lab carries copies of both (they are
 *   file-local in attention_cuda.cu), checked by running the composition against the production backward.
 *
 * Layout: one CTA = 128 keys of one (b, h) (longest key tiles first, tile_order.cuh), 384 threads: consumer
 * warpgroups 0 and 1 (64 keys each) and a producer warpgroup (warp 8 works: lane 0 issues TMA, every lane
 * writes the row state {a, b, D} of 4 queries); setmaxnreg 40 / 232 (128 * 40 + 256 * 232 = 384 * 168).
 * Q and dO tiles of 128 queries (two 64-row TMA boxes each; a box that starts at or past T loads the first
 * box's rows again: finite data under masked, zero-weight entries) in 2 stages (full: 32 producer lanes + the
 * TMA bytes; empty: the 256 consumer threads, released right after the dV/dK batch). Per step and consumer
 * warpgroup:
 *   S^T, dP^T [64 keys x 128 queries]   m64n128k16 SS, 4 k-steps each, one commit group     64 + 64 regs
 *   P, dS in place, packed to BF16 A words (8 k-steps)                                       32 + 32 regs
 *   bf(dS) from the words to the warpgroup's staging tile [128 queries][64 + 8 keys]
 *   dV += bf(P)^T dO, dK += bf(dS)^T Q  m64n64k16 RS, 8 k-steps each over the 128-row N-major tiles
 *   (warpgroup barrier: the dS tile written; thread 0 first waited until its previous reduce-adds read the
 *    dQ tile)
 *   dQ rows 0-63 and 64-127 = bf(dS) K_w  two accumulators, m64n64k16 RS, A loaded from the staging tile
 *   the 128 x 64 FP32 partial into the warpgroup's 32 KB dQ tile (two 128B-swizzled boxes of 32 columns x 128
 *   rows), fence.proxy.async, warpgroup barrier, two TMA reduce-adds by thread 0 (rows past T: outside the map)
 * That is variant v0 (template kSsDq = false). Variant v1 (kSsDq = true) changes only the dQ path, FA3's way:
 * bf(dS) is staged K-major with the 128B swizzle ([128 queries][64 keys], 16 KB, fenced for the async proxy) and
 * dQ's two M blocks are m64n64k16 SS wgmmas (A = that tile, B = K_w N-major) issued right behind the dV/dK
 * wgmmas after the warpgroup barrier, one wait for all 24: no A-fragment loads, one wgmma wait per step instead
 * of two. Both variants are checked and timed.
 * Shared memory (SmemPlan): K, V 16 KB each; Q, dO 2 x 16 KB each; two 32 KB dQ tiles (one per warpgroup, single
 * buffered: a second pair would pass 227 KB; the score phase separates a send from the next rewrite); two dS
 * staging tiles of 18 KB (v1 uses 16 KB of each, 1024-aligned); row state 2 x 128 float4; barriers: 205864 bytes
 * with the alignment slack (one CTA per SM, as production's ~148 KB).
 * Registers (`make hopper_bwd64_wide-regs`, ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math): every
 * wide_bwd_kernel instantiation (bf16 / repair x v0 / v1) 168 at entry (232 after setmaxnreg.inc), 0 bytes spill,
 * no C75xx; probes 154 (scores) / 186 (v0) / 218 (v1), 0 spill, no C75xx. What ptxas forced: 24 / 240 (HS 128's
 * split) spilled 32 B in repair (the producer's row state), 56 / 224 28 B, so 40 / 232; the probe writing S^T /
 * dP^T in the same kernel as the dV/dK GEMMs serialised its wgmmas (C7512), hence a launch of its own; v1 without
 * an explicit wgmma.fence after zeroing the dQ accumulators got an injected one (C7519).
 *
 * Hangs: every mbarrier wait is bounded (~2 s of clock64) and GIVES UP instead of trapping (a trap on the
 * consumer path makes ptxas ignore setmaxnreg.inc): hopper_bwd_common.cuh's mbar_wait_give_up records the
 * barrier in the lab's host-mapped record and sets the CTA's abort flag; the CTA runs to its end and its
 * consumers write NaN over all their dK and dV rows, so a protocol bug is a named HANG line and NaN outputs.
 *
 * Checks (each group in a child process of its own; hopper_lab.cuh's lab_run_children):
 *   0. layout probe (one warpgroup at warpgroup 1's offsets: K, V tokens 64..127 in the tiles' second halves,
 *      Q, dO tokens 0..127 in stage 1 through the kernel's own stage fill, T = 100 so both the keys and the
 *      second query box are partly zero-filled): S^T, dP^T [64 x 128] (m64n128k16 SS over two boxes), dV, dK
 *      [64 x 64] (RS over 8 k-steps crossing the box boundary), dQ [128 x 64] (dS staged from words at pitch 72,
 *      two M blocks), and that dQ sent through the 32 KB swizzled tile and two TMA reduce-adds with 128-row boxes
 *      into a zeroed accumulator: bit-equal to the register values for rows < T, nothing written elsewhere;
 *      v1's dV, dK and dQ (swizzled staging, SS with B N-major) against the same double loops;
 *   1. bf16, 2. repair: per case and variant, forward, then the reference attention_backward_cuda (default options; its path
 *      must be "hopper"); (a) this kernel on the reference's own D (copied from its workspace) + the lab's
 *      post-pass; (b) the lab's whole backward (prep + kernel + post-pass) on poisoned buffers: dQ, dK, dV
 *      within 4 BF16 ulps of the row scale of the reference (hopper_bwd_fast's tolerance: FP32 sum order only,
 *      one flipped BF16 rounding of P or dS at most per element), every element finite;
 *   3. B8 H16 T1024 and B4 H16 T2048 (bf16; checked as above, then timed: medians of 21, warm inputs, queued
 *      behind a spin): the production backward, the lab's harness around the production kernel (same prep and
 *      post-pass as the wide one: the kernels compared alone), the production kernel alone, and per variant the
 *      wide backward and the wide kernel alone. Lines "time: vN: wide vs production N.NNx" (> 1: the wide one is
 *      faster), three per variant and shape.
 *
 * Usage: hopper_bwd64_wide   (no arguments; needs an sm_90 GPU). Ends with "N passed, N failed".
 * Status: written without a GPU, never run; compile-checked (ptxas above).
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

namespace wide64 {
using namespace hopper_wgmma;

constexpr int kHS = 64;                 /* the head size of this kernel */
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
constexpr int kProbeT = 100;                       /* the probe's tokens: keys 100..127 and queries 100..127 zero */
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

/* bounded waits that give up (the file comment); this translation unit's record pointer, set by watch_hangs */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz; a legitimate wait is microseconds */
__device__ AttnHopperHang* g_wide_hang;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_wide_hang);
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
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int idx = 4 * j + 2 * r + e;
                float p = 0.f, ds = 0.f;
                if (!masked || (key0 + 8 * r <= query && query < T)) {
                    p = recompute_prob<MODE>(st[idx], row.x, row.y, c);
                    ds = p * (dpt[idx] - row.z);
                }
                st[idx] = p;
                dpt[idx] = ds;
            }
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

/* ---- variant v1: bf(dS) staged K-major and 128B-swizzled, dQ read from it by SS wgmmas in the dV/dK batch ---- */

/* D[64 x 64] += A[64 x 16] B[16 x 64], A and B from shared memory: A K-major (imm-trans-a = 0), B N-major
   (imm-trans-b = 1: K_w stored [key][head dim]); scale-d true, no negation. hopper_wgmma.cuh's m64n64k16 SS with
   the B of its RS form (v1's one new instruction form; the probe checks it). */
__device__ __forceinline__ void wgmma_m64n64k16_ss_tb(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, acc, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

/* bf(dS^T) from its packed words to the warpgroup's swizzled staging tile [128 queries][64 keys] (16 KB, 1024-byte
   aligned): BF16 (q, key) at byte q * 128 + ((key / 8) ^ (q % 8)) * 16 + (key % 8) * 2, the 128B swizzle TMA
   writes for a K-major tile (keys are dQ's reduced dimension); words as stage_ds's. The writer fences the
   generic-proxy stores before the warpgroup barrier that precedes the wgmmas reading them (async proxy). */
__device__ __forceinline__ void stage_ds_swizzled(unsigned char* ds_sw, const uint32_t (&pds)[kQSteps][4], int key_row,
                                                  int t) {
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = key_row + 8 * (i & 1);
            const int q = 16 * kk + 8 * (i >> 1) + 2 * t; /* and q + 1: q even, so (q + 1) % 8 = q % 8 + 1 */
            const int within = (key & 7) * 2;
            *reinterpret_cast<unsigned short*>(ds_sw + q * kRowBytes + (((key >> 3) ^ (q & 7)) << 4) + within) =
                (unsigned short)(pds[kk][i] & 0xFFFFu);
            *reinterpret_cast<unsigned short*>(ds_sw + (q + 1) * kRowBytes + (((key >> 3) ^ ((q + 1) & 7)) << 4) +
                                               within) = (unsigned short)(pds[kk][i] >> 16);
        }
}

/* dq_blk += bf(dS)[queries 64 blk ..][64 keys] K_w for blk = 0, 1: 4 SS k-steps each, A = the swizzled staging tile
   (K-major: k-step kk at byte 32 kk of the rows, M block blk 8 KB on), B = K_w N-major (production's dQ B). Issued
   only: the caller fences, commits and waits. */
__device__ __forceinline__ void issue_dq_ss(float (&dq0)[32], float (&dq1)[32], uint32_t ds_sw_addr, uint32_t kw_addr) {
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        const uint64_t desc_b = make_smem_desc(kw_addr + kk * kWgmmaK * kRowBytes, kUnusedLboN64, kAtomBytes);
        const uint32_t col = kk * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n64k16_ss_tb(dq0, make_smem_desc(ds_sw_addr + col, kUnusedLbo, kAtomBytes), desc_b);
        wgmma_m64n64k16_ss_tb(dq1, make_smem_desc(ds_sw_addr + 64 * kRowBytes + col, kUnusedLbo, kAtomBytes), desc_b);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

/* kSsDq: variant v1 (dS staged swizzled, dQ as SS wgmmas in the dV/dK batch); false: v0 (dS staged padded, dQ as a
   second RS batch with A loaded from it, production's form) */
template <int MODE, bool kSsDq>
__global__ void __launch_bounds__(kThreads, 1)
    wide_bwd_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
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
        if constexpr (!kSsDq) {
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
        } else {
            /* the previous step's dQ wgmmas read the staging tile before its wait<0>, so it may be rewritten */
            stage_ds_swizzled(reinterpret_cast<unsigned char*>(ds_s), pds, key_row, t);
            fence_proxy_async(); /* the staged dS, before the async proxy (wgmma) reads it */
            issue_dkv(dv, dk, pa, pds, q_addr, do_addr); /* fences, issues and commits dV, dK */
            if (tid_in_wg == 0) bulk_wait_group_read<0>(); /* the dQ tile read by the previous reduce-adds */
            warpgroup_sync(wg); /* every warp's rows of the staging tile are written */
#pragma unroll
            for (int k = 0; k < 32; k++) dq0[k] = dq1[k] = 0.f;
            reg_fence(dq0);
            reg_fence(dq1);
            wgmma_fence(); /* the zeroed accumulators (without it ptxas injects one itself: C7519) */
            issue_dq_ss(dq0, dq1, smem_u32(ds_s), kw_addr);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(dv);
            reg_fence(dk);
            reg_fence(pa);
            reg_fence(pds);
            reg_fence(dq0);
            reg_fence(dq1);
            mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
        }
        store_dq_block(dq_tile, dq0, 0, warp_in_wg, g, t);
        store_dq_block(dq_tile, dq1, 1, warp_in_wg, g, t);
        fence_proxy_async(); /* the tile's generic-proxy stores, before the async proxy (TMA) reads them */
        warpgroup_sync(wg);  /* also: every A load of the staging tile is done before the next step restages */
        if (tid_in_wg == 0) send_dq_tile(&dq_map, dq_tile, q0, bh);
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
   and dQ tiles; one step, no softmax (P := S^T, dS := dP^T). Outputs (FP32, row-major):
     st, dpt [64 keys][128 queries]; dv, dk [64 keys][64]; dq [128 queries][64] from the registers;
   and dq once more through the dQ tile and two TMA reduce-adds into dq_acc (the caller zeroed it; head `head`).
   Three launches (kPart): kProbeScores writes st and dpt only; kProbeV0 the rest through v0's helpers; kProbeV1 dv,
   dk and dq through v1's (dS staged swizzled, dQ SS in the dV/dK batch) into dv_v1, dk_v1, dq_v1 (each launch its own
   S^T, dP^T: identical). */
enum ProbePart { kProbeScores = 0, kProbeV0 = 1, kProbeV1 = 2 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq, *dv_v1, *dk_v1, *dq_v1;
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
    wide_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
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
    if constexpr (kPart == kProbeScores) { /* a launch of its own: with these stores in the same kernel as the GEMMs below,
                                ptxas kept S^T, dP^T live next to dV, dK and serialised the wgmmas (C7512) */
        probe_write(out.st, st, warp * 16, g, t);
        probe_write(out.dpt, dpt, warp * 16, g, t);
        return;
    }
    uint32_t pa[kQSteps][4], pds[kQSteps][4];
    pack_a_n128(pa, st);
    pack_a_n128(pds, dpt);
    if constexpr (kPart == kProbeV1) { /* the kernel's v1 sequence */
        float dv[32], dk[32], dq0[32], dq1[32];
#pragma unroll
        for (int i = 0; i < 32; i++) dv[i] = dk[i] = 0.f;
        stage_ds_swizzled(reinterpret_cast<unsigned char*>(ds_s), pds, key_row, t);
        fence_proxy_async();
        issue_dkv(dv, dk, pa, pds, q_addr, do_addr);
        warpgroup_sync(0);
#pragma unroll
        for (int k = 0; k < 32; k++) dq0[k] = dq1[k] = 0.f;
        reg_fence(dq0);
        reg_fence(dq1);
        wgmma_fence();
        issue_dq_ss(dq0, dq1, smem_u32(ds_s), kw_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(dq0);
        reg_fence(dq1);
        probe_write(out.dv_v1, dv, warp * 16, g, t);
        probe_write(out.dk_v1, dk, warp * 16, g, t);
        probe_write(out.dq_v1, dq0, warp * 16, g, t);
        probe_write(out.dq_v1, dq1, 64 + warp * 16, g, t);
        return;
    }
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

/* ---- host: maps, launches ---- */

constexpr const char* kWho = "hopper_bwd64_wide lab (HS-64 key-major backward, 128-query steps)";

void watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_wide_hang, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

/* The wide key-major kernel alone (variant 0 or 1, the kernel's kSsDq; asynchronous): reads qkv, dout, stats, D; adds s-less dQ partials into dq_acc
   (zeroed by the caller, or meant to accumulate); writes the k and v slots of dqkv. */
void launch_pass(int variant, AttnMode mode, AttnShape s, const bf16* qkv, const bf16* dout, const float* stats,
                 const float* D, float* dq_acc, bf16* dqkv, cudaStream_t stream) {
    if ((mode != ATTN_BF16 && mode != ATTN_REPAIR) || s.HS != kHS || s.B < 1 || s.NH < 1 || s.T < 1 ||
        (long long)s.B * s.NH > 65535 || ((uintptr_t)qkv % 16) != 0 || ((uintptr_t)dout % 16) != 0)
        die("%s: unsupported call (mode %d, B=%d NH=%d T=%d HS=%d)\n  hint: bf16 or repair, HS 64, B*NH <= 65535,"
            " 16-byte aligned qkv and dout", kWho, (int)mode, s.B, s.NH, s.T, s.HS);
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho);
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<grid, kThreads, SmemPlan::kAlloc, stream>>>(qkv_map, dout_map, dq_map, stats, D, dqkv, s.NH, s.T,
                                                              attn_softmax_scale(kHS), attn_exp2_scale(kHS));
        cudaCheckLastError();
    };
    if (variant == 0) {
        if (mode == ATTN_BF16) launch(wide_bwd_kernel<ATTN_BF16, false>);
        else launch(wide_bwd_kernel<ATTN_REPAIR, false>);
    } else {
        if (mode == ATTN_BF16) launch(wide_bwd_kernel<ATTN_BF16, true>);
        else launch(wide_bwd_kernel<ATTN_REPAIR, true>);
    }
}

/* The probe on qkv [1, T, 3, NH, 64], dout [1, T, NH, 64], T <= 128: outputs as ProbeOut (device), dq_acc
   [NH][T][64] FP32 zeroed by the caller. */
void layout_probe(AttnShape s, int head, const bf16* qkv, const bf16* dout, ProbeOut o, float* dq_acc) {
    if (s.B != 1 || s.T > kBlockQ || head < 0 || head >= s.NH || s.HS != kHS)
        die("%s: the probe needs B = 1, T <= %d, 0 <= head < NH, HS 64 (got B=%d NH=%d T=%d HS=%d head %d)", kWho,
            kBlockQ, s.B, s.NH, s.T, s.HS, head);
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho);
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<1, 128, SmemPlan::kAlloc>>>(qkv_map, dout_map, dq_map, s.NH, s.T, head, o);
        cudaCheckLastError();
    };
    launch(wide_probe_kernel<kProbeScores>); /* S^T, dP^T */
    launch(wide_probe_kernel<kProbeV0>);     /* dV, dK, dQ (registers and through the reduce-adds) */
    launch(wide_probe_kernel<kProbeV1>);     /* dV, dK, dQ through v1's helpers */
}

}  // namespace wide64

/* ------------------------------------------------------------------------------------------------ */
/* host: prep and post-pass copies, checks and timing                                                */
/* ------------------------------------------------------------------------------------------------ */

typedef __nv_bfloat16 bf16;
static const int kHS = wide64::kHS;

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* D and the zeroed dQ accumulator: attention_cuda.cu's attn_bwd_prep_kernel<64> (file-local there; its session-6
   form with 16-byte loads, without the programmatic-launch trigger): 8 lanes per row, each loads 8 BF16 of O and dO
   and zeroes 8 accumulator floats; 256 threads = 32 rows per block, grid (T / 32, B * NH). */
constexpr int kPrepThreads = 256, kPrepLanesPerRow = kHS / 8, kPrepRowsPerBlock = kPrepThreads / kPrepLanesPerRow;
__global__ void __launch_bounds__(kPrepThreads) lab_prep(const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                                         float* __restrict__ D, float* __restrict__ dq_acc, int NH,
                                                         int T) {
    const int tok = blockIdx.x * kPrepRowsPerBlock + threadIdx.x / kPrepLanesPerRow;
    const int d = (threadIdx.x % kPrepLanesPerRow) * 8, bh = blockIdx.y;
    const bool active = tok < T; /* no early return: whole warps take part in the shuffle */
    const long long row = (long long)bh * T + tok;
    float sum = 0.f;
    if (active) {
        float4* acc = reinterpret_cast<float4*>(dq_acc + row * kHS + d);
        acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        const int b = bh / NH, h = bh % NH;
        const long long off = ((long long)b * T + tok) * NH * kHS + (long long)h * kHS + d;
        const uint4 o8 = __ldg(reinterpret_cast<const uint4*>(out + off));
        const uint4 g8 = __ldg(reinterpret_cast<const uint4*>(dout + off));
        const uint32_t ow[4] = {o8.x, o8.y, o8.z, o8.w}, gw[4] = {g8.x, g8.y, g8.z, g8.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ow[k]));
            const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gw[k]));
            sum += gf.x * of.x;
            sum += gf.y * of.y;
        }
    }
#pragma unroll
    for (int k = kPrepLanesPerRow / 2; k >= 1; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
    if (active && d == 0) D[row] = sum;
}

/* dQ = bf(s acc) into the q slot of dqkv: attn_bwd_dq_kernel<64> (file-local there), 8 elements per thread,
   grid (T * 8 / 256, B * NH); dqkv 16-byte aligned (cudaMalloc). */
__global__ void lab_postpass(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T, float scale) {
    constexpr int kChunks = kHS / 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * kChunks) return;
    const int tok = (int)(i / kChunks), d = (int)(i % kChunks) * 8;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const float4* src = reinterpret_cast<const float4*>(dq_acc + ((long long)bh * T + tok) * kHS + d);
    const float4 lo = src[0], hi = src[1];
    using hopper_wgmma::pack_bf16x2;
    const uint4 packed = make_uint4(pack_bf16x2(lo.x * scale, lo.y * scale), pack_bf16x2(lo.z * scale, lo.w * scale),
                                    pack_bf16x2(hi.x * scale, hi.y * scale), pack_bf16x2(hi.z * scale, hi.w * scale));
    *reinterpret_cast<uint4*>(dqkv + ((long long)b * T + tok) * 3LL * NH * kHS + (long long)h * kHS + d) = packed;
}

/* workspace: production's layout (carve_workspace in attention_cuda.cu): dq_acc [rows * HS], D [rows], lambda */
static float* ws_dq_acc(void* ws) { return (float*)ws; }
static float* ws_D(void* ws, AttnShape s) { return (float*)ws + (size_t)s.B * s.NH * s.T * s.HS; }

static void launch_prep(AttnShape s, const bf16* out, const bf16* dout, void* ws, cudaStream_t st) {
    lab_prep<<<dim3((unsigned)ceil_div(s.T, kPrepRowsPerBlock), (unsigned)(s.B * s.NH)), kPrepThreads, 0, st>>>(
        out, dout, ws_D(ws, s), ws_dq_acc(ws), s.NH, s.T);
    cudaCheckLastError();
}
static void launch_postpass(AttnShape s, void* ws, bf16* dqkv, cudaStream_t st) {
    const dim3 grid((unsigned)ceil_div((long long)s.T * (kHS / 8), 256), (unsigned)(s.B * s.NH));
    lab_postpass<<<grid, 256, 0, st>>>(ws_dq_acc(ws), dqkv, s.NH, s.T, attn_softmax_scale(kHS));
    cudaCheckLastError();
}

/* The lab's variants of the key-major pass: production's kernel (attention_backward_hopper_keys) and the wide
   kernel's two (wide64::launch_pass's variant 0 / 1). */
enum { kPassProduction = -1, kPassWideV0 = 0, kPassWideV1 = 1 };
static const int kWideVariants = 2;
static const char* kWideName[kWideVariants] = {"wide v0 (dS staged padded, dQ a second RS batch)",
                                               "wide v1 (dS staged swizzled, dQ SS in the dV/dK batch)"};

/* The whole backward with key-major pass `pass` (kPass*) between the same prep and post-pass copies. Overwrites
   dqkv; ws: attention_cuda_workspace_bytes(s, mode) bytes. */
static void lab_backward(int pass, AttnMode mode, AttnShape s, const bf16* qkv, const bf16* out, const float* stats,
                         const bf16* dout, bf16* dqkv, void* ws, cudaStream_t st) {
    launch_prep(s, out, dout, ws, st);
    if (pass != kPassProduction) wide64::launch_pass(pass, mode, s, qkv, dout, stats, ws_D(ws, s), ws_dq_acc(ws), dqkv, st);
    else attention_backward_hopper_keys(mode, s, qkv, dout, stats, ws_D(ws, s), ws_dq_acc(ws), dqkv, st);
    launch_postpass(s, ws, dqkv, st);
}

/* A synchronisation result plus the hang record: on either, one FAIL line naming the barrier (or the CUDA error),
   then the child reports its counts and ends. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return;
    if (hung)
        CHECK(0, "HANG in %s: mbarrier %s never completed (index %d, parity %d, block (%d, %d), thread %d); the CTA"
              " gave up and wrote NaN over its dK/dV rows", where, attn_hopper_hang_site_name(r->site), r->index,
              r->parity, r->block_x, r->block_y, r->thread);
    if (e != cudaSuccess)
        CHECK(0, "CUDA error after %s: %s (hint: run under compute-sanitizer)", where, cudaGetErrorString(e));
    lab_child_report_and_exit();
}

static const double kMaxUlps = 4.0; /* the file comment's tolerance, fixed before any run */
static const char* kSlotName[3] = {"dQ", "dK", "dV"};

static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs production: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n",
           what, kSlotName[slot], d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: the production backward has every element finite (%zu NaN)", kSlotName[slot], d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left of the poison or from a give-up)", what,
          kSlotName[slot], d.nan_new);
    CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of production (max %.2f)", what, kSlotName[slot],
          kMaxUlps, d.max_ulps);
}

struct CheckCase {
    AttnMode mode;
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

static void check_case(CheckCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = in.mode;
    char title[200];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d q x%g key offset %g: wide (128-query steps) vs production",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes >= (rows * s.HS + rows) * sizeof(float),
          "workspace holds dq_acc[rows*HS] + D[rows] fp32 (%zu bytes; carve_workspace's layout, which this lab reads)",
          ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_new;
    float* stats;
    void *ws_ref, *ws_new;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_new, ws_bytes);
    const AttnOptions opt = {};
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const AttnBwdPath path = attention_backward_cuda_path(mode, opt, s, qkv, dout);
    CHECK(path == ATTN_BWD_HOPPER, "the reference (attention_backward_cuda, default options) takes the Hopper path"
          " (got %s): production's key-major kernel is what the wide one is compared with", attn_bwd_path_name(path));

    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, st);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the production backward");
    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));

    for (int v = 0; v < kWideVariants; v++) {
        char what[160];
        /* (a) the wide kernel on the reference's own D (zeroed accumulator, NaN dqkv), then the lab's post-pass */
        cudaCheck(cudaMemsetAsync(dqkv_new, 0xFF, nqkv * 2, st));
        cudaCheck(cudaMemsetAsync(ws_dq_acc(ws_new), 0, rows * s.HS * sizeof(float), st));
        cudaCheck(cudaMemcpyAsync(ws_D(ws_new, s), ws_D(ws_ref, s), rows * sizeof(float), cudaMemcpyDeviceToDevice, st));
        wide64::launch_pass(v, mode, s, qkv, dout, stats, ws_D(ws_new, s), ws_dq_acc(ws_new), dqkv_new, st);
        launch_postpass(s, ws_new, dqkv_new, st);
        snprintf(what, sizeof what, "(a) %s on production's D + the lab's post-pass", kWideName[v]);
        sync_or_report(cudaStreamSynchronize(st), what);
        cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "(a) v%d on production's D:", v);
        for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, what);

        /* (b) the lab's whole backward on poisoned buffers */
        cudaCheck(cudaMemsetAsync(dqkv_new, 0xFF, nqkv * 2, st));
        cudaCheck(cudaMemsetAsync(ws_new, 0xFF, ws_bytes, st));
        lab_backward(v, mode, s, qkv, out, stats, dout, dqkv_new, ws_new, st);
        snprintf(what, sizeof what, "(b) the lab's whole backward with %s (prep + kernel + post-pass)", kWideName[v]);
        sync_or_report(cudaStreamSynchronize(st), what);
        cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "(b) v%d whole backward:", v);
        for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, what);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t ev[kReps + 1];
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventCreate(&ev[r]));
        auto time_of = [&](auto fn, const char* what) {
            float tm[kReps];
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
            for (int i = 0; i < kReps; i++) cudaCheck(cudaEventElapsedTime(&tm[i], ev[i], ev[i + 1]));
            return median_ms(tm, kReps);
        };
        /* the key-major kernel's 5 causal BF16 GEMMs: S^T, dP^T, dV, dK, dQ */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        auto run_prod = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        auto run_prod_lab = [&]() { lab_backward(kPassProduction, mode, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        /* alone: it keeps adding into the accumulator (its values no longer matter) */
        auto run_prod_kernel = [&]() {
            attention_backward_hopper_keys(mode, s, qkv, dout, stats, ws_D(ws_ref, s), ws_dq_acc(ws_ref), dqkv_ref, st);
        };
        const float ms_prod = time_of(run_prod, "timing the production backward");
        const float ms_prod_lab = time_of(run_prod_lab, "timing the lab harness around the production kernel");
        const float ms_prod_kernel = time_of(run_prod_kernel, "timing the production key-major kernel alone");
        printf("  time (median of %d, warm inputs, queued behind a spin): production backward (attention_backward_cuda,"
               " path %s) %.4f ms; lab harness (lab prep + production kernel + lab post-pass) %.4f ms; production"
               " kernel alone %.4f ms (%.1f TFLOP/s, 5 causal GEMMs)\n", (int)kReps,
               attn_bwd_path_name(attention_backward_cuda_path(mode, opt, s, qkv, dout)), ms_prod, ms_prod_lab,
               ms_prod_kernel, 5.0 * gemm / ms_prod_kernel * 1e-9);
        for (int v = 0; v < kWideVariants; v++) {
            auto run_wide = [&]() { lab_backward(v, mode, s, qkv, out, stats, dout, dqkv_new, ws_new, st); };
            auto run_wide_kernel = [&]() {
                wide64::launch_pass(v, mode, s, qkv, dout, stats, ws_D(ws_new, s), ws_dq_acc(ws_new), dqkv_new, st);
            };
            const float ms_wide = time_of(run_wide, "timing the wide backward");
            const float ms_wide_kernel = time_of(run_wide_kernel, "timing the wide kernel alone");
            printf("  time: %s: backward (lab prep + kernel + lab post-pass) %.4f ms, kernel alone %.4f ms (%.1f"
                   " TFLOP/s)\n", kWideName[v], ms_wide, ms_wide_kernel, 5.0 * gemm / ms_wide_kernel * 1e-9);
            printf("  time: v%d: wide vs production %.2fx (whole backward, production's own prep/post-pass vs the lab's"
                   " copies)\n", v, ms_prod / ms_wide);
            printf("  time: v%d: wide vs production %.2fx (whole backward, the same lab prep/post-pass around both)\n", v,
                   ms_prod_lab / ms_wide);
            printf("  time: v%d: wide vs production %.2fx (key-major kernels alone)\n", v, ms_prod_kernel / ms_wide_kernel);
        }
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventDestroy(ev[r]));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_new));
}

/* The layout probe on B1 NH3 T100 HS64 (head 1) against double loops over the same BF16 values. */
static void layout_probe(void) {
    test_section("layout probe HS64, 128-query step: S^T, dP^T (m64n128k16 SS over two boxes), dV, dK (RS, 8 k-steps"
                 " across the box boundary), dQ (dS staged [128][72], two M blocks), dQ through the 32 KB tile + TMA"
                 " reduce-add (128-row boxes)");
    const AttnShape ps = {1, 3, wide64::kProbeT, kHS};
    ProbeInputs in = probe_inputs_make_shape(ps, 1);
    enum { kQ = 0, kK = 1, kV = 2 };
    const int nk = 64, nq = wide64::kBlockQ, key_base = 64; /* warpgroup 1's keys: tokens 64..127 */
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS, n_dq = (size_t)nq * kHS;
    const size_t total = 2 * n_st + 4 * n_kv + 2 * n_dq;
    const size_t acc_elems = (size_t)ps.NH * ps.T * kHS;
    float *d_out, *d_acc;
    lab_alloc_poisoned(&d_out, total * 4);
    cudaCheck(cudaMalloc(&d_acc, acc_elems * 4));
    cudaCheck(cudaMemset(d_acc, 0, acc_elems * 4));
    wide64::ProbeOut o;
    o.st = d_out;
    o.dpt = o.st + n_st;
    o.dv = o.dpt + n_st;
    o.dk = o.dv + n_kv;
    o.dq = o.dk + n_kv;
    o.dv_v1 = o.dq + n_dq;
    o.dk_v1 = o.dv_v1 + n_kv;
    o.dq_v1 = o.dk_v1 + n_kv;
    wide64::layout_probe(ps, in.head, in.qkv, in.dout, o, d_acc);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    float* h_acc = (float*)mallocCheck(acc_elems * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_acc, d_acc, acc_elems * 4, cudaMemcpyDeviceToHost));
    const float *g_st = h, *g_dpt = h + n_st, *g_dv = g_dpt + n_st, *g_dk = g_dv + n_kv, *g_dq = g_dk + n_kv;
    const float *g_dv_v1 = g_dq + n_dq, *g_dk_v1 = g_dv_v1 + n_kv, *g_dq_v1 = g_dk_v1 + n_kv;
    double* ref = (double*)mallocCheck(n_st * sizeof(double));
    double* mag = (double*)mallocCheck(n_st * sizeof(double));
    lab_probe_product(ref, mag, nk, nq, kHS,
                      [&](int i, int j, int d) { return probe_qkv(in, key_base + i, kK, d) * probe_qkv(in, j, kQ, d); });
    CHECK(lab_probe_compare("S^T = K Q^T", g_st, ref, mag, nk, nq) == 0,
          "S^T = K_w Q^T: m64n128k16 SS, B = the 128-row Q tile (two boxes, stage 1), A = warpgroup 1's K half");
    lab_probe_product(ref, mag, nk, nq, kHS,
                      [&](int i, int j, int d) { return probe_qkv(in, key_base + i, kV, d) * probe_dout(in, j, d); });
    CHECK(lab_probe_compare("dP^T = V dO^T", g_dpt, ref, mag, nk, nq) == 0,
          "dP^T = V_w dO^T: m64n128k16 SS, the dout map's 128-row tile");
    lab_probe_product(ref, mag, nk, kHS, nq,
                      [&](int i, int n, int q) { return bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n); });
    CHECK(lab_probe_compare("dV = bf(S^T) dO", g_dv, ref, mag, nk, kHS) == 0,
          "dV = bf(S^T) dO: 8 register-A k-steps (pack_a_n128), dO N-major across its two boxes");
    CHECK(lab_probe_compare("v1: dV = bf(S^T) dO", g_dv_v1, ref, mag, nk, kHS) == 0,
          "v1: dV = bf(S^T) dO (the same form, in v1's batch)");
    lab_probe_product(ref, mag, nk, kHS, nq,
                      [&](int i, int n, int q) { return bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kQ, n); });
    CHECK(lab_probe_compare("dK = bf(dP^T) Q", g_dk, ref, mag, nk, kHS) == 0,
          "dK = bf(dP^T) Q: the Q tile read N-major across its two boxes after being read K-major");
    CHECK(lab_probe_compare("v1: dK = bf(dP^T) Q", g_dk_v1, ref, mag, nk, kHS) == 0,
          "v1: dK = bf(dP^T) Q (the same form, in v1's batch)");
    lab_probe_product(ref, mag, nq, kHS, nk, [&](int q, int n, int k) {
        return bf16_round(g_dpt[k * nq + q]) * probe_qkv(in, key_base + k, kK, n);
    });
    CHECK(lab_probe_compare("dQ = bf(dP^T)^T K", g_dq, ref, mag, nq, kHS) == 0,
          "dQ = bf(dS) K_w: dS staged from words into [128 queries][72], two 64-query M blocks, K_w N-major");
    CHECK(lab_probe_compare("v1: dQ = bf(dP^T)^T K", g_dq_v1, ref, mag, nq, kHS) == 0,
          "v1 (NEW forms): dS staged K-major 128B-swizzled [128 queries][64 keys], dQ = m64n64k16 SS with A from it"
          " (K-major) and B = K_w N-major (imm-trans-b 1), two M blocks 8 KB apart, in the dV/dK commit group");
    /* the same dQ through the swizzled tile and the reduce-adds: rows < T of the probed head bit-equal to the
       registers (added to zeros), every other element of the accumulator still 0 */
    size_t wrong_rows = 0, stray = 0;
    for (int hh = 0; hh < ps.NH; hh++)
        for (int q = 0; q < ps.T; q++)
            for (int n = 0; n < kHS; n++) {
                const float got = h_acc[((size_t)hh * ps.T + q) * kHS + n];
                if (hh == in.head) {
                    if (!(got == g_dq[q * kHS + n])) {
                        if (wrong_rows++ < 3)
                            printf("  dq_acc[head %d][%d][%d] = %.6g, want %.6g (the register value)\n", hh, q, n,
                                   got, g_dq[q * kHS + n]);
                    }
                } else if (got != 0.f) {
                    stray++;
                }
            }
    printf("  dQ via the tile and TMA reduce-add: %zu of %d wrong in the probed head, %zu non-zero elsewhere\n",
           wrong_rows, ps.T * kHS, stray);
    CHECK(wrong_rows == 0, "dQ through the 32 KB swizzled FP32 tile (two 16 KB boxes of 32 columns x 128 rows) and two"
          " TMA reduce-adds equals the register dQ bit for bit (rows < T)");
    CHECK(stray == 0, "the reduce-adds wrote nothing outside the probed head's rows < T (rows past T are outside the"
          " 128-row boxes' map)");
    free(ref); free(mag); free(h); free(h_acc);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_acc));
}

/* lab_watch_hangs installs the production kernels' record; this file's kernels get the same mapped record */
static void watch_hangs_here(void) {
    lab_watch_hangs();
    AttnHopperHang* dev = NULL;
    cudaCheck(cudaHostGetDevicePointer((void**)&dev, g_lab_hang, 0));
    wide64::watch_hangs(dev);
}

static void run_child(int child) {
    attn_rng_init(&g_rng, 0x243F6A8885A308D3ull + (unsigned long long)child);
    require_sm90("hopper_bwd64_wide");
    watch_hangs_here();
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st;
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1 || child == 2) {
        const AttnMode mode = child == 1 ? ATTN_BF16 : ATTN_REPAIR;
        /* T = 1, T < 128, T = one step, one past it, T not a multiple of 128, 1024, 2048; B, NH > 1; sharp softmax;
           key offsets */
        const CheckCase cases[] = {
            {mode, {1, 1, 1, 64}, 1.f, 0.f},     {mode, {2, 3, 1, 64}, 1.f, 0.f},    {mode, {1, 1, 77, 64}, 1.f, 0.f},
            {mode, {2, 3, 77, 64}, 1.f, 0.f},    {mode, {2, 2, 128, 64}, 1.f, 0.f},  {mode, {2, 2, 129, 64}, 1.f, 0.f},
            {mode, {2, 3, 1000, 64}, 1.f, 0.f},  {mode, {2, 2, 1024, 64}, 1.f, 0.f}, {mode, {1, 3, 2048, 64}, 1.f, 0.f},
            {mode, {4, 8, 257, 64}, 1.f, 0.f},
            {mode, {1, 4, 500, 64}, 8.f, 0.f},   /* sharp softmax (q x8) */
            {mode, {2, 4, 1000, 64}, 1.f, 20.f}, /* K += 20 u */
            {mode, {1, 4, 777, 64}, 8.f, 20.f},  /* both, odd T */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    } else {
        const CheckCase bench[] = {{ATTN_BF16, {8, 16, 1024, 64}, 1.f, 0.f}, {ATTN_BF16, {4, 16, 2048, 64}, 1.f, 0.f}};
        for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    }
    cudaCheck(cudaStreamDestroy(st));
}

int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd64_wide: the lab's HS-64 key-major backward with 128-query steps (bf16, repair) vs the production"
           " backward; the probe, the bf16 checks, the repair checks and the benchmark shapes each in its own process\n");
    static const char* kChildName[4] = {"the layout probe", "the bf16 checks", "the repair checks",
                                        "the benchmark shapes and timings"};
    return lab_run_children("hopper_bwd64_wide", 4, kChildName, run_child, 1);
}
