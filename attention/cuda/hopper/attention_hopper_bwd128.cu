/*
 * attention/cuda/hopper/attention_hopper_bwd128.cu - the Hopper (sm_90a) key-major causal attention backward of bf16 and
 * repair modes at head size 128 (dK, dV and the dQ reduce-adds) on wgmma + TMA, with setmaxnreg. The API and
 * which calls it serves: attention/cuda/hopper/attention_hopper_bwd.cuh (the chain of bf16
 * and repair at HS 128; the HS-64 kernel is attention_hopper_bwd.cu).
 *
 * Why: at HS 128 the portable mma.sync key-major kernel (attention/cuda/attention_cuda.cu: attn_bwd_kernel) takes
 * most of the attention time on the H200 (at B2 H16 T4096 d128 the bulk of the portable fwd+bwd), and HS 64's
 * kernel does not stretch (one warpgroup's dK, dV
 * accumulators alone would be 128 registers next to S^T, dP^T and the dQ partial). With this kernel the whole
 * backward (prep + this kernel + dQ post-pass) is 1.40x faster than mma.sync at B8 H8 T1024 d128 and 1.69x at
 * B2 H16 T4096 d128 (dev/results/attention_hopper_2026-11-29.md; within 4 BF16 ulps of the portable
 * backward). The dQ partials go out by TMA reduce-add (1.10-1.12x faster than red.global atomics at HS 64),
 * and the CTAs take their key tiles longest first over all heads (attention/cuda/tile_order.cuh).
 * dev/attention_lab/hopper_bwd128.cu is the harness that checks and times it.
 *
 * What it computes (docs/attention_numerics.md; attn_bwd_kernel's rounding points, operation for operation,
 * as attention_hopper_bwd.cu): P = exp2(fma(S, c, -fl(LSE log2 e))) (bf16) or exp2((S - m) c) * fl(1/l)
 * (repair), dS = P (dP - D) (masked entries exactly 0), dV += bf(P)^T dO, dK += bf(dS)^T Q, dQ_acc += bf(dS) K
 * in FP32; dK = bf(s acc), dV = bf(acc) into dqkv. The workspace contract is production's: the portable prep
 * kernel (attn_bwd_prep_kernel) wrote D and zeroed dq_acc [B*NH*T][128]; this kernel adds s-less dQ partials
 * (one per 128 keys, as the portable kernel's); the portable post-pass (attn_bwd_dq_kernel) writes
 * dQ = bf(s acc). Only the FP32 summation order differs from the portable kernel. DQ_SLICES (the deterministic
 * backward, docs/determinism.md): the partials go to the key block's own zeroed slice, one add per element
 * (warpgroup w owns dQ columns 64w..64w+63), and the sliced post-pass sums the slices in key-block order.
 *
 * Layout (FlashAttention-3's for d128 on sm_90, read in Dao-AILab/flash-attention hopper/; no code copied):
 * one CTA = 128 keys of one (b, h), 384 threads: two consumer warpgroups of 64 keys each and a producer
 * warpgroup (one warp issues TMA and writes the row state {row_a, row_b, D}; setmaxnreg 24 there, 240 in the
 * consumers: 128 * 24 + 256 * 240 = 384 * 168). Q/dO tiles of 64 queries in a 2-stage pipeline (full: 32
 * producer lanes + TMA bytes; empty: the 256 consumer threads). Per step and consumer warpgroup:
 *   S^T = K_w Q^T, dP^T = V_w dO^T       m64n64k16 SS, 8 k-steps over two 64-column chunks
 *   P, dS in registers, packed to BF16 A operands; bf(dS) also to a shared [query][128 + 8] tile
 *   dV += bf(P)^T dO, dK += bf(dS)^T Q    m64n128k16 RS, dO/Q N-major (LBO = one 8 KB chunk)
 *   (256-thread named barrier: both warpgroups' halves of the dS tile written)
 *   dQ_half = bf(dS) K[:, 64w..64w+63]    m64n64k16 RS over the CTA's 128 keys, A loaded from the tile
 *   the dQ half into the warpgroup's FP32 shared tile (128B swizzle), added to dq_acc by two TMA reduce-adds
 *   from one thread (warpgroup w owns dQ columns 64w..64w+63)
 * Shared memory 197 KiB: K, V 32 KB each; Q, dO 2 stages x 16 KB each; the dS tile double-buffered by step
 * parity (34 KB); row state [2][64] float4; one 16 KB dQ tile per warpgroup (single-buffered: a second pair
 * would pass 227 KB; the previous step's reduce-adds have the whole score phase to finish reading it). qkv and dout are hopper_wgmma.cuh's 4-D TMA tensors
 * {HS, heads, T, B} in 64-column boxes of 64 tokens (128-byte swizzle, zero fill past T).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3; `make hopper_bwd128-regs` prints them): kernel 168 at entry
 * (240 after setmaxnreg.inc), no C75xx warning; bf16 0 B spill, repair 8 B (with red.global in place of the
 * TMA dQ flush: 0); layout probe 254, 0 spill.
 *
 * Hangs: every mbarrier wait is bounded (~2 s of clock64; a legitimate wait is microseconds). It does NOT
 * trap: a __trap() anywhere on the consumer path makes ptxas ignore setmaxnreg.inc (the consumers are then
 * compiled for 168 registers: spills and serialised wgmmas; docs/attention_kernels.md, "Hangs"), and a
 * trap on the producer path alone would end the kernel, not name the consumers' rows. A
 * wait that gives up records the barrier in the host-mapped AttnHopperHang record (when
 * a lab installed one through hopper_lab_hooks.cuh; first give-up wins), sets the CTA's abort flag (every later
 * wait of the CTA returns at once) and runs on; at the end the consumers, after a barrier that makes every
 * give-up of the CTA visible, write NaN to all their dK and dV rows instead of values. So a hang ends within
 * seconds as NaN gradients (the tests' finiteness checks and the trainer's NaN check fail loudly), never as a
 * stuck job or silently wrong numbers. Named barriers, wgmma waits and setmaxnreg cannot be bounded (their
 * counts are uniform by construction).
 *
 * Not done: a separate warp issuing the dQ reduce-adds (FA3's); overlapping the dQ
 * GEMM with dV/dK or the next step's scores; 3 stages; a persistent schedule; fp32/gproj modes (their own
 * key-major passes: attention_hopper_bwd128_fp32.cu, attention_hopper_bwd128_gproj.cu); repair's tile-max-shift arm (portable end to end, as at HS 64).
 */
/* the kernel template (kernel_keys128.cuh), instantiated here for bf16 and repair */
#include "attention/cuda/hopper/kernel_keys128.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

template <> void hopper_keys_pass<128, ATTN_BF16>(const HopperBwdCall& c) { keys128_launch<ATTN_BF16>(c); }
template <> void hopper_keys_pass<128, ATTN_REPAIR>(const HopperBwdCall& c) { keys128_launch<ATTN_REPAIR>(c); }

void attention_hopper_bwd128_watch_hangs(AttnHopperHang* record) { install_hang_record(g_hang_record, record); }
