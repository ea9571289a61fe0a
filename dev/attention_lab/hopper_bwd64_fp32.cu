/*
 * dev/attention_lab/hopper_bwd64_fp32.cu - lab of the production Hopper (sm_90a) key-major pass of fp32 mode at
 * head size 64 (attention/attention_hopper_bwd64_fp32.cu: dK, dV and the dQ reduce-adds from the D that the
 * Hopper row pass leaves in the workspace; wgmma + TMA, two consumer warpgroups and a producer warp, 288 threads,
 * no setmaxnreg): its layout probe, then the fp32 backward by attention_backward_cuda on the default path (on
 * sm_90: prep, the Hopper row pass, this pass, the dQ post-pass) and the pass alone, against the same call with
 * AttnOptions.force_portable = 1 (the mma.sync kernels), element by element, and the timings. The kernel lives
 * in the library only; this file is host code plus a spin kernel and a dQ post-pass for the timing and checks
 * (a) and (c), builds for any NVCC_ARCH, and refuses to run off sm_90.
 *
 * History: written here with its own copy of the kernel (session 5, without a GPU); first H200 run in session 6,
 * call 1 (2026-11-29, /work/.device/1/call1.tgz, s1/hopper_bwd64_fp32.log): layout probe exact in all seven
 * products, 247 passed / 0 failed (all three slots within 4 BF16 ulps of force_portable - max 1.00 -, the kernel
 * on the reference's D and composed with memset + Hopper row pass + the lab's post-pass); this kernel alone
 * 0.312 ms = 248 TFLOP/s at B8 H16 T1024 and 0.535 ms = 289 TFLOP/s at B4 H16 T2048 (9 causal BF16 GEMMs); the
 * composed fp32 backward 0.416 / 0.682 ms vs the default of then (Hopper row pass + portable key-major kernel)
 * 0.472 / 0.799 ms = 1.13x / 1.17x (fp32/bf16 backward 1.93x -> 1.70x, 2.13x -> 1.82x). Then moved into
 * attention/ unchanged (PTX identical to the lab's but for symbol names) and dispatched by attention_backward_cuda
 * in attn_bwd_kernel<64, ATTN_FP32>'s place, so the default fp32 backward is the composed one. The production
 * form has not run on a GPU yet (the lead's session-6 call after that commit).
 *
 * Checks (in order; the probe, the cases and the benchmark shapes each in a child process of their own):
 *   1. the layout probe (attention_hopper_fp32_keys64_layout_probe, B1 NH3 T50, head 1, one warpgroup at
 *      warpgroup 1's offsets, stage 1, keys 50..63 zero-filled): S^T, dP^T; dV = (bf(S^T) + bf(S^T - bf(S^T))) dO
 *      and dK = (bf(dP^T) + bf(r1)) Q (two RS n64 batches chained per accumulator); dQ over the three staged
 *      terms (three RS groups, two A register sets) and its second and third terms alone - against double loops
 *      on the kernel's own S^T and dP^T, split as the kernel splits them;
 *   2. per case: dispatch (default "hopper", force_portable "portable"; attention_hopper_fp32_keys_supports says
 *      yes); forward, then attention_backward_cuda(fp32, force_portable) = reference, and
 *      (a) this pass alone (attention_backward_hopper_fp32_keys) on the reference's D into a zeroed accumulator
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
 * Safety: every mbarrier wait of the kernel is bounded (~2 s) and traps after naming the barrier in the
 * host-mapped hang record (lab_watch_hangs installs it through attention_hopper_bwd_watch_hangs); this lab reads
 * the record after every synchronisation, so a hang is a named FAIL; a child that dies without reporting counts
 * as one failure. Run it under `timeout` anyway.
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
#include "attention/attention_hopper_bwd.cuh"
#include "attention/attn_cases.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"
#include "dev/attention_lab/hopper_lab.cuh"

typedef __nv_bfloat16 bf16;
static const int kHS = ATTN_HOPPER_FP32_KEYS64_HS;            /* the pass's head size */
static const int kProbeTile = ATTN_HOPPER_FP32_KEYS64_PROBE_TILE; /* the probe's keys and queries (one warpgroup step) */
static const int kProbeT = 50; /* the probe's tokens (< kProbeTile: the TMA zero fill shows) */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

/* Spins for `ns` nanoseconds of the global timer (bounded by construction): holds the GPU while the timed
   launches are queued behind it, so host-side launch work never shows as idle time inside an interval. */
__global__ void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

