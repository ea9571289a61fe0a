/*
 * attention/cuda/hopper/kernel_fwd.cuh - the device code of the Hopper forward (every mode; HS 64 and 128): its
 * constants, CTA shapes, shared-memory plan, per-step helpers and the one kernel template, in the including
 * file's anonymous namespace. Included by attention/cuda/hopper/attention_hopper.cu (launch; the design,
 * numerics and barrier protocol are in its file comment) and by the kernel's lab dev/attention_lab/hopper_fwd.cu
 * (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_FWD_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_FWD_CUH

#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_work_queue.cuh"
#include "attention/cuda/hopper/mode_numerics.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kBlockQ = ATTN_HOPPER_BLOCK_Q; /* query rows per work item at HS 128, and the probe's */
constexpr int kBlockK = ATTN_HOPPER_BLOCK_K; /* keys per K/V tile */
constexpr int kWarpgroupRows = 64;      /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockQ / kWarpgroupRows;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kMinProducerRegs = 24;    /* the least setmaxnreg takes: the producer warpgroup keeps at least this */
constexpr int kFwdStages = ATTN_HOPPER_FWD_STAGES; /* K/V stages of production (the lab also times 3) */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes; /* 8 rows x 128 B: the repeat of the 128B swizzle */
constexpr int kWgmmaK = 16;             /* k of every bf16 wgmma */
constexpr int kPvSteps = kBlockK / kWgmmaK;
constexpr int kSRegs = kBlockK / 2;     /* S accumulator: 64 x kBlockK FP32 over 128 threads */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO ("assumed 1", i.e. 16 bytes) */
constexpr int kMaxDynamicSmem = 227 * 1024; /* sm_90's per-block opt-in limit */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "one tensor map (one box shape) serves Q, K and V tiles");

/* The CTA of NWG consumer warpgroups (64 query rows each) + the producer warpgroup, and its setmaxnreg
   split: launched at __launch_bounds__(kThreads, 1), every thread starts at kLaunchRegs; the consumers take the
   largest multiple of 8 (at most 240) that leaves the producer kMinProducerRegs, and the producer keeps what
   the consumers leave (its item decoding and copy loops spill at 24). NWG = 2 (HS 128): 168 -> 24 / 240;
   NWG = 3 (HS 64): 128 -> 32 / 160. */
template <int NWG>
struct CtaShape {
    static constexpr int kRows = kWarpgroupRows * NWG; /* query rows per CTA */
    static constexpr int kConsumerThreads = 128 * NWG;
    static constexpr int kThreads = kConsumerThreads + 128;
    static constexpr int kLaunchRegs = (65536 / kThreads) > 255 ? 255 : (65536 / kThreads) / 8 * 8;
    static constexpr int kConsumerRegsRaw =
        (kThreads * kLaunchRegs - 128 * kMinProducerRegs) / kConsumerThreads / 8 * 8;
    static constexpr int kConsumerRegs = kConsumerRegsRaw > 240 ? 240 : kConsumerRegsRaw;
    static constexpr int kProducerRegs = (kThreads * kLaunchRegs - kConsumerThreads * kConsumerRegs) / 128 / 8 * 8;
    static_assert(kProducerRegs >= kMinProducerRegs &&
                      128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
                  "the setmaxnreg split must fit in what the CTA was launched with");
};
/* Consumer warpgroups per CTA at head size HS: 3 at HS 64 (192 query rows per work item; at HS 64 a
   warpgroup's per-tile GEMMs are short, so a third one keeps the tensor core busy during the softmaxes), 2 at
   HS 128 (128 rows; their registers hold S, O and P(kt-1) at 128 columns). */
template <int HS>
constexpr int kFwdWarpgroups = HS == 64 ? 3 : 2;
using FwdCta64 = CtaShape<kFwdWarpgroups<64>>;
using FwdCta128 = CtaShape<kFwdWarpgroups<128>>;
static_assert(FwdCta128::kRows == kBlockQ && FwdCta128::kLaunchRegs == 168 && FwdCta128::kConsumerRegs == 240 &&
                  FwdCta128::kProducerRegs == 24, "HS 128's CTA and split (24 / 240)");
static_assert(FwdCta64::kRows == ATTN_HOPPER_BLOCK_Q_HS64 && FwdCta64::kLaunchRegs == 128 &&
                  FwdCta64::kConsumerRegs == 160 && FwdCta64::kProducerRegs == 32, "HS 64's CTA and split (32 / 160)");

