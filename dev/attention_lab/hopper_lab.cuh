/*
 * dev/attention_lab/hopper_lab.cuh - the host scaffolding the Hopper attention labs share (hopper_fwd,
 * hopper_rows, hopper_bwd64_wide, hopper_bwd_gproj, hopper_bwd64_fp32 and the HS-128 labs hopper_bwd128,
 * hopper_bwd128_gproj, hopper_bwd128_fp32, hopper_rows128): seeded inputs, the BF16-ulp comparison of two
 * dqkv buffers, median timing, the refusal to run off sm_90, the layout probes' host products and their
 * comparison, the hang record, and main's one process per group of checks.
 *
 * Why: every lab checks a Hopper kernel against a reference in the same way, so one copy of these helpers
 * serves them all (a fix, say of the ulp floor, reaches every lab). Host code only: no kernels and no
 * device globals, so the labs build for any NVCC_ARCH and it adds nothing to any lab's device code. The
 * device-side building blocks (wgmma, TMA, mbarriers) and the TMA tensor maps (encode_head_map) are in
 * attention/cuda/hopper/hopper_wgmma.cuh. One lab = one translation unit, so the file-local (static) state is the lab's.
 *
 * Offers:
 *   g_rng, normal01                 - the lab's seeded generator (main seeds g_rng) and one standard normal;
 *   random_qkv_bits, random_qkv_offset_bits, random_bf16_bits - host inputs of standard normals as BF16 bits
 *                                     (q optionally scaled, keys optionally offset along a per-head direction);
 *   bf16_ulp, median_ms, median_d   - one BF16 ulp at max(|x|, floor); the median of n timings or doubles (sorts v);
 *   lab_sigma_dp                    - the scale of dP - D of a case's inputs (sqrt(HS) rms(dO) rms(V));
 *   lab_worst_key_sum               - gproj's identity: max over heads of ||sum_j dK_j|| / ||dK||;
 *   lab_alloc_poisoned, lab_upload, lab_download - device buffers filled with NaN (0xFF bytes) or with a host
 *                                     copy; a host copy of a device buffer;
 *   LabBwdCase (lab_bwd_case_make / _free, lab_bwd_dispatch_ok, lab_bwd_forward, lab_bwd_portable,
 *               lab_bwd_default, lab_bwd_run_both) - a backward check's inputs, forward results, the
 *                                     reference's and the default path's poisoned dqkv and workspace, and
 *                                     the runs on them;
 *   LabCase, lab_bwd_case_random    - a case (shape, q scale, key offset) and a LabBwdCase on its random inputs;
 *   lab_check_ws_layout             - CHECKs the workspace layout (dq_acc, D, lambda) the labs read;
 *   SlotDiff, compare_slot          - slot (0 q, 1 k, 2 v) of two dqkv buffers in BF16 ulps of the row scale;
 *   require_sm90                    - dies with a hint unless device 0 is sm_90 (the kernels are sm_90a-only);
 *   kProbeTol, probe_product, probe_compare - the host side of the 64 x 64 layout-probe checks
 *                                     (lab_probe_product, lab_probe_compare and both in lab_probe_check: any
 *                                     rows x cols);
 *   ProbeInputs (probe_inputs_make / _make_shape / _free, probe_qkv, probe_dout) - the backward probes' one-head
 *                                     inputs;
 *   keymajor_probe_scores, keymajor_probe_products, fp32_keymajor_probe_products - the scores (S^T, dP^T)
 *                                     and the products of the key-major backwards' probes, checked;
 *   lab_watch_hangs, lab_sync_or_report - the hang record (AttnHopperHang, hopper_lab_hooks.cuh) of every
 *                                     production and probe object installed in host-mapped memory, and a
 *                                     synchronisation that stops with the hung barrier's name or the CUDA error;
 *   lab_run_children, lab_child_report_and_exit, lab_child_begin, lab_child_sync_or_fail - main's one
 *                                     process per group of checks, counts through a pipe; a child's start
 *                                     (seed, device, hang record) and its synchronisation check.
 */
#ifndef DEV_ATTENTION_LAB_HOPPER_LAB_CUH
#define DEV_ATTENTION_LAB_HOPPER_LAB_CUH

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
#include "dev/attention_lab/hopper_probes.cuh"
#include "attention/support/attn_cases.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"

/* Inputs: standard normals from the attention library's seeded generator (attention/support/attn_cases.h). */
static AttnRng g_rng; /* seeded at the start of main */
static inline float normal01(void) { return (float)attn_rng_normal(&g_rng); }

/* qkv [B, T, 3, NH, HS] of standard normals as BF16 bits (malloc'd), the q slot scaled by q_scale (> 1
   sharpens the softmax). Draws in memory order, so a lab's inputs depend only on its seed and calls. */
