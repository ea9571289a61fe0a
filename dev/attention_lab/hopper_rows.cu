/*
 * dev/attention_lab/hopper_rows.cu - a Hopper (sm_90a) prototype of the backward's query-major row pass:
 * gproj's lambda and the whole of gproj's dQ (and fp32 mode's D), on wgmma + TMA + a producer warp,
 * checked against the production backward (attention/attention_cuda.cu) and timed next to it.
 *
 * STATUS: written 2026-11-29 without a GPU; compiles for sm_90a with no spills and no ptxas-injected wgmma
 * serialisation (gproj kernel 168 registers: the cap ptxas gives 288 threads; fp32 106; probe 250); NEVER RUN.
 * Read the first H200 log's failures as layout or indexing bugs: the layout probe runs first and names the
 * operand that is wrong, then every shape prints D, lambda and dQ agreement separately.

 * Why: gproj's extra cost over bf16 (1.17-1.35x fwd+bwd on the H200) is the production row pass
 * attn_bwd_rows_kernel<HS, ATTN_GPROJ>, four mma.sync GEMMs per key tile over the whole causal row. That pass
 * has the FORWARD's shape (query rows as M; S = Q K^T from shared memory; then GEMMs whose A operand is
 * built in registers against a key-indexed tile), which is what dev/attention_lab/hopper_fwd.cu already runs
 * correctly on wgmma (1.33-1.51x faster than mma.sync). So this lab reuses its verified building blocks
 * (attention/hopper_wgmma.cuh) for the row pass.
 *
 * What the kernel computes, per query row i over its visible keys j <= i (docs/ATTENTION_NUMERICS.md; the
 * production row pass operation for operation, except the order of the FP32 sums inside the tensor core):
 *   S = Q K^T, dP = dO V^T (FP32, wgmma from shared memory, both K-major);
 *   P_ij = exp2((S_ij - m_i) c) * fl(1 / l_i) from the forward's stats {m, l} (repair/gproj/fp32 form);
 *   gproj: dS = P o (dP - D) in FP32 (D_i = sum_d dO_id O_id from the BF16 O, FP32, computed by
 *          rows_d_kernel exactly as the production prep kernel does);
 *          r_i = sum_j bf(dS_ij), p_i = sum_j bf(P_ij) (FP32, per lane in key order, then the quad: the same
 *          order as production), lambda_i = r_i / p_i (0 if p_i = 0);
 *          DSK_i = sum_j bf(dS_ij) K_j, PK_i = sum_j bf(P_ij) K_j (wgmma, A = bf(dS), bf(P) repacked from the
 *          accumulators as in the forward's P V, B = the K tile read N-major, trans-b = 1, like V there);
 *          dQ_i = bf(s * fma(-lambda_i, PK_i, DSK_i)) into the q slot of dqkv, lambda_i into the workspace's
 *          lambda slot (the layout of carve_workspace in attention_cuda.cu: dq_acc [rows*HS] fp32, D [rows],
 *          lambda [rows]), so the production attn_bwd_kernel<HS, ATTN_GPROJ> could follow unchanged.
 *   fp32:  D_i = sum_j P_ij dP_ij in FP32 into the workspace's D slot (no dQ here: fp32's dQ is key-major).
 *
 * Kernel layout (as hopper_fwd): one CTA = 128 query rows of one (b, h); warps 0-3 and 4-7 are two consumer
 * warpgroups of 64 rows, warp 8 the producer (one lane issues TMA). Q (from qkv, a 4-D map {HS, 3 NH, T, B})
 * and dO (a 4-D map {HS, NH, T, B}) are loaded once; K and V tiles of 128 keys, two stages, full/empty
 * mbarriers. Each 128-key tile is worked in two 64-key halves: S and dP of a half (m64n64 SS wgmma, one
 * group), P and dS in registers, then DSK and PK of that half (m64n64 RS wgmma); with whole 128-key tiles the
 * four accumulators (S 64 + dP 64 + DSK 32 + PK 32 floats per thread) spilled even at 224 registers. Rows
 * and keys past T are zero-filled by TMA and masked. HS 64 only: at HS 128 DSK and PK alone are 128 floats
 * per thread and the tiles 2x larger; hopper_rows_prepare refuses it with a hint and main skips it
 * (production keeps its mma.sync pass there).
 * New wrappers (here, not in hopper_wgmma.cuh): wgmma_m64n64k16_ss, warpgroup_ss (S and dP
 * of a 64-key half as one committed group),
 * warpgroup_rs_k (DSK and PK against the N-major K tile).
 * Not done (next steps): overlap of the DSK/PK GEMMs of tile kt with S/dP of tile kt+1 (wait<1>), setmaxnreg,
 * the prep (D) fused into the pass, HS 128 (needs 64-key halves for S/dP and two passes, or a third warpgroup).
 *
 * Usage: hopper_rows   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
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

using namespace hopper_wgmma;

namespace {

constexpr int kHS = 64;                 /* the only head size of this lab (see the header comment) */
constexpr int kBlockQ = 128;            /* query rows per CTA */
constexpr int kBlockK = 128;            /* keys per K/V tile */
constexpr int kWarpgroupRows = 64;      /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockQ / kWarpgroupRows;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 32; /* + one producer warp, after the warpgroups (alignment) */
constexpr int kStages = 2;              /* K/V double buffering */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes; /* 8 rows x 128 B: the repeat of the 128B swizzle */
constexpr int kWgmmaK = 16;             /* k of every bf16 wgmma */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO ("assumed 1", i.e. 16 bytes) */
/* The S/dP GEMMs and the P/dS work run over 64-key halves of each 128-key tile: four accumulators over the
   whole tile (S 64 + dP 64 + DSK 32 + PK 32 floats per thread) spill even at 224 registers (ptxas, CUDA 13.0:
   460 bytes), halves do not. */
constexpr int kSubKeys = 64;
constexpr int kSubTiles = kBlockK / kSubKeys;
constexpr int kSRegs = kSubKeys / 2;    /* S or dP accumulator: 64 x kSubKeys FP32 over 128 threads */
constexpr int kDqRegs = kHS / 2;        /* DSK or PK accumulator: 64 x HS */
constexpr int kKeySteps = kSubKeys / kWgmmaK; /* k-steps of the DSK/PK GEMMs per half (16 keys each) */
constexpr int kSubTileBytes = kSubKeys * kSwizzleRowBytes; /* 8 KB: halves stay 1024-byte aligned */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "one box shape serves Q, dO, K and V tiles; only the last key tile is diagonal");
static_assert(kHS == kChunkCols, "one 64-column chunk per tile: the descriptors below assume HS 64");

