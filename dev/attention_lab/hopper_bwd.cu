/*
 * dev/attention_lab/hopper_bwd.cu - lab of the production Hopper (sm_90a) key-major attention backward
 * (attention/attention_hopper_bwd.cu: dK, dV and the dQ reduce-adds on wgmma + TMA, bf16 and repair modes, head
 * size 64): its layout probe, then the whole backward by attention_backward_cuda on the Hopper path (the
 * default on sm_90) against the same call with AttnOptions.force_portable = 1 (the mma.sync kernels),
 * element by element, and both timed side by side. The kernel lives in the library only; this file is host
 * code (checks and timing) and builds for any NVCC_ARCH, but refuses to run off sm_90.
 *
 * History: written here as a prototype (2026-11-29), first H200 run dev/results/device_s4/call2 (layout
 * probe exact, 104/0, 1.08x at B8 H16 T1024, 1.11x at B4 H16 T2048), then moved into attention/. Session 6:
 * the production kernel became the 128-query-step one of dev/attention_lab/hopper_bwd64_wide.cu (its lab and
 * harness, with more cases and timings); this file follows it (probe shapes) and keeps its own checks.
 *
 * The probe (attention_hopper_bwd_layout_probe, B1 NH3 T100, head 1) runs the kernel's operand forms on one
 * step of one consumer warpgroup (keys 64..127 at warpgroup 1's offsets, queries 0..127 in stage 1, both
 * partly zero-filled past T) against host loops first: S^T, dP^T (m64n128k16 SS over two 64-row boxes), dV, dK
 * (register-A RS over 8 k-steps, dO/Q read N-major across the box boundary), dQ (dS staged [query][key] and
 * read back as A fragments, two 64-query M blocks, K N-major at the warpgroup's 8 KB offset), and that dQ
 * through the FP32 swizzled tile and the TMA reduce-adds. So a failure names the wrong assumption before the
 * attention checks fail.
 *
 * Safety: every mbarrier wait of the kernel is bounded (~2 s) and gives up: the CTA writes NaN over its dK/dV
 * rows and the barrier is named in the host-mapped record (attention_hopper_bwd_watch_hangs) that this lab
 * reads after every synchronisation. Run it under `timeout` anyway.
 *
 * Usage: hopper_bwd   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed".
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
#include "attention/attn_cases.h"
#include "attention/attention_hopper_bwd.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

typedef __nv_bfloat16 bf16;
static_assert(ATTN_HOPPER_BWD_HS == 64, "the shapes below and the probe inputs are HS 64");

/* cudaDeviceSynchronize (or an event wait) that, on failure or after a give-up, names the barrier that hung (if
   one did) and dies. The record: hopper_lab.cuh's lab_watch_hangs (host-mapped). A give-up is no CUDA error (the
   CTA ends with NaN dK/dV rows), so the record is read after every synchronisation. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return;
    if (hung)
        fprintf(stderr, "hopper_bwd: HANG: mbarrier %s, index %d, parity %d, block (%d, %d), thread %d\n",
                attn_hopper_hang_site_name(r->site), r->index, r->parity, r->block_x, r->block_y, r->thread);
    die("hopper_bwd: %s after %s\n  hint: a HANG line above names the mbarrier that never completed; otherwise"
        " run under compute-sanitizer", e != cudaSuccess ? cudaGetErrorString(e) : "a bounded wait gave up", where);
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the production backward, timing                                              */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerance (set before any run): the two kernels sum S, dP (tensor-core k order), dK/dV (query order
   within a tile) and dQ (64-key partials here, 128 there) differently; a changed FP32 S can flip the
   BF16 rounding of P or dS of one element. Expected worst ~2-3 ulps of the row scale. */
static const double kMaxUlps = 4.0;

/* One shape and mode: forward by attention_forward_cuda, then attention_backward_cuda on both paths on the
   same inputs (dqkv and both workspaces poisoned with NaN first), compared slot by slot. With time_it,
   both backwards timed (each the whole backward: prep + key-major pass + dQ post-pass). */
