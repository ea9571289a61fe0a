/*
 * dev/attention_lab/hopper_fwd_v2.cuh - two lab variants of the Hopper (sm_90a) forward at head size 64, built
 * on production's kernel (attention/attention_hopper.cu: intra-warpgroup overlap, producer warpgroup,
 * setmaxnreg, separate K and V stage barriers), to be timed against it in dev/attention_lab/hopper_fwd.cu
 * before any of it moves into the library. Status (session 6, after s6 call 4): v2 at 2 stages IS production at
 * head size 64 now (attention/attention_hopper.cu's hopper_fwd_tall_kernel, PTX-identical to fwd_kernel<64, M, S,
 * 3, false> here but for names), so the lab reaches it through attention_forward_hopper ("prod"); forward_v2
 * stays for experiments on top of it. v3 measured 1.02-1.06x the old production: not adopted, lab only.
 *   v2: THREE consumer warpgroups, 192 query rows per CTA (FlashAttention-3's tile height at head dim 64:
 *       hopper/tile_size.h; the idea read there, no code copied). At HS 64 a warpgroup's per-tile GEMMs are
 *       short (S: 64 x 128 x 64), so a CTA of two warpgroups leaves the tensor core idle during their
 *       softmaxes; a third warpgroup sharing the same K/V tiles gives it more work per loaded tile and
 *       amortises the producer, the barriers and the K/V traffic over 1.5x the query rows.
 *   v3: PING-PONG between production's two consumer warpgroups (128 rows): named barriers order
 *       warpgroup 0's GEMM batch of an iteration before warpgroup 1's, and warpgroup 1's before warpgroup 0's
 *       next, so one warpgroup's softmax runs while the other's GEMMs run (FlashAttention-3's "warp
 *       scheduler barrier", read in hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp; no code copied).
 * Both keep the exact sequence of operations on O, m and l of every row (rows are independent; the key tile
 * is still 128 keys, so each row sees the same key tiles and the same running maxima), so O and the stats
 * must be bit-identical to v0/v1 in every mode: the lab checks that.
 *
 * What changes against production, v2:
 * - CTA = 192 query rows (kWarpgroupRows x NWG), grid ceil(T / 192) x B*NH, the same longest-first tile
 *   order (attention/tile_order.cuh) on it. Q comes through production's one tensor map (128-row boxes,
 *   one map encoded per call like production, since the lab times the call): two boxes, the second one's
 *   last 64 rows unused (Q's region is 256 rows, 32 KB: 96 KB in all at 2 stages); a box starting at or
 *   past T is not loaded.
 * - Per-warpgroup key range: a 192-row tile spans parts of two 128-key diagonal tiles, so warpgroup wg
 *   (rows r0 = q0 + 64 wg .. r0 + 63, all inside one 128-key tile since r0 is a multiple of 64) runs
 *   n_wg = (min(r0 + 64, T) - 1) / 128 + 1 key tiles - fewer than the CTA's last one when its rows end
 *   before it - and masks only its own last tile (the only one with a key past its first row). The tiles
 *   it skips it still releases (waits for the tile's full barrier, then arrives on its empty barrier), so
 *   the empty barriers keep counting every consumer thread once per tile and the phases stay in step. A
 *   warpgroup whose rows all lie at or past T reads no Q and only releases.
 * - Registers: 512 threads at __launch_bounds__(512, 1) start at 128 each; setmaxnreg gives the producer
 *   24 and the consumers 160 (128 x 24 + 384 x 160 = 64512 <= 65536). The overlap at HS 64 holds S (64),
 *   O (32) and P(kt-1) (32 packed BF16 pairs) during the softmax: fits. fp32 mode's P has two terms
 *   (64 registers), which cannot also hold S and O in 160, so v2's fp32 mode runs each tile in sequence
 *   (v0's order: S, softmax, P V, no overlap) - still 192 rows, still bit-identical.
 * v3 (PINGPONG): production's CTA (NWG = 2, 240 registers); before a warpgroup issues an iteration's
 *   GEMMs (tile 0's S, each (S(kt), P(kt-1) V(kt-1)) batch, the last P V) it waits on named barrier
 *   kPingBarrier + wg (256 threads: its own 128 sync, the other warpgroup's 128 arrive), and right after
 *   committing them it arrives on the other warpgroup's barrier. Warpgroup 1 pre-arrives once on
 *   warpgroup 0's barrier, so warpgroup 0 goes first. Both warpgroups of a CTA must pass the same number
 *   of turns, or a bar.sync never completes: in a 128-row CTA both have n_key_tiles + 1 turns except a
 *   warpgroup whose rows all lie at or past T, which takes its n_key_tiles + 1 turns empty-handed (sync,
 *   arrive) while releasing tile j after turn j (after all turns would deadlock: the other warpgroup's
 *   turn j needs tile j, which the producer loads only once tile j - STAGES is released by everyone).
 *   Warpgroup 1's last arrival would be left pending on warpgroup 0's barrier, so warpgroup 0 ends with one
 *   more sync on it (n_key_tiles + 2 syncs against 1 + n_key_tiles + 1 arrivals). A turn-count mismatch
 *   would be a hang: the lab's hang watch names it.
 * Bounded waits: as production (every mbarrier phase completes after a finite number of copies and
 * arrivals; the named barriers after a finite number of turns). No __trap() on the consumer path.
 *
 * Offers (namespace hopper_fwd_v2): forward_v2(mode, shape, qkv, out, stats, stages, stream) (2 or 3 K/V
 * stages; HS 64 only: HS 128
 * keeps two warpgroups, i.e. the production kernel, the caller's choice), forward_v3(...) (HS 64 and 128),
 * and kConsumerRegs<NWG> for the report. The caller checks attention_hopper_fwd_supports. Compiled for
 * sm_90a only (the including object is built with -gencode arch=compute_90a,code=sm_90a).
 */
