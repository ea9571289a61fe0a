/*
 * dev/attention_lab/attention_lab.cu - the attention kernel lab: a naive
 * reference kernel and the fast tensor-core kernels side by side, each
 * checked against the other, and each timed.
 *
 * Why: the fast kernels (attention/cuda/attention_cuda.cu) are hard to read and
 * easy to get subtly wrong (fragment layouts, masks of partial tiles, the dQ
 * atomics). The naive kernels here are written for obviousness: one warp per
 * query row (forward, dQ) or per key row (dK, dV), exact two-pass softmax,
 * every sum in FP32, no shared memory, no tensor cores. They compute plain
 * FP32 attention, so the fast fp32 mode must agree with them to the BF16
 * output rounding; the other modes are printed next to them (their
 * difference is the mode's own rounding, e.g. the bf16 leak). Then both are
 * timed (CUDA events, median of repeats), which shows what the tensor-core
 * design buys; dev/bench_attention.cu is the careful benchmark against cuDNN.
 *
 * Usage: attention_lab [B NH T HS]   (default: 2 8 1000 64, then 1 4 777 128)
 * Ends with "N passed, N failed".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"
#include "tests/testing.h"

typedef __nv_bfloat16 bf16;

/* ---- naive reference kernels (plain FP32 attention, BF16 inputs) ---- */

/* One warp per (b, h, query i): m_i, l_i by two passes, O_i in FP32. */
__global__ void naive_forward(const bf16* qkv, float* out, float* stats, int B, int NH, int T, int HS, float scale) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= (long long)B * NH * T) return;
    const int i = (int)(row % T);
    const long long bh = row / T;
    const int b = (int)(bh / NH), h = (int)(bh % NH);
    const long long tok = 3LL * NH * HS;
    const bf16* q = qkv + ((long long)b * T + i) * tok + (long long)h * HS;
    float m = -INFINITY;
    for (int j = 0; j <= i; j++) {
        const bf16* k = qkv + ((long long)b * T + j) * tok + (long long)NH * HS + (long long)h * HS;
        float sdot = 0.f;
        for (int d = lane; d < HS; d += 32) sdot += __bfloat162float(q[d]) * __bfloat162float(k[d]);
        for (int o = 16; o; o >>= 1) sdot += __shfl_xor_sync(0xffffffffu, sdot, o);
        m = fmaxf(m, sdot);
    }
    float l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f}; /* HS <= 128: 4 dims per lane */
    for (int j = 0; j <= i; j++) {
        const bf16* k = qkv + ((long long)b * T + j) * tok + (long long)NH * HS + (long long)h * HS;
        const bf16* v = k + (long long)NH * HS;
        float sdot = 0.f;
        for (int d = lane; d < HS; d += 32) sdot += __bfloat162float(q[d]) * __bfloat162float(k[d]);
        for (int o = 16; o; o >>= 1) sdot += __shfl_xor_sync(0xffffffffu, sdot, o);
        const float p = expf((sdot - m) * scale);
        l += p;
        for (int d = lane, n = 0; d < HS; d += 32, n++) acc[n] += p * __bfloat162float(v[d]);
    }
    float* o = out + ((long long)b * T + i) * NH * HS + (long long)h * HS;
    for (int d = lane, n = 0; d < HS; d += 32, n++) o[d] = acc[n] / l;
    if (lane == 0) {
        stats[row * 2] = m;
        stats[row * 2 + 1] = l;
    }
}

/* P_ij, dP_ij of plain attention, recomputed from the naive stats. */
__device__ void naive_p_dp(const bf16* qkv, const bf16* dout, const float* stats, int b, int h, int i, int j, int NH,
                           int T, int HS, float scale, int lane, float* p, float* dp) {
    const long long tok = 3LL * NH * HS;
    const bf16* q = qkv + ((long long)b * T + i) * tok + (long long)h * HS;
    const bf16* k = qkv + ((long long)b * T + j) * tok + (long long)NH * HS + (long long)h * HS;
    const bf16* v = k + (long long)NH * HS;
    const bf16* go = dout + ((long long)b * T + i) * NH * HS + (long long)h * HS;
    float sdot = 0.f, pdot = 0.f;
    for (int d = lane; d < HS; d += 32) {
        sdot += __bfloat162float(q[d]) * __bfloat162float(k[d]);
        pdot += __bfloat162float(go[d]) * __bfloat162float(v[d]);
    }
    for (int o = 16; o; o >>= 1) {
        sdot += __shfl_xor_sync(0xffffffffu, sdot, o);
        pdot += __shfl_xor_sync(0xffffffffu, pdot, o);
    }
    const long long srow = (((long long)b * NH + h) * T + i) * 2;
    *p = expf((sdot - stats[srow]) * scale) / stats[srow + 1];
    *dp = pdot;
}