static void check_shape(AttnMode mode, AttnShape s, float q_scale, int time_it) {
    char title[200];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d%s: Hopper backward vs the portable one",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, q_scale != 1.f ? " (q x8)" : "");
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    uint16_t* h_qkv = random_qkv_bits(s, q_scale);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *out, *dout, *dqkv_ref, *dqkv_new;
    float* stats;
    void *ws_ref, *ws_new;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    lab_upload(&qkv, h_qkv, nqkv * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    lab_upload(&dout, h_dout, nout * 2);
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_new, nqkv * 2);
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_new, ws_bytes);
    AttnOptions opt = {0}, portable = {0};
    portable.force_portable = 1;
    CHECK(attention_backward_cuda_path(mode, opt, s, qkv, dout) == ATTN_BWD_HOPPER &&
              attention_backward_cuda_path(mode, portable, s, qkv, dout) == ATTN_BWD_PORTABLE,
          "dispatch: the default backward is the Hopper one, force_portable the portable one");
    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, 0);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_new, ws_new, 0);
    sync_or_report(cudaDeviceSynchronize(), title);

    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_new, nqkv * 2, cudaMemcpyDeviceToHost));
    static const char* kSlotName[3] = {"dQ", "dK", "dV"};
    for (int slot = 0; slot < 3; slot++) {
        const SlotDiff d = compare_slot(h_ref, h_new, s, slot);
        printf("  %s: max |diff| %.3g, max %.2f BF16 ulps (at max(|a|, |b|, row RMS)), %zu of %zu over 1 ulp\n",
               kSlotName[slot], d.max_abs, d.max_ulps, d.over_1ulp, d.count);
        CHECK(d.nan_ref == 0, "%s: portable backward wrote every element, finite (%zu NaN)", kSlotName[slot], d.nan_ref);
        CHECK(d.nan_new == 0, "%s: Hopper backward wrote every element, finite (%zu NaN left)", kSlotName[slot],
              d.nan_new);
        CHECK(d.max_ulps <= kMaxUlps, "%s within %.0f BF16 ulps of the portable backward (max %.2f)", kSlotName[slot], kMaxUlps,
              d.max_ulps);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        float t_ref[kReps], t_new[kReps];
        for (int i = 0; i < kWarmup; i++) {
            attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
            attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_new, ws_new, 0);
        }
        sync_or_report(cudaDeviceSynchronize(), "the warm-up launches");
        for (int i = 0; i < kReps; i++) {
            cudaCheck(cudaEventRecord(e0));
            attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, 0);
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(&t_ref[i], e0, e1));
            cudaCheck(cudaEventRecord(e0));
            attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_new, ws_new, 0);
            cudaCheck(cudaEventRecord(e1));
            sync_or_report(cudaEventSynchronize(e1), "a timed launch");
            cudaCheck(cudaEventElapsedTime(&t_new[i], e0, e1));
        }
        /* backward = 2.5 x the causal forward's 2 B H T^T d (FlashAttention count) */
        const double flops = 2.5 * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
        const float ms_ref = median_ms(t_ref, kReps), ms_new = median_ms(t_new, kReps);
        printf("  time (median of %d, warm inputs): portable backward %.4f ms = %.1f TFLOP/s; Hopper backward %.4f ms"
               " = %.1f TFLOP/s (attention_backward_cuda: prep + key-major kernel + dQ pass); speed-up %.2fx\n",
               (int)kReps, ms_ref, flops / ms_ref * 1e-9, ms_new, flops / ms_new * 1e-9, ms_ref / ms_new);
        cudaCheck(cudaEventDestroy(e0));
        cudaCheck(cudaEventDestroy(e1));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_new)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_new));
}

/* Runs the library's layout probe (attention_hopper_bwd_layout_probe) on B1 NH3 T100 (head 1: slot and head
   coordinates; T < 128: keys 100..127 and queries 100..127 zero-filled) and checks its products against double
   loops over the same BF16 values (the kernel's own S^T, dP^T, rounded to BF16 as it rounds them, for the three
   register-A products), and the reduce-added dQ against the register dQ bit for bit. */
