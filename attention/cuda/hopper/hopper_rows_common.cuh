/*
 * attention/cuda/hopper/hopper_rows_common.cuh - device pieces shared by the Hopper (sm_90a) row passes of the backward
 * (attention_hopper_rows.cu at HS 64, attention_hopper_rows128.cu at HS 128): a thread's two query rows' state,
 * the recomputed P and dS of one 64-key accumulator pair with their row sums, the DSK/PK GEMMs of one 64-key
 * half, the rows' outputs (lambda and dQ, or D), and the store of an accumulator pair as row-major rows (the
 * layout probes).
 *
 * Why: the two kernels differ in their GEMMs and pipeline (HS 128 needs a producer warpgroup, setmaxnreg and
 * 128-column accumulators), not in the per-element math, which must stay attn_bwd_rows_kernel's operation for
 * operation (docs/attention_numerics.md): one copy here keeps both on the same rounding points. Needs
 * attention/cuda/hopper/hopper_wgmma.cuh (fragment layout, quad_sum, pack_bf16x2); everything is in the including file's
 * anonymous namespace.
 *
 * The fragment layout (hopper_wgmma.cuh): a thread holds rows row0 and row0 + 8 of its warpgroup's 64 rows;
 * register 4j + 2r + e of an accumulator is row row0 + 8r, column 8j + 2t + e (t = lane % 4).
 */
#ifndef ATTENTION_HOPPER_ROWS_COMMON_CUH
#define ATTENTION_HOPPER_ROWS_COMMON_CUH

#include <stdint.h>
#include <cuda_bf16.h>
#include "attention/cuda/hopper/hopper_wgmma.cuh"

namespace {

/* The forward's stats of this thread's rows (bh's rows row0 and row0 + 8): m, fl(1 / l) and (gproj) the prep
   kernel's D. Rows past T read row 0's: any finite state (their P is masked to 0). */
template <bool GPROJ>
__device__ __forceinline__ void load_row_state(float (&row_m)[2], float (&row_rl)[2], float (&row_D)[2],
                                               const float* __restrict__ stats, const float* __restrict__ D,
                                               int bh, int T, int row0) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int query = row0 + 8 * r;
        const long long idx = (long long)bh * T + (query < T ? query : 0); /* rows past T: any finite state */
        row_m[r] = stats[idx * 2];
        row_rl[r] = __frcp_rn(stats[idx * 2 + 1]);
        row_D[r] = GPROJ ? D[idx] : 0.f;
    }
}

/* P and dS in place of S (sacc) and dP (dpacc), 64 rows x REGS/2 keys from key `key0`, and the row sums: each
   lane its keys in increasing order, as the portable pass. gproj: dS = P (dP - D), acc_a += bf(dS),
   acc_b += bf(P); fp32: acc_a += P dP (dpacc is then 0). MASKED: keys past the row (causal) or rows past T
   give exactly 0 in both GEMM operands. */
template <bool GPROJ, bool MASKED, int REGS>
__device__ __forceinline__ void row_probs_and_sums(float (&sacc)[REGS], float (&dpacc)[REGS], const float (&row_m)[2],
                                                   const float (&row_rl)[2], const float (&row_D)[2],
                                                   float (&acc_a)[2], float (&acc_b)[2], int key0, int row0, int t,
                                                   int T, float c) {
#pragma unroll
    for (int j = 0; j < REGS / 4; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                const int key = key0 + 8 * j + 2 * t + e, query = row0 + 8 * r;
                float p = 0.f, ds = 0.f;
                if (!MASKED || (key <= query && query < T)) {
                    p = exp2f((sacc[i] - row_m[r]) * c) * row_rl[r]; /* the forward's exponent */
                    const float dpv = dpacc[i];
                    if (GPROJ) {
                        ds = p * (dpv - row_D[r]);
                        acc_a[r] += __bfloat162float(__float2bfloat16_rn(ds));
                        acc_b[r] += __bfloat162float(__float2bfloat16_rn(p));
                    } else {
                        acc_a[r] += p * dpv;
                    }
                }
                sacc[i] = p;
                dpacc[i] = ds;
            }
}

