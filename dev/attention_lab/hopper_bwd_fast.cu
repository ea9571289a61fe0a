/*
 * dev/attention_lab/hopper_bwd_fast.cu - the next version of the Hopper (sm_90a) key-major attention backward
 * (dK, dV and the dQ atomics; wgmma + TMA, bf16 and repair, HS 64): hopper_bwd.cu's verified kernel with the
 * optimizations FA3's backward uses (Dao-AILab/flash-attention hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp; read,
 * not copied) added one at a time as template switches, each variant checked against the portable
 * production backward (attention_backward_cuda with force_portable) and timed next to variant 0.
 *
 * STATUS: first run on the H200 on 2026-11-29 (dev/results/device_s4/call5/hopper_bwd_fast.log): every
 * variant correct (500 passed, 0 failed), and none faster than v0: v1 1.00-1.01x, v2 0.88-0.91x, v3
 * 0.95-0.96x, v4 0.95-0.97x (B8 H16 T1024 / B4 H16 T2048 d64, median of 21). So none went into production;
 * the next step is a profile of v0, not another variant.
 * Session 5 (dev/results/device_s5/call2-call4, same shapes): v5 (the producer reads the row state before it
 * waits) 0.97-0.98x, v6 (v5 + 3 stages) 0.91-0.93x; the ablations a1 (dQ partials computed, never sent)
 * 1.31-1.37x and a2 (no dQ at all) 1.20-1.22x showed that the red.global dQ atomics cost a quarter of the
 * kernel; v7 (the partial through a swizzled FP32 shared tile and two TMA reduce-adds per warpgroup) 1.10-1.12x,
 * correct, and went into production (attention/attention_hopper_bwd.cu, and the HS-128 kernel); v8 (one tile
 * per CTA, the warpgroups handing it over by named barriers) 0.88-0.92x: coupling the warpgroups costs more
 * than the halved reduce traffic saves. v0 ran at 0.275 ms where the production kernel
 * measured 0.326 / 0.321 ms (dev/attention_lab/hopper_bwd.cu, build/bench_attention): v0 is this file's
 * own copy, which sends dQ with predicated non-returning reductions (red_add_f32x2_if) and gives up on a
 * hung barrier instead of trapping; the harnesses agree on the portable path within 1.5%. So the gap is
 * most likely production's value-returning atomics (docs/attention_kernels.md); not confirmed yet.
 * NEVER RUN (written after session 5's last GPU call, compile-checked only): v9 = v7 whose dQ tiles are sent
 * by the PRODUCER warp (FA3's arrangement): per warpgroup and tile buffer an mbarrier pair dq_full (the
 * warpgroup's 128 threads after their stores and fence.proxy.async) / dq_empty (the producer lane after
 * cp.async.bulk.wait_group.read), so the consumers never wait on a bulk group nor sync their warpgroup for
 * the send (in v7 thread 0 waits on the bulk group of step i - 2 before the dS staging barrier, and the
 * warpgroup syncs once more before thread 0 issues);
 * v10 = v9 with two producer lanes, lane w serving warpgroup w. The producer's order (the kernel's comment at
 * dq_send) is deadlock-free by construction; a protocol bug shows as a HANG line naming dq_full / dq_empty,
 * the warpgroup and the buffer. To run next: HOPPER_BWD_FAST_VARIANTS="0 7 9 10" (indexes: v0..v10 = 0..10,
 * a1 11, a2 12). Expected: between v7 (1.10-1.12x) and a1 (1.31-1.37x) if the consumers' send was the cost.
 *
 * Why: hopper_bwd's header says what was left on the table: nothing overlaps (each wgmma batch is waited
 * on before the next step), dQ is a second serial batch, each warpgroup sends its own dQ atomics, and the
 * 288-thread CTA gets 168 registers per thread, too few to keep more in flight (ptxas C7512).
 *
 * The variants (cumulative; kVariants in the host code; -Xptxas -v, CUDA 13.0, bf16 / repair):
 *   v0 old             producer warp (288 threads), serial batches, 2 stages     161 / 168 regs, 0 / 28 B spill
 *   v1 +producer WG    a 128-thread producer warpgroup: setmaxnreg.dec 40 there, .inc 232 in the two
 *                      consumer warpgroups (128*40 + 256*232 = 384*168, what the CTA is launched with)
 *                                                                               168 at entry, 0 spill
 *   v2 +overlap        S^T and dP^T as two commit groups (P is computed while dP^T runs, wait<1>), dQ =
 *                      bf(dS) K issued right behind dV/dK with one wait for all three, and the dQ atomics
 *                      of step i sent while step i+1's S^T/dP^T run (the partial waits in registers)
 *                                                                               0 spill, no C75xx
 *   v3 +one dQ per CTA the warpgroups swap the halves of their FP32 dQ partials through shared memory
 *                      (double-buffered, one 256-thread named barrier per step) and each sends the sum
 *                      for its 32 columns: half the atomics (as production's per-128-key partials)
 *                                                                               0 spill, no C75xx
 *   v4 +3 stages       3 Q/dO stages (137 KB of shared memory)                  0 spill, no C75xx
 * and on v0 (session 5, one change each; bf16 / repair):
 *   v5, v6             prefetched row state; + 3 stages                         161 / 168, 0 / 28 B spill
 *   v7 TMA dQ          dQ partial -> swizzled FP32 shared tile -> 2 TMA reduce-adds per warpgroup
 *                                                                               154 / 168, 0 / 40 B spill
 *   v8 one tile/CTA    v7, warpgroups coupled by named barriers                 163 / 168, 0 / 68 B spill
 *   v9 producer sends  v7, the producer warp's lane 0 sends both warpgroups' tiles (mbarriers)
 *                                                                               157 / 168, 0 / 24 B spill
 *   v10 two lanes      v9, lane w sends warpgroup w's tiles                     157 / 168, 0 / 24 B spill
 *   (no C75xx in any; the repair instantiations at the 288-thread launch's 168 have spilt since v0)
 * What the compiler forced (seen with -Xptxas -v, worth knowing for the production kernel):
 *   - a __trap() anywhere on the consumer path makes ptxas IGNORE setmaxnreg.inc (silently: the consumer
 *     code is then allocated 168 registers, 260 B of spills, C7512). So the bounded waits here give up
 *     instead of trapping (see mbar_wait_bounded) and the host names the hung barrier;
 *   - a dQ partial read straight from its wgmma's registers while later wgmmas are in flight makes ptxas
 *     inject a wgmma wait (C7517) or serialise (C7518, with predicated atomics): it is copied first (mov);
 *   - an index computed from the warpgroup number puts an accumulator in local memory: selects instead;
 *   - the role branch uses a shuffled (warp-uniform) warpgroup index, as CUTLASS does.
 * Not done (next candidates): a run of v9/v10 (FA3's dQ path: the TMA reduce-add issued by a warp that
 * does no math; FA3 also accumulates dQ per query tile in shared memory, not done here); issuing
 * step i+1's S^T/dP^T before waiting for step i's dQ GEMM (tried, not kept: with st/dpt in flight across
 * the loop's back edge the compiler merges them with permuting moves and ptxas serialises every wgmma,
 * C7514/C7515 - it needs the scores carried in a form ptxas can coalesce, e.g. a 2x unrolled loop with
 * two named st/dpt sets); a persistent schedule; HS 128 (refused by hopper_bwd_prepare).
 *
 * Numerics: identical to hopper_bwd (and so to attn_bwd_kernel's rounding points): P = exp2(fma(S, c,
 * -fl(LSE log2 e))) (bf16) or exp2((S - m) c) * fl(1/l) (repair), dS = P (dP - D), masked entries exactly
 * 0, dV += bf(P)^T dO, dK += bf(dS)^T Q, dQ += bf(dS) K in FP32, then dK = bf(s acc), dQ = bf(s acc) by the
 * same post-pass. Only FP32 summation order differs (v3/v4 sum two 64-key partials before the atomic,
 * a + b in either order is the same float). Checks: <= 4 BF16 ulps of the row scale (fixed before any run).
 *
 * Kernel layout (all variants): one CTA = 128 keys of one (b, h), two consumer warpgroups of 64 keys
 * (the M of wgmma) and the producer; K/V loaded once by TMA, Q/dO tiles of 64 queries in a STAGES-deep
 * pipeline (full[s]: 32 producer lanes after writing the row state {row_a, row_b, D} + the TMA bytes;
 * empty[s]: the 256 consumer threads); per step S^T = K Q^T, dP^T = V dO^T (SS), dV/dK (RS, the
 * accumulators repacked as A), bf(dS) staged [query][key] in shared memory and read back as A of dQ =
 * dS K. The operand forms are hopper_bwd's (its layout probe passed on the H200: 0 of 4096 wrong in all
 * five products); the probe is kept and runs first.
 *
 * Safety: each variant runs in its own process (the parent never touches CUDA), so a hang or fault in one
 * costs that variant's lines only; mbarrier waits give up after ~2 s and record which barrier (host-mapped
 * memory, checked after every synchronisation); setmaxnreg.inc and the named barriers cannot be bounded
 * (the register split is exact, the barrier counts uniform): run it under `timeout 120`.
 *
 * Usage: hopper_bwd_fast   (no arguments; needs an sm_90 GPU). Ends with "N passed, N failed" summed over
 * the processes; a process that dies without reporting counts as one failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/attn_cases.h"
#include "attention/hopper_wgmma.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"
#include "dev/attention_lab/hopper_lab_hang.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = 64;                 /* the head size this lab supports */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
/* The CTA: the consumer warpgroups, then either one producer warp (the old layout: 288 threads) or a whole
   producer warpgroup (384 threads) whose registers setmaxnreg hands to the consumers. */
