/*
 * dev/attention_lab/hopper_bwd128_gproj.cu - lab of gproj mode's key-major backward pass at head size 128 on
 * Hopper (sm_90a, wgmma + TMA): dK and dV only, from the D and lambda that production's prep and row pass
 * leave in the workspace.
 *
 * STATUS: written 2026-11-29 without a GPU; first run on the H200 the same day (session 5 call 4,
 * dev/results/device_s5/call4/hopper_bwd128_gproj.log, commit 8963c5a: the kernel and checks as here, before
 * (2') and the device synchronisation were added): 257 passed, 0 failed. Probe exact in all five products
 * (worst error / sum|products| 1.4e-7); dK within 1.00 BF16 ulp of the force_portable backward (at most
 * 2690 of 16.8M elements not bit-equal), dV and dQ bit-equal, in every case. Time (median of 21):
 *   B8 H8 T1024 d128: this kernel 0.137 ms = 313 TFLOP/s; composed 0.303 ms vs portable gproj backward
 *     0.383 ms (1.26x); bf16 default (Hopper) backward 0.227 ms: gproj/bf16 backward 1.69x -> 1.34x;
 *   B2 H16 T4096 d128: this kernel 0.687 ms = 500 TFLOP/s; composed 1.712 ms vs 2.372 ms (1.39x); bf16
 *     1.073 ms: gproj/bf16 backward 2.21x -> 1.60x. The rest is now prep + the portable row pass (1.03 ms
 *     at T4096), which the Hopper row pass at HS 128 replaces ((2') composes over it once it is the
 *     default path).
 * Every kernel here is checked by this program itself before anything is timed; the layout probe runs
 * first, in its own process.
 *
 * Why: at HS 128 gproj's whole backward is portable (attn_bwd_rows_kernel + attn_bwd_kernel<128, ATTN_GPROJ>
 * in attention/attention_cuda.cu): 1.27-1.30x bf16's fwd+bwd at B2 H16 T4096 d128 (call of 2026-11-29
 * 14:48), and bf16's backward is getting the Hopper kernel of dev/attention_lab/hopper_bwd128.cu (1.4-1.7x
 * faster). This is that kernel with gproj's numerics, as dev/attention_lab/hopper_bwd_gproj.cu is at HS 64:
 * no dQ GEMM, no atomics, no dS staging tile (the row pass wrote dQ), one more register-A GEMM into dK.
 *
 * What it computes (docs/ATTENTION_NUMERICS.md, gproj; attn_bwd_kernel<128, ATTN_GPROJ>'s rounding points):
 *   per CTA 128 keys of one (b, h), two consumer warpgroups of 64 keys; per query tile of 64 (from the
 *   diagonal on), per warpgroup:
 *     S^T = K_w Q^T, dP^T = V_w dO^T        m64n64k16 SS, 8 k-steps over two 64-column chunks (hopper_bwd128's
 *                                           verified form (a))                                32 + 32 regs
 *     P = exp2((S - m) c) * fl(1/l)          (repair's softmax, which gproj uses; stats {m, l})
 *     dS = P (dP - D)                        (FP32; masked entries exactly 0)
 *     A operands, one k-step (16 queries) at a time: bf(P), bf(dS), bf(-lambda_q P) (the product in FP32,
 *     rounded on its own: production's `alp`; rounding dS - lambda P together would lose the correction)
 *                                                                                           16 + 16 + 16
 *     dV += bf(P)^T dO                       m64n128k16 RS, dO N-major, LBO one 8 KB chunk (form (b))  64
 *     dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: the two batches issued back to back into the ONE
 *       accumulator (wgmma orders same-accumulator operations; FA3-style, no second accumulator)    64
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the q slot is not touched.
 *   D and lambda [B*NH*T] are read from the workspace (carve_workspace in attention_cuda.cu: dq_acc
 *   [rows*HS] fp32, then D [rows], then lambda [rows]; the lab CHECKs the workspace size that implies).
 * Only FP32 sum orders differ from production (wgmma's k order; dK sums the tile's 4 bf(dS) k-steps, then
 * the 4 correction k-steps, where attn_bwd_kernel interleaves them per 16 queries; 64-query tiles here, 32
 * there), so the check is <= 4 BF16 ulps of max(|a|, |b|, row RMS) (the Hopper labs' tolerance, fixed
 * before any run).
 *
 * Registers: peak live in a consumer thread is dK + dV (128) + the three A operands (48) while the batch
 * runs, or dK + dV + S^T + dP^T (64) while P and dS are made (their FP32 values die k-step by k-step as
 * they are packed, the HS-64 gproj lab's order; packing all of bf(P) before the correction kept P and dS
 * live together there and spilled). The CTA is hopper_bwd128's: 2 consumer warpgroups + a producer
 * warpgroup, 384 threads launched at 168 registers, setmaxnreg 24 (producer) / 240 (consumers) - the split
 * that passed on the H200 in hopper_bwd128 (104/0).
 *   ptxas -v (CUDA 13.0, sm_90a; `make hopper_bwd128_gproj-regs` prints them again):
 *     gproj128_keys_kernel 168 registers at entry (240 after setmaxnreg.inc), 0 bytes spill, no C75xx;
 *     gproj128_probe_kernel<scores / dK+dV / corr> (256 threads, no setmaxnreg) 90 / 218 / 106, 0 spill.
 *   What it took: with lambda as the .w of the float4 row state the consumer code spilled 12 bytes (the
 *   16 float4 row loads of the P/dS loop then hold 16 lambdas too); lambda now has its own [stage][64]
 *   row, read as float2 pairs just before each k-step's packing.
 *
 * Shared memory (129 KiB): K, V 128 keys x 2 chunks (32 KB each), Q, dO 2 stages x 64 queries x 2 chunks
 * (64 KB), the row state {m, fl(1/l), D, -} float4 [2][64] and lambda float [2][64] (the producer warp's
 * lanes write both; the full barrier counts their 32 arrivals), barriers. No dS tile.
 *
 * Assumptions new here (not covered by a probe that has passed on the H200) and what checks them:
 *   (g) two m64n128k16 RS batches (A = bf(dS), then A = bf(-lambda_q P), lambda per query COLUMN from the
 *       stage's lambda row) chained into one 64-register accumulator, B = the Q tile N-major with LBO 8 KB: the
 *       HS-64 gproj probe verified the chain at n64 only, hopper_bwd128's probe the n128 form with one
 *       batch - probe "dK" (both batches) and "corr" (the correction alone), in BOTH warpgroups (the second
 *       at K/V's 8 KB offset), Q/dO in stage 1, keys 100..127 zero-filled;
 *   (h) the per-k-step packing of the three operands into separate arrays (pack_step_operands) - probe,
 *       as (g); dV = bf(S^T) dO re-checked through this lab's copy of the issue loop.
 *   Re-checked on the way (this lab's copies of hopper_bwd128's verified forms): S^T, dP^T.
 *
 * How the checks compose production's pieces (no production hook needed, nothing in attention/ changed):
 *   (1) attention_backward_cuda(gproj, force_portable) is the reference; its workspace then holds D (prep)
 *       and lambda (portable row pass). dqkv is copied, its k and v slots poisoned (NaN), and this kernel
 *       rewrites them from that workspace: dK, dV within 4 ulps of the same-lambda portable kernel, dQ
 *       bit-equal (untouched).
 *   (2) the composed backward = production prep + the portable row pass + this kernel, as one CUDA graph:
 *       attention_backward_cuda(gproj, force_portable) and this kernel's launch are captured from one
 *       stream (prep -> rows -> attn_bwd_kernel -> this kernel), the portable key-major node
 *       (attn_bwd_kernel, found by cudaFuncGetName, else by its place in the chain) is removed and the row
 *       pass is made this kernel's dependency. Run on poisoned dqkv and workspace, all three slots are
 *       checked against (1)'s reference (dQ bit-equal: the same deterministic row pass).
 *   (2') only if the DEFAULT gproj backward at HS 128 has a Hopper pass (engineer D's row pass moved into
 *       attention/; none in the tree when this was written): the same composition over the default options
 *       (prep + that row pass + this kernel), all three slots within 4 ulps, timed too. A default capture of
 *       another shape (e.g. this kernel already in production) is reported and skipped, not failed.
 *   Timing (median of 21; every candidate's 21 launches queued behind a spin kernel on one stream, so host
 *   launch work never shows as GPU idle time; inputs warm in L2 as in the other labs): the composed graph
 *   vs the portable gproj backward (stream launches), the default gproj backward (its path printed), the
 *   default bf16 backward (with bf16's own forward; its path printed), and this kernel alone.
 *
 * Safety: mbarrier waits are bounded (~2 s of clock64) and then GIVE UP (dev/attention_lab/hopper_lab_hang.cuh:
 * host-mapped record naming the barrier, CTA abort flag, the CTA runs on to its end); the host checks the
 * record after every synchronisation and names the barrier. No __trap() on the consumer path (it makes
 * ptxas ignore setmaxnreg). The probe and the checks run in two child processes (the parent never touches
 * CUDA), so a fault in one costs its lines only. Run it under `timeout`.
 *
 * Not done: 3 stages or a persistent schedule; overlapping the next tile's S^T/dP^T with this tile's
 * dV/dK batch (FA3's two-tile pipelining; the registers would not hold a second S^T/dP^T next to 48 A
 * registers); the lab's own Hopper row pass (engineer D's); fp32 mode (its key-major pass has dQ).
 *
 * Usage: hopper_bwd128_gproj   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
 * summed over the processes; a process that dies without reporting counts as one failure.
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

constexpr int kHS = 128;                /* the head size of this lab */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of every wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup (one warp of it works) */
/* setmaxnreg split of the 384-thread CTA (__launch_bounds__(384, 1): every thread starts at 168);
   hopper_bwd128's, which passed on the H200 */
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box */
constexpr int kSwizzleRowBytes = 128;   /* one 64-column chunk row = one 128B-swizzle row */
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes per 128-byte row */
constexpr int kQSteps = kBlockQ / kWgmmaK;            /* k-steps of the RS GEMMs (the tile's 64 queries) */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands (and N = 64 B operands) ignore LBO */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ && kQSteps == kTileKSteps,
              "S^T per warpgroup is 64 x 64: its 32 registers are the 4 k-steps of the RS GEMMs' A");

