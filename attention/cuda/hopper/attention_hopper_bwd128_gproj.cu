/*
 * attention/cuda/hopper/attention_hopper_bwd128_gproj.cu - the Hopper (sm_90a) key-major pass of gproj mode's backward at
 * head size 128 (dK and dV only) on wgmma + TMA, a producer warpgroup and setmaxnreg. The API and which calls
 * it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (the gproj section at its end: attention_backward_hopper_gproj_keys
 * dispatches here on HS 128; the HS-64 pass is attention_hopper_bwd_gproj.cu).
 *
 * Why: at HS 128 the portable gproj backward (gproj is the users' default mode: prep + attn_bwd_rows_kernel
 * + attn_bwd_kernel<128, ATTN_GPROJ>, attention/cuda/attention_cuda.cu) is about 2.2x bf16's Hopper backward at
 * B2 H16 T4096 d128, and the key-major kernel is most of it. This kernel is attention_hopper_bwd128.cu's CTA
 * with gproj's numerics, as attention_hopper_bwd_gproj.cu is at HS 64: no dQ GEMM, no atomics, no dS staging
 * tile (the row pass wrote dQ), one more register-A GEMM into dK. Its lab, dev/attention_lab/hopper_bwd128_gproj.cu,
 * checks the layout (all five products) and this kernel against attention_backward_cuda(gproj, force_portable)
 * on the same D and lambda (dK within 1 BF16 ulp, dV bit-equal), and times it: 1.26x / 1.39x the portable
 * gproj backward at B8 H8 T1024 / B2 H16 T4096 d128 (dev/results/attention_hopper_2026-11-29.md). Beyond the
 * lab's kernel, production adds the give-up bookkeeping below (the NaN rows and the barrier before them).
 *
 * What it computes (docs/attention_numerics.md, gproj; attn_bwd_kernel<128, ATTN_GPROJ>'s rounding points):
 *   per query tile of 64 (from the diagonal on), per consumer warpgroup (64 keys):
 *     S^T = K_w Q^T, dP^T = V_w dO^T         FP32 (wgmma SS)
 *     P = exp2((S - m) c) * fl(1/l)           repair's softmax, which gproj uses (stats {m, l})
 *     dS = P (dP - D)                         FP32; D from the prep kernel (the BF16 O); masked entries exactly 0
 *     dV += bf(P)^T dO
 *     dK += bf(dS)^T Q + bf(-lambda_q P)^T Q  the correction its own BF16 operand: -lambda_q * P in FP32, rounded
 *                                             once (the portable kernel's `alp`; rounding dS - lambda P together
 *                                             would lose it)
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the q slot is not touched. D and lambda
 *   [B*NH*T] are the workspace slots of carve_workspace (attention_cuda.cu) that the prep kernel (D) and the
 *   row pass (lambda; portable or Hopper, either) write.
 * Only the FP32 sum order differs from the portable kernel (wgmma's k order; dK sums the tile's 4 bf(dS)
 * k-steps, then the 4 correction k-steps, where attn_bwd_kernel interleaves them per 16 queries; 64-query
 * tiles here, 32 there): dK within a few BF16 ulps of the row scale (the lab: at most 1), dV bit-equal on the lab's cases.
 *
 * Layout (attention_hopper_bwd128.cu's; FlashAttention-3's d128 split, read in Dao-AILab/flash-attention
 * hopper/, no code copied): one CTA = 128 keys of one (b, h), 384 threads: two consumer warpgroups of 64 keys
 * and a producer warpgroup (one warp issues TMA and writes the row state {m, fl(1/l), D} and lambda; setmaxnreg
 * 24 there, 240 in the consumers: 128 * 24 + 256 * 240 = 384 * 168). Q/dO tiles of 64 queries in a 2-stage
 * pipeline (full[s]: 32 producer lanes + the TMA bytes; empty[s]: the 256 consumer threads). Per step and
 * consumer warpgroup:
 *   S^T, dP^T                      m64n64k16 SS, 8 k-steps over two 64-column chunks            32 + 32 regs
 *   bf(P), bf(dS), bf(-lambda P)   packed one k-step (16 queries) at a time, so the FP32 P and dS die step
 *                                  by step                                                      16 + 16 + 16
 *   dV += bf(P)^T dO               m64n128k16 RS, dO N-major (LBO = one 8 KB chunk)             64
 *   dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: two batches issued back to back into the ONE
 *                                  accumulator (wgmma orders same-accumulator operations)      64
 * Shared memory 129 KiB: K, V 32 KB each (two 64-column chunks of 128 rows), Q, dO 2 stages x 16 KB each,
 * the row state float4 [2][64], lambda float [2][64] (kept apart from the float4: as its .w the consumer code
 * spilled 12 bytes at 240 registers), barriers. qkv and dout are hopper_wgmma.cuh's 4-D TMA tensors {HS, heads,
 * T, B} in 64-column boxes of 64 tokens (128-byte swizzle, zero fill past T).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3; `make hopper_bwd128_gproj-regs` prints them): the kernel 168 at
 * entry (240 after setmaxnreg.inc), 0 B spill, no C75xx warning (0 spills is also the sign setmaxnreg took:
 * at 168 this code spills); the probe kernels (256 threads, no setmaxnreg) 90 / 218 / 106, 0 spill.
 *
 * Hangs (a pipeline protocol bug): as attention_hopper_bwd128.cu. Every mbarrier wait is bounded (~2 s of
 * clock64; a legitimate wait is microseconds) and GIVES UP instead of trapping (hopper_bwd_common.cuh's
 * mbar_wait_give_up; a __trap() on the consumer path makes ptxas ignore setmaxnreg.inc): it records the barrier
 * in the host-mapped AttnHopperHang record (when attention_hopper_bwd_watch_hangs installed one; first give-up
 * wins), sets the CTA's abort flag (every later wait of the CTA returns at once) and runs on; at the end the
 * consumers, after a barrier that makes every give-up of the CTA visible, write NaN over all their dK and dV
 * rows. A hang thus ends within seconds as NaN gradients (the tests' and the trainer's NaN checks fail
 * loudly), never as a stuck job or silently wrong numbers.
 *
 * Not done: the longest-first tile order over all heads (tile_order.cuh; the HS-64 pass has it, this grid is
 * blockIdx.x = key tile); 3 stages or a persistent schedule; overlapping the next tile's S^T/dP^T
 * with this tile's dV/dK batch (FA3's two-tile pipelining; the registers would not hold a second S^T/dP^T next to
 * 48 A registers). fp32 mode's key-major pass (it also makes dQ) is attention_hopper_bwd128_fp32.cu.
 */