static inline uint16_t* random_qkv_bits(AttnShape s, float q_scale) {
    const size_t nqkv = attn_qkv_count(s), row = 3ull * s.NH * s.HS;
    uint16_t* h = (uint16_t*)mallocCheck(nqkv * 2);
    for (size_t i = 0; i < nqkv; i++) {
        const int is_q = (i % row) < (size_t)s.NH * s.HS;
        h[i] = float_to_bf16_bits(normal01() * (is_q ? q_scale : 1.f));
    }
    return h;
}
/* qkv as random_qkv_bits plus a key offset: k += key_offset * u_h, u_h a random unit vector per head (the
   NH unit vectors are drawn first, always, then qkv in memory order). The offset adds the same
   key_offset * (q . u_h) to every score of a query row: large logits that softmax must cancel exactly. */
static inline uint16_t* random_qkv_offset_bits(AttnShape s, float q_scale, float key_offset) {
    enum { kQ = 0, kK = 1 };
    float* unit = (float*)mallocCheck((size_t)s.NH * s.HS * sizeof(float));
    for (int h = 0; h < s.NH; h++) {
        double n2 = 0;
        for (int d = 0; d < s.HS; d++) {
            unit[h * s.HS + d] = normal01();
            n2 += (double)unit[h * s.HS + d] * unit[h * s.HS + d];
        }
        for (int d = 0; d < s.HS; d++) unit[h * s.HS + d] = (float)(unit[h * s.HS + d] / sqrt(n2));
    }
    const size_t nqkv = attn_qkv_count(s), row = 3ull * s.NH * s.HS;
    uint16_t* h_qkv = (uint16_t*)mallocCheck(nqkv * 2);
    for (size_t i = 0; i < nqkv; i++) {
        const size_t in_row = i % row;
        const int slot = (int)(in_row / ((size_t)s.NH * s.HS));
        const int h = (int)(in_row / s.HS) % s.NH, d = (int)(in_row % s.HS);
        float x = normal01();
        if (slot == kQ) x *= q_scale;
        if (slot == kK) x += key_offset * unit[h * s.HS + d];
        h_qkv[i] = float_to_bf16_bits(x);
    }
    free(unit);
    return h_qkv;
}
/* n standard normals as BF16 bits (malloc'd): dout and other plain inputs. */
static inline uint16_t* random_bf16_bits(size_t n) {
    uint16_t* h = (uint16_t*)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = float_to_bf16_bits(normal01());
    return h;
}

/* One BF16 ulp (8 significant bits) at the magnitude max(|x|, floor). The floor is the RMS of the reference
   row: entries near zero come from cancellation, and their error scales with the row, not with the entry.
   Zero for an all-zero row. */
static inline double bf16_ulp(double x, double floor_mag) {
    const double a = fmax(fabs(x), floor_mag);
    return a > 0 ? ldexp(1.0, (int)floor(log2(a)) - 7) : 0.0;
}

/* The median of n timings (insertion sort of v in place: n is a few dozen). */
static inline float median_ms(float* v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const float tmp = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tmp;
        }
    return v[n / 2];
}

/* The median of n doubles (v sorted in place by qsort: n may be millions of rows); 0 for n = 0. */
static inline double median_d(double* v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof(double), [](const void* a, const void* b) {
        const double x = *(const double*)a, y = *(const double*)b;
        return (x > y) - (x < y);
    });
    return v[n / 2];
}

/* gproj's identity check: the largest over heads of ||sum_j dK_j|| / ||dK|| of a dqkv [B, T, 3, NH, HS] as
   BF16 bits (0 up to the BF16 output rounding for gproj; O(1) for the other modes). HS up to 128. */
static inline double lab_worst_key_sum(const uint16_t* dqkv, AttnShape s) {
    constexpr int kMaxHS = 128, kKSlot = 1; /* q, k, v */
    if (s.HS > kMaxHS) die("lab_worst_key_sum: HS %d > %d\n  hint: raise kMaxHS", s.HS, kMaxHS);
    double worst = 0;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            double sum[kMaxHS] = {0}, sq = 0;
            for (int tok = 0; tok < s.T; tok++) {
                const size_t base = ((size_t)b * s.T + tok) * 3 * s.NH * s.HS + ((size_t)kKSlot * s.NH + h) * s.HS;
                for (int d = 0; d < s.HS; d++) {
                    const double x = bf16_bits_to_float(dqkv[base + d]);
                    sum[d] += x;
                    sq += x * x;
                }
            }
            double n2 = 0;
            for (int d = 0; d < s.HS; d++) n2 += sum[d] * sum[d];
            if (sq > 0) worst = fmax(worst, sqrt(n2 / sq));
        }
    return worst;
}

/* The scale of dP - D of the inputs (BF16 bits, qkv [B, T, 3, NH, HS] and dout [B, T, NH, HS]):
   sigma_dP = sqrt(HS) rms(dO) rms(V), the V slot's square sum over the count of dout's elements (as many). */
