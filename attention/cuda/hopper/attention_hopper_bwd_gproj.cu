/*
 * attention/cuda/hopper/attention_hopper_bwd_gproj.cu - the Hopper (sm_90a) key-major pass of gproj mode's backward at
 * head size 64 (dK and dV only) on wgmma + TMA + a producer warpgroup and setmaxnreg, and the pass's entry
 * points for both head sizes (HS 128: attention_hopper_bwd128_gproj.cu). The API and which calls it serves:
 * attention/cuda/hopper/attention_hopper_bwd.cuh (the gproj section at its end).
 *
 * Why: on sm_90 gproj's backward is prep (D) + the Hopper row pass (attention_hopper_rows.cu: lambda and all
 * of dQ) + a key-major pass for dK and dV, and the portable mma.sync attn_bwd_kernel<64, ATTN_GPROJ>
 * (attention/cuda/attention_cuda.cu) in that role is the slow piece. bf16/repair's key-major pass is Hopper
 * (attention_hopper_bwd.cu); this kernel is that kernel's forms with gproj's numerics: no dQ GEMM, no
 * atomics, no dS staging (the row pass wrote dQ), and a third register-A GEMM into dK. Its lab is
 * dev/attention_lab/hopper_bwd_gproj.cu (probes, the pass against force_portable, timings): the all-Hopper
 * gproj backward is 1.16x / 1.21x faster than with the portable key-major pass at B8 H16 T1024 / B4 H16
 * T2048 d64, about 1.1x bf16's backward (dev/results/attention_hopper_2026-11-29.md).
 *
 * What it computes (docs/attention_numerics.md, gproj; attn_bwd_kernel<64, ATTN_GPROJ>'s rounding points):
 *   per key tile, for each query tile from the diagonal on (per consumer warpgroup, 64 keys x 64 queries):
 *     S^T = K Q^T, dP^T = V dO^T          (FP32, wgmma SS)
 *     P = exp2((S - m) c) * fl(1/l)        (repair's softmax, which gproj uses; stats {m, l})
 *     dS = P (dP - D)                      (FP32; D from the prep kernel, the BF16 O; masked entries exactly 0)
 *     dV += bf(P)^T dO                     (wgmma RS, A = the P accumulator repacked)
 *     dK += bf(dS)^T Q + bf(-lambda_q P)^T Q   (two wgmma RS batches into one accumulator; the second A
 *                                           operand is its own BF16 rounding of -lambda_q * P in FP32, as the
 *                                           portable kernel's `alp`: rounding dS - lambda P together would
 *                                           lose the correction)
 *   dK = bf(s dK_acc), dV = bf(dV_acc) into the k and v slots of dqkv. dQ is not touched.
 *   D and lambda [B*NH*T] are the workspace slots carve_workspace (attention_cuda.cu) names and the prep
 *   kernel (D) and the row pass (lambda) write.
 * Only the FP32 sum order differs from the portable kernel: dK sums the 4 k-steps of bf(dS) then the 4 of
 * the correction (the portable kernel interleaves them per 16 queries), and wgmma's k order. So dK and dV
 * agree with force_portable within a few BF16 ulps of the row scale (the lab: 4 ulps, never exceeded).
 *
 * Kernel layout: attention_hopper_bwd.cu's (one CTA = 128 keys of one (b, h), longest key tiles first over
 * all heads (tile_order.cuh); two consumer warpgroups of 64 keys; K/V once as two 64-row boxes, Q/dO tiles
 * of 64 queries double-buffered; full[s]: 32 producer lanes after the row state {m, fl(1/l), D, lambda},
 * plus the TMA bytes; empty[s]: the 256 consumer threads), except that the producer is a whole warpgroup
 * (one warp of it works) and setmaxnreg gives the consumers 232 registers (40 to the producer): with a
 * producer warp (288 threads, 168 registers each) the third A operand costs 92 bytes of spills.
 * Registers (-Xptxas -v, CUDA 13.0): the kernel 168 at entry (the launch bound; 232 after setmaxnreg), 0
 * bytes of spills, no C75xx warnings: 0 spills is also the sign that setmaxnreg took effect (the same code
 * without setmaxnreg.inc spills at 168: 24 bytes). The probe 186, 0 spills. Re-check after any change
 * with the nvcc line of `make -n build/attention/cuda/hopper/attention_hopper_bwd_gproj.cu.o` plus -Xptxas -v.
 *
 * Hangs (a pipeline protocol bug): every mbarrier wait is bounded (~10 s of clock64, as
 * attention_hopper_bwd.cu). The consumers do not trap: a __trap() on their path can make ptxas ignore
 * setmaxnreg.inc (260 bytes of spills in a lab variant of the HS-64 bf16 pass; here a trap in the full[s]
 * wait happens to compile to 0 spills with CUDA 13.0, a property no edit would keep in view), and no consumer may
 * leave early (the .sync.aligned wgmmas need the whole warpgroup). So a wait that runs out GIVES UP
 * (hopper_bwd_common.cuh's mbar_wait_give_up, as attention_hopper_bwd128.cu): it records the barrier in the
 * hang record (when attention_hopper_bwd_watch_hangs installed one; the first site of the grid wins) and
 * sets the CTA's abort flag, after which every wait of the CTA returns at once; the consumers run to the
 * end and write NaN over their dK and dV rows instead of numbers, so the result is loudly wrong (the
 * trainer's NaN check, every test), never silently. The producer warp traps once its CTA gave up (its own
 * empty[s] wait or a consumer's): the launch ends with a CUDA error and no copy of the abandoned pipeline is
 * left in flight into shared memory the SM hands to the next CTA; ptxas keeps the register split with that
 * trap (-Xptxas -v: 0 spills). setmaxnreg itself cannot be bounded (the split is exact: it never waits on
 * another CTA).
 *
 * Not done: D fused into the row pass. fp32 mode's key-major pass (it also computes dQ: three BF16 terms of
 * dS through shared memory and atomics) is attention_hopper_bwd64_fp32.cu.
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

constexpr int kHS = ATTN_HOPPER_BWD_HS; /* the only head size */
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
/* + a producer warpgroup after the consumers (one warp of it works); setmaxnreg moves its registers to the
   consumers. __launch_bounds__(384, 1) starts every thread at 168 registers; the producer warpgroup drops
   to 40 and the consumers rise to 232: 128 * 40 + 256 * 232 = 384 * 168 (attention_hopper_bwd.cu's split). */
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
constexpr size_t kTmaAlignBytes = 16;   /* global address alignment TMA requires */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(ATTN_HOPPER_BWD_PROBE_TILE == kBlockQ && ATTN_HOPPER_BWD_PROBE_TILE == kWarpgroupKeys,
              "the probe's tile is one consumer warpgroup step");

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
static_assert(SmemPlan::kKeyTileBytes == KeymajorTiles<1>::kKeyTileBytes &&
                  SmemPlan::kQTileBytes == KeymajorTiles<1>::kQTileBytes &&
                  SmemPlan::kBoxBytes == KeymajorTiles<1>::kBoxBytes && kBlockK == KeymajorTiles<1>::kBlockK &&
                  kBlockQ == KeymajorTiles<1>::kBlockQ && kHS == 64,
              "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");

