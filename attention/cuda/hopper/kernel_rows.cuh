/*
 * attention/cuda/hopper/kernel_rows.cuh - the device code of the Hopper row pass (gproj: lambda and all of dQ;
 * fp32: D) at both head sizes, one kernel template over head-size traits: the constants both share, each head
 * size's traits (RowsShape<HS>: the CTA's producer, setmaxnreg split, waits, shared-memory plan), the HS-128
 * GEMM steps, the kernel body rows_kernel<HS, MODE>, in the including file's anonymous namespace. Included by
 * the instantiation files attention/cuda/hopper/attention_hopper_rows.cu (HS 64) and attention_hopper_rows128.cu
 * (HS 128) (their entry points; each head size's design, numerics and barrier protocol are in its file
 * comment), and by the layout probes dev/attention_lab/probes/probe_rows64.cu and probe_rows128.cu, which run
 * the same helpers on one tile.
 *
 * Why one template: both head sizes are one CTA (128 query rows, two consumer warpgroups of 64 rows and a
 * producer warpgroup with setmaxnreg, whose waits give up instead of hanging; Q and dO loaded once, K/V tiles of
 * 128 keys in 2 stages worked in two 64-key halves); they differ in the 64-column chunks of a row, the S/dP GEMM
 * form, for gproj the schedule (HS 64 issues one half's DSK/PK GEMMs with the next half's S/dP) and whether a CTA
 * runs several work items from a queue (HS 64: two Q/dO buffers fit; rows_produce_items). Why a
 * header: the probes are lab code and stay out of the production objects, yet they must use the kernel's own
 * helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_ROWS_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_ROWS_CUH

#include <math.h>
#include <stdint.h>
#include <type_traits>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/hopper/hopper_rows_common.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"
#include "attention/cuda/hopper/hopper_work_queue.cuh"
#include "attention/cuda/launch_overlap.cuh"

using namespace hopper_wgmma;

namespace {

/* ---- what both head sizes share ---- */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row (one TMA box width) */
static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
constexpr int kBlockQ = 128;            /* query rows per CTA */
constexpr int kBlockK = 128;            /* keys per K/V tile (= TMA box rows) */
constexpr int kWarpgroupRows = 64;      /* query rows per consumer warpgroup (the M of wgmma) */
constexpr int kConsumerWarpgroups = kBlockQ / kWarpgroupRows;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kStages = 2;              /* K/V double buffering */
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes; /* 8 rows x 128 B: the repeat of the 128B swizzle */
constexpr int kWgmmaK = 16;             /* k of every bf16 wgmma */
constexpr int kKStepsPerChunk = kChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes per 128-byte row */
constexpr uint32_t kUnusedLbo = 16;     /* K-major swizzled operands ignore LBO */
/* The S/dP GEMMs and the P/dS work run over 64-key halves of each 128-key tile: four accumulators over the
   whole tile (S 64 + dP 64 + DSK 32 + PK 32 floats per thread at HS 64) spill even at 224 registers (ptxas,
   CUDA 13.0: 460 bytes), halves do not; at HS 128 DSK + PK alone are 128 registers. */
constexpr int kSubKeys = 64;
constexpr int kSubTiles = kBlockK / kSubKeys;
constexpr int kSRegs = kSubKeys / 2;    /* S or dP accumulator: 64 x kSubKeys FP32 over 128 threads */
constexpr int kKeySteps = kSubKeys / kWgmmaK; /* k-steps of the DSK/PK GEMMs per half (16 keys each) */
constexpr int kSubTileBytes = kSubKeys * kSwizzleRowBytes; /* 8 KB: halves stay 1024-byte aligned */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kBlockQ == kBlockK, "one box shape serves Q, dO, K and V tiles; only the last key tile is diagonal");
static_assert(kKeySteps == kTileKSteps, "hopper_wgmma.cuh's pack_acc_a_operand packs a 64 x 64 accumulator");
/* which mbarrier a bounded wait gave up on (attention_hopper_bwd.cuh's sites: "the tiles loaded once" and "the
   tiles of a stage", here Q/dO and K/V) */
constexpr int kHangQdo = ATTN_HANG_KV_FULL;       /* q_full: Q and dO, loaded once per item (and item_full) */
constexpr int kHangKv = ATTN_HANG_FULL;           /* full[s]: the K/V tiles of stage s */
constexpr int kHangQdoEmpty = ATTN_HANG_KV_EMPTY; /* q_empty: an item's Q and dO released by the consumers */

