/*
 * dev/attention_lab/hopper_bwd128_fp32.cu - lab of fp32 mode's key-major backward pass at head size 128 on
 * Hopper (sm_90a, wgmma + TMA, setmaxnreg): dK, dV and the dQ reduce-adds, from the D that production's Hopper
 * row pass (attention/attention_hopper_rows128.cu) leaves in the workspace.
 *
 * STATUS: written 2026-11-29 (session 5, engineer G) without a GPU; compile-checked only (ptxas below). Not
 * yet run: its first run is the lead's H200 call. Nothing in attention/ was changed for it.
 *
 * Why: after the Hopper HS-128 kernels landed, fp32 mode's fwd+bwd at B2 H16 T4096 d128 was 3.03 ms = 2.86x
 * bf16's (dev/results/device_s5/call5/attn/bench_attention.md; the target is at most 2.5x), and 2.25 ms of it
 * was the PORTABLE mma.sync key-major kernel attn_bwd_kernel<128, ATTN_FP32> (attention/attention_cuda.cu),
 * which fp32's default backward still runs after the Hopper row pass. This is the production bf16/repair
 * kernel's CTA (attention/attention_hopper_bwd128.cu) with fp32's numerics; at about 2x that kernel's cost
 * (~1.4 ms at T4096) fp32's fwd+bwd meets the target.
 *
 * What it computes (docs/ATTENTION_NUMERICS.md "fp32"; attn_bwd_kernel<128, ATTN_FP32>'s rounding points,
 * operation for operation; only the FP32 summation order differs):
 *   per CTA 128 keys of one (b, h), two consumer warpgroups of 64 keys; per query tile of 64 (from the
 *   diagonal on), per warpgroup:
 *     S^T = K_w Q^T, dP^T = V_w dO^T          FP32 (wgmma SS; hopper_bwd_common.cuh's keymajor128_scores)
 *     P = exp2((S - m) c) * fl(1/l)            (fp32's forward stores {m, l}; recompute_prob's non-bf16 arm)
 *     dS = P (dP - D)                          FP32, D from the workspace (the row pass's sum_j P dP);
 *                                              masked entries exactly 0
 *     dV += bf(P)^T dO + bf(P - bf(P))^T dO    two m64n128k16 RS batches chained into one accumulator
 *     dK += bf(dS)^T Q + bf(r1)^T Q            r1 = dS - bf(dS) (exact in FP32); the same chaining
 *     dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K   three BF16 terms (24 significant bits: dQ sums dS
 *                                              against keys that may share a large common offset, so a
 *                                              two-term split would leak like bf16 mode's rounding; the
 *                                              portable kernel's comment), each staged in shared memory as
 *                                              [query][key]; summed in one FP32 accumulator per warpgroup
 *   dK = bf(s acc), dV = bf(acc) into dqkv; the s-less dQ partial (one per 128 keys) goes to the FP32
 *   accumulator by TMA reduce-add, and the production post-pass (attn_bwd_dq_kernel) writes dQ = bf(s acc).
 *   Workspace contract = production's: prep zeroed dq_acc [B*NH*T][128], the row pass wrote D [B*NH*T].
 *
 * Layout (attention_hopper_bwd128.cu's CTA: FlashAttention-3's d128 split, no code copied): 384 threads, two
 * consumer warpgroups (setmaxnreg 240) and a producer warpgroup (24; one warp: TMA, row state {m, fl(1/l), D}).
 * Q/dO tiles of 64 queries in 2 stages. Per step and consumer warpgroup:
 *   S^T, dP^T                   m64n64k16 SS, 8 k-steps                                         32 + 32 regs
 *   (consumers_sync: both warpgroups have read the previous step's dS tiles - they are single-buffered)
 *   P, dS one k-step (16 queries) at a time (hopper_bwd_common.cuh's keymajor_probs_column<ATTN_FP32>) -> A
 *     words bf(P), bf(P - bf(P)), bf(dS), bf(r1) (16 registers per k-step; the FP32 values die step by step,
 *     gproj's order), and bf(dS), bf(r1), bf(r1 - bf(r1)) stored to the three shared tiles [query][key]
 *   dV += [bf(P), bf(P - bf(P))]^T dO, dK += [bf(dS), bf(r1)]^T Q: ONE batch of 16 m64n128k16 RS wgmmas
 *     (keymajor128_rs_issue, two chained per accumulator), 128 accumulator + 64 A registers in flight
 *   (consumers_sync: both warpgroups' halves of the three tiles written)
 *   dQ_half = sum over 3 terms x 2 key halves of A[64 q x 64 keys] K[64 keys x 64 dims]: six commit groups of
 *     4 m64n64k16 RS into one 32-register accumulator, A loaded from the tiles into two alternating register
 *     sets of 16 (wait<1> before a set is reloaded): 128 + 32 + 32 registers
 *   the dQ half into the warpgroup's swizzled FP32 tile, two TMA reduce-adds (production's flush)
 * Shared memory: K, V 32 KB each, Q, dO 2 stages x 16 KB each (128 KB), three dS tiles [64][128 + 8] BF16
 * (51 KB, single-buffered: double-buffering them would pass 227 KB; hence the extra barrier above), row state
 * [2][64] float4, barriers, two 16 KB FP32 dQ tiles: 215 KB (220160 bytes with the alignment slack; SmemPlan's
 * static_assert keeps it <= 227 KB).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math, with or without -lineinfo; `make
 * hopper_bwd128_fp32-regs` prints them): fp32keys128_kernel 168 at entry (240 after setmaxnreg.inc), 0 bytes
 * spill, no C75xx warning; probes 90 (scores, dQ parts) / 218 (dK+dV), 0 spill. What it took: at first 8-28
 * bytes spilled; two things, found by elimination (no disassembler here): the PRODUCER (24 registers) spilled
 * with its two-query row-state loop unrolled (now `#pragma unroll 1`; fp32's row state needs stats[2i+1] and an
 * frcp, as repair's: probably production repair's 8 B), and the dQ flush's four swizzled column offsets were
 * hoisted out of the loop and kept live (g now goes through an opaque move there). One batch of 16 wgmmas
 * spilled less than a dV batch issued before the dS packing (two batches).
 *
 * Forms new here (not yet run on a GPU in this shape) and the probe that checks each (child 0):
 *   (n1) dQ as six RS batches (3 tiles x 2 key halves) chained into one accumulator across separate commit
 *        groups with two alternating A register sets: probe "dQ three terms", and each of the second and
 *        third terms alone (their contribution is 2^-8 / 2^-16 of the first: invisible next to it);
 *   (n2) the per-k-step staging of the three terms (production's stage_ds split per k-step) - same probes;
 *   (n3) the fp32 operand split packed per k-step into four A arrays and two chained RS n128 batches per
 *        accumulator (the chain itself is gproj128's verified (g)): probe "dV two terms", "dK two terms".
 *   Re-checked on the way: S^T, dP^T through hopper_bwd_common.cuh's keymajor128_scores.
 *
 * Hangs: as the production kernels. Every mbarrier wait is bounded and gives up (hopper_bwd_common.cuh's
 * mbar_wait_give_up; the record is the lab's host-mapped AttnHopperHang, installed for this kernel as well as
 * production's by lab_watch_hangs + fp32keys128_watch_hangs), the consumers then write NaN over their dK/dV
 * rows; no __trap() on the consumer path (it disables setmaxnreg). The host names the barrier after every sync.
 *
 * How the checks compose production's pieces (no production hook, nothing in attention/ changed):
 *   reference  attention_backward_cuda(fp32, force_portable): portable row pass + attn_bwd_kernel<128, FP32>.
 *   (0) the default fp32 backward (prep + Hopper row pass + portable key-major + post-pass) itself, within 4
 *       ulps of the reference (context: what production gives today);
 *   (1) then, into a second workspace: dq_acc zeroed, D copied from the default run's workspace, this kernel
 *       on it (into a dqkv all NaN), then the lab's post-pass (attn_bwd_dq_kernel's one expression,
 *       bf(s * acc), copied: production's is file-local): dQ, dK, dV within 4 BF16 ulps of the reference.
 *   (2) the composed fp32 backward as ONE CUDA graph: attention_backward_cuda(fp32, default options) and this
 *       kernel captured from one stream (prep -> Hopper rows -> attn_bwd_kernel -> attn_bwd_dq_kernel -> this
 *       kernel), the portable key-major node removed and this kernel rewired between the row pass and the
 *       post-pass (rows -> this -> dq). On poisoned dqkv and workspace: all three slots within 4 ulps of the
 *       reference. This is what production would run; it is also what is timed.
 *   Timing (median of 21, queued behind a spin; warm inputs): this kernel alone, the composed graph, the
 *   default fp32 backward, the portable fp32 backward, the default bf16 backward (bf16's own forward).
 *
 * Moving it to production (mechanical): everything above "host: process plumbing" except the probe moves to a
 * new attention/attention_hopper_bwd128_fp32.cu (sm_90a-only rule in attention/module.mk, as
 * attention_hopper_bwd128_gproj.cu): the kernel, SmemPlan and device helpers unchanged; host
 * attention_backward_hopper_fp32_keys128(s, qkv, dout, stats, D, dq_acc, dqkv, stream) = fp32keys128_prepare +
 * fp32keys128_launch (the same signature as attention_backward_hopper_keys), a _watch_hangs (install the
 * record pointer into g_hang_record, from attention_hopper_bwd_watch_hangs) and, if wanted, the probe as a
 * _layout_probe entry. attention_cuda.cu's backward_launch then calls it instead of attn_bwd_kernel when
 * MODE == ATTN_FP32 && HS == 128 && hopper_rows (same arguments: w.D, w.dq_acc; prep and post-pass stay), and
 * attention_backward_cuda_path already says "hopper" for that call. lab_dq_postpass stays here.
 *
 * Usage: hopper_bwd128_fp32   (no arguments; needs an sm_90 GPU). Three processes (probe; checks; benchmark
 * shapes with timings), "N passed, N failed" summed at the end; a process that dies without reporting counts
 * as one failure. Run it under `timeout`.
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
#include "attention/attention_hopper_bwd.cuh"
#include "attention/attn_cases.h"
#include "attention/hopper_wgmma.cuh"
#include "attention/hopper_bwd_common.cuh"
#include "attention/tile_order.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = 128;                /* the head size of this lab */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kDqCols = kHS / kConsumerWarpgroups; /* head-dim columns of dQ per consumer warpgroup */
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kQSteps = kBlockQ / kWgmmaK;       /* k-steps of the dV/dK GEMMs (the tile's 64 queries) */
constexpr int kKeyHalves = kBlockK / kTileK;     /* 64-key halves of the dQ GEMM's reduced dimension */
constexpr uint32_t kUnusedLbo = 16;              /* N = 64 B operands ignore LBO */
constexpr int kDsPitch = kBlockK + 8;            /* BF16 per row of a staged dS term [query][128 keys] */
constexpr int kDsTerms = 3;                      /* bf(dS), bf(r1), bf(r1 - bf(r1)) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 };     /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ && kQSteps == kTileKSteps,
              "S^T per warpgroup is 64 x 64: its 32 registers are the 4 k-steps of the RS GEMMs' A");

struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;           /* 8 KB */
    static constexpr int kKeyChunkBytes = kBlockK * kSwizzleRowBytes;       /* 16 KB: 128 keys x 64 columns */
    static constexpr int kKeyTileBytes = kChunks * kKeyChunkBytes;          /* 32 KB */
    static constexpr int kQChunkBytes = kBlockQ * kSwizzleRowBytes;         /* 8 KB: 64 queries x 64 columns */
    static constexpr int kQTileBytes = kChunks * kQChunkBytes;              /* 16 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;            /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;   /* kStages tiles */
    static constexpr int kDs = kDO + kStages * kQTileBytes;  /* kDsTerms tiles of [64 query][kDsPitch] BF16 */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kRowState = kDs + kDsTerms * kDsBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    /* per warpgroup one FP32 dQ tile [64 queries][its 64 columns]: two 128B-swizzled boxes of 32 columns */
    static constexpr int kDqTileBytes = kBlockQ * kDqCols * 4;
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kBytes = kDqTile + kConsumerWarpgroups * kDqTileBytes;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state");
    static_assert(kKeyChunkBytes == kKeymajor128KeyChunkBytes && kQChunkBytes == kKeymajor128QChunkBytes &&
                      kHS == kKeymajor128HS && kQSteps == kKeymajor128QSteps,
                  "hopper_bwd_common.cuh's keymajor128 steps assume this plan's tile strides");
    static_assert(kConsumerWarpgroups * kDqTileBytes >= kDsBytes, "the probe uses the dQ tiles as a zero BF16 dS tile");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};
