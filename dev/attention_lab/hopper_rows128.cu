/*
 * dev/attention_lab/hopper_rows128.cu - lab of the Hopper (sm_90a) query-major row pass of the backward at
 * head size 128 (gproj: lambda per query and the whole dQ; fp32: D = sum_j P_ij dP_ij), the piece
 * attention/attention_hopper_rows.cu refuses: at HS 128 that pass is still the portable mma.sync
 * attn_bwd_rows_kernel<128, MODE> (attention/attention_cuda.cu). With the HS-128 key-major kernels (bf16:
 * dev/attention_lab/hopper_bwd128.cu, gproj: engineer C's lab) it is what keeps gproj at HS 128 near bf16.
 *
 * STATUS: written 2026-11-29 without a GPU: compiled for sm_90a (ptxas -v below), NEVER RUN. The layout probe
 * runs first; every output is then checked against the portable row pass before anything is timed.
 *
 * What it computes (docs/ATTENTION_NUMERICS.md; attn_bwd_rows_kernel operation for operation, only the FP32
 * sums inside the tensor core may differ in order), per query row i over its visible keys j <= i:
 *   S = Q K^T, dP = dO V^T (FP32, wgmma SS, both K-major, 8 k-steps over the two 64-column chunks of HS);
 *   P_ij = exp2((S_ij - m_i) c) * fl(1 / l_i) from the forward's stats {m, l};
 *   gproj: dS = P (dP - D) (D_i = dO_i . O_i from the portable prep kernel), r_i = sum_j bf(dS_ij),
 *          p_i = sum_j bf(P_ij) (per lane in key order, then the quad: the portable order),
 *          lambda_i = r_i / p_i (0 if p_i = 0); DSK_i = sum_j bf(dS_ij) K_j, PK_i = sum_j bf(P_ij) K_j (wgmma RS
 *          m64n128k16, K read N-major); dQ_i = bf(s * fma(-lambda_i, PK_i, DSK_i)) into the q slot of dqkv;
 *   fp32:  D_i = sum_j P_ij dP_ij (per lane in key order, then the quad).
 * The same workspace slots as the portable pass (carve_workspace: dq_acc [rows HS], D [rows], lambda [rows]).
 *
 * Layout (HS 64's kernel stretched; FlashAttention-3's register split for two math warpgroups): one CTA =
 * 128 query rows of one (b, h), longest rows first (attn_tile_longest_first); warpgroups 0 and 1 consume 64
 * rows each, warpgroup 2 is the producer (one lane issues TMA; setmaxnreg 24 there, 240 in the consumers:
 * 128 * 24 + 256 * 240 = 64512 <= 384 * 168, hopper_bwd128's split, which passed on the H200). Q and dO
 * (128 rows x 2 chunks, 32 KB each) are loaded once; K and V tiles of 128 keys x 2 chunks (32 KB each), two
 * stages, full/empty mbarriers (192 KB + barriers). Each 128-key tile is worked in two 64-key halves:
 *   S, dP of the half (m64n64k16 SS, 32 + 32 regs) -> P, dS in place -> packed BF16 A operands (16 + 16)
 *   -> DSK += bf(dS) K_half, PK += bf(P) K_half (m64n128k16 RS, LBO = one 16 KB chunk; 64 + 64 regs).
 * Peak live: 128 (DSK, PK) + 64 (S, dP) + row state and addresses, under the 240 of setmaxnreg.
 *   ptxas -v (CUDA 13.0, sm_90a, -O3; `make hopper_rows128-regs` prints them again), gproj and fp32: kernel
 *   168 registers at entry (240 after setmaxnreg.inc), 0 B spill, no C75xx warning; layout probe (256
 *   threads, no setmaxnreg) 255 registers, 0 spill.
 *
 * Assumptions NEW here (not covered by a probe that has passed on the H200) and what checks them:
 *   (a) m64n64k16 SS over 8 k-steps with the chunk jump where BOTH operands are 64-row slices (8 KB offset)
 *       of 128-row tiles with 16 KB chunks (hopper_bwd128 proved A at that offset, B in 8 KB chunks) - probe
 *       S (Q, K), dP (dO, V);
 *   (b) m64n128k16 RS with K N-major starting 64 rows (8 KB) into a 128-row tile, LBO 16 KB (the forward's
 *       P V at HS 128 starts at row 0) - probe bf(S) K, bf(dP) K over both halves;
 *   (c) the K/V tiles in stage 1 (32 KB offsets) - the probe loads them there;
 *   (d) setmaxnreg 24 / 240 with 256 consumer threads, as hopper_bwd128 (passed there): a wrong split hangs
 *       or faults at the first launch (the shape checks; each group in its own process).
 *
 * Safety: every mbarrier wait is bounded (~2 s of clock64) and then gives up (dev/attention_lab/
 * hopper_lab_hang.cuh: host-mapped record naming the barrier, CTA abort flag); no __trap() (it makes ptxas
 * ignore setmaxnreg). The probe, the gproj checks, the fp32 checks and the timing run in four processes
 * (the parent never touches CUDA), so a fault costs one group's lines. Run under `timeout`.
 *
 * Reference: attention_backward_cuda with force_portable = 1 (the portable prep + attn_bwd_rows_kernel<128,
 * MODE> + key-major kernel) on the same inputs; its workspace gives D (fp32: the row pass's; gproj: the
 * prep's, which this row pass then reads) and lambda; its dqkv's q slot gives gproj's dQ. Timing: the
 * portable backward captured into a CUDA graph, each of its kernel nodes re-instantiated as a graph of its
 * own (cudaGraphKernelNodeGetParams), so the portable row pass is timed alone, next to this one.
 *
 * Not done: overlap of one half's DSK/PK GEMMs with the next half's S/dP; 3 stages; D fused in; the move
 * into attention/ (a production hook: attention_hopper_rows_supports would accept HS 128 and dispatch here).
 *
 * Usage: hopper_rows128   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
 * summed over the processes; a process that dies without reporting counts as one failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <type_traits>
#include <unistd.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/attn_cases.h"
#include "attention/hopper_wgmma.cuh"
#include "attention/tile_order.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"
#include "dev/attention_lab/hopper_lab_hang.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = 128;                /* the head size of this lab */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row (one TMA box width) */
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockQ = 128;            /* query rows per CTA */
constexpr int kBlockK = 128;            /* keys per K/V tile (= TMA box rows) */
constexpr int kWarpgroupRows = 64;      /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockQ / kWarpgroupRows;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
constexpr int kProducerRegs = 24;       /* setmaxnreg split (__launch_bounds__(384, 1): every thread starts at 168) */
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* K/V double buffering */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes per 128-byte row */
constexpr int kHsSteps = kHS / kWgmmaK;  /* k-steps of S, dP (8) */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO */
/* The S/dP GEMMs and the P/dS work run over 64-key halves of each 128-key tile (the HS-64 kernel's split,
   here forced: DSK + PK alone are 128 registers) */
