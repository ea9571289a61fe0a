/*
 * attention/cuda/hopper/attention_hopper_bwd.cuh - the Hopper (sm_90a) kernels of the attention backward, wgmma + TMA, a
 * producer and two consumer warpgroups:
 *   the key-major kernels (dK, dV and the dQ reduce-adds) for bf16 and repair modes: head size 64
 *   (attention_hopper_bwd.cu, 128-query steps) and head size 128 (attention_hopper_bwd128.cu), both with
 *   setmaxnreg;
 *   the query-major row pass (gproj's lambda and dQ, fp32's D) for gproj and fp32: head size 64
 *   (attention_hopper_rows.cu) and head size 128 (attention_hopper_rows128.cu, with setmaxnreg);
 *   the key-major passes of gproj and fp32 after the row pass (their sections at the end), at both head sizes.
 *
 * Why: the portable mma.sync backward (attention/cuda/attention_cuda.cu) is most of our attention time on the
 * H200. The key-major kernels compute the same dK, dV and dQ accumulator as attn_bwd_kernel with the same
 * rounding points (only the FP32 sum order differs). HS 64 (128-query steps; its harness
 * dev/attention_lab/hopper_bwd64_wide.cu): the whole bf16 backward 1.06x / 1.18x faster than with 64-query
 * steps at B8 H16 T1024 / B4 H16 T2048. HS 128 (its harness dev/attention_lab/hopper_bwd128.cu): the whole
 * backward 1.40x faster than the portable one at B8 H8 T1024 and 1.69x at B2 H16 T4096.
 * Callers normally do not call them directly: attention_backward_cuda runs the portable prep kernel (D and
 * the zeroed FP32 dQ accumulator), then the key-major kernel of the head size in place of attn_bwd_kernel
 * when attention_hopper_bwd_supports() says yes, the device is sm_90 and AttnOptions.force_portable is 0,
 * then the portable dQ post-pass; so the workspace is exactly attention_cuda_workspace_bytes'. The objects
 * are compiled for sm_90a only, whatever NVCC_ARCH says; other builds link them and never launch them.
 *
 * Offers (key-major):
 *   attention_hopper_bwd_supports - 1 iff a key-major kernel computes (mode, opt, shape) exactly and TMA can
 *       take the pointers: modes bf16 and repair (not repair's tile-max-shift arm: its rows stay on the
 *       portable path end to end), head size 64 or 128, B*NH <= 65535, qkv and dout 16-byte aligned. Says
 *       nothing about the device.
 *   attention_backward_hopper_keys - the key-major kernel of s.HS alone (asynchronous on `stream`): reads
 *       qkv, dout, stats and D [B*NH*T], atomically adds s-less dQ partials into the zeroed dq_acc
 *       [B*NH*T][HS] FP32, writes the k and v slots of dqkv. Dies with a hint if unsupported.
 *       attention_backward_hopper_keys128 is its HS-128 half (attention_hopper_bwd128.cu; no support check).
 *   Every mbarrier wait of both kernels is bounded (~2 s of clock64), then the CTA gives up and writes NaN
 *       to all its dK/dV rows (no trap: it would void setmaxnreg; see attention_hopper_bwd128.cu), recording
 *       the barrier in a host-mapped record when a lab installed one (hopper_lab_hooks.cuh).
 * The layout probes of every kernel here are lab code: dev/attention_lab/probes/, declared in
 * dev/attention_lab/hopper_probes.cuh.
 *
 * The row pass (harnesses dev/attention_lab/hopper_rows.cu at HS 64, hopper_rows128.cu at HS 128; D, lambda
 * and dQ bit-equal to the portable row pass's; at HS 128 the pass alone 1.49-1.81x (gproj) and 1.83-2.29x
 * (fp32) faster than the portable one). attention_backward_cuda runs it in
 * attn_bwd_rows_kernel's place on sm_90 for gproj and fp32 at HS 64 and 128 (not force_portable); it writes
 * the same workspace slots (fp32: D; gproj: lambda) and gproj's dQ, and the key-major pass then runs on
 * them (the mode's Hopper key-major pass: gproj's or fp32's, both at HS 64 and 128).
 *   attention_hopper_rows_supports - 1 iff mode gproj or fp32, head size 64 or 128, B*NH <= 65535, qkv and
 *       dout 16-byte aligned. Says nothing about the device.
 *   attention_backward_hopper_rows - the row pass of s.HS alone (asynchronous on `stream`): reads qkv, dout,
 *       stats and (gproj) D [B*NH*T] from the prep kernel; writes gproj: lambda [B*NH*T] and the q slot of
 *       dqkv; fp32: D. Dies with a hint if unsupported. attention_backward_hopper_rows128 is its HS-128 half
 *       (no support check). HS 64 waits unbounded (no setmaxnreg, as the forward); HS 128's waits give up
 *       after ~2 s and the CTA writes NaN over all its outputs (lambda and dQ rows, or D), recording the
 *       barrier in the object's hang record (hopper_lab_hooks.cuh).
 */