constexpr int kThreadsProducerWarp = kConsumerThreads + 32;
constexpr int kThreadsProducerWarpgroup = kConsumerThreads + 128;
__host__ __device__ constexpr int cta_threads(bool producer_warpgroup) {
    return producer_warpgroup ? kThreadsProducerWarpgroup : kThreadsProducerWarp;
}
/* setmaxnreg split of the 384-thread CTA (65536 registers; __launch_bounds__(384, 1) starts every thread
   at 168): the producer warpgroup drops to 40, the consumers rise to 232. 128 * 40 + 256 * 232 = 64512 =
   384 * 168, so the consumers' increase is exactly what the producers free (no wait on other CTAs). */
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreadsProducerWarpgroup * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");

constexpr int kBoxRows = 64;            /* rows per TMA box (Q, dO tiles; K and V as two boxes each) */
constexpr int kSwizzleRowBytes = 128;   /* one row of HS 64 BF16 = one 128B-swizzle row */
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO */
constexpr int kDsPitch = kBlockQ + 8;   /* BF16 per row of a staged dS tile [query][key]: +8 against bank conflicts */
/* The dQ exchange of the one-set-of-atomics variant: each consumer thread hands the partner warpgroup the
   16 FP32 values of its dQ fragment that lie in the partner's half of the head dimension. */
constexpr int kDqHalfRegs = 16;
constexpr float kLog2e = 1.4426950408889634f;
/* The producer-sent dQ (TMA_DQ 3 and 4): how many lanes of the producer warp issue the reduce-adds (3: lane 0
   for both warpgroups; 4: lane w for warpgroup w), and the offset added to a dq_full / dq_empty wait's index
   in the hang record (whose sites are full and empty, shared with the Q/dO stages): index 100 + 2 wg + parity. */
__host__ __device__ constexpr int dq_issue_lanes(int tma_dq) { return tma_dq == 4 ? kConsumerWarpgroups : 1; }
constexpr int kHangDqIndexBase = 100;
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ, "one staged dS tile is 64 x 64: the warpgroup's keys x the query tile");

/* Shared-memory plan (byte offsets from a 1024-byte aligned base). Tiles are [rows][128 bytes], swizzled. */
template <int STAGES, int TMA_DQ = 0>
struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kSwizzleRowBytes; /* 16 KB */
    static constexpr int kQTileBytes = kBlockQ * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;           /* STAGES tiles */
    static constexpr int kDO = kQ + STAGES * kQTileBytes;   /* STAGES tiles */
    static constexpr int kDs = kDO + STAGES * kQTileBytes;  /* one [64 query][kDsPitch] BF16 tile per warpgroup */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    /* dQ exchange: 2 buffers (step parity) x [warpgroup][16 registers][128 threads] FP32 */
    static constexpr int kXchg = kDs + kConsumerWarpgroups * kDsBytes;
    static constexpr int kXchgFloats = kConsumerThreads * kDqHalfRegs; /* one buffer */
    static constexpr int kRowState = kXchg + 2 * kXchgFloats * 4; /* float4 [STAGES][kBlockQ] */
    static constexpr int kBarriers = kRowState + STAGES * kBlockQ * 16;
    /* kv_full, full[stages], empty[stages]; TMA_DQ >= 3 (the producer sends dQ) adds dq_full[wg][parity] and
       dq_empty[wg][parity] */
    static constexpr int kNumDqBarriers = TMA_DQ >= 3 ? 2 * 2 * kConsumerWarpgroups : 0;
    static constexpr int kNumBarriers = 1 + 2 * STAGES + kNumDqBarriers;
    /* TMA_DQ: 2 FP32 dQ tiles [64 queries][64] (step parity) per warpgroup (1, 3, 4) or per CTA (2), each two
       128B-swizzled boxes of 32 columns (8 KB), 1024-byte aligned */
    static constexpr int kDqBuf = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kDqTileBytes = kBlockQ * kHS * 4;
    static constexpr int kDqTiles = TMA_DQ == 2 ? 2 : 2 * kConsumerWarpgroups;
    static constexpr int kBytes = TMA_DQ ? kDqBuf + kDqTiles * kDqTileBytes : kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kRowState % 16 == 0, "float4 row state");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};
using ProbePlan = SmemPlan<2>;

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* D and the zeroed dQ accumulator: attn_bwd_prep_kernel's semantics and summation order (lane d and
   d + 32, then the xor tree), one warp per (b, h, t) row; rows = B*NH*T in (b*NH + h)*T + t order. */
__global__ void hopper_bwd_prep_kernel(const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                       float* __restrict__ D, float* __restrict__ dq_acc, int NH, int T,
                                       long long rows) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* acc = dq_acc + row * kHS;
#pragma unroll
    for (int d = lane; d < kHS; d += 32) acc[d] = 0.f;
    const long long bh = row / T;
    const int tok = (int)(row % T);
    const long long b = bh / NH, h = bh % NH;
    const long long off = (b * T + tok) * NH * kHS + h * kHS;
    float sum = 0.f;
#pragma unroll
    for (int d = lane; d < kHS; d += 32) sum += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
    if (lane == 0) D[row] = sum;
}

/* dQ = bf(s * acc) into the q slot of dqkv (attn_bwd_dq_kernel's semantics); one thread per 2 elements. */
__global__ void hopper_bwd_dq_kernel(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T,
                                     float scale, long long pairs) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const long long e = 2 * i;
    const int d = (int)(e % kHS);
    const long long row = e / kHS;
    const int tok = (int)(row % T);
    const long long bh = row / T, b = bh / NH, h = bh % NH;
    const float2 v = *reinterpret_cast<const float2*>(dq_acc + e);
    bf16* dst = dqkv + (b * T + tok) * 3LL * NH * kHS + h * kHS + d;
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(v.x * scale, v.y * scale);
}

/* The recomputed probability of one score (attention_cuda.cu's backward_prob): bf16: row_a =
   fl(LSE log2 e), P = exp2(fma(S, c, -row_a)); repair: row_a = m, row_b = fl(1/l). */
template <int MODE>
__device__ __forceinline__ float recompute_prob(float score, float row_a, float row_b, float c) {
    if (MODE == ATTN_BF16) return exp2f(__fmaf_rn(score, c, -row_a));
    return exp2f((score - row_a) * c) * row_b;
}