#include <math.h>
#include <stdint.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/hopper/hopper_bwd_common.cuh"
#include "attention/cuda/launch_overlap.cuh"

using namespace hopper_wgmma;

namespace {

constexpr int kHS = ATTN_HOPPER_BWD128_HS; /* the head size of this kernel */
constexpr int kChunkCols = 64;          /* BF16 columns per 128-byte swizzle row */
static_assert(kChunkCols == 64, "encode_head_map's boxes are 64 columns (one 128-byte swizzle row) wide");
constexpr int kChunks = kHS / kChunkCols;
constexpr int kBlockK = 128;            /* keys per CTA */
constexpr int kBlockQ = 64;             /* queries per pipelined Q/dO tile (the N of S^T, the k of dK/dV) */
constexpr int kWarpgroupKeys = 64;      /* keys per consumer warpgroup (the M of every wgmma) */
constexpr int kConsumerWarpgroups = kBlockK / kWarpgroupKeys;
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kThreads = kConsumerThreads + 128; /* + the producer warpgroup (one warp of it works) */
/* setmaxnreg split of the 384-thread CTA (__launch_bounds__(384, 1): every thread starts at 168);
   attention_hopper_bwd128.cu's */
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
              "the setmaxnreg split must fit in what the CTA was launched with");
constexpr int kStages = 2;              /* Q/dO double buffering */
constexpr int kBoxRows = 64;            /* rows per TMA box */
constexpr int kSwizzleRowBytes = 128;   /* one 64-column chunk row = one 128B-swizzle row */
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kWgmmaK = 16;
constexpr int kQSteps = kBlockQ / kWgmmaK;            /* k-steps of the RS GEMMs (the tile's 64 queries) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static_assert(kWarpgroupKeys == kBlockQ && kQSteps == kTileKSteps,
              "S^T per warpgroup is 64 x 64: its 32 registers are the 4 k-steps of the RS GEMMs' A");
static_assert(ATTN_HOPPER_GPROJ128_PROBE_KEYS == kBlockK && ATTN_HOPPER_GPROJ128_PROBE_QUERIES == kBlockQ,
              "the probe covers one CTA's keys and one query tile");

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
    static constexpr int kRowState = kDO + kStages * kQTileBytes; /* float4 [kStages][kBlockQ] */
    static constexpr int kLambda = kRowState + kStages * kBlockQ * 16; /* float [kStages][kBlockQ] */
    static constexpr int kBarriers = kLambda + kStages * kBlockQ * 4;
    static constexpr int kNumBarriers = 1 + 2 * kStages;     /* kv_full, full[stages], empty[stages] */
    static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
    static constexpr int kAlloc = kBytes + kSwizzleAtomBytes; /* slack to align the base to 1024 */
    static_assert(kQ % kSwizzleAtomBytes == 0 && kDO % kSwizzleAtomBytes == 0, "TMA tiles 1024-byte aligned");
    static_assert(kBoxBytes % kSwizzleAtomBytes == 0 && kQChunkBytes % kSwizzleAtomBytes == 0, "chunks 1024-aligned");
    static_assert(kRowState % 16 == 0 && kLambda % 16 == 0 && kBarriers % 8 == 0, "float4 row state, float2 lambda pairs, barriers");
    static_assert(kAlloc <= 227 * 1024, "over the 227 KB of shared memory a Hopper CTA may have");
};

