/*
 * attention/cuda/hopper/attention_hopper_bwd128_fp32.cu - the Hopper (sm_90a) key-major pass of fp32 mode's backward at
 * head size 128 (dK, dV and the dQ partials) on wgmma + TMA, a producer warpgroup and setmaxnreg. The API and
 * which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (the fp32 section at its end:
 * attention_backward_hopper_fp32_keys128; attention_backward_cuda runs it in attn_bwd_kernel<128, ATTN_FP32>'s
 * place on sm_90 after the Hopper row pass). fp32 at HS 64: attention_hopper_bwd64_fp32.cu, which also
 * holds the entry points of both head sizes (attention_backward_hopper_fp32_keys hands HS 128 to this file).
 *
 * Why: with the PORTABLE mma.sync key-major kernel attn_bwd_kernel<128, ATTN_FP32> (attention/cuda/attention_cuda.cu)
 * after the Hopper row pass, fp32 mode's fwd+bwd at B2 H16 T4096 d128 costs more than the 2.5x bf16's that is
 * the target. This kernel is attention_hopper_bwd128.cu's CTA (the bf16/repair pass) with fp32's numerics: the
 * fp32 backward (prep + Hopper row pass + this kernel + post-pass) is 1.56x faster than with the portable
 * key-major kernel at B2 H16 T4096 d128 (fp32/bf16 backward 3.32x -> 2.13x), all three slots within 4 BF16 ulps
 * of attention_backward_cuda(fp32, force_portable) (dev/results/attention_hopper_2026-11-29.md). The
 * producer's K/V load and stage fill and the dK/dV epilogue are hopper_bwd_common.cuh's keymajor_load_kv /
 * keymajor_fill_stage / keymajor_store_dkv. dev/attention_lab/hopper_bwd128_fp32.cu is the harness that checks
 * and times it.
 *
 * What it computes (docs/attention_numerics.md "fp32"; attn_bwd_kernel<128, ATTN_FP32>'s rounding points,
 * operation for operation; only the FP32 summation order differs):
 *   per CTA 128 keys of one (b, h), two consumer warpgroups of 64 keys; per query tile of 64 (from the
 *   diagonal on), per warpgroup:
 *     S^T = K_w Q^T, dP^T = V_w dO^T          FP32 (wgmma SS; hopper_bwd_common.cuh's keymajor128_scores)
 *     P = exp2((S - m) c) * fl(1/l)            (fp32's forward stores {m, l}; recompute_prob's non-bf16 arm)
 *     dS = P (dP - D)                          FP32, D from the workspace (the row pass's sum_j P dP);
 *                                              masked entries exactly 0
 *     dV += bf(P)^T dO + bf(P - bf(P))^T dO    two m64n128k16 RS batches chained into one accumulator
 *     dK += bf(dS)^T Q + bf(r1)^T Q            r1 = dS - bf(dS) (exact in FP32); the same chaining
 *     dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K   three BF16 terms (24 significant bits: dQ sums dS
 *                                              against keys that may share a large common offset, so a
 *                                              two-term split would leak like bf16 mode's rounding; the
 *                                              portable kernel's comment), each staged in shared memory as
 *                                              [query][key]; summed in one FP32 accumulator per warpgroup
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the s-less dQ partial (one per 128 keys) goes
 *   to the FP32 accumulator by TMA reduce-add, and the portable post-pass (attn_bwd_dq_kernel) writes
 *   dQ = bf(s acc). Workspace contract = attn_bwd_kernel's: the prep kernel zeroed dq_acc [B*NH*T][128], the
 *   row pass wrote D [B*NH*T] (carve_workspace's slots). DQ_SLICES (the deterministic backward,
 *   docs/determinism.md): the partials go to the key block's own zeroed slice, one add per element (warpgroup w
 *   owns dQ columns 64w..64w+63).
 *
 * Layout (attention_hopper_bwd128.cu's CTA: FlashAttention-3's d128 split, read in Dao-AILab/flash-attention
 * hopper/, no code copied): 384 threads, two consumer warpgroups (setmaxnreg 240) and a producer warpgroup
 * (24; one warp: TMA, row state {m, fl(1/l), D}). Q/dO tiles of 64 queries in 2 stages; grid in the
 * longest-first order of tile_order.cuh. Per step and consumer warpgroup:
 *   S^T, dP^T                   m64n64k16 SS, 8 k-steps                                         32 + 32 regs
 *   (consumers_sync: both warpgroups have read the previous step's dS tiles - they are single-buffered)
 *   P, dS one k-step (16 queries) at a time (hopper_bwd_common.cuh's keymajor_probs_column<ATTN_FP32>) -> A
 *     words bf(P), bf(P - bf(P)), bf(dS), bf(r1) (16 registers per k-step; the FP32 values die step by step),
 *     and bf(dS), bf(r1), bf(r1 - bf(r1)) stored to the three shared tiles [query][key]
 *   dV += [bf(P), bf(P - bf(P))]^T dO, dK += [bf(dS), bf(r1)]^T Q: ONE batch of 16 m64n128k16 RS wgmmas
 *     (keymajor128_rs_issue, two chained per accumulator), 128 accumulator + 64 A registers in flight
 *   (consumers_sync: both warpgroups' halves of the three tiles written)
 *   dQ_half = sum over 3 terms x 2 key halves of A[64 q x 64 keys] K[64 keys x 64 dims]: six commit groups of
 *     4 m64n64k16 RS into one 32-register accumulator, A loaded from the tiles into two alternating register
 *     sets of 16 (wait<1> before a set is reloaded): 128 + 32 + 32 registers
 *   the dQ half into the warpgroup's swizzled FP32 tile, two TMA reduce-adds (attention_hopper_bwd128.cu's flush)
 * Shared memory: K, V 32 KB each, Q, dO 2 stages x 16 KB each, three dS tiles [64][128 + 8] BF16 (51 KB,
 * single-buffered: double-buffering them would pass 227 KB; hence the extra barrier above), row state [2][64]
 * float4, barriers, two 16 KB FP32 dQ tiles: 215 KB (220160 bytes with the alignment slack; SmemPlan's
 * static_assert keeps it <= 227 KB).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math; `make hopper_bwd128_fp32-regs` prints them):
 * fp32keys128_kernel 168 at entry (240 after setmaxnreg.inc), 0 bytes spill, no C75xx warning; the probe
 * kernels 90 (scores, dQ parts) / 218 (dK+dV), 0 spill. What that takes: the producer's
 * two-query row-state loop is not unrolled (`#pragma unroll 1`: unrolled, its 24 registers spilled), and the dQ
 * flush's swizzled column offsets are not hoisted (g through an opaque move).
 *
 * Hangs (a pipeline protocol bug): as attention_hopper_bwd128.cu. Every mbarrier wait is bounded (~2 s of
 * clock64; a legitimate wait is microseconds) and GIVES UP instead of trapping (hopper_bwd_common.cuh's
 * mbar_wait_give_up; a __trap() on the consumer path makes ptxas ignore setmaxnreg.inc): it records the barrier
 * in the host-mapped AttnHopperHang record (attention_hopper_bwd_watch_hangs installs it here through
 * attention_hopper_fp32_keys128_watch_hangs; first give-up wins), sets the CTA's abort flag (every later wait of
 * the CTA returns at once) and runs on; at the end the consumers, after a barrier that makes every give-up of
 * the CTA visible, write NaN over all their dK and dV rows. A hang thus ends within seconds as NaN gradients
 * (the tests' and the trainer's NaN checks fail loudly), never as a stuck job or silently wrong numbers.
 *
 * The layout probe (attention_hopper_fp32_keys128_layout_probe, for dev/attention_lab/hopper_bwd128_fp32.cu):
 * the two consumer warpgroups, one step, no softmax, P := S^T and dS := dP^T split and staged through the
 * kernel's own helpers: S^T, dP^T; dV and dK with their two chained split terms; dQ over the three staged terms
 * and its second and third terms alone (their contribution is 2^-8 / 2^-16 of the first: invisible next to it).
 *
 * Not done: 3 stages or a
 * persistent schedule; overlapping the next tile's S^T/dP^T with this tile's batches (no registers left).
 */
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
static_assert(ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS == kBlockK && ATTN_HOPPER_FP32_KEYS128_PROBE_QUERIES == kBlockQ,
              "the probe covers one CTA's keys and one query tile");
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

