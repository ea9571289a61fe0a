/*
 * dev/attention_lab/hopper_bwd64_gproj_wide.cu - lab of gproj's HS-64 key-major pass (dK, dV only) on Hopper
 * (sm_90a: wgmma + TMA) with query steps of 128 rows instead of production's 64. Its own kernel and layout probe
 * (nothing of it is in the library), checked against the production gproj backward (attention_backward_cuda,
 * default options: prep, the Hopper row pass, attention/attention_hopper_bwd_gproj.cu's key-major pass) and
 * timed next to production's key-major pass.
 *
 * Why: gproj costs 1.30-1.36x bf16 in attention fwd+bwd at HS 64 (target 1.10x), and production's gproj
 * key-major pass is ~167 us of gproj's ~335 us backward at B8 H16 T1024 d64. dev/attention_lab/hopper_bwd64_wide.cu
 * (bf16/repair, 128-query steps) ran its kernel 1.08x / 1.21x faster than production's 64-query one on the H200
 * (dev/results/device_s6/call3). This lab asks the same of gproj's pass, which is lighter than bf16's: no dQ
 * GEMM, no dS staging, no reduce-adds, but a third register-A GEMM (the correction) into dK.
 *
 * What it computes: production gproj's rounding points exactly (docs/attention_numerics.md, gproj;
 * attention_hopper_bwd_gproj.cu's file comment):
 *   S^T = K_w Q^T, dP^T = V_w dO^T (FP32); P = exp2((S - m) c) fl(1/l) (recompute_prob<ATTN_REPAIR>: gproj's stats
 *   are repair's {m, l}); dS = P (dP - D); masked entries (key past the query, query past T) exactly 0;
 *   dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda_q P)^T Q (its own BF16 operand: -lambda_q * P in
 *   FP32, rounded once, as pack_gproj_step_operands); dK = bf(s acc), dV = bf(acc) into the k and v slots of
 *   dqkv; the q slot is not touched (the row pass wrote dQ). D and lambda are read from the workspace the
 *   production prep and row pass wrote. Only FP32 sum orders differ from production (dK sums 8 k-steps of
 *   bf(dS) then 8 of the correction per 128 queries; production 4 then 4 per 64).
 *
 * Layout: hopper_bwd64_wide's CTA (one CTA = 128 keys of one (b, h), key tiles longest first (tile_order.cuh);
 * 384 threads: consumer warpgroups 0 and 1 own 64 keys each, a producer warpgroup of which warp 8 works: lane 0
 * issues TMA, every lane writes the row state {m, fl(1/l), D, lambda} of 4 queries; setmaxnreg 40 / 232). Q and
 * dO tiles of 128 queries (two 64-row TMA boxes each; a box that starts at or past T reloads the first box's
 * rows: finite data under masked, zero-weight entries) in kStages stages (template: 2 and 3 are both checked
 * and timed; full: 32 producer lanes + the TMA bytes; empty: the 256 consumer threads, after the dV/dK batch).
 * Per step and consumer warpgroup:
 *   S^T, dP^T [64 keys x 128 queries]  m64n128k16 SS, 4 k-steps each, one commit group        64 + 64 regs
 *   per k-step of 16 queries: P, dS of its 4 columns, then its three A operands bf(P), bf(dS),
 *   bf(-lambda_q P) (the FP32 values die k-step by k-step)                                     96 regs at the end
 *   dV += bf(P)^T dO; dK += bf(dS)^T Q; dK += bf(-lambda P)^T Q   m64n64k16 RS, 8 k-steps each over the
 *   128-row N-major tiles (k-steps 4..7 in the second box, 8 KB on): one commit group of 24, waited for
 * Shared memory (SmemPlan<kStages>): K, V 16 KB each; Q, dO kStages x 16 KB each; row state kStages x 128
 * float4; barriers: 2 stages 100 KB (+ alignment slack), 3 stages 134 KB. One CTA per SM (the registers).
 * Registers (`make hopper_bwd64_gproj_wide-regs`, ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math): both
 * gproj_wide_kernel instantiations (2, 3 stages) 168 at entry (232 after setmaxnreg.inc), 0 bytes spill, no C75xx
 * (0 spills is also the sign that setmaxnreg took effect); probes 154 (scores) / 190 (dV, dK) / 99 (correction),
 * 0 spill. What ptxas forced: making all of a step's P and dS first and packing k-step by k-step (production's
 * order, 8 k-steps) spilled 60-76 bytes at 232 (12-36 at 240, 84-144 at 224): the consumer path, not the
 * producer; turning each column block of 8 queries into its A words right away (column_block_operands) needs
 * none. The producer trap keeps the split (0 spills with and without it).
 * Launch: with the PDL attribute and griddepcontrol.wait after the barrier init, as production's pass since
 * e301ab8, so back-to-back timings treat both alike.
 * Hangs: every mbarrier wait is bounded (~2 s of clock64) and GIVES UP on the consumer path (a trap there makes
 * ptxas ignore setmaxnreg.inc): hopper_bwd_common.cuh's mbar_wait_give_up records the barrier in the lab's
 * host-mapped record and sets the CTA's abort flag; the consumers run to the end and write NaN over all their
 * dK and dV rows. The producer warp traps after a wait that returned on the abort flag (production's choice:
 * no copy of an abandoned pipeline stays in flight into shared memory the SM hands to the next CTA); the
 * launch then ends with a CUDA error, and the HANG line still names the barrier.
 *
 * Checks (each group in a child process of its own; hopper_lab.cuh's lab_run_children):
 *   0. layout probe (one warpgroup at warpgroup 1's offsets: K, V tokens 64..127 in the tiles' second halves,
 *      Q, dO tokens 0..127 in stage 1 through the kernel's own fill_stage, T = 100 so the keys and the second
 *      query box are partly zero-filled; P := S^T, dS := dP^T, lambda_q spread over [-2, 2] per query in the
 *      row state's .w): S^T, dP^T [64 x 128] (m64n128k16 SS over two boxes), dV = bf(S^T) dO, and through the
 *      kernel's own pack and batch dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (8 + 8 RS k-steps into one
 *      accumulator, crossing the box boundary), and the correction bf(-lambda_q S^T) Q alone (its own line:
 *      a per-key lambda, a wrong query pairing or a dropped batch shows there);
 *   1. per case: forward (gproj), the production backward (attention_backward_cuda, default options; its path
 *      must be "hopper"; dqkv and workspace poisoned first), then per stage count this kernel on production's D
 *      and lambda (read from its workspace: dq_acc[rows*HS], D[rows], lambda[rows]) over a copy of production's
 *      dqkv whose k and v slots are poisoned with NaN: dQ bit-equal to production's (untouched), dK, dV within
 *      4 BF16 ulps of the row scale of production's (hopper_bwd_gproj's tolerance, fixed before any run),
 *      written everywhere and finite; ||sum_j dK_j|| / ||dK|| printed for both; then the whole gproj backward
 *      composed here (a copy of production's prep for D, production's Hopper row pass for lambda and dQ, the
 *      wide pass) on NaN-poisoned dqkv and workspace: dQ, dK, dV within 4 ulps of production's, finite;
 *   2. B8 H16 T1024 and B4 H16 T2048 (checked as in 1, then timed: medians of 21, warm inputs, queued behind a
 *      spin): production's gproj key-major pass alone, this kernel alone per stage count, the production gproj
 *      and bf16 backwards, the composed backward with either pass. Lines "time: gproj wide sN vs production
 *      N.NNx (key-major kernels alone)" (> 1: the wide one is faster), the composed backwards' ratio (measured)
 *      and the gproj/bf16 backward ratio with the wide pass in production's place (measured, composed; and an
 *      estimate: production backward - production pass + wide pass).
 * Cases: T 1, 77, 128, 129, 257, 1000, 1024, 2048; B, NH > 1; q x8 (sharp); key offsets 20 and 128 (rho 16).
 *
 * Usage: hopper_bwd64_gproj_wide   (no arguments; needs an sm_90 GPU). Ends with "N passed, N failed".
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
#include "attention/launch_overlap.cuh"
#include "attention/attn_cases.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

namespace gwide {
using namespace hopper_wgmma;

constexpr int kHS = 64;                 /* the head size of this kernel */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 128;            /* queries per step (the N of S^T, dP^T; the k of dV, dK) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of every wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
/* setmaxnreg split: production gproj's and hopper_bwd64_wide's (128 * 40 + 256 * 232 = 384 * 168) */
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the 384-thread CTA is launched with (168 each)");
constexpr int kBoxRows = 64;            /* rows per TMA box of qkv / dout */
constexpr int kRowBytes = 128;          /* one row of HS 64 BF16 = one 128B-swizzle row */
constexpr int kAtomBytes = 8 * kRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kQSteps = kBlockQ / kWgmmaK;         /* 8 k-steps of dV, dK over a step's queries */
constexpr int kScoreRegs = kBlockQ / 2;            /* FP32 registers of a 64 x 128 accumulator per thread */
constexpr uint32_t kUnusedLbo = 16;                /* K-major swizzled operands ignore LBO */
constexpr uint32_t kUnusedLboN64 = 64 * kRowBytes; /* N-major B with N = 64: LBO unused (production's value) */
constexpr int kProbeT = 100;                       /* the probe's tokens: keys 100..127 and queries 100..127 zero */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 };       /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "the first step of a key tile is its diagonal step (qt_begin = k0 / kBlockQ)");
static_assert(kQSteps == 2 * kTileKSteps, "two 64-query boxes per step");