/* Barrier of the two consumer warpgroups (256 threads; id 1: 0 is __syncthreads). */
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

/* bounded mbarrier waits that give up (see the file comment: no trap under setmaxnreg) */
constexpr long long kHangCycles = 4000000000ll; /* ~2 s at 1.98 GHz */
/* set by attention_hopper_bwd_watch_hangs (through attention_hopper_gproj_keys_watch_hangs); NULL: no record */
__device__ AttnHopperHang* g_hang_record;
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, int site, int index,
                                                  volatile int* cta_abort) {
    mbar_wait_give_up<kHangCycles>(bar, parity, site, index, cta_abort, g_hang_record);
}

/* ---- one (key tile, query tile) step, per warpgroup: hopper_bwd_common.cuh's keymajor128_scores (S^T, dP^T)
   and keymajor128_rs_issue (dV, dK batches; attention_hopper_bwd128.cu's CTA, the same tiles); here the lambda
   pairs of the correction operand ---- */
static_assert(SmemPlan::kKeyChunkBytes == kKeymajor128KeyChunkBytes && SmemPlan::kQChunkBytes == kKeymajor128QChunkBytes &&
                  kHS == kKeymajor128HS && kQSteps == kKeymajor128QSteps,
              "the tiles hopper_bwd_common.cuh's HS-128 GEMM steps address");
static_assert(SmemPlan::kKeyChunkBytes == KeymajorTiles<kChunks>::kKeyChunkBytes &&
                  SmemPlan::kQChunkBytes == KeymajorTiles<kChunks>::kQChunkBytes &&
                  SmemPlan::kBoxBytes == KeymajorTiles<kChunks>::kBoxBytes && kBlockK == KeymajorTiles<kChunks>::kBlockK &&
                  kBlockQ == KeymajorTiles<kChunks>::kBlockQ,
              "the tiles hopper_bwd_common.cuh's producer steps (keymajor_load_kv, keymajor_fill_stage) address");

