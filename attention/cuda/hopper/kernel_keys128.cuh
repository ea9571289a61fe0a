/*
 * attention/cuda/hopper/kernel_keys128.cuh - the device code of the Hopper key-major backward of bf16 and repair at head size 128: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_bwd128.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_bwd128.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_CUH

#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/launch_overlap.cuh"
#include "attention/cuda/tile_order.cuh"

using namespace hopper_wgmma;

namespace {
constexpr int kHS = ATTN_HOPPER_BWD128_HS; /* the head size of this kernel */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of S^T, dK, dV) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kDqCols = kHS / kConsumerWarpgroups; /* head-dim columns of dQ per consumer warpgroup */
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
/* setmaxnreg split of the 384-thread CTA (__launch_bounds__(384, 1): every thread starts at 168) */
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box */
constexpr int kSwizzleRowBytes = 128;   /* one 64-column chunk row = one 128B-swizzle row */
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands (and N = 64 B operands) ignore LBO */
constexpr int kDsPitch = kBlockK + 8;   /* BF16 per row of the staged dS tile [query][128 keys]: +8 against bank conflicts */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ, "S^T per warpgroup is 64 x 64: its A operand covers the 4 k-steps of dV/dK");
static_assert(kBlockQ / kWgmmaK == kTileKSteps,
              "S^T, dP^T are 64 x 64 tiles: hopper_wgmma.cuh's pack_acc_a_operand packs them");

/* Shared-memory plan (byte offsets from a 1024-byte aligned base). A tile of R rows x 128 columns is two
   chunks of [R rows][128 bytes], swizzled: column chunk c at c * (R * 128). */
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
    static constexpr int kDs = kDO + kStages * kQTileBytes;  /* 2 buffers of [64 query][kDsPitch] BF16 */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kRowState = kDs + 2 * kDsBytes;     /* float4 [kStages][kBlockQ] */
    static constexpr int kBarriers = kRowState + kStages * kBlockQ * 16;
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    /* per warpgroup one FP32 dQ tile [64 queries][its 64 columns], two 128B-swizzled boxes of 32 columns (8 KB):
       the partial its TMA reduce-adds send (one buffer: two would not fit next to the rest) */
    static constexpr int kDqTileBytes = kBlockQ * kDqCols * 4;
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kBytes = kDqTile + kConsumerWarpgroups * kDqTileBytes;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0, "float4 row state");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

