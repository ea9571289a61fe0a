/*
 * tests/test_attention_gpu.cu - the CUDA attention kernels of every mode
 * against the CPU emulation of the same mode and against the fp64 reference.
 *
 * Why: the kernels are the thing the trainer runs; the CPU emulation
 * (attention_cpu.c) is the executable form of docs/attention_numerics.md and
 * the fp64 reference (attention_ref.c) is the truth. A kernel is right when
 * it agrees with the emulation of its mode up to accumulation order, and when
 * its errors against fp64 show what the mode promises: fp32 and gproj flat at
 * the BF16 output floor on every hard case, bf16 and repair the key-offset
 * leak growing with rho, repair/gproj/fp32 finite on extreme inputs.
 *
 * Every run draws fresh inputs (seed from the clock, printed; set
 * ATTN_TEST_SEED to repeat one), fills every GPU output and the workspace with
 * NaN before each call (an element the kernels forget to write shows up as a
 * NaN where the emulation has a number), and covers: the published table of
 * hard cases (key-offset sweep, sharp, extreme) plus rho 4/64/1024 at q x4,
 * at head sizes 64 and 128;
 * odd sequence lengths (1, 77, 1000, 4097); 1 to 192 heads; the repair
 * tile-max shift arm; the saved softmax stats; the deterministic backward
 * (AttnOptions.deterministic: bit-identical repeats in every mode and path,
 * and the flag-off results within tolerance, docs/determinism.md).
 * Two paths: on an sm_90 device (H100/H200) attention_forward_cuda runs the
 * Hopper wgmma forward by default, and attention_backward_cuda at least one
 * Hopper pass in every mode at HS 64 and 128 (bf16, repair: the key-major
 * kernel; gproj, fp32: the row pass, then the mode's Hopper key-major pass,
 * at 64 and 128 for both); with
 * AttnOptions.force_portable both run the portable mma.sync kernels. There every check runs on both (rows and checks say e.g.
 * "[hopper fwd, hopper bwd]" or "[portable fwd, portable bwd]"; the backward
 * reads each path's own stats end to end), and direct comparisons check the
 * Hopper O within 4 BF16 ulps of the portable O and the stats at FP32 level
 * per mode, and the Hopper dQ, dK, dV within 4 BF16 ulps (gproj's dQ 8) of
 * the portable ones on the same forward outputs, and the row pass's own
 * workspace outputs (fp32's D, gproj's lambda) within the row-pass labs'
 * tolerances of the portable row pass's. Elsewhere only the portable
 * path exists, and the dispatch checks make sure it is the one taken.
 *
 * Tolerance GPU vs emulation (per head ||gpu - cpu|| / ||cpu||, median over
 * heads): 3e-3 + 0.25 * (the emulation's own error vs fp64). Why: the two
 * sum in different orders (tensor-core FP32 accumulation, online softmax with
 * running max vs the emulation's whole-row max, ex2.approx vs libm exp2f), so
 * FP32 values differ in their last bits and a BF16 rounding (of P, of dS, of
 * the output) can land one ulp apart; each such flip moves an element by up to
 * 2^-8 relative. That is noise on the size of the mode's own rounding error,
 * never a wrong index, a missing tile or a wrong mode (those give O(1)).
 * The gradients are compared on a backward run fed the emulation's O and
 * stats (so forward differences do not propagate), except in fp32 mode (see
 * compare_mode). Where the emulation's own error exceeds 1% (the bf16/repair
 * dQ leak) the leak is rounding noise whose realisation depends on the last
 * bits of S, so its size is compared (within 30%) instead of its elements.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/cuda/hopper/attention_hopper_bwd.cuh"
#include "attention/support/attn_cases.h"
#include "attention/support/attn_metrics.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"

static const double kOutputFloorTarget = 0.0035; /* fp32, gproj: median dQ and dK error (the published 0.34%) */
static const double kCloseAbs = 3e-3;             /* GPU vs emulation: see the file comment */
static const double kCloseRel = 0.25;

/* ---- one set of outputs (host, float) ---- */
typedef struct {
    float* out;
    float* stats;
    float* dqkv;
} Outputs;

static Outputs outputs_alloc(AttnShape s) {
    Outputs o;
    o.out = (float*)mallocCheck(sizeof(float) * attn_out_count(s));
    o.stats = (float*)mallocCheck(sizeof(float) * attn_stats_count(s));
    o.dqkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(s));
    return o;
}
static void outputs_free(Outputs* o) { free(o->out); free(o->stats); free(o->dqkv); }