/* k-step kk's lambdas from a stage's [kBlockQ] lambda row, as pack_gproj_step_operands takes them:
   lam[jj][e] = lambda of query 16kk + 8jj + 2t + e, each pair (e = 0, 1) one 8-byte shared load (a thread's two
   query columns 2t, 2t + 1 of an 8-column block). */
__device__ __forceinline__ void load_step_lambdas(float (&lam)[2][2], const float* lam_row, int kk, int t) {
#pragma unroll
    for (int jj = 0; jj < 2; jj++) {
        const float2 lam2 = *reinterpret_cast<const float2*>(lam_row + 16 * kk + 8 * jj + 2 * t);
        lam[jj][0] = lam2.x;
        lam[jj][1] = lam2.y;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* kernels                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* gproj's key-major pass at HS 128 (see the file comment). stats {m, l} per row (gproj's forward stores
   repair's stats), D and lambda [B*NH*T] from the workspace; writes the k and v slots of dqkv. */
__global__ void __launch_bounds__(kThreads, 1)
    gproj128_keys_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                         const float* __restrict__ stats, const float* __restrict__ D,
                         const float* __restrict__ lambda, bf16* __restrict__ dqkv, int NH, int T, float scale,
                         float c) {
    using Plan = SmemPlan;
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

    const int k0 = blockIdx.x * kBlockK;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
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
            keymajor_stage_row_state<ATTN_GPROJ, kKeymajorLambdaRow>(row_state + s * kBlockQ, lambda_s + s * kBlockQ,
                                                                     stats, D, lambda, bh, T, q0, lane);
            keymajor_fill_stage<kChunks>(q_s + s * Plan::kQTileBytes, do_s + s * Plan::kQTileBytes, &qkv_map,
                                         &dout_map, &full[s], q0, h, NH, b, lane);
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    /* ---- consumer warpgroups: wg owns keys k0 + 64 wg .. +63; this thread keys key0, key0 + 8 ---- */
    const int wg = warpgroup, warp_in_wg = warp & 3, g = lane >> 2, t = lane & 3;
    const int key0 = k0 + wg * kWarpgroupKeys + warp_in_wg * 16 + g;
    const int wg_key_first = k0 + wg * kWarpgroupKeys;
    const uint32_t kw_addr = smem_u32(k_s) + wg * Plan::kBoxBytes, vw_addr = smem_u32(v_s) + wg * Plan::kBoxBytes;
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
        const float* lam_row = lambda_s + s * kBlockQ;

        float st[32], dpt[32];
        keymajor128_scores(st, dpt, kw_addr, vw_addr, q_addr, do_addr);

        /* P and dS (masked entries exactly 0; attn_bwd_kernel's expressions) and the three A operands, one
           k-step (16 queries) at a time. Element 4j + 2r + e: key key0 + 8r, query q0 + 8j + 2t + e. The
           mask can bite only where the tile reaches the warpgroup's keys or T. */
        const bool masked = (q0 < wg_key_first + kWarpgroupKeys - 1) || (q0 + kBlockQ > T);
        uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
        for (int kk = 0; kk < kQSteps; kk++) {
            float lam[2][2];
            load_step_lambdas(lam, lam_row, kk, t);
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 2 * kk + jj;
                    const int query = q0 + 8 * j + 2 * t + e;
                    const float4 row = rs[8 * j + 2 * t + e];
                    keymajor_probs_column<ATTN_REPAIR>(st, dpt, row, j, e, query, key0, T, masked, c);
                }
            pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
        }

        /* dV += bf(P)^T dO; dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: one batch of 12 wgmmas, the
           two dK ones chained on the same accumulator; P and dS are dead while it runs (128 accumulator +
           48 A registers in flight). */
        keymajor_gproj_dkv_batch<kHS>(dv, dk, pa, pds, plam, q_addr, do_addr);
        mbar_arrive(&empty[s]); /* this thread no longer reads stage s (Q, dO, row state) */
    }

    /* a wait of this CTA that gave up (consumer or producer; the producer's give-up precedes an arrival on
       full that every consumer waited for) is visible to every consumer thread after this barrier */
    consumers_sync();
    const bool gave_up = *static_cast<volatile int*>(&cta_abort) != 0;

    /* dK = bf(s acc), dV = bf(acc) for this thread's keys (rows key0, key0 + 8; cols 8n + 2t); NaN in every
       element of both rows if the CTA gave up a wait (see the file comment: a hang must fail loudly) */
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