constexpr int kSubKeys = 64;
constexpr int kSubTiles = kBlockK / kSubKeys;
constexpr int kSRegs = kSubKeys / 2;    /* S or dP accumulator: 64 x kSubKeys FP32 over 128 threads */
constexpr int kDqRegs = kHS / 2;        /* DSK or PK accumulator: 64 x HS */
constexpr int kKeySteps = kSubKeys / kWgmmaK; /* k-steps of the DSK/PK GEMMs per half (16 keys each) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "one box shape serves Q, dO, K and V tiles; only the last key tile is diagonal");
static_assert(kKeySteps == kTileKSteps, "hopper_wgmma.cuh's pack_acc_a_operand packs a 64 x 64 accumulator");
/* which mbarrier a bounded wait gave up on (hopper_lab_hang.cuh's sites, named for this kernel below) */
constexpr HangSite kHangQdo = kHangKvFull;  /* q_full: Q and dO, loaded once */
constexpr HangSite kHangKv = kHangFull;     /* full[s]: the K/V tiles of stage s */

/* Shared-memory plan (byte offsets from a 1024-byte aligned base). A tile is 128 rows x 128 columns = two
   chunks of [128 rows][128 bytes], swizzled: column chunk c at c * kChunkBytes; a warpgroup's or half's 64
   rows start kSliceBytes into each chunk. */
