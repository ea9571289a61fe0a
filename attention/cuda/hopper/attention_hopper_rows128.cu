/*
 * attention/cuda/hopper/attention_hopper_rows128.cu - the Hopper (sm_90a) query-major row pass of the backward at head size
 * 128 for gproj (lambda and all of dQ) and fp32 (D = sum_j P_ij dP_ij), on wgmma + TMA, a producer warpgroup and
 * setmaxnreg. The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (attention_backward_hopper_rows
 * dispatches here on HS 128; the HS-64 kernel is attention_hopper_rows.cu).
 *
 * Why: the portable row pass at HS 128 (the mma.sync attn_bwd_rows_kernel<128, MODE>, attention/cuda/attention_cuda.cu)
 * is what keeps gproj (and fp32) at HS 128 far from bf16, and HS 64's kernel does not stretch (its DSK and PK
 * accumulators alone would be 128 registers per thread). Its lab, dev/attention_lab/hopper_rows128.cu, checks the
 * layout (all four products) and the pass against the portable production backward: D, lambda and dQ BIT-EQUAL on
 * every row and element checked (10 shapes per mode, T 1..1000, sharp and offset-key cases). The pass alone is
 * 1.5-1.8x (gproj) and 1.8-2.3x (fp32) faster than the portable one at B8 H8 T1024 / B2 H16 T4096 d128
 * (dev/results/attention_hopper_2026-11-29.md). Beyond the lab's kernel, production adds the hang handling below.
 *
 * What it computes (docs/attention_numerics.md; attn_bwd_rows_kernel operation for operation, only the FP32 sums
 * inside the tensor core may differ in order), per query row i over its visible keys j <= i:
 *   S = Q K^T, dP = dO V^T (FP32, wgmma SS, both K-major, 8 k-steps over the two 64-column chunks of HS);
 *   P_ij = exp2((S_ij - m_i) c) * fl(1 / l_i) from the forward's stats {m, l};
 *   gproj: dS = P (dP - D) (D_i = dO_i . O_i from the portable prep kernel), r_i = sum_j bf(dS_ij),
 *          p_i = sum_j bf(P_ij) (per lane in key order, then the quad: the portable order),
 *          lambda_i = r_i / p_i (0 if p_i = 0); DSK_i = sum_j bf(dS_ij) K_j, PK_i = sum_j bf(P_ij) K_j (wgmma RS
 *          m64n128k16, K read N-major); dQ_i = bf(s * fma(-lambda_i, PK_i, DSK_i)) into the q slot of dqkv;
 *   fp32:  D_i = sum_j P_ij dP_ij (per lane in key order, then the quad).
 * The workspace contract is production's (carve_workspace: dq_acc [rows HS], D [rows], lambda [rows]): gproj reads
 * D and writes lambda, fp32 writes D; the key-major pass then runs on them unchanged.
 *
 * Layout (HS 64's kernel stretched; FlashAttention-3's register split for two math warpgroups, read in
 * Dao-AILab/flash-attention hopper/, no code copied): one CTA = 128 query rows of one (b, h), longest rows first
 * (attn_tile_longest_first); warpgroups 0 and 1 consume 64 rows each, warpgroup 2 is the producer (one lane issues
 * TMA; setmaxnreg 24 there, 240 in the consumers: 128 * 24 + 256 * 240 = 64512 <= 384 * 168, as
 * attention_hopper_bwd128.cu). Q and dO (128 rows x 2 chunks, 32 KB each) are loaded once; K and V tiles of 128
 * keys x 2 chunks (32 KB each), two stages, full/empty mbarriers (192 KB + barriers). qkv and dout are
 * hopper_wgmma.cuh's 4-D TMA tensors {HS, heads, T, B} in 64-column boxes of 128 tokens (128-byte swizzle, zero
 * fill past T). Each 128-key tile is worked in two 64-key halves:
 *   S, dP of the half (m64n64k16 SS, 32 + 32 regs) -> P, dS in place -> packed BF16 A operands (16 + 16)
 *   -> DSK += bf(dS) K_half, PK += bf(P) K_half (m64n128k16 RS, LBO = one 16 KB chunk; 64 + 64 regs).
 * The layouts no other kernel uses, checked exact by the layout probe (attention_hopper_rows128_layout_probe,
 * the lab's first section): (a) m64n64k16 SS over 8 k-steps with the chunk jump, both operands 64-row slices (8 KB
 * into 16 KB chunks) of 128-row tiles; (b) m64n128k16 RS with K N-major from row 0 and row 64 of a 128-row tile,
 * LBO 16 KB; (c) the K/V tiles of stage 1 (32 KB offsets).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3; `make hopper_rows128-regs` prints them): kernel 168 at entry (240
 * after setmaxnreg.inc), 0 B spill, no C75xx warning, gproj and fp32; layout probe (256 threads, no setmaxnreg)
 * 255, 0 spill.
 *
 * Hangs (as attention_hopper_bwd128.cu, through attention/cuda/hopper/hopper_bwd_common.cuh): every mbarrier wait is bounded
 * (~2 s of clock64; a legitimate wait is microseconds) and does NOT trap (a __trap() on the consumer path makes
 * ptxas ignore setmaxnreg.inc). A wait that gives up records the barrier in the host-mapped AttnHopperHang record
 * (when attention_hopper_bwd_watch_hangs installed one; first give-up wins; this pass's sites: ATTN_HANG_KV_FULL =
 * q_full, the Q/dO tiles loaded once; ATTN_HANG_FULL = full[s], the K/V tiles of stage s; ATTN_HANG_EMPTY = empty[s];
 * ATTN_HANG_PROBE = the probe's tiles), sets the CTA's abort flag (every later wait of the CTA returns at once) and
 * runs on; at the end the consumers, after a barrier that makes every give-up of the CTA visible (the producer's
 * give-up precedes its arrival on a full barrier that every consumer waited for), write NaN over all their outputs
 * (gproj: lambda and the dQ rows; fp32: D) instead of values. So a hang ends within seconds as NaN gradients (the
 * tests' finiteness checks and the trainer's NaN check fail loudly), never as a stuck job or silently wrong numbers.
 *
 * After it the key-major pass reads the D and lambda slots: on sm_90 gproj's (attention_hopper_bwd128_gproj.cu)
 * or fp32's (attention_hopper_bwd128_fp32.cu), elsewhere the portable attn_bwd_kernel<128, MODE>.
 * Not done: overlap of one half's DSK/PK GEMMs with the next half's S/dP; 3 stages; D fused in.
 */
