/*
 * attention/cuda/hopper/kernel_keys64_gproj.cuh - the device code of gproj's Hopper key-major pass at head size 64: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_bwd_gproj.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_bwd_gproj.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_GPROJ_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_GPROJ_CUH

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

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS64_GPROJ_CUH */
