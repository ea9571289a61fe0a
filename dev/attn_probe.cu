/*
 * dev/attn_probe.cu - evaluates every attention mode on synthetic hard cases
 * or on captured inputs, against an fp64 reference, and prints the error
 * table (the project's central measurement: how far each mode's BF16 outputs
 * O, dQ, dK, dV are from exact attention on the same BF16 inputs).
 *
 * Why a tool of its own: the tests assert thresholds; users need the numbers
 * themselves, on their own runs. A capture taken late in a failing run
 * (docs/attn_capture_format.md) replayed here shows whether the bf16 kernel's
 * dQ error has grown with the key offset rho, and what gproj or fp32 mode
 * would have given on exactly those tensors.
 *
 * What it does per input (a synthetic case of attention/support/attn_cases.h or a
 * capture file, converted to the module's qkv layout and rounded to BF16):
 *   - the fp64 reference (attention/cpu/attention_ref.c, CPU, OpenMP);
 *   - each selected mode on the GPU (attention/attention_cuda.cuh; outputs
 *     poisoned with NaN first, so an unwritten element cannot pass) and, with
 *     --cpu, the exact CPU emulation of the mode (which also reports the row
 *     residual of the effective dS). cudnn mode (cuDNN's own kernel,
 *     attention/cudnn/) has no CPU emulation: it gets the GPU-vs-fp64 row
 *     only, and is in the default mode list only where the build has cuDNN
 *     and a GPU runs;
 *   - per (batch, head) relative Frobenius errors of O, dQ, dK, dV, median and
 *     max, ||sum_j dK_j|| / ||dK||, NaN/Inf counts (attention/support/attn_metrics.h);
 *   - the input's diagnostics: key offset rho = |mean key| / rms key spread,
 *     max |q|, max |k| (median and max over heads);
 *   - for a capture that holds the run's own O: that O against the reference.
 * --json FILE writes the same numbers machine-readably.
 * Builds and shows --help without a GPU; without one at run time it runs the
 * CPU emulation if --cpu was given, else says so and stops.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/cudnn/attention_cudnn.cuh"
#include "attention/support/attn_capture.h"
#include "attention/support/attn_cases.h"
#include "attention/support/attn_metrics.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"

#define MAX_INPUTS 256

/* The synthetic sweep of docs/attention_numerics.md. */
static const double k_sweep_rho[] = {0, 4, 16, 64, 256, 1024};
static const double k_sweep_qscale[] = {1, 4, 8};
static const double k_sweep_sharp_logit[] = {1e2, 1e3, 1e4, 1e5};

typedef struct {
    int synthetic;
    const char* case_specs[MAX_INPUTS];
    int num_case_specs;
    const char* captures[MAX_INPUTS];
    int num_captures;
    AttnShape shape;            /* of synthetic cases */
    int modes[ATTN_NUM_MODES];  /* 1 = evaluate; cudnn (no CPU emulation) runs on the GPU only */
    int modes_named;            /* --modes was given (else the default list) */
    int cudnn_named;            /* cudnn named in --modes: a run that cannot evaluate it stops instead of skipping it */
    int use_gpu;                /* 0 with --no-gpu */
    int use_cpu;                /* --cpu */
    int tile_max_shift;         /* repair's optional arm */
    int max_heads;              /* captures: evaluate only the first N (b, h) heads; 0 = all */
    uint64_t seed;
    const char* json_path;
} ProbeArgs;

