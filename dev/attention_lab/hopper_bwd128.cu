/*
 * dev/attention_lab/hopper_bwd128.cu - lab of the Hopper (sm_90a) key-major attention backward at head size
 * 128 (dK, dV and the dQ atomics; wgmma + TMA; bf16 and repair modes), the piece attention_hopper_bwd.cu
 * refuses: at HS 128 the backward is still the portable mma.sync kernel (dev/results/device_s4/call5: 2.0 ms
 * of the 2.3 ms fwd+bwd at B2 H16 T4096 d128, where cuDNN's whole fwd+bwd takes 1.0 ms).
 *
 * STATUS: written 2026-11-29 without a GPU: compiled for sm_90a (ptxas -v below), NEVER RUN. Every kernel
 * here is checked by this program itself before anything is timed; the layout probe runs first.
 *
 * Why HS 64's kernel does not stretch: one consumer warpgroup owns 64 keys, so at HS 128 its dK and dV
 * accumulators are 2 x 64 x 128 FP32 = 128 registers per thread, next to S^T and dP^T (64 x 64 each: 64
 * more), the BF16 A operands of dV/dK (32) and a per-warpgroup dQ partial of 64 queries x 128 dims (64):
 * ~290 live registers. The layout here is FlashAttention-3's for d128 on sm_90 (read in
 * Dao-AILab/flash-attention hopper/flash_bwd_launch_template.h and mainloop_bwd_sm90_tma_gmma_ws.hpp; no
 * code copied): 64-query tiles (kBlockM 64) against 128 keys per CTA (kBlockN 128), two math warpgroups of
 * 64 keys each computing S^T and dP^T key-major (SdP_swapAB), dK/dV split by keys (AtomLayoutNdKV 2),
 * dQ split by head-dimension halves (AtomLayoutMdQ 1: each warpgroup computes dQ for ALL 64 queries and
 * 64 of the 128 dims, reducing over all 128 keys, so bf(dS) of both warpgroups goes through shared memory),
 * and a producer warpgroup that gives its registers away (setmaxnreg 24 / 240).
 *   Per step (query tile of 64, per consumer warpgroup):
 *     S^T = K_w Q^T, dP^T = V_w dO^T       m64n64k16 SS, 8 k-steps over two 64-column chunks   32 + 32 regs
 *     P, dS (masked entries exactly 0)      in place; packed to BF16 A operands                  16 + 16
 *     bf(dS) -> shared [query][128 keys]    from the packed words, BEFORE the wgmma that reads them
 *     dV += bf(P)^T dO, dK += bf(dS)^T Q    m64n128k16 RS, dO/Q N-major (LBO = one 8 KB chunk)    64 + 64
 *     (256-thread barrier: both halves of the dS tile written)
 *     dQ_half = bf(dS) K[:, 64w..64w+63]    m64n64k16 RS, A = 8 k-steps loaded from the tile     32 + 32
 *     red.global.add.v2.f32 into the FP32 dQ accumulator (one set of atomics per 128 keys, as the
 *     portable kernel's per-128-key partials)
 *   Peak live: 128 (dK, dV) + 64 (S^T, dP^T) or 64 (A of dQ, dQ) + addresses, under the 240 that
 *   setmaxnreg gives the consumers; the dV/dK batch is waited on before the dQ batch is issued so the A
 *   registers of the first (32) are free again (FA3 overlaps more; see Not done).
 *
 * Numerics (docs/ATTENTION_NUMERICS.md; attn_bwd_kernel's rounding points, operation for operation, as in
 * attention_hopper_bwd.cu): P = exp2(fma(S, c, -fl(LSE log2 e))) (bf16) or exp2((S - m) c) * fl(1/l)
 * (repair), dS = P (dP - D), dV += bf(P)^T dO, dK += bf(dS)^T Q, dQ_acc += bf(dS) K in FP32, then
 * dK = bf(s acc), dV = bf(acc), dQ = bf(s acc) (the post-pass here, attn_bwd_dq_kernel's expression). Only
 * the FP32 summation order differs from the portable kernel, so the check is <= 4 BF16 ulps of the row
 * scale (the HS 64 labs' tolerance, fixed before any run).
 *
 * Shared memory (165 KiB of the 227 KiB): K, V tiles 128 keys x 2 chunks (32 KB each); Q, dO 2 stages x 64
 * queries x 2 chunks (64 KB); the dS tile [64][128 + 8] BF16 double-buffered by step parity (34 KB: step
 * i + 2 rewrites buffer i & 1 only after every consumer thread passed step i + 1's barrier, i.e. after
 * its reads of step i); row state {row_a, row_b, D} float4 [2][64] written by the producer lanes.
 *
 * Registers: a producer warpgroup (384 threads) with setmaxnreg.dec 24 there and .inc 240 in the two
 * consumer warpgroups (128 * 24 + 256 * 240 = 64512 = 384 * 168, what the CTA is launched with; FA3's split
 * for two math warpgroups). Without it the consumers get 168: a 288-thread CTA (2 consumer warpgroups +
 * one producer warp, no setmaxnreg) was compiled and dropped - ptxas gives it 168 registers per thread too,
 * 1628 / 1648 B of spills and C7512 (wgmmas serialised).
 *   ptxas -v (CUDA 13.0, sm_90a, -O3; `make hopper_bwd128-regs` prints them again), bf16 and repair:
 *     kernel 168 registers at entry (240 after setmaxnreg.inc), 0 B spill, no C75xx warning;
 *     layout probe (256 threads, no setmaxnreg) 254 registers, 0 spill; prep 28, dQ post-pass 26.
 *
 * Assumptions that are NEW here (not covered by any probe that has passed on the H200) and what checks them:
 *   (a) m64n64k16 SS over 8 k-steps with the chunk jump (k-step kk at chunk kk / 4, byte 32 (kk % 4)) for
 *       K-major A at a 64-row (8 KB) offset inside each 16 KB chunk of the K/V tile, and for B in a 64-row
 *       tile whose chunks are 8 KB apart: the forward's HS 128 form with n64 and these strides - probe S^T,
 *       dP^T;
 *   (b) m64n128k16 RS with an N-major B of 64 rows whose two 64-column chunks are 8 KB apart (LBO 8192): the
 *       forward's P V form at HS 128 used LBO 16 KB (128-row V tiles) - probe dV (dO), dK (Q);
 *   (c) bf(dS) staged from the PACKED A words (not re-packed from FP32 as at HS 64) into a [query][136] tile
 *       shared by both warpgroups (column offset 64 w), read back as 8 k-steps of A - probe dQ;
 *   (d) K read N-major for dQ as one 128-key column chunk (16 rows per k-step = 2048 bytes, crossing the
 *       8 KB boundary between the two 64-row TMA boxes at k-step 4) - probe dQ;
 *   (e) setmaxnreg 24 / 240 (HS 64's lab ran 40 / 232 and passed): a wrong split hangs or faults at the
 *       first launch - the shape checks (named hang record, or the child process dies and is counted);
 *   (f) red.global.add.v2.f32 predicated per query (as hopper_bwd_fast.cu, passed) with the per-head-half
 *       column offset - the dQ checks of every shape.
 * The probe loads Q/dO into stage 1 and stages dS in buffer 1, so the non-zero offsets are what it
 * exercises.
 *
 * Safety: mbarrier waits are bounded (~2 s of clock64) and then GIVE UP (the labs' shared wait and hang
 * record, dev/attention_lab/hopper_lab_hang.cuh): they record the barrier in host-mapped memory, set the
 * CTA's abort flag (every later wait of the CTA returns at once) and run on; the host checks the record
 * after every synchronisation and names the barrier. No __trap(): a trap on the consumer path makes ptxas
 * ignore setmaxnreg (engineer G, hopper_bwd_fast.cu). Named barriers and setmaxnreg cannot be bounded (their
 * counts are uniform by construction). Each variant runs in its own process (the parent never touches
 * CUDA), so a fault costs that variant's lines only. Run under `timeout`.
 *
 * Timing: the whole backward (prep + key-major kernel + dQ post-pass) of the variant next to
 * attention_backward_cuda with force_portable (the mma.sync path that HS 128 runs today), interleaved,
 * queued behind a spin kernel so host launch overhead never shows as GPU idle time inside a timed
 * interval; tensor maps encoded once per shape (production encodes per call: host time, hidden by the
 * queue). Inputs are NOT rotated (they stay in L2 between repeats): for the number to set beside cuDNN,
 * move the kernel into attention/ and run dev/bench_attention.cu, which rotates inputs beyond L2.
 *
 * Not done: FA3's dQ path (dQ tile to shared memory, TMA reduce-add by a separate warp instead of
 * red.global from the math warpgroups); overlapping the dQ GEMM with dV/dK or with the next step's scores;
 * 3 stages; a persistent schedule; fp32/gproj modes (their row pass is HS 64 only too); the repair
 * tile-max-shift arm (portable end to end, as at HS 64).
 *
 * Shared with the other Hopper labs: the device building blocks (wgmma, TMA, mbarriers, setmaxnreg, the dQ
 * reduction, the tensor map) from attention/hopper_wgmma.cuh, the host scaffolding (inputs, poisoned
 * buffers, the BF16-ulp slot comparison, median timing, the sm_90 check, the probe's inputs and tolerance)
 * from dev/attention_lab/hopper_lab.cuh. What stays here is HS 128's own: the 8-k-step GEMM steps over two
 * column chunks, the 128-key dS tile, the 256-thread consumer barrier, and the probe's non-64 x 64 products.
 *
 * Usage: hopper_bwd128   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
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
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of S^T, dK, dV) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kDqCols = kHS / kConsumerWarpgroups; /* head-dim columns of dQ per consumer warpgroup */
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
/* setmaxnreg split of the 384-thread CTA (__launch_bounds__(384, 1): every thread starts at 168) */
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
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands (and N = 64 B operands) ignore LBO */
constexpr int kDsPitch = kBlockK + 8;   /* BF16 per row of the staged dS tile [query][128 keys]: +8 against bank conflicts */
constexpr float kLog2e = 1.4426950408889634f;
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ, "S^T per warpgroup is 64 x 64: its A operand covers the 4 k-steps of dV/dK");
static_assert(kBlockQ / kWgmmaK == kTileKSteps,
              "S^T, dP^T are 64 x 64 tiles: hopper_wgmma.cuh's pack_acc_a_operand packs them");

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
    static constexpr int kDs = kDO + kStages * kQTileBytes;  /* 2 buffers of [64 query][kDsPitch] BF16 */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kRowState = kDs + 2 * kDsBytes;     /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* ---- the GEMMs of one (key tile, query tile) step, per warpgroup (shared by the kernel and the probe) ---- */

