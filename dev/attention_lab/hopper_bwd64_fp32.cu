/*
 * dev/attention_lab/hopper_bwd64_fp32.cu - lab of the production Hopper (sm_90a) key-major pass of fp32 mode at
 * head size 64 (attention/cuda/hopper/attention_hopper_bwd64_fp32.cu: dK, dV and the dQ reduce-adds from the D that the
 * Hopper row pass leaves in the workspace; wgmma + TMA, two consumer warpgroups and a producer warp, 288 threads,
 * no setmaxnreg): its layout probe, then the fp32 backward by attention_backward_cuda on the default path (on
 * sm_90: prep, the Hopper row pass, this pass, the dQ post-pass) and the pass alone, against the same call with
 * AttnOptions.force_portable = 1 (the mma.sync kernels), element by element, and the timings. The kernel lives
 * in the library only; this file is host code plus a spin kernel and a dQ post-pass for the timing and checks
 * (a) and (c), builds for any NVCC_ARCH, and refuses to run off sm_90.
 *
 * Next experiment: a producer warpgroup with setmaxnreg in place of the producer warp, so the consumers
 * get more than 168 registers for overlap (docs/attention_kernels.md, "Not done"), checked and timed here.
 *
 * Checks (in order; the probe, the cases and the benchmark shapes each in a child process of their own):
 *   1. the layout probe (attention_hopper_fp32_keys64_layout_probe, B1 NH3 T50, head 1, one warpgroup at
 *      warpgroup 1's offsets, stage 1, keys 50..63 zero-filled): S^T, dP^T; dV = (bf(S^T) + bf(S^T - bf(S^T))) dO
 *      and dK = (bf(dP^T) + bf(r1)) Q (two RS n64 batches chained per accumulator); dQ over the three staged
 *      terms (three RS groups, two A register sets) and its second and third terms alone - against double loops
 *      on the kernel's own S^T and dP^T, split as the kernel splits them;
 *   2. per case: dispatch (default "hopper", force_portable "portable"; attention_hopper_bwd_supports says
 *      row pass + key-major pass); forward, then attention_backward_cuda(fp32, force_portable) = reference, and
 *      (a) this pass alone (attention_backward_hopper_passes) on the reference's D into a zeroed accumulator
 *          and an all-NaN dqkv, then the lab's post-pass (attn_bwd_dq_kernel's expression bf(s acc);
 *          production's is file-local): dQ, dK, dV within 4 BF16 ulps of the reference;
 *      (b) attention_backward_cuda(fp32, default) on poisoned dqkv and workspace: all three slots within 4 ulps
 *          of the reference, every element written and finite;
 *      (c) this pass alone on the default path's D (same post-pass): dK, dV bit-equal to the default backward's
 *          (deterministic: the default path ran exactly this kernel), dQ within 4 ulps (its partials are TMA
 *          reduce-adds in no fixed order);
 *   3. at B8 H16 T1024 and B4 H16 T2048: the median of 21 timings (each candidate's runs queued behind a spin
 *      kernel; warm inputs) of this pass alone, the portable and the default fp32 backward, and the default
 *      bf16 backward (bf16's own forward; the fp32/bf16 ratio).
 * Tolerance, fixed before the first run: only FP32 sum orders differ (wgmma k order, the chained terms summed per
 * batch, the dQ partials' order), and a changed FP32 S or dP can flip one BF16 rounding of a split term; the
 * Hopper labs' value, for all three slots.
 * Cases: T 1, 50, 77, 128, 129, 1001, 257, B*NH up to 32 (128 at the first benchmark shape), q x8 (sharp), key
 * offset 20 along a unit vector per head (where fp32 must stay accurate), the benchmark shapes.
 *
 * Safety: every mbarrier wait of the kernel is bounded (~2 s) and gives up after naming the barrier in the
 * host-mapped hang record (lab_watch_hangs installs it through attention_hopper_bwd_watch_hangs), and the pass
 * writes NaN; this lab reads the record after every synchronisation, so a hang is a named FAIL; a child that
 * dies without reporting counts as one failure. Run it under `timeout` anyway.
 *
 * Usage: hopper_bwd64_fp32   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
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
static const int kHS = 64; /* the pass's head size */
static const int kProbeTile = ATTN_HOPPER_FP32_KEYS64_PROBE_TILE; /* the probe's keys and queries (one warpgroup step) */
static const int kProbeT = 50; /* the probe's tokens (< kProbeTile: the TMA zero fill shows) */
static const char* const kHangTail = "; the CTA gave up: its items' results are NaN)"; /* the end of a HANG line */
#include "dev/attention_lab/hopper_fp32_keys_lab.cuh"


/* The layout probe on B1 NH3 T50 HS64 (head 1; keys 50..63 zero-filled), checked against double loops on the
   kernel's own S^T and dP^T, split as the kernel splits them. */
static void layout_probe(void) {
    test_section("layout probe HS64 fp32: S^T, dP^T; dV, dK as two chained RS n64 batches of split terms; three dS"
                 " terms staged from words (pitch 72) and three dQ groups over them; its 2nd, 3rd terms alone");
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, kProbeT, kHS}, 1);
    const int n = kProbeTile;
    const size_t tile = (size_t)n * n, total = 7 * tile;
    float* d_out;
    lab_alloc_poisoned(&d_out, total * 4);
    attention_hopper_fp32_keys64_layout_probe(in.s, in.head, in.qkv, in.dout, d_out);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)lab_download(d_out, total * 4);
    const float *g_st = h, *g_dpt = h + tile, *g_dv = h + 2 * tile, *g_dk = h + 3 * tile, *g_dq = h + 4 * tile;
    const float *g_dq_lo = h + 5 * tile, *g_dq_lo2 = h + 6 * tile;
    int bad[7];
    fp32_keymajor_probe_products(in, n, n, g_st, g_dpt, g_dv, g_dk, g_dq, g_dq_lo, g_dq_lo2, bad);
    CHECK(bad[0] == 0, "S^T = K Q^T through warpgroup_two_ss_64x64 (warpgroup 1's K half, stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T through warpgroup_two_ss_64x64 (the dout map)");
    CHECK(bad[2] == 0, "dV: bf(P), bf(P - bf(P)) packed per k-step, two RS n64 batches chained (dO N-major)");
    CHECK(bad[3] == 0, "dK: bf(dS), bf(r1) packed per k-step, two RS n64 batches chained (Q N-major)");
    CHECK(bad[4] == 0, "dQ: three terms staged from words at pitch 72, three groups of 4 RS n64, one accumulator");
    CHECK(bad[5] == 0, "dQ's second term (its tile, its staging) alone");
    CHECK(bad[6] == 0, "dQ's third term (its tile, its staging) alone");
    free(h);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
}

/* The benchmark shapes, checked and timed (child 2). */
static const LabCase kBench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};

/* The layout probe (child 0), the small cases (child 1) or the benchmark shapes (child 2): hopper_fp32_keys_lab.cuh. */
static void run_child(int child) {
    fp32_keys_run_child(child, "hopper_bwd64_fp32", layout_probe, kBench, sizeof kBench / sizeof kBench[0]);
}

int main(int argc, char** argv) { return fp32_keys_main(argc, argv, "hopper_bwd64_fp32", run_child); }
