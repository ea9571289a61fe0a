/*
 * dev/attention_lab/hopper_fwd_v1.cuh - the lab's "v1": a verbatim copy of the Hopper forward kernel as it
 * was in production at git 4a1bfd6 (attention/attention_hopper.cu: intra-warpgroup overlap, producer
 * warpgroup with setmaxnreg 24/240, separate K and V stage barriers, 128 query rows / 2 consumer
 * warpgroups at both head sizes), in a namespace of its own.
 *
 * Why a copy: session 6 moved v2 (192 rows, 3 consumer warpgroups, hopper_fwd_v2.cuh) into production at
 * head size 64; HS 128 kept this kernel unchanged. The lab still times the new production against the old
 * one at HS 64 ("time: ... vs v1" lines) and checks both bit for bit against v0, so the old one stays here.
 * Only this comment, the namespace, the entry point (forward, with the stage count; no supports check)
 * and the layout probe (left out: production has one) differ from the original.
 *
 * Offers (namespace hopper_fwd_v1): forward(mode, shape, qkv, out, stats, stages, stream), stages 2 or 3 -
 * same contract as attention_forward_hopper (the caller checks attention_hopper_fwd_supports). Compiled for
 * sm_90a only: the including object is built with -gencode arch=compute_90a,code=sm_90a (attention/module.mk).
 */
#ifndef DEV_ATTENTION_LAB_HOPPER_FWD_V1_CUH
#define DEV_ATTENTION_LAB_HOPPER_FWD_V1_CUH

#include <math.h>
#include <stdint.h>
#include "attention/attention_hopper.cuh"
#include "attention/tile_order.cuh"
#include "attention/hopper_wgmma.cuh"

namespace hopper_fwd_v1 {
using namespace hopper_wgmma;

constexpr int kBlockQ = ATTN_HOPPER_BLOCK_Q; /* query rows per CTA */
constexpr int kBlockK = ATTN_HOPPER_BLOCK_K; /* keys per K/V tile */
constexpr int kWarpgroupRows = 64;      /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockQ / kWarpgroupRows;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup (setmaxnreg needs a whole one) */
constexpr int kProducerWarp = kConsumerThreads / 32; /* the first warp of the producer warpgroup */
/* setmaxnreg split of the 384-thread CTA (__launch_bounds__(384, 1): every thread starts at 168) */
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kFwdStages = ATTN_HOPPER_FWD_STAGES; /* K/V stages of production (the lab also times 3) */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes; /* 8 rows x 128 B: the repeat of the 128B swizzle */
constexpr int kWgmmaK = 16;             /* k of every bf16 wgmma */
constexpr int kPvSteps = kBlockK / kWgmmaK;
constexpr int kSRegs = kBlockK / 2;     /* S accumulator: 64 x kBlockK FP32 over 128 threads */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO ("assumed 1", i.e. 16 bytes) */
constexpr size_t kTmaAlignBytes = 16;   /* global address alignment TMA requires */
constexpr int kMaxDynamicSmem = 227 * 1024; /* sm_90's per-block opt-in limit */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "one tensor map (one box shape) serves Q, K and V tiles");

/* Shared-memory plan of one CTA (byte offsets from a 1024-byte aligned base). Every tile (Q; K and V of
   each stage) is kBlockK rows x HS BF16, stored as HS/64 chunks of [kBlockK rows][128 bytes], swizzled. */
