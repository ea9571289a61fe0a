/*
 * attention/attention_hopper.cu - the Hopper (sm_90a) causal attention forward of bf16, repair, gproj
 * and fp32 modes: wgmma.mma_async tensor-core GEMMs, TMA tile copies and a producer/consumer
 * (warp-specialised) pipeline. The API and which calls it serves: attention/attention_hopper.cuh.
 *
 * Why: the portable kernels (attention/attention_cuda.cu) are FlashAttention-2 style mma.sync kernels
 * that run on sm_80 and later; on Hopper the way past mma.sync is wgmma (a warpgroup of 4 warps issues
 * one asynchronous 64 x N x 16 MMA reading its operands from shared memory), TMA (one thread moves a
 * whole tile, global -> shared, tracked by an mbarrier) and warp specialisation (a producer warp keeps
 * the copies running while the math warps compute). Its lab and first H200 run (layout probe exact,
 * 69/0 against the mma.sync forward in bf16 mode, 1.33-1.51x faster) are dev/attention_lab/hopper_fwd.cu
 * and dev/results/device_s4/call1/hopper_fwd.log; the building blocks are attention/hopper_wgmma.cuh.
 *
 * What it computes (docs/ATTENTION_NUMERICS.md; attention_cuda.cu's forward is the operation-by-operation
 * spec, so the stats mean exactly what the backward expects):
 *   S = Q K^T in FP32 (wgmma, BF16 operands); running max m per row over key tiles;
 *   bf16:                 x = fma(S, c, -fl(m c)) (__fmaf_rn), stats {m s + ln l, 0}
 *   repair, gproj, fp32:  x = (S - m) c (P_max == 1 exactly), stats {m, l}
 *   e = exp2(x); l = sum of the FP32 e; O = bf( sum bf(e) V / l ) with bf(e) as the register A operand
 *   of the P V wgmma; fp32 mode adds bf(e - bf(e)) V as a second register A operand (e exact to 2^-17).
 * Not here: repair's tile-max-shift arm (its tile is the portable kernel's 64 keys; attention.h).
 * Two things differ from the portable kernel: the order of the FP32 sums (the tensor core's k-loop, the
 * per-lane partial sums of l) and the key tile (128 keys here, 64 there), so a row whose running max
 * changes between keys 64 and 127 rounds bf(e) at another max. O agrees to about one BF16 ulp of its
 * row's scale; m is the same row max (exact, up to the last bits of S), l and the LSE agree to FP32 level.
 *
 * Kernel layout: one CTA = 128 query rows of one (b, h); warps 0-3 and 4-7 are two consumer warpgroups of
 * 64 query rows each (wgmma needs 4 aligned warps), warp 8 is the producer (one elected lane issues the
 * TMA copies). K/V tiles of 128 keys, two stages: full[s] (TMA bytes landed) and empty[s] (all 256
 * consumer threads are done with stage s) mbarriers. The fused qkv [B, T, 3, NH, HS] is described to TMA
 * as a 4-D tensor {HS, 3*NH, T, B} (encoded per call on the host - it holds the qkv pointer - and passed
 * __grid_constant__), so the strided layout costs nothing and rows past T read as zeros, per batch.
 * Shared tiles use the 128-byte swizzle, which TMA writes and wgmma reads natively: a tile is stored as
 * HS/64 column chunks of [rows][64] BF16 (128 bytes per row).
 * Bounded waits: every mbarrier wait is on a phase that a finite number of copies/arrivals completes (no
 * data-dependent spin), so a layout bug shows as wrong numbers, not a hang; the lab runs it under timeout.
 */
#include <math.h>
#include <stdint.h>
#include "attention/attention_hopper.cuh"
#include "attention/tile_order.cuh"
#include "attention/hopper_wgmma.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kBlockQ = ATTN_HOPPER_BLOCK_Q; /* query rows per CTA */
constexpr int kBlockK = ATTN_HOPPER_BLOCK_K; /* keys per K/V tile */
constexpr int kWarpgroupRows = 64;      /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockQ / kWarpgroupRows;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 32; /* + one producer warp, after the warpgroups (alignment) */
constexpr int kStages = 2;              /* K/V double buffering */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes; /* 8 rows x 128 B: the repeat of the 128B swizzle */
constexpr int kWgmmaK = 16;             /* k of every bf16 wgmma */
constexpr int kPvSteps = kBlockK / kWgmmaK;
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO ("assumed 1", i.e. 16 bytes) */
constexpr size_t kTmaAlignBytes = 16;   /* global address alignment TMA requires */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "one tensor map (one box shape) serves Q, K and V tiles");

