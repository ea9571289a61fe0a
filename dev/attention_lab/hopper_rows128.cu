/*
 * dev/attention_lab/hopper_rows128.cu - lab of the production Hopper (sm_90a) row pass of the backward at head
 * size 128 (attention/cuda/hopper/attention_hopper_rows128.cu: gproj's lambda and all of gproj's dQ, fp32's D, on wgmma + TMA
 * with setmaxnreg): its layout probe, then attention_backward_cuda on the Hopper path (the default on sm_90, which
 * runs this row pass in attn_bwd_rows_kernel<128>'s place, then the key-major pass: gproj's Hopper one,
 * attention_hopper_bwd128_gproj.cu, or fp32's, attention_hopper_bwd128_fp32.cu) against the same
 * call with AttnOptions.force_portable = 1, per quantity (D and lambda from the workspaces, dQ, dK, dV), and
 * timed kernel by kernel. The kernel lives in the library only; this file is host code (checks, timing, one spin
 * kernel) and builds for any NVCC_ARCH, but refuses to run off sm_90.
 *
 * Next experiment: overlap one 64-key half's DSK/PK GEMMs with the next half's S/dP, and D fused into
 * the pass (docs/attention_kernels.md, "Not done"); this lab's per-kernel timings are the baseline to beat.
 *
 * The probe (attention_hopper_rows_layout_probe at HS 128) runs the kernel's operand forms on one CTA tile
 * against host loops first, so a failure names the wrong layout before the attention checks fail:
 *   (a) m64n64k16 SS over 8 k-steps with the chunk jump, both operands 64-row slices (8 KB into 16 KB chunks)
 *       of 128-row tiles - S, dP;  (b) m64n128k16 RS with K N-major from row 0 and row 64, LBO 16 KB -
 *       bf(S) K, bf(dP) K;  (c) the K/V tiles of stage 1 (32 KB offsets) - all four.
 *
 * Expected: bit-equal D (fp32), lambda and dQ (gproj), as the lab kernel was on the H200 (same per-lane key
 * order, same rounding points; the tensor core's k-step sums came out equal). fp32's dQ, dK, dV and gproj's
 * dK, dV come from different key-major kernels on the two paths (tolerance only). Checked separately from the tolerances below, so a miss there and a pass of the tolerances
 * reads as "order-level difference", not a layout error.
 *
 * Safety: the kernel's mbarrier waits are bounded (~2 s) and then give up: the CTA writes NaN over its lambda and
 * dQ rows (gproj) or D (fp32), and this lab installs the host-mapped record (attention_hopper_bwd_watch_hangs,
 * hopper_lab.cuh's lab_watch_hangs) and reads it after every synchronisation, so a hang is a named FAIL, not a
 * stuck job. The probe, the gproj checks, the fp32 checks and the timing run in four processes (the parent
 * never touches CUDA), so a fault costs one group's lines. Run it under `timeout` anyway.
 *
 * Timing: both backwards captured into CUDA graphs, each kernel node re-instantiated as a graph of its own
 * (cudaGraphKernelNodeGetParams), so every kernel (the two row passes above all) is timed alone, interleaved,
 * queued behind a spin kernel so host launch work never shows as GPU idle time inside a timed interval; and
 * the two whole captured backwards. Inputs stay in L2 between repeats.
 *
 * Usage: hopper_rows128   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed"
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
static const int kBlockQ = ATTN_HOPPER_ROWS_PROBE_ROWS;  /* query rows of the probe tile */
static const int kBlockK = ATTN_HOPPER_ROWS_PROBE_ROWS;  /* keys of the probe tile */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */
static const char* kLab = "hopper_rows128";