#ifndef DEV_ATTENTION_LAB_HOPPER_FWD_V2_CUH
#define DEV_ATTENTION_LAB_HOPPER_FWD_V2_CUH

#include <math.h>
#include <stdint.h>
#include "attention/attention_hopper.cuh"
#include "attention/tile_order.cuh"
#include "attention/hopper_wgmma.cuh"

namespace hopper_fwd_v2 {

using namespace hopper_wgmma;

constexpr int kBlockK = ATTN_HOPPER_BLOCK_K; /* keys per K/V tile (128, as production: same running maxima) */
constexpr int kWarpgroupRows = 64;           /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kChunkCols = 64;               /* BF16 columns per 128-byte swizzle row */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes; /* 8 rows x 128 B: the repeat of the 128B swizzle */
constexpr int kWgmmaK = 16;                  /* k of every bf16 wgmma */
constexpr int kPvSteps = kBlockK / kWgmmaK;
constexpr int kSRegs = kBlockK / 2;          /* S accumulator: 64 x kBlockK FP32 over 128 threads */
constexpr uint32_t kUnusedLbo = 16;          /* K-major swizzled operands ignore LBO ("assumed 1", i.e. 16 bytes) */
constexpr int kMaxDynamicSmem = 227 * 1024;  /* sm_90's per-block opt-in limit */
constexpr int kProducerRegs = 24;
constexpr int kPingBarrier = 1;              /* named barriers 1, 2 (0 is __syncthreads) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

template <int NWG>
struct CtaShape {
    static constexpr int kRows = kWarpgroupRows * NWG;     /* query rows per CTA */
    static constexpr int kConsumerThreads = 128 * NWG;
    static constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
    static constexpr int kLaunchRegs = (65536 / kThreads) > 255 ? 255 : (65536 / kThreads) / 8 * 8;
    /* the largest multiple of 8 that the consumers can take after the producer gave back to 24 (max 240) */
    static constexpr int kConsumerRegsRaw = (kThreads * kLaunchRegs - 128 * kProducerRegs) / kConsumerThreads / 8 * 8;
    static constexpr int kConsumerRegs = kConsumerRegsRaw > 240 ? 240 : kConsumerRegsRaw;
    static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
                  "the setmaxnreg split must fit in what the CTA was launched with");
};
static_assert(CtaShape<2>::kLaunchRegs == 168 && CtaShape<2>::kConsumerRegs == 240, "production's split");
static_assert(CtaShape<3>::kLaunchRegs == 128 && CtaShape<3>::kConsumerRegs == 160, "v2's split (24 / 160)");

