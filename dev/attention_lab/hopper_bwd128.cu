/*
 * dev/attention_lab/hopper_bwd128.cu - lab of the production Hopper (sm_90a) key-major attention backward at
 * head size 128 (attention/cuda/hopper/attention_hopper_bwd128.cu: dK, dV and the dQ atomics on wgmma + TMA with
 * setmaxnreg, bf16 and repair modes): its layout probe, then the whole backward by attention_backward_cuda on
 * the Hopper path (the default on sm_90) against the same call with AttnOptions.force_portable = 1 (the
 * mma.sync kernels), element by element within 4 BF16 ulps, and both timed side by side. The kernel lives
 * in the library only; this file is host code (checks, timing, one spin kernel) and builds for any
 * NVCC_ARCH, but refuses to run off sm_90.
 *
 * Next experiment: 3 Q/dO stages and a persistent schedule for the HS-128 key-major kernel
 * (docs/attention_kernels.md, "Not done"), timed here against the default backward.
 *
 * The probe (attention_hopper_bwd128_layout_probe) runs the kernel's operand forms on one CTA tile against
 * host loops first, so a failure names the wrong assumption before the attention checks fail:
 *   (a) m64n64k16 SS over 8 k-steps with the chunk jump (K rows at the warpgroup's 8 KB offset inside 16 KB
 *       chunks, Q/dO chunks 8 KB apart) - S^T, dP^T;
 *   (b) m64n128k16 RS with an N-major B of 64 rows whose two 64-column chunks are 8 KB apart - dV, dK;
 *   (c) bf(dS) staged from the packed A words by both warpgroups into one [query][136] tile, read back as 8
 *       k-steps of A - dQ;  (d) K read N-major as one 128-key column chunk across its two TMA boxes - dQ.
 *
 * Safety: the kernel's mbarrier waits are bounded (~2 s) and then give up: the CTA writes NaN to its dK/dV
 * rows, and this lab installs the host-mapped record (attention_hopper_bwd_watch_hangs) and reads it after
 * every synchronisation, so a hang is a named FAIL, not a stuck job. The probe and the checks run in two
 * child processes (the parent never touches CUDA), so a fault costs one child's lines only. Run it under
 * `timeout` anyway.
 *
 * Timing: the whole backward (prep + key-major kernel + dQ post-pass) on both paths, interleaved, queued
 * behind a spin kernel so host launch work (production encodes its tensor maps per call) never shows as GPU
 * idle time inside a timed interval. Inputs stay in L2 between repeats: dev/bench_attention.cu rotates them
 * for the number set beside cuDNN.
 *
 * Usage: hopper_bwd128   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
 * summed over the processes; a process that dies without reporting counts as one failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/support/attn_cases.h"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"
#include "dev/attention_lab/lab_harness.cuh" /* spin_for_ns */

typedef __nv_bfloat16 bf16;
static const int kHS = 128; /* the head size of this lab */

/* cudaDeviceSynchronize (or an event wait) that names the barrier that hung, if one did (the HS-128 kernel
   gives up and runs on, so a hang is not a CUDA error), and stops on either. The record: hopper_lab.cuh's
   lab_watch_hangs (host-mapped, installed for every Hopper backward kernel). */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return;
    if (hung) {
        fprintf(stderr, "hopper_bwd128: HANG: mbarrier %s, index %d, parity %d, block (%d, %d), thread %d"
                " (the CTA gave up waiting and wrote NaN to its dK/dV rows)\n",
                attn_hopper_hang_site_name(r->site), r->index, r->parity, r->block_x, r->block_y, r->thread);
        printf("  FAIL HANG in %s: mbarrier %s never completed\n", where, attn_hopper_hang_site_name(r->site));
        fflush(stdout);
    }
    die("hopper_bwd128: %s after %s%s%s\n  hint: a HANG line names the mbarrier that never completed (a pipeline"
        " protocol bug); otherwise run under compute-sanitizer",
        hung ? "a hung mbarrier" : "a CUDA error", where, e != cudaSuccess ? ": " : "",
        e != cudaSuccess ? cudaGetErrorString(e) : "");
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the portable backward, timing                                                */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerance (set before any run, as the HS 64 labs): the kernels sum S, dP (tensor-core k order), dK/dV
   (query order within a tile) and dQ (per 128 keys in both, different order inside) differently; a
   changed FP32 S can flip the BF16 rounding of P or dS of one element. */
static const double kMaxUlps = 4.0;

