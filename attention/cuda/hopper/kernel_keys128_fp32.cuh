/*
 * attention/cuda/hopper/kernel_keys128_fp32.cuh - the device code of fp32 mode's Hopper key-major pass at head size 128: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_bwd128_fp32.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_bwd128_fp32.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_FP32_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_FP32_CUH

#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/launch_overlap.cuh"
#include "attention/cuda/tile_order.cuh"
#include "common/cuda_utils.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_FP32_KEYS128_HS; /* the head size of this kernel */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kDqCols = kHS / kConsumerWarpgroups; /* head-dim columns of dQ per consumer warpgroup */
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kQSteps = kBlockQ / kWgmmaK;       /* k-steps of the dV/dK GEMMs (the tile's 64 queries) */
constexpr int kKeyHalves = kBlockK / kTileK;     /* 64-key halves of the dQ GEMM's reduced dimension */
constexpr uint32_t kUnusedLbo = 16;              /* N = 64 B operands ignore LBO */
constexpr int kDsPitch = kBlockK + 8;            /* BF16 per row of a staged dS term [query][128 keys] */
constexpr int kDsTerms = 3;                      /* bf(dS), bf(r1), bf(r1 - bf(r1)) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 };     /* the 3 of qkv [B, T, 3, NH, HS] */
constexpr size_t kTmaAlignBytes = 16;           /* global address alignment TMA requires */
static_assert(kWarpgroupKeys == kBlockQ && kQSteps == kTileKSteps,
              "S^T per warpgroup is 64 x 64: its 32 registers are the 4 k-steps of the RS GEMMs' A");

struct SmemPlan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;           /* 8 KB */
    static constexpr int kKeyChunkBytes = kBlockK * kSwizzleRowBytes;       /* 16 KB: 128 keys x 64 columns */
    static constexpr int kKeyTileBytes = kChunks * kKeyChunkBytes;          /* 32 KB */
    static constexpr int kQChunkBytes = kBlockQ * kSwizzleRowBytes;         /* 8 KB: 64 queries x 64 columns */
    static constexpr int kQTileBytes = kChunks * kQChunkBytes;              /* 16 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;            /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;   /* kStages tiles */
    static constexpr int kDs = kDO + kStages * kQTileBytes;  /* kDsTerms tiles of [64 query][kDsPitch] BF16 */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kRowState = kDs + kDsTerms * kDsBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    /* per warpgroup one FP32 dQ tile [64 queries][its 64 columns]: two 128B-swizzled boxes of 32 columns */
    static constexpr int kDqTileBytes = kBlockQ * kDqCols * 4;
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kBytes = kDqTile + kConsumerWarpgroups * kDqTileBytes;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state");
    static_assert(kKeyChunkBytes == kKeymajor128KeyChunkBytes && kQChunkBytes == kKeymajor128QChunkBytes &&
                      kHS == kKeymajor128HS && kQSteps == kKeymajor128QSteps,
                  "hopper_bwd_common.cuh's keymajor128 steps assume this plan's tile strides");
    static_assert(kConsumerWarpgroups * kDqTileBytes >= kDsBytes, "the probe uses the dQ tiles as a zero BF16 dS tile");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};
static_assert(SmemPlan::kKeyChunkBytes == KeymajorTiles<kChunks>::kKeyChunkBytes &&
                  SmemPlan::kQChunkBytes == KeymajorTiles<kChunks>::kQChunkBytes &&
                  SmemPlan::kBoxBytes == KeymajorTiles<kChunks>::kBoxBytes && kBlockK == KeymajorTiles<kChunks>::kBlockK &&
                  kBlockQ == KeymajorTiles<kChunks>::kBlockQ,
              "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");
constexpr int kDsTileElems = SmemPlan::kDsBytes / 2; /* BF16 elements from one staged dS term to the next */

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads, 2 and 3 the warpgroups'). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* ---- one k-step (16 queries) of the fp32 operands (their split: hopper_bwd_common.cuh's pack_split_step) ---- */

/* One k-step's packed dS^T words to a shared tile as [query][key] (attention_hopper_bwd128.cu's stage_ds,
   one k-step of it: its assumption (c)): word w[i] holds key key_col + 8 (i & 1) and queries q, q + 1 with
   q = 16kk + 8 (i >> 1) + 2t (low half: q). Ordinary register reads, done before any wgmma reads w as A. */
__device__ __forceinline__ void stage_ds_step(bf16* tile, const uint32_t (&w)[4], int kk, int key_col, int t) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int key = key_col + 8 * (i & 1);
        const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
        tile[q * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w[i] & 0xFFFFu));
        tile[(q + 1) * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w[i] >> 16));
    }
}