static_assert(SmemPlan::kKeyChunkBytes == KeymajorTiles<kChunks>::kKeyChunkBytes &&
                  SmemPlan::kQChunkBytes == KeymajorTiles<kChunks>::kQChunkBytes &&
                  SmemPlan::kBoxBytes == KeymajorTiles<kChunks>::kBoxBytes && kBlockK == KeymajorTiles<kChunks>::kBlockK &&
                  kBlockQ == KeymajorTiles<kChunks>::kBlockQ,
              "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* ---- the GEMMs of one (key tile, query tile) step, per warpgroup (shared by the kernel and the probe):
   S^T, dP^T and the dV, dK batches are hopper_bwd_common.cuh's keymajor128_scores and keymajor128_rs_issue
   (assumptions (a), (b)); the dQ GEMM and the dS staging are this kernel's own ---- */
static_assert(SmemPlan::kKeyChunkBytes == kKeymajor128KeyChunkBytes && SmemPlan::kQChunkBytes == kKeymajor128QChunkBytes &&
                  kHS == kKeymajor128HS && kBlockQ / kWgmmaK == kKeymajor128QSteps,
              "the tiles hopper_bwd_common.cuh's HS-128 GEMM steps address");

/* dQ_half[64 queries x 64 dims] = A[64 x 128 keys] K[128 keys x 64 dims]: A from registers (8 k-steps of 16
   keys), B = column chunk `half` of the K tile read N-major: 128 key rows of 128 bytes, 16 rows = 2048 bytes
   per k-step (k-step 4 starts the second 64-row TMA box of the chunk: assumption (d)). N = 64: LBO unused.
   Issued only. */
__device__ __forceinline__ void warpgroup_dq_issue(float (&acc)[32], const uint32_t (&a)[kBlockK / kWgmmaK][4],
                                                   uint32_t k_chunk_addr) {
#pragma unroll
    for (int kk = 0; kk < kBlockK / kWgmmaK; kk++)
        wgmma_m64n64k16_rs(acc, a[kk], make_smem_desc(k_chunk_addr + kk * kWgmmaK * kSwizzleRowBytes, kUnusedLbo,
                                                      kSwizzleAtomBytes));
}

/* bf(dS^T) from its packed A words to the shared tile as [query][key] (assumption (c)): word pds[kk][i] holds
   key key_col + 8 (i & 1) and queries q, q + 1 with q = 16kk + 8 (i >> 1) + 2t (low half: q). key_col is
   the thread's key row within the CTA's 128 (64 w + 16 warp_in_wg + g). Ordinary register reads, done
   before the wgmma that reads pds as A is issued (PTX leaves an access to the A registers of an in-flight
   wgmma undefined). Not hopper_wgmma.cuh's stage_tile_transposed: that one re-packs from the FP32
   accumulator (the HS-64 kernels' way; here it gives other PTX), these stores are assumption (c)'s. */
__device__ __forceinline__ void stage_ds(bf16* ds_s, const uint32_t (&pds)[kBlockQ / kWgmmaK][4], int key_col, int t) {
#pragma unroll
    for (int kk = 0; kk < kBlockQ / kWgmmaK; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = key_col + 8 * (i & 1);
            const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
            const uint32_t w = pds[kk][i];
            ds_s[q * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w & 0xFFFFu));
            ds_s[(q + 1) * kDsPitch + key] = __ushort_as_bfloat16((unsigned short)(w >> 16));
        }
}

/* The A fragments of dQ = dS K for this warp's 16 queries from the tile [query][128 keys]: k-steps 0-3 from
   keys 0..63, 4-7 from keys 64..127, each half through hopper_wgmma.cuh's load_staged_a_operand. */
__device__ __forceinline__ void load_ds_operand(uint32_t (&a)[kBlockK / kWgmmaK][4], const bf16* ds_s, int warp_in_wg,
                                                int g, int t) {
    static_assert(kBlockK / kWgmmaK == 2 * kTileKSteps, "two 64-key halves of A");
#pragma unroll
    for (int half = 0; half < 2; half++)
        load_staged_a_operand<kDsPitch>(*reinterpret_cast<uint32_t(*)[kTileKSteps][4]>(&a[half * kTileKSteps]),
                                        ds_s + half * kTileK, warp_in_wg, g, t);
}

/* bounded mbarrier waits that give up (see the file comment: no trap under setmaxnreg) */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
/* set by attention_hopper_bwd_watch_hangs (through attention_hopper_bwd128_watch_hangs); NULL: no record */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* The key-major backward at HS 128 (see the file comment). DQ_SLICES: the deterministic backward's per-key-block
   dQ slices (keymajor_dq_head; docs/determinism.md). */