/* Shared-memory plan (byte offsets from a 1024-byte aligned base): Q = HS/64 chunks of [kRows][128 B];
   K and V of each stage = HS/64 chunks of [kBlockK][128 B]; all swizzled. */
template <int HS, int STAGES, int NWG>
struct SmemPlan {
    static constexpr int kChunks = HS / kChunkCols;
    /* Q arrives in boxes of kBlockK rows (the one tensor map's box), so its region is rounded up to them */
    static constexpr int kQBoxes = (CtaShape<NWG>::kRows + kBlockK - 1) / kBlockK;
    static constexpr int kQChunkBytes = kQBoxes * kBlockK * kSwizzleRowBytes;
    static constexpr int kWgQBytes = kWarpgroupRows * kSwizzleRowBytes; /* one warpgroup's rows of a chunk */
    static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;
    static constexpr int kTileBytes = kChunks * kChunkBytes;
    static constexpr int kQ = 0;
    static constexpr int kK = kQ + kChunks * kQChunkBytes;
    static constexpr int kV = kK + STAGES * kTileBytes;
    static constexpr int kBarriers = kV + STAGES * kTileBytes;
    static constexpr int kNumBarriers = 1 + 4 * STAGES; /* q_full, full_k, empty_k, full_v, empty_v [STAGES] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes;
    static_assert(kWgQBytes % kSwizzleAtomBytes == 0 && kChunkBytes % kSwizzleAtomBytes == 0,
                  "tiles and each warpgroup's Q rows must stay 1024-byte aligned");
    static_assert(kAlloc <= kMaxDynamicSmem, "Q + STAGES x (K + V) tiles must fit in 227 KB of shared memory");
};

/* ---- production's per-warpgroup pieces (attention/attention_hopper.cu), copied: Q's chunk stride is a
   parameter here (the Q tile is taller than a K tile) ---- */

template <int HS, int kQChunkBytes>
__device__ __forceinline__ void issue_qk(float (&sacc)[kSRegs], uint32_t q_addr, uint32_t k_addr) {
    constexpr int kKChunkBytes = kBlockK * kSwizzleRowBytes;
    constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK;
#pragma unroll
    for (int kk = 0; kk < HS / kWgmmaK; kk++) {
        const uint32_t in_row = (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        const uint32_t chunk = kk / kKStepsPerChunk;
        wgmma_m64n128k16_ss(sacc, make_smem_desc(q_addr + chunk * kQChunkBytes + in_row, kUnusedLbo, kSwizzleAtomBytes),
                            make_smem_desc(k_addr + chunk * kKChunkBytes + in_row, kUnusedLbo, kSwizzleAtomBytes));
    }
}
__device__ __forceinline__ void zero_scores(float (&sacc)[kSRegs]) {
#pragma unroll
    for (int i = 0; i < kSRegs; i++) sacc[i] = 0.f;
    reg_fence(sacc);
}

template <int MODE>
struct POperand {
    static constexpr int kTerms = (MODE == ATTN_FP32) ? 2 : 1;
    uint32_t a[kTerms][kPvSteps][4];
};
template <bool kResidual>
__device__ __forceinline__ uint32_t pack_p_pair(float lo, float hi) {
    if (kResidual) {
        lo -= __bfloat162float(__float2bfloat16_rn(lo));
        hi -= __bfloat162float(__float2bfloat16_rn(hi));
    }
    return pack_bf16x2(lo, hi);
}
template <bool kResidual>
__device__ __forceinline__ void pack_p_operand(uint32_t (&pa)[kPvSteps][4], const float (&sacc)[kSRegs]) {
#pragma unroll
    for (int kk = 0; kk < kPvSteps; kk++) {
        pa[kk][0] = pack_p_pair<kResidual>(sacc[8 * kk + 0], sacc[8 * kk + 1]);
        pa[kk][1] = pack_p_pair<kResidual>(sacc[8 * kk + 2], sacc[8 * kk + 3]);
        pa[kk][2] = pack_p_pair<kResidual>(sacc[8 * kk + 4], sacc[8 * kk + 5]);
        pa[kk][3] = pack_p_pair<kResidual>(sacc[8 * kk + 6], sacc[8 * kk + 7]);
    }
}
template <int MODE>
__device__ __forceinline__ void pack_p(POperand<MODE>& p, const float (&sacc)[kSRegs]) {
    pack_p_operand<false>(p.a[0], sacc);
    if constexpr (POperand<MODE>::kTerms == 2) pack_p_operand<true>(p.a[1], sacc);
}
template <int HS>
__device__ __forceinline__ void issue_pv(float (&o)[HS / 2], const uint32_t (&pa)[kPvSteps][4], uint32_t v_addr) {
    constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;
#pragma unroll
    for (int kk = 0; kk < kPvSteps; kk++)
        wgmma_pv(o, pa[kk], make_smem_desc(v_addr + kk * kWgmmaK * kSwizzleRowBytes, kChunkBytes, kSwizzleAtomBytes));
}
template <int HS, int MODE>
__device__ __forceinline__ void issue_pv_terms(float (&o)[HS / 2], const POperand<MODE>& p, uint32_t v_addr) {
#pragma unroll
    for (int term = 0; term < POperand<MODE>::kTerms; term++) issue_pv<HS>(o, p.a[term], v_addr);
}
template <int HS, int MODE>
__device__ __forceinline__ void pv_retired(float (&o)[HS / 2], POperand<MODE>& p) {
    reg_fence(o);
#pragma unroll
    for (int term = 0; term < POperand<MODE>::kTerms; term++) reg_fence(p.a[term]);
}

/* production's softmax_tile, operation for operation */
template <int MODE>
__device__ __forceinline__ void softmax_tile(float (&sacc)[kSRegs], float (&m_run)[2], float (&l_part)[2],
                                             float (&alpha)[2], bool masked, int key0, int row0, int t, float c) {
    if (masked) {
#pragma unroll
        for (int j = 0; j < kBlockK / 8; j++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (key0 + 8 * j + 2 * t + e > row0 + 8 * r) sacc[4 * j + 2 * r + e] = -INFINITY;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBlockK / 8; j++) mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * r], sacc[4 * j + 2 * r + 1]));
        mx = quad_max(mx);
        const float m_new = fmaxf(m_run[r], mx);
        alpha[r] = exp2f((m_run[r] - m_new) * c);
        const float m_c = m_new * c;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kBlockK / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float sc = sacc[4 * j + 2 * r + e];
                const float x = (MODE == ATTN_BF16) ? __fmaf_rn(sc, c, -m_c) : (sc - m_new) * c;
                const float p = exp2f(x);
                sacc[4 * j + 2 * r + e] = p;
                sum += p;
            }
        l_part[r] = l_part[r] * alpha[r] + sum;
        m_run[r] = m_new;
    }
}
template <int HS>
__device__ __forceinline__ void rescale_o(float (&o)[HS / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            o[4 * n + 2 * r] *= alpha[r];
            o[4 * n + 2 * r + 1] *= alpha[r];
        }
}

