/*
 * tests/test_modern_layers_gpu.cu - the modern-stack kernels (RMSNorm, RoPE,
 * QK-norm, SwiGLU: model/rmsnorm.cuh, rope.cuh, qknorm.cuh, swiglu.cuh)
 * against fp64 loops written here from the issue-19 contract.
 *
 * Why: these kernels feed --norm rmsnorm, --pos rope, --qk-norm 1 and
 * --mlp swiglu; the model-level parity (dev/parity_gpu) can only say that a
 * run is off, not which kernel is. Each kernel gets random BF16 inputs (fixed
 * seed) and its outputs, forward and backward, are compared with a double
 * precision reference that reads the same BF16 values and shares no code
 * with the kernel (the RoPE angles are recomputed here from the formula).
 *
 * Tolerances (tests/gpu_tensor.cuh): tensors as a whole within 1% relative
 * Frobenius error (REL_TOL_BF16: FP32 accumulation order plus one BF16
 * rounding, unit roundoff 2^-9). The element-wise kernels (RoPE, SwiGLU) are
 * also held per element: |got - want| <= 2^-8 |want| (half a BF16 ulp at
 * most) + an absolute FP32 slack of 1e-5 times the inputs' size (where
 * a*cos - b*sin or 1 + a(1 - s) cancels, FP32 keeps only an absolute
 * accuracy). FP32 statistics (rstd) within 1e-5. Exact where nothing is
 * computed: the fused residual add, v copied by QK-norm, dv and v left alone
 * by RoPE, parts of buffers a kernel must not write. Reductions (gain
 * gradients) run twice: same bits. Shapes include odd row counts, C not a
 * multiple of the 256 channels a warp covers per step, head sizes whose
 * lane group is not full (HS 24) and more (row, head) pairs than one
 * reduction chunk. Needs an NVIDIA GPU (make gputest); ends with
 * "N passed, N failed".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "tests/testing.h"
#include "tests/gpu_tensor.cuh"
#include "model/kernel_common.cuh"
#include "model/rmsnorm.cuh"
#include "model/rope.cuh"
#include "model/qknorm.cuh"
#include "model/swiglu.cuh"

#define EPS_REF 1e-5

static floatX* dev_alloc(size_t n) {
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    cudaCheck(cudaMemset(d, 0, n * sizeof(floatX)));
    return d;
}

/* Per element: |got - want| <= 2^-8 |want| + slack[i]; returns the number of elements outside. */
static size_t count_outside(const std::vector<float>& got, const std::vector<double>& want,
                            const std::vector<double>& slack, double* worst_ratio) {
    size_t bad = 0;
    *worst_ratio = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double bound = ldexp(fabs(want[i]), -8) + slack[i], err = fabs((double)got[i] - want[i]);
        if (!(err <= bound)) bad++;
        if (bound > 0) *worst_ratio = fmax(*worst_ratio, err / bound);
    }
    return bad;
}

/* ---- RMSNorm ---- */
static void rms_reference(const std::vector<float>& x, const std::vector<float>& w, int N, int C,
                          std::vector<double>& out, std::vector<double>& rstd) {
    out.assign((size_t)N * C, 0);
    rstd.assign(N, 0);
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[(size_t)r * C + c] * x[(size_t)r * C + c];
        const double s = 1.0 / sqrt(ss / C + EPS_REF);
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = x[(size_t)r * C + c] * s * w[c];
        rstd[r] = s;
    }
}