/* The probe's outputs of one accumulator over this thread's key rows: [keys][N] FP32, row-major; element
   4j + 2r + e is row key_col + 8r, column 8j + 2t + e (hopper_wgmma.cuh's fragment layout). */
template <int REGS>
__device__ __forceinline__ void store_key_rows(float* out, const float (&acc)[REGS], int key_col, int t) {
    constexpr int kCols = 2 * REGS;
#pragma unroll
    for (int j = 0; j < kCols / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) out[(key_col + 8 * r) * kCols + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
}

/* Layout probe: the two consumer warpgroups (256 threads), one step, no softmax, at batch 0, head `head`:
   K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 in STAGE 1, P := S^T and
   dS := dP^T split and staged through the kernel's own helpers. One launch per part (S^T, dP^T recomputed
   by each; deterministic):
     kProbeScores  out_st, out_dpt [128 keys][64 queries]   S^T = K Q^T, dP^T = V dO^T       re-check (a)
     kProbeDkDv    out_dv  [128 keys][128]  (bf(S^T) + bf(S^T - bf(S^T))) dO                  (n3)
                   out_dk  [128 keys][128]  (bf(dP^T) + bf(r1)) Q, r1 = dP^T - bf(dP^T)        (n3)
     kProbeDq      out_dq  [64 queries][128]  (bf(dP^T) + bf(r1) + bf(r1 - bf(r1)))^T K        (n1), (n2)
     kProbeDqLo    out_dq_lo: the same with only the bf(r1) tile non-zero                     (n1), (n2)
     kProbeDqLo2   out_dq_lo2: only the bf(r1 - bf(r1)) tile non-zero                          (n1), (n2)
   FP32, row-major. */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeDq = 2, kProbeDqLo = 3, kProbeDqLo2 = 4 };
