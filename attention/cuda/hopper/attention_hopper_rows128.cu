/*
 * attention/cuda/hopper/attention_hopper_rows128.cu - the Hopper (sm_90a) query-major row pass of the backward at head size
 * 128 for gproj (lambda and all of dQ) and fp32 (D = sum_j P_ij dP_ij), on wgmma + TMA, a producer warpgroup and
 * setmaxnreg. The API and which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (the chains of
 * gproj and fp32 at HS 128; the HS-64 kernel is attention_hopper_rows.cu).
 *
 * Why: the portable row pass at HS 128 (the mma.sync attn_bwd_rows_kernel<128, MODE>, attention/cuda/attention_cuda.cu)
 * is what keeps gproj (and fp32) at HS 128 far from bf16, and HS 64's kernel does not stretch (its DSK and PK
 * accumulators alone would be 128 registers per thread). Its lab, dev/attention_lab/hopper_rows128.cu, checks the
 * layout (all four products) and the pass against the portable production backward: D, lambda and dQ BIT-EQUAL on
 * every row and element checked (10 shapes per mode, T 1..1000, sharp and offset-key cases). The pass alone is
 * 1.5-1.8x (gproj) and 1.8-2.3x (fp32) faster than the portable one at B8 H8 T1024 / B2 H16 T4096 d128
 * (dev/results/attention_hopper_2026-11-29.md). Beyond the lab's kernel, production adds the hang handling below.
 *
 * What it computes (docs/attention_numerics.md; attn_bwd_rows_kernel operation for operation, only the FP32 sums
 * inside the tensor core may differ in order), per query row i over its visible keys j <= i:
 *   S = Q K^T, dP = dO V^T (FP32, wgmma SS, both K-major, 8 k-steps over the two 64-column chunks of HS);
 *   P_ij = exp2((S_ij - m_i) c) * fl(1 / l_i) from the forward's stats {m, l};
 *   gproj: dS = P (dP - D) (D_i = dO_i . O_i, formed here in the prep kernel's order), r_i = sum_j bf(dS_ij),
 *          p_i = sum_j bf(P_ij) (per lane in key order, then the quad: the portable order),
 *          lambda_i = r_i / p_i (0 if p_i = 0); DSK_i = sum_j bf(dS_ij) K_j, PK_i = sum_j bf(P_ij) K_j (wgmma RS
 *          m64n128k16, K read N-major); dQ_i = bf(s * fma(-lambda_i, PK_i, DSK_i)) into the q slot of dqkv;
 *   fp32:  D_i = sum_j P_ij dP_ij (per lane in key order, then the quad).
 * The workspace contract is production's (carve_workspace: dq_acc [rows HS], D [rows], lambda [rows]): gproj writes
 * D and lambda, fp32 writes D; the key-major pass then runs on them unchanged.
 *
 * Layout (HS 64's kernel stretched; FlashAttention-3's register split for two math warpgroups, read in
 * Dao-AILab/flash-attention hopper/, no code copied): one CTA = 128 query rows of one (b, h), longest rows first
 * (attn_tile_longest_first); warpgroups 0 and 1 consume 64 rows each, warpgroup 2 is the producer (one lane issues
 * TMA; setmaxnreg 24 there, 240 in the consumers: 128 * 24 + 256 * 240 = 64512 <= 384 * 168, as
 * attention_hopper_bwd128.cu). Q and dO (128 rows x 2 chunks, 32 KB each) are loaded once; K and V tiles of 128
 * keys x 2 chunks (32 KB each), two stages, full/empty mbarriers (192 KB + barriers). qkv and dout are
 * hopper_wgmma.cuh's 4-D TMA tensors {HS, heads, T, B} in 64-column boxes of 128 tokens (128-byte swizzle, zero
 * fill past T). Each 128-key tile is worked in two 64-key halves:
 *   S, dP of the half (m64n64k16 SS, 32 + 32 regs) -> P, dS in place -> packed BF16 A operands (16 + 16)
 *   -> DSK += bf(dS) K_half, PK += bf(P) K_half (m64n128k16 RS, LBO = one 16 KB chunk; 64 + 64 regs).
 * The layouts no other kernel uses, checked exact by the layout probe (dev/attention_lab/probes/probe_rows128.cu,
 * the lab's first section): (a) m64n64k16 SS over 8 k-steps with the chunk jump, both operands 64-row slices (8 KB
 * into 16 KB chunks) of 128-row tiles; (b) m64n128k16 RS with K N-major from row 0 and row 64 of a 128-row tile,
 * LBO 16 KB; (c) the K/V tiles of stage 1 (32 KB offsets).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3; `make hopper_rows128-regs` prints them): kernel 168 at entry (240
 * after setmaxnreg.inc), 0 B spill, no C75xx warning, gproj and fp32; layout probe (256 threads, no setmaxnreg)
 * 255, 0 spill.
 *
 * Hangs (as attention_hopper_bwd128.cu, through attention/cuda/hopper/hopper_bwd_common.cuh): every mbarrier wait is bounded
 * (~2 s of clock64; a legitimate wait is microseconds) and does NOT trap (a __trap() on the consumer path makes
 * ptxas ignore setmaxnreg.inc). A wait that gives up records the barrier in the host-mapped AttnHopperHang record
 * (when a lab installed one through hopper_lab_hooks.cuh; first give-up wins; this pass's sites: ATTN_HANG_KV_FULL =
 * q_full, the Q/dO tiles loaded once; ATTN_HANG_FULL = full[s], the K/V tiles of stage s; ATTN_HANG_EMPTY = empty[s];
 * ATTN_HANG_PROBE = the probe's tiles), sets the CTA's abort flag (every later wait of the CTA returns at once) and
 * runs on; at the end the consumers, after a barrier that makes every give-up of the CTA visible (the producer's
 * give-up precedes its arrival on a full barrier that every consumer waited for), write NaN over all their outputs
 * (gproj: lambda and the dQ rows; fp32: D) instead of values. So a hang ends within seconds as NaN gradients (the
 * tests' finiteness checks and the trainer's NaN check fail loudly), never as a stuck job or silently wrong numbers.
 *
 * After it the key-major pass reads the D and lambda slots: on sm_90 gproj's (attention_hopper_bwd128_gproj.cu)
 * or fp32's (attention_hopper_bwd128_fp32.cu), elsewhere the portable attn_bwd_kernel<128, MODE>.
 * Not done: overlap of one half's DSK/PK GEMMs with the next half's S/dP; 3 stages; D fused in.
 * Device code: kernel_rows.cuh, the row pass's template over head-size traits (RowsShape<HS>); this file
 * instantiates it at HS 128: the passes of gproj and fp32 (hopper_rows_pass<128, MODE>, called by
 * attention_hopper_bwd_dispatch.cu) and the hang-record installer.
 */
#include "attention/cuda/hopper/kernel_rows.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_rows_pass<128, ATTN_GPROJ>(const HopperBwdCall& c) { rows_launch<128, ATTN_GPROJ>(c); }
template <> void hopper_rows_pass<128, ATTN_FP32>(const HopperBwdCall& c) { rows_launch<128, ATTN_FP32>(c); }

void attention_hopper_rows128_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