constexpr int kDsTileElems = SmemPlan::kDsBytes / 2; /* BF16 elements from one staged dS term to the next */

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads, 2 and 3 the warpgroups'). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* ---- the fp32 operand split of one k-step (16 queries) ---- */

/* x - bf(x), exact in FP32 (attention/mma_bf16.cuh's bf16_residual; the same expression). */
__device__ __forceinline__ float bf16_residual(float x) { return x - __bfloat162float(__float2bfloat16_rn(x)); }

/* k-step kk's register A words from a 64 x 64 FP32 accumulator x (P or dS), registers 8kk..8kk+7 (key
   g + 8 (i & 1), query 16kk + 8 (i >> 1) + 2t + e for register 8kk + 2i + e: pack_acc_a_operand's words):
   hi = bf(x), lo = bf(x - bf(x)); with x2 (dS only) also bf(r1 - bf(r1)) for r1 = x - bf(x). These are
   attn_bwd_kernel<HS, ATTN_FP32>'s ap / ap_lo and ads / ads_lo / x2 words. */
template <bool kThirdTerm>
__device__ __forceinline__ void pack_split_step(uint32_t (&hi)[4], uint32_t (&lo)[4], uint32_t (&x2)[4],
                                                const float (&x)[32], int kk) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float v0 = x[8 * kk + 2 * i], v1 = x[8 * kk + 2 * i + 1];
        const float r0 = bf16_residual(v0), r1 = bf16_residual(v1);
        hi[i] = pack_bf16x2(v0, v1);
        lo[i] = pack_bf16x2(r0, r1);
        if (kThirdTerm) x2[i] = pack_bf16x2(bf16_residual(r0), bf16_residual(r1));
    }
}

/* One k-step's packed dS^T words to a shared tile as [query][key] (attention_hopper_bwd128.cu's stage_ds,
   one k-step of it: its assumption (c)): word w[i] holds key key_col + 8 (i & 1) and queries q, q + 1 with
   q = 16kk + 8 (i >> 1) + 2t (low half: q). Ordinary register reads, done before any wgmma reads w as A. */
