/*
 * attention/hopper_bwd_common.cuh - device pieces shared by the Hopper (sm_90a) key-major backward kernels
 * (attention_hopper_bwd.cu at HS 64, attention_hopper_bwd128.cu at HS 128; gproj's attention_hopper_bwd_gproj.cu
 * and attention_hopper_bwd128_gproj.cu): the recomputed probability of one score, the bounded mbarrier wait that
 * GIVES UP instead of trapping, and gproj's three register A operands of one k-step.
 *
 * Why: both kernels recompute P with attn_bwd_kernel's expression, one copy here; and a kernel with
 * setmaxnreg cannot trap on its consumer path (ptxas then ignores setmaxnreg.inc: spills and serialised
 * wgmmas, dev/attention_lab/hopper_bwd_fast.cu), so its waits give up, record the barrier and let the
 * kernel end with poisoned outputs instead (attention_hopper_bwd128.cu's file comment). Needs
 * attention/hopper_wgmma.cuh; everything is in the including file's anonymous namespace (one kernel file
 * = one translation unit, each with its own __device__ record pointer).
 */
#ifndef ATTENTION_HOPPER_BWD_COMMON_CUH
#define ATTENTION_HOPPER_BWD_COMMON_CUH

#include <stdint.h>
#include "attention/attention.h"
#include "attention/attention_hopper_bwd.cuh"
#include "attention/hopper_wgmma.cuh"

namespace {

/* The recomputed probability of one score (attention_cuda.cu's backward_prob, the same expression): bf16:
   row_a = fl(LSE log2 e), P = exp2(fma(S, c, -row_a)); repair: row_a = m, row_b = fl(1/l). */
template <int MODE>
__device__ __forceinline__ float recompute_prob(float score, float row_a, float row_b, float c) {
    if (MODE == ATTN_BF16) return exp2f(__fmaf_rn(score, c, -row_a));
    return exp2f((score - row_a) * c) * row_b;
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
                if (rec != NULL && rec->site == ATTN_HANG_NONE) {
                    rec->index = index;
                    rec->parity = (int)parity;
                    rec->block_x = (int)blockIdx.x;
                    rec->block_y = (int)blockIdx.y;
                    rec->thread = (int)threadIdx.x;
                    __threadfence_system();
                    rec->site = site;
                    __threadfence_system();
                }
            }
            break;
        }
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

}  // namespace

#endif /* ATTENTION_HOPPER_BWD_COMMON_CUH */