template <int HS, int STAGES>
struct SmemPlan {
    static constexpr int kChunks = HS / kChunkCols;
    static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;
    static constexpr int kTileBytes = kChunks * kChunkBytes;
    static constexpr int kQ = 0;
    static constexpr int kK = kQ + kTileBytes;          /* STAGES tiles */
    static constexpr int kV = kK + STAGES * kTileBytes; /* STAGES tiles */
    static constexpr int kBarriers = kV + STAGES * kTileBytes;
    static constexpr int kNumBarriers = 1 + 4 * STAGES; /* q_full, full_k, empty_k, full_v, empty_v [STAGES] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kChunkBytes % kSwizzleAtomBytes == 0, "tiles must stay 1024-byte aligned");
    static_assert(kAlloc <= kMaxDynamicSmem, "Q + STAGES x (K + V) tiles must fit in 227 KB of shared memory");
};

/* ---- the two GEMMs of one key tile, per warpgroup (shared by the kernel and the layout probe) ---- */

/* Issues S = Q K^T for the warpgroup's 64 query rows x kBlockK keys: HS/16 k-steps, no fence, commit or
   wait (the caller's). q_addr, k_addr: shared addresses of the warpgroup's first Q row and of the K tile
   (chunked, swizzled, 1024-aligned). k-step kk reads bytes 32 (kk % 4) .. +31 of the 128-byte rows of
   chunk kk / 4. sacc must hold zeros (the wgmma accumulates). */
template <int HS>
__device__ __forceinline__ void issue_qk(float (&sacc)[kSRegs], uint32_t q_addr, uint32_t k_addr) {
    constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;
    constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes in a 128-byte row */
#pragma unroll
    for (int kk = 0; kk < HS / kWgmmaK; kk++) {
        const uint32_t off = (kk / kKStepsPerChunk) * kChunkBytes + (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n128k16_ss(sacc, make_smem_desc(q_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                            make_smem_desc(k_addr + off, kUnusedLbo, kSwizzleAtomBytes));
    }
}
/* Zeroes S, pinned before the coming wgmma_fence (else the compiler may sink the moves past it and ptxas
   has to serialise the wgmmas). */
__device__ __forceinline__ void zero_scores(float (&sacc)[kSRegs]) {
#pragma unroll
    for (int i = 0; i < kSRegs; i++) sacc[i] = 0.f;
    reg_fence(sacc);
}
/* S = Q K^T, waited for (the layout probe and tile 0 of the kernel). */
template <int HS>
__device__ __forceinline__ void warpgroup_qk(float (&sacc)[kSRegs], uint32_t q_addr, uint32_t k_addr) {
    zero_scores(sacc);
    wgmma_fence();
    issue_qk<HS>(sacc, q_addr, k_addr);
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

/* Producer: one K or V tile (index j) into its stage, after the consumers released the tile j - STAGES
   that last used it (its release completed phase j / STAGES - 1 of empty[s]). */
template <int HS, int STAGES>
__device__ __forceinline__ void produce_tile(unsigned char* tiles, uint64_t* full, uint64_t* empty,
                                             const CUtensorMap* map, int j, int slot, int NH, int h, int b) {
    using Plan = SmemPlan<HS, STAGES>;
    const int s = j % STAGES;
    if (j >= STAGES) mbar_wait(&empty[s], (uint32_t)((j / STAGES - 1) & 1));
    mbar_arrive_expect_tx(&full[s], Plan::kTileBytes);
    for (int ch = 0; ch < Plan::kChunks; ch++)
        tma_load_4d(tiles + s * Plan::kTileBytes + ch * Plan::kChunkBytes, map, &full[s], ch * kChunkCols,
                    slot * NH + h, j * kBlockK, b);
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel                                                                                        */
/* ------------------------------------------------------------------------------------------------ */
template <int HS, int MODE, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_fwd_kernel(const __grid_constant__ CUtensorMap qkv_map, bf16* __restrict__ out, float* __restrict__ stats,
                      int NH, int T, float scale, float c) {
    using Plan = SmemPlan<HS, STAGES>;
    constexpr int kTileBytes = Plan::kTileBytes;
    constexpr int kORegs = HS / 2; /* O accumulator: 64 x HS */

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

    const AttnTileOrder order = attn_tile_longest_first(); /* longest rows first, over all heads */
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int q0 = q_tile * kBlockQ;
    /* causal: key tiles up to the one holding the CTA's last row; only the last tile reaches past q0
       (kBlockQ == kBlockK and q0 is a multiple of both), so it is the only one that needs the mask */
    const int n_key_tiles = (min(q0 + kBlockQ, T) - 1) / kBlockK + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        /* full_*: the producer's arrive.expect_tx + the TMA bytes; empty_*: every consumer thread */
        init_pipeline_barriers<STAGES>(q_full, full_k, empty_k, 1, kConsumerThreads);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full_v[s], 1);
            mbar_init(&empty_v[s], kConsumerThreads);
        }
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        /* ---- producer: one lane of its first warp issues every copy, in the order the consumers need
           them (iteration kt reads K(kt) and V(kt - 1)); warps 9-11 have no work ---- */
        if (warp == kProducerWarp && lane == 0) {
            mbar_arrive_expect_tx(q_full, kTileBytes);
            for (int ch = 0; ch < Plan::kChunks; ch++)
                tma_load_4d(q_s + ch * Plan::kChunkBytes, &qkv_map, q_full, ch * kChunkCols, kSlotQ * NH + h, q0, b);
            produce_tile<HS, STAGES>(k_s, full_k, empty_k, &qkv_map, 0, kSlotK, NH, h, b);
            for (int kt = 1; kt < n_key_tiles; kt++) {
                produce_tile<HS, STAGES>(k_s, full_k, empty_k, &qkv_map, kt, kSlotK, NH, h, b);
                produce_tile<HS, STAGES>(v_s, full_v, empty_v, &qkv_map, kt - 1, kSlotV, NH, h, b);
            }
            produce_tile<HS, STAGES>(v_s, full_v, empty_v, &qkv_map, n_key_tiles - 1, kSlotV, NH, h, b);
        }
        return; /* no block-wide barrier follows */
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns query rows q0 + 64 wg .. +63; this thread rows row0, row0 + 8 ---- */
    const int wg = warpgroup, g = lane >> 2, t = lane & 3;
    const int row0 = q0 + wg * kWarpgroupRows + (warp % 4) * 16 + g;
    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; i++) o[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_part[2] = {0.f, 0.f}; /* this lane's part of the row sums (quad-summed at the end) */
    float alpha[2];
    float sacc[kSRegs];
    POperand<MODE> p; /* bf(e) of the previous tile (fp32: + its residual), the A operand of its P V */

    /* this warpgroup's 64 rows of the Q tile start 64 rows into each chunk (8 KB: 1024-aligned) */
    const uint32_t q_addr = smem_u32(q_s) + wg * kWarpgroupRows * kSwizzleRowBytes;
    const uint32_t k_base = smem_u32(k_s), v_base = smem_u32(v_s);
    mbar_wait(q_full, 0);

    /* tile 0: S alone (there is no previous P V to overlap with) */
    mbar_wait(&full_k[0], 0);
    __syncwarp(); /* lanes leave the polling loops at different times: reconverge for the .aligned wgmma */
    warpgroup_qk<HS>(sacc, q_addr, k_base);
    mbar_arrive(&empty_k[0]); /* this thread no longer reads K(0) */
    softmax_tile<MODE>(sacc, m_run, l_part, alpha, n_key_tiles == 1, 0, row0, t, c);
    rescale_o<HS>(o, alpha); /* O is 0 and alpha 0: kept so that O sees every operation the old loop did */
    pack_p<MODE>(p, sacc);

    for (int kt = 1; kt < n_key_tiles; kt++) {
        const int s = kt % STAGES, sv = (kt - 1) % STAGES; /* K(kt)'s stage, V(kt - 1)'s stage */
        mbar_wait(&full_k[s], (uint32_t)((kt / STAGES) & 1));
        mbar_wait(&full_v[sv], (uint32_t)(((kt - 1) / STAGES) & 1));
        __syncwarp();
        zero_scores(sacc);
        wgmma_fence(); /* orders the rescale of O, the packing of P and the zeroing of S before the wgmmas */
        issue_qk<HS>(sacc, q_addr, k_base + s * kTileBytes);
        wgmma_commit();
        issue_pv_terms<HS, MODE>(o, p, v_base + sv * kTileBytes); /* O += P(kt-1) V(kt-1) */
        wgmma_commit();
        wgmma_wait<1>(); /* S(kt) is in (groups retire in order); P V(kt - 1) may still run */
        reg_fence(sacc);
        mbar_arrive(&empty_k[s]);
        softmax_tile<MODE>(sacc, m_run, l_part, alpha, kt == n_key_tiles - 1, kt * kBlockK, row0, t, c);
        wgmma_wait<0>();
        pv_retired<HS, MODE>(o, p);
        mbar_arrive(&empty_v[sv]);
        rescale_o<HS>(o, alpha);
        pack_p<MODE>(p, sacc);
    }

    /* the last tile's P V */
    {
        const int kt = n_key_tiles - 1, sv = kt % STAGES;
        mbar_wait(&full_v[sv], (uint32_t)((kt / STAGES) & 1));
        __syncwarp();
        wgmma_fence();
        issue_pv_terms<HS, MODE>(o, p, v_base + sv * kTileBytes);
        wgmma_commit();
        wgmma_wait<0>();
        pv_retired<HS, MODE>(o, p);
        mbar_arrive(&empty_v[sv]); /* nobody waits for it; kept so every stage use is released */
    }

    /* O = bf(acc / l); stats: bf16 {LSE, 0}, the other modes {m, l} */
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
                st[0] = m_run[r] * scale + logf(l); /* LSE, natural log, scaled units */
                st[1] = 0.f;
            } else {
                st[0] = m_run[r];
                st[1] = l;
            }
        }
    }
}

