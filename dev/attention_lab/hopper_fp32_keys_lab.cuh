/*
 * dev/attention_lab/hopper_fp32_keys_lab.cuh - the per-case checks and timings of the two labs of fp32 mode's
 * Hopper key-major pass (hopper_bwd64_fp32, hopper_bwd128_fp32): the pass through its entry point
 * fp32's Hopper key-major pass (attention_backward_hopper_passes; both head sizes) against attention_backward_cuda's fp32
 * backward, on the default path and with force_portable, the timings, and the child processes that run them.
 * Each lab keeps what differs: its layout probe, its benchmark shapes, and the names it prints.
 *
 * Why: the two labs' checks (the lab's dQ post-pass, check_slot, pass_alone, check_case, the small cases, the
 * child processes) differ only in the head size and in how their kernel ends a hang, so they are one copy
 * here; the spin kernel, the slot comparison, the timing and the child's synchronisation check are
 * lab_harness.cuh's.
 *
 * The including lab defines kHS (the pass's head size) and kHangTail (the end of a HANG line: what its kernel
 * does when a wait runs out) before including
 * this header, after dev/attention_lab/hopper_lab.cuh; its run_child and main hand its layout probe and its
 * benchmark shapes to fp32_keys_run_child and fp32_keys_main. One lab = one translation unit: everything
 * here is file-local (static).
 */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"
#include "dev/attention_lab/lab_harness.cuh"

typedef __nv_bfloat16 bf16;

/* dQ = bf(s * accumulator) into the q slot of dqkv: attention_cuda.cu's attn_bwd_dq_kernel expression
   (file-local there), for checks (a) and (c), where the pass runs alone. */
__global__ void lab_dq_postpass(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T, int HS,
                                float scale, long long pairs) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const long long e = 2 * i;
    const int d = (int)(e % HS);
    const long long row = e / HS;
    const int tok = (int)(row % T);
    const long long bh = row / T, b = bh / NH, h = bh % NH;
    const float2 v = *reinterpret_cast<const float2*>(dq_acc + e);
    bf16* dst = dqkv + (b * T + tok) * 3LL * NH * HS + h * HS + d;
    __nv_bfloat162 pair = __floats2bfloat162_rn(v.x * scale, v.y * scale);
    *reinterpret_cast<__nv_bfloat162*>(dst) = pair;
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks and timing                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* A synchronisation check that ends the child on a hang or a CUDA error (lab_harness.cuh). */
static void sync_or_report(cudaError_t e, const char* where) { lab_child_sync_or_fail(e, where, kHangTail); }

/* The file comment's tolerance (fixed before any run); kExact (lab_harness.cuh) is bit-equality. */
static const double kMaxUlps = 4.0;

/* Compares one slot and CHECKs it within max_ulps (bit-equal when kExact) against `ref`. */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       const char* against, double max_ulps) {
    lab_check_slot(ref, got, s, slot, what, against, max_ulps, "of the poison or of a give-up");
}

/* The pass alone on the D of workspace `from_ws` (carve_workspace's slots: dq_acc [rows * HS], D [rows],
   lambda [rows]): into workspace `ws` (accumulator zeroed, D copied) and an all-NaN dqkv `into`, then the
   lab's post-pass. */
static void pass_alone(AttnShape s, const bf16* qkv, const bf16* dout, const float* stats, const void* from_ws,
                       void* ws, bf16* into, cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    float* dq_acc = (float*)ws;
    float* D = dq_acc + rows * s.HS;
    cudaCheck(cudaMemsetAsync(dq_acc, 0, rows * s.HS * sizeof(float), st));
    cudaCheck(cudaMemcpyAsync(D, (const float*)from_ws + rows * s.HS, rows * sizeof(float), cudaMemcpyDeviceToDevice,
                              st));
    cudaCheck(cudaMemsetAsync(into, 0xFF, attn_qkv_count(s) * 2, st));
    attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, ATTN_FP32, AttnOptions{}, s, qkv, nullptr, dout, stats, D, nullptr,
                                     dq_acc, into, st, 0);
    const long long pairs = (long long)rows * s.HS / 2;
    lab_dq_postpass<<<(unsigned)ceil_div(pairs, 256), 256, 0, st>>>(dq_acc, into, s.NH, s.T, s.HS,
                                                                    attn_softmax_scale(s.HS), pairs);
    cudaCheckLastError();
}