static __nv_bfloat16* to_device_bf16(const float* x, size_t n) {
    unsigned short* h = (unsigned short*)mallocCheck(sizeof(unsigned short) * n);
    for (size_t i = 0; i < n; i++) h[i] = float_to_bf16_bits(x[i]);
    __nv_bfloat16* d;
    cudaCheck(cudaMalloc(&d, sizeof(unsigned short) * n));
    cudaCheck(cudaMemcpy(d, h, sizeof(unsigned short) * n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static void from_device_bf16(float* x, const __nv_bfloat16* d, size_t n) {
    unsigned short* h = (unsigned short*)mallocCheck(sizeof(unsigned short) * n);
    cudaCheck(cudaMemcpy(h, d, sizeof(unsigned short) * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) x[i] = bf16_bits_to_float(h[i]);
    free(h);
}

/* Forward + backward on the GPU; every output and the workspace poisoned with
   NaN (all bits set) first. The backward reads the GPU forward's out and stats
   (end to end, as in training), or, when bwd_out/bwd_stats are given, those
   (the emulation's: the backward kernel then sees exactly the emulation's
   inputs, so a difference is the backward's own). */
static AttnFwdPath run_gpu(AttnMode mode, AttnOptions opt, AttnShape s, const float* qkv, const float* dout,
                           const float* bwd_out, const float* bwd_stats, Outputs* r, AttnBwdPath* bwd_path) {
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    __nv_bfloat16* d_qkv = to_device_bf16(qkv, nqkv);
    __nv_bfloat16* d_dout = to_device_bf16(dout, nout);
    __nv_bfloat16 *d_out, *d_dqkv;
    float* d_stats;
    void* d_ws;
    const size_t ws_bytes = attention_cuda_workspace_bytes(s, mode, opt);
    cudaCheck(cudaMalloc(&d_out, sizeof(__nv_bfloat16) * nout));
    cudaCheck(cudaMalloc(&d_dqkv, sizeof(__nv_bfloat16) * nqkv));
    cudaCheck(cudaMalloc(&d_stats, sizeof(float) * nstats));
    cudaCheck(cudaMalloc(&d_ws, ws_bytes));
    cudaCheck(cudaMemset(d_out, 0xFF, sizeof(__nv_bfloat16) * nout));
    cudaCheck(cudaMemset(d_dqkv, 0xFF, sizeof(__nv_bfloat16) * nqkv));
    cudaCheck(cudaMemset(d_stats, 0xFF, sizeof(float) * nstats));
    cudaCheck(cudaMemset(d_ws, 0xFF, ws_bytes));
    const AttnFwdPath path = attention_forward_cuda_path(mode, opt, s, d_qkv);
    attention_forward_cuda(mode, opt, s, d_qkv, d_out, d_stats, d_ws, 0);
    cudaCheck(cudaDeviceSynchronize());
    from_device_bf16(r->out, d_out, nout);
    cudaCheck(cudaMemcpy(r->stats, d_stats, sizeof(float) * nstats, cudaMemcpyDeviceToHost));
    if (bwd_out != NULL) {
        __nv_bfloat16* given = to_device_bf16(bwd_out, nout);
        cudaCheck(cudaMemcpy(d_out, given, sizeof(__nv_bfloat16) * nout, cudaMemcpyDeviceToDevice));
        cudaCheck(cudaFree(given));
        cudaCheck(cudaMemcpy(d_stats, bwd_stats, sizeof(float) * nstats, cudaMemcpyHostToDevice));
    }
    if (bwd_path != NULL) *bwd_path = attention_backward_cuda_path(mode, opt, s, d_qkv, d_dout);
    attention_backward_cuda(mode, opt, s, d_qkv, d_out, d_stats, d_dout, d_dqkv, d_ws, 0);
    cudaCheck(cudaDeviceSynchronize());
    from_device_bf16(r->dqkv, d_dqkv, nqkv);
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_stats)); cudaCheck(cudaFree(d_ws));
    return path;
}

/* The emulation sees what the kernels see: BF16 inputs, BF16 outputs, and it
   runs its backward on the BF16 O of its own forward. */
static void run_cpu(AttnMode mode, AttnOptions opt, AttnShape s, const float* qkv, const float* dout, Outputs* r) {
    attention_forward_cpu(mode, opt, ATTN_IO_BF16, s, qkv, r->out, r->stats);
    attention_backward_cpu(mode, opt, ATTN_IO_BF16, s, qkv, r->out, r->stats, dout, r->dqkv);
}

/* Elements that are finite in the emulation but not on the GPU (unwritten
   NaN poison, or a kernel overflow the emulation does not have). */
static long count_new_nonfinite(const float* gpu, const float* cpu, size_t n) {
    long k = 0;
    for (size_t i = 0; i < n; i++) k += (!isfinite(gpu[i]) && isfinite(cpu[i]));
    return k;
}
static long count_nonfinite(const float* x, size_t n) {
    long k = 0;
    for (size_t i = 0; i < n; i++) k += !isfinite(x[i]);
    return k;
}

/* Per head ||gpu - cpu|| / ||cpu|| for tensor t, median over heads. */
static AttnErrStat gpu_vs_cpu(AttnShape s, AttnTensor t, const Outputs* gpu, const Outputs* cpu) {
    const size_t n = (t == ATTN_T_O) ? attn_out_count(s) : attn_qkv_count(s);
    const float* c = (t == ATTN_T_O) ? cpu->out : cpu->dqkv;
    const float* g = (t == ATTN_T_O) ? gpu->out : gpu->dqkv;
    double* cd = attn_double_copy(c, n);
    double* per_head = (double*)mallocCheck(sizeof(double) * s.B * s.NH);
    int zero = attn_rel_errors_per_head(s, t, g, cd, per_head);
    AttnErrStat st = attn_err_stat_of(per_head, s.B * s.NH);
    st.zero_ref_heads = zero;
    free(cd);
    free(per_head);
    return st;
}

/* Per query row (b, h, t), in stats order: |q_t| * max_{j<=t} |k_j|, a bound on the
   partial sums of every score of the row. */
static void row_score_bounds(AttnShape s, const float* qkv, double* bound) {
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            double kmax = 0;
            for (int t = 0; t < s.T; t++) {
                const float* q = qkv + (((size_t)b * s.T + t) * 3 * s.NH + h) * s.HS;
                const float* k = q + (size_t)s.NH * s.HS;
                double qn = 0, kn = 0;
                for (int d = 0; d < s.HS; d++) {
                    qn += (double)q[d] * q[d];
                    kn += (double)k[d] * k[d];
                }
                if (sqrt(kn) > kmax) kmax = sqrt(kn);
                bound[((size_t)b * s.NH + h) * s.T + t] = sqrt(qn) * kmax;
            }
        }
}

typedef struct {
    double* qkv_ref; /* fp64 copies of the BF16 inputs */
    double* out_ref;
    double* dqkv_ref;
} Reference;

static Reference reference_compute(AttnShape s, const float* qkv, const float* dout) {
    Reference r;
    r.qkv_ref = attn_double_copy(qkv, attn_qkv_count(s));
    double* dout_d = attn_double_copy(dout, attn_out_count(s));
    r.out_ref = (double*)mallocCheck(sizeof(double) * attn_out_count(s));
    r.dqkv_ref = (double*)mallocCheck(sizeof(double) * attn_qkv_count(s));
    attention_forward_ref(s, r.qkv_ref, r.out_ref);
    attention_backward_ref(s, r.qkv_ref, dout_d, r.dqkv_ref);
    free(dout_d);
    return r;
}
static void reference_free(Reference* r) { free(r->qkv_ref); free(r->out_ref); free(r->dqkv_ref); }

/* The forward paths every check runs on: the default (AttnOptions.force_portable = 0: the Hopper forward
   on an sm_90 device, where it serves the mode) and, on sm_90 only, the portable forward as well
   (force_portable = 1). Elsewhere the default IS the portable path, so it runs once. Set in main. */
static int g_num_paths = 1;
static const int k_path_force_portable[2] = {0, 1};

/* What one (case, mode) comparison measured on one forward path, for the cross-case checks. */
typedef struct {
    AttnErrors gpu, cpu;
    AttnFwdPath path;
    AttnBwdPath bwd_path;
} ModeResult;

/* The label of one path run: which forward and which backward ran. */
static const char* path_tag(AttnFwdPath fwd, AttnBwdPath bwd) {
    if (fwd == ATTN_FWD_HOPPER) return bwd == ATTN_BWD_HOPPER ? "hopper fwd, hopper bwd" : "hopper fwd, portable bwd";
    return bwd == ATTN_BWD_HOPPER ? "portable fwd, hopper bwd" : "portable fwd, portable bwd";
}

/* One forward path (opt.force_portable) of compare_mode, against the emulation's outputs c. */
static ModeResult compare_mode_on_path(const char* base_label, AttnMode mode, AttnOptions opt, AttnShape s,
                                       const float* qkv, const float* dout, const Reference* ref, int extreme,
                                       const Outputs* cpu_outputs) {
    Outputs g = outputs_alloc(s), gi = outputs_alloc(s);
    const Outputs c = *cpu_outputs;
    ModeResult mr;
    mr.path = run_gpu(mode, opt, s, qkv, dout, NULL, NULL, &g, &mr.bwd_path); /* end to end: the error tables */
    run_gpu(mode, opt, s, qkv, dout, c.out, c.stats, &gi, NULL); /* backward on the emulation's O and stats */
    char label[160];
    snprintf(label, sizeof label, "%s [%s]", base_label, path_tag(mr.path, mr.bwd_path));
    /* fp32 mode's backward is exact only with its own stats: its dS rows sum to D (1 - sum_j P_ij),
       zero only when l is the sum of the very P it recomputes; the emulation's l, summed from
       scores in another order, leaves a residual that a large key offset turns into a dQ leak. So
       fp32 mode is compared end to end; the other modes take the emulation's O and stats. */
    const Outputs* gb = (mode == ATTN_FP32) ? &g : &gi;
    attn_errors_compute(s, g.out, ref->out_ref, g.dqkv, ref->dqkv_ref, NULL, &mr.gpu);
    attn_errors_compute(s, c.out, ref->out_ref, c.dqkv, ref->dqkv_ref, NULL, &mr.cpu);
    char row[160];
    snprintf(row, sizeof row, "%s gpu", label);
    attn_errors_print_row(stdout, row, &mr.gpu);
    snprintf(row, sizeof row, "%s cpu", label);
    attn_errors_print_row(stdout, row, &mr.cpu);

    const size_t nout = attn_out_count(s), nqkv = attn_qkv_count(s), nstats = attn_stats_count(s);
    const long cpu_bad = count_nonfinite(c.out, nout) + count_nonfinite(c.dqkv, nqkv);
    if (extreme && mode == ATTN_BF16 && cpu_bad > 0) {
        /* the FMA flaw: the emulation overflows, and so must the faithful kernel */
        const long gpu_bad = count_nonfinite(g.out, nout) + count_nonfinite(g.dqkv, nqkv);
        CHECK(gpu_bad > 0, "%s: emulation has %ld Inf/NaN, the kernel must overflow too (has %ld)", label, cpu_bad,
              gpu_bad);
    } else {
        const long bad_out = count_new_nonfinite(g.out, c.out, nout);
        const long bad_dqkv = count_new_nonfinite(g.dqkv, c.dqkv, nqkv) + count_new_nonfinite(gb->dqkv, c.dqkv, nqkv);
        const long bad_stats = count_new_nonfinite(g.stats, c.stats, nstats);
        CHECK(bad_out == 0 && bad_dqkv == 0 && bad_stats == 0,
              "%s: every output written and finite where the emulation is (non-finite: out %ld, dqkv %ld, stats %ld)",
              label, bad_out, bad_dqkv, bad_stats);
        /* agreement with the emulation, tensor by tensor: O from the forward, the gradients from the
           backward run on the emulation's O and stats */
        for (int t = 0; t < ATTN_NUM_TENSORS; t++) {
            const AttnErrStat own = mr.cpu.err[t];
            /* no relative scale where the exact answer is zero: dQ and dK at T = 1 and on the extreme
               input (all keys equal) are pure rounding noise of D; there only finiteness is checked */
            if (own.zero_ref_heads > 0 || (extreme && (t == ATTN_T_DQ || t == ATTN_T_DK))) continue;
            /* The leak regime (bf16/repair dQ, own error > 1%): the error IS a sum of BF16 rounding
               errors of dS, and which way each dS rounds depends on the last bits of S, which no two
               summation orders share (at rho 256, ulp(S) moves P by 1e-3). Element by element the two
               leaks are two draws of the same noise; their SIZE is compared instead (below). */
            if (own.median > 0.01) continue;
            const AttnErrStat d = gpu_vs_cpu(s, (AttnTensor)t, (t == ATTN_T_O) ? &g : gb, &c);
            const double tol = kCloseAbs + kCloseRel * own.median;
            CHECK(d.median <= tol, "%s: %s gpu vs emulation median %.3g%% (max %.3g%%) <= %.3g%%", label,
                  attn_tensor_name((AttnTensor)t), 100 * d.median, 100 * d.max, 100 * tol);
        }
        /* Saved softmax state: bf16 {LSE, 0}; others {m, l}. A score S = q.k summed in another
           order moves by up to about sqrt(HS) ulp of the partial sums, which are bounded by
           |q| max_j |k_j| (Cauchy-Schwarz; far above |S| when a large key offset cancels), and
           moves l (and LSE) by s times that. Tolerance: 1e-4 relative plus 32x that term (4
           sigma over thousands of rows of a random walk of 8-ulp steps). It matters only for
           huge scores (rho 256 and 1024); a wrong formula or row is off by O(1). */
        double* score_bound = (double*)mallocCheck(sizeof(double) * (nstats / 2));
        row_score_bounds(s, qkv, score_bound);
        const double s_scale = attn_softmax_scale(s.HS), cond = 32.0 * sqrt((double)s.HS) * FLT_EPSILON;
        long stats_off = 0;
        double worst = 0;
        for (size_t i = 0; i < nstats; i += 2) {
            const double a0 = g.stats[i], b0 = c.stats[i], a1 = g.stats[i + 1], b1 = c.stats[i + 1];
            const double dS = cond * score_bound[i / 2]; /* possible move of a score */
            double e0, e1;
            if (mode == ATTN_BF16) { /* LSE = m s + ln l */
                e0 = fabs(a0 - b0) / (1e-4 * (1.0 + fabs(b0)) + s_scale * dS);
                e1 = (a1 == 0.0 && b1 == 0.0) ? 0.0 : INFINITY;
            } else {
                e0 = fabs(a0 - b0) / (1e-4 * (1.0 + fabs(b0)) + dS);
                e1 = fabs(a1 - b1) / fabs(b1) / (1e-4 + s_scale * dS);
            }
            const double e = e0 > e1 ? e0 : e1; /* in units of the tolerance */
            if (!(e <= 1.0)) stats_off++;
            if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
        }
        free(score_bound);
        CHECK(stats_off == 0, "%s: stats match the emulation (1e-4 + conditioning; %ld rows off, worst %.3g x tol)",
              label, stats_off, worst);
    }
    outputs_free(&g);
    outputs_free(&gi);
    return mr;
}

/* Runs one mode on one input on both sides, the GPU once per forward path (g_num_paths; a second path
   that would run the same kernel as the first, e.g. repair's tile-max-shift arm, is skipped); checks
   completeness, agreement with the emulation and the stats, labelled with the path; writes the error
   tables of each path run into results[] and returns how many. */
static int compare_mode(const char* base_label, AttnMode mode, AttnOptions base_opt, AttnShape s, const float* qkv,
                        const float* dout, const Reference* ref, int extreme, ModeResult results[2]) {
    Outputs c = outputs_alloc(s);
    run_cpu(mode, base_opt, s, qkv, dout, &c);
    int n_results = 0;
    for (int p = 0; p < g_num_paths; p++) {
        AttnOptions opt = base_opt;
        opt.force_portable = k_path_force_portable[p];
        if (p > 0 && attention_forward_cuda_path(mode, opt, s, NULL) == results[0].path &&
            attention_backward_cuda_path(mode, opt, s, NULL, NULL) == results[0].bwd_path)
            continue;
        results[n_results++] = compare_mode_on_path(base_label, mode, opt, s, qkv, dout, ref, extreme, &c);
    }
    outputs_free(&c);
    return n_results;
}

/* ---- the hard cases of docs/attention_numerics.md, all modes ---- */
static void test_hard_cases(int HS, int T, uint64_t seed) {
    char title[96];
    snprintf(title, sizeof title, "hard cases, B1 NH4 T%d HS%d (errors vs fp64, percent)", T, HS);
    test_section(title);
    const AttnShape s = {1, 4, T, HS};
    AttnCase cases[16];
    int ncases = attn_case_table(cases, 12, seed);
    /* the sweep's middle query scale, x4, on top of the published rows (x1, x8) */
    cases[ncases++] = attn_case_key_offset(4, 4, seed);
    cases[ncases++] = attn_case_key_offset(64, 4, seed);
    cases[ncases++] = attn_case_key_offset(1024, 4, seed);
    float* qkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(s));
    float* dout = (float*)mallocCheck(sizeof(float) * attn_out_count(s));
    double leak_dq[2][ATTN_NUM_EMULATED_MODES][16]; /* [forward path run][mode][case] */
    const char* leak_tag[2] = {"", ""}; /* bf16 mode's paths per run (repair's are the same on this shape) */
    attn_errors_print_header(stdout);
    for (int ci = 0; ci < ncases; ci++) {
        char name[64];
        attn_case_name(&cases[ci], name, sizeof name);
        const int extreme = cases[ci].kind == ATTN_CASE_EXTREME;
        attn_case_fill(&cases[ci], s, qkv, dout);
        Reference ref = reference_compute(s, qkv, dout);
        for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
            const AttnMode mode = (AttnMode)m;
            char base[96];
            snprintf(base, sizeof base, "%s %s", name, attn_mode_name(mode));
            AttnOptions opt = {0};
            ModeResult results[2];
            const int n_results = compare_mode(base, mode, opt, s, qkv, dout, &ref, extreme, results);
            for (int p = 0; p < n_results; p++) {
                const ModeResult r = results[p];
                char label[160];
                snprintf(label, sizeof label, "%s [%s]", base, path_tag(r.path, r.bwd_path));
                leak_dq[p][m][ci] = r.gpu.err[ATTN_T_DQ].median;
                if (mode == ATTN_BF16) leak_tag[p] = path_tag(r.path, r.bwd_path);
                const int accurate_mode = (mode == ATTN_FP32 || mode == ATTN_GPROJ);
                if (accurate_mode && !extreme) {
                    CHECK(r.gpu.err[ATTN_T_DQ].median <= kOutputFloorTarget &&
                              r.gpu.err[ATTN_T_DK].median <= kOutputFloorTarget,
                          "%s: median dQ %.3f%% and dK %.3f%% <= %.2f%%", label, 100 * r.gpu.err[ATTN_T_DQ].median,
                          100 * r.gpu.err[ATTN_T_DK].median, 100 * kOutputFloorTarget);
                    /* exact: 0; BF16 output rounding alone leaves ~1.6e-3 (emulation), bf16/repair 3e-3..6e-3 */
                    CHECK(r.gpu.dk_sum.median <= 2.5e-3,
                          "%s: ||sum_j dK_j|| / ||dK|| median %.3g <= 2.5e-3 (output floor)", label,
                          r.gpu.dk_sum.median);
                }
                if (extreme && mode != ATTN_BF16) {
                    long bad = 0;
                    for (int t = 0; t < ATTN_NUM_TENSORS; t++) bad += r.gpu.nonfinite[t];
                    CHECK(bad == 0, "%s: finite on q = k = v = %.0f (%ld Inf/NaN)", label, ATTN_EXTREME_VALUE, bad);
                    CHECK(r.gpu.err[ATTN_T_O].median <= kOutputFloorTarget, "%s: O accurate (%.3g%%)", label,
                          100 * r.gpu.err[ATTN_T_O].median);
                }
                if ((mode == ATTN_BF16 || mode == ATTN_REPAIR) &&
                    ((cases[ci].kind == ATTN_CASE_KEY_OFFSET && cases[ci].rho >= 16) ||
                     cases[ci].kind == ATTN_CASE_SHARP)) {
                    /* the leak is reproduced: same size as in the emulation */
                    const double gq = r.gpu.err[ATTN_T_DQ].median, cq = r.cpu.err[ATTN_T_DQ].median;
                    CHECK(fabs(gq / cq - 1.0) <= 0.3, "%s: leak dQ %.3g%% within 30%% of the emulation's %.3g%%",
                          label, 100 * gq, 100 * cq);
                }
            }
        }
        reference_free(&ref);
    }
    /* leak grows with rho in bf16 and repair: rho 0 x1 (case 0) vs rho 1024 x8 (case 4), per forward path */
    for (int p = 0; p < g_num_paths; p++)
        for (int m = ATTN_BF16; m <= ATTN_REPAIR; m++) {
            CHECK(leak_dq[p][m][4] >= 0.5 && leak_dq[p][m][4] >= 10 * leak_dq[p][m][0],
                  "HS%d %s [%s]: dQ leak grows with rho: %.3g%% at rho 0 -> %.3g%% at rho 1024 (need >= 50%% "
                  "and 10x)", HS, attn_mode_name((AttnMode)m), leak_tag[p],
                  100 * leak_dq[p][m][0], 100 * leak_dq[p][m][4]);
        }
    free(qkv);
    free(dout);
}

