/*
 * attention/cuda/hopper/attention_hopper.cuh - the Hopper (sm_90a) attention forward: wgmma + TMA + a producer
 * warpgroup and two (HS 128) or three (HS 64) consumer warpgroups, for the modes whose
 * forward it computes exactly as docs/attention_numerics.md defines them.
 *
 * Why: on an H200 the portable mma.sync forward (attention/cuda/attention_cuda.cu) is well short of cuDNN's;
 * this kernel is 1.3-1.5x faster than it in bf16 mode (dev/results/attention_hopper_2026-11-29.md). It
 * writes the same out and the same stats (bf16 {LSE, 0}; repair, gproj, fp32 {m, l}), so the portable
 * backward reads them unchanged. Callers normally do not call it directly: attention_forward_cuda picks
 * it on a compute-capability 9.0 device when attention_hopper_fwd_supports() says yes (and
 * AttnOptions.force_portable is 0). The object is compiled for sm_90a only, whatever NVCC_ARCH says; a
 * build for other targets still links it and never launches it.
 *
 * Offers:
 *   attention_hopper_fwd_supports - 1 iff this kernel computes (mode, opt, shape, qkv) exactly: modes
 *       bf16, repair (not its tile-max-shift arm, whose 64-key tile is the portable kernel's), gproj and
 *       fp32; head size 64 or 128; qkv 16-byte aligned (TMA). Says nothing about the device.
 *   attention_forward_hopper - the forward (asynchronous on `stream`); dies with a hint if unsupported.
 *       The caller makes sure the current device is sm_90.
 */
#ifndef ATTENTION_ATTENTION_HOPPER_CUH
#define ATTENTION_ATTENTION_HOPPER_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"

/* Query rows per CTA and keys per K/V tile of the Hopper forward (the portable kernel's key tile is 64). */
#define ATTN_HOPPER_BLOCK_Q 128
/* Query rows per CTA at head size 64 (three consumer warpgroups; ATTN_HOPPER_BLOCK_Q is HS 128's and the probe's). */
#define ATTN_HOPPER_BLOCK_Q_HS64 192
#define ATTN_HOPPER_BLOCK_K 128
/* K/V pipeline stages of the forward (3 measured no faster: dev/results/attention_hopper_2026-11-29.md). */
#define ATTN_HOPPER_FWD_STAGES 2

int attention_hopper_fwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv);

void attention_forward_hopper(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                              cudaStream_t stream);



#endif /* ATTENTION_ATTENTION_HOPPER_CUH */