/* One case: the file comment's check 2; with time_it also 3. */
static void check_case(LabCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_FP32;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper fp32 key-major pass at HS %d", s.B,
             s.NH, s.T, s.HS, in.q_scale, in.key_offset, s.HS);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    lab_check_ws_layout(s, mode, "carve_workspace's layout, which this lab reads");
    LabBwdCase c = lab_bwd_case_random(mode, in);
    bf16* dqkv_pass;
    void* ws_pass;
    lab_alloc_poisoned(&dqkv_pass, nqkv * 2);
    lab_alloc_poisoned(&ws_pass, ws_bytes);
    /* the uploads and poison fills ran on the legacy default stream, which `st` (non-blocking) does not
       wait for */
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const AttnBwdPath path_default = attention_backward_cuda_path(mode, c.opt, s, c.qkv, c.dout);
    printf("  dispatch: default fp32 backward %s, force_portable %s\n", attn_bwd_path_name(path_default),
           attn_bwd_path_name(attention_backward_cuda_path(mode, c.portable, s, c.qkv, c.dout)));
    CHECK(path_default == ATTN_BWD_HOPPER &&
              attention_backward_cuda_path(mode, c.portable, s, c.qkv, c.dout) == ATTN_BWD_PORTABLE,
          "dispatch: the default fp32 backward at HS %d is the Hopper one (row pass + this pass), force_portable"
          " the portable one", s.HS);
    CHECK(attention_hopper_bwd_supports(mode, c.opt, s, c.qkv, c.dout) == (ATTN_HOPPER_ROW_PASS | ATTN_HOPPER_KEY_PASS),
          "attention_hopper_bwd_supports says yes (fp32, HS %d, aligned): the Hopper chain runs the row pass and this"
          " pass", s.HS);

    lab_bwd_forward(c, c.opt, st);
    lab_bwd_portable(c, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable backward");
    /* (a) the pass alone on the reference's D */
    pass_alone(s, c.qkv, c.dout, c.stats, c.ws_ref, ws_pass, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "(a) the fp32 key-major pass on the reference's D + the lab's post-pass");
    uint16_t* h_ref = (uint16_t*)lab_download(c.dqkv_ref, nqkv * 2);
    uint16_t* h_new = (uint16_t*)lab_download(dqkv_pass, nqkv * 2);
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(a) this pass on the reference's D:", "the force_portable backward",
                   kMaxUlps);
    /* (b) the default backward, on poisoned dqkv and workspace */
    lab_bwd_default(c, st);
    sync_or_report(cudaStreamSynchronize(st), "(b) the default fp32 backward");
    cudaCheck(cudaMemcpy(h_new, c.dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(b) default backward:", "the force_portable backward", kMaxUlps);
    /* (c) the pass alone on the default path's D: what the default path ran (dK, dV bit for bit) */
    pass_alone(s, c.qkv, c.dout, c.stats, c.ws_def, ws_pass, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "(c) the fp32 key-major pass on the default path's D");
    cudaCheck(cudaMemcpy(h_ref, c.dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_pass, nqkv * 2, cudaMemcpyDeviceToHost));
    check_slot(h_ref, h_new, s, 0, "(c) this pass, default path's D:", "the default backward", kMaxUlps);
    for (int slot = 1; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(c) this pass, default path's D:", "the default backward", kExact);

    if (time_it) {
        LabTimer timer = lab_timer_make(st, sync_or_report);
        LabBf16Backward bf = lab_bf16_backward_make(s, c.opt, c.qkv, st);
        float* dq_acc_pass = (float*)ws_pass;
        const float* D_pass = dq_acc_pass + rows * s.HS;
        auto run_portable = [&]() { lab_bwd_portable(c, st); };
        auto run_default = [&]() { lab_bwd_default(c, st); };
        auto run_bf16 = [&]() { lab_bf16_backward_run(bf, s, c.opt, c.qkv, c.dout, st); };
        /* alone: keeps adding into ws_pass's accumulator (its values do not matter any more) */
        auto run_pass = [&]() {
            attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, ATTN_FP32, AttnOptions{}, s, c.qkv, nullptr, c.dout, c.stats,
                                             (float*)D_pass, nullptr, dq_acc_pass, dqkv_pass, st, 0);
        };
        const float ms_pass = lab_timer_median(timer, run_pass, "timing the fp32 key-major pass alone");
        const float ms_portable = lab_timer_median(timer, run_portable, "timing the portable fp32 backward");
        const float ms_default = lab_timer_median(timer, run_default, "timing the default fp32 backward");
        const float ms_bf16 = lab_timer_median(timer, run_bf16, "timing the default bf16 backward");
        const char* path_bf16 = attn_bwd_path_name(attention_backward_cuda_path(ATTN_BF16, c.opt, s, c.qkv, c.dout));
        /* the pass's GEMM work in BF16 tensor-core products, causal: S^T, dP^T (1 each), dV, dK (2 each: the
           split), dQ (3) = 9 GEMMs of 2 B H T^2 d / 2 */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d, warm inputs, queued behind a spin): this pass alone %.4f ms (%.1f TFLOP/s"
               " counting its 9 BF16 GEMMs, causal); the rest of the default backward (prep, row pass, post-pass)"
               " %.4f ms\n", (int)kLabReps, ms_pass, 9.0 * gemm / ms_pass * 1e-9, ms_default - ms_pass);
        printf("  time: fp32 backward: portable %.4f ms, default (path %s: prep + Hopper row pass + this pass +"
               " post-pass) %.4f ms = %.2fx faster than the portable\n", ms_portable,
               attn_bwd_path_name(path_default), ms_default, ms_portable / ms_default);
        printf("  time: bf16 default backward (path %s) %.4f ms -> fp32/bf16 backward: portable %.2fx, default"
               " %.2fx\n", path_bf16, ms_bf16, ms_portable / ms_bf16, ms_default / ms_bf16);
        lab_timer_free(&timer);
        lab_bf16_backward_free(&bf);
    }
    free(h_ref); free(h_new);
    lab_bwd_case_free(&c);
    cudaCheck(cudaFree(dqkv_pass)); cudaCheck(cudaFree(ws_pass));
}