/* ---- shapes: odd T, both head sizes, 1 to 192 heads ---- */
static void test_shapes(uint64_t seed) {
    test_section("shapes (random inputs, q x1; errors vs fp64, percent)");
    const AttnShape shapes[] = {
        {1, 1, 1, 64}, {2, 3, 1, 128}, {3, 5, 77, 64}, {2, 3, 77, 128}, {1, 2, 1000, 64},
        {1, 2, 1000, 128}, {4, 48, 130, 64}, {2, 50, 65, 128}, {1, 1, 4097, 64},
    };
    attn_errors_print_header(stdout);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const AttnShape s = shapes[si];
        float* qkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(s));
        float* dout = (float*)mallocCheck(sizeof(float) * attn_out_count(s));
        AttnCase cs = attn_case_random(1.0, seed + si);
        attn_case_fill(&cs, s, qkv, dout);
        Reference ref = reference_compute(s, qkv, dout);
        for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
            const AttnMode mode = (AttnMode)m;
            if (s.T > 2000 && (mode == ATTN_BF16 || mode == ATTN_REPAIR)) continue; /* keep the CPU side short */
            char base[96];
            snprintf(base, sizeof base, "B%d NH%d T%d HS%d %s", s.B, s.NH, s.T, s.HS, attn_mode_name(mode));
            AttnOptions opt = {0};
            ModeResult results[2];
            const int n_results = compare_mode(base, mode, opt, s, qkv, dout, &ref, 0, results);
            for (int p = 0; p < n_results && (mode == ATTN_FP32 || mode == ATTN_GPROJ); p++) {
                const ModeResult r = results[p];
                for (int t = 0; t < ATTN_NUM_TENSORS; t++) {
                    if (r.gpu.err[t].zero_ref_heads > 0) continue;
                    CHECK(r.gpu.err[t].median <= kOutputFloorTarget, "%s [%s]: %s median %.3g%% <= %.2f%%", base,
                          path_tag(r.path, r.bwd_path), attn_tensor_name((AttnTensor)t), 100 * r.gpu.err[t].median,
                          100 * kOutputFloorTarget);
                }
            }
        }
        reference_free(&ref);
        free(qkv);
        free(dout);
    }
}