/* Shared-memory plan of one CTA (byte offsets from a 1024-byte aligned base). K and V of each stage are
   kBlockK rows x HS BF16, stored as HS/64 chunks of [kBlockK rows][128 bytes], swizzled. Q comes in boxes of
   kBlockK rows (the one tensor map's box), so its chunks are rounded up to whole boxes: NWG = 2, one box
   (Q is one K-sized tile); NWG = 3, two boxes of which the last 64 rows stay unused (32 KB at HS 64). QBUF Q
   buffers, each with a q_full and a q_empty barrier (the kernel: kQBuffers = 2, so that a CTA loads its next
   work item's Q while it finishes this one); with one buffer, q_full only (the layout probe). */
template <int HS, int STAGES, int NWG = kConsumerWarpgroups, int QBUF = 1>
struct SmemPlan {
    static constexpr int kChunks = HS / kChunkCols;
    static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;
    static constexpr int kTileBytes = kChunks * kChunkBytes;
    static constexpr int kQBoxes = (CtaShape<NWG>::kRows + kBlockK - 1) / kBlockK;
    static constexpr int kQChunkBytes = kQBoxes * kChunkBytes;
    static constexpr int kWgQBytes = kWarpgroupRows * kSwizzleRowBytes; /* one warpgroup's rows of a Q chunk */
    static constexpr int kQBufferBytes = kChunks * kQChunkBytes;
    static constexpr int kQ = 0;                           /* QBUF buffers */
    static constexpr int kK = kQ + QBUF * kQBufferBytes;   /* STAGES tiles */
    static constexpr int kV = kK + STAGES * kTileBytes;    /* STAGES tiles */
    static constexpr int kBarriers = kV + STAGES * kTileBytes;
    static constexpr int kQBarriers = QBUF == 1 ? 1 : 2 * QBUF; /* q_full [QBUF] (and q_empty [QBUF]) */
    static constexpr int kNumBarriers = kQBarriers + 4 * STAGES;  /* + full_k, empty_k, full_v, empty_v [STAGES] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kChunkBytes % kSwizzleAtomBytes == 0 && kWgQBytes % kSwizzleAtomBytes == 0,
                  "tiles and each warpgroup's Q rows must stay 1024-byte aligned");
    static_assert(kAlloc <= kMaxDynamicSmem, "Q + STAGES x (K + V) tiles must fit in 227 KB of shared memory");
};

/* ---- the two GEMMs of one key tile, per warpgroup (shared by the kernel and the layout probe) ---- */

/* Issues S = Q K^T for the warpgroup's 64 query rows x kBlockK keys: HS/16 k-steps, no fence, commit or
   wait (the caller's). q_addr, k_addr: shared addresses of the warpgroup's first Q row and of the K tile
   (chunked, swizzled, 1024-aligned). k-step kk reads bytes 32 (kk % 4) .. +31 of the 128-byte rows of
   chunk kk / 4; Q's chunks lie kQChunkBytes apart (taller than a K tile in the HS-64 kernel's plan, where
   HS 64 has one chunk anyway). sacc must hold zeros (the wgmma accumulates). */
template <int HS, int kQChunkBytes = kBlockK * kSwizzleRowBytes>
__device__ __forceinline__ void issue_qk(float (&sacc)[kSRegs], uint32_t q_addr, uint32_t k_addr) {
    constexpr int kKChunkBytes = kBlockK * kSwizzleRowBytes;
    constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes in a 128-byte row */
#pragma unroll
    for (int kk = 0; kk < HS / kWgmmaK; kk++) {
        const uint32_t in_row = (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        const uint32_t chunk = kk / kKStepsPerChunk;
        wgmma_m64n128k16_ss(sacc, make_smem_desc(q_addr + chunk * kQChunkBytes + in_row, kUnusedLbo, kSwizzleAtomBytes),
                            make_smem_desc(k_addr + chunk * kKChunkBytes + in_row, kUnusedLbo, kSwizzleAtomBytes));
    }
}
/* Zeroes S, pinned before the coming wgmma_fence (else the compiler may sink the moves past it and ptxas
   has to serialise the wgmmas). */
__device__ __forceinline__ void zero_scores(float (&sacc)[kSRegs]) {
#pragma unroll
    for (int i = 0; i < kSRegs; i++) sacc[i] = 0.f;
    reg_fence(sacc);
}
/* S = Q K^T, waited for (a tile with no P V to overlap, and the layout probe). QCHUNK: issue_qk's. */
template <int HS, int QCHUNK = kBlockK * kSwizzleRowBytes>
__device__ __forceinline__ void warpgroup_qk(float (&sacc)[kSRegs], uint32_t q_addr, uint32_t k_addr) {
    zero_scores(sacc);
    wgmma_fence();
    issue_qk<HS, QCHUNK>(sacc, q_addr, k_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(sacc);
}

/* The register A operand(s) of O += P V from the S accumulator (holding e), rounded to BF16: k-step kk
   takes S columns 16kk..16kk+15 = accumulator registers 8kk..8kk+7 (hopper_wgmma.cuh, "Register
   fragments"). Term 0 is bf(e); fp32 mode has a term 1, bf(e - bf(e)). */
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
        pa[kk][0] = pack_p_pair<kResidual>(sacc[8 * kk + 0], sacc[8 * kk + 1]); /* row g,   cols 2t, 2t+1 */
        pa[kk][1] = pack_p_pair<kResidual>(sacc[8 * kk + 2], sacc[8 * kk + 3]); /* row g+8, cols 2t, 2t+1 */
        pa[kk][2] = pack_p_pair<kResidual>(sacc[8 * kk + 4], sacc[8 * kk + 5]); /* row g,   cols 2t+8, 2t+9 */
        pa[kk][3] = pack_p_pair<kResidual>(sacc[8 * kk + 6], sacc[8 * kk + 7]); /* row g+8, cols 2t+8, 2t+9 */
    }
}
template <int MODE>
__device__ __forceinline__ void pack_p(POperand<MODE>& p, const float (&sacc)[kSRegs]) {
    pack_p_operand<false>(p.a[0], sacc);
    if constexpr (POperand<MODE>::kTerms == 2) pack_p_operand<true>(p.a[1], sacc);
}

/* Issues O += P V (every term, term 0 first): kPvSteps k-steps of 16 keys each, each 16 rows (2048 bytes)
   further into the V tile at v_addr. No fence, commit or wait (the caller's). */
template <int HS>
__device__ __forceinline__ void issue_pv(float (&o)[HS / 2], const uint32_t (&pa)[kPvSteps][4], uint32_t v_addr) {
    constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes; /* LBO: from one 64-column block of V to the next */
#pragma unroll
    for (int kk = 0; kk < kPvSteps; kk++)
        wgmma_pv(o, pa[kk], make_smem_desc(v_addr + kk * kWgmmaK * kSwizzleRowBytes, kChunkBytes, kSwizzleAtomBytes));
}
template <int HS, int MODE>
__device__ __forceinline__ void issue_pv_terms(float (&o)[HS / 2], const POperand<MODE>& p, uint32_t v_addr) {
#pragma unroll
    for (int term = 0; term < POperand<MODE>::kTerms; term++) issue_pv<HS>(o, p.a[term], v_addr);
}
/* After the wait that retired the P V GEMM: O may be read, and the A registers stay live (unchanged) up to
   here, so the compiler cannot hand them to other values while the tensor core still reads them. */
template <int HS, int MODE>
__device__ __forceinline__ void pv_retired(float (&o)[HS / 2], POperand<MODE>& p) {
    reg_fence(o);
#pragma unroll
    for (int term = 0; term < POperand<MODE>::kTerms; term++) reg_fence(p.a[term]);
}

/* Online softmax of one key tile (attention_cuda.cu's forward, operation for operation), on the FP32 S
   accumulator in place (S -> e): the mask (if `masked`: key j visible to query i iff j <= i, which also
   hides keys >= T), the row max, alpha = exp2((m_old - m_new) c), e, l = l alpha + sum e, m = m_new.
   O's rescale by alpha is the caller's (rescale_o), after the previous tile's P V has retired. key0: the
   tile's first key; row0: this thread's first query row (the second is row0 + 8). Every row sees key 0
   in tile 0, so m_new is finite from the first tile on. */
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
        alpha[r] = exp2f((m_run[r] - m_new) * c); /* 0 on the first tile */
        const float m_c = m_new * c;              /* fl(m * c), bf16 mode */
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kBlockK / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float sc = sacc[4 * j + 2 * r + e];
                const float x = forward_exponent<MODE>(sc, c, m_c, m_new);
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

/* The turns of two consumer warpgroups (TURNS below): named barrier kTurnBarrier + w is warpgroup w's. A
   warpgroup waits at its own (bar.sync, 256 threads: its 128 and the other warpgroup's 128 arrivals) before it
   issues an iteration's GEMMs and arrives at the other's after them, so the two issue in alternation and
   one's softmax runs while the tensor core works through the other's GEMMs. Warpgroup 1 arrives at
   warpgroup 0's barrier once per CTA before its first item (the first turn); the last turn's arrival is left
   unclaimed at the CTA's exit. Ids 1-3 are warpgroup_sync's. */
constexpr int kTurnBarrier = 8;

/* A consumer warpgroup's key tiles 1 .. n_tiles - 1 after tile 0's softmax, overlapped: S(kt) = Q K(kt)^T is issued
   with O += P(kt-1) V(kt-1) behind it, S(kt)'s softmax runs while that P V does, then O is rescaled and P(kt)
   packed; then the last tile's P V. QCHUNK: Q's column-chunk stride (issue_qk); TILE_BYTES: a K/V stage's
   bytes; seq0: the CTA's tile number of key tile 0 (produce_tile), which fixes each tile's stage and phase.
   TURNS (two warpgroups that run the same tiles: HS 128): each iteration's GEMMs are issued in warpgroup wg's
   turn (kTurnBarrier); the order of the GEMMs on each warpgroup's own registers is unchanged, so are O and the
   stats. */
template <int HS, int MODE, int STAGES, int QCHUNK, int TILE_BYTES, bool TURNS = false>
__device__ __forceinline__ void overlapped_key_tiles(float (&sacc)[kSRegs], float (&o)[HS / 2], POperand<MODE>& p,
                                                     float (&m_run)[2], float (&l_part)[2], float (&alpha)[2],
                                                     uint64_t* full_k, uint64_t* empty_k, uint64_t* full_v,
                                                     uint64_t* empty_v, uint32_t q_addr, uint32_t k_base,
                                                     uint32_t v_base, int n_tiles, int row0, int t, float c,
                                                     int seq0, int wg = 0) {
    for (int kt = 1; kt < n_tiles; kt++) {
        const int seq = seq0 + kt;
        const int s = seq % STAGES, sv = (seq - 1) % STAGES; /* K(kt)'s stage, V(kt - 1)'s stage */
        mbar_wait(&full_k[s], (uint32_t)((seq / STAGES) & 1));
        mbar_wait(&full_v[sv], (uint32_t)(((seq - 1) / STAGES) & 1));
        __syncwarp();
        zero_scores(sacc);
        if constexpr (TURNS) named_bar_sync(kTurnBarrier + wg, 256); /* this warpgroup's turn */
        wgmma_fence(); /* orders the rescale of O, the packing of P and the zeroing of S before the wgmmas */
        issue_qk<HS, QCHUNK>(sacc, q_addr, k_base + s * TILE_BYTES);
        wgmma_commit();
        issue_pv_terms<HS, MODE>(o, p, v_base + sv * TILE_BYTES); /* O += P(kt-1) V(kt-1) */
        wgmma_commit();
        if constexpr (TURNS) named_bar_arrive(kTurnBarrier + (1 - wg), 256); /* the other warpgroup's turn */
        wgmma_wait<1>(); /* S(kt) is in (groups retire in order); P V(kt - 1) may still run */
        reg_fence(sacc);
        mbar_arrive(&empty_k[s]);
        softmax_tile<MODE>(sacc, m_run, l_part, alpha, kt == n_tiles - 1, kt * kBlockK, row0, t, c);
        wgmma_wait<0>();
        pv_retired<HS, MODE>(o, p);
        mbar_arrive(&empty_v[sv]);
        rescale_o<HS>(o, alpha);
        pack_p<MODE>(p, sacc);
    }
    /* the last tile's P V */
    const int seq = seq0 + n_tiles - 1, sv = seq % STAGES;
    mbar_wait(&full_v[sv], (uint32_t)((seq / STAGES) & 1));
    __syncwarp();
    wgmma_fence();
    issue_pv_terms<HS, MODE>(o, p, v_base + sv * TILE_BYTES);
    wgmma_commit();
    wgmma_wait<0>();
    pv_retired<HS, MODE>(o, p);
    mbar_arrive(&empty_v[sv]); /* the producer waits for it before tile seq + STAGES (this or a later item's) */
}

/* The epilogue of a consumer thread's two query rows (row0, row0 + 8): O = bf(acc / l) into out [B, T, NH, HS] and
   (lane t == 0 of the quad) the row's stats (forward_row_stats<MODE>); rows past T write nothing. */
template <int HS, int MODE>
__device__ __forceinline__ void store_o_and_stats(const float (&o)[HS / 2], const float (&l_part)[2],
                                                  const float (&m_run)[2], bf16* __restrict__ out,
                                                  float* __restrict__ stats, int b, int h, int bh, int NH, int T,
                                                  int row0, int t, float scale) {
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
            forward_row_stats<MODE>(st, m_run[r], l, scale);
        }
    }
}