/* Shared-memory plan (byte offsets from a 1024-byte aligned base): QBUFS Q and dO tiles (Q buffer b: Q at
   kQ + b * kTileBytes, dO at kDO + b * kTileBytes), then kStages K and V tiles. A tile is 128 rows x HS columns =
   CHUNKS chunks of [128 rows][128 bytes], swizzled: column chunk c at c * kChunkBytes; a warpgroup's or half's 64
   rows start kSliceBytes into each chunk. Barriers: q_full[QBUFS], full[kStages], empty[kStages], and with two Q
   buffers (a CTA that runs several items) q_empty[QBUFS] and item_full[QBUFS]. */
template <int CHUNKS, int QBUFS>
struct RowsPlan {
    static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes; /* 16 KB */
    static constexpr int kSliceBytes = 64 * kSwizzleRowBytes;      /* 8 KB: 64 rows of one chunk */
    static constexpr int kTileBytes = CHUNKS * kChunkBytes;
    static constexpr int kQ = 0;                         /* QBUFS tiles */
    static constexpr int kDO = kQ + QBUFS * kTileBytes;  /* QBUFS tiles */
    static constexpr int kK = kDO + QBUFS * kTileBytes;  /* kStages tiles */
    static constexpr int kV = kK + kStages * kTileBytes; /* kStages tiles */
    static constexpr int kBarriers = kV + kStages * kTileBytes;
    static constexpr int kNumBarriers = QBUFS + 2 * kStages + (QBUFS > 1 ? 2 * QBUFS : 0);
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kSliceBytes % kSwizzleAtomBytes == 0 && kChunkBytes % kSwizzleAtomBytes == 0, "1024-aligned");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* A head size's traits: kChunks (64-column chunks per row), kDqRegs (a DSK or PK accumulator, 64 x HS), the
   producer warpgroup after the two consumer warpgroups (kThreads) with the setmaxnreg split kProducerRegs /
   kConsumerRegs of the 384 threads' 168 registers each (with 288 threads, a producer warp, 168 is the cap: one
   SM sub-partition holds three of the nine warps); bounded waits that give up, and NaN outputs after a give-up
   (a trap on the consumer path would make ptxas ignore setmaxnreg.inc). kPipelined (HS 64, gproj): half h's
   DSK/PK GEMMs and half h + 1's S/dP GEMMs in one commit group; at HS 128 DSK + PK alone are 128 registers,
   which leaves no room for the next half's S and dP. kItemLoop (HS 64): a CTA runs work items until none is
   left (rows_pass), with two Q/dO buffers; at HS 128 a second pair (64 KB) does not fit beside the 192 KB. */
template <int HS>
struct RowsShape {
    static_assert(HS == 64 || HS == 128, "head sizes 64 and 128");
    static constexpr int kChunks = HS / kChunkCols;
    static constexpr bool kItemLoop = (HS == 64);
    static constexpr int kQBuffers = kItemLoop ? 2 : 1;
    using Plan = RowsPlan<kChunks, kQBuffers>;
    static constexpr int kDqRegs = HS / 2;
    static constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup */
    /* HS 64: the item loop's producer (its queue, its item, the stage count) spills 12 bytes at 24 registers */
    static constexpr int kProducerRegs = kItemLoop ? 32 : 24, kConsumerRegs = kItemLoop ? 232 : 240;
    static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
                  "the setmaxnreg split must fit in what the CTA was launched with");
    static constexpr bool kPipelined = (HS == 64);
    static_assert(Plan::kAlloc <= 227 * 1024, "the Q/dO buffers must fit");
};
static_assert(RowsShape<64>::Plan::kTileBytes == RowsShape<64>::Plan::kChunkBytes &&
                  RowsShape<64>::Plan::kSliceBytes == kSubTileBytes,
              "HS 64: one chunk per tile, a half is a slice");

/* ---- the HS-128 GEMMs of one 64-key half, per warpgroup (shared by the kernel and the layout probe) ---- */

/* acc += A B^T issued (64 x 64 over HS: 8 k-steps; the caller zeroes, fences, commits, waits): A the
   warpgroup's 64 rows of Q or dO, B the half's 64 keys of K or V, both K-major slices of 128-row tiles whose
   chunks are kChunkBytes apart; k-step kk reads bytes 32 (kk % 4) of the rows of chunk kk / 4 (assumption (a)). */