/* acc = A B^T issued (64 x 64 over HS/16 = 8 k-steps; the caller zeroes, fences, commits and waits): A the
   warpgroup's 64 rows of the K or V tile (chunks kKeyChunkBytes apart), B the stage's Q or dO tile (chunks
   kQChunkBytes apart), both K-major; k-step kk reads bytes 32 (kk % 4) of the 128-byte rows of column chunk
   kk / 4 (assumption (a)). */
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

/* S^T = K_w Q^T and dP^T = V_w dO^T (64 keys x 64 queries each) as one commit group (hopper_wgmma.cuh's
   warpgroup_two_ss_64x64 at HS 128). kw_addr, vw_addr: the warpgroup's first row in chunk 0 of the K/V tile;
   q_addr, do_addr: the stage's tiles. Written, not accumulated. */
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

/* acc[64 x 128] += A[64 x 64] B[64 x 128]: A from registers (4 k-steps over the 64 queries of the tile), B
   the stage's Q or dO tile read N-major (rows = queries, 16 rows = 2048 bytes per k-step; the second
   64-column block of N is one 8 KB chunk further: LBO = kQChunkBytes, assumption (b)). Issued only. */
__device__ __forceinline__ void warpgroup_dkv_issue(float (&acc)[kHS / 2], const uint32_t (&a)[kBlockQ / kWgmmaK][4],
                                                    uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < kBlockQ / kWgmmaK; kk++)
        wgmma_m64n128k16_rs(acc, a[kk], make_smem_desc(b_addr + kk * kWgmmaK * kSwizzleRowBytes, SmemPlan::kQChunkBytes,
                                                       kSwizzleAtomBytes));
}

