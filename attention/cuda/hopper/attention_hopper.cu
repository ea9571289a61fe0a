/*
 * attention/cuda/hopper/attention_hopper.cu - the Hopper (sm_90a) causal attention forward of bf16, repair, gproj
 * and fp32 modes: wgmma.mma_async tensor-core GEMMs, TMA tile copies and a producer/consumer
 * (warp-specialised) pipeline. The API and which calls it serves: attention/cuda/hopper/attention_hopper.cuh.
 *
 * Why: the portable kernels (attention/cuda/attention_cuda.cu) are FlashAttention-2 style mma.sync kernels
 * that run on sm_80 and later; on Hopper the way past mma.sync is wgmma (a warpgroup of 4 warps issues
 * one asynchronous 64 x N x 16 MMA reading its operands from shared memory), TMA (one thread moves a
 * whole tile, global -> shared, tracked by an mbarrier) and warp specialisation (a producer warp keeps
 * the copies running while the math warps compute). Its lab is dev/attention_lab/hopper_fwd.cu (layout
 * probe, every mode against the mma.sync forward; measurements in dev/results/attention_hopper_2026-11-29.md);
 * the building blocks are attention/cuda/hopper/hopper_wgmma.cuh.
 *
 * What it computes (docs/attention_numerics.md; attention_cuda.cu's forward is the operation-by-operation
 * spec, so the stats mean exactly what the backward expects):
 *   S = Q K^T in FP32 (wgmma, BF16 operands); running max m per row over key tiles;
 *   bf16:                 x = fma(S, c, -fl(m c)) (__fmaf_rn), stats {m s + ln l, 0}
 *   repair, gproj, fp32:  x = (S - m) c (P_max == 1 exactly), stats {m, l}
 *   e = exp2(x); l = sum of the FP32 e; O = bf( sum bf(e) V / l ) with bf(e) as the register A operand
 *   of the P V wgmma; fp32 mode adds bf(e - bf(e)) V as a second register A operand (e exact to 2^-17).
 * Not here: repair's tile-max-shift arm (its tile is the portable kernel's 64 keys; attention.h).
 * Two things differ from the portable kernel: the order of the FP32 sums (the tensor core's k-loop, the
 * per-lane partial sums of l) and the key tile (128 keys here, 64 there), so a row whose running max
 * changes between keys 64 and 127 rounds bf(e) at another max. O agrees to about one BF16 ulp of its
 * row's scale; m is the same row max (exact, up to the last bits of S), l and the LSE agree to FP32 level.
 *
 * The loop of a consumer warpgroup (FlashAttention-3's intra-warpgroup overlap; the idea read in its
 * hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, no code copied). Run strictly in sequence (S GEMM, wait,
 * softmax, P V GEMM, wait), a warpgroup's own tensor-core work would never overlap its softmax. Instead
 * iteration kt issues S(kt) = Q K(kt)^T and then O += P(kt-1) V(kt-1) (A
 * registers packed in iteration kt-1) as two commit groups, waits for S(kt) only (wgmma_wait<1>: groups
 * retire in order), masks and runs tile kt's softmax (max, exp2, row sums) while the P V GEMM runs, then
 * waits for it, rescales O by alpha(kt) and packs P(kt); tile 0's S runs alone before the loop and the last
 * P V after it. O still sees exactly the sequential order (O *= alpha(kt), then O += P(kt) V(kt), for
 * every kt), and m, l exactly the sequential updates, so O and the stats are bit-identical to the
 * sequential loop in every mode (dev/results/attention_hopper_2026-11-29.md, "Intra-warpgroup overlap").
 * The cost is registers: P(kt-1)'s A operand (32 registers, 64 in fp32 mode) is live during the softmax
 * beside S and O, past the 168 a 288-thread CTA gets. So the producer is a whole warpgroup that gives its
 * registers back (setmaxnreg 24) and the two consumer warpgroups take 240 (FlashAttention-3's split).
 *
 * One kernel, hopper_fwd_kernel<HS, MODE, STAGES, NWG> (kernel_fwd.cuh), for both head sizes. Its unit of
 * work is an item: 64 NWG query rows of one (b, h), with NWG consumer warpgroups of 64 rows each (wgmma
 * needs 4 aligned warps) and a producer warpgroup (one elected lane of its first warp issues the TMA copies;
 * its other warps leave at once). K/V tiles of 128 keys, kFwdStages (2) stages, with SEPARATE K and V
 * barriers: V(kt) is read until P(kt) V(kt) retires in iteration kt + 1, one iteration after K(kt) is done
 * with, so one barrier pair per stage would hold the next K copy back by an iteration. full_k[s] / full_v[s]
 * (TMA bytes landed), empty_k[s] (every consumer thread has S(kt)) and empty_v[s] (P V(kt) retired); the
 * producer issues in the order the consumers need the tiles: the item's Q, K(0), then K(kt), V(kt-1) for
 * kt = 1.., then the last V.
 * Items: ceil(T / (64 NWG)) x B*NH of them in the longest-first order of tile_order.cuh; one CTA per SM
 * (fewer when there are fewer items), whose producer takes each item past its first from a counter once a Q
 * buffer is free for it (hopper_work_queue.cuh) and hands it, decoded, to the consumers beside that buffer;
 * ATTN_FWD_PERSISTENT=0 launches one CTA per item instead. The K/V stages and their phases run on across a
 * CTA's items, and Q has two buffers (q_full / q_empty each), so the producer loads the next item's Q and first
 * K/V tiles while the consumers finish this one's last P V and write O.
 * An item computes the same whichever CTA runs it: the two launches give the same bits.
 * The fused qkv [B, T, 3, NH, HS] is described to TMA as a 4-D tensor {HS, 3*NH, T, B} (encoded per call
 * on the host - it holds the qkv pointer - and passed __grid_constant__), so the strided layout costs
 * nothing and rows past T read as zeros, per batch. Shared tiles use the 128-byte swizzle, which TMA
 * writes and wgmma reads natively: a tile is stored as HS/64 column chunks of [rows][64] BF16 (128 bytes
 * per row); Q comes in boxes of 128 rows (the K/V map's box), a box starting at or past T not loaded.
 * HS 128: NWG = 2 (128 rows; 384 threads start at 168 registers, setmaxnreg gives the producer 24 and the
 * consumers 240), and in every mode but fp32 the two warpgroups take turns to issue each iteration's GEMMs
 * (two named barriers, kernel_fwd.cuh's kTurnBarrier; the order FlashAttention-3's scheduler barriers give its
 * warpgroups, the idea read in its hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, no code copied), so that one's
 * softmax runs while the tensor core works through the other's GEMMs; each warpgroup's own GEMMs keep their
 * order, so O and the stats keep their bits (fp32's forward, more GEMMs per tile, was 1-4% slower with
 * turns). HS 64: NWG = 3, 192 query rows per item (FlashAttention-3's tile height at head dim 64,
 * the idea read in its hopper/tile_size.h, no code copied). At HS 64 a warpgroup's per-tile GEMMs are short
 * (S: 64 x 128 x 64), so two warpgroups leave the tensor core idle during their softmaxes; a third one
 * sharing each K/V tile gives it more work per loaded tile and spreads the producer, barriers and K/V
 * traffic over 1.5x the rows. Same key tile (128), same per-row sequence of operations on O, m and l, so O
 * and the stats are bit-identical to 128 rows per item in every mode, and 1.07-1.13x faster than that at
 * B8 H16 T1024 / B4 H16 T2048 d64 (dev/results/attention_hopper_2026-11-29.md, "192 query rows"). An item's
 * 192 rows span parts of two 128-key diagonal tiles, so each warpgroup runs only the key tiles up to its own
 * last row (its rows lie inside one 128-key tile) and masks only its own last one, and releases the item's
 * tiles past its own (waits for them to land, then arrives), so the empty barriers count every consumer
 * thread once per tile; 512 threads start at 128 registers, setmaxnreg gives the consumers 160 and the
 * producer the 32 they leave (its item decoding spills at 24); 160 holds S, O and P(kt-1) at HS 64 but not
 * fp32 mode's two-term P beside them: fp32 mode runs each tile in sequence there (S, softmax, P V one term
 * at a time; the same k-steps on O in the same order: still bit-identical).
 * Registers (ptxas -v, CUDA 13.0, sm_90a, -O3), all 8 instances (4 modes x 2 head sizes), 0 bytes spill, no
 * C75xx / "wgmma serialized" warning: HS 128 168 at entry, 240 after setmaxnreg.inc; HS 64 128 at entry,
 * 160 after; layout probe (dev/attention_lab/probes/probe_fwd.cu) 154 / 186. Shared memory: 193 KB at HS
 * 128, 129 KB at HS 64 (two Q buffers; 3 K/V stages, measured no faster than 2 with one Q buffer, no longer
 * fit at HS 128).
 * docs/attention_kernels.md, "Hopper forward", has the design notes and the numbers.
 * Bounded waits: every mbarrier wait is on a phase that a finite number of copies/arrivals completes (no
 * data-dependent spin), so a layout bug shows as wrong numbers, not a hang; the lab runs it under timeout.
 * No __trap() on the consumer path: it would make ptxas ignore setmaxnreg.inc (attention_hopper_bwd128.cu).
 */