/* dQ = bf(s * accumulator) into the q slot of dqkv: attention_cuda.cu's attn_bwd_dq_kernel<64> expression
   (file-local there), for checks (a) and (c), where the pass runs alone. */
__global__ void lab_dq_postpass(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T, float scale,
                                long long pairs) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const long long e = 2 * i;
    const int d = (int)(e % kHS);
    const long long row = e / kHS;
    const int tok = (int)(row % T);
    const long long bh = row / T, b = bh / NH, h = bh % NH;
    const float2 v = *reinterpret_cast<const float2*>(dq_acc + e);
    bf16* dst = dqkv + (b * T + tok) * 3LL * NH * kHS + h * kHS + d;
    __nv_bfloat162 pair = __floats2bfloat162_rn(v.x * scale, v.y * scale);
    *reinterpret_cast<__nv_bfloat162*>(dst) = pair;
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks and timing                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* A synchronisation result plus the hang record (hopper_lab.cuh's lab_watch_hangs): on either, one FAIL line
   naming the barrier (or the CUDA error), then the child reports and ends. */
static void sync_or_report(cudaError_t e, const char* where) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return;
    if (hung)
        CHECK(0, "HANG in %s: mbarrier %s never completed (index %d, parity %d, block (%d, %d), thread %d; the"
              " kernel trapped)", where, attn_hopper_hang_site_name(r->site), r->index, r->parity, r->block_x,
              r->block_y, r->thread);
    if (e != cudaSuccess)
        CHECK(0, "CUDA error after %s: %s (hint: run under compute-sanitizer)", where, cudaGetErrorString(e));
    lab_child_report_and_exit();
}

/* The file comment's tolerance (fixed before any run) and bit-equality. */
static const double kMaxUlps = 4.0;
static const double kExact = 0.0;
static const char* kSlotName[3] = {"dQ", "dK", "dV"};

/* Compares one slot and CHECKs it within max_ulps (bit-equal when kExact) against `ref`. */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       const char* against, double max_ulps) {
    const SlotDiff d = compare_slot(ref, got, s, slot);
    printf("  %s %s vs %s: max |diff| %.3g, max %.2f BF16 ulps, %zu of %zu over 1 ulp, %zu not bit-equal\n", what,
           kSlotName[slot], against, d.max_abs, d.max_ulps, d.over_1ulp, d.count, d.unequal);
    CHECK(d.nan_ref == 0, "%s: %s has every element finite (%zu NaN)", kSlotName[slot], against, d.nan_ref);
    CHECK(d.nan_new == 0, "%s %s: written everywhere, finite (%zu NaN left of the poison or of a give-up)", what,
          kSlotName[slot], d.nan_new);
    if (max_ulps == kExact)
        CHECK(d.unequal == 0, "%s %s bit-equal to %s (%zu differ)", what, kSlotName[slot], against, d.unequal);
    else
        CHECK(d.max_ulps <= max_ulps, "%s %s within %.0f BF16 ulps of %s (max %.2f)", what, kSlotName[slot], max_ulps,
              against, d.max_ulps);
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
    attention_backward_hopper_fp32_keys(s, qkv, dout, stats, D, dq_acc, into, st);
    const long long pairs = (long long)rows * kHS / 2;
    lab_dq_postpass<<<(unsigned)ceil_div(pairs, 256), 256, 0, st>>>(dq_acc, into, s.NH, s.T, attn_softmax_scale(kHS),
                                                                    pairs);
    cudaCheckLastError();
}