template <int MODE, bool DQ_SLICES>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_bwd128_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
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
    /* launched with PDL (launch_overlap.cuh): the prep kernel's D and zeroed accumulator are ready from here on;
       the dQ post-pass may be placed on the SMs as soon as every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<kProducerRegs>(); /* the whole producer warpgroup */
        if (warp != kConsumerThreads / 32) return; /* warps 9-11 of the producer warpgroup have no work */
        /* ---- producer warp: lane 0 issues the copies, every lane writes row state for 2 queries ---- */
        if (lane == 0) keymajor_load_kv<kChunks>(k_s, v_s, &qkv_map, kv_full, k0, T, h, NH, b);
        for (int i = 0; i < n_q_tiles; i++) {
            const int s = i % kStages;
            const int q0 = (qt_begin + i) * kBlockQ;
            /* stage s is free once the consumers released tile i - kStages (phase i / kStages - 1) */
            if (i >= kStages) mbar_wait_bounded(&empty[s], (uint32_t)((i / kStages - 1) & 1), ATTN_HANG_EMPTY, s, &cta_abort);
            keymajor_stage_row_state<MODE, kKeymajorNoLambda>(row_state + s * kBlockQ, nullptr, stats, D, nullptr,
                                                              bh, T, q0, lane);
            keymajor_fill_stage<kChunks>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map,
                                         &dout_map, &full[s], q0, h, NH, b, lane);
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
    float dk[kHS / 2], dv[kHS / 2];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;
        bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + (i & 1) * Plan::kDsBytes);

        float st[32], dpt[32];
        keymajor128_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);

        /* P and dS in registers (st <- P, dpt <- dS), masked entries exactly 0. Element 4j + 2r + e: key
           key0 + 8r, query q0 + 8j + 2t + e. The mask can bite only where the tile reaches the warpgroup's
           keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
#pragma unroll
        for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int query = q0 + 8 * j + 2 * t + e;
                const float4 row = rs[8 * j + 2 * t + e];
                keymajor_probs_column<MODE>(st, dpt, row, j, e, query, key0, T, masked, c);
            }

        /* bf(P), bf(dS) as A operands; bf(dS) also to the shared tile (this warpgroup's 64 key columns) */
        uint32_t pa[kBlockQ / kWgmmaK][4], pds[kBlockQ / kWgmmaK][4];
        pack_acc_a_operand(pa, st);
        pack_acc_a_operand(pds, dpt);
        stage_ds(ds_s, pds, key_col, t);
        /* dV += bf(P)^T dO, dK += bf(dS)^T Q as one batch */
        reg_fence(pa);
        reg_fence(pds);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        keymajor128_rs_issue(dv, pa, do_addr);
        keymajor128_rs_issue(dk, pds, q_addr);
        wgmma_commit();
        /* the previous step's dQ reduce-adds have read this warpgroup's dQ tile before the barrier below lets
           its threads rewrite it */
        if ((threadIdx.x & 127) == 0) bulk_wait_group_read<0>();
        consumers_sync(); /* both warpgroups' halves of the dS tile are written */
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(pds);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

        /* dQ for all 64 queries, this warpgroup's 64 columns, over the CTA's 128 keys */
        uint32_t adq[kBlockK / kWgmmaK][4];
        load_ds_operand(adq, ds_s, warp_in_wg, g, t);
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(adq);
        reg_fence(dq);
        wgmma_fence();
        warpgroup_dq_issue(dq, adq, k_dq_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq);
        reg_fence(adq);

        /* rows = queries q0 + 16 warp_in_wg + g (+8), cols 64 wg + 8n + 2t: into the warpgroup's dQ tile, then
           one thread adds it to the accumulator with two TMA reduce-adds (rows past T are outside the map). The
           tile is two 128B-swizzled boxes of 32 columns: float2 (row r, cols 8n + 2t) is 16-byte chunk
           (2 (n % 4) + t / 2) ^ (r % 8) of row r of box n / 4, and r % 8 = g (attention_hopper_bwd.cu's HS-64
           flush, 1.10-1.12x faster than red.global atomics: dev/results/attention_hopper_2026-11-29.md) */
        unsigned char* dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
        unsigned char* dq_row = dq_tile + (warp_in_wg * 16 + g) * kSwizzleRowBytes + (t & 1) * 8;
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int n = 0; n < kDqCols / 8; n++) {
                const int chunk = (2 * (n & 3) + (t >> 1)) ^ g;
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

    /* a wait of this CTA that gave up (consumer or producer; the producer's give-up precedes an arrival on
       full that every consumer waited for) is visible to every consumer thread after this barrier */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t); NaN in every
       element of both rows if the CTA gave up a wait (see the file comment: a hang must fail loudly) */
    keymajor_store_dkv<kHS>(dk, dv, dqkv, b, h, NH, T, key0, t, scale, gave_up);
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_CUH */