static void test_rmsnorm(int N, int C) {
    char name[128];
    snprintf(name, sizeof(name), "rmsnorm N%d C%d", N, C);
    test_section(name);
    const size_t NC = (size_t)N * C;
    Tensor a = tensor_new(NC, 1.0f, 0.3f), b = tensor_new(NC, 0.5f), w = tensor_new(C, 0.2f, 1.0f);
    floatX *out = dev_alloc(NC), *residual = dev_alloc(NC);
    float *rstd, *scratch;
    cudaCheck(cudaMalloc(&rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, rownorm_backward_scratch_floats(N, C) * sizeof(float)));

    std::vector<double> want, want_rstd;
    rmsnorm_forward(out, rstd, a.dev, w.dev, N, C, 0);
    rms_reference(a.host, w.host, N, C, want, want_rstd);
    check_rel("forward out", download(out, NC), want, REL_TOL_BF16);
    check_rel("forward rstd (fp32)", download_f32(rstd, N), want_rstd, 1e-5);

    fused_residual_rmsnorm_forward(residual, out, rstd, a.dev, b.dev, w.dev, N, C, 0);
    std::vector<float> res_host(NC), got_res = download(residual, NC);
    int exact = 1;
    for (size_t i = 0; i < NC; i++) {
        res_host[i] = bf(a.host[i] + b.host[i]);
        if (got_res[i] != res_host[i]) exact = 0;
    }
    CHECK(exact, "fused residual = bf16(a + b) exactly");
    rms_reference(res_host, w.host, N, C, want, want_rstd);
    check_rel("fused forward out", download(out, NC), want, REL_TOL_BF16);
    check_rel("fused forward rstd (fp32)", download_f32(rstd, N), want_rstd, 1e-5);

    /* backward on the fused forward's state, accumulating onto non-zero gradients */
    Tensor dout = tensor_new(NC, 1.0f), dinp = tensor_new(NC, 0.1f), dw = tensor_new(C, 0.1f);
    floatX *dinp2 = dev_copy(dinp.dev, NC), *dw2 = dev_copy(dw.dev, C);
    rmsnorm_backward(dinp.dev, dw.dev, nullptr, scratch, dout.dev, residual, w.dev, rstd, N, C, 0);
    rmsnorm_backward(dinp2, dw2, nullptr, scratch, dout.dev, residual, w.dev, rstd, N, C, 0);
    std::vector<double> want_dinp(dinp.host.begin(), dinp.host.end()), want_dw(dw.host.begin(), dw.host.end());
    std::vector<double> xhat(C), g(C);
    for (int r = 0; r < N; r++) {
        double mgx = 0;
        for (int c = 0; c < C; c++) {
            xhat[c] = res_host[(size_t)r * C + c] * want_rstd[r];
            g[c] = (double)dout.host[(size_t)r * C + c] * w.host[c];
            mgx += g[c] * xhat[c];
            want_dw[c] += (double)dout.host[(size_t)r * C + c] * xhat[c];
        }
        mgx /= C;
        for (int c = 0; c < C; c++) want_dinp[(size_t)r * C + c] += want_rstd[r] * (g[c] - xhat[c] * mgx);
    }
    const std::vector<float> got_dinp = download(dinp.dev, NC), got_dw = download(dw.dev, C);
    check_rel("backward dinp (accumulated)", got_dinp, want_dinp, REL_TOL_BF16);
    check_rel("backward dweight (accumulated)", got_dw, want_dw, REL_TOL_BF16);
    CHECK(same_bits(got_dinp, download(dinp2, NC)) && same_bits(got_dw, download(dw2, C)),
          "backward is deterministic (two runs, same bits)");
    cudaFree(out); cudaFree(residual); cudaFree(rstd); cudaFree(scratch); cudaFree(dinp2); cudaFree(dw2);
    for (Tensor* t : {&a, &b, &w, &dout, &dinp, &dw}) cudaFree(t->dev);
}

/* ---- RoPE ---- */
/* The contract's angle, recomputed here: inv_freq rounded once to fp32 from double, an fp32 product with t. */
static float rope_angle(int t, int i, int HS, double base) {
    const float inv_freq = (float)pow(base, -2.0 * i / HS);
    return (float)t * inv_freq;
}
/* q, k of x [N, 3, NH, HS] rotated by sign * angle, in fp64 (cos/sin of the fp32 angle in double). */
static void rope_reference(std::vector<double>& x, int N, int T, int NH, int HS, double base, int sign) {
    const int half = HS / 2;
    for (int n = 0; n < N; n++)
        for (int part = 0; part < 2; part++)
            for (int h = 0; h < NH; h++) {
                double* v = &x[(((size_t)n * 3 + part) * NH + h) * HS];
                for (int i = 0; i < half; i++) {
                    const double ang = rope_angle(n % T, i, HS, base), c = cos(ang), s = sign * sin(ang);
                    const double a = v[i], b = v[i + half];
                    v[i] = a * c - b * s;
                    v[i + half] = b * c + a * s;
                }
            }
}