/* ------------------------------------------------------------------------------------------------ */
/* host: checks against the portable row pass, timing                                               */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerances, set before the lab kernel's first run (and kept): dQ within 8 BF16 ulps of the row scale (the row
   RMS as the floor), dK and dV within 4 (the key-major labs'); lambda within 16 u, median 1e-2 u (u = 2^-9
   sigma_dP, sigma_dP = sqrt(HS) rms(dO) rms(V): one flipped BF16 rounding of dS moves lambda by up to
   2^-8 |dS| / p); fp32 D within 1e-5 sigma_dP. Bit-equality is checked besides (see the file comment). */
static const double kMaxDqUlps = 8.0;
static const double kMaxKvUlps = 4.0;
static const double kMaxLambdaUnits = 16.0;
static const double kMedLambdaUnits = 1e-2;
static const double kMaxDRel = 1e-5;

/* The portable backward's workspace layout (carve_workspace in attention/cuda/attention_cuda.cu, internal there):
   dq_acc [rows * HS] fp32, then D [rows], then lambda [rows]; rows = B*NH*T, row (b*NH + h)*T + t. */
static size_t rows_of(AttnShape s) { return (size_t)s.B * s.NH * s.T; }
static float* ws_D(AttnShape s, void* ws) { return static_cast<float*>(ws) + rows_of(s) * s.HS; }
static float* ws_lambda(AttnShape s, void* ws) { return ws_D(s, ws) + rows_of(s); }

/* Compares n FP32 row values (D or lambda) of the reference and this kernel: NaNs, rows not bit-equal,
   median and max |diff| in `unit`. */
struct RowDiff {
    size_t nan_ref, nan_new, unequal;
    double med_units, max_units;
};
static RowDiff compare_rows(const float* ref, const float* got, size_t n, double unit) {
    RowDiff d = {0, 0, 0, 0.0, 0.0};
    double* units = (double*)mallocCheck(n * sizeof(double));
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i])) d.nan_ref++;
        if (isnan(got[i])) d.nan_new++;
        if (isnan(ref[i]) || isnan(got[i])) continue;
        if (ref[i] != got[i]) d.unequal++;
        units[m] = fabs((double)ref[i] - got[i]) / unit;
        d.max_units = fmax(d.max_units, units[m]);
        m++;
    }
    d.med_units = median_d(units, m);
    free(units);
    return d;
}

/* A backward's kernels, one graph each: attention_backward_cuda (with `opt`) captured on a stream, every kernel
   node copied into a graph of its own, so each (the row pass above all) can be timed alone; the whole capture
   instantiated too. Names from cudaFuncGetName. */
struct BackwardKernels {
    enum { kMax = 8 };
    int n, row_pass; /* row_pass: the node whose name contains `row_pass_name`, or -1 */
    const char* name[kMax];
    cudaGraphExec_t exec[kMax];
    cudaGraphExec_t whole;
    cudaGraph_t captured;
};
static BackwardKernels capture_backward(AttnMode mode, AttnOptions opt, AttnShape s, const bf16* qkv, const bf16* out,
                                        const float* stats, const bf16* dout, bf16* dqkv, void* ws,
                                        const char* row_pass_name, cudaStream_t stream) {
    BackwardKernels k;
    memset(&k, 0, sizeof k);
    k.row_pass = -1;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv, ws, stream);
    cudaCheck(cudaStreamEndCapture(stream, &k.captured));
    cudaCheck(cudaGraphInstantiate(&k.whole, k.captured, 0));
    size_t n_nodes = 0;
    cudaCheck(cudaGraphGetNodes(k.captured, NULL, &n_nodes));
    cudaGraphNode_t* nodes = (cudaGraphNode_t*)mallocCheck((n_nodes ? n_nodes : 1) * sizeof(cudaGraphNode_t));
    cudaCheck(cudaGraphGetNodes(k.captured, nodes, &n_nodes));
    for (size_t i = 0; i < n_nodes && k.n < BackwardKernels::kMax; i++) {
        cudaGraphNodeType type;
        cudaCheck(cudaGraphNodeGetType(nodes[i], &type));
        if (type != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeParams p;
        cudaCheck(cudaGraphKernelNodeGetParams(nodes[i], &p));
        cudaGraph_t one;
        cudaGraphNode_t copy;
        cudaCheck(cudaGraphCreate(&one, 0));
        cudaCheck(cudaGraphAddKernelNode(&copy, one, NULL, 0, &p));
        cudaCheck(cudaGraphInstantiate(&k.exec[k.n], one, 0));
        cudaCheck(cudaGraphDestroy(one));
        const char* name = NULL;
        if (cudaFuncGetName(&name, p.func) != cudaSuccess || name == NULL) {
            (void)cudaGetLastError(); /* clear it: a later cudaCheckLastError would take it for a launch error */
            name = "?";
        }
        if (strstr(name, row_pass_name) != NULL) k.row_pass = k.n;
        k.name[k.n++] = name;
    }
    free(nodes);
    return k;
}
static void backward_kernels_free(BackwardKernels* k) {
    for (int i = 0; i < k->n; i++) cudaCheck(cudaGraphExecDestroy(k->exec[i]));
    cudaCheck(cudaGraphExecDestroy(k->whole));
    cudaCheck(cudaGraphDestroy(k->captured));
}