/* Shared-memory plan (byte offsets from a 1024-byte aligned base). A tile of R rows x 128 columns is two
   chunks of [R rows][128 bytes], swizzled: column chunk c at c * (R * 128). */
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
    static constexpr int kRowState = kDO + kStages * kQTileBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kLambda = kRowState + kStages * kBlockQ * 16; /* float [kStages][kBlockQ] */
    static constexpr int kBarriers = kLambda + kStages * kBlockQ * 4;
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kRowState % 16 == 0 && kLambda % 16 == 0 && kBarriers % 8 == 0, "float4 row state, float2 lambda pairs, barriers");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* ---- the GEMMs of one (key tile, query tile) step, per warpgroup (shared by the kernel and the probe) ---- */

/* acc = A B^T issued (64 x 64 over HS/16 = 8 k-steps): A the warpgroup's 64 rows of the K or V tile (chunks
   kKeyChunkBytes apart), B the stage's Q or dO tile (chunks kQChunkBytes apart), both K-major; k-step kk
   reads bytes 32 (kk % 4) of the 128-byte rows of column chunk kk / 4 (hopper_bwd128's form (a)). */
__device__ __forceinline__ void warpgroup_ss_issue_hs128(float (&acc)[32], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
        const uint32_t col = (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        const uint32_t chunk = kk / kKStepsPerChunk;
        const uint64_t desc_a = make_smem_desc(a_addr + chunk * SmemPlan::kKeyChunkBytes + col, kUnusedLbo,
                                               kSwizzleAtomBytes);
        const uint64_t desc_b = make_smem_desc(b_addr + chunk * SmemPlan::kQChunkBytes + col, kUnusedLbo,
                                               kSwizzleAtomBytes);
        wgmma_m64n64k16_ss(acc, desc_a, desc_b);
    }
}