/* One warp per query row: D_i = sum_j P_ij dP_ij, then dQ_i = s sum_j dS_ij K_j. */
__global__ void naive_backward_dq(const bf16* qkv, const bf16* dout, const float* stats, float* Dbuf, float* dq,
                                  int B, int NH, int T, int HS, float scale) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= (long long)B * NH * T) return;
    const int i = (int)(row % T);
    const long long bh = row / T;
    const int b = (int)(bh / NH), h = (int)(bh % NH);
    float D = 0.f;
    for (int j = 0; j <= i; j++) {
        float p, dp;
        naive_p_dp(qkv, dout, stats, b, h, i, j, NH, T, HS, scale, lane, &p, &dp);
        D += p * dp;
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const long long tok = 3LL * NH * HS;
    for (int j = 0; j <= i; j++) {
        float p, dp;
        naive_p_dp(qkv, dout, stats, b, h, i, j, NH, T, HS, scale, lane, &p, &dp);
        const float ds = p * (dp - D);
        const bf16* k = qkv + ((long long)b * T + j) * tok + (long long)NH * HS + (long long)h * HS;
        for (int d = lane, n = 0; d < HS; d += 32, n++) acc[n] += ds * __bfloat162float(k[d]);
    }
    float* o = dq + ((long long)b * T + i) * tok + (long long)h * HS;
    for (int d = lane, n = 0; d < HS; d += 32, n++) o[d] = scale * acc[n];
    if (lane == 0) Dbuf[row] = D;
}

/* One warp per key row j: dK_j = s sum_i dS_ij Q_i, dV_j = sum_i P_ij dO_i. */
__global__ void naive_backward_dkv(const bf16* qkv, const bf16* dout, const float* stats, const float* Dbuf,
                                   float* dqkv, int B, int NH, int T, int HS, float scale) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= (long long)B * NH * T) return;
    const int j = (int)(row % T);
    const long long bh = row / T;
    const int b = (int)(bh / NH), h = (int)(bh % NH);
    const long long tok = 3LL * NH * HS;
    float ak[4] = {0.f, 0.f, 0.f, 0.f}, av[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = j; i < T; i++) {
        float p, dp;
        naive_p_dp(qkv, dout, stats, b, h, i, j, NH, T, HS, scale, lane, &p, &dp);
        const float ds = p * (dp - Dbuf[bh * T + i]);
        const bf16* q = qkv + ((long long)b * T + i) * tok + (long long)h * HS;
        const bf16* go = dout + ((long long)b * T + i) * NH * HS + (long long)h * HS;
        for (int d = lane, n = 0; d < HS; d += 32, n++) {
            ak[n] += ds * __bfloat162float(q[d]);
            av[n] += p * __bfloat162float(go[d]);
        }
    }
    float* dk = dqkv + ((long long)b * T + j) * tok + (long long)NH * HS + (long long)h * HS;
    float* dv = dk + (long long)NH * HS;
    for (int d = lane, n = 0; d < HS; d += 32, n++) {
        dk[d] = scale * ak[n];
        dv[d] = av[n];
    }
}