template <int STAGES>
struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kRowBytes;          /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kRowBytes;       /* 16 KB: two boxes */
    static constexpr int kQTileBytes = kBlockQ * kRowBytes;         /* 16 KB: two boxes */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;                   /* STAGES tiles */
    static constexpr int kDO = kQ + STAGES * kQTileBytes;           /* STAGES tiles */
    static constexpr int kRowState = kDO + STAGES * kQTileBytes;    /* float4 [STAGES][kBlockQ] */
    static constexpr int kBarriers = kRowState + STAGES * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * STAGES;             /* kv_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kAtomBytes;              /* slack to align the base to 1024 */
    static_assert(kQ % kAtomBytes == 0 && kDO % kAtomBytes == 0 && kQTileBytes % kAtomBytes == 0,
                  "TMA tiles 1024-byte aligned");
    static_assert(kRowState % 16 == 0, "float4 row state");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};
static_assert(SmemPlan<2>::kKeyTileBytes == KeymajorTiles<1>::kKeyTileBytes && kBlockK == KeymajorTiles<1>::kBlockK &&
                  SmemPlan<2>::kBoxBytes == KeymajorTiles<1>::kBoxBytes,
              "the K/V tiles hopper_bwd_common.cuh's keymajor_load_kv writes");
constexpr int kProbeStages = 2; /* the probe uses the 2-stage plan's offsets (stage 1) */