/* Compares one slot (q, k or v) of the two dqkv: prints and checks finiteness, the tolerance and, where both
   paths run the same kernel on bit-equal inputs (bit_equal), bit-equality. */
static void check_grad_slot(const uint16_t* h_ref, const uint16_t* h_new, AttnShape s, int slot, double max_ulps,
                            int bit_equal) {
    static const char* kName[3] = {"dQ", "dK", "dV"};
    const SlotDiff d = compare_slot(h_ref, h_new, s, slot);
    printf("  %s: %zu of %zu not bit-equal; max |diff| %.3g, max %.2f BF16 ulps (at max(|a|, |b|, row RMS)),"
           " %zu over 1 ulp\n", kName[slot], d.unequal, d.count, d.max_abs, d.max_ulps, d.over_1ulp);
    CHECK(d.nan_ref == 0, "portable path wrote every %s, finite (%zu NaN)", kName[slot], d.nan_ref);
    CHECK(d.nan_new == 0, "Hopper path wrote every %s, finite (%zu NaN left)", kName[slot], d.nan_new);
    CHECK(d.max_ulps <= max_ulps, "%s within %.0f BF16 ulps of the portable path (max %.2f)", kName[slot], max_ulps,
          d.max_ulps);
    if (bit_equal)
        CHECK(d.unequal == 0, "%s bit-equal to the portable path, as the lab kernel (%zu differ)", kName[slot],
              d.unequal);
}