/* ---- repair's tile-max shift arm: keys repeated in pairs tie every tile max ---- */
static void test_tile_max_shift(uint64_t seed) {
    test_section("repair with the tile-max shift arm (keys in equal pairs)");
    const AttnShape s = {1, 3, 300, 64};
    float* qkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(s));
    float* dout = (float*)mallocCheck(sizeof(float) * attn_out_count(s));
    AttnCase cs = attn_case_random(1.0, seed);
    attn_case_fill(&cs, s, qkv, dout);
    /* k_{2a+1} = k_{2a}: both twins lie in the same 64-key tile, so a tile max is tied whenever both are visible */
    for (int t = 1; t < s.T; t += 2)
        for (int h = 0; h < s.NH; h++)
            for (int d = 0; d < s.HS; d++) {
                const size_t k_prev = (((size_t)(t - 1) * 3 + 1) * s.NH + h) * s.HS + d;
                const size_t k_this = (((size_t)t * 3 + 1) * s.NH + h) * s.HS + d;
                qkv[k_this] = qkv[k_prev];
            }
    Reference ref = reference_compute(s, qkv, dout);
    AttnOptions shift = {0}, plain = {0};
    shift.tile_max_shift = 1;
    attn_errors_print_header(stdout);
    ModeResult results[2];
    const int n_results = compare_mode("paired keys repair+shift", ATTN_REPAIR, shift, s, qkv, dout, &ref, 0, results);
    /* the arm's 64-key tile is the portable kernel's: the dispatch keeps it there on every device */
    CHECK(n_results == 1 && results[0].path == ATTN_FWD_PORTABLE && results[0].bwd_path == ATTN_BWD_PORTABLE,
          "repair+shift runs the portable forward and backward only (%d path(s), first %s)", n_results,
          path_tag(results[0].path, results[0].bwd_path));
    /* the arm did act: the stored max differs from plain repair's on many rows */
    Outputs a = outputs_alloc(s), b = outputs_alloc(s);
    run_gpu(ATTN_REPAIR, shift, s, qkv, dout, NULL, NULL, &a, NULL);
    run_gpu(ATTN_REPAIR, plain, s, qkv, dout, NULL, NULL, &b, NULL);
    long shifted = 0;
    const long rows = (long)s.B * s.NH * s.T;
    for (long i = 0; i < rows; i++) shifted += fabsf(a.stats[2 * i] - b.stats[2 * i]) > 1e-3f * (1.0f + fabsf(b.stats[2 * i]));
    CHECK(shifted > rows / 4, "tile-max shift changed the stored max on %ld of %ld rows (want > 1/4)", shifted, rows);
    outputs_free(&a);
    outputs_free(&b);
    reference_free(&ref);
    free(qkv);
    free(dout);
}

/* ---- workspace sizes: the default layout, and the deterministic backward's dQ slices ---- */
static void test_workspace_size(void) {
    test_section("workspace size");
    const AttnShape s = {2, 3, 100, 64};
    const size_t want = ((size_t)2 * 3 * 100 * 64 + 2 * (size_t)2 * 3 * 100) * sizeof(float);
    CHECK(attention_cuda_workspace_bytes(s, ATTN_GPROJ) == want, "workspace bytes %zu == %zu (dQ fp32 + D + lambda)",
          attention_cuda_workspace_bytes(s, ATTN_GPROJ), want);
    AttnOptions det = {0};
    det.deterministic = 1;
    const AttnShape s3 = {2, 3, 300, 128}; /* 3 key blocks of 128, the last one partial */
    const size_t rows = (size_t)2 * 3 * 300;
    for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
        const AttnMode mode = (AttnMode)m;
        const size_t slices = (mode == ATTN_GPROJ) ? 1 : 3;
        const size_t want3 = (slices * rows * 128 + 2 * rows) * sizeof(float);
        CHECK(attention_cuda_workspace_bytes(s3, mode, det) == want3,
              "%s deterministic: workspace %zu == %zu (%zu dQ slice(s) + D + lambda)", attn_mode_name(mode),
              attention_cuda_workspace_bytes(s3, mode, det), want3, slices);
    }
}

/* ---- the two forward paths: dispatch, and Hopper vs portable directly ---- */

/* One BF16 ulp (8 significant bits) at the magnitude max(|x|, floor); the floor is the RMS of the row
   (entries near zero come from cancellation; their error scales with the row). */
static double bf16_ulp_at(double x, double floor_mag) {
    const double a = fmax(fabs(x), floor_mag);
    return a > 0 ? ldexp(1.0, (int)floor(log2(a)) - 7) : 0.0;
}

/* Differences between two paths in BF16 ulps (bf16_ulp_at with the reference row's RMS as the floor). */
typedef struct {
    double max_ulps; /* the largest */
    long over_1ulp;  /* elements more than one ulp apart */
    long nonfinite;  /* elements not finite on either path (not compared) */
} UlpTally;

/* Adds one row of n values: ref (its RMS is the floor) against got. */
static void ulp_tally_row(UlpTally* t, const float* ref, const float* got, int n) {
    double sq = 0;
    for (int d = 0; d < n; d++) sq += (double)ref[d] * ref[d];
    const double rms = sqrt(sq / n);
    for (int d = 0; d < n; d++) {
        const double a = ref[d], x = got[d];
        if (!isfinite(a) || !isfinite(x)) { t->nonfinite++; continue; }
        const double diff = fabs(a - x), ulp = bf16_ulp_at(fmax(fabs(a), fabs(x)), rms);
        const double ulps = diff == 0 ? 0 : (ulp > 0 ? diff / ulp : INFINITY);
        if (ulps > t->max_ulps) t->max_ulps = ulps;
        t->over_1ulp += ulps > 1.0;
    }
}

/* The host inputs of one random case (attn_case_random(q_scale, seed)) for shape s; the caller frees both. */
static void random_case_inputs(AttnShape s, float q_scale, uint64_t seed, float** qkv, float** dout) {
    *qkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(s));
    *dout = (float*)mallocCheck(sizeof(float) * attn_out_count(s));
    AttnCase cs = attn_case_random(q_scale, seed);
    attn_case_fill(&cs, s, *qkv, *dout);
}

/* ulp_tally_row over every row of one slot (0 dQ, 1 dK, 2 dV) of two dqkv tensors. */
static UlpTally slot_ulps(AttnShape s, const float* ref, const float* got, int slot) {
    UlpTally t = {0, 0, 0};
    for (size_t v = 0; v < (size_t)s.B * s.T * s.NH; v++) {
        const size_t bt = v / s.NH, h = v % s.NH;
        const size_t base = bt * 3 * s.NH * s.HS + ((size_t)slot * s.NH + h) * s.HS;
        ulp_tally_row(&t, ref + base, got + base, s.HS);
    }
    return t;
}

