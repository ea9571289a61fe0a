/*
 * dev/attention_lab/hopper_bwd_gproj.cu - lab of a Hopper (sm_90a, wgmma + TMA) key-major pass for gproj mode
 * at head size 64: dK and dV only. The next session runs it; written 2026-11-29 without a GPU (compiled for
 * sm_90a, never run).
 *
 * Why: gproj's backward on sm_90 is prep (D) + the Hopper row pass (attention/attention_hopper_rows.cu:
 * lambda and all of dQ) + the portable mma.sync attn_bwd_kernel<64, ATTN_GPROJ> (attention/attention_cuda.cu)
 * for dK and dV. That last kernel is the slow piece (call5: gproj fwd+bwd 1.30-1.34x bf16, target 1.10x).
 * bf16/repair's key-major pass is already Hopper (attention/attention_hopper_bwd.cu, verified on the H200);
 * this kernel is that kernel's forms with gproj's numerics: no dQ GEMM, no atomics, no dS staging (the row
 * pass wrote dQ), and a third register-A GEMM into dK.
 *
 * What it computes (docs/ATTENTION_NUMERICS.md, gproj; attn_bwd_kernel<64, ATTN_GPROJ>'s rounding points):
 *   per key tile, for each query tile from the diagonal on (per consumer warpgroup, 64 keys x 64 queries):
 *     S^T = K Q^T, dP^T = V dO^T          (FP32, wgmma SS)
 *     P = exp2((S - m) c) * fl(1/l)        (repair's softmax, which gproj uses; stats {m, l})
 *     dS = P (dP - D)                      (FP32; D from the prep kernel, the BF16 O; masked entries exactly 0)
 *     dV += bf(P)^T dO                     (wgmma RS, A = the P accumulator repacked)
 *     dK += bf(dS)^T Q + bf(-lambda_q P)^T Q   (two wgmma RS batches into one accumulator; the second A
 *                                           operand is its own BF16 rounding of -lambda_q * P in FP32, as
 *                                           production's `alp`: rounding dS - lambda P together would lose
 *                                           the correction)
 *   dK = bf(s dK_acc), dV = bf(dV_acc) into the k and v slots of dqkv. dQ is not touched.
 *   lambda [B*NH*T] and D [B*NH*T] are read from the workspace slots attention_backward_cuda fills
 *   (carve_workspace in attention_cuda.cu: dq_acc [rows*HS] fp32, then D [rows], then lambda [rows]).
 * Only the FP32 sum order differs from production: dK sums the 4 k-steps of bf(dS) then the 4 of the
 * correction (production interleaves them per 16 queries), and wgmma's k order.
 * fp32 mode does NOT fall out of this: fp32's key-major pass also computes dQ (three BF16 terms of dS
 * through shared memory and atomics), so it needs hopper_bwd's dQ path plus the hi/lo splits.
 *
 * Kernel layout: hopper_bwd's (one CTA = 128 keys of one (b, h), two consumer warpgroups of 64 keys; K/V
 * once, Q/dO tiles of 64 queries double-buffered; full[s]: 32 producer lanes after the row state
 * {m, fl(1/l), D, lambda}, plus the TMA bytes; empty[s]: the 256 consumer threads), except that the
 * producer is a whole warpgroup (one warp of it works) and setmaxnreg gives the consumers 232 registers
 * (hopper_bwd_fast's v1, 99/0 and as fast as v0 on the H200 in call5): with a producer warp (288 threads,
 * 168 registers each) the third A operand costs 92 bytes of spills.
 *
 * Checks (this program, in order):
 *   1. layout probe of the one new operand form: dK = bf(dP^T) Q + bf(-lambda_q S^T) Q, both register-A
 *      batches into one accumulator with lambda per query COLUMN read from the row state (a per-key mapping
 *      or a dropped second batch shows), plus the correction alone; S^T, dP^T checked again on the way;
 *   2. per case: forward (public), attention_backward_cuda(gproj, force_portable) = reference; then
 *      attention_backward_cuda(gproj, default path) fills D and lambda in its workspace (prep + Hopper row
 *      pass) and dqkv (dQ by the row pass, dK/dV by the portable key-major kernel with the SAME D and
 *      lambda); the k and v slots are poisoned with NaN and this kernel writes them from that workspace.
 *      dK, dV within 4 BF16 ulps (of max(|a|, |b|, row RMS)) of both the same-lambda portable kernel and
 *      the force_portable backward; dQ bit-equal to the default path's (this kernel must not touch it);
 *      ||sum_j dK_j|| / ||dK|| per head printed for both (gproj restores the zero key sum);
 *   3. the composed Hopper gproj backward (this lab's copy of the prep kernel for D, checked bit-equal, then
 *      attention_backward_hopper_rows, then this kernel) checked in all three slots against force_portable
 *      and timed against the portable gproj backward, the default (row pass Hopper) gproj backward and the
 *      default bf16 backward at the benchmark shapes; this kernel alone is timed too.
 * Cases: T 1, 77, 128, 129, 1000, B*NH up to 128, q x8 (sharp), key offset 20 and 128 along a unit vector
 * per head (where the correction matters), the benchmark shapes B8 H16 T1024 and B4 H16 T2048.
 *
 * Registers (-Xptxas -v, CUDA 13.0): 168 at entry (the launch bound; 232 after setmaxnreg), 0 bytes of
 * spills, no C75xx serialisation warnings (hopper_bwd_gproj.mk says how to re-check). 0 spills is also the
 * sign that setmaxnreg took effect: at 168 this code spills. Safety: every mbarrier wait is bounded (~2 s of clock64); a wait that gives up records which
 * barrier in host-mapped memory, sets the CTA's abort flag (later waits return at once) and the CTA runs to
 * its end on garbage; the host checks the record after every synchronisation and names the barrier. No
 * __trap() on the consumer path (engineer G: it makes ptxas ignore setmaxnreg). setmaxnreg itself cannot
 * be bounded (the split is exact, so it never waits on another CTA). Run it under `timeout 120` anyway.
 *
 * Usage: hopper_bwd_gproj   (no arguments; needs an sm_90 GPU). Ends with "N passed, N failed".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/attention_hopper_bwd.cuh"
#include "attention/attn_cases.h"
#include "attention/hopper_wgmma.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"
#include "dev/attention_lab/hopper_lab_hang.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = 64;                 /* the only head size */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
/* + a producer warpgroup after the consumers (one warp of it works); setmaxnreg moves its registers to the
   consumers. __launch_bounds__(384, 1) starts every thread at 168 registers; the producer warpgroup drops
   to 40 and the consumers rise to 232: 128 * 40 + 256 * 232 = 384 * 168 (hopper_bwd_fast's v1 split, which
   passed on the H200 in call5). Why: with the correction's 16 extra A registers the consumer code needs
   more than the 168 a 288-thread CTA gets (that layout: 168 registers, 92 bytes of spills). */
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box */
constexpr int kSwizzleRowBytes = 128;   /* one row of HS 64 BF16 = one 128B-swizzle row */
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kKSteps = kBlockQ / kWgmmaK; /* k-steps of the RS GEMMs (over the tile's 64 queries) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

/* Shared-memory plan (byte offsets from a 1024-byte aligned base). Tiles are [rows][128 bytes], swizzled. */
struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kKeyTileBytes = kBlockK * kSwizzleRowBytes; /* 16 KB */
    static constexpr int kQTileBytes = kBlockQ * kSwizzleRowBytes;   /* 8 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;           /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;  /* kStages tiles */
    static constexpr int kRowState = kDO + kStages * kQTileBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages; /* kv_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kRowState % 16 == 0, "float4 row state");
};

/* ---- the GEMMs of one (key tile, query tile) step, per warpgroup (shared by the kernel and the probe) ---- */