/* Times every kernel of both backwards alone and both whole backwards, interleaved, kReps times each. */
static void time_backwards(AttnMode mode, AttnShape s, const BackwardKernels& port, const BackwardKernels& hop,
                           cudaStream_t st) {
    enum { kWarmup = 3, kReps = 21, kMaxTimed = 2 * BackwardKernels::kMax + 2 };
    cudaGraphExec_t exec[kMaxTimed];
    int n = 0;
    for (int i = 0; i < port.n; i++) exec[n++] = port.exec[i];
    for (int i = 0; i < hop.n; i++) exec[n++] = hop.exec[i];
    const int whole_port = n, whole_hop = n + 1;
    exec[n++] = port.whole;
    exec[n++] = hop.whole;
    float times[kMaxTimed][kReps], med[kMaxTimed];
    cudaEvent_t ev[kMaxTimed][kReps][2];
    for (int k = 0; k < n; k++)
        for (int r = 0; r < kReps; r++) {
            cudaCheck(cudaEventCreate(&ev[k][r][0]));
            cudaCheck(cudaEventCreate(&ev[k][r][1]));
        }
    for (int i = 0; i < kWarmup; i++)
        for (int k = 0; k < n; k++) cudaCheck(cudaGraphLaunch(exec[k], st));
    lab_sync_or_report(cudaStreamSynchronize(st), kLab, "the warm-up launches");
    /* 2 ms plus 100 us per launch: longer than queueing them takes */
    spin_for_ns<<<1, 1, 0, st>>>(2000000ull + 100000ull * kReps * n);
    cudaCheckLastError();
    for (int r = 0; r < kReps; r++)
        for (int k = 0; k < n; k++) {
            cudaCheck(cudaEventRecord(ev[k][r][0], st));
            cudaCheck(cudaGraphLaunch(exec[k], st));
            cudaCheck(cudaEventRecord(ev[k][r][1], st));
        }
    lab_sync_or_report(cudaStreamSynchronize(st), kLab, "the timed launches");
    for (int k = 0; k < n; k++) {
        for (int r = 0; r < kReps; r++) {
            cudaCheck(cudaEventElapsedTime(&times[k][r], ev[k][r][0], ev[k][r][1]));
            cudaCheck(cudaEventDestroy(ev[k][r][0]));
            cudaCheck(cudaEventDestroy(ev[k][r][1]));
        }
        med[k] = median_ms(times[k], kReps);
    }
    printf("  time (median of %d, warm inputs, launches queued behind a spin), each kernel alone (graph nodes):\n",
           (int)kReps);
    for (int i = 0; i < port.n; i++) printf("    portable %.4f ms  %s\n", med[i], port.name[i]);
    for (int i = 0; i < hop.n; i++) printf("    hopper   %.4f ms  %s\n", med[port.n + i], hop.name[i]);
    const int n_gemms = (mode == ATTN_GPROJ) ? 4 : 2; /* S, dP (+ DSK, PK) */
    const double flops = n_gemms * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2; /* causal */
    if (port.row_pass >= 0 && hop.row_pass >= 0) {
        const float ms_old = med[port.row_pass], ms_new = med[port.n + hop.row_pass];
        printf("  time: row pass portable %.4f ms = %.1f TFLOP/s; HS-128 Hopper %.4f ms = %.1f TFLOP/s (%d GEMMs,"
               " causal); speed-up %.2fx\n", ms_old, flops / ms_old * 1e-9, ms_new, flops / ms_new * 1e-9, n_gemms,
               ms_old / ms_new);
    }
    printf("  time: whole %s backward (captured graph) portable %.4f ms, default (Hopper passes) %.4f ms:"
           " speed-up %.2fx\n", attn_mode_name(mode), med[whole_port], med[whole_hop],
           med[whole_port] / med[whole_hop]);
}

/* One shape and mode: forward (portable), then attention_backward_cuda with force_portable (reference) and on the
   default Hopper path on the same inputs (dqkv and both workspaces poisoned with NaN first), compared: D (fp32:
   the row pass's; gproj: the prep kernel's against the Hopper row pass's, one sum order), lambda (gproj), dQ, dK, dV;
   with time_it, timed. */
