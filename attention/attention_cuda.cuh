/*
 * attention/attention_cuda.cuh - the CUDA entry points of the switchable
 * attention module (every mode of attention/attention.h: our kernels for the
 * four emulated modes; ATTN_CUDNN goes to attention/cudnn/, cuDNN's kernel,
 * which ignores force_portable and tile_max_shift, refuses deterministic and
 * owns its own workspace).
 *
 * Why: the trainer, the probe and the benchmarks call attention through this
 * one API, whatever the mode; the mode is a run-time argument, the layout and
 * the saved state (out + stats) are the same for every mode, so switching the
 * mode changes nothing else (see attention.h and docs/attention_numerics.md).
 *
 * Layouts (device pointers, BF16 unless noted; see attention.h):
 *   qkv [B, T, 3, NH, HS], out/dout [B, T, NH, HS], dqkv like qkv,
 *   stats [B, NH, T, 2] fp32 (bf16 mode {LSE, 0}; other modes {m, l}).
 * Supported: HS 64 or 128, any T >= 1, causal, every BF16 pointer 16-byte
 * aligned (the kernels move 16-byte vectors). Other shapes and pointers die
 * with a clear message. Kernels are flash-style (no T x T matrix in memory), tensor cores
 * with BF16 operands and FP32 accumulation; docs/attention_kernels.md says
 * what each kernel does per mode and what it costs.
 *
 * Offers:
 *   attention_cuda_workspace_bytes - device scratch the backward needs (fp32 dQ
 *       accumulator, per-row D and gproj lambda); the forward needs none. With
 *       AttnOptions.deterministic = 1 in bf16, repair and fp32 mode the dQ
 *       accumulator is one slice per block of ATTN_BWD_KEY_BLOCK (128) keys:
 *       (ceil(T / 128) * B*NH*T*HS + 2 * B*NH*T) * 4 bytes; a shape whose
 *       deterministic workspace would pass ATTN_CUDA_DETERMINISTIC_MAX_BYTES is
 *       refused (dies with the numbers and the fix). The two-argument form is
 *       the size for the default options (deterministic = 0): a caller that
 *       sets deterministic sizes its workspace with the three-argument form.
 *   attention_forward_cuda  - writes out and stats (stats are read back by the
 *       backward of the same mode). Which kernel runs: on a compute-capability
 *       9.0 device (H100/H200) the Hopper wgmma forward
 *       (attention/cuda/hopper/attention_hopper.cuh) for every mode it computes exactly
 *       (all four; not repair's tile-max-shift arm), everywhere else and with
 *       AttnOptions.force_portable = 1 the portable mma.sync forward. Both
 *       write the same out (to about one BF16 ulp) and the same stats, so
 *       either backward path reads what either forward wrote.
 *   attention_forward_cuda_path - which of the two attention_forward_cuda would
 *       run for these arguments on the current device (tests and benchmarks
 *       print it); attn_fwd_path_name names it.
 *   attention_backward_cuda - OVERWRITES dqkv (no accumulation). workspace
 *       must hold attention_cuda_workspace_bytes(s, mode, opt) bytes; its
 *       contents need not be initialised. With AttnOptions.deterministic = 1
 *       every mode gives the same dqkv bits on every call with the same
 *       inputs (bf16, repair, fp32: the dQ partials of each 128-key block go
 *       to a slice of their own and the post-pass sums the slices in a fixed
 *       order; gproj: as with it off, whose dQ has no partials); off, bf16,
 *       repair and fp32 add the partials in arrival order (dK, dV and gproj's
 *       dQ are deterministic either way). docs/determinism.md. Which kernels run: always the portable prep
 *       (D, zeroed dQ accumulator) and dQ post-pass; on a compute-capability
 *       9.0 device the passes between are the Hopper wgmma chain of the
 *       mode (attention/cuda/hopper/attention_hopper_bwd.cuh), at HS 64 and
 *       128: in bf16 and repair mode (not the tile-max-shift arm) the
 *       key-major pass; in fp32 and gproj mode the row pass, then the
 *       mode's key-major pass. Everywhere else and with AttnOptions.force_portable = 1 the
 *       portable mma.sync kernels. Both agree to a few BF16 ulps (FP32 sum
 *       order only).
 *   attention_backward_cuda_path - which of the two the backward would take
 *       ("hopper" if any Hopper kernel runs); attn_bwd_path_name names it.
 *       Both path functions answer "cudnn" for mode cudnn (cuDNN's kernel).
 *   attention_cuda_check_shape - dies with a hint if the shape is unsupported.
 * All calls are asynchronous on `stream`.
 */
#ifndef ATTENTION_ATTENTION_CUDA_CUH
#define ATTENTION_ATTENTION_CUDA_CUH

#include <stddef.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "common/cuda_utils.cuh"

/* Largest workspace the deterministic backward may ask for (16 GiB): its dQ slices grow as T^2 (ceil(T / 128)
   copies of the FP32 dQ), so a long sequence would otherwise eat the device's memory silently. */
#define ATTN_CUDA_DETERMINISTIC_MAX_BYTES (16ull << 30)

size_t attention_cuda_workspace_bytes(AttnShape s, AttnMode mode, AttnOptions opt);
size_t attention_cuda_workspace_bytes(AttnShape s, AttnMode mode); /* default options */

void attention_cuda_check_shape(AttnShape s, AttnMode mode);

/* ATTN_FWD_CUDNN / ATTN_BWD_CUDNN: mode cudnn, whose calls run cuDNN's kernel (attention/cudnn/) whatever the options. */
typedef enum { ATTN_FWD_PORTABLE = 0, ATTN_FWD_HOPPER = 1, ATTN_FWD_CUDNN = 2 } AttnFwdPath;
AttnFwdPath attention_forward_cuda_path(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv);
const char* attn_fwd_path_name(AttnFwdPath path); /* "portable", "hopper" or "cudnn" */

void attention_forward_cuda(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                            __nv_bfloat16* out, float* stats, void* workspace, cudaStream_t stream);

typedef enum { ATTN_BWD_PORTABLE = 0, ATTN_BWD_HOPPER = 1, ATTN_BWD_CUDNN = 2 } AttnBwdPath;
AttnBwdPath attention_backward_cuda_path(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                                         const __nv_bfloat16* dout);
const char* attn_bwd_path_name(AttnBwdPath path); /* "portable", "hopper" or "cudnn" */

void attention_backward_cuda(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                             const __nv_bfloat16* out, const float* stats, const __nv_bfloat16* dout,
                             __nv_bfloat16* dqkv, void* workspace, cudaStream_t stream);

#endif /* ATTENTION_ATTENTION_CUDA_CUH */