/* dQ_half[64 queries x 64 dims] = A[64 x 128 keys] K[128 keys x 64 dims]: A from registers (8 k-steps of 16
   keys), B = column chunk `half` of the K tile read N-major: 128 key rows of 128 bytes, 16 rows = 2048 bytes
   per k-step (k-step 4 starts the second 64-row TMA box of the chunk: assumption (d)). N = 64: LBO unused.
   Issued only. */
__device__ __forceinline__ void warpgroup_dq_issue(float (&acc)[32], const uint32_t (&a)[kBlockK / kWgmmaK][4],
                                                   uint32_t k_chunk_addr) {
#pragma unroll
    for (int kk = 0; kk < kBlockK / kWgmmaK; kk++)
        wgmma_m64n64k16_rs(acc, a[kk], make_smem_desc(k_chunk_addr + kk * kWgmmaK * kSwizzleRowBytes, kUnusedLbo,
                                                      kSwizzleAtomBytes));
}

/* bf(dS^T) from its packed A words to the shared tile as [query][key] (assumption (c)): word pds[kk][i] holds
   key key_col + 8 (i & 1) and queries q, q + 1 with q = 16kk + 8 (i >> 1) + 2t (low half: q). key_col is
   the thread's key row within the CTA's 128 (64 w + 16 warp_in_wg + g). Ordinary register reads, done
   before the wgmma that reads pds as A is issued (PTX leaves an access to the A registers of an in-flight
   wgmma undefined). Not hopper_wgmma.cuh's stage_tile_transposed: that one re-packs from the FP32
   accumulator (the HS-64 kernels' way; here it gives other PTX), these stores are assumption (c)'s. */
__device__ __forceinline__ void stage_ds(bf16* ds_s, const uint32_t (&pds)[kBlockQ / kWgmmaK][4], int key_col, int t) {
#pragma unroll
    for (int kk = 0; kk < kBlockQ / kWgmmaK; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = key_col + 8 * (i & 1);
            const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
            const uint32_t w = pds[kk][i];
            ds_s[q * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w & 0xFFFFu));
            ds_s[(q + 1) * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w >> 16));
        }
}

/* The A fragments of dQ = dS K for this warp's 16 queries from the tile [query][128 keys]: k-steps 0-3 from
   keys 0..63, 4-7 from keys 64..127, each half through hopper_wgmma.cuh's load_staged_a_operand. */