__device__ __forceinline__ void stage_ds_step(bf16* tile, const uint32_t (&w)[4], int kk, int key_col, int t) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int key = key_col + 8 * (i & 1);
        const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
        tile[q * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w[i] & 0xFFFFu));
        tile[(q + 1) * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w[i] >> 16));
    }
}

/* dQ_half[64 queries x 64 dims] += sum over the three staged terms and the two 64-key halves of
   A[64 q x 64 keys] K[64 keys x 64 dims] (form (n1)): A loaded from tile `term` (tiles + term kDsTileElems,
   [query][key],
   columns 64 half..) into two alternating register sets; B = K chunk k_chunk_addr read N-major, key half
   `half` one 8 KB box further (16 rows = 2048 bytes per k-step: production's form (d), the same descriptors).
   Six commit groups; a set is reloaded only after wait<1> says its group completed. Returns with everything
   waited for. The caller zeroed and fenced dq. */
__device__ __forceinline__ void warpgroup_dq_terms(float (&dq)[32], const bf16* tiles,
                                                   uint32_t k_chunk_addr, int warp_in_wg, int g, int t) {
    uint32_t a0[kTileKSteps][4], a1[kTileKSteps][4];
    constexpr int kPieces = kDsTerms * kKeyHalves;
    auto issue = [&](const uint32_t (&a)[kTileKSteps][4], int half) {
#pragma unroll
        for (int kk = 0; kk < kTileKSteps; kk++)
            wgmma_m64n64k16_rs(dq, a[kk], make_smem_desc(k_chunk_addr + half * kBoxRows * kSwizzleRowBytes +
                                                             kk * kWgmmaK * kSwizzleRowBytes,
                                                         kUnusedLbo, kSwizzleAtomBytes));
    };
#pragma unroll
    for (int piece = 0; piece < kPieces; piece++) {
        const int term = piece / kKeyHalves, half = piece % kKeyHalves;
        uint32_t (&a)[kTileKSteps][4] = (piece & 1) ? a1 : a0;
        if (piece >= 2) { /* the group that read this set (piece - 2) is the older of the two in flight */
            wgmma_wait<1>();
            reg_fence(a);
        }
        load_staged_a_operand<kDsPitch>(a, tiles + term * kDsTileElems + half * kTileK, warp_in_wg, g, t);
        reg_fence(a);
        wgmma_fence();
        issue(a, half);
        wgmma_commit();
    }
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(a0);
    reg_fence(a1);
}

/* bounded mbarrier waits that give up (no trap under setmaxnreg: attention_hopper_bwd128.cu's file comment) */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
__device__ AttnHopperHang* g_hang_record;       /* set by fp32keys128_watch_hangs; NULL: no record */
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* Spins for `ns` nanoseconds of the global timer (bounded): holds the GPU while timed launches queue. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* dQ = bf(s * accumulator) into the q slot of dqkv: attention_cuda.cu's attn_bwd_dq_kernel<128> expression
   (file-local there), for check (1) only; the composed graph (2) runs production's own post-pass. */
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
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(v.x * scale, v.y * scale);
}

/* fp32's key-major pass at HS 128 (see the file comment). stats {m, l} per row, D [B*NH*T] from the
   workspace; writes the k and v slots of dqkv and adds the s-less dQ partials to dq_acc (through dq_map). */
__global__ void __launch_bounds__(kThreads, 1)
    fp32keys128_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
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
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
    __shared__ int cta_abort; /* set by a bounded wait that gave up (mbar_wait_bounded) */

    if (threadIdx.x == 0) {
        cta_abort = 0;
        /* full: 32 producer lanes (row state) + the TMA bytes; empty: every consumer thread, after its last read */
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads);
    }
    __syncthreads();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* warps 9-11 of the producer warpgroup have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 2 queries ---- */
        if (lane == 0) {
            mbar_arrive_expect_tx(kv_full, 2 * Plan::kKeyTileBytes);
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                /* a half that starts at or past T (last key tile) loads the first half's rows again instead
                   of a box wholly out of bounds: its keys are all masked (dS = 0), and finite data keeps
                   0 * K = 0 in dQ */
                const int row = (k0 + half * kBoxRows < T) ? k0 + half * kBoxRows : k0;
                for (int ch = 0; ch < kChunks; ch++) {
                    const int dst = ch * Plan::kKeyChunkBytes + half * Plan::kBoxBytes;
                    tma_load_4d(k_s + dst, &qkv_map, kv_full, ch * kChunkCols, kSlotK * NH + h, row, b);
                    tma_load_4d(v_s + dst, &qkv_map, kv_full, ch * kChunkCols, kSlotV * NH + h, row, b);
                }
            }
        }
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            /* stage s is free once the consumers released tile i - kStages (phase i / kStages - 1) */
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
            /* one query at a time (not unrolled): the producer has 24 registers, and with two queries' loads
               in flight it spilled (production repair's 8 B are probably this) */
#pragma unroll 1
            for (int half = 0; half < 2; half++) {
                const int ql = lane + 32 * half, query = q0 + ql;
                float4 st = make_float4(0.f, 1.f, 0.f, 0.f); /* rows past T: P stays finite (masked anyway) */
                if (query < T) {
                    const long long idx = (long long)bh * T + query;
                    st.x = stats[idx * 2];                /* m (raw score units) */
                    st.y = __frcp_rn(stats[idx * 2 + 1]); /* fl(1 / l) */
                    st.z = D[idx];
                }
                row_state[s * kBlockQ + ql] = st;
            }
            /* every lane's arrival releases its own row-state writes; lane 0's also announces the TMA bytes */
            if (lane == 0) {
                mbar_arrive_expect_tx(&full[s], 2 * Plan::kQTileBytes);
                for (int ch = 0; ch < kChunks; ch++) {
                    const int dst = s * Plan::kQTileBytes + ch * Plan::kQChunkBytes;
                    tma_load_4d(q_s + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotQ * NH + h, q0, b);
                    tma_load_4d(do_s + dst, &dout_map, &full[s], ch * kChunkCols, h, q0, b);
                }
            } else {
                mbar_arrive(&full[s]);
            }
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63 (dK, dV rows) and dQ columns 64 wg .. +63 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g; /* this thread's keys: key_col, key_col + 8 */
    const int key0 = k0 + key_col;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    const uint32_t k_dq_addr = smem_u32(k_s) + wg * Plan::kKeyChunkBytes; /* chunk wg: dims 64 wg .. +63 */
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs); /* term k at k * kDsTileElems */
    float dk[kHS / 2], dv[kHS / 2];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

#pragma unroll 1
    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        float st[32], dpt[32];
        keymajor128_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);
        /* both warpgroups have loaded the previous step's dS terms (their dQ A operands) before either
           rewrites the single-buffered tiles below */
        consumers_sync();

        /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions), their four A words and the three
           staged dS terms, one k-step (16 queries) at a time, so the FP32 values die step by step. Element
           4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e. The mask can bite only where the tile reaches
           the warpgroup's keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kQSteps][4], pa_lo[kQSteps][4], pds[kQSteps][4], pds_lo[kQSteps][4];