struct SmemPlan {
    static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes; /* 16 KB */
    static constexpr int kSliceBytes = 64 * kSwizzleRowBytes;      /* 8 KB: 64 rows of one chunk */
    static constexpr int kTileBytes = kChunks * kChunkBytes;       /* 32 KB */
    static constexpr int kQ = 0;
    static constexpr int kDO = kQ + kTileBytes;
    static constexpr int kK = kDO + kTileBytes;          /* kStages tiles */
    static constexpr int kV = kK + kStages * kTileBytes; /* kStages tiles */
    static constexpr int kBarriers = kV + kStages * kTileBytes;
    static constexpr int kNumBarriers = 1 + 2 * kStages; /* q_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kSliceBytes % kSwizzleAtomBytes == 0 && kChunkBytes % kSwizzleAtomBytes == 0, "1024-aligned");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* ---- the GEMMs of one 64-key half, per warpgroup (shared by the kernel and the layout probe) ---- */

/* acc += A B^T issued (64 x 64 over HS: 8 k-steps; the caller zeroes, fences, commits, waits): A the
   warpgroup's 64 rows of Q or dO, B the half's 64 keys of K or V, both K-major slices of 128-row tiles whose
   chunks are kChunkBytes apart; k-step kk reads bytes 32 (kk % 4) of the rows of chunk kk / 4 (assumption (a)). */
__device__ __forceinline__ void warpgroup_ss_issue(float (&acc)[kSRegs], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < kHsSteps; kk++) {
        const uint32_t off = (kk / kKStepsPerChunk) * SmemPlan::kChunkBytes +
                             (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n64k16_ss(acc, make_smem_desc(a_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                           make_smem_desc(b_addr + off, kUnusedLbo, kSwizzleAtomBytes));
    }
}

/* S = Q_w K_h^T and dP = dO_w V_h^T (64 rows x 64 keys each) as one commit group, waited for. Written. */
__device__ __forceinline__ void warpgroup_scores(float (&s)[kSRegs], float (&dp)[kSRegs], uint32_t q_addr,
                                                 uint32_t k_addr, uint32_t do_addr, uint32_t v_addr) {
#pragma unroll
    for (int i = 0; i < kSRegs; i++) s[i] = dp[i] = 0.f;
    reg_fence(s); /* keeps the zeroing above the fence */
    reg_fence(dp);
    wgmma_fence();
    warpgroup_ss_issue(s, q_addr, k_addr);
    warpgroup_ss_issue(dp, do_addr, v_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    reg_fence(dp);
}

/* DSK += bf(dS) K_h and PK += bf(P) K_h over one half: 4 k-steps of 16 keys, K_h read N-major (the head dim,
   N = 128, contiguous within a chunk; the second 64-column block of N is one chunk further: LBO = 16 KB;
   16 keys = 2048 bytes per k-step; assumption (b)). Fenced, committed and waited for here. */
__device__ __forceinline__ void warpgroup_rs_k(float (&dsk)[kDqRegs], float (&pk)[kDqRegs],
                                               uint32_t (&dsa)[kKeySteps][4], uint32_t (&pa)[kKeySteps][4],
                                               uint32_t k_half_addr) {
    reg_fence(dsa);
    reg_fence(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeySteps; kk++) {
        const uint64_t desc = make_smem_desc(k_half_addr + kk * kWgmmaK * kSwizzleRowBytes, SmemPlan::kChunkBytes,
                                             kSwizzleAtomBytes);
        wgmma_m64n128k16_rs(dsk, dsa[kk], desc);
        wgmma_m64n128k16_rs(pk, pa[kk], desc);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dsk);
    reg_fence(pk);
    reg_fence(dsa); /* keeps the A registers live (unchanged) until the wgmmas that read them are done */
    reg_fence(pa);
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* The row pass. MODE: ATTN_GPROJ (reads D; writes lambda, dQ) or ATTN_FP32 (writes D = sum P dP). */
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_rows128_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                          const float* __restrict__ stats, float* __restrict__ D, float* __restrict__ lambda,
                          bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    static_assert(MODE == ATTN_GPROJ || MODE == ATTN_FP32, "row pass exists for gproj and fp32 only");
    constexpr bool kGproj = (MODE == ATTN_GPROJ);
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = q_full + 1;
    uint64_t* empty = full + kStages;
    __shared__ int cta_abort; /* set by a bounded wait that gave up (mbar_wait_bounded) */

    const AttnTileOrder order = attn_tile_longest_first(); /* longest rows first, over all heads */
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int q0 = q_tile * kBlockQ;
    const int n_key_tiles = (min(q0 + kBlockQ, T) - 1) / kBlockK + 1; /* = q_tile + 1 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        cta_abort = 0;
        init_pipeline_barriers<kStages>(q_full, full, empty, 1, kConsumerThreads);
    }
    __syncthreads();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        /* ---- producer: lane 0 of its first warp issues every copy; the other 127 threads have no work ---- */
        if (warp == kConsumerThreads / 32 && lane == 0) {
            mbar_arrive_expect_tx(q_full, 2 * Plan::kTileBytes);
            for (int ch = 0; ch < kChunks; ch++) {
                tma_load_4d(q_s + ch * Plan::kChunkBytes, &qkv_map, q_full, ch * kChunkCols, kSlotQ * NH + h, q0, b);
                tma_load_4d(do_s + ch * Plan::kChunkBytes, &dout_map, q_full, ch * kChunkCols, h, q0, b);
            }
            for (int kt = 0; kt < n_key_tiles; kt++) {
                const int s = kt % kStages;
                /* reuse of stage s: its release for tile kt - kStages completed phase kt / kStages - 1 */
                if (kt >= kStages)
                    mbar_wait_bounded(&empty[s], (uint32_t)((kt / kStages - 1) & 1), kHangEmpty, s, &cta_abort);
                mbar_arrive_expect_tx(&full[s], 2 * Plan::kTileBytes);
                for (int ch = 0; ch < kChunks; ch++) {
                    const int dst = s * Plan::kTileBytes + ch * Plan::kChunkBytes;
                    tma_load_4d(k_s + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotK * NH + h, kt * kBlockK, b);
                    tma_load_4d(v_s + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotV * NH + h, kt * kBlockK, b);
                }
            }
        }
        return; /* no block-wide barrier follows */
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns query rows q0 + 64 wg .. +63; this thread rows row0, row0 + 8 ---- */
    const int wg = warpgroup, g = lane >> 2, t = lane & 3;
    const int row0 = q0 + wg * kWarpgroupRows + (warp % 4) * 16 + g;
    float row_m[2], row_rl[2], row_D[2]; /* m, fl(1 / l), D (gproj) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int query = row0 + 8 * r;
        const long long idx = (long long)bh * T + (query < T ? query : 0); /* rows past T: any finite state */
        row_m[r] = stats[idx * 2];
        row_rl[r] = __frcp_rn(stats[idx * 2 + 1]);
        row_D[r] = kGproj ? D[idx] : 0.f;
    }
    float acc_a[2] = {0.f, 0.f}; /* gproj: r = sum bf(dS); fp32: sum P dP (this lane's keys, in key order) */
    float acc_b[2] = {0.f, 0.f}; /* gproj: p = sum bf(P) */
    float dsk[kDqRegs], pk[kDqRegs];
    if constexpr (kGproj) {
#pragma unroll
        for (int i = 0; i < kDqRegs; i++) dsk[i] = pk[i] = 0.f;
        reg_fence(dsk); /* the zeroing before any wgmma fence */
        reg_fence(pk);
    }

    const uint32_t wg_rows = wg * Plan::kSliceBytes; /* 8 KB into each chunk: stays 1024-aligned */
    const uint32_t q_addr = smem_u32(q_s) + wg_rows, do_addr = smem_u32(do_s) + wg_rows;
    mbar_wait_bounded(q_full, 0, kHangQdo, 0, &cta_abort);
    __syncwarp(); /* lanes leave the polling loop at different times: reconverge for the .aligned wgmma */

    for (int kt = 0; kt < n_key_tiles; kt++) {
        const int s = kt % kStages;
        mbar_wait_bounded(&full[s], (uint32_t)((kt / kStages) & 1), kHangKv, s, &cta_abort);
        __syncwarp();
        const uint32_t k_addr = smem_u32(k_s + s * Plan::kTileBytes), v_addr = smem_u32(v_s + s * Plan::kTileBytes);

        /* the mask only where it can bite (the diagonal tile, or a query tile that reaches past T) */
        const bool tile_masked = !(kt < n_key_tiles - 1 && q0 + kBlockQ <= T);
#pragma unroll 1
        for (int sub = 0; sub < kSubTiles; sub++) {
            const uint32_t k_half = k_addr + sub * Plan::kSliceBytes;
            float sacc[kSRegs], dpacc[kSRegs];
            warpgroup_scores(sacc, dpacc, q_addr, k_half, do_addr, v_addr + sub * Plan::kSliceBytes);

            /* P, dS and the row sums (each lane its keys in increasing order, as the portable pass); masked
               entries are exactly 0 in both GEMM operands */
            auto row_sums = [&](auto masked_tag) {
                constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
                for (int j = 0; j < kSubKeys / 8; j++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int i = 4 * j + 2 * r + e;
                            const int key = kt * kBlockK + sub * kSubKeys + 8 * j + 2 * t + e, query = row0 + 8 * r;
                            float p = 0.f, ds = 0.f;
                            if (!kMasked || (key <= query && query < T)) {
                                p = exp2f((sacc[i] - row_m[r]) * c) * row_rl[r]; /* the forward's exponent */
                                const float dpv = dpacc[i];
                                if (kGproj) {
                                    ds = p * (dpv - row_D[r]);
                                    acc_a[r] += __bfloat162float(__float2bfloat16_rn(ds));
                                    acc_b[r] += __bfloat162float(__float2bfloat16_rn(p));
                                } else {
                                    acc_a[r] += p * dpv;
                                }
                            }
                            sacc[i] = p;
                            dpacc[i] = ds;
                        }
            };
            if (tile_masked) row_sums(std::true_type{});
            else row_sums(std::false_type{});

            if constexpr (kGproj) {
                uint32_t pa[kKeySteps][4], dsa[kKeySteps][4];
                pack_acc_a_operand(pa, sacc);
                pack_acc_a_operand(dsa, dpacc);
                warpgroup_rs_k(dsk, pk, dsa, pa, k_half);
            }
        }
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s */
    }

    float row_lambda[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float a = quad_sum(acc_a[r]); /* every lane of the quad gets the whole-row sums */
        const float p = quad_sum(acc_b[r]);
        row_lambda[r] = (p != 0.f) ? __fdiv_rn(a, p) : 0.f;
        const int query = row0 + 8 * r;
        if (t != 0 || query >= T) continue;
        const long long idx = (long long)bh * T + query;
        if (kGproj) lambda[idx] = row_lambda[r];
        else D[idx] = a;
    }
    if constexpr (kGproj) {
        /* dQ_i = bf(s * (DSK_i - lambda_i PK_i)), one FP32 fma per element, into the q slot of dqkv */
        const long long qkv_row = 3LL * NH * kHS;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lam = row_lambda[r];
            const int query = row0 + 8 * r;
            if (query >= T) continue;
            bf16* dq_row = dqkv + ((long long)b * T + query) * qkv_row + (long long)h * kHS + 2 * t;
#pragma unroll
            for (int n = 0; n < kHS / 8; n++) {
                const float v0 = __fmaf_rn(-lam, pk[4 * n + 2 * r], dsk[4 * n + 2 * r]);
                const float v1 = __fmaf_rn(-lam, pk[4 * n + 2 * r + 1], dsk[4 * n + 2 * r + 1]);
                *reinterpret_cast<uint32_t*>(dq_row + 8 * n) = pack_bf16x2(v0 * scale, v1 * scale);
            }
        }
    }
}

/* Layout probe: the two consumer warpgroups (256 threads, no setmaxnreg), at batch 0, head `head`: Q, dO
   tokens 0..127 and K, V tokens 0..127 loaded into STAGE 1 (assumption (c)); then, through the kernel's own
   helpers, for both 64-key halves: S = Q K_h^T and dP = dO V_h^T (a), written out, and X += bf(S) K_h,
   Y += bf(dP) K_h (b) accumulated over the halves. Outputs [128 rows][128] FP32 row-major each. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ s_out, float* __restrict__ dp_out,
                        float* __restrict__ x_out, float* __restrict__ y_out) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    unsigned char* k_t = smem + Plan::kK + Plan::kTileBytes; /* stage 1 */
    unsigned char* v_t = smem + Plan::kV + Plan::kTileBytes; /* stage 1 */
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 4 * Plan::kTileBytes);
        for (int ch = 0; ch < kChunks; ch++) {
            const int dst = ch * Plan::kChunkBytes;
            tma_load_4d(q_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotQ * NH + head, 0, 0);
            tma_load_4d(do_s + dst, &dout_map, bar, ch * kChunkCols, head, 0, 0);
            tma_load_4d(k_t + dst, &qkv_map, bar, ch * kChunkCols, kSlotK * NH + head, 0, 0);
            tma_load_4d(v_t + dst, &qkv_map, bar, ch * kChunkCols, kSlotV * NH + head, 0, 0);
        }
    }
    mbar_wait_bounded(bar, 0, kHangProbe, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    const uint32_t wg_rows = wg * Plan::kSliceBytes;
    float x[kDqRegs], y[kDqRegs];
#pragma unroll
    for (int i = 0; i < kDqRegs; i++) x[i] = y[i] = 0.f;
    reg_fence(x);
    reg_fence(y);
#pragma unroll 1
    for (int sub = 0; sub < kSubTiles; sub++) {
        const uint32_t k_half = smem_u32(k_t) + sub * Plan::kSliceBytes;
        float sacc[kSRegs], dpacc[kSRegs];
        warpgroup_scores(sacc, dpacc, smem_u32(q_s) + wg_rows, k_half, smem_u32(do_s) + wg_rows,
                         smem_u32(v_t) + sub * Plan::kSliceBytes);
#pragma unroll
        for (int j = 0; j < kSubKeys / 8; j++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = sub * kSubKeys + 8 * j + 2 * t + e;
                    s_out[(row0 + 8 * r) * kBlockK + col] = sacc[4 * j + 2 * r + e];
                    dp_out[(row0 + 8 * r) * kBlockK + col] = dpacc[4 * j + 2 * r + e];
                }
        uint32_t sa[kKeySteps][4], dpa[kKeySteps][4];
        pack_acc_a_operand(sa, sacc);
        pack_acc_a_operand(dpa, dpacc);
        warpgroup_rs_k(y, x, dpa, sa, k_half); /* the kernel's call: (DSK, PK) <- (bf(dP) K, bf(S) K) */
    }
#pragma unroll
    for (int n = 0; n < kHS / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                x_out[(row0 + 8 * r) * kHS + 8 * n + 2 * t + e] = x[4 * n + 2 * r + e];
                y_out[(row0 + 8 * r) * kHS + 8 * n + 2 * t + e] = y[4 * n + 2 * r + e];
            }
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

}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch, hang reports                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* hopper_wgmma.cuh's 4-D BF16 tensor map {HS, heads, T, B}: boxes of 64 columns x 128 tokens (column chunk c
   at coordinate 64 c), 128-byte swizzle, zeros outside. qkv: heads = 3 NH; dout: heads = NH. */
