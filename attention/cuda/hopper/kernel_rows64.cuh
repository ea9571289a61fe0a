/*
 * attention/cuda/hopper/kernel_rows64.cuh - the device code of the Hopper row pass (gproj, fp32) at head size 64: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_rows.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_rows.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_ROWS64_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_ROWS64_CUH

#include <math.h>
#include <stdint.h>
#include <type_traits>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_rows_common.cuh"
#include "attention/cuda/launch_overlap.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_BWD_HS; /* the only head size (see the header comment) */
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
/* ------------------------------------------------------------------------------------------------ */
/* the kernels                                                                                       */
/* ------------------------------------------------------------------------------------------------ */

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

    const AttnTileOrder order = attn_tile_longest_first(); /* longest rows first, over all heads */
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int q0 = q_tile * kBlockQ;
    const int n_key_tiles = (min(q0 + kBlockQ, T) - 1) / kBlockK + 1; /* = q_tile + 1 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        init_pipeline_barriers<kStages>(q_full, full, empty, 1, kConsumerThreads);
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

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
    load_row_state<kGproj>(row_m, row_rl, row_D, stats, D, bh, T, row0);
    float acc_a[2] = {0.f, 0.f}; /* gproj: r = sum bf(dS); fp32: sum P dP (this lane's keys, in key order) */
    float acc_b[2] = {0.f, 0.f}; /* gproj: p = sum bf(P) */
    float dsk[kDqRegs], pk[kDqRegs];
#pragma unroll
    for (int i = 0; i < kDqRegs; i++) dsk[i] = pk[i] = 0.f;
    reg_fence(dsk); /* the zeroing before any wgmma fence (see warpgroup_two_ss_64x64) */
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
            warpgroup_two_ss_64x64(sacc, dpacc, q_addr, k_sub, do_addr, v_addr + sub * kSubTileBytes);

            /* P, dS and the row sums (the mask only where it can bite) */
            const int key0 = kt * kBlockK + sub * kSubKeys;
            if (tile_masked)
                row_probs_and_sums<kGproj, true>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, key0, row0, t, T, c);
            else
                row_probs_and_sums<kGproj, false>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, key0, row0, t, T, c);

            if (kGproj) {
                uint32_t pa[kKeySteps][4], dsa[kKeySteps][4];
                pack_acc_a_operand(pa, sacc);
                pack_acc_a_operand(dsa, dpacc);
                warpgroup_rs_k<kDqRegs, false>(dsk, pk, dsa, pa, k_sub, SmemPlan::kTileBytes);
            }
        }
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s */
    }

    store_row_outputs<kGproj, kHS>(acc_a, acc_b, dsk, pk, D, lambda, dqkv, bh, b, h, NH, T, row0, t, scale);
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_ROWS64_CUH */