/* Producer: one K or V tile (index j) into its stage, after the consumers released tile j - STAGES. */
template <int HS, int STAGES, int NWG>
__device__ __forceinline__ void produce_tile(unsigned char* tiles, uint64_t* full, uint64_t* empty,
                                             const CUtensorMap* map, int j, int slot, int NH, int h, int b) {
    using Plan = SmemPlan<HS, STAGES, NWG>;
    const int s = j % STAGES;
    if (j >= STAGES) mbar_wait(&empty[s], (uint32_t)((j / STAGES - 1) & 1));
    mbar_arrive_expect_tx(&full[s], Plan::kTileBytes);
    for (int ch = 0; ch < Plan::kChunks; ch++)
        tma_load_4d(tiles + s * Plan::kTileBytes + ch * Plan::kChunkBytes, map, &full[s], ch * kChunkCols,
                    slot * NH + h, j * kBlockK, b);
}

/* v3's turn taking: wait until the other warpgroup has issued its GEMMs (then issue ours), and after
   committing ours let the other one go. No-ops without PINGPONG. */
template <bool PINGPONG>
__device__ __forceinline__ void turn_begin(int wg) {
    if constexpr (PINGPONG) named_bar_sync(kPingBarrier + wg, 256);
}
template <bool PINGPONG>
__device__ __forceinline__ void turn_end(int wg) {
    if constexpr (PINGPONG) named_bar_arrive(kPingBarrier + (1 - wg), 256);
}