static inline double lab_sigma_dp(const uint16_t* h_qkv, const uint16_t* h_dout, AttnShape s) {
    constexpr int kVSlot = 2; /* q, k, v */
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    double sq_do = 0, sq_v = 0;
    const size_t row = 3ull * s.NH * s.HS;
    for (size_t i = 0; i < nqkv; i++) {
        const int slot = (int)((i % row) / ((size_t)s.NH * s.HS));
        if (slot == kVSlot) sq_v += (double)bf16_bits_to_float(h_qkv[i]) * bf16_bits_to_float(h_qkv[i]);
    }
    for (size_t i = 0; i < nout; i++) sq_do += (double)bf16_bits_to_float(h_dout[i]) * bf16_bits_to_float(h_dout[i]);
    return sqrt((double)s.HS) * sqrt(sq_do / nout) * sqrt(sq_v / nout);
}

/* A device buffer of `bytes` filled with 0xFF bytes: NaN as BF16 (0xFFFF) and as FP32 (0xFFFFFFFF), so
   whatever a kernel leaves unwritten shows in the checks. */
template <typename T>
static void lab_alloc_poisoned(T** dev, size_t bytes) {
    cudaCheck(cudaMalloc(dev, bytes));
    cudaCheck(cudaMemset(*dev, 0xFF, bytes));
}
/* A device buffer holding a copy of `bytes` of host memory. */
template <typename T>
static void lab_upload(T** dev, const void* host, size_t bytes) {
    cudaCheck(cudaMalloc(dev, bytes));
    cudaCheck(cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice));
}
/* A host copy (malloc'd) of `bytes` of device memory. */
static inline void* lab_download(const void* dev, size_t bytes) {
    void* host = mallocCheck(bytes);
    cudaCheck(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return host;
}

/* One backward check's inputs and buffers: the host inputs (qkv, dout as BF16 bits; lab_bwd_case_make takes
   them over) and their device copies, the forward's out and stats, the dqkv and workspace (mode's size) of the
   reference (ref: the force_portable backward) and of the default path (def), those four filled with NaN
   (lab_alloc_poisoned), and the two paths' options. */
struct LabBwdCase {
    AttnMode mode;
    AttnShape s;
    uint16_t *h_qkv, *h_dout;
    __nv_bfloat16 *qkv, *dout, *out, *dqkv_ref, *dqkv_def;
    float* stats;
    void *ws_ref, *ws_def;
    AttnOptions opt, portable; /* the default options; force_portable */
};
static inline LabBwdCase lab_bwd_case_make(AttnMode mode, AttnShape s, uint16_t* h_qkv, uint16_t* h_dout) {
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode);
    LabBwdCase c;
    c.mode = mode;
    c.s = s;
    c.h_qkv = h_qkv;
    c.h_dout = h_dout;
    lab_upload(&c.qkv, h_qkv, nqkv * 2);
    lab_upload(&c.dout, h_dout, nout * 2);
    cudaCheck(cudaMalloc(&c.out, nout * 2));
    cudaCheck(cudaMalloc(&c.stats, attn_stats_count(s) * 4));
    lab_alloc_poisoned(&c.dqkv_ref, nqkv * 2);
    lab_alloc_poisoned(&c.dqkv_def, nqkv * 2);
    lab_alloc_poisoned(&c.ws_ref, ws_bytes);
    lab_alloc_poisoned(&c.ws_def, ws_bytes);
    c.opt = AttnOptions{};
    c.portable = AttnOptions{};
    c.portable.force_portable = 1;
    return c;
}
static inline void lab_bwd_case_free(LabBwdCase* c) {
    free(c->h_qkv); free(c->h_dout);
    cudaCheck(cudaFree(c->qkv)); cudaCheck(cudaFree(c->dout));
    cudaCheck(cudaFree(c->out)); cudaCheck(cudaFree(c->stats));
    cudaCheck(cudaFree(c->dqkv_ref)); cudaCheck(cudaFree(c->dqkv_def));
    cudaCheck(cudaFree(c->ws_ref)); cudaCheck(cudaFree(c->ws_def));
}
/* A backward check's case: its shape and its inputs' draw (random_qkv_offset_bits). */
struct LabCase {
    AttnShape s;
    float q_scale;
    float key_offset; /* |K offset| added to every key of a head along a random unit vector */
};
/* lab_bwd_case_make on fresh inputs: qkv from random_qkv_offset_bits(in.s, in.q_scale, in.key_offset), then
   dout standard normals, drawn in that order from g_rng. */