/* The probe's RS products: acc = first B (+ second B if `second`), both register-A batches of
   keymajor128_rs_issue into the one accumulator, as the kernel chains dK's two batches. */
__device__ __forceinline__ void probe_rs_batches(float (&acc)[kHS / 2], uint32_t (&first)[kQSteps][4],
                                                 uint32_t (&second_a)[kQSteps][4], uint32_t b_addr,
                                                 bool second = true) {
#pragma unroll
    for (int i = 0; i < kHS / 2; i++) acc[i] = 0.f;
    reg_fence(first);
    reg_fence(second_a);
    reg_fence(acc);
    wgmma_fence();
    keymajor128_rs_issue(acc, first, b_addr);
    if (second) keymajor128_rs_issue(acc, second_a, b_addr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(acc);
    reg_fence(first);
    reg_fence(second_a);
}

/* Layout probe: the two consumer warpgroups (256 threads), one step, no softmax, at batch 0, head `head`:
   K, V tokens 0..127 (T < 128: the TMA zero fill shows), Q and dO tokens 0..63 loaded into STAGE 1, a
   per-query lambda [64] from global memory in stage 1's lambda row, through the kernel's own helpers
   (P := S^T, dS := dP^T). Three launches, kPart: kProbeScores writes out_st and out_dpt, kProbeDkDv out_dk
   and out_dv, kProbeCorr out_corr (S^T, dP^T recomputed by each: deterministic; one kernel writing all five
   takes 255 registers, spills and serialises its wgmmas - ptxas keeps the earlier accumulators live):
     out_st   [128 keys][64 queries]  S^T = K Q^T
     out_dpt  [128][64]               dP^T = V dO^T
     out_dk   [128 keys][128]         bf(dP^T) Q + bf(-lambda_q S^T) Q   (the two chained batches)
     out_corr [128][128]              bf(-lambda_q S^T) Q alone
     out_dv   [128][128]              bf(S^T) dO
   FP32, row-major. */
enum ProbePart { kProbeScores = 0, kProbeDkDv = 1, kProbeCorr = 2 };
template <int kPart>
__global__ void __launch_bounds__(kConsumerThreads, 1)
    gproj128_probe_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                          int NH, int head, const float* __restrict__ lambda_in, float* __restrict__ out_st,
                          float* __restrict__ out_dpt, float* __restrict__ out_dk, float* __restrict__ out_corr,
                          float* __restrict__ out_dv) {
    using Plan = SmemPlan;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_u32(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                      (kSwizzleAtomBytes - 1));
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + Plan::kBarriers);
    float* lam_row = reinterpret_cast<float*>(smem + Plan::kLambda) + kBlockQ; /* stage 1's lambda */
    __shared__ int cta_abort;
    unsigned char* k_s = smem + Plan::kK;
    unsigned char* v_s = smem + Plan::kV;
    unsigned char* q_t = smem + Plan::kQ + Plan::kQTileBytes;  /* stage 1 */
    unsigned char* do_t = smem + Plan::kDO + Plan::kQTileBytes; /* stage 1 */
    if (threadIdx.x == 0) {
        cta_abort = 0;
        mbar_init(bar, 1);
        mbar_init_fence();
        fence_proxy_async();
    }
    if (threadIdx.x < kBlockQ) lam_row[threadIdx.x] = lambda_in[threadIdx.x];
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
    uint32_t pa[kQSteps][4], pds[kQSteps][4], plam[kQSteps][4];
