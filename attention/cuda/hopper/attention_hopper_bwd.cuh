/*
 * attention/cuda/hopper/attention_hopper_bwd.cuh - the public surface of the Hopper (sm_90a) attention backward: one
 * support check (which also names the chain of passes a call runs) and one entry point that runs that chain, for
 * every mode it serves at head sizes 64 and 128.
 *
 * Why: attention/cuda/attention_cuda.cu's dispatch (backward_launch) runs this chain in place of its portable
 * twins on a compute-capability 9.0 device when the check says yes and AttnOptions.force_portable is 0; the
 * passes read and write the portable backward's workspace slots (attention_cuda_workspace_bytes), so the whole
 * backward is prep kernel -> Hopper chain -> [dQ post-pass] (attention_cuda.cu's kernels before and after).
 * The chain per (mode, head size) is one table, kHopperBwdChains in attention_hopper_bwd_dispatch.cu (whose
 * run_chain makes the mode and head size the passes' template arguments through mode_dispatch.cuh's with_mode_hs):
 *   bf16, repair (not repair's tile-max-shift arm): the key-major pass - reads qkv, dout, stats and D [B*NH*T];
 *       adds s-less dQ partials into the zeroed FP32 dq_acc [B*NH*T][HS] by TMA reduce-add; writes the k and v
 *       slots of dqkv.
 *   fp32: the row pass - reads qkv, dout, stats; writes D = sum P dP - then fp32's key-major pass - reads D; adds
 *       dQ partials into dq_acc as bf16's; writes the k and v slots of dqkv.
 *   gproj: the row pass - reads qkv, out, dout, stats; writes D = dO . O (in the prep kernel's sum order,
 *       attention/cuda/attn_row_d.cuh), lambda [B*NH*T] and the q slot of dqkv (all of dQ) - then gproj's
 *       key-major pass - reads D and lambda; writes the k and v slots of dqkv
 *       (deterministic: no dQ, no atomics).
 * What each pass computes and its CTA: docs/attention_kernels.md ("The Hopper kernels") and the instantiation
 * files' comments. The objects are compiled for sm_90a only; other builds link them and never launch them.
 *
 * The check says yes (nonzero: the chain's passes) iff the chain computes (mode, shape) exactly and TMA can take
 * the pointers: a mode above, head size 64 or 128, B*NH <= 65535, qkv and dout 16-byte aligned. It says nothing
 * about the device. The entry point is asynchronous on `stream` and dies with a hint on a call the check refuses.
 * dq_slices (the chains whose key-major pass sends dQ; 0 for gproj): 0 = add into dq_acc [B*NH*T][HS]; 1 =
 * dq_acc is [ceil(T / ATTN_BWD_KEY_BLOCK)][B*NH*T][HS], its slice kb zeroed from row kb * ATTN_BWD_KEY_BLOCK on,
 * and the CTA of key block kb adds into slice kb only (the deterministic backward, docs/determinism.md).
 * Labs that check or time one pass of a chain alone: hopper_lab_hooks.cuh's attention_backward_hopper_passes.
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

/* The passes of a chain (bits of attention_hopper_bwd_supports's answer); a chain with both runs the row pass first. */
enum { ATTN_HOPPER_KEY_PASS = 1, ATTN_HOPPER_ROW_PASS = 2 };

/* 0 where the Hopper backward cannot take the call, else the passes its chain runs: ATTN_HOPPER_KEY_PASS (bf16,
   repair), ATTN_HOPPER_ROW_PASS | ATTN_HOPPER_KEY_PASS (fp32, gproj). */
int attention_hopper_bwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv, const void* dout);

/* Runs the chain of (mode, s.HS). out: the forward's O (gproj's row pass forms D from it). D, lambda, dq_acc: the
   workspace slots of attention_cuda.cu's carve_workspace (what each pass reads and writes: above); the caller has
   written D (bf16, repair) and zeroed dq_acc or its slices (not in gproj mode). */
void attention_backward_hopper(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                               const __nv_bfloat16* out, const __nv_bfloat16* dout, const float* stats, float* D,
                               float* lambda, float* dq_acc, __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices);

#endif /* ATTENTION_ATTENTION_HOPPER_BWD_CUH */
