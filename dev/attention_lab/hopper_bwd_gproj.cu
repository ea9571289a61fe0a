/*
 * dev/attention_lab/hopper_bwd_gproj.cu - lab of the production Hopper (sm_90a) key-major pass of gproj mode
 * at head size 64 (attention/cuda/hopper/attention_hopper_bwd_gproj.cu: dK and dV, with the bf(-lambda P) correction
 * operand, wgmma + TMA, a producer warpgroup and setmaxnreg): its layout probe, then the whole gproj
 * backward by attention_backward_cuda on the Hopper path (the default on sm_90: prep, the Hopper row pass,
 * this pass) against the same call with AttnOptions.force_portable = 1 (the mma.sync kernels), element by
 * element, and both timed side by side with the bf16 backward. The kernel lives in the library only; this
 * file is host code (checks and timing) and builds for any NVCC_ARCH, but refuses to run off sm_90.
 *
 * Next experiment: overlap the next query tile's S^T/dP^T with this tile's dV/dK batch in gproj's HS-64
 * key-major pass (167 us of gproj's backward at B8 H16 T1024 d64; docs/attention_kernels.md, "Cost"); 128-query
 * steps for this pass measured 0.79-0.80x and are not the way ("Designs measured").
 *
 * Checks (in order):
 *   1. the layout probe of the one new operand form (attention_hopper_gproj_keys_layout_probe):
 *      dK = bf(dP^T) Q + bf(-lambda_q S^T) Q, both register-A batches into one accumulator with lambda per
 *      query COLUMN read from the row state (a per-key mapping or a dropped second batch shows), plus the
 *      correction alone; S^T, dP^T checked again on the way;
 *   2. per case: dispatch (the default gproj backward is "hopper", force_portable "portable"); forward
 *      (public), then attention_backward_cuda(gproj, force_portable) = reference and
 *      attention_backward_cuda(gproj, default) (dqkv and workspaces poisoned with NaN): dQ, dK, dV within 4
 *      BF16 ulps (of max(|a|, |b|, row RMS)) of the reference, written everywhere and finite;
 *      ||sum_j dK_j|| / ||dK|| per head printed for both (gproj restores the zero key sum);
 *   3. this pass alone (attention_backward_hopper_passes) on the default path's D and lambda, over a copy
 *      of its dqkv with the k and v slots poisoned: all three slots bit-equal to the default backward's (no
 *      atomics, so the pass is deterministic: the default path ran exactly this kernel, it writes every k and
 *      v element, and it leaves dQ alone);
 *   4. at the benchmark shapes B8 H16 T1024 and B4 H16 T2048: the median of 21 timings of the portable and
 *      the default gproj backward, this pass alone, and the default bf16 backward (the gproj/bf16 ratio).
 * Cases: T 1, 77, 128, 129, 1000, B*NH up to 128, q x8 (sharp), key offset 20 and 128 along a unit vector
 * per head (where the correction matters), the benchmark shapes.
 *
 * Safety: every mbarrier wait of the kernel is bounded (~10 s); a consumer that runs out gives up and writes
 * NaN over its dK/dV rows, the producer warp traps. This lab installs the host-mapped hang record
 * (lab_watch_hangs) and reads it after every synchronisation, so a hang is a named FAIL. Run it under
 * `timeout` anyway.
 *
 * Usage: hopper_bwd_gproj   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed".
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
static const int kTile = ATTN_HOPPER_BWD_PROBE_TILE;
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

static void sync_or_report(cudaError_t e, const char* where) { lab_sync_or_report(e, "hopper_bwd_gproj", where); }

static size_t rows_of(AttnShape s) { return (size_t)s.B * s.NH * s.T; }
/* Tolerance, fixed before any run: only FP32 sum orders differ (wgmma k order, dK's two batches summed
   apart, the row pass's dQ), and a changed FP32 S or dP can flip one BF16 rounding of P, dS or -lambda P;
   as hopper_bwd. */