static void test_rope_table(int T, int HS, double base) {
    char name[96];
    snprintf(name, sizeof(name), "rope table T%d HS%d base %g", T, HS, base);
    test_section(name);
    std::vector<RopeCosSin> table(rope_table_entries(T, HS));
    rope_table_fill(table.data(), T, HS, base);
    int exact = 1, origin = 1;
    double worst_norm = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HS / 2; i++) {
            const RopeCosSin e = table[(size_t)t * (HS / 2) + i];
            const double ang = rope_angle(t, i, HS, base);
            if (e.cos != (float)cos(ang) || e.sin != (float)sin(ang)) exact = 0;
            if (t == 0 && (e.cos != 1.0f || e.sin != 0.0f)) origin = 0;
            worst_norm = fmax(worst_norm, fabs((double)e.cos * e.cos + (double)e.sin * e.sin - 1.0));
        }
    CHECK(exact, "every entry is cos/sin of the fp32 angle, computed in double and rounded once");
    CHECK(origin, "position 0: cos 1, sin 0 exactly");
    CHECK(worst_norm < 1e-6, "cos^2 + sin^2 = 1 within 1e-6 (worst %.2e)", worst_norm);
    /* the first frequency is 1 rad per position: cos(1), sin(1) at t = 1 */
    CHECK(T < 2 || (table[HS / 2].cos == (float)cos(1.0) && table[HS / 2].sin == (float)sin(1.0)),
          "t = 1, i = 0: angle 1 rad");
}

static void test_rope(int B, int T, int table_T, int NH, int HS, double base) {
    char name[128];
    snprintf(name, sizeof(name), "rope B%d T%d (table %d) NH%d HS%d base %g", B, T, table_T, NH, HS, base);
    test_section(name);
    const int N = B * T, half = HS / 2;
    const size_t n = (size_t)N * 3 * NH * HS;
    RopeCosSin* table = rope_table_upload(table_T, HS, base);
    Tensor x = tensor_new(n, 1.0f);
    rope_forward(x.dev, table, table_T, B, T, NH, HS, 0);
    const std::vector<float> got = download(x.dev, n);
    std::vector<double> want(x.host.begin(), x.host.end());
    rope_reference(want, N, T, NH, HS, base, +1);
    /* slack: 1e-5 of the pair's input size (a*cos - b*sin may cancel) */
    std::vector<double> slack(n, 0.0);
    for (size_t r = 0; r < (size_t)N * 3 * NH; r++)
        for (int i = 0; i < half; i++) {
            const double s = 1e-5 * (fabs(x.host[r * HS + i]) + fabs(x.host[r * HS + i + half]));
            slack[r * HS + i] = slack[r * HS + i + half] = s;
        }
    std::vector<float> got_qk, got_v;
    std::vector<double> want_qk;
    int v_same = 1;
    for (size_t r = 0; r < (size_t)N * 3 * NH; r++)
        for (int e = 0; e < HS; e++) {
            const size_t i = r * HS + e;
            if ((r / NH) % 3 == 2) {
                if (got[i] != x.host[i]) v_same = 0;
            } else {
                got_qk.push_back(got[i]);
                want_qk.push_back(want[i]);
            }
        }
    check_rel("forward q, k", got_qk, want_qk, REL_TOL_BF16);
    double worst;
    size_t bad = count_outside(got, want, slack, &worst);
    CHECK(bad == 0, "forward: every element within half a BF16 ulp + 1e-5 |input| of fp64 (%zu outside, worst %.2f "
          "of the bound)", bad, worst);
    CHECK(v_same, "forward leaves v bit-identical");

    /* backward: the transposed rotation of dq, dk; dv untouched */
    Tensor d = tensor_new(n, 1.0f);
    rope_backward(d.dev, table, table_T, B, T, NH, HS, 0);
    const std::vector<float> got_d = download(d.dev, n);
    std::vector<double> want_d(d.host.begin(), d.host.end());
    rope_reference(want_d, N, T, NH, HS, base, -1);
    for (size_t r = 0; r < (size_t)N * 3 * NH; r++)
        for (int i = 0; i < half; i++) {
            const double s = 1e-5 * (fabs(d.host[r * HS + i]) + fabs(d.host[r * HS + i + half]));
            slack[r * HS + i] = slack[r * HS + i + half] = s;
        }
    check_rel("backward dq, dk, dv", got_d, want_d, REL_TOL_BF16);
    bad = count_outside(got_d, want_d, slack, &worst);
    CHECK(bad == 0, "backward: every element within half a BF16 ulp + 1e-5 |input| of fp64 (%zu outside, worst %.2f "
          "of the bound)", bad, worst);
    int dv_same = 1;
    for (size_t r = 0; r < (size_t)N * 3 * NH; r++)
        if ((r / NH) % 3 == 2)
            for (int e = 0; e < HS; e++)
                if (got_d[r * HS + e] != d.host[r * HS + e]) dv_same = 0;
    CHECK(dv_same, "backward leaves dv bit-identical");
    /* the backward is the forward's transpose: <R x, y> = <x, R^T y> in fp64 over the GPU's own outputs */
    double lhs = 0, rhs = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        lhs += (double)got[i] * d.host[i];
        rhs += (double)x.host[i] * got_d[i];
        scale += fabs((double)got[i] * d.host[i]);
    }
    CHECK(fabs(lhs - rhs) <= 3e-2 * scale / sqrt((double)n) + 1e-6 * scale,
          "<rope(x), y> = <x, rope_backward(y)> (%.6g vs %.6g)", lhs, rhs);
    cudaFree(table); cudaFree(x.dev); cudaFree(d.dev);
}