#pragma unroll
        for (int kk = 0; kk < kQSteps; kk++) {
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
            stage_ds_step(ds_tiles, pds[kk], kk, key_col, t);
            stage_ds_step(ds_tiles + kDsTileElems, pds_lo[kk], kk, key_col, t);
            stage_ds_step(ds_tiles + 2 * kDsTileElems, x2, kk, key_col, t);
        }
        /* dV += bf(P)^T dO + bf(P - bf(P))^T dO, dK += bf(dS)^T Q + bf(r1)^T Q: one batch of 16 wgmmas, two
           chains of 8 on one accumulator each (128 accumulator + 64 A registers in flight) */
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(pds);
        reg_fence(pds_lo);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        keymajor128_rs_issue(dv, pa, do_addr);
        keymajor128_rs_issue(dv, pa_lo, do_addr);
        keymajor128_rs_issue(dk, pds, q_addr);
        keymajor128_rs_issue(dk, pds_lo, q_addr);
        wgmma_commit();
        /* the previous step's dQ reduce-adds have read this warpgroup's dQ tile before the barrier below lets
           its threads rewrite it */
        if ((threadIdx.x & 127) == 0) bulk_wait_group_read<0>();
        consumers_sync(); /* both warpgroups' halves of the three dS tiles are written */
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(pds);
        reg_fence(pds_lo);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

        /* dQ for all 64 queries, this warpgroup's 64 columns, over the CTA's 128 keys and the three terms */
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(dq);
        warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);

        /* rows = queries q0 + 16 warp_in_wg + g (+8), cols 64 wg + 8n + 2t: into the warpgroup's swizzled dQ
           tile, then one thread adds it to the accumulator with two TMA reduce-adds (rows past T are outside
           the map): attention_hopper_bwd128.cu's flush, unchanged */
        unsigned char* dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
        /* g passed through an opaque move here: otherwise the four swizzled column offsets below are hoisted
           out of the loop and kept live across it (8 bytes of spills at 240 registers) */
        int g_here;
        asm volatile("mov.u32 %0, %1;\n" : "=r"(g_here) : "r"(g));
        unsigned char* dq_row = dq_tile + (warp_in_wg * 16 + g_here) * kSwizzleRowBytes + (t & 1) * 8;
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int n = 0; n < kDqCols / 8; n++) {
                const int chunk = (2 * (n & 3) + (t >> 1)) ^ g_here;
                *reinterpret_cast<float2*>(dq_row + (n >> 2) * (kBlockQ * kSwizzleRowBytes) + 8 * r * kSwizzleRowBytes +
                                           chunk * 16) = make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
            }
        fence_proxy_async(); /* the tile's generic-proxy stores, before the async proxy (TMA) reads them */
        named_bar_sync(2 + wg, 128); /* this warpgroup's 128 threads (barrier 1 is consumers_sync's) */
        if ((threadIdx.x & 127) == 0) {
            tma_reduce_add_3d(&dq_map, dq_tile, wg * kDqCols, q0, bh);
            tma_reduce_add_3d(&dq_map, dq_tile + kBlockQ * kSwizzleRowBytes, wg * kDqCols + 32, q0, bh);
            bulk_commit_group();
        }
    }
    /* the last reduce-adds complete before the CTA's shared memory goes away */
    if ((threadIdx.x & 127) == 0) bulk_wait_group<0>();

    /* a wait of this CTA that gave up is visible to every consumer thread after this barrier */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys; NaN in both rows if the CTA gave up a wait */
    const long long qkv_row = 3LL * NH * kHS;
    constexpr uint32_t kNanPair = 0x7FC07FC0u; /* two BF16 quiet NaNs */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= T) continue;
        bf16* dk_row = dqkv + ((long long)b * T + key) * qkv_row + (long long)NH * kHS + (long long)h * kHS;
        bf16* dv_row = dk_row + (long long)NH * kHS;
#pragma unroll
        for (int n = 0; n < kHS / 8; n++) {
            *reinterpret_cast<uint32_t*>(dk_row + 8 * n + 2 * t) =
                gave_up ? kNanPair : pack_bf16x2(dk[4 * n + 2 * r] * scale, dk[4 * n + 2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dv_row + 8 * n + 2 * t) =
                gave_up ? kNanPair : pack_bf16x2(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
        }
    }
}

/* The probe's outputs of one accumulator over this thread's key rows: [keys][N] FP32, row-major; element
   4j + 2r + e is row key_col + 8r, column 8j + 2t + e (hopper_wgmma.cuh's fragment layout). */
template <int REGS>
__device__ __forceinline__ void store_key_rows(float* out, const float (&acc)[REGS], int key_col, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) out[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
}

/* Layout probe: the two consumer warpgroups (256 threads), one step, no softmax, at batch 0, head `head`:
   K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 in STAGE 1, P := S^T and
   dS := dP^T split and staged through the kernel's own helpers. One launch per part (S^T, dP^T recomputed
   by each; deterministic):
     kProbeScores  out_st, out_dpt [128 keys][64 queries]   S^T = K Q^T, dP^T = V dO^T       re-check (a)
     kProbeDkDv    out_dv  [128 keys][128]  (bf(S^T) + bf(S^T - bf(S^T))) dO                  (n3)
                   out_dk  [128 keys][128]  (bf(dP^T) + bf(r1)) Q, r1 = dP^T - bf(dP^T)        (n3)
     kProbeDq      out_dq  [64 queries][128]  (bf(dP^T) + bf(r1) + bf(r1 - bf(r1)))^T K        (n1), (n2)
     kProbeDqLo    out_dq_lo: the same with only the bf(r1) tile non-zero                     (n1), (n2)
     kProbeDqLo2   out_dq_lo2: only the bf(r1 - bf(r1)) tile non-zero                          (n1), (n2)
   FP32, row-major. */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeDq = 2, kProbeDqLo = 3, kProbeDqLo2 = 4 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq, *dq_lo, *dq_lo2;
};
/* The probe's split products (parts kProbeDkDv .. kProbeDqLo2) from its S^T (as P) and dP^T (as dS). */
template <int kPart>
__device__ __forceinline__ void fp32keys128_probe_products(const float (&st)[32], const float (&dpt)[32], bf16* ds_tiles,
                                                           uint32_t k_dq_addr, uint32_t q_addr, uint32_t do_addr,
                                                           const ProbeOut& out, int key_col, int warp_in_wg, int g,
                                                           int t) {
    uint32_t pa[kQSteps][4], pa_lo[kQSteps][4], pds[kQSteps][4], pds_lo[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        uint32_t unused[4], x2[4];
        pack_split_step<false>(pa[kk], pa_lo[kk], unused, st, kk);
        pack_split_step<true>(pds[kk], pds_lo[kk], x2, dpt, kk);
        uint32_t w0[4], w1[4], w2[4]; /* the part's tiles: its terms, zeros elsewhere */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w0[i] = (kPart == kProbeDq) ? pds[kk][i] : 0u;
            w1[i] = (kPart == kProbeDq || kPart == kProbeDqLo) ? pds_lo[kk][i] : 0u;
            w2[i] = (kPart == kProbeDqLo) ? 0u : x2[i];
        }
        stage_ds_step(ds_tiles, w0, kk, key_col, t);
        stage_ds_step(ds_tiles + kDsTileElems, w1, kk, key_col, t);
        stage_ds_step(ds_tiles + 2 * kDsTileElems, w2, kk, key_col, t);
    }
    if constexpr (kPart == kProbeDkDv) {
        float acc[kHS / 2];
#pragma unroll
        for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(acc);
        wgmma_fence();
        keymajor128_rs_issue(acc, pa, do_addr);
        keymajor128_rs_issue(acc, pa_lo, do_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        store_key_rows(out.dv, acc, key_col, t);
#pragma unroll
        for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
        reg_fence(pds);
        reg_fence(pds_lo);
        reg_fence(acc);
        wgmma_fence();
        keymajor128_rs_issue(acc, pds, q_addr);
        keymajor128_rs_issue(acc, pds_lo, q_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        store_key_rows(out.dk, acc, key_col, t);
    } else {
        consumers_sync(); /* both warpgroups' halves of the tiles written */
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(dq);
        warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);
        float* o = (kPart == kProbeDq) ? out.dq : (kPart == kProbeDqLo) ? out.dq_lo : out.dq_lo2;
#pragma unroll
        for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    o[(warp_in_wg * 16 + g + 8 * r) * kHS + (key_col / kWarpgroupKeys) * kDqCols + 8 * n + 2 * t + e] =
                        dq[4 * n + 2 * r + e];
    }
}

