/*
 * attention/cuda/hopper/attention_hopper_rows.cu - the Hopper (sm_90a) query-major row pass of the backward for gproj
 * (lambda and all of dQ) and fp32 (D = sum_j P_ij dP_ij) at head size 64, on wgmma + TMA + a producer warp.
 * The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh.
 *
 * Why: gproj's and fp32's extra cost over bf16 is mostly the portable row pass attn_bwd_rows_kernel
 * (attention/cuda/attention_cuda.cu, mma.sync). That pass has the forward's shape (query rows as M), which the
 * Hopper forward runs on wgmma; this kernel (its lab: dev/attention_lab/hopper_rows.cu, layout probe and
 * the pass against the production backward; dev/results/attention_hopper_2026-11-29.md) takes
 * attn_bwd_rows_kernel's place on sm_90. It writes the same workspace slots (D for fp32, lambda for gproj,
 * carve_workspace's layout) and gproj's dQ into the q slot of dqkv, so the key-major pass after it (Hopper
 * or the portable attn_bwd_kernel) reads them unchanged.
 *
 * What it computes, per query row i over its visible keys j <= i (docs/attention_numerics.md; the portable
 * row pass operation for operation, except the order of the FP32 sums inside the tensor core):
 *   S = Q K^T, dP = dO V^T (FP32, wgmma from shared memory, both K-major);
 *   P_ij = exp2((S_ij - m_i) c) * fl(1 / l_i) from the forward's stats {m, l};
 *   gproj: dS = P (dP - D) in FP32 (D_i = dO_i . O_i, the portable prep kernel's);
 *          r_i = sum_j bf(dS_ij), p_i = sum_j bf(P_ij) (FP32, per lane in key order, then the quad: the
 *          portable order), lambda_i = r_i / p_i (0 if p_i = 0);
 *          DSK_i = sum_j bf(dS_ij) K_j, PK_i = sum_j bf(P_ij) K_j (wgmma RS, K read N-major);
 *          dQ_i = bf(s * fma(-lambda_i, PK_i, DSK_i)) into the q slot of dqkv, lambda_i into the workspace.
 *   fp32:  D_i = sum_j P_ij dP_ij in FP32 into the workspace's D slot (fp32's dQ is key-major).
 *
 * Kernel layout: one CTA = 128 query rows of one (b, h), longest rows first; warps 0-3 and 4-7 are two
 * consumer warpgroups of 64 rows, warp 8 the producer (one lane issues TMA). Q (qkv as a 4-D map
 * {HS, 3 NH, T, B}) and dO ({HS, NH, T, B}) are loaded once; K and V tiles of 128 keys, two stages,
 * full/empty mbarriers. Each 128-key tile is worked in two 64-key halves (S and dP of a half, P and dS in
 * registers, then DSK and PK of that half): with whole tiles the four accumulators spill. Rows and keys
 * past T are zero-filled by TMA and masked. Every mbarrier wait is on a phase that a finite number of
 * copies/arrivals completes (as the forward). Registers (CUDA 13.0): gproj 168 (the cap for 288 threads),
 * fp32 106, no spills.
 * HS 128 is attention_hopper_rows128.cu (DSK and PK alone are 128 floats per thread there: a producer
 * warpgroup and setmaxnreg); the entry points below dispatch to it on s.HS.
 * Not done: overlap of the DSK/PK GEMMs of one tile with S/dP of the next, setmaxnreg, D fused into the pass.
 */
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

/* Layout probe: one CTA, the two consumer warpgroups, one tile of everything at token 0 of batch 0 (head
   `head`): the TMA copies of Q, K, V (qkv map) and dO (dout map), S = Q K^T and dP = dO V^T through
   warpgroup_two_ss_64x64 (two 64-key halves, as the kernel), and X = bf(S) K, Y = bf(dP) K through pack_acc_a_operand + warpgroup_rs_k (no softmax).
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
    reg_fence(x); /* the zeroing before any wgmma fence (see warpgroup_two_ss_64x64) */
    reg_fence(y);
