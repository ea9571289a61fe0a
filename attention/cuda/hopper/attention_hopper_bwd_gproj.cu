/*
 * attention/cuda/hopper/attention_hopper_bwd_gproj.cu - the Hopper (sm_90a) key-major pass of gproj mode's backward at
 * head size 64 (dK and dV only) on wgmma + TMA + a producer warpgroup and setmaxnreg (HS 128:
 * attention_hopper_bwd128_gproj.cu). The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh
 * (gproj's chain).
 *
 * Why: on sm_90 gproj's backward is the Hopper row pass (attention_hopper_rows.cu: D, lambda and all of dQ)
 * + a key-major pass for dK and dV, and the portable mma.sync attn_bwd_kernel<64, ATTN_GPROJ>
 * (attention/cuda/attention_cuda.cu) in that role is the slow piece. bf16/repair's key-major pass is Hopper
 * (attention_hopper_bwd.cu); this kernel is that kernel's forms with gproj's numerics: no dQ GEMM, no
 * atomics, no dS staging (the row pass wrote dQ), and a third register-A GEMM into dK. Its lab is
 * dev/attention_lab/hopper_bwd_gproj.cu (probes, the pass against force_portable, timings): the all-Hopper
 * gproj backward is 1.16x / 1.21x faster than with the portable key-major pass at B8 H16 T1024 / B4 H16
 * T2048 d64, about 1.1x bf16's backward (dev/results/attention_hopper_2026-11-29.md).
 *
 * What it computes (docs/attention_numerics.md, gproj; attn_bwd_kernel<64, ATTN_GPROJ>'s rounding points):
 *   per key tile, for each query tile from the diagonal on (per consumer warpgroup, 64 keys x 64 queries):
 *     S^T = K Q^T, dP^T = V dO^T          (FP32, wgmma SS)
 *     P = exp2((S - m) c) * fl(1/l)        (repair's softmax, which gproj uses; stats {m, l})
 *     dS = P (dP - D)                      (FP32; D = dO . O from the BF16 O, masked entries exactly 0)
 *     dV += bf(P)^T dO                     (wgmma RS, A = the P accumulator repacked)
 *     dK += bf(dS)^T Q + bf(-lambda_q P)^T Q   (two wgmma RS batches into one accumulator; the second A
 *                                           operand is its own BF16 rounding of -lambda_q * P in FP32, as the
 *                                           portable kernel's `alp`: rounding dS - lambda P together would
 *                                           lose the correction)
 *   dK = bf(s dK_acc), dV = bf(dV_acc) into the k and v slots of dqkv. dQ is not touched.
 *   D and lambda [B*NH*T] are the workspace slots carve_workspace (attention_cuda.cu) names and the row pass
 *   writes (D in the prep kernel's sum order, attention/cuda/attn_row_d.cuh).
 * Only the FP32 sum order differs from the portable kernel: dK sums the 4 k-steps of bf(dS) then the 4 of
 * the correction (the portable kernel interleaves them per 16 queries), and wgmma's k order. So dK and dV
 * agree with force_portable within a few BF16 ulps of the row scale (the lab: 4 ulps, never exceeded).
 *
 * Kernel layout: attention_hopper_bwd.cu's (work items of 128 keys of one (b, h), longest key tiles first within
 * sections of heads (tile_order.cuh), one CTA per SM taking each next item from a queue, or with ATTN_BWD_PERSISTENT=0
 * one CTA per item; the item handed to the consumers in a shared slot beside its K/V load; two consumer warpgroups of
 * 64 keys; K/V once per item as two 64-row boxes, in two buffers (item u in buffer u % 2, each with its kv_full,
 * kv_empty and slot), so an item's K and V load while the consumers finish the item before; Q/dO tiles of 64 queries in
 * 3 stages running on across items; full[s]: 32 producer lanes after the row state {m, fl(1/l), D, lambda}, plus the
 * TMA bytes; empty[s]: the 256 consumer threads), except that the producer is a whole warpgroup (one warp of it works)
 * and setmaxnreg gives the consumers 232 registers (40 to the producer): with a producer warp (288 threads, 168
 * registers each) the third A operand costs 92 bytes of spills.
 * Registers (-Xptxas -v, CUDA 13.0): the kernel 168 at entry (the launch bound; 232 after setmaxnreg), 0
 * bytes of spills (the producer keeps the item it fills stages for in shared memory, not in its 40 registers),
 * no C75xx warnings: 0 spills is also the sign that setmaxnreg took effect (the same code
 * without setmaxnreg.inc spills at 168: 24 bytes). The probe 186, 0 spills. Re-check after any change
 * with the nvcc line of `make -n build/attention/cuda/hopper/attention_hopper_bwd_gproj.cu.o` plus -Xptxas -v.
 *
 * Hangs (a pipeline protocol bug): every mbarrier wait is bounded (~10 s of clock64, as
 * attention_hopper_bwd.cu). The consumers do not trap: a __trap() on their path can make ptxas ignore
 * setmaxnreg.inc (260 bytes of spills in a lab variant of the HS-64 bf16 pass; here a trap in the full[s]
 * wait happens to compile to 0 spills with CUDA 13.0, a property no edit would keep in view), and no consumer may
 * leave early (the .sync.aligned wgmmas need the whole warpgroup). So a wait that runs out GIVES UP
 * (hopper_bwd_common.cuh's mbar_wait_give_up, as attention_hopper_bwd128.cu): it records the barrier in the
 * hang record (when a lab installed one through hopper_lab_hooks.cuh; the first site of the grid wins) and
 * sets the CTA's abort flag, after which every wait of the CTA returns at once; the consumers run to the
 * end and write NaN over their dK and dV rows instead of numbers, so the result is loudly wrong (the
 * trainer's NaN check, every test), never silently. The producer warp traps once its CTA gave up (its own
 * empty[s] wait or a consumer's): the launch ends with a CUDA error and no copy of the abandoned pipeline is
 * left in flight into shared memory the SM hands to the next CTA; ptxas keeps the register split with that
 * trap (-Xptxas -v: 0 spills). setmaxnreg itself cannot be bounded (the split is exact: it never waits on
 * another CTA).
 *
 * fp32 mode's key-major pass (it also computes dQ: three BF16 terms of dS through shared memory and atomics)
 * is attention_hopper_bwd64_fp32.cu.
 * Device code: kernel_keys64.cuh, the HS-64 key-major template of every mode (traits Keys64Mode<MODE>); this
 * file instantiates it for gproj: its pass (hopper_keys_pass<64, ATTN_GPROJ, false>, called by
 * attention_hopper_bwd_dispatch.cu) and the hang-record installer.
 */
#include "attention/cuda/hopper/kernel_keys64.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_keys_pass<64, ATTN_GPROJ>(const HopperBwdCall& c) { keys64_launch<ATTN_GPROJ>(c); }

void attention_hopper_gproj_keys_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