/* S^T = K_w Q^T and dP^T = V_w dO^T (64 keys x 64 queries each) as one commit group, waited for. kw_addr,
   vw_addr: the warpgroup's first row in chunk 0 of the K/V tile; q_addr, do_addr: the stage's tiles. */
__device__ __forceinline__ void warpgroup_scores(float (&st)[32], float (&dpt)[32], uint32_t kw_addr, uint32_t vw_addr,
                                                 uint32_t q_addr, uint32_t do_addr) {
#pragma unroll
    for (int i = 0; i < 32; i++) st[i] = dpt[i] = 0.f;
    reg_fence(st); /* keeps the zeroing above the fence */
    reg_fence(dpt);
    wgmma_fence();
    warpgroup_ss_issue_hs128(st, kw_addr, q_addr);
    warpgroup_ss_issue_hs128(dpt, vw_addr, do_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(st);
    reg_fence(dpt);
}

/* acc[64 x 128] += A[64 x 64] B[64 x 128]: A from registers (4 k-steps over the tile's 64 queries), B the
   stage's Q or dO tile read N-major (16 rows = 2048 bytes per k-step; the second 64-column block of N is
   one 8 KB chunk further: LBO = kQChunkBytes, hopper_bwd128's form (b)). Issued only. */
__device__ __forceinline__ void warpgroup_kv_issue(float (&acc)[kHS / 2], const uint32_t (&a)[kQSteps][4],
                                                   uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++)
        wgmma_m64n128k16_rs(acc, a[kk], make_smem_desc(b_addr + kk * kWgmmaK * kSwizzleRowBytes, SmemPlan::kQChunkBytes,
                                                       kSwizzleAtomBytes));
}

/* k-step kk's three register A operands from the FP32 P (in st) and dS (in dpt) accumulators (registers
   8kk..8kk+7: key g + 8 (i & 1), query 16kk + 8 (i >> 1) + 2t + e for register 8kk + 2i + e):
     pa = bf(P), pds = bf(dS)   (pack_acc_a_operand's words, one k-step)
     plam = bf(-lambda_q P)     lam[jj][e] = lambda of query 16kk + 8jj + 2t + e; the product in FP32,
                                rounded once (production's `alp`). Assumption (h). */
__device__ __forceinline__ void pack_step_operands(uint32_t (&pa)[4], uint32_t (&pds)[4], uint32_t (&plam)[4],
                                                   const float (&p)[32], const float (&ds)[32], int kk,
                                                   const float (&lam)[2][2]) {
    const int b = 8 * kk;
    pa[0] = pack_bf16x2(p[b + 0], p[b + 1]);   /* key g,   queries 2t, 2t+1 */
    pa[1] = pack_bf16x2(p[b + 2], p[b + 3]);   /* key g+8, queries 2t, 2t+1 */
    pa[2] = pack_bf16x2(p[b + 4], p[b + 5]);   /* key g,   queries 2t+8, 2t+9 */
    pa[3] = pack_bf16x2(p[b + 6], p[b + 7]);   /* key g+8, queries 2t+8, 2t+9 */
    pds[0] = pack_bf16x2(ds[b + 0], ds[b + 1]);
    pds[1] = pack_bf16x2(ds[b + 2], ds[b + 3]);
    pds[2] = pack_bf16x2(ds[b + 4], ds[b + 5]);
    pds[3] = pack_bf16x2(ds[b + 6], ds[b + 7]);
    plam[0] = pack_bf16x2(-lam[0][0] * p[b + 0], -lam[0][1] * p[b + 1]);
    plam[1] = pack_bf16x2(-lam[0][0] * p[b + 2], -lam[0][1] * p[b + 3]);
    plam[2] = pack_bf16x2(-lam[1][0] * p[b + 4], -lam[1][1] * p[b + 5]);
    plam[3] = pack_bf16x2(-lam[1][0] * p[b + 6], -lam[1][1] * p[b + 7]);
}

/* lambda of queries q and q + 1 (q even) of a stage's [kBlockQ] lambda row, one 8-byte shared load: a
   thread's two query columns 2t, 2t + 1 of an 8-column block. Kept apart from the float4 row state so that
   the m, fl(1/l), D loads of the P/dS loop do not also hold 16 lambdas in registers (with lambda as the
   row state's .w the consumer code spilled 12 bytes at 240 registers). */
__device__ __forceinline__ float2 load_lambda_pair(const float* lam_row, int q) {
    return *reinterpret_cast<const float2*>(lam_row + q);
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it, so host-side launch work never shows as idle time inside an interval. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* Writes BF16 NaN (0xFFFF) over the k and v slots of dqkv [B, T, 3, NH, HS] (one thread per element). */
__global__ void poison_kv_kernel(bf16* dqkv, long long tokens, int NH) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_token = 2LL * NH * kHS;
    if (i >= tokens * per_token) return;
    const long long tok = i / per_token, within = i % per_token;
    dqkv[tok * 3LL * NH * kHS + (long long)NH * kHS + within] = __ushort_as_bfloat16((unsigned short)0xFFFFu);
}

/* gproj's key-major pass at HS 128 (see the file comment). stats {m, l} per row (gproj's forward stores
   repair's stats), D and lambda [B*NH*T] from the workspace; writes the k and v slots of dqkv. */