__device__ __forceinline__ void load_ds_operand(uint32_t (&a)[kBlockK / kWgmmaK][4], const bf16* ds_s, int warp_in_wg,
                                                int g, int t) {
    static_assert(kBlockK / kWgmmaK == 2 * kTileKSteps, "two 64-key halves of A");
#pragma unroll
    for (int half = 0; half < 2; half++)
        load_staged_a_operand<kDsPitch>(*reinterpret_cast<uint32_t(*)[kTileKSteps][4]>(&a[half * kTileKSteps]),
                                        ds_s + half * kTileK, warp_in_wg, g, t);
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* D and the zeroed dQ accumulator (attn_bwd_prep_kernel's semantics and order: lanes d, d + 32, ..., then
   the xor tree), one warp per (b, h, t) row; rows = B*NH*T in (b*NH + h)*T + t order. */
__global__ void bwd128_prep_kernel(const bf16* __restrict__ out, const bf16* __restrict__ dout, float* __restrict__ D,
                                   float* __restrict__ dq_acc, int NH, int T, long long rows) {
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

/* dQ = bf(s * acc) into the q slot of dqkv (attn_bwd_dq_kernel's expression); one thread per 2 elements. */
__global__ void bwd128_dq_kernel(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T, float scale,
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

/* The recomputed probability of one score (attention_cuda.cu's backward_prob): bf16: row_a =
   fl(LSE log2 e), P = exp2(fma(S, c, -row_a)); repair: row_a = m, row_b = fl(1/l). */
template <int MODE>
__device__ __forceinline__ float recompute_prob(float score, float row_a, float row_b, float c) {
    if (MODE == ATTN_BF16) return exp2f(__fmaf_rn(score, c, -row_a));
    return exp2f((score - row_a) * c) * row_b;
}

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it, so host-side launch work never shows as idle time inside an interval. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* The key-major backward at HS 128 (see the file comment). */
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_bwd128_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                         const float* __restrict__ stats, const float* __restrict__ D, float* __restrict__ dq_acc,
                         bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
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

    const int k0 = blockIdx.x * kBlockK; /* key tile 0 sees every query: first */
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
        /* ---- producer warp: lane 0 issues the copies, every lane writes row state for 2 queries ---- */
        if (lane == 0) {
            mbar_arrive_expect_tx(kv_full, 2 * Plan::kKeyTileBytes);
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                /* a half that starts at or past T (last key tile) loads the first half's rows again instead
                   of a box wholly out of bounds: its keys are all masked (dS = 0), and finite data keeps
                   0 * K = 0 in dQ (as attention_hopper_bwd.cu) */
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
                float4 st = make_float4(0.f, 1.f, 0.f, 0.f); /* rows past T: P stays finite (masked anyway) */
                if (query < T) {
                    const long long idx = (long long)bh * T + query;
                    const float a = stats[idx * 2];
                    st.x = (MODE == ATTN_BF16) ? a * kLog2e : a;                      /* fl(LSE log2 e) or m */
                    st.y = (MODE == ATTN_BF16) ? 1.f : __frcp_rn(stats[idx * 2 + 1]); /* 1 or fl(1 / l) */
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
        bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + (i & 1) * Plan::kDsBytes);

        float st[32], dpt[32];
        warpgroup_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);

        /* P and dS in registers (st <- P, dpt <- dS), masked entries exactly 0. Element 4j + 2r + e: key
           key0 + 8r, query q0 + 8j + 2t + e. The mask can bite only where the tile reaches the warpgroup's
           keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int query = q0 + 8 * j + 2 * t + e;
                const float4 row = rs[8 * j + 2 * t + e];
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

        /* bf(P), bf(dS) as A operands; bf(dS) also to the shared tile (this warpgroup's 64 key columns) */
        uint32_t pa[kBlockQ / kWgmmaK][4], pds[kBlockQ / kWgmmaK][4];
        pack_acc_a_operand(pa, st);
        pack_acc_a_operand(pds, dpt);
        stage_ds(ds_s, pds, key_col, t);
        /* dV += bf(P)^T dO, dK += bf(dS)^T Q as one batch */
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        warpgroup_dkv_issue(dv, pa, do_addr);
        warpgroup_dkv_issue(dk, pds, q_addr);
        wgmma_commit();
        consumers_sync(); /* both warpgroups' halves of the dS tile are written */
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pds);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

        /* dQ for all 64 queries, this warpgroup's 64 columns, over the CTA's 128 keys */
        uint32_t adq[kBlockK / kWgmmaK][4];
        load_ds_operand(adq, ds_s, warp_in_wg, g, t);
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(adq);
        reg_fence(dq);
        wgmma_fence();
        warpgroup_dq_issue(dq, adq, k_dq_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq);
        reg_fence(adq);

        /* rows = queries q0 + 16 warp_in_wg + g (+8), cols 64 wg + 8n + 2t */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int query = q0 + warp_in_wg * 16 + g + 8 * r;
            float* dst = dq_acc + ((long long)bh * T + query) * kHS + wg * kDqCols + 2 * t;
#pragma unroll
            for (int n = 0; n < kDqCols / 8; n++)
                red_add_f32x2_if(dst + 8 * n, dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1], query < T);
        }
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

/* The probe's outputs of two accumulators over this thread's key rows: [keys][N] FP32, row-major; element
   4j + 2r + e is row key_col + 8r, column 8j + 2t + e (hopper_wgmma.cuh's fragment layout). */
