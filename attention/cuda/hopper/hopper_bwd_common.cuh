/*
 * attention/cuda/hopper/hopper_bwd_common.cuh - device pieces shared by the Hopper (sm_90a) key-major backward passes
 * (kernel_keys64.cuh at HS 64, kernel_keys128.cuh at HS 128, every mode) that are not a mode's numerics (those are
 * mode_numerics.cuh's, included here): the bounded mbarrier wait that GIVES UP instead of trapping, the score and
 * dK/dV GEMM steps of the HS-128 key-major CTA, the staging of bf(dS) for the dQ GEMM (stage_ds_words,
 * stage_ds_all), gproj's dV/dK batch, the producer warp's steps (K/V once, a stage's Q/dO loads), the dK/dV
 * epilogue (NaN rows after a give-up), and where a CTA's dQ partials go (keymajor_dq_head: its head, or its key
 * block's slice in the deterministic backward).
 *
 * Why: a kernel with setmaxnreg cannot trap on its consumer path (ptxas then ignores setmaxnreg.inc: spills and
 * serialised wgmmas; docs/attention_kernels.md, "Hangs"), so its waits give up, record the barrier and let the
 * kernel end with poisoned outputs instead (attention_hopper_bwd128.cu's file comment); the producer and
 * epilogue steps are the same at both head sizes. Needs attention/cuda/hopper/hopper_wgmma.cuh; everything is in
 * the including file's anonymous namespace (one kernel file = one translation unit, each with its own
 * __device__ record pointer).
 */
#ifndef ATTENTION_HOPPER_BWD_COMMON_CUH
#define ATTENTION_HOPPER_BWD_COMMON_CUH

#include <stdint.h>
#include "attention/attention.h"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_lab_hooks.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_work_queue.cuh"
#include "attention/cuda/hopper/mode_numerics.cuh"
#include "attention/cuda/mma_bf16.cuh"
#include "attention/cuda/tile_order.cuh"

