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
 *   attention_hopper_bwd_watch_hangs - every mbarrier wait of both kernels is bounded (~2 s of clock64),
 *       then the CTA gives up and writes NaN to all its dK/dV rows (no trap: it would void setmaxnreg; see
 *       attention_hopper_bwd128.cu). Given a host-mapped AttnHopperHang (cudaHostAllocMapped, device
 *       pointer), the first hung wait records which barrier it was, so a lab can name it after the NaNs (or,
 *       for the kernels whose waits trap, the CUDA error). NULL: no record.
 *   attention_hopper_bwd_layout_probe (HS 64), attention_hopper_bwd128_layout_probe (HS 128) - for the labs:
 *       one tile of S^T, dP^T, dV, dK, dQ through the kernel's own TMA maps and wgmma helpers (HS 64: also
 *       dQ through its TMA reduce-add), so a layout mistake is named before the attention checks fail.
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
 *       barrier in attention_hopper_bwd_watch_hangs' record (attention_hopper_rows128_watch_hangs installs it
 *       in that translation unit).
 *   attention_hopper_rows_layout_probe - for the labs: S = Q K^T, dP = dO V^T ([128][128]) and
 *       X = bf(S) K, Y = bf(dP) K ([128][HS]) of one tile through the row pass's own maps and helpers
 *       (dispatches on s.HS).
 */
#ifndef ATTENTION_ATTENTION_HOPPER_BWD_CUH
#define ATTENTION_ATTENTION_HOPPER_BWD_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"

/* Head size of the HS-64 kernels; the bf16/repair key-major probe's tile (one consumer warpgroup's keys x one
   128-query step); the 64 x 64 tile edge of the HS-64 gproj key-major probe (attention_hopper_bwd_gproj.cu,
   one warpgroup's keys x one 64-query tile); the HS-128 kernel's head size and its probe's tile (one CTA's keys
   x one query tile). */
#define ATTN_HOPPER_BWD_HS 64
#define ATTN_HOPPER_BWD_PROBE_KEYS 64
#define ATTN_HOPPER_BWD_PROBE_QUERIES 128
#define ATTN_HOPPER_BWD_PROBE_TILE 64
#define ATTN_HOPPER_BWD128_HS 128
#define ATTN_HOPPER_BWD128_PROBE_KEYS 128
#define ATTN_HOPPER_BWD128_PROBE_QUERIES 64
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

/* Which mbarrier a hung wait was on (AttnHopperHang.site). */
enum { ATTN_HANG_NONE = 0, ATTN_HANG_KV_FULL = 1, ATTN_HANG_FULL = 2, ATTN_HANG_EMPTY = 3, ATTN_HANG_PROBE = 4 };
typedef struct {
    int site, index, parity, block_x, block_y, thread;
} AttnHopperHang;
void attention_hopper_bwd_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
/* the HS-128 kernel's record pointer alone (attention_hopper_bwd_watch_hangs sets both) */
void attention_hopper_bwd128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
/* "kv_full (K/V tiles)", ...; "none" for ATTN_HANG_NONE or an unknown site. */
const char* attn_hopper_hang_site_name(int site);

/* qkv [1, T, 3, NH, 64] and dout [1, T, NH, 64] with T <= 128 (tokens past T read as zeros), head `head`, one
   consumer warpgroup at warpgroup 1's offsets: keys 64..127 (the K/V tiles' second halves), queries 0..127
   (stage 1, two 64-row boxes), no softmax (P := S^T, dS := dP^T). Writes five FP32 tiles, row-major,
   consecutively at `tiles`: S^T = K Q^T, dP^T = V dO^T [64 keys][128 queries], dV = bf(S^T) dO,
   dK = bf(dP^T) Q [64 keys][64], dQ = bf(dP^T)^T K [128 queries][64]; and adds that dQ once more, through the
   kernel's FP32 dQ tile and TMA reduce-adds, into rows 0..T-1 of head `head` of dq_acc [NH][T][64] FP32 (the
   caller zeroes it; rows past T and other heads must stay 0). Two launches; synchronous launch errors die;
   the caller synchronises and reads the hang record (a give-up leaves garbage tiles). */
void attention_hopper_bwd_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                       float* tiles, float* dq_acc);

/* HS 128: qkv [1, T, 3, NH, 128] and dout [1, T, NH, 128] with T <= 128 (tokens past T read as zeros), head
   `head` at token 0 (keys 0..127, queries 0..63); writes five FP32 tiles, row-major, consecutively at `tiles`:
   S^T = K Q^T, dP^T = V dO^T [128 keys][64 queries], dV = bf(S^T) dO, dK = bf(dP^T) Q [128 keys][128],
   dQ = bf(dP^T)^T K [64 queries][128]. Synchronous launch errors die; the caller synchronises and reads the
   hang record (a give-up leaves garbage tiles). */