static inline LabBwdCase lab_bwd_case_random(AttnMode mode, LabCase in) {
    uint16_t* h_qkv = random_qkv_offset_bits(in.s, in.q_scale, in.key_offset);
    uint16_t* h_dout = random_bf16_bits(attn_out_count(in.s));
    return lab_bwd_case_make(mode, in.s, h_qkv, h_dout);
}
/* 1 if the case's default backward takes the Hopper path and force_portable the portable one. */
static inline int lab_bwd_dispatch_ok(const LabBwdCase& c) {
    return attention_backward_cuda_path(c.mode, c.opt, c.s, c.qkv, c.dout) == ATTN_BWD_HOPPER &&
           attention_backward_cuda_path(c.mode, c.portable, c.s, c.qkv, c.dout) == ATTN_BWD_PORTABLE;
}
/* The case's forward with options `fwd` (its out and stats), on `st`. */
static inline void lab_bwd_forward(const LabBwdCase& c, AttnOptions fwd, cudaStream_t st) {
    attention_forward_cuda(c.mode, fwd, c.s, c.qkv, c.out, c.stats, NULL, st);
}
/* The force_portable backward into the reference's dqkv and workspace, on `st`. */
static inline void lab_bwd_portable(const LabBwdCase& c, cudaStream_t st) {
    attention_backward_cuda(c.mode, c.portable, c.s, c.qkv, c.out, c.stats, c.dout, c.dqkv_ref, c.ws_ref, st);
}
/* The default backward into the default path's dqkv and workspace, on `st`. */
static inline void lab_bwd_default(const LabBwdCase& c, cudaStream_t st) {
    attention_backward_cuda(c.mode, c.opt, c.s, c.qkv, c.out, c.stats, c.dout, c.dqkv_def, c.ws_def, st);
}
/* The forward with options `fwd`, then the force_portable and the default backward, on `st`. */
static inline void lab_bwd_run_both(const LabBwdCase& c, AttnOptions fwd, cudaStream_t st) {
    lab_bwd_forward(c, fwd, st);
    lab_bwd_portable(c, st);
    lab_bwd_default(c, st);
}

/* CHECKs that mode's workspace at s is dq_acc [rows * HS] + D [rows] + lambda [rows] FP32 (rows = B NH T):
   carve_workspace's layout in attention_cuda.cu, which the including lab reads; `whose` ends the CHECK's text. */
static inline void lab_check_ws_layout(AttnShape s, AttnMode mode, const char* whose) {
    const size_t rows = (size_t)s.B * s.NH * s.T, ws_bytes = attention_cuda_workspace_bytes(s, mode);
    CHECK(ws_bytes == (rows * s.HS + 2 * rows) * sizeof(float),
          "workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] fp32 (%zu bytes; %s)", ws_bytes, whose);
}

/* One slot (0 q, 1 k, 2 v) of two dqkv buffers [B, T, 3, NH, HS] (BF16 bits), compared row by row (row = one
   (b, t, h) vector of HS): NaNs on each side, elements not bit-equal, and the difference in BF16 ulps at
   max(|a|, |b|, row RMS of the reference). */
struct SlotDiff {
    size_t nan_ref, nan_new, over_1ulp, unequal, count;
    double max_ulps, max_abs;
};
static inline SlotDiff compare_slot(const uint16_t* ref, const uint16_t* got, AttnShape s, int slot) {
    SlotDiff d = {0, 0, 0, 0, 0, 0.0, 0.0};
    const size_t vecs = (size_t)s.B * s.T * s.NH;
    for (size_t v = 0; v < vecs; v++) {
        const size_t bt = v / s.NH, h = v % s.NH;
        const size_t base = bt * 3 * s.NH * s.HS + ((size_t)slot * s.NH + h) * s.HS;
        double sq = 0;
        for (int k = 0; k < s.HS; k++) {
            const double a = bf16_bits_to_float(ref[base + k]);
            if (!isnan(a)) sq += a * a;
        }
        const double rms = sqrt(sq / s.HS);
        for (int k = 0; k < s.HS; k++) {
            const double a = bf16_bits_to_float(ref[base + k]), x = bf16_bits_to_float(got[base + k]);
            d.count++;
            if (ref[base + k] != got[base + k]) d.unequal++;
            if (isnan(a)) d.nan_ref++;
            if (isnan(x)) d.nan_new++;
            if (isnan(a) || isnan(x)) continue;
            const double diff = fabs(a - x), ulp = bf16_ulp(fmax(fabs(a), fabs(x)), rms);
            const double ulps = diff == 0 ? 0 : (ulp > 0 ? diff / ulp : INFINITY);
            if (diff > d.max_abs) d.max_abs = diff;
            if (ulps > d.max_ulps) d.max_ulps = ulps;
            if (ulps > 1.0) d.over_1ulp++;
        }
    }
    return d;
}

/* Device 0's properties; dies naming `lab` unless there is a device and it is sm_90 (wgmma, TMA and
   setmaxnreg are sm_90a instructions: elsewhere the kernels cannot run). */