/* Forward of `mode` on the device qkv with opt, outputs to host floats (NaN-poisoned first). */
static void forward_to_host(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* d_qkv, float* out,
                            float* stats) {
    const size_t nout = attn_out_count(s), nstats = attn_stats_count(s);
    __nv_bfloat16* d_out;
    float* d_stats;
    cudaCheck(cudaMalloc(&d_out, sizeof(__nv_bfloat16) * nout));
    cudaCheck(cudaMalloc(&d_stats, sizeof(float) * nstats));
    cudaCheck(cudaMemset(d_out, 0xFF, sizeof(__nv_bfloat16) * nout));
    cudaCheck(cudaMemset(d_stats, 0xFF, sizeof(float) * nstats));
    attention_forward_cuda(mode, opt, s, d_qkv, d_out, d_stats, NULL, 0);
    cudaCheck(cudaDeviceSynchronize());
    from_device_bf16(out, d_out, nout);
    cudaCheck(cudaMemcpy(stats, d_stats, sizeof(float) * nstats, cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_stats));
}

/* Tolerances of the direct comparison (the lab's, dev/attention_lab/hopper_fwd.cu): the two kernels
   round e to BF16 at different running maxima (128- vs 64-key tiles) and sum in different orders, so O
   agrees to about one BF16 ulp of its row's scale (4 allowed; the H200 run of bf16 mode: <= 2.5), and
   the stats to FP32 level: LSE and m within 1e-5 of 1 + |x|, l within 1e-5 relative. */
static const double kPathMaxOUlps = 4.0;
static const double kPathMaxStatDiff = 1e-5;

static void test_forward_paths(int is_sm90, uint64_t seed) {
    test_section("forward paths: dispatch, and the Hopper forward vs the portable one (O in BF16 ulps, stats)");
    AttnOptions automatic = {0}, portable = {0}, shift = {0};
    portable.force_portable = 1;
    shift.tile_max_shift = 1;
    const AttnShape probe_shape = {2, 4, 100, 64};
    const void* aligned = (const void*)(uintptr_t)256, * misaligned = (const void*)(uintptr_t)258;
    for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
        const AttnMode mode = (AttnMode)m;
        const AttnFwdPath want = is_sm90 ? ATTN_FWD_HOPPER : ATTN_FWD_PORTABLE;
        const AttnFwdPath got = attention_forward_cuda_path(mode, automatic, probe_shape, (const __nv_bfloat16*)aligned);
        CHECK(got == want, "%s: default path on this device is %s (want %s)", attn_mode_name(mode),
              attn_fwd_path_name(got), attn_fwd_path_name(want));
        CHECK(attention_forward_cuda_path(mode, portable, probe_shape, (const __nv_bfloat16*)aligned) ==
                  ATTN_FWD_PORTABLE, "%s: force_portable = 1 gives the portable path", attn_mode_name(mode));
        CHECK(attention_forward_cuda_path(mode, automatic, probe_shape, (const __nv_bfloat16*)misaligned) ==
                  ATTN_FWD_PORTABLE, "%s: a qkv pointer TMA cannot take (2 mod 16) gives the portable path",
              attn_mode_name(mode));
    }
    CHECK(attention_forward_cuda_path(ATTN_REPAIR, shift, probe_shape, (const __nv_bfloat16*)aligned) ==
              ATTN_FWD_PORTABLE, "repair with the tile-max shift arm gives the portable path");
    if (!is_sm90) {
        printf("  (the direct Hopper-vs-portable comparison needs an sm_90 device; this one is not)\n");
        return;
    }
    const AttnShape shapes[] = {{1, 1, 1, 64}, {1, 3, 77, 64}, {2, 4, 1000, 64}, {1, 2, 129, 128}, {2, 3, 600, 128}};
    const float q_scales[] = {1.f, 8.f}; /* x8: sharp rows, the running max moves late */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t qi = 0; qi < sizeof q_scales / sizeof q_scales[0]; qi++) {
            const AttnShape s = shapes[si];
            const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
            float *qkv, *dout;
            random_case_inputs(s, q_scales[qi], seed + 17 * si + qi, &qkv, &dout);
            __nv_bfloat16* d_qkv = to_device_bf16(qkv, nqkv);
            float *o_h = (float*)mallocCheck(sizeof(float) * nout), *o_p = (float*)mallocCheck(sizeof(float) * nout);
            float *st_h = (float*)mallocCheck(sizeof(float) * nstats), *st_p = (float*)mallocCheck(sizeof(float) * nstats);
            for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
                const AttnMode mode = (AttnMode)m;
                char label[128];
                snprintf(label, sizeof label, "B%d NH%d T%d HS%d q x%.0f %s hopper vs portable", s.B, s.NH, s.T, s.HS,
                         q_scales[qi], attn_mode_name(mode));
                CHECK(attention_forward_cuda_path(mode, automatic, s, d_qkv) == ATTN_FWD_HOPPER,
                      "%s: the default path is the Hopper forward", label);
                forward_to_host(mode, automatic, s, d_qkv, o_h, st_h);
                forward_to_host(mode, portable, s, d_qkv, o_p, st_p);
                UlpTally o = {0, 0, 0};
                for (size_t row = 0; row < nout / s.HS; row++)
                    ulp_tally_row(&o, o_p + row * s.HS, o_h + row * s.HS, s.HS);
                const double max_ulps = o.max_ulps;
                const long over_1ulp = o.over_1ulp;
                long nonfinite = o.nonfinite, bad_second = 0, m_exact = 0;
                double max_first = 0, max_l = 0;
                for (size_t i = 0; i < nstats; i += 2) {
                    const double a = st_p[i], x = st_h[i], a1 = st_p[i + 1], x1 = st_h[i + 1];
                    if (!isfinite(a) || !isfinite(x) || !isfinite(a1) || !isfinite(x1)) { nonfinite++; continue; }
                    max_first = fmax(max_first, fabs(a - x) / (1.0 + fabs(a)));
                    if (mode == ATTN_BF16) {
                        bad_second += (x1 != 0.0);
                    } else {
                        m_exact += (a == x);
                        max_l = fmax(max_l, fabs(a1 - x1) / fabs(a1));
                    }
                }
                printf("  %s: O max %.2f BF16 ulps (%ld of %zu over 1); %s max rel diff %.3g", label, max_ulps,
                       over_1ulp, nout, mode == ATTN_BF16 ? "LSE" : "m", max_first);
                if (mode != ATTN_BF16) printf(" (%ld of %zu rows bit-identical), l max rel diff %.3g", m_exact,
                                              nstats / 2, max_l);
                printf("\n");
                CHECK(nonfinite == 0, "%s: every O and stats value written and finite on both paths (%ld not)", label,
                      nonfinite);
                CHECK(max_ulps <= kPathMaxOUlps, "%s: O within %.0f BF16 ulps (max %.2f)", label, kPathMaxOUlps,
                      max_ulps);
                if (mode == ATTN_BF16) {
                    CHECK(max_first <= kPathMaxStatDiff && bad_second == 0,
                          "%s: stats {LSE, 0}, LSE within %.0e (max %.3g; %ld nonzero second values)", label,
                          kPathMaxStatDiff, max_first, bad_second);
                } else {
                    CHECK(max_first <= kPathMaxStatDiff && max_l <= kPathMaxStatDiff,
                          "%s: stats {m, l} within %.0e (m %.3g, l %.3g)", label, kPathMaxStatDiff, max_first, max_l);
                }
            }
            cudaCheck(cudaFree(d_qkv));
            free(qkv); free(dout); free(o_h); free(o_p); free(st_h); free(st_p);
        }
}

/* ---- the two backward paths: dispatch, and Hopper vs portable directly ---- */

/* Which modes and head sizes the Hopper backward serves on an sm_90 device (attention_cuda.cuh): at HS 64
   and 128 every mode has a Hopper chain (attention_hopper_bwd.cuh: the key-major pass for bf16 and repair; the
   row pass, then the mode's key-major pass for gproj and fp32). */
static int hopper_bwd_expected(AttnMode mode, int HS) {
    (void)mode;
    return HS == 64 || HS == 128;
}

/* Backward of `mode` with opt on device inputs, dqkv to host floats (dqkv NaN-poisoned first, the workspace
   filled with ws_fill bytes: 0xFF = NaN); row_slots (or NULL; default options only): the workspace's D [rows]
   then lambda [rows] FP32, after dq_acc [rows * HS] (the layout of carve_workspace in
   attention/cuda/attention_cuda.cu, internal there; the caller checks the size). */
