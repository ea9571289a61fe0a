/*
 * attention/cuda/hopper/attention_hopper_bwd.cu - the Hopper (sm_90a) key-major causal attention backward of bf16 and
 * repair modes at head size 64 (dK, dV and the dQ reduce-adds) on wgmma + TMA, with 128-query steps and
 * setmaxnreg. The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh.
 *
 * Why: the portable backward (attention/cuda/attention_cuda.cu: prep, attn_bwd_kernel, dQ post-pass) is mma.sync
 * based; this kernel takes attn_bwd_kernel's place on sm_90 for bf16 and repair at HS 64. It steps through
 * 128 queries at a time (FA3's hdim-64 backward works on 128 x 128 blocks too; read in Dao-AILab/flash-attention
 * hopper/, no code copied): 64-query steps with one producer warp (the layout fp32's HS-64 pass keeps,
 * attention_hopper_bwd64_fp32.cu) make each consumer warpgroup wait on two barriers, fence, stage a 64 x 64 dS
 * tile and send a 16 KB dQ partial around small m64n64 GEMMs per step, and measure slower (the whole bf16
 * backward is 1.06x / 1.18x faster with 128-query steps at B8 H16 T1024 / B4 H16 T2048 d64, within 4 BF16 ulps:
 * dev/results/attention_hopper_2026-11-29.md). dev/attention_lab/hopper_bwd64_wide.cu is the harness that checks
 * and times this kernel.
 *
 * What it computes (docs/attention_numerics.md; attn_bwd_kernel's rounding points, operation for operation):
 *   per key tile, for each 128-query step from the diagonal on:
 *     S^T = K Q^T, dP^T = V dO^T           (FP32 accumulators, wgmma SS, M = 64 keys per warpgroup)
 *     P = exp2(fma(S, c, -fl(LSE log2 e)))  (bf16: __fmaf_rn)  or  exp2((S - m) c) * fl(1/l)  (repair)
 *     dS = P (dP - D)                       (FP32, masked entries exactly 0)
 *     dV += bf(P)^T dO,  dK += bf(dS)^T Q   (wgmma RS: the accumulator repacked as the A operand)
 *     dQ_acc += bf(dS) K                    (wgmma RS, A = bf(dS) staged through shared memory), the
 *                                           64 x 64 FP32 partial of each warpgroup's query rows over the
 *                                           item's 128 keys added to the workspace by TMA reduce-add
 *   dK = bf(s dK_acc), dV = bf(dV_acc) into dqkv; dQ = bf(s dQ_acc) is the caller's post-pass.
 * Only the order of the FP32 sums differs from attn_bwd_kernel (tensor-core k-loops of 128 queries; dQ
 * partials per 128 keys in both), so dQ/dK/dV agree within a few BF16 ulps of the row scale.
 * DQ_SLICES (the deterministic backward, docs/determinism.md): the same kernel adds its partials into its key
 * block's own zeroed slice of the accumulator; each row of a slice gets one add, onto zero, so the slice's bits
 * do not depend on the order of the CTAs' adds.
 *
 * Work items: 128 keys of one (b, h) each, ceil(T / 128) x B*NH of them, longest key tiles first within
 * L2-sized sections of heads (tile_order.cuh). By default one CTA per SM runs items until none is left: its
 * first from its position, then each next one from a counter (hopper_bwd_common.cuh's g_keymajor_queue) as soon
 * as its producer has issued the last stage of the previous one; ATTN_BWD_PERSISTENT=0 launches one CTA per
 * item instead (the same code, which then ends after its first item). An item computes the same whichever CTA
 * runs it, so the two launches give the same bits. The producer writes each item, decoded, to a shared slot
 * before the kv_full arrival that its K/V load completes (an item of no steps with a plain arrival ends the
 * consumers' loop); the Q/dO stages and their phases run on over a CTA's items, so the producer fills the next
 * item's first two stages while the consumers finish this one, and loads its K and V once the consumers
 * released the previous item's (kv_empty: the 256 consumer threads, after the item's last dQ GEMM).
 * dev/attention_lab/protocol_model.py plays this protocol (no deadlock, no tile or slot overwritten while read).
 * Layout of a CTA, 384 threads: consumer warpgroups 0 and 1 (64 keys each) and a producer warpgroup (warp 8
 * works: lane 0 issues TMA, every lane writes the row state {a, b, D} of 4 queries; warps 9-11 leave at once);
 * setmaxnreg 40 / 232
 * (128 * 40 + 256 * 232 = 384 * 168). K and V of an item are loaded once (two 64-row TMA boxes each); Q and dO
 * tiles of 128 queries (two 64-row boxes each; a box that starts at or past T loads the first box's rows again:
 * finite data under masked, zero-weight entries) in 2 stages (full: 32 producer lanes + the TMA bytes; empty:
 * the 256 consumer threads, released right after the dV/dK batch). Per step and consumer warpgroup:
 *   S^T, dP^T [64 keys x 128 queries]   m64n128k16 SS, 4 k-steps each, one commit group     64 + 64 regs
 *   P, dS in place, packed to BF16 A words (8 k-steps)                                       32 + 32 regs
 *   bf(dS) from the words to the step's staging tile [128 queries][128 + 8 keys], the warpgroup's 64 key columns
 *   dV += bf(P)^T dO, dK += bf(dS)^T Q  m64n64k16 RS, 8 k-steps each over the 128-row N-major tiles
 *   (consumer barrier, both warpgroups: the tile holds all 128 keys' bf(dS); thread 0 of each first waited until
 *    its previous reduce-adds read its dQ tile)
 *   dQ rows 64 wg .. 64 wg + 63 = bf(dS) K  m64n64k16 RS over the item's 128 keys, A loaded from the tile
 *   the 64 x 64 FP32 partial into the warpgroup's 16 KB dQ tile (two 128B-swizzled boxes of 32 columns x 64
 *   rows), fence.proxy.async, warpgroup barrier, two TMA reduce-adds by thread 0 (rows past T: outside the map)
 * So each query row of a step gets one partial per CTA, summed over 128 keys in the tensor core
 * (FlashAttention-3's dQ layout): half the reduce-adds of a partial per warpgroup over its own 64 keys, which
 * kept L2 74% busy against cuDNN's 55% at d12's shape and ran the backward 9-14% slower
 * (dev/results/keymajor_dq_all_keys_2026-12-05.md). The staging tiles alternate by step: a warpgroup restages
 * a tile only after the next step's consumer barrier, which the other warpgroup reaches after its A loads of it.
 * qkv [B, T, 3, NH, 64] and dout [B, T, NH, 64] are 4-D TMA tensors {HS, heads, T, B} (hopper_wgmma.cuh's
 * encode_head_map): rows past T read as zeros, per batch; shared tiles use the 128-byte swizzle (one 128-byte
 * row = 64 BF16). Launched with programmatic dependent launch (launch_overlap.cuh): after the barrier init
 * every thread waits for the prep kernel's grid (D, the zeroed accumulator) and lets the dQ post-pass launch.
 * Shared memory (Keys64WidePlan): K, V 16 KB each; Q, dO 2 x 16 KB each; two 16 KB dQ tiles (one per warpgroup,
 * single-buffered: the score phase separates a send from the next rewrite); two dS staging tiles of 34 KB (by
 * step parity); row state 2 x 128 float4; barriers: 205872 bytes with the alignment slack (one CTA per SM).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3 --use_fast_math; `make hopper_bwd64_wide-regs` prints them): both
 * kernel instantiations 168 at entry (232 after setmaxnreg.inc), 0 bytes spill, no C75xx (the producer keeps
 * the item it fills stages for in shared memory: with its 7 fields in registers it spilled 88-140 bytes at 40);
 * the probe's two
 * kernels 154 / 154, 0 spill. What ptxas forced (in the lab): 24 / 240 (HS 128's split) spilled 32 B
 * in repair (the producer's fl(1/l) row state), 56 / 224 28 B, hence 40 / 232; the probe writing S^T / dP^T in
 * the same kernel as the dV/dK GEMMs serialised its wgmmas (C7512), hence a launch of its own.
 *
 * Hangs: every mbarrier wait is bounded (~2 s of clock64; a legitimate wait is microseconds) and GIVES UP
 * instead of trapping (a __trap() on the consumer path makes ptxas ignore setmaxnreg.inc; docs/attention_kernels.md,
 * "Hangs"): hopper_bwd_common.cuh's mbar_wait_give_up records the barrier in the
 * host-mapped record a lab installed (hopper_lab_hooks.cuh; first give-up wins) and sets the CTA's
 * abort flag (every later wait of the CTA returns at once); its consumers, after a barrier that gives all of
 * them the same answer, write NaN over the item's dK and dV rows and take no more items, and its producer
 * issues no more copies and writes NaN over the items it took (the one in the slot, the one it was filling)
 * and over every item left in the queue, so no item keeps a stale gradient. So a protocol
 * bug ends within seconds as NaN gradients and a named barrier (as HS 128), never a stuck job. Named barriers,
 * wgmma waits and setmaxnreg cannot be bounded (their counts are uniform by construction).
 * HS 128 is attention_hopper_bwd128.cu (its own layout: 64-query steps, dQ split by head-dimension halves);
 * attention_hopper_bwd_dispatch.cu picks the head size.
 * Not done: dS staged K-major swizzled with dQ as SS wgmmas in the dV/dK batch (measured with the earlier
 * per-warpgroup dQ: the same speed within noise; docs/attention_kernels.md's design table); S^T and dP^T as two
 * commit groups with P computed under dP^T's GEMM (measured: +-0.6%, no gain); overlap of the dQ GEMM with the
 * next step's scores; K/V double-buffered across items (a second 32 KB pair passes 227 KB); fp32 and gproj modes
 * (their own key-major passes: attention_hopper_bwd64_fp32.cu, attention_hopper_bwd_gproj.cu).
 * Device code: kernel_keys64.cuh, the HS-64 key-major template of every mode (traits Keys64Mode<MODE>); this
 * file instantiates it for bf16 and repair: their passes (hopper_keys_pass<64, MODE, DQ_SLICES>, called by the
 * dispatch, attention_hopper_bwd_dispatch.cu) and the hang-record installer.
 */
#include "attention/cuda/hopper/kernel_keys64.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_keys_pass<64, ATTN_BF16>(const HopperBwdCall& c) { keys64_launch<ATTN_BF16>(c); }
template <> void hopper_keys_pass<64, ATTN_REPAIR>(const HopperBwdCall& c) { keys64_launch<ATTN_REPAIR>(c); }

void attention_hopper_bwd_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