/* Shared-memory plan (byte offsets from a 1024-byte aligned base): Q, dO, then kStages K and V tiles, each
   kBlockK rows x 64 BF16 = one swizzled chunk of 16 KB. */
struct SmemPlan {
    static constexpr int kTileBytes = kBlockK * kSwizzleRowBytes;
    static constexpr int kQ = 0;
    static constexpr int kDO = kQ + kTileBytes;
    static constexpr int kK = kDO + kTileBytes;          /* kStages tiles */
    static constexpr int kV = kK + kStages * kTileBytes; /* kStages tiles */
    static constexpr int kBarriers = kV + kStages * kTileBytes;
    static constexpr int kNumBarriers = 1 + 2 * kStages; /* q_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kTileBytes % kSwizzleAtomBytes == 0, "tiles must stay 1024-byte aligned");
};

/* ---- the GEMMs of one key tile, per warpgroup (shared by the kernel and the layout probe) ---- */

/* D[64 x 64] += A[64 x 16] * B[16 x 64]: A and B from shared memory through descriptors, both K-major
   (imm-trans-a = imm-trans-b = 0); scale-d true, no negation. (hopper_wgmma.cuh has the n128 form.) */
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, acc, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

/* S = Q K^T and dP = dO V^T for the warpgroup's 64 query rows x kSubKeys keys (k_addr, v_addr: the first key
   of the half), issued as one group (the tensor core runs them back to back): HS/16 k-steps each, K-major A
   and B, k-step kk at byte 32 kk of the 128-byte rows. Both accumulators are written, not accumulated. */
__device__ __forceinline__ void warpgroup_ss(float (&sacc)[kSRegs], float (&dpacc)[kSRegs], uint32_t q_addr,
                                             uint32_t k_addr, uint32_t do_addr, uint32_t v_addr) {
#pragma unroll
    for (int i = 0; i < kSRegs; i++) sacc[i] = dpacc[i] = 0.f;
    /* pins the zeroing before the fence (else the compiler sinks the moves past it and ptxas has to
       serialise the wgmmas with an injected warpgroup.arrive) */
    reg_fence(sacc);
    reg_fence(dpacc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
        const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n64k16_ss(sacc, make_smem_desc(q_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                            make_smem_desc(k_addr + off, kUnusedLbo, kSwizzleAtomBytes));
    }
#pragma unroll
    for (int kk = 0; kk < kHS / kWgmmaK; kk++) {
        const uint32_t off = kk * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n64k16_ss(dpacc, make_smem_desc(do_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                            make_smem_desc(v_addr + off, kUnusedLbo, kSwizzleAtomBytes));
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(sacc);
    reg_fence(dpacc);
}

/* A operand (BF16, registers) of a GEMM over the tile's keys from an FP32 accumulator of the same tile:
   k-step kk takes columns 16kk..16kk+15 = registers 8kk..8kk+7 (hopper_wgmma.cuh's fragment comment). */
__device__ __forceinline__ void pack_a_operand(uint32_t (&a)[kKeySteps][4], const float (&acc)[kSRegs]) {
#pragma unroll
    for (int kk = 0; kk < kKeySteps; kk++) {
        a[kk][0] = pack_bf16x2(acc[8 * kk + 0], acc[8 * kk + 1]); /* row g,   cols 2t, 2t+1 */
        a[kk][1] = pack_bf16x2(acc[8 * kk + 2], acc[8 * kk + 3]); /* row g+8, cols 2t, 2t+1 */
        a[kk][2] = pack_bf16x2(acc[8 * kk + 4], acc[8 * kk + 5]); /* row g,   cols 2t+8, 2t+9 */
        a[kk][3] = pack_bf16x2(acc[8 * kk + 6], acc[8 * kk + 7]); /* row g+8, cols 2t+8, 2t+9 */
    }
}

/* DSK += bf(dS) K and PK += bf(P) K over one half: kSubKeys/16 k-steps of 16 keys against the K tile at k_addr read N-major
   (trans-b = 1: the head dim, N, is contiguous), each k-step 16 rows = 2048 bytes further; exactly the
   forward's O += P V with K in place of V. The caller touched the accumulators/A registers since the last
   wgmma: the fence orders that first. */
__device__ __forceinline__ void warpgroup_rs_k(float (&dsk)[kDqRegs], float (&pk)[kDqRegs],
                                               uint32_t (&dsa)[kKeySteps][4], uint32_t (&pa)[kKeySteps][4],
                                               uint32_t k_addr) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeySteps; kk++) {
        const uint64_t desc = make_smem_desc(k_addr + kk * kWgmmaK * kSwizzleRowBytes, SmemPlan::kTileBytes,
                                             kSwizzleAtomBytes);
        wgmma_m64n64k16_rs(dsk, dsa[kk], desc);
        wgmma_m64n64k16_rs(pk, pa[kk], desc);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dsk);
    reg_fence(pk);
    reg_fence(dsa); /* keeps the A registers live (unchanged) until the wgmmas that read them are done */
    reg_fence(pa);
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernels                                                                                       */
/* ------------------------------------------------------------------------------------------------ */

/* D_i = sum_d dO_id O_id from the BF16 O, FP32, one warp per row: the production prep kernel's formula and
   order (lane d and d + 32, then a butterfly), so D should agree with the production D bit for bit (the check
   allows 1e-6 sigma_dP, in case the compiler contracts the products differently). */
__global__ void rows_d_kernel(const bf16* __restrict__ out, const bf16* __restrict__ dout, float* __restrict__ D,
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
    for (int d = lane; d < kHS; d += 32) sum += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
    if (lane == 0) D[row] = sum;
}

/* The row pass. MODE: ATTN_GPROJ (lambda, dQ; reads D) or ATTN_FP32 (writes D = sum P dP). */
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_rows_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                       const float* __restrict__ stats, float* __restrict__ D, float* __restrict__ lambda,
                       bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    static_assert(MODE == ATTN_GPROJ || MODE == ATTN_FP32, "row pass exists for gproj and fp32 only");
    constexpr bool kGproj = (MODE == ATTN_GPROJ);
    constexpr int kTileBytes = SmemPlan::kTileBytes;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    unsigned char* q_s = smem + SmemPlan::kQ;
    unsigned char* do_s = smem + SmemPlan::kDO;
    unsigned char* k_s = smem + SmemPlan::kK;
    unsigned char* v_s = smem + SmemPlan::kV;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + SmemPlan::kBarriers);
    uint64_t* full = q_full + 1;
    uint64_t* empty = full + kStages;

    const int q_tile = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = q_tile * kBlockQ;
    const int n_key_tiles = (min(q0 + kBlockQ, T) - 1) / kBlockK + 1; /* = q_tile + 1 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < kStages; s++) {
            mbar_init(&full[s], 1);                 /* the producer's arrive.expect_tx + the TMA bytes */
            mbar_init(&empty[s], kConsumerThreads); /* every consumer thread, after its last read */
        }
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();

