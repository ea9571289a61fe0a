/*
 * attention/cuda/hopper/attention_hopper_bwd64_fp32.cu - the Hopper (sm_90a) key-major pass of fp32 mode's backward at
 * head size 64 (dK, dV and the dQ partials) on wgmma + TMA: a 384-thread CTA (two consumer warpgroups, a producer
 * warpgroup, setmaxnreg 40 / 232, 64-query steps) with fp32's split terms (HS 128:
 * attention_hopper_bwd128_fp32.cu). The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh
 * (fp32's chain); attention_backward_cuda runs it in attn_bwd_kernel<64, ATTN_FP32>'s place on sm_90 after the
 * Hopper row pass.
 *
 * Why: with the PORTABLE mma.sync key-major kernel attn_bwd_kernel<64, ATTN_FP32> (attention_cuda.cu) after the
 * Hopper row pass, fp32 at HS 64 costs nearly 2x bf16's fwd+bwd at the HS-64 shapes. With this pass the fp32
 * backward is 1.13x / 1.17x faster at B8 H16 T1024 / B4 H16 T2048 d64 (the pass does 9 causal BF16 GEMMs), dQ,
 * dK, dV within 4 BF16 ulps of attention_backward_cuda(fp32, force_portable)
 * (dev/results/attention_hopper_2026-11-29.md). dev/attention_lab/hopper_bwd64_fp32.cu is the harness that
 * checks and times it.
 *
 * What it computes (docs/attention_numerics.md "fp32"; attn_bwd_kernel<64, ATTN_FP32>'s rounding points,
 * operation for operation; only the FP32 summation order differs):
 *   S^T = K_w Q^T, dP^T = V_w dO^T (FP32), P = exp2((S - m) c) * fl(1/l), dS = P (dP - D), masked entries 0;
 *   dV += bf(P)^T dO + bf(P - bf(P))^T dO               (two RS n64 batches chained into one accumulator)
 *   dK += bf(dS)^T Q + bf(r1)^T Q, r1 = dS - bf(dS)      (the same chaining)
 *   dQ_acc += (bf(dS) + bf(r1) + bf(r1 - bf(r1))) K      (three staged terms, one FP32 accumulator: 24
 *                                                        significant bits, since dQ sums dS against keys that
 *                                                        may share a large common offset)
 *   dK = bf(s acc), dV = bf(acc) into the k and v slots of dqkv; the s-less dQ partial goes to the workspace's
 *   FP32 accumulator by TMA reduce-add, and the portable post-pass (attn_bwd_dq_kernel) writes dQ = bf(s acc).
 *   Workspace contract = attn_bwd_kernel's: the prep kernel zeroed dq_acc [B*NH*T][64], the row pass wrote D.
 *   DQ_SLICES (the deterministic backward, docs/determinism.md): the partials go to the key block's own zeroed
 *   slice, one add per slice row (a step's dQ covers the block's 128 keys), so its bits are the partial's.
 *
 * Layout: 384 threads (two consumer warpgroups of 64 keys and a producer warpgroup, one warp of which works; setmaxnreg
 * 40 / 232; 2 Q/dO stages; two K/V buffers, item u in buffer u % 2), over work items of 128 keys of a head taken from a
 * queue by one CTA per SM (ATTN_BWD_PERSISTENT=0: one CTA per item), as the bf16 pass does (attention_hopper_bwd.cu's
 * comment has the item protocol), with hopper_wgmma.cuh's 64 x 64 steps, hopper_bwd_common.cuh's producer and epilogue
 * and mode_numerics.cuh's row state and split terms (pack_split_step). Per step and consumer warpgroup:
 *   S^T, dP^T                   warpgroup_two_ss_64x64                                   32 + 32 regs
 *   (the named barrier kTermsFreeBarrier, if the other warpgroup read this one's tiles at the step before)
 *   P, dS one k-step (16 queries) at a time -> A words bf(P), bf(P - bf(P)), bf(dS), bf(r1) (16 registers per
 *     k-step) and bf(dS), bf(r1), bf(r1 - bf(r1)) stored to the warpgroup's three tiles [query][key]
 *   dV, dK: one batch of 16 m64n64k16 RS (warpgroup_rs_issue_n64, two chained per accumulator):
 *     64 accumulator + 64 A registers in flight
 *   (a consumer barrier: both warpgroups' tiles written)
 *   dQ, in turns by step parity: the warpgroup whose turn it is computes the step's 64 query rows over the item's
 *     128 keys from both warpgroups' tiles: six commit groups of 4 RS wgmmas (a term and a 64-key half each) into
 *     one 32-register accumulator, A loaded into two alternating register sets of 16 (warpgroup_dq_three_terms<2>);
 *     it arrives on kTermsFreeBarrier, writes the partial into its swizzled FP32 dQ tile (sent from every other
 *     step: the send two steps back must have read it) and sends it with two TMA reduce-adds
 *     (attention_hopper_bwd.cu's flush, at 64 rows). The other warpgroup goes on to its next step's scores.
 *   One partial per step and item instead of one per warpgroup: half the reduce-adds, as bf16's and repair's dq_rows
 *   (dev/results/keymajor_dq_all_keys_2026-12-05.md); fp32's backward 2.6-3.4% faster than with each warpgroup's
 *   own 64-key partial (dev/results/fp32_dq_turns_2026-12-05.md). The protocol model plays the hand-off
 *   (dev/attention_lab/protocol_model.py).
 * Shared memory: two K/V buffers (K, V 16 KB each), Q, dO 2 stages x 8 KB, three dS tiles [64][72] BF16 per
 * warpgroup (54 KB), row state 2 KB, barriers, two 16 KB FP32 dQ tiles: Keys64TilePlan<true>::kAlloc = 190464
 * bytes (<= 227 KB, asserted).
 * Registers (`make hopper_bwd64_fp32-regs`, ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math):
 * keys64_kernel<ATTN_FP32, *> 168 at entry, 232 in the consumers after setmaxnreg.inc, no C75xx warning, 0 bytes
 * spill (with a producer warp and no setmaxnreg, 288 threads at 168 registers each, the kernel without slices
 * spilled 8 bytes); the probe kernels 90 (scores, dQ parts) / 157 (dK + dV), 0 spill. With all three dQ terms' A
 * fragments live at once (48 registers, one batch of 12 wgmmas) ptxas serialised the wgmmas (C7512) and spilled 16
 * bytes at 168 registers: hence the two alternating sets.
 *
 * Hangs (a pipeline protocol bug): every mbarrier wait is bounded (~2 s of clock64; a legitimate wait is
 * microseconds) and GIVES UP (a trap on the consumer path would make ptxas ignore setmaxnreg.inc), first writing
 * which barrier it was into the host-mapped AttnHopperHang record that a lab installs through
 * hopper_lab_hooks.cuh's attention_hopper_fp32_keys_watch_hangs; the consumers then write NaN over their item's dK
 * and dV and the producer over the items it took and the rest of the queue (attention_hopper_bwd.cu's comment).
 * A hang is thus NaN gradients and a named barrier, never a stuck job or a stale gradient.
 *
 * The layout probe (dev/attention_lab/probes/probe_keys64_fp32.cu, run by dev/attention_lab/hopper_bwd64_fp32.cu): one
 * warpgroup at warpgroup 1's offsets, stage 1, one step, no softmax, P := S^T and dS := dP^T split and staged
 * through the kernel's own helpers: S^T, dP^T; dV and dK with their two chained split terms; dQ over the three
 * staged terms and its second and third terms alone (2^-8 / 2^-16 of the first: invisible next to it).
 *
 * Not adopted: a third Q/dO stage in the 32 KB the turns freed (0.2-0.6% slower,
 * dev/results/fp32_dq_turns_2026-12-05.md): with the turns, the warpgroup whose turn it is not already starts its
 * next step's scores while the other computes dQ.
 * Device code: kernel_keys64.cuh, the HS-64 key-major template of every mode (traits Keys64Mode<MODE>); this
 * file instantiates it for fp32: its passes (hopper_keys_pass<64, ATTN_FP32, DQ_SLICES>, called by
 * attention_hopper_bwd_dispatch.cu) and the hang-record installer.
 */
#include "attention/cuda/hopper/kernel_keys64.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_keys_pass<64, ATTN_FP32>(const HopperBwdCall& c) { keys64_launch<ATTN_FP32>(c); }

void attention_hopper_fp32_keys_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
