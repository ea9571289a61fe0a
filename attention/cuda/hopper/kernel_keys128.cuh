/*
 * attention/cuda/hopper/kernel_keys128.cuh - the device code of the Hopper key-major backward at head size 128,
 * one kernel template for every mode: the CTA shape the modes share, the shared-memory plan per mode, each
 * mode's traits (Keys128Mode<MODE>: its plan, row state, tile order, whether it sends dQ partials), the step
 * helpers, the kernel body with a block per mode after the scores, its two entry points and the host launch
 * of the modes that send dQ, in the including file's anonymous namespace. Included by the instantiation
 * files attention/cuda/hopper/attention_hopper_bwd128.cu (bf16, repair), attention_hopper_bwd128_gproj.cu
 * (gproj) and attention_hopper_bwd128_fp32.cu (fp32) (their entry points; each mode's design, numerics and
 * barrier protocol are in its file comment), and by the layout probes dev/attention_lab/probes/probe_keys128*.cu,
 * which run the same helpers on one tile.
 *
 * Why one template: the three passes are one CTA (128 keys, two consumer warpgroups of 64 keys, a producer
 * warpgroup with setmaxnreg 24/240, Q/dO tiles of 64 queries in 2 stages); they differ only in the row state,
 * the operands after S^T and dP^T, the dQ GEMM and whether dQ partials leave the CTA. A mode is its traits and
 * its block of the body, not a copy of the kernel. Why a header: the probes are lab code and stay out of the
 * production objects, yet they must use the kernel's own helpers and layout. One kernel object = one
 * translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_CUH

#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"
#include "attention/cuda/launch_overlap.cuh"
#include "attention/cuda/tile_order.cuh"
#include "common/cuda_utils.cuh"

using namespace hopper_wgmma;

namespace {
/* ---- the CTA shape every mode shares ---- */
constexpr int kHS = 128; /* the head size of this kernel */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of S^T, dK, dV) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kDqCols = kHS / kConsumerWarpgroups; /* head-dim columns of dQ per consumer warpgroup */
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup (one warp of it works) */
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
constexpr int kQSteps = kBlockQ / kWgmmaK;       /* k-steps of the RS GEMMs (the tile's 64 queries) */
constexpr int kKeyHalves = kBlockK / kTileK;     /* 64-key halves of the dQ GEMM's reduced dimension */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands (and N = 64 B operands) ignore LBO */
constexpr int kDsPitch = kBlockK + 8;   /* BF16 per row of a staged dS tile [query][128 keys]: +8 against bank conflicts */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ && kQSteps == kTileKSteps,
              "S^T per warpgroup is 64 x 64: its 32 registers are the 4 k-steps of the RS GEMMs' A "
              "(hopper_wgmma.cuh's pack_acc_a_operand packs them)");

/* Shared-memory plan of a mode (byte offsets from a 1024-byte aligned base): K, V, kStages Q and dO tiles,
   DS_TILES staged dS tiles [64 query][kDsPitch] BF16, the row state float4 [kStages][kBlockQ], with
   LAMBDA_ROW a float [kStages][kBlockQ] lambda row, the barriers, and with DQ_TILES one FP32 dQ tile
   [64 queries][64 columns] per consumer warpgroup (two 128B-swizzled boxes of 32 columns; single-buffered:
   two would not fit next to the rest), the partial its TMA reduce-adds send. A tile of R rows x 128 columns
   is two chunks of [R rows][128 bytes], swizzled: column chunk c at c * (R * 128). */