/* Shared-memory plan of one CTA (byte offsets from a 1024-byte aligned base). Every tile (Q; K and V of
   each stage) is kBlockK rows x HS BF16, stored as HS/64 chunks of [kBlockK rows][128 bytes], swizzled. */
template <int HS>
struct SmemPlan {
    static constexpr int kChunks = HS / kChunkCols;
    static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;
    static constexpr int kTileBytes = kChunks * kChunkBytes;
    static constexpr int kQ = 0;
    static constexpr int kK = kQ + kTileBytes;           /* kStages tiles */
    static constexpr int kV = kK + kStages * kTileBytes; /* kStages tiles */
    static constexpr int kBarriers = kV + kStages * kTileBytes;
    static constexpr int kNumBarriers = 1 + 2 * kStages; /* q_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kChunkBytes % kSwizzleAtomBytes == 0, "tiles must stay 1024-byte aligned");
};

/* ---- the two GEMMs of one key tile, per warpgroup (shared by the kernel and the layout probe) ---- */

/* S = Q K^T for the warpgroup's 64 query rows x kBlockK keys: HS/16 k-steps. q_addr, k_addr: shared
   addresses of the warpgroup's first Q row and of the K tile (chunked, swizzled, 1024-aligned). k-step kk
   reads bytes 32 (kk % 4) .. +31 of the 128-byte rows of chunk kk / 4. S is written, not accumulated. */
template <int HS>
__device__ __forceinline__ void warpgroup_qk(float (&sacc)[kBlockK / 2], uint32_t q_addr, uint32_t k_addr) {
    constexpr int kChunkBytes = SmemPlan<HS>::kChunkBytes;
    constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes in a 128-byte row */
#pragma unroll
    for (int i = 0; i < kBlockK / 2; i++) sacc[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HS / kWgmmaK; kk++) {
        const uint32_t off = (kk / kKStepsPerChunk) * kChunkBytes + (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n128k16_ss(sacc, make_smem_desc(q_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                            make_smem_desc(k_addr + off, kUnusedLbo, kSwizzleAtomBytes));
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(sacc);
}

/* The register A operand of O += P V from the S accumulator, rounded to BF16: k-step kk takes S columns
   16kk..16kk+15 = accumulator registers 8kk..8kk+7 (hopper_wgmma.cuh, "Register fragments"). With
   residual, the operand is bf(x - bf(x)) instead (fp32 mode's second term). */
template <bool kResidual>
__device__ __forceinline__ uint32_t pack_p_pair(float lo, float hi) {
    if (kResidual) {
        lo -= __bfloat162float(__float2bfloat16_rn(lo));
        hi -= __bfloat162float(__float2bfloat16_rn(hi));
    }
    return pack_bf16x2(lo, hi);
}
template <bool kResidual>
__device__ __forceinline__ void pack_p_operand(uint32_t (&pa)[kPvSteps][4], const float (&sacc)[kBlockK / 2]) {
#pragma unroll
    for (int kk = 0; kk < kPvSteps; kk++) {
        pa[kk][0] = pack_p_pair<kResidual>(sacc[8 * kk + 0], sacc[8 * kk + 1]); /* row g,   cols 2t, 2t+1 */
        pa[kk][1] = pack_p_pair<kResidual>(sacc[8 * kk + 2], sacc[8 * kk + 3]); /* row g+8, cols 2t, 2t+1 */
        pa[kk][2] = pack_p_pair<kResidual>(sacc[8 * kk + 4], sacc[8 * kk + 5]); /* row g,   cols 2t+8, 2t+9 */
        pa[kk][3] = pack_p_pair<kResidual>(sacc[8 * kk + 6], sacc[8 * kk + 7]); /* row g+8, cols 2t+8, 2t+9 */
    }
}

/* O += P V: kPvSteps k-steps of 16 keys, each 16 rows (2048 bytes) further into the V tile at v_addr.
   The caller has touched o (rescale) and pa since the last wgmma: the fence orders that first. */
template <int HS>
__device__ __forceinline__ void issue_pv(float (&o)[HS / 2], const uint32_t (&pa)[kPvSteps][4], uint32_t v_addr) {
#pragma unroll
    for (int kk = 0; kk < kPvSteps; kk++)
        wgmma_pv(o, pa[kk], make_smem_desc(v_addr + kk * kWgmmaK * kSwizzleRowBytes, SmemPlan<HS>::kChunkBytes,
                                           kSwizzleAtomBytes));
}
template <int HS>
__device__ __forceinline__ void warpgroup_pv(float (&o)[HS / 2], uint32_t (&pa)[kPvSteps][4], uint32_t v_addr) {
    wgmma_fence();
    issue_pv<HS>(o, pa, v_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(pa); /* keeps the A registers live (unchanged) until the wgmmas that read them are done */
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel                                                                                        */
/* ------------------------------------------------------------------------------------------------ */
template <int HS, int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_fwd_kernel(const __grid_constant__ CUtensorMap qkv_map, bf16* __restrict__ out, float* __restrict__ stats,
                      int NH, int T, float scale, float c) {
    using Plan = SmemPlan<HS>;
    constexpr int kChunks = Plan::kChunks, kChunkBytes = Plan::kChunkBytes, kTileBytes = Plan::kTileBytes;
    constexpr int kSRegs = kBlockK / 2; /* S accumulator: 64 x kBlockK FP32 over 128 threads */
    constexpr int kORegs = HS / 2;      /* O accumulator: 64 x HS */

    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = q_full + 1;
    uint64_t* empty = full + kStages;

    const AttnTileOrder order = attn_tile_longest_first(); /* longest rows first, over all heads */
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int q0 = q_tile * kBlockQ;
    /* causal: key tiles up to the one holding the CTA's last row; only the last tile reaches past q0
       (kBlockQ == kBlockK and q0 is a multiple of both), so it is the only one that needs the mask */
    const int n_key_tiles = (min(q0 + kBlockQ, T) - 1) / kBlockK + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        init_pipeline_barriers<kStages>(q_full, full, empty, 1, kConsumerThreads);
    }
    __syncthreads();

    if (warp == kConsumerThreads / 32) {
        /* ---- producer warp: one lane issues every copy ---- */
        if (lane == 0) {
            mbar_arrive_expect_tx(q_full, kTileBytes);
            for (int ch = 0; ch < kChunks; ch++)
                tma_load_4d(q_s + ch * kChunkBytes, &qkv_map, q_full, ch * kChunkCols, kSlotQ * NH + h, q0, b);
            for (int kt = 0; kt < n_key_tiles; kt++) {
                const int s = kt % kStages;
                /* reuse of stage s: wait until the consumers released the tile of kt - kStages (its
                   release completed phase kt / kStages - 1 of empty[s]) */
                if (kt >= kStages) mbar_wait(&empty[s], (uint32_t)((kt / kStages - 1) & 1));
                mbar_arrive_expect_tx(&full[s], 2 * kTileBytes);
                for (int ch = 0; ch < kChunks; ch++) {
                    tma_load_4d(k_s + s * kTileBytes + ch * kChunkBytes, &qkv_map, &full[s], ch * kChunkCols,
                                kSlotK * NH + h, kt * kBlockK, b);
                    tma_load_4d(v_s + s * kTileBytes + ch * kChunkBytes, &qkv_map, &full[s], ch * kChunkCols,
                                kSlotV * NH + h, kt * kBlockK, b);
                }
            }
        }
        return; /* no block-wide barrier follows */
    }

    /* ---- consumer warpgroups: wg owns query rows q0 + 64 wg .. +63; this thread rows row0, row0 + 8 ---- */
    const int wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = q0 + wg * kWarpgroupRows + (warp % 4) * 16 + g;
    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; i++) o[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_part[2] = {0.f, 0.f}; /* this lane's part of the row sums (quad-summed at the end) */

    /* this warpgroup's 64 rows of the Q tile start 64 rows into each chunk (8 KB: 1024-aligned) */
    const uint32_t q_addr = smem_u32(q_s) + wg * kWarpgroupRows * kSwizzleRowBytes;
    mbar_wait(q_full, 0);
    __syncwarp(); /* lanes leave the polling loop at different times: reconverge for the .aligned wgmma */

    for (int kt = 0; kt < n_key_tiles; kt++) {
        const int s = kt % kStages;
        mbar_wait(&full[s], (uint32_t)((kt / kStages) & 1));
        __syncwarp();
        const uint32_t k_addr = smem_u32(k_s + s * kTileBytes), v_addr = smem_u32(v_s + s * kTileBytes);

        float sacc[kSRegs];
        warpgroup_qk<HS>(sacc, q_addr, k_addr);

        if (kt == n_key_tiles - 1) { /* key j visible to query i iff j <= i (also hides keys >= T) */
#pragma unroll
            for (int j = 0; j < kBlockK / 8; j++)
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (kt * kBlockK + 8 * j + 2 * t + e > row0 + 8 * r) sacc[4 * j + 2 * r + e] = -INFINITY;
        }
        /* online softmax (attention_cuda.cu's forward, operation for operation); every row sees key 0
           in tile 0, so m_new is finite from the first tile on */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < kBlockK / 8; j++) mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * r], sacc[4 * j + 2 * r + 1]));
            mx = quad_max(mx);
            const float m_new = fmaxf(m_run[r], mx);
            const float alpha = exp2f((m_run[r] - m_new) * c); /* 0 on the first tile */
            const float m_c = m_new * c;                       /* fl(m * c), bf16 mode */
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
            l_part[r] = l_part[r] * alpha + sum;
            m_run[r] = m_new;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[4 * n + 2 * r] *= alpha;
                o[4 * n + 2 * r + 1] *= alpha;
            }
        }
        /* O += bf(e) V (fp32 mode: + bf(e - bf(e)) V), bf(e) from registers */
        if constexpr (MODE == ATTN_FP32) {
            uint32_t pa[kPvSteps][4], pa_lo[kPvSteps][4];
            pack_p_operand<false>(pa, sacc);
            pack_p_operand<true>(pa_lo, sacc);
            wgmma_fence();
            issue_pv<HS>(o, pa, v_addr);
            issue_pv<HS>(o, pa_lo, v_addr);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(o);
            reg_fence(pa);
            reg_fence(pa_lo);
        } else {
            uint32_t pa[kPvSteps][4];
            pack_p_operand<false>(pa, sacc);
            warpgroup_pv<HS>(o, pa, v_addr);
        }
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s */
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

/* Layout probe: one CTA, the two consumer warpgroups, one tile of everything at token 0 of batch 0: the
   TMA copies (slot, head, zero fill past T), S = Q K^T by warpgroup_qk, written out through the assumed
   accumulator mapping, and O = bf(S) V by pack_p_operand + warpgroup_pv (no softmax). The host checks
   both against plain loops, so a failure says which assumption is wrong: S wrong -> the TMA map, the
   K-major descriptors/swizzle or the accumulator mapping; S right and O wrong -> the N-major V
   descriptor or the register-A mapping. */
template <int HS>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, int NH, int head, float* __restrict__ s_out,
                        float* __restrict__ o_out) {
    using Plan = SmemPlan<HS>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    const int tile_offset[3] = {Plan::kQ, Plan::kK, Plan::kV}; /* by slot */
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 3 * Plan::kTileBytes);
        for (int slot = kSlotQ; slot <= kSlotV; slot++)
            for (int ch = 0; ch < Plan::kChunks; ch++)
                tma_load_4d(smem + tile_offset[slot] + ch * Plan::kChunkBytes, &qkv_map, bar, ch * kChunkCols,
                            slot * NH + head, 0, 0);
    }
    mbar_wait(bar, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    float sacc[kBlockK / 2];
    warpgroup_qk<HS>(sacc, smem_u32(smem + Plan::kQ) + wg * kWarpgroupRows * kSwizzleRowBytes,
                     smem_u32(smem + Plan::kK));
#pragma unroll
    for (int j = 0; j < kBlockK / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) s_out[(row0 + 8 * r) * kBlockK + 8 * j + 2 * t + e] = sacc[4 * j + 2 * r + e];
    uint32_t pa[kPvSteps][4];
    pack_p_operand<false>(pa, sacc);
    float o[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) o[i] = 0.f;
    warpgroup_pv<HS>(o, pa, smem_u32(smem + Plan::kV));
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) o_out[(row0 + 8 * r) * HS + 8 * n + 2 * t + e] = o[4 * n + 2 * r + e];
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor map, launch                                                                          */
/* ------------------------------------------------------------------------------------------------ */