/* One shape and mode: forward by attention_forward_cuda, then attention_backward_cuda on both paths on the
   same inputs (dqkv and both workspaces poisoned with NaN first), compared slot by slot. With time_it,
   both timed, interleaved. */
static void check_shape(AttnMode mode, AttnShape s, float q_scale, int time_it) {
    char title[256];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d%s: Hopper backward vs the portable one",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, q_scale != 1.f ? " (q x8)" : "");
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    uint16_t* h_qkv = random_qkv_bits(s, q_scale);
    uint16_t* h_dout = random_bf16_bits(nout);
    /* dqkv and both workspaces poisoned (NaN): any output or workspace element left unwritten shows */
    LabBwdCase c = lab_bwd_case_make(mode, s, h_qkv, h_dout);
    CHECK(lab_bwd_dispatch_ok(c),
          "dispatch: the default backward is the Hopper one, force_portable the portable one");
    lab_bwd_run_both(c, c.portable, 0);
    sync_or_report(cudaDeviceSynchronize(), title);
    uint16_t* h_ref = (uint16_t*)lab_download(c.dqkv_ref, nqkv * 2);
    uint16_t* h_new = (uint16_t*)lab_download(c.dqkv_def, nqkv * 2);
    static const char* kSlotName[3] = {"dQ", "dK", "dV"};
    for (int slot = 0; slot < 3; slot++) {
        const SlotDiff d = compare_slot(h_ref, h_new, s, slot);
        printf("  %s: max |diff| %.3g, max %.2f BF16 ulps (at max(|a|, |b|, row RMS)), %zu of %zu over 1 ulp\n",
               kSlotName[slot], d.max_abs, d.max_ulps, d.over_1ulp, d.count);
        CHECK(d.nan_ref == 0, "%s: portable backward wrote every element, finite (%zu NaN)", kSlotName[slot], d.nan_ref);
        CHECK(d.nan_new == 0, "%s: Hopper backward wrote every element, finite (%zu NaN left)", kSlotName[slot],
              d.nan_new);
        CHECK(d.max_ulps <= kMaxUlps, "%s within %.0f BF16 ulps of the portable backward (max %.2f)", kSlotName[slot],
              kMaxUlps, d.max_ulps);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t ev[4][kReps];
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < kReps; r++) cudaCheck(cudaEventCreate(&ev[k][r]));
        for (int i = 0; i < kWarmup; i++) {
            lab_bwd_portable(c, 0);
            lab_bwd_default(c, 0);
        }
        sync_or_report(cudaDeviceSynchronize(), "the warm-up launches");
        /* 2 ms plus 100 us per pair of launches: longer than queueing them takes */
        spin_for_ns<<<1, 1>>>(2000000ull + 100000ull * kReps);
        cudaCheckLastError();
        for (int r = 0; r < kReps; r++) {
            cudaCheck(cudaEventRecord(ev[0][r]));
            lab_bwd_portable(c, 0);
            cudaCheck(cudaEventRecord(ev[1][r]));
            cudaCheck(cudaEventRecord(ev[2][r]));
            lab_bwd_default(c, 0);
            cudaCheck(cudaEventRecord(ev[3][r]));
        }
        sync_or_report(cudaDeviceSynchronize(), "the timed launches");
        float t_ref[kReps], t_new[kReps];
        for (int r = 0; r < kReps; r++) {
            cudaCheck(cudaEventElapsedTime(&t_ref[r], ev[0][r], ev[1][r]));
            cudaCheck(cudaEventElapsedTime(&t_new[r], ev[2][r], ev[3][r]));
        }
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < kReps; r++) cudaCheck(cudaEventDestroy(ev[k][r]));
        /* backward = 2.5 x the causal forward's 2 B H T^2 d (FlashAttention count) */
        const double flops = 2.5 * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
        const float ms_ref = median_ms(t_ref, kReps), ms_new = median_ms(t_new, kReps);
        printf("  time (median of %d, warm inputs, launches queued behind a spin, prep + kernel + dQ pass): mma.sync"
               " %.4f ms = %.1f TFLOP/s; Hopper %.4f ms = %.1f TFLOP/s; speed-up %.2fx\n",
               (int)kReps, ms_ref, flops / ms_ref * 1e-9, ms_new, flops / ms_new * 1e-9, ms_ref / ms_new);
    }
    free(h_ref); free(h_new);
    lab_bwd_case_free(&c);
}