namespace {

/* Fills a host-mapped hang record: the barrier's index and parity, this thread's block and thread, then (after a
   system fence, so a host that sees the site sees the rest) the site. */
__device__ __forceinline__ void write_hang_record(volatile AttnHopperHang* rec, int site, int index, uint32_t parity) {
    rec->index = index;
    rec->parity = (int)parity;
    rec->block_x = (int)blockIdx.x;
    rec->block_y = (int)blockIdx.y;
    rec->thread = (int)threadIdx.x;
    __threadfence_system();
    rec->site = site;
    __threadfence_system();
}

/* Polls `bar` for phase `parity`. After HANG_CYCLES clock cycles (or at once, once the CTA gave up) it sets
   *cta_abort (shared memory: every later wait of the CTA returns at once), records the first give-up of the
   grid in *record (host-mapped AttnHopperHang; the kernel file's __device__ pointer, NULL: no record) and
   returns as if the phase had completed: the caller must poison its outputs when *cta_abort is set. No
   printf: a function call anywhere in the kernel makes ptxas serialise every wgmma (C7510). */
template <long long HANG_CYCLES>
__device__ __forceinline__ void mbar_wait_give_up(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort, AttnHopperHang* const& record) {
    const uint32_t addr = hopper_wgmma::smem_u32(bar);
    uint32_t done = 0;
    const long long start = clock64();
    while (!done) {
        done = hopper_wgmma::mbar_try_wait(addr, parity);
        if (!done && (*cta_abort != 0 || clock64() - start > HANG_CYCLES)) {
            if (*cta_abort == 0) {
                *cta_abort = 1;
                volatile AttnHopperHang* rec = record;
                if (rec != NULL && rec->site == ATTN_HANG_NONE) write_hang_record(rec, site, index, parity);
            }
            break;
        }
    }
}

/* A producer warp after a wait of a CTA that may give up: true in every lane (the warp agrees, so it leaves its
   loop as one) once the CTA gave up. */
__device__ __forceinline__ bool producer_warp_saw_give_up(const int* cta_abort) {
    return __any_sync(0xffffffffu, *static_cast<const volatile int*>(cta_abort) != 0);
}

/* ---- the GEMM steps of the HS-128 key-major CTA, per consumer warpgroup (attention_hopper_bwd128.cu and
   attention_hopper_bwd128_gproj.cu).
   K and V are tiles of 128 keys and Q and dO tiles of 64 queries, each two 64-column chunks [rows][128 bytes],
   128B-swizzled and 1024-byte aligned, column chunk c at c * rows * 128 bytes (a static_assert in the kernel
   ties its SmemPlan to these strides). ---- */
constexpr int kKeymajor128HS = 128;
constexpr int kKeymajor128ChunkCols = 64;                       /* BF16 columns per 128-byte swizzle row */
constexpr int kKeymajor128KeyChunkBytes = 128 * 128;            /* 128 keys x 64 columns */
constexpr int kKeymajor128QChunkBytes = 64 * 128;               /* 64 queries x 64 columns */
constexpr int kKeymajor128QSteps = 64 / 16;                     /* k-steps over a Q/dO tile's 64 queries */

/* acc = A B^T issued (64 x 64 over HS/16 = 8 k-steps; the caller zeroes, fences, commits and waits): A the
   warpgroup's 64 rows of the K or V tile (chunks kKeymajor128KeyChunkBytes apart), B the stage's Q or dO tile
   (chunks kKeymajor128QChunkBytes apart), both K-major; k-step kk reads bytes 32 (kk % 4) of the 128-byte rows
   of column chunk kk / 4 (attention_hopper_bwd128.cu's assumption (a)). */
__device__ __forceinline__ void keymajor128_ss_issue(float (&acc)[32], uint32_t a_addr, uint32_t b_addr) {
    using namespace hopper_wgmma;
    constexpr int kWgmmaK = 16;
    constexpr int kKStepsPerChunk = kKeymajor128ChunkCols / kWgmmaK; /* 4 k-steps of 32 bytes per 128-byte row */
    constexpr uint32_t kUnusedLbo = 16; /* K-major swizzled operands ignore LBO */
    constexpr int kSwizzleAtomBytes = 8 * 128;
#pragma unroll
    for (int kk = 0; kk < kKeymajor128HS / kWgmmaK; kk++) {
        const uint32_t col = (kk % kKStepsPerChunk) * kWgmmaK * (int)sizeof(bf16);
        const uint32_t chunk = kk / kKStepsPerChunk;
        const uint64_t desc_a = make_smem_desc(a_addr + chunk * kKeymajor128KeyChunkBytes + col, kUnusedLbo,
                                               kSwizzleAtomBytes);
        const uint64_t desc_b = make_smem_desc(b_addr + chunk * kKeymajor128QChunkBytes + col, kUnusedLbo,
                                               kSwizzleAtomBytes);
        wgmma_m64n64k16_ss(acc, desc_a, desc_b);
    }
}

/* S^T = K_w Q^T and dP^T = V_w dO^T (64 keys x 64 queries each) as one commit group, waited for
   (hopper_wgmma.cuh's warpgroup_two_ss_64x64 at HS 128). kw_addr, vw_addr: the warpgroup's first row in chunk
   0 of the K/V tile; q_addr, do_addr: the stage's tiles. Written, not accumulated. */
__device__ __forceinline__ void keymajor128_scores(float (&st)[32], float (&dpt)[32], uint32_t kw_addr,
                                                   uint32_t vw_addr, uint32_t q_addr, uint32_t do_addr) {
    using namespace hopper_wgmma;
    two_gemms_written(st, dpt, [&] {
        keymajor128_ss_issue(st, kw_addr, q_addr);
        keymajor128_ss_issue(dpt, vw_addr, do_addr);
    });
}

/* acc[64 x 128] += A[64 x 64] B[64 x 128] (dV += bf(P)^T dO, dK += bf(dS)^T Q): A from registers (4 k-steps
   over the tile's 64 queries), B the stage's Q or dO tile read N-major (rows = queries, 16 rows = 2048 bytes
   per k-step; the second 64-column block of N is one 8 KB chunk further: LBO = kKeymajor128QChunkBytes,
   attention_hopper_bwd128.cu's assumption (b)). Issued only. */
__device__ __forceinline__ void keymajor128_rs_issue(float (&acc)[kKeymajor128HS / 2],
                                                     const uint32_t (&a)[kKeymajor128QSteps][4], uint32_t b_addr) {
    using namespace hopper_wgmma;
    constexpr int kWgmmaK = 16;
    constexpr int kSwizzleRowBytes = 128;
#pragma unroll
    for (int kk = 0; kk < kKeymajor128QSteps; kk++)
        wgmma_m64n128k16_rs(acc, a[kk], make_smem_desc(b_addr + kk * kWgmmaK * kSwizzleRowBytes,
                                                       kKeymajor128QChunkBytes, 8 * kSwizzleRowBytes));
}

/* One k-step of bf(dS^T)'s packed A words (pack_acc_a_operand's layout: word w[i] holds key key + 8 (i & 1) and
   queries q, q + 1, q = 16 kk + 8 (i >> 1) + 2t, the low half q) to a staged tile [query][key] of PITCH BF16 per
   row: the A operand of dQ = dS K, read back by load_staged_a_operand. key: the thread's key row within the
   tile's keys. Ordinary register reads, done before the wgmma that reads the words as its A operand is issued
   (PTX leaves reading the A registers of an in-flight wgmma undefined). */
template <int PITCH>
__device__ __forceinline__ void stage_ds_words(hopper_wgmma::bf16* tile, const uint32_t (&w)[4], int kk, int key,
                                               int t) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int k = key + 8 * (i & 1);
        const int q = 16 * kk + 8 * (i >> 1) + 2 * t;
        tile[q * PITCH + k] = __ushort_as_bfloat16((unsigned short)(w[i] & 0xFFFFu));
        tile[(q + 1) * PITCH + k] = __ushort_as_bfloat16((unsigned short)(w[i] >> 16));
    }
}

