/*
 * attention/cuda/hopper/attention_hopper_bwd_dispatch.cu - the Hopper (sm_90a) backward's dispatch: the table of
 * the passes each (mode, head size) runs (HopperBwdChain), the support check and the entry point of
 * attention_hopper_bwd.cuh, the lab's pass-by-pass entry (hopper_lab_hooks.cuh), and with_chain, the one place
 * where a call's run-time mode and head size become template arguments.
 *
 * Why: the kernels are template families (kernel_keys64.cuh, kernel_keys128.cuh, kernel_rows.cuh) instantiated
 * per (head size, mode) in the attention_hopper_*.cu files, each of which defines the passes
 * (hopper_rows_pass, hopper_keys_pass; hopper_host.cuh) of its kernels and nothing else. What runs for a call,
 * and whether the call can run here at all, is decided here once: attention_cuda.cu asks the check once per
 * call and hands the whole chain to the entry point, with the mode still a run-time value. A new mode adds its
 * row to the table, its case to with_chain and its passes to the instantiation files (docs/attention_kernels.md,
 * "Which files a mode touches"). Host code only: no kernel is instantiated here.
 */
#include <type_traits>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

namespace {

/* The chain of (head size, mode): the passes it runs between attention_cuda.cu's prep kernel and its dQ
   post-pass (attention_hopper_bwd.cuh says what each reads and writes). The same at both head sizes:
     bf16, repair  the key-major pass (dK, dV; dQ partials into dq_acc)
     fp32          the row pass (D = sum P dP), then fp32's key-major pass (dK, dV; dQ partials into dq_acc)
     gproj         the row pass (lambda, all of dQ), then gproj's key-major pass (dK, dV)
   kRowPass: the row pass runs first. kKeysSendDq: the key-major pass adds dQ partials into dq_acc, so it has a
   dq_slices form (DQ_SLICES = true). Modes without a row are those with_chain leaves out (cudnn). */
template <int HS, int MODE>
struct HopperBwdChain;
template <int HS>
struct HopperBwdChain<HS, ATTN_BF16> {
    static constexpr bool kRowPass = false, kKeysSendDq = true;
};
template <int HS>
struct HopperBwdChain<HS, ATTN_REPAIR> {
    static constexpr bool kRowPass = false, kKeysSendDq = true;
};
template <int HS>
struct HopperBwdChain<HS, ATTN_FP32> {
    static constexpr bool kRowPass = true, kKeysSendDq = true;
};
template <int HS>
struct HopperBwdChain<HS, ATTN_GPROJ> {
    static constexpr bool kRowPass = true, kKeysSendDq = false;
};

/* The one run-time -> template step of the Hopper backward: f(hs, mode) with std::integral_constant<int, HS> and
   <int, MODE> for a (head size, mode) that has a chain (head size 64 or 128; bf16, repair, fp32, gproj), and 1;
   0 without calling f for any other pair. */
template <typename F>
int with_chain(AttnMode mode, int HS, F&& f) {
    auto modes = [&](auto hs) {
        switch (mode) {
            case ATTN_BF16: f(hs, std::integral_constant<int, ATTN_BF16>{}); return 1;
            case ATTN_REPAIR: f(hs, std::integral_constant<int, ATTN_REPAIR>{}); return 1;
            case ATTN_FP32: f(hs, std::integral_constant<int, ATTN_FP32>{}); return 1;
            case ATTN_GPROJ: f(hs, std::integral_constant<int, ATTN_GPROJ>{}); return 1;
            default: return 0; /* cudnn: cuDNN's own kernels (attention/cudnn/), no chain of ours */
        }
    };
    if (HS == kHopperHeadSizes[0]) return modes(std::integral_constant<int, kHopperHeadSizes[0]>{});
    if (HS == kHopperHeadSizes[1]) return modes(std::integral_constant<int, kHopperHeadSizes[1]>{});
    return 0;
}

/* The passes of the chain of (mode, HS) (attention_hopper_bwd.cuh's bits), 0 where there is none. */
int chain_passes(AttnMode mode, int HS) {
    int passes = 0;
    with_chain(mode, HS, [&](auto hs, auto mode_c) {
        using Chain = HopperBwdChain<decltype(hs)::value, decltype(mode_c)::value>;
        passes = ATTN_HOPPER_KEY_PASS | (Chain::kRowPass ? ATTN_HOPPER_ROW_PASS : 0);
    });
    return passes;
}

constexpr int kWholeChain = -1; /* run_chain's `passes`: every pass of the call's chain */

/* The passes of `passes` (kWholeChain: all) of the call's chain, in its order; `entry` names the caller in a
   refusal. */
void run_chain(const char* entry, int passes, AttnMode mode, AttnOptions opt, const HopperBwdCall& c,
               int dq_slices) {
    const int chain = attention_hopper_bwd_supports(mode, opt, c.s, c.qkv, c.dout);
    if (!chain)
        die_unsupported(entry, mode, c.s, c.qkv, c.dout,
                        "mode bf16, repair (not its tile-max-shift arm), fp32 or gproj", "attention_backward_cuda");
    if (passes == kWholeChain) passes = chain;
    if (passes == 0 || (passes & ~chain) != 0)
        die("%s: passes %d are not a part of mode %s's Hopper chain at HS %d (its passes: %d)\n"
            "  hint: pass ATTN_HOPPER_ROW_PASS (%d) only to the chains of fp32 and gproj, ATTN_HOPPER_KEY_PASS (%d) "
            "to every chain",
            entry, passes, attn_mode_name(mode), c.s.HS, chain, ATTN_HOPPER_ROW_PASS, ATTN_HOPPER_KEY_PASS);
    with_chain(mode, c.s.HS, [&](auto hs, auto mode_c) {
        constexpr int HS = decltype(hs)::value, MODE = decltype(mode_c)::value;
        using Chain = HopperBwdChain<HS, MODE>;
        if constexpr (Chain::kRowPass) {
            if (passes & ATTN_HOPPER_ROW_PASS) hopper_rows_pass<HS, MODE>(c);
        }
        if (!(passes & ATTN_HOPPER_KEY_PASS)) return;
        if constexpr (Chain::kKeysSendDq) {
            if (dq_slices) hopper_keys_pass<HS, MODE, true>(c);
            else hopper_keys_pass<HS, MODE, false>(c);
        } else {
            if (dq_slices)
                die("%s: mode %s's Hopper key-major pass sends no dQ, so it has no dQ slices (dq_slices = %d)\n"
                    "  hint: pass dq_slices = 0 (its dQ comes whole from the row pass: deterministic as it is)",
                    entry, attn_mode_name(mode), dq_slices);
            hopper_keys_pass<HS, MODE, false>(c);
        }
    });
}

}  // namespace

int attention_hopper_bwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv, const void* dout) {
    if (mode == ATTN_REPAIR && opt.tile_max_shift) return 0; /* the shift arm stays portable end to end */
    if (!hopper_call_fits(s, qkv, dout)) return 0;
    return chain_passes(mode, s.HS);
}

void attention_backward_hopper(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                               const __nv_bfloat16* dout, const float* stats, float* D, float* lambda, float* dq_acc,
                               __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices) {
    const HopperBwdCall c = {s, qkv, dout, stats, D, lambda, dq_acc, dqkv, stream};
    run_chain("attention_backward_hopper", kWholeChain, mode, opt, c, dq_slices);
}

void attention_backward_hopper_passes(int passes, AttnMode mode, AttnOptions opt, AttnShape s,
                                      const __nv_bfloat16* qkv, const __nv_bfloat16* dout, const float* stats,
                                      float* D, float* lambda, float* dq_acc, __nv_bfloat16* dqkv,
                                      cudaStream_t stream, int dq_slices) {
    const HopperBwdCall c = {s, qkv, dout, stats, D, lambda, dq_acc, dqkv, stream};
    run_chain("attention_backward_hopper_passes", passes, mode, opt, c, dq_slices);
}