/* THE NEW OPERAND FORM, with the two old ones: k-step kk's three register A operands from the FP32 P and dS
   accumulators (registers 8kk..8kk+7: key g + 8 (i & 1), query 16kk + 8 (i >> 1) + 2t + e for register
   8kk + 2i + e, the fragment layout above):
     pa   = bf(P),  pds = bf(dS)                         (pack_acc_a_operand of hopper_wgmma.cuh, one k-step)
     plam = bf(-lambda_q P), lambda per query COLUMN: lam[jj][e] = lambda of query 16kk + 8 jj + 2t + e;
            the product -lambda * P in FP32, rounded once (production's `alp` expression).
   One k-step at a time, so the kernel packs each step right after computing its P and dS and those FP32
   values die step by step (packing all of bf(P) first and the correction after kept P and dS live
   together with dK/dV: 84 bytes of spills). */
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


/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* The key-major gproj pass. stats {m, l} per row (gproj's forward stores repair's stats), D and lambda
   [B*NH*T] from the workspace; writes the k and v slots of dqkv. */
__global__ void __launch_bounds__(kThreads, 1)
    gproj_keys_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                      const float* __restrict__ stats, const float* __restrict__ D, const float* __restrict__ lambda,
                      bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    __shared__ int cta_abort; /* set by a bounded wait that gave up */
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

    const int k0 = blockIdx.x * kBlockK;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int qt_begin = k0 / kBlockQ;   /* the first query tile that reaches key k0 */
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the warpgroup index through a shuffle: ptxas then knows it is warp-uniform, so the setmaxnreg regions
       below are not divergent code to it (as hopper_bwd_fast) */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        cta_abort = 0;
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads); /* full: 32 producer lanes (row state) */
    }
    __syncthreads();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* its warps 1-3 have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 2 queries ---- */
        if (lane == 0) {
            mbar_arrive_expect_tx(kv_full, 2 * Plan::kKeyTileBytes);
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                /* a half wholly past T loads the first half again: finite data, all its keys masked */
                const int row = (k0 + half * kBoxRows < T) ? k0 + half * kBoxRows : k0;
                tma_load_4d(k_s + half * Plan::kBoxBytes, &qkv_map, kv_full, 0, kSlotK * NH + h, row, b);
                tma_load_4d(v_s + half * Plan::kBoxBytes, &qkv_map, kv_full, 0, kSlotV * NH + h, row, b);
            }
        }
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), kHangEmpty, s, &cta_abort);
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int ql = lane + 32 * half, query = q0 + ql;
                /* rows past T: values that leave P finite and lambda 0 (they are masked anyway) */
                float4 st = make_float4(0.f, 1.f, 0.f, 0.f);
                if (query < T) {
                    const long long idx = (long long)bh * T + query;
                    st.x = stats[idx * 2];                  /* m (raw score units) */
                    st.y = __frcp_rn(stats[idx * 2 + 1]);   /* fl(1 / l) */
                    st.z = D[idx];
                    st.w = lambda[idx];
                }
                row_state[s * kBlockQ + ql] = st;
            }
            if (lane == 0) {
                mbar_arrive_expect_tx(&full[s], 2 * Plan::kQTileBytes);
                tma_load_4d(q_s + s * Plan::kQTileBytes, &qkv_map, &full[s], 0, kSlotQ * NH + h, q0, b);
                tma_load_4d(do_s + s * Plan::kQTileBytes, &dout_map, &full[s], 0, h, q0, b);
            } else {
                mbar_arrive(&full[s]);
            }
        }
        return;
    }

    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp % 4, g = lane >> 2, t = lane & 3;
    const int key0 = k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const uint32_t k_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, v_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    float dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, kHangKvFull, 0, &cta_abort);
    __syncwarp();

    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), kHangFull, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        float st[32], dpt[32];
        warpgroup_two_ss_64x64(st, dpt, k_addr, q_addr, v_addr, do_addr);

        /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions) and the three A operands, one
           k-step (16 queries) at a time. Element 4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kKSteps][4], pds[kKSteps][4], plam[kKSteps][4];