static inline cudaDeviceProp require_sm90(const char* lab) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) die("%s: no CUDA device found", lab);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9 || prop.minor != 0) {
        die("%s: device 0 is %s (sm_%d%d); this program is built for sm_90a only\n"
            "  hint: run it on an H100 or H200", lab, prop.name, prop.major, prop.minor);
    }
    return prop;
}

/* ---- layout probes: a kernel's GEMM building blocks on one 64 x 64 tile against double loops ---- */

/* FP32-accumulation error bound relative to the sum of |products| (64 terms: ~1e-6 when right); a layout
   error is off by O(1). */
static const double kProbeTol = 1e-4;

/* ref[i][j] = sum_k term(i, j, k) and mag[i][j] = sum_k |term(i, j, k)| (k ascending) over a rows x cols
   product, row-major: the host product a probe output is checked against (any shape: the HS-128 probes'
   128-row and 128-column outputs). */
template <typename Term>
static void lab_probe_product(double* ref, double* mag, int rows, int cols, int depth, Term term) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double r = 0, m = 0;
            for (int k = 0; k < depth; k++) {
                const double p = term(i, j, k);
                r += p;
                m += fabs(p);
            }
            ref[i * cols + j] = r;
            mag[i * cols + j] = m;
        }
}
/* The same over a 64 x 64 tile. */
template <typename Term>
static void probe_product(double* ref, double* mag, int depth, Term term) {
    lab_probe_product(ref, mag, 64, 64, depth, term);
}

/* Checks one [rows x cols] probe output against a host product within kProbeTol of the sum of |products|;
   prints the first misses and a summary line; returns the number of wrong elements. */
static inline int lab_probe_compare(const char* name, const float* got, const double* ref, const double* mag,
                                    int rows, int cols) {
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < rows * cols; i++) {
        const double err = fabs(got[i] - ref[i]);
        if (!(err <= kProbeTol * mag[i] + 1e-30)) {
            if (bad++ < 3) printf("  %s[%d][%d] = %.6g, want %.6g\n", name, i / cols, i % cols, got[i], ref[i]);
        }
        const double rel = isnan(got[i]) ? INFINITY : err / (mag[i] + 1e-30);
        if (rel > worst) worst = rel;
    }
    printf("  %s: %d of %d wrong (worst error / sum|products| %.3g)\n", name, bad, rows * cols, worst);
    return bad;
}
/* lab_probe_product, then lab_probe_compare, of a [rows x cols] probe output over `depth` terms (with scratch
   of its own); returns the number of wrong elements. */
template <typename Term>
static int lab_probe_check(const char* name, const float* got, int rows, int cols, int depth, Term term) {
    double* ref = (double*)mallocCheck((size_t)rows * cols * sizeof(double));
    double* mag = (double*)mallocCheck((size_t)rows * cols * sizeof(double));
    lab_probe_product(ref, mag, rows, cols, depth, term);
    const int bad = lab_probe_compare(name, got, ref, mag, rows, cols);
    free(ref);
    free(mag);
    return bad;
}
/* The same for a [64 x 64] output. */
static inline int probe_compare(const char* name, const float* got, const double* ref, const double* mag) {
    return lab_probe_compare(name, got, ref, mag, 64, 64);
}

/* The backward probes' inputs: B1 NH3 T50 HS64 standard normals (head 1 probes the slot and head
   coordinates, T < 64 the TMA's zero fill), on the host as BF16 bits and on the device. */
struct ProbeInputs {
    AttnShape s;
    int head;
    uint16_t *h_qkv, *h_dout;
    __nv_bfloat16 *qkv, *dout;
};
/* The same at any shape and head (the HS-128 probes: B1 NH3 T100, head 1): qkv, then dout, drawn from g_rng. */
static inline ProbeInputs probe_inputs_make_shape(AttnShape s, int head) {
    ProbeInputs in;
    in.s = s;
    in.head = head;
    const size_t nqkv = attn_qkv_count(in.s), nout = attn_out_count(in.s);
    in.h_qkv = random_bf16_bits(nqkv);
    in.h_dout = random_bf16_bits(nout);
    lab_upload(&in.qkv, in.h_qkv, nqkv * 2);
    lab_upload(&in.dout, in.h_dout, nout * 2);
    return in;
}
static inline ProbeInputs probe_inputs_make(void) { return probe_inputs_make_shape(AttnShape{1, 3, 50, 64}, 1); }
static inline void probe_inputs_free(ProbeInputs* in) {
    free(in->h_qkv);
    free(in->h_dout);
    cudaCheck(cudaFree(in->qkv));
    cudaCheck(cudaFree(in->dout));
}
/* Element (token, slot 0 q / 1 k / 2 v, d) of the probed head in qkv, (token, d) in dout; tokens >= T read
   as the TMA's zero fill. */