template <int DS_TILES, bool LAMBDA_ROW, bool DQ_TILES>
struct Keys128Plan {
    static constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;           /* 8 KB */
    static constexpr int kKeyChunkBytes = kBlockK * kSwizzleRowBytes;       /* 16 KB: 128 keys x 64 columns */
    static constexpr int kKeyTileBytes = kChunks * kKeyChunkBytes;          /* 32 KB */
    static constexpr int kQChunkBytes = kBlockQ * kSwizzleRowBytes;         /* 8 KB: 64 queries x 64 columns */
    static constexpr int kQTileBytes = kChunks * kQChunkBytes;              /* 16 KB */
    static constexpr int kK = 0;
    static constexpr int kV = kK + kKeyTileBytes;
    static constexpr int kQ = kV + kKeyTileBytes;            /* kStages tiles */
    static constexpr int kDO = kQ + kStages * kQTileBytes;   /* kStages tiles */
    static constexpr int kDs = kDO + kStages * kQTileBytes;  /* DS_TILES tiles */
    static constexpr int kDsBytes = kBlockQ * kDsPitch * 2;
    static constexpr int kRowState = kDs + DS_TILES * kDsBytes;
    static constexpr int kLambda = kRowState + kStages * kBlockQ * 16;
    static constexpr int kBarriers = kLambda + (LAMBDA_ROW ? kStages * kBlockQ * 4 : 0);
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    static constexpr int kDqTileBytes = kBlockQ * kDqCols * 4;
    static constexpr int kDqTile = (kBarriers + 8 * kNumBarriers + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
    static constexpr int kBytes = DQ_TILES ? kDqTile + kConsumerWarpgroups * kDqTileBytes : kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kDsBytes % 16 == 0 && kRowState % 16 == 0 && kLambda % 16 == 0 && kBarriers % 8 == 0,
                  "float4 row state, float2 lambda pairs, barriers");
    static_assert(kKeyChunkBytes == kKeymajor128KeyChunkBytes && kQChunkBytes == kKeymajor128QChunkBytes &&
                      kHS == kKeymajor128HS && kQSteps == kKeymajor128QSteps,
                  "the tiles hopper_bwd_common.cuh's HS-128 GEMM steps (keymajor128_scores, _rs_issue) address");
    static_assert(kKeyChunkBytes == KeymajorTiles<kChunks>::kKeyChunkBytes &&
                      kQChunkBytes == KeymajorTiles<kChunks>::kQChunkBytes &&
                      kBoxBytes == KeymajorTiles<kChunks>::kBoxBytes && kBlockK == KeymajorTiles<kChunks>::kBlockK &&
                      kBlockQ == KeymajorTiles<kChunks>::kBlockQ,
                  "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads, 2 and 3 the warpgroups'). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* bounded mbarrier waits that give up (see attention_hopper_bwd128.cu's file comment: no trap under setmaxnreg) */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
/* set by the object's installer (hopper_lab_hooks.cuh, through attention_hopper_bwd_watch_hangs); NULL: no record */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* ---- dQ: the staged bf(dS) tiles, the dQ GEMM, the send (bf16, repair, fp32) ---- */

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

/* fp32's dS terms: bf(dS), bf(r1), bf(r1 - bf(r1)), each staged in a tile of its own */
constexpr int kDsTerms = 3;
constexpr int kDsTileElems = Keys128Plan<kDsTerms, false, true>::kDsBytes / 2; /* BF16 from one staged term to the next */

/* dQ_half[64 queries x 64 dims] += sum over the three staged terms and the two 64-key halves of
   A[64 q x 64 keys] K[64 keys x 64 dims] (form (n1)): A loaded from tile `term` (tiles + term kDsTileElems,
   [query][key], columns 64 half..) into two alternating register sets; B = K chunk k_chunk_addr read N-major,
   key half `half` one 8 KB box further (16 rows = 2048 bytes per k-step: form (d), the same descriptors).
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
    reg_fences(dq, a0, a1);
}

/* This warpgroup's dQ partial (rows = queries q0 + 16 warp_in_wg + g (+8), cols 64 wg + 8n + 2t) into its
   dQ tile, then one thread adds it to the accumulator with two TMA reduce-adds (rows past T are outside the
   map). The tile is two 128B-swizzled boxes of 32 columns: float2 (row r, cols 8n + 2t) is 16-byte chunk
   (2 (n % 4) + t / 2) ^ (r % 8) of row r of box n / 4, and r % 8 = g (attention_hopper_bwd.cu's HS-64 flush,
   1.10-1.12x faster than red.global atomics: dev/results/attention_hopper_2026-11-29.md). */
__device__ __forceinline__ void send_dq_partial(const float (&dq)[32], unsigned char* dq_tile, int warp_in_wg, int g,
                                                int t, int wg, int q0, int dq_head, const CUtensorMap* dq_map) {
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
        tma_reduce_add_3d(dq_map, dq_tile, wg * kDqCols, q0, dq_head);
        tma_reduce_add_3d(dq_map, dq_tile + kBlockQ * kSwizzleRowBytes, wg * kDqCols + 32, q0, dq_head);
        bulk_commit_group();
    }
}

/* ---- the modes ---- */

/* A mode's traits: Plan (its shared memory), kSendsDq (dQ partials leave the CTA by TMA reduce-adds; the entry
   point takes dq_map), kLongestFirst (the CTAs take their key tiles longest first over all heads,
   tile_order.cuh; else blockIdx.x is the key tile), kRowStateMode / kLambda / kRolledRowState (the producer's
   keymajor_stage_row_state). What a mode does with S^T and dP^T is its block of keys128_pass's step, not a
   method here: as a function of its own (even __forceinline__) it is simplified before it is inlined, without
   what the kernel knows (the 1024-aligned shared base, the lane's ranges), and its address arithmetic comes out
   associated and hoisted otherwise: other machine code than the kernel's. */
template <int MODE>
struct Keys128Mode { /* bf16 and repair: P = recompute_prob<MODE>, one bf(dS) tile double-buffered by step parity */
    static_assert(MODE == ATTN_BF16 || MODE == ATTN_REPAIR, "bf16 and repair (gproj and fp32 below)");
    using Plan = Keys128Plan<2, false, true>;
    static constexpr bool kSendsDq = true, kLongestFirst = true, kRolledRowState = false;
    static constexpr int kRowStateMode = MODE, kLambda = kKeymajorNoLambda;
};

template <>
struct Keys128Mode<ATTN_GPROJ> { /* gproj: repair's P and dS, bf(-lambda P) into dK, no dQ (the row pass wrote it) */
    using Plan = Keys128Plan<0, true, false>;
    static constexpr bool kSendsDq = false, kLongestFirst = false, kRolledRowState = false;
    static constexpr int kRowStateMode = ATTN_GPROJ, kLambda = kKeymajorLambdaRow;
};

template <>
struct Keys128Mode<ATTN_FP32> { /* fp32: P and dS split into BF16 terms (pack_split_step), dQ over three staged dS terms */
    using Plan = Keys128Plan<kDsTerms, false, true>;
    static_assert(kConsumerWarpgroups * Plan::kDqTileBytes >= Plan::kDsBytes,
                  "the probe uses the dQ tiles as a zero BF16 dS tile");
    /* the row state rolled: unrolled, the producer's 24 registers spilled (two queries' loads in flight) */
    static constexpr bool kSendsDq = true, kLongestFirst = true, kRolledRowState = true;
    static constexpr int kRowStateMode = ATTN_FP32, kLambda = kKeymajorNoLambda;
};

/* ---- the kernel ---- */

/* The key-major pass at HS 128 of mode MODE (the instantiation file's comment has the mode's design). stats
   per row ({LSE} for bf16, {m, l} otherwise), D [B*NH*T] (and gproj's lambda) from the workspace; writes the
   k and v slots of dqkv; modes that send dQ add the s-less dQ partials to the accumulator behind dq_map.
   DQ_SLICES: the deterministic backward's per-key-block dQ slices (keymajor_dq_head; docs/determinism.md).
   The body of both entry points below (their parameter lists differ: gproj has lambda, no dq_map). */
template <int MODE, bool DQ_SLICES>
__device__ __forceinline__ void keys128_pass(const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                                             const CUtensorMap* dq_map, const float* __restrict__ stats,
                                             const float* __restrict__ D, const float* __restrict__ lambda,
                                             bf16* __restrict__ dqkv, int NH, int T, float scale, float c,
                                             int section, int& cta_abort) {
    using Mode = Keys128Mode<MODE>;
    using Plan = typename Mode::Plan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    float4* row_state = reinterpret_cast<float4*>(smem + Plan::kRowState);
    float* lambda_s = reinterpret_cast<float*>(smem + Plan::kLambda);
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = kv_full + 1;
    uint64_t* empty = full + kStages;

    /* the key tile and head: longest first over all heads (key tile 0 sees every query), or blockIdx.x, y
       (the order is read only by the modes that take it) */
    const AttnTileOrder order = attn_tile_longest_first(section);
    const int k0 = Mode::kLongestFirst ? order.rank * kBlockK : (int)(blockIdx.x * kBlockK);
    const int bh = Mode::kLongestFirst ? order.bh : (int)blockIdx.y, b = bh / NH, h = bh % NH;
    const int dq_head = keymajor_dq_head<DQ_SLICES>(order, (int)gridDim.y); /* where this CTA's dQ partials go */
    const int qt_begin = k0 / kBlockQ;   /* the first query tile that reaches key k0 */
    const int n_q_tiles = (T + kBlockQ - 1) / kBlockQ - qt_begin;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

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
            keymajor_stage_row_state<Mode::kRowStateMode, Mode::kLambda, Mode::kRolledRowState>(
                row_state + s * kBlockQ, lambda_s + s * kBlockQ, stats, D, lambda, bh, T, q0, lane);
            /* every lane's arrival releases its own row-state writes; lane 0's also announces the TMA bytes */
            keymajor_fill_stage<kChunks>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map,
                                         &dout_map, &full[s], q0, h, NH, b, lane);
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63 (dK, dV rows) and dQ columns 64 wg .. +63 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g; /* this thread's keys: key_col, key_col + 8 */
    /* one sum, two associations: they compile to different machine code, and each mode keeps the code it was
       measured with */
    const int key0 = (MODE == ATTN_GPROJ) ? k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g : k0 + key_col;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
    const uint32_t k_dq_addr = smem_u32(k_s) + wg * Plan::kKeyChunkBytes; /* chunk wg: dims 64 wg .. +63 */
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs); /* fp32: term k at k * kDsTileElems */
    float dk[kHS / 2], dv[kHS / 2];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dk[i] = dv[i] = 0.f;

    mbar_wait_bounded(kv_full, 0, ATTN_HANG_KV_FULL, 0, &cta_abort);
    __syncwarp();

    /* the steps, rolled (fp32 needs it for its registers; the other modes compile to the same code either way) */