/* ---- helpers ---- */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float normal01(void) {
    /* Box-Muller on a splitmix64 stream */
    g_rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = g_rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u1 = ((z >> 11) + 1.0) / 9007199254740993.0, u2 = ((z & 0xFFFFF) + 0.5) / 1048576.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Relative Frobenius difference over the whole tensor (strided slices of qkv layout: part 0/1/2). */
static double rel_diff(const float* fast, const float* ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)fast[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static double rel_diff_part(const float* fast, const float* ref, AttnShape s, int part) {
    double num = 0, den = 0;
    for (long long tkn = 0; tkn < (long long)s.B * s.T; tkn++)
        for (int x = 0; x < s.NH * s.HS; x++) {
            const size_t i = ((size_t)tkn * 3 + part) * s.NH * s.HS + x;
            const double d = (double)fast[i] - (double)ref[i];
            num += d * d;
            den += (double)ref[i] * ref[i];
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void bf16_to_float(float* y, const bf16* d, size_t n) {
    unsigned short* h = (unsigned short*)mallocCheck(n * 2);
    cudaCheck(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) y[i] = bf16_bits_to_float(h[i]);
    free(h);
}

static float median_ms(float* v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            float t = v[j]; v[j] = v[j - 1]; v[j - 1] = t;
        }
    return v[n / 2];
}

static void lab(AttnShape s) {
    char title[128];
    snprintf(title, sizeof title, "B%d NH%d T%d HS%d: fast kernels vs the naive FP32 kernels", s.B, s.NH, s.T, s.HS);
    test_section(title);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    const long long rows = (long long)s.B * s.NH * s.T;
    unsigned short* h = (unsigned short*)mallocCheck(nqkv * 2);
    bf16 *qkv, *dout, *out, *dqkv;
    cudaCheck(cudaMalloc(&qkv, nqkv * 2));
    cudaCheck(cudaMalloc(&dout, nout * 2));
    cudaCheck(cudaMalloc(&out, nout * 2));
    cudaCheck(cudaMalloc(&dqkv, nqkv * 2));
    for (size_t i = 0; i < nqkv; i++) h[i] = float_to_bf16_bits(normal01());
    cudaCheck(cudaMemcpy(qkv, h, nqkv * 2, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < nout; i++) h[i] = float_to_bf16_bits(normal01());
    cudaCheck(cudaMemcpy(dout, h, nout * 2, cudaMemcpyHostToDevice));
    free(h);
    float *stats, *n_out, *n_stats, *n_dqkv, *n_D;
    void* ws;
    cudaCheck(cudaMalloc(&stats, nstats * 4));
    cudaCheck(cudaMalloc(&n_out, nout * 4));
    cudaCheck(cudaMalloc(&n_stats, nstats * 4));
    cudaCheck(cudaMalloc(&n_dqkv, nqkv * 4));
    cudaCheck(cudaMalloc(&n_D, rows * 4));
    cudaCheck(cudaMalloc(&ws, attention_cuda_workspace_bytes(s, ATTN_GPROJ)));
    const float scale = attn_softmax_scale(s.HS);
    const int warps_per_block = 4;
    const unsigned nblocks = (unsigned)ceil_div(rows, warps_per_block);

    cudaEvent_t e0, e1, e2;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1)); cudaCheck(cudaEventCreate(&e2));
    float ms_nf, ms_nb;
    cudaCheck(cudaEventRecord(e0));
    naive_forward<<<nblocks, 32 * warps_per_block>>>(qkv, n_out, n_stats, s.B, s.NH, s.T, s.HS, scale);
    cudaCheckLastError();
    cudaCheck(cudaEventRecord(e1));
    naive_backward_dq<<<nblocks, 32 * warps_per_block>>>(qkv, dout, n_stats, n_D, n_dqkv, s.B, s.NH, s.T, s.HS, scale);
    cudaCheckLastError();
    naive_backward_dkv<<<nblocks, 32 * warps_per_block>>>(qkv, dout, n_stats, n_D, n_dqkv, s.B, s.NH, s.T, s.HS, scale);
    cudaCheckLastError();
    cudaCheck(cudaEventRecord(e2));
    cudaCheck(cudaEventSynchronize(e2));
    cudaCheck(cudaEventElapsedTime(&ms_nf, e0, e1));
    cudaCheck(cudaEventElapsedTime(&ms_nb, e1, e2));

    float* ref_out = (float*)mallocCheck(nout * 4);
    float* ref_dqkv = (float*)mallocCheck(nqkv * 4);
    float* ref_stats = (float*)mallocCheck(nstats * 4);
    float* f_out = (float*)mallocCheck(nout * 4);
    float* f_dqkv = (float*)mallocCheck(nqkv * 4);
    float* f_stats = (float*)mallocCheck(nstats * 4);
    cudaCheck(cudaMemcpy(ref_out, n_out, nout * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(ref_dqkv, n_dqkv, nqkv * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(ref_stats, n_stats, nstats * 4, cudaMemcpyDeviceToHost));
    const double flops_fwd = 4.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2;
    printf("%-8s %9s %9s %9s %9s %9s %10s %10s %8s %8s\n", "kernel", "O diff%", "dQ diff%", "dK diff%", "dV diff%",
           "m,l diff", "fwd ms", "bwd ms", "fwd TF/s", "f+b TF/s");
    printf("%-8s %9s %9s %9s %9s %9s %10.3f %10.3f %8.2f %8.2f\n", "naive", "-", "-", "-", "-", "-", ms_nf, ms_nb,
           flops_fwd / ms_nf * 1e-9, 3.5 * flops_fwd / (ms_nf + ms_nb) * 1e-9);
    for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
        const AttnMode mode = (AttnMode)m;
        AttnOptions opt = {0};
        cudaCheck(cudaMemset(out, 0xFF, nout * 2));
        cudaCheck(cudaMemset(dqkv, 0xFF, nqkv * 2));
        attention_forward_cuda(mode, opt, s, qkv, out, stats, ws, 0);
        attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv, ws, 0);
        cudaCheck(cudaDeviceSynchronize());
        bf16_to_float(f_out, out, nout);
        bf16_to_float(f_dqkv, dqkv, nqkv);
        cudaCheck(cudaMemcpy(f_stats, stats, nstats * 4, cudaMemcpyDeviceToHost));
        const double dO = rel_diff(f_out, ref_out, nout);
        const double dQ = rel_diff_part(f_dqkv, ref_dqkv, s, 0);
        const double dK = rel_diff_part(f_dqkv, ref_dqkv, s, 1);
        const double dV = rel_diff_part(f_dqkv, ref_dqkv, s, 2);
        double dml = 0;
        if (mode != ATTN_BF16) {
            for (size_t i = 0; i < nstats; i++) {
                const double d = fabs((double)f_stats[i] - ref_stats[i]) / (1.0 + fabs((double)ref_stats[i]));
                if (!(d <= dml)) dml = d;
            }
        }
        /* timing: median of repeats */
        enum { REPS = 15 };
        float tf[REPS], tb[REPS];
        for (int r = 0; r < REPS; r++) {
            cudaCheck(cudaEventRecord(e0));
            attention_forward_cuda(mode, opt, s, qkv, out, stats, ws, 0);
            cudaCheck(cudaEventRecord(e1));
            attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, dqkv, ws, 0);
            cudaCheck(cudaEventRecord(e2));
            cudaCheck(cudaEventSynchronize(e2));
            cudaCheck(cudaEventElapsedTime(&tf[r], e0, e1));
            cudaCheck(cudaEventElapsedTime(&tb[r], e1, e2));
        }
        const float mf = median_ms(tf, REPS), mb = median_ms(tb, REPS);
        printf("%-8s %9.4f %9.4f %9.4f %9.4f %9.2g %10.3f %10.3f %8.2f %8.2f\n", attn_mode_name(mode), 100 * dO,
               100 * dQ, 100 * dK, 100 * dV, dml, mf, mb, flops_fwd / mf * 1e-9, 3.5 * flops_fwd / (mf + mb) * 1e-9);
        if (mode == ATTN_FP32 || mode == ATTN_GPROJ) {
            /* both FP32-accurate inside: they differ by the BF16 rounding of the fast outputs (~0.2%) */
            const double worst = fmax(fmax(dO, dQ), fmax(dK, dV));
            CHECK(worst <= 0.0035, "%s: fast vs naive FP32 kernels within 0.35%% on O, dQ, dK, dV (worst %.3g%%)",
                  attn_mode_name(mode), 100 * worst);
        }
        if (mode != ATTN_BF16) CHECK(dml <= 1e-4, "%s: stats m, l match the naive kernel (%.2g)", attn_mode_name(mode), dml);
    }
    free(ref_out); free(ref_dqkv); free(ref_stats); free(f_out); free(f_dqkv); free(f_stats);
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dqkv));
    cudaCheck(cudaFree(stats)); cudaCheck(cudaFree(n_out)); cudaCheck(cudaFree(n_stats)); cudaCheck(cudaFree(n_dqkv));
    cudaCheck(cudaFree(n_D)); cudaCheck(cudaFree(ws));
}

int main(int argc, char** argv) {
    if (argc != 1 && argc != 5) {
        die("usage: %s [B NH T HS]\n  hint: with no arguments it runs B2 NH8 T1000 HS64 and B1 NH4 T777 HS128", argv[0]);
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) die("attention_lab: no CUDA device found");
    if (argc == 5) {
        AttnShape s = {atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4])};
        attention_cuda_check_shape(s, ATTN_BF16);
        lab(s);
    } else {
        AttnShape a = {2, 8, 1000, 64}, b = {1, 4, 777, 128};
        lab(a);
        lab(b);
    }
    return test_summary();
}