template <int REGS>
__device__ __forceinline__ void store_key_rows(float* out0, float* out1, const float (&acc0)[REGS],
                                               const float (&acc1)[REGS], int key_col, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                out0[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc0[4 * j + 2 * r + e];
                out1[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc1[4 * j + 2 * r + e];
            }
}

/* Layout probe: the two consumer warpgroups (256 threads), one step of everything, no softmax, at batch 0,
   head `head`: K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 loaded into
   STAGE 1, dS staged in BUFFER 1 (the non-zero offsets are what is exercised), through the kernel's own
   helpers:
     out_st  [128 keys][64 queries]  S^T = K Q^T            (a)
     out_dpt [128][64]               dP^T = V dO^T          (a), the dout map at HS 128
     out_dv  [128 keys][128]         dV = bf(S^T) dO        (b)
     out_dk  [128][128]              dK = bf(dP^T) Q        (b), Q read N-major after K-major
     out_dq  [64 queries][128]       dQ = bf(dP^T)^T K      (c), (d): both warpgroups' dS, 128 keys
   FP32, row-major. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ out_st, float* __restrict__ out_dpt,
                        float* __restrict__ out_dv, float* __restrict__ out_dk, float* __restrict__ out_dq) {
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
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsBytes); /* buffer 1 */
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
    mbar_wait_bounded(bar, 0, kHangProbe, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp / 4, warp_in_wg = warp % 4;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    float st[32], dpt[32];
    warpgroup_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes, smem_u32(q_t),
                     smem_u32(do_t));
    store_key_rows(out_st, out_dpt, st, dpt, key_col, t);
    uint32_t pa[4][4], pds[4][4];
    pack_acc_a_operand(pa, st);
    pack_acc_a_operand(pds, dpt);
    stage_ds(ds_s, pds, key_col, t);
    float dv[kHS / 2], dk[kHS / 2], dq[32];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dv[i] = dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) dq[i] = 0.f;
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    warpgroup_dkv_issue(dv, pa, smem_u32(do_t));
    warpgroup_dkv_issue(dk, pds, smem_u32(q_t));
    wgmma_commit();
    consumers_sync();
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(pa);
    reg_fence(pds);
    uint32_t adq[8][4];
    load_ds_operand(adq, ds_s, warp_in_wg, g, t);
    reg_fence(adq);
    reg_fence(dq);
    wgmma_fence();
    warpgroup_dq_issue(dq, adq, smem_u32(k_s) + wg * Plan::kKeyChunkBytes);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(adq);
    store_key_rows(out_dv, out_dk, dv, dk, key_col, t);
#pragma unroll
    for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                out_dq[(warp_in_wg * 16 + g + 8 * r) * kHS + wg * kDqCols + 8 * n + 2 * t + e] = dq[4 * n + 2 * r + e];
}

}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, variants, launch                                                               */
/* ------------------------------------------------------------------------------------------------ */

/* hopper_wgmma.cuh's 4-D BF16 tensor map {HS, heads, T, B} with boxes of 64 columns x kBoxRows tokens
   (column chunk c at coordinate 64 c), 128-byte swizzle, zeros outside. qkv: heads = 3 NH (slot*NH + head);
   dout [B, T, NH, HS]: heads = NH. */
static CUtensorMap make_head_map(const bf16* base, AttnShape s, int heads, const char* what) {
    static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
    return encode_head_map(base, s, heads, kBoxRows, "hopper_bwd128", what);
}

typedef void (*KernelLaunch)(dim3 grid, cudaStream_t stream, const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                             const float* stats, const float* D, float* dq_acc, bf16* dqkv, int NH, int T, float scale,
                             float c);