struct ProbeOut {
    float *st, *dpt, *dv, *dk, *dq, *dq_lo, *dq_lo2;
};
/* The probe's split products (parts kProbeDkDv .. kProbeDqLo2) from its S^T (as P) and dP^T (as dS). */
template <int kPart>
__device__ __forceinline__ void fp32keys128_probe_products(const float (&st)[32], const float (&dpt)[32], bf16* ds_tiles,
                                                           uint32_t k_dq_addr, uint32_t q_addr, uint32_t do_addr,
                                                           const ProbeOut& out, int key_col, int warp_in_wg, int g,
                                                           int t) {
    uint32_t pa[kQSteps][4], pa_lo[kQSteps][4], pds[kQSteps][4], pds_lo[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        uint32_t unused[4], x2[4];
        pack_split_step<false>(pa[kk], pa_lo[kk], unused, st, kk);
        pack_split_step<true>(pds[kk], pds_lo[kk], x2, dpt, kk);
        uint32_t w0[4], w1[4], w2[4]; /* the part's tiles: its terms, zeros elsewhere */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w0[i] = (kPart == kProbeDq) ? pds[kk][i] : 0u;
            w1[i] = (kPart == kProbeDq || kPart == kProbeDqLo) ? pds_lo[kk][i] : 0u;
            w2[i] = (kPart == kProbeDqLo) ? 0u : x2[i];
        }
        stage_ds_step(ds_tiles, w0, kk, key_col, t);
        stage_ds_step(ds_tiles + kDsTileElems, w1, kk, key_col, t);
        stage_ds_step(ds_tiles + 2 * kDsTileElems, w2, kk, key_col, t);
    }
    if constexpr (kPart == kProbeDkDv) {
        float acc[kHS / 2];
#pragma unroll
        for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
        reg_fence(pa);
        reg_fence(pa_lo);
        reg_fence(acc);
        wgmma_fence();
        keymajor128_rs_issue(acc, pa, do_addr);
        keymajor128_rs_issue(acc, pa_lo, do_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        store_key_rows(out.dv, acc, key_col, t);
#pragma unroll
        for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
        reg_fence(pds);
        reg_fence(pds_lo);
        reg_fence(acc);
        wgmma_fence();
        keymajor128_rs_issue(acc, pds, q_addr);
        keymajor128_rs_issue(acc, pds_lo, q_addr);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc);
        store_key_rows(out.dk, acc, key_col, t);
    } else {
        consumers_sync(); /* both warpgroups' halves of the tiles written */
        float dq[32];
#pragma unroll
        for (int k = 0; k < 32; k++) dq[k] = 0.f;
        reg_fence(dq);
        warpgroup_dq_terms(dq, ds_tiles, k_dq_addr, warp_in_wg, g, t);
        float* o = (kPart == kProbeDq) ? out.dq : (kPart == kProbeDqLo) ? out.dq_lo : out.dq_lo2;
#pragma unroll
        for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    o[(warp_in_wg * 16 + g + 8 * r) * kHS + (key_col / kWarpgroupKeys) * kDqCols + 8 * n + 2 * t + e] =
                        dq[4 * n + 2 * r + e];
    }
}

