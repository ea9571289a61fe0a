/*
 * dev/cudnn_check.cu - one run on a GPU machine that tells everything about cudnn mode
 * (attention/cudnn/): does each graph variant build, which engine cuDNN picks, and are its O, stats,
 * dQ, dK, dV right.
 *
 * Why: the cuDNN graphs are written against the backend API without a GPU to try them on, so the first
 * run on an H200 must answer every question at once, and run every case even when one fails.
 *
 * Usage: build/dev/cudnn_check [--out DIR] [--seed N]
 * Prints, in order:
 *   1. versions: cudnnGetVersion() of the library and CUDNN_VERSION of the headers, the device.
 *   2. per shape (B2 NH4 T256 HS64, B8 NH12 T1024 HS64, B4 NH8 T1000 HS128, B2 NH4 T1 HS64,
 *      B2 NH4 T77 HS64), random inputs (q x1):
 *      - every forward variant (stats in our slot / packed + copy) and every backward variant
 *        (stats in slot / packed, dqkv in place / packed + copy, dQ direct / fp32 accumulator): the build
 *        log, one line per tensor and node with its status, the operation graph, the heuristics' engine
 *        configs (engine index, knobs, numerical notes) and which finalized, the workspace;
 *      - each variant that built is run: O and stats (LSE vs the fp64 reference, stats[.,1] == 0) and
 *        dQ, dK, dV (errors vs the fp64 reference, attention_ref.c) and bitwise agreement between variants;
 *      - the production path (attention_forward_cudnn / attention_backward_cudnn: what the trainer runs)
 *        and its describe line; our bf16 mode on the same inputs, and each backward fed the other's stats
 *        (the shared-contract check: a run can switch modes).
 *   3. the hard cases of attention/support/attn_cases.c (the published table plus rho 4/64/1024 at q x4) at
 *      B1 NH4 T256, HS 64 and 128: cudnn and bf16 mode against fp64 (attn_metrics tables) and per case the
 *      dQ median relative error of both, as the GPU tests report the key-offset leak.
 *   4. with --out DIR: DIR/torch_inputs_*.bin (inputs and our cudnn outputs) for dev/cudnn_check_torch.py.
 * Each check prints PASS or FAIL; the last line is "cudnn_check: N passed, N failed"; exit 1 if any failed.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/cudnn/attention_cudnn.cuh"
#include "attention/support/attn_cases.h"
#include "attention/support/attn_metrics.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/gpu_tensor.cuh"

static int g_pass = 0, g_fail = 0;
static void check(int ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

/* ---- host/device buffers (downloads: tests/gpu_tensor.cuh's download, download_f32) ---- */
static __nv_bfloat16* to_device(const float* x, size_t n) {
    std::vector<__nv_bfloat16> h(n);
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(x[i]);
    __nv_bfloat16* d = NULL;
    cudaCheck(cudaMalloc(&d, n * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    return d;
}
/* Runs pending work; a CUDA error is reported (not fatal) so the other cases still run. */
static int sync_ok(const char* what) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        check(0, "%s: CUDA error %s", what, cudaGetErrorString(e));
        return 0;
    }
    return 1;
}

struct Reference {
    std::vector<double> out, dqkv, lse; /* lse [B*NH*T] = m * scale + log(l) */
};
static Reference reference(AttnShape s, const float* qkv, const float* dout) {
    Reference r;
    std::vector<double> q(attn_qkv_count(s)), d(attn_out_count(s)), st(attn_stats_count(s));
    attn_float_to_double(qkv, q.data(), q.size());
    attn_float_to_double(dout, d.data(), d.size());
    r.out.resize(attn_out_count(s));
    r.dqkv.resize(attn_qkv_count(s));
    attention_forward_ref(s, q.data(), r.out.data());
    attention_backward_ref(s, q.data(), d.data(), r.dqkv.data());
    attention_stats_ref(s, q.data(), st.data());
    const double scale = 1.0 / sqrt((double)s.HS);
    r.lse.resize(st.size() / 2);
    for (size_t i = 0; i < r.lse.size(); i++) r.lse[i] = st[2 * i] * scale + log(st[2 * i + 1]);
    return r;
}