template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    fp32keys128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                             int NH, int head, ProbeOut out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs);
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 2 * Plan::kKeyTileBytes + 2 * Plan::kQTileBytes);
        for (int ch = 0; ch < kChunks; ch++) {
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                const int dst = ch * Plan::kKeyChunkBytes + half * Plan::kBoxBytes;
                tma_load_4d(k_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotK * NH + head, half * kBoxRows, 0);
                tma_load_4d(v_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotV * NH + head, half * kBoxRows, 0);
            }
            tma_load_4d(q_t + ch * Plan::kQChunkBytes, &qkv_map, bar, ch * kChunkCols, kSlotQ * NH + head, 0, 0);
            tma_load_4d(do_t + ch * Plan::kQChunkBytes, &dout_map, bar, ch * kChunkCols, head, 0, 0);
        }
    }
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp / 4, warp_in_wg = warp % 4;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[32], dpt[32];
    keymajor128_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes, q_addr,
                       do_addr);
    if constexpr (kPart == kProbeScores) {
        store_key_rows(out.st, st, key_col, t);
        store_key_rows(out.dpt, dpt, key_col, t);
    } else {
        fp32keys128_probe_products<kPart>(st, dpt, ds_tiles, smem_u32(k_s) + wg * Plan::kKeyChunkBytes, q_addr, do_addr,
                                         out, key_col, warp_in_wg, g, t);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

static CUtensorMap make_head_map(const bf16* base, AttnShape s, int heads, const char* what) {
    static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
    return encode_head_map(base, s, heads, kBoxRows, "hopper_bwd128_fp32", what);
}

/* What a launch needs that depends on the shape and the input buffers only (encoded once per case). */
struct Fp32Keys128 {
    AttnShape shape;
    CUtensorMap qkv_map, dout_map;
};

static Fp32Keys128 fp32keys128_prepare(AttnShape s, const bf16* qkv, const bf16* dout) {
    attention_cuda_check_shape(s, ATTN_FP32);
    if (s.HS != kHS || ((uintptr_t)qkv % 16) != 0 || ((uintptr_t)dout % 16) != 0) {
        die("hopper_bwd128_fp32: unsupported call (B=%d NH=%d T=%d HS=%d)\n"
            "  hint: HS 128, 16-byte aligned qkv and dout", s.B, s.NH, s.T, s.HS);
    }
    cudaCheck(cudaFuncSetAttribute(fp32keys128_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    Fp32Keys128 f;
    f.shape = s;
    f.qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    f.dout_map = make_head_map(dout, s, s.NH, "dout");
    return f;
}

/* The key-major fp32 pass alone (asynchronous on `stream`): D [B*NH*T] as the workspace holds it; adds dQ
   partials to dq_acc [B*NH*T][128] (zeroed by the caller) and writes the k and v slots of dqkv. */
static void fp32keys128_launch(const Fp32Keys128& f, const float* stats, const float* D, float* dq_acc, bf16* dqkv,
                               cudaStream_t stream) {
    const AttnShape s = f.shape;
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, "hopper_bwd128_fp32");
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    fp32keys128_kernel<<<grid, kThreads, SmemPlan::kAlloc, stream>>>(f.qkv_map, f.dout_map, dq_map, stats, D, dqkv,
                                                                     s.NH, s.T, attn_softmax_scale(kHS),
                                                                     attn_exp2_scale(kHS));
    cudaCheckLastError();
}

/* This kernel's hang record: the same host-mapped record as production's (hopper_lab.cuh's lab_watch_hangs
   installs that one first), so lab_sync_or_report names a hung barrier of either. */
static void fp32keys128_watch_hangs(void) {
    AttnHopperHang* dev = NULL;
    cudaCheck(cudaHostGetDevicePointer((void**)&dev, g_lab_hang, 0));
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &dev, sizeof dev));
}

}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: process plumbing, checks and timing                                                         */
/* ------------------------------------------------------------------------------------------------ */

static int g_report_fd = -1; /* the child's end of the pipe to the parent (pass/fail counts) */

/* Sends this child's counts to the parent and ends the process (also the way out after a fatal error). */
static void child_report_and_exit(void) {
    const int counts[2] = {g_tests_passed, g_tests_failed};
    fflush(stdout);
    fflush(stderr);
    if (g_report_fd < 0 || write(g_report_fd, counts, sizeof counts) != (ssize_t)sizeof counts) _exit(3);
    _exit(0);
}

/* A synchronisation result plus the hang record (production's kernels and this one share it): on either, one
   FAIL line naming the barrier (or the CUDA error), then the child reports and ends. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return;
    if (hung)
        CHECK(0, "HANG in %s: mbarrier %s never completed (index %d, parity %d, block (%d, %d), thread %d; the CTA"
              " gave up and ran on: its results are NaN)", where, attn_hopper_hang_site_name(r->site), r->index,
              r->parity, r->block_x, r->block_y, r->thread);
    if (e != cudaSuccess)
        CHECK(0, "CUDA error after %s: %s (hint: run under compute-sanitizer)", where, cudaGetErrorString(e));
    child_report_and_exit();
}

/* Tolerance, fixed before any run: only FP32 sum orders differ (wgmma k order, 64- vs 32-query tiles, the
   chained terms summed per batch, the row pass's D), and a changed FP32 S or dP can flip one BF16 rounding of
   a split term; the Hopper labs' value, for all three slots (the brief's). */
static const double kMaxUlps = 4.0;
static const char* kSlotName[3] = {"dQ", "dK", "dV"};

/* Compares one slot and CHECKs it within kMaxUlps against `ref` (every element finite on both sides). */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       const char* against) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs %s: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n", what,
           kSlotName[slot], against, d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: %s has every element finite (%zu NaN)", kSlotName[slot], against, d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left of the poison or of a give-up)", what,
          kSlotName[slot], d.nan_new);
    CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of %s (max %.2f)", what, kSlotName[slot], kMaxUlps,
          against, d.max_ulps);
}

/* The name of a captured kernel node's function ("?" if the runtime cannot say; the error is cleared). */
static const char* kernel_node_name(cudaGraphNode_t node) {
    cudaGraphNodeType type;
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
        (void)cudaGetLastError();
        return "?";
    }
    if (type != cudaGraphNodeTypeKernel) return "(not a kernel)";
    cudaKernelNodeParams p;
    const char* name = NULL;
    if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || cudaFuncGetName(&name, p.func) != cudaSuccess ||
        name == NULL) {
        (void)cudaGetLastError();
        return "?";
    }
    return name;
}

