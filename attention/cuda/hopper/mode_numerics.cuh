/*
 * attention/cuda/hopper/mode_numerics.cuh - where the Hopper (sm_90a) kernels decide a mode's numbers: every
 * expression that differs between fp32, bf16, repair and gproj (docs/attention_numerics.md) and is not a GEMM's
 * shape or a pipeline's order. Changing a mode's numerics, or adding a mode, means editing this header and
 * attention/cuda/mode_scalars.cuh, the scalar expressions the portable kernels share (and the CPU emulation,
 * attention/cpu/attention_cpu.c, with the contract); the kernel templates only call them.
 *
 *   forward        mode_scalars.cuh's forward_exponent<MODE> (the exponent of e = exp2(x)) and
 *                  forward_row_stats<MODE> (the stats {LSE, 0} or {m, l}); kernel_fwd.cuh's softmax_tile and
 *                  epilogue call them
 *   backward P     mode_scalars.cuh's recompute_prob<MODE> from the row state that
 *                  keymajor_stage_row_state<MODE, ...> writes (row_state_a/b: bf16 {fl(LSE log2 e), 1}; repair,
 *                  gproj: {m, fl(1 / l)}; D; gproj's lambda)
 *   dS             keymajor_probs_column<MODE, MAY_MASK> (dS = P (dP - D), masked entries 0),
 *                  keymajor_probs_step<MODE, MAY_MASK> (one 16-query k-step of it), with_step_mask (per step)
 *   gproj          load_step_lambdas, pack_gproj_step_operands (bf(P), bf(dS) and bf(-lambda P) of a k-step);
 *                  the row pass: load_row_state (with D = dO . O, attn_row_d.cuh's order), row_probs_packed
 *                  (bf(P), bf(dS) as GEMM operands and their row sums), store_row_outputs (lambda = r / p by
 *                  mode_scalars.cuh's gproj_lambda, dQ = bf(s fma(-lambda, PK, DSK)))
 *   fp32           pack_split_step (the BF16 hi / lo / third terms of P and dS); the row pass's D = sum P dP
 *                  (row_sums_fp32, store_row_outputs)
 *
 * Why one header: these are the rounding points the CPU emulation mirrors operation for operation; kept here,
 * a mode's change is one file, and every head size and pass picks it up. Each function is __forceinline__ and
 * takes what it needs as arguments, so the kernels' machine code is the same as with the expressions written
 * in place (dev/compare_ptx.py checks it per kernel). What is not here: which GEMMs a mode issues and where
 * its dQ goes (its block of the kernel body: kernel_keys64.cuh, kernel_keys128.cuh, kernel_rows.cuh) and
 * which passes it runs (the chain table HopperBwdChain, attention_hopper_bwd_dispatch.cu).
 *
 * The fragment layout (hopper_wgmma.cuh): register 4j + 2r + e of a thread's 64 x 64 accumulator is row
 * g + 8r (key-major: a key; row pass: a query), column 8j + 2t + e (g = lane / 4, t = lane % 4). Everything is
 * in the including file's anonymous namespace.
 */
#ifndef ATTENTION_CUDA_HOPPER_MODE_NUMERICS_CUH
#define ATTENTION_CUDA_HOPPER_MODE_NUMERICS_CUH

#include <math.h>
#include <stdint.h>
#include <type_traits>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "attention/cuda/mma_bf16.cuh"
#include "attention/cuda/attn_row_d.cuh"
#include "attention/cuda/mode_scalars.cuh"