#pragma unroll
        for (int kk = 0; kk < kKSteps; kk++) {
            float lam[2][2];
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 2 * kk + jj;
                    const int query = q0 + 8 * j + 2 * t + e;
                    const float4 row = rs[8 * j + 2 * t + e];
                    lam[jj][e] = row.w;
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
           two dK ones chained on the same accumulator (wgmma orders same-accumulator operations); P and
           dS are dead while it runs (64 accumulator + 48 A registers in flight). */
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(plam);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        warpgroup_rs_issue_n64(dv, pa, do_addr);
        warpgroup_rs_issue_n64(dk, pds, q_addr);
        warpgroup_rs_issue_n64(dk, plam, q_addr);
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

/* Layout probe of the new operand form: one warpgroup, one tile at token 0 of batch 0 (T < 64: zero fill),
   K and V in the SECOND 8 KB half of their tiles (warpgroup 1's offset), Q/dO in stage 1, a per-query
   lambda [64] from global memory in the row state's .w, no softmax:
     out_st   = S^T = K Q^T,  out_dpt = dP^T = V dO^T           (forms hopper_bwd's probe verified)
     out_dk   = bf(dP^T) Q + bf(-lambda_q S^T) Q                (two RS batches into one accumulator)
     out_corr = bf(-lambda_q S^T) Q                             (the correction alone)
   [64 x 64] FP32 each, row-major [key][d] (S^T, dP^T: [key][query]). */
__global__ void __launch_bounds__(128, 1)
    gproj_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                       int NH, int head, const float* __restrict__ lambda_in, float* __restrict__ out_st,
                       float* __restrict__ out_dpt, float* __restrict__ out_dk, float* __restrict__ out_corr) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    __shared__ int cta_abort;
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    float4* rs = reinterpret_cast<float4*>(smem + Plan::kRowState) + kBlockQ; /* stage 1's row state */
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    if (threadIdx.x < kBlockQ) rs[threadIdx.x] = make_float4(0.f, 1.f, 0.f, lambda_in[threadIdx.x]);
    __syncthreads();
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
    float st[32], dpt[32];
    warpgroup_two_ss_64x64(st, dpt, smem_u32(k_half), q_addr, smem_u32(v_half), do_addr);
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
    uint32_t pa[kKSteps][4], pds[kKSteps][4], plam[kKSteps][4]; /* pa: unused here (hopper_bwd's probe checked it) */