/* ---- QK-norm ---- */
static void qknorm_reference(const std::vector<float>& x, const std::vector<float>& gq, const std::vector<float>& gk,
                             int N, int NH, int HS, std::vector<double>& out, std::vector<double>& rstd) {
    out.assign(x.begin(), x.end());
    rstd.assign((size_t)N * 2 * NH, 0);
    for (int n = 0; n < N; n++)
        for (int part = 0; part < 2; part++)
            for (int h = 0; h < NH; h++) {
                const size_t off = (((size_t)n * 3 + part) * NH + h) * HS;
                double ss = 0;
                for (int j = 0; j < HS; j++) ss += (double)x[off + j] * x[off + j];
                const double s = 1.0 / sqrt(ss / HS + EPS_REF);
                const std::vector<float>& g = part == 0 ? gq : gk;
                for (int j = 0; j < HS; j++) out[off + j] = x[off + j] * s * g[j];
                rstd[((size_t)n * 2 + part) * NH + h] = s;
            }
}
/* dx of q, k from dy (dv passes through), dgq/dgk += sums, in fp64. */
static void qknorm_backward_reference(const std::vector<double>& dy, const std::vector<float>& x,
                                      const std::vector<float>& gq, const std::vector<float>& gk, int N, int NH,
                                      int HS, std::vector<double>& dx, std::vector<double>& dgq,
                                      std::vector<double>& dgk) {
    dx.assign(dy.begin(), dy.end());
    std::vector<double> xhat(HS);
    for (int n = 0; n < N; n++)
        for (int part = 0; part < 2; part++)
            for (int h = 0; h < NH; h++) {
                const size_t off = (((size_t)n * 3 + part) * NH + h) * HS;
                double ss = 0, mgx = 0;
                for (int j = 0; j < HS; j++) ss += (double)x[off + j] * x[off + j];
                const double s = 1.0 / sqrt(ss / HS + EPS_REF);
                const std::vector<float>& g = part == 0 ? gq : gk;
                std::vector<double>& dg = part == 0 ? dgq : dgk;
                for (int j = 0; j < HS; j++) {
                    xhat[j] = x[off + j] * s;
                    mgx += dy[off + j] * g[j] * xhat[j];
                    dg[j] += dy[off + j] * xhat[j];
                }
                mgx /= HS;
                for (int j = 0; j < HS; j++) dx[off + j] = s * (dy[off + j] * g[j] - xhat[j] * mgx);
            }
}

