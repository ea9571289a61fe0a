/*
 * dev/attention_lab/hopper_rows.cu - lab of the production Hopper (sm_90a) row pass of the backward
 * (attention/cuda/hopper/attention_hopper_rows.cu: gproj's lambda and all of gproj's dQ, fp32's D, on wgmma + TMA, head
 * size 64): its layout probe, then attention_backward_cuda on the Hopper path (the default on sm_90, which
 * runs this row pass in attn_bwd_rows_kernel's place) against the same call with force_portable = 1, per
 * quantity (D, lambda from the workspaces; dQ), and timed. The kernel lives in the library only; this file
 * is host code (checks and timing) and builds for any NVCC_ARCH, but refuses to run off sm_90.
 *
 * Next experiment: overlap the DSK/PK GEMMs of one key tile with S/dP of the next, with a producer
 * warpgroup and setmaxnreg to hold both (docs/attention_kernels.md, "Not done"); this lab's checks (D, lambda
 * bit-equal to the portable row pass, dQ within 8 ulps) and timings are the ones it must pass and beat.
 *
 * The workspace layout it reads back (carve_workspace in attention/cuda/attention_cuda.cu, internal there):
 * dq_acc [rows * HS] fp32, then D [rows], then lambda [rows], rows = B*NH*T, row (b*NH + h)*T + t; the size
 * is checked against attention_cuda_workspace_bytes and NaN poison shows an unwritten slot.
 *
 * Usage: hopper_rows   (no arguments; needs an sm_90 GPU: H100/H200). Ends with "N passed, N failed".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
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

typedef __nv_bfloat16 bf16;
static const int kHS = 64; /* the head size the Hopper row pass serves */
static const int kBlockQ = ATTN_HOPPER_ROWS_PROBE_ROWS;  /* query rows of the probe tile */
static const int kBlockK = ATTN_HOPPER_ROWS_PROBE_ROWS;  /* keys of the probe tile */
enum { kSlotQ = 0, kSlotK = 1, kSlotV = 2 }; /* the 3 of qkv [B, T, 3, NH, HS] */

/* The production backward's workspace layout (carve_workspace in attention/cuda/attention_cuda.cu, internal
   there): dq_acc [rows * HS] fp32, then D [rows], then lambda [rows], rows = B*NH*T, row index
   (b*NH + h)*T + t. The checks verify it: the size against attention_cuda_workspace_bytes, and the NaN
   poison of both workspaces shows a D or lambda slot that a path left unwritten. */
struct RowsWorkspace {
    float* D;
    float* lambda;
};
static size_t rows_of(AttnShape s) { return (size_t)s.B * s.NH * s.T; }
static RowsWorkspace carve_rows_workspace(AttnShape s, void* ws) {
    RowsWorkspace w;
    w.D = static_cast<float*>(ws) + rows_of(s) * s.HS;
    w.lambda = w.D + rows_of(s);
    return w;
}

/* ------------------------------------------------------------------------------------------------ */
/* host: checks (Hopper path vs force_portable), timing                                             */
/* ------------------------------------------------------------------------------------------------ */

/* Tolerances, set before any run. dQ: the two kernels sum DSK and PK in different orders inside the tensor
   core (and S, dP, so a BF16 rounding of P or dS may flip): a few BF16 ulps of the row scale (the row's RMS
   as the floor), far below the O(1) of a layout error. lambda (and fp32's D): r_i is a sum of BF16-rounded
   dS whose exact value is itself rounding noise, so one flipped rounding of dS_ij moves lambda by up to
   2^-8 |dS_ij| / p_i; compared in units u = 2^-9 sigma_dP of the head (sigma_dP = sqrt(HS) rms(dO) rms(V),
   the scale of dP - D), most rows agree exactly (same per-lane key order as production). */