#pragma unroll 1
    for (int i = 0; i < n_q_tiles; i++) {
        const int s = i % kStages;
        const int q0 = (qt_begin + i) * kBlockQ;
        mbar_wait_bounded(&full[s], (uint32_t)((i / kStages) & 1), ATTN_HANG_FULL, s, &cta_abort);
        __syncwarp();
        const uint32_t q_addr = smem_u32(q_s + s * Plan::kQTileBytes), do_addr = smem_u32(do_s + s * Plan::kQTileBytes);
        const float4* rs = row_state + s * kBlockQ;
        bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + (i & 1) * Plan::kDsBytes); /* bf16, repair: this parity's dS tile */
        float st[32], dpt[32];
        keymajor128_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);
        /* fp32: both warpgroups have loaded the previous step's dS terms (their dQ A operands) before either
           rewrites the single-buffered tiles */
        if constexpr (MODE == ATTN_FP32) consumers_sync();
        /* the mask can bite only where the tile reaches the warpgroup's keys or T */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);

        /* the mode's step; element 4j + 2r + e of st, dpt: key key0 + 8r, query q0 + 8j + 2t + e */
        if constexpr (MODE == ATTN_GPROJ) {
            const float* lam_row = lambda_s + s * kBlockQ;

            /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions) and the three A operands, one
               k-step (16 queries) at a time */
            uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
            with_step_mask<kKeymajorSplitMask<MODE>>(masked, [&](auto mask) {
#pragma unroll
                for (int kk = 0; kk < kQSteps; kk++) {
                    float lam[2][2];
                    load_step_lambdas(lam, lam_row, kk, t);
                    keymajor_probs_step<ATTN_REPAIR, decltype(mask)::value>(st, dpt, rs, kk, q0, t, key0, T, masked, c);
                    pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
                }
            });

            /* dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: one batch of 12 wgmmas, the
               two dK ones chained on the same accumulator; P and dS are dead while it runs (128 accumulator +
               48 A registers in flight). */
            keymajor_gproj_dkv_batch<kHS>(dv, dk, pa, pds, plam, q_addr, do_addr);
            mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
        } else if constexpr (MODE == ATTN_FP32) {

            /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions), their four A words and the three
               staged dS terms, one k-step (16 queries) at a time, so the FP32 values die step by step */
            uint32_t pa[kQSteps][4], pa_lo[kQSteps][4], pds[kQSteps][4], pds_lo[kQSteps][4];
            with_step_mask<kKeymajorSplitMask<MODE>>(masked, [&](auto mask) {
#pragma unroll
                for (int kk = 0; kk < kQSteps; kk++)
                    keymajor_fp32_split_step<kDsPitch, kDsTileElems, decltype(mask)::value>(
                        st, dpt, rs, kk, q0, t, key0, T, masked, c, pa[kk], pa_lo[kk], pds[kk], pds_lo[kk], ds_tiles,
                        key_col);
            });
            /* dV += bf(P)^T dO + bf(P - bf(P))^T dO, dK += bf(dS)^T Q + bf(r1)^T Q: one batch of 16 wgmmas, two
               chains of 8 on one accumulator each (128 accumulator + 64 A registers in flight) */
            reg_fences(pa, pa_lo, pds, pds_lo, dv, dk);
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
            reg_fences(dv, dk, pa, pa_lo, pds, pds_lo);
            mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

            /* dQ for all 64 queries, this warpgroup's 64 columns, over the CTA's 128 keys and the three terms */
            float dq[32];