/* The composed fp32 backward as one graph (the file comment's (2)): attention_backward_cuda(fp32, default
   options) and this kernel captured from `stream` as the chain prep -> rows -> attn_bwd_kernel -> dq post-pass
   -> this kernel; the portable key-major node is removed and this kernel rewired between the row pass and the
   post-pass. Returns 0 (with a FAIL line saying why) if the capture is not that chain. */
static int composed_build(cudaGraphExec_t* exec, const Fp32Keys128& f, const bf16* qkv, const bf16* out,
                          const float* stats, const bf16* dout, bf16* dqkv, void* ws, cudaStream_t stream) {
    const AttnShape s = f.shape;
    const size_t rows = (size_t)s.B * s.NH * s.T;
    float* dq_acc = (float*)ws;
    const float* D = dq_acc + rows * s.HS;
    AttnOptions opt = {0};
    cudaGraph_t graph;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    attention_backward_cuda(ATTN_FP32, opt, s, qkv, out, stats, dout, dqkv, ws, stream);
    fp32keys128_launch(f, stats, D, dq_acc, dqkv, stream);
    cudaCheck(cudaStreamEndCapture(stream, &graph));
    enum { kChain = 5, kPrep = 0, kRows = 1, kKeys = 2, kPost = 3, kMine = 4 };
    cudaGraphNode_t chain[kChain];
    size_t n_nodes = 0, n = 1;
    cudaCheck(cudaGraphGetNodes(graph, NULL, &n_nodes));
    int ok = n_nodes == kChain;
    if (ok) cudaCheck(cudaGraphGetRootNodes(graph, &chain[0], &n));
    ok = ok && n == 1;
    for (int i = 1; ok && i < kChain; i++) {
        size_t nd = 0;
        cudaCheck(cudaGraphNodeGetDependentNodes(chain[i - 1], NULL, NULL, &nd));
        ok = nd == 1;
        if (ok) cudaCheck(cudaGraphNodeGetDependentNodes(chain[i - 1], &chain[i], NULL, &nd));
    }
    CHECK(ok, "composed graph: the capture is one chain of %d nodes (prep, row pass, portable key-major, dQ"
          " post-pass, this kernel); got %zu nodes", (int)kChain, n_nodes);
    if (!ok) {
        cudaCheck(cudaGraphDestroy(graph));
        return 0;
    }
    const char* names[kChain];
    for (int i = 0; i < kChain; i++) names[i] = kernel_node_name(chain[i]);
    printf("  composed graph: captured %s -> %s -> %s -> %s -> %s\n", names[0], names[1], names[2], names[3], names[4]);
    int named = 1;
    for (int i = 0; i < kChain; i++) named = named && strcmp(names[i], "?") != 0;
    if (named) {
        const int shape_ok = strstr(names[kRows], "rows") != NULL && strstr(names[kKeys], "attn_bwd_kernel") != NULL &&
                             strstr(names[kPost], "attn_bwd_dq_kernel") != NULL &&
                             strstr(names[kMine], "fp32keys128_kernel") != NULL;
        CHECK(shape_ok, "composed graph: node 2 a row pass, node 3 the portable key-major attn_bwd_kernel, node 4 the"
              " post-pass attn_bwd_dq_kernel, node 5 this kernel");
        if (!shape_ok) {
            cudaCheck(cudaGraphDestroy(graph));
            return 0;
        }
    } else {
        printf("  (cudaFuncGetName gave no names: the nodes taken by their place in the chain)\n");
    }
    /* rows -> [keys] -> post -> mine  becomes  rows -> mine -> post */
    cudaCheck(cudaGraphRemoveDependencies(graph, &chain[kPost], &chain[kMine], NULL, 1));
    cudaCheck(cudaGraphDestroyNode(chain[kKeys]));
    cudaCheck(cudaGraphAddDependencies(graph, &chain[kRows], &chain[kMine], NULL, 1));
    cudaCheck(cudaGraphAddDependencies(graph, &chain[kMine], &chain[kPost], NULL, 1));
    cudaCheck(cudaGraphInstantiate(exec, graph, 0));
    cudaCheck(cudaGraphDestroy(graph));
    return 1;
}