template <int MODE>
static void launch_kernel(dim3 grid, cudaStream_t stream, const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                          const float* stats, const float* D, float* dq_acc, bf16* dqkv, int NH, int T, float scale,
                          float c) {
    hopper_bwd128_kernel<MODE><<<grid, kThreads, SmemPlan::kAlloc, stream>>>(
        qkv_map, dout_map, stats, D, dq_acc, dqkv, NH, T, scale, c);
}
template <int MODE>
static void allow_kernel_smem(void) {
    cudaCheck(cudaFuncSetAttribute(hopper_bwd128_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
}
struct Variant {
    const char* name;   /* short, for the log */
    const char* change; /* what it is */
    KernelLaunch launch_bf16, launch_repair;
    void (*allow_smem_bf16)(void);
    void (*allow_smem_repair)(void);
};
/* One variant so far; the table (and the process per variant) is there for the next steps (see Not done). */
#define BWD128_VARIANT(name, change)                                                                        \
    {name, change, launch_kernel<ATTN_BF16>, launch_kernel<ATTN_REPAIR>, allow_kernel_smem<ATTN_BF16>,        \
     allow_kernel_smem<ATTN_REPAIR>}
static const Variant kVariants[] = {
    BWD128_VARIANT("v1", "producer warpgroup (384 threads), setmaxnreg 24 / 240, dV/dK batch then dQ batch, 2 stages"),
};
enum { kNumVariants = (int)(sizeof kVariants / sizeof kVariants[0]) };
#undef BWD128_VARIANT

/* What a launch needs that depends on the shape and the buffers only (the maps encode the pointers). */
struct Bwd128 {
    AttnShape shape;
    AttnMode mode;
    CUtensorMap qkv_map, dout_map;
};

static Bwd128 bwd128_prepare(AttnMode mode, AttnShape s, const bf16* qkv, const bf16* dout) {
    attention_cuda_check_shape(s, mode);
    if (s.HS != kHS) {
        die("hopper_bwd128: head size %d is not this lab's (B=%d NH=%d T=%d)\n"
            "  hint: HS 64 has its own kernel (attention/attention_hopper_bwd.cu)", s.HS, s.B, s.NH, s.T);
    }
    if (mode != ATTN_BF16 && mode != ATTN_REPAIR) {
        die("hopper_bwd128: mode %s is not supported by this lab\n"
            "  hint: bf16 and repair only (fp32 splits P/dS into BF16 terms; gproj needs the row pass)",
            attn_mode_name(mode));
    }
    for (int v = 0; v < kNumVariants; v++) {
        kVariants[v].allow_smem_bf16();
        kVariants[v].allow_smem_repair();
    }
    Bwd128 f;
    f.shape = s;
    f.mode = mode;
    f.qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    f.dout_map = make_head_map(dout, s, s.NH, "dout");
    return f;
}

/* The whole backward with variant `variant`: prep (D, zeroed accumulator), the key-major kernel, the dQ
   post-pass. Overwrites dqkv. workspace: B*NH*T*(HS + 1) floats (accumulator, then D). */
static void bwd128_launch(const Bwd128& f, int variant, const bf16* out, const float* stats, bf16* dqkv,
                          float* workspace, const bf16* dout, cudaStream_t stream) {
    const AttnShape s = f.shape;
    const long long rows = (long long)s.B * s.NH * s.T;
    float* dq_acc = workspace;
    float* D = workspace + rows * s.HS;
    const float scale = attn_softmax_scale(s.HS), c = attn_exp2_scale(s.HS);
    constexpr int kPrepThreads = 256;
    bwd128_prep_kernel<<<(unsigned)ceil_div(rows, kPrepThreads / 32), kPrepThreads, 0, stream>>>(out, dout, D, dq_acc,
                                                                                                s.NH, s.T, rows);
    cudaCheckLastError();
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    const Variant& v = kVariants[variant];
    (f.mode == ATTN_BF16 ? v.launch_bf16 : v.launch_repair)(grid, stream, f.qkv_map, f.dout_map, stats, D, dq_acc, dqkv,
                                                            s.NH, s.T, scale, c);
    cudaCheckLastError();
    const long long pairs = rows * s.HS / 2;
    bwd128_dq_kernel<<<(unsigned)ceil_div(pairs, 256), 256, 0, stream>>>(dq_acc, dqkv, s.NH, s.T, scale, pairs);
    cudaCheckLastError();
}

/* cudaDeviceSynchronize (or an event wait) that names the barrier that hung, if one did, and stops. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile HangRecord* r = g_hang_host;
    const int hung = r != NULL && r->site > kHangNone && r->site <= kHangProbe;
    if (e == cudaSuccess && !hung) return;
    if (hung) {
        fprintf(stderr, "hopper_bwd128: HANG: mbarrier %s, index %d, parity %d, block (%d, %d), thread %d"
                " (the CTA gave up waiting and ran on: its results are garbage)\n",
                hang_site_name(r->site), r->index, r->parity, r->block_x, r->block_y, r->thread);
        printf("  FAIL HANG in %s: mbarrier %s never completed\n", where, hang_site_name(r->site));
        fflush(stdout);
    }
    die("hopper_bwd128: %s after %s%s%s\n  hint: a HANG line names the mbarrier that never completed (a pipeline"
        " protocol bug); otherwise run under compute-sanitizer",
        hung ? "a hung mbarrier" : "a CUDA error", where, e != cudaSuccess ? ": " : "",
        e != cudaSuccess ? cudaGetErrorString(e) : "");
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the portable backward, timing                                                */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerance (set before any run, as the HS 64 labs): the kernels sum S, dP (tensor-core k order), dK/dV
   (query order within a tile) and dQ (per 128 keys in both, different order inside) differently; a
   changed FP32 S can flip the BF16 rounding of P or dS of one element. */
static const double kMaxUlps = 4.0;

/* One shape and mode: forward by attention_forward_cuda, then the portable production backward
   (force_portable: what HS 128 runs today) and variant `variant` on the same inputs (dqkv and workspace
   poisoned with NaN first), compared slot by slot. With time_it, both timed, interleaved. */
static void check_shape(AttnMode mode, AttnShape s, float q_scale, int time_it, int variant) {
    char title[256];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d%s: HS-128 wgmma backward %s vs attention_backward_cuda",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, q_scale != 1.f ? " (q x8)" : "", kVariants[variant].name);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    uint16_t* h_qkv = random_qkv_bits(s, q_scale);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *out, *dout, *dqkv_ref, *dqkv_new;
    float *stats, *ws_new;
    void* ws_ref;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    lab_upload(&dout, h_dout, nout * 2);
    /* poisoned (NaN): any output or workspace element left unwritten shows */
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&ws_ref, attention_cuda_workspace_bytes(s, mode));
    lab_alloc_poisoned(&ws_new, rows * (s.HS + 1) * 4);
    AttnOptions portable = {0};
    portable.force_portable = 1;
    attention_forward_cuda(mode, portable, s, qkv, out, stats, NULL, 0);
    const Bwd128 bwd = bwd128_prepare(mode, s, qkv, dout);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
    bwd128_launch(bwd, variant, out, stats, dqkv_new, ws_new, dout, 0);
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
        CHECK(d.nan_new == 0, "%s %s: wgmma backward wrote every element, finite (%zu NaN left)",
              kVariants[variant].name, kSlotName[slot], d.nan_new);
        CHECK(d.max_ulps <= kMaxUlps, "%s %s within %.0f BF16 ulps of the reference (max %.2f)",
              kVariants[variant].name, kSlotName[slot], kMaxUlps, d.max_ulps);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t ev[4][kReps];
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < kReps; r++) cudaCheck(cudaEventCreate(&ev[k][r]));
        for (int i = 0; i < kWarmup; i++) {
            attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
            bwd128_launch(bwd, variant, out, stats, dqkv_new, ws_new, dout, 0);
        }
        sync_or_report(cudaDeviceSynchronize(), "the warm-up launches");
        /* 2 ms plus 100 us per pair of launches: longer than queueing them takes */
        spin_for_ns<<<1, 1>>>(2000000ull + 100000ull * kReps);
        cudaCheckLastError();
        for (int r = 0; r < kReps; r++) {
            cudaCheck(cudaEventRecord(ev[0][r]));
            attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
            cudaCheck(cudaEventRecord(ev[1][r]));
            cudaCheck(cudaEventRecord(ev[2][r]));
            bwd128_launch(bwd, variant, out, stats, dqkv_new, ws_new, dout, 0);
            cudaCheck(cudaEventRecord(ev[3][r]));
        }
        sync_or_report(cudaDeviceSynchronize(), "the timed launches");
        float t_ref[kReps], t_new[kReps];
        for (int r = 0; r < kReps; r++) {
            cudaCheck(cudaEventElapsedTime(&t_ref[r], ev[0][r], ev[1][r]));
            cudaCheck(cudaEventElapsedTime(&t_new[r], ev[2][r], ev[3][r]));
        }
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < kReps; r++) cudaCheck(cudaEventDestroy(ev[k][r]));
        /* backward = 2.5 x the causal forward's 2 B H T^2 d (FlashAttention count) */
        const double flops = 2.5 * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
        const float ms_ref = median_ms(t_ref, kReps), ms_new = median_ms(t_new, kReps);
        printf("  time (median of %d, warm inputs, launches queued behind a spin, prep + kernel + dQ pass): mma.sync"
               " %.4f ms = %.1f TFLOP/s; %s %.4f ms = %.1f TFLOP/s; speed-up %.2fx\n",
               (int)kReps, ms_ref, flops / ms_ref * 1e-9, kVariants[variant].name, ms_new, flops / ms_new * 1e-9,
               ms_ref / ms_new);
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_new));
}

