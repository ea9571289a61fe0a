/*
 * dev/attention_lab/hopper_bwd128_fp32.cu - lab of the production Hopper (sm_90a) key-major pass of fp32 mode
 * at head size 128 (attention/cuda/hopper/attention_hopper_bwd128_fp32.cu: dK, dV and the dQ reduce-adds from the D that
 * the Hopper row pass leaves in the workspace; wgmma + TMA, a producer warpgroup and setmaxnreg 24/240): its
 * layout probe, then the fp32 backward by attention_backward_cuda on the default path (on sm_90: prep, the
 * Hopper row pass, this pass, the dQ post-pass) and the pass alone, against the same call with
 * AttnOptions.force_portable = 1 (the mma.sync kernels), element by element, and the timings. The kernel lives
 * in the library only; this file is host code plus a spin kernel and a dQ post-pass for the timing and check
 * (a), builds for any NVCC_ARCH, and refuses to run off sm_90.
 *
 * Next experiment: 3 stages or a persistent schedule for fp32's HS-128 key-major pass
 * (docs/attention_kernels.md, "Not done"), timed here as the pass alone and inside the fp32 backward.
 *
 * Checks (in order; the probe, the cases and the benchmark shapes each in a child process of their own):
 *   1. the layout probe (attention_hopper_fp32_keys128_layout_probe, B1 NH3 T100, head 1, keys 100..127
 *      zero-filled): S^T, dP^T; dV = (bf(S^T) + bf(S^T - bf(S^T))) dO and dK = (bf(dP^T) + bf(r1)) Q (two RS
 *      n128 batches chained per accumulator); dQ over the three staged terms (six RS n64 batches, two A
 *      register sets) and its second and third terms alone - against double loops on the kernel's own S^T
 *      and dP^T, split as the kernel splits them;
 *   2. per case: dispatch (default "hopper", force_portable "portable"); forward, then
 *      attention_backward_cuda(fp32, force_portable) = reference, and
 *      (a) this pass alone (attention_backward_hopper_passes, which runs attention_hopper_bwd128_fp32.cu's pass)
 *          on the reference's D into a zeroed accumulator and an
 *          all-NaN dqkv, then the lab's post-pass (attn_bwd_dq_kernel's expression
 *          bf(s acc); production's is file-local): dQ, dK, dV within 4 BF16 ulps of the reference - the
 *          kernel's own check, whatever row pass the default path has;
 *      (b) attention_backward_cuda(fp32, default) on poisoned dqkv and workspace: all three slots within 4
 *          ulps of the reference, every element written and finite;
 *      (c) this pass alone on the default path's D (same post-pass): dK, dV bit-equal to the default
 *          backward's (they are deterministic: the default path ran exactly this kernel), dQ within 4 ulps
 *          (its partials are TMA reduce-adds in no fixed order);
 *   3. at the benchmark shapes B8 H8 T1024 and B2 H16 T4096: the median of 21 timings (each candidate's runs
 *      queued behind a spin kernel; warm inputs) of this pass alone, the portable and the default fp32
 *      backward, and the default bf16 backward (bf16's own forward; the fp32/bf16 ratio).
 * Tolerance, fixed before the first run: only FP32 sum orders differ (wgmma k order, 64- vs 32-query tiles,
 * the chained terms summed per batch, the dQ partials' order), and a changed FP32 S or dP can flip one BF16
 * rounding of a split term; the Hopper labs' value, for all three slots.
 * Cases: T 1, 50, 77, 128, 129, 1001, 257, B*NH up to 32 (64 at the first benchmark shape), q x8 (sharp), key
 * offset 20 along a unit vector per head (where fp32 must stay accurate), the benchmark shapes.
 *
 * Safety: every mbarrier wait of the kernel is bounded (~2 s) and gives up: the CTA records the barrier and
 * writes NaN over its dK and dV rows. This lab installs the host-mapped hang record (lab_watch_hangs, through
 * attention_hopper_bwd_watch_hangs) and reads it after every synchronisation, so a hang is a named FAIL; a
 * child that dies without reporting counts as one failure. Run it under `timeout` anyway.
 *
 * Usage: hopper_bwd128_fp32   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
 * summed over the processes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/support/attn_cases.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

typedef __nv_bfloat16 bf16;
static const int kHS = 128; /* the pass's head size */
static const int kBlockK = ATTN_HOPPER_FP32_KEYS128_PROBE_KEYS;      /* the probe's keys (one CTA's) */
static const int kBlockQ = ATTN_HOPPER_FP32_KEYS128_PROBE_QUERIES;   /* the probe's queries (one tile) */
static const char* const kHangTail = "; the CTA gave up and ran on: its results are NaN)"; /* the end of a HANG line */
#include "dev/attention_lab/hopper_fp32_keys_lab.cuh"


/* The layout probe on B1 NH3 T100 HS128 (head 1; keys 100..127 zero-filled), checked against double loops on
   the kernel's own S^T and dP^T, split as the kernel splits them. */
static void layout_probe(void) {
    test_section("layout probe HS128 fp32: S^T, dP^T; dV, dK with two chained split terms; dQ over three staged"
                 " terms (six RS batches, two A register sets), and its second and third terms alone");
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, 100, kHS}, 1);
    const int nk = kBlockK, nq = kBlockQ;
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS, n_q = (size_t)nq * kHS;
    const size_t total = 2 * n_st + 2 * n_kv + 3 * n_q;
    float* d_out;
    lab_alloc_poisoned(&d_out, total * 4);
    attention_hopper_fp32_keys128_layout_probe(in.s, in.head, in.qkv, in.dout, d_out);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)lab_download(d_out, total * 4);
    const float* g_st = h;
    const float* g_dpt = g_st + n_st;
    const float* g_dv = g_dpt + n_st;
    const float* g_dk = g_dv + n_kv;
    const float* g_dq = g_dk + n_kv;
    const float* g_dq_lo = g_dq + n_q;
    const float* g_dq_lo2 = g_dq_lo + n_q;
    int bad[7];
    fp32_keymajor_probe_products(in, nk, nq, g_st, g_dpt, g_dv, g_dk, g_dq, g_dq_lo, g_dq_lo2, bad);
    CHECK(bad[0] == 0, "S^T = K Q^T through keymajor128_scores (both warpgroups, stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T through keymajor128_scores (the dout map)");
    CHECK(bad[2] == 0, "dV: bf(P), bf(P - bf(P)) packed per k-step, two RS n128 batches chained (dO N-major)");
    CHECK(bad[3] == 0, "dK: bf(dS), bf(r1) packed per k-step, two RS n128 batches chained (Q N-major)");
    CHECK(bad[4] == 0, "dQ over the three staged terms: six RS n64 batches into one accumulator");
    CHECK(bad[5] == 0, "dQ's second term (its tile, its staging) alone");
    CHECK(bad[6] == 0, "dQ's third term (its tile, its staging) alone");
    free(h);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}

/* The benchmark shapes, checked and timed (child 2). */
static const LabCase kBench[] = {{{8, 8, 1024, 128}, 1.f, 0.f}, {{2, 16, 4096, 128}, 1.f, 0.f}};

/* The layout probe (child 0), the small cases (child 1) or the benchmark shapes (child 2): hopper_fp32_keys_lab.cuh. */
static void run_child(int child) {
    fp32_keys_run_child(child, "hopper_bwd128_fp32", layout_probe, kBench, sizeof kBench / sizeof kBench[0]);
}

int main(int argc, char** argv) { return fp32_keys_main(argc, argv, "hopper_bwd128_fp32", run_child); }