static void print_help(void) {
    printf(
        "attn_probe - every attention mode vs an fp64 reference, on synthetic hard cases or captured inputs\n"
        "\n"
        "usage: build/attn_probe [--synthetic] [--case SPEC]... [--capture FILE]... [options]\n"
        "inputs (default: --synthetic):\n"
        "  --synthetic        the hard cases: key offset rho {0,4,16,64,256,1024} x q scale {1,4,8},\n"
        "                     sharp attention (logits 1e2, 1e3, 1e4, 1e5), extreme values (q=k=v=133120)\n"
        "  --case SPEC        one synthetic case (repeatable): %s\n"
        "  --capture FILE     a capture file (repeatable; format: docs/attn_capture_format.md,\n"
        "                     written by the trainer or dev/attn_capture.py)\n"
        "shape of synthetic cases:\n"
        "  --B N --NH N --T N --HS N   (default 1 4 1024 64)\n"
        "options:\n"
        "  --modes LIST       comma-separated subset of %s (default: all; cudnn\n"
        "                     only in a build with cuDNN and with a GPU). cudnn is cuDNN's own kernel: it has\n"
        "                     no CPU emulation, so it gets the 'gpu' row (against fp64) only, never cpu rows\n"
        "  --cpu              also run the exact CPU emulation of each mode (adds the dS row residual; with\n"
        "                     the GPU, also a 'gpu vs cpu' row: the kernel against the emulation of its mode)\n"
        "  --no-gpu           skip the GPU kernels (with --cpu: CPU emulation only)\n"
        "  --tile-max-shift   run repair with its optional Qiu & Yao tile-max shift arm\n"
        "  --heads N          captures: evaluate only the first N (batch, head) pairs (the fp64\n"
        "                     reference runs on the CPU; a 450M layer at B16 is 320 heads)\n"
        "  --seed N           seed of the synthetic cases (default 1)\n"
        "  --json FILE        also write every number to FILE as JSON\n"
        "  --help             this text\n"
        "\n"
        "Errors: per (batch, head) ||X - X_ref||_F / ||X_ref||_F in percent, median/max over heads; a '*' marks\n"
        "heads whose reference is exactly zero (absolute norm instead). |sum dK|/|dK|: the identity sum_j dK_j = 0.\n"
        "dS row res: per row |sum_j dS'_ij| / sum_j |dS'_ij| (CPU emulation only). rho = |mean key| / rms key spread.\n",
        attn_case_syntax(), attn_mode_choices());
}

static int parse_int(const char* flag, const char* text, int lo, int hi) {
    char* end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < lo || v > hi) die("%s %s: expected an integer in [%d, %d]", flag, text, lo, hi);
    return (int)v;
}

static void parse_args(int argc, char** argv, ProbeArgs* a) {
    memset(a, 0, sizeof *a);
    a->shape = (AttnShape){1, 4, 1024, 64};
    a->use_gpu = 1;
    a->seed = 1;
    int any_mode = 0;
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) { print_help(); exit(0); }
        if (!strcmp(flag, "--synthetic")) { a->synthetic = 1; continue; }
        if (!strcmp(flag, "--cpu")) { a->use_cpu = 1; continue; }
        if (!strcmp(flag, "--no-gpu")) { a->use_gpu = 0; continue; }
        if (!strcmp(flag, "--tile-max-shift")) { a->tile_max_shift = 1; continue; }
        if (i + 1 >= argc) die("%s needs a value (see --help)", flag);
        const char* val = argv[++i];
        if (!strcmp(flag, "--case")) {
            if (a->num_case_specs >= MAX_INPUTS) die("--case: at most %d", MAX_INPUTS);
            a->case_specs[a->num_case_specs++] = val;
        } else if (!strcmp(flag, "--capture")) {
            if (a->num_captures >= MAX_INPUTS) die("--capture: at most %d files", MAX_INPUTS);
            a->captures[a->num_captures++] = val;
        } else if (!strcmp(flag, "--B")) {
            a->shape.B = parse_int(flag, val, 1, 1 << 16);
        } else if (!strcmp(flag, "--NH")) {
            a->shape.NH = parse_int(flag, val, 1, 1 << 16);
        } else if (!strcmp(flag, "--T")) {
            a->shape.T = parse_int(flag, val, 1, 1 << 20);
        } else if (!strcmp(flag, "--HS")) {
            a->shape.HS = parse_int(flag, val, 1, 1024);
        } else if (!strcmp(flag, "--heads")) {
            a->max_heads = parse_int(flag, val, 1, 1 << 20);
        } else if (!strcmp(flag, "--seed")) {
            a->seed = strtoull(val, NULL, 10);
        } else if (!strcmp(flag, "--json")) {
            a->json_path = val;
        } else if (!strcmp(flag, "--modes")) {
            char err[256];
            const int named = attn_mode_parse_list(val, a->modes, err, sizeof err);
            if (named < 0) die("--modes: %s", err);
            if (a->modes[ATTN_CUDNN]) a->cudnn_named = 1;
            if (named > 0) any_mode = 1;
        } else {
            die("unknown option '%s' (see --help)", flag);
        }
    }
    a->modes_named = any_mode;
    if (!any_mode) {
        for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) a->modes[m] = 1;
        a->modes[ATTN_CUDNN] = a->use_gpu && attention_cudnn_available(); /* dropped later if no GPU is usable */
    }
    if (!a->synthetic && a->num_case_specs == 0 && a->num_captures == 0) a->synthetic = 1;
    if (!a->use_gpu && !a->use_cpu) die("--no-gpu without --cpu leaves nothing to run; add --cpu");
    if (a->cudnn_named) {
        if (!a->use_gpu)
            die("--modes cudnn with --no-gpu: cudnn is cuDNN's own kernel and runs only on the GPU (it has no CPU "
                "emulation)\n  hint: drop --no-gpu, or leave cudnn out of --modes");
        attention_cudnn_require("attn_probe --modes cudnn");
    }
}