/* bounded waits that give up (the file comment); this translation unit's record pointer, set by watch_hangs */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz; a legitimate wait is microseconds */
__device__ AttnHopperHang* g_gwide_hang;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_gwide_hang);
}

/* Barrier of the two consumer warpgroups (256 threads). Ids: 0 __syncthreads, 1 and 2 warpgroup_sync(0 / 1). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 3, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* ---- the steps of one (key tile, query step), per consumer warpgroup (kernel and probe share them) ---- */

/* Lane `lane` of the producer warp fills a stage (hopper_bwd64_wide's fill_stage): lane 0 announces the bytes and
   loads queries q0 .. q0 + 127 of Q and dO as two 64-row boxes each (a box starting at or past T reloads rows
   q0..: its queries are masked, and finite data keeps 0 * x = 0); the other lanes arrive (each after its
   row-state writes). */
__device__ __forceinline__ void fill_stage(unsigned char* q_stage, unsigned char* do_stage, const CUtensorMap* qkv_map,
                                           const CUtensorMap* dout_map, uint64_t* full_s, int q0, int T, int h, int NH,
                                           int b, int lane) {
    constexpr int kBoxBytes = kBoxRows * kRowBytes, kQTileBytes = kBlockQ * kRowBytes;
    if (lane == 0) {
        mbar_arrive_expect_tx(full_s, 2 * kQTileBytes);
#pragma unroll
        for (int half = 0; half < kBlockQ / kBoxRows; half++) {
            const int row = (q0 + half * kBoxRows < T) ? q0 + half * kBoxRows : q0;
            tma_load_4d(q_stage + half * kBoxBytes, qkv_map, full_s, 0, kSlotQ * NH + h, row, b);
            tma_load_4d(do_stage + half * kBoxBytes, dout_map, full_s, 0, h, row, b);
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

/* One column block j (queries q0 + 8j + 2t + e, e = 0, 1; registers 4j + 2r + e: key key0 + 8r) of a 64 x 128
   S^T / dP^T tile turned into its words of the three register A operands: k-step kk = j / 2, words
   i = 2 (j % 2) + r (hopper_wgmma.cuh's fragment layout: a0 = (key g, queries 2t, 2t+1), a1 = (g+8, 2t..),
   a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)):
     pa = bf(P), pds = bf(dS), plam = bf(-lambda_q P), lambda per query COLUMN (the row state's .w), the product in
     FP32 rounded once (pack_gproj_step_operands' expressions).
   kSoftmax (the kernel): P = recompute_prob<ATTN_REPAIR> (gproj's stats are repair's {m, fl(1/l)}), dS = P (dP - D)
   (keymajor_probs_column's expressions; masked: keys past the query and queries past T give exactly 0). Without
   (the probe): P := S^T, dS := dP^T. Column block by column block, so the FP32 P and dS die as their words are
   made (a whole-tile P, then packing, keeps more live: ptxas spilled). */
template <bool kSoftmax>
__device__ __forceinline__ void column_block_operands(uint32_t (&pa)[kQSteps][4], uint32_t (&pds)[kQSteps][4],
                                                      uint32_t (&plam)[kQSteps][4], const float (&st)[kScoreRegs],
                                                      const float (&dpt)[kScoreRegs], const float4* rs, int j, int q0,
                                                      int key0, int t, int T, bool masked, float c) {
    const int kk = j >> 1, i0 = 2 * (j & 1);
    const float4 row0 = rs[8 * j + 2 * t], row1 = rs[8 * j + 2 * t + 1];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float p[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int idx = 4 * j + 2 * r + e, query = q0 + 8 * j + 2 * t + e;
            const float4& row = e ? row1 : row0;
            if (kSoftmax) {
                p[e] = 0.f;
                ds[e] = 0.f;
                if (!masked || (key0 + 8 * r <= query && query < T)) {
                    p[e] = recompute_prob<ATTN_REPAIR>(st[idx], row.x, row.y, c);
                    ds[e] = p[e] * (dpt[idx] - row.z);
                }
            } else {
                p[e] = st[idx];
                ds[e] = dpt[idx];
            }
        }
        pa[kk][i0 + r] = pack_bf16x2(p[0], p[1]);
        pds[kk][i0 + r] = pack_bf16x2(ds[0], ds[1]);
        plam[kk][i0 + r] = pack_bf16x2(-row0.w * p[0], -row1.w * p[1]);
    }
}

/* acc += A B over the step's 128 queries: A from registers (8 k-steps), B the stage's 128-row tile read N-major
   (16 rows = 2048 bytes per k-step; k-steps 4..7 are in the second TMA box, 8 KB on). Issued only. */
__device__ __forceinline__ void rs_issue_n128(float (&acc)[32], const uint32_t (&a)[kQSteps][4], uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++)
        wgmma_m64n64k16_rs(acc, a[kk], make_smem_desc(b_addr + kk * kWgmmaK * kRowBytes, kUnusedLboN64, kAtomBytes));
}

/* gproj's dV/dK batch of one 128-query step: dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q
   (the two dK batches chained on one accumulator: wgmma orders same-accumulator operations); one commit group
   of 24 wgmmas, waited for; the A registers stay live until it is done. */
__device__ __forceinline__ void dkv_batch(float (&dv)[32], float (&dk)[32], uint32_t (&pa)[kQSteps][4],
                                          uint32_t (&pds)[kQSteps][4], uint32_t (&plam)[kQSteps][4], uint32_t q_addr,
                                          uint32_t do_addr) {
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(plam);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    rs_issue_n128(dv, pa, do_addr);
    rs_issue_n128(dk, pds, q_addr);
    rs_issue_n128(dk, plam, q_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(plam);
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

/* gproj's key-major pass with 128-query steps. stats {m, l} per row, D and lambda [B*NH*T] from the workspace;
   writes the k and v slots of dqkv. */
template <int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
    gproj_wide_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                      const float* __restrict__ stats, const float* __restrict__ D, const float* __restrict__ lambda,
                      bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan<STAGES>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = kv_full + 1;
    uint64_t* empty = full + STAGES;
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
        init_pipeline_barriers<STAGES>(kv_full, full, empty, 32, kConsumerThreads);
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh), as production's pass since e301ab8: the previous kernel's outputs (D,
       lambda) are ready from here on; the next kernel may be placed once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>();
        if (warp != kConsumerThreads / 32) return; /* warps 9-11 have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 4 queries ---- */
        if (lane == 0) keymajor_load_kv<1>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % STAGES;
            const int q0 = (qt_begin + i) * kBlockQ;
            if (i >= STAGES) {
                mbar_wait_bounded(&empty[s], (uint32_t)((i / STAGES - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
                if (*static_cast<volatile int*>(&cta_abort) != 0) __trap(); /* the file comment, "Hangs" */
            }
#pragma unroll
            for (int half = 0; half < kBlockQ / 64; half++)
                keymajor_stage_row_state<ATTN_GPROJ, kKeymajorLambdaInW>(row_state + s * kBlockQ + 64 * half, nullptr,
                                                                         stats, D, lambda, bh, T, q0 + 64 * half, lane);
            fill_stage(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map, &full[s], q0, T,
                       h, NH, b, lane);
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const int key0 = wg_key_first + warp_in_wg * 16 + g;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

#pragma unroll 1
    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % STAGES;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / STAGES) & 1), ATTN_HANG_FULL, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        float st[kScoreRegs], dpt[kScoreRegs];
        scores_n128(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
            column_block_operands<true>(pa, pds, plam, st, dpt, rs, j, q0, key0, t, T, masked, c);
        dkv_batch(dv, dk, pa, pds, plam, q_addr, do_addr);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
    }
    /* any give-up of the CTA (the producer's precedes an arrival every consumer waited for) is visible now */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, gave_up);
}

/* ------------------------------------------------------------------------------------------------ */
/* layout probe                                                                                      */
/* ------------------------------------------------------------------------------------------------ */

/* One warpgroup (128 threads) at warpgroup 1's offsets (2-stage plan): K and V tokens 64..127 in the tiles'
   second 8 KB halves, Q and dO tokens 0..127 in stage 1 (through fill_stage, warp 0 as the producer lanes),
   the row state of stage 1 {0, 1, 0, lambda_q} from lambda_in [128]; one step, no softmax (P := S^T,
   dS := dP^T). Outputs (FP32, row-major): st, dpt [64 keys][128 queries]; dv, dk, corr [64 keys][64].
   Three launches (kPart): kProbeScores writes st and dpt only (with these stores in the same kernel as the RS
   GEMMs, hopper_bwd64_wide saw ptxas serialise the wgmmas: C7512); kProbeDkv dv and dk through the kernel's
   column_block_operands<false> and dkv_batch; kProbeCorr the correction batch alone into a fresh accumulator. */
enum ProbePart { kProbeScores = 0, kProbeDkv = 1, kProbeCorr = 2 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *corr;
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
    gwide_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                       int NH, int T, int head, const float* __restrict__ lambda_in, ProbeOut out) {
    using Plan = SmemPlan<kProbeStages>;
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
    float4* rs = reinterpret_cast<float4*>(smem + Plan::kRowState) + kBlockQ; /* stage 1's row state */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(kv_bar, 1);
        mbar_init(q_bar, 32);
        mbar_init_fence();
        fence_proxy_async();
    }
    rs[threadIdx.x] = make_float4(0.f, 1.f, 0.f, lambda_in[threadIdx.x]); /* 128 threads = 128 queries */
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
    const uint32_t kw_addr = smem_u32(k_half), vw_addr = smem_u32(v_half);
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[kScoreRegs], dpt[kScoreRegs];
    scores_n128(st, dpt, kw_addr, q_addr, vw_addr, do_addr);
    if constexpr (kPart == kProbeScores) {
        probe_write(out.st, st, warp * 16, g, t);
        probe_write(out.dpt, dpt, warp * 16, g, t);
    } else {
        uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
            column_block_operands<false>(pa, pds, plam, st, dpt, rs, j, 0, 0, t, T, false, 0.f);
        float acc0[32], acc1[32];
#pragma unroll
        for (int i = 0; i < 32; i++) acc0[i] = acc1[i] = 0.f;
        if constexpr (kPart == kProbeDkv) { /* the kernel's batch: acc0 = dV, acc1 = dK */
            dkv_batch(acc0, acc1, pa, pds, plam, q_addr, do_addr);
            probe_write(out.dv, acc0, warp * 16, g, t);
            probe_write(out.dk, acc1, warp * 16, g, t);
        } else { /* the correction alone */
            reg_fence(plam);
            reg_fence(acc0);
            wgmma_fence();
            rs_issue_n128(acc0, plam, q_addr);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(acc0);
            reg_fence(plam);
            probe_write(out.corr, acc0, warp * 16, g, t);
        }
    }
}