/* ---- bounded mbarrier waits (see the file comment, "Hangs") ---- */

constexpr long long kHangCycles = 20000000000ll; /* ~10 s at 1.98 GHz; a legitimate wait is microseconds */
/* This translation unit's copy of the record pointer (a __device__ variable belongs to one object without
   relocatable device code): set through attention_hopper_bwd_watch_hangs, which installs the one record for
   every Hopper backward kernel. NULL (the default): no record, the NaN rows (or the trap) still show. */
__device__ AttnHopperHang* g_gproj_hang_record;

/* Every wait of the kernel and the probe: hopper_bwd_common.cuh's mbar_wait_give_up on this file's record
   (returns at once once the CTA gave up; on running out records the site and sets cta_abort). The producer
   warp traps after a wait that returned on cta_abort (the file comment, "Hangs"). */
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_gproj_hang_record);
}

/* The key-major gproj pass. stats {m, l} per row (gproj's forward stores repair's stats), D and lambda
   [B*NH*T] from the workspace; writes the k and v slots of dqkv. */
__global__ void __launch_bounds__(kThreads, 1)
    gproj_keys_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                      const float* __restrict__ stats, const float* __restrict__ D, const float* __restrict__ lambda,
                      bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    __shared__ int cta_abort; /* set by a bounded wait that ran out (see mbar_wait_bounded) */
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
    /* the warpgroup index through a shuffle: ptxas then knows it is warp-uniform, so the setmaxnreg regions
       below are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        cta_abort = 0;
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads); /* full: 32 producer lanes (row state) */
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* its warps 1-3 have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 2 queries ---- */
        if (lane == 0) keymajor_load_kv<1>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            if (i >= kStages) {
                mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
                if (*static_cast<volatile int*>(&cta_abort) != 0) __trap(); /* see mbar_wait_bounded */
            }
            keymajor_stage_row_state<ATTN_GPROJ, kKeymajorLambdaInW>(row_state + s * kBlockQ, nullptr, stats, D,
                                                                     lambda, bh, T, q0, lane);
            keymajor_fill_stage<1>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map,
                                   &full[s], q0, h, NH, b, lane);
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

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s, &cta_abort);
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
                    keymajor_probs_column<ATTN_REPAIR>(st, dpt, row, j, e, query, key0, T, masked, c);
                }
            pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
        }

        /* dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: one batch of 12 wgmmas, the
           two dK ones chained on the same accumulator (wgmma orders same-accumulator operations); P and
           dS are dead while it runs (64 accumulator + 48 A registers in flight). */
        keymajor_gproj_dkv_batch<kHS>(dv, dk, pa, pds, plam, q_addr, do_addr);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
    }

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t); NaN instead
       if a wait of this CTA ran out (its accumulators are garbage: the result must not look fine) */
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, gave_up);
}