/* Releases key tile kt that this warpgroup does not read: after it landed (so the arrivals count toward that
   tile's phase of the empty barriers), one arrival per thread on each. */
template <int STAGES>
__device__ __forceinline__ void release_tile(uint64_t* full_k, uint64_t* empty_k, uint64_t* full_v, uint64_t* empty_v,
                                             int kt) {
    const int s = kt % STAGES;
    const uint32_t parity = (uint32_t)((kt / STAGES) & 1);
    mbar_wait(&full_k[s], parity);
    mbar_arrive(&empty_k[s]);
    mbar_wait(&full_v[s], parity);
    mbar_arrive(&empty_v[s]);
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel: NWG consumer warpgroups (2 or 3), optional ping-pong (NWG == 2 only)                   */
/* ------------------------------------------------------------------------------------------------ */
template <int HS, int MODE, int STAGES, int NWG, bool PINGPONG>
__global__ void __launch_bounds__(CtaShape<NWG>::kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap qkv_map, bf16* __restrict__ out, float* __restrict__ stats, int NH,
               int T, float scale, float c) {
    using Cta = CtaShape<NWG>;
    using Plan = SmemPlan<HS, STAGES, NWG>;
    static_assert(!PINGPONG || NWG == 2, "ping-pong alternates two warpgroups");
    constexpr int kTileBytes = Plan::kTileBytes;
    constexpr int kORegs = HS / 2;
    /* the overlap keeps P(kt-1) live beside S and O: fp32's two-term P does not fit in 160 registers */
    constexpr bool kOverlap = !(MODE == ATTN_FP32 && Cta::kConsumerRegs < 200);
    static_assert(kOverlap || !PINGPONG, "the turns are placed in the overlapped loop only");

    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full_k = q_full + 1;
    uint64_t* empty_k = full_k + STAGES;
    uint64_t* full_v = empty_k + STAGES;
    uint64_t* empty_v = full_v + STAGES;

    const AttnTileOrder order = attn_tile_longest_first();
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int q0 = q_tile * Cta::kRows;
    const int n_key_tiles = (min(q0 + Cta::kRows, T) - 1) / kBlockK + 1; /* the CTA's: the producer loads these */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        init_pipeline_barriers<STAGES>(q_full, full_k, empty_k, 1, Cta::kConsumerThreads);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full_v[s], 1);
            mbar_init(&empty_v[s], Cta::kConsumerThreads);
        }
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();

    if (warpgroup == NWG) {
        setmaxnreg_dec<kProducerRegs>();
        if (warp == 4 * NWG && lane == 0) {
            /* Q: boxes of 128 rows through the K/V map (v2's second box carries 64 rows past the CTA's 192,
               unused); a box that starts at or past T is not loaded (its warpgroup only releases tiles) */
            const int q_boxes = min(Plan::kQBoxes, (T - q0 + kBlockK - 1) / kBlockK);
            mbar_arrive_expect_tx(q_full, q_boxes * Plan::kChunks * Plan::kChunkBytes);
            for (int w = 0; w < q_boxes; w++)
                for (int ch = 0; ch < Plan::kChunks; ch++)
                    tma_load_4d(q_s + ch * Plan::kQChunkBytes + w * Plan::kChunkBytes, &qkv_map, q_full,
                                ch * kChunkCols, kSlotQ * NH + h, q0 + w * kBlockK, b);
            produce_tile<HS, STAGES, NWG>(k_s, full_k, empty_k, &qkv_map, 0, kSlotK, NH, h, b);
            for (int kt = 1; kt < n_key_tiles; kt++) {
                produce_tile<HS, STAGES, NWG>(k_s, full_k, empty_k, &qkv_map, kt, kSlotK, NH, h, b);
                produce_tile<HS, STAGES, NWG>(v_s, full_v, empty_v, &qkv_map, kt - 1, kSlotV, NH, h, b);
            }
            produce_tile<HS, STAGES, NWG>(v_s, full_v, empty_v, &qkv_map, n_key_tiles - 1, kSlotV, NH, h, b);
        }
        return;
    }
    setmaxnreg_inc<Cta::kConsumerRegs>();

    const int wg = warpgroup, g = lane >> 2, t = lane & 3;
    const int wg_row0 = q0 + wg * kWarpgroupRows;
    const int row0 = wg_row0 + (warp % 4) * 16 + g;
    /* this warpgroup's key tiles: up to the one holding its last row before T (0 if none) */
    const int n_tiles = wg_row0 < T ? (min(wg_row0 + kWarpgroupRows, T) - 1) / kBlockK + 1 : 0;
    const uint32_t k_base = smem_u32(k_s), v_base = smem_u32(v_s);
    int first_unreleased = n_tiles; /* the tiles from here on this warpgroup only releases */
    if (PINGPONG && wg == 1) named_bar_arrive(kPingBarrier + 0, 256); /* warpgroup 0 takes the first turn */

    if (n_tiles > 0) {
        float o[kORegs];
#pragma unroll
        for (int i = 0; i < kORegs; i++) o[i] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY};
        float l_part[2] = {0.f, 0.f};
        float alpha[2];
        float sacc[kSRegs];
        const uint32_t q_addr = smem_u32(q_s) + wg * Plan::kWgQBytes;
        mbar_wait(q_full, 0);

        if constexpr (kOverlap) {
            /* production's loop */
            POperand<MODE> p; /* bf(e) of the previous tile (fp32: + its residual), the A operand of its P V */
            mbar_wait(&full_k[0], 0);
            __syncwarp();
            zero_scores(sacc);
            turn_begin<PINGPONG>(wg);
            wgmma_fence();
            issue_qk<HS, Plan::kQChunkBytes>(sacc, q_addr, k_base);
            wgmma_commit();
            turn_end<PINGPONG>(wg);
            wgmma_wait<0>();
            reg_fence(sacc);
            mbar_arrive(&empty_k[0]);
            softmax_tile<MODE>(sacc, m_run, l_part, alpha, n_tiles == 1, 0, row0, t, c);
            rescale_o<HS>(o, alpha);
            pack_p<MODE>(p, sacc);
            for (int kt = 1; kt < n_tiles; kt++) {
                const int s = kt % STAGES, sv = (kt - 1) % STAGES;
                mbar_wait(&full_k[s], (uint32_t)((kt / STAGES) & 1));
                mbar_wait(&full_v[sv], (uint32_t)(((kt - 1) / STAGES) & 1));
                __syncwarp();
                zero_scores(sacc);
                turn_begin<PINGPONG>(wg);
                wgmma_fence();
                issue_qk<HS, Plan::kQChunkBytes>(sacc, q_addr, k_base + s * kTileBytes);
                wgmma_commit();
                issue_pv_terms<HS, MODE>(o, p, v_base + sv * kTileBytes);
                wgmma_commit();
                turn_end<PINGPONG>(wg);
                wgmma_wait<1>();
                reg_fence(sacc);
                mbar_arrive(&empty_k[s]);
                softmax_tile<MODE>(sacc, m_run, l_part, alpha, kt == n_tiles - 1, kt * kBlockK, row0, t, c);
                wgmma_wait<0>();
                pv_retired<HS, MODE>(o, p);
                mbar_arrive(&empty_v[sv]);
                rescale_o<HS>(o, alpha);
                pack_p<MODE>(p, sacc);
            }
            {
                const int kt = n_tiles - 1, sv = kt % STAGES;
                mbar_wait(&full_v[sv], (uint32_t)((kt / STAGES) & 1));
                __syncwarp();
                turn_begin<PINGPONG>(wg);
                wgmma_fence();
                issue_pv_terms<HS, MODE>(o, p, v_base + sv * kTileBytes);
                wgmma_commit();
                turn_end<PINGPONG>(wg);
                wgmma_wait<0>();
                pv_retired<HS, MODE>(o, p);
                mbar_arrive(&empty_v[sv]);
            }
            /* v3: take warpgroup 1's last arrival on our barrier, so none is left pending at exit */
            if (PINGPONG && wg == 0) named_bar_sync(kPingBarrier + 0, 256);
        } else {
            /* v0's order, tile by tile (fp32 mode at 160 registers): S, softmax, O *= alpha, then O += P V one
               term at a time - bf(e), waited for, then bf(e - bf(e)) - so only one 32-register A operand is
               live beside S and O (v0 holds both terms and spills even at 168). The tensor core applies the
               same k-steps to O in the same order as one batch of both terms would: bit-identical. */
            for (int kt = 0; kt < n_tiles; kt++) {
                const int s = kt % STAGES;
                const uint32_t parity = (uint32_t)((kt / STAGES) & 1);
                mbar_wait(&full_k[s], parity);
                __syncwarp();
                zero_scores(sacc);
                wgmma_fence();
                issue_qk<HS, Plan::kQChunkBytes>(sacc, q_addr, k_base + s * kTileBytes);
                wgmma_commit();
                wgmma_wait<0>();
                reg_fence(sacc);
                mbar_arrive(&empty_k[s]);
                softmax_tile<MODE>(sacc, m_run, l_part, alpha, kt == n_tiles - 1, kt * kBlockK, row0, t, c);
                rescale_o<HS>(o, alpha);
                mbar_wait(&full_v[s], parity);
                __syncwarp();
                uint32_t pa[kPvSteps][4];
#pragma unroll 1 /* a loop, not two copies: unrolled, ptxas spills 4 bytes at 160 (CUDA 13.0) */
                for (int term = 0; term < POperand<MODE>::kTerms; term++) {
                    if (term == 0) pack_p_operand<false>(pa, sacc);
                    else pack_p_operand<true>(pa, sacc);
                    wgmma_fence();
                    issue_pv<HS>(o, pa, v_base + s * kTileBytes);
                    wgmma_commit();
                    wgmma_wait<0>();
                    reg_fence(o);
                    reg_fence(pa);
                }
                mbar_arrive(&empty_v[s]);
            }
        }