/* fp32's k-step kk of a 64-query tile (both head sizes): P and dS (keymajor_probs_step, fp32's arm), their A words
   bf(P), bf(P - bf(P)) (pa, pa_lo) and bf(dS), bf(r1) (pds, pds_lo), and the three dS terms bf(dS), bf(r1),
   bf(r1 - bf(r1)) staged to the tiles at ds_tiles, TERM_ELEMS BF16 apart (stage_ds_words; key: the thread's key
   row within the tiles). */
template <int PITCH, int TERM_ELEMS, bool MAY_MASK>
__device__ __forceinline__ void keymajor_fp32_split_step(float (&st)[32], float (&dpt)[32], const float4* rs, int kk,
                                                         int q0, int t, int key0, int T, bool masked, float c,
                                                         uint32_t (&pa)[4], uint32_t (&pa_lo)[4], uint32_t (&pds)[4],
                                                         uint32_t (&pds_lo)[4], hopper_wgmma::bf16* ds_tiles,
                                                         int key) {
    keymajor_probs_step<ATTN_FP32, MAY_MASK>(st, dpt, rs, kk, q0, t, key0, T, masked, c);
    uint32_t unused[4], x2[4];
    pack_split_step<false>(pa, pa_lo, unused, st, kk);
    pack_split_step<true>(pds, pds_lo, x2, dpt, kk);
    stage_ds_words<PITCH>(ds_tiles, pds, kk, key, t);
    stage_ds_words<PITCH>(ds_tiles + TERM_ELEMS, pds_lo, kk, key, t);
    stage_ds_words<PITCH>(ds_tiles + 2 * TERM_ELEMS, x2, kk, key, t);
}

/* All KSTEPS k-steps of stage_ds_words. */
template <int PITCH, int KSTEPS>
__device__ __forceinline__ void stage_ds_all(hopper_wgmma::bf16* tile, const uint32_t (&w)[KSTEPS][4], int key,
                                             int t) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) stage_ds_words<PITCH>(tile, w[kk], kk, key, t);
}

