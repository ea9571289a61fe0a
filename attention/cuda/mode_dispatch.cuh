/*
 * attention/cuda/mode_dispatch.cuh - the one place where a CUDA attention call's run-time mode and head size
 * become template arguments. Host code.
 *
 *   with_mode_hs(entry, mode, HS, f)   calls f(mode_c, hs_c), where mode_c is std::integral_constant<int, MODE> of
 *                                      one of the four modes our kernels compute (fp32, bf16, repair, gproj) and
 *                                      hs_c std::integral_constant<int, HS> of head size 64 or 128; anything else
 *                                      dies naming `entry`.
 *
 * Why: every kernel takes (HS, MODE) as template parameters, and the portable forward and backward
 * (attention/cuda/attention_cuda.cu), the Hopper forward (hopper/attention_hopper.cu) and the Hopper backward's
 * chains (hopper/attention_hopper_bwd_dispatch.cu) all turn a call's values into them. With one helper a new mode
 * or head size is added in one switch, and no entry point can forget one. f is a generic lambda: it reads the
 * values as decltype(mode_c)::value and decltype(hs_c)::value, constant expressions for its template arguments
 * and `if constexpr`. cudnn mode never reaches here (its calls go to attention/cudnn/ first).
 */
#ifndef ATTENTION_CUDA_MODE_DISPATCH_CUH
#define ATTENTION_CUDA_MODE_DISPATCH_CUH

#include <type_traits>
#include "attention/attention.h"
#include "common/utils.h"

template <typename F>
void with_mode_hs(const char* entry, AttnMode mode, int HS, F&& f) {
    auto at_hs = [&](auto mode_c) {
        if (HS == 64) f(mode_c, std::integral_constant<int, 64>{});
        else if (HS == 128) f(mode_c, std::integral_constant<int, 128>{});
        else die("%s: head size %d has no CUDA kernel\n  hint: use head size 64 or 128", entry, HS);
    };
    switch (mode) {
        case ATTN_FP32: at_hs(std::integral_constant<int, ATTN_FP32>{}); break;
        case ATTN_BF16: at_hs(std::integral_constant<int, ATTN_BF16>{}); break;
        case ATTN_REPAIR: at_hs(std::integral_constant<int, ATTN_REPAIR>{}); break;
        case ATTN_GPROJ: at_hs(std::integral_constant<int, ATTN_GPROJ>{}); break;
        default: die("%s: mode %d has no CUDA kernel of ours\n  hint: use one of %s (cudnn mode's calls go to "
                     "attention/cudnn/)", entry, (int)mode, attn_emulated_mode_choices());
    }
}

#endif /* ATTENTION_CUDA_MODE_DISPATCH_CUH */