#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float l = quad_sum(l_part[r]);
            const int query = row0 + 8 * r;
            if (query >= T) continue;
            bf16* orow = out + ((long long)b * T + query) * NH * HS + (long long)h * HS;
#pragma unroll
            for (int n = 0; n < HS / 8; n++)
                *reinterpret_cast<uint32_t*>(orow + 8 * n + 2 * t) =
                    pack_bf16x2(__fdiv_rn(o[4 * n + 2 * r], l), __fdiv_rn(o[4 * n + 2 * r + 1], l));
            if (t == 0) {
                float* st = stats + ((long long)bh * T + query) * 2;
                if (MODE == ATTN_BF16) {
                    st[0] = m_run[r] * scale + logf(l);
                    st[1] = 0.f;
                } else {
                    st[0] = m_run[r];
                    st[1] = l;
                }
            }
        }
    } else if (PINGPONG) {
        /* rows all at or past T: the other warpgroup still takes n_key_tiles + 1 turns, so take as many,
           releasing tile j after turn j (releasing only after all the turns would deadlock: the other
           warpgroup's turn j waits for tile j, which the producer loads only after tile j - STAGES is free) */
        for (int turn = 0; turn <= n_key_tiles; turn++) {
            turn_begin<PINGPONG>(wg);
            turn_end<PINGPONG>(wg);
            if (turn < n_key_tiles) release_tile<STAGES>(full_k, empty_k, full_v, empty_v, turn);
        }
        first_unreleased = n_key_tiles;
    }
    /* release the CTA's key tiles this warpgroup does not read */
    for (int kt = first_unreleased; kt < n_key_tiles; kt++) release_tile<STAGES>(full_k, empty_k, full_v, empty_v, kt);
}

