/*
 * attention/cuda/hopper/attention_hopper_rows.cu - the Hopper (sm_90a) query-major row pass of the backward for gproj
 * (lambda and all of dQ) and fp32 (D = sum_j P_ij dP_ij) at head size 64, on wgmma + TMA + a producer warpgroup.
 * The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh.
 *
 * Why: gproj's and fp32's extra cost over bf16 is mostly the portable row pass attn_bwd_rows_kernel
 * (attention/cuda/attention_cuda.cu, mma.sync). That pass has the forward's shape (query rows as M), which the
 * Hopper forward runs on wgmma; this kernel (its lab: dev/attention_lab/hopper_rows.cu, layout probe and
 * the pass against the production backward; dev/results/attention_hopper_2026-11-29.md) takes
 * attn_bwd_rows_kernel's place on sm_90. It writes the same workspace slots (D for fp32, lambda for gproj,
 * carve_workspace's layout) and gproj's dQ into the q slot of dqkv, so the key-major pass after it (Hopper
 * or the portable attn_bwd_kernel) reads them unchanged.
 *
 * What it computes, per query row i over its visible keys j <= i (docs/attention_numerics.md; the portable
 * row pass operation for operation, except the order of the FP32 sums inside the tensor core):
 *   S = Q K^T, dP = dO V^T (FP32, wgmma from shared memory, both K-major);
 *   P_ij = exp2((S_ij - m_i) c) * fl(1 / l_i) from the forward's stats {m, l};
 *   gproj: dS = P (dP - D) in FP32 (D_i = dO_i . O_i, formed here in the prep kernel's sum order);
 *          r_i = sum_j bf(dS_ij), p_i = sum_j bf(P_ij) (FP32, per lane in key order, then the quad: the
 *          portable order), lambda_i = r_i / p_i (0 if p_i = 0);
 *          DSK_i = sum_j bf(dS_ij) K_j, PK_i = sum_j bf(P_ij) K_j (wgmma RS, K read N-major);
 *          dQ_i = bf(s * fma(-lambda_i, PK_i, DSK_i)) into the q slot of dqkv, lambda_i into the workspace.
 *   fp32:  D_i = sum_j P_ij dP_ij in FP32 into the workspace's D slot (fp32's dQ is key-major).
 *
 * Work items: 128 query rows of one (b, h) each, longest rows first within sections of heads (tile_order.cuh). One
 * CTA per SM runs items until none is left: its first from its position, then each next one from a counter
 * (g_rows_queue, hopper_work_queue.cuh) once one of its two Q/dO buffers is free; ATTN_BWD_PERSISTENT=0 launches
 * one CTA per item (the same code; the two launches give the same bits). For each item the producer writes the
 * item, decoded, beside its buffer (item_of[b], item_full[b]: the consumers load the row state while Q and dO
 * land), then Q and dO (q_full[b]; released by every consumer thread after the item's outputs, q_empty[b]) and the
 * item's K/V tiles into stages that run on over the CTA's items, so the next item's Q, dO and first K/V tiles load
 * under this item's last tiles and its outputs; an item of no key tiles ends the consumers' loop
 * (dev/attention_lab/protocol_model.py plays this protocol). Warpgroups 0 and 1 are two consumers of 64 rows,
 * warpgroup 2 the producer (one lane issues TMA; setmaxnreg 32 there, 232 in the consumers: at 24 the producer's
 * loop spilled 12 bytes). Q (qkv as a 4-D map {HS, 3 NH, T, B}) and dO ({HS, NH, T, B}) are loaded once per item; K
 * and V tiles of 128 keys, two stages, full/empty mbarriers. Each 128-key tile is worked in two 64-key halves (S
 * and dP of a half, P and dS in registers, then DSK and PK of that half): with whole tiles the four accumulators
 * spill. gproj issues half h's DSK/PK GEMMs and half h + 1's S/dP GEMMs as one commit group and waits once per half
 * (3.5% on gproj's backward, dev/results/gproj_row_pass_pipelined_2026-12-04.md); with them live together the
 * consumers need about 190 registers, more than the 168 of a CTA with a producer warp (288 threads), hence the
 * producer warpgroup. Rows and keys past T are zero-filled by TMA and masked. Every mbarrier wait is bounded and
 * gives up (a trap under setmaxnreg would make ptxas ignore setmaxnreg.inc): the consumers then write NaN over
 * their item's outputs and take no more items, and the producer, which sees the give-up at its next wait (its last
 * one waits for its last item's release), traps, so that no item the CTA took keeps its old outputs: the launch
 * ends with an error. 0 bytes of spill (CUDA 13.0), no wgmma serialisation warning. Shared memory: 129 KB (two Q/dO
 * buffers of 32 KB, two K/V stages of 32 KB).
 * HS 128 is attention_hopper_rows128.cu (the same CTA; DSK and PK alone are 128 floats per thread there, so
 * it does not pipeline); attention_hopper_bwd_dispatch.cu picks the head size.
 * Not done: 3 K/V stages, D fused into the pass, the zeroing of S and dP replaced by the first wgmma's scale-d.
 * Device code: kernel_rows.cuh, the row pass's template over head-size traits (RowsShape<HS>); this file
 * instantiates it at HS 64: the passes of gproj and fp32 (hopper_rows_pass<64, MODE>, called by
 * attention_hopper_bwd_dispatch.cu).
 */
#include "attention/cuda/hopper/kernel_rows.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_rows_pass<64, ATTN_GPROJ>(const HopperBwdCall& c) { rows_launch<64, ATTN_GPROJ>(c); }
template <> void hopper_rows_pass<64, ATTN_FP32>(const HopperBwdCall& c) { rows_launch<64, ATTN_FP32>(c); }

void attention_hopper_rows_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