/* Producer: key tile j of head (b, h), the CTA's tile number seq (its K or V tiles counted over all its work
   items), into stage seq % STAGES, after the consumers released tile seq - STAGES that last used it (its
   release completed phase seq / STAGES - 1 of empty[s]). */
template <int HS, int STAGES>
__device__ __forceinline__ void produce_tile(unsigned char* tiles, uint64_t* full, uint64_t* empty,
                                             const CUtensorMap* map, int seq, int j, int slot, int NH, int h, int b) {
    using Plan = SmemPlan<HS, STAGES>;
    const int s = seq % STAGES;
    if (seq >= STAGES) mbar_wait(&empty[s], (uint32_t)((seq / STAGES - 1) & 1));
    mbar_arrive_expect_tx(&full[s], Plan::kTileBytes);
    for (int ch = 0; ch < Plan::kChunks; ch++)
        tma_load_4d(tiles + s * Plan::kTileBytes + ch * Plan::kChunkBytes, map, &full[s], ch * kChunkCols,
                    slot * NH + h, j * kBlockK, b);
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel: NWG consumer warpgroups, 64 * NWG query rows per work item                            */
/* ------------------------------------------------------------------------------------------------ */

/* Releases the K (V) tile of the CTA's tile number seq, which this warpgroup does not read: after it landed (so
   the arrival counts toward that tile's phase of the empty barrier), one arrival per thread. */
template <int STAGES>
__device__ __forceinline__ void release_tile_k(uint64_t* full_k, uint64_t* empty_k, int seq) {
    mbar_wait(&full_k[seq % STAGES], (uint32_t)((seq / STAGES) & 1));
    mbar_arrive(&empty_k[seq % STAGES]);
}
template <int STAGES>
__device__ __forceinline__ void release_tile_v(uint64_t* full_v, uint64_t* empty_v, int seq) {
    mbar_wait(&full_v[seq % STAGES], (uint32_t)((seq / STAGES) & 1));
    mbar_arrive(&empty_v[seq % STAGES]);
}
/* Releases the CTA's tile number seq, a key tile this warpgroup does not read: after it landed (so the
   arrivals count toward that tile's phase of the empty barriers), one arrival per thread on each. */
template <int STAGES>
__device__ __forceinline__ void release_tile(uint64_t* full_k, uint64_t* empty_k, uint64_t* full_v, uint64_t* empty_v,
                                             int seq) {
    release_tile_k<STAGES>(full_k, empty_k, seq);
    release_tile_v<STAGES>(full_v, empty_v, seq);
}

/* Q buffers: a CTA that runs several work items loads the next item's Q while it finishes this one. */
constexpr int kQBuffers = 2;

/* The persistent launch's queue of work items (hopper_work_queue.cuh): the forwards of this translation unit run
   one at a time on a stream. */
__device__ HopperWorkQueue g_fwd_queue;

/* Work item w of the launch's longest-first order (tile_order.cuh: ranks tile-major within sections of `section`
   heads): ROWS query rows of a head and the key tiles up to the one holding its last row. */
template <int ROWS>
__device__ __forceinline__ AttnQueryItem fwd_item(unsigned w, int q_tiles, int heads, int section, int NH, int T) {
    return attn_query_item(attn_tile_rank_head(w, q_tiles, heads, section), q_tiles, ROWS, kBlockK, NH, T);
}

/* The forward of every mode and both head sizes (attention_hopper.cu's file comment has the design, numerics
   and barrier protocol). The CTA: NWG consumer warpgroups of 64 query rows each (3 at HS 64, 2 at HS 128)
   and a producer warpgroup, one elected lane of which issues every TMA copy in the order the consumers need
   them: an item's Q, K(0), then K(kt) and V(kt - 1) for kt = 1.., then the last V.
   - Work items: the launch has q_tiles * heads items (64 NWG query rows of one head) in the longest-first
     order. CTA x runs item x first; a grid of one CTA per item runs no more. With fewer CTAs (a persistent
     launch) the producer takes each further item from g_fwd_queue once a Q buffer is free for it. For every
     item it writes the item, decoded (rows, head, key tiles: AttnQueryItem), beside the buffer (item_of[b])
     before its q_full[b] arrival, so the consumers do no index arithmetic of their own; an item of no key
     tiles there, with a plain arrival, tells the consumers that the CTA is done. The K/V stages and their
     phases run on over the items (the CTA's tile number seq), and Q has kQBuffers buffers: the producer loads
     the next item's Q and first K/V tiles while the consumers finish this one's last P V and write O.
   - Separate K and V barriers per stage: V(kt) is read until P(kt) V(kt) retires in iteration kt + 1, one
     iteration after K(kt) is done with. full_k[s] / full_v[s]: TMA bytes landed; empty_k[s]: every consumer
     thread has S(kt); empty_v[s]: P V(kt) retired. q_full[b]: an item's Q landed; q_empty[b]: every
     consumer thread is done with it (whether it read it or not). dev/attention_lab/protocol_model.py
     plays this protocol under random interleavings (no deadlock, no buffer overwritten while read).
   - At HS 64 an item's 192 rows span parts of two 128-key diagonal tiles, so warpgroup wg (rows r0 = q0 +
     64 wg .. r0 + 63, inside one 128-key tile since r0 is a multiple of 64) runs its own n_tiles =
     (min(r0 + 64, T) - 1) / 128 + 1 key tiles and masks only its own last one; the item's tiles past its own
     (and all of them, when its rows all lie at or past T) it releases after they land, so every empty
     barrier still counts each consumer thread once per tile. At HS 128 (two warpgroups, 128 rows) every
     warpgroup runs all of the item's tiles.
   - Q comes in boxes of 128 rows (the K/V map's box), a box starting at or past T not loaded.
   - kOverlap: the overlap keeps P(kt-1) live beside S and O; fp32 mode's two-term P does not fit in 160
     registers (HS 64), so there each tile runs in sequence (S, softmax, O *= alpha, P V one term at a time:
     the tensor core applies the same k-steps to O in the same order, bit-identical). */
template <int HS, int MODE, int STAGES, int NWG>
__global__ void __launch_bounds__(CtaShape<NWG>::kThreads, 1)
    hopper_fwd_kernel(const __grid_constant__ CUtensorMap qkv_map, bf16* __restrict__ out,
                      float* __restrict__ stats, int NH, int T, float scale, float c, int section, int heads) {
    using Cta = CtaShape<NWG>;
    using Plan = SmemPlan<HS, STAGES, NWG, kQBuffers>;
    constexpr int kTileBytes = Plan::kTileBytes;
    constexpr int kORegs = HS / 2;
    constexpr bool kOverlap = !(MODE == ATTN_FP32 && Cta::kConsumerRegs < 200);
    /* overlapped_key_tiles' TURNS: the two warpgroups alternate (not fp32: its forward was 1-4% slower with them) */
    constexpr bool kTurns = kOverlap && NWG == 2 && MODE != ATTN_FP32;

    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* q_empty = q_full + kQBuffers;
    uint64_t* full_k = q_empty + kQBuffers;
    uint64_t* empty_k = full_k + STAGES;
    uint64_t* full_v = empty_k + STAGES;
    uint64_t* empty_v = full_v + STAGES;
    /* the item whose Q buffer b holds, as the producer decoded it (n_key_tiles 0: none left) */
    __shared__ AttnQueryItem item_of[kQBuffers];

    const int q_tiles = (T + Cta::kRows - 1) / Cta::kRows;
    const unsigned n_items = (unsigned)q_tiles * (unsigned)heads; /* < 2^32: attention_cuda_check_shape */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        for (int i = 0; i < kQBuffers; i++) {
            mbar_init(&q_full[i], 1);
            mbar_init(&q_empty[i], Cta::kConsumerThreads);
        }
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full_k[s], 1);
            mbar_init(&empty_k[s], Cta::kConsumerThreads);
            mbar_init(&full_v[s], 1);
            mbar_init(&empty_v[s], Cta::kConsumerThreads);
        }
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();

    if (warpgroup == NWG) {
        setmaxnreg_dec<Cta::kProducerRegs>();
        if (warp == 4 * NWG && lane == 0) {
            const bool queued = gridDim.x < n_items; /* a persistent launch */
            int seq = 0; /* the CTA's K/V tiles issued so far */
            /* item `use` of the CTA takes Q buffer use % kQBuffers */
            for (int use = 0;; use++) {
                const int qb = use % kQBuffers;
                /* buffer qb is free once every consumer released its previous use */
                if (use >= kQBuffers) mbar_wait(&q_empty[qb], (uint32_t)((use / kQBuffers - 1) & 1));
                const unsigned w = use == 0 ? blockIdx.x : queued ? work_queue_next(&g_fwd_queue, n_items) : n_items;
                if (w >= n_items) {
                    item_of[qb].n_key_tiles = 0; /* visible to the consumers through the arrival */
                    mbar_arrive(&q_full[qb]);
                    break;
                }
                const AttnQueryItem it = fwd_item<Cta::kRows>(w, q_tiles, heads, section, NH, T);
                item_of[qb] = it; /* visible to the consumers through the q_full arrival below */
                unsigned char* q_buf = q_s + qb * Plan::kQBufferBytes;
                const int q_boxes = min(Plan::kQBoxes, (T - it.q0 + kBlockK - 1) / kBlockK);
                mbar_arrive_expect_tx(&q_full[qb], q_boxes * Plan::kChunks * Plan::kChunkBytes);
                for (int box = 0; box < q_boxes; box++)
                    for (int ch = 0; ch < Plan::kChunks; ch++)
                        tma_load_4d(q_buf + ch * Plan::kQChunkBytes + box * Plan::kChunkBytes, &qkv_map, &q_full[qb],
                                    ch * kChunkCols, kSlotQ * NH + it.h, it.q0 + box * kBlockK, it.b);
                produce_tile<HS, STAGES>(k_s, full_k, empty_k, &qkv_map, seq, 0, kSlotK, NH, it.h, it.b);
                for (int kt = 1; kt < it.n_key_tiles; kt++) {
                    produce_tile<HS, STAGES>(k_s, full_k, empty_k, &qkv_map, seq + kt, kt, kSlotK, NH, it.h, it.b);
                    produce_tile<HS, STAGES>(v_s, full_v, empty_v, &qkv_map, seq + kt - 1, kt - 1, kSlotV, NH, it.h,
                                             it.b);
                }
                produce_tile<HS, STAGES>(v_s, full_v, empty_v, &qkv_map, seq + it.n_key_tiles - 1, it.n_key_tiles - 1,
                                         kSlotV, NH, it.h, it.b);
                seq += it.n_key_tiles;
            }
            if (queued) work_queue_finish(&g_fwd_queue);
        }
        return;
    }
    setmaxnreg_inc<Cta::kConsumerRegs>();

    const int wg = warpgroup, g = lane >> 2, t = lane & 3;
    const uint32_t k_base = smem_u32(k_s), v_base = smem_u32(v_s);
    if constexpr (kTurns) {
        if (wg == 1) named_bar_arrive(kTurnBarrier, 256); /* warpgroup 0 has the first turn */
    }
    int seq = 0; /* the producer's count */
    for (int use = 0;; use++) {
        const int qb = use % kQBuffers;
        const uint32_t q_parity = (uint32_t)((use / kQBuffers) & 1);
        /* the item is what the producer wrote beside the buffer, read once the buffer's q_full phase completed.
           Every consumer thread waits for it, whether it reads Q or not: its q_empty arrival below then comes
           after the producer saw the buffer's previous use released, so it cannot count toward that use */
        mbar_wait(&q_full[qb], q_parity);
        const int n_key_tiles = item_of[qb].n_key_tiles;
        if (n_key_tiles == 0) break;
        const int wg_row0 = item_of[qb].q0 + wg * kWarpgroupRows;
        const int row0 = wg_row0 + (warp % 4) * 16 + g;
        /* this warpgroup's key tiles: up to the one holding its last row before T (0 if none) */
        const int n_tiles = wg_row0 < T ? (min(wg_row0 + kWarpgroupRows, T) - 1) / kBlockK + 1 : 0;

        if (n_tiles > 0) {
            float o[kORegs];
#pragma unroll
            for (int i = 0; i < kORegs; i++) o[i] = 0.f;
            float m_run[2] = {-INFINITY, -INFINITY};
            float l_part[2] = {0.f, 0.f};
            float alpha[2];
            float sacc[kSRegs];
            const uint32_t q_addr = smem_u32(q_s + qb * Plan::kQBufferBytes) + wg * Plan::kWgQBytes;

            if constexpr (kOverlap) {
                /* tile 0's S alone (there is no previous P V to overlap with), then the overlapped tiles */
                POperand<MODE> p;
                const int s0 = seq % STAGES;
                mbar_wait(&full_k[s0], (uint32_t)((seq / STAGES) & 1));
                __syncwarp();
                warpgroup_qk<HS, Plan::kQChunkBytes>(sacc, q_addr, k_base + s0 * kTileBytes);
                mbar_arrive(&empty_k[s0]);
                softmax_tile<MODE>(sacc, m_run, l_part, alpha, n_tiles == 1, 0, row0, t, c);
                rescale_o<HS>(o, alpha);
                pack_p<MODE>(p, sacc);
                overlapped_key_tiles<HS, MODE, STAGES, Plan::kQChunkBytes, kTileBytes, kTurns>(
                    sacc, o, p, m_run, l_part, alpha, full_k, empty_k, full_v, empty_v, q_addr, k_base, v_base,
                    n_tiles, row0, t, c, seq, wg);
            } else {
                /* fp32 at 160 registers: tile by tile, only one 32-register A operand live beside S and O */
                for (int kt = 0; kt < n_tiles; kt++) {
                    const int s = (seq + kt) % STAGES;
                    const uint32_t parity = (uint32_t)(((seq + kt) / STAGES) & 1);
                    mbar_wait(&full_k[s], parity);
                    __syncwarp();
                    warpgroup_qk<HS, Plan::kQChunkBytes>(sacc, q_addr, k_base + s * kTileBytes);
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
                        reg_fences(o, pa);
                    }
                    mbar_arrive(&empty_v[s]);
                }
            }
            /* the item's head, read again here (the wgmmas' memory clobbers keep the load here): live through the
               epilogue only, and read before the arrival below lets the producer rewrite the slot */
            const int b = item_of[qb].b, h = item_of[qb].h, bh = item_of[qb].bh;
            mbar_arrive(&q_empty[qb]); /* every S GEMM of this item that read Q has retired */

            /* O = bf(acc / l); stats: bf16 {LSE, 0}, the other modes {m, l} */
            store_o_and_stats<HS, MODE>(o, l_part, m_run, out, stats, b, h, bh, NH, T, row0, t, scale);
        } else {
            mbar_arrive(&q_empty[qb]); /* rows all at or past T: Q not read */
        }
        if (kTurns && n_tiles == 0) {
            /* rows all past T (at HS 128 a warpgroup reads all of the item's tiles or none): the waits, turns and
               releases of overlapped_key_tiles without its GEMMs, so that both warpgroups take n_key_tiles - 1
               turns per item, and in the same order against the tiles (taken before its releases, a turn would
               wait for the other warpgroup's, which waits for a tile whose copy waits for those releases) */
            release_tile_k<STAGES>(full_k, empty_k, seq);
            for (int kt = 1; kt < n_key_tiles; kt++) {
                const int sk = (seq + kt) % STAGES, sv = (seq + kt - 1) % STAGES;
                mbar_wait(&full_k[sk], (uint32_t)(((seq + kt) / STAGES) & 1));
                mbar_wait(&full_v[sv], (uint32_t)(((seq + kt - 1) / STAGES) & 1));
                __syncwarp(); /* lanes leave the polling loops at different times: reconverge for bar.sync */
                named_bar_sync(kTurnBarrier + wg, 256);
                named_bar_arrive(kTurnBarrier + (1 - wg), 256);
                mbar_arrive(&empty_k[sk]);
                mbar_arrive(&empty_v[sv]);
            }
            release_tile_v<STAGES>(full_v, empty_v, seq + n_key_tiles - 1);
        } else {
            /* release the item's key tiles this warpgroup does not read */
            for (int kt = n_tiles; kt < n_key_tiles; kt++)
                release_tile<STAGES>(full_k, empty_k, full_v, empty_v, seq + kt);
        }
        seq += n_key_tiles;
    }
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_FWD_CUH */
