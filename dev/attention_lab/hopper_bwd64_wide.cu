/*
 * dev/attention_lab/hopper_bwd64_wide.cu - lab of the production Hopper (sm_90a) key-major backward of bf16 and
 * repair modes at head size 64 with 128-query steps (attention/cuda/hopper/attention_hopper_bwd.cu: 384 threads, a producer
 * warpgroup, setmaxnreg 40 / 232, each warpgroup's 64 dQ rows over 128 keys through a 16 KB FP32 tile and TMA
 * reduce-adds): its layout probe, then the backward by attention_backward_cuda on the default path (on sm_90:
 * prep, this kernel, dQ post-pass) and the kernel alone, against the same call with AttnOptions.force_portable = 1 (the mma.sync
 * kernels), element by element, and the timings. The kernel lives in the library only; this file is host code
 * plus a spin kernel and a dQ post-pass for checks (a) and (c) and the timing.
 *
 * Next experiment: overlap the dQ GEMM with the next step's score GEMMs (or a warp of its own for the
 * reduce-adds), and a profile of repair's kernel, 1.11-1.15x bf16's without an extra GEMM
 * (docs/attention_kernels.md, "Cost" and "Not done"); the default-backward and kernel-alone timings below are
 * the baseline.
 *
 * Checks (each group in a child process of its own; hopper_lab.cuh's lab_run_children):
 *   0. layout probe (attention_hopper_bwd_layout_probe, B1 NH3 T100 head 1: one warpgroup at warpgroup 1's
 *      offsets, K tokens 0..127, V tokens 64..127 in the tile's second half, Q, dO tokens 0..127 in stage 1 through
 *      the kernel's own stage fill, T = 100 so both the keys and the second query box are partly zero-filled):
 *      S^T, dP^T [64 x 128] (m64n128k16 SS over two boxes), dV, dK [64 x 64] (RS over 8 k-steps crossing the box
 *      boundary), dQ [128 x 64] (dS staged at pitch 136 as both warpgroups' keys, 64 query rows at a time over
 *      128 keys: bf(dS) (K[0..63] + K[64..127])) against double loops on the same BF16 values; that dQ sent
 *      through the 16 KB swizzled tile and two TMA reduce-adds per 64 rows into a zeroed accumulator: bit-equal
 *      to the register values for rows < T, nothing written elsewhere;
 *   1. bf16, 2. repair: per case, dispatch (default "hopper", force_portable "portable"); forward, then
 *      attention_backward_cuda(force_portable) = the reference, and
 *      (a) the kernel alone (attention_backward_hopper_passes) on the reference's D into a zeroed accumulator and an
 *          all-NaN dqkv, then the lab's post-pass: dQ, dK, dV within 4 BF16 ulps of the reference;
 *      (b) attention_backward_cuda(default) on poisoned dqkv and workspace: all three slots within 4 ulps of the
 *          reference, every element written and finite (a give-up would leave NaN rows);
 *      (c) the kernel alone on the default path's D (same post-pass): dK, dV bit-equal to the default backward's
 *          (deterministic: the default path ran exactly this kernel), dQ within 4 ulps (its partials are TMA
 *          reduce-adds in no fixed order);
 *   3. B8 H16 T1024 and B4 H16 T2048 (bf16; checked as above, then timed: medians of 21, warm inputs, each
 *      candidate's runs queued behind a spin): the default backward, the force_portable backward and the kernel
 *      alone. Lines start with "time:" (device_session.sh's summary greps them).
 * Tolerance, fixed before the first run: only FP32 sum orders differ (tensor-core k order over 128 queries, dQ
 * partials per 64 keys vs per 128), and a changed FP32 S or dP can flip one BF16 rounding of P or dS; the Hopper
 * labs' 4 ulps of the row scale for all three slots.
 *
 * Safety: every mbarrier wait of the kernel is bounded (~2 s) and gives up: the CTA writes NaN over its dK/dV
 * rows and the barrier is named in the host-mapped record (lab_watch_hangs installs it through
 * attention_hopper_bwd_watch_hangs); this lab reads the record after every synchronisation, so a hang is a named
 * FAIL; a child that dies without reporting counts as one failure. Run it under `timeout` anyway.
 *
 * Usage: hopper_bwd64_wide   (no arguments; needs an sm_90 GPU). Ends with "N passed, N failed" summed over the
 * processes.
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
#include "dev/attention_lab/lab_harness.cuh"

typedef __nv_bfloat16 bf16;
static const int kHS = 64; /* the kernel's head size */
static const int kProbeKeys = ATTN_HOPPER_BWD_PROBE_KEYS;     /* the probe's keys (one consumer warpgroup) */
static const int kProbeQueries = ATTN_HOPPER_BWD_PROBE_QUERIES; /* and queries (one step) */
static const int kProbeT = 100; /* the probe's tokens: keys 100..127 and queries 100..127 zero-filled */