#pragma unroll
            for (int k = 0; k < 32; k++) dq[k] = 0.f;
            reg_fence(dq);
            warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);

            unsigned char* dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
            /* g passed through an opaque move here: otherwise the four swizzled column offsets of the send are
               hoisted out of the loop and kept live across it (8 bytes of spills at 240 registers) */
            int g_here;
            asm volatile("mov.u32 %0, %1;\n" : "=r"(g_here) : "r"(g));
            send_dq_partial(dq, dq_tile, warp_in_wg, g_here, t, wg, q0, dq_head, dq_map);
        } else {

            /* P and dS in registers (st <- P, dpt <- dS), masked entries exactly 0, then bf(P), bf(dS) as A
               operands */
            uint32_t pa[kBlockQ / kWgmmaK][4], pds[kBlockQ / kWgmmaK][4];
            with_step_mask<kKeymajorSplitMask<MODE>>(masked, [&](auto mask) {
#pragma unroll
                for (int j = 0; j < kBlockQ / 8; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int query = q0 + 8 * j + 2 * t + e;
                        const float4 row = rs[8 * j + 2 * t + e];
                        keymajor_probs_column<MODE, decltype(mask)::value>(st, dpt, row, j, e, query, key0, T, masked,
                                                                           c);
                    }
                pack_acc_a_operand(pa, st);
                pack_acc_a_operand(pds, dpt);
            });
            /* bf(dS) also to the shared tile (this warpgroup's 64 key columns) */
            stage_ds_all<kDsPitch>(ds_s, pds, key_col, t);
            /* dV += bf(P)^T dO, dK += bf(dS)^T Q as one batch */
            reg_fences(pa, pds, dv, dk);
            wgmma_fence();
            keymajor128_rs_issue(dv, pa, do_addr);
            keymajor128_rs_issue(dk, pds, q_addr);
            wgmma_commit();
            /* the previous step's dQ reduce-adds have read this warpgroup's dQ tile before the barrier below lets
               its threads rewrite it */
            if ((threadIdx.x & 127) == 0) bulk_wait_group_read<0>();
            consumers_sync(); /* both warpgroups' halves of the dS tile are written */
            wgmma_wait<0>();
            reg_fences(dv, dk, pa, pds);
            mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */

            /* dQ for all 64 queries, this warpgroup's 64 columns, over the CTA's 128 keys */
            uint32_t adq[kBlockK / kWgmmaK][4];
            load_ds_operand(adq, ds_s, warp_in_wg, g, t);
            float dq[32];
#pragma unroll
            for (int k = 0; k < 32; k++) dq[k] = 0.f;
            reg_fences(adq, dq);
            wgmma_fence();
            warpgroup_dq_issue(dq, adq, k_dq_addr);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fences(dq, adq);

            unsigned char* dq_tile = smem + Plan::kDqTile + wg * Plan::kDqTileBytes;
            send_dq_partial(dq, dq_tile, warp_in_wg, g, t, wg, q0, dq_head, dq_map);
        }
    }
    /* the last reduce-adds complete before the CTA's shared memory goes away */
    if constexpr (Mode::kSendsDq)
        if ((threadIdx.x & 127) == 0) bulk_wait_group<0>();

    /* a wait of this CTA that gave up (consumer or producer; the producer's give-up precedes an arrival on
       full that every consumer waited for) is visible to every consumer thread after this barrier */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t); NaN in every
       element of both rows if the CTA gave up a wait (see the file comment: a hang must fail loudly) */
    /* the head again from the CTA's position, through an opaque copy of section so that it is not the prelude's
       value kept live across the steps (kept there, it cost fp32's pass an 8-byte spill) */
    int section_end;
    asm volatile("mov.u32 %0, %1;\n" : "=r"(section_end) : "r"(section));
    const int bh_end = Mode::kLongestFirst ? attn_tile_longest_first(section_end).bh : (int)blockIdx.y;
    keymajor_store_dkv<kHS>(dk, dv, dqkv, bh_end / NH, bh_end % NH, NH, T, key0, t, scale, gave_up);
}