/* ---- one input: qkv / dout in the module layout, BF16-representable floats ---- */
typedef struct {
    char name[160];
    char source[32];        /* "synthetic" or "capture" */
    const char* path;       /* capture file, or NULL */
    AttnShape s;
    float* qkv;
    float* dout;
    float* run_out;         /* capture's own O (module layout), or NULL */
    AttnCaptureInfo cap_info;
    int rounded_to_bf16;    /* capture was fp32: inputs rounded on entry */
} ProbeInput;

/* Key offset rho, max |q|, max |k| per (b, h): the diagnostics DESIGN.md asks for. */
typedef struct {
    AttnErrStat rho, max_q, max_k;
} InputDiag;

static void input_diagnostics(const ProbeInput* in, InputDiag* d) {
    const AttnShape s = in->s;
    int nheads = s.B * s.NH;
    double* rho = (double*)mallocCheck(sizeof(double) * nheads);
    double* mq = (double*)mallocCheck(sizeof(double) * nheads);
    double* mk = (double*)mallocCheck(sizeof(double) * nheads);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            double* mean = (double*)callocCheck(s.HS, sizeof(double));
            double maxq = 0, maxk = 0;
            for (int t = 0; t < s.T; t++) {
                const float* q = in->qkv + ((((size_t)b * s.T + t) * 3 + 0) * s.NH + h) * s.HS;
                const float* k = in->qkv + ((((size_t)b * s.T + t) * 3 + 1) * s.NH + h) * s.HS;
                for (int i = 0; i < s.HS; i++) {
                    mean[i] += k[i];
                    maxq = fmax(maxq, fabs(q[i]));
                    maxk = fmax(maxk, fabs(k[i]));
                }
            }
            double mean_norm2 = 0;
            for (int i = 0; i < s.HS; i++) {
                mean[i] /= s.T;
                mean_norm2 += mean[i] * mean[i];
            }
            double spread2 = 0;
            for (int t = 0; t < s.T; t++) {
                const float* k = in->qkv + ((((size_t)b * s.T + t) * 3 + 1) * s.NH + h) * s.HS;
                for (int i = 0; i < s.HS; i++) spread2 += (k[i] - mean[i]) * (k[i] - mean[i]);
            }
            double spread = sqrt(spread2 / s.T);
            rho[b * s.NH + h] = spread > 0 ? sqrt(mean_norm2) / spread : (mean_norm2 > 0 ? INFINITY : 0);
            mq[b * s.NH + h] = maxq;
            mk[b * s.NH + h] = maxk;
            free(mean);
        }
    d->rho = attn_err_stat_of(rho, nheads);
    d->max_q = attn_err_stat_of(mq, nheads);
    d->max_k = attn_err_stat_of(mk, nheads);
    free(rho);
    free(mq);
    free(mk);
}

