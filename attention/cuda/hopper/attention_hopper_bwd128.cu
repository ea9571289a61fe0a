/*
 * attention/cuda/hopper/attention_hopper_bwd128.cu - the Hopper (sm_90a) key-major causal attention backward of bf16 and
 * repair modes at head size 128 (dK, dV and the dQ reduce-adds) on wgmma + TMA, with setmaxnreg. The API and
 * which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (attention_backward_hopper_keys dispatches here
 * on HS 128; the HS-64 kernel is attention_hopper_bwd.cu).
 *
 * Why: at HS 128 the portable mma.sync key-major kernel (attention/cuda/attention_cuda.cu: attn_bwd_kernel) takes
 * most of the attention time on the H200 (at B2 H16 T4096 d128 the bulk of the portable fwd+bwd), and HS 64's
 * kernel does not stretch (one warpgroup's dK, dV
 * accumulators alone would be 128 registers next to S^T, dP^T and the dQ partial). With this kernel the whole
 * backward (prep + this kernel + dQ post-pass) is 1.40x faster than mma.sync at B8 H8 T1024 d128 and 1.69x at
 * B2 H16 T4096 d128 (dev/results/attention_hopper_2026-11-29.md; within 4 BF16 ulps of the portable
 * backward). The dQ partials go out by TMA reduce-add (1.10-1.12x faster than red.global atomics at HS 64),
 * and the CTAs take their key tiles longest first over all heads (attention/cuda/tile_order.cuh).
 * dev/attention_lab/hopper_bwd128.cu is the harness that checks and times it.
 *
 * What it computes (docs/attention_numerics.md; attn_bwd_kernel's rounding points, operation for operation,
 * as attention_hopper_bwd.cu): P = exp2(fma(S, c, -fl(LSE log2 e))) (bf16) or exp2((S - m) c) * fl(1/l)
 * (repair), dS = P (dP - D) (masked entries exactly 0), dV += bf(P)^T dO, dK += bf(dS)^T Q, dQ_acc += bf(dS) K
 * in FP32; dK = bf(s acc), dV = bf(acc) into dqkv. The workspace contract is production's: the portable prep
 * kernel (attn_bwd_prep_kernel) wrote D and zeroed dq_acc [B*NH*T][128]; this kernel adds s-less dQ partials
 * (one per 128 keys, as the portable kernel's); the portable post-pass (attn_bwd_dq_kernel) writes
 * dQ = bf(s acc). Only the FP32 summation order differs from the portable kernel. DQ_SLICES (the deterministic
 * backward, docs/determinism.md): the partials go to the key block's own zeroed slice, one add per element
 * (warpgroup w owns dQ columns 64w..64w+63), and the sliced post-pass sums the slices in key-block order.
 *
 * Layout (FlashAttention-3's for d128 on sm_90, read in Dao-AILab/flash-attention hopper/; no code copied):
 * one CTA = 128 keys of one (b, h), 384 threads: two consumer warpgroups of 64 keys each and a producer
 * warpgroup (one warp issues TMA and writes the row state {row_a, row_b, D}; setmaxnreg 24 there, 240 in the
 * consumers: 128 * 24 + 256 * 240 = 384 * 168). Q/dO tiles of 64 queries in a 2-stage pipeline (full: 32
 * producer lanes + TMA bytes; empty: the 256 consumer threads). Per step and consumer warpgroup:
 *   S^T = K_w Q^T, dP^T = V_w dO^T       m64n64k16 SS, 8 k-steps over two 64-column chunks
 *   P, dS in registers, packed to BF16 A operands; bf(dS) also to a shared [query][128 + 8] tile
 *   dV += bf(P)^T dO, dK += bf(dS)^T Q    m64n128k16 RS, dO/Q N-major (LBO = one 8 KB chunk)
 *   (256-thread named barrier: both warpgroups' halves of the dS tile written)
 *   dQ_half = bf(dS) K[:, 64w..64w+63]    m64n64k16 RS over the CTA's 128 keys, A loaded from the tile
 *   the dQ half into the warpgroup's FP32 shared tile (128B swizzle), added to dq_acc by two TMA reduce-adds
 *   from one thread (warpgroup w owns dQ columns 64w..64w+63)
 * Shared memory 197 KiB: K, V 32 KB each; Q, dO 2 stages x 16 KB each; the dS tile double-buffered by step
 * parity (34 KB); row state [2][64] float4; one 16 KB dQ tile per warpgroup (single-buffered: a second pair
 * would pass 227 KB; the previous step's reduce-adds have the whole score phase to finish reading it). qkv and dout are hopper_wgmma.cuh's 4-D TMA tensors
 * {HS, heads, T, B} in 64-column boxes of 64 tokens (128-byte swizzle, zero fill past T).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3; `make hopper_bwd128-regs` prints them): kernel 168 at entry
 * (240 after setmaxnreg.inc), no C75xx warning; bf16 0 B spill, repair 8 B (with red.global in place of the
 * TMA dQ flush: 0); layout probe 254, 0 spill.
 *
 * Hangs: every mbarrier wait is bounded (~2 s of clock64; a legitimate wait is microseconds). It does NOT
 * trap: a __trap() anywhere on the consumer path makes ptxas ignore setmaxnreg.inc (the consumers are then
 * compiled for 168 registers: spills and serialised wgmmas; docs/attention_kernels.md, "Hangs"), and a
 * trap on the producer path alone would end the kernel, not name the consumers' rows. A
 * wait that gives up records the barrier in the host-mapped AttnHopperHang record (when
 * attention_hopper_bwd_watch_hangs installed one; first give-up wins), sets the CTA's abort flag (every later
 * wait of the CTA returns at once) and runs on; at the end the consumers, after a barrier that makes every
 * give-up of the CTA visible, write NaN to all their dK and dV rows instead of values. So a hang ends within
 * seconds as NaN gradients (the tests' finiteness checks and the trainer's NaN check fail loudly), never as a
 * stuck job or silently wrong numbers. Named barriers, wgmma waits and setmaxnreg cannot be bounded (their
 * counts are uniform by construction).
 *
 * Not done: a separate warp issuing the dQ reduce-adds (FA3's); overlapping the dQ
 * GEMM with dV/dK or the next step's scores; 3 stages; a persistent schedule; fp32/gproj modes (their own
 * key-major passes: attention_hopper_bwd128_fp32.cu, attention_hopper_bwd128_gproj.cu); repair's tile-max-shift arm (portable end to end, as at HS 64).
 */
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