/* The entry point of the modes that send dQ partials (bf16, repair, fp32). */
template <int MODE, bool DQ_SLICES>
__global__ void __launch_bounds__(kThreads, 1)
    keys128_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                   const __grid_constant__ CUtensorMap dq_map, const float* __restrict__ stats,
                   const float* __restrict__ D, bf16* __restrict__ dqkv, int NH, int T, float scale, float c,
                   int section) {
    static_assert(Keys128Mode<MODE>::kSendsDq, "gproj's entry point is keys128_gproj_kernel");
    __shared__ int cta_abort; /* set by a bounded wait that gave up (mbar_wait_bounded) */
    keys128_pass<MODE, DQ_SLICES>(qkv_map, dout_map, &dq_map, stats, D, nullptr, dqkv, NH, T, scale, c, section, cta_abort);
}

/* gproj's entry point: lambda [B*NH*T] from the row pass, no dQ. A template (MODE = ATTN_GPROJ) so that only
   the gproj object emits it. */
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    keys128_gproj_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                         const float* __restrict__ stats, const float* __restrict__ D,
                         const float* __restrict__ lambda, bf16* __restrict__ dqkv, int NH, int T, float scale,
                         float c, int section) {
    static_assert(MODE == ATTN_GPROJ, "the other modes' entry point is keys128_kernel");
    __shared__ int cta_abort; /* set by a bounded wait that gave up (mbar_wait_bounded) */
    keys128_pass<MODE, false>(qkv_map, dout_map, nullptr, stats, D, lambda, dqkv, NH, T, scale, c, section, cta_abort);
}