static CUtensorMap make_map(const bf16* base, AttnShape s, int heads, const char* what) {
    static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
    return encode_head_map(base, s, heads, kBlockK, "hopper_rows128", what);
}

/* The row pass of one shape: maps encoded once (the pointers are in them), launched as often as wanted. */
struct Rows128 {
    AttnShape shape;
    AttnMode mode;
    CUtensorMap qkv_map, dout_map;
};
static Rows128 rows128_prepare(AttnMode mode, AttnShape s, const bf16* qkv, const bf16* dout) {
    attention_cuda_check_shape(s, mode);
    if (s.HS != kHS) die("hopper_rows128: head size %d is not this lab's (B=%d NH=%d T=%d)\n"
                         "  hint: HS 64 runs attention/attention_hopper_rows.cu", s.HS, s.B, s.NH, s.T);
    if (mode != ATTN_GPROJ && mode != ATTN_FP32)
        die("hopper_rows128: mode %s has no row pass\n  hint: gproj or fp32", attn_mode_name(mode));
    cudaCheck(cudaFuncSetAttribute(hopper_rows128_kernel<ATTN_GPROJ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(hopper_rows128_kernel<ATTN_FP32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    Rows128 r;
    r.shape = s;
    r.mode = mode;
    r.qkv_map = make_map(qkv, s, 3 * s.NH, "qkv");
    r.dout_map = make_map(dout, s, s.NH, "dout");
    return r;
}
/* gproj: reads D, writes lambda and the q slot of dqkv; fp32: writes D. */
static void rows128_launch(const Rows128& r, const float* stats, float* D, float* lambda, bf16* dqkv,
                           cudaStream_t stream) {
    const AttnShape s = r.shape;
    const dim3 grid((unsigned)ceil_div(s.T, kBlockQ), (unsigned)(s.B * s.NH));
    const float scale = attn_softmax_scale(kHS), c = attn_exp2_scale(kHS);
    if (r.mode == ATTN_GPROJ)
        hopper_rows128_kernel<ATTN_GPROJ><<<grid, kThreads, SmemPlan::kAlloc, stream>>>(
            r.qkv_map, r.dout_map, stats, D, lambda, dqkv, s.NH, s.T, scale, c);
    else
        hopper_rows128_kernel<ATTN_FP32><<<grid, kThreads, SmemPlan::kAlloc, stream>>>(
            r.qkv_map, r.dout_map, stats, D, lambda, dqkv, s.NH, s.T, scale, c);
    cudaCheckLastError();
}

/* This kernel's names for hopper_lab_hang.cuh's sites. */
static const char* rows128_site_name(int site) {
    switch (site) {
        case kHangQdo: return "q_full (Q and dO, loaded once)";
        case kHangKv: return "full (K/V tiles of a stage)";
        case kHangEmpty: return "empty (stage released by the consumers)";
        case kHangProbe: return "probe tiles";
        default: return "unknown";
    }
}
/* cudaDeviceSynchronize (or an event wait) that names the barrier that hung, if one did, and stops. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile HangRecord* r = g_hang_host;
    const int hung = r != NULL && r->site > kHangNone && r->site <= kHangProbe;
    if (e == cudaSuccess && !hung) return;
    if (hung) {
        fprintf(stderr, "hopper_rows128: HANG: mbarrier %s, index %d, parity %d, block (%d, %d), thread %d"
                " (the CTA gave up waiting and ran on: its results are garbage)\n",
                rows128_site_name(r->site), r->index, r->parity, r->block_x, r->block_y, r->thread);
        printf("  FAIL HANG in %s: mbarrier %s never completed\n", where, rows128_site_name(r->site));
        fflush(stdout);
    }
    die("hopper_rows128: %s after %s%s%s\n  hint: a HANG line names the mbarrier that never completed (a pipeline"
        " protocol bug); otherwise run under compute-sanitizer",
        hung ? "a hung mbarrier" : "a CUDA error", where, e != cudaSuccess ? ": " : "",
        e != cudaSuccess ? cudaGetErrorString(e) : "");
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the portable row pass                                                       */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerances, set before any run. Expected: bit-equal D (fp32), lambda and dQ, as the HS-64 row pass was on
   the H200 (dev/results/device_s4/call2: same per-lane key order, same rounding points; the tensor core's
   k-step sums came out equal there). Checked separately, so a miss there and a pass of the tolerances below
   reads as "order-level difference", not a layout error:
   dQ within 8 BF16 ulps of the row scale (the row RMS as the floor); lambda within 16 u, median 1e-2 u
   (u = 2^-9 sigma_dP, sigma_dP = sqrt(HS) rms(dO) rms(V): one flipped BF16 rounding of dS moves lambda by up
   to 2^-8 |dS| / p); fp32 D within 1e-5 sigma_dP. */
static const double kMaxDqUlps = 8.0;
static const double kMaxLambdaUnits = 16.0;
static const double kMedLambdaUnits = 1e-2;
static const double kMaxDRel = 1e-5;

struct CheckInputs {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

/* The portable backward's workspace layout (carve_workspace in attention/attention_cuda.cu, internal there):
   dq_acc [rows * HS] fp32, then D [rows], then lambda [rows]; rows = B*NH*T, row (b*NH + h)*T + t. */
static size_t rows_of(AttnShape s) { return (size_t)s.B * s.NH * s.T; }
static float* ws_D(AttnShape s, void* ws) { return static_cast<float*>(ws) + rows_of(s) * s.HS; }
static float* ws_lambda(AttnShape s, void* ws) { return ws_D(s, ws) + rows_of(s); }

static double median_d(double* v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof(double), [](const void* a, const void* b) {
        const double x = *(const double*)a, y = *(const double*)b;
        return (x > y) - (x < y);
    });
    return v[n / 2];
}

/* Compares n FP32 row values (D or lambda) of the reference and this kernel: NaNs, rows not bit-equal,
   median and max |diff| in `unit`. */
struct RowDiff {
    size_t nan_ref, nan_new, unequal;
    double med_units, max_units;
};
static RowDiff compare_rows(const float* ref, const float* got, size_t n, double unit) {
    RowDiff d = {0, 0, 0, 0.0, 0.0};
    double* units = (double*)mallocCheck(n * sizeof(double));
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i])) d.nan_ref++;
        if (isnan(got[i])) d.nan_new++;
        if (isnan(ref[i]) || isnan(got[i])) continue;
        if (ref[i] != got[i]) d.unequal++;
        units[m] = fabs((double)ref[i] - got[i]) / unit;
        d.max_units = fmax(d.max_units, units[m]);
        m++;
    }
    d.med_units = median_d(units, m);
    free(units);
    return d;
}