__global__ void __launch_bounds__(kThreads, 1)
    gproj128_keys_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                         const float* __restrict__ stats, const float* __restrict__ D,
                         const float* __restrict__ lambda, bf16* __restrict__ dqkv, int NH, int T, float scale,
                         float c) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    float* lambda_s = reinterpret_cast<float*>(smem + Plan::kLambda);
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = kv_full + 1;
    uint64_t* empty = full + kStages;

    const int k0 = blockIdx.x * kBlockK;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
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
                   of a box wholly out of bounds: finite data, all its keys masked */
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
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), kHangEmpty, s, &cta_abort);
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int ql = lane + 32 * half, query = q0 + ql;
                float4 st = make_float4(0.f, 1.f, 0.f, 0.f); /* rows past T: P finite, lambda 0 (masked anyway) */
                float lam = 0.f;
                if (query < T) {
                    const long long idx = (long long)bh * T + query;
                    st.x = stats[idx * 2];                /* m (raw score units) */
                    st.y = __frcp_rn(stats[idx * 2 + 1]); /* fl(1 / l) */
                    st.z = D[idx];
                    lam = lambda[idx];
                }
                row_state[s * kBlockQ + ql] = st;
                lambda_s[s * kBlockQ + ql] = lam;
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

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int key0 = k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[kHS / 2], dv[kHS / 2];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, kHangKvFull, 0, &cta_abort);
    __syncwarp();

    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), kHangFull, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;
        const float* lam_row = lambda_s + s * kBlockQ;

        float st[32], dpt[32];
        warpgroup_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);

        /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions) and the three A operands, one
           k-step (16 queries) at a time. Element 4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e. The
           mask can bite only where the tile reaches the warpgroup's keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
        for (int kk = 0; kk < kQSteps; kk++) {
            float lam[2][2];
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const float2 lam2 = load_lambda_pair(lam_row, 8 * (2 * kk + jj) + 2 * t);
                lam[jj][0] = lam2.x;
                lam[jj][1] = lam2.y;
            }
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 2 * kk + jj;
                    const int query = q0 + 8 * j + 2 * t + e;
                    const float4 row = rs[8 * j + 2 * t + e];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int idx = 4 * j + 2 * r + e;
                        float p = 0.f, ds = 0.f;
                        if (!masked || (key0 + 8 * r <= query && query < T)) {
                            p = exp2f((st[idx] - row.x) * c) * row.y;
                            ds = p * (dpt[idx] - row.z);
                        }
                        st[idx] = p;
                        dpt[idx] = ds;
                    }
                }
            pack_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
        }

        /* dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: one batch of 12 wgmmas, the
           two dK ones chained on the same accumulator (assumption (g)); P and dS are dead while it runs
           (128 accumulator + 48 A registers in flight). */
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(plam);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        warpgroup_kv_issue(dv, pa, do_addr);
        warpgroup_kv_issue(dk, pds, q_addr);
        warpgroup_kv_issue(dk, plam, q_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(plam);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
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

/* The probe's RS products: acc = first B (+ second B if `second`), both register-A batches of
   warpgroup_kv_issue into the one accumulator, as the kernel chains dK's two batches. */
__device__ __forceinline__ void probe_rs_batches(float (&acc)[kHS / 2], uint32_t (&first)[kQSteps][4],
                                                 uint32_t (&second_a)[kQSteps][4], uint32_t b_addr,
                                                 bool second = true) {
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
    reg_fence(first);
    reg_fence(second_a);
    reg_fence(acc);
    wgmma_fence();
    warpgroup_kv_issue(acc, first, b_addr);
    if (second) warpgroup_kv_issue(acc, second_a, b_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(acc);
    reg_fence(first);
    reg_fence(second_a);
}

/* Layout probe: the two consumer warpgroups (256 threads), one step, no softmax, at batch 0, head `head`:
   K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 loaded into STAGE 1, a
   per-query lambda [64] from global memory in stage 1's lambda row, through the kernel's own helpers
   (P := S^T, dS := dP^T). Three launches, kPart: kProbeScores writes out_st and out_dpt, kProbeDkDv out_dk
   and out_dv, kProbeCorr out_corr (S^T, dP^T recomputed by each: deterministic; one kernel writing all five
   took 255 registers, spilled and serialised its wgmmas - ptxas kept the earlier accumulators live):
     out_st   [128 keys][64 queries]  S^T = K Q^T                          re-check of (a)
     out_dpt  [128][64]               dP^T = V dO^T                        re-check of (a)
     out_dk   [128 keys][128]         bf(dP^T) Q + bf(-lambda_q S^T) Q     (g), (h)
     out_corr [128][128]              bf(-lambda_q S^T) Q alone            (g), (h)
     out_dv   [128][128]              bf(S^T) dO                           re-check of (b)
   FP32, row-major. */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeCorr = 2 };
template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    gproj128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                          int NH, int head, const float* __restrict__ lambda_in, float* __restrict__ out_st,
                          float* __restrict__ out_dpt, float* __restrict__ out_dk, float* __restrict__ out_corr,
                          float* __restrict__ out_dv) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    float* lam_row = reinterpret_cast<float*>(smem + Plan::kLambda) + kBlockQ; /* stage 1's lambda */
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    if (threadIdx.x < kBlockQ) lam_row[threadIdx.x] = lambda_in[threadIdx.x];
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
    mbar_wait_bounded(bar, 0, kHangProbe, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp / 4, warp_in_wg = warp % 4;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[32], dpt[32];
    warpgroup_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes, q_addr,
                     do_addr);
    uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        float lam[2][2];
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
            const float2 lam2 = load_lambda_pair(lam_row, 16 * kk + 8 * jj + 2 * t);
            lam[jj][0] = lam2.x;
            lam[jj][1] = lam2.y;
        }
        pack_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
    }
    if (kPart == kProbeScores) {
        store_key_rows(out_st, st, key_col, t);
        store_key_rows(out_dpt, dpt, key_col, t);
    } else if (kPart == kProbeDkDv) { /* one commit group per accumulator */
        float dk[kHS / 2];
        probe_rs_batches(dk, pds, plam, q_addr);
        store_key_rows(out_dk, dk, key_col, t);
        float dv[kHS / 2];
        probe_rs_batches(dv, pa, pa, do_addr, /*second=*/false);
        store_key_rows(out_dv, dv, key_col, t);
    } else {
        float corr[kHS / 2];
        probe_rs_batches(corr, plam, plam, q_addr, /*second=*/false);
        store_key_rows(out_corr, corr, key_col, t);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

/* hopper_wgmma.cuh's 4-D BF16 tensor map {HS, heads, T, B}, boxes of 64 columns x kBoxRows tokens (column
   chunk c at coordinate 64 c), 128-byte swizzle, zeros outside. qkv: heads = 3 NH; dout: heads = NH. */
static CUtensorMap make_head_map(const bf16* base, AttnShape s, int heads, const char* what) {
    static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
    return encode_head_map(base, s, heads, kBoxRows, "hopper_bwd128_gproj", what);
}

/* What a launch needs that depends on the shape and the input buffers only (the maps encode the pointers):
   encoded once per case, so timed launches carry no host encoding work. */
struct Gproj128 {
    AttnShape shape;
    CUtensorMap qkv_map, dout_map;
};

static Gproj128 gproj128_prepare(AttnShape s, const bf16* qkv, const bf16* dout) {
    attention_cuda_check_shape(s, ATTN_GPROJ);
    if (s.HS != kHS || ((uintptr_t)qkv % 16) != 0 || ((uintptr_t)dout % 16) != 0) {
        die("hopper_bwd128_gproj: unsupported call (B=%d NH=%d T=%d HS=%d)\n"
            "  hint: HS 128, 16-byte aligned qkv and dout (HS 64 has dev/attention_lab/hopper_bwd_gproj.cu)",
            s.B, s.NH, s.T, s.HS);
    }
    cudaCheck(cudaFuncSetAttribute(gproj128_keys_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    Gproj128 f;
    f.shape = s;
    f.qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    f.dout_map = make_head_map(dout, s, s.NH, "dout");
    return f;
}

/* The key-major gproj pass alone (asynchronous on `stream`): D and lambda [B*NH*T] as the workspace holds
   them; writes the k and v slots of dqkv. */
static void gproj128_launch(const Gproj128& f, const float* stats, const float* D, const float* lambda, bf16* dqkv,
                            cudaStream_t stream) {
    const AttnShape s = f.shape;
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    gproj128_keys_kernel<<<grid, kThreads, SmemPlan::kAlloc, stream>>>(
        f.qkv_map, f.dout_map, stats, D, lambda, dqkv, s.NH, s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS));
    cudaCheckLastError();
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

/* A synchronisation result plus the hang record: on either, one FAIL line naming the barrier (or the CUDA
   error), then the child reports and ends (the context or the results are gone). */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile HangRecord* r = g_hang_host;
    const int hung = r != NULL && r->site > kHangNone && r->site <= kHangProbe;
    if (e == cudaSuccess && !hung) return;
    if (hung)
        CHECK(0, "HANG in %s: mbarrier %s never completed (index %d, parity %d, block (%d, %d), thread %d; the CTA"
              " gave up and ran on: its results are garbage)", where, hang_site_name(r->site), r->index, r->parity,
              r->block_x, r->block_y, r->thread);
    if (e != cudaSuccess)
        CHECK(0, "CUDA error after %s: %s (hint: run under compute-sanitizer)", where, cudaGetErrorString(e));
    child_report_and_exit();
}

/* Tolerance, fixed before any run: only FP32 sum orders differ (wgmma k order, dK's two batches summed
   apart, 64- vs 32-query tiles), and a changed FP32 S or dP can flip one BF16 rounding of P, dS or
   -lambda P; the Hopper labs' value. */
static const double kMaxUlps = 4.0;
static const char* kSlotName[3] = {"dQ", "dK", "dV"};

/* Largest over heads of ||sum_j dK_j|| / ||dK|| (the gproj identity: 0 up to the BF16 output rounding). */
static double worst_key_sum(const uint16_t* dqkv, AttnShape s) {
    double worst = 0;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            double sum[kHS] = {0}, sq = 0;
            for (int tok = 0; tok < s.T; tok++) {
                const size_t base = ((size_t)b * s.T + tok) * 3 * s.NH * s.HS + ((size_t)s.NH + h) * s.HS;
                for (int d = 0; d < s.HS; d++) {
                    const double x = bf16_bits_to_float(dqkv[base + d]);
                    sum[d] += x;
                    sq += x * x;
                }
            }
            double n2 = 0;
            for (int d = 0; d < s.HS; d++) n2 += sum[d] * sum[d];
            if (sq > 0) worst = fmax(worst, sqrt(n2 / sq));
        }
    return worst;
}

/* Compares one slot and CHECKs it within kMaxUlps (or bit-equal when exact) against `ref`. */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       const char* against, int exact) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs %s: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n", what,
           kSlotName[slot], against, d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: %s has every element finite (%zu NaN)", kSlotName[slot], against, d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left of the poison)", what, kSlotName[slot],
          d.nan_new);
    if (exact)
        CHECK(d.unequal == 0, "%s %s bit-equal to %s (%zu differ)", what, kSlotName[slot], against, d.unequal);
    else
        CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of %s (max %.2f)", what, kSlotName[slot], kMaxUlps,
              against, d.max_ulps);
}