struct CheckCase {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

/* One case: the file comment's checks (1) and (2); with time_it the timings. */
static void check_case(CheckCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_FP32;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper fp32 key-major pass at HS 128", s.B,
             s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; carve_workspace's layout, which"
          " this lab reads)", ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_def, *dqkv_new, *dqkv_comp;
    float* stats;
    void *ws_ref, *ws_def, *ws_new, *ws_comp;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_def, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    lab_alloc_poisoned(&dqkv_comp, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_def, ws_bytes);
    lab_alloc_poisoned(&ws_new, ws_bytes);
    lab_alloc_poisoned(&ws_comp, ws_bytes);
    AttnOptions opt = {0}, portable = {0};
    portable.force_portable = 1;
    const Fp32Keys128 f = fp32keys128_prepare(s, qkv, dout);
    /* the uploads and poison fills ran on the legacy default stream, which `st` (non-blocking) does not wait for */
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const char* path_default = attn_bwd_path_name(attention_backward_cuda_path(mode, opt, s, qkv, dout));
    printf("  default fp32 backward path: %s\n", path_default);

    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, st);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_def, ws_def, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable and default backwards");
    /* (1) this kernel on the default run's D, a fresh zeroed accumulator, then the lab's post-pass */
    float* dq_acc_new = (float*)ws_new;
    float* D_new = dq_acc_new + rows * s.HS;
    const float* D_def = (const float*)ws_def + rows * s.HS;
    cudaCheck(cudaMemsetAsync(dq_acc_new, 0, rows * s.HS * sizeof(float), st));
    cudaCheck(cudaMemcpyAsync(D_new, D_def, rows * sizeof(float), cudaMemcpyDeviceToDevice, st));
    fp32keys128_launch(f, stats, D_new, dq_acc_new, dqkv_new, st);
    const long long pairs = (long long)rows * kHS / 2;
    lab_dq_postpass<<<(unsigned)ceil_div(pairs, 256), 256, 0, st>>>(dq_acc_new, dqkv_new, s.NH, s.T,
                                                                    attn_softmax_scale(kHS), pairs);
    cudaCheckLastError();
    sync_or_report(cudaStreamSynchronize(st), "(1) this kernel on the default run's D + the lab's post-pass");
    /* (2) the composed backward (one graph), on poisoned dqkv and workspace */
    cudaGraphExec_t composed = NULL;
    const int have_composed = composed_build(&composed, f, qkv, out, stats, dout, dqkv_comp, ws_comp, st);
    if (have_composed) {
        cudaCheck(cudaGraphLaunch(composed, st));
        sync_or_report(cudaStreamSynchronize(st), "(2) the composed fp32 backward (graph)");
    }

    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_got = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_got, dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_got, s, slot, "(0) production default backward (context):", "the force_portable backward");
    cudaCheck(cudaMemcpy(h_got, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_got, s, slot, "(1) this kernel on the default D:", "the force_portable backward");
    if (have_composed) {
        cudaCheck(cudaMemcpy(h_got, dqkv_comp, nqkv * 2, cudaMemcpyDeviceToHost));
        for (int slot = 0; slot < 3; slot++)
            check_slot(h_ref, h_got, s, slot, "(2) composed graph:", "the force_portable backward");
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t ev[kReps + 1];
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventCreate(&ev[r]));
        /* the bf16 backward of the ratio needs bf16's own forward (stats {LSE, 0}, its O for D) */
        bf16 *out_b, *dqkv_b;
        float* stats_b;
        void* ws_b;
        cudaCheck(cudaMalloc(&out_b, nout * 2));
        cudaCheck(cudaMalloc(&dqkv_b, nqkv * 2));
        cudaCheck(cudaMalloc(&stats_b, nstats * 4));
        cudaCheck(cudaMalloc(&ws_b, attention_cuda_workspace_bytes(s, ATTN_BF16)));
        attention_forward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, NULL, st);
        auto run_portable = [&]() { attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        auto run_default = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_def, ws_def, st); };
        auto run_bf16 = [&]() { attention_backward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, dout, dqkv_b, ws_b, st); };
        auto run_composed = [&]() { cudaCheck(cudaGraphLaunch(composed, st)); };
        /* alone: keeps adding into ws_new's accumulator (its values do not matter any more) */
        auto run_keys = [&]() { fp32keys128_launch(f, stats, D_new, dq_acc_new, dqkv_new, st); };
        /* kReps back-to-back runs queued behind a spin (2 ms + 100 us per run: longer than queueing them) */
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
        const float ms_keys = time_of(run_keys, "timing this kernel alone");
        const float ms_portable = time_of(run_portable, "timing the portable fp32 backward");
        const float ms_default = time_of(run_default, "timing the default fp32 backward");
        const float ms_bf16 = time_of(run_bf16, "timing the default bf16 backward");
        const float ms_composed = have_composed ? time_of(run_composed, "timing the composed fp32 backward") : NAN;
        const char* path_bf16 = attn_bwd_path_name(attention_backward_cuda_path(ATTN_BF16, opt, s, qkv, dout));
        /* the kernel's GEMM work in BF16 tensor-core products, causal: S^T, dP^T (1 each), dV, dK (2 each: the
           split), dQ (3) = 9 GEMMs of 2 B H T^2 d / 2 */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d, warm inputs, queued behind a spin): this kernel alone %.4f ms (%.1f TFLOP/s"
               " counting its 9 BF16 GEMMs, causal)\n", (int)kReps, ms_keys, 9.0 * gemm / ms_keys * 1e-9);
        printf("  time: fp32 backward: portable %.4f ms, default (path %s: Hopper row pass + portable key-major)"
               " %.4f ms, composed (prep + Hopper row pass + this kernel + post-pass, one graph) %.4f ms ="
               " %.2fx faster than the default\n", ms_portable, path_default, ms_default, ms_composed,
               ms_default / ms_composed);
        printf("  time: bf16 default backward (path %s) %.4f ms -> fp32/bf16 backward: default %.2fx, composed"
               " %.2fx\n", path_bf16, ms_bf16, ms_default / ms_bf16, ms_composed / ms_bf16);
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventDestroy(ev[r]));
        cudaCheck(cudaFree(out_b)); cudaCheck(cudaFree(dqkv_b)); cudaCheck(cudaFree(stats_b)); cudaCheck(cudaFree(ws_b));
    }
    if (composed != NULL) cudaCheck(cudaGraphExecDestroy(composed));
    free(h_qkv); free(h_dout); free(h_ref); free(h_got);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_def)); cudaCheck(cudaFree(dqkv_new));
    cudaCheck(cudaFree(dqkv_comp));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_def)); cudaCheck(cudaFree(ws_new)); cudaCheck(cudaFree(ws_comp));
}

/* ref[i][j] = sum_k term(i, j, k) and mag[i][j] = sum_k |term(i, j, k)| over a rows x cols product. */
template <typename Term>
static void probe_product_rect(double* ref, double* mag, int rows, int cols, int depth, Term term) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double r = 0, m = 0;
            for (int k = 0; k < depth; k++) {
                const double p = term(i, j, k);
                r += p;
                m += fabs(p);
            }
            ref[i * cols + j] = r;
            mag[i * cols + j] = m;
        }
}

/* Checks one probe output [rows x cols] against a host product within hopper_lab.cuh's kProbeTol of the sum
   of |products|; prints the first misses and a summary line; returns the number wrong. */
static int probe_compare_rect(const char* name, const float* got, const double* ref, const double* mag, int rows,
                              int cols) {
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < rows * cols; i++) {
        const double err = fabs(got[i] - ref[i]);
        if (!(err <= kProbeTol * mag[i] + 1e-30)) {
            if (bad++ < 3) printf("  %s[%d][%d] = %.6g, want %.6g\n", name, i / cols, i % cols, got[i], ref[i]);
        }
        const double rel = isnan(got[i]) ? INFINITY : err / (mag[i] + 1e-30);
        if (rel > worst) worst = rel;
    }
    printf("  %s: %d of %d wrong (worst error / sum|products| %.3g)\n", name, bad, rows * cols, worst);
    return bad;
}

/* The BF16 split of an FP32 value as the kernel makes it: term 0 = bf(x), 1 = bf(x - bf(x)), 2 = bf(r - bf(r))
   with r = x - bf(x) (each difference exact in FP32). */
static double split_term(float x, int term) {
    const float hi = bf16_round(x), r1 = x - hi;
    if (term == 0) return hi;
    const float r1_hi = bf16_round(r1);
    if (term == 1) return r1_hi;
    return bf16_round(r1 - r1_hi);
}

/* The layout probe on B1 NH3 T100 HS128 (head 1; keys 100..127 zero-filled), checked against double loops on
   the kernel's own S^T and dP^T, split as the kernel splits them. */