/* dQ_half[64 queries x 64 dims] += sum over the three staged terms and the two 64-key halves of
   A[64 q x 64 keys] K[64 keys x 64 dims] (form (n1)): A loaded from tile `term` (tiles + term kDsTileElems,
   [query][key],
   columns 64 half..) into two alternating register sets; B = K chunk k_chunk_addr read N-major, key half
   `half` one 8 KB box further (16 rows = 2048 bytes per k-step: production's form (d), the same descriptors).
   Six commit groups; a set is reloaded only after wait<1> says its group completed. Returns with everything
   waited for. The caller zeroed and fenced dq. */
__device__ __forceinline__ void warpgroup_dq_terms(float (&dq)[32], const bf16* tiles,
                                                   uint32_t k_chunk_addr, int warp_in_wg, int g, int t) {
    uint32_t a0[kTileKSteps][4], a1[kTileKSteps][4];
    constexpr int kPieces = kDsTerms * kKeyHalves;
    auto issue = [&](const uint32_t (&a)[kTileKSteps][4], int half) {
#pragma unroll
        for (int kk = 0; kk < kTileKSteps; kk++)
            wgmma_m64n64k16_rs(dq, a[kk], make_smem_desc(k_chunk_addr + half * kBoxRows * kSwizzleRowBytes +
                                                             kk * kWgmmaK * kSwizzleRowBytes,
                                                         kUnusedLbo, kSwizzleAtomBytes));
    };
#pragma unroll
    for (int piece = 0; piece < kPieces; piece++) {
        const int term = piece / kKeyHalves, half = piece % kKeyHalves;
        uint32_t (&a)[kTileKSteps][4] = (piece & 1) ? a1 : a0;
        if (piece >= 2) { /* the group that read this set (piece - 2) is the older of the two in flight */
            wgmma_wait<1>();
            reg_fence(a);
        }
        load_staged_a_operand<kDsPitch>(a, tiles + term * kDsTileElems + half * kTileK, warp_in_wg, g, t);
        reg_fence(a);
        wgmma_fence();
        issue(a, half);
        wgmma_commit();
    }
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(a0);
    reg_fence(a1);
}

/* bounded mbarrier waits that give up (no trap under setmaxnreg: attention_hopper_bwd128.cu's file comment) */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
/* set by attention_hopper_bwd_watch_hangs (through attention_hopper_fp32_keys128_watch_hangs); NULL: no record */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* fp32's key-major pass at HS 128 (see the file comment). stats {m, l} per row, D [B*NH*T] from the
   workspace; writes the k and v slots of dqkv and adds the s-less dQ partials to dq_acc (through dq_map).
   DQ_SLICES: the deterministic backward's per-key-block dQ slices (keymajor_dq_head; docs/determinism.md). */
template <bool DQ_SLICES>
__global__ void __launch_bounds__(kThreads, 1)
    fp32keys128_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                       const __grid_constant__ CUtensorMap dq_map, const float* __restrict__ stats,
                       const float* __restrict__ D, bf16* __restrict__ dqkv, int NH, int T, float scale, float c) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
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
    const int dq_head = keymajor_dq_head<DQ_SLICES>(order); /* where this CTA's dQ partials go */
    const int qt_begin = k0 / kBlockQ;   /* the first query tile that reaches key k0 */
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
    __shared__ int cta_abort; /* set by a bounded wait that gave up (mbar_wait_bounded) */

    if (threadIdx.x == 0) {
        cta_abort = 0;
        /* full: 32 producer lanes (row state) + the TMA bytes; empty: every consumer thread, after its last read */
        init_pipeline_barriers<kStages>(kv_full, full, empty, 32, kConsumerThreads);
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* warps 9-11 of the producer warpgroup have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes the row state of 2 queries ---- */
        if (lane == 0) keymajor_load_kv<kChunks>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            /* stage s is free once the consumers released tile i - kStages (phase i / kStages - 1) */
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
            /* one query at a time (not unrolled): the producer has 24 registers, and with two queries' loads
               in flight it spilled (production repair's 8 B are probably this) */
#pragma unroll 1
            for (int half = 0; half < 2; half++) {
                const int ql = lane + 32 * half, query = q0 + ql;
                float4 st = make_float4(0.f, 1.f, 0.f, 0.f); /* rows past T: P stays finite (masked anyway) */
                if (query < T) {
                    const long long idx = (long long)bh * T + query;
                    st.x = stats[idx * 2];                /* m (raw score units) */
                    st.y = __frcp_rn(stats[idx * 2 + 1]); /* fl(1 / l) */
                    st.z = D[idx];
                }
                row_state[s * kBlockQ + ql] = st;
            }
            /* every lane's arrival releases its own row-state writes; lane 0's also announces the TMA bytes */
            keymajor_fill_stage<kChunks>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map, &dout_map,
                                         &full[s], q0, h, NH, b, lane);
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63 (dK, dV rows) and dQ columns 64 wg .. +63 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g; /* this thread's keys: key_col, key_col + 8 */
    const int key0 = k0 + key_col;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    const uint32_t k_dq_addr = smem_u32(k_s) + wg * Plan::kKeyChunkBytes; /* chunk wg: dims 64 wg .. +63 */
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs); /* term k at k * kDsTileElems */
    float dk[kHS / 2], dv[kHS / 2];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