/* The name of a captured kernel node's function ("?" if the runtime cannot say; the error is cleared so
   that the next cudaCheckLastError does not report it). */
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

/* The composed Hopper gproj backward as a graph (the file comment's (2)): attention_backward_cuda(gproj, opt)
   and this kernel captured from `stream` into one chain, the portable key-major node removed and the row
   pass made this kernel's dependency. opt: force_portable (the portable row pass), or the default options
   when the default gproj backward has a Hopper row pass at HS 128 (none in the tree when this was written). Returns 0 (with a FAIL line saying why) if the captured
   graph is not the expected chain prep -> rows -> attn_bwd_kernel -> gproj128_keys_kernel. */
static int composed_build(cudaGraphExec_t* exec, const Gproj128& f, AttnOptions opt, const bf16* qkv,
                          const bf16* out, const float* stats, const bf16* dout, bf16* dqkv, void* ws,
                          cudaStream_t stream) {
    const AttnShape s = f.shape;
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const float* D = (const float*)ws + rows * s.HS;
    const float* lambda = D + rows;
    cudaGraph_t graph;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    attention_backward_cuda(ATTN_GPROJ, opt, s, qkv, out, stats, dout, dqkv, ws, stream);
    gproj128_launch(f, stats, D, lambda, dqkv, stream);
    cudaCheck(cudaStreamEndCapture(stream, &graph));
    /* walk the chain from its root */
    enum { kChain = 4 };
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
    /* over the default path (required = 0) another shape only means the default backward is not prep + row
       pass + the portable key-major kernel any more: nothing to compose, no failure */
    const int required = opt.force_portable;
    if (required)
        CHECK(ok, "composed graph: the capture is one chain of %d nodes (prep, row pass, portable key-major, this"
              " kernel); got %zu nodes", (int)kChain, n_nodes);
    else if (!ok)
        printf("  composing over the default path skipped: its capture is not a chain of %d nodes\n", (int)kChain);
    if (!ok) {
        cudaCheck(cudaGraphDestroy(graph));
        return 0;
    }
    const char* names[kChain];
    for (int i = 0; i < kChain; i++) names[i] = kernel_node_name(chain[i]);
    printf("  composed graph: captured %s -> %s -> %s -> %s; removing node 3\n", names[0], names[1], names[2], names[3]);
    const int named = strcmp(names[2], "?") != 0 && strcmp(names[3], "?") != 0;
    if (named) {
        const int shape_ok = strstr(names[2], "attn_bwd_kernel") != NULL &&
                             strstr(names[3], "gproj128_keys_kernel") != NULL && strstr(names[1], "rows") != NULL;
        if (required)
            CHECK(shape_ok, "composed graph: node 3 is the portable key-major attn_bwd_kernel, node 2 a row pass,"
                  " node 4 this kernel");
        else if (!shape_ok)
            printf("  composing over the default path skipped: node 3 is not the portable key-major kernel\n");
        if (!shape_ok) {
            cudaCheck(cudaGraphDestroy(graph));
            return 0;
        }
    } else {
        printf("  (cudaFuncGetName gave no names: node 3 taken by its place in the chain)\n");
    }
    cudaCheck(cudaGraphDestroyNode(chain[2]));
    cudaCheck(cudaGraphAddDependencies(graph, &chain[1], &chain[3], NULL, 1));
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
    const AttnMode mode = ATTN_GPROJ;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper gproj key-major pass at HS 128", s.B,
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
    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_new, *dqkv_comp;
    float* stats;
    void *ws_ref, *ws_comp;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    cudaCheck(cudaMalloc(&dqkv_new, nqkv * 2));
    lab_alloc_poisoned(&dqkv_comp, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_comp, ws_bytes);
    AttnOptions opt = {0}, portable = {0};
    portable.force_portable = 1;
    const Gproj128 f = gproj128_prepare(s, qkv, dout);
    /* the uploads and poison fills ran on the legacy default stream, which `st` (non-blocking) does not
       wait for */
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");

    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, st);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable backward");
    /* (1) this kernel over the reference's dqkv with k and v poisoned, from the reference's D and lambda */
    const float* D_ref = (const float*)ws_ref + rows * s.HS;
    const float* lambda_ref = D_ref + rows;
    cudaCheck(cudaMemcpyAsync(dqkv_new, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToDevice, st));
    const long long kv_elems = (long long)s.B * s.T * 2 * s.NH * s.HS;
    poison_kv_kernel<<<(unsigned)ceil_div(kv_elems, 256), 256, 0, st>>>(dqkv_new, (long long)s.B * s.T, s.NH);
    cudaCheckLastError();
    gproj128_launch(f, stats, D_ref, lambda_ref, dqkv_new, st);
    sync_or_report(cudaStreamSynchronize(st), "the gproj key-major kernel on the reference's D and lambda");
    /* (2) the composed backward, on poisoned dqkv and workspace; again over the default path's row pass if
       that one is a Hopper kernel */
    cudaGraphExec_t composed = NULL, composed_def = NULL;
    const int have_composed = composed_build(&composed, f, portable, qkv, out, stats, dout, dqkv_comp, ws_comp, st);
    if (have_composed) {
        cudaCheck(cudaGraphLaunch(composed, st));
        sync_or_report(cudaStreamSynchronize(st), "the composed gproj backward (graph)");
    }
    const int default_hopper = attention_backward_cuda_path(mode, opt, s, qkv, dout) == ATTN_BWD_HOPPER;
    bf16* dqkv_comp_def = NULL;
    void* ws_comp_def = NULL;
    int have_composed_def = 0;
    if (default_hopper) {
        printf("  the default gproj backward has a Hopper pass at HS 128: composing over its row pass too\n");
        lab_alloc_poisoned(&dqkv_comp_def, nqkv * 2);
        lab_alloc_poisoned(&ws_comp_def, ws_bytes);
        sync_or_report(cudaDeviceSynchronize(), "the poison fills");
        have_composed_def =
            composed_build(&composed_def, f, opt, qkv, out, stats, dout, dqkv_comp_def, ws_comp_def, st);
        if (have_composed_def) {
            cudaCheck(cudaGraphLaunch(composed_def, st));
            sync_or_report(cudaStreamSynchronize(st), "the composed gproj backward over the default row pass");
        }
    }

    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_comp = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_comp, dqkv_comp, nqkv * 2, cudaMemcpyDeviceToHost));
    check_slot(h_ref, h_new, s, 0, "(1) this kernel, same lambda:", "the force_portable backward (untouched)", 1);
    for (int slot = 1; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(1) this kernel, same lambda:", "the force_portable backward", 0);
    printf("  max over heads ||sum_j dK_j|| / ||dK||: force_portable %.3g, this kernel %.3g\n",
           worst_key_sum(h_ref, s), worst_key_sum(h_new, s));
    if (have_composed)
        for (int slot = 0; slot < 3; slot++)
            check_slot(h_ref, h_comp, s, slot, "(2) composed:", "the force_portable backward", slot == 0);
    if (have_composed_def) { /* another row pass: dQ to the tolerance, not bit-equal */
        cudaCheck(cudaMemcpy(h_comp, dqkv_comp_def, nqkv * 2, cudaMemcpyDeviceToHost));
        for (int slot = 0; slot < 3; slot++)
            check_slot(h_ref, h_comp, s, slot, "(2') composed over the default row pass:", "the force_portable backward",
                       0);
    }

    if (time_it && have_composed) {
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
        const float* D_comp = (const float*)ws_comp + rows * s.HS;
        const float* lambda_comp = D_comp + rows;
        auto run_portable = [&]() { attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        auto run_default = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_new, ws_ref, st); };
        auto run_bf16 = [&]() { attention_backward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, dout, dqkv_b, ws_b, st); };
        auto run_composed = [&]() { cudaCheck(cudaGraphLaunch(composed, st)); };
        auto run_keys = [&]() { gproj128_launch(f, stats, D_comp, lambda_comp, dqkv_comp, st); };
        /* kReps back-to-back runs queued behind a spin (2 ms + 100 us per run: longer than queueing them) */
        auto time_of = [&](auto fn, const char* what) {
            float t[kReps];
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
            for (int i = 0; i < kReps; i++) cudaCheck(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
            return median_ms(t, kReps);
        };
        const float ms_portable = time_of(run_portable, "timing the portable gproj backward");
        const float ms_default = time_of(run_default, "timing the default gproj backward");
        const float ms_composed = time_of(run_composed, "timing the composed gproj backward");
        if (have_composed_def) {
            auto run_composed_def = [&]() { cudaCheck(cudaGraphLaunch(composed_def, st)); };
            const float ms_def = time_of(run_composed_def, "timing the composed gproj backward (default row pass)");
            printf("  time: composed over the default (Hopper) row pass %.4f ms\n", ms_def);
        }
        const float ms_keys = time_of(run_keys, "timing the gproj key-major kernel alone");
        const float ms_bf16 = time_of(run_bf16, "timing the default bf16 backward");
        const char* path_default = attn_bwd_path_name(attention_backward_cuda_path(mode, opt, s, qkv, dout));
        const char* path_bf16 = attn_bwd_path_name(attention_backward_cuda_path(ATTN_BF16, opt, s, qkv, dout));
        /* key-major pass: 4 GEMMs of 2 B H T^2 d / 2 (causal) each, + the correction GEMM */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d, warm inputs, queued behind a spin): portable gproj backward %.4f ms; default"
               " gproj backward (path %s) %.4f ms; composed gproj backward (prep + portable row pass + this kernel,"
               " one graph) %.4f ms (%.2fx the portable); bf16 default backward (path %s) %.4f ms -> gproj/bf16"
               " backward: portable %.2fx, composed %.2fx\n",
               (int)kReps, ms_portable, path_default, ms_default, ms_composed, ms_portable / ms_composed, path_bf16,
               ms_bf16, ms_portable / ms_bf16, ms_composed / ms_bf16);
        printf("  time: this key-major kernel alone %.4f ms = %.1f TFLOP/s (5 GEMMs, causal); the rest of the"
               " composed backward (prep + portable row pass) %.4f ms\n",
               ms_keys, 5.0 * gemm / ms_keys * 1e-9, ms_composed - ms_keys);
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventDestroy(ev[r]));
        cudaCheck(cudaFree(out_b)); cudaCheck(cudaFree(dqkv_b)); cudaCheck(cudaFree(stats_b)); cudaCheck(cudaFree(ws_b));
    }
    if (composed != NULL) cudaCheck(cudaGraphExecDestroy(composed));
    if (composed_def != NULL) cudaCheck(cudaGraphExecDestroy(composed_def));
    if (dqkv_comp_def != NULL) cudaCheck(cudaFree(dqkv_comp_def));
    if (ws_comp_def != NULL) cudaCheck(cudaFree(ws_comp_def));
    free(h_qkv); free(h_dout); free(h_ref); free(h_new); free(h_comp);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(dqkv_comp));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_comp));
}