#pragma unroll
    for (int sub = 0; sub < kSubTiles; sub++) { /* the kernel's two 64-key halves, X and Y accumulating */
        float sacc[kSRegs], dpacc[kSRegs];
        warpgroup_two_ss_64x64(sacc, dpacc, smem_u32(smem + SmemPlan::kQ) + wg_row_bytes,
                               k_addr + sub * kSubTileBytes, smem_u32(smem + SmemPlan::kDO) + wg_row_bytes,
                               smem_u32(smem + SmemPlan::kV) + sub * kSubTileBytes);
        store_fragment_rows(s_out, dp_out, sacc, dpacc, row0, sub * kSubKeys, kBlockK, t);
        uint32_t sa[kKeySteps][4], dpa[kKeySteps][4];
        pack_acc_a_operand(sa, sacc);
        pack_acc_a_operand(dpa, dpacc);
        warpgroup_rs_k<kDqRegs, false>(y, x, dpa, sa, k_addr + sub * kSubTileBytes,
                                       SmemPlan::kTileBytes); /* the kernel's call */
    }
    store_fragment_rows(x_out, y_out, x, y, row0, 0, kHS, t);
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper row pass)";

constexpr size_t kTmaAlignBytes = 16; /* global address alignment TMA requires */

template <int MODE>
void hopper_rows_launch(AttnShape s, const CUtensorMap& qkv_map, const CUtensorMap& dout_map, const float* stats,
                        float* D, float* lambda, bf16* dqkv, cudaStream_t stream) {
    cudaCheck(cudaFuncSetAttribute(hopper_rows_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockQ), (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, hopper_rows_kernel<MODE>, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map,
                               dout_map, stats, D, lambda, dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                               attn_exp2_scale(kHS));
}

}  // namespace

int attention_hopper_rows_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout) {
    if (mode != ATTN_GPROJ && mode != ATTN_FP32) return 0;
    if (s.HS != kHS && s.HS != ATTN_HOPPER_ROWS128_HS) return 0; /* HS 128: attention_hopper_rows128.cu */
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0 && ((uintptr_t)dout % kTmaAlignBytes) == 0;
}

void attention_backward_hopper_rows(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, float* D, float* lambda, __nv_bfloat16* dqkv,
                                    cudaStream_t stream) {
    if (!attention_hopper_rows_supports(mode, s, qkv, dout)) {
        die("attention_backward_hopper_rows: unsupported call (mode %s, B=%d NH=%d T=%d HS=%d, qkv %p, dout %p)\n"
            "  hint: gproj or fp32 mode, head size %d or %d, B*NH <= 65535, qkv and dout 16-byte aligned; use "
            "attention_backward_cuda, which falls back to the portable row pass",
            (int)mode >= 0 && mode < ATTN_NUM_MODES ? attn_mode_name(mode) : "?", s.B, s.NH, s.T, s.HS,
            (const void*)qkv, (const void*)dout, kHS, ATTN_HOPPER_ROWS128_HS);
    }
    if (s.HS == ATTN_HOPPER_ROWS128_HS) {
        attention_backward_hopper_rows128(mode, s, qkv, dout, stats, D, lambda, dqkv, stream);
        return;
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBlockK, kWho, "dout");
    if (mode == ATTN_GPROJ) hopper_rows_launch<ATTN_GPROJ>(s, qkv_map, dout_map, stats, D, lambda, dqkv, stream);
    else hopper_rows_launch<ATTN_FP32>(s, qkv_map, dout_map, stats, D, lambda, dqkv, stream);
}

void attention_hopper_rows_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                        float* s_tile, float* dp_tile, float* x_tile, float* y_tile) {
    if (s.HS == ATTN_HOPPER_ROWS128_HS) {
        attention_hopper_rows128_layout_probe(s, head, qkv, dout, s_tile, dp_tile, x_tile, y_tile);
        return;
    }
    if (s.B != 1 || s.T > ATTN_HOPPER_ROWS_PROBE_ROWS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_rows_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d or 128 (got B=%d NH=%d "
            "T=%d HS=%d head %d)", ATTN_HOPPER_ROWS_PROBE_ROWS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBlockK, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBlockK, kWho, "dout");
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, s_tile, dp_tile,
                                                                    x_tile, y_tile);
    cudaCheckLastError();
}