/* dQ = bf(s acc) into the q slot of dqkv: attn_bwd_dq_kernel's expression (file-local in attention_cuda.cu),
   8 elements per thread, grid (T * 8 / 256, B * NH); dqkv 16-byte aligned (cudaMalloc). For checks (a) and (c),
   where the kernel runs alone. */
__global__ void lab_postpass(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv, int NH, int T, float scale) {
    constexpr int kChunks = kHS / 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * kChunks) return;
    const int tok = (int)(i / kChunks), d = (int)(i % kChunks) * 8;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const float4* src = reinterpret_cast<const float4*>(dq_acc + ((long long)bh * T + tok) * kHS + d);
    const float4 lo = src[0], hi = src[1];
    __nv_bfloat162 p[4] = {__floats2bfloat162_rn(lo.x * scale, lo.y * scale),
                           __floats2bfloat162_rn(lo.z * scale, lo.w * scale),
                           __floats2bfloat162_rn(hi.x * scale, hi.y * scale),
                           __floats2bfloat162_rn(hi.z * scale, hi.w * scale)};
    *reinterpret_cast<uint4*>(dqkv + ((long long)b * T + tok) * 3LL * NH * kHS + (long long)h * kHS + d) =
        *reinterpret_cast<const uint4*>(p);
}

/* workspace: production's layout (carve_workspace in attention_cuda.cu): dq_acc [rows * HS], D [rows], ... */
static float* ws_dq_acc(void* ws) { return (float*)ws; }
static float* ws_D(void* ws, AttnShape s) { return (float*)ws + (size_t)s.B * s.NH * s.T * s.HS; }

/* The kernel alone on D (a workspace's D slot copied into `into`'s, whose accumulator is zeroed; dqkv set to NaN
   first), then the lab's post-pass. */
static void kernel_alone(AttnMode mode, AttnShape s, const bf16* qkv, const bf16* dout, const float* stats,
                         const void* D_from, void* into, bf16* dqkv, cudaStream_t st) {
    const size_t rows = (size_t)s.B * s.NH * s.T;
    cudaCheck(cudaMemsetAsync(dqkv, 0xFF, attn_qkv_count(s) * 2, st));
    cudaCheck(cudaMemsetAsync(ws_dq_acc(into), 0, rows * kHS * sizeof(float), st));
    cudaCheck(cudaMemcpyAsync(ws_D(into, s), ws_D((void*)D_from, s), rows * sizeof(float), cudaMemcpyDeviceToDevice,
                              st));
    attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, mode, AttnOptions{}, s, qkv, nullptr, dout, stats, ws_D(into, s),
                                     nullptr, ws_dq_acc(into), dqkv, st, 0);
    const dim3 grid((unsigned)ceil_div((long long)s.T * (kHS / 8), 256), (unsigned)(s.B * s.NH));
    lab_postpass<<<grid, 256, 0, st>>>(ws_dq_acc(into), dqkv, s.NH, s.T, attn_softmax_scale(kHS));
    cudaCheckLastError();
}

/* A synchronisation check that ends the child on a hang or a CUDA error (lab_harness.cuh). */
static void sync_or_report(cudaError_t e, const char* where) {
    lab_child_sync_or_fail(e, where, "); the CTA gave up and wrote NaN over its dK/dV rows");
}

static const double kMaxUlps = 4.0; /* the file comment's tolerance, fixed before any run */

/* Compares one slot and CHECKs it within max_ulps (bit-equal when kExact, lab_harness.cuh) against `ref`. */
static void check_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot, const char* what,
                       const char* against, double max_ulps) {
    lab_check_slot(ref, got, s, slot, what, against, max_ulps, "of the poison or from a give-up");
}

struct CheckCase {
    AttnMode mode;
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};

