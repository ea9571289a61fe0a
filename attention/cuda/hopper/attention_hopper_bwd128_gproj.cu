/*
 * attention/cuda/hopper/attention_hopper_bwd128_gproj.cu - the Hopper (sm_90a) key-major pass of gproj mode's backward at
 * head size 128 (dK and dV only) on wgmma + TMA, a producer warpgroup and setmaxnreg. The API and which calls
 * it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (gproj's chain at HS 128;
 * the HS-64 pass is attention_hopper_bwd_gproj.cu).
 *
 * Why: at HS 128 the portable gproj backward (gproj is the users' default mode: prep + attn_bwd_rows_kernel
 * + attn_bwd_kernel<128, ATTN_GPROJ>, attention/cuda/attention_cuda.cu) is about 2.2x bf16's Hopper backward at
 * B2 H16 T4096 d128, and the key-major kernel is most of it. This kernel is attention_hopper_bwd128.cu's CTA
 * with gproj's numerics, as attention_hopper_bwd_gproj.cu is at HS 64: no dQ GEMM, no atomics, no dS staging
 * tile (the row pass wrote dQ), one more register-A GEMM into dK. Its lab, dev/attention_lab/hopper_bwd128_gproj.cu,
 * checks the layout (all five products) and this kernel against attention_backward_cuda(gproj, force_portable)
 * on the same D and lambda (dK within 1 BF16 ulp, dV bit-equal), and times it: 1.26x / 1.39x the portable
 * gproj backward at B8 H8 T1024 / B2 H16 T4096 d128 (dev/results/attention_hopper_2026-11-29.md). Beyond the
 * lab's kernel, production adds the give-up bookkeeping below (the NaN rows and the barrier before them).
 *
 * What it computes (docs/attention_numerics.md, gproj; attn_bwd_kernel<128, ATTN_GPROJ>'s rounding points):
 *   per query tile of 64 (from the diagonal on), per consumer warpgroup (64 keys):
 *     S^T = K_w Q^T, dP^T = V_w dO^T         FP32 (wgmma SS)
 *     P = exp2((S - m) c) * fl(1/l)           repair's softmax, which gproj uses (stats {m, l})
 *     dS = P (dP - D)                         FP32; D = dO . O (the BF16 O); masked entries exactly 0
 *     dV += bf(P)^T dO
 *     dK += bf(dS)^T Q + bf(-lambda_q P)^T Q  the correction its own BF16 operand: -lambda_q * P in FP32, rounded
 *                                             once (the portable kernel's `alp`; rounding dS - lambda P together
 *                                             would lose it)
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the q slot is not touched. D and lambda
 *   [B*NH*T] are the workspace slots of carve_workspace (attention_cuda.cu) that the row pass writes (the Hopper
 *   one forms D itself; the portable chain's prep kernel writes it for the portable row pass).
 * Only the FP32 sum order differs from the portable kernel (wgmma's k order; dK sums the tile's 4 bf(dS)
 * k-steps, then the 4 correction k-steps, where attn_bwd_kernel interleaves them per 16 queries; 64-query
 * tiles here, 32 there): dK within a few BF16 ulps of the row scale (the lab: at most 1), dV bit-equal on the lab's cases.
 *
 * Layout (attention_hopper_bwd128.cu's; FlashAttention-3's d128 split, read in Dao-AILab/flash-attention
 * hopper/, no code copied): one CTA = 128 keys of one (b, h), 384 threads: two consumer warpgroups of 64 keys
 * and a producer warpgroup (one warp issues TMA and writes the row state {m, fl(1/l), D} and lambda; setmaxnreg
 * 24 there, 240 in the consumers: 128 * 24 + 256 * 240 = 384 * 168). Q/dO tiles of 64 queries in a 2-stage
 * pipeline (full[s]: 32 producer lanes + the TMA bytes; empty[s]: the 256 consumer threads). Per step and
 * consumer warpgroup:
 *   S^T, dP^T                      m64n64k16 SS, 8 k-steps over two 64-column chunks            32 + 32 regs
 *   bf(P), bf(dS), bf(-lambda P)   packed one k-step (16 queries) at a time, so the FP32 P and dS die step
 *                                  by step                                                      16 + 16 + 16
 *   dV += bf(P)^T dO               m64n128k16 RS, dO N-major (LBO = one 8 KB chunk)             64
 *   dK += bf(dS)^T Q, then dK += bf(-lambda P)^T Q: two batches issued back to back into the ONE
 *                                  accumulator (wgmma orders same-accumulator operations)      64
 * Shared memory 129 KiB: K, V 32 KB each (two 64-column chunks of 128 rows), Q, dO 2 stages x 16 KB each,
 * the row state float4 [2][64], lambda float [2][64] (kept apart from the float4: as its .w the consumer code
 * spilled 12 bytes at 240 registers), barriers. qkv and dout are hopper_wgmma.cuh's 4-D TMA tensors {HS, heads,
 * T, B} in 64-column boxes of 64 tokens (128-byte swizzle, zero fill past T).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3; `make hopper_bwd128_gproj-regs` prints them): the kernel 168 at
 * entry (240 after setmaxnreg.inc), 0 B spill, no C75xx warning (0 spills is also the sign setmaxnreg took:
 * at 168 this code spills); the probe kernels (256 threads, no setmaxnreg) 90 / 218 / 106, 0 spill.
 *
 * Hangs (a pipeline protocol bug): as attention_hopper_bwd128.cu. Every mbarrier wait is bounded (~2 s of
 * clock64; a legitimate wait is microseconds) and GIVES UP instead of trapping (hopper_bwd_common.cuh's
 * mbar_wait_give_up; a __trap() on the consumer path makes ptxas ignore setmaxnreg.inc): it records the barrier
 * in the host-mapped AttnHopperHang record (when a lab installed one through hopper_lab_hooks.cuh; first give-up
 * wins), sets the CTA's abort flag (every later wait of the CTA returns at once) and runs on; at the end the
 * consumers, after a barrier that makes every give-up of the CTA visible, write NaN over all their dK and dV
 * rows. A hang thus ends within seconds as NaN gradients (the tests' and the trainer's NaN checks fail
 * loudly), never as a stuck job or silently wrong numbers.
 *
 * Not done: the longest-first tile order over all heads (tile_order.cuh; the HS-64 pass has it, this grid is
 * blockIdx.x = key tile); 3 stages or a persistent schedule; overlapping the next tile's S^T/dP^T
 * with this tile's dV/dK batch (FA3's two-tile pipelining; the registers would not hold a second S^T/dP^T next to
 * 48 A registers). fp32 mode's key-major pass (it also makes dQ) is attention_hopper_bwd128_fp32.cu.
 */
/* the kernel template (kernel_keys128.cuh), instantiated here for gproj */
#include "attention/cuda/hopper/kernel_keys128.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_keys_pass<128, ATTN_GPROJ>(const HopperBwdCall& c) { keys128_launch<ATTN_GPROJ>(c); }

void attention_hopper_gproj_keys128_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