static void check_shape(LabCase in, AttnMode mode, int time_it) {
    const AttnShape s = in.s;
    char title[256];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d q x%g key offset %g: HS-128 Hopper row pass vs the portable one",
             attn_mode_name(mode), s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), rows = rows_of(s);
    lab_check_ws_layout(s, mode, "the layout this lab assumes");
    LabBwdCase c = lab_bwd_case_random(mode, in);
    const double sigma_dp = lab_sigma_dp(c.h_qkv, c.h_dout, s); /* the scale of dP - D (hopper_lab.cuh) */
    const double lambda_unit = ldexp(sigma_dp, -9);

    CHECK(lab_bwd_dispatch_ok(c),
          "dispatch: the default backward runs the Hopper row pass, force_portable the portable one");
    lab_bwd_run_both(c, c.portable, 0);
    lab_sync_or_report(cudaDeviceSynchronize(), kLab, title);

    float* h_ref = (float*)lab_download(ws_D(s, c.ws_ref), rows * 4);
    float* h_new = (float*)lab_download(ws_D(s, c.ws_def), rows * 4);
    const RowDiff dd = compare_rows(h_ref, h_new, rows, sigma_dp);
    printf("  D (%s): %zu of %zu rows not bit-equal; |diff| / sigma_dP (%.3g): median %.3g, max %.3g\n",
           mode == ATTN_FP32 ? "sum P dP, the row pass" : "dO . O, the prep kernel vs the Hopper row pass", dd.unequal, rows,
           sigma_dp, dd.med_units, dd.max_units);
    CHECK(dd.nan_ref == 0, "portable path wrote D at workspace + rows*HS floats, finite (%zu NaN)", dd.nan_ref);
    CHECK(dd.nan_new == 0, "Hopper path wrote every D, finite (%zu NaN left)", dd.nan_new);
    CHECK(dd.max_units <= kMaxDRel, "D within %.0e sigma_dP of the portable path (max %.3g)", kMaxDRel, dd.max_units);
    CHECK(dd.unequal == 0, "D bit-equal to the portable path (%zu rows differ)", dd.unequal);
    if (mode == ATTN_GPROJ) {
        cudaCheck(cudaMemcpy(h_ref, ws_lambda(s, c.ws_ref), rows * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(h_new, ws_lambda(s, c.ws_def), rows * 4, cudaMemcpyDeviceToHost));
        const RowDiff d = compare_rows(h_ref, h_new, rows, lambda_unit);
        printf("  lambda: %zu of %zu rows not bit-equal; |diff| in u = 2^-9 sigma_dP (%.3g): median %.3g, max %.3g\n",
               d.unequal, rows, lambda_unit, d.med_units, d.max_units);
        CHECK(d.nan_ref == 0, "portable path wrote lambda at workspace + rows*(HS+1) floats (%zu NaN)", d.nan_ref);
        CHECK(d.nan_new == 0, "Hopper path wrote every lambda, finite (%zu NaN left)", d.nan_new);
        CHECK(d.med_units <= kMedLambdaUnits, "lambda: median |diff| <= %.0e u (%.3g)", kMedLambdaUnits, d.med_units);
        CHECK(d.max_units <= kMaxLambdaUnits, "lambda: max |diff| <= %.0f u (%.3g)", kMaxLambdaUnits, d.max_units);
        CHECK(d.unequal == 0, "lambda bit-equal to the portable row pass, as the lab kernel (%zu rows differ)",
              d.unequal);
    }
    free(h_ref); free(h_new);

    uint16_t* g_ref = (uint16_t*)lab_download(c.dqkv_ref, nqkv * 2);
    uint16_t* g_new = (uint16_t*)lab_download(c.dqkv_def, nqkv * 2);
    /* gproj: dQ is the row pass's (bit-equal); dK, dV come from gproj's Hopper key-major pass
       (attention_hopper_bwd128_gproj.cu, FP32 sum order differs: tolerance only). fp32: all three come from
       fp32's Hopper key-major pass (attention_hopper_bwd128_fp32.cu) on the Hopper path and from the portable
       attn_bwd_kernel<128, ATTN_FP32> on the other, which sum in different FP32 orders (wgmma k order, 64- vs
       32-query tiles): within the key-major labs' 4 ulps; dQ's partials are FP32 reduce-adds in no fixed order. */
    check_grad_slot(g_ref, g_new, s, kSlotQ, mode == ATTN_GPROJ ? kMaxDqUlps : kMaxKvUlps, mode == ATTN_GPROJ);
    check_grad_slot(g_ref, g_new, s, kSlotK, kMaxKvUlps, 0);
    check_grad_slot(g_ref, g_new, s, kSlotV, kMaxKvUlps, 0);
    free(g_ref); free(g_new);

    if (time_it) {
        cudaStream_t st;
        cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        BackwardKernels port = capture_backward(mode, c.portable, s, c.qkv, c.out, c.stats, c.dout, c.dqkv_ref,
                                                c.ws_ref, "attn_bwd_rows_kernel", st);
        /* kernel_rows.cuh's rows_kernel<128, MODE> by its mangled name (the one cudaFuncGetName gives); the length
           prefix keeps the portable attn_bwd_rows_kernel out */
        BackwardKernels hop = capture_backward(mode, c.opt, s, c.qkv, c.out, c.stats, c.dout, c.dqkv_def, c.ws_def,
                                               "11rows_kernelILi128E", st);
        CHECK(port.row_pass >= 0 && hop.row_pass >= 0,
              "the captured backwards have their row-pass nodes (portable attn_bwd_rows_kernel: %d, default"
              " rows_kernel<128, MODE>: %d)", port.row_pass, hop.row_pass);
        time_backwards(mode, s, port, hop, st);
        backward_kernels_free(&port);
        backward_kernels_free(&hop);
        cudaCheck(cudaStreamDestroy(st));
    }
    
    lab_bwd_case_free(&c);
}