/* ref[i][j] = sum_k term(i, j, k) and mag[i][j] = sum_k |term(i, j, k)| (k ascending) over a rows x cols
   product, row-major: hopper_lab.cuh's probe_product (64 x 64 only) for this probe's 128-row and 128-column
   outputs. */
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
   of |products| (its probe_compare for any shape); prints the first misses and a summary line. */
static int probe_compare(const char* name, const float* got, const double* ref, const double* mag, int rows, int cols) {
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

/* Runs layout_probe_kernel on B1 NH3 T100 (head 1: slot and head coordinates; keys 100..127 zero-filled)
   and checks its five products against double loops over the same BF16 values (the kernel's own S^T,
   dP^T, rounded to BF16 as it rounds them, for the register-A and staged-A products). */
static void layout_probe(void) {
    test_section("layout probe HS128: S^T, dP^T (SS n64, 2 chunks), dV, dK (RS n128, LBO 8 KB), dQ (dS of both"
                 " warpgroups staged, K chunk N-major over 128 keys)");
    /* hopper_lab.cuh's probe inputs (accessors probe_qkv / probe_dout) at this probe's shape */
    ProbeInputs in;
    in.s = AttnShape{1, 3, 100, kHS};
    in.head = 1;
    const size_t nqkv = attn_qkv_count(in.s), nout = attn_out_count(in.s);
    in.h_qkv = random_bf16_bits(nqkv);
    in.h_dout = random_bf16_bits(nout);
    lab_upload(&in.qkv, in.h_qkv, nqkv * 2);
    lab_upload(&in.dout, in.h_dout, nout * 2);
    const int nk = kBlockK, nq = kBlockQ;
    const size_t n_st = (size_t)nk * nq, n_dkv = (size_t)nk * kHS, n_dq = (size_t)nq * kHS;
    const size_t total = 2 * n_st + 2 * n_dkv + n_dq;
    float* d_out;
    lab_alloc_poisoned(&d_out, total * 4);
    const CUtensorMap qmap = make_head_map(in.qkv, in.s, 3 * in.s.NH, "qkv");
    const CUtensorMap dmap = make_head_map(in.dout, in.s, in.s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    float* o_st = d_out;
    float* o_dpt = o_st + n_st;
    float* o_dv = o_dpt + n_st;
    float* o_dk = o_dv + n_dkv;
    float* o_dq = o_dk + n_dkv;
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qmap, dmap, in.s.NH, in.head, o_st, o_dpt, o_dv,
                                                                   o_dk, o_dq);
    cudaCheckLastError();
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    const float* g_st = h;
    const float* g_dpt = g_st + n_st;
    const float* g_dv = g_dpt + n_st;
    const float* g_dk = g_dv + n_dkv;
    const float* g_dq = g_dk + n_dkv;
    double* ref = (double*)mallocCheck(n_dkv * sizeof(double));
    double* mag = (double*)mallocCheck(n_dkv * sizeof(double));
    int bad[5];
    /* S^T[key][query] = sum_d K[key][d] Q[query][d] */
    probe_product_rect(ref, mag, nk, nq, kHS,
                       [&](int i, int j, int d) { return probe_qkv(in, i, kSlotK, d) * probe_qkv(in, j, kSlotQ, d); });
    bad[0] = probe_compare("S^T = K Q^T", g_st, ref, mag, nk, nq);
    /* dP^T[key][query] = sum_d V[key][d] dO[query][d] */
    probe_product_rect(ref, mag, nk, nq, kHS,
                       [&](int i, int j, int d) { return probe_qkv(in, i, kSlotV, d) * probe_dout(in, j, d); });
    bad[1] = probe_compare("dP^T = V dO^T", g_dpt, ref, mag, nk, nq);
    /* dV[key][n] = sum_q bf(S^T[key][q]) dO[q][n] */
    probe_product_rect(ref, mag, nk, kHS, nq,
                       [&](int i, int n, int q) { return bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n); });
    bad[2] = probe_compare("dV = bf(S^T) dO", g_dv, ref, mag, nk, kHS);
    /* dK[key][n] = sum_q bf(dP^T[key][q]) Q[q][n] */
    probe_product_rect(ref, mag, nk, kHS, nq,
                       [&](int i, int n, int q) { return bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kSlotQ, n); });
    bad[3] = probe_compare("dK = bf(dP^T) Q", g_dk, ref, mag, nk, kHS);
    /* dQ[q][n] = sum_key bf(dP^T[key][q]) K[key][n] over all 128 keys */
    probe_product_rect(ref, mag, nq, kHS, nk,
                       [&](int q, int n, int k) { return bf16_round(g_dpt[k * nq + q]) * probe_qkv(in, k, kSlotK, n); });
    bad[4] = probe_compare("dQ = bf(dP^T)^T K", g_dq, ref, mag, nq, kHS);
    CHECK(bad[0] == 0, "S^T = K Q^T: (a) m64n64k16 SS over 8 k-steps, the chunk jump at k-step 4, K rows at the"
                       " warpgroup's 8 KB offset inside 16 KB chunks, Q chunks 8 KB apart (stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T: (a) with the dout map at HS 128 (column coordinate 64 for chunk 1)");
    CHECK(bad[2] == 0, "dV = bf(S^T) dO: (b) m64n128k16 RS, dO N-major with LBO = 8 KB (one 64-row chunk)");
    CHECK(bad[3] == 0, "dK = bf(dP^T) Q: (b) the Q tile read N-major after being read K-major");
    CHECK(bad[4] == 0, "dQ = bf(dS) K: (c) dS staged from the packed words by both warpgroups, read as 8 k-steps"
                       " of A; (d) K column chunk N-major across its two 64-row boxes");
    free(h); free(ref); free(mag);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}