namespace {

/* ---- the key-major backward: the row state, P and dS ---- */

/* Where gproj's per-query lambda goes in a stage: nowhere (bf16, repair), the row state's .w (HS 64), or a
   float row of its own (HS 128, whose consumers read it as float2 pairs). */
enum KeymajorLambda { kKeymajorNoLambda, kKeymajorLambdaInW, kKeymajorLambdaRow };

/* Every producer lane's part of a stage's row state: queries q0 + lane and q0 + lane + 32 get float4
   {a, b, D, lambda or 0} for recompute_prob<MODE> (bf16: a = fl(LSE log2 e), b = 1; repair and gproj:
   a = m, b = fl(1 / l)), D and (LAMBDA) gproj's lambda. Rows past T get {0, 1, 0, 0}: P stays finite and
   lambda 0 (they are masked anyway). The lane's arrival on the stage's full barrier releases these writes.
   ROLLED: the two queries one after the other (not unrolled). */
template <int MODE, int LAMBDA, bool ROLLED = false>
__device__ __forceinline__ void keymajor_stage_row_state(float4* rs, float* lam_row, const float* __restrict__ stats,
                                                         const float* __restrict__ D,
                                                         const float* __restrict__ lambda, int bh, int T, int q0,
                                                         int lane) {
    auto one = [&](int half) {
        const int ql = lane + 32 * half, query = q0 + ql;
        float4 st = make_float4(0.f, 1.f, 0.f, 0.f);
        float lam = 0.f;
        if (query < T) {
            const long long idx = (long long)bh * T + query;
            st.x = row_state_a<MODE>(stats[idx * 2]);     /* fl(LSE log2 e) or m */
            st.y = row_state_b<MODE>(stats[idx * 2 + 1]); /* 1 or fl(1 / l) */
            st.z = D[idx];
            if (LAMBDA == kKeymajorLambdaInW) st.w = lambda[idx];
            if (LAMBDA == kKeymajorLambdaRow) lam = lambda[idx];
        }
        rs[ql] = st;
        if (LAMBDA == kKeymajorLambdaRow) lam_row[ql] = lam;
    };
    if constexpr (ROLLED) { /* one query at a time: a producer with 24 registers may spill with two in flight */
#pragma unroll 1
        for (int half = 0; half < 2; half++) one(half);
    } else {
#pragma unroll
        for (int half = 0; half < 2; half++) one(half);
    }
}

/* Whether the score of key `key` and query `query` is kept (else P and dS are exactly 0): always when MAY_MASK is
   false or the step is not masked, else for keys up to the query and queries before T. */
template <bool MAY_MASK>
__device__ __forceinline__ bool keymajor_kept(bool masked, int key, int query, int T) {
    return !(MAY_MASK && masked) || (key <= query && query < T);
}

/* P and dS in place of S^T (st) and dP^T (dpt) in one query column of a consumer thread's 64 x 64 (keys x
   queries) tile, every key-major kernel's per-element step: registers 4j + 2r + e, keys key0 + 8r, the query
   `query` = q0 + 8j + 2t + e with row state `row` {a, b, D} (hopper_wgmma.cuh's fragment layout).
   P = recompute_prob<MODE>, dS = P (dP - D): attn_bwd_kernel's expressions (gproj passes ATTN_REPAIR: its
   stats are repair's). masked (the tile reaches the warpgroup's keys or T): keys past the query and queries
   past T give exactly 0 in both. MAY_MASK false: the caller knows the step is not masked (with_step_mask), and
   the code carries none of the mask's compares and selects. row by reference: passed by value, it changes the
   register numbering of attention_hopper_bwd.cu's producer in the PTX. */
template <int MODE, bool MAY_MASK, int kRegs = 32> /* kRegs: 32 for 64-query tiles, 64 for 128-query steps at HS 64 */
__device__ __forceinline__ void keymajor_probs_column(float (&st)[kRegs], float (&dpt)[kRegs], const float4& row,
                                                      int j, int e, int query, int key0, int T, bool masked,
                                                      float c) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int idx = 4 * j + 2 * r + e;
        float p = 0.f, ds = 0.f;
        if (keymajor_kept<MAY_MASK>(masked, key0 + 8 * r, query, T)) {
            p = recompute_prob<MODE>(st[idx], row.x, row.y, c);
            ds = p * (dpt[idx] - row.z);
        }
        st[idx] = p;
        dpt[idx] = ds;
    }
}

/* P and dS of k-step kk (16 queries) of a 64-query tile in registers (st <- P, dpt <- dS), masked entries exactly
   0: keymajor_probs_column over the k-step's four query columns, each with its row state rs[8j + 2t + e]. With
   LAMBDA_W (gproj at HS 64, kKeymajorLambdaInW) also lam_w[jj][e] = that row state's .w, the lambdas as
   pack_gproj_step_operands takes them, read with the row state. */
template <int MODE, bool MAY_MASK, bool LAMBDA_W = false>
__device__ __forceinline__ void keymajor_probs_step(float (&st)[32], float (&dpt)[32], const float4* rs, int kk, int q0,
                                                   int t, int key0, int T, bool masked, float c,
                                                   float (*lam_w)[2] = nullptr) {
#pragma unroll
    for (int jj = 0; jj < 2; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int j = 2 * kk + jj;
            const int query = q0 + 8 * j + 2 * t + e;
            const float4 row = rs[8 * j + 2 * t + e];
            if constexpr (LAMBDA_W) lam_w[jj][e] = row.w;
            keymajor_probs_column<MODE, MAY_MASK>(st, dpt, row, j, e, query, key0, T, masked, c);
        }
}

