/*
 * attention/hopper_bwd_common.cuh - device pieces shared by the Hopper (sm_90a) key-major backward kernels
 * (attention_hopper_bwd.cu at HS 64, attention_hopper_bwd128.cu at HS 128): the recomputed probability of one
 * score, and the bounded mbarrier wait that GIVES UP instead of trapping.
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

}  // namespace

#endif /* ATTENTION_HOPPER_BWD_COMMON_CUH */
