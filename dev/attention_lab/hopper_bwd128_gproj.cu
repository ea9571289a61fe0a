/*
 * dev/attention_lab/hopper_bwd128_gproj.cu - lab of the production Hopper (sm_90a) key-major pass of gproj mode
 * at head size 128 (attention/cuda/hopper/attention_hopper_bwd128_gproj.cu: dK and dV from the D and lambda that the prep
 * kernel and the row pass leave in the workspace; wgmma + TMA, a producer warpgroup and setmaxnreg 24/240): its
 * layout probe, then the gproj backward by attention_backward_cuda on the default path (on sm_90: prep, the
 * Hopper row pass, this pass) and the pass alone, against the same call with AttnOptions.force_portable = 1 (the
 * mma.sync kernels), element by element, and the timings. The kernel lives in the library only; this file is
 * host code plus a spin kernel for the timing, builds for any NVCC_ARCH, and refuses to run off sm_90.
 *
 * Next experiment: 3 stages or overlap of the next tile's S^T/dP^T with this tile's dV/dK batch
 * (docs/attention_kernels.md, "Not done"), timed here as the pass alone and inside the gproj backward.
 *
 * Checks (in order; the probe and the cases each in a child process of their own):
 *   1. the layout probe (attention_hopper_gproj_keys128_layout_probe, B1 NH3 T100, head 1, keys 100..127
 *      zero-filled, lambda_q spread over [-2, 2]): S^T, dP^T, dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two
 *      register-A batches chained into one accumulator, lambda per query COLUMN), the correction alone, and
 *      dV = bf(S^T) dO, against double loops on the kernel's own S^T and dP^T rounded as the kernel rounds them;
 *   2. per case: dispatch (default "hopper", force_portable "portable"); forward, then
 *      attention_backward_cuda(gproj, force_portable) = reference, and
 *      (a) this pass alone (attention_backward_hopper_passes) on the reference's D and lambda over a copy
 *          of its dqkv with the k and v slots poisoned: dK, dV within 4 BF16 ulps (of max(|a|, |b|, row RMS))
 *          of the portable key-major kernel on the same lambda, dQ bit-equal (untouched) - the kernel's own
 *          check, whatever row pass the default path has;
 *      (b) attention_backward_cuda(gproj, default) on poisoned dqkv and workspace: dK, dV within 4 ulps, dQ
 *          within 8 (the Hopper row pass's own lab tolerance, dev/attention_lab/hopper_rows128.cu), every
 *          element written and finite;
 *      (c) this pass alone on the default path's D and lambda over a copy of its dqkv with k and v poisoned:
 *          all three slots bit-equal to the default backward's (no atomics: the pass is deterministic, so the
 *          default path ran exactly this kernel, it writes every k and v element, and it leaves dQ alone);
 *      ||sum_j dK_j|| / ||dK|| per head printed for each (gproj restores the zero key sum);
 *   3. at the benchmark shapes B8 H8 T1024 and B2 H16 T4096: the median of 21 timings (each candidate's runs
 *      queued behind a spin kernel, so host work never shows as GPU idle time; warm inputs) of the portable
 *      and the default gproj backward, this pass alone, and the default bf16 backward (the gproj/bf16 ratio).
 * Cases: T 1, 50, 77, 128, 129, 1001, B*NH up to 64, q x8 (sharp), key offset 20 along a unit vector per
 * head (where the correction matters), the benchmark shapes.
 *
 * Safety: every mbarrier wait of the kernel is bounded (~2 s) and gives up: the CTA records the barrier and
 * writes NaN over its dK and dV rows. This lab installs the host-mapped hang record (lab_watch_hangs) and reads
 * it after every synchronisation, so a hang is a named FAIL; a child that dies without reporting counts as one
 * failure. Run it under `timeout` anyway.
 *
 * Usage: hopper_bwd128_gproj   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
 * summed over the processes.
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
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/support/attn_cases.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"
#include "dev/attention_lab/lab_harness.cuh"

typedef __nv_bfloat16 bf16;
static const int kHS = 128; /* the pass's head size here */
static const int kBlockK = ATTN_HOPPER_GPROJ128_PROBE_KEYS;    /* the probe's keys (one CTA's) */
static const int kBlockQ = ATTN_HOPPER_GPROJ128_PROBE_QUERIES; /* the probe's queries (one tile) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

/* ------------------------------------------------------------------------------------------------ */
/* host: process plumbing, checks and timing                                                         */
/* ------------------------------------------------------------------------------------------------ */

/* A synchronisation check that ends the child on a hang or a CUDA error (lab_harness.cuh). */
static void sync_or_report(cudaError_t e, const char* where) {
    lab_child_sync_or_fail(e, where, "; the CTA gave up and wrote NaN over its dK and dV rows)");
}