static void check_case(CheckCase in, int time_it, cudaStream_t st) {
    const AttnShape s = in.s;
    const AttnMode mode = in.mode;
    char title[200];
    snprintf(title, sizeof title, "%s B%d NH%d T%d HS%d q x%g key offset %g: production (128-query steps) vs "
             "force_portable", attn_mode_name(mode), s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    const size_t rows = (size_t)s.B * s.NH * s.T;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes >= (rows * s.HS + rows) * sizeof(float),
          "workspace holds dq_acc[rows*HS] + D[rows] fp32 (%zu bytes; carve_workspace's layout, which this lab reads)",
          ws_bytes);
    LabBwdCase c = lab_bwd_case_random(mode, LabCase{s, in.q_scale, in.key_offset});
    bf16* dqkv_alone;
    void* ws_alone;
    lab_alloc_poisoned(&dqkv_alone, nqkv * 2);
    lab_alloc_poisoned(&ws_alone, ws_bytes);
    sync_or_report(cudaDeviceSynchronize(), "the uploads and poison fills");
    const AttnBwdPath path = attention_backward_cuda_path(mode, c.opt, s, c.qkv, c.dout);
    CHECK(path == ATTN_BWD_HOPPER &&
              attention_backward_cuda_path(mode, c.portable, s, c.qkv, c.dout) == ATTN_BWD_PORTABLE,
          "dispatch: the default backward is the Hopper one (got %s), force_portable the portable one",
          attn_bwd_path_name(path));
    CHECK(attention_hopper_bwd_supports(mode, c.opt, s, c.qkv, c.dout) == 1, "attention_hopper_bwd_supports says yes");

    lab_bwd_forward(c, c.opt, st);
    lab_bwd_portable(c, st);
    sync_or_report(cudaStreamSynchronize(st), "the forward and the force_portable backward");
    uint16_t* h_ref = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_def = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_alone = (uint16_t*)mallocCheck(nqkv * 2);
    cudaCheck(cudaMemcpy(h_ref, c.dqkv_ref, nqkv * 2, cudaMemcpyDeviceToHost));

    /* (a) the kernel alone on the reference's D */
    kernel_alone(mode, s, c.qkv, c.dout, c.stats, c.ws_ref, ws_alone, dqkv_alone, st);
    sync_or_report(cudaStreamSynchronize(st), "(a) the kernel alone on force_portable's D + the lab's post-pass");
    cudaCheck(cudaMemcpy(h_alone, dqkv_alone, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_alone, s, slot, "(a) kernel alone on the reference's D:", "force_portable", kMaxUlps);

    /* (b) the default backward on poisoned buffers */
    lab_bwd_default(c, st);
    sync_or_report(cudaStreamSynchronize(st), "(b) the default backward (prep + Hopper kernel + post-pass)");
    cudaCheck(cudaMemcpy(h_def, c.dqkv_def, nqkv * 2, cudaMemcpyDeviceToHost));
    for (int slot = 0; slot < 3; slot++)
        check_slot(h_ref, h_def, s, slot, "(b) default backward:", "force_portable", kMaxUlps);

    /* (c) the kernel alone on the default path's D */
    kernel_alone(mode, s, c.qkv, c.dout, c.stats, c.ws_def, ws_alone, dqkv_alone, st);
    sync_or_report(cudaStreamSynchronize(st), "(c) the kernel alone on the default backward's D");
    cudaCheck(cudaMemcpy(h_alone, dqkv_alone, nqkv * 2, cudaMemcpyDeviceToHost));
    check_slot(h_def, h_alone, s, 0, "(c) kernel alone on the default's D:", "the default backward", kMaxUlps);
    for (int slot = 1; slot < 3; slot++)
        check_slot(h_def, h_alone, s, slot, "(c) kernel alone on the default's D:", "the default backward", kExact);

    if (time_it) {
        LabTimer timer = lab_timer_make(st, sync_or_report);
        /* the key-major kernel's 5 causal BF16 GEMMs: S^T, dP^T, dV, dK, dQ */
        const double gemm = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
        auto run_default = [&]() { lab_bwd_default(c, st); };
        auto run_portable = [&]() {
            lab_bwd_portable(c, st);
        };
        /* alone: it keeps adding into the accumulator (its values no longer matter) */
        auto run_kernel = [&]() {
            attention_backward_hopper_passes(ATTN_HOPPER_KEY_PASS, mode, AttnOptions{}, s, c.qkv, nullptr, c.dout, c.stats,
                                             ws_D(c.ws_def, s), nullptr, ws_dq_acc(c.ws_def), c.dqkv_def, st, 0);
        };
        const float ms_def = lab_timer_median(timer, run_default, "timing the default backward");
        const float ms_port = lab_timer_median(timer, run_portable, "timing the force_portable backward");
        const float ms_kernel = lab_timer_median(timer, run_kernel, "timing the key-major kernel alone");
        printf("  time: %s B%d H%d T%d d%d (median of %d, warm inputs, queued behind a spin): default backward"
               " (attention_backward_cuda, path %s) %.4f ms; force_portable %.4f ms (%.2fx); the kernel alone %.4f ms"
               " (%.1f TFLOP/s, 5 causal GEMMs)\n", attn_mode_name(mode), s.B, s.NH, s.T, s.HS, (int)kLabReps,
               attn_bwd_path_name(path), ms_def, ms_port, ms_port / ms_def, ms_kernel, 5.0 * gemm / ms_kernel * 1e-9);
        lab_timer_free(&timer);
    }
    free(h_ref); free(h_def); free(h_alone);
    lab_bwd_case_free(&c);
    cudaCheck(cudaFree(dqkv_alone)); cudaCheck(cudaFree(ws_alone));
}

/* The production layout probe on B1 NH3 T100 HS64 (head 1) against double loops over the same BF16 values. */
static void layout_probe(void) {
    test_section("layout probe HS64, 128-query step (attention_hopper_bwd_layout_probe): S^T, dP^T (m64n128k16 SS over"
                 " two boxes), dV, dK (RS, 8 k-steps across the box boundary), dQ (dS staged [128][136] as both"
                 " warpgroups' keys, 64 query rows at a time over 128 keys), dQ through the 16 KB tile + TMA reduce-add"
                 " (64-row boxes)");
    const AttnShape ps = {1, 3, kProbeT, kHS};
    ProbeInputs in = probe_inputs_make_shape(ps, 1);
    enum { kQ = 0, kK = 1, kV = 2 };
    const int nk = kProbeKeys, nq = kProbeQueries, key_base = kProbeKeys; /* warpgroup 1's keys: tokens 64..127 */
    const size_t n_st = (size_t)nk * nq, n_kv = (size_t)nk * kHS, n_dq = (size_t)nq * kHS;
    const size_t total = 2 * n_st + 2 * n_kv + n_dq;
    const size_t acc_elems = (size_t)ps.NH * ps.T * kHS;
    float *d_out, *d_acc;
    lab_alloc_poisoned(&d_out, total * 4);
    cudaCheck(cudaMalloc(&d_acc, acc_elems * 4));
    cudaCheck(cudaMemset(d_acc, 0, acc_elems * 4));
    attention_hopper_bwd_layout_probe(ps, in.head, in.qkv, in.dout, d_out, d_acc);
    sync_or_report(cudaDeviceSynchronize(), "the layout probe");
    float* h = (float*)lab_download(d_out, total * 4);
    float* h_acc = (float*)lab_download(d_acc, acc_elems * 4);
    const float *g_st = h, *g_dpt = h + n_st, *g_dv = g_dpt + n_st, *g_dk = g_dv + n_kv, *g_dq = g_dk + n_kv;
    double* ref = (double*)mallocCheck(n_st * sizeof(double));
    double* mag = (double*)mallocCheck(n_st * sizeof(double));
    lab_probe_product(ref, mag, nk, nq, kHS,
                      [&](int i, int j, int d) { return probe_qkv(in, key_base + i, kK, d) * probe_qkv(in, j, kQ, d); });
    CHECK(lab_probe_compare("S^T = K Q^T", g_st, ref, mag, nk, nq) == 0,
          "S^T = K_w Q^T: m64n128k16 SS, B = the 128-row Q tile (two boxes, stage 1), A = warpgroup 1's K half");
    lab_probe_product(ref, mag, nk, nq, kHS,
                      [&](int i, int j, int d) { return probe_qkv(in, key_base + i, kV, d) * probe_dout(in, j, d); });
    CHECK(lab_probe_compare("dP^T = V dO^T", g_dpt, ref, mag, nk, nq) == 0,
          "dP^T = V_w dO^T: m64n128k16 SS, the dout map's 128-row tile");
    lab_probe_product(ref, mag, nk, kHS, nq,
                      [&](int i, int n, int q) { return bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n); });
    CHECK(lab_probe_compare("dV = bf(S^T) dO", g_dv, ref, mag, nk, kHS) == 0,
          "dV = bf(S^T) dO: 8 register-A k-steps (pack_a_n128), dO N-major across its two boxes");
    lab_probe_product(ref, mag, nk, kHS, nq,
                      [&](int i, int n, int q) { return bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kQ, n); });
    CHECK(lab_probe_compare("dK = bf(dP^T) Q", g_dk, ref, mag, nk, kHS) == 0,
          "dK = bf(dP^T) Q: the Q tile read N-major across its two boxes after being read K-major");
    /* the probe staged its dS^T as both warpgroups' keys: dQ = bf(dS) (K[0..63] + K[64..127]) */
    lab_probe_product(ref, mag, nq, kHS, nk, [&](int q, int n, int k) {
        return bf16_round(g_dpt[k * nq + q]) * ((double)probe_qkv(in, k, kK, n) + probe_qkv(in, key_base + k, kK, n));
    });
    CHECK(lab_probe_compare("dQ = bf(dP^T)^T K", g_dq, ref, mag, nq, kHS) == 0,
          "dQ = bf(dS) K: dS staged from words into [128 queries][136] at both warpgroups' key offsets, 64 query rows"
          " at a time over 128 keys, K N-major across its two boxes");
    /* the same dQ through the swizzled tile and the reduce-adds: rows < T of the probed head bit-equal to the
       registers (added to zeros), every other element of the accumulator still 0 */
    size_t wrong_rows = 0, stray = 0;
    for (int hh = 0; hh < ps.NH; hh++)
        for (int q = 0; q < ps.T; q++)
            for (int n = 0; n < kHS; n++) {
                const float got = h_acc[((size_t)hh * ps.T + q) * kHS + n];
                if (hh == in.head) {
                    if (!(got == g_dq[q * kHS + n])) {
                        if (wrong_rows++ < 3)
                            printf("  dq_acc[head %d][%d][%d] = %.6g, want %.6g (the register value)\n", hh, q, n,
                                   got, g_dq[q * kHS + n]);
                    }
                } else if (got != 0.f) {
                    stray++;
                }
            }
    printf("  dQ via the tile and TMA reduce-add: %zu of %d wrong in the probed head, %zu non-zero elsewhere\n",
           wrong_rows, ps.T * kHS, stray);
    CHECK(wrong_rows == 0, "dQ through the 16 KB swizzled FP32 tile (two 8 KB boxes of 32 columns x 64 rows) and two"
          " TMA reduce-adds per 64 rows equals the register dQ bit for bit (rows < T)");
    CHECK(stray == 0, "the reduce-adds wrote nothing outside the probed head's rows < T (rows past T are outside the"
          " 64-row boxes' map)");
    free(ref); free(mag); free(h); free(h_acc);
    probe_inputs_free(&in);
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_acc));
}