/* DSK += bf(dS) K and PK += bf(P) K over one 64-key half: 4 k-steps of 16 keys against the K rows at k_addr read
   N-major (trans-b = 1: the head dim, N = 2 REGS, contiguous within a 64-column chunk; the next 64-column block
   of N is `chunk_bytes` further: the descriptor's LBO), each k-step 16 rows = 2048 bytes further; the forward's
   O += P V with K in place of V (wgmma_pv: m64n64k16 or m64n128k16 by REGS). FENCE_A: the just-packed A
   registers are fenced first (HS 128's form; HS 64's kernel runs without: a parameter, so each kernel keeps
   the PTX its checks verified). The A registers stay live until the wgmmas that read them are done; fenced, committed and waited
   for here. */
template <int REGS, bool FENCE_A>
__device__ __forceinline__ void warpgroup_rs_k(float (&dsk)[REGS], float (&pk)[REGS],
                                               uint32_t (&dsa)[hopper_wgmma::kTileKSteps][4],
                                               uint32_t (&pa)[hopper_wgmma::kTileKSteps][4], uint32_t k_addr,
                                               uint32_t chunk_bytes) {
    using namespace hopper_wgmma;
    if (FENCE_A) {
        reg_fence(dsa);
        reg_fence(pa);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        const uint64_t desc = make_smem_desc(k_addr + kk * 16 * kTileRowBytes, chunk_bytes, kSwizzle128BAtomBytes);
        wgmma_pv(dsk, dsa[kk], desc);
        wgmma_pv(pk, pa[kk], desc);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dsk);
    reg_fence(pk);
    reg_fence(dsa); /* keeps the A registers live (unchanged) until the wgmmas that read them are done */
    reg_fence(pa);
}

/* The rows' outputs: the quad's row sums; gproj: lambda = r / p (0 if p = 0) into lambda and
   dQ = bf(s * fma(-lambda, PK, DSK)) (one FP32 fma per element) into the q slot of dqkv [B, T, 3, NH, HS];
   fp32: D = sum P dP into D. Rows past T write nothing. */
template <bool GPROJ, int HS>
__device__ __forceinline__ void store_row_outputs(const float (&acc_a)[2], const float (&acc_b)[2],
                                                  const float (&dsk)[HS / 2], const float (&pk)[HS / 2],
                                                  float* __restrict__ D, float* __restrict__ lambda,
                                                  hopper_wgmma::bf16* __restrict__ dqkv, int bh, int b, int h, int NH,
                                                  int T, int row0, int t, float scale) {
    float row_lambda[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float a = hopper_wgmma::quad_sum(acc_a[r]); /* every lane of the quad gets the whole-row sums */
        const float p = hopper_wgmma::quad_sum(acc_b[r]);
        row_lambda[r] = (p != 0.f) ? __fdiv_rn(a, p) : 0.f;
        const int query = row0 + 8 * r;
        if (t != 0 || query >= T) continue;
        const long long idx = (long long)bh * T + query;
        if (GPROJ) lambda[idx] = row_lambda[r];
        else D[idx] = a;
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

/* The layout probes' output of two accumulators of this thread's rows: out[(row0 + 8r) * pitch + col0 + 8j +
   2t + e] = acc[4j + 2r + e], FP32. */
template <int REGS>
__device__ __forceinline__ void store_fragment_rows(float* out0, float* out1, const float (&acc0)[REGS],
                                                    const float (&acc1)[REGS], int row0, int col0, int pitch, int t) {
#pragma unroll
    for (int j = 0; j < REGS / 4; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int at = (row0 + 8 * r) * pitch + col0 + 8 * j + 2 * t + e;
                out0[at] = acc0[4 * j + 2 * r + e];
                out1[at] = acc1[4 * j + 2 * r + e];
            }
}

}  // namespace

#endif /* ATTENTION_HOPPER_ROWS_COMMON_CUH */
