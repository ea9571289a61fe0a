/*
 * attention/cuda/hopper/attention_hopper_bwd128_fp32.cu - the Hopper (sm_90a) key-major pass of fp32 mode's backward at
 * head size 128 (dK, dV and the dQ partials) on wgmma + TMA, a producer warpgroup and setmaxnreg. The API and
 * which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (fp32's chain: attention_backward_cuda
 * runs it in attn_bwd_kernel<128, ATTN_FP32>'s place on sm_90 after the Hopper row pass). fp32 at HS 64:
 * attention_hopper_bwd64_fp32.cu.
 *
 * Why: with the PORTABLE mma.sync key-major kernel attn_bwd_kernel<128, ATTN_FP32> (attention/cuda/attention_cuda.cu)
 * after the Hopper row pass, fp32 mode's fwd+bwd at B2 H16 T4096 d128 costs more than the 2.5x bf16's that is
 * the target. This kernel is attention_hopper_bwd128.cu's CTA (the bf16/repair pass) with fp32's numerics: the
 * fp32 backward (prep + Hopper row pass + this kernel + post-pass) is 1.56x faster than with the portable
 * key-major kernel at B2 H16 T4096 d128 (fp32/bf16 backward 3.32x -> 2.13x), all three slots within 4 BF16 ulps
 * of attention_backward_cuda(fp32, force_portable) (dev/results/attention_hopper_2026-11-29.md). The
 * producer's K/V load and stage fill and the dK/dV epilogue are hopper_bwd_common.cuh's keymajor_load_kv /
 * keymajor_fill_stage / keymajor_store_dkv. dev/attention_lab/hopper_bwd128_fp32.cu is the harness that checks
 * and times it.
 *
 * What it computes (docs/attention_numerics.md "fp32"; attn_bwd_kernel<128, ATTN_FP32>'s rounding points,
 * operation for operation; only the FP32 summation order differs):
 *   per CTA 128 keys of one (b, h), two consumer warpgroups of 64 keys; per query tile of 64 (from the
 *   diagonal on), per warpgroup:
 *     S^T = K_w Q^T, dP^T = V_w dO^T          FP32 (wgmma SS; hopper_bwd_common.cuh's keymajor128_scores)
 *     P = exp2((S - m) c) * fl(1/l)            (fp32's forward stores {m, l}; recompute_prob's non-bf16 arm)
 *     dS = P (dP - D)                          FP32, D from the workspace (the row pass's sum_j P dP);
 *                                              masked entries exactly 0
 *     dV += bf(P)^T dO + bf(P - bf(P))^T dO    two m64n128k16 RS batches chained into one accumulator
 *     dK += bf(dS)^T Q + bf(r1)^T Q            r1 = dS - bf(dS) (exact in FP32); the same chaining
 *     dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K   three BF16 terms (24 significant bits: dQ sums dS
 *                                              against keys that may share a large common offset, so a
 *                                              two-term split would leak like bf16 mode's rounding; the
 *                                              portable kernel's comment), each staged in shared memory as
 *                                              [query][key]; summed in one FP32 accumulator per warpgroup
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the s-less dQ partial (one per 128 keys) goes
 *   to the FP32 accumulator by TMA reduce-add, and the portable post-pass (attn_bwd_dq_kernel) writes
 *   dQ = bf(s acc). Workspace contract = attn_bwd_kernel's: the prep kernel zeroed dq_acc [B*NH*T][128], the
 *   row pass wrote D [B*NH*T] (carve_workspace's slots). DQ_SLICES (the deterministic backward,
 *   docs/determinism.md): the partials go to the key block's own zeroed slice, one add per element (warpgroup w
 *   owns dQ columns 64w..64w+63).
 *
 * Layout (attention_hopper_bwd128.cu's CTA: FlashAttention-3's d128 split, read in Dao-AILab/flash-attention
 * hopper/, no code copied): 384 threads, two consumer warpgroups (setmaxnreg 240) and a producer warpgroup
 * (24; one warp: TMA, row state {m, fl(1/l), D}). Q/dO tiles of 64 queries in 2 stages; grid in the
 * longest-first order of tile_order.cuh. Per step and consumer warpgroup:
 *   S^T, dP^T                   m64n64k16 SS, 8 k-steps                                         32 + 32 regs
 *   (consumers_sync: both warpgroups have read the previous step's dS tiles - they are single-buffered)
 *   P, dS one k-step (16 queries) at a time (mode_numerics.cuh's keymajor_probs_step<ATTN_FP32>) -> A
 *     words bf(P), bf(P - bf(P)), bf(dS), bf(r1) (16 registers per k-step; the FP32 values die step by step),
 *     and bf(dS), bf(r1), bf(r1 - bf(r1)) stored to the three shared tiles [query][key]
 *   dV += [bf(P), bf(P - bf(P))]^T dO, dK += [bf(dS), bf(r1)]^T Q: ONE batch of 16 m64n128k16 RS wgmmas
 *     (keymajor128_rs_issue, two chained per accumulator), 128 accumulator + 64 A registers in flight
 *   (consumers_sync: both warpgroups' halves of the three tiles written)
 *   dQ_half = sum over 3 terms x 2 key halves of A[64 q x 64 keys] K[64 keys x 64 dims]: six commit groups of
 *     4 m64n64k16 RS into one 32-register accumulator, A loaded from the tiles into two alternating register
 *     sets of 16 (wait<1> before a set is reloaded): 128 + 32 + 32 registers
 *   the dQ half into the warpgroup's swizzled FP32 tile, two TMA reduce-adds (attention_hopper_bwd128.cu's flush)
 * Shared memory: K, V 32 KB each, Q, dO 2 stages x 16 KB each, three dS tiles [64][128 + 8] BF16 (51 KB,
 * single-buffered: double-buffering them would pass 227 KB; hence the extra barrier above), row state [2][64]
 * float4, barriers, two 16 KB FP32 dQ tiles: 215 KB (220160 bytes with the alignment slack; SmemPlan's
 * static_assert keeps it <= 227 KB).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math; `make hopper_bwd128_fp32-regs` prints them):
 * keys128_kernel<ATTN_FP32> 168 at entry (240 after setmaxnreg.inc), 8 bytes spill stored and 24 loaded (with the
 * tile order's ids in 64-bit arithmetic, 0), no C75xx warning; the probe
 * kernels 90 (scores, dQ parts) / 218 (dK+dV), 0 spill. What that takes: the producer's
 * two-query row-state loop is not unrolled (`#pragma unroll 1`: unrolled, its 24 registers spilled), and the dQ
 * flush's swizzled column offsets are not hoisted (g through an opaque move).
 *
 * Hangs (a pipeline protocol bug): as attention_hopper_bwd128.cu. Every mbarrier wait is bounded (~2 s of
 * clock64; a legitimate wait is microseconds) and GIVES UP instead of trapping (hopper_bwd_common.cuh's
 * mbar_wait_give_up; a __trap() on the consumer path makes ptxas ignore setmaxnreg.inc): it records the barrier
 * in the host-mapped AttnHopperHang record (when a lab installed one through hopper_lab_hooks.cuh's
 * attention_hopper_fp32_keys128_watch_hangs; first give-up wins), sets the CTA's abort flag (every later wait of
 * the CTA returns at once) and runs on; at the end the consumers, after a barrier that makes every give-up of
 * the CTA visible, write NaN over all their dK and dV rows. A hang thus ends within seconds as NaN gradients
 * (the tests' and the trainer's NaN checks fail loudly), never as a stuck job or silently wrong numbers.
 *
 * The layout probe (dev/attention_lab/probes/probe_keys128_fp32.cu, run by dev/attention_lab/hopper_bwd128_fp32.cu):
 * the two consumer warpgroups, one step, no softmax, P := S^T and dS := dP^T split and staged through the
 * kernel's own helpers: S^T, dP^T; dV and dK with their two chained split terms; dQ over the three staged terms
 * and its second and third terms alone (their contribution is 2^-8 / 2^-16 of the first: invisible next to it).
 *
 * Not done: 3 stages or a
 * persistent schedule; overlapping the next tile's S^T/dP^T with this tile's batches (no registers left).
 */
/* the kernel template (kernel_keys128.cuh), instantiated here for fp32 */
#include "attention/cuda/hopper/kernel_keys128.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_keys_pass<128, ATTN_FP32>(const HopperBwdCall& c) { keys128_launch<ATTN_FP32>(c); }

void attention_hopper_fp32_keys128_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