#pragma unroll
    for (int kk = 0; kk < kQSteps; kk++) {
        float lam[2][2];
        load_step_lambdas(lam, lam_row, kk, t);
        pack_gproj_step_operands(pa[kk], pds[kk], plam[kk], st, dpt, kk, lam);
    }
    if (kPart == kProbeScores) {
        store_key_rows(out_st, st, key_col, t);
        store_key_rows(out_dpt, dpt, key_col, t);
    } else if (kPart == kProbeDkDv) { /* one commit group per accumulator */
        float dk[kHS / 2];
        probe_rs_batches(dk, pds, plam, q_addr);
        store_key_rows(out_dk, dk, key_col, t);
        float dv[kHS / 2];
        probe_rs_batches(dv, pa, pa, do_addr, /*second=*/false);
        store_key_rows(out_dv, dv, key_col, t);
    } else {
        float corr[kHS / 2];
        probe_rs_batches(corr, plam, plam, q_addr, /*second=*/false);
        store_key_rows(out_corr, corr, key_col, t);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor maps, launch                                                                         */
/* ------------------------------------------------------------------------------------------------ */

constexpr const char* kWho = "attention (Hopper gproj key-major pass, HS 128)";

}  // namespace

void attention_backward_hopper_gproj_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                             const float* stats, const float* D, const float* lambda,
                                             __nv_bfloat16* dqkv, cudaStream_t stream) {
    if (s.HS != kHS) {
        die("attention_backward_hopper_gproj_keys128: HS %d (needs %d)\n"
            "  hint: call attention_backward_hopper_gproj_keys (or attention_backward_cuda), which checks support",
            s.HS, kHS);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    cudaCheck(cudaFuncSetAttribute(gproj128_keys_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemPlan::kAlloc));
    const dim3 grid((unsigned)ceil_div(s.T, kBlockK), (unsigned)(s.B * s.NH));
    launch_after_previous_grid(1, gproj128_keys_kernel, grid, dim3(kThreads), SmemPlan::kAlloc, stream, qkv_map,
                               dout_map, stats, D, lambda, dqkv, s.NH, s.T, attn_softmax_scale(kHS),
                               attn_exp2_scale(kHS));
}

void attention_hopper_gproj_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

void attention_hopper_gproj_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                 const __nv_bfloat16* dout, const float* lambda, float* tiles) {
    if (s.B != 1 || s.T > ATTN_HOPPER_GPROJ128_PROBE_KEYS || head < 0 || head >= s.NH || s.HS != kHS) {
        die("attention_hopper_gproj_keys128_layout_probe: needs B = 1, T <= %d, 0 <= head < NH, HS %d (got B=%d "
            "NH=%d T=%d HS=%d head %d)", ATTN_HOPPER_GPROJ128_PROBE_KEYS, kHS, s.B, s.NH, s.T, s.HS, head);
    }
    const CUtensorMap qkv_map = encode_head_map(qkv, s, 3 * s.NH, kBoxRows, kWho, "qkv");
    const CUtensorMap dout_map = encode_head_map(dout, s, s.NH, kBoxRows, kWho, "dout");
    const size_t n_st = (size_t)kBlockK * kBlockQ, n_kv = (size_t)kBlockK * kHS;
    float* o_st = tiles;
    float* o_dpt = o_st + n_st;
    float* o_dk = o_dpt + n_st;
    float* o_corr = o_dk + n_kv;
    float* o_dv = o_corr + n_kv;
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeScores>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeDkDv>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    cudaCheck(cudaFuncSetAttribute(gproj128_probe_kernel<kProbeCorr>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SmemPlan::kAlloc));
    gproj128_probe_kernel<kProbeScores><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda,
                                                                                  o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    gproj128_probe_kernel<kProbeDkDv><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda,
                                                                                o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
    gproj128_probe_kernel<kProbeCorr><<<1, kConsumerThreads, SmemPlan::kAlloc>>>(qkv_map, dout_map, s.NH, head, lambda,
                                                                                o_st, o_dpt, o_dk, o_corr, o_dv);
    cudaCheckLastError();
}