#ifndef ATTENTION_ATTENTION_HOPPER_BWD_CUH
#define ATTENTION_ATTENTION_HOPPER_BWD_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"

/* Head sizes of the HS-64 and HS-128 kernels. */
#define ATTN_HOPPER_BWD_HS 64
#define ATTN_HOPPER_BWD128_HS 128
/* Keys per CTA of every key-major backward kernel, the portable attn_bwd_kernel and each Hopper one: the key
   block whose dQ partials the deterministic backward keeps in a slice of their own (docs/determinism.md). */
#define ATTN_BWD_KEY_BLOCK 128

int attention_hopper_bwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv, const void* dout);

/* dq_slices (every key-major pass here takes it): 0 = add into dq_acc [B*NH*T][HS] as above; 1 = dq_acc is
   [ceil(T / ATTN_BWD_KEY_BLOCK)][B*NH*T][HS], its slice kb zeroed from row kb * ATTN_BWD_KEY_BLOCK on, and the
   CTA of key block kb adds into slice kb only (the deterministic backward, docs/determinism.md). */
void attention_backward_hopper_keys(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                    cudaStream_t stream, int dq_slices = 0);

/* HS 128, bf16 or repair only (dies otherwise); attention_backward_hopper_keys checks the rest and calls it. */
void attention_backward_hopper_keys128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv,
                                       const __nv_bfloat16* dout, const float* stats, const float* D, float* dq_acc,
                                       __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices = 0);

int attention_hopper_rows_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);

void attention_backward_hopper_rows(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, float* D, float* lambda, __nv_bfloat16* dqkv,
                                    cudaStream_t stream);

/* HS 128 (attention_hopper_rows128.cu): gproj or fp32 only (dies otherwise); attention_backward_hopper_rows checks
   the rest and calls it. */
#define ATTN_HOPPER_ROWS128_HS 128
void attention_backward_hopper_rows128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv,
                                       const __nv_bfloat16* dout, const float* stats, float* D, float* lambda,
                                       __nv_bfloat16* dqkv, cudaStream_t stream);

/* ---- gproj's key-major pass (attention_hopper_bwd_gproj.cu: HS 64 and the entry points;
   attention_hopper_bwd128_gproj.cu: HS 128) ----
   dK and dV of gproj mode (no dQ: the row pass wrote it): dV += bf(P)^T dO,
   dK += bf(dS)^T Q + bf(-lambda_q P)^T Q, dK = bf(s acc), dV = bf(acc), the portable
   attn_bwd_kernel<HS, ATTN_GPROJ>'s rounding points (FP32 sum order only). A producer warpgroup gives its
   registers to the two consumer warpgroups (setmaxnreg 40 / 232 at HS 64, 24 / 240 at HS 128, the split of
   attention_hopper_bwd128.cu). Harnesses: dev/attention_lab/hopper_bwd_gproj.cu (HS 64: the all-Hopper gproj
   backward 1.16-1.21x faster than with the portable key-major pass) and hopper_bwd128_gproj.cu (HS 128: dK
   within 1 ulp of the portable kernel on the same lambda; 500 TFLOP/s at B2 H16 T4096). The pass writes dK and
   dV from registers, one CTA per key block: deterministic with or without AttnOptions.deterministic.
   attention_backward_cuda runs the pass in
   attn_bwd_kernel<HS, ATTN_GPROJ>'s place on sm_90 (not force_portable), after the prep kernel (D) and the
   row pass (lambda, dQ), reading the D and lambda workspace slots those two wrote.
   A wait that runs out does not trap on the consumer path (a trap there disables setmaxnreg): the CTA
   gives up, records the barrier (in the object's hang record, hopper_lab_hooks.cuh) and writes NaN over its
   dK and dV rows; at HS 64 the producer warp then traps, at HS 128 nothing traps (as attention_hopper_bwd128.cu). */