/* The fused qkv [B, T, 3, NH, HS] as a 4-D TMA tensor (hopper_wgmma.cuh's encode_head_map): boxes of
   {64 columns, 1 head, kBlockK tokens, 1 batch}. */
CUtensorMap make_qkv_map(const bf16* qkv, AttnShape s) {
    return encode_head_map(qkv, s, 3 * s.NH, kBlockK, "attention (Hopper)", "qkv");
}

template <int HS, int MODE>
void hopper_fwd_launch(const CUtensorMap& map, AttnShape s, bf16* out, float* stats, cudaStream_t stream) {
    constexpr int smem = SmemPlan<HS>::kAlloc;
    cudaCheck(cudaFuncSetAttribute(hopper_fwd_kernel<HS, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockQ), (unsigned)(s.B * s.NH));
    hopper_fwd_kernel<HS, MODE><<<grid, kThreads, smem, stream>>>(map, out, stats, s.NH, s.T, attn_softmax_scale(HS),
                                                                   attn_exp2_scale(HS));
    cudaCheckLastError();
}

template <int HS>
void hopper_fwd_dispatch_mode(AttnMode mode, const CUtensorMap& map, AttnShape s, bf16* out, float* stats,
                              cudaStream_t stream) {
    switch (mode) {
        case ATTN_FP32: hopper_fwd_launch<HS, ATTN_FP32>(map, s, out, stats, stream); break;
        case ATTN_BF16: hopper_fwd_launch<HS, ATTN_BF16>(map, s, out, stats, stream); break;
        case ATTN_REPAIR: hopper_fwd_launch<HS, ATTN_REPAIR>(map, s, out, stats, stream); break;
        case ATTN_GPROJ: hopper_fwd_launch<HS, ATTN_GPROJ>(map, s, out, stats, stream); break;
        default: die("attention_forward_hopper: invalid mode %d (choices: %s)", (int)mode, attn_mode_choices());
    }
}

}  // namespace