__device__ __forceinline__ void warpgroup_ss_issue(float (&acc)[kSRegs], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
    for (int kk = 0; kk < 128 / kWgmmaK; kk++) {
        const uint32_t off = (kk / kKStepsPerChunk) * RowsPlan<2, 1>::kChunkBytes +
                             (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        wgmma_m64n64k16_ss(acc, make_smem_desc(a_addr + off, kUnusedLbo, kSwizzleAtomBytes),
                           make_smem_desc(b_addr + off, kUnusedLbo, kSwizzleAtomBytes));
    }
}

/* S = Q_w K_h^T and dP = dO_w V_h^T (64 rows x 64 keys each) as one commit group, waited for. Written. */
__device__ __forceinline__ void warpgroup_scores(float (&s)[kSRegs], float (&dp)[kSRegs], uint32_t q_addr,
                                                 uint32_t k_addr, uint32_t do_addr, uint32_t v_addr) {
    two_gemms_written(s, dp, [&] {
        warpgroup_ss_issue(s, q_addr, k_addr);
        warpgroup_ss_issue(dp, do_addr, v_addr);
    });
}

/* ---- the waits ---- */

constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
/* set by the object's installer (attention_hopper_rows_watch_hangs, attention_hopper_rows128_watch_hangs); NULL:
   no record */
__device__ AttnHopperHang* g_hang_record;

/* Every wait of the kernel and the HS-128 probe: a bounded wait that gives up (no trap under setmaxnreg), recording
   the barrier when a lab installed a hang record and setting the CTA's abort flag. */
__device__ __forceinline__ void rows_wait(uint64_t* bar, uint32_t parity, int site, int index, int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads). */
__device__ __forceinline__ void consumers_sync() { named_bar_sync(1, kConsumerThreads); }

/* The same barrier, returning whether `pred` was true in any consumer thread (named_bar_sync_any). */
__device__ __forceinline__ bool consumers_sync_any(bool pred) { return named_bar_sync_any(1, kConsumerThreads, pred); }

/* The persistent launch's queue of work items (hopper_work_queue.cuh): the passes of this translation unit run one
   at a time on a stream. */
__device__ HopperWorkQueue g_rows_queue;

/* The producer of a CTA with kItemLoop (rows_pass), one thread: it runs the CTA's work items (128 query rows of a
   head each, ceil(T / 128) x heads of them in the longest-first order of tile_order.cuh) one after another, the
   first from the grid position and, when the launch has fewer CTAs than items (a persistent launch), each next one
   from g_rows_queue once a Q/dO buffer is free for it. Item `use` takes buffer use % kQBuffers: the producer
   writes the item, decoded, to item_of[b] and arrives on item_full[b] (so the consumers load the item's row state
   while its Q and dO land), then loads Q and dO (q_full[b]) and the item's K/V tiles into the stages that run on
   over the CTA's items; an item of no key tiles ends the consumers' loop. The item lives in shared memory, not in
   the producer's 24 registers. After the last item it waits for the consumers to release it: a CTA whose wait
   gave up (its consumers write NaN over their item and take no more) traps, so that no item it took is left
   unrun with its outputs untouched, and the launch ends with an error. */
template <int HS>
__device__ __forceinline__ void rows_produce_items(const CUtensorMap& qkv_map, const CUtensorMap& dout_map, int NH,
                                                   int T, int section, int heads, unsigned char* smem,
                                                   AttnQueryItem* item_of, int* cta_abort) {
    using Shape = RowsShape<HS>;
    using Plan = typename Shape::Plan;
    constexpr int kQBuffers = Shape::kQBuffers, kChunks = Shape::kChunks;
    static_assert(Shape::kItemLoop, "the item loop's producer");
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = q_full + kQBuffers;
    uint64_t* empty = full + kStages;
    uint64_t* q_empty = empty + kStages;
    uint64_t* item_full = q_empty + kQBuffers;
    const int q_tiles = (T + kBlockQ - 1) / kBlockQ;
    const unsigned n_items = (unsigned)q_tiles * (unsigned)heads; /* < 2^32: attention_cuda_check_shape */
    const bool queued = gridDim.x < n_items;
    volatile AttnQueryItem* const items = item_of;
    int seq = 0; /* the CTA's K/V tiles issued so far */
    int use = 0;
    for (;; use++) {
        const int qb = use % kQBuffers;
        /* buffer qb and its entry are free once every consumer released their previous use */
        if (use >= kQBuffers) {
            rows_wait(&q_empty[qb], (uint32_t)((use / kQBuffers - 1) & 1), kHangQdoEmpty, qb, cta_abort);
            if (*static_cast<volatile int*>(cta_abort) != 0) __trap(); /* the CTA gave up */
        }
        const unsigned w = use == 0 ? blockIdx.x : queued ? work_queue_next(&g_rows_queue, n_items) : n_items;
        if (w >= n_items) {
            items[qb].n_key_tiles = 0;
            mbar_arrive(&item_full[qb]); /* releases the entry's write */
            break;
        }
        const AttnQueryItem it =
            attn_query_item(attn_tile_rank_head(w, q_tiles, heads, section), q_tiles, kBlockQ, kBlockK, NH, T);
        items[qb].q0 = it.q0, items[qb].bh = it.bh, items[qb].b = it.b, items[qb].h = it.h;
        items[qb].n_key_tiles = it.n_key_tiles;
        mbar_arrive(&item_full[qb]); /* releases the entry's writes */
        mbar_arrive_expect_tx(&q_full[qb], 2 * Plan::kTileBytes);
        for (int ch = 0; ch < kChunks; ch++) {
            const int dst = qb * Plan::kTileBytes + ch * Plan::kChunkBytes;
            tma_load_4d(smem + Plan::kQ + dst, &qkv_map, &q_full[qb], ch * kChunkCols, kSlotQ * NH + items[qb].h,
                        items[qb].q0, items[qb].b);
            tma_load_4d(smem + Plan::kDO + dst, &dout_map, &q_full[qb], ch * kChunkCols, items[qb].h, items[qb].q0,
                        items[qb].b);
        }
        const int n_key_tiles = items[qb].n_key_tiles;
        for (int kt = 0; kt < n_key_tiles; kt++) {
            const int st = seq + kt, s = st % kStages;
            /* reuse of stage s: its release for tile st - kStages completed phase st / kStages - 1 */
            if (st >= kStages) {
                rows_wait(&empty[s], (uint32_t)((st / kStages - 1) & 1), ATTN_HANG_EMPTY, s, cta_abort);
                if (*static_cast<volatile int*>(cta_abort) != 0) __trap(); /* the CTA gave up */
            }
            mbar_arrive_expect_tx(&full[s], 2 * Plan::kTileBytes);
            for (int ch = 0; ch < kChunks; ch++) {
                const int dst = s * Plan::kTileBytes + ch * Plan::kChunkBytes;
                tma_load_4d(smem + Plan::kK + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotK * NH + items[qb].h,
                            kt * kBlockK, items[qb].b);
                tma_load_4d(smem + Plan::kV + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotV * NH + items[qb].h,
                            kt * kBlockK, items[qb].b);
            }
        }
        seq += n_key_tiles;
    }
    /* the last item released (use >= 1: a CTA's first item exists), then whether the CTA gave up */
    const int last = use - 1;
    rows_wait(&q_empty[last % kQBuffers], (uint32_t)((last / kQBuffers) & 1), kHangQdoEmpty, last % kQBuffers,
              cta_abort);
    if (queued) work_queue_finish(&g_rows_queue);
    if (*static_cast<volatile int*>(cta_abort) != 0) __trap();
}

/* ------------------------------------------------------------------------------------------------ */
/* the kernel                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

/* The row pass at head size HS. MODE: ATTN_GPROJ (forms D = dO . O from out and dout and writes it; writes
   lambda, dQ) or ATTN_FP32 (writes D = sum P dP; out unread). cta_abort: the CTA's abort flag, which a wait that
   gives up sets (rows_wait). The body of rows_kernel. */
template <int HS, int MODE>
__device__ __forceinline__ void rows_pass(const CUtensorMap& qkv_map, const CUtensorMap& dout_map,
                                          const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                          const float* __restrict__ stats, float* __restrict__ D,
                                          float* __restrict__ lambda, bf16* __restrict__ dqkv, int NH, int T,
                                          float scale, float c, int section, int heads, int* cta_abort) {
    static_assert(MODE == ATTN_GPROJ || MODE == ATTN_FP32, "row pass exists for gproj and fp32 only");
    using Shape = RowsShape<HS>;
    using Plan = typename Shape::Plan;
    constexpr bool kGproj = (MODE == ATTN_GPROJ);
    constexpr int kChunks = Shape::kChunks, kDqRegs = Shape::kDqRegs;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem_base(smem_raw);
    unsigned char* q_s = smem + Plan::kQ;
    unsigned char* do_s = smem + Plan::kDO;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    constexpr int kQBuffers = Shape::kQBuffers;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    uint64_t* full = q_full + kQBuffers;
    uint64_t* empty = full + kStages;
    uint64_t* q_empty = empty + kStages;        /* kItemLoop: every consumer thread, after the item's outputs */
    uint64_t* item_full = q_empty + kQBuffers;  /* kItemLoop: the producer's arrival after writing item_of[b] */
    /* kItemLoop: the item whose Q and dO buffer b holds, as the producer decoded it (no key tiles: none left) */
    __shared__ AttnQueryItem item_of[kQBuffers];

    /* without kItemLoop: the CTA's one item, from its grid position (query tile, head), longest rows first */
    AttnQueryItem first{};
    if constexpr (!Shape::kItemLoop) {
        const AttnTileOrder order = attn_tile_longest_first(section);
        first = attn_query_item(order, (int)gridDim.x, kBlockQ, kBlockK, NH, T);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp-uniform to ptxas through the shuffle, so the setmaxnreg regions are not divergent code to it */
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        *cta_abort = 0;
        if constexpr (Shape::kItemLoop) { /* init_pipeline_barriers' fence below covers these */
            mbar_init(&q_full[1], 1);
            for (int i = 0; i < kQBuffers; i++) {
                mbar_init(&q_empty[i], kConsumerThreads);
                mbar_init(&item_full[i], 1);
            }
        }
        init_pipeline_barriers<kStages>(q_full, full, empty, 1, kConsumerThreads);
    }
    __syncthreads();
    /* launched with PDL (launch_overlap.cuh): the previous kernel's outputs (D, lambda, the zeroed accumulator)
       are ready from here on; the next kernel may be placed on the SMs once every CTA of this grid has started */
    wait_for_previous_grid();
    let_next_grid_launch();

    if (warpgroup == kConsumerWarpgroups) {
        setmaxnreg_dec<Shape::kProducerRegs>(); /* the whole warpgroup */
        /* ---- producer: lane 0 of its first warp issues every copy; the other threads have no work ---- */
        if constexpr (Shape::kItemLoop) {
            if (warp == kConsumerThreads / 32 && lane == 0)
                rows_produce_items<HS>(qkv_map, dout_map, NH, T, section, heads, smem, item_of, cta_abort);
            return;
        }
        const int q0 = first.q0, b = first.b, h = first.h, n_key_tiles = first.n_key_tiles;
        if (warp == kConsumerThreads / 32 && lane == 0) {
            mbar_arrive_expect_tx(q_full, 2 * Plan::kTileBytes);
            for (int ch = 0; ch < kChunks; ch++) {
                tma_load_4d(q_s + ch * Plan::kChunkBytes, &qkv_map, q_full, ch * kChunkCols, kSlotQ * NH + h, q0, b);
                tma_load_4d(do_s + ch * Plan::kChunkBytes, &dout_map, q_full, ch * kChunkCols, h, q0, b);
            }
            for (int kt = 0; kt < n_key_tiles; kt++) {
                const int s = kt % kStages;
                /* reuse of stage s: its release for tile kt - kStages completed phase kt / kStages - 1 */
                if (kt >= kStages)
                    rows_wait(&empty[s], (uint32_t)((kt / kStages - 1) & 1), ATTN_HANG_EMPTY, s, cta_abort);
                mbar_arrive_expect_tx(&full[s], 2 * Plan::kTileBytes);
                for (int ch = 0; ch < kChunks; ch++) {
                    const int dst = s * Plan::kTileBytes + ch * Plan::kChunkBytes;
                    tma_load_4d(k_s + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotK * NH + h, kt * kBlockK, b);
                    tma_load_4d(v_s + dst, &qkv_map, &full[s], ch * kChunkCols, kSlotV * NH + h, kt * kBlockK, b);
                }
            }
        }
        return; /* no block-wide barrier follows */
    }
    setmaxnreg_inc<Shape::kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns rows q0 + 64 wg .. +63 of each item; this thread rows row0, row0 + 8 ---- */
    const int wg = warpgroup, g = lane >> 2, t = lane & 3;
    int seq = 0; /* the CTA's K/V tiles before this item (the producer's count; 0 without kItemLoop) */
#pragma unroll 1
    for (int use = 0;; use++) {
        const int qb = use % kQBuffers;
        AttnQueryItem it = first;
        if constexpr (Shape::kItemLoop) {
            /* the item, written by the producer before the phase of item_full[qb] completed (Q and dO may still be
               landing: the row state's loads below overlap them) */
            rows_wait(&item_full[qb], (uint32_t)((use / kQBuffers) & 1), kHangQdo, qb, cta_abort);
            it.n_key_tiles = item_of[qb].n_key_tiles;
            if (it.n_key_tiles == 0) break;
            it.q0 = item_of[qb].q0;
            it.b = item_of[qb].b;
            it.h = item_of[qb].h;
        }
        const int q0 = it.q0, n_key_tiles = it.n_key_tiles;
        const int row0 = q0 + wg * kWarpgroupRows + (warp % 4) * 16 + g;
        float row_m[2], row_rl[2], row_D[2]; /* m, fl(1 / l), D (gproj) */
        load_row_state<kGproj, HS>(row_m, row_rl, row_D, stats, out, dout, it.b, it.h, NH, T, row0, t);
        float acc_a[2] = {0.f, 0.f}; /* gproj: r = sum bf(dS); fp32: sum P dP (this lane's keys, in key order) */
        float acc_b[2] = {0.f, 0.f}; /* gproj: p = sum bf(P) */
        float dsk[kDqRegs], pk[kDqRegs];
        if constexpr (kGproj) zero_accumulators(dsk, pk);

        const uint32_t wg_rows = wg * Plan::kSliceBytes; /* 8 KB into each chunk: stays 1024-aligned */
        const uint32_t q_addr = smem_u32(q_s + qb * Plan::kTileBytes) + wg_rows;
        const uint32_t do_addr = smem_u32(do_s + qb * Plan::kTileBytes) + wg_rows;
        rows_wait(&q_full[qb], (uint32_t)((use / kQBuffers) & 1), kHangQdo, qb, cta_abort);
        __syncwarp(); /* lanes leave the polling loop at different times: reconverge for the .aligned wgmma */

        if constexpr (kGproj && Shape::kPipelined) {
            /* gproj at HS 64: half h's DSK/PK GEMMs and half h + 1's S/dP GEMMs go to the tensor core as one commit
               group, and one wait at the top of the next half covers both, so the warpgroup does not sit through
               the tensor core's pipeline latency twice per half. Live across that wait: S, dP (64 registers), DSK,
               PK (64) and the A operands of DSK/PK (32). Stage s is released once the DSK/PK GEMMs of its tile's
               last half are done: at the top of the next tile's first half, or after the loop. */
            static_assert(kChunks == 1, "one 64-column chunk: the S/dP GEMMs are warpgroup_two_ss_64x64's");
            const int n_halves = n_key_tiles * kSubTiles;
            float sacc[kSRegs], dpacc[kSRegs];
            uint32_t pa[kKeySteps][4], dsa[kKeySteps][4];
            const int s0 = seq % kStages;
            rows_wait(&full[s0], (uint32_t)((seq / kStages) & 1), kHangKv, s0, cta_abort);
            __syncwarp();
            zero_accumulators(sacc, dpacc);
            wgmma_fence();
            warpgroup_two_ss_64x64_issue(sacc, dpacc, q_addr, smem_u32(k_s) + s0 * Plan::kTileBytes, do_addr,
                                         smem_u32(v_s) + s0 * Plan::kTileBytes);
            wgmma_commit();
            /* half hh; NEXT: S/dP of half hh + 1 join the commit group (every half but the last: a compile-time
               argument, since a branch around a wgmma between the fence and the commit makes ptxas inject a
               warpgroup.arrive) */
            auto half = [&](int hh, auto next) {
                constexpr bool kNext = decltype(next)::value;
                const int kt = hh / kSubTiles, sub = hh % kSubTiles, s = (seq + kt) % kStages;
                wgmma_wait<0>();
                reg_fences(sacc, dpacc, dsk, pk, dsa, pa); /* the results, and the A operands kept live until here */
                if (sub == 0 && kt > 0) /* tile kt - 1's GEMMs are done */
                    mbar_arrive(&empty[(seq + kt - 1) % kStages]);

                /* P, dS, the row sums and the A operands (the mask only where it can bite) */
                const bool tile_masked = !(kt < n_key_tiles - 1 && q0 + kBlockQ <= T);
                const int key0 = kt * kBlockK + sub * kSubKeys;
                if (tile_masked)
                    row_probs_packed<true>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, dsa, pa, key0, row0, t, T,
                                           c);
                else
                    row_probs_packed<false>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, dsa, pa, key0, row0, t, T,
                                            c);

                /* the next half's tile: the same stage, or the next tile's once it has landed */
                const int hn = hh + 1, kt_n = hn / kSubTiles, sub_n = hn % kSubTiles, s_n = (seq + kt_n) % kStages;
                if constexpr (kNext) {
                    if (sub_n == 0) {
                        rows_wait(&full[s_n], (uint32_t)(((seq + kt_n) / kStages) & 1), kHangKv, s_n, cta_abort);
                        __syncwarp();
                    }
                    zero_accumulators(sacc, dpacc);
                }
                reg_fences(dsa, pa);
                wgmma_fence();
                warpgroup_rs_k_issue<kDqRegs>(dsk, pk, dsa, pa,
                                              smem_u32(k_s + s * Plan::kTileBytes) + sub * Plan::kSliceBytes,
                                              Plan::kChunkBytes);
                if constexpr (kNext) {
                    const uint32_t half_n = s_n * Plan::kTileBytes + sub_n * Plan::kSliceBytes;
                    warpgroup_two_ss_64x64_issue(sacc, dpacc, q_addr, smem_u32(k_s) + half_n, do_addr,
                                                 smem_u32(v_s) + half_n);
                }
                wgmma_commit();
            };
#pragma unroll 1
            for (int hh = 0; hh < n_halves - 1; hh++) half(hh, std::true_type{});
            half(n_halves - 1, std::false_type{});
            wgmma_wait<0>();
            reg_fences(dsk, pk, dsa, pa);
            mbar_arrive(&empty[(seq + n_key_tiles - 1) % kStages]);
        } else {
            for (int kt = 0; kt < n_key_tiles; kt++) {
                const int s = (seq + kt) % kStages;
                rows_wait(&full[s], (uint32_t)(((seq + kt) / kStages) & 1), kHangKv, s, cta_abort);
                __syncwarp();
                const uint32_t k_addr = smem_u32(k_s + s * Plan::kTileBytes);
                const uint32_t v_addr = smem_u32(v_s + s * Plan::kTileBytes);

                /* the mask only where it can bite (the diagonal tile, or a query tile that reaches past T) */
                const bool tile_masked = !(kt < n_key_tiles - 1 && q0 + kBlockQ <= T);
#pragma unroll 1
                for (int sub = 0; sub < kSubTiles; sub++) {
                    const uint32_t k_half = k_addr + sub * Plan::kSliceBytes;
                    float sacc[kSRegs], dpacc[kSRegs];
                    if constexpr (kChunks == 1)
                        warpgroup_two_ss_64x64(sacc, dpacc, q_addr, k_half, do_addr, v_addr + sub * Plan::kSliceBytes);
                    else
                        warpgroup_scores(sacc, dpacc, q_addr, k_half, do_addr, v_addr + sub * Plan::kSliceBytes);

                    /* P, dS and the row sums (the mask only where it can bite); gproj: bf(dS), bf(P) packed as the A
                       operands of DSK += bf(dS) K, PK += bf(P) K */
                    const int key0 = kt * kBlockK + sub * kSubKeys;
                    if constexpr (kGproj) {
                        uint32_t pa[kKeySteps][4], dsa[kKeySteps][4];
                        if (tile_masked)
                            row_probs_packed<true>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, dsa, pa, key0,
                                                   row0, t, T, c);
                        else
                            row_probs_packed<false>(sacc, dpacc, row_m, row_rl, row_D, acc_a, acc_b, dsa, pa, key0,
                                                    row0, t, T, c);
                        warpgroup_rs_k<kDqRegs, (kChunks > 1)>(dsk, pk, dsa, pa, k_half, Plan::kChunkBytes);
                    } else if (tile_masked) {
                        row_sums_fp32<true>(sacc, dpacc, row_m, row_rl, acc_a, key0, row0, t, T, c);
                    } else {
                        row_sums_fp32<false>(sacc, dpacc, row_m, row_rl, acc_a, key0, row0, t, T, c);
                    }
                }
                mbar_arrive(&empty[s]); /* this thread no longer reads stage s */
            }
        }

        /* the item's head (kItemLoop: read again from item_of, live through the epilogue only, before the q_empty
           arrival below lets the producer rewrite the entry) */
        const int bh = Shape::kItemLoop ? item_of[qb].bh : first.bh;
        const int b = Shape::kItemLoop ? item_of[qb].b : first.b, h = Shape::kItemLoop ? item_of[qb].h : first.h;
        store_row_outputs<kGproj, HS>(acc_a, acc_b, dsk, pk, row_D, D, lambda, dqkv, bh, b, h, NH, T, row0, t, scale);

        /* A wait of this CTA that gave up (consumer or producer; the producer's give-up precedes an arrival on
           full that every consumer waited for) is visible to every consumer thread after this barrier. Then the
           CTA's outputs just written are overwritten with NaN (the same thread, the same addresses: program order
           makes NaN the final value; written after the values, not instead of them, so the 240-register path
           above keeps no extra register live: ptxas spilled with a select per store). */
        const bool gave_up = Shape::kItemLoop ? consumers_sync_any(*static_cast<volatile int*>(cta_abort) != 0)
                                              : (consumers_sync(), *static_cast<volatile int*>(cta_abort) != 0);
        if (gave_up) {
            const float kNan = __int_as_float(0x7FC00000); /* a quiet NaN */
            const long long qkv_row = 3LL * NH * HS;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int query = row0 + 8 * r;
                if (query >= T) continue;
                const long long idx = (long long)bh * T + query;
                if (t == 0) {
                    if (kGproj) lambda[idx] = kNan;
                    else D[idx] = kNan;
                }
                if (kGproj) {
                    bf16* dq_row = dqkv + ((long long)b * T + query) * qkv_row + (long long)h * HS + 2 * t;
#pragma unroll
                    for (int n = 0; n < HS / 8; n++) *reinterpret_cast<uint32_t*>(dq_row + 8 * n) = kBf16NanPair;
                }
            }
        }
        if constexpr (!Shape::kItemLoop) return;
        mbar_arrive(&q_empty[qb]); /* this thread no longer reads the item's Q, dO buffer or its item_of entry */
        if (gave_up) break;        /* the producer traps once it sees the give-up (rows_produce_items) */
        seq += n_key_tiles;
    }
}