static const double kMaxDqUlps = 8.0;
static const double kMaxDqRelFro = 4e-3;    /* ||dQ_new - dQ_ref||_F / ||dQ_ref||_F over the whole tensor */
static const double kMaxLambdaUnits = 16.0; /* max |dlambda| / u (a few flipped roundings in one row) */
static const double kMedLambdaUnits = 1e-2; /* median |dlambda| / u */
static const double kMaxDRel = 1e-5;        /* fp32 mode D (sum P dP, tensor-core order): |dD| / sigma_dP */
/* gproj D: dO . O, the prep kernel (portable) against the Hopper row pass, both in attn_row_d.cuh's order */
static const double kMaxDPrepRel = 0;

/* One shape: forward (gproj or fp32) for out and stats, then attention_backward_cuda with force_portable (ref)
   and on the default Hopper path (new) on the same inputs (outputs and workspaces poisoned first), D, lambda
   and dQ compared; optionally timed. */
static void check_shape(LabCase in, AttnMode mode, int time_it) {
    const AttnShape s = in.s;
    char title[200];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d q x%g key offset %g: Hopper row pass vs the portable one (%s)",
             s.B, s.NH, s.T, s.HS, in.q_scale, in.key_offset, attn_mode_name(mode));
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s), rows = rows_of(s);
    lab_check_ws_layout(s, mode, "the layout this lab assumes");
    LabBwdCase c = lab_bwd_case_random(mode, in);
    const double sigma_dp = lab_sigma_dp(c.h_qkv, c.h_dout, s); /* the scale of dP - D (hopper_lab.cuh) */
    const size_t row = 3ull * s.NH * s.HS;                   /* qkv elements per token */
    const double lambda_unit = ldexp(sigma_dp, -9);

    CHECK(lab_bwd_dispatch_ok(c),
          "dispatch: the default backward runs the Hopper row pass, force_portable the portable one");
    lab_bwd_run_both(c, c.opt, 0);
    cudaCheck(cudaDeviceSynchronize());

    const RowsWorkspace w_ref = carve_rows_workspace(s, c.ws_ref), w_new = carve_rows_workspace(s, c.ws_def);
    float* hD_ref = (float*)lab_download(w_ref.D, rows * 4);
    float* hD_new = (float*)lab_download(w_new.D, rows * 4);
    size_t nan_d_ref = 0, nan_d_new = 0, d_unequal = 0;
    double max_d = 0;
    for (size_t i = 0; i < rows; i++) {
        if (isnan(hD_ref[i])) nan_d_ref++;
        if (isnan(hD_new[i])) nan_d_new++;
        if (isnan(hD_ref[i]) || isnan(hD_new[i])) continue;
        if (hD_ref[i] != hD_new[i]) d_unequal++;
        max_d = fmax(max_d, fabs((double)hD_ref[i] - hD_new[i]) / sigma_dp);
    }
    CHECK(nan_d_ref == 0, "portable path wrote D at workspace + rows*HS floats, finite (%zu NaN: the offset is"
          " wrong)", nan_d_ref);
    CHECK(nan_d_new == 0, "Hopper path wrote every D, finite (%zu NaN)", nan_d_new);
    if (mode == ATTN_GPROJ) {
        printf("  D (prep kernel vs the Hopper row pass): %zu of %zu rows not bit-equal, max |diff| / sigma_dP %.3g\n",
               d_unequal, rows, max_d);
        CHECK(d_unequal == 0 && max_d <= kMaxDPrepRel,
              "D: the Hopper row pass forms the prep kernel's bits (%zu rows differ, max %.3g sigma_dP)", d_unequal,
              max_d);
    } else {
        printf("  D = sum P dP: max |diff| / sigma_dP %.3g, %zu of %zu rows not bit-equal\n", max_d, d_unequal, rows);
        CHECK(max_d <= kMaxDRel, "fp32 D within %.0e sigma_dP of the portable row pass (max %.3g)", kMaxDRel, max_d);
    }

    if (mode == ATTN_GPROJ) {
        float* hl_ref = (float*)lab_download(w_ref.lambda, rows * 4);
        float* hl_new = (float*)lab_download(w_new.lambda, rows * 4);
        size_t nan_l_ref = 0, nan_l_new = 0, l_unequal = 0;
        double* units = (double*)mallocCheck(rows * sizeof(double));
        size_t n_units = 0;
        double max_units = 0;
        for (size_t i = 0; i < rows; i++) {
            if (isnan(hl_ref[i])) nan_l_ref++;
            if (isnan(hl_new[i])) nan_l_new++;
            if (isnan(hl_ref[i]) || isnan(hl_new[i])) continue;
            if (hl_ref[i] != hl_new[i]) l_unequal++;
            units[n_units] = fabs((double)hl_ref[i] - hl_new[i]) / lambda_unit;
            max_units = fmax(max_units, units[n_units]);
            n_units++;
        }
        const double med_units = median_d(units, n_units);
        printf("  lambda: %zu of %zu rows not bit-equal; |diff| in units u = 2^-9 sigma_dP (%.3g): median %.3g,"
               " max %.3g\n", l_unequal, rows, lambda_unit, med_units, max_units);
        CHECK(nan_l_ref == 0, "portable path wrote lambda at workspace + rows*(HS+1) floats (%zu NaN)", nan_l_ref);
        CHECK(nan_l_new == 0, "Hopper path wrote every lambda, finite (%zu NaN)", nan_l_new);
        CHECK(med_units <= kMedLambdaUnits, "lambda: median |diff| <= %.0e u (%.3g)", kMedLambdaUnits, med_units);
        CHECK(max_units <= kMaxLambdaUnits, "lambda: max |diff| <= %.0f u (%.3g)", kMaxLambdaUnits, max_units);
        free(hl_ref); free(hl_new); free(units);

        /* dQ: the q slot of dqkv, one (b, t, h) row of HS values at a time */
        uint16_t* h_ref = (uint16_t*)lab_download(c.dqkv_ref, nqkv * 2);
        uint16_t* h_new = (uint16_t*)lab_download(c.dqkv_def, nqkv * 2);
        size_t nan_ref = 0, nan_new = 0, over_1ulp = 0;
        double max_ulps = 0, sq_diff = 0, sq_ref = 0;
        for (size_t tok = 0; tok < (size_t)s.B * s.T; tok++)
            for (int h = 0; h < s.NH; h++) {
                const size_t base = tok * row + (size_t)h * s.HS; /* q slot */
                double sq = 0;
                for (int d = 0; d < s.HS; d++) {
                    const double a = bf16_bits_to_float(h_ref[base + d]);
                    if (!isnan(a)) sq += a * a;
                }
                const double rms = sqrt(sq / s.HS);
                for (int d = 0; d < s.HS; d++) {
                    const double a = bf16_bits_to_float(h_ref[base + d]), x = bf16_bits_to_float(h_new[base + d]);
                    if (isnan(a)) nan_ref++;
                    if (isnan(x)) nan_new++;
                    if (isnan(a) || isnan(x)) continue;
                    const double diff = fabs(a - x), ulp = bf16_ulp(fmax(fabs(a), fabs(x)), rms);
                    const double ulps = diff == 0 ? 0 : (ulp > 0 ? diff / ulp : INFINITY);
                    max_ulps = fmax(max_ulps, ulps);
                    if (ulps > 1.0) over_1ulp++;
                    sq_diff += diff * diff;
                    sq_ref += a * a;
                }
            }
        const double rel_fro = sq_ref > 0 ? sqrt(sq_diff / sq_ref) : (sq_diff > 0 ? INFINITY : 0);
        printf("  dQ: max %.2f BF16 ulps (of max(|a|, |b|, row RMS)), %zu of %zu over 1 ulp; rel Frobenius diff %.3g\n",
               max_ulps, over_1ulp, nout, rel_fro);
        CHECK(nan_ref == 0, "portable path wrote every dQ, finite (%zu NaN)", nan_ref);
        CHECK(nan_new == 0, "Hopper path wrote every dQ, finite (%zu NaN left)", nan_new);
        CHECK(max_ulps <= kMaxDqUlps, "dQ within %.0f BF16 ulps of the portable path (max %.2f)", kMaxDqUlps, max_ulps);
        CHECK(rel_fro <= kMaxDqRelFro, "dQ rel Frobenius diff <= %.0e (%.3g)", kMaxDqRelFro, rel_fro);
        free(h_ref); free(h_new);
    }

    if (time_it) {
        enum { kWarmup = 3, kReps = 21 };
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        float t_bwd[kReps], t_repair[kReps], t_rows[kReps], t_new[kReps];
        /* the repair backward on the same inputs: the backward without a row pass (dQ key-major) */
        bf16 *out_rep, *dqkv_rep;
        float* stats_rep;
        cudaCheck(cudaMalloc(&out_rep, nout * 2));
        cudaCheck(cudaMalloc(&dqkv_rep, nqkv * 2));
        cudaCheck(cudaMalloc(&stats_rep, nstats * 4));
        attention_forward_cuda(ATTN_REPAIR, c.portable, s, c.qkv, out_rep, stats_rep, NULL, 0);
        auto timed = [&](float* dst, auto&& fn) {
            cudaCheck(cudaEventRecord(e0));
            fn();
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(dst, e0, e1));
        };
        auto run_bwd = [&] { lab_bwd_portable(c, 0); };
        auto run_new = [&] { lab_bwd_default(c, 0); };
        auto run_repair = [&] {
            attention_backward_cuda(ATTN_REPAIR, c.portable, s, c.qkv, out_rep, stats_rep, c.dout, dqkv_rep, c.ws_ref,
                                    0);
        };
        /* the Hopper row pass alone (both modes write D: gproj forms it from out, fp32 sums P dP) */
        const RowsWorkspace w_time = carve_rows_workspace(s, c.ws_def);
        auto run_rows = [&] {
            attention_backward_hopper_passes(ATTN_HOPPER_ROW_PASS, mode, AttnOptions{}, s, c.qkv, c.out, c.dout, c.stats, w_time.D,
                                             w_time.lambda, nullptr, c.dqkv_def, 0, 0);
        };
        for (int i = 0; i < kWarmup; i++) {
            run_bwd(); run_new(); run_repair(); run_rows();
        }
        for (int i = 0; i < kReps; i++) {
            timed(&t_bwd[i], run_bwd);
            timed(&t_new[i], run_new);
            timed(&t_repair[i], run_repair);
            timed(&t_rows[i], run_rows);
        }
        cudaCheck(cudaDeviceSynchronize());
        const int n_gemms = (mode == ATTN_GPROJ) ? 4 : 2; /* S, dP (+ DSK, PK) */
        const double flops = n_gemms * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2; /* causal */
        const float ms_bwd = median_ms(t_bwd, kReps), ms_rep = median_ms(t_repair, kReps);
        const float ms_new = median_ms(t_new, kReps), ms_rows = median_ms(t_rows, kReps);
        printf("  time (median of %d): portable %s backward %.4f ms; Hopper-row-pass %s backward %.4f ms (speed-up"
               " %.2fx); portable repair backward %.4f ms (no row pass)\n", (int)kReps, attn_mode_name(mode), ms_bwd,
               attn_mode_name(mode), ms_new, ms_bwd / ms_new, ms_rep);
        printf("  time: Hopper row pass alone %.4f ms = %.1f TFLOP/s (%d GEMMs, causal); row pass / Hopper-path %s"
               " backward = %.3f\n", ms_rows, flops / ms_rows * 1e-9, n_gemms, attn_mode_name(mode), ms_rows / ms_new);
        cudaCheck(cudaEventDestroy(e0));
        cudaCheck(cudaEventDestroy(e1));
        cudaCheck(cudaFree(out_rep)); cudaCheck(cudaFree(dqkv_rep)); cudaCheck(cudaFree(stats_rep));
    }
    free(hD_ref); free(hD_new);
    lab_bwd_case_free(&c);
}