static inline double probe_qkv(const ProbeInputs& in, int tok, int slot, int d) {
    const size_t tok_stride = 3ull * in.s.NH * in.s.HS;
    return tok < in.s.T ? (double)bf16_bits_to_float(
                              in.h_qkv[(size_t)tok * tok_stride + ((size_t)slot * in.s.NH + in.head) * in.s.HS + d])
                        : 0.0;
}
static inline double probe_dout(const ProbeInputs& in, int tok, int d) {
    return tok < in.s.T ? (double)bf16_bits_to_float(in.h_dout[(size_t)tok * in.s.NH * in.s.HS + in.head * in.s.HS + d])
                        : 0.0;
}

/* The scores of a key-major layout probe, S^T = K Q^T and dP^T = V dO^T ([nk keys][nq queries] each, head
   size in.s.HS), against double loops; bad[0], bad[1]: their wrong elements. */
static inline void keymajor_probe_scores(const ProbeInputs& in, int nk, int nq, const float* g_st, const float* g_dpt,
                                         int bad[2]) {
    enum { kQ = 0, kK = 1, kV = 2 };
    const int hs = in.s.HS;
    /* S^T[key][query] = sum_d K[key][d] Q[query][d] */
    bad[0] = lab_probe_check("S^T = K Q^T", g_st, nk, nq, hs, [&](int i, int j, int d) {
        return probe_qkv(in, i, kK, d) * probe_qkv(in, j, kQ, d);
    });
    /* dP^T[key][query] = sum_d V[key][d] dO[query][d] */
    bad[1] = lab_probe_check("dP^T = V dO^T", g_dpt, nk, nq, hs, [&](int i, int j, int d) {
        return probe_qkv(in, i, kV, d) * probe_dout(in, j, d);
    });
}

/* The five products of a bf16/repair key-major layout probe (nk keys x nq queries, head size in.s.HS), each
   against double loops over the same BF16 values (the kernel's own S^T, dP^T, rounded to BF16 as it rounds
   them, for the register-A and staged-A products): S^T, dP^T [nk][nq]; dV = bf(S^T) dO, dK = bf(dP^T) Q
   [nk][HS]; dQ = bf(dP^T)^T K [nq][HS]. bad[k]: wrong elements of product k (the callers CHECK them with
   what each product exercises). */
static inline void keymajor_probe_products(const ProbeInputs& in, int nk, int nq, const float* g_st,
                                           const float* g_dpt, const float* g_dv, const float* g_dk,
                                           const float* g_dq, int bad[5]) {
    enum { kQ = 0, kK = 1 };
    const int hs = in.s.HS;
    keymajor_probe_scores(in, nk, nq, g_st, g_dpt, bad);
    /* dV[key][n] = sum_q bf(S^T[key][q]) dO[q][n] */
    bad[2] = lab_probe_check("dV = bf(S^T) dO", g_dv, nk, hs, nq, [&](int i, int n, int q) {
        return bf16_round(g_st[i * nq + q]) * probe_dout(in, q, n);
    });
    /* dK[key][n] = sum_q bf(dP^T[key][q]) Q[q][n] */
    bad[3] = lab_probe_check("dK = bf(dP^T) Q", g_dk, nk, hs, nq, [&](int i, int n, int q) {
        return bf16_round(g_dpt[i * nq + q]) * probe_qkv(in, q, kQ, n);
    });
    /* dQ[q][n] = sum_key bf(dP^T[key][q]) K[key][n] */
    bad[4] = lab_probe_check("dQ = bf(dP^T)^T K", g_dq, nq, hs, nk, [&](int q, int n, int k) {
        return bf16_round(g_dpt[k * nq + q]) * probe_qkv(in, k, kK, n);
    });
}

/* The BF16 split of an FP32 value as fp32 mode's kernels make it: term 0 = bf(x), 1 = bf(x - bf(x)),
   2 = bf(r - bf(r)) with r = x - bf(x) (each difference exact in FP32). */
static inline double fp32_split_term(float x, int term) {
    const float hi = bf16_round(x), r1 = x - hi;
    if (term == 0) return hi;
    const float r1_hi = bf16_round(r1);
    if (term == 1) return r1_hi;
    return bf16_round(r1 - r1_hi);
}

/* The seven products of fp32 mode's key-major layout probe (hopper_bwd64_fp32 and hopper_bwd128_fp32: nk keys
   x nq queries, head size in.s.HS), each against double loops over the same BF16 values (the kernel's own S^T,
   dP^T split as it splits them): tiles S^T, dP^T [nk][nq]; dV = two terms of S^T times dO and dK = two terms of
   dP^T times Q [nk][HS]; dQ over the three terms of dP^T, and its second and third terms alone, [nq][HS].
   bad[k]: wrong elements of product k (the callers CHECK them with what each product exercises). */