/* The portable backward's kernels, one graph each: attention_backward_cuda (force_portable) captured on a
   stream, every kernel node copied into a graph of its own, so each (the row pass above all) can be timed
   alone. Names from cudaFuncGetName. */
struct PortableKernels {
    enum { kMax = 8 };
    int n;
    const char* name[kMax];
    cudaGraphExec_t exec[kMax];
    cudaGraph_t captured;
};
static PortableKernels capture_portable(AttnMode mode, AttnShape s, const bf16* qkv, const bf16* out,
                                        const float* stats, const bf16* dout, bf16* dqkv, void* ws,
                                        cudaStream_t stream) {
    PortableKernels k;
    memset(&k, 0, sizeof k);
    AttnOptions portable = {0};
    portable.force_portable = 1;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv, ws, stream);
    cudaCheck(cudaStreamEndCapture(stream, &k.captured));
    size_t n_nodes = 0;
    cudaCheck(cudaGraphGetNodes(k.captured, NULL, &n_nodes));
    cudaGraphNode_t* nodes = (cudaGraphNode_t*)mallocCheck((n_nodes ? n_nodes : 1) * sizeof(cudaGraphNode_t));
    cudaCheck(cudaGraphGetNodes(k.captured, nodes, &n_nodes));
    for (size_t i = 0; i < n_nodes && k.n < PortableKernels::kMax; i++) {
        cudaGraphNodeType type;
        cudaCheck(cudaGraphNodeGetType(nodes[i], &type));
        if (type != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeParams p;
        cudaCheck(cudaGraphKernelNodeGetParams(nodes[i], &p));
        cudaGraph_t one;
        cudaGraphNode_t copy;
        cudaCheck(cudaGraphCreate(&one, 0));
        cudaCheck(cudaGraphAddKernelNode(&copy, one, NULL, 0, &p));
        cudaCheck(cudaGraphInstantiate(&k.exec[k.n], one, 0));
        cudaCheck(cudaGraphDestroy(one));
        const char* name = NULL;
        if (cudaFuncGetName(&name, p.func) != cudaSuccess || name == NULL) {
            (void)cudaGetLastError(); /* clear it: a later cudaCheckLastError would take it for a launch error */
            name = "?";
        }
        k.name[k.n++] = name;
    }
    free(nodes);
    return k;
}

