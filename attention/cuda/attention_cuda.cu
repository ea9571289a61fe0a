/*
 * attention/cuda/attention_cuda.cu - causal flash attention on tensor cores for the
 * four numerical modes of attention/attention.h (fp32, bf16, repair, gproj).
 *
 * Why: the project asks what the BF16 rounding inside a fused attention
 * kernel does to training. So these kernels are a FlashAttention-2 style
 * implementation (mma.sync BF16 operands, FP32 accumulation, online softmax,
 * no T x T matrix in memory, Q/K/V read in place from the fused qkv buffer)
 * whose rounding points follow docs/attention_numerics.md exactly, with the
 * mode as a template parameter picked at run time by the host dispatch.
 * docs/attention_kernels.md describes the kernels and their measured cost.
 *
 * Kernels (one launch each, per call):
 *   forward    grid (query tiles of 128, B*NH), 8 warps x 16 query rows; K/V
 *              tiles of 64 keys double-buffered with cp.async (also the tile
 *              of repair's optional tile-max shift arm).
 *              bf16:   x = fma(S, c, -fl(m*c)) (explicit __fmaf_rn), stats {LSE, 0}
 *              others: x = (S - m) * c, stats {m, l}
 *              P V:    bf(e) as the A operand; fp32 mode adds bf(e - bf(e)).
 *   bwd_prep   one warp per row: zeroes the fp32 dQ accumulator (not in gproj
 *              mode, whose row pass computes dQ), D = dO . O from the stored
 *              BF16 O (all modes but fp32; in the sum order of attn_row_d.cuh,
 *              which gproj's Hopper row pass forms it in, so that chain runs
 *              no prep kernel).
 *   bwd_rows   (fp32 and gproj only) query-major pass over the row, 4 warps x
 *              16 query rows, S and dP on tensor cores:
 *              fp32:  D_i = sum_j P_ij dP_ij in FP32 (no BF16 O in D);
 *              gproj: lambda_i = r_i / p_i with r_i = sum_j bf(dS_ij),
 *                     p_i = sum_j bf(P_ij) - the whole-row sums that the dK
 *                     correction needs before any key tile is finished - and
 *                     all of dQ: DSK_i = sum_j bf(dS_ij) K_j and
 *                     PK_i = sum_j bf(P_ij) K_j (two more GEMMs, P and dS from
 *                     registers), dQ_i = bf(s (DSK_i - lambda_i PK_i)).
 *   backward   grid (key tiles of 128, B*NH), 8 warps x 16 keys; loops over
 *              query tiles (64 rows for HS 64, 32 for HS 128, double-buffered):
 *              S^T, dP^T, P, dS in registers; dV += bf(P)^T dO,
 *              dK += bf(dS)^T Q (gproj: + bf(-lambda P)^T Q); except in gproj
 *              mode bf(dS) goes through shared memory into dQ += bf(dS) K,
 *              atomically added (float2 atomics on sm_90) to the fp32
 *              accumulator.
 *   bwd_dq     dQ = bf(s * accumulator) into dqkv (not gproj).
 *   deterministic backward (AttnOptions.deterministic, not gproj): the
 *              accumulator is one FP32 slice per 128-key block, zeroed by
 *              bwd_zero_dq_slices where it is added to; every key-major
 *              kernel (here and the Hopper ones) adds into its key block's
 *              slice only, and bwd_dq_slices sums the slices in key-block
 *              order into dQ (see that section, docs/determinism.md).
 * gproj's dQ_i = s (sum_j bf(dS_ij) K_j - lambda_i sum_j bf(P_ij) K_j) is the
 * definition of docs/attention_numerics.md up to the order of the FP32 sums:
 * both sums run over the row in the row pass, key tile after key tile, and
 * are combined once at the end: no partials, no atomics, so gproj's backward
 * is deterministic as it stands (docs/determinism.md).
 * fp32 mode splits every FP32 operand (P, dS) into BF16 hi + lo, so each
 * product is exact up to 2^-17 relative and the FP32 accumulation does the
 * rest; in the dQ GEMM dS gets a third term (24 bits), see there.
 * Fragments come from shared memory through ldmatrix (attention/cuda/mma_bf16.cuh).
 *
 * Which forward runs where (attention_forward_cuda, host section below): on a
 * compute-capability 9.0 device (H100/H200) the Hopper wgmma + TMA forward of
 * attention/cuda/hopper/attention_hopper.cu (compiled for sm_90a only, always linked) for
 * every mode but repair's tile-max-shift arm; on every other device, for that
 * arm and whenever AttnOptions.force_portable is set, the mma.sync forward
 * here. Every BF16 pointer must be 16-byte aligned (both calls refuse others). Same out (to
 * about one BF16 ulp: 128- vs 64-key tiles, sum order) and same stats, so the
 * backward does not care which ran. Nothing is printed per call;
 * attention_forward_cuda_path tells which one a call takes.
 * Which backward runs where (attention_backward_cuda): prep (but not in gproj's
 * Hopper chain) and bwd_dq always here; on sm_90 at HS 64 and 128 (not force_portable) the Hopper wgmma chain
 * of the mode takes the place of the passes between
 * (attention/cuda/hopper/attention_hopper_bwd.cuh: attention_hopper_bwd_supports
 * asked once per call, attention_backward_hopper run with the mode still a
 * run-time value; same rounding points, FP32 sum order only): in bf16 and
 * repair mode (not the shift arm) the key-major pass for attn_bwd_kernel, in
 * fp32 and gproj mode the row pass for attn_bwd_rows_kernel, then the mode's
 * key-major pass for attn_bwd_kernel<HS, MODE> (reading the D and lambda slots
 * the prep kernel and the row pass wrote); the table of these chains is
 * attention_hopper_bwd_dispatch.cu's. Everywhere else the kernels here, whose
 * mode becomes a template argument in backward_launch's portable branch.
 * attention_backward_cuda_path tells which.
 */
#include <math.h>
#include <stdint.h>
#include <type_traits>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention_cuda.cuh"
#include "attention/cudnn/attention_cudnn.cuh"
#include "attention/cuda/tile_order.cuh"
#include "attention/cuda/hopper/attention_hopper.cuh"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/mma_bf16.cuh"
#include "attention/cuda/attn_row_d.cuh"
#include "attention/cuda/mode_scalars.cuh"
#include "attention/cuda/mode_dispatch.cuh"
#include "attention/cuda/launch_overlap.cuh"

using namespace attn_mma;

