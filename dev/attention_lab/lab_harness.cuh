/*
 * dev/attention_lab/lab_harness.cuh - the check and timing harness of the Hopper backward labs that run each
 * group of checks in a child process and time their candidates queued behind a spin kernel (hopper_bwd64_wide,
 * hopper_bwd128_gproj, and hopper_bwd64_fp32 / hopper_bwd128_fp32 through hopper_fp32_keys_lab.cuh;
 * hopper_bwd128 and hopper_rows128, which time in their own way, take only the spin kernel).
 *
 * Why: these labs compare dqkv slots and time their candidates in the same way, so one copy here keeps their
 * checks and printed lines alike (their synchronisation check is hopper_lab.cuh's lab_child_sync_or_fail).
 * Unlike hopper_lab.cuh (host code only) this header defines a kernel (spin_for_ns), so only the labs that
 * launch it include it: the others' device code stays as it is. One lab = one translation unit: everything
 * here is file-local (static) except the kernel, which keeps the name the labs launch.
 *
 * Offers:
 *   spin_for_ns                       - a kernel that holds the GPU for a number of nanoseconds;
 *   kExact, lab_check_slot            - one dqkv slot CHECKed within a BF16-ulp bound, or bit for bit;
 *   LabTimer (lab_timer_make / _median / _free) - kLabReps back-to-back runs queued behind a spin, their median;
 *   LabBf16Backward (lab_bf16_backward_make / _run / _free) - bf16 mode's forward and default backward on a
 *                                       case's inputs, for the timing ratios against bf16.
 */
#ifndef DEV_ATTENTION_LAB_LAB_HARNESS_CUH
#define DEV_ATTENTION_LAB_LAB_HARNESS_CUH

#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "common/cuda_utils.cuh"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it, so host-side launch work never shows as idle time inside an interval. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* lab_check_slot's max_ulps for bit-equality. */
static const double kExact = 0.0;

/* Compares one slot (0 dQ, 1 dK, 2 dV) of two dqkv buffers (BF16 bits) and CHECKs `got` within max_ulps
   BF16 ulps (bit-equal when kExact) of `ref`, every element of both finite; `what` opens the lines, `against`
   names the reference, `nan_left` says where a NaN in `got` comes from ("of the poison", ...). */
static void lab_check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                           const char* against, double max_ulps, const char* nan_left) {
    static const char* const kSlotName[3] = {"dQ", "dK", "dV"};
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs %s: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n", what,
           kSlotName[slot], against, d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: %s has every element finite (%zu NaN)", kSlotName[slot], against, d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left %s)", what, kSlotName[slot], d.nan_new,
          nan_left);
    if (max_ulps == kExact)
        CHECK(d.unequal == 0, "%s %s bit-equal to %s (%zu differ)", what, kSlotName[slot], against, d.unequal);
    else
        CHECK(d.max_ulps <= max_ulps, "%s %s within %.0f BF16 ulps of %s (max %.2f)", what, kSlotName[slot], max_ulps,
              against, d.max_ulps);
}

/* ---- timing: kLabReps back-to-back runs queued behind a spin, after kLabWarmup runs ---- */

enum { kLabWarmup = 3, kLabReps = 21 };
struct LabTimer {
    cudaStream_t st;
    void (*sync)(cudaError_t e, const char* where); /* the lab's synchronisation check */
    cudaEvent_t ev[kLabReps + 1];
};
static inline LabTimer lab_timer_make(cudaStream_t st, void (*sync)(cudaError_t, const char*)) {
    LabTimer t;
    t.st = st;
    t.sync = sync;
    for (int r = 0; r <= kLabReps; r++) cudaCheck(cudaEventCreate(&t.ev[r]));
    return t;
}
/* The median in ms of kLabReps runs of fn() on the timer's stream, queued behind a spin of 2 ms + 100 us per
   run (longer than queueing them takes); `what` names the runs in a failure. */
template <typename Fn>
static float lab_timer_median(LabTimer& t, Fn fn, const char* what) {
    float ms[kLabReps];
    for (int i = 0; i < kLabWarmup; i++) fn();
    t.sync(cudaStreamSynchronize(t.st), what);
    spin_for_ns<<<1, 1, 0, t.st>>>(2000000ull + 100000ull * kLabReps);
    cudaCheckLastError();
    cudaCheck(cudaEventRecord(t.ev[0], t.st));
    for (int i = 0; i < kLabReps; i++) {
        fn();
        cudaCheck(cudaEventRecord(t.ev[i + 1], t.st));
    }
    t.sync(cudaStreamSynchronize(t.st), what);
    for (int i = 0; i < kLabReps; i++) cudaCheck(cudaEventElapsedTime(&ms[i], t.ev[i], t.ev[i + 1]));
    return median_ms(ms, kLabReps);
}
static inline void lab_timer_free(LabTimer* t) {
    for (int r = 0; r <= kLabReps; r++) cudaCheck(cudaEventDestroy(t->ev[r]));
}

/* ---- bf16 mode's backward on a case's inputs, the denominator of the labs' ratios ---- */

/* The bf16 backward needs bf16's own forward (stats {LSE, 0}, its O for D): its buffers, and that forward
   run on `st` by lab_bf16_backward_make. */
struct LabBf16Backward {
    __nv_bfloat16 *out, *dqkv;
    float* stats;
    void* ws;
};
static inline LabBf16Backward lab_bf16_backward_make(AttnShape s, AttnOptions opt, const __nv_bfloat16* qkv,
                                                     cudaStream_t st) {
    LabBf16Backward b;
    cudaCheck(cudaMalloc(&b.out, attn_out_count(s) * 2));
    cudaCheck(cudaMalloc(&b.dqkv, attn_qkv_count(s) * 2));
    cudaCheck(cudaMalloc(&b.stats, attn_stats_count(s) * 4));
    cudaCheck(cudaMalloc(&b.ws, attention_cuda_workspace_bytes(s, ATTN_BF16)));
    attention_forward_cuda(ATTN_BF16, opt, s, qkv, b.out, b.stats, NULL, st);
    return b;
}
/* The default bf16 backward on the forward's results (into b's dqkv and workspace). */
static inline void lab_bf16_backward_run(const LabBf16Backward& b, AttnShape s, AttnOptions opt,
                                         const __nv_bfloat16* qkv, const __nv_bfloat16* dout, cudaStream_t st) {
    attention_backward_cuda(ATTN_BF16, opt, s, qkv, b.out, b.stats, dout, b.dqkv, b.ws, st);
}
static inline void lab_bf16_backward_free(LabBf16Backward* b) {
    cudaCheck(cudaFree(b->out)); cudaCheck(cudaFree(b->dqkv)); cudaCheck(cudaFree(b->stats)); cudaCheck(cudaFree(b->ws));
}

#endif /* DEV_ATTENTION_LAB_LAB_HARNESS_CUH */