#include <math.h>
#include <stdint.h>
#include <type_traits>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/hopper/hopper_rows_common.cuh"
#include "attention/cuda/launch_overlap.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_ROWS128_HS; /* the head size of this kernel */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row (one TMA box width) */
static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
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
/* which mbarrier a bounded wait gave up on (attention_hopper_bwd.cuh's sites: "the tiles loaded once" and "the
   tiles of a stage", here Q/dO and K/V) */
constexpr int kHangQdo = ATTN_HANG_KV_FULL; /* q_full: Q and dO, loaded once */
constexpr int kHangKv = ATTN_HANG_FULL;     /* full[s]: the K/V tiles of stage s */

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

/* bounded mbarrier waits that give up (see the file comment: no trap under setmaxnreg) */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
/* set by attention_hopper_bwd_watch_hangs (through attention_hopper_rows128_watch_hangs); NULL: no record */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads). */
__device__ __forceinline__ void consumers_sync() { named_bar_sync(1, kConsumerThreads); }

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
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

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
                    mbar_wait_bounded(&empty[s], (uint32_t)((kt / kStages - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
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
    load_row_state<kGproj>(row_m, row_rl, row_D, stats, D, bh, T, row0);
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

            /* P, dS and the row sums (the mask only where it can bite) */
            const int key0 = kt * kBlockK + sub * kSubKeys;
            if (tile_masked)
                row_probs_and_sums<kGproj, true>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, key0, row0, t, T, c);
            else
                row_probs_and_sums<kGproj, false>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, key0, row0, t, T, c);

            if constexpr (kGproj) {
                uint32_t pa[kKeySteps][4], dsa[kKeySteps][4];
                pack_acc_a_operand(pa, sacc);
                pack_acc_a_operand(dsa, dpacc);
                warpgroup_rs_k<kDqRegs, true>(dsk, pk, dsa, pa, k_half, SmemPlan::kChunkBytes);
            }
        }
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s */
    }

    store_row_outputs<kGproj, kHS>(acc_a, acc_b, dsk, pk, D, lambda, dqkv, bh, b, h, NH, T, row0, t, scale);

    /* A wait of this CTA that gave up (consumer or producer; the producer's give-up precedes an arrival on
       full that every consumer waited for) is visible to every consumer thread after this barrier. Then the
       CTA's outputs just written are overwritten with NaN (the same thread, the same addresses: program order
       makes NaN the final value; written after the values, not instead of them, so the 240-register path above
       keeps no extra register live: ptxas spilled with a select per store). */
    consumers_sync();
    if (*static_cast<volatile int*>(&cta_abort) != 0) {
        const float kNan = __int_as_float(0x7FC00000); /* a quiet NaN */
        constexpr uint32_t kNanPair = 0x7FC07FC0u;     /* two BF16 quiet NaNs */
        const long long qkv_row = 3LL * NH * kHS;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int query = row0 + 8 * r;
            if (query >= T) continue;
            const long long idx = (long long)bh * T + query;
            if (t == 0) {
                if (kGproj) lambda[idx] = kNan;
                else D[idx] = kNan;
            }
            if (kGproj) {
                bf16* dq_row = dqkv + ((long long)b * T + query) * qkv_row + (long long)h * kHS + 2 * t;
#pragma unroll
                for (int n = 0; n < kHS / 8; n++) *reinterpret_cast<uint32_t*>(dq_row + 8 * n) = kNanPair;
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
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
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
        store_fragment_rows(s_out, dp_out, sacc, dpacc, row0, sub * kSubKeys, kBlockK, t);
        uint32_t sa[kKeySteps][4], dpa[kKeySteps][4];
        pack_acc_a_operand(sa, sacc);
        pack_acc_a_operand(dpa, dpacc);
        /* the kernel's call: (DSK, PK) <- (bf(dP) K, bf(S) K) */
        warpgroup_rs_k<kDqRegs, true>(y, x, dpa, sa, k_half, SmemPlan::kChunkBytes);
    }
    store_fragment_rows(x_out, y_out, x, y, row0, 0, kHS, t);
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper row pass, HS 128)";