namespace {

constexpr int kThreads = 128; /* 4 warps */
constexpr int kPad = 8;       /* BF16 elements of padding per shared-memory row */
constexpr int kKeyTile = 64;  /* keys per tile everywhere (also the tile-shift tile) */
constexpr int kFwdQueryTile = 128; /* forward: 8 warps x 16 query rows share each K/V tile */
constexpr int kFwdThreads = 2 * kFwdQueryTile;
constexpr int kRowsQueryTile = 64; /* bwd row pass: 4 warps x 16 query rows */
constexpr int kBwdKeyTile = 128; /* backward: 8 warps x 16 keys share each Q/dO tile and its dQ atomics */
constexpr int kBwdThreads = 2 * kBwdKeyTile;
constexpr int kBwdWarps = kBwdThreads / 32;
constexpr int kDqCols = 32;   /* head dims per dQ work unit in the backward */

static_assert(kKeyTile == ATTN_SHIFT_TILE_KEYS, "the GPU key tile must be the tile-max-shift tile");

/* Query tile of the backward: smaller for HS 128 so dK and dV accumulators
   (2 x 16 x HS fp32 per warp) and the S/dP tiles fit in registers. */
template <int HS> struct BwdTile { static constexpr int kQueries = (HS == 64) ? 64 : 32; };
/* Where dQ is computed: gproj's row pass computes it whole (it has the whole rows); the other
   modes in the key-major backward, from BF16 dS tiles staged in shared memory: bf(dS), and in
   fp32 mode the two further BF16 terms of dS. */
template <int MODE> struct BwdDsTiles {
    static constexpr bool kDqHere = (MODE != ATTN_GPROJ);
    static constexpr int kTiles = (MODE == ATTN_FP32) ? 3 : kDqHere ? 1 : 0;
};

/* The query-major loops over key tiles (forward, gproj/fp32 row pass) keep K and V double-buffered:
   start copying tile kt+1 into the other buffer, then wait until tile kt has landed (the caller's
   __syncthreads makes it visible to every warp). */
template <int BK, int HS, int LD, int THREADS>
__device__ __forceinline__ void next_kv_tile_async(bf16* k_s, bf16* v_s, const bf16* k_base, const bf16* v_base,
                                                   long long qkv_row, int kt, int n_key_tiles, int T, int tid) {
    if (kt + 1 < n_key_tiles) {
        const int nb = (kt + 1) & 1;
        load_rows_async<BK, HS, LD, THREADS>(k_s + nb * BK * LD, k_base, qkv_row, (kt + 1) * BK, T, tid);
        load_rows_async<BK, HS, LD, THREADS>(v_s + nb * BK * LD, v_base, qkv_row, (kt + 1) * BK, T, tid);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

/* dst[0] += v0, dst[1] += v1 in global memory (8-byte aligned): one vector
   atomic on sm_90, two scalar ones before it. */
__device__ __forceinline__ void atomic_add_pair(float* dst, float v0, float v1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2*>(dst), make_float2(v0, v1));
#else
    atomicAdd(dst, v0);
    atomicAdd(dst + 1, v1);
#endif
}

/* ------------------------------------------------------------------------ */
/* forward                                                                  */
/* ------------------------------------------------------------------------ */
template <int HS, int MODE>
__global__ void __launch_bounds__(kFwdThreads) attn_fwd_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ out,
                                                            float* __restrict__ stats, int NH, int T, float scale,
                                                            float c, int tile_max_shift, int section) {
    constexpr int BQ = kFwdQueryTile, BK = kKeyTile, LD = HS + kPad;
    constexpr int KSTEPS = HS / 16, NT_S = BK / 8, NT_O = HS / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* q_s = reinterpret_cast<bf16*>(smem_raw);
    bf16* k_s = q_s + BQ * LD;     /* 2 buffers */
    bf16* v_s = k_s + 2 * BK * LD; /* 2 buffers */

    const AttnTileOrder order = attn_tile_longest_first(section); /* longest rows first, per section */
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long qkv_row = 3LL * NH * HS;
    const bf16* q_base = qkv + (long long)b * T * qkv_row + (long long)h * HS;
    const bf16* k_base = q_base + (long long)NH * HS;
    const bf16* v_base = q_base + 2LL * NH * HS;
    const int q0 = q_tile * BQ;
    /* causal: keys up to the tile's last row (and no further than T) */
    const int last_row = min(q0 + BQ, T) - 1;
    const int n_key_tiles = last_row / BK + 1;
    const int warp_row0 = q0 + warp * 16; /* first query row of this warp */

    load_rows_async<BQ, HS, LD, kFwdThreads>(q_s, q_base, qkv_row, q0, T, tid);
    load_rows_async<BK, HS, LD, kFwdThreads>(k_s, k_base, qkv_row, 0, T, tid);
    load_rows_async<BK, HS, LD, kFwdThreads>(v_s, v_base, qkv_row, 0, T, tid);
    cp_async_commit();

    uint32_t qf[KSTEPS][4];
    float o[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_part[2] = {0.f, 0.f}; /* this lane's part of the row sum */

    for (int kt = 0; kt < n_key_tiles; kt++) {
        next_kv_tile_async<BK, HS, LD, kFwdThreads>(k_s, v_s, k_base, v_base, qkv_row, kt, n_key_tiles, T, tid);
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) ldsm_a<LD>(qf[kk], q_s, warp * 16, kk * 16, lane);
        }
        if (kt * BK > warp_row0 + 15) { /* every key of this tile is in the future of all 16 rows */
            __syncthreads();
            continue;
        }
        const bf16* kb = k_s + (kt & 1) * BK * LD;
        const bf16* vb = v_s + (kt & 1) * BK * LD;

        /* S = Q K^T, 16 rows x 64 keys per warp */
        float s[NT_S][4];
#pragma unroll
        for (int j = 0; j < NT_S; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
#pragma unroll
            for (int j = 0; j < NT_S; j += 2) {
                uint32_t bb[4];
                ldsm_b_nk_x2<LD>(bb, kb, j * 8, kk * 16, lane);
                mma_16816_x2(s[j], s[j + 1], qf[kk], bb);
            }
        }
        if ((kt + 1) * BK - 1 > warp_row0) { /* a tile on the diagonal: key j visible to query i iff j <= i */
#pragma unroll
            for (int j = 0; j < NT_S; j++)
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int key = kt * BK + j * 8 + 2 * t + e;
                        const int query = warp_row0 + g + 8 * r;
                        if (key > query) s[j][2 * r + e] = -INFINITY;
                    }
        }
        /* online softmax, per row r (rows g and g+8 of the warp's slice) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT_S; j++) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = quad_max(mx);
            float tile_max = mx; /* BK = ATTN_SHIFT_TILE_KEYS keys aligned at key 0: the shift arm's tile */
            if (MODE == ATTN_REPAIR && tile_max_shift) {
                /* Qiu & Yao tile-max shift: a tile whose max is tied by another score uses 2m~ (m~ > 0) or 0 */
                float ties = 0.f;
#pragma unroll
                for (int j = 0; j < NT_S; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) ties += ((mx - s[j][2 * r + e]) * scale <= ATTN_SHIFT_TIE_TOL) ? 1.f : 0.f;
                if (quad_sum(ties) >= 2.f) tile_max = (mx > 0.f) ? 2.f * mx : 0.f;
            }
            const float m_new = fmaxf(m_run[r], tile_max);
            const float alpha = exp2f((m_run[r] - m_new) * c); /* 0 on the first tile */
            const float m_c = m_new * c;                       /* fl(m * c), bf16 mode */
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NT_S; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float sc = s[j][2 * r + e];
                    const float x = forward_exponent<MODE>(sc, c, m_c, m_new);
                    const float p = exp2f(x);
                    s[j][2 * r + e] = p;
                    sum += p;
                }
            l_part[r] = l_part[r] * alpha + sum;
            m_run[r] = m_new;
#pragma unroll
            for (int n = 0; n < NT_O; n++) {
                o[n][2 * r] *= alpha;
                o[n][2 * r + 1] *= alpha;
            }
        }
        /* O += bf(e) V (fp32 mode: + bf(e - bf(e)) V) */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[4], a_lo[4];
            pack_a_from_c(a, s[2 * kk], s[2 * kk + 1]);
            if (MODE == ATTN_FP32) {
                pack_a_residual_from_c(a_lo, s[2 * kk], s[2 * kk + 1]);
            }
#pragma unroll
            for (int n = 0; n < NT_O; n += 2) {
                uint32_t bb[4];
                ldsm_b_kn_x2<LD>(bb, vb, kk * 16, n * 8, lane);
                mma_16816_x2(o[n], o[n + 1], a, bb);
                if (MODE == ATTN_FP32) {
                    mma_16816_x2(o[n], o[n + 1], a_lo, bb);
                }
            }
        }
        __syncthreads(); /* the next iteration's copy overwrites this buffer */
    }

    /* O = bf(acc / l); stats */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float l = quad_sum(l_part[r]);
        const int query = q0 + warp * 16 + g + 8 * r;
        if (query >= T) continue;
        bf16* orow = out + ((long long)b * T + query) * NH * HS + (long long)h * HS;
#pragma unroll
        for (int n = 0; n < NT_O; n++) {
            const uint32_t v = pack_bf16x2(__fdiv_rn(o[n][2 * r], l), __fdiv_rn(o[n][2 * r + 1], l));
            *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * t) = v;
        }
        if (t == 0) {
            float* st = stats + ((long long)bh * T + query) * 2;
            forward_row_stats<MODE>(st, m_run[r], l, scale); /* bf16: LSE in natural-log, scaled units */
        }
    }
}

/* ------------------------------------------------------------------------ */
/* backward: prep (zero dQ accumulator; D from the stored BF16 O)            */
/* ------------------------------------------------------------------------ */
/* HS / 8 lanes per row: each lane loads 8 BF16 of O and of dO with one 16-byte load each and zeroes 8
   accumulator floats with two float4 stores; 256 threads = 256 * 8 / HS rows per block, the head from
   blockIdx.y (no 64-bit division per row). out and dout are 16-byte aligned (attention_backward_cuda
   checks). 16-byte loads keep enough bytes in flight to stream O and dO at full bandwidth (one warp per row
   with 4-byte loads does not). The FP32 sum order of D is free (docs/attention_numerics.md). */