#pragma unroll
    for (int kk = 0; kk < kKSteps; kk++) {
        float lam[2][2];
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++) lam[jj][e] = rs[16 * kk + 8 * jj + 2 * t + e].w;
        pack_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
    }
    float dk[32], corr[32];
#pragma unroll
    for (int i = 0; i < 32; i++) dk[i] = corr[i] = 0.f;
    reg_fence(pds);
    reg_fence(plam);
    reg_fence(dk);
    reg_fence(corr);
    wgmma_fence();
    warpgroup_rs_issue_n64(dk, pds, q_addr);
    warpgroup_rs_issue_n64(dk, plam, q_addr);
    warpgroup_rs_issue_n64(corr, plam, q_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dk);
    reg_fence(corr);
    reg_fence(pds);
    reg_fence(plam);
    write_acc(out_dk, dk);
    write_acc(out_corr, corr);
}

/* The prep kernel's D for gproj (attn_bwd_prep_kernel<64> with zero_dq = 0, want_D = 1, the same
   expression and lane order, one warp per row), so the lab can compose the whole Hopper gproj backward from
   public pieces; checked bit-equal against the production D. */
__global__ void lab_prep_D_kernel(const bf16* __restrict__ out, const bf16* __restrict__ dout, float* __restrict__ D,
                                  int NH, int T, long long rows) {
    const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5); /* (b*NH + h)*T + t */
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const long long bh = row / T;
    const int tok = (int)(row % T);
    const long long b = bh / NH, h = bh % NH;
    const long long off = (b * T + tok) * NH * kHS + h * kHS;
    float sum = 0.f;
#pragma unroll
    for (int d = lane; d < kHS; d += 32)
        sum += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
    if (lane == 0) D[row] = sum;
}

/* Writes BF16 NaN (0xFFFF) over the k and v slots of dqkv [B, T, 3, NH, HS] (one thread per element). */
__global__ void poison_kv_kernel(bf16* dqkv, long long tokens, int NH) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_token = 2LL * NH * kHS;
    if (i >= tokens * per_token) return;
    const long long tok = i / per_token, within = i % per_token;
    dqkv[tok * 3LL * NH * kHS + (long long)NH * kHS + within] = __ushort_as_bfloat16((unsigned short)0xFFFFu);
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launches                                                                       */
/* ------------------------------------------------------------------------------------------------ */

/* A 4-D BF16 tensor {HS, heads, T, B} with token stride `heads * HS`, boxes {64, 1, 64, 1}, 128-byte swizzle,
   zeros outside (hopper_bwd's make_head_map). qkv: heads = 3 NH; dout: heads = NH. */