/* ---- host ---- */

/* One launch of the pass of MODE on the call's tensors: the qkv / dout maps, the grid (key tiles, B*NH) and the
   PDL launch after the previous kernel of the chain; the modes that send dQ (bf16, repair, fp32) also the dQ
   accumulator's map (with c.dq_slices one slice per key block and the DQ_SLICES kernel), gproj lambda in its
   place. */
static_assert(kBlockK == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per CTA key block");
template <int MODE>
void keys128_launch(const HopperBwdCall& c) {
    constexpr int kAlloc = Keys128Mode<MODE>::Plan::kAlloc;
    const AttnShape s = c.s;
    const char* const who = "attention (Hopper key-major pass, HS 128)"; /* in a tensor map's error */
    const HeadMaps maps = encode_qkv_dout_maps(s, c.qkv, c.dout, kBoxRows, who);
    const int n_key_blocks = ceil_div(s.T, kBlockK);
    const dim3 grid((unsigned)n_key_blocks, (unsigned)(s.B * s.NH));
    if constexpr (MODE == ATTN_GPROJ) {
        cudaCheck(cudaFuncSetAttribute(keys128_gproj_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kAlloc));
        launch_after_previous_grid(1, keys128_gproj_kernel<MODE>, grid, dim3(kThreads), kAlloc, c.stream, maps.qkv,
                                   maps.dout, c.stats, c.D, c.lambda, c.dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                                   attn_exp2_scale(kHS), attn_tile_section(s, kTileSectionQdO));
    } else {
        const auto kernel = c.dq_slices ? keys128_kernel<MODE, true> : keys128_kernel<MODE, false>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kAlloc));
        const CUtensorMap dq_map = encode_dq_acc_map(c.dq_acc, s, kBlockQ, who, c.dq_slices ? n_key_blocks : 1);
        launch_after_previous_grid(1, kernel, grid, dim3(kThreads), kAlloc, c.stream, maps.qkv, maps.dout, dq_map,
                                   c.stats, c.D, c.dqkv, s.NH, s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS),
                                   attn_tile_section(s, kTileSectionQdOdQ));
    }
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_CUH */