static void make_synthetic_input(ProbeInput* in, const AttnCase* c, AttnShape s) {
    memset(in, 0, sizeof *in);
    char cname[128];
    attn_case_name(c, cname, sizeof cname);
    snprintf(in->name, sizeof in->name, "%s", cname);
    snprintf(in->source, sizeof in->source, "synthetic");
    in->s = s;
    in->qkv = (float*)mallocCheck(attn_qkv_count(s) * sizeof(float));
    in->dout = (float*)mallocCheck(attn_out_count(s) * sizeof(float));
    attn_case_fill(c, s, in->qkv, in->dout);
}

/* Reads a capture, keeps the first max_heads (b, h) pairs (0 = all) as a
   [1, N, T, HS] problem (heads are independent), converts to the module
   layout and rounds to BF16 (the modes take BF16 inputs). */
static void make_capture_input(ProbeInput* in, const char* path, int max_heads) {
    memset(in, 0, sizeof *in);
    AttnCapture cap;
    attn_capture_load(path, &cap);
    in->path = path;
    in->cap_info = cap.info;
    snprintf(in->source, sizeof in->source, "capture");
    AttnShape full = cap.info.shape;
    int nheads = full.B * full.NH;
    if (max_heads > 0 && max_heads < nheads) {
        /* [B, NH, T, HS] is head-major, so the first N heads are one contiguous prefix */
        AttnCapture sub = cap;
        sub.info.shape = (AttnShape){1, max_heads, full.T, full.HS};
        cap = sub;
    }
    AttnShape s = cap.info.shape;
    in->s = s;
    char mode_text[32];
    snprintf(mode_text, sizeof mode_text, "%s",
             cap.info.attn_mode == ATTN_CAPTURE_MODE_UNKNOWN ? "?" : attn_mode_name((AttnMode)cap.info.attn_mode));
    const char* base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(in->name, sizeof in->name, "%.60s L%d step %lld (%s run)%s", base, (int)cap.info.layer,
             (long long)cap.info.step, mode_text, s.NH != full.NH || s.B != full.B ? " [subset]" : "");
    in->qkv = (float*)mallocCheck(attn_qkv_count(s) * sizeof(float));
    in->dout = (float*)mallocCheck(attn_out_count(s) * sizeof(float));
    if (cap.out) in->run_out = (float*)mallocCheck(attn_out_count(s) * sizeof(float));
    attn_capture_to_module(&cap, in->qkv, in->run_out, in->dout);
    if (cap.info.dtype == ATTN_CAPTURE_FP32) {
        in->rounded_to_bf16 = 1;
        for (size_t i = 0; i < attn_qkv_count(s); i++) in->qkv[i] = bf16_round(in->qkv[i]);
        for (size_t i = 0; i < attn_out_count(s); i++) in->dout[i] = bf16_round(in->dout[i]);
    }
    cap.info.shape = full; /* free what was allocated */
    attn_capture_free(&cap);
}

static void free_input(ProbeInput* in) {
    free(in->qkv);
    free(in->dout);
    free(in->run_out);
}

/* ---- evaluation ---- */
typedef struct {
    char impl[8];  /* "gpu", "cpu", "gpu~cpu" (GPU vs the CPU emulation of the same mode), "run" */
    char mode[24];
    AttnErrors e;
} ProbeResult;

static AttnOptions options_for(AttnMode mode, const ProbeArgs* a) {
    AttnOptions opt;
    memset(&opt, 0, sizeof opt);
    opt.tile_max_shift = (mode == ATTN_REPAIR) ? a->tile_max_shift : 0;
    return opt;
}

static void mode_label(AttnMode mode, const ProbeArgs* a, char* buf, size_t n) {
    snprintf(buf, n, "%s%s", attn_mode_name(mode), (mode == ATTN_REPAIR && a->tile_max_shift) ? "+shift" : "");
}

static void to_bf16_bits(const float* x, uint16_t* y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = float_to_bf16_bits(x[i]);
}
static void from_bf16_bits(const uint16_t* x, float* y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = bf16_bits_to_float(x[i]);
}

