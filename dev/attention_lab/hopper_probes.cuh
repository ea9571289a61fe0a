/*
 * dev/attention_lab/hopper_probes.cuh - the layout probes of the production Hopper kernels
 * (dev/attention_lab/probes/probe_*.cu, one object per kernel, ATTN_HOPPER_PROBE_OBJS in attention/module.mk)
 * and the installers of those objects' hang records. Lab code: the labs of dev/attention_lab/ link them; no
 * production program does.
 *
 * Why: a probe runs one tile of its kernel's operand forms (TMA maps, descriptors, swizzle, accumulator
 * mapping, TMA zero fill) through the kernel's own device helpers (attention/cuda/hopper/kernel_*.cuh)
 * against host loops, so a wrong layout is named before the attention checks fail; it needs the kernel's
 * code, not its object, so it lives here and leaves the production objects alone.
 * Tile sizes (the ATTN_HOPPER_*_PROBE_* macros) are each probe's; the probe's source ties them to the
 * kernel's constants with static_asserts.
 */
#ifndef DEV_ATTENTION_LAB_HOPPER_PROBES_CUH
#define DEV_ATTENTION_LAB_HOPPER_PROBES_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/cuda/hopper/attention_hopper.cuh"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_lab_hooks.cuh"

/* The bf16/repair key-major probe at HS 64: one consumer warpgroup's keys x one 128-query step; the 64 x 64
   tile of the HS-64 gproj key-major probe; the HS-128 bf16/repair probe: one CTA's keys x one query tile. */
#define ATTN_HOPPER_BWD_PROBE_KEYS 64
#define ATTN_HOPPER_BWD_PROBE_QUERIES 128
#define ATTN_HOPPER_BWD_PROBE_TILE 64
#define ATTN_HOPPER_BWD128_PROBE_KEYS 128
#define ATTN_HOPPER_BWD128_PROBE_QUERIES 64
#define ATTN_HOPPER_ROWS_PROBE_ROWS 128 /* query rows (and keys) of the row passes' probe tile */
#define ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS 128
#define ATTN_HOPPER_FP32_KEYS128_PROBE_QUERIES 64

/* qkv [1, T, 3, NH, HS] with T <= ATTN_HOPPER_BLOCK_K (tokens past T read as zeros), probing head `head`
   at token 0: S = Q K^T and O = bf(S) V of one tile through the forward's own TMA map and wgmma helpers, written
   as fp32 [ATTN_HOPPER_BLOCK_Q][ATTN_HOPPER_BLOCK_K] and [ATTN_HOPPER_BLOCK_Q][HS] (device pointers).
   Synchronous launch errors die; the caller synchronises. */
void attention_hopper_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, float* s_tile, float* o_tile);

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

/* qkv [1, T, 3, NH, HS], dout [1, T, NH, HS], HS 64 or 128 (HS 128: attention_hopper_rows128_layout_probe), T <= 128 (tokens past T read as zeros), head
   `head` at token 0: s_tile, dp_tile [128][128], x_tile, y_tile [128][HS] FP32, row-major (device pointers).
   Synchronous launch errors die; the caller synchronises (HS 128: and reads the hang record). */
void attention_hopper_rows_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                        float* s_tile, float* dp_tile, float* x_tile, float* y_tile);

/* HS 128's row-pass probe (the same outputs as attention_hopper_rows_layout_probe's at HS 128). */
void attention_hopper_rows128_layout_probe(AttnShape s, int head, const __nv_bfloat16* qkv,
                                           const __nv_bfloat16* dout, float* s_tile, float* dp_tile, float* x_tile,
                                           float* y_tile);

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

/* The probe objects' own hang records (one __device__ pointer per object, as in production); hopper_lab.cuh's
   lab_watch_hangs installs them with the production objects'. */
void attention_hopper_probe_keys64_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_probe_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_probe_keys64_gproj_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_probe_keys128_gproj_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_probe_keys64_fp32_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_probe_keys128_fp32_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);
void attention_hopper_probe_rows128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);

#endif /* DEV_ATTENTION_LAB_HOPPER_PROBES_CUH */