static void test_qknorm(int N, int NH, int HS) {
    char name[128];
    snprintf(name, sizeof(name), "qk-norm N%d NH%d HS%d (lane group %d, %lld gain chunks)", N, NH, HS,
             qknorm_group(HS), (long long)ceil_div((long long)N * NH, QKNORM_ROWS_PER_CHUNK));
    test_section(name);
    const size_t n = (size_t)N * 3 * NH * HS;
    Tensor x = tensor_new(n, 1.5f, 0.2f), gq = tensor_new(HS, 0.2f, 1.0f), gk = tensor_new(HS, 0.2f, 1.0f);
    floatX* out = dev_alloc(n);
    float *rstd, *scratch;
    cudaCheck(cudaMalloc(&rstd, (size_t)N * 2 * NH * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, qknorm_scratch_floats(N, NH, HS) * sizeof(float)));
    qknorm_forward(out, rstd, x.dev, gq.dev, gk.dev, N, NH, HS, 0);
    std::vector<double> want, want_rstd;
    qknorm_reference(x.host, gq.host, gk.host, N, NH, HS, want, want_rstd);
    const std::vector<float> got = download(out, n);
    std::vector<float> got_qk;
    std::vector<double> want_qk;
    int v_copied = 1;
    for (size_t r = 0; r < (size_t)N * 3 * NH; r++)
        for (int j = 0; j < HS; j++) {
            const size_t i = r * HS + j;
            if ((r / NH) % 3 == 2) {
                if (got[i] != x.host[i]) v_copied = 0;
            } else {
                got_qk.push_back(got[i]);
                want_qk.push_back(want[i]);
            }
        }
    check_rel("forward q, k normalized", got_qk, want_qk, REL_TOL_BF16);
    check_rel("forward rstd [N, 2, NH] (fp32)", download_f32(rstd, (size_t)N * 2 * NH), want_rstd, 1e-5);
    CHECK(v_copied, "forward copies v bit for bit");
    CHECK(same_bits(download(x.dev, n), x.host), "forward leaves its input untouched");

    /* backward in place on dqkv, gains accumulated onto non-zero values; twice on copies for determinism */
    Tensor d = tensor_new(n, 1.0f), dgq = tensor_new(HS, 0.1f), dgk = tensor_new(HS, 0.1f);
    floatX *d2 = dev_copy(d.dev, n), *dgq2 = dev_copy(dgq.dev, HS), *dgk2 = dev_copy(dgk.dev, HS);
    qknorm_backward(d.dev, dgq.dev, dgk.dev, scratch, x.dev, rstd, gq.dev, gk.dev, N, NH, HS, 0);
    qknorm_backward(d2, dgq2, dgk2, scratch, x.dev, rstd, gq.dev, gk.dev, N, NH, HS, 0);
    std::vector<double> dy(d.host.begin(), d.host.end()), want_dx;
    std::vector<double> want_dgq(dgq.host.begin(), dgq.host.end()), want_dgk(dgk.host.begin(), dgk.host.end());
    qknorm_backward_reference(dy, x.host, gq.host, gk.host, N, NH, HS, want_dx, want_dgq, want_dgk);
    const std::vector<float> got_dx = download(d.dev, n), got_dgq = download(dgq.dev, HS),
                             got_dgk = download(dgk.dev, HS);
    std::vector<float> got_dqk;
    std::vector<double> want_dqk;
    int dv_same = 1;
    for (size_t r = 0; r < (size_t)N * 3 * NH; r++)
        for (int j = 0; j < HS; j++) {
            const size_t i = r * HS + j;
            if ((r / NH) % 3 == 2) {
                if (got_dx[i] != d.host[i]) dv_same = 0;
            } else {
                got_dqk.push_back(got_dx[i]);
                want_dqk.push_back(want_dx[i]);
            }
        }
    check_rel("backward dq, dk (in place)", got_dqk, want_dqk, REL_TOL_BF16);
    CHECK(dv_same, "backward leaves dv bit-identical");
    check_rel("backward dgq (accumulated)", got_dgq, want_dgq, REL_TOL_BF16);
    check_rel("backward dgk (accumulated)", got_dgk, want_dgk, REL_TOL_BF16);
    CHECK(same_bits(got_dx, download(d2, n)) && same_bits(got_dgq, download(dgq2, HS)) &&
              same_bits(got_dgk, download(dgk2, HS)),
          "backward is deterministic (two runs, same bits)");
    cudaFree(out); cudaFree(rstd); cudaFree(scratch); cudaFree(d2); cudaFree(dgq2); cudaFree(dgk2);
    for (Tensor* t : {&x, &gq, &gk, &d, &dgq, &dgk}) cudaFree(t->dev);
}

/* The attention input as the model builds it: qkv -> qk-norm -> RoPE (in place), and the backward in the
   reverse order, against the fp64 composition. */