static inline void fp32_keymajor_probe_products(const ProbeInputs& in, int nk, int nq, const float* g_st,
                                                const float* g_dpt, const float* g_dv, const float* g_dk,
                                                const float* g_dq, const float* g_dq_lo, const float* g_dq_lo2,
                                                int bad[7]) {
    enum { kQ = 0, kK = 1 };
    const int hs = in.s.HS;
    keymajor_probe_scores(in, nk, nq, g_st, g_dpt, bad);
    /* two-term products: per q both terms (both |.| in the sum of |products|) */
    auto two_terms = [&](const float* x, int i, int q, double b) {
        return (fp32_split_term(x[i * nq + q], 0) + fp32_split_term(x[i * nq + q], 1)) * b;
    };
    bad[2] = lab_probe_check("dV = (bf(S^T) + bf(S^T - bf(S^T))) dO", g_dv, nk, hs, nq, [&](int i, int n, int q) {
        return two_terms(g_st, i, q, probe_dout(in, q, n));
    });
    bad[3] = lab_probe_check("dK = (bf(dP^T) + bf(r1)) Q", g_dk, nk, hs, nq, [&](int i, int n, int q) {
        return two_terms(g_dpt, i, q, probe_qkv(in, q, kQ, n));
    });
    /* dQ[q][n] = sum_key (terms of dP^T[key][q]) K[key][n] */
    auto dq_terms = [&](int q, int n, int k) {
        const float x = g_dpt[k * nq + q];
        return (fp32_split_term(x, 0) + fp32_split_term(x, 1) + fp32_split_term(x, 2)) * probe_qkv(in, k, kK, n);
    };
    bad[4] = lab_probe_check("dQ = (bf(dP) + bf(r1) + bf(r1 - bf(r1)))^T K", g_dq, nq, hs, nk, dq_terms);
    bad[5] = lab_probe_check("dQ, the bf(r1) tile alone", g_dq_lo, nq, hs, nk, [&](int q, int n, int k) {
        return fp32_split_term(g_dpt[k * nq + q], 1) * probe_qkv(in, k, kK, n);
    });
    bad[6] = lab_probe_check("dQ, the bf(r1 - bf(r1)) tile alone", g_dq_lo2, nq, hs, nk, [&](int q, int n, int k) {
        return fp32_split_term(g_dpt[k * nq + q], 2) * probe_qkv(in, k, kK, n);
    });
}

/* ---- the hang record of the production Hopper objects and the probe objects
   (attention/cuda/hopper/hopper_lab_hooks.cuh, dev/attention_lab/hopper_probes.cuh) ---- */

/* "kv_full (K/V tiles)", ...; "none" for ATTN_HANG_NONE or an unknown site. */
static inline const char* attn_hopper_hang_site_name(int site) {
    switch (site) {
        case ATTN_HANG_KV_FULL: return "kv_full (K/V tiles)";
        case ATTN_HANG_FULL: return "full (Q/dO tile + row state)";
        case ATTN_HANG_EMPTY: return "empty (stage released by the consumers)";
        case ATTN_HANG_PROBE: return "probe tiles";
        case ATTN_HANG_KV_EMPTY: return "kv_empty / q_empty (an item's tiles released by the consumers)";
        default: return "none";
    }
}

/* The record lives in pinned host memory mapped into the device, so it can be read whatever became of the
   kernel's results or the context (a producer trap kills the context; a consumer that gives up lets the
   kernel finish with NaN rows, so a hang need not be a CUDA error at all). */
static AttnHopperHang* g_lab_hang = NULL;
static inline void lab_watch_hangs(void) {
    cudaCheck(cudaHostAlloc((void**)&g_lab_hang, sizeof(AttnHopperHang), cudaHostAllocMapped));
    memset(g_lab_hang, 0, sizeof(AttnHopperHang));
    AttnHopperHang* dev = NULL;
    cudaCheck(cudaHostGetDevicePointer((void**)&dev, g_lab_hang, 0));
    /* every object whose waits are bounded has its own record pointer: one record for all of them */
    void (*const install[])(AttnHopperHang*) = {
        attention_hopper_bwd_watch_hangs, attention_hopper_bwd128_watch_hangs, attention_hopper_rows_watch_hangs,
        attention_hopper_rows128_watch_hangs,
        attention_hopper_gproj_keys_watch_hangs, attention_hopper_gproj_keys128_watch_hangs,
        attention_hopper_fp32_keys_watch_hangs, attention_hopper_fp32_keys128_watch_hangs,
        attention_hopper_probe_keys64_watch_hangs, attention_hopper_probe_keys128_watch_hangs,
        attention_hopper_probe_keys64_gproj_watch_hangs, attention_hopper_probe_keys128_gproj_watch_hangs,
        attention_hopper_probe_keys64_fp32_watch_hangs, attention_hopper_probe_keys128_fp32_watch_hangs,
        attention_hopper_probe_rows128_watch_hangs};
    for (auto fn : install) fn(dev);
}
/* After a synchronisation `e`: 0 if it succeeded and no barrier hung; else prints a FAIL line naming the barrier
   (if one hung; its text ends with `hang_tail`, what the kernel does when a wait runs out, closing parenthesis
   included) and one naming the CUDA error (if any; its text ends with `error_tail`), and returns 1. */