/* Tolerances, fixed before any run. dK, dV: only FP32 sum orders differ (wgmma k order, dK's two batches
   summed apart, 64- vs 32-query tiles), and a changed FP32 S or dP can flip one BF16 rounding of P, dS or
   -lambda P; the Hopper labs' value. dQ on the default path: the Hopper row pass's (its lab's value). */
static const double kMaxUlps = 4.0;
static const double kMaxDqUlpsRowPass = 8.0;

/* Compares one slot and CHECKs it within max_ulps (bit-equal when kExact, lab_harness.cuh) against `ref`. */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       const char* against, double max_ulps) {
    lab_check_slot(ref, got, s, slot, what, against, max_ulps, "of the poison");
}

/* NaN (0xFF bytes) over the k and v slots of dqkv [B, T, 3, NH, HS] on `st`: per token, 2 NH HS elements after
   the q slot's NH HS. */
static void poison_kv(bf16* dqkv, AttnShape s, cudaStream_t st) {
    const size_t pitch = 3ull * s.NH * s.HS * sizeof(bf16), width = 2ull * s.NH * s.HS * sizeof(bf16);
    cudaCheck(cudaMemset2DAsync(dqkv + (size_t)s.NH * s.HS, pitch, 0xFF, width, (size_t)s.B * s.T, st));
}

/* The pass alone over a copy of `from` (dqkv) with its k and v slots poisoned, from the D and lambda of the
   workspace `ws` (carve_workspace's slots: dq_acc [rows * HS], D [rows], lambda [rows]), into `into`. */
static void pass_alone(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, const void* ws,
                       const bf16* from, bf16* into, cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const float* D = (const float*)ws + rows * s.HS;
    const float* lambda = D + rows;
    cudaCheck(cudaMemcpyAsync(into, from, attn_qkv_count(s) * 2, cudaMemcpyDeviceToDevice, st));
    poison_kv(into, s, st);
    attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, ATTN_GPROJ, AttnOptions{}, s, qkv, nullptr, dout, stats, (float*)D,
                                     (float*)lambda, nullptr, into, st, 0); /* read only by this pass */
}