/* Layout probe of the new operand form: one warpgroup, one tile at token 0 of batch 0 (T < 64: zero fill),
   K and V in the SECOND 8 KB half of their tiles (warpgroup 1's offset), Q/dO in stage 1, a per-query
   lambda [64] from global memory in the row state's .w, no softmax:
     out_st   = S^T = K Q^T,  out_dpt = dP^T = V dO^T           (forms attention_hopper_bwd.cu's probe verified)
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
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
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
    uint32_t pa[kKSteps][4], pds[kKSteps][4], plam[kKSteps][4]; /* pa: unused here (attention_hopper_bwd.cu's probe checks it) */
#pragma unroll
    for (int kk = 0; kk < kKSteps; kk++) {
        float lam[2][2];
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++) lam[jj][e] = rs[16 * kk + 8 * jj + 2 * t + e].w;
        pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
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

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper gproj key-major pass)";

}  // namespace

int attention_hopper_gproj_keys_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout) {
    if (mode != ATTN_GPROJ || (s.HS != kHS && s.HS != ATTN_HOPPER_BWD128_HS)) return 0;
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0 && ((uintptr_t)dout % kTmaAlignBytes) == 0;
}

void attention_backward_hopper_gproj_keys(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          const float* stats, const float* D, const float* lambda,
                                          __nv_bfloat16* dqkv, cudaStream_t stream) {
    if (!attention_hopper_gproj_keys_supports(ATTN_GPROJ, s, qkv, dout)) {
        die("attention_backward_hopper_gproj_keys: unsupported call (B=%d NH=%d T=%d HS=%d, qkv %p, dout %p)\n"
            "  hint: head size %d or %d, B*NH <= 65535, qkv and dout 16-byte aligned; use attention_backward_cuda,"
            " which falls back to the portable kernels", s.B, s.NH, s.T, s.HS, (const void*)qkv, (const void*)dout,
            kHS, ATTN_HOPPER_BWD128_HS);
    }
    if (s.HS == ATTN_HOPPER_BWD128_HS) { /* attention_hopper_bwd128_gproj.cu */
        attention_backward_hopper_gproj_keys128(s, qkv, dout, stats, D, lambda, dqkv, stream);
        return;
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    cudaCheck(cudaFuncSetAttribute(gproj_keys_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, gproj_keys_kernel, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map, dout_map,
                               stats, D, lambda, dqkv, s.NH, s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS));
}

void attention_hopper_gproj_keys_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_gproj_hang_record, &device_ptr_of_mapped_record,
                                 sizeof device_ptr_of_mapped_record));
    attention_hopper_gproj_keys128_watch_hangs(device_ptr_of_mapped_record);
}

void attention_hopper_gproj_keys_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                              const __nv_bfloat16* dout, const float* lambda, float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_BWD_PROBE_TILE || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_gproj_keys_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d "
            "T=%d HS=%d head %d)", ATTN_HOPPER_BWD_PROBE_TILE, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t tile = (size_t)ATTN_HOPPER_BWD_PROBE_TILE * ATTN_HOPPER_BWD_PROBE_TILE;
    cudaCheck(cudaFuncSetAttribute(gproj_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    gproj_probe_kernel<<<1, 128, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda, tiles, tiles + tile,
                                                     tiles + 2 * tile, tiles + 3 * tile);
    cudaCheckLastError();
}