void attention_hopper_bwd128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                          float* tiles);

/* ---- the row pass (attention_hopper_rows.cu) ---- */
#define ATTN_HOPPER_ROWS_PROBE_ROWS 128 /* query rows (and keys) of the probe's tile */

int attention_hopper_rows_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);

void attention_backward_hopper_rows(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                    const float* stats, float* D, float* lambda, __nv_bfloat16* dqkv,
                                    cudaStream_t stream);

/* qkv [1, T, 3, NH, HS], dout [1, T, NH, HS], HS 64 or 128, T <= 128 (tokens past T read as zeros), head
   `head` at token 0: s_tile, dp_tile [128][128], x_tile, y_tile [128][HS] FP32, row-major (device pointers).
   Synchronous launch errors die; the caller synchronises (HS 128: and reads the hang record). */
void attention_hopper_rows_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                        float* s_tile, float* dp_tile, float* x_tile, float* y_tile);

/* HS 128 (attention_hopper_rows128.cu): gproj or fp32 only (dies otherwise); attention_backward_hopper_rows checks
   the rest and calls it. Its probe (attention_hopper_rows_layout_probe calls it) and its hang record's installer
   (attention_hopper_bwd_watch_hangs calls it). */
#define ATTN_HOPPER_ROWS128_HS 128
void attention_backward_hopper_rows128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv,
                                       const __nv_bfloat16* dout, const float* stats, float* D, float* lambda,
                                       __nv_bfloat16* dqkv, cudaStream_t stream);
void attention_hopper_rows128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                           const __nv_bfloat16* dout, float* s_tile, float* dp_tile, float* x_tile,
                                           float* y_tile);
void attention_hopper_rows128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);

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
   gives up, records the barrier (through attention_hopper_bwd_watch_hangs' record) and writes NaN over its
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

/* Installs the hang record of this pass's translation unit (a __device__ pointer is per object without
   relocatable device code). attention_hopper_bwd_watch_hangs calls it: callers install once, there. It
   installs the HS-128 kernel's too (attention_hopper_gproj_keys128_watch_hangs, that object's pointer alone). */
void attention_hopper_gproj_keys_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_gproj_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);

/* Probe of the one operand form only this pass uses, qkv [1, T, 3, NH, 64] and dout [1, T, NH, 64] with T <= 64
   (tokens past T read as zeros), head `head` at token 0, lambda [64] per query (device): four [64][64]
   FP32 tiles, row-major, consecutively at `tiles`: S^T = K Q^T, dP^T = V dO^T,
   dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two register-A batches into one accumulator), and the correction
   bf(-lambda_q S^T) Q alone. Synchronous launch errors die; the caller synchronises. */
void attention_hopper_gproj_keys_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                              const __nv_bfloat16* dout, const float* lambda, float* tiles);

/* HS 128's probe (one CTA's keys x one query tile): qkv [1, T, 3, NH, 128] and dout [1, T, NH, 128] with
   T <= 128 (tokens past T read as zeros), head `head` at token 0 (keys 0..127, queries 0..63 through stage 1),
   lambda [64] per query (device): five FP32 tiles, row-major, consecutively at `tiles`: S^T = K Q^T,
   dP^T = V dO^T [128 keys][64 queries], dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two register-A batches into one
   accumulator), the correction bf(-lambda_q S^T) Q alone, dV = bf(S^T) dO [128 keys][128]. Three launches;
   synchronous launch errors die; the caller synchronises and reads the hang record (a give-up leaves garbage
   tiles). */
#define ATTN_HOPPER_GPROJ128_PROBE_KEYS 128
#define ATTN_HOPPER_GPROJ128_PROBE_QUERIES 64
void attention_hopper_gproj_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                 const __nv_bfloat16* dout, const float* lambda, float* tiles);

