/*
 * attention/cuda/hopper/kernel_keys128_gproj.cuh - the device code of gproj's Hopper key-major pass at head size 128: its constants, shared-memory plan,
 * per-step helpers and kernel template, in the including file's anonymous namespace. Included by
 * attention/cuda/hopper/attention_hopper_bwd128_gproj.cu (launch and entry points; the design, numerics and barrier protocol are in its
 * file comment) and by the kernel's lab dev/attention_lab/hopper_bwd128_gproj.cu (the layout probe, which runs the same helpers on one tile).
 *
 * Why a header: the probe is lab code and stays out of the production object, yet it must use the kernel's
 * own helpers and layout. One kernel object = one translation unit, each with its own hang-record pointer.
 */
#ifndef ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_GPROJ_CUH
#define ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_GPROJ_CUH

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

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_KERNEL_KEYS128_GPROJ_CUH */