/* One shape and mode: forward (portable), the portable backward (reference: D, lambda from its workspace,
   dQ from its dqkv) and this row pass on the same inputs (gproj: reading the reference's D; outputs
   poisoned with NaN first), compared; with time_it, the row pass timed against the portable one. */
static void check_shape(CheckInputs in, AttnMode mode, int time_it) {
    const AttnShape s = in.s;
    char title[256];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d q x%g key offset %g: HS-128 Hopper row pass vs the portable one",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s), rows = rows_of(s);
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; the layout this lab assumes)",
          ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);
    /* the scale of dP - D: sigma_dp = sqrt(HS) rms(dO) rms(V) */
    double sq_do = 0, sq_v = 0;
    const size_t row = 3ull * s.NH * s.HS;
    for (size_t i = 0; i < nqkv; i++) {
        const int slot = (int)((i % row) / ((size_t)s.NH * s.HS));
        if (slot == kSlotV) sq_v += (double)bf16_bits_to_float(h_qkv[i]) * bf16_bits_to_float(h_qkv[i]);
    }
    for (size_t i = 0; i < nout; i++) sq_do += (double)bf16_bits_to_float(h_dout[i]) * bf16_bits_to_float(h_dout[i]);
    const double sigma_dp = sqrt((double)s.HS) * sqrt(sq_do / nout) * sqrt(sq_v / nout);
    const double lambda_unit = ldexp(sigma_dp, -9);

    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_new;
    float *stats, *d_new, *lambda_new;
    void* ws_ref;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&d_new, rows * 4);
    lab_alloc_poisoned(&lambda_new, rows * 4);
    AttnOptions portable = {0};
    portable.force_portable = 1;
    attention_forward_cuda(mode, portable, s, qkv, out, stats, NULL, 0);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
    const Rows128 rp = rows128_prepare(mode, s, qkv, dout);
    /* gproj reads the prep kernel's D from the reference workspace; fp32 writes its own D */
    float* D_in = (mode == ATTN_GPROJ) ? ws_D(s, ws_ref) : d_new;
    rows128_launch(rp, stats, D_in, lambda_new, dqkv_new, 0);
    sync_or_report(cudaDeviceSynchronize(), title);

    if (mode == ATTN_FP32) {
        float* h_ref = (float*)mallocCheck(rows * 4);
        float* h_new = (float*)mallocCheck(rows * 4);
        cudaCheck(cudaMemcpy(h_ref, ws_D(s, ws_ref), rows * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(h_new, d_new, rows * 4, cudaMemcpyDeviceToHost));
        const RowDiff d = compare_rows(h_ref, h_new, rows, sigma_dp);
        printf("  D = sum P dP: %zu of %zu rows not bit-equal; |diff| / sigma_dP (%.3g): median %.3g, max %.3g\n",
               d.unequal, rows, sigma_dp, d.med_units, d.max_units);
        CHECK(d.nan_ref == 0, "portable row pass wrote D at workspace + rows*HS floats, finite (%zu NaN)", d.nan_ref);
        CHECK(d.nan_new == 0, "HS-128 row pass wrote every D, finite (%zu NaN left)", d.nan_new);
        CHECK(d.max_units <= kMaxDRel, "D within %.0e sigma_dP of the portable row pass (max %.3g)", kMaxDRel,
              d.max_units);
        CHECK(d.unequal == 0, "D bit-equal to the portable row pass, as at HS 64 (%zu rows differ)", d.unequal);
        free(h_ref); free(h_new);
    } else {
        float* h_ref = (float*)mallocCheck(rows * 4);
        float* h_new = (float*)mallocCheck(rows * 4);
        cudaCheck(cudaMemcpy(h_ref, ws_lambda(s, ws_ref), rows * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(h_new, lambda_new, rows * 4, cudaMemcpyDeviceToHost));
        const RowDiff d = compare_rows(h_ref, h_new, rows, lambda_unit);
        printf("  lambda: %zu of %zu rows not bit-equal; |diff| in u = 2^-9 sigma_dP (%.3g): median %.3g, max %.3g\n",
               d.unequal, rows, lambda_unit, d.med_units, d.max_units);
        CHECK(d.nan_ref == 0, "portable row pass wrote lambda at workspace + rows*(HS+1) floats (%zu NaN)", d.nan_ref);
        CHECK(d.nan_new == 0, "HS-128 row pass wrote every lambda, finite (%zu NaN left)", d.nan_new);
        CHECK(d.med_units <= kMedLambdaUnits, "lambda: median |diff| <= %.0e u (%.3g)", kMedLambdaUnits, d.med_units);
        CHECK(d.max_units <= kMaxLambdaUnits, "lambda: max |diff| <= %.0f u (%.3g)", kMaxLambdaUnits, d.max_units);
        CHECK(d.unequal == 0, "lambda bit-equal to the portable row pass, as at HS 64 (%zu rows differ)", d.unequal);
        free(h_ref); free(h_new);

        uint16_t* q_ref = (uint16_t*)mallocCheck(nqkv * 2);
        uint16_t* q_new = (uint16_t*)mallocCheck(nqkv * 2);
        cudaCheck(cudaMemcpy(q_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(q_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        const SlotDiff q = compare_slot(q_ref, q_new, s, kSlotQ);
        printf("  dQ: %zu of %zu not bit-equal; max |diff| %.3g, max %.2f BF16 ulps (at max(|a|, |b|, row RMS)),"
               " %zu over 1 ulp\n", q.unequal, q.count, q.max_abs, q.max_ulps, q.over_1ulp);
        CHECK(q.nan_ref == 0, "portable path wrote every dQ, finite (%zu NaN)", q.nan_ref);
        CHECK(q.nan_new == 0, "HS-128 row pass wrote every dQ, finite (%zu NaN left)", q.nan_new);
        CHECK(q.max_ulps <= kMaxDqUlps, "dQ within %.0f BF16 ulps of the portable row pass (max %.2f)", kMaxDqUlps,
              q.max_ulps);
        CHECK(q.unequal == 0, "dQ bit-equal to the portable row pass, as at HS 64 (%zu differ)", q.unequal);
        free(q_ref); free(q_new);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaStream_t st;
        cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        PortableKernels pk = capture_portable(mode, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
        int rows_node = -1;
        for (int i = 0; i < pk.n; i++)
            if (strstr(pk.name[i], "attn_bwd_rows_kernel") != NULL) rows_node = i;
        CHECK(rows_node >= 0, "the captured portable backward has an attn_bwd_rows_kernel node (%d kernel nodes)", pk.n);
        /* interleaved: every portable kernel alone, then this row pass, per repetition */
        enum { kMaxTimed = PortableKernels::kMax + 1 };
        float times[kMaxTimed][kReps];
        cudaEvent_t ev[kMaxTimed][kReps][2];
        for (int k = 0; k <= pk.n; k++)
            for (int r = 0; r < kReps; r++) {
                cudaCheck(cudaEventCreate(&ev[k][r][0]));
                cudaCheck(cudaEventCreate(&ev[k][r][1]));
            }
        float* D_time = (mode == ATTN_GPROJ) ? ws_D(s, ws_ref) : d_new;
        for (int i = 0; i < kWarmup; i++) {
            for (int k = 0; k < pk.n; k++) cudaCheck(cudaGraphLaunch(pk.exec[k], st));
            rows128_launch(rp, stats, D_time, lambda_new, dqkv_new, st);
        }
        sync_or_report(cudaStreamSynchronize(st), "the warm-up launches");
        /* 2 ms plus 100 us per launch: longer than queueing them takes */
        spin_for_ns<<<1, 1, 0, st>>>(2000000ull + 100000ull * kReps * (pk.n + 1));
        cudaCheckLastError();
        for (int r = 0; r < kReps; r++) {
            for (int k = 0; k < pk.n; k++) {
                cudaCheck(cudaEventRecord(ev[k][r][0], st));
                cudaCheck(cudaGraphLaunch(pk.exec[k], st));
                cudaCheck(cudaEventRecord(ev[k][r][1], st));
            }
            cudaCheck(cudaEventRecord(ev[pk.n][r][0], st));
            rows128_launch(rp, stats, D_time, lambda_new, dqkv_new, st);
            cudaCheck(cudaEventRecord(ev[pk.n][r][1], st));
        }
        sync_or_report(cudaStreamSynchronize(st), "the timed launches");
        float med[kMaxTimed];
        for (int k = 0; k <= pk.n; k++) {
            for (int r = 0; r < kReps; r++) cudaCheck(cudaEventElapsedTime(&times[k][r], ev[k][r][0], ev[k][r][1]));
            med[k] = median_ms(times[k], kReps);
            for (int r = 0; r < kReps; r++) {
                cudaCheck(cudaEventDestroy(ev[k][r][0]));
                cudaCheck(cudaEventDestroy(ev[k][r][1]));
            }
        }
        const int n_gemms = (mode == ATTN_GPROJ) ? 4 : 2; /* S, dP (+ DSK, PK) */
        const double flops = n_gemms * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2; /* causal */
        float portable_total = 0;
        printf("  time (median of %d, warm inputs, launches queued behind a spin), the portable backward's kernels"
               " alone (graph nodes):\n", (int)kReps);
        for (int k = 0; k < pk.n; k++) {
            printf("    %.4f ms  %s\n", med[k], pk.name[k]);
            portable_total += med[k];
        }
        if (rows_node >= 0) {
            const float ms_old = med[rows_node], ms_new = med[pk.n];
            printf("  time: row pass portable %.4f ms = %.1f TFLOP/s; HS-128 Hopper %.4f ms = %.1f TFLOP/s (%d GEMMs,"
                   " causal); speed-up %.2fx; the portable backward's kernels %.4f ms -> %.4f ms with this row pass"
                   " in its place\n", ms_old, flops / ms_old * 1e-9, ms_new, flops / ms_new * 1e-9, n_gemms,
                   ms_old / ms_new, portable_total, portable_total - ms_old + ms_new);
        }
        for (int k = 0; k < pk.n; k++) cudaCheck(cudaGraphExecDestroy(pk.exec[k]));
        cudaCheck(cudaGraphDestroy(pk.captured));
        cudaCheck(cudaStreamDestroy(st));
    }
    free(h_qkv); free(h_dout);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(ws_ref));
    cudaCheck(cudaFree(d_new)); cudaCheck(cudaFree(lambda_new));
}

/* ------------------------------------------------------------------------------------------------ */
/* host: the layout probe                                                                            */
/* ------------------------------------------------------------------------------------------------ */

/* Checks a probed [rows x cols] matrix against ref(i, n) = sum_k term(i, n, k) within hopper_lab.cuh's
   kProbeTol of the sum of |products|; prints the first misses and a summary line; returns the misses. */
template <typename Term>
static int probe_check(const char* name, const float* got, int nrows, int ncols, int depth, Term term) {
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < nrows; i++)
        for (int n = 0; n < ncols; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < depth; k++) {
                const double p = term(i, n, k);
                ref += p;
                mag += fabs(p);
            }
            const double x = got[i * ncols + n];
            if (!(fabs(x - ref) <= kProbeTol * mag + 1e-30)) {
                if (bad++ < 3) printf("  %s[%d][%d] = %.6g, want %.6g\n", name, i, n, x, ref);
            }
            worst = fmax(worst, isnan(x) ? INFINITY : fabs(x - ref) / (mag + 1e-30));
        }
    printf("  %s: %d of %d wrong (worst error / sum|products| %.3g)\n", name, bad, nrows * ncols, worst);
    return bad;
}

/* layout_probe_kernel on B1 NH3 T100 HS128 (head 1: slot and head coordinates; tokens 100..127 zero-filled):
   S, dP, X = bf(S) K and Y = bf(dP) K against double loops over the same BF16 values (X and Y from the
   kernel's own S and dP, rounded as it rounds them). */
static void layout_probe(void) {
    test_section("layout probe HS128: S = Q K^T, dP = dO V^T (SS n64, 8 k-steps over 2 chunks, 64-row slices),"
                 " bf(S) K, bf(dP) K (RS n128, K N-major from row 0 and row 64, LBO 16 KB), K/V in stage 1");
    ProbeInputs in;
    in.s = AttnShape{1, 3, 100, kHS};
    in.head = 1;
    const size_t nqkv = attn_qkv_count(in.s), nout = attn_out_count(in.s);
    in.h_qkv = random_bf16_bits(nqkv);
    in.h_dout = random_bf16_bits(nout);
    lab_upload(&in.qkv, in.h_qkv, nqkv * 2);
    lab_upload(&in.dout, in.h_dout, nout * 2);
    const size_t n_sq = (size_t)kBlockQ * kBlockK, n_dq = (size_t)kBlockQ * kHS;
    float *d_s, *d_dp, *d_x, *d_y;
    lab_alloc_poisoned(&d_s, n_sq * 4);
    lab_alloc_poisoned(&d_dp, n_sq * 4);
    lab_alloc_poisoned(&d_x, n_dq * 4);
    lab_alloc_poisoned(&d_y, n_dq * 4);
    const CUtensorMap qmap = make_map(in.qkv, in.s, 3 * in.s.NH, "qkv");
    const CUtensorMap dmap = make_map(in.dout, in.s, in.s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qmap, dmap, in.s.NH, in.head, d_s, d_dp, d_x, d_y);
    cudaCheckLastError();
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h_s = (float*)mallocCheck(n_sq * 4);
    float* h_dp = (float*)mallocCheck(n_sq * 4);
    float* h_x = (float*)mallocCheck(n_dq * 4);
    float* h_y = (float*)mallocCheck(n_dq * 4);
    cudaCheck(cudaMemcpy(h_s, d_s, n_sq * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_dp, d_dp, n_sq * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_x, d_x, n_dq * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_y, d_y, n_dq * 4, cudaMemcpyDeviceToHost));
    const int bad_s = probe_check("S = Q K^T", h_s, kBlockQ, kBlockK, kHS, [&](int i, int j, int d) {
        return probe_qkv(in, i, kSlotQ, d) * probe_qkv(in, j, kSlotK, d);
    });
    const int bad_dp = probe_check("dP = dO V^T", h_dp, kBlockQ, kBlockK, kHS, [&](int i, int j, int d) {
        return probe_dout(in, i, d) * probe_qkv(in, j, kSlotV, d);
    });
    const int bad_x = probe_check("bf(S) K", h_x, kBlockQ, kHS, kBlockK, [&](int i, int n, int j) {
        return bf16_round(h_s[i * kBlockK + j]) * probe_qkv(in, j, kSlotK, n);
    });
    const int bad_y = probe_check("bf(dP) K", h_y, kBlockQ, kHS, kBlockK, [&](int i, int n, int j) {
        return bf16_round(h_dp[i * kBlockK + j]) * probe_qkv(in, j, kSlotK, n);
    });
    CHECK(bad_s == 0, "S = Q K^T: (a) SS n64 over 8 k-steps, chunk jump at k-step 4, Q rows 8 KB into 16 KB chunks"
                      " (warpgroup 1), K halves 0 and 8 KB into the chunks of stage 1 (c)");
    CHECK(bad_dp == 0, "dP = dO V^T: (a) with the dout map at HS 128 (column coordinate 64 for chunk 1)");
    CHECK(bad_x == 0, "bf(S) K: (b) RS n128, register A from the S accumulator, K N-major from rows 0 and 64, LBO 16 KB");
    CHECK(bad_y == 0, "bf(dP) K: (b) the second accumulator of the same wgmma group (the DSK/PK interleave)");
    free(h_s); free(h_dp); free(h_x); free(h_y);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_s)); cudaCheck(cudaFree(d_dp)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_y));
}