    if (warp == kConsumerThreads / 32) {
        /* ---- producer warp: one lane issues every copy ---- */
        if (lane == 0) {
            mbar_arrive_expect_tx(q_full, 2 * kTileBytes);
            tma_load_4d(q_s, &qkv_map, q_full, 0, kSlotQ * NH + h, q0, b);
            tma_load_4d(do_s, &dout_map, q_full, 0, h, q0, b);
            for (int kt = 0; kt < n_key_tiles; kt++) {
                const int s = kt % kStages;
                /* reuse of stage s: its release for tile kt - kStages completed phase kt / kStages - 1 */
                if (kt >= kStages) mbar_wait(&empty[s], (uint32_t)((kt / kStages - 1) & 1));
                mbar_arrive_expect_tx(&full[s], 2 * kTileBytes);
                tma_load_4d(k_s + s * kTileBytes, &qkv_map, &full[s], 0, kSlotK * NH + h, kt * kBlockK, b);
                tma_load_4d(v_s + s * kTileBytes, &qkv_map, &full[s], 0, kSlotV * NH + h, kt * kBlockK, b);
            }
        }
        return; /* no block-wide barrier follows */
    }

    /* ---- consumer warpgroups: wg owns query rows q0 + 64 wg .. +63; this thread rows row0, row0 + 8 ---- */
    const int wg = warp / 4, g = lane >> 2, t = lane & 3;
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
#pragma unroll
    for (int i = 0; i < kDqRegs; i++) dsk[i] = pk[i] = 0.f;
    reg_fence(dsk); /* the zeroing before any wgmma fence (see warpgroup_ss) */
    reg_fence(pk);

    const uint32_t wg_row_bytes = wg * kWarpgroupRows * kSwizzleRowBytes; /* 8 KB: stays 1024-aligned */
    const uint32_t q_addr = smem_u32(q_s) + wg_row_bytes, do_addr = smem_u32(do_s) + wg_row_bytes;
    mbar_wait(q_full, 0);
    __syncwarp(); /* lanes leave the polling loop at different times: reconverge for the .aligned wgmma */