#pragma unroll 1
    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;

        float st[32], dpt[32];
        keymajor128_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);
        /* both warpgroups have loaded the previous step's dS terms (their dQ A operands) before either
           rewrites the single-buffered tiles below */
        consumers_sync();

        /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions), their four A words and the three
           staged dS terms, one k-step (16 queries) at a time, so the FP32 values die step by step. Element
           4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e. The mask can bite only where the tile reaches
           the warpgroup's keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kQSteps][4], pa_lo[kQSteps][4], pds[kQSteps][4], pds_lo[kQSteps][4];
#pragma unroll
        for (int kk = 0; kk < kQSteps; kk++) {
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 2 * kk + jj;
                    const int query = q0 + 8 * j + 2 * t + e;
                    const float4 row = rs[8 * j + 2 * t + e];
                    keymajor_probs_column<ATTN_FP32>(st, dpt, row, j, e, query, key0, T, masked, c);
                }
            uint32_t unused[4], x2[4];
            pack_split_step<false>(pa[kk], pa_lo[kk], unused, st, kk);
            pack_split_step<true>(pds[kk], pds_lo[kk], x2, dpt, kk);
            stage_ds_step(ds_tiles, pds[kk], kk, key_col, t);
            stage_ds_step(ds_tiles + kDsTileElems, pds_lo[kk], kk, key_col, t);
            stage_ds_step(ds_tiles + 2 * kDsTileElems, x2, kk, key_col, t);
        }
        /* dV += bf(P)^T dO + bf(P - bf(P))^T dO, dK += bf(dS)^T Q + bf(r1)^T Q: one batch of 16 wgmmas, two
           chains of 8 on one accumulator each (128 accumulator + 64 A registers in flight) */
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(pds);
        reg_fence(pds_lo);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        keymajor128_rs_issue(dv, pa, do_addr);
        keymajor128_rs_issue(dv, pa_lo, do_addr);
        keymajor128_rs_issue(dk, pds, q_addr);
        keymajor128_rs_issue(dk, pds_lo, q_addr);
        wgmma_commit();
        /* the previous step's dQ reduce-adds have read this warpgroup's dQ tile before the barrier below lets
           its threads rewrite it */
        if ((threadIdx.x & 127) == 0) bulk_wait_group_read<0>();
        consumers_sync(); /* both warpgroups' halves of the three dS tiles are written */
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(pds);
        reg_fence(pds_lo);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

        /* dQ for all 64 queries, this warpgroup's 64 columns, over the CTA's 128 keys and the three terms */
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(dq);
        warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);

        /* rows = queries q0 + 16 warp_in_wg + g (+8), cols 64 wg + 8n + 2t: into the warpgroup's swizzled dQ
           tile, then one thread adds it to the accumulator with two TMA reduce-adds (rows past T are outside
           the map): attention_hopper_bwd128.cu's flush, unchanged */
        unsigned char* dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
        /* g passed through an opaque move here: otherwise the four swizzled column offsets below are hoisted
           out of the loop and kept live across it (8 bytes of spills at 240 registers) */
        int g_here;
        asm volatile("mov.u32 %0, %1;\n" : "=r"(g_here) : "r"(g));
        unsigned char* dq_row = dq_tile + (warp_in_wg * 16 + g_here) * kSwizzleRowBytes + (t & 1) * 8;
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int n = 0; n < kDqCols / 8; n++) {
                const int chunk = (2 * (n & 3) + (t >> 1)) ^ g_here;
                *reinterpret_cast<float2*>(dq_row + (n >> 2) * (kBlockQ * kSwizzleRowBytes) + 8 * r * kSwizzleRowBytes +
                                           chunk * 16) = make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
            }
        fence_proxy_async(); /* the tile's generic-proxy stores, before the async proxy (TMA) reads them */
        named_bar_sync(2 + wg, 128); /* this warpgroup's 128 threads (barrier 1 is consumers_sync's) */
        if ((threadIdx.x & 127) == 0) {
            tma_reduce_add_3d(&dq_map, dq_tile, wg * kDqCols, q0, dq_head);
            tma_reduce_add_3d(&dq_map, dq_tile + kBlockQ * kSwizzleRowBytes, wg * kDqCols + 32, q0, dq_head);
            bulk_commit_group();
        }
    }
    /* the last reduce-adds complete before the CTA's shared memory goes away */
    if ((threadIdx.x & 127) == 0) bulk_wait_group<0>();

    /* a wait of this CTA that gave up is visible to every consumer thread after this barrier */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys; NaN in both rows if the CTA gave up a wait */
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, gave_up);
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_FP32_CUH */