/* Barrier of the two consumer warpgroups (256 threads; id 3: 1 and 2 are the per-warpgroup barriers). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 3, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* The variants, each a template switch over the verified kernel of hopper_bwd.cu (kept as variant 0):
     PRODUCER_WG - a 128-thread producer warpgroup that gives registers away (setmaxnreg 40 / 232);
     OVERLAP     - S^T and dP^T as two commit groups (P computed while dP^T runs), dQ = bf(dS) K issued
                   right behind dV/dK with one wait for all three, and the dQ atomics of step i issued
                   while step i + 1's S^T/dP^T run (the partial waits in registers across the boundary);
     SHARED_DQ   - one set of dQ atomics per CTA: the warpgroups swap the halves of their FP32 dQ
                   partials through shared memory; each adds and sends the 32 columns it owns;
     STAGES      - Q/dO pipeline depth (2 or 3);
     PREFETCH    - the producer reads the next tile's row state (stats, D: global loads) BEFORE it waits for
                   the stage to be free, and issues the tile's TMA before writing the row state, so neither
                   global latency sits between a consumer's release and the next tile being ready;
     TMA_DQ      - the dQ partial as FP32 shared tiles sent by TMA reduce-adds: 0 no (red.global, flush_dq); 1 one
                   tile per warpgroup, sent by one of its threads (v7, production); 2 one tile per CTA, the
                   warpgroups coupled by named barriers (v8); 3 one tile per warpgroup, sent by lane 0 of the
                   PRODUCER warp through mbarriers dq_full / dq_empty, so no consumer waits on a bulk group (v9);
                   4 as 3 with lane w of the producer warp serving warpgroup w (v10);
     ABLATE      - timing-only ablations (results wrong by design, never checked): 0 none; 1 the dQ partials
                   are computed but not sent (no red.global); 2 no dQ at all (no staging, dQ GEMM, atomics).
                   What the full kernel loses to each piece is the difference to variant 0. */
template <int MODE, bool PRODUCER_WG, bool OVERLAP, bool SHARED_DQ, int STAGES, bool PREFETCH, int ABLATE, int TMA_DQ>
__global__ void __launch_bounds__(cta_threads(PRODUCER_WG), 1)
    hopper_bwd_fast_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                           const __grid_constant__ CUtensorMap dq_map, const float* __restrict__ stats, const float* __restrict__ D, float* __restrict__ dq_acc,
                           bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan<STAGES, TMA_DQ>;
    static_assert(!SHARED_DQ || OVERLAP, "the dQ exchange is written into the deferred (overlapped) flush");
    static_assert(ABLATE < 2 || !OVERLAP, "the no-dQ ablation is written for the serial (v0) step");
    static_assert(!TMA_DQ || (!OVERLAP && !SHARED_DQ && ABLATE == 0), "the TMA dQ flush is written for v0's step");
    static_assert(TMA_DQ < 3 || !PREFETCH, "the producer's dQ service is written into the non-prefetch loop body");
    static_assert(TMA_DQ < 3 || kConsumerWarpgroups % dq_issue_lanes(TMA_DQ) == 0, "issuing lanes split the warpgroups");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float* xchg = reinterpret_cast<float*>(smem + Plan::kXchg);
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = kv_full + 1;
    uint64_t* empty = full + STAGES;
    /* TMA_DQ >= 3: [2 wg + parity]; dq_full: the warpgroup's 128 threads after storing their partial into tile
       buffer (wg, parity) and fence.proxy.async; dq_empty: the issuing producer lane once the buffer's two
       reduce-adds have read it (cp.async.bulk.wait_group.read) */
    uint64_t* dq_full = empty + STAGES;
    uint64_t* dq_empty = dq_full + 2 * kConsumerWarpgroups;

    const int k0 = blockIdx.x * kBlockK; /* key tile 0 sees every query: first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int qt_begin = k0 / kBlockQ;   /* the first query tile that reaches key k0 */
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the warpgroup index through a shuffle: ptxas then knows it is warp-uniform, so the setmaxnreg regions
       below are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
    __shared__ int cta_abort; /* set by a bounded wait that gave up (see mbar_wait_bounded) */

    if (threadIdx.x == 0) {
        cta_abort = 0;
        if constexpr (TMA_DQ >= 3) { /* before init_pipeline_barriers: its fence publishes these too */
            for (int k = 0; k < 2 * kConsumerWarpgroups; k++) {
                mbar_init(&dq_full[k], 128);
                mbar_init(&dq_empty[k], 1);
            }
        }
        init_pipeline_barriers<STAGES>(kv_full, full, empty, 32, kConsumerThreads); /* full: 32 producer lanes (row state) */
    }
    __syncthreads();

    if (warpgroup == kConsumerWarpgroups) {
        if constexpr (PRODUCER_WG) setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* warps 9-11 of the producer warpgroup have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes row state for 2 queries ---- */
        if (lane == 0) {
            mbar_arrive_expect_tx(kv_full, 2 * Plan::kKeyTileBytes);
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                /* a half that starts at or past T (last key tile) loads the first half's rows again
                   instead of a box wholly out of bounds: its keys are all masked (dS = 0), and finite
                   data keeps 0 * K = 0 in dQ (uninitialised shared memory could hold NaN patterns) */
                const int row = (k0 + half * kBoxRows < T) ? k0 + half * kBoxRows : k0;
                tma_load_4d(k_s + half * Plan::kBoxBytes, &qkv_map, kv_full, 0, kSlotK * NH + h, row, b);
                tma_load_4d(v_s + half * Plan::kBoxBytes, &qkv_map, kv_full, 0, kSlotV * NH + h, row, b);
            }
        }
        /* TMA_DQ >= 3: the dQ tiles. Lane `lane` (< dq_issue_lanes) serves warpgroups lane, lane + lanes, ...;
           its bulk groups are its own (one per warpgroup and step, in step order). Iteration i of the loop below,
           after loading tile i: (1) wait until this lane's groups (steps <= i - 2) have read their buffers and
           free them (dq_empty of step i - 2: the consumers rewrite those buffers at the end of step i), then
           (2) wait for step i - 1's partials (dq_full) and send them. Why no deadlock: (1) waits on no thread;
           (2) waits for the consumers' step i - 1, which needed only tile i - 1 (loaded at iteration i - 1) and
           the buffers of step i - 3 (freed at iteration i - 1); the stage wait of iteration i + 1 (tile i - 1
           released, before the consumers' dQ stores) is then already satisfied. And no new coupling: the
           consumers' step i needs dq_empty of step i - 2, given right after the load of tile i that it already
           waited for. The last step is sent after the loop, and every group completes before the lane exits
           (the CTA's shared memory lives until then). */
        const bool dq_issuer = TMA_DQ >= 3 && lane < dq_issue_lanes(TMA_DQ);
        auto dq_release = [&](int step) {
            bulk_wait_group_read<0>();
            for (int w = lane; w < kConsumerWarpgroups; w += dq_issue_lanes(TMA_DQ)) mbar_arrive(&dq_empty[2 * w + (step & 1)]);
        };
        auto dq_send = [&](int step) {
            const int p = step & 1, q0 = (qt_begin + step) * kBlockQ;
            for (int w = lane; w < kConsumerWarpgroups; w += dq_issue_lanes(TMA_DQ)) {
                mbar_wait_bounded(&dq_full[2 * w + p], (uint32_t)((step / 2) & 1), kHangFull, kHangDqIndexBase + 2 * w + p,
                                  &cta_abort);
                const unsigned char* buf = smem + Plan::kDqBuf + (2 * w + p) * Plan::kDqTileBytes;
                tma_reduce_add_3d(&dq_map, buf, 0, q0, bh);
                tma_reduce_add_3d(&dq_map, buf + kBlockQ * kSwizzleRowBytes, 32, q0, bh);
                bulk_commit_group();
            }
        };
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % STAGES;
            const int q0 = (qt_begin + i) * kBlockQ;
            /* the row state of the tile's 2 queries per lane; under PREFETCH read before the wait below */
            float4 st[2];
            auto read_row_state = [&]() {
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int query = q0 + lane + 32 * half;
                    /* rows past T: values that leave P finite (they are masked to 0 anyway) */
                    st[half] = make_float4(0.f, 1.f, 0.f, 0.f);
                    if (query < T) {
                        const long long idx = (long long)bh * T + query;
                        const float a = stats[idx * 2];
                        st[half].x = (MODE == ATTN_BF16) ? a * kLog2e : a;                      /* fl(LSE log2 e) or m */
                        st[half].y = (MODE == ATTN_BF16) ? 1.f : __frcp_rn(stats[idx * 2 + 1]); /* 1 or fl(1 / l) */
                        st[half].z = D[idx];
                    }
                }
            };
            if constexpr (PREFETCH) read_row_state();
            /* stage s is free once the consumers released tile i - STAGES (phase i / STAGES - 1) */
            if (i >= STAGES) mbar_wait_bounded(&empty[s], (uint32_t)((i / STAGES - 1) & 1), kHangEmpty, s, &cta_abort);
            if constexpr (PREFETCH) {
                /* the copies first (their bytes announced without an arrival), then the row state, then every
                   lane's arrival (which releases its row-state writes) */
                if (lane == 0) {
                    mbar_expect_tx(&full[s], 2 * Plan::kQTileBytes);
                    tma_load_4d(q_s + s * Plan::kQTileBytes, &qkv_map, &full[s], 0, kSlotQ * NH + h, q0, b);
                    tma_load_4d(do_s + s * Plan::kQTileBytes, &dout_map, &full[s], 0, h, q0, b);
                }
                row_state[s * kBlockQ + lane] = st[0];
                row_state[s * kBlockQ + lane + 32] = st[1];
                mbar_arrive(&full[s]);
                continue;
            }
            read_row_state();
            row_state[s * kBlockQ + lane] = st[0];
            row_state[s * kBlockQ + lane + 32] = st[1];
            /* every lane's arrival releases its own row-state writes (the phase needs all 32); lane 0's
               arrival also announces the TMA bytes, which must land before the phase completes */
            if (lane == 0) {
                mbar_arrive_expect_tx(&full[s], 2 * Plan::kQTileBytes);
                tma_load_4d(q_s + s * Plan::kQTileBytes, &qkv_map, &full[s], 0, kSlotQ * NH + h, q0, b);
                tma_load_4d(do_s + s * Plan::kQTileBytes, &dout_map, &full[s], 0, h, q0, b);
            } else {
                mbar_arrive(&full[s]);
            }
            if constexpr (TMA_DQ >= 3) {
                if (dq_issuer) {
                    if (i >= 2) dq_release(i - 2);
                    if (i >= 1) dq_send(i - 1);
                }
            }
        }
        if constexpr (TMA_DQ >= 3) {
            if (dq_issuer) {
                dq_send(n_q_tiles - 1); /* n_q_tiles >= 1: key tile k0 < T sees query tile k0 / 64 */
                bulk_wait_group<0>();
            }
        }
        return;
    }
    if constexpr (PRODUCER_WG) setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp % 4, g = lane >> 2, t = lane & 3;
    const int tid_in_wg = threadIdx.x & 127;
    const int key0 = k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + wg * Plan::kDsBytes);
    const uint32_t k_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, v_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[32], dv[32], dq[32];
    float dq_out[32]; /* the dQ partial being sent (a copy of dq made after its wgmma completed; see flush_dq) */
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

    /* The dQ partial of query tile q0 (rows q0 + 16 warp_in_wg + g (+8), cols 8n + 2t) into the FP32
       workspace; `send` false: nothing goes out (the first step of the deferred flush, whose dq is zero).
       No branches (predicated red, selects): under OVERLAP this runs while wgmmas are in flight.
       SHARED_DQ: warpgroup wg owns columns 32 wg..32 wg + 31 (registers 16 wg..16 wg + 15); it hands its
       other 16 values to the partner through buffer `parity` (double-buffered by step: a buffer is
       rewritten two steps later, after a barrier that every reader of it has passed), then sends the sum
       of both partials for its own columns (a + b = b + a exactly: the order of the two is immaterial).
       The halves are picked by selects on wg, not by an index computed from it (that would put dq in
       local memory). */
    auto flush_dq = [&](int q0, int parity, bool send) {
        if constexpr (SHARED_DQ) {
            float* xb = xchg + parity * Plan::kXchgFloats;
#pragma unroll
            for (int k = 0; k < kDqHalfRegs; k++)
                xb[(wg * kDqHalfRegs + k) * 128 + tid_in_wg] = (wg == 0) ? dq_out[kDqHalfRegs + k] : dq_out[k];
            consumers_sync();
            const float* xp = xb + (1 - wg) * kDqHalfRegs * 128;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int query = q0 + warp_in_wg * 16 + g + 8 * r;
                float* dst = dq_acc + ((long long)bh * T + query) * kHS + 2 * t + wg * (kHS / 2);
#pragma unroll
                for (int nn = 0; nn < kHS / 16; nn++) {
                    const int k = 4 * nn + 2 * r; /* register within the owned half */
                    const float lo = ((wg == 0) ? dq_out[k] : dq_out[kDqHalfRegs + k]) + xp[k * 128 + tid_in_wg];
                    const float hi = ((wg == 0) ? dq_out[k + 1] : dq_out[kDqHalfRegs + k + 1]) + xp[(k + 1) * 128 + tid_in_wg];
                    red_add_f32x2_if(dst + 8 * nn, lo, hi, send && query < T);
                }
            }
        } else {
            (void)parity;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int query = q0 + warp_in_wg * 16 + g + 8 * r;
                float* dst = dq_acc + ((long long)bh * T + query) * kHS + 2 * t;
#pragma unroll
                for (int n = 0; n < kHS / 8; n++)
                    red_add_f32x2_if(dst + 8 * n, dq_out[4 * n + 2 * r], dq_out[4 * n + 2 * r + 1],
                                     ABLATE == 0 && send && query < T);
            }
        }
    };