    for (int kt = 0; kt < n_key_tiles; kt++) {
        const int s = kt % kStages;
        mbar_wait(&full[s], (uint32_t)((kt / kStages) & 1));
        __syncwarp();
        const uint32_t k_addr = smem_u32(k_s + s * kTileBytes), v_addr = smem_u32(v_s + s * kTileBytes);

        /* the mask only where it can bite (the diagonal tile, or a query tile that reaches past T) */
        const bool tile_masked = !(kt < n_key_tiles - 1 && q0 + kBlockQ <= T);
#pragma unroll 1
        for (int sub = 0; sub < kSubTiles; sub++) {
            const uint32_t k_sub = k_addr + sub * kSubTileBytes;
            float sacc[kSRegs], dpacc[kSRegs];
            warpgroup_ss(sacc, dpacc, q_addr, k_sub, do_addr, v_addr + sub * kSubTileBytes);

            /* P, dS and the row sums (each lane its keys in increasing order, as production); masked
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

            if (kGproj) {
                uint32_t pa[kKeySteps][4], dsa[kKeySteps][4];
                pack_a_operand(pa, sacc);
                pack_a_operand(dsa, dpacc);
                warpgroup_rs_k(dsk, pk, dsa, pa, k_sub);
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
    if (kGproj) {
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

/* Layout probe: one CTA, the two consumer warpgroups, one tile of everything at token 0 of batch 0 (head
   `head`): the TMA copies of Q, K, V (qkv map) and dO (dout map), S = Q K^T and dP = dO V^T through
   warpgroup_ss (two 64-key halves, as the kernel), and X = bf(S) K, Y = bf(dP) K through pack_a_operand + warpgroup_rs_k (no softmax).
   Each is written out through the assumed accumulator mapping and checked on the host against plain loops:
   S wrong -> qkv map / K-major descriptors (already verified by hopper_fwd: a regression); dP wrong, S right
   -> the dout map or V as K-major B; X or Y wrong, S and dP right -> K as N-major B or the register A. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ s_out, float* __restrict__ dp_out,
                        float* __restrict__ x_out, float* __restrict__ y_out) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + SmemPlan::kBarriers);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 4 * SmemPlan::kTileBytes);
        tma_load_4d(smem + SmemPlan::kQ, &qkv_map, bar, 0, kSlotQ * NH + head, 0, 0);
        tma_load_4d(smem + SmemPlan::kK, &qkv_map, bar, 0, kSlotK * NH + head, 0, 0);
        tma_load_4d(smem + SmemPlan::kV, &qkv_map, bar, 0, kSlotV * NH + head, 0, 0);
        tma_load_4d(smem + SmemPlan::kDO, &dout_map, bar, 0, head, 0, 0);
    }
    mbar_wait(bar, 0);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp / 4, g = lane >> 2, t = lane & 3;
    const int row0 = wg * kWarpgroupRows + (warp % 4) * 16 + g;
    const uint32_t wg_row_bytes = wg * kWarpgroupRows * kSwizzleRowBytes;
    const uint32_t k_addr = smem_u32(smem + SmemPlan::kK);
    float x[kDqRegs], y[kDqRegs];
#pragma unroll
    for (int i = 0; i < kDqRegs; i++) x[i] = y[i] = 0.f;
    reg_fence(x); /* the zeroing before any wgmma fence (see warpgroup_ss) */
    reg_fence(y);
#pragma unroll
    for (int sub = 0; sub < kSubTiles; sub++) { /* the kernel's two 64-key halves, X and Y accumulating */
        float sacc[kSRegs], dpacc[kSRegs];
        warpgroup_ss(sacc, dpacc, smem_u32(smem + SmemPlan::kQ) + wg_row_bytes, k_addr + sub * kSubTileBytes,
                     smem_u32(smem + SmemPlan::kDO) + wg_row_bytes,
                     smem_u32(smem + SmemPlan::kV) + sub * kSubTileBytes);
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
        pack_a_operand(sa, sacc);
        pack_a_operand(dpa, dpacc);
        warpgroup_rs_k(y, x, dpa, sa, k_addr + sub * kSubTileBytes);
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

}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, workspace layout, launch                                                       */
/* ------------------------------------------------------------------------------------------------ */

/* A 4-D BF16 tensor {HS, heads, T, B} (innermost first) with token stride row_elems, boxes of
   {64 columns, 1 head, kBlockK tokens, 1 batch}, 128-byte swizzle, zeros outside. qkv: heads = 3 NH
   (slot * NH + head), row_elems = 3 NH HS; dout: heads = NH, row_elems = NH HS. */
static CUtensorMap make_map(const bf16* base, AttnShape s, int heads, const char* what) {
    CUtensorMap map;
    const cuuint64_t row_bytes = (cuuint64_t)heads * s.HS * sizeof(bf16);
    const cuuint64_t dims[4] = {(cuuint64_t)s.HS, (cuuint64_t)heads, (cuuint64_t)s.T, (cuuint64_t)s.B};
    const cuuint64_t strides[3] = {(cuuint64_t)s.HS * sizeof(bf16), row_bytes, (cuuint64_t)s.T * row_bytes};
    const cuuint32_t box[4] = {(cuuint32_t)kChunkCols, 1, (cuuint32_t)kBlockK, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void*)base, dims, strides,
                                            box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        die("hopper_rows: cuTensorMapEncodeTiled failed (CUresult %d) for %s, B=%d NH=%d T=%d HS=%d\n"
            "  hint: the buffer must be 16-byte aligned (cudaMalloc is) and HS 64",
            (int)r, what, s.B, s.NH, s.T, s.HS);
    }
    return map;
}

/* The production backward's workspace layout (carve_workspace in attention/attention_cuda.cu, internal
   there): dq_acc [rows * HS] fp32, then D [rows], then lambda [rows], rows = B*NH*T, row index
   (b*NH + h)*T + t. The checks verify it: the size against attention_cuda_workspace_bytes, and the D slot
   against this lab's own D (same formula, so equal bit for bit) before lambda is read. */
struct RowsWorkspace {
    float* D;
    float* lambda;
};
static size_t rows_of(AttnShape s) { return (size_t)s.B * s.NH * s.T; }
static RowsWorkspace carve_rows_workspace(AttnShape s, void* ws) {
    RowsWorkspace w;
    w.D = static_cast<float*>(ws) + rows_of(s) * s.HS;
    w.lambda = w.D + rows_of(s);
    return w;
}

/* What a launch needs that depends on the shape and the buffers only (the maps encode the pointers). */
struct HopperRows {
    AttnShape shape;
    CUtensorMap qkv_map, dout_map;
};

static HopperRows hopper_rows_prepare(AttnShape s, const bf16* qkv, const bf16* dout) {
    attention_cuda_check_shape(s, ATTN_GPROJ);
    if (s.HS != kHS) {
        die("hopper_rows: head size %d is not supported by the wgmma row pass (HS 64 only)\n"
            "  hint: at HS 128 its four accumulators do not fit in registers; production keeps mma.sync there",
            s.HS);
    }
    cudaCheck(cudaFuncSetAttribute(hopper_rows_kernel<ATTN_GPROJ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(hopper_rows_kernel<ATTN_FP32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    HopperRows r;
    r.shape = s;
    r.qkv_map = make_map(qkv, s, 3 * s.NH, "qkv");
    r.dout_map = make_map(dout, s, s.NH, "dout");
    return r;
}

/* D (gproj: from the BF16 O, as the production prep kernel) into the workspace's D slot. */
static void hopper_rows_d_launch(AttnShape s, const bf16* out, const bf16* dout, void* workspace, cudaStream_t st) {
    const RowsWorkspace w = carve_rows_workspace(s, workspace);
    const long long rows = (long long)rows_of(s);
    rows_d_kernel<<<(unsigned)ceil_div(rows, 4), 128, 0, st>>>(out, dout, w.D, s.NH, s.T, rows);
    cudaCheckLastError();
}

/* The row pass: gproj writes lambda (workspace) and dQ (q slot of dqkv), reading D (workspace);
   fp32 writes D = sum P dP (workspace). */
static void hopper_rows_launch(const HopperRows& f, AttnMode mode, const float* stats, bf16* dqkv, void* workspace,
                               cudaStream_t st) {
    const AttnShape s = f.shape;
    const RowsWorkspace w = carve_rows_workspace(s, workspace);
    const dim3 grid((unsigned)ceil_div(s.T, kBlockQ), (unsigned)(s.B * s.NH));
    const float scale = attn_softmax_scale(s.HS), c = attn_exp2_scale(s.HS);
    if (mode == ATTN_GPROJ)
        hopper_rows_kernel<ATTN_GPROJ><<<grid, kThreads, SmemPlan::kAlloc, st>>>(
            f.qkv_map, f.dout_map, stats, w.D, w.lambda, dqkv, s.NH, s.T, scale, c);
    else if (mode == ATTN_FP32)
        hopper_rows_kernel<ATTN_FP32><<<grid, kThreads, SmemPlan::kAlloc, st>>>(
            f.qkv_map, f.dout_map, stats, w.D, w.lambda, dqkv, s.NH, s.T, scale, c);
    else
        die("hopper_rows: mode %s has no row pass (gproj and fp32 only)", attn_mode_name(mode));
    cudaCheckLastError();
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the production backward, timing                                             */
/* ------------------------------------------------------------------------------------------------ */

static AttnRng g_rng; /* seeded at the start of main */
static float normal01(void) { return (float)attn_rng_normal(&g_rng); }
static double bf16_ulp(double x, double floor_mag) {
    const double a = fmax(fabs(x), floor_mag);
    return a > 0 ? ldexp(1.0, (int)floor(log2(a)) - 7) : 0.0;
}
static float median_f(float* v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const float tmp = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tmp;
        }
    return v[n / 2];
}
static double median_d(double* v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof(double), [](const void* a, const void* b) {
        const double x = *(const double*)a, y = *(const double*)b;
        return (x > y) - (x < y);
    });
    return v[n / 2];
}

/* Tolerances, set before any run. dQ: the two kernels sum DSK and PK in different orders inside the tensor
   core (and S, dP, so a BF16 rounding of P or dS may flip): a few BF16 ulps of the row scale (the row's RMS
   as the floor), far below the O(1) of a layout error. lambda (and fp32's D): r_i is a sum of BF16-rounded
   dS whose exact value is itself rounding noise, so one flipped rounding of dS_ij moves lambda by up to
   2^-8 |dS_ij| / p_i; compared in units u = 2^-9 sigma_dP of the head (sigma_dP = sqrt(HS) rms(dO) rms(V),
   the scale of dP - D), most rows agree exactly (same per-lane key order as production). */
static const double kMaxDqUlps = 8.0;
static const double kMaxDqRelFro = 4e-3;    /* ||dQ_new - dQ_ref||_F / ||dQ_ref||_F over the whole tensor */
static const double kMaxLambdaUnits = 16.0; /* max |dlambda| / u (a few flipped roundings in one row) */
static const double kMedLambdaUnits = 1e-2; /* median |dlambda| / u */
static const double kMaxDRel = 1e-5;        /* fp32 mode D (sum P dP, tensor-core order): |dD| / sigma_dP */
static const double kMaxDPrepRel = 1e-6;    /* gproj D (dO . O, the prep kernel's order: expect bit-equal) */

struct CheckInputs {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

/* One shape: production forward (gproj or fp32) for out and stats, then the production backward and this
   lab's D + row pass on the same inputs (outputs and workspaces poisoned first), compared; optionally timed. */
static void check_shape(CheckInputs in, AttnMode mode, int time_it) {
    const AttnShape s = in.s;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: wgmma row pass vs attention_backward_cuda(%s)",
             s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset, attn_mode_name(mode));
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s), rows = rows_of(s);
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; the layout this lab assumes)",
          ws_bytes);
    uint16_t* h_qkv = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_dout = (uint16_t*)mallocCheck(nout * 2);
    const size_t row = 3ull * s.NH * s.HS;
    /* per-head unit vectors for the key offset */
    float* unit = (float*)mallocCheck((size_t)s.NH * s.HS * sizeof(float));
    for (int h = 0; h < s.NH; h++) {
        double n2 = 0;
        for (int d = 0; d < s.HS; d++) {
            unit[h * s.HS + d] = normal01();
            n2 += (double)unit[h * s.HS + d] * unit[h * s.HS + d];
        }
        for (int d = 0; d < s.HS; d++) unit[h * s.HS + d] = (float)(unit[h * s.HS + d] / sqrt(n2));
    }
    double sq_do = 0, sq_v = 0;
    for (size_t i = 0; i < nqkv; i++) {
        const size_t in_row = i % row;
        const int slot = (int)(in_row / ((size_t)s.NH * s.HS));
        const int h = (int)(in_row / s.HS) % s.NH, d = (int)(in_row % s.HS);
        float x = normal01();
        if (slot == kSlotQ) x *= in.q_scale;
        if (slot == kSlotK) x += in.key_offset * unit[h * s.HS + d];
        h_qkv[i] = float_to_bf16_bits(x);
        if (slot == kSlotV) sq_v += (double)bf16_bits_to_float(h_qkv[i]) * bf16_bits_to_float(h_qkv[i]);
    }
    for (size_t i = 0; i < nout; i++) {
        h_dout[i] = float_to_bf16_bits(normal01());
        sq_do += (double)bf16_bits_to_float(h_dout[i]) * bf16_bits_to_float(h_dout[i]);
    }
    const double sigma_dp = sqrt((double)s.HS) * sqrt(sq_do / nout) * sqrt(sq_v / nout);
    const double lambda_unit = ldexp(sigma_dp, -9);

    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_new;
    float* stats;
    void *ws_ref, *ws_new;
    cudaCheck(cudaMalloc(&qkv, nqkv * 2));
    cudaCheck(cudaMalloc(&dout, nout * 2));
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&dqkv_ref, nqkv * 2));
    cudaCheck(cudaMalloc(&dqkv_new, nqkv * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    cudaCheck(cudaMalloc(&ws_ref, ws_bytes));
    cudaCheck(cudaMalloc(&ws_new, ws_bytes));
    cudaCheck(cudaMemcpy(qkv, h_qkv, nqkv * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dout, h_dout, nout * 2, cudaMemcpyHostToDevice));
    /* poison: 0xFFFF is a BF16 NaN, 0xFFFFFFFF an FP32 NaN; any output left unwritten shows */
    cudaCheck(cudaMemset(dqkv_ref, 0xFF, nqkv * 2));
    cudaCheck(cudaMemset(dqkv_new, 0xFF, nqkv * 2));
    cudaCheck(cudaMemset(ws_ref, 0xFF, ws_bytes));
    cudaCheck(cudaMemset(ws_new, 0xFF, ws_bytes));
    const AttnOptions opt = {0};
    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, 0);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
    const HopperRows f = hopper_rows_prepare(s, qkv, dout);
    if (mode == ATTN_GPROJ) hopper_rows_d_launch(s, out, dout, ws_new, 0);
    hopper_rows_launch(f, mode, stats, dqkv_new, ws_new, 0);
    cudaCheck(cudaDeviceSynchronize());

    const RowsWorkspace w_ref = carve_rows_workspace(s, ws_ref), w_new = carve_rows_workspace(s, ws_new);
    float* hD_ref = (float*)mallocCheck(rows * 4);
    float* hD_new = (float*)mallocCheck(rows * 4);
    cudaCheck(cudaMemcpy(hD_ref, w_ref.D, rows * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hD_new, w_new.D, rows * 4, cudaMemcpyDeviceToHost));
    size_t nan_d_ref = 0, nan_d_new = 0, d_unequal = 0;
    double max_d = 0;
    for (size_t i = 0; i < rows; i++) {
        if (isnan(hD_ref[i])) nan_d_ref++;
        if (isnan(hD_new[i])) nan_d_new++;
        if (isnan(hD_ref[i]) || isnan(hD_new[i])) continue;
        if (hD_ref[i] != hD_new[i]) d_unequal++;
        max_d = fmax(max_d, fabs((double)hD_ref[i] - hD_new[i]) / sigma_dp);
    }
    CHECK(nan_d_ref == 0, "production wrote D at workspace + rows*HS floats, finite (%zu NaN: the offset is wrong)",
          nan_d_ref);
    CHECK(nan_d_new == 0, "lab wrote every D, finite (%zu NaN)", nan_d_new);
    if (mode == ATTN_GPROJ) {
        printf("  D (prep formula): %zu of %zu rows not bit-equal to production's D slot, max |diff| / sigma_dP %.3g\n",
               d_unequal, rows, max_d);
        CHECK(max_d <= kMaxDPrepRel, "D slot of the production workspace matches this lab's D (same formula; max %.3g"
              " sigma_dP): the offset rows*HS is right", max_d);
    } else {
        printf("  D = sum P dP: max |diff| / sigma_dP %.3g, %zu of %zu rows not bit-equal\n", max_d, d_unequal, rows);
        CHECK(max_d <= kMaxDRel, "fp32 D within %.0e sigma_dP of production (max %.3g)", kMaxDRel, max_d);
    }

    if (mode == ATTN_GPROJ) {
        float* hl_ref = (float*)mallocCheck(rows * 4);
        float* hl_new = (float*)mallocCheck(rows * 4);
        cudaCheck(cudaMemcpy(hl_ref, w_ref.lambda, rows * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(hl_new, w_new.lambda, rows * 4, cudaMemcpyDeviceToHost));
        size_t nan_l_ref = 0, nan_l_new = 0, l_unequal = 0;
        double* units = (double*)mallocCheck(rows * sizeof(double));
        size_t n_units = 0;
        double max_units = 0;
        for (size_t i = 0; i < rows; i++) {
            if (isnan(hl_ref[i])) nan_l_ref++;
            if (isnan(hl_new[i])) nan_l_new++;
            if (isnan(hl_ref[i]) || isnan(hl_new[i])) continue;
            if (hl_ref[i] != hl_new[i]) l_unequal++;
            units[n_units] = fabs((double)hl_ref[i] - hl_new[i]) / lambda_unit;
            max_units = fmax(max_units, units[n_units]);
            n_units++;
        }
        const double med_units = median_d(units, n_units);
        printf("  lambda: %zu of %zu rows not bit-equal; |diff| in units u = 2^-9 sigma_dP (%.3g): median %.3g,"
               " max %.3g\n", l_unequal, rows, lambda_unit, med_units, max_units);
        CHECK(nan_l_ref == 0, "production wrote lambda at workspace + rows*(HS+1) floats (%zu NaN)", nan_l_ref);
        CHECK(nan_l_new == 0, "lab wrote every lambda, finite (%zu NaN)", nan_l_new);
        CHECK(med_units <= kMedLambdaUnits, "lambda: median |diff| <= %.0e u (%.3g)", kMedLambdaUnits, med_units);
        CHECK(max_units <= kMaxLambdaUnits, "lambda: max |diff| <= %.0f u (%.3g)", kMaxLambdaUnits, max_units);
        free(hl_ref); free(hl_new); free(units);

        /* dQ: the q slot of dqkv, one (b, t, h) row of HS values at a time */
        uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
        uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
        cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
        size_t nan_ref = 0, nan_new = 0, over_1ulp = 0, untouched_kv = 0;
        double max_ulps = 0, sq_diff = 0, sq_ref = 0;
        for (size_t tok = 0; tok < (size_t)s.B * s.T; tok++)
            for (int h = 0; h < s.NH; h++) {
                const size_t base = tok * row + (size_t)h * s.HS; /* q slot */
                double sq = 0;
                for (int d = 0; d < s.HS; d++) {
                    const double a = bf16_bits_to_float(h_ref[base + d]);
                    if (!isnan(a)) sq += a * a;
                }
                const double rms = sqrt(sq / s.HS);
                for (int d = 0; d < s.HS; d++) {
                    const double a = bf16_bits_to_float(h_ref[base + d]), x = bf16_bits_to_float(h_new[base + d]);
                    if (isnan(a)) nan_ref++;
                    if (isnan(x)) nan_new++;
                    if (isnan(a) || isnan(x)) continue;
                    const double diff = fabs(a - x), ulp = bf16_ulp(fmax(fabs(a), fabs(x)), rms);
                    const double ulps = diff == 0 ? 0 : (ulp > 0 ? diff / ulp : INFINITY);
                    max_ulps = fmax(max_ulps, ulps);
                    if (ulps > 1.0) over_1ulp++;
                    sq_diff += diff * diff;
                    sq_ref += a * a;
                }
                /* the row pass writes only the q slot: the k and v slots keep their poison */
                for (size_t k = base + (size_t)s.NH * s.HS; k < base + 3ull * s.NH * s.HS; k += (size_t)s.NH * s.HS)
                    for (int d = 0; d < s.HS; d++)
                        if (h_new[k + d] != 0xFFFF) untouched_kv++;
            }
        const double rel_fro = sq_ref > 0 ? sqrt(sq_diff / sq_ref) : (sq_diff > 0 ? INFINITY : 0);
        printf("  dQ: max %.2f BF16 ulps (of max(|a|, |b|, row RMS)), %zu of %zu over 1 ulp; rel Frobenius diff %.3g\n",
               max_ulps, over_1ulp, nout, rel_fro);
        CHECK(nan_ref == 0, "production wrote every dQ, finite (%zu NaN)", nan_ref);
        CHECK(nan_new == 0, "lab wrote every dQ, finite (%zu NaN left)", nan_new);
        CHECK(untouched_kv == 0, "lab wrote nothing outside the q slot (%zu k/v values changed)", untouched_kv);
        CHECK(max_ulps <= kMaxDqUlps, "dQ within %.0f BF16 ulps of production (max %.2f)", kMaxDqUlps, max_ulps);
        CHECK(rel_fro <= kMaxDqRelFro, "dQ rel Frobenius diff <= %.0e (%.3g)", kMaxDqRelFro, rel_fro);
        free(h_ref); free(h_new);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        float t_bwd[kReps], t_repair[kReps], t_rows[kReps], t_d[kReps];
        /* the repair backward on the same inputs: the backward without a row pass (dQ key-major) */
        bf16 *out_rep, *dqkv_rep;
        float* stats_rep;
        cudaCheck(cudaMalloc(&out_rep, nout * 2));
        cudaCheck(cudaMalloc(&dqkv_rep, nqkv * 2));
        cudaCheck(cudaMalloc(&stats_rep, nstats * 4));
        attention_forward_cuda(ATTN_REPAIR, opt, s, qkv, out_rep, stats_rep, NULL, 0);
        auto timed = [&](float* dst, auto&& fn) {
            cudaCheck(cudaEventRecord(e0));
            fn();
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(dst, e0, e1));
        };
        auto run_bwd = [&] { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0); };
        auto run_repair = [&] {
            attention_backward_cuda(ATTN_REPAIR, opt, s, qkv, out_rep, stats_rep, dout, dqkv_rep, ws_ref, 0);
        };
        auto run_d = [&] { hopper_rows_d_launch(s, out, dout, ws_new, 0); };
        auto run_rows = [&] { hopper_rows_launch(f, mode, stats, dqkv_new, ws_new, 0); };
        for (int i = 0; i < kWarmup; i++) {
            run_bwd(); run_repair(); run_d(); run_rows();
        }
        for (int i = 0; i < kReps; i++) {
            timed(&t_bwd[i], run_bwd);
            timed(&t_repair[i], run_repair);
            timed(&t_d[i], run_d);
            timed(&t_rows[i], run_rows);
        }
        cudaCheck(cudaDeviceSynchronize());
        const int n_gemms = (mode == ATTN_GPROJ) ? 4 : 2; /* S, dP (+ DSK, PK) */
        const double flops = n_gemms * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2; /* causal */
        const float ms_bwd = median_f(t_bwd, kReps), ms_rep = median_f(t_repair, kReps);
        const float ms_d = median_f(t_d, kReps), ms_rows = median_f(t_rows, kReps);
        printf("  time (median of %d): production %s backward %.4f ms; production repair backward %.4f ms"
               " (no row pass; %s - repair = %.4f ms ~ the production row pass + its prep work)\n",
               (int)kReps, attn_mode_name(mode), ms_bwd, ms_rep, attn_mode_name(mode), ms_bwd - ms_rep);
        printf("  time: wgmma row pass %.4f ms = %.1f TFLOP/s (%d GEMMs, causal); D kernel %.4f ms;"
               " row pass / production %s backward = %.3f\n",
               ms_rows, flops / ms_rows * 1e-9, n_gemms, ms_d, attn_mode_name(mode), ms_rows / ms_bwd);
        cudaCheck(cudaEventDestroy(e0));
        cudaCheck(cudaEventDestroy(e1));
        cudaCheck(cudaFree(out_rep)); cudaCheck(cudaFree(dqkv_rep)); cudaCheck(cudaFree(stats_rep));
    }
    free(h_qkv); free(h_dout); free(unit); free(hD_ref); free(hD_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_new));
}