/* ---- host: maps, launches ---- */

constexpr const char* kWho = "hopper_bwd64_gproj_wide lab (gproj HS-64 key-major pass, 128-query steps)";

void watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_gwide_hang, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

/* The stage counts the lab builds, checks and times (the kernel's STAGES). */
constexpr int kVariants = 2;
constexpr int kVariantStages[kVariants] = {2, 3};

/* The wide pass alone (asynchronous; with the PDL attribute, as production's pass: the lab runs on sm_90 only):
   reads qkv, dout, stats {m, l}, D and lambda [B*NH*T]; writes the k and v slots of dqkv (the q slot is left
   alone). variant: index into kVariantStages. */
void launch_pass(int variant, AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, const float* D,
                 const float* lambda, bf16* dqkv, cudaStream_t stream) {
    if (s.HS != kHS || s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535 ||
        ((uintptr_t)qkv % 16) != 0 || ((uintptr_t)dout % 16) != 0 || variant < 0 || variant >= kVariants)
        die("%s: unsupported call (variant %d, B=%d NH=%d T=%d HS=%d)\n  hint: HS 64, B*NH <= 65535, 16-byte"
            " aligned qkv and dout, variant 0..%d", kWho, variant, s.B, s.NH, s.T, s.HS, kVariants - 1);
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    auto launch = [&](auto kernel, int smem_bytes) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
        launch_after_previous_grid(1, kernel, grid, dim3(kThreads), smem_bytes, stream, qkv_map, dout_map, stats, D,
                                   lambda, dqkv, s.NH, s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS));
    };
    static_assert(kVariantStages[0] == 2 && kVariantStages[1] == 3, "launch_pass's two instantiations");
    if (variant == 0) launch(gproj_wide_kernel<2>, SmemPlan<2>::kAlloc);
    else launch(gproj_wide_kernel<3>, SmemPlan<3>::kAlloc);
}