#pragma unroll
    for (int k = 0; k < 32; k++) dq[k] = dq_out[k] = 0.f;

    mbar_wait_bounded(kv_full, 0, kHangKvFull, 0, &cta_abort);
    __syncwarp();

    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % STAGES;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / STAGES) & 1), kHangFull, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        /* Element 4j + 2r + e of S^T/dP^T: key key0 + 8r, query q0 + 8j + 2t + e. The mask can bite only
           where the tile reaches the warpgroup's keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        auto live = [&](int j, int e, int r) {
            const int query = q0 + 8 * j + 2 * t + e;
            return !masked || (key0 + 8 * r <= query && query < T);
        };
        float st[32], dpt[32];
        if constexpr (OVERLAP) {
#pragma unroll
            for (int k = 0; k < 32; k++) st[k] = dpt[k] = 0.f;
            reg_fence(st);
            reg_fence(dpt);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
                const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
                wgmma_m64n64k16_ss(st, make_smem_desc(k_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                                   make_smem_desc(q_addr + off, kUnusedLbo, kSwizzleAtomBytes));
            }
            wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
                const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
                wgmma_m64n64k16_ss(dpt, make_smem_desc(v_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                                   make_smem_desc(do_addr + off, kUnusedLbo, kSwizzleAtomBytes));
            }
            wgmma_commit();
            /* the previous step's dQ atomics go out while the score GEMMs run */
            flush_dq(q0 - kBlockQ, (i + 1) & 1, i > 0);
            wgmma_wait<1>();
            reg_fence(st);
        } else {
            warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);
        }
        /* P into st (masked entries exactly 0) */
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float4 row = rs[8 * j + 2 * t + e];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int idx = 4 * j + 2 * r + e;
                    st[idx] = live(j, e, r) ? recompute_prob<MODE>(st[idx], row.x, row.y, c) : 0.f;
                }
            }
        if constexpr (OVERLAP) {
            wgmma_wait<0>();
            reg_fence(dpt);
        }
        /* dS = P (dP - D) into dpt (masked entries exactly 0) */
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float dd = rs[8 * j + 2 * t + e].z;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int idx = 4 * j + 2 * r + e;
                    dpt[idx] = live(j, e, r) ? st[idx] * (dpt[idx] - dd) : 0.f;
                }
            }

        /* dV += bf(P)^T dO, dK += bf(dS)^T Q (A from registers, dO and Q N-major) as one batch; while it
           runs, bf(dS) goes to the staging tile [query][key] (packed again from the FP32 dS; the previous
           step's reads of the tile are behind the first barrier). Then dQ_partial = bf(dS) K_w (A loaded
           back from the tile, K_w N-major): without OVERLAP as a second batch after the first completed
           (the old kernel: 168 registers cannot hold all three in flight, C7512), with OVERLAP issued
           behind it and one wait for both. */
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
        if constexpr (ABLATE < 2) {
            /* TMA_DQ: this step's dQ tile buffer (parity i) was last sent at step i - 2; let its reduce-add finish
               reading it (at most the group of step i - 1 still reading) before the barrier below */
            if constexpr (TMA_DQ == 1) {
                if (tid_in_wg == 0) bulk_wait_group_read<1>();
            }
            warpgroup_sync(wg);
            stage_tile_transposed<kDsPitch>(ds_s, dpt, warp_in_wg, g, t);
            warpgroup_sync(wg);
        }
        if constexpr (!OVERLAP) {
            wgmma_wait<0>();
            reg_fence(dv);
            reg_fence(dk);
            reg_fence(pa);
            reg_fence(pds);
        }

        if constexpr (ABLATE < 2) {
            uint32_t adq[kWarpgroupKeys / kWgmmaK][4];
            load_staged_a_operand<kDsPitch>(adq, ds_s, warp_in_wg, g, t);
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
        }
        if constexpr (OVERLAP) {
            reg_fence(dv);
            reg_fence(dk);
            reg_fence(pa);
            reg_fence(pds);
        }
        /* dq_out = dq through a mov ptxas cannot see through: read straight from the wgmma's registers,
           the flush (which runs while the next step's wgmmas are in flight) made ptxas inject a wgmma wait
           (C7517) or serialise the wgmmas (C7518) */