/* (kProbeTol, the FP32-accumulation bound relative to the sum of |products|: dev/attention_lab/hopper_lab.cuh.) */
/* Checks one probed matrix got[rows x cols] against ref(i, n) = sum_k A(i, k) B(k, n) given as callbacks. */
template <typename Ref>
static int probe_compare(const char* name, const float* got, int nrows, int ncols, Ref ref_and_mag) {
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < nrows; i++)
        for (int n = 0; n < ncols; n++) {
            double ref = 0, mag = 0;
            ref_and_mag(i, n, &ref, &mag);
            const double x = got[i * ncols + n];
            if (!(fabs(x - ref) <= kProbeTol * mag + 1e-30)) {
                if (bad++ < 3) printf("  %s[%d][%d] = %.6g, want %.6g\n", name, i, n, x, ref);
            }
            const double err = isnan(x) ? INFINITY : fabs(x - ref) / (mag + 1e-30);
            worst = fmax(worst, err);
        }
    printf("  %s: %d of %d wrong (worst error / sum|products| %.3g)\n", name, bad, nrows * ncols, worst);
    return bad;
}

/* Runs layout_probe_kernel on B1 NH3 T100 (head 1: slot and head coordinates of both maps; T < 128: zero
   fill) and checks S, dP, X = bf(S) K and Y = bf(dP) K against double-precision loops over the same BF16
   values (X and Y from the kernel's own S and dP, rounded as it rounds). */