static const double kMaxUlps = 4.0;

static const char* kSlotName[3] = {"dQ", "dK", "dV"};

/* Compares one slot and CHECKs it within kMaxUlps (or bit-equal when exact) against `ref`. */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* against, int exact) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s vs %s: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n",
           kSlotName[slot], against, d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: %s has every element finite (%zu NaN)", kSlotName[slot], against, d.nan_ref);
    CHECK(d.nan_new == 0, "%s: written everywhere, finite (%zu NaN left of the poison)", kSlotName[slot], d.nan_new);
    if (exact)
        CHECK(d.unequal == 0, "%s bit-equal to %s (%zu differ)", kSlotName[slot], against, d.unequal);
    else
        CHECK(d.max_ulps <= kMaxUlps, "%s within %.0f BF16 ulps of %s (max %.2f)", kSlotName[slot], kMaxUlps, against,
              d.max_ulps);
}

/* NaN (0xFF bytes) over the k and v slots of dqkv [B, T, 3, NH, HS]: per token, 2 NH HS elements after the
   q slot's NH HS. */
static void poison_kv(bf16* dqkv, AttnShape s) {
    const size_t pitch = 3ull * s.NH * s.HS * sizeof(bf16), width = 2ull * s.NH * s.HS * sizeof(bf16);
    cudaCheck(cudaMemset2D(dqkv + (size_t)s.NH * s.HS, pitch, 0xFF, width, (size_t)s.B * s.T));
}