template <int HS, int MODE, int STAGES>
void hopper_fwd_launch(const CUtensorMap& map, AttnShape s, bf16* out, float* stats, cudaStream_t stream) {
    constexpr int smem = SmemPlan<HS, STAGES>::kAlloc;
    cudaCheck(cudaFuncSetAttribute(hopper_fwd_kernel<HS, MODE, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockQ), (unsigned)(s.B * s.NH));
    hopper_fwd_kernel<HS, MODE, STAGES><<<grid, kThreads, smem, stream>>>(map, out, stats, s.NH, s.T,
                                                                          attn_softmax_scale(HS), attn_exp2_scale(HS));
    cudaCheckLastError();
}

template <int HS, int STAGES>
void hopper_fwd_dispatch_mode(AttnMode mode, const CUtensorMap& map, AttnShape s, bf16* out, float* stats,
                              cudaStream_t stream) {
    switch (mode) {
        case ATTN_FP32: hopper_fwd_launch<HS, ATTN_FP32, STAGES>(map, s, out, stats, stream); break;
        case ATTN_BF16: hopper_fwd_launch<HS, ATTN_BF16, STAGES>(map, s, out, stats, stream); break;
        case ATTN_REPAIR: hopper_fwd_launch<HS, ATTN_REPAIR, STAGES>(map, s, out, stats, stream); break;
        case ATTN_GPROJ: hopper_fwd_launch<HS, ATTN_GPROJ, STAGES>(map, s, out, stats, stream); break;
        default: die("hopper_fwd_v1: invalid mode %d (choices: %s)", (int)mode, attn_mode_choices());
    }
}

template <int STAGES>
void hopper_fwd_dispatch(AttnMode mode, const CUtensorMap& map, AttnShape s, bf16* out, float* stats,
                         cudaStream_t stream) {
    if (s.HS == 64) hopper_fwd_dispatch_mode<64, STAGES>(mode, map, s, out, stats, stream);
    else hopper_fwd_dispatch_mode<128, STAGES>(mode, map, s, out, stats, stream);
}

/* The v1 forward (git 4a1bfd6's attention_forward_hopper / _stages, without the supports check: the caller's). */
inline void forward(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                    int stages, cudaStream_t stream) {
    const CUtensorMap map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, "hopper_fwd_v1", "qkv");
    if (stages == 2) hopper_fwd_dispatch<2>(mode, map, s, out, stats, stream);
    else if (stages == 3) hopper_fwd_dispatch<3>(mode, map, s, out, stats, stream);
    else die("hopper_fwd_v1::forward: %d K/V stages (hint: 2 or 3)", stages);
}

}  // namespace hopper_fwd_v1

#endif /* DEV_ATTENTION_LAB_HOPPER_FWD_V1_CUH */