static inline int lab_fail_on_hang_or_error(cudaError_t e, const char* where, const char* hang_tail,
                                            const char* error_tail) {
    const volatile AttnHopperHang* r = g_lab_hang;
    const int hung = r != NULL && r->site != ATTN_HANG_NONE;
    if (e == cudaSuccess && !hung) return 0;
    if (hung)
        CHECK(0, "HANG in %s: mbarrier %s never completed (index %d, parity %d, block (%d, %d), thread %d%s", where,
              attn_hopper_hang_site_name(r->site), r->index, r->parity, r->block_x, r->block_y, r->thread, hang_tail);
    if (e != cudaSuccess) CHECK(0, "CUDA error after %s: %s%s", where, cudaGetErrorString(e), error_tail);
    return 1;
}
/* After a synchronisation `e` (cudaDeviceSynchronize, an event wait): returns if it succeeded and no barrier
   hung; else prints a FAIL line naming the barrier (if one hung), the lab's summary line, and dies with the
   CUDA error, if any (the results, or the context, are gone). */
static inline void lab_sync_or_report(cudaError_t e, const char* lab, const char* where) {
    if (!lab_fail_on_hang_or_error(e, where, ")", "")) return;
    test_summary();
    die("%s: stopped after %s\n  hint: a HANG line names the mbarrier that never completed (a pipeline protocol"
        " bug); otherwise run under compute-sanitizer", lab, where);
}

/* ---- one process per group of checks ---- */

/* The child's end of the pipe to the parent (lab_run_children sets it in each child). */
static int g_lab_report_fd = -1;

/* Sends this child's pass/fail counts to the parent and ends the process (also the way out of a child after a
   fatal error: the counts so far still reach the parent). */
static inline void lab_child_report_and_exit(void) {
    const int counts[2] = {g_tests_passed, g_tests_failed};
    fflush(stdout);
    fflush(stderr);
    if (g_lab_report_fd < 0 || write(g_lab_report_fd, counts, sizeof counts) != (ssize_t)sizeof counts) _exit(3);
    _exit(0);
}

/* The start of a child's checks: g_rng seeded with `seed`, device 0 required to be sm_90 (require_sm90, naming
   `lab`), the hang record installed (lab_watch_hangs). */
static inline void lab_child_begin(const char* lab, unsigned long long seed) {
    attn_rng_init(&g_rng, seed);
    require_sm90(lab);
    lab_watch_hangs();
}
/* The synchronisation check of a child: as lab_sync_or_report, but on a hang or a CUDA error the child reports
   its counts and ends (lab_child_report_and_exit) after the FAIL lines; `hang_tail` ends the HANG line. */
static inline void lab_child_sync_or_fail(cudaError_t e, const char* where, const char* hang_tail) {
    if (lab_fail_on_hang_or_error(e, where, hang_tail, " (hint: run under compute-sanitizer)"))
        lab_child_report_and_exit();
}

/* Runs run(i) for i = 0 .. n - 1, each in a child process of its own (announce: first a line "=== name[i]"),
   the child reporting its counts through a pipe; prints each child's counts (or a FAIL line for one that
   ended without reporting, counted as one failure) and the lab's final "N passed, N failed" line; returns
   main's exit status. The parent never touches CUDA: each child gets a fresh context, so a fault or a hang
   report in one costs that child's results only. */
static inline int lab_run_children(const char* lab, int n, const char* const* name, void (*run)(int), int announce) {
    int passed = 0, failed = 0;
    for (int child = 0; child < n; child++) {
        const char* what = name[child];
        int fds[2];
        if (pipe(fds) != 0) die("%s: pipe() failed\n  hint: out of file descriptors?", lab);
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) die("%s: fork() failed\n  hint: out of processes or memory?", lab);
        if (pid == 0) {
            close(fds[0]);
            g_lab_report_fd = fds[1];
            if (announce) printf("=== %s\n", what);
            run(child);
            lab_child_report_and_exit();
        }
        close(fds[1]);
        int counts[2] = {0, 0};
        const ssize_t got = read(fds[0], counts, sizeof counts);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (got != (ssize_t)sizeof counts) {
            printf("  FAIL %s: its process ended without reporting (%s %d); the checks after its last line did"
                   " not run\n", what, WIFSIGNALED(status) ? "signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            failed++;
        } else {
            printf("  %s: %d passed, %d failed (this process)\n", what, counts[0], counts[1]);
            passed += counts[0];
            failed += counts[1];
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

#endif /* DEV_ATTENTION_LAB_HOPPER_LAB_CUH */