static void layout_probe(void) {
    test_section("layout probe HS64: S = Q K^T, dP = dO V^T, bf(S) K, bf(dP) K through the row pass's GEMM helpers");
    const AttnShape s = {1, 3, 100, kHS};
    const int head = 1;
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    uint16_t* h_qkv = (uint16_t*)mallocCheck(nqkv * 2);
    uint16_t* h_dout = (uint16_t*)mallocCheck(nout * 2);
    for (size_t i = 0; i < nqkv; i++) h_qkv[i] = float_to_bf16_bits(normal01());
    for (size_t i = 0; i < nout; i++) h_dout[i] = float_to_bf16_bits(normal01());
    bf16 *qkv, *dout;
    float *d_s, *d_dp, *d_x, *d_y;
    const size_t n_sq = (size_t)kBlockQ * kBlockK, n_dq = (size_t)kBlockQ * kHS;
    lab_upload(&qkv, h_qkv, nqkv * 2);
    lab_upload(&dout, h_dout, nout * 2);
    lab_alloc_poisoned(&d_s, n_sq * 4);
    lab_alloc_poisoned(&d_dp, n_sq * 4);
    lab_alloc_poisoned(&d_x, n_dq * 4);
    lab_alloc_poisoned(&d_y, n_dq * 4);
    attention_hopper_rows_layout_probe(s, head, qkv, dout, d_s, d_dp, d_x, d_y);
    cudaCheck(cudaDeviceSynchronize());
    float* h_s = (float*)lab_download(d_s, n_sq * 4);
    float* h_dp = (float*)lab_download(d_dp, n_sq * 4);
    float* h_x = (float*)lab_download(d_x, n_dq * 4);
    float* h_y = (float*)lab_download(d_y, n_dq * 4);
    /* element (token, slot, d) of the probed head in qkv, and (token, d) in dout; tokens >= T: zero fill */
    const size_t tok_stride = 3ull * s.NH * kHS, do_stride = (size_t)s.NH * kHS;
    auto qkv_at = [&](int tok, int slot, int d) -> double {
        return tok < s.T ? bf16_bits_to_float(h_qkv[(size_t)tok * tok_stride + ((size_t)slot * s.NH + head) * kHS + d])
                         : 0.0;
    };
    auto do_at = [&](int tok, int d) -> double {
        return tok < s.T ? bf16_bits_to_float(h_dout[(size_t)tok * do_stride + (size_t)head * kHS + d]) : 0.0;
    };
    const int bad_s = probe_compare("S", h_s, kBlockQ, kBlockK, [&](int i, int j, double* ref, double* mag) {
        for (int d = 0; d < kHS; d++) {
            const double p = qkv_at(i, kSlotQ, d) * qkv_at(j, kSlotK, d);
            *ref += p;
            *mag += fabs(p);
        }
    });
    const int bad_dp = probe_compare("dP", h_dp, kBlockQ, kBlockK, [&](int i, int j, double* ref, double* mag) {
        for (int d = 0; d < kHS; d++) {
            const double p = do_at(i, d) * qkv_at(j, kSlotV, d);
            *ref += p;
            *mag += fabs(p);
        }
    });
    const int bad_x = probe_compare("bf(S) K", h_x, kBlockQ, kHS, [&](int i, int n, double* ref, double* mag) {
        for (int j = 0; j < kBlockK; j++) {
            const double p = bf16_round(h_s[i * kBlockK + j]) * qkv_at(j, kSlotK, n);
            *ref += p;
            *mag += fabs(p);
        }
    });
    const int bad_y = probe_compare("bf(dP) K", h_y, kBlockQ, kHS, [&](int i, int n, double* ref, double* mag) {
        for (int j = 0; j < kBlockK; j++) {
            const double p = bf16_round(h_dp[i * kBlockK + j]) * qkv_at(j, kSlotK, n);
            *ref += p;
            *mag += fabs(p);
        }
    });
    CHECK(bad_s == 0, "S = Q K^T tile (qkv map, K-major descriptors; verified by hopper_fwd, so a regression)");
    CHECK(bad_dp == 0, "dP = dO V^T tile (dout map {HS, NH, T, B}, dO as K-major A, V as K-major B)");
    CHECK(bad_x == 0, "bf(S) K tile (register A from the S accumulator, K as N-major B)");
    CHECK(bad_y == 0, "bf(dP) K tile (second accumulator pair in one wgmma group: the DSK/PK interleave)");
    free(h_qkv); free(h_dout); free(h_s); free(h_dp); free(h_x); free(h_y);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(d_s)); cudaCheck(cudaFree(d_dp)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_y));
}