/* The checks of one child process: the layout probe (child -1) or every shape for one variant. */
static void run_child(int variant) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    require_sm90("hopper_bwd128");
    hang_record_install();
    if (variant < 0) {
        layout_probe();
        return;
    }
    printf("=== variant %s: %s\n", kVariants[variant].name, kVariants[variant].change);
    /* correctness: T = 1, T not a multiple of the tiles (a last key tile with an empty second half), B*NH
       from 1 to 32 */
    const AttnShape shapes[] = {
        {1, 1, 1, 128}, {1, 1, 77, 128}, {1, 2, 128, 128}, {1, 1, 129, 128}, {2, 3, 1000, 128}, {4, 8, 257, 128},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(ATTN_BF16, shapes[i], 1.f, 0, variant);
    const AttnShape sharp = {1, 4, 500, 128};
    check_shape(ATTN_BF16, sharp, 8.f, 0, variant);
    const AttnShape repair_shapes[] = {{1, 1, 77, 128}, {2, 3, 1000, 128}};
    for (size_t i = 0; i < sizeof repair_shapes / sizeof repair_shapes[0]; i++)
        check_shape(ATTN_REPAIR, repair_shapes[i], 1.f, 0, variant);
    /* timing (and checks) at the benchmark shapes of call5's side by side */
    const AttnShape bench[] = {{8, 8, 1024, 128}, {2, 16, 4096, 128}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(ATTN_BF16, bench[i], 1.f, 1, variant);
}

/* The parent never touches CUDA: each child (the probe, then one per variant) gets a fresh context, so a
   fault or a hang report in one costs that child's results only. A child reports its pass/fail counts
   through a pipe; one that dies without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes and variants are fixed in the program", argv[0]);
    printf("hopper_bwd128: the HS-128 wgmma key-major backward (%d variant(s); first run: written without a GPU),"
           " the probe and each variant in its own process\n", kNumVariants);
    int passed = 0, failed = 0;
    for (int child = -1; child < kNumVariants; child++) {
        const char* what = child < 0 ? "the layout probe" : kVariants[child].name;
        int fds[2];
        if (pipe(fds) != 0) die("hopper_bwd128: pipe() failed\n  hint: out of file descriptors?");
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) die("hopper_bwd128: fork() failed\n  hint: out of processes or memory?");
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