/* ------------------------------------------------------------------------------------------------ */
/* host: the layout probe                                                                            */
/* ------------------------------------------------------------------------------------------------ */

/* attention_hopper_rows_layout_probe on B1 NH3 T100 HS128 (head 1: slot and head coordinates; tokens 100..127
   zero-filled): S, dP, X = bf(S) K and Y = bf(dP) K against double loops over the same BF16 values (X and Y from
   the kernel's own S and dP, rounded as it rounds them). */
static void layout_probe(void) {
    test_section("layout probe HS128: S = Q K^T, dP = dO V^T (SS n64, 8 k-steps over 2 chunks, 64-row slices),"
                 " bf(S) K, bf(dP) K (RS n128, K N-major from row 0 and row 64, LBO 16 KB), K/V in stage 1");
    ProbeInputs in = probe_inputs_make_shape(AttnShape{1, 3, 100, kHS}, 1);
    const size_t n_sq = (size_t)kBlockQ * kBlockK, n_dq = (size_t)kBlockQ * kHS;
    float *d_s, *d_dp, *d_x, *d_y;
    lab_alloc_poisoned(&d_s, n_sq * 4);
    lab_alloc_poisoned(&d_dp, n_sq * 4);
    lab_alloc_poisoned(&d_x, n_dq * 4);
    lab_alloc_poisoned(&d_y, n_dq * 4);
    attention_hopper_rows_layout_probe(in.s, in.head, in.qkv, in.dout, d_s, d_dp, d_x, d_y);
    lab_sync_or_report(cudaDeviceSynchronize(), kLab, "the layout probe");
    float* h_s = (float*)lab_download(d_s, n_sq * 4);
    float* h_dp = (float*)lab_download(d_dp, n_sq * 4);
    float* h_x = (float*)lab_download(d_x, n_dq * 4);
    float* h_y = (float*)lab_download(d_y, n_dq * 4);
    const int bad_s = lab_probe_check("S = Q K^T", h_s, kBlockQ, kBlockK, kHS, [&](int i, int j, int d) {
        return probe_qkv(in, i, kSlotQ, d) * probe_qkv(in, j, kSlotK, d);
    });
    const int bad_dp = lab_probe_check("dP = dO V^T", h_dp, kBlockQ, kBlockK, kHS, [&](int i, int j, int d) {
        return probe_dout(in, i, d) * probe_qkv(in, j, kSlotV, d);
    });
    const int bad_x = lab_probe_check("bf(S) K", h_x, kBlockQ, kHS, kBlockK, [&](int i, int n, int j) {
        return bf16_round(h_s[i * kBlockK + j]) * probe_qkv(in, j, kSlotK, n);
    });
    const int bad_y = lab_probe_check("bf(dP) K", h_y, kBlockQ, kHS, kBlockK, [&](int i, int n, int j) {
        return bf16_round(h_dp[i * kBlockK + j]) * probe_qkv(in, j, kSlotK, n);
    });
    CHECK(bad_s == 0, "S = Q K^T: (a) SS n64 over 8 k-steps, chunk jump at k-step 4, Q rows 8 KB into 16 KB chunks"
                      " (warpgroup 1), K halves 0 and 8 KB into the chunks of stage 1 (c)");
    CHECK(bad_dp == 0, "dP = dO V^T: (a) with the dout map at HS 128 (column coordinate 64 for chunk 1)");
    CHECK(bad_x == 0, "bf(S) K: (b) RS n128, register A from the S accumulator, K N-major from rows 0 and 64, LBO 16 KB");
    CHECK(bad_y == 0, "bf(dP) K: (b) the second accumulator of the same wgmma group (the DSK/PK interleave)");
    free(h_s); free(h_dp); free(h_x); free(h_y);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_s)); cudaCheck(cudaFree(d_dp)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_y));
}