/* Stats checks: LSE vs the reference (absolute, natural-log units) and element 1 exactly 0. */
static void check_stats(const char* label, AttnShape s, const std::vector<float>& stats, const Reference& ref) {
    double maxd = 0;
    long nonzero1 = 0, nonfinite = 0;
    for (size_t i = 0; i < ref.lse.size(); i++) {
        if (!isfinite(stats[2 * i])) nonfinite++;
        else maxd = fmax(maxd, fabs(stats[2 * i] - ref.lse[i]));
        if (stats[2 * i + 1] != 0.0f) nonzero1++;
    }
    check(nonfinite == 0 && maxd <= 2e-3, "%s: stats LSE vs fp64 max |diff| %.3g (<= 2e-3), %ld non-finite", label,
          maxd, nonfinite);
    check(nonzero1 == 0, "%s: stats element 1 is 0 in every row (bf16 mode's {LSE, 0}); %ld rows differ", label,
          nonzero1);
}

static void check_errors(const char* label, const AttnErrors& e, int backward) {
    const double tol_o = 0.01, tol_g = 0.02; /* a BF16 flash kernel on random q x1: ~0.3-0.6% */
    long bad = 0;
    for (int t = 0; t < ATTN_NUM_TENSORS; t++) bad += e.nonfinite[t];
    check(bad == 0, "%s: no NaN/Inf (%ld)", label, bad);
    check(e.err[ATTN_T_O].median <= tol_o, "%s: O median error vs fp64 %.3g%% (<= %.1f%%, max %.3g%%)", label,
          100 * e.err[ATTN_T_O].median, 100 * tol_o, 100 * e.err[ATTN_T_O].max);
    if (!backward) return;
    for (int t = ATTN_T_DQ; t <= ATTN_T_DV; t++)
        check(e.err[t].median <= tol_g, "%s: %s median error vs fp64 %.3g%% (<= %.1f%%, max %.3g%%)", label,
              attn_tensor_name((AttnTensor)t), 100 * e.err[t].median, 100 * tol_g, 100 * e.err[t].max);
}

/* Fraction of equal bits and max |a - b| of two float copies of BF16 tensors. */
static void compare_bits(const char* label, const std::vector<float>& a, const std::vector<float>& b) {
    size_t eq = 0;
    double md = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) == 0) eq++;
        md = fmax(md, fabs((double)a[i] - b[i]));
    }
    printf("  %s: %.4f%% bit-equal, max |diff| %.3g\n", label, 100.0 * eq / (a.empty() ? 1 : a.size()), md);
}

/* Median over heads of ||a - b|| / ||b|| of one tensor (qkv-layout part or out). */
static double rel_diff_median(AttnShape s, AttnTensor t, const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<double> bd(b.begin(), b.end());
    std::vector<double> per(s.B * s.NH);
    attn_rel_errors_per_head(s, t, a.data(), bd.data(), per.data());
    return attn_err_stat_of(per.data(), (int)per.size()).median;
}

static void write_torch_inputs(const char* dir, const char* tag, AttnShape s, const float* qkv, const float* dout,
                               const std::vector<float>& out, const std::vector<float>& dqkv) {
    char path[1024];
    snprintf(path, sizeof path, "%s/torch_inputs_%s.bin", dir, tag);
    FILE* f = fopen(path, "wb");
    if (!f) {
        check(0, "cannot write %s", path);
        return;
    }
    const int32_t hdr[4] = {s.B, s.NH, s.T, s.HS};
    fwrite("CUDNNCHK", 1, 8, f);
    fwrite(hdr, sizeof hdr, 1, f);
    auto put = [&](const float* x, size_t n) {
        std::vector<uint16_t> b(n);
        for (size_t i = 0; i < n; i++) b[i] = float_to_bf16_bits(x[i]);
        fwrite(b.data(), 2, n, f);
    };
    put(qkv, attn_qkv_count(s));
    put(dout, attn_out_count(s));
    put(out.data(), out.size());
    put(dqkv.data(), dqkv.size());
    fclose(f);
    printf("  wrote %s (qkv, dout, our cudnn O and dqkv, BF16 bits)\n", path);
}

struct Run {
    std::vector<float> out, stats, dqkv;
};

/* One case's device tensors: the inputs qkv and dout (BF16 copies of the host ones; NULL where none was given)
   and the outputs O, dqkv and the stats. */