static void layout_probe(void) {
    test_section("layout probe HS128 fp32: S^T, dP^T; dV, dK with two chained split terms; dQ over three staged"
                 " terms (six RS batches, two A register sets), and its second and third terms alone");
    ProbeInputs in;
    in.s = AttnShape{1, 3, 100, kHS};
    in.head = 1;
    const size_t nqkv = attn_qkv_count(in.s), nout = attn_out_count(in.s);
    in.h_qkv = random_bf16_bits(nqkv);
    in.h_dout = random_bf16_bits(nout);
    lab_upload(&in.qkv, in.h_qkv, nqkv * 2);
    lab_upload(&in.dout, in.h_dout, nout * 2);
    const int nk = kBlockK, nq = kBlockQ;
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS, n_q = (size_t)nq * kHS;
    const size_t total = 2 * n_st + 2 * n_kv + 3 * n_q;
    float* d_out;
    lab_alloc_poisoned(&d_out, total * 4);
    ProbeOut o;
    o.st = d_out;
    o.dpt = o.st + n_st;
    o.dv = o.dpt + n_st;
    o.dk = o.dv + n_kv;
    o.dq = o.dk + n_kv;
    o.dq_lo = o.dq + n_q;
    o.dq_lo2 = o.dq_lo + n_q;
    const CUtensorMap qmap = make_head_map(in.qkv, in.s, 3 * in.s.NH, "qkv");
    const CUtensorMap dmap = make_head_map(in.dout, in.s, in.s.NH, "dout");
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qmap, dmap, in.s.NH, in.head, o);
        cudaCheckLastError();
    };
    launch(fp32keys128_probe_kernel<kProbeScores>);
    launch(fp32keys128_probe_kernel<kProbeDkDv>);
    launch(fp32keys128_probe_kernel<kProbeDq>);
    launch(fp32keys128_probe_kernel<kProbeDqLo>);
    launch(fp32keys128_probe_kernel<kProbeDqLo2>);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    const float* g_st = h;
    const float* g_dpt = g_st + n_st;
    const float* g_dv = g_dpt + n_st;
    const float* g_dk = g_dv + n_kv;
    const float* g_dq = g_dk + n_kv;
    const float* g_dq_lo = g_dq + n_q;
    const float* g_dq_lo2 = g_dq_lo + n_q;
    double* ref = (double*)mallocCheck(n_kv * sizeof(double));
    double* mag = (double*)mallocCheck(n_kv * sizeof(double));
    int bad[7];
    probe_product_rect(ref, mag, nk, nq, kHS,
                       [&](int i, int j, int d) { return probe_qkv(in, i, kSlotK, d) * probe_qkv(in, j, kSlotQ, d); });
    bad[0] = probe_compare_rect("S^T = K Q^T", g_st, ref, mag, nk, nq);
    probe_product_rect(ref, mag, nk, nq, kHS,
                       [&](int i, int j, int d) { return probe_qkv(in, i, kSlotV, d) * probe_dout(in, j, d); });
    bad[1] = probe_compare_rect("dP^T = V dO^T", g_dpt, ref, mag, nk, nq);
    /* two-term products: per q both terms (both |.| in mag) */
    auto two_terms = [&](const float* x, int i, int q, double b) {
        return (split_term(x[i * nq + q], 0) + split_term(x[i * nq + q], 1)) * b;
    };
    probe_product_rect(ref, mag, nk, kHS, nq,
                       [&](int i, int n, int q) { return two_terms(g_st, i, q, probe_dout(in, q, n)); });
    bad[2] = probe_compare_rect("dV = (bf(S^T) + bf(S^T - bf(S^T))) dO", g_dv, ref, mag, nk, kHS);
    probe_product_rect(ref, mag, nk, kHS, nq,
                       [&](int i, int n, int q) { return two_terms(g_dpt, i, q, probe_qkv(in, q, kSlotQ, n)); });
    bad[3] = probe_compare_rect("dK = (bf(dP^T) + bf(r1)) Q", g_dk, ref, mag, nk, kHS);
    /* dQ[q][n] = sum_key (terms of dP^T[key][q]) K[key][n] */
    probe_product_rect(ref, mag, nq, kHS, nk, [&](int q, int n, int k) {
        const float x = g_dpt[k * nq + q];
        return (split_term(x, 0) + split_term(x, 1) + split_term(x, 2)) * probe_qkv(in, k, kSlotK, n);
    });
    bad[4] = probe_compare_rect("dQ = (bf(dP) + bf(r1) + bf(r1 - bf(r1)))^T K", g_dq, ref, mag, nq, kHS);
    probe_product_rect(ref, mag, nq, kHS, nk,
                       [&](int q, int n, int k) { return split_term(g_dpt[k * nq + q], 1) * probe_qkv(in, k, kSlotK, n); });
    bad[5] = probe_compare_rect("dQ, the bf(r1) tile alone", g_dq_lo, ref, mag, nq, kHS);
    probe_product_rect(ref, mag, nq, kHS, nk,
                       [&](int q, int n, int k) { return split_term(g_dpt[k * nq + q], 2) * probe_qkv(in, k, kSlotK, n); });
    bad[6] = probe_compare_rect("dQ, the bf(r1 - bf(r1)) tile alone", g_dq_lo2, ref, mag, nq, kHS);
    CHECK(bad[0] == 0, "S^T = K Q^T through keymajor128_scores (form (a), both warpgroups, stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T through keymajor128_scores (the dout map)");
    CHECK(bad[2] == 0, "(n3) dV: bf(P), bf(P - bf(P)) packed per k-step, two RS n128 batches chained (dO N-major)");
    CHECK(bad[3] == 0, "(n3) dK: bf(dS), bf(r1) packed per k-step, two RS n128 batches chained (Q N-major)");
    CHECK(bad[4] == 0, "(n1, n2) dQ over the three staged terms: six RS n64 batches into one accumulator");
    CHECK(bad[5] == 0, "(n1, n2) dQ's second term (its tile, its staging) alone");
    CHECK(bad[6] == 0, "(n1, n2) dQ's third term (its tile, its staging) alone");
    free(h); free(ref); free(mag);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}

/* The checks of one child process: the layout probe (child 0), the small cases (child 1), or the benchmark
   shapes with their timings (child 2). */
static void run_child(int child) {
    attn_rng_init(&g_rng, 0x9E3779B97F4A7C15ull + (unsigned long long)child);
    require_sm90("hopper_bwd128_fp32");
    lab_watch_hangs();
    fp32keys128_watch_hangs();
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st; /* graph capture needs a stream of its own (not the legacy default stream) */
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1) {
        /* T = 1, T < 64, odd T, T not a multiple of the 128-key tile (a last key tile with an empty second
           half), B*NH up to 32, sharp softmax, key offsets (where fp32 must stay accurate) */
        const CheckCase cases[] = {
            {{1, 1, 1, 128}, 1.f, 0.f},    {{1, 2, 50, 128}, 1.f, 0.f},   {{1, 1, 77, 128}, 1.f, 0.f},
            {{1, 2, 128, 128}, 1.f, 0.f},  {{1, 1, 129, 128}, 1.f, 0.f},  {{2, 3, 1001, 128}, 1.f, 0.f},
            {{4, 8, 257, 128}, 1.f, 0.f},
            {{1, 4, 500, 128}, 8.f, 0.f},   /* sharp softmax (q x8) */
            {{2, 4, 1000, 128}, 1.f, 20.f}, /* K += 20 u */
            {{1, 4, 777, 128}, 8.f, 20.f},  /* both, odd T */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    } else {
        const CheckCase bench[] = {{{8, 8, 1024, 128}, 1.f, 0.f}, {{2, 16, 4096, 128}, 1.f, 0.f}};
        for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    }
    cudaCheck(cudaStreamDestroy(st));
}

/* The parent never touches CUDA: each child gets a fresh context, so a fault or a hang report in one costs
   that child's results only. A child reports its pass/fail counts through a pipe; one that dies without
   reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd128_fp32: fp32's Hopper key-major pass at HS 128 (dK, dV, dQ partials) vs the production"
           " backward; the probe, the checks and the benchmark shapes each in its own process\n");
    static const char* kChildName[3] = {"the layout probe", "the checks", "the benchmark shapes and timings"};
    int passed = 0, failed = 0;
    for (int child = 0; child < 3; child++) {
        int fds[2];
        if (pipe(fds) != 0) die("hopper_bwd128_fp32: pipe() failed\n  hint: out of file descriptors?");
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) die("hopper_bwd128_fp32: fork() failed\n  hint: out of processes or memory?");
        if (pid == 0) {
            close(fds[0]);
            g_report_fd = fds[1];
            run_child(child);
            child_report_and_exit();
        }
        close(fds[1]);
        int counts[2] = {0, 0};
        const ssize_t got = read(fds[0], counts, sizeof counts);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (got != (ssize_t)sizeof counts) {
            printf("  FAIL %s: its process ended without reporting (%s %d); the checks after its last line did"
                   " not run\n", kChildName[child], WIFSIGNALED(status) ? "signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            failed++;
        } else {
            printf("  %s: %d passed, %d failed (this process)\n", kChildName[child], counts[0], counts[1]);
            passed += counts[0];
            failed += counts[1];
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