/* ------------------------------------------------------------------------------------------------ */
/* host                                                                                              */
/* ------------------------------------------------------------------------------------------------ */
template <int HS, int MODE, int STAGES, int NWG, bool PINGPONG>
void launch(const CUtensorMap& qkv_map, AttnShape s, bf16* out, float* stats, cudaStream_t stream) {
    constexpr int smem = SmemPlan<HS, STAGES, NWG>::kAlloc;
    auto kernel = fwd_kernel<HS, MODE, STAGES, NWG, PINGPONG>;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid((unsigned)ceil_div(s.T, CtaShape<NWG>::kRows), (unsigned)(s.B * s.NH));
    kernel<<<grid, CtaShape<NWG>::kThreads, smem, stream>>>(qkv_map, out, stats, s.NH, s.T,
                                                            attn_softmax_scale(HS), attn_exp2_scale(HS));
    cudaCheckLastError();
}

template <int HS, int NWG, bool PINGPONG, int kStages>
void dispatch_mode(const char* who, AttnMode mode, AttnShape s, const bf16* qkv, bf16* out, float* stats,
                   cudaStream_t stream) {
    /* one map per call, as production (its encoding is inside the lab's timed interval) */
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, who, "qkv");
    switch (mode) {
        case ATTN_FP32: launch<HS, ATTN_FP32, kStages, NWG, PINGPONG>(qkv_map, s, out, stats, stream); break;
        case ATTN_BF16: launch<HS, ATTN_BF16, kStages, NWG, PINGPONG>(qkv_map, s, out, stats, stream); break;
        case ATTN_REPAIR: launch<HS, ATTN_REPAIR, kStages, NWG, PINGPONG>(qkv_map, s, out, stats, stream); break;
        case ATTN_GPROJ: launch<HS, ATTN_GPROJ, kStages, NWG, PINGPONG>(qkv_map, s, out, stats, stream); break;
        default: die("%s: invalid mode %d (choices: %s)", who, (int)mode, attn_mode_choices());
    }
}