constexpr int kPrepThreads = 256;
template <int HS>
__global__ void __launch_bounds__(kPrepThreads) attn_bwd_prep_kernel(const bf16* __restrict__ out,
                                                                        const bf16* __restrict__ dout,
                                                                        float* __restrict__ D,
                                                                        float* __restrict__ dq_acc, int NH, int T,
                                                                        int zero_dq, int want_D) {
    constexpr int kLanesPerRow = HS / 8, kRowsPerBlock = kPrepThreads / kLanesPerRow;
    static_assert(32 % kLanesPerRow == 0, "a row's lanes must sit in one warp (the shuffle below)");
    let_next_grid_launch(); /* the key-major pass may take its place on the SMs and wait there (launch_overlap.cuh) */
    const int tok = blockIdx.x * kRowsPerBlock + threadIdx.x / kLanesPerRow;
    const int d = (threadIdx.x % kLanesPerRow) * 8, bh = blockIdx.y;
    const bool active = tok < T; /* no early return: whole warps take part in the shuffle */
    const long long row = (long long)bh * T + tok;
    if (active && zero_dq) {
        float4* acc = reinterpret_cast<float4*>(dq_acc + row * HS + d);
        acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (!want_D) return; /* uniform over the grid */
    float sum = 0.f; /* the sum order of attn_row_d.cuh: one pack per lane, then the butterfly */
    if (active) {
        const int b = bh / NH, h = bh % NH;
        const long long off = ((long long)b * T + tok) * NH * HS + (long long)h * HS + d;
        sum = attn_row_d_pack(__ldg(reinterpret_cast<const uint4*>(out + off)),
                              __ldg(reinterpret_cast<const uint4*>(dout + off)), 0.f);
    }
#pragma unroll
    for (int k = kLanesPerRow / 2; k >= 1; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
    if (active && d == 0) D[row] = sum;
}

/* ------------------------------------------------------------------------ */
/* backward: whole-row pass (fp32: D = sum P dP; gproj: lambda = r / p)      */
/* ------------------------------------------------------------------------ */
template <int HS, int MODE>
__global__ void __launch_bounds__(kThreads) attn_bwd_rows_kernel(const bf16* __restrict__ qkv,
                                                                 const bf16* __restrict__ dout,
                                                                 const float* __restrict__ stats,
                                                                 float* __restrict__ D, float* __restrict__ lambda,
                                                                 bf16* __restrict__ dqkv, int NH, int T, float scale,
                                                                 float c, int section) {
    constexpr int BQ = kRowsQueryTile, BK = kKeyTile, LD = HS + kPad;
    constexpr int KSTEPS = HS / 16, NT_S = BK / 8, NT_O = HS / 8;
    /* Q and dO fragments stay in registers across key tiles, except where gproj's two HS-wide dQ
       accumulators need those registers (HS 128): there they are reloaded from shared memory per tile */
    constexpr bool kHoldFrags = !(MODE == ATTN_GPROJ && HS == 128);
    /* ... and there the S and dP accumulators cover half a key tile at a time (H200, B2 H16 T4096:
       halves 2.65 ms bwd with a 12-byte spill; quarters 2.78 ms, no spill but twice the fragment
       reloads; whole tiles spill ~400 bytes) */
    constexpr int KSPLIT = (MODE == ATTN_GPROJ && HS == 128) ? 2 : 1, NT_SUB = NT_S / KSPLIT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* q_s = reinterpret_cast<bf16*>(smem_raw);
    bf16* do_s = q_s + BQ * LD;
    bf16* k_s = do_s + BQ * LD;    /* 2 buffers */
    bf16* v_s = k_s + 2 * BK * LD; /* 2 buffers */

    const AttnTileOrder order = attn_tile_longest_first(section);
    const int q_tile = gridDim.x - 1 - order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long qkv_row = 3LL * NH * HS, out_row = (long long)NH * HS;
    const bf16* q_base = qkv + (long long)b * T * qkv_row + (long long)h * HS;
    const bf16* k_base = q_base + (long long)NH * HS;
    const bf16* v_base = q_base + 2LL * NH * HS;
    const bf16* do_base = dout + (long long)b * T * out_row + (long long)h * HS;
    const int q0 = q_tile * BQ;
    const int n_key_tiles = q_tile + 1;

    load_rows_async<BQ, HS, LD, kThreads>(q_s, q_base, qkv_row, q0, T, tid);
    load_rows_async<BQ, HS, LD, kThreads>(do_s, do_base, out_row, q0, T, tid);
    load_rows_async<BK, HS, LD, kThreads>(k_s, k_base, qkv_row, 0, T, tid);
    load_rows_async<BK, HS, LD, kThreads>(v_s, v_base, qkv_row, 0, T, tid);
    cp_async_commit();

    /* per-row state of rows g, g+8 of this warp's slice */
    float row_m[2], row_l[2], row_D[2]; /* m, 1/l (bf16 mode: fl(LSE log2 e), unused), D */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int query = q0 + warp * 16 + g + 8 * r;
        const long long idx = (long long)bh * T + (query < T ? query : 0);
        row_m[r] = row_state_a<MODE>(stats[idx * 2]);
        row_l[r] = row_state_b<MODE>(stats[idx * 2 + 1]); /* fl(1 / l) */
        row_D[r] = (MODE == ATTN_GPROJ) ? D[idx] : 0.f;
    }
    float acc_a[2] = {0.f, 0.f}; /* fp32: sum P dP; gproj: r = sum bf(dS) */
    float acc_b[2] = {0.f, 0.f}; /* gproj: p = sum bf(P) */
    /* gproj, rows g and g+8: DSK_i = sum_j bf(dS_ij) K_j and PK_i = sum_j bf(P_ij) K_j; at the end
       dQ_i = s (DSK_i - lambda_i PK_i) */
    float dsk[NT_O][4], pk[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dsk[n][e] = pk[n][e] = 0.f;

    uint32_t qf[KSTEPS][4], dof[KSTEPS][4];
    for (int kt = 0; kt < n_key_tiles; kt++) {
        next_kv_tile_async<BK, HS, LD, kThreads>(k_s, v_s, k_base, v_base, qkv_row, kt, n_key_tiles, T, tid);
        __syncthreads();
        if (kHoldFrags && kt == 0) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
                ldsm_a<LD>(qf[kk], q_s, warp * 16, kk * 16, lane);
                ldsm_a<LD>(dof[kk], do_s, warp * 16, kk * 16, lane);
            }
        }
        const bf16* kb = k_s + (kt & 1) * BK * LD;
        const bf16* vb = v_s + (kt & 1) * BK * LD;
        /* the key tile in KSPLIT sub-tiles, one after the other (the same keys in the same order) */
#pragma unroll 1
        for (int sub = 0; sub < KSPLIT; sub++) {
            const int sub_key0 = sub * (BK / KSPLIT);
            float s[NT_SUB][4], dp[NT_SUB][4];
#pragma unroll
            for (int j = 0; j < NT_SUB; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
                uint32_t qa[4], doa[4];
                if (kHoldFrags) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        qa[e] = qf[kk][e];
                        doa[e] = dof[kk][e];
                    }
                } else {
                    ldsm_a<LD>(qa, q_s, warp * 16, kk * 16, lane);
                    ldsm_a<LD>(doa, do_s, warp * 16, kk * 16, lane);
                }
#pragma unroll
                for (int j = 0; j < NT_SUB; j += 2) {
                    uint32_t bb[4];
                    ldsm_b_nk_x2<LD>(bb, kb, sub_key0 + j * 8, kk * 16, lane);
                    mma_16816_x2(s[j], s[j + 1], qa, bb);
                    ldsm_b_nk_x2<LD>(bb, vb, sub_key0 + j * 8, kk * 16, lane);
                    mma_16816_x2(dp[j], dp[j + 1], doa, bb);
                }
            }
            /* the mask only where it can bite: tiles before the block's diagonal tile, in a query tile that
               lies wholly before T, see every score (the same values and sums either way) */
            auto row_sums = [&](auto masked_tag) {
                constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
                for (int j = 0; j < NT_SUB; j++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int key = kt * BK + sub_key0 + j * 8 + 2 * t + e;
                            const int query = q0 + warp * 16 + g + 8 * r;
                            float p = 0.f, ds = 0.f; /* masked: exactly 0 (gproj's GEMM operands below) */
                            if (!kMasked || (key <= query && query < T)) {
                                p = recompute_prob<MODE>(s[j][2 * r + e], row_m[r], row_l[r], c);
                                const float dpv = dp[j][2 * r + e];
                                if (MODE == ATTN_FP32) {
                                    acc_a[r] += p * dpv;
                                } else {
                                    ds = p * (dpv - row_D[r]);
                                    acc_a[r] += __bfloat162float(__float2bfloat16_rn(ds));
                                    acc_b[r] += __bfloat162float(__float2bfloat16_rn(p));
                                }
                            }
                            s[j][2 * r + e] = p;
                            dp[j][2 * r + e] = ds;
                        }
            };
            if (kt < q_tile && q0 + BQ <= T) row_sums(std::false_type{});
            else row_sums(std::true_type{});
            if (MODE == ATTN_GPROJ) {
                /* DSK += bf(dS) K and PK += bf(P) K: dS and P repacked from the C fragments as A operands,
                   K as the [key][dim] B operand (the forward's P V with K in place of V) */
#pragma unroll
                for (int kk = 0; kk < NT_SUB / 2; kk++) {
                    uint32_t ap[4], ads[4];
                    pack_a_from_c(ap, s[2 * kk], s[2 * kk + 1]);
                    pack_a_from_c(ads, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                    for (int n = 0; n < NT_O; n += 2) {
                        uint32_t bb[4];
                        ldsm_b_kn_x2<LD>(bb, kb, sub_key0 + kk * 16, n * 8, lane);
                        mma_16816_x2(dsk[n], dsk[n + 1], ads, bb);
                        mma_16816_x2(pk[n], pk[n + 1], ap, bb);
                    }
                }
            }
        }
        __syncthreads();
    }
    float row_lambda[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float a = quad_sum(acc_a[r]); /* every lane of the quad gets the whole-row sums */
        const float p = quad_sum(acc_b[r]);
        row_lambda[r] = gproj_lambda(a, p);
        const int query = q0 + warp * 16 + g + 8 * r;
        if (t != 0 || query >= T) continue;
        const long long idx = (long long)bh * T + query;
        if (MODE == ATTN_FP32) D[idx] = a;
        else lambda[idx] = row_lambda[r];
    }
    if (MODE == ATTN_GPROJ) {
        /* dQ_i = bf(s * (DSK_i - lambda_i PK_i)), the combination in one FP32 fma per element, into
           the q slot of dqkv (the main kernel writes only the k and v slots in gproj mode) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lam = row_lambda[r];
            const int query = q0 + warp * 16 + g + 8 * r;
            if (query >= T) continue;
            bf16* dq_row = dqkv + ((long long)b * T + query) * qkv_row + (long long)h * HS + 2 * t;
#pragma unroll
            for (int n = 0; n < NT_O; n++) {
                const float v0 = __fmaf_rn(-lam, pk[n][2 * r], dsk[n][2 * r]);
                const float v1 = __fmaf_rn(-lam, pk[n][2 * r + 1], dsk[n][2 * r + 1]);
                *reinterpret_cast<uint32_t*>(dq_row + n * 8) = pack_bf16x2(v0 * scale, v1 * scale);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* backward: main kernel, key-major                                          */
/* ------------------------------------------------------------------------ */
/* DQ_SLICES: the deterministic backward (docs/determinism.md): dq_acc is [ceil(T / kBwdKeyTile)][B*NH*T][HS] and
   this key tile adds into slice k_tile alone, which no other CTA touches (one add per element onto zero). */
template <int HS, int MODE, bool DQ_SLICES>
__global__ void __launch_bounds__(kBwdThreads) attn_bwd_kernel(const bf16* __restrict__ qkv,
                                                            const bf16* __restrict__ dout,
                                                            const float* __restrict__ stats,
                                                            const float* __restrict__ D,
                                                            const float* __restrict__ lambda,
                                                            float* __restrict__ dq_acc, bf16* __restrict__ dqkv,
                                                            int NH, int T, float scale, float c, int section) {
    constexpr int BK = kBwdKeyTile, BQ = BwdTile<HS>::kQueries, LD = HS + kPad, LDQ = BQ + kPad;
    constexpr int KSTEPS = HS / 16, NT_Q = BQ / 8, NT_D = HS / 8;
    constexpr int kDsTiles = BwdDsTiles<MODE>::kTiles;
    constexpr bool kDqHere = BwdDsTiles<MODE>::kDqHere;
    static_assert(BQ <= kBwdThreads, "one thread per query row stages the row state");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* k_s = reinterpret_cast<bf16*>(smem_raw);
    bf16* v_s = k_s + BK * LD;
    bf16* q_s = v_s + BK * LD;      /* 2 buffers */
    bf16* do_s = q_s + 2 * BQ * LD; /* 2 buffers */
    /* bf(dS) as [key][query] (not gproj: no dQ here), the layout of the registers (a thread holds two
       neighbouring queries of one key, stored as one 32-bit word); the dQ GEMM reads it back
       transposed (ldsm_a_t) */
    bf16* ds_s = do_s + 2 * BQ * LD;
    bf16* x_s = ds_s + BK * LDQ;     /* fp32 only: bf(dS - bf(dS)) */
    bf16* x2_s = x_s + BK * LDQ;     /* fp32 only: the third BF16 term of dS */
    /* per query row, 2 buffers: {fl(LSE log2 e) (bf16) or m, 1 (bf16) or fl(1/l), D, lambda (gproj)} */
    float4* row_state = reinterpret_cast<float4*>(ds_s + kDsTiles * BK * LDQ);

    const AttnTileOrder order = attn_tile_longest_first(section); /* key tile 0 sees every query: first */
    const int k_tile = order.rank;
    const int bh = order.bh, b = bh / NH, h = bh % NH;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long qkv_row = 3LL * NH * HS, out_row = (long long)NH * HS;
    const bf16* q_base = qkv + (long long)b * T * qkv_row + (long long)h * HS;
    const bf16* k_base = q_base + (long long)NH * HS;
    const bf16* v_base = q_base + 2LL * NH * HS;
    const bf16* do_base = dout + (long long)b * T * out_row + (long long)h * HS;
    const int k0 = k_tile * BK;
    const int qt_begin = k0 / BQ;
    const int qt_end = (T + BQ - 1) / BQ;
    const int warp_key0 = k0 + warp * 16; /* first of this warp's 16 keys */

    /* The row state of query tile qt as stored in memory (thread tid < BQ: row qt*BQ + tid; rows past
       T get values that leave their masked P at 0). Loaded one tile ahead into registers and only
       stored to shared memory (store_row_state) after the current tile's work, so the load latency
       hides behind it instead of holding every warp at the next barrier. */
    auto fetch_row_state = [&](int qt) {
        float4 raw = make_float4(0.f, 1.f, 0.f, 0.f);
        const int query = qt * BQ + tid;
        if (tid < BQ && query < T) {
            const long long idx = (long long)bh * T + query;
            raw.x = stats[idx * 2];
            if (MODE != ATTN_BF16) raw.y = stats[idx * 2 + 1];
            raw.z = D[idx];
            if (MODE == ATTN_GPROJ) raw.w = lambda[idx];
        }
        return raw;
    };
    auto store_row_state = [&](float4 raw, int buf) {
        if (tid < BQ) {
            float4 st;
            st.x = row_state_a<MODE>(raw.x); /* fl(LSE * log2 e) or m */
            st.y = row_state_b<MODE>(raw.y); /* 1 or fl(1 / l) */
            st.z = raw.z;
            st.w = raw.w;
            row_state[buf * BQ + tid] = st;
        }
    };
    auto stage_query_tile = [&](int qt, int buf) {
        load_rows_async<BQ, HS, LD, kBwdThreads>(q_s + buf * BQ * LD, q_base, qkv_row, qt * BQ, T, tid);
        load_rows_async<BQ, HS, LD, kBwdThreads>(do_s + buf * BQ * LD, do_base, out_row, qt * BQ, T, tid);
    };

    load_rows_async<BK, HS, LD, kBwdThreads>(k_s, k_base, qkv_row, k0, T, tid);
    load_rows_async<BK, HS, LD, kBwdThreads>(v_s, v_base, qkv_row, k0, T, tid);
    stage_query_tile(qt_begin, 0);
    cp_async_commit();
    store_row_state(fetch_row_state(qt_begin), 0);

    float dk[NT_D][4], dv[NT_D][4];
#pragma unroll
    for (int n = 0; n < NT_D; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.f;

    for (int qt = qt_begin; qt < qt_end; qt++) {
        const int buf = (qt - qt_begin) & 1;
        const bool has_next = qt + 1 < qt_end;
        float4 next_raw = make_float4(0.f, 1.f, 0.f, 0.f);
        if (has_next) {
            stage_query_tile(qt + 1, buf ^ 1);
            cp_async_commit();
            next_raw = fetch_row_state(qt + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int q0 = qt * BQ;
        const bf16* qb = q_s + buf * BQ * LD;
        const bf16* dob = do_s + buf * BQ * LD;
        const float4* rs = row_state + buf * BQ;

        /* S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x BQ queries per warp */
        float st[NT_Q][4], dpt[NT_Q][4];
#pragma unroll
        for (int j = 0; j < NT_Q; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            uint32_t ak[4], av[4];
            ldsm_a<LD>(ak, k_s, warp * 16, kk * 16, lane);
            ldsm_a<LD>(av, v_s, warp * 16, kk * 16, lane);
#pragma unroll
            for (int j = 0; j < NT_Q; j += 2) {
                uint32_t bb[4];
                ldsm_b_nk_x2<LD>(bb, qb, j * 8, kk * 16, lane);
                mma_16816_x2(st[j], st[j + 1], ak, bb);
                ldsm_b_nk_x2<LD>(bb, dob, j * 8, kk * 16, lane);
                mma_16816_x2(dpt[j], dpt[j + 1], av, bb);
            }
        }
        /* P and dS in registers (st <- P, dpt <- dS); masked entries exactly 0. The mask is only
           evaluated where it can bite: a warp whose 16 keys all precede the tile's first query, in a
           tile that lies wholly before T, sees every score (the same values either way). */
        auto probs_and_grads = [&](auto masked_tag) {
            constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
            for (int j = 0; j < NT_Q; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int ql = j * 8 + 2 * t + e;
                    const float4 row = rs[ql];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int key = warp_key0 + g + 8 * r;
                        const int query = q0 + ql;
                        float p = 0.f, ds = 0.f;
                        if (!kMasked || (key <= query && query < T)) {
                            p = recompute_prob<MODE>(st[j][2 * r + e], row.x, row.y, c);
                            ds = p * (dpt[j][2 * r + e] - row.z);
                        }
                        st[j][2 * r + e] = p;
                        dpt[j][2 * r + e] = ds;
                    }
                }
        };
        if (warp_key0 + 15 <= q0 && q0 + BQ <= T) probs_and_grads(std::false_type{});
        else probs_and_grads(std::true_type{});

        /* dV += bf(P)^T dO ; dK += bf(dS)^T Q (+ gproj's bf(-lambda P)^T Q); the packed bf(dS) (and
           fp32's further terms) also go to shared memory as [key][query] for the dQ GEMM */
        bf16* ds_row = ds_s + (warp * 16 + g) * LDQ + 2 * t; /* key g of this warp, query 2t; key g+8: + 8 LDQ */
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            const int j0 = 2 * kk, j1 = 2 * kk + 1;
            uint32_t ap[4], ads[4], ap_lo[4], ads_lo[4], alp[4];
            pack_a_from_c(ap, st[j0], st[j1]);
            pack_a_from_c(ads, dpt[j0], dpt[j1]);
            if (kDqHere) store_a_words<LDQ>(ds_row, j0, j1, ads); /* [key][query]: key g (+8), queries 8 j + 2t.. */
            if (MODE == ATTN_FP32) {
                pack_a_residual_from_c(ap_lo, st[j0], st[j1]);
                float r1[2][4]; /* dS - bf(dS) of this k-step's two n-tiles */
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    r1[0][e] = bf16_residual(dpt[j0][e]);
                    r1[1][e] = bf16_residual(dpt[j1][e]);
                }
                pack_a_from_c(ads_lo, r1[0], r1[1]);
                /* three BF16 terms (24 significant bits) for dQ: it sums dS against keys that may share a
                   large common offset, so the split residual would leak like bf16 mode's rounding */
                bf16* x_row = x_s + (ds_row - ds_s);
                bf16* x2_row = x2_s + (ds_row - ds_s);
                store_a_words<LDQ>(x_row, j0, j1, ads_lo);
                /* bf(r1 - bf(r1)), each word stored as it is made (packing all four first schedules differently) */
                *reinterpret_cast<uint32_t*>(x2_row + j0 * 8) =
                    pack_bf16x2(bf16_residual(r1[0][0]), bf16_residual(r1[0][1]));
                *reinterpret_cast<uint32_t*>(x2_row + 8 * LDQ + j0 * 8) =
                    pack_bf16x2(bf16_residual(r1[0][2]), bf16_residual(r1[0][3]));
                *reinterpret_cast<uint32_t*>(x2_row + j1 * 8) =
                    pack_bf16x2(bf16_residual(r1[1][0]), bf16_residual(r1[1][1]));
                *reinterpret_cast<uint32_t*>(x2_row + 8 * LDQ + j1 * 8) =
                    pack_bf16x2(bf16_residual(r1[1][2]), bf16_residual(r1[1][3]));
            }
            if (MODE == ATTN_GPROJ) {
                /* query columns of this thread: j*8 + 2t + {0,1}; lambda is per query */
                const float l00 = rs[j0 * 8 + 2 * t].w, l01 = rs[j0 * 8 + 2 * t + 1].w;
                const float l10 = rs[j1 * 8 + 2 * t].w, l11 = rs[j1 * 8 + 2 * t + 1].w;
                alp[0] = pack_bf16x2(-l00 * st[j0][0], -l01 * st[j0][1]);
                alp[1] = pack_bf16x2(-l00 * st[j0][2], -l01 * st[j0][3]);
                alp[2] = pack_bf16x2(-l10 * st[j1][0], -l11 * st[j1][1]);
                alp[3] = pack_bf16x2(-l10 * st[j1][2], -l11 * st[j1][3]);
            }
#pragma unroll
            for (int n = 0; n < NT_D; n += 2) {
                uint32_t bb[4];
                ldsm_b_kn_x2<LD>(bb, dob, kk * 16, n * 8, lane);
                mma_16816_x2(dv[n], dv[n + 1], ap, bb);
                if (MODE == ATTN_FP32) {
                    mma_16816_x2(dv[n], dv[n + 1], ap_lo, bb);
                }
                ldsm_b_kn_x2<LD>(bb, qb, kk * 16, n * 8, lane);
                mma_16816_x2(dk[n], dk[n + 1], ads, bb);
                if (MODE == ATTN_FP32) {
                    mma_16816_x2(dk[n], dk[n + 1], ads_lo, bb);
                }
                if (MODE == ATTN_GPROJ) {
                    mma_16816_x2(dk[n], dk[n + 1], alp, bb);
                }
            }
        }
        if (kDqHere) { /* (gproj's row pass computed dQ) */
            __syncthreads();

            /* dQ partial = bf(dS) K over this key tile */
            constexpr int ROW_BLOCKS = BQ / 16, UNITS = ROW_BLOCKS * (HS / kDqCols);
            for (int u = warp; u < UNITS; u += kBwdWarps) {
                const int ql0 = (u % ROW_BLOCKS) * 16;
                const int d0 = (u / ROW_BLOCKS) * kDqCols;
                float acc[kDqCols / 8][4];
#pragma unroll
                for (int n = 0; n < kDqCols / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[n][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) {
                    uint32_t a[4], a2[4], a3[4];
                    ldsm_a_t<LDQ>(a, ds_s, ql0, kk * 16, lane);
                    if (MODE == ATTN_FP32) {
                        ldsm_a_t<LDQ>(a2, x_s, ql0, kk * 16, lane);
                        ldsm_a_t<LDQ>(a3, x2_s, ql0, kk * 16, lane);
                    }
#pragma unroll
                    for (int n = 0; n < kDqCols / 8; n += 2) {
                        uint32_t bb[4];
                        ldsm_b_kn_x2<LD>(bb, k_s, kk * 16, d0 + n * 8, lane);
                        mma_16816_x2(acc[n], acc[n + 1], a, bb);
                        if (MODE == ATTN_FP32) {
                            mma_16816_x2(acc[n], acc[n + 1], a2, bb);
                            mma_16816_x2(acc[n], acc[n + 1], a3, bb);
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int ql = ql0 + g + 8 * r;
                    const int query = q0 + ql;
                    if (query >= T) continue;
                    float* dst = dq_acc + (DQ_SLICES ? (long long)k_tile * gridDim.y * T * HS : 0LL) +
                                 ((long long)bh * T + query) * HS + d0 + 2 * t;
#pragma unroll
                    for (int n = 0; n < kDqCols / 8; n++) atomic_add_pair(dst + n * 8, acc[n][2 * r], acc[n][2 * r + 1]);
                }
            }
        }
        if (has_next) store_row_state(next_raw, buf ^ 1); /* buf ^ 1 was last read before the previous barrier */
        __syncthreads(); /* ds_s, x_s and this buffer are rewritten next iteration */
    }

    /* dK = s * acc, dV = acc, for this warp's 16 keys */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = k0 + warp * 16 + g + 8 * r;
        if (key >= T) continue;
        bf16* dk_row = dqkv + ((long long)b * T + key) * qkv_row + (long long)NH * HS + (long long)h * HS;
        bf16* dv_row = dk_row + (long long)NH * HS;
#pragma unroll
        for (int n = 0; n < NT_D; n++) {
            *reinterpret_cast<uint32_t*>(dk_row + n * 8 + 2 * t) =
                pack_bf16x2(dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dv_row + n * 8 + 2 * t) = pack_bf16x2(dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

/* dQ = bf(s * accumulator) into the q slot of dqkv, 8 elements per thread (two float4 loads, one 16-byte
   store): grid (ceil(T * HS / 8 / 256), B*NH), 256 threads; dqkv 16-byte aligned (attention_backward_cuda
   checks). SLICED (the deterministic backward, below): dq_acc holds the slices, and the accumulator is
   slice 0 + slice 1 + ... + slice tok / kBwdKeyTile, added in that order. */
template <int HS, bool SLICED>
__global__ void attn_bwd_dq_kernel(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T,
                                   float scale) {
    constexpr int kChunks = HS / 8; /* 8-element chunks per row */
    wait_for_previous_grid(); /* launched with PDL on sm_90: the key-major pass's last reduce-adds have landed */
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; /* T * kChunks may pass 2^31 */
    if (i >= (long long)T * kChunks) return;
    const int tok = (int)(i / kChunks), d = (int)(i % kChunks) * 8;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const float4* src = reinterpret_cast<const float4*>(dq_acc + ((long long)bh * T + tok) * HS + d);
    float4 lo = src[0], hi = src[1];
    if constexpr (SLICED) {
        const long long slice_elems = (long long)gridDim.y * T * HS; /* one slice: B*NH*T*HS floats */
        const int last = tok / kBwdKeyTile; /* the query's own key block: the last that sees it */
        for (int kb = 1; kb <= last; kb++) {
            src += slice_elems / 4;
            const float4 l = src[0], u = src[1];
            lo.x += l.x; lo.y += l.y; lo.z += l.z; lo.w += l.w;
            hi.x += u.x; hi.y += u.y; hi.z += u.z; hi.w += u.w;
        }
    }
    const uint4 packed = make_uint4(pack_bf16x2(lo.x * scale, lo.y * scale), pack_bf16x2(lo.z * scale, lo.w * scale),
                                    pack_bf16x2(hi.x * scale, hi.y * scale), pack_bf16x2(hi.z * scale, hi.w * scale));
    *reinterpret_cast<uint4*>(dqkv + ((long long)b * T + tok) * 3LL * NH * HS + (long long)h * HS + d) = packed;
}

/* ------------------------------------------------------------------------ */
/* backward, deterministic: per-key-block dQ slices (docs/determinism.md)   */
/* ------------------------------------------------------------------------ */
/* The deterministic backward gives every key block kb (kBwdKeyTile = ATTN_BWD_KEY_BLOCK keys, the CTA of every
   key-major kernel) its own FP32 dQ accumulator, slice kb of slices [n_slices][B*NH][T][HS]. Key block kb adds
   into rows kb * kBwdKeyTile .. T-1 of its slice (queries before its first key see none of its keys), one add
   per element, so a slice holds the block's partial whatever the order of the blocks' adds. The post-pass
   (attn_bwd_dq_kernel<HS, true>) then sums the slices in key-block order. */

/* Zeroes rows kb * kBwdKeyTile .. T-1 of slice kb = blockIdx.z of every head (blockIdx.y), 8 floats per thread
   (two float4 stores; the workspace is 16-byte aligned and HS a multiple of 8): grid (ceil(T * HS / 8 / 256),
   B*NH, n_slices), 256 threads. The rows before kb * kBwdKeyTile are neither written nor read. */
template <int HS>
__global__ void attn_bwd_zero_dq_slices_kernel(float* __restrict__ slices, int T) {
    constexpr int kChunks = HS / 8; /* 8-element chunks per row */
    const long long chunk = (long long)blockIdx.x * blockDim.x + threadIdx.x + (long long)blockIdx.z * kBwdKeyTile * kChunks;
    if (chunk >= (long long)T * kChunks) return;
    const long long head = (long long)blockIdx.z * gridDim.y + blockIdx.y; /* slice kb, head bh */
    float4* dst = reinterpret_cast<float4*>(slices + head * T * HS + chunk * 8);
    dst[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    dst[1] = make_float4(0.f, 0.f, 0.f, 0.f);
}

/* ------------------------------------------------------------------------ */
/* host side                                                                */
/* ------------------------------------------------------------------------ */
template <int HS> constexpr size_t fwd_smem_bytes() { return (size_t)(kFwdQueryTile + 4 * kKeyTile) * (HS + kPad) * 2; }
template <int HS> constexpr size_t rows_smem_bytes() { return (size_t)(2 * kRowsQueryTile + 4 * kKeyTile) * (HS + kPad) * 2; }
template <int HS, int MODE> constexpr size_t bwd_smem_bytes() {
    return (size_t)(2 * kBwdKeyTile + 4 * BwdTile<HS>::kQueries) * (HS + kPad) * 2 +          /* K, V, 2x Q, dO */
           (size_t)BwdDsTiles<MODE>::kTiles * kBwdKeyTile * (BwdTile<HS>::kQueries + kPad) * 2 + /* dS terms */
           (size_t)2 * BwdTile<HS>::kQueries * sizeof(float4);                                 /* row state */
}

/* Workspace layout: dQ accumulator [dq_slices][B*NH*T*HS] fp32, D [B*NH*T], lambda [B*NH*T]. dq_slices is 1,
   or ceil(T / kBwdKeyTile) in the deterministic backward (dq_slices_for). */
struct Workspace {
    float* dq_acc;
    float* D;
    float* lambda;
};
Workspace carve_workspace(AttnShape s, void* ws, size_t dq_slices) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    Workspace w;
    w.dq_acc = static_cast<float*>(ws);
    w.D = w.dq_acc + dq_slices * rows * s.HS;
    w.lambda = w.D + rows;
    return w;
}
static_assert(kBwdKeyTile == ATTN_BWD_KEY_BLOCK, "the deterministic dQ slices are per key-major CTA");

/* 1 iff the call takes the deterministic backward's dQ slices: opt.deterministic in bf16, repair and fp32 mode
   (gproj's dQ comes whole from its row pass: deterministic without them). */
int uses_dq_slices(AttnMode mode, AttnOptions opt) { return opt.deterministic && mode != ATTN_GPROJ; }
size_t dq_slices_for(AttnShape s, AttnMode mode, AttnOptions opt) {
    return uses_dq_slices(mode, opt) ? (size_t)ceil_div(s.T, kBwdKeyTile) : 1;
}

template <int HS, int MODE>
void forward_launch(AttnShape s, const bf16* qkv, bf16* out, float* stats, int tile_max_shift, cudaStream_t stream) {
    const size_t smem = fwd_smem_bytes<HS>();
    cudaCheck(cudaFuncSetAttribute(attn_fwd_kernel<HS, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)ceil_div(s.T, kFwdQueryTile), (unsigned)(s.B * s.NH));
    attn_fwd_kernel<HS, MODE><<<grid, kFwdThreads, smem, stream>>>(qkv, out, stats, s.NH, s.T, attn_softmax_scale(HS),
                                                                attn_exp2_scale(HS), tile_max_shift,
                                                                attn_tile_section(s, kTileSectionKV));
    cudaCheckLastError();
}

/* The portable row pass (fp32 and gproj: attn_bwd_rows_kernel) and key-major pass (attn_bwd_kernel; with
   dq_slices its sliced form, not in gproj mode) of MODE, on the workspace slots of carve_workspace. */
template <int HS, int MODE>
void portable_passes(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, bf16* dqkv,
                     const Workspace& w, int dq_slices, cudaStream_t stream) {
    const float scale = attn_softmax_scale(HS), c = attn_exp2_scale(HS);
    if constexpr (MODE == ATTN_FP32 || MODE == ATTN_GPROJ) { /* (no row-pass kernels for the other modes) */
        const size_t smem = rows_smem_bytes<HS>();
        cudaCheck(cudaFuncSetAttribute(attn_bwd_rows_kernel<HS, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        dim3 grid((unsigned)ceil_div(s.T, kRowsQueryTile), (unsigned)(s.B * s.NH));
        attn_bwd_rows_kernel<HS, MODE><<<grid, kThreads, smem, stream>>>(
            qkv, dout, stats, w.D, w.lambda, dqkv, s.NH, s.T, scale, c,
            attn_tile_section(s, kTileSectionKV));
        cudaCheckLastError();
    }
    const size_t smem = bwd_smem_bytes<HS, MODE>();
    auto kernel = attn_bwd_kernel<HS, MODE, false>;
    if constexpr (MODE != ATTN_GPROJ) { /* (gproj adds no dQ here) */
        if (dq_slices) kernel = attn_bwd_kernel<HS, MODE, true>;
    }
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)ceil_div(s.T, kBwdKeyTile), (unsigned)(s.B * s.NH));
    const int per_elem = MODE == ATTN_GPROJ ? kTileSectionQdO : kTileSectionQdOdQ;
    kernel<<<grid, kBwdThreads, smem, stream>>>(qkv, dout, stats, w.D, w.lambda, w.dq_acc, dqkv, s.NH, s.T, scale, c,
                                                attn_tile_section(s, per_elem));
    cudaCheckLastError();
}

/* The backward chain of MODE at head size HS (with_mode_hs made them template arguments): the prep kernel (D from
   the BF16 O, not in fp32 mode nor in gproj's Hopper chain, whose row pass forms it; the zeroed accumulator, not
   in gproj mode nor with dq_slices; no launch when neither is left) -> [the zeroed dQ slices] -> the row pass
   (fp32, gproj) and the key-major pass -> [the dQ post-pass] (not in gproj mode: its row pass wrote dQ). hopper:
   the Hopper chain of the mode (attention_hopper_bwd.cuh's attention_backward_hopper) in place of the portable
   passes; the caller has asked attention_hopper_bwd_supports and checked the device
   (attention_backward_cuda_path). Both read and write the workspace slots of carve_workspace, so the prep and the
   post-pass are the same either way. dq_slices (not in gproj mode): the deterministic backward - the slices of
   carve_workspace zeroed where they are added to, every key-major kernel adding into its key block's slice, the
   sliced post-pass (see attn_bwd_zero_dq_slices_kernel); else the one accumulator, zeroed by the prep kernel. */
template <int HS, int MODE>
void backward_launch(AttnOptions opt, AttnShape s, const bf16* qkv, const bf16* out, const float* stats,
                     const bf16* dout, bf16* dqkv, void* workspace, int hopper, int dq_slices, cudaStream_t stream) {
    constexpr AttnMode mode = (AttnMode)MODE;
    dq_slices = (mode != ATTN_GPROJ) && dq_slices;
    const int n_key_blocks = ceil_div(s.T, kBwdKeyTile);
    const Workspace w = carve_workspace(s, workspace, dq_slices ? (size_t)n_key_blocks : 1);
    /* gproj's row pass (launched next) computes dQ whole, without the accumulator; on Hopper it also forms D
       itself (attn_row_d.cuh's order, the prep's bits), and then there is no prep kernel at all */
    const int zero_dq = mode != ATTN_GPROJ && !dq_slices;
    const int want_D = mode != ATTN_FP32 && !(hopper && mode == ATTN_GPROJ);
    constexpr int kPrepRowsPerBlock = kPrepThreads / (HS / 8);
    if (zero_dq || want_D) {
        attn_bwd_prep_kernel<HS><<<dim3((unsigned)ceil_div(s.T, kPrepRowsPerBlock), (unsigned)(s.B * s.NH)),
                                   kPrepThreads, 0, stream>>>(out, dout, w.D, w.dq_acc, s.NH, s.T, zero_dq, want_D);
        cudaCheckLastError();
    }
    if (dq_slices) { /* a plain launch: it starts after the prep kernel has finished, and every later one after it */
        const dim3 grid((unsigned)ceil_div((long long)s.T * (HS / 8), 256), (unsigned)(s.B * s.NH),
                        (unsigned)n_key_blocks);
        attn_bwd_zero_dq_slices_kernel<HS><<<grid, 256, 0, stream>>>(w.dq_acc, s.T);
        cudaCheckLastError();
    }
    if (hopper) {
        attention_backward_hopper(mode, opt, s, qkv, out, dout, stats, w.D, w.lambda, w.dq_acc, dqkv, stream,
                                  dq_slices);
    } else {
        portable_passes<HS, MODE>(s, qkv, dout, stats, dqkv, w, dq_slices, stream);
    }
    if (mode != ATTN_GPROJ) { /* gproj's row pass wrote dQ */
        const dim3 grid((unsigned)ceil_div((long long)s.T * (HS / 8), 256), (unsigned)(s.B * s.NH));
        launch_after_previous_grid(hopper, dq_slices ? attn_bwd_dq_kernel<HS, true> : attn_bwd_dq_kernel<HS, false>,
                                   grid, dim3(256), 0, stream, w.dq_acc, dqkv, s.NH, s.T, attn_softmax_scale(HS));
        cudaCheckLastError();
    }
}

}  // namespace

void attention_cuda_check_shape(AttnShape s, AttnMode mode) {
    attn_shape_check(s, "attention (CUDA)");
    if (s.HS != 64 && s.HS != 128) {
        die("attention (CUDA): head size %d is not supported (B=%d NH=%d T=%d)\n"
            "  hint: the CUDA kernels take head size 64 or 128; choose n_embd / n_head accordingly",
            s.HS, s.B, s.NH, s.T);
    }
    if ((long long)s.B * s.NH > 65535) {
        die("attention (CUDA): B*NH = %lld exceeds 65535 heads per launch\n"
            "  hint: lower the batch size", (long long)s.B * s.NH);
    }
    /* the tile order's ids (tile_order.cuh) are 32-bit: the most tiles a launch has (64-row tiles) x its heads */
    if ((long long)ceil_div(s.T, 64) * s.B * s.NH >= (1LL << 32)) {
        die("attention (CUDA): %lld tiles of 64 rows x %lld heads (T=%d, B*NH=%lld) exceed the 2^32 work items a "
            "launch can number\n"
            "  hint: lower the batch size or the sequence length",
            (long long)ceil_div(s.T, 64), (long long)s.B * s.NH, s.T, (long long)s.B * s.NH);
    }
    if ((int)mode < 0 || mode >= ATTN_NUM_MODES) {
        die("attention (CUDA): invalid mode %d (choices: %s)", (int)mode, attn_mode_choices());
    }
}

size_t attention_cuda_workspace_bytes(AttnShape s, AttnMode mode, AttnOptions opt) {
    attention_cuda_check_shape(s, mode);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t slices = dq_slices_for(s, mode, opt);
    /* in double first: B, NH, T, HS are ints, so this cannot overflow, and the bound below keeps size_t exact */
    const double bytes = ((double)slices * (double)rows * s.HS + 2.0 * (double)rows) * sizeof(float);
    if (slices > 1 && bytes > (double)ATTN_CUDA_DETERMINISTIC_MAX_BYTES) {
        die("attention (CUDA): the deterministic backward of mode %s needs %.1f GiB of workspace at B=%d NH=%d T=%d "
            "HS=%d (one FP32 dQ accumulator of %.1f GiB per block of %d keys, %zu blocks), over its bound of %.0f GiB\n"
            "  hint: lower the batch size or the sequence length, use --attn gproj (deterministic with no extra "
            "workspace), or turn the deterministic backward off",
            attn_mode_name(mode), bytes / (1 << 30), s.B, s.NH, s.T, s.HS,
            (double)rows * s.HS * sizeof(float) / (1 << 30), ATTN_BWD_KEY_BLOCK, slices,
            (double)ATTN_CUDA_DETERMINISTIC_MAX_BYTES / (1 << 30));
    }
    return (slices * rows * s.HS + 2 * rows) * sizeof(float);
}

size_t attention_cuda_workspace_bytes(AttnShape s, AttnMode mode) {
    return attention_cuda_workspace_bytes(s, mode, AttnOptions{});
}

/* Whether the current device runs the Hopper (sm_90a) kernels: compute capability exactly 9.0 (sm_90a
   code runs nowhere else, not on later architectures either). Asked once per device, then cached. */
static int current_device_is_sm90(void) {
    enum { kMaxDevices = 64, kUnknown = 0, kNo = 1, kYes = 2 };
    static int cached[kMaxDevices]; /* kUnknown; a race between host threads writes the same answer twice */
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return 0; /* beyond the cache: the portable kernels run everywhere */
    if (cached[dev] == kUnknown) {
        int major = 0, minor = 0;
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        cached[dev] = (major == 9 && minor == 0) ? kYes : kNo;
    }
    return cached[dev] == kYes;
}

/* Every BF16 tensor the kernels touch is moved in 16-byte vectors (cp.async, TMA, the prep's and the dQ
   post-pass's loads and stores), so a pointer off 16-byte alignment is refused here, with the fix, rather
   than faulting in a kernel ("misaligned address") or taking a slower path nobody asked for. */
static void require_16_byte_aligned(const char* fn, const char* name, const void* p) {
    if ((uintptr_t)p % 16 != 0) {
        die("%s: %s (%p) is not 16-byte aligned\n"
            "  hint: pass buffers from cudaMalloc, offset by multiples of 8 BF16 elements (the kernels move "
            "16-byte vectors)", fn, name, p);
    }
}

/* The deterministic backward's workspace is ceil(T / 128) dQs larger than the default one, so a caller that
   sized it with the default options would have the slices written past its end. With the option on, the
   allocation holding the workspace (the driver's cuMemGetAddressRange, reached without linking libcuda) must
   extend `need` bytes past the pointer; a pointer the driver cannot place is not checked. */
static void require_workspace_holds(const void* workspace, size_t need) {
    static PFN_cuMemGetAddressRange_v3020 get_range = NULL;
    if (get_range == NULL) {
        void* fn = NULL;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found) !=
                cudaSuccess || found != cudaDriverEntryPointSuccess || fn == NULL)
            return;
        get_range = (PFN_cuMemGetAddressRange_v3020)fn;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (get_range(&base, &size, (CUdeviceptr)(uintptr_t)workspace) != CUDA_SUCCESS) return;
    const size_t held = (size_t)(base + size - (CUdeviceptr)(uintptr_t)workspace);
    if (held < need) {
        die("attention_backward_cuda: the deterministic backward needs %zu bytes of workspace; the allocation at %p "
            "holds %zu from there\n"
            "  hint: size the workspace with attention_cuda_workspace_bytes(shape, mode, options) and "
            "options.deterministic = 1 (the two-argument form is the size for the default options)",
            need, workspace, held);
    }
}

AttnFwdPath attention_forward_cuda_path(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv) {
    if (mode == ATTN_CUDNN) return ATTN_FWD_CUDNN; /* whatever the options: attention_forward_cuda's first branch */
    if (opt.force_portable) return ATTN_FWD_PORTABLE;
    if (!attention_hopper_fwd_supports(mode, opt, s, qkv)) return ATTN_FWD_PORTABLE;
    return current_device_is_sm90() ? ATTN_FWD_HOPPER : ATTN_FWD_PORTABLE;
}

const char* attn_fwd_path_name(AttnFwdPath path) {
    return path == ATTN_FWD_CUDNN ? "cudnn" : path == ATTN_FWD_HOPPER ? "hopper" : "portable";
}

AttnBwdPath attention_backward_cuda_path(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                                         const __nv_bfloat16* dout) {
    if (mode == ATTN_CUDNN) return ATTN_BWD_CUDNN;
    if (opt.force_portable) return ATTN_BWD_PORTABLE;
    if (!attention_hopper_bwd_supports(mode, opt, s, qkv, dout)) return ATTN_BWD_PORTABLE;
    return current_device_is_sm90() ? ATTN_BWD_HOPPER : ATTN_BWD_PORTABLE;
}

const char* attn_bwd_path_name(AttnBwdPath path) {
    return path == ATTN_BWD_CUDNN ? "cudnn" : path == ATTN_BWD_HOPPER ? "hopper" : "portable";
}

void attention_forward_cuda(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                            __nv_bfloat16* out, float* stats, void* workspace, cudaStream_t stream) {
    (void)workspace; /* the forward needs none */
    attention_cuda_check_shape(s, mode);
    require_16_byte_aligned("attention_forward_cuda", "qkv", qkv);
    require_16_byte_aligned("attention_forward_cuda", "out", out);
    if (mode == ATTN_CUDNN) { /* cuDNN's kernel (attention/cudnn/); options other than deterministic do not apply */
        attention_forward_cudnn(s, qkv, out, stats, stream);
        return;
    }
    if (attention_forward_cuda_path(mode, opt, s, qkv) == ATTN_FWD_HOPPER) {
        attention_forward_hopper(mode, s, qkv, out, stats, stream);
        return;
    }
    /* the tile-max shift arm belongs to repair mode only (attention.h) */
    const int shift = (mode == ATTN_REPAIR && opt.tile_max_shift) ? 1 : 0;
    with_mode_hs("attention_forward_cuda", mode, s.HS, [&](auto mode_c, auto hs_c) {
        forward_launch<decltype(hs_c)::value, decltype(mode_c)::value>(s, qkv, out, stats, shift, stream);
    });
}

void attention_backward_cuda(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                             const __nv_bfloat16* out, const float* stats, const __nv_bfloat16* dout,
                             __nv_bfloat16* dqkv, void* workspace, cudaStream_t stream) {
    attention_cuda_check_shape(s, mode);
    require_16_byte_aligned("attention_backward_cuda", "qkv", qkv);
    require_16_byte_aligned("attention_backward_cuda", "out", out);
    require_16_byte_aligned("attention_backward_cuda", "dout", dout);
    require_16_byte_aligned("attention_backward_cuda", "dqkv", dqkv);
    if (mode == ATTN_CUDNN) { /* cuDNN owns its workspace; it has no deterministic backward here */
        if (opt.deterministic)
            die("attention_backward_cuda: mode cudnn has no deterministic backward in this build\n"
                "  hint: turn the deterministic backward off, or use one of %s", attn_emulated_mode_choices());
        attention_backward_cudnn(s, qkv, out, stats, dout, dqkv, stream);
        return;
    }
    /* the portable backward reads the shifted max, if any, from stats; opt picks the path */
    if (workspace == NULL) {
        die("attention_backward_cuda: workspace is NULL\n"
            "  hint: allocate attention_cuda_workspace_bytes(shape, mode, options) bytes of device memory");
    }
    const int slices = uses_dq_slices(mode, opt);
    if (slices) { /* refuses a shape over the bound, then a workspace too small for the slices, with the fix */
        const size_t need = attention_cuda_workspace_bytes(s, mode, opt);
        require_workspace_holds(workspace, need);
    }
    const int hopper = attention_backward_cuda_path(mode, opt, s, qkv, dout) == ATTN_BWD_HOPPER;
    with_mode_hs("attention_backward_cuda", mode, s.HS, [&](auto mode_c, auto hs_c) {
        backward_launch<decltype(hs_c)::value, decltype(mode_c)::value>(opt, s, qkv, out, stats, dout, dqkv, workspace,
                                                                        hopper, slices, stream);
    });
}