static void run_child(int child) {
    lab_child_begin("hopper_bwd64_wide", 0x243F6A8885A308D3ull + (unsigned long long)child);
    if (child == 0) {
        layout_probe();
        return;
    }
    cudaStream_t st;
    cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (child == 1 || child == 2) {
        const AttnMode mode = child == 1 ? ATTN_BF16 : ATTN_REPAIR;
        /* T = 1, T < 128, T = one step, one past it, T not a multiple of 128, 1024, 2048; B, NH > 1; sharp softmax;
           key offsets */
        const CheckCase cases[] = {
            {mode, {1, 1, 1, 64}, 1.f, 0.f},     {mode, {2, 3, 1, 64}, 1.f, 0.f},    {mode, {1, 1, 77, 64}, 1.f, 0.f},
            {mode, {2, 3, 77, 64}, 1.f, 0.f},    {mode, {2, 2, 128, 64}, 1.f, 0.f},  {mode, {2, 2, 129, 64}, 1.f, 0.f},
            {mode, {2, 3, 1000, 64}, 1.f, 0.f},  {mode, {2, 2, 1024, 64}, 1.f, 0.f}, {mode, {1, 3, 2048, 64}, 1.f, 0.f},
            {mode, {4, 8, 257, 64}, 1.f, 0.f},
            {mode, {1, 4, 500, 64}, 8.f, 0.f},   /* sharp softmax (q x8) */
            {mode, {2, 4, 1000, 64}, 1.f, 20.f}, /* K += 20 u */
            {mode, {1, 4, 777, 64}, 8.f, 20.f},  /* both, odd T */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(cases[i], 0, st);
    } else {
        const CheckCase bench[] = {{ATTN_BF16, {8, 16, 1024, 64}, 1.f, 0.f}, {ATTN_BF16, {4, 16, 2048, 64}, 1.f, 0.f}};
        for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_case(bench[i], 1, st);
    }
    cudaCheck(cudaStreamDestroy(st));
}

int main(int argc, char** argv) {
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the cases are fixed in run_child()", argv[0]);
    printf("hopper_bwd64_wide: the production HS-64 key-major backward with 128-query steps (bf16, repair;"
           " attention/cuda/hopper/attention_hopper_bwd.cu) vs force_portable; the probe, the bf16 checks, the repair checks and"
           " the benchmark shapes each in its own process\n");
    static const char* kChildName[4] = {"the layout probe", "the bf16 checks", "the repair checks",
                                        "the benchmark shapes and timings"};
    return lab_run_children("hopper_bwd64_wide", 4, kChildName, run_child, 1);
}