/* ---- fp32's key-major pass (attention_hopper_bwd64_fp32.cu: HS 64 and the entry points;
   attention_hopper_bwd128_fp32.cu: HS 128) ----
   dK, dV and the dQ partials of fp32 mode (attn_bwd_kernel<128, ATTN_FP32>'s rounding points, FP32 sum order
   only): P and dS in FP32, dV += bf(P)^T dO + bf(P - bf(P))^T dO, dK += bf(dS)^T Q + bf(r1)^T Q, and
   dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K by TMA reduce-add (r1 = dS - bf(dS)); setmaxnreg 24/240, the
   CTA of attention_hopper_bwd128.cu (harness dev/attention_lab/hopper_bwd128_fp32.cu: within 4 BF16 ulps of
   force_portable; 1.335 ms alone at B2 H16 T4096). attention_backward_cuda runs it in attn_bwd_kernel<128, ATTN_FP32>'s place on sm_90 (not
   force_portable) after the prep kernel (zeroed dq_acc) and the Hopper row pass (D); the dQ post-pass follows.
   A wait that runs out gives up (no trap), records the barrier through attention_hopper_bwd_watch_hangs'
   record, and the CTA writes NaN over its dK and dV rows.
   HS 64: the same numerics in a 288-thread CTA (64-query steps; two consumer warpgroups, a producer warp, no
   setmaxnreg; dV/dK as two chained m64n64k16 RS batches each, dQ over the three staged terms; harness
   dev/attention_lab/hopper_bwd64_fp32.cu: within 4 BF16 ulps of force_portable, the fp32 backward 1.13x /
   1.17x faster at B8 H16 T1024 / B4 H16 T2048 d64). attention_backward_cuda runs it in
   attn_bwd_kernel<64, ATTN_FP32>'s place on sm_90 exactly as HS 128's. Its waits are bounded (~2 s) and TRAP
   (no setmaxnreg to lose), naming the barrier in the same record first. */
#define ATTN_HOPPER_FP32_KEYS128_HS 128
#define ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS 128
#define ATTN_HOPPER_FP32_KEYS128_PROBE_QUERIES 64
/* 1 iff mode fp32, head size 128, B*NH <= 65535, qkv and dout 16-byte aligned. Says nothing about the device. */
int attention_hopper_fp32_keys128_supports(AttnMode mode, AttnShape s, const void* qkv, const void* dout);

/* The pass alone (asynchronous on `stream`): reads qkv, dout, stats {m, l} and D [B*NH*T]; atomically adds
   s-less dQ partials into the zeroed dq_acc [B*NH*T][128] FP32 (TMA reduce-add); writes the k and v slots of
   dqkv (the q slot is left to the post-pass). Dies with a hint if unsupported. */
void attention_backward_hopper_fp32_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                            const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                            cudaStream_t stream, int dq_slices = 0);

/* Installs this pass's hang record (its translation unit's pointer); attention_hopper_bwd_watch_hangs calls it. */
void attention_hopper_fp32_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);

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

/* Installs the hang record of both head sizes' objects (HS 64's pointer, then
   attention_hopper_fp32_keys128_watch_hangs); attention_hopper_bwd_watch_hangs calls it: callers install once,
   there. */
void attention_hopper_fp32_keys_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);

/* qkv [1, T, 3, NH, 128] and dout [1, T, NH, 128] with T <= 128 (tokens past T read as zeros), head `head` at
   token 0 (keys 0..127, queries 0..63 through stage 1), no softmax (P := S^T, dS := dP^T, split and staged as
   the kernel does): seven FP32 tiles, row-major, consecutively at `tiles`: S^T = K Q^T, dP^T = V dO^T
   [128 keys][64 queries]; dV = (bf(S^T) + bf(S^T - bf(S^T))) dO, dK = (bf(dP^T) + bf(r1)) Q [128 keys][128];
   dQ = (bf(dP^T) + bf(r1) + bf(r1 - bf(r1)))^T K, the bf(r1) term alone, the bf(r1 - bf(r1)) term alone
   [64 queries][128]. Five launches; synchronous launch errors die; the caller synchronises and reads the hang
   record (a give-up leaves garbage tiles). */
void attention_hopper_fp32_keys128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                                const __nv_bfloat16* dout, float* tiles);

/* HS 64: qkv [1, T, 3, NH, 64] and dout [1, T, NH, 64] with T <= 64 (tokens past T read as zeros), head `head` at
   token 0, one consumer warpgroup at warpgroup 1's offsets (stage 1), no softmax (P := S^T, dS := dP^T, split and
   staged as the kernel does): seven [64][64] FP32 tiles, row-major, consecutively at `tiles`: S^T = K Q^T,
   dP^T = V dO^T; dV = (bf(S^T) + bf(S^T - bf(S^T))) dO, dK = (bf(dP^T) + bf(r1)) Q [keys][dims];
   dQ = (bf(dP^T) + bf(r1) + bf(r1 - bf(r1)))^T K, the bf(r1) term alone, the bf(r1 - bf(r1)) term alone
   [queries][dims]. Five launches; synchronous launch errors die; the caller synchronises (a hung wait traps:
   a CUDA error, the barrier in the hang record). */
#define ATTN_HOPPER_FP32_KEYS64_PROBE_TILE 64
void attention_hopper_fp32_keys64_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                               const __nv_bfloat16* dout, float* tiles);

#endif /* ATTENTION_ATTENTION_HOPPER_BWD_CUH */