#pragma unroll
        for (int k = 0; k < 32; k++) asm volatile("mov.b32 %0, %1;\n" : "=f"(dq_out[k]) : "f"(dq[k]));
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
        if constexpr (TMA_DQ == 2) {
            /* one tile per CTA: warpgroup 0 stores its partial into the tile of this step's parity and arrives on
               FULL[p]; warpgroup 1 waits there, adds its own partial in place (each thread the same positions: the
               two partials have the same fragment layout) and one of its threads sends the sum with two TMA
               reduce-adds. Tile p is rewritten by warpgroup 0 at step i + 2 only after FREE[p]: warp 0 of
               warpgroup 1 arrives there once that reduce-add has read the tile (at its step i + 1). Named barriers
               4 + p (FULL) and 6 + p (FREE); 1, 2 are the per-warpgroup ones, 3 consumers_sync. */
            const int p = i & 1;
            unsigned char* buf = smem + Plan::kDqBuf + p * Plan::kDqTileBytes;
            auto tile_at = [&](int rr, int n) {
                const int row = warp_in_wg * 16 + g + 8 * rr;
                const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
                return reinterpret_cast<float2*>(buf + (n >> 2) * (kBlockQ * kSwizzleRowBytes) + row * kSwizzleRowBytes +
                                                 chunk * 16 + (t & 1) * 8);
            };
            if (wg == 0) {
                if (i >= 2) named_bar_sync(6 + p, kConsumerThreads - 96);
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
#pragma unroll
                    for (int n = 0; n < kHS / 8; n++)
                        *tile_at(rr, n) = make_float2(dq_out[4 * n + 2 * rr], dq_out[4 * n + 2 * rr + 1]);
                named_bar_arrive(4 + p, kConsumerThreads);
            } else {
                named_bar_sync(4 + p, kConsumerThreads);
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
#pragma unroll
                    for (int n = 0; n < kHS / 8; n++) {
                        float2* x = tile_at(rr, n);
                        const float2 a = *x;
                        *x = make_float2(a.x + dq_out[4 * n + 2 * rr], a.y + dq_out[4 * n + 2 * rr + 1]);
                    }
                fence_proxy_async();
                warpgroup_sync(wg);
                if (warp_in_wg == 0) {
                    if (lane == 0) {
                        tma_reduce_add_3d(&dq_map, buf, 0, q0, bh);
                        tma_reduce_add_3d(&dq_map, buf + kBlockQ * kSwizzleRowBytes, 32, q0, bh);
                        bulk_commit_group();
                        bulk_wait_group_read<1>(); /* step i - 1's tile has been read */
                    }
                    __syncwarp();
                    /* free step i - 1's tile for warpgroup 0's step i + 1 (only if it has one) */
                    if (i >= 1 && i + 1 < n_q_tiles) named_bar_arrive(6 + (p ^ 1), kConsumerThreads - 96);
                }
            }
        } else if constexpr (TMA_DQ == 1) {
            /* the partial into the warpgroup's tile buffer of this step's parity (two 128B-swizzled boxes of 32
               columns: float2 (row r, cols 8n + 2t) is 16-byte chunk 2 (n % 4) + t / 2 ^ (r % 8) of row r of box
               n / 4, r % 8 = g), then one thread adds the tile to the accumulator with two TMA reduce-adds */
            unsigned char* buf = smem + Plan::kDqBuf + (wg * 2 + (i & 1)) * Plan::kDqTileBytes;
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int row = warp_in_wg * 16 + g + 8 * rr;
#pragma unroll
                for (int n = 0; n < kHS / 8; n++) {
                    const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
                    float2* dst = reinterpret_cast<float2*>(buf + (n >> 2) * (kBlockQ * kSwizzleRowBytes) +
                                                            row * kSwizzleRowBytes + chunk * 16 + (t & 1) * 8);
                    *dst = make_float2(dq_out[4 * n + 2 * rr], dq_out[4 * n + 2 * rr + 1]);
                }
            }
            fence_proxy_async();
            warpgroup_sync(wg);
            if (tid_in_wg == 0) {
                tma_reduce_add_3d(&dq_map, buf, 0, q0, bh);
                tma_reduce_add_3d(&dq_map, buf + kBlockQ * kSwizzleRowBytes, 32, q0, bh);
                bulk_commit_group();
            }
        } else if constexpr (TMA_DQ >= 3) {
            /* v7's tile stores, but the producer warp sends the tile: buffer (wg, parity) was last sent at step
               i - 2; wait until the producer says its reduce-adds have read it (dq_empty), store, make the stores
               visible to the async proxy, and arrive on dq_full. No thread of the warpgroup waits on a bulk
               group or on the other threads of its warpgroup here. */
            const int p = i & 1;
            unsigned char* buf = smem + Plan::kDqBuf + (wg * 2 + p) * Plan::kDqTileBytes;
            if (i >= 2)
                mbar_wait_bounded(&dq_empty[2 * wg + p], (uint32_t)((i / 2 - 1) & 1), kHangEmpty, kHangDqIndexBase + 2 * wg + p,
                                  &cta_abort);
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int row = warp_in_wg * 16 + g + 8 * rr;
#pragma unroll
                for (int n = 0; n < kHS / 8; n++) {
                    const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
                    float2* dst = reinterpret_cast<float2*>(buf + (n >> 2) * (kBlockQ * kSwizzleRowBytes) +
                                                            row * kSwizzleRowBytes + chunk * 16 + (t & 1) * 8);
                    *dst = make_float2(dq_out[4 * n + 2 * rr], dq_out[4 * n + 2 * rr + 1]);
                }
            }
            fence_proxy_async();
            mbar_arrive(&dq_full[2 * wg + p]);
        } else if constexpr (!OVERLAP) {
            flush_dq(q0, 0, true);
        }
    }
    if constexpr (OVERLAP) {
        if (n_q_tiles > 0) flush_dq((qt_begin + n_q_tiles - 1) * kBlockQ, (n_q_tiles + 1) & 1, true);
    }

    /* the last reduce-adds complete before the CTA's shared memory goes away (TMA_DQ >= 3: the producer lane waits) */
    if constexpr (TMA_DQ == 1) {
        if (tid_in_wg == 0) bulk_wait_group<0>();
    }
    if constexpr (TMA_DQ == 2) {
        if (wg == 1 && tid_in_wg == 0) bulk_wait_group<0>();
    }

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t) */
    const long long qkv_row = 3LL * NH * kHS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= T) continue;
        bf16* dk_row = dqkv + ((long long)b * T + key) * qkv_row + (long long)NH * kHS + (long long)h * kHS;
        bf16* dv_row = dk_row + (long long)NH * kHS;
#pragma unroll
        for (int n = 0; n < kHS / 8; n++) {
            *reinterpret_cast<uint32_t*>(dk_row + 8 * n + 2 * t) =
                pack_bf16x2(dk[4 * n + 2 * r] * scale, dk[4 * n + 2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dv_row + 8 * n + 2 * t) = pack_bf16x2(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
        }
    }
}