/* ------------------------------------------------------------------------------------------------ */
/* host: the groups of checks, one process each                                                      */
/* ------------------------------------------------------------------------------------------------ */

enum { kGroupProbe, kGroupGproj, kGroupFp32, kGroupTiming, kNumGroups };
static const char* kGroupName[kNumGroups] = {"the layout probe", "gproj checks", "fp32 checks",
                                             "checks and timing at B2 H16 T4096 and B8 H8 T1024"};

static void run_group(int group) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    const cudaDeviceProp prop = require_sm90(kLab);
    printf("  on %s\n", prop.name);
    lab_watch_hangs();
    /* random; T < 64 (1, 50); odd T (77, 129, 1000, 257); sharp (q x8); key offset 20 along a unit vector
       (gproj's correction matters); rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
    const LabCase shapes[] = {
        {{1, 1, 1, 128}, 1.f, 0.f},    {{1, 1, 50, 128}, 1.f, 0.f},    {{1, 1, 77, 128}, 1.f, 0.f},
        {{1, 2, 128, 128}, 1.f, 0.f},  {{1, 1, 129, 128}, 1.f, 0.f},   {{2, 3, 1000, 128}, 1.f, 0.f},
        {{4, 8, 257, 128}, 1.f, 0.f},  {{1, 4, 500, 128}, 8.f, 0.f},   {{2, 4, 1000, 128}, 1.f, 20.f},
        {{1, 4, 777, 128}, 1.f, 181.f},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    const LabCase bench[] = {{{2, 16, 4096, 128}, 1.f, 0.f}, {{8, 8, 1024, 128}, 1.f, 0.f}};
    switch (group) {
        case kGroupProbe: layout_probe(); break;
        case kGroupGproj:
            for (int i = 0; i < n_shapes; i++) check_shape(shapes[i], ATTN_GPROJ, 0);
            break;
        case kGroupFp32:
            for (int i = 0; i < n_shapes; i++) check_shape(shapes[i], ATTN_FP32, 0);
            break;
        case kGroupTiming:
            for (int i = 0; i < 2; i++) {
                check_shape(bench[i], ATTN_GPROJ, 1);
                check_shape(bench[i], ATTN_FP32, 1);
            }
            break;
    }
}

/* The parent never touches CUDA: each group gets a fresh context in a child process, so a fault or a hang
   report costs that group's results only. A child reports its pass/fail counts through a pipe; one that
   dies without reporting counts as a failure. */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes are fixed in the program", argv[0]);
    printf("hopper_rows128: the production HS-128 Hopper row pass (attention_hopper_rows128.cu; gproj: lambda, dQ;"
           " fp32: D) in attention_backward_cuda vs force_portable; %d groups, one process each\n", kNumGroups);
    return lab_run_children(kLab, kNumGroups, kGroupName, run_group, 1);
}