struct CheckCase {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

/* One case: the file comment's check 2; with time_it also 3. */
static void check_case(CheckCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = ATTN_FP32;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper fp32 key-major pass at HS 64", s.B,
             s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; carve_workspace's layout, which"
          " this lab reads)", ws_bytes);
    uint16_t* h_qkv = random_qkv_offset_bits(s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(nout);
    bf16 *qkv, *dout, *out, *dqkv_ref, *dqkv_def, *dqkv_pass;
    float* stats;
    void *ws_ref, *ws_def, *ws_pass;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    lab_alloc_poisoned(&dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&dqkv_def, nqkv * 2);
    lab_alloc_poisoned(&dqkv_pass, nqkv * 2);
    lab_alloc_poisoned(&ws_ref, ws_bytes);
    lab_alloc_poisoned(&ws_def, ws_bytes);
    lab_alloc_poisoned(&ws_pass, ws_bytes);
    AttnOptions opt = {0}, portable = {0};
    portable.force_portable = 1;
    /* the uploads and poison fills ran on the legacy default stream, which `st` (non-blocking) does not
       wait for */
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const AttnBwdPath path_default = attention_backward_cuda_path(mode, opt, s, qkv, dout);
    printf("  dispatch: default fp32 backward %s, force_portable %s\n", attn_bwd_path_name(path_default),
           attn_bwd_path_name(attention_backward_cuda_path(mode, portable, s, qkv, dout)));
    CHECK(path_default == ATTN_BWD_HOPPER &&
              attention_backward_cuda_path(mode, portable, s, qkv, dout) == ATTN_BWD_PORTABLE,
          "dispatch: the default fp32 backward at HS 64 is the Hopper one (row pass + this pass), force_portable"
          " the portable one");
    CHECK(attention_hopper_fp32_keys_supports(mode, s, qkv, dout), "attention_hopper_fp32_keys_supports says yes"
          " (fp32, HS 64, aligned): backward_launch runs this pass");

    attention_forward_cuda(mode, opt, s, qkv, out, stats, NULL, st);
    attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable backward");
    /* (a) the pass alone on the reference's D */
    pass_alone(s, qkv, dout, stats, ws_ref, ws_pass, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "(a) the fp32 key-major pass on the reference's D + the lab's post-pass");
    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_new = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_pass, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(a) this pass on the reference's D:", "the force_portable backward",
                   kMaxUlps);
    /* (b) the default backward, on poisoned dqkv and workspace */
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_def, ws_def, st);
    sync_or_report(cudaStreamSynchronize(st), "(b) the default fp32 backward");
    cudaCheck(cudaMemcpy(h_new, dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(b) default backward:", "the force_portable backward", kMaxUlps);
    /* (c) the pass alone on the default path's D: what the default path ran (dK, dV bit for bit) */
    pass_alone(s, qkv, dout, stats, ws_def, ws_pass, dqkv_pass, st);
    sync_or_report(cudaStreamSynchronize(st), "(c) the fp32 key-major pass on the default path's D");
    cudaCheck(cudaMemcpy(h_ref, dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_new, dqkv_pass, nqkv * 2, cudaMemcpyDeviceToHost));
    check_slot(h_ref, h_new, s, 0, "(c) this pass, default path's D:", "the default backward", kMaxUlps);
    for (int slot = 1; slot < 3; slot++)
        check_slot(h_ref, h_new, s, slot, "(c) this pass, default path's D:", "the default backward", kExact);

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t ev[kReps + 1];
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventCreate(&ev[r]));
        /* the bf16 backward of the ratio needs bf16's own forward (stats {LSE, 0}, its O for D) */
        bf16 *out_b, *dqkv_b;
        float* stats_b;
        void* ws_b;
        cudaCheck(cudaMalloc(&out_b, nout * 2));
        cudaCheck(cudaMalloc(&dqkv_b, nqkv * 2));
        cudaCheck(cudaMalloc(&stats_b, nstats * 4));
        cudaCheck(cudaMalloc(&ws_b, attention_cuda_workspace_bytes(s, ATTN_BF16)));
        attention_forward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, NULL, st);
        float* dq_acc_pass = (float*)ws_pass;
        const float* D_pass = dq_acc_pass + rows * s.HS;
        auto run_portable = [&]() { attention_backward_cuda(mode, portable, s, qkv, out, stats, dout, dqkv_ref, ws_ref, st); };
        auto run_default = [&]() { attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv_def, ws_def, st); };
        auto run_bf16 = [&]() { attention_backward_cuda(ATTN_BF16, opt, s, qkv, out_b, stats_b, dout, dqkv_b, ws_b, st); };
        /* alone: keeps adding into ws_pass's accumulator (its values do not matter any more) */
        auto run_pass = [&]() { attention_backward_hopper_fp32_keys(s, qkv, dout, stats, D_pass, dq_acc_pass, dqkv_pass, st); };
        /* kReps back-to-back runs queued behind a spin (2 ms + 100 us per run: longer than queueing them) */
        auto time_of = [&](auto fn, const char* what) {
            float t[kReps];
            for (int i = 0; i < kWarmup; i++) fn();
            sync_or_report(cudaStreamSynchronize(st), what);
            spin_for_ns<<<1, 1, 0, st>>>(2000000ull + 100000ull * kReps);
            cudaCheckLastError();
            cudaCheck(cudaEventRecord(ev[0], st));
            for (int i = 0; i < kReps; i++) {
                fn();
                cudaCheck(cudaEventRecord(ev[i + 1], st));
            }
            sync_or_report(cudaStreamSynchronize(st), what);
            for (int i = 0; i < kReps; i++) cudaCheck(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
            return median_ms(t, kReps);
        };
        const float ms_pass = time_of(run_pass, "timing the fp32 key-major pass alone");
        const float ms_portable = time_of(run_portable, "timing the portable fp32 backward");
        const float ms_default = time_of(run_default, "timing the default fp32 backward");
        const float ms_bf16 = time_of(run_bf16, "timing the default bf16 backward");
        const char* path_bf16 = attn_bwd_path_name(attention_backward_cuda_path(ATTN_BF16, opt, s, qkv, dout));
        /* the pass's GEMM work in BF16 tensor-core products, causal: S^T, dP^T (1 each), dV, dK (2 each: the
           split), dQ (3) = 9 GEMMs of 2 B H T^2 d / 2 */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        printf("  time (median of %d, warm inputs, queued behind a spin): this pass alone %.4f ms (%.1f TFLOP/s"
               " counting its 9 BF16 GEMMs, causal); the rest of the default backward (prep, row pass, post-pass)"
               " %.4f ms\n", (int)kReps, ms_pass, 9.0 * gemm / ms_pass * 1e-9, ms_default - ms_pass);
        printf("  time: fp32 backward: portable %.4f ms, default (path %s: prep + Hopper row pass + this pass +"
               " post-pass) %.4f ms = %.2fx faster than the portable\n", ms_portable,
               attn_bwd_path_name(path_default), ms_default, ms_portable / ms_default);
        printf("  time: bf16 default backward (path %s) %.4f ms -> fp32/bf16 backward: portable %.2fx, default"
               " %.2fx\n", path_bf16, ms_bf16, ms_portable / ms_bf16, ms_default / ms_bf16);
        for (int r = 0; r <= kReps; r++) cudaCheck(cudaEventDestroy(ev[r]));
        cudaCheck(cudaFree(out_b)); cudaCheck(cudaFree(dqkv_b)); cudaCheck(cudaFree(stats_b)); cudaCheck(cudaFree(ws_b));
    }
    free(h_qkv); free(h_dout); free(h_ref); free(h_new);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(stats));
    cudaCheck(cudaFree(dqkv_ref)); cudaCheck(cudaFree(dqkv_def)); cudaCheck(cudaFree(dqkv_pass));
    cudaCheck(cudaFree(ws_ref)); cudaCheck(cudaFree(ws_def)); cudaCheck(cudaFree(ws_pass));
}

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
    float* h = (float*)mallocCheck(total * 4);
    cudaCheck(cudaMemcpy(h, d_out, total * 4, cudaMemcpyDeviceToHost));
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

