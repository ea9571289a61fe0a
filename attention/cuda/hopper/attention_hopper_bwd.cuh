/*
 * attention/cuda/hopper/attention_hopper_bwd.cuh - the public surface of the Hopper (sm_90a) attention backward: one
 * support check and one entry point per pass, each serving head sizes 64 and 128 (the entry point hands HS 128 to
 * its half; the halves are declared in hopper_host.cuh, for the instantiation files only).
 *
 * Why: attention/cuda/attention_cuda.cu's dispatch (backward_launch) runs these passes in place of their portable
 * twins on a compute-capability 9.0 device when the check says yes and AttnOptions.force_portable is 0; the
 * passes read and write the portable backward's workspace slots (attention_cuda_workspace_bytes), so the chain
 * is prep kernel -> [row pass] -> key-major pass -> [dQ post-pass] whichever path each link takes. What each
 * pass computes and its CTA: docs/attention_kernels.md ("The Hopper kernels") and the instantiation files'
 * comments. The objects are compiled for sm_90a only; other builds link them and never launch them.
 *
 * Every check says 1 iff the pass computes (mode, shape) exactly and TMA can take the pointers: the mode (below),
 * head size 64 or 128, B*NH <= 65535, qkv and dout 16-byte aligned. It says nothing about the device. Every entry
 * point is asynchronous on `stream` and dies with a hint on a call its check refuses.
 *
 *   key-major, bf16 and repair (not repair's tile-max-shift arm): attention_hopper_bwd_supports,
 *       attention_backward_hopper_keys - reads qkv, dout, stats and D [B*NH*T]; adds s-less dQ partials into the
 *       zeroed FP32 dq_acc [B*NH*T][HS] by TMA reduce-add; writes the k and v slots of dqkv.
 *   row pass, gproj and fp32: attention_hopper_rows_supports, attention_backward_hopper_rows - reads qkv, dout,
 *       stats and (gproj) D; writes gproj: lambda [B*NH*T] and the q slot of dqkv (all of dQ); fp32: D.
 *   key-major, gproj: attention_hopper_gproj_keys_supports, attention_backward_hopper_gproj_keys - after the
 *       row pass: reads D and lambda; writes the k and v slots of dqkv (deterministic: no dQ, no atomics).
 *   key-major, fp32: attention_hopper_fp32_keys_supports, attention_backward_hopper_fp32_keys - after the row
 *       pass: reads D; adds dQ partials into dq_acc as bf16's; writes the k and v slots of dqkv.
 * dq_slices (the key-major passes that send dQ): 0 = add into dq_acc [B*NH*T][HS]; 1 = dq_acc is
 * [ceil(T / ATTN_BWD_KEY_BLOCK)][B*NH*T][HS], its slice kb zeroed from row kb * ATTN_BWD_KEY_BLOCK on, and the CTA
 * of key block kb adds into slice kb only (the deterministic backward, docs/determinism.md).
 *
 * Hangs: the waits of the key-major passes and of the HS-128 row pass are bounded (~2 s of clock64; the HS-64 row
 * pass waits unbounded, as the forward). A pass with setmaxnreg gives up instead of trapping (a trap on the
 * consumer path voids setmaxnreg), records the barrier in its object's hang record when a lab installed one
 * (hopper_lab_hooks.cuh) and writes NaN over its outputs; fp32's HS-64 key-major pass (no setmaxnreg) records
 * and traps.
 */
#ifndef ATTENTION_ATTENTION_HOPPER_BWD_CUH
#define ATTENTION_ATTENTION_HOPPER_BWD_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"

/* Keys per CTA of every key-major backward kernel, the portable attn_bwd_kernel and each Hopper one: the key
   block whose dQ partials the deterministic backward keeps in a slice of their own (docs/determinism.md). */
#define ATTN_BWD_KEY_BLOCK 128

int attention_hopper_bwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv, const void* dout);
void attention_backward_hopper_keys(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                    cudaStream_t stream, int dq_slices = 0);

int attention_hopper_rows_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);
void attention_backward_hopper_rows(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, float* D, float* lambda, __nv_bfloat16* dqkv,
                                    cudaStream_t stream);

int attention_hopper_gproj_keys_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);
void attention_backward_hopper_gproj_keys(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          const float* stats, const float* D, const float* lambda,
                                          __nv_bfloat16* dqkv, cudaStream_t stream);

int attention_hopper_fp32_keys_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);
void attention_backward_hopper_fp32_keys(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                         const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                         cudaStream_t stream, int dq_slices = 0);

#endif /* ATTENTION_ATTENTION_HOPPER_BWD_CUH */