template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    fp32keys128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                             int NH, int head, ProbeOut out) {
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
    bf16* const ds_tiles = reinterpret_cast<bf16*>(smem + Plan::kDs);
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
    const uint32_t q_addr = smem_u32(q_t), do_addr = smem_u32(do_t);
    float st[32], dpt[32];
    keymajor128_scores(st, dpt, smem_u32(k_s) + wg * Plan::kBoxBytes, smem_u32(v_s) + wg * Plan::kBoxBytes, q_addr,
                       do_addr);
    if constexpr (kPart == kProbeScores) {
        store_key_rows(out.st, st, key_col, t);
        store_key_rows(out.dpt, dpt, key_col, t);
    } else {
        fp32keys128_probe_products<kPart>(st, dpt, ds_tiles, smem_u32(k_s) + wg * Plan::kKeyChunkBytes, q_addr, do_addr,
                                         out, key_col, warp_in_wg, g, t);
    }
}


/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch, probe                                                                  */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper fp32 key-major pass, HS 128)";

}  // namespace

int attention_hopper_fp32_keys128_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout) {
    if (mode != ATTN_FP32 || s.HS != kHS) return 0;
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0 && ((uintptr_t)dout % kTmaAlignBytes) == 0;
}

void attention_backward_hopper_fp32_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                            const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                            cudaStream_t stream, int dq_slices) {
    if (!attention_hopper_fp32_keys128_supports(ATTN_FP32, s, qkv, dout)) {
        die("attention_backward_hopper_fp32_keys128: unsupported call (B=%d NH=%d T=%d HS=%d)\n"
            "  hint: HS %d, B*NH <= 65535, 16-byte aligned qkv and dout; call attention_backward_cuda, which checks"
            " support (attention_hopper_fp32_keys128_supports)", s.B, s.NH, s.T, s.HS, kHS);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    static_assert(kBlockK == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per CTA key block");
    const int n_key_blocks = ceil_div(s.T, kBlockK);
    const CUtensorMap dq_map = encode_dq_acc_map(dq_acc, s, kBlockQ, kWho, dq_slices ? n_key_blocks : 1);
    auto kernel = dq_slices ? fp32keys128_kernel<true> : fp32keys128_kernel<false>;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    const dim3 grid((unsigned)n_key_blocks, (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, kernel, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map, dout_map,
                               dq_map, stats, D, dqkv, s.NH, s.T, attn_softmax_scale(kHS), attn_exp2_scale(kHS));
}

void attention_hopper_fp32_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

void attention_hopper_fp32_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                const __nv_bfloat16* dout, float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_fp32_keys128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d "
            "NH=%d T=%d HS=%d head %d)", ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_kv = (size_t)kBlockK * kHS, n_q = (size_t)kBlockQ * kHS;
    ProbeOut o;
    o.st = tiles;
    o.dpt = o.st + n_st;
    o.dv = o.dpt + n_st;
    o.dk = o.dv + n_kv;
    o.dq = o.dk + n_kv;
    o.dq_lo = o.dq + n_q;
    o.dq_lo2 = o.dq_lo + n_q;
    auto launch = [&](auto kernel) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
        kernel<<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, o);
        cudaCheckLastError();
    };
    launch(fp32keys128_probe_kernel<kProbeScores>);
    launch(fp32keys128_probe_kernel<kProbeDkDv>);
    launch(fp32keys128_probe_kernel<kProbeDq>);
    launch(fp32keys128_probe_kernel<kProbeDqLo>);
    launch(fp32keys128_probe_kernel<kProbeDqLo2>);
}