/* Layout probe: one warpgroup, one tile of everything at token 0 of batch 0 (K, V, Q of `head` from qkv;
   dO of `head` from dout; T < 64 so the TMA zero fill shows), through the kernel's own helpers, no
   softmax:
     out_st  = S^T = K Q^T              (NEW (1): m64n64k16 SS; K-major A and B)
     out_dpt = dP^T = V dO^T            (NEW (1), (2): the dout map)
     out_dv  = bf(S^T) dO               (register A repack, dO N-major)
     out_dk  = bf(dP^T) Q               (NEW (4): Q read N-major after being read K-major)
     out_dq  = bf(dP^T)^T K             (NEW (5), (6): staging [query][key] + A loads; K N-major)
   [64 x 64] FP32 each, row-major. The kernel loads its 128 keys as two 64-row boxes (NEW (3)); the probe
   loads tokens 0..63 into the SECOND 8 KB half of the K and V tiles and reads them there (warpgroup 1's
   offset), and Q/dO into stage 1, so the non-zero offsets are what is exercised. */
__global__ void __launch_bounds__(128, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ out_st, float* __restrict__ out_dpt,
                        float* __restrict__ out_dv, float* __restrict__ out_dk, float* __restrict__ out_dq) {
    using Plan = ProbePlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort; /* set by a bounded wait that gave up (see mbar_wait_bounded) */
    if (threadIdx.x == 0) {
        cta_abort = 0;
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
    mbar_wait_bounded(bar, 0, kHangProbe, 0, &cta_abort);
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

}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

/* A 4-D BF16 tensor {HS, heads, T, B} (innermost first) with token stride `heads * HS`, boxes of
   {64 columns, 1 head, 64 tokens, 1 batch}, 128-byte swizzle, zeros outside. qkv: heads = 3 NH
   (slot*NH + head); dout [B, T, NH, HS]: heads = NH. */
static CUtensorMap make_head_map(const bf16* base, AttnShape s, int heads, const char* what) {
    return encode_head_map(base, s, heads, kBoxRows, "hopper_bwd_fast", what);
}

/* The variants, cumulative, in the order they are expected to pay; 0 is hopper_bwd.cu's kernel as it ran
   on the H200 (13:11: 0.325 ms at B8 H16 T1024), so each line of the log says what one step added.
   HOPPER_BWD_FAST_VARIANTS picks them by their index here: v0..v10 are 0..10, the ablations a1 11 and a2 12
   (until v9 and v10 were added, a1 was 9 and a2 10: the session-5 logs name them, not their index). */
typedef void (*KernelLaunch)(dim3 grid, cudaStream_t stream, const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                             const CUtensorMap& dq_map,
                             const float* stats, const float* D, float* dq_acc, bf16* dqkv, int NH, int T, float scale,
                             float c);
template <int MODE, bool PRODUCER_WG, bool OVERLAP, bool SHARED_DQ, int STAGES, bool PREFETCH, int ABLATE, int TMA_DQ>
static void launch_fast_kernel(dim3 grid, cudaStream_t stream, const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                               const CUtensorMap& dq_map, const float* stats, const float* D, float* dq_acc, bf16* dqkv, int NH, int T,
                               float scale, float c) {
    hopper_bwd_fast_kernel<MODE, PRODUCER_WG, OVERLAP, SHARED_DQ, STAGES, PREFETCH, ABLATE, TMA_DQ>
        <<<grid, cta_threads(PRODUCER_WG), SmemPlan<STAGES, TMA_DQ>::kAlloc, stream>>>(qkv_map, dout_map, dq_map, stats, D, dq_acc,
                                                                              dqkv, NH, T, scale, c);
}
template <int MODE, bool PRODUCER_WG, bool OVERLAP, bool SHARED_DQ, int STAGES, bool PREFETCH, int ABLATE, int TMA_DQ>
static void allow_fast_kernel_smem(void) {
    cudaCheck(cudaFuncSetAttribute(hopper_bwd_fast_kernel<MODE, PRODUCER_WG, OVERLAP, SHARED_DQ, STAGES, PREFETCH, ABLATE, TMA_DQ>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan<STAGES, TMA_DQ>::kAlloc));
}
struct Variant {
    const char* name;   /* short, for the log */
    const char* change; /* what it adds to the variant before it */
    int timing_only;    /* an ablation: its results are wrong by design, so it is timed, not checked */
    KernelLaunch launch_bf16, launch_repair;
    void (*allow_smem_bf16)(void);
    void (*allow_smem_repair)(void);
};
#define FAST_VARIANT(name, change, PWG, OVL, SDQ, ST, PF, AB, TD)                                                    \
    {name, change, (AB) != 0, launch_fast_kernel<ATTN_BF16, PWG, OVL, SDQ, ST, PF, AB, TD>,                      \
     launch_fast_kernel<ATTN_REPAIR, PWG, OVL, SDQ, ST, PF, AB, TD>,                                             \
     allow_fast_kernel_smem<ATTN_BF16, PWG, OVL, SDQ, ST, PF, AB, TD>,                                           \
     allow_fast_kernel_smem<ATTN_REPAIR, PWG, OVL, SDQ, ST, PF, AB, TD>}
static const Variant kVariants[] = {
    FAST_VARIANT("v0 old", "hopper_bwd.cu's kernel: producer warp (288 threads), no overlap, dQ atomics per warpgroup,"
                 " 2 stages", false, false, false, 2, false, 0, 0),
    FAST_VARIANT("v1 +producer WG", "a producer warpgroup (384 threads), setmaxnreg 40 / 232", true, false, false, 2,
                 false, 0, 0),
    FAST_VARIANT("v2 +overlap", "S^T and dP^T as 2 groups (P under dP^T), dQ issued behind dV/dK, dQ atomics under"
                 " the next step's score GEMMs", true, true, false, 2, false, 0, 0),
    FAST_VARIANT("v3 +one dQ per CTA", "the warpgroups swap dQ halves through shared memory: one set of atomics"
                 " per 128 keys", true, true, true, 2, false, 0, 0),
    FAST_VARIANT("v4 +3 stages", "3 Q/dO stages", true, true, true, 3, false, 0, 0),
    /* session 5: v0 with one change each (the producer's prefetch), and v0's ablations, to see where its time goes */
    FAST_VARIANT("v5 v0+prefetch", "v0 whose producer reads the row state before waiting for the stage and issues"
                 " the TMA before writing it", false, false, false, 2, true, 0, 0),
    FAST_VARIANT("v6 v0+prefetch+3 stages", "v5 with 3 Q/dO stages", false, false, false, 3, true, 0, 0),
    FAST_VARIANT("v7 v0+TMA dQ", "v0 sending each warpgroup's dQ partial as a 64 x 64 FP32 tile through shared"
                 " memory with TMA reduce-adds (one thread, double-buffered) instead of 128 threads' red.global",
                 false, false, false, 2, false, 0, 1),
    FAST_VARIANT("v8 v7 one tile per CTA", "v7 with one dQ tile per 128 keys: warpgroup 0 stores its partial, warpgroup 1"
                 " adds its own in place and sends the sum (named barriers FULL/FREE between them)",
                 false, false, false, 2, false, 0, 2),
    FAST_VARIANT("v9 v7 producer sends dQ", "v7 whose dQ tiles are sent by lane 0 of the producer warp (mbarriers"
                 " dq_full / dq_empty per warpgroup and buffer): the consumers never wait on a bulk group",
                 false, false, false, 2, false, 0, 3),
    FAST_VARIANT("v10 v9 two issuing lanes", "v9 with lane w of the producer warp sending warpgroup w's tiles (both"
                 " lanes wait and issue side by side)", false, false, false, 2, false, 0, 4),
    FAST_VARIANT("a1 v0 no dQ atomics", "ablation (timing only): v0 computing the dQ partials but not sending them",
                 false, false, false, 2, false, 1, 0),
    FAST_VARIANT("a2 v0 no dQ", "ablation (timing only): v0 without the dQ staging, GEMM and atomics", false, false,
                 false, 2, false, 2, 0),
};
enum { kNumVariants = (int)(sizeof kVariants / sizeof kVariants[0]) };
#undef FAST_VARIANT

/* What a launch needs that depends on the shape and the buffers only (built once; the maps encode the
   qkv, dout and workspace pointers). */
struct HopperBwd {
    AttnShape shape;
    AttnMode mode;
    CUtensorMap qkv_map, dout_map, dq_map;
};

/* workspace: what hopper_bwd_launch will be given (its dQ accumulator is the TMA variants' reduce target) */
static HopperBwd hopper_bwd_prepare(AttnMode mode, AttnShape s, const bf16* qkv, const bf16* dout, float* workspace) {
    attention_cuda_check_shape(s, mode);
    if (s.HS != kHS) {
        die("hopper_bwd_fast: head size %d is not supported by this lab (B=%d NH=%d T=%d)\n"
            "  hint: only HS 64 is written; HS 128 needs a smaller query tile for the dK/dV accumulators",
            s.HS, s.B, s.NH, s.T);
    }
    if (mode != ATTN_BF16 && mode != ATTN_REPAIR) {
        die("hopper_bwd_fast: mode %s is not supported by this lab\n"
            "  hint: bf16 and repair only (fp32 splits P/dS into BF16 terms; gproj needs the row pass)",
            attn_mode_name(mode));
    }
    for (int v = 0; v < kNumVariants; v++) {
        kVariants[v].allow_smem_bf16();
        kVariants[v].allow_smem_repair();
    }
    HopperBwd f;
    f.shape = s;
    f.mode = mode;
    f.qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    f.dout_map = make_head_map(dout, s, s.NH, "dout");
    f.dq_map = encode_dq_acc_map(workspace, s, kBlockQ, "hopper_bwd_fast");
    return f;
}

/* The whole backward of the prepared shape with variant `variant`: prep (D, zero the accumulator), the
   key-major kernel, the dQ post-pass. Overwrites dqkv. workspace: B*NH*T*(HS + 1) floats (accumulator, D). */
static void hopper_bwd_launch(const HopperBwd& f, int variant, const bf16* out, const float* stats, bf16* dqkv,
                              float* workspace, const bf16* dout, cudaStream_t stream) {
    const AttnShape s = f.shape;
    const long long rows = (long long)s.B * s.NH * s.T;
    float* dq_acc = workspace;
    float* D = workspace + rows * s.HS;
    const float scale = attn_softmax_scale(s.HS), c = attn_exp2_scale(s.HS);
    constexpr int kPrepThreads = 256;
    hopper_bwd_prep_kernel<<<(unsigned)ceil_div(rows, kPrepThreads / 32), kPrepThreads, 0, stream>>>(
        out, dout, D, dq_acc, s.NH, s.T, rows);
    cudaCheckLastError();
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    const Variant& v = kVariants[variant];
    (f.mode == ATTN_BF16 ? v.launch_bf16 : v.launch_repair)(grid, stream, f.qkv_map, f.dout_map, f.dq_map, stats, D, dq_acc,
                                                            dqkv, s.NH, s.T, scale, c);
    cudaCheckLastError();
    const long long pairs = rows * s.HS / 2;
    hopper_bwd_dq_kernel<<<(unsigned)ceil_div(pairs, 256), 256, 0, stream>>>(dq_acc, dqkv, s.NH, s.T, scale, pairs);
    cudaCheckLastError();
}

/* cudaDeviceSynchronize (or an event wait) that, on failure, names the barrier that hung (if one did). */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile HangRecord* r = g_hang_host;
    const int hung = r != NULL && r->site > kHangNone && r->site <= kHangProbe;
    if (e == cudaSuccess && !hung) return;
    if (hung) {
        /* v9/v10's dQ barriers record the full / empty sites with index kHangDqIndexBase + 2 wg + parity */
        const int dq_barrier = r->index >= kHangDqIndexBase &&
                               (r->site == kHangFull || r->site == kHangEmpty);
        char name[128];
        if (dq_barrier) {
            snprintf(name, sizeof name, "%s (dQ tile of warpgroup %d, buffer %d; %s)",
                     r->site == kHangFull ? "dq_full" : "dq_empty", (r->index - kHangDqIndexBase) / 2,
                     (r->index - kHangDqIndexBase) % 2,
                     r->site == kHangFull ? "the producer lane waited for the consumers' partial"
                                          : "the consumers waited for the producer to free the buffer");
        } else {
            snprintf(name, sizeof name, "%s", hang_site_name(r->site));
        }
        fprintf(stderr, "hopper_bwd_fast: HANG: mbarrier %s, index %d, parity %d, block (%d, %d), thread %d"
                " (the CTA gave up waiting and ran on: its results are garbage)\n",
                name, r->index, r->parity, r->block_x, r->block_y, r->thread);
        printf("  FAIL HANG in %s: mbarrier %s never completed\n", where, name);
        fflush(stdout);
    }
    die("hopper_bwd_fast: %s after %s%s%s\n  hint: a HANG line names the mbarrier that never completed (a pipeline"
        " protocol bug of this variant); otherwise run under compute-sanitizer",
        hung ? "a hung mbarrier" : "a CUDA error", where, e != cudaSuccess ? ": " : "",
        e != cudaSuccess ? cudaGetErrorString(e) : "");
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the production backward, timing                                              */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerance (set before any run): the two kernels sum S, dP (tensor-core k order), dK/dV (query order
   within a tile) and dQ (64-key partials here, 128 there) differently; a changed FP32 S can flip the
   BF16 rounding of P or dS of one element. Expected worst ~2-3 ulps of the row scale. */
static const double kMaxUlps = 4.0;

/* One shape and mode: forward by attention_forward_cuda, then the portable production backward and variant
   `variant` on the same inputs (dqkv poisoned with NaN first), compared slot by slot. With time_it, the
   production backward, variant 0 (hopper_bwd.cu's kernel) and this variant timed, interleaved. */
static void check_shape(AttnMode mode, AttnShape s, float q_scale, int time_it, int variant) {
    char title[256];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d%s: wgmma backward %s vs attention_backward_cuda",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, q_scale != 1.f ? " (q x8)" : "", kVariants[variant].name);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    uint16_t* h_qkv = random_qkv_bits(s, q_scale);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *out, *dout, *dqkv_ref, *dqkv_new;
    float *stats, *ws_new;
    void* ws_ref;
    const size_t ws_ref_bytes = attention_cuda_workspace_bytes(s, mode);
    lab_upload(&qkv, h_qkv, nqkv * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    lab_upload(&dout, h_dout, nout * 2);
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    cudaCheck(cudaMalloc(&ws_ref, ws_ref_bytes));
    lab_alloc_poisoned(&ws_new, rows * (s.HS + 1) * 4);
    /* the reference is the portable mma.sync backward (force_portable): since the production dispatch runs
       hopper_bwd's kernel (= v0) on sm_90, the default path would compare v0 with itself */
    AttnOptions opt = {0};
    opt.force_portable = 1;
    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, 0);
    const HopperBwd bwd = hopper_bwd_prepare(mode, s, qkv, dout, ws_new);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
    hopper_bwd_launch(bwd, variant, out, stats, dqkv_new, ws_new, dout, 0);
    sync_or_report(cudaDeviceSynchronize(), title);

    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
    static const char* kSlotName[3] = {"dQ", "dK", "dV"};
    for (int slot = 0; slot < 3; slot++) {
        const SlotDiff d = compare_slot(h_ref, h_new, s, slot);
        printf("  %s: max |diff| %.3g, max %.2f BF16 ulps (at max(|a|, |b|, row RMS)), %zu of %zu over 1 ulp\n",
               kSlotName[slot], d.max_abs, d.max_ulps, d.over_1ulp, d.count);
        CHECK(d.nan_ref == 0, "%s: reference wrote every element, finite (%zu NaN)", kSlotName[slot], d.nan_ref);
        if (kVariants[variant].timing_only) continue; /* an ablation: wrong by design */
        CHECK(d.nan_new == 0, "%s %s: wgmma backward wrote every element, finite (%zu NaN left)", kVariants[variant].name,
              kSlotName[slot], d.nan_new);
        CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of the reference (max %.2f)", kVariants[variant].name,
              kSlotName[slot], kMaxUlps, d.max_ulps);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        float t_ref[kReps], t_old[kReps], t_new[kReps];
        for (int i = 0; i < kWarmup; i++) {
            attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
            hopper_bwd_launch(bwd, 0, out, stats, dqkv_new, ws_new, dout, 0);
            hopper_bwd_launch(bwd, variant, out, stats, dqkv_new, ws_new, dout, 0);
        }
        sync_or_report(cudaDeviceSynchronize(), "the warm-up launches");
        for (int i = 0; i < kReps; i++) {
            cudaCheck(cudaEventRecord(e0));
            attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(&t_ref[i], e0, e1));
            cudaCheck(cudaEventRecord(e0));
            hopper_bwd_launch(bwd, 0, out, stats, dqkv_new, ws_new, dout, 0);
            cudaCheck(cudaEventRecord(e1));
            sync_or_report(cudaEventSynchronize(e1), "a timed launch of v0");
            cudaCheck(cudaEventElapsedTime(&t_old[i], e0, e1));
            cudaCheck(cudaEventRecord(e0));
            hopper_bwd_launch(bwd, variant, out, stats, dqkv_new, ws_new, dout, 0);
            cudaCheck(cudaEventRecord(e1));
            sync_or_report(cudaEventSynchronize(e1), "a timed launch");
            cudaCheck(cudaEventElapsedTime(&t_new[i], e0, e1));
        }
        /* backward = 2.5 x the causal forward's 2 B H T^T d (FlashAttention count) */
        const double flops = 2.5 * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
        const float ms_ref = median_ms(t_ref, kReps), ms_old = median_ms(t_old, kReps), ms_new = median_ms(t_new, kReps);
        printf("  time (median of %d, warm inputs, prep + kernel + dQ pass): mma.sync %.4f ms; v0 (hopper_bwd) %.4f ms"
               " = %.1f TFLOP/s; %s %.4f ms = %.1f TFLOP/s; %s vs v0 %.2fx, vs mma.sync %.2fx\n",
               (int)kReps, ms_ref, ms_old, flops / ms_old * 1e-9, kVariants[variant].name, ms_new,
               flops / ms_new * 1e-9, kVariants[variant].name, ms_old / ms_new, ms_ref / ms_new);
        cudaCheck(cudaEventDestroy(e0));
        cudaCheck(cudaEventDestroy(e1));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_new));
}