#include "attention/cuda/hopper/kernel_fwd.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"
#include "attention/cuda/mode_dispatch.cuh"

namespace {

/* ------------------------------------------------------------------------------------------------ */
/* host: tensor map, launch                                                                          */
/* ------------------------------------------------------------------------------------------------ */

/* The fused qkv [B, T, 3, NH, HS] as a 4-D TMA tensor (hopper_wgmma.cuh's encode_head_map): boxes of
   {64 columns, 1 head, kBlockK tokens, 1 batch}. */
CUtensorMap make_qkv_map(const bf16* qkv, AttnShape s) {
    return encode_head_map(qkv, s, 3 * s.NH, kBlockK, "attention (Hopper)", "qkv");
}

/* The forward at head size HS (kFwdWarpgroups<HS> consumer warpgroups): one CTA per SM taking its items from the
   queue, or with ATTN_FWD_PERSISTENT=0 one CTA per work item (the A/B switch of the two schedules). */
template <int HS, int MODE, int STAGES>
void hopper_fwd_launch(const CUtensorMap& map, AttnShape s, bf16* out, float* stats, cudaStream_t stream) {
    constexpr int kNwg = kFwdWarpgroups<HS>;
    using Cta = CtaShape<kNwg>;
    constexpr int smem = SmemPlan<HS, STAGES, kNwg, kQBuffers>::kAlloc;
    auto kernel = hopper_fwd_kernel<HS, MODE, STAGES, kNwg>;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const unsigned grid = hopper_item_grid((long long)ceil_div(s.T, Cta::kRows) * s.B * s.NH,
                                           hopper_env_switch("ATTN_FWD_PERSISTENT", 1),
                                           "attention (Hopper forward)");
    /* HS 128 takes its own sections (tile_order.cuh) */
    const int section = HS == 128 ? attn_tile_section_fwd_hs128(s) : attn_tile_section(s, kTileSectionKV);
    kernel<<<grid, Cta::kThreads, smem, stream>>>(map, out, stats, s.NH, s.T, attn_softmax_scale(HS),
                                                  attn_exp2_scale(HS), section, s.B * s.NH);
    cudaCheckLastError();
}

}  // namespace

int attention_hopper_fwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv) {
    if (!attn_mode_is_emulated(mode)) return 0; /* cudnn mode is cuDNN's kernel (attention/cudnn/) */
    if (mode == ATTN_REPAIR && opt.tile_max_shift) return 0; /* the shift arm's tile is the portable kernel's */
    return hopper_call_fits(s, qkv, nullptr);
}

void attention_forward_hopper(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                              cudaStream_t stream) {
    const AttnOptions no_options = {};
    if (!attention_hopper_fwd_supports(mode, no_options, s, qkv))
        die_unsupported("attention_forward_hopper", mode, s, qkv, nullptr, "any mode but repair's shift arm",
                        "attention_forward_cuda");
    const CUtensorMap map = make_qkv_map(qkv, s);
    with_mode_hs("attention_forward_hopper", mode, s.HS, [&](auto mode_c, auto hs_c) {
        hopper_fwd_launch<decltype(hs_c)::value, decltype(mode_c)::value, kFwdStages>(map, s, out, stats, stream);
    });
}