/* One case: the file comment's check 2; with time_it also 3. */
static void check_case(LabCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_GPROJ;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper gproj key-major pass at HS 128", s.B,
             s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    lab_check_ws_layout(s, mode, "carve_workspace's layout, which this lab reads");
    LabBwdCase c = lab_bwd_case_random(mode, in);
    bf16* dqkv_pass;
    cudaCheck(cudaMalloc(&dqkv_pass, nqkv * 2));
    /* the uploads and poison fills ran on the legacy default stream, which `st` (non-blocking) does not
       wait for */
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const AttnBwdPath path_default = attention_backward_cuda_path(mode, c.opt, s, c.qkv, c.dout);
    printf("  dispatch: default gproj backward %s, force_portable %s\n", attn_bwd_path_name(path_default),
           attn_bwd_path_name(attention_backward_cuda_path(mode, c.portable, s, c.qkv, c.dout)));
    CHECK(path_default == ATTN_BWD_HOPPER &&
              attention_backward_cuda_path(mode, c.portable, s, c.qkv, c.dout) == ATTN_BWD_PORTABLE,
          "dispatch: the default gproj backward at HS 128 is the Hopper one (row pass + this pass), force_portable"
          " the portable one");

    lab_bwd_forward(c, c.opt, st);
    lab_bwd_portable(c, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable backward");
    /* (a) the pass alone on the reference's D and lambda */
    pass_alone(s, c.qkv, c.dout, c.stats, c.ws_ref, c.dqkv_ref, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "the gproj key-major pass on the reference's D and lambda");
    uint16_t* h_ref = (uint16_t*)lab_download(c.dqkv_ref, nqkv * 2);
    uint16_t* h_new = (uint16_t*)lab_download(dqkv_pass, nqkv * 2);
    check_slot(h_ref, h_new, s, 0, "(a) this pass, same lambda:", "the force_portable backward (untouched)", kExact);
    for (int slot = 1; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(a) this pass, same lambda:", "the force_portable backward", kMaxUlps);
    printf("  max over heads ||sum_j dK_j|| / ||dK||: force_portable %.3g, this pass %.3g\n",
           lab_worst_key_sum(h_ref, s), lab_worst_key_sum(h_new, s));
    /* (b) the default backward, on poisoned dqkv and workspace */
    lab_bwd_default(c, st);
    sync_or_report(cudaStreamSynchronize(st), "the default gproj backward");
    cudaCheck(cudaMemcpy(h_new, c.dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    check_slot(h_ref, h_new, s, 0, "(b) default backward:", "the force_portable backward", kMaxDqUlpsRowPass);
    for (int slot = 1; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(b) default backward:", "the force_portable backward", kMaxUlps);
    printf("  max over heads ||sum_j dK_j|| / ||dK||: default backward %.3g\n", lab_worst_key_sum(h_new, s));
    /* (c) the pass alone on the default path's D and lambda: what the default path ran, bit for bit */
    pass_alone(s, c.qkv, c.dout, c.stats, c.ws_def, c.dqkv_def, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "the gproj key-major pass on the default path's D and lambda");
    cudaCheck(cudaMemcpy(h_ref, c.dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_pass, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(c) this pass, default path's lambda:", "the default backward", kExact);

    if (time_it) {
        LabTimer timer = lab_timer_make(st, sync_or_report);
        LabBf16Backward bf = lab_bf16_backward_make(s, c.opt, c.qkv, st);
        const float* D_def = (const float*)c.ws_def + rows * s.HS;
        const float* lambda_def = D_def + rows;
        auto run_portable = [&]() { lab_bwd_portable(c, st); };
        auto run_default = [&]() { lab_bwd_default(c, st); };
        auto run_bf16 = [&]() { lab_bf16_backward_run(bf, s, c.opt, c.qkv, c.dout, st); };
        auto run_pass = [&]() {
            attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, ATTN_GPROJ, AttnOptions{}, s, c.qkv, nullptr, c.dout, c.stats,
                                             (float*)D_def, (float*)lambda_def, nullptr, dqkv_pass, st, 0);
        };
        const float ms_portable = lab_timer_median(timer, run_portable, "timing the portable gproj backward");
        const float ms_default = lab_timer_median(timer, run_default, "timing the default gproj backward");
        const float ms_pass = lab_timer_median(timer, run_pass, "timing the gproj key-major pass alone");
        const float ms_bf16 = lab_timer_median(timer, run_bf16, "timing the default bf16 backward");
        const char* path_bf16 = attn_bwd_path_name(attention_backward_cuda_path(ATTN_BF16, c.opt, s, c.qkv, c.dout));
        /* key-major pass: 4 GEMMs of 2 B H T^2 d / 2 (causal) each, + the correction GEMM */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d, warm inputs, queued behind a spin): portable gproj backward %.4f ms; default"
               " gproj backward (path %s: prep, row pass, this pass) %.4f ms (%.2fx the portable); bf16 default"
               " backward (path %s) %.4f ms -> gproj/bf16 backward: portable %.2fx, default %.2fx\n",
               (int)kLabReps, ms_portable, attn_bwd_path_name(path_default), ms_default, ms_portable / ms_default,
               path_bf16, ms_bf16, ms_portable / ms_bf16, ms_default / ms_bf16);
        printf("  time: this key-major pass alone %.4f ms = %.1f TFLOP/s (5 GEMMs, causal); the rest of the default"
               " backward (prep + row pass) %.4f ms\n",
               ms_pass, 5.0 * gemm / ms_pass * 1e-9, ms_default - ms_pass);
        lab_timer_free(&timer);
        lab_bf16_backward_free(&bf);
    }
    free(h_ref); free(h_new);
    lab_bwd_case_free(&c);
    cudaCheck(cudaFree(dqkv_pass));
}

/* The layout probe on B1 NH3 T100 HS128 (head 1; keys 100..127 zero-filled), lambda_q spread over [-2, 2]
   per query (a per-key mapping, a wrong query pairing or a dropped batch cannot pass), checked against
   double loops on the kernel's own S^T and dP^T, rounded as the kernel rounds them. */
static void layout_probe(void) {
    test_section("layout probe HS128 gproj: dK = bf(dP^T) Q + bf(-lambda_q S^T) Q (two RS n128 batches, one"
                 " accumulator, lambda per query column), the correction alone, dV, S^T, dP^T");
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, 100, kHS}, 1);
    float h_lambda[kBlockQ];
    for (int q = 0; q < kBlockQ; q++) h_lambda[q] = (float)(4.0 * attn_rng_uniform(&g_rng) - 2.0);
    const int nk = kBlockK, nq = kBlockQ;
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS;
    const size_t total = 2 * n_st + 3 * n_kv;
    float *d_lambda, *d_out;
    lab_upload(&d_lambda, h_lambda, sizeof h_lambda);
    lab_alloc_poisoned(&d_out, total * 4);
    attention_hopper_gproj_keys128_layout_probe(in.s, in.head, in.qkv, in.dout, d_lambda, d_out);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)lab_download(d_out, total * 4);
    const float* g_st = h;
    const float* g_dpt = g_st + n_st;
    const float* g_dk = g_dpt + n_st;
    const float* g_corr = g_dk + n_kv;
    const float* g_dv = g_corr + n_kv;
    double* ref = (double*)mallocCheck(n_kv * sizeof(double));
    double* mag = (double*)mallocCheck(n_kv * sizeof(double));
    int bad[5];
    keymajor_probe_scores(in, nk, nq, g_st, g_dpt, bad); /* bad[0], bad[1] */
    /* the correction alone: sum_q bf(-lambda_q S^T[key][q]) Q[q][n], the product in FP32 as the kernel does */
    auto corr_term = [&](int i, int n, int q) {
        const float prod = -h_lambda[q] * g_st[i * nq + q];
        return (double)bf16_round(prod) * probe_qkv(in, q, kSlotQ, n);
    };
    lab_probe_product(ref, mag, nk, kHS, nq, corr_term);
    bad[2] = lab_probe_compare("bf(-lambda_q S^T) Q", g_corr, ref, mag, nk, kHS);
    /* both batches into one accumulator: per q the two terms (their |.| both counted in mag) */
    for (int i = 0; i < nk; i++)
        for (int n = 0; n < kHS; n++) {
            double r = 0, m = 0;
            for (int q = 0; q < nq; q++) {
                const double p1 = (double)bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kSlotQ, n);
                const double p2 = corr_term(i, n, q);
                r += p1 + p2;
                m += fabs(p1) + fabs(p2);
            }
            ref[i * kHS + n] = r;
            mag[i * kHS + n] = m;
        }
    bad[3] = lab_probe_compare("bf(dP^T) Q + bf(-lambda_q S^T) Q", g_dk, ref, mag, nk, kHS);
    /* dV[key][n] = sum_q bf(S^T[key][q]) dO[q][n] */
    lab_probe_product(ref, mag, nk, kHS, nq,
                      [&](int i, int n, int q) { return (double)bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n); });
    bad[4] = lab_probe_compare("dV = bf(S^T) dO", g_dv, ref, mag, nk, kHS);
    CHECK(bad[0] == 0, "S^T = K Q^T: the SS form through the pass's probe (both warpgroups, stage 1)");
    CHECK(bad[1] == 0, "dP^T = V dO^T: the SS form with the dout map, through the pass's probe");
    CHECK(bad[2] == 0, "bf(-lambda_q P) as register A of m64n128k16 RS: lambda per query column from the"
                       " stage's lambda row (float2 pairs), Q N-major with LBO 8 KB");
    CHECK(bad[3] == 0, "two RS n128 batches (bf(dS), then the correction) chained into one dK accumulator");
    CHECK(bad[4] == 0, "dV = bf(S^T) dO: the N-major RS form (LBO 8 KB), bf(P) packed per k-step");
    free(h); free(ref); free(mag);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_lambda)); cudaCheck(cudaFree(d_out));
}