/* FP32-accumulation error bound, relative to the sum of |products| (about HS * 2^-24 or 128 * 2^-24 for a
   correct layout); a layout error is off by O(1). */
static const double kProbeTol = 1e-4;

/* Checks one probed matrix got[rows x cols] against ref(i, n) = sum_k A(i, k) B(k, n) given as callbacks. */
template <typename Ref>
static int probe_compare(const char* name, const float* got, int nrows, int ncols, Ref ref_and_mag) {
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < nrows; i++)
        for (int n = 0; n < ncols; n++) {
            double ref = 0, mag = 0;
            ref_and_mag(i, n, &ref, &mag);
            const double x = got[i * ncols + n];
            if (!(fabs(x - ref) <= kProbeTol * mag + 1e-30)) {
                if (bad++ < 3) printf("  %s[%d][%d] = %.6g, want %.6g\n", name, i, n, x, ref);
            }
            const double err = isnan(x) ? INFINITY : fabs(x - ref) / (mag + 1e-30);
            worst = fmax(worst, err);
        }
    printf("  %s: %d of %d wrong (worst error / sum|products| %.3g)\n", name, bad, nrows * ncols, worst);
    return bad;
}

/* Runs layout_probe_kernel on B1 NH3 T100 (head 1: slot and head coordinates of both maps; T < 128: zero
   fill) and checks S, dP, X = bf(S) K and Y = bf(dP) K against double-precision loops over the same BF16
   values (X and Y from the kernel's own S and dP, rounded as it rounds). */