/* The probe on qkv [1, T, 3, NH, 64], dout [1, T, NH, 64], T <= 128, lambda_in [128] (device): outputs as ProbeOut
   (device). Three launches; the caller synchronises. */
void layout_probe(AttnShape s, int head, const bf16* qkv, const bf16* dout, const float* lambda_in, ProbeOut o) {
    if (s.B != 1 || s.T > kBlockQ || head < 0 || head >= s.NH || s.HS != kHS)
        die("%s: the probe needs B = 1, T <= %d, 0 <= head < NH, HS 64 (got B=%d NH=%d T=%d HS=%d head %d)", kWho,
            kBlockQ, s.B, s.NH, s.T, s.HS, head);
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    auto launch = [&](auto kernel) {
        const int smem_bytes = SmemPlan<kProbeStages>::kAlloc;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
        kernel<<<1, 128, smem_bytes>>>(qkv_map, dout_map, s.NH, s.T, head, lambda_in, o);
        cudaCheckLastError();
    };
    launch(gwide_probe_kernel<kProbeScores>); /* S^T, dP^T */
    launch(gwide_probe_kernel<kProbeDkv>);    /* dV, dK (with the correction) */
    launch(gwide_probe_kernel<kProbeCorr>);   /* the correction alone */
}

}  // namespace gwide

/* ------------------------------------------------------------------------------------------------ */
/* host: checks and timing                                                                           */
/* ------------------------------------------------------------------------------------------------ */

typedef __nv_bfloat16 bf16;
static const int kHS = gwide::kHS;

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* workspace: production's layout (carve_workspace in attention_cuda.cu; tests/test_attention_gpu.cu's
   backward_to_host): dq_acc [rows * HS], D [rows], lambda [rows] */
static const float* ws_D(const void* ws, AttnShape s) { return (const float*)ws + (size_t)s.B * s.NH * s.T * s.HS; }
static const float* ws_lambda(const void* ws, AttnShape s) { return ws_D(ws, s) + (size_t)s.B * s.NH * s.T; }

/* D of gproj's backward: attention_cuda.cu's attn_bwd_prep_kernel<64> (file-local there) as gproj runs it (no
   accumulator to zero: the row pass writes dQ whole), with its programmatic-launch trigger: 8 lanes per row, each
   loads 8 BF16 of O and dO; 256 threads = 32 rows per block, grid (T / 32, B * NH). */