/* 1 iff mode gproj, head size 64 or 128, B*NH <= 65535, qkv and dout 16-byte aligned. Says nothing about the
   device. */
int attention_hopper_gproj_keys_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);

/* The pass alone (asynchronous on `stream`): reads qkv, dout, stats {m, l}, D and lambda [B*NH*T]; writes the
   k and v slots of dqkv (the q slot is left as it is). Dies with a hint if unsupported. Dispatches on s.HS. */
void attention_backward_hopper_gproj_keys(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          const float* stats, const float* D, const float* lambda,
                                          __nv_bfloat16* dqkv, cudaStream_t stream);
/* HS 128 only (dies otherwise); attention_backward_hopper_gproj_keys checks the rest and calls it. */
void attention_backward_hopper_gproj_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                             const float* stats, const float* D, const float* lambda,
                                             __nv_bfloat16* dqkv, cudaStream_t stream);

/* ---- fp32's key-major pass (attention_hopper_bwd64_fp32.cu: HS 64 and the entry points;
   attention_hopper_bwd128_fp32.cu: HS 128) ----
   dK, dV and the dQ partials of fp32 mode (attn_bwd_kernel<128, ATTN_FP32>'s rounding points, FP32 sum order
   only): P and dS in FP32, dV += bf(P)^T dO + bf(P - bf(P))^T dO, dK += bf(dS)^T Q + bf(r1)^T Q, and
   dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K by TMA reduce-add (r1 = dS - bf(dS)); setmaxnreg 24/240, the
   CTA of attention_hopper_bwd128.cu (harness dev/attention_lab/hopper_bwd128_fp32.cu: within 4 BF16 ulps of
   force_portable; 1.335 ms alone at B2 H16 T4096). attention_backward_cuda runs it in attn_bwd_kernel<128, ATTN_FP32>'s place on sm_90 (not
   force_portable) after the prep kernel (zeroed dq_acc) and the Hopper row pass (D); the dQ post-pass follows.
   A wait that runs out gives up (no trap), records the barrier in the object's hang record
   (hopper_lab_hooks.cuh), and the CTA writes NaN over its dK and dV rows.
   HS 64: the same numerics in a 288-thread CTA (64-query steps; two consumer warpgroups, a producer warp, no
   setmaxnreg; dV/dK as two chained m64n64k16 RS batches each, dQ over the three staged terms; harness
   dev/attention_lab/hopper_bwd64_fp32.cu: within 4 BF16 ulps of force_portable, the fp32 backward 1.13x /
   1.17x faster at B8 H16 T1024 / B4 H16 T2048 d64). attention_backward_cuda runs it in
   attn_bwd_kernel<64, ATTN_FP32>'s place on sm_90 exactly as HS 128's. Its waits are bounded (~2 s) and TRAP
   (no setmaxnreg to lose), naming the barrier in the same record first. */
#define ATTN_HOPPER_FP32_KEYS128_HS 128
/* 1 iff mode fp32, head size 128, B*NH <= 65535, qkv and dout 16-byte aligned. Says nothing about the device. */
int attention_hopper_fp32_keys128_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);

/* The pass alone (asynchronous on `stream`): reads qkv, dout, stats {m, l} and D [B*NH*T]; atomically adds
   s-less dQ partials into the zeroed dq_acc [B*NH*T][128] FP32 (TMA reduce-add); writes the k and v slots of
   dqkv (the q slot is left to the post-pass). Dies with a hint if unsupported. */
void attention_backward_hopper_fp32_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                            const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                            cudaStream_t stream, int dq_slices = 0);

/* Both head sizes (attention_hopper_bwd64_fp32.cu): 1 iff mode fp32, head size 64 or 128, B*NH <= 65535, qkv and
   dout 16-byte aligned. Says nothing about the device. */
#define ATTN_HOPPER_FP32_KEYS64_HS 64
int attention_hopper_fp32_keys_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);

/* The pass of s.HS alone (asynchronous on `stream`; HS 128: attention_backward_hopper_fp32_keys128): reads qkv,
   dout, stats {m, l} and D [B*NH*T]; adds s-less dQ partials into the zeroed dq_acc [B*NH*T][HS] FP32 (TMA
   reduce-add); writes the k and v slots of dqkv (the q slot is left to the post-pass). Dies with a hint if
   unsupported. */
void attention_backward_hopper_fp32_keys(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                         const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                         cudaStream_t stream, int dq_slices = 0);

#endif /* ATTENTION_ATTENTION_HOPPER_BWD_CUH */