/* The key-major passes' per-step work from P to its operands, written once as a generic lambda f over MAY_MASK
   (keymajor_probs_column's): with SPLIT, f(std::true_type{}) for a step the mask can reach (masked: it reaches
   the warpgroup's keys or T) and f(std::false_type{}) for the others, compiled twice and picked by one uniform
   branch per step; without SPLIT, f(std::true_type{}) for every step (one copy, the run-time masked deciding
   per element). SPLIT per mode: kKeymajorSplitMask. */
template <bool SPLIT, typename F>
__device__ __forceinline__ void with_step_mask(bool masked, F&& f) {
    if constexpr (SPLIT) {
        if (masked) f(std::true_type{});
        else f(std::false_type{});
    } else {
        f(std::true_type{});
    }
}
/* Which modes' key-major passes split their steps (with_step_mask): bf16 and gproj. Repair's and fp32's keep one
   masked copy: split, ptxas spills 8-28 bytes in their passes (repair's P reads a third row-state value, fp32
   packs three terms). */
template <int MODE>
constexpr bool kKeymajorSplitMask = MODE == ATTN_BF16 || MODE == ATTN_GPROJ;

/* ---- gproj's extra operand and fp32's split terms (key-major) ---- */

/* k-step kk's lambdas from a stage's lambda row (HS 128's kKeymajorLambdaRow), as pack_gproj_step_operands takes them:
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

/* gproj's key-major pass (both head sizes): k-step kk's three register A operands from the FP32 P and dS
   accumulators of a 64 x 64 (keys x queries) tile (registers 8kk..8kk+7: key g + 8 (i & 1), query
   16kk + 8 (i >> 1) + 2t + e for register 8kk + 2i + e, hopper_wgmma.cuh's fragment layout):
     pa   = bf(P),  pds = bf(dS)                         (pack_acc_a_operand's words, one k-step)
     plam = bf(-lambda_q P), lambda per query COLUMN: lam[jj][e] = lambda of query 16kk + 8 jj + 2t + e;
            the product -lambda * P in FP32, rounded once (the portable kernel's `alp` expression).
   One k-step at a time, so the kernels pack each step right after computing its P and dS and those FP32
   values die step by step (packing all of bf(P) first and the correction after kept P and dS live
   together with dK/dV: 84 bytes of spills at HS 64). */
__device__ __forceinline__ void pack_gproj_step_operands(uint32_t (&pa)[4], uint32_t (&pds)[4], uint32_t (&plam)[4],
                                                         const float (&p)[32], const float (&ds)[32], int kk,
                                                         const float (&lam)[2][2]) {
    using hopper_wgmma::pack_bf16x2;
    const int b = 8 * kk;
    pa[0] = pack_bf16x2(p[b + 0], p[b + 1]);   /* key g,   queries 2t, 2t+1 */
    pa[1] = pack_bf16x2(p[b + 2], p[b + 3]);   /* key g+8, queries 2t, 2t+1 */
    pa[2] = pack_bf16x2(p[b + 4], p[b + 5]);   /* key g,   queries 2t+8, 2t+9 */
    pa[3] = pack_bf16x2(p[b + 6], p[b + 7]);   /* key g+8, queries 2t+8, 2t+9 */
    pds[0] = pack_bf16x2(ds[b + 0], ds[b + 1]);
    pds[1] = pack_bf16x2(ds[b + 2], ds[b + 3]);
    pds[2] = pack_bf16x2(ds[b + 4], ds[b + 5]);
    pds[3] = pack_bf16x2(ds[b + 6], ds[b + 7]);
    plam[0] = pack_bf16x2(-lam[0][0] * p[b + 0], -lam[0][1] * p[b + 1]);
    plam[1] = pack_bf16x2(-lam[0][0] * p[b + 2], -lam[0][1] * p[b + 3]);
    plam[2] = pack_bf16x2(-lam[1][0] * p[b + 4], -lam[1][1] * p[b + 5]);
    plam[3] = pack_bf16x2(-lam[1][0] * p[b + 6], -lam[1][1] * p[b + 7]);
}

/* k-step kk's register A words from a 64 x 64 FP32 accumulator x (P or dS), registers 8kk..8kk+7 (key
   g + 8 (i & 1), query 16kk + 8 (i >> 1) + 2t + e for register 8kk + 2i + e: pack_acc_a_operand's words):
   hi = bf(x), lo = bf(x - bf(x)); with kThirdTerm (dS only) also x2 = bf(r1 - bf(r1)) for r1 = x - bf(x).
   fp32 mode's split terms: attn_bwd_kernel<HS, ATTN_FP32>'s ap / ap_lo and ads / ads_lo / x2 words, the
   residual being attention/cuda/mma_bf16.cuh's bf16_residual (the portable kernel's). */
