/*
 * attention/cuda/hopper/hopper_lab_hooks.cuh - the lab hooks that must live inside the production Hopper
 * objects: the installers of their hang records, and the backward's chain run pass by pass. Only the labs of
 * dev/attention_lab/ call them (the installers through hopper_lab.cuh's lab_watch_hangs); production code never
 * does, and a NULL record (the default) costs a kernel nothing but the pointer test of a wait that already ran
 * out.
 *
 * Why here: every bounded mbarrier wait of a kernel (hopper_bwd_common.cuh's mbar_wait_give_up, and the
 * trapping waits of fp32's HS-64 key-major pass) reads its object's __device__ record pointer, and without
 * relocatable device code only code in that translation unit can set it. So each object defines its
 * one-line installer; the layout probes, the aggregation over objects and the names of the barriers are lab
 * code (dev/attention_lab/). The passes of a chain one at a time go through the production dispatch
 * (attention_hopper_bwd_dispatch.cu), so a lab times and checks the very launch the chain makes.
 */
#ifndef ATTENTION_CUDA_HOPPER_HOPPER_LAB_HOOKS_CUH
#define ATTENTION_CUDA_HOPPER_HOPPER_LAB_HOOKS_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"

/* Which mbarrier a hung wait was on (AttnHopperHang.site). */
enum {
    ATTN_HANG_NONE = 0,
    ATTN_HANG_KV_FULL = 1,
    ATTN_HANG_FULL = 2,
    ATTN_HANG_EMPTY = 3,
    ATTN_HANG_PROBE = 4,
    ATTN_HANG_KV_EMPTY = 5
};
/* The first give-up of a grid, written by the kernel into host-mapped memory (cudaHostAllocMapped; the
   installers take its device pointer); site last, after a system fence, so a nonzero site means a whole record. */
typedef struct {
    int site, index, parity, block_x, block_y, thread;
} AttnHopperHang;

/* Each sets its own object's record pointer (NULL: no record). */
void attention_hopper_bwd_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);         /* bf16/repair keys, HS 64 */
void attention_hopper_bwd128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);      /* bf16/repair keys, HS 128 */
void attention_hopper_rows_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);        /* row pass, HS 64 */
void attention_hopper_rows128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);     /* row pass, HS 128 */
void attention_hopper_gproj_keys_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);  /* gproj keys, HS 64 */
void attention_hopper_gproj_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record); /* gproj keys, HS 128 */
void attention_hopper_fp32_keys_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record);   /* fp32 keys, HS 64 */
void attention_hopper_fp32_keys128_watch_hangs(AttnHopperHang* device_ptr_of_mapped_record); /* fp32 keys, HS 128 */

/* attention_backward_hopper (attention_hopper_bwd.cuh) with only the passes of `passes` (ATTN_HOPPER_ROW_PASS,
   ATTN_HOPPER_KEY_PASS or both) of the chain of (mode, s.HS): one pass alone on workspace slots the lab filled
   (a key-major pass on the reference's D, say; out may be NULL for a pass that does not read it: all but
   gproj's row pass). Dies naming the pass when the chain has no such pass. */
void attention_backward_hopper_passes(int passes, AttnMode mode, AttnOptions opt, AttnShape s,
                                      const __nv_bfloat16* qkv, const __nv_bfloat16* out, const __nv_bfloat16* dout,
                                      const float* stats, float* D, float* lambda, float* dq_acc,
                                      __nv_bfloat16* dqkv, cudaStream_t stream, int dq_slices);

#endif /* ATTENTION_CUDA_HOPPER_HOPPER_LAB_HOOKS_CUH */