/* Runs layout_probe_kernel on B1 NH3 T50 (head 1: slot and head coordinates; T < 64: zero fill) and
   checks its five products against double loops over the same BF16 values (the kernel's own S^T, dP^T,
   rounded to BF16 as it rounds them, for the three register-A products). */
static void layout_probe(void) {
    test_section("layout probe HS64: S^T, dP^T (SS n64), dV, dK (RS, N-major dO/Q), dQ (staged dS, N-major K)");
    ProbeInputs in = probe_inputs_make();
    float* d_out; /* 5 tiles of 64 x 64 */
    const size_t tile = 64 * 64;
    lab_alloc_poisoned(&d_out, 5 * tile * 4);
    const CUtensorMap qmap = make_head_map(in.qkv, in.s, 3 * in.s.NH, "qkv");
    const CUtensorMap dmap = make_head_map(in.dout, in.s, in.s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ProbePlan::kAlloc));
    layout_probe_kernel<<<1, 128, ProbePlan::kAlloc>>>(qmap, dmap, in.s.NH, in.head, d_out, d_out + tile,
                                                      d_out + 2 * tile, d_out + 3 * tile, d_out + 4 * tile);
    cudaCheckLastError();
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(5 * tile * 4);
    cudaCheck(cudaMemcpy(h, d_out, 5 * tile * 4, cudaMemcpyDeviceToHost));
    int bad[5];
    keymajor_probe_products(in, h, bad);
    CHECK(bad[0] == 0, "S^T = K Q^T: wgmma m64n64k16 SS (new wrapper), K-major K as A and Q as B, 64-row boxes,"
                       " the second 8 KB half of the K tile");
    CHECK(bad[1] == 0, "dP^T = V dO^T: the dout tensor map {HS, NH, T, B} (new), V as A, dO as K-major B");
    CHECK(bad[2] == 0, "dV = bf(S^T) dO: accumulator -> register A (as the forward), dO as N-major B");
    CHECK(bad[3] == 0, "dK = bf(dP^T) Q: the Q tile read N-major after being read K-major");
    CHECK(bad[4] == 0, "dQ = bf(dS) K: dS staged [query][key] in shared memory and read as A fragments,"
                       " K as N-major B at the warpgroup's 8 KB offset");
    free(h);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}