/* ref[i][j] = sum_k term(i, j, k) and mag[i][j] = sum_k |term(i, j, k)| (k ascending) over a rows x cols
   product, row-major (hopper_lab.cuh's probe_product is 64 x 64 only). */
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

/* The layout probe on B1 NH3 T100 HS128 (head 1; keys 100..127 zero-filled), lambda_q spread over [-2, 2]
   per query (a per-key mapping, a wrong query pairing or a dropped batch cannot pass), checked against
   double loops on the kernel's own S^T and dP^T, rounded as the kernel rounds them. */
static void layout_probe(void) {
    test_section("layout probe HS128 gproj: dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two RS n128 batches, one"
                 " accumulator, lambda per query column), the correction alone, dV, S^T, dP^T");
    ProbeInputs in;
    in.s = AttnShape{1, 3, 100, kHS};
    in.head = 1;
    const size_t nqkv = attn_qkv_count(in.s), nout = attn_out_count(in.s);
    in.h_qkv = random_bf16_bits(nqkv);
    in.h_dout = random_bf16_bits(nout);
    lab_upload(&in.qkv, in.h_qkv, nqkv * 2);
    lab_upload(&in.dout, in.h_dout, nout * 2);
    float h_lambda[kBlockQ];
    for (int q = 0; q < kBlockQ; q++) h_lambda[q] = (float)(4.0 * attn_rng_uniform(&g_rng) - 2.0);
    const int nk = kBlockK, nq = kBlockQ;
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS;
    const size_t total = 2 * n_st + 3 * n_kv;
    float *d_lambda, *d_out;
    lab_upload(&d_lambda, h_lambda, sizeof h_lambda);
    lab_alloc_poisoned(&d_out, total * 4);
    const CUtensorMap qmap = make_head_map(in.qkv, in.s, 3 * in.s.NH, "qkv");
    const CUtensorMap dmap = make_head_map(in.dout, in.s, in.s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeScores>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeDkDv>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeCorr>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    float* o_st = d_out;
    float* o_dpt = o_st + n_st;
    float* o_dk = o_dpt + n_st;
    float* o_corr = o_dk + n_kv;
    float* o_dv = o_corr + n_kv;
    gproj128_probe_kernel<kProbeScores><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(
        qmap, dmap, in.s.NH, in.head, d_lambda, o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    gproj128_probe_kernel<kProbeDkDv><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(
        qmap, dmap, in.s.NH, in.head, d_lambda, o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    gproj128_probe_kernel<kProbeCorr><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(
        qmap, dmap, in.s.NH, in.head, d_lambda, o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    const float* g_st = h;
    const float* g_dpt = g_st + n_st;
    const float* g_dk = g_dpt + n_st;
    const float* g_corr = g_dk + n_kv;
    const float* g_dv = g_corr + n_kv;
    double* ref = (double*)mallocCheck(n_kv * sizeof(double));
    double* mag = (double*)mallocCheck(n_kv * sizeof(double));
    int bad[5];
    /* S^T[key][query] = sum_d K[key][d] Q[query][d] */
    probe_product_rect(ref, mag, nk, nq, kHS,
                       [&](int i, int j, int d) { return probe_qkv(in, i, kSlotK, d) * probe_qkv(in, j, kSlotQ, d); });
    bad[0] = probe_compare_rect("S^T = K Q^T", g_st, ref, mag, nk, nq);
    /* dP^T[key][query] = sum_d V[key][d] dO[query][d] */
    probe_product_rect(ref, mag, nk, nq, kHS,
                       [&](int i, int j, int d) { return probe_qkv(in, i, kSlotV, d) * probe_dout(in, j, d); });
    bad[1] = probe_compare_rect("dP^T = V dO^T", g_dpt, ref, mag, nk, nq);
    /* the correction alone: sum_q bf(-lambda_q S^T[key][q]) Q[q][n], the product in FP32 as the kernel does */
    auto corr_term = [&](int i, int n, int q) {
        const float prod = -h_lambda[q] * g_st[i * nq + q];
        return (double)bf16_round(prod) * probe_qkv(in, q, kSlotQ, n);
    };
    probe_product_rect(ref, mag, nk, kHS, nq, corr_term);
    bad[2] = probe_compare_rect("bf(-lambda_q S^T) Q", g_corr, ref, mag, nk, kHS);
    /* both batches into one accumulator: per q the two terms (their |.| both counted in mag) */
    for (int i = 0; i < nk; i++)
        for (int n = 0; n < kHS; n++) {
            double r = 0, m = 0;
            for (int q = 0; q < nq; q++) {
                const double p1 = (double)bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kSlotQ, n);
                const double p2 = corr_term(i, n, q);
                r += p1 + p2;
                m += fabs(p1) + fabs(p2);
            }
            ref[i * kHS + n] = r;
            mag[i * kHS + n] = m;
        }
    bad[3] = probe_compare_rect("bf(dP^T) Q + bf(-lambda_q S^T) Q", g_dk, ref, mag, nk, kHS);
    /* dV[key][n] = sum_q bf(S^T[key][q]) dO[q][n] */
    probe_product_rect(ref, mag, nk, kHS, nq,
                       [&](int i, int n, int q) { return (double)bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n); });
    bad[4] = probe_compare_rect("dV = bf(S^T) dO", g_dv, ref, mag, nk, kHS);
    CHECK(bad[0] == 0, "S^T = K Q^T: hopper_bwd128's form (a) through this lab's copy (both warpgroups, stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T: form (a) with the dout map, through this lab's copy");
    CHECK(bad[2] == 0, "bf(-lambda_q P) as register A of m64n128k16 RS (h): lambda per query column from the"
                       " stage's lambda row (float2 pairs), Q N-major with LBO 8 KB");
    CHECK(bad[3] == 0, "(g) two RS n128 batches (bf(dS), then the correction) chained into one dK accumulator");
    CHECK(bad[4] == 0, "dV = bf(S^T) dO: form (b) through this lab's copy, bf(P) packed per k-step (h)");
    free(h); free(ref); free(mag);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_lambda)); cudaCheck(cudaFree(d_out));
}

