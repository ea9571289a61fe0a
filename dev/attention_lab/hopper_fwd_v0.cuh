/*
 * dev/attention_lab/hopper_fwd_v0.cuh - the lab's "v0": a verbatim copy of the Hopper forward kernel as it
 * was in git 55d0434 (session 4's attention/attention_hopper.cu, before the intra-warpgroup overlap), in a
 * namespace of its own, so dev/attention_lab/hopper_fwd.cu can check the production forward against it BIT
 * FOR BIT (O and both stats floats, every mode) and time the two side by side.
 *
 * Why a copy: the overlap (S(kt) issued together with P(kt-1) V(kt-1), the softmax of tile kt under the
 * P V GEMM) keeps the exact sequence of operations on O, m and l, so its results must not move by a bit;
 * the only way to show that on a GPU is to run the old kernel next to the new one on the same inputs. A lab
 * keeps its naive and fast versions side by side (the portable kernel is the third, the numerics reference).
 *
 * What v0 does, per consumer warpgroup and key tile, strictly in sequence: S = Q K^T (wgmma, wait), mask,
 * online softmax (max, exp2, row sums, O *= alpha), pack bf(e) into register A operands, O += P V (wgmma,
 * wait), arrive on empty[s]; one producer warp (288 threads, no setmaxnreg), 2 stages, one barrier pair
 * per stage for K and V together. Only the header comment, this namespace, the entry point's name and the
 * layout probe (left out: production has one) differ from the original.
 *
 * Offers (namespace hopper_fwd_v0): forward(mode, shape, qkv, out, stats, stream) - same contract as
 * attention_forward_hopper (the caller checks attention_hopper_fwd_supports). Compiled for sm_90a only:
 * the including object is built with -gencode arch=compute_90a,code=sm_90a (attention/module.mk).
 */
#ifndef DEV_ATTENTION_LAB_HOPPER_FWD_V0_CUH
#define DEV_ATTENTION_LAB_HOPPER_FWD_V0_CUH

#include <math.h>
#include <stdint.h>
#include "attention/attention_hopper.cuh"
#include "attention/tile_order.cuh"
#include "attention/hopper_wgmma.cuh"

namespace hopper_fwd_v0 {

using namespace hopper_wgmma;

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
        default: die("hopper_fwd_v0: invalid mode %d (choices: %s)", (int)mode, attn_mode_choices());
    }
}

/* The v0 forward (git 55d0434's attention_forward_hopper, without the supports check: the caller's). */
inline void forward(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                    cudaStream_t stream) {
    const CUtensorMap map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, "hopper_fwd_v0", "qkv");
    if (s.HS == 64) hopper_fwd_dispatch_mode<64>(mode, map, s, out, stats, stream);
    else hopper_fwd_dispatch_mode<128>(mode, map, s, out, stats, stream);
}

}  // namespace hopper_fwd_v0

#endif /* DEV_ATTENTION_LAB_HOPPER_FWD_V0_CUH */