constexpr int kPrepThreads = 256, kPrepLanesPerRow = kHS / 8, kPrepRowsPerBlock = kPrepThreads / kPrepLanesPerRow;
__global__ void __launch_bounds__(kPrepThreads) lab_prep_D(const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                                           float* __restrict__ D, int NH, int T) {
    let_next_grid_launch(); /* as production's prep: the row pass may take its place and wait there */
    const int tok = blockIdx.x * kPrepRowsPerBlock + threadIdx.x / kPrepLanesPerRow;
    const int d = (threadIdx.x % kPrepLanesPerRow) * 8, bh = blockIdx.y;
    const bool active = tok < T; /* no early return: whole warps take part in the shuffle */
    const long long row = (long long)bh * T + tok;
    float sum = 0.f;
    if (active) {
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

/* The whole gproj backward composed here: the prep copy above (D), production's Hopper row pass
   (attention_backward_hopper_rows: lambda and dQ) and key-major pass `pass` (kPassProduction:
   attention_backward_hopper_gproj_keys; 0, 1: the wide one's variants) on the workspace layout above. */
enum { kPassProduction = -1 };
static void lab_gproj_backward(int pass, AttnShape s, const bf16* qkv, const bf16* out, const float* stats,
                               const bf16* dout, bf16* dqkv, void* ws, cudaStream_t st) {
    float* D = (float*)ws_D(ws, s);
    float* lambda = (float*)ws_lambda(ws, s);
    lab_prep_D<<<dim3((unsigned)ceil_div(s.T, kPrepRowsPerBlock), (unsigned)(s.B * s.NH)), kPrepThreads, 0, st>>>(
        out, dout, D, s.NH, s.T);
    cudaCheckLastError();
    attention_backward_hopper_rows(ATTN_GPROJ, s, qkv, dout, stats, D, lambda, dqkv, st);
    if (pass == kPassProduction) attention_backward_hopper_gproj_keys(s, qkv, dout, stats, D, lambda, dqkv, st);
    else gwide::launch_pass(pass, s, qkv, dout, stats, D, lambda, dqkv, st);
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
        CHECK(0, "CUDA error after %s: %s (hint: a producer trap after a give-up ends the launch so; otherwise run"
              " under compute-sanitizer)", where, cudaGetErrorString(e));
    lab_child_report_and_exit();
}

static const double kMaxUlps = 4.0; /* the file comment's tolerance, fixed before any run */
static const char* kSlotName[3] = {"dQ", "dK", "dV"};

/* NaN (0xFF bytes) over the k and v slots of dqkv [B, T, 3, NH, HS]: per token, 2 NH HS elements after the q
   slot's NH HS (hopper_bwd_gproj's poison_kv). */
static void poison_kv(bf16* dqkv, AttnShape s, cudaStream_t st) {
    const size_t pitch = 3ull * s.NH * s.HS * sizeof(bf16), width = 2ull * s.NH * s.HS * sizeof(bf16);
    cudaCheck(cudaMemset2DAsync(dqkv + (size_t)s.NH * s.HS, pitch, 0xFF, width, (size_t)s.B * s.T, st));
}

/* dq_untouched: the q slot must be bit-equal (the pass alone over production's dqkv); else every slot within
   kMaxUlps (a composed backward, whose dQ comes from the row pass on its own D). */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       int dq_untouched = 1) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs production: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n",
           what, kSlotName[slot], d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: the production backward has every element finite (%zu NaN)", kSlotName[slot], d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left of the poison or from a give-up)", what,
          kSlotName[slot], d.nan_new);
    if (slot == 0 && dq_untouched)
        CHECK(d.unequal == 0, "%s dQ untouched: bit-equal to production's (the wide pass writes only k and v; %zu"
              " differ)", what, d.unequal);
    else
        CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of production (max %.2f)", what, kSlotName[slot],
              kMaxUlps, d.max_ulps);
}