/* The probe's outputs of two accumulators over this thread's key rows: [keys][N] FP32, row-major; element
   4j + 2r + e is row key_col + 8r, column 8j + 2t + e (hopper_wgmma.cuh's fragment layout). */
template <int REGS>
__device__ __forceinline__ void store_key_rows(float* out0, float* out1, const float (&acc0)[REGS],
                                               const float (&acc1)[REGS], int key_col, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                out0[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc0[4 * j + 2 * r + e];
                out1[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc1[4 * j + 2 * r + e];
            }
}

/* Layout probe: the two consumer warpgroups (256 threads), one step of everything, no softmax, at batch 0,
   head `head`: K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 loaded into
   STAGE 1, dS staged in BUFFER 1 (the non-zero offsets are what is exercised), through the kernel's own
   helpers:
     out_st  [128 keys][64 queries]  S^T = K Q^T            (a)
     out_dpt [128][64]               dP^T = V dO^T          (a), the dout map at HS 128
     out_dv  [128 keys][128]         dV = bf(S^T) dO        (b)
     out_dk  [128][128]              dK = bf(dP^T) Q        (b), Q read N-major after K-major
     out_dq  [64 queries][128]       dQ = bf(dP^T)^T K      (c), (d): both warpgroups' dS, 128 keys
   FP32, row-major. */
__global__ void __launch_bounds__(kConsumerThreads, 1)
    layout_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                        int NH, int head, float* __restrict__ out_st, float* __restrict__ out_dpt,
                        float* __restrict__ out_dv, float* __restrict__ out_dk, float* __restrict__ out_dq) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    bf16* ds_s = reinterpret_cast<bf16*>(smem + Plan::kDs + Plan::kDsBytes); /* buffer 1 */
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 2 * Plan::kKeyTileBytes + 2 * Plan::kQTileBytes);
        for (int ch = 0; ch < kChunks; ch++) {
            for (int half = 0; half < kBlockK / kBoxRows; half++) {
                const int dst = ch * Plan::kKeyChunkBytes + half * Plan::kBoxBytes;
                tma_load_4d(k_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotK * NH + head, half * kBoxRows, 0);
                tma_load_4d(v_s + dst, &qkv_map, bar, ch * kChunkCols, kSlotV * NH + head, half * kBoxRows, 0);
            }
            tma_load_4d(q_t + ch * Plan::kQChunkBytes, &qkv_map, bar, ch * kChunkCols, kSlotQ * NH + head, 0, 0);
            tma_load_4d(do_t + ch * Plan::kQChunkBytes, &dout_map, bar, ch * kChunkCols, head, 0, 0);
        }
    }
    mbar_wait_bounded(bar, 0, ATTN_HANG_PROBE, 0, &cta_abort);
    __syncwarp();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp / 4, warp_in_wg = warp % 4;
    const int key_col = wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    float st[32], dpt[32];
    keymajor128_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes,
                       smem_u32(q_t), smem_u32(do_t));
    store_key_rows(out_st, out_dpt, st, dpt, key_col, t);
    uint32_t pa[4][4], pds[4][4];
    pack_acc_a_operand(pa, st);
    pack_acc_a_operand(pds, dpt);
    stage_ds(ds_s, pds, key_col, t);
    float dv[kHS / 2], dk[kHS / 2], dq[32];
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) dv[i] = dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) dq[i] = 0.f;
    reg_fence(pa);
    reg_fence(pds);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    keymajor128_rs_issue(dv, pa, smem_u32(do_t));
    keymajor128_rs_issue(dk, pds, smem_u32(q_t));
    wgmma_commit();
    consumers_sync();
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(pa);
    reg_fence(pds);
    uint32_t adq[8][4];
    load_ds_operand(adq, ds_s, warp_in_wg, g, t);
    reg_fence(adq);
    reg_fence(dq);
    wgmma_fence();
    warpgroup_dq_issue(dq, adq, smem_u32(k_s) + wg * Plan::kKeyChunkBytes);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(adq);
    store_key_rows(out_dv, out_dk, dv, dk, key_col, t);