static void backward_to_host_filled(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* d_qkv,
                                    const __nv_bfloat16* d_out, const float* d_stats, const __nv_bfloat16* d_dout,
                                    float* dqkv, float* row_slots, int ws_fill) {
    const size_t nqkv = attn_qkv_count(s), ws_bytes = attention_cuda_workspace_bytes(s, mode, opt);
    __nv_bfloat16* d_dqkv;
    void* d_ws;
    cudaCheck(cudaMalloc(&d_dqkv, sizeof(__nv_bfloat16) * nqkv));
    cudaCheck(cudaMalloc(&d_ws, ws_bytes));
    cudaCheck(cudaMemset(d_dqkv, 0xFF, sizeof(__nv_bfloat16) * nqkv));
    cudaCheck(cudaMemset(d_ws, ws_fill, ws_bytes));
    attention_backward_cuda(mode, opt, s, d_qkv, d_out, d_stats, d_dout, d_dqkv, d_ws, 0);
    cudaCheck(cudaDeviceSynchronize());
    from_device_bf16(dqkv, d_dqkv, nqkv);
    if (row_slots != NULL) {
        const size_t rows = (size_t)s.B * s.NH * s.T;
        cudaCheck(cudaMemcpy(row_slots, (const float*)d_ws + rows * s.HS, 2 * rows * sizeof(float),
                             cudaMemcpyDeviceToHost));
    }
    cudaCheck(cudaFree(d_dqkv));
    cudaCheck(cudaFree(d_ws));
}
static void backward_to_host(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* d_qkv,
                             const __nv_bfloat16* d_out, const float* d_stats, const __nv_bfloat16* d_dout,
                             float* dqkv, float* row_slots) {
    backward_to_host_filled(mode, opt, s, d_qkv, d_out, d_stats, d_dout, dqkv, row_slots, 0xFF);
}

/* Tolerances of the direct comparison, the labs' (dev/attention_lab/hopper_*.cu): the kernels sum S, dP,
   dK/dV and the dQ partials (or gproj's DSK/PK) in different FP32 orders, and a changed FP32 S can flip
   the BF16 rounding of one P or dS, so dQ, dK and dV agree within a few BF16 ulps of max(|a|, |b|, the
   row's RMS): 4 for every key-major pass at both head sizes (the labs measured at most 1.00), and 8 for
   gproj's dQ, which the row pass computes whole (hopper_rows.cu, hopper_rows128.cu: bit-equal on the H200). */
static const double kPathMaxGradUlps = 4.0;
static const double kPathMaxGprojDqUlps = 8.0;
/* The row pass's workspace outputs, the row-pass labs' tolerances (dev/attention_lab/hopper_rows.cu, HS 64;
   hopper_rows128.cu, HS 128: bit-equal on the H200 at both head sizes): fp32's D = sum P dP within 1e-5
   sigma_dP; gproj's lambda within 16 u at most and 1e-2 u in the median, u = 2^-9 sigma_dP (one flipped
   BF16 rounding of dS moves lambda by up to 2^-8 |dS| / p). sigma_dP = sqrt(HS) rms(dO) rms(V), the scale
   of dP - D. */
static const double kPathMaxDRel = 1e-5;
static const double kPathMaxLambdaUnits = 16.0;
static const double kPathMedLambdaUnits = 1e-2;

static int cmp_double(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* fp32's D or gproj's lambda of the Hopper path (got) vs the portable one (ref), `rows` values: non-finite
   values, and |diff| / unit: max and median. */
static void compare_row_slot(const char* label, const char* what, const float* ref, const float* got, size_t rows,
                             double unit, double max_tol, double med_tol) {
    double* units = (double*)mallocCheck(sizeof(double) * (rows ? rows : 1));
    size_t nonfinite = 0, n = 0, unequal = 0;
    double max_units = 0;
    for (size_t i = 0; i < rows; i++) {
        if (!isfinite(ref[i]) || !isfinite(got[i])) { nonfinite++; continue; }
        unequal += ref[i] != got[i];
        units[n] = fabs((double)ref[i] - got[i]) / unit;
        if (units[n] > max_units) max_units = units[n];
        n++;
    }
    qsort(units, n, sizeof(double), cmp_double);
    const double med_units = n ? units[n / 2] : 0;
    printf("  %s: %s %zu of %zu rows not bit-equal, |diff| / %.3g: median %.3g, max %.3g\n", label, what, unequal,
           rows, unit, med_units, max_units);
    CHECK(nonfinite == 0, "%s: %s written and finite on both paths (%zu not)", label, what, nonfinite);
    CHECK(max_units <= max_tol, "%s: %s max |diff| <= %.3g (max %.3g)", label, what, max_tol, max_units);
    if (med_tol > 0)
        CHECK(med_units <= med_tol, "%s: %s median |diff| <= %.0e (%.3g)", label, what, med_tol, med_units);
    free(units);
}

static void test_backward_paths(int is_sm90, uint64_t seed) {
    test_section("backward paths: dispatch, and the Hopper backward vs the portable one (dQ, dK, dV in BF16 ulps)");
    AttnOptions automatic = {0}, portable = {0}, shift = {0};
    portable.force_portable = 1;
    shift.tile_max_shift = 1;
    const AttnShape s64 = {2, 4, 100, 64}, s128 = {2, 4, 100, 128};
    const __nv_bfloat16* aligned = (const __nv_bfloat16*)(uintptr_t)256;
    const __nv_bfloat16* misaligned = (const __nv_bfloat16*)(uintptr_t)258;
    for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
        const AttnMode mode = (AttnMode)m;
        const AttnBwdPath want = (is_sm90 && hopper_bwd_expected(mode, 64)) ? ATTN_BWD_HOPPER : ATTN_BWD_PORTABLE;
        const AttnBwdPath want128 = (is_sm90 && hopper_bwd_expected(mode, 128)) ? ATTN_BWD_HOPPER : ATTN_BWD_PORTABLE;
        const AttnBwdPath got = attention_backward_cuda_path(mode, automatic, s64, aligned, aligned);
        CHECK(got == want, "%s HS64: default backward path on this device is %s (want %s)", attn_mode_name(mode),
              attn_bwd_path_name(got), attn_bwd_path_name(want));
        CHECK(attention_backward_cuda_path(mode, automatic, s128, aligned, aligned) == want128,
              "%s HS128: default backward path is %s", attn_mode_name(mode), attn_bwd_path_name(want128));
        CHECK(attention_backward_cuda_path(mode, portable, s64, aligned, aligned) == ATTN_BWD_PORTABLE,
              "%s: force_portable = 1 gives the portable backward", attn_mode_name(mode));
        CHECK(attention_backward_cuda_path(mode, automatic, s64, misaligned, aligned) == ATTN_BWD_PORTABLE &&
                  attention_backward_cuda_path(mode, automatic, s64, aligned, misaligned) == ATTN_BWD_PORTABLE,
              "%s: a qkv or dout pointer TMA cannot take (2 mod 16) gives the portable backward", attn_mode_name(mode));
    }
    CHECK(attention_backward_cuda_path(ATTN_REPAIR, shift, s64, aligned, aligned) == ATTN_BWD_PORTABLE,
          "repair with the tile-max shift arm gives the portable backward");
    /* The path name only says "hopper"; which passes the Hopper chain runs is its table's answer
       (attention_hopper_bwd_dispatch.cu's kHopperBwdChains, through attention_hopper_bwd_supports): the key-major
       pass in bf16 and repair, the row pass then the mode's key-major pass in fp32 and gproj, at both head sizes. */
    const int keys = ATTN_HOPPER_KEY_PASS, rows_keys = ATTN_HOPPER_ROW_PASS | ATTN_HOPPER_KEY_PASS;
    const AttnShape s96 = {2, 4, 100, 96};
    for (int hi = 0; hi < 2; hi++) {
        const AttnShape sh = hi ? s128 : s64;
        CHECK(attention_hopper_bwd_supports(ATTN_BF16, automatic, sh, aligned, aligned) == keys &&
                  attention_hopper_bwd_supports(ATTN_REPAIR, automatic, sh, aligned, aligned) == keys &&
                  attention_hopper_bwd_supports(ATTN_FP32, automatic, sh, aligned, aligned) == rows_keys &&
                  attention_hopper_bwd_supports(ATTN_GPROJ, automatic, sh, aligned, aligned) == rows_keys,
              "HS %d: the Hopper chain is the key-major pass (bf16, repair), the row pass + the key-major pass "
              "(fp32, gproj)", sh.HS);
    }
    CHECK(!attention_hopper_bwd_supports(ATTN_CUDNN, automatic, s64, aligned, aligned) &&
              !attention_hopper_bwd_supports(ATTN_REPAIR, shift, s64, aligned, aligned) &&
              !attention_hopper_bwd_supports(ATTN_FP32, automatic, s96, aligned, aligned) &&
              !attention_hopper_bwd_supports(ATTN_FP32, automatic, s64, misaligned, aligned) &&
              !attention_hopper_bwd_supports(ATTN_GPROJ, automatic, s64, aligned, misaligned),
          "the Hopper backward refuses cudnn, repair's shift arm, HS 96 and qkv or dout pointers TMA cannot take");
    if (!is_sm90) {
        printf("  (the direct Hopper-vs-portable comparison needs an sm_90 device; this one is not)\n");
        return;
    }
    static const char* kSlotName[3] = {"dQ", "dK", "dV"};
    /* T = 1, odd, under one 64-query tile, not a multiple of the 128-key tile; one to 128 heads; HS 64 and 128 */
    const AttnShape shapes[] = {{1, 1, 1, 64},    {1, 3, 77, 64},    {1, 2, 129, 64},  {2, 4, 1000, 64},
                                {4, 32, 257, 64}, {1, 1, 1, 128},    {1, 3, 45, 128},  {1, 2, 129, 128},
                                {2, 4, 1000, 128}, {4, 8, 257, 128}};
    const float q_scales[] = {1.f, 8.f}; /* x8: sharp rows */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t qi = 0; qi < sizeof q_scales / sizeof q_scales[0]; qi++) {
            const AttnShape s = shapes[si];
            const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
            float *qkv, *dout;
            random_case_inputs(s, q_scales[qi], seed + 31 * si + qi, &qkv, &dout);
            __nv_bfloat16* d_qkv = to_device_bf16(qkv, nqkv);
            __nv_bfloat16* d_dout = to_device_bf16(dout, nout);
            __nv_bfloat16* d_out;
            float* d_stats;
            cudaCheck(cudaMalloc(&d_out, sizeof(__nv_bfloat16) * nout));
            cudaCheck(cudaMalloc(&d_stats, sizeof(float) * nstats));
            float *g_h = (float*)mallocCheck(sizeof(float) * nqkv), *g_p = (float*)mallocCheck(sizeof(float) * nqkv);
            /* the row pass's scale: sigma_dP = sqrt(HS) rms(dO) rms(V) over the whole tensors */
            const size_t rows = (size_t)s.B * s.NH * s.T;
            double sq_do = 0, sq_v = 0;
            for (size_t i = 0; i < nout; i++) sq_do += (double)dout[i] * dout[i];
            for (size_t bt = 0; bt < (size_t)s.B * s.T; bt++)
                for (size_t j = 0; j < (size_t)s.NH * s.HS; j++) {
                    const double v = qkv[bt * 3 * s.NH * s.HS + 2 * (size_t)s.NH * s.HS + j]; /* v slot */
                    sq_v += v * v;
                }
            const double sigma_dp = sqrt((double)s.HS) * sqrt(sq_do / nout) * sqrt(sq_v / nout);
            float* rs_h = (float*)mallocCheck(sizeof(float) * 2 * rows); /* D then lambda, per path */
            float* rs_p = (float*)mallocCheck(sizeof(float) * 2 * rows);
            for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
                const AttnMode mode = (AttnMode)m;
                if (!hopper_bwd_expected(mode, s.HS)) continue;
                char label[128];
                snprintf(label, sizeof label, "B%d NH%d T%d HS%d q x%.0f %s hopper vs portable bwd", s.B, s.NH, s.T,
                         s.HS, q_scales[qi], attn_mode_name(mode));
                CHECK(attention_backward_cuda_path(mode, automatic, s, d_qkv, d_dout) == ATTN_BWD_HOPPER,
                      "%s: the default path is the Hopper backward", label);
                /* one forward (the default one), both backwards on its out and stats */
                attention_forward_cuda(mode, automatic, s, d_qkv, d_out, d_stats, NULL, 0);
                backward_to_host(mode, automatic, s, d_qkv, d_out, d_stats, d_dout, g_h, rs_h);
                backward_to_host(mode, portable, s, d_qkv, d_out, d_stats, d_dout, g_p, rs_p);
                if (mode == ATTN_FP32 || mode == ATTN_GPROJ) { /* the row pass's own outputs */
                    CHECK(attention_cuda_workspace_bytes(s, mode) == (rows * s.HS + 2 * rows) * sizeof(float),
                          "%s: workspace is dq_acc[rows*HS] + D[rows] + lambda[rows] FP32 (the layout read here)",
                          label);
                    if (mode == ATTN_FP32)
                        compare_row_slot(label, "D = sum P dP", rs_p, rs_h, rows, sigma_dp, kPathMaxDRel, 0);
                    else
                        compare_row_slot(label, "lambda (u = 2^-9 sigma_dP)", rs_p + rows, rs_h + rows, rows,
                                         ldexp(sigma_dp, -9), kPathMaxLambdaUnits, kPathMedLambdaUnits);
                }
                for (int slot = 0; slot < 3; slot++) {
                    const UlpTally t = slot_ulps(s, g_p, g_h, slot);
                    const double max_ulps = t.max_ulps;
                    const long nonfinite = t.nonfinite, over_1ulp = t.over_1ulp;
                    printf("  %s: %s max %.2f BF16 ulps (%ld of %zu over 1)\n", label, kSlotName[slot], max_ulps,
                           over_1ulp, nqkv / 3);
                    CHECK(nonfinite == 0, "%s: %s written and finite on both paths (%ld not)", label, kSlotName[slot],
                          nonfinite);
                    const double tol = (mode == ATTN_GPROJ && slot == 0) ? kPathMaxGprojDqUlps : kPathMaxGradUlps;
                    CHECK(max_ulps <= tol, "%s: %s within %.0f BF16 ulps (max %.2f)", label, kSlotName[slot], tol,
                          max_ulps);
                }
            }
            cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out));
            cudaCheck(cudaFree(d_stats));
            free(qkv); free(dout); free(g_h); free(g_p); free(rs_h); free(rs_p);
        }
}

