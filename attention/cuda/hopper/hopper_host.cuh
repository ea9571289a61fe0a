/*
 * attention/cuda/hopper/hopper_host.cuh - the host side that every Hopper (sm_90a) instantiation file
 * (attention_hopper*.cu) and the backward's dispatch share: the shape and alignment check of a call, the
 * qkv / dout tensor maps, the message of an unsupported call, the tensors of a backward call
 * (HopperBwdCall), the declarations of the backward's per-(head size, mode) passes, the grid of a launch over
 * work items (hopper_item_grid: a CTA per item, or a persistent launch), and the installer of a translation
 * unit's hang record.
 *
 * Why: the public surface (attention_hopper.cuh, attention_hopper_bwd.cuh) is one support check and one entry
 * point per direction; the backward's entry point (attention_hopper_bwd_dispatch.cu) turns the run-time mode,
 * head size into the template arguments of the passes declared here, which the instantiation
 * files define next to their kernels. What those files have in common is written once here. Host code only:
 * the kernels' code does not depend on it. Included after the file's kernel header, in its anonymous
 * namespace where it uses the kernel's names.
 */
#ifndef ATTENTION_CUDA_HOPPER_HOPPER_HOST_CUH
#define ATTENTION_CUDA_HOPPER_HOPPER_HOST_CUH

#include <stdint.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/cuda/hopper/hopper_lab_hooks.cuh"
#include "attention/cuda/hopper/hopper_wgmma.cuh"
#include "common/cuda_utils.cuh"

/* The tensors of one Hopper backward call (attention_hopper_bwd.cuh's attention_backward_hopper): its inputs,
   the workspace slots it reads and writes (attention_cuda.cu's carve_workspace: D, lambda, dq_acc), dqkv, its stream
   and its dq_slices. */
struct HopperBwdCall {
    AttnShape s;
    const __nv_bfloat16* qkv;
    const __nv_bfloat16* out;  /* the forward's O [B, T, NH, HS]: read by gproj's row pass (D) only */
    const __nv_bfloat16* dout;
    const float* stats;
    float* D;
    float* lambda;
    float* dq_acc;
    __nv_bfloat16* dqkv;
    cudaStream_t stream;
    int dq_slices; /* attention_hopper_bwd.cuh's dq_slices: 0 in the chains whose key-major pass sends no dQ */
};

/* One pass of the backward at one (head size, mode): the launch of its kernel on `c`, asynchronous on c.stream.
   Only declared here: each (HS, MODE) is specialised in the instantiation file that holds its kernel (a pair
   without one is a link error), and only attention_hopper_bwd_dispatch.cu calls them, after its support check
   and for the passes its chain table (kHopperBwdChains) lists. */
template <int HS, int MODE>
void hopper_rows_pass(const HopperBwdCall& c);
template <int HS, int MODE>
void hopper_keys_pass(const HopperBwdCall& c);

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
   support and falls back to the portable kernels. The message carries the caller's file and line
   (die_unsupported). */
inline void die_unsupported_at(const char* file, int line, const char* entry, AttnMode mode, AttnShape s,
                               const void* qkv, const void* dout, const char* needs, const char* fallback) {
    die_at(file, line, "%s: unsupported call (mode %s, B=%d NH=%d T=%d HS=%d, qkv %p, dout %p)\n"
        "  hint: %s, head size 64 or 128, B*NH <= 65535, qkv and dout 16-byte aligned; use %s, which falls back "
        "to the portable kernels",
        entry, (int)mode >= 0 && mode < ATTN_NUM_MODES ? attn_mode_name(mode) : "?", s.B, s.NH, s.T, s.HS, qkv, dout,
        needs, fallback);
}
#define die_unsupported(...) die_unsupported_at(__FILE__, __LINE__, __VA_ARGS__)

/* The backward's two inputs as hopper_wgmma.cuh's 4-D TMA tensors: qkv [B, T, 3, NH, HS] and dout
   [B, T, NH, HS], boxes of 64 columns x box_rows tokens. */
struct HeadMaps {
    CUtensorMap qkv, dout;
};
inline HeadMaps encode_qkv_dout_maps(AttnShape s, const void* qkv, const void* dout, int box_rows, const char* who) {
    return {hopper_wgmma::encode_head_map(qkv, s, 3 * s.NH, box_rows, who, "qkv"),
            hopper_wgmma::encode_head_map(dout, s, s.NH, box_rows, who, "dout")};
}

/* A launch switch from the environment, read at each launch: 1 for "1", 0 for "0", `unset` when the variable is
   unset or empty; any other value stops the program (a typo must not time the wrong launch). */
inline int hopper_env_switch(const char* name, int unset) {
    const char* v = getenv(name);
    if (v == NULL || v[0] == '\0') return unset;
    if ((v[0] == '0' || v[0] == '1') && v[1] == '\0') return v[0] == '1';
    die("attention (Hopper): %s=%s\n  hint: 1 (on) or 0 (off)", name, v);
    return unset;
}

/* The current device's SM count, asked once per device. */
inline int hopper_sm_count() {
    static int count[64]; /* 0: not asked yet; a race between host threads writes the same answer twice */
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64) die("attention (Hopper): device ordinal %d past the 64 this cache holds", dev);
    if (count[dev] == 0) cudaCheck(cudaDeviceGetAttribute(&count[dev], cudaDevAttrMultiProcessorCount, dev));
    return count[dev];
}

/* The 1-D grid of a kernel that runs `items` work items: a CTA per item, or with `persistent` one per SM (fewer
   when there are fewer items), whose CTAs take the items past the first gridDim.x from a queue
   (hopper_work_queue.cuh). who: the kernel, for the error when the items do not fit a grid. */
inline unsigned hopper_item_grid(long long items, int persistent, const char* who) {
    if (items < 1 || items > 0x7fffffffLL)
        die("%s: %lld work items; a grid takes 1 .. 2^31 - 1\n  hint: fewer heads (B*NH) or a shorter T", who, items);
    if (!persistent) return (unsigned)items;
    const long long sms = hopper_sm_count(); /* asked only for a persistent launch */
    return (unsigned)(items > sms ? sms : items);
}

/* Points a translation unit's hang record (its __device__ g_hang_record) at a host-mapped AttnHopperHang (a lab's;
   hopper_lab_hooks.cuh). */
inline void install_hang_record(AttnHopperHang* const& symbol, AttnHopperHang* device_ptr_of_mapped_record) {
    cudaCheck(cudaMemcpyToSymbol(symbol, &device_ptr_of_mapped_record, sizeof device_ptr_of_mapped_record));
}

}  // namespace

#endif /* ATTENTION_CUDA_HOPPER_HOPPER_HOST_CUH */