/* Runs the library's layout probe (attention_hopper_bwd128_layout_probe) on B1 NH3 T100 (head 1: slot and
   head coordinates; keys 100..127 zero-filled) and checks its five products against double loops over the
   same BF16 values (the kernel's own S^T, dP^T, rounded to BF16 as it rounds them, for the register-A and
   staged-A products). */
static void layout_probe(void) {
    test_section("layout probe HS128: S^T, dP^T (SS n64, 2 chunks), dV, dK (RS n128, LBO 8 KB), dQ (dS of both"
                 " warpgroups staged, K chunk N-major over 128 keys)");
    /* hopper_lab.cuh's probe inputs (accessors probe_qkv / probe_dout) at this probe's shape */
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, 100, kHS}, 1);
    const int nk = ATTN_HOPPER_BWD128_PROBE_KEYS, nq = ATTN_HOPPER_BWD128_PROBE_QUERIES;
    const size_t n_st = (size_t)nk * nq, n_dkv = (size_t)nk * kHS, n_dq = (size_t)nq * kHS;
    const size_t total = 2 * n_st + 2 * n_dkv + n_dq;
    float* d_out;
    lab_alloc_poisoned(&d_out, total * 4);
    attention_hopper_bwd128_layout_probe(in.s, in.head, in.qkv, in.dout, d_out);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)lab_download(d_out, total * 4);
    const float* g_st = h;
    const float* g_dpt = g_st + n_st;
    const float* g_dv = g_dpt + n_st;
    const float* g_dk = g_dv + n_dkv;
    const float* g_dq = g_dk + n_dkv;
    int bad[5];
    keymajor_probe_products(in, nk, nq, g_st, g_dpt, g_dv, g_dk, g_dq, bad); /* dQ over all 128 keys */
    CHECK(bad[0] == 0, "S^T = K Q^T: (a) m64n64k16 SS over 8 k-steps, the chunk jump at k-step 4, K rows at the"
                       " warpgroup's 8 KB offset inside 16 KB chunks, Q chunks 8 KB apart (stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T: (a) with the dout map at HS 128 (column coordinate 64 for chunk 1)");
    CHECK(bad[2] == 0, "dV = bf(S^T) dO: (b) m64n128k16 RS, dO N-major with LBO = 8 KB (one 64-row chunk)");
    CHECK(bad[3] == 0, "dK = bf(dP^T) Q: (b) the Q tile read N-major after being read K-major");
    CHECK(bad[4] == 0, "dQ = bf(dS) K: (c) dS staged from the packed words by both warpgroups, read as 8 k-steps"
                       " of A; (d) K column chunk N-major across its two 64-row boxes");
    free(h);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}


/* The checks of one child process: the layout probe (child 0) or every shape (child 1). */
static void run_child(int child) {
    lab_child_begin("hopper_bwd128", 0x13198A2E03707344ull);
    if (child == 0) {
        layout_probe();
        return;
    }
    /* correctness: T = 1, T not a multiple of the tiles (a last key tile with an empty second half), B*NH
       from 1 to 32 */
    const AttnShape shapes[] = {
        {1, 1, 1, 128}, {1, 1, 77, 128}, {1, 2, 128, 128}, {1, 1, 129, 128}, {2, 3, 1000, 128}, {4, 8, 257, 128},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(ATTN_BF16, shapes[i], 1.f, 0);
    const AttnShape sharp = {1, 4, 500, 128};
    check_shape(ATTN_BF16, sharp, 8.f, 0);
    const AttnShape repair_shapes[] = {{1, 1, 77, 128}, {2, 3, 1000, 128}};
    for (size_t i = 0; i < sizeof repair_shapes / sizeof repair_shapes[0]; i++)
        check_shape(ATTN_REPAIR, repair_shapes[i], 1.f, 0);
    /* timing (and checks) at bench_attention's two HS-128 shapes */
    const AttnShape bench[] = {{8, 8, 1024, 128}, {2, 16, 4096, 128}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(ATTN_BF16, bench[i], 1.f, 1);
}

/* The parent never touches CUDA: each child (the probe, then the checks) gets a fresh context, so a fault in
   one costs that child's results only. A child reports its pass/fail counts through a pipe; one that dies
   without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes are fixed in run_child()", argv[0]);
    printf("hopper_bwd128: the production HS-128 Hopper backward (attention_hopper_bwd128.cu) vs the portable one;"
           " the probe and the checks each in its own process\n");
    static const char* kChildName[] = {"the layout probe", "the checks against the portable backward"};
    return lab_run_children("hopper_bwd128", 2, kChildName, run_child, 0);
}