#pragma unroll
    for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                out_dq[(warp_in_wg * 16 + g + 8 * r) * kHS + wg * kDqCols + 8 * n + 2 * t + e] = dq[4 * n + 2 * r + e];
}


}  // namespace

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

namespace {

constexpr const char* kWho = "attention (Hopper backward, HS 128)";

template <int MODE, bool DQ_SLICES>
void hopper_bwd128_launch(AttnShape s, const CUtensorMap& qkv_map, const CUtensorMap& dout_map, const float* stats,
                          const float* D, float* dq_acc, bf16* dqkv, cudaStream_t stream) {
    cudaCheck(cudaFuncSetAttribute(hopper_bwd128_kernel<MODE, DQ_SLICES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    const int n_key_blocks = ceil_div(s.T, kBlockK);
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho, DQ_SLICES ? n_key_blocks : 1);
    const dim3 grid((unsigned)n_key_blocks, (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, hopper_bwd128_kernel<MODE, DQ_SLICES>, grid, dim3(kThreads), SmemPlan::kAlloc,
                               stream, qkv_map, dout_map, dq_map, stats, D, dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                               attn_exp2_scale(kHS));
}
static_assert(kBlockK == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per CTA key block");

}  // namespace

void attention_backward_hopper_keys128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv,
                                       const __nv_bfloat16* dout, const float* stats, const float* D, float* dq_acc,
                                       __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices) {
    if (s.HS != kHS || (mode != ATTN_BF16 && mode != ATTN_REPAIR)) {
        die("attention_backward_hopper_keys128: HS %d, mode %d (needs HS %d, bf16 or repair)\n"
            "  hint: call attention_backward_hopper_keys (or attention_backward_cuda), which checks support",
            s.HS, (int)mode, kHS);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    if (mode == ATTN_BF16 && !dq_slices)
        hopper_bwd128_launch<ATTN_BF16, false>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else if (mode == ATTN_BF16)
        hopper_bwd128_launch<ATTN_BF16, true>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else if (!dq_slices)
        hopper_bwd128_launch<ATTN_REPAIR, false>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
    else
        hopper_bwd128_launch<ATTN_REPAIR, true>(s, qkv_map, dout_map, stats, D, dq_acc, dqkv, stream);
}

void attention_hopper_bwd128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

void attention_hopper_bwd128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_BWD128_PROBE_KEYS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_bwd128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d NH=%d T=%d "
            "HS=%d head %d)", ATTN_HOPPER_BWD128_PROBE_KEYS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    static_assert(ATTN_HOPPER_BWD128_PROBE_KEYS == kBlockK && ATTN_HOPPER_BWD128_PROBE_QUERIES == kBlockQ,
                  "the probe covers one CTA's keys and one query tile");
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_dkv = (size_t)kBlockK * kHS;
    float* o_st = tiles;
    float* o_dpt = o_st + n_st;
    float* o_dv = o_dpt + n_st;
    float* o_dk = o_dv + n_dkv;
    float* o_dq = o_dk + n_dkv;
    cudaCheck(cudaFuncSetAttribute(layout_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    layout_probe_kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, o_st, o_dpt, o_dv,
                                                                   o_dk, o_dq);
    cudaCheckLastError();
}