/* The checks of one child process: the layout probe (child 0) or every case with the timings (child 1). */
static void run_child(int child) {
    attn_rng_init(&g_rng, 0x452821E638D01377ull);
    require_sm90("hopper_bwd128_gproj");
    hang_record_install();
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st; /* graph capture needs a stream of its own (not the legacy default stream) */
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* T = 1, T < 64, odd T, T not a multiple of the 128-key tile (a last key tile with an empty second
       half), B*NH up to 32, sharp softmax, key offsets (where the correction matters) */
    const CheckCase cases[] = {
        {{1, 1, 1, 128}, 1.f, 0.f},    {{1, 2, 50, 128}, 1.f, 0.f},   {{1, 1, 77, 128}, 1.f, 0.f},
        {{1, 2, 128, 128}, 1.f, 0.f},  {{1, 1, 129, 128}, 1.f, 0.f},  {{2, 3, 1001, 128}, 1.f, 0.f},
        {{4, 8, 257, 128}, 1.f, 0.f},
        {{1, 4, 500, 128}, 8.f, 0.f},   /* sharp softmax (q x8) */
        {{2, 4, 1000, 128}, 1.f, 20.f}, /* K += 20 u: the correction matters */
        {{1, 4, 777, 128}, 8.f, 20.f},  /* both, odd T */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    /* checks and timing at the benchmark shapes */
    const CheckCase bench[] = {{{8, 8, 1024, 128}, 1.f, 0.f}, {{2, 16, 4096, 128}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    cudaCheck(cudaStreamDestroy(st));
}

/* The parent never touches CUDA: each child (the probe, then the checks) gets a fresh context, so a fault or
   a hang report in one costs that child's results only. A child reports its pass/fail counts through a
   pipe; one that dies without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd128_gproj: gproj's Hopper key-major pass at HS 128 (dK, dV) vs the production backward"
           ", the probe and the checks each in its own process\n");
    static const char* kChildName[2] = {"the layout probe", "the checks and timings"};
    int passed = 0, failed = 0;
    for (int child = 0; child < 2; child++) {
        int fds[2];
        if (pipe(fds) != 0) die("hopper_bwd128_gproj: pipe() failed\n  hint: out of file descriptors?");
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) die("hopper_bwd128_gproj: fork() failed\n  hint: out of processes or memory?");
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