/* ------------------------------------------------------------------------------------------------ */
/* host: the groups of checks, one process each                                                      */
/* ------------------------------------------------------------------------------------------------ */

enum { kGroupProbe, kGroupGproj, kGroupFp32, kGroupTiming, kNumGroups };
static const char* kGroupName[kNumGroups] = {"the layout probe", "gproj checks", "fp32 checks",
                                             "checks and timing at B2 H16 T4096 and B8 H8 T1024"};

static void run_group(int group) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    const cudaDeviceProp prop = require_sm90("hopper_rows128");
    printf("  on %s\n", prop.name);
    hang_record_install();
    /* random; T < 64 (1, 50); odd T (77, 129, 1000, 257); sharp (q x8); key offset 20 along a unit vector
       (gproj's correction matters); rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
    const CheckInputs shapes[] = {
        {{1, 1, 1, 128}, 1.f, 0.f},    {{1, 1, 50, 128}, 1.f, 0.f},    {{1, 1, 77, 128}, 1.f, 0.f},
        {{1, 2, 128, 128}, 1.f, 0.f},  {{1, 1, 129, 128}, 1.f, 0.f},   {{2, 3, 1000, 128}, 1.f, 0.f},
        {{4, 8, 257, 128}, 1.f, 0.f},  {{1, 4, 500, 128}, 8.f, 0.f},   {{2, 4, 1000, 128}, 1.f, 20.f},
        {{1, 4, 777, 128}, 1.f, 181.f},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    const CheckInputs bench[] = {{{2, 16, 4096, 128}, 1.f, 0.f}, {{8, 8, 1024, 128}, 1.f, 0.f}};
    switch (group) {
        case kGroupProbe: layout_probe(); break;
        case kGroupGproj:
            for (int i = 0; i < n_shapes; i++) check_shape(shapes[i], ATTN_GPROJ, 0);
            break;
        case kGroupFp32:
            for (int i = 0; i < n_shapes; i++) check_shape(shapes[i], ATTN_FP32, 0);
            break;
        case kGroupTiming:
            for (int i = 0; i < 2; i++) {
                check_shape(bench[i], ATTN_GPROJ, 1);
                check_shape(bench[i], ATTN_FP32, 1);
            }
            break;
    }
}

/* The parent never touches CUDA: each group gets a fresh context in a child process, so a fault or a hang
   report costs that group's results only. A child reports its pass/fail counts through a pipe; one that
   dies without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes are fixed in the program", argv[0]);
    printf("hopper_rows128: the HS-128 wgmma row pass of the backward (gproj: lambda, dQ; fp32: D) vs the portable"
           " attn_bwd_rows_kernel<128>; first run: written without a GPU; %d groups, one process each\n", kNumGroups);
    int passed = 0, failed = 0;
    for (int group = 0; group < kNumGroups; group++) {
        const char* what = kGroupName[group];
        int fds[2];
        if (pipe(fds) != 0) die("hopper_rows128: pipe() failed\n  hint: out of file descriptors?");
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) die("hopper_rows128: fork() failed\n  hint: out of processes or memory?");
        if (pid == 0) {
            close(fds[0]);
            printf("=== %s\n", what);
            run_group(group);
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