/* One case: see the file comment, checks 2 to 4 (4 with time_it). */
static void check_case(LabCase in, int time_it) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_GPROJ;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper gproj backward vs the portable one",
             s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s), rows = rows_of(s);
    lab_check_ws_layout(s, mode, "carve_workspace's layout, which check 3 reads");

    LabBwdCase c = lab_bwd_case_random(mode, in);
    bf16* dqkv_pass;
    cudaCheck(cudaMalloc(&dqkv_pass, nqkv * 2));
    CHECK(lab_bwd_dispatch_ok(c),
          "dispatch: the default gproj backward is the Hopper one (row pass + this pass), force_portable the"
          " portable one");
    lab_bwd_run_both(c, c.opt, 0);
    sync_or_report(cudaDeviceSynchronize(), "the production backwards");
    /* this pass alone over the default path's dqkv with k and v poisoned, from the default path's D, lambda */
    const float* D_def = (const float*)c.ws_def + rows * s.HS;
    const float* lambda_def = D_def + rows;
    cudaCheck(cudaMemcpy(dqkv_pass, c.dqkv_def, nqkv * 2, cudaMemcpyDeviceToDevice));
    poison_kv(dqkv_pass, s);
    attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, ATTN_GPROJ, AttnOptions{}, s, c.qkv, nullptr, c.dout, c.stats,
                                     (float*)D_def, (float*)lambda_def, nullptr, dqkv_pass, 0, 0); /* read only */
    sync_or_report(cudaDeviceSynchronize(), "the gproj key-major pass alone");

    uint16_t* h_ref = (uint16_t*)lab_download(c.dqkv_ref, nqkv * 2);
    uint16_t* h_def = (uint16_t*)lab_download(c.dqkv_def, nqkv * 2);
    uint16_t* h_pass = (uint16_t*)lab_download(dqkv_pass, nqkv * 2);
    printf(" the default (Hopper) gproj backward:\n");
    for (int slot = 0; slot < 3; slot++) check_slot(h_ref, h_def, s, slot, "the force_portable backward", 0);
    const double ks_ref = lab_worst_key_sum(h_ref, s), ks_def = lab_worst_key_sum(h_def, s);
    printf("  max over heads ||sum_j dK_j|| / ||dK||: force_portable %.3g, Hopper %.3g\n", ks_ref, ks_def);
    printf(" the pass alone on the default path's D and lambda (k, v poisoned first):\n");
    for (int slot = 0; slot < 3; slot++) check_slot(h_def, h_pass, s, slot, "the default backward", 1);

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        /* the bf16 backward of the ratio needs bf16's own forward (stats {LSE, 0}, its O for D) */
        bf16* out_b;
        float* stats_b;
        cudaCheck(cudaMalloc(&out_b, nout * 2));
        cudaCheck(cudaMalloc(&stats_b, nstats * 4));
        attention_forward_cuda(ATTN_BF16, c.opt, s, c.qkv, out_b, stats_b, NULL, 0);
        /* each candidate as a closure over this case's buffers, timed alone */
        auto run_portable = [&]() { lab_bwd_portable(c, 0); };
        auto run_default = [&]() { lab_bwd_default(c, 0); };
        auto run_bf16 = [&]() {
            attention_backward_cuda(ATTN_BF16, c.opt, s, c.qkv, out_b, stats_b, c.dout, dqkv_pass, c.ws_ref, 0);
        };
        auto run_pass = [&]() {
            attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, ATTN_GPROJ, AttnOptions{}, s, c.qkv, nullptr, c.dout, c.stats,
                                             (float*)D_def, (float*)lambda_def, nullptr, c.dqkv_def, 0, 0);
        };
        auto time_of = [&](auto fn, const char* what) {
            float t[kReps];
            for (int i = 0; i < kWarmup; i++) fn();
            sync_or_report(cudaDeviceSynchronize(), what);
            for (int i = 0; i < kReps; i++) {
                cudaCheck(cudaEventRecord(e0));
                fn();
                cudaCheck(cudaEventRecord(e1));
                sync_or_report(cudaEventSynchronize(e1), what);
                cudaCheck(cudaEventElapsedTime(&t[i], e0, e1));
            }
            return median_ms(t, kReps);
        };
        const float ms_portable = time_of(run_portable, "timing the portable gproj backward");
        const float ms_default = time_of(run_default, "timing the default gproj backward");
        const float ms_pass = time_of(run_pass, "timing the gproj key-major pass");
        const float ms_bf16 = time_of(run_bf16, "timing the default bf16 backward");
        /* key-major pass: 4 GEMMs of 2 B H T^2 d / 2 (causal) each, + the correction GEMM */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d): portable gproj backward %.4f ms; default (Hopper: prep, row pass, this pass)"
               " gproj backward %.4f ms (%.2fx the portable); bf16 default backward %.4f ms -> gproj/bf16 backward"
               " %.2fx\n", (int)kReps, ms_portable, ms_default, ms_portable / ms_default, ms_bf16,
               ms_default / ms_bf16);
        printf("  time: the gproj key-major pass alone %.4f ms = %.1f TFLOP/s (5 GEMMs, causal)\n", ms_pass,
               5.0 * gemm / ms_pass * 1e-9);
        cudaCheck(cudaEventDestroy(e0));
        cudaCheck(cudaEventDestroy(e1));
        cudaCheck(cudaFree(out_b));
        cudaCheck(cudaFree(stats_b));
    }
    free(h_ref); free(h_def); free(h_pass);
    lab_bwd_case_free(&c);
    cudaCheck(cudaFree(dqkv_pass));
}

/* The layout probe on B1 NH3 T50 (head 1; T < 64: zero fill), lambda_q spread over [-2, 2] per query (so a
   per-key mapping, a wrong query pairing or a dropped batch cannot pass), checked against double loops on
   the kernel's own S^T and dP^T, rounded as the kernel rounds them. */
