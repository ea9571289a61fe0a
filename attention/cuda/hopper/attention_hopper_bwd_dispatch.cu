/*
 * attention/cuda/hopper/attention_hopper_bwd_dispatch.cu - the Hopper (sm_90a) backward's dispatch: the table of
 * the passes each (mode, head size) runs (kHopperBwdChains), the support check and the entry point of
 * attention_hopper_bwd.cuh and the lab's pass-by-pass entry (hopper_lab_hooks.cuh). A call's run-time mode and
 * head size become the passes' template arguments in attention/cuda/mode_dispatch.cuh's with_mode_hs, as in
 * every other CUDA attention entry point.
 *
 * Why: the kernels are template families (kernel_keys64.cuh, kernel_keys128.cuh, kernel_rows.cuh) instantiated
 * per (head size, mode) in the attention_hopper_*.cu files, each of which defines the passes
 * (hopper_rows_pass, hopper_keys_pass; hopper_host.cuh) of its kernels and nothing else. What runs for a call,
 * and whether the call can run here at all, is decided here once: attention_cuda.cu asks the check once per
 * call and hands the whole chain to the entry point, with the mode still a run-time value. A new mode adds its
 * rows to the table and its passes to the instantiation files (docs/attention_kernels.md,
 * "Which files a mode touches"). Host code only: no kernel is instantiated here.
 */
#include <stddef.h>
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"
#include "attention/cuda/mode_dispatch.cuh"

namespace {

/* The chain of one (mode, head size): the passes it runs between attention_cuda.cu's prep kernel and its dQ
   post-pass (attention_hopper_bwd.cuh says what each reads and writes). row_pass: the row pass runs first (fp32:
   D = sum P dP; gproj: lambda and all of dQ). keys_send_dq: the key-major pass adds dQ partials into dq_acc (so
   it takes dq_slices); gproj's writes dK and dV only. */
struct HopperBwdChain {
    AttnMode mode;
    int hs;
    bool row_pass, keys_send_dq;
};
/* The table of chains: a (mode, head size) without a row has no Hopper backward (cudnn: cuDNN's own kernels). */
constexpr HopperBwdChain kHopperBwdChains[] = {
    {ATTN_FP32, 64, true, true},    {ATTN_FP32, 128, true, true},    /* row pass, then fp32's key-major pass */
    {ATTN_BF16, 64, false, true},   {ATTN_BF16, 128, false, true},   /* the key-major pass */
    {ATTN_REPAIR, 64, false, true}, {ATTN_REPAIR, 128, false, true}, /* the key-major pass (as bf16) */
    {ATTN_GPROJ, 64, true, false},  {ATTN_GPROJ, 128, true, false},  /* row pass, then gproj's key-major pass */
};

/* The row of (mode, HS), or NULL; constexpr, so that a chain's row is a constant expression once with_mode_hs has
   made the mode and head size template arguments. */
constexpr const HopperBwdChain* find_chain(AttnMode mode, int HS) {
    for (const HopperBwdChain& chain : kHopperBwdChains)
        if (chain.mode == mode && chain.hs == HS) return &chain;
    return nullptr;
}
/* The passes of a chain (attention_hopper_bwd.cuh's bits). */
int chain_passes(const HopperBwdChain& chain) {
    return ATTN_HOPPER_KEY_PASS | (chain.row_pass ? ATTN_HOPPER_ROW_PASS : 0);
}

constexpr int kWholeChain = -1; /* run_chain's `passes`: every pass of the call's chain */

/* The passes of `passes` (kWholeChain: all) of the call's chain, in its order; `entry` names the caller in a
   refusal. */
void run_chain(const char* entry, int passes, AttnMode mode, AttnOptions opt, const HopperBwdCall& c) {
    if (!attention_hopper_bwd_supports(mode, opt, c.s, c.qkv, c.dout))
        die_unsupported(entry, mode, c.s, c.qkv, c.dout,
                        "mode bf16, repair (not its tile-max-shift arm), fp32 or gproj", "attention_backward_cuda");
    const HopperBwdChain* chain = find_chain(mode, c.s.HS);
    const int has = chain_passes(*chain);
    if (passes == kWholeChain) passes = has;
    if (passes == 0 || (passes & ~has) != 0)
        die("%s: passes %d are not a part of mode %s's Hopper chain at HS %d (its passes: %d)\n"
            "  hint: pass ATTN_HOPPER_ROW_PASS (%d) only to the chains of fp32 and gproj, ATTN_HOPPER_KEY_PASS (%d) "
            "to every chain",
            entry, passes, attn_mode_name(mode), c.s.HS, has, ATTN_HOPPER_ROW_PASS, ATTN_HOPPER_KEY_PASS);
    if (c.dq_slices && !chain->keys_send_dq)
        die("%s: mode %s's Hopper key-major pass sends no dQ, so it has no dQ slices (dq_slices = %d)\n"
            "  hint: pass dq_slices = 0 (its dQ comes whole from the row pass: deterministic as it is)",
            entry, attn_mode_name(mode), c.dq_slices);
    with_mode_hs(entry, mode, c.s.HS, [&](auto mode_c, auto hs_c) {
        constexpr int MODE = decltype(mode_c)::value, HS = decltype(hs_c)::value;
        constexpr const HopperBwdChain* row = find_chain((AttnMode)MODE, HS);
        if constexpr (row != nullptr) { /* (always: the check above refused a call without a chain) */
            if constexpr (row->row_pass) {
                if (passes & ATTN_HOPPER_ROW_PASS) hopper_rows_pass<HS, MODE>(c);
            }
            if (passes & ATTN_HOPPER_KEY_PASS) hopper_keys_pass<HS, MODE>(c);
        }
    });
}

}  // namespace

int attention_hopper_bwd_supports(AttnMode mode, AttnOptions opt, AttnShape s, const void* qkv, const void* dout) {
    if (mode == ATTN_REPAIR && opt.tile_max_shift) return 0; /* the shift arm stays portable end to end */
    const HopperBwdChain* chain = find_chain(mode, s.HS);
    return chain && hopper_call_fits(s, qkv, dout) ? chain_passes(*chain) : 0;
}

void attention_backward_hopper(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* qkv,
                               const __nv_bfloat16* out, const __nv_bfloat16* dout, const float* stats, float* D,
                               float* lambda, float* dq_acc, __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices) {
    const HopperBwdCall c = {s, qkv, out, dout, stats, D, lambda, dq_acc, dqkv, stream, dq_slices};
    run_chain("attention_backward_hopper", kWholeChain, mode, opt, c);
}

void attention_backward_hopper_passes(int passes, AttnMode mode, AttnOptions opt, AttnShape s,
                                      const __nv_bfloat16* qkv, const __nv_bfloat16* out, const __nv_bfloat16* dout,
                                      const float* stats, float* D, float* lambda, float* dq_acc,
                                      __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices) {
    const HopperBwdCall c = {s, qkv, out, dout, stats, D, lambda, dq_acc, dqkv, stream, dq_slices};
    run_chain("attention_backward_hopper_passes", passes, mode, opt, c);
}