int main(int argc, char** argv) {
    attn_rng_init(&g_rng, 0x13198A2E03707344ull);
    if (argc != 1) die("usage: %s   (no arguments)\n  hint: the shapes are fixed in main()", argv[0]);
    const cudaDeviceProp prop = require_sm90("hopper_rows");
    printf("hopper_rows on %s: the production Hopper row pass (attention_hopper_rows.cu) vs the portable one\n"
           "  HS 128: not served by the Hopper row pass (four accumulators do not fit in registers); skipped\n",
           prop.name);
    layout_probe(); /* the GEMM building blocks alone first: if these fail, everything below fails too */
    const LabCase shapes[] = {
        {{1, 1, 1, 64}, 1.f, 0.f},    {{1, 1, 77, 64}, 1.f, 0.f},   {{1, 2, 128, 64}, 1.f, 0.f},
        {{1, 1, 129, 64}, 1.f, 0.f},  {{2, 3, 1000, 64}, 1.f, 0.f}, {{4, 32, 257, 64}, 1.f, 0.f},
        {{1, 4, 500, 64}, 8.f, 0.f},  /* sharp softmax */
        {{2, 4, 1000, 64}, 1.f, 20.f}, /* key offset 20 along a unit vector: gproj's correction matters */
        {{1, 4, 777, 64}, 1.f, 128.f}, /* rho 16 (offset 16 sqrt(HS)), the doc's hard case 1 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(shapes[i], ATTN_GPROJ, 0);
    /* fp32 mode's D = sum P dP through the same kernel */
    const LabCase fp32_shapes[] = {{{1, 1, 77, 64}, 1.f, 0.f}, {{2, 3, 1000, 64}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof fp32_shapes / sizeof fp32_shapes[0]; i++) check_shape(fp32_shapes[i], ATTN_FP32, 0);
    /* timing (and checks) at the benchmark shapes */
    const LabCase bench[] = {{{8, 16, 1024, 64}, 1.f, 0.f}, {{4, 16, 2048, 64}, 1.f, 0.f}};
    for (size_t i = 0; i < sizeof bench / sizeof bench[0]; i++) check_shape(bench[i], ATTN_GPROJ, 1);
    check_shape(bench[0], ATTN_FP32, 1);
    return test_summary();
}