static void layout_probe(void) {
    test_section("layout probe HS64: dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two RS batches, one accumulator,"
                 " lambda per query column from the row state)");
    ProbeInputs in = probe_inputs_make();
    const size_t tile = (size_t)kTile * kTile;
    float h_lambda[kTile];
    for (int q = 0; q < kTile; q++) h_lambda[q] = (float)(4.0 * attn_rng_uniform(&g_rng) - 2.0);
    float *d_lambda, *d_out;
    lab_upload(&d_lambda, h_lambda, sizeof h_lambda);
    lab_alloc_poisoned(&d_out, 4 * tile * 4);
    attention_hopper_gproj_keys_layout_probe(in.s, in.head, in.qkv, in.dout, d_lambda, d_out);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)lab_download(d_out, 4 * tile * 4);
    const float *g_st = h, *g_dpt = h + tile, *g_dk = h + 2 * tile, *g_corr = h + 3 * tile;
    double* ref = (double*)mallocCheck(tile * sizeof(double));
    double* mag = (double*)mallocCheck(tile * sizeof(double));
    int bad[4];
    keymajor_probe_scores(in, kTile, kTile, g_st, g_dpt, bad); /* bad[0], bad[1] */
    /* correction alone: sum_q bf(-lambda_q * S^T[key][q]) Q[q][n], the product in FP32 as the kernel does */
    probe_product(ref, mag, kTile, [&](int i, int n, int q) {
        return bf16_round(-h_lambda[q] * g_st[i * kTile + q]) * probe_qkv(in, q, kSlotQ, n);
    });
    bad[3] = probe_compare("bf(-lambda_q S^T) Q", g_corr, ref, mag);
    /* both batches into one accumulator: sum_q (bf(dP^T) Q + bf(-lambda_q S^T) Q), the two terms of a q together */
    probe_product(ref, mag, 2 * kTile, [&](int i, int n, int k) {
        const int q = k / 2;
        const double a = (k & 1) ? bf16_round(-h_lambda[q] * g_st[i * kTile + q]) : bf16_round(g_dpt[i * kTile + q]);
        return a * probe_qkv(in, q, kSlotQ, n);
    });
    bad[2] = probe_compare("bf(dP^T) Q + bf(-lambda_q S^T) Q", g_dk, ref, mag);
    CHECK(bad[0] == 0, "S^T = K Q^T (attention_hopper_bwd.cu's form, re-checked through this pass's probe)");
    CHECK(bad[1] == 0, "dP^T = V dO^T (attention_hopper_bwd.cu's form, re-checked through this pass's probe)");
    CHECK(bad[3] == 0, "bf(-lambda_q P) as register A: lambda per query column from the row state's .w");
    CHECK(bad[2] == 0, "two RS batches (bf(dS), then the correction) chained into one dK accumulator");
    free(h); free(ref); free(mag);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_lambda)); cudaCheck(cudaFree(d_out));
}

int main(int argc, char** argv) {
    attn_rng_init(&g_rng, 0x243F6A8885A308D3ull);
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in main()", argv[0]);
    const cudaDeviceProp prop = require_sm90("hopper_bwd_gproj");
    lab_watch_hangs();
    printf("hopper_bwd_gproj on %s: the production Hopper gproj key-major pass (attention_hopper_bwd_gproj.cu)"
           " in the gproj backward vs the portable one\n", prop.name);
    layout_probe(); /* the new operand form alone first: if it fails, everything below fails too */
    const LabCase cases[] = {
        {{1, 1, 1, 64}, 1.f, 0.f},    {{1, 1, 77, 64}, 1.f, 0.f},   {{1, 2, 128, 64}, 1.f, 0.f},
        {{1, 1, 129, 64}, 1.f, 0.f},  {{2, 3, 1000, 64}, 1.f, 0.f}, {{4, 32, 257, 64}, 1.f, 0.f},
        {{1, 4, 500, 64}, 8.f, 0.f},   /* sharp softmax */
        {{2, 4, 1000, 64}, 1.f, 20.f}, /* key offset 20 along a unit vector: the correction matters */
        {{1, 4, 777, 64}, 1.f, 128.f}, /* rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0);
    const LabCase bench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1);
    return test_summary();
}