/* v2: 192 query rows per CTA (three consumer warpgroups), head size 64 only; 2 K/V stages (production's
   count) or 3 (120 KB of shared memory at HS 64). */
inline void forward_v2(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                       int stages, cudaStream_t stream) {
    if (s.HS != 64) die("hopper_fwd_v2::forward_v2: head size %d (hint: v2 is the HS-64 variant; HS 128 keeps "
                        "production's two warpgroups)", s.HS);
    if (stages == 2) dispatch_mode<64, 3, false, 2>("hopper_fwd_v2", mode, s, qkv, out, stats, stream);
    else if (stages == 3) dispatch_mode<64, 3, false, 3>("hopper_fwd_v2", mode, s, qkv, out, stats, stream);
    else die("hopper_fwd_v2::forward_v2: %d K/V stages (hint: 2 or 3)", stages);
}
/* v3: production's 128-row CTA with ping-pong between its two consumer warpgroups, head size 64 or 128. */
inline void forward_v3(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                       cudaStream_t stream) {
    constexpr int kStages = ATTN_HOPPER_FWD_STAGES;
    if (s.HS == 64) dispatch_mode<64, 2, true, kStages>("hopper_fwd_v3", mode, s, qkv, out, stats, stream);
    else if (s.HS == 128) dispatch_mode<128, 2, true, kStages>("hopper_fwd_v3", mode, s, qkv, out, stats, stream);
    else die("hopper_fwd_v2::forward_v3: head size %d (hint: 64 or 128)", s.HS);
}

}  // namespace hopper_fwd_v2

#endif /* DEV_ATTENTION_LAB_HOPPER_FWD_V2_CUH */