CUtensorMap make_head_map(const bf16* base, AttnShape s, int heads, const char* what) {
    return encode_head_map(base, s, heads, kBoxRows, "hopper_bwd_gproj", what);
}

/* The key-major gproj pass alone (asynchronous on `stream`): D and lambda [B*NH*T] as the workspace holds
   them, writes the k and v slots of dqkv. */
void gproj_keys_launch(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, const float* D,
                       const float* lambda, bf16* dqkv, cudaStream_t stream) {
    if (s.HS != kHS || (long long)s.B * s.NH > 65535 || ((uintptr_t)qkv % 16) != 0 || ((uintptr_t)dout % 16) != 0)
        die("hopper_bwd_gproj: unsupported call (B=%d NH=%d T=%d HS=%d)\n  hint: HS 64, B*NH <= 65535, 16-byte "
            "aligned qkv and dout", s.B, s.NH, s.T, s.HS);
    const CUtensorMap qkv_map = make_head_map(qkv, s, 3 * s.NH, "qkv");
    const CUtensorMap dout_map = make_head_map(dout, s, s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(gproj_keys_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    gproj_keys_kernel<<<grid, kThreads, SmemPlan::kAlloc, stream>>>(qkv_map, dout_map, stats, D, lambda, dqkv, s.NH,
                                                                    s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS));
    cudaCheckLastError();
}

}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: checks and timing                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* A synchronisation result plus the hang record: on either, one FAIL line naming the barrier (or the CUDA
   error), the summary line, and exit (the context or the results are gone). */
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
    test_summary();
    exit(1);
}

static size_t rows_of(AttnShape s) { return (size_t)s.B * s.NH * s.T; }
/* Tolerance, fixed before any run: only FP32 sum orders differ (wgmma k order, dK's two batches summed
   apart), and a changed FP32 S or dP can flip one BF16 rounding of P, dS or -lambda P; as hopper_bwd. */
static const double kMaxUlps = 4.0;

static const char* kSlotName[3] = {"dQ", "dK", "dV"};

/* Largest over heads of ||sum_j dK_j|| / ||dK|| (the gproj identity: 0 up to the BF16 output rounding). */
static double worst_key_sum(const uint16_t* dqkv, AttnShape s) {
    double worst = 0;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            double sum[64] = {0}, sq = 0;
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
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* against, int exact) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s vs %s: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n",
           kSlotName[slot], against, d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: %s has every element finite (%zu NaN)", kSlotName[slot], against, d.nan_ref);
    CHECK(d.nan_new == 0, "%s: written everywhere, finite (%zu NaN left of the poison)", kSlotName[slot], d.nan_new);
    if (exact)
        CHECK(d.unequal == 0, "%s bit-equal to %s (%zu differ)", kSlotName[slot], against, d.unequal);
    else
        CHECK(d.max_ulps <= kMaxUlps, "%s within %.0f BF16 ulps of %s (max %.2f)", kSlotName[slot], kMaxUlps, against,
              d.max_ulps);
}