/* The checks of one child process: the layout probe (child 0), the small cases (child 1), or the benchmark
   shapes with their timings (child 2). */
static void run_child(int child) {
    attn_rng_init(&g_rng, 0x9E3779B97F4A7C15ull + (unsigned long long)child);
    require_sm90("hopper_bwd64_fp32");
    lab_watch_hangs();
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st; /* a stream of its own, as the trainer's (not the legacy default stream) */
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1) {
        /* T = 1, T < 64, odd T, T not a multiple of the 128-key tile (a last key tile with an empty second
           half), B*NH up to 32, sharp softmax, key offsets (where fp32 must stay accurate) */
        const CheckCase cases[] = {
            {{1, 1, 1, 64}, 1.f, 0.f},    {{1, 2, 50, 64}, 1.f, 0.f},   {{1, 1, 77, 64}, 1.f, 0.f},
            {{1, 2, 128, 64}, 1.f, 0.f},  {{1, 1, 129, 64}, 1.f, 0.f},  {{2, 3, 1001, 64}, 1.f, 0.f},
            {{4, 8, 257, 64}, 1.f, 0.f},
            {{1, 4, 500, 64}, 8.f, 0.f},   /* sharp softmax (q x8) */
            {{2, 4, 1000, 64}, 1.f, 20.f}, /* K += 20 u */
            {{1, 4, 777, 64}, 8.f, 20.f},  /* both, odd T */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    } else {
        const CheckCase bench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};
        for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    }
    cudaCheck(cudaStreamDestroy(st));
}

/* The parent never touches CUDA: each child gets a fresh context, so a fault or a hang report in one costs
   that child's results only (hopper_lab.cuh's lab_run_children). */
int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd64_fp32: fp32's Hopper key-major pass at HS 64 (dK, dV, dQ partials) vs the production"
           " backward; the probe, the checks and the benchmark shapes each in its own process\n");
    static const char* kChildName[3] = {"the layout probe", "the checks", "the benchmark shapes and timings"};
    return lab_run_children("hopper_bwd64_fp32", 3, kChildName, run_child, 0);
}