/* ---- the deterministic backward (AttnOptions.deterministic = 1, docs/determinism.md) ---- */

/* The BF16 bits of dqkv after one backward (dqkv NaN-poisoned first, the workspace filled with ws_fill). */
static void backward_bits(AttnMode mode, AttnOptions opt, AttnShape s, const __nv_bfloat16* d_qkv,
                          const __nv_bfloat16* d_out, const float* d_stats, const __nv_bfloat16* d_dout,
                          unsigned short* bits, int ws_fill) {
    const size_t nqkv = attn_qkv_count(s);
    float* f = (float*)mallocCheck(sizeof(float) * nqkv);
    backward_to_host_filled(mode, opt, s, d_qkv, d_out, d_stats, d_dout, f, NULL, ws_fill);
    for (size_t i = 0; i < nqkv; i++) bits[i] = float_to_bf16_bits(f[i]); /* exact: f holds BF16 values */
    free(f);
}


/* Every mode, HS 64 and 128, T = 1, 77 (under one key block), 300 (three, the last partial) and 1000, on every
   backward path of the device (sm_90: the default Hopper one and force_portable): with deterministic on, two
   backward calls on the same inputs, the workspace holding NaN before the first and zeros before the second,
   give bit-identical dQ, dK, dV (memcmp). Against the same call with deterministic off: dK and dV bit-equal
   (the same kernels; only where dQ's partials go differs), dQ within the backward-path tolerance (the same FP32
   partials summed in another order; gproj: bit-equal, its dQ never had partials), and the errors vs fp64 within
   the emulation tolerance of the flag-off errors (fp32 and gproj: also at the output floor). */