/* The checks of one child process of the lab `lab`: its layout probe (child 0), the small cases at head size
   kHS (child 1), or its benchmark shapes `bench` with their timings (child 2). */
static void fp32_keys_run_child(int child, const char* lab, void (*layout_probe)(void), const LabCase* bench,
                                size_t nbench) {
    lab_child_begin(lab, 0x9E3779B97F4A7C15ull + (unsigned long long)child);
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st; /* a stream of its own, as the trainer's (not the legacy default stream) */
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1) {
        /* T = 1, T < 64, odd T, T not a multiple of the 128-key tile (a last key tile with an empty second
           half), B*NH up to 32, sharp softmax, key offsets (where fp32 must stay accurate) */
        const LabCase cases[] = {
            {{1, 1, 1, kHS}, 1.f, 0.f},    {{1, 2, 50, kHS}, 1.f, 0.f},   {{1, 1, 77, kHS}, 1.f, 0.f},
            {{1, 2, 128, kHS}, 1.f, 0.f},  {{1, 1, 129, kHS}, 1.f, 0.f},  {{2, 3, 1001, kHS}, 1.f, 0.f},
            {{4, 8, 257, kHS}, 1.f, 0.f},
            {{1, 4, 500, kHS}, 8.f, 0.f},   /* sharp softmax (q x8) */
            {{2, 4, 1000, kHS}, 1.f, 20.f}, /* K += 20 u */
            {{1, 4, 777, kHS}, 8.f, 20.f},  /* both, odd T */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    } else {
        for (size_t i = 0; i < nbench; i++) check_case(bench[i], 1, st);
    }
    cudaCheck(cudaStreamDestroy(st));
}

/* main of the lab `lab` (no arguments). The parent never touches CUDA: each child gets a fresh context, so a
   fault or a hang report in one costs that child's results only (hopper_lab.cuh's lab_run_children). */
static int fp32_keys_main(int argc, char** argv, const char* lab, void (*run_child)(int)) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("%s: fp32's Hopper key-major pass at HS %d (dK, dV, dQ partials) vs the production"
           " backward; the probe, the checks and the benchmark shapes each in its own process\n", lab, kHS);
    static const char* kChildName[3] = {"the layout probe", "the checks", "the benchmark shapes and timings"};
    return lab_run_children(lab, 3, kChildName, run_child, 0);
}