struct CheckCase {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

static void check_case(CheckCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_GPROJ;
    char title[200];
    snprintf(title, sizeof title, "gproj B%d NH%d T%d HS%d q x%g key offset %g: wide key-major pass (128-query steps)"
             " vs production", s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; carve_workspace's layout, which this"
          " lab reads)", ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_new;
    float* stats;
    void* ws_ref;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    void* ws_new;
    lab_alloc_poisoned(&ws_new, ws_bytes);
    const AttnOptions opt = {};
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const AttnBwdPath path = attention_backward_cuda_path(mode, opt, s, qkv, dout);
    CHECK(path == ATTN_BWD_HOPPER, "the reference (attention_backward_cuda, gproj, default options) takes the Hopper"
          " path (got %s): production's gproj key-major pass is what the wide one is compared with",
          attn_bwd_path_name(path));

    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, st);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the production gproj backward");
    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    const float* D = ws_D(ws_ref, s);
    const float* lambda = ws_lambda(ws_ref, s);

    for (int v = 0; v < gwide::kVariants; v++) {
        char what[160];
        /* the wide pass on production's D and lambda over production's dqkv with k and v poisoned */
        cudaCheck(cudaMemcpyAsync(dqkv_new, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToDevice, st));
        poison_kv(dqkv_new, s, st);
        gwide::launch_pass(v, s, qkv, dout, stats, D, lambda, dqkv_new, st);
        snprintf(what, sizeof what, "the wide pass (%d stages) on production's D and lambda", gwide::kVariantStages[v]);
        sync_or_report(cudaStreamSynchronize(st), what);
        cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "wide s%d:", gwide::kVariantStages[v]);
        for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, what);
        printf("  max over heads ||sum_j dK_j|| / ||dK||: production %.3g, wide s%d %.3g\n", lab_worst_key_sum(h_ref, s),
               gwide::kVariantStages[v], lab_worst_key_sum(h_new, s));
        /* the whole gproj backward composed with the wide pass (lab prep + production row pass + wide pass) on
           poisoned dqkv and workspace: dQ (the row pass's, on the lab prep's D) within 4 ulps too */
        cudaCheck(cudaMemsetAsync(dqkv_new, 0xFF, nqkv * 2, st));
        cudaCheck(cudaMemsetAsync(ws_new, 0xFF, ws_bytes, st));
        lab_gproj_backward(v, s, qkv, out, stats, dout, dqkv_new, ws_new, st);
        snprintf(what, sizeof what, "the composed gproj backward with the wide pass (%d stages)", gwide::kVariantStages[v]);
        sync_or_report(cudaStreamSynchronize(st), what);
        cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "whole backward (lab prep + row pass + wide s%d):", gwide::kVariantStages[v]);
        for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, what, 0);
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
        /* the bf16 backward of the ratio needs bf16's own forward (stats {LSE, 0}, its O for D) */
        bf16* out_b;
        float* stats_b;
        void* ws_b;
        cudaCheck(cudaMalloc(&out_b, nout * 2));
        cudaCheck(cudaMalloc(&stats_b, nstats * 4));
        cudaCheck(cudaMalloc(&ws_b, attention_cuda_workspace_bytes(s, ATTN_BF16)));
        attention_forward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, NULL, st);
        /* the key-major pass's 5 causal BF16 GEMMs: S^T, dP^T, dV, dK, the correction */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        /* the passes alone rewrite dqkv_new's k and v slots from the same D and lambda (workspace untouched) */
        auto run_prod_pass = [&]() {
            attention_backward_hopper_gproj_keys(s, qkv, dout, stats, D, lambda, dqkv_new, st);
        };
        auto run_prod_bwd = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        auto run_bf16_bwd = [&]() {
            attention_backward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, dout, dqkv_new, ws_b, st);
        };
        auto run_lab_prod = [&]() { lab_gproj_backward(kPassProduction, s, qkv, out, stats, dout, dqkv_new, ws_new, st); };
        const float ms_prod_pass = time_of(run_prod_pass, "timing production's gproj key-major pass alone");
        const float ms_lab_prod = time_of(run_lab_prod, "timing the composed backward with production's pass");
        const float ms_prod_bwd = time_of(run_prod_bwd, "timing the production gproj backward");
        const float ms_bf16_bwd = time_of(run_bf16_bwd, "timing the production bf16 backward");
        printf("  time (median of %d, warm inputs, queued behind a spin): production gproj key-major pass alone %.4f ms"
               " (%.1f TFLOP/s, 5 causal GEMMs); production gproj backward %.4f ms; bf16 backward %.4f ms (gproj/bf16"
               " backward %.2fx)\n", (int)kReps, ms_prod_pass, 5.0 * gemm / ms_prod_pass * 1e-9, ms_prod_bwd,
               ms_bf16_bwd, ms_prod_bwd / ms_bf16_bwd);
        printf("  time: composed gproj backward (lab prep + production row pass + production pass) %.4f ms\n",
               ms_lab_prod);
        for (int v = 0; v < gwide::kVariants; v++) {
            auto run_wide = [&]() { gwide::launch_pass(v, s, qkv, dout, stats, D, lambda, dqkv_new, st); };
            auto run_lab_wide = [&]() { lab_gproj_backward(v, s, qkv, out, stats, dout, dqkv_new, ws_new, st); };
            const float ms_wide = time_of(run_wide, "timing the wide pass alone");
            const float ms_lab_wide = time_of(run_lab_wide, "timing the composed backward with the wide pass");
            const float est = ms_prod_bwd - ms_prod_pass + ms_wide;
            printf("  time: gproj wide s%d pass alone %.4f ms (%.1f TFLOP/s)\n", gwide::kVariantStages[v], ms_wide,
                   5.0 * gemm / ms_wide * 1e-9);
            printf("  time: gproj wide s%d vs production %.2fx (key-major kernels alone)\n", gwide::kVariantStages[v],
                   ms_prod_pass / ms_wide);
            printf("  time: gproj wide s%d: estimated gproj backward %.4f ms (production's - its pass + the wide"
                   " pass), gproj/bf16 backward %.2fx (production %.2fx)\n", gwide::kVariantStages[v], est,
                   est / ms_bf16_bwd, ms_prod_bwd / ms_bf16_bwd);
            printf("  time: gproj wide s%d: composed gproj backward %.4f ms vs %.4f with production's pass: %.2fx;"
                   " gproj/bf16 backward %.2fx (measured, composed)\n", gwide::kVariantStages[v], ms_lab_wide,
                   ms_lab_prod, ms_lab_prod / ms_lab_wide, ms_lab_wide / ms_bf16_bwd);
        }
        /* the timing loops rewrote dqkv_new, last the composed backward with wide s3: its k and v slots once more */
        cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        for (int slot = 1; slot < 3; slot++) check_slot(h_ref, h_new, s, slot, "after timing, composed with wide s3:");
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventDestroy(ev[r]));
        cudaCheck(cudaFree(out_b)); cudaCheck(cudaFree(stats_b)); cudaCheck(cudaFree(ws_b));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_new));
}

/* The layout probe on B1 NH3 T100 HS64 (head 1) against double loops over the same BF16 values; lambda_q spread
   over [-2, 2] per query. */