struct CheckInputs {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

/* One case: see the file comment, checks 2 and 3; with time_it the timings. */
static void check_case(CheckInputs in, int time_it) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_GPROJ;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper gproj key-major pass", s.B, s.NH,
             s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s), rows = rows_of(s);
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; carve_workspace's layout, which"
          " this lab reads)", ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);

    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_def, *dqkv_new, *dqkv_comp;
    float *stats, *D_comp, *lambda_comp;
    void *ws_ref, *ws_def;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_def, nqkv * 2);
    cudaCheck(cudaMalloc(&dqkv_new, nqkv * 2));
    lab_alloc_poisoned(&dqkv_comp, nqkv * 2);
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&D_comp, rows * 4);
    lab_alloc_poisoned(&lambda_comp, rows * 4);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_def, ws_bytes);
    AttnOptions opt = {0}, portable = {0};
    portable.force_portable = 1;
    CHECK(attention_backward_cuda_path(mode, opt, s, qkv, dout) == ATTN_BWD_HOPPER,
          "dispatch: the default gproj backward takes the Hopper path (row pass), so its workspace holds the"
          " Hopper row pass's lambda");
    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, 0);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_def, ws_def, 0);
    sync_or_report(cudaDeviceSynchronize(), "the production backwards");
    /* this kernel over the default path's dqkv with k and v poisoned, from the default path's D and lambda */
    const float* D_def = (const float*)ws_def + rows * s.HS;
    const float* lambda_def = D_def + rows;
    cudaCheck(cudaMemcpy(dqkv_new, dqkv_def, nqkv * 2, cudaMemcpyDeviceToDevice));
    const long long kv_elems = (long long)s.B * s.T * 2 * s.NH * s.HS;
    poison_kv_kernel<<<(unsigned)ceil_div(kv_elems, 256), 256>>>(dqkv_new, (long long)s.B * s.T, s.NH);
    cudaCheckLastError();
    gproj_keys_launch(s, qkv, dout, stats, D_def, lambda_def, dqkv_new, 0);
    sync_or_report(cudaDeviceSynchronize(), "the gproj key-major kernel");
    /* the composed Hopper backward: lab prep (D), the production row pass (lambda, dQ), this kernel */
    lab_prep_D_kernel<<<(unsigned)ceil_div((long long)rows, 4), 128>>>(out, dout, D_comp, s.NH, s.T, (long long)rows);
    cudaCheckLastError();
    attention_backward_hopper_rows(mode, s, qkv, dout, stats, D_comp, lambda_comp, dqkv_comp, 0);
    gproj_keys_launch(s, qkv, dout, stats, D_comp, lambda_comp, dqkv_comp, 0);
    sync_or_report(cudaDeviceSynchronize(), "the composed Hopper gproj backward");

    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_def = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_comp = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_def, dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_comp, dqkv_comp, nqkv * 2, cudaMemcpyDeviceToHost));
    printf(" this kernel on the default path's D and lambda:\n");
    check_slot(h_def, h_new, s, 0, "the default path (untouched)", 1);
    check_slot(h_def, h_new, s, 1, "the portable key-major kernel, same lambda", 0);
    check_slot(h_def, h_new, s, 2, "the portable key-major kernel, same lambda", 0);
    check_slot(h_ref, h_new, s, 1, "the force_portable backward", 0);
    check_slot(h_ref, h_new, s, 2, "the force_portable backward", 0);
    const double ks_ref = worst_key_sum(h_ref, s), ks_new = worst_key_sum(h_new, s);
    printf("  max over heads ||sum_j dK_j|| / ||dK||: force_portable %.3g, this kernel %.3g\n", ks_ref, ks_new);
    /* composed backward */
    float* hD_def = (float*)mallocCheck(rows * 4);
    float* hD_comp = (float*)mallocCheck(rows * 4);
    cudaCheck(cudaMemcpy(hD_def, D_def, rows * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hD_comp, D_comp, rows * 4, cudaMemcpyDeviceToHost));
    size_t d_unequal = 0;
    for (size_t i = 0; i < rows; i++)
        if (memcmp(&hD_def[i], &hD_comp[i], 4) != 0) d_unequal++;
    printf(" the composed Hopper backward (lab prep + attention_backward_hopper_rows + this kernel):\n");
    CHECK(d_unequal == 0, "lab prep's D bit-equal to the production prep kernel's (%zu of %zu rows differ)",
          d_unequal, rows);
    for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_comp, s, slot, "the force_portable backward", 0);

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        /* the bf16 backward of the ratio needs bf16's own forward (stats {LSE, 0}, its O for D) */
        bf16* out_b;
        float* stats_b;
        cudaCheck(cudaMalloc(&out_b, nout * 2));
        cudaCheck(cudaMalloc(&stats_b, nstats * 4));
        attention_forward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, NULL, 0);
        /* each candidate as a closure over this case's buffers, timed alone */
        auto run_portable = [&]() { attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0); };
        auto run_default = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_def, ws_def, 0); };
        auto run_bf16 = [&]() { attention_backward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, dout, dqkv_new, ws_ref, 0); };
        auto run_keys = [&]() { gproj_keys_launch(s, qkv, dout, stats, D_comp, lambda_comp, dqkv_comp, 0); };
        auto run_composed = [&]() {
            lab_prep_D_kernel<<<(unsigned)ceil_div((long long)rows, 4), 128>>>(out, dout, D_comp, s.NH, s.T,
                                                                                (long long)rows);
            attention_backward_hopper_rows(mode, s, qkv, dout, stats, D_comp, lambda_comp, dqkv_comp, 0);
            gproj_keys_launch(s, qkv, dout, stats, D_comp, lambda_comp, dqkv_comp, 0);
        };
        auto time_of = [&](auto fn, const char* what) {
            float t[kReps];
            for (int i = 0; i < kWarmup; i++) fn();
            sync_or_report(cudaDeviceSynchronize(), what);
            for (int i = 0; i < kReps; i++) {
                cudaCheck(cudaEventRecord(e0));
                fn();
                cudaCheck(cudaEventRecord(e1));
                sync_or_report(cudaEventSynchronize(e1), what);
                cudaCheck(cudaEventElapsedTime(&t[i], e0, e1));
            }
            return median_ms(t, kReps);
        };
        const float ms_portable = time_of(run_portable, "timing the portable gproj backward");
        const float ms_default = time_of(run_default, "timing the default gproj backward");
        const float ms_composed = time_of(run_composed, "timing the composed Hopper gproj backward");
        const float ms_keys = time_of(run_keys, "timing the gproj key-major kernel");
        const float ms_bf16 = time_of(run_bf16, "timing the default bf16 backward");
        /* key-major pass: 4 GEMMs of 2 B H T^2 d / 2 (causal) each, + the correction GEMM */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d): portable gproj backward %.4f ms; default gproj backward (Hopper row pass,"
               " portable key-major) %.4f ms; composed Hopper gproj backward %.4f ms (%.2fx the portable, %.2fx the"
               " default); bf16 default backward %.4f ms -> gproj/bf16 backward: default %.2fx, composed %.2fx\n",
               (int)kReps, ms_portable, ms_default, ms_composed, ms_portable / ms_composed, ms_default / ms_composed,
               ms_bf16, ms_default / ms_bf16, ms_composed / ms_bf16);
        printf("  time: this key-major kernel alone %.4f ms = %.1f TFLOP/s (5 GEMMs, causal)\n", ms_keys,
               5.0 * gemm / ms_keys * 1e-9);
        cudaCheck(cudaEventDestroy(e0));
        cudaCheck(cudaEventDestroy(e1));
        cudaCheck(cudaFree(out_b));
        cudaCheck(cudaFree(stats_b));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_def); free(h_new); free(h_comp); free(hD_def);
    free(hD_comp);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_def)); cudaCheck(cudaFree(dqkv_new));
    cudaCheck(cudaFree(dqkv_comp)); cudaCheck(cudaFree(stats)); cudaCheck(cudaFree(D_comp));
    cudaCheck(cudaFree(lambda_comp)); cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_def));
}