int attention_hopper_fwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv) {
    if ((int)mode < 0 || mode >= ATTN_NUM_MODES) return 0;
    if (mode == ATTN_REPAIR && opt.tile_max_shift) return 0; /* the shift arm's tile is the portable kernel's */
    if (s.HS != 64 && s.HS != 128) return 0;
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0;
}

void attention_forward_hopper(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                              cudaStream_t stream) {
    const AttnOptions no_options = {};
    if (!attention_hopper_fwd_supports(mode, no_options, s, qkv)) {
        die("attention_forward_hopper: unsupported call (mode %s, B=%d NH=%d T=%d HS=%d, qkv %p)\n"
            "  hint: head size 64 or 128, B*NH <= 65535, qkv 16-byte aligned; use attention_forward_cuda, which "
            "falls back to the portable kernel", (int)mode >= 0 && mode < ATTN_NUM_MODES ? attn_mode_name(mode) : "?",
            s.B, s.NH, s.T, s.HS, (const void*)qkv);
    }
    const CUtensorMap map = make_qkv_map(qkv, s);
    if (s.HS == 64) hopper_fwd_dispatch_mode<64>(mode, map, s, out, stats, stream);
    else hopper_fwd_dispatch_mode<128>(mode, map, s, out, stats, stream);
}

void attention_hopper_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, float* s_tile, float* o_tile) {
    if (s.B != 1 || s.T > kBlockK || head < 0 || head >= s.NH || (s.HS != 64 && s.HS != 128)) {
        die("attention_hopper_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS 64 or 128 (got B=%d NH=%d T=%d "
            "HS=%d head %d)", kBlockK, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap map = make_qkv_map(qkv, s);
    if (s.HS == 64) {
        cudaCheck(cudaFuncSetAttribute(layout_probe_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       SmemPlan<64>::kAlloc));
        layout_probe_kernel<64><<<1, kConsumerThreads, SmemPlan<64>::kAlloc>>>(map, s.NH, head, s_tile, o_tile);
    } else {
        cudaCheck(cudaFuncSetAttribute(layout_probe_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       SmemPlan<128>::kAlloc));
        layout_probe_kernel<128><<<1, kConsumerThreads, SmemPlan<128>::kAlloc>>>(map, s.NH, head, s_tile, o_tile);
    }
    cudaCheckLastError();
}
