/*
 * attention/cuda/mode_scalars.cuh - the per-mode scalar expressions that both CUDA attention kernel families
 * compute: the portable kernels (attention/cuda/attention_cuda.cu) and the Hopper kernels (whose tile-level
 * steps in attention/cuda/hopper/mode_numerics.cuh are built on these). What each mode means:
 * docs/attention_numerics.md.
 *
 *   forward_exponent<MODE>   the exponent x of e = exp2(x) of one score
 *   forward_row_stats<MODE>  the two stats a forward writes per query row
 *   row_state_a<MODE>, row_state_b<MODE>
 *                            the backward's row state of a query from those stats
 *   recompute_prob<MODE>     the backward's probability of one score from that row state
 *   gproj_lambda             gproj's row pass: lambda from a row's sums
 *
 * Why one header: either family's forward may feed either family's backward (attention_cuda.cu picks each path
 * per call), and the test compares the two paths, so these must be the same expressions, rounding for rounding,
 * in both. They are also the rounding points the CPU emulation (attention/cpu/attention_cpu.c) mirrors. Each
 * function is __forceinline__ and takes what it needs as arguments, so every kernel's machine code is what the
 * expression written in place gives (dev/compare_ptx.py checks it per kernel). Everything is in the including file's
 * anonymous namespace.
 */
#ifndef ATTENTION_CUDA_MODE_SCALARS_CUH
#define ATTENTION_CUDA_MODE_SCALARS_CUH

#include <math.h>
#include <cuda_runtime.h>
#include "attention/attention.h"

namespace {

constexpr float kModeLog2e = 1.4426950408889634f; /* log2 e in FP32: bf16's LSE to the base-2 exponent */

/* The exponent x of e = exp2(x) for score sc of a row with running max m_new (m_c = fl(m_new c)): bf16 one fused
   multiply-add, fma(sc, c, -fl(m c)) (FlashAttention-3's form: P_max != 1); the others subtract first,
   (sc - m) c (P_max = 1 exactly, what repair's backward recomputes). */
template <int MODE>
__device__ __forceinline__ float forward_exponent(float sc, float c, float m_c, float m_new) {
    return (MODE == ATTN_BF16) ? __fmaf_rn(sc, c, -m_c) : (sc - m_new) * c;
}

/* A row's stats st[0..1] from its max raw score m and its sum l: bf16 one LSE = m scale + ln l (natural log,
   scaled units) and 0; the others {m, l}. */
template <int MODE>
__device__ __forceinline__ void forward_row_stats(float* st, float m, float l, float scale) {
    if (MODE == ATTN_BF16) {
        st[0] = m * scale + logf(l);
        st[1] = 0.f;
    } else {
        st[0] = m;
        st[1] = l;
    }
}

/* The backward's row state {a, b} of a query from its stats {stat0, stat1}: bf16 a = fl(LSE log2 e), b = 1 (its
   stat1 is not read); the others a = m, b = fl(1 / l). */
template <int MODE>
__device__ __forceinline__ float row_state_a(float stat0) {
    return (MODE == ATTN_BF16) ? stat0 * kModeLog2e : stat0;
}
template <int MODE>
__device__ __forceinline__ float row_state_b(float stat1) {
    return (MODE == ATTN_BF16) ? 1.f : __frcp_rn(stat1);
}

/* The recomputed probability of one score from its row's state {row_a, row_b}: bf16 P = exp2(fma(S, c, -row_a)),
   already normalised; the others the forward's exponent bit for bit, exp2((S - m) c), times fl(1 / l). */
template <int MODE>
__device__ __forceinline__ float recompute_prob(float score, float row_a, float row_b, float c) {
    if (MODE == ATTN_BF16) return exp2f(__fmaf_rn(score, c, -row_a));
    return exp2f((score - row_a) * c) * row_b;
}

/* gproj's lambda of a row from its sums r = sum_j bf(dS_ij) and p = sum_j bf(P_ij): r / p, correctly rounded, and 0
   for a row with p = 0 (no kept score). */
__device__ __forceinline__ float gproj_lambda(float r, float p) { return (p != 0.f) ? __fdiv_rn(r, p) : 0.f; }

}  // namespace

#endif /* ATTENTION_CUDA_MODE_SCALARS_CUH */