static void layout_probe(void) {
    test_section("layout probe HS64: S = Q K^T, dP = dO V^T, bf(S) K, bf(dP) K through the row pass's GEMM helpers");
    const AttnShape s = {1, 3, 100, kHS};
    const int head = 1;
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    uint16_t* h_qkv = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_dout = (uint16_t*)mallocCheck(nout * 2);
    for (size_t i = 0; i < nqkv; i++) h_qkv[i] = float_to_bf16_bits(normal01());
    for (size_t i = 0; i < nout; i++) h_dout[i] = float_to_bf16_bits(normal01());
    bf16 *qkv, *dout;
    float *d_s, *d_dp, *d_x, *d_y;
    const size_t n_sq = (size_t)kBlockQ * kBlockK, n_dq = (size_t)kBlockQ * kHS;
    cudaCheck(cudaMalloc(&qkv, nqkv * 2));
    cudaCheck(cudaMalloc(&dout, nout * 2));
    cudaCheck(cudaMalloc(&d_s, n_sq * 4));
    cudaCheck(cudaMalloc(&d_dp, n_sq * 4));
    cudaCheck(cudaMalloc(&d_x, n_dq * 4));
    cudaCheck(cudaMalloc(&d_y, n_dq * 4));
    cudaCheck(cudaMemcpy(qkv, h_qkv, nqkv * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dout, h_dout, nout * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(d_s, 0xFF, n_sq * 4)); /* NaN poison */
    cudaCheck(cudaMemset(d_dp, 0xFF, n_sq * 4));
    cudaCheck(cudaMemset(d_x, 0xFF, n_dq * 4));
    cudaCheck(cudaMemset(d_y, 0xFF, n_dq * 4));
    const CUtensorMap qmap = make_map(qkv, s, 3 * s.NH, "qkv"), dmap = make_map(dout, s, s.NH, "dout");
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qmap, dmap, s.NH, head, d_s, d_dp, d_x, d_y);
    cudaCheckLastError();
    cudaCheck(cudaDeviceSynchronize());
    float* h_s = (float*)mallocCheck(n_sq * 4);
    float* h_dp = (float*)mallocCheck(n_sq * 4);
    float* h_x = (float*)mallocCheck(n_dq * 4);
    float* h_y = (float*)mallocCheck(n_dq * 4);
    cudaCheck(cudaMemcpy(h_s, d_s, n_sq * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_dp, d_dp, n_sq * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_x, d_x, n_dq * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_y, d_y, n_dq * 4, cudaMemcpyDeviceToHost));
    /* element (token, slot, d) of the probed head in qkv, and (token, d) in dout; tokens >= T: zero fill */
    const size_t tok_stride = 3ull * s.NH * kHS, do_stride = (size_t)s.NH * kHS;
    auto qkv_at = [&](int tok, int slot, int d) -> double {
        return tok < s.T ? bf16_bits_to_float(h_qkv[(size_t)tok * tok_stride + ((size_t)slot * s.NH + head) * kHS + d])
                         : 0.0;
    };
    auto do_at = [&](int tok, int d) -> double {
        return tok < s.T ? bf16_bits_to_float(h_dout[(size_t)tok * do_stride + (size_t)head * kHS + d]) : 0.0;
    };
    const int bad_s = probe_compare("S", h_s, kBlockQ, kBlockK, [&](int i, int j, double* ref, double* mag) {
        for (int d = 0; d < kHS; d++) {
            const double p = qkv_at(i, kSlotQ, d) * qkv_at(j, kSlotK, d);
            *ref += p;
            *mag += fabs(p);
        }
    });
    const int bad_dp = probe_compare("dP", h_dp, kBlockQ, kBlockK, [&](int i, int j, double* ref, double* mag) {
        for (int d = 0; d < kHS; d++) {
            const double p = do_at(i, d) * qkv_at(j, kSlotV, d);
            *ref += p;
            *mag += fabs(p);
        }
    });
    const int bad_x = probe_compare("bf(S) K", h_x, kBlockQ, kHS, [&](int i, int n, double* ref, double* mag) {
        for (int j = 0; j < kBlockK; j++) {
            const double p = bf16_round(h_s[i * kBlockK + j]) * qkv_at(j, kSlotK, n);
            *ref += p;
            *mag += fabs(p);
        }
    });
    const int bad_y = probe_compare("bf(dP) K", h_y, kBlockQ, kHS, [&](int i, int n, double* ref, double* mag) {
        for (int j = 0; j < kBlockK; j++) {
            const double p = bf16_round(h_dp[i * kBlockK + j]) * qkv_at(j, kSlotK, n);
            *ref += p;
            *mag += fabs(p);
        }
    });
    CHECK(bad_s == 0, "S = Q K^T tile (qkv map, K-major descriptors; verified by hopper_fwd, so a regression)");
    CHECK(bad_dp == 0, "dP = dO V^T tile (dout map {HS, NH, T, B}, dO as K-major A, V as K-major B)");
    CHECK(bad_x == 0, "bf(S) K tile (register A from the S accumulator, K as N-major B)");
    CHECK(bad_y == 0, "bf(dP) K tile (second accumulator pair in one wgmma group: the DSK/PK interleave)");
    free(h_qkv); free(h_dout); free(h_s); free(h_dp); free(h_x); free(h_y);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(d_s)); cudaCheck(cudaFree(d_dp)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_y));
}