static void test_deterministic(uint64_t seed) {
    test_section("deterministic backward: bit-identical repeats, and the flag-off results within tolerance");
    static const char* kSlotName[3] = {"dQ", "dK", "dV"};
    const int Ts[] = {1, 77, 300, 1000};
    attn_errors_print_header(stdout);
    for (int hi = 0; hi < 2; hi++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const AttnShape s = {Ts[ti] >= 1000 ? 1 : 2, Ts[ti] >= 1000 ? 2 : 3, Ts[ti], hi ? 128 : 64};
            const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
            float* qkv = (float*)mallocCheck(sizeof(float) * nqkv);
            float* dout = (float*)mallocCheck(sizeof(float) * nout);
            AttnCase cs = attn_case_random(2.0, seed + 7 * ti + hi);
            attn_case_fill(&cs, s, qkv, dout);
            Reference ref = reference_compute(s, qkv, dout);
            __nv_bfloat16* d_qkv = to_device_bf16(qkv, nqkv);
            __nv_bfloat16* d_dout = to_device_bf16(dout, nout);
            __nv_bfloat16* d_out;
            float* d_stats;
            cudaCheck(cudaMalloc(&d_out, sizeof(__nv_bfloat16) * nout));
            cudaCheck(cudaMalloc(&d_stats, sizeof(float) * nstats));
            unsigned short *bits1 = (unsigned short*)mallocCheck(sizeof(unsigned short) * nqkv),
                           *bits2 = (unsigned short*)mallocCheck(sizeof(unsigned short) * nqkv);
            float *g_det = (float*)mallocCheck(sizeof(float) * nqkv), *g_off = (float*)mallocCheck(sizeof(float) * nqkv);
            float* out_h = (float*)mallocCheck(sizeof(float) * nout);
            for (int p = 0; p < g_num_paths; p++)
                for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
                    const AttnMode mode = (AttnMode)m;
                    AttnOptions off = {0};
                    off.force_portable = k_path_force_portable[p];
                    AttnOptions det = off;
                    det.deterministic = 1;
                    char label[160];
                    snprintf(label, sizeof label, "B%d NH%d T%d HS%d %s deterministic [%s]", s.B, s.NH, s.T, s.HS,
                             attn_mode_name(mode),
                             path_tag(attention_forward_cuda_path(mode, off, s, d_qkv),
                                      attention_backward_cuda_path(mode, det, s, d_qkv, d_dout)));
                    CHECK(attention_backward_cuda_path(mode, det, s, d_qkv, d_dout) ==
                              attention_backward_cuda_path(mode, off, s, d_qkv, d_dout),
                          "%s: the same backward path as with deterministic off", label);
                    /* one forward; every backward below reads its out and stats */
                    attention_forward_cuda(mode, off, s, d_qkv, d_out, d_stats, NULL, 0);
                    cudaCheck(cudaDeviceSynchronize());
                    from_device_bf16(out_h, d_out, nout);
                    backward_bits(mode, det, s, d_qkv, d_out, d_stats, d_dout, bits1, 0xFF);
                    backward_bits(mode, det, s, d_qkv, d_out, d_stats, d_dout, bits2, 0x00);
                    long differ = 0;
                    for (size_t i = 0; i < nqkv; i++) differ += bits1[i] != bits2[i];
                    CHECK(memcmp(bits1, bits2, sizeof(unsigned short) * nqkv) == 0,
                          "%s: two calls give bit-identical dQ, dK, dV (%ld of %zu elements differ)", label, differ,
                          nqkv);
                    for (size_t i = 0; i < nqkv; i++) g_det[i] = bf16_bits_to_float(bits1[i]);
                    backward_to_host(mode, off, s, d_qkv, d_out, d_stats, d_dout, g_off, NULL);
                    for (int slot = 0; slot < 3; slot++) {
                        const UlpTally t = slot_ulps(s, g_off, g_det, slot);
                        const double ulps = t.max_ulps;
                        const long nonfinite = t.nonfinite;
                        long unequal = 0;
                        for (size_t v = 0; v < (size_t)s.B * s.T * s.NH; v++) {
                            const size_t base = (v / s.NH) * 3 * s.NH * s.HS + ((size_t)slot * s.NH + v % s.NH) * s.HS;
                            for (int d = 0; d < s.HS; d++)
                                unequal += float_to_bf16_bits(g_off[base + d]) != float_to_bf16_bits(g_det[base + d]);
                        }
                        printf("  %s: %s vs deterministic off: max %.2f BF16 ulps, %ld elements not bit-equal\n", label,
                               kSlotName[slot], ulps, unequal);
                        CHECK(nonfinite == 0, "%s: %s written and finite with deterministic on and off (%ld not)",
                              label, kSlotName[slot], nonfinite);
                        if (slot == 0 && mode != ATTN_GPROJ)
                            CHECK(ulps <= kPathMaxGradUlps, "%s: dQ within %.0f BF16 ulps of deterministic off (max %.2f)",
                                  label, kPathMaxGradUlps, ulps);
                        else
                            CHECK(unequal == 0, "%s: %s bit-equal to deterministic off (%ld elements differ)", label,
                                  kSlotName[slot], unequal);
                    }
                    /* errors vs fp64: deterministic on within the emulation tolerance of deterministic off */
                    AttnErrors e_det, e_off;
                    attn_errors_compute(s, out_h, ref.out_ref, g_det, ref.dqkv_ref, NULL, &e_det);
                    attn_errors_compute(s, out_h, ref.out_ref, g_off, ref.dqkv_ref, NULL, &e_off);
                    char row[192];
                    snprintf(row, sizeof row, "%s on", label);
                    attn_errors_print_row(stdout, row, &e_det);
                    snprintf(row, sizeof row, "%s off", label);
                    attn_errors_print_row(stdout, row, &e_off);
                    for (int t = ATTN_T_DQ; t < ATTN_NUM_TENSORS; t++) {
                        if (e_off.err[t].zero_ref_heads > 0) continue; /* T = 1: dQ, dK exactly 0 in exact arithmetic */
                        const double a = e_det.err[t].median, o = e_off.err[t].median;
                        const double tol = kCloseAbs + kCloseRel * o;
                        CHECK(fabs(a - o) <= tol, "%s: %s error vs fp64 %.3g%% within %.3g%% of deterministic off's %.3g%%",
                              label, attn_tensor_name((AttnTensor)t), 100 * a, 100 * tol, 100 * o);
                        if ((mode == ATTN_FP32 || mode == ATTN_GPROJ) && (t == ATTN_T_DQ || t == ATTN_T_DK))
                            CHECK(a <= kOutputFloorTarget, "%s: %s median error %.3g%% <= %.2f%%", label,
                                  attn_tensor_name((AttnTensor)t), 100 * a, 100 * kOutputFloorTarget);
                    }
                }
            cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out));
            cudaCheck(cudaFree(d_stats));
            reference_free(&ref);
            free(qkv); free(dout); free(bits1); free(bits2); free(g_det); free(g_off); free(out_h);
        }
}

/* The child of test_small_workspace_refused (this program run with kSmallWorkspaceFlag): a deterministic
   backward on a workspace sized for the default options, which attention_backward_cuda must refuse (exit 1). */
static const char kSmallWorkspaceFlag[] = "--child-small-deterministic-workspace";
static int child_small_workspace(void) {
    /* 8 key blocks: the deterministic workspace (17 MB) is 8x the default (2.2 MB), beyond any rounding of the
       allocation's size */
    const AttnShape s = {2, 4, 1024, 64};
    AttnOptions det = {0};
    det.deterministic = 1;
    __nv_bfloat16 *qkv, *out, *dout, *dqkv;
    float* stats;
    void* ws;
    cudaCheck(cudaMalloc(&qkv, sizeof(__nv_bfloat16) * attn_qkv_count(s)));
    cudaCheck(cudaMalloc(&dqkv, sizeof(__nv_bfloat16) * attn_qkv_count(s)));
    cudaCheck(cudaMalloc(&out, sizeof(__nv_bfloat16) * attn_out_count(s)));
    cudaCheck(cudaMalloc(&dout, sizeof(__nv_bfloat16) * attn_out_count(s)));
    cudaCheck(cudaMalloc(&stats, sizeof(float) * attn_stats_count(s)));
    cudaCheck(cudaMalloc(&ws, attention_cuda_workspace_bytes(s, ATTN_BF16))); /* the default options' size */
    attention_backward_cuda(ATTN_BF16, det, s, qkv, out, stats, dout, dqkv, ws, 0);
    cudaCheck(cudaDeviceSynchronize());
    return 0; /* not refused: the parent reports it */
}

/* test_run_captured's child: this program again with kSmallWorkspaceFlag (127 if it cannot start). */
static void exec_small_workspace_child(void* self) {
    execl((const char*)self, (const char*)self, kSmallWorkspaceFlag, (char*)NULL);
    _exit(127);
}

/* A caller that sets deterministic but sizes the workspace with the default options gets one clear error
   naming the sizes and the fix, not slices written past the allocation. Runs this program again as a child
   process (a fresh CUDA context), which must exit 1 with that message. */
static void test_small_workspace_refused(void) {
    const char* self = "/proc/self/exe";
    test_section("deterministic backward: a workspace sized for the default options is refused");
    char msg[2048];
    const int status = test_run_captured(exec_small_workspace_child, (void*)self, msg, sizeof msg);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "the child exits 1 (status %d)", status);
    CHECK(strstr(msg, "deterministic backward needs") && strstr(msg, "hint:") &&
              strstr(msg, "attention_cuda_workspace_bytes(shape, mode, options)"),
          "the message names the sizes and the fix (got: %.300s)", msg);
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], kSmallWorkspaceFlag) == 0) return child_small_workspace();
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        die("test_attention_gpu: no CUDA device found\n  hint: run this test on a machine with an NVIDIA GPU "
            "(make gputest)");
    }
    uint64_t seed = (uint64_t)time(NULL);
    const char* env = getenv("ATTN_TEST_SEED");
    if (env != NULL) seed = strtoull(env, NULL, 10);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("test_attention_gpu: device %s (sm_%d%d), seed %llu (repeat with ATTN_TEST_SEED=%llu)\n", prop.name,
           prop.major, prop.minor, (unsigned long long)seed, (unsigned long long)seed);
    /* every check below runs on each path the device has (labelled "[hopper fwd, hopper bwd]" etc.): on
       sm_90 the default (Hopper kernels where they serve the mode) and force_portable */
    const int is_sm90 = (prop.major == 9 && prop.minor == 0);
    g_num_paths = is_sm90 ? 2 : 1;
    printf("paths checked: %s\n", is_sm90 ? "default (Hopper kernels where they serve the mode) and force_portable"
                                         : "portable (not an sm_90 device)");
    test_workspace_size();
    test_forward_paths(is_sm90, seed + 4);
    test_backward_paths(is_sm90, seed + 5);
    test_deterministic(seed + 6);
    test_small_workspace_refused();
    test_hard_cases(64, 1024, seed);
    test_hard_cases(128, 1000, seed + 1);
    test_shapes(seed + 2);
    test_tile_max_shift(seed + 3);
    return test_summary();
}