/* gproj's dV/dK batch of one query tile (both head sizes): dV += bf(P)^T dO; dK += bf(dS)^T Q, then
   dK += bf(-lambda P)^T Q, one commit group of 12 wgmmas (the two dK ones chained on the same accumulator:
   wgmma orders same-accumulator operations), fenced and waited for; the A registers stay live until it is
   done. HS 64: m64n64k16 (hopper_wgmma.cuh's warpgroup_rs_issue_n64, the stage's 64-row tiles); HS 128:
   keymajor128_rs_issue. q_addr, do_addr: the stage's Q and dO tiles. */
template <int HS>
__device__ __forceinline__ void keymajor_gproj_dkv_batch(float (&dv)[HS / 2], float (&dk)[HS / 2],
                                                         uint32_t (&pa)[kKeymajor128QSteps][4],
                                                         uint32_t (&pds)[kKeymajor128QSteps][4],
                                                         uint32_t (&plam)[kKeymajor128QSteps][4], uint32_t q_addr,
                                                         uint32_t do_addr) {
    using namespace hopper_wgmma;
    static_assert(HS == 64 || HS == kKeymajor128HS, "the key-major passes' head sizes");
    static_assert(kKeymajor128QSteps == kTileKSteps, "4 k-steps over a 64-query tile at both head sizes");
    reg_fences(pa, pds, plam, dv, dk);
    wgmma_fence();
    if constexpr (HS == 64) {
        warpgroup_rs_issue_n64(dv, pa, do_addr);
        warpgroup_rs_issue_n64(dk, pds, q_addr);
        warpgroup_rs_issue_n64(dk, plam, q_addr);
    } else {
        keymajor128_rs_issue(dv, pa, do_addr);
        keymajor128_rs_issue(dk, pds, q_addr);
        keymajor128_rs_issue(dk, plam, q_addr);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fences(dv, dk, pa, pds, plam);
}

/* ---- the producer warp of the key-major CTA (all four key-major kernels, HS 64 and 128): a CTA of 128 keys
   loads K and V once and then one stage of 64 queries of Q and dO per step, with the row state of those
   queries. Every tile is CHUNKS = HS / 64 column chunks of [rows][128 bytes] (128B-swizzled), chunk c at c *
   rows * 128 bytes; each kernel's SmemPlan is tied to these strides by a static_assert. qkv [B, T, 3, NH, HS]
   through a 4-D map {column, slot * NH + head, token, batch}, dout [B, T, NH, HS] through {column, head, token,
   batch} (hopper_wgmma.cuh's tma_load_4d). ---- */
enum { kKeymajorSlotQ = 0, kKeymajorSlotK = 1, kKeymajorSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
template <int CHUNKS>
struct KeymajorTiles {
    static constexpr int kBlockK = 128, kBlockQ = 64, kBoxRows = 64, kRowBytes = 128, kChunkCols = 64;
    static constexpr int kBoxBytes = kBoxRows * kRowBytes;             /* one 64-row TMA box of a chunk */
    static constexpr int kKeyChunkBytes = kBlockK * kRowBytes;
    static constexpr int kKeyTileBytes = CHUNKS * kKeyChunkBytes;
    static constexpr int kQChunkBytes = kBlockQ * kRowBytes;
    static constexpr int kQTileBytes = CHUNKS * kQChunkBytes;
};

/* Lane 0's load of the CTA's K and V tiles (keys k0 .. k0 + 127) onto kv_full, which it arrives on with their
   bytes. A 64-key half that starts at or past T (the last key tile) loads the first half's rows again instead
   of a box wholly out of bounds: its keys are all masked (dS = 0), and finite data keeps 0 * K = 0 in dQ
   (uninitialised shared memory could hold NaN patterns). */
template <int CHUNKS>
__device__ __forceinline__ void keymajor_load_kv(unsigned char* k_s, unsigned char* v_s, const CUtensorMap* qkv_map,
                                                 uint64_t* kv_full, int k0, int T, int h, int NH, int b) {
    using Tiles = KeymajorTiles<CHUNKS>;
    hopper_wgmma::mbar_arrive_expect_tx(kv_full, 2 * Tiles::kKeyTileBytes);
    for (int half = 0; half < Tiles::kBlockK / Tiles::kBoxRows; half++) {
        const int row = (k0 + half * Tiles::kBoxRows < T) ? k0 + half * Tiles::kBoxRows : k0;
        for (int ch = 0; ch < CHUNKS; ch++) {
            const int dst = ch * Tiles::kKeyChunkBytes + half * Tiles::kBoxBytes;
            hopper_wgmma::tma_load_4d(k_s + dst, qkv_map, kv_full, ch * Tiles::kChunkCols, kKeymajorSlotK * NH + h,
                                      row, b);
            hopper_wgmma::tma_load_4d(v_s + dst, qkv_map, kv_full, ch * Tiles::kChunkCols, kKeymajorSlotV * NH + h,
                                      row, b);
        }
    }
}

/* The producer lane's arrival on a stage's full barrier: lane 0's also announces the Q and dO tiles' bytes and
   issues their loads (queries q0 .. q0 + 63 into q_stage, do_stage); the phase needs all 32 lanes' arrivals
   (each releases its row-state writes) and the bytes. */
template <int CHUNKS>
__device__ __forceinline__ void keymajor_fill_stage(unsigned char* q_stage, unsigned char* do_stage,
                                                    const CUtensorMap* qkv_map, const CUtensorMap* dout_map,
                                                    uint64_t* full_s, int q0, int h, int NH, int b, int lane) {
    using Tiles = KeymajorTiles<CHUNKS>;
    if (lane == 0) {
        hopper_wgmma::mbar_arrive_expect_tx(full_s, 2 * Tiles::kQTileBytes);
        for (int ch = 0; ch < CHUNKS; ch++) {
            const int dst = ch * Tiles::kQChunkBytes;
            hopper_wgmma::tma_load_4d(q_stage + dst, qkv_map, full_s, ch * Tiles::kChunkCols, kKeymajorSlotQ * NH + h,
                                      q0, b);
            hopper_wgmma::tma_load_4d(do_stage + dst, dout_map, full_s, ch * Tiles::kChunkCols, h, q0, b);
        }
    } else {
        hopper_wgmma::mbar_arrive(full_s);
    }
}

/* The last TMA coordinate of dq_acc (encode_dq_acc_map) that a key-major CTA adds its dQ partials at: its head
   bh, or, with DQ_SLICES (the deterministic backward: one accumulator slice per key block, [slices][B*NH][T][HS]),
   head bh of slice `rank` (the CTA's key block, tile_order.cuh; heads = B*NH). */
template <bool DQ_SLICES>
__device__ __forceinline__ int keymajor_dq_head(AttnTileOrder order, int heads) {
    return DQ_SLICES ? order.bh + order.rank * heads : order.bh;
}

constexpr uint32_t kBf16NanPair = 0x7FC07FC0u; /* two BF16 quiet NaNs: what a give-up writes over its outputs */

/* The key-major epilogue of every key-major kernel (bf16/repair and gproj, HS 64 and 128): dK = bf(scale acc),
   dV = bf(acc) for this thread's keys (rows key0 and key0 + 8 of the k and v slots of dqkv [B, T, 3, NH, HS];
   columns 8n + 2t + e from registers 4n + 2r + e, hopper_wgmma.cuh's fragment layout); keys past T write
   nothing. gave_up (the CTA gave up a wait, mbar_wait_give_up): two BF16 quiet NaNs in every element of both
   rows instead, so a hang fails loudly; a kernel whose waits trap passes false. */
template <int HS>
__device__ __forceinline__ void keymajor_store_dkv(const float (&dk)[HS / 2], const float (&dv)[HS / 2],
                                                   hopper_wgmma::bf16* dqkv, int b, int h, int NH, int T, int key0,
                                                   int t, float scale, bool gave_up) {
    using hopper_wgmma::bf16;
    using hopper_wgmma::pack_bf16x2;
    const long long qkv_row = 3LL * NH * HS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= T) continue;
        bf16* dk_row = dqkv + ((long long)b * T + key) * qkv_row + (long long)NH * HS + (long long)h * HS;
        bf16* dv_row = dk_row + (long long)NH * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            *reinterpret_cast<uint32_t*>(dk_row + 8 * n + 2 * t) =
                gave_up ? kBf16NanPair : pack_bf16x2(dk[4 * n + 2 * r] * scale, dk[4 * n + 2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dv_row + 8 * n + 2 * t) =
                gave_up ? kBf16NanPair : pack_bf16x2(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
        }
    }
}

/* ---- the key-major passes over work items (kernel_keys64.cuh) ---- */

/* A key-major work item: keys k0 .. k0 + 127 of head bh = b * NH + h, the query tiles of BLOCK_Q rows that reach
   them (qt_begin .. qt_begin + n_q_tiles - 1: from the first that reaches key k0 to the last before T), and where
   their dQ partials go (dq_head, keymajor_dq_head's). An item of no query tiles ends a CTA's items. */
struct KeymajorItem {
    int k0, bh, b, h, dq_head, qt_begin, n_q_tiles;
};
constexpr int kKeymajorBlockK = 128; /* keys per item */
template <int BLOCK_Q>
__device__ __forceinline__ KeymajorItem keymajor_item(AttnTileOrder order, int dq_head, int NH, int T) {
    KeymajorItem it;
    it.k0 = order.rank * kKeymajorBlockK;
    it.bh = order.bh;
    it.b = order.bh / NH;
    it.h = order.bh % NH;
    it.dq_head = dq_head;
    it.qt_begin = it.k0 / BLOCK_Q; /* the first query tile that reaches key k0 */
    it.n_q_tiles = (T + BLOCK_Q - 1) / BLOCK_Q - it.qt_begin;
    return it;
}

/* Item w of a launch over n_key_blocks x heads items, in the longest-first order of tile_order.cuh (sections of
   `section` heads; key block 0, which every query reaches, first); with DQ_SLICES its dQ goes to its key block's
   slice (keymajor_dq_head, over `heads` = B * NH). */
template <bool DQ_SLICES, int BLOCK_Q>
__device__ __forceinline__ KeymajorItem keymajor_queue_item(unsigned w, int n_key_blocks, int heads, int section,
                                                            int NH, int T) {
    const AttnTileOrder order = attn_tile_rank_head(w, n_key_blocks, heads, section);
    return keymajor_item<BLOCK_Q>(order, keymajor_dq_head<DQ_SLICES>(order, heads), NH, T);
}

/* The persistent launch's queue of work items (hopper_work_queue.cuh), one per translation unit: the passes of one
   unit run one at a time on a stream. A variable template, so that only the units whose passes run items define
   it (in the others an unused global would still move the addresses of their own globals in the machine code). */
template <int UNIT = 0>
__device__ HopperWorkQueue g_keymajor_queue;

/* The producer warp of a persistent CTA that gave up a wait: NaN over the dK and dV rows of item `it` (its keys
   before T; lane l the keys k0 + l, k0 + l + 32, ...), so that an item the CTA took and will not finish keeps no
   stale gradient (keymajor_store_dkv writes the same NaNs from the consumers). dqkv is 16-byte aligned
   (attention_cuda_check_shape) and a row of HS BF16 a multiple of 16 bytes. */
template <int HS>
__device__ __forceinline__ void keymajor_poison_item(hopper_wgmma::bf16* dqkv, const KeymajorItem& it, int NH, int T,
                                                     int lane) {
    const uint4 nan8 = make_uint4(kBf16NanPair, kBf16NanPair, kBf16NanPair, kBf16NanPair);
    for (int key = it.k0 + lane; key < it.k0 + kKeymajorBlockK && key < T; key += 32) {
        uint4* dk_row = reinterpret_cast<uint4*>(dqkv + ((long long)it.b * T + key) * 3LL * NH * HS +
                                                 (long long)(NH + it.h) * HS);
        uint4* dv_row = dk_row + (long long)NH * HS / 8;
#pragma unroll
        for (int i = 0; i < HS / 8; i++) dk_row[i] = dv_row[i] = nan8;
    }
}

/* The slot of K/V buffer kb (0 or 1). The pass declares two shared variables, not an array: an array of two
   compiles to other machine code in gproj and fp32 than the one measured (keymajor_kv_buffers_2026-12-05.md). */
template <int KV_BUFFERS>
__device__ __forceinline__ KeymajorItem* keymajor_slot(int kb, KeymajorItem* slot0, KeymajorItem* slot1) {
    static_assert(KV_BUFFERS == 1 || KV_BUFFERS == 2, "one or two K/V buffers");
    if constexpr (KV_BUFFERS == 1)
        return slot0;
    else
        return kb == 0 ? slot0 : slot1;
}

/* The producer warp of a key-major CTA that runs work items (every lane; lane 0 issues the copies): the CTA's
   items one after another, the first from the grid position and, when the launch has fewer CTAs than items (a
   persistent launch), each next one from g_keymajor_queue once the previous item's stages are all issued. For each
   item it fills the item's stages in the ring of STAGES that runs on over the CTA's items (step seq takes stage seq
   % STAGES; fill(s, q0, bh, h, b): the stage's row state and its Q/dO loads, every lane's arrival on full[s]).
   Item u's K and V go to buffer u % KV_BUFFERS: once the buffer's previous item released it (kv_empty[buffer]), the
   producer writes the item to the buffer's slot (slot0, slot1: keymajor_slot) and loads its K and V
   (load_kv(buffer, k0, h, b), lane 0, completing kv_full[buffer]'s phase). With one buffer that comes after the
   item's first stages (they free up in the previous item's last steps; K and V only after its last one); with two,
   first (the buffer's previous item ended before the item just before began), so the item's K and V land while the
   consumers finish the item before. Once no item is left, an item of no query tiles with a plain kv_full arrival
   ends the consumers' loop. The item it fills stages for lives in shared memory (taken_slot), not in registers: a
   producer warpgroup has 24-40 of them, and a stage's row state needs most of those. wait(bar, parity, site,
   index): the pass's wait, which gives up. After a give-up the producer issues nothing more: with TRAPS it traps
   (the launch ends with an error and leaves no copy in flight into shared memory that the SM hands on); else it
   writes NaN over the items it took that the consumers may not run and over every item left in the queue
   (keymajor_poison_item), so that no item keeps a stale gradient. */
template <int HS, int BLOCK_Q, int STAGES, int KV_BUFFERS, bool DQ_SLICES, bool TRAPS, class Wait, class Fill,
          class LoadKv>
__device__ __forceinline__ void keymajor_produce_items(int NH, int T, int section, int heads, uint64_t* kv_full,
                                                       uint64_t* empty, uint64_t* kv_empty, KeymajorItem* slot0,
                                                       KeymajorItem* slot1, KeymajorItem* taken_slot,
                                                       hopper_wgmma::bf16* dqkv, int* cta_abort, int lane,
                                                       Wait wait, Fill fill, LoadKv load_kv) {
    const int n_key_blocks = (T + kKeymajorBlockK - 1) / kKeymajorBlockK;
    const unsigned n_items = (unsigned)n_key_blocks * (unsigned)heads; /* < 2^32: attention_cuda_check_shape */
    const bool queued = gridDim.x < n_items;
    volatile KeymajorItem* const taken = taken_slot;
    int seq = 0; /* the CTA's steps before this item */
    for (int use = 0;; use++) {
        unsigned w = blockIdx.x;
        if (use > 0) {
            unsigned next = n_items;
            if (queued && lane == 0) next = work_queue_next(&g_keymajor_queue<>, n_items);
            w = __shfl_sync(0xffffffffu, next, 0);
        }
        if (lane == 0) {
            const KeymajorItem it =
                keymajor_queue_item<DQ_SLICES, BLOCK_Q>(w < n_items ? w : 0u, n_key_blocks, heads, section, NH, T);
            taken->k0 = it.k0, taken->bh = it.bh, taken->b = it.b, taken->h = it.h;
            taken->dq_head = it.dq_head, taken->qt_begin = it.qt_begin;
            taken->n_q_tiles = w < n_items ? it.n_q_tiles : 0;
        }
        __syncwarp();
        const int n_q_tiles = taken->n_q_tiles;
        const int kvb = use % KV_BUFFERS;
        const int kv_at = (use == 0 || KV_BUFFERS > 1) ? 0 : min(STAGES, n_q_tiles); /* when its K and V load */
        bool gave_up = false;
        for (int i = 0;; i++) {
            if (i == kv_at) {
                if (use >= KV_BUFFERS) { /* the consumers released the buffer's last item's K and V and slot */
                    wait(&kv_empty[kvb], (uint32_t)((use / KV_BUFFERS - 1) & 1), ATTN_HANG_KV_EMPTY, kvb);
                    if ((gave_up = producer_warp_saw_give_up(cta_abort))) break;
                }
                if (lane == 0) {
                    /* visible to the consumers through the kv_full phase that the arrival below completes */
                    KeymajorItem* const slot = keymajor_slot<KV_BUFFERS>(kvb, slot0, slot1);
                    slot->k0 = taken->k0, slot->bh = taken->bh, slot->b = taken->b;
                    slot->h = taken->h, slot->dq_head = taken->dq_head;
                    slot->qt_begin = taken->qt_begin, slot->n_q_tiles = n_q_tiles;
                    if (n_q_tiles > 0)
                        load_kv(kvb, taken->k0, taken->h, taken->b);
                    else
                        hopper_wgmma::mbar_arrive(&kv_full[kvb]);
                }
            }
            if (i == n_q_tiles) break;
            const int sq = seq + i, s = sq % STAGES;
            /* stage s is free once the consumers released step sq - STAGES (phase sq / STAGES - 1) */
            if (sq >= STAGES) {
                wait(&empty[s], (uint32_t)((sq / STAGES - 1) & 1), ATTN_HANG_EMPTY, s);
                if ((gave_up = producer_warp_saw_give_up(cta_abort))) break;
            }
            fill(s, (taken->qt_begin + i) * BLOCK_Q, taken->bh, taken->h, taken->b);
        }
        if (gave_up) {
            if constexpr (TRAPS) __trap(); /* the launch ends with an error, no copy left in flight */
            /* NaN over the items last written to the slots (the first item's is written before any wait; a slot
               not written yet holds no query tiles) and over the item taken, whether handed over or not; then over
               every item left */
            __syncwarp(); /* lane 0's writes of the slots */
            keymajor_poison_item<HS>(dqkv, *slot0, NH, T, lane);
            if (KV_BUFFERS > 1 && slot1->n_q_tiles > 0) keymajor_poison_item<HS>(dqkv, *slot1, NH, T, lane);
            if (n_q_tiles > 0) keymajor_poison_item<HS>(dqkv, *taken_slot, NH, T, lane);
            for (unsigned next = 0; queued;) {
                if (lane == 0) next = work_queue_next(&g_keymajor_queue<>, n_items);
                next = __shfl_sync(0xffffffffu, next, 0);
                if (next >= n_items) break;
                const KeymajorItem left =
                    keymajor_queue_item<DQ_SLICES, BLOCK_Q>(next, n_key_blocks, heads, section, NH, T);
                keymajor_poison_item<HS>(dqkv, left, NH, T, lane);
            }
            break;
        }
        if (n_q_tiles == 0) break;
        seq += n_q_tiles;
    }
    if (queued && lane == 0) work_queue_finish(&g_keymajor_queue<>);
}

}  // namespace

#endif /* ATTENTION_HOPPER_BWD_COMMON_CUH */