template <bool kThirdTerm>
__device__ __forceinline__ void pack_split_step(uint32_t (&hi)[4], uint32_t (&lo)[4], uint32_t (&x2)[4],
                                                const float (&x)[32], int kk) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float v0 = x[8 * kk + 2 * i], v1 = x[8 * kk + 2 * i + 1];
        const float r0 = attn_mma::bf16_residual(v0), r1 = attn_mma::bf16_residual(v1);
        hi[i] = hopper_wgmma::pack_bf16x2(v0, v1);
        lo[i] = hopper_wgmma::pack_bf16x2(r0, r1);
        if (kThirdTerm)
            x2[i] = hopper_wgmma::pack_bf16x2(attn_mma::bf16_residual(r0), attn_mma::bf16_residual(r1));
    }
}

/* ---- the row pass (gproj: lambda and dQ; fp32: D) ---- */

/* The forward's stats of this thread's rows (bh = (b, h)'s rows row0 and row0 + 8): m, fl(1 / l), and for gproj
   D = dO . O from the stored BF16 O and dO, formed here in the prep kernel's sum order (attn_row_d.cuh: this
   lane's packs, then the quad g's butterfly; store_row_outputs writes it out for the key-major pass). Rows past
   T read row 0's: any finite state (their P is masked to 0). Every lane of the warp takes part (the quad's
   shuffles). */
template <bool GPROJ, int HS>
__device__ __forceinline__ void load_row_state(float (&row_m)[2], float (&row_rl)[2], float (&row_D)[2],
                                               const float* __restrict__ stats, const __nv_bfloat16* __restrict__ out,
                                               const __nv_bfloat16* __restrict__ dout, int b, int h, int NH, int T,
                                               int row0, int t) {
    constexpr int kMode = GPROJ ? ATTN_GPROJ : ATTN_FP32; /* the row pass's modes: {m, fl(1 / l)} */
    const int bh = b * NH + h;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int query = row0 + 8 * r;
        const long long idx = (long long)bh * T + (query < T ? query : 0); /* rows past T: any finite state */
        row_m[r] = row_state_a<kMode>(stats[idx * 2]);
        row_rl[r] = row_state_b<kMode>(stats[idx * 2 + 1]);
        row_D[r] = 0.f;
    }
    if constexpr (GPROJ) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int query = row0 + 8 * r;
            const long long at = ((long long)b * T + (query < T ? query : 0)) * NH * HS + (long long)h * HS;
            float d = attn_row_d_quad_partial<HS>(out + at, dout + at, t);
            d += __shfl_xor_sync(0xffffffffu, d, 2);
            d += __shfl_xor_sync(0xffffffffu, d, 1);
            row_D[r] = d;
        }
    }
}

/* fp32's row pass on one half (S in sacc, dP in dpacc, 64 rows x REGS/2 keys from key `key0`): D's sums
   acc += P dP with P = exp2((S - m) c) fl(1 / l) (the forward's exponent), each lane its keys in increasing order,
   as the portable pass. MASKED: keys past the row (causal) or rows past T add nothing. */
template <bool MASKED, int REGS>
__device__ __forceinline__ void row_sums_fp32(const float (&sacc)[REGS], const float (&dpacc)[REGS],
                                              const float (&row_m)[2], const float (&row_rl)[2], float (&acc)[2],
                                              int key0, int row0, int t, int T, float c) {
#pragma unroll
    for (int j = 0; j < REGS / 4; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                const int key = key0 + 8 * j + 2 * t + e, query = row0 + 8 * r;
                if (!MASKED || (key <= query && query < T)) {
                    const float p = exp2f((sacc[i] - row_m[r]) * c) * row_rl[r];
                    acc[r] += p * dpacc[i];
                }
            }
}

/* gproj's row pass on one 64-row x 64-key half (S in sacc, dP in dpacc, hopper_wgmma.cuh's fragment layout): the
   register A operands of the DSK / PK GEMMs, dsa = bf(dS) and pa = bf(P) (pack_acc_a_operand's words), and the
   row sums acc_a += bf(dS), acc_b += bf(P) taken from those words, each lane its keys in increasing order (the
   portable pass's order). P = exp2((S - m) c) fl(1 / l) and dS = P (dP - D). One RNE conversion per pair of
   values serves both the operand and the sums: rounding each value for the sums and again in pairs for the
   operand is the same rounding done twice, 2.5 conversions per element against 1, and the pass is bound by its
   instruction latency (dev/results/gproj_row_pass_packed_2026-12-04.md). MASKED: keys past the row (causal) or
   rows past T give exactly 0 in the words and add +0 to the sums (which never hold -0: they start at +0 and RNE
   sums that cancel give +0), so the sums equal the ones that skip those entries. */