static void test_qknorm_rope_chain(int B, int T, int NH, int HS) {
    char name[96];
    snprintf(name, sizeof(name), "qk-norm then rope B%d T%d NH%d HS%d", B, T, NH, HS);
    test_section(name);
    const int N = B * T;
    const size_t n = (size_t)N * 3 * NH * HS;
    const double base = 10000.0;
    RopeCosSin* table = rope_table_upload(T, HS, base);
    Tensor x = tensor_new(n, 1.0f), gq = tensor_new(HS, 0.2f, 1.0f), gk = tensor_new(HS, 0.2f, 1.0f);
    Tensor dgq = tensor_new(HS, 0.0f), dgk = tensor_new(HS, 0.0f);
    floatX* att_in = dev_alloc(n);
    float *rstd, *scratch;
    cudaCheck(cudaMalloc(&rstd, (size_t)N * 2 * NH * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, qknorm_scratch_floats(N, NH, HS) * sizeof(float)));
    qknorm_forward(att_in, rstd, x.dev, gq.dev, gk.dev, N, NH, HS, 0);
    rope_forward(att_in, table, T, B, T, NH, HS, 0);
    std::vector<double> want, want_rstd;
    qknorm_reference(x.host, gq.host, gk.host, N, NH, HS, want, want_rstd);
    rope_reference(want, N, T, NH, HS, base, +1);
    check_rel("forward: attention's q, k, v", download(att_in, n), want, REL_TOL_BF16);

    Tensor d = tensor_new(n, 1.0f);
    rope_backward(d.dev, table, T, B, T, NH, HS, 0);
    qknorm_backward(d.dev, dgq.dev, dgk.dev, scratch, x.dev, rstd, gq.dev, gk.dev, N, NH, HS, 0);
    std::vector<double> dy(d.host.begin(), d.host.end()), want_dx;
    std::vector<double> want_dgq(HS, 0.0), want_dgk(HS, 0.0);
    rope_reference(dy, N, T, NH, HS, base, -1);
    qknorm_backward_reference(dy, x.host, gq.host, gk.host, N, NH, HS, want_dx, want_dgq, want_dgk);
    check_rel("backward: dqkv w.r.t. the matmul output", download(d.dev, n), want_dx, REL_TOL_BF16);
    check_rel("backward: dgq", download(dgq.dev, HS), want_dgq, REL_TOL_BF16);
    check_rel("backward: dgk", download(dgk.dev, HS), want_dgk, REL_TOL_BF16);
    cudaFree(table); cudaFree(att_in); cudaFree(rstd); cudaFree(scratch);
    for (Tensor* t : {&x, &gq, &gk, &dgq, &dgk, &d}) cudaFree(t->dev);
}