struct CaseBuffers {
    __nv_bfloat16 *qkv, *dout, *out, *dqkv;
    float* stats;
};
static CaseBuffers case_buffers(AttnShape s, const std::vector<float>* qkv, const std::vector<float>* dout) {
    CaseBuffers b;
    b.qkv = qkv ? to_device(qkv->data(), qkv->size()) : NULL;
    b.dout = dout ? to_device(dout->data(), dout->size()) : NULL;
    cudaCheck(cudaMalloc(&b.out, attn_out_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc(&b.dqkv, attn_qkv_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc(&b.stats, attn_stats_count(s) * sizeof(float)));
    return b;
}
static void case_buffers_free(CaseBuffers* b) {
    cudaFree(b->qkv); cudaFree(b->dout); cudaFree(b->out); cudaFree(b->dqkv); cudaFree(b->stats);
}
/* The outputs of a finished run: O and dqkv, and the stats where `with_stats`. */
static Run download_run(AttnShape s, const CaseBuffers& b, bool with_stats) {
    Run r;
    r.out = download(b.out, attn_out_count(s));
    r.dqkv = download(b.dqkv, attn_qkv_count(s));
    if (with_stats) r.stats = download_f32(b.stats, attn_stats_count(s));
    return r;
}

/* Our bf16 mode (our kernels) on the same inputs: forward, then backward on its own O and stats. */
static Run run_bf16(AttnShape s, const __nv_bfloat16* d_qkv, const __nv_bfloat16* d_dout) {
    Run r;
    CaseBuffers buf = case_buffers(s, NULL, NULL);
    const size_t wsb = attention_cuda_workspace_bytes(s, ATTN_BF16);
    void* ws;
    cudaCheck(cudaMalloc(&ws, wsb));
    attention_forward_cuda(ATTN_BF16, AttnOptions{}, s, d_qkv, buf.out, buf.stats, NULL, 0);
    attention_backward_cuda(ATTN_BF16, AttnOptions{}, s, d_qkv, buf.out, buf.stats, d_dout, buf.dqkv, ws, 0);
    if (sync_ok("bf16 mode")) r = download_run(s, buf, true);
    case_buffers_free(&buf);
    cudaFree(ws);
    return r;
}

static void shape_section(AttnShape s, uint64_t seed, const char* outdir) {
    printf("\n==== shape B%d NH%d T%d HS%d ====\n", s.B, s.NH, s.T, s.HS);
    std::vector<float> qkv(attn_qkv_count(s)), dout(attn_out_count(s));
    AttnCase c = attn_case_random(1.0, seed);
    attn_case_fill(&c, s, qkv.data(), dout.data());
    const Reference ref = reference(s, qkv.data(), dout.data());
    CaseBuffers buf = case_buffers(s, &qkv, &dout);
    char label[256], err[4096];
    std::vector<char> log(1 << 20);

    /* forward variants */
    std::vector<Run> fwd_runs;
    for (int sp = 0; sp < 2; sp++) {
        CudnnAttnVariant v = {sp, 0, 0, 0};
        log[0] = '\0';
        CudnnAttnPlan* p = attention_cudnn_plan_build(s, 0, v, log.data(), log.size());
        printf("%s", log.data());
        snprintf(label, sizeof label, "B%d NH%d T%d HS%d forward, stats %s", s.B, s.NH, s.T, s.HS,
                 sp ? "packed+copy" : "in slot");
        check(p != NULL, "%s: plan built%s%s", label, p ? ": " : "", p ? attention_cudnn_plan_describe(p) : "");
        if (!p) continue;
        printf("  plan JSON: %s\n", attention_cudnn_plan_json(p));
        cudaCheck(cudaMemset(buf.stats, 0xFF, attn_stats_count(s) * 4)); /* NaN: a row left unwritten shows */
        const int rc = attention_cudnn_plan_forward(p, buf.qkv, buf.out, buf.stats, 0, err, sizeof err);
        check(rc == 0, "%s: executed%s%s", label, rc ? ": " : "", rc ? err : "");
        if (rc == 0 && sync_ok(label)) {
            Run r;
            r.out = download(buf.out, attn_out_count(s));
            r.stats = download_f32(buf.stats, attn_stats_count(s));
            AttnErrors e;
            attn_errors_compute(s, r.out.data(), ref.out.data(), NULL, NULL, NULL, &e);
            check_errors(label, e, 0);
            check_stats(label, s, r.stats, ref);
            fwd_runs.push_back(r);
        }
        attention_cudnn_plan_free(p);
    }
    if (fwd_runs.size() == 2) compare_bits("forward O, stats in slot vs packed", fwd_runs[0].out, fwd_runs[1].out);

    /* backward variants, on the first forward that ran (its O and stats uploaded again) */
    std::vector<Run> bwd_runs;
    std::vector<std::string> bwd_names;
    if (!fwd_runs.empty()) {
        for (int sp = 0; sp < 2; sp++)
            for (int dp = 0; dp < 2; dp++)
                for (int acc = 0; acc < 2; acc++) {
                    CudnnAttnVariant v = {sp, dp, acc, 0};
                    log[0] = '\0';
                    CudnnAttnPlan* p = attention_cudnn_plan_build(s, 1, v, log.data(), log.size());
                    printf("%s", log.data());
                    snprintf(label, sizeof label, "B%d NH%d T%d HS%d backward, stats %s, dqkv %s, dQ %s", s.B, s.NH,
                             s.T, s.HS, sp ? "packed" : "in slot", dp ? "packed" : "in place", acc ? "accum" : "direct");
                    check(p != NULL, "%s: plan built%s%s", label, p ? ": " : "", p ? attention_cudnn_plan_describe(p) : "");
                    if (!p) continue;
                    printf("  plan JSON: %s\n", attention_cudnn_plan_json(p));
                    __nv_bfloat16* d_o = to_device(fwd_runs[0].out.data(), fwd_runs[0].out.size());
                    cudaCheck(cudaMemcpy(buf.stats, fwd_runs[0].stats.data(), attn_stats_count(s) * 4, cudaMemcpyHostToDevice));
                    cudaCheck(cudaMemset(buf.dqkv, 0xFF, attn_qkv_count(s) * 2)); /* NaN: unwritten parts show */
                    const int rc = attention_cudnn_plan_backward(p, buf.qkv, d_o, buf.stats, buf.dout, buf.dqkv, 0, err, sizeof err);
                    check(rc == 0, "%s: executed%s%s", label, rc ? ": " : "", rc ? err : "");
                    if (rc == 0 && sync_ok(label)) {
                        Run r;
                        r.dqkv = download(buf.dqkv, attn_qkv_count(s));
                        AttnErrors e;
                        attn_errors_compute(s, fwd_runs[0].out.data(), ref.out.data(), r.dqkv.data(), ref.dqkv.data(),
                                            NULL, &e);
                        attn_errors_print_header(stdout);
                        attn_errors_print_row(stdout, label, &e);
                        check_errors(label, e, 1);
                        bwd_runs.push_back(r);
                        bwd_names.push_back(label);
                    }
                    cudaFree(d_o);
                    attention_cudnn_plan_free(p);
                }
        for (size_t i = 1; i < bwd_runs.size(); i++) {
            snprintf(label, sizeof label, "dqkv of variant %zu vs variant 1 (%s)", i + 1, bwd_names[0].c_str());
            compare_bits(label, bwd_runs[i].dqkv, bwd_runs[0].dqkv);
        }
    }

    /* the production path, as the trainer calls it */
    attention_forward_cudnn(s, buf.qkv, buf.out, buf.stats, 0);
    attention_backward_cudnn(s, buf.qkv, buf.out, buf.stats, buf.dout, buf.dqkv, 0);
    snprintf(label, sizeof label, "B%d NH%d T%d HS%d production path", s.B, s.NH, s.T, s.HS);
    if (sync_ok(label)) {
        printf("  describe: %s\n", attention_cudnn_describe(s));
        Run cu = download_run(s, buf, true);
        AttnErrors e;
        attn_errors_compute(s, cu.out.data(), ref.out.data(), cu.dqkv.data(), ref.dqkv.data(), NULL, &e);
        attn_errors_print_header(stdout);
        attn_errors_print_row(stdout, label, &e);
        check_errors(label, e, 1);
        check_stats(label, s, cu.stats, ref);
        /* repeat: same bits? (cuDNN's dQ may be summed in arrival order) */
        attention_forward_cudnn(s, buf.qkv, buf.out, buf.stats, 0);
        attention_backward_cudnn(s, buf.qkv, buf.out, buf.stats, buf.dout, buf.dqkv, 0);
        if (sync_ok(label)) compare_bits("production path, second call vs first: dqkv", download(buf.dqkv, attn_qkv_count(s)), cu.dqkv);

        /* our bf16 mode on the same inputs, and the shared contract: each backward on the other's stats */
        Run b = run_bf16(s, buf.qkv, buf.dout);
        if (!b.out.empty()) {
            AttnErrors eb;
            attn_errors_compute(s, b.out.data(), ref.out.data(), b.dqkv.data(), ref.dqkv.data(), NULL, &eb);
            snprintf(label, sizeof label, "B%d NH%d T%d HS%d our bf16 mode", s.B, s.NH, s.T, s.HS);
            attn_errors_print_row(stdout, label, &eb);
            double lse_d = 0;
            for (size_t i = 0; i < ref.lse.size(); i++) lse_d = fmax(lse_d, fabs((double)cu.stats[2 * i] - b.stats[2 * i]));
            printf("  cudnn vs bf16 mode: O %.3g%%, dQ %.3g%%, dK %.3g%%, dV %.3g%% (median per-head relative diff); "
                   "stats LSE max |diff| %.3g\n",
                   100 * rel_diff_median(s, ATTN_T_O, cu.out, b.out), 100 * rel_diff_median(s, ATTN_T_DQ, cu.dqkv, b.dqkv),
                   100 * rel_diff_median(s, ATTN_T_DK, cu.dqkv, b.dqkv), 100 * rel_diff_median(s, ATTN_T_DV, cu.dqkv, b.dqkv),
                   lse_d);
            /* cudnn backward on bf16 mode's O and stats, bf16 backward on cudnn's */
            __nv_bfloat16* d_o = to_device(b.out.data(), b.out.size());
            cudaCheck(cudaMemcpy(buf.stats, b.stats.data(), attn_stats_count(s) * 4, cudaMemcpyHostToDevice));
            attention_backward_cudnn(s, buf.qkv, d_o, buf.stats, buf.dout, buf.dqkv, 0);
            if (sync_ok("cudnn backward on bf16 stats")) {
                std::vector<float> g = download(buf.dqkv, attn_qkv_count(s));
                const double dq = rel_diff_median(s, ATTN_T_DQ, g, cu.dqkv);
                check(dq <= 0.01, "B%d NH%d T%d HS%d: cudnn backward on bf16 mode's O and stats vs on its own: dQ %.3g%% "
                      "(<= 1%%)", s.B, s.NH, s.T, s.HS, 100 * dq);
            }
            __nv_bfloat16* d_co = to_device(cu.out.data(), cu.out.size());
            cudaCheck(cudaMemcpy(buf.stats, cu.stats.data(), attn_stats_count(s) * 4, cudaMemcpyHostToDevice));
            void* ws;
            cudaCheck(cudaMalloc(&ws, attention_cuda_workspace_bytes(s, ATTN_BF16)));
            attention_backward_cuda(ATTN_BF16, AttnOptions{}, s, buf.qkv, d_co, buf.stats, buf.dout, buf.dqkv, ws, 0);
            if (sync_ok("bf16 backward on cudnn stats")) {
                std::vector<float> g = download(buf.dqkv, attn_qkv_count(s));
                const double dq = rel_diff_median(s, ATTN_T_DQ, g, b.dqkv);
                check(dq <= 0.01, "B%d NH%d T%d HS%d: bf16 backward on cudnn's O and stats vs on its own: dQ %.3g%% "
                      "(<= 1%%)", s.B, s.NH, s.T, s.HS, 100 * dq);
            }
            cudaFree(ws); cudaFree(d_o); cudaFree(d_co);
        }
        if (outdir) {
            char tag[64];
            snprintf(tag, sizeof tag, "B%d_NH%d_T%d_HS%d_random", s.B, s.NH, s.T, s.HS);
            write_torch_inputs(outdir, tag, s, qkv.data(), dout.data(), cu.out, cu.dqkv);
        }
    }
    case_buffers_free(&buf);
}

/* The hard cases: cudnn (production path) and our bf16 mode vs fp64, dQ median per case. */
static void hard_cases(int HS, uint64_t seed, const char* outdir) {
    const AttnShape s = {1, 4, 256, HS};
    printf("\n==== hard cases, B1 NH4 T256 HS%d: cudnn and bf16 mode vs fp64 (percent) ====\n", HS);
    AttnCase cases[16];
    int n = attn_case_table(cases, 12, seed);
    cases[n++] = attn_case_key_offset(4, 4, seed);
    cases[n++] = attn_case_key_offset(64, 4, seed);
    cases[n++] = attn_case_key_offset(1024, 4, seed);
    std::vector<float> qkv(attn_qkv_count(s)), dout(attn_out_count(s));
    std::vector<std::string> summary;
    attn_errors_print_header(stdout);
    for (int ci = 0; ci < n; ci++) {
        char name[64], label[128];
        attn_case_name(&cases[ci], name, sizeof name);
        attn_case_fill(&cases[ci], s, qkv.data(), dout.data());
        const Reference ref = reference(s, qkv.data(), dout.data());
        CaseBuffers buf = case_buffers(s, &qkv, &dout);
        attention_forward_cudnn(s, buf.qkv, buf.out, buf.stats, 0);
        attention_backward_cudnn(s, buf.qkv, buf.out, buf.stats, buf.dout, buf.dqkv, 0);
        snprintf(label, sizeof label, "%s cudnn", name);
        double dq_cu = NAN, dq_bf = NAN;
        if (sync_ok(label)) {
            const Run cu = download_run(s, buf, false);
            AttnErrors e;
            attn_errors_compute(s, cu.out.data(), ref.out.data(), cu.dqkv.data(), ref.dqkv.data(), NULL, &e);
            attn_errors_print_row(stdout, label, &e);
            dq_cu = e.err[ATTN_T_DQ].median;
            if (cases[ci].kind != ATTN_CASE_EXTREME) {
                long bad = 0;
                for (int t = 0; t < ATTN_NUM_TENSORS; t++) bad += e.nonfinite[t];
                check(bad == 0, "HS%d %s: no NaN/Inf (%ld)", HS, label, bad);
            }
            if (outdir && cases[ci].kind == ATTN_CASE_KEY_OFFSET && cases[ci].rho == 256) {
                char tag[64];
                snprintf(tag, sizeof tag, "B1_NH4_T256_HS%d_rho256_q8", HS);
                write_torch_inputs(outdir, tag, s, qkv.data(), dout.data(), cu.out, cu.dqkv);
            }
        }
        Run b = run_bf16(s, buf.qkv, buf.dout);
        if (!b.out.empty()) {
            AttnErrors e;
            attn_errors_compute(s, b.out.data(), ref.out.data(), b.dqkv.data(), ref.dqkv.data(), NULL, &e);
            snprintf(label, sizeof label, "%s bf16", name);
            attn_errors_print_row(stdout, label, &e);
            dq_bf = e.err[ATTN_T_DQ].median;
        }
        char line[192];
        snprintf(line, sizeof line, "  HS%d %-22s dQ median: cudnn %9.4g%%  bf16 %9.4g%%  cudnn/bf16 %.3g", HS, name,
                 100 * dq_cu, 100 * dq_bf, dq_cu / dq_bf);
        summary.push_back(line);
        case_buffers_free(&buf);
    }
    printf("key-offset sweep and hard cases, dQ median relative error per case (HS%d):\n", HS);
    for (const std::string& l : summary) printf("%s\n", l.c_str());
}

int main(int argc, char** argv) {
    const char* outdir = NULL;
    uint64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) outdir = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else die("usage: %s [--out DIR] [--seed N] (unexpected '%s')", argv[0], argv[i]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("cudnn_check: cuDNN library %ld (cudnnGetVersion), headers %ld (CUDNN_VERSION)\n",
           attention_cudnn_version(), attention_cudnn_header_version());
    if (!attention_cudnn_available()) die("cudnn_check: this build has no cuDNN (make prints [build] cuDNN: not found)");
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
    check(attention_cudnn_version() / 100 == attention_cudnn_header_version() / 100,
          "library and headers are the same cuDNN major.minor (%ld vs %ld)", attention_cudnn_version(),
          attention_cudnn_header_version());
    const AttnShape shapes[] = {{2, 4, 256, 64}, {8, 12, 1024, 64}, {4, 8, 1000, 128}, {2, 4, 1, 64}, {2, 4, 77, 64}};
    for (const AttnShape& s : shapes) shape_section(s, seed, outdir);
    hard_cases(64, seed, outdir);
    hard_cases(128, seed, outdir);
    printf("cudnn_check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