/* Runs one mode's forward and backward on the GPU; out / dqkv as floats. */
static void run_gpu(AttnMode mode, AttnOptions opt, const ProbeInput* in, float* out, float* dqkv) {
    const AttnShape s = in->s;
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    attention_cuda_check_shape(s, mode);
    uint16_t* h_bits = (uint16_t*)mallocCheck(nqkv * sizeof(uint16_t));
    __nv_bfloat16 *d_qkv, *d_out, *d_dout, *d_dqkv;
    float* d_stats;
    void* d_work = NULL;
    size_t work_bytes = attention_cuda_workspace_bytes(s, mode);
    cudaCheck(cudaMalloc((void**)&d_qkv, nqkv * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&d_dqkv, nqkv * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&d_out, nout * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&d_dout, nout * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&d_stats, nstats * sizeof(float)));
    if (work_bytes) cudaCheck(cudaMalloc(&d_work, work_bytes));
    to_bf16_bits(in->qkv, h_bits, nqkv);
    cudaCheck(cudaMemcpy(d_qkv, h_bits, nqkv * sizeof(uint16_t), cudaMemcpyHostToDevice));
    to_bf16_bits(in->dout, h_bits, nout);
    cudaCheck(cudaMemcpy(d_dout, h_bits, nout * sizeof(uint16_t), cudaMemcpyHostToDevice));
    /* poison every output with NaN (0xFF.. is NaN in BF16 and fp32): unwritten elements show up */
    cudaCheck(cudaMemset(d_out, 0xFF, nout * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemset(d_dqkv, 0xFF, nqkv * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemset(d_stats, 0xFF, nstats * sizeof(float)));
    if (d_work) cudaCheck(cudaMemset(d_work, 0xFF, work_bytes));
    attention_forward_cuda(mode, opt, s, d_qkv, d_out, d_stats, d_work, 0);
    cudaCheckLastError();
    attention_backward_cuda(mode, opt, s, d_qkv, d_out, d_stats, d_dout, d_dqkv, d_work, 0);
    cudaCheckLastError();
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h_bits, d_out, nout * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    from_bf16_bits(h_bits, out, nout);
    cudaCheck(cudaMemcpy(h_bits, d_dqkv, nqkv * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    from_bf16_bits(h_bits, dqkv, nqkv);
    cudaCheck(cudaFree(d_qkv));
    cudaCheck(cudaFree(d_dqkv));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_stats));
    if (d_work) cudaCheck(cudaFree(d_work));
    free(h_bits);
}

/* ---- JSON output (hand-written: numbers, strings without control chars) ---- */
static void json_string(FILE* f, const char* s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}
/* JSON has no Inf/NaN: those become null (the nonfinite counts say why). */
static void json_number(FILE* f, double x) {
    if (isfinite(x)) fprintf(f, "%.6e", x);
    else fprintf(f, "null");
}
static void json_stat(FILE* f, const char* key, const AttnErrStat* st) {
    fprintf(f, "\"%s\": {\"median\": ", key);
    json_number(f, st->median);
    fprintf(f, ", \"max\": ");
    json_number(f, st->max);
    fprintf(f, ", \"count\": %d, \"zero_ref_heads\": %d}", st->count, st->zero_ref_heads);
}

static void json_input(FILE* f, const ProbeInput* in, const InputDiag* d, const ProbeResult* r, int nr, int first) {
    fprintf(f, "%s\n    {\"name\": ", first ? "" : ",");
    json_string(f, in->name);
    fprintf(f, ", \"source\": \"%s\", ", in->source);
    if (in->path) {
        fprintf(f, "\"path\": ");
        json_string(f, in->path);
        fprintf(f, ", \"layer\": %d, \"step\": %lld, \"run_mode\": ", (int)in->cap_info.layer,
                (long long)in->cap_info.step);
        if (in->cap_info.attn_mode == ATTN_CAPTURE_MODE_UNKNOWN) fprintf(f, "null");
        else json_string(f, attn_mode_name((AttnMode)in->cap_info.attn_mode));
        fprintf(f, ", \"capture_dtype\": \"%s\", ", attn_capture_dtype_name(in->cap_info.dtype));
    }
    fprintf(f, "\"B\": %d, \"NH\": %d, \"T\": %d, \"HS\": %d,\n     ", in->s.B, in->s.NH, in->s.T, in->s.HS);
    json_stat(f, "rho", &d->rho);
    fprintf(f, ", ");
    json_stat(f, "max_abs_q", &d->max_q);
    fprintf(f, ", ");
    json_stat(f, "max_abs_k", &d->max_k);
    fprintf(f, ",\n     \"results\": [");
    for (int i = 0; i < nr; i++) {
        const AttnErrors* e = &r[i].e;
        fprintf(f, "%s\n      {\"impl\": \"%s\", \"mode\": \"%s\"", i ? "," : "", r[i].impl, r[i].mode);
        for (int t = 0; t < ATTN_NUM_TENSORS; t++) {
            if (t != ATTN_T_O && !e->has_backward) continue;
            fprintf(f, ", ");
            json_stat(f, attn_tensor_name((AttnTensor)t), &e->err[t]);
            fprintf(f, ", \"%s_whole\": {\"rel\": ", attn_tensor_name((AttnTensor)t));
            json_number(f, e->whole[t].rel);
            fprintf(f, ", \"err_norm\": ");
            json_number(f, e->whole[t].err_norm);
            fprintf(f, ", \"ref_norm\": ");
            json_number(f, e->whole[t].ref_norm);
            fprintf(f, "}");
        }
        if (e->has_backward) {
            fprintf(f, ", ");
            json_stat(f, "dk_sum_residual", &e->dk_sum);
            fprintf(f, ", ");
            json_stat(f, "dk_sum_residual_ref", &e->dk_sum_ref);
        }
        if (e->has_row_residual) {
            fprintf(f, ", ");
            json_stat(f, "ds_row_residual", &e->row_residual);
        }
        fprintf(f, ", \"nonfinite\": {\"O\": %ld, \"dQ\": %ld, \"dK\": %ld, \"dV\": %ld}}", e->nonfinite[ATTN_T_O],
                e->nonfinite[ATTN_T_DQ], e->nonfinite[ATTN_T_DK], e->nonfinite[ATTN_T_DV]);
    }
    fprintf(f, "]}");
}

/* Evaluates one input: reference, then each mode on GPU and/or CPU; prints
   its block of the table; returns the results in r (count in *nr). */
static void evaluate(const ProbeArgs* a, const ProbeInput* in, int use_gpu, InputDiag* d, ProbeResult* r, int* nr) {
    const AttnShape s = in->s;
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    input_diagnostics(in, d);
    printf("\n%s  [%s B%d NH%d T%d HS%d%s]  rho med/max %.3g/%.3g  max|q| %.4g  max|k| %.4g\n", in->name,
           in->source, s.B, s.NH, s.T, s.HS, in->rounded_to_bf16 ? ", fp32 capture rounded to BF16" : "",
           d->rho.median, d->rho.max, d->max_q.max, d->max_k.max);
    fflush(stdout);
    double* qkv_ref = attn_double_copy(in->qkv, nqkv);
    double* dout_ref = attn_double_copy(in->dout, nout);
    double* out_ref = (double*)mallocCheck(nout * sizeof(double));
    double* dqkv_ref = (double*)mallocCheck(nqkv * sizeof(double));
    attention_forward_ref(s, qkv_ref, out_ref);
    attention_backward_ref(s, qkv_ref, dout_ref, dqkv_ref);
    float* out = (float*)mallocCheck(nout * sizeof(float));
    float* dqkv = (float*)mallocCheck(nqkv * sizeof(float));
    float* stats = (float*)mallocCheck(attn_stats_count(s) * sizeof(float));
    float* row_res = (float*)mallocCheck((size_t)s.B * s.NH * s.T * sizeof(float));
    *nr = 0;
    if (in->run_out) {
        ProbeResult* res = &r[(*nr)++];
        snprintf(res->impl, sizeof res->impl, "run");
        snprintf(res->mode, sizeof res->mode, "captured O");
        attn_errors_compute(s, in->run_out, out_ref, NULL, NULL, NULL, &res->e);
        attn_errors_print_row(stdout, "run's own O", &res->e);
    }
    /* GPU outputs of the current mode, kept (as double) to compare with the CPU emulation */
    double* gpu_out = (use_gpu && a->use_cpu) ? (double*)mallocCheck(nout * sizeof(double)) : NULL;
    double* gpu_dqkv = (use_gpu && a->use_cpu) ? (double*)mallocCheck(nqkv * sizeof(double)) : NULL;
    for (int m = 0; m < ATTN_NUM_MODES; m++) {
        if (!a->modes[m]) continue;
        AttnMode mode = (AttnMode)m;
        AttnOptions opt = options_for(mode, a);
        const int emulated = attn_mode_is_emulated(mode);
        for (int impl = 0; impl < 2; impl++) {
            if (impl == 0 && !use_gpu) continue;
            if (impl == 1 && (!a->use_cpu || !emulated)) continue; /* cudnn: GPU vs fp64 only */
            ProbeResult* res = &r[(*nr)++];
            snprintf(res->impl, sizeof res->impl, "%s", impl == 0 ? "gpu" : "cpu");
            mode_label(mode, a, res->mode, sizeof res->mode);
            if (impl == 0) {
                run_gpu(mode, opt, in, out, dqkv);
                attn_errors_compute(s, out, out_ref, dqkv, dqkv_ref, NULL, &res->e);
                if (gpu_out) {
                    attn_float_to_double(out, gpu_out, nout);
                    attn_float_to_double(dqkv, gpu_dqkv, nqkv);
                }
            } else {
                attention_forward_cpu(mode, opt, ATTN_IO_BF16, s, in->qkv, out, stats);
                attention_backward_cpu_diag(mode, opt, ATTN_IO_BF16, s, in->qkv, out, stats, in->dout, dqkv, row_res);
                attn_errors_compute(s, out, out_ref, dqkv, dqkv_ref, row_res, &res->e);
            }
            char label[48];
            snprintf(label, sizeof label, "%s %s%s", res->impl, res->mode, emulated ? "" : " (no emul.)");
            attn_errors_print_row(stdout, label, &res->e);
            if (impl == 1 && gpu_out) {
                /* how far the kernel is from the exact emulation of its own mode (same metric,
                   the CPU emulation's outputs taken as the reference) */
                ProbeResult* agree = &r[(*nr)++];
                snprintf(agree->impl, sizeof agree->impl, "gpu~cpu");
                mode_label(mode, a, agree->mode, sizeof agree->mode);
                double* cpu_out = attn_double_copy(out, nout);
                double* cpu_dqkv = attn_double_copy(dqkv, nqkv);
                float* g_out = (float*)mallocCheck(nout * sizeof(float));
                float* g_dqkv = (float*)mallocCheck(nqkv * sizeof(float));
                attn_double_to_float(gpu_out, g_out, nout);
                attn_double_to_float(gpu_dqkv, g_dqkv, nqkv);
                attn_errors_compute(s, g_out, cpu_out, g_dqkv, cpu_dqkv, NULL, &agree->e);
                snprintf(label, sizeof label, "gpu vs cpu %s", agree->mode);
                attn_errors_print_row(stdout, label, &agree->e);
                free(cpu_out);
                free(cpu_dqkv);
                free(g_out);
                free(g_dqkv);
            }
            fflush(stdout);
        }
    }
    free(gpu_out);
    free(gpu_dqkv);
    free(qkv_ref);
    free(dout_ref);
    free(out_ref);
    free(dqkv_ref);
    free(out);
    free(dqkv);
    free(stats);
    free(row_res);
}

int main(int argc, char** argv) {
    ProbeArgs a;
    parse_args(argc, argv, &a);

    /* the list of synthetic cases */
    AttnCase cases[MAX_INPUTS];
    int num_cases = 0;
    if (a.synthetic) {
        for (size_t i = 0; i < sizeof k_sweep_rho / sizeof k_sweep_rho[0]; i++)
            for (size_t j = 0; j < sizeof k_sweep_qscale / sizeof k_sweep_qscale[0]; j++)
                cases[num_cases++] = attn_case_key_offset(k_sweep_rho[i], k_sweep_qscale[j], a.seed);
        for (size_t i = 0; i < sizeof k_sweep_sharp_logit / sizeof k_sweep_sharp_logit[0]; i++)
            cases[num_cases++] = attn_case_sharp(k_sweep_sharp_logit[i], a.seed);
        cases[num_cases++] = attn_case_extreme(a.seed);
    }
    for (int i = 0; i < a.num_case_specs; i++) {
        if (num_cases >= MAX_INPUTS) die("too many cases (at most %d)", MAX_INPUTS);
        char err[512];
        if (attn_case_parse(a.case_specs[i], a.seed, &cases[num_cases], err, sizeof err) != 0) die("--case: %s", err);
        num_cases++;
    }
    if (num_cases > 0) attn_shape_check(a.shape, "attn_probe --B/--NH/--T/--HS");

    /* validate every capture before any long computation */
    for (int i = 0; i < a.num_captures; i++) {
        AttnCaptureInfo info;
        char err[1024];
        if (attn_capture_read_info(a.captures[i], &info, err, sizeof err) != 0) die("%s", err);
    }

    int use_gpu = a.use_gpu;
    if (use_gpu) {
        int n = 0;
        cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess || n == 0) {
            const char* why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA devices";
            if (!a.use_cpu)
                die("no usable NVIDIA GPU (%s): the GPU kernels cannot run here.\n"
                    "  hint: add --cpu to evaluate the exact CPU emulation of each mode instead", why);
            if (a.cudnn_named)
                die("no usable NVIDIA GPU (%s): --modes cudnn needs one (cuDNN's kernel has no CPU emulation)\n"
                    "  hint: leave cudnn out of --modes to evaluate the CPU emulation of the other modes", why);
            printf("note: no usable NVIDIA GPU (%s): running the CPU emulation only\n", why);
            use_gpu = 0;
            a.modes[ATTN_CUDNN] = 0;
        } else {
            cudaDeviceProp prop;
            cudaCheck(cudaGetDeviceProperties(&prop, 0));
            printf("attn_probe on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
        }
    }
    printf("reference: fp64 on the CPU on the same BF16 inputs; outputs are the modes' BF16 O, dQ, dK, dV\n");
    if (a.modes[ATTN_CUDNN])
        printf("cudnn: cuDNN %ld (built against %ld): GPU vs fp64 rows only, labelled '(no emul.)' (cuDNN's kernel "
               "has no CPU emulation)\n", attention_cudnn_version(), attention_cudnn_header_version());
    else if (!attention_cudnn_available() && !a.modes_named)
        printf("note: cudnn left out: this build has no cuDNN\n");
    else if (!use_gpu && !a.modes_named)
        printf("note: cudnn left out: it runs only on the GPU (no CPU emulation)\n");
    attn_errors_print_header(stdout);

    FILE* json = NULL;
    if (a.json_path) {
        json = fopenCheck(a.json_path, "w");
        fprintf(json, "{\"tool\": \"attn_probe\", \"reference\": \"fp64 CPU\", \"gpu\": %s, \"cpu_emulation\": %s, "
                "\"tile_max_shift\": %s, \"cudnn_version\": %ld, \"inputs\": [", use_gpu ? "true" : "false",
                a.use_cpu ? "true" : "false", a.tile_max_shift ? "true" : "false",
                a.modes[ATTN_CUDNN] ? attention_cudnn_version() : 0L);
    }
    ProbeResult results[1 + 3 * ATTN_NUM_MODES]; /* run's O; per mode gpu, cpu, gpu~cpu */
    int first = 1;
    for (int i = 0; i < num_cases + a.num_captures; i++) {
        ProbeInput in;
        if (i < num_cases) make_synthetic_input(&in, &cases[i], a.shape);
        else make_capture_input(&in, a.captures[i - num_cases], a.max_heads);
        InputDiag diag;
        int nr = 0;
        evaluate(&a, &in, use_gpu, &diag, results, &nr);
        if (json) {
            json_input(json, &in, &diag, results, nr, first);
            fflush(json);
        }
        first = 0;
        free_input(&in);
    }
    if (json) {
        fprintf(json, "\n]}\n");
        fcloseCheck(json);
        printf("\nwrote %s\n", a.json_path);
    }
    return 0;
}