template <int MODE>
void hopper_rows128_launch(AttnShape s, const CUtensorMap& qkv_map, const CUtensorMap& dout_map, const float* stats,
                           float* D, float* lambda, bf16* dqkv, cudaStream_t stream) {
    cudaCheck(cudaFuncSetAttribute(hopper_rows128_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockQ), (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, hopper_rows128_kernel<MODE>, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map,
                               dout_map, stats, D, lambda, dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                               attn_exp2_scale(kHS));
}

}  // namespace

void attention_backward_hopper_rows128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                       const float* stats, float* D, float* lambda, __nv_bfloat16* dqkv,
                                       cudaStream_t stream) {
    if (s.HS != kHS || (mode != ATTN_GPROJ && mode != ATTN_FP32)) {
        die("attention_backward_hopper_rows128: HS %d, mode %d (needs HS %d, gproj or fp32)\n"
            "  hint: call attention_backward_hopper_rows (or attention_backward_cuda), which checks support",
            s.HS, (int)mode, kHS);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBlockK, kWho, "dout");
    if (mode == ATTN_GPROJ) hopper_rows128_launch<ATTN_GPROJ>(s, qkv_map, dout_map, stats, D, lambda, dqkv, stream);
    else hopper_rows128_launch<ATTN_FP32>(s, qkv_map, dout_map, stats, D, lambda, dqkv, stream);
}

void attention_hopper_rows128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

void attention_hopper_rows128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                           float* s_tile, float* dp_tile, float* x_tile, float* y_tile) {
    if (s.B != 1 || s.T > ATTN_HOPPER_ROWS_PROBE_ROWS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_rows128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d "
            "T=%d HS=%d head %d)", ATTN_HOPPER_ROWS_PROBE_ROWS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    static_assert(ATTN_HOPPER_ROWS_PROBE_ROWS == kBlockQ && ATTN_HOPPER_ROWS_PROBE_ROWS == kBlockK,
                  "the probe covers one CTA's query rows and one key tile");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBlockK, kWho, "dout");
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, s_tile, dp_tile,
                                                                    x_tile, y_tile);
    cudaCheckLastError();
}