template <bool MASKED>
__device__ __forceinline__ void row_probs_packed(const float (&sacc)[32], const float (&dpacc)[32],
                                                 const float (&row_m)[2], const float (&row_rl)[2],
                                                 const float (&row_D)[2], float (&acc_a)[2], float (&acc_b)[2],
                                                 uint32_t (&dsa)[hopper_wgmma::kTileKSteps][4],
                                                 uint32_t (&pa)[hopper_wgmma::kTileKSteps][4], int key0, int row0,
                                                 int t, int T, float c) {
    auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };          /* the BF16 in the low half */
    auto hi = [](uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); };  /* the BF16 in the high half */
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float p[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                const int key = key0 + 8 * j + 2 * t + e, query = row0 + 8 * r;
                p[e] = ds[e] = 0.f;
                if (!MASKED || (key <= query && query < T)) {
                    p[e] = exp2f((sacc[i] - row_m[r]) * c) * row_rl[r]; /* the forward's exponent */
                    ds[e] = p[e] * (dpacc[i] - row_D[r]);
                }
            }
            const uint32_t pw = hopper_wgmma::pack_bf16x2(p[0], p[1]);
            const uint32_t dsw = hopper_wgmma::pack_bf16x2(ds[0], ds[1]);
            acc_a[r] += lo(dsw);
            acc_b[r] += lo(pw);
            acc_a[r] += hi(dsw);
            acc_b[r] += hi(pw);
            /* register 4j + 2r of the accumulator is word (j / 2, 2 (j % 2) + r) of pack_acc_a_operand */
            dsa[j / 2][2 * (j % 2) + r] = dsw;
            pa[j / 2][2 * (j % 2) + r] = pw;
        }
}

/* The rows' outputs: the quad's row sums; gproj: lambda = r / p (0 if p = 0) into lambda, the rows' D (row_D, as
   load_row_state formed it) into D for the key-major pass, and dQ = bf(s * fma(-lambda, PK, DSK)) (one FP32 fma per
   element) into the q slot of dqkv [B, T, 3, NH, HS]; fp32: D = sum P dP into D. Rows past T write nothing. */
template <bool GPROJ, int HS>
__device__ __forceinline__ void store_row_outputs(const float (&acc_a)[2], const float (&acc_b)[2],
                                                  const float (&dsk)[HS / 2], const float (&pk)[HS / 2],
                                                  const float (&row_D)[2], float* __restrict__ D,
                                                  float* __restrict__ lambda,
                                                  hopper_wgmma::bf16* __restrict__ dqkv, int bh, int b, int h, int NH,
                                                  int T, int row0, int t, float scale) {
    float row_lambda[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float a = hopper_wgmma::quad_sum(acc_a[r]); /* every lane of the quad gets the whole-row sums */
        const float p = hopper_wgmma::quad_sum(acc_b[r]);
        row_lambda[r] = gproj_lambda(a, p);
        const int query = row0 + 8 * r;
        if (t != 0 || query >= T) continue;
        const long long idx = (long long)bh * T + query;
        if (GPROJ) {
            lambda[idx] = row_lambda[r];
            D[idx] = row_D[r];
        } else {
            D[idx] = a;
        }
    }
    if (GPROJ) {
        /* dQ_i = bf(s * (DSK_i - lambda_i PK_i)), one FP32 fma per element, into the q slot of dqkv */
        const long long qkv_row = 3LL * NH * HS;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lam = row_lambda[r];
            const int query = row0 + 8 * r;
            if (query >= T) continue;
            hopper_wgmma::bf16* dq_row = dqkv + ((long long)b * T + query) * qkv_row + (long long)h * HS + 2 * t;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                const float v0 = __fmaf_rn(-lam, pk[4 * n + 2 * r], dsk[4 * n + 2 * r]);
                const float v1 = __fmaf_rn(-lam, pk[4 * n + 2 * r + 1], dsk[4 * n + 2 * r + 1]);
                *reinterpret_cast<uint32_t*>(dq_row + 8 * n) = hopper_wgmma::pack_bf16x2(v0 * scale, v1 * scale);
            }
        }
    }
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_MODE_NUMERICS_CUH */