static void layout_probe(void) {
    test_section("layout probe HS64, 128-query step: S^T, dP^T (SS n128), dV, dK (RS, N-major dO/Q), dQ (staged dS,"
                 " N-major K), dQ through the TMA reduce-add");
    enum { kQ = 0, kK = 1, kV = 2 };
    const int nk = ATTN_HOPPER_BWD_PROBE_KEYS, nq = ATTN_HOPPER_BWD_PROBE_QUERIES, hs = ATTN_HOPPER_BWD_HS;
    const int key_base = nk; /* warpgroup 1's keys: tokens 64..127 */
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, 100, hs}, 1);
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * hs, n_dq = (size_t)nq * hs;
    const size_t total = 2 * n_st + 2 * n_kv + n_dq, acc_elems = (size_t)in.s.NH * in.s.T * hs;
    float *d_out, *d_acc;
    lab_alloc_poisoned(&d_out, total * 4);
    cudaCheck(cudaMalloc(&d_acc, acc_elems * 4));
    cudaCheck(cudaMemset(d_acc, 0, acc_elems * 4));
    attention_hopper_bwd_layout_probe(in.s, in.head, in.qkv, in.dout, d_out, d_acc);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)mallocCheck(total * 4);
    float* h_acc = (float*)mallocCheck(acc_elems * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_acc, d_acc, acc_elems * 4, cudaMemcpyDeviceToHost));
    const float *g_st = h, *g_dpt = h + n_st, *g_dv = g_dpt + n_st, *g_dk = g_dv + n_kv, *g_dq = g_dk + n_kv;
    double* ref = (double*)mallocCheck(n_st * sizeof(double));
    double* mag = (double*)mallocCheck(n_st * sizeof(double));
    lab_probe_product(ref, mag, nk, nq, hs,
                      [&](int i, int j, int d) { return probe_qkv(in, key_base + i, kK, d) * probe_qkv(in, j, kQ, d); });
    CHECK(lab_probe_compare("S^T = K Q^T", g_st, ref, mag, nk, nq) == 0,
          "S^T = K Q^T: wgmma m64n128k16 SS, K-major K (the tile's second 8 KB half) as A, the 128-row Q tile as B");
    lab_probe_product(ref, mag, nk, nq, hs,
                      [&](int i, int j, int d) { return probe_qkv(in, key_base + i, kV, d) * probe_dout(in, j, d); });
    CHECK(lab_probe_compare("dP^T = V dO^T", g_dpt, ref, mag, nk, nq) == 0,
          "dP^T = V dO^T: the dout tensor map {HS, NH, T, B}, V as A, dO as K-major B");
    lab_probe_product(ref, mag, nk, hs, nq,
                      [&](int i, int n, int q) { return bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n); });
    CHECK(lab_probe_compare("dV = bf(S^T) dO", g_dv, ref, mag, nk, hs) == 0,
          "dV = bf(S^T) dO: accumulator -> register A over 8 k-steps, dO as N-major B across its two boxes");
    lab_probe_product(ref, mag, nk, hs, nq,
                      [&](int i, int n, int q) { return bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kQ, n); });
    CHECK(lab_probe_compare("dK = bf(dP^T) Q", g_dk, ref, mag, nk, hs) == 0,
          "dK = bf(dP^T) Q: the Q tile read N-major after being read K-major");
    lab_probe_product(ref, mag, nq, hs, nk, [&](int q, int n, int k) {
        return bf16_round(g_dpt[k * nq + q]) * probe_qkv(in, key_base + k, kK, n);
    });
    CHECK(lab_probe_compare("dQ = bf(dP^T)^T K", g_dq, ref, mag, nq, hs) == 0,
          "dQ = bf(dS) K: dS staged [query][key] in shared memory and read as A fragments (two M blocks), K as"
          " N-major B at the warpgroup's 8 KB offset");
    size_t wrong = 0, stray = 0;
    for (int hh = 0; hh < in.s.NH; hh++)
        for (int q = 0; q < in.s.T; q++)
            for (int n = 0; n < hs; n++) {
                const float got = h_acc[((size_t)hh * in.s.T + q) * hs + n];
                if (hh == in.head) wrong += !(got == g_dq[q * hs + n]);
                else stray += got != 0.f;
            }
    CHECK(wrong == 0 && stray == 0, "dQ through the FP32 swizzled tile and the TMA reduce-adds (128-row boxes) equals"
          " the register dQ bit for bit in rows < T, nothing written elsewhere (%zu wrong, %zu stray)", wrong, stray);
    free(ref); free(mag); free(h); free(h_acc);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_acc));
}

int main(int argc, char** argv) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes are fixed in main()", argv[0]);
    const cudaDeviceProp prop = require_sm90("hopper_bwd");
    lab_watch_hangs();
    printf("hopper_bwd on %s: the production Hopper backward (attention_hopper_bwd.cu) vs the portable one\n", prop.name);
    layout_probe();
    /* correctness: T = 1, T not a multiple of the tiles, B*NH from 1 to 128 */
    const AttnShape shapes[] = {
        {1, 1, 1, 64}, {1, 1, 77, 64}, {1, 2, 128, 64}, {1, 1, 129, 64}, {2, 3, 1000, 64}, {4, 32, 257, 64},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(ATTN_BF16, shapes[i], 1.f, 0);
    const AttnShape sharp = {1, 4, 500, 64};
    check_shape(ATTN_BF16, sharp, 8.f, 0);
    const AttnShape repair_shapes[] = {{1, 1, 77, 64}, {2, 3, 1000, 64}};
    for (size_t i = 0; i < sizeof repair_shapes / sizeof repair_shapes[0]; i++)
        check_shape(ATTN_REPAIR, repair_shapes[i], 1.f, 0);
    /* timing (and checks) at the issue's benchmark shapes */
    const AttnShape bench[] = {{8, 16, 1024, 64}, {4, 16, 2048, 64}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(ATTN_BF16, bench[i], 1.f, 1);
    return test_summary();
}