/* ---- SwiGLU ---- */
static void test_swiglu(int N, int H) {
    char name[96];
    snprintf(name, sizeof(name), "swiglu N%d H%d", N, H);
    test_section(name);
    const size_t NH = (size_t)N * H;
    Tensor u = tensor_new(2 * NH, 2.0f), dh = tensor_new(NH, 1.0f);
    floatX *h = dev_alloc(NH), *du = dev_alloc(2 * NH);
    swiglu_forward(h, u.dev, N, H, 0);
    swiglu_backward(du, dh.dev, u.dev, N, H, 0);
    std::vector<double> want_h(NH), slack_h(NH), want_du(2 * NH), slack_du(2 * NH);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < H; j++) {
            const double a = u.host[(size_t)r * 2 * H + j], b = u.host[(size_t)r * 2 * H + H + j];
            const double g = dh.host[(size_t)r * H + j], s = 1.0 / (1.0 + exp(-a));
            want_h[(size_t)r * H + j] = a * s * b;
            slack_h[(size_t)r * H + j] = 1e-5 * fabs(a * b);
            want_du[(size_t)r * 2 * H + j] = g * b * s * (1.0 + a * (1.0 - s));
            slack_du[(size_t)r * 2 * H + j] = 1e-5 * fabs(g * b) * (1.0 + fabs(a));
            want_du[(size_t)r * 2 * H + H + j] = g * a * s;
            slack_du[(size_t)r * 2 * H + H + j] = 1e-5 * fabs(g * a);
        }
    const std::vector<float> got_h = download(h, NH), got_du = download(du, 2 * NH);
    check_rel("forward h = silu(a) * b", got_h, want_h, REL_TOL_BF16);
    double worst;
    size_t bad = count_outside(got_h, want_h, slack_h, &worst);
    CHECK(bad == 0, "forward: every element within half a BF16 ulp + 1e-5 |a b| of fp64 (%zu outside, worst %.2f of "
          "the bound)", bad, worst);
    check_rel("backward du = [da | db] (overwritten)", got_du, want_du, REL_TOL_BF16);
    bad = count_outside(got_du, want_du, slack_du, &worst);
    CHECK(bad == 0, "backward: every element within half a BF16 ulp + FP32 slack of fp64 (%zu outside, worst %.2f of "
          "the bound)", bad, worst);
    /* saturation: large |a| must give silu -> a or 0 and no NaN/inf */
    const float big[8] = {-200.0f, -90.0f, -30.0f, -1.25f, 0.0f, 30.0f, 90.0f, 200.0f};
    std::vector<floatX> edge(16);
    for (int k = 0; k < 8; k++) { edge[k] = __float2bfloat16(big[k]); edge[8 + k] = __float2bfloat16(1.0f); }
    floatX *edge_dev = dev_alloc(16), *edge_h = dev_alloc(8), *edge_du = dev_alloc(16), *ones = dev_alloc(8);
    cudaCheck(cudaMemcpy(edge_dev, edge.data(), 16 * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(ones, edge.data() + 8, 8 * sizeof(floatX), cudaMemcpyHostToDevice));
    swiglu_forward(edge_h, edge_dev, 1, 8, 0);
    swiglu_backward(edge_du, ones, edge_dev, 1, 8, 0);
    const std::vector<float> eh = download(edge_h, 8), edu = download(edge_du, 16);
    int finite = 1, limits = 1;
    for (int k = 0; k < 8; k++) {
        if (!isfinite(eh[k]) || !isfinite(edu[k]) || !isfinite(edu[8 + k])) finite = 0;
        const double a = bf(big[k]), s = 1.0 / (1.0 + exp(-a));
        if (fabs(eh[k] - a * s) > ldexp(fabs(a * s), -8) + 1e-30) limits = 0;
    }
    CHECK(finite, "|a| up to 200: outputs and gradients finite");
    CHECK(limits, "|a| up to 200: silu(a) = a or 0 to BF16 precision");
    cudaFree(h); cudaFree(du); cudaFree(edge_dev); cudaFree(edge_h); cudaFree(edge_du); cudaFree(ones);
    cudaFree(u.dev); cudaFree(dh.dev);
}

int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("test_modern_layers_gpu: no CUDA device found; this test needs an NVIDIA GPU (run it with make "
               "gputest)\n");
        printf("0 passed, 1 failed\n");
        return 1;
    }
    test_rmsnorm(300, 64);
    test_rmsnorm(1001, 768);
    test_rmsnorm(257, 200);                             /* C not a multiple of 256: a partial last step */
    test_rmsnorm(rownorm_backward_blocks(1 << 30, 72) * rownorm_backward_rows_per_block(72) * 2 + 7, 72); /* the fixed grid: 2 rows per row group, 7 groups a 3rd */
    test_rope_table(1024, 64, 10000.0);
    test_rope_table(300, 128, 500000.0);
    test_rope(2, 64, 64, 4, 64, 10000.0);
    test_rope(3, 37, 1024, 12, 64, 10000.0); /* odd T, the table longer than T */
    test_rope(1, 1024, 1024, 2, 128, 10000.0);
    test_rope(2, 100, 100, 3, 16, 500000.0); /* one pair pack per head */
    test_qknorm(37, 4, 64);
    test_qknorm(301, 12, 64);
    test_qknorm(129, 3, 128);
    test_qknorm(5, 2, 24);     /* 3 packs per head in a 4-lane group: one lane idle */
    test_qknorm(2051, 8, 32);  /* 16408 (row, head) pairs: 17 gain chunks, the last short */
    test_qknorm(7, 1, 256);    /* 32 lanes per head row */
    test_qknorm_rope_chain(2, 33, 4, 64);
    test_swiglu(37, 64);
    test_swiglu(1000, 704);  /* llama-small's hidden size */
    test_swiglu(3, 2048);
    return test_summary();
}