/* The layout probe on B1 NH3 T50 (head 1; T < 64: zero fill), lambda_q spread over [-2, 2] per query (so a
   per-key mapping, a wrong query pairing or a dropped batch cannot pass), checked against double loops on
   the kernel's own S^T and dP^T, rounded as the kernel rounds them. */
static void layout_probe(void) {
    test_section("layout probe HS64: dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two RS batches, one accumulator,"
                 " lambda per query column from the row state)");
    ProbeInputs in = probe_inputs_make();
    const size_t tile = 64 * 64;
    float h_lambda[64];
    for (int q = 0; q < 64; q++) h_lambda[q] = (float)(4.0 * attn_rng_uniform(&g_rng) - 2.0);
    float *d_lambda, *d_out;
    lab_upload(&d_lambda, h_lambda, sizeof h_lambda);
    lab_alloc_poisoned(&d_out, 4 * tile * 4);
    const CUtensorMap qkv_map = make_head_map(in.qkv, in.s, 3 * in.s.NH, "qkv");
    const CUtensorMap dout_map = make_head_map(in.dout, in.s, in.s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(gproj_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    gproj_probe_kernel<<<1, 128, SmemPlan::kAlloc>>>(qkv_map, dout_map, in.s.NH, in.head, d_lambda, d_out,
                                                     d_out + tile, d_out + 2 * tile, d_out + 3 * tile);
    cudaCheckLastError();
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(4 * tile * 4);
    cudaCheck(cudaMemcpy(h, d_out, 4 * tile * 4, cudaMemcpyDeviceToHost));
    const float *g_st = h, *g_dpt = h + tile, *g_dk = h + 2 * tile, *g_corr = h + 3 * tile;
    double* ref = (double*)mallocCheck(tile * sizeof(double));
    double* mag = (double*)mallocCheck(tile * sizeof(double));
    int bad[4];
    probe_product(ref, mag, kHS, [&](int i, int j, int d) { return probe_qkv(in, i, kSlotK, d) * probe_qkv(in, j, kSlotQ, d); });
    bad[0] = probe_compare("S^T = K Q^T", g_st, ref, mag);
    probe_product(ref, mag, kHS, [&](int i, int j, int d) { return probe_qkv(in, i, kSlotV, d) * probe_dout(in, j, d); });
    bad[1] = probe_compare("dP^T = V dO^T", g_dpt, ref, mag);
    /* correction alone: sum_q bf(-lambda_q * S^T[key][q]) Q[q][n], the product in FP32 as the kernel does */
    probe_product(ref, mag, 64, [&](int i, int n, int q) {
        return bf16_round(-h_lambda[q] * g_st[i * 64 + q]) * probe_qkv(in, q, kSlotQ, n);
    });
    bad[3] = probe_compare("bf(-lambda_q S^T) Q", g_corr, ref, mag);
    /* both batches into one accumulator: sum_q (bf(dP^T) Q + bf(-lambda_q S^T) Q), the two terms of a q together */
    for (int i = 0; i < 64; i++)
        for (int n = 0; n < kHS; n++) {
            double r = 0, m = 0;
            for (int q = 0; q < 64; q++) {
                const double p1 = bf16_round(g_dpt[i * 64 + q]) * probe_qkv(in, q, kSlotQ, n);
                const double p2 = bf16_round(-h_lambda[q] * g_st[i * 64 + q]) * probe_qkv(in, q, kSlotQ, n);
                r += p1 + p2;
                m += fabs(p1) + fabs(p2);
            }
            ref[i * 64 + n] = r;
            mag[i * 64 + n] = m;
        }
    bad[2] = probe_compare("bf(dP^T) Q + bf(-lambda_q S^T) Q", g_dk, ref, mag);
    CHECK(bad[0] == 0, "S^T = K Q^T (hopper_bwd's form, re-checked in this lab's copy)");
    CHECK(bad[1] == 0, "dP^T = V dO^T (hopper_bwd's form, re-checked in this lab's copy)");
    CHECK(bad[3] == 0, "bf(-lambda_q P) as register A: lambda per query column from the row state's .w");
    CHECK(bad[2] == 0, "two RS batches (bf(dS), then the correction) chained into one dK accumulator");
    free(h); free(ref); free(mag);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_lambda)); cudaCheck(cudaFree(d_out));
}

int main(int argc, char** argv) {
    attn_rng_init(&g_rng, 0x243F6A8885A308D3ull);
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in main()", argv[0]);
    const cudaDeviceProp prop = require_sm90("hopper_bwd_gproj");
    hang_record_install();
    printf("hopper_bwd_gproj on %s: a Hopper key-major pass for gproj (dK, dV; HS 64) vs the production kernels\n",
           prop.name);
    layout_probe(); /* the new operand form alone first: if it fails, everything below fails too */
    const CheckInputs cases[] = {
        {{1, 1, 1, 64}, 1.f, 0.f},    {{1, 1, 77, 64}, 1.f, 0.f},   {{1, 2, 128, 64}, 1.f, 0.f},
        {{1, 1, 129, 64}, 1.f, 0.f},  {{2, 3, 1000, 64}, 1.f, 0.f}, {{4, 32, 257, 64}, 1.f, 0.f},
        {{1, 4, 500, 64}, 8.f, 0.f},   /* sharp softmax */
        {{2, 4, 1000, 64}, 1.f, 20.f}, /* key offset 20 along a unit vector: the correction matters */
        {{1, 4, 777, 64}, 1.f, 128.f}, /* rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0);
    const CheckInputs bench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1);
    return test_summary();
}