/* The row pass's entry point (one per head size and mode). */
template <int HS, int MODE>
__global__ void __launch_bounds__(RowsShape<HS>::kThreads, 1)
    rows_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                const bf16* __restrict__ out, const bf16* __restrict__ dout, const float* __restrict__ stats,
                float* __restrict__ D, float* __restrict__ lambda, bf16* __restrict__ dqkv, int NH, int T,
                float scale, float c, int section, int heads) {
    __shared__ int cta_abort; /* set by a bounded wait that gave up (rows_wait) */
    rows_pass<HS, MODE>(qkv_map, dout_map, out, dout, stats, D, lambda, dqkv, NH, T, scale, c, section, heads,
                        &cta_abort);
}

/* ---- host ---- */

/* One launch on the call's tensors: the qkv / dout maps (boxes of kBlockK rows), the grid (query tiles, B*NH; with
   kItemLoop hopper_item_grid's: one CTA per SM over the queue, or with ATTN_BWD_PERSISTENT=0 one per item) and the
   PDL launch after the previous kernel of the chain. */
template <int HS, int MODE>
void rows_launch(const HopperBwdCall& c) {
    constexpr int kAlloc = RowsShape<HS>::Plan::kAlloc;
    const AttnShape s = c.s;
    const char* const who = HS == 64 ? "attention (Hopper row pass, HS 64)" : "attention (Hopper row pass, HS 128)";
    const HeadMaps maps = encode_qkv_dout_maps(s, c.qkv, c.dout, kBlockK, who);
    cudaCheck(cudaFuncSetAttribute(rows_kernel<HS, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kAlloc));
    const int q_tiles = ceil_div(s.T, kBlockQ);
    const dim3 grid = RowsShape<HS>::kItemLoop
                          ? dim3(hopper_item_grid((long long)q_tiles * s.B * s.NH,
                                                  hopper_env_switch("ATTN_BWD_PERSISTENT", 1), who))
                          : dim3((unsigned)q_tiles, (unsigned)(s.B * s.NH));
    /* gproj at HS 64 takes its own, smaller sections (tile_order.cuh) */
    const int section = (MODE == ATTN_GPROJ && HS == 64) ? attn_tile_section_gproj_hs64(s)
                                                         : attn_tile_section(s, kTileSectionKV);
    launch_after_previous_grid(1, rows_kernel<HS, MODE>, grid, dim3(RowsShape<HS>::kThreads), kAlloc, c.stream,
                               maps.qkv, maps.dout, c.out, c.dout, c.stats, c.D, c.lambda, c.dqkv, s.NH, s.T,
                               attn_softmax_scale(HS), attn_exp2_scale(HS), section, s.B * s.NH);
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_ROWS_CUH */