/* The checks of one child process: the layout probe (child 0) or every case with the timings (child 1). */
static void run_child(int child) {
    lab_child_begin("hopper_bwd128_gproj", 0x452821E638D01377ull);
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st; /* a stream of its own, as the trainer's (not the legacy default stream) */
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* T = 1, T < 64, odd T, T not a multiple of the 128-key tile (a last key tile with an empty second
       half), B*NH up to 32 (64 at the first benchmark shape), sharp softmax, key offsets (where the
       correction matters) */
    const LabCase cases[] = {
        {{1, 1, 1, 128}, 1.f, 0.f},    {{1, 2, 50, 128}, 1.f, 0.f},   {{1, 1, 77, 128}, 1.f, 0.f},
        {{1, 2, 128, 128}, 1.f, 0.f},  {{1, 1, 129, 128}, 1.f, 0.f},  {{2, 3, 1001, 128}, 1.f, 0.f},
        {{4, 8, 257, 128}, 1.f, 0.f},
        {{1, 4, 500, 128}, 8.f, 0.f},   /* sharp softmax (q x8) */
        {{2, 4, 1000, 128}, 1.f, 20.f}, /* K += 20 u: the correction matters */
        {{1, 4, 777, 128}, 8.f, 20.f},  /* both, odd T */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    /* checks and timing at the benchmark shapes */
    const LabCase bench[] = {{{8, 8, 1024, 128}, 1.f, 0.f}, {{2, 16, 4096, 128}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    cudaCheck(cudaStreamDestroy(st));
}

/* The parent never touches CUDA: each child (the probe, then the checks) gets a fresh context, so a fault or
   a hang report in one costs that child's results only. A child reports its pass/fail counts through a
   pipe; one that dies without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd128_gproj: gproj's Hopper key-major pass at HS 128 (dK, dV) vs the production backward"
           ", the probe and the checks each in its own process\n");
    static const char* kChildName[2] = {"the layout probe", "the checks and timings"};
    return lab_run_children("hopper_bwd128_gproj", 2, kChildName, run_child, 0);
}
