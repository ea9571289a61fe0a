/*
 * attention/cuda/hopper/hopper_host.cuh - the host side that every Hopper (sm_90a) instantiation file
 * (attention_hopper*.cu) shares: the shape and alignment check of a call, the qkv / dout tensor maps, the
 * message of an unsupported call, the launch of a pass's (mode, dq_slices) instantiation, the installer of a
 * translation unit's hang record, and the head-size halves that one instantiation file calls in another.
 *
 * Why: each instantiation file keeps one entry point and one support check of the public surface
 * (attention_hopper.cuh, attention_hopper_bwd.cuh); what they have in common is written once here, and the
 * HS-128 halves stay out of the public surface (only the entry point that dispatches on s.HS is public).
 * Host code only: the kernels' code does not depend on it. Included after the file's kernel header, in its
 * anonymous namespace where it uses the kernel's names.
 */
#ifndef ATTENTION_CUDA_HOPPER_HOPPER_HOST_CUH
#define ATTENTION_CUDA_HOPPER_HOPPER_HOST_CUH

#include <stdint.h>
#include <type_traits>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/cuda/hopper/hopper_lab_hooks.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "common/cuda_utils.cuh"

/* The HS-128 halves of the backward entry points (attention_hopper_bwd128*.cu, attention_hopper_rows128.cu). The
   public entry point of the pass (attention_hopper_bwd.cuh) checks support and calls its half on HS 128; each
   half dies unless s.HS is 128 and the mode is its own. */
void attention_backward_hopper_keys128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv,
                                       const __nv_bfloat16* dout, const float* stats, const float* D, float* dq_acc,
                                       __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices);
void attention_backward_hopper_rows128(AttnMode mode, AttnShape s, const __nv_bfloat16* qkv,
                                       const __nv_bfloat16* dout, const float* stats, float* D, float* lambda,
                                       __nv_bfloat16* dqkv, cudaStream_t stream);
void attention_backward_hopper_gproj_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                             const float* stats, const float* D, const float* lambda,
                                             __nv_bfloat16* dqkv, cudaStream_t stream);
void attention_backward_hopper_fp32_keys128(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* dout,
                                            const float* stats, const float* D, float* dq_acc, __nv_bfloat16* dqkv,
                                            cudaStream_t stream, int dq_slices);

namespace {

constexpr int kHopperHeadSizes[2] = {64, 128}; /* the head sizes every Hopper pass serves */
constexpr size_t kTmaAlignBytes = 16;          /* the global address alignment TMA requires */

/* 1 iff the grid and TMA can take the call: head size 64 or 128, B, NH, T >= 1, B*NH <= 65535 (grid y), qkv and
   dout 16-byte aligned (the forward passes dout = nullptr: not checked). Says nothing about the mode or device. */
inline int hopper_call_fits(AttnShape s, const void* qkv, const void* dout) {
    if (s.HS != kHopperHeadSizes[0] && s.HS != kHopperHeadSizes[1]) return 0;
    if (s.B < 1 || s.NH < 1 || s.T < 1 || (long long)s.B * s.NH > 65535) return 0;
    return ((uintptr_t)qkv % kTmaAlignBytes) == 0 && ((uintptr_t)dout % kTmaAlignBytes) == 0;
}

/* Dies naming the call `entry` could not take and what it needs; `fallback` is the entry point that checks
   support and falls back to the portable kernels. */
inline void die_unsupported(const char* entry, AttnMode mode, AttnShape s, const void* qkv, const void* dout,
                            const char* needs, const char* fallback) {
    die("%s: unsupported call (mode %s, B=%d NH=%d T=%d HS=%d, qkv %p, dout %p)\n"
        "  hint: %s, head size 64 or 128, B*NH <= 65535, qkv and dout 16-byte aligned; use %s, which falls back "
        "to the portable kernels",
        entry, (int)mode >= 0 && mode < ATTN_NUM_MODES ? attn_mode_name(mode) : "?", s.B, s.NH, s.T, s.HS, qkv, dout,
        needs, fallback);
}

/* The backward's two inputs as hopper_wgmma.cuh's 4-D TMA tensors: qkv [B, T, 3, NH, HS] and dout
   [B, T, NH, HS], boxes of 64 columns x box_rows tokens. */
struct HeadMaps {
    CUtensorMap qkv, dout;
};
inline HeadMaps encode_qkv_dout_maps(AttnShape s, const void* qkv, const void* dout, int box_rows, const char* who) {
    return {hopper_wgmma::encode_head_map(qkv, s, 3 * s.NH, box_rows, who, "qkv"),
            hopper_wgmma::encode_head_map(dout, s, s.NH, box_rows, who, "dout")};
}

/* launch(mode, slices) with mode one of MODES as std::integral_constant<int, MODE> and slices as std::true_type
   or std::false_type: the key-major pass's instantiation for (mode, dq_slices). A mode outside MODES dies. */
template <int... MODES, typename Launch>
void launch_mode_and_slices(AttnMode mode, int dq_slices, Launch&& launch) {
    bool found = false;
    auto one = [&](auto mode_c) {
        if (found || (int)mode != decltype(mode_c)::value) return;
        found = true;
        if (dq_slices) launch(mode_c, std::true_type{});
        else launch(mode_c, std::false_type{});
    };
    (one(std::integral_constant<int, MODES>{}), ...);
    if (!found) die("attention (Hopper backward): mode %d has no instantiation in this pass", (int)mode);
}

/* Points a translation unit's hang record (its __device__ g_hang_record) at a host-mapped AttnHopperHang (a lab's;
   hopper_lab_hooks.cuh). */
inline void install_hang_record(AttnHopperHang* const& symbol, AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(symbol, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_HOPPER_HOST_CUH */