/* The checks of one child process: the layout probe (child -1) or every shape for one variant. */
static void run_child(int variant) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    require_sm90("hopper_bwd_fast");
    hang_record_install();
    if (variant < 0) {
        layout_probe();
        return;
    }
    printf("=== variant %s: %s\n", kVariants[variant].name, kVariants[variant].change);
    /* correctness: T = 1, T not a multiple of the tiles, B*NH from 1 to 128 */
    const AttnShape shapes[] = {
        {1, 1, 1, 64}, {1, 1, 77, 64}, {1, 2, 128, 64}, {1, 1, 129, 64}, {2, 3, 1000, 64}, {4, 32, 257, 64},
    };
    const AttnShape bench[] = {{8, 16, 1024, 64}, {4, 16, 2048, 64}};
    if (kVariants[variant].timing_only) { /* an ablation: timed at the benchmark shapes only */
        for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(ATTN_BF16, bench[i], 1.f, 1, variant);
        return;
    }
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(ATTN_BF16, shapes[i], 1.f, 0, variant);
    const AttnShape sharp = {1, 4, 500, 64};
    check_shape(ATTN_BF16, sharp, 8.f, 0, variant);
    const AttnShape repair_shapes[] = {{1, 1, 77, 64}, {2, 3, 1000, 64}};
    for (size_t i = 0; i < sizeof repair_shapes / sizeof repair_shapes[0]; i++)
        check_shape(ATTN_REPAIR, repair_shapes[i], 1.f, 0, variant);
    /* timing (and checks) at the benchmark shapes */
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(ATTN_BF16, bench[i], 1.f, 1, variant);
}

/* The parent never touches CUDA: each child (the probe, then one per variant) gets a fresh context, so a
   trap or a hang report in one variant (which kills its context) costs that variant's results only. A
   child reports its pass/fail counts through a pipe; one that dies without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) {
        die("usage: %s   (no arguments)\n  hint: the shapes are fixed in the program; HOPPER_BWD_FAST_VARIANTS=\"0 7\""
            " (indexes into the variant table: v0..v10 are 0..10, a1 11, a2 12) runs some variants only", argv[0]);
    }
    /* HOPPER_BWD_FAST_VARIANTS: a list of variant indexes (the probe always runs) */
    int selected[kNumVariants];
    const char* pick = getenv("HOPPER_BWD_FAST_VARIANTS");
    for (int v = 0; v < kNumVariants; v++) selected[v] = (pick == NULL);
    if (pick != NULL) {
        char* end = NULL;
        for (const char* p = pick; *p != '\0'; p = end) {
            const long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= kNumVariants) {
                die("hopper_bwd_fast: HOPPER_BWD_FAST_VARIANTS=\"%s\" is not a list of indexes 0..%d", pick,
                    kNumVariants - 1);
            }
            selected[v] = 1;
            while (*end == ' ' || *end == ',') end++;
        }
    }
    printf("hopper_bwd_fast: %d variants of the wgmma key-major backward (v9 and v10 written without a GPU, never"
           " run before this), each in its own process\n", kNumVariants);
    int passed = 0, failed = 0;
    for (int child = -1; child < kNumVariants; child++) {
        if (child >= 0 && !selected[child]) continue;
        const char* what = child < 0 ? "the layout probe" : kVariants[child].name;
        int fds[2];
        if (pipe(fds) != 0) die("hopper_bwd_fast: pipe() failed\n  hint: out of file descriptors?");
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) die("hopper_bwd_fast: fork() failed\n  hint: out of processes or memory?");
        if (pid == 0) {
            close(fds[0]);
            run_child(child);
            const int counts[2] = {g_tests_passed, g_tests_failed};
            fflush(stdout);
            if (write(fds[1], counts, sizeof counts) != (ssize_t)sizeof counts) _exit(3);
            _exit(0);
        }
        close(fds[1]);
        int counts[2] = {0, 0};
        const ssize_t got = read(fds[0], counts, sizeof counts);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (got != (ssize_t)sizeof counts) {
            printf("  FAIL %s: its process ended without reporting (%s %d); the checks after its last line did"
                   " not run\n", what, WIFSIGNALED(status) ? "signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            failed++;
        } else {
            printf("  %s: %d passed, %d failed (this process)\n", what, counts[0], counts[1]);
            passed += counts[0];
            failed += counts[1];
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