static void layout_probe(void) {
    test_section("layout probe HS64, 128-query step: S^T, dP^T (m64n128k16 SS over two boxes), dV = bf(S^T) dO,"
                 " dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (8 + 8 RS k-steps, one accumulator, across the box boundary),"
                 " the correction alone");
    const AttnShape ps = {1, 3, gwide::kProbeT, kHS};
    ProbeInputs in = probe_inputs_make_shape(ps, 1);
    enum { kQ = 0, kK = 1, kV = 2 };
    const int nk = 64, nq = gwide::kBlockQ, key_base = 64; /* warpgroup 1's keys: tokens 64..127 */
    float h_lambda[gwide::kBlockQ];
    for (int q = 0; q < nq; q++) h_lambda[q] = (float)(4.0 * attn_rng_uniform(&g_rng) - 2.0);
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS;
    const size_t total = 2 * n_st + 3 * n_kv;
    float *d_out, *d_lambda;
    lab_alloc_poisoned(&d_out, total * 4);
    lab_upload(&d_lambda, h_lambda, sizeof h_lambda);
    gwide::ProbeOut o;
    o.st = d_out;
    o.dpt = o.st + n_st;
    o.dv = o.dpt + n_st;
    o.dk = o.dv + n_kv;
    o.corr = o.dk + n_kv;
    gwide::layout_probe(ps, in.head, in.qkv, in.dout, d_lambda, o);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    const float *g_st = h, *g_dpt = h + n_st, *g_dv = g_dpt + n_st, *g_dk = g_dv + n_kv, *g_corr = g_dk + n_kv;
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
          "dV = bf(S^T) dO: 8 register-A k-steps (column_block_operands' pa), dO N-major across its two boxes");
    /* the correction alone: sum_q bf(-lambda_q * S^T[key][q]) Q[q][n], the product in FP32 as the kernel does */
    lab_probe_product(ref, mag, nk, kHS, nq, [&](int i, int n, int q) {
        const float prod = -h_lambda[q] * g_st[i * nq + q];
        return bf16_round(prod) * probe_qkv(in, q, kQ, n);
    });
    CHECK(lab_probe_compare("corr = bf(-lambda_q S^T) Q", g_corr, ref, mag, nk, kHS) == 0,
          "the correction operand bf(-lambda_q P) as register A over 128 queries: lambda per query COLUMN from the"
          " row state's .w (rs[16kk + 8jj + 2t + e]), Q N-major across its two boxes");
    /* both dK batches into one accumulator: the two terms of each q */
    lab_probe_product(ref, mag, nk, kHS, 2 * nq, [&](int i, int n, int k) {
        const int q = k / 2;
        const float prod = -h_lambda[q] * g_st[i * nq + q];
        const double a = (k & 1) ? bf16_round(prod) : bf16_round(g_dpt[i * nq + q]);
        return a * probe_qkv(in, q, kQ, n);
    });
    CHECK(lab_probe_compare("dK = bf(dP^T) Q + bf(-lambda_q S^T) Q", g_dk, ref, mag, nk, kHS) == 0,
          "dK through the kernel's dkv_batch: bf(dS) then the correction, 8 + 8 RS k-steps chained on one"
          " accumulator (a dropped or misplaced batch shows here)");
    free(ref); free(mag); free(h);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_lambda));
}

/* lab_watch_hangs installs the production kernels' record; this file's kernels get the same mapped record */
static void watch_hangs_here(void) {
    lab_watch_hangs();
    AttnHopperHang* dev = NULL;
    cudaCheck(cudaHostGetDevicePointer((void**)&dev, g_lab_hang, 0));
    gwide::watch_hangs(dev);
}

static void run_child(int child) {
    attn_rng_init(&g_rng, 0x243F6A8885A308D3ull + (unsigned long long)child);
    require_sm90("hopper_bwd64_gproj_wide");
    watch_hangs_here();
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st;
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1) {
        /* T = 1, T < 128, T = one step, one past it, T not a multiple of 128, 1024, 2048; B, NH > 1; sharp softmax;
           key offsets (where the correction matters) */
        const CheckCase cases[] = {
            {{1, 1, 1, 64}, 1.f, 0.f},    {{2, 3, 1, 64}, 1.f, 0.f},     {{1, 1, 77, 64}, 1.f, 0.f},
            {{2, 3, 77, 64}, 1.f, 0.f},   {{2, 2, 128, 64}, 1.f, 0.f},   {{2, 2, 129, 64}, 1.f, 0.f},
            {{2, 3, 1000, 64}, 1.f, 0.f}, {{2, 2, 1024, 64}, 1.f, 0.f},  {{1, 3, 2048, 64}, 1.f, 0.f},
            {{4, 8, 257, 64}, 1.f, 0.f},
            {{1, 4, 500, 64}, 8.f, 0.f},    /* sharp softmax (q x8) */
            {{2, 4, 1000, 64}, 1.f, 20.f},  /* K += 20 u */
            {{1, 4, 777, 64}, 1.f, 128.f},  /* rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
            {{1, 4, 777, 64}, 8.f, 20.f},   /* sharp and offset, odd T */
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
    printf("hopper_bwd64_gproj_wide: the lab's gproj HS-64 key-major pass with 128-query steps (2 and 3 stages) vs"
           " production's; the probe, the checks and the benchmark shapes each in its own process\n");
    static const char* kChildName[3] = {"the layout probe", "the gproj checks", "the benchmark shapes and timings"};
    return lab_run_children("hopper_bwd64_gproj_wide", 3, kChildName, run_child, 1);
}