int main(int argc, char** argv) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes are fixed in main()", argv[0]);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) die("hopper_rows: no CUDA device found");
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9 || prop.minor != 0) {
        die("hopper_rows: device 0 is %s (sm_%d%d); this program is built for sm_90a only\n"
            "  hint: run it on an H100 or H200", prop.name, prop.major, prop.minor);
    }
    printf("hopper_rows on %s - first runs of a never-run prototype: read failures as layout bugs to fix\n"
           "  HS 128: not supported by this lab (four accumulators do not fit in registers); skipped\n", prop.name);
    layout_probe(); /* the GEMM building blocks alone first: if these fail, everything below fails too */
    const CheckInputs shapes[] = {
        {{1, 1, 1, 64}, 1.f, 0.f},    {{1, 1, 77, 64}, 1.f, 0.f},   {{1, 2, 128, 64}, 1.f, 0.f},
        {{1, 1, 129, 64}, 1.f, 0.f},  {{2, 3, 1000, 64}, 1.f, 0.f}, {{4, 32, 257, 64}, 1.f, 0.f},
        {{1, 4, 500, 64}, 8.f, 0.f},  /* sharp softmax */
        {{2, 4, 1000, 64}, 1.f, 20.f}, /* key offset 20 along a unit vector: gproj's correction matters */
        {{1, 4, 777, 64}, 1.f, 128.f}, /* rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(shapes[i], ATTN_GPROJ, 0);
    /* fp32 mode's D = sum P dP through the same kernel */
    const CheckInputs fp32_shapes[] = {{{1, 1, 77, 64}, 1.f, 0.f}, {{2, 3, 1000, 64}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof fp32_shapes / sizeof fp32_shapes[0]; i++) check_shape(fp32_shapes[i], ATTN_FP32, 0);
    /* timing (and checks) at the benchmark shapes */
    const CheckInputs bench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(bench[i], ATTN_GPROJ, 1);
    check_shape(bench[0], ATTN_FP32, 1);
    return test_summary();
}
